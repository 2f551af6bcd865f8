/*
 * nvio.c -- the NVMe policy's data movement: writes down (demotion,
 * write-through, FLUSH), reads up (promotion), the checksum worker, and
 * NVMe eviction. See nvstore.h for the policy.
 *
 * Invariants: a chunk with I/O in flight is pinned (its DRAM copy cannot
 * be freed or reused under the kernel) and flagged IDX_F_WRITING or
 * IDX_F_READING (its NVMe record cannot be dropped under the kernel); a
 * delete meanwhile only dooms it, and the completion frees it. The NVMe
 * copy counts (IDX_NVME) only once both writes of its record completed,
 * and only then is it put in the index; the DRAM copy of a promoted chunk
 * counts only once its checksum matched.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "fault.h"
#include "log.h"
#include "nvstore_int.h"
#include "uring.h"

#define FULL_BACKOFF_MS 1000

/* ------------------------------------------------------ checksum worker */

int nvs_worker_start(struct nvs_ctx *d)
{
    struct wq_opts o = {.name = "nvme-checksum", .threads = 1, .cq = d->cq};
    return workq_open(&o, &nvs_of(d)->csq);
}

void nvs_worker_stop(struct nvs_ctx *d)
{
    workq_close(nvs_of(d)->csq, WQ_DRAIN); /* it finishes what it was given */
    nvs_of(d)->csq = NULL;
}

static void checked(struct wq_job *wj)
{
    struct nvs_job *j = (struct nvs_job *)wj;
    j->done(j->d, j);
}

void nvs_check(struct nvs_ctx *d, struct nvs_job *j, const void *p, uint64_t n,
               uint64_t want, void (*done)(struct nvs_ctx *d, struct nvs_job *j),
               void *ctx)
{
    wq_csum_init(&j->c, p, n, want, checked);
    j->d = d;
    j->done = done;
    j->ctx = ctx;
    wq_submit(nvs_of(d)->csq, &j->c.job);
}

/* ------------------------------------------------------------ records */

struct tier_loc nvs_loc_of(const struct nvs_ctx *d, uint32_t slot)
{
    const struct idx_nv *v = idx_nv_at(d->idx, slot);
    uint32_t size = idx_at(d->idx, slot)->size;
    return (struct tier_loc){(uint64_t)v->file << NVME_FILE_SHIFT |
                                 (uint64_t)v->blk * NVME_BLOCK,
                             nvme_rec_len(size), v->h};
}

static void set_loc(struct nvs_ctx *d, uint32_t slot, const struct tier_loc *l)
{
    struct idx_nv *v = idx_nv_at(d->idx, slot);
    v->h = l->h;
    v->file = (uint16_t)nvme_loc_file(l);
    v->blk = (uint32_t)(nvme_loc_off(l) / NVME_BLOCK);
}

static void free_record(struct nvs_ctx *d, uint32_t slot)
{
    struct idx_nv *v = idx_nv_at(d->idx, slot);
    if (v->h == IDX_NONE) return;
    struct tier_loc l = nvs_loc_of(d, slot);
    struct tier *t = &nvs_of(d)->tier->tier;
    t->ops->free(t, &l);
    v->h = IDX_NONE;
}

/* The parent key of a chunk, if its parent is still that chunk. */
static int parent_key(const struct nvs_ctx *d, uint32_t slot, kvt_key *k)
{
    const struct idx_entry *e = idx_at(d->idx, slot);
    if (e->parent == IDX_NONE) return 0;
    const struct idx_entry *p = idx_at(d->idx, e->parent);
    if (p->gen != e->parent_gen || p->state == IDX_FREE) return 0;
    *k = p->key;
    return 1;
}

