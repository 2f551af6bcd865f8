/*
 * kvt_cuda_api.h -- the C ABI between kvtier and libkvtier_cuda.so.
 *
 * Design: everything that needs the CUDA runtime lives in one shared
 * library that the daemon (or a client) dlopens only where a GPU exists,
 * so every binary builds, links and runs on machines without CUDA. The
 * library exports one symbol, kvt_cuda_ops_get, returning a static table
 * of function pointers; cuda/gpu.c loads it and checks abi_version and
 * layout_size (kvt_layout crosses this boundary by pointer) before use.
 * Bump KVT_CUDA_ABI_VERSION with any change to this table or kvt_layout.
 *
 * Contract for every entry:
 *  - returns a kvt_err; CUDA failures map to KVT_ENOSPC (device or pinned
 *    memory exhausted), KVT_EINVAL (bad argument), KVT_ENOTSUP (no
 *    driver/device), KVT_EIO (anything else, e.g. a failed kernel).
 *    last_error() returns the text of the calling thread's last failed CUDA
 *    call (diagnostics only; the kvt_err is the error).
 *  - a context is opened once per process and is thread-safe; streams are
 *    bound to a device and each call switches the calling thread to the
 *    stream's (or the named) device.
 *  - gather/scatter/memcpy/memset are asynchronous on the caller's stream:
 *    the tensors and chunks must stay valid, and chunks unread (gather) or
 *    unwritten (scatter) by anyone else, until sync(stream) returns. The
 *    block_ids and chunks arrays are read during the call only.
 *  - gather/scatter validate everything before the first launch (ids in
 *    range, distinct for scatter, chunk_len equal to
 *    kvt_layout_chunk_bytes(d, blocks_per_chunk * block_size), n_blocks a
 *    multiple of blocks_per_chunk, every chunk reachable by the device); on
 *    a validation error nothing is launched. Once launched, a failure (a
 *    faulting kernel) may leave a transfer partly done.
 *  - Chunk pointers may be device memory, pinned or registered host memory
 *    (written directly by the kernel over PCIe/NVLink-C2C), or pageable
 *    host memory where the device can access it (HMM/ATS). The *_staged
 *    variants take any host memory: the kernel works on a device staging
 *    buffer and cudaMemcpyAsync moves whole chunks.
 *  - Layout bases must be device-accessible (device memory, an IPC-opened
 *    mapping, or registered host memory; never pageable host memory);
 *    check_layout verifies that once, at registration, so a bad base never
 *    faults a kernel later. Its error text says which tensor, not what is
 *    mapped where.
 */
#ifndef KVT_CUDA_API_H
#define KVT_CUDA_API_H

#include <stddef.h>
#include <stdint.h>

#include "kvtier.h"
#include "layout.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KVT_CUDA_ABI_VERSION 2
#define KVT_CUDA_SYMBOL "kvt_cuda_ops_get"
#define KVT_CUDA_IPC_HANDLE_LEN 64 /* sizeof(cudaIpcMemHandle_t) */

typedef struct kvt_cuda_ctx kvt_cuda_ctx;       /* one per process */
typedef struct kvt_cuda_stream kvt_cuda_stream; /* a stream + its device */

struct kvt_cuda_ops {
    uint32_t abi_version; /* KVT_CUDA_ABI_VERSION */
    uint32_t layout_size; /* sizeof(kvt_layout) the library was built with */

    /* KVT_ENOTSUP with a reason in why ("no CUDA device", ...) when CUDA
     * cannot be used here. close accepts NULL. */
    kvt_err (*open)(kvt_cuda_ctx **out, char *why, size_t why_len);
    void (*close)(kvt_cuda_ctx *ctx);
    int (*device_count)(const kvt_cuda_ctx *ctx);
    const char *(*last_error)(void);

    /* A new non-blocking stream on device, or (wrap) the caller's existing
     * cudaStream_t, which destroy then leaves alone. */
    kvt_err (*stream_create)(kvt_cuda_ctx *ctx, int device,
                             kvt_cuda_stream **out);
    kvt_err (*stream_wrap)(kvt_cuda_ctx *ctx, int device, void *cuda_stream,
                           kvt_cuda_stream **out);
    void (*stream_destroy)(kvt_cuda_ctx *ctx, kvt_cuda_stream *s);
    /* Wait for everything queued on s (NULL: on every device). */
    kvt_err (*sync)(kvt_cuda_ctx *ctx, kvt_cuda_stream *s);

