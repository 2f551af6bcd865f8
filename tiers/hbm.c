/*
 * hbm.c -- the HBM tier (see hbm.h).
 *
 * Design: alloc/free are the DRAM tier's logic in HBM_UNIT units; write
 * and read are one cudaMemcpyAsync (cudaMemcpyDefault, so the host side
 * may be pageable, pinned or the registered DRAM pool) followed by a sync
 * of the tier's own stream, done() called before returning like every
 * synchronous tier. A failed copy is KVT_EIO and leaves the range's old
 * bytes in an undefined state, which the caller treats as a lost chunk.
 */
#include "hbm.h"

#include <stdio.h>
#include <stdlib.h>

static kvt_err hbm_alloc(struct tier *t, uint64_t bytes, struct tier_loc *loc)
{
    struct hbm *h = (struct hbm *)t;
    uint64_t units = (bytes + HBM_UNIT - 1) / HBM_UNIT, off;
    if (units == 0) units = 1;
    uint32_t hd = tlsf_alloc(h->alloc, units, &off);
    if (hd == TLSF_NONE) return KVT_ENOSPC;
    *loc = (struct tier_loc){off * HBM_UNIT, units * HBM_UNIT, hd};
    return KVT_OK;
}

static kvt_err hbm_alloc_at(struct tier *t, uint64_t off, uint64_t bytes,
                            struct tier_loc *loc)
{
    (void)t, (void)off, (void)bytes, (void)loc;
    return KVT_ENOTSUP; /* nothing in HBM outlives the daemon */
}

static void hbm_free(struct tier *t, const struct tier_loc *loc)
{
    tlsf_free(((struct hbm *)t)->alloc, loc->h);
}

/* One copy on the tier's stream, waited for. */
static kvt_err hbm_copy(struct hbm *h, void *dst, const void *src, uint64_t n)
{
    pthread_mutex_lock(&h->copy_mtx);
    kvt_err e = h->ops->memcpy_async(h->ctx, dst, src, n, h->stream);
    if (e == KVT_OK) e = h->ops->sync(h->ctx, h->stream);
    pthread_mutex_unlock(&h->copy_mtx);
    return e == KVT_OK || e == KVT_EINVAL ? e : KVT_EIO;
}

static kvt_err hbm_rw(struct hbm *h, const struct tier_loc *loc, uint64_t at,
                      void *host, uint64_t n, int to_device, tier_done_fn done,
                      void *arg)
{
    if (at > loc->len || n > loc->len - at) return KVT_EINVAL;
    uint8_t *dev = h->base + loc->off + at;
    kvt_err e = to_device ? hbm_copy(h, dev, host, n) : hbm_copy(h, host, dev, n);
    if (done) done(arg, e);
    return e;
}

static kvt_err hbm_write(struct tier *t, const struct tier_loc *loc,
                         uint64_t at, const void *src, uint64_t n,
                         tier_done_fn done, void *arg)
{
    return hbm_rw((struct hbm *)t, loc, at, (void *)src, n, 1, done, arg);
}

static kvt_err hbm_read(struct tier *t, const struct tier_loc *loc,
                        uint64_t at, void *dst, uint64_t n, tier_done_fn done,
                        void *arg)
{
    return hbm_rw((struct hbm *)t, loc, at, dst, n, 0, done, arg);
}

static void hbm_usage(struct tier *t, struct tier_usage *u)
{
    struct hbm *h = (struct hbm *)t;
    u->capacity = h->bytes;
    u->used = h->bytes - tlsf_free_units(h->alloc) * HBM_UNIT;
    u->free_largest = tlsf_largest_free(h->alloc) * HBM_UNIT;
    u->fragmentation = tlsf_fragmentation(h->alloc);
    u->meta_bytes = tlsf_mem_bytes(h->alloc);
}

static void hbm_destroy(struct tier *t)
{
    hbm_close((struct hbm *)t);
}

static const struct tier_ops hbm_ops = {
    .name = "hbm",
    .id = KVT_TIER_HBM,
    .alloc = hbm_alloc,
    .alloc_at = hbm_alloc_at,
    .free = hbm_free,
    .write_at = hbm_write,
    .read_at = hbm_read,
    .usage = hbm_usage,
    .destroy = hbm_destroy,
};

kvt_err hbm_open(const struct kvt_cuda_ops *ops, kvt_cuda_ctx *ctx,
                 int device, uint64_t bytes, struct hbm **out, char *err,
                 size_t errlen)
{
    uint64_t units = bytes / HBM_UNIT;
    if (!ops || !out || units == 0 || device < 0) {
        snprintf(err, errlen, "hbm: %llu bytes on device %d: want at least "
                 "%u bytes on a device >= 0", (unsigned long long)bytes,
                 device, HBM_UNIT);
        return KVT_EINVAL;
    }
    struct hbm *h = calloc(1, sizeof *h);
    if (!h) abort(); /* control-plane allocation */
    h->tier.ops = &hbm_ops;
    h->ops = ops;
    h->ctx = ctx;
    h->device = device;
    h->bytes = units * HBM_UNIT;
    pthread_mutex_init(&h->copy_mtx, NULL);
    void *base = NULL;
    kvt_err e = ops->dev_alloc(ctx, device, h->bytes, &base);
    h->base = base;
    if (e == KVT_OK) e = ops->stream_create(ctx, device, &h->stream);
    if (e == KVT_OK && !(h->alloc = tlsf_create(units))) e = KVT_ENOMEM;
    if (e != KVT_OK) {
        snprintf(err, errlen, "hbm: cannot set up %llu bytes on device %d: %s "
                 "(%s)", (unsigned long long)h->bytes, device, kvt_strerror(e),
                 ops->last_error());
        hbm_close(h);
        return e;
    }
    *out = h;
    return KVT_OK;
}

void hbm_close(struct hbm *h)
{
    if (!h) return;
    if (h->stream) h->ops->stream_destroy(h->ctx, h->stream);
    if (h->base) h->ops->dev_free(h->ctx, h->base);
    tlsf_destroy(h->alloc);
    pthread_mutex_destroy(&h->copy_mtx);
    free(h);
}
