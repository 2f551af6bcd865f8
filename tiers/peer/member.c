/*
 * member.c -- the member table every membership backend shares.
 *
 * Design: members are allocated one by one (a pointer stays valid until
 * its MB_EV_GONE) and listed in a dense array (mb_at, random picks) that
 * is compacted by swapping the last one into a freed slot. An open-
 * addressing hash (linear probing, backward-shift deletion, grown at half
 * load) maps id -> array index, so lookups are O(1) at any size and there
 * is no member cap. Every state change goes through mb_set_state(), which
 * keeps the gauges and the epoch and fires the change callback: backends
 * cannot forget one.
 *
 * Memory: a member is one allocation -- the record, then its address and
 * metadata bytes right behind it, sized to them -- because a simulated
 * fleet holds N tables of N members (25 M at N = 5 000). An update that
 * outgrows those bytes moves both into one separate block (`ext`).
 */
#include "member.h"
#include "pxalloc.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct node {
    struct mb_member pub;   /* first: a struct mb_member * is a struct node * */
    uint32_t idx;           /* position in mb->v */
    uint32_t room;          /* bytes behind the record for addr + meta */
    char *ext;              /* addr + meta when they outgrew room, or NULL */
};

struct mb {
    const struct mb_ops *ops;
    void *be;
    struct mb_config cfg;
    char self_addr[MB_ADDR_MAX];
    struct node *self;
    struct node **v;        /* the other members, dense */
    size_t n, cap;
    uint32_t *hk;           /* hash: id (0 = empty) */
    uint32_t *hv;           /* hash: index into v */
    size_t hcap;            /* power of two */
    uint64_t epoch;
    size_t live;
    struct mb_stats st;
    int left;
};

#define xcalloc(n, sz) px_calloc(n, sz, "member")
#define xrealloc(p, sz) px_realloc(p, sz, "member")

/* ------------------------------------------------------------ defaults */

#define DEF(f, v) \
    do { \
        if (!cfg->f) cfg->f = (v); \
    } while (0)

void mb_config_defaults(struct mb_config *cfg)
{
    DEF(probe_ms, 700);
    DEF(probe_timeout_ms, 350);
    DEF(indirect_k, 3);
    DEF(suspicion_mult, 2);
    DEF(suspicion_max_mult, 6);
    DEF(retransmit_mult, 4);
    DEF(max_msg_bytes, 1400);
    DEF(awareness_max, 8);
    DEF(gossip_ms, 200);
    DEF(gossip_nodes, 3);
    DEF(sync_ms, 30000);
    DEF(reap_ms, 60000);
    DEF(lease_ms, 10000);
}

/* ---------------------------------------------------------------- hash */

static size_t slot_of(uint32_t id, size_t cap)
{
    uint64_t h = (uint64_t)id * 0x9E3779B97F4A7C15ull;
    return (size_t)(h >> 32) & (cap - 1);
}

static void h_put(struct mb *mb, uint32_t id, uint32_t idx)
{
    size_t i = slot_of(id, mb->hcap);
    while (mb->hk[i] && mb->hk[i] != id) i = (i + 1) & (mb->hcap - 1);
    mb->hk[i] = id;
    mb->hv[i] = idx;
}

static void h_grow(struct mb *mb)
{
    uint32_t *ok = mb->hk, *ov = mb->hv;
    size_t oc = mb->hcap;
    mb->hcap = oc ? oc * 2 : 16;
    mb->hk = xcalloc(mb->hcap, sizeof *mb->hk);
    mb->hv = xcalloc(mb->hcap, sizeof *mb->hv);
    for (size_t i = 0; i < oc; i++)
        if (ok[i]) h_put(mb, ok[i], ov[i]);
    free(ok);
    free(ov);
}

static long h_find(const struct mb *mb, uint32_t id)
{
    if (!mb->hcap || !id) return -1;
    size_t i = slot_of(id, mb->hcap);
    while (mb->hk[i]) {
        if (mb->hk[i] == id) return (long)i;
        i = (i + 1) & (mb->hcap - 1);
    }
    return -1;
}

/* Backward-shift deletion keeps every probe chain unbroken. */
static void h_del(struct mb *mb, size_t i)
{
    size_t mask = mb->hcap - 1, j = i;
    mb->hk[i] = 0;
    for (;;) {
        j = (j + 1) & mask;
        if (!mb->hk[j]) return;
        size_t home = slot_of(mb->hk[j], mb->hcap);
        /* j's entry may move to i if home is not cyclically in (i, j]. */
        int stays = i <= j ? (home > i && home <= j) : (home > i || home <= j);
        if (stays) continue;
        mb->hk[i] = mb->hk[j];
        mb->hv[i] = mb->hv[j];
        mb->hk[j] = 0;
        i = j;
    }
}

