/*
 * swim.c -- embedded membership: SWIM with the Lifeguard refinements.
 *
 * Design. Each protocol period this node probes ONE member, taken from a
 * shuffled round-robin of the live ones (every member is probed within
 * two rounds, yet the choice is unpredictable; a member learned during a
 * round joins it at a random place ahead): a Ping, and if no Ack
 * comes within the probe timeout, PingReqs to k other members, who ping
 * the target for us and relay its Ack -- or a Nack when it stays silent
 * (sent while the prober's period is still open).
 * No Ack by the end of the period makes the target SUSPECT; a suspicion
 * not refuted within its timeout makes it DEAD. Load per node is one probe
 * per period whatever the cluster size.
 *
 * Claims (alive / suspect / dead / left at an incarnation) spread as
 * gossip piggybacked on every message, least-sent first (oldest first
 * among equals), each sent retransmit_mult * log10(n+1) times, packed up
 * to max_msg_bytes; extra gossip-only rounds run while the queue is not
 * empty. The queue (gossipq.c) holds one claim per member and costs O(1)
 * a claim taken or queued, however many thousands wait while a fleet
 * forms. Precedence follows
 * SWIM: a higher incarnation wins; at equal incarnation dead/left beat
 * suspect beat alive -- except that another member's death claim only
 * ends a suspicion held here for the minimum suspicion timeout: about a
 * member held alive it starts one (merge_dead), so a stale claim (from
 * across a healed partition) cannot kill a member before it can refute.
 * Only a member raises its own incarnation: told it is
 * suspect or dead, it refutes with alive at a higher one. Any message to a
 * member this node holds suspect or dead carries that claim (the Lifeguard
 * "buddy system"), so the member hears it at once and refutes. A
 * suspicion still open past the minimum timeout (too few confirmations:
 * the others may know better, e.g. of a restart at a new incarnation) is
 * told to its suspect in a bare message, again each minimum timeout, so a
 * live suspect answers before the longest timeout kills it here.
 *
 * Lifeguard: (1) a local health score, raised when this node's own probes
 * fail without the Nacks it expected, when it must refute, or when its own
 * ticks ran late (it was paused or overloaded), lowered by each successful
 * probe, multiplies the probe period and timeout -- a slow node slows down
 * rather than accusing healthy ones; a probe whose deadlines this node
 * itself missed is dropped, never turned into a suspicion. (2) Suspicion
 * timeouts start at suspicion_max_mult times the minimum and shrink
 * logarithmically towards the minimum as independent confirmations (other
 * members' suspect claims) arrive; a member that hears of a suspicion
 * probes the suspect next with probability 2k/n, so confirmations (or
 * the refutation) come within a period or two. (3) Replies are judged by
 * their RECEIVE time (mb_receive's rx_ms), so a backlog on this node is
 * not a silence of the peer.
 *
 * Push-pull: every sync_ms (scaled up beyond 32 members) the whole table is
 * exchanged with one random live member; a dead claim received this way
 * only makes the member suspect, so a healed partition converges by
 * refutation instead of mutual killing. Every period one member held dead
 * is poked with its death; a member doubted (it refutes or restates its
 * claim) answers the sender at once, and one heard from while held dead
 * is told so at once: that is how partitions heal in seconds. Join = a
 * sync to the seeds, repeated until some table arrives (gossip alone is
 * not enough: a restarted node is pinged by members that knew its
 * previous life). The members a joiner learns from that answer are not
 * gossiped on (the seed's cluster knows them); the seed gossips the
 * joiner, and 3 periods later the joiner tells every member of itself
 * directly and pulls a second table (announce: the few pairs gossip
 * misses, the holes of the seed's table).
 * Strangers ask: a message from a member unknown here that carries no
 * claim about it gets want_claim on the reply, and the sender answers
 * with its own claim -- a member the join gossip missed learns
 * the newcomer when they first speak, not at the next push-pull sync.
 * Leave = a left claim gossiped to several members at once. Dead and left
 * members are reaped after reap_ms.
 *
 * Invariants: m->be is a struct susp exactly while m->state == MB_SUSPECT
 * (through set_state()); the gossip queue holds at most one claim per id.
 */
#include "swim.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gossipq.h"
#include "kvtier.pb-c.h"
#include "pxalloc.h"

#define SW_CONFIRM_MAX 8     /* confirmers remembered per suspicion */
#define SW_RELAYS 64         /* ping-reqs relayed at once for others */
#define SW_LATE_MS_MIN 250   /* a tick this late means this node stalled */

struct susp {
    uint64_t start_ms, deadline_ms;
    uint64_t check_ms;                /* past it, the suspect is told
                                         (susp_tell) */
    int dead;                         /* a death was claimed: minimum timeout */
    uint32_t n;                       /* confirmations, the first excluded */
    uint32_t who[SW_CONFIRM_MAX];
};

#define SW_ANNOUNCE_PERIODS 3 /* a joiner tells every member of itself this
                                 many probe periods after its join */
#define SW_ARENA 8192      /* bytes for unpacking one message (ar_alloc) */
#define SW_PASS_MAX 64      /* claims too big for what is left of a
                                message passed over before it is full */

/* A claim, queued (gossipq.h) or built for one message; `size` is its
 * packed size with field overhead, `mark` the message that took it. */
#define claim gq_claim

static char no_addr[1];               /* the address of built claims */

struct relay {
    int used, nacked;
    uint32_t seq, origin_seq;
    uint64_t nack_ms, deadline_ms;    /* Nack the origin at nack_ms; relay
                                         a late Ack until deadline_ms */
    char origin[MB_ADDR_MAX];
};

struct probe {
    int active, acked, req_sent;
    uint32_t target, seq, nacks, expect;
    uint64_t start_ms, req_at_ms, end_ms;
};

struct swim {
    uint32_t seq, msgno;
    struct probe pr;
    uint32_t *order;                  /* shuffled ids to probe */
    size_t norder, pos, ordcap;
    struct gq q;                      /* gossip queue */
    Kvtier__SwimMember *pk_sm, **pk_sp; /* send_msg's claims (pack_room) */
    uint32_t *pk_ids;
    size_t pk_cap;
    _Alignas(16) uint8_t ar[SW_ARENA]; /* unpacking (ar_alloc) */
    uint8_t *ar_blk;                  /* ar, or the message's own block */
    size_t ar_cap, ar_used;
    struct relay rel[SW_RELAYS];
    uint32_t *susp;                   /* ids now SUSPECT */
    size_t nsusp, suspcap;
    char **seeds;
    size_t nseeds;
    uint64_t next_probe, next_gossip, next_sync, next_reap, next_join;
    uint64_t next_poke, next_tell;
    uint64_t announce_at;             /* joined: tell every member, then 0 */
    uint32_t health;
    int synced;                       /* a table arrived: joined */
    int doubted;                      /* the message being handled
                                         doubted this node: it refuted or
                                         restated its claim */
    int lead_self;                    /* send_msg: this node's own claim
                                         first, if queued */
    int bare;                         /* send_msg: no queued gossip */
    int quiet;                        /* merging a join's answer: members
                                         new here are not queued */
    int announcing;                   /* send_msg: this node's own claim,
                                         no queued gossip */
    const char *sender;               /* from_addr of the message being
                                         handled, while it is */
    int ask;                          /* its sender is a stranger here:
                                         the next message to it asks for
                                         its claim (want_claim) */
    int give;                         /* its sender asked for this node's
                                         claim: the next message to it
                                         carries it */
};

#define xalloc(p, sz) px_realloc(p, sz, "swim")

static struct swim *SW(struct mb *mb) { return mb_backend(mb); }

