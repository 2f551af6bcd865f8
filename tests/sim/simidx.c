/*
 * simidx.c -- the global index in the simulator: what a membership change
 * costs it and whether LOOKUPs still resolve while the fleet changes.
 *
 * Design: every simulated node holds K chunks (keys derived from its
 * index and a counter, one namespace) and runs the daemon's own republish
 * planner (tiers/peer/oplan.c: per-slot owners told, a change log, replay
 * by owners_delta) against its own view, kept from its membership events
 * as gidx.c keeps it: a member becoming live is a join, one no longer live
 * a leave, new metadata (a restarted daemon has a new UCX worker address)
 * a resend. A pass runs GX_DEBOUNCE_MS after a node's first change and
 * visits every slot at once (the daemon's slices only spread it out);
 * what it tells other nodes counts as entries, one batch of up to
 * SX_BATCH per destination as a message. An entry reaches its owner at
 * once if the owner is running, and is lost with the owner's life when it
 * stops (a restarted owner starts empty). Owners never drop entries here
 * (the daemon's sweep only drops entries no longer owned, which no asker
 * asks for once views agree).
 *
 * The truth: each key's owners among the running nodes, kept by replaying
 * every start and stop on them (owners_delta). `ideal` sums, per change,
 * the keys whose owners changed -- for a restart (a stop and a start of
 * the same node) the keys it owns, which it lost -- plus, for a node
 * that starts, new or restarted, its own keys times their owners other
 * than itself: they must hear of them (a restarted daemon cannot know
 * what its owners kept, so it publishes everything it holds).
 *
 * A sampled LOOKUP asks, as gidx.c does, a key's owners in the asker's
 * view plus one more per change in the last failure_ms: it resolves if
 * one of them is running and holds the entry; it waits for the lookup
 * timeout if one of them is not running (no reply comes).
 */
#include "simidx.h"

#include <stdlib.h>
#include <string.h>

#include "oplan.h"
#include "owners.h"

#define SX_DEBOUNCE_US 200000 /* gidx.c's GX_DEBOUNCE_MS */
#define SX_BATCH 512          /* gidx.c's GX_BATCH */
#define SX_SLOTS 6            /* owner entries remembered per key */
#define SX_NSH 7

struct xent {
    uint32_t owner, gen;
};

struct xnode {
    int up;
    uint32_t gen;             /* its life: entries told to older ones are gone */
    struct oplan pl;
    uint32_t *view, nview, vcap;
    int pass;
    uint64_t pass_due, changed_us;
    uint32_t changes;
    uint64_t stop_ideal;      /* keys it owned when it stopped */
    int stopped;
};

struct sidx {
    struct sim *s;
    uint32_t r, k, failure_ms;
    struct xnode *v;
    size_t n, cap;
    struct xent *ent;         /* [key][SX_SLOTS] */
    uint32_t *tr;             /* truth owners [key][r] */
    uint8_t *ntr;             /* how many */
    uint32_t *tv, ntv;        /* running ids */
    uint32_t *cnt, *touched;  /* per destination, this pass */
    struct sidx_stats st;
};

static void *xalloc(void *p, size_t sz)
{
    void *q = realloc(p, sz ? sz : 1);
    if (!q) abort();
    return q;
}

static kvt_key key_of(uint32_t holder, uint32_t j)
{
    kvt_key k;
    memset(&k, 0, sizeof k);
    memcpy(k.b, &holder, sizeof holder);
    memcpy(k.b + 4, &j, sizeof j);
    k.b[31] = 0x5a;
    return k;
}

static uint32_t rnd(struct sidx *x, uint32_t n) { return (uint32_t)(sim_rand(x->s) % n); }