/* ------------------------------------------------------------- lookups */

struct mb_member *mb_find(const struct mb *mb, uint32_t id)
{
    if (!mb) return NULL;
    if (id == mb->self->pub.id) return &mb->self->pub;
    long i = h_find(mb, id);
    return i < 0 ? NULL : &mb->v[mb->hv[i]]->pub;
}

struct mb_member *mb_self(const struct mb *mb) { return &mb->self->pub; }
size_t mb_count(const struct mb *mb) { return mb ? mb->n : 0; }
struct mb_member *mb_at(const struct mb *mb, size_t i) { return i < mb->n ? &mb->v[i]->pub : NULL; }
size_t mb_live(const struct mb *mb) { return mb ? mb->live : 0; }
uint64_t mb_epoch(const struct mb *mb) { return mb ? mb->epoch : 0; }
const struct mb_stats *mb_stats(const struct mb *mb) { return &mb->st; }
struct mb_stats *mb_stats_mut(struct mb *mb) { return &mb->st; }
const struct mb_config *mb_cfg(const struct mb *mb) { return &mb->cfg; }
void *mb_backend(const struct mb *mb) { return mb->be; }
void mb_set_backend(struct mb *mb, void *be) { mb->be = be; }
uint64_t mb_now(const struct mb *mb) { return mb->cfg.env.now_ms(mb->cfg.env.ctx); }
uint64_t mb_rand(const struct mb *mb) { return mb->cfg.env.rand(mb->cfg.env.ctx); }
void mb_set_epoch(struct mb *mb, uint64_t epoch) { mb->epoch = epoch; }
const char *mb_backend_name(const struct mb *mb) { return mb->ops->name; }

const char *mb_state_name(enum mb_state s)
{
    static const char *const n[] = {"alive", "suspect", "dead", "left"};
    return (unsigned)s < MB_NSTATES ? n[s] : "?";
}

const char *mb_event_name(enum mb_event e)
{
    static const char *const n[] = {"join", "suspect", "alive", "dead", "left", "update", "gone"};
    return (unsigned)e < MB_NEVENTS ? n[e] : "?";
}

const char *mb_msg_name(enum mb_msg t)
{
    static const char *const n[] = {"ping", "ping_req", "ack", "nack",
                                    "sync", "gossip", "leave", "service"};
    return (unsigned)t < MB_NMSGS ? n[t] : "?";
}

/* ------------------------------------------------------------- counting */

int mb_send(struct mb *mb, const char *addr, const void *buf, size_t len, enum mb_msg t)
{
    if (mb->cfg.env.send(mb->cfg.env.ctx, addr, buf, len) != 0) {
        mb->st.tx_fail++;
        return -1;
    }
    mb->st.msgs_tx[t]++;
    mb->st.bytes_tx[t] += len;
    return 0;
}

void mb_count_rx(struct mb *mb, enum mb_msg t, size_t len)
{
    mb->st.msgs_rx[t]++;
    mb->st.bytes_rx[t] += len;
}

void mb_count_bad(struct mb *mb) { mb->st.rx_bad++; }

/* ------------------------------------------------------------- changes */

static int live_state(enum mb_state s) { return s == MB_ALIVE || s == MB_SUSPECT; }

static void fire(struct mb *mb, struct mb_member *m, enum mb_event ev, enum mb_state old)
{
    mb->st.events[ev]++;
    if (mb->cfg.on_change) mb->cfg.on_change(mb->cfg.on_change_arg, mb, m, ev, old);
}

/* A record with `room` bytes behind it for its address and metadata. */
static struct node *node_new(size_t room)
{
    struct node *nd = xcalloc(1, sizeof *nd + room);
    nd->room = (uint32_t)room;
    return nd;
}

static void node_free(struct node *nd)
{
    free(nd->ext);
    free(nd);
}

/* Store addr and meta (either may point into nd's own bytes): behind the
 * record when they fit, else in one separate block. Lengths checked. */
static void node_place(struct node *nd, const char *addr, const void *meta, size_t len)
{
    char tmp[MB_ADDR_MAX + MB_META_MAX];
    size_t alen = strlen(addr) + 1;
    memcpy(tmp, addr, alen);
    if (len) memcpy(tmp + alen, meta, len);
    char *dst = (char *)(nd + 1), *old = nd->ext;
    nd->ext = NULL;
    if (alen + len > nd->room) dst = nd->ext = xcalloc(1, alen + len);
    memcpy(dst, tmp, alen + len);
    free(old);
    nd->pub.addr = dst;
    nd->pub.meta = len ? (uint8_t *)dst + alen : NULL;
    nd->pub.meta_len = (uint32_t)len;
}

