/*
 * store.c -- placement and eviction policy over the index and the DRAM tier.
 *
 * Design: the tiers only store bytes; this file decides where a chunk goes
 * and which chunk leaves. A reservation that does not fit evicts the
 * coldest leaf (index.h explains the prefix-aware order) and retries, one
 * victim at a time, until it fits or nothing is evictable (KVT_ENOSPC).
 * Pinned and uncommitted chunks are never on the eviction list, so they are
 * never evicted. Watermark eviction runs in bounded slices from the core
 * loop so one big commit cannot stall every other client (STYLE §8).
 *
 * With an NVMe tier (d->nvme, tier.h) leaving DRAM means going down a tier: a
 * victim that also lives on NVMe just loses its DRAM copy; the watermark
 * slices start writes of the others (their DRAM copies go once written,
 * and the slice counts those bytes as on their way out). A reservation
 * cannot wait for a write, so it takes a clean copy near the cold end
 * first and drops a dirty chunk only when there is none.
 *
 * GET and LOOKUP walk the tiers here, in one order (store_get_walk,
 * store_lookup_walk): the index pass finds what this node holds in any
 * tier, then each tier of d->tiers (dram, nvme, peer) is asked through
 * its get / lookup op: the NVMe tier parks a GET of chunks only on NVMe
 * until they are read back, the peer tier pulls or asks for what this
 * node lacks. LOOKUP's prefetch starts reads through the holding tier's
 * read op. A tier that parks the request answers it later through its
 * host (tier_host.h: park, get_answer); the handlers only build the reply
 * of what is here.
 *
 * Pools (dram.h): a tenant with a pool of its own has its namespaces'
 * chunks reserved only there (pool_of_ns), and each pool is bounded by
 * its own size: a reservation evicts victims of its own pool, and the
 * watermarks hold per pool. The LRU list is one for every pool, so a
 * pool's victim is found by walking it from the cold end past other
 * pools' chunks, at most VICTIM_SCAN of them (one pool alone: the first).
 */
#include <string.h>

#include "adopt.h"
#include "events.h"
#include "kvtierd.h"
#include "log.h"
#include "pool.h"
#include "store.h"
#include "tier.h"

#define EVICT_SLICE 256
#define CLEAN_SCAN 32 /* victims a reservation looks past for a clean one */
#define VICTIM_SCAN 65536 /* other pools' chunks looked past for a victim */

static struct tier *dram_tier(const struct kvtierd *d)
{
    return &d->dram->tier;
}

/* The DRAM tier frees by handle alone. */
static struct tier_loc loc_of(const struct idx_entry *e)
{
    return (struct tier_loc){0, 0, e->blk};
}

uint64_t store_off(const struct kvtierd *d, uint32_t slot)
{
    return dram_block_off(d->dram, idx_at(&d->idx, slot)->blk);
}

void *store_ptr(const struct kvtierd *d, uint32_t slot)
{
    return dram_ptr(d->dram, store_off(d, slot));
}

uint64_t store_used(const struct kvtierd *d)
{
    uint64_t n = 0;
    for (uint32_t i = 0; i < d->dram->n_seg; i++) n += dram_pool_used(d->dram, i);
    return n;
}

static uint64_t evict_in(struct kvtierd *d, uint32_t pool, uint64_t want_free,
                         uint32_t max);

/* Evict one victim at a time until the allocation fits. Free bytes alone
 * say nothing: a fragmented pool can have plenty free and no block large
 * enough, so the test is the allocation itself. */
static kvt_err alloc_evicting(struct kvtierd *d, uint32_t pool, uint64_t size,
                              struct tier_loc *loc)
{
    if (size > d->dram->seg[pool].bytes) return KVT_ENOSPC;
    for (;;) {
        kvt_err e = dram_alloc_in(d->dram, pool, size, loc);
        if (e != KVT_ENOSPC) return e;
        if (evict_in(d, pool, UINT64_MAX, 1) == 0) return KVT_ENOSPC;
    }
}

static uint32_t pool_of_id(const struct kvtierd *d, uint16_t ns)
{
    return d->dram->n_seg < 2 ? 0 : pool_of_ns(d, d->ns.v[ns].name);
}

