/*
 * test_cluster_tls.c -- the cluster's trust boundary, tested as the
 * attacker, with real daemons on loopback and certificates made by the
 * openssl CLI (tests/lib/mkcerts.sh).
 *
 * Over TLS: three members with certificates from the cluster's CA serve
 * GETs across nodes; a node whose certificate comes from another CA, or
 * has expired, cannot join and learns no member and no rkey; a client
 * without a certificate, with a foreign one or speaking plain tcp cannot
 * even connect; a certified node that claims a member's id (a Join from
 * another address, a heartbeat and an index add from the member's own)
 * is refused and counted, and changes nothing; a member that serves
 * flipped bytes and reports their checksum (KVT_FAULT=peer_lie) is
 * caught by the committer's checksum kept by the key's owners: a miss,
 * counted, and no byte of it reaches the client. A node with a valid
 * certificate is sent the pool's rkey only once it has proven its id
 * (what is enforced of remote memory: test_peer_prot shows UCX's loopback
 * transports let an rkey holder write the pool regardless of its
 * read-only registration).
 *
 * Insecure (cluster.insecure = 1, plain tcp, where a raw client can speak
 * as a member): a flood of index adds is capped per member
 * (cluster.index_max_per_peer) and counted, a flood of pins is capped
 * (cluster.pins_max_per_peer), a Join with an incarnation of UINT64_MAX
 * cannot lock the real member out, and kvtierctl peers warns.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#include <nng/nng.h>
#include <nng/protocol/pipeline0/pull.h>
#include <sys/time.h>

#include "client_internal.h"
#include "daemon.h"
#include "kvtier.h"
#include "tlsconf.h"

#define N 3
#define NS "cl/tls"
#define CHUNK (64u << 10)

static struct tcluster T;
#define D T.d
#define url T.url
#define C T.c

/* ----------------------------------------------------------- helpers */

static Kvtier__PeersResp *peers(int i, Kvtier__Response **r)
{
    assert_int_equal(tc_peers(C[i], r), KVT_OK);
    return (*r)->peers;
}

/* Node i's view of member id: its state (PEER_NONE: unknown), address
 * into addr (may be NULL) and incarnation. */
static int member_of(int i, uint32_t id, char *addr, size_t alen, uint64_t *inc)
{
    Kvtier__Response *r;
    Kvtier__PeersResp *p = peers(i, &r);
    int st = KVTIER__PEER_STATE__PEER_NONE;
    for (size_t k = 0; k < p->n_peers; k++) {
        if (p->peers[k]->node_id != id) continue;
        st = p->peers[k]->state;
        if (addr) snprintf(addr, alen, "%s", p->peers[k]->addr);
        if (inc) *inc = p->peers[k]->incarnation;
    }
    kvtier__response__free_unpacked(r, NULL);
    return st;
}

static size_t alive_members(int i)
{
    Kvtier__Response *r;
    Kvtier__PeersResp *p = peers(i, &r);
    size_t n = 0;
    for (size_t k = 0; k < p->n_peers; k++)
        n += p->peers[k]->state == KVTIER__PEER_STATE__PEER_ALIVE;
    kvtier__response__free_unpacked(r, NULL);
    return n;
}

/* A counter of node i's PEERS answer. */
#define COUNTER(i, f) tc_counter(C[i], offsetof(Kvtier__PeersResp, f))

static void put_one(int node, uint64_t seed)
{
    assert_int_equal(tc_put(C[node], NS, seed, CHUNK), KVT_OK);
}

/* Inline GET of one key on node i: 1 found (bytes checked), 0 missed. */
static int get_one(int i, uint64_t seed)
{
    int found = tc_get_checked(C[i], NS, seed, CHUNK, 3000);
    assert_true(found >= 0); /* answered, and no wrong byte */
    return found;
}

