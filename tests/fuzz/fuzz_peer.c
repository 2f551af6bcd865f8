/*
 * fuzz_peer.c -- the daemon-to-daemon messages (tiers/peer/): any bytes
 * taken as PeerMsgs by cl_apply(), the path every message from the
 * cluster's pull socket takes (decode, sender checks, identity proof,
 * the index's and the pins' checks, then membership, gidx.c's index
 * adds, drops, queries and answers, pget.c's pins and unpins). The
 * cluster is built by hand, without a listener: this node is 1, members
 * 2..5 are alive with known secrets (so a fuzzed message can prove it
 * speaks for one of them over TLS), and members it learns are dialled on
 * inproc:// addresses that nobody listens on, so nothing leaves the
 * process. The holder side pins real index entries in a real (memfd) DRAM
 * pool; there is no UCX (no peer tier), so UCX identities in messages are
 * ignored and no fetch starts. Each input starts from a fresh cluster
 * with one owner query in flight (a GET's resolution), so Holders answers
 * have something to match.
 *
 * Input: byte 0 bit 0 = TLS (claims must be proven) or insecure (claims
 * believed); then messages, each a u16 little-endian length and that many
 * bytes, with ticks of the cluster's clock between them. Whatever
 * arrives: the member table stays consistent (ids unique, addresses
 * terminated and of the cluster's scheme, this node never a member), the
 * pins held for a member stay within cluster.pins_max_per_peer, and
 * nothing leaks.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <nng/nng.h>

#include "dram.h"
#include "kvtier.h"
#include "fuzz_target.h"
#include "index.h"
#include "kvtier.pb-c.h"
#include "log.h"
#include "peer/cluster_int.h"
#include "tlsf.h"

#define NS "f/ns"
#define NKEYS 4
#define CHUNK 4096u
#define MAX_MSGS 16

const char fuzz_target_name[] = "peer";

static struct idx X;
static struct dram *Pool;
static kvt_key Keys[NKEYS];
static uint64_t now;
static int ready;
static uint64_t Applied, Refused; /* messages over the replay (fuzz_target_done) */

static uint64_t h_clock(void *core) { return (void)core, now; }
static uint64_t h_now_ns(void *core) { return (void)core, now * 1000000ull; }
static const char *h_ns_name(void *core, uint16_t ns) { return (void)core, (void)ns, NS; }
static uint16_t h_ns_find(void *core, const char *name)
{
    (void)core;
    return strcmp(name, NS) == 0 ? 0 : NS_NONE;
}
static void h_ns_hold(void *core, uint16_t ns) { (void)core, (void)ns; }
static void h_free_slot(void *core, uint32_t slot) { (void)core, (void)slot; }
static struct park *h_park(void *core, uint32_t pipe, uint64_t req_id,
                           const struct park_ops *ops, void *ctx, void *owner)
{
    (void)core, (void)pipe, (void)req_id, (void)ops, (void)ctx, (void)owner;
    return NULL;
}

static struct tier_host host = {
    .idx = &X,
    .clock_ms = h_clock,
    .now_ns = h_now_ns,
    .ns_name = h_ns_name,
    .ns_find = h_ns_find,
    .ns_hold = h_ns_hold,
    .ns_unhold = h_ns_hold,
    .free_slot = h_free_slot,
    .park = h_park,
};

static uint8_t chal_of(uint32_t id) { return (uint8_t)(0xa0 + id); }

/* The index and pool the holder side pins from, made once. */
static void setup(void)
{
    char err[256];
    log_set_level(LOG_ERROR);
    struct dram_opts o = {NULL, 64 * CHUNK, 0600, NULL, 1, -1};
    if (dram_open(&o, &Pool, err, sizeof err) != KVT_OK || idx_init(&X, 64) != 0) {
        fprintf(stderr, "fuzz_peer: %s\n", err);
        abort();
    }
    host.dram = Pool;
    for (uint32_t i = 0; i < NKEYS; i++) {
        memset(Keys[i].b, 0, sizeof Keys[i].b);
        Keys[i].b[0] = (uint8_t)(i + 1);
        uint32_t s = idx_insert(&X, 0, &Keys[i]);
        uint64_t off;
        struct idx_entry *e = idx_at(&X, s);
        e->blk = tlsf_alloc(Pool->alloc, 1, &off);
        e->size = CHUNK;
        e->csum = kvt_checksum(dram_ptr(Pool, off * DRAM_UNIT), CHUNK);
        e->tier = IDX_DRAM;
        idx_commit(&X, s, IDX_NONE, 0);
    }
    ready = 1;
}

