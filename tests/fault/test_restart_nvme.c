/*
 * test_restart_nvme.c -- what a restarted kvtierd finds of its NVMe tier
 * when the index is not what it should be:
 *
 *  - the RocksDB directory is gone: rebuilt by scanning record headers,
 *    with a log line; every chunk comes back whole;
 *  - the directory is damaged (RocksDB will not open it): moved aside,
 *    rebuilt the same way;
 *  - records written but never indexed (the daemon died between the
 *    two; KVT_FAULT=index_put): not served, their space reclaimed.
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
#include "kvtier.h"
#include "nvtest.h"

#define CH (200u << 10)

static const char *const no_adopt[] = {"--dram.adopt", "0", NULL};

/* A daemon holding chunks 1..16 on NVMe only, then stopped. */
static void fill_and_stop(struct tdaemon *d)
{
    assert_int_equal(td_init(d), 0);
    assert_int_equal(nvt_start(d, 64, 16, no_adopt), 0);
    kvt_client *c = td_connect(d);
    assert_int_equal(nvt_put_chain(c, 1, 16, CH), KVT_OK);
    assert_int_equal(nvt_flush(c, 1, NULL), KVT_OK);
    kvt_close(c);
    assert_int_equal(td_stop(d), 0);
}

static void check_rebuilt(struct tdaemon *d, const char *line)
{
    assert_int_equal(nvt_start(d, 64, 16, no_adopt), 0);
    kvt_client *c = td_connect(d);
    assert_true(td_log_has(d, line));
    assert_int_equal(nvt_stat(c, "rebuilt_chunks"), 16);
    kvt_tier t[16];
    assert_int_equal(nvt_lookup(c, 1, 16, 0, t), 16); /* parents came back too */
    for (int i = 1; i <= 16; i++) assert_true(nvt_check(c, i, CH));
    kvt_close(c);
    /* The rebuilt index is complete: the next start loads it. */
    assert_int_equal(td_stop(d), 0);
    assert_int_equal(nvt_start(d, 64, 16, no_adopt), 0);
    c = td_connect(d);
    assert_int_equal(nvt_stat(c, "loaded_chunks"), 16);
    assert_int_equal(nvt_stat(c, "rebuilt_chunks"), 0);
    kvt_close(c);
    assert_int_equal(td_stop(d), 0);
    td_cleanup(d);
}

static void test_index_missing(void **state)
{
    (void)state;
    struct tdaemon D;
    char cmd[400];
    fill_and_stop(&D);
    snprintf(cmd, sizeof cmd, "rm -rf '%s/nvme-index'", D.dir);
    assert_int_equal(system(cmd), 0);
    check_rebuilt(&D, "missing or incomplete: rebuilding");
}

static void test_index_damaged(void **state)
{
    (void)state;
    struct tdaemon D;
    char path[400];
    fill_and_stop(&D);
    snprintf(path, sizeof path, "%s/nvme-index/CURRENT", D.dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs("MANIFEST-424242\n", f);
    fclose(f);
    check_rebuilt(&D, "damaged index moved to");
}

/* Written, never indexed: after a kill -9 they are free space. */
static void test_unindexed_reclaimed(void **state)
{
    (void)state;
    struct tdaemon D;
    assert_int_equal(td_init(&D), 0);
    setenv("KVT_FAULT", "index_put=1+", 1);
    int rv = nvt_start(&D, 64, 16, no_adopt);
    unsetenv("KVT_FAULT");
    assert_int_equal(rv, 0);
    kvt_client *c = td_connect(&D);
    assert_int_equal(nvt_put_chain(c, 1, 8, CH), KVT_OK);
    Kvtier__FlushResp fr;
    assert_int_equal(nvt_flush(c, 1, &fr), KVT_OK);
    assert_int_equal(fr.written, 8);
    assert_true(nvt_stat(c, "nvme.used") > 0);
    kvt_close(c);
    td_kill(&D);
    assert_int_equal(nvt_start(&D, 64, 16, no_adopt), 0);
    c = td_connect(&D);
    assert_int_equal(nvt_stat(c, "nvme.used"), 0);
    assert_int_equal(nvt_stat(c, "nvme.chunks"), 0);
    for (int i = 1; i <= 8; i++) assert_false(nvt_check(c, i, CH));
    /* The space is used again, and what is written now is kept. */
    assert_int_equal(nvt_put_chain(c, 20, 8, CH), KVT_OK);
    assert_int_equal(nvt_flush(c, 1, NULL), KVT_OK);
    kvt_close(c);
    assert_int_equal(td_stop(&D), 0);
    assert_int_equal(nvt_start(&D, 64, 16, no_adopt), 0);
    c = td_connect(&D);
    assert_int_equal(nvt_stat(c, "loaded_chunks"), 8);
    for (int i = 20; i < 28; i++) assert_true(nvt_check(c, i, CH));
    kvt_close(c);
    assert_int_equal(td_stop(&D), 0);
    td_cleanup(&D);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_index_missing),
        cmocka_unit_test(test_index_damaged),
        cmocka_unit_test(test_unindexed_reclaimed),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
