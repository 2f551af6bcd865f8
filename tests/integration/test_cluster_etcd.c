/*
 * test_cluster_etcd.c -- three real kvtierd with cluster.membership = etcd
 * against a real etcd started here on loopback: no seeds at all, so the
 * members find each other only through etcd's prefix; a chunk PUT on node
 * 1 is found by LOOKUP and fetched (bytes checked) by GET on node 3; node
 * 2 killed with SIGKILL is seen dead by the others once its lease (2 s)
 * runs out; node 3 stopped with SIGTERM is seen LEFT (it wrote left = 1
 * before revoking). The peers' view reports etcd's revision as the epoch,
 * the same on every node; idle members, their hellos done, send each
 * other nothing. Skipped (77) without etcd.
 */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "client_internal.h"
#include "daemon.h"
#include "etcdtest.h"
#include "kvtier.h"
#include "peer/etcd_client.h"

#define N 3
#define NS "cl/etcd"
#define CHUNK 4096

static struct tcluster T;
static struct tetcd E;

static int start_node(int i)
{
    const char *extra[] = {"--cluster.membership", "etcd", "--cluster.etcd_endpoints", E.url,
                           "--cluster.etcd_prefix", "/kvt-test/members/",
                           "--cluster.etcd_lease_s", "2", "--pool-bytes", "64M", NULL};
    return tc_start(&T, i, 2000, extra);
}

static int setup(void **state)
{
    (void)state;
    if (te_init(&E, "cletcd") != 0) return -1;
    if (te_start(&E, "/kvt-test/") != 0) return -1;
    setenv("UCX_TLS", "tcp", 1);
    tc_init(&T, N);
    for (int i = 0; i < N; i++) {
        T.seed[i] = i; /* its own url: no seed, etcd is the only way in */
        if (start_node(i) != 0) return -1;
    }
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    int rc = tc_teardown(&T);
    return te_cleanup(&E) == 0 ? rc : -1;
}

/* State of member id in node i's view (PEER_NONE if absent); *epoch gets
 * node i's epoch. */
static int state_of(int i, uint32_t id, uint64_t *epoch)
{
    Kvtier__Response *r = NULL;
    assert_int_equal(tc_peers(T.c[i], &r), KVT_OK);
    int st = KVTIER__PEER_STATE__PEER_NONE;
    for (size_t k = 0; k < r->peers->n_peers; k++)
        if (r->peers->peers[k]->node_id == id) st = r->peers->peers[k]->state;
    if (epoch) *epoch = r->peers->epoch;
    kvtier__response__free_unpacked(r, NULL);
    return st;
}

/* Wait (20 s) until node i sees member id in state st. */
static int wait_state(int i, uint32_t id, int st)
{
    for (long long end = td_now_ms() + 20000; td_now_ms() < end; usleep(50000))
        if (state_of(i, id, NULL) == st) return 0;
    return -1;
}

static uint32_t found_on(int i, uint64_t seed, uint32_t n)
{
    int got = tc_lookup(T.c[i], NS, seed, n, 0, NULL);
    assert_true(got >= 0);
    return (uint32_t)got;
}

/* Sum over node i's members of the bytes it sent each. */
static uint64_t bytes_out(int i)
{
    Kvtier__Response *r = NULL;
    assert_int_equal(tc_peers(T.c[i], &r), KVT_OK);
    uint64_t b = 0;
    for (size_t k = 0; k < r->peers->n_peers; k++) b += r->peers->peers[k]->bytes_out;
    kvtier__response__free_unpacked(r, NULL);
    return b;
}

/* Once every hello is done, idle members of an etcd cluster send each
 * other nothing: a second (ten heartbeat periods) passes with no byte
 * sent by any node, within 15 s. A member whose UCX identity was held but
 * never acknowledged kept sending a Heartbeat every period, for ever. */
static void test_idle_members_go_quiet(void **state)
{
    (void)state;
    uint64_t was[N], now[N];
    int quiet = 0;
    for (int i = 0; i < N; i++) was[i] = bytes_out(i);
    for (long long end = td_now_ms() + 15000; !quiet && td_now_ms() < end;) {
        usleep(1000000);
        quiet = 1;
        for (int i = 0; i < N; i++) {
            now[i] = bytes_out(i);
            quiet &= now[i] == was[i];
            was[i] = now[i];
        }
    }
    assert_true(quiet);
}

static void test_members_found_through_etcd(void **state)
{
    (void)state;
    for (int i = 0; i < N; i++) assert_int_equal(tc_wait_alive(&T, i, N - 1, 1), 0);
    uint64_t e0 = 0, e;
    for (long long end = td_now_ms() + 10000; td_now_ms() < end; usleep(50000)) {
        int same = 1;
        state_of(0, 2, &e0);
        for (int i = 1; i < N; i++) {
            state_of(i, 1, &e);
            same &= e == e0;
        }
        if (same) break;
    }
    assert_true(e0 > 0); /* etcd's revision, the same everywhere */
    for (int i = 1; i < N; i++) {
        state_of(i, 1, &e);
        assert_int_equal(e, e0);
    }
}

static void test_put_on_one_found_on_another(void **state)
{
    (void)state;
    for (uint64_t s = 0; s < 8; s++)
        assert_int_equal(tc_put(T.c[0], NS, 100 + s, CHUNK), KVT_OK);
    uint32_t f = 0;
    for (long long end = td_now_ms() + 20000; td_now_ms() < end && f < 8; usleep(100000))
        f = found_on(2, 100, 8);
    assert_int_equal(f, 8);
    for (uint64_t s = 0; s < 8; s++)
        assert_int_equal(tc_get_checked(T.c[2], NS, 100 + s, CHUNK, 5000), 1);
}

static void test_killed_seen_dead_after_lease(void **state)
{
    (void)state;
    td_kill(&T.d[1]); /* SIGKILL: no goodbye; its lease runs out */
    kvt_close(T.c[1]);
    T.c[1] = NULL;
    assert_int_equal(wait_state(0, 2, KVTIER__PEER_STATE__PEER_DEAD), 0);
    assert_int_equal(wait_state(2, 2, KVTIER__PEER_STATE__PEER_DEAD), 0);
    assert_int_equal(start_node(1), 0); /* back: registered again */
    assert_int_equal(wait_state(0, 2, KVTIER__PEER_STATE__PEER_ALIVE), 0);
    assert_int_equal(wait_state(2, 2, KVTIER__PEER_STATE__PEER_ALIVE), 0);
}

static void test_stopped_seen_left(void **state)
{
    (void)state;
    assert_int_equal(tc_stop(&T, 2), 0);
    assert_int_equal(wait_state(0, 3, KVTIER__PEER_STATE__PEER_LEFT), 0);
    assert_int_equal(wait_state(1, 3, KVTIER__PEER_STATE__PEER_LEFT), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_members_found_through_etcd),
        cmocka_unit_test(test_idle_members_go_quiet),
        cmocka_unit_test(test_put_on_one_found_on_another),
        cmocka_unit_test(test_killed_seen_dead_after_lease),
        cmocka_unit_test(test_stopped_seen_left),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
