/*
 * test_cluster_eps.c -- UCX endpoints made on first use and capped
 * (cluster.max_peer_eps = 2), four daemons on loopback over UCX tcp.
 *
 * Once every node sees the other three alive, no node holds an endpoint
 * (none has fetched). Node 1 then GETs, round after round, one chunk from
 * each of the three others: every GET is a hit with exactly the bytes
 * put, and its /metrics show at most two endpoints open, more than two
 * made and some evicted. One GET whose keys lie on all three holders
 * (9 MiB chunks: fetches overlap) is whole: the cap never takes an
 * endpoint a fetch is using. kill -9 of a holder whose endpoint node 1
 * holds: GETs from the others go on working, and once the holder is dead
 * its endpoint is closed; restarted (a new UCX worker address), its new
 * chunks are fetched with the right bytes through a fresh endpoint.
 * A node whose first endpoint cannot be made (KVT_FAULT=peer_ep=1) misses
 * that GET, asks the holder for its UCX identity again and fetches the
 * chunk at a later GET.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "client_internal.h"
#include "daemon.h"
#include "kvtier.h"
#include "ops.h"

#define N 4
#define CAP 2
#define NS "cl/eps"

static struct tcluster T;

static int start_node(int i)
{
    const char *extra[] = {"--cluster.max_peer_eps", "2", "--pool-bytes", "96M", NULL};
    return tc_start(&T, i, 2000, extra);
}

static int setup(void **state)
{
    (void)state;
    setenv("UCX_TLS", "tcp", 1);
    tc_init(&T, N);
    for (int i = 0; i < N; i++)
        if (start_node(i) != 0) return tc_teardown(&T), -1;
    for (int i = 0; i < N; i++)
        if (tc_wait_alive(&T, i, N - 1, 1) != 0) return tc_teardown(&T), -1;
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    return tc_teardown(&T);
}

/* One series of node i's /metrics. */
static double metric(int i, const char *name)
{
    char base[128], *body = NULL;
    int status = 0;
    struct prom p;
    assert_int_equal(ops_metrics_base(&T.d[i], base, sizeof base, 5000), 0);
    assert_int_equal(ops_http_get(base, "/metrics", &status, &body), 0);
    assert_int_equal(status, 200);
    assert_int_equal(prom_parse(body, &p), 0);
    free(body);
    double v = prom_get(&p, name, "");
    prom_free(&p);
    return v;
}

#define EPS "kvtier_cluster_peer_endpoints"
#define OPENED "kvtier_cluster_peer_endpoints_opened_total"
#define EVICTED "kvtier_cluster_peer_endpoints_evicted_total"

/* The chunk of seed s: node s / 100 holds it. */
static size_t size_of(uint64_t s)
{
    return s % 100 >= 50 ? (9u << 20) + 777 : (192u << 10) + (size_t)(s % 5) * 4096;
}

static void put_on(int node, uint64_t s)
{
    assert_int_equal(tc_put(T.c[node], NS, s, size_of(s)), KVT_OK);
}

static int get_on(int node, uint64_t s)
{
    int found = tc_get_checked(T.c[node], NS, s, size_of(s), 5000);
    assert_true(found >= 0); /* answered, no wrong byte */
    return found;
}

static uint64_t remote_hits(int i)
{
    return tc_counter(T.c[i], offsetof(Kvtier__PeersResp, remote_hits));
}

static void test_lazy_and_capped(void **state)
{
    (void)state;
    for (int i = 0; i < N; i++) { /* alive, hello done, nothing fetched */
        assert_int_equal(metric(i, EPS), 0);
        assert_int_equal(metric(i, OPENED), 0);
    }
    for (int h = 1; h < N; h++)
        for (uint64_t r = 0; r < 3; r++) put_on(h, (uint64_t)h * 100 + r);
    for (int h = 1; h < N; h++)
        for (uint64_t r = 0; r < 3; r++)
            assert_int_equal(tc_wait_found(T.c[0], NS, (uint64_t)h * 100 + r, 20000), 0);
    uint64_t hits = remote_hits(0);
    for (uint64_t r = 0; r < 3; r++)   /* holders 2, 3, 4, 2, 3, 4, ...: */
        for (int h = 1; h < N; h++) {  /* each GET needs the LRU one back */
            assert_int_equal(get_on(0, (uint64_t)h * 100 + r), 1);
            assert_true(metric(0, EPS) <= CAP);
        }
    assert_int_equal(remote_hits(0), hits + 9);
    assert_true(metric(0, OPENED) > CAP);
    assert_true(metric(0, EVICTED) >= metric(0, OPENED) - CAP);
    for (int i = 1; i < N; i++) assert_int_equal(metric(i, OPENED), 0); /* they read nothing */
}