static void grow(struct sidx *x, size_t n)
{
    if (n <= x->cap) return;
    size_t cap = x->cap ? x->cap : 64, keys;
    while (cap < n) cap *= 2;
    keys = cap * x->k;
    x->v = xalloc(x->v, cap * sizeof *x->v);
    memset(x->v + x->cap, 0, (cap - x->cap) * sizeof *x->v);
    x->ent = xalloc(x->ent, keys * SX_SLOTS * sizeof *x->ent);
    memset(x->ent + x->cap * x->k * SX_SLOTS, 0,
           (cap - x->cap) * x->k * SX_SLOTS * sizeof *x->ent);
    x->tr = xalloc(x->tr, keys * x->r * sizeof *x->tr);
    x->ntr = xalloc(x->ntr, keys);
    memset(x->ntr + x->cap * x->k, 0, (cap - x->cap) * x->k);
    x->tv = xalloc(x->tv, cap * sizeof *x->tv);
    x->cnt = xalloc(x->cnt, cap * sizeof *x->cnt);
    memset(x->cnt + x->cap, 0, (cap - x->cap) * sizeof *x->cnt);
    x->touched = xalloc(x->touched, cap * sizeof *x->touched);
    x->cap = cap;
}

/* ------------------------------------------------------------ entries */

static void ent_put(struct sidx *x, size_t key, uint32_t owner)
{
    struct xent *e = &x->ent[key * SX_SLOTS];
    const struct xnode *o = &x->v[owner - 1];
    int at = -1;
    for (int i = 0; i < SX_SLOTS && at < 0; i++)
        if (e[i].owner == owner) at = i;
    for (int i = 0; i < SX_SLOTS && at < 0; i++) /* an empty or stale slot */
        if (!e[i].owner || !x->v[e[i].owner - 1].up || e[i].gen != x->v[e[i].owner - 1].gen)
            at = i;
    if (at < 0) at = (int)(key % SX_SLOTS); /* full of live owners: forget one */
    e[at] = (struct xent){owner, o->gen};
}

static int ent_has(const struct sidx *x, size_t key, uint32_t owner)
{
    const struct xent *e = &x->ent[key * SX_SLOTS];
    const struct xnode *o = &x->v[owner - 1];
    for (int i = 0; i < SX_SLOTS; i++)
        if (e[i].owner == owner) return o->up && e[i].gen == o->gen;
    return 0;
}

/* --------------------------------------------------------- holder side */

static void view_add(struct xnode *h, uint32_t id)
{
    if (h->nview == h->vcap) {
        h->vcap = h->vcap ? 2 * h->vcap : 64;
        h->view = xalloc(h->view, h->vcap * sizeof *h->view);
    }
    h->view[h->nview++] = id;
}

static void view_set(struct xnode *h, uint32_t id, int live)
{
    for (uint32_t i = 0; i < h->nview; i++) {
        if (h->view[i] != id) continue;
        if (!live) h->view[i] = h->view[--h->nview];
        return;
    }
    if (live) view_add(h, id);
}

static void changed(struct sidx *x, struct xnode *h, uint32_t id, enum ow_change kind)
{
    uint64_t now = sim_now(x->s);
    if (now - h->changed_us >= (uint64_t)x->failure_ms * 1000) h->changes = 0;
    if (h->changes < OW_MAX_REPLICAS) h->changes++;
    h->changed_us = now;
    op_log(&h->pl, id, kind);
    if (!h->pass) h->pass_due = now + SX_DEBOUNCE_US;
    h->pass = 1;
}

static int live_state(enum mb_state st) { return st == MB_ALIVE || st == MB_SUSPECT; }

void sidx_on_change(struct sidx *x, int observer, struct mb_member *m, enum mb_event ev,
                    enum mb_state old)
{
    if (!x || (size_t)observer >= x->n || !x->v[observer].up) return;
    struct xnode *h = &x->v[observer];
    if (ev == MB_EV_UPDATE) {
        changed(x, h, m->id, OW_RESEND);
        return;
    }
    int was = ev == MB_EV_JOIN ? 0 : live_state(old);
    int is = ev == MB_EV_GONE ? 0 : live_state(m->state);
    if (was == is) return;
    view_set(h, m->id, is);
    changed(x, h, m->id, is ? OW_JOIN : OW_LEAVE);
}