void nvs_fill_rec(const struct nvs_ctx *d, uint32_t slot, struct nvx_rec *r)
{
    const struct idx_entry *e = idx_at(d->idx, slot);
    const struct nvs *s = nvs_of(d);
    struct tier_loc l = nvs_loc_of(d, slot);
    const struct nvme_file *f = &s->tier->files[nvme_loc_file(&l)];
    memset(r, 0, sizeof *r);
    snprintf(r->ns, sizeof r->ns, "%s", d->host->ns_name(d->host->core, e->ns));
    r->key = e->key;
    r->has_parent = parent_key(d, slot, &r->parent);
    r->dir = f->dir;
    r->num = f->num;
    r->off = nvme_loc_off(&l);
    r->len = (uint32_t)l.len;
    r->size = e->size;
    r->csum = e->csum;
    r->seq = ++nvs_of(d)->seq;
    r->atime = (uint64_t)time(NULL);
}

/* Drop the NVMe copy of a chunk (it keeps its DRAM copy if it has one;
 * with none left the chunk is gone). */
void nvs_drop_record(struct nvs_ctx *d, uint32_t slot)
{
    struct idx_entry *e = idx_at(d->idx, slot);
    d->host->ev_removed(d->host->core, slot, IDX_NVME);
    nvx_del(nvs_of(d)->index, d->host->ns_name(d->host->core, e->ns), &e->key);
    free_record(d, slot);
    idx_set_tier(d->idx, slot, (uint8_t)(e->tier & ~IDX_NVME));
    if (e->tier == 0 && e->pins == 0) d->host->free_slot(d->host->core, slot);
}

void nvs_release(struct nvs_ctx *d, uint32_t slot)
{
    struct idx_entry *e = idx_at(d->idx, slot);
    if (e->tier & IDX_NVME)
        nvx_del(nvs_of(d)->index, d->host->ns_name(d->host->core, e->ns), &e->key);
    free_record(d, slot);
    idx_set_flags(d->idx, slot, 0, 0xff);
}

/* ------------------------------------------------------- NVMe eviction */

static int evict_one_nv(struct nvs_ctx *d)
{
    uint32_t v = idx_victim_nv(d->idx);
    if (v == IDX_NONE) return 0;
    nvs_of(d)->st.evictions++;
    nvs_drop_record(d, v);
    return 1;
}

/* NVMe space for a record, dropping NVMe leaves until it fits. */
static kvt_err nv_alloc(struct nvs_ctx *d, uint64_t len, struct tier_loc *loc)
{
    struct nvs *s = nvs_of(d);
    struct tier *t = &s->tier->tier;
    if (d->host->clock_ms(d->host->core) < s->full_until) return KVT_ENOSPC;
    for (;;) {
        kvt_err e = t->ops->alloc(t, len, loc);
        if (e != KVT_ENOSPC) return e;
        if (!evict_one_nv(d)) break;
    }
    s->full_until = d->host->clock_ms(d->host->core) + FULL_BACKOFF_MS;
    s->st.enospc++;
    if (!s->full_logged)
        log_warn("nvme", "no space for a %llu-byte record: demotion stops until "
                 "space frees (DRAM keeps serving; chunks stay in DRAM)",
                 (unsigned long long)len);
    s->full_logged = 1;
    return KVT_ENOSPC;
}

void nvs_nv_watermark(struct nvs_ctx *d)
{
    struct nvs *s = nvs_of(d);
    struct tier_usage u;
    s->tier->tier.ops->usage(&s->tier->tier, &u);
    uint64_t high = (uint64_t)((double)u.capacity * d->cfg.nvme_high_watermark);
    uint64_t low = (uint64_t)((double)u.capacity * d->cfg.nvme_low_watermark);
    if (u.used <= high) return;
    uint64_t used = u.used;
    for (int n = 0; n < 256 && used > low; n++) {
        uint32_t v = idx_victim_nv(d->idx);
        if (v == IDX_NONE) break;
        used -= nvme_rec_len(idx_at(d->idx, v)->size);
        s->st.evictions++;
        nvs_drop_record(d, v);
    }
}

/* ----------------------------------------------------------------- writes */

struct wctx {
    struct nvs_ctx *d;
    uint32_t slot;
    struct nvs_flush *f;
    tier_done_fn done; /* the caller of tier.h's write, or NULL */
    void *arg;
};