/* One GET over three holders with the cap at two: every chunk comes. */
static void test_busy_endpoint_kept(void **state)
{
    (void)state;
    enum { K = 3 };
    kvt_key keys[K];
    kvt_chunk ch[K];
    kvt_lease l;
    size_t got = 0;
    for (int h = 1; h <= K; h++) {
        uint64_t s = (uint64_t)h * 100 + 50;
        put_on(h, s);
        keys[h - 1] = td_key(s);
        assert_int_equal(tc_wait_found(T.c[0], NS, s, 20000), 0);
    }
    uint64_t failed = tc_counter(T.c[0], offsetof(Kvtier__PeersResp, fetch_failures));
    assert_int_equal(kvt_get(T.c[0], NS, keys, K, &l, ch, &got), KVT_OK);
    assert_int_equal(got, K);
    for (int h = 1; h <= K; h++) {
        uint64_t s = (uint64_t)h * 100 + 50;
        uint8_t *want = malloc(size_of(s));
        assert_non_null(want);
        td_fill(want, size_of(s), s);
        assert_int_equal(ch[h - 1].size, size_of(s));
        assert_memory_equal(ch[h - 1].data, want, size_of(s));
        free(want);
    }
    assert_int_equal(kvt_release(T.c[0], l), KVT_OK);
    assert_int_equal(tc_counter(T.c[0], offsetof(Kvtier__PeersResp, fetch_failures)), failed);
    for (int t = 0; t < 100 && metric(0, EPS) > CAP; t++) usleep(50000); /* trimmed at a tick */
    assert_true(metric(0, EPS) <= CAP);
}

static int state_of(int i, uint32_t id)
{
    Kvtier__Response *r;
    assert_int_equal(tc_peers(T.c[i], &r), KVT_OK);
    int st = -1;
    for (size_t k = 0; k < r->peers->n_peers; k++)
        if (r->peers->peers[k]->node_id == id) st = r->peers->peers[k]->state;
    kvtier__response__free_unpacked(r, NULL);
    return st;
}

/* Seeds 100 i + r are put on node index i (node id i + 1); fresh ones
 * each time: a chunk read once is a local replica after. */
static void test_killed_holder(void **state)
{
    (void)state;
    for (int h = 1; h < N; h++)
        for (uint64_t r = 10; r < 12; r++) put_on(h, (uint64_t)h * 100 + r);
    for (int h = 1; h < N; h++)
        for (uint64_t r = 10; r < 12; r++)
            assert_int_equal(tc_wait_found(T.c[0], NS, (uint64_t)h * 100 + r, 20000), 0);
    /* Node 1 holds endpoints to node 2 and node 4, the latest used. */
    assert_int_equal(get_on(0, 110), 1);
    assert_int_equal(get_on(0, 310), 1);
    assert_int_equal(metric(0, EPS), CAP);
    td_kill(&T.d[3]);
    kvt_close(T.c[3]);
    T.c[3] = NULL;
    assert_int_equal(get_on(0, 111), 1); /* the others still serve */
    for (int t = 0; t < 200 && state_of(0, 4) != KVTIER__PEER_STATE__PEER_DEAD; t++)
        usleep(50000);
    assert_int_equal(state_of(0, 4), KVTIER__PEER_STATE__PEER_DEAD);
    assert_int_equal(metric(0, EPS), 1); /* node 4's endpoint went with it */
    assert_int_equal(get_on(0, 311), 0); /* its chunks: misses */
    assert_int_equal(get_on(0, 210), 1);
    assert_int_equal(metric(0, EPS), CAP);
    double opened = metric(0, OPENED);
    assert_int_equal(start_node(3), 0);
    assert_int_equal(tc_wait_alive(&T, 0, N - 1, 1), 0);
    put_on(3, 320);
    assert_int_equal(tc_wait_found(T.c[0], NS, 320, 20000), 0);
    assert_int_equal(get_on(0, 320), 1); /* through its new worker address */
    assert_true(metric(0, OPENED) > opened);
    assert_true(metric(0, EPS) <= CAP);
    assert_int_equal(get_on(0, 211), 1);
}

/* Two more nodes; the reader's first endpoint fails. */
static void test_endpoint_fails_then_relearned(void **state)
{
    (void)state;
    static struct tcluster S;
    const char *extra[] = {"--pool-bytes", "32M", NULL};
    tc_init(&S, 2);
    assert_int_equal(tc_start(&S, 0, 2000, extra), 0);
    setenv("KVT_FAULT", "peer_ep=1", 1);
    int rc = tc_start(&S, 1, 2000, extra);
    unsetenv("KVT_FAULT");
    assert_int_equal(rc, 0);
    assert_int_equal(tc_wait_alive(&S, 1, 1, 1), 0);
    assert_int_equal(tc_put(S.c[0], NS, 900, size_of(900)), KVT_OK);
    assert_int_equal(tc_wait_found(S.c[1], NS, 900, 20000), 0);
    const char *said = "no UCX endpoint (its UCX identity is asked for again)";
    for (int t = 0; t < 100 && !td_log_has(&S.d[1], said); t++, usleep(50000))
        assert_int_equal(tc_get_checked(S.c[1], NS, 900, size_of(900), 5000), 0);
    assert_true(td_log_has(&S.d[1], said)); /* the GET that made it missed */
    int found = 0;
    for (int t = 0; t < 100 && found == 0; t++, usleep(100000))
        assert_true((found = tc_get_checked(S.c[1], NS, 900, size_of(900), 5000)) >= 0);
    assert_int_equal(found, 1);
    assert_int_equal(tc_counter(S.c[1], offsetof(Kvtier__PeersResp, remote_hits)), 1);
    assert_int_equal(tc_teardown(&S), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lazy_and_capped),
        cmocka_unit_test(test_busy_endpoint_kept),
        cmocka_unit_test(test_killed_holder),
        cmocka_unit_test(test_endpoint_fails_then_relearned),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
