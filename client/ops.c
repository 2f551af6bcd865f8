/*
 * ops.c -- libkvtier's requests: lookup, put, get, delete, stats.
 *
 * Design: each call validates its arguments, builds one Request with key
 * arrays pointing at the caller's memory (nothing is copied before
 * packing), and turns the Response into the public structs. The copying
 * put goes through the pool when it is mapped (one copy, checksummed on the
 * way) and inline in the message otherwise.
 */
#include <stdlib.h>
#include <string.h>

#include "client_internal.h"
#include "wire.h"

#define REQ(q, kind, field, val)                         \
    Kvtier__Request q = KVTIER__REQUEST__INIT;           \
    q.body_case = KVTIER__REQUEST__BODY_##kind;          \
    q.field = (val)

/* Wrap caller keys as protobuf bytes; NULL on allocation failure. */
static ProtobufCBinaryData *wrap_keys(const kvt_key *keys, size_t n)
{
    ProtobufCBinaryData *b = malloc((n ? n : 1) * sizeof *b);
    if (!b) return NULL;
    for (size_t i = 0; i < n; i++) {
        b[i].data = (uint8_t *)keys[i].b;
        b[i].len = KVT_KEY_LEN;
    }
    return b;
}

static kvt_err check_args(const kvt_client *c, const char *ns,
                          const kvt_key *keys, size_t n)
{
    if (!c || !keys || n == 0 || !wire_ns_ok(ns)) return KVT_EINVAL;
    return KVT_OK;
}

static kvt_err expect(Kvtier__Response *r, Kvtier__Response__BodyCase bc)
{
    if (r->body_case == bc) return KVT_OK;
    kvtier__response__free_unpacked(r, NULL);
    return KVT_EPROTO;
}

kvt_err kvt_lookup(kvt_client *c, const char *ns, const kvt_key *keys,
                   size_t n, size_t *n_present, kvt_tier *tiers)
{
    kvt_err e = check_args(c, ns, keys, n);
    if (e || !n_present) return e ? e : KVT_EINVAL;
    Kvtier__Lookup lk = KVTIER__LOOKUP__INIT;
    lk.ns = (char *)ns;
    lk.n_keys = n;
    if (!(lk.keys = wrap_keys(keys, n))) return KVT_ENOMEM;
    REQ(q, LOOKUP, lookup, &lk);
    Kvtier__Response *r;
    e = kvtc_call(c, &q, &r);
    free(lk.keys);
    if (e || (e = expect(r, KVTIER__RESPONSE__BODY_LOOKUP))) return e;
    *n_present = r->lookup->n_present;
    for (size_t i = 0; tiers && i < n; i++)
        tiers[i] = i < r->lookup->n_tiers ? (kvt_tier)r->lookup->tiers[i] : KVT_TIER_NONE;
    kvtier__response__free_unpacked(r, NULL);
    return KVT_OK;
}

static kvt_err put_begin_rsp(kvt_client *c, Kvtier__Response *r, size_t n,
                             kvt_lease *lease, kvt_chunk *chunks)
{
    Kvtier__PutBeginResp *p = r->put_begin;
    kvt_err e = p->n_slots == n ? KVT_OK : KVT_EPROTO;
    if (!e && p->pool != kvtc_pool_id(c)) e = KVT_ENOTSUP; /* not our pool */
    for (size_t i = 0; e == KVT_OK && i < n; i++) {
        const Kvtier__Slot *s = p->slots[i];
        chunks[i] = (kvt_chunk){NULL, s->size, 0, s->exists};
        if (!s->exists && !(chunks[i].data = kvtc_pool_ptr(c, p->pool, s->offset, s->size)))
            e = KVT_EPROTO;
    }
    *lease = p->lease;
    return e;
}

