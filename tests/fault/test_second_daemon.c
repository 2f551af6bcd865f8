/*
 * test_second_daemon.c -- a second kvtierd on a socket or pool that a live
 * daemon holds refuses to start with a clear message and disturbs nothing;
 * after kill -9 of the first, a new daemon takes over the stale socket and
 * pool file.
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

static void put_one(const struct tdaemon *d, uint64_t seed)
{
    kvt_client *c = td_connect(d);
    kvt_key k = td_key(seed);
    char buf[1000];
    size_t len = sizeof buf;
    const void *b[1] = {buf};
    td_fill(buf, len, seed);
    assert_int_equal(kvt_put(c, "sd", &k, b, &len, 1, NULL, NULL), KVT_OK);
    kvt_close(c);
}

static int has(const struct tdaemon *d, uint64_t seed)
{
    kvt_client *c = td_connect(d);
    kvt_key k = td_key(seed);
    size_t n;
    assert_int_equal(kvt_lookup(c, "sd", &k, 1, &n, NULL), KVT_OK);
    kvt_close(c);
    return (int)n;
}

static void test_refuse_then_take_over(void **state)
{
    (void)state;
    struct tdaemon a = {0}, b = {0};
    assert_int_equal(td_start(&a, NULL), 0);
    put_one(&a, 1);
    /* Same socket, other pool. */
    assert_int_equal(td_init(&b), 0);
    snprintf(b.sock, sizeof b.sock, "%s", a.sock);
    pid_t p = td_spawn(&b, NULL);
    assert_int_equal(td_wait_exit(p, 10000), 1);
    assert_true(td_log_has(&b, "in use by another kvtierd"));
    /* Same pool, other socket. */
    td_cleanup(&b);
    assert_int_equal(td_init(&b), 0);
    snprintf(b.pool, sizeof b.pool, "%s", a.pool);
    p = td_spawn(&b, NULL);
    assert_int_equal(td_wait_exit(p, 10000), 1);
    assert_true(td_log_has(&b, "is in use by another kvtierd"));
    b.pool[0] = '\0'; /* a's pool: not b's to remove */
    td_cleanup(&b);
    /* The first daemon noticed nothing. */
    assert_int_equal(has(&a, 1), 1);
    /* kill -9: socket, lock and pool files stay behind, unlocked. */
    td_kill(&a);
    assert_int_equal(access(a.sock, F_OK), 0);
    assert_int_equal(access(a.pool, F_OK), 0);
    assert_int_equal(td_start(&a, NULL), 0);
    assert_true(td_log_has(&a, "removed stale socket"));
    put_one(&a, 2);
    assert_int_equal(has(&a, 2), 1);
    assert_int_equal(td_stop(&a), 0);
    /* A clean stop leaves the pool file (and its journal) for the next
     * daemon to adopt (dram.adopt = 1, the default). */
    assert_int_equal(access(a.pool, F_OK), 0);
    td_cleanup(&a);
}

static void test_bad_config(void **state)
{
    (void)state;
    struct tdaemon d;
    assert_int_equal(td_init(&d), 0);
    char path[400];
    snprintf(path, sizeof path, "%s/bad.conf", d.dir);
    FILE *f = fopen(path, "w");
    fprintf(f, "[dram]\npool_bytes = 64M\n\n[daemon]\nno_such_key = 1\n");
    fclose(f);
    const char *extra[] = {"--config", path, NULL};
    pid_t p = td_spawn(&d, extra);
    assert_int_equal(td_wait_exit(p, 10000), 2);
    assert_true(td_log_has(&d, "line 5: unknown key 'no_such_key'"));
    f = fopen(path, "w");
    fprintf(f, "[dram]\nhigh_watermark = 1.5\n");
    fclose(f);
    p = td_spawn(&d, extra);
    assert_int_equal(td_wait_exit(p, 10000), 2);
    assert_true(td_log_has(&d, "line 2: dram.high_watermark"));
    td_cleanup(&d);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_refuse_then_take_over),
        cmocka_unit_test(test_bad_config),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
