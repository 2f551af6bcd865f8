/*
 * test_cluster_peer.c -- GET through the peer tier, over UCX with tcp and
 * again with shared memory (UCX_TLS=sm,self, cluster.ucx_wakeup 0), three
 * daemons on loopback each time: chunks put on node 1 (one of 9 MiB, so
 * two slices) come back bit-exact from a GET on node 3, and a second GET
 * there is a local hit; a holder that flips a byte (KVT_FAULT=peer_corrupt
 * on node 2) is caught by the checksum: a miss and a counter, nothing
 * kept; kill -9 of the holder during a stream of GETs: no GET hangs past
 * its deadline (checked with several seconds of slack), no wrong byte,
 * and once the holder is marked dead every GET of its chunks is a miss;
 * restarted, it rejoins and its chunks are found (still after the
 * owners' sweep has applied its departure) and fetched again.
 * A member whose UCX cannot start joins and indexes, and its GETs stay
 * local.
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
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

#define N 3
#define NS "cl/peer"

static struct tcluster T;
#define D T.d
#define url T.url
#define C T.c
static const char *wakeup = "1";

static int start_node(int i)
{
    const char *extra[] = {"--cluster.ucx_wakeup", wakeup, "--pool-bytes", "128M", NULL};
    if (i == 1) setenv("KVT_FAULT", "peer_corrupt=1+", 1);
    int rc = tc_start(&T, i, 2000, extra);
    unsetenv("KVT_FAULT");
    return rc;
}

static Kvtier__PeersResp *peers(int i, Kvtier__Response **r)
{
    assert_int_equal(tc_peers(C[i], r), KVT_OK);
    return (*r)->peers;
}

/* Every node sees the others alive with UCX endpoints both ways (30 s of
 * slack: TLS handshakes and UCX start-up on a loaded machine). */
static int wait_ready(void)
{
    for (int t = 0; t < 600; t++, usleep(50000)) {
        int ok = 1;
        for (int i = 0; i < N && ok; i++) {
            Kvtier__Response *r;
            Kvtier__PeersResp *p = peers(i, &r);
            size_t alive = 0; /* members 1..N; others may have come and gone */
            for (size_t k = 0; k < p->n_peers; k++)
                alive += p->peers[k]->node_id <= N &&
                         p->peers[k]->state == KVTIER__PEER_STATE__PEER_ALIVE;
            ok = p->peer_tier && alive == N - 1;
            kvtier__response__free_unpacked(r, NULL);
        }
        if (ok) return 0;
    }
    return -1;
}

static int setup_with(const char *tls, const char *wk, int ports)
{
    setenv("UCX_TLS", tls, 1);
    wakeup = wk;
    (void)ports;
    tc_init(&T, N);
    for (int i = 0; i < N; i++)
        if (start_node(i) != 0) return tc_teardown(&T), -1;
    return wait_ready();
}

static int setup_tcp(void **state)
{
    (void)state;
    return setup_with("tcp", "1", 0);
}

static int setup_shm(void **state)
{
    (void)state;
    return setup_with("sm,self", "0", 10);
}

static int teardown(void **state)
{
    (void)state;
    return tc_teardown(&T);
}

static size_t size_of(uint64_t seed)
{
    return seed % 10 == 3 ? (9u << 20) + 12345 : (256u << 10) + (size_t)(seed % 7) * 4096;
}

static void put_one(int node, uint64_t seed)
{
    assert_int_equal(tc_put(C[node], NS, seed, size_of(seed)), KVT_OK);
}

/* Inline GET of one key on node i with a deadline: 1 found (bytes
 * checked), 0 missed. */
static int get_one(int i, uint64_t seed, uint32_t deadline_ms)
{
    int found = tc_get_checked(C[i], NS, seed, size_of(seed), deadline_ms);
    assert_true(found >= 0); /* answered, and no wrong byte */
    return found;
}

