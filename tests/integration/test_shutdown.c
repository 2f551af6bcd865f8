/*
 * test_shutdown.c -- a stop ends within its bound whatever the peers do.
 *
 * Real daemons over TLS on loopback: every node of a cluster stopped at
 * the same moment exits cleanly; a node whose peer is frozen (SIGSTOP)
 * stops; a node whose cluster sockets never close (KVT_FAULT=
 * nng_close_hang: nng 1.5's close deadlock) stops cleanly past the close
 * bound, with a warning, and its chunks are adopted by the next daemon; a
 * shutdown stuck for good (KVT_FAULT=shutdown_hang) is ended by the
 * shutdown guard with status 1 and the step it was stuck in, and the next
 * daemon starts and serves. Exits are waited for with slack well past the
 * configured bounds (a hang waits forever), not timed.
 */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "daemon.h"
#include "kvtier.h"

#define FAIL_MS 2000
#define SLACK_MS 30000 /* drain (5 s) + close bound (2 s) + a loaded machine */
#define CHUNK 4096

static const char *const guard_args[] = {"--daemon.shutdown_timeout_ms", "1500",
                                         "--daemon.drain_timeout_ms", "500", NULL};

static void put_one(kvt_client *c, uint64_t seed)
{
    assert_int_equal(tc_put(c, "shut", seed, CHUNK), KVT_OK);
}

/* 1 if the daemon serves the chunk of seed with the right bytes. */
static int has_one(const struct tdaemon *d, uint64_t seed)
{
    kvt_client *c = td_connect(d);
    int rc = tc_get_checked(c, "shut", seed, CHUNK, 2000);
    kvt_close(c);
    return rc;
}

static void test_all_stopped_together(void **state)
{
    (void)state;
    struct tcluster T;
    tc_init(&T, TC_MAX);
    for (int i = 0; i < TC_MAX; i++) assert_int_equal(tc_start(&T, i, FAIL_MS, NULL), 0);
    for (int i = 0; i < TC_MAX; i++)
        assert_int_equal(tc_wait_alive(&T, i, TC_MAX - 1, 0), 0);
    for (int i = 0; i < TC_MAX; i++) {
        kvt_close(T.c[i]);
        T.c[i] = NULL;
    }
    for (int i = 0; i < TC_MAX; i++) kill(T.d[i].pid, SIGTERM);
    for (int i = 0; i < TC_MAX; i++) {
        assert_int_equal(td_wait_exit(T.d[i].pid, SLACK_MS), 0);
        T.d[i].pid = 0;
        assert_true(td_log_has(&T.d[i], "main: stopped"));
    }
    assert_int_equal(tc_teardown(&T), 0);
}

static void test_frozen_peer(void **state)
{
    (void)state;
    struct tcluster T;
    tc_init(&T, 2);
    for (int i = 0; i < 2; i++) assert_int_equal(tc_start(&T, i, FAIL_MS, NULL), 0);
    assert_int_equal(tc_wait_alive(&T, 0, 1, 0), 0);
    put_one(T.c[0], 1);
    kill(T.d[1].pid, SIGSTOP);
    kvt_close(T.c[0]);
    T.c[0] = NULL;
    kill(T.d[0].pid, SIGTERM);
    assert_int_equal(td_wait_exit(T.d[0].pid, SLACK_MS), 0);
    T.d[0].pid = 0;
    assert_true(td_log_has(&T.d[0], "main: stopped"));
    assert_int_equal(tc_teardown(&T), 0); /* SIGCONTs node 2 first */
}

static void test_close_hangs(void **state)
{
    (void)state;
    struct tcluster T;
    tc_init(&T, 2);
    assert_int_equal(tc_start(&T, 0, FAIL_MS, NULL), 0);
    setenv("KVT_FAULT", "nng_close_hang=1", 1);
    int rc = tc_start(&T, 1, FAIL_MS, NULL);
    unsetenv("KVT_FAULT");
    assert_int_equal(rc, 0);
    assert_int_equal(tc_wait_alive(&T, 1, 1, 0), 0);
    put_one(T.c[1], 2);
    kvt_close(T.c[1]);
    T.c[1] = NULL;
    kill(T.d[1].pid, SIGTERM);
    /* Past the 2 s close bound and inside the default guard (15 s after
     * the drain): the stop went on without the sockets. */
    assert_int_equal(td_wait_exit(T.d[1].pid, SLACK_MS), 0);
    T.d[1].pid = 0;
    assert_true(td_log_has(&T.d[1], "did not close within"));
    assert_true(td_log_has(&T.d[1], "main: stopped"));
    assert_false(td_log_has(&T.d[1], "stop did not finish"));
    /* The journal was written after the abandoned close: adopted. */
    assert_int_equal(td_start(&T.d[1], NULL), 0);
    assert_int_equal(has_one(&T.d[1], 2), 1);
    assert_int_equal(tc_teardown(&T), 0);
}

static void test_guard_ends_a_stuck_stop(void **state)
{
    (void)state;
    struct tdaemon d;
    assert_int_equal(td_init(&d), 0);
    setenv("KVT_FAULT", "shutdown_hang=1", 1);
    int rc = td_start(&d, guard_args);
    unsetenv("KVT_FAULT");
    assert_int_equal(rc, 0);
    kvt_client *c = td_connect(&d);
    put_one(c, 3);
    kvt_close(c);
    kill(d.pid, SIGTERM);
    assert_int_equal(td_wait_exit(d.pid, SLACK_MS), 1);
    d.pid = 0;
    assert_true(td_log_has(&d, "stop did not finish within daemon.shutdown_timeout_ms"));
    assert_true(td_log_has(&d, "stuck in: shutdown_hang"));
    assert_false(td_log_has(&d, "main: stopped"));
    /* As after a kill -9: the next daemon starts and serves. */
    assert_int_equal(td_start(&d, NULL), 0);
    c = td_connect(&d);
    put_one(c, 4);
    kvt_close(c);
    assert_int_equal(has_one(&d, 4), 1);
    assert_int_equal(td_stop(&d), 0);
    td_cleanup(&d);
}

/* With the guard off (0), the configuration is accepted and a normal
 * stop still ends by itself. */
static void test_guard_off(void **state)
{
    (void)state;
    struct tdaemon d;
    static const char *const off[] = {"--daemon.shutdown_timeout_ms", "0", NULL};
    assert_int_equal(td_init(&d), 0);
    assert_int_equal(td_start(&d, off), 0);
    assert_int_equal(td_stop(&d), 0);
    assert_true(td_log_has(&d, "main: stopped"));
    td_cleanup(&d);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_all_stopped_together),
        cmocka_unit_test(test_frozen_peer),
        cmocka_unit_test(test_close_hangs),
        cmocka_unit_test(test_guard_ends_a_stuck_stop),
        cmocka_unit_test(test_guard_off),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
