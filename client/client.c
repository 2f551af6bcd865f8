/*
 * client.c -- libkvtier: connection, requests, and the mapped pool.
 *
 * Design: a kvt_client first dials the daemon with an nng req0 socket and
 * says HELLO; the answer names the DRAM pool, which is mapped MAP_SHARED
 * when the file can be opened (ipc:// only: a tcp:// daemon is remote), and
 * the daemon's fast channel, a Unix stream socket served by the daemon's
 * core thread. A local client moves to that channel and closes nng: a
 * round trip there costs a fraction of nng's (see daemon/local.c). Remote
 * clients, and local ones with KVTIER_NO_FAST set, stay on nng, whose
 * automatic resend is switched off, because resending a PUT_BEGIN would
 * reserve space twice. Every call is one exchange under the client's lock.
 * Offsets the daemon returns are checked against the mapping before they
 * become pointers, so a confused daemon cannot make the library write
 * outside the pool.
 * A daemon whose pool is a sealed memfd (HELLO says pool_memfd) names no
 * file: its fd comes with the HELLO answer on the fast channel
 * (SCM_RIGHTS), to clients it lets map the pool. Such a client takes the
 * fast channel for that even with KVTIER_NO_FAST, and then drops it.
 * A tenant with a pool of its own is answered the same way (no path, the
 * fd on the fast channel), and HELLO says which pool (pool) and where its
 * bytes lie among the daemon's (pool_offset): offsets in answers are the
 * daemon's, global, so the library maps that one pool, takes only slots
 * the answer places in it, and subtracts pool_offset.
 */
#include "client_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <nng/nng.h>
#include <nng/protocol/reqrep0/req.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "tlsconf.h"
#include "wire.h"

#define RAW_ID UINT64_MAX /* raw calls: any response id is theirs */

struct kvt_client {
    nng_socket sock;
    int open;
    int fd;         /* the daemon's fast channel, or -1: nng carries all */
    int timeout_ms;
    pthread_mutex_t mtx; /* serialises requests on this client */
    uint64_t next_id;
    uint8_t *pool;
    uint64_t pool_bytes;
    uint64_t pool_off; /* global offset of the mapped pool's first byte */
    uint32_t pool_id;  /* which pool (0: the default, else a tenant's) */
    int rx_fd;      /* an fd that came with the last reply, or -1 */
    int want_fd;    /* read replies with recvmsg to catch one */
    uint64_t client_id;
    uint32_t max_keys;
    char last_err[256];
    char gpu[160];
};

static long long mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void set_err(kvt_client *c, const char *msg)
{
    snprintf(c->last_err, sizeof c->last_err, "%s", msg ? msg : "");
}

const char *kvt_last_error(const kvt_client *c)
{
    return c ? c->last_err : "no client";
}

int kvt_zero_copy(const kvt_client *c)
{
    return c && c->pool != NULL;
}

void kvt_set_timeout(kvt_client *c, int ms)
{
    c->timeout_ms = ms;
    if (!c->open) return;
    nng_socket_set_ms(c->sock, NNG_OPT_RECVTIMEO, ms);
    nng_socket_set_ms(c->sock, NNG_OPT_SENDTIMEO, ms);
}

/* ------------------------------------------------- the fast channel -- */

/* Wait for fd to be ready for events until deadline (ms, monotonic). */
static kvt_err wait_fd(int fd, short events, long long deadline)
{
    for (;;) {
        struct pollfd p = {fd, events, 0};
        long long left = deadline - mono_ms();
        if (left <= 0) return KVT_ETIMEDOUT;
        int r = poll(&p, 1, (int)(left > 1000000 ? 1000000 : left));
        if (r > 0) return KVT_OK;
        if (r < 0 && errno != EINTR) return KVT_EIO;
    }
}

/* Microseconds a reader polls before it sleeps: a reply usually comes
 * within tens of microseconds, and waking a sleeping thread on another CPU
 * costs about as much again on virtual machines. KVTIER_SPIN_US=0 turns
 * it off. */
static long spin_us(void)
{
    static long v = -1;
    if (v < 0) {
        const char *e = getenv("KVTIER_SPIN_US");
        v = e && *e ? strtol(e, NULL, 10) : 50;
        if (v < 0) v = 0;
    }
    return v;
}

static long long mono_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

/* recv, keeping an fd that comes along (SCM_RIGHTS) in *rx_fd: the
 * first one only, any other is closed. */