struct mb_member *mb_add(struct mb *mb, uint32_t id, const char *addr, const void *meta,
                         size_t meta_len, uint64_t inc, enum mb_state st)
{
    if (!id || id == mb->self->pub.id || h_find(mb, id) >= 0 || !addr ||
        strlen(addr) >= MB_ADDR_MAX || meta_len > MB_META_MAX || (unsigned)st >= MB_NSTATES)
        return NULL;
    struct node *nd = node_new(strlen(addr) + 1 + meta_len);
    nd->pub.id = id;
    nd->pub.state = st;
    nd->pub.inc = inc;
    nd->pub.since_ms = mb_now(mb);
    node_place(nd, addr, meta, meta_len);
    if (mb->n == mb->cap) {
        mb->cap = mb->cap ? mb->cap * 2 : 16;
        mb->v = xrealloc(mb->v, mb->cap * sizeof *mb->v);
    }
    nd->idx = (uint32_t)mb->n;
    mb->v[mb->n++] = nd;
    if (2 * mb->n >= mb->hcap) h_grow(mb);
    h_put(mb, id, nd->idx);
    mb->st.members[st]++;
    if (live_state(st)) {
        mb->live++;
        mb->epoch++;
        fire(mb, &nd->pub, MB_EV_JOIN, st);
    }
    return &nd->pub;
}

static enum mb_event event_for(enum mb_state old, enum mb_state st)
{
    switch (st) {
    case MB_SUSPECT: return MB_EV_SUSPECT;
    case MB_DEAD: return MB_EV_DEAD;
    case MB_LEFT: return MB_EV_LEFT;
    default: (void)old; return MB_EV_ALIVE;
    }
}

void mb_set_state(struct mb *mb, struct mb_member *m, enum mb_state st, uint64_t inc)
{
    enum mb_state old = m->state;
    if (m == &mb->self->pub) { /* self: only the incarnation moves */
        m->inc = inc;
        return;
    }
    if (old == st) {
        m->inc = inc;
        return;
    }
    mb->st.members[old]--;
    mb->st.members[st]++;
    mb->live += (size_t)live_state(st) - (size_t)live_state(old);
    if (old == MB_DEAD && st == MB_ALIVE && inc > m->inc) mb->st.false_deaths++;
    m->state = st;
    m->inc = inc;
    m->since_ms = mb_now(mb);
    mb->epoch++;
    fire(mb, m, event_for(old, st), old);
}

int mb_update(struct mb *mb, struct mb_member *m, const char *addr, const void *meta,
              size_t meta_len)
{
    if ((addr && strlen(addr) >= MB_ADDR_MAX) || meta_len > MB_META_MAX) return -1;
    if (!addr) addr = m->addr;
    if (!meta) {
        meta = m->meta;
        meta_len = m->meta_len;
    }
    int changed = strcmp(addr, m->addr) != 0 || meta_len != m->meta_len ||
                  (meta_len && memcmp(meta, m->meta, meta_len) != 0);
    if (!changed) return 0;
    node_place((struct node *)m, addr, meta, meta_len);
    if (m != &mb->self->pub) fire(mb, m, MB_EV_UPDATE, m->state);
    return 0;
}

static void free_node(struct mb *mb, struct node *nd)
{
    fire(mb, &nd->pub, MB_EV_GONE, nd->pub.state);
    node_free(nd);
}

void mb_remove(struct mb *mb, struct mb_member *m)
{
    struct node *nd = (struct node *)m;
    long h = h_find(mb, m->id);
    if (h < 0 || nd == mb->self) return;
    h_del(mb, (size_t)h);
    uint32_t i = nd->idx;
    mb->v[i] = mb->v[--mb->n];
    mb->v[i]->idx = i;
    if (i != mb->n) h_put(mb, mb->v[i]->pub.id, i);
    mb->st.members[m->state]--;
    if (live_state(m->state)) {
        mb->live--;
        mb->epoch++;
    }
    free_node(mb, nd);
}

