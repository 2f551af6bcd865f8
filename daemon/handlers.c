/*
 * handlers.c -- one request in, one response out.
 *
 * Design: every handler validates its whole request before it changes
 * anything, so a bad request is an error response and no state moves
 * (DESIGN §7: bad input is an error value, never an assert). Responses are
 * built from arrays allocated in a per-request arena, freed in one go once
 * the response is packed. Handlers run on the core thread only.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <xxhash.h>

#include "peer/cluster.h"
#include "events.h"
#include "kvcache.h"
#include "kvtierd.h"
#include "kvwait.h"
#include "store.h"
#include "local.h"
#include "log.h"
#include "nvme/nvstore.h"
#include "park.h"
#include "pool.h"
#include "tenant.h"
#include "wire.h"

struct arena {
    void **p;
    size_t n, cap;
};

/* The arena frees m with the rest. */
static void *arena_keep(struct arena *a, void *m)
{
    if (a->n == a->cap) {
        size_t ncap = a->cap ? a->cap * 2 : 8;
        void **np = realloc(a->p, ncap * sizeof *np);
        if (!np) abort();
        a->p = np;
        a->cap = ncap;
    }
    return a->p[a->n++] = m;
}

static void *arena_alloc(struct arena *a, size_t size)
{
    void *m = calloc(1, size ? size : 1);
    if (!m) abort(); /* control-plane allocation */
    return arena_keep(a, m);
}

/* As arena_alloc for data-sized buffers: NULL when memory is short. */
static void *arena_try_alloc(struct arena *a, size_t size)
{
    void *m = malloc(size ? size : 1);
    return m ? arena_keep(a, m) : NULL;
}

static void arena_free(struct arena *a)
{
    for (size_t i = 0; i < a->n; i++) free(a->p[i]);
    free(a->p);
    free(a);
}

struct req {
    struct kvtierd *d;
    uint32_t pipe;
    Kvtier__Response *rsp;
    struct arena *a;
};

/* For handlers here and in other files (kvcache.c, nvpark.c, ...). */
void *req_alloc(struct req *r, size_t size)
{
    return arena_alloc(r->a, size);
}

kvt_err req_fail(struct req *r, kvt_err e, const char *fmt, ...)
{
    char *msg = arena_alloc(r->a, 256);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, 256, fmt, ap);
    va_end(ap);
    r->rsp->err = (int32_t)e;
    r->rsp->msg = msg;
    return e;
}

/* ---------------------------------------------------------------- pipes */

void pipe_added(struct kvtierd *d, uint32_t pipe)
{
    if (d->n_pipes == d->cap_pipes) {
        uint32_t ncap = d->cap_pipes ? d->cap_pipes * 2 : 64;
        uint32_t *np = realloc(d->pipes, ncap * sizeof *np);
        if (!np) abort();
        d->pipes = np;
        d->cap_pipes = ncap;
    }
    d->pipes[d->n_pipes++] = pipe;
    tenant_conn_added(d->tenants, pipe);
}

void pipe_removed(struct kvtierd *d, uint32_t pipe)
{
    for (uint32_t i = 0; i < d->n_pipes; i++)
        if (d->pipes[i] == pipe) {
            d->pipes[i] = d->pipes[--d->n_pipes];
            break;
        }
    park_pipe_gone(d->park, pipe); /* first: nothing may answer it from here on */
    lease_drop_pipe(&d->leases, pipe);
    kvc_pipe_removed(d->kvc, pipe);
    tenant_conn_removed(d->tenants, pipe);
}

int pipe_alive(const struct kvtierd *d, uint32_t pipe)
{
    for (uint32_t i = 0; i < d->n_pipes; i++)
        if (d->pipes[i] == pipe) return 1;
    return 0;
}

/* ------------------------------------------------------------ validation */

static kvt_err check_keys(struct req *r, size_t n, const ProtobufCBinaryData *k)
{
    if (n == 0) return req_fail(r, KVT_EINVAL, "no keys");
    if (n > r->d->cfg.max_keys)
        return req_fail(r, KVT_ETOOBIG, "%zu keys: more than max_keys (%llu)", n,
                    (unsigned long long)r->d->cfg.max_keys);
    for (size_t i = 0; i < n; i++)
        if (!wire_key_ok(&k[i]))
            return req_fail(r, KVT_EINVAL, "key %zu is %zu bytes, want %d", i,
                        k[i].len, KVT_KEY_LEN);
    return KVT_OK;
}

static kvt_err check_ns(struct req *r, const char *ns)
{
    if (!wire_ns_ok(ns))
        return req_fail(r, KVT_EINVAL, "bad namespace: want 1-%d printable bytes "
                    "without spaces", KVT_NS_MAX);
    return KVT_OK;
}

