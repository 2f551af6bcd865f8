/*
 * test_cluster_retry.c -- a chunk fetched from a holder whose bytes fail
 * the committer's checksum is asked of the next holder the key's owners
 * listed, and is a miss only when no holder is left. Three real daemons
 * over TLS on loopback, UCX over tcp; holders flip a byte of the chunks
 * they pin (KVT_FAULT=peer_corrupt, counted per pinned chunk).
 *
 * Node 1 serves its first pin intact and corrupts every later one; node
 * 2 the same. Node 3 is the requester.
 *   - Two holders, the first corrupt: node 1 commits key A; node 2 pulls
 *     it (node 1's first pin: intact) once every owner has node 1's word,
 *     so the owners list node 1, then node 2. Node 3's GET is pinned at node 1 first (corrupt: counted),
 *     then at node 2 (its first pin: intact): the right bytes. Node 3
 *     asks only once the owners have node 2's word (published()).
 *   - Two holders, both corrupt: nodes 1 and 2 both commit key B; node 3's
 *     GET finds both corrupt: two mismatches counted, a miss, and no byte
 *     of either reaches the client.
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
#include <xxhash.h>

#include "client_internal.h"
#include "daemon.h"
#include "kvtier.h"
#include "peer/owners.h"

#define N 3
#define NS "cl/retry"
#define CHUNK (64u << 10)
#define REPLICAS 2 /* cluster.replicas' default */

static struct tcluster T;
#define C T.c

#define COUNTER(i, f) tc_counter(C[i], offsetof(Kvtier__PeersResp, f))

static void put_one(int node, uint64_t seed)
{
    assert_int_equal(tc_put(C[node], NS, seed, CHUNK), KVT_OK);
}

/* Inline GET of one key on node i: 1 found (bytes checked), 0 missed. */
static int get_one(int i, uint64_t seed)
{
    int found = tc_get_checked(C[i], NS, seed, CHUNK, 5000);
    assert_true(found >= 0); /* answered, and no wrong byte */
    return found;
}

static void wait_found(int i, uint64_t seed)
{
    if (tc_wait_found(C[i], NS, seed, 10000) == 0) return;
    fail_msg("node %d never found key %llu", i + 1, (unsigned long long)seed);
}

/* The owners of the key of seed among nodes 1..3 (ids), best first. */
static uint32_t owners(uint64_t seed, uint32_t *o)
{
    static const uint32_t view[N] = {1, 2, 3};
    kvt_key k = td_key(seed);
    /* owners rank by the namespace's XXH3-64 (gidx.c) */
    return owners_of(&k, XXH3_64bits(NS, strlen(NS)), view, N, REPLICAS, o);
}

static int owns(uint64_t seed, uint32_t id)
{
    uint32_t o[REPLICAS], n = owners(seed, o);
    for (uint32_t i = 0; i < n; i++)
        if (o[i] == id) return 1;
    return 0;
}

/* Node `from` holds the key of seed: wait until every other owner of it
 * has been told. For each such owner, node `from` commits one more key
 * that this owner owns too; what node `from` tells an owner travels in
 * order on one channel (a batch per owner, flushed in turn), so once the
 * owner counts the new key's entry it has the first one too. */
static void published(int from, uint64_t seed, uint64_t base)
{
    uint32_t o[REPLICAS], n = owners(seed, o);
    for (uint32_t i = 0; i < n; i++) {
        int owner = (int)o[i] - 1;
        if (owner == from) continue; /* its own entries are applied at once */
        uint64_t mark = base;
        while (!owns(mark, o[i])) mark++;
        base = mark + 1;
        uint64_t had = COUNTER(owner, index_entries);
        put_one(from, mark);
        int t = 0;
        while (COUNTER(owner, index_entries) <= had && t++ < 400) usleep(25000);
        assert_true(t <= 400);
    }
}

static int setup(void **state)
{
    (void)state;
    setenv("UCX_TLS", "tcp", 1);
    tc_init(&T, N);
    for (int i = 0; i < N; i++) {
        if (i < 2) setenv("KVT_FAULT", "peer_corrupt=2+", 1);
        int rc = tc_start(&T, i, 2000, NULL);
        unsetenv("KVT_FAULT");
        if (rc != 0) return tc_teardown(&T), -1;
    }
    for (int i = 0; i < N; i++)
        if (tc_wait_alive(&T, i, N - 1, 1) != 0) return tc_teardown(&T), -1;
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    return tc_teardown(&T);
}

static void test_corrupt_holder_then_good_one(void **state)
{
    (void)state;
    put_one(0, 1);
    published(0, 1, 50); /* every owner lists node 1 first */
    wait_found(1, 1);
    uint64_t bad2 = COUNTER(1, bad_checksums);
    assert_int_equal(get_one(1, 1), 1); /* node 1's first pin: intact */
    assert_int_equal(COUNTER(1, bad_checksums), bad2);
    published(1, 1, 100);
    uint64_t bad = COUNTER(2, bad_checksums), hits = COUNTER(2, remote_hits);
    assert_int_equal(get_one(2, 1), 1); /* node 1 corrupt, node 2 intact */
    assert_int_equal(COUNTER(2, bad_checksums), bad + 1);
    assert_int_equal(COUNTER(2, remote_hits), hits + 1);
    assert_true(td_log_has(&T.d[2], "failed its checksum"));
    assert_true(td_log_has(&T.d[2], "trying node 2 for the chunk instead"));
}

static void test_every_holder_corrupt(void **state)
{
    (void)state;
    put_one(0, 2);
    put_one(1, 2); /* the same bytes: a second holder */
    published(0, 2, 250);
    published(1, 2, 200);
    uint64_t bad = COUNTER(2, bad_checksums), hits = COUNTER(2, remote_hits);
    assert_int_equal(get_one(2, 2), 0); /* a miss, and no wrong byte */
    assert_int_equal(COUNTER(2, bad_checksums), bad + 2);
    assert_int_equal(COUNTER(2, remote_hits), hits);
    usleep(500000);                     /* holders restore the byte at unpin */
    assert_int_equal(get_one(0, 2), 1); /* their own copies are intact */
    assert_int_equal(get_one(1, 2), 1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_corrupt_holder_then_good_one),
        cmocka_unit_test(test_every_holder_corrupt),
    };
    return cmocka_run_group_tests_name("retry", tests, setup, teardown);
}
