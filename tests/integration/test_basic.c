/*
 * test_basic.c -- a real kvtierd driven through libkvtier: zero-copy and
 * inline put/get, lookup prefixes and tiers, exists, abort, delete, clear,
 * namespaces kept apart, lease deadlines, list and evict.
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

static struct tdaemon D;
static char tcp_url[64];

static int setup(void **state)
{
    (void)state;
    int port = td_free_port();
    snprintf(tcp_url, sizeof tcp_url, "tcp://127.0.0.1:%d", port);
    const char *extra[] = {"--tcp", tcp_url, "--tcp-insecure", "1", NULL};
    return td_start(&D, extra);
}

static int teardown(void **state)
{
    (void)state;
    int rc = td_stop(&D);
    td_cleanup(&D);
    return rc;
}

/* Put n chunks of size bytes with keys seeded from base, zero-copy. */
static void put_n(kvt_client *c, const char *ns, uint64_t base, size_t n,
                  size_t size)
{
    kvt_key keys[16];
    size_t sizes[16];
    kvt_chunk ch[16];
    kvt_lease l;
    assert_true(n <= 16);
    for (size_t i = 0; i < n; i++) {
        keys[i] = td_key(base + i);
        sizes[i] = size;
    }
    assert_int_equal(kvt_put_begin(c, ns, keys, sizes, n, NULL, &l, ch), KVT_OK);
    for (size_t i = 0; i < n; i++)
        if (!ch[i].exists) td_fill(ch[i].data, size, base + i);
    assert_int_equal(kvt_put_commit(c, l, ch, n, NULL), KVT_OK);
}

static void test_connect_and_stats(void **state)
{
    (void)state;
    kvt_client *c = td_connect(&D);
    kvt_stats s;
    assert_true(kvt_zero_copy(c));
    assert_int_equal(kvt_stats_get(c, &s), KVT_OK);
    assert_int_equal(s.pool_bytes, 64ull << 20);
    assert_true(s.clients >= 1);
    kvt_close(c);
}

static void test_zero_copy_roundtrip(void **state)
{
    (void)state;
    kvt_client *c = td_connect(&D);
    put_n(c, "zc", 100, 3, 1 << 20);
    kvt_key keys[3] = {td_key(100), td_key(101), td_key(102)};
    kvt_chunk ch[3];
    kvt_lease l;
    size_t got;
    uint8_t *want = malloc(1 << 20);
    assert_int_equal(kvt_get(c, "zc", keys, 3, &l, ch, &got), KVT_OK);
    assert_int_equal(got, 3);
    for (int i = 0; i < 3; i++) {
        td_fill(want, 1 << 20, 100 + (uint64_t)i);
        assert_int_equal(ch[i].size, 1 << 20);
        assert_memory_equal(ch[i].data, want, 1 << 20);
        assert_true(ch[i].checksum == kvt_checksum(want, 1 << 20));
    }
    kvt_stats s;
    assert_int_equal(kvt_stats_get(c, &s), KVT_OK);
    assert_int_equal(s.leases, 1);
    assert_int_equal(kvt_release(c, l), KVT_OK);
    assert_int_equal(kvt_release(c, l), KVT_ENOENT);
    assert_int_equal(kvt_stats_get(c, &s), KVT_OK);
    assert_int_equal(s.leases, 0);
    free(want);
    kvt_close(c);
}

static void test_exists_and_abort(void **state)
{
    (void)state;
    kvt_client *c = td_connect(&D);
    put_n(c, "ex", 200, 2, 4096);
    kvt_key keys[3] = {td_key(200), td_key(201), td_key(202)};
    size_t sizes[3] = {4096, 4096, 8192};
    kvt_chunk ch[3];
    kvt_lease l;
    kvt_stats before, after;
    assert_int_equal(kvt_stats_get(c, &before), KVT_OK);
    assert_int_equal(kvt_put_begin(c, "ex", keys, sizes, 3, NULL, &l, ch), KVT_OK);
    assert_true(ch[0].exists && ch[1].exists && !ch[2].exists);
    assert_null(ch[0].data);
    assert_non_null(ch[2].data);
    memset(ch[2].data, 0x5a, 8192);
    size_t present;
    assert_int_equal(kvt_lookup(c, "ex", keys, 3, &present, NULL), KVT_OK);
    assert_int_equal(present, 2); /* uncommitted chunk is invisible */
    assert_int_equal(kvt_put_abort(c, l), KVT_OK);
    assert_int_equal(kvt_put_commit(c, l, ch, 3, NULL), KVT_ENOENT);
    assert_int_equal(kvt_lookup(c, "ex", keys, 3, &present, NULL), KVT_OK);
    assert_int_equal(present, 2);
    assert_int_equal(kvt_stats_get(c, &after), KVT_OK);
    assert_int_equal(after.used_bytes, before.used_bytes);
    kvt_close(c);
}

