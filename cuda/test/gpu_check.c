/*
 * gpu_check.c -- the CUDA gather/scatter against the CPU reference, bit
 * for bit, and its bandwidth against cudaMemcpyAsync (scripts/gpu-check.sh).
 *
 * Design: plain C that reaches CUDA only through kvt_gpu_open, i.e. the
 * same dlopen path the daemon takes. For every layout kind, element sizes
 * 1 and 2 and a few shapes (odd sizes, realistic ones, transfers past the
 * 1024-blocks-per-launch split) it gathers on the GPU into pinned host
 * memory, registered host memory (as the DRAM pool is), device memory,
 * misaligned chunk addresses (narrower vector paths) and, staged, into
 * pageable memory, and compares every chunk with kvt_gather_cpu on a host
 * copy of the tensors; the scatters are compared tensor against tensor
 * with kvt_scatter_cpu. Error paths must leave the destination untouched.
 * A forked child (forked before anyone touches CUDA) opens the tensors by
 * CUDA IPC handle, as kvtierd will, and gathers/scatters through them.
 *
 * Exit: 0 all passed, 1 a check failed, 77 no usable GPU (skipped).
 * --no-bench skips the bandwidth table.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "gpu.h"
#include "layout.h"
#include "test/fixture.h"

static int fails;
static struct kvt_gpu *G;
static const struct kvt_cuda_ops *O;
static kvt_cuda_ctx *C;
static kvt_cuda_stream *S;

#define CHECK(cond)                                                         \
    do {                                                                    \
        if (!(cond)) {                                                      \
            fails++;                                                        \
            fprintf(stderr, "FAIL %s:%d: %s\n", __FILE__, __LINE__, #cond); \
        }                                                                   \
    } while (0)

#define CHECK_ERR(expr, want)                                               \
    do {                                                                    \
        kvt_err e_ = (expr);                                                \
        if (e_ != (want)) {                                                 \
            fails++;                                                        \
            fprintf(stderr, "FAIL %s:%d: %s -> %d, want %d (%s)\n",         \
                    __FILE__, __LINE__, #expr, (int)e_, (int)(want),        \
                    O->last_error());                                       \
        }                                                                   \
    } while (0)

#define CHECK_OK(expr) CHECK_ERR(expr, KVT_OK)

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void *xmalloc(size_t n)
{
    void *p = aligned_alloc(4096, (n + 4095) / 4096 * 4096);
    if (p == NULL) {
        fprintf(stderr, "out of memory (%zu bytes)\n", n);
        exit(1);
    }
    return p;
}

/* ---------------------------------------------------- device tensors -- */

typedef struct dv_kv {
    kvt_layout d;
    void *mem[KVT_LAYOUT_MAX_LAYERS * 2]; /* tensors */
    void *raw[KVT_LAYOUT_MAX_LAYERS * 2]; /* their allocations */
    size_t n, bytes;
} dv_kv;

/* Device tensors shaped like f, holding f's bytes (copy) or zeros, each
 * off bytes into its allocation (off > 0: narrower vectors). */
static int dv_make(dv_kv *v, fx_kv *f, int copy, size_t off)
{
    uint64_t bases[KVT_LAYOUT_MAX_LAYERS * 2];
    kvt_layout_params p = f->p;
    memset(v, 0, sizeof(*v));
    v->n = f->n_tensors;
    v->bytes = f->tensor_bytes;
    for (size_t i = 0; i < v->n; i++) {
        if (O->dev_alloc(C, 0, v->bytes + off, &v->raw[i]) != KVT_OK)
            return 0;
        v->mem[i] = (uint8_t *)v->raw[i] + off;
        bases[i] = (uint64_t)(uintptr_t)v->mem[i];
        if (copy)
            CHECK_OK(O->memcpy_async(C, v->mem[i], f->mem[i], v->bytes, S));
        else
            CHECK_OK(O->memset_async(C, v->mem[i], 0, v->bytes, S));
    }
    CHECK_OK(O->sync(C, S));
    p.bases = bases;
    return kvt_layout_init(&v->d, &p) == KVT_OK &&
           O->check_layout(C, 0, &v->d) == KVT_OK;
}

static void dv_free(dv_kv *v)
{
    for (size_t i = 0; i < v->n; i++)
        if (v->raw[i] != NULL)
            CHECK_OK(O->dev_free(C, v->raw[i]));
}

