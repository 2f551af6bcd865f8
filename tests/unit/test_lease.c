/*
 * test_lease.c -- the lease table (lease.c) on its own, over a real index:
 * ids are unique and found again; a lease is its owner's (another
 * connection gets KVT_EPERM, the wrong kind KVT_ENOENT); a lease lives
 * until its deadline and not a millisecond past it; a closed connection
 * takes its leases, and only its leases, with it; every slot of a dropped
 * lease is handed back exactly once, and a forgotten (committed) lease's
 * never. The release function here does what the daemon's does to the
 * index: a write lease's PENDING chunk is removed, a read lease's chunk
 * unpinned.
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
#include "lease.h"
#include "log.h"

#define NS 3u

static struct idx X;
static struct lease_table T;
static uint32_t released; /* release calls since the last check */

static void release(void *arg, uint8_t kind, uint32_t slot)
{
    assert_ptr_equal(arg, &X);
    assert_int_not_equal(slot, IDX_NONE);
    struct idx_entry *e = idx_at(&X, slot);
    if (kind == LEASE_WRITE) {
        assert_int_equal(e->state, IDX_PENDING);
        idx_remove(&X, slot);
    } else {
        assert_int_equal(e->state, IDX_READY);
        assert_true(e->pins > 0);
        idx_unpin(&X, slot);
    }
    released++;
}

static int setup(void **state)
{
    (void)state;
    log_set_level(LOG_ERROR);
    return idx_init(&X, 1 << 16);
}

static int teardown(void **state)
{
    (void)state;
    idx_destroy(&X);
    return 0;
}

static int each_setup(void **state)
{
    (void)state;
    memset(&T, 0, sizeof T);
    lease_init(&T, release, &X);
    released = 0;
    return 0;
}

static int each_teardown(void **state)
{
    (void)state;
    lease_drop_all(&T);
    assert_int_equal(T.count, 0);
    for (uint32_t s = 0; s < X.used; s++)
        if (idx_at(&X, s)->state != IDX_FREE) idx_remove(&X, s);
    return 0;
}

static uint32_t ready(uint64_t seed)
{
    kvt_key k = td_key(seed);
    uint32_t s = idx_insert(&X, NS, &k);
    assert_int_not_equal(s, IDX_NONE);
    idx_commit(&X, s, IDX_NONE, 0);
    return s;
}

static uint32_t pending(uint64_t seed)
{
    kvt_key k = td_key(seed);
    uint32_t s = idx_insert(&X, NS, &k);
    assert_int_not_equal(s, IDX_NONE);
    return s;
}

/* A read lease of pipe over the chunks seeds[0..n), pinned as GET does. */
static struct lease *read_lease(uint32_t pipe, const uint64_t *seeds, uint32_t n,
                                uint64_t deadline)
{
    struct lease *l = lease_new(&T, pipe, LEASE_READ, n, deadline);
    for (uint32_t i = 0; i < n; i++) {
        l->slot[i] = ready(seeds[i]);
        idx_pin(&X, l->slot[i]);
    }
    return l;
}

static void test_ids_unique_and_found(void **state)
{
    (void)state;
    enum { N = 20000 }; /* several per bucket */
    uint64_t *ids = calloc(N, sizeof *ids);
    assert_non_null(ids);
    for (uint32_t i = 0; i < N; i++) {
        struct lease *l = lease_new(&T, 1 + i % 5, i % 2 ? LEASE_READ : LEASE_WRITE,
                                    0, 1000);
        assert_int_not_equal(l->id, 0);
        assert_true(l->id < (1ull << 63)); /* fits the wire's int64 */
        assert_int_equal(l->pipe, 1 + i % 5);
        ids[i] = l->id;
    }
    assert_int_equal(T.count, N);
    for (uint32_t i = 0; i < N; i++) {
        struct lease *l = lease_find(&T, ids[i]);
        assert_non_null(l);
        assert_int_equal(l->id, ids[i]);
    }
    uint64_t rd, wr;
    lease_counts(&T, &rd, &wr);
    assert_int_equal(rd, N / 2);
    assert_int_equal(wr, N / 2);
    /* Gone once dropped; the others stay. */
    lease_drop(&T, lease_find(&T, ids[7]));
    assert_null(lease_find(&T, ids[7]));
    assert_non_null(lease_find(&T, ids[8]));
    assert_int_equal(T.count, N - 1);
    free(ids);
}

