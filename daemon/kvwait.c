/*
 * kvwait.c -- KvWait: tell an engine how its transfers ended.
 *
 * Design: a wait whose transfers are all done, or that asks for no
 * timeout, is answered at once. Otherwise the request is parked (park.c)
 * and answered when the last of its transfers finishes (kvc_wait_notify,
 * called as each one settles) or when its deadline passes (park.c calls
 * wait_due); when its connection closes park.c drops it (wait_gone). A
 * wait park.c cannot park (the nng contexts parked requests may hold are
 * all held) is answered at once, like a poll (the client library then
 * polls). A done transfer is reported once: the answer forgets it.
 */
#include <stdlib.h>
#include <string.h>

#include "handlers.h"
#include "kvcache.h"
#include "log.h"

/* ------------------------------------------------------------ answering */

/* Bytes collect() needs for n statuses. */
static size_t collect_size(size_t n)
{
    return sizeof(Kvtier__KvWaitResp) +
           n * (sizeof(Kvtier__KvStatus *) + sizeof(Kvtier__KvStatus) + KVC_MSG);
}

static void fill_status(Kvtier__KvStatus *st, const struct kvc_xfer *x,
                        uint64_t id, char *msg)
{
    kvtier__kv_status__init(st);
    st->xfer = id;
    st->msg = msg;
    msg[0] = '\0';
    if (!x) { /* reported to an earlier wait */
        st->done = 1;
        st->err = KVT_ENOENT;
        strcpy(msg, "already collected");
        return;
    }
    st->n_chunks = x->n_move;
    st->n_skipped = x->n - x->n_move;
    st->done = x->state == KVC_DONE;
    if (!st->done) return;
    st->err = (int32_t)x->err;
    memcpy(msg, x->msg, KVC_MSG);
}

/* The statuses of ids, in mem (collect_size bytes); done transfers are
 * forgotten. */
static Kvtier__KvWaitResp *collect(struct kvc *k, const uint64_t *ids,
                                   size_t n, void *mem)
{
    Kvtier__KvWaitResp *w = mem;
    kvtier__kv_wait_resp__init(w);
    w->status = (Kvtier__KvStatus **)(w + 1);
    Kvtier__KvStatus *st = (Kvtier__KvStatus *)(w->status + n);
    char *msg = (char *)(st + n);
    w->n_status = n;
    for (size_t i = 0; i < n; i++) {
        struct kvc_xfer *x = kvc_xfer_find(k, ids[i]);
        fill_status(&st[i], x, ids[i], msg + i * KVC_MSG);
        w->status[i] = &st[i];
        if (x && x->state == KVC_DONE) kvc_xfer_free(k, x);
    }
    return w;
}

static int all_done(struct kvc *k, const uint64_t *ids, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        const struct kvc_xfer *x = kvc_xfer_find(k, ids[i]);
        if (x && x->state != KVC_DONE) return 0;
    }
    return 1;
}

static void waiter_free(struct kvc *k, struct kvc_waiter **link)
{
    struct kvc_waiter *w = *link;
    *link = w->next;
    k->n_waiters--;
    free(w->xfers);
    free(w);
}

static struct kvc_waiter **link_of(struct kvc *k, const struct kvc_waiter *w)
{
    struct kvc_waiter **link = &k->waiters;
    while (*link != w) link = &(*link)->next;
    return link;
}

/* Send a parked wait its answer and forget it. */
static void answer(struct kvc *k, struct kvc_waiter **link)
{
    struct kvc_waiter *w = *link;
    void *mem = malloc(collect_size(w->n));
    if (!mem) abort(); /* control-plane allocation */
    Kvtier__Response rsp;
    kvtier__response__init(&rsp);
    rsp.id = k->env.host->park_req_id(w->park);
    rsp.body_case = KVTIER__RESPONSE__BODY_KV_WAIT;
    rsp.kv_wait = collect(k, w->xfers, w->n, mem);
    k->env.host->park_answer(k->env.host->core, w->park, &rsp);
    free(mem);
    waiter_free(k, link);
}

