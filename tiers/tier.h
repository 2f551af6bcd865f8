/*
 * tier.h -- the vtable every storage tier sits behind.
 *
 * Design: a tier stores opaque byte ranges at locations it chooses; it knows
 * nothing of keys, namespaces or policy. Placement, eviction and promotion
 * live in the daemon's policy (DESIGN §4). Calls are made on the core thread
 * only. alloc/free are synchronous and O(1); read/write may complete later:
 * a tier that finishes asynchronously (NVMe, peer) calls done() from the
 * core thread, a synchronous one (DRAM) before returning.
 */
#ifndef KVT_TIER_H
#define KVT_TIER_H

#include <stdint.h>

#include "kvtier.h"

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

struct tier_ops {
    const char *name;
    kvt_tier id;
    /* Reserve bytes; KVT_ENOSPC when nothing fits (the caller may evict
     * and try again). */
    kvt_err (*alloc)(struct tier *t, uint64_t bytes, struct tier_loc *loc);
    /* Reserve exactly [off, off+bytes) (adoption after restart). */
    kvt_err (*alloc_at)(struct tier *t, uint64_t off, uint64_t bytes,
                        struct tier_loc *loc);
    void (*free)(struct tier *t, const struct tier_loc *loc);
    kvt_err (*write)(struct tier *t, const struct tier_loc *loc, uint64_t at,
                     const void *src, uint64_t n, tier_done_fn done, void *arg);
    kvt_err (*read)(struct tier *t, const struct tier_loc *loc, uint64_t at,
                    void *dst, uint64_t n, tier_done_fn done, void *arg);
    void (*usage)(struct tier *t, struct tier_usage *u);
    void (*destroy)(struct tier *t);
};

struct tier {
    const struct tier_ops *ops;
};

#endif
