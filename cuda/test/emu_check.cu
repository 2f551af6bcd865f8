/*
 * emu_check.cu -- the CUDA kernel's own code run on the CPU over an
 * emulated grid, bit for bit against the CPU reference. Needs nvcc to
 * build but no GPU to run; built as build/tests/unit/test_cuda_emu so
 * `make test` runs it.
 *
 * Design: kvt_cuda.cu keeps its kernel's per-thread body host-callable
 * (xf_body) and takes the launcher as a parameter of xf_run. This file
 * includes kvt_cuda.cu whole and gives xf_run a launcher that walks
 * (blockIdx.y, blockIdx.x, threadIdx.x) calling xf_body. So the launch
 * split (1024 blocks per launch, a chunk spread over launches), the token
 * tiles, the vector width choice and every address the kernel computes
 * are the GPU's own code, checked against kvt_gather_cpu/kvt_scatter_cpu
 * for every layout kind, element sizes 1, 2 and 4 and misaligned chunk
 * addresses (every width 16..1 must be taken). What it cannot check: the
 * CUDA API calls (pointer resolution, copies, streams) and concurrency on
 * a real device; scripts/gpu-check.sh covers those on a GPU machine.
 */
#include "../kvt_cuda.cu"

#include "test/fixture.h"

static int fails;
static unsigned widths_seen;

#define EMU_CHECK(cond, ...)                                                \
    do {                                                                    \
        if (!(cond)) {                                                      \
            fails++;                                                        \
            fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                                   \
            fputc('\n', stderr);                                            \
        }                                                                   \
    } while (0)

template <typename V, bool GATHER>
static void emu_grid(const xf_args &a, dim3 grid)
{
    for (uint32_t by = 0; by < grid.y; by++)
        for (uint32_t bx = 0; bx < grid.x; bx++)
            for (uint32_t tx = 0; tx < XF_THREADS; tx++)
                xf_body<V, GATHER>(a, bx, by, tx);
}

template <typename V>
static void emu_grid_v(const xf_args &a, dim3 grid, bool gather)
{
    if (gather)
        emu_grid<V, true>(a, grid);
    else
        emu_grid<V, false>(a, grid);
}

static cudaError_t emu_launch(const xf_args &a, dim3 grid, unsigned width,
                              bool gather, cudaStream_t s)
{
    (void)s;
    widths_seen |= width;
    switch (width) {
    case 16: emu_grid_v<uint4>(a, grid, gather); break;
    case 8: emu_grid_v<uint2>(a, grid, gather); break;
    case 4: emu_grid_v<uint32_t>(a, grid, gather); break;
    case 2: emu_grid_v<uint16_t>(a, grid, gather); break;
    default: emu_grid_v<uint8_t>(a, grid, gather); break;
    }
    return cudaSuccess;
}

struct emu_case {
    kvt_layout_kind kind;
    fx_shape sh;
    size_t bpc, n_chunks, off; /* off: chunk addresses past 64 bytes */
    size_t base_off;           /* tensor addresses past 64 bytes */
};

/* Gather through the emulated kernel: the chunks must equal the CPU's. */
static void emu_gather(const emu_case &c, fx_kv &f, const int32_t *ids,
                       uint8_t *buf, const uint64_t *addrs,
                       const uint8_t *ref, size_t all)
{
    kvt_cuda_stream dummy = {};
    void **ptrs = (void **)calloc(c.n_chunks, sizeof(void *));
    size_t cl = all / c.n_chunks;
    for (size_t i = 0; i < c.n_chunks; i++)
        ptrs[i] = (void *)(uintptr_t)addrs[i];
    EMU_CHECK(xf_check(&f.d, ids, c.bpc * c.n_chunks, c.bpc, ptrs, cl,
                       &dummy, false) == KVT_OK, "%s", xf_errbuf);
    memset(buf, 0xee, all + c.off);
    EMU_CHECK(xf_run(&f.d, ids, c.bpc * c.n_chunks, c.bpc, addrs, true,
                     NULL, emu_launch) == KVT_OK, "xf_run gather");
    EMU_CHECK(memcmp(buf + c.off, ref, all) == 0,
              "gather %s es %u off %zu/%zu", kvt_layout_kind_name(c.kind),
              c.sh.elem_size, c.off, c.base_off);
    free(ptrs);
}

