/*
 * test_kvcache_kill.c -- an engine killed (SIGKILL) in the middle of a
 * SAVE, in the middle of a LOAD, and while parked in kvt_kv_wait (on the
 * fast channel and on nng): the daemon drops its registration and its
 * transfers, frees what the SAVE had reserved, unpins what the LOAD was
 * reading, and keeps serving. Also the waits themselves: a timeout, a
 * parked wait answered when its transfer ends, and more waiters than the
 * daemon parks.
 *
 * Transfers are large (24 chunks of 1 MiB) and the daemon runs with the
 * fault hook KVT_FAULT_KV_DELAY_MS=20 (20 ms per chunk), so a transfer
 * takes about half a second and the kill lands mid-flight. nng does not
 * survive fork(), so engines run as fresh execs of this binary.
 */
#include <pthread.h>
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
#include "kvengine.h"
#include "kvtier.h"

static struct tdaemon D;

#define NS "kill/ns"
#define CT 64    /* chunk tokens: 4 blocks of 16, 1 MiB */
#define NK 24
#define DELAY_MS 20

static int setup(void **state)
{
    (void)state;
    char delay[16];
    snprintf(delay, sizeof delay, "%d", DELAY_MS);
    setenv("KVT_FAULT_KV_DELAY_MS", delay, 1); /* inherited by the daemon */
    const char *extra[] = {"--pool-bytes", "256M", "--contexts", "2", NULL};
    int rc = td_start(&D, extra);
    unsetenv("KVT_FAULT_KV_DELAY_MS");
    return rc;
}

static int teardown(void **state)
{
    (void)state;
    int rc = td_stop(&D);
    td_cleanup(&D);
    return rc;
}

static fx_shape big(void)
{
    return (fx_shape){.layers = 8, .blocks = 128, .block_size = 16, .heads = 8,
                      .head_size = 64, .elem_size = 2};
}

static void keys_of(uint64_t seed, kvt_key *k)
{
    for (size_t i = 0; i < NK; i++) k[i] = td_key(seed * 1000 + i);
}

static long long limit_ms(void)
{
    return getenv("KVT_SAN") ? 10000 : 3000;
}

/* ---------------------------------------------------------- the engine */

/* Register, start one transfer, say so, then hang (or wait, parked). */
static int child(const char *mode, const char *sock, int wfd, uint64_t seed)
{
    if (strstr(mode, "nng")) setenv("KVTIER_NO_FAST", "1", 1);
    kvt_client *c;
    struct kve e;
    fx_shape s = big();
    kvt_kv_reg reg;
    kvt_key k[NK];
    int32_t ids[NK * 4];
    kvt_xfer x;
    kvt_xfer_status st;
    if (kvt_connect(sock, &c) != KVT_OK || kve_open(&e, KVT_LAYOUT_VLLM_FLASH_NHD, &s, seed))
        return 1;
    if (kve_register(c, &e, NS, CT, &reg, NULL) != KVT_OK) return 2;
    keys_of(seed, k);
    for (int i = 0; i < NK * 4; i++) ids[i] = i;
    kve_close(&e); /* unlinked and unmapped here; the daemon's mapping stays */
    kvt_err r = strncmp(mode, "load", 4) == 0
        ? kvt_kv_load(c, NS, reg, k, NK, ids, NK * 4, &x)
        : kvt_kv_save(c, NS, reg, k, NK, ids, NK * 4, NULL, &x);
    if (r != KVT_OK) return 3;
    if (write(wfd, "r", 1) != 1) return 4;
    if (strncmp(mode, "wait", 4) == 0) kvt_kv_wait(c, &x, 1, -1, &st);
    for (;;) pause();
}

static pid_t spawn(const char *mode, uint64_t seed, int *rfd)
{
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    pid_t pid = fork();
    if (pid == 0) {
        char fd[16], sd[24];
        snprintf(fd, sizeof fd, "%d", fds[1]);
        snprintf(sd, sizeof sd, "%llu", (unsigned long long)seed);
        execl("/proc/self/exe", "test_kvcache_kill", "--child", mode, D.sock, fd,
              sd, (char *)NULL);
        _exit(127);
    }
    close(fds[1]);
    *rfd = fds[0];
    return pid;
}

/* Start an engine and wait until its transfer was accepted. */
static pid_t engine(const char *mode, uint64_t seed)
{
    int rfd;
    char r;
    pid_t pid = spawn(mode, seed, &rfd);
    if (read(rfd, &r, 1) != 1) {
        int st;
        waitpid(pid, &st, 0);
        fail_msg("engine (%s) failed before its transfer: status %d", mode, st);
    }
    close(rfd);
    return pid;
}

static void kill_engine(pid_t pid)
{
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
}

/* ------------------------------------------------------------- checks */

static kvt_kv_stats kvs(kvt_client *c)
{
    kvt_kv_stats s;
    assert_int_equal(kvt_kv_stats_get(c, &s), KVT_OK);
    return s;
}

