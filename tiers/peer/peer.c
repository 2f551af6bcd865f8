/*
 * peer.c -- the peer tier: one UCX context and worker, one-sided gets
 * from other nodes' DRAM pools (DESIGN §4, §5).
 *
 * Design: the worker runs in single-thread mode on the core thread and is
 * woken through its event fd (ucp_worker_get_efd), which sits, with an
 * eventfd of our own, in a small epoll set whose fd the core loop waits
 * on; peer_progress drains the worker and re-arms it (ucp_worker_arm
 * until it stops answering BUSY). Our eventfd covers fetches whose
 * slices completed inside ucp_get_nbx: their done callbacks still run
 * from peer_progress, so no caller is ever re-entered. UCX 1.13's
 * shared-memory transports offer no wakeup (with UCP_FEATURE_WAKEUP
 * asked for, a peer reached only through them is "unreachable"), so
 * with wakeup off the worker is polled instead: peer_progress re-arms our
 * eventfd while fetches are in flight, or while peers hold pins here
 * (UCX may serve their gets in software, which needs this side's
 * progress too), one progress pass per loop turn; the idle daemon sleeps
 * as before.
 *
 * The pool is registered once (ucp_mem_map) and its packed rkey, with
 * the worker address and the pool's base address, is what members
 * exchange at join. A fetch is split into slices of at most PEER_SLICE
 * (single tcp transfers above 8 MiB stall in UCX 1.13), all posted at
 * once; it completes when every slice has, failed if any failed.
 * Endpoints use UCP_ERR_HANDLING_MODE_PEER, so a peer that dies fails
 * the gets in flight instead of leaving them pending forever; a failed
 * endpoint is closed (forced, bounded by EP_CLOSE_MS) by peer_disconnect,
 * which the cluster calls when the member dies or rejoins with a new
 * address, and when it evicts an idle endpoint past its cap (the
 * cluster makes endpoints on a member's first fetch, pget.c).
 */
#include "peer.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <time.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

#include "log.h"

#define EP_CLOSE_MS 500 /* bound on a forced endpoint close (core thread) */

struct peer_fetch {
    struct peer_tier *t;
    struct peer_conn *c;
    void **req;          /* the slices' requests; NULL once complete */
    uint32_t n, left;    /* slices, slices not complete */
    int status;
    peer_done_fn done;
    void *arg;
    struct peer_fetch *next; /* on t->ready once left == 0 */
    struct peer_fetch *cnext; /* on c->fetches while in flight */
    uint64_t len;
};

struct peer_conn {
    ucp_ep_h ep;
    ucp_rkey_h rkey;
    uint64_t base;
    int failed;
    struct peer_fetch *fetches;
};

struct peer_tier {
    ucp_context_h ctx;
    ucp_worker_h w;
    ucp_mem_h memh;
    void *addr, *rkey;
    size_t alen, rlen;
    uint64_t base;
    int ufd, kfd, ep; /* UCX's efd, our eventfd, the epoll set of both */
    struct peer_fetch *ready;
    uint64_t bytes, failed;
    int wakeup;        /* 0: no event fd; poll while fetches are in flight */
    uint32_t inflight; /* fetches not complete */
    int serving;       /* peers may be reading our pool (see peer_serving) */
};

/* ------------------------------------------------------------- open/close */

static int fail(char *err, size_t errlen, const char *what, ucs_status_t st)
{
    snprintf(err, errlen, "%s: %s", what, ucs_status_string(st));
    return -1;
}

