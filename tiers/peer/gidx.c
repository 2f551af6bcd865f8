/*
 * gidx.c -- the global index: which nodes hold a chunk (DESIGN §5).
 *
 * Design: each chunk key (with a hash of its namespace) has R owners, the
 * R members with the highest rendezvous score XXH3(key, nsh ^ id) among
 * the live members and this node; R is cluster.replicas. A node that
 * commits or drops a chunk tells its owners, in batches of GX_BATCH per
 * owner flushed every tick, so a burst of puts is a few messages. An
 * owner keeps key -> up to GX_HOLDERS holder ids in a chained hash table
 * (entries in one array, named by index, like the local index).
 *
 * When membership changes, owners move. Rather than owners handing
 * entries to each other (an owner that died has nothing to hand over),
 * every node republishes what it holds to the keys' current owners,
 * GX_REPUB_SLICE index slots per tick (STYLE §8); a sweep, GX_SWEEP_SLICE
 * entries per tick, drops holders that are no longer alive and entries
 * this node no longer owns. A dead member's chunks are misses at once
 * all the same: answers name only holders alive at the owner, and the
 * asker checks again against its own view.
 *
 * Views settle one node at a time, so for a while after a change an
 * asker's owners of a key may not be told yet (its holder has not seen
 * the change, or its republish is on the way), while the owners that
 * were told before no longer count. A negative from such owners would
 * turn a hit into a miss with nothing cached having changed (issue 10:
 * a LOOKUP flapped from 8 to 2). So for cluster.failure_timeout_ms after
 * each change -- the time views take to agree -- an owner keeps the
 * entries it no longer owns (and answers from them), and an asker asks
 * one more owner per change in that window: one member joining moves
 * each key's owners down by at most one rank, so the owners from before
 * are among those asked.
 *
 * A LOOKUP that misses keys here asks each owner of those keys one
 * batched PeerWhoHas (owners that are this node answer at once) and is
 * parked (park.c); it is answered when every owner has replied or after
 * cluster.lookup_timeout_ms (the park's deadline), with the keys found
 * elsewhere reported as TIER_PEER. If its client leaves first, park.c
 * drops it and its queries here (lookup_gone). A resolution for pget.c
 * has no client: its deadline is checked on the tick.
 *
 * Trust: an entry keeps the checksum and size of the chunk as its first
 * holder -- the node that committed it -- published them; a later holder
 * whose copy differs is not added (index_conflicts), and answers carry
 * the entry's checksum and size, which a requester checks fetched bytes
 * against (pget.c) instead of the holder's own word. Each member may be a
 * holder in at most cluster.index_max_per_peer entries, and the table
 * grows softly: an add that finds no memory is refused and counted,
 * never an abort.
 */
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "cluster_int.h"
#include "kvcache.h"
#include "kvtierd.h"
#include "log.h"
#include "park.h"
#include "wire.h"

#define GX_HOLDERS 4
#define GX_BATCH 512
#define GX_REPUB_SLICE 2048
#define GX_SWEEP_SLICE 4096
#define GX_NONE UINT32_MAX
#define GX_MAX_REPLICAS 8

struct gx_ent {
    kvt_key key;
    uint64_t nsh;
    uint64_t csum;     /* the committer's XXH3-64 */
    uint32_t size;     /* and size */
    uint32_t hold[GX_HOLDERS];
    uint32_t next; /* hash chain or free list */
    uint8_t n;     /* 0: free */
};

struct gx_batch {
    uint32_t n;
    kvt_key keys[GX_BATCH];
    uint64_t nsh[GX_BATCH];
    protobuf_c_boolean drop[GX_BATCH];
    uint64_t csum[GX_BATCH], size[GX_BATCH];
};

struct gpark;

struct gq { /* one PeerWhoHas in flight */
    uint64_t qid;
    struct gpark *p;
    uint32_t owner, n, *idx;
    struct gq *next;
};

struct gpark { /* one parked LOOKUP, or a resolution for pget.c */
    struct park *park; /* the client's request, or NULL */
    uint64_t deadline; /* a resolution's */
    uint32_t n, pending;
    kvt_key *keys;
    Kvtier__Tier *tiers;
    uint32_t *holder;  /* a live holder found, or 0 */
    struct gx_sum *sum; /* the committer's checksum and size of each */
    gx_done_fn done;   /* gx_resolve: called instead of a reply */
    void *arg;
    struct gpark *next;
};