    /* Pinned host memory, mapped and portable (usable by every device). */
    kvt_err (*host_alloc)(kvt_cuda_ctx *ctx, size_t len, void **out);
    kvt_err (*host_free)(kvt_cuda_ctx *ctx, void *p);
    /* Page-lock [p, p+len) (e.g. the DRAM pool), mapped and portable. */
    kvt_err (*host_register)(kvt_cuda_ctx *ctx, void *p, size_t len);
    kvt_err (*host_unregister)(kvt_cuda_ctx *ctx, void *p);
    kvt_err (*dev_alloc)(kvt_cuda_ctx *ctx, int device, size_t len,
                         void **out);
    kvt_err (*dev_free)(kvt_cuda_ctx *ctx, void *p);
    /* cudaMemcpyDefault / cudaMemset on s. */
    kvt_err (*memcpy_async)(kvt_cuda_ctx *ctx, void *dst, const void *src,
                            size_t len, kvt_cuda_stream *s);
    kvt_err (*memset_async)(kvt_cuda_ctx *ctx, void *dst, int byte,
                            size_t len, kvt_cuda_stream *s);

    /* KVT_EINVAL unless every tensor of d is device-accessible. */
    kvt_err (*check_layout)(kvt_cuda_ctx *ctx, int device,
                            const kvt_layout *d);

    /*
     * Gather blocks block_ids[0..n_blocks) into n_blocks / blocks_per_chunk
     * canonical chunks: chunk c holds blocks [c * bpc, (c + 1) * bpc) and
     * is chunk_len bytes at chunks[c]. All layers of the transfer go in
     * one launch (more only past 1024 blocks).
     */
    kvt_err (*gather)(kvt_cuda_ctx *ctx, const kvt_layout *d,
                      const int32_t *block_ids, size_t n_blocks,
                      size_t blocks_per_chunk, void *const *chunks,
                      size_t chunk_len, kvt_cuda_stream *s);
    kvt_err (*scatter)(kvt_cuda_ctx *ctx, const kvt_layout *d,
                       const int32_t *block_ids, size_t n_blocks,
                       size_t blocks_per_chunk, const void *const *chunks,
                       size_t chunk_len, kvt_cuda_stream *s);
    /* The same through device memory stage[0..stage_len), which must hold
     * at least one chunk and is reused for the next call only in stream
     * order (use it from one stream at a time). */
    kvt_err (*gather_staged)(kvt_cuda_ctx *ctx, const kvt_layout *d,
                             const int32_t *block_ids, size_t n_blocks,
                             size_t blocks_per_chunk, void *const *chunks,
                             size_t chunk_len, void *stage, size_t stage_len,
                             kvt_cuda_stream *s);
    kvt_err (*scatter_staged)(kvt_cuda_ctx *ctx, const kvt_layout *d,
                              const int32_t *block_ids, size_t n_blocks,
                              size_t blocks_per_chunk,
                              const void *const *chunks, size_t chunk_len,
                              void *stage, size_t stage_len,
                              kvt_cuda_stream *s);

    /* CUDA IPC: export a device allocation's handle (engine side), open
     * another process's handle on device (daemon side; peer access is
     * enabled lazily), close what ipc_open returned. */
    kvt_err (*ipc_get)(kvt_cuda_ctx *ctx, void *dev_ptr, void *handle,
                       size_t handle_len);
    kvt_err (*ipc_open)(kvt_cuda_ctx *ctx, int device, const void *handle,
                        size_t handle_len, void **dev_ptr);
    kvt_err (*ipc_close)(kvt_cuda_ctx *ctx, void *dev_ptr);

    /* The allocation holding device address p on device: its first byte
     * and its size (cuMemGetAddressRange). KVT_EINVAL if p is in none.
     * The daemon bounds each registered tensor by the allocation its IPC
     * handle opened, so a client's offsets reach nothing else. */
    kvt_err (*mem_range)(kvt_cuda_ctx *ctx, int device, const void *p,
                         uint64_t *base, uint64_t *size);
};

typedef const struct kvt_cuda_ops *(*kvt_cuda_ops_get_fn)(void);

/* The one symbol libkvtier_cuda.so exports. */
const struct kvt_cuda_ops *kvt_cuda_ops_get(void);

#ifdef __cplusplus
}
#endif
#endif /* KVT_CUDA_API_H */
