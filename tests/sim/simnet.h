/*
 * simnet.h -- a deterministic discrete-event network for membership code
 * (see simnet.c). Runs any struct mb_ops backend (the real swim.c) on
 * many simulated nodes in one thread with a virtual clock.
 *
 * Ownership: struct sim owns its nodes, their struct mb and every message
 * in flight; sim_free() releases all of it.
 */
#ifndef KVT_SIMNET_H
#define KVT_SIMNET_H

#include <stddef.h>
#include <stdint.h>

#include "member.h"

struct sim;

struct sim_cfg {
    uint64_t seed;
    uint32_t lat_us, jitter_us;  /* one-way latency of every link */
    double loss;                 /* drop probability of every link */
    int charge_cpu;              /* measure handler CPU time and keep the node
                                    busy for as long (breaks determinism) */
    uint32_t inbox_max;          /* receive queue bound while busy/paused */
    const struct mb_ops *ops;
    struct mb_config mbc;        /* template: ids, addresses, env, callback
                                    are filled per node */
    /* Called after simnet's own bookkeeping for every change (may be NULL). */
    void (*on_change)(void *arg, int observer, struct mb_member *m, enum mb_event ev,
                      enum mb_state old);
    /* Called when node idx starts (up = 1, before it joins) or stops (0);
     * may be NULL. Gets on_change_arg. */
    void (*on_life)(void *arg, int idx, int up);
    void *on_change_arg;
};

/* What a run measured since the last sim_reset_stats(). */
struct sim_stats {
    uint64_t false_deaths;        /* DEAD about a member that was running */
    uint64_t false_deaths_by_paused; /* ... declared by a node paused in the
                                        last 30 s (or of a paused node: see
                                        deaths_of_paused) */
    uint64_t deaths_of_paused;    /* DEAD about a node that was paused */
    uint64_t deaths_partitioned;  /* DEAD about a node across a partition,
                                     or across a healed one about the
                                     incarnation it had at the heal */
    uint64_t left_as_dead;        /* DEAD about a node that had left */
    uint64_t detections;          /* (observer, crashed node) DEAD events */
    uint64_t crashes, crashes_detected; /* crashes; those some node detected */
    double detect_first_p50, detect_first_p99; /* ms, first observer */
    double detect_all_p50, detect_all_p99;     /* ms, every observer */
    uint64_t msgs_tx[MB_NMSGS], bytes_tx[MB_NMSGS];
    uint64_t msgs_dropped, inbox_dropped;
    uint64_t cpu_ns;              /* handler CPU over all nodes (charge_cpu);
                                     else the whole process's CPU time, the
                                     simulator's own work included */
    uint64_t suspicions, refutations;
    uint64_t node_seconds_us;     /* sum over nodes of time up, in us */
};

/* Messages the simulator holds (in flight or in inboxes), now and at the
 * peak since sim_new(). */
struct sim_mem {
    uint64_t msgs, bytes, peak_msgs, peak_bytes;
};

struct sim *sim_new(const struct sim_cfg *cfg);
void sim_free(struct sim *s);

/* Start a node (new index, or idx >= 0 to restart a crashed one with a new
 * incarnation) joining through `seed` (-1: no seed). The node's index. */
int sim_start(struct sim *s, int idx, int seed);
void sim_crash(struct sim *s, int idx);
void sim_leave(struct sim *s, int idx);
void sim_pause(struct sim *s, int idx, uint32_t ms);
/* Nodes with group[i] != group[j] cannot talk while on. Turning it off
 * heals it: deaths across the old line of the incarnations held then still
 * count as the partition's (sim_stats.deaths_partitioned). */
void sim_partition(struct sim *s, const int *group, int on);
/* Extra latency and loss on the one link from -> to (asymmetric). */
void sim_slow_link(struct sim *s, int from, int to, uint32_t extra_us, double loss);

/* Run events until virtual time t_us (absolute). */
void sim_run_until(struct sim *s, uint64_t t_us);
uint64_t sim_now(const struct sim *s);       /* us */

size_t sim_nodes(const struct sim *s);
int sim_up(const struct sim *s, int idx);
struct mb *sim_mb(const struct sim *s, int idx);
/* Pairs (i up, j != i) where i's view (alive/suspect vs not) differs from
 * the truth (j running or not): 0 = converged. */
int64_t sim_disagree(const struct sim *s);
/* Virtual time disagree last became 0 (0: never, or not now). */
uint64_t sim_converged_at(const struct sim *s);
/* Counters, and the mb counters of running nodes summed. */
void sim_stats(struct sim *s, struct sim_stats *out);
void sim_reset_stats(struct sim *s);
uint64_t sim_rand(struct sim *s);
const struct sim_mem *sim_mem(const struct sim *s);
/* Up to max (observer, node) pairs whose view differs from the truth
 * (those sim_disagree counts); how many were stored. O(N^2). */
size_t sim_diff(const struct sim *s, int *obs, int *node, size_t max);

#endif
