/*
 * test_nvme.c -- the NVMe tier in a real kvtierd: demotion by FLUSH and
 * by the DRAM watermark, GET of chunks only on NVMe (parked until read
 * and verified, over the fast channel and over nng), LOOKUP's tiers and
 * prefetch, write-through, NVMe's own prefix-aware eviction, and the
 * index surviving a clean restart.
 *
 * Bytes are a pure function of the chunk's seed (td_fill), so every chunk
 * read back is checked whole.
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
#include "nvtest.h"

#define CH (256u << 10)

/* FLUSH --evict leaves every chunk on NVMe only; LOOKUP says so; GET
 * reads each back, byte for byte; then they are in DRAM again. */
static void test_flush_then_get(void **state)
{
    (void)state;
    struct tdaemon D;
    assert_int_equal(td_init(&D), 0);
    assert_int_equal(nvt_start(&D, 64, 16, NULL), 0);
    kvt_client *c = td_connect(&D);
    assert_int_equal(nvt_put_chain(c, 100, 20, CH), KVT_OK);
    Kvtier__FlushResp fr;
    assert_int_equal(nvt_flush(c, 1, &fr), KVT_OK);
    assert_int_equal(fr.written, 20);
    assert_int_equal(fr.failed, 0);
    assert_int_equal(nvt_stat(c, "dram.chunks"), 0);
    assert_int_equal(nvt_stat(c, "nvme.chunks"), 20);
    kvt_tier t[20];
    assert_int_equal(nvt_lookup(c, 100, 20, 0, t), 20);
    for (int i = 0; i < 20; i++) assert_int_equal(t[i], KVT_TIER_NVME);
    for (int i = 0; i < 20; i++) assert_true(nvt_check(c, 100 + i, CH));
    assert_int_equal(nvt_stat(c, "promotions"), 20);
    assert_int_equal(nvt_lookup(c, 100, 20, 0, t), 20);
    for (int i = 0; i < 20; i++) assert_int_equal(t[i], KVT_TIER_DRAM);
    /* A second flush finds them clean: nothing to write. */
    assert_int_equal(nvt_flush(c, 0, &fr), KVT_OK);
    assert_int_equal(fr.written, 0);
    assert_int_equal(fr.clean, 20);
    kvt_close(c);
    assert_int_equal(td_stop(&D), 0);
    td_cleanup(&D);
}

/* A zero-copy GET of a chain, half in DRAM, half on NVMe, over the fast
 * channel and over nng: one answer with every chunk, pinned. */
static void get_mixed(int nng)
{
    struct tdaemon D;
    assert_int_equal(td_init(&D), 0);
    assert_int_equal(nvt_start(&D, 64, 16, NULL), 0);
    if (nng) setenv("KVTIER_NO_FAST", "1", 1);
    kvt_client *c = td_connect(&D);
    unsetenv("KVTIER_NO_FAST");
    assert_int_equal(nvt_put_chain(c, 1, 8, CH), KVT_OK);
    assert_int_equal(nvt_flush(c, 1, NULL), KVT_OK);
    for (int i = 1; i <= 4; i++) assert_true(nvt_check(c, i, CH)); /* back in DRAM */
    kvt_key keys[8];
    kvt_chunk ch[8];
    kvt_lease l;
    size_t got;
    for (int i = 0; i < 8; i++) keys[i] = td_key(1 + i);
    uint64_t waits = nvt_stat(c, "get_waits");
    assert_int_equal(kvt_get(c, NVT_NS, keys, 8, &l, ch, &got), KVT_OK);
    assert_int_equal(got, 8);
    uint8_t *want = malloc(CH);
    for (int i = 0; i < 8; i++) {
        size_t n = nvt_size(1 + i, CH);
        td_fill(want, n, 1 + i);
        assert_int_equal(ch[i].size, n);
        assert_memory_equal(ch[i].data, want, n);
        assert_int_equal(ch[i].checksum, kvt_checksum(want, n));
    }
    free(want);
    assert_int_equal(nvt_stat(c, "get_waits"), waits + 1); /* one parked GET */
    assert_int_equal(kvt_release(c, l), KVT_OK);
    kvt_close(c);
    assert_int_equal(td_stop(&D), 0);
    td_cleanup(&D);
}

static void test_get_mixed_fast(void **state)
{
    (void)state;
    get_mixed(0);
}

