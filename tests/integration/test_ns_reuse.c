/*
 * test_ns_reuse.c -- namespace ids are reused once nothing holds them, and
 * one connection may hold at most daemon.ns_per_client namespaces (issue
 * #11 (a)). Real daemons: 10 000 namespaces churned by one client, the
 * quota refusing one client while another goes on, chunks under reused
 * ids invisible under the old names, and a restart (clean and kill -9)
 * adopting the journal of a run that renamed ids.
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

#define SZ 4096u
#define NS_TABLE 4096 /* the daemon's table (NS_LIMIT) */

static void put_one(kvt_client *c, const char *ns, uint64_t seed)
{
    char buf[SZ];
    td_fill(buf, SZ, seed);
    kvt_key k = td_key(seed);
    const void *b = buf;
    size_t sz = SZ;
    kvt_err e = kvt_put(c, ns, &k, &b, &sz, 1, NULL, NULL);
    if (e != KVT_OK) fail_msg("put %s: %s: %s", ns, kvt_strerror(e), kvt_last_error(c));
}

static size_t present(kvt_client *c, const char *ns, uint64_t seed)
{
    kvt_key k = td_key(seed);
    size_t n = 9;
    assert_int_equal(kvt_lookup(c, ns, &k, 1, &n, NULL), KVT_OK);
    return n;
}

static int same_bytes(kvt_client *c, const char *ns, uint64_t seed)
{
    char want[SZ], got[SZ];
    size_t sz = 0;
    kvt_key k = td_key(seed);
    td_fill(want, SZ, seed);
    return kvt_get_copy(c, ns, &k, got, SZ, &sz) == KVT_OK && sz == SZ &&
           memcmp(want, got, SZ) == 0;
}

static void start(struct tdaemon *d, const char *quota)
{
    const char *extra[] = {"--daemon.ns_per_client", quota, NULL};
    assert_int_equal(td_start(d, extra), 0);
}

/* One client, 10 000 fresh namespaces, each cleared (or its chunk
 * deleted) right after its put: all succeed, the table stays bounded, a
 * chunk kept from the start is still there and nowhere else. */
static void test_churn(void **state)
{
    (void)state;
    struct tdaemon D;
    assert_int_equal(td_init(&D), 0);
    start(&D, "4");
    kvt_client *c = td_connect(&D);
    put_one(c, "keep", 1);
    char ns[64];
    for (int i = 0; i < 10000; i++) {
        snprintf(ns, sizeof ns, "churn-%d", i);
        put_one(c, ns, 1000 + (uint64_t)i);
        if (i % 2) {
            uint64_t n = 0;
            assert_int_equal(kvt_clear(c, ns, &n), KVT_OK);
            assert_int_equal(n, 1);
        } else {
            kvt_key k = td_key(1000 + (uint64_t)i);
            size_t n = 0;
            assert_int_equal(kvt_delete(c, ns, &k, 1, &n), KVT_OK);
            assert_int_equal(n, 1);
        }
    }
    kvt_stats s;
    assert_int_equal(kvt_stats_get(c, &s), KVT_OK);
    assert_true(s.namespaces <= NS_TABLE);
    assert_int_equal(s.chunks, 1);
    assert_int_equal(present(c, "keep", 1), 1);
    assert_true(same_bytes(c, "keep", 1));
    /* The key of "keep" under a churned name (its id may have been any
     * of them) and a churned key under its own, reused, name: misses. */
    for (int i = 0; i < 10000; i += 97) {
        snprintf(ns, sizeof ns, "churn-%d", i);
        assert_int_equal(present(c, ns, 1), 0);
        assert_int_equal(present(c, ns, 1000 + (uint64_t)i), 0);
    }
    kvt_close(c);
    assert_int_equal(td_stop(&D), 0);
    td_cleanup(&D);
}

/* A client that keeps its namespaces is refused past its quota with a
 * clear error; another client still creates namespaces; freeing one of
 * its own lets the first create again. */