struct gidx {
    struct gx_ent *e;
    uint32_t used, cap, free_head, count;
    uint32_t *bucket, mask;
    int repub;           /* republishing after a membership change */
    uint64_t changed_ms; /* the last membership change (kvtierd_clock) */
    uint32_t changes;    /* changes since the view was last settled */
    uint32_t repub_next; /* next local index slot */
    uint32_t sweep_next;
    struct gq *qs;
    struct gpark *parks;
    uint64_t next_qid, peer_hits, timeouts, conflicts;
};

static struct gidx *gx_of(struct kvtierd *d)
{
    return d->cl ? d->cl->gx : NULL;
}

uint64_t gx_ns_hash(const char *ns)
{
    return XXH3_64bits(ns, strlen(ns));
}

/* ------------------------------------------------------------ the table */

static uint32_t hash_of(const struct gidx *g, const kvt_key *k, uint64_t nsh)
{
    uint64_t h;
    memcpy(&h, k->b, sizeof h);
    return (uint32_t)((h ^ nsh) & g->mask);
}

static uint32_t ent_find(const struct gidx *g, const kvt_key *k, uint64_t nsh)
{
    for (uint32_t i = g->bucket[hash_of(g, k, nsh)]; i != GX_NONE; i = g->e[i].next)
        if (g->e[i].nsh == nsh && !memcmp(g->e[i].key.b, k->b, KVT_KEY_LEN)) return i;
    return GX_NONE;
}

static void rehash(struct gidx *g, uint32_t nbuckets)
{
    uint32_t *b = malloc(nbuckets * sizeof *b);
    if (!b) abort(); /* control-plane allocation */
    memset(b, 0xff, nbuckets * sizeof *b);
    free(g->bucket);
    g->bucket = b;
    g->mask = nbuckets - 1;
    for (uint32_t i = 0; i < g->used; i++) {
        if (!g->e[i].n) continue;
        uint32_t h = hash_of(g, &g->e[i].key, g->e[i].nsh);
        g->e[i].next = b[h];
        b[h] = i;
    }
}

/* Room for one more entry at g->used; 0 when memory is short (the add
 * is refused: the index is a hint, never worth an abort). */
static int ent_grow(struct gidx *g)
{
    if (g->used < g->cap) return 1;
    uint32_t cap = g->cap ? g->cap * 2 : 1024;
    if (cap <= g->cap) return 0;
    struct gx_ent *e = realloc(g->e, (size_t)cap * sizeof *e);
    if (!e) return 0;
    g->e = e;
    g->cap = cap;
    return 1;
}

static uint32_t ent_new(struct gidx *g, const kvt_key *k, uint64_t nsh)
{
    uint32_t i = g->free_head;
    if (i != GX_NONE) {
        g->free_head = g->e[i].next;
    } else {
        if (!ent_grow(g)) return GX_NONE;
        i = g->used++;
    }
    struct gx_ent *e = &g->e[i];
    memset(e, 0, sizeof *e); /* n = 0: a rehash now leaves it out */
    e->key = *k;
    e->nsh = nsh;
    if (++g->count > g->mask + 1) rehash(g, (g->mask + 1) * 2);
    uint32_t h = hash_of(g, k, nsh);
    e->next = g->bucket[h];
    g->bucket[h] = i;
    return i;
}

/* Member id holds delta more entries (cluster.index_max_per_peer). */
static void holds_adj(struct kvtierd *d, uint32_t id, int delta)
{
    struct member *m = id == d->cl->self_id ? NULL : cl_find(d->cl, id);
    if (m) m->gx_holds += delta;
}

/* Free entry i, whose holders (if any) are dropped from their counts. */
static void ent_release(struct kvtierd *d, struct gidx *g, uint32_t i);

static void ent_free(struct gidx *g, uint32_t i)
{
    uint32_t *pp = &g->bucket[hash_of(g, &g->e[i].key, g->e[i].nsh)];
    while (*pp != i) pp = &g->e[*pp].next;
    *pp = g->e[i].next;
    g->e[i].n = 0;
    g->e[i].next = g->free_head;
    g->free_head = i;
    g->count--;
}

