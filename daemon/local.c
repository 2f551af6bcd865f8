/*
 * local.c -- the local fast channel.
 *
 * Design: engines on this node send small requests at a high rate, and each
 * one sits on an engine's critical path. Through nng a request/reply round
 * trip crosses six or more threads (the client's caller, poller and task
 * threads, the daemon's, and back); on the machines we measured that cost
 * ~10x a plain Unix-socket round trip. This channel carries the very same
 * Request/Response envelopes, each framed by a 4-byte little-endian length,
 * over a SOCK_STREAM Unix socket whose connections the core thread serves
 * from its own epoll loop: two wake-ups per round trip, the minimum. nng
 * stays the first contact (HELLO says where this socket is) and the only
 * transport for remote clients.
 *
 * Invariants: every fd is non-blocking, so a client that stops reading can
 * never block the core thread; a connection with unsent replies is neither
 * read from nor polled for input until they drain (back-pressure: no
 * EPOLLIN, so a blocked connection cannot make the core spin), and frames
 * already read are served only while less than OUT_CAP bytes are queued,
 * so a connection's queued output is at most OUT_CAP plus one reply (and a
 * reply is at most max_msg_bytes: handlers.c); each poll reads at most
 * READ_MAX bytes per connection (bounded work per loop iteration). At most
 * max_conns connections are open; past that a new one is closed at once.
 * A frame longer than max_msg_bytes gets a KVT_ETOOBIG reply and its bytes
 * are skipped, so the connection stays in step and stays up. Connection
 * ids live above LOCAL_ID_BASE, so leases are owned by either kind of
 * connection alike.
 * A handler may park its request (local_defer, through park.c): the
 * connection is then not read from until the reply goes out, so replies
 * stay in request order; frames that arrived meanwhile are served then
 * (a client that pipelines is not left waiting for bytes it already
 * sent).
 * A reply may carry an fd (local_attach_fd: the pool's memfd for HELLO),
 * passed as SCM_RIGHTS on the reply's first byte; while one waits to go
 * out no further frame is served, so a connection holds at most one.
 */
#include "local.h"

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "kvtier.h"
#include "log.h"

#define READ_MAX (4u << 20)
#define OUT_CAP (256u << 10) /* queued reply bytes past which frames wait */
#define EVENTS 64

struct lconn {
    int fd;
    uint32_t id;
    uint8_t *rbuf, *wbuf;
    size_t rlen, rcap, wlen, woff, wcap;
    uint64_t skip; /* bytes of an oversized frame still to discard */
    uint32_t armed; /* the epoll events set now */
    int parked;     /* a request awaits local_reply_later */
    int resume;     /* whole frames wait in rbuf: come back for them */
    int pass_fd;    /* an fd to send with the reply at pass_at, or -1 */
    size_t pass_at;
    struct lconn *prev, *next;
};

struct local_srv {
    struct local_opts o;
    char *path;
    int lfd, ep;
    struct lconn *conns;
    uint32_t n, next_id;
    uint64_t refused; /* connections closed at accept: max_conns reached */
    struct lconn *cur; /* whose request the handler is running */
    int deferred;      /* ... and it called local_defer */
    int cur_fd;        /* ... and the fd it attached (a copy), or -1 */
};

static void *grow(void *p, size_t *cap, size_t need)
{
    if (need <= *cap) return p;
    size_t ncap = *cap ? *cap : 4096;
    while (ncap < need) ncap *= 2;
    void *np = realloc(p, ncap);
    if (!np) abort(); /* control-plane allocation */
    *cap = ncap;
    return np;
}

static void conn_close(struct local_srv *s, struct lconn *c)
{
    if (c->prev) c->prev->next = c->next;
    else s->conns = c->next;
    if (c->next) c->next->prev = c->prev;
    s->n--;
    epoll_ctl(s->ep, EPOLL_CTL_DEL, c->fd, NULL);
    close(c->fd);
    if (c->pass_fd >= 0) close(c->pass_fd);
    s->o.conn(s->o.arg, c->id, 0);
    free(c->rbuf);
    free(c->wbuf);
    free(c);
}

/* The events follow the state. A parked connection is polled only for
 * its peer going away; one with output queued only for output (and
 * errors, always reported); one with frames waiting in rbuf for output,
 * which is ready at once, so local_poll comes back to serve them. Nothing
 * is armed that could stay ready while nothing can be done: no spin. */
