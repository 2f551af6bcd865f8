/*
 * test_cluster_index.c -- the global index over real daemons on loopback:
 * a chunk put on node 1 is reported as TIER_PEER by a LOOKUP on node 3
 * (and not with local_only); a node joins and another leaves (SIGTERM)
 * while chunks are being put, and afterwards every chunk still held by a
 * live node is found from every node, while the leaver's own chunks are
 * misses. Index messages that claim a member's identity but are malformed
 * (short keys, arrays of different lengths, an answer to no query) are
 * refused and change nothing (on an insecure cluster, where a raw client
 * can claim a member's id at all). When a fourth node joins, the holder
 * sends exactly the entries whose owners now include the newcomer, and
 * nothing to anyone else (PEERS index_moved, and the same in /metrics).
 * Waits poll with generous slack; nothing is timed.
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
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
#include <nng/nng.h>
#include <nng/protocol/pipeline0/push.h>

#include <xxhash.h>

#include "client_internal.h"
#include "daemon.h"
#include "kvtier.h"
#include "ops.h"
#include "peer/owners.h"

#define MAXN 4
#define NS "cl/idx"
#define CHUNK 4096

static struct tcluster T;
#define D T.d
#define url T.url
#define C T.c

static int start_node(int i)
{
    return tc_start(&T, i, 2000, NULL);
}

/* 0, or -1 if the daemon did not stop cleanly (a sanitizer report). */
static int stop_node(int i)
{
    return tc_stop(&T, i);
}

static int setup_with(int insecure)
{
    tc_init(&T, MAXN);
    T.insecure = insecure;
    for (int i = 0; i < 3; i++)
        if (start_node(i) != 0) return tc_teardown(&T), -1;
    return 0;
}

static int setup(void **state)
{
    (void)state;
    return setup_with(0);
}

/* cluster.insecure = 1: plain tcp, where a raw client can speak as a
 * member (over TLS it cannot prove the id: test_cluster_tls), so the
 * malformed-message checks are driven here. */
static int setup_insecure(void **state)
{
    (void)state;
    return setup_with(1);
}

static int teardown(void **state)
{
    (void)state;
    return tc_teardown(&T);
}

static void put_one(int node, uint64_t seed)
{
    assert_int_equal(tc_put(C[node], NS, seed, CHUNK), KVT_OK);
}

/* LOOKUP of keys seeded first..first+n through client c; tiers out. */
static uint32_t lookup_on(kvt_client *c, uint64_t first, uint32_t n, int local_only,
                          int *tiers)
{
    int got = tc_lookup(c, NS, first, n, local_only, tiers);
    assert_true(got >= 0);
    return (uint32_t)got;
}

static uint32_t lookup(int i, uint64_t first, uint32_t n, int local_only, int *tiers)
{
    return lookup_on(C[i], first, n, local_only, tiers);
}

/* Wait until node i finds exactly `want` of the n keys from `first`. */
static int wait_found(int i, uint64_t first, uint32_t n, uint32_t want)
{
    long long deadline = td_now_ms() + 20000;
    while (td_now_ms() < deadline) {
        int t[64];
        uint32_t found = 0;
        lookup(i, first, n, 0, t);
        for (uint32_t j = 0; j < n; j++) found += t[j] != KVTIER__TIER__TIER_NONE;
        if (found == want) return 0;
        usleep(100000);
    }
    fprintf(stderr, "node %d: keys from %llu not found as wanted\n", i + 1,
            (unsigned long long)first);
    return -1;
}