uint64_t mb_reap(struct mb *mb, uint64_t now)
{
    uint64_t keep = mb->cfg.reap_ms, next = UINT64_MAX;
    if (!mb->st.members[MB_DEAD] && !mb->st.members[MB_LEFT]) return next; /* O(1) */
    for (size_t i = 0; i < mb->n;) {
        struct mb_member *m = &mb->v[i]->pub;
        if (m->state != MB_DEAD && m->state != MB_LEFT) {
            i++;
            continue;
        }
        uint64_t age = now > m->since_ms ? now - m->since_ms : 0;
        if (age >= keep) {
            mb_remove(mb, m); /* the last one moves into slot i */
            continue;
        }
        if (m->since_ms + keep < next) next = m->since_ms + keep;
        i++;
    }
    return next;
}

/* ----------------------------------------------------------- lifecycle */

static const char *check_cfg(const struct mb_config *c)
{
    if (!c->self_id) return "self id is 0";
    if (!c->self_addr || !c->self_addr[0] || strlen(c->self_addr) >= MB_ADDR_MAX)
        return "bad self address";
    if (c->meta_len > MB_META_MAX || (c->meta_len && !c->meta)) return "metadata too long";
    if (!c->env.send || !c->env.now_ms || !c->env.rand) return "env lacks send/now/rand";
    if (c->max_msg_bytes < 256) return "max_msg_bytes below 256";
    return NULL;
}

struct mb *mb_create(const struct mb_ops *ops, const struct mb_config *cfg, const char **why)
{
    struct mb_config c = *cfg;
    mb_config_defaults(&c);
    const char *bad = check_cfg(&c);
    if (bad) {
        if (why) *why = bad;
        return NULL;
    }
    struct mb *mb = xcalloc(1, sizeof *mb);
    mb->ops = ops;
    mb->cfg = c;
    snprintf(mb->self_addr, sizeof mb->self_addr, "%s", c.self_addr);
    mb->cfg.self_addr = mb->self_addr;
    mb->cfg.meta = NULL; /* lives in self->pub.meta */
    mb->self = node_new(MB_ADDR_MAX + MB_META_MAX); /* never outgrown */
    mb->self->pub.id = c.self_id;
    mb->self->pub.state = MB_ALIVE;
    mb->self->pub.inc = c.inc ? c.inc : mb_now(mb);
    node_place(mb->self, c.self_addr, c.meta, c.meta_len);
    if (ops->open && ops->open(mb) != 0) {
        if (why) *why = "backend failed to open";
        mb->cfg.on_change = NULL;
        mb_destroy(mb);
        return NULL;
    }
    /* Not copied: a service backend copies them in open(). */
    mb->cfg.service_url = mb->cfg.service_prefix = NULL;
    return mb;
}

void mb_destroy(struct mb *mb)
{
    if (!mb) return;
    if (mb->ops->close) mb->ops->close(mb);
    mb->be = NULL;
    while (mb->n) free_node(mb, mb->v[--mb->n]);
    free(mb->v);
    free(mb->hk);
    free(mb->hv);
    if (mb->self) node_free(mb->self);
    free(mb);
}

int mb_join(struct mb *mb, const char *const *seeds, size_t n)
{
    if (mb->left) return -1;
    return mb->ops->join ? mb->ops->join(mb, seeds, n, mb_now(mb)) : 0;
}

void mb_ask(struct mb *mb, const char *addr)
{
    if (!mb->left && mb->ops->ask) mb->ops->ask(mb, addr);
}

void mb_tick(struct mb *mb, uint64_t now_ms)
{
    if (!mb->left && mb->ops->tick) mb->ops->tick(mb, now_ms);
}

void mb_receive(struct mb *mb, const void *buf, size_t len, uint64_t rx_ms)
{
    if (!mb->left && mb->ops->receive) mb->ops->receive(mb, buf, len, rx_ms);
}

int mb_leave(struct mb *mb)
{
    if (mb->left) return 0;
    int rv = mb->ops->leave ? mb->ops->leave(mb, mb_now(mb)) : 0;
    mb->left = 1;
    return rv;
}

uint64_t mb_next_tick(struct mb *mb)
{
    if (mb->ops->next_tick) return mb->ops->next_tick(mb);
    return mb_now(mb) + 10;
}

int mb_wake(struct mb *mb)
{
    if (!mb->cfg.env.wake) return 0;
    mb->cfg.env.wake(mb->cfg.env.ctx);
    return 1;
}

int mb_set_meta(struct mb *mb, const void *meta, size_t len)
{
    if (len > MB_META_MAX) return -1;
    struct mb_member *self = &mb->self->pub;
    if (len == self->meta_len && (!len || !memcmp(self->meta, meta, len))) return 0;
    node_place(mb->self, self->addr, meta, len);
    if (mb->ops->meta_changed && !mb->left) mb->ops->meta_changed(mb, mb_now(mb));
    return 0;
}