static void write_ok(struct nvs_ctx *d, uint32_t slot)
{
    struct nvs *s = nvs_of(d);
    struct idx_entry *e = idx_at(d->idx, slot);
    struct nvx_rec r;
    idx_set_tier(d->idx, slot, (uint8_t)(e->tier | IDX_NVME));
    d->host->ev_stored(d->host->core, slot, IDX_NVME);
    nvs_fill_rec(d, slot, &r);
    if (!fault_hit(FAULT_INDEX_PUT))
        nvx_put(s->index, &r, s->tier->files[idx_nv_at(d->idx, slot)->file].fd);
    s->st.demotions++;
    s->st.demoted_bytes += e->size;
    s->full_logged = 0;
}

static void write_done(void *arg, kvt_err err)
{
    struct wctx *c = arg;
    struct nvs_ctx *d = c->d;
    struct nvs *s = nvs_of(d);
    uint32_t slot = c->slot;
    struct idx_entry *e = idx_at(d->idx, slot);
    int drop = (idx_nv_at(d->idx, slot)->flags & IDX_F_DROP) != 0;
    s->writes--;
    if (drop) s->demoting -= e->size;
    if (err != KVT_OK) {
        (*(err == KVT_ENOSPC ? &s->st.enospc : &s->st.write_errors))++;
        log_warn("nvme", "writing a record failed: %s; the chunk stays in DRAM",
                 kvt_strerror(err));
        free_record(d, slot);
    } else if (e->state == IDX_READY) {
        write_ok(d, slot);
    }
    idx_set_flags(d->idx, slot, 0, IDX_F_WRITING | IDX_F_DROP);
    if (c->f) {
        if (err == KVT_OK) c->f->written++, c->f->bytes += e->size;
        else c->f->failed++;
        nvs_flush_progress(d, c->f);
    }
    tier_done_fn done = c->done;
    void *done_arg = c->arg;
    free(c);
    if (idx_unpin(d->idx, slot) == 0 && e->state == IDX_DOOMED) d->host->free_slot(d->host->core, slot);
    else if (drop && err == KVT_OK && e->pins == 0 && (e->tier & IDX_DRAM))
        d->host->drop_dram(d->host->core, slot);
    if (done) done(done_arg, err);
    nvs_pump(d);
    d->host->watermark(d->host->core);
}

/* Start writing a READY chunk that is in DRAM only. 0, or -1 if it
 * cannot be written now (no space: counted and logged). */
static int start_write(struct nvs_ctx *d, uint32_t slot, int drop,
                       struct nvs_flush *f, tier_done_fn done, void *arg)
{
    struct nvs *s = nvs_of(d);
    struct idx_entry *e = idx_at(d->idx, slot);
    struct tier_loc loc;
    if (nv_alloc(d, nvme_rec_len(e->size), &loc) != KVT_OK) return -1;
    struct nvme_meta m;
    memset(&m, 0, sizeof m);
    snprintf(m.ns, sizeof m.ns, "%s", d->host->ns_name(d->host->core, e->ns));
    m.key = e->key;
    m.has_parent = parent_key(d, slot, &m.parent);
    m.size = e->size;
    m.csum = e->csum;
    m.seq = ++s->seq;
    set_loc(d, slot, &loc);
    idx_pin(d->idx, slot);
    idx_set_flags(d->idx, slot, (uint8_t)(IDX_F_WRITING | (drop ? IDX_F_DROP : 0)), 0);
    struct wctx *c = malloc(sizeof *c);
    if (!c) abort(); /* control-plane allocation */
    *c = (struct wctx){d, slot, f, done, arg};
    s->writes++;
    if (drop) s->demoting += e->size;
    if (nvme_write_record(s->tier, &loc, &m, th_ptr(d->host, slot), write_done, c) != KVT_OK)
        write_done(c, KVT_EIO); /* cannot happen for a location we made */
    return 0;
}

/* A chunk that may be written now: READY, in DRAM only, no I/O. */
static int writable(const struct nvs_ctx *d, uint32_t slot)
{
    const struct idx_entry *e = idx_at(d->idx, slot);
    return e->state == IDX_READY && e->tier == IDX_DRAM &&
           !(idx_nv_at(d->idx, slot)->flags & (IDX_F_WRITING | IDX_F_READING));
}

