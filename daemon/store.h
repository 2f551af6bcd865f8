/*
 * store.h -- placement over the index and the DRAM tier, eviction, and
 * the walk over the tiers of GET and LOOKUP (see store.c).
 *
 * Core thread only. Slots are index slots (index.h); a slot handed back
 * by store_reserve is PENDING until store_commit or store_free.
 */
#ifndef KVT_STORE_H
#define KVT_STORE_H

#include <stdint.h>

#include "index.h"
#include "kvtier.h"
#include "kvtier.pb-c.h"
#include "kvtierd.h"

kvt_err store_reserve(struct kvtierd *d, uint16_t ns, const kvt_key *key,
                      uint64_t size, uint32_t *slot);
void store_commit(struct kvtierd *d, uint32_t slot, uint64_t csum,
                  uint32_t parent);
/* Remove a chunk (doom it if pinned). */
void store_delete(struct kvtierd *d, uint32_t slot);
/* Free a chunk's space and index slot now (must be unpinned). */
void store_free(struct kvtierd *d, uint32_t slot);
/* Evict up to max victims per pool or until want_free bytes (at most the
 * pool's size; 0: down to the low watermark) are free in each pool;
 * returns bytes freed. */
uint64_t store_evict(struct kvtierd *d, uint64_t want_free, uint32_t max);
/* Evict in slices while usage is above the high watermark. */
void store_watermark(struct kvtierd *d);
uint64_t store_used(const struct kvtierd *d);
void *store_ptr(const struct kvtierd *d, uint32_t slot);
uint64_t store_off(const struct kvtierd *d, uint32_t slot);
/* DRAM space for a chunk of namespace ns read back from NVMe, in its
 * pool (evicting as a reservation does); the handle goes to
 * idx_entry.blk. */
kvt_err store_alloc_dram(struct kvtierd *d, uint16_t ns, uint64_t size, uint32_t *blk);
/* The DRAM pool a chunk's DRAM copy lies in (dram.h). */
uint32_t store_pool(const struct kvtierd *d, uint32_t slot);
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

#endif