static int open_worker(struct peer_tier *t, char *err, size_t errlen)
{
    ucp_config_t *cfg;
    ucs_status_t st = ucp_config_read(NULL, NULL, &cfg);
    if (st != UCS_OK) return fail(err, errlen, "ucp_config_read", st);
    ucp_params_t p = {.field_mask = UCP_PARAM_FIELD_FEATURES,
                      .features = UCP_FEATURE_RMA | (t->wakeup ? UCP_FEATURE_WAKEUP : 0)};
    st = ucp_init(&p, cfg, &t->ctx);
    ucp_config_release(cfg);
    if (st != UCS_OK) return fail(err, errlen, "ucp_init", st);
    ucp_worker_params_t wp = {.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
                              .thread_mode = UCS_THREAD_MODE_SINGLE};
    if ((st = ucp_worker_create(t->ctx, &wp, &t->w)) != UCS_OK)
        return fail(err, errlen, "ucp_worker_create", st);
    if (t->wakeup && (st = ucp_worker_get_efd(t->w, &t->ufd)) != UCS_OK)
        return fail(err, errlen, "ucp_worker_get_efd", st);
    ucp_address_t *a;
    if ((st = ucp_worker_get_address(t->w, &a, &t->alen)) != UCS_OK)
        return fail(err, errlen, "ucp_worker_get_address", st);
    t->addr = a;
    return 0;
}

static int map_pool(struct peer_tier *t, void *base, uint64_t bytes, char *err,
                    size_t errlen)
{
    /* Peers may read the pool, never write it: without .prot UCX grants
     * remote write too. */
    ucp_mem_map_params_t mp = {.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS |
                                             UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                                             UCP_MEM_MAP_PARAM_FIELD_PROT,
                               .address = base, .length = bytes,
                               .prot = UCP_MEM_MAP_PROT_LOCAL_READ |
                                       UCP_MEM_MAP_PROT_LOCAL_WRITE |
                                       UCP_MEM_MAP_PROT_REMOTE_READ};
    ucs_status_t st = ucp_mem_map(t->ctx, &mp, &t->memh);
    if (st != UCS_OK) return fail(err, errlen, "ucp_mem_map of the pool", st);
    if ((st = ucp_rkey_pack(t->ctx, t->memh, &t->rkey, &t->rlen)) != UCS_OK)
        return fail(err, errlen, "ucp_rkey_pack", st);
    t->base = (uint64_t)(uintptr_t)base;
    return 0;
}

static int make_fds(struct peer_tier *t, char *err, size_t errlen)
{
    t->kfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    t->ep = epoll_create1(EPOLL_CLOEXEC);
    struct epoll_event a = {.events = EPOLLIN, .data.fd = t->ufd};
    struct epoll_event b = {.events = EPOLLIN, .data.fd = t->kfd};
    if (t->kfd < 0 || t->ep < 0 ||
        (t->wakeup && epoll_ctl(t->ep, EPOLL_CTL_ADD, t->ufd, &a) != 0) ||
        epoll_ctl(t->ep, EPOLL_CTL_ADD, t->kfd, &b) != 0) {
        snprintf(err, errlen, "peer tier fds: %s", strerror(errno));
        return -1;
    }
    return 0;
}

int peer_open(void *base, uint64_t bytes, int wakeup, struct peer_tier **out,
              char *err, size_t errlen)
{
    struct peer_tier *t = calloc(1, sizeof *t);
    if (!t) abort(); /* control-plane allocation */
    t->wakeup = wakeup;
    t->ufd = t->kfd = t->ep = -1;
    *out = NULL;
    if (open_worker(t, err, errlen) != 0 || map_pool(t, base, bytes, err, errlen) != 0 ||
        make_fds(t, err, errlen) != 0) {
        peer_close(t);
        return -1;
    }
    if (t->wakeup) ucp_worker_arm(t->w);
    *out = t;
    return 0;
}

void peer_close(struct peer_tier *t)
{
    if (!t) return;
    if (t->w && t->kfd >= 0) peer_progress(t); /* run what completed */
    if (t->rkey) ucp_rkey_buffer_release(t->rkey);
    if (t->memh) ucp_mem_unmap(t->ctx, t->memh);
    if (t->addr) ucp_worker_release_address(t->w, t->addr);
    if (t->w) ucp_worker_destroy(t->w);
    if (t->ctx) ucp_cleanup(t->ctx);
    if (t->kfd >= 0) close(t->kfd);
    if (t->ep >= 0) close(t->ep);
    free(t);
}

int peer_fd(const struct peer_tier *t)
{
    return t ? t->ep : -1;
}

