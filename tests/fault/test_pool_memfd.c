/*
 * test_pool_memfd.c -- the DRAM pool as a sealed memfd (dram.pool =
 * memfd), with real kvtierd processes.
 *
 * A client receives the pool's fd with its HELLO answer on the fast
 * channel and maps it: zero-copy puts and gets work, for nng-only clients
 * too, and no pool file exists. Whoever holds that fd cannot shrink or
 * grow it (the seals: EPERM), so the daemon and the other clients go on.
 * A client the pool's mode does not let in gets no fd and only copies.
 * Systemd's fd store is played by a datagram socket as $NOTIFY_SOCKET:
 * the daemon sends it FDSTORE=1 with the pool; after kill -9 a new daemon
 * handed that fd back (fd 3, LISTEN_FDS/LISTEN_FDNAMES/LISTEN_PID) adopts
 * the chunks, byte for byte. A memfd of the wrong size, or one not
 * sealed, is refused with a log line, dropped from the store, and the
 * daemon starts on a fresh pool; a kept pool a run does not adopt (a file
 * pool, dram.adopt = 0) is dropped from the store too.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "daemon.h"
#include "kvtier.h"
#include "kvtier.pb-c.h"

#define SZ 100000u
#define KEYS 8
#define SEALS (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL)

static const char *const memfd_args[] = {"--dram.pool", "memfd", NULL};

static void put_keys(kvt_client *c, uint64_t first, int n)
{
    for (int i = 0; i < n; i++) {
        kvt_key k = td_key(first + (uint64_t)i);
        size_t size = SZ;
        kvt_chunk ch;
        kvt_lease l;
        assert_int_equal(kvt_put_begin(c, "m", &k, &size, 1, NULL, &l, &ch), KVT_OK);
        td_fill(ch.data, size, first + (uint64_t)i);
        assert_int_equal(kvt_put_commit(c, l, &ch, 1, NULL), KVT_OK);
    }
}

/* Every key reads back its bytes: zero-copy when mapped, else copied. */
static void check_keys(kvt_client *c, uint64_t first, int n)
{
    uint8_t *want = malloc(SZ), *buf = malloc(SZ);
    for (int i = 0; i < n; i++) {
        kvt_key k = td_key(first + (uint64_t)i);
        td_fill(want, SZ, first + (uint64_t)i);
        if (kvt_zero_copy(c)) {
            kvt_chunk ch;
            kvt_lease l;
            size_t got;
            assert_int_equal(kvt_get(c, "m", &k, 1, &l, &ch, &got), KVT_OK);
            assert_int_equal(got, 1);
            assert_int_equal(ch.size, SZ);
            assert_memory_equal(ch.data, want, SZ);
            assert_int_equal(kvt_release(c, l), KVT_OK);
        } else {
            size_t got;
            assert_int_equal(kvt_get_copy(c, "m", &k, buf, SZ, &got), KVT_OK);
            assert_int_equal(got, SZ);
            assert_memory_equal(buf, want, SZ);
        }
    }
    free(want);
    free(buf);
}

/* HELLO over a raw fast-channel connection; the fd that came with the
 * answer, or -1 (none). The answer must say the pool is a memfd. */
static int hello_fd(const struct tdaemon *d)
{
    Kvtier__Response *r;
    int got;
    assert_int_equal(td_fast_hello(d, &r, &got), 0);
    assert_int_equal(r->body_case, KVTIER__RESPONSE__BODY_HELLO);
    assert_true(r->hello->pool_memfd);
    assert_string_equal(r->hello->pool_path, "");
    kvtier__response__free_unpacked(r, NULL);
    return got;
}

