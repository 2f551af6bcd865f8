/*
 * test_gidx.c -- the global index (gidx.c) in process, over a member table
 * built by hand (no sockets: messages to members go nowhere): holders
 * published by a member are found by a LOOKUP that this node can answer
 * as an owner; drops and dead holders are misses; malformed index
 * messages are refused; a holder whose checksum differs from the first
 * holder's is not added, nor one past cluster.index_max_per_peer; after a membership change an owner keeps and
 * answers from entries it no longer owns until the view has settled
 * (cluster.failure_timeout_ms), then drops them (issue 10). A LOOKUP that
 * would have to wait on another owner cannot park here (no park table),
 * so it is answered with what this node knows, which is what is checked.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "peer/cluster_int.h"
#include "daemon.h"
#include "kvtierd.h"
#include "log.h"

#define NS "g/ns"
#define NK 64

static struct kvtierd *D;
static kvt_key K[NK];

static struct member *add_member(uint32_t id)
{
    struct member *m = &D->cl->m[D->cl->n++];
    memset(m, 0, sizeof *m);
    m->id = id;
    snprintf(m->addr, sizeof m->addr, "tcp://127.0.0.1:%u", 40000 + id);
    m->state = KVTIER__PEER_STATE__PEER_ALIVE;
    return m;
}

static int setup(void **state)
{
    (void)state;
    D = calloc(1, sizeof *D);
    config_defaults(&D->cfg);
    D->cfg.cluster_failure_ms = 3000;
    D->start_ms = now_ms();
    log_set_level(LOG_ERROR);
    if (idx_init(&D->idx, 1024) != 0) return -1;
    D->cl = calloc(1, sizeof *D->cl);
    D->cl->m = calloc(CL_MAX_MEMBERS, sizeof *D->cl->m);
    D->cl->self_id = 1;
    add_member(2);
    for (int i = 0; i < NK; i++) K[i] = td_key(500 + (uint64_t)i);
    return gx_open(D);
}

static int teardown(void **state)
{
    (void)state;
    gx_close(D);
    free(D->cl->m);
    free(D->cl);
    idx_destroy(&D->idx);
    ns_free(&D->ns);
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
    D->cl->n--;                                   /* node 3 leaves the table */
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
    assert_int_equal(lookup(0, 8, NULL), 0);
    m2->state = KVTIER__PEER_STATE__PEER_ALIVE;
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
        gx_membership(D);
    }
    gx_tick(D);                                  /* republish, sweep */
    assert_int_equal(entries(), NK);             /* kept: not settled */
    assert_int_equal(lookup(0, NK, NULL), NK);   /* asked here as before */
    D->start_ms -= D->cfg.cluster_failure_ms;    /* the view has settled */
    gx_tick(D);
    uint64_t kept = entries();
    assert_true(kept > 0 && kept < NK);          /* only what it owns now */
    assert_int_equal(lookup(0, NK, NULL), (int)kept); /* the rest: ask owners */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_holders_found_drops_and_dead_missed),
        cmocka_unit_test(test_malformed_refused),
        cmocka_unit_test(test_committer_checksum_and_cap),
        cmocka_unit_test(test_unowned_kept_until_settled),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
