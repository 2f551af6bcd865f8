/*
 * nvstore.h -- the NVMe tier's policy: demotion, promotion, NVMe
 * eviction, the index at start, FLUSH and VERIFY.
 *
 * Design (DESIGN §4, §6, §7): the tier (tiers/nvme/nvme.h) stores records; this
 * module decides which chunk goes down, which comes back up and which is
 * dropped, and keeps the RocksDB index (nvindex.h) in step. Everything
 * runs on the core thread; the only other threads are the index writer
 * and one checksum worker, which hands results back through the ring's
 * eventfd, so the core loop watches one fd for the whole tier (nvs_fd).
 *
 *  - Write-back (default): when DRAM passes its high watermark, its
 *    coldest leaves go down: a chunk already on NVMe just loses its DRAM
 *    copy; a chunk that is not is written first and its DRAM copy freed
 *    once the write completed. Write-through: every commit is also queued
 *    for writing and keeps its DRAM copy. Either way the index entry is
 *    written only after the record's write completed.
 *  - A reservation that must make room at once takes clean DRAM copies
 *    first and drops a dirty chunk only when none is near the cold end
 *    (counted as lost_dirty); a full or failing NVMe never costs a DRAM
 *    chunk: the chunk simply stays in DRAM.
 *  - NVMe has its own watermarks; its victims are its leaves (index.h).
 *  - GET of chunks only on NVMe reserves DRAM, reads, verifies the
 *    checksum on the worker, then answers; the request is parked
 *    (park.c) until then or until its deadline, when
 *    it is answered with what is in DRAM. A checksum mismatch is a miss, a
 *    counter, and the record is dropped; a read error is a miss and a
 *    counter. LOOKUP's prefetch flag starts the same reads without
 *    waiting.
 *  - At start the index is read back and each file's allocator rebuilt
 *    from it before the daemon reports ready; records the index does not
 *    name are free space. An index that is missing, damaged or incomplete
 *    is rebuilt by scanning the record headers (with a log line).
 */
#ifndef KVT_NVSTORE_H
#define KVT_NVSTORE_H

#include <stddef.h>
#include <stdint.h>

#include "kvtier.pb-c.h"
#include "tier_host.h"

struct nvs;
struct tier;
struct req;

#define NVS_STR_MAX 512

/* The tier's configuration ([nvme] keys; the DRAM watermarks), filled by
 * the core at start and again when SIGHUP reloads the reloadable ones. */
struct nvs_conf {
    char nvme_dirs[NVS_STR_MAX];       /* resolved by the configuration */
    char nvme_index_path[NVS_STR_MAX];
    uint64_t nvme_bytes, nvme_file_bytes, nvme_queue_depth;
    uint64_t nvme_register_buffers, nvme_write_through, nvme_fsync;
    uint64_t nvme_get_deadline_ms;
    double nvme_high_watermark, nvme_low_watermark;
};

/* The tier's context: what it is built with, and its state. The core
 * owns one (zeroed, host and cfg filled) and passes it to every call. */
struct nvs_ctx {
    const struct tier_host *host;
    struct nvs_conf cfg;
    struct idx *idx;    /* host->idx */
    struct dram *dram;  /* host->dram */
    struct wq_cq *cq;   /* host->cq */
    struct nvs *nvs;    /* the tier, or NULL without one (nvs_open) */
};

/* Index slots the NVMe tier may need on top of DRAM's (0 without it). */
uint64_t nvs_index_slots(const struct nvs_conf *c);
/* Open the tier and its index and load the index into d->idx. Does
 * nothing without nvme_bytes. 0, or -1 (logged). */
int nvs_open(struct nvs_ctx *d);
/* The tier behind tier.h (the walk, read/write of chunks, usage); NULL
 * without an NVMe tier. */
struct tier *nvs_tier(const struct nvs_ctx *d);
/* The fd the core loop polls (-1 without an NVMe tier), and its handler. */
int nvs_fd(const struct nvs_ctx *d);
void nvs_poll(struct nvs_ctx *d);
/* Every core tick: NVMe watermark, queued writes. */
void nvs_tick(struct nvs_ctx *d);
/* Shutdown, first step (transports still open): finish I/O, answer every
 * parked request. */
void nvs_quiesce(struct nvs_ctx *d);
/* Last step (after leases are dropped): write the index out, close. */
void nvs_close(struct nvs_ctx *d);

/* ---- handlers.c (requests the tier answers itself) */
void nvs_do_flush(struct req *r, struct nvs_ctx *d, uint32_t pipe,
                  const Kvtier__Flush *q, Kvtier__Response *rsp);
void nvs_do_verify(struct req *r, struct nvs_ctx *d, uint32_t pipe,
                   const Kvtier__Verify *q, Kvtier__Response *rsp);
/* STATS: s->tiers[1] (the NVMe row; s->tiers holds 2) and s->nvme. */
void nvs_fill_stats(struct req *r, struct nvs_ctx *d, Kvtier__StatsResp *s);

/* ---- metrics.c: the tier's counters, read on the core thread. */
struct nvs_stats {
    uint64_t demotions, demoted_bytes, promotions, promoted_bytes;
    uint64_t csum_failures, read_errors, write_errors, enospc, lost_dirty;
    uint64_t get_waits, get_timeouts, loaded, rebuilt, scrubbed, scrub_bad;
    uint64_t evictions;  /* NVMe copies dropped to make room */
};
/* The counters; NULL without an NVMe tier. Valid until nvs_close. */
const struct nvs_stats *nvs_stats(const struct nvs_ctx *d);
/* Index batches not written (nvindex.h); 0 without an NVMe tier. */
uint64_t nvs_index_errors(const struct nvs_ctx *d);

#endif
