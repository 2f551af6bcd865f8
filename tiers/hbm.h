/*
 * hbm.h -- the HBM tier: a daemon-owned pool of GPU memory (DESIGN §4).
 *
 * Design: the DRAM tier's shape on the device. One cudaMalloc of
 * hbm_bytes at start, handed out in HBM_UNIT units by the same O(1) TLSF
 * allocator, metadata on the host heap. The tier only stores bytes; which
 * chunk sits in HBM, and when it demotes to DRAM, is policy (kvcache.c).
 * Everything CUDA goes through a kvt_cuda_ops table, so the tier runs on
 * the real library (libkvtier_cuda.so) or on a fake one in tests.
 *
 * Threads: alloc, free and usage are the core thread's. write and read
 * block until their copy is done (a stream sync), so they belong on a
 * worker thread, never the core; they serialise on one stream (copy_mtx).
 *
 * Nothing here survives a restart: alloc_at is not supported.
 */
#ifndef KVT_HBM_H
#define KVT_HBM_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "kvt_cuda_api.h"
#include "tier.h"
#include "tlsf.h"

#define HBM_UNIT 65536u

struct hbm {
    struct tier tier; /* first: a struct hbm is a struct tier */
    const struct kvt_cuda_ops *ops;
    kvt_cuda_ctx *ctx;
    int device;
    uint8_t *base;    /* device memory */
    uint64_t bytes;
    struct tlsf *alloc;
    pthread_mutex_t copy_mtx; /* guards stream */
    kvt_cuda_stream *stream;
};

/* Allocate bytes (rounded down to HBM_UNIT, at least one unit) on device.
 * KVT_ENOSPC if the device has not that much free, KVT_EINVAL for a bad
 * size or device; err receives a sentence either way. */
kvt_err hbm_open(const struct kvt_cuda_ops *ops, kvt_cuda_ctx *ctx,
                 int device, uint64_t bytes, struct hbm **out, char *err,
                 size_t errlen);
/* Free the device memory, the stream and the tier. Accepts NULL. */
void hbm_close(struct hbm *h);

/* Device address of a byte offset (for kernels reading chunks in place). */
static inline void *hbm_ptr(const struct hbm *h, uint64_t off)
{
    return h->base + off;
}

#endif