static uint64_t n_cluster(struct mb *mb) { return (uint64_t)mb_live(mb) + 1; }

static double log10n(struct mb *mb)
{
    double l = log10((double)n_cluster(mb) + 1);
    return l < 1 ? 1 : l;
}

static uint32_t retransmits(struct mb *mb)
{
    return (uint32_t)ceil(mb_cfg(mb)->retransmit_mult * log10n(mb));
}

static uint64_t scaled(struct mb *mb, uint32_t ms)
{
    return (uint64_t)ms * (SW(mb)->health + 1);
}

static void health_add(struct mb *mb, int d)
{
    struct swim *sw = SW(mb);
    int h = (int)sw->health + d, max = (int)mb_cfg(mb)->awareness_max - 1;
    sw->health = (uint32_t)(h < 0 ? 0 : h > max ? max : h);
    mb_stats_mut(mb)->health = sw->health;
}

/* ---------------------------------------------------------- suspicions */

static void susp_list_del(struct swim *sw, uint32_t id)
{
    for (size_t i = 0; i < sw->nsusp; i++)
        if (sw->susp[i] == id) {
            sw->susp[i] = sw->susp[--sw->nsusp];
            return;
        }
}

/* The minimum suspicion timeout: suspicion_mult * log10(n+1) periods. */
static double susp_min(struct mb *mb)
{
    const struct mb_config *c = mb_cfg(mb);
    return c->suspicion_mult * log10n(mb) * c->probe_ms;
}

/* Lifeguard: max timeout with no confirmation, shrinking as log(c+1) /
 * log(k+1) towards the minimum at k confirmations. */
static void susp_deadline(struct mb *mb, struct susp *s)
{
    const struct mb_config *c = mb_cfg(mb);
    double min = susp_min(mb);
    double max = min * c->suspicion_max_mult;
    uint64_t n = n_cluster(mb);
    double k = n > 2 ? (double)(n - 2 < c->indirect_k ? n - 2 : c->indirect_k) : 0;
    double t = min;
    if (k >= 1 && !s->dead) {
        t = max - (log((double)s->n + 1) / log(k + 1)) * (max - min);
        if (t < min) t = min;
    }
    s->deadline_ms = s->start_ms + (uint64_t)t;
}

/* The only way a member's state moves here: keeps m->be and the suspect
 * list in step with the state. */
static void set_state(struct mb *mb, struct mb_member *m, enum mb_state st, uint64_t inc,
                      uint32_t from)
{
    struct swim *sw = SW(mb);
    if (m->state == MB_SUSPECT && st != MB_SUSPECT) {
        free(m->be);
        m->be = NULL;
        susp_list_del(sw, m->id);
    }
    if (st == MB_SUSPECT && m->state != MB_SUSPECT) {
        struct susp *s = xalloc(NULL, sizeof *s);
        memset(s, 0, sizeof *s);
        s->start_ms = mb_now(mb);
        s->check_ms = s->start_ms + (uint64_t)susp_min(mb);
        s->who[0] = from;
        m->be = s;
        susp_deadline(mb, s);
        if (sw->nsusp == sw->suspcap) {
            sw->suspcap = sw->suspcap ? 2 * sw->suspcap : 16;
            sw->susp = xalloc(sw->susp, sw->suspcap * sizeof *sw->susp);
        }
        sw->susp[sw->nsusp++] = m->id;
    }
    mb_set_state(mb, m, st, inc);
}

/* Another member's suspect claim about m at its incarnation: 1 if it is a
 * new, independent confirmation (the timeout shrinks). */
static int confirm(struct mb *mb, struct mb_member *m, uint32_t from)
{
    struct susp *s = m->be;
    uint32_t have = s->n + 1 < SW_CONFIRM_MAX ? s->n + 1 : SW_CONFIRM_MAX;
    if (!from) return 0; /* not an independent observation (see merge) */
    for (uint32_t i = 0; i < have; i++)
        if (s->who[i] == from) return 0;
    if (have == SW_CONFIRM_MAX) return 0;
    s->who[have] = from;
    s->n++;
    susp_deadline(mb, s);
    return 1;
}

/* -------------------------------------------------------- gossip queue */

static size_t claim_size(const struct claim *c)
{
    Kvtier__SwimMember sm = KVTIER__SWIM_MEMBER__INIT;
    sm.id = c->id;
    sm.incarnation = c->inc;
    sm.state = (Kvtier__SwimState)c->state;
    sm.addr = (char *)c->addr;
    sm.meta = (ProtobufCBinaryData){c->meta_len, c->meta};
    sm.from = c->from;
    return kvtier__swim_member__get_packed_size(&sm) + 3; /* tag + length */
}

/* Queue a claim, replacing any older one about the same member; the
 * address and metadata go with alive claims only. */
static void enqueue(struct mb *mb, uint32_t id, int state, uint64_t inc, const char *addr,
                    const void *meta, size_t meta_len, uint32_t from)
{
    int alive = state == MB_ALIVE;
    struct claim *c = gq_put(&SW(mb)->q, id, state, inc, alive ? addr : NULL,
                             alive ? meta : NULL, meta_len, from);
    c->size = claim_size(c);
}

static void enqueue_member(struct mb *mb, const struct mb_member *m, uint32_t from)
{
    enqueue(mb, m->id, m->state, m->inc, m->addr, m->meta, m->meta_len, from);
}

static void fill_claim(Kvtier__SwimMember *sm, const struct claim *c)
{
    kvtier__swim_member__init(sm);
    sm->id = c->id;
    sm->incarnation = c->inc;
    sm->state = (Kvtier__SwimState)c->state;
    sm->addr = (char *)c->addr;
    sm->meta = (ProtobufCBinaryData){c->meta_len, c->meta};
    sm->from = c->from;
}

/* ------------------------------------------------------------- sending */

/* The claims one message carries: built ones (buddy, this node's own) and
 * queued ones, whose ids are kept -- they count as sent only once the
 * transport took the message. */
struct pack {
    Kvtier__SwimMember *sm, **sp;
    uint32_t *ids;
    size_t n, nids, room;
    uint32_t mark;
};

static void put_claim(struct pack *p, const struct claim *c)
{
    fill_claim(&p->sm[p->n], c);
    p->sp[p->n] = &p->sm[p->n];
    p->n++;
    p->room -= c->size;
}

static void take_claim(struct pack *p, struct claim *c)
{
    put_claim(p, c);
    c->mark = p->mark;
    p->ids[p->nids++] = c->id;
}

/* Queued claims, least-sent first and oldest first among equals
 * (gossipq.h), except those this message took already and the ids
 * skip1/skip2 (0: none). A claim too big for the room left is passed
 * over; after SW_PASS_MAX of those the message counts as full, so a
 * full message costs O(1) however long the queue is. */
static void take_queued(struct swim *sw, struct pack *p, uint32_t lim, uint32_t skip1,
                        uint32_t skip2)
{
    size_t passed = 0;
    for (uint32_t l = 0; l < lim; l++)
        for (struct claim *c = gq_first(&sw->q, l); c; c = gq_next(&sw->q, c)) {
            if (p->room <= 8 || passed >= SW_PASS_MAX) return;
            if (c->mark == p->mark || c->id == skip1 || c->id == skip2) continue;
            if (c->size > p->room) {
                passed++;
                continue;
            }
            take_claim(p, c);
        }
}

/* The claim about `about` as held here, when it is suspect or dead
 * (buddy system): built, sent first. 0 if there is none. */