/* 1 if a LOOKUP on node i finds the key of seed (any tier). */
static int found(int i, uint64_t seed)
{
    int f = tc_found(C[i], NS, seed);
    assert_true(f >= 0); /* answered */
    return f;
}

static int wait_found(int i, uint64_t seed)
{
    return tc_wait_found(C[i], NS, seed, 10000);
}

/* Send pm to node 0 from a raw client with certificate `cert` (NULL on
 * an insecure cluster); 0 once sent. */
static int push(Kvtier__PeerMsg *pm, const char *cert)
{
    size_t len = kvtier__peer_msg__get_packed_size(pm);
    uint8_t *buf = malloc(len);
    nng_socket s;
    kvtier__peer_msg__pack(pm, buf);
    int rv = tc_dial(&s, url[0], cert, 0);
    if (rv == 0) rv = nng_send(s, buf, len, 0);
    usleep(100000); /* let it leave before the socket closes */
    tc_close(s);
    free(buf);
    return rv;
}

static int wait_counter(int i, size_t off, uint64_t want)
{
    for (int t = 0; t < 200; t++, usleep(25000))
        if (tc_counter(C[i], off) >= want) return 0;
    return -1;
}

/* Every node sees the other N-1 alive with UCX endpoints. */
static int wait_ready(void)
{
    for (int i = 0; i < N; i++)
        if (tc_wait_alive(&T, i, N - 1, 1) != 0) return -1;
    return 0;
}

/* ------------------------------------------------------------- TLS group */

static int setup_tls(void **state)
{
    (void)state;
    setenv("UCX_TLS", "tcp", 1);
    tc_init(&T, N + 1);
    for (int i = 0; i < N; i++) {
        if (i == 1) setenv("KVT_FAULT", "peer_lie=1+", 1); /* node 2 lies */
        int rc = tc_start(&T, i, 2000, NULL);
        unsetenv("KVT_FAULT");
        if (rc != 0) return tc_teardown(&T), -1;
    }
    return wait_ready();
}

static int teardown(void **state)
{
    (void)state;
    return tc_teardown(&T);
}

static void test_gets_across_nodes(void **state)
{
    (void)state;
    Kvtier__Response *r;
    assert_false(peers(0, &r)->insecure);
    kvtier__response__free_unpacked(r, NULL);
    put_one(0, 1);
    assert_int_equal(wait_found(2, 1), 0);
    uint64_t hits = COUNTER(2, remote_hits);
    assert_int_equal(get_one(2, 1), 1); /* fetched from node 1 over UCX */
    assert_int_equal(COUNTER(2, remote_hits), hits + 1);
    assert_true(td_log_has(&D[2], "node 1: UCX identity received")); /* see outsider() */
    assert_false(td_log_has(&D[0], "cluster.insecure"));
}

/* Node 4 with certificate `cert` and node 1 as its seed: it never joins,
 * learns no member and no rkey, and node 1 never hears of it. */
static void outsider(const char *cert)
{
    T.cert[3] = cert;
    T.seed[3] = 0;
    assert_int_equal(tc_start(&T, 3, 2000, NULL), 0);
    sleep(3); /* thirty heartbeats */
    assert_int_equal(member_of(0, 4, NULL, 0, NULL), KVTIER__PEER_STATE__PEER_NONE);
    assert_int_equal(member_of(1, 4, NULL, 0, NULL), KVTIER__PEER_STATE__PEER_NONE);
    assert_int_equal(alive_members(3), 0);
    for (uint32_t id = 1; id <= N; id++)
        assert_int_equal(member_of(3, id, NULL, 0, NULL) == KVTIER__PEER_STATE__PEER_ALIVE, 0);
    assert_false(td_log_has(&D[3], "UCX identity received")); /* no rkey either */
    assert_int_equal(tc_stop(&T, 3), 0);
    td_cleanup(&D[3]);
    memset(&D[3], 0, sizeof D[3]);
    url[3][0] = 0;
}