uint32_t store_pool(const struct kvtierd *d, uint32_t slot)
{
    return dram_pool_of(d->dram, idx_at(&d->idx, slot)->blk);
}

kvt_err store_alloc_dram(struct kvtierd *d, uint16_t ns, uint64_t size, uint32_t *blk)
{
    struct tier_loc loc;
    kvt_err e = alloc_evicting(d, pool_of_id(d, ns), size, &loc);
    if (e == KVT_OK) *blk = loc.h;
    return e;
}

kvt_err store_reserve(struct kvtierd *d, uint16_t ns, const kvt_key *key,
                      uint64_t size, uint32_t *slot)
{
    struct tier_loc loc;
    kvt_err e = alloc_evicting(d, pool_of_id(d, ns), size, &loc);
    if (e != KVT_OK) return e;
    uint32_t i = idx_insert(&d->idx, ns, key);
    if (i == IDX_NONE) {
        dram_tier(d)->ops->free(dram_tier(d), &loc);
        return KVT_ENOMEM;
    }
    struct idx_entry *en = idx_at(&d->idx, i);
    en->blk = loc.h;
    en->size = (uint32_t)size;
    *slot = i;
    return KVT_OK;
}

void store_commit(struct kvtierd *d, uint32_t slot, uint64_t csum,
                  uint32_t parent)
{
    struct idx_entry *e = idx_at(&d->idx, slot);
    e->csum = csum;
    idx_commit(&d->idx, slot, parent, kvtierd_secs(d));
    struct ns_info *ni = &d->ns.v[e->ns];
    ni->chunks++;
    ni->bytes += e->size;
    d->st.puts++;
    d->st.bytes_in += e->size;
    adopt_added(&d->adopt, slot);
    ev_stored(d->ev, slot, IDX_DRAM);
    for (uint32_t i = 0; i < d->n_tiers; i++)
        if (d->tiers[i]->ops->committed) d->tiers[i]->ops->committed(d->tiers[i], slot);
}

/* A committed chunk is no longer visible: tell the tiers that track it. */
static void tiers_removed(struct kvtierd *d, uint32_t slot)
{
    for (uint32_t i = 0; i < d->n_tiers; i++)
        if (d->tiers[i]->ops->removed) d->tiers[i]->ops->removed(d->tiers[i], slot);
}

void store_free(struct kvtierd *d, uint32_t slot)
{
    struct idx_entry *e = idx_at(&d->idx, slot);
    if (e->state == IDX_READY) {
        struct ns_info *ni = &d->ns.v[e->ns];
        ev_removed(d->ev, slot, e->tier);
        ni->chunks--;
        ni->bytes -= e->size;
        if (e->tier & IDX_DRAM) adopt_removed(&d->adopt, slot);
        tiers_removed(d, slot);
    }
    if (e->blk != IDX_NONE) {
        struct tier_loc loc = loc_of(e);
        dram_tier(d)->ops->free(dram_tier(d), &loc);
        e->blk = IDX_NONE;
    }
    if (d->nvme) d->nvme->ops->release(d->nvme, slot);
    idx_remove(&d->idx, slot);
}

void store_drop_dram(struct kvtierd *d, uint32_t slot)
{
    struct idx_entry *e = idx_at(&d->idx, slot);
    struct tier_loc loc = loc_of(e);
    adopt_removed(&d->adopt, slot);
    ev_removed(d->ev, slot, IDX_DRAM); /* no-op unless READY */
    dram_tier(d)->ops->free(dram_tier(d), &loc);
    e->blk = IDX_NONE;
    idx_set_tier(&d->idx, slot, (uint8_t)(e->tier & ~IDX_DRAM));
}

void store_delete(struct kvtierd *d, uint32_t slot)
{
    struct idx_entry *e = idx_at(&d->idx, slot);
    if (e->state != IDX_READY) return;
    if (e->pins == 0) {
        store_free(d, slot);
        return;
    }
    struct ns_info *ni = &d->ns.v[e->ns];
    ev_removed(d->ev, slot, e->tier);
    ni->chunks--;
    ni->bytes -= e->size;
    if (e->tier & IDX_DRAM) adopt_removed(&d->adopt, slot);
    tiers_removed(d, slot);
    idx_doom(&d->idx, slot);
}

