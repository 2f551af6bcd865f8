/*
 * test_etcd.c -- the etcd membership backend (tiers/peer/etcd.c) against a
 * real etcd started here on loopback in a temporary directory: members
 * join and see each other at one agreed epoch (etcd's revision); one
 * leaves (its lease revoked, seen as LEFT) and one is killed (its lease
 * runs out, seen as DEAD); etcd killed with SIGKILL is reported as down
 * with a reason, and once restarted the survivor registers again and sees
 * a newcomer; a member whose lease is revoked behind its back is seen
 * DEAD, grants a new lease and is seen ALIVE again. Keys under the prefix that are not members, and values that
 * do not parse, are refused and counted. The JSON and base64 readers are
 * fed truncated and hostile replies. Waits have generous deadlines;
 * nothing is timed. The members are ticked only when the backend asks --
 * its next_tick() is due, or its worker woke us through env.wake -- so a
 * piece of news that forgets to wake the owner stalls the test; one
 * member (id 4) is given no wake hook and is polled as next_tick() says.
 */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <curl/curl.h>

#include "config.h"
#include "daemon.h"
#include "etcdtest.h"
#include "log.h"
#include "peer/etcd.h"
#include "peer/etcd_client.h"

#define NM 4
#define PREFIX "/kvt-test/members/"

static struct tetcd E;
static struct mb *M[NM];
static enum mb_event Last[NM][NM + 2]; /* per observer, per member id */
static int Seen[NM][NM + 2];

static uint64_t env_now(void *ctx)
{
    (void)ctx;
    return (uint64_t)td_now_ms();
}

static uint64_t env_rand(void *ctx)
{
    (void)ctx;
    return (uint64_t)random();
}

static int Wake = -1;       /* eventfd: some member's worker has news */
static unsigned long Wakes; /* env.wake calls, all members */

static void env_wake(void *ctx)
{
    uint64_t one = 1;
    (void)ctx;
    __atomic_add_fetch(&Wakes, 1, __ATOMIC_RELAXED);
    ssize_t w = write(Wake, &one, sizeof one);
    (void)w;
}

static int env_send(void *ctx, const char *addr, const void *buf, size_t len)
{
    (void)ctx, (void)addr, (void)buf, (void)len;
    return -1; /* the etcd backend sends nothing between members */
}

static void on_change(void *arg, struct mb *mb, struct mb_member *m, enum mb_event ev,
                      enum mb_state old)
{
    int self = (int)(intptr_t)arg;
    (void)mb, (void)old;
    if (m->id < NM + 2 && ev != MB_EV_GONE) {
        Last[self][m->id] = ev;
        Seen[self][m->id] = 1;
    }
}

static struct mb *member(int i)
{
    char addr[64];
    snprintf(addr, sizeof addr, "tcp://127.0.0.1:%d", 41000 + i);
    struct mb_config c = {0};
    c.self_id = (uint32_t)i + 1;
    c.self_addr = addr;
    c.meta = "ucx-identity";
    c.meta_len = 12;
    c.service_url = E.url;
    c.service_prefix = PREFIX;
    c.lease_ms = 2000;
    c.reap_ms = 600000;
    c.on_change = on_change;
    c.on_change_arg = (void *)(intptr_t)i;
    c.env = (struct mb_env){NULL, env_send, env_now, env_rand, i == 3 ? NULL : env_wake};
    const char *why = NULL;
    struct mb *mb = mb_create(&etcd_ops, &c, &why);
    assert_non_null(mb);
    assert_int_equal(mb_join(mb, NULL, 0), 0);
    return mb;
}

/* Tick the members whose next_tick() is due, then sleep until the
 * earliest one or a wake; until cond() holds (1) or 20 s pass (0). */