static void test_foreign_ca_cannot_join(void **state)
{
    (void)state;
    outsider("foreign-4");
}

static void test_expired_cert_cannot_join(void **state)
{
    (void)state;
    outsider("expired-4");
}

static void test_no_cert_cannot_connect(void **state)
{
    (void)state;
    nng_socket s;
    char plain[400];
    assert_int_not_equal(tc_dial(&s, url[0], NULL, 0), 0);        /* no certificate */
    tc_close(s);
    assert_int_not_equal(tc_dial(&s, url[0], "foreign-5", 1), 0); /* another CA */
    tc_close(s);
    assert_int_not_equal(tc_dial(&s, url[0], "expired-5", 0), 0); /* expired */
    tc_close(s);
    assert_int_equal(tc_dial(&s, url[0], "node-5", 0), 0);         /* the control */
    tc_close(s);
    snprintf(plain, sizeof plain, "tcp://%s", url[0] + strlen("tls+tcp://"));
    uint64_t rj = COUNTER(0, rejected);
    if (tc_dial(&s, plain, NULL, 0) == 0) { /* plain tcp: no TLS handshake */
        nng_socket_set_ms(s, NNG_OPT_SENDTIMEO, 500);
        nng_send(s, "junk", 4, 0);
    }
    tc_close(s);
    usleep(300000);
    assert_int_equal(COUNTER(0, rejected), rj); /* nothing reached the daemon */
}

static void test_claimed_id_refused(void **state)
{
    (void)state;
    char addr[64], other[64];
    uint64_t inc;
    assert_int_equal(member_of(0, 2, addr, sizeof addr, &inc), KVTIER__PEER_STATE__PEER_ALIVE);
    uint64_t un = COUNTER(0, unproven);
    /* A Join as node 2 from another address: node 2 is not moved. */
    Kvtier__PeerJoin j = KVTIER__PEER_JOIN__INIT;
    Kvtier__PeerMsg pm = KVTIER__PEER_MSG__INIT;
    snprintf(other, sizeof other, "tls+tcp://127.0.0.1:%d", td_free_port());
    pm.node_id = 2, pm.addr = other, pm.incarnation = inc + 1;
    pm.body_case = KVTIER__PEER_MSG__BODY_JOIN, pm.join = &j;
    assert_int_equal(push(&pm, "node-5"), 0);
    assert_int_equal(wait_counter(0, offsetof(Kvtier__PeersResp, unproven), un + 1), 0);
    /* An index add as node 2, from its own address, even with node 2's
     * own certificate file: without the secret sent to node 2 it is not
     * node 2 speaking. */
    kvt_key k = td_key(4242);
    ProtobufCBinaryData kb = {KVT_KEY_LEN, k.b};
    uint64_t nsh = 0, sum = 1, size = CHUNK;
    protobuf_c_boolean drop = 0;
    Kvtier__PeerIndex ix = KVTIER__PEER_INDEX__INIT;
    ix.keys = &kb, ix.n_keys = 1, ix.ns_hash = &nsh, ix.n_ns_hash = 1;
    ix.drop = &drop, ix.n_drop = 1, ix.checksum = &sum, ix.n_checksum = 1;
    ix.size = &size, ix.n_size = 1;
    pm.addr = addr, pm.incarnation = inc;
    pm.body_case = KVTIER__PEER_MSG__BODY_INDEX, pm.index = &ix;
    assert_int_equal(push(&pm, "node-2"), 0);
    assert_int_equal(wait_counter(0, offsetof(Kvtier__PeersResp, unproven), un + 2), 0);
    char mine[64];
    uint64_t inc2;
    assert_int_equal(member_of(0, 2, mine, sizeof mine, &inc2), KVTIER__PEER_STATE__PEER_ALIVE);
    assert_string_equal(mine, addr);
    assert_int_equal(inc2, inc);
    assert_false(found(0, 4242));
    assert_true(td_log_has(&D[0], "node id not proven"));
}

