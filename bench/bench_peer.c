/*
 * bench_peer.c -- the peer tier and the global index against UCX and nng
 * themselves.
 *
 * Design: three daemons on loopback form a cluster (cluster.replicas 1,
 * so most keys are owned by another node than the one asked). Two
 * figures, each a ratio against a baseline measured in the same run:
 *
 *  1. Remote GET bandwidth for 2 MiB and 32 MiB chunks. kvtier: 512 MiB
 *     of chunks are put on node 1; node 3 GETs them 8 keys per request
 *     (each chunk pinned at node 1, pulled with ucp_get_nbx in slices of
 *     at most 8 MiB into node 3's pool, checksummed and committed before
 *     the answer), timed from the first request to the last answer; the
 *     replicas are then deleted on node 3 and the next round fetches
 *     again. Baseline: ucx_perftest -t ucp_get with the same transport
 *     (UCX_TLS) and message size, server and client on loopback, run
 *     between the kvtier rounds. Target: >= 0.8x. Run with tcp, then with
 *     shared memory (UCX_TLS=sm,self, cluster.ucx_wakeup 0).
 *  2. LOOKUP latency of 32 keys held on node 1, asked on node 3 (the
 *     owners of most are remote: one batched query per owner), against a
 *     LOOKUP of the same keys on node 1 (local), p99 of each, and the p99
 *     of a bare nng round trip over tcp on loopback (push/pull is one-way
 *     per hop; a req/rep echo of the query's size stands in for one hop
 *     and its answer). Target: remote p99 <= local p99 + 2 bare round
 *     trips.
 *
 *  3. The price of TLS on the control channel: the clusters above run
 *     over TLS (tls+tcp, certificates made here with tests/lib/mkcerts.sh,
 *     the default); a fourth, with cluster.insecure = 1 (plain tcp), runs
 *     the 2 MiB remote GET and the LOOKUP again: TLS / insecure for each.
 *     The chunk bytes travel over UCX either way; TLS carries the pins,
 *     the index queries and their answers.
 *
 * Needs ucx_perftest (ucx-utils) for the bandwidth baseline; without it
 * those lines say SKIPPED. Needs the openssl CLI for the certificates.
 */
#include "client_internal.h"
#include "common.h"

#define NS "bench/peer"
#define NODES 3
#define TOTAL (512ull << 20)
#define BATCH 8
#define ROUNDS 2
#define LK_KEYS 32
#define LK_ITERS 2000

struct node {
    struct bench_daemon d;
    kvt_client *c;
    char curl[64];
};

static struct node nd[NODES];
static int port0;
static int insecure;   /* 1: cluster.insecure (plain tcp control channel) */
static char certs[128]; /* tests/lib/mkcerts.sh output */

static void make_certs(void)
{
    char cmd[256];
    struct bench_child *c = bench_track(); /* removes the directory at exit */
    bench_mkdtemp(certs, sizeof certs);
    snprintf(c->dir, sizeof c->dir, "%s", certs);
    snprintf(cmd, sizeof cmd, "bash tests/lib/mkcerts.sh '%s' %d", certs, NODES);
    if (system(cmd) != 0) bench_die("tests/lib/mkcerts.sh failed (openssl CLI?)");
}