/* One pass of node h: every slot brought up to date, the owners told. */
static void pass(struct sidx *x, uint32_t hi)
{
    struct xnode *h = &x->v[hi];
    uint32_t self = hi + 1, nt = 0;
    for (uint32_t j = 0; j < x->k; j++) {
        kvt_key k = key_of(self, j);
        uint32_t o[OW_MAX_REPLICAS], n, t[OW_MAX_REPLICAS], moved;
        uint32_t c = op_catch_up(&h->pl, op_rec(&h->pl, j), &k, SX_NSH, h->view, h->nview, o,
                                 &n, t, &moved);
        for (uint32_t i = 0; i < c; i++) {
            if (t[i] != self) {
                x->st.entries++;
                if (!x->cnt[t[i] - 1]++) x->touched[nt++] = t[i] - 1;
            }
            if (x->v[t[i] - 1].up) ent_put(x, (size_t)hi * x->k + j, t[i]);
        }
    }
    for (uint32_t i = 0; i < nt; i++) {
        x->st.msgs += (x->cnt[x->touched[i]] + SX_BATCH - 1) / SX_BATCH;
        x->cnt[x->touched[i]] = 0;
    }
    op_settle(&h->pl);
    h->pass = 0;
}

void sidx_step(struct sidx *x)
{
    uint64_t now = sim_now(x->s);
    for (size_t i = 0; i < x->n; i++)
        if (x->v[i].up && x->v[i].pass && now >= x->v[i].pass_due) pass(x, (uint32_t)i);
}

/* ------------------------------------------------------------- truth */

/* Node id starts or stops: the keys whose owners that changes. */
static uint64_t truth_change(struct sidx *x, uint32_t id, int up)
{
    uint64_t moved = 0;
    if (up) x->tv[x->ntv++] = id;
    else
        for (uint32_t i = 0; i < x->ntv; i++)
            if (x->tv[i] == id) {
                x->tv[i] = x->tv[--x->ntv];
                break;
            }
    for (size_t h = 0; h < x->n; h++)
        for (uint32_t j = 0; j < x->k; j++) {
            size_t key = h * x->k + j;
            kvt_key k = key_of((uint32_t)h + 1, j);
            uint32_t *o = &x->tr[key * x->r], n = x->ntr[key];
            if (!n && up) { /* a new holder's keys: its owners must hear of them */
                x->ntr[key] = (uint8_t)owners_of(&k, SX_NSH, x->tv, x->ntv, x->r, o);
                for (uint32_t q = 0; h + 1 == id && q < x->ntr[key]; q++) moved += o[q] != id;
                continue;
            }
            uint32_t t = owners_delta(&k, SX_NSH, o, &n, x->r, id, up ? OW_JOIN : OW_LEAVE,
                                      x->tv, x->ntv);
            x->ntr[key] = (uint8_t)n;
            if (h + 1 == id && up) /* a restarted holder cannot know what its owners kept */
                for (uint32_t q = 0; q < n; q++) moved += o[q] != id;
            else
                moved += t != OW_NONE;
        }
    return moved;
}

void sidx_on_life(struct sidx *x, int idx, int up)
{
    if (!x) return;
    grow(x, (size_t)idx + 1);
    if ((size_t)idx >= x->n) x->n = (size_t)idx + 1;
    struct xnode *h = &x->v[idx];
    uint64_t moved = truth_change(x, (uint32_t)idx + 1, up);
    if (!up) {
        h->up = 0;
        h->stop_ideal = moved;
        h->stopped = 1;
        x->st.changes++;
        x->st.ideal += moved;
        op_free(&h->pl);
        free(h->view);
        h->view = NULL;
        h->nview = h->vcap = 0;
        return;
    }
    if (h->stopped) { /* a restart: one change, the keys it owns now */
        x->st.changes--;
        x->st.ideal -= h->stop_ideal;
        h->stopped = 0;
    }
    x->st.changes++;
    x->st.ideal += moved;
    h->up = 1;
    h->gen++;
    op_init(&h->pl, x->r);
    view_set(h, (uint32_t)idx + 1, 1);
    h->pass = 1; /* publish what it holds, as gx_open does */
    h->pass_due = sim_now(x->s);
    h->changes = 0;
}

/* ------------------------------------------------------------ lifecycle */