static void test_put_on_a_lookup_on_c(void **state)
{
    (void)state;
    int t[8];
    for (uint64_t s = 0; s < 8; s++) put_one(0, 1000 + s);
    assert_int_equal(wait_found(2, 1000, 8, 8), 0);
    assert_int_equal(lookup(2, 1000, 8, 0, t), 8);
    for (int j = 0; j < 8; j++) assert_int_equal(t[j], KVTIER__TIER__TIER_PEER);
    assert_int_equal(lookup(2, 1000, 8, 1, t), 0);     /* local_only */
    assert_int_equal(t[0], KVTIER__TIER__TIER_NONE);
    assert_int_equal(lookup(0, 1000, 8, 0, t), 8);     /* the holder: DRAM */
    assert_int_equal(t[0], KVTIER__TIER__TIER_DRAM);
    assert_int_equal(lookup(2, 5000, 4, 0, NULL), 0);  /* nobody has these */
}

/* Chunks 2000 + 100*node + k are put on node (0-based). */
static void put_round(int k, const int *live, int n_live)
{
    for (int j = 0; j < n_live; j++) put_one(live[j], 2000 + 100 * (uint64_t)live[j] + (uint64_t)k);
}

static void test_join_and_leave_while_putting(void **state)
{
    (void)state;
    int live3[] = {0, 1, 2}, live_after[] = {0, 1, 3};
    for (int k = 0; k < 20; k++) put_round(k, live3, 3);
    assert_int_equal(start_node(3), 0);  /* joins through node 1 */
    for (int k = 20; k < 30; k++) put_round(k, live3, 3);
    assert_int_equal(stop_node(2), 0);   /* leaves */
    for (int k = 30; k < 50; k++) put_round(k, live_after, 3);
    for (int a = 0; a < 3; a++) {        /* every live node ... */
        int i = live_after[a];
        for (int b = 0; b < 3; b++) {    /* ... finds every live holder's chunks */
            int h = live_after[b];
            if (h == 3) continue;        /* node 4 joined late: it put none */
            assert_int_equal(wait_found(i, 2000 + 100 * (uint64_t)h, 50, 50), 0);
        }
        assert_int_equal(wait_found(i, 2200, 30, 0), 0); /* the leaver's: misses */
    }
}

/* A member joins while the holder has not heard of it yet (stopped): the
 * owners the asker now counts on have not been told, and the one that was
 * no longer owns the keys. A LOOKUP that found every key must still find
 * every key (issue 10: it flapped from 8 to 2). Node A holds 16 chunks;
 * C joins through A; A stops; B joins through C. */
static struct tcluster J;

static int wait_found_on(kvt_client *c, uint64_t first, uint32_t n)
{
    for (long long end = td_now_ms() + 20000; td_now_ms() < end; usleep(100000))
        if (lookup_on(c, first, n, 0, NULL) == n) return 0;
    return -1;
}

/* Entries in node c's part of the global index. */
static uint64_t index_entries(kvt_client *c)
{
    Kvtier__Response *r = NULL;
    assert_int_equal(tc_peers(c, &r), KVT_OK);
    uint64_t n = r->peers->index_entries;
    kvtier__response__free_unpacked(r, NULL);
    return n;
}

static void test_no_flap_while_a_member_joins(void **state)
{
    (void)state;
    tc_init(&J, 3);
    /* A's stall must not be taken for a death: suspicions last >= 10 s */
    static const char *const slow[] = {"--cluster.suspicion_mult", "50", NULL};
    J.seed[1] = 2; /* B joins through C */
    assert_int_equal(tc_start(&J, 0, 20000, slow), 0);
    for (uint64_t s = 0; s < 16; s++)
        assert_int_equal(tc_put(J.c[0], NS, 7000 + s, CHUNK), KVT_OK);
    assert_int_equal(tc_start(&J, 2, 20000, slow), 0);
    assert_int_equal(tc_wait_alive(&J, 2, 1, 0), 0);
    assert_int_equal(wait_found_on(J.c[2], 7000, 16), 0);
    for (int t = 0; t < 200 && index_entries(J.c[2]) < 16; t++) usleep(50000);
    assert_int_equal(index_entries(J.c[2]), 16); /* C owns every key now */
    kill(J.d[0].pid, SIGSTOP);           /* A hears of nobody new */
    assert_int_equal(tc_start(&J, 1, 20000, slow), 0);
    assert_int_equal(tc_wait_alive(&J, 2, 2, 0), 0);
    usleep(300000);                      /* a few ticks: sweeps run */
    assert_int_equal(lookup_on(J.c[2], 7000, 16, 0, NULL), 16);
    kill(J.d[0].pid, SIGCONT);
    assert_int_equal(tc_wait_alive(&J, 0, 2, 0), 0);
    assert_int_equal(lookup_on(J.c[2], 7000, 16, 0, NULL), 16);
    assert_int_equal(wait_found_on(J.c[1], 7000, 16), 0);
    assert_int_equal(tc_teardown(&J), 0);
}

