/*
 * gidx.c -- the global index: which nodes hold a chunk (DESIGN §5).
 *
 * Design: each chunk key (with a hash of its namespace) has R owners, the
 * R members with the highest rendezvous score among the live members and
 * this node (owners.c); R is cluster.replicas. A node that commits or
 * drops a chunk tells its owners. Updates wait in one batch per owner,
 * made when the first update for that owner comes and freed when sent,
 * or dropped unsent when that owner stops being live (memory follows the
 * owners in use, not N; at most GX_MAX_BATCHES x 32 KiB):
 * a batch with a put or a drop in it goes on the next tick, one filled
 * only by a membership pass goes when full (GX_BATCH), when older than
 * GX_BATCH_AGE_MS, or when the pass ends, so batches are full at any
 * cluster size. At most GX_MAX_BATCHES wait at once (the fullest goes
 * first). An owner keeps key -> up to GX_HOLDERS holder ids in a chained
 * hash table (entries in one array, named by index, like the local index).
 *
 * When membership changes, owners move, but only for the keys whose owner
 * set contains the member that changed (R/N of them). Every node keeps,
 * for each chunk it holds, the owners it last told (R ids and the change
 * sequence number they reflect). Changes go into a log; a pass walks the
 * local index GX_REPUB_SLICE slots per tick (STYLE §8) and brings each
 * slot's owners up to date by applying the logged changes one by one
 * (owners_delta: R + 1 scores per join, nothing per leave unless the
 * leaver was an owner), then tells only the owners that entered, or a
 * member that restarted (it lost what it was told). So a change costs
 * ~R·K entries cluster-wide, not N·R·K.
 *
 * The pass starts GX_DEBOUNCE_MS after a change, so a burst of changes is
 * one pass. It never restarts: a change during a pass resets only how
 * many slots are left to visit (all of them, from the cursor on), so
 * every slot is visited once after the last change, wherever the cursor
 * was; slots visited before the change catch up on the next lap. When a
 * pass ends every READY slot reflects the whole log, which is emptied.
 * A log that fills (GX_LOG_MAX changes within one pass) is dropped and
 * the slots it covered are told in full, as a fresh publish would.
 *
 * On the owner side each entry keeps how many live members outrank this
 * node for its key (`above`; it owns the key while that is below R). A
 * sweep, GX_SWEEP_SLICE entries per tick, brings each entry up to date
 * with the view changes logged since (2 scores per change: does the
 * member that came or went outrank this node?), drops holders that left,
 * and drops entries this node no longer owns. An entry is counted in
 * full (O(N)) only on its first visit. The sweep runs one lap after each
 * change, once the view has settled, and not otherwise. A dead member's
 * chunks are misses at once all the same: answers name only holders
 * alive at the owner, and the asker checks again against its own view.
 *
 * A node that leaves (gx_leave, at shutdown) hands each entry it owns to
 * the owner that takes its place, naming the holders, so the keys stay
 * found without waiting for their holders' passes.
 *
 * Views settle one node at a time, so for a while after a change an
 * asker's owners of a key may not be told yet (its holder has not seen
 * the change, or its pass is on the way), while the owners that were
 * told before no longer count. A negative from such owners would turn a
 * hit into a miss with nothing cached having changed (issue 10: a LOOKUP
 * flapped from 8 to 2). So for cluster.failure_timeout_ms after each
 * change -- the time views take to agree -- an owner keeps the entries it
 * no longer owns (and answers from them), and an asker asks one more
 * owner per change in that window: one member joining moves each key's
 * owners down by at most one rank, so the owners from before are among
 * those asked.
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
 * holder -- the node that committed it -- published them (a handed-over
 * entry carries what its last owner recorded); a later holder whose copy
 * differs is not added (index_conflicts), and answers carry the entry's
 * checksum and size, which a requester checks fetched bytes against
 * (pget.c) instead of the holder's own word. Each member may be a holder
 * in at most cluster.index_max_per_peer entries, and the table grows
 * softly: an add that finds no memory is refused and counted, never an
 * abort.
 */
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "cluster_int.h"
#include "log.h"
#include "oplan.h"
#include "owners.h"
#include "wire.h"

#define GX_HOLDERS 4
#define GX_BATCH 512
#define GX_BATCH_AGE_MS 500
#define GX_MAX_BATCHES 256
#define GX_BT_BUCKETS 256
#define GX_REPUB_SLICE 2048
#define GX_SWEEP_SLICE 4096
#define GX_DEBOUNCE_MS 200
#define GX_LOG_MAX OP_LOG_MAX
#define GX_NONE UINT32_MAX
#define GX_MAX_REPLICAS OW_MAX_REPLICAS

struct gx_ent {
    kvt_key key;
    uint64_t nsh;
    uint64_t csum; /* the committer's XXH3-64 */
    uint32_t size; /* and size */
    uint32_t hold[GX_HOLDERS];
    uint32_t next; /* hash chain or free list */
    uint32_t oseq; /* the view change `above` reflects; 0: not counted yet */
    uint8_t n;     /* 0: free */
    uint8_t above; /* live members outranking this node here (255: or more) */
};