static void test_memfd_zero_copy(void **state)
{
    (void)state;
    struct tdaemon D;
    struct stat st;
    assert_int_equal(td_init(&D), 0);
    assert_int_equal(td_start(&D, memfd_args), 0);
    assert_int_equal(stat(D.pool, &st), -1); /* no file to open or cut */
    assert_true(td_log_has(&D, "the DRAM cache is not kept across restarts"));
    kvt_client *c = td_connect(&D);
    assert_true(kvt_zero_copy(c));
    put_keys(c, 100, KEYS);
    check_keys(c, 100, KEYS);
    /* An nng-only client fetches the fd through the fast channel too. */
    setenv("KVTIER_NO_FAST", "1", 1);
    kvt_client *n = td_connect(&D);
    unsetenv("KVTIER_NO_FAST");
    assert_true(kvt_zero_copy(n));
    check_keys(n, 100, KEYS);
    put_keys(n, 200, 2);
    check_keys(c, 200, 2);
    kvt_close(n);
    kvt_close(c);
    assert_int_equal(td_stop(&D), 0);
    td_cleanup(&D);
}

static void test_memfd_sealed(void **state)
{
    (void)state;
    struct tdaemon D;
    struct stat st;
    assert_int_equal(td_init(&D), 0);
    assert_int_equal(td_start(&D, memfd_args), 0);
    kvt_client *c = td_connect(&D);
    put_keys(c, 300, KEYS);
    int fd = hello_fd(&D);
    assert_true(fd >= 0);
    assert_int_equal(fcntl(fd, F_GET_SEALS) & SEALS, SEALS);
    assert_int_equal(fstat(fd, &st), 0);
    off_t size = st.st_size;
    assert_int_equal(ftruncate(fd, 0), -1);
    assert_int_equal(errno, EPERM);
    assert_int_equal(ftruncate(fd, size / 2), -1);
    assert_int_equal(errno, EPERM);
    assert_int_equal(ftruncate(fd, size + 4096), -1);
    assert_int_equal(errno, EPERM);
    assert_int_equal(fallocate(fd, 0, size, 4096), -1); /* no growing either */
    assert_int_equal(fcntl(fd, F_ADD_SEALS, F_SEAL_WRITE), -1);
    assert_int_equal(fstat(fd, &st), 0);
    assert_int_equal(st.st_size, size);
    close(fd);
    /* The daemon and every client go on, the holder of the fd included. */
    assert_true(td_alive(&D));
    check_keys(c, 300, KEYS);
    kvt_client *o = td_connect(&D);
    check_keys(o, 300, KEYS);
    setenv("KVTIER_NO_FAST", "1", 1); /* the daemon's own copies, over nng */
    kvt_client *n = td_connect(&D);
    unsetenv("KVTIER_NO_FAST");
    uint8_t *buf = malloc(SZ), *want = malloc(SZ);
    kvt_key k = td_key(301);
    size_t got;
    assert_int_equal(kvt_get_copy(n, "m", &k, buf, SZ, &got), KVT_OK);
    td_fill(want, SZ, 301);
    assert_memory_equal(buf, want, SZ);
    free(buf);
    free(want);
    kvt_close(n);
    kvt_close(o);
    kvt_close(c);
    assert_int_equal(td_stop(&D), 0);
    td_cleanup(&D);
}

/* The stranger's side, run as uid and gid 65534: 0 if it was not handed
 * the pool and still reads key 401 right by copying. */
static int stranger(const char *sock)
{
    if (setgid(65534) != 0 || setuid(65534) != 0) return 2;
    kvt_client *s;
    if (kvt_connect(sock, &s) != KVT_OK) return 3;
    if (kvt_zero_copy(s)) return 4; /* it was handed the pool */
    uint8_t *buf = malloc(SZ), *want = malloc(SZ);
    kvt_key k = td_key(401);
    size_t got;
    kvt_err e = kvt_get_copy(s, "m", &k, buf, SZ, &got);
    td_fill(want, SZ, 401);
    int same = e == KVT_OK && got == SZ && !memcmp(buf, want, SZ);
    free(buf);
    free(want);
    kvt_close(s);
    return same ? 0 : 5;
}

/* A client of another uid, let onto the socket but not into the pool's
 * mode, gets no fd: it copies. Needs root to be another uid. */
