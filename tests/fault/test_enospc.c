/*
 * test_enospc.c -- a full pool, the eviction order, and what is never
 * evicted, against a real kvtierd with a 4 MiB pool (16 chunks of 256 KiB)
 * and watermark eviction switched off, so every eviction here is one that
 * a reservation forced.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "daemon.h"
#include "kvtier.h"

#define CH (256u << 10)

static struct tdaemon D;

static int setup(void **state)
{
    (void)state;
    const char *extra[] = {"--pool-bytes", "4M", "--high-watermark", "1.0",
                           "--low-watermark", "0.99", NULL};
    return td_start(&D, extra);
}

static int teardown(void **state)
{
    (void)state;
    int rc = td_stop(&D);
    td_cleanup(&D);
    return rc;
}

static void clear_all(kvt_client *c)
{
    uint64_t freed;
    assert_int_equal(kvt_evict(c, 4u << 20, &freed), KVT_OK);
}

/* Put a chain of n chunks, seeds base..base+n-1, each the parent of the
 * next; parent_seed (or 0) precedes the first. */
static kvt_err put_chain(kvt_client *c, uint64_t base, size_t n, uint64_t parent_seed)
{
    kvt_key keys[16], parent = td_key(parent_seed);
    size_t sizes[16];
    kvt_chunk ch[16];
    kvt_lease l;
    for (size_t i = 0; i < n; i++) {
        keys[i] = td_key(base + i);
        sizes[i] = CH;
    }
    kvt_err e = kvt_put_begin(c, "ev", keys, sizes, n, parent_seed ? &parent : NULL, &l, ch);
    if (e) return e;
    for (size_t i = 0; i < n; i++)
        if (!ch[i].exists) td_fill(ch[i].data, CH, base + i);
    return kvt_put_commit(c, l, ch, n, NULL);
}

static int present(kvt_client *c, uint64_t seed)
{
    kvt_key k = td_key(seed);
    size_t n;
    kvt_tier t;
    assert_int_equal(kvt_lookup(c, "ev", &k, 1, &n, &t), KVT_OK);
    return n == 1;
}

static void check_bytes(kvt_client *c, uint64_t seed)
{
    kvt_key k = td_key(seed);
    uint8_t *got = malloc(CH), *want = malloc(CH);
    size_t sz;
    assert_int_equal(kvt_get_copy(c, "ev", &k, got, CH, &sz), KVT_OK);
    td_fill(want, CH, seed);
    assert_memory_equal(got, want, CH);
    free(got);
    free(want);
}

/* Two chains fill the pool; new chunks evict the colder chain from its
 * tail backwards, and its head (the shared prefix) survives longest. */
static void test_prefix_aware_order(void **state)
{
    (void)state;
    kvt_client *c = td_connect(&D);
    clear_all(c);
    assert_int_equal(put_chain(c, 100, 8, 0), KVT_OK); /* chain A: colder */
    assert_int_equal(put_chain(c, 200, 8, 0), KVT_OK); /* chain B */
    /* Touch A's head: plain LRU would now evict B first; prefix-aware
     * eviction still takes A's leaf, since A's head has children. */
    assert_true(present(c, 100));
    assert_int_equal(put_chain(c, 300, 4, 0), KVT_OK);
    for (uint64_t s = 100; s < 104; s++) assert_true(present(c, s));
    for (uint64_t s = 104; s < 108; s++) assert_false(present(c, s));
    for (uint64_t s = 200; s < 208; s++) assert_true(present(c, s));
    check_bytes(c, 103);
    check_bytes(c, 207);
    kvt_close(c);
}

/* Pinned and uncommitted chunks are never evicted; with nothing else to
 * evict, a reservation fails with KVT_ENOSPC and nothing is corrupted. */