static void ent_release(struct kvtierd *d, struct gidx *g, uint32_t i)
{
    for (uint8_t j = 0; j < g->e[i].n; j++) holds_adj(d, g->e[i].hold[j], -1);
    ent_free(g, i);
}

static void hold_del(struct kvtierd *d, struct gidx *g, uint32_t i, uint32_t id)
{
    struct gx_ent *e = &g->e[i];
    for (uint8_t j = 0; j < e->n; j++) {
        if (e->hold[j] != id) continue;
        e->hold[j] = e->hold[--e->n];
        holds_adj(d, id, -1);
        break;
    }
    if (e->n == 0) ent_free(g, i);
}

/* May member id be added as a holder? Not past its cap. */
static int may_hold(struct kvtierd *d, uint32_t id)
{
    const struct member *m = id == d->cl->self_id ? NULL : cl_find(d->cl, id);
    return !m || m->gx_holds < d->cfg.cluster_index_max_per_peer;
}

/* The entry for (k, nsh) with the committer's checksum and size (made
 * for a first holder), or GX_NONE: no memory, or a copy that differs. */
static uint32_t ent_for_add(struct gidx *g, const kvt_key *k, uint64_t nsh, uint64_t csum,
                            uint64_t size)
{
    uint32_t i = ent_find(g, k, nsh);
    if (i != GX_NONE)
        return g->e[i].csum == csum && g->e[i].size == size ? i : GX_NONE;
    if (size == 0 || size > UINT32_MAX || (i = ent_new(g, k, nsh)) == GX_NONE)
        return GX_NONE;
    g->e[i].csum = csum;
    g->e[i].size = (uint32_t)size;
    return i;
}

/* Holder id holds (drop = 0) or no longer holds the chunk whose bytes
 * have checksum csum and size bytes. */
static void gx_apply(struct kvtierd *d, uint32_t id, const kvt_key *k, uint64_t nsh,
                     int drop, uint64_t csum, uint64_t size)
{
    struct gidx *g = gx_of(d);
    uint32_t i = ent_find(g, k, nsh);
    if (drop) {
        if (i != GX_NONE) hold_del(d, g, i, id);
        return;
    }
    if (i != GX_NONE)
        for (uint8_t j = 0; j < g->e[i].n; j++)
            if (g->e[i].hold[j] == id) return;
    if (!may_hold(d, id) || (i = ent_for_add(g, k, nsh, csum, size)) == GX_NONE) {
        g->conflicts++;
        return;
    }
    struct gx_ent *e = &g->e[i];
    if (e->n < GX_HOLDERS) {
        e->hold[e->n++] = id;
        holds_adj(d, id, 1);
        return;
    }
    for (uint8_t j = 0; j < e->n; j++) /* full: replace one not alive */
        if (e->hold[j] != d->cl->self_id && !cl_alive(cl_find(d->cl, e->hold[j]))) {
            holds_adj(d, e->hold[j], -1);
            e->hold[j] = id;
            holds_adj(d, id, 1);
            return;
        }
}

/* ------------------------------------------------------------ ownership */

static uint64_t score(const kvt_key *k, uint64_t nsh, uint32_t id)
{
    return XXH3_64bits_withSeed(k->b, KVT_KEY_LEN, nsh ^ (id * 0x9E3779B97F4A7C15ull));
}

/* The r best-scored of the live members and this node for (k, nsh),
 * best first; returns how many (1..r). */
static uint32_t top_scored(struct kvtierd *d, const kvt_key *k, uint64_t nsh, uint32_t r,
                           uint32_t *out)
{
    struct cluster *c = d->cl;
    uint64_t sc[GX_MAX_REPLICAS];
    uint32_t n = 0;
    if (r > GX_MAX_REPLICAS) r = GX_MAX_REPLICAS;
    for (uint32_t i = 0; i <= c->n; i++) {
        uint32_t id = i == c->n ? c->self_id : c->m[i].id, j;
        if (i < c->n && !cl_alive(&c->m[i])) continue;
        uint64_t s = score(k, nsh, id);
        if (n < r) j = n++;
        else if (s > sc[r - 1]) j = r - 1;
        else continue;
        for (; j > 0 && sc[j - 1] < s; j--) {
            sc[j] = sc[j - 1];
            out[j] = out[j - 1];
        }
        sc[j] = s;
        out[j] = id;
    }
    return n;
}

