/*
 * test_index.c -- the chunk index (index.c) on its own: insert, find,
 * touch and remove; (namespace, key) identity; the prefix-aware eviction
 * order (only leaves are victims, a chain goes from its tail, a shared
 * prefix outlives its children, pinned and uncommitted chunks are never
 * victims); a parent reference to a reused slot is ignored; the DRAM list
 * follows which tiers hold a chunk; growth up to the capacity without the
 * entries ever moving, and slots reused with a new generation.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "daemon.h"
#include "index.h"

#define CAP 5000u

static struct idx X;

static int each_setup(void **state)
{
    (void)state;
    return idx_init(&X, CAP);
}

static int each_teardown(void **state)
{
    (void)state;
    idx_destroy(&X);
    return 0;
}

static uint32_t add(uint16_t ns, uint64_t seed, uint32_t size)
{
    kvt_key k = td_key(seed);
    assert_int_equal(idx_find(&X, ns, &k), IDX_NONE);
    uint32_t s = idx_insert(&X, ns, &k);
    assert_int_not_equal(s, IDX_NONE);
    idx_at(&X, s)->size = size;
    return s;
}

/* Insert and commit chunk seed of ns under parent (a slot or IDX_NONE). */
static uint32_t put(uint16_t ns, uint64_t seed, uint32_t parent)
{
    uint32_t s = add(ns, seed, 4096);
    idx_commit(&X, s, parent, 1);
    return s;
}

static uint32_t find(uint16_t ns, uint64_t seed)
{
    kvt_key k = td_key(seed);
    return idx_find(&X, ns, &k);
}

/* The DRAM eviction list, coldest first, into out[]; returns its length. */
static uint32_t victims(uint32_t *out, uint32_t max)
{
    uint32_t n = 0;
    for (uint32_t i = X.lru_tail; i != IDX_NONE && n < max; i = idx_at(&X, i)->lru_prev)
        out[n++] = i;
    return n;
}

static void test_insert_find_touch_remove(void **state)
{
    (void)state;
    uint32_t s = add(1, 10, 4096);
    struct idx_entry *e = idx_at(&X, s);
    assert_int_equal(e->state, IDX_PENDING);
    assert_int_equal(find(1, 10), s);
    assert_int_equal(idx_victim(&X), IDX_NONE); /* uncommitted: no victim */
    assert_int_equal(X.n_ready, 0);
    assert_int_equal(idx_ns_slots(&X, 1), 1);

    idx_commit(&X, s, IDX_NONE, 5);
    assert_int_equal(e->state, IDX_READY);
    assert_int_equal(e->atime, 5);
    assert_int_equal(idx_victim(&X), s);
    assert_int_equal(X.n_ready, 1);
    assert_int_equal(X.bytes_ready, 4096);
    assert_int_equal(X.n_in[0], 1);
    assert_int_equal(idx_top_tier(e), KVT_TIER_DRAM);

    uint32_t t = put(1, 11, IDX_NONE);          /* the newer one: at the head */
    assert_int_equal(idx_victim(&X), s);
    idx_touch(&X, s, 9);                        /* s is the most recent now */
    assert_int_equal(e->atime, 9);
    assert_int_equal(idx_victim(&X), t);

    idx_remove(&X, t);
    assert_int_equal(find(1, 11), IDX_NONE);
    assert_int_equal(idx_victim(&X), s);
    idx_remove(&X, s);
    assert_int_equal(find(1, 10), IDX_NONE);
    assert_int_equal(idx_victim(&X), IDX_NONE);
    assert_int_equal(X.n_ready, 0);
    assert_int_equal(X.bytes_ready, 0);
    assert_int_equal(idx_ns_slots(&X, 1), 0);
}

static void test_namespaces_apart(void **state)
{
    (void)state;
    uint32_t a = put(1, 20, IDX_NONE), b = put(2, 20, IDX_NONE);
    assert_int_not_equal(a, b);
    assert_int_equal(find(1, 20), a);
    assert_int_equal(find(2, 20), b);
    assert_int_equal(find(3, 20), IDX_NONE);
    assert_int_equal(idx_ns_slots(&X, 1), 1);
    assert_int_equal(idx_ns_slots(&X, 2), 1);
    idx_remove(&X, a);
    assert_int_equal(find(1, 20), IDX_NONE);
    assert_int_equal(find(2, 20), b);           /* the other tenant's stays */
    assert_int_equal(idx_ns_slots(&X, 1), 0);
}

