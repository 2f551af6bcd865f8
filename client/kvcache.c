/*
 * kvcache.c -- libkvtier's KV-cache calls: register, save, load, wait.
 *
 * Design: thin, like ops.c: check the arguments, build one request whose
 * arrays point at the caller's memory, unpack the answer. kvt_kv_wait is a
 * loop of KvWait requests, each asking the daemon to hold the answer for
 * at most half the client's request timeout (so a long wait never trips
 * it), and each asking only for the transfers not yet done. When the
 * daemon answers early without everything done (it parks only so many
 * waits), the loop backs off from 100 us to 2 ms before asking again.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "client_internal.h"
#include "kvt_cuda_api.h"
#include "layout.h"
#include "wire.h"

#define REQ(q, kind, field, val)                         \
    Kvtier__Request q = KVTIER__REQUEST__INIT;           \
    q.body_case = KVTIER__REQUEST__BODY_##kind;          \
    q.field = (val)

static kvt_err expect(Kvtier__Response *r, Kvtier__Response__BodyCase bc)
{
    if (r->body_case == bc) return KVT_OK;
    kvtier__response__free_unpacked(r, NULL);
    return KVT_EPROTO;
}

static long long mono_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

/* ---------------------------------------------------------- registration */

static void layout_of(const kvt_layout_params *p, Kvtier__KvLayout *l)
{
    kvtier__kv_layout__init(l);
    l->kind = (uint32_t)p->kind;
    l->num_layers = p->num_layers;
    l->num_blocks = p->num_blocks;
    l->block_size = p->block_size;
    l->num_kv_heads = p->num_kv_heads;
    l->head_size = p->head_size;
    l->elem_size = p->elem_size;
    l->num_kv = p->num_kv;
    l->block_stride = p->block_stride;
    l->token_stride = p->token_stride;
    l->head_stride = p->head_stride;
}

static kvt_err do_register(kvt_client *c, const char *ns,
                           const kvt_layout_params *p, size_t chunk_tokens,
                           Kvtier__KvMemory *m, kvt_kv_reg *reg,
                           kvt_kv_info *info)
{
    Kvtier__RegisterKvCache rk = KVTIER__REGISTER_KV_CACHE__INIT;
    Kvtier__KvLayout l;
    layout_of(p, &l);
    rk.ns = (char *)ns;
    rk.layout = &l;
    rk.memory = m;
    rk.chunk_tokens = (uint32_t)chunk_tokens;
    REQ(q, REGISTER_KV_CACHE, register_kv_cache, &rk);
    Kvtier__Response *r;
    kvt_err e = kvtc_call(c, &q, &r);
    if (e || (e = expect(r, KVTIER__RESPONSE__BODY_REGISTER_KV_CACHE))) return e;
    const Kvtier__RegisterKvCacheResp *rr = r->register_kv_cache;
    *reg = rr->reg;
    if (info) {
        info->chunk_bytes = rr->chunk_bytes;
        info->blocks_per_chunk = rr->blocks_per_chunk;
        snprintf(info->shape, sizeof info->shape, "%s", rr->shape);
    }
    kvtier__response__free_unpacked(r, NULL);
    return KVT_OK;
}

static int reg_args_ok(const kvt_client *c, const char *ns,
                       const kvt_layout_params *p, size_t chunk_tokens,
                       const kvt_kv_reg *reg)
{
    return c && wire_ns_ok(ns) && p && reg && p->n_bases > 0 &&
           p->n_bases <= KVT_LAYOUT_MAX_LAYERS * 2 && chunk_tokens > 0 &&
           chunk_tokens <= UINT32_MAX;
}

kvt_err kvt_kv_register_host(kvt_client *c, const char *ns,
                             const struct kvt_layout_params *p,
                             size_t chunk_tokens, const char *path,
                             const void *map_base, kvt_kv_reg *reg,
                             kvt_kv_info *info)
{
    uint64_t off[KVT_LAYOUT_MAX_LAYERS * 2];
    if (!reg_args_ok(c, ns, p, chunk_tokens, reg) || !path || !path[0] ||
        !map_base || !p->bases)
        return KVT_EINVAL;
    for (size_t i = 0; i < p->n_bases; i++) {
        if (p->bases[i] < (uint64_t)(uintptr_t)map_base) return KVT_EINVAL;
        off[i] = p->bases[i] - (uint64_t)(uintptr_t)map_base;
    }
    Kvtier__KvMemory m = KVTIER__KV_MEMORY__INIT;
    m.shm_path = (char *)path;
    m.offsets = off;
    m.n_offsets = p->n_bases;
    return do_register(c, ns, p, chunk_tokens, &m, reg, info);
}