static void set_events(struct local_srv *s, struct lconn *c)
{
    int queued = c->wlen > c->woff;
    int out = queued || (c->resume && !c->parked);
    uint32_t ev_mask = c->parked ? EPOLLRDHUP
                       : out     ? EPOLLOUT
                                 : EPOLLIN | EPOLLRDHUP;
    if (c->parked && queued) ev_mask |= EPOLLOUT;
    if (c->armed == ev_mask) return;
    struct epoll_event ev = {.events = ev_mask, .data.ptr = c};
    epoll_ctl(s->ep, EPOLL_CTL_MOD, c->fd, &ev);
    c->armed = ev_mask;
}

/* Append one framed response. */
static void queue_rsp(struct lconn *c, const Kvtier__Response *rsp)
{
    size_t len = kvtier__response__get_packed_size(rsp);
    c->wbuf = grow(c->wbuf, &c->wcap, c->wlen + 4 + len);
    uint8_t *p = c->wbuf + c->wlen;
    p[0] = (uint8_t)len;
    p[1] = (uint8_t)(len >> 8);
    p[2] = (uint8_t)(len >> 16);
    p[3] = (uint8_t)(len >> 24);
    kvtier__response__pack(rsp, p + 4);
    c->wlen += 4 + len;
}

/* Send from woff: up to pass_at plainly, and from there with the fd. */
static ssize_t send_some(struct lconn *c)
{
    union {
        struct cmsghdr h;
        char b[CMSG_SPACE(sizeof(int))];
    } u;
    size_t n = c->wlen - c->woff;
    if (c->pass_fd < 0 || c->woff > c->pass_at)
        return send(c->fd, c->wbuf + c->woff, n, MSG_NOSIGNAL);
    if (c->woff < c->pass_at)
        return send(c->fd, c->wbuf + c->woff, c->pass_at - c->woff, MSG_NOSIGNAL);
    struct iovec iov = {c->wbuf + c->woff, n};
    struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.b,
                       .msg_controllen = sizeof u.b};
    memset(&u, 0, sizeof u);
    struct cmsghdr *h = CMSG_FIRSTHDR(&m);
    h->cmsg_level = SOL_SOCKET;
    h->cmsg_type = SCM_RIGHTS;
    h->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(h), &c->pass_fd, sizeof(int));
    ssize_t w = sendmsg(c->fd, &m, MSG_NOSIGNAL);
    if (w > 0) { /* the fd went with the first byte */
        close(c->pass_fd);
        c->pass_fd = -1;
    }
    return w;
}

/* 0 while the connection is usable, -1 once it must be closed. */
static int flush_out(struct local_srv *s, struct lconn *c)
{
    while (c->woff < c->wlen) {
        ssize_t w = send_some(c);
        if (w < 0 && errno == EINTR) continue;
        if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            set_events(s, c);
            return 0;
        }
        if (w <= 0) return -1;
        c->woff += (size_t)w;
    }
    c->woff = c->wlen = 0;
    if (c->wcap > OUT_CAP) { /* an idle connection keeps no big buffer */
        free(c->wbuf);
        c->wbuf = NULL;
        c->wcap = 0;
    }
    set_events(s, c);
    return 0;
}

static void too_big(struct lconn *c, uint64_t len, uint64_t max)
{
    char msg[128];
    Kvtier__Response rsp = KVTIER__RESPONSE__INIT;
    snprintf(msg, sizeof msg, "request of %llu bytes is over max_msg_bytes (%llu)",
             (unsigned long long)len, (unsigned long long)max);
    rsp.err = KVT_ETOOBIG;
    rsp.msg = msg;
    queue_rsp(c, &rsp);
}

static void serve_frame(struct local_srv *s, struct lconn *c, const uint8_t *body,
                        size_t len)
{
    Kvtier__Response rsp;
    void *scratch = NULL;
    s->cur = c;
    s->deferred = 0;
    s->cur_fd = -1;
    s->o.handle(s->o.arg, c->id, body, len, &rsp, &scratch);
    s->cur = NULL;
    if (s->deferred) {
        c->parked = 1;
        set_events(s, c);
    } else {
        if (s->cur_fd >= 0) { /* parse_frames serves none while one waits */
            c->pass_fd = s->cur_fd;
            c->pass_at = c->wlen;
            s->cur_fd = -1;
        }
        queue_rsp(c, &rsp);
    }
    if (s->cur_fd >= 0) close(s->cur_fd); /* a parked reply carries none */
    s->cur_fd = -1;
    s->o.free_rsp(&rsp, scratch);
}

