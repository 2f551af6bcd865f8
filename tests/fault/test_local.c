/*
 * test_local.c -- the fast channel under abuse: half frames, oversized
 * frames, a client that writes and never reads, and the nng path for local
 * clients that switch the fast channel off. The daemon must keep serving
 * everyone else throughout.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cmocka.h>

#include "client_internal.h"
#include "daemon.h"
#include "kvtier.h"

static struct tdaemon D;

static int setup(void **state)
{
    (void)state;
    const char *extra[] = {"--max-msg-bytes", "1M", NULL};
    if (td_start(&D, extra) != 0) return -1;
    return 0;
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

static void serving(void)
{
    kvt_client *c = td_connect(&D);
    kvt_stats s;
    assert_int_equal(kvt_stats_get(c, &s), KVT_OK);
    kvt_close(c);
}

static size_t stats_frame(uint8_t *buf)
{
    Kvtier__Request q = KVTIER__REQUEST__INIT;
    Kvtier__Stats st = KVTIER__STATS__INIT;
    q.body_case = KVTIER__REQUEST__BODY_STATS;
    q.stats = &st;
    size_t len = kvtier__request__pack(&q, buf + 4);
    buf[0] = (uint8_t)len;
    buf[1] = buf[2] = buf[3] = 0;
    return len + 4;
}

static void test_half_frames(void **state)
{
    (void)state;
    int fd = raw_connect();
    assert_int_equal(write(fd, "\x10", 1), 1); /* a third of a header */
    close(fd);
    fd = raw_connect();
    assert_int_equal(write(fd, "\x40\x00\x00\x00\x01\x02", 6), 6); /* body cut */
    close(fd);
    serving();
}

static void test_oversized_frame(void **state)
{
    (void)state;
    kvt_client *c = td_connect(&D);
    size_t len = 3u << 20; /* over --max-msg-bytes 1M */
    uint8_t *buf = calloc(1, len);
    Kvtier__Response *r = NULL;
    assert_int_equal(kvtc_call_raw(c, buf, len, &r), KVT_OK);
    assert_int_equal(r->err, KVT_ETOOBIG);
    kvtier__response__free_unpacked(r, NULL);
    free(buf);
    kvt_stats s; /* the same connection is still in step */
    assert_int_equal(kvt_stats_get(c, &s), KVT_OK);
    kvt_close(c);
}

/* A client that sends and never reads fills its socket; the daemon must
 * stop reading it rather than block, and serve others meanwhile. */
static void test_writer_that_never_reads(void **state)
{
    (void)state;
    int fd = raw_connect();
    uint8_t frame[64];
    size_t n = stats_frame(frame);
    struct timeval tv = {0, 200000};
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    size_t sent = 0;
    for (int i = 0; i < 200000; i++) {
        ssize_t w = write(fd, frame, n);
        if (w != (ssize_t)n) break;
        sent++;
    }
    assert_true(sent > 100);
    for (int i = 0; i < 20; i++) serving();
    close(fd);
    serving();
}

/* KVTIER_NO_FAST keeps a local client on nng: zero-copy still works. */
static void test_nng_only_client(void **state)
{
    (void)state;
    setenv("KVTIER_NO_FAST", "1", 1);
    kvt_client *c = td_connect(&D);
    unsetenv("KVTIER_NO_FAST");
    assert_true(kvt_zero_copy(c));
    kvt_key k = td_key(5);
    size_t size = 100000, got;
    kvt_chunk ch;
    kvt_lease l;
    assert_int_equal(kvt_put_begin(c, "nng", &k, &size, 1, NULL, &l, &ch), KVT_OK);
    td_fill(ch.data, size, 5);
    assert_int_equal(kvt_put_commit(c, l, &ch, 1, NULL), KVT_OK);
    assert_int_equal(kvt_get(c, "nng", &k, 1, &l, &ch, &got), KVT_OK);
    assert_int_equal(got, 1);
    uint8_t *want = malloc(size);
    td_fill(want, size, 5);
    assert_memory_equal(ch.data, want, size);
    free(want);
    assert_int_equal(kvt_release(c, l), KVT_OK);
    kvt_close(c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_half_frames),
        cmocka_unit_test(test_oversized_frame),
        cmocka_unit_test(test_writer_that_never_reads),
        cmocka_unit_test(test_nng_only_client),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
