/*
 * kvhbm.h -- the HBM tier's policy: which DRAM chunks have a copy in GPU
 * memory, and which copy goes for room (see kvhbm.c). Core thread only.
 */
#ifndef KVT_KVHBM_H
#define KVT_KVHBM_H

#include <stdint.h>

#include "kvcache.h"

/* A copy for DRAM chunk (slot, gen), or NULL if there is no HBM tier or
 * no room even after dropping copies. */
struct kvc_hent *kvh_reserve(struct kvc *k, uint32_t slot, uint32_t gen,
                             uint64_t bytes);
/* A filled copy becomes findable (and replaces a stale one of the slot). */
void kvh_commit(struct kvc *k, struct kvc_hent *h);
/* The valid copy of slot usable from device, or NULL (stale ones go). */
struct kvc_hent *kvh_find(struct kvc *k, uint32_t slot, int device);
void kvh_drop(struct kvc *k, struct kvc_hent *h);
void kvh_close(struct kvc *k);

#endif