static void test_lookup_prefix_and_tiers(void **state)
{
    (void)state;
    kvt_client *c = td_connect(&D);
    put_n(c, "lk", 300, 5, 4096);
    kvt_key keys[5];
    for (int i = 0; i < 5; i++) keys[i] = td_key(300 + (uint64_t)i);
    size_t del, present;
    assert_int_equal(kvt_delete(c, "lk", &keys[2], 1, &del), KVT_OK);
    assert_int_equal(del, 1);
    kvt_tier t[5];
    assert_int_equal(kvt_lookup(c, "lk", keys, 5, &present, t), KVT_OK);
    assert_int_equal(present, 2);
    assert_int_equal(t[0], KVT_TIER_DRAM);
    assert_int_equal(t[1], KVT_TIER_DRAM);
    assert_int_equal(t[2], KVT_TIER_NONE);
    assert_int_equal(t[3], KVT_TIER_DRAM);
    /* A namespace nobody used: a miss, not an error. */
    assert_int_equal(kvt_lookup(c, "never-used", keys, 5, &present, t), KVT_OK);
    assert_int_equal(present, 0);
    kvt_close(c);
}

static void test_namespaces_apart(void **state)
{
    (void)state;
    kvt_client *c = td_connect(&D);
    kvt_key k = td_key(400);
    char a[100], b[100], out[100];
    size_t sz, n_new;
    memset(a, 'a', sizeof a);
    memset(b, 'b', sizeof b);
    const void *pa[1] = {a}, *pb[1] = {b};
    size_t len = sizeof a;
    assert_int_equal(kvt_put(c, "tenant-a", &k, pa, &len, 1, NULL, &n_new), KVT_OK);
    assert_int_equal(n_new, 1);
    assert_int_equal(kvt_put(c, "tenant-b", &k, pb, &len, 1, NULL, &n_new), KVT_OK);
    assert_int_equal(n_new, 1);
    assert_int_equal(kvt_get_copy(c, "tenant-a", &k, out, sizeof out, &sz), KVT_OK);
    assert_memory_equal(out, a, sizeof a);
    assert_int_equal(kvt_get_copy(c, "tenant-b", &k, out, sizeof out, &sz), KVT_OK);
    assert_memory_equal(out, b, sizeof b);
    uint64_t cleared;
    assert_int_equal(kvt_clear(c, "tenant-a", &cleared), KVT_OK);
    assert_int_equal(cleared, 1);
    assert_int_equal(kvt_get_copy(c, "tenant-a", &k, out, sizeof out, &sz), KVT_ENOENT);
    assert_int_equal(kvt_get_copy(c, "tenant-b", &k, out, sizeof out, &sz), KVT_OK);
    assert_int_equal(kvt_get_copy(c, "tenant-b", &k, out, 10, &sz), KVT_ETOOBIG);
    assert_int_equal(sz, sizeof b);
    kvt_close(c);
}

