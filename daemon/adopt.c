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

#include "journal.h"
#include "kvtierd.h"
#include "log.h"
#include "pool.h"
#include "store.h"

#define COMPACT_MIN (4u << 20)
#define REC_BYTES 96

struct cand {
    uint32_t slot, gen;
    kvt_key parent;
    int has_parent;
};

struct replay {
    struct kvtierd *d;
    struct cand *v;
    size_t n, cap;
    uint64_t skipped;
};

static void drop_pending(struct kvtierd *d, uint32_t slot)
{
    struct idx_entry *e = idx_at(&d->idx, slot);
    struct tier_loc loc = {0, 0, e->blk};
    d->dram->tier.ops->free(&d->dram->tier, &loc);
    e->blk = IDX_NONE;
    idx_remove(&d->idx, slot);
}

static void on_del(void *arg, const char *ns, const kvt_key *key)
{
    struct replay *R = arg;
    uint16_t id = ns_find(&R->d->ns, ns);
    uint32_t slot = id == NS_NONE ? IDX_NONE : idx_find(&R->d->idx, id, key);
    if (slot != IDX_NONE) drop_pending(R->d, slot);
}

/* Is r in its namespace's pool (tenants keep to theirs), and was that
 * pool's content kept? A pool made afresh holds nothing of the last run. */
static int pool_holds(const struct kvtierd *d, const struct jrec *r)
{
    uint32_t p = dram_pool_of_off(d->dram, r->off);
    const struct dram_seg *s = &d->dram->seg[p];
    return s->adopted && r->off >= s->off && r->size <= s->bytes &&
           r->off - s->off <= s->bytes - r->size && p == pool_of_ns(d, r->ns);
}

static void on_add(void *arg, const struct jrec *r)
{
    struct replay *R = arg;
    struct kvtierd *d = R->d;
    struct tier_loc loc;
    uint16_t id = ns_intern(&d->ns, r->ns);
    if (id == NS_NONE) return;
    on_del(arg, r->ns, &r->key); /* a chunk added again replaces itself */
    if (r->size == 0 || r->size > d->cfg.max_chunk_bytes || !pool_holds(d, r) ||
        d->dram->tier.ops->alloc_at(&d->dram->tier, r->off, r->size, &loc) != KVT_OK) {
        R->skipped++;
        return;
    }
    uint32_t slot = idx_insert(&d->idx, id, &r->key);
    if (slot == IDX_NONE) {
        d->dram->tier.ops->free(&d->dram->tier, &loc);
        R->skipped++;
        return;
    }
    struct idx_entry *e = idx_at(&d->idx, slot);
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
    struct kvtierd *d = R->d;
    uint64_t n = 0;
    for (size_t i = 0; i < R->n; i++) {
        const struct cand *c = &R->v[i];
        struct idx_entry *e = idx_at(&d->idx, c->slot);
        if (e->gen != c->gen || e->state != IDX_PENDING) continue; /* deleted later */
        if (kvt_checksum(store_ptr(d, c->slot), e->size) != e->csum) {
            d->adopt_dropped++;
            drop_pending(d, c->slot);
            continue;
        }
        uint32_t p = c->has_parent ? idx_find(&d->idx, e->ns, &c->parent) : IDX_NONE;
        idx_commit(&d->idx, c->slot, p, 0);
        d->ns.v[e->ns].chunks++;
        d->ns.v[e->ns].bytes += e->size;
        n++;
    }
    return n;
}

/* ------------------------------------------------------------ snapshot */

struct snap {
    struct kvtierd *d;
    uint32_t *slots;
};

static int by_off(const void *a, const void *b, void *arg)
{
    const struct kvtierd *d = arg;
    uint64_t x = store_off(d, *(const uint32_t *)a), y = store_off(d, *(const uint32_t *)b);
    return (x > y) - (x < y);
}

static void snap_next(void *arg, size_t i, uint16_t *ns_id, struct jrec *r)
{
    struct snap *s = arg;
    uint32_t slot = s->slots[i];
    const struct idx_entry *e = idx_at(&s->d->idx, slot);
    const struct idx_entry *p = e->parent != IDX_NONE ? idx_at(&s->d->idx, e->parent) : NULL;
    *ns_id = e->ns;
    memset(r, 0, sizeof *r);
    r->ns = s->d->ns.v[e->ns].name;
    r->key = e->key;
    r->off = store_off(s->d, slot);
    r->size = e->size;
    r->csum = e->csum;
    r->has_parent = p && p->gen == e->parent_gen && p->state != IDX_FREE;
    if (r->has_parent) r->parent = p->key;
}

