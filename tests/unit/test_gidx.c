/*
 * test_gidx.c -- the global index (gidx.c) in process, over a member table
 * built by hand (no sockets: messages to members go nowhere): holders
 * published by a member are found by a LOOKUP that this node can answer
 * as an owner; drops and dead holders are misses; malformed index
 * messages are refused; a holder whose checksum differs from the first
 * holder's is not added, nor one past cluster.index_max_per_peer; after
 * a membership change an owner keeps and
 * answers from entries it no longer owns until the view has settled
 * (cluster.failure_timeout_ms), then drops them (issue 10). A LOOKUP that
 * would have to wait on another owner cannot park here (the test's host
 * parks nothing), so it is answered with what this node knows, which is
 * what is checked. The peer tier's context is built here without a
 * daemon (tier_host.h).
 *
 * Owners that move (owners.c, and gidx.c's passes): owners_delta agrees
 * with a brute-force owners_of over random views and random sequences of
 * joins, leaves and restarts, and names a member to tell exactly when a
 * key's owner set changed. Over members wired to real nng sockets
 * (inproc), a join sends each moved key to the joiner alone; a rolling
 * restart whose changes come faster than a pass finishes leaves every
 * owner told every key it owns (the pass never restarts from slot 0 and
 * visits every slot after the last change); a leaving node hands the
 * entries it owns to the members that take its place, naming the holders.
 * Batches are freed once sent, and one waiting for an owner that goes
 * away is freed unsent.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <nng/nng.h>
#include <nng/protocol/pipeline0/pull.h>
#include <nng/protocol/pipeline0/push.h>

#include "peer/cluster_int.h"
#include "peer/owners.h"
#include "daemon.h"
#include "index.h"
#include "log.h"

#define NS "g/ns"
#define NK 64

static struct cl_ctx *D;
static struct idx X;
static uint64_t start_ms;

uint64_t now_ms(void);

/* ---- the host: a clock, one namespace (0), no park table */

static uint64_t h_clock_ms(void *core)
{
    (void)core;
    return now_ms() - start_ms;
}

static const char *h_ns_name(void *core, uint16_t ns)
{
    (void)core, (void)ns;
    return NS;
}

static struct park *h_park(void *core, uint32_t pipe, uint64_t req_id,
                           const struct park_ops *ops, void *ctx, void *owner)
{
    (void)core, (void)pipe, (void)req_id, (void)ops, (void)ctx, (void)owner;
    return NULL; /* answer now */
}

static const struct tier_host host = {
    .idx = &X,
    .clock_ms = h_clock_ms,
    .ns_name = h_ns_name,
    .park = h_park,
};

/* A context as the core builds one: the configuration's defaults. */
static struct cl_ctx *new_ctx(void)
{
    struct cl_ctx *d = calloc(1, sizeof *d);
    assert_non_null(d);
    d->host = &host;
    d->idx = &X;
    d->cfg.cluster_failure_ms = 3000;
    d->cfg.cluster_heartbeat_ms = 500;
    d->cfg.cluster_replicas = 2;
    d->cfg.cluster_lookup_ms = 500;
    d->cfg.cluster_index_max_per_peer = 1048576;
    d->cfg.cluster_pins_max_per_peer = 1024;
    return d;
}
static kvt_key K[NK];

static struct member *add_member(uint32_t id)
{
    char addr[CL_ADDR_MAX];
    snprintf(addr, sizeof addr, "tcp://127.0.0.1:%u", 40000 + id);
    struct member *m = cl_member_new(D->cl, id, addr);
    m->state = KVTIER__PEER_STATE__PEER_ALIVE;
    return m;
}

static int setup(void **state)
{
    (void)state;
    D = new_ctx();
    D->cfg.cluster_failure_ms = 3000;
    start_ms = now_ms();
    log_set_level(LOG_ERROR);
    if (idx_init(&X, 1024) != 0) return -1;
    D->cl = calloc(1, sizeof *D->cl);
    D->cl->self_id = 1;
    add_member(2);
    for (int i = 0; i < NK; i++) K[i] = td_key(500 + (uint64_t)i);
    return gx_open(D);
}

static int teardown(void **state)
{
    (void)state;
    gx_close(D);
    cl_members_free(D->cl);
    free(D->cl);
    idx_destroy(&X);
    free(D);
    return 0;
}

/* Member m tells this node it holds (drop = 0) or dropped keys [a, b),
 * whose chunks have checksum sum (and 4096 bytes). */
static void index_sum(struct member *m, int a, int b, int drop, uint64_t sum)
{
    ProtobufCBinaryData kb[NK];
    uint64_t nsh[NK], cs[NK], sz[NK];
    protobuf_c_boolean dr[NK];
    for (int i = a; i < b; i++) {
        kb[i - a] = (ProtobufCBinaryData){KVT_KEY_LEN, K[i].b};
        nsh[i - a] = gx_ns_hash(NS);
        dr[i - a] = drop;
        cs[i - a] = sum;
        sz[i - a] = 4096;
    }
    Kvtier__PeerIndex ix = KVTIER__PEER_INDEX__INIT;
    ix.n_keys = ix.n_ns_hash = ix.n_drop = ix.n_checksum = ix.n_size = (size_t)(b - a);
    ix.keys = kb, ix.ns_hash = nsh, ix.drop = dr, ix.checksum = cs, ix.size = sz;
    Kvtier__PeerMsg pm = KVTIER__PEER_MSG__INIT;
    pm.body_case = KVTIER__PEER_MSG__BODY_INDEX;
    pm.index = &ix;
    assert_null(gx_check(D, m, &pm));
    gx_on_index(D, m, &pm);
}