static void test_memfd_stranger(void **state)
{
    (void)state;
    if (geteuid() != 0) skip();
    struct tdaemon D;
    const char *args[] = {"--dram.pool", "memfd", "--daemon.socket_mode", "0666",
                          "--dram.pool_mode", "0600", NULL};
    assert_int_equal(td_init(&D), 0);
    assert_int_equal(chmod(D.dir, 0755), 0);
    assert_int_equal(td_start(&D, args), 0);
    kvt_client *c = td_connect(&D);
    put_keys(c, 400, 2);
    pid_t pid = fork();
    if (pid == 0) { /* nng does not survive fork: a fresh process */
        execl("/proc/self/exe", "test_pool_memfd", "--stranger", D.sock, (char *)NULL);
        _exit(127);
    }
    int st;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 0);
    assert_true(kvt_zero_copy(c)); /* the daemon's own uid maps it */
    kvt_close(c);
    assert_int_equal(td_stop(&D), 0);
    td_cleanup(&D);
}

/* ------------------------------------------------- systemd's fd store */

/* A datagram socket at dir/notify, as systemd's $NOTIFY_SOCKET. */
static int notify_socket(const struct tdaemon *d, char *path, size_t len)
{
    int s = td_notify_socket(d, path, len);
    assert_true(s >= 0);
    return s;
}

/* Wait (up to 10 s) for a datagram containing what; the fd that came
 * with it (or -1). Datagrams without it are read and dropped. */
static int await_notify(int s, const char *what, int *fd_out)
{
    long long end = td_now_ms() + (getenv("KVT_SAN") ? 30000 : 10000);
    char buf[512];
    int fd;
    while (td_notify_recv(s, buf, sizeof buf, &fd, end) >= 0) {
        if (strstr(buf, what)) {
            if (fd_out) *fd_out = fd;
            else if (fd >= 0) close(fd);
            return 0;
        }
        if (fd >= 0) close(fd);
    }
    return -1;
}

/* Start D under the play fd store; the pool fd it stores. */
static int start_stored(struct tdaemon *D, int ns, const char *npath, int fd3,
                        const char *name)
{
    int fd = -1;
    setenv("NOTIFY_SOCKET", npath, 1);
    int rv = td_start_fd(D, memfd_args, fd3, name);
    unsetenv("NOTIFY_SOCKET");
    assert_int_equal(rv, 0);
    if (fd3 < 0 || strcmp(name, "kvtier-pool") != 0) {
        assert_int_equal(await_notify(ns, "FDSTORE=1\nFDNAME=kvtier-pool", &fd), 0);
        assert_true(fd >= 0);
    }
    return fd;
}

static void test_fdstore_adopt(void **state)
{
    (void)state;
    struct tdaemon D;
    char npath[400];
    assert_int_equal(td_init(&D), 0);
    int ns = notify_socket(&D, npath, sizeof npath);
    int kept = start_stored(&D, ns, npath, -1, NULL);
    assert_int_equal(fcntl(kept, F_GET_SEALS) & SEALS, SEALS);
    kvt_client *c = td_connect(&D);
    put_keys(c, 500, KEYS);
    kvt_close(c);
    usleep(1500000); /* the journal is flushed on the daemon's ticks */
    td_kill(&D);
    /* Round two: the stored fd comes back (fd 3, LISTEN_*). */
    int again = start_stored(&D, ns, npath, kept, "kvtier-pool");
    assert_int_equal(again, -1);
    assert_true(td_log_has(&D, "the memfd kept in systemd's fd store"));
    assert_true(td_log_has(&D, "adopted 8 chunks"));
    c = td_connect(&D);
    assert_true(kvt_zero_copy(c));
    check_keys(c, 500, KEYS);
    kvt_close(c);
    assert_int_equal(td_stop(&D), 0);
    close(kept);
    close(ns);
    td_cleanup(&D);
}