static struct cl_ctx *cluster(int tls)
{
    struct cl_ctx *d = calloc(1, sizeof *d);
    struct cluster *c = calloc(1, sizeof *c);
    if (!d || !c) abort();
    d->host = &host;
    d->idx = &X;
    d->cl = c;
    d->cfg.cluster_failure_ms = 3000;
    d->cfg.cluster_heartbeat_ms = 500;
    d->cfg.cluster_replicas = 2;
    d->cfg.cluster_lookup_ms = 500;
    d->cfg.cluster_index_max_per_peer = 64;
    d->cfg.cluster_pins_max_per_peer = 4;
    d->cfg.lease_timeout_ms = 2000;
    d->cfg.max_chunk_bytes = 1u << 20;
    d->cfg.max_keys = 64;
    c->d = d;
    c->efd = -1;
    c->self_id = 1;
    c->tls = tls;
    c->scheme = "inproc://";
    snprintf(c->self_addr, sizeof c->self_addr, "inproc://n1");
    c->inc = 1000;
    for (uint32_t id = 2; id <= 5; id++) {
        char addr[CL_ADDR_MAX];
        snprintf(addr, sizeof addr, "inproc://n%u", (unsigned)id);
        struct member *m = cl_member_new(c, id, addr);
        m->inc = 100;
        m->state = KVTIER__PEER_STATE__PEER_ALIVE;
        m->proven = 1;
        m->last_heard_ms = now;
        memset(m->chal, chal_of(id), sizeof m->chal);
    }
    if (gx_open(d) != 0 || pg_open(d) != 0) abort();
    return d;
}

static void resolved(struct cl_ctx *d, void *arg, const uint32_t *holders,
                     const struct gx_sum *sums, uint32_t n)
{
    (void)d, (void)holders, (void)sums, (void)n;
    (*(int *)arg)++;
}

static void check(struct cl_ctx *d)
{
    struct cluster *c = d->cl;
    for (uint32_t i = 0; i < c->n; i++) {
        const struct member *m = c->m[i];
        if (m->slot != i || (!m->gone && !cl_find(c, m->id))) abort();
        if (m->id == c->self_id) abort();
        if (strnlen(m->addr, CL_ADDR_MAX) == CL_ADDR_MAX) abort();
        if (strncmp(m->addr, c->scheme, strlen(c->scheme)) != 0) abort();
        if (m->pins_held > d->cfg.cluster_pins_max_per_peer + 1) abort();
        for (uint32_t j = i + 1; j < c->n; j++)
            if (m->id && c->m[j]->id == m->id) abort();
    }
}

static void teardown(struct cl_ctx *d, int *done)
{
    pg_close(d);
    gx_close(d);
    if (*done != 1) abort(); /* the resolution ended exactly once */
    pg_free(d);
    for (uint32_t i = 0; i < d->cl->n; i++)
        if (d->cl->m[i]->open) nng_close(d->cl->m[i]->push);
    cl_members_free(d->cl);
    free(d->cl);
    free(d);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!ready) setup();
    if (size < 1) return 0;
    now = 10000;
    struct cl_ctx *d = cluster(data[0] & 1);
    int done = 0;
    gx_resolve(d, Keys, NKEYS, gx_ns_hash(NS), resolved, &done);
    size_t at = 1;
    for (int n = 0; n < MAX_MSGS && at + 2 <= size; n++) {
        size_t len = data[at] | (size_t)data[at + 1] << 8;
        at += 2;
        if (len > size - at) len = size - at;
        uint64_t rj = d->cl->rejected + d->cl->unproven;
        cl_apply(d, data + at, len);
        Applied++;
        Refused += d->cl->rejected + d->cl->unproven != rj;
        at += len;
        check(d);
        now += 100;
        cluster_tick(d);
        check(d);
    }
    now += 5000; /* past every deadline: resolutions and pins end */
    cluster_tick(d);
    teardown(d, &done);
    return 0;
}