/* 1 if the device tensors hold exactly f's bytes. */
static int dv_equals(const dv_kv *v, const fx_kv *f)
{
    uint8_t *tmp = xmalloc(v->bytes);
    int same = 1;
    for (size_t i = 0; i < v->n && same; i++) {
        CHECK_OK(O->memcpy_async(C, tmp, v->mem[i], v->bytes, S));
        CHECK_OK(O->sync(C, S));
        same = memcmp(tmp, f->mem[i], v->bytes) == 0;
    }
    free(tmp);
    return same;
}

/* ------------------------------------------------------ one test case -- */

enum mem_kind { MEM_PINNED, MEM_REGISTERED, MEM_DEVICE, MEM_PAGEABLE };
static const char *const mem_names[] = {"pinned", "registered", "device",
                                        "pageable"};

/* A chunk buffer of len bytes (+ slack for misaligned views). */
static void *buf_new(enum mem_kind m, size_t len)
{
    void *p = NULL;
    len += 64;
    switch (m) {
    case MEM_PINNED:
        CHECK_OK(O->host_alloc(C, len, &p));
        break;
    case MEM_REGISTERED:
        p = xmalloc(len);
        CHECK_OK(O->host_register(C, p, len));
        break;
    case MEM_DEVICE:
        CHECK_OK(O->dev_alloc(C, 0, len, &p));
        break;
    case MEM_PAGEABLE:
        p = xmalloc(len);
        break;
    }
    return p;
}

static void buf_free(enum mem_kind m, void *p)
{
    if (p == NULL)
        return;
    if (m == MEM_PINNED)
        CHECK_OK(O->host_free(C, p));
    else if (m == MEM_DEVICE)
        CHECK_OK(O->dev_free(C, p));
    else {
        if (m == MEM_REGISTERED)
            CHECK_OK(O->host_unregister(C, p));
        free(p);
    }
}

/* Copy between host and a buffer of any kind (sync). */
static void buf_copy(void *dst, const void *src, size_t len)
{
    CHECK_OK(O->memcpy_async(C, dst, src, len, S));
    CHECK_OK(O->sync(C, S));
}

typedef struct xcase {
    fx_kv f;            /* host tensors, random */
    dv_kv v;            /* the same on the device */
    int32_t *ids, *ids2;
    size_t n, bpc, n_chunks, cl;
    size_t base_off;    /* device tensors this far into their allocation */
    uint8_t *ref;       /* CPU-gathered chunks of ids */
} xcase;

static void chunk_ptrs(uint8_t *base, size_t off, const xcase *x, void **out)
{
    for (size_t c = 0; c < x->n_chunks; c++)
        out[c] = base + off + c * x->cl;
}

/* GPU gather into memory m at offset off must equal the CPU's chunks. */
static void gather_into(xcase *x, enum mem_kind m, size_t off, int staged)
{
    size_t all = x->n_chunks * x->cl;
    uint8_t *buf = buf_new(m, all), *got = xmalloc(all);
    void **ptrs = calloc(x->n_chunks, sizeof(void *));
    void *stage = NULL;
    chunk_ptrs(buf, off, x, ptrs);
    if (staged) {
        CHECK_OK(O->dev_alloc(C, 0, 2 * x->cl + 16, &stage));
        CHECK_OK(O->gather_staged(C, &x->v.d, x->ids, x->n, x->bpc, ptrs,
                                  x->cl, stage, 2 * x->cl + 16, S));
    } else {
        kvt_err e = O->gather(C, &x->v.d, x->ids, x->n, x->bpc, ptrs, x->cl,
                              S);
        if (m == MEM_PAGEABLE && e == KVT_EINVAL)
            goto out; /* refused: this device cannot read pageable RAM */
        CHECK_ERR(e, KVT_OK);
    }
    CHECK_OK(O->sync(C, S));
    buf_copy(got, buf + off, all);
    if (memcmp(got, x->ref, all) != 0) {
        fails++;
        fprintf(stderr, "FAIL gather %s %s into %s+%zu (es %u)\n",
                staged ? "staged" : "direct",
                kvt_layout_kind_name(x->f.p.kind), mem_names[m], off,
                x->f.p.elem_size);
    }
out:
    if (stage != NULL)
        CHECK_OK(O->dev_free(C, stage));
    buf_free(m, buf);
    free(got);
    free(ptrs);
}

