/*
 * test_local_bounds.c -- what one fast-channel client can make the daemon
 * hold (issue 11, item 5): a client that sends inline GETs of a large chunk
 * and never reads must not grow the daemon past a stated bound, nor make
 * its core loop spin; connections past daemon.local_max_conns are refused
 * and their clients stay on nng; an inline reply over max_msg_bytes is
 * KVT_ETOOBIG over both transports, never an abort.
 *
 * The memory bound checked: while the client does not read, the daemon's
 * VmRSS grows by less than 2 * max_msg_bytes + 64 MiB (one queued reply,
 * the copy it was packed from, buffer doubling and allocator slack).
 * Unbounded, the 64 requests sent queue 64 * 8 MiB = 512 MiB.
 */
#include <poll.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "client_internal.h"
#include "daemon.h"
#include "kvtier.h"

#define MAX_MSG (32ull << 20)
#define SMALL (8u << 20)  /* fits an inline reply */
#define BIG (36u << 20)   /* does not */
#define MAX_CONNS 8
#define N_REQ 64

static struct tdaemon D;

static int setup(void **state)
{
    (void)state;
    const char *extra[] = {"--max-msg-bytes", "32M", "--local-max-conns", "8", NULL};
    if (td_start(&D, extra) != 0) return -1;
    kvt_client *c = td_connect(&D);
    if (!c) return -1;
    static uint8_t small[SMALL], big[BIG];
    td_fill(small, SMALL, 1);
    td_fill(big, BIG, 2);
    kvt_key k[2] = {td_key(1), td_key(2)};
    const void *bufs[2] = {small, big};
    size_t sizes[2] = {SMALL, BIG};
    size_t n_new = 0;
    kvt_err e = kvt_put(c, "b", k, bufs, sizes, 2, NULL, &n_new);
    kvt_close(c);
    return e == KVT_OK && n_new == 2 ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    int rc = td_stop(&D);
    td_cleanup(&D);
    return rc;
}

static int raw_connect(void)
{
    int fd = td_fast_connect(&D);
    assert_true(fd >= 0);
    return fd;
}

/* A GET of chunk `seed` with its bytes inline; body only (no length). */
static size_t get_body(uint8_t *buf, uint64_t seed)
{
    Kvtier__Request q = KVTIER__REQUEST__INIT;
    Kvtier__Get g = KVTIER__GET__INIT;
    kvt_key k = td_key(seed);
    ProtobufCBinaryData key = {KVT_KEY_LEN, k.b};
    g.ns = "b";
    g.n_keys = 1;
    g.keys = &key;
    g.inline_ = 1;
    q.body_case = KVTIER__REQUEST__BODY_GET;
    q.get = &g;
    return kvtier__request__pack(&q, buf);
}

static size_t frame_of(uint8_t *buf, size_t body)
{
    for (int i = 0; i < 4; i++) buf[i] = (uint8_t)(body >> (8 * i));
    return body + 4;
}

static long rss_kib(pid_t pid)
{
    char path[64], line[256];
    long kib = -1;
    snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "VmRSS: %ld", &kib) == 1) break;
    fclose(f);
    return kib;
}

/* utime + stime of pid, in seconds. */
static double cpu_s(pid_t pid)
{
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    const char *p = strrchr(buf, ')');
    assert_non_null(p);
    unsigned long ut = 0, st = 0;
    /* after ")": state, then fields 4..13, then utime (14) and stime (15) */
    assert_int_equal(sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu",
                            &ut, &st), 2);
    return (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
}

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000};
    nanosleep(&ts, NULL);
}

static void serving(void)
{
    kvt_client *c = td_connect(&D);
    assert_non_null(c);
    kvt_stats s;
    assert_int_equal(kvt_stats_get(c, &s), KVT_OK);
    static uint8_t got[SMALL];
    size_t size = 0;
    kvt_key k = td_key(1);
    assert_int_equal(kvt_get_copy(c, "b", &k, got, sizeof got, &size), KVT_OK);
    assert_int_equal(size, SMALL);
    kvt_close(c);
}

static int read_all(int fd, void *buf, size_t n)
{
    uint8_t *p = buf;
    while (n) {
        ssize_t r = read(fd, p, n);
        if (r <= 0) return -1;
        p += r;
        n -= (size_t)r;
    }
    return 0;
}

/* Send N_REQ inline GETs of the 8 MiB chunk; read nothing. */
static int blocked_client(void)
{
    int fd = raw_connect();
    uint8_t frames[N_REQ * 128];
    size_t len = 0;
    for (int i = 0; i < N_REQ; i++)
        len += frame_of(frames + len, get_body(frames + len + 4, 1));
    assert_int_equal(write(fd, frames, len), (ssize_t)len);
    return fd;
}

