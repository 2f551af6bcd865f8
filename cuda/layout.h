/*
 * layout.h -- where an engine keeps its paged KV cache, and the one byte
 * order kvtier keeps it in.
 *
 * Design: every attention backend we know stores, per layer and per K/V,
 * a grid of rows: block b, token t (within the block), head h, and a row of
 * head_size elements that is always contiguous. So one descriptor covers
 * them all: a base address per (layer, kv) plus three byte strides
 *
 *     addr(l, kv, b, t, h) = base[l * num_kv + kv]
 *                          + b * block_stride + t * token_stride
 *                          + h * head_stride,      row_bytes contiguous
 *
 * and the strides are the same for every layer. kvt_layout_init derives the
 * bases and strides from the engine's tensor addresses and shape, for each
 * kind below (R = head_size * elem_size, H = num_kv_heads, B = block_size,
 * N = num_blocks, L = num_layers; shapes are physical, outermost first):
 *
 *  kind                 tensors (bases[])      physical shape
 *  VLLM_FLASH_NHD       L, one per layer       (2, N, B, H, head_size)
 *  VLLM_FLASH_HND       L, one per layer       (2, N, H, B, head_size)
 *  FLASHINFER_NHD       L, one per layer       (N, 2, B, H, head_size)
 *  FLASHINFER_HND       L, one per layer       (N, 2, H, B, head_size)
 *  VLLM_CROSS_NHD       1 for all layers       (N, L, 2, B, H, head_size)
 *  VLLM_CROSS_HND       1 for all layers       (N, H, L, 2, B, head_size)
 *  SGLANG_MHA           2L: K[0..L), V[0..L)   (N*B, H, head_size) each
 *  MLA                  L, one per layer       (N, B, head_size), no V, H=1
 *  CUSTOM               L*num_kv, caller's strides
 *
 * The two VLLM_CROSS kinds are vLLM's cross-layer allocation (a KV
 * connector with prefer_cross_layer_blocks; FlashAttention stride order
 * with the layers dimension): logically (L, 2, N, B, H, D), laid out
 * blocks-first so one block of every layer is one contiguous run. SGLang's
 * token pools address token slots; a page of page_size slots is a block
 * (block b, token t is slot b * B + t), so N = slots / page_size. SGLang's
 * MLA pool (slots, 1, latent) is the MLA kind with B = page_size.
 *
 * Canonical chunk (the bytes kvtier stores, identical for every kind, so
 * a chunk saved from one kind loads into any other of the same shape):
 * a chunk covers T = n_blocks * B tokens, token i of the chunk being token
 * i % B of block_ids[i / B]. It is K * L * T * H * R bytes (K = num_kv:
 * 2, or 1 for MLA) and byte r of (layer l, kv k, token i, head h) is at
 *
 *     (((l * K + k) * T + i) * H + h) * R + r
 *
 * i.e. [layer][k_or_v][token][head][row bytes], K before V. Two
 * descriptors are chunk-compatible when L, K, H, head_size and elem_size
 * agree (kvt_layout_same_shape); kvt_layout_shape_str names that shape
 * for a namespace, so chunks of different shapes never meet.
 *
 * Addresses are uint64_t because bases are usually device pointers (maybe
 * opened from another process's IPC handle): nothing here dereferences
 * them. The CPU gather/scatter do, so give them host tensors.
 *
 * A kvt_layout is a plain value (no allocation, copy it freely); the
 * tensors it points at stay the caller's.
 */
#ifndef KVT_LAYOUT_H
#define KVT_LAYOUT_H

#include <stddef.h>
#include <stdint.h>

#include "kvtier.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KVT_LAYOUT_MAX_LAYERS 256

/* kvt_layout_kind and kvt_layout_params are public: see kvtier.h. */

/* A validated descriptor. Read the fields; write only cpu_threads. */
typedef struct kvt_layout {
    kvt_layout_kind kind;
    uint32_t num_layers, num_kv, num_blocks, block_size;
    uint32_t num_kv_heads, head_size, elem_size;
    uint32_t cpu_threads;  /* CPU gather/scatter threads; 0: automatic */
    uint64_t row_bytes;    /* head_size * elem_size, contiguous */
    uint64_t block_stride, token_stride, head_stride;
    uint64_t tensor_bytes; /* size of each tensor named in params.bases */
    uint64_t base[KVT_LAYOUT_MAX_LAYERS * 2]; /* [l * num_kv + kv] */
} kvt_layout;

/*
 * Validate p and fill *out (written only on KVT_OK). KVT_EINVAL for an
 * unknown kind, a zero or oversized dimension, a wrong number of bases, a
 * NULL or misaligned base, MLA with num_kv_heads != 1, elem_size not 1, 2
 * or 4; KVT_ETOOBIG when a tensor's byte size would overflow.
 */
kvt_err kvt_layout_init(kvt_layout *out, const kvt_layout_params *p);

/* Number of tensor addresses kind expects for num_layers layers (CUSTOM:
 * num_layers * num_kv), 0 for an unknown kind. */
size_t kvt_layout_n_bases(kvt_layout_kind kind, uint32_t num_layers,
                          uint32_t num_kv);

/* Bytes of a canonical chunk of n_tokens tokens; 0 on overflow. */
size_t kvt_layout_chunk_bytes(const kvt_layout *d, size_t n_tokens);

/* 1 if chunks of a and b are interchangeable (L, K, H, head, elem). */
int kvt_layout_same_shape(const kvt_layout *a, const kvt_layout *b);

/* "l32.kv2.h8.d128.e2": the chunk shape, for namespaces. Returns what
 * snprintf returns. */
int kvt_layout_shape_str(const kvt_layout *d, char *buf, size_t len);

/* "vllm-flash-nhd", ...; "?" if unknown. Parse returns KVT_LAYOUT_NONE for
 * an unknown name. */
const char *kvt_layout_kind_name(kvt_layout_kind kind);
kvt_layout_kind kvt_layout_kind_parse(const char *name);

/*
 * Check a transfer's block ids: n > 0, every id in [0, num_blocks), and,
 * if unique, no id twice (a scatter must not write one block twice).
 * KVT_EINVAL otherwise; KVT_ENOMEM if the duplicate check cannot allocate.
 */
kvt_err kvt_layout_check_blocks(const kvt_layout *d, const int32_t *ids,
                                size_t n, int unique);

/*
 * CPU reference gather: copy blocks block_ids[0..n_blocks) of the tensors
 * d describes (host addresses) into one canonical chunk at dst of dst_len
 * bytes. dst_len must equal kvt_layout_chunk_bytes(d, n_blocks *
 * block_size). On any error nothing is written. Copies run over (layer,
 * kv) on up to d->cpu_threads threads (0: automatic, one below 4 MiB).
 */
kvt_err kvt_gather_cpu(const kvt_layout *d, const int32_t *block_ids,
                       size_t n_blocks, void *dst, size_t dst_len);

/* CPU reference scatter: the reverse; block ids must be distinct. */
kvt_err kvt_scatter_cpu(const kvt_layout *d, const int32_t *block_ids,
                        size_t n_blocks, const void *src, size_t src_len);

#ifdef __cplusplus
}
#endif
#endif /* KVT_LAYOUT_H */