struct sidx *sidx_new(struct sim *s, uint32_t r, uint32_t keys, uint32_t failure_ms)
{
    struct sidx *x = xalloc(NULL, sizeof *x);
    memset(x, 0, sizeof *x);
    x->s = s;
    x->r = r < OW_MAX_REPLICAS ? r : OW_MAX_REPLICAS;
    x->k = keys;
    x->failure_ms = failure_ms;
    x->n = sim_nodes(s);
    grow(x, x->n);
    for (size_t i = 0; i < x->n; i++)
        if (sim_up(s, (int)i)) x->tv[x->ntv++] = (uint32_t)i + 1;
    for (size_t i = 0; i < x->n; i++) {
        struct xnode *h = &x->v[i];
        if (!sim_up(s, (int)i)) continue;
        h->up = 1;
        h->gen = 1;
        op_init(&h->pl, x->r);
        struct mb *mb = sim_mb(s, (int)i);
        /* Distinct ids (self, then the table): appended without the
         * search view_set does, O(N) a node instead of O(N^2). */
        view_add(h, (uint32_t)i + 1);
        for (size_t j = 0; j < mb_count(mb); j++)
            if (live_state(mb_at(mb, j)->state)) view_add(h, mb_at(mb, j)->id);
    }
    /* Every key's owners in the (converged) views, told: the records and
     * the entries a settled index holds. */
    for (size_t i = 0; i < x->n; i++) {
        struct xnode *h = &x->v[i];
        for (uint32_t j = 0; h->up && j < x->k; j++) {
            size_t key = i * x->k + j;
            kvt_key k = key_of((uint32_t)i + 1, j);
            uint32_t *o = &x->tr[key * x->r];
            x->ntr[key] = (uint8_t)owners_of(&k, SX_NSH, x->tv, x->ntv, x->r, o);
            uint32_t ho[OW_MAX_REPLICAS], hn;
            if (h->nview == x->ntv) /* its view is the truth: the same owners */
                memcpy(ho, o, (hn = x->ntr[key]) * sizeof *ho);
            else
                hn = owners_of(&k, SX_NSH, h->view, h->nview, x->r, ho);
            op_store(&h->pl, op_rec(&h->pl, j), ho, hn);
            for (uint32_t q = 0; q < hn; q++) ent_put(x, key, ho[q]);
        }
    }
    return x;
}

void sidx_free(struct sidx *x)
{
    if (!x) return;
    for (size_t i = 0; i < x->cap; i++) {
        op_free(&x->v[i].pl);
        free(x->v[i].view);
    }
    free(x->v);
    free(x->ent);
    free(x->tr);
    free(x->ntr);
    free(x->tv);
    free(x->cnt);
    free(x->touched);
    free(x);
}

/* ------------------------------------------------------------ lookups */

void sidx_sample(struct sidx *x, int n)
{
    if (x->ntv < 2) return;
    for (int q = 0; q < n; q++) {
        uint32_t h = x->tv[rnd(x, x->ntv)], a = x->tv[rnd(x, x->ntv)];
        if (a == h) continue; /* a local hit: no index involved */
        uint32_t j = rnd(x, x->k);
        kvt_key k = key_of(h, j);
        const struct xnode *an = &x->v[a - 1];
        uint32_t r = x->r, o[OW_MAX_REPLICAS + 1], no;
        if (sim_now(x->s) - an->changed_us < (uint64_t)x->failure_ms * 1000 && an->changed_us)
            r += an->changes;
        no = owners_of(&k, SX_NSH, an->view, an->nview, r, o);
        int found = 0, wait = 0;
        for (uint32_t i = 0; i < no; i++) {
            if (o[i] == a) { /* the asker owns it: its own table answers */
                found |= ent_has(x, (size_t)(h - 1) * x->k + j, a);
                continue;
            }
            if (!x->v[o[i] - 1].up) wait = 1;
            else found |= ent_has(x, (size_t)(h - 1) * x->k + j, o[i]);
        }
        x->st.lookups++;
        x->st.resolved += found;
        x->st.timeouts += wait;
    }
}

void sidx_stats(const struct sidx *x, struct sidx_stats *out) { *out = x->st; }
void sidx_reset_stats(struct sidx *x) { memset(&x->st, 0, sizeof x->st); }