static int pump(int (*cond)(void))
{
    for (long long end = td_now_ms() + 20000, now; (now = td_now_ms()) < end;) {
        long long due = end;
        for (int i = 0; i < NM; i++) {
            if (!M[i]) continue;
            if ((long long)mb_next_tick(M[i]) <= now) mb_tick(M[i], (uint64_t)now);
            long long t = (long long)mb_next_tick(M[i]);
            if (t < due) due = t;
        }
        if (cond()) return 1;
        struct pollfd p = {.fd = Wake, .events = POLLIN};
        uint64_t v;
        if (poll(&p, 1, (int)(due > now ? due - now : 0)) == 1) {
            ssize_t r = read(Wake, &v, sizeof v);
            (void)r;
        }
    }
    return 0;
}

/* Idle and woken: with nothing queued and nothing to reap, a member with
 * a wake hook asks for no tick for a long while, one without is polled. */
static void test_idle_asks_no_tick(void **state)
{
    (void)state;
    for (int i = 0; i < NM; i++) {
        if (!M[i]) continue;
        uint64_t now = (uint64_t)td_now_ms();
        if (mb_next_tick(M[i]) <= now) mb_tick(M[i], now); /* drain */
        uint64_t next = mb_next_tick(M[i]);
        if (i == 3) assert_true(next <= (uint64_t)td_now_ms() + 1000);
        else assert_true(next >= now + 60000);
    }
    assert_true(Wakes > 0);
}

static enum mb_state state_at(int obs, uint32_t id)
{
    struct mb_member *m = mb_find(M[obs], id);
    return m ? m->state : MB_NSTATES;
}

static int three_see_each_other(void)
{
    for (int i = 0; i < 3; i++)
        if (mb_live(M[i]) != 2) return 0;
    return mb_epoch(M[0]) == mb_epoch(M[1]) && mb_epoch(M[1]) == mb_epoch(M[2]);
}

/* By the events seen, not the state now: a slow run may already have
 * reaped the member (its GONE is not recorded in Last). */
static int one_left(void)
{
    return Last[1][1] == MB_EV_LEFT && Last[2][1] == MB_EV_LEFT;
}

static int two_dead(void)
{
    return Last[2][2] == MB_EV_DEAD;
}

static int third_down(void)
{
    return !etcd_up(M[2], NULL, 0);
}

static int back_and_newcomer(void)
{
    return etcd_up(M[2], NULL, 0) && state_at(2, 4) == MB_ALIVE && state_at(3, 3) == MB_ALIVE;
}

static int setup(void **state)
{
    (void)state;
    log_set_level(LOG_ERROR);
    if ((Wake = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) < 0) return -1;
    if (te_init(&E, "etcd") != 0) return -1;
    return te_start(&E, PREFIX);
}

static int teardown(void **state)
{
    (void)state;
    for (int i = 0; i < NM; i++) mb_destroy(M[i]);
    return te_cleanup(&E);
}

static void test_join_leave_kill(void **state)
{
    (void)state;
    for (int i = 0; i < 3; i++) M[i] = member(i);
    assert_true(pump(three_see_each_other));
    assert_true(mb_epoch(M[0]) > 0);
    struct mb_member *m2 = mb_find(M[0], 2);
    assert_string_equal(m2->addr, "tcp://127.0.0.1:41001");
    assert_int_equal(m2->meta_len, 12);
    assert_memory_equal(m2->meta, "ucx-identity", 12);
    assert_int_equal(Last[0][2], MB_EV_JOIN);

    assert_int_equal(mb_leave(M[0]), 0);           /* revoke: LEFT */
    assert_true(pump(one_left));
    assert_int_equal(Last[2][1], MB_EV_LEFT);
    mb_destroy(M[0]);
    M[0] = NULL;

    mb_destroy(M[1]);                              /* killed: the lease runs out */
    M[1] = NULL;
    assert_true(pump(two_dead));
    assert_int_equal(Last[2][2], MB_EV_DEAD);
}

static void test_etcd_killed_and_restarted(void **state)
{
    (void)state;
    char err[256];
    assert_non_null(M[2]);
    assert_true(etcd_up(M[2], NULL, 0));
    te_kill(&E);
    assert_true(pump(third_down));
    assert_int_equal(etcd_up(M[2], err, sizeof err), 0);
    assert_true(strlen(err) > 0);                  /* says why */
    assert_true(mb_stats(M[2])->tx_fail > 0);
    assert_int_equal(te_start(&E, PREFIX), 0);
    M[3] = member(3);
    assert_true(pump(back_and_newcomer));          /* re-registered, watching again */
}

