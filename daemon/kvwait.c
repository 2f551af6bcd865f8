/*
 * kvwait.c -- KvWait: tell an engine how its transfers ended.
 *
 * Design: a wait whose transfers are all done, or that asks for no
 * timeout, is answered at once. Otherwise the request is parked
 * (server_defer for nng, local_defer for the fast channel) and answered
 * when the last of its transfers finishes (kvc_wait_notify, called as
 * each one settles), when its deadline passes, or -- with nothing sent --
 * when its connection closes. A parked wait on nng holds one of the
 * server's contexts, so at most half as many waits as contexts may be
 * parked there; a wait past that limit is answered at once, like a poll
 * (the client library then polls). The fast channel parks without limit:
 * a parked connection only stops being read. One nng timer (nng_sleep_aio) is armed for
 * the earliest deadline; its callback posts to the core thread, which
 * answers what is due and arms the next. A done transfer is reported
 * once: the answer forgets it.
 */
#include <stdlib.h>
#include <string.h>

#include "kvcache.h"
#include "local.h"
#include "log.h"
#include "server.h"
#include "wire.h"

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

static int is_local(uint32_t pipe)
{
    return pipe >= LOCAL_ID_BASE;
}

/* Park the request being handled; NULL if its channel cannot. */
static void *defer_request(struct kvc *k, uint32_t pipe)
{
    if (is_local(pipe)) return local_defer(k->d->local);
    return server_defer(k->d->srv);
}

/* rsp NULL: nothing to send (the connection is going). */
static void reply_later(struct kvc *k, const struct kvc_waiter *w,
                        const Kvtier__Response *rsp)
{
    if (is_local(w->pipe)) {
        local_reply_later(k->d->local, w->later, rsp);
        return;
    }
    nng_msg *m = NULL;
    if (rsp && wire_pack(&rsp->base, &m) != 0) m = NULL;
    server_reply_later(k->d->srv, w->later, m);
}

/* Send a parked wait its answer and forget it. */
static void answer(struct kvc *k, struct kvc_waiter **link)
{
    struct kvc_waiter *w = *link;
    void *mem = malloc(collect_size(w->n));
    if (!mem) abort(); /* control-plane allocation */
    Kvtier__Response rsp;
    kvtier__response__init(&rsp);
    rsp.id = w->req_id;
    rsp.body_case = KVTIER__RESPONSE__BODY_KV_WAIT;
    rsp.kv_wait = collect(k, w->xfers, w->n, mem);
    reply_later(k, w, &rsp);
    free(mem);
    waiter_free(k, link);
}

/* ---------------------------------------------------------------- timer */

static void on_timer(void *arg);

static void timer_cb(void *arg)
{
    struct kvc *k = arg;
    if (nng_aio_result(k->timer) == 0) server_post(k->d->srv, on_timer, k);
}

/* Arm the timer for the earliest deadline, unless it is armed earlier. */
static void timer_arm(struct kvc *k)
{
    uint64_t due = 0;
    for (const struct kvc_waiter *w = k->waiters; w; w = w->next)
        if (due == 0 || w->deadline < due) due = w->deadline;
    if (due == 0 || (k->timer_due != 0 && k->timer_due <= due)) return;
    nng_aio_cancel(k->timer);
    nng_aio_wait(k->timer);
    uint64_t now = kvtierd_clock(k->d);
    k->timer_due = due;
    nng_sleep_aio(due > now ? (nng_duration)(due - now) : 0, k->timer);
}

static void on_timer(void *arg)
{
    struct kvc *k = arg;
    uint64_t now = kvtierd_clock(k->d);
    k->timer_due = 0;
    struct kvc_waiter **link = &k->waiters;
    while (*link) {
        if ((*link)->deadline <= now) answer(k, link);
        else link = &(*link)->next;
    }
    timer_arm(k);
}

int kvc_wait_init(struct kvc *k)
{
    return nng_aio_alloc(&k->timer, timer_cb, k) == 0 ? 0 : -1;
}

void kvc_wait_close(struct kvc *k)
{
    if (k->timer) nng_aio_free(k->timer); /* cancels, waits for timer_cb */
    k->timer = NULL;
    while (k->waiters) waiter_free(k, &k->waiters); /* server_close frees
                                                     * their contexts */
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

void kvc_wait_drop_pipe(struct kvc *k, uint32_t pipe)
{
    struct kvc_waiter **link = &k->waiters;
    while (*link) {
        if ((*link)->pipe != pipe) {
            link = &(*link)->next;
            continue;
        }
        reply_later(k, *link, NULL);
        waiter_free(k, link);
    }
}

/* ------------------------------------------------------------- handler */

static kvt_err check_wait(struct req *r, struct kvc *k, uint32_t pipe,
                          const Kvtier__KvWait *q)
{
    if (q->n_xfers == 0 || q->n_xfers > k->d->cfg.max_keys)
        return req_fail(r, q->n_xfers ? KVT_ETOOBIG : KVT_EINVAL, "%zu "
                        "transfers: want 1-%llu", q->n_xfers,
                        (unsigned long long)k->d->cfg.max_keys);
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

/* Waits parked on nng, each holding one of the server's contexts. */
static uint32_t nng_parked(const struct kvc *k)
{
    uint32_t n = 0;
    for (const struct kvc_waiter *w = k->waiters; w; w = w->next)
        n += !is_local(w->pipe);
    return n;
}

/* Park the request; 0, or -1 if it cannot be parked (answer it now). */
static int park(struct kvc *k, uint32_t pipe, const Kvtier__KvWait *q,
                uint64_t req_id)
{
    if (!is_local(pipe) && nng_parked(k) >= k->max_waiters) return -1;
    void *later = defer_request(k, pipe);
    if (!later) return -1;
    struct kvc_waiter *w = calloc(1, sizeof *w);
    if (!w || !(w->xfers = malloc(q->n_xfers * sizeof *w->xfers))) abort();
    memcpy(w->xfers, q->xfers, q->n_xfers * sizeof *w->xfers);
    uint32_t ms = q->timeout_ms < KVC_WAIT_MAX_MS ? q->timeout_ms : KVC_WAIT_MAX_MS;
    w->n = (uint32_t)q->n_xfers;
    w->pipe = pipe;
    w->req_id = req_id;
    w->later = later;
    w->deadline = kvtierd_clock(k->d) + ms;
    w->next = k->waiters;
    k->waiters = w;
    k->n_waiters++;
    timer_arm(k);
    return 0;
}

void kvc_do_wait(struct req *r, struct kvtierd *d, uint32_t pipe,
                 const Kvtier__KvWait *q, Kvtier__Response *rsp)
{
    struct kvc *k = d->kvc;
    if (check_wait(r, k, pipe, q) != KVT_OK) return;
    if (q->timeout_ms && !all_done(k, q->xfers, q->n_xfers) &&
        park(k, pipe, q, rsp->id) == 0)
        return; /* what this handler returns is discarded */
    rsp->body_case = KVTIER__RESPONSE__BODY_KV_WAIT;
    rsp->kv_wait = collect(k, q->xfers, q->n_xfers,
                           req_alloc(r, collect_size(q->n_xfers)));
}