static void test_chain_from_its_tail(void **state)
{
    (void)state;
    uint32_t a = put(1, 30, IDX_NONE);
    uint32_t b = put(1, 31, a);
    uint32_t c = put(1, 32, b);
    uint32_t lone = put(1, 40, IDX_NONE);
    uint32_t v[8];
    /* Only the leaves are victims: c (older), then lone. */
    assert_int_equal(victims(v, 8), 2);
    assert_int_equal(v[0], c);
    assert_int_equal(v[1], lone);
    assert_int_equal(idx_at(&X, a)->children, 1);
    idx_touch(&X, a, 7);                        /* not a leaf: no effect */
    assert_int_equal(victims(v, 8), 2);
    idx_touch(&X, c, 7);                        /* c most recent */
    assert_int_equal(idx_victim(&X), lone);
    idx_remove(&X, lone);
    /* Eat the chain: each parent joins at the cold end as its last child
     * goes, so the prefix is eaten from its tail backwards. */
    assert_int_equal(idx_victim(&X), c);
    idx_remove(&X, c);
    assert_int_equal(idx_victim(&X), b);
    idx_remove(&X, b);
    assert_int_equal(idx_victim(&X), a);
    idx_remove(&X, a);
    assert_int_equal(idx_victim(&X), IDX_NONE);
}

static void test_shared_prefix_outlives_children(void **state)
{
    (void)state;
    uint32_t root = put(1, 50, IDX_NONE);
    uint32_t k1 = put(1, 51, root), k2 = put(1, 52, root);
    uint32_t other = put(1, 60, IDX_NONE);
    assert_int_equal(idx_at(&X, root)->children, 2);
    uint32_t v[8];
    assert_int_equal(victims(v, 8), 3);         /* k1, k2, other: not root */
    for (int i = 0; i < 3; i++) assert_int_not_equal(v[i], root);
    idx_remove(&X, k1);
    assert_int_equal(idx_at(&X, root)->children, 1);
    assert_int_equal(victims(v, 8), 2);         /* root still has k2 */
    idx_remove(&X, k2);
    /* root is a leaf now, at the cold end, older than `other`. */
    assert_int_equal(idx_victim(&X), root);
    (void)other;
}

static void test_pinned_and_doomed(void **state)
{
    (void)state;
    uint32_t s = put(1, 70, IDX_NONE), t = put(1, 71, IDX_NONE);
    idx_pin(&X, s);
    idx_pin(&X, s);
    assert_int_equal(idx_victim(&X), t);        /* s pinned: not a victim */
    idx_remove(&X, t);
    assert_int_equal(idx_victim(&X), IDX_NONE);
    assert_int_equal(idx_unpin(&X, s), 1);
    assert_int_equal(idx_victim(&X), IDX_NONE);
    assert_int_equal(idx_unpin(&X, s), 0);
    assert_int_equal(idx_victim(&X), s);        /* back when the last pin goes */

    idx_pin(&X, s);
    idx_doom(&X, s);                            /* deleted while read */
    assert_int_equal(idx_at(&X, s)->state, IDX_DOOMED);
    assert_int_equal(X.n_ready, 0);
    assert_int_equal(idx_unpin(&X, s), 0);
    assert_int_equal(idx_victim(&X), IDX_NONE); /* doomed: never a victim */
    idx_remove(&X, s);
    assert_int_equal(find(1, 70), IDX_NONE);
}

static void test_stale_parent_ignored(void **state)
{
    (void)state;
    uint32_t a = put(1, 80, IDX_NONE);
    uint32_t b = put(1, 81, a);
    uint32_t gen = idx_at(&X, a)->gen;
    idx_remove(&X, a);                          /* a goes first (a DELETE) */
    uint32_t x = put(1, 82, IDX_NONE);          /* reuses a's slot */
    assert_int_equal(x, a);
    assert_int_equal(idx_at(&X, x)->gen, gen + 1);
    assert_int_equal(idx_at(&X, x)->children, 0);
    idx_remove(&X, b);                          /* must not touch x */
    assert_int_equal(idx_at(&X, x)->children, 0);
    assert_int_equal(idx_victim(&X), x);
    /* A child committed under the reused slot counts for the new chunk. */
    uint32_t c = put(1, 83, x);
    assert_int_equal(idx_at(&X, x)->children, 1);
    assert_int_equal(idx_victim(&X), c);
}