kvt_err nvs_demote(struct nvs_ctx *d, uint32_t slot, tier_done_fn done, void *arg)
{
    struct nvs *s = nvs_of(d);
    if (s->writes >= s->max_writes || !writable(d, slot)) return KVT_EBUSY;
    return start_write(d, slot, 1, NULL, done, arg) == 0 ? KVT_OK : KVT_EBUSY;
}

uint64_t nvs_demoting_bytes(const struct nvs_ctx *d)
{
    return nvs_of(d)->demoting;
}

int nvs_enqueue_write(struct nvs_ctx *d, uint32_t slot, struct nvs_flush *f)
{
    struct nvs *s = nvs_of(d);
    if (s->wq_n == s->wq_cap) {
        uint32_t ncap = s->wq_cap ? s->wq_cap * 2 : 1024;
        struct nvs_wq_item *nq = malloc(ncap * sizeof *nq);
        if (!nq) abort(); /* control-plane allocation */
        for (uint32_t i = 0; i < s->wq_n; i++) nq[i] = s->wq[(s->wq_head + i) % s->wq_cap];
        free(s->wq);
        s->wq = nq;
        s->wq_cap = ncap;
        s->wq_head = 0;
    }
    s->wq[(s->wq_head + s->wq_n++) % s->wq_cap] =
        (struct nvs_wq_item){slot, idx_at(d->idx, slot)->gen, f};
    idx_set_flags(d->idx, slot, IDX_F_QUEUED, 0);
    return 0;
}

/* Start a queued write. 0, or -1 if it was not started. */
static int start_queued(struct nvs_ctx *d, struct nvs_wq_item it)
{
    const struct idx_entry *e = idx_at(d->idx, it.slot);
    if (e->gen != it.gen || e->state == IDX_FREE) return -1;
    idx_set_flags(d->idx, it.slot, 0, IDX_F_QUEUED);
    if (!writable(d, it.slot)) return -1;
    return start_write(d, it.slot, it.f && it.f->evict, it.f, NULL, NULL);
}

/* A FLUSH's chunk that was not written by it: already on NVMe (or being
 * written), gone, or no space. */
static void flush_skipped(struct nvs_ctx *d, struct nvs_wq_item it)
{
    const struct idx_entry *e = idx_at(d->idx, it.slot);
    int same = e->gen == it.gen && e->state == IDX_READY;
    if (same && ((e->tier & IDX_NVME) ||
                 (idx_nv_at(d->idx, it.slot)->flags & IDX_F_WRITING)))
        it.f->clean++;
    else if (same)
        it.f->failed++;
    nvs_flush_progress(d, it.f);
}

/* Start queued writes while there is room. */
void nvs_pump(struct nvs_ctx *d)
{
    struct nvs *s = nvs_of(d);
    while (s->wq_n && s->writes < s->max_writes) { /* no space: fails fast */
        struct nvs_wq_item it = s->wq[s->wq_head];
        s->wq_head = (s->wq_head + 1) % s->wq_cap;
        s->wq_n--;
        if (start_queued(d, it) == 0 || !it.f) continue;
        flush_skipped(d, it);
    }
}

void nvs_committed(struct nvs_ctx *d, uint32_t slot)
{
    if (!d->cfg.nvme_write_through) return;
    nvs_enqueue_write(d, slot, NULL);
    nvs_pump(d);
}

/* ------------------------------------------------------------------ reads */

struct rctx {
    struct nvs_ctx *d;
    uint32_t slot;
    tier_done_fn done; /* the caller of tier.h's read, or NULL */
    void *arg;
    struct nvs_job job;
};