static void test_lying_holder_caught(void **state)
{
    (void)state;
    put_one(1, 77); /* node 2 commits it, then lies about it */
    assert_int_equal(wait_found(2, 77), 0);
    uint64_t bad = COUNTER(2, bad_checksums);
    assert_int_equal(get_one(2, 77), 0); /* a clean miss, no wrong byte */
    assert_true(COUNTER(2, bad_checksums) > bad);
    assert_true(td_log_has(&D[2], "differs from its owners' record"));
    usleep(500000);                      /* node 2 restores the byte at unpin */
    assert_int_equal(get_one(1, 77), 1); /* its own copy is intact */
}

/* What node 1 sends the member listening on pull within ms: the number of
 * messages; *rkeys gets how many carried its pool's rkey, chal the secret
 * made for that member (if one came). */
static int heard_from_node1(nng_socket pull, int ms, int *rkeys, uint8_t *chal, int *have)
{
    int n = 0;
    *rkeys = 0;
    nng_socket_set_ms(pull, NNG_OPT_RECVTIMEO, 100);
    for (long long end = td_now_ms() + ms; td_now_ms() < end;) {
        nng_msg *m;
        if (nng_recvmsg(pull, &m, 0) != 0) continue;
        Kvtier__PeerMsg *pm = kvtier__peer_msg__unpack(NULL, nng_msg_len(m), nng_msg_body(m));
        nng_msg_free(m);
        if (!pm) continue;
        if (pm->node_id == 1) {
            n++;
            *rkeys += pm->ucx_rkey.len > 0;
            if (pm->auth_chal.len == 16) memcpy(chal, pm->auth_chal.data, 16), *have = 1;
        }
        kvtier__peer_msg__free_unpacked(pm, NULL);
    }
    return n;
}

/* A node with a valid certificate (node 5's) that joins node 1: node 1
 * dials it back (requiring node 5's name) and answers, but no message
 * carries the pool's rkey until node 5 has echoed the secret made for it;
 * the first proven message is answered with the rkey. */
static void test_rkey_only_after_proof(void **state)
{
    (void)state;
    char ca[128], crt[128], key[128], err[256], me[64];
    snprintf(ca, sizeof ca, "%s/ca.crt", tc_certs());
    snprintf(crt, sizeof crt, "%s/node-5.crt", tc_certs());
    snprintf(key, sizeof key, "%s/node-5.key", tc_certs());
    struct tlsconf_files f = {ca, crt, key};
    nng_tls_config *cfg;
    nng_socket pull;
    nng_listener l;
    snprintf(me, sizeof me, "tls+tcp://127.0.0.1:%d", td_free_port());
    assert_int_equal(tlsconf_build(&cfg, 1, &f, NULL, err, sizeof err), 0);
    assert_int_equal(nng_pull0_open(&pull), 0);
    assert_int_equal(nng_listener_create(&l, pull, me), 0);
    assert_int_equal(nng_listener_set_ptr(l, NNG_OPT_TLS_CONFIG, cfg), 0);
    nng_tls_config_free(cfg);
    assert_int_equal(nng_listener_start(l, 0), 0);

    struct timeval tv;
    gettimeofday(&tv, NULL);
    Kvtier__PeerJoin j = KVTIER__PEER_JOIN__INIT;
    Kvtier__PeerMsg pm = KVTIER__PEER_MSG__INIT;
    pm.node_id = 5, pm.addr = me;
    pm.incarnation = (uint64_t)tv.tv_sec * 1000000ull + (uint64_t)tv.tv_usec;
    pm.body_case = KVTIER__PEER_MSG__BODY_JOIN, pm.join = &j;
    assert_int_equal(push(&pm, "node-5"), 0);
    uint8_t chal[16];
    int have = 0, rkeys;
    assert_true(heard_from_node1(pull, 1500, &rkeys, chal, &have) > 0); /* answered */
    assert_true(have);          /* with the secret made for node 5 */
    assert_int_equal(rkeys, 0); /* and no rkey: node 5 has proven nothing yet */

    /* Node 5 echoes the secret: proven, and now given the rkey. It is not
     * ALIVE yet: liveness is the membership's (SWIM), which this raw node
     * does not speak, so it stays JOINING -- known, its hello done. */
    Kvtier__PeerHeartbeat hb = KVTIER__PEER_HEARTBEAT__INIT;
    pm.body_case = KVTIER__PEER_MSG__BODY_HEARTBEAT, pm.heartbeat = &hb;
    pm.auth_proof = (ProtobufCBinaryData){16, chal};
    assert_int_equal(push(&pm, "node-5"), 0);
    heard_from_node1(pull, 1500, &rkeys, chal, &have);
    assert_true(rkeys > 0);
    assert_int_equal(member_of(0, 5, NULL, 0, NULL), KVTIER__PEER_STATE__PEER_JOINING);
    tc_close(pull);
}