static void test_tiers_and_lists(void **state)
{
    (void)state;
    X.nv_active = 1;                            /* before any insert */
    uint32_t p = put(1, 90, IDX_NONE);
    uint32_t c = put(1, 91, p);
    assert_int_equal(idx_victim(&X), c);
    assert_int_equal(idx_victim_nv(&X), IDX_NONE); /* nothing on NVMe yet */
    /* Written back: both tiers. Then c's DRAM copy goes (demoted): c
     * leaves the DRAM list, and p, with no child left in DRAM, joins it;
     * on the NVMe list only c is a leaf (p still has a ready child). */
    idx_set_tier(&X, p, IDX_DRAM | IDX_NVME);
    idx_set_tier(&X, c, IDX_DRAM | IDX_NVME);
    assert_int_equal(X.n_in[1], 2);
    assert_int_equal(idx_victim_nv(&X), c);
    idx_set_tier(&X, c, IDX_NVME);
    assert_int_equal(idx_top_tier(idx_at(&X, c)), KVT_TIER_NVME);
    assert_int_equal(X.n_in[0], 1);
    assert_int_equal(idx_at(&X, p)->children, 0);
    assert_int_equal(idx_victim(&X), p);
    assert_int_equal(idx_victim_nv(&X), c);
    /* A read back from NVMe in flight keeps it off the NVMe list. */
    idx_set_flags(&X, c, IDX_F_READING, 0);
    assert_int_equal(idx_victim_nv(&X), IDX_NONE);
    idx_set_flags(&X, c, 0, IDX_F_READING);
    assert_int_equal(idx_victim_nv(&X), c);
    idx_remove(&X, c);
    assert_int_equal(idx_victim_nv(&X), p);     /* p's last child went */
}

static void test_plain_lru(void **state)
{
    (void)state;
    X.plain_lru = 1;                            /* the policy baseline */
    uint32_t a = put(1, 100, IDX_NONE);
    uint32_t b = put(1, 101, a);
    assert_int_equal(idx_victim(&X), a);        /* oldest first, parent or not */
    idx_touch(&X, a, 3);
    assert_int_equal(idx_victim(&X), b);
}

static void test_growth_to_capacity(void **state)
{
    (void)state;
    struct idx_entry *base = X.e;
    size_t before = idx_mem_bytes(&X);
    for (uint32_t i = 0; i < CAP; i++) put((uint16_t)(i % 7), 1000 + i, IDX_NONE);
    assert_ptr_equal(X.e, base);                /* entries never move */
    assert_int_equal(X.used, CAP);
    assert_true(idx_mem_bytes(&X) > before);
    for (uint32_t i = 0; i < CAP; i++)
        assert_int_not_equal(find((uint16_t)(i % 7), 1000 + i), IDX_NONE);
    kvt_key k = td_key(99999);
    assert_int_equal(idx_insert(&X, 0, &k), IDX_NONE); /* full */
    uint32_t s = find(3, 1003);
    uint32_t gen = idx_at(&X, s)->gen;
    idx_remove(&X, s);
    uint32_t t = idx_insert(&X, 0, &k);         /* the freed slot */
    assert_int_equal(t, s);
    assert_int_equal(idx_at(&X, t)->gen, gen + 1);
    assert_int_equal(find(3, 1003), IDX_NONE);
    assert_int_equal(X.n_ready, CAP - 1);
}

static void test_init_bounds(void **state)
{
    (void)state;
    struct idx y;
    assert_int_equal(idx_init(&y, 0), -1);
    assert_int_equal(idx_init(&y, IDX_NONE), -1);
    idx_destroy(&y);                            /* accepts a failed init */
}

#define T(f) cmocka_unit_test_setup_teardown(f, each_setup, each_teardown)

int main(void)
{
    const struct CMUnitTest tests[] = {
        T(test_insert_find_touch_remove),
        T(test_namespaces_apart),
        T(test_chain_from_its_tail),
        T(test_shared_prefix_outlives_children),
        T(test_pinned_and_doomed),
        T(test_stale_parent_ignored),
        T(test_tiers_and_lists),
        T(test_plain_lru),
        T(test_growth_to_capacity),
        cmocka_unit_test(test_init_bounds),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
