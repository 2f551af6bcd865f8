/*
 * nvpark.c -- requests the NVMe tier answers later: a GET waiting for
 * chunks read back from NVMe, a FLUSH waiting for its writes, a VERIFY
 * scrubbing records. See nvstore.h for the policy.
 *
 * Design: a request is parked with park.c, which also keeps its deadline
 * and drops it when its client leaves (park_gone here). When park.c
 * cannot park (the nng contexts parked requests may hold are all held),
 * a GET is answered at once with what is in DRAM and its reads go on as
 * a prefetch. Every chunk of a parked GET settles once: pinned in DRAM
 * (the GET's own pin, so a later eviction cannot take it before the
 * answer), or a miss (gone, no DRAM space, read or checksum failed).
 * Each read's end re-examines the parked GETs; at its deadline a GET is
 * answered with what it has.
 *
 * VERIFY reads at most SCRUB_INFLIGHT records at a time and looks at no
 * more than SCRUB_SLICE index slots per step (STYLE §8), so client
 * traffic goes on while it runs; each record's header must name the chunk
 * and its data must match the checksum, else it is counted and dropped.
 */
#include <stdlib.h>
#include <string.h>

#include "handlers.h"
#include "log.h"
#include "nvstore_int.h"
#include "park.h"
#include "store.h"
#include "uring.h"
#include "wire.h"

#define SCRUB_INFLIGHT 4
#define SCRUB_SLICE 4096

enum { PS_WAIT = 0, PS_TRIED, PS_PINNED, PS_MISS };

/* ---------------------------------------------------------------- parks */

static void park_free(struct nvs_park *p)
{
    free(p->slot);
    free(p->gen);
    free(p->st);
    free(p);
}

static void unlink_park(struct kvtierd *d, struct nvs_park *p)
{
    struct nvs_park **l = &nvs_of(d)->parks;
    while (*l && *l != p) l = &(*l)->next;
    if (*l) *l = p->next;
}

static struct nvs_park *park_new(enum park_kind kind)
{
    struct nvs_park *p = calloc(1, sizeof *p);
    if (!p) abort(); /* control-plane allocation */
    p->kind = kind;
    return p;
}

static const struct park_ops nv_ops;

/* Park the request being handled as p; 0 if it cannot be parked now. */
static int park_it(struct kvtierd *d, struct nvs_park *p, uint32_t pipe, uint64_t req_id)
{
    p->park = park_defer(d, pipe, req_id, &nv_ops, p);
    if (!p->park) return 0;
    p->next = nvs_of(d)->parks;
    nvs_of(d)->parks = p;
    return 1;
}

/* Send rsp, unlink and free p (FLUSH / VERIFY keep their own state). */
static void answer_park(struct kvtierd *d, struct nvs_park *p, const Kvtier__Response *rsp)
{
    unlink_park(d, p);
    park_answer(d, p->park, rsp);
    park_free(p);
}

/* ----------------------------------------------------------------- GET */

/* Settle chunk i of a parked GET if it can be; 1 once settled. */
static int settle(struct kvtierd *d, struct nvs_park *p, uint32_t i)
{
    uint8_t *st = &p->st[i];
    if (*st == PS_PINNED || *st == PS_MISS) return 1;
    uint32_t slot = p->slot[i];
    const struct idx_entry *e = idx_at(&d->idx, slot);
    if (e->gen != p->gen[i] || e->state != IDX_READY) {
        *st = PS_MISS;
        return 1;
    }
    if (e->tier & IDX_DRAM) {
        idx_pin(&d->idx, slot);
        *st = PS_PINNED;
        return 1;
    }
    if (idx_nv_at(&d->idx, slot)->flags & (IDX_F_READING | IDX_F_SCRUB)) return 0;
    if (*st == PS_WAIT && !nvs_of(d)->closing && nvs_promote(d, slot)) {
        *st = PS_TRIED;
        return 0;
    }
    *st = PS_MISS; /* a read of ours ended without a DRAM copy, or none began */
    return 1;
}