static void test_owner_and_kind(void **state)
{
    (void)state;
    uint64_t seeds[] = {1, 2};
    struct lease *r = read_lease(7, seeds, 2, 1000);
    struct lease *w = lease_new(&T, 7, LEASE_WRITE, 1, 1000);
    w->slot[0] = pending(3);
    struct lease *out = (struct lease *)&out;

    assert_int_equal(lease_own(&T, r->id, 7, LEASE_READ, &out), KVT_OK);
    assert_ptr_equal(out, r);
    assert_int_equal(lease_own(&T, w->id, 7, LEASE_WRITE, &out), KVT_OK);
    assert_ptr_equal(out, w);
    /* Another connection may not use it, whatever it knows of the id. */
    assert_int_equal(lease_own(&T, r->id, 8, LEASE_READ, &out), KVT_EPERM);
    assert_null(out);
    assert_int_equal(lease_own(&T, w->id, 8, LEASE_WRITE, &out), KVT_EPERM);
    /* A read lease is no write lease and the other way round. */
    assert_int_equal(lease_own(&T, r->id, 7, LEASE_WRITE, &out), KVT_ENOENT);
    assert_int_equal(lease_own(&T, w->id, 7, LEASE_READ, &out), KVT_ENOENT);
    assert_int_equal(lease_own(&T, r->id ^ 1, 7, LEASE_READ, &out), KVT_ENOENT);
    assert_int_equal(lease_own(&T, 0, 7, LEASE_READ, &out), KVT_ENOENT);
    /* Asking changed nothing. */
    assert_int_equal(released, 0);
    assert_int_equal(idx_at(&X, r->slot[0])->pins, 1);
}

static void test_expiry_at_deadline(void **state)
{
    (void)state;
    uint64_t a[] = {10, 11}, b[] = {12};
    struct lease *early = read_lease(7, a, 2, 100);
    struct lease *late = read_lease(7, b, 1, 101);
    uint32_t s0 = early->slot[0], s1 = early->slot[1], s2 = late->slot[0];
    uint64_t eid = early->id, lid = late->id;

    assert_int_equal(lease_expire(&T, 99), 0);       /* not yet */
    assert_non_null(lease_find(&T, eid));
    assert_int_equal(lease_expire(&T, 100), 1);      /* due at its deadline */
    assert_null(lease_find(&T, eid));
    assert_non_null(lease_find(&T, lid));
    assert_int_equal(released, 2);
    assert_int_equal(idx_at(&X, s0)->pins, 0);
    assert_int_equal(idx_at(&X, s1)->pins, 0);
    assert_int_equal(idx_at(&X, s2)->pins, 1);
    assert_int_equal(lease_expire(&T, 100), 0);      /* once only */
    assert_int_equal(lease_expire(&T, 5000), 1);
    assert_int_equal(idx_at(&X, s2)->pins, 0);
    assert_int_equal(T.count, 0);
    assert_int_equal(lease_expire(&T, 6000), 0);     /* an empty table */
}

static void test_connection_gone(void **state)
{
    (void)state;
    /* Pipe 7: a read lease, a write lease with one key that existed
     * (IDX_NONE: nothing to release). Pipe 8 reads the same chunk. */
    uint64_t seeds[] = {20};
    struct lease *r7 = read_lease(7, seeds, 1, 1000);
    uint32_t shared = r7->slot[0];
    struct lease *w7 = lease_new(&T, 7, LEASE_WRITE, 3, 1000);
    w7->slot[0] = pending(21);
    w7->slot[1] = IDX_NONE;
    w7->slot[2] = pending(22);
    struct lease *r8 = lease_new(&T, 8, LEASE_READ, 1, 1000);
    r8->slot[0] = shared;
    idx_pin(&X, shared);
    uint64_t r7id = r7->id, w7id = w7->id, r8id = r8->id;

    lease_drop_pipe(&T, 7);
    assert_null(lease_find(&T, r7id));
    assert_null(lease_find(&T, w7id));
    assert_ptr_equal(lease_find(&T, r8id), r8);
    assert_int_equal(released, 3);                   /* 1 read + 2 written */
    kvt_key k21 = td_key(21), k22 = td_key(22);
    assert_int_equal(idx_find(&X, NS, &k21), IDX_NONE); /* uncommitted: gone */
    assert_int_equal(idx_find(&X, NS, &k22), IDX_NONE);
    assert_int_equal(idx_at(&X, shared)->pins, 1);   /* pipe 8's pin stays */
    lease_drop_pipe(&T, 7);                          /* nothing left of 7 */
    assert_int_equal(released, 3);
    lease_drop_pipe(&T, 8);
    assert_int_equal(idx_at(&X, shared)->pins, 0);
    assert_int_equal(T.count, 0);
}

static void test_forget_keeps_chunks(void **state)
{
    (void)state;
    struct lease *w = lease_new(&T, 7, LEASE_WRITE, 1, 1000);
    uint32_t s = w->slot[0] = pending(30);
    uint64_t id = w->id;
    idx_commit(&X, s, IDX_NONE, 0);                  /* what PUT_COMMIT does */
    lease_forget(&T, w);
    assert_null(lease_find(&T, id));
    assert_int_equal(released, 0);
    assert_int_equal(idx_at(&X, s)->state, IDX_READY);
    assert_int_equal(lease_expire(&T, UINT64_MAX), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_ids_unique_and_found, each_setup, each_teardown),
        cmocka_unit_test_setup_teardown(test_owner_and_kind, each_setup, each_teardown),
        cmocka_unit_test_setup_teardown(test_expiry_at_deadline, each_setup, each_teardown),
        cmocka_unit_test_setup_teardown(test_connection_gone, each_setup, each_teardown),
        cmocka_unit_test_setup_teardown(test_forget_keeps_chunks, each_setup, each_teardown),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