static uint64_t free_in(const struct kvtierd *d, uint32_t pool)
{
    return d->dram->seg[pool].bytes - dram_pool_used(d->dram, pool);
}

/* The coldest evictable DRAM leaf of pool at or above i on the LRU list
 * (IDX_NONE: none within VICTIM_SCAN). */
static uint32_t victim_from(const struct kvtierd *d, uint32_t pool, uint32_t i)
{
    if (d->dram->n_seg < 2) return i;
    for (uint32_t k = 0; i != IDX_NONE && k < VICTIM_SCAN; k++) {
        const struct idx_entry *e = idx_at(&d->idx, i);
        if (dram_pool_of(d->dram, e->blk) == pool) return i;
        i = e->lru_prev;
    }
    return IDX_NONE;
}

/* The victim a reservation takes: the pool's coldest DRAM leaf, or with
 * an NVMe tier the coldest clean one among its CLEAN_SCAN coldest. */
static uint32_t sync_victim(const struct kvtierd *d, uint32_t pool)
{
    uint32_t v = victim_from(d, pool, idx_victim(&d->idx));
    if (!d->nvme) return v;
    for (uint32_t i = v, k = 0; i != IDX_NONE && k < CLEAN_SCAN; k++) {
        const struct idx_entry *e = idx_at(&d->idx, i);
        if (e->tier & IDX_NVME) return i;
        i = victim_from(d, pool, e->lru_prev);
    }
    return v;
}

/* Take v's DRAM copy away now: drop it if it is clean, else the chunk. */
static void evict_now(struct kvtierd *d, uint32_t v)
{
    d->st.evictions++;
    if (idx_at(&d->idx, v)->tier & IDX_NVME) {
        store_drop_dram(d, v);
        return;
    }
    if (d->nvme) d->nvme->ops->lost(d->nvme, v);
    store_free(d, v);
}

static uint64_t evict_in(struct kvtierd *d, uint32_t pool, uint64_t want_free,
                         uint32_t max)
{
    uint64_t freed = 0;
    for (uint32_t n = 0; n < max && free_in(d, pool) < want_free; n++) {
        uint32_t v = sync_victim(d, pool);
        if (v == IDX_NONE) break;
        freed += idx_at(&d->idx, v)->size;
        evict_now(d, v);
    }
    return freed;
}

uint64_t store_evict(struct kvtierd *d, uint64_t want_free, uint32_t max)
{
    uint64_t freed = 0;
    for (uint32_t p = 0; p < d->dram->n_seg; p++) {
        uint64_t cap = d->dram->seg[p].bytes;
        uint64_t want = want_free ? want_free
                                  : cap - (uint64_t)((double)cap * d->cfg.low_watermark);
        freed += evict_in(d, p, want < cap ? want : cap, max);
    }
    return freed;
}

/* A watermark slice of one pool: clean copies go at once, dirty chunks
 * are demoted (without an NVMe tier: dropped). 0 when it cannot go on for
 * now. The bytes on their way to NVMe are counted for every pool alike
 * (the NVMe tier does not say whose they are): a pool may stop a slice
 * early, and goes on at the next commit. */
static int evict_slice(struct kvtierd *d, uint32_t pool, uint64_t want_free)
{
    for (uint32_t n = 0; n < EVICT_SLICE; n++) {
        uint64_t coming = d->nvme ? d->nvme->ops->demoting(d->nvme) : 0;
        if (free_in(d, pool) + coming >= want_free) return 0;
        uint32_t v = victim_from(d, pool, idx_victim(&d->idx));
        if (v == IDX_NONE) return 0;
        if (!d->nvme || (idx_at(&d->idx, v)->tier & IDX_NVME)) evict_now(d, v);
        else if (d->nvme->ops->write(d->nvme, v, NULL, NULL) != KVT_OK) return 0;
    }
    return 1;
}

/* Every commit path ends here before its reply: the journal is written
 * out first (adopt.c), so a reported commit survives a crash. Each pool
 * is held to the watermarks of its own size. */
