/*
 * test_cluster.c -- three real daemons on loopback form a cluster: every
 * node sees the others alive; messages from a node that is not a member,
 * with a stolen id, or that do not decode are refused and change nothing;
 * a member killed with SIGKILL is marked dead within the failure timeout
 * (waited for with slack, not timed); restarted, it rejoins with a new
 * incarnation and every node sees it alive again. kvtierctl peers --json
 * shows the same; bad [cluster] settings stop the daemon before it starts.
 * Membership (SWIM): a member stopped with SIGTERM says goodbye and is seen
 * LEFT, never DEAD (no failure timeout waited out); a SIGSTOPped member is
 * declared dead and, on SIGCONT, refutes it and is alive again without a
 * restart (same incarnation, one refutation in its /metrics). A listener
 * that stops accepting is found by its probe and started again.
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
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
#include <nng/nng.h>
#include <nng/protocol/pipeline0/push.h>

#include "client_internal.h"
#include "daemon.h"
#include "json.h"
#include "kvtier.h"
#include "ops.h"

#define N 3
#define FAIL_MS "2000"

static struct tcluster T;
#define D T.d
#define url T.url

static int start_node(int i)
{
    return tc_start(&T, i, atoi(FAIL_MS), NULL);
}

static int setup(void **state)
{
    (void)state;
    tc_init(&T, N);
    for (int i = 0; i < N; i++)
        if (start_node(i) != 0) return tc_teardown(&T), -1;
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    return tc_teardown(&T);
}

/* PEERS from node i; caller frees. */
static Kvtier__Response *peers(int i)
{
    kvt_client *c = td_connect(&D[i]);
    Kvtier__Response *r = NULL;
    assert_int_equal(tc_peers(c, &r), KVT_OK);
    assert_int_equal(r->body_case, KVTIER__RESPONSE__BODY_PEERS);
    kvt_close(c);
    return r;
}

/* State of node `id` as node i sees it (PEER_NONE if unknown). */
static int state_of(int i, uint32_t id, uint32_t *joins)
{
    Kvtier__Response *r = peers(i);
    int st = KVTIER__PEER_STATE__PEER_NONE;
    for (size_t k = 0; k < r->peers->n_peers; k++) {
        if (r->peers->peers[k]->node_id != id) continue;
        st = r->peers->peers[k]->state;
        if (joins) *joins = r->peers->peers[k]->joins;
    }
    kvtier__response__free_unpacked(r, NULL);
    return st;
}

/* Wait until every live node sees node `id` in state st (slack: 15 s). */
static int wait_state(uint32_t id, int st, int skip)
{
    long long deadline = td_now_ms() + 15000;
    while (td_now_ms() < deadline) {
        int ok = 1;
        for (int i = 0; i < N && ok; i++)
            if (i != skip && (uint32_t)(i + 1) != id && state_of(i, id, NULL) != st) ok = 0;
        if (ok) return 0;
        usleep(50000);
    }
    return -1;
}

static void test_all_see_each_other(void **state)
{
    (void)state;
    for (uint32_t id = 1; id <= N; id++)
        assert_int_equal(wait_state(id, KVTIER__PEER_STATE__PEER_ALIVE, -1), 0);
    Kvtier__Response *r = peers(0);
    assert_true(r->peers->enabled);
    assert_int_equal(r->peers->node_id, 1);
    assert_int_equal(r->peers->n_peers, N - 1);
    for (size_t k = 0; k < r->peers->n_peers; k++) {
        assert_true(r->peers->peers[k]->bytes_in > 0);
        assert_true(r->peers->peers[k]->bytes_out > 0);
    }
    kvtier__response__free_unpacked(r, NULL);
}

/* Push raw bytes at node 0's control channel, as a node that holds a
 * certificate from the cluster's CA (for node 5) but is not a member. */
static void push_raw(const void *buf, size_t len)
{
    nng_socket s;
    assert_int_equal(tc_dial(&s, url[0], "node-5", 0), 0);
    assert_int_equal(nng_send(s, (void *)buf, len, 0), 0);
    usleep(100000); /* let it leave before the socket closes */
    tc_close(s);
}