static void test_inline_over_tcp(void **state)
{
    (void)state;
    kvt_client *c;
    assert_int_equal(kvt_connect(tcp_url, &c), KVT_OK);
    assert_false(kvt_zero_copy(c));
    size_t sizes[2] = {3 << 20, 5000}, n_new, sz;
    uint8_t *b0 = malloc(sizes[0]), *b1 = malloc(sizes[1]), *out = malloc(sizes[0]);
    td_fill(b0, sizes[0], 500);
    td_fill(b1, sizes[1], 501);
    const void *bufs[2] = {b0, b1};
    kvt_key keys[2] = {td_key(500), td_key(501)};
    kvt_lease l;
    kvt_chunk ch[2];
    assert_int_equal(kvt_put_begin(c, "tcp", keys, sizes, 2, NULL, &l, ch), KVT_ENOTSUP);
    assert_int_equal(kvt_put(c, "tcp", keys, bufs, sizes, 2, NULL, &n_new), KVT_OK);
    assert_int_equal(n_new, 2);
    assert_int_equal(kvt_get_copy(c, "tcp", &keys[0], out, sizes[0], &sz), KVT_OK);
    assert_int_equal(sz, sizes[0]);
    assert_memory_equal(out, b0, sizes[0]);
    kvt_close(c);
    /* The same bytes through the local, zero-copy path. */
    c = td_connect(&D);
    assert_int_equal(kvt_get_copy(c, "tcp", &keys[1], out, sizes[0], &sz), KVT_OK);
    assert_int_equal(sz, sizes[1]);
    assert_memory_equal(out, b1, sizes[1]);
    kvt_close(c);
    free(b0);
    free(b1);
    free(out);
}

static void test_list_and_evict(void **state)
{
    (void)state;
    kvt_client *c = td_connect(&D);
    put_n(c, "ls", 600, 4, 65536);
    Kvtier__Request q = KVTIER__REQUEST__INIT;
    Kvtier__List l = KVTIER__LIST__INIT;
    Kvtier__Response *r;
    l.ns = "ls";
    q.body_case = KVTIER__REQUEST__BODY_LIST;
    q.list = &l;
    assert_int_equal(kvtc_call(c, &q, &r), KVT_OK);
    assert_int_equal(r->list->n_entries, 4);
    assert_int_equal(r->list->entries[0]->size, 65536);
    kvtier__response__free_unpacked(r, NULL);
    kvt_stats s;
    uint64_t freed;
    assert_int_equal(kvt_evict(c, 64ull << 20, &freed), KVT_OK);
    assert_true(freed >= 4 * 65536);
    assert_int_equal(kvt_stats_get(c, &s), KVT_OK);
    assert_int_equal(s.chunks, 0);
    assert_true(s.evictions >= 4);
    kvt_close(c);
}

static void test_lease_deadline(void **state)
{
    (void)state;
    struct tdaemon d2;
    const char *extra[] = {"--lease-timeout-ms", "300", NULL};
    assert_int_equal(td_init(&d2), 0);
    assert_int_equal(td_start(&d2, extra), 0);
    kvt_client *c = td_connect(&d2);
    put_n(c, "dl", 700, 1, 4096);
    kvt_key keys[2] = {td_key(700), td_key(701)};
    size_t sizes[1] = {4096}, got, present;
    kvt_chunk ch[1], rch[1];
    kvt_lease wl, rl;
    assert_int_equal(kvt_put_begin(c, "dl", &keys[1], sizes, 1, NULL, &wl, ch), KVT_OK);
    assert_int_equal(kvt_get(c, "dl", keys, 1, &rl, rch, &got), KVT_OK);
    assert_int_equal(got, 1);
    long long t0 = td_now_ms();
    kvt_stats s = {0};
    while (td_now_ms() - t0 < 10000) {
        assert_int_equal(kvt_stats_get(c, &s), KVT_OK);
        if (s.leases == 0) break;
        usleep(50000);
    }
    assert_int_equal(s.leases, 0);
    assert_int_equal(kvt_put_commit(c, wl, ch, 1, NULL), KVT_ENOENT);
    assert_int_equal(kvt_release(c, rl), KVT_ENOENT);
    assert_int_equal(kvt_lookup(c, "dl", keys, 2, &present, NULL), KVT_OK);
    assert_int_equal(present, 1);
    assert_int_equal(s.used_bytes, 4096);
    kvt_close(c);
    assert_int_equal(td_stop(&d2), 0);
    td_cleanup(&d2);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_connect_and_stats),
        cmocka_unit_test(test_zero_copy_roundtrip),
        cmocka_unit_test(test_exists_and_abort),
        cmocka_unit_test(test_lookup_prefix_and_tiers),
        cmocka_unit_test(test_namespaces_apart),
        cmocka_unit_test(test_inline_over_tcp),
        cmocka_unit_test(test_list_and_evict),
        cmocka_unit_test(test_lease_deadline),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
