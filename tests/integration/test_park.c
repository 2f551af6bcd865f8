/*
 * test_park.c -- a parked request whose client leaves must never be
 * answered into the closed connection (issue 10).
 *
 * Two real daemons on loopback. The peer is slow (SIGSTOP) or dead
 * (SIGKILL, still a member: a suspect, with a long suspicion timeout), so a
 * LOOKUP of keys missing here is parked waiting on its answer; the client
 * gives up first (a short client timeout) and closes; once the park's
 * deadline (cluster.lookup_timeout_ms) has passed, the daemon must still
 * be alive and serving. The same over the fast channel and over nng
 * (KVTIER_NO_FAST), for a GET parked on a peer fetch, and for a GET
 * parked on an NVMe read held back (KVT_FAULT=nvme_hold). Under ASan the
 * old code died here with a heap-use-after-free in local_reply_later.
 * Waits bound how long the test waits, they assert no timing.
 */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "daemon.h"
#include "kvtier.h"
#include "nvtest.h"

#define NS "park"
#define LOOKUP_MS 600
#define CLIENT_MS 150

static struct tcluster T;

static int setup(void **state)
{
    (void)state;
    /* The stopped or killed peer must stay a member (suspect, not dead)
     * for the whole test: SWIM gives it 100 x log10(2) x 1 s >= 30 s. */
    const char *extra[] = {"--cluster.lookup_timeout_ms", "600",
                           "--nvme.get_deadline_ms", "600",
                           "--cluster.probe_ms", "1000",
                           "--cluster.suspicion_mult", "100", NULL};
    setenv("UCX_TLS", "tcp", 1);
    tc_init(&T, 2);
    int rc = 0;
    for (int i = 0; i < 2 && rc == 0; i++) rc = tc_start(&T, i, 60000, extra);
    if (rc == 0) rc = tc_wait_alive(&T, 0, 1, 0) || tc_wait_alive(&T, 1, 1, 0);
    if (rc != 0) tc_teardown(&T); /* cmocka skips the teardown then */
    return rc ? -1 : 0;
}

static int teardown(void **state)
{
    (void)state;
    return tc_teardown(&T);
}

/* A fresh client of node 0, over nng alone if nng is set. */
static kvt_client *client(int nng)
{
    if (nng) setenv("KVTIER_NO_FAST", "1", 1);
    kvt_client *c = td_connect(&T.d[0]);
    unsetenv("KVTIER_NO_FAST");
    return c;
}

/* Node 0 still serves: a put then a lookup of it, on a new client. */
static void still_serves(uint64_t seed)
{
    uint8_t buf[4096];
    kvt_key k = td_key(seed);
    const void *b = buf;
    size_t size = sizeof buf, n = 0;
    td_fill(buf, sizeof buf, seed);
    assert_true(td_alive(&T.d[0]));
    kvt_client *c = client(0);
    assert_int_equal(kvt_put(c, NS, &k, &b, &size, 1, NULL, NULL), KVT_OK);
    assert_int_equal(kvt_lookup(c, NS, &k, 1, &n, NULL), KVT_OK);
    assert_int_equal(n, 1);
    kvt_close(c);
}

/* LOOKUP keys nobody has; the peer cannot answer, so it is parked; the
 * client times out and leaves; the park's deadline passes. */
static void lookup_and_leave(int nng, uint64_t seed)
{
    kvt_key k[4];
    size_t n = 99;
    for (int i = 0; i < 4; i++) k[i] = td_key(seed + (uint64_t)i);
    kvt_client *c = client(nng);
    kvt_set_timeout(c, CLIENT_MS);
    assert_int_not_equal(kvt_lookup(c, NS, k, 4, &n, NULL), KVT_OK);
    kvt_close(c);
    usleep((LOOKUP_MS + 500) * 1000);
}