static void test_get_mixed_nng(void **state)
{
    (void)state;
    get_mixed(1);
}

/* LOOKUP with prefetch starts the reads; the chunks come up by
 * themselves. */
static void test_prefetch(void **state)
{
    (void)state;
    struct tdaemon D;
    assert_int_equal(td_init(&D), 0);
    assert_int_equal(nvt_start(&D, 64, 16, NULL), 0);
    kvt_client *c = td_connect(&D);
    assert_int_equal(nvt_put_chain(c, 1, 10, CH), KVT_OK);
    assert_int_equal(nvt_flush(c, 1, NULL), KVT_OK);
    kvt_tier t[10];
    assert_int_equal(nvt_lookup(c, 1, 10, 1, t), 10);
    assert_int_equal(nvt_wait_stat(c, "promotions", 10, 10000), 10);
    assert_int_equal(nvt_lookup(c, 1, 10, 0, t), 10);
    for (int i = 0; i < 10; i++) assert_int_equal(t[i], KVT_TIER_DRAM);
    kvt_close(c);
    assert_int_equal(td_stop(&D), 0);
    td_cleanup(&D);
}

/* Above the DRAM high watermark, the coldest chunks are written down and
 * their DRAM copies freed; everything still comes back. */
static void test_watermark_demotes(void **state)
{
    (void)state;
    struct tdaemon D;
    const char *rest[] = {"--pool-bytes", "8M", "--high-watermark", "0.5",
                          "--low-watermark", "0.25", NULL};
    assert_int_equal(td_init(&D), 0);
    assert_int_equal(nvt_start(&D, 64, 16, rest), 0);
    kvt_client *c = td_connect(&D);
    for (int k = 0; k < 5; k++) assert_int_equal(nvt_put_chain(c, 1 + 4 * k, 4, CH), KVT_OK);
    assert_true(nvt_wait_stat(c, "demotions", 1, 10000) >= 1);
    for (int i = 1; i <= 20; i++) assert_true(nvt_check(c, i, CH));
    assert_int_equal(nvt_stat(c, "lost_dirty"), 0);
    kvt_close(c);
    assert_int_equal(td_stop(&D), 0);
    td_cleanup(&D);
}

/* Write-through: every commit also lands on NVMe; delete removes both. */
static void test_write_through(void **state)
{
    (void)state;
    struct tdaemon D;
    const char *rest[] = {"--nvme.write_through", "1", NULL};
    assert_int_equal(td_init(&D), 0);
    assert_int_equal(nvt_start(&D, 64, 16, rest), 0);
    kvt_client *c = td_connect(&D);
    assert_int_equal(nvt_put_chain(c, 1, 12, CH), KVT_OK);
    assert_int_equal(nvt_wait_stat(c, "nvme.chunks", 12, 10000), 12);
    assert_int_equal(nvt_stat(c, "dram.chunks"), 12);
    assert_int_equal(nvt_stat(c, "dirty_chunks"), 0);
    kvt_key keys[12];
    size_t n;
    for (int i = 0; i < 12; i++) keys[i] = td_key(1 + i);
    assert_int_equal(kvt_delete(c, NVT_NS, keys, 12, &n), KVT_OK);
    assert_int_equal(n, 12);
    assert_int_equal(nvt_stat(c, "nvme.chunks"), 0);
    assert_int_equal(nvt_stat(c, "nvme.used"), 0);
    kvt_close(c);
    assert_int_equal(td_stop(&D), 0);
    td_cleanup(&D);
}

/* NVMe full: its coldest leaves go first, so a chain is dropped from its
 * tail and its head survives; a dropped chunk is a miss, never wrong. */
