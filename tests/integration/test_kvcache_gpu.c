/*
 * test_kvcache_gpu.c -- kvtierd's GPU paths, end to end: an engine holds
 * its KV tensors in device memory, hands the daemon CUDA IPC handles, and
 * SAVEs and LOADs through the daemon's CUDA workers and HBM tier.
 *
 * On a machine without a GPU (make test) both the daemon and this engine
 * load libkvtier_fakecuda.so (tests/fake_cuda) through KVT_CUDA_LIB: CUDA
 * on the CPU, each device allocation a shared-memory file whose path is
 * its IPC handle. That runs everything of the daemon's that a GPU runs --
 * registrations by handle, SAVE/LOAD through kvt_gpu_gather/scatter on the
 * workers' streams, the DRAM pool registered at start, the HBM tier
 * (copies made by GPU SAVEs, read by GPU LOADs, demoted when full, never
 * stale) -- and injects each CUDA failure, which must come back as the
 * error of the request or transfer it belongs to.
 *
 * With KVT_GPU_REAL=1 (scripts/gpu-check.sh on a GPU) the same round trips
 * run on libkvtier_cuda.so and real device memory, real IPC handles; the
 * fault-injection cases are skipped there.
 */
#include <libgen.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "client_internal.h"
#include "daemon.h"
#include "gpu.h"
#include "kvengine.h"
#include "kvtier.h"

static struct tdaemon D;
static char fake_lib[512], fail_file[320];
static int real;             /* KVT_GPU_REAL: libkvtier_cuda.so on a GPU */
static struct kvt_gpu *G;    /* this engine's own CUDA */
static kvt_cuda_stream *S;

#define CT 8
#define NK 3

/* build/lib/libkvtier_fakecuda.so (or, real, libkvtier_cuda.so) beside
 * $KVTIERD's build/bin. */
static int find_lib(void)
{
    char bin[512];
    real = getenv("KVT_GPU_REAL") && getenv("KVT_GPU_REAL")[0] == '1';
    snprintf(bin, sizeof bin, "%s", getenv("KVTIERD") ? getenv("KVTIERD")
                                                       : "build/bin/kvtierd");
    snprintf(fake_lib, sizeof fake_lib, "%s/../lib/%s", dirname(bin),
             real ? "libkvtier_cuda.so" : "libkvtier_fakecuda.so");
    return access(fake_lib, R_OK) == 0;
}

#define SKIP_IF_REAL() do { if (real) skip(); } while (0)

/* Start a daemon on the fake library with these faults fixed. */
static int start_fake(struct tdaemon *d, const char *faults,
                      const char *const *extra)
{
    if (faults) setenv("KVT_FAKE_CUDA_FAIL", faults, 1);
    else setenv("KVT_FAKE_CUDA_FAIL_FILE", fail_file, 1);
    int rc = td_start(d, extra);
    unsetenv("KVT_FAKE_CUDA_FAIL");
    unsetenv("KVT_FAKE_CUDA_FAIL_FILE");
    return rc;
}

/* Faults of the shared daemon, from now on. */
static void faults(const char *list)
{
    FILE *f = fopen(fail_file, "w");
    assert_non_null(f);
    fprintf(f, "%s\n", list);
    fclose(f);
}

static int setup(void **state)
{
    (void)state;
    char why[256];
    if (!find_lib()) {
        fprintf(stderr, "skipped: %s not built\n", fake_lib);
        exit(77);
    }
    setenv("KVT_CUDA_LIB", fake_lib, 1); /* this engine's and the daemons' */
    if (kvt_gpu_open(NULL, &G, why, sizeof why) != KVT_OK ||
        kvt_gpu_stream_create(G, 0, &S) != KVT_OK) {
        fprintf(stderr, "skipped: %s\n", why);
        exit(77);
    }
    if (td_init(&D) != 0) return -1;
    snprintf(fail_file, sizeof fail_file, "%s/faults", D.dir);
    const char *extra[] = {"--hbm-bytes", "8M", NULL};
    return start_fake(&D, NULL, extra);
}

