/*
 * index.h -- the chunk index: (namespace, key) -> entry, plus the eviction
 * order.
 *
 * Design: entries live in one growable array and are named by their slot
 * number, so links (hash chains, the eviction list, parent references) are
 * 4-byte indices rather than pointers and survive realloc. Keys are SHA-256
 * outputs, so their first 8 bytes are already a good hash. The namespace is
 * part of the identity: the engine-compatible schemes (vLLM, SGLang) do not
 * fold the namespace into the key, and two tenants or two models that hash
 * the same tokens must still never see each other's chunks.
 *
 * Eviction order is prefix-aware: only *leaves* (ready, unpinned, no cached
 * child) sit on the eviction list, most recently used at the head. Evicting
 * a leaf may turn its parent into a leaf, which joins the cold end: a chain
 * is eaten from its tail backwards, and a shared prefix outlives every
 * chunk below it. A parent is referenced by slot plus generation, so a
 * reference to a slot reused for another chunk is detected and ignored.
 *
 * Owned by the core thread; no locks.
 */
#ifndef KVT_INDEX_H
#define KVT_INDEX_H

#include <stddef.h>
#include <stdint.h>

#include "kvtier.h"

#define IDX_NONE UINT32_MAX

enum idx_state {
    IDX_FREE = 0,
    IDX_PENDING = 1, /* space reserved by a write lease, invisible */
    IDX_READY = 2,   /* committed and visible */
    IDX_DOOMED = 3,  /* deleted while pinned: invisible, freed on unpin */
};

struct idx_entry {
    kvt_key key;
    uint64_t csum;     /* XXH3-64 recorded at commit */
    uint32_t size;     /* bytes of the chunk (max_chunk_bytes < 4 GiB) */
    uint32_t atime;    /* last access, seconds since daemon start */
    uint32_t blk;      /* tier handle of the DRAM range */
    uint32_t hnext;    /* hash chain / free list */
    uint32_t lru_prev, lru_next;
    uint32_t parent, parent_gen;
    uint32_t gen;      /* bumped each time the slot is reused */
    uint32_t children; /* ready children pointing here */
    uint32_t pins;     /* read leases holding it */
    uint16_t ns;
    uint8_t state;
    uint8_t tier;
};

/* The entry array is one address-space reservation of cap slots, touched
 * only as slots are first used, so it never moves and never stalls the
 * core on a copy; resident memory follows the slots in use. */
struct idx {
    struct idx_entry *e;
    uint32_t cap, used, free_head;
    uint32_t *buckets;
    uint32_t mask;
    uint32_t lru_head, lru_tail; /* evictable leaves, head = most recent */
    uint64_t n_ready, bytes_ready;
};

/* max_entries bounds the chunks the index can hold (the DRAM tier has at
 * most one chunk per 4 KiB unit). */
int idx_init(struct idx *x, uint64_t max_entries);
void idx_destroy(struct idx *x);

/* The slot of (ns, key) in any state but FREE, or IDX_NONE. */
uint32_t idx_find(const struct idx *x, uint16_t ns, const kvt_key *key);
/* Insert (ns, key), known absent, as PENDING. IDX_NONE if out of memory. */
uint32_t idx_insert(struct idx *x, uint16_t ns, const kvt_key *key);
/* Make a PENDING entry READY; parent is a slot or IDX_NONE. */
void idx_commit(struct idx *x, uint32_t i, uint32_t parent, uint32_t now_s);
/* Take the entry out of every structure and free its slot. The caller
 * frees the tier space first. */
void idx_remove(struct idx *x, uint32_t i);
/* READY -> DOOMED: invisible at once, freed by idx_remove once unpinned. */
void idx_doom(struct idx *x, uint32_t i);
/* Record an access; a leaf moves to the head of the eviction list. */
void idx_touch(struct idx *x, uint32_t i, uint32_t now_s);
void idx_pin(struct idx *x, uint32_t i);
/* Returns the remaining pin count. */
uint32_t idx_unpin(struct idx *x, uint32_t i);
/* The coldest evictable leaf, or IDX_NONE. */
static inline uint32_t idx_victim(const struct idx *x) { return x->lru_tail; }

static inline struct idx_entry *idx_at(const struct idx *x, uint32_t i)
{
    return &x->e[i];
}

/* Resident bytes of the index: touched slots and the bucket array. */
size_t idx_mem_bytes(const struct idx *x);

#endif