static const kvt_key *key_of(const ProtobufCBinaryData *b)
{
    return (const kvt_key *)b->data;
}

/* When a lease made now is due. */
static uint64_t lease_deadline(const struct kvtierd *d)
{
    return kvtierd_clock(d) + d->cfg.lease_timeout_ms;
}

void handle_lease_release(void *arg, uint8_t kind, uint32_t slot)
{
    struct kvtierd *d = arg;
    if (kind == LEASE_WRITE)
        store_free(d, slot);
    else if (idx_unpin(&d->idx, slot) == 0 && idx_at(&d->idx, slot)->state == IDX_DOOMED)
        store_free(d, slot);
}

/* A lease of the given kind owned by this request's pipe. */
static struct lease *own_lease(struct req *r, uint64_t id, uint8_t kind)
{
    struct lease *l;
    kvt_err e = lease_own(&r->d->leases, id, r->pipe, kind, &l);
    if (e == KVT_ENOENT)
        req_fail(r, KVT_ENOENT, "no %s lease %llu", kind == LEASE_READ ? "read" : "write",
             (unsigned long long)id);
    else if (e == KVT_EPERM)
        req_fail(r, KVT_EPERM, "lease %llu belongs to another client",
             (unsigned long long)id);
    return l;
}

/* ----------------------------------------------------------------- hello */

/* A memfd pool has no path to open: a fast-channel client that may map
 * it gets its fd with this answer, anyone else only copies. */
static void give_pool_fd(struct req *r, Kvtier__HelloResp *h)
{
    struct kvtierd *d = r->d;
    h->pool_path = "";
    h->pool_memfd = 1;
    if (!tenant_may_map(d->tenants, r->pipe, (unsigned)d->cfg.pool_mode,
                        (gid_t)d->pool_gid))
        return;
    if (local_attach_fd(d->local, d->dram->fd) != 0)
        log_warn("dram", "cannot pass the pool fd to client %u", r->pipe);
}

/* A tenant with a pool of its own: its clients are told of that pool
 * alone, never its path (the file is the daemon's, mode 0600), and one
 * on the fast channel is handed its fd; the default pool is not named. */
static void own_pool(struct req *r, Kvtier__HelloResp *h, int tn)
{
    struct kvtierd *d = r->d;
    const struct dram_seg *s = &d->dram->seg[d->tenant_pool[tn]];
    h->pool_path = "";
    h->pool_memfd = 1;
    h->pool_bytes = s->bytes;
    h->pool_offset = s->off;
    h->pool = d->tenant_pool[tn];
    if (!tenant_may_map_own(d->tenants, r->pipe, tn)) return;
    if (local_attach_fd(d->local, s->fd) != 0)
        log_warn("dram", "cannot pass tenant %s's pool fd to client %u",
                 d->cfg.tenants.v[tn].name, r->pipe);
}

static void do_hello(struct req *r, const Kvtier__Hello *q)
{
    struct kvtierd *d = r->d;
    if (q->proto_version != KVT_PROTO_VERSION) {
        req_fail(r, KVT_EPROTO, "protocol version %u not supported (daemon speaks %d)",
             q->proto_version, KVT_PROTO_VERSION);
        return;
    }
    Kvtier__HelloResp *h = arena_alloc(r->a, sizeof *h);
    kvtier__hello_resp__init(h);
    h->proto_version = KVT_PROTO_VERSION;
    h->daemon_version = KVT_VERSION;
    h->pool_path = d->dram->path;
    h->pool_bytes = d->dram->seg[0].bytes;
    h->client_id = r->pipe;
    h->max_keys = (uint32_t)d->cfg.max_keys;
    h->max_chunk_bytes = d->cfg.max_chunk_bytes;
    h->gpu = d->gpu;
    h->local_path = d->local_path;
    int tn = tenant_of(d->tenants, r->pipe);
    if (tn >= 0 && d->tenant_pool[tn]) own_pool(r, h, tn);
    else if (d->dram->memfd) give_pool_fd(r, h);
    r->rsp->body_case = KVTIER__RESPONSE__BODY_HELLO;
    r->rsp->hello = h;
}

/* ---------------------------------------------------------------- lookup */

static void do_lookup(struct req *r, const Kvtier__Lookup *q)
{
    struct kvtierd *d = r->d;
    if (check_ns(r, q->ns) || check_keys(r, q->n_keys, q->keys)) return;
    uint16_t ns = ns_find(&d->ns, q->ns);
    Kvtier__LookupResp *lr = arena_alloc(r->a, sizeof *lr);
    kvtier__lookup_resp__init(lr);
    lr->tiers = arena_alloc(r->a, q->n_keys * sizeof *lr->tiers);
    lr->n_tiers = q->n_keys;
    r->rsp->body_case = KVTIER__RESPONSE__BODY_LOOKUP;
    r->rsp->lookup = lr;
    store_lookup_walk(d, r->pipe, r->rsp->id, ns, q, lr); /* may park the request */
}

