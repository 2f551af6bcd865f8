/*
 * test_restart_dram.c -- a restarted kvtierd adopting the DRAM pool its
 * predecessor left (daemon/adopt.c, daemon/journal.c):
 *
 *  - after a clean stop and after kill -9, every committed chunk is back
 *    in DRAM, byte for byte, with its place in its chain;
 *  - a put begun but never committed (bytes written into the pool) does
 *    not appear;
 *  - a chunk whose pool bytes were changed while no daemon ran is found
 *    by its checksum and dropped, never served;
 *  - a torn journal tail is ignored with a log line;
 *  - a pool of another size, or dram.adopt = 0, starts empty.
 */
#include <fcntl.h>
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

#define CH (300u << 10)

static void start(struct tdaemon *d, const char *const *extra)
{
    assert_int_equal(td_start(d, extra), 0);
}

/* Chunks 1..10 committed; 50..52 begun, written with the wrong bytes,
 * never committed. */
static kvt_client *fill(struct tdaemon *d)
{
    kvt_client *c = td_connect(d);
    assert_int_equal(nvt_put_chain(c, 1, 10, CH), KVT_OK);
    kvt_key keys[3] = {td_key(50), td_key(51), td_key(52)};
    size_t sizes[3] = {CH, CH, CH};
    kvt_chunk ch[3];
    kvt_lease l;
    assert_int_equal(kvt_put_begin(c, NVT_NS, keys, sizes, 3, NULL, &l, ch), KVT_OK);
    for (int i = 0; i < 3; i++) memset(ch[i].data, 0xee, CH);
    return c;
}

static void check_adopted(struct tdaemon *d)
{
    kvt_client *c = td_connect(d);
    assert_int_equal(nvt_stat(c, "adopted_chunks"), 10);
    assert_true(td_log_has(d, "adopted 10 chunks"));
    kvt_tier t[10];
    assert_int_equal(nvt_lookup(c, 1, 10, 0, t), 10);
    for (int i = 0; i < 10; i++) assert_int_equal(t[i], KVT_TIER_DRAM);
    for (int i = 1; i <= 10; i++) assert_true(nvt_check(c, i, CH));
    assert_int_equal(nvt_lookup(c, 50, 3, 0, t), 0);
    for (int i = 0; i < 3; i++) assert_int_equal(t[i], KVT_TIER_NONE);
    /* The chain came back: evicting one chunk takes its tail. */
    uint64_t freed, used = nvt_stat(c, "used_bytes"), cap = nvt_stat(c, "pool_bytes");
    assert_int_equal(kvt_evict(c, cap - used + 1, &freed), KVT_OK);
    assert_int_equal(nvt_lookup(c, 1, 10, 0, t), 9);
    assert_int_equal(t[9], KVT_TIER_NONE);
    kvt_close(c);
}

static void test_clean_restart(void **state)
{
    (void)state;
    struct tdaemon D;
    assert_int_equal(td_init(&D), 0);
    start(&D, NULL);
    kvt_client *c = fill(&D);
    kvt_close(c);
    assert_int_equal(td_stop(&D), 0);
    start(&D, NULL);
    check_adopted(&D);
    assert_int_equal(td_stop(&D), 0);
    td_cleanup(&D);
}

static void test_kill9_restart(void **state)
{
    (void)state;
    struct tdaemon D;
    assert_int_equal(td_init(&D), 0);
    start(&D, NULL);
    kvt_client *c = fill(&D);
    td_kill(&D);
    kvt_close(c);
    start(&D, NULL);
    check_adopted(&D);
    /* Adopted again after a second crash, from the rewritten journal. */
    td_kill(&D);
    start(&D, NULL);
    c = td_connect(&D);
    assert_int_equal(nvt_stat(c, "adopted_chunks"), 10);
    kvt_close(c);
    assert_int_equal(td_stop(&D), 0);
    td_cleanup(&D);
}

