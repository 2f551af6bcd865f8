/*
 * server.c -- nng rep socket, contexts, and the hand-off to the core thread.
 *
 * Design: one rep0 socket listens on every configured url; `contexts` nng
 * contexts each keep one receive outstanding, so that many clients are
 * served concurrently. nng completes receives on its own threads; those
 * threads only append the context to a queue and, when the queue goes from
 * empty to non-empty, write the core's eventfd (STYLE §7). The core thread
 * drains the queue, runs the handler, and starts the send; the send's
 * completion re-arms the receive. Pipe add/remove events travel the same
 * queue, so the core sees a client's disconnect in order with its requests
 * and drops its leases at once. Worker threads hand results back through
 * the same queue (server_post), and a handler may park its request and
 * answer later (server_defer), for replies that wait on a worker.
 */
#include "server.h"

#include <errno.h>
#include <nng/protocol/reqrep0/rep.h>
#include <nng/transport/ipc/ipc.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "log.h"
#include "wire.h"

enum work_state { W_RECV, W_SEND };

struct work {
    struct server *s;
    nng_aio *aio;
    nng_ctx ctx;
    int state;
    nng_msg *msg;
    struct work *next;
};

struct pipe_ev {
    uint32_t pipe;
    int added;
    struct pipe_ev *next;
};

struct post {
    void (*fn)(void *);
    void *arg;
    struct post *next;
};

struct server {
    nng_socket sock;
    int open;
    struct work *works;
    uint32_t n_works;
    int efd;
    pthread_mutex_t q_mtx; /* guards the q_, ev_ and post_ lists */
    struct work *q_head, *q_tail;
    struct pipe_ev *ev_head, *ev_tail;
    struct post *post_head, *post_tail;
    nng_listener *lis; /* one per url, in order */
    size_t n_lis;
    struct work *cur; /* the request a handler is running for (core) */
    int deferred;     /* ... and that handler called server_defer */
    volatile int closing;
};

static void wake(struct server *s)
{
    uint64_t one = 1;
    ssize_t w = write(s->efd, &one, sizeof one);
    (void)w;
}

static int queue_empty(const struct server *s)
{
    return s->q_head == NULL && s->ev_head == NULL && s->post_head == NULL;
}

static void enqueue_work(struct server *s, struct work *w)
{
    pthread_mutex_lock(&s->q_mtx);
    int was_empty = queue_empty(s);
    w->next = NULL;
    if (s->q_tail) s->q_tail->next = w;
    else s->q_head = w;
    s->q_tail = w;
    pthread_mutex_unlock(&s->q_mtx);
    if (was_empty) wake(s);
}

static void work_cb(void *arg)
{
    struct work *w = arg;
    struct server *s = w->s;
    int rv = nng_aio_result(w->aio);
    if (w->state == W_SEND) {
        if (rv != 0) nng_msg_free(nng_aio_get_msg(w->aio));
        w->state = W_RECV;
        if (!s->closing) nng_ctx_recv(w->ctx, w->aio);
        return;
    }
    if (rv != 0) {
        if (rv != NNG_ECLOSED && !s->closing) nng_ctx_recv(w->ctx, w->aio);
        return;
    }
    w->msg = nng_aio_get_msg(w->aio);
    enqueue_work(s, w);
}

static void pipe_cb(nng_pipe p, nng_pipe_ev ev, void *arg)
{
    struct server *s = arg;
    struct pipe_ev *e = malloc(sizeof *e);
    if (!e) abort();
    e->pipe = (uint32_t)nng_pipe_id(p);
    e->added = ev == NNG_PIPE_EV_ADD_POST;
    e->next = NULL;
    pthread_mutex_lock(&s->q_mtx);
    int was_empty = queue_empty(s);
    if (s->ev_tail) s->ev_tail->next = e;
    else s->ev_head = e;
    s->ev_tail = e;
    pthread_mutex_unlock(&s->q_mtx);
    if (was_empty) wake(s);
}

