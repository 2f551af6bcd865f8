/*
 * tier.h -- the one interface every storage tier sits behind.
 *
 * Design (DESIGN §4): each tier (hbm, dram, nvme, peer) is one struct tier
 * and the daemon goes through its ops alone. Two levels:
 *
 *  - Space: a tier stores opaque byte ranges at locations it chooses
 *    (alloc/alloc_at/free, write_at/read_at). The DRAM and HBM pools and
 *    the NVMe record files have it; the peer tier has none.
 *  - Chunks, named by their index slot (index.h): the request path asks
 *    the tier for what the core's index did not find in DRAM (get,
 *    lookup), moves a chunk between its DRAM slot and the tier (read:
 *    promote into DRAM; write: demote from DRAM) and tells the tier of a
 *    chunk's life (committed, release). A tier without chunks of its own
 *    (DRAM, HBM) leaves these NULL.
 *
 * Calls are made on the core thread only. alloc/free are synchronous and
 * O(1); everything that moves bytes may complete later: an asynchronous
 * tier (NVMe, peer) calls done() from the core thread, a synchronous one
 * (DRAM) before returning. A tier is built by its own module from a
 * narrow context of the core's services (tier_host.h), so it can be built
 * and driven without a daemon (tests/unit/test_tier_nvme.c).
 */
#ifndef KVT_TIER_H
#define KVT_TIER_H

#include <stddef.h>
#include <stdint.h>

#include "kvtier.h"
#include "kvtier.pb-c.h"

struct tier;

/* Where a tier put a range. h is the tier's own handle for it. */
struct tier_loc {
    uint64_t off; /* byte offset inside the tier */
    uint64_t len; /* bytes reserved (may be rounded up) */
    uint32_t h;
};

struct tier_usage {
    uint64_t capacity, used, free_largest;
    double fragmentation;
    uint64_t meta_bytes; /* memory the tier spends on metadata */
};

typedef void (*tier_done_fn)(void *arg, kvt_err err);

/* What get/lookup answer. */
enum tier_walk_ret {
    TIER_NOW = 0,    /* answer the request now, with what the walk holds */
    TIER_PARKED = 1, /* the tier parked it and answers it later */
};

/* One GET or LOOKUP on its way down the tiers (daemon/store.c's walk). */
struct tier_walk {
    uint32_t pipe;   /* the client's connection */
    uint64_t req_id;
    uint16_t ns;     /* NS_NONE: the request's namespace is unknown here */
    /* GET: slots[0..n) are the leading chunks found so far (slots holds
     * get->n_keys); a tier that answers now may cut n. */
    const Kvtier__Get *get;
    uint32_t *slots;
    size_t n;
    /* LOOKUP: lr is filled by the walk so far (arena memory). */
    const Kvtier__Lookup *lookup;
    Kvtier__LookupResp *lr;
};

struct tier_ops {
    const char *name;
    kvt_tier id;
    /* ---- space */
    /* Reserve bytes; KVT_ENOSPC when nothing fits (the caller may evict
     * and try again). */
    kvt_err (*alloc)(struct tier *t, uint64_t bytes, struct tier_loc *loc);
    /* Reserve exactly [off, off+bytes) (adoption after restart). */
    kvt_err (*alloc_at)(struct tier *t, uint64_t off, uint64_t bytes,
                        struct tier_loc *loc);
    void (*free)(struct tier *t, const struct tier_loc *loc);
    kvt_err (*write_at)(struct tier *t, const struct tier_loc *loc, uint64_t at,
                        const void *src, uint64_t n, tier_done_fn done, void *arg);
    kvt_err (*read_at)(struct tier *t, const struct tier_loc *loc, uint64_t at,
                       void *dst, uint64_t n, tier_done_fn done, void *arg);
    void (*usage)(struct tier *t, struct tier_usage *u);
    void (*destroy)(struct tier *t);
    /* ---- chunks (index slots) */
    /* GET, after the tiers above: bring in what this tier holds of the
     * request's chunks. TIER_PARKED, or TIER_NOW with w->n possibly cut. */
    int (*get)(struct tier *t, struct tier_walk *w);
    /* LOOKUP, after the tiers above: tell what this tier knows of the
     * keys missing so far (may ask elsewhere and park). */
    int (*lookup)(struct tier *t, struct tier_walk *w);
    /* Read a chunk this tier holds into a DRAM slot of its own (promote).
     * KVT_OK: under way (or already), done(arg, err) follows on the core
     * thread (done may be NULL); else it did not start and done is not
     * called. */
    kvt_err (*read)(struct tier *t, uint32_t slot, tier_done_fn done, void *arg);
    /* Write a chunk from its DRAM slot to this tier, its DRAM copy freed
     * once written (demote). KVT_OK: started, done follows; KVT_EBUSY:
     * the tier cannot take it now. */
    kvt_err (*write)(struct tier *t, uint32_t slot, tier_done_fn done, void *arg);
    /* A chunk was committed to DRAM (a write-through tier queues it; the
     * peer tier tells the chunk's owners this node holds it). */
    void (*committed)(struct tier *t, uint32_t slot);
    /* A committed chunk stopped being visible (deleted, or freed). */
    void (*removed)(struct tier *t, uint32_t slot);
    /* The chunk's slot is being freed: drop this tier's copy. */
    void (*release)(struct tier *t, uint32_t slot);
    /* DRAM bytes that writes in flight will free. */
    uint64_t (*demoting)(const struct tier *t);
    /* The core dropped a dirty chunk (only in DRAM) before this tier
     * could take it (counted as lost). */
    void (*lost)(struct tier *t, uint32_t slot);
};

struct tier {
    const struct tier_ops *ops;
};

#endif
