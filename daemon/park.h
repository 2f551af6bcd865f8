/*
 * park.h -- a request answered later (see park.c).
 *
 * Ownership: a park is created by park_defer inside a handler and owned by
 * this file from then on; the module that parked it keeps the pointer and
 * may use it until exactly one of these happens, after which it is freed:
 *   - the module answers it (park_answer);
 *   - its connection closes: ops->gone(d, owner) runs, and the module must
 *     forget the pointer there (not answer it);
 *   - the daemon stops: park_close calls ops->gone for what is left.
 * ops->due runs when the deadline set with park_set_deadline passes; it
 * must answer the park or set a later deadline. Core thread only.
 */
#ifndef KVT_PARK_H
#define KVT_PARK_H

#include <stdint.h>

#include "kvtier.pb-c.h"

struct kvtierd;
struct local_srv;
struct park;
struct park_table;
struct server;

struct park_ops {
    /* The client went away (or the daemon stops): let go of what the
     * request holds. The park is freed when this returns. */
    void (*gone)(struct kvtierd *d, void *owner);
    /* The deadline passed: answer (park_answer) or set a new deadline. */
    void (*due)(struct kvtierd *d, void *owner);
};

/* What the table needs, handed over once: the transports it answers
 * through (they outlive the table), how many nng contexts parked requests
 * may hold, and the daemon, passed on to ops (never read here). */
struct park_env {
    struct server *srv;
    struct local_srv *local; /* NULL: no fast channel */
    uint32_t nng_cap;
    struct kvtierd *d;
};

/* Start the table of parked requests. 0, or -1. */
int park_open(const struct park_env *env, struct park_table **out);
/* Every park still there is dropped (ops->gone), then the table goes.
 * Before the transports close. Accepts NULL. */
void park_close(struct park_table *t);

/* The modules that park (the NVMe and peer tiers, KvWait) call these
 * three with the daemon; only its table (d->park) is used. */

/* Inside the handler of pipe's request: park it. NULL when it cannot be
 * parked now (no table, not inside a handler, or the nng contexts that
 * parked requests may hold -- half of them, for every module together --
 * are all held): answer it now. */
struct park *park_defer(struct kvtierd *d, uint32_t pipe, uint64_t req_id,
                        const struct park_ops *ops, void *owner);
/* ms on kvtierd_clock; 0: none. */
void park_set_deadline(struct kvtierd *d, struct park *p, uint64_t deadline);
/* Send rsp (the caller's; NULL sends nothing) and free p. */
void park_answer(struct kvtierd *d, struct park *p, const Kvtier__Response *rsp);

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