static void index_from(struct member *m, int a, int b, int drop)
{
    index_sum(m, a, b, drop, 77);
}

/* LOOKUP keys [a, b) (none cached here): how many the cluster reports,
 * and n_present. */
static int lookup(int a, int b, uint32_t *present)
{
    ProtobufCBinaryData kb[NK];
    Kvtier__Tier tiers[NK] = {0};
    for (int i = a; i < b; i++) kb[i - a] = (ProtobufCBinaryData){KVT_KEY_LEN, K[i].b};
    Kvtier__Lookup q = KVTIER__LOOKUP__INIT;
    q.ns = NS, q.keys = kb, q.n_keys = (size_t)(b - a);
    Kvtier__LookupResp lr = KVTIER__LOOKUP_RESP__INIT;
    lr.tiers = tiers, lr.n_tiers = q.n_keys;
    assert_int_equal(cluster_lookup(D, 5, 1, &q, &lr), 0); /* never parks here */
    int found = 0;
    for (int i = 0; i < b - a; i++) found += tiers[i] == KVTIER__TIER__TIER_PEER;
    if (present) *present = (uint32_t)lr.n_present;
    return found;
}

static uint64_t entries(void)
{
    Kvtier__PeersResp pr = KVTIER__PEERS_RESP__INIT;
    gx_fill_peers(D, &pr);
    return pr.index_entries;
}

static uint64_t conflicts(void)
{
    Kvtier__PeersResp pr = KVTIER__PEERS_RESP__INIT;
    gx_fill_peers(D, &pr);
    return pr.index_conflicts;
}

/* The first holder's checksum is the entry's: a holder whose copy differs
 * is not added. A member holds at most cluster.index_max_per_peer
 * entries; a drop gives room back. */
static void test_committer_checksum_and_cap(void **state)
{
    (void)state;
    struct member *m2 = cl_find(D->cl, 2), *m3 = add_member(3);
    uint64_t c0 = conflicts();
    index_sum(m2, 0, 4, 0, 77);                  /* committed by node 2 */
    index_sum(m3, 0, 4, 0, 78);                  /* other bytes: refused */
    assert_int_equal(conflicts(), c0 + 4);
    m2->state = KVTIER__PEER_STATE__PEER_DEAD;   /* so node 3 is not named */
    assert_int_equal(lookup(0, 4, NULL), 0);
    m2->state = KVTIER__PEER_STATE__PEER_ALIVE;
    index_sum(m2, 0, 4, 1, 77);
    assert_int_equal(entries(), 0);
    D->cfg.cluster_index_max_per_peer = 4;
    index_sum(m3, 0, 8, 0, 78);                  /* only 4 taken */
    assert_int_equal(entries(), 4);
    assert_int_equal(conflicts(), c0 + 8);
    index_sum(m3, 0, 2, 1, 78);                  /* two dropped: room for two */
    index_sum(m3, 4, 8, 0, 78);
    assert_int_equal(entries(), 4);
    assert_int_equal(conflicts(), c0 + 10);
    index_sum(m3, 0, 8, 1, 78);
    assert_int_equal(entries(), 0);
    D->cfg.cluster_index_max_per_peer = 1048576;
    cl_member_drop(D->cl, m3);                    /* node 3 leaves the table */
}

/* Two nodes, two replicas: this node owns every key. */
static void test_holders_found_drops_and_dead_missed(void **state)
{
    (void)state;
    struct member *m2 = cl_find(D->cl, 2);
    uint32_t present;
    index_from(m2, 0, 8, 0);
    assert_int_equal(entries(), 8);
    assert_int_equal(lookup(0, 8, &present), 8);
    assert_int_equal(present, 8);
    index_from(m2, 2, 3, 1);                     /* key 2 dropped */
    assert_int_equal(lookup(0, 8, &present), 7);
    assert_int_equal(present, 2);
    m2->state = KVTIER__PEER_STATE__PEER_DEAD;   /* a dead holder: misses */
    gx_membership(D, 2, 0);
    assert_int_equal(lookup(0, 8, NULL), 0);
    m2->state = KVTIER__PEER_STATE__PEER_ALIVE;
    gx_membership(D, 2, 1);
    assert_int_equal(lookup(0, 8, NULL), 7);
    index_from(m2, 0, 8, 1);
    assert_int_equal(entries(), 0);
}

static void test_malformed_refused(void **state)
{
    (void)state;
    struct member *m2 = cl_find(D->cl, 2);
    uint8_t shortkey[5] = {0};
    ProtobufCBinaryData kb = {sizeof shortkey, shortkey};
    uint64_t nsh[2] = {1, 2};
    protobuf_c_boolean dr[1] = {0};
    Kvtier__PeerIndex ix = KVTIER__PEER_INDEX__INIT;
    ix.keys = &kb, ix.n_keys = 1, ix.ns_hash = nsh, ix.n_ns_hash = 1;
    ix.drop = dr, ix.n_drop = 1;
    uint64_t cs[1] = {0}, sz[1] = {4096};
    ix.checksum = cs, ix.n_checksum = 1, ix.size = sz, ix.n_size = 1;
    Kvtier__PeerMsg pm = KVTIER__PEER_MSG__INIT;
    pm.body_case = KVTIER__PEER_MSG__BODY_INDEX;
    pm.index = &ix;
    assert_non_null(gx_check(D, m2, &pm));       /* a 5-byte key */
    kb = (ProtobufCBinaryData){KVT_KEY_LEN, K[0].b};
    ix.n_ns_hash = 2;
    assert_non_null(gx_check(D, m2, &pm));       /* lengths differ */
    ix.n_ns_hash = 1, ix.n_drop = 0;
    assert_non_null(gx_check(D, m2, &pm));
    uint32_t h[1] = {2};
    Kvtier__PeerHolders ph = KVTIER__PEER_HOLDERS__INIT;
    ph.query_id = 424242, ph.holders = h, ph.n_holders = 1;
    pm.body_case = KVTIER__PEER_MSG__BODY_HOLDERS;
    pm.holders = &ph;
    assert_non_null(gx_check(D, m2, &pm));       /* an answer to no query */
    assert_int_equal(entries(), 0);
}

