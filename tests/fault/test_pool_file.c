/*
 * test_pool_file.c -- the DRAM pool file at its predictable path (issue
 * #11 (e)): kvtierd creates it with O_EXCL; a file already there is used
 * only if it is a regular file of the daemon's user with one link (a
 * symlink, another user's file, a hard link, a fifo: the daemon refuses to
 * start and says why); a stale one that is not adopted is replaced by a
 * new inode. A client truncating the pool does not kill the daemon: its
 * own copies from the pool (inline get and put, served over tcp) go on,
 * the size is restored and the log says so; the cut chunk reads as zeros
 * and is refused by its checksum, never served.
 */
#include <fcntl.h>
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

#include "daemon.h"
#include "kvtier.h"

#define SZ 100000u

/* Start must fail (exit status not 0) with why in the log. */
static void refused(struct tdaemon *d, const char *why)
{
    pid_t pid = td_spawn(d, NULL);
    assert_true(pid > 0);
    int st = td_wait_exit(pid, 10000);
    assert_true(st != 0);
    if (!td_log_has(d, why)) fail_msg("log lacks \"%s\"", why);
}

static void test_pool_symlink(void **state)
{
    (void)state;
    struct tdaemon D;
    char target[400];
    struct stat st;
    assert_int_equal(td_init(&D), 0);
    snprintf(target, sizeof target, "%s/target", D.dir);
    assert_int_equal(symlink(target, D.pool), 0);
    refused(&D, "is a symlink");
    assert_int_equal(lstat(target, &st), -1); /* nothing made through it */
    unlink(D.pool);
    td_cleanup(&D);
}

static void test_pool_not_ours(void **state)
{
    (void)state;
    struct tdaemon D;
    char other[400];
    assert_int_equal(td_init(&D), 0);
    /* A hard link: one inode under two names. */
    snprintf(other, sizeof other, "%s.other", D.pool); /* same file system */
    int fd = open(other, O_CREAT | O_RDWR, 0600);
    assert_true(fd >= 0);
    close(fd);
    assert_int_equal(link(other, D.pool), 0);
    refused(&D, "is not a regular file of this user with one link");
    unlink(D.pool);
    unlink(other);
    /* A fifo. */
    assert_int_equal(mkfifo(D.pool, 0600), 0);
    refused(&D, "is not a regular file of this user with one link");
    unlink(D.pool);
    /* Another user's file (needs root to make one). */
    if (geteuid() == 0) {
        fd = open(D.pool, O_CREAT | O_RDWR, 0600);
        assert_true(fd >= 0);
        assert_int_equal(fchown(fd, 65534, 65534), 0);
        close(fd);
        refused(&D, "is not a regular file of this user with one link");
        unlink(D.pool);
    }
    td_cleanup(&D);
}

/* A stale file of ours that is not adopted: a new inode replaces it. */
static void test_pool_stale_replaced(void **state)
{
    (void)state;
    struct tdaemon D;
    struct stat before, after;
    assert_int_equal(td_init(&D), 0);
    int fd = open(D.pool, O_CREAT | O_RDWR, 0600);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, "stale", 5), 5);
    close(fd);
    assert_int_equal(stat(D.pool, &before), 0);
    const char *extra[] = {"--dram.adopt", "0", NULL};
    assert_int_equal(td_start(&D, extra), 0);
    assert_int_equal(stat(D.pool, &after), 0);
    assert_true(after.st_ino != before.st_ino);
    assert_int_equal(after.st_size, 64 << 20);
    assert_int_equal(td_stop(&D), 0);
    td_cleanup(&D);
}

static void put(kvt_client *c, uint64_t seed)
{
    static char buf[SZ];
    td_fill(buf, SZ, seed);
    kvt_key k = td_key(seed);
    const void *b = buf;
    size_t sz = SZ;
    assert_int_equal(kvt_put(c, "trunc", &k, &b, &sz, 1, NULL, NULL), KVT_OK);
}

static void test_pool_truncated(void **state)
{
    (void)state;
    struct tdaemon D;
    char url[64];
    static char got[SZ], want[SZ];
    size_t n = 0;
    struct stat st;
    assert_int_equal(td_init(&D), 0);
    snprintf(url, sizeof url, "tcp://127.0.0.1:%d", td_free_port());
    const char *extra[] = {"--tcp", url, "--tcp-insecure", "1", NULL};
    assert_int_equal(td_start(&D, extra), 0);
    kvt_client *local = td_connect(&D), *remote = NULL;
    assert_int_equal(kvt_connect(url, &remote), KVT_OK);
    assert_false(kvt_zero_copy(remote)); /* the daemon copies for it */
    put(local, 1);
    assert_int_equal(truncate(D.pool, 0), 0);
    /* The daemon reads the cut chunk for the remote client: zeros, which
     * its checksum tells from the chunk. */
    kvt_key k = td_key(1);
    assert_int_equal(kvt_get_copy(remote, "trunc", &k, got, SZ, &n), KVT_ECORRUPT);
    assert_true(td_log_has(&D, "the pool file was truncated"));
    assert_int_equal(stat(D.pool, &st), 0);
    assert_int_equal(st.st_size, 64 << 20);
    /* Truncated again: the daemon writes a remote put into the pool. */
    assert_int_equal(truncate(D.pool, 4096), 0);
    put(remote, 2);
    k = td_key(2);
    td_fill(want, SZ, 2);
    assert_int_equal(kvt_get_copy(remote, "trunc", &k, got, SZ, &n), KVT_OK);
    assert_memory_equal(got, want, SZ);
    kvt_close(remote);
    kvt_close(local);
    assert_int_equal(td_stop(&D), 0);
    td_cleanup(&D);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pool_symlink),
        cmocka_unit_test(test_pool_not_ours),
        cmocka_unit_test(test_pool_stale_replaced),
        cmocka_unit_test(test_pool_truncated),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