static void push_heartbeat(uint32_t id, const char *addr)
{
    Kvtier__PeerMsg pm = KVTIER__PEER_MSG__INIT;
    Kvtier__PeerHeartbeat hb = KVTIER__PEER_HEARTBEAT__INIT;
    Kvtier__PeerMember mem = KVTIER__PEER_MEMBER__INIT, *mp = &mem;
    mem.node_id = 77;
    mem.addr = "tls+tcp://127.0.0.1:9";
    mem.incarnation = 1;
    hb.members = &mp;
    hb.n_members = 1;
    pm.node_id = id;
    pm.addr = (char *)addr;
    pm.incarnation = 1;
    pm.body_case = KVTIER__PEER_MSG__BODY_HEARTBEAT;
    pm.heartbeat = &hb;
    uint8_t buf[256];
    size_t len = kvtier__peer_msg__pack(&pm, buf);
    push_raw(buf, len);
}

static uint64_t unproven(int i)
{
    Kvtier__Response *r = peers(i);
    uint64_t v = r->peers->unproven;
    kvtier__response__free_unpacked(r, NULL);
    return v;
}

static uint64_t rejected(int i, uint64_t *epoch, size_t *n_peers)
{
    Kvtier__Response *r = peers(i);
    uint64_t v = r->peers->rejected;
    *epoch = r->peers->epoch;
    *n_peers = r->peers->n_peers;
    kvtier__response__free_unpacked(r, NULL);
    return v;
}

static int wait_rejected(uint64_t want)
{
    uint64_t e;
    size_t n;
    for (int t = 0; t < 200; t++, usleep(25000))
        if (rejected(0, &e, &n) >= want) return 0;
    return -1;
}

static void test_rejects_strangers_and_junk(void **state)
{
    (void)state;
    uint64_t e0, e1;
    size_t n0, n1;
    uint64_t r0 = rejected(0, &e0, &n0), u0 = unproven(0);
    static const uint8_t junk[] = {0xff, 0xff, 0xff, 0xff, 0x0f, 0x12, 0x99};
    push_raw(junk, sizeof junk);
    assert_int_equal(wait_rejected(r0 + 1), 0);
    push_heartbeat(99, "tls+tcp://127.0.0.1:9"); /* not a member; gossips node 77 */
    assert_int_equal(wait_rejected(r0 + 2), 0);
    push_heartbeat(2, "tls+tcp://127.0.0.1:9");  /* a member's id, another address */
    assert_int_equal(wait_rejected(r0 + 3), 0);
    assert_int_equal(unproven(0), u0 + 1);           /* counted as identity theft */
    push_heartbeat(0, url[1]);               /* no identity */
    assert_int_equal(wait_rejected(r0 + 4), 0);
    assert_int_equal(rejected(0, &e1, &n1), r0 + 4);
    assert_int_equal(e1, e0);                /* nothing changed */
    assert_int_equal(n1, n0);
    assert_int_equal(state_of(0, 77, NULL), KVTIER__PEER_STATE__PEER_NONE);
    assert_int_equal(state_of(0, 99, NULL), KVTIER__PEER_STATE__PEER_NONE);
    assert_int_equal(state_of(0, 2, NULL), KVTIER__PEER_STATE__PEER_ALIVE);
    assert_true(td_log_has(&D[0], "rejected a"));
}

