/*
 * tier_host.h -- the core's services a tier is built with.
 *
 * Design: a tier module (tiers/nvme/, tiers/peer/) is a leaf: it never
 * sees the daemon's state. At creation it gets a struct tier_host: the
 * index it keeps chunk records in (index.h), the DRAM pool its bytes come
 * from and go to (dram.h), the completion queue its workers post to
 * (workq.h), and the calls below, each handed `core` back. The daemon
 * builds one (daemon/tierhost.c); a unit test builds its own
 * (tests/unit/test_tier_nvme.c). Core thread only.
 */
#ifndef KVT_TIER_HOST_H
#define KVT_TIER_HOST_H

#include <stddef.h>
#include <stdint.h>

#include "dram.h"
#include "index.h"
#include "kvtier.h"
#include "kvtier.pb-c.h"

#define NS_NONE UINT16_MAX /* no namespace (the core uses the same) */

struct park;
struct req;
struct wq_cq;

/* The callbacks of a parked request (daemon/park.c), each handed the ctx
 * given at park time and the owner. */
struct park_ops {
    /* The client went away (or the daemon stops): let go of what the
     * request holds. The park is freed when this returns. */
    void (*gone)(void *ctx, void *owner);
    /* The deadline passed: answer (park_answer) or set a new deadline. */
    void (*due)(void *ctx, void *owner);
};

struct tier_host {
    void *core;          /* handed back to every call */
    struct idx *idx;     /* the chunk index */
    struct dram *dram;   /* the DRAM pool */
    struct wq_cq *cq;    /* where workers post finished jobs */

    /* ms since the daemon started (deadlines); ns on a monotonic clock */
    uint64_t (*clock_ms)(void *core);
    uint64_t (*now_ns)(void *core);

    /* Namespaces (ns.h): the name of an index slot's namespace; find or
     * create one by name (NS_NONE: none / table full); claim for a
     * request, hold while nothing else does (ns_hold/ns_unhold). */
    const char *(*ns_name)(void *core, uint16_t ns);
    uint16_t (*ns_find)(void *core, const char *name);
    uint16_t (*ns_intern)(void *core, const char *name);
    uint16_t (*ns_claim)(void *core, const char *name, uint32_t pipe);
    void (*ns_hold)(void *core, uint16_t ns);
    void (*ns_unhold)(void *core, uint16_t ns);
    /* A chunk of ns with bytes was put in the index at start (counts). */
    void (*ns_loaded)(void *core, uint16_t ns, uint64_t bytes);

    /* Placement over DRAM (the core's policy, store.c): reserve a slot
     * for a new chunk, commit it, free a chunk, DRAM space for a chunk
     * of namespace ns read back, in its pool (evicting as needed; the
     * handle goes to idx_entry.blk),
     * drop only a chunk's DRAM copy, evict to the watermark. */
    kvt_err (*reserve)(void *core, uint16_t ns, const kvt_key *key,
                       uint64_t size, uint32_t *slot);
    void (*commit)(void *core, uint32_t slot, uint64_t csum, uint32_t parent);
    void (*free_slot)(void *core, uint32_t slot);
    kvt_err (*alloc_dram)(void *core, uint16_t ns, uint64_t size, uint32_t *blk);
    void (*drop_dram)(void *core, uint32_t slot);
    void (*watermark)(void *core);
    /* A chunk's DRAM copy became valid (the DRAM journal). */
    void (*dram_added)(void *core, uint32_t slot);

    /* KV events: a copy of the chunk appeared in / left a tier (IDX_*). */
    void (*ev_stored)(void *core, uint32_t slot, uint8_t tier);
    void (*ev_removed)(void *core, uint32_t slot, uint8_t tier);

    /* Parked requests (park.h): park the request being handled (NULL:
     * answer it now), set its deadline (ms on clock_ms), answer it. */
    struct park *(*park)(void *core, uint32_t pipe, uint64_t req_id,
                         const struct park_ops *ops, void *ctx, void *owner);
    void (*park_deadline)(void *core, struct park *p, uint64_t deadline);
    uint32_t (*park_pipe)(const struct park *p);
    uint64_t (*park_req_id)(const struct park *p);
    void (*park_answer)(void *core, struct park *p, const Kvtier__Response *rsp);
    /* Answer a parked GET as the handler answers one: slots[0..n) are
     * its leading chunks now in DRAM. Frees p. */
    void (*get_answer)(void *core, struct park *p, uint16_t ns, int inline_,
                       uint32_t n_keys, const uint32_t *slots, size_t n);

    /* Replies built inside a request handler: memory freed with the
     * reply, and an error with its text. */
    void *(*req_alloc)(struct req *r, size_t size);
    kvt_err (*req_fail)(struct req *r, kvt_err e, const char *msg);
};

/* ---- helpers over the index and the DRAM pool */

static inline uint64_t th_off(const struct tier_host *h, uint32_t slot)
{
    return dram_block_off(h->dram, idx_at(h->idx, slot)->blk);
}

static inline void *th_ptr(const struct tier_host *h, uint32_t slot)
{
    return dram_ptr(h->dram, th_off(h, slot));
}

/* 1 if the chunk can be served from DRAM now. */
static inline int th_in_dram(const struct tier_host *h, uint32_t slot)
{
    return (idx_at(h->idx, slot)->tier & IDX_DRAM) != 0;
}

static inline uint32_t th_secs(const struct tier_host *h)
{
    return (uint32_t)(h->clock_ms(h->core) / 1000);
}

#endif
