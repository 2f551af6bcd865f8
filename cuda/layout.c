/*
 * layout.c -- build and check KV layout descriptors (see layout.h).
 *
 * Design: each kind reduces to one row of numbers -- K/V count, the three
 * strides, the offset between K and V and between layers inside one
 * tensor, and which tensor a (layer, kv) lives in. kvt_layout_init fills
 * that row from the shape, checks every product for overflow (a descriptor
 * that validated can never compute an address outside its tensors for an
 * in-range block id), then expands the per-(layer, kv) bases. Nothing here
 * touches tensor memory, so it serves device and host tensors alike and
 * is compiled into the CUDA library too.
 */
#include "layout.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The row of numbers one kind reduces to. */
struct lay_geom {
    uint32_t num_kv;
    uint64_t block_stride, token_stride, head_stride;
    uint64_t kv_off;       /* K to V inside one tensor */
    uint64_t layer_off;    /* layer to layer inside one tensor */
    uint64_t tensor_bytes;
};

static const char *const lay_names[KVT_LAYOUT_KIND_COUNT] = {
    [KVT_LAYOUT_NONE] = "none",
    [KVT_LAYOUT_VLLM_FLASH_NHD] = "vllm-flash-nhd",
    [KVT_LAYOUT_VLLM_FLASH_HND] = "vllm-flash-hnd",
    [KVT_LAYOUT_FLASHINFER_NHD] = "flashinfer-nhd",
    [KVT_LAYOUT_FLASHINFER_HND] = "flashinfer-hnd",
    [KVT_LAYOUT_VLLM_CROSS_NHD] = "vllm-cross-nhd",
    [KVT_LAYOUT_VLLM_CROSS_HND] = "vllm-cross-hnd",
    [KVT_LAYOUT_SGLANG_MHA] = "sglang-mha",
    [KVT_LAYOUT_MLA] = "mla",
    [KVT_LAYOUT_CUSTOM] = "custom",
};

const char *kvt_layout_kind_name(kvt_layout_kind kind)
{
    if ((unsigned)kind >= KVT_LAYOUT_KIND_COUNT)
        return "?";
    return lay_names[kind];
}

kvt_layout_kind kvt_layout_kind_parse(const char *name)
{
    if (name == NULL)
        return KVT_LAYOUT_NONE;
    for (int k = 1; k < KVT_LAYOUT_KIND_COUNT; k++)
        if (strcmp(name, lay_names[k]) == 0)
            return (kvt_layout_kind)k;
    return KVT_LAYOUT_NONE;
}

size_t kvt_layout_n_bases(kvt_layout_kind kind, uint32_t num_layers,
                          uint32_t num_kv)
{
    switch (kind) {
    case KVT_LAYOUT_VLLM_FLASH_NHD:
    case KVT_LAYOUT_VLLM_FLASH_HND:
    case KVT_LAYOUT_FLASHINFER_NHD:
    case KVT_LAYOUT_FLASHINFER_HND:
    case KVT_LAYOUT_MLA:
        return num_layers;
    case KVT_LAYOUT_VLLM_CROSS_NHD:
    case KVT_LAYOUT_VLLM_CROSS_HND:
        return 1;
    case KVT_LAYOUT_SGLANG_MHA:
        return (size_t)num_layers * 2;
    case KVT_LAYOUT_CUSTOM:
        return (size_t)num_layers * num_kv;
    default:
        return 0;
    }
}

/* a * b into *out; 0 on overflow. */
static int mul_ok(uint64_t a, uint64_t b, uint64_t *out)
{
    return !__builtin_mul_overflow(a, b, out);
}

/* Products every kind needs: R, plane = B*H*R, N*plane, L*2*plane. */
struct lay_dims {
    uint64_t row, plane, n_plane, l2_plane;
};

static int lay_dims(const kvt_layout_params *p, struct lay_dims *d)
{
    uint64_t bh;
    return mul_ok(p->head_size, p->elem_size, &d->row) &&
           mul_ok(p->block_size, p->num_kv_heads, &bh) &&
           mul_ok(bh, d->row, &d->plane) &&
           mul_ok(d->plane, p->num_blocks, &d->n_plane) &&
           mul_ok(d->plane, 2ull * p->num_layers, &d->l2_plane);
}

/* Per-layer kinds: vLLM (2, N, ...) and FlashInfer (N, 2, ...). */
static int geom_per_layer(const kvt_layout_params *p,
                          const struct lay_dims *d, struct lay_geom *g)
{
    int hnd = p->kind == KVT_LAYOUT_VLLM_FLASH_HND ||
              p->kind == KVT_LAYOUT_FLASHINFER_HND;
    int vllm = p->kind == KVT_LAYOUT_VLLM_FLASH_NHD ||
               p->kind == KVT_LAYOUT_VLLM_FLASH_HND;
    g->num_kv = 2;
    g->token_stride = hnd ? d->row : d->row * p->num_kv_heads;
    g->head_stride = hnd ? d->row * p->block_size : d->row;
    g->block_stride = vllm ? d->plane : 2 * d->plane;
    g->kv_off = vllm ? d->n_plane : d->plane;
    return mul_ok(d->n_plane, 2, &g->tensor_bytes);
}

