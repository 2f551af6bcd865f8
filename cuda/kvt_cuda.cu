/*
 * kvt_cuda.cu -- GPU gather/scatter between an engine's paged KV cache and
 * canonical chunks, behind the C ABI of kvt_cuda_api.h.
 *
 * Design: a transfer is a list of block ids cut into chunks of
 * blocks_per_chunk blocks; the canonical chunk (layout.h) keeps one
 * (layer, kv) pair of one block as one contiguous run, so the whole
 * transfer is a grid of (pair, block, token tile) pieces, each a
 * contiguous range on the chunk side and rows of row_bytes on the engine
 * side. One launch covers every layer: gridDim.y = layers * kv,
 * gridDim.x = blocks * token tiles. Each thread moves vectors of the widest
 * size every address allows (16 bytes, else 8, 4, 2, 1, decided on the
 * host from the strides, bases and chunk addresses) and issues XF_UNROLL
 * loads before its stores, so reads from host memory over PCIe have many
 * requests in flight.
 *
 * Everything a launch needs -- the per-layer bases, up to 1024 block ids
 * and the chunk addresses -- travels in the kernel parameters (16 KiB,
 * allowed since CUDA 12.1 on Volta and newer; nvcc checks the size for
 * sm_90), marked __grid_constant__ so the kernel reads them in place.
 * So a call needs no device scratch, no upload and no synchronisation,
 * block ids may be reused as soon as the call returns, and the only state
 * is the per-process context (device count and capabilities).
 *
 * Chunk pointers are resolved with cudaPointerGetAttributes before any
 * launch: registered host memory (the DRAM pool) is written through its
 * device mapping; memory the device cannot reach is refused, since a
 * faulting kernel would poison the CUDA context of the whole process.
 */
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvt_cuda_api.h"

#define XF_MAX_BLOCKS 1024 /* block ids per launch */
#define XF_THREADS 256
#define XF_UNROLL 4
#define XF_TILE_VECS (XF_THREADS * XF_UNROLL * 2)
#define XF_MAX_DEVICES 64

struct kvt_cuda_ctx {
    int n_dev;
    unsigned char pageable[XF_MAX_DEVICES]; /* device reads pageable RAM */
};

struct kvt_cuda_stream {
    cudaStream_t s;
    int device;
    int owned;
};

/* Kernel parameters of one launch. */
struct xf_args {
    uint64_t base[KVT_LAYOUT_MAX_LAYERS * 2]; /* per (layer, kv) */
    uint64_t chunk[XF_MAX_BLOCKS];            /* device addresses */
    int32_t block[XF_MAX_BLOCKS];
    uint64_t block_stride, token_stride, head_stride;
    uint64_t pair_bytes;  /* one (layer, kv) of a chunk */
    uint32_t block_size, heads, row_vecs, bpc;
    uint32_t blk_off;     /* index in chunk[0] of this launch's block 0 */
    uint32_t tile_tokens, n_tiles;
};

static thread_local char xf_errbuf[256];

static kvt_err xf_fail(cudaError_t e, const char *what)
{
    snprintf(xf_errbuf, sizeof(xf_errbuf), "%s: %s (%d)", what,
             cudaGetErrorString(e), (int)e);
    cudaGetLastError(); /* clear a non-sticky error */
    switch (e) {
    case cudaErrorMemoryAllocation:
        return KVT_ENOSPC;
    case cudaErrorInvalidValue:
    case cudaErrorInvalidDevicePointer:
    case cudaErrorInvalidDevice:
    case cudaErrorInvalidResourceHandle:
    case cudaErrorHostMemoryAlreadyRegistered:
    case cudaErrorHostMemoryNotRegistered:
        return KVT_EINVAL;
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
        return KVT_ENOTSUP;
    default:
        return KVT_EIO;
    }
}

static kvt_err xf_bad(const char *what)
{
    snprintf(xf_errbuf, sizeof(xf_errbuf), "%s", what);
    return KVT_EINVAL;
}

