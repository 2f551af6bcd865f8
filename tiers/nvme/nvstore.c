/*
 * nvstore.c -- the NVMe policy's life cycle: open the tier and its index,
 * load the index before the daemon reports ready (or rebuild it from the
 * record headers), the core loop's hooks, shutdown, stats. See nvstore.h.
 *
 * Loading: every index record is checked against the files that exist,
 * sorted by location and re-reserved in ascending order (TLSF adopts in
 * O(1) that way), so each file's allocator comes back exactly as the
 * index describes it and everything else is free: a record written but
 * never indexed (a crash between the two) is reclaimed that way. Two
 * records that overlap (a stale entry whose space was reused before its
 * delete reached the index) keep the newer one. Entries are then
 * committed oldest access first, so the NVMe eviction order survives the
 * restart.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <time.h>
#include <unistd.h>

#include "log.h"
#include "nvstore_int.h"
#include "uring.h"

/* A record being loaded. */
struct lrec {
    kvt_key key, parent;
    uint64_t off;  /* tier_loc.off */
    uint64_t csum, seq, atime;
    uint32_t size, len, slot;
    uint16_t ns;
    uint8_t has_parent, drop, attached;
};

struct loader {
    struct nvs_ctx *d;
    struct lrec *v;
    size_t n, cap;
    uint64_t dropped;
    int from_scan;
};

const struct nvs_stats *nvs_stats(const struct nvs_ctx *d)
{
    return d->nvs ? &d->nvs->st : NULL;
}

struct tier *nvs_tier(const struct nvs_ctx *d)
{
    return d->nvs ? &d->nvs->obj : NULL;
}

uint64_t nvs_index_errors(const struct nvs_ctx *d)
{
    return d->nvs ? nvx_errors(d->nvs->index) : 0;
}

void nvs_count_lost_dirty(struct nvs_ctx *d)
{
    if (d->nvs) d->nvs->st.lost_dirty++;
}

/* ------------------------------------------------- the tier behind tier.h */

static int op_get(struct tier *t, struct tier_walk *w)
{
    if (!w->n) return TIER_NOW;
    return nvs_get(nvs_ctx_of(t), w->pipe, w->req_id, w->ns, w->get->inline_,
                   (uint32_t)w->get->n_keys, w->slots, &w->n);
}

static kvt_err op_read(struct tier *t, uint32_t slot, tier_done_fn done, void *arg)
{
    return nvs_promote(nvs_ctx_of(t), slot, done, arg) ? KVT_OK : KVT_EBUSY;
}

static kvt_err op_write(struct tier *t, uint32_t slot, tier_done_fn done, void *arg)
{
    return nvs_demote(nvs_ctx_of(t), slot, done, arg);
}

static void op_committed(struct tier *t, uint32_t slot)
{
    nvs_committed(nvs_ctx_of(t), slot);
}

static void op_release(struct tier *t, uint32_t slot)
{
    nvs_release(nvs_ctx_of(t), slot);
}

static uint64_t op_demoting(const struct tier *t)
{
    return nvs_demoting_bytes(((const struct nvs *)t)->d);
}

static void op_lost(struct tier *t, uint32_t slot)
{
    (void)slot;
    nvs_count_lost_dirty(nvs_ctx_of(t));
}

static void op_usage(struct tier *t, struct tier_usage *u)
{
    struct tier *files = &((struct nvs *)t)->tier->tier;
    files->ops->usage(files, u);
}

static const struct tier_ops nvs_ops = {
    .name = "nvme",
    .id = KVT_TIER_NVME,
    .usage = op_usage,
    .get = op_get,
    .read = op_read,
    .write = op_write,
    .committed = op_committed,
    .release = op_release,
    .demoting = op_demoting,
    .lost = op_lost,
};

static unsigned count_dirs(const char *list)
{
    unsigned n = 1;
    for (const char *p = list; *p; p++) n += *p == ',';
    return n;
}

