/*
 * test_store.c -- the index, the placement policy (store.c) and leases,
 * in process, over a small real DRAM pool: namespaces keep equal keys
 * apart; eviction takes a chain from its tail and never a pinned or
 * uncommitted chunk; a full pool of pinned chunks is KVT_ENOSPC, not a
 * crash; a chunk deleted while pinned is invisible at once and freed at
 * its last unpin; leases die with their connection and at their deadline,
 * freeing uncommitted space and unpinning what they read. With a
 * tenant's own pool beside the default one, the tenant's chunks are
 * placed only there, a full tenant pool evicts its own chunks and never
 * the default pool's, handles and offsets name their pool, and a range
 * is adopted only inside one pool.
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

#include "daemon.h"
#include "kvtierd.h"
#include "handlers.h"
#include "log.h"
#include "store.h"

#define CH 4096u
#define POOL (1u << 20) /* 256 chunks of CH */

static struct kvtierd *D;
static char pool[96];
static uint16_t NS0, NS1;

static int setup(void **state)
{
    (void)state;
    char err[256] = "";
    D = calloc(1, sizeof *D);
    config_defaults(&D->cfg);
    D->cfg.pool_bytes = POOL;
    snprintf(pool, sizeof pool, "/dev/shm/kvt-store-%d.pool", (int)getpid());
    struct dram_opts o = {pool, POOL, 0600, NULL, 0, -1};
    if (dram_open(&o, &D->dram, err, sizeof err) != KVT_OK ||
        idx_init(&D->idx, POOL / DRAM_UNIT) != 0)
        return -1;
    D->start_ms = now_ms();
    D->ns.idx = &D->idx;
    lease_init(&D->leases, handle_lease_release, D);
    log_set_level(LOG_ERROR);
    NS0 = ns_intern(&D->ns, "a/ns");
    NS1 = ns_intern(&D->ns, "b/ns");
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    lease_drop_all(&D->leases);
    idx_destroy(&D->idx);
    ns_free(&D->ns);
    dram_close(D->dram, 1);
    free(D);
    return 0;
}

/* Reserve and commit chunk `seed` in ns (parent slot or IDX_NONE). */
static uint32_t put(uint16_t ns, uint64_t seed, uint32_t parent)
{
    uint32_t s;
    kvt_key k = td_key(seed);
    assert_int_equal(store_reserve(D, ns, &k, CH, &s), KVT_OK);
    store_commit(D, s, seed, parent);
    return s;
}

static uint32_t find(uint16_t ns, uint64_t seed)
{
    kvt_key k = td_key(seed);
    return idx_find(&D->idx, ns, &k);
}

/* Free every chunk, so each test starts from an empty pool. */
static void clear(void)
{
    lease_drop_all(&D->leases);
    for (uint32_t s = 0; s < D->idx.used; s++) {
        struct idx_entry *e = idx_at(&D->idx, s);
        if (e->state == IDX_FREE) continue;
        while (e->pins) idx_unpin(&D->idx, s);
        store_free(D, s);
    }
    assert_int_equal(store_used(D), 0);
}

static void test_namespaces_apart(void **state)
{
    (void)state;
    uint32_t a = put(NS0, 1, IDX_NONE), b = put(NS1, 1, IDX_NONE);
    assert_int_not_equal(a, b);
    assert_int_equal(find(NS0, 1), a);
    assert_int_equal(find(NS1, 1), b);
    store_delete(D, a);
    assert_int_equal(find(NS0, 1), IDX_NONE);
    assert_int_equal(find(NS1, 1), b);
    assert_int_equal(idx_at(&D->idx, b)->csum, 1);
    clear();
}

static void test_chain_evicted_from_its_tail(void **state)
{
    (void)state;
    uint32_t a = put(NS0, 10, IDX_NONE);
    uint32_t b = put(NS0, 11, a);
    uint32_t c = put(NS0, 12, b);
    uint32_t lone = put(NS0, 20, IDX_NONE);
    idx_touch(&D->idx, lone, kvtierd_secs(D) + 1); /* the most recent */
    assert_int_equal(idx_victim(&D->idx), c);     /* not a, not b */
    assert_int_equal(store_evict(D, UINT64_MAX, 1), CH);
    assert_int_equal(find(NS0, 12), IDX_NONE);
    assert_int_equal(idx_victim(&D->idx), b);     /* b is a leaf now */
    idx_pin(&D->idx, b);                          /* pinned: not a victim */
    assert_int_equal(idx_victim(&D->idx), lone);
    idx_unpin(&D->idx, b);
    clear();
}