static void test_never_reader_bounded(void **state)
{
    (void)state;
    serving();
    long rss0 = rss_kib(D.pid);
    int fd = blocked_client();
    sleep_ms(500);
    long rss1 = rss_kib(D.pid);
    long bound = (long)((2 * MAX_MSG + (64ull << 20)) >> 10);
    printf("# rss %ld KiB -> %ld KiB while blocked (bound +%ld KiB)\n", rss0, rss1,
           bound);
    assert_true(rss1 - rss0 < bound);
    /* the core loop does not spin on the blocked connection */
    double t0 = cpu_s(D.pid);
    sleep_ms(1000);
    double used = cpu_s(D.pid) - t0;
    printf("# daemon cpu while blocked: %.3f s in 1 s\n", used);
    assert_true(used < 0.5);
    serving(); /* others are served meanwhile */
    assert_true(rss_kib(D.pid) - rss0 < bound);
    /* now it reads: every reply comes, whole and in step */
    uint8_t *body = malloc(SMALL + 4096);
    assert_non_null(body);
    for (int i = 0; i < N_REQ; i++) {
        uint8_t hdr[4];
        assert_int_equal(read_all(fd, hdr, 4), 0);
        size_t n = (size_t)hdr[0] | (size_t)hdr[1] << 8 | (size_t)hdr[2] << 16 |
                   (size_t)hdr[3] << 24;
        assert_true(n <= SMALL + 4096);
        assert_int_equal(read_all(fd, body, n), 0);
        Kvtier__Response *r = kvtier__response__unpack(NULL, n, body);
        assert_non_null(r);
        assert_int_equal(r->err, 0);
        assert_int_equal(r->get->n_data, 1);
        assert_int_equal(r->get->data[0].len, SMALL);
        kvtier__response__free_unpacked(r, NULL);
    }
    free(body);
    close(fd);
    serving();
}

static void test_never_reader_closes(void **state)
{
    (void)state;
    int fd = blocked_client();
    sleep_ms(200);
    close(fd);
    serving();
    assert_true(td_alive(&D));
}

static int stats_ok(int fd)
{
    uint8_t frame[64];
    Kvtier__Request q = KVTIER__REQUEST__INIT;
    Kvtier__Stats st = KVTIER__STATS__INIT;
    q.body_case = KVTIER__REQUEST__BODY_STATS;
    q.stats = &st;
    size_t n = frame_of(frame, kvtier__request__pack(&q, frame + 4));
    if (write(fd, frame, n) != (ssize_t)n) return -1;
    struct pollfd p = {fd, POLLIN, 0};
    if (poll(&p, 1, 5000) != 1) return -1;
    uint8_t hdr[4], body[4096];
    if (read_all(fd, hdr, 4) != 0) return -1;
    size_t len = (size_t)hdr[0] | (size_t)hdr[1] << 8 | (size_t)hdr[2] << 16;
    return len <= sizeof body ? read_all(fd, body, len) : -1;
}

/* Past the cap: closed at once (read sees EOF, no hang). */
static int refused(int fd)
{
    struct pollfd p = {fd, POLLIN, 0};
    if (poll(&p, 1, 5000) != 1) return 0;
    char b;
    return read(fd, &b, 1) <= 0;
}

static void test_conn_cap(void **state)
{
    (void)state;
    sleep_ms(200); /* earlier tests' connections are gone */
    int fds[MAX_CONNS];
    for (int i = 0; i < MAX_CONNS; i++) {
        fds[i] = raw_connect();
        assert_int_equal(stats_ok(fds[i]), 0);
    }
    int extra = raw_connect();
    assert_true(refused(extra));
    close(extra);
    int logged = 0;
    for (int i = 0; i < 50 && !(logged = td_log_has(&D, "local_max_conns")); i++)
        sleep_ms(100);
    assert_true(logged);
    /* a library client is refused there too and stays on nng */
    serving();
    for (int i = 0; i < MAX_CONNS; i++) assert_int_equal(stats_ok(fds[i]), 0);
    for (int i = 0; i < MAX_CONNS; i++) close(fds[i]);
    sleep_ms(200);
    int again = raw_connect();
    assert_int_equal(stats_ok(again), 0);
    close(again);
}

static void inline_get(kvt_client *c, uint64_t seed, int want_err, size_t want_len)
{
    uint8_t body[128];
    size_t n = get_body(body, seed);
    Kvtier__Response *r = NULL;
    assert_int_equal(kvtc_call_raw(c, body, n, &r), KVT_OK);
    assert_int_equal(r->err, want_err);
    if (!want_err) {
        assert_int_equal(r->get->n_data, 1);
        assert_int_equal(r->get->data[0].len, want_len);
    }
    kvtier__response__free_unpacked(r, NULL);
}

/* Over the fast channel, then over nng: the 36 MiB chunk does not fit a
 * 32 MiB reply, the 8 MiB one does, and each connection stays in step. */
static void test_inline_too_big(void **state)
{
    (void)state;
    for (int nng = 0; nng < 2; nng++) {
        if (nng) setenv("KVTIER_NO_FAST", "1", 1);
        kvt_client *c = td_connect(&D);
        unsetenv("KVTIER_NO_FAST");
        assert_non_null(c);
        inline_get(c, 2, KVT_ETOOBIG, 0);
        inline_get(c, 1, 0, SMALL);
        inline_get(c, 2, KVT_ETOOBIG, 0);
        kvt_close(c);
    }
    assert_true(td_alive(&D));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_never_reader_bounded),
        cmocka_unit_test(test_never_reader_closes),
        cmocka_unit_test(test_conn_cap),
        cmocka_unit_test(test_inline_too_big),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