static int settle_all(struct kvtierd *d, struct nvs_park *p)
{
    int all = 1;
    for (uint32_t i = 0; i < p->n; i++) all &= settle(d, p, i);
    return all;
}

/* Chunks pinned for the GET, from the first, without a gap. */
static size_t leading_pinned(const struct nvs_park *p)
{
    size_t n = 0;
    while (n < p->n && p->st[n] == PS_PINNED) n++;
    return n;
}

static void unpin_park(struct kvtierd *d, struct nvs_park *p)
{
    for (uint32_t i = 0; i < p->n; i++) {
        if (p->st[i] != PS_PINNED) continue;
        uint32_t slot = p->slot[i];
        p->st[i] = PS_MISS;
        if (idx_unpin(&d->idx, slot) == 0 && idx_at(&d->idx, slot)->state == IDX_DOOMED)
            store_free(d, slot);
    }
}

static void answer_get(struct kvtierd *d, struct nvs_park *p)
{
    Kvtier__Response rsp;
    void *scratch = NULL;
    handle_get_answer(d, park_pipe(p->park), park_req_id(p->park), p->ns, p->inline_,
                      p->n_keys, p->slot, leading_pinned(p), &rsp, &scratch);
    unpin_park(d, p);
    answer_park(d, p, &rsp);
    handle_response_free(&rsp, scratch);
}

int nvs_get(struct kvtierd *d, uint32_t pipe, uint64_t req_id, uint16_t ns,
            int inline_, uint32_t n_keys, const uint32_t *slots, size_t *n)
{
    size_t k = 0;
    while (k < *n && store_in_dram(d, slots[k])) k++;
    if (k == *n) return 0;
    struct nvs_park *p = park_new(PARK_GET);
    p->ns = ns;
    p->inline_ = inline_;
    p->n_keys = n_keys;
    p->n = (uint32_t)*n;
    if (!(p->slot = malloc(*n * sizeof *p->slot)) ||
        !(p->gen = malloc(*n * sizeof *p->gen)) || !(p->st = calloc(*n, 1)))
        abort(); /* control-plane allocation */
    for (size_t i = 0; i < *n; i++) {
        p->slot[i] = slots[i];
        p->gen[i] = idx_at(&d->idx, slots[i])->gen;
    }
    if (settle_all(d, p) || !park_it(d, p, pipe, req_id)) {
        *n = leading_pinned(p); /* answer now with what is in DRAM; reads go on */
        unpin_park(d, p);
        park_free(p);
        return 0;
    }
    uint64_t ms = d->cfg.nvme_get_deadline_ms;
    park_set_deadline(d, p->park, kvtierd_clock(d) + (ms ? ms : 1));
    nvs_of(d)->st.get_waits++;
    return 1;
}

void nvs_prefetch(struct kvtierd *d, const uint32_t *slots, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!store_in_dram(d, slots[i])) nvs_promote(d, slots[i]);
}

/* Answer every parked GET whose chunks have all settled. */
void nvs_park_notify(struct kvtierd *d)
{
    struct nvs *s = nvs_of(d);
    struct nvs_park *p = s->parks;
    while (p) {
        struct nvs_park *next = p->next;
        if (p->kind == PARK_GET && settle_all(d, p)) answer_get(d, p);
        p = next;
    }
}

/* --------------------------------------------------------------- FLUSH */

/* The result of a flush, for the immediate and the parked answer alike. */
static void flush_fields(Kvtier__FlushResp *fr, const struct nvs_flush *f)
{
    fr->written = f->written;
    fr->failed = f->failed;
    fr->bytes = f->bytes;
    fr->clean = f->clean;
}