kvt_err kvt_put_begin(kvt_client *c, const char *ns, const kvt_key *keys,
                      const size_t *sizes, size_t n, const kvt_key *parent,
                      kvt_lease *lease, kvt_chunk *chunks)
{
    kvt_err e = check_args(c, ns, keys, n);
    if (e || !sizes || !lease || !chunks) return e ? e : KVT_EINVAL;
    if (!kvt_zero_copy(c)) return KVT_ENOTSUP;
    Kvtier__PutBegin pb = KVTIER__PUT_BEGIN__INIT;
    uint64_t *sz = malloc(n * sizeof *sz);
    pb.ns = (char *)ns;
    pb.n_keys = pb.n_sizes = n;
    pb.keys = wrap_keys(keys, n);
    pb.sizes = sz;
    if (parent) pb.parent = (ProtobufCBinaryData){KVT_KEY_LEN, (uint8_t *)parent->b};
    if (!pb.keys || !sz) e = KVT_ENOMEM;
    for (size_t i = 0; !e && i < n; i++) sz[i] = sizes[i];
    Kvtier__Response *r = NULL;
    REQ(q, PUT_BEGIN, put_begin, &pb);
    if (!e) e = kvtc_call(c, &q, &r);
    free(pb.keys);
    free(sz);
    if (e || (e = expect(r, KVTIER__RESPONSE__BODY_PUT_BEGIN))) return e;
    e = put_begin_rsp(c, r, n, lease, chunks);
    kvtier__response__free_unpacked(r, NULL);
    if (e == KVT_EPROTO || e == KVT_ENOTSUP) kvt_put_abort(c, *lease);
    return e;
}

static kvt_err lease_call(kvt_client *c, Kvtier__Request *q)
{
    Kvtier__Response *r;
    kvt_err e = kvtc_call(c, q, &r);
    if (e) return e;
    kvtier__response__free_unpacked(r, NULL);
    return KVT_OK;
}

static kvt_err kvt_put_commit_n(kvt_client *c, kvt_lease lease, const uint64_t *csums,
                         size_t n)
{
    Kvtier__PutCommit pc = KVTIER__PUT_COMMIT__INIT;
    pc.lease = lease;
    pc.n_checksums = n;
    pc.checksums = (uint64_t *)csums;
    REQ(q, PUT_COMMIT, put_commit, &pc);
    return lease_call(c, &q);
}

kvt_err kvt_put_abort(kvt_client *c, kvt_lease lease)
{
    if (!c) return KVT_EINVAL;
    Kvtier__LeaseReq lr = KVTIER__LEASE_REQ__INIT;
    lr.lease = lease;
    REQ(q, PUT_ABORT, put_abort, &lr);
    return lease_call(c, &q);
}

kvt_err kvt_release(kvt_client *c, kvt_lease lease)
{
    if (!c) return KVT_EINVAL;
    if (lease == 0) return KVT_OK;
    Kvtier__LeaseReq lr = KVTIER__LEASE_REQ__INIT;
    lr.lease = lease;
    REQ(q, RELEASE, release, &lr);
    return lease_call(c, &q);
}

kvt_err kvt_put_commit(kvt_client *c, kvt_lease lease, const kvt_chunk *chunks,
                       size_t n, const uint64_t *checksums)
{
    if (!c || !chunks || n == 0) return KVT_EINVAL;
    if (checksums) return kvt_put_commit_n(c, lease, checksums, n);
    uint64_t *cs = calloc(n, sizeof *cs);
    if (!cs) return KVT_ENOMEM;
    for (size_t i = 0; i < n; i++)
        if (!chunks[i].exists && chunks[i].data)
            cs[i] = kvt_checksum(chunks[i].data, chunks[i].size);
    kvt_err e = kvt_put_commit_n(c, lease, cs, n);
    free(cs);
    return e;
}

static kvt_err put_inline(kvt_client *c, const char *ns, const kvt_key *keys,
                          const void *const *bufs, const size_t *sizes,
                          size_t n, const kvt_key *parent, size_t *n_new)
{
    Kvtier__Put p = KVTIER__PUT__INIT;
    ProtobufCBinaryData *data = malloc(n * sizeof *data);
    p.ns = (char *)ns;
    p.n_keys = p.n_data = n;
    p.keys = wrap_keys(keys, n);
    p.data = data;
    if (parent) p.parent = (ProtobufCBinaryData){KVT_KEY_LEN, (uint8_t *)parent->b};
    kvt_err e = p.keys && data ? KVT_OK : KVT_ENOMEM;
    for (size_t i = 0; !e && i < n; i++)
        data[i] = (ProtobufCBinaryData){sizes[i], (uint8_t *)bufs[i]};
    Kvtier__Response *r = NULL;
    REQ(q, PUT, put, &p);
    if (!e) e = kvtc_call(c, &q, &r);
    free(p.keys);
    free(data);
    if (e || (e = expect(r, KVTIER__RESPONSE__BODY_PUT))) return e;
    if (n_new) *n_new = r->put->n_new;
    kvtier__response__free_unpacked(r, NULL);
    return KVT_OK;
}