static void test_kill_and_rejoin(void **state)
{
    (void)state;
    uint32_t joins = 0;
    assert_int_equal(wait_state(2, KVTIER__PEER_STATE__PEER_ALIVE, -1), 0);
    td_kill(&D[1]);
    assert_int_equal(wait_state(2, KVTIER__PEER_STATE__PEER_DEAD, 1), 0);
    assert_true(td_log_has(&D[0], "member 2 (") && td_log_has(&D[0], "-> dead"));
    assert_int_equal(start_node(1), 0);
    assert_int_equal(wait_state(2, KVTIER__PEER_STATE__PEER_ALIVE, -1), 0);
    assert_int_equal(wait_state(1, KVTIER__PEER_STATE__PEER_ALIVE, -1), 0);
    assert_int_equal(wait_state(3, KVTIER__PEER_STATE__PEER_ALIVE, -1), 0);
    assert_int_equal(state_of(0, 2, &joins), KVTIER__PEER_STATE__PEER_ALIVE);
    assert_int_equal(joins, 2);
    assert_int_equal(state_of(2, 2, &joins), KVTIER__PEER_STATE__PEER_ALIVE);
    assert_int_equal(joins, 2);
}

static void test_ctl_peers_json(void **state)
{
    (void)state;
    const char *ctl = getenv("KVTIERCTL");
    char cmd[1024], out[400], err[128];
    snprintf(out, sizeof out, "%s/peers.json", D[0].dir);
    snprintf(cmd, sizeof cmd, "'%s' --socket '%s' peers --json > '%s'",
             ctl && ctl[0] ? ctl : "build/bin/kvtierctl", D[0].sock, out);
    assert_int_equal(system(cmd), 0);
    json_value *v = json_parse_file(out, err, sizeof err);
    assert_non_null(v);
    uint64_t id = 0;
    assert_int_equal(json_uint(json_get(v, "node_id"), &id), 0);
    assert_int_equal(id, 1);
    const json_value *insec = json_get(v, "insecure");
    assert_true(insec && insec->type == JSON_BOOL && !insec->boolean);
    const json_value *ps = json_get(v, "peers");
    assert_int_equal(json_len(ps), N - 1);
    for (size_t i = 0; i < json_len(ps); i++) {
        assert_string_equal(json_string(json_get(json_at(ps, i), "state")), "alive");
        assert_non_null(json_get(json_at(ps, i), "rtt_us"));
        assert_non_null(json_get(json_at(ps, i), "bytes_out"));
    }
    json_free(v);
}

/* A daemon refused at start-up: exit status 2, a message in its log. */
static void refused(const char *const *extra, const char *why)
{
    struct tdaemon t;
    assert_int_equal(td_init(&t), 0);
    pid_t pid = td_spawn(&t, extra);
    assert_int_equal(td_wait_exit(pid, 10000), 2);
    assert_true(td_log_has(&t, why));
    td_cleanup(&t);
}

static void test_bad_settings_refused(void **state)
{
    (void)state;
    const char *no_id[] = {"--cluster.listen", "tls+tcp://127.0.0.1:9", NULL};
    const char *not_tcp[] = {"--cluster.node_id", "4", "--cluster.listen",
                             "ipc:///tmp/x", NULL};
    const char *plain[] = {"--cluster.node_id", "4", "--cluster.listen",
                           "tcp://127.0.0.1:9", NULL};
    const char *no_files[] = {"--cluster.node_id", "4", "--cluster.listen",
                              "tls+tcp://127.0.0.1:9", NULL};
    const char *bad[16] = {"--cluster.node_id", "4", "--cluster.listen",
                           "tls+tcp://127.0.0.1:9"};
    tc_tls_args(bad + 4, "no-such-cert");
    const char *slow[] = {"--cluster.heartbeat_ms", "2000",
                          "--cluster.failure_timeout_ms", "1000", NULL};
    refused(no_id, "cluster.node_id");
    refused(not_tcp, "wants tls+tcp://");
    refused(plain, "wants tls+tcp://");  /* plain tcp only with cluster.insecure */
    refused(no_files, "needs cluster.tls_cert");
    refused(bad, "cluster TLS: cannot open");
    refused(slow, "must exceed cluster.heartbeat_ms");
}