/* The owners of (k, nsh), best first; returns how many (1..R). */
static uint32_t owners(struct kvtierd *d, const kvt_key *k, uint64_t nsh, uint32_t *out)
{
    return top_scored(d, k, nsh, (uint32_t)d->cfg.cluster_replicas, out);
}

/* 1 once views had cluster.failure_timeout_ms to agree since the last
 * membership change. */
static int settled(struct kvtierd *d)
{
    const struct gidx *g = gx_of(d);
    return kvtierd_clock(d) - g->changed_ms >= d->cfg.cluster_failure_ms;
}

/* Whom to ask about (k, nsh): its owners, and while the view settles one
 * more per change (the owners from before it). */
static uint32_t owners_to_ask(struct kvtierd *d, const kvt_key *k, uint64_t nsh,
                              uint32_t *out)
{
    uint32_t r = (uint32_t)d->cfg.cluster_replicas;
    if (!settled(d)) r += gx_of(d)->changes;
    return top_scored(d, k, nsh, r, out);
}

static int owns(struct kvtierd *d, const kvt_key *k, uint64_t nsh)
{
    uint32_t o[GX_MAX_REPLICAS], n = owners(d, k, nsh, o);
    for (uint32_t i = 0; i < n; i++)
        if (o[i] == d->cl->self_id) return 1;
    return 0;
}

/* ------------------------------------------------------------ publishing */

static void flush_batch(struct kvtierd *d, struct member *m)
{
    struct gx_batch *b = m->batch;
    if (!b || b->n == 0) return;
    ProtobufCBinaryData kv[GX_BATCH];
    for (uint32_t i = 0; i < b->n; i++) kv[i] = (ProtobufCBinaryData){KVT_KEY_LEN, b->keys[i].b};
    Kvtier__PeerIndex ix = KVTIER__PEER_INDEX__INIT;
    ix.n_keys = ix.n_ns_hash = ix.n_drop = ix.n_checksum = ix.n_size = b->n;
    ix.keys = kv;
    ix.ns_hash = b->nsh;
    ix.drop = b->drop;
    ix.checksum = b->csum;
    ix.size = b->size;
    Kvtier__PeerMsg pm = KVTIER__PEER_MSG__INIT;
    pm.body_case = KVTIER__PEER_MSG__BODY_INDEX;
    pm.index = &ix;
    cl_send(d, m, &pm);
    b->n = 0;
}

static void queue_update(struct kvtierd *d, struct member *m, const struct idx_entry *e,
                         uint64_t nsh, int drop)
{
    if (!m->batch && !(m->batch = calloc(1, sizeof *m->batch))) abort();
    struct gx_batch *b = m->batch;
    b->keys[b->n] = e->key;
    b->nsh[b->n] = nsh;
    b->drop[b->n] = drop != 0;
    b->csum[b->n] = e->csum;
    b->size[b->n] = e->size;
    if (++b->n == GX_BATCH) flush_batch(d, m);
}

static void publish(struct kvtierd *d, const struct idx_entry *e, uint64_t nsh, int drop)
{
    struct cluster *c = d->cl;
    uint32_t o[GX_MAX_REPLICAS], n = owners(d, &e->key, nsh, o);
    for (uint32_t i = 0; i < n; i++) {
        if (o[i] == c->self_id) gx_apply(d, c->self_id, &e->key, nsh, drop, e->csum, e->size);
        else queue_update(d, cl_find(c, o[i]), e, nsh, drop);
    }
}

void cluster_held(struct kvtierd *d, uint32_t slot, int held)
{
    if (!gx_of(d)) return;
    const struct idx_entry *e = idx_at(&d->idx, slot);
    publish(d, e, gx_ns_hash(d->ns.v[e->ns].name), !held);
}

void gx_membership(struct kvtierd *d)
{
    struct gidx *g = gx_of(d);
    if (!g) return;
    if (settled(d)) g->changes = 0;
    if (g->changes < GX_MAX_REPLICAS) g->changes++;
    g->changed_ms = kvtierd_clock(d);
    g->repub = 1;
    g->repub_next = 0;
}

void gx_republish(struct kvtierd *d)
{
    struct gidx *g = gx_of(d);
    if (!g || g->repub) return;
    g->repub = 1;
    g->repub_next = 0;
}