/* Change the pool bytes of every chunk (each is CH-ish and 4 KiB aligned
 * from 0) at 4 KiB + 17 past each 1 MiB, while no daemon runs. */
static void damage_pool(const struct tdaemon *d)
{
    int fd = open(d->pool, O_RDWR);
    assert_true(fd >= 0);
    for (off_t at = 4096 + 17; at < (3 << 20); at += 1 << 20) {
        uint8_t b;
        assert_int_equal(pread(fd, &b, 1, at), 1);
        b = (uint8_t)~b;
        assert_int_equal(pwrite(fd, &b, 1, at), 1);
    }
    close(fd);
}

static void test_damaged_pool(void **state)
{
    (void)state;
    struct tdaemon D;
    assert_int_equal(td_init(&D), 0);
    start(&D, NULL);
    kvt_client *c = fill(&D);
    kvt_close(c);
    assert_int_equal(td_stop(&D), 0);
    damage_pool(&D);
    start(&D, NULL);
    c = td_connect(&D);
    uint64_t dropped = nvt_stat(c, "adopt_dropped");
    assert_true(dropped >= 1);
    assert_int_equal(nvt_stat(c, "adopted_chunks") + dropped, 10);
    int served = 0;
    for (int i = 1; i <= 10; i++) served += nvt_check(c, i, CH); /* aborts on a wrong byte */
    assert_int_equal((uint64_t)served, 10 - dropped);
    kvt_close(c);
    assert_int_equal(td_stop(&D), 0);
    td_cleanup(&D);
}

static void test_torn_journal(void **state)
{
    (void)state;
    struct tdaemon D;
    char path[400];
    assert_int_equal(td_init(&D), 0);
    start(&D, NULL);
    kvt_client *c = fill(&D);
    td_kill(&D);
    kvt_close(c);
    snprintf(path, sizeof path, "%s/dram.journal", D.dir);
    FILE *f = fopen(path, "a");
    assert_non_null(f);
    fputs("\x58\x00\x00\x00half a record", f);
    fclose(f);
    start(&D, NULL);
    assert_true(td_log_has(&D, "do not decode"));
    check_adopted(&D);
    assert_int_equal(td_stop(&D), 0);
    td_cleanup(&D);
}

static void test_not_adopted(void **state)
{
    (void)state;
    struct tdaemon D;
    const char *bigger[] = {"--pool-bytes", "80M", NULL};
    const char *off[] = {"--dram.adopt", "0", NULL};
    assert_int_equal(td_init(&D), 0);
    start(&D, NULL);
    kvt_client *c = fill(&D);
    kvt_close(c);
    assert_int_equal(td_stop(&D), 0);
    start(&D, bigger); /* another size: a fresh pool */
    c = td_connect(&D);
    assert_int_equal(nvt_stat(c, "adopted_chunks"), 0);
    assert_false(nvt_check(c, 1, CH));
    assert_int_equal(nvt_put_chain(c, 1, 10, CH), KVT_OK);
    kvt_close(c);
    assert_int_equal(td_stop(&D), 0);
    start(&D, bigger);
    c = td_connect(&D);
    assert_int_equal(nvt_stat(c, "adopted_chunks"), 10);
    kvt_close(c);
    assert_int_equal(td_stop(&D), 0);
    start(&D, off); /* adoption off: empty, and the pool is removed at stop */
    c = td_connect(&D);
    assert_int_equal(nvt_stat(c, "adopted_chunks"), 0);
    kvt_close(c);
    assert_int_equal(td_stop(&D), 0);
    assert_int_equal(access(D.pool, F_OK), -1);
    td_cleanup(&D);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_clean_restart),
        cmocka_unit_test(test_kill9_restart),
        cmocka_unit_test(test_damaged_pool),
        cmocka_unit_test(test_torn_journal),
        cmocka_unit_test(test_not_adopted),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
