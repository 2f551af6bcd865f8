/*
 * nvstore_int.h -- what the NVMe policy's files share (nvstore.c: open,
 * load, close, stats; nvio.c: writes, reads, the checksum worker, NVMe
 * eviction; nvpark.c: parked GET / FLUSH / VERIFY). Core thread only,
 * except struct nvs_worker's queues (its own mutex).
 */
#ifndef KVT_NVSTORE_INT_H
#define KVT_NVSTORE_INT_H

#include <pthread.h>
#include <stdint.h>

#include "kvcache.h" /* req_alloc, req_fail */
#include "kvtierd.h"
#include "nvindex.h"
#include "nvme.h"
#include "nvstore.h"

/* A write waiting for the device (write-through, FLUSH). */
struct nvs_wq_item {
    uint32_t slot, gen;
    struct nvs_flush *f; /* or NULL */
};

/* A FLUSH in progress: answered once pending reaches 0. */
struct nvs_flush {
    uint64_t pending, written, failed, bytes, clean;
    int evict;
    struct nvs_park *park; /* NULL once answered or its client left */
};

/* A checksum job for the worker, and its result. */
struct nvs_job {
    const uint8_t *p;
    uint64_t n, want;
    int ok;
    void (*done)(struct kvtierd *d, struct nvs_job *j);
    void *ctx;
    struct nvs_job *next;
};

struct nvs_worker {
    pthread_t thr;
    int started, stop, efd;
    pthread_mutex_t mtx; /* guards todo, done, stop */
    pthread_cond_t cv;
    struct nvs_job *todo, *todo_tail, *done;
};

enum park_kind { PARK_GET = 1, PARK_FLUSH, PARK_VERIFY };

/* A request answered later. */
struct nvs_park {
    enum park_kind kind;
    struct park *park;   /* park.c: connection, request id, deadline */
    /* GET */
    uint16_t ns;
    int inline_;
    uint32_t n_keys, n;
    uint32_t *slot, *gen;
    uint8_t *st;         /* per chunk: PS_* */
    /* FLUSH / VERIFY */
    struct nvs_flush *flush;
    struct nvs_park *next;
};

/* A VERIFY scrub in progress (one at a time). */
struct nvs_scrub {
    uint32_t cursor;     /* next slot to look at */
    uint32_t inflight, max_records, started;
    int holding;         /* inside the VERIFY handler: never answer */
    uint64_t checked, bad, bytes, read_errors;
    struct nvs_park *park;
};

struct nvs_stats {
    uint64_t demotions, demoted_bytes, promotions, promoted_bytes;
    uint64_t csum_failures, read_errors, write_errors, enospc, lost_dirty;
    uint64_t get_waits, get_timeouts, loaded, rebuilt, scrubbed, scrub_bad;
    uint64_t evictions;  /* NVMe copies dropped to make room */
};

struct nvs {
    struct nvme *tier;
    struct nvx *index;
    uint64_t seq;
    struct nvs_wq_item *wq;  /* ring buffer */
    uint32_t wq_head, wq_n, wq_cap;
    uint32_t writes, reads;  /* in flight */
    uint32_t max_writes;
    uint64_t demoting;       /* DRAM bytes writes in flight will free */
    uint64_t full_until;     /* kvtierd_clock ms: no space, do not try */
    int full_logged;
    struct nvs_worker w;
    int ep;                  /* epoll over the ring's eventfd */
    struct nvs_park *parks;
    struct nvs_scrub *scrub;
    int closing;             /* shutdown: start no new reads */
    struct nvs_stats st;
};

static inline struct nvs *nvs_of(const struct kvtierd *d)
{
    return d->nvs;
}

/* nvio.c */
int nvs_worker_start(struct kvtierd *d);
void nvs_worker_stop(struct kvtierd *d);
void nvs_worker_submit(struct kvtierd *d, struct nvs_job *j);
void nvs_worker_collect(struct kvtierd *d);
void nvs_pump(struct kvtierd *d);
int nvs_promote(struct kvtierd *d, uint32_t slot);
int nvs_enqueue_write(struct kvtierd *d, uint32_t slot, struct nvs_flush *f);
void nvs_drop_record(struct kvtierd *d, uint32_t slot);
void nvs_nv_watermark(struct kvtierd *d);
struct tier_loc nvs_loc_of(const struct kvtierd *d, uint32_t slot);
void nvs_fill_rec(const struct kvtierd *d, uint32_t slot, struct nvx_rec *r);

/* nvpark.c */
void nvs_park_notify(struct kvtierd *d);
void nvs_flush_progress(struct kvtierd *d, struct nvs_flush *f);
void nvs_park_quiesce(struct kvtierd *d);
void nvs_scrub_tick(struct kvtierd *d);

#endif