static void republish_slice(struct kvtierd *d)
{
    struct gidx *g = gx_of(d);
    uint32_t end = g->repub_next + GX_REPUB_SLICE;
    for (; g->repub_next < d->idx.used && g->repub_next < end; g->repub_next++) {
        const struct idx_entry *e = idx_at(&d->idx, g->repub_next);
        if (e->state == IDX_READY) publish(d, e, gx_ns_hash(d->ns.v[e->ns].name), 0);
    }
    if (g->repub_next >= d->idx.used) g->repub = 0;
}

/* Drop holders not alive, and entries this node no longer owns once
 * the view has settled (askers may still count on them until then). */
static void sweep_slice(struct kvtierd *d)
{
    struct gidx *g = gx_of(d);
    struct cluster *c = d->cl;
    int drop_unowned = settled(d);
    for (uint32_t k = 0; k < GX_SWEEP_SLICE && g->used; k++) {
        uint32_t i = g->sweep_next++ % g->used;
        struct gx_ent *e = &g->e[i];
        if (!e->n) continue;
        if (drop_unowned && !owns(d, &e->key, e->nsh)) {
            ent_release(d, g, i);
            continue;
        }
        for (int j = e->n - 1; j >= 0 && e->n; j--)
            if (e->hold[j] != c->self_id && !cl_alive(cl_find(c, e->hold[j])))
                hold_del(d, g, i, e->hold[j]);
    }
}

/* ------------------------------------------------------- owner replies */

static int keys_ok(size_t n_keys, const ProtobufCBinaryData *keys, size_t n_nsh)
{
    if (n_keys != n_nsh || n_keys > 1048576) return 0;
    for (size_t i = 0; i < n_keys; i++)
        if (!wire_key_ok(&keys[i])) return 0;
    return 1;
}

static struct gq *find_query(struct gidx *g, uint64_t qid)
{
    struct gq *q = g->qs;
    while (q && q->qid != qid) q = q->next;
    return q;
}

const char *gx_check(struct kvtierd *d, const struct member *m, const Kvtier__PeerMsg *pm)
{
    const Kvtier__PeerIndex *ix = pm->index;
    const Kvtier__PeerWhoHas *w = pm->who_has;
    const Kvtier__PeerHolders *h = pm->holders;
    struct gq *q;
    switch (pm->body_case) {
    case KVTIER__PEER_MSG__BODY_INDEX:
        return keys_ok(ix->n_keys, ix->keys, ix->n_ns_hash) && ix->n_drop == ix->n_keys &&
                       ix->n_checksum == ix->n_keys && ix->n_size == ix->n_keys
                   ? NULL : "malformed index update";
    case KVTIER__PEER_MSG__BODY_WHO_HAS:
        return keys_ok(w->n_keys, w->keys, w->n_ns_hash) ? NULL : "malformed who-has query";
    case KVTIER__PEER_MSG__BODY_HOLDERS:
        if (!(q = find_query(gx_of(d), h->query_id))) return "answer to no query";
        return q->owner == m->id && h->n_holders == q->n && h->n_checksum == q->n &&
                       h->n_size == q->n
                   ? NULL : "malformed holders answer";
    default:
        return NULL;
    }
}

void gx_on_index(struct kvtierd *d, struct member *m, const Kvtier__PeerMsg *pm)
{
    const Kvtier__PeerIndex *ix = pm->index;
    for (size_t i = 0; i < ix->n_keys; i++)
        gx_apply(d, m->id, (const kvt_key *)ix->keys[i].data, ix->ns_hash[i], ix->drop[i],
                 ix->checksum[i], ix->size[i]);
}

/* A live holder of (k, nsh) other than `not`, or 0; *sum gets the
 * committer's checksum and size. */
static uint32_t live_holder(struct kvtierd *d, const kvt_key *k, uint64_t nsh, uint32_t not,
                            struct gx_sum *sum)
{
    struct gidx *g = gx_of(d);
    uint32_t i = ent_find(g, k, nsh);
    if (i == GX_NONE) return 0;
    for (uint8_t j = 0; j < g->e[i].n; j++) {
        uint32_t h = g->e[i].hold[j];
        if (h == not) continue;
        if (h == d->cl->self_id || cl_alive(cl_find(d->cl, h))) {
            sum->csum = g->e[i].csum;
            sum->size = g->e[i].size;
            return h;
        }
    }
    return 0;
}

