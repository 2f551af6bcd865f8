/*
 * kvtierd.h -- the daemon's state, owned by the core thread.
 *
 * Design (DESIGN §6): one core thread owns the index, the allocator, the
 * leases and the policy. nng's threads only move messages: they queue a
 * received request and wake the core through an eventfd. Everything in
 * struct kvtierd is therefore touched by the core thread alone and needs
 * no lock; the only shared structure is the server's queue (server.c).
 */
#ifndef KVT_KVTIERD_H
#define KVT_KVTIERD_H

#include <stdint.h>

#include "config.h"
#include "dram.h"
#include "index.h"
#include "kvtier.h"
#include "kvtier.pb-c.h"
#include "metrics.h"
#include "ns.h"
#include "tier_host.h"

#define NS_NONE UINT16_MAX /* also in tier_host.h */
#define NS_LIMIT 4096

struct ns_info {
    char *name;
    uint32_t owner; /* connection that created it, 0: the daemon (ns.h) */
    uint32_t holds; /* holders besides index slots (ns.h) */
    uint64_t chunks, bytes, hits, misses;
    /* metrics.c: by enum hit_op */
    uint64_t hit_chunks[HIT_OPS], miss_chunks[HIT_OPS], hit_bytes[HIT_OPS];
};

struct ns_table {
    struct ns_info *v;
    uint32_t n, cap;
};

enum lease_kind { LEASE_READ = 1, LEASE_WRITE = 2 };

struct lease {
    uint64_t id;
    uint32_t pipe;
    uint8_t kind;
    uint64_t deadline; /* ms since start */
    uint32_t n;
    uint32_t *slot;    /* index slots; IDX_NONE for keys that existed */
    uint32_t *parent;  /* write: parent slot of each, or IDX_NONE */
    uint32_t *pgen;    /* write: generation of that parent */
    struct lease *hnext;
};

#define LEASE_BUCKETS 4096

struct lease_table {
    struct lease *b[LEASE_BUCKETS];
    uint64_t next_id;
    uint64_t count;
};

struct counters {
    uint64_t hits, misses, puts, evictions, bytes_in, bytes_out;
    uint64_t errors, expired_leases, requests;
};

struct server;
struct kvc;
struct metrics_http;
struct nvs_ctx;
struct journal;
struct cl_ctx;
struct ev;
struct park_table;
struct wq_cq;

struct kvtierd {
    struct kvt_config cfg;
    struct dram *dram;
    struct idx idx;
    struct ns_table ns;
    struct lease_table leases;
    struct server *srv;
    struct local_srv *local; /* the fast channel, or NULL */
    char local_path[CFG_STR_MAX + 8];
    struct counters st;
    uint32_t *pipes; /* connected nng pipe ids */
    uint32_t n_pipes, cap_pipes;
    uint64_t evict_target; /* >0: bytes still to free in slices */
    char gpu[160];
    struct kvc *kvc;       /* KV-cache registrations, transfers (kvcache.c) */
    struct journal *journal; /* committed DRAM chunks, or NULL (adopt.c) */
    /* the tiers (tier.h), built from one host of the core's services
     * (tierhost.c) */
    struct tier_host host;
    struct nvs_ctx *nvx;   /* the NVMe tier's context (nvme/nvstore.h) */
    struct cl_ctx *clx;    /* the peer tier's context (peer/cluster.h) */
    struct tier *nvme;     /* the NVMe tier, or NULL without one */
    struct tier *tiers[3]; /* GET / LOOKUP order: dram, nvme, peer */
    uint32_t n_tiers;
    struct ev *ev;         /* KV-events publisher, or NULL when off (events.c) */
    struct park_table *park; /* requests answered later (park.c) */
    struct wq_cq *cq;      /* workers' finished jobs (workq.c) */
    uint64_t adopted, adopt_dropped; /* at start, from the last run's pool */
    uint64_t start_ms;
    /* operations (main.c, metrics.c) */
    struct met_core met;
    struct metrics_http *http;
    int req_kind;           /* oneof field of the request being handled */
    int draining;           /* SIGTERM seen: only finishing work accepted */
    uint64_t drain_deadline; /* ms (kvtierd_clock): cancel what is left */
    uint64_t last_work_ms;   /* ms: the last request served, not refused */
};

uint64_t now_ms(void);
static inline uint64_t kvtierd_clock(const struct kvtierd *d)
{
    return now_ms() - d->start_ms;
}
/* Seconds since start: the index's access times. */
static inline uint32_t kvtierd_secs(const struct kvtierd *d)
{
    return (uint32_t)(kvtierd_clock(d) / 1000);
}

/* ns.c */
uint16_t ns_find(const struct ns_table *t, const char *name);
uint16_t ns_intern(struct ns_table *t, const char *name); /* NS_NONE: full */
void ns_free(struct ns_table *t);

/* lease.c */
struct lease *lease_new(struct kvtierd *d, uint32_t pipe, uint8_t kind,
                        uint32_t n);
