/*
 * gather_cpu.c -- CPU reference of the KV gather/scatter (see layout.h).
 *
 * Design: the canonical chunk is [layer][kv][token][head][row], so one
 * (layer, kv) pair of one block is always one contiguous B*H*R stretch of
 * the chunk. The work is therefore a list of (pair, block) copies, and the
 * engine-side address of each is base + id * block_stride. Each copy takes
 * the biggest run the layout allows: a whole block when its rows are
 * contiguous (NHD; and several blocks at once when their ids are
 * consecutive and blocks abut), a token's heads when heads are contiguous,
 * else single rows, walked in chunk order. Rows of common sizes are
 * copied with constant-size memcpy so the compiler inlines them, and
 * small blocks are prefetched a little ahead of use.
 *
 * Large transfers split the (layer, kv) pairs over threads: pairs never
 * share bytes on either side, so no locking, and since scatter ids are
 * distinct no byte is written twice. Threads are created per call (a few
 * tens of microseconds against milliseconds of copying above the
 * threshold); a thread that cannot be created leaves its share to the
 * caller's thread, so running out of threads is never an error.
 *
 * Every argument is checked before the first byte moves: on error nothing
 * is written.
 */
#include "layout.h"

#include <pthread.h>
#include <string.h>
#include <unistd.h>

#define GC_MT_BYTES (4u << 20) /* below this, one thread */
#define GC_MAX_THREADS 8
#define GC_PF_AHEAD 2            /* blocks */
#define GC_PF_MAX_BYTES (8u << 10) /* prefetch blocks up to this size */

struct gc_job {
    const kvt_layout *d;
    const int32_t *ids;
    size_t n;
    uint8_t *chunk;
    int to_chunk; /* 1: gather (tensor -> chunk), 0: scatter */
    uint32_t pair_lo, pair_hi;
};

/* memcpy with the common row sizes as constants, so they inline. */
static inline void gc_copy(void *dst, const void *src, size_t n)
{
    switch (n) {
    case 64: memcpy(dst, src, 64); break;
    case 128: memcpy(dst, src, 128); break;
    case 256: memcpy(dst, src, 256); break;
    case 512: memcpy(dst, src, 512); break;
    default: memcpy(dst, src, n); break;
    }
}

static inline void gc_move(uint8_t *tensor, uint8_t *chunk, size_t n,
                           int to_chunk)
{
    if (to_chunk)
        gc_copy(chunk, tensor, n);
    else
        gc_copy(tensor, chunk, n);
}

static int gc_heads_contig(const kvt_layout *d)
{
    return d->num_kv_heads == 1 || d->head_stride == d->row_bytes;
}

static int gc_block_contig(const kvt_layout *d)
{
    return gc_heads_contig(d) &&
           (d->block_size == 1 ||
            d->token_stride == d->row_bytes * d->num_kv_heads);
}

/* How many of ids[0..n) can move as one run starting at ids[0]. */
static size_t gc_run(const kvt_layout *d, const int32_t *ids, size_t n)
{
    uint64_t plane = d->row_bytes * d->num_kv_heads * d->block_size;
    size_t k = 1;
    if (!gc_block_contig(d) || d->block_stride != plane)
        return 1;
    while (k < n && ids[k] == ids[0] + (int32_t)k)
        k++;
    return k;
}

/* One block of one (layer, kv) that is not contiguous. Rows go in chunk
 * order (token outer), so the chunk side streams; on HND this beats head
 * outer (engine side streaming) by 1.3-1.5x in bench_gather. */
static void gc_block_rows(const kvt_layout *d, uint8_t *blk, uint8_t *c,
                          int to_chunk)
{
    uint32_t B = d->block_size, H = d->num_kv_heads;
    uint64_t R = d->row_bytes;
    if (gc_heads_contig(d)) {
        for (uint32_t t = 0; t < B; t++)
            gc_move(blk + t * d->token_stride, c + (uint64_t)t * H * R,
                    H * R, to_chunk);
        return;
    }
    for (uint32_t t = 0; t < B; t++)
        for (uint32_t h = 0; h < H; h++)
            gc_move(blk + t * d->token_stride + h * d->head_stride,
                    c + ((uint64_t)t * H + h) * R, R, to_chunk);
}

/* Small blocks at random ids (SGLang page 1: 2 KiB each) defeat the
 * hardware prefetcher: ask for a block GC_PF_AHEAD runs ahead. Doubles
 * that case in bench_gather; big blocks need no help. */
static void gc_prefetch(const uint8_t *blk, uint64_t bytes, int to_chunk)
{
    if (bytes > GC_PF_MAX_BYTES)
        return;
    for (uint64_t o = 0; o < bytes; o += 64) {
        if (to_chunk)
            __builtin_prefetch(blk + o, 0);
        else
            __builtin_prefetch(blk + o, 1);
    }
}