/* ------------------------------------------------------------------- put */

static kvt_err check_put(struct req *r, const char *ns, size_t n_keys,
                         const ProtobufCBinaryData *keys, size_t n_sizes,
                         const uint64_t *sizes, const ProtobufCBinaryData *parent)
{
    struct kvtierd *d = r->d;
    if (check_ns(r, ns) || check_keys(r, n_keys, keys)) return KVT_EINVAL;
    if (n_sizes != n_keys)
        return req_fail(r, KVT_EINVAL, "%zu sizes for %zu keys", n_sizes, n_keys);
    if (parent->len != 0 && !wire_key_ok(parent))
        return req_fail(r, KVT_EINVAL, "parent key is %zu bytes", parent->len);
    for (size_t i = 0; i < n_sizes; i++) {
        if (sizes[i] == 0) return req_fail(r, KVT_EINVAL, "chunk %zu is empty", i);
        if (sizes[i] > d->cfg.max_chunk_bytes)
            return req_fail(r, KVT_ETOOBIG, "chunk %zu: %llu bytes is over "
                        "max_chunk_bytes (%llu)", i, (unsigned long long)sizes[i],
                        (unsigned long long)d->cfg.max_chunk_bytes);
    }
    char why[128];
    kvt_err ne = ns_admit(&d->ns, ns, r->pipe, d->cfg.ns_per_client, why, sizeof why);
    if (ne != KVT_OK) return req_fail(r, ne, "%s", why);
    if (!pipe_alive(d, r->pipe))
        return req_fail(r, KVT_ECLOSED, "client connection is gone");
    return KVT_OK;
}

/* Reserve space for every new key; on failure undo all and fail. */
static kvt_err reserve_all(struct req *r, struct lease *l, uint16_t ns,
                           const ProtobufCBinaryData *keys, const uint64_t *sizes,
                           const ProtobufCBinaryData *parent)
{
    struct kvtierd *d = r->d;
    for (uint32_t i = 0; i < l->n; i++) {
        const kvt_key *k = key_of(&keys[i]);
        uint32_t have = idx_find(&d->idx, ns, k);
        uint32_t p = i ? idx_find(&d->idx, ns, key_of(&keys[i - 1]))
                       : (parent->len ? idx_find(&d->idx, ns, key_of(parent)) : IDX_NONE);
        l->parent[i] = p;
        l->pgen[i] = p == IDX_NONE ? 0 : idx_at(&d->idx, p)->gen;
        if (have != IDX_NONE && idx_at(&d->idx, have)->state != IDX_DOOMED) {
            l->slot[i] = IDX_NONE;
            continue;
        }
        kvt_err e = store_reserve(d, ns, k, sizes[i], &l->slot[i]);
        if (e != KVT_OK) {
            l->n = i; /* lease_drop frees what was reserved so far */
            return req_fail(r, e, "cannot reserve %llu bytes for chunk %u: %s",
                        (unsigned long long)sizes[i], i, kvt_strerror(e));
        }
    }
    return KVT_OK;
}

static void do_put_begin(struct req *r, const Kvtier__PutBegin *q)
{
    struct kvtierd *d = r->d;
    if (check_put(r, q->ns, q->n_keys, q->keys, q->n_sizes, q->sizes, &q->parent))
        return;
    uint16_t ns = ns_claim(&d->ns, q->ns, r->pipe);
    struct lease *l = lease_new(&d->leases, r->pipe, LEASE_WRITE, (uint32_t)q->n_keys,
                                 lease_deadline(d));
    if (reserve_all(r, l, ns, q->keys, q->sizes, &q->parent) != KVT_OK) {
        lease_drop(&d->leases, l);
        return;
    }
    Kvtier__PutBeginResp *pr = arena_alloc(r->a, sizeof *pr);
    kvtier__put_begin_resp__init(pr);
    pr->lease = l->id;
    pr->pool = pool_of_ns(d, q->ns);
    pr->n_slots = l->n;
    pr->slots = arena_alloc(r->a, l->n * sizeof *pr->slots);
    Kvtier__Slot *sl = arena_alloc(r->a, l->n * sizeof *sl);
    for (uint32_t i = 0; i < l->n; i++) {
        kvtier__slot__init(&sl[i]);
        pr->slots[i] = &sl[i];
        sl[i].size = q->sizes[i];
        if (l->slot[i] == IDX_NONE) sl[i].exists = 1;
        else sl[i].offset = store_off(d, l->slot[i]);
    }
    r->rsp->body_case = KVTIER__RESPONSE__BODY_PUT_BEGIN;
    r->rsp->put_begin = pr;
}

