/*
 * metrics.h -- what kvtierd counts for operators, and its Prometheus text.
 *
 * Design: every counter lives in core-thread state (struct counters, struct
 * met_core and the modules' own) and is bumped by the core thread alone, with
 * no lock and no atomic (DESIGN §6). Counting is a few adds per request and
 * never logs or allocates. metrics_render() turns that state into the
 * Prometheus text exposition format (version 0.0.4); it runs on the core
 * thread too, when a scrape arrives (metrics_http.c explains the hand-off),
 * so a scrape always sees one consistent instant and nothing is copied
 * between scrapes.
 *
 * Everything is a counter or a gauge of sums: a hit ratio is computed by
 * the reader as sum(hits) / sum(hits + misses), never stored. Hits are
 * counted per chunk and per byte; token weighting is chunks x chunk_tokens,
 * which only the engine knows (the daemon never sees a token), so it is not
 * exposed. A miss has no size (the bytes were never here), so misses are
 * counted per chunk only.
 *
 * Context: metrics report on nearly every part of the daemon, so
 * metrics_render takes a struct met_src of those parts -- the counters,
 * the index, namespaces, leases, the tiers, the GPU data path, events --
 * gathered by main.c at each scrape; never the daemon itself.
 */
#ifndef KVT_METRICS_H
#define KVT_METRICS_H

#include <stddef.h>
#include <stdint.h>

#include "kvtier.h"

/* Who asked whether chunks are here: a lookup (changes nothing) or a get
 * (pins and serves). Counted apart so a lookup-then-get engine does not
 * count one prompt twice in one series. */
enum hit_op { HIT_LOOKUP = 0, HIT_GET = 1, HIT_OPS };

/* Request kinds are the field numbers of the Request oneof (proto/); kind 0
 * is a request that did not decode. Numbers at or above MET_KINDS share the
 * last slot. */
#define MET_KINDS 64
/* Latency buckets (upper bounds, seconds), plus +Inf. */
#define MET_BUCKETS 17

struct met_hist {
    uint64_t bucket[MET_BUCKETS + 1]; /* per bucket, not cumulative; last = +Inf */
    uint64_t sum_ns, count;
};

struct met_core {
    struct met_hist req[MET_KINDS];
    uint64_t errors[KVT_ERR_COUNT];   /* responses by kvt_err */
    uint64_t unknown_ns_misses[HIT_OPS]; /* misses in never-seen namespaces */
    uint64_t reloads_ok, reloads_failed;
    uint64_t leases_cancelled;        /* dropped by shutdown's deadline */
};

/* The daemon's request counters (the core thread's). */
struct counters {
    uint64_t hits, misses, puts, evictions, bytes_in, bytes_out;
    uint64_t errors, expired_leases, requests;
};

struct cl_ctx;
struct dram;
struct ev;
struct idx;
struct kvc;
struct kvt_config;
struct lease_table;
struct local_srv;
struct ns_table;
struct nvs_ctx;
struct tier;

/* What a scrape reads: pointers valid for the call, NULL where a part is
 * off (nvme, kvc, ev, local). */
struct met_src {
    const struct kvt_config *cfg;
    const struct met_core *met;
    const struct counters *st;
    const struct ns_table *ns;
    const struct idx *idx;
    const struct lease_table *leases;
    struct dram *dram;
    const char *const *pool_names; /* [dram->n_seg]: "default", then the
                                      tenants' own pools (NULL: unnamed) */
    const struct kvc *kvc;      /* the GPU data path and its HBM tier */
    struct tier *nvme;          /* the NVMe tier (usage), with ... */
    struct nvs_ctx *nvx;        /* ... its context (stats) */
    struct cl_ctx *clx;         /* the peer tier (zeros without a cluster) */
    struct ev *ev;
    struct local_srv *local;
    uint64_t uptime_ms;
    uint64_t adopted;           /* DRAM chunks adopted at start */
    uint32_t n_pipes;           /* client connections */
    int draining;
};

/* Record one served request: its kind, its kvt_err, and the core thread's
 * time on it (decode, handle, encode). */
void metrics_request(struct met_core *m, int kind, int err,
                     uint64_t elapsed_ns);

/* Record the outcome of a lookup or get in namespace ns (NS_NONE: a
 * namespace the daemon has never stored into). */
void metrics_hits(struct ns_table *t, struct met_core *m, uint16_t ns, enum hit_op op,
                  uint64_t hit_chunks, uint64_t miss_chunks,
                  uint64_t hit_bytes);

/* Render every series; returns a malloc'd buffer of *len bytes (not NUL
 * terminated) that the caller frees. Core thread only. */
char *metrics_render(const struct met_src *d, size_t *len);

/* Monotonic nanoseconds, for request timing. */
uint64_t metrics_now_ns(void);

#endif