void gx_on_who_has(struct kvtierd *d, struct member *m, const Kvtier__PeerMsg *pm)
{
    const Kvtier__PeerWhoHas *w = pm->who_has;
    uint32_t *h = calloc(w->n_keys + 1, sizeof *h);
    uint64_t *v = calloc(2 * w->n_keys + 1, sizeof *v);
    if (!h || !v) abort();
    for (size_t i = 0; i < w->n_keys; i++) {
        struct gx_sum s = {0, 0};
        h[i] = live_holder(d, (const kvt_key *)w->keys[i].data, w->ns_hash[i], m->id, &s);
        v[i] = s.csum;
        v[w->n_keys + i] = s.size;
    }
    Kvtier__PeerHolders ph = KVTIER__PEER_HOLDERS__INIT;
    ph.query_id = w->query_id;
    ph.n_holders = ph.n_checksum = ph.n_size = w->n_keys;
    ph.holders = h;
    ph.checksum = v;
    ph.size = v + w->n_keys;
    Kvtier__PeerMsg out = KVTIER__PEER_MSG__INIT;
    out.body_case = KVTIER__PEER_MSG__BODY_HOLDERS;
    out.holders = &ph;
    cl_send(d, m, &out);
    free(h);
    free(v);
}

/* ------------------------------------------------------- parked lookups */

static uint32_t leading(const Kvtier__Tier *t, uint32_t n)
{
    uint32_t i = 0;
    while (i < n && t[i] != KVTIER__TIER__TIER_NONE) i++;
    return i;
}

static void park_free(struct gpark *p)
{
    free(p->keys);
    free(p->tiers);
    free(p->holder);
    free(p->sum);
    free(p);
}

static void park_unlink(struct gidx *g, struct gpark *p)
{
    for (struct gpark **pp = &g->parks; *pp; pp = &(*pp)->next)
        if (*pp == p) {
            *pp = p->next;
            break;
        }
}

/* Answer p with what it has and free it (its queries must be gone). */
static void park_finish(struct kvtierd *d, struct gpark *p)
{
    park_unlink(gx_of(d), p);
    if (p->done) {
        p->done(d, p->arg, p->holder, p->sum, p->n);
        park_free(p);
        return;
    }
    Kvtier__LookupResp lr = KVTIER__LOOKUP_RESP__INIT;
    lr.tiers = p->tiers;
    lr.n_tiers = p->n;
    lr.n_present = leading(p->tiers, p->n);
    Kvtier__Response rsp = KVTIER__RESPONSE__INIT;
    rsp.id = park_req_id(p->park);
    rsp.body_case = KVTIER__RESPONSE__BODY_LOOKUP;
    rsp.lookup = &lr;
    park_answer(d, p->park, &rsp);
    park_free(p);
}

static void gq_unlink(struct gidx *g, struct gq *q)
{
    for (struct gq **pp = &g->qs; *pp; pp = &(*pp)->next)
        if (*pp == q) {
            *pp = q->next;
            break;
        }
    free(q->idx);
    free(q);
}

void gx_on_holders(struct kvtierd *d, struct member *m, const Kvtier__PeerMsg *pm)
{
    struct gidx *g = gx_of(d);
    (void)m; /* gx_check matched it to the query */
    const Kvtier__PeerHolders *h = pm->holders;
    struct gq *q = find_query(g, h->query_id);
    struct gpark *p = q->p;
    for (uint32_t i = 0; i < q->n; i++) {
        uint32_t id = h->holders[i];
        if (id && id != d->cl->self_id && cl_alive(cl_find(d->cl, id)) &&
            p->tiers[q->idx[i]] == KVTIER__TIER__TIER_NONE) {
            p->tiers[q->idx[i]] = KVTIER__TIER__TIER_PEER;
            p->holder[q->idx[i]] = id;
            p->sum[q->idx[i]] = (struct gx_sum){h->checksum[i], h->size[i]};
            g->peer_hits += !p->done;
        }
    }
    gq_unlink(g, q);
    if (--p->pending == 0) park_finish(d, p);
}