static void test_lookup_slow_peer_fast(void **state)
{
    (void)state;
    kill(T.d[1].pid, SIGSTOP);
    lookup_and_leave(0, 100);
    lookup_and_leave(0, 200); /* and again, with the first one gone */
    still_serves(1);
    kill(T.d[1].pid, SIGCONT);
}

static void test_lookup_slow_peer_nng(void **state)
{
    (void)state;
    kill(T.d[1].pid, SIGSTOP);
    lookup_and_leave(1, 300);
    lookup_and_leave(1, 400);
    still_serves(2);
    kill(T.d[1].pid, SIGCONT);
}

static void test_lookup_dead_peer(void **state)
{
    (void)state;
    td_kill(&T.d[1]); /* kill -9; still a member (suspect) to node 0 */
    lookup_and_leave(0, 500);
    lookup_and_leave(1, 600);
    still_serves(3);
}

/* A GET of keys missing here waits on the owner's who-has (the peer is
 * stopped) inside the peer tier's fetch; its client leaves. */
static void get_and_leave(int nng, uint64_t seed)
{
    kvt_key k[2] = {td_key(seed), td_key(seed + 1)};
    kvt_chunk ch[2];
    kvt_lease l = 0;
    size_t n = 99;
    kvt_client *c = client(nng);
    kvt_set_timeout(c, CLIENT_MS);
    kvt_err e = kvt_get(c, NS, k, 2, &l, ch, &n);
    if (e == KVT_OK) { /* no peer tier here (no UCX): answered at once */
        assert_int_equal(n, 0);
    }
    kvt_close(c);
    usleep((LOOKUP_MS + 500) * 1000);
}

static void test_get_slow_peer(void **state)
{
    (void)state;
    kill(T.d[1].pid, SIGSTOP);
    get_and_leave(0, 700);
    get_and_leave(1, 800);
    still_serves(4);
    kill(T.d[1].pid, SIGCONT);
}

/* A GET of a chunk only on NVMe whose read is held back; its client
 * leaves; later I/O releases the read, the deadline passes. */
static void test_nvme_get_client_leaves(void **state)
{
    (void)state;
    struct tdaemon D;
    const char *rest[] = {"--nvme.get_deadline_ms", "600", NULL};
    assert_int_equal(td_init(&D), 0);
    setenv("KVT_FAULT", "nvme_hold=1", 1);
    int rv = nvt_start(&D, 64, 16, rest);
    unsetenv("KVT_FAULT");
    assert_int_equal(rv, 0);
    kvt_client *c = td_connect(&D);
    assert_int_equal(nvt_put_chain(c, 1, 3, 65536), KVT_OK);
    assert_int_equal(nvt_flush(c, 1, NULL), KVT_OK);
    kvt_client *g = td_connect(&D);
    kvt_set_timeout(g, CLIENT_MS);
    kvt_key k = td_key(1);
    kvt_chunk ch;
    kvt_lease l = 0;
    size_t n = 0;
    assert_int_not_equal(kvt_get(g, NVT_NS, &k, 1, &l, &ch, &n), KVT_OK); /* held */
    kvt_close(g);
    usleep(1100 * 1000);               /* past the GET's deadline */
    assert_true(nvt_check(c, 2, 65536)); /* its read releases the held one */
    assert_true(nvt_check(c, 1, 65536));
    assert_true(td_alive(&D));
    kvt_close(c);
    assert_int_equal(td_stop(&D), 0);
    td_cleanup(&D);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_lookup_slow_peer_fast, setup, teardown),
        cmocka_unit_test_setup_teardown(test_lookup_slow_peer_nng, setup, teardown),
        cmocka_unit_test_setup_teardown(test_lookup_dead_peer, setup, teardown),
        cmocka_unit_test_setup_teardown(test_get_slow_peer, setup, teardown),
        cmocka_unit_test(test_nvme_get_client_leaves),
    };
    if (getenv("KVT_TEST_FILTER")) cmocka_set_test_filter(getenv("KVT_TEST_FILTER"));
    return cmocka_run_group_tests(tests, NULL, NULL);
}