uint64_t nvs_index_slots(const struct nvs_conf *c)
{
    if (!c->nvme_bytes) return 0;
    uint64_t n = c->nvme_bytes / (2 * NVME_BLOCK) * count_dirs(c->nvme_dirs);
    return n > (1ull << 31) ? 1ull << 31 : n;
}

/* Split "a, b,c" into at most NVME_MAX_DIRS trimmed paths in buf. */
static unsigned split_dirs(const char *list, char buf[][NVS_STR_MAX],
                           const char **out)
{
    unsigned n = 0;
    for (const char *p = list; *p && n < NVME_MAX_DIRS;) {
        size_t len = strcspn(p, ",");
        const char *a = p, *b = p + len;
        while (a < b && *a == ' ') a++;
        while (b > a && b[-1] == ' ') b--;
        if (b > a) {
            snprintf(buf[n], NVS_STR_MAX, "%.*s", (int)(b - a), a);
            out[n] = buf[n];
            n++;
        }
        p += len + (p[len] == ',');
    }
    return n;
}

/* ----------------------------------------------------------------- load */

static struct lrec *lrec_add(struct loader *L)
{
    if (L->n == L->cap) {
        size_t ncap = L->cap ? L->cap * 2 : 4096;
        struct lrec *nv = realloc(L->v, ncap * sizeof *nv);
        if (!nv) abort(); /* start-up allocation */
        L->v = nv;
        L->cap = ncap;
    }
    struct lrec *r = &L->v[L->n++];
    memset(r, 0, sizeof *r);
    r->slot = IDX_NONE;
    return r;
}

static void on_index_rec(void *arg, const struct nvx_rec *x)
{
    struct loader *L = arg;
    struct nvs_ctx *d = L->d;
    struct tier_loc loc;
    uint16_t ns = d->host->ns_intern(d->host->core, x->ns);
    if (ns == NS_NONE || x->len != nvme_rec_len(x->size) ||
        nvme_loc_make(d->nvs->tier, x->dir, x->num, x->off, x->len, &loc) != KVT_OK) {
        nvx_del(d->nvs->index, x->ns, &x->key); /* names no record we have */
        L->dropped++;
        return;
    }
    struct lrec *r = lrec_add(L);
    *r = (struct lrec){x->key, x->parent, loc.off, x->csum, x->seq, x->atime,
                       x->size, x->len, IDX_NONE, ns, (uint8_t)x->has_parent, 0, 0};
}

static void on_scan_rec(void *arg, unsigned file, uint64_t off,
                        const struct nvme_meta *m)
{
    struct loader *L = arg;
    uint16_t ns = L->d->host->ns_intern(L->d->host->core, m->ns);
    if (ns == NS_NONE) {
        L->dropped++;
        return;
    }
    struct lrec *r = lrec_add(L);
    *r = (struct lrec){m->key, m->parent, (uint64_t)file << NVME_FILE_SHIFT | off,
                       m->csum, m->seq, (uint64_t)time(NULL), m->size,
                       (uint32_t)nvme_rec_len(m->size), IDX_NONE, ns,
                       (uint8_t)m->has_parent, 0, 0};
}

static int cmp_off(const void *a, const void *b)
{
    const struct lrec *x = *(const struct lrec *const *)a, *y = *(const struct lrec *const *)b;
    return (x->off > y->off) - (x->off < y->off);
}

static int cmp_atime(const void *a, const void *b)
{
    const struct lrec *x = *(const struct lrec *const *)a, *y = *(const struct lrec *const *)b;
    if (x->atime != y->atime) return (x->atime > y->atime) - (x->atime < y->atime);
    return (x->seq > y->seq) - (x->seq < y->seq);
}

static void unreserve(struct nvs_ctx *d, struct lrec *r, struct tier_loc *locs,
                      struct lrec *base)
{
    struct tier *t = &d->nvs->tier->tier;
    t->ops->free(t, &locs[r - base]);
    r->drop = 1;
}