/* A kept fd that is no pool of ours: refused, dropped, a fresh pool. */
static void refused_fd(int bad, const char *why)
{
    struct tdaemon D;
    char npath[400];
    assert_int_equal(td_init(&D), 0);
    int ns = notify_socket(&D, npath, sizeof npath);
    setenv("NOTIFY_SOCKET", npath, 1);
    int rv = td_start_fd(&D, memfd_args, bad, "kvtier-pool");
    unsetenv("NOTIFY_SOCKET");
    assert_int_equal(rv, 0);
    assert_int_equal(await_notify(ns, "FDSTOREREMOVE=1\nFDNAME=kvtier-pool", NULL), 0);
    int fresh = -1;
    assert_int_equal(await_notify(ns, "FDSTORE=1\nFDNAME=kvtier-pool", &fresh), 0);
    assert_true(fresh >= 0);
    assert_int_equal(fcntl(fresh, F_GET_SEALS) & SEALS, SEALS);
    close(fresh);
    assert_true(td_log_has(&D, "refusing the pool fd handed back by the fd store"));
    if (!td_log_has(&D, why)) fail_msg("log lacks \"%s\"", why);
    kvt_client *c = td_connect(&D);
    assert_true(kvt_zero_copy(c));
    put_keys(c, 600, 2);
    check_keys(c, 600, 2);
    kvt_close(c);
    assert_int_equal(td_stop(&D), 0);
    close(ns);
    td_cleanup(&D);
}

static void test_fdstore_refused(void **state)
{
    (void)state;
    /* Sealed, but 1 MiB where the pool is 64 MiB. */
    int small = memfd_create("kvtier-pool", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    assert_true(small >= 0);
    assert_int_equal(ftruncate(small, 1 << 20), 0);
    assert_int_equal(fcntl(small, F_ADD_SEALS, SEALS), 0);
    refused_fd(small, "holds 1048576 bytes, the pool is 67108864");
    close(small);
    /* The right size, not sealed: anyone could cut it. */
    int open_ = memfd_create("kvtier-pool", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    assert_true(open_ >= 0);
    assert_int_equal(ftruncate(open_, 64 << 20), 0);
    refused_fd(open_, "is not sealed against shrinking and growing");
    close(open_);
    /* Not a memfd at all: a pipe. */
    int p[2];
    assert_int_equal(pipe(p), 0);
    refused_fd(p[0], "is not a sealable memfd");
    close(p[0]);
    close(p[1]);
}

/* A kept pool this run does not adopt (a file pool; dram.adopt = 0) is
 * taken out of the store, where it would hold its memory for nothing. */
static void dropped_fd(const char *const *args, const char *why)
{
    struct tdaemon D;
    char npath[400];
    int kept = memfd_create("kvtier-pool", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    assert_true(kept >= 0);
    assert_int_equal(ftruncate(kept, 64 << 20), 0);
    assert_int_equal(fcntl(kept, F_ADD_SEALS, SEALS), 0);
    assert_int_equal(td_init(&D), 0);
    int ns = notify_socket(&D, npath, sizeof npath);
    setenv("NOTIFY_SOCKET", npath, 1);
    int rv = td_start_fd(&D, args, kept, "kvtier-pool");
    unsetenv("NOTIFY_SOCKET");
    assert_int_equal(rv, 0);
    assert_int_equal(await_notify(ns, "FDSTOREREMOVE=1\nFDNAME=kvtier-pool", NULL), 0);
    if (!td_log_has(&D, why)) fail_msg("log lacks \"%s\"", why);
    kvt_client *c = td_connect(&D);
    assert_true(kvt_zero_copy(c));
    put_keys(c, 700, 2);
    check_keys(c, 700, 2);
    kvt_close(c);
    assert_int_equal(td_stop(&D), 0);
    close(kept);
    close(ns);
    td_cleanup(&D);
}

static void test_fdstore_dropped(void **state)
{
    (void)state;
    const char *file[] = {"--dram.pool", "file", NULL};
    const char *no_adopt[] = {"--dram.pool", "memfd", "--dram.adopt", "0", NULL};
    dropped_fd(file, "this run uses a pool file");
    dropped_fd(no_adopt, "this run does not adopt");
}

int main(int argc, char **argv)
{
    if (argc == 3 && !strcmp(argv[1], "--stranger")) return stranger(argv[2]);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_memfd_zero_copy),
        cmocka_unit_test(test_memfd_sealed),
        cmocka_unit_test(test_memfd_stranger),
        cmocka_unit_test(test_fdstore_adopt),
        cmocka_unit_test(test_fdstore_refused),
        cmocka_unit_test(test_fdstore_dropped),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