/* GPU scatter of the reference chunks from memory m into fresh device
 * tensors must leave exactly what kvt_scatter_cpu leaves. */
static void scatter_from(xcase *x, enum mem_kind m, size_t off, int staged)
{
    fx_kv want, zero;
    dv_kv dst;
    size_t all = x->n_chunks * x->cl;
    uint8_t *buf = buf_new(m, all);
    void **ptrs = calloc(x->n_chunks, sizeof(void *));
    void *stage = NULL;
    fx_shape sh = {x->f.p.num_layers, x->f.p.num_blocks, x->f.p.block_size,
                   x->f.p.num_kv_heads, x->f.p.head_size, x->f.p.elem_size};
    CHECK(fx_alloc(&want, x->f.p.kind, &sh));
    CHECK(fx_alloc(&zero, x->f.p.kind, &sh));
    CHECK(dv_make(&dst, &zero, 0, x->base_off));
    for (size_t c = 0; c < x->n_chunks; c++)
        CHECK_OK(kvt_scatter_cpu(&want.d, x->ids2 + c * x->bpc, x->bpc,
                                 x->ref + c * x->cl, x->cl));
    buf_copy(buf + off, x->ref, all);
    chunk_ptrs(buf, off, x, ptrs);
    if (staged) {
        CHECK_OK(O->dev_alloc(C, 0, x->cl, &stage));
        CHECK_OK(O->scatter_staged(C, &dst.d, x->ids2, x->n, x->bpc,
                                   (const void *const *)ptrs, x->cl, stage,
                                   x->cl, S));
    } else {
        CHECK_OK(O->scatter(C, &dst.d, x->ids2, x->n, x->bpc,
                            (const void *const *)ptrs, x->cl, S));
    }
    CHECK_OK(O->sync(C, S));
    if (!dv_equals(&dst, &want)) {
        fails++;
        fprintf(stderr, "FAIL scatter %s %s from %s+%zu (es %u)\n",
                staged ? "staged" : "direct",
                kvt_layout_kind_name(x->f.p.kind), mem_names[m], off,
                x->f.p.elem_size);
    }
    if (stage != NULL)
        CHECK_OK(O->dev_free(C, stage));
    dv_free(&dst);
    fx_free(&want);
    fx_free(&zero);
    buf_free(m, buf);
    free(ptrs);
}

/* Refusals: nothing launched, nothing written. */
static void check_refusals(xcase *x)
{
    size_t all = x->n_chunks * x->cl;
    uint8_t *buf = buf_new(MEM_PINNED, all);
    void **ptrs = calloc(x->n_chunks, sizeof(void *));
    int32_t *bad = malloc(x->n * sizeof(int32_t));
    memset(buf, 0x3c, all);
    uint64_t sum = fx_sum_buf(buf, all);
    chunk_ptrs(buf, 0, x, ptrs);
    memcpy(bad, x->ids, x->n * sizeof(int32_t));
    bad[x->n - 1] = (int32_t)x->f.p.num_blocks;
    CHECK_ERR(O->gather(C, &x->v.d, bad, x->n, x->bpc, ptrs, x->cl, S),
              KVT_EINVAL);
    CHECK_ERR(O->gather(C, &x->v.d, x->ids, x->n, x->bpc, ptrs, x->cl + 1,
                        S), KVT_EINVAL);
    if (x->n > 1)
        CHECK_ERR(O->gather(C, &x->v.d, x->ids, x->n - 1, x->bpc, ptrs,
                            x->cl, S), x->bpc == 1 ? KVT_OK : KVT_EINVAL);
    CHECK_OK(O->sync(C, S));
    if (x->bpc != 1)
        CHECK(fx_sum_buf(buf, all) == sum);
    bad[x->n - 1] = bad[0]; /* duplicate: a scatter must refuse */
    if (x->n > 1)
        CHECK_ERR(O->scatter(C, &x->v.d, bad, x->n, x->bpc,
                             (const void *const *)ptrs, x->cl, S),
                  KVT_EINVAL);
    CHECK_OK(O->sync(C, S));
    CHECK(dv_equals(&x->v, &x->f));
    buf_free(MEM_PINNED, buf);
    free(ptrs);
    free(bad);
}

