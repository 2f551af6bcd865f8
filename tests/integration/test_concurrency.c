/*
 * test_concurrency.c -- 8 client processes doing random put/get/lookup/
 * delete against one real kvtierd whose pool is too small for everything,
 * so eviction runs all along.
 *
 * The reference model is a function: the bytes of key i are td_fill(size(i),
 * i), whoever put them. Any process can therefore check every byte it gets
 * back, and a chunk deleted by one process and put again by another is
 * still the same chunk. Each child exits 0 only if every byte it saw was
 * right; the parent also checks the daemon's books balance at the end.
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

#define PROCS 8
#define KEYS 160
#define OPS 1500

static size_t size_of(uint64_t i)
{
    return 4096 + (size_t)((i * 2654435761u) % (384u << 10));
}

static int check(const kvt_chunk *ch, uint64_t i, uint8_t *want)
{
    size_t n = size_of(i);
    td_fill(want, n, i);
    return ch->size == n && memcmp(ch->data, want, n) == 0 &&
           ch->checksum == kvt_checksum(want, n);
}

static int op_put(kvt_client *c, uint64_t i, uint8_t *buf)
{
    kvt_key k[2] = {td_key(i), td_key(i + 1)};
    size_t sz[2] = {size_of(i), size_of(i + 1)};
    kvt_chunk ch[2];
    kvt_lease l;
    kvt_err e = kvt_put_begin(c, "cc", k, sz, 2, NULL, &l, ch);
    if (e == KVT_ENOSPC) return 0; /* everything pinned right now */
    if (e) return -1;
    uint64_t cs[2] = {0, 0};
    for (int j = 0; j < 2; j++) {
        if (ch[j].exists) continue;
        td_fill(buf, sz[j], i + (uint64_t)j);
        cs[j] = kvt_copy_checksum(ch[j].data, buf, sz[j]);
    }
    return kvt_put_commit(c, l, ch, 2, cs) ? -1 : 0;
}

static int op_get(kvt_client *c, uint64_t i, uint8_t *want)
{
    kvt_key k[3] = {td_key(i), td_key(i + 1), td_key(i + 2)};
    kvt_chunk ch[3];
    kvt_lease l;
    size_t got;
    if (kvt_get(c, "cc", k, 3, &l, ch, &got)) return -1;
    int bad = 0;
    for (size_t j = 0; j < got; j++) bad |= !check(&ch[j], i + j, want);
    if (got && kvt_release(c, l)) return -1;
    return bad ? -1 : 0;
}

static int op_lookup_delete(kvt_client *c, uint64_t i, int del)
{
    kvt_key k[4];
    size_t n;
    for (int j = 0; j < 4; j++) k[j] = td_key(i + (uint64_t)j);
    if (del) return kvt_delete(c, "cc", k, 1, &n) ? -1 : 0;
    return kvt_lookup(c, "cc", k, 4, &n, NULL) || n > 4 ? -1 : 0;
}

static int child(const char *sock, unsigned seed)
{
    kvt_client *c;
    if (kvt_connect(sock, &c)) return 10;
    uint8_t *buf = malloc(512u << 10);
    for (int op = 0; op < OPS; op++) {
        uint64_t i = (uint64_t)(rand_r(&seed) % KEYS);
        int r = rand_r(&seed) % 10, rc;
        if (r < 4) rc = op_put(c, i, buf);
        else if (r < 8) rc = op_get(c, i, buf);
        else rc = op_lookup_delete(c, i, r == 9);
        if (rc) {
            fprintf(stderr, "child %u: op %d (kind %d, key %llu) failed: %s\n", seed,
                    op, r, (unsigned long long)i, kvt_last_error(c));
            return 1;
        }
    }
    free(buf);
    kvt_close(c);
    return 0;
}

static void test_many_clients(void **state)
{
    (void)state;
    struct tdaemon d;
    const char *extra[] = {"--pool-bytes", "24M", NULL};
    assert_int_equal(td_init(&d), 0);
    assert_int_equal(td_start(&d, extra), 0);
    pid_t pids[PROCS];
    for (int p = 0; p < PROCS; p++) {
        pids[p] = fork();
        if (pids[p] == 0) { /* nng does not survive fork(): exec afresh */
            char seed[16];
            snprintf(seed, sizeof seed, "%d", p + 1);
            execl("/proc/self/exe", "test_concurrency", "--child", d.sock, seed,
                  (char *)NULL);
            _exit(127);
        }
    }
    int failed = 0;
    for (int p = 0; p < PROCS; p++) {
        int st;
        waitpid(pids[p], &st, 0);
        failed += !(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    }
    assert_int_equal(failed, 0);
    kvt_client *c = td_connect(&d);
    kvt_stats s;
    assert_int_equal(kvt_stats_get(c, &s), KVT_OK);
    assert_int_equal(s.leases, 0);
    assert_true(s.evictions > 0); /* the pool really was too small */
    assert_true(s.puts > 0 && s.hits > 0);
    kvt_close(c);
    assert_int_equal(td_stop(&d), 0);
    td_cleanup(&d);
}

int main(int argc, char **argv)
{
    if (argc == 4 && strcmp(argv[1], "--child") == 0)
        return child(argv[2], (unsigned)atoi(argv[3]));
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_many_clients),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