void server_post(struct server *s, void (*fn)(void *), void *arg)
{
    struct post *p = malloc(sizeof *p);
    if (!p) abort();
    p->fn = fn;
    p->arg = arg;
    p->next = NULL;
    pthread_mutex_lock(&s->q_mtx);
    int was_empty = queue_empty(s);
    if (s->post_tail) s->post_tail->next = p;
    else s->post_head = p;
    s->post_tail = p;
    pthread_mutex_unlock(&s->q_mtx);
    if (was_empty) wake(s);
}

static int listen_on(struct server *s, const char *url, unsigned mode,
                     nng_tls_config *tls, char *err, size_t errlen)
{
    nng_listener *l = &s->lis[s->n_lis];
    int rv = nng_listener_create(l, s->sock, url);
    if (rv == 0 && strncmp(url, "ipc://", 6) == 0)
        rv = nng_listener_set_int(*l, NNG_OPT_IPC_PERMISSIONS, (int)mode);
    if (rv == 0 && tls) rv = nng_listener_set_ptr(*l, NNG_OPT_TLS_CONFIG, tls);
    if (rv == 0) rv = nng_listener_start(*l, 0);
    if (rv == 0) s->n_lis++;
    if (rv != 0) {
        snprintf(err, errlen, "cannot listen on %s: %s", url, nng_strerror(rv));
        return -1;
    }
    log_info("server", "listening on %s", url);
    return 0;
}

static int open_socket(struct server *s, const struct server_opts *o, char *err,
                       size_t errlen)
{
    int rv = nng_rep0_open(&s->sock);
    if (rv != 0) {
        snprintf(err, errlen, "nng_rep0_open: %s", nng_strerror(rv));
        return -1;
    }
    s->open = 1;
    nng_socket_set_size(s->sock, NNG_OPT_RECVMAXSZ, o->max_msg_bytes);
    nng_pipe_notify(s->sock, NNG_PIPE_EV_ADD_POST, pipe_cb, s);
    nng_pipe_notify(s->sock, NNG_PIPE_EV_REM_POST, pipe_cb, s);
    s->lis = calloc(o->n_urls ? o->n_urls : 1, sizeof *s->lis);
    if (!s->lis) abort();
    for (size_t i = 0; i < o->n_urls; i++)
        if (listen_on(s, o->urls[i], o->ipc_mode, o->tls ? o->tls[i] : NULL, err,
                      errlen) != 0)
            return -1;
    return 0;
}

static int start_works(struct server *s, uint32_t n, char *err, size_t errlen)
{
    s->works = calloc(n, sizeof *s->works);
    if (!s->works) abort();
    for (uint32_t i = 0; i < n; i++) {
        struct work *w = &s->works[i];
        w->s = s;
        int rv = nng_aio_alloc(&w->aio, work_cb, w);
        if (rv == 0) rv = nng_ctx_open(&w->ctx, s->sock);
        if (rv != 0) {
            snprintf(err, errlen, "nng context: %s", nng_strerror(rv));
            return -1;
        }
        s->n_works = i + 1;
        nng_ctx_recv(w->ctx, w->aio);
    }
    return 0;
}

int server_open(const struct server_opts *o, struct server **out, char *err,
                size_t errlen)
{
    struct server *s = calloc(1, sizeof *s);
    if (!s) abort();
    pthread_mutex_init(&s->q_mtx, NULL);
    s->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (s->efd < 0) {
        snprintf(err, errlen, "eventfd: %s", strerror(errno));
        goto fail;
    }
    if (open_socket(s, o, err, errlen) != 0) goto fail;
    if (start_works(s, o->contexts, err, errlen) != 0) goto fail;
    *out = s;
    return 0;
fail:
    server_close(s);
    return -1;
}

