/*
 * test_kill_client.c -- a client killed with SIGKILL while it holds a
 * read lease and a write lease: its leases are gone within a second (the
 * daemon sees the connection close), and what it never committed never
 * becomes visible.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "daemon.h"
#include "kvtier.h"

static struct tdaemon D;

static int setup(void **state)
{
    (void)state;
    return td_start(&D, NULL);
}

static int teardown(void **state)
{
    (void)state;
    int rc = td_stop(&D);
    td_cleanup(&D);
    return rc;
}

/* The child: pin key 1, reserve keys 2 and 3, write half, say so, hang. */
static void child(const char *sock, int wfd)
{
    kvt_client *c;
    if (kvt_connect(sock, &c) != KVT_OK) _exit(1);
    kvt_key k1 = td_key(1), k23[2] = {td_key(2), td_key(3)};
    size_t sizes[2] = {1 << 20, 1 << 20}, got;
    kvt_chunk rch, wch[2];
    kvt_lease rl, wl;
    if (kvt_get(c, "kc", &k1, 1, &rl, &rch, &got) || got != 1) _exit(2);
    if (kvt_put_begin(c, "kc", k23, sizes, 2, NULL, &wl, wch)) _exit(3);
    memset(wch[0].data, 0xee, sizes[0]);
    if (write(wfd, "r", 1) != 1) _exit(4);
    for (;;) pause();
}

static uint64_t leases(kvt_client *c, kvt_stats *s)
{
    assert_int_equal(kvt_stats_get(c, s), KVT_OK);
    return s->leases;
}

static void test_sigkill_drops_leases(void **state)
{
    (void)state;
    kvt_client *c = td_connect(&D);
    kvt_key k1 = td_key(1), k23[2] = {td_key(2), td_key(3)};
    char buf[4096];
    size_t n_new, len = sizeof buf, present;
    const void *bufs[1] = {buf};
    memset(buf, 1, sizeof buf);
    assert_int_equal(kvt_put(c, "kc", &k1, bufs, &len, 1, NULL, &n_new), KVT_OK);
    kvt_stats s0, s;
    leases(c, &s0);
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    /* nng does not survive fork(): the child runs as a fresh exec. */
    pid_t pid = fork();
    if (pid == 0) {
        char fd[16];
        snprintf(fd, sizeof fd, "%d", fds[1]);
        execl("/proc/self/exe", "test_kill_client", "--child", D.sock, fd, (char *)NULL);
        _exit(127);
    }
    char r;
    close(fds[1]);
    if (read(fds[0], &r, 1) != 1) {
        int st;
        waitpid(pid, &st, 0);
        fail_msg("child failed before holding its leases: status %d", st);
    }
    assert_int_equal(leases(c, &s), 2);
    assert_true(s.used_bytes >= s0.used_bytes + (2u << 20));
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    long long t0 = td_now_ms(), limit = getenv("KVT_SAN") ? 3000 : 1000;
    while (leases(c, &s) != 0 && td_now_ms() - t0 < limit) usleep(5000);
    assert_int_equal(s.leases, 0);
    assert_int_equal(s.used_bytes, s0.used_bytes);
    assert_int_equal(kvt_lookup(c, "kc", k23, 2, &present, NULL), KVT_OK);
    assert_int_equal(present, 0);
    /* The keys were never committed, so a new put writes them afresh. */
    const void *b2[2] = {buf, buf};
    size_t l2[2] = {len, len};
    assert_int_equal(kvt_put(c, "kc", k23, b2, l2, 2, NULL, &n_new), KVT_OK);
    assert_int_equal(n_new, 2);
    /* And the pinned chunk is unpinned: delete frees it at once. */
    size_t del;
    assert_int_equal(kvt_delete(c, "kc", &k1, 1, &del), KVT_OK);
    assert_int_equal(kvt_lookup(c, "kc", &k1, 1, &present, NULL), KVT_OK);
    assert_int_equal(present, 0);
    close(fds[0]);
    kvt_close(c);
}

int main(int argc, char **argv)
{
    if (argc == 4 && strcmp(argv[1], "--child") == 0) child(argv[2], atoi(argv[3]));
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sigkill_drops_leases),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