static int teardown(void **state)
{
    (void)state;
    int rc = td_stop(&D);
    td_cleanup(&D);
    kvt_gpu_stream_destroy(G, S);
    kvt_gpu_close(G);
    return rc;
}

static fx_shape shape(void)
{
    return (fx_shape){.layers = 3, .blocks = 24, .block_size = 4, .heads = 2,
                      .head_size = 16, .elem_size = 2};
}

/* A GPU engine: each tensor its own device allocation with an IPC
 * handle, and a host mirror (kvengine.h) that fills it with random bytes
 * and, pulled back, is what the fixture checks read. */
struct deng {
    struct kve h;
    void *dev[KVT_LAYOUT_MAX_LAYERS * 2];
    uint8_t handle[KVT_LAYOUT_MAX_LAYERS * 2 * KVT_CUDA_IPC_HANDLE_LEN];
    uint64_t off[KVT_LAYOUT_MAX_LAYERS * 2];
};

static void copy(void *dst, const void *src, size_t n)
{
    const struct kvt_cuda_ops *o = kvt_gpu_ops(G);
    assert_int_equal(o->memcpy_async(kvt_gpu_ctx(G), dst, src, n, S), KVT_OK);
    assert_int_equal(kvt_gpu_sync(G, S), KVT_OK);
}

static void deng_open(struct deng *g, kvt_layout_kind kind, const fx_shape *s,
                      uint64_t seed)
{
    const struct kvt_cuda_ops *o = kvt_gpu_ops(G);
    memset(g, 0, sizeof *g);
    assert_int_equal(kve_open(&g->h, kind, s, seed), 0);
    for (size_t i = 0; i < g->h.f.n_tensors; i++) {
        assert_int_equal(o->dev_alloc(kvt_gpu_ctx(G), 0, g->h.f.tensor_bytes,
                                      &g->dev[i]), KVT_OK);
        copy(g->dev[i], g->h.f.mem[i], g->h.f.tensor_bytes);
        assert_int_equal(o->ipc_get(kvt_gpu_ctx(G), g->dev[i],
                                    g->handle + i * KVT_CUDA_IPC_HANDLE_LEN,
                                    KVT_CUDA_IPC_HANDLE_LEN), KVT_OK);
    }
}

/* Device tensors into the host mirror. */
static void deng_pull(struct deng *g)
{
    for (size_t i = 0; i < g->h.f.n_tensors; i++)
        copy(g->h.f.mem[i], g->dev[i], g->h.f.tensor_bytes);
}

static void deng_close(struct deng *g)
{
    for (size_t i = 0; i < g->h.f.n_tensors; i++)
        kvt_gpu_ops(G)->dev_free(kvt_gpu_ctx(G), g->dev[i]);
    kve_close(&g->h);
}

static kvt_err reg_gpu(kvt_client *c, const struct deng *g, const char *ns,
                       int device, kvt_kv_reg *reg)
{
    return kvt_kv_register_cuda(c, ns, &g->h.f.p, CT, device, g->handle, g->off,
                                reg, NULL);
}

static kvt_xfer_status xfer(kvt_client *c, int save, const char *ns,
                            kvt_kv_reg reg, const kvt_key *k, const int32_t *ids)
{
    kvt_xfer x;
    kvt_xfer_status st;
    uint32_t bpc = CT / shape().block_size;
    assert_int_equal(save ? kvt_kv_save(c, ns, reg, k, NK, ids, NK * bpc, NULL, &x)
                          : kvt_kv_load(c, ns, reg, k, NK, ids, NK * bpc, &x),
                     KVT_OK);
    assert_int_equal(kve_wait1(c, x, &st), KVT_OK);
    return st;
}

static void test_gpu_available(void **state)
{
    (void)state;
    kvt_client *c = td_connect(&D);
    kvt_kv_stats s;
    assert_int_equal(kvt_kv_stats_get(c, &s), KVT_OK);
    assert_memory_equal(s.gpu, "available: ", 11);
    assert_int_equal(s.hbm_bytes, 8u << 20);
    assert_int_equal(s.hbm_used, 0);
    kvt_close(c);
}