/* Without cluster.listen a daemon is a single node: PEERS says so. */
static void test_off_without_listen(void **state)
{
    (void)state;
    struct tdaemon t = {0};
    assert_int_equal(td_start(&t, NULL), 0);
    kvt_client *c = td_connect(&t);
    Kvtier__Peers p = KVTIER__PEERS__INIT;
    Kvtier__Request q = KVTIER__REQUEST__INIT;
    Kvtier__Response *r = NULL;
    q.body_case = KVTIER__REQUEST__BODY_PEERS;
    q.peers = &p;
    assert_int_equal(kvtc_call(c, &q, &r), KVT_OK);
    assert_int_equal(r->body_case, KVTIER__RESPONSE__BODY_PEERS);
    assert_false(r->peers->enabled);
    assert_int_equal(r->peers->n_peers, 0);
    kvtier__response__free_unpacked(r, NULL);
    kvt_close(c);
    assert_int_equal(td_stop(&t), 0);
    td_cleanup(&t);
}


/* A daemon's /metrics, parsed. */
static void scrape_of(const struct tdaemon *d, struct prom *p)
{
    char base[128], *body = NULL;
    int status = 0;
    assert_int_equal(ops_metrics_base(d, base, sizeof base, 5000), 0);
    assert_int_equal(ops_http_get(base, "/metrics", &status, &body), 0);
    assert_int_equal(status, 200);
    assert_int_equal(prom_parse(body, p), 0);
    free(body);
}

static void scrape(int i, struct prom *p)
{
    scrape_of(&D[i], p);
}

static uint64_t inc_of(int i, uint32_t id)
{
    Kvtier__Response *r = peers(i);
    uint64_t inc = 0;
    for (size_t k = 0; k < r->peers->n_peers; k++)
        if (r->peers->peers[k]->node_id == id) inc = r->peers->peers[k]->incarnation;
    kvtier__response__free_unpacked(r, NULL);
    return inc;
}

/* SIGTERM: the Leave is gossiped before the sockets close, so the others
 * see LEFT. A failure detector alone could only ever say DEAD. */
static void test_leave_is_seen_left(void **state)
{
    (void)state;
    for (uint32_t id = 1; id <= N; id++)
        assert_int_equal(wait_state(id, KVTIER__PEER_STATE__PEER_ALIVE, -1), 0);
    kvt_close(T.c[2]);
    T.c[2] = NULL;
    assert_int_equal(td_stop(&D[2]), 0);
    assert_int_equal(wait_state(3, KVTIER__PEER_STATE__PEER_LEFT, 2), 0);
    char left[160], dead[160];
    snprintf(left, sizeof left, "member 3 (%s): alive -> left", url[2]);
    snprintf(dead, sizeof dead, "member 3 (%s): alive -> dead", url[2]);
    for (int i = 0; i < 2; i++) {
        assert_true(td_log_has(&D[i], left));
        assert_false(td_log_has(&D[i], dead));
    }
    struct prom p;
    scrape(0, &p);
    assert_true(prom_get(&p, "kvtier_peers", "state=\"left\"") == 1);
    assert_true(prom_get(&p, "kvtier_cluster_membership_messages_total",
                         "type=\"ping\",dir=\"tx\"") > 0);
    prom_free(&p);
    assert_int_equal(start_node(2), 0);
    for (uint32_t id = 1; id <= N; id++)
        assert_int_equal(wait_state(id, KVTIER__PEER_STATE__PEER_ALIVE, -1), 0);
}

/* SIGSTOP: the others declare it dead; SIGCONT: it hears so, refutes with
 * a higher incarnation and is alive again, the same process. */
