/*
 * fuzz_swim.c -- the embedded membership's decoder and merge rules
 * (tiers/peer/swim.c, tiers/peer/member.c): any bytes handed to
 * mb_receive() of a real swim instance that knows a few members, then a
 * few protocol periods of timers. Whatever arrives, the member table must
 * stay consistent (every member found by its id, addresses terminated,
 * metadata within bounds, no member with id 0 or this node's id), this
 * node's incarnation may only grow, and nothing may leak.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_target.h"
#include "kvtier.pb-c.h"
#include "peer/member.h"
#include "peer/swim.h"

const char fuzz_target_name[] = "swim";

static uint64_t now_ms, rng;

static int discard(void *ctx, const char *addr, const void *buf, size_t len)
{
    (void)ctx;
    (void)addr;
    (void)buf;
    (void)len;
    return 0;
}
static uint64_t clock_ms(void *ctx) { return (void)ctx, now_ms; }
static uint64_t rnd(void *ctx) { return (void)ctx, rng = rng * 6364136223846793005ull + 1; }

static struct mb *instance(void)
{
    struct mb_config c = {0};
    c.self_id = 1;
    c.self_addr = "tcp://10.0.0.1:7000";
    c.meta = "ucx";
    c.meta_len = 3;
    c.inc = 1000;
    c.env = (struct mb_env){NULL, discard, clock_ms, rnd, NULL};
    struct mb *mb = mb_create(&swim_ops, &c, NULL);
    if (!mb) abort();
    for (uint32_t id = 2; id <= 5; id++) {
        char a[32];
        snprintf(a, sizeof a, "tcp://10.0.0.%u:7000", (unsigned)id);
        mb_add(mb, id, a, NULL, 0, 10, MB_ALIVE);
    }
    return mb;
}

static void check(struct mb *mb)
{
    if (mb_self(mb)->inc < 1000) abort();
    for (size_t i = 0; i < mb_count(mb); i++) {
        struct mb_member *m = mb_at(mb, i);
        if (!m->id || m->id == 1 || mb_find(mb, m->id) != m) abort();
        if (strnlen(m->addr, MB_ADDR_MAX) == MB_ADDR_MAX) abort();
        if (m->meta_len > MB_META_MAX || (unsigned)m->state >= MB_NSTATES) abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    now_ms = 5000;
    rng = 7;
    struct mb *mb = instance();
    mb_receive(mb, data, size, now_ms);
    check(mb);
    for (int i = 0; i < 8; i++) {
        now_ms += 700;
        mb_tick(mb, now_ms);
        mb_receive(mb, data, size, now_ms); /* the same bytes again, later */
        check(mb);
    }
    mb_destroy(mb);
    return 0;
}

static void pack_keep(Kvtier__SwimMsg *m, void (*keep)(const uint8_t *b, size_t n))
{
    uint8_t buf[1024];
    size_t n = kvtier__swim_msg__get_packed_size(m);
    if (n > sizeof buf) abort();
    kvtier__swim_msg__pack(m, buf);
    keep(buf, n);
}

void fuzz_target_seeds(void (*keep)(const uint8_t *b, size_t n))
{
    Kvtier__SwimMember cl[3], *cp[3] = {&cl[0], &cl[1], &cl[2]};
    for (int i = 0; i < 3; i++) kvtier__swim_member__init(&cl[i]);
    cl[0].id = 6, cl[0].incarnation = 3, cl[0].addr = "tcp://10.0.0.6:7000";
    cl[0].meta = (ProtobufCBinaryData){4, (uint8_t *)"meta"};
    cl[1].id = 2, cl[1].incarnation = 10, cl[1].state = KVTIER__SWIM_STATE__SWIM_SUSPECT;
    cl[1].from = 3, cl[1].addr = "";
    cl[2].id = 1, cl[2].incarnation = 1000, cl[2].state = KVTIER__SWIM_STATE__SWIM_DEAD;
    cl[2].from = 4, cl[2].addr = "";
    Kvtier__SwimMsg m = KVTIER__SWIM_MSG__INIT;
    m.from = 3;
    m.from_addr = "tcp://10.0.0.3:7000";
    m.gossip = cp;
    m.n_gossip = 3;
    Kvtier__SwimPing p = KVTIER__SWIM_PING__INIT;
    p.target = 1, p.seq = 9;
    m.body_case = KVTIER__SWIM_MSG__BODY_PING, m.ping = &p;
    pack_keep(&m, keep);
    Kvtier__SwimPingReq r = KVTIER__SWIM_PING_REQ__INIT;
    r.target = 4, r.target_addr = "tcp://10.0.0.4:7000", r.seq = 2;
    m.body_case = KVTIER__SWIM_MSG__BODY_PING_REQ, m.ping_req = &r;
    pack_keep(&m, keep);
    Kvtier__SwimAck a = KVTIER__SWIM_ACK__INIT;
    a.seq = 1;
    m.body_case = KVTIER__SWIM_MSG__BODY_ACK, m.ack = &a;
    m.n_gossip = 1;
    pack_keep(&m, keep);
    Kvtier__SwimSync s = KVTIER__SWIM_SYNC__INIT;
    s.reply = 1, s.join = 1, s.members = cp, s.n_members = 3;
    m.body_case = KVTIER__SWIM_MSG__BODY_SYNC, m.sync = &s;
    m.n_gossip = 0;
    pack_keep(&m, keep);
}

void fuzz_target_done(void) {}
