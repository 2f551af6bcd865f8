/*
 * bench_gather.c -- CPU gather/scatter throughput against plain memcpy of
 * the same bytes, in the same run.
 *
 * Design: the physical limit of a gather is one memcpy of the chunk, so
 * every row of the table times memcpy of exactly chunk_bytes right next to
 * the gather and scatter of that chunk and prints the ratio. Shapes are a
 * Llama-like model cut to 16 layers (8 KV heads of 128 bf16: 64 KiB of KV
 * per token), 256-token chunks (16 MiB), random distinct blocks out of a
 * 2048-token cache (128 MiB) -- so the working set stays under 256 MiB and
 * the cache does not fit in CPU caches. Each op is timed best-of over
 * ~0.2 s, once on one thread and once with the automatic thread count.
 * Runs in well under 60 s on 2 cores, takes no arguments.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "layout.h"
#include "test/fixture.h"

#define BENCH_SECONDS 0.2
#define CACHE_TOKENS 2048
#define CHUNK_TOKENS 256

struct spec {
    kvt_layout_kind kind;
    uint32_t block_size, heads, head_size, elem_size;
    int contiguous; /* consecutive block ids instead of random ones */
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

typedef void (*op_fn)(void *arg);

struct op_arg {
    kvt_layout *d;
    const int32_t *ids;
    size_t n, len;
    uint8_t *chunk, *src;
    int failed;
};

static void op_memcpy(void *p)
{
    struct op_arg *a = p;
    memcpy(a->chunk, a->src, a->len);
}

static void op_gather(void *p)
{
    struct op_arg *a = p;
    a->failed |= kvt_gather_cpu(a->d, a->ids, a->n, a->chunk, a->len) !=
                 KVT_OK;
}

static void op_scatter(void *p)
{
    struct op_arg *a = p;
    a->failed |= kvt_scatter_cpu(a->d, a->ids, a->n, a->chunk, a->len) !=
                 KVT_OK;
}

/* Best single-op rate over BENCH_SECONDS, GB/s (10^9 bytes). */
static double rate(op_fn fn, struct op_arg *a)
{
    double best = 1e30, start = now_s();
    fn(a); /* warm up */
    for (int reps = 0; reps < 3 || now_s() - start < BENCH_SECONDS;
         reps++) {
        double t0 = now_s();
        fn(a);
        double t = now_s() - t0;
        best = t < best ? t : best;
    }
    return (double)a->len / best / 1e9;
}

static int run(const struct spec *s, uint8_t *chunk, uint8_t *src,
               uint64_t *seed)
{
    fx_shape sh = {.layers = 16, .blocks = CACHE_TOKENS / s->block_size,
                   .block_size = s->block_size, .heads = s->heads,
                   .head_size = s->head_size, .elem_size = s->elem_size};
    fx_kv f;
    int32_t ids[CHUNK_TOKENS];
    size_t n = CHUNK_TOKENS / s->block_size;
    if (!fx_alloc(&f, s->kind, &sh))
        return 0;
    for (size_t i = 0; i < f.n_tensors; i++)
        memset(f.mem[i], (int)i + 1, f.tensor_bytes);
    if (s->contiguous)
        for (size_t i = 0; i < n; i++)
            ids[i] = (int32_t)(f.d.num_blocks / 2 + i);
    else
        fx_ids(seed, f.d.num_blocks, ids, n);
    struct op_arg a = {.d = &f.d, .ids = ids, .n = n, .chunk = chunk,
                       .src = src};
    a.len = kvt_layout_chunk_bytes(&f.d, n * s->block_size);
    double mc = rate(op_memcpy, &a);
    f.d.cpu_threads = 1;
    double g1 = rate(op_gather, &a), s1 = rate(op_scatter, &a);
    f.d.cpu_threads = 0;
    double gt = rate(op_gather, &a), st = rate(op_scatter, &a);
    char name[32];
    snprintf(name, sizeof(name), "%s%s", kvt_layout_kind_name(s->kind),
             s->contiguous ? "/seq" : "");
    printf("%-20s %2u %5u %5.1f %7.2f %7.2f %5.2f %7.2f %5.2f %7.2f %5.2f"
           " %7.2f %5.2f\n",
           name, s->elem_size, s->block_size, (double)a.len / (1 << 20), mc,
           g1, g1 / mc, gt, gt / mc, s1, s1 / mc, st, st / mc);
    fx_free(&f);
    return !a.failed;
}

int main(void)
{
    static const struct spec specs[] = {
        {KVT_LAYOUT_VLLM_FLASH_NHD, 16, 8, 128, 2, 0},
        {KVT_LAYOUT_VLLM_FLASH_HND, 16, 8, 128, 2, 0},
        {KVT_LAYOUT_FLASHINFER_NHD, 16, 8, 128, 2, 0},
        {KVT_LAYOUT_FLASHINFER_HND, 16, 8, 128, 2, 0},
        {KVT_LAYOUT_VLLM_CROSS_NHD, 16, 8, 128, 2, 0},
        {KVT_LAYOUT_VLLM_CROSS_HND, 16, 8, 128, 2, 0},
        {KVT_LAYOUT_VLLM_FLASH_NHD, 128, 8, 128, 2, 0},
        {KVT_LAYOUT_VLLM_FLASH_HND, 128, 8, 128, 2, 0},
        {KVT_LAYOUT_SGLANG_MHA, 1, 8, 128, 2, 0},
        {KVT_LAYOUT_SGLANG_MHA, 1, 8, 128, 2, 1},
        {KVT_LAYOUT_MLA, 64, 1, 576, 2, 0},
        {KVT_LAYOUT_VLLM_FLASH_NHD, 16, 8, 128, 1, 0},
        {KVT_LAYOUT_VLLM_FLASH_HND, 16, 8, 128, 1, 0},
    };
    size_t max_chunk = (size_t)16 * 2 * CHUNK_TOKENS * 8 * 128 * 2;
    uint8_t *chunk = aligned_alloc(4096, max_chunk);
    uint8_t *src = aligned_alloc(4096, max_chunk);
    uint64_t seed = 0x243f6a8885a308d3ull;
    int ok = 1;
    if (chunk == NULL || src == NULL)
        return 1;
    memset(chunk, 1, max_chunk);
    memset(src, 2, max_chunk);
    printf("bench_gather: CPU gather/scatter of one %d-token chunk from a "
           "%d-token paged cache (16 layers) vs memcpy of the same bytes; "
           "GB/s, best of ~%.1f s; T = automatic threads\n",
           CHUNK_TOKENS, CACHE_TOKENS, BENCH_SECONDS);
    printf("%-20s %2s %5s %5s %7s %7s %5s %7s %5s %7s %5s %7s %5s\n",
           "layout", "es", "block", "MiB", "memcpy", "gath1", "x", "gathT",
           "x", "scat1", "x", "scatT", "x");
    for (size_t i = 0; i < sizeof(specs) / sizeof(specs[0]); i++)
        ok &= run(&specs[i], chunk, src, &seed);
    free(chunk);
    free(src);
    if (!ok)
        fprintf(stderr, "bench_gather: a gather or scatter failed\n");
    return ok ? 0 : 1;
}