/* The holder A stalls (SIGSTOP) past the others' failure timeout but not
 * its own: B and C take it for dead and drop what it holds, then hear it
 * again; A saw no change. The owners must learn A's chunks again (A
 * republishes when a member it holds alive sends it Joins), or every key
 * they own stays a miss (issue 10). */
static void test_owners_relearn_after_holder_stall(void **state)
{
    (void)state;
    tc_init(&J, 3);
    for (int i = 0; i < 3; i++)
        assert_int_equal(tc_start(&J, i, i == 0 ? 30000 : 1000, NULL), 0);
    for (int i = 0; i < 3; i++) assert_int_equal(tc_wait_alive(&J, i, 2, 0), 0);
    for (uint64_t s = 0; s < 16; s++)
        assert_int_equal(tc_put(J.c[0], NS, 8000 + s, CHUNK), KVT_OK);
    assert_int_equal(wait_found_on(J.c[2], 8000, 16), 0);
    kill(J.d[0].pid, SIGSTOP);
    for (int t = 0; t < 300 && index_entries(J.c[2]) > 0; t++) usleep(50000);
    assert_int_equal(index_entries(J.c[2]), 0); /* C took A for dead */
    kill(J.d[0].pid, SIGCONT);
    assert_int_equal(tc_wait_alive(&J, 2, 2, 0), 0);
    assert_int_equal(tc_wait_alive(&J, 1, 2, 0), 0);
    assert_int_equal(wait_found_on(J.c[2], 8000, 16), 0);
    assert_int_equal(wait_found_on(J.c[1], 8000, 16), 0);
    assert_int_equal(tc_teardown(&J), 0);
}

static uint64_t node2_inc;

static void peers_of(int i, uint64_t *rejected, uint64_t *entries)
{
    Kvtier__Response *r = NULL;
    assert_int_equal(tc_peers(C[i], &r), KVT_OK);
    *rejected = r->peers->rejected;
    *entries = r->peers->index_entries;
    for (size_t k = 0; k < r->peers->n_peers; k++)
        if (r->peers->peers[k]->node_id == 2) node2_inc = r->peers->peers[k]->incarnation;
    kvtier__response__free_unpacked(r, NULL);
}

/* Send pm to node 1 as node 2 would (same id and url). */
static void push_as_node2(Kvtier__PeerMsg *pm)
{
    pm->node_id = 2;
    pm->addr = url[1];
    pm->incarnation = node2_inc; /* node 2's own: no rejoin */
    uint8_t buf[1024];
    size_t len = kvtier__peer_msg__pack(pm, buf);
    nng_socket s;
    assert_int_equal(tc_dial(&s, url[0], "node-2", 0), 0);
    assert_int_equal(nng_send(s, buf, len, 0), 0);
    usleep(100000);
    tc_close(s);
}

static int wait_rejected(uint64_t want)
{
    for (int t = 0; t < 200; t++, usleep(25000)) {
        uint64_t rj, en;
        peers_of(0, &rj, &en);
        if (rj >= want) return 0;
    }
    return -1;
}