/* vLLM cross-layer: (N, L, 2, B, H, D) or (N, H, L, 2, B, D). */
static int geom_cross(const kvt_layout_params *p, const struct lay_dims *d,
                      struct lay_geom *g)
{
    g->num_kv = 2;
    g->block_stride = d->l2_plane;
    if (p->kind == KVT_LAYOUT_VLLM_CROSS_NHD) {
        g->token_stride = d->row * p->num_kv_heads;
        g->head_stride = d->row;
        g->kv_off = d->plane;
    } else {
        g->token_stride = d->row;
        g->head_stride = d->l2_plane / p->num_kv_heads;
        g->kv_off = d->row * p->block_size;
    }
    g->layer_off = 2 * g->kv_off;
    return mul_ok(d->l2_plane, p->num_blocks, &g->tensor_bytes);
}

static kvt_err geom_custom(const kvt_layout_params *p,
                           const struct lay_dims *d, struct lay_geom *g)
{
    uint64_t a, b, c;
    if (p->num_kv != 1 && p->num_kv != 2)
        return KVT_EINVAL;
    if ((p->num_blocks > 1 && p->block_stride == 0) ||
        (p->block_size > 1 && p->token_stride == 0) ||
        (p->num_kv_heads > 1 && p->head_stride == 0))
        return KVT_EINVAL;
    if (p->block_stride % p->elem_size || p->token_stride % p->elem_size ||
        p->head_stride % p->elem_size)
        return KVT_EINVAL;
    g->num_kv = p->num_kv;
    g->block_stride = p->block_stride;
    g->token_stride = p->token_stride;
    g->head_stride = p->head_stride;
    /* Extent of one tensor: the last row's end. */
    if (mul_ok(p->num_blocks - 1, p->block_stride, &a) &&
        mul_ok(p->block_size - 1, p->token_stride, &b) &&
        mul_ok(p->num_kv_heads - 1, p->head_stride, &c) &&
        !__builtin_add_overflow(a, b, &a) &&
        !__builtin_add_overflow(a, c, &a) &&
        !__builtin_add_overflow(a, d->row, &g->tensor_bytes))
        return KVT_OK;
    return KVT_ETOOBIG;
}

/* The geometry of p's kind: KVT_ETOOBIG on overflow, KVT_EINVAL for a
 * bad CUSTOM description. */
static kvt_err lay_geom_of(const kvt_layout_params *p, struct lay_geom *g)
{
    struct lay_dims d;
    memset(g, 0, sizeof(*g));
    if (!lay_dims(p, &d))
        return KVT_ETOOBIG;
    switch (p->kind) {
    case KVT_LAYOUT_VLLM_FLASH_NHD:
    case KVT_LAYOUT_VLLM_FLASH_HND:
    case KVT_LAYOUT_FLASHINFER_NHD:
    case KVT_LAYOUT_FLASHINFER_HND:
        return geom_per_layer(p, &d, g) ? KVT_OK : KVT_ETOOBIG;
    case KVT_LAYOUT_VLLM_CROSS_NHD:
    case KVT_LAYOUT_VLLM_CROSS_HND:
        return geom_cross(p, &d, g) ? KVT_OK : KVT_ETOOBIG;
    case KVT_LAYOUT_SGLANG_MHA:
    case KVT_LAYOUT_MLA:
        g->num_kv = p->kind == KVT_LAYOUT_MLA ? 1 : 2;
        g->block_stride = d.plane;
        g->token_stride = d.row * p->num_kv_heads;
        g->head_stride = d.row;
        g->tensor_bytes = d.n_plane;
        return KVT_OK;
    case KVT_LAYOUT_CUSTOM:
        return geom_custom(p, &d, g);
    default:
        return KVT_EINVAL;
    }
}

/* Shape checks that need no arithmetic. */
static kvt_err lay_check_params(const kvt_layout_params *p)
{
    if (p->kind <= KVT_LAYOUT_NONE || p->kind >= KVT_LAYOUT_KIND_COUNT)
        return KVT_EINVAL;
    if (p->num_layers == 0 || p->num_layers > KVT_LAYOUT_MAX_LAYERS ||
        p->num_blocks == 0 || p->num_blocks > INT32_MAX ||
        p->block_size == 0 || p->num_kv_heads == 0 || p->head_size == 0)
        return KVT_EINVAL;
    if (p->elem_size != 1 && p->elem_size != 2 && p->elem_size != 4)
        return KVT_EINVAL;
    if (p->kind == KVT_LAYOUT_MLA && p->num_kv_heads != 1)
        return KVT_EINVAL;
    if (p->bases == NULL ||
        p->n_bases != kvt_layout_n_bases(p->kind, p->num_layers, p->num_kv))
        return KVT_EINVAL;
    return KVT_OK;
}