static int xcase_init(xcase *x, kvt_layout_kind kind, const fx_shape *sh,
                      size_t bpc, size_t n_chunks, size_t base_off,
                      uint64_t *seed)
{
    memset(x, 0, sizeof(*x));
    x->base_off = base_off;
    if (!fx_alloc(&x->f, kind, sh))
        return 0;
    fx_fill(&x->f, fx_rand(seed));
    if (!dv_make(&x->v, &x->f, 1, base_off))
        return 0;
    x->bpc = bpc;
    x->n_chunks = n_chunks;
    x->n = bpc * n_chunks;
    x->ids = malloc(x->n * sizeof(int32_t));
    x->ids2 = malloc(x->n * sizeof(int32_t));
    fx_ids(seed, sh->blocks, x->ids, x->n);
    fx_ids(seed, sh->blocks, x->ids2, x->n);
    x->cl = kvt_layout_chunk_bytes(&x->f.d, bpc * sh->block_size);
    x->ref = xmalloc(x->n_chunks * x->cl);
    for (size_t c = 0; c < n_chunks; c++)
        if (kvt_gather_cpu(&x->f.d, x->ids + c * bpc, bpc,
                           x->ref + c * x->cl, x->cl) != KVT_OK)
            return 0;
    return 1;
}

static void xcase_free(xcase *x)
{
    dv_free(&x->v);
    fx_free(&x->f);
    free(x->ids);
    free(x->ids2);
    free(x->ref);
}

static void run_case(kvt_layout_kind kind, const fx_shape *sh, size_t bpc,
                     size_t n_chunks, size_t base_off, uint64_t *seed,
                     int full)
{
    xcase x;
    if (!xcase_init(&x, kind, sh, bpc, n_chunks, base_off, seed)) {
        fails++;
        fprintf(stderr, "FAIL setting up %s\n", kvt_layout_kind_name(kind));
        xcase_free(&x);
        return;
    }
    static const size_t offs[] = {0, 8, 4, 2, 1};
    for (size_t i = 0; i < (full ? 5u : 1u); i++)
        gather_into(&x, MEM_PINNED, offs[i], 0);
    gather_into(&x, MEM_REGISTERED, 0, 0);
    gather_into(&x, MEM_DEVICE, full ? 2 : 0, 0);
    gather_into(&x, MEM_PAGEABLE, 0, 0);
    gather_into(&x, MEM_PAGEABLE, 0, 1);
    scatter_from(&x, MEM_PINNED, 0, 0);
    scatter_from(&x, MEM_REGISTERED, full ? 1 : 0, 0);
    scatter_from(&x, MEM_DEVICE, 0, 0);
    scatter_from(&x, MEM_PAGEABLE, 0, 1);
    check_refusals(&x);
    xcase_free(&x);
}

static const kvt_layout_kind all_kinds[] = {
    KVT_LAYOUT_VLLM_FLASH_NHD, KVT_LAYOUT_VLLM_FLASH_HND,
    KVT_LAYOUT_FLASHINFER_NHD, KVT_LAYOUT_FLASHINFER_HND,
    KVT_LAYOUT_VLLM_CROSS_NHD, KVT_LAYOUT_VLLM_CROSS_HND,
    KVT_LAYOUT_SGLANG_MHA,     KVT_LAYOUT_MLA,
    KVT_LAYOUT_CUSTOM,
};
#define N_KINDS (sizeof(all_kinds) / sizeof(all_kinds[0]))