/* Re-reserve every record's space in ascending order; of two that
 * overlap the newer stays. */
static void reserve_all(struct loader *L, struct lrec **by_off, struct tier_loc *locs)
{
    struct tier *t = &L->d->nvs->tier->tier;
    struct lrec *last = NULL;
    for (size_t i = 0; i < L->n; i++) {
        struct lrec *r = by_off[i];
        struct tier_loc *l = &locs[r - L->v];
        if (t->ops->alloc_at(t, r->off, r->len, l) == KVT_OK) {
            last = r;
            continue;
        }
        if (last && !last->drop && last->seq < r->seq) {
            unreserve(L->d, last, locs, L->v);
            if (t->ops->alloc_at(t, r->off, r->len, l) == KVT_OK) {
                last = r;
                continue;
            }
        }
        r->drop = 1;
    }
}

static void set_nv(struct nvs_ctx *d, uint32_t slot, const struct tier_loc *l)
{
    struct idx_nv *v = idx_nv_at(d->idx, slot);
    v->h = l->h;
    v->file = (uint16_t)nvme_loc_file(l);
    v->blk = (uint32_t)(nvme_loc_off(l) / NVME_BLOCK);
}

/* Insert a reserved record as an NVMe-only PENDING entry, or give a chunk
 * adopted in DRAM (journal.c) its NVMe copy. */
static void insert_one(struct loader *L, struct lrec *r, const struct tier_loc *l)
{
    struct nvs_ctx *d = L->d;
    struct tier *t = &d->nvs->tier->tier;
    uint32_t have = idx_find(d->idx, r->ns, &r->key);
    if (have != IDX_NONE) {
        struct idx_entry *e = idx_at(d->idx, have);
        if (e->state == IDX_READY && e->tier == IDX_DRAM && e->size == r->size &&
            e->csum == r->csum) {
            set_nv(d, have, l);
            idx_set_tier(d->idx, have, IDX_DRAM | IDX_NVME);
            r->attached = 1;
            return;
        }
    }
    uint32_t slot = have == IDX_NONE ? idx_insert(d->idx, r->ns, &r->key) : IDX_NONE;
    if (slot == IDX_NONE) {
        t->ops->free(t, l);
        r->drop = 1;
        return;
    }
    struct idx_entry *e = idx_at(d->idx, slot);
    e->size = r->size;
    e->csum = r->csum;
    e->tier = IDX_NVME;
    set_nv(d, slot, l);
    r->slot = slot;
}

static void commit_one(struct nvs_ctx *d, const struct lrec *r)
{
    uint32_t p = r->has_parent ? idx_find(d->idx, r->ns, &r->parent) : IDX_NONE;
    idx_commit(d->idx, r->slot, p, 0);
    d->host->ns_loaded(d->host->core, r->ns, r->size);
}

static int cmp_key_seq(const void *a, const void *b)
{
    const struct lrec *x = *(const struct lrec *const *)a, *y = *(const struct lrec *const *)b;
    int c = memcmp(x->key.b, y->key.b, KVT_KEY_LEN);
    if (c == 0) c = (x->ns > y->ns) - (x->ns < y->ns);
    if (c == 0) c = (x->seq < y->seq) - (x->seq > y->seq); /* newest first */
    return c;
}

/* A scan may find old records of a chunk beside its newest one. */
static void drop_duplicates(struct loader *L, struct lrec **tmp)
{
    for (size_t i = 0; i < L->n; i++) tmp[i] = &L->v[i];
    qsort(tmp, L->n, sizeof *tmp, cmp_key_seq);
    for (size_t i = 1; i < L->n; i++)
        if (tmp[i]->ns == tmp[i - 1]->ns &&
            memcmp(tmp[i]->key.b, tmp[i - 1]->key.b, KVT_KEY_LEN) == 0)
            tmp[i]->drop = 1;
}