/* Three members join; keys this node no longer owns stay answerable until
 * the view settles, then the sweep drops them. */
static void test_unowned_kept_until_settled(void **state)
{
    (void)state;
    struct member *m2 = cl_find(D->cl, 2);
    index_from(m2, 0, NK, 0);                    /* owner of all 64 for now */
    assert_int_equal(lookup(0, NK, NULL), NK);
    for (uint32_t id = 3; id <= 5; id++) {
        add_member(id);
        gx_membership(D, id, 1);
    }
    gx_tick(D);                                  /* republish, sweep */
    assert_int_equal(entries(), NK);             /* kept: not settled */
    assert_int_equal(lookup(0, NK, NULL), NK);   /* asked here as before */
    start_ms -= D->cfg.cluster_failure_ms;    /* the view has settled */
    gx_tick(D);
    uint64_t kept = entries();
    assert_true(kept > 0 && kept < NK);          /* only what it owns now */
    assert_int_equal(lookup(0, NK, NULL), (int)kept); /* the rest: ask owners */
}

/* ------------------------------------------------ owners that move */

static uint64_t rnd_state = 0x243F6A8885A308D3ull;

static uint32_t rnd(uint32_t n)
{
    rnd_state ^= rnd_state << 13;
    rnd_state ^= rnd_state >> 7;
    rnd_state ^= rnd_state << 17;
    return (uint32_t)(rnd_state % n);
}

static int in_set(const uint32_t *o, uint32_t n, uint32_t id)
{
    for (uint32_t i = 0; i < n; i++)
        if (o[i] == id) return 1;
    return 0;
}

static int same_set(const uint32_t *a, uint32_t na, const uint32_t *b, uint32_t nb)
{
    if (na != nb) return 0;
    for (uint32_t i = 0; i < na; i++)
        if (!in_set(b, nb, a[i])) return 0;
    return 1;
}

/* One join or leave of a random id (1..100) to view[0..*n). */
static uint32_t random_change(uint32_t *view, uint32_t *n, enum ow_change *kind)
{
    uint32_t id = 1 + rnd(100);
    for (uint32_t i = 0; i < *n; i++)
        if (view[i] == id && *n > 1) {
            view[i] = view[--*n];
            *kind = OW_LEAVE;
            return id;
        } else if (view[i] == id) {
            *kind = OW_RESEND;
            return id;
        }
    view[(*n)++] = id;
    *kind = OW_JOIN;
    return id;
}

/* One change: owners_delta names a member iff the owner set changed,
 * and the set it leaves is the brute-force one. */
static void test_delta_single_change_vs_brute_force(void **state)
{
    (void)state;
    uint32_t view[128], nv, changed = 0, same = 0;
    for (int trial = 0; trial < 300; trial++) {
        nv = 0;
        for (uint32_t i = 0, want = 1 + rnd(60); nv < want; i++) {
            enum ow_change k;
            random_change(view, &nv, &k);
        }
        uint32_t r = 1 + rnd(4);
        enum ow_change kind;
        uint32_t before[128], nb = nv;
        memcpy(before, view, nv * sizeof *view);
        uint32_t who = random_change(view, &nv, &kind);
        for (int key = 0; key < 100; key++) {
            kvt_key k = td_key((uint64_t)trial * 1000 + (uint64_t)key);
            uint64_t nsh = 7 + (uint64_t)key;
            uint32_t o[OW_MAX_REPLICAS], n = owners_of(&k, nsh, before, nb, r, o);
            uint32_t o0[OW_MAX_REPLICAS], n0 = n;
            memcpy(o0, o, sizeof o);
            uint32_t b[OW_MAX_REPLICAS], bn = owners_of(&k, nsh, view, nv, r, b);
            uint32_t t = owners_delta(&k, nsh, o, &n, r, who, kind, view, nv);
            assert_true(same_set(o, n, b, bn));
            /* a member that restarted joins again without leaving:
             * nothing moves, but it is told what it owns */
            uint32_t rj = before[rnd(nb)], rn = n0, ro[OW_MAX_REPLICAS];
            memcpy(ro, o0, sizeof ro);
            uint32_t rt = owners_delta(&k, nsh, ro, &rn, r, rj, OW_JOIN, before, nb);
            assert_true(same_set(ro, rn, o0, n0));
            assert_int_equal(rt, in_set(o0, n0, rj) ? rj : OW_NONE);
            if (kind == OW_RESEND) {
                assert_int_equal(t, in_set(o0, n0, who) ? who : OW_NONE);
                continue;
            }
            int moved = !same_set(o0, n0, b, bn);
            assert_int_equal(t != OW_NONE, moved);
            if (moved) assert_true(in_set(b, bn, t) && !in_set(o0, n0, t));
            changed += moved;
            same += !moved;
        }
    }
    assert_true(changed > 0 && same > changed); /* both cases were exercised */
}