static uint64_t used(kvt_client *c)
{
    kvt_stats s;
    assert_int_equal(kvt_stats_get(c, &s), KVT_OK);
    return s.used_bytes;
}

/* Registrations down to regs and no transfer left, within the limit. */
static void settles(kvt_client *c, uint64_t regs)
{
    long long t0 = td_now_ms();
    kvt_kv_stats s = kvs(c);
    while ((s.registrations != regs || s.transfers != 0) &&
           td_now_ms() - t0 < limit_ms()) {
        usleep(10000);
        s = kvs(c);
    }
    assert_int_equal(s.registrations, regs);
    assert_int_equal(s.transfers, 0);
}

/* CPU time (ms) the daemon used so far. */
static long long daemon_cpu_ms(void)
{
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)D.pid);
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    char *p = strrchr(buf, ')');
    unsigned long long ut = 0, st = 0;
    assert_int_equal(sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu",
                            &ut, &st), 2);
    return (long long)(ut + st) * 1000 / sysconf(_SC_CLK_TCK);
}

/* A small round trip through a fresh engine: the daemon still serves. */
static void still_serves(kvt_client *c, uint64_t seed)
{
    struct kve e;
    fx_shape s = {.layers = 2, .blocks = 16, .block_size = 16, .heads = 2,
                  .head_size = 64, .elem_size = 2};
    kvt_kv_reg reg;
    kvt_key k = td_key(seed);
    int32_t id = 3;
    kvt_xfer x;
    kvt_xfer_status st;
    assert_int_equal(kve_open(&e, KVT_LAYOUT_VLLM_FLASH_NHD, &s, seed), 0);
    assert_int_equal(kve_register(c, &e, "kill/alive", 16, &reg, NULL), KVT_OK);
    assert_int_equal(kvt_kv_save(c, "kill/alive", reg, &k, 1, &id, 1, NULL, &x), KVT_OK);
    assert_int_equal(kve_wait1(c, x, &st), KVT_OK);
    assert_int_equal(st.err, KVT_OK);
    assert_int_equal(kvt_kv_unregister(c, reg), KVT_OK);
    kve_close(&e);
}

/* -------------------------------------------------------------- tests */

static void test_killed_mid_save(void **state)
{
    (void)state;
    kvt_client *c = td_connect(&D);
    uint64_t u0 = used(c);
    pid_t pid = engine("save", 1);
    usleep(3 * DELAY_MS * 1000); /* a few chunks in */
    assert_int_equal(kvs(c).transfers, 1);
    assert_true(used(c) >= u0 + NK * (1u << 20)); /* reserved */
    kill_engine(pid);
    settles(c, 0);
    assert_int_equal(used(c), u0); /* the reservation is gone */
    kvt_key k[NK];
    size_t present;
    keys_of(1, k);
    assert_int_equal(kvt_lookup(c, NS, k, NK, &present, NULL), KVT_OK);
    assert_int_equal(present, 0); /* never committed */
    still_serves(c, 11);
    kvt_close(c);
}

static void test_killed_mid_load(void **state)
{
    (void)state;
    kvt_client *c = td_connect(&D);
    struct kve e;
    fx_shape s = big();
    kvt_kv_reg reg;
    kvt_key k[NK];
    int32_t ids[NK * 4];
    kvt_xfer x;
    kvt_xfer_status st;
    assert_int_equal(kve_open(&e, KVT_LAYOUT_VLLM_FLASH_NHD, &s, 2), 0);
    assert_int_equal(kve_register(c, &e, NS, CT, &reg, NULL), KVT_OK);
    keys_of(2, k);
    for (int i = 0; i < NK * 4; i++) ids[i] = i;
    assert_int_equal(kvt_kv_save(c, NS, reg, k, NK, ids, NK * 4, NULL, &x), KVT_OK);
    assert_int_equal(kve_wait1(c, x, &st), KVT_OK);
    assert_int_equal(st.err, KVT_OK);
    uint64_t u0 = used(c);
    pid_t pid = engine("load", 2);
    usleep(3 * DELAY_MS * 1000);
    assert_int_equal(kvs(c).transfers, 1);
    kill_engine(pid);
    settles(c, 1); /* ours is left */
    /* Unpinned: deleting frees every chunk at once. */
    size_t del;
    assert_int_equal(kvt_delete(c, NS, k, NK, &del), KVT_OK);
    assert_int_equal(del, NK);
    assert_int_equal(used(c), u0 - NK * (1u << 20));
    assert_int_equal(kvt_kv_unregister(c, reg), KVT_OK);
    kve_close(&e);
    still_serves(c, 12);
    kvt_close(c);
}

/* Killed while its kvt_kv_wait is parked: the daemon notices, and does not
 * spin on the dead connection. */
