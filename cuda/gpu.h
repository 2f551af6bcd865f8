/*
 * gpu.h -- load the CUDA half of kvtier at run time, where a GPU exists.
 *
 * Design: nothing that links libkvtier or kvtierd depends on CUDA at link
 * time. kvt_gpu_open dlopens libkvtier_cuda.so, checks its ABI and opens a
 * CUDA context; on a machine without a driver or device it fails with
 * KVT_ENOTSUP and a one-line reason the daemon shows in `status`. The
 * wrappers below are the calls the daemon needs for REGISTER_KV_CACHE,
 * SAVE and LOAD; kvt_gpu_ops reaches the rest of kvt_cuda_api.h.
 *
 * Where the library is looked for, first match wins:
 *   1. $KVT_CUDA_LIB (the file itself),
 *   2. libdir/libkvtier_cuda.so if libdir is not NULL,
 *   3. the directory of the shared object holding this code (libkvtier.so
 *      in an engine process),
 *   4. <directory of the running binary>/../lib (kvtierd in bin/).
 *
 * A kvt_gpu is thread-safe (every entry is). The library stays mapped for
 * the life of the process (CUDA's runtime does not unload cleanly).
 */
#ifndef KVT_GPU_H
#define KVT_GPU_H

#include <stddef.h>
#include <stdint.h>

#include "kvt_cuda_api.h"
#include "kvtier.h"
#include "layout.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KVT_CUDA_LIB_NAME "libkvtier_cuda.so"
#define KVT_CUDA_LIB_ENV "KVT_CUDA_LIB"

struct kvt_gpu;

/*
 * Load and initialise. On KVT_OK *out is the caller's, freed by
 * kvt_gpu_close. Otherwise why (why_len bytes, may be 0) holds the reason:
 * "libkvtier_cuda.so not found (...)", "libcudart not found: ...",
 * "no CUDA driver (...)", "no CUDA device", ...; the error is KVT_ENOTSUP
 * for everything a machine simply lacks, KVT_ENOMEM/KVT_EPROTO otherwise.
 */
kvt_err kvt_gpu_open(const char *libdir, struct kvt_gpu **out, char *why,
                     size_t why_len);
/* Close the CUDA context handle and free; accepts NULL. */
void kvt_gpu_close(struct kvt_gpu *g);

const struct kvt_cuda_ops *kvt_gpu_ops(const struct kvt_gpu *g);
kvt_cuda_ctx *kvt_gpu_ctx(const struct kvt_gpu *g);
int kvt_gpu_device_count(const struct kvt_gpu *g);
/* Path the library was loaded from. */
const char *kvt_gpu_lib_path(const struct kvt_gpu *g);
/* Text of the calling thread's last failed CUDA call (never NULL). */
const char *kvt_gpu_last_error(const struct kvt_gpu *g);

/* Streams: one per worker thread and device is the intended use. */
kvt_err kvt_gpu_stream_create(struct kvt_gpu *g, int device,
                              kvt_cuda_stream **out);
void kvt_gpu_stream_destroy(struct kvt_gpu *g, kvt_cuda_stream *s);
kvt_err kvt_gpu_sync(struct kvt_gpu *g, kvt_cuda_stream *s);

/* Register the DRAM pool once, so kernels write chunks straight into it. */
kvt_err kvt_gpu_host_register(struct kvt_gpu *g, void *p, size_t len);
kvt_err kvt_gpu_host_unregister(struct kvt_gpu *g, void *p);

/* REGISTER_KV_CACHE: open each engine tensor's IPC handle on device; build
 * a kvt_layout over the returned addresses; then check it once. */
kvt_err kvt_gpu_ipc_open(struct kvt_gpu *g, int device, const void *handle,
                         size_t handle_len, void **dev_ptr);
kvt_err kvt_gpu_ipc_close(struct kvt_gpu *g, void *dev_ptr);
kvt_err kvt_gpu_check_layout(struct kvt_gpu *g, int device,
                             const kvt_layout *d);
/* The allocation holding device address p: [*base, *base + *size). */
kvt_err kvt_gpu_mem_range(struct kvt_gpu *g, int device, const void *p,
                          uint64_t *base, uint64_t *size);

/* SAVE / LOAD: asynchronous on s; see kvt_cuda_api.h for the contract. */
kvt_err kvt_gpu_gather(struct kvt_gpu *g, const kvt_layout *d,
                       const int32_t *block_ids, size_t n_blocks,
                       size_t blocks_per_chunk, void *const *chunks,
                       size_t chunk_len, kvt_cuda_stream *s);
kvt_err kvt_gpu_scatter(struct kvt_gpu *g, const kvt_layout *d,
                        const int32_t *block_ids, size_t n_blocks,
                        size_t blocks_per_chunk, const void *const *chunks,
                        size_t chunk_len, kvt_cuda_stream *s);

#ifdef __cplusplus
}
#endif
#endif /* KVT_GPU_H */