static void test_full_of_pinned_is_enospc(void **state)
{
    (void)state;
    uint32_t n = 0, s;
    for (uint64_t k = 0;; k++) {
        kvt_key key = td_key(1000 + k);
        kvt_err e = store_reserve(D, NS0, &key, CH, &s);
        if (e == KVT_ENOSPC) break;
        assert_int_equal(e, KVT_OK);
        store_commit(D, s, 0, IDX_NONE);
        idx_pin(&D->idx, s);
        n++;
    }
    assert_int_equal(n, POOL / CH);
    kvt_key key = td_key(1);
    assert_int_equal(store_reserve(D, NS0, &key, CH, &s), KVT_ENOSPC);
    assert_int_equal(store_reserve(D, NS0, &key, POOL * 2ull, &s), KVT_ENOSPC);
    idx_unpin(&D->idx, find(NS0, 1000));          /* one evictable now */
    assert_int_equal(store_reserve(D, NS0, &key, CH, &s), KVT_OK);
    assert_int_equal(find(NS0, 1000), IDX_NONE);  /* it made the room */
    store_free(D, s);                             /* uncommitted: just freed */
    clear();
}

static void test_delete_pinned(void **state)
{
    (void)state;
    uint32_t s = put(NS0, 30, IDX_NONE);
    idx_pin(&D->idx, s);
    store_delete(D, s);
    assert_int_equal(idx_at(&D->idx, s)->state, IDX_DOOMED);
    assert_int_equal(store_used(D), CH);          /* bytes kept for the reader */
    assert_int_equal(idx_unpin(&D->idx, s), 0);
    store_free(D, s);
    assert_int_equal(find(NS0, 30), IDX_NONE);
    assert_int_equal(store_used(D), 0);
}

static void test_leases_die_with_their_pipe(void **state)
{
    (void)state;
    uint32_t r = put(NS0, 40, IDX_NONE);
    struct lease *w = lease_new(&D->leases, 7, LEASE_WRITE, 2, kvtierd_clock(D) + 30000);
    kvt_key k0 = td_key(41), k1 = td_key(42);
    assert_int_equal(store_reserve(D, NS0, &k0, CH, &w->slot[0]), KVT_OK);
    assert_int_equal(store_reserve(D, NS0, &k1, CH, &w->slot[1]), KVT_OK);
    struct lease *rd = lease_new(&D->leases, 7, LEASE_READ, 1, kvtierd_clock(D) + 30000);
    rd->slot[0] = r;
    idx_pin(&D->idx, r);
    struct lease *other = lease_new(&D->leases, 8, LEASE_READ, 1, kvtierd_clock(D) + 30000);
    other->slot[0] = r;
    idx_pin(&D->idx, r);
    assert_ptr_equal(lease_find(&D->leases, w->id), w);
    assert_int_equal(store_used(D), 3 * CH);
    uint64_t wid = w->id, rid = rd->id; /* both are freed below */
    lease_drop_pipe(&D->leases, 7);
    assert_null(lease_find(&D->leases, wid));
    assert_null(lease_find(&D->leases, rid));
    assert_ptr_equal(lease_find(&D->leases, other->id), other);
    assert_int_equal(find(NS0, 41), IDX_NONE);     /* uncommitted: freed */
    assert_int_equal(idx_at(&D->idx, r)->pins, 1); /* pipe 8's pin stays */
    assert_int_equal(store_used(D), CH);
    store_delete(D, r);                            /* doomed while leased */
    uint64_t id = other->id;
    other->deadline = 0;                           /* due now */
    assert_int_equal(lease_expire(&D->leases, kvtierd_clock(D)), 1);
    assert_null(lease_find(&D->leases, id));
    assert_int_equal(find(NS0, 40), IDX_NONE);     /* freed at the last unpin */
    assert_int_equal(store_used(D), 0);
    assert_int_equal(D->leases.count, 0);
}

/* A second daemon state with tenant t's own pool (a memfd, 256 KiB)
 * after the default one. */