static void flush_answer(struct kvtierd *d, struct nvs_park *p)
{
    struct nvs_flush *f = p->flush;
    Kvtier__FlushResp fr = KVTIER__FLUSH_RESP__INIT;
    Kvtier__Response rsp = KVTIER__RESPONSE__INIT;
    flush_fields(&fr, f);
    rsp.id = park_req_id(p->park);
    rsp.body_case = KVTIER__RESPONSE__BODY_FLUSH;
    rsp.flush = &fr;
    f->park = NULL;
    answer_park(d, p, &rsp);
}

void nvs_flush_progress(struct kvtierd *d, struct nvs_flush *f)
{
    if (--f->pending > 0) return;
    if (f->park) flush_answer(d, f->park);
    free(f);
}

static void fill_flush(Kvtier__Response *rsp, struct req *r, const struct nvs_flush *f)
{
    Kvtier__FlushResp *fr = req_alloc(r, sizeof *fr);
    kvtier__flush_resp__init(fr);
    flush_fields(fr, f);
    rsp->body_case = KVTIER__RESPONSE__BODY_FLUSH;
    rsp->flush = fr;
}

void nvs_do_flush(struct req *r, struct kvtierd *d, uint32_t pipe,
                  const Kvtier__Flush *q, Kvtier__Response *rsp)
{
    if (!d->nvs) {
        req_fail(r, KVT_ENOTSUP, "no NVMe tier (nvme.nvme_bytes = 0)");
        return;
    }
    struct nvs_flush *f = calloc(1, sizeof *f);
    if (!f) abort(); /* control-plane allocation */
    f->evict = q->evict;
    f->pending = 1; /* held until every chunk is queued */
    for (uint32_t s = 0; s < d->idx.used; s++) {
        const struct idx_entry *e = idx_at(&d->idx, s);
        if (e->state != IDX_READY || !(e->tier & IDX_DRAM)) continue;
        if (!(e->tier & IDX_NVME)) {
            if (nvs_enqueue_write(d, s, f) == 0) f->pending++;
            continue;
        }
        f->clean++;
        if (q->evict && e->pins == 0) store_drop_dram(d, s); /* already written */
    }
    nvs_pump(d); /* writes complete later, never inside this handler */
    struct nvs_park *p = f->pending > 1 ? park_new(PARK_FLUSH) : NULL;
    if (p) p->flush = f;
    if (p && park_it(d, p, pipe, rsp->id)) {
        f->park = p;
    } else {
        if (p) park_free(p);
        fill_flush(rsp, r, f); /* nothing to wait for, or cannot wait */
    }
    nvs_flush_progress(d, f);
}

/* -------------------------------------------------------------- VERIFY */

struct sctx {
    struct kvtierd *d;
    uint32_t slot;
    uint8_t *buf;
    struct nvs_job job;
};

static void scrub_next(struct kvtierd *d);

/* The result of a scrub, for the immediate and the parked answer alike. */
static void verify_fields(Kvtier__VerifyResp *vr, const struct nvs_scrub *sc)
{
    vr->checked = sc->checked;
    vr->bad = sc->bad;
    vr->bytes = sc->bytes;
    vr->read_errors = sc->read_errors;
}

static void fill_verify(struct req *r, Kvtier__Response *rsp,
                        const struct nvs_scrub *sc)
{
    Kvtier__VerifyResp *vr = req_alloc(r, sizeof *vr);
    kvtier__verify_resp__init(vr);
    verify_fields(vr, sc);
    rsp->body_case = KVTIER__RESPONSE__BODY_VERIFY;
    rsp->verify = vr;
}

static void verify_answer(struct kvtierd *d, struct nvs_scrub *sc)
{
    struct nvs_park *p = sc->park;
    Kvtier__VerifyResp vr = KVTIER__VERIFY_RESP__INIT;
    Kvtier__Response rsp = KVTIER__RESPONSE__INIT;
    verify_fields(&vr, sc);
    rsp.id = park_req_id(p->park);
    rsp.body_case = KVTIER__RESPONSE__BODY_VERIFY;
    rsp.verify = &vr;
    sc->park = NULL;
    answer_park(d, p, &rsp);
}