/* Put the loaded records into the index; returns how many stayed. */
static uint64_t build(struct loader *L)
{
    struct nvs_ctx *d = L->d;
    struct lrec **ord = malloc((L->n ? L->n : 1) * sizeof *ord);
    struct tier_loc *locs = malloc((L->n ? L->n : 1) * sizeof *locs);
    uint64_t kept = 0, maxseq = 0;
    if (!ord || !locs) abort(); /* start-up allocation */
    if (L->from_scan) drop_duplicates(L, ord);
    size_t m = 0;
    for (size_t i = 0; i < L->n; i++)
        if (!L->v[i].drop) ord[m++] = &L->v[i];
    qsort(ord, m, sizeof *ord, cmp_off);
    struct loader sub = *L;
    sub.n = m;
    reserve_all(&sub, ord, locs);
    for (size_t i = 0; i < m; i++)
        if (!ord[i]->drop) insert_one(L, ord[i], &locs[ord[i] - L->v]);
    qsort(ord, m, sizeof *ord, cmp_atime);
    for (size_t i = 0; i < m; i++) {
        struct lrec *r = ord[i];
        if (r->seq > maxseq) maxseq = r->seq;
        if (r->drop) continue;
        if (!r->attached) commit_one(d, r);
        kept++;
    }
    d->nvs->seq = maxseq + 1;
    free(ord);
    free(locs);
    return kept;
}

/* Delete the index entries of dropped records; index the scanned ones. */
static void write_back(struct loader *L)
{
    struct nvs_ctx *d = L->d;
    struct nvx_rec x;
    for (size_t i = 0; i < L->n; i++) {
        struct lrec *r = &L->v[i];
        if (r->drop) {
            if (!L->from_scan) nvx_del(d->nvs->index, d->host->ns_name(d->host->core, r->ns), &r->key);
            L->dropped++;
        } else if (L->from_scan) {
            uint32_t slot = r->attached ? idx_find(d->idx, r->ns, &r->key) : r->slot;
            nvs_fill_rec(d, slot, &x);
            nvx_put(d->nvs->index, &x, -1);
        }
    }
}

static int load_index(struct nvs_ctx *d, struct loader *L)
{
    char err[512];
    uint64_t bad = 0;
    if (nvx_load(d->nvs->index, on_index_rec, L, &bad, err, sizeof err) < 0) {
        log_error("nvme", "%s", err);
        return -1;
    }
    L->dropped += bad;
    return 0;
}

static int load_scan(struct nvs_ctx *d, struct loader *L)
{
    char err[512];
    L->from_scan = 1;
    if (nvx_wipe(d->nvs->index, err, sizeof err) != 0 ||
        nvme_scan(d->nvs->tier, on_scan_rec, L, err, sizeof err) < 0) {
        log_error("nvme", "%s", err);
        return -1;
    }
    return 0;
}

/* Open the index; a damaged one is moved aside (and rebuilt). */
static int open_index(struct nvs_ctx *d, int *complete)
{
    char err[640], moved[NVS_STR_MAX + 64];
    const char *path = d->cfg.nvme_index_path;
    if (nvx_open(path, (int)d->cfg.nvme_fsync, &d->nvs->index, complete, err,
                 sizeof err) == 0)
        return 0;
    if (nvx_move_aside(path, moved, sizeof moved) != 0) {
        log_error("nvme", "%s; cannot move it aside: %s", err, strerror(errno));
        return -1;
    }
    log_warn("nvme", "%s: damaged index moved to %s; rebuilding it from the "
             "record headers", err, moved);
    if (nvx_open(path, (int)d->cfg.nvme_fsync, &d->nvs->index, complete, err,
                 sizeof err) == 0)
        return 0;
    log_error("nvme", "%s", err);
    return -1;
}