static void test_pools_apart(void **state)
{
    (void)state;
    char err[256] = "", path[96];
    const uint64_t tp = 256u << 10;
    struct kvtierd *P = calloc(1, sizeof *P);
    config_defaults(&P->cfg);
    P->cfg.pool_bytes = POOL;
    struct kvt_tenant *tn = &P->cfg.tenants.v[0];
    snprintf(tn->name, sizeof tn->name, "t");
    snprintf(tn->prefixes[0], sizeof tn->prefixes[0], "t/");
    tn->n_prefixes = 1;
    tn->pool_bytes = tp;
    P->cfg.tenants.n = 1;
    snprintf(path, sizeof path, "/dev/shm/kvt-store2-%d.pool", (int)getpid());
    struct dram_opts o = {path, POOL, 0600, NULL, 0, -1};
    struct dram_opts t = {NULL, tp, 0600, NULL, 1, -1};
    assert_int_equal(dram_open_pools(&o, 0, POOL + tp, &P->dram, err, sizeof err), KVT_OK);
    /* A pool that does not fit the reserve is refused, nothing mapped. */
    struct dram_opts big = {NULL, tp * 2, 0600, NULL, 1, -1};
    uint32_t no;
    assert_int_equal(dram_add_pool(P->dram, &big, "x", 0, &no, err, sizeof err), KVT_ENOSPC);
    assert_int_equal(P->dram->n_seg, 1);
    assert_int_equal(dram_add_pool(P->dram, &t, "kvtier-pool-t", 0, &P->tenant_pool[0],
                                   err, sizeof err), KVT_OK);
    assert_int_equal(P->tenant_pool[0], 1);
    assert_int_equal(P->dram->bytes, POOL + tp);
    assert_int_equal(idx_init(&P->idx, (POOL + tp) / DRAM_UNIT), 0);
    P->ns.idx = &P->idx;
    lease_init(&P->leases, handle_lease_release, P);
    uint16_t nt = ns_intern(&P->ns, "t/m"), nd = ns_intern(&P->ns, "a/m");
    uint32_t s, kept[8];
    for (uint64_t i = 0; i < 8; i++) { /* the default pool's chunks */
        kvt_key k = td_key(500 + i);
        assert_int_equal(store_reserve(P, nd, &k, CH, &kept[i]), KVT_OK);
        store_commit(P, kept[i], 0, IDX_NONE);
        assert_int_equal(store_pool(P, kept[i]), 0);
        assert_true(store_off(P, kept[i]) < POOL);
    }
    for (uint64_t i = 0; i < tp / CH + 16; i++) { /* t's pool, over and over */
        kvt_key k = td_key(i);
        assert_int_equal(store_reserve(P, nt, &k, CH, &s), KVT_OK);
        store_commit(P, s, 0, IDX_NONE);
        assert_int_equal(store_pool(P, s), 1);
        assert_true(store_off(P, s) >= POOL && store_off(P, s) < POOL + tp);
        assert_true(dram_pool_used(P->dram, 1) <= tp);
    }
    kvt_key k0 = td_key(0);
    assert_int_equal(idx_find(&P->idx, nt, &k0), IDX_NONE); /* evicted, t's own */
    for (uint64_t i = 0; i < 8; i++) { /* the coldest of all, never taken */
        kvt_key k = td_key(500 + i);
        assert_int_equal(idx_find(&P->idx, nd, &k), kept[i]);
    }
    assert_int_equal(dram_pool_used(P->dram, 0), 8 * CH);
    /* A chunk larger than t's pool cannot be placed there at all. */
    kvt_key kb = td_key(9999);
    assert_int_equal(store_reserve(P, nt, &kb, tp + CH, &s), KVT_ENOSPC);
    /* Adoption's alloc_at: inside one pool only. */
    struct tier_loc loc;
    struct tier *dt = &P->dram->tier;
    assert_int_equal(dt->ops->alloc_at(dt, POOL - CH, 2 * CH, &loc), KVT_ENOSPC);
    /* The watermarks hold per pool: t's full pool comes down, the
     * default pool (8 chunks of 256) is left alone. */
    store_watermark(P);
    assert_true(dram_pool_used(P->dram, 1) <=
                (uint64_t)((double)tp * P->cfg.high_watermark));
    assert_int_equal(dram_pool_used(P->dram, 0), 8 * CH);
    lease_drop_all(&P->leases);
    idx_destroy(&P->idx);
    ns_free(&P->ns);
    dram_close(P->dram, 1);
    free(P);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_namespaces_apart),
        cmocka_unit_test(test_chain_evicted_from_its_tail),
        cmocka_unit_test(test_full_of_pinned_is_enospc),
        cmocka_unit_test(test_delete_pinned),
        cmocka_unit_test(test_leases_die_with_their_pipe),
        cmocka_unit_test(test_pools_apart),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