static kvt_err put_zero_copy(kvt_client *c, const char *ns, const kvt_key *keys,
                             const void *const *bufs, const size_t *sizes,
                             size_t n, const kvt_key *parent, size_t *n_new)
{
    kvt_chunk *ch = calloc(n, sizeof *ch);
    uint64_t *cs = calloc(n, sizeof *cs);
    kvt_lease lease;
    kvt_err e = ch && cs ? KVT_OK : KVT_ENOMEM;
    if (!e) e = kvt_put_begin(c, ns, keys, sizes, n, parent, &lease, ch);
    size_t fresh = 0;
    for (size_t i = 0; !e && i < n; i++) {
        if (ch[i].exists) continue;
        cs[i] = kvt_copy_checksum(ch[i].data, bufs[i], sizes[i]);
        fresh++;
    }
    if (!e) e = kvt_put_commit_n(c, lease, cs, n);
    if (!e && n_new) *n_new = fresh;
    free(ch);
    free(cs);
    return e;
}

kvt_err kvt_put(kvt_client *c, const char *ns, const kvt_key *keys,
                const void *const *bufs, const size_t *sizes, size_t n,
                const kvt_key *parent, size_t *n_new)
{
    kvt_err e = check_args(c, ns, keys, n);
    if (e || !bufs || !sizes) return e ? e : KVT_EINVAL;
    for (size_t i = 0; i < n; i++)
        if (!bufs[i] || sizes[i] == 0) return KVT_EINVAL;
    /* A namespace in a pool this client does not map (an operator
     * writing into a tenant's own pool) is copied. */
    if (kvt_zero_copy(c) &&
        (e = put_zero_copy(c, ns, keys, bufs, sizes, n, parent, n_new)) != KVT_ENOTSUP)
        return e;
    return put_inline(c, ns, keys, bufs, sizes, n, parent, n_new);
}

static kvt_err get_req(kvt_client *c, const char *ns, const kvt_key *keys,
                       size_t n, int inl, Kvtier__Response **r)
{
    Kvtier__Get g = KVTIER__GET__INIT;
    g.ns = (char *)ns;
    g.n_keys = n;
    g.inline_ = inl;
    if (!(g.keys = wrap_keys(keys, n))) return KVT_ENOMEM;
    REQ(q, GET, get, &g);
    kvt_err e = kvtc_call(c, &q, r);
    free(g.keys);
    if (e) return e;
    return expect(*r, KVTIER__RESPONSE__BODY_GET);
}

kvt_err kvt_get(kvt_client *c, const char *ns, const kvt_key *keys, size_t n,
                kvt_lease *lease, kvt_chunk *chunks, size_t *n_got)
{
    kvt_err e = check_args(c, ns, keys, n);
    if (e || !lease || !chunks || !n_got) return e ? e : KVT_EINVAL;
    if (!kvt_zero_copy(c)) return KVT_ENOTSUP;
    Kvtier__Response *r;
    if ((e = get_req(c, ns, keys, n, 0, &r))) return e;
    Kvtier__GetResp *g = r->get;
    kvt_lease l = g->lease;
    size_t got = g->n_slots <= n ? g->n_slots : 0;
    if (got && g->pool != kvtc_pool_id(c)) { /* not our pool: copy instead */
        kvtier__response__free_unpacked(r, NULL);
        kvt_release(c, l);
        return KVT_ENOTSUP;
    }
    for (size_t i = 0; i < got; i++) {
        const Kvtier__Slot *s = g->slots[i];
        chunks[i] = (kvt_chunk){kvtc_pool_ptr(c, g->pool, s->offset, s->size), s->size,
                                s->checksum, 0};
        if (!chunks[i].data) e = KVT_EPROTO;
    }
    kvtier__response__free_unpacked(r, NULL);
    if (e) {
        kvt_release(c, l);
        return e;
    }
    *lease = got ? l : 0;
    *n_got = got;
    return KVT_OK;
}

