/*
 * test_adopt.c -- adoption (daemon/adopt.c) built from its own context,
 * with no daemon: a real pool file, a real index and namespace table, and
 * the real journal on disk. A first "run" stores chunks in the pool and
 * tells the journal (adopt_added, adopt_removed), then closes; a second
 * opens the same pool file and journal into a fresh index and must find
 * exactly the chunks still committed, with their keys, sizes, offsets and
 * parents -- except one whose bytes were overwritten between the runs,
 * which is dropped and counted, never served.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "adopt.h"
#include "dram.h"
#include "index.h"
#include "log.h"
#include "ns.h"

#define POOL (1u << 20)
#define CH 8192u

static char pool_path[96], state[96];

/* One run's parts: what main.c builds around struct adopt. */
struct run {
    struct dram *pool;
    struct idx ix;
    struct ns_table ns;
    struct adopt a;
};

static void run_open(struct run *r, int keep)
{
    char err[256] = "";
    memset(r, 0, sizeof *r);
    struct dram_opts o = {pool_path, POOL, 0600, NULL, 0, -1};
    assert_int_equal(dram_open_adopt(&o, keep, &r->pool, err, sizeof err), KVT_OK);
    assert_int_equal(idx_init(&r->ix, POOL / DRAM_UNIT), 0);
    r->ns.idx = &r->ix;
    r->a.idx = &r->ix;
    r->a.ns = &r->ns;
    r->a.dram = r->pool;
    assert_int_equal(adopt_open(&r->a, 1, state, 1u << 20), 0);
    assert_non_null(r->a.journal);
    assert_ptr_equal(r->ns.journal, r->a.journal); /* renames reach it */
}

static void run_close(struct run *r)
{
    adopt_close(&r->a);
    assert_null(r->a.journal);
    assert_null(r->ns.journal);
    idx_destroy(&r->ix);
    ns_free(&r->ns);
    dram_close(r->pool, 0); /* keep the file: the next run adopts it */
}

static kvt_key key_of(uint8_t n)
{
    kvt_key k;
    memset(&k, n, sizeof k);
    return k;
}

/* Store a chunk of byte fill as the core does: space, bytes, index, then
 * the journal. */
static uint32_t put(struct run *r, uint16_t ns, uint8_t n, uint32_t parent)
{
    struct tier_loc loc;
    struct tier *t = &r->pool->tier;
    assert_int_equal(t->ops->alloc(t, CH, &loc), KVT_OK);
    kvt_key k = key_of(n);
    uint32_t slot = idx_insert(&r->ix, ns, &k);
    assert_int_not_equal(slot, IDX_NONE);
    struct idx_entry *e = idx_at(&r->ix, slot);
    e->blk = loc.h;
    e->size = CH;
    uint8_t *p = dram_ptr(r->pool, dram_block_off(r->pool, loc.h));
    memset(p, n, CH);
    e->csum = kvt_checksum(p, CH);
    idx_commit(&r->ix, slot, parent, 0);
    adopt_added(&r->a, slot);
    return slot;
}

static uint64_t off_of(struct run *r, uint32_t slot)
{
    return dram_block_off(r->pool, idx_at(&r->ix, slot)->blk);
}