int local_attach_fd(struct local_srv *s, int fd)
{
    if (!s || !s->cur || s->cur_fd >= 0) return -1;
    s->cur_fd = fcntl(fd, F_DUPFD_CLOEXEC, 0);
    return s->cur_fd >= 0 ? 0 : -1;
}

struct local_later *local_defer(struct local_srv *s)
{
    if (!s || !s->cur) return NULL;
    s->deferred = 1;
    return (struct local_later *)s->cur;
}

/* A send that fails here is seen again by epoll (EPOLLERR/EPOLLHUP), which
 * closes the connection; closing it here would re-enter the caller. */
void local_reply_later(struct local_srv *s, struct local_later *h,
                       const Kvtier__Response *rsp)
{
    struct lconn *c = (struct lconn *)h;
    c->parked = 0;
    if (!rsp) return; /* its connection is being closed */
    queue_rsp(c, rsp);
    /* Frames read while it was parked wait in rbuf, and no new byte may
     * come to wake us: have local_poll come back (output is ready at
     * once) and serve them there, not here inside another handler. */
    if (c->rlen) c->resume = 1;
    (void)flush_out(s, c); /* also re-arms events */
}

int local_peer_cred(const struct local_srv *s, uint32_t conn, uint32_t *uid,
                    uint32_t *gid)
{
    for (const struct lconn *c = s ? s->conns : NULL; c; c = c->next) {
        if (c->id != conn) continue;
        struct ucred cr;
        socklen_t len = sizeof cr;
        if (getsockopt(c->fd, SOL_SOCKET, SO_PEERCRED, &cr, &len) != 0) return -1;
        *uid = cr.uid;
        *gid = cr.gid;
        return 0;
    }
    return -1;
}

int local_peer_uid(const struct local_srv *s, uint32_t conn, uint64_t *uid)
{
    uint32_t u, g;
    if (local_peer_cred(s, conn, &u, &g) != 0) return -1;
    *uid = u;
    return 0;
}

/* Serve the complete frames in rbuf while output stays under OUT_CAP;
 * keep the rest (resume says whole frames may be among it). */
static void parse_frames(struct local_srv *s, struct lconn *c)
{
    size_t off = 0;
    c->resume = 0;
    while (!c->parked) {
        if (c->wlen >= OUT_CAP || c->pass_fd >= 0) {
            c->resume = c->rlen > off;
            break;
        }
        if (c->skip) {
            size_t n = c->rlen - off < c->skip ? c->rlen - off : (size_t)c->skip;
            off += n;
            c->skip -= n;
            if (c->skip) break;
        }
        if (c->rlen - off < 4) break;
        const uint8_t *p = c->rbuf + off;
        uint64_t len = p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
                       (uint32_t)p[3] << 24;
        if (len > s->o.max_msg_bytes) {
            too_big(c, len, s->o.max_msg_bytes);
            off += 4;
            c->skip = len;
            continue;
        }
        if (c->rlen - off - 4 < len) break;
        serve_frame(s, c, p + 4, (size_t)len);
        off += 4 + (size_t)len;
    }
    memmove(c->rbuf, c->rbuf + off, c->rlen - off);
    c->rlen -= off;
}

/* Serve the whole frames already read (after a parked request was
 * answered). -1: close the connection. */
static int serve_buffered(struct local_srv *s, struct lconn *c)
{
    parse_frames(s, c);
    return flush_out(s, c);
}

/* Read what is there (bounded), serve it. -1: close the connection. */
static int on_readable(struct local_srv *s, struct lconn *c)
{
    size_t got = 0;
    if (c->resume && !c->parked) parse_frames(s, c); /* first what is read */
    while (got < READ_MAX && c->wlen == 0 && !c->parked) {
        c->rbuf = grow(c->rbuf, &c->rcap, c->rlen + 65536);
        ssize_t r = recv(c->fd, c->rbuf + c->rlen, c->rcap - c->rlen, 0);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
        if (r <= 0) return -1;
        c->rlen += (size_t)r;
        got += (size_t)r;
        parse_frames(s, c);
    }
    return flush_out(s, c);
}

/* Past max_conns a connection is closed at once: its client sees the
 * channel closed and stays on nng (client.c go_local). */