/* Parent slot of chunk i of a write lease, if it still names that chunk. */
static uint32_t lease_parent(struct kvtierd *d, const struct lease *l, uint32_t i)
{
    uint32_t p = l->parent[i];
    if (p == IDX_NONE) return IDX_NONE;
    const struct idx_entry *e = idx_at(&d->idx, p);
    if (e->gen != l->pgen[i] || (e->state != IDX_READY && e->state != IDX_PENDING))
        return IDX_NONE;
    return p;
}

static void set_count(struct req *r, uint64_t n)
{
    Kvtier__CountResp *c = arena_alloc(r->a, sizeof *c);
    kvtier__count_resp__init(c);
    c->count = n;
    r->rsp->body_case = KVTIER__RESPONSE__BODY_COUNT;
    r->rsp->count = c;
}

static uint64_t commit_lease(struct kvtierd *d, struct lease *l,
                             const uint64_t *csums)
{
    uint64_t n = 0;
    for (uint32_t i = 0; i < l->n; i++) {
        if (l->slot[i] == IDX_NONE) continue;
        store_commit(d, l->slot[i], csums[i], lease_parent(d, l, i));
        n++;
    }
    lease_forget(&d->leases, l);
    store_watermark(d);
    return n;
}

static void do_put_commit(struct req *r, const Kvtier__PutCommit *q)
{
    struct lease *l = own_lease(r, q->lease, LEASE_WRITE);
    if (!l) return;
    if (q->n_checksums != l->n) {
        req_fail(r, KVT_EINVAL, "%zu checksums for a lease of %u chunks",
             q->n_checksums, l->n);
        return;
    }
    set_count(r, commit_lease(r->d, l, q->checksums));
}

/* PUT_ABORT and RELEASE: drop one of this client's leases of that kind. */
static void do_drop_lease(struct req *r, const Kvtier__LeaseReq *q, uint8_t kind)
{
    struct lease *l = own_lease(r, q->lease, kind);
    if (!l) return;
    uint64_t n = l->n;
    lease_drop(&r->d->leases, l);
    set_count(r, n);
}

/* Inline put: bytes in the message (remote clients, the CLI). */
static void do_put(struct req *r, const Kvtier__Put *q)
{
    struct kvtierd *d = r->d;
    uint64_t *sizes = arena_alloc(r->a, q->n_data * sizeof *sizes);
    for (size_t i = 0; i < q->n_data; i++) sizes[i] = q->data[i].len;
    if (check_put(r, q->ns, q->n_keys, q->keys, q->n_data, sizes, &q->parent))
        return;
    uint16_t ns = ns_claim(&d->ns, q->ns, r->pipe);
    struct lease *l = lease_new(&d->leases, r->pipe, LEASE_WRITE, (uint32_t)q->n_keys,
                                 lease_deadline(d));
    if (reserve_all(r, l, ns, q->keys, sizes, &q->parent) != KVT_OK) {
        lease_drop(&d->leases, l);
        return;
    }
    uint64_t *csums = arena_alloc(r->a, l->n * sizeof *csums);
    for (uint32_t i = 0; i < l->n; i++) {
        if (l->slot[i] == IDX_NONE) continue;
        csums[i] = kvt_copy_checksum(store_ptr(d, l->slot[i]), q->data[i].data,
                                     q->data[i].len);
    }
    Kvtier__PutResp *pr = arena_alloc(r->a, sizeof *pr);
    kvtier__put_resp__init(pr);
    pr->n_new = (uint32_t)commit_lease(d, l, csums);
    r->rsp->body_case = KVTIER__RESPONSE__BODY_PUT;
    r->rsp->put = pr;
}

/* ------------------------------------------------------------------- get */

static void fill_slot(struct req *r, Kvtier__Slot *s, uint32_t slot)
{
    const struct idx_entry *e = idx_at(&r->d->idx, slot);
    kvtier__slot__init(s);
    s->offset = store_off(r->d, slot);
    s->size = e->size;
    s->checksum = e->csum;
}

/* Envelope bytes an inline reply may need beside its data: ids, slots and
 * field tags, generously per chunk. */
#define INLINE_OVERHEAD(n) (256 + (uint64_t)(n) * 64)

/* Bytes inline: the leading chunks whose reply stays within max_msg_bytes
 * (the peer's receive limit, and what bounds one queued fast-channel
 * reply). -1 with the reply failed (KVT_ETOOBIG) when not even the first
 * fits; a shorter answer is a GET's usual prefix. The copies are pool
 * data sized by a client, so they fail softly (KVT_ENOMEM), never abort. */