/* Save through the GPU path from one kind, load through it into another
 * and through the host path into a third: bit for bit. */
static void roundtrip(kvt_client *c, kvt_layout_kind ka, kvt_layout_kind kb,
                      uint64_t seed)
{
    fx_shape s = shape();
    static struct deng a, b;
    char ns[64];
    kvt_key k[NK];
    int32_t perm[24];
    uint64_t rng = seed;
    uint32_t bpc = CT / s.block_size;
    snprintf(ns, sizeof ns, "gpu/%s", kvt_layout_kind_name(ka));
    deng_open(&a, ka, &s, seed);
    deng_open(&b, kb, &s, seed + 1);
    kvt_kv_reg ra, rb, rh;
    assert_int_equal(reg_gpu(c, &a, ns, 0, &ra), KVT_OK);
    assert_int_equal(reg_gpu(c, &b, ns, 0, &rb), KVT_OK);
    assert_int_equal(kve_register(c, &b.h, ns, CT, &rh, NULL), KVT_OK);
    for (size_t i = 0; i < NK; i++) k[i] = td_key(seed * 10 + i);
    kve_perm(&rng, perm, s.blocks);
    assert_int_equal(xfer(c, 1, ns, ra, k, perm).err, KVT_OK);
    kvt_chunk ch[NK];
    kvt_lease l;
    size_t got;
    assert_int_equal(kvt_get(c, ns, k, NK, &l, ch, &got), KVT_OK);
    for (size_t i = 0; i < NK; i++) {
        assert_true(fx_chunk_matches(&a.h.f, perm + i * bpc, bpc, ch[i].data));
        assert_int_equal(kvt_checksum(ch[i].data, ch[i].size), ch[i].checksum);
    }
    assert_int_equal(xfer(c, 0, ns, rb, k, perm + NK * bpc).err, KVT_OK);
    deng_pull(&b);
    for (size_t i = 0; i < NK; i++)
        assert_true(fx_chunk_matches(&b.h.f, perm + (NK + i) * bpc, bpc, ch[i].data));
    /* Through the host path into b's mirror, which is its own file. */
    assert_int_equal(xfer(c, 0, ns, rh, k, perm + 2 * NK * bpc).err, KVT_OK);
    for (size_t i = 0; i < NK; i++)
        assert_true(fx_chunk_matches(&b.h.f, perm + (2 * NK + i) * bpc, bpc,
                                     ch[i].data));
    kvt_release(c, l);
    kvt_kv_unregister(c, ra);
    kvt_kv_unregister(c, rb);
    kvt_kv_unregister(c, rh);
    deng_close(&a);
    deng_close(&b);
}

static void test_gpu_roundtrip(void **state)
{
    (void)state;
    kvt_client *c = td_connect(&D);
    roundtrip(c, KVT_LAYOUT_VLLM_FLASH_NHD, KVT_LAYOUT_FLASHINFER_HND, 1);
    roundtrip(c, KVT_LAYOUT_VLLM_CROSS_HND, KVT_LAYOUT_SGLANG_MHA, 3);
    roundtrip(c, KVT_LAYOUT_CUSTOM, KVT_LAYOUT_VLLM_FLASH_HND, 5);
    roundtrip(c, KVT_LAYOUT_MLA, KVT_LAYOUT_MLA, 7);
    kvt_close(c); /* closing drops the registrations and IPC mappings */
    c = td_connect(&D);
    kvt_kv_stats s;
    long long t0 = td_now_ms();
    do assert_int_equal(kvt_kv_stats_get(c, &s), KVT_OK);
    while (s.registrations && td_now_ms() - t0 < 3000);
    assert_int_equal(s.registrations, 0);
    kvt_close(c);
}