/* Scatter the reference chunks into zeroed tensors at ids2: the tensors
 * must equal what kvt_scatter_cpu leaves. */
static void emu_scatter(const emu_case &c, const int32_t *ids2,
                        uint8_t *buf, const uint64_t *addrs,
                        const uint8_t *ref, size_t all)
{
    fx_kv want, got;
    size_t cl = all / c.n_chunks;
    EMU_CHECK(fx_alloc(&want, c.kind, &c.sh), "alloc");
    EMU_CHECK(fx_alloc_at(&got, c.kind, &c.sh, c.base_off), "alloc");
    for (size_t i = 0; i < c.n_chunks; i++)
        kvt_scatter_cpu(&want.d, ids2 + i * c.bpc, c.bpc, ref + i * cl, cl);
    memcpy(buf + c.off, ref, all);
    EMU_CHECK(xf_run(&got.d, ids2, c.bpc * c.n_chunks, c.bpc, addrs, false,
                     NULL, emu_launch) == KVT_OK, "xf_run scatter");
    for (size_t t = 0; t < want.n_tensors; t++)
        EMU_CHECK(memcmp(want.mem[t], got.mem[t], want.tensor_bytes) == 0,
                  "scatter %s es %u off %zu/%zu tensor %zu",
                  kvt_layout_kind_name(c.kind), c.sh.elem_size, c.off,
                  c.base_off, t);
    fx_free(&want);
    fx_free(&got);
}

static void emu_run(const emu_case &c, uint64_t *seed)
{
    fx_kv f;
    size_t n = c.bpc * c.n_chunks;
    int32_t *ids = (int32_t *)malloc(n * sizeof(int32_t));
    int32_t *ids2 = (int32_t *)malloc(n * sizeof(int32_t));
    EMU_CHECK(fx_alloc_at(&f, c.kind, &c.sh, c.base_off), "alloc");
    fx_fill(&f, fx_rand(seed));
    fx_ids(seed, c.sh.blocks, ids, n);
    fx_ids(seed, c.sh.blocks, ids2, n);
    size_t cl = kvt_layout_chunk_bytes(&f.d, c.bpc * c.sh.block_size);
    size_t all = cl * c.n_chunks;
    uint8_t *ref = (uint8_t *)malloc(all);
    uint8_t *buf = (uint8_t *)aligned_alloc(64, (all + 64 + 63) / 64 * 64);
    uint64_t *addrs = (uint64_t *)malloc(c.n_chunks * sizeof(uint64_t));
    for (size_t i = 0; i < c.n_chunks; i++) {
        kvt_gather_cpu(&f.d, ids + i * c.bpc, c.bpc, ref + i * cl, cl);
        addrs[i] = (uint64_t)(uintptr_t)(buf + c.off + i * cl);
    }
    emu_gather(c, f, ids, buf, addrs, ref, all);
    emu_scatter(c, ids2, buf, addrs, ref, all);
    fx_free(&f);
    free(ids);
    free(ids2);
    free(ref);
    free(buf);
    free(addrs);
}

