/*
 * test_ops.c -- kvtierd as an operator meets it: the /metrics endpoint
 * (strict exposition-format parse and exact values after known traffic),
 * quiet logs on the hot path, systemd notifications (READY only once
 * requests are served, STOPPING on SIGTERM, WATCHDOG), and the SIGTERM
 * drain (new work refused, leases finished or cancelled, exit 0).
 */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#include <xxhash.h>

#include "daemon.h"
#include "kvtier.h"
#include "ops.h"

#define NS_ODD "q\"uo\\te/ns" /* a namespace whose label needs escaping */
#define CHUNK 3000

/* The test's daemon; the teardown stops it even after a failed assert. */
static struct tdaemon D;

static int teardown(void **state)
{
    (void)state;
    td_cleanup(&D);
    memset(&D, 0, sizeof D);
    unsetenv("NOTIFY_SOCKET");
    unsetenv("WATCHDOG_USEC");
    return 0;
}

static int start(struct tdaemon *d, const char *drain_ms)
{
    const char *extra[] = {"--metrics.listen", "127.0.0.1:0", "--drain-timeout-ms",
                           drain_ms ? drain_ms : "5000", NULL};
    return td_start(d, extra);
}

static void put_n(kvt_client *c, const char *ns, uint64_t seed, size_t n)
{
    kvt_key keys[8];
    static char bufs[8][CHUNK];
    const void *b[8];
    size_t sizes[8];
    for (size_t i = 0; i < n; i++) {
        keys[i] = td_key(seed + i);
        td_fill(bufs[i], CHUNK, seed + i);
        b[i] = bufs[i];
        sizes[i] = CHUNK;
    }
    assert_int_equal(kvt_put(c, ns, keys, b, sizes, n, NULL, NULL), KVT_OK);
}

static void scrape(const struct tdaemon *d, struct prom *p)
{
    char base[128], *body = NULL;
    int status = 0;
    assert_int_equal(ops_metrics_base(d, base, sizeof base, 5000), 0);
    assert_int_equal(ops_http_get(base, "/metrics", &status, &body), 0);
    assert_int_equal(status, 200);
    if (prom_parse(body, p) != 0) {
        fprintf(stderr, "exposition: %s\n", p->err);
        fail();
    }
    free(body);
}

/* Lookups, gets, puts and one error, then every number checked. */
static void traffic(kvt_client *c)
{
    kvt_key keys[5];
    size_t n;
    char buf[CHUNK];
    put_n(c, NS_ODD, 100, 3);
    for (int i = 0; i < 5; i++) keys[i] = td_key(100 + (uint64_t)i);
    assert_int_equal(kvt_lookup(c, NS_ODD, keys, 5, &n, NULL), KVT_OK);
    assert_int_equal(n, 3);
    assert_int_equal(kvt_get_copy(c, NS_ODD, &keys[0], buf, sizeof buf, &n), KVT_OK);
    assert_int_equal(kvt_lookup(c, "never-stored", keys, 2, &n, NULL), KVT_OK);
    assert_int_equal(kvt_release(c, 0x123456789ull), KVT_ENOENT);
}

static void check_values(const struct prom *p)
{
    const char *l = "ns=\"q\\\"uo\\\\te/ns\",op=\"lookup\",tier=\"dram\"";
    assert_true(prom_get(p, "kvtier_puts_total", "") == 3);
    assert_true(prom_get(p, "kvtier_hit_chunks_total", l) == 3);
    assert_true(prom_get(p, "kvtier_hit_bytes_total", l) == 3 * CHUNK);
    assert_true(prom_get(p, "kvtier_miss_chunks_total",
                         "ns=\"q\\\"uo\\\\te/ns\",op=\"lookup\"") == 2);
    assert_true(prom_get(p, "kvtier_hit_chunks_total",
                         "ns=\"q\\\"uo\\\\te/ns\",op=\"get\",tier=\"dram\"") == 1);
    assert_true(prom_get(p, "kvtier_miss_chunks_total", "op=\"lookup\"") == 2);
    assert_true(prom_get(p, "kvtier_namespace_chunks", "ns=\"q\\\"uo\\\\te/ns\"") == 3);
    assert_true(prom_get(p, "kvtier_tier_chunks", "tier=\"dram\"") == 3);
    assert_true(prom_get(p, "kvtier_tier_bytes_in_total", "tier=\"dram\"") == 3 * CHUNK);
    assert_true(prom_get(p, "kvtier_errors_total", "err=\"ENOENT\"") == 1);
    assert_true(prom_get(p, "kvtier_errors_total", "err=\"EINVAL\"") == 0);
    assert_true(prom_get(p, "kvtier_request_duration_seconds_count", "kind=\"lookup\"") == 2);
    /* kvt_get_copy is a get and a release; one more release failed */
    assert_true(prom_get(p, "kvtier_request_duration_seconds_count", "kind=\"get\"") == 1);
    assert_true(prom_get(p, "kvtier_request_duration_seconds_count", "kind=\"release\"") == 2);
    assert_true(prom_get(p, "kvtier_tier_capacity_bytes", "tier=\"dram\"") == 64 << 20);
    assert_true(prom_get(p, "kvtier_peers", "state=\"alive\"") == 0);
    assert_true(prom_get(p, "kvtier_leases", "kind=\"read\"") == 0);
}

