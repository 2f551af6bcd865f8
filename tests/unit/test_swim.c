/*
 * test_swim.c -- the member table (member.c) and the embedded SWIM backend
 * (swim.c): single instances fed crafted messages through a capturing
 * transport, and clusters of instances on the in-memory network of
 * tests/sim/simnet.c (virtual time: deterministic, no waiting).
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "gossipq.h"
#include "kvtier.pb-c.h"
#include "member.h"
#include "simnet.h"
#include "swim.h"

/* ------------------------------------------------ a capturing transport */

struct cap {
    uint64_t now, rng;
    int n, refuse;                    /* refuse: every send fails */
    size_t len[512];
    char to[512][MB_ADDR_MAX];
    uint8_t *buf[512];
    int events[MB_NEVENTS];
};

static int cap_send(void *ctx, const char *addr, const void *buf, size_t len)
{
    struct cap *c = ctx;
    if (c->n == 512 || c->refuse) return -1;
    c->buf[c->n] = malloc(len ? len : 1);
    memcpy(c->buf[c->n], buf, len);
    c->len[c->n] = len;
    strcpy(c->to[c->n], addr);
    c->n++;
    return 0;
}
static uint64_t cap_now(void *ctx) { return ((struct cap *)ctx)->now; }
static uint64_t cap_rand(void *ctx) { return ++((struct cap *)ctx)->rng * 2654435761u; }

static void cap_clear(struct cap *c)
{
    for (int i = 0; i < c->n; i++) free(c->buf[i]);
    c->n = 0;
}

static void cap_event(void *arg, struct mb *mb, struct mb_member *m, enum mb_event ev,
                      enum mb_state old)
{
    (void)mb;
    (void)m;
    (void)old;
    ((struct cap *)arg)->events[ev]++;
}

static struct mb *one(struct cap *c, const struct mb_ops *ops)
{
    struct mb_config cfg = {0};
    cfg.self_id = 1;
    cfg.self_addr = "sim://self";
    cfg.inc = 100;
    cfg.on_change = cap_event;
    cfg.on_change_arg = c;
    cfg.env = (struct mb_env){c, cap_send, cap_now, cap_rand, NULL};
    struct mb *mb = mb_create(ops, &cfg, NULL);
    assert_non_null(mb);
    return mb;
}

/* Feed mb one message from node `from` carrying claims[0..n). */
static void feed(struct mb *mb, uint32_t from, Kvtier__SwimMember **claims, size_t n,
                 int sync, uint64_t rx)
{
    Kvtier__SwimMsg msg = KVTIER__SWIM_MSG__INIT;
    Kvtier__SwimSync s = KVTIER__SWIM_SYNC__INIT;
    Kvtier__SwimGossipOnly g = KVTIER__SWIM_GOSSIP_ONLY__INIT;
    char addr[32];
    snprintf(addr, sizeof addr, "sim://%u", (unsigned)from);
    msg.from = from;
    msg.from_addr = addr;
    if (sync) {
        s.members = claims;
        s.n_members = n;
        msg.body_case = KVTIER__SWIM_MSG__BODY_SYNC;
        msg.sync = &s;
    } else {
        msg.gossip = claims;
        msg.n_gossip = n;
        msg.body_case = KVTIER__SWIM_MSG__BODY_GOSSIP_ONLY;
        msg.gossip_only = &g;
    }
    size_t len = kvtier__swim_msg__get_packed_size(&msg);
    uint8_t *buf = malloc(len);
    kvtier__swim_msg__pack(&msg, buf);
    mb_receive(mb, buf, len, rx);
    free(buf);
}

static void claim(Kvtier__SwimMember *c, uint32_t id, int st, uint64_t inc, uint32_t from,
                  char *addr)
{
    kvtier__swim_member__init(c);
    c->id = id;
    c->state = (Kvtier__SwimState)st;
    c->incarnation = inc;
    c->from = from;
    c->addr = addr;
}

/* n members, ids 2..n+1 at sim://<id>, alive at incarnation 3, fed to mb
 * at once from node 2; the claims stay usable for more feeds. */
struct crowd {
    Kvtier__SwimMember *cl, **cp;
    char (*addr)[32];
};

static struct crowd crowd_feed(struct mb *mb, uint32_t n)
{
    struct crowd w = {calloc(n, sizeof *w.cl), calloc(n, sizeof *w.cp), calloc(n, 32)};
    assert_true(w.cl && w.cp && w.addr);
    for (uint32_t i = 0; i < n; i++) {
        snprintf(w.addr[i], 32, "sim://%u", (unsigned)i + 2);
        claim(&w.cl[i], i + 2, MB_ALIVE, 3, i + 2, w.addr[i]);
        w.cp[i] = &w.cl[i];
    }
    feed(mb, 2, w.cp, n, 0, 0);
    return w;
}

static void crowd_free(struct crowd *w)
{
    free(w->cl);
    free(w->cp);
    free(w->addr);
}

/* ------------------------------------------------------- member table */

static const struct mb_ops bare_ops = {.name = "bare"};

static void test_table_grows_and_shrinks(void **state)
{
    (void)state;
    struct cap c = {0};
    struct mb *mb = one(&c, &bare_ops);
    enum { N = 5000 };
    for (uint32_t id = 2; id < N + 2; id++)
        assert_non_null(mb_add(mb, id, "sim://x", "m", 1, 7, MB_ALIVE));
    assert_null(mb_add(mb, 77, "sim://x", NULL, 0, 1, MB_ALIVE)); /* present */
    assert_null(mb_add(mb, 1, "sim://x", NULL, 0, 1, MB_ALIVE));  /* self */
    assert_int_equal(mb_count(mb), N);
    assert_int_equal(c.events[MB_EV_JOIN], N);
    uint64_t e0 = mb_epoch(mb);
    for (uint32_t id = 3; id < N + 2; id += 2) mb_remove(mb, mb_find(mb, id));
    for (uint32_t id = 2; id < N + 2; id++) {
        struct mb_member *m = mb_find(mb, id);
        if (id % 2) assert_null(m);
        else assert_true(m && m->id == id && m->meta_len == 1);
    }
    assert_int_equal(mb_count(mb), N / 2);
    assert_int_equal(mb_live(mb), N / 2);
    assert_int_equal(c.events[MB_EV_GONE], N / 2);
    assert_true(mb_epoch(mb) > e0);
    struct mb_member *m = mb_find(mb, 2);
    mb_set_state(mb, m, MB_DEAD, 7);
    assert_int_equal(mb_stats(mb)->members[MB_DEAD], 1);
    mb_set_state(mb, m, MB_ALIVE, 8); /* back with a newer incarnation */
    assert_int_equal(mb_stats(mb)->false_deaths, 1);
    assert_int_equal(c.events[MB_EV_ALIVE], 1);
    mb_destroy(mb);
    assert_int_equal(c.events[MB_EV_GONE], N);
    cap_clear(&c);
}

static void test_bad_config(void **state)
{
    (void)state;
    struct cap c = {0};
    struct mb_config cfg = {0};
    const char *why = NULL;
    cfg.self_addr = "sim://a";
    cfg.env = (struct mb_env){&c, cap_send, cap_now, cap_rand, NULL};
    assert_null(mb_create(&swim_ops, &cfg, &why)); /* id 0 */
    assert_non_null(why);
    cfg.self_id = 5;
    cfg.meta_len = MB_META_MAX + 1;
    cfg.meta = "x";
    assert_null(mb_create(&swim_ops, &cfg, &why));
}

/* ------------------------------------------------------ swim, one node */

static void test_refutes_suspicion_of_itself(void **state)
{
    (void)state;
    struct cap c = {0};
    struct mb *mb = one(&c, &swim_ops);
    char a2[] = "sim://2";
    Kvtier__SwimMember cl[2], *cp[2] = {&cl[0], &cl[1]};
    claim(&cl[0], 2, MB_ALIVE, 5, 2, a2);
    claim(&cl[1], 1, MB_SUSPECT, 100, 2, a2); /* "you are suspect" */
    feed(mb, 2, cp, 2, 0, 0);
    assert_int_equal(mb_self(mb)->inc, 101);
    assert_int_equal(mb_stats(mb)->refutations, 1);
    assert_true(mb_stats(mb)->health > 0); /* Lifeguard: maybe it is us */
    /* The refutation goes out with the next message. */
    c.now = 5000;
    mb_tick(mb, c.now);
    assert_true(c.n > 0);
    Kvtier__SwimMsg *m = kvtier__swim_msg__unpack(NULL, c.len[0], c.buf[0]);
    assert_non_null(m);
    int seen = 0;
    for (size_t i = 0; i < m->n_gossip; i++)
        seen |= m->gossip[i]->id == 1 && m->gossip[i]->state == KVTIER__SWIM_STATE__SWIM_ALIVE &&
                m->gossip[i]->incarnation == 101;
    assert_true(seen);
    kvtier__swim_msg__free_unpacked(m, NULL);
    /* An old claim (below the incarnation) changes nothing. */
    claim(&cl[1], 1, MB_DEAD, 50, 2, a2);
    feed(mb, 2, &cp[1], 1, 0, 0);
    assert_int_equal(mb_self(mb)->inc, 101);
    cap_clear(&c);
    mb_destroy(mb);
}