static void run_matrix(void)
{
    static const fx_shape shapes[] = {
        {3, 11, 4, 3, 8, 0},      /* odd everything */
        {2, 9, 16, 2, 5, 0},      /* rows of 5 or 10 bytes */
        {4, 40, 16, 8, 128, 0},   /* Llama-like rows of 128 elements */
    };
    uint64_t seed = 0x6a09e667f3bcc908ull;
    for (size_t k = 0; k < N_KINDS; k++)
        for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++)
            for (uint32_t es = 1; es <= 2; es++) {
                fx_shape sh = shapes[s];
                sh.elem_size = es;
                if (all_kinds[k] == KVT_LAYOUT_MLA && s == 2)
                    sh.head_size = 576; /* kv_lora_rank 512 + rope 64 */
                run_case(all_kinds[k], &sh, 2, 3, 0, &seed, s != 2);
                if (s == 0) /* tensors off 16-byte alignment */
                    run_case(all_kinds[k], &sh, 2, 3, es, &seed, 0);
            }
    /* Past one launch: 2100 blocks in chunks of 700, 2052 in chunks of
     * 513 (a launch's last chunk began in the launch before), then 1500
     * chunks of one block (page_size 1, as SGLang runs). */
    fx_shape big = {2, 3000, 1, 2, 64, 2};
    run_case(KVT_LAYOUT_SGLANG_MHA, &big, 700, 3, 0, &seed, 0);
    run_case(KVT_LAYOUT_SGLANG_MHA, &big, 513, 4, 0, &seed, 0);
    run_case(KVT_LAYOUT_SGLANG_MHA, &big, 1, 1500, 0, &seed, 0);
    big.block_size = 16;
    big.blocks = 1200;
    run_case(KVT_LAYOUT_VLLM_CROSS_HND, &big, 1100, 1, 0, &seed, 0);
}

/* ---------------------------------------------------------------- IPC -- */

struct ipc_msg {
    fx_shape shape;
    int32_t kind;
    uint32_t n_handles;
    uint8_t handles[4][KVT_CUDA_IPC_HANDLE_LEN];
    int32_t ids[4], ids2[4];
};

struct ipc_reply {
    int32_t gather_err, scatter_err;
    uint64_t sum;
    char why[240];
};

static int read_full(int fd, void *p, size_t n)
{
    for (size_t got = 0; got < n;) {
        ssize_t r = read(fd, (char *)p + got, n - got);
        if (r <= 0)
            return 0;
        got += (size_t)r;
    }
    return 1;
}

/* The child: kvtierd's side of REGISTER_KV_CACHE + SAVE + LOAD. */
static void ipc_child_work(const struct ipc_msg *m, struct ipc_reply *r)
{
    fx_kv shape_only;
    void *ptrs[4] = {0};
    uint8_t *chunk = NULL;
    kvt_layout d;
    fx_params(&shape_only, (kvt_layout_kind)m->kind, &m->shape);
    for (uint32_t i = 0; i < m->n_handles; i++) {
        r->gather_err = kvt_gpu_ipc_open(G, 0, m->handles[i],
                                         KVT_CUDA_IPC_HANDLE_LEN, &ptrs[i]);
        if (r->gather_err != KVT_OK)
            goto out;
        shape_only.bases[i] = (uint64_t)(uintptr_t)ptrs[i];
    }
    r->gather_err = kvt_layout_init(&d, &shape_only.p);
    if (r->gather_err == KVT_OK)
        r->gather_err = kvt_gpu_check_layout(G, 0, &d);
    if (r->gather_err != KVT_OK)
        goto out;
    size_t cl = kvt_layout_chunk_bytes(&d, 4 * d.block_size);
    r->gather_err = O->host_alloc(C, cl, (void **)&chunk);
    if (r->gather_err != KVT_OK)
        goto out;
    void *cp[1] = {chunk};
    r->gather_err = kvt_gpu_gather(G, &d, m->ids, 4, 4, cp, cl, S);
    if (r->gather_err == KVT_OK)
        r->gather_err = kvt_gpu_sync(G, S);
    r->sum = fx_sum_buf(chunk, cl);
    r->scatter_err = kvt_gpu_scatter(G, &d, m->ids2, 4, 4,
                                     (const void *const *)cp, cl, S);
    if (r->scatter_err == KVT_OK)
        r->scatter_err = kvt_gpu_sync(G, S);
out:
    snprintf(r->why, sizeof(r->why), "%s", kvt_gpu_last_error(G));
    if (chunk != NULL)
        O->host_free(C, chunk);
    for (uint32_t i = 0; i < m->n_handles; i++)
        if (ptrs[i] != NULL)
            kvt_gpu_ipc_close(G, ptrs[i]);
}

static int ipc_child(int in, int out)
{
    struct ipc_msg m;
    struct ipc_reply r = {.gather_err = KVT_EINTERNAL};
    char why[200];
    if (!read_full(in, &m, sizeof(m)))
        return 0; /* parent had no GPU */
    if (kvt_gpu_open(NULL, &G, why, sizeof(why)) != KVT_OK ||
        kvt_gpu_stream_create(G, 0, &S) != KVT_OK) {
        snprintf(r.why, sizeof(r.why), "child: %s", why);
    } else {
        O = kvt_gpu_ops(G);
        C = kvt_gpu_ctx(G);
        ipc_child_work(&m, &r);
    }
    return write(out, &r, sizeof(r)) == (ssize_t)sizeof(r) ? 0 : 1;
}