static int get_inline(struct req *r, Kvtier__GetResp *g, const uint32_t *slots,
                      size_t n)
{
    struct kvtierd *d = r->d;
    uint64_t over = INLINE_OVERHEAD(n), used = 0;
    uint64_t budget = d->cfg.max_msg_bytes > over ? d->cfg.max_msg_bytes - over : 0;
    g->data = arena_alloc(r->a, n * sizeof *g->data);
    for (size_t i = 0; i < n; i++) {
        const struct idx_entry *e = idx_at(&d->idx, slots[i]);
        if (used + e->size > budget) break;
        uint8_t *buf = arena_try_alloc(r->a, e->size);
        if (!buf && i == 0) {
            req_fail(r, KVT_ENOMEM, "no memory for a %u-byte inline reply",
                     (unsigned)e->size);
            return -1;
        }
        if (!buf) break;
        memcpy(buf, store_ptr(d, slots[i]), e->size);
        g->data[i].data = buf;
        g->data[i].len = e->size;
        used += e->size;
        g->n_data = g->n_slots = i + 1;
    }
    d->st.bytes_out += used;
    if (n && !g->n_data) {
        req_fail(r, KVT_ETOOBIG, "chunk of %u bytes is over what an inline reply "
                 "may carry (daemon.max_msg_bytes %llu); use the pool",
                 (unsigned)idx_at(&d->idx, slots[0])->size,
                 (unsigned long long)d->cfg.max_msg_bytes);
        return -1;
    }
    return 0;
}

static void get_leased(struct req *r, Kvtier__GetResp *g, const uint32_t *slots,
                       size_t n)
{
    struct kvtierd *d = r->d;
    struct lease *l = lease_new(&d->leases, r->pipe, LEASE_READ, (uint32_t)n,
                                 lease_deadline(d));
    for (size_t i = 0; i < n; i++) {
        l->slot[i] = slots[i];
        idx_pin(&d->idx, slots[i]);
        d->st.bytes_out += idx_at(&d->idx, slots[i])->size;
    }
    g->lease = l->id;
    g->pool = store_pool(d, slots[0]); /* one namespace: one pool */
    g->n_slots = n;
}

static void get_answer(struct req *r, uint16_t ns, int inline_, size_t n_keys,
                       const uint32_t *slots, size_t n);

static void do_get(struct req *r, const Kvtier__Get *q)
{
    struct kvtierd *d = r->d;
    if (check_ns(r, q->ns) || check_keys(r, q->n_keys, q->keys)) return;
    if (!q->inline_ && !pipe_alive(d, r->pipe)) {
        req_fail(r, KVT_ECLOSED, "client connection is gone");
        return;
    }
    uint16_t ns = ns_find(&d->ns, q->ns);
    uint32_t *slots = arena_alloc(r->a, q->n_keys * sizeof *slots);
    size_t n = 0;
    /* Parked: the tier that parked it answers through handle_get_answer. */
    if (store_get_walk(d, r->pipe, r->rsp->id, ns, q, slots, &n)) return;
    get_answer(r, ns, q->inline_, q->n_keys, slots, n);
}

/* The GET response for the leading chunks slots[0..n), all in DRAM. */
static void get_answer(struct req *r, uint16_t ns, int inline_, size_t n_keys,
                       const uint32_t *slots, size_t n)
{
    struct kvtierd *d = r->d;
    Kvtier__GetResp *g = arena_alloc(r->a, sizeof *g);
    kvtier__get_resp__init(g);
    if (n && inline_ && get_inline(r, g, slots, n) != 0) return;
    if (n && !inline_) get_leased(r, g, slots, n);
    g->slots = arena_alloc(r->a, g->n_slots * sizeof *g->slots);
    Kvtier__Slot *sl = arena_alloc(r->a, g->n_slots * sizeof *sl);
    uint64_t hit_bytes = 0;
    for (size_t i = 0; i < g->n_slots; i++) {
        fill_slot(r, &sl[i], slots[i]);
        g->slots[i] = &sl[i];
        hit_bytes += sl[i].size;
    }
    metrics_hits(&d->ns, &d->met, ns, HIT_GET, g->n_slots, n_keys - g->n_slots, hit_bytes);
    d->st.hits += g->n_slots;
    d->st.misses += n_keys - g->n_slots;
    if (ns != NS_NONE) {
        d->ns.v[ns].hits += g->n_slots;
        d->ns.v[ns].misses += n_keys - g->n_slots;
    }
    r->rsp->body_case = KVTIER__RESPONSE__BODY_GET;
    r->rsp->get = g;
}