/* A member that went down after the tick's clock was read (the env clock
 * moved on while the tick ran: a busy or preempted core) is kept reap_ms
 * like any other, not reaped at that tick: now - since_ms must not wrap. */
static void test_fresh_death_not_reaped(void **state)
{
    (void)state;
    struct cap c = {0};
    c.now = 1000;
    struct mb *mb = one(&c, &swim_ops);
    char a2[] = "sim://2";
    Kvtier__SwimMember cl, *cp = &cl;
    claim(&cl, 2, MB_ALIVE, 5, 2, a2);
    feed(mb, 2, &cp, 1, 0, c.now);
    c.now = 5000;
    claim(&cl, 2, MB_LEFT, 5, 2, a2);
    feed(mb, 2, &cp, 1, 0, c.now);
    assert_int_equal(mb_find(mb, 2)->state, MB_LEFT);
    mb_tick(mb, 4999); /* a tick whose clock was read just before */
    assert_non_null(mb_find(mb, 2));
    assert_int_equal(c.events[MB_EV_GONE], 0);
    c.now = 5000 + 60000; /* reap_ms (60 s) later: now it goes */
    mb_tick(mb, c.now);
    assert_null(mb_find(mb, 2));
    assert_int_equal(c.events[MB_EV_GONE], 1);
    cap_clear(&c);
    mb_destroy(mb);
}

static void test_precedence(void **state)
{
    (void)state;
    struct cap c = {0};
    struct mb *mb = one(&c, &swim_ops);
    char a3[] = "sim://3";
    Kvtier__SwimMember cl, *cp = &cl;
    claim(&cl, 3, MB_ALIVE, 10, 3, a3);
    feed(mb, 3, &cp, 1, 0, 0);
    struct mb_member *m = mb_find(mb, 3);
    assert_true(m && m->state == MB_ALIVE);
    claim(&cl, 3, MB_SUSPECT, 10, 4, a3);  /* suspect at equal inc wins */
    feed(mb, 4, &cp, 1, 0, 0);
    assert_int_equal(m->state, MB_SUSPECT);
    claim(&cl, 3, MB_ALIVE, 10, 3, a3);    /* alive at equal inc does not */
    feed(mb, 3, &cp, 1, 0, 0);
    assert_int_equal(m->state, MB_SUSPECT);
    claim(&cl, 3, MB_ALIVE, 11, 3, a3);    /* a refutation does */
    feed(mb, 3, &cp, 1, 0, 0);
    assert_int_equal(m->state, MB_ALIVE);
    claim(&cl, 3, MB_DEAD, 11, 4, a3);     /* from a sync: only suspect */
    feed(mb, 4, &cp, 1, 1, 0);
    assert_int_equal(m->state, MB_SUSPECT);
    claim(&cl, 3, MB_DEAD, 11, 4, a3);     /* gossiped: dead once suspected */
    feed(mb, 4, &cp, 1, 0, 0);             /* long enough (see test_stale_death) */
    assert_int_equal(m->state, MB_SUSPECT);
    c.now = 3000;                          /* the minimum suspicion timeout */
    mb_tick(mb, c.now);
    assert_int_equal(m->state, MB_DEAD);
    claim(&cl, 3, MB_SUSPECT, 11, 4, a3);  /* nothing revives or re-suspects */
    feed(mb, 4, &cp, 1, 0, 0);
    assert_int_equal(m->state, MB_DEAD);
    assert_int_equal(c.events[MB_EV_DEAD], 1);
    cap_clear(&c);
    mb_destroy(mb);
}

/* A death claim ends a suspicion this node has held for the minimum
 * suspicion timeout; it never kills a member this node held alive (a
 * stale claim, e.g. from across a partition that just healed): that
 * member gets the timeout to refute. */
static void test_stale_death(void **state)
{
    (void)state;
    struct cap c = {0};
    struct mb *mb = one(&c, &swim_ops);
    char a3[] = "sim://3", a4[] = "sim://4";
    Kvtier__SwimMember cl[2], *cp[2] = {&cl[0], &cl[1]};
    claim(&cl[0], 3, MB_ALIVE, 10, 3, a3);
    claim(&cl[1], 4, MB_ALIVE, 20, 4, a4);
    feed(mb, 3, cp, 2, 0, 0);
    /* Node 4 is suspected (it crashed, say); node 3 is alive and well. */
    claim(&cl[0], 4, MB_SUSPECT, 20, 5, a4);
    feed(mb, 5, cp, 1, 0, 1000);
    c.now = 1000;
    /* A stale death of node 3 arrives: only a suspicion here. */
    claim(&cl[0], 3, MB_DEAD, 10, 6, a3);
    feed(mb, 6, cp, 1, 0, c.now);
    struct mb_member *m3 = mb_find(mb, 3), *m4 = mb_find(mb, 4);
    assert_int_equal(m3->state, MB_SUSPECT);
    assert_int_equal(c.events[MB_EV_DEAD], 0);
    /* Node 4's death, once this node has suspected it long enough: at once. */
    c.now = 4500;
    claim(&cl[0], 4, MB_DEAD, 20, 6, a4);
    feed(mb, 6, cp, 1, 0, c.now);
    assert_int_equal(m4->state, MB_DEAD);
    assert_int_equal(c.events[MB_EV_DEAD], 1);
    /* Node 3 refutes in time: never dead here. */
    claim(&cl[0], 3, MB_ALIVE, 11, 3, a3);
    feed(mb, 3, cp, 1, 0, c.now);
    assert_int_equal(m3->state, MB_ALIVE);
    c.now = 20000;
    mb_tick(mb, c.now);
    assert_int_equal(m3->state, MB_ALIVE);
    assert_int_equal(c.events[MB_EV_DEAD], 1);
    cap_clear(&c);
    mb_destroy(mb);
}

static void test_bad_input(void **state)
{
    (void)state;
    struct cap c = {0};
    struct mb *mb = one(&c, &swim_ops);
    uint8_t junk[64];
    for (size_t i = 0; i < sizeof junk; i++) junk[i] = (uint8_t)(i * 37 + 11);
    mb_receive(mb, junk, sizeof junk, 0);
    assert_int_equal(mb_stats(mb)->rx_bad, 1);
    /* A valid message, truncated. */
    char a2[] = "sim://2";
    Kvtier__SwimMember cl, *cp = &cl;
    claim(&cl, 2, MB_ALIVE, 5, 2, a2);
    Kvtier__SwimMsg msg = KVTIER__SWIM_MSG__INIT;
    Kvtier__SwimGossipOnly g = KVTIER__SWIM_GOSSIP_ONLY__INIT;
    msg.from = 2;
    msg.from_addr = a2;
    msg.gossip = &cp;
    msg.n_gossip = 1;
    msg.body_case = KVTIER__SWIM_MSG__BODY_GOSSIP_ONLY;
    msg.gossip_only = &g;
    uint8_t buf[256];
    size_t len = kvtier__swim_msg__pack(&msg, buf);
    mb_receive(mb, buf, len - 3, 0);
    assert_int_equal(mb_stats(mb)->rx_bad, 2);
    /* An address too long for the table, a sender without a body. */
    char longaddr[MB_ADDR_MAX + 10];
    memset(longaddr, 'a', sizeof longaddr - 1);
    longaddr[sizeof longaddr - 1] = 0;
    cl.addr = longaddr;
    len = kvtier__swim_msg__pack(&msg, buf);
    mb_receive(mb, buf, len, 0);
    assert_int_equal(mb_stats(mb)->rx_bad, 3);
    msg.body_case = KVTIER__SWIM_MSG__BODY__NOT_SET;
    msg.n_gossip = 0;
    len = kvtier__swim_msg__pack(&msg, buf);
    mb_receive(mb, buf, len, 0);
    assert_int_equal(mb_stats(mb)->rx_bad, 4);
    assert_int_equal(mb_count(mb), 0);
    mb_destroy(mb);
}

/* 300 members learned at once: every probe message stays within
 * max_msg_bytes, the gossip still drains. */