static void test_stopped_member_refutes(void **state)
{
    (void)state;
    for (uint32_t id = 1; id <= N; id++)
        assert_int_equal(wait_state(id, KVTIER__PEER_STATE__PEER_ALIVE, -1), 0);
    uint64_t inc = inc_of(0, 2);
    struct prom p;
    scrape(1, &p);
    double refuted = prom_get(&p, "kvtier_cluster_refutations_total", "");
    prom_free(&p);
    kill(D[1].pid, SIGSTOP);
    int dead = wait_state(2, KVTIER__PEER_STATE__PEER_DEAD, 1);
    kill(D[1].pid, SIGCONT);
    assert_int_equal(dead, 0);
    assert_int_equal(wait_state(2, KVTIER__PEER_STATE__PEER_ALIVE, -1), 0);
    assert_int_equal(wait_state(1, KVTIER__PEER_STATE__PEER_ALIVE, -1), 0);
    assert_int_equal(wait_state(3, KVTIER__PEER_STATE__PEER_ALIVE, -1), 0);
    assert_int_equal(inc_of(0, 2), inc); /* not a restart */
    scrape(1, &p);
    assert_true(prom_get(&p, "kvtier_cluster_refutations_total", "") > refuted);
    prom_free(&p);
    double susp = 0;
    for (int i = 0; i < N; i += 2) { /* who suspected first may be either */
        scrape(i, &p);
        assert_true(prom_get(&p, "kvtier_cluster_false_deaths_total", "") >= 1);
        susp += prom_get(&p, "kvtier_cluster_suspicions_total", "");
        prom_free(&p);
    }
    assert_true(susp >= 1);
}

#undef url /* S's own below */
/* A core thread that stalls (KVT_FAULT=cluster_stall) while messages pour
 * in: the receive queue stops at cluster.rx_queue_max, the rest is dropped
 * and counted, and the daemon still answers. */
static void test_receive_queue_bounded(void **state)
{
    (void)state;
    static struct tcluster S;
    static const uint8_t junk[] = {0xff, 0xff, 0xff, 0xff, 0x0f, 0x12, 0x99};
    const char *extra[] = {"--cluster.rx_queue_max", "8", NULL};
    tc_init(&S, 1);
    setenv("KVT_FAULT", "cluster_stall=1+", 1);
    int rc = tc_start(&S, 0, 2000, extra);
    unsetenv("KVT_FAULT");
    assert_int_equal(rc, 0);
    nng_socket s;
    assert_int_equal(tc_dial(&s, S.url[0], "node-5", 0), 0);
    for (int i = 0; i < 200; i++) assert_int_equal(nng_send(s, (void *)junk, sizeof junk, 0), 0);
    double dropped = 0;
    for (long long end = td_now_ms() + 20000; td_now_ms() < end && dropped < 1;) {
        struct prom p;
        scrape_of(&S.d[0], &p);
        dropped = prom_get(&p, "kvtier_cluster_rx_queue_dropped_total", "");
        prom_free(&p);
    }
    tc_close(s);
    assert_true(dropped >= 1);
    assert_int_equal(tc_teardown(&S), 0);
}

/* LOOKUP of the key of seed in ns on client c: its tier, or TIER_NONE. */
static int lookup_tier(kvt_client *c, const char *ns, uint64_t seed)
{
    int t = KVTIER__TIER__TIER_NONE;
    assert_true(tc_lookup(c, ns, seed, 1, 0, &t) >= 0);
    return t;
}

/* cluster.max_conns = 1 on four nodes: each node keeps one connection in
 * use and evicts the least recently used to reach another member, yet
 * every node sees the other three alive (UCX endpoints too), and a chunk
 * put on node 1 is found by LOOKUP and fetched by GET on node 4 with its
 * bytes intact. /metrics: at most one open connection, LRU closes > 0.
 * On node 4 the first socket closed never closes (conn_close_hang): it is
 * abandoned past the bound, and node 4 goes on and stops cleanly. */