/* The escaped label comes back as the namespace's exact bytes. */
static void check_escaping(const struct prom *p)
{
    int found = 0;
    for (size_t i = 0; i < p->n; i++) {
        if (strcmp(p->s[i].name, "kvtier_namespace_bytes")) continue;
        const char *v = p->s[i].labels + strlen("ns=\"");
        char out[64];
        prom_unescape(v, strlen(v) - 1, out, sizeof out);
        assert_string_equal(out, NS_ODD);
        found++;
    }
    assert_int_equal(found, 1);
}

static void test_metrics_exposition(void **state)
{
    (void)state;
    struct prom p;
    assert_int_equal(start(&D, NULL), 0);
    kvt_client *c = td_connect(&D);
    int lines = ops_log_lines(&D);
    traffic(c);
    scrape(&D, &p);
    check_values(&p);
    check_escaping(&p);
    prom_free(&p);
    /* Hot path: no log line per request at the default level. */
    assert_int_equal(ops_log_lines(&D), lines);
    char base[128], *body = NULL;
    int status = 0;
    assert_int_equal(ops_metrics_base(&D, base, sizeof base, 1000), 0);
    assert_int_equal(ops_http_get(base, "/nothing-here", &status, &body), 0);
    assert_int_equal(status, 404);
    free(body);
    kvt_close(c);
    assert_int_equal(td_stop(&D), 0);
}

/* metrics.ns_names = 0: the ns label is a hash of the name, the same for
 * every per-namespace family; no sample carries the name. */
static void test_metrics_ns_hashed(void **state)
{
    (void)state;
    const char *extra[] = {"--metrics.listen", "127.0.0.1:0",
                           "--metrics.ns_names", "0", NULL};
    assert_int_equal(td_start(&D, extra), 0);
    kvt_client *c = td_connect(&D);
    traffic(c);
    struct prom p;
    scrape(&D, &p);
    char l[64], lk[96];
    snprintf(l, sizeof l, "ns=\"h-%016llx\"",
             (unsigned long long)XXH3_64bits(NS_ODD, strlen(NS_ODD)));
    assert_true(prom_get(&p, "kvtier_namespace_chunks", l) == 3);
    assert_true(prom_get(&p, "kvtier_namespace_bytes", l) == 3 * CHUNK);
    snprintf(lk, sizeof lk, "%s,op=\"lookup\",tier=\"dram\"", l);
    assert_true(prom_get(&p, "kvtier_hit_chunks_total", lk) == 3);
    for (size_t i = 0; i < p.n; i++) assert_null(strstr(p.s[i].labels, "uo"));
    prom_free(&p);
    kvt_close(c);
    assert_int_equal(td_stop(&D), 0);
}