/* Add key index i to the query for owner id within p (made on demand). */
static void ask(struct gidx *g, struct gpark *p, uint32_t owner, uint32_t i)
{
    struct gq *q = g->qs;
    while (q && !(q->p == p && q->owner == owner)) q = q->next;
    if (!q) {
        if (!(q = calloc(1, sizeof *q)) || !(q->idx = calloc(p->n, sizeof *q->idx)))
            abort();
        q->qid = ++g->next_qid;
        q->p = p;
        q->owner = owner;
        q->next = g->qs;
        g->qs = q;
        p->pending++;
    }
    q->idx[q->n++] = i;
}

static void send_query(struct kvtierd *d, struct gq *q, uint64_t nsh)
{
    ProtobufCBinaryData *kv = calloc(q->n, sizeof *kv);
    uint64_t *nv = calloc(q->n, sizeof *nv);
    if (!kv || !nv) abort();
    for (uint32_t i = 0; i < q->n; i++) {
        kv[i] = (ProtobufCBinaryData){KVT_KEY_LEN, q->p->keys[q->idx[i]].b};
        nv[i] = nsh;
    }
    Kvtier__PeerWhoHas w = KVTIER__PEER_WHO_HAS__INIT;
    w.query_id = q->qid;
    w.n_keys = w.n_ns_hash = q->n;
    w.keys = kv;
    w.ns_hash = nv;
    Kvtier__PeerMsg pm = KVTIER__PEER_MSG__INIT;
    pm.body_case = KVTIER__PEER_MSG__BODY_WHO_HAS;
    pm.who_has = &w;
    cl_send(d, cl_find(d->cl, q->owner), &pm);
    free(kv);
    free(nv);
}

static struct gpark *park_new(const Kvtier__Lookup *q, const Kvtier__LookupResp *lr)
{
    struct gpark *p = calloc(1, sizeof *p);
    if (!p) abort();
    p->n = (uint32_t)q->n_keys;
    p->keys = calloc(p->n, sizeof *p->keys);
    p->tiers = calloc(p->n, sizeof *p->tiers);
    p->holder = calloc(p->n + 1, sizeof *p->holder);
    p->sum = calloc(p->n + 1, sizeof *p->sum);
    if (!p->keys || !p->tiers || !p->holder || !p->sum) abort();
    for (uint32_t i = 0; i < p->n; i++) {
        memcpy(p->keys[i].b, q->keys[i].data, KVT_KEY_LEN);
        p->tiers[i] = lr->tiers[i];
    }
    return p;
}

/* Drop p's queries and p itself without answering (it was not parked). */
static void park_discard(struct gidx *g, struct gpark *p)
{
    for (struct gq *q = g->qs, *next; q; q = next) {
        next = q->next;
        if (q->p == p) gq_unlink(g, q);
    }
    park_free(p);
}

/* Resolve what this node owns now; queue queries for the rest. */
static void plan(struct kvtierd *d, struct gpark *p, uint64_t nsh)
{
    struct gidx *g = gx_of(d);
    struct cluster *c = d->cl;
    for (uint32_t i = leading(p->tiers, p->n); i < p->n; i++) {
        if (p->tiers[i] != KVTIER__TIER__TIER_NONE) continue;
        uint32_t o[GX_MAX_REPLICAS], n = owners_to_ask(d, &p->keys[i], nsh, o);
        for (uint32_t j = 0; j < n && p->tiers[i] == KVTIER__TIER__TIER_NONE; j++) {
            if (o[j] != c->self_id) {
                ask(g, p, o[j], i);
            } else if ((p->holder[i] =
                            live_holder(d, &p->keys[i], nsh, c->self_id, &p->sum[i]))) {
                p->tiers[i] = KVTIER__TIER__TIER_PEER;
                g->peer_hits += !p->done;
            }
        }
    }
}

static void expire_one(struct kvtierd *d, struct gpark *p);

/* park.c: the client left; its answers, if any come, find no query. */
static void lookup_gone(struct kvtierd *d, void *owner)
{
    park_unlink(gx_of(d), owner);
    park_discard(gx_of(d), owner);
}

static void lookup_due(struct kvtierd *d, void *owner)
{
    expire_one(d, owner);
}

static const struct park_ops lookup_ops = {lookup_gone, lookup_due};

