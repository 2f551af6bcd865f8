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

struct kvtierd;
struct park;

/* Start the table of parked requests (d->park). 0, or -1. */
int park_open(struct kvtierd *d);
/* Every park still there is dropped (ops->gone), then the table goes.
 * Before the transports close. Accepts a daemon with no table. */
void park_close(struct kvtierd *d);

/* Inside the handler of pipe's request: park it. NULL when it cannot be
 * parked now (no table, not inside a handler, or the nng contexts that
 * parked requests may hold -- half of them, for every module together --
 * are all held): answer it now. */
struct park *park_defer(struct kvtierd *d, uint32_t pipe, uint64_t req_id,
                        const struct park_ops *ops, void *ctx, void *owner);
/* ms on kvtierd_clock; 0: none. */
void park_set_deadline(struct kvtierd *d, struct park *p, uint64_t deadline);
uint32_t park_pipe(const struct park *p);
uint64_t park_req_id(const struct park *p);

/* Send rsp (the caller's; NULL sends nothing) and free p. */
void park_answer(struct kvtierd *d, struct park *p, const Kvtier__Response *rsp);

/* pipe closed: every park of it is dropped (ops->gone), none answered. */
void park_pipe_gone(struct kvtierd *d, uint32_t pipe);
/* ms until the earliest deadline (for epoll_wait), or -1 for none. */
int park_wait_ms(struct kvtierd *d);
/* Run ops->due of every park past its deadline. */
void park_run_due(struct kvtierd *d);
/* Parked requests now, and those holding nng contexts. */
uint32_t park_count(const struct kvtierd *d, uint32_t *n_nng);

#endif
