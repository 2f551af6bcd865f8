/*
 * park.c -- the one way a request is answered later.
 *
 * Design (STYLE §15): a GET waiting on NVMe reads or a peer's bytes, a
 * LOOKUP waiting on the owners of keys missing here, a FLUSH, a VERIFY, a
 * KvWait -- each is parked here and answered once. A park holds the link
 * to the request's transport (an nng context, or a fast-channel
 * connection that is not read meanwhile), its connection id, its
 * deadline, and the callbacks of the module that parked it. Whatever
 * parks, three invariants hold for every module alike:
 *   - a park is answered or dropped exactly once, then freed here;
 *   - when a connection closes (pipe_removed, for nng and the fast channel
 *     alike) every park of it is dropped before anything else can answer
 *     it, and its module hears it through ops->gone: a late answer can
 *     never reach a closed connection;
 *   - parked requests hold at most half of the nng contexts, all modules
 *     together, so the other half keeps serving (the fast channel has no
 *     such limit: a parked connection only stops being read);
 *   - one connection holds at most daemon.park_per_client parks: past it
 *     handlers.c refuses a request that may park (KVT_EBUSY) before it
 *     runs, so one client with many nng contexts cannot take the share
 *     every other client parks in.
 * Deadlines are kept here too: the core loop sleeps at most until the
 * earliest one (park_wait_ms) and then runs ops->due (park_run_due).
 * The table is a plain list: parks are few (bounded by the contexts and
 * by the connections, one each), and each is touched O(1) times per
 * event. The table holds what it answers through (struct park_env), and
 * every call takes the table, never the daemon. Core thread only.
 */
#include "park.h"

#include <stdlib.h>

#include "local.h"
#include "server.h"
#include "wire.h"

struct park {
    uint32_t pipe;
    uint64_t req_id, deadline;
    void *later; /* server_later or local_later, by pipe */
    const struct park_ops *ops;
    void *ctx, *owner;
    struct park *prev, *next;
};

struct park_table {
    struct park_env env;
    struct park *head;
    uint32_t n, n_nng;
};

static int is_local(uint32_t pipe)
{
    return pipe >= LOCAL_ID_BASE;
}

int park_open(const struct park_env *env, struct park_table **out)
{
    struct park_table *t = calloc(1, sizeof *t);
    if (!t) return -1;
    t->env = *env;
    *out = t;
    return 0;
}

static void unlink_park(struct park_table *t, struct park *p)
{
    if (p->prev) p->prev->next = p->next;
    else t->head = p->next;
    if (p->next) p->next->prev = p->prev;
    t->n--;
    t->n_nng -= !is_local(p->pipe);
}

/* Unlink, let the module let go, then release the transport's hold. */
static void drop(struct park_table *t, struct park *p, int conn_open)
{
    unlink_park(t, p);
    p->ops->gone(p->ctx, p->owner);
    if (!is_local(p->pipe)) /* the context serves again */
        server_reply_later(t->env.srv, p->later, NULL);
    else if (conn_open)
        local_reply_later(t->env.local, p->later, NULL);
    free(p);
}

void park_close(struct park_table *t)
{
    if (!t) return;
    while (t->head) drop(t, t->head, 1);
    free(t);
}

static void *defer_transport(struct park_table *t, uint32_t pipe)
{
    if (is_local(pipe)) return local_defer(t->env.local);
    uint32_t cap = t->env.nng_cap;
    if (t->n_nng >= (cap ? cap : 1)) return NULL;
    return server_defer(t->env.srv);
}

struct park *park_defer(struct park_table *t, uint32_t pipe, uint64_t req_id,
                        const struct park_ops *ops, void *ctx, void *owner)
{
    if (!t) return NULL;
    void *later = defer_transport(t, pipe);
    if (!later) return NULL;
    struct park *p = calloc(1, sizeof *p);
    if (!p) abort(); /* control-plane allocation */
    *p = (struct park){pipe, req_id, 0, later, ops, ctx, owner, NULL, t->head};
    if (p->next) p->next->prev = p;
    t->head = p;
    t->n++;
    t->n_nng += !is_local(pipe);
    return p;
}

void park_set_deadline(struct park *p, uint64_t deadline)
{
    p->deadline = deadline;
}

uint32_t park_pipe(const struct park *p)
{
    return p->pipe;
}

uint64_t park_req_id(const struct park *p)
{
    return p->req_id;
}

void park_answer(struct park_table *t, struct park *p, const Kvtier__Response *rsp)
{
    unlink_park(t, p);
    if (is_local(p->pipe)) {
        local_reply_later(t->env.local, p->later, rsp);
    } else {
        nng_msg *m = NULL;
        if (rsp && wire_pack(&rsp->base, &m) != 0) m = NULL;
        server_reply_later(t->env.srv, p->later, m);
    }
    free(p);
}

void park_pipe_gone(struct park_table *t, uint32_t pipe)
{
    if (!t) return;
    struct park *p = t->head;
    while (p) {
        if (p->pipe != pipe) {
            p = p->next;
            continue;
        }
        drop(t, p, 0); /* gone may drop other parks: start over */
        p = t->head;
    }
}

int park_wait_ms(const struct park_table *t, uint64_t now)
{
    if (!t) return -1;
    uint64_t due = 0;
    for (const struct park *p = t->head; p; p = p->next)
        if (p->deadline && (due == 0 || p->deadline < due)) due = p->deadline;
    if (due == 0) return -1;
    return due > now ? (int)(due - now < 60000 ? due - now : 60000) : 0;
}

/* Each due call answers p or moves its deadline; the deadline is cleared
 * first, so a callback that does neither is not called again and again. */
void park_run_due(struct park_table *t, uint64_t now)
{
    if (!t) return;
    struct park *p = t->head;
    while (p) {
        if (!p->deadline || p->deadline > now) {
            p = p->next;
            continue;
        }
        p->deadline = 0;
        p->ops->due(p->ctx, p->owner);
        p = t->head; /* the list may have changed */
    }
}

uint32_t park_count_pipe(const struct park_table *t, uint32_t pipe)
{
    uint32_t n = 0;
    for (const struct park *p = t ? t->head : NULL; p; p = p->next)
        n += p->pipe == pipe;
    return n;
}

uint32_t park_count(const struct park_table *t, uint32_t *n_nng)
{
    if (n_nng) *n_nng = t ? t->n_nng : 0;
    return t ? t->n : 0;
}