int cluster_lookup(struct kvtierd *d, uint32_t pipe, uint64_t req_id,
                   const Kvtier__Lookup *q, Kvtier__LookupResp *lr)
{
    struct gidx *g = gx_of(d);
    if (!g || q->local_only || lr->n_present == q->n_keys) return 0;
    uint64_t nsh = gx_ns_hash(q->ns);
    struct gpark *p = park_new(q, lr);
    plan(d, p, nsh);
    if (p->pending) p->park = park_defer(d, pipe, req_id, &lookup_ops, p);
    if (!p->park) { /* nothing to ask, or no room to wait: what is known */
        memcpy(lr->tiers, p->tiers, p->n * sizeof *p->tiers);
        lr->n_present = leading(p->tiers, p->n);
        park_discard(g, p);
        return 0;
    }
    park_set_deadline(d, p->park, kvtierd_clock(d) + d->cfg.cluster_lookup_ms);
    p->next = g->parks;
    g->parks = p;
    for (struct gq *x = g->qs; x; x = x->next)
        if (x->p == p) send_query(d, x, nsh);
    return 1;
}

void gx_resolve(struct kvtierd *d, const kvt_key *keys, uint32_t n, uint64_t nsh,
                gx_done_fn done, void *arg)
{
    struct gidx *g = gx_of(d);
    struct gpark *p = calloc(1, sizeof *p);
    if (!p) abort();
    p->n = n;
    p->keys = calloc(n + 1, sizeof *p->keys);
    p->tiers = calloc(n + 1, sizeof *p->tiers);
    p->holder = calloc(n + 1, sizeof *p->holder);
    p->sum = calloc(n + 1, sizeof *p->sum);
    if (!p->keys || !p->tiers || !p->holder || !p->sum) abort();
    memcpy(p->keys, keys, n * sizeof *keys);
    p->done = done;
    p->arg = arg;
    plan(d, p, nsh);
    p->deadline = kvtierd_clock(d) + d->cfg.cluster_lookup_ms;
    p->next = g->parks;
    g->parks = p;
    if (!p->pending) {
        park_finish(d, p);
        return;
    }
    for (struct gq *x = g->qs; x; x = x->next)
        if (x->p == p) send_query(d, x, nsh);
}

/* Past its deadline: drop the queries still out, answer what is known. */
static void expire_one(struct kvtierd *d, struct gpark *p)
{
    struct gidx *g = gx_of(d);
    for (struct gq *q = g->qs, *qn; q; q = qn) {
        qn = q->next;
        if (q->p != p) continue;
        g->timeouts++;
        gq_unlink(g, q);
    }
    park_finish(d, p);
}

/* Resolutions for pget.c (no client, so no park deadline). */
static void expire(struct kvtierd *d, uint64_t now)
{
    for (struct gpark *p = gx_of(d)->parks, *next; p; p = next) {
        next = p->next;
        if (!p->park && now >= p->deadline) expire_one(d, p);
    }
}

/* ------------------------------------------------------------ lifecycle */

void gx_tick(struct kvtierd *d)
{
    struct gidx *g = gx_of(d);
    if (!g) return;
    if (g->repub) republish_slice(d);
    sweep_slice(d);
    for (uint32_t i = 0; i < d->cl->n; i++) flush_batch(d, &d->cl->m[i]);
    expire(d, kvtierd_clock(d));
}

int gx_open(struct kvtierd *d)
{
    struct gidx *g = calloc(1, sizeof *g);
    if (!g) abort();
    d->cl->gx = g;
    g->free_head = GX_NONE;
    rehash(g, 1024);
    g->repub = 1; /* publish what was loaded before the cluster opened */
    return 0;
}

void gx_close(struct kvtierd *d)
{
    struct gidx *g = gx_of(d);
    if (!g) return;
    while (g->qs) gq_unlink(g, g->qs);
    while (g->parks) park_finish(d, g->parks);
    for (uint32_t i = 0; i < d->cl->n; i++) {
        free(d->cl->m[i].batch);
        d->cl->m[i].batch = NULL;
    }
    free(g->e);
    free(g->bucket);
    free(g);
    d->cl->gx = NULL;
}

void gx_fill_peers(struct kvtierd *d, Kvtier__PeersResp *pr)
{
    struct gidx *g = gx_of(d);
    if (!g) return;
    pr->index_entries = g->count;
    pr->peer_hits = g->peer_hits;
    pr->lookup_timeouts = g->timeouts;
    pr->index_conflicts = g->conflicts;
}