/* Sequences of changes applied one by one (the view each leave fills
 * from is the final one, as gidx.c replays its log): the brute-force
 * owners of the final view, and every owner that entered was named. */
static void test_delta_sequences_vs_brute_force(void **state)
{
    (void)state;
    for (int trial = 0; trial < 300; trial++) {
        uint32_t view[128], nv = 0, who[8];
        enum ow_change kind[8];
        for (uint32_t want = 2 + rnd(40); nv < want;) {
            enum ow_change k;
            random_change(view, &nv, &k);
        }
        uint32_t before[128], nb = nv, r = 1 + rnd(3), steps = 1 + rnd(8);
        memcpy(before, view, nv * sizeof *view);
        for (uint32_t i = 0; i < steps; i++) who[i] = random_change(view, &nv, &kind[i]);
        for (int key = 0; key < 64; key++) {
            kvt_key k = td_key(900000 + (uint64_t)trial * 100 + (uint64_t)key);
            uint32_t o[OW_MAX_REPLICAS], n = owners_of(&k, 3, before, nb, r, o);
            uint32_t o0[OW_MAX_REPLICAS], n0 = n, told[8], nt = 0;
            memcpy(o0, o, sizeof o);
            for (uint32_t i = 0; i < steps; i++) {
                uint32_t t = owners_delta(&k, 3, o, &n, r, who[i], kind[i], view, nv);
                if (t != OW_NONE) told[nt++] = t;
            }
            uint32_t b[OW_MAX_REPLICAS], bn = owners_of(&k, 3, view, nv, r, b);
            assert_true(same_set(o, n, b, bn));
            for (uint32_t i = 0; i < bn; i++)
                if (!in_set(o0, n0, b[i])) assert_true(in_set(told, nt, b[i]));
        }
    }
}

/* A daemon of its own: node 1 and members 2..nm, each wired to a pull
 * socket here over inproc, `slots` READY chunks in namespace NS. */
#define WM 16
static nng_socket Pull[WM + 1];
static uint8_t *Told[WM + 1]; /* per member: key index -> told */
static uint32_t *HeldBy[WM + 1];
static uint32_t NSlots, NMem;
static kvt_key *Keys;

static void wire(struct member *m)
{
    char url[64];
    snprintf(url, sizeof url, "inproc://gidx-%u", (unsigned)m->id);
    assert_int_equal(nng_pull0_open(&Pull[m->id]), 0);
    nng_socket_set_int(Pull[m->id], NNG_OPT_RECVBUF, 8192);
    nng_socket_set_ms(Pull[m->id], NNG_OPT_RECVTIMEO, 50);
    assert_int_equal(nng_listen(Pull[m->id], url, NULL, 0), 0);
    assert_int_equal(nng_push0_open(&m->push), 0);
    nng_socket_set_int(m->push, NNG_OPT_SENDBUF, 8192);
    assert_int_equal(nng_dial(m->push, url, NULL, 0), 0);
    m->open = 1;
}

static int key_index(const uint8_t *b)
{
    for (uint32_t i = 0; i < NSlots; i++)
        if (!memcmp(Keys[i].b, b, KVT_KEY_LEN)) return (int)i;
    return -1;
}

/* Everything member id was sent: keys told (not drops); returns how many
 * index entries came. A message is awaited 50 ms at most. */
static uint32_t drain(uint32_t id)
{
    nng_msg *msg;
    uint32_t got = 0;
    while (nng_recvmsg(Pull[id], &msg, 0) == 0) {
        Kvtier__PeerMsg *pm =
            kvtier__peer_msg__unpack(NULL, nng_msg_len(msg), nng_msg_body(msg));
        assert_non_null(pm);
        assert_int_equal(pm->node_id, 1);
        if (pm->body_case == KVTIER__PEER_MSG__BODY_INDEX) {
            const Kvtier__PeerIndex *ix = pm->index;
            for (size_t i = 0; i < ix->n_keys; i++) {
                int k = key_index(ix->keys[i].data);
                assert_true(k >= 0);
                if (!ix->drop[i]) Told[id][k] = 1;
                HeldBy[id][k] = ix->n_holder ? ix->holder[i] : 1;
                got++;
            }
        }
        kvtier__peer_msg__free_unpacked(pm, NULL);
        nng_msg_free(msg);
    }
    return got;
}

static uint32_t drain_all(uint32_t *per)
{
    uint32_t total = 0;
    for (uint32_t id = 2; id <= NMem; id++) {
        uint32_t n = drain(id);
        if (per) per[id] = n;
        total += n;
    }
    return total;
}

static void advance(uint64_t ms)
{
    start_ms -= ms;
}

static struct gx_stats stats(void)
{
    struct gx_stats st;
    gx_stats(D, &st);
    return st;
}

/* Ticks (each past the debounce) until the pass is over. */
static void run_pass(void)
{
    for (int i = 0; i < 1000 && (i == 0 || stats().pass); i++) {
        advance(250);
        gx_tick(D);
    }
    assert_int_equal(stats().pass, 0);
}