static void scrub_end(struct kvtierd *d, struct sctx *c, int bad)
{
    struct nvs *s = nvs_of(d);
    struct nvs_scrub *sc = s->scrub;
    struct idx_entry *e = idx_at(&d->idx, c->slot);
    idx_set_flags(&d->idx, c->slot, 0, IDX_F_SCRUB);
    if (bad && e->state == IDX_READY && (e->tier & IDX_NVME)) {
        sc->bad++;
        s->st.scrub_bad++;
        log_warn("nvme", "verify: record of chunk %02x%02x%02x%02x... of %s is "
                 "damaged: dropped", e->key.b[0], e->key.b[1], e->key.b[2],
                 e->key.b[3], d->ns.v[e->ns].name);
        nvs_drop_record(d, c->slot); /* pinned: freed at the unpin if gone */
    }
    uint32_t slot = c->slot;
    sc->inflight--;
    free(c->buf);
    free(c);
    if (idx_unpin(&d->idx, slot) == 0 && (e->state == IDX_DOOMED || e->tier == 0))
        store_free(d, slot);
    nvs_park_notify(d);
    scrub_next(d);
}

static void scrub_verified(struct kvtierd *d, struct nvs_job *j)
{
    struct sctx *c = j->ctx;
    struct nvs_scrub *sc = nvs_of(d)->scrub;
    sc->checked++;
    nvs_of(d)->st.scrubbed++;
    sc->bytes += j->c.n;
    scrub_end(d, c, !j->c.ok);
}

/* The header must name the chunk the index says lies there. */
static int header_matches(const struct kvtierd *d, uint32_t slot, const uint8_t *buf)
{
    const struct idx_entry *e = idx_at(&d->idx, slot);
    struct nvme_meta m;
    return nvme_header_decode(buf, &m) == 0 && m.size == e->size &&
           m.csum == e->csum && memcmp(m.key.b, e->key.b, KVT_KEY_LEN) == 0 &&
           strcmp(m.ns, d->ns.v[e->ns].name) == 0;
}

static void scrub_read(void *arg, kvt_err err)
{
    struct sctx *c = arg;
    struct kvtierd *d = c->d;
    struct nvs_scrub *sc = nvs_of(d)->scrub;
    if (err != KVT_OK) {
        sc->read_errors++;
        nvs_of(d)->st.read_errors++;
        scrub_end(d, c, 0);
        return;
    }
    const struct idx_entry *e = idx_at(&d->idx, c->slot);
    if (!header_matches(d, c->slot, c->buf)) {
        sc->checked++;
        nvs_of(d)->st.scrubbed++;
        scrub_end(d, c, 1);
        return;
    }
    nvs_check(d, &c->job, c->buf + NVME_HDR, e->size, e->csum, scrub_verified, c);
}

static int scrubbable(const struct kvtierd *d, uint32_t slot)
{
    const struct idx_entry *e = idx_at(&d->idx, slot);
    return e->state == IDX_READY && (e->tier & IDX_NVME) &&
           !(idx_nv_at(&d->idx, slot)->flags & (IDX_F_READING | IDX_F_SCRUB));
}

static void scrub_start(struct kvtierd *d, uint32_t slot)
{
    struct nvs *s = nvs_of(d);
    struct tier_loc loc = nvs_loc_of(d, slot);
    struct sctx *c = malloc(sizeof *c);
    if (!c || !(c->buf = aligned_alloc(NVME_BLOCK, loc.len))) abort();
    c->d = d;
    c->slot = slot;
    idx_pin(&d->idx, slot);
    idx_set_flags(&d->idx, slot, IDX_F_SCRUB, 0);
    s->scrub->inflight++;
    s->scrub->started++;
    if (nvme_read_record(s->tier, &loc, c->buf, scrub_read, c) != KVT_OK)
        scrub_read(c, KVT_EIO);
}