static void test_notify(void **state)
{
    (void)state;
    char log[8192] = "";
    assert_int_equal(td_init(&D), 0);
    for (int abstract = 1; abstract >= 0; abstract--) {
        int fd = ops_notify_listen(D.dir, abstract);
        assert_true(fd >= 0);
        setenv("WATCHDOG_USEC", "400000", 1);
        const char *extra[] = {"--metrics.listen", "", NULL};
        D.pid = td_spawn(&D, extra);
        log[0] = '\0';
        assert_true(ops_notify_wait(fd, "READY=1", 20000, log, sizeof log));
        /* STATUS came first, and READY means requests are served now. */
        assert_non_null(strstr(log, "STATUS=opening DRAM pool"));
        assert_true(strstr(log, "STATUS=") < strstr(log, "READY=1"));
        kvt_client *c = td_connect(&D);
        kvt_close(c);
        assert_true(ops_notify_wait(fd, "WATCHDOG=1", 10000, log, sizeof log));
        kill(D.pid, SIGHUP); /* without --config: logged, READY unchanged */
        kill(D.pid, SIGTERM);
        assert_true(ops_notify_wait(fd, "STOPPING=1", 10000, log, sizeof log));
        assert_int_equal(td_wait_exit(D.pid, 15000), 0);
        D.pid = 0;
        close(fd);
    }
    assert_true(td_log_has(&D, "started without --config; nothing to reload"));
}

/* Store one chunk and hold a read lease on it from client a. */
static kvt_lease hold_lease(kvt_client *a)
{
    kvt_key k = td_key(7);
    kvt_chunk ch;
    kvt_lease lease = 0;
    size_t got = 0;
    put_n(a, "drain", 7, 1);
    assert_int_equal(kvt_get(a, "drain", &k, 1, &lease, &ch, &got), KVT_OK);
    assert_int_equal(got, 1);
    return lease;
}

/* Leases finish inside the bound: new work refused, release served. */
static void test_drain_finishes(void **state)
{
    (void)state;
    assert_int_equal(start(&D, "20000"), 0);
    kvt_client *a = td_connect(&D), *b = td_connect(&D), *late = NULL;
    kvt_lease lease = hold_lease(a);
    kill(D.pid, SIGTERM);
    assert_true(ops_wait_log(&D, "draining", 10000));
    kvt_key k = td_key(7);
    size_t n;
    assert_int_equal(kvt_lookup(b, "drain", &k, 1, &n, NULL), KVT_ECLOSED);
    assert_non_null(strstr(kvt_last_error(b), "shutting down"));
    assert_int_not_equal(kvt_connect(D.sock, &late), KVT_OK);
    kvt_stats st;
    assert_int_equal(kvt_stats_get(b, &st), KVT_OK); /* monitoring still served */
    assert_int_equal(st.leases, 1);
    assert_int_equal(kvt_release(a, lease), KVT_OK);
    assert_int_equal(td_wait_exit(D.pid, 15000), 0); /* b still connected */
    D.pid = 0;
    assert_false(td_log_has(&D, "cancelling"));
    assert_true(td_log_has(&D, "main: stopped"));
    kvt_close(a);
    kvt_close(b);
}

/* A lease held past the bound is cancelled; still exit 0. */
static void test_drain_cancels(void **state)
{
    (void)state;
    assert_int_equal(start(&D, "300"), 0);
    kvt_client *a = td_connect(&D);
    hold_lease(a);
    kill(D.pid, SIGTERM);
    assert_int_equal(td_wait_exit(D.pid, 15000), 0);
    D.pid = 0;
    assert_true(td_log_has(&D, "drain deadline passed: cancelling 1 lease(s)"));
    kvt_close(a);
}

/* A second SIGTERM during a long drain stops at once. */
static void test_drain_second_signal(void **state)
{
    (void)state;
    assert_int_equal(start(&D, "600000"), 0);
    kvt_client *a = td_connect(&D);
    hold_lease(a);
    kill(D.pid, SIGTERM);
    assert_true(ops_wait_log(&D, "draining", 10000));
    kill(D.pid, SIGTERM);
    assert_int_equal(td_wait_exit(D.pid, 15000), 0);
    D.pid = 0;
    assert_true(td_log_has(&D, "while draining: stopping now"));
    kvt_close(a);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_metrics_exposition, teardown),
        cmocka_unit_test_teardown(test_metrics_ns_hashed, teardown),
        cmocka_unit_test_teardown(test_notify, teardown),
        cmocka_unit_test_teardown(test_drain_finishes, teardown),
        cmocka_unit_test_teardown(test_drain_cancels, teardown),
        cmocka_unit_test_teardown(test_drain_second_signal, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