/* Registrations refused by CUDA, or by what it reports. */
static void test_gpu_register_errors(void **state)
{
    (void)state;
    SKIP_IF_REAL();
    kvt_client *c = td_connect(&D);
    static struct deng e;
    fx_shape s = shape();
    kvt_kv_reg reg;
    deng_open(&e, KVT_LAYOUT_VLLM_FLASH_NHD, &s, 9);
    assert_int_equal(reg_gpu(c, &e, "gpu/err", 1, &reg), KVT_EINVAL); /* 1 device */
    assert_int_equal(reg_gpu(c, &e, "gpu/err", -1, &reg), KVT_EINVAL);
    faults("check_layout");
    assert_int_equal(reg_gpu(c, &e, "gpu/err", 0, &reg), KVT_EINVAL);
    assert_non_null(strstr(kvt_last_error(c), "not usable"));
    faults("ipc_open");
    assert_int_equal(reg_gpu(c, &e, "gpu/err", 0, &reg), KVT_EIO);
    faults("");
    /* A handle of the wrong size. */
    uint8_t h[3 * 64] = {0};
    ProtobufCBinaryData hs[3] = {{64, h}, {10, h}, {64, h}};
    uint64_t off[3] = {0, 0, 0};
    Kvtier__KvLayout l = KVTIER__KV_LAYOUT__INIT;
    l.kind = KVT_LAYOUT_VLLM_FLASH_NHD, l.num_layers = 3, l.num_blocks = 24;
    l.block_size = 4, l.num_kv_heads = 2, l.head_size = 16, l.elem_size = 2;
    memcpy(h, e.handle, 64);
    Kvtier__KvMemory m = KVTIER__KV_MEMORY__INIT;
    m.ipc_handles = hs, m.n_ipc_handles = 3, m.offsets = off, m.n_offsets = 3;
    Kvtier__RegisterKvCache rk = KVTIER__REGISTER_KV_CACHE__INIT;
    rk.ns = "gpu/err", rk.layout = &l, rk.memory = &m, rk.chunk_tokens = CT;
    Kvtier__Request q = KVTIER__REQUEST__INIT;
    q.body_case = KVTIER__REQUEST__BODY_REGISTER_KV_CACHE;
    q.register_kv_cache = &rk;
    Kvtier__Response *r = NULL;
    assert_int_equal(kvtc_call(c, &q, &r), KVT_EINVAL);
    kvt_kv_stats st;
    assert_int_equal(kvt_kv_stats_get(c, &st), KVT_OK);
    assert_int_equal(st.registrations, 0);
    deng_close(&e);
    kvt_close(c);
}

/* Each tensor must lie inside the allocation its IPC handle opened
 * (cuMemGetAddressRange of the mapping): an offset past its end, a
 * tensor running over it, an offset that wraps the address space and a
 * pointer CUDA knows no allocation of are refused with one text that
 * says nothing of what is mapped; the same engine, offsets right, works. */
static void test_gpu_register_bounds(void **state)
{
    (void)state;
    kvt_client *c = td_connect(&D);
    static struct deng e;
    fx_shape s = shape();
    kvt_kv_reg reg;
    deng_open(&e, KVT_LAYOUT_VLLM_FLASH_NHD, &s, 13);
    const uint64_t tb = e.h.f.tensor_bytes;
    const uint64_t bad[] = {tb, tb + 4096, 64, UINT64_MAX - 63, 1ull << 40};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        if (real && bad[i] == 64) continue; /* may fit the allocation's slack */
        e.off[1] = bad[i];
        assert_int_equal(reg_gpu(c, &e, "gpu/bounds", 0, &reg), KVT_EINVAL);
        assert_non_null(strstr(kvt_last_error(c),
                               "does not lie inside its IPC allocation"));
    }
    e.off[1] = 0;
    if (!real) {
        faults("mem_range");
        assert_int_equal(reg_gpu(c, &e, "gpu/bounds", 0, &reg), KVT_EINVAL);
        assert_non_null(strstr(kvt_last_error(c),
                               "does not lie inside its IPC allocation"));
        faults("");
    }
    kvt_kv_stats st;
    assert_int_equal(kvt_kv_stats_get(c, &st), KVT_OK);
    assert_int_equal(st.registrations, 0);
    /* The good one: registered, and a save and load go through it. */
    assert_int_equal(reg_gpu(c, &e, "gpu/bounds", 0, &reg), KVT_OK);
    kvt_key k[NK];
    int32_t ids[NK * 2];
    for (size_t i = 0; i < NK; i++) k[i] = td_key(1300 + i);
    for (size_t i = 0; i < NK * 2; i++) ids[i] = (int32_t)i;
    assert_int_equal(xfer(c, 1, "gpu/bounds", reg, k, ids).err, KVT_OK);
    for (size_t i = 0; i < NK * 2; i++) ids[i] = (int32_t)(10 + i);
    assert_int_equal(xfer(c, 0, "gpu/bounds", reg, k, ids).err, KVT_OK);
    assert_int_equal(kvt_kv_unregister(c, reg), KVT_OK);
    deng_close(&e);
    kvt_close(c);
}