static int setup_wired(uint32_t nm, uint32_t slots, uint32_t replicas, uint32_t alive)
{
    D = new_ctx();
    D->cfg.cluster_failure_ms = 3000;
    D->cfg.cluster_replicas = replicas;
    start_ms = now_ms();
    log_set_level(LOG_ERROR);
    if (idx_init(&X, slots + 16) != 0) return -1;
    D->cl = calloc(1, sizeof *D->cl);
    D->cl->self_id = 1;
    NMem = nm;
    for (uint32_t id = 2; id <= nm; id++) {
        struct member *m = add_member(id);
        wire(m);
        if (id > alive) m->state = KVTIER__PEER_STATE__PEER_DEAD;
        Told[id] = calloc(slots, 1);
        HeldBy[id] = calloc(slots, sizeof **HeldBy);
    }
    NSlots = slots;
    Keys = calloc(slots, sizeof *Keys);
    uint16_t ns = 0; /* the host's one namespace */
    for (uint32_t i = 0; i < slots; i++) {
        Keys[i] = td_key(70000 + i);
        uint32_t s = idx_insert(&X, ns, &Keys[i]);
        if (s == IDX_NONE) return -1;
        idx_at(&X, s)->size = 4096; /* published with the index update */
        idx_at(&X, s)->csum = 77;
        idx_commit(&X, s, IDX_NONE, 0);
    }
    return gx_open(D); /* publishes what is held, as after a restart */
}

static int teardown_wired(void **state)
{
    (void)state;
    gx_close(D);
    for (uint32_t id = 2; id <= NMem; id++) {
        nng_close(D->cl->m[id - 2]->push);
        nng_close(Pull[id]);
        free(Told[id]);
        free(HeldBy[id]);
    }
    free(Keys);
    cl_members_free(D->cl);
    free(D->cl);
    idx_destroy(&X);
    free(D);
    return 0;
}

static uint32_t view_ids(uint32_t *v)
{
    uint32_t n = 0;
    for (uint32_t i = 0; i < D->cl->n; i++)
        if (cl_alive(D->cl->m[i])) v[n++] = D->cl->m[i]->id;
    v[n++] = 1;
    return n;
}

static void forget_told(void)
{
    for (uint32_t id = 2; id <= NMem; id++) memset(Told[id], 0, NSlots);
}

static int setup_join(void **state)
{
    (void)state;
    return setup_wired(8, 3000, 2, 8);
}

/* Node 9 joins: it alone is sent anything, exactly the keys it now owns;
 * nobody else hears a word (was: every key to every owner). */
static void test_join_moves_only_what_changed(void **state)
{
    (void)state;
    run_pass();
    uint32_t v[WM + 1], nv = view_ids(v), o[OW_MAX_REPLICAS];
    assert_true(drain_all(NULL) > 0); /* the first publish */
    D->cl->m[6]->state = KVTIER__PEER_STATE__PEER_DEAD; /* member 8 leaves */
    gx_membership(D, 8, 0);
    run_pass();
    drain_all(NULL);
    forget_told();
    uint64_t moved0 = stats().moved;
    D->cl->m[6]->state = KVTIER__PEER_STATE__PEER_ALIVE; /* and joins again */
    gx_membership(D, 8, 1);
    run_pass();
    uint32_t per[WM + 1];
    uint32_t total = drain_all(per);
    nv = view_ids(v);
    uint32_t want = 0;
    for (uint32_t i = 0; i < NSlots; i++) {
        uint32_t n = owners_of(&Keys[i], gx_ns_hash(NS), v, nv, 2, o);
        int owner = in_set(o, n, 8);
        want += owner;
        assert_int_equal(Told[8][i], owner);
    }
    assert_true(want > 0);
    assert_int_equal(per[8], want);
    assert_int_equal(total, want);          /* nobody else */
    assert_int_equal(stats().moved - moved0, want);
}

/* Batches follow the owners in use (issue 12): none is left once sent;
 * one waiting for an owner that stops being live is freed unsent, and the
 * others still go on the next tick. */
static void test_batches_follow_owners(void **state)
{
    (void)state;
    run_pass();
    drain_all(NULL);
    assert_int_equal(stats().batches, 0); /* sent and freed */
    uint32_t v[WM + 1], nv = view_ids(v), o[OW_MAX_REPLICAS], to5 = 0;
    for (uint32_t i = 0; i < NSlots && to5 < 8; i++) {
        uint32_t n = owners_of(&Keys[i], gx_ns_hash(NS), v, nv, 2, o);
        if (!in_set(o, n, 5) || in_set(o, n, 1)) continue;
        cluster_held(D, idx_find(&X, 0, &Keys[i]), 1); /* a put: urgent */
        to5++;
    }
    assert_int_equal(to5, 8);
    uint32_t waiting = stats().batches;
    assert_true(waiting >= 2); /* member 5's and the other owners' */
    cl_find(D->cl, 5)->state = KVTIER__PEER_STATE__PEER_DEAD;
    gx_membership(D, 5, 0);
    assert_int_equal(stats().batches, waiting - 1); /* 5's, freed at once */
    advance(10);
    gx_tick(D); /* the urgent ones go; the pass is not due yet */
    assert_int_equal(stats().batches, 0);
    assert_int_equal(drain(5), 0);
    assert_true(drain_all(NULL) >= 8);
}

static int setup_rolling(void **state)
{
    (void)state;
    return setup_wired(8, 5000, 2, 8); /* more slots than one tick's slice */
}

/* Every member restarts in turn, the next before the pass for the last
 * is over; a restarted member has lost what it was told. Odd ones are
 * taken for dead first, even ones come back before anyone noticed (a
 * new incarnation: a join without a leave). Afterwards every owner was
 * told every key it owns since its restart. */