static int both_alive_again(void)
{
    return etcd_up(M[2], NULL, 0) && etcd_up(M[3], NULL, 0) && state_at(2, 4) == MB_ALIVE &&
           state_at(3, 3) == MB_ALIVE;
}

static size_t grab(char *p, size_t sz, size_t n, void *arg)
{
    char *buf = arg;
    size_t have = strlen(buf), len = sz * n;
    if (have + len >= 4096) return 0;
    memcpy(buf + have, p, len);
    buf[have + len] = 0;
    return len;
}

/* The lease member id's key is under, read straight from etcd. */
static int64_t lease_of(uint32_t id)
{
    char key[64], kb[128], body[256], url[200], reply[4096] = "";
    snprintf(key, sizeof key, PREFIX "%u", (unsigned)id);
    ec_b64_encode(key, strlen(key), kb);
    snprintf(body, sizeof body, "{\"key\":\"%s\"}", kb);
    snprintf(url, sizeof url, "%s/v3/kv/range", E.url);
    CURL *h = curl_easy_init();
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_POSTFIELDS, body);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, grab);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, reply);
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, 2000L);
    CURLcode rc = curl_easy_perform(h);
    curl_easy_cleanup(h);
    const char *l = strstr(reply, "\"lease\":\"");
    return rc == CURLE_OK && l ? strtoll(l + 9, NULL, 10) : 0;
}

/* A member's lease is revoked behind its back (an operator, or etcd
 * expiring it): the others see it DEAD; it finds its lease gone, grants a
 * new one, registers again and is seen ALIVE. */
static void test_lease_lost_and_registered_again(void **state)
{
    (void)state;
    char err[256];
    int64_t old = lease_of(4);
    assert_true(old > 0);
    uint64_t dead0 = mb_stats(M[2])->events[MB_EV_DEAD];
    struct ec *ec = ec_new(E.url, 2000, err, sizeof err);
    assert_int_equal(ec_revoke(ec, old, err, sizeof err), 0);
    ec_free(ec);
    assert_true(pump(both_alive_again));
    for (int t = 0; t < 400 && mb_stats(M[2])->events[MB_EV_DEAD] == dead0; t++) {
        mb_tick(M[2], (uint64_t)td_now_ms());
        mb_tick(M[3], (uint64_t)td_now_ms());
        usleep(20 * 1000);
    }
    assert_true(mb_stats(M[2])->events[MB_EV_DEAD] > dead0); /* 4's key went */
    assert_true(pump(both_alive_again));                    /* and came back */
    /* Back as ALIVE, or as a JOIN when the dead member was reaped first
     * (a slow run: the reap comes before the new key). */
    assert_true(Last[2][4] == MB_EV_ALIVE || Last[2][4] == MB_EV_JOIN);
    int64_t now = lease_of(4);
    assert_true(now > 0 && now != old);                     /* under a new lease */
}

static int bad_counted(void)
{
    return mb_stats(M[2])->rx_bad >= 3;
}

/* Keys under the prefix that name no member, or whose value does not
 * parse, are refused and counted; the table does not change. */
static void test_hostile_keys_refused(void **state)
{
    (void)state;
    char err[256];
    int64_t rev;
    struct ec *ec = ec_new(E.url, 2000, err, sizeof err);
    assert_non_null(ec);
    size_t before = mb_count(M[2]);
    uint64_t bad0 = mb_stats(M[2])->rx_bad;
    assert_int_equal(ec_put(ec, PREFIX "abc", "v1 1 0 tcp://x -", 16, 0, &rev, err, sizeof err), 0);
    assert_int_equal(ec_put(ec, PREFIX "7", "garbage", 7, 0, &rev, err, sizeof err), 0);
    assert_int_equal(ec_put(ec, PREFIX "8", "v1 1 0 tcp://x 0g", 17, 0, &rev, err, sizeof err), 0);
    ec_free(ec);
    assert_true(pump(bad_counted));
    assert_true(mb_stats(M[2])->rx_bad >= bad0 + 3);
    assert_int_equal(mb_count(M[2]), before);
    assert_null(mb_find(M[2], 7));
    assert_null(mb_find(M[2], 8));
}