static uint32_t put_buddy(struct mb *mb, struct pack *p, const struct mb_member *about)
{
    if (!about || (about->state != MB_SUSPECT && about->state != MB_DEAD)) return 0;
    struct claim b = {.addr = no_addr};
    b.id = about->id;
    b.state = about->state;
    b.inc = about->inc;
    b.from = mb_self(mb)->id;
    b.size = claim_size(&b);
    if (b.size <= p->room) put_claim(p, &b);
    return b.id; /* a queued claim about it is not sent beside it */
}

/* Asked for: this node's current claim, whatever is queued. 0 if it did
 * not fit. */
static uint32_t put_own(struct mb *mb, struct pack *p)
{
    const struct mb_member *self = mb_self(mb);
    struct claim own = {.addr = no_addr};
    own.id = self->id;
    own.state = MB_ALIVE; /* a node that left receives nothing */
    own.inc = self->inc;
    own.from = self->id;
    own.addr = (char *)self->addr;
    own.meta = self->meta;
    own.meta_len = self->meta_len;
    own.size = claim_size(&own);
    if (own.size > p->room) return 0;
    put_claim(p, &own);
    return own.id;
}

/* The claim arrays of one message, kept from message to message: a
 * message may carry hundreds of claims, and three allocations of up to
 * ~40 KB each per message (a joiner announcing itself sends n) cost more
 * than packing it. */
static void pack_room(struct swim *sw, size_t cap)
{
    if (cap <= sw->pk_cap) return;
    sw->pk_cap = cap;
    sw->pk_sm = xalloc(sw->pk_sm, cap * sizeof *sw->pk_sm);
    sw->pk_sp = xalloc(sw->pk_sp, cap * sizeof *sw->pk_sp);
    sw->pk_ids = xalloc(sw->pk_ids, cap * sizeof *sw->pk_ids);
}

/* Pack msg with as much gossip as fits and send it. `about`: a member
 * this node holds suspect/dead gets that claim first (buddy system). */
static void send_msg(struct mb *mb, const char *addr, Kvtier__SwimMsg *msg, enum mb_msg t,
                     const struct mb_member *about)
{
    struct swim *sw = SW(mb);
    const struct mb_config *cfg = mb_cfg(mb);
    msg->from = mb_self(mb)->id;
    msg->from_addr = (char *)mb_self(mb)->addr;
    struct pack p = {0};
    p.room = kvtier__swim_msg__get_packed_size(msg);
    p.room = p.room < cfg->max_msg_bytes ? cfg->max_msg_bytes - p.room : 0;
    /* Each claim packs into at least 3 bytes: room / 3 bounds them; the
     * buddy and this node's own claim (asked for, or leading) come on
     * top. A bare or announcing message takes nothing queued. */
    size_t nq = sw->bare || sw->announcing ? 0 : gq_len(&sw->q);
    pack_room(sw, (nq < p.room / 3 ? nq : p.room / 3) + 3);
    p.sm = sw->pk_sm;
    p.sp = sw->pk_sp;
    p.ids = sw->pk_ids;
    uint32_t lim = retransmits(mb);
    p.mark = ++sw->msgno;
    uint32_t buddy = put_buddy(mb, &p, about);
    int to_sender = sw->sender && !strcmp(addr, sw->sender);
    int asked = to_sender && sw->ask;
    uint32_t own = (to_sender && sw->give) || sw->announcing ? put_own(mb, &p) : 0;
    msg->want_claim = asked;
    struct claim *self = sw->lead_self && !own ? gq_find(&sw->q, mb_self(mb)->id) : NULL;
    if (self && self->size <= p.room) take_claim(&p, self);
    if (!sw->bare && !sw->announcing) take_queued(sw, &p, lim, buddy, own);
    msg->n_gossip = p.n;
    msg->gossip = p.sp;
    size_t len = kvtier__swim_msg__get_packed_size(msg);
    uint8_t *buf = xalloc(NULL, len);
    kvtier__swim_msg__pack(msg, buf);
    /* A send the transport refused (a member whose hello is not done) did
     * not carry its claims: they keep their count and go out later. */
    if (mb_send(mb, addr, buf, len, t) == 0) {
        for (size_t i = 0; i < p.nids; i++) gq_sent(&sw->q, p.ids[i], lim);
        if (own) sw->give = 0;
        if (asked) sw->ask = 0;
    }
    gq_trim(&sw->q, lim); /* lim falls as members go */
    msg->want_claim = 0;
    free(buf);
    msg->n_gossip = 0;
    msg->gossip = NULL;
}

static void send_ping(struct mb *mb, const char *addr, uint32_t target, uint32_t seq,
                      const struct mb_member *about)
{
    Kvtier__SwimMsg msg = KVTIER__SWIM_MSG__INIT;
    Kvtier__SwimPing p = KVTIER__SWIM_PING__INIT;
    p.target = target;
    p.seq = seq;
    msg.body_case = KVTIER__SWIM_MSG__BODY_PING;
    msg.ping = &p;
    send_msg(mb, addr, &msg, MB_MSG_PING, about);
}

static void send_ack(struct mb *mb, const char *addr, uint32_t seq, int nack,
                     const struct mb_member *about)
{
    Kvtier__SwimMsg msg = KVTIER__SWIM_MSG__INIT;
    Kvtier__SwimAck a = KVTIER__SWIM_ACK__INIT;
    Kvtier__SwimNack na = KVTIER__SWIM_NACK__INIT;
    if (nack) {
        na.seq = seq;
        msg.body_case = KVTIER__SWIM_MSG__BODY_NACK;
        msg.nack = &na;
    } else {
        a.seq = seq;
        msg.body_case = KVTIER__SWIM_MSG__BODY_ACK;
        msg.ack = &a;
    }
    send_msg(mb, addr, &msg, nack ? MB_MSG_NACK : MB_MSG_ACK, about);
}

static void send_gossip_to(struct mb *mb, const char *addr, const struct mb_member *about)
{
    Kvtier__SwimMsg msg = KVTIER__SWIM_MSG__INIT;
    Kvtier__SwimGossipOnly g = KVTIER__SWIM_GOSSIP_ONLY__INIT;
    msg.body_case = KVTIER__SWIM_MSG__BODY_GOSSIP_ONLY;
    msg.gossip_only = &g;
    send_msg(mb, addr, &msg, MB_MSG_GOSSIP, about);
}

static void send_gossip(struct mb *mb, const struct mb_member *to)
{
    send_gossip_to(mb, to->addr, to);
}

/* The daemon's hello with addr is done but gossip has not brought its
 * claim here: one gossip-only message asks for it (want_claim), answered
 * as a stranger's ask is. Without it, a member the join gossip missed
 * waited for the newcomer's next probe of it (a whole round, N periods)
 * or a push-pull sync. */
static void sw_ask(struct mb *mb, const char *addr)
{
    struct swim *sw = SW(mb);
    if (!addr || !addr[0] || strlen(addr) >= MB_ADDR_MAX) return;
    sw->sender = addr;
    sw->ask = 1;
    send_gossip_to(mb, addr, NULL);
    sw->sender = NULL;
    sw->ask = 0;
}

static void member_claim(Kvtier__SwimMember *sm, const struct mb_member *m, uint32_t self)
{
    kvtier__swim_member__init(sm);
    sm->id = m->id;
    sm->incarnation = m->inc;
    sm->state = (Kvtier__SwimState)m->state;
    sm->addr = (char *)m->addr;
    sm->meta = (ProtobufCBinaryData){m->meta_len, m->meta};
    sm->from = self;
}

/* The whole table, self first. Not bounded by max_msg_bytes: the one
 * message the transport must carry whole at any size. */