static void test_malformed_index_messages(void **state)
{
    (void)state;
    uint64_t rj0, en0, rj1, en1;
    peers_of(0, &rj0, &en0);
    uint8_t shortkey[5] = {1, 2, 3, 4, 5};
    ProtobufCBinaryData kb = {sizeof shortkey, shortkey};
    uint64_t nsh[2] = {1, 2};
    protobuf_c_boolean drop[1] = {0};
    Kvtier__PeerIndex ix = KVTIER__PEER_INDEX__INIT;
    ix.keys = &kb, ix.n_keys = 1, ix.ns_hash = nsh, ix.n_ns_hash = 1;
    ix.drop = drop, ix.n_drop = 1;
    Kvtier__PeerMsg pm = KVTIER__PEER_MSG__INIT;
    pm.body_case = KVTIER__PEER_MSG__BODY_INDEX;
    pm.index = &ix;
    push_as_node2(&pm);                   /* a 5-byte key */
    assert_int_equal(wait_rejected(rj0 + 1), 0);
    kvt_key k = td_key(77);
    kb = (ProtobufCBinaryData){KVT_KEY_LEN, k.b};
    ix.n_ns_hash = 2;                     /* arrays of different lengths */
    push_as_node2(&pm);
    assert_int_equal(wait_rejected(rj0 + 2), 0);
    Kvtier__PeerWhoHas w = KVTIER__PEER_WHO_HAS__INIT;
    w.keys = &kb, w.n_keys = 1, w.ns_hash = nsh, w.n_ns_hash = 2;
    pm.body_case = KVTIER__PEER_MSG__BODY_WHO_HAS;
    pm.who_has = &w;
    push_as_node2(&pm);
    assert_int_equal(wait_rejected(rj0 + 3), 0);
    uint32_t holders[1] = {2};
    Kvtier__PeerHolders h = KVTIER__PEER_HOLDERS__INIT;
    h.query_id = 987654321, h.holders = holders, h.n_holders = 1;
    pm.body_case = KVTIER__PEER_MSG__BODY_HOLDERS;
    pm.holders = &h;
    push_as_node2(&pm);                   /* an answer to no query */
    assert_int_equal(wait_rejected(rj0 + 4), 0);
    kb = (ProtobufCBinaryData){sizeof shortkey, shortkey};
    Kvtier__PeerPin pin = KVTIER__PEER_PIN__INIT;
    pin.pin_id = 5, pin.ns = NS, pin.keys = &kb, pin.n_keys = 1;
    pm.body_case = KVTIER__PEER_MSG__BODY_PIN;
    pm.pin = &pin;
    push_as_node2(&pm);                   /* a pin of a 5-byte key */
    assert_int_equal(wait_rejected(rj0 + 5), 0);
    uint64_t v[1] = {0};
    Kvtier__PeerPinned pd = KVTIER__PEER_PINNED__INIT;
    pd.pin_id = 424242, pd.offset = v, pd.n_offset = 1, pd.size = v, pd.n_size = 1;
    pd.checksum = v, pd.n_checksum = 1;
    pm.body_case = KVTIER__PEER_MSG__BODY_PINNED;
    pm.pinned = &pd;
    push_as_node2(&pm);                   /* pinned: an answer to no pin */
    assert_int_equal(wait_rejected(rj0 + 6), 0);
    peers_of(0, &rj1, &en1);
    assert_int_equal(rj1, rj0 + 6);
    (void)en0, (void)en1; /* entries move with membership: not compared */
    assert_true(td_log_has(&D[0], "malformed index update"));
    assert_true(td_log_has(&D[0], "cluster.insecure = 1: plain tcp"));
}

/* index_moved of node i of cluster tc. */
static uint64_t moved_on(struct tcluster *tc, int i)
{
    Kvtier__Peers p = KVTIER__PEERS__INIT;
    Kvtier__Request q = KVTIER__REQUEST__INIT;
    Kvtier__Response *r = NULL;
    q.body_case = KVTIER__REQUEST__BODY_PEERS;
    q.peers = &p;
    assert_int_equal(kvtc_call(tc->c[i], &q, &r), KVT_OK);
    uint64_t n = r->peers->index_moved;
    kvtier__response__free_unpacked(r, NULL);
    return n;
}