/* -------------------------------------------------------- insecure group */

static int setup_insecure(void **state)
{
    (void)state;
    const char *extra[] = {"--cluster.index_max_per_peer", "100",
                           "--cluster.pins_max_per_peer", "2", NULL};
    setenv("UCX_TLS", "tcp", 1);
    tc_init(&T, N);
    T.insecure = 1;
    for (int i = 0; i < N; i++)
        if (tc_start(&T, i, 2000, extra) != 0) return tc_teardown(&T), -1;
    return wait_ready();
}

/* pm as node 2 would send it (its id, address and incarnation). */
static void as_node2(Kvtier__PeerMsg *pm, char *addr, size_t alen)
{
    uint64_t inc;
    assert_int_equal(member_of(0, 2, addr, alen, &inc), KVTIER__PEER_STATE__PEER_ALIVE);
    pm->node_id = 2, pm->addr = addr, pm->incarnation = inc;
}

static void test_index_flood_capped(void **state)
{
    (void)state;
    enum { FLOOD = 1000 };
    static kvt_key keys[FLOOD];
    static ProtobufCBinaryData kb[FLOOD];
    static uint64_t nsh[FLOOD], sum[FLOOD], size[FLOOD];
    static protobuf_c_boolean drop[FLOOD];
    char addr[64];
    uint64_t e0 = COUNTER(0, index_entries), c0 = COUNTER(0, index_conflicts);
    for (int i = 0; i < FLOOD; i++) {
        keys[i] = td_key(100000 + (uint64_t)i);
        kb[i] = (ProtobufCBinaryData){KVT_KEY_LEN, keys[i].b};
        nsh[i] = (uint64_t)i, sum[i] = 1, size[i] = CHUNK;
    }
    Kvtier__PeerIndex ix = KVTIER__PEER_INDEX__INIT;
    ix.keys = kb, ix.n_keys = FLOOD, ix.ns_hash = nsh, ix.n_ns_hash = FLOOD;
    ix.drop = drop, ix.n_drop = FLOOD, ix.checksum = sum, ix.n_checksum = FLOOD;
    ix.size = size, ix.n_size = FLOOD;
    Kvtier__PeerMsg pm = KVTIER__PEER_MSG__INIT;
    pm.body_case = KVTIER__PEER_MSG__BODY_INDEX, pm.index = &ix;
    as_node2(&pm, addr, sizeof addr);
    for (int round = 0; round < 3; round++) assert_int_equal(push(&pm, NULL), 0);
    assert_int_equal(wait_counter(0, offsetof(Kvtier__PeersResp, index_conflicts),
                                  c0 + 3 * (FLOOD - 100)), 0);
    usleep(300000);
    assert_int_equal(COUNTER(0, index_conflicts), c0 + 3 * (FLOOD - 100));
    assert_true(COUNTER(0, index_entries) <= e0 + 100);
    assert_int_equal(alive_members(0), N - 1); /* the daemon carries on */
}