void handle_get_answer(struct kvtierd *d, uint32_t pipe, uint64_t req_id,
                       uint16_t ns, int inline_, uint32_t n_keys,
                       const uint32_t *slots, size_t n, Kvtier__Response *rsp,
                       void **scratch)
{
    struct arena *a = calloc(1, sizeof *a);
    if (!a) abort();
    struct req r = {d, pipe, rsp, a};
    *scratch = a;
    kvtier__response__init(rsp);
    rsp->id = req_id;
    get_answer(&r, ns, inline_, n_keys, slots, n);
}

/* ---------------------------------------------------- delete, clear, evict */

static void do_delete(struct req *r, const Kvtier__Delete *q)
{
    struct kvtierd *d = r->d;
    if (check_ns(r, q->ns) || check_keys(r, q->n_keys, q->keys)) return;
    uint16_t ns = ns_find(&d->ns, q->ns);
    uint64_t n = 0;
    for (size_t i = 0; i < q->n_keys; i++) {
        uint32_t s = store_find(d, ns, &q->keys[i]);
        if (s == IDX_NONE) continue;
        store_delete(d, s);
        n++;
    }
    set_count(r, n);
}

static void do_clear(struct req *r, const Kvtier__Clear *q)
{
    struct kvtierd *d = r->d;
    if (check_ns(r, q->ns)) return;
    uint16_t ns = ns_find(&d->ns, q->ns);
    uint64_t n = 0;
    ev_clear_begin(d->ev, ns); /* AllBlocksCleared if nothing else is cached */
    for (uint32_t s = 0; ns != NS_NONE && s < d->idx.used; s++) {
        const struct idx_entry *e = idx_at(&d->idx, s);
        if (e->ns != ns || e->state != IDX_READY) continue;
        store_delete(d, s);
        n++;
    }
    ev_clear_end(d->ev);
    set_count(r, n);
}

static void do_evict(struct req *r, const Kvtier__Evict *q)
{
    set_count(r, store_evict(r->d, q->bytes, UINT32_MAX));
}

/* ------------------------------------------------------------ stats, list */

static void fill_ns_stats(struct req *r, Kvtier__StatsResp *s)
{
    struct kvtierd *d = r->d;
    s->ns = arena_alloc(r->a, d->ns.n * sizeof *s->ns);
    Kvtier__NsStats *v = arena_alloc(r->a, d->ns.n * sizeof *v);
    for (uint32_t i = 0; i < d->ns.n; i++) {
        if (!tenant_ns_visible(d->tenants, r->pipe, d->ns.v[i].name)) continue;
        kvtier__ns_stats__init(&v[i]);
        v[i].ns = d->ns.v[i].name;
        v[i].chunks = d->ns.v[i].chunks;
        v[i].bytes = d->ns.v[i].bytes;
        v[i].hits = d->ns.v[i].hits;
        v[i].misses = d->ns.v[i].misses;
        s->ns[s->n_ns++] = &v[i];
    }
}

/* One row per local tier: DRAM here, NVMe from its tier. */
static void fill_tier_stats(struct req *r, Kvtier__StatsResp *s)
{
    struct kvtierd *d = r->d;
    struct tier_usage u;
    s->adopted_chunks = d->adopt.adopted;
    s->adopt_dropped = d->adopt.dropped;
    size_t n = d->nvme ? 2 : 1;
    s->tiers = arena_alloc(r->a, n * sizeof *s->tiers);
    s->n_tiers = n;
    d->dram->tier.ops->usage(&d->dram->tier, &u);
    Kvtier__TierStats *ts = arena_alloc(r->a, sizeof *ts);
    kvtier__tier_stats__init(ts);
    ts->tier = (Kvtier__Tier)KVT_TIER_DRAM;
    ts->capacity = u.capacity;
    ts->used = u.used;
    ts->fragmentation = u.fragmentation;
    ts->high_watermark = (uint64_t)((double)u.capacity * d->cfg.high_watermark);
    ts->low_watermark = (uint64_t)((double)u.capacity * d->cfg.low_watermark);
    ts->chunks = d->idx.n_in[0];
    ts->chunk_bytes = d->idx.bytes_in[0];
    ts->evictions = d->st.evictions;
    s->tiers[0] = ts;
    if (d->nvme) nvs_fill_stats(r, d->nvx, s);
}