static void test_piggyback_bounded(void **state)
{
    (void)state;
    struct cap c = {0};
    struct mb *mb = one(&c, &swim_ops);
    enum { N = 300 };
    struct crowd w = crowd_feed(mb, N);
    assert_int_equal(mb_count(mb), N);
    size_t max = mb_cfg(mb)->max_msg_bytes, gossiped = 0;
    for (int t = 0; t < 40; t++) {
        c.now += 200;
        mb_tick(mb, c.now);
        for (int i = 0; i < c.n; i++) {
            Kvtier__SwimMsg *m = kvtier__swim_msg__unpack(NULL, c.len[i], c.buf[i]);
            assert_non_null(m);
            if (m->body_case != KVTIER__SWIM_MSG__BODY_SYNC) assert_true(c.len[i] <= max);
            gossiped += m->n_gossip;
            kvtier__swim_msg__free_unpacked(m, NULL);
        }
        cap_clear(&c);
    }
    assert_true(gossiped >= N); /* every claim went out at least once */
    crowd_free(&w);
    mb_destroy(mb);
}


/* ------------------------------------------------------- gossip queue */

/* Walk list tx: its ids in order (at most max), checking the links. */
static size_t gq_walk(const struct gq *q, uint32_t tx, uint32_t *ids, size_t max)
{
    size_t n = 0;
    for (const struct gq_claim *c = gq_first(q, tx); c; c = gq_next(q, c)) {
        assert_int_equal(c->tx, tx);
        assert_true(gq_find(q, c->id) == c);
        assert_true(n < max);
        ids[n++] = c->id;
    }
    return n;
}

/* Least-sent first, oldest first among equals; one claim per id, a new
 * claim about a queued id replacing it (sent 0 times, newest); dropped
 * once sent lim times. */
static void test_gossipq_order_and_dedup(void **state)
{
    (void)state;
    struct gq q;
    gq_init(&q);
    assert_null(gq_find(&q, 7));
    assert_null(gq_first(&q, 0));
    enum { N = 1000 };
    static uint32_t ids[N];
    for (uint32_t id = 1; id <= N; id++) gq_put(&q, id, MB_ALIVE, 1, "sim://x", NULL, 0, 9);
    assert_int_equal(gq_len(&q), N);
    assert_int_equal(gq_walk(&q, 0, ids, N), N);
    for (uint32_t i = 0; i < N; i++) assert_int_equal(ids[i], i + 1);
    for (uint32_t id = 10; id >= 1; id--) gq_sent(&q, id, 3); /* sent once, 10 first */
    assert_int_equal(gq_walk(&q, 0, ids, N), N - 10);
    assert_int_equal(ids[0], 11);
    assert_int_equal(gq_walk(&q, 1, ids, N), 10);
    for (uint32_t i = 0; i < 10; i++) assert_int_equal(ids[i], 10 - i);
    /* A newer claim about 500 (unsent) and about 5 (sent once): each the
     * newest of the unsent, still one claim each. */
    gq_put(&q, 500, MB_SUSPECT, 1, NULL, NULL, 0, 4);
    gq_put(&q, 5, MB_DEAD, 2, NULL, NULL, 0, 4);
    assert_int_equal(gq_len(&q), N);
    size_t n0 = gq_walk(&q, 0, ids, N);
    assert_int_equal(n0, N - 9);
    assert_int_equal(ids[n0 - 2], 500);
    assert_int_equal(ids[n0 - 1], 5);
    assert_int_equal(gq_find(&q, 5)->state, MB_DEAD);
    assert_int_equal(gq_find(&q, 5)->inc, 2);
    assert_int_equal(gq_walk(&q, 1, ids, N), 9);
    /* Sent lim = 3 times: gone, the rest still found. */
    for (int k = 0; k < 2; k++) gq_sent(&q, 10, 3);
    assert_null(gq_find(&q, 10));
    assert_int_equal(gq_len(&q), N - 1);
    for (uint32_t id = 1; id <= N; id++)
        if (id != 10) assert_non_null(gq_find(&q, id));
    /* lim falls to 1: everything sent once goes. */
    gq_trim(&q, 1);
    assert_int_equal(gq_len(&q), N - 9);
    assert_null(gq_first(&q, 1));
    gq_free(&q);
}