static int n_kv;

static void count_kv(void *arg, const uint8_t *k, size_t kl, const uint8_t *v, size_t vl,
                     int del, int64_t rev)
{
    (void)arg, (void)k, (void)kl, (void)v, (void)vl, (void)del, (void)rev;
    n_kv++;
}

/* Replies cut short, with wrong types, bad base64 or oversized fields. */
static void test_parsers_refuse_bad_bytes(void **state)
{
    (void)state;
    int64_t rev;
    int comp;
    const char *good = "{\"header\":{\"revision\":\"9\"},\"kvs\":[{\"key\":\"YQ==\","
                       "\"mod_revision\":\"3\",\"value\":\"eA==\"}],\"count\":\"1\"}";
    n_kv = 0;
    assert_int_equal(ec_parse_range(good, strlen(good), count_kv, NULL, &rev), 0);
    assert_int_equal(rev, 9);
    assert_int_equal(n_kv, 1);
    for (size_t cut = 0; cut < strlen(good); cut++) /* every truncation */
        assert_int_equal(ec_parse_range(good, cut, count_kv, NULL, &rev), -1);
    const char *bad[] = {
        "{\"header\":{\"revision\":\"9\"},\"kvs\":[{\"key\":\"Y*==\"}]}",      /* base64 */
        "{\"header\":{\"revision\":\"x9\"}}",                                    /* number */
        "{\"header\":{\"revision\":\"99999999999999999999\"}}",                  /* overflow */
        "{\"header\":{\"revision\":\"9\"},\"kvs\":{\"key\":\"YQ==\"}}",          /* type */
        "{\"header\":{\"revision\":\"9\"},\"kvs\":[{\"value\":\"eA==\"}]}",      /* no key */
        "{\"header\":{\"revision\":\"9\"}}}",                                    /* bracket */
        "{\"header\" {\"revision\":\"9\"},\"a\":\"\x01\"}",                      /* control */
        "[1,2]",
        "",
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        assert_int_equal(ec_parse_range(bad[i], strlen(bad[i]), count_kv, NULL, &rev), -1);
    const char *w = "{\"result\":{\"header\":{\"revision\":\"5\"},\"events\":[{\"type\":"
                    "\"DELETE\",\"kv\":{\"key\":\"YQ==\",\"mod_revision\":\"5\"}}]}}";
    n_kv = 0;
    assert_int_equal(ec_parse_watch(w, strlen(w), count_kv, NULL, &rev, &comp), 0);
    assert_int_equal(n_kv, 1);
    assert_int_equal(comp, 0);
    const char *wc = "{\"result\":{\"header\":{\"revision\":\"5\"},\"compact_revision\":\"3\","
                     "\"canceled\":true}}";
    assert_int_equal(ec_parse_watch(wc, strlen(wc), count_kv, NULL, &rev, &comp), 0);
    assert_int_equal(comp, 1);
    const char *we = "{\"error\":{\"grpc_code\":14}}";
    assert_int_equal(ec_parse_watch(we, strlen(we), count_kv, NULL, &rev, &comp), -1);
    const char *wt = "{\"result\":{\"header\":{\"revision\":\"5\"},\"events\":[{\"type\":"
                     "\"BOGUS\",\"kv\":{\"key\":\"YQ==\",\"mod_revision\":\"5\"}}]}}";
    assert_int_equal(ec_parse_watch(wt, strlen(wt), count_kv, NULL, &rev, &comp), -1);
    /* a key longer than EC_MAX_KEY once decoded */
    char big[2048 + 256];
    int n = snprintf(big, sizeof big, "{\"header\":{\"revision\":\"1\"},\"kvs\":[{\"key\":\"");
    for (int i = 0; i < 1024; i++) big[n++] = 'Q';
    n += snprintf(big + n, sizeof big - (size_t)n, "\"}]}");
    assert_int_equal(ec_parse_range(big, (size_t)n, count_kv, NULL, &rev), -1);
    uint8_t out[8];
    assert_int_equal(ec_b64_decode("YQ=", 3, out, sizeof out), -1);
    assert_int_equal(ec_b64_decode("Y=Q=", 4, out, sizeof out), -1);
    assert_int_equal(ec_b64_decode("YWJjZGVmZ2hp", 12, out, 8), -1); /* 9 bytes into 8 */
    assert_int_equal(ec_b64_decode("YWJj", 4, out, sizeof out), 3);
}

static void test_values_round_trip_and_refuse(void **state)
{
    (void)state;
    char v[EC_MAX_VALUE], addr[MB_ADDR_MAX];
    uint8_t meta[MB_META_MAX], m3[3] = {0, 0xab, 0xff};
    uint64_t inc;
    int left;
    size_t ml;
    size_t n = etcd_value_make(v, sizeof v, 42, 1, "tcp://h:1", m3, 3);
    assert_true(n > 0);
    assert_int_equal(etcd_value_parse((uint8_t *)v, n, &inc, &left, addr, meta, &ml), 0);
    assert_int_equal(inc, 42);
    assert_int_equal(left, 1);
    assert_string_equal(addr, "tcp://h:1");
    assert_int_equal(ml, 3);
    assert_memory_equal(meta, m3, 3);
    const char *bad[] = {"v2 1 0 a -", "v1 1 2 a -", "v1 x 0 a -", "v1 1 0 a 0",
                         "v1 1 0 a - extra", "v1 1 0  -", "v1 1 0 a\x01 -", "v1 1 0 a 0G"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        assert_int_equal(etcd_value_parse((const uint8_t *)bad[i], strlen(bad[i]), &inc,
                                          &left, addr, meta, &ml), -1);
    char longaddr[400];
    memset(longaddr, 'a', sizeof longaddr);
    memcpy(longaddr, "v1 1 0 ", 7);
    longaddr[sizeof longaddr - 2] = ' ', longaddr[sizeof longaddr - 1] = '-';
    assert_int_equal(etcd_value_parse((uint8_t *)longaddr, sizeof longaddr, &inc, &left, addr,
                                      meta, &ml), -1);
}

/* The configuration keys that choose and aim the backend. */
static void test_config_keys(void **state)
{
    (void)state;
    struct kvt_config c;
    char err[256];
    config_defaults(&c);
    assert_string_equal(c.cluster_membership, "swim");
    assert_int_equal(config_finish(&c, err, sizeof err), 0);
    config_defaults(&c);
    assert_int_equal(config_set(&c, "cluster.membership", "zookeeper", err, sizeof err), 0);
    assert_int_equal(config_finish(&c, err, sizeof err), -1);
    assert_non_null(strstr(err, "swim or etcd"));
    config_defaults(&c);
    assert_int_equal(config_set(&c, "cluster.membership", "etcd", err, sizeof err), 0);
    assert_int_equal(config_finish(&c, err, sizeof err), -1); /* no endpoints */
    assert_int_equal(config_set(&c, "cluster.etcd_endpoints", E.url, err, sizeof err), 0);
    assert_int_equal(config_set(&c, "cluster.etcd_lease_s", "1", err, sizeof err), -1);
    assert_int_equal(config_set(&c, "cluster.etcd_lease_s", "5", err, sizeof err), 0);
    assert_int_equal(config_finish(&c, err, sizeof err), 0);
    assert_int_equal(c.cluster_etcd_lease_s, 5);
    assert_string_equal(c.cluster_etcd_prefix, "/kvtier/members/");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_config_keys),
        cmocka_unit_test(test_parsers_refuse_bad_bytes),
        cmocka_unit_test(test_values_round_trip_and_refuse),
        cmocka_unit_test(test_join_leave_kill),
        cmocka_unit_test(test_etcd_killed_and_restarted),
        cmocka_unit_test(test_lease_lost_and_registered_again),
        cmocka_unit_test(test_idle_asks_no_tick),
        cmocka_unit_test(test_hostile_keys_refused),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