struct lease *lease_find(struct kvtierd *d, uint64_t id);
/* Drop: unpin a read lease, free the pending chunks of a write lease. */
void lease_drop(struct kvtierd *d, struct lease *l);
/* Forget a committed write lease without touching its chunks. */
void lease_forget(struct kvtierd *d, struct lease *l);
void lease_expire(struct kvtierd *d, uint64_t now);
void lease_drop_pipe(struct kvtierd *d, uint32_t pipe);
void lease_drop_all(struct kvtierd *d);

/* store.c: policy over index + DRAM tier */
kvt_err store_reserve(struct kvtierd *d, uint16_t ns, const kvt_key *key,
                      uint64_t size, uint32_t *slot);
void store_commit(struct kvtierd *d, uint32_t slot, uint64_t csum,
                  uint32_t parent);
/* Remove a chunk (doom it if pinned). */
void store_delete(struct kvtierd *d, uint32_t slot);
/* Free a chunk's space and index slot now (must be unpinned). */
void store_free(struct kvtierd *d, uint32_t slot);
/* Evict up to max victims or until want_free bytes are free; returns bytes
 * freed. */
uint64_t store_evict(struct kvtierd *d, uint64_t want_free, uint32_t max);
/* Evict in slices while usage is above the high watermark. */
void store_watermark(struct kvtierd *d);
uint64_t store_used(const struct kvtierd *d);
void *store_ptr(const struct kvtierd *d, uint32_t slot);
uint64_t store_off(const struct kvtierd *d, uint32_t slot);
/* DRAM space for a chunk read back from NVMe (evicting as a reservation
 * does); the handle goes to idx_entry.blk. */
kvt_err store_alloc_dram(struct kvtierd *d, uint64_t size, uint32_t *blk);
/* Free only the DRAM copy of a chunk that has an NVMe copy. */
void store_drop_dram(struct kvtierd *d, uint32_t slot);
/* The request path (DESIGN §4): one walk over the tiers, in order. The
 * slot of a visible (READY) chunk named by a wire key, or IDX_NONE. */
uint32_t store_find(struct kvtierd *d, uint16_t ns, const ProtobufCBinaryData *key);
/* GET: the leading chunks found in the index (touched) go to slots[0..*n);
 * then the NVMe tier reads back those only on NVMe, then peers are asked
 * for the rest. 1: parked, answered later through handle_get_answer;
 * 0: answer now with slots[0..*n), all in DRAM. slots holds q->n_keys. */
int store_get_walk(struct kvtierd *d, uint32_t pipe, uint64_t req_id,
                   uint16_t ns, const Kvtier__Get *q, uint32_t *slots,
                   size_t *n);
/* LOOKUP: fills lr (tiers[] of q->n_keys entries, n_present) from the
 * index, starts NVMe reads of the present prefix when q->prefetch, counts
 * hits and misses, then asks peers for the keys missing here. 1: parked
 * (lr is then discarded); 0: answer now with lr. */
int store_lookup_walk(struct kvtierd *d, uint32_t pipe, uint64_t req_id,
                      uint16_t ns, const Kvtier__Lookup *q,
                      Kvtier__LookupResp *lr);
/* 1 if the chunk can be served from DRAM now. */
static inline int store_in_dram(const struct kvtierd *d, uint32_t slot)
{
    return (idx_at(&d->idx, slot)->tier & IDX_DRAM) != 0;
}

/* adopt.c: the DRAM journal and adopting a predecessor's pool. */
int adopt_open(struct kvtierd *d);
void adopt_close(struct kvtierd *d);
void adopt_added(struct kvtierd *d, uint32_t slot);   /* a DRAM copy is valid */
void adopt_removed(struct kvtierd *d, uint32_t slot); /* ... no longer */
void adopt_flush(struct kvtierd *d);
void adopt_tick(struct kvtierd *d);

/* pipes (handlers.c) */
void pipe_added(struct kvtierd *d, uint32_t pipe);
void pipe_removed(struct kvtierd *d, uint32_t pipe);
int pipe_alive(const struct kvtierd *d, uint32_t pipe);

/* handlers.c: one request in, one response out (caller frees both). */
void handle_request(struct kvtierd *d, uint32_t pipe, const uint8_t *buf,
                    size_t len, Kvtier__Response *rsp, void **scratch);
void handle_response_free(Kvtier__Response *rsp, void *scratch);
/* The answer of a parked GET (the NVMe and peer tiers answer late through
 * it), built as do_get builds one: slots[0..n) are its leading chunks now
 * in DRAM. rsp is initialised here; free it with
 * handle_response_free(rsp, *scratch). */
void handle_get_answer(struct kvtierd *d, uint32_t pipe, uint64_t req_id,
                       uint16_t ns, int inline_, uint32_t n_keys,
                       const uint32_t *slots, size_t n, Kvtier__Response *rsp,
                       void **scratch);

#endif
