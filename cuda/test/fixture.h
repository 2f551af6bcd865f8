/*
 * fixture.h -- host KV tensors of any layout kind, for the layout tests
 * (tests/unit/test_layout.c), the GPU check (cuda/test/gpu_check.c) and
 * the gather bench.
 *
 * Design: fx_addr finds an element by indexing the engine's *logical*
 * tensor shapes as the engines document them (layout.h's table), written
 * out independently of layout.c's strides, so a test comparing the two
 * catches a wrong stride, not just an inconsistent one. fx_canon is the
 * canonical chunk order, spelled out the same way. Header-only (static
 * inline): each test binary includes it once; C and C++ alike.
 *
 * Ownership: fx_alloc/fx_alloc_at malloc the tensors; fx_free frees.
 */
#ifndef KVT_FIXTURE_H
#define KVT_FIXTURE_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "layout.h"

typedef struct fx_kv {
    kvt_layout_params p;
    kvt_layout d;
    uint64_t bases[KVT_LAYOUT_MAX_LAYERS * 2];
    uint8_t *mem[KVT_LAYOUT_MAX_LAYERS * 2]; /* tensors */
    uint8_t *raw[KVT_LAYOUT_MAX_LAYERS * 2]; /* their allocations */
    size_t n_tensors, tensor_bytes;
} fx_kv;

typedef struct fx_shape {
    uint32_t layers, blocks, block_size, heads, head_size, elem_size;
} fx_shape;

/* Padding the CUSTOM kind puts after rows and blocks, in elements. */
#define FX_ROW_PAD 4
#define FX_BLOCK_PAD 32

static inline uint64_t fx_rand(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static inline void fx_params(fx_kv *f, kvt_layout_kind kind,
                             const fx_shape *s)
{
    memset(&f->p, 0, sizeof(f->p));
    f->p.kind = kind;
    f->p.num_layers = s->layers;
    f->p.num_blocks = s->blocks;
    f->p.block_size = s->block_size;
    f->p.num_kv_heads = kind == KVT_LAYOUT_MLA ? 1 : s->heads;
    f->p.head_size = s->head_size;
    f->p.elem_size = s->elem_size;
    f->p.num_kv = 2;
    if (kind == KVT_LAYOUT_CUSTOM) { /* padded rows and blocks, HND-like */
        uint64_t row = (uint64_t)s->head_size * s->elem_size;
        f->p.token_stride = row + FX_ROW_PAD * s->elem_size;
        f->p.head_stride = f->p.token_stride * s->block_size;
        f->p.block_stride = f->p.head_stride * s->heads +
                            FX_BLOCK_PAD * s->elem_size;
    }
    f->n_tensors = kvt_layout_n_bases(kind, s->layers, 2);
    f->p.bases = f->bases;
    f->p.n_bases = f->n_tensors;
}

/* Allocate (zeroed) tensors of kind and shape s, each starting off bytes
 * past a 64-byte boundary (off a multiple of the element size, so bases
 * can be made to defeat wide vector copies); 0 on failure. */
static inline int fx_alloc_at(fx_kv *f, kvt_layout_kind kind,
                              const fx_shape *s, size_t off)
{
    memset(f, 0, sizeof(*f));
    fx_params(f, kind, s);
    for (size_t i = 0; i < f->n_tensors; i++)
        f->bases[i] = 4096; /* probe: learn tensor_bytes */
    if (kvt_layout_init(&f->d, &f->p) != KVT_OK)
        return 0;
    f->tensor_bytes = f->d.tensor_bytes;
    for (size_t i = 0; i < f->n_tensors; i++) {
        size_t len = (f->tensor_bytes + off + 63) / 64 * 64;
        f->raw[i] = (uint8_t *)aligned_alloc(64, len);
        if (f->raw[i] == NULL)
            return 0;
        f->mem[i] = f->raw[i] + off;
        memset(f->mem[i], 0, f->tensor_bytes);
        f->bases[i] = (uint64_t)(uintptr_t)f->mem[i];
    }
    return kvt_layout_init(&f->d, &f->p) == KVT_OK;
}

static inline int fx_alloc(fx_kv *f, kvt_layout_kind kind, const fx_shape *s)
{
    return fx_alloc_at(f, kind, s, 0);
}

static inline void fx_free(fx_kv *f)
{
    for (size_t i = 0; i < f->n_tensors; i++)
        free(f->raw[i]);
    memset(f->raw, 0, sizeof(f->raw));
    memset(f->mem, 0, sizeof(f->mem));
}

static inline void fx_fill(fx_kv *f, uint64_t seed)
{
    uint64_t s = seed | 1;
    for (size_t i = 0; i < f->n_tensors; i++)
        for (size_t j = 0; j < f->tensor_bytes; j++)
            f->mem[i][j] = (uint8_t)(fx_rand(&s) >> 24);
}

/* FNV-1a over every tensor: "unchanged" checks. */
static inline uint64_t fx_sum(const fx_kv *f)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < f->n_tensors; i++)
        for (size_t j = 0; j < f->tensor_bytes; j++)
            h = (h ^ f->mem[i][j]) * 1099511628211ull;
    return h;
}