static void do_stats(struct req *r)
{
    struct kvtierd *d = r->d;
    struct tier_usage u;
    d->dram->tier.ops->usage(&d->dram->tier, &u);
    Kvtier__StatsResp *s = arena_alloc(r->a, sizeof *s);
    kvtier__stats_resp__init(s);
    s->pool_bytes = u.capacity;
    s->used_bytes = u.used;
    s->chunks = d->idx.n_ready;
    s->leases = d->leases.count;
    s->clients = d->n_pipes;
    s->hits = d->st.hits;
    s->misses = d->st.misses;
    s->puts = d->st.puts;
    s->evictions = d->st.evictions;
    s->bytes_in = d->st.bytes_in;
    s->bytes_out = d->st.bytes_out;
    s->fragmentation = u.fragmentation;
    s->index_bytes = idx_mem_bytes(&d->idx) + u.meta_bytes;
    s->uptime_ms = kvtierd_clock(d);
    s->high_watermark = (uint64_t)((double)u.capacity * d->cfg.high_watermark);
    s->low_watermark = (uint64_t)((double)u.capacity * d->cfg.low_watermark);
    s->errors = d->st.errors;
    s->expired_leases = d->st.expired_leases;
    s->gpu = d->gpu;
    s->pid = (uint32_t)getpid();
    s->version = KVT_VERSION;
    fill_ns_stats(r, s);
    s->namespaces = s->n_ns; /* those this client may see (tenant.c) */
    kvc_fill_stats(d->kvc, s);
    fill_tier_stats(r, s);
    r->rsp->body_case = KVTIER__RESPONSE__BODY_STATS;
    r->rsp->stats = s;
}

static void fill_entry(struct req *r, Kvtier__Entry *en, uint32_t s, uint32_t now)
{
    const struct idx_entry *e = idx_at(&r->d->idx, s);
    kvtier__entry__init(en);
    en->ns = r->d->ns.v[e->ns].name;
    en->key.data = (uint8_t *)e->key.b;
    en->key.len = KVT_KEY_LEN;
    en->size = e->size;
    en->checksum = e->csum;
    en->tier = (Kvtier__Tier)idx_top_tier(e);
    en->pins = e->pins;
    en->age_ms = (uint64_t)(now - e->atime) * 1000;
}

static void do_list(struct req *r, const Kvtier__List *q)
{
    struct kvtierd *d = r->d;
    uint32_t limit = q->limit ? q->limit : 1000;
    if (limit > 10000) limit = 10000;
    uint16_t ns = NS_NONE;
    if (q->ns && q->ns[0] && (ns = ns_find(&d->ns, q->ns)) == NS_NONE) limit = 0;
    Kvtier__ListResp *lr = arena_alloc(r->a, sizeof *lr);
    kvtier__list_resp__init(lr);
    lr->entries = arena_alloc(r->a, limit * sizeof *lr->entries);
    Kvtier__Entry *ev = arena_alloc(r->a, limit * sizeof *ev);
    uint64_t s = q->cursor;
    uint32_t now = kvtierd_secs(d);
    for (; s < d->idx.used && lr->n_entries < limit; s++) {
        const struct idx_entry *e = idx_at(&d->idx, (uint32_t)s);
        if (e->state != IDX_READY || (ns != NS_NONE && e->ns != ns)) continue;
        fill_entry(r, &ev[lr->n_entries], (uint32_t)s, now);
        lr->entries[lr->n_entries] = &ev[lr->n_entries];
        lr->n_entries++;
    }
    lr->next = s < d->idx.used && limit ? s : 0;
    r->rsp->body_case = KVTIER__RESPONSE__BODY_LIST;
    r->rsp->list = lr;
}

/* -------------------------------------------------------------- dispatch */

static void dispatch(struct req *r, const Kvtier__Request *q)
{
    switch (q->body_case) {
    case KVTIER__REQUEST__BODY_HELLO: do_hello(r, q->hello); break;
    case KVTIER__REQUEST__BODY_LOOKUP: do_lookup(r, q->lookup); break;
    case KVTIER__REQUEST__BODY_PUT_BEGIN: do_put_begin(r, q->put_begin); break;
    case KVTIER__REQUEST__BODY_PUT_COMMIT: do_put_commit(r, q->put_commit); break;
    case KVTIER__REQUEST__BODY_PUT_ABORT: do_drop_lease(r, q->put_abort, LEASE_WRITE); break;
    case KVTIER__REQUEST__BODY_PUT: do_put(r, q->put); break;
    case KVTIER__REQUEST__BODY_GET: do_get(r, q->get); break;
    case KVTIER__REQUEST__BODY_RELEASE: do_drop_lease(r, q->release, LEASE_READ); break;
    case KVTIER__REQUEST__BODY_DELETE: do_delete(r, q->delete_); break;
    case KVTIER__REQUEST__BODY_CLEAR: do_clear(r, q->clear); break;
    case KVTIER__REQUEST__BODY_STATS: do_stats(r); break;
    case KVTIER__REQUEST__BODY_LIST: do_list(r, q->list); break;
    case KVTIER__REQUEST__BODY_EVICT: do_evict(r, q->evict); break;
    case KVTIER__REQUEST__BODY_REGISTER_KV_CACHE:
        kvc_do_register(r, r->d->kvc, r->pipe, q->register_kv_cache, r->rsp); break;
    case KVTIER__REQUEST__BODY_UNREGISTER_KV_CACHE:
        kvc_do_unregister(r, r->d->kvc, r->pipe, q->unregister_kv_cache, r->rsp); break;
    case KVTIER__REQUEST__BODY_KV_SAVE:
        kvc_do_transfer(r, r->d->kvc, r->pipe, q->kv_save, KVC_SAVE, r->rsp); break;
    case KVTIER__REQUEST__BODY_KV_LOAD:
        kvc_do_transfer(r, r->d->kvc, r->pipe, q->kv_load, KVC_LOAD, r->rsp); break;
    case KVTIER__REQUEST__BODY_KV_WAIT:
        kvc_do_wait(r, r->d->kvc, r->pipe, q->kv_wait, r->rsp); break;
    case KVTIER__REQUEST__BODY_FLUSH:
        nvs_do_flush(r, r->d->nvx, r->pipe, q->flush, r->rsp); break;
    case KVTIER__REQUEST__BODY_VERIFY:
        nvs_do_verify(r, r->d->nvx, r->pipe, q->verify, r->rsp); break;
    case KVTIER__REQUEST__BODY_PEERS: cluster_do_peers(r, r->d->clx, r->rsp); break;
    default: req_fail(r, KVT_EINVAL, "unknown request kind"); break;
    }
}