/* LOOKUP on node i: how many of n keys from seed are found (any tier). */
static uint32_t found_from(int i, uint64_t seed, uint32_t n, int local_only)
{
    ProtobufCBinaryData kb[32];
    kvt_key keys[32];
    for (uint32_t j = 0; j < n; j++) {
        keys[j] = td_key(seed + j);
        kb[j] = (ProtobufCBinaryData){KVT_KEY_LEN, keys[j].b};
    }
    Kvtier__Lookup l = KVTIER__LOOKUP__INIT;
    l.ns = NS, l.keys = kb, l.n_keys = n, l.local_only = local_only;
    Kvtier__Request q = KVTIER__REQUEST__INIT;
    q.body_case = KVTIER__REQUEST__BODY_LOOKUP;
    q.lookup = &l;
    Kvtier__Response *r = NULL;
    assert_int_equal(kvtc_call(C[i], &q, &r), KVT_OK);
    uint32_t f = 0;
    for (uint32_t j = 0; j < n; j++) f += r->lookup->tiers[j] != KVTIER__TIER__TIER_NONE;
    kvtier__response__free_unpacked(r, NULL);
    return f;
}

static int wait_found(int i, uint64_t seed, uint32_t n, uint32_t want)
{
    for (int t = 0; t < 200; t++, usleep(50000))
        if (found_from(i, seed, n, 0) == want) return 0;
    return -1;
}

static void test_get_bit_exact_then_local(void **state)
{
    (void)state;
    kvt_key keys[4];
    kvt_chunk ch[4];
    kvt_lease l;
    size_t got = 0;
    for (uint64_t s = 0; s < 4; s++) put_one(0, 100 + s), keys[s] = td_key(100 + s);
    assert_int_equal(wait_found(2, 100, 4, 4), 0);
    assert_int_equal(kvt_get(C[2], NS, keys, 4, &l, ch, &got), KVT_OK);
    assert_int_equal(got, 4); /* zero-copy, from node 3's own pool */
    for (uint64_t s = 0; s < 4; s++) {
        uint8_t *want = malloc(size_of(100 + s));
        td_fill(want, size_of(100 + s), 100 + s);
        assert_int_equal(ch[s].size, size_of(100 + s));
        assert_memory_equal(ch[s].data, want, ch[s].size);
        free(want);
    }
    assert_int_equal(kvt_release(C[2], l), KVT_OK);
    Kvtier__Response *r;
    uint64_t hits = peers(2, &r)->remote_hits;
    kvtier__response__free_unpacked(r, NULL);
    assert_int_equal(hits, 4);
    assert_int_equal(found_from(2, 100, 4, 1), 4); /* now local replicas */
    for (uint64_t s = 0; s < 4; s++) assert_int_equal(get_one(2, 100 + s, 2000), 1);
    assert_int_equal(peers(2, &r)->remote_hits, hits); /* served locally */
    kvtier__response__free_unpacked(r, NULL);
}

static void test_corrupt_bytes_are_a_miss(void **state)
{
    (void)state;
    Kvtier__Response *r;
    put_one(1, 300); /* node 2 flips a byte of what it pins */
    assert_int_equal(wait_found(2, 300, 1, 1), 0);
    assert_int_equal(get_one(2, 300, 2000), 0);
    Kvtier__PeersResp *p = peers(2, &r);
    assert_int_equal(p->bad_checksums, 1);
    assert_int_equal(p->remote_hits, 4); /* the first test's, no more */
    kvtier__response__free_unpacked(r, NULL);
    assert_int_equal(found_from(2, 300, 1, 1), 0); /* nothing kept */
    assert_true(td_log_has(&D[2], "failed its checksum"));
    for (int t = 0; t < 200; t++, usleep(25000)) { /* node 3 let go of the pin */
        uint64_t pins = peers(1, &r)->pinned_for_peers;
        kvtier__response__free_unpacked(r, NULL);
        if (!pins) break;
    }
    assert_int_equal(get_one(1, 300, 2000), 1); /* the holder's copy restored */
}