static ssize_t recv_fd(int fd, void *buf, size_t n, int *rx_fd)
{
    union {
        struct cmsghdr h;
        char b[CMSG_SPACE(4 * sizeof(int))];
    } u;
    struct iovec iov = {buf, n};
    struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.b,
                       .msg_controllen = sizeof u.b};
    ssize_t r = recvmsg(fd, &m, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    if (r <= 0) return r;
    for (struct cmsghdr *h = CMSG_FIRSTHDR(&m); h; h = CMSG_NXTHDR(&m, h)) {
        if (h->cmsg_level != SOL_SOCKET || h->cmsg_type != SCM_RIGHTS) continue;
        size_t k = (h->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (size_t i = 0; i < k; i++) {
            int got;
            memcpy(&got, CMSG_DATA(h) + i * sizeof(int), sizeof got);
            if (*rx_fd < 0) *rx_fd = got;
            else close(got);
        }
    }
    return r;
}

static kvt_err io_all(int fd, void *buf, size_t n, int wr, long long deadline,
                      int *rx_fd)
{
    uint8_t *p = buf;
    long long spin_end = wr ? 0 : mono_us() + spin_us();
    while (n) {
        ssize_t r = wr    ? send(fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT)
                    : rx_fd ? recv_fd(fd, p, n, rx_fd)
                          : recv(fd, p, n, MSG_DONTWAIT);
        if (r > 0) {
            p += r;
            n -= (size_t)r;
            continue;
        }
        if (r == 0) return KVT_ECLOSED;
        if (errno == EINTR) continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK) return KVT_ECLOSED;
        if (!wr && mono_us() < spin_end) continue;
        kvt_err e = wait_fd(fd, wr ? POLLOUT : POLLIN, deadline);
        if (e) return e;
    }
    return KVT_OK;
}

/* One framed exchange; frame holds 4 length bytes then the body. A failed
 * exchange leaves the stream out of step, so the channel is closed. */
static kvt_err local_xfer(kvt_client *c, uint8_t *frame, size_t body_len,
                          Kvtier__Response **rsp)
{
    long long deadline = mono_ms() + c->timeout_ms;
    uint8_t hdr[4];
    for (int i = 0; i < 4; i++) frame[i] = (uint8_t)(body_len >> (8 * i));
    int *rx = c->want_fd ? &c->rx_fd : NULL;
    kvt_err e = io_all(c->fd, frame, body_len + 4, 1, deadline, NULL);
    if (!e) e = io_all(c->fd, hdr, 4, 0, deadline, rx);
    size_t len = (size_t)hdr[0] | (size_t)hdr[1] << 8 | (size_t)hdr[2] << 16 |
                 (size_t)hdr[3] << 24;
    uint8_t *in = e ? NULL : malloc(len ? len : 1);
    if (!e && !in) e = KVT_ENOMEM;
    if (!e) e = io_all(c->fd, in, len, 0, deadline, rx);
    if (!e && !(*rsp = kvtier__response__unpack(NULL, len, in))) e = KVT_EPROTO;
    free(in);
    if (e && e != KVT_EPROTO) {
        close(c->fd);
        c->fd = -2; /* broken: every later call fails */
    }
    return e;
}

static kvt_err check_id(kvt_client *c, Kvtier__Response **rsp, uint64_t id)
{
    if (id != RAW_ID && (*rsp)->id != id) {
        set_err(c, "response id does not match the request");
        kvtier__response__free_unpacked(*rsp, NULL);
        return KVT_EPROTO;
    }
    return KVT_OK;
}

static kvt_err exchange(kvt_client *c, nng_msg *out, Kvtier__Response **rsp,
                        uint64_t id)
{
    int rv = nng_sendmsg(c->sock, out, 0);
    if (rv != 0) {
        nng_msg_free(out);
        set_err(c, nng_strerror(rv));
        return wire_nng_err(rv);
    }
    nng_msg *in;
    if ((rv = nng_recvmsg(c->sock, &in, 0)) != 0) {
        set_err(c, nng_strerror(rv));
        return wire_nng_err(rv);
    }
    *rsp = kvtier__response__unpack(NULL, nng_msg_len(in), nng_msg_body(in));
    nng_msg_free(in);
    if (!*rsp) {
        set_err(c, "undecodable response");
        return KVT_EPROTO;
    }
    return check_id(c, rsp, id);
}