/* While a SIGTERM drain runs (main.c), only what finishes work already
 * begun, and monitoring, is served; everything else gets KVT_ECLOSED. */
static int drain_allows(Kvtier__Request__BodyCase kind)
{
    return kind == KVTIER__REQUEST__BODY_PUT_COMMIT ||
           kind == KVTIER__REQUEST__BODY_PUT_ABORT ||
           kind == KVTIER__REQUEST__BODY_RELEASE ||
           kind == KVTIER__REQUEST__BODY_KV_WAIT ||
           kind == KVTIER__REQUEST__BODY_UNREGISTER_KV_CACHE ||
           kind == KVTIER__REQUEST__BODY_STATS;
}

/* Requests that may be parked (answered later, park.c). */
static int may_park(Kvtier__Request__BodyCase kind)
{
    return kind == KVTIER__REQUEST__BODY_GET || kind == KVTIER__REQUEST__BODY_LOOKUP ||
           kind == KVTIER__REQUEST__BODY_FLUSH || kind == KVTIER__REQUEST__BODY_VERIFY ||
           kind == KVTIER__REQUEST__BODY_KV_WAIT;
}

/* Before any handler: the client's tenant may make this request, and a
 * request that may wait finds this connection under its share of parks
 * (daemon.park_per_client), so one client cannot hold every park. */
static kvt_err admit(struct req *r, const Kvtier__Request *q)
{
    char why[256];
    kvt_err e = tenant_check(r->d->tenants, r->pipe, q, why, sizeof why);
    if (e != KVT_OK) return req_fail(r, e, "%s", why);
    uint32_t held = park_count_pipe(r->d->park, r->pipe);
    if (may_park(q->body_case) && held >= r->d->cfg.park_per_client)
        return req_fail(r, KVT_EBUSY, "this client already has %u requests "
                        "waiting (daemon.park_per_client); retry when they are "
                        "answered", held);
    return KVT_OK;
}

void handle_request(struct kvtierd *d, uint32_t pipe, const uint8_t *buf,
                    size_t len, Kvtier__Response *rsp, void **scratch)
{
    struct arena *a = calloc(1, sizeof *a);
    if (!a) abort();
    struct req r = {d, pipe, rsp, a};
    *scratch = a;
    kvtier__response__init(rsp);
    d->st.requests++;
    d->req_kind = 0;
    Kvtier__Request *q = kvtier__request__unpack(NULL, len, buf);
    if (!q) {
        req_fail(&r, KVT_EPROTO, "malformed request (%zu bytes)", len);
    } else {
        rsp->id = q->id;
        d->req_kind = (int)q->body_case;
        if (d->draining && !drain_allows(q->body_case))
            req_fail(&r, KVT_ECLOSED, "kvtierd is shutting down");
        else if (admit(&r, q) == KVT_OK)
            dispatch(&r, q);
        kvtier__request__free_unpacked(q, NULL);
    }
    if (rsp->err) {
        d->st.errors++;
        log_debug("req", "pipe %u: %s: %s", pipe, kvt_strerror((kvt_err)rsp->err),
                  rsp->msg);
    }
}

void handle_response_free(Kvtier__Response *rsp, void *scratch)
{
    (void)rsp;
    if (scratch) arena_free(scratch);
}