static void send_sync(struct mb *mb, const char *addr, int reply, int join)
{
    size_t n = mb_count(mb) + 1;
    Kvtier__SwimMember *sm = xalloc(NULL, n * sizeof *sm);
    Kvtier__SwimMember **sp = xalloc(NULL, n * sizeof *sp);
    uint32_t self = mb_self(mb)->id;
    member_claim(&sm[0], mb_self(mb), self);
    for (size_t i = 1; i < n; i++) member_claim(&sm[i], mb_at(mb, i - 1), self);
    for (size_t i = 0; i < n; i++) sp[i] = &sm[i];
    Kvtier__SwimMsg msg = KVTIER__SWIM_MSG__INIT;
    Kvtier__SwimSync s = KVTIER__SWIM_SYNC__INIT;
    s.reply = reply != 0;
    s.join = join != 0;
    s.n_members = n;
    s.members = sp;
    msg.from = self;
    msg.from_addr = (char *)mb_self(mb)->addr;
    msg.body_case = KVTIER__SWIM_MSG__BODY_SYNC;
    msg.sync = &s;
    size_t len = kvtier__swim_msg__get_packed_size(&msg);
    uint8_t *buf = xalloc(NULL, len);
    kvtier__swim_msg__pack(&msg, buf);
    mb_send(mb, addr, buf, len, MB_MSG_SYNC);
    free(buf);
    free(sm);
    free(sp);
}

/* ------------------------------------------------------------- merging */

static void order_add(struct mb *mb, uint32_t id);
static void order_next(struct mb *mb, uint32_t id);

/* A suspicion first heard from another member: with probability
 * 2k/n probe the suspect next, so that about 2k members besides the
 * round-robin's one a period check it within a period or two. Their
 * failed probes are the independent confirmations that bring the
 * timeout down to its minimum; their successful ones carry the suspicion
 * to the suspect (buddy), which refutes. */
static void check_soon(struct mb *mb, const struct mb_member *m)
{
    uint64_t k = 2ull * mb_cfg(mb)->indirect_k, n = n_cluster(mb);
    if (n <= k || mb_rand(mb) % n < k) order_next(mb, m->id);
}

static void refute(struct mb *mb, uint64_t claimed_inc)
{
    struct mb_member *self = mb_self(mb);
    mb_set_state(mb, self, MB_ALIVE, claimed_inc + 1);
    mb_stats_mut(mb)->refutations++;
    health_add(mb, 1);
    enqueue_member(mb, self, self->id);
    SW(mb)->doubted = 1;
}

/* Someone still holds an older suspicion or death of this node: queue
 * the current alive claim again (once) so it spreads to them. */
static void reassert(struct mb *mb)
{
    struct swim *sw = SW(mb);
    struct mb_member *self = mb_self(mb);
    sw->doubted = 1;
    const struct claim *c = gq_find(&sw->q, self->id);
    if (c && c->inc == self->inc && c->tx == 0) return;
    enqueue_member(mb, self, self->id);
}

static void merge_alive(struct mb *mb, struct mb_member *m, const Kvtier__SwimMember *c)
{
    if (!c->addr[0]) {
        mb_count_bad(mb);
        return;
    }
    if (!m) {
        m = mb_add(mb, c->id, c->addr, c->meta.data, c->meta.len, c->incarnation, MB_ALIVE);
        if (m) {
            order_add(mb, m->id);
            if (!SW(mb)->quiet) enqueue_member(mb, m, c->from);
        }
        return;
    }
    if (c->incarnation <= m->inc) return;
    int back = m->state == MB_DEAD || m->state == MB_LEFT;
    if (c->addr[0]) mb_update(mb, m, c->addr, c->meta.data, c->meta.len);
    set_state(mb, m, MB_ALIVE, c->incarnation, 0);
    if (back) order_add(mb, m->id);
    enqueue_member(mb, m, c->from);
}

static void merge_suspect(struct mb *mb, struct mb_member *m, const Kvtier__SwimMember *c)
{
    if (!m || c->incarnation < m->inc || m->state == MB_DEAD || m->state == MB_LEFT) return;
    if (m->state == MB_SUSPECT && c->incarnation == m->inc) {
        if (confirm(mb, m, c->from))
            enqueue(mb, m->id, MB_SUSPECT, m->inc, NULL, NULL, 0, c->from);
        return;
    }
    if (m->state == MB_SUSPECT) set_state(mb, m, MB_ALIVE, m->inc, 0); /* restart it */
    set_state(mb, m, MB_SUSPECT, c->incarnation, c->from);
    enqueue(mb, m->id, MB_SUSPECT, m->inc, NULL, NULL, 0, c->from);
    check_soon(mb, m);
}

/* Someone else's death claim: the end of a suspicion here, never a
 * shortcut past one. This node declares the member dead once it has
 * suspected it for the minimum suspicion timeout -- at once when its own
 * suspicion is that old (a real crash: the suspicion spread long before
 * the death did) -- and otherwise keeps suspecting, so the member has
 * that long to refute. A claim that outlived its cause, e.g. one from
 * across a partition that has just healed, would else kill a member this
 * node can reach before it heard of any doubt about it. */
static void merge_dead(struct mb *mb, struct mb_member *m, const Kvtier__SwimMember *c)
{
    int news = 1;
    if (m->state != MB_SUSPECT || c->incarnation > m->inc) {
        if (m->state == MB_SUSPECT) set_state(mb, m, MB_ALIVE, m->inc, 0); /* restart it */
        set_state(mb, m, MB_SUSPECT, c->incarnation, c->from);
    } else {
        news = confirm(mb, m, c->from);
    }
    struct susp *s = m->be;
    s->dead = 1;
    susp_deadline(mb, s);
    if (mb_now(mb) >= s->deadline_ms) {
        set_state(mb, m, MB_DEAD, m->inc, c->from);
        enqueue(mb, m->id, MB_DEAD, m->inc, NULL, NULL, 0, c->from);
        return;
    }
    if (news) enqueue(mb, m->id, MB_SUSPECT, m->inc, NULL, NULL, 0, c->from);
}

static void merge_down(struct mb *mb, struct mb_member *m, const Kvtier__SwimMember *c)
{
    if (!m || c->incarnation < m->inc || m->state == MB_DEAD || m->state == MB_LEFT) return;
    if (c->state == (Kvtier__SwimState)MB_DEAD) {
        merge_dead(mb, m, c);
        return;
    }
    set_state(mb, m, (enum mb_state)c->state, c->incarnation, c->from);
    enqueue(mb, m->id, c->state, m->inc, NULL, NULL, 0, c->from);
}

/* Apply one claim. From a sync, a dead claim only makes the member
 * suspect: it must get the chance to refute. */
static void merge(struct mb *mb, const Kvtier__SwimMember *c, int from_sync)
{
    struct mb_member *self = mb_self(mb);
    int st = c->state;
    if (c->id == 0 || (unsigned)st >= MB_NSTATES) {
        mb_count_bad(mb);
        return;
    }
    if (c->id == self->id) {
        if (st != MB_ALIVE ? c->incarnation >= self->inc : c->incarnation > self->inc)
            refute(mb, c->incarnation);
        else if (st != MB_ALIVE) /* an old suspicion still about: restate */
            reassert(mb);
        return;
    }
    struct mb_member *m = mb_find(mb, c->id);
    Kvtier__SwimMember conv;
    if (from_sync && st == MB_DEAD) {
        /* Hearsay from a table, maybe from across a healed partition: a
         * suspicion that confirms nothing, so the member has the longest
         * timeout to refute it. */
        conv = *c;
        conv.from = 0;
        c = &conv;
        st = MB_SUSPECT;
    }
    switch (st) {
    case MB_ALIVE: merge_alive(mb, m, c); break;
    case MB_SUSPECT: merge_suspect(mb, m, c); break;
    default: merge_down(mb, m, c); break;
    }
}