/* ---------------------------------------------------------------- seeds */

static uint8_t *Seed;
static size_t SeedLen, SeedCap;

static void put(const void *b, size_t n)
{
    if (SeedLen + n > SeedCap) {
        SeedCap = (SeedLen + n) * 2;
        if (!(Seed = realloc(Seed, SeedCap))) abort();
    }
    memcpy(Seed + SeedLen, b, n);
    SeedLen += n;
}

/* Append pm, as member `from` sends it (its proof over TLS). */
static void msg(Kvtier__PeerMsg *pm, uint32_t from, int tls)
{
    char addr[32];
    uint8_t proof[CL_TOK], chal[CL_TOK];
    snprintf(addr, sizeof addr, "inproc://n%u", (unsigned)from);
    memset(proof, chal_of(from), sizeof proof);
    memset(chal, 0x5a, sizeof chal);
    pm->node_id = from;
    pm->addr = addr;
    pm->incarnation = 100;
    pm->sent_ns = 1;
    pm->auth_proof = tls ? (ProtobufCBinaryData){CL_TOK, proof} : (ProtobufCBinaryData){0};
    pm->auth_chal = tls ? (ProtobufCBinaryData){CL_TOK, chal} : (ProtobufCBinaryData){0};
    size_t n = kvtier__peer_msg__get_packed_size(pm);
    uint8_t *b = malloc(n + 2);
    if (!b) abort();
    b[0] = (uint8_t)n, b[1] = (uint8_t)(n >> 8);
    kvtier__peer_msg__pack(pm, b + 2);
    put(b, n + 2);
    free(b);
}

static void seed_start(int tls)
{
    uint8_t f = (uint8_t)tls;
    SeedLen = 0;
    put(&f, 1);
}