static int load(struct nvs_ctx *d)
{
    struct nvs *s = d->nvs;
    struct loader L = {d, NULL, 0, 0, 0, 0};
    int complete, rv;
    if (open_index(d, &complete) != 0) return -1;
    if (complete) rv = load_index(d, &L);
    else if (s->tier->n_files) {
        log_warn("nvme", "index %s is missing or incomplete: rebuilding it from "
                 "the record headers of %u data file(s)", d->cfg.nvme_index_path,
                 s->tier->n_files);
        rv = load_scan(d, &L);
    } else rv = 0;
    if (rv == 0) {
        uint64_t kept = build(&L);
        write_back(&L);
        *(L.from_scan ? &s->st.rebuilt : &s->st.loaded) = kept;
        if (!complete) rv = nvx_mark_complete(s->index);
        log_info("nvme", "%s %llu chunks (%llu MiB on NVMe); %llu stale entries "
                 "dropped", L.from_scan ? "rebuilt" : "indexed",
                 (unsigned long long)kept, (unsigned long long)(nvme_used(s->tier) >> 20),
                 (unsigned long long)L.dropped);
    }
    free(L.v);
    return rv;
}

/* ------------------------------------------------------------- open/close */

static int open_fds(struct nvs *s)
{
    s->ep = epoll_create1(EPOLL_CLOEXEC);
    if (s->ep < 0) return -1;
    struct epoll_event ev = {.events = EPOLLIN, .data.fd = uring_fd(s->tier->ring)};
    return epoll_ctl(s->ep, EPOLL_CTL_ADD, ev.data.fd, &ev);
}

static int open_tier(struct nvs_ctx *d)
{
    static char buf[NVME_MAX_DIRS][NVS_STR_MAX];
    const char *dirs[NVME_MAX_DIRS];
    char err[640] = "";
    unsigned n = split_dirs(d->cfg.nvme_dirs, buf, dirs);
    struct nvme_opts o = {dirs, n, d->cfg.nvme_bytes, d->cfg.nvme_file_bytes,
                          (unsigned)d->cfg.nvme_queue_depth,
                          (int)d->cfg.nvme_register_buffers, d->dram->base,
                          d->dram->bytes};
    if (nvme_open(&o, &d->nvs->tier, err, sizeof err) == KVT_OK) return 0;
    log_error("nvme", "%s", err[0] ? err : "cannot open the NVMe tier");
    return -1;
}

int nvs_open(struct nvs_ctx *d)
{
    if (!d->cfg.nvme_bytes) return 0;
    struct nvs *s = calloc(1, sizeof *s);
    if (!s) abort(); /* start-up allocation */
    s->obj.ops = &nvs_ops;
    s->d = d;
    s->ep = -1;
    s->max_writes = (uint32_t)d->cfg.nvme_queue_depth;
    d->nvs = s;
    d->idx->nv_active = 1;
    if (open_tier(d) != 0 || load(d) != 0) return -1;
    if (nvs_worker_start(d) != 0 || open_fds(s) != 0) {
        log_error("nvme", "worker thread or epoll: %s", strerror(errno));
        return -1;
    }
    log_info("nvme", "tier up: %u dir(s) of %llu MiB, queue depth %llu, %s, "
             "registered buffers: %s", s->tier->n_dirs,
             (unsigned long long)(d->cfg.nvme_bytes >> 20),
             (unsigned long long)d->cfg.nvme_queue_depth,
             d->cfg.nvme_write_through ? "write-through" : "write-back",
             s->tier->regbuf_why[0] ? s->tier->regbuf_why : "yes");
    return 0;
}

int nvs_fd(const struct nvs_ctx *d)
{
    return d->nvs ? d->nvs->ep : -1;
}

void nvs_poll(struct nvs_ctx *d)
{
    struct nvs *s = d->nvs;
    uring_poll(s->tier->ring); /* checksum verdicts come through d->cq */
}

void nvs_tick(struct nvs_ctx *d)
{
    if (!d->nvs) return;
    nvs_pump(d);
    nvs_nv_watermark(d);
    nvs_scrub_tick(d);
}