/* A CUDA failure inside a transfer is that transfer's error. */
static void test_gpu_transfer_errors(void **state)
{
    (void)state;
    SKIP_IF_REAL();
    kvt_client *c = td_connect(&D);
    static struct deng e;
    fx_shape s = shape();
    kvt_kv_reg reg;
    kvt_key k[NK];
    int32_t ids[NK * 2];
    deng_open(&e, KVT_LAYOUT_VLLM_FLASH_NHD, &s, 11);
    assert_int_equal(reg_gpu(c, &e, "gpu/xerr", 0, &reg), KVT_OK);
    for (size_t i = 0; i < NK; i++) k[i] = td_key(1100 + i);
    for (size_t i = 0; i < NK * 2; i++) ids[i] = (int32_t)i;
    static const char *const save_faults[] = {"gather", "sync"};
    for (size_t i = 0; i < 2; i++) {
        faults(save_faults[i]);
        kvt_xfer_status st = xfer(c, 1, "gpu/xerr", reg, k, ids);
        assert_int_not_equal(st.err, KVT_OK);
        assert_non_null(strstr(st.msg, "CUDA gather failed"));
        size_t present;
        assert_int_equal(kvt_lookup(c, "gpu/xerr", k, NK, &present, NULL), KVT_OK);
        assert_int_equal(present, 0);
    }
    faults("");
    assert_int_equal(xfer(c, 1, "gpu/xerr", reg, k, ids).err, KVT_OK);
    faults("scatter");
    deng_pull(&e);
    uint64_t sum = kve_sum(&e.h);
    kvt_xfer_status st = xfer(c, 0, "gpu/xerr", reg, k, ids + 0);
    assert_int_equal(st.err, KVT_EIO);
    assert_non_null(strstr(st.msg, "CUDA scatter failed"));
    deng_pull(&e);
    assert_int_equal(kve_sum(&e.h), sum);
    faults("");
    deng_close(&e);
    kvt_close(c);
}

/* A worker that cannot make its CUDA stream fails the transfer it has. */
static void test_gpu_no_stream(void **state)
{
    (void)state;
    SKIP_IF_REAL();
    struct tdaemon d = {0};
    assert_int_equal(start_fake(&d, "stream_create", NULL), 0);
    kvt_client *c = td_connect(&d);
    static struct deng e;
    fx_shape s = shape();
    kvt_kv_reg reg;
    kvt_key k[NK];
    int32_t ids[NK * 2];
    deng_open(&e, KVT_LAYOUT_VLLM_FLASH_NHD, &s, 13);
    assert_int_equal(reg_gpu(c, &e, "gpu/stream", 0, &reg), KVT_OK);
    for (size_t i = 0; i < NK; i++) k[i] = td_key(1300 + i);
    for (size_t i = 0; i < NK * 2; i++) ids[i] = (int32_t)i;
    kvt_xfer_status st = xfer(c, 1, "gpu/stream", reg, k, ids);
    assert_int_equal(st.err, KVT_EIO);
    assert_non_null(strstr(st.msg, "stream_create failed"));
    deng_close(&e);
    kvt_close(c);
    assert_int_equal(td_stop(&d), 0);
    td_cleanup(&d);
}