/* Send body (packed by pack(), len bytes) on whichever channel is up. */
static kvt_err roundtrip(kvt_client *c, const Kvtier__Request *q, const void *raw,
                         size_t len, Kvtier__Response **rsp, uint64_t id)
{
    if (c->fd == -2) return KVT_ECLOSED;
    if (c->fd < 0) {
        nng_msg *out;
        int rv = nng_msg_alloc(&out, len);
        if (rv != 0) return wire_nng_err(rv);
        if (q) kvtier__request__pack(q, nng_msg_body(out));
        else memcpy(nng_msg_body(out), raw, len);
        return exchange(c, out, rsp, id);
    }
    uint8_t *frame = malloc(len + 4);
    if (!frame) return KVT_ENOMEM;
    if (q) kvtier__request__pack(q, frame + 4);
    else memcpy(frame + 4, raw, len);
    kvt_err e = local_xfer(c, frame, len, rsp);
    free(frame);
    if (e) set_err(c, kvt_strerror(e));
    return e ? e : check_id(c, rsp, id);
}

kvt_err kvtc_call(kvt_client *c, Kvtier__Request *q, Kvtier__Response **rsp)
{
    pthread_mutex_lock(&c->mtx);
    q->id = ++c->next_id;
    kvt_err e = roundtrip(c, q, NULL, kvtier__request__get_packed_size(q), rsp, q->id);
    if (e == KVT_OK && (*rsp)->err != 0) {
        e = (kvt_err)(*rsp)->err;
        set_err(c, (*rsp)->msg);
        kvtier__response__free_unpacked(*rsp, NULL);
        *rsp = NULL;
    }
    pthread_mutex_unlock(&c->mtx);
    return e;
}

kvt_err kvtc_call_raw(kvt_client *c, const void *buf, size_t len,
                      Kvtier__Response **rsp)
{
    pthread_mutex_lock(&c->mtx);
    kvt_err e = roundtrip(c, NULL, buf, len, rsp, RAW_ID);
    pthread_mutex_unlock(&c->mtx);
    return e;
}

/* Map the pool through fd (closed here), if it holds at least bytes: a
 * shorter one would fault on access. */
static void map_fd(kvt_client *c, int fd, uint64_t bytes)
{
    struct stat st;
    void *p = MAP_FAILED;
    if (fstat(fd, &st) == 0 && (uint64_t)st.st_size >= bytes && bytes)
        p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED) return;
    c->pool = p;
    c->pool_bytes = bytes;
}

static void map_pool(kvt_client *c, const char *path, uint64_t bytes)
{
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0) return; /* remote or no permission: copying calls only */
    map_fd(c, fd, bytes);
}

static kvt_err hello(kvt_client *c, int local);

/* Move to the daemon's fast channel: connect, HELLO again there (leases
 * belong to the connection that makes them), and drop the nng socket.
 * For a memfd pool the HELLO answer there brings the pool's fd; with
 * KVTIER_NO_FAST the channel is used for that alone and nng stays. Any
 * failure leaves nng in charge, which works, only slower. */
static void go_local(kvt_client *c, const char *path, int memfd, uint64_t bytes)
{
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    int stay = !getenv("KVTIER_NO_FAST");
    if ((!stay && !memfd) || strlen(path) >= sizeof a.sun_path) return;
    memcpy(a.sun_path, path, strlen(path) + 1);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return;
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        close(fd);
        return;
    }
    c->fd = fd;
    c->want_fd = memfd;
    kvt_err e = hello(c, 0);
    c->want_fd = 0;
    if (c->rx_fd >= 0) map_fd(c, c->rx_fd, bytes);
    c->rx_fd = -1;
    if (e != KVT_OK || !stay) {
        if (c->fd >= 0) close(c->fd);
        c->fd = -1;
        return;
    }
    nng_close(c->sock);
    c->open = 0;
}

/* Only ipc:// peers share our host; a tcp:// daemon is remote even when
 * its pool path happens to exist here. */