/* ------------------------------------------------------------- probing */

static int probeable(const struct mb_member *m)
{
    return m && (m->state == MB_ALIVE || m->state == MB_SUSPECT);
}

/* Up to k distinct members other than `not`, picked at random: alive
 * ones, or also suspect ones (gossip: they must hear it to refute). */
static size_t pick_in(struct mb *mb, struct mb_member **out, size_t k, uint32_t not,
                      int suspects)
{
    size_t n = mb_count(mb), got = 0;
    if (!n) return 0;
    for (size_t tries = 0; got < k && tries < 4 * k + 8; tries++) {
        struct mb_member *m = mb_at(mb, mb_rand(mb) % n);
        if (!(m->state == MB_ALIVE || (suspects && m->state == MB_SUSPECT)) || m->id == not)
            continue;
        size_t j = 0;
        while (j < got && out[j] != m) j++;
        if (j == got) out[got++] = m;
    }
    return got;
}

static size_t pick(struct mb *mb, struct mb_member **out, size_t k, uint32_t not)
{
    return pick_in(mb, out, k, not, 0);
}

static void reshuffle(struct mb *mb)
{
    struct swim *sw = SW(mb);
    size_t n = mb_count(mb);
    if (n > sw->ordcap) {
        sw->ordcap = n;
        sw->order = xalloc(sw->order, n * sizeof *sw->order);
    }
    sw->norder = 0;
    for (size_t i = 0; i < n; i++)
        if (probeable(mb_at(mb, i))) sw->order[sw->norder++] = mb_at(mb, i)->id;
    for (size_t i = sw->norder; i > 1; i--) { /* Fisher-Yates */
        size_t j = mb_rand(mb) % i;
        uint32_t t = sw->order[i - 1];
        sw->order[i - 1] = sw->order[j];
        sw->order[j] = t;
    }
    sw->pos = 0;
}

/* A member new to this node (or back from the dead) joins the round in
 * progress at a random place still ahead, as memberlist does: left for
 * the next reshuffle, it would go unprobed here for up to a whole round
 * (n periods), and a member few nodes probe gathers few confirmations
 * when it crashes -- its suspicion then runs to the longest timeout. */
static void order_put(struct mb *mb, uint32_t id, int next)
{
    struct swim *sw = SW(mb);
    if (!sw->norder) return; /* no round yet: the first one takes everyone */
    if (sw->norder == sw->ordcap) {
        sw->ordcap *= 2;
        sw->order = xalloc(sw->order, sw->ordcap * sizeof *sw->order);
    }
    size_t end = sw->norder++;
    size_t j = next ? sw->pos : sw->pos + mb_rand(mb) % (end - sw->pos + 1);
    if (j < end) sw->order[end] = sw->order[j];
    sw->order[j] = id;
}

static void order_add(struct mb *mb, uint32_t id) { order_put(mb, id, 0); }

/* Probe id next (it may come up again later in the round). */
static void order_next(struct mb *mb, uint32_t id) { order_put(mb, id, 1); }

static struct mb_member *next_target(struct mb *mb)
{
    struct swim *sw = SW(mb);
    for (int round = 0; round < 2; round++) {
        while (sw->pos < sw->norder) {
            struct mb_member *m = mb_find(mb, sw->order[sw->pos++]);
            if (probeable(m) && m != mb_self(mb)) return m;
        }
        reshuffle(mb);
    }
    return NULL;
}

static void probe_start(struct mb *mb, uint64_t now)
{
    struct swim *sw = SW(mb);
    const struct mb_config *c = mb_cfg(mb);
    struct mb_member *m = next_target(mb);
    if (!m) return;
    struct probe *p = &sw->pr;
    memset(p, 0, sizeof *p);
    p->active = 1;
    p->target = m->id;
    p->seq = ++sw->seq;
    p->start_ms = now;
    p->req_at_ms = now + scaled(mb, c->probe_timeout_ms);
    p->end_ms = now + scaled(mb, c->probe_ms);
    mb_stats_mut(mb)->probes++;
    send_ping(mb, m->addr, m->id, p->seq, m);
}

static void probe_indirect(struct mb *mb)
{
    struct swim *sw = SW(mb);
    struct probe *p = &sw->pr;
    struct mb_member *t = mb_find(mb, p->target), *via[16];
    p->req_sent = 1;
    if (!probeable(t)) return;
    uint32_t k = mb_cfg(mb)->indirect_k < 16 ? mb_cfg(mb)->indirect_k : 16;
    size_t n = pick(mb, via, k, t->id);
    for (size_t i = 0; i < n; i++) {
        Kvtier__SwimMsg msg = KVTIER__SWIM_MSG__INIT;
        Kvtier__SwimPingReq r = KVTIER__SWIM_PING_REQ__INIT;
        r.target = t->id;
        r.target_addr = t->addr;
        r.seq = p->seq;
        msg.body_case = KVTIER__SWIM_MSG__BODY_PING_REQ;
        msg.ping_req = &r;
        send_msg(mb, via[i]->addr, &msg, MB_MSG_PING_REQ, via[i]);
    }
    p->expect = (uint32_t)n;
}

/* The period is over and no ack came: suspect the target. Missing nacks
 * mean the trouble may be ours: health worsens instead. */
static void probe_fail(struct mb *mb)
{
    struct swim *sw = SW(mb);
    struct probe *p = &sw->pr;
    struct mb_member *t = mb_find(mb, p->target);
    mb_stats_mut(mb)->probes_failed++;
    if (p->expect > p->nacks) health_add(mb, (int)(p->expect - p->nacks));
    if (t && t->state == MB_SUSPECT && t->be) { /* an independent confirmation */
        if (confirm(mb, t, mb_self(mb)->id))
            enqueue(mb, t->id, MB_SUSPECT, t->inc, NULL, NULL, 0, mb_self(mb)->id);
        return;
    }
    if (!t || t->state != MB_ALIVE) return;
    mb_stats_mut(mb)->suspicions++;
    set_state(mb, t, MB_SUSPECT, t->inc, mb_self(mb)->id);
    enqueue(mb, t->id, MB_SUSPECT, t->inc, NULL, NULL, 0, mb_self(mb)->id);
}

static void probe_tick(struct mb *mb, uint64_t now)
{
    struct swim *sw = SW(mb);
    struct probe *p = &sw->pr;
    if (p->active && !p->acked && !p->req_sent && now >= p->req_at_ms) probe_indirect(mb);
    if (p->active && now >= p->end_ms) {
        p->active = 0;
        if (!p->acked) probe_fail(mb);
    }
    if (now >= sw->next_probe) {
        sw->next_probe = now + scaled(mb, mb_cfg(mb)->probe_ms);
        if (!p->active) probe_start(mb, now);
    }
}

/* ------------------------------------------------------------ handlers */

static void on_ping(struct mb *mb, const Kvtier__SwimMsg *msg)
{
    if (msg->ping->target != mb_self(mb)->id) return; /* meant for a previous occupant */
    send_ack(mb, msg->from_addr, msg->ping->seq, 0, mb_find(mb, msg->from));
}

/* How long a relay waits for the target before it Nacks: 80% of what is
 * left of the origin's period after its ping-req went out (Lifeguard), so
 * the Nack reaches the origin before the origin judges the probe -- the
 * Nacks it expects and misses are what tell it that the trouble is its
 * own. */
static uint64_t nack_wait(struct mb *mb)
{
    const struct mb_config *c = mb_cfg(mb);
    uint64_t left = c->probe_ms > c->probe_timeout_ms ? c->probe_ms - c->probe_timeout_ms
                                                      : c->probe_timeout_ms;
    return left * 4 / 5;
}