static void start_node(int i, const char *wakeup)
{
    const char *bin = getenv("KVTIERD");
    char exe[256], dir[128], pool[96], id[8], ca[160], crt[160], key[160];
    struct bench_daemon *d = &nd[i].d;
    snprintf(exe, sizeof exe, "%s", bin && bin[0] ? bin : "build/bin/kvtierd");
    d->ch = bench_track();
    bench_mkdtemp(dir, sizeof dir);
    snprintf(d->ch->dir, sizeof d->ch->dir, "%s", dir);
    snprintf(pool, sizeof pool, "/dev/shm/kvtbench-%d-peer%d.pool", (int)getpid(), i);
    snprintf(d->ch->pool, sizeof d->ch->pool, "%s", pool);
    snprintf(d->ch->log, sizeof d->ch->log, "%s/kvtierd.log", dir);
    snprintf(d->url, sizeof d->url, "ipc://%s/kvtierd.sock", dir);
    snprintf(nd[i].curl, sizeof nd[i].curl, "%s://127.0.0.1:%d",
             insecure ? "tcp" : "tls+tcp", port0 + i);
    snprintf(id, sizeof id, "%d", i + 1);
    snprintf(ca, sizeof ca, "%s/ca.crt", certs);
    snprintf(crt, sizeof crt, "%s/node-%d.crt", certs, i + 1);
    snprintf(key, sizeof key, "%s/node-%d.key", certs, i + 1);
    char *argv[] = {exe, "--socket", d->url, "--state-dir", dir, "--pool-path", pool,
                    "--pool-bytes", "1536M", "--log-level", "warn",
                    "--metrics.listen", "", "--cluster.node_id", id,
                    "--cluster.listen", nd[i].curl, "--cluster.seeds",
                    i ? nd[0].curl : "", "--cluster.replicas", "1",
                    "--nvme.get_deadline_ms", "60000", /* bandwidth, not deadlines */
                    "--cluster.heartbeat_ms", "200", "--cluster.ucx_wakeup",
                    (char *)wakeup, "--cluster.tls_ca", ca, "--cluster.tls_cert", crt,
                    "--cluster.tls_key", key, insecure ? "--cluster.insecure" : NULL,
                    "1", NULL};
    d->ch->pid = bench_spawn(exe, argv, d->ch->log);
    nd[i].c = bench_daemon_connect(d);
    kvt_set_timeout(nd[i].c, 60000);
}

static Kvtier__Response *call(kvt_client *c, Kvtier__Request *q)
{
    Kvtier__Response *r = NULL;
    BENCH_KVT(c, kvtc_call(c, q, &r));
    if (r->err) bench_die("request failed: %s", r->msg);
    return r;
}

static int cluster_ready(void)
{
    for (int i = 0; i < NODES; i++) {
        Kvtier__Peers p = KVTIER__PEERS__INIT;
        Kvtier__Request q = KVTIER__REQUEST__INIT;
        q.body_case = KVTIER__REQUEST__BODY_PEERS, q.peers = &p;
        Kvtier__Response *r = call(nd[i].c, &q);
        int ok = r->peers->peer_tier && r->peers->n_peers == NODES - 1;
        for (size_t k = 0; ok && k < r->peers->n_peers; k++)
            ok = r->peers->peers[k]->state == KVTIER__PEER_STATE__PEER_ALIVE;
        kvtier__response__free_unpacked(r, NULL);
        if (!ok) return 0;
    }
    return 1;
}

static void start_cluster(const char *tls, const char *wakeup)
{
    setenv("UCX_TLS", tls, 1);
    for (int i = 0; i < NODES; i++) start_node(i, wakeup);
    for (int t = 0; t < 300 && !cluster_ready(); t++) bench_sleep_ms(50);
    if (!cluster_ready()) bench_die("the cluster did not form (UCX_TLS=%s)", tls);
}

static void stop_cluster(void)
{
    for (int i = 0; i < NODES; i++) bench_daemon_stop(&nd[i].d, nd[i].c);
}

/* Put n chunks of size bytes, keys (seed, 0..n), on node i. */
static void put_chunks(int i, uint64_t seed, size_t n, size_t size)
{
    for (size_t k = 0; k < n; k++) {
        kvt_key key = bench_key(seed, k);
        kvt_chunk ch;
        kvt_lease l;
        BENCH_KVT(nd[i].c, kvt_put_begin(nd[i].c, NS, &key, &size, 1, NULL, &l, &ch));
        if (!ch.exists) bench_fill(ch.data, size, seed + k);
        BENCH_KVT(nd[i].c, kvt_put_commit(nd[i].c, l, &ch, 1, NULL));
    }
}

/* LOOKUP on node i of n keys from (seed, first); returns found. */
static uint32_t lookup(int i, uint64_t seed, size_t first, size_t n)
{
    ProtobufCBinaryData kb[LK_KEYS];
    kvt_key keys[LK_KEYS];
    for (size_t k = 0; k < n; k++) {
        keys[k] = bench_key(seed, first + k);
        kb[k] = (ProtobufCBinaryData){KVT_KEY_LEN, keys[k].b};
    }
    Kvtier__Lookup l = KVTIER__LOOKUP__INIT;
    l.ns = NS, l.keys = kb, l.n_keys = n;
    Kvtier__Request q = KVTIER__REQUEST__INIT;
    q.body_case = KVTIER__REQUEST__BODY_LOOKUP, q.lookup = &l;
    Kvtier__Response *r = call(nd[i].c, &q);
    uint32_t got = r->lookup->n_present;
    kvtier__response__free_unpacked(r, NULL);
    return got;
}