/* Node A holds 60 chunks; D joins a cluster of A, B, C: A sends D the
 * entries whose owners now include D (counted here with owners.c over
 * ids 1..4) and nobody anything else. Before, every key went to every
 * owner again. */
static void test_join_moves_only_changed_keys(void **state)
{
    (void)state;
    struct tcluster M;
    const uint32_t ids[4] = {1, 2, 3, 4};
    uint64_t nsh = XXH3_64bits(NS, strlen(NS));
    uint32_t want = 0, o[OW_MAX_REPLICAS];
    /* only the join may change the view: a member suspected and back on a
     * loaded machine would move keys too (suspicions last >= 10 s) */
    static const char *const slow[] = {"--cluster.suspicion_mult", "50", NULL};
    tc_init(&M, 4);
    for (int i = 0; i < 3; i++) assert_int_equal(tc_start(&M, i, 20000, slow), 0);
    assert_int_equal(tc_wait_alive(&M, 0, 2, 0), 0);
    for (uint64_t s = 0; s < 60; s++) {
        kvt_key k = td_key(9000 + s);
        assert_int_equal(tc_put(M.c[0], NS, 9000 + s, CHUNK), KVT_OK);
        uint32_t n = owners_of(&k, nsh, ids, 4, 2, o);
        for (uint32_t j = 0; j < n; j++) want += o[j] == 4;
    }
    assert_int_equal(wait_found_on(M.c[2], 9000, 60), 0);
    uint64_t before[3];
    for (int i = 0; i < 3; i++) before[i] = moved_on(&M, i);
    assert_int_equal(tc_start(&M, 3, 20000, slow), 0);
    assert_int_equal(tc_wait_alive(&M, 0, 3, 0), 0);
    assert_int_equal(wait_found_on(M.c[3], 9000, 60), 0);
    for (int t = 0; t < 200 && moved_on(&M, 0) - before[0] < want; t++) usleep(50000);
    usleep(500000); /* a few more ticks: nothing else may follow */
    assert_true(want > 0 && want < 60);
    assert_int_equal(moved_on(&M, 0) - before[0], want);
    assert_int_equal(moved_on(&M, 1), before[1]); /* they hold nothing */
    assert_int_equal(moved_on(&M, 2), before[2]);
    char base[128], *body = NULL;               /* the same count in /metrics */
    int status = 0;
    struct prom p;
    assert_int_equal(ops_metrics_base(&M.d[0], base, sizeof base, 5000), 0);
    assert_int_equal(ops_http_get(base, "/metrics", &status, &body), 0);
    assert_int_equal(status, 200);
    assert_int_equal(prom_parse(body, &p), 0);
    assert_true(prom_get(&p, "kvtier_index_entries_moved_total", "") ==
                (double)moved_on(&M, 0));
    assert_true(prom_get(&p, "kvtier_owner_queries_timed_out_total", "") >= 0);
    prom_free(&p);
    free(body);
    assert_int_equal(tc_teardown(&M), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_put_on_a_lookup_on_c),
        cmocka_unit_test(test_join_and_leave_while_putting),
        cmocka_unit_test(test_no_flap_while_a_member_joins),
        cmocka_unit_test(test_owners_relearn_after_holder_stall),
        cmocka_unit_test(test_join_moves_only_changed_keys),
    };
    const struct CMUnitTest plain[] = {
        cmocka_unit_test(test_put_on_a_lookup_on_c),
        cmocka_unit_test(test_malformed_index_messages),
    };
    int rc = cmocka_run_group_tests_name("tls", tests, setup, teardown);
    return rc | cmocka_run_group_tests_name("insecure", plain, setup_insecure, teardown);
}