/* Which of params.bases (l, kv) lives in. */
static size_t lay_tensor_of(const kvt_layout_params *p, uint32_t l,
                            uint32_t kv, uint32_t num_kv)
{
    switch (p->kind) {
    case KVT_LAYOUT_VLLM_CROSS_NHD:
    case KVT_LAYOUT_VLLM_CROSS_HND:
        return 0;
    case KVT_LAYOUT_SGLANG_MHA:
        return (size_t)kv * p->num_layers + l;
    case KVT_LAYOUT_CUSTOM:
        return (size_t)l * num_kv + kv;
    default:
        return l;
    }
}

kvt_err kvt_layout_init(kvt_layout *out, const kvt_layout_params *p)
{
    struct lay_geom g;
    if (out == NULL || p == NULL)
        return KVT_EINVAL;
    kvt_err err = lay_check_params(p);
    if (err != KVT_OK)
        return err;
    err = lay_geom_of(p, &g);
    if (err != KVT_OK)
        return err;
    for (size_t i = 0; i < p->n_bases; i++) {
        uint64_t end;
        if (p->bases[i] == 0 || p->bases[i] % p->elem_size != 0)
            return KVT_EINVAL;
        if (__builtin_add_overflow(p->bases[i], g.tensor_bytes, &end))
            return KVT_ETOOBIG;
    }
    memset(out, 0, sizeof(*out));
    out->kind = p->kind;
    out->num_layers = p->num_layers;
    out->num_kv = g.num_kv;
    out->num_blocks = p->num_blocks;
    out->block_size = p->block_size;
    out->num_kv_heads = p->num_kv_heads;
    out->head_size = p->head_size;
    out->elem_size = p->elem_size;
    out->row_bytes = (uint64_t)p->head_size * p->elem_size;
    out->block_stride = g.block_stride;
    out->token_stride = g.token_stride;
    out->head_stride = g.head_stride;
    out->tensor_bytes = g.tensor_bytes;
    for (uint32_t l = 0; l < p->num_layers; l++)
        for (uint32_t kv = 0; kv < g.num_kv; kv++)
            out->base[l * g.num_kv + kv] =
                p->bases[lay_tensor_of(p, l, kv, g.num_kv)] +
                l * g.layer_off + kv * g.kv_off;
    return KVT_OK;
}

size_t kvt_layout_chunk_bytes(const kvt_layout *d, size_t n_tokens)
{
    uint64_t a, b, c;
    if (d == NULL)
        return 0;
    if (!mul_ok((uint64_t)d->num_layers * d->num_kv, n_tokens, &a) ||
        !mul_ok(a, d->num_kv_heads, &b) || !mul_ok(b, d->row_bytes, &c) ||
        c > SIZE_MAX)
        return 0;
    return (size_t)c;
}

int kvt_layout_same_shape(const kvt_layout *a, const kvt_layout *b)
{
    return a->num_layers == b->num_layers && a->num_kv == b->num_kv &&
           a->num_kv_heads == b->num_kv_heads &&
           a->head_size == b->head_size && a->elem_size == b->elem_size;
}

int kvt_layout_shape_str(const kvt_layout *d, char *buf, size_t len)
{
    return snprintf(buf, len, "l%u.kv%u.h%u.d%u.e%u", d->num_layers,
                    d->num_kv, d->num_kv_heads, d->head_size, d->elem_size);
}

/* Duplicate check for large n: one bit per block of the layout. */
static kvt_err lay_check_unique_bitmap(const kvt_layout *d,
                                       const int32_t *ids, size_t n)
{
    uint64_t *seen = calloc((d->num_blocks + 63) / 64, sizeof(*seen));
    kvt_err err = KVT_OK;
    if (seen == NULL)
        return KVT_ENOMEM;
    for (size_t i = 0; i < n; i++) {
        uint32_t b = (uint32_t)ids[i];
        uint64_t bit = 1ull << (b % 64);
        if (seen[b / 64] & bit) {
            err = KVT_EINVAL;
            break;
        }
        seen[b / 64] |= bit;
    }
    free(seen);
    return err;
}

kvt_err kvt_layout_check_blocks(const kvt_layout *d, const int32_t *ids,
                                size_t n, int unique)
{
    if (d == NULL || ids == NULL || n == 0)
        return KVT_EINVAL;
    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0 || (uint32_t)ids[i] >= d->num_blocks)
            return KVT_EINVAL;
    if (!unique)
        return KVT_OK;
    if (n > 32)
        return lay_check_unique_bitmap(d, ids, n);
    for (size_t i = 1; i < n; i++)
        for (size_t j = 0; j < i; j++)
            if (ids[i] == ids[j])
                return KVT_EINVAL;
    return KVT_OK;
}