static void on_ping_req(struct mb *mb, const Kvtier__SwimMsg *msg, uint64_t rx)
{
    struct swim *sw = SW(mb);
    const Kvtier__SwimPingReq *r = msg->ping_req;
    if (strlen(r->target_addr) >= MB_ADDR_MAX || !r->target_addr[0]) {
        mb_count_bad(mb);
        return;
    }
    struct relay *rl = &sw->rel[0];
    for (size_t i = 0; i < SW_RELAYS; i++) { /* a free slot, else the oldest */
        if (!sw->rel[i].used) {
            rl = &sw->rel[i];
            break;
        }
        if (sw->rel[i].deadline_ms < rl->deadline_ms) rl = &sw->rel[i];
    }
    rl->used = 1;
    rl->nacked = 0;
    rl->seq = ++sw->seq;
    rl->origin_seq = r->seq;
    rl->nack_ms = rx + nack_wait(mb);
    rl->deadline_ms = rx + mb_cfg(mb)->probe_timeout_ms;
    snprintf(rl->origin, sizeof rl->origin, "%s", msg->from_addr);
    send_ping(mb, r->target_addr, r->target, rl->seq, mb_find(mb, r->target));
}

static void on_ack(struct mb *mb, uint32_t seq, uint64_t rx, int nack)
{
    struct swim *sw = SW(mb);
    struct probe *p = &sw->pr;
    if (p->active && seq == p->seq && rx <= p->end_ms) {
        if (nack) {
            p->nacks++;
            return;
        }
        if (!p->acked) health_add(mb, -1);
        p->acked = 1;
        p->active = 0; /* done: no timer of it may keep ticking */
        return;
    }
    if (nack) return;
    for (size_t i = 0; i < SW_RELAYS; i++) {
        struct relay *rl = &sw->rel[i];
        if (rl->used && rl->seq == seq) {
            rl->used = 0;
            send_ack(mb, rl->origin, rl->origin_seq, 0, NULL);
            return;
        }
    }
}

/* A table. The answer to a join (its `join` echoes the request's) is the
 * seed's table: the members this node learns from it are no news to the
 * seed's cluster, so they are not queued for gossip -- re-gossiping them
 * cost every joiner a whole table's claims times the retransmits (a third
 * of all claim sends while a fleet forms). What that re-gossip also did,
 * repair the few pairs gossip misses, the first answer's announce does
 * (below). What a table changes about a member known here spreads as
 * before, and so does everything a periodic push-pull sync teaches (a
 * healed partition, a member gossip missed). */
static void on_sync(struct mb *mb, const Kvtier__SwimMsg *msg)
{
    struct swim *sw = SW(mb);
    const Kvtier__SwimSync *s = msg->sync;
    int first = !s->reply && !sw->synced;
    if (!s->reply) sw->synced = 1; /* an answer: someone has our table */
    sw->quiet = !s->reply && s->join;
    for (size_t i = 0; i < s->n_members; i++) merge(mb, s->members[i], 1);
    if (sw->quiet && first)
        sw->announce_at = mb_now(mb) + SW_ANNOUNCE_PERIODS * (uint64_t)mb_cfg(mb)->probe_ms;
    sw->quiet = 0;
    if (s->reply) send_sync(mb, msg->from_addr, 0, s->join);
}

/* The sender doubted this node (it refuted, or restated its claim), or
 * this node holds the sender dead although it just spoke: tell it at once
 * instead of waiting for gossip, which neither side would route to a
 * member it holds dead.
 * One message carrying this node's own claim first (its refutation) and
 * the sender's death as held here (buddy), so the sender refutes in turn;
 * each step raises an incarnation, so the exchange ends. This is what
 * heals a partition quickly: one poke across the old line (sync_tick)
 * revives both ends, and gossip carries the news on each side. */
static void answer_doubt(struct mb *mb, const Kvtier__SwimMsg *msg)
{
    struct swim *sw = SW(mb);
    struct mb_member *from = mb_find(mb, msg->from);
    int dead = from && from->state == MB_DEAD;
    if (!sw->doubted && !dead && !sw->ask && !sw->give) return;
    sw->lead_self = sw->doubted || dead; /* not for a mere ask */
    sw->doubted = 0;
    send_gossip_to(mb, msg->from_addr, from);
    sw->lead_self = 0;
}

/* A message from a member this node does not know, carrying no claim
 * about it: ask it for its claim. Gossip reaches nearly everyone, but not
 * always, and a member it missed hears of the newcomer only from a
 * push-pull sync (minutes apart at fleet size) -- although the newcomer
 * itself talks to it: probes, ping-reqs, gossip. The sender's address
 * alone lacks its incarnation and metadata, so one message asks
 * (want_claim, on whatever goes back first) and the answer carries the
 * whole claim. A sync brings the sender's claim itself. */
static int stranger(struct mb *mb, const Kvtier__SwimMsg *msg)
{
    if (msg->body_case == KVTIER__SWIM_MSG__BODY_SYNC || mb_find(mb, msg->from)) return 0;
    for (size_t i = 0; i < msg->n_gossip; i++)
        if (msg->gossip[i]->id == msg->from) return 0; /* applied or refused */
    return 1;
}

static enum mb_msg msg_type(const Kvtier__SwimMsg *msg)
{
    switch (msg->body_case) {
    case KVTIER__SWIM_MSG__BODY_PING: return MB_MSG_PING;
    case KVTIER__SWIM_MSG__BODY_PING_REQ: return MB_MSG_PING_REQ;
    case KVTIER__SWIM_MSG__BODY_ACK: return MB_MSG_ACK;
    case KVTIER__SWIM_MSG__BODY_NACK: return MB_MSG_NACK;
    case KVTIER__SWIM_MSG__BODY_SYNC: return MB_MSG_SYNC;
    default: return MB_MSG_GOSSIP;
    }
}

static int well_formed(const struct mb *mb, const Kvtier__SwimMsg *msg)
{
    if (!msg->from || msg->from == mb_self(mb)->id) return 0;
    if (!msg->from_addr[0] || strlen(msg->from_addr) >= MB_ADDR_MAX) return 0;
    for (size_t i = 0; i < msg->n_gossip; i++)
        if (strlen(msg->gossip[i]->addr) >= MB_ADDR_MAX || msg->gossip[i]->meta.len > MB_META_MAX)
            return 0;
    if (msg->body_case == KVTIER__SWIM_MSG__BODY_SYNC)
        for (size_t i = 0; i < msg->sync->n_members; i++)
            if (strlen(msg->sync->members[i]->addr) >= MB_ADDR_MAX ||
                msg->sync->members[i]->meta.len > MB_META_MAX)
                return 0;
    return msg->body_case != KVTIER__SWIM_MSG__BODY__NOT_SET;
}

/* Unpacking a message allocates each claim, address and metadata block
 * on its own, and they all go with the message; malloc for them was a
 * quarter of a forming fleet's CPU. They are bumped off one block: for a
 * message of at most max_msg_bytes (gossip) SW_ARENA bytes kept per
 * node, for a larger one (a sync carries the whole table) one block of 16
 * times its length, for that message; what does not fit goes to malloc. */
static void *ar_alloc(void *ad, size_t sz)
{
    struct swim *sw = ad;
    size_t n = (sz + 15) & ~(size_t)15;
    if (n <= sw->ar_cap - sw->ar_used) {
        void *p = sw->ar_blk + sw->ar_used;
        sw->ar_used += n;
        return p;
    }
    return malloc(sz ? sz : 1);
}