int server_url_of(const struct server *s, uint32_t pipe)
{
    nng_pipe p = NNG_PIPE_INITIALIZER;
    p.id = pipe;
    nng_listener l = nng_pipe_listener(p);
    for (size_t i = 0; l.id > 0 && i < s->n_lis; i++)
        if (nng_listener_id(s->lis[i]) == nng_listener_id(l)) return (int)i;
    return -1;
}

int server_fd(const struct server *s)
{
    return s->efd;
}

static void reply(struct work *w, nng_msg *rsp)
{
    nng_msg_free(w->msg);
    w->msg = NULL;
    w->state = W_SEND;
    nng_aio_set_msg(w->aio, rsp);
    nng_ctx_send(w->ctx, w->aio);
}

struct server_later *server_defer(struct server *s)
{
    if (!s || !s->cur) return NULL; /* not inside one of our handlers */
    s->deferred = 1;
    return (struct server_later *)s->cur;
}

void server_reply_later(struct server *s, struct server_later *h, nng_msg *rsp)
{
    struct work *w = (struct work *)h;
    if (rsp) {
        w->state = W_SEND;
        nng_aio_set_msg(w->aio, rsp);
        nng_ctx_send(w->ctx, w->aio);
    } else if (!s->closing) {
        nng_ctx_recv(w->ctx, w->aio);
    }
}

static void serve_one(struct server *s, struct work *w, server_handler_fn fn,
                      void *arg)
{
    nng_pipe p = nng_msg_get_pipe(w->msg);
    s->cur = w;
    s->deferred = 0;
    nng_msg *rsp = fn(arg, (uint32_t)nng_pipe_id(p), nng_msg_body(w->msg),
                      nng_msg_len(w->msg));
    s->cur = NULL;
    if (s->deferred) { /* parked until server_reply_later */
        if (rsp) nng_msg_free(rsp);
        nng_msg_free(w->msg);
        w->msg = NULL;
        return;
    }
    if (!rsp) { /* nothing to say: re-arm the receive */
        nng_msg_free(w->msg);
        w->msg = NULL;
        if (!s->closing) nng_ctx_recv(w->ctx, w->aio);
        return;
    }
    reply(w, rsp);
}

void server_poll(struct server *s, server_handler_fn fn,
                 server_pipe_fn pfn, void *arg)
{
    uint64_t cnt;
    ssize_t r = read(s->efd, &cnt, sizeof cnt);
    (void)r;
    for (;;) {
        pthread_mutex_lock(&s->q_mtx);
        struct pipe_ev *e = s->ev_head;
        struct post *po = e ? NULL : s->post_head;
        struct work *w = e || po ? NULL : s->q_head;
        if (e && !(s->ev_head = e->next)) s->ev_tail = NULL;
        if (po && !(s->post_head = po->next)) s->post_tail = NULL;
        if (w && !(s->q_head = w->next)) s->q_tail = NULL;
        pthread_mutex_unlock(&s->q_mtx);
        if (!e && !po && !w) return;
        if (e) {
            pfn(arg, e->pipe, e->added);
            free(e);
        } else if (po) {
            po->fn(po->arg);
            free(po);
        } else {
            serve_one(s, w, fn, arg);
        }
    }
}

void server_close(struct server *s)
{
    if (!s) return;
    s->closing = 1;
    if (s->open) nng_close(s->sock);
    for (uint32_t i = 0; i < s->n_works; i++) {
        if (s->works[i].aio) nng_aio_free(s->works[i].aio);
        if (s->works[i].msg) nng_msg_free(s->works[i].msg);
    }
    free(s->works);
    free(s->lis);
    while (s->ev_head) {
        struct pipe_ev *e = s->ev_head;
        s->ev_head = e->next;
        free(e);
    }
    while (s->post_head) {
        struct post *p = s->post_head;
        s->post_head = p->next;
        free(p);
    }
    if (s->efd >= 0) close(s->efd);
    pthread_mutex_destroy(&s->q_mtx);
    free(s);
}