static void wait_found(int i, uint64_t seed, size_t n)
{
    for (int t = 0; t < 400; t++) {
        size_t ok = 0;
        for (size_t k = 0; k < n; k += LK_KEYS)
            ok += lookup(i, seed, k, n - k < LK_KEYS ? n - k : LK_KEYS);
        if (ok == n) return;
        bench_sleep_ms(25);
    }
    bench_die("node %d never saw the %zu chunks of node 1", i + 1, n);
}

/* One round: GET every chunk on node 3, BATCH keys a request; MiB/s. */
static double get_round(uint64_t seed, size_t n, size_t size)
{
    kvt_key keys[BATCH];
    kvt_chunk ch[BATCH];
    kvt_client *c = nd[2].c;
    uint64_t t0 = bench_now_ns();
    for (size_t k = 0; k < n; k += BATCH) {
        size_t m = n - k < BATCH ? n - k : BATCH, got = 0;
        kvt_lease l;
        for (size_t j = 0; j < m; j++) keys[j] = bench_key(seed, k + j);
        BENCH_KVT(c, kvt_get(c, NS, keys, m, &l, ch, &got));
        if (got != m) bench_die("remote GET found %zu of %zu chunks", got, m);
        if (kvt_checksum(ch[0].data, size) != ch[0].checksum)
            bench_die("wrong bytes from a remote GET");
        BENCH_KVT(c, kvt_release(c, l));
    }
    double s = (double)(bench_now_ns() - t0) / 1e9;
    for (size_t k = 0; k < n; k += BATCH) { /* the next round fetches again */
        size_t m = n - k < BATCH ? n - k : BATCH;
        uint64_t del = 0;
        for (size_t j = 0; j < m; j++) keys[j] = bench_key(seed, k + j);
        BENCH_KVT(c, kvt_delete(c, NS, keys, m, &del));
    }
    return (double)(n * size) / (1 << 20) / s;
}

/* ucx_perftest ucp_get of size bytes, server and client here; MiB/s or
 * a negative value when it cannot run. */
static double perftest(const char *tls, size_t size, size_t iters)
{
    char port[16], sz[32], it[32], cmd[512];
    snprintf(port, sizeof port, "%d", port0 + 7);
    snprintf(sz, sizeof sz, "%zu", size);
    snprintf(it, sizeof it, "%zu", iters);
    snprintf(cmd, sizeof cmd,
             "UCX_TLS=%s timeout 60 ucx_perftest -p %s >/dev/null 2>&1 & sleep 0.5; "
             "UCX_TLS=%s timeout 60 ucx_perftest -p %s -t ucp_get -s %s -n %s "
             "localhost 2>/dev/null | awk '/^Final:/ {print $6}'; wait",
             tls, port, tls, port, sz, it);
    FILE *f = popen(cmd, "r");
    double bw = -1;
    if (f && fscanf(f, "%lf", &bw) != 1) bw = -1;
    if (f) pclose(f);
    return bw;
}

/* Remote GET bandwidth of size-byte chunks (MiB/s, best of ROUNDS);
 * against ucx_perftest when base is set. */
static double bandwidth(const char *tls, size_t size, uint64_t seed, int base_too)
{
    char name[32];
    size_t n = TOTAL / size;
    put_chunks(0, seed, n, size);
    wait_found(2, seed, n);
    double kv = 0, base = 0;
    int have_base = 1;
    for (int r = 0; r < ROUNDS; r++) {
        double k = get_round(seed, n, size);
        double b = base_too ? perftest(tls, size, n) : -1;
        kv = k > kv ? k : kv;
        if (b < 0) have_base = 0;
        base = b > base ? b : base;
    }
    bench_size_name(size, name, sizeof name);
    if (!base_too) return kv;
    if (!have_base) {
        printf("remote GET %-6s %-7s %8.0f MiB/s   ucx_perftest SKIPPED\n", name, tls, kv);
        return kv;
    }
    printf("remote GET %-6s %-7s %8.0f MiB/s   ucx_perftest get %8.0f MiB/s   ratio %.2f "
           "(target >= 0.80: %s)\n", name, tls, kv, base, kv / base,
           bench_verdict(kv >= 0.8 * base));
    return kv;
}

/* ------------------------------------------------------------ lookup -- */