void peer_self(const struct peer_tier *t, const void **addr, size_t *alen,
               const void **rkey, size_t *rlen, uint64_t *base)
{
    *addr = t->addr;
    *alen = t->alen;
    *rkey = t->rkey;
    *rlen = t->rlen;
    *base = t->base;
}

void peer_counts(const struct peer_tier *t, uint64_t *bytes, uint64_t *failed)
{
    *bytes = t ? t->bytes : 0;
    *failed = t ? t->failed : 0;
}

/* ---------------------------------------------------------- endpoints */

static void ep_error(void *arg, ucp_ep_h ep, ucs_status_t status)
{
    struct peer_conn *c = arg;
    (void)ep;
    if (!c->failed) log_info("peer", "an endpoint failed: %s", ucs_status_string(status));
    c->failed = 1;
}

int peer_connect(struct peer_tier *t, const void *addr, size_t alen,
                 const void *rkey, size_t rlen, uint64_t base,
                 struct peer_conn **out, char *err, size_t errlen)
{
    (void)alen;
    (void)rlen;
    struct peer_conn *c = calloc(1, sizeof *c);
    if (!c) abort();
    ucp_ep_params_t p = {.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS |
                                       UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                                       UCP_EP_PARAM_FIELD_ERR_HANDLER,
                         .address = addr,
                         .err_mode = t->wakeup ? UCP_ERR_HANDLING_MODE_PEER
                                               : UCP_ERR_HANDLING_MODE_NONE,
                         .err_handler = {.cb = ep_error, .arg = c}};
    ucs_status_t st = ucp_ep_create(t->w, &p, &c->ep);
    if (st == UCS_OK && (st = ucp_ep_rkey_unpack(c->ep, rkey, &c->rkey)) != UCS_OK)
        fail(err, errlen, "ucp_ep_rkey_unpack", st);
    else if (st != UCS_OK)
        fail(err, errlen, "ucp_ep_create", st);
    if (st != UCS_OK) {
        peer_disconnect(t, c);
        return -1;
    }
    c->base = base;
    *out = c;
    return 0;
}

int peer_conn_ok(const struct peer_conn *c)
{
    return c && !c->failed;
}

int peer_conn_busy(const struct peer_conn *c)
{
    return c && c->fetches;
}

void peer_disconnect(struct peer_tier *t, struct peer_conn *c)
{
    if (!c) return;
    for (struct peer_fetch *f = c->fetches; f; f = f->cnext) peer_cancel(t, f);
    if (c->rkey) ucp_rkey_destroy(c->rkey);
    if (c->ep) {
        ucp_request_param_t p = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
                                 .flags = UCP_EP_CLOSE_FLAG_FORCE};
        ucs_status_ptr_t r = ucp_ep_close_nbx(c->ep, &p);
        /* Bounded: this runs on the core thread, and a peer that froze
         * must not freeze it (a forced close normally completes at once). */
        struct timespec t0, now;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        while (r && UCS_PTR_IS_PTR(r) && ucp_request_check_status(r) == UCS_INPROGRESS) {
            ucp_worker_progress(t->w);
            clock_gettime(CLOCK_MONOTONIC, &now);
            if ((now.tv_sec - t0.tv_sec) * 1000 + (now.tv_nsec - t0.tv_nsec) / 1000000 >=
                EP_CLOSE_MS) {
                log_warn("peer", "an endpoint did not close within %d ms; "
                         "left to complete in the background", EP_CLOSE_MS);
                break;
            }
        }
        if (r && UCS_PTR_IS_PTR(r)) ucp_request_free(r); /* freed when it completes */
    }
    /* Forced close completed every request: the fetches are on t->ready. */
    for (struct peer_fetch *f = c->fetches; f; f = f->cnext) f->c = NULL;
    free(c);
}

/* ------------------------------------------------------------- fetches */

static void kick(struct peer_tier *t)
{
    uint64_t one = 1;
    ssize_t w = write(t->kfd, &one, sizeof one);
    (void)w;
}