static void test_kill_holder_during_gets(void **state)
{
    (void)state;
    const uint32_t dl = 1500;
    for (uint64_t s = 0; s < 24; s++) put_one(0, 500 + s);
    assert_int_equal(wait_found(2, 500, 24, 24), 0);
    int found = 0;
    for (uint64_t s = 0; s < 24; s++) {
        if (s == 8) td_kill(&D[0]);
        long long t0 = td_now_ms();
        found += get_one(2, 500 + s, dl);
        assert_true(td_now_ms() - t0 < dl + 5000); /* no hang past the deadline */
    }
    assert_true(found >= 8);
    for (int t = 0; t < 100; t++, usleep(50000)) { /* node 1 marked dead */
        Kvtier__Response *r;
        Kvtier__PeersResp *p = peers(2, &r);
        int dead = 0;
        for (size_t k = 0; k < p->n_peers; k++)
            dead |= p->peers[k]->node_id == 1 &&
                    p->peers[k]->state == KVTIER__PEER_STATE__PEER_DEAD;
        kvtier__response__free_unpacked(r, NULL);
        if (dead) break;
    }
    for (uint64_t s = (uint64_t)found; s < 24; s++) assert_int_equal(get_one(2, 500 + s, dl), 0);
    kvt_close(C[0]); /* its daemon is gone */
    C[0] = NULL;
    /* Restarted, node 1 adopts its pool, rejoins with a new UCX endpoint,
     * and its chunks are found and fetched again. */
    assert_int_equal(start_node(0), 0);
    assert_int_equal(wait_ready(), 0);
    assert_int_equal(wait_found(2, 500 + (uint64_t)found, 4, 4), 0);
    /* Still found once the views have settled (2 s) and the owners have
     * swept: the departure they apply is older than what node 1 told
     * them since it came back. */
    usleep(3000000);
    assert_int_equal(found_from(2, 500 + (uint64_t)found, 4, 0), 4);
    for (uint64_t s = (uint64_t)found; s < (uint64_t)found + 4; s++)
        assert_int_equal(get_one(2, 500 + s, 5000), 1);
}

/* A member whose UCX cannot start (no usable transport) still joins and
 * indexes; GETs on it stay local: a miss at once, not a wait. */
static void test_member_without_ucx(void **state)
{
    (void)state;
    struct tdaemon t = {0};
    char u[64];
    snprintf(u, sizeof u, "tls+tcp://127.0.0.1:%d", td_free_port());
    const char *extra[20] = {"--cluster.node_id", "8", "--cluster.listen", u,
                             "--cluster.seeds", url[2], "--cluster.heartbeat_ms", "100",
                             "--cluster.failure_timeout_ms", "2000"};
    tc_tls_args(extra + 10, "node-8");
    const char *tls = getenv("UCX_TLS");
    char keep[32];
    snprintf(keep, sizeof keep, "%s", tls ? tls : "");
    setenv("UCX_TLS", "no_such_transport", 1);
    assert_int_equal(td_start(&t, extra), 0);
    setenv("UCX_TLS", keep, 1);
    assert_true(td_log_has(&t, "no peer tier"));
    kvt_client *c9 = td_connect(&t);
    kvt_client *keep3 = C[2];
    C[2] = c9; /* found_from and get_one ask "node 3": this one */
    assert_int_equal(wait_found(2, 100, 4, 4), 0); /* the index works */
    assert_int_equal(get_one(2, 100, 60000), 0);   /* no fetch: a miss now */
    Kvtier__Response *r;
    assert_false(peers(2, &r)->peer_tier);
    kvtier__response__free_unpacked(r, NULL);
    C[2] = keep3;
    kvt_close(c9);
    assert_int_equal(td_stop(&t), 0);
    td_cleanup(&t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_get_bit_exact_then_local),
        cmocka_unit_test(test_corrupt_bytes_are_a_miss),
        cmocka_unit_test(test_member_without_ucx),
        cmocka_unit_test(test_kill_holder_during_gets),
    };
    int rc = cmocka_run_group_tests_name("tcp", tests, setup_tcp, teardown);
    return rc | cmocka_run_group_tests_name("shared memory", tests, setup_shm, teardown);
}