static void test_rolling_restart_leaves_no_slot_unvisited(void **state)
{
    (void)state;
    run_pass();
    drain_all(NULL);
    for (uint32_t id = 2; id <= NMem; id++) {
        struct member *m = cl_find(D->cl, id);
        if (id % 2) {
            m->state = KVTIER__PEER_STATE__PEER_DEAD;
            gx_membership(D, id, 0);
            advance(250);
            gx_tick(D);                  /* part of a pass */
            drain_all(NULL);
        }
        m->state = KVTIER__PEER_STATE__PEER_ALIVE;
        memset(Told[id], 0, NSlots);     /* restarted: an empty index */
        gx_membership(D, id, 1);
        assert_int_equal(stats().pass, 1);
        advance(250);
        gx_tick(D);                      /* part of a pass again */
        drain_all(NULL);
    }
    run_pass();
    drain_all(NULL);
    uint32_t v[WM + 1], nv = view_ids(v), o[OW_MAX_REPLICAS], missing = 0;
    for (uint32_t i = 0; i < NSlots; i++) {
        uint32_t n = owners_of(&Keys[i], gx_ns_hash(NS), v, nv, 2, o);
        for (uint32_t j = 0; j < n; j++)
            if (o[j] != 1 && !Told[o[j]][i]) missing++;
    }
    assert_int_equal(missing, 0);
    assert_int_equal(stats().log, 0);   /* the log is emptied at the end */
}

static int setup_churn(void **state)
{
    (void)state;
    return setup_wired(16, 5000, 2, 8); /* 9..16 join later */
}

/* Members join one every two ticks, never a pause long enough for a pass
 * to end; a pass takes three ticks (5000 slots, 2048 a tick). Each member
 * that joined three ticks ago or more was already told every key it owns:
 * the pass goes on from its cursor, so churn cannot starve the slots at
 * the end of the index (a pass that started over at each change would
 * never reach them). */
static void test_churn_never_starves_a_slot(void **state)
{
    (void)state;
    run_pass();
    drain_all(NULL);
    uint32_t v[WM + 1], nv, o[OW_MAX_REPLICAS];
    for (uint32_t j = 9; j <= 16; j++) {
        cl_find(D->cl, j)->state = KVTIER__PEER_STATE__PEER_ALIVE;
        gx_membership(D, j, 1);
        for (int t = 0; t < 2; t++) {
            advance(250);
            gx_tick(D);
            drain_all(NULL);
        }
        assert_int_equal(stats().pass, 1); /* never over during the churn */
        nv = view_ids(v);
        uint32_t missing = 0, owned = 0;
        for (uint32_t i = 0; i < NSlots; i++) {
            uint32_t n = owners_of(&Keys[i], gx_ns_hash(NS), v, nv, 2, o);
            for (uint32_t x = 0; x < n; x++) {
                if (o[x] < 9 || o[x] >= j) continue; /* joined 3+ ticks ago */
                owned++;
                missing += !Told[o[x]][i];
            }
        }
        assert_int_equal(missing, 0);
        if (j > 9) assert_true(owned > 0);
    }
}

static int setup_sweep(void **state)
{
    (void)state;
    return setup_wired(12, 1, 2, 8);
}

/* Which of k[0..n) this node owns for the view of live members (brute
 * force); returns how many. */
static uint32_t owned_of(const kvt_key *k, uint32_t n, uint64_t nsh, uint8_t *own)
{
    uint32_t v[WM + 1], nv = view_ids(v), o[OW_MAX_REPLICAS], count = 0;
    for (uint32_t i = 0; i < n; i++) {
        uint32_t c = owners_of(&k[i], nsh, v, nv, 2, o);
        uint8_t mine = (uint8_t)in_set(o, c, 1);
        if (own) own[i] = mine;
        count += mine;
    }
    return count;
}

static void set_live(uint32_t id, int alive)
{
    cl_find(D->cl, id)->state =
        alive ? KVTIER__PEER_STATE__PEER_ALIVE : KVTIER__PEER_STATE__PEER_DEAD;
    gx_membership(D, id, alive);
}

/* Ticks past the settling time until the pass and the owner-side sweep
 * are over. */
static void run_sweep(void)
{
    advance(D->cfg.cluster_failure_ms);
    for (int i = 0; i < 100 && (i == 0 || stats().sweep || stats().pass); i++) {
        advance(250);
        gx_tick(D);
    }
    assert_int_equal(stats().sweep, 0);
}

/* Member 2 holds 600 keys and tells this node of all of them. After
 * bursts of joins, leaves and a restart, the sweep keeps exactly the
 * entries this node owns for the view (first by counting each entry,
 * then by replaying only the changes); when the holder leaves, every
 * entry of its goes. The one chunk held here is its own entry when this
 * node owns it (its pass tells this node). */