static kvt_err hello(kvt_client *c, int local)
{
    Kvtier__Request q = KVTIER__REQUEST__INIT;
    Kvtier__Hello h = KVTIER__HELLO__INIT;
    Kvtier__Response *r;
    h.proto_version = KVT_PROTO_VERSION;
    h.client_name = "libkvtier";
    h.pid = (uint32_t)getpid();
    q.body_case = KVTIER__REQUEST__BODY_HELLO;
    q.hello = &h;
    kvt_err e = kvtc_call(c, &q, &r);
    if (e != KVT_OK) return e;
    if (r->body_case != KVTIER__RESPONSE__BODY_HELLO) {
        kvtier__response__free_unpacked(r, NULL);
        return KVT_EPROTO;
    }
    c->client_id = r->hello->client_id;
    c->pool_off = r->hello->pool_offset;
    c->pool_id = r->hello->pool;
    c->max_keys = r->hello->max_keys;
    snprintf(c->gpu, sizeof c->gpu, "%s", r->hello->gpu);
    int memfd = r->hello->pool_memfd;
    uint64_t bytes = r->hello->pool_bytes;
    if (local && !memfd && r->hello->pool_path[0])
        map_pool(c, r->hello->pool_path, bytes);
    char path[sizeof ((struct sockaddr_un *)0)->sun_path] = "";
    if (local && (c->pool || memfd))
        snprintf(path, sizeof path, "%s", r->hello->local_path);
    kvtier__response__free_unpacked(r, NULL);
    if (path[0]) go_local(c, path, memfd, bytes);
    return KVT_OK;
}

static const char *default_url(const char *url, char *buf, size_t len)
{
    if (!url || !url[0]) url = getenv("KVTIER_SOCKET");
    if (!url || !url[0]) url = "./var/kvtierd.sock";
    if (strstr(url, "://")) return url;
    snprintf(buf, len, "ipc://%s", url);
    return buf;
}

/* tls+tcp:// urls present the certificate in KVTIER_TLS_CERT (its key in
 * KVTIER_TLS_KEY) and check the daemon's against KVTIER_TLS_CA (and its
 * name against KVTIER_TLS_SERVER_NAME when set). 0 or an nng error. */
static int dial(kvt_client *c, const char *url)
{
    nng_dialer d;
    nng_tls_config *tls = NULL;
    char err[256];
    if (strncmp(url, "tls+tcp://", 10) != 0) return nng_dial(c->sock, url, NULL, 0);
    struct tlsconf_files f = {getenv("KVTIER_TLS_CA"), getenv("KVTIER_TLS_CERT"),
                              getenv("KVTIER_TLS_KEY")};
    const char *name = getenv("KVTIER_TLS_SERVER_NAME");
    if (tlsconf_build(&tls, 0, &f, name && name[0] ? name : NULL, err, sizeof err) != 0) {
        set_err(c, err);
        return NNG_EINVAL;
    }
    int rv = nng_dialer_create(&d, c->sock, url);
    if (rv == 0) rv = nng_dialer_set_ptr(d, NNG_OPT_TLS_CONFIG, tls);
    if (rv == 0) rv = nng_dialer_start(d, 0);
    nng_tls_config_free(tls); /* the dialer holds its own reference */
    return rv;
}

kvt_err kvt_connect(const char *url, kvt_client **out)
{
    char buf[1100];
    if (!out) return KVT_EINVAL;
    kvt_client *c = calloc(1, sizeof *c);
    if (!c) return KVT_ENOMEM;
    pthread_mutex_init(&c->mtx, NULL);
    c->fd = -1;
    c->rx_fd = -1;
    c->timeout_ms = 10000;
    url = default_url(url, buf, sizeof buf);
    int rv = nng_req0_open(&c->sock);
    if (rv == 0) {
        c->open = 1;
        nng_socket_set_ms(c->sock, NNG_OPT_REQ_RESENDTIME, NNG_DURATION_INFINITE);
        nng_socket_set_size(c->sock, NNG_OPT_RECVMAXSZ, 0);
        kvt_set_timeout(c, 10000);
        rv = dial(c, url);
    }
    kvt_err e = rv ? wire_nng_err(rv) : hello(c, strncmp(url, "ipc://", 6) == 0);
    if (e != KVT_OK) {
        kvt_close(c);
        return e;
    }
    *out = c;
    return KVT_OK;
}

void kvt_close(kvt_client *c)
{
    if (!c) return;
    if (c->open) nng_close(c->sock);
    if (c->fd >= 0) close(c->fd);
    if (c->pool) munmap(c->pool, c->pool_bytes);
    pthread_mutex_destroy(&c->mtx);
    free(c);
}

void *kvtc_pool_ptr(const kvt_client *c, uint32_t pool, uint64_t off, uint64_t size)
{
    if (!c->pool || pool != c->pool_id || off < c->pool_off) return NULL;
    off -= c->pool_off;
    if (off > c->pool_bytes || size > c->pool_bytes - off) return NULL;
    return c->pool + off;
}

uint32_t kvtc_pool_id(const kvt_client *c)
{
    return c->pool_id;
}

const char *kvtc_gpu(const kvt_client *c)
{
    return c->gpu;
}

int kvtc_timeout_ms(const kvt_client *c)
{
    return c->timeout_ms;
}