/* Rewrite the journal as the committed DRAM chunks, by offset. */
static void snapshot(struct kvtierd *d)
{
    struct snap s = {d, malloc((d->idx.n_in[0] + 1) * sizeof(uint32_t))};
    size_t n = 0;
    if (!s.slots) abort(); /* control-plane allocation */
    for (uint32_t i = 0; i < d->idx.used && n < d->idx.n_in[0]; i++) {
        const struct idx_entry *e = idx_at(&d->idx, i);
        if (e->state == IDX_READY && (e->tier & IDX_DRAM)) s.slots[n++] = i;
    }
    qsort_r(s.slots, n, sizeof *s.slots, by_off, d);
    journal_snapshot(d->journal, n, snap_next, &s);
    free(s.slots);
}

/* ------------------------------------------------------------- hooks */

static struct jrec rec_of(const struct kvtierd *d, uint32_t slot)
{
    const struct idx_entry *e = idx_at(&d->idx, slot);
    struct jrec r = {.ns = d->ns.v[e->ns].name, .key = e->key,
                     .off = store_off(d, slot), .size = e->size, .csum = e->csum};
    const struct idx_entry *p = e->parent != IDX_NONE ? idx_at(&d->idx, e->parent) : NULL;
    r.has_parent = p && p->gen == e->parent_gen && p->state != IDX_FREE;
    if (r.has_parent) r.parent = p->key;
    return r;
}

void adopt_added(struct kvtierd *d, uint32_t slot)
{
    if (!d->journal) return;
    struct jrec r = rec_of(d, slot);
    journal_add(d->journal, idx_at(&d->idx, slot)->ns, r.ns, &r);
}

void adopt_removed(struct kvtierd *d, uint32_t slot)
{
    if (!d->journal) return;
    const struct idx_entry *e = idx_at(&d->idx, slot);
    journal_del(d->journal, e->ns, d->ns.v[e->ns].name, &e->key);
}

void adopt_flush(struct kvtierd *d)
{
    if (d->journal) journal_flush(d->journal);
}

void adopt_tick(struct kvtierd *d)
{
    if (!d->journal) return;
    uint64_t live = d->idx.n_in[0] * REC_BYTES;
    if (journal_size(d->journal) > COMPACT_MIN && journal_size(d->journal) > 4 * live)
        snapshot(d);
    else
        journal_flush(d->journal);
}

/* ------------------------------------------------------- start and stop */

int adopt_open(struct kvtierd *d)
{
    char path[CFG_STR_MAX + 32], err[CFG_STR_MAX + 64], layout[4096];
    if (!d->cfg.dram_adopt) return 0;
    snprintf(path, sizeof path, "%s/dram.journal", d->cfg.state_dir);
    dram_layout(d->dram, layout, sizeof layout);
    if (journal_open(path, d->dram->bytes, layout, &d->journal, err,
                     sizeof err) != 0) {
        log_error("dram", "%s", err);
        return -1;
    }
    d->ns.journal = d->journal; /* renamed ids are named afresh */
    struct replay R = {d, NULL, 0, 0, 0};
    int any = 0;
    for (uint32_t i = 0; i < d->dram->n_seg; i++) any |= d->dram->seg[i].adopted;
    long long recs = any ? journal_replay(d->journal, on_add, on_del, &R) : 0;
    if (recs < 0) log_warn("dram", "cannot read %s: nothing adopted", path);
    d->adopted = commit_all(&R);
    free(R.v);
    if (d->adopted || d->adopt_dropped || R.skipped)
        log_info("dram", "adopted %llu chunks (%llu MiB) from the previous run's pool; "
                 "%llu dropped (checksum), %llu journal records unusable",
                 (unsigned long long)d->adopted,
                 (unsigned long long)(d->idx.bytes_in[0] >> 20),
                 (unsigned long long)d->adopt_dropped, (unsigned long long)R.skipped);
    snapshot(d);
    return 0;
}

void adopt_close(struct kvtierd *d)
{
    if (!d->journal) return;
    snapshot(d);
    d->ns.journal = NULL;
    journal_close(d->journal);
    d->journal = NULL;
}