/* The parent: the engine's side. */
static void ipc_check(int to_child, int from_child)
{
    fx_shape sh = {2, 12, 16, 4, 64, 2};
    struct ipc_msg m = {.shape = sh, .kind = KVT_LAYOUT_VLLM_FLASH_NHD,
                        .ids = {3, 7, 1, 10}, .ids2 = {0, 2, 4, 11}};
    struct ipc_reply r = {.gather_err = KVT_EINTERNAL};
    xcase x;
    uint64_t seed = 99;
    CHECK(xcase_init(&x, KVT_LAYOUT_VLLM_FLASH_NHD, &sh, 4, 1, 0, &seed));
    memcpy(x.ids, m.ids, sizeof(m.ids));
    CHECK_OK(kvt_gather_cpu(&x.f.d, x.ids, 4, x.ref, x.cl));
    m.n_handles = (uint32_t)x.v.n;
    for (uint32_t i = 0; i < m.n_handles; i++)
        CHECK_OK(O->ipc_get(C, x.v.raw[i], m.handles[i],
                            KVT_CUDA_IPC_HANDLE_LEN));
    CHECK(write(to_child, &m, sizeof(m)) == (ssize_t)sizeof(m));
    if (!read_full(from_child, &r, sizeof(r))) {
        fails++;
        fprintf(stderr, "FAIL IPC: no reply from the child\n");
    } else {
        if (r.gather_err != KVT_OK || r.scatter_err != KVT_OK) {
            fails++;
            fprintf(stderr, "FAIL IPC: gather %d scatter %d (%s)\n",
                    r.gather_err, r.scatter_err, r.why);
        }
        CHECK(r.sum == fx_sum_buf(x.ref, x.cl));
        CHECK_OK(kvt_scatter_cpu(&x.f.d, m.ids2, 4, x.ref, x.cl));
        CHECK(dv_equals(&x.v, &x.f)); /* the child's scatter landed */
    }
    printf("ipc: engine tensors opened by handle in a second process: "
           "%s\n", r.gather_err == KVT_OK ? "ok" : "FAILED");
    xcase_free(&x);
}

/* ---------------------------------------------------------- bandwidth -- */

#define BENCH_REPS 5

typedef struct bench_buf {
    uint8_t *host;  /* registered, like the DRAM pool */
    void *lin;      /* device, contiguous: the memcpy baseline */
    void *stage;
    size_t len, stage_len;
} bench_buf;

typedef kvt_err (*bench_fn)(const kvt_layout *d, const int32_t *ids,
                            size_t n, size_t bpc, void **ptrs, size_t cl,
                            bench_buf *b);

static kvt_err bf_gather(const kvt_layout *d, const int32_t *ids, size_t n,
                         size_t bpc, void **ptrs, size_t cl, bench_buf *b)
{
    (void)b;
    return O->gather(C, d, ids, n, bpc, ptrs, cl, S);
}

static kvt_err bf_scatter(const kvt_layout *d, const int32_t *ids, size_t n,
                          size_t bpc, void **ptrs, size_t cl, bench_buf *b)
{
    (void)b;
    return O->scatter(C, d, ids, n, bpc, (const void *const *)ptrs, cl, S);
}

static kvt_err bf_gather_st(const kvt_layout *d, const int32_t *ids,
                            size_t n, size_t bpc, void **ptrs, size_t cl,
                            bench_buf *b)
{
    return O->gather_staged(C, d, ids, n, bpc, ptrs, cl, b->stage,
                            b->stage_len, S);
}

static kvt_err bf_scatter_st(const kvt_layout *d, const int32_t *ids,
                             size_t n, size_t bpc, void **ptrs, size_t cl,
                             bench_buf *b)
{
    return O->scatter_staged(C, d, ids, n, bpc, (const void *const *)ptrs,
                             cl, b->stage, b->stage_len, S);
}

static kvt_err bf_d2h(const kvt_layout *d, const int32_t *ids, size_t n,
                      size_t bpc, void **ptrs, size_t cl, bench_buf *b)
{
    (void)d, (void)ids, (void)bpc, (void)ptrs;
    return O->memcpy_async(C, b->host, b->lin, n / bpc * cl, S);
}