void nvs_quiesce(struct nvs_ctx *d)
{
    struct nvs *s = d->nvs;
    if (!s) return;
    s->closing = 1;
    while (s->reads || s->writes || (s->scrub && s->scrub->inflight)) {
        uring_drain(s->tier->ring);
        wq_cq_poll(d->cq); /* checksum verdicts */
        if (s->reads || (s->scrub && s->scrub->inflight)) usleep(200);
    }
    nvs_park_quiesce(d);
}

void nvs_close(struct nvs_ctx *d)
{
    struct nvs *s = d->nvs;
    if (!s) return;
    nvs_quiesce(d);
    nvs_worker_stop(d);
    nvme_close(s->tier);
    nvx_close(s->index); /* writes out what is queued first */
    if (s->ep >= 0) close(s->ep);
    free(s->wq);
    free(s->scrub);
    free(s);
    d->nvs = NULL;
}

/* ---------------------------------------------------------------- stats */

static Kvtier__TierStats *tier_stats(struct nvs_ctx *d, struct req *r, kvt_tier t,
                                     const struct tier_usage *u, double hi,
                                     double lo)
{
    Kvtier__TierStats *ts = d->host->req_alloc(r, sizeof *ts);
    kvtier__tier_stats__init(ts);
    ts->tier = (Kvtier__Tier)t;
    ts->capacity = u->capacity;
    ts->used = u->used;
    ts->fragmentation = u->fragmentation;
    ts->high_watermark = (uint64_t)((double)u->capacity * hi);
    ts->low_watermark = (uint64_t)((double)u->capacity * lo);
    return ts;
}

static Kvtier__NvmeStats *nvme_stats(struct req *r, struct nvs_ctx *d)
{
    struct nvs *s = d->nvs;
    Kvtier__NvmeStats *n = d->host->req_alloc(r, sizeof *n);
    kvtier__nvme_stats__init(n);
    n->demotions = s->st.demotions;
    n->demoted_bytes = s->st.demoted_bytes;
    n->promotions = s->st.promotions;
    n->promoted_bytes = s->st.promoted_bytes;
    n->checksum_failures = s->st.csum_failures;
    n->read_errors = s->st.read_errors;
    n->write_errors = s->st.write_errors;
    n->enospc = s->st.enospc;
    n->lost_dirty = s->st.lost_dirty;
    n->get_waits = s->st.get_waits;
    n->get_timeouts = s->st.get_timeouts;
    n->loaded_chunks = s->st.loaded;
    n->rebuilt_chunks = s->st.rebuilt;
    n->index_errors = nvx_errors(s->index);
    n->scrubbed = s->st.scrubbed;
    n->scrub_bad = s->st.scrub_bad;
    n->queued = s->wq_n;
    n->inflight = s->reads + s->writes;
    n->write_through = d->cfg.nvme_write_through != 0;
    n->registered_buffers = s->tier->regbuf_why[0] == '\0';
    n->buffers_note = s->tier->regbuf_why;
    n->dirty_chunks = d->idx->n_ready - d->idx->n_in[1]; /* DRAM only */
    return n;
}

void nvs_fill_stats(struct req *r, struct nvs_ctx *d, Kvtier__StatsResp *s)
{
    struct tier_usage u;
    if (!d->nvs) return;
    d->nvs->tier->tier.ops->usage(&d->nvs->tier->tier, &u);
    s->tiers[1] = tier_stats(d, r, KVT_TIER_NVME, &u, d->cfg.nvme_high_watermark,
                             d->cfg.nvme_low_watermark);
    s->tiers[1]->chunks = d->idx->n_in[1];
    s->tiers[1]->chunk_bytes = d->idx->bytes_in[1];
    s->tiers[1]->evictions = d->nvs->st.evictions;
    s->nvme = nvme_stats(r, d);
}
