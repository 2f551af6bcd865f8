/*
 * park.h -- a request answered later (see park.c).
 *
 * Ownership: a park is created by park_defer inside a handler and owned by
 * this file from then on; the module that parked it keeps the pointer and
 * may use it until exactly one of these happens, after which it is freed:
 *   - the module answers it (park_answer);
 *   - its connection closes: ops->gone(ctx, owner) runs, and the module must
 *     forget the pointer there (not answer it);
 *   - the daemon stops: park_close calls ops->gone for what is left.
 * ops->due runs when the deadline set with park_set_deadline passes; it
 * must answer the park or set a later deadline. Core thread only.
 */
#ifndef KVT_PARK_H
#define KVT_PARK_H

#include <stdint.h>

#include "kvtier.pb-c.h"
#include "tier_host.h" /* struct park_ops: tiers park through their host */

struct local_srv;
struct park;
struct park_table;
struct server;

/* What the table needs, handed over once: the transports it answers
 * through (they outlive the table) and how many nng contexts parked
 * requests may hold. Each park's callbacks get the ctx it was parked
 * with (struct park_ops, tier_host.h). */
struct park_env {
    struct server *srv;
    struct local_srv *local; /* NULL: no fast channel */
    uint32_t nng_cap;
};

/* Start the table of parked requests. 0, or -1. */
int park_open(const struct park_env *env, struct park_table **out);
/* Every park still there is dropped (ops->gone), then the table goes.
 * Before the transports close. Accepts NULL. */
void park_close(struct park_table *t);

/* The modules that park (the NVMe and peer tiers through their host,
 * KvWait) call these three. */

/* Inside the handler of pipe's request: park it. NULL when it cannot be
 * parked now (no table, not inside a handler, or the nng contexts that
 * parked requests may hold -- half of them, for every module together --
 * are all held): answer it now. */
struct park *park_defer(struct park_table *t, uint32_t pipe, uint64_t req_id,
                        const struct park_ops *ops, void *ctx, void *owner);
/* ms on kvtierd_clock; 0: none. */
void park_set_deadline(struct park *p, uint64_t deadline);
/* Send rsp (the caller's; NULL sends nothing) and free p. */
void park_answer(struct park_table *t, struct park *p, const Kvtier__Response *rsp);

uint32_t park_pipe(const struct park *p);
uint64_t park_req_id(const struct park *p);

/* pipe closed: every park of it is dropped (ops->gone), none answered.
 * Accepts NULL. */
void park_pipe_gone(struct park_table *t, uint32_t pipe);
/* ms from now (kvtierd_clock) until the earliest deadline (for
 * epoll_wait), or -1 for none. Accepts NULL. */
int park_wait_ms(const struct park_table *t, uint64_t now);
/* Run ops->due of every park whose deadline is at or before now. Accepts
 * NULL. */
void park_run_due(struct park_table *t, uint64_t now);
/* Parked requests now, and those holding nng contexts. */
uint32_t park_count(const struct park_table *t, uint32_t *n_nng);
/* Parked requests of one connection. Accepts NULL. */
uint32_t park_count_pipe(const struct park_table *t, uint32_t pipe);

#endif