void fuzz_target_seeds(void (*keep)(const uint8_t *b, size_t n))
{
    ProtobufCBinaryData kb[NKEYS];
    uint64_t nsh[NKEYS], sum[NKEYS], sz[NKEYS], zero[NKEYS] = {0};
    protobuf_c_boolean drop[NKEYS] = {0}, gone[NKEYS] = {1, 1, 1, 1};
    uint32_t who[NKEYS] = {2, 3, 0, 4};
    for (int i = 0; i < NKEYS; i++) {
        memset(Keys[i].b, 0, sizeof Keys[i].b);
        Keys[i].b[0] = (uint8_t)(i + 1);
        kb[i] = (ProtobufCBinaryData){KVT_KEY_LEN, Keys[i].b};
        nsh[i] = gx_ns_hash(NS);
        sum[i] = 0x1234 + (uint64_t)i;
        sz[i] = CHUNK;
    }
    for (int tls = 0; tls <= 1; tls++) {
        Kvtier__PeerMsg pm = KVTIER__PEER_MSG__INIT;
        /* A Join from a new node, a heartbeat naming others. */
        Kvtier__PeerJoin j = KVTIER__PEER_JOIN__INIT;
        seed_start(tls);
        pm.body_case = KVTIER__PEER_MSG__BODY_JOIN, pm.join = &j;
        msg(&pm, 7, tls);
        msg(&pm, 3, tls);
        Kvtier__PeerMember mb[2], *mp[2] = {&mb[0], &mb[1]};
        kvtier__peer_member__init(&mb[0]);
        kvtier__peer_member__init(&mb[1]);
        mb[0].node_id = 8, mb[0].addr = "inproc://n8", mb[0].incarnation = 5;
        mb[1].node_id = 2, mb[1].addr = "inproc://elsewhere", mb[1].incarnation = 101;
        Kvtier__PeerHeartbeat hb = KVTIER__PEER_HEARTBEAT__INIT;
        hb.members = mp, hb.n_members = 2, hb.echo_ns = 1, hb.held_ns = 1;
        pm.body_case = KVTIER__PEER_MSG__BODY_HEARTBEAT, pm.heartbeat = &hb;
        msg(&pm, 2, tls);
        keep(Seed, SeedLen);

        /* Index adds (own, handed over), a drop, a query. */
        Kvtier__PeerIndex ix = KVTIER__PEER_INDEX__INIT;
        ix.keys = kb, ix.n_keys = NKEYS, ix.ns_hash = nsh, ix.n_ns_hash = NKEYS;
        ix.drop = drop, ix.n_drop = NKEYS, ix.checksum = sum, ix.n_checksum = NKEYS;
        ix.size = sz, ix.n_size = NKEYS;
        seed_start(tls);
        pm.body_case = KVTIER__PEER_MSG__BODY_INDEX, pm.index = &ix;
        msg(&pm, 2, tls);
        ix.holder = who, ix.n_holder = NKEYS;
        msg(&pm, 3, tls);
        ix.holder = NULL, ix.n_holder = 0, ix.drop = gone;
        msg(&pm, 2, tls);
        Kvtier__PeerWhoHas w = KVTIER__PEER_WHO_HAS__INIT;
        w.query_id = 9, w.keys = kb, w.n_keys = NKEYS, w.ns_hash = nsh, w.n_ns_hash = NKEYS;
        pm.body_case = KVTIER__PEER_MSG__BODY_WHO_HAS, pm.who_has = &w;
        msg(&pm, 4, tls);
        keep(Seed, SeedLen);

        /* Answers to the resolution's queries, from each member. */
        Kvtier__PeerHolders h = KVTIER__PEER_HOLDERS__INIT;
        seed_start(tls);
        for (uint32_t from = 2; from <= 5; from++)
            for (uint64_t q = 1; q <= 2; q++) {
                h.query_id = q;
                h.holders = who, h.n_holders = NKEYS;
                h.checksum = sum, h.n_checksum = NKEYS, h.size = sz, h.n_size = NKEYS;
                pm.body_case = KVTIER__PEER_MSG__BODY_HOLDERS, pm.holders = &h;
                msg(&pm, from, tls);
            }
        keep(Seed, SeedLen);

        /* Pins (past the cap), a pinned answer to nothing, unpins. */
        Kvtier__PeerPin p = KVTIER__PEER_PIN__INIT;
        p.ns = NS, p.keys = kb, p.n_keys = NKEYS;
        seed_start(tls);
        for (uint64_t id = 1; id <= 6; id++) {
            p.pin_id = id;
            pm.body_case = KVTIER__PEER_MSG__BODY_PIN, pm.pin = &p;
            msg(&pm, 5, tls);
        }
        Kvtier__PeerPinned pd = KVTIER__PEER_PINNED__INIT;
        pd.pin_id = 1, pd.offset = zero, pd.n_offset = NKEYS, pd.size = sz, pd.n_size = NKEYS;
        pd.checksum = sum, pd.n_checksum = NKEYS;
        pm.body_case = KVTIER__PEER_MSG__BODY_PINNED, pm.pinned = &pd;
        msg(&pm, 5, tls);
        Kvtier__PeerUnpin u = KVTIER__PEER_UNPIN__INIT;
        u.pin_id = 2;
        pm.body_case = KVTIER__PEER_MSG__BODY_UNPIN, pm.unpin = &u;
        msg(&pm, 5, tls);
        keep(Seed, SeedLen);
    }
    free(Seed);
    Seed = NULL;
    SeedCap = 0;
}

void fuzz_target_done(void)
{
    /* The seeds are well-formed and proven: most of what the replay sent
     * must have got past the checks, or the harness tests nothing. */
    printf("peer: %llu messages applied, %llu refused\n", (unsigned long long)Applied,
           (unsigned long long)Refused);
    if (Applied == 0 || Refused * 4 > Applied * 3) abort();
    if (!ready) return;
    idx_destroy(&X);
    dram_close(Pool, 0);
    ready = 0;
}
