/*
 * metrics_http.c -- /metrics over HTTP, rendered on the core thread.
 *
 * Design: nng's HTTP server owns the sockets, parsing and keep-alive on its
 * own threads. Its handler for GET /metrics does not read any daemon state:
 * it parks the request's aio in a small queue and, when the queue goes from
 * empty to non-empty, writes an eventfd that sits in the core thread's
 * epoll set (the same hand-off server.c uses for requests, STYLE §7). The
 * core thread renders once for all waiting scrapes and completes their
 * aios. We chose this over a snapshot published under a mutex every tick
 * because the counters then need no copy, no lock and no staleness: a
 * scrape costs one render when it happens and nothing otherwise. A stuck
 * core thread shows up as scrape timeouts, which is what an operator should
 * see. The queue is bounded (QUEUE_MAX); a scrape that finds it full, or
 * arrives while the daemon closes, gets 503 at once. Tests shrink the bound
 * with KVT_FAULT_METRICS_QUEUE=N (0: refuse every scrape) to drive that.
 */
#include "metrics_http.h"

#include <arpa/inet.h>
#include <errno.h>
#include <nng/nng.h>
#include <nng/supplemental/http/http.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "config.h"
#include "log.h"
#include "metrics.h"

#define QUEUE_MAX 64
#define CONTENT_TYPE "text/plain; version=0.0.4; charset=utf-8"

struct metrics_http {
    nng_http_server *srv;
    int efd;
    pthread_mutex_t q_mtx; /* guards q, n_q and closing */
    nng_aio *q[QUEUE_MAX];
    int n_q, max_q;
    int closing;
};

static void finish(nng_aio *aio, uint16_t status, const void *body, size_t len)
{
    nng_http_res *res = NULL;
    int rv = status == 200 ? nng_http_res_alloc(&res)
                           : nng_http_res_alloc_error(&res, status);
    if (rv == 0 && status == 200) {
        rv = nng_http_res_set_header(res, "Content-Type", CONTENT_TYPE);
        if (rv == 0) rv = nng_http_res_copy_data(res, body, len);
    }
    if (rv != 0) {
        if (res) nng_http_res_free(res);
        nng_aio_finish(aio, rv); /* nng answers 500 and closes */
        return;
    }
    nng_aio_set_output(aio, 0, res);
    nng_aio_finish(aio, 0);
}

/* nng thread: park the scrape for the core thread. */
static void on_scrape(nng_aio *aio)
{
    nng_http_handler *h = nng_aio_get_input(aio, 1);
    struct metrics_http *m = nng_http_handler_get_data(h);
    pthread_mutex_lock(&m->q_mtx);
    int refuse = m->closing || m->n_q >= m->max_q, was_empty = m->n_q == 0;
    if (!refuse) m->q[m->n_q++] = aio;
    pthread_mutex_unlock(&m->q_mtx);
    if (refuse) {
        finish(aio, 503, NULL, 0);
        return;
    }
    if (was_empty) {
        uint64_t one = 1;
        ssize_t w = write(m->efd, &one, sizeof one);
        (void)w;
    }
}

/* Take every parked aio (under the lock) into out; returns how many. */
static int take_all(struct metrics_http *m, nng_aio **out, int closing)
{
    pthread_mutex_lock(&m->q_mtx);
    int n = m->n_q;
    memcpy(out, m->q, (size_t)n * sizeof *out);
    m->n_q = 0;
    if (closing) m->closing = 1;
    pthread_mutex_unlock(&m->q_mtx);
    return n;
}

void metrics_http_poll(struct metrics_http *m, const struct met_src *src)
{
    nng_aio *aios[QUEUE_MAX];
    uint64_t cnt;
    ssize_t r = read(m->efd, &cnt, sizeof cnt);
    (void)r;
    int n = take_all(m, aios, 0);
    if (n == 0) return;
    size_t len;
    char *text = metrics_render(src, &len);
    for (int i = 0; i < n; i++) finish(aios[i], 200, text, len);
    free(text);
}

int metrics_http_fd(const struct metrics_http *m)
{
    return m->efd;
}

static int bound_url(struct metrics_http *m, const char *host, char *url,
                     size_t urllen)
{
    nng_sockaddr sa;
    if (nng_http_server_get_addr(m->srv, &sa) != 0) return -1;
    unsigned port = sa.s_family == NNG_AF_INET6 ? ntohs(sa.s_in6.sa_port)
                                                : ntohs(sa.s_in.sa_port);
    snprintf(url, urllen, strchr(host, ':') ? "http://[%s]:%u" : "http://%s:%u",
             host, port);
    return 0;
}

static int add_handler(struct metrics_http *m)
{
    nng_http_handler *h;
    int rv = nng_http_handler_alloc(&h, "/metrics", on_scrape);
    if (rv != 0) return rv;
    if ((rv = nng_http_handler_set_data(h, m, NULL)) == 0 &&
        (rv = nng_http_server_add_handler(m->srv, h)) == 0)
        return 0;
    nng_http_handler_free(h);
    return rv;
}

static int start(struct metrics_http *m, const char *listen, char *url,
                 size_t urllen, char *err, size_t errlen)
{
    char host[CFG_STR_MAX], u[CFG_STR_MAX + 32];
    unsigned port;
    nng_url *nu = NULL;
    if (config_parse_hostport(listen, host, sizeof host, &port) != 0) {
        snprintf(err, errlen, "metrics.listen '%s': want host:port", listen);
        return -1;
    }
    snprintf(u, sizeof u, strchr(host, ':') ? "http://[%s]:%u" : "http://%s:%u",
             host, port);
    int rv = nng_url_parse(&nu, u);
    if (rv == 0) rv = nng_http_server_hold(&m->srv, nu);
    if (nu) nng_url_free(nu);
    if (rv == 0) rv = add_handler(m);
    if (rv == 0) rv = nng_http_server_start(m->srv);
    if (rv == 0 && bound_url(m, host, url, urllen) != 0) rv = NNG_EINTERNAL;
    if (rv != 0) {
        snprintf(err, errlen, "metrics: cannot serve on %s: %s", listen,
                 nng_strerror(rv));
        return -1;
    }
    return 0;
}

static int queue_bound(void)
{
    const char *v = getenv("KVT_FAULT_METRICS_QUEUE");
    int n = v && v[0] ? atoi(v) : QUEUE_MAX;
    return n < 0 || n > QUEUE_MAX ? QUEUE_MAX : n;
}

int metrics_http_open(const char *listen, struct metrics_http **out,
                      char *url, size_t urllen, char *err, size_t errlen)
{
    struct metrics_http *m = calloc(1, sizeof *m);
    if (!m) abort();
    pthread_mutex_init(&m->q_mtx, NULL);
    m->max_q = queue_bound();
    m->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (m->efd < 0) {
        snprintf(err, errlen, "metrics: eventfd: %s", strerror(errno));
        goto fail;
    }
    if (start(m, listen, url, urllen, err, errlen) != 0) goto fail;
    *out = m;
    return 0;
fail:
    metrics_http_close(m);
    return -1;
}

void metrics_http_close(struct metrics_http *m)
{
    nng_aio *aios[QUEUE_MAX];
    if (!m) return;
    int n = take_all(m, aios, 1);
    for (int i = 0; i < n; i++) finish(aios[i], 503, NULL, 0);
    if (m->srv) nng_http_server_release(m->srv);
    if (m->efd >= 0) close(m->efd);
    pthread_mutex_destroy(&m->q_mtx);
    free(m);
}