static void slice_end(struct peer_fetch *f, uint32_t i, ucs_status_t st)
{
    if (st != UCS_OK) f->status = -1;
    f->req[i] = NULL;
    if (--f->left) return;
    f->t->inflight--;
    struct peer_conn *c = f->c;
    if (c) {
        struct peer_fetch **pp = &c->fetches;
        while (*pp && *pp != f) pp = &(*pp)->cnext;
        if (*pp) *pp = f->cnext;
    }
    f->next = f->t->ready;
    f->t->ready = f;
}

struct slice_ud {
    struct peer_fetch *f;
    uint32_t i;
};

static void get_cb(void *request, ucs_status_t status, void *user_data)
{
    struct peer_fetch *f = user_data;
    uint32_t i = 0;
    while (i < f->n && f->req[i] != request) i++;
    ucp_request_free(request);
    if (i < f->n) slice_end(f, i, status);
}

static void post_slice(struct peer_fetch *f, uint32_t i, uint64_t off, void *local,
                       uint64_t len)
{
    struct peer_conn *c = f->c;
    ucp_request_param_t p = {.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK |
                                             UCP_OP_ATTR_FIELD_USER_DATA,
                             .cb.send = get_cb, .user_data = f};
    f->req[i] = (void *)1; /* posting: get_cb must find a slot */
    ucs_status_ptr_t r = ucp_get_nbx(c->ep, local, len, c->base + off, c->rkey, &p);
    if (r == NULL) slice_end(f, i, UCS_OK);
    else if (UCS_PTR_IS_ERR(r)) slice_end(f, i, UCS_PTR_STATUS(r));
    else if (f->req[i]) f->req[i] = r; /* still in flight */
}

struct peer_fetch *peer_fetch(struct peer_tier *t, struct peer_conn *c,
                              uint64_t off, void *local, uint64_t len,
                              peer_done_fn done, void *arg)
{
    if (!peer_conn_ok(c) || len == 0) return NULL;
    struct peer_fetch *f = calloc(1, sizeof *f);
    if (!f) return NULL;
    f->n = f->left = (uint32_t)((len + PEER_SLICE - 1) / PEER_SLICE);
    if (!(f->req = calloc(f->n, sizeof *f->req))) return free(f), NULL;
    f->t = t;
    f->c = c;
    f->done = done;
    f->arg = arg;
    f->len = len;
    f->cnext = c->fetches;
    c->fetches = f;
    t->inflight++;
    for (uint32_t i = 0; i < f->n; i++) {
        uint64_t o = (uint64_t)i * PEER_SLICE, l = len - o < PEER_SLICE ? len - o : PEER_SLICE;
        post_slice(f, i, off + o, (char *)local + o, l);
    }
    kick(t); /* done runs from peer_progress, even if all completed here */
    return f;
}

void peer_cancel(struct peer_tier *t, struct peer_fetch *f)
{
    f->status = -1;
    for (uint32_t i = 0; i < f->n; i++)
        if (f->req[i] && f->req[i] != (void *)1) ucp_request_cancel(t->w, f->req[i]);
}

static void run_ready(struct peer_tier *t)
{
    while (t->ready) {
        struct peer_fetch *f = t->ready;
        t->ready = f->next;
        if (f->status == 0) t->bytes += f->len;
        else t->failed++;
        f->done(f->arg, f->status);
        free(f->req);
        free(f);
    }
}

void peer_progress(struct peer_tier *t)
{
    uint64_t v;
    ssize_t r = read(t->kfd, &v, sizeof v);
    (void)r;
    if (!t->wakeup) {
        while (ucp_worker_progress(t->w)) {}
        run_ready(t);
        if (t->inflight || t->serving) kick(t); /* poll again next loop turn */
        return;
    }
    do {
        while (ucp_worker_progress(t->w)) {}
        run_ready(t);
    } while (ucp_worker_arm(t->w) == UCS_ERR_BUSY);
    run_ready(t);
}

void peer_serving(struct peer_tier *t, int on)
{
    if (!t) return;
    t->serving = on;
    if (on && !t->wakeup) kick(t);
}

void peer_kick(struct peer_tier *t)
{
    if (t) kick(t);
}