#define XF_TRY(call)                                                        \
    do {                                                                    \
        cudaError_t xf_e_ = (call);                                         \
        if (xf_e_ != cudaSuccess)                                           \
            return xf_fail(xf_e_, #call);                                   \
    } while (0)

/* ------------------------------------------------------------ kernels -- */

/* Unrolled on the device; the host compiler (emulation) does its own. */
#ifdef __CUDA_ARCH__
#define XF_PRAGMA_UNROLL _Pragma("unroll")
#else
#define XF_PRAGMA_UNROLL
#endif

/* Engine-side address of vector i of a tile. */
template <typename V>
__host__ __device__ __forceinline__ V *xf_row(const xf_args &a, char *tens,
                                              uint32_t i, uint32_t per_tok)
{
    uint32_t t = i / per_tok, r = i - t * per_tok;
    uint32_t h = r / a.row_vecs, v = r - h * a.row_vecs;
    return (V *)(tens + t * a.token_stride + h * a.head_stride) + v;
}

/*
 * What thread tx of CUDA block (bx, by) moves. Host-callable so that
 * cuda/test/emu_check.cu runs exactly this code over an emulated grid on
 * machines without a GPU.
 */
template <typename V, bool GATHER>
__host__ __device__ __forceinline__ void
xf_body(const xf_args &a, uint32_t bx, uint32_t by, uint32_t tx)
{
    const uint32_t pair = by;
    const uint32_t bi = bx / a.n_tiles;
    const uint32_t t0 = (bx - bi * a.n_tiles) * a.tile_tokens;
    const uint32_t left = a.block_size - t0;
    const uint32_t nt = a.tile_tokens < left ? a.tile_tokens : left;
    const uint32_t g = a.blk_off + bi;
    const uint32_t ci = g / a.bpc;
    const uint64_t tok = (uint64_t)(g - ci * a.bpc) * a.block_size + t0;
    const uint32_t per_tok = a.heads * a.row_vecs;
    const uint32_t total = nt * per_tok;
    char *tens = (char *)a.base[pair] +
                 (uint64_t)a.block[bi] * a.block_stride +
                 (uint64_t)t0 * a.token_stride;
    V *chk = (V *)((char *)a.chunk[ci] + pair * a.pair_bytes) +
             tok * per_tok;

    for (uint32_t i0 = tx; i0 < total; i0 += XF_THREADS * XF_UNROLL) {
        V v[XF_UNROLL] = {};
        XF_PRAGMA_UNROLL
        for (int u = 0; u < XF_UNROLL; u++) {
            uint32_t i = i0 + u * XF_THREADS;
            if (i < total)
                v[u] = GATHER ? *xf_row<V>(a, tens, i, per_tok) : chk[i];
        }
        XF_PRAGMA_UNROLL
        for (int u = 0; u < XF_UNROLL; u++) {
            uint32_t i = i0 + u * XF_THREADS;
            if (i >= total)
                continue;
            if (GATHER)
                chk[i] = v[u];
            else
                *xf_row<V>(a, tens, i, per_tok) = v[u];
        }
    }
}

template <typename V, bool GATHER>
__global__ void __launch_bounds__(XF_THREADS)
    xf_kernel(const __grid_constant__ xf_args a)
{
    xf_body<V, GATHER>(a, blockIdx.x, blockIdx.y, threadIdx.x);
}

template <typename V>
static void xf_launch_v(const xf_args &a, dim3 grid, bool gather,
                        cudaStream_t s)
{
    if (gather)
        xf_kernel<V, true><<<grid, XF_THREADS, 0, s>>>(a);
    else
        xf_kernel<V, false><<<grid, XF_THREADS, 0, s>>>(a);
}

/* Launches one kernel of a transfer; returns the launch error. */
typedef cudaError_t (*xf_launch_fn)(const xf_args &a, dim3 grid,
                                    unsigned width, bool gather,
                                    cudaStream_t s);

static cudaError_t xf_launch(const xf_args &a, dim3 grid, unsigned width,
                             bool gather, cudaStream_t s)
{
    cudaGetLastError(); /* the error we return must be this launch's */
    switch (width) {
    case 16: xf_launch_v<uint4>(a, grid, gather, s); break;
    case 8: xf_launch_v<uint2>(a, grid, gather, s); break;
    case 4: xf_launch_v<uint32_t>(a, grid, gather, s); break;
    case 2: xf_launch_v<uint16_t>(a, grid, gather, s); break;
    default: xf_launch_v<uint8_t>(a, grid, gather, s); break;
    }
    return cudaGetLastError();
}

/* --------------------------------------------------------- transfers -- */

/* Widest vector every address of the transfer is aligned to. */
static unsigned xf_width(const kvt_layout *d, const uint64_t *chunks,
                         size_t n_chunks)
{
    uint64_t acc = d->row_bytes | d->token_stride | d->head_stride |
                   d->block_stride;
    for (uint32_t p = 0; p < d->num_layers * d->num_kv; p++)
        acc |= d->base[p];
    for (size_t c = 0; c < n_chunks; c++)
        acc |= chunks[c];
    for (unsigned w = 16; w > 1; w /= 2)
        if (acc % w == 0)
            return w;
    return 1;
}

/* The parts of the launch parameters every launch of a transfer shares. */
static void xf_args_init(xf_args *a, const kvt_layout *d, size_t bpc,
                         unsigned width)
{
    uint32_t per_tok, tile;
    memcpy(a->base, d->base, sizeof(uint64_t) * d->num_layers * d->num_kv);
    a->block_stride = d->block_stride;
    a->token_stride = d->token_stride;
    a->head_stride = d->head_stride;
    a->block_size = d->block_size;
    a->heads = d->num_kv_heads;
    a->row_vecs = (uint32_t)(d->row_bytes / width);
    a->bpc = (uint32_t)bpc;
    a->pair_bytes = (uint64_t)bpc * d->block_size * d->num_kv_heads *
                    d->row_bytes;
    per_tok = a->heads * a->row_vecs;
    tile = per_tok >= XF_TILE_VECS ? 1 : XF_TILE_VECS / per_tok;
    a->tile_tokens = tile < d->block_size ? tile : d->block_size;
    a->n_tiles = (d->block_size + a->tile_tokens - 1) / a->tile_tokens;
}

/* Launch a validated transfer whose chunks are device addresses. */
static kvt_err xf_run(const kvt_layout *d, const int32_t *ids, size_t n,
                      size_t bpc, const uint64_t *chunks, bool gather,
                      cudaStream_t s, xf_launch_fn launch)
{
    unsigned width = xf_width(d, chunks, n / bpc);
    xf_args *a = (xf_args *)malloc(sizeof(*a));
    if (a == NULL)
        return KVT_ENOMEM;
    xf_args_init(a, d, bpc, width);
    for (size_t s0 = 0; s0 < n;) {
        size_t m = n - s0 < XF_MAX_BLOCKS ? n - s0 : XF_MAX_BLOCKS;
        if (m > INT32_MAX / a->n_tiles) /* huge blocks: fewer per launch */
            m = INT32_MAX / a->n_tiles;
        size_t c0 = s0 / bpc;
        a->blk_off = (uint32_t)(s0 - c0 * bpc);
        size_t n_ch = (a->blk_off + m + bpc - 1) / bpc;
        memcpy(a->chunk, chunks + c0, n_ch * sizeof(uint64_t));
        memcpy(a->block, ids + s0, m * sizeof(int32_t));
        dim3 grid((unsigned)(m * a->n_tiles), d->num_layers * d->num_kv);
        cudaError_t e = launch(*a, grid, width, gather, s);
        if (e != cudaSuccess) {
            free(a);
            return xf_fail(e, "gather/scatter kernel launch");
        }
        s0 += m;
    }
    free(a);
    return KVT_OK;
}

/* Device address through which the device reaches [p, p + len) in a
 * kernel, or 0 if it cannot. */
static uint64_t xf_dev_addr(const kvt_cuda_ctx *ctx, int device,
                            const void *p, size_t len)
{
    cudaPointerAttributes a0, a1;
    const char *last = (const char *)p + len - 1;
    if (cudaPointerGetAttributes(&a0, p) != cudaSuccess ||
        cudaPointerGetAttributes(&a1, last) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    if (a0.type != a1.type)
        return 0;
    switch (a0.type) {
    case cudaMemoryTypeDevice:
        return a0.device == device && a1.device == device
                   ? (uint64_t)(uintptr_t)p : 0;
    case cudaMemoryTypeManaged:
        return (uint64_t)(uintptr_t)p;
    case cudaMemoryTypeHost:
        if (a0.devicePointer == NULL ||
            (const char *)a1.devicePointer !=
                (const char *)a0.devicePointer + len - 1)
            return 0;
        return (uint64_t)(uintptr_t)a0.devicePointer;
    default: /* unregistered */
        return ctx->pageable[device] ? (uint64_t)(uintptr_t)p : 0;
    }
}

static int xf_layout_sane(const kvt_layout *d)
{
    return d != NULL && d->num_layers > 0 &&
           d->num_layers <= KVT_LAYOUT_MAX_LAYERS &&
           (d->num_kv == 1 || d->num_kv == 2) && d->block_size > 0 &&
           d->num_kv_heads > 0 && d->row_bytes > 0;
}

/* Everything a transfer checks before launching anything. */
static kvt_err xf_check(const kvt_layout *d, const int32_t *ids, size_t n,
                        size_t bpc, const void *const *chunks,
                        size_t chunk_len, kvt_cuda_stream *s, bool unique)
{
    if (!xf_layout_sane(d) || s == NULL || chunks == NULL || bpc == 0 ||
        n % bpc != 0 || bpc > SIZE_MAX / d->block_size)
        return xf_bad("bad layout, stream or chunking");
    if (chunk_len == 0 ||
        chunk_len != kvt_layout_chunk_bytes(d, bpc * d->block_size))
        return xf_bad("chunk_len does not match the layout");
    kvt_err err = kvt_layout_check_blocks(d, ids, n, unique);
    if (err != KVT_OK)
        return err == KVT_EINVAL ? xf_bad("block id out of range or "
                                          "repeated") : err;
    for (size_t c = 0; c < n / bpc; c++)
        if (chunks[c] == NULL)
            return xf_bad("NULL chunk");
    return KVT_OK;
}

/* Resolve every chunk to a device address (malloc'd array in *out). */
static kvt_err xf_resolve(const kvt_cuda_ctx *ctx, int device,
                          const void *const *chunks, size_t n_chunks,
                          size_t chunk_len, uint64_t **out)
{
    uint64_t *dev = (uint64_t *)malloc(n_chunks * sizeof(uint64_t));
    if (dev == NULL)
        return KVT_ENOMEM;
    for (size_t c = 0; c < n_chunks; c++) {
        dev[c] = xf_dev_addr(ctx, device, chunks[c], chunk_len);
        if (dev[c] == 0) {
            free(dev);
            return xf_bad("chunk memory is not reachable from the device "
                          "(register it, or use the staged variant)");
        }
    }
    *out = dev;
    return KVT_OK;
}

static kvt_err xf_direct(kvt_cuda_ctx *ctx, const kvt_layout *d,
                         const int32_t *ids, size_t n, size_t bpc,
                         const void *const *chunks, size_t chunk_len,
                         kvt_cuda_stream *s, bool gather)
{
    uint64_t *dev = NULL;
    kvt_err err = xf_check(d, ids, n, bpc, chunks, chunk_len, s, !gather);
    if (err != KVT_OK)
        return err;
    XF_TRY(cudaSetDevice(s->device));
    err = xf_resolve(ctx, s->device, chunks, n / bpc, chunk_len, &dev);
    if (err != KVT_OK)
        return err;
    err = xf_run(d, ids, n, bpc, dev, gather, s->s, xf_launch);
    free(dev);
    return err;
}

static kvt_err xf_gather(kvt_cuda_ctx *ctx, const kvt_layout *d,
                         const int32_t *ids, size_t n, size_t bpc,
                         void *const *chunks, size_t chunk_len,
                         kvt_cuda_stream *s)
{
    return xf_direct(ctx, d, ids, n, bpc, (const void *const *)chunks,
                     chunk_len, s, true);
}

static kvt_err xf_scatter(kvt_cuda_ctx *ctx, const kvt_layout *d,
                          const int32_t *ids, size_t n, size_t bpc,
                          const void *const *chunks, size_t chunk_len,
                          kvt_cuda_stream *s)
{
    return xf_direct(ctx, d, ids, n, bpc, chunks, chunk_len, s, false);
}

/* One round of a staged transfer: k chunks through the stage. */
static kvt_err xf_stage_round(const kvt_layout *d, const int32_t *ids,
                              size_t bpc, const void *const *chunks,
                              size_t k, size_t chunk_len, char *stage,
                              uint64_t *sdev, bool gather, cudaStream_t s)
{
    for (size_t j = 0; j < k && !gather; j++)
        XF_TRY(cudaMemcpyAsync(stage + j * chunk_len, chunks[j], chunk_len,
                               cudaMemcpyDefault, s));
    kvt_err err = xf_run(d, ids, k * bpc, bpc, sdev, gather, s, xf_launch);
    if (err != KVT_OK)
        return err;
    for (size_t j = 0; j < k && gather; j++)
        XF_TRY(cudaMemcpyAsync((void *)chunks[j], stage + j * chunk_len,
                               chunk_len, cudaMemcpyDefault, s));
    return KVT_OK;
}

static kvt_err xf_staged(kvt_cuda_ctx *ctx, const kvt_layout *d,
                         const int32_t *ids, size_t n, size_t bpc,
                         const void *const *chunks, size_t chunk_len,
                         void *stage, size_t stage_len, kvt_cuda_stream *s,
                         bool gather)
{
    kvt_err err = xf_check(d, ids, n, bpc, chunks, chunk_len, s, !gather);
    if (err != KVT_OK)
        return err;
    size_t per_round = stage == NULL ? 0 : stage_len / chunk_len;
    if (per_round == 0)
        return xf_bad("stage smaller than one chunk");
    XF_TRY(cudaSetDevice(s->device));
    uint64_t sbase = xf_dev_addr(ctx, s->device, stage,
                                 per_round * chunk_len);
    if (sbase == 0)
        return xf_bad("stage is not device memory of the stream's device");
    uint64_t *sdev = (uint64_t *)malloc(per_round * sizeof(uint64_t));
    if (sdev == NULL)
        return KVT_ENOMEM;
    for (size_t j = 0; j < per_round; j++)
        sdev[j] = sbase + j * chunk_len;
    size_t n_chunks = n / bpc;
    for (size_t c0 = 0; c0 < n_chunks && err == KVT_OK; c0 += per_round) {
        size_t k = n_chunks - c0 < per_round ? n_chunks - c0 : per_round;
        err = xf_stage_round(d, ids + c0 * bpc, bpc, chunks + c0, k,
                             chunk_len, (char *)stage, sdev, gather, s->s);
    }
    free(sdev);
    return err;
}

static kvt_err xf_gather_staged(kvt_cuda_ctx *ctx, const kvt_layout *d,
                                const int32_t *ids, size_t n, size_t bpc,
                                void *const *chunks, size_t chunk_len,
                                void *stage, size_t stage_len,
                                kvt_cuda_stream *s)
{
    return xf_staged(ctx, d, ids, n, bpc, (const void *const *)chunks,
                     chunk_len, stage, stage_len, s, true);
}

static kvt_err xf_scatter_staged(kvt_cuda_ctx *ctx, const kvt_layout *d,
                                 const int32_t *ids, size_t n, size_t bpc,
                                 const void *const *chunks, size_t chunk_len,
                                 void *stage, size_t stage_len,
                                 kvt_cuda_stream *s)
{
    return xf_staged(ctx, d, ids, n, bpc, chunks, chunk_len, stage,
                     stage_len, s, false);
}

/* 1 if CUDA knows p: device, managed or registered host memory. The
 * layout is read by kernels for as long as it is registered, so pageable
 * memory the device happens to reach (HMM/ATS) is not taken. */
static int xf_known(const void *p)
{
    cudaPointerAttributes a;
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return a.type != cudaMemoryTypeUnregistered;
}

static kvt_err xf_check_layout(kvt_cuda_ctx *ctx, int device,
                               const kvt_layout *d)
{
    if (!xf_layout_sane(d) || device < 0 || device >= ctx->n_dev)
        return xf_bad("bad layout or device");
    XF_TRY(cudaSetDevice(device));
    /* Bytes from a pair's base to the end of its last row. */
    uint64_t span = (uint64_t)(d->num_blocks - 1) * d->block_stride +
                    (uint64_t)(d->block_size - 1) * d->token_stride +
                    (uint64_t)(d->num_kv_heads - 1) * d->head_stride +
                    d->row_bytes;
    for (uint32_t p = 0; p < d->num_layers * d->num_kv; p++) {
        const void *b = (const void *)(uintptr_t)d->base[p];
        const char *last = (const char *)b + span - 1;
        /* One text for every reason: it must not tell what is mapped. */
        if (!xf_known(b) || !xf_known(last) ||
            xf_dev_addr(ctx, device, b, span) != d->base[p])
            return xf_bad("a KV tensor is not in memory this device may use");
    }
    return KVT_OK;
}

/* cuMemGetAddressRange from the driver, looked up once. The runtime is
 * linked statically and the driver API is not linked at all: libcuda.so.1
 * is found at run time, as xf_have_driver finds it. */
typedef int (*xf_range_fn)(unsigned long long *base, size_t *size,
                           unsigned long long dptr);
static xf_range_fn xf_range;
static pthread_once_t xf_range_once = PTHREAD_ONCE_INIT;

static void xf_range_load(void)
{
    /* Left open: the runtime keeps the driver loaded for the process. */
    void *h = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
    if (h != NULL)
        xf_range = (xf_range_fn)dlsym(h, "cuMemGetAddressRange_v2");
}

static kvt_err xf_mem_range(kvt_cuda_ctx *ctx, int device, const void *p,
                            uint64_t *base, uint64_t *size)
{
    if (device < 0 || device >= ctx->n_dev)
        return xf_bad("bad device");
    pthread_once(&xf_range_once, xf_range_load);
    if (xf_range == NULL) {
        snprintf(xf_errbuf, sizeof(xf_errbuf),
                 "cuMemGetAddressRange_v2 not found in libcuda.so.1");
        return KVT_ENOTSUP;
    }
    XF_TRY(cudaSetDevice(device)); /* makes its primary context current */
    unsigned long long b = 0;
    size_t n = 0;
    if (xf_range(&b, &n, (unsigned long long)(uintptr_t)p) != 0)
        return xf_bad("not a device allocation");
    *base = b;
    *size = n;
    return KVT_OK;
}

/* ------------------------------------------------- context and memory -- */

static int xf_have_driver(void)
{
    void *h = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
    if (h == NULL)
        return 0;
    dlclose(h);
    return 1;
}

static kvt_err xf_open(kvt_cuda_ctx **out, char *why, size_t why_len)
{
    int n = 0, drv = 0;
    if (why == NULL)
        why_len = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    cudaGetLastError();
    if (e != cudaSuccess || n <= 0) {
        if (!xf_have_driver())
            snprintf(why, why_len, "no CUDA driver (libcuda.so.1 not found)");
        else if (e == cudaSuccess || e == cudaErrorNoDevice)
            snprintf(why, why_len, "no CUDA device");
        else if (e == cudaErrorInsufficientDriver &&
                 cudaDriverGetVersion(&drv) == cudaSuccess)
            snprintf(why, why_len, "CUDA driver %d older than runtime %d",
                     drv, CUDART_VERSION);
        else
            snprintf(why, why_len, "cudaGetDeviceCount: %s",
                     cudaGetErrorString(e));
        return KVT_ENOTSUP;
    }
    kvt_cuda_ctx *ctx = (kvt_cuda_ctx *)calloc(1, sizeof(*ctx));
    if (ctx == NULL)
        return KVT_ENOMEM;
    ctx->n_dev = n;
    for (int i = 0; i < n && i < XF_MAX_DEVICES; i++) {
        int v = 0;
        if (cudaDeviceGetAttribute(&v, cudaDevAttrPageableMemoryAccess, i) ==
            cudaSuccess)
            ctx->pageable[i] = v != 0;
    }
    cudaGetLastError();
    *out = ctx;
    return KVT_OK;
}

static void xf_close(kvt_cuda_ctx *ctx)
{
    free(ctx);
}

static int xf_device_count(const kvt_cuda_ctx *ctx)
{
    return ctx->n_dev;
}

static const char *xf_last_error(void)
{
    return xf_errbuf;
}

static kvt_err xf_stream_new(kvt_cuda_ctx *ctx, int device, cudaStream_t cs,
                             kvt_cuda_stream **out)
{
    if (device < 0 || device >= ctx->n_dev || out == NULL)
        return xf_bad("bad device");
    kvt_cuda_stream *s = (kvt_cuda_stream *)calloc(1, sizeof(*s));
    if (s == NULL)
        return KVT_ENOMEM;
    s->device = device;
    s->s = cs;
    cudaError_t e = cudaSetDevice(device);
    if (e == cudaSuccess && cs == NULL) {
        e = cudaStreamCreateWithFlags(&s->s, cudaStreamNonBlocking);
        s->owned = 1;
    }
    if (e != cudaSuccess) {
        free(s);
        return xf_fail(e, "stream create");
    }
    *out = s;
    return KVT_OK;
}

static kvt_err xf_stream_create(kvt_cuda_ctx *ctx, int device,
                                kvt_cuda_stream **out)
{
    return xf_stream_new(ctx, device, NULL, out);
}

static kvt_err xf_stream_wrap(kvt_cuda_ctx *ctx, int device, void *cs,
                              kvt_cuda_stream **out)
{
    if (cs == NULL)
        return xf_bad("NULL stream to wrap");
    return xf_stream_new(ctx, device, (cudaStream_t)cs, out);
}

static void xf_stream_destroy(kvt_cuda_ctx *ctx, kvt_cuda_stream *s)
{
    (void)ctx;
    if (s == NULL)
        return;
    if (s->owned && cudaSetDevice(s->device) == cudaSuccess)
        cudaStreamDestroy(s->s);
    cudaGetLastError();
    free(s);
}

static kvt_err xf_sync(kvt_cuda_ctx *ctx, kvt_cuda_stream *s)
{
    if (s != NULL) {
        XF_TRY(cudaSetDevice(s->device));
        XF_TRY(cudaStreamSynchronize(s->s));
        return KVT_OK;
    }
    for (int i = 0; i < ctx->n_dev; i++) {
        XF_TRY(cudaSetDevice(i));
        XF_TRY(cudaDeviceSynchronize());
    }
    return KVT_OK;
}

static kvt_err xf_host_alloc(kvt_cuda_ctx *ctx, size_t len, void **out)
{
    (void)ctx;
    XF_TRY(cudaHostAlloc(out, len,
                         cudaHostAllocPortable | cudaHostAllocMapped));
    return KVT_OK;
}

static kvt_err xf_host_free(kvt_cuda_ctx *ctx, void *p)
{
    (void)ctx;
    XF_TRY(cudaFreeHost(p));
    return KVT_OK;
}

static kvt_err xf_host_register(kvt_cuda_ctx *ctx, void *p, size_t len)
{
    (void)ctx;
    XF_TRY(cudaHostRegister(p, len, cudaHostRegisterPortable |
                                        cudaHostRegisterMapped));
    return KVT_OK;
}

static kvt_err xf_host_unregister(kvt_cuda_ctx *ctx, void *p)
{
    (void)ctx;
    XF_TRY(cudaHostUnregister(p));
    return KVT_OK;
}

static kvt_err xf_dev_alloc(kvt_cuda_ctx *ctx, int device, size_t len,
                            void **out)
{
    if (device < 0 || device >= ctx->n_dev)
        return xf_bad("bad device");
    XF_TRY(cudaSetDevice(device));
    XF_TRY(cudaMalloc(out, len));
    return KVT_OK;
}

/* Switch to the device that owns p (cudaFree and IPC close want it). */
static kvt_err xf_set_owner(const void *p)
{
    cudaPointerAttributes a;
    XF_TRY(cudaPointerGetAttributes(&a, p));
    if (a.type != cudaMemoryTypeDevice)
        return xf_bad("not device memory");
    XF_TRY(cudaSetDevice(a.device));
    return KVT_OK;
}

static kvt_err xf_dev_free(kvt_cuda_ctx *ctx, void *p)
{
    (void)ctx;
    kvt_err err = xf_set_owner(p);
    if (err != KVT_OK)
        return err;
    XF_TRY(cudaFree(p));
    return KVT_OK;
}

static kvt_err xf_memcpy_async(kvt_cuda_ctx *ctx, void *dst, const void *src,
                               size_t len, kvt_cuda_stream *s)
{
    (void)ctx;
    if (s == NULL)
        return xf_bad("NULL stream");
    XF_TRY(cudaSetDevice(s->device));
    XF_TRY(cudaMemcpyAsync(dst, src, len, cudaMemcpyDefault, s->s));
    return KVT_OK;
}

static kvt_err xf_memset_async(kvt_cuda_ctx *ctx, void *dst, int byte,
                               size_t len, kvt_cuda_stream *s)
{
    (void)ctx;
    if (s == NULL)
        return xf_bad("NULL stream");
    XF_TRY(cudaSetDevice(s->device));
    XF_TRY(cudaMemsetAsync(dst, byte, len, s->s));
    return KVT_OK;
}

static kvt_err xf_ipc_get(kvt_cuda_ctx *ctx, void *dev_ptr, void *handle,
                          size_t handle_len)
{
    cudaIpcMemHandle_t h;
    (void)ctx;
    if (handle == NULL || handle_len < sizeof(h))
        return xf_bad("IPC handle buffer too small");
    kvt_err err = xf_set_owner(dev_ptr);
    if (err != KVT_OK)
        return err;
    XF_TRY(cudaIpcGetMemHandle(&h, dev_ptr));
    memcpy(handle, &h, sizeof(h));
    return KVT_OK;
}

static kvt_err xf_ipc_open(kvt_cuda_ctx *ctx, int device, const void *handle,
                           size_t handle_len, void **dev_ptr)
{
    cudaIpcMemHandle_t h;
    if (device < 0 || device >= ctx->n_dev || handle == NULL ||
        handle_len != sizeof(h))
        return xf_bad("bad device or IPC handle");
    memcpy(&h, handle, sizeof(h));
    XF_TRY(cudaSetDevice(device));
    XF_TRY(cudaIpcOpenMemHandle(dev_ptr, h,
                                cudaIpcMemLazyEnablePeerAccess));
    return KVT_OK;
}

static kvt_err xf_ipc_close(kvt_cuda_ctx *ctx, void *dev_ptr)
{
    (void)ctx;
    kvt_err err = xf_set_owner(dev_ptr);
    if (err != KVT_OK)
        return err;
    XF_TRY(cudaIpcCloseMemHandle(dev_ptr));
    return KVT_OK;
}

static_assert(sizeof(cudaIpcMemHandle_t) == KVT_CUDA_IPC_HANDLE_LEN,
              "IPC handle size");
static_assert(sizeof(xf_args) <= 32764, "kernel parameter limit");

static const struct kvt_cuda_ops xf_ops = {
    .abi_version = KVT_CUDA_ABI_VERSION,
    .layout_size = sizeof(kvt_layout),
    .open = xf_open,
    .close = xf_close,
    .device_count = xf_device_count,
    .last_error = xf_last_error,
    .stream_create = xf_stream_create,
    .stream_wrap = xf_stream_wrap,
    .stream_destroy = xf_stream_destroy,
    .sync = xf_sync,
    .host_alloc = xf_host_alloc,
    .host_free = xf_host_free,
    .host_register = xf_host_register,
    .host_unregister = xf_host_unregister,
    .dev_alloc = xf_dev_alloc,
    .dev_free = xf_dev_free,
    .memcpy_async = xf_memcpy_async,
    .memset_async = xf_memset_async,
    .check_layout = xf_check_layout,
    .gather = xf_gather,
    .scatter = xf_scatter,
    .gather_staged = xf_gather_staged,
    .scatter_staged = xf_scatter_staged,
    .ipc_get = xf_ipc_get,
    .ipc_open = xf_ipc_open,
    .ipc_close = xf_ipc_close,
    .mem_range = xf_mem_range,
};

extern "C" __attribute__((visibility("default"))) const struct kvt_cuda_ops *
kvt_cuda_ops_get(void)
{
    return &xf_ops;
}
