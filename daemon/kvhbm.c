/*
 * kvhbm.c -- the policy of the HBM tier: which chunks have a copy in the
 * daemon's GPU pool, so that a LOAD into GPU tensors reads device memory
 * (device to device) instead of pinned host memory over PCIe.
 *
 * Design: HBM is an inclusive cache above DRAM. Every chunk stays in the
 * DRAM pool, which remains the tier of record for lookups, leases, CPU
 * engines and the checksum; HBM only holds copies. A SAVE from GPU
 * tensors reserves a copy for each new chunk and its worker fills it from
 * the pool after the gather (write-through), so demoting a chunk to DRAM
 * is dropping its copy: nothing to write back. When HBM is full the
 * coldest unpinned copy is dropped, one at a time, until the new one fits
 * (or the new chunk simply gets no copy).
 *
 * A copy names its DRAM chunk by index slot and generation, and is valid
 * only while that slot still holds the same READY chunk; evicting or
 * deleting the DRAM chunk does not visit HBM, so a stale copy is found
 * and dropped on the next lookup, or as a victim. A LOAD pins the copies
 * it reads (and, through its read of the slot, their DRAM chunks), so
 * neither goes while a worker reads it. Core thread only; copies move on
 * the workers.
 */
#include <stdlib.h>
#include <string.h>

#include "hbm.h"
#include "kvcache.h"
#include "log.h"

static struct tier *tier_of(struct kvc *k)
{
    return &k->hbm->tier;
}

static struct kvc_hent **hbucket(struct kvc *k, uint32_t slot)
{
    return &k->hc.b[(slot * 2654435761u) % KVC_HBM_BUCKETS];
}

static void lru_unlink(struct kvc *k, struct kvc_hent *h)
{
    if (h->prev) h->prev->next = h->next;
    else k->hc.head = h->next;
    if (h->next) h->next->prev = h->prev;
    else k->hc.tail = h->prev;
    h->prev = h->next = NULL;
}

static void lru_push(struct kvc *k, struct kvc_hent *h)
{
    h->prev = NULL;
    h->next = k->hc.head;
    if (k->hc.head) k->hc.head->prev = h;
    else k->hc.tail = h;
    k->hc.head = h;
}

/* Free a copy's space and record; unlink it if it was committed. */
void kvh_drop(struct kvc *k, struct kvc_hent *h)
{
    if (h->linked) {
        struct kvc_hent **p = hbucket(k, h->slot);
        while (*p != h) p = &(*p)->hnext;
        *p = h->hnext;
        lru_unlink(k, h);
        k->hc.n--;
    }
    tier_of(k)->ops->free(tier_of(k), &h->loc);
    free(h);
}

/* Drop the coldest unpinned copy; 0 if there is none. */
static int drop_coldest(struct kvc *k)
{
    struct kvc_hent *h = k->hc.tail;
    while (h && h->pins) h = h->prev;
    if (!h) return 0;
    kvh_drop(k, h);
    k->st.hbm_demoted++;
    return 1;
}

struct kvc_hent *kvh_reserve(struct kvc *k, uint32_t slot, uint32_t gen,
                             uint64_t bytes)
{
    struct tier_loc loc;
    if (!k->hbm) return NULL;
    for (;;) {
        kvt_err e = tier_of(k)->ops->alloc(tier_of(k), bytes, &loc);
        if (e == KVT_OK) break;
        if (e != KVT_ENOSPC || !drop_coldest(k)) return NULL;
    }
    struct kvc_hent *h = calloc(1, sizeof *h);
    if (!h) abort(); /* control-plane allocation */
    h->slot = slot;
    h->gen = gen;
    h->loc = loc;
    h->dev = hbm_ptr(k->hbm, loc.off);
    return h;
}

void kvh_commit(struct kvc *k, struct kvc_hent *h)
{
    struct kvc_hent **b = hbucket(k, h->slot);
    for (struct kvc_hent *o = *b; o; o = o->hnext)
        if (o->slot == h->slot) { /* a stale copy of the slot's last chunk */
            kvh_drop(k, o);
            break;
        }
    b = hbucket(k, h->slot);
    h->hnext = *b;
    *b = h;
    h->linked = 1;
    lru_push(k, h);
    k->hc.n++;
}

struct kvc_hent *kvh_find(struct kvc *k, uint32_t slot, int device)
{
    if (!k->hbm || device != k->hbm->device) return NULL;
    for (struct kvc_hent *h = *hbucket(k, slot); h; h = h->hnext) {
        if (h->slot != slot) continue;
        const struct idx_entry *e = idx_at(k->env.host->idx, slot);
        if (e->gen != h->gen || e->state != IDX_READY) {
            if (!h->pins) kvh_drop(k, h); /* its DRAM chunk is gone */
            return NULL;
        }
        lru_unlink(k, h);
        lru_push(k, h);
        return h;
    }
    return NULL;
}

void kvh_close(struct kvc *k)
{
    for (int b = 0; b < KVC_HBM_BUCKETS; b++)
        while (k->hc.b[b]) kvh_drop(k, k->hc.b[b]);
}
