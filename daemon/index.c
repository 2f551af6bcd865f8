/*
 * index.c -- see index.h for the design.
 *
 * List membership is recomputed from an entry's state by relist() after
 * every change that can affect it (commit, pin, tier, flags, children),
 * so the rule for each list is written once, in dram_leaf() / nv_leaf().
 */
#include "index.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

enum { L_DRAM = 0, L_NVME = 1 };

static uint32_t hash_of(uint16_t ns, const kvt_key *k)
{
    uint64_t h;
    memcpy(&h, k->b, sizeof h);
    h ^= (uint64_t)ns * 0x9E3779B97F4A7C15ull;
    return (uint32_t)(h ^ (h >> 32));
}

static void *reserve(uint64_t bytes)
{
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

int idx_init(struct idx *x, uint64_t max_entries)
{
    memset(x, 0, sizeof *x);
    if (max_entries == 0 || max_entries >= IDX_NONE) return -1;
    uint64_t nb = 1024;
    while (nb < max_entries && nb < (1ull << 31)) nb <<= 1;
    x->buckets = malloc(nb * sizeof *x->buckets);
    x->e = reserve(max_entries * sizeof *x->e);
    x->nv = reserve(max_entries * sizeof *x->nv);
    x->ns_slots = calloc((size_t)UINT16_MAX + 1, sizeof *x->ns_slots);
    if (!x->buckets || !x->e || !x->nv || !x->ns_slots) {
        x->cap = (uint32_t)max_entries;
        idx_destroy(x);
        return -1;
    }
    x->cap = (uint32_t)max_entries;
    memset(x->buckets, 0xff, nb * sizeof *x->buckets);
    x->mask = (uint32_t)(nb - 1);
    x->free_head = x->lru_head = x->lru_tail = IDX_NONE;
    x->nv_head = x->nv_tail = IDX_NONE;
    return 0;
}

void idx_destroy(struct idx *x)
{
    if (x->e) munmap(x->e, (size_t)x->cap * sizeof *x->e);
    if (x->nv) munmap(x->nv, (size_t)x->cap * sizeof *x->nv);
    free(x->buckets);
    free(x->ns_slots);
    memset(x, 0, sizeof *x);
}

uint32_t idx_find(const struct idx *x, uint16_t ns, const kvt_key *key)
{
    uint32_t i = x->buckets[hash_of(ns, key) & x->mask];
    while (i != IDX_NONE) {
        const struct idx_entry *e = &x->e[i];
        if (e->ns == ns && memcmp(e->key.b, key->b, KVT_KEY_LEN) == 0) return i;
        i = e->hnext;
    }
    return IDX_NONE;
}

static uint32_t slot_get(struct idx *x)
{
    if (x->free_head != IDX_NONE) {
        uint32_t i = x->free_head;
        x->free_head = x->e[i].hnext;
        return i;
    }
    if (x->used == x->cap) return IDX_NONE;
    x->e[x->used].gen = 0;
    return x->used++;
}

uint32_t idx_insert(struct idx *x, uint16_t ns, const kvt_key *key)
{
    uint32_t i = slot_get(x);
    if (i == IDX_NONE) return IDX_NONE;
    struct idx_entry *e = &x->e[i];
    uint32_t gen = e->gen + 1;
    memset(e, 0, sizeof *e);
    e->key = *key;
    e->ns = ns;
    x->ns_slots[ns]++;
    e->gen = gen;
    e->state = IDX_PENDING;
    e->tier = IDX_DRAM;
    e->blk = e->lru_prev = e->lru_next = e->parent = IDX_NONE;
    if (x->nv_active) {
        memset(&x->nv[i], 0, sizeof x->nv[i]);
        x->nv[i].prev = x->nv[i].next = x->nv[i].h = IDX_NONE;
    }
    uint32_t b = hash_of(ns, key) & x->mask;
    e->hnext = x->buckets[b];
    x->buckets[b] = i;
    return i;
}

/* ------------------------------------------- eviction lists, one per tier */

static uint32_t *prev_of(struct idx *x, int l, uint32_t i)
{
    return l == L_DRAM ? &x->e[i].lru_prev : &x->nv[i].prev;
}

static uint32_t *next_of(struct idx *x, int l, uint32_t i)
{
    return l == L_DRAM ? &x->e[i].lru_next : &x->nv[i].next;
}

static uint32_t *head_of(struct idx *x, int l)
{
    return l == L_DRAM ? &x->lru_head : &x->nv_head;
}

static uint32_t *tail_of(struct idx *x, int l)
{
    return l == L_DRAM ? &x->lru_tail : &x->nv_tail;
}

static int on_list(struct idx *x, int l, uint32_t i)
{
    return *prev_of(x, l, i) != IDX_NONE || *head_of(x, l) == i;
}

static void list_unlink(struct idx *x, int l, uint32_t i)
{
    if (!on_list(x, l, i)) return;
    uint32_t p = *prev_of(x, l, i), n = *next_of(x, l, i);
    if (p != IDX_NONE) *next_of(x, l, p) = n;
    else *head_of(x, l) = n;
    if (n != IDX_NONE) *prev_of(x, l, n) = p;
    else *tail_of(x, l) = p;
    *prev_of(x, l, i) = *next_of(x, l, i) = IDX_NONE;
}

static void list_push(struct idx *x, int l, uint32_t i, int at_tail)
{
    uint32_t *end = at_tail ? tail_of(x, l) : head_of(x, l);
    uint32_t *in = at_tail ? next_of(x, l, i) : prev_of(x, l, i);
    uint32_t *out = at_tail ? prev_of(x, l, i) : next_of(x, l, i);
    *in = IDX_NONE;
    *out = *end;
    if (*end != IDX_NONE) *(at_tail ? next_of(x, l, *end) : prev_of(x, l, *end)) = i;
    else *(at_tail ? head_of(x, l) : tail_of(x, l)) = i;
    *end = i;
}

/* A DRAM leaf: its DRAM copy may be dropped or demoted. */
static int dram_leaf(const struct idx *x, uint32_t i)
{
    const struct idx_entry *e = &x->e[i];
    return e->state == IDX_READY && (e->tier & IDX_DRAM) && e->pins == 0 &&
           (e->children == 0 || x->plain_lru);
}

/* An NVMe leaf: its record may be dropped. */
static int nv_leaf(const struct idx *x, uint32_t i)
{
    const struct idx_entry *e = &x->e[i];
    return x->nv_active && e->state == IDX_READY && (e->tier & IDX_NVME) &&
           (x->nv[i].kids == 0 || x->plain_lru) &&
           !(x->nv[i].flags & (IDX_F_READING | IDX_F_SCRUB));
}

/* Put i on the lists it belongs on (head, or tail for a parent whose
 * last child just left) and off the others. */
static void relist(struct idx *x, uint32_t i, int at_tail)
{
    int want = dram_leaf(x, i), on = on_list(x, L_DRAM, i);
    if (want && !on) list_push(x, L_DRAM, i, at_tail);
    else if (!want && on) list_unlink(x, L_DRAM, i);
    if (!x->nv_active) return;
    want = nv_leaf(x, i);
    on = on_list(x, L_NVME, i);
    if (want && !on) list_push(x, L_NVME, i, at_tail);
    else if (!want && on) list_unlink(x, L_NVME, i);
}

/* The parent of i if the reference is still to the same chunk. */
static uint32_t live_parent(const struct idx *x, uint32_t i)
{
    const struct idx_entry *e = &x->e[i];
    if (e->parent == IDX_NONE) return IDX_NONE;
    const struct idx_entry *p = &x->e[e->parent];
    if (p->gen != e->parent_gen || p->state == IDX_FREE) return IDX_NONE;
    return e->parent;
}

/* A ready child of p appeared (+1) or left (-1), with or without a DRAM
 * copy. */
static void child_moved(struct idx *x, uint32_t p, int delta, int dram)
{
    if (dram) x->e[p].children += (uint32_t)delta;
    if (x->nv_active) x->nv[p].kids += (uint32_t)delta;
    relist(x, p, delta < 0);
}

static void count_tiers(struct idx *x, const struct idx_entry *e, int sign)
{
    for (int t = 0; t < 2; t++) {
        if (!(e->tier & (t ? IDX_NVME : IDX_DRAM))) continue;
        x->n_in[t] += (uint64_t)(int64_t)sign;
        x->bytes_in[t] += (uint64_t)((int64_t)sign * e->size);
    }
}

void idx_commit(struct idx *x, uint32_t i, uint32_t parent, uint32_t now)
{
    struct idx_entry *e = &x->e[i];
    e->state = IDX_READY;
    e->atime = now;
    x->n_ready++;
    x->bytes_ready += e->size;
    count_tiers(x, e, 1);
    if (parent != IDX_NONE && parent != i) {
        e->parent = parent;
        e->parent_gen = x->e[parent].gen;
        child_moved(x, parent, 1, e->tier & IDX_DRAM);
    }
    relist(x, i, 0);
}

static void hash_unlink(struct idx *x, uint32_t i)
{
    struct idx_entry *e = &x->e[i];
    uint32_t *p = &x->buckets[hash_of(e->ns, &e->key) & x->mask];
    while (*p != i) p = &x->e[*p].hnext;
    *p = e->hnext;
}

/* Leave the READY state: counters and the parent's child counts. */
static void unready(struct idx *x, uint32_t i)
{
    struct idx_entry *e = &x->e[i];
    x->n_ready--;
    x->bytes_ready -= e->size;
    count_tiers(x, e, -1);
    e->state = IDX_DOOMED; /* off both lists from here on */
    relist(x, i, 0);
    uint32_t p = live_parent(x, i);
    if (p != IDX_NONE) child_moved(x, p, -1, e->tier & IDX_DRAM);
    e->parent = IDX_NONE;
}

void idx_doom(struct idx *x, uint32_t i)
{
    if (x->e[i].state != IDX_READY) return;
    unready(x, i);
}

void idx_remove(struct idx *x, uint32_t i)
{
    struct idx_entry *e = &x->e[i];
    if (e->state == IDX_READY) unready(x, i);
    list_unlink(x, L_DRAM, i);
    if (x->nv_active) list_unlink(x, L_NVME, i);
    hash_unlink(x, i);
    x->ns_slots[e->ns]--;
    e->state = IDX_FREE;
    e->hnext = x->free_head;
    x->free_head = i;
}

void idx_set_tier(struct idx *x, uint32_t i, uint8_t tier)
{
    struct idx_entry *e = &x->e[i];
    if (e->state != IDX_READY) {
        e->tier = tier;
        return;
    }
    uint8_t was = e->tier;
    count_tiers(x, e, -1);
    e->tier = tier;
    count_tiers(x, e, 1);
    uint32_t p = live_parent(x, i);
    if (p != IDX_NONE && ((was ^ tier) & IDX_DRAM)) {
        x->e[p].children += tier & IDX_DRAM ? 1u : (uint32_t)-1;
        relist(x, p, !(tier & IDX_DRAM));
    }
    relist(x, i, 0);
}

void idx_set_flags(struct idx *x, uint32_t i, uint8_t set, uint8_t clear)
{
    x->nv[i].flags = (uint8_t)((x->nv[i].flags | set) & ~clear);
    relist(x, i, 0);
}

void idx_touch(struct idx *x, uint32_t i, uint32_t now)
{
    x->e[i].atime = now;
    for (int l = 0; l < (x->nv_active ? 2 : 1); l++) {
        if (!on_list(x, l, i)) continue;
        list_unlink(x, l, i);
        list_push(x, l, i, 0);
    }
}

void idx_pin(struct idx *x, uint32_t i)
{
    if (x->e[i].pins++ == 0) relist(x, i, 0);
}

uint32_t idx_unpin(struct idx *x, uint32_t i)
{
    struct idx_entry *e = &x->e[i];
    if (e->pins == 0) {
        fprintf(stderr, "index: unpin of an unpinned entry %u\n", i);
        abort();
    }
    if (--e->pins == 0) relist(x, i, 0);
    return e->pins;
}

size_t idx_mem_bytes(const struct idx *x)
{
    size_t per = sizeof *x->e + (x->nv_active ? sizeof *x->nv : 0);
    return (size_t)x->used * per + ((size_t)x->mask + 1) * sizeof *x->buckets;
}
