/*
 * adopt.c -- keeping the DRAM cache across a restart: the journal of
 * committed DRAM chunks (journal.h) written as the cache changes, and the
 * adoption of a predecessor's pool at start.
 *
 * Design: adoption runs in open_tiers, after the pool is mapped and the
 * index exists and before the NVMe index is loaded (which then finds the
 * adopted chunks and only adds their NVMe copy) and before READY. The log
 * is replayed into the index as PENDING entries holding their pool
 * ranges, so later records (a DEL, the space re-added to another chunk)
 * apply in order; then every surviving chunk's bytes are checked against
 * its checksum before it is committed: a chunk whose space a client was
 * writing when the predecessor died, or whose DEL was lost, is dropped
 * and counted, never served. This costs one pass over the adopted bytes
 * on the core thread, before any client is served. The journal is then
 * rewritten as a snapshot of what was adopted.
 * With tenants' own pools (dram.h) the one journal covers every pool: its
 * label is the layout of the pools, and a record is adopted only inside
 * a kept pool, the one its namespace belongs to.
 */
#include <stdlib.h>
#include <string.h>

#include "adopt.h"

#include "config.h"
#include "dram.h"
#include "index.h"
#include "journal.h"
#include "log.h"
#include "ns.h"

#define COMPACT_MIN (4u << 20)
#define REC_BYTES 96

struct cand {
    uint32_t slot, gen;
    kvt_key parent;
    int has_parent;
};

struct replay {
    struct adopt *a;
    uint64_t max_chunk;
    struct cand *v;
    size_t n, cap;
    uint64_t skipped;
};

static uint64_t off_of(const struct adopt *a, uint32_t slot)
{
    return dram_block_off(a->dram, idx_at(a->idx, slot)->blk);
}

static void drop_pending(struct adopt *a, uint32_t slot)
{
    struct idx_entry *e = idx_at(a->idx, slot);
    struct tier_loc loc = {0, 0, e->blk};
    a->dram->tier.ops->free(&a->dram->tier, &loc);
    e->blk = IDX_NONE;
    idx_remove(a->idx, slot);
}

static void on_del(void *arg, const char *ns, const kvt_key *key)
{
    struct replay *R = arg;
    uint16_t id = ns_find(R->a->ns, ns);
    uint32_t slot = id == NS_NONE ? IDX_NONE : idx_find(R->a->idx, id, key);
    if (slot != IDX_NONE) drop_pending(R->a, slot);
}

/* Is r in its namespace's pool (tenants keep to theirs), and was that
 * pool's content kept? A pool made afresh holds nothing of the last run. */
static int pool_holds(const struct adopt *a, const struct jrec *r)
{
    uint32_t p = dram_pool_of_off(a->dram, r->off);
    const struct dram_seg *s = &a->dram->seg[p];
    uint32_t want = a->pool_of ? a->pool_of(a->pool_arg, r->ns) : 0;
    return s->adopted && r->off >= s->off && r->size <= s->bytes &&
           r->off - s->off <= s->bytes - r->size && p == want;
}

static void on_add(void *arg, const struct jrec *r)
{
    struct replay *R = arg;
    struct adopt *a = R->a;
    struct tier *pool = &a->dram->tier;
    struct tier_loc loc;
    uint16_t id = ns_intern(a->ns, r->ns);
    if (id == NS_NONE) return;
    on_del(arg, r->ns, &r->key); /* a chunk added again replaces itself */
    if (r->size == 0 || r->size > R->max_chunk || !pool_holds(a, r) ||
        pool->ops->alloc_at(pool, r->off, r->size, &loc) != KVT_OK) {
        R->skipped++;
        return;
    }
    uint32_t slot = idx_insert(a->idx, id, &r->key);
    if (slot == IDX_NONE) {
        pool->ops->free(pool, &loc);
        R->skipped++;
        return;
    }
    struct idx_entry *e = idx_at(a->idx, slot);
    e->blk = loc.h;
    e->size = r->size;
    e->csum = r->csum;
    if (R->n == R->cap) {
        R->cap = R->cap ? R->cap * 2 : 1024;
        if (!(R->v = realloc(R->v, R->cap * sizeof *R->v))) abort();
    }
    R->v[R->n++] = (struct cand){slot, e->gen, r->parent, r->has_parent};
}

/* Check and commit what the replay left; returns chunks adopted. */
static uint64_t commit_all(struct replay *R)
{
    struct adopt *a = R->a;
    uint64_t n = 0;
    for (size_t i = 0; i < R->n; i++) {
        const struct cand *c = &R->v[i];
        struct idx_entry *e = idx_at(a->idx, c->slot);
        if (e->gen != c->gen || e->state != IDX_PENDING) continue; /* deleted later */
        if (kvt_checksum(dram_ptr(a->dram, off_of(a, c->slot)), e->size) != e->csum) {
            a->dropped++;
            drop_pending(a, c->slot);
            continue;
        }
        uint32_t p = c->has_parent ? idx_find(a->idx, e->ns, &c->parent) : IDX_NONE;
        idx_commit(a->idx, c->slot, p, 0);
        a->ns->v[e->ns].chunks++;
        a->ns->v[e->ns].bytes += e->size;
        n++;
    }
    return n;
}