static void test_conns_capped(void **state)
{
    (void)state;
    static struct tcluster S;
    const char *extra[] = {"--cluster.max_conns", "1", NULL};
    enum { CN = 4, SIZE = 64 << 10 };
    static uint8_t buf[SIZE];
    setenv("UCX_TLS", "tcp", 1);
    tc_init(&S, CN);
    for (int i = 0; i < CN; i++) {
        if (i == CN - 1) setenv("KVT_FAULT", "conn_close_hang=1", 1);
        int rc = tc_start(&S, i, 2000, extra);
        unsetenv("KVT_FAULT");
        assert_int_equal(rc, 0);
    }
    for (int i = 0; i < CN; i++) assert_int_equal(tc_wait_alive(&S, i, CN - 1, 1), 0);
    kvt_key k = td_key(777);
    size_t size = SIZE;
    const void *b = buf;
    td_fill(buf, SIZE, 777);
    assert_int_equal(kvt_put(S.c[0], "cl/conns", &k, &b, &size, 1, NULL, NULL), KVT_OK);
    int tier = KVTIER__TIER__TIER_NONE;
    for (long long end = td_now_ms() + 20000; td_now_ms() < end && tier != KVTIER__TIER__TIER_PEER;
         usleep(100000))
        tier = lookup_tier(S.c[3], "cl/conns", 777);
    assert_int_equal(tier, KVTIER__TIER__TIER_PEER);
    assert_int_equal(tc_get_checked(S.c[3], "cl/conns", 777, SIZE, 5000), 1);
    for (int i = 0; i < CN; i++) {
        struct prom p;
        scrape_of(&S.d[i], &p);
        assert_true(prom_get(&p, "kvtier_cluster_open_connections", "") <= 1);
        assert_true(prom_get(&p, "kvtier_cluster_lru_closes_total", "") > 0);
        prom_free(&p);
    }
    long long end = td_now_ms() + 20000;
    while (td_now_ms() < end && !td_log_has(&S.d[CN - 1], "abandoned")) usleep(100000);
    assert_true(td_log_has(&S.d[CN - 1], "did not close within 200 ms (nng); abandoned"));
    assert_int_equal(tc_wait_alive(&S, CN - 1, CN - 1, 1), 0);
    assert_int_equal(tc_teardown(&S), 0);
}

/* A cluster listener that stops accepting (KVT_FAULT=listen_stop=1 stops
 * it at the first probe, as nng 1.5's stops after a peer's failed
 * handshake) is found by that probe, which gets no connection through,
 * and started again: a node started after it joins, and the log and
 * /metrics say so. Node 1 of the main cluster, up all along, was probed
 * and never restarted. */
static void test_listener_restarted(void **state)
{
    (void)state;
    static struct tcluster S;
    struct prom p;
    scrape_of(&T.d[0], &p);
    assert_true(prom_get(&p, "kvtier_cluster_listener_probes_total", "") >= 1);
    assert_true(prom_get(&p, "kvtier_cluster_listener_restarts_total", "") == 0);
    prom_free(&p);
    tc_init(&S, 2);
    setenv("KVT_FAULT", "listen_stop=1", 1);
    int rc = tc_start(&S, 0, 2000, NULL);
    unsetenv("KVT_FAULT");
    assert_int_equal(rc, 0);
    const char *said = "listening again (members redial)";
    for (long long end = td_now_ms() + 30000; td_now_ms() < end && !td_log_has(&S.d[0], said);)
        usleep(100000);
    assert_true(td_log_has(&S.d[0], said));
    assert_int_equal(tc_start(&S, 1, 2000, NULL), 0);
    assert_int_equal(tc_wait_alive(&S, 0, 1, 0), 0);
    assert_int_equal(tc_wait_alive(&S, 1, 1, 0), 0);
    scrape_of(&S.d[0], &p);
    assert_true(prom_get(&p, "kvtier_cluster_listener_restarts_total", "") == 1);
    prom_free(&p);
    assert_int_equal(tc_teardown(&S), 0);
}
#define url T.url

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_all_see_each_other),
        cmocka_unit_test(test_rejects_strangers_and_junk),
        cmocka_unit_test(test_kill_and_rejoin),
        cmocka_unit_test(test_leave_is_seen_left),
        cmocka_unit_test(test_stopped_member_refutes),
        cmocka_unit_test(test_receive_queue_bounded),
        cmocka_unit_test(test_conns_capped),
        cmocka_unit_test(test_listener_restarted),
        cmocka_unit_test(test_ctl_peers_json),
        cmocka_unit_test(test_bad_settings_refused),
        cmocka_unit_test(test_off_without_listen),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