static void test_adopt_across_runs(void **state_)
{
    (void)state_;
    struct run r;
    unlink(pool_path);
    run_open(&r, 0);
    assert_int_equal(r.a.adopted, 0); /* a new pool: nothing to adopt */
    uint16_t ns = ns_intern(&r.ns, "tenant/a");
    uint32_t s1 = put(&r, ns, 1, IDX_NONE);
    uint32_t s2 = put(&r, ns, 2, s1);
    uint32_t s3 = put(&r, ns, 3, s2);
    uint32_t s4 = put(&r, ns, 4, s3);
    uint64_t off2 = off_of(&r, s2), off4 = off_of(&r, s4);
    adopt_removed(&r.a, s3); /* deleted: must not come back */
    idx_remove(&r.ix, s3);
    adopt_flush(&r.a);
    run_close(&r);

    /* Between the runs a client overwrites chunk 4 in the kept file. */
    FILE *f = fopen(pool_path, "r+b");
    assert_non_null(f);
    assert_int_equal(fseek(f, (long)off4 + 100, SEEK_SET), 0);
    assert_int_equal(fputc(0xee, f), 0xee);
    fclose(f);

    run_open(&r, 1);
    assert_true(r.pool->adopted);
    assert_int_equal(r.a.adopted, 2);  /* chunks 1 and 2 */
    assert_int_equal(r.a.dropped, 1);  /* chunk 4: its bytes changed */
    uint16_t id = ns_find(&r.ns, "tenant/a");
    assert_int_not_equal(id, NS_NONE);
    assert_int_equal(r.ns.v[id].chunks, 2);
    assert_int_equal(r.ns.v[id].bytes, 2 * CH);
    kvt_key k1 = key_of(1), k2 = key_of(2), k3 = key_of(3), k4 = key_of(4);
    uint32_t a1 = idx_find(&r.ix, id, &k1), a2 = idx_find(&r.ix, id, &k2);
    assert_int_not_equal(a1, IDX_NONE);
    assert_int_not_equal(a2, IDX_NONE);
    assert_int_equal(idx_find(&r.ix, id, &k3), IDX_NONE);
    assert_int_equal(idx_find(&r.ix, id, &k4), IDX_NONE);
    const struct idx_entry *e2 = idx_at(&r.ix, a2);
    assert_int_equal(e2->state, IDX_READY);
    assert_int_equal(e2->parent, a1);          /* the chain survives */
    assert_int_equal(off_of(&r, a2), off2);     /* at the same place */
    const uint8_t *b2 = dram_ptr(r.pool, off2);
    assert_int_equal(b2[0], 2);
    assert_int_equal(b2[CH - 1], 2);
    assert_int_equal(r.ix.n_in[0], 2);
    run_close(&r);

    /* The snapshot written at close names the same two: a third run
     * adopts them again, and nothing is dropped this time. */
    run_open(&r, 1);
    assert_int_equal(r.a.adopted, 2);
    assert_int_equal(r.a.dropped, 0);
    run_close(&r);
}

/* Disabled (dram.adopt = 0): no journal, every hook a no-op. */
static void test_adopt_off(void **state_)
{
    (void)state_;
    char err[256] = "";
    struct dram *pool = NULL;
    struct idx ix;
    struct ns_table ns = {0};
    struct dram_opts o = {pool_path, POOL, 0600, NULL, 0, -1};
    unlink(pool_path);
    assert_int_equal(dram_open(&o, &pool, err, sizeof err), KVT_OK);
    assert_int_equal(idx_init(&ix, POOL / DRAM_UNIT), 0);
    ns.idx = &ix;
    struct adopt a = {.idx = &ix, .ns = &ns, .dram = pool};
    assert_int_equal(adopt_open(&a, 0, state, 1u << 20), 0);
    assert_null(a.journal);
    assert_null(ns.journal);
    adopt_added(&a, 0);
    adopt_tick(&a);
    adopt_close(&a);
    assert_int_equal(a.adopted, 0);
    idx_destroy(&ix);
    ns_free(&ns);
    dram_close(pool, 1);
}

int main(void)
{
    snprintf(pool_path, sizeof pool_path, "/dev/shm/kvt-adopt-%d.pool", (int)getpid());
    snprintf(state, sizeof state, "/tmp/kvt-adopt-%d", (int)getpid());
    mkdir(state, 0700);
    log_set_level(LOG_ERROR);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_adopt_across_runs),
        cmocka_unit_test(test_adopt_off),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    char j[160];
    snprintf(j, sizeof j, "%s/dram.journal", state);
    unlink(j);
    rmdir(state);
    unlink(pool_path);
    return rc;
}