/* park.c: the client left, or the daemon stops; nothing is sent. */
static void wait_gone(void *ctx, void *owner)
{
    struct kvc *k = ctx;
    waiter_free(k, link_of(k, owner));
}

static void wait_due(void *ctx, void *owner)
{
    struct kvc *k = ctx;
    answer(k, link_of(k, owner));
}

static const struct park_ops wait_ops = {wait_gone, wait_due};

/* Daemon stops: what is parked goes unanswered (as its connection will). */
void kvc_wait_close(struct kvc *k)
{
    while (k->waiters) {
        k->env.host->park_answer(k->env.host->core, k->waiters->park, NULL);
        waiter_free(k, &k->waiters);
    }
}

/* ---------------------------------------------------------------- events */

void kvc_wait_notify(struct kvc *k, uint32_t pipe)
{
    struct kvc_waiter **link = &k->waiters;
    while (*link) {
        struct kvc_waiter *w = *link;
        if (w->pipe == pipe && all_done(k, w->xfers, w->n)) answer(k, link);
        else link = &w->next;
    }
}

/* ------------------------------------------------------------- handler */

static kvt_err check_wait(struct req *r, struct kvc *k, uint32_t pipe,
                          const Kvtier__KvWait *q)
{
    if (q->n_xfers == 0 || q->n_xfers > k->env.cfg->max_keys)
        return req_fail(r, q->n_xfers ? KVT_ETOOBIG : KVT_EINVAL, "%zu "
                        "transfers: want 1-%llu", q->n_xfers,
                        (unsigned long long)k->env.cfg->max_keys);
    uint64_t stamp = ++k->stamp;
    for (size_t i = 0; i < q->n_xfers; i++) {
        struct kvc_xfer *x = kvc_xfer_find(k, q->xfers[i]);
        if (!x || x->orphan)
            return req_fail(r, KVT_ENOENT, "no transfer %llu",
                            (unsigned long long)q->xfers[i]);
        if (x->pipe != pipe)
            return req_fail(r, KVT_EPERM, "transfer %llu belongs to another "
                            "client", (unsigned long long)q->xfers[i]);
        if (x->stamp == stamp)
            return req_fail(r, KVT_EINVAL, "transfer %llu is named twice",
                            (unsigned long long)q->xfers[i]);
        x->stamp = stamp;
    }
    return KVT_OK;
}

/* Park the request; 0, or -1 if it cannot be parked (answer it now). */
static int park(struct kvc *k, uint32_t pipe, const Kvtier__KvWait *q,
                uint64_t req_id)
{
    struct kvc_waiter *w = calloc(1, sizeof *w);
    if (!w) abort(); /* control-plane allocation */
    const struct tier_host *h = k->env.host;
    if (!(w->park = h->park(h->core, pipe, req_id, &wait_ops, k, w))) {
        free(w);
        return -1;
    }
    if (!(w->xfers = malloc(q->n_xfers * sizeof *w->xfers))) abort();
    memcpy(w->xfers, q->xfers, q->n_xfers * sizeof *w->xfers);
    uint32_t ms = q->timeout_ms < KVC_WAIT_MAX_MS ? q->timeout_ms : KVC_WAIT_MAX_MS;
    w->n = (uint32_t)q->n_xfers;
    w->pipe = pipe;
    h->park_deadline(h->core, w->park, h->clock_ms(h->core) + (ms ? ms : 1));
    w->next = k->waiters;
    k->waiters = w;
    k->n_waiters++;
    return 0;
}

void kvc_do_wait(struct req *r, struct kvc *k, uint32_t pipe,
                 const Kvtier__KvWait *q, Kvtier__Response *rsp)
{
    if (check_wait(r, k, pipe, q) != KVT_OK) return;
    if (q->timeout_ms && !all_done(k, q->xfers, q->n_xfers) &&
        park(k, pipe, q, rsp->id) == 0)
        return; /* what this handler returns is discarded */
    rsp->body_case = KVTIER__RESPONSE__BODY_KV_WAIT;
    rsp->kv_wait = collect(k, q->xfers, q->n_xfers,
                           req_alloc(r, collect_size(q->n_xfers)));
}
