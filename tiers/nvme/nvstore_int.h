/*
 * nvstore_int.h -- what the NVMe policy's files share (nvstore.c: open,
 * load, close, stats; nvio.c: writes, reads, the checksum worker, NVMe
 * eviction; nvpark.c: parked GET / FLUSH / VERIFY). Core thread only
 * (the checksum worker is a workq.c queue).
 */
#ifndef KVT_NVSTORE_INT_H
#define KVT_NVSTORE_INT_H

#include <pthread.h>
#include <stdint.h>

#include "handlers.h" /* req_alloc, req_fail */
#include "kvtierd.h"
#include "nvindex.h"
#include "nvme.h"
#include "nvstore.h"
#include "workq.h"

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

/* A checksum for the worker (workq.h); done runs on the core thread. */
struct nvs_job {
    struct wq_csum c; /* first: the wq_job is the nvs_job */
    struct kvtierd *d;
    void (*done)(struct kvtierd *d, struct nvs_job *j);
    void *ctx;
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
    struct workq *csq;       /* checksums of what is read back */
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
/* Check p[0..n) against want on the worker; done(d, j) gets j->c.ok. */
void nvs_check(struct kvtierd *d, struct nvs_job *j, const void *p, uint64_t n,
               uint64_t want, void (*done)(struct kvtierd *d, struct nvs_job *j),
               void *ctx);
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