static kvt_kv_stats kvs(kvt_client *c)
{
    kvt_kv_stats s;
    assert_int_equal(kvt_kv_stats_get(c, &s), KVT_OK);
    return s;
}

/* n keys from seed, saved from blocks ids (bpc each, any may repeat). */
static void save_n(kvt_client *c, kvt_kv_reg reg, uint64_t seed, size_t n,
                   const int32_t *ids)
{
    kvt_key *k = malloc(n * sizeof *k);
    uint32_t bpc = CT / shape().block_size;
    kvt_xfer x;
    kvt_xfer_status st;
    for (size_t i = 0; i < n; i++) k[i] = td_key(seed + i);
    assert_int_equal(kvt_kv_save(c, "gpu/hbm", reg, k, n, ids, n * bpc, NULL, &x),
                     KVT_OK);
    assert_int_equal(kve_wait1(c, x, &st), KVT_OK);
    assert_int_equal(st.err, KVT_OK);
    free(k);
}

/* Load NK keys from seed into blocks dst; 1 if each matches src of from
 * (device tensors: pulled into their mirrors first). */
static int load_matches(kvt_client *c, kvt_kv_reg reg, struct deng *into,
                        int host, uint64_t seed, const int32_t *dst,
                        struct deng *from, const int32_t *src)
{
    kvt_key k[NK];
    uint32_t bpc = CT / shape().block_size;
    for (size_t i = 0; i < NK; i++) k[i] = td_key(seed + i);
    kvt_xfer x;
    kvt_xfer_status st;
    assert_int_equal(kvt_kv_load(c, "gpu/hbm", reg, k, NK, dst, NK * bpc, &x), KVT_OK);
    assert_int_equal(kve_wait1(c, x, &st), KVT_OK);
    assert_int_equal(st.err, KVT_OK);
    if (!host) deng_pull(into);
    deng_pull(from);
    size_t len;
    int ok = 1;
    for (size_t i = 0; i < NK; i++) {
        len = kvt_layout_chunk_bytes(&into->h.f.d, CT);
        uint8_t *a = malloc(len), *b = malloc(len);
        kvt_gather_cpu(&into->h.f.d, dst + i * bpc, bpc, a, len);
        kvt_gather_cpu(&from->h.f.d, src + i * bpc, bpc, b, len);
        ok &= memcmp(a, b, len) == 0;
        free(a);
        free(b);
    }
    return ok;
}

/* GPU SAVEs leave copies in HBM that GPU LOADs read; host LOADs do not;
 * a full HBM demotes its coldest copies (DRAM still has them); a chunk
 * deleted and saved anew is never served from its old copy. */