static void test_nvme_prefix_eviction(void **state)
{
    (void)state;
    struct tdaemon D;
    const char *rest[] = {"--nvme.nvme_high_watermark", "1.0",
                          "--nvme.nvme_low_watermark", "0.9", NULL};
    assert_int_equal(td_init(&D), 0);
    assert_int_equal(nvt_start(&D, 4, 4, rest), 0); /* 15 records of 260 KiB */
    kvt_client *c = td_connect(&D);
    assert_int_equal(nvt_put_chain(c, 1, 10, CH), KVT_OK);
    assert_int_equal(nvt_flush(c, 1, NULL), KVT_OK);
    assert_int_equal(nvt_put_chain(c, 50, 10, CH), KVT_OK);
    Kvtier__FlushResp fr;
    assert_int_equal(nvt_flush(c, 1, &fr), KVT_OK);
    assert_int_equal(fr.written, 10);
    assert_true(nvt_stat(c, "nvme.evictions") >= 5);
    /* The first chain lost its tail, not its head. */
    kvt_tier t[10];
    size_t head = nvt_lookup(c, 1, 10, 0, t);
    assert_true(head >= 1 && head < 10);
    for (size_t i = head; i < 10; i++) assert_int_equal(t[i], KVT_TIER_NONE);
    for (uint64_t i = 1; i <= head; i++) assert_true(nvt_check(c, i, CH));
    for (uint64_t i = 50; i < 60; i++) assert_true(nvt_check(c, i, CH));
    kvt_close(c);
    assert_int_equal(td_stop(&D), 0);
    td_cleanup(&D);
}

/* A clean restart reads the index back before serving: every chunk is on
 * NVMe and comes back whole. */
static void test_restart_index(void **state)
{
    (void)state;
    struct tdaemon D;
    const char *rest[] = {"--dram.adopt", "0", NULL};
    assert_int_equal(td_init(&D), 0);
    assert_int_equal(nvt_start(&D, 64, 16, rest), 0);
    kvt_client *c = td_connect(&D);
    assert_int_equal(nvt_put_chain(c, 1, 16, CH), KVT_OK);
    assert_int_equal(nvt_flush(c, 0, NULL), KVT_OK);
    kvt_close(c);
    assert_int_equal(td_stop(&D), 0);
    assert_int_equal(nvt_start(&D, 64, 16, rest), 0);
    c = td_connect(&D);
    assert_int_equal(nvt_stat(c, "loaded_chunks"), 16);
    kvt_tier t[16];
    assert_int_equal(nvt_lookup(c, 1, 16, 0, t), 16);
    for (int i = 0; i < 16; i++) assert_int_equal(t[i], KVT_TIER_NVME);
    for (int i = 1; i <= 16; i++) assert_true(nvt_check(c, i, CH));
    kvt_close(c);
    assert_int_equal(td_stop(&D), 0);
    td_cleanup(&D);
}

/* A GET whose read does not come back within its deadline is answered
 * with what is in DRAM (a miss) and counted; the read still completes
 * later and the chunk comes up. KVT_FAULT=nvme_hold=1 holds the first
 * read's completion until another I/O completes. */
static void test_get_deadline(void **state)
{
    (void)state;
    struct tdaemon D;
    const char *rest[] = {"--nvme.get_deadline_ms", "200", NULL};
    assert_int_equal(td_init(&D), 0);
    setenv("KVT_FAULT", "nvme_hold=1", 1);
    int rv = nvt_start(&D, 64, 16, rest);
    unsetenv("KVT_FAULT");
    assert_int_equal(rv, 0);
    kvt_client *c = td_connect(&D);
    assert_int_equal(nvt_put_chain(c, 1, 2, CH), KVT_OK);
    assert_int_equal(nvt_flush(c, 1, NULL), KVT_OK);
    assert_false(nvt_check(c, 1, CH)); /* held: answered at the deadline */
    assert_int_equal(nvt_stat(c, "get_timeouts"), 1);
    assert_true(nvt_check(c, 2, CH)); /* its read releases the held one */
    assert_int_equal(nvt_wait_stat(c, "promotions", 2, 10000), 2);
    kvt_tier t[2];
    assert_int_equal(nvt_lookup(c, 1, 2, 0, t), 2);
    assert_int_equal(t[0], KVT_TIER_DRAM);
    assert_true(nvt_check(c, 1, CH));
    kvt_close(c);
    assert_int_equal(td_stop(&D), 0);
    td_cleanup(&D);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_flush_then_get),
        cmocka_unit_test(test_get_mixed_fast),
        cmocka_unit_test(test_get_mixed_nng),
        cmocka_unit_test(test_prefetch),
        cmocka_unit_test(test_watermark_demotes),
        cmocka_unit_test(test_write_through),
        cmocka_unit_test(test_nvme_prefix_eviction),
        cmocka_unit_test(test_restart_index),
        cmocka_unit_test(test_get_deadline),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