kvt_err kvt_kv_register_cuda(kvt_client *c, const char *ns,
                             const struct kvt_layout_params *p,
                             size_t chunk_tokens, int device,
                             const void *ipc_handles, const uint64_t *offsets,
                             kvt_kv_reg *reg, kvt_kv_info *info)
{
    ProtobufCBinaryData h[KVT_LAYOUT_MAX_LAYERS * 2];
    if (!reg_args_ok(c, ns, p, chunk_tokens, reg) || !ipc_handles || !offsets)
        return KVT_EINVAL;
    for (size_t i = 0; i < p->n_bases; i++)
        h[i] = (ProtobufCBinaryData){KVT_CUDA_IPC_HANDLE_LEN,
                                     (uint8_t *)ipc_handles + i * KVT_CUDA_IPC_HANDLE_LEN};
    Kvtier__KvMemory m = KVTIER__KV_MEMORY__INIT;
    m.ipc_handles = h;
    m.n_ipc_handles = p->n_bases;
    m.offsets = (uint64_t *)offsets;
    m.n_offsets = p->n_bases;
    m.device = device;
    return do_register(c, ns, p, chunk_tokens, &m, reg, info);
}

kvt_err kvt_kv_unregister(kvt_client *c, kvt_kv_reg reg)
{
    if (!c) return KVT_EINVAL;
    Kvtier__UnregisterKvCache u = KVTIER__UNREGISTER_KV_CACHE__INIT;
    u.reg = reg;
    REQ(q, UNREGISTER_KV_CACHE, unregister_kv_cache, &u);
    Kvtier__Response *r;
    kvt_err e = kvtc_call(c, &q, &r);
    if (e) return e;
    kvtier__response__free_unpacked(r, NULL);
    return KVT_OK;
}

/* ------------------------------------------------------------ transfers */

static kvt_err transfer(kvt_client *c, int save, const char *ns, kvt_kv_reg reg,
                        const kvt_key *keys, size_t n_keys, const int32_t *ids,
                        size_t n_ids, const kvt_key *parent, kvt_xfer *xfer)
{
    if (!c || !wire_ns_ok(ns) || !keys || !n_keys || !ids || !n_ids || !xfer)
        return KVT_EINVAL;
    Kvtier__KvTransfer t = KVTIER__KV_TRANSFER__INIT;
    ProtobufCBinaryData *kb = malloc(n_keys * sizeof *kb);
    if (!kb) return KVT_ENOMEM;
    for (size_t i = 0; i < n_keys; i++)
        kb[i] = (ProtobufCBinaryData){KVT_KEY_LEN, (uint8_t *)keys[i].b};
    t.ns = (char *)ns;
    t.reg = reg;
    t.keys = kb;
    t.n_keys = n_keys;
    t.block_ids = (int32_t *)ids;
    t.n_block_ids = n_ids;
    if (parent) t.parent = (ProtobufCBinaryData){KVT_KEY_LEN, (uint8_t *)parent->b};
    REQ(q, KV_SAVE, kv_save, &t);
    if (!save) {
        q.body_case = KVTIER__REQUEST__BODY_KV_LOAD;
        q.kv_load = &t;
    }
    Kvtier__Response *r;
    kvt_err e = kvtc_call(c, &q, &r);
    free(kb);
    if (e || (e = expect(r, KVTIER__RESPONSE__BODY_KV_TRANSFER))) return e;
    *xfer = r->kv_transfer->xfer;
    kvtier__response__free_unpacked(r, NULL);
    return KVT_OK;
}

kvt_err kvt_kv_save(kvt_client *c, const char *ns, kvt_kv_reg reg,
                    const kvt_key *keys, size_t n_keys,
                    const int32_t *block_ids, size_t n_block_ids,
                    const kvt_key *parent, kvt_xfer *xfer)
{
    return transfer(c, 1, ns, reg, keys, n_keys, block_ids, n_block_ids, parent,
                    xfer);
}

kvt_err kvt_kv_load(kvt_client *c, const char *ns, kvt_kv_reg reg,
                    const kvt_key *keys, size_t n_keys,
                    const int32_t *block_ids, size_t n_block_ids,
                    kvt_xfer *xfer)
{
    return transfer(c, 0, ns, reg, keys, n_keys, block_ids, n_block_ids, NULL,
                    xfer);
}

/* ---------------------------------------------------------------- waits */

static void status_of(const Kvtier__KvStatus *s, kvt_xfer_status *st)
{
    st->xfer = s->xfer;
    st->done = s->done;
    st->err = s->done ? (kvt_err)s->err : KVT_OK;
    st->n_chunks = s->n_chunks;
    st->n_skipped = s->n_skipped;
    snprintf(st->msg, sizeof st->msg, "%s", s->msg ? s->msg : "");
}