static void ar_free(void *ad, void *p)
{
    struct swim *sw = ad;
    uintptr_t a = (uintptr_t)p, lo = (uintptr_t)sw->ar_blk;
    if (p && (a < lo || a >= lo + sw->ar_cap)) free(p);
}

static void handle(struct mb *mb, const Kvtier__SwimMsg *msg, size_t len, uint64_t rx);

static void sw_receive(struct mb *mb, const void *buf, size_t len, uint64_t rx)
{
    struct swim *sw = SW(mb);
    ProtobufCAllocator al = {ar_alloc, ar_free, sw};
    uint8_t *big = len > mb_cfg(mb)->max_msg_bytes ? xalloc(NULL, 16 * len) : NULL;
    sw->ar_blk = big ? big : sw->ar;
    sw->ar_cap = big ? 16 * len : SW_ARENA;
    sw->ar_used = 0;
    Kvtier__SwimMsg *msg = kvtier__swim_msg__unpack(&al, len, buf);
    if (msg && well_formed(mb, msg)) handle(mb, msg, len, rx);
    else mb_count_bad(mb);
    if (msg) kvtier__swim_msg__free_unpacked(msg, &al);
    free(big);
}

static void handle(struct mb *mb, const Kvtier__SwimMsg *msg, size_t len, uint64_t rx)
{
    struct swim *sw = SW(mb);
    mb_count_rx(mb, msg_type(msg), len);
    sw->doubted = 0;
    for (size_t i = 0; i < msg->n_gossip; i++) merge(mb, msg->gossip[i], 0);
    sw->sender = msg->from_addr;
    sw->ask = stranger(mb, msg);
    sw->give = msg->want_claim;
    switch (msg->body_case) {
    case KVTIER__SWIM_MSG__BODY_PING: on_ping(mb, msg); break;
    case KVTIER__SWIM_MSG__BODY_PING_REQ: on_ping_req(mb, msg, rx); break;
    case KVTIER__SWIM_MSG__BODY_ACK: on_ack(mb, msg->ack->seq, rx, 0); break;
    case KVTIER__SWIM_MSG__BODY_NACK: on_ack(mb, msg->nack->seq, rx, 1); break;
    case KVTIER__SWIM_MSG__BODY_SYNC: on_sync(mb, msg); break;
    default: break;
    }
    answer_doubt(mb, msg);
    sw->sender = NULL;
    sw->ask = sw->give = 0;
}

/* --------------------------------------------------------------- timers */

static void relay_tick(struct mb *mb, uint64_t now)
{
    struct swim *sw = SW(mb);
    for (size_t i = 0; i < SW_RELAYS; i++) {
        struct relay *rl = &sw->rel[i];
        if (rl->used && !rl->nacked && now >= rl->nack_ms) {
            rl->nacked = 1;
            send_ack(mb, rl->origin, rl->origin_seq, 1, NULL);
        }
        if (rl->used && now >= rl->deadline_ms) rl->used = 0;
    }
}

/* A suspicion still open past the minimum timeout gathered too few
 * confirmations to end there -- its suspect may be alive after all, the
 * others knowing better: a member restarted at a new incarnation whose
 * alive claim gossip never brought here. Nothing else need go from this
 * node to the suspect before the longest timeout (its next turn in the
 * round can be n periods away), so the suspect is told: one bare message
 * carrying the suspicion (buddy), to which a live suspect answers at once
 * with its claim (it refutes, or restates a newer incarnation); a crashed
 * one never reads it. Again each minimum timeout while the suspicion
 * lasts (the message or the answer may be lost), one suspect a period at
 * most (a partition leaves hundreds open at once); never sooner than the
 * minimum timeout, so a confirmed crash dies first, at no cost. */
static void susp_tell(struct mb *mb, struct mb_member *m, struct susp *s, uint64_t now)
{
    struct swim *sw = SW(mb);
    if (now < s->check_ms || now < sw->next_tell) return;
    s->check_ms = now + (uint64_t)susp_min(mb);
    sw->next_tell = now + mb_cfg(mb)->probe_ms;
    sw->bare = 1;
    send_gossip(mb, m);
    sw->bare = 0;
}

static void susp_tick(struct mb *mb, uint64_t now)
{
    struct swim *sw = SW(mb);
    for (size_t i = 0; i < sw->nsusp;) {
        struct mb_member *m = mb_find(mb, sw->susp[i]);
        struct susp *s = m ? m->be : NULL;
        if (s && now >= s->deadline_ms) {
            set_state(mb, m, MB_DEAD, m->inc, mb_self(mb)->id); /* removes susp[i] */
            enqueue(mb, m->id, MB_DEAD, m->inc, NULL, NULL, 0, mb_self(mb)->id);
            continue;
        }
        if (s) susp_tell(mb, m, s, now);
        if (!s) sw->susp[i] = sw->susp[--sw->nsusp];
        else i++;
    }
}

static void gossip_tick(struct mb *mb, uint64_t now)
{
    struct swim *sw = SW(mb);
    const struct mb_config *c = mb_cfg(mb);
    if (c->gossip_ms == UINT32_MAX || now < sw->next_gossip) return;
    /* Advanced even when idle: next_tick never shows a stale time. */
    sw->next_gossip = now + c->gossip_ms;
    struct mb_member *to[16];
    size_t n = gq_len(&sw->q) ? pick_in(mb, to, c->gossip_nodes < 16 ? c->gossip_nodes : 16, 0, 1) : 0;
    for (size_t i = 0; i < n && gq_len(&sw->q); i++) send_gossip(mb, to[i]);
}

/* memberlist's scaling: the push-pull interval grows with log2(n) past 32
 * members, so its cost per node stays flat. */
static uint64_t sync_interval(struct mb *mb)
{
    uint64_t n = n_cluster(mb), ms = mb_cfg(mb)->sync_ms;
    if (n <= 32) return ms;
    return ms * (uint64_t)(ceil(log2((double)n) - log2(32.0)) + 1);
}

static struct mb_member *random_in(struct mb *mb, enum mb_state st)
{
    size_t n = mb_count(mb);
    for (int tries = 0; n && tries < 32; tries++) {
        struct mb_member *m = mb_at(mb, mb_rand(mb) % n);
        if (m->state == st) return m;
    }
    return NULL;
}

/* One of the dead members, uniformly (a scan: when few of many are dead,
 * random tries miss them and the last ones of a healed partition waited
 * minutes for their turn). */
static struct mb_member *random_dead(struct mb *mb)
{
    uint64_t ndead = mb_stats(mb)->members[MB_DEAD];
    if (!ndead) return NULL; /* the usual case: no scan */
    uint64_t k = mb_rand(mb) % ndead;
    for (size_t i = 0; i < mb_count(mb); i++) {
        struct mb_member *m = mb_at(mb, i);
        if (m->state == MB_DEAD && k-- == 0) return m;
    }
    return NULL;
}

/* A joiner, SW_ANNOUNCE_PERIODS after its seed's table came: its own
 * claim, alone, to every member it holds live, and a push-pull with one
 * of them. Gossip of a new member reaches each other one with
 * probability about 1 - e^-lim (lim sends by each of n members to
 * random ones), so a formation at N = 1 000 misses a pair or two, and a
 * joiner inherits its seed's holes; the joiner re-gossiping that table
 * repaired both at the price of a third of all claim sends, and without
 * it they waited for a periodic push-pull (180 s apart per node at
 * N = 1 000: formation took 157-209 s of virtual time in three runs of
 * four, 22 s with this).
 * Told directly, a member the gossip missed learns the joiner (one that
 * knows it drops the claim unchanged); the second table fills the
 * seed's holes. n small messages and one exchange of tables a join. */