static int refuse(struct local_srv *s, int fd)
{
    if (!s->o.max_conns || s->n < s->o.max_conns) return 0;
    if (s->refused++ % 1024 == 0) /* one line per 1024, not a flood */
        log_warn("local", "%u connections open (daemon.local_max_conns): "
                 "refusing more (%llu refused so far)", s->n,
                 (unsigned long long)s->refused);
    close(fd);
    return 1;
}

static void accept_all(struct local_srv *s)
{
    for (;;) {
        int fd = accept4(s->lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
                log_warn("local", "accept: %s", strerror(errno));
            return;
        }
        if (refuse(s, fd)) continue;
        struct lconn *c = calloc(1, sizeof *c);
        if (!c) abort();
        c->fd = fd;
        c->pass_fd = -1;
        c->id = LOCAL_ID_BASE | (s->next_id++ & 0x7fffffffu);
        c->armed = EPOLLIN | EPOLLRDHUP;
        struct epoll_event ev = {.events = c->armed, .data.ptr = c};
        epoll_ctl(s->ep, EPOLL_CTL_ADD, fd, &ev);
        c->next = s->conns;
        if (s->conns) s->conns->prev = c;
        s->conns = c;
        s->n++;
        s->o.conn(s->o.arg, c->id, 1);
    }
}

void local_poll(struct local_srv *s)
{
    struct epoll_event evs[EVENTS];
    int n = epoll_wait(s->ep, evs, EVENTS, 0);
    for (int i = 0; i < n; i++) {
        struct lconn *c = evs[i].data.ptr;
        if (!c) {
            accept_all(s);
            continue;
        }
        int bad = 0;
        /* A client awaiting a parked reply never hangs up on purpose. */
        if (c->parked && (evs[i].events & (EPOLLRDHUP | EPOLLHUP | EPOLLERR)))
            bad = 1;
        if (!bad && (evs[i].events & EPOLLOUT)) bad = flush_out(s, c);
        if (!bad && (evs[i].events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR)))
            bad = on_readable(s, c);
        else if (!bad && c->resume && !c->parked && c->wlen == 0)
            bad = serve_buffered(s, c);
        if (bad) conn_close(s, c);
    }
}

static int bind_listen(struct local_srv *s, char *err, size_t errlen)
{
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    if (strlen(s->path) >= sizeof a.sun_path) {
        snprintf(err, errlen, "local socket path too long: %s", s->path);
        return -1;
    }
    memcpy(a.sun_path, s->path, strlen(s->path) + 1);
    unlink(s->path);
    s->lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (s->lfd < 0 || bind(s->lfd, (struct sockaddr *)&a, sizeof a) != 0 ||
        chmod(s->path, s->o.mode) != 0 || listen(s->lfd, 256) != 0) {
        snprintf(err, errlen, "local socket %s: %s", s->path, strerror(errno));
        return -1;
    }
    if (s->o.group && s->o.group[0]) {
        struct group *g = getgrnam(s->o.group);
        if (!g || chown(s->path, (uid_t)-1, g->gr_gid) != 0) {
            snprintf(err, errlen, "local socket %s: cannot give it to group %s",
                     s->path, s->o.group);
            return -1;
        }
    }
    return 0;
}

int local_open(const struct local_opts *o, struct local_srv **out, char *err,
               size_t errlen)
{
    struct local_srv *s = calloc(1, sizeof *s);
    if (!s || !(s->path = strdup(o->path))) abort();
    s->o = *o;
    s->lfd = -1;
    s->cur_fd = -1;
    s->ep = epoll_create1(EPOLL_CLOEXEC);
    if (s->ep < 0) {
        snprintf(err, errlen, "epoll: %s", strerror(errno));
        goto fail;
    }
    if (bind_listen(s, err, errlen) != 0) goto fail;
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = NULL};
    epoll_ctl(s->ep, EPOLL_CTL_ADD, s->lfd, &ev);
    log_info("local", "fast channel on %s", s->path);
    *out = s;
    return 0;
fail:
    local_close(s);
    return -1;
}

int local_fd(const struct local_srv *s)
{
    return s->ep;
}

uint32_t local_count(const struct local_srv *s)
{
    return s ? s->n : 0;
}

uint64_t local_refused(const struct local_srv *s)
{
    return s ? s->refused : 0;
}

void local_close(struct local_srv *s)
{
    if (!s) return;
    while (s->conns) conn_close(s, s->conns);
    if (s->lfd >= 0) {
        close(s->lfd);
        unlink(s->path);
    }
    if (s->ep >= 0) close(s->ep);
    free(s->path);
    free(s);
}