static int scrub_done(const struct kvtierd *d, const struct nvs_scrub *sc)
{
    return sc->cursor >= d->idx.used ||
           (sc->max_records && sc->started >= sc->max_records);
}

/* Start reads up to SCRUB_INFLIGHT, looking at SCRUB_SLICE slots at most;
 * answer and finish once every slot was looked at and nothing is left. */
static void scrub_next(struct kvtierd *d)
{
    struct nvs_scrub *sc = nvs_of(d)->scrub;
    if (!sc) return;
    int going = sc->park || sc->holding;
    for (uint32_t k = 0; k < SCRUB_SLICE && sc->inflight < SCRUB_INFLIGHT &&
                         !scrub_done(d, sc) && going; k++) {
        uint32_t slot = sc->cursor++;
        if (scrubbable(d, slot)) scrub_start(d, slot);
    }
    if (sc->holding || sc->inflight || (!scrub_done(d, sc) && going)) return;
    if (sc->park) verify_answer(d, sc);
    free(sc);
    nvs_of(d)->scrub = NULL;
}

void nvs_do_verify(struct req *r, struct kvtierd *d, uint32_t pipe,
                   const Kvtier__Verify *q, Kvtier__Response *rsp)
{
    struct nvs *s = nvs_of(d);
    if (!s) {
        req_fail(r, KVT_ENOTSUP, "no NVMe tier (nvme.nvme_bytes = 0)");
        return;
    }
    if (s->scrub) {
        req_fail(r, KVT_EBUSY, "a verify is already running");
        return;
    }
    struct nvs_scrub *sc = s->scrub = calloc(1, sizeof *s->scrub);
    if (!sc) abort(); /* control-plane allocation */
    sc->max_records = q->max_records;
    sc->holding = 1; /* nothing is answered inside this handler */
    scrub_next(d);
    sc->holding = 0;
    if (sc->inflight == 0 && scrub_done(d, sc)) {
        fill_verify(r, rsp, sc);
        free(sc);
        s->scrub = NULL;
        return;
    }
    struct nvs_park *p = park_new(PARK_VERIFY);
    if (!park_it(d, p, pipe, rsp->id)) { /* the reads in flight finish; nothing more starts */
        park_free(p);
        req_fail(r, KVT_EBUSY, "too many requests waiting; try again");
        return;
    }
    sc->park = p;
}

/* Every tick: a scrub that stopped at its slice bound goes on. */
void nvs_scrub_tick(struct kvtierd *d)
{
    scrub_next(d);
}

/* ------------------------------------------------------- clients going */

/* park.c: the client left (park.c frees the park itself). A FLUSH goes
 * on unanswered; a VERIFY stops starting reads. */
static void park_gone(struct kvtierd *d, void *owner)
{
    struct nvs_park *p = owner;
    unlink_park(d, p);
    if (p->kind == PARK_GET) unpin_park(d, p);
    if (p->kind == PARK_FLUSH) p->flush->park = NULL;
    if (p->kind == PARK_VERIFY) nvs_of(d)->scrub->park = NULL;
    park_free(p);
    if (nvs_of(d)->scrub) scrub_next(d);
}

/* Only GETs have a deadline. */
static void park_due(struct kvtierd *d, void *owner)
{
    struct nvs_park *p = owner;
    settle_all(d, p);
    nvs_of(d)->st.get_timeouts++;
    answer_get(d, p);
}

static const struct park_ops nv_ops = {park_gone, park_due};

/* Shutdown: answer whatever is parked with what it has now. */
void nvs_park_quiesce(struct kvtierd *d)
{
    struct nvs *s = nvs_of(d);
    while (s->parks) {
        struct nvs_park *p = s->parks;
        if (p->kind == PARK_GET) {
            settle_all(d, p);
            answer_get(d, p);
        } else if (p->kind == PARK_FLUSH) {
            flush_answer(d, p);
        } else {
            verify_answer(d, s->scrub);
        }
    }
}