/* The claim owns copies of the address and metadata. */
static void test_gossipq_copies(void **state)
{
    (void)state;
    struct gq q;
    gq_init(&q);
    char addr[16] = "sim://3";
    uint8_t meta[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    struct gq_claim *c = gq_put(&q, 3, MB_ALIVE, 1, addr, meta, sizeof meta, 3);
    addr[0] = 'X';
    meta[0] = 99;
    assert_string_equal(c->addr, "sim://3");
    assert_int_equal(c->meta_len, 8);
    assert_int_equal(c->meta[0], 1);
    c = gq_put(&q, 3, MB_DEAD, 1, NULL, NULL, 0, 4);
    assert_string_equal(c->addr, "");
    assert_null(c->meta);
    assert_int_equal(c->meta_len, 0);
    gq_free(&q);
}

/* Random puts, sends and trims against a plain model: every claim found
 * with its state and count, each list in the order its claims entered it
 * (hash deletion and slot moves keep every entry reachable). */
static void test_gossipq_against_model(void **state)
{
    (void)state;
    enum { IDS = 600, LIM = 6, OPS = 40000 };
    static struct { int in; uint32_t tx; uint64_t inc, seq; } m[IDS + 1];
    memset(m, 0, sizeof m);
    static uint32_t ids[IDS];
    struct gq q;
    gq_init(&q);
    uint64_t rng = 12345, seq = 0;
    size_t in = 0;
    for (int op = 0; op < OPS; op++) {
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        uint32_t id = (uint32_t)(rng >> 33) % IDS + 1, kind = (uint32_t)(rng >> 20) % 16;
        if (kind < 7) { /* put */
            in += !m[id].in;
            m[id].in = 1;
            m[id].tx = 0;
            m[id].inc = (uint64_t)op;
            m[id].seq = ++seq;
            gq_put(&q, id * 2654435761u, MB_SUSPECT, (uint64_t)op, NULL, NULL, 0, 1);
        } else if (kind < 15) { /* sent */
            gq_sent(&q, id * 2654435761u, LIM);
            if (m[id].in && ++m[id].tx >= LIM) m[id].in = 0, in--;
            else if (m[id].in) m[id].seq = ++seq;
        } else if (op % 97 == 0) { /* lim went down to 4 */
            gq_trim(&q, 4);
            for (uint32_t i = 1; i <= IDS; i++)
                if (m[i].in && m[i].tx >= 4) m[i].in = 0, in--;
        }
        if (op % 1000) continue;
        assert_int_equal(gq_len(&q), in);
        size_t listed = 0;
        for (uint32_t l = 0; l < LIM; l++) {
            size_t n = gq_walk(&q, l, ids, IDS);
            listed += n;
            for (size_t i = 1; i < n; i++)
                assert_true(m[ids[i - 1] * 244002641u].seq < m[ids[i] * 244002641u].seq);
        }
        assert_int_equal(listed, in);
        for (uint32_t i = 1; i <= IDS; i++) {
            const struct gq_claim *c = gq_find(&q, i * 2654435761u);
            assert_int_equal(c != NULL, m[i].in);
            if (c) assert_int_equal(c->tx, m[i].tx);
            if (c) assert_int_equal(c->inc, m[i].inc);
        }
    }
    gq_free(&q);
}

/* Through swim.c: 300 members learned at once (300 claims queued, all
 * of one size: ids 200..499 at sim://<id>); the gossip that drains them
 * sends the least-sent first -- at every moment the send counts of the
 * claims differ by at most one -- and each exactly retransmit_mult *
 * log10(n + 1) times (probes and syncs kept out of the way: no suspicion
 * replaces a claim). */
static void test_gossip_least_sent_first(void **state)
{
    (void)state;
    struct cap c = {0};
    struct mb_config cfg = {0};
    cfg.self_id = 1;
    cfg.self_addr = "sim://self";
    cfg.inc = 100;
    cfg.probe_ms = 600000;
    cfg.sync_ms = 600000;
    cfg.env = (struct mb_env){&c, cap_send, cap_now, cap_rand, NULL};
    struct mb *mb = mb_create(&swim_ops, &cfg, NULL);
    assert_non_null(mb);
    enum { N = 300, ID0 = 200 };
    static Kvtier__SwimMember cl[N], *cp[N];
    static char addr[N][16];
    static uint32_t sent[N];
    memset(sent, 0, sizeof sent);
    for (uint32_t i = 0; i < N; i++) {
        snprintf(addr[i], sizeof addr[i], "sim://%u", (unsigned)(ID0 + i));
        claim(&cl[i], ID0 + i, MB_ALIVE, 3, ID0 + i, addr[i]);
        cp[i] = &cl[i];
    }
    feed(mb, ID0, cp, N, 0, 0);
    assert_int_equal(mb_count(mb), N);
    uint32_t lim = (uint32_t)ceil(4 * log10(N + 2.0)), lo = 0;
    for (int t = 0; t < 300; t++) {
        c.now += 100;
        mb_tick(mb, c.now);
        for (int i = 0; i < c.n; i++) {
            Kvtier__SwimMsg *m = kvtier__swim_msg__unpack(NULL, c.len[i], c.buf[i]);
            assert_non_null(m);
            for (size_t k = 0; k < m->n_gossip; k++) {
                uint32_t id = m->gossip[k]->id;
                assert_true(id >= ID0 && id < ID0 + N);
                assert_int_equal(m->gossip[k]->state, KVTIER__SWIM_STATE__SWIM_ALIVE);
                sent[id - ID0]++;
            }
            kvtier__swim_msg__free_unpacked(m, NULL);
            uint32_t min = UINT32_MAX, max = 0;
            for (uint32_t k = 0; k < N; k++) {
                min = sent[k] < min ? sent[k] : min;
                max = sent[k] > max ? sent[k] : max;
            }
            assert_true(max - min <= 1);
            lo = min;
        }
        cap_clear(&c);
    }
    assert_int_equal(lo, lim);
    for (uint32_t k = 0; k < N; k++) assert_int_equal(sent[k], lim);
    mb_destroy(mb);
}

/* Feed mb a table from node `from`: an answer (reply 0) or a request,
 * marked join or not. */
static void feed_table(struct mb *mb, uint32_t from, Kvtier__SwimMember **claims, size_t n,
                       int reply, int join)
{
    Kvtier__SwimMsg msg = KVTIER__SWIM_MSG__INIT;
    Kvtier__SwimSync s = KVTIER__SWIM_SYNC__INIT;
    char addr[32];
    snprintf(addr, sizeof addr, "sim://%u", (unsigned)from);
    msg.from = from;
    msg.from_addr = addr;
    s.members = claims;
    s.n_members = n;
    s.reply = reply != 0;
    s.join = join != 0;
    msg.body_case = KVTIER__SWIM_MSG__BODY_SYNC;
    msg.sync = &s;
    size_t len = kvtier__swim_msg__get_packed_size(&msg);
    uint8_t *buf = malloc(len);
    kvtier__swim_msg__pack(&msg, buf);
    mb_receive(mb, buf, len, 0);
    free(buf);
}

/* What the captured messages hold: alive claims about ids other than
 * self, self's own alive claims, gossip-only messages (those carrying
 * only self's claim, besides a buddy claim), and sync requests /
 * answers (with their join flag). */
struct seen {
    int others_alive, own, gossip_msgs, own_alone, sync_req, sync_ans, join_flag;
};

static struct seen look(struct cap *c)
{
    struct seen v = {0};
    for (int i = 0; i < c->n; i++) {
        Kvtier__SwimMsg *m = kvtier__swim_msg__unpack(NULL, c->len[i], c->buf[i]);
        assert_non_null(m);
        int own = 0, queued = 0;
        for (size_t k = 0; k < m->n_gossip; k++) {
            int alive = m->gossip[k]->state == KVTIER__SWIM_STATE__SWIM_ALIVE;
            own += alive && m->gossip[k]->id == 1;
            v.others_alive += alive && m->gossip[k]->id != 1;
            /* anything but its own claim and the buddy (the receiver's
             * suspicion or death, as held here) */
            queued += m->gossip[k]->id != 1 && !(k == 0 && !alive);
        }
        v.own += own;
        if (m->body_case == KVTIER__SWIM_MSG__BODY_GOSSIP_ONLY) {
            v.gossip_msgs++;
            v.own_alone += own == 1 && !queued;
        }
        if (m->body_case == KVTIER__SWIM_MSG__BODY_SYNC) {
            v.sync_req += m->sync->reply;
            v.sync_ans += !m->sync->reply;
            v.join_flag += m->sync->join;
        }
        kvtier__swim_msg__free_unpacked(m, NULL);
    }
    cap_clear(c);
    return v;
}

/* Join: the request is marked join, and so is the answer to one. The
 * joiner queues none of the members its seed's table taught it (the
 * seed's cluster knows them); SW_ANNOUNCE_PERIODS (3) periods later it
 * sends each of them one gossip-only message carrying its own claim and
 * nothing else, and pulls a second table from one of them. A table that
 * answers no join is gossiped on as before. */
static void test_join_answer_not_regossiped(void **state)
{
    (void)state;
    struct cap c = {0};
    struct mb *mb = one(&c, &swim_ops);
    const char *seeds[] = {"sim://2"};
    assert_int_equal(mb_join(mb, seeds, 1), 0);
    mb_tick(mb, c.now);
    struct seen v = look(&c);
    assert_int_equal(v.sync_req, 1);
    assert_int_equal(v.join_flag, 1);
    enum { N = 30 };
    Kvtier__SwimMember cl[N], *cp[N];
    char a[N][16];
    for (uint32_t i = 0; i < N; i++) {
        snprintf(a[i], sizeof a[i], "sim://%u", (unsigned)i + 2);
        claim(&cl[i], i + 2, MB_ALIVE, 1, 2, a[i]);
        cp[i] = &cl[i];
    }
    feed_table(mb, 2, cp, N, 0, 1); /* the seed's answer */
    assert_int_equal(mb_count(mb), N);
    int sent_alone = 0;
    uint64_t due = 3ull * mb_cfg(mb)->probe_ms; /* SW_ANNOUNCE_PERIODS */
    for (uint64_t t = 100; t <= due + 500; t += 100) {
        c.now = t;
        mb_tick(mb, c.now);
        v = look(&c);
        assert_int_equal(v.others_alive, 0); /* nothing of the seed's table */
        if (c.now < due) assert_int_equal(v.own_alone, 0);
        sent_alone += v.own_alone;
        if (v.own_alone) assert_int_equal(v.sync_req, 1); /* the second table */
    }
    assert_int_equal(sent_alone, N); /* each member told once */
    /* This node, asked for its table as a join's seed, answers marked. */
    Kvtier__SwimMember nc, *np = &nc;
    claim(&nc, 40, MB_ALIVE, 1, 40, "sim://40");
    feed_table(mb, 40, &np, 1, 1, 1);
    v = look(&c);
    assert_int_equal(v.sync_ans, 1);
    assert_int_equal(v.join_flag, 1);
    /* An answer to no join: the new member it brings is gossiped on. */
    Kvtier__SwimMember oc, *op = &oc;
    claim(&oc, 41, MB_ALIVE, 1, 41, "sim://41");
    feed_table(mb, 3, &op, 1, 0, 0);
    int others = 0;
    for (int t = 0; t < 5; t++) {
        c.now += 100;
        mb_tick(mb, c.now);
        others += look(&c).others_alive;
    }
    assert_true(others > 0);
    mb_destroy(mb);
}

/* A node that leaves before its announce tells nobody it is alive. */
static void test_leave_cancels_announce(void **state)
{
    (void)state;
    struct cap c = {0};
    struct mb *mb = one(&c, &swim_ops);
    const char *seeds[] = {"sim://2"};
    assert_int_equal(mb_join(mb, seeds, 1), 0);
    mb_tick(mb, c.now);
    cap_clear(&c);
    Kvtier__SwimMember cl[4], *cp[4];
    char a[4][16];
    for (uint32_t i = 0; i < 4; i++) {
        snprintf(a[i], sizeof a[i], "sim://%u", (unsigned)i + 2);
        claim(&cl[i], i + 2, MB_ALIVE, 1, 2, a[i]);
        cp[i] = &cl[i];
    }
    feed_table(mb, 2, cp, 4, 0, 1);
    assert_int_equal(mb_leave(mb), 0);
    cap_clear(&c);
    for (int t = 0; t < 50; t++) {
        c.now += 100;
        mb_tick(mb, c.now);
        assert_int_equal(look(&c).own, 0);
    }
    mb_destroy(mb);
}

/* Unpacking: a gossip message within max_msg_bytes whose claims need
 * more than the per-node arena (120 tiny claims: ~12 KB unpacked), and a
 * sync far larger than max_msg_bytes (its own block): every claim is
 * applied (the overflow goes to malloc; ASan checks the frees). */
static void test_unpack_past_arena(void **state)
{
    (void)state;
    struct cap c = {0};
    struct mb *mb = one(&c, &swim_ops);
    enum { N = 120, M = 2000 };
    static Kvtier__SwimMember cl[M], *cp[M];
    static char a[M][8];
    for (uint32_t i = 0; i < M; i++) {
        snprintf(a[i], sizeof a[i], "%u", (unsigned)i);
        claim(&cl[i], i + 2, MB_ALIVE, 1, 0, a[i]);
        cp[i] = &cl[i];
    }
    Kvtier__SwimMsg msg = KVTIER__SWIM_MSG__INIT;
    Kvtier__SwimGossipOnly g = KVTIER__SWIM_GOSSIP_ONLY__INIT;
    msg.from = 2;
    msg.from_addr = "0";
    msg.gossip = cp;
    msg.n_gossip = N;
    msg.body_case = KVTIER__SWIM_MSG__BODY_GOSSIP_ONLY;
    msg.gossip_only = &g;
    assert_true(kvtier__swim_msg__get_packed_size(&msg) <= mb_cfg(mb)->max_msg_bytes);
    feed(mb, 2, cp, N, 0, 0);
    assert_int_equal(mb_count(mb), N);
    feed(mb, 2, cp, M, 1, 0);
    assert_int_equal(mb_count(mb), M);
    assert_int_equal(mb_stats(mb)->rx_bad, 0);
    mb_destroy(mb);
}

/* A send the transport refuses (a member whose hello is not done) carried
 * nothing: its claims keep their send count and go out once sends pass.
 * Counted as sent, they were retired unsent and a member that missed them
 * waited for a push-pull sync (15-30 s at start-up). */
static void test_refused_send_keeps_claims(void **state)
{
    (void)state;
    struct cap c = {0};
    struct mb *mb = one(&c, &swim_ops);
    char a[3][16];
    Kvtier__SwimMember cl[3], *cp[3];
    for (uint32_t i = 0; i < 3; i++) {
        snprintf(a[i], sizeof a[i], "sim://%u", (unsigned)i + 2);
        claim(&cl[i], i + 2, MB_ALIVE, 1, i + 2, a[i]);
        cp[i] = &cl[i];
    }
    feed(mb, 2, cp, 3, 0, 0);
    c.refuse = 1; /* three gossip rounds: past every claim's retransmits,
                   * within the first probe period (no suspicion yet) */
    for (int t = 0; t < 6; t++) {
        c.now += 100;
        mb_tick(mb, c.now);
    }
    assert_true(mb_stats(mb)->tx_fail > 0);
    c.refuse = 0;
    size_t alive = 0;
    for (int t = 0; t < 20; t++) {
        c.now += 100;
        mb_tick(mb, c.now);
        for (int i = 0; i < c.n; i++) {
            Kvtier__SwimMsg *m = kvtier__swim_msg__unpack(NULL, c.len[i], c.buf[i]);
            assert_non_null(m);
            for (size_t k = 0; k < m->n_gossip; k++)
                alive += m->gossip[k]->id != 1 && (int)m->gossip[k]->state == MB_ALIVE;
            kvtier__swim_msg__free_unpacked(m, NULL);
        }
        cap_clear(&c);
    }
    assert_true(alive > 0); /* the claims fed in went out after all */
    mb_destroy(mb);
}

/* mb_ask: the daemon's hello with a node is done but gossip has not
 * brought its claim. One gossip-only message goes there with want_claim;
 * the node's answer (its own claim) makes it a member. Nothing once this
 * node has left, and nothing from a backend without the op. */
static void test_ask_brings_claim(void **state)
{
    (void)state;
    struct cap c = {0};
    struct mb *mb = one(&c, &swim_ops);
    mb_ask(mb, "sim://7");
    assert_int_equal(c.n, 1);
    assert_string_equal(c.to[0], "sim://7");
    Kvtier__SwimMsg *m = kvtier__swim_msg__unpack(NULL, c.len[0], c.buf[0]);
    assert_non_null(m);
    assert_int_equal(m->body_case, KVTIER__SWIM_MSG__BODY_GOSSIP_ONLY);
    assert_true(m->want_claim);
    kvtier__swim_msg__free_unpacked(m, NULL);
    cap_clear(&c);
    assert_null(mb_find(mb, 7));
    char a[] = "sim://7";
    Kvtier__SwimMember cl, *cp = &cl;
    claim(&cl, 7, MB_ALIVE, 5, 7, a);
    feed(mb, 7, &cp, 1, 0, 0);
    assert_non_null(mb_find(mb, 7));
    assert_int_equal(mb_find(mb, 7)->state, MB_ALIVE);
    assert_int_equal(mb_find(mb, 7)->inc, 5);
    mb_ask(mb, ""); /* no address: nothing */
    assert_int_equal(c.n, 0);
    assert_int_equal(mb_leave(mb), 0);
    cap_clear(&c);
    mb_ask(mb, "sim://8");
    assert_int_equal(c.n, 0);
    mb_destroy(mb);
    struct mb *bare = one(&c, &bare_ops);
    mb_ask(bare, "sim://8");
    assert_int_equal(c.n, 0);
    mb_destroy(bare);
    cap_clear(&c);
}

/* Lifeguard: independent confirmations bring the death sooner than one
 * lone suspicion (virtual time; compared, not timed). */
static uint64_t death_after(int confirmers)
{
    struct cap c = {0};
    struct mb *mb = one(&c, &swim_ops);
    char a[8][16];
    Kvtier__SwimMember cl[8], *cp[8];
    for (uint32_t i = 0; i < 8; i++) {
        snprintf(a[i], sizeof a[i], "sim://%u", (unsigned)i + 2);
        claim(&cl[i], i + 2, MB_ALIVE, 1, i + 2, a[i]);
        cp[i] = &cl[i];
    }
    feed(mb, 2, cp, 8, 0, 0);
    for (int k = 0; k < confirmers; k++) { /* "node 3 is suspect", from 4, 5, ... */
        claim(&cl[0], 3, MB_SUSPECT, 1, (uint32_t)k + 4, a[1]);
        feed(mb, (uint32_t)k + 4, cp, 1, 0, 0);
    }
    assert_int_equal(mb_find(mb, 3)->state, MB_SUSPECT);
    while (mb_find(mb, 3)->state == MB_SUSPECT && c.now < 1000000) {
        c.now += 100;
        mb_tick(mb, c.now);
        cap_clear(&c);
    }
    assert_int_equal(mb_find(mb, 3)->state, MB_DEAD);
    uint64_t t = c.now;
    mb_destroy(mb);
    return t;
}

static void test_confirmations_shorten_suspicion(void **state)
{
    (void)state;
    uint64_t lone = death_after(1), confirmed = death_after(4);
    assert_true(confirmed < lone);
}

/* Answer every Ping node 1 sent (captured in c) with an Ack from its
 * target, except those to `silent` (0: none); returns the target of the
 * last Ping answered, 0 if none. */
static uint32_t ack_pings_but(struct mb *mb, struct cap *c, uint32_t silent)
{
    uint32_t last = 0;
    for (int i = 0; i < c->n; i++) {
        Kvtier__SwimMsg *m = kvtier__swim_msg__unpack(NULL, c->len[i], c->buf[i]);
        assert_non_null(m);
        if (m->body_case == KVTIER__SWIM_MSG__BODY_PING && m->ping->target != silent) {
            Kvtier__SwimMsg r = KVTIER__SWIM_MSG__INIT;
            Kvtier__SwimAck a = KVTIER__SWIM_ACK__INIT;
            char addr[32];
            last = m->ping->target;
            snprintf(addr, sizeof addr, "sim://%u", (unsigned)last);
            a.seq = m->ping->seq;
            r.from = last;
            r.from_addr = addr;
            r.body_case = KVTIER__SWIM_MSG__BODY_ACK;
            r.ack = &a;
            size_t len = kvtier__swim_msg__get_packed_size(&r);
            uint8_t *buf = malloc(len);
            kvtier__swim_msg__pack(&r, buf);
            mb_receive(mb, buf, len, c->now);
            free(buf);
        }
        kvtier__swim_msg__free_unpacked(m, NULL);
    }
    cap_clear(c);
    return last;
}

static uint32_t ack_pings(struct mb *mb, struct cap *c) { return ack_pings_but(mb, c, 0); }

/* A member learned in the middle of a probe round is probed in that
 * round, not only after it: left for the next reshuffle, a member that
 * arrived late goes unprobed by this node for up to n periods, and a
 * crashed member that few nodes probe gathers few confirmations. */
static void test_new_member_joins_round(void **state)
{
    (void)state;
    struct cap c = {0};
    struct mb *mb = one(&c, &swim_ops);
    enum { N = 100, LATE = 1000 };
    Kvtier__SwimMember cl[N], *cp[N];
    char addr[N][32], late[] = "sim://1000";
    for (uint32_t i = 0; i < N; i++) {
        snprintf(addr[i], sizeof addr[i], "sim://%u", (unsigned)i + 2);
        claim(&cl[i], i + 2, MB_ALIVE, 3, i + 2, addr[i]);
        cp[i] = &cl[i];
    }
    feed(mb, 2, cp, N, 0, 0);
    int probed[LATE + 1] = {0}, fed = 0, twice = 0, late_at = -1;
    for (int p = 0; p < 3 * N && !twice; p++) {
        c.now += mb_cfg(mb)->probe_ms;
        mb_tick(mb, c.now);
        uint32_t t = ack_pings(mb, &c);
        if (!t) continue;
        twice = ++probed[t] > 1;
        if (t == LATE && late_at < 0) late_at = p;
        if (!fed) { /* the round has begun: now a member arrives */
            claim(&cl[0], LATE, MB_ALIVE, 3, LATE, late);
            feed(mb, 2, cp, 1, 0, c.now);
            fed = 1;
        }
    }
    assert_true(twice);             /* a second round began... */
    assert_true(late_at >= 0);      /* ...after the late member was probed */
    assert_int_equal(mb_find(mb, LATE)->state, MB_ALIVE);
    mb_destroy(mb);
}

/* A relay that cannot reach the target Nacks the origin while the
 * origin's probe is still open (within the rest of its period after the
 * PingReq), so a healthy origin does not count the Nack as missing. */
static void test_nack_in_time(void **state)
{
    (void)state;
    struct cap c = {0};
    struct mb *mb = one(&c, &swim_ops);
    const struct mb_config *cfg = mb_cfg(mb);
    Kvtier__SwimMsg msg = KVTIER__SWIM_MSG__INIT;
    Kvtier__SwimPingReq r = KVTIER__SWIM_PING_REQ__INIT;
    char origin[] = "sim://2", target[] = "sim://3";
    r.target = 3;
    r.target_addr = target;
    r.seq = 77;
    msg.from = 2;
    msg.from_addr = origin;
    msg.body_case = KVTIER__SWIM_MSG__BODY_PING_REQ;
    msg.ping_req = &r;
    size_t len = kvtier__swim_msg__get_packed_size(&msg);
    uint8_t *buf = malloc(len);
    kvtier__swim_msg__pack(&msg, buf);
    c.now = 10000;
    mb_receive(mb, buf, len, c.now);
    free(buf);
    cap_clear(&c); /* the Ping to the target; it stays silent */
    int nacked = 0;
    uint64_t until = c.now + (cfg->probe_ms - cfg->probe_timeout_ms) - 1;
    while (c.now + 10 <= until && !nacked) { /* ticks up to `until` only */
        c.now += 10;
        mb_tick(mb, c.now);
        for (int i = 0; i < c.n; i++) {
            Kvtier__SwimMsg *m = kvtier__swim_msg__unpack(NULL, c.len[i], c.buf[i]);
            assert_non_null(m);
            if (m->body_case == KVTIER__SWIM_MSG__BODY_NACK && !strcmp(c.to[i], origin)) {
                assert_int_equal(m->nack->seq, 77);
                nacked = 1;
            }
            kvtier__swim_msg__free_unpacked(m, NULL);
        }
        cap_clear(&c);
    }
    assert_true(nacked);
    mb_destroy(mb);
}

/* A suspicion heard from another member makes this node probe the
 * suspect next (always in a cluster of at most 2k members, with
 * probability 2k/n in a larger one): its failed probe confirms the
 * suspicion, its successful one tells the suspect, which refutes. */
static void test_suspect_checked_soon(void **state)
{
    (void)state;
    struct cap c = {0};
    struct mb *mb = one(&c, &swim_ops);
    Kvtier__SwimMember cl[5], *cp[5];
    char addr[5][32];
    for (uint32_t i = 0; i < 5; i++) {
        snprintf(addr[i], sizeof addr[i], "sim://%u", (unsigned)i + 2);
        claim(&cl[i], i + 2, MB_ALIVE, 3, i + 2, addr[i]);
        cp[i] = &cl[i];
    }
    feed(mb, 2, cp, 5, 0, 0);
    c.now += mb_cfg(mb)->probe_ms; /* the first round begins */
    mb_tick(mb, c.now);
    ack_pings(mb, &c);
    for (uint32_t sus = 2; sus <= 6; sus++) {
        uint32_t teller = sus == 2 ? 3 : 2;
        claim(&cl[0], sus, MB_SUSPECT, 3, teller, addr[sus - 2]);
        feed(mb, teller, cp, 1, 0, c.now);
        assert_int_equal(mb_find(mb, sus)->state, MB_SUSPECT);
        cap_clear(&c);
        c.now += mb_cfg(mb)->probe_ms;
        mb_tick(mb, c.now);
        assert_int_equal(ack_pings(mb, &c), sus);
    }
    mb_destroy(mb);
}

/* Messages captured in c to `to` (an address), and whether one of them
 * carried claim (id, state) -- at incarnation >= inc. */
static int sent_claim(struct cap *c, const char *to, uint32_t id, int state, uint64_t inc)
{
    int seen = 0;
    for (int i = 0; i < c->n; i++) {
        if (strcmp(c->to[i], to)) continue;
        Kvtier__SwimMsg *m = kvtier__swim_msg__unpack(NULL, c->len[i], c->buf[i]);
        assert_non_null(m);
        for (size_t j = 0; j < m->n_gossip; j++)
            seen |= m->gossip[j]->id == id && (int)m->gossip[j]->state == state &&
                    m->gossip[j]->incarnation >= inc;
        if (m->body_case == KVTIER__SWIM_MSG__BODY_SYNC)
            for (size_t j = 0; j < m->sync->n_members; j++)
                seen |= m->sync->members[j]->id == id &&
                        (int)m->sync->members[j]->state == state &&
                        m->sync->members[j]->incarnation >= inc;
        kvtier__swim_msg__free_unpacked(m, NULL);
    }
    return seen;
}

/* A member that gossip missed is learned from the member itself: a
 * message from a stranger (here a Ping) is answered with want_claim; the
 * stranger's answer carries its whole claim (incarnation and metadata),
 * which the sender's address alone would not. Asked itself, a node
 * answers with its own claim. */
static void test_stranger_asked_for_its_claim(void **state)
{
    (void)state;
    struct cap c = {0};
    struct mb *mb = one(&c, &swim_ops);
    char a[16] = "sim://2";
    Kvtier__SwimMember cl[1], *cp[1] = {&cl[0]};
    claim(&cl[0], 2, MB_ALIVE, 1, 2, a);
    feed(mb, 2, cp, 1, 0, 0);
    cap_clear(&c);
    /* Stranger 50 pings this node: the Ack asks for its claim. */
    Kvtier__SwimMsg msg = KVTIER__SWIM_MSG__INIT;
    Kvtier__SwimPing p = KVTIER__SWIM_PING__INIT;
    p.target = 1;
    p.seq = 9;
    msg.from = 50;
    msg.from_addr = "sim://50";
    msg.body_case = KVTIER__SWIM_MSG__BODY_PING;
    msg.ping = &p;
    size_t len = kvtier__swim_msg__get_packed_size(&msg);
    uint8_t *buf = malloc(len);
    kvtier__swim_msg__pack(&msg, buf);
    mb_receive(mb, buf, len, 0);
    free(buf);
    assert_null(mb_find(mb, 50));
    assert_int_equal(c.n, 1);
    assert_string_equal(c.to[0], "sim://50");
    Kvtier__SwimMsg *r = kvtier__swim_msg__unpack(NULL, c.len[0], c.buf[0]);
    assert_non_null(r);
    assert_int_equal(r->body_case, KVTIER__SWIM_MSG__BODY_ACK);
    assert_true(r->want_claim);
    kvtier__swim_msg__free_unpacked(r, NULL);
    cap_clear(&c);
    /* Its answer: its own claim, metadata included. */
    uint8_t meta[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    char a50[16] = "sim://50";
    claim(&cl[0], 50, MB_ALIVE, 7, 50, a50);
    cl[0].meta = (ProtobufCBinaryData){sizeof meta, meta};
    feed(mb, 50, cp, 1, 0, 0);
    struct mb_member *m = mb_find(mb, 50);
    assert_non_null(m);
    assert_int_equal(m->state, MB_ALIVE);
    assert_int_equal(m->inc, 7);
    assert_int_equal(m->meta_len, 8);
    assert_memory_equal(m->meta, meta, 8);
    assert_int_equal(c.n, 0); /* known now: nothing more asked */
    /* Asked by member 2: this node answers with its own claim at once. */
    Kvtier__SwimGossipOnly g = KVTIER__SWIM_GOSSIP_ONLY__INIT;
    Kvtier__SwimMsg q = KVTIER__SWIM_MSG__INIT;
    q.from = 2;
    q.from_addr = a;
    q.want_claim = 1;
    q.body_case = KVTIER__SWIM_MSG__BODY_GOSSIP_ONLY;
    q.gossip_only = &g;
    len = kvtier__swim_msg__get_packed_size(&q);
    buf = malloc(len);
    kvtier__swim_msg__pack(&q, buf);
    mb_receive(mb, buf, len, 0);
    free(buf);
    assert_true(sent_claim(&c, "sim://2", 1, MB_ALIVE, 100));
    cap_clear(&c);
    /* A stranger whose own claim is refused (no address) is not asked:
     * no exchange without end. */
    char none[1] = "";
    claim(&cl[0], 60, MB_ALIVE, 1, 60, none);
    feed(mb, 60, cp, 1, 0, 0);
    assert_null(mb_find(mb, 60));
    assert_int_equal(c.n, 0);
    /* Once it has left it answers nothing: never an alive claim. */
    assert_int_equal(mb_leave(mb), 0);
    cap_clear(&c);
    len = kvtier__swim_msg__get_packed_size(&q);
    buf = malloc(len);
    kvtier__swim_msg__pack(&q, buf);
    mb_receive(mb, buf, len, 0);
    free(buf);
    assert_int_equal(c.n, 0);
    mb_destroy(mb);
}

/* After a partition heals, each side holds the other dead and routes no
 * gossip to it. A member held dead is poked every period ("you are dead
 * here"), even when it is the only dead one among many; told so, it
 * refutes straight back to the teller, and a member that speaks while
 * held dead is told at once. */
static void test_dead_member_poked_and_answered(void **state)
{
    (void)state;
    struct cap c = {0};
    struct mb *mb = one(&c, &swim_ops);
    enum { N = 300 };
    struct crowd w = crowd_feed(mb, N);
    Kvtier__SwimMember *cl = w.cl, **cp = w.cp;
    char (*addr)[32] = w.addr;
    /* Member 200 died here (through a partition, say). */
    claim(&cl[0], 200, MB_DEAD, 3, 5, addr[198]);
    feed(mb, 5, cp, 1, 0, 0);
    c.now = 100000; /* the minimum suspicion timeout is long past */
    feed(mb, 5, cp, 1, 0, c.now);
    assert_int_equal(mb_find(mb, 200)->state, MB_DEAD);
    cap_clear(&c);
    /* Within two periods it is told, the only dead one of 300. */
    int told = 0;
    for (int p = 0; p < 2 && !told; p++) {
        c.now += mb_cfg(mb)->probe_ms;
        mb_tick(mb, c.now);
        told = sent_claim(&c, "sim://200", 200, MB_DEAD, 3);
        ack_pings(mb, &c);
    }
    assert_true(told);
    /* It speaks while held dead: told at once. */
    claim(&cl[0], 7, MB_ALIVE, 3, 7, addr[5]);
    feed(mb, 200, cp, 1, 0, c.now);
    assert_true(sent_claim(&c, "sim://200", 200, MB_DEAD, 3));
    cap_clear(&c);
    /* Told that this node is suspect: it refutes to the teller at once. */
    claim(&cl[0], 1, MB_SUSPECT, 100, 9, addr[7]);
    feed(mb, 9, cp, 1, 0, c.now);
    assert_int_equal(mb_self(mb)->inc, 101);
    assert_true(sent_claim(&c, "sim://9", 1, MB_ALIVE, 101));
    cap_clear(&c);
    /* Told an old suspicion of itself (below its incarnation): it restates
     * its claim to the teller at once. */
    claim(&cl[0], 1, MB_SUSPECT, 100, 11, addr[9]);
    feed(mb, 11, cp, 1, 0, c.now);
    assert_int_equal(mb_self(mb)->inc, 101);
    assert_true(sent_claim(&c, "sim://11", 1, MB_ALIVE, 101));
    cap_clear(&c);
    /* Its refutation revives it here, and the exchange ends. */
    claim(&cl[0], 200, MB_ALIVE, 4, 200, addr[198]);
    feed(mb, 200, cp, 1, 0, c.now);
    assert_int_equal(mb_find(mb, 200)->state, MB_ALIVE);
    assert_int_equal(c.n, 0);
    crowd_free(&w);
    mb_destroy(mb);
}

/* The target of the first Ping captured in c, 0 if none. */
static uint32_t pinged(struct cap *c)
{
    uint32_t t = 0;
    for (int i = 0; i < c->n && !t; i++) {
        Kvtier__SwimMsg *m = kvtier__swim_msg__unpack(NULL, c->len[i], c->buf[i]);
        assert_non_null(m);
        if (m->body_case == KVTIER__SWIM_MSG__BODY_PING) t = m->ping->target;
        kvtier__swim_msg__free_unpacked(m, NULL);
    }
    return t;
}

/* A suspicion no one confirms because the others know better: its
 * suspect crashed and restarted at a new incarnation, and gossip never
 * brought the new life's claim here. Past the minimum timeout this node
 * tells the suspect of the suspicion; the new life answers with its claim
 * and is never declared dead here. Before, nothing went from here to the
 * suspect ahead of the longest timeout (its next turn in the round was
 * ~300 periods away) and the running member died: the false death of
 * swimsim's rolling restart at probe_ms 800. */
static void test_lingering_suspicion_told(void **state)
{
    (void)state;
    struct cap c = {0};
    struct mb *mb = one(&c, &swim_ops);
    enum { N = 300 };
    struct crowd w = crowd_feed(mb, N);
    /* A quiet cluster: every member answers until the gossip is out. */
    for (int p = 0; p < 60; p++) {
        c.now += mb_cfg(mb)->probe_ms;
        mb_tick(mb, c.now);
        ack_pings(mb, &c);
    }
    /* The next member probed has crashed: nothing answers. */
    uint32_t x = 0;
    while (!x) {
        c.now += 100;
        mb_tick(mb, c.now);
        x = pinged(&c);
        cap_clear(&c);
    }
    while (mb_find(mb, x)->state != MB_SUSPECT) {
        c.now += 100;
        mb_tick(mb, c.now);
        ack_pings_but(mb, &c, x);
    }
    /* It is back at incarnation 500; this node has not heard. */
    int told = 0;
    uint64_t end = c.now + 60000; /* past the longest suspicion timeout */
    while (c.now < end) {
        c.now += 100;
        mb_tick(mb, c.now);
        if (!told && sent_claim(&c, w.addr[x - 2], x, MB_SUSPECT, 3)) {
            told = 1; /* the new life restates its claim to this node */
            claim(&w.cl[0], x, MB_ALIVE, 500, x, w.addr[x - 2]);
            feed(mb, x, w.cp, 1, 0, c.now);
        }
        ack_pings_but(mb, &c, told ? 0 : x);
    }
    assert_true(told);
    assert_int_equal(mb_find(mb, x)->state, MB_ALIVE);
    assert_int_equal(mb_find(mb, x)->inc, 500);
    assert_int_equal(c.events[MB_EV_DEAD], 0);
    crowd_free(&w);
    mb_destroy(mb);
}

/* --------------------------------------------------- swim, many nodes */

struct tally {
    int dead[64], left[64], join[64];
};

static void count_ev(void *arg, int obs, struct mb_member *m, enum mb_event ev, enum mb_state old)
{
    (void)obs;
    (void)old;
    struct tally *t = arg;
    if (m->id >= 64) return;
    if (ev == MB_EV_DEAD) t->dead[m->id]++;
    if (ev == MB_EV_LEFT) t->left[m->id]++;
    if (ev == MB_EV_JOIN) t->join[m->id]++;
}

/* n nodes joined through node 0, 20 s of virtual time: reap_ms as given. */
static struct sim *net_reap(int n, struct tally *t, double loss, uint32_t reap_ms)
{
    struct sim_cfg c = {0};
    c.seed = 42;
    c.lat_us = 300;
    c.jitter_us = 200;
    c.loss = loss;
    c.ops = &swim_ops;
    c.on_change = count_ev;
    c.on_change_arg = t;
    c.mbc.reap_ms = reap_ms;
    struct sim *s = sim_new(&c);
    for (int i = 0; i < n; i++) sim_start(s, -1, i ? 0 : -1);
    sim_run_until(s, 20000000);
    return s;
}

static struct sim *net(int n, struct tally *t, double loss)
{
    return net_reap(n, t, loss, 20000);
}

/* A member's address and metadata live behind its record, sized to them
 * at mb_add: updates that outgrow them, shrink again, or pass the
 * member's own bytes back keep every byte right (ASan checks the rest). */
static void test_member_bytes_move(void **state)
{
    (void)state;
    struct cap c = {0};
    struct mb *mb = one(&c, &bare_ops);
    struct mb_member *m = mb_add(mb, 2, "sim://2", "ab", 2, 1, MB_ALIVE);
    assert_non_null(m);
    assert_string_equal(m->addr, "sim://2");
    char longaddr[MB_ADDR_MAX + 1], meta[MB_META_MAX]; /* MB_ADDR_MAX chars */
    memset(longaddr, 'a', sizeof longaddr - 1);
    longaddr[sizeof longaddr - 1] = 0;
    memset(meta, 7, sizeof meta);
    assert_int_equal(mb_update(mb, m, longaddr, NULL, 0), -1); /* too long */
    longaddr[sizeof longaddr - 2] = 0;
    assert_int_equal(mb_update(mb, m, longaddr, NULL, 0), 0); /* outgrows */
    assert_string_equal(m->addr, longaddr);
    assert_true(m->meta_len == 2 && !memcmp(m->meta, "ab", 2));
    assert_int_equal(mb_update(mb, m, NULL, meta, sizeof meta), 0);
    assert_string_equal(m->addr, longaddr);
    assert_true(m->meta_len == sizeof meta && !memcmp(m->meta, meta, sizeof meta));
    assert_int_equal(c.events[MB_EV_UPDATE], 2);
    assert_int_equal(mb_update(mb, m, m->addr, m->meta, m->meta_len), 0); /* its own */
    assert_int_equal(c.events[MB_EV_UPDATE], 2);                      /* no change */
    assert_int_equal(mb_update(mb, m, "x://1", m->meta + 1, 3), 0);   /* shrinks */
    assert_string_equal(m->addr, "x://1");
    assert_true(m->meta_len == 3 && !memcmp(m->meta, meta, 3));
    assert_int_equal(mb_update(mb, m, m->addr + 1, NULL, 0), 0);      /* overlaps */
    assert_string_equal(m->addr, "://1");
    assert_int_equal(c.events[MB_EV_UPDATE], 4);
    assert_int_equal(mb_set_meta(mb, meta, sizeof meta), 0);
    struct mb_member *self = mb_self(mb);
    assert_int_equal(mb_set_meta(mb, self->meta + 10, 5), 0);
    assert_true(self->meta_len == 5 && !memcmp(self->meta, meta, 5));
    assert_int_equal(mb_set_meta(mb, meta, sizeof meta + 1), -1);
    assert_non_null(mb_find(mb, 2));
    mb_destroy(mb);
    cap_clear(&c);
}

static void test_join_and_metadata(void **state)
{
    (void)state;
    struct tally t = {0};
    struct sim *s = net(8, &t, 0);
    assert_int_equal(sim_disagree(s), 0);
    for (int i = 0; i < 8; i++) assert_int_equal(mb_live(sim_mb(s, i)), 7);
    /* Node 3 publishes new metadata; everyone learns it. */
    assert_int_equal(mb_set_meta(sim_mb(s, 3), "ucx-worker-addr", 15), 0);
    sim_run_until(s, sim_now(s) + 10000000);
    for (int i = 0; i < 8; i++) {
        if (i == 3) continue;
        struct mb_member *m = mb_find(sim_mb(s, i), 4);
        assert_true(m && m->meta_len == 15 && !memcmp(m->meta, "ucx-worker-addr", 15));
    }
    sim_free(s);
}

static void test_crash_detected_and_reaped(void **state)
{
    (void)state;
    struct tally t = {0};
    struct sim *s = net(8, &t, 0);
    sim_crash(s, 5); /* id 6 */
    sim_run_until(s, sim_now(s) + 15000000);
    assert_int_equal(t.dead[6], 7);
    assert_int_equal(sim_disagree(s), 0);
    for (int i = 0; i < 8; i++) {
        if (i == 5) continue;
        struct mb_member *m = mb_find(sim_mb(s, i), 6);
        assert_true(m && m->state == MB_DEAD);
    }
    sim_run_until(s, sim_now(s) + 30000000); /* reap_ms = 20 s */
    for (int i = 0; i < 8; i++)
        if (i != 5) assert_null(mb_find(sim_mb(s, i), 6));
    /* It restarts: a new incarnation, known again by everyone. */
    sim_start(s, 5, 0);
    sim_run_until(s, sim_now(s) + 10000000);
    assert_int_equal(sim_disagree(s), 0);
    for (int i = 0; i < 8; i++) assert_int_equal(mb_live(sim_mb(s, i)), 7);
    sim_free(s);
}

static void test_leave_is_not_death(void **state)
{
    (void)state;
    struct tally t = {0};
    struct sim *s = net(8, &t, 0);
    sim_leave(s, 2); /* id 3 */
    sim_run_until(s, sim_now(s) + 15000000);
    assert_int_equal(t.left[3], 7);
    assert_int_equal(t.dead[3], 0);
    assert_int_equal(sim_disagree(s), 0);
    sim_free(s);
}

/* Node 0 cannot reach node 1 at all (one direction): indirect probes
 * through the others keep node 1 alive in everyone's view. */
static void test_indirect_probe_saves_a_bad_link(void **state)
{
    (void)state;
    struct tally t = {0};
    struct sim *s = net(8, &t, 0);
    sim_slow_link(s, 0, 1, 0, 1.0);
    sim_run_until(s, sim_now(s) + 120000000);
    for (int id = 1; id <= 8; id++) assert_int_equal(t.dead[id], 0);
    assert_int_equal(sim_disagree(s), 0);
    sim_free(s);
}

/* A node paused 8 s comes back to a backlog of old acks: it must not
 * accuse anyone, and (Lifeguard) its health score rises. */
static void test_paused_node_accuses_nobody(void **state)
{
    (void)state;
    struct tally t = {0};
    struct sim *s = net(8, &t, 0);
    sim_pause(s, 4, 8000);
    sim_run_until(s, sim_now(s) + 60000000);
    for (int id = 1; id <= 8; id++)
        if (id != 5) assert_int_equal(t.dead[id], 0);
    assert_int_equal(sim_disagree(s), 0);
    sim_free(s);
}

/* 10% loss on every link: no false death in 5 minutes. */
static void test_lossy_network(void **state)
{
    (void)state;
    struct tally t = {0};
    struct sim *s = net(16, &t, 0.10);
    sim_run_until(s, sim_now(s) + 300000000);
    for (int id = 1; id <= 16; id++) assert_int_equal(t.dead[id], 0);
    sim_free(s);
}

/* A 50/50 partition longer than the suspicion timeouts (shorter than
 * reap_ms), then healed: both halves hold each other dead, and find each
 * other again by refutation within 10 periods (virtual time). 30 s: a
 * member of the other half is first probed when its turn in the round
 * comes, and the failed probes (no Nack from relays across the line)
 * stretch each node's period -- 15 s left one member unsuspected for
 * some seeds (71 of seeds 1-100 before the gossip queue's O(1) lists,
 * 73 after), 30 s none (either). */
static void test_partition_heals(void **state)
{
    (void)state;
    struct tally t = {0};
    struct sim *s = net_reap(16, &t, 0, 60000);
    int g[16];
    for (int i = 0; i < 16; i++) g[i] = i >= 8;
    sim_partition(s, g, 1);
    sim_run_until(s, sim_now(s) + 30000000); /* less than reap_ms (60 s) */
    assert_int_equal(sim_disagree(s), 2 * 8 * 8);
    sim_partition(s, g, 0);
    sim_run_until(s, sim_now(s) + 10000000);
    assert_int_equal(sim_disagree(s), 0);
    sim_free(s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_table_grows_and_shrinks),
        cmocka_unit_test(test_member_bytes_move),
        cmocka_unit_test(test_bad_config),
        cmocka_unit_test(test_refutes_suspicion_of_itself),
        cmocka_unit_test(test_precedence),
        cmocka_unit_test(test_stale_death),
        cmocka_unit_test(test_bad_input),
        cmocka_unit_test(test_piggyback_bounded),
        cmocka_unit_test(test_gossipq_order_and_dedup),
        cmocka_unit_test(test_gossipq_copies),
        cmocka_unit_test(test_gossipq_against_model),
        cmocka_unit_test(test_gossip_least_sent_first),
        cmocka_unit_test(test_join_answer_not_regossiped),
        cmocka_unit_test(test_leave_cancels_announce),
        cmocka_unit_test(test_unpack_past_arena),
        cmocka_unit_test(test_refused_send_keeps_claims),
        cmocka_unit_test(test_ask_brings_claim),
        cmocka_unit_test(test_confirmations_shorten_suspicion),
        cmocka_unit_test(test_new_member_joins_round),
        cmocka_unit_test(test_nack_in_time),
        cmocka_unit_test(test_dead_member_poked_and_answered),
        cmocka_unit_test(test_stranger_asked_for_its_claim),
        cmocka_unit_test(test_suspect_checked_soon),
        cmocka_unit_test(test_lingering_suspicion_told),
        cmocka_unit_test(test_join_and_metadata),
        cmocka_unit_test(test_crash_detected_and_reaped),
        cmocka_unit_test(test_fresh_death_not_reaped),
        cmocka_unit_test(test_leave_is_not_death),
        cmocka_unit_test(test_indirect_probe_saves_a_bad_link),
        cmocka_unit_test(test_paused_node_accuses_nobody),
        cmocka_unit_test(test_lossy_network),
        cmocka_unit_test(test_partition_heals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
