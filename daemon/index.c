/*
 * index.c -- see index.h for the design.
 */
#include "index.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

static uint32_t hash_of(uint16_t ns, const kvt_key *k)
{
    uint64_t h;
    memcpy(&h, k->b, sizeof h);
    h ^= (uint64_t)ns * 0x9E3779B97F4A7C15ull;
    return (uint32_t)(h ^ (h >> 32));
}

int idx_init(struct idx *x, uint64_t max_entries)
{
    memset(x, 0, sizeof *x);
    if (max_entries == 0 || max_entries >= IDX_NONE) return -1;
    uint64_t nb = 1024;
    while (nb < max_entries && nb < (1ull << 31)) nb <<= 1;
    x->buckets = malloc(nb * sizeof *x->buckets);
    void *e = mmap(NULL, max_entries * sizeof *x->e, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (!x->buckets || e == MAP_FAILED) {
        free(x->buckets);
        x->buckets = NULL;
        return -1;
    }
    x->e = e;
    x->cap = (uint32_t)max_entries;
    memset(x->buckets, 0xff, nb * sizeof *x->buckets);
    x->mask = (uint32_t)(nb - 1);
    x->free_head = x->lru_head = x->lru_tail = IDX_NONE;
    return 0;
}

void idx_destroy(struct idx *x)
{
    if (x->e) munmap(x->e, (size_t)x->cap * sizeof *x->e);
    free(x->buckets);
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
    e->gen = gen;
    e->state = IDX_PENDING;
    e->tier = KVT_TIER_DRAM;
    e->blk = e->lru_prev = e->lru_next = e->parent = IDX_NONE;
    uint32_t b = hash_of(ns, key) & x->mask;
    e->hnext = x->buckets[b];
    x->buckets[b] = i;
    return i;
}

/* ---- eviction list: only leaves that may be evicted are on it ---- */

static int on_list(const struct idx *x, uint32_t i)
{
    return x->e[i].lru_prev != IDX_NONE || x->lru_head == i;
}

static int evictable(const struct idx_entry *e)
{
    return e->state == IDX_READY && e->pins == 0 && e->children == 0;
}

static void list_unlink(struct idx *x, uint32_t i)
{
    struct idx_entry *e = &x->e[i];
    if (!on_list(x, i)) return;
    if (e->lru_prev != IDX_NONE) x->e[e->lru_prev].lru_next = e->lru_next;
    else x->lru_head = e->lru_next;
    if (e->lru_next != IDX_NONE) x->e[e->lru_next].lru_prev = e->lru_prev;
    else x->lru_tail = e->lru_prev;
    e->lru_prev = e->lru_next = IDX_NONE;
}

static void list_push_head(struct idx *x, uint32_t i)
{
    struct idx_entry *e = &x->e[i];
    e->lru_prev = IDX_NONE;
    e->lru_next = x->lru_head;
    if (x->lru_head != IDX_NONE) x->e[x->lru_head].lru_prev = i;
    else x->lru_tail = i;
    x->lru_head = i;
}

static void list_push_tail(struct idx *x, uint32_t i)
{
    struct idx_entry *e = &x->e[i];
    e->lru_next = IDX_NONE;
    e->lru_prev = x->lru_tail;
    if (x->lru_tail != IDX_NONE) x->e[x->lru_tail].lru_next = i;
    else x->lru_head = i;
    x->lru_tail = i;
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

void idx_commit(struct idx *x, uint32_t i, uint32_t parent, uint32_t now)
{
    struct idx_entry *e = &x->e[i];
    e->state = IDX_READY;
    e->atime = now;
    x->n_ready++;
    x->bytes_ready += e->size;
    if (parent != IDX_NONE && parent != i) {
        e->parent = parent;
        e->parent_gen = x->e[parent].gen;
        if (x->e[parent].children++ == 0) list_unlink(x, parent);
    }
    if (evictable(e)) list_push_head(x, i);
}

static void hash_unlink(struct idx *x, uint32_t i)
{
    struct idx_entry *e = &x->e[i];
    uint32_t *p = &x->buckets[hash_of(e->ns, &e->key) & x->mask];
    while (*p != i) p = &x->e[*p].hnext;
    *p = e->hnext;
}

/* Leave the READY state: counters and the parent's child count. */
static void unready(struct idx *x, uint32_t i)
{
    struct idx_entry *e = &x->e[i];
    list_unlink(x, i);
    x->n_ready--;
    x->bytes_ready -= e->size;
    uint32_t p = live_parent(x, i);
    if (p != IDX_NONE && --x->e[p].children == 0 && evictable(&x->e[p]))
        list_push_tail(x, p);
    e->parent = IDX_NONE;
}

void idx_doom(struct idx *x, uint32_t i)
{
    if (x->e[i].state != IDX_READY) return;
    unready(x, i);
    x->e[i].state = IDX_DOOMED;
}

void idx_remove(struct idx *x, uint32_t i)
{
    struct idx_entry *e = &x->e[i];
    if (e->state == IDX_READY) unready(x, i);
    list_unlink(x, i);
    hash_unlink(x, i);
    e->state = IDX_FREE;
    e->hnext = x->free_head;
    x->free_head = i;
}

void idx_touch(struct idx *x, uint32_t i, uint32_t now)
{
    x->e[i].atime = now;
    if (on_list(x, i)) {
        list_unlink(x, i);
        list_push_head(x, i);
    }
}

void idx_pin(struct idx *x, uint32_t i)
{
    if (x->e[i].pins++ == 0) list_unlink(x, i);
}

uint32_t idx_unpin(struct idx *x, uint32_t i)
{
    struct idx_entry *e = &x->e[i];
    if (e->pins == 0) {
        fprintf(stderr, "index: unpin of an unpinned entry %u\n", i);
        abort();
    }
    if (--e->pins == 0 && evictable(e)) list_push_head(x, i);
    return e->pins;
}

size_t idx_mem_bytes(const struct idx *x)
{
    return (size_t)x->used * sizeof *x->e + ((size_t)x->mask + 1) * sizeof *x->buckets;
}