struct gx_batch { /* index updates waiting for one owner */
    uint32_t owner, n;
    uint64_t born_ms;
    int urgent;    /* holds a put or a drop: sent on the next tick */
    int handoff;   /* some holder[] is not this node */
    struct gx_batch *next; /* hash chain */
    kvt_key keys[GX_BATCH];
    uint64_t nsh[GX_BATCH];
    uint32_t holder[GX_BATCH];
    protobuf_c_boolean drop[GX_BATCH];
    uint64_t csum[GX_BATCH], size[GX_BATCH];
};

struct gx_change {
    uint32_t id;
    enum ow_change kind;
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
    uint64_t changed_ms; /* the last membership change (cl_clock) */
    uint32_t changes;    /* changes since the view was last settled */
    uint32_t sweep_next, sweep_left;
    /* The view: live members and this node, kept by gx_membership. */
    uint32_t *view, nview, view_cap;
    /* View changes the sweep has not applied to every entry yet (olog[i]
     * has sequence olog_base + i), as the planner's log for slots. */
    struct gx_change olog[GX_LOG_MAX];
    uint32_t olog_base, olog_n;
    uint32_t r;
    /* The owners each local index slot last told, and the changes not
     * yet applied to every slot (oplan.c, shared with the simulator). */
    struct oplan pl;
    int pass;            /* a pass is due or under way */
    uint64_t pass_due_ms;
    uint32_t cursor, left;
    struct gx_batch *bt[GX_BT_BUCKETS];
    uint32_t n_batches;
    struct gq *qs;
    struct gpark *parks;
    uint64_t next_qid, peer_hits, timeouts, moved, handed, conflicts;
};

static struct gidx *gx_of(struct cl_ctx *d)
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

/* Member id holds delta more entries (cluster.index_max_per_peer). */
static void holds_adj(struct cl_ctx *d, uint32_t id, int delta)
{
    struct member *m = id == d->cl->self_id ? NULL : cl_find(d->cl, id);
    if (m) m->gx_holds += delta;
}

/* Free entry i, its holders dropped from their counts. */
static void ent_release(struct cl_ctx *d, struct gidx *g, uint32_t i)
{
    for (uint8_t j = 0; j < g->e[i].n; j++) holds_adj(d, g->e[i].hold[j], -1);
    ent_free(g, i);
}

static void hold_del(struct cl_ctx *d, struct gidx *g, uint32_t i, uint32_t id)
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
static int may_hold(struct cl_ctx *d, uint32_t id)
{
    const struct member *m = id == d->cl->self_id ? NULL : cl_find(d->cl, id);
    return !m || m->gx_holds < d->cfg.cluster_index_max_per_peer;
}

/* The entry for (k, nsh) with the committer's checksum and size (made
 * for a first holder), or GX_NONE: no memory, or a copy that differs. */
static uint32_t ent_for_add(struct gidx *g, const kvt_key *k, uint64_t nsh,
                            const struct gx_sum *sum)
{
    uint32_t i = ent_find(g, k, nsh);
    if (i != GX_NONE)
        return g->e[i].csum == sum->csum && g->e[i].size == sum->size ? i : GX_NONE;
    if (sum->size == 0 || sum->size > UINT32_MAX || (i = ent_new(g, k, nsh)) == GX_NONE)
        return GX_NONE;
    g->e[i].csum = sum->csum;
    g->e[i].size = (uint32_t)sum->size;
    return i;
}

static int replay_entry(struct cl_ctx *d, uint32_t i);

/* Holder id holds (drop = 0) or no longer holds the chunk whose bytes
 * have the checksum and size in sum. A holder's update is newer than
 * every view change logged before it came, its own departure included (a
 * member is live again before anything it sends is applied), so an entry
 * the sweep has counted is first brought up to date with those changes:
 * otherwise the sweep, which waits for the view to settle, would apply
 * the departure of a holder that has since come back (restarted, or
 * taken for dead) to what it told since, and its keys would be lost until
 * it told them again. */