static void killed_waiting(const char *mode, uint64_t seed)
{
    kvt_client *c = td_connect(&D);
    pid_t pid = engine(mode, seed);
    usleep(100000);
    kill_engine(pid);
    settles(c, 0);
    long long cpu0 = daemon_cpu_ms(), t0 = td_now_ms();
    usleep(400000);
    long long cpu = daemon_cpu_ms() - cpu0, wall = td_now_ms() - t0;
    assert_true(cpu * 2 < wall);
    still_serves(c, seed + 10);
    kvt_close(c);
}

static void test_killed_waiting_fast(void **state)
{
    (void)state;
    killed_waiting("wait", 3);
}

static void test_killed_waiting_nng(void **state)
{
    (void)state;
    killed_waiting("wait-nng", 4);
}

/* Save NK chunks from a fresh engine; the transfer id. */
static kvt_xfer slow_save(kvt_client *c, struct kve *e, kvt_kv_reg *reg,
                          uint64_t seed)
{
    fx_shape s = big();
    kvt_key k[NK];
    int32_t ids[NK * 4];
    kvt_xfer x;
    assert_int_equal(kve_open(e, KVT_LAYOUT_VLLM_FLASH_NHD, &s, seed), 0);
    assert_int_equal(kve_register(c, e, NS, CT, reg, NULL), KVT_OK);
    keys_of(seed, k);
    for (int i = 0; i < NK * 4; i++) ids[i] = i;
    assert_int_equal(kvt_kv_save(c, NS, *reg, k, NK, ids, NK * 4, NULL, &x), KVT_OK);
    return x;
}

/* Waits: a timeout says not done; a long wait ends with the transfer. */
static void waits(uint64_t seed)
{
    kvt_client *c = td_connect(&D);
    struct kve e;
    kvt_kv_reg reg;
    kvt_xfer_status st;
    kvt_xfer x = slow_save(c, &e, &reg, seed);
    long long t0 = td_now_ms();
    assert_int_equal(kvt_kv_wait(c, &x, 1, 50, &st), KVT_ETIMEDOUT);
    long long dt = td_now_ms() - t0;
    assert_true(dt >= 50 && dt < 400);
    assert_false(st.done);
    assert_int_equal(kvt_kv_poll(c, &x, 1, &st), KVT_OK);
    assert_false(st.done);
    assert_int_equal(kvt_kv_wait(c, &x, 1, 20000, &st), KVT_OK);
    assert_true(st.done);
    assert_int_equal(st.err, KVT_OK);
    assert_int_equal(st.n_chunks, NK);
    assert_true(td_now_ms() - t0 < 5000);
    assert_int_equal(kvt_kv_unregister(c, reg), KVT_OK);
    kve_close(&e);
    kvt_close(c);
}

static void test_wait_fast(void **state)
{
    (void)state;
    waits(5);
}

static void test_wait_nng(void **state)
{
    (void)state;
    setenv("KVTIER_NO_FAST", "1", 1);
    waits(6);
    unsetenv("KVTIER_NO_FAST");
}

/* Three nng clients wait at once; with 2 contexts the daemon parks one
 * and answers the others at once, and their library polls: all finish. */
static void *waiter(void *arg)
{
    uint64_t seed = (uint64_t)(uintptr_t)arg;
    kvt_client *c = td_connect(&D);
    struct kve e;
    kvt_kv_reg reg;
    kvt_xfer_status st;
    kvt_xfer x = slow_save(c, &e, &reg, seed);
    kvt_err r = kvt_kv_wait(c, &x, 1, 20000, &st);
    kve_close(&e);
    kvt_close(c);
    return (void *)(uintptr_t)(r == KVT_OK && st.err == KVT_OK);
}

static void test_more_waiters_than_parked(void **state)
{
    (void)state;
    pthread_t t[3];
    setenv("KVTIER_NO_FAST", "1", 1);
    for (uintptr_t i = 0; i < 3; i++)
        assert_int_equal(pthread_create(&t[i], NULL, waiter, (void *)(20 + i)), 0);
    for (int i = 0; i < 3; i++) {
        void *ok;
        pthread_join(t[i], &ok);
        assert_true((uintptr_t)ok);
    }
    unsetenv("KVTIER_NO_FAST");
    kvt_client *c = td_connect(&D);
    settles(c, 0);
    kvt_close(c);
}

int main(int argc, char **argv)
{
    if (argc == 6 && strcmp(argv[1], "--child") == 0)
        return child(argv[2], argv[3], atoi(argv[4]), strtoull(argv[5], NULL, 10));
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_killed_mid_save),
        cmocka_unit_test(test_killed_mid_load),
        cmocka_unit_test(test_killed_waiting_fast),
        cmocka_unit_test(test_killed_waiting_nng),
        cmocka_unit_test(test_wait_fast),
        cmocka_unit_test(test_wait_nng),
        cmocka_unit_test(test_more_waiters_than_parked),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