static void test_full_of_pinned(void **state)
{
    (void)state;
    kvt_client *c = td_connect(&D);
    clear_all(c);
    assert_int_equal(put_chain(c, 400, 8, 0), KVT_OK);
    kvt_key keys[8], more[8];
    kvt_chunk rch[8], wch[8];
    size_t sizes[8], got;
    kvt_lease rl, wl, l2;
    for (int i = 0; i < 8; i++) {
        keys[i] = td_key(400 + (uint64_t)i);
        more[i] = td_key(500 + (uint64_t)i);
        sizes[i] = CH;
    }
    assert_int_equal(kvt_get(c, "ev", keys, 8, &rl, rch, &got), KVT_OK);
    assert_int_equal(got, 8);
    assert_int_equal(kvt_put_begin(c, "ev", more, sizes, 8, NULL, &wl, wch), KVT_OK);
    kvt_key one = td_key(600);
    kvt_chunk och;
    assert_int_equal(kvt_put_begin(c, "ev", &one, sizes, 1, NULL, &l2, &och), KVT_ENOSPC);
    assert_non_null(strstr(kvt_last_error(c), "reserve"));
    for (int i = 0; i < 8; i++) {
        uint8_t *want = malloc(CH);
        td_fill(want, CH, 400 + (uint64_t)i);
        assert_memory_equal(rch[i].data, want, CH);
        free(want);
    }
    assert_int_equal(kvt_put_abort(c, wl), KVT_OK);
    assert_int_equal(kvt_release(c, rl), KVT_OK);
    /* Unpinned now: the same reservation evicts and succeeds. */
    assert_int_equal(kvt_put_begin(c, "ev", &one, sizes, 1, NULL, &l2, &och), KVT_OK);
    assert_int_equal(kvt_put_abort(c, l2), KVT_OK);
    kvt_close(c);
}

/* A chunk bigger than the pool is refused outright, and a put of more
 * bytes than fit fails whole: none of its chunks is left reserved. */
static void test_too_big_for_pool(void **state)
{
    (void)state;
    kvt_client *c = td_connect(&D);
    clear_all(c);
    kvt_key keys[20];
    size_t sizes[20];
    kvt_chunk ch[20];
    kvt_lease l;
    kvt_stats s;
    for (int i = 0; i < 20; i++) {
        keys[i] = td_key(700 + (uint64_t)i);
        sizes[i] = CH;
    }
    assert_int_equal(kvt_put_begin(c, "ev", keys, sizes, 20, NULL, &l, ch), KVT_ENOSPC);
    assert_int_equal(kvt_stats_get(c, &s), KVT_OK);
    assert_int_equal(s.used_bytes, 0);
    assert_int_equal(s.leases, 0);
    kvt_close(c);
}

/* Half the pool free but in 256 KiB holes: a 1 MiB chunk must still fit,
 * by evicting until a hole is large enough, not until enough bytes are
 * free in total. */
static void test_fragmented_pool(void **state)
{
    (void)state;
    kvt_client *c = td_connect(&D);
    clear_all(c);
    for (uint64_t s = 800; s < 816; s++) assert_int_equal(put_chain(c, s, 1, 0), KVT_OK);
    for (uint64_t s = 800; s < 816; s += 2) {
        kvt_key k = td_key(s);
        size_t n;
        assert_int_equal(kvt_delete(c, "ev", &k, 1, &n), KVT_OK);
    }
    kvt_stats st;
    assert_int_equal(kvt_stats_get(c, &st), KVT_OK);
    assert_true(st.fragmentation > 0.5);
    kvt_key big = td_key(900);
    size_t size = 1u << 20;
    kvt_chunk ch;
    kvt_lease l;
    assert_int_equal(kvt_put_begin(c, "ev", &big, &size, 1, NULL, &l, &ch), KVT_OK);
    td_fill(ch.data, size, 900);
    assert_int_equal(kvt_put_commit(c, l, &ch, 1, NULL), KVT_OK);
    kvt_close(c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_prefix_aware_order),
        cmocka_unit_test(test_full_of_pinned),
        cmocka_unit_test(test_too_big_for_pool),
        cmocka_unit_test(test_fragmented_pool),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