static void test_quota(void **state)
{
    (void)state;
    struct tdaemon D;
    assert_int_equal(td_init(&D), 0);
    start(&D, "8");
    kvt_client *a = td_connect(&D), *b = td_connect(&D);
    char ns[64];
    for (int i = 0; i < 8; i++) {
        snprintf(ns, sizeof ns, "a-%d", i);
        put_one(a, ns, 100 + (uint64_t)i);
    }
    char buf[SZ] = {0};
    const void *bp = buf;
    size_t sz = SZ;
    kvt_key k = td_key(999);
    assert_int_equal(kvt_put(a, "a-8", &k, &bp, &sz, 1, NULL, NULL), KVT_ETOOBIG);
    assert_non_null(strstr(kvt_last_error(a), "namespace quota"));
    assert_non_null(strstr(kvt_last_error(a), "daemon.ns_per_client"));
    /* Its own namespaces still take puts; others' are not charged to it. */
    put_one(a, "a-0", 200);
    put_one(b, "a-1", 201); /* b writes into a namespace a holds */
    for (int i = 0; i < 8; i++) {
        snprintf(ns, sizeof ns, "b-%d", i);
        put_one(b, ns, 300 + (uint64_t)i);
    }
    uint64_t n = 0;
    assert_int_equal(kvt_clear(a, "a-7", &n), KVT_OK);
    put_one(a, "a-8", 999);
    /* A new connection starts with its own quota. */
    kvt_close(a);
    a = td_connect(&D);
    put_one(a, "a-9", 400);
    kvt_close(a);
    kvt_close(b);
    assert_int_equal(td_stop(&D), 0);
    td_cleanup(&D);
}

/* Without a quota, one client can fill the table with held namespaces:
 * the next new one is refused, an existing one still takes puts, and a
 * cleared one frees its id for the next new name. */
static void test_table_full(void **state)
{
    (void)state;
    struct tdaemon D;
    assert_int_equal(td_init(&D), 0);
    start(&D, "0");
    kvt_client *c = td_connect(&D);
    char ns[64];
    for (int i = 0; i < NS_TABLE; i++) {
        snprintf(ns, sizeof ns, "f-%d", i);
        put_one(c, ns, 7000 + (uint64_t)i);
    }
    char buf[SZ] = {0};
    const void *bp = buf;
    size_t sz = SZ;
    kvt_key k = td_key(1);
    assert_int_equal(kvt_put(c, "f-new", &k, &bp, &sz, 1, NULL, NULL), KVT_ENOSPC);
    assert_non_null(strstr(kvt_last_error(c), "too many namespaces"));
    put_one(c, "f-0", 2);
    uint64_t n = 0;
    assert_int_equal(kvt_clear(c, "f-17", &n), KVT_OK);
    put_one(c, "f-new", 1);
    assert_int_equal(present(c, "f-17", 7017), 0);
    assert_int_equal(present(c, "f-new", 1), 1);
    assert_int_equal(present(c, "f-18", 7018), 1);
    kvt_close(c);
    assert_int_equal(td_stop(&D), 0);
    td_cleanup(&D);
}

/* A run that renamed ids leaves a journal naming the same id twice; a
 * restart, clean or after kill -9, adopts each chunk under its own name. */
static void fill_renamed(struct tdaemon *d)
{
    kvt_client *c = td_connect(d);
    char ns[64];
    for (int i = 0; i < NS_TABLE + 300; i++) {
        snprintf(ns, sizeof ns, "r-%d", i);
        put_one(c, ns, 5000 + (uint64_t)i);
        uint64_t n = 0;
        if (i < NS_TABLE + 200) assert_int_equal(kvt_clear(c, ns, &n), KVT_OK);
        if (i % 64 == 0) { /* stay under the quota of one connection */
            kvt_close(c);
            c = td_connect(d);
        }
    }
    kvt_close(c);
}

static void check_renamed(struct tdaemon *d)
{
    kvt_client *c = td_connect(d);
    char ns[64];
    for (int i = 0; i < NS_TABLE + 300; i++) {
        snprintf(ns, sizeof ns, "r-%d", i);
        int kept = i >= NS_TABLE + 200;
        assert_int_equal(present(c, ns, 5000 + (uint64_t)i), kept);
        if (kept) assert_true(same_bytes(c, ns, 5000 + (uint64_t)i));
    }
    kvt_stats s;
    assert_int_equal(kvt_stats_get(c, &s), KVT_OK);
    assert_int_equal(s.chunks, 100);
    kvt_close(c);
}

static void test_restart_after_reuse(void **state)
{
    (void)state;
    struct tdaemon D;
    assert_int_equal(td_init(&D), 0);
    start(&D, "256");
    fill_renamed(&D);
    check_renamed(&D);
    assert_int_equal(td_stop(&D), 0);
    start(&D, "256");
    check_renamed(&D);
    td_kill(&D);
    start(&D, "256");
    check_renamed(&D);
    assert_int_equal(td_stop(&D), 0);
    td_cleanup(&D);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_churn),
        cmocka_unit_test(test_quota),
        cmocka_unit_test(test_table_full),
        cmocka_unit_test(test_restart_after_reuse),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