/* The read of a promotion ended (ok: its checksum matched). */
static void promote_end(struct nvs_ctx *d, uint32_t slot, kvt_err err,
                        tier_done_fn done, void *arg)
{
    int ok = err == KVT_OK;
    struct nvs *s = nvs_of(d);
    struct idx_entry *e = idx_at(d->idx, slot);
    s->reads--;
    idx_set_flags(d->idx, slot, 0, IDX_F_READING);
    if (ok && e->state == IDX_READY) {
        idx_set_tier(d->idx, slot, (uint8_t)(e->tier | IDX_DRAM));
        d->host->dram_added(d->host->core, slot);
        d->host->ev_stored(d->host->core, slot, IDX_DRAM);
        s->st.promotions++;
        s->st.promoted_bytes += e->size;
    } else {
        struct tier_loc loc = {0, 0, e->blk};
        d->dram->tier.ops->free(&d->dram->tier, &loc);
        e->blk = IDX_NONE;
    }
    if (idx_unpin(d->idx, slot) == 0 && (e->state == IDX_DOOMED || e->tier == 0))
        d->host->free_slot(d->host->core, slot);
    if (done) done(arg, ok ? KVT_OK : err);
    nvs_park_notify(d);
}

static void verified(struct nvs_ctx *d, struct nvs_job *j)
{
    struct rctx *c = j->ctx;
    uint32_t slot = c->slot;
    struct idx_entry *e = idx_at(d->idx, slot);
    if (!j->c.ok) {
        nvs_of(d)->st.csum_failures++;
        log_warn("nvme", "checksum mismatch reading chunk %02x%02x%02x%02x... of "
                 "%s: not served, record dropped", e->key.b[0], e->key.b[1],
                 e->key.b[2], e->key.b[3], d->host->ns_name(d->host->core, e->ns));
        if (e->state == IDX_READY) {
            d->host->ev_removed(d->host->core, slot, IDX_NVME);
            nvx_del(nvs_of(d)->index, d->host->ns_name(d->host->core, e->ns), &e->key);
            free_record(d, slot);
            idx_set_tier(d->idx, slot, (uint8_t)(e->tier & ~IDX_NVME));
        }
    }
    kvt_err err = j->c.ok ? KVT_OK : KVT_ECORRUPT; /* j lives in c */
    tier_done_fn done = c->done;
    void *arg = c->arg;
    free(c);
    promote_end(d, slot, err, done, arg);
}

static void read_done(void *arg, kvt_err err)
{
    struct rctx *c = arg;
    struct nvs_ctx *d = c->d;
    if (err != KVT_OK) {
        nvs_of(d)->st.read_errors++;
        log_warn("nvme", "reading a record failed: %s; a miss", kvt_strerror(err));
        uint32_t slot = c->slot;
        tier_done_fn done = c->done;
        void *done_arg = c->arg;
        free(c);
        promote_end(d, slot, err, done, done_arg);
        return;
    }
    const struct idx_entry *e = idx_at(d->idx, c->slot);
    nvs_check(d, &c->job, th_ptr(d->host, c->slot), e->size, e->csum, verified, c);
}

/* Start reading a chunk that is only on NVMe into DRAM. 1 if a read is
 * (or already was) under way, 0 if it cannot start. */
int nvs_promote(struct nvs_ctx *d, uint32_t slot, tier_done_fn done, void *arg)
{
    struct nvs *s = nvs_of(d);
    struct idx_entry *e = idx_at(d->idx, slot);
    struct idx_nv *v = idx_nv_at(d->idx, slot);
    if (v->flags & IDX_F_READING) return done ? 0 : 1; /* one done per read */
    if (e->state != IDX_READY || e->tier != IDX_NVME) return 0;
    uint32_t blk;
    if (d->host->alloc_dram(d->host->core, e->ns, nvme_rec_len(e->size) - NVME_HDR,
                            &blk) != KVT_OK) return 0;
    e->blk = blk;
    idx_pin(d->idx, slot);
    idx_set_flags(d->idx, slot, IDX_F_READING, 0);
    struct rctx *c = malloc(sizeof *c);
    if (!c) abort(); /* control-plane allocation */
    c->d = d;
    c->slot = slot;
    c->done = done;
    c->arg = arg;
    s->reads++;
    struct tier_loc loc = nvs_loc_of(d, slot);
    if (nvme_read_data(s->tier, &loc, th_ptr(d->host, slot), e->size, read_done, c) != KVT_OK)
        read_done(c, KVT_EIO);
    return 1;
}