static void test_hbm_copies(void **state)
{
    (void)state;
    kvt_client *c = td_connect(&D);
    static struct deng e, h;
    fx_shape s = shape();
    kvt_kv_reg rg, rh;
    static int32_t ids[200 * 2];
    int32_t dst[NK * 2];
    deng_open(&e, KVT_LAYOUT_VLLM_FLASH_NHD, &s, 21);
    deng_open(&h, KVT_LAYOUT_VLLM_FLASH_HND, &s, 22);
    assert_int_equal(reg_gpu(c, &e, "gpu/hbm", 0, &rg), KVT_OK);
    assert_int_equal(kve_register(c, &h.h, "gpu/hbm", CT, &rh, NULL), KVT_OK);
    for (size_t i = 0; i < 400; i++) ids[i] = (int32_t)(i % 12);
    for (size_t i = 0; i < NK * 2; i++) dst[i] = (int32_t)(12 + i);
    kvt_kv_stats s0 = kvs(c);
    save_n(c, rg, 2100, NK, ids);
    assert_int_equal(kvs(c).hbm_used, s0.hbm_used + NK * 65536);
    assert_true(load_matches(c, rg, &e, 0, 2100, dst, &e, ids));
    assert_int_equal(kvs(c).hbm_loaded_chunks, s0.hbm_loaded_chunks + NK);
    assert_true(load_matches(c, rh, &h, 1, 2100, dst, &e, ids)); /* host: DRAM */
    assert_int_equal(kvs(c).hbm_loaded_chunks, s0.hbm_loaded_chunks + NK);
    /* 200 more copies do not fit in 8M of 64K units: the oldest go. */
    save_n(c, rg, 3000, 200, ids);
    kvt_kv_stats s1 = kvs(c);
    assert_true(s1.hbm_demoted > s0.hbm_demoted);
    assert_true(s1.hbm_used <= s1.hbm_bytes);
    assert_true(load_matches(c, rg, &e, 0, 2100, dst, &e, ids)); /* from DRAM */
    assert_int_equal(kvs(c).hbm_loaded_chunks, s1.hbm_loaded_chunks);
    /* Deleted and saved again from other blocks: the new bytes load. */
    kvt_key k[NK];
    size_t del;
    for (size_t i = 0; i < NK; i++) k[i] = td_key(3197 + i);
    assert_int_equal(kvt_delete(c, "gpu/hbm", k, NK, &del), KVT_OK);
    assert_int_equal(del, NK);
    int32_t other[NK * 2];
    for (size_t i = 0; i < NK * 2; i++) other[i] = (int32_t)(18 + i);
    save_n(c, rg, 3197, NK, other);
    assert_true(load_matches(c, rg, &e, 0, 3197, dst, &e, other));
    if (!real) { /* a copy that cannot be filled is not made; the SAVE is */
        kvt_kv_stats s2 = kvs(c);
        faults("memcpy");
        save_n(c, rg, 4000, NK, ids);
        faults("");
        assert_true(load_matches(c, rg, &e, 0, 4000, dst, &e, ids));
        assert_int_equal(kvs(c).hbm_loaded_chunks, s2.hbm_loaded_chunks);
    }
    kvt_kv_unregister(c, rg);
    kvt_kv_unregister(c, rh);
    deng_close(&e);
    deng_close(&h);
    kvt_close(c);
}

/* Start-up: a pool CUDA will not register leaves GPU transfers off; an
 * HBM tier that cannot get its memory stops the daemon. */
static void test_gpu_startup_faults(void **state)
{
    (void)state;
    SKIP_IF_REAL();
    struct tdaemon d = {0};
    assert_int_equal(start_fake(&d, "host_register", NULL), 0);
    kvt_client *c = td_connect(&d);
    kvt_kv_stats s;
    assert_int_equal(kvt_kv_stats_get(c, &s), KVT_OK);
    assert_non_null(strstr(s.gpu, "unavailable: cannot register the DRAM pool"));
    kvt_close(c);
    assert_int_equal(td_stop(&d), 0);
    td_cleanup(&d);
    struct tdaemon h = {0};
    assert_int_equal(td_init(&h), 0);
    const char *extra[] = {"--hbm-bytes", "8M", NULL};
    setenv("KVT_FAKE_CUDA_FAIL", "dev_alloc", 1);
    pid_t pid = td_spawn(&h, extra);
    unsetenv("KVT_FAKE_CUDA_FAIL");
    assert_int_equal(td_wait_exit(pid, 20000), 1);
    assert_true(td_log_has(&h, "hbm: cannot set up"));
    td_cleanup(&h);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gpu_available),
        cmocka_unit_test(test_gpu_roundtrip),
        cmocka_unit_test(test_gpu_register_errors),
        cmocka_unit_test(test_gpu_register_bounds),
        cmocka_unit_test(test_gpu_transfer_errors),
        cmocka_unit_test(test_hbm_copies),
        cmocka_unit_test(test_gpu_no_stream),
        cmocka_unit_test(test_gpu_startup_faults),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