/* ------------------------------------------------------------ snapshot */

struct snap {
    const struct adopt *a;
    uint32_t *slots;
};

static int by_off(const void *l, const void *r, void *arg)
{
    const struct adopt *a = arg;
    uint64_t x = off_of(a, *(const uint32_t *)l), y = off_of(a, *(const uint32_t *)r);
    return (x > y) - (x < y);
}

static void snap_next(void *arg, size_t i, uint16_t *ns_id, struct jrec *r)
{
    struct snap *s = arg;
    uint32_t slot = s->slots[i];
    const struct idx_entry *e = idx_at(s->a->idx, slot);
    const struct idx_entry *p = e->parent != IDX_NONE ? idx_at(s->a->idx, e->parent) : NULL;
    *ns_id = e->ns;
    memset(r, 0, sizeof *r);
    r->ns = s->a->ns->v[e->ns].name;
    r->key = e->key;
    r->off = off_of(s->a, slot);
    r->size = e->size;
    r->csum = e->csum;
    r->has_parent = p && p->gen == e->parent_gen && p->state != IDX_FREE;
    if (r->has_parent) r->parent = p->key;
}

/* Rewrite the journal as the committed DRAM chunks, by offset. */
static void snapshot(struct adopt *a)
{
    const struct idx *ix = a->idx;
    struct snap s = {a, malloc((ix->n_in[0] + 1) * sizeof(uint32_t))};
    size_t n = 0;
    if (!s.slots) abort(); /* control-plane allocation */
    for (uint32_t i = 0; i < ix->used && n < ix->n_in[0]; i++) {
        const struct idx_entry *e = idx_at(ix, i);
        if (e->state == IDX_READY && (e->tier & IDX_DRAM)) s.slots[n++] = i;
    }
    qsort_r(s.slots, n, sizeof *s.slots, by_off, a);
    journal_snapshot(a->journal, n, snap_next, &s);
    free(s.slots);
}

/* ------------------------------------------------------------- hooks */

static struct jrec rec_of(const struct adopt *a, uint32_t slot)
{
    const struct idx_entry *e = idx_at(a->idx, slot);
    struct jrec r = {.ns = a->ns->v[e->ns].name, .key = e->key,
                     .off = off_of(a, slot), .size = e->size, .csum = e->csum};
    const struct idx_entry *p = e->parent != IDX_NONE ? idx_at(a->idx, e->parent) : NULL;
    r.has_parent = p && p->gen == e->parent_gen && p->state != IDX_FREE;
    if (r.has_parent) r.parent = p->key;
    return r;
}

void adopt_added(struct adopt *a, uint32_t slot)
{
    if (!a->journal) return;
    struct jrec r = rec_of(a, slot);
    journal_add(a->journal, idx_at(a->idx, slot)->ns, r.ns, &r);
}

void adopt_removed(struct adopt *a, uint32_t slot)
{
    if (!a->journal) return;
    const struct idx_entry *e = idx_at(a->idx, slot);
    journal_del(a->journal, e->ns, a->ns->v[e->ns].name, &e->key);
}

void adopt_flush(struct adopt *a)
{
    if (a->journal) journal_flush(a->journal);
}

void adopt_tick(struct adopt *a)
{
    if (!a->journal) return;
    uint64_t live = a->idx->n_in[0] * REC_BYTES;
    if (journal_size(a->journal) > COMPACT_MIN && journal_size(a->journal) > 4 * live)
        snapshot(a);
    else
        journal_flush(a->journal);
}

/* ------------------------------------------------------- start and stop */

int adopt_open(struct adopt *a, int enabled, const char *state_dir,
               uint64_t max_chunk_bytes)
{
    char path[CFG_STR_MAX + 32], err[CFG_STR_MAX + 64], layout[4096];
    if (!enabled) return 0;
    snprintf(path, sizeof path, "%s/dram.journal", state_dir);
    dram_layout(a->dram, layout, sizeof layout);
    if (journal_open(path, a->dram->bytes, layout, &a->journal, err,
                     sizeof err) != 0) {
        log_error("dram", "%s", err);
        return -1;
    }
    a->ns->journal = a->journal; /* renamed ids are named afresh */
    struct replay R = {a, max_chunk_bytes, NULL, 0, 0, 0};
    int any = 0;
    for (uint32_t i = 0; i < a->dram->n_seg; i++) any |= a->dram->seg[i].adopted;
    long long recs = any ? journal_replay(a->journal, on_add, on_del, &R) : 0;
    if (recs < 0) log_warn("dram", "cannot read %s: nothing adopted", path);
    a->adopted = commit_all(&R);
    free(R.v);
    if (a->adopted || a->dropped || R.skipped)
        log_info("dram", "adopted %llu chunks (%llu MiB) from the previous run's pool; "
                 "%llu dropped (checksum), %llu journal records unusable",
                 (unsigned long long)a->adopted,
                 (unsigned long long)(a->idx->bytes_in[0] >> 20),
                 (unsigned long long)a->dropped, (unsigned long long)R.skipped);
    snapshot(a);
    return 0;
}

void adopt_close(struct adopt *a)
{
    if (!a->journal) return;
    snapshot(a);
    a->ns->journal = NULL;
    journal_close(a->journal);
    a->journal = NULL;
}