static kvt_err bf_h2d(const kvt_layout *d, const int32_t *ids, size_t n,
                      size_t bpc, void **ptrs, size_t cl, bench_buf *b)
{
    (void)d, (void)ids, (void)bpc, (void)ptrs;
    return O->memcpy_async(C, b->lin, b->host, n / bpc * cl, S);
}

/* Best of BENCH_REPS, in GB/s (10^9 bytes). */
static double bench_time(bench_fn fn, const kvt_layout *d,
                         const int32_t *ids, size_t n, size_t bpc,
                         void **ptrs, size_t cl, bench_buf *b)
{
    double best = 1e30;
    CHECK_OK(fn(d, ids, n, bpc, ptrs, cl, b)); /* warm up */
    CHECK_OK(O->sync(C, S));
    for (int r = 0; r < BENCH_REPS; r++) {
        double t0 = now_s();
        CHECK_OK(fn(d, ids, n, bpc, ptrs, cl, b));
        CHECK_OK(O->sync(C, S));
        double t = now_s() - t0;
        best = t < best ? t : best;
    }
    return (double)(n / bpc * cl) / best / 1e9;
}

struct bench_spec {
    kvt_layout_kind kind;
    fx_shape sh;
    size_t bpc, n_chunks;
};

static void bench_one(const struct bench_spec *s, bench_buf *b,
                      uint64_t *seed)
{
    fx_kv f; /* shape and bases only: the tensors live on the device */
    kvt_layout d;
    void *mem[KVT_LAYOUT_MAX_LAYERS * 2] = {0};
    size_t n = s->bpc * s->n_chunks;
    int32_t *ids = malloc(n * sizeof(int32_t));
    void **ptrs = calloc(s->n_chunks, sizeof(void *));
    fx_params(&f, s->kind, &s->sh);
    for (size_t i = 0; i < f.n_tensors; i++)
        f.bases[i] = 4096;
    CHECK_OK(kvt_layout_init(&d, &f.p));
    for (size_t i = 0; i < f.n_tensors; i++) {
        CHECK_OK(O->dev_alloc(C, 0, d.tensor_bytes, &mem[i]));
        CHECK_OK(O->memset_async(C, mem[i], (int)i + 1, d.tensor_bytes, S));
        f.bases[i] = (uint64_t)(uintptr_t)mem[i];
    }
    CHECK_OK(kvt_layout_init(&d, &f.p));
    size_t cl = kvt_layout_chunk_bytes(&d, s->bpc * d.block_size);
    fx_ids(seed, d.num_blocks, ids, n);
    for (size_t c = 0; c < s->n_chunks; c++)
        ptrs[c] = b->host + c * cl;
    if (s->n_chunks * cl > b->len || cl > b->stage_len) {
        fails++;
        fprintf(stderr, "FAIL bench buffers too small\n");
    } else {
        double g = bench_time(bf_gather, &d, ids, n, s->bpc, ptrs, cl, b);
        double sc = bench_time(bf_scatter, &d, ids, n, s->bpc, ptrs, cl, b);
        double gs = bench_time(bf_gather_st, &d, ids, n, s->bpc, ptrs, cl,
                               b);
        double ss = bench_time(bf_scatter_st, &d, ids, n, s->bpc, ptrs, cl,
                               b);
        double d2h = bench_time(bf_d2h, &d, ids, n, s->bpc, ptrs, cl, b);
        double h2d = bench_time(bf_h2d, &d, ids, n, s->bpc, ptrs, cl, b);
        printf("%-15s %2u %5u %2u %6.1f %7.1f %7.1f %5.2f %7.1f %7.1f %5.2f"
               " %6.1f %6.1f\n",
               kvt_layout_kind_name(s->kind), d.elem_size, d.block_size,
               d.num_layers, (double)(s->n_chunks * cl) / (1 << 20), g, d2h,
               g / d2h, sc, h2d, sc / h2d, gs, ss);
    }
    for (size_t i = 0; i < f.n_tensors; i++)
        if (mem[i] != NULL)
            CHECK_OK(O->dev_free(C, mem[i]));
    free(ids);
    free(ptrs);
}