static void test_pin_flood_capped(void **state)
{
    (void)state;
    char addr[64];
    put_one(0, 900);
    kvt_key k = td_key(900);
    ProtobufCBinaryData kb = {KVT_KEY_LEN, k.b};
    Kvtier__PeerPin pin = KVTIER__PEER_PIN__INIT;
    pin.ns = NS, pin.keys = &kb, pin.n_keys = 1;
    Kvtier__PeerMsg pm = KVTIER__PEER_MSG__INIT;
    pm.body_case = KVTIER__PEER_MSG__BODY_PIN, pm.pin = &pin;
    as_node2(&pm, addr, sizeof addr);
    for (uint64_t id = 1; id <= 10; id++) {
        pin.pin_id = 7000 + id; /* never unpinned: they stay until their lease */
        assert_int_equal(push(&pm, NULL), 0);
    }
    usleep(300000);
    assert_true(COUNTER(0, pinned_for_peers) <= 2);
    assert_true(COUNTER(0, pinned_for_peers) >= 1);
}

static void test_max_incarnation_cannot_lock_out(void **state)
{
    (void)state;
    char addr[64];
    Kvtier__PeerJoin j = KVTIER__PEER_JOIN__INIT;
    Kvtier__PeerMsg pm = KVTIER__PEER_MSG__INIT;
    pm.body_case = KVTIER__PEER_MSG__BODY_JOIN, pm.join = &j;
    as_node2(&pm, addr, sizeof addr);
    uint64_t rj = COUNTER(0, rejected), inc;
    pm.incarnation = UINT64_MAX;
    assert_int_equal(push(&pm, NULL), 0);
    assert_int_equal(wait_counter(0, offsetof(Kvtier__PeersResp, rejected), rj + 1), 0);
    sleep(3); /* past cluster.failure_timeout_ms: node 2 is still heard */
    assert_int_equal(member_of(0, 2, NULL, 0, &inc), KVTIER__PEER_STATE__PEER_ALIVE);
    assert_true(inc < UINT64_MAX);
    assert_true(td_log_has(&D[0], "incarnation in the future"));
}

static void test_insecure_warns(void **state)
{
    (void)state;
    const char *ctl = getenv("KVTIERCTL");
    char cmd[1024];
    Kvtier__Response *r;
    assert_true(peers(0, &r)->insecure);
    kvtier__response__free_unpacked(r, NULL);
    assert_true(td_log_has(&D[0], "cluster.insecure = 1: plain tcp"));
    snprintf(cmd, sizeof cmd, "'%s' --socket '%s' peers | grep -q 'WARNING: cluster.insecure'",
             ctl && ctl[0] ? ctl : "build/bin/kvtierctl", D[0].sock);
    assert_int_equal(system(cmd), 0);
}

int main(void)
{
    const struct CMUnitTest tls[] = {
        cmocka_unit_test(test_gets_across_nodes),
        cmocka_unit_test(test_foreign_ca_cannot_join),
        cmocka_unit_test(test_expired_cert_cannot_join),
        cmocka_unit_test(test_no_cert_cannot_connect),
        cmocka_unit_test(test_claimed_id_refused),
        cmocka_unit_test(test_lying_holder_caught),
        cmocka_unit_test(test_rkey_only_after_proof),
    };
    const struct CMUnitTest plain[] = {
        cmocka_unit_test(test_index_flood_capped),
        cmocka_unit_test(test_pin_flood_capped),
        cmocka_unit_test(test_max_incarnation_cannot_lock_out),
        cmocka_unit_test(test_insecure_warns),
    };
    int rc = cmocka_run_group_tests_name("tls", tls, setup_tls, teardown);
    return rc | cmocka_run_group_tests_name("insecure", plain, setup_insecure, teardown);
}