static void test_sweep_keeps_what_it_owns(void **state)
{
    (void)state;
    enum { NKEYS = 600 };
    kvt_key *k = calloc(NKEYS, sizeof *k);
    uint8_t own1[NKEYS], own2[NKEYS];
    uint64_t nsh = gx_ns_hash(NS);
    ProtobufCBinaryData kb[1];
    protobuf_c_boolean dr = 0;
    for (uint32_t i = 0; i < NKEYS; i++) {
        k[i] = td_key(50000 + i);
        kb[0] = (ProtobufCBinaryData){KVT_KEY_LEN, k[i].b};
        uint64_t cs = 77, sz = 4096;
        Kvtier__PeerIndex ix = KVTIER__PEER_INDEX__INIT;
        ix.n_keys = ix.n_ns_hash = ix.n_drop = ix.n_checksum = ix.n_size = 1;
        ix.keys = kb, ix.ns_hash = &nsh, ix.drop = &dr, ix.checksum = &cs, ix.size = &sz;
        Kvtier__PeerMsg pm = KVTIER__PEER_MSG__INIT;
        pm.body_case = KVTIER__PEER_MSG__BODY_INDEX;
        pm.index = &ix;
        gx_on_index(D, cl_find(D->cl, 2), &pm);
    }
    run_pass();
    uint64_t all = entries();
    set_live(3, 0), set_live(9, 1), set_live(10, 1), set_live(5, 0);
    gx_membership(D, 6, 1);                     /* 6 restarted: no view change */
    set_live(11, 1), set_live(9, 0);
    advance(250);
    gx_tick(D);
    assert_true(entries() >= all);              /* not settled: all kept */
    run_sweep();
    uint32_t n1 = owned_of(k, NKEYS, nsh, own1);
    assert_true(n1 > 0 && n1 < NKEYS);
    assert_int_equal(entries(), n1 + owned_of(Keys, 1, nsh, NULL));
    set_live(12, 1), set_live(4, 0), set_live(7, 0), set_live(3, 1);
    run_sweep();                                /* replayed, not counted anew */
    owned_of(k, NKEYS, nsh, own2);
    uint32_t both = 0;                          /* what was dropped stays dropped */
    for (uint32_t i = 0; i < NKEYS; i++) both += own1[i] && own2[i];
    assert_true(both > 0);
    assert_int_equal(entries(), both + owned_of(Keys, 1, nsh, NULL));
    set_live(2, 0);                             /* the holder leaves */
    run_sweep();
    assert_int_equal(entries(), owned_of(Keys, 1, nsh, NULL));
    free(k);
}

static int setup_leave(void **state)
{
    (void)state;
    return setup_wired(6, 200, 2, 6);
}

/* Member 2 holds 200 keys and told this node of those it owns; this node
 * leaves: each entry it owns goes to the member ranked next, naming
 * member 2 as the holder. */
static void test_leave_hands_off(void **state)
{
    (void)state;
    run_pass();
    drain_all(NULL);
    forget_told();
    uint32_t v[WM + 1], nv = view_ids(v), o[OW_MAX_REPLICAS + 1], owned = 0;
    ProtobufCBinaryData kb[1];
    uint64_t nsh = gx_ns_hash(NS);
    protobuf_c_boolean dr = 0;
    for (uint32_t i = 0; i < NSlots; i++) {
        uint32_t n = owners_of(&Keys[i], nsh, v, nv, 2, o);
        if (!in_set(o, n, 1)) continue;
        kb[0] = (ProtobufCBinaryData){KVT_KEY_LEN, Keys[i].b};
        uint64_t cs = 77, sz = 4096;
        Kvtier__PeerIndex ix = KVTIER__PEER_INDEX__INIT;
        ix.n_keys = ix.n_ns_hash = ix.n_drop = ix.n_checksum = ix.n_size = 1;
        ix.keys = kb, ix.ns_hash = &nsh, ix.drop = &dr, ix.checksum = &cs, ix.size = &sz;
        Kvtier__PeerMsg pm = KVTIER__PEER_MSG__INIT;
        pm.body_case = KVTIER__PEER_MSG__BODY_INDEX;
        pm.index = &ix;
        assert_null(gx_check(D, cl_find(D->cl, 2), &pm));
        gx_on_index(D, cl_find(D->cl, 2), &pm);
        owned++;
    }
    assert_true(owned > 0);
    uint64_t handed0 = stats().handed;
    assert_int_equal(gx_leave(D), (int)owned);
    assert_int_equal(stats().handed - handed0, owned);
    drain_all(NULL);
    for (uint32_t i = 0; i < NSlots; i++) {
        uint32_t n = owners_of(&Keys[i], nsh, v, nv, 3, o);
        if (!in_set(o, 2, 1)) continue;
        assert_int_equal(n, 3);
        assert_true(Told[o[2]][i]);          /* the one taking our place */
        assert_int_equal(HeldBy[o[2]][i], 2); /* names the holder */
    }
}

/* A hand-off naming holder 0, or fewer holders than keys, is refused. */
static void test_handoff_malformed_refused(void **state)
{
    (void)state;
    ProtobufCBinaryData kb[2] = {{KVT_KEY_LEN, K[0].b}, {KVT_KEY_LEN, K[1].b}};
    uint64_t nsh[2] = {1, 1};
    protobuf_c_boolean dr[2] = {0, 0};
    uint32_t holder[2] = {3, 0};
    uint64_t cs[2] = {77, 77}, sz[2] = {4096, 4096};
    Kvtier__PeerIndex ix = KVTIER__PEER_INDEX__INIT;
    ix.n_keys = ix.n_ns_hash = ix.n_drop = ix.n_checksum = ix.n_size = 2;
    ix.keys = kb, ix.ns_hash = nsh, ix.drop = dr, ix.holder = holder, ix.n_holder = 2;
    ix.checksum = cs, ix.size = sz;
    Kvtier__PeerMsg pm = KVTIER__PEER_MSG__INIT;
    pm.body_case = KVTIER__PEER_MSG__BODY_INDEX;
    pm.index = &ix;
    struct member *m2 = cl_find(D->cl, 2);
    assert_non_null(gx_check(D, m2, &pm));   /* holder 0 */
    ix.n_holder = 1;
    assert_non_null(gx_check(D, m2, &pm));   /* one holder for two keys */
    holder[1] = 3, ix.n_holder = 2;
    assert_null(gx_check(D, m2, &pm));
}