/* Every block of one (layer, kv) pair. */
static void gc_pair(const struct gc_job *j, uint32_t pair)
{
    const kvt_layout *d = j->d;
    uint64_t plane = d->row_bytes * d->num_kv_heads * d->block_size;
    uint8_t *c = j->chunk + (uint64_t)pair * j->n * plane;
    uint8_t *t = (uint8_t *)(uintptr_t)d->base[pair];
    int contig = gc_block_contig(d);
    for (size_t i = 0; i < j->n;) {
        size_t run = gc_run(d, j->ids + i, j->n - i);
        uint8_t *blk = t + (uint64_t)j->ids[i] * d->block_stride;
        if (i + run + GC_PF_AHEAD - 1 < j->n)
            gc_prefetch(t + (uint64_t)j->ids[i + run + GC_PF_AHEAD - 1] *
                                d->block_stride,
                        plane, j->to_chunk);
        if (contig)
            gc_move(blk, c + i * plane, run * plane, j->to_chunk);
        else
            gc_block_rows(d, blk, c + i * plane, j->to_chunk);
        i += run;
    }
}

static void *gc_worker(void *arg)
{
    const struct gc_job *j = arg;
    for (uint32_t p = j->pair_lo; p < j->pair_hi; p++)
        gc_pair(j, p);
    return NULL;
}

static unsigned gc_threads(const kvt_layout *d, size_t bytes)
{
    unsigned pairs = d->num_layers * d->num_kv, n = d->cpu_threads;
    if (n == 0) {
        long cpus = sysconf(_SC_NPROCESSORS_ONLN);
        n = bytes < GC_MT_BYTES || cpus < 1 ? 1 : (unsigned)cpus;
    }
    if (n > GC_MAX_THREADS)
        n = GC_MAX_THREADS;
    return n > pairs ? pairs : n;
}

/* Split the pairs over threads; the caller's thread takes the first
 * share, and any share whose thread failed to start. */
static void gc_run_job(const struct gc_job *proto, size_t bytes)
{
    unsigned n = gc_threads(proto->d, bytes);
    uint32_t pairs = proto->d->num_layers * proto->d->num_kv;
    struct gc_job jobs[GC_MAX_THREADS];
    pthread_t tid[GC_MAX_THREADS];
    int started[GC_MAX_THREADS] = {0};
    for (unsigned i = 0; i < n; i++) {
        jobs[i] = *proto;
        jobs[i].pair_lo = (uint32_t)((uint64_t)pairs * i / n);
        jobs[i].pair_hi = (uint32_t)((uint64_t)pairs * (i + 1) / n);
        if (i > 0)
            started[i] = pthread_create(&tid[i], NULL, gc_worker,
                                        &jobs[i]) == 0;
    }
    gc_worker(&jobs[0]);
    for (unsigned i = 1; i < n; i++) {
        if (started[i])
            pthread_join(tid[i], NULL);
        else
            gc_worker(&jobs[i]);
    }
}

static kvt_err gc_check(const kvt_layout *d, const int32_t *ids, size_t n,
                        const void *chunk, size_t len, int unique)
{
    if (d == NULL || chunk == NULL || d->num_layers == 0 ||
        d->num_layers > KVT_LAYOUT_MAX_LAYERS ||
        (d->num_kv != 1 && d->num_kv != 2))
        return KVT_EINVAL;
    kvt_err err = kvt_layout_check_blocks(d, ids, n, unique);
    if (err != KVT_OK)
        return err;
    if (n > SIZE_MAX / d->block_size)
        return KVT_EINVAL;
    size_t want = kvt_layout_chunk_bytes(d, n * d->block_size);
    return want != 0 && want == len ? KVT_OK : KVT_EINVAL;
}

kvt_err kvt_gather_cpu(const kvt_layout *d, const int32_t *block_ids,
                       size_t n_blocks, void *dst, size_t dst_len)
{
    kvt_err err = gc_check(d, block_ids, n_blocks, dst, dst_len, 0);
    if (err != KVT_OK)
        return err;
    struct gc_job j = {.d = d, .ids = block_ids, .n = n_blocks,
                       .chunk = dst, .to_chunk = 1};
    gc_run_job(&j, dst_len);
    return KVT_OK;
}

kvt_err kvt_scatter_cpu(const kvt_layout *d, const int32_t *block_ids,
                        size_t n_blocks, const void *src, size_t src_len)
{
    kvt_err err = gc_check(d, block_ids, n_blocks, src, src_len, 1);
    if (err != KVT_OK)
        return err;
    /* The chunk is only read on this path. */
    struct gc_job j = {.d = d, .ids = block_ids, .n = n_blocks,
                       .chunk = (uint8_t *)(uintptr_t)src, .to_chunk = 0};
    gc_run_job(&j, src_len);
    return KVT_OK;
}