static void gx_apply(struct cl_ctx *d, uint32_t id, const kvt_key *k, uint64_t nsh,
                     int drop, const struct gx_sum *sum)
{
    struct gidx *g = gx_of(d);
    uint32_t i = ent_find(g, k, nsh);
    if (drop) {
        if (i != GX_NONE) hold_del(d, g, i, id);
        return;
    }
    if (i != GX_NONE && g->e[i].oseq && g->e[i].oseq != g->olog_base + g->olog_n &&
        !replay_entry(d, i))
        i = GX_NONE; /* its holders had all left */
    if (i != GX_NONE)
        for (uint8_t j = 0; j < g->e[i].n; j++)
            if (g->e[i].hold[j] == id) return;
    if (!may_hold(d, id) || (i = ent_for_add(g, k, nsh, sum)) == GX_NONE) {
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

/* The live members and this node. */
static const uint32_t *view_of(struct cl_ctx *d, uint32_t *n)
{
    struct gidx *g = gx_of(d);
    *n = g->nview;
    return g->view;
}

static void view_add(struct gidx *g, uint32_t id)
{
    if (g->nview == g->view_cap) {
        g->view_cap = g->view_cap ? g->view_cap * 2 : 64;
        if (!(g->view = realloc(g->view, g->view_cap * sizeof *g->view))) abort();
    }
    g->view[g->nview++] = id;
}

/* Member id is live or not: 1 if that changed the view. */
static int view_set(struct gidx *g, uint32_t id, int alive)
{
    for (uint32_t i = 0; i < g->nview; i++) {
        if (g->view[i] != id) continue;
        if (alive) return 0;
        g->view[i] = g->view[--g->nview];
        return 1;
    }
    if (alive) view_add(g, id);
    return alive;
}

/* The r best-scored of the live members and this node for (k, nsh),
 * best first; returns how many (1..r). */
static uint32_t top_scored(struct cl_ctx *d, const kvt_key *k, uint64_t nsh, uint32_t r,
                           uint32_t *out)
{
    uint32_t nv;
    const uint32_t *v = view_of(d, &nv);
    return owners_of(k, nsh, v, nv, r < GX_MAX_REPLICAS ? r : GX_MAX_REPLICAS, out);
}

/* The owners of (k, nsh), best first; returns how many (1..R). */
static uint32_t owners(struct cl_ctx *d, const kvt_key *k, uint64_t nsh, uint32_t *out)
{
    return top_scored(d, k, nsh, gx_of(d)->r, out);
}

/* 1 once views had cluster.failure_timeout_ms to agree since the last
 * membership change. */
static int settled(struct cl_ctx *d)
{
    const struct gidx *g = gx_of(d);
    return cl_clock(d) - g->changed_ms >= d->cfg.cluster_failure_ms;
}

/* Whom to ask about (k, nsh): its owners, and while the view settles one
 * more per change (the owners from before it). */
static uint32_t owners_to_ask(struct cl_ctx *d, const kvt_key *k, uint64_t nsh,
                              uint32_t *out)
{
    uint32_t r = gx_of(d)->r;
    if (!settled(d)) r += gx_of(d)->changes;
    return top_scored(d, k, nsh, r, out);
}

static int has(const uint32_t *o, uint32_t n, uint32_t id)
{
    for (uint32_t i = 0; i < n; i++)
        if (o[i] == id) return 1;
    return 0;
}

/* -------------------------------------------------------------- batches */

static struct gx_batch **bt_head(struct gidx *g, uint32_t owner)
{
    return &g->bt[(owner * 0x9E3779B1u) >> 24 & (GX_BT_BUCKETS - 1)];
}

/* Send b to its owner (dropped if it is no longer a member) and free it. */
static void flush_batch(struct cl_ctx *d, struct gx_batch *b)
{
    struct gidx *g = gx_of(d);
    struct gx_batch **pp = bt_head(g, b->owner);
    while (*pp != b) pp = &(*pp)->next;
    *pp = b->next;
    g->n_batches--;
    ProtobufCBinaryData kv[GX_BATCH];
    for (uint32_t i = 0; i < b->n; i++) kv[i] = (ProtobufCBinaryData){KVT_KEY_LEN, b->keys[i].b};
    Kvtier__PeerIndex ix = KVTIER__PEER_INDEX__INIT;
    ix.n_keys = ix.n_ns_hash = ix.n_drop = b->n;
    ix.keys = kv;
    ix.ns_hash = b->nsh;
    ix.drop = b->drop;
    ix.n_checksum = ix.n_size = b->n;
    ix.checksum = b->csum;
    ix.size = b->size;
    if (b->handoff) {
        ix.n_holder = b->n;
        ix.holder = b->holder;
    }
    Kvtier__PeerMsg pm = KVTIER__PEER_MSG__INIT;
    pm.body_case = KVTIER__PEER_MSG__BODY_INDEX;
    pm.index = &ix;
    cl_send(d, cl_find(d->cl, b->owner), &pm);
    free(b);
}

static void flush_fullest(struct cl_ctx *d)
{
    struct gidx *g = gx_of(d);
    struct gx_batch *best = NULL;
    for (uint32_t i = 0; i < GX_BT_BUCKETS; i++)
        for (struct gx_batch *b = g->bt[i]; b; b = b->next)
            if (!best || b->n > best->n) best = b;
    if (best) flush_batch(d, best);
}

/* Send the batches due: all of them, or those urgent or old enough. */
static void flush_due(struct cl_ctx *d, int all)
{
    struct gidx *g = gx_of(d);
    uint64_t now = cl_clock(d);
    for (uint32_t i = 0; i < GX_BT_BUCKETS && g->n_batches; i++)
        for (struct gx_batch *b = g->bt[i], *next; b; b = next) {
            next = b->next;
            if (all || b->urgent || now - b->born_ms >= GX_BATCH_AGE_MS) flush_batch(d, b);
        }
}

/* owner went away: what waits for it is dropped, not sent (a send would
 * dial a member that is gone; the pass tells the owners that take its
 * place). */
static void drop_batch(struct gidx *g, uint32_t owner)
{
    for (struct gx_batch **pp = bt_head(g, owner), *b; (b = *pp); pp = &b->next) {
        if (b->owner != owner) continue;
        *pp = b->next;
        g->n_batches--;
        free(b);
        return;
    }
}

static struct gx_batch *batch_for(struct cl_ctx *d, uint32_t owner)
{
    struct gidx *g = gx_of(d);
    struct gx_batch *b = *bt_head(g, owner);
    while (b && b->owner != owner) b = b->next;
    if (b) return b;
    if (g->n_batches >= GX_MAX_BATCHES) flush_fullest(d);
    if (!(b = malloc(sizeof *b))) abort(); /* control-plane allocation */
    b->owner = owner;
    b->n = 0;
    b->born_ms = cl_clock(d);
    b->urgent = b->handoff = 0;
    b->next = *bt_head(g, owner);
    *bt_head(g, owner) = b;
    g->n_batches++;
    return b;
}

/* Queue "holder holds (or dropped) (k, nsh)" for owner; holder 0: this
 * node. urgent: a put or a drop, sent on the next tick. */
static void queue_update(struct cl_ctx *d, uint32_t owner, const kvt_key *k, uint64_t nsh,
                         int drop, uint32_t holder, int urgent, const struct gx_sum *sum)
{
    struct gx_batch *b = batch_for(d, owner);
    b->keys[b->n] = *k;
    b->nsh[b->n] = nsh;
    b->drop[b->n] = drop != 0;
    b->csum[b->n] = sum->csum;
    b->size[b->n] = sum->size;
    b->holder[b->n] = holder ? holder : d->cl->self_id;
    b->handoff |= holder != 0;
    b->urgent |= urgent;
    if (++b->n == GX_BATCH) flush_batch(d, b);
}

/* Tell owner that this node holds (or dropped) (k, nsh), whose chunk
 * has the checksum and size in sum. */
static void tell(struct cl_ctx *d, uint32_t owner, const kvt_key *k, uint64_t nsh, int drop,
                 int urgent, const struct gx_sum *sum)
{
    if (owner == d->cl->self_id) gx_apply(d, owner, k, nsh, drop, sum);
    else queue_update(d, owner, k, nsh, drop, 0, urgent, sum);
}

/* Local slot s's checksum and size, as published. */
static struct gx_sum slot_sum(struct cl_ctx *d, uint32_t s)
{
    const struct idx_entry *e = idx_at(d->idx, s);
    return (struct gx_sum){.csum = e->csum, .size = e->size};
}

/* ------------------------------------------------- owners of local slots */

/* Bring slot s (holding (k, nsh)) up to date with the log; tell the
 * owners that must hear of it when `send`. Its owners out (*n). */
static void catch_up(struct cl_ctx *d, uint32_t s, const kvt_key *k, uint64_t nsh,
                     int send, uint32_t *o, uint32_t *n)
{
    struct gidx *g = gx_of(d);
    uint32_t nv, t[GX_MAX_REPLICAS], moved;
    const uint32_t *v = view_of(d, &nv);
    uint32_t nt = op_catch_up(&g->pl, op_rec(&g->pl, s), k, nsh, v, nv, o, n, t, &moved);
    if (!send) return;
    struct gx_sum sum = slot_sum(d, s);
    for (uint32_t i = 0; i < nt; i++) tell(d, t[i], k, nsh, 0, 0, &sum);
    g->moved += moved;
}

void cluster_held(struct cl_ctx *d, uint32_t slot, int held)
{
    struct gidx *g = gx_of(d);
    if (!g) return;
    const struct idx_entry *e = idx_at(d->idx, slot);
    uint64_t nsh = gx_ns_hash(d->host->ns_name(d->host->core, e->ns));
    uint32_t o[GX_MAX_REPLICAS], n, was[GX_MAX_REPLICAS], nw;
    uint32_t *rec = op_rec(&g->pl, slot);
    struct gx_sum sum = slot_sum(d, slot);
    if (held) {
        n = owners(d, &e->key, nsh, o);
        for (uint32_t i = 0; i < n; i++) tell(d, o[i], &e->key, nsh, 0, 1, &sum);
        op_store(&g->pl, rec, o, n);
        return;
    }
    if (rec[0] == 0) return; /* nobody was told */
    nw = op_load(&g->pl, rec, was);
    catch_up(d, slot, &e->key, nsh, 0, o, &n);
    /* The owners told before (they answer until the view settles) and
     * those told since. */
    for (uint32_t i = 0; i < nw; i++) tell(d, was[i], &e->key, nsh, 1, 1, &sum);
    for (uint32_t i = 0; i < n; i++)
        if (!has(was, nw, o[i])) tell(d, o[i], &e->key, nsh, 1, 1, &sum);
    rec[0] = 0;
}

/* Every slot once more, from the cursor on: after a change, or at open. */
static void pass_extend(struct cl_ctx *d)
{
    struct gidx *g = gx_of(d);
    if (!g->pass) g->pass_due_ms = cl_clock(d) + GX_DEBOUNCE_MS;
    g->pass = 1;
    g->left = d->idx->used;
    g->sweep_left = g->used;
}

static void log_change(struct cl_ctx *d, uint32_t id, enum ow_change kind)
{
    op_log(&gx_of(d)->pl, id, kind);
    pass_extend(d);
}

void gx_membership(struct cl_ctx *d, uint32_t id, int alive)
{
    struct gidx *g = gx_of(d);
    if (!g) return;
    if (settled(d)) g->changes = 0;
    if (g->changes < GX_MAX_REPLICAS) g->changes++;
    g->changed_ms = cl_clock(d);
    if (id != d->cl->self_id && view_set(g, id, alive)) { /* not a restart */
        if (g->olog_n == GX_LOG_MAX) { /* older entries are counted anew */
            g->olog_base += g->olog_n + 1;
            g->olog_n = 0;
        }
        g->olog[g->olog_n++] = (struct gx_change){id, alive ? OW_JOIN : OW_LEAVE};
    }
    log_change(d, id, alive ? OW_JOIN : OW_LEAVE);
    if (!alive) drop_batch(g, id);
}

void gx_republish(struct cl_ctx *d, uint32_t id)
{
    if (gx_of(d)) log_change(d, id, OW_RESEND);
}

static void visit(struct cl_ctx *d, uint32_t s)
{
    const struct idx_entry *e = idx_at(d->idx, s);
    uint32_t o[GX_MAX_REPLICAS], n;
    if (e->state != IDX_READY) return;
    catch_up(d, s, &e->key, gx_ns_hash(d->host->ns_name(d->host->core, e->ns)), 1, o, &n);
}

static void pass_slice(struct cl_ctx *d)
{
    struct gidx *g = gx_of(d);
    if (!g->pass || cl_clock(d) < g->pass_due_ms) return;
    for (uint32_t k = 0; k < GX_REPUB_SLICE && g->left && d->idx->used; k++, g->left--) {
        if (g->cursor >= d->idx->used) g->cursor = 0;
        visit(d, g->cursor++);
    }
    if (g->left && d->idx->used) return;
    g->pass = 0; /* every READY slot reflects the whole log */
    g->left = 0;
    op_settle(&g->pl);
    flush_due(d, 1);
}

/* Count anew who outranks this node for entry i (O(N)), and drop its
 * holders that are not live. */
static void recount(struct cl_ctx *d, uint32_t i)
{
    struct gidx *g = gx_of(d);
    struct gx_ent *e = &g->e[i];
    uint32_t self = d->cl->self_id, above = 0;
    for (uint32_t j = 0; j < g->nview; j++)
        above += g->view[j] != self && ow_outranks(&e->key, e->nsh, g->view[j], self);
    e->above = (uint8_t)(above < 255 ? above : 255);
    for (int j = e->n - 1; j >= 0; j--)
        if (e->hold[j] != self && !has(g->view, g->nview, e->hold[j])) {
            hold_del(d, g, i, e->hold[j]);
            if (!g->e[i].n) return; /* freed */
        }
}

/* Bring entry i up to date with the view changes since it was last
 * visited: a joiner that outranks this node pushes it down a rank, a
 * leaver that did lifts it, and a leaver stops being a holder. 2 scores
 * per change; a count anew (O(N)) only the first time, or when the log
 * was dropped, or after a lift from 255. Returns 0 if the entry went. */
static int replay_entry(struct cl_ctx *d, uint32_t i)
{
    struct gidx *g = gx_of(d);
    struct gx_ent *e = &g->e[i];
    uint32_t self = d->cl->self_id, end = g->olog_base + g->olog_n;
    int fresh = e->oseq == 0 || e->oseq < g->olog_base;
    for (uint32_t q = e->oseq; !fresh && q < end; q++) {
        const struct gx_change *c = &g->olog[q - g->olog_base];
        int up = ow_outranks(&e->key, e->nsh, c->id, self);
        if (c->kind == OW_JOIN && up && e->above < 255) e->above++;
        if (c->kind != OW_LEAVE) continue;
        if (up && e->above == 255) fresh = 1;
        else if (up) e->above--;
        hold_del(d, g, i, c->id);
        if (!g->e[i].n) return 0;
    }
    if (fresh) recount(d, i);
    if (!g->e[i].n) return 0;
    g->e[i].oseq = end;
    return 1;
}

/* Drop holders not alive, and entries this node no longer owns: one lap
 * after each change, once the view has settled (askers may count on
 * them until then). When the lap is over every entry reflects the view
 * changes logged, and that log is emptied. */
static void sweep_slice(struct cl_ctx *d)
{
    struct gidx *g = gx_of(d);
    if (!g->sweep_left || !settled(d)) return;
    for (uint32_t k = 0; k < GX_SWEEP_SLICE && g->sweep_left && g->used; k++, g->sweep_left--) {
        uint32_t i = g->sweep_next++ % g->used;
        if (!g->e[i].n || !replay_entry(d, i)) continue;
        if (g->e[i].above >= g->r) ent_release(d, g, i);
    }
    if (g->sweep_left && g->used) return;
    g->sweep_left = 0;
    g->olog_base += g->olog_n;
    g->olog_n = 0;
}

/* ------------------------------------------------------------- leaving */

int gx_leave(struct cl_ctx *d)
{
    struct gidx *g = gx_of(d);
    if (!g) return 0;
    uint32_t nv, self = d->cl->self_id, handed = 0;
    const uint32_t *v = view_of(d, &nv);
    for (uint32_t i = 0; i < g->used; i++) {
        const struct gx_ent *e = &g->e[i];
        uint32_t o[GX_MAX_REPLICAS + 1], n;
        if (!e->n) continue;
        n = owners_of(&e->key, e->nsh, v, nv, g->r + 1, o); /* o[r]: who takes our place */
        if (n <= g->r || !has(o, g->r, self)) continue;
        uint32_t sent = 0;
        struct gx_sum sum = {.csum = e->csum, .size = e->size};
        for (uint8_t j = 0; j < e->n; j++)
            if (e->hold[j] != self && ++sent)
                queue_update(d, o[g->r], &e->key, e->nsh, 0, e->hold[j], 1, &sum);
        handed += sent > 0;
    }
    flush_due(d, 1);
    g->handed += handed;
    g->moved += handed;
    return (int)handed;
}
/* ------------------------------------------------------- owner replies */

static int keys_ok(size_t n_keys, const ProtobufCBinaryData *keys, size_t n_nsh)
{
    if (n_keys != n_nsh || n_keys > 1048576) return 0;
    for (size_t i = 0; i < n_keys; i++)
        if (!wire_key_ok(&keys[i])) return 0;
    return 1;
}

/* No holders (the sender holds every key), or one nonzero id per key. */
static int holders_ok(const Kvtier__PeerIndex *ix)
{
    if (ix->n_holder == 0) return 1;
    if (ix->n_holder != ix->n_keys) return 0;
    for (size_t i = 0; i < ix->n_holder; i++)
        if (ix->holder[i] == 0) return 0;
    return 1;
}

/* The further holders of a Holders answer: none, or a count per key
 * (at most GX_ALT_MAX) that adds up to the list. */
static int alts_ok(const Kvtier__PeerHolders *h)
{
    if (h->n_alt_count == 0) return h->n_alt == 0;
    if (h->n_alt_count != h->n_holders) return 0;
    size_t total = 0;
    for (size_t i = 0; i < h->n_alt_count; i++) {
        if (h->alt_count[i] > GX_ALT_MAX) return 0;
        total += h->alt_count[i];
    }
    return total == h->n_alt;
}

static struct gq *find_query(struct gidx *g, uint64_t qid)
{
    struct gq *q = g->qs;
    while (q && q->qid != qid) q = q->next;
    return q;
}

const char *gx_check(struct cl_ctx *d, const struct member *m, const Kvtier__PeerMsg *pm)
{
    const Kvtier__PeerIndex *ix = pm->index;
    const Kvtier__PeerWhoHas *w = pm->who_has;
    const Kvtier__PeerHolders *h = pm->holders;
    struct gq *q;
    switch (pm->body_case) {
    case KVTIER__PEER_MSG__BODY_INDEX:
        return keys_ok(ix->n_keys, ix->keys, ix->n_ns_hash) && ix->n_drop == ix->n_keys &&
                       ix->n_checksum == ix->n_keys && ix->n_size == ix->n_keys &&
                       holders_ok(ix)
                   ? NULL : "malformed index update";
    case KVTIER__PEER_MSG__BODY_WHO_HAS:
        return keys_ok(w->n_keys, w->keys, w->n_ns_hash) ? NULL : "malformed who-has query";
    case KVTIER__PEER_MSG__BODY_HOLDERS:
        if (!(q = find_query(gx_of(d), h->query_id))) return "answer to no query";
        return q->owner == m->id && h->n_holders == q->n && h->n_checksum == q->n &&
                       h->n_size == q->n && alts_ok(h)
                   ? NULL : "malformed holders answer";
    default:
        return NULL;
    }
}

void gx_on_index(struct cl_ctx *d, struct member *m, const Kvtier__PeerMsg *pm)
{
    const Kvtier__PeerIndex *ix = pm->index;
    for (size_t i = 0; i < ix->n_keys; i++) {
        struct gx_sum sum = {.csum = ix->checksum[i], .size = ix->size[i]};
        gx_apply(d, ix->n_holder ? ix->holder[i] : m->id, (const kvt_key *)ix->keys[i].data,
                 ix->ns_hash[i], ix->drop[i], &sum);
    }
}

/* A live holder of (k, nsh) other than `not`, or 0; *sum gets the
 * committer's checksum and size, and the other live holders (alt). */
static uint32_t live_holder(struct cl_ctx *d, const kvt_key *k, uint64_t nsh, uint32_t not,
                            struct gx_sum *sum)
{
    struct gidx *g = gx_of(d);
    uint32_t i = ent_find(g, k, nsh), first = 0;
    sum->n_alt = 0;
    if (i == GX_NONE) return 0;
    for (uint8_t j = 0; j < g->e[i].n; j++) {
        uint32_t h = g->e[i].hold[j];
        if (h == not || (h != d->cl->self_id && !cl_alive(cl_find(d->cl, h)))) continue;
        if (!first) {
            first = h;
            sum->csum = g->e[i].csum;
            sum->size = g->e[i].size;
        } else if (sum->n_alt < GX_ALT_MAX) {
            sum->alt[sum->n_alt++] = h;
        }
    }
    return first;
}

void gx_on_who_has(struct cl_ctx *d, struct member *m, const Kvtier__PeerMsg *pm)
{
    const Kvtier__PeerWhoHas *w = pm->who_has;
    uint32_t *h = calloc((2 + GX_ALT_MAX) * w->n_keys + 1, sizeof *h);
    uint64_t *v = calloc(2 * w->n_keys + 1, sizeof *v);
    if (!h || !v) abort();
    uint32_t *nmore = h + w->n_keys, *more = nmore + w->n_keys;
    size_t n_more = 0;
    for (size_t i = 0; i < w->n_keys; i++) {
        struct gx_sum sm = {0};
        h[i] = live_holder(d, (const kvt_key *)w->keys[i].data, w->ns_hash[i], m->id, &sm);
        v[i] = sm.csum;
        v[w->n_keys + i] = sm.size;
        nmore[i] = sm.n_alt;
        for (uint32_t j = 0; j < sm.n_alt; j++) more[n_more++] = sm.alt[j];
    }
    Kvtier__PeerHolders ph = KVTIER__PEER_HOLDERS__INIT;
    ph.query_id = w->query_id;
    ph.n_holders = ph.n_checksum = ph.n_size = w->n_keys;
    ph.holders = h;
    ph.checksum = v;
    ph.size = v + w->n_keys;
    if (n_more) { /* older requesters ignore them */
        ph.n_alt_count = w->n_keys;
        ph.alt_count = nmore;
        ph.n_alt = n_more;
        ph.alt = more;
    }
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
static void park_finish(struct cl_ctx *d, struct gpark *p)
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
    rsp.id = d->host->park_req_id(p->park);
    rsp.body_case = KVTIER__RESPONSE__BODY_LOOKUP;
    rsp.lookup = &lr;
    d->host->park_answer(d->host->core, p->park, &rsp);
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

/* A holder a requester may pull from: a live member, not this node. */
static int usable(struct cl_ctx *d, uint32_t id)
{
    return id && id != d->cl->self_id && cl_alive(cl_find(d->cl, id));
}

/* Add id to the further holders of sum (first is the one named). */
static void alt_add(struct gx_sum *sum, uint32_t first, uint32_t id)
{
    if (id == first || sum->n_alt == GX_ALT_MAX) return;
    for (uint32_t j = 0; j < sum->n_alt; j++)
        if (sum->alt[j] == id) return;
    sum->alt[sum->n_alt++] = id;
}

void gx_on_holders(struct cl_ctx *d, struct member *m, const Kvtier__PeerMsg *pm)
{
    struct gidx *g = gx_of(d);
    (void)m; /* gx_check matched it to the query */
    const Kvtier__PeerHolders *h = pm->holders;
    struct gq *q = find_query(g, h->query_id);
    struct gpark *p = q->p;
    size_t a = 0; /* key i's further holders start at h->alt[a] */
    for (uint32_t i = 0; i < q->n; i++) {
        uint32_t id = h->holders[i], na = h->n_alt_count ? h->alt_count[i] : 0;
        struct gx_sum *sum = &p->sum[q->idx[i]];
        const uint32_t *alt = na ? h->alt + a : NULL;
        a += na;
        if (!usable(d, id)) continue;
        if (p->tiers[q->idx[i]] == KVTIER__TIER__TIER_NONE) {
            p->tiers[q->idx[i]] = KVTIER__TIER__TIER_PEER;
            p->holder[q->idx[i]] = id;
            *sum = (struct gx_sum){h->checksum[i], h->size[i], {0}, 0};
            g->peer_hits += !p->done;
        } else if (sum->csum != h->checksum[i] || sum->size != h->size[i]) {
            continue; /* another owner's record: its holders are not for this one */
        } else {
            alt_add(sum, p->holder[q->idx[i]], id);
        }
        for (uint32_t j = 0; j < na; j++)
            if (usable(d, alt[j])) alt_add(sum, p->holder[q->idx[i]], alt[j]);
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

static void send_query(struct cl_ctx *d, struct gq *q, uint64_t nsh)
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
static void plan(struct cl_ctx *d, struct gpark *p, uint64_t nsh)
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

static void expire_one(struct cl_ctx *d, struct gpark *p);

/* park.c: the client left; its answers, if any come, find no query. */
static void lookup_gone(void *ctx, void *owner)
{
    struct cl_ctx *d = ctx;
    park_unlink(gx_of(d), owner);
    park_discard(gx_of(d), owner);
}

static void lookup_due(void *ctx, void *owner)
{
    struct cl_ctx *d = ctx;
    expire_one(d, owner);
}

static const struct park_ops lookup_ops = {lookup_gone, lookup_due};

int cluster_lookup(struct cl_ctx *d, uint32_t pipe, uint64_t req_id,
                   const Kvtier__Lookup *q, Kvtier__LookupResp *lr)
{
    struct gidx *g = gx_of(d);
    if (!g || q->local_only || lr->n_present == q->n_keys) return 0;
    uint64_t nsh = gx_ns_hash(q->ns);
    struct gpark *p = park_new(q, lr);
    plan(d, p, nsh);
    if (p->pending) p->park = d->host->park(d->host->core, pipe, req_id, &lookup_ops, d, p);
    if (!p->park) { /* nothing to ask, or no room to wait: what is known */
        memcpy(lr->tiers, p->tiers, p->n * sizeof *p->tiers);
        lr->n_present = leading(p->tiers, p->n);
        park_discard(g, p);
        return 0;
    }
    d->host->park_deadline(d->host->core, p->park, cl_clock(d) + d->cfg.cluster_lookup_ms);
    p->next = g->parks;
    g->parks = p;
    for (struct gq *x = g->qs; x; x = x->next)
        if (x->p == p) send_query(d, x, nsh);
    return 1;
}

void gx_resolve(struct cl_ctx *d, const kvt_key *keys, uint32_t n, uint64_t nsh,
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
    p->deadline = cl_clock(d) + d->cfg.cluster_lookup_ms;
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
static void expire_one(struct cl_ctx *d, struct gpark *p)
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
static void expire(struct cl_ctx *d, uint64_t now)
{
    for (struct gpark *p = gx_of(d)->parks, *next; p; p = next) {
        next = p->next;
        if (!p->park && now >= p->deadline) expire_one(d, p);
    }
}

/* ------------------------------------------------------------ lifecycle */

void gx_tick(struct cl_ctx *d)
{
    struct gidx *g = gx_of(d);
    if (!g) return;
    pass_slice(d);
    sweep_slice(d);
    flush_due(d, 0);
    expire(d, cl_clock(d));
}

int gx_open(struct cl_ctx *d)
{
    struct gidx *g = calloc(1, sizeof *g);
    if (!g) abort();
    d->cl->gx = g;
    g->free_head = GX_NONE;
    g->r = (uint32_t)d->cfg.cluster_replicas;
    if (g->r > GX_MAX_REPLICAS) g->r = GX_MAX_REPLICAS;
    op_init(&g->pl, g->r);
    g->olog_base = 1; /* 0: never counted */
    for (uint32_t i = 0; i < d->cl->n; i++)
        if (cl_alive(d->cl->m[i]) && d->cl->m[i]->id != d->cl->self_id)
            view_set(g, d->cl->m[i]->id, 1);
    view_add(g, d->cl->self_id);
    rehash(g, 1024);
    pass_extend(d); /* publish what was loaded before the cluster opened */
    g->pass_due_ms = 0;
    return 0;
}

void gx_close(struct cl_ctx *d)
{
    struct gidx *g = gx_of(d);
    if (!g) return;
    while (g->qs) gq_unlink(g, g->qs);
    while (g->parks) park_finish(d, g->parks);
    for (uint32_t i = 0; i < GX_BT_BUCKETS; i++)
        for (struct gx_batch *b = g->bt[i], *next; b; b = next) {
            next = b->next;
            free(b);
        }
    free(g->e);
    free(g->bucket);
    op_free(&g->pl);
    free(g->view);
    free(g);
    d->cl->gx = NULL;
}

void gx_stats(struct cl_ctx *d, struct gx_stats *st)
{
    struct gidx *g = gx_of(d);
    memset(st, 0, sizeof *st);
    if (!g) return;
    st->entries = g->count;
    st->moved = g->moved;
    st->handed = g->handed;
    st->query_timeouts = g->timeouts;
    st->peer_hits = g->peer_hits;
    st->batches = g->n_batches;
    st->pass = (uint32_t)g->pass;
    st->log = g->pl.log_n;
    st->sweep = g->sweep_left > 0;
}

void cluster_index_stats(struct cl_ctx *d, struct cluster_index_stats *st)
{
    struct gidx *g = gx_of(d);
    st->moved = g ? g->moved : 0;
    st->query_timeouts = g ? g->timeouts : 0;
}

void gx_fill_peers(struct cl_ctx *d, Kvtier__PeersResp *pr)
{
    struct gidx *g = gx_of(d);
    if (!g) return;
    pr->index_entries = g->count;
    pr->peer_hits = g->peer_hits;
    pr->lookup_timeouts = g->timeouts;
    pr->index_moved = g->moved;
    pr->index_conflicts = g->conflicts;
}