kvt_err kvt_get_copy(kvt_client *c, const char *ns, const kvt_key *key,
                     void *buf, size_t cap, size_t *size)
{
    kvt_err e = check_args(c, ns, key, 1);
    if (e || !size || (cap && !buf)) return e ? e : KVT_EINVAL;
    if (kvt_zero_copy(c)) {
        kvt_lease l;
        kvt_chunk ch;
        size_t got;
        e = kvt_get(c, ns, key, 1, &l, &ch, &got);
        if (e && e != KVT_ENOTSUP) return e;
        if (!e && !got) return KVT_ENOENT;
        if (!e) {
            *size = ch.size;
            if (ch.size <= cap) memcpy(buf, ch.data, ch.size);
            kvt_release(c, l);
            return ch.size <= cap ? KVT_OK : KVT_ETOOBIG;
        }
    }
    Kvtier__Response *r;
    if ((e = get_req(c, ns, key, 1, 1, &r))) return e;
    const Kvtier__GetResp *g = r->get;
    if (g->n_data == 0) e = KVT_ENOENT;
    else if ((*size = g->data[0].len) > cap) e = KVT_ETOOBIG;
    else if (kvt_checksum(g->data[0].data, *size) != g->slots[0]->checksum) e = KVT_ECORRUPT;
    else memcpy(buf, g->data[0].data, *size);
    kvtier__response__free_unpacked(r, NULL);
    return e;
}

static kvt_err count_call(kvt_client *c, Kvtier__Request *q, uint64_t *count)
{
    Kvtier__Response *r;
    kvt_err e = kvtc_call(c, q, &r);
    if (e || (e = expect(r, KVTIER__RESPONSE__BODY_COUNT))) return e;
    if (count) *count = r->count->count;
    kvtier__response__free_unpacked(r, NULL);
    return KVT_OK;
}

kvt_err kvt_delete(kvt_client *c, const char *ns, const kvt_key *keys,
                   size_t n, size_t *n_deleted)
{
    kvt_err e = check_args(c, ns, keys, n);
    if (e) return e;
    Kvtier__Delete d = KVTIER__DELETE__INIT;
    d.ns = (char *)ns;
    d.n_keys = n;
    if (!(d.keys = wrap_keys(keys, n))) return KVT_ENOMEM;
    REQ(q, DELETE, delete_, &d);
    uint64_t cnt = 0;
    e = count_call(c, &q, &cnt);
    free(d.keys);
    if (!e && n_deleted) *n_deleted = cnt;
    return e;
}

kvt_err kvt_clear(kvt_client *c, const char *ns, uint64_t *n_deleted)
{
    if (!c || !wire_ns_ok(ns)) return KVT_EINVAL;
    Kvtier__Clear cl = KVTIER__CLEAR__INIT;
    cl.ns = (char *)ns;
    REQ(q, CLEAR, clear, &cl);
    return count_call(c, &q, n_deleted);
}

kvt_err kvt_evict(kvt_client *c, uint64_t bytes, uint64_t *freed)
{
    if (!c) return KVT_EINVAL;
    Kvtier__Evict ev = KVTIER__EVICT__INIT;
    ev.bytes = bytes;
    REQ(q, EVICT, evict, &ev);
    return count_call(c, &q, freed);
}

kvt_err kvt_stats_get(kvt_client *c, kvt_stats *out)
{
    if (!c || !out) return KVT_EINVAL;
    Kvtier__Stats st = KVTIER__STATS__INIT;
    REQ(q, STATS, stats, &st);
    Kvtier__Response *r;
    kvt_err e = kvtc_call(c, &q, &r);
    if (e || (e = expect(r, KVTIER__RESPONSE__BODY_STATS))) return e;
    const Kvtier__StatsResp *s = r->stats;
    *out = (kvt_stats){s->pool_bytes, s->used_bytes, s->chunks, s->namespaces,
                       s->leases, s->clients, s->hits, s->misses, s->puts,
                       s->evictions, s->bytes_in, s->bytes_out, s->fragmentation,
                       s->index_bytes, s->uptime_ms};
    kvtier__response__free_unpacked(r, NULL);
    return KVT_OK;
}
