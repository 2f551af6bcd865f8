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

struct kvtierd;
struct tier;
struct kvt_config;
struct req;

/* Index slots the NVMe tier may need on top of DRAM's (0 without it). */
uint64_t nvs_index_slots(const struct kvt_config *c);
/* Open the tier and its index and load the index into d->idx. Does
 * nothing without nvme_bytes. 0, or -1 (logged). */
int nvs_open(struct kvtierd *d);
/* The fd the core loop polls (-1 without an NVMe tier), and its handler. */
int nvs_fd(const struct kvtierd *d);
void nvs_poll(struct kvtierd *d);
/* Every core tick: NVMe watermark, queued writes. */
void nvs_tick(struct kvtierd *d);
/* Shutdown, first step (transports still open): finish I/O, answer every
 * parked request. */
void nvs_quiesce(struct kvtierd *d);
/* Last step (after leases are dropped): write the index out, close. */
void nvs_close(struct kvtierd *d);

/* ---- store.c */
int nvs_active(const struct kvtierd *d);
/* A chunk was committed to DRAM (write-through queues it). */
void nvs_committed(struct kvtierd *d, uint32_t slot);
/* Start writing a dirty DRAM leaf, its DRAM copy to be freed once
 * written. 1 if started, 0 if the tier cannot take it now. */
int nvs_demote(struct kvtierd *d, uint32_t slot);
/* Free the NVMe side of a chunk whose slot is being freed. */
void nvs_release(struct kvtierd *d, uint32_t slot);
/* DRAM bytes that writes in flight will free. */
uint64_t nvs_demoting_bytes(const struct kvtierd *d);

/* ---- store.c's walk (store_get_walk, store_lookup_walk) */
/* slots[0..*n) are the leading present chunks of a GET. Starts reads of
 * those only on NVMe; returns 1 if the request was parked (answered later
 * through handle_get_answer), else 0 with *n cut to the leading chunks in
 * DRAM now. */
int nvs_get(struct kvtierd *d, uint32_t pipe, uint64_t req_id, uint16_t ns,
            int inline_, uint32_t n_keys, const uint32_t *slots, size_t *n);
/* LOOKUP's prefetch: start reads of the chunks only on NVMe. */
void nvs_prefetch(struct kvtierd *d, const uint32_t *slots, size_t n);

/* ---- handlers.c */
void nvs_do_flush(struct req *r, struct kvtierd *d, uint32_t pipe,
                  const Kvtier__Flush *q, Kvtier__Response *rsp);
void nvs_do_verify(struct req *r, struct kvtierd *d, uint32_t pipe,
                   const Kvtier__Verify *q, Kvtier__Response *rsp);
void nvs_fill_stats(struct req *r, struct kvtierd *d, Kvtier__StatsResp *s);

/* ---- metrics.c: the tier's counters, read on the core thread. */
struct nvs_stats {
    uint64_t demotions, demoted_bytes, promotions, promoted_bytes;
    uint64_t csum_failures, read_errors, write_errors, enospc, lost_dirty;
    uint64_t get_waits, get_timeouts, loaded, rebuilt, scrubbed, scrub_bad;
    uint64_t evictions;  /* NVMe copies dropped to make room */
};
/* The counters; NULL without an NVMe tier. Valid until nvs_close. */
const struct nvs_stats *nvs_stats(const struct kvtierd *d);
/* The tier behind tier.h (usage, ops); NULL without an NVMe tier. */
struct tier *nvs_tier(const struct kvtierd *d);
/* Index batches not written (nvindex.h); 0 without an NVMe tier. */
uint64_t nvs_index_errors(const struct kvtierd *d);
/* store.c: a dirty DRAM chunk was dropped before it could be written. */
void nvs_count_lost_dirty(struct kvtierd *d);

#endif