static inline uint64_t fx_sum_buf(const void *p, size_t n)
{
    const uint8_t *b = (const uint8_t *)p;
    uint64_t h = 1469598103934665603ull;
    for (size_t j = 0; j < n; j++)
        h = (h ^ b[j]) * 1099511628211ull;
    return h;
}

/*
 * Row (l, kv, block b, token t, head h), found by indexing the logical
 * shape of the kind (element offsets), not through the descriptor.
 */
static inline uint8_t *fx_addr(const fx_kv *f, uint32_t l, uint32_t kv,
                               uint64_t b, uint64_t t, uint64_t h)
{
    const kvt_layout_params *p = &f->p;
    uint64_t L = p->num_layers, N = p->num_blocks, B = p->block_size;
    uint64_t H = p->num_kv_heads, D = p->head_size, es = p->elem_size;
    switch (p->kind) {
    case KVT_LAYOUT_VLLM_FLASH_NHD: /* (2, N, B, H, D) */
        return f->mem[l] + ((((kv * N + b) * B + t) * H + h) * D) * es;
    case KVT_LAYOUT_VLLM_FLASH_HND: /* (2, N, H, B, D) */
        return f->mem[l] + ((((kv * N + b) * H + h) * B + t) * D) * es;
    case KVT_LAYOUT_FLASHINFER_NHD: /* (N, 2, B, H, D) */
        return f->mem[l] + ((((b * 2 + kv) * B + t) * H + h) * D) * es;
    case KVT_LAYOUT_FLASHINFER_HND: /* (N, 2, H, B, D) */
        return f->mem[l] + ((((b * 2 + kv) * H + h) * B + t) * D) * es;
    case KVT_LAYOUT_VLLM_CROSS_NHD: /* (N, L, 2, B, H, D) */
        return f->mem[0] +
               (((((b * L + l) * 2 + kv) * B + t) * H + h) * D) * es;
    case KVT_LAYOUT_VLLM_CROSS_HND: /* (N, H, L, 2, B, D) */
        return f->mem[0] +
               (((((b * H + h) * L + l) * 2 + kv) * B + t) * D) * es;
    case KVT_LAYOUT_SGLANG_MHA: /* K[l], V[l]: (N*B slots, H, D) */
        return f->mem[kv * L + l] + (((b * B + t) * H + h) * D) * es;
    case KVT_LAYOUT_MLA: /* (N, B, D) */
        return f->mem[l] + ((b * B + t) * D) * es;
    case KVT_LAYOUT_CUSTOM:
        return f->mem[l * 2 + kv] + b * p->block_stride +
               h * p->head_stride + t * p->token_stride;
    default:
        return NULL;
    }
}

/* Canonical chunk offset of (l, kv, chunk token i, head h), T tokens. */
static inline size_t fx_canon(const kvt_layout *d, uint32_t l, uint32_t kv,
                              size_t T, size_t i, size_t h)
{
    return (((l * (size_t)d->num_kv + kv) * T + i) * d->num_kv_heads + h) *
           d->row_bytes;
}

/* 1 if chunk (for ids[0..n)) holds exactly the rows of f it should. */
static inline int fx_chunk_matches(const fx_kv *f, const int32_t *ids,
                                   size_t n, const uint8_t *chunk)
{
    const kvt_layout *d = &f->d;
    size_t T = n * d->block_size;
    for (uint32_t l = 0; l < d->num_layers; l++)
        for (uint32_t kv = 0; kv < d->num_kv; kv++)
            for (size_t i = 0; i < T; i++)
                for (uint32_t h = 0; h < d->num_kv_heads; h++) {
                    const uint8_t *row =
                        fx_addr(f, l, kv, (uint64_t)ids[i / d->block_size],
                                i % d->block_size, h);
                    if (memcmp(chunk + fx_canon(d, l, kv, T, i, h), row,
                               d->row_bytes) != 0)
                        return 0;
                }
    return 1;
}

/* n distinct random block ids in [0, num_blocks). */
static inline void fx_ids(uint64_t *seed, uint32_t num_blocks, int32_t *ids,
                          size_t n)
{
    for (size_t i = 0; i < n; i++) {
        int fresh;
        do {
            ids[i] = (int32_t)(fx_rand(seed) % num_blocks);
            fresh = 1;
            for (size_t j = 0; j < i; j++)
                fresh &= ids[j] != ids[i];
        } while (!fresh);
    }
}

#endif /* KVT_FIXTURE_H */