/* xf_check refuses what the GPU path must never launch. */
static void emu_refusals(uint64_t *seed)
{
    fx_shape sh = {2, 9, 4, 2, 8, 2};
    fx_kv f;
    kvt_cuda_stream dummy = {};
    int32_t ids[4];
    uint8_t chunk[2048];
    void *ptrs[2] = {chunk, chunk + 1024};
    EMU_CHECK(fx_alloc(&f, KVT_LAYOUT_VLLM_FLASH_NHD, &sh), "alloc");
    fx_ids(seed, sh.blocks, ids, 4);
    size_t cl = kvt_layout_chunk_bytes(&f.d, 2 * sh.block_size);
    EMU_CHECK(cl <= 1024, "chunk of %zu", cl);
    EMU_CHECK(xf_check(&f.d, ids, 4, 2, ptrs, cl, &dummy, true) == KVT_OK,
              "valid");
    EMU_CHECK(xf_check(&f.d, ids, 4, 2, ptrs, cl, NULL, true) != KVT_OK,
              "no stream");
    EMU_CHECK(xf_check(&f.d, ids, 4, 3, ptrs, cl, &dummy, true) != KVT_OK,
              "4 blocks in chunks of 3");
    EMU_CHECK(xf_check(&f.d, ids, 4, 2, ptrs, cl - 1, &dummy, true) !=
                  KVT_OK, "short chunk");
    ids[3] = ids[0];
    EMU_CHECK(xf_check(&f.d, ids, 4, 2, ptrs, cl, &dummy, true) != KVT_OK,
              "duplicate scatter");
    EMU_CHECK(xf_check(&f.d, ids, 4, 2, ptrs, cl, &dummy, false) == KVT_OK,
              "duplicate gather");
    ids[3] = (int32_t)sh.blocks;
    EMU_CHECK(xf_check(&f.d, ids, 4, 2, ptrs, cl, &dummy, false) != KVT_OK,
              "out of range");
    fx_ids(seed, sh.blocks, ids, 4);
    ptrs[1] = NULL;
    EMU_CHECK(xf_check(&f.d, ids, 4, 2, ptrs, cl, &dummy, false) != KVT_OK,
              "NULL chunk");
    fx_free(&f);
}

static const kvt_layout_kind kinds[] = {
    KVT_LAYOUT_VLLM_FLASH_NHD, KVT_LAYOUT_VLLM_FLASH_HND,
    KVT_LAYOUT_FLASHINFER_NHD, KVT_LAYOUT_FLASHINFER_HND,
    KVT_LAYOUT_VLLM_CROSS_NHD, KVT_LAYOUT_VLLM_CROSS_HND,
    KVT_LAYOUT_SGLANG_MHA,     KVT_LAYOUT_MLA,
    KVT_LAYOUT_CUSTOM,
};

int main(void)
{
    static const fx_shape shapes[] = {
        {3, 11, 4, 3, 8, 0},    /* odd everything */
        {2, 9, 16, 2, 5, 0},    /* rows of 5, 10 or 20 bytes */
        {2, 12, 16, 8, 128, 0}, /* Llama-like rows */
    };
    static const size_t offs[] = {0, 8, 4, 2, 1};
    uint64_t seed = 0xbb67ae8584caa73bull;
    for (const kvt_layout_kind k : kinds)
        for (const fx_shape &s : shapes)
            for (uint32_t es : {1u, 2u, 4u})
                for (size_t off : offs) {
                    /* Misaligned chunks; then misaligned tensors. */
                    emu_case c = {k, s, 2, 3, off, 0};
                    c.sh.elem_size = es;
                    emu_run(c, &seed);
                    if (off == 0) {
                        c.base_off = es;
                        emu_run(c, &seed);
                    }
                }
    /* Transfers past one launch: chunks spread over launches (513 x 4 is
     * the smallest split where a launch's last chunk starts in the one
     * before), and 1500 one-block chunks (SGLang page 1). */
    const fx_shape page1 = {2, 3000, 1, 2, 64, 2};
    emu_run({KVT_LAYOUT_SGLANG_MHA, page1, 700, 3, 0, 0}, &seed);
    emu_run({KVT_LAYOUT_SGLANG_MHA, page1, 513, 4, 0, 0}, &seed);
    emu_run({KVT_LAYOUT_SGLANG_MHA, page1, 1, 1500, 4, 0}, &seed);
    emu_run({KVT_LAYOUT_VLLM_CROSS_HND, {2, 1200, 16, 2, 64, 2}, 1100, 1, 0,
             0}, &seed);
    emu_run({KVT_LAYOUT_MLA, {2, 40, 64, 1, 576, 2}, 4, 2, 0, 0}, &seed);
    emu_refusals(&seed);
    EMU_CHECK(widths_seen == (16 | 8 | 4 | 2 | 1), "widths 0x%x",
              widths_seen);
    printf("emu_check: kernel body on an emulated grid vs CPU reference: "
           "%s (%d failure(s))\n", fails ? "FAILED" : "ok", fails);
    return fails ? 1 : 0;
}
