/*
 * simidx.h -- the global index's republish planner (tiers/peer/oplan.c)
 * and owner computation (owners.c) driven by the simulated cluster's view
 * changes (see simidx.c).
 *
 * Ownership: struct sidx is the caller's (sidx_new / sidx_free); it reads
 * the struct sim it was made for, which must outlive it.
 */
#ifndef KVT_SIMIDX_H
#define KVT_SIMIDX_H

#include <stdint.h>

#include "member.h"
#include "simnet.h"

struct sidx;

struct sidx_stats {
    uint64_t entries, msgs;      /* index entries sent to other nodes, and
                                    the batches (GX_BATCH each) carrying them */
    uint64_t changes;            /* membership changes (a restart is one) */
    uint64_t ideal;              /* keys whose owner set changed, or whose
                                    owner restarted, summed over changes */
    uint64_t lookups, resolved, timeouts; /* sampled LOOKUPs: found at a live
                                    owner; would wait for an owner's timeout */
};

/* Attach to s (every running node's view as now, its K keys published to
 * their owners): r owners per key, keys per node, failure_ms as
 * cluster.failure_timeout_ms (askers ask one more owner per change for
 * that long). */
struct sidx *sidx_new(struct sim *s, uint32_t r, uint32_t keys, uint32_t failure_ms);
void sidx_free(struct sidx *x);
/* Hooks, from simnet's on_change and on_life. */
void sidx_on_change(struct sidx *x, int observer, struct mb_member *m, enum mb_event ev,
                    enum mb_state old);
void sidx_on_life(struct sidx *x, int idx, int up);
/* Run the passes due by now (call every ~100 ms of virtual time). */
void sidx_step(struct sidx *x);
/* n LOOKUPs of random live keys from random running nodes, now. */
void sidx_sample(struct sidx *x, int n);
void sidx_stats(const struct sidx *x, struct sidx_stats *out);
void sidx_reset_stats(struct sidx *x);

#endif