static void announce(struct mb *mb)
{
    struct swim *sw = SW(mb);
    sw->announcing = 1;
    for (size_t i = 0; i < mb_count(mb); i++) {
        struct mb_member *m = mb_at(mb, i);
        if (probeable(m)) send_gossip(mb, m);
    }
    sw->announcing = 0;
    struct mb_member *m = random_in(mb, MB_ALIVE);
    if (m) send_sync(mb, m->addr, 1, 0);
}

static void sync_tick(struct mb *mb, uint64_t now)
{
    struct swim *sw = SW(mb);
    const struct mb_config *c = mb_cfg(mb);
    if (now >= sw->next_sync) {
        sw->next_sync = now + sync_interval(mb);
        struct mb_member *m = random_in(mb, MB_ALIVE);
        if (m) send_sync(mb, m->addr, 1, 0);
    }
    if (now >= sw->next_poke) { /* ... and a poke: "you are dead here" */
        sw->next_poke = now + c->probe_ms;
        struct mb_member *m = random_dead(mb);
        sw->bare = 1; /* its death only: queued gossip to a member that
                         is most likely dead would be retransmits lost */
        if (m) send_gossip(mb, m);
        sw->bare = 0;
    }
    if (sw->announce_at && now >= sw->announce_at) {
        sw->announce_at = 0;
        announce(mb);
    }
    if (sw->nseeds && !sw->synced && now >= sw->next_join) {
        sw->next_join = now + 2ull * c->probe_ms;
        for (size_t i = 0; i < sw->nseeds; i++) send_sync(mb, sw->seeds[i], 1, 1);
    }
}

/* Once a second, the members down for reap_ms go (mb_reap: a state set
 * later in this tick than now, read before it, is 0 ms old). */
static void reap_tick(struct mb *mb, uint64_t now)
{
    struct swim *sw = SW(mb);
    if (now < sw->next_reap) return;
    sw->next_reap = now + 1000;
    mb_reap(mb, now);
}

static void sw_tick(struct mb *mb, uint64_t now)
{
    struct swim *sw = SW(mb);
    uint64_t late = mb_cfg(mb)->probe_ms / 2, due = sw->next_probe;
    if (late < SW_LATE_MS_MIN) late = SW_LATE_MS_MIN;
    if (sw->pr.active) { /* the probe's timers are the ones always kept */
        uint64_t t = sw->pr.req_sent ? sw->pr.end_ms : sw->pr.req_at_ms;
        if (t < due) due = t;
    }
    if (now > due + late && sw->pr.active) {
        /* A timer overdue this much: this node stalled (paused, starved)
         * and cannot judge the probe in flight. */
        sw->pr.active = 0;
        health_add(mb, 1);
        sw->next_probe = now + scaled(mb, mb_cfg(mb)->probe_ms);
    }
    relay_tick(mb, now);
    probe_tick(mb, now);
    susp_tick(mb, now);
    gossip_tick(mb, now);
    sync_tick(mb, now);
    reap_tick(mb, now);
}

static uint64_t sw_next_tick(struct mb *mb)
{
    struct swim *sw = SW(mb);
    uint64_t t = sw->next_probe < sw->next_reap ? sw->next_probe : sw->next_reap;
#define LOWER(x) \
    do { \
        if ((x) < t) t = (x); \
    } while (0)
    if (sw->pr.active) LOWER(sw->pr.req_sent ? sw->pr.end_ms : sw->pr.req_at_ms);
    if (gq_len(&sw->q) && mb_cfg(mb)->gossip_ms != UINT32_MAX) LOWER(sw->next_gossip);
    LOWER(sw->next_sync);
    LOWER(sw->next_poke);
    if (sw->nseeds && !sw->synced) LOWER(sw->next_join);
    if (sw->announce_at) LOWER(sw->announce_at);
    for (size_t i = 0; i < SW_RELAYS; i++)
        if (sw->rel[i].used)
            LOWER(sw->rel[i].nacked ? sw->rel[i].deadline_ms : sw->rel[i].nack_ms);
    for (size_t i = 0; i < sw->nsusp; i++) {
        struct mb_member *m = mb_find(mb, sw->susp[i]);
        if (m && m->be) LOWER(((struct susp *)m->be)->deadline_ms);
    }
#undef LOWER
    return t;
}

/* ----------------------------------------------------------- lifecycle */

static int sw_open(struct mb *mb)
{
    struct swim *sw = xalloc(NULL, sizeof *sw);
    memset(sw, 0, sizeof *sw);
    mb_set_backend(mb, sw);
    uint64_t now = mb_now(mb);
    const struct mb_config *c = mb_cfg(mb);
    /* Spread the first probes of nodes started together. */
    sw->next_probe = now + mb_rand(mb) % c->probe_ms;
    sw->next_gossip = now + c->gossip_ms % 100000;
    sw->next_sync = now + c->sync_ms / 2 + mb_rand(mb) % (c->sync_ms / 2 + 1);
    sw->next_poke = now + mb_rand(mb) % c->probe_ms;
    sw->next_reap = now + 1000;
    return 0;
}

static void sw_close(struct mb *mb)
{
    struct swim *sw = SW(mb);
    if (!sw) return;
    for (size_t i = 0; i < mb_count(mb); i++) {
        free(mb_at(mb, i)->be);
        mb_at(mb, i)->be = NULL;
    }
    for (size_t i = 0; i < sw->nseeds; i++) free(sw->seeds[i]);
    free(sw->seeds);
    gq_free(&sw->q);
    free(sw->pk_sm);
    free(sw->pk_sp);
    free(sw->pk_ids);
    free(sw->order);
    free(sw->susp);
    free(sw);
}

static int sw_join(struct mb *mb, const char *const *seeds, size_t n, uint64_t now)
{
    struct swim *sw = SW(mb);
    for (size_t i = 0; i < n; i++) {
        if (!seeds[i] || !seeds[i][0] || strlen(seeds[i]) >= MB_ADDR_MAX) return -1;
        if (!strcmp(seeds[i], mb_self(mb)->addr)) continue;
        sw->seeds = xalloc(sw->seeds, (sw->nseeds + 1) * sizeof *sw->seeds);
        sw->seeds[sw->nseeds++] = strdup(seeds[i]);
        if (!sw->seeds[sw->nseeds - 1]) abort();
    }
    sw->next_join = now; /* the next tick sends them */
    return 0;
}

/* A left claim, pushed at once to several members; they gossip it on. */
static int sw_leave(struct mb *mb, uint64_t now)
{
    (void)now;
    struct mb_member *self = mb_self(mb), *to[16];
    SW(mb)->announce_at = 0; /* a node that left tells nobody it is alive */
    mb_set_state(mb, self, MB_ALIVE, self->inc + 1);
    enqueue(mb, self->id, MB_LEFT, self->inc, NULL, NULL, 0, self->id);
    uint32_t k = 2 * mb_cfg(mb)->gossip_nodes;
    size_t n = pick(mb, to, k < 16 ? k : 16, 0);
    for (size_t i = 0; i < n; i++) send_gossip(mb, to[i]);
    return 0;
}

static void sw_meta_changed(struct mb *mb, uint64_t now)
{
    (void)now;
    struct mb_member *self = mb_self(mb);
    mb_set_state(mb, self, MB_ALIVE, self->inc + 1);
    enqueue_member(mb, self, self->id);
}

const struct mb_ops swim_ops = {
    .name = "swim",
    .open = sw_open,
    .close = sw_close,
    .join = sw_join,
    .tick = sw_tick,
    .receive = sw_receive,
    .leave = sw_leave,
    .meta_changed = sw_meta_changed,
    .next_tick = sw_next_tick,
    .ask = sw_ask,
};