/* One KvWait for ids[0..n), statuses into st (in the same order). */
static kvt_err wait_once(kvt_client *c, const kvt_xfer *ids, size_t n,
                         uint32_t ms, kvt_xfer_status *st)
{
    Kvtier__KvWait w = KVTIER__KV_WAIT__INIT;
    w.xfers = (uint64_t *)ids;
    w.n_xfers = n;
    w.timeout_ms = ms;
    REQ(q, KV_WAIT, kv_wait, &w);
    Kvtier__Response *r;
    kvt_err e = kvtc_call(c, &q, &r);
    if (e || (e = expect(r, KVTIER__RESPONSE__BODY_KV_WAIT))) return e;
    if (r->kv_wait->n_status != n) e = KVT_EPROTO;
    for (size_t i = 0; !e && i < n; i++) status_of(r->kv_wait->status[i], &st[i]);
    kvtier__response__free_unpacked(r, NULL);
    return e;
}

kvt_err kvt_kv_poll(kvt_client *c, const kvt_xfer *xfers, size_t n,
                    kvt_xfer_status *st)
{
    if (!c || !xfers || !n || !st) return KVT_EINVAL;
    return wait_once(c, xfers, n, 0, st);
}

/* Ask again for the ones not done; 1 once all are. */
struct waitset {
    kvt_xfer *ids;          /* still pending */
    size_t *at;             /* their index in the caller's arrays */
    kvt_xfer_status *tmp;
    size_t n;
};

static kvt_err wait_round(kvt_client *c, struct waitset *w, uint32_t ms,
                          kvt_xfer_status *st)
{
    kvt_err e = wait_once(c, w->ids, w->n, ms, w->tmp);
    if (e) return e;
    size_t left = 0;
    for (size_t i = 0; i < w->n; i++) {
        st[w->at[i]] = w->tmp[i];
        if (w->tmp[i].done) continue;
        w->ids[left] = w->ids[i];
        w->at[left++] = w->at[i];
    }
    w->n = left;
    return KVT_OK;
}

/* Slices of at most half the request timeout; a round answered in well
 * under its slice was not parked, so nap (100 us doubling to 2 ms). */
static kvt_err wait_loop(kvt_client *c, struct waitset *w, int timeout_ms,
                         kvt_xfer_status *st)
{
    long long deadline = timeout_ms < 0 ? -1 : mono_us() + timeout_ms * 1000LL;
    long long nap = 100, slice = kvtc_timeout_ms(c) / 2;
    if (slice < 1) slice = 1;
    for (;;) {
        long long t0 = mono_us(), left = deadline < 0 ? slice * 1000 : deadline - t0;
        long long ms = left <= 0 ? 0 : (left + 999) / 1000;
        if (ms > slice) ms = slice;
        kvt_err e = wait_round(c, w, (uint32_t)ms, st);
        if (e || w->n == 0) return e;
        long long now = mono_us();
        if (deadline >= 0 && now >= deadline) return KVT_ETIMEDOUT;
        if (now - t0 >= ms * 500) {
            nap = 100;
            continue;
        }
        struct timespec ts = {0, nap * 1000};
        nanosleep(&ts, NULL);
        if (nap < 2000) nap *= 2;
    }
}

kvt_err kvt_kv_wait(kvt_client *c, const kvt_xfer *xfers, size_t n,
                    int timeout_ms, kvt_xfer_status *st)
{
    if (!c || !xfers || !n || !st) return KVT_EINVAL;
    struct waitset w = {malloc(n * sizeof *w.ids), malloc(n * sizeof *w.at),
                        malloc(n * sizeof *w.tmp), n};
    kvt_err e = w.ids && w.at && w.tmp ? KVT_OK : KVT_ENOMEM;
    for (size_t i = 0; !e && i < n; i++) {
        w.ids[i] = xfers[i];
        w.at[i] = i;
    }
    if (!e) e = wait_loop(c, &w, timeout_ms, st);
    free(w.ids);
    free(w.at);
    free(w.tmp);
    return e;
}

/* ---------------------------------------------------------------- stats */

kvt_err kvt_kv_stats_get(kvt_client *c, kvt_kv_stats *out)
{
    if (!c || !out) return KVT_EINVAL;
    Kvtier__Stats st = KVTIER__STATS__INIT;
    REQ(q, STATS, stats, &st);
    Kvtier__Response *r;
    kvt_err e = kvtc_call(c, &q, &r);
    if (e || (e = expect(r, KVTIER__RESPONSE__BODY_STATS))) return e;
    const Kvtier__StatsResp *s = r->stats;
    memset(out, 0, sizeof *out);
    out->registrations = s->kv_registrations;
    out->transfers = s->kv_transfers;
    out->saved_chunks = s->kv_saved_chunks;
    out->loaded_chunks = s->kv_loaded_chunks;
    out->failed = s->kv_failed;
    out->hbm_bytes = s->hbm_bytes;
    out->hbm_used = s->hbm_used;
    out->hbm_loaded_chunks = s->kv_hbm_loaded_chunks;
    out->hbm_demoted = s->kv_hbm_demoted;
    snprintf(out->gpu, sizeof out->gpu, "%s", s->gpu ? s->gpu : "");
    kvtier__response__free_unpacked(r, NULL);
    return KVT_OK;
}