static double lookup_p99(int i, uint64_t seed, size_t first)
{
    static double v[LK_ITERS];
    for (size_t k = 0; k < LK_ITERS; k++) {
        uint64_t t0 = bench_now_ns();
        if (lookup(i, seed, first, LK_KEYS) != LK_KEYS) bench_die("a LOOKUP missed");
        v[k] = (double)(bench_now_ns() - t0) / 1e3;
    }
    return bench_quantile(v, LK_ITERS, 0.99);
}

static double nng_p99(void)
{
    static double v[LK_ITERS];
    struct bench_child *c = bench_track();
    char url[64], size[32], body[2048] = {0};
    size_t req, rsp;
    bench_lookup_sizes(NS, LK_KEYS, &req, &rsp);
    snprintf(url, sizeof url, "tcp://127.0.0.1:%d", port0 + 9);
    snprintf(size, sizeof size, "%zu", rsp);
    char *argv[] = {program_invocation_name, "--echo", url, size, NULL};
    c->pid = bench_spawn("/proc/self/exe", argv, "");
    nng_socket s = bench_nng_dial(url);
    for (size_t k = 0; k < LK_ITERS; k++) {
        uint64_t t0 = bench_now_ns();
        bench_nng_rt(s, body, req < sizeof body ? req : sizeof body);
        v[k] = (double)(bench_now_ns() - t0) / 1e3;
    }
    nng_close(s);
    return bench_quantile(v, LK_ITERS, 0.99);
}

/* LOOKUP p99 remote (asked on node 3); with report set, printed against
 * local and a bare nng round trip. */
static double lookup_latency(uint64_t seed, int report)
{
    put_chunks(0, seed, LK_KEYS, 4096);
    wait_found(2, seed, LK_KEYS);
    double local = 0, remote = 0;
    for (int r = 0; r < ROUNDS; r++) {
        double l = lookup_p99(0, seed, 0), m = lookup_p99(2, seed, 0);
        local = r == 0 || l < local ? l : local;
        remote = r == 0 || m < remote ? m : remote;
    }
    if (!report) return remote;
    double rt = nng_p99();
    printf("LOOKUP %d keys p99: remote %.0f us, local %.0f us, bare nng tcp round trip "
           "%.0f us; remote - local = %.1f round trips (target <= 2: %s)\n", LK_KEYS,
           remote, local, rt, (remote - local) / rt,
           bench_verdict(remote <= local + 2 * rt));
    return remote;
}

/* Figure 3: the 2 MiB GET and the LOOKUP again on an insecure cluster. */
static void tls_price(double get_tls, double lookup_tls)
{
    insecure = 1;
    start_cluster("tcp", "1");
    double get_plain = bandwidth("tcp", 2u << 20, 3000, 0);
    double lookup_plain = lookup_latency(98, 0);
    stop_cluster();
    insecure = 0;
    printf("remote GET 2MiB tcp: TLS %.0f MiB/s, insecure %.0f MiB/s, TLS/insecure %.2f\n",
           get_tls, get_plain, get_tls / get_plain);
    printf("LOOKUP %d keys p99: TLS %.0f us, insecure %.0f us, TLS/insecure %.2f\n", LK_KEYS,
           lookup_tls, lookup_plain, lookup_tls / lookup_plain);
}

int main(int argc, char **argv)
{
    bench_echo_dispatch(argc, argv);
    port0 = 42000 + (int)(getpid() % 2000) * 10;
    int have_perftest = system("command -v ucx_perftest >/dev/null 2>&1") == 0;
    if (!have_perftest) printf("ucx_perftest not found (apt-get install ucx-utils)\n");
    const char *tls[2] = {"tcp", "sm,self"}, *wake[2] = {"1", "0"};
    double get_tls = 0, lookup_tls = 0;
    make_certs();
    for (int t = 0; t < 2; t++) {
        start_cluster(tls[t], wake[t]);
        double g = bandwidth(tls[t], 2u << 20, 1000 + (uint64_t)t, 1);
        bandwidth(tls[t], 32u << 20, 2000 + (uint64_t)t, 1);
        if (t == 0) get_tls = g, lookup_tls = lookup_latency(99, 1);
        stop_cluster();
        for (int i = 0; i < NODES; i++) memset(&nd[i], 0, sizeof nd[i]);
    }
    tls_price(get_tls, lookup_tls);
    return 0;
}