void store_watermark(struct kvtierd *d)
{
    adopt_flush(&d->adopt);
    d->evict_target = 0;
    for (uint32_t p = 0; p < d->dram->n_seg; p++) {
        uint64_t cap = d->dram->seg[p].bytes, used = dram_pool_used(d->dram, p);
        uint64_t high = (uint64_t)((double)cap * d->cfg.high_watermark);
        uint64_t low = (uint64_t)((double)cap * d->cfg.low_watermark);
        if (d->pool_target[p] == 0 && used > high) d->pool_target[p] = cap - low;
        if (d->pool_target[p] && !evict_slice(d, p, d->pool_target[p]))
            d->pool_target[p] = 0;
        d->evict_target += d->pool_target[p];
    }
}

/* ------------------------------------------------------ the store walk */

uint32_t store_find(struct kvtierd *d, uint16_t ns, const ProtobufCBinaryData *key)
{
    if (ns == NS_NONE) return IDX_NONE;
    uint32_t s = idx_find(&d->idx, ns, (const kvt_key *)key->data);
    if (s != IDX_NONE && idx_at(&d->idx, s)->state != IDX_READY) return IDX_NONE;
    return s;
}

int store_get_walk(struct kvtierd *d, uint32_t pipe, uint64_t req_id,
                   uint16_t ns, const Kvtier__Get *q, uint32_t *slots,
                   size_t *n)
{
    size_t k = 0;
    uint32_t now = kvtierd_secs(d);
    while (k < q->n_keys && (slots[k] = store_find(d, ns, &q->keys[k])) != IDX_NONE)
        idx_touch(&d->idx, slots[k++], now);
    /* The tiers in order: the NVMe tier reads back chunks only on NVMe,
     * peers are asked for keys this node lacks; a tier may park the
     * request, the answer then comes later. */
    struct tier_walk w = {.pipe = pipe, .req_id = req_id, .ns = ns, .get = q,
                          .slots = slots, .n = k};
    for (uint32_t i = 0; i < d->n_tiers; i++) {
        struct tier *t = d->tiers[i];
        if (t->ops->get && t->ops->get(t, &w) == TIER_PARKED) return 1;
    }
    *n = w.n;
    return 0;
}

static void lookup_count(struct kvtierd *d, uint16_t ns, size_t n_keys,
                         size_t present, uint64_t hit_bytes)
{
    metrics_hits(&d->ns, &d->met, ns, HIT_LOOKUP, present, n_keys - present, hit_bytes);
    d->st.hits += present;
    d->st.misses += n_keys - present;
    if (ns != NS_NONE) {
        d->ns.v[ns].hits += present;
        d->ns.v[ns].misses += n_keys - present;
    }
}

/* The tier that holds a chunk's top copy below DRAM (the read op of
 * which brings it up), or NULL. */
static struct tier *holder(const struct kvtierd *d, const struct idx_entry *e)
{
    return (e->tier & IDX_NVME) ? d->nvme : NULL;
}

int store_lookup_walk(struct kvtierd *d, uint32_t pipe, uint64_t req_id,
                      uint16_t ns, const Kvtier__Lookup *q,
                      Kvtier__LookupResp *lr)
{
    uint32_t now = kvtierd_secs(d);
    uint64_t hit_bytes = 0;
    int prefix = 1;
    for (size_t i = 0; i < q->n_keys; i++) {
        uint32_t s = store_find(d, ns, &q->keys[i]);
        if (s == IDX_NONE) {
            prefix = 0;
            continue;
        }
        const struct idx_entry *e = idx_at(&d->idx, s);
        lr->tiers[i] = (Kvtier__Tier)idx_top_tier(e);
        idx_touch(&d->idx, s, now);
        if (!prefix) continue;
        struct tier *t = q->prefetch && !(e->tier & IDX_DRAM) ? holder(d, e) : NULL;
        if (t) t->ops->read(t, s, NULL, NULL); /* prefetch: no wait */
        lr->n_present++;
        hit_bytes += e->size;
    }
    lookup_count(d, ns, q->n_keys, lr->n_present, hit_bytes);
    /* The tiers in order, for what the index did not find here. */
    struct tier_walk w = {.pipe = pipe, .req_id = req_id, .ns = ns, .lookup = q,
                          .lr = lr};
    for (uint32_t i = 0; i < d->n_tiers; i++) {
        struct tier *t = d->tiers[i];
        if (t->ops->lookup && t->ops->lookup(t, &w) == TIER_PARKED) return 1;
    }
    return 0;
}
