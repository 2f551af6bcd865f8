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
 * Two tiers, two lists (DESIGN §4). A chunk may be held by DRAM, NVMe or
 * both (idx_entry.tier is a set of IDX_DRAM / IDX_NVME bits). The DRAM
 * list holds DRAM leaves: no child with a DRAM copy (`children`), so a
 * chain leaves DRAM (is demoted) from its tail and the prompt prefix
 * stays in the fast tier. The NVMe list holds NVMe leaves: no ready child
 * in any tier (idx_nv.kids), because dropping a chunk's last copy makes
 * every descendant unreachable for prefix hits. A chunk being read from
 * NVMe (IDX_F_READING) is on neither list; one with I/O in flight is
 * pinned, which keeps its DRAM copy off the DRAM list as a reader's pin
 * does. NVMe-side fields live in a parallel array (idx_nv), reserved like
 * the entries and touched only while an NVMe tier is active
 * (idx.nv_active), so a DRAM-only daemon pays nothing for it.
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
    uint8_t tier;      /* IDX_DRAM | IDX_NVME: which tiers hold it */
};

#define IDX_DRAM 0x01u
#define IDX_NVME 0x02u

/* Flags of idx_nv. */
#define IDX_F_READING 0x01u /* NVMe -> DRAM read in flight */
#define IDX_F_WRITING 0x02u /* DRAM -> NVMe write in flight */
#define IDX_F_DROP 0x04u    /* free the DRAM copy once written */
#define IDX_F_QUEUED 0x08u  /* waits in the write queue */
#define IDX_F_SCRUB 0x10u   /* VERIFY is reading its record */

/* The NVMe side of a slot (parallel to the entries). */
struct idx_nv {
    uint32_t prev, next; /* NVMe eviction list */
    uint32_t h;          /* NVMe allocation handle */
    uint32_t kids;       /* ready children in any tier */
    uint32_t blk;        /* record offset in its file, 4 KiB units */
    uint16_t file;
    uint8_t flags;
    uint8_t pad;
};

/* The entry array is one address-space reservation of cap slots, touched
 * only as slots are first used, so it never moves and never stalls the
 * core on a copy; resident memory follows the slots in use. */
struct idx {
    struct idx_entry *e;
    struct idx_nv *nv;
    uint32_t cap, used, free_head;
    uint32_t *buckets;
    uint32_t mask;
    uint32_t lru_head, lru_tail; /* DRAM leaves, head = most recent */
    uint32_t nv_head, nv_tail;   /* NVMe leaves, head = most recent */
    int nv_active;               /* an NVMe tier exists */
    int plain_lru;               /* every ready chunk is a leaf (policy baseline) */
    uint64_t n_ready, bytes_ready;
    uint64_t n_in[2], bytes_in[2]; /* ready chunks per tier: 0 DRAM, 1 NVMe */
    uint32_t *ns_slots; /* slots in any state but FREE, per namespace id:
                         * a namespace id with none may be reused (ns.c) */
};

/* max_entries bounds the chunks the index can hold (the DRAM tier has at
 * most one chunk per 4 KiB unit). */
int idx_init(struct idx *x, uint64_t max_entries);
void idx_destroy(struct idx *x);

/* Slots of namespace id ns in any state but FREE. */
static inline uint32_t idx_ns_slots(const struct idx *x, uint16_t ns)
{
    return x->ns_slots ? x->ns_slots[ns] : 0;
}
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
/* The coldest evictable DRAM leaf, or IDX_NONE. */
static inline uint32_t idx_victim(const struct idx *x) { return x->lru_tail; }
/* The coldest evictable NVMe leaf, or IDX_NONE. */
static inline uint32_t idx_victim_nv(const struct idx *x) { return x->nv_tail; }

/* Set which tiers hold a chunk (IDX_DRAM / IDX_NVME bits): counts, the
 * parent's child counts and both lists follow. */
void idx_set_tier(struct idx *x, uint32_t i, uint8_t tier);
/* Set or clear IDX_F_* flags; the lists follow. */
void idx_set_flags(struct idx *x, uint32_t i, uint8_t set, uint8_t clear);

static inline struct idx_entry *idx_at(const struct idx *x, uint32_t i)
{
    return &x->e[i];
}
static inline struct idx_nv *idx_nv_at(const struct idx *x, uint32_t i)
{
    return &x->nv[i];
}
/* The fastest tier holding a chunk, as a kvt_tier. */
static inline kvt_tier idx_top_tier(const struct idx_entry *e)
{
    return e->tier & IDX_DRAM ? KVT_TIER_DRAM
           : e->tier & IDX_NVME ? KVT_TIER_NVME : KVT_TIER_NONE;
}

/* Resident bytes of the index: touched slots and the bucket array. */
size_t idx_mem_bytes(const struct idx *x);

#endif