static void run_bench(void)
{
    /* 512 MiB per transfer of Llama-3-8B-like KV (32 layers, 8 KV heads,
     * head 128), 256-token chunks, the tensors ~4 GiB of HBM. */
    const fx_shape llama = {32, 2048, 16, 8, 128, 2};
    const fx_shape sgl = {32, 32768, 1, 8, 128, 2};
    const fx_shape mla = {32, 512, 64, 1, 576, 2};
    const fx_shape fp8 = {32, 2048, 16, 8, 128, 1};
    const struct bench_spec specs[] = {
        {KVT_LAYOUT_VLLM_FLASH_NHD, llama, 16, 16},
        {KVT_LAYOUT_VLLM_FLASH_HND, llama, 16, 16},
        {KVT_LAYOUT_FLASHINFER_NHD, llama, 16, 16},
        {KVT_LAYOUT_VLLM_CROSS_NHD, llama, 16, 16},
        {KVT_LAYOUT_VLLM_CROSS_HND, llama, 16, 16},
        {KVT_LAYOUT_SGLANG_MHA, sgl, 256, 16},
        {KVT_LAYOUT_MLA, mla, 4, 16},
        {KVT_LAYOUT_VLLM_FLASH_NHD, fp8, 16, 16},
    };
    bench_buf b = {.len = 512u << 20, .stage_len = 64u << 20};
    uint64_t seed = 7;
    b.host = xmalloc(b.len);
    memset(b.host, 0, b.len);
    CHECK_OK(O->host_register(C, b.host, b.len));
    CHECK_OK(O->dev_alloc(C, 0, b.len, &b.lin));
    CHECK_OK(O->dev_alloc(C, 0, b.stage_len, &b.stage));
    printf("\nGPU gather/scatter vs cudaMemcpyAsync of the same bytes, "
           "registered host memory, best of %d (GB/s)\n", BENCH_REPS);
    printf("%-15s %2s %5s %2s %6s %7s %7s %5s %7s %7s %5s %6s %6s\n",
           "layout", "es", "block", "L", "MiB", "gather", "D2H", "ratio",
           "scatter", "H2D", "ratio", "g-stg", "s-stg");
    for (size_t i = 0; i < sizeof(specs) / sizeof(specs[0]); i++)
        bench_one(&specs[i], &b, &seed);
    CHECK_OK(O->dev_free(C, b.lin));
    CHECK_OK(O->dev_free(C, b.stage));
    CHECK_OK(O->host_unregister(C, b.host));
    free(b.host);
}

/* ---------------------------------------------------------------- main -- */

int main(int argc, char **argv)
{
    int bench = !(argc > 1 && strcmp(argv[1], "--no-bench") == 0);
    int p2c[2], c2p[2];
    char why[512];
    if (pipe(p2c) != 0 || pipe(c2p) != 0)
        return 1;
    pid_t pid = fork(); /* before anyone touches CUDA */
    if (pid == 0) {
        close(p2c[1]);
        close(c2p[0]);
        _exit(ipc_child(p2c[0], c2p[1]));
    }
    close(p2c[0]);
    close(c2p[1]);
    kvt_err err = kvt_gpu_open(NULL, &G, why, sizeof(why));
    if (err != KVT_OK) {
        printf("SKIP: no usable GPU: %s\n", why);
        close(p2c[1]);
        waitpid(pid, NULL, 0);
        return err == KVT_ENOTSUP ? 77 : 1;
    }
    O = kvt_gpu_ops(G);
    C = kvt_gpu_ctx(G);
    printf("loaded %s, %d device(s)\n", kvt_gpu_lib_path(G),
           kvt_gpu_device_count(G));
    if (kvt_gpu_stream_create(G, 0, &S) != KVT_OK)
        return 1;
    double t0 = now_s();
    run_matrix();
    printf("bit-exact matrix (%zu kinds x es 1,2 x 3 shapes + 4 large): "
           "%s in %.1f s\n", N_KINDS, fails ? "FAILED" : "ok",
           now_s() - t0);
    ipc_check(p2c[1], c2p[0]);
    close(p2c[1]);
    waitpid(pid, NULL, 0);
    if (bench)
        run_bench();
    kvt_gpu_stream_destroy(G, S);
    kvt_gpu_close(G);
    printf("%s: %d failure(s)\n", fails ? "FAILED" : "PASSED", fails);
    return fails ? 1 : 0;
}
