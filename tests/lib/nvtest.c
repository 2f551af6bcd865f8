/*
 * nvtest.c -- see nvtest.h.
 */
#include "nvtest.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "client_internal.h"

void nvt_args(const char **out, size_t cap, int mb, int file_mb,
              const char *const *rest)
{
    static char bytes[32], fbytes[32];
    size_t n = 0;
    snprintf(bytes, sizeof bytes, "%dM", mb);
    snprintf(fbytes, sizeof fbytes, "%dM", file_mb);
    const char *base[] = {"--nvme.nvme_bytes", bytes, "--nvme.file_bytes", fbytes,
                          "--nvme.fsync", "0", NULL};
    for (int i = 0; base[i] && n + 1 < cap; i++) out[n++] = base[i];
    for (int i = 0; rest && rest[i] && n + 1 < cap; i++) out[n++] = rest[i];
    out[n] = NULL;
}

int nvt_start(struct tdaemon *d, int nvme_mb, int file_mb, const char *const *rest)
{
    const char *args[48];
    nvt_args(args, 48, nvme_mb, file_mb, rest);
    return td_start(d, args);
}

size_t nvt_size(uint64_t i, size_t base)
{
    return base - (size_t)(i * 4099 % 3000);
}

kvt_err nvt_put_chain(kvt_client *c, uint64_t base, size_t n, size_t size)
{
    kvt_key *keys = calloc(n, sizeof *keys), parent = td_key(base - 1);
    size_t *sizes = calloc(n, sizeof *sizes);
    kvt_chunk *ch = calloc(n, sizeof *ch);
    kvt_lease l;
    for (size_t i = 0; i < n; i++) {
        keys[i] = td_key(base + i);
        sizes[i] = nvt_size(base + i, size);
    }
    kvt_err e = kvt_put_begin(c, NVT_NS, keys, sizes, n, base ? &parent : NULL, &l, ch);
    for (size_t i = 0; !e && i < n; i++)
        if (!ch[i].exists) td_fill(ch[i].data, sizes[i], base + i);
    if (!e) e = kvt_put_commit(c, l, ch, n, NULL);
    free(keys);
    free(sizes);
    free(ch);
    return e;
}

int nvt_check(kvt_client *c, uint64_t i, size_t size)
{
    size_t n = nvt_size(i, size), got = 0;
    uint8_t *buf = malloc(n), *want = malloc(n);
    kvt_key k = td_key(i);
    kvt_err e = kvt_get_copy(c, NVT_NS, &k, buf, n, &got);
    td_fill(want, n, i);
    int ok = e == KVT_OK;
    if (e != KVT_OK && e != KVT_ENOENT) {
        fprintf(stderr, "nvt_check %llu: %s (%s)\n", (unsigned long long)i,
                kvt_strerror(e), kvt_last_error(c));
        abort();
    }
    if (ok && (got != n || memcmp(buf, want, n) != 0)) {
        fprintf(stderr, "nvt_check %llu: WRONG BYTES (%zu of %zu)\n",
                (unsigned long long)i, got, n);
        abort();
    }
    free(buf);
    free(want);
    return ok;
}

size_t nvt_lookup(kvt_client *c, uint64_t base, size_t n, int prefetch,
                  kvt_tier *tiers)
{
    ProtobufCBinaryData *keys = calloc(n, sizeof *keys);
    kvt_key *kb = calloc(n, sizeof *kb);
    for (size_t i = 0; i < n; i++) {
        kb[i] = td_key(base + i);
        keys[i] = (ProtobufCBinaryData){KVT_KEY_LEN, kb[i].b};
    }
    Kvtier__Lookup lk = KVTIER__LOOKUP__INIT;
    Kvtier__Request q = KVTIER__REQUEST__INIT;
    Kvtier__Response *r = NULL;
    lk.ns = NVT_NS;
    lk.keys = keys;
    lk.n_keys = n;
    lk.prefetch = prefetch;
    q.body_case = KVTIER__REQUEST__BODY_LOOKUP;
    q.lookup = &lk;
    size_t present = 0;
    if (kvtc_call(c, &q, &r) == KVT_OK && r->body_case == KVTIER__RESPONSE__BODY_LOOKUP) {
        present = r->lookup->n_present;
        for (size_t i = 0; tiers && i < n && i < r->lookup->n_tiers; i++)
            tiers[i] = (kvt_tier)r->lookup->tiers[i];
    }
    if (r) kvtier__response__free_unpacked(r, NULL);
    free(keys);
    free(kb);
    return present;
}

