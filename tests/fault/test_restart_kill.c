/*
 * test_restart_kill.c -- kill -9 of kvtierd in the middle of heavy mixed
 * traffic (puts, zero-copy and copying gets, lookups with prefetch,
 * flushes, demotion by the DRAM watermark, puts that never commit), then
 * a restart that adopts the DRAM pool and loads the NVMe index: every
 * chunk served afterwards must be byte-identical to what was put, and
 * nothing uncommitted may appear. Two rounds, so the second crash hits a
 * daemon that itself adopted and loaded.
 *
 * Reference model (as test_concurrency.c): the bytes of key i are
 * td_fill(size(i), i), whoever put them, so any process can check every
 * byte it sees. Keys from UNCOMMITTED up are only ever begun, filled with
 * 0xee and left uncommitted or aborted. Workers are this binary re-executed
 * (nng does not survive fork); each exits 0 unless it saw a wrong byte.
 */
#include <setjmp.h>
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
#include "nvtest.h"

#define WORKERS 3
#define KEYS 400
#define UNCOMMITTED 1000
#define CH (96u << 10)
#define WRONG 2

static const char *const args[] = {"--pool-bytes", "12M", "--high-watermark", "0.6",
                                   "--low-watermark", "0.4", NULL};

/* ------------------------------------------------------------- worker */

static uint64_t rnd(uint64_t *x)
{
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    return *x;
}

static int same(const kvt_chunk *ch, uint64_t i, uint8_t *want)
{
    size_t n = nvt_size(i, CH);
    td_fill(want, n, i);
    return ch->size == n && memcmp(ch->data, want, n) == 0;
}

/* A zero-copy get of up to 4 keys from k; 0, or WRONG. */
static int op_get(kvt_client *c, uint64_t k, size_t n, uint8_t *want)
{
    kvt_key keys[4];
    kvt_chunk ch[4];
    kvt_lease l;
    size_t got;
    for (size_t i = 0; i < n; i++) keys[i] = td_key(k + i);
    if (kvt_get(c, NVT_NS, keys, n, &l, ch, &got) != KVT_OK) return 0;
    for (size_t i = 0; i < got; i++)
        if (!same(&ch[i], k + i, want)) return WRONG;
    if (got) kvt_release(c, l);
    return 0;
}

static void op_uncommitted(kvt_client *c, uint64_t k, int abort_it)
{
    kvt_key key = td_key(UNCOMMITTED + k);
    size_t size = CH;
    kvt_chunk ch;
    kvt_lease l;
    if (kvt_put_begin(c, NVT_NS, &key, &size, 1, NULL, &l, &ch) != KVT_OK) return;
    if (!ch.exists) memset(ch.data, 0xee, size);
    if (abort_it) kvt_put_abort(c, l);
}

static int one_op(kvt_client *c, uint64_t *x, uint8_t *buf)
{
    uint64_t r = rnd(x) % 100, k = rnd(x) % KEYS;
    if (r < 40) {
        nvt_put_chain(c, k, 1 + rnd(x) % 3, CH);
        return 0;
    }
    if (r < 70) return op_get(c, k, 1 + rnd(x) % 4, buf);
    if (r < 80) {
        kvt_key key = td_key(k);
        size_t got;
        if (kvt_get_copy(c, NVT_NS, &key, buf + CH, CH, &got) != KVT_OK) return 0;
        kvt_chunk ch = {buf + CH, got, 0, 0};
        return same(&ch, k, buf) ? 0 : WRONG;
    }
    if (r < 90) nvt_lookup(c, k, 4, (int)(r & 1), NULL);
    else if (r < 92) nvt_flush(c, rnd(x) % 8 == 0, NULL);
    else op_uncommitted(c, k % 10, (int)(r & 1)); /* at most 10 held */
    return 0;
}

static int worker(const char *sock, uint64_t seed)
{
    kvt_client *c;
    if (kvt_connect(sock, &c) != KVT_OK) return 0;
    kvt_set_timeout(c, 3000);
    uint8_t *buf = malloc(2 * CH);
    uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
    long long end = td_now_ms() + 20000;
    int rv = 0;
    while (rv == 0 && td_now_ms() < end) {
        rv = one_op(c, &x, buf);
        kvt_stats s;
        if (rv == 0 && kvt_stats_get(c, &s) == KVT_ECLOSED) break; /* killed */
    }
    if (rv) fprintf(stderr, "worker %llu: WRONG BYTES\n", (unsigned long long)seed);
    free(buf);
    kvt_close(c);
    return rv;
}

/* ------------------------------------------------------------- parent */

static pid_t spawn_worker(const char *sock, int i)
{
    char seed[16];
    snprintf(seed, sizeof seed, "%d", i + 1);
    pid_t pid = fork();
    if (pid == 0) {
        execl("/proc/self/exe", "test_restart_kill", "--worker", sock, seed, (char *)NULL);
        _exit(127);
    }
    return pid;
}

/* Everything present is right; nothing uncommitted is there. */
static void check_all(struct tdaemon *d)
{
    kvt_client *c = td_connect(d);
    kvt_set_timeout(c, 20000);
    int present = 0;
    for (uint64_t i = 0; i < KEYS; i++) present += nvt_check(c, i, CH);
    kvt_tier t[100];
    assert_int_equal(nvt_lookup(c, UNCOMMITTED, 100, 0, t), 0);
    for (int i = 0; i < 100; i++) assert_int_equal(t[i], KVT_TIER_NONE);
    Kvtier__VerifyResp vr;
    assert_int_equal(nvt_verify(c, 0, &vr), KVT_OK);
    assert_int_equal(vr.bad, 0);
    fprintf(stderr, "after restart: %d of %d keys present (adopted %llu, "
            "loaded %llu, verified %llu on NVMe)\n", present, KEYS,
            (unsigned long long)nvt_stat(c, "adopted_chunks"),
            (unsigned long long)nvt_stat(c, "loaded_chunks"),
            (unsigned long long)vr.checked);
    assert_true(present > 0);
    kvt_close(c);
}

static void round_of_traffic(struct tdaemon *d)
{
    pid_t w[WORKERS];
    kvt_client *c = td_connect(d);
    for (int i = 0; i < WORKERS; i++) w[i] = spawn_worker(d->sock, i);
    uint64_t base = nvt_stat(c, "demotions");
    usleep(1000 * 1000); /* a second of traffic at least, then a crash as */
    nvt_wait_stat(c, "demotions", base + 150, 8000); /* demotion runs */
    kvt_close(c);
    td_kill(d);
    for (int i = 0; i < WORKERS; i++) {
        int st;
        assert_int_equal(waitpid(w[i], &st, 0), w[i]);
        assert_true(WIFEXITED(st));
        assert_int_equal(WEXITSTATUS(st), 0);
    }
}

static void test_kill_during_traffic(void **state)
{
    (void)state;
    struct tdaemon D;
    assert_int_equal(td_init(&D), 0);
    for (int round = 0; round < 2; round++) {
        assert_int_equal(nvt_start(&D, 128, 32, args), 0);
        round_of_traffic(&D);
        assert_int_equal(nvt_start(&D, 128, 32, args), 0);
        check_all(&D);
        assert_int_equal(td_stop(&D), 0);
    }
    td_cleanup(&D);
}

int main(int argc, char **argv)
{
    if (argc == 4 && strcmp(argv[1], "--worker") == 0)
        return worker(argv[2], strtoull(argv[3], NULL, 10));
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kill_during_traffic),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