/* A holder marked dead and back (restarted, or wrongly suspected) before
 * the view settled tells its owners again what it holds; the sweep that
 * later applies its departure drops only what it held before it left,
 * never what it told since, so its keys stay found. */
static void test_holder_back_before_settled_stays_found(void **state)
{
    (void)state;
    struct member *m2 = cl_find(D->cl, 2);
    index_from(m2, 0, 8, 0);
    struct member *m3 = add_member(3);           /* a member comes and goes */
    gx_membership(D, 3, 1);
    m3->state = KVTIER__PEER_STATE__PEER_DEAD;
    gx_membership(D, 3, 0);
    start_ms -= D->cfg.cluster_failure_ms;       /* settled: the sweep counts */
    gx_tick(D);                                  /* the entries (seen once) */
    assert_int_equal(lookup(0, 8, NULL), 8);
    m2->state = KVTIER__PEER_STATE__PEER_DEAD;   /* kill -9 */
    gx_membership(D, 2, 0);
    gx_tick(D);                                  /* not settled: nothing swept */
    assert_int_equal(lookup(0, 8, NULL), 0);
    m2->state = KVTIER__PEER_STATE__PEER_ALIVE;  /* back, tells keys 0..5 again */
    gx_membership(D, 2, 1);
    index_from(m2, 0, 6, 0);
    assert_int_equal(lookup(0, 6, NULL), 6);
    start_ms -= D->cfg.cluster_failure_ms;       /* the view has settled */
    for (int i = 0; i < 3; i++) gx_tick(D);
    assert_int_equal(lookup(0, 8, NULL), 6);     /* what it told since: kept */
    assert_int_equal(entries(), 6);              /* what it did not: gone */
    m2->state = KVTIER__PEER_STATE__PEER_DEAD;   /* and a later departure */
    gx_membership(D, 2, 0);
    start_ms -= D->cfg.cluster_failure_ms;
    gx_tick(D);
    assert_int_equal(entries(), 0);              /* still drops it all */
}

/* The member table has no cap: 5000 members (past the old 1024) are each
 * found by id, pointers stay where they were as the table grows, and
 * after every other one is dropped the rest are still found and the
 * dropped are not. */
static void test_member_table_grows_and_finds(void **state)
{
    (void)state;
    enum { M = 5000, BASE = 100000 };
    static struct member *at[M];
    uint32_t n0 = D->cl->n;
    for (uint32_t i = 0; i < M; i++) at[i] = add_member(BASE + i);
    assert_int_equal(D->cl->n, n0 + M);
    for (uint32_t i = 0; i < M; i++) assert_ptr_equal(cl_find(D->cl, BASE + i), at[i]);
    for (uint32_t i = 0; i < M; i += 2) cl_member_drop(D->cl, at[i]);
    assert_int_equal(D->cl->n, n0 + M / 2);
    for (uint32_t i = 0; i < M; i++) {
        struct member *m = cl_find(D->cl, BASE + i);
        if (i % 2) assert_ptr_equal(m, at[i]);
        else assert_null(m);
    }
    for (uint32_t i = 0; i < D->cl->n; i++) assert_int_equal(D->cl->m[i]->slot, i);
    for (uint32_t i = 1; i < M; i += 2) cl_member_drop(D->cl, at[i]);
    assert_int_equal(D->cl->n, n0);
    assert_non_null(cl_find(D->cl, 2)); /* the fixture's member is untouched */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_holders_found_drops_and_dead_missed),
        cmocka_unit_test(test_malformed_refused),
        cmocka_unit_test(test_committer_checksum_and_cap),
        cmocka_unit_test(test_handoff_malformed_refused),
        cmocka_unit_test(test_unowned_kept_until_settled),
        cmocka_unit_test(test_delta_single_change_vs_brute_force),
        cmocka_unit_test(test_delta_sequences_vs_brute_force),
        cmocka_unit_test(test_member_table_grows_and_finds),
    };
    const struct CMUnitTest wired[] = {
        cmocka_unit_test_setup_teardown(test_join_moves_only_what_changed, setup_join,
                                        teardown_wired),
        cmocka_unit_test_setup_teardown(test_batches_follow_owners, setup_join,
                                        teardown_wired),
        cmocka_unit_test_setup_teardown(test_rolling_restart_leaves_no_slot_unvisited,
                                        setup_rolling, teardown_wired),
        cmocka_unit_test_setup_teardown(test_churn_never_starves_a_slot, setup_churn,
                                        teardown_wired),
        cmocka_unit_test_setup_teardown(test_leave_hands_off, setup_leave, teardown_wired),
        cmocka_unit_test_setup_teardown(test_sweep_keeps_what_it_owns, setup_sweep,
                                        teardown_wired),
    };
    const struct CMUnitTest rejoin[] = {
        cmocka_unit_test_setup_teardown(test_holder_back_before_settled_stays_found, setup,
                                        teardown),
    };
    int rc = cmocka_run_group_tests(tests, setup, teardown);
    rc |= cmocka_run_group_tests(rejoin, NULL, NULL);
    return rc | cmocka_run_group_tests(wired, NULL, NULL);
}