kvt_err nvt_flush(kvt_client *c, int evict, Kvtier__FlushResp *out)
{
    Kvtier__Flush f = KVTIER__FLUSH__INIT;
    Kvtier__Request q = KVTIER__REQUEST__INIT;
    Kvtier__Response *r = NULL;
    f.evict = evict;
    q.body_case = KVTIER__REQUEST__BODY_FLUSH;
    q.flush = &f;
    kvt_err e = kvtc_call(c, &q, &r);
    if (!e && r->body_case != KVTIER__RESPONSE__BODY_FLUSH) e = KVT_EPROTO;
    if (!e && out) *out = *r->flush;
    if (r) kvtier__response__free_unpacked(r, NULL);
    return e;
}

kvt_err nvt_verify(kvt_client *c, uint32_t max, Kvtier__VerifyResp *out)
{
    Kvtier__Verify v = KVTIER__VERIFY__INIT;
    Kvtier__Request q = KVTIER__REQUEST__INIT;
    Kvtier__Response *r = NULL;
    v.max_records = max;
    q.body_case = KVTIER__REQUEST__BODY_VERIFY;
    q.verify = &v;
    kvt_err e = kvtc_call(c, &q, &r);
    if (!e && r->body_case != KVTIER__RESPONSE__BODY_VERIFY) e = KVT_EPROTO;
    if (!e && out) *out = *r->verify;
    if (r) kvtier__response__free_unpacked(r, NULL);
    return e;
}

Kvtier__Response *nvt_stats(kvt_client *c)
{
    Kvtier__Stats st = KVTIER__STATS__INIT;
    Kvtier__Request q = KVTIER__REQUEST__INIT;
    Kvtier__Response *r = NULL;
    q.body_case = KVTIER__REQUEST__BODY_STATS;
    q.stats = &st;
    if (kvtc_call(c, &q, &r) != KVT_OK) return NULL;
    return r;
}

/* A field of a message by name, if it is a uint64 or a bool. */
static int field_u64(const ProtobufCMessage *m, const char *name, uint64_t *v)
{
    const ProtobufCFieldDescriptor *f =
        protobuf_c_message_descriptor_get_field_by_name(m->descriptor, name);
    if (!f) return -1;
    const char *p = (const char *)m + f->offset;
    if (f->type == PROTOBUF_C_TYPE_UINT64) memcpy(v, p, sizeof *v);
    else if (f->type == PROTOBUF_C_TYPE_BOOL) *v = *(const protobuf_c_boolean *)p;
    else return -1;
    return 0;
}

static uint64_t tier_stat(const Kvtier__StatsResp *s, const char *name)
{
    uint64_t v = UINT64_MAX;
    int t = strncmp(name, "dram.", 5) == 0 ? KVT_TIER_DRAM : KVT_TIER_NVME;
    for (size_t i = 0; i < s->n_tiers; i++)
        if ((int)s->tiers[i]->tier == t) field_u64(&s->tiers[i]->base, name + 5, &v);
    return v;
}

uint64_t nvt_stat(kvt_client *c, const char *name)
{
    Kvtier__Response *r = nvt_stats(c);
    uint64_t v = UINT64_MAX;
    if (!r) return v;
    const Kvtier__StatsResp *s = r->stats;
    if (strchr(name, '.')) v = tier_stat(s, name);
    else if (s->nvme && field_u64(&s->nvme->base, name, &v) == 0) {}
    else field_u64(&s->base, name, &v);
    kvtier__response__free_unpacked(r, NULL);
    return v;
}

uint64_t nvt_wait_stat(kvt_client *c, const char *name, uint64_t want, int ms)
{
    long long end = td_now_ms() + ms;
    uint64_t v = nvt_stat(c, name);
    while ((v == UINT64_MAX || v < want) && td_now_ms() < end) {
        usleep(10000);
        v = nvt_stat(c, name);
    }
    return v;
}
