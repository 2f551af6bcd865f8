/*
 * test_layout.c -- KV layout descriptors and the CPU gather/scatter.
 *
 * Design: every check runs for every layout kind and element sizes 1 and
 * 2, on small random tensors. Gathered chunks are compared against rows
 * found by indexing each engine's logical tensor shape (cuda/test/
 * fixture.h), so a wrong stride fails here even when gather and scatter
 * agree with each other. Error paths check that nothing was written (a
 * checksum of the destination before and after). kvt_gpu_open must say
 * why it cannot load CUDA on a machine without a GPU, and may succeed on
 * one that has it. No timing assertions.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "gpu.h"
#include "layout.h"
#include "test/fixture.h"

static const kvt_layout_kind all_kinds[] = {
    KVT_LAYOUT_VLLM_FLASH_NHD, KVT_LAYOUT_VLLM_FLASH_HND,
    KVT_LAYOUT_FLASHINFER_NHD, KVT_LAYOUT_FLASHINFER_HND,
    KVT_LAYOUT_VLLM_CROSS_NHD, KVT_LAYOUT_VLLM_CROSS_HND,
    KVT_LAYOUT_SGLANG_MHA,     KVT_LAYOUT_MLA,
    KVT_LAYOUT_CUSTOM,
};
#define N_KINDS (sizeof(all_kinds) / sizeof(all_kinds[0]))

/* Small shapes: odd head counts and row sizes that are not a multiple of
 * 16 bytes, so no copy path can lean on a round number. */
static const fx_shape shapes[] = {
    {.layers = 3, .blocks = 11, .block_size = 4, .heads = 3,
     .head_size = 8},
    {.layers = 2, .blocks = 7, .block_size = 16, .heads = 2,
     .head_size = 5},
    {.layers = 1, .blocks = 5, .block_size = 1, .heads = 1,
     .head_size = 64},
};
#define N_SHAPES (sizeof(shapes) / sizeof(shapes[0]))

static fx_shape shape_es(size_t i, uint32_t es)
{
    fx_shape s = shapes[i];
    s.elem_size = es;
    return s;
}

static uint8_t *chunk_for(const kvt_layout *d, size_t n, size_t *len)
{
    *len = kvt_layout_chunk_bytes(d, n * d->block_size);
    uint8_t *c = malloc(*len);
    assert_non_null(c);
    memset(c, 0xa5, *len);
    return c;
}

/* Gather from f: the chunk must hold exactly the rows of ids. */
static void check_gather(fx_kv *f, uint64_t *seed, size_t n)
{
    int32_t ids[16];
    size_t len;
    fx_ids(seed, f->d.num_blocks, ids, n);
    uint8_t *c = chunk_for(&f->d, n, &len);
    assert_int_equal(kvt_gather_cpu(&f->d, ids, n, c, len), KVT_OK);
    assert_true(fx_chunk_matches(f, ids, n, c));
    free(c);
}

static void test_gather_matches_shapes(void **state)
{
    (void)state;
    uint64_t seed = 0x1234;
    for (size_t k = 0; k < N_KINDS; k++)
        for (size_t s = 0; s < N_SHAPES; s++)
            for (uint32_t es = 1; es <= 2; es++) {
                fx_kv f;
                fx_shape sh = shape_es(s, es);
                assert_true(fx_alloc(&f, all_kinds[k], &sh));
                fx_fill(&f, seed++);
                check_gather(&f, &seed, sh.blocks < 4 ? sh.blocks : 4);
                check_gather(&f, &seed, 1);
                fx_free(&f);
            }
}

/* Gather blocks of a, scatter into other blocks of a fresh b: b's new
 * blocks gather back to the same chunk, and nothing else of b changed. */
static void round_trip(kvt_layout_kind ka, kvt_layout_kind kb,
                       const fx_shape *sh, uint64_t *seed)
{
    fx_kv a, b, z;
    int32_t src[8], dst[8];
    size_t n = sh->blocks / 2 < 8 ? sh->blocks / 2 : 8, len;
    if (n == 0)
        n = 1;
    assert_true(fx_alloc(&a, ka, sh));
    assert_true(fx_alloc(&b, kb, sh));
    assert_true(fx_alloc(&z, kb, sh));
    fx_fill(&a, fx_rand(seed));
    fx_ids(seed, sh->blocks, src, n);
    fx_ids(seed, sh->blocks, dst, n);
    uint8_t *c1 = chunk_for(&a.d, n, &len);
    uint8_t *c2 = chunk_for(&a.d, n, &len);
    assert_int_equal(kvt_gather_cpu(&a.d, src, n, c1, len), KVT_OK);
    assert_int_equal(kvt_scatter_cpu(&b.d, dst, n, c1, len), KVT_OK);
    assert_true(fx_chunk_matches(&b, dst, n, c1));
    assert_int_equal(kvt_gather_cpu(&b.d, dst, n, c2, len), KVT_OK);
    assert_memory_equal(c1, c2, len);
    /* Undo through a zero chunk: b must be all zero again. */
    memset(c2, 0, len);
    assert_int_equal(kvt_scatter_cpu(&b.d, dst, n, c2, len), KVT_OK);
    assert_true(fx_sum(&b) == fx_sum(&z));
    free(c1);
    free(c2);
    fx_free(&a);
    fx_free(&b);
    fx_free(&z);
}

static void test_round_trip_same_kind(void **state)
{
    (void)state;
    uint64_t seed = 0x5678;
    for (size_t k = 0; k < N_KINDS; k++)
        for (size_t s = 0; s < N_SHAPES; s++)
            for (uint32_t es = 1; es <= 2; es++) {
                fx_shape sh = shape_es(s, es);
                round_trip(all_kinds[k], all_kinds[k], &sh, &seed);
            }
}

static void test_round_trip_across_kinds(void **state)
{
    (void)state;
    uint64_t seed = 0x9abc;
    for (size_t a = 0; a < N_KINDS; a++)
        for (size_t b = 0; b < N_KINDS; b++) {
            if ((all_kinds[a] == KVT_LAYOUT_MLA) !=
                (all_kinds[b] == KVT_LAYOUT_MLA))
                continue; /* MLA has no V: a different chunk shape */
            for (uint32_t es = 1; es <= 2; es++) {
                fx_shape sh = shape_es(0, es);
                round_trip(all_kinds[a], all_kinds[b], &sh, &seed);
            }
        }
}

/* Consecutive ids take the merged-run path; the result must not differ. */
static void test_consecutive_ids(void **state)
{
    (void)state;
    uint64_t seed = 0xdef0;
    int32_t ids[6] = {2, 3, 4, 7, 8, 0};
    for (size_t k = 0; k < N_KINDS; k++) {
        fx_kv f;
        size_t len;
        fx_shape sh = shape_es(0, 2);
        assert_true(fx_alloc(&f, all_kinds[k], &sh));
        fx_fill(&f, fx_rand(&seed));
        uint8_t *c = chunk_for(&f.d, 6, &len);
        assert_int_equal(kvt_gather_cpu(&f.d, ids, 6, c, len), KVT_OK);
        assert_true(fx_chunk_matches(&f, ids, 6, c));
        fx_free(&f);
        free(c);
    }
}

/* Forced threads give the same bytes as one thread, both directions. */
static void test_threads_agree(void **state)
{
    (void)state;
    uint64_t seed = 0x7777;
    fx_shape sh = {.layers = 5, .blocks = 9, .block_size = 4, .heads = 2,
                   .head_size = 8, .elem_size = 2};
    int32_t ids[5];
    for (size_t k = 0; k < N_KINDS; k++) {
        fx_kv f, g;
        size_t len;
        assert_true(fx_alloc(&f, all_kinds[k], &sh));
        assert_true(fx_alloc(&g, all_kinds[k], &sh));
        fx_fill(&f, fx_rand(&seed));
        fx_ids(&seed, sh.blocks, ids, 5);
        uint8_t *c1 = chunk_for(&f.d, 5, &len);
        uint8_t *c3 = chunk_for(&f.d, 5, &len);
        f.d.cpu_threads = 1;
        assert_int_equal(kvt_gather_cpu(&f.d, ids, 5, c1, len), KVT_OK);
        f.d.cpu_threads = 3;
        assert_int_equal(kvt_gather_cpu(&f.d, ids, 5, c3, len), KVT_OK);
        assert_memory_equal(c1, c3, len);
        g.d.cpu_threads = 4;
        assert_int_equal(kvt_scatter_cpu(&g.d, ids, 5, c3, len), KVT_OK);
        assert_true(fx_chunk_matches(&g, ids, 5, c1));
        free(c1);
        free(c3);
        fx_free(&f);
        fx_free(&g);
    }
}

/* Bad ids and a wrong chunk size: an error, and not one byte written. */
static void check_rejects(fx_kv *f, uint64_t *seed)
{
    size_t len;
    int32_t ids[3];
    fx_ids(seed, f->d.num_blocks, ids, 3);
    uint8_t *c = chunk_for(&f->d, 3, &len);
    uint64_t tsum = fx_sum(f), csum = fx_sum_buf(c, len);
    const int32_t bad[][3] = {
        {ids[0], (int32_t)f->d.num_blocks, ids[2]},
        {ids[0], ids[1], -1},
        {INT32_MAX, ids[1], ids[2]},
    };
    for (size_t i = 0; i < 3; i++) {
        assert_int_equal(kvt_gather_cpu(&f->d, bad[i], 3, c, len),
                         KVT_EINVAL);
        assert_int_equal(kvt_scatter_cpu(&f->d, bad[i], 3, c, len),
                         KVT_EINVAL);
    }
    const size_t wrong[] = {0, len - 1, len + 1, len / 3 * 2, len * 2};
    for (size_t i = 0; i < sizeof(wrong) / sizeof(wrong[0]); i++) {
        assert_int_equal(kvt_gather_cpu(&f->d, ids, 3, c, wrong[i]),
                         KVT_EINVAL);
        assert_int_equal(kvt_scatter_cpu(&f->d, ids, 3, c, wrong[i]),
                         KVT_EINVAL);
    }
    /* Chunk of 2 blocks offered for 3, and for 3 offered as 2. */
    size_t len2 = kvt_layout_chunk_bytes(&f->d, 2 * f->d.block_size);
    assert_int_equal(kvt_gather_cpu(&f->d, ids, 3, c, len2), KVT_EINVAL);
    assert_int_equal(kvt_scatter_cpu(&f->d, ids, 2, c, len), KVT_EINVAL);
    assert_int_equal(kvt_gather_cpu(&f->d, ids, 0, c, 0), KVT_EINVAL);
    assert_int_equal(kvt_gather_cpu(&f->d, NULL, 3, c, len), KVT_EINVAL);
    assert_int_equal(kvt_gather_cpu(&f->d, ids, 3, NULL, len), KVT_EINVAL);
    /* A scatter may not write one block twice. */
    const int32_t dup[3] = {ids[0], ids[1], ids[0]};
    assert_int_equal(kvt_scatter_cpu(&f->d, dup, 3, c, len), KVT_EINVAL);
    assert_true(fx_sum(f) == tsum);
    assert_true(fx_sum_buf(c, len) == csum);
    /* Gathering a repeated block is fine. */
    assert_int_equal(kvt_gather_cpu(&f->d, dup, 3, c, len), KVT_OK);
    assert_true(fx_chunk_matches(f, dup, 3, c));
    free(c);
}

static void test_rejects_leave_untouched(void **state)
{
    (void)state;
    uint64_t seed = 0x4242;
    for (size_t k = 0; k < N_KINDS; k++)
        for (uint32_t es = 1; es <= 2; es++) {
            fx_kv f;
            fx_shape sh = shape_es(0, es);
            assert_true(fx_alloc(&f, all_kinds[k], &sh));
            fx_fill(&f, fx_rand(&seed));
            check_rejects(&f, &seed);
            fx_free(&f);
        }
}

static void test_duplicate_check_large(void **state)
{
    (void)state;
    fx_shape sh = {.layers = 1, .blocks = 200, .block_size = 1, .heads = 1,
                   .head_size = 4, .elem_size = 1};
    fx_kv f;
    int32_t ids[100];
    assert_true(fx_alloc(&f, KVT_LAYOUT_VLLM_FLASH_NHD, &sh));
    for (int i = 0; i < 100; i++)
        ids[i] = 199 - 2 * i;
    assert_int_equal(kvt_layout_check_blocks(&f.d, ids, 100, 1), KVT_OK);
    ids[77] = ids[3];
    assert_int_equal(kvt_layout_check_blocks(&f.d, ids, 100, 1), KVT_EINVAL);
    assert_int_equal(kvt_layout_check_blocks(&f.d, ids, 100, 0), KVT_OK);
    fx_free(&f);
}

/* The strides of layout.h's table, for one shape. */
static void test_strides(void **state)
{
    (void)state;
    fx_shape sh = {.layers = 4, .blocks = 10, .block_size = 16, .heads = 8,
                   .head_size = 128, .elem_size = 2};
    const uint64_t R = 256, P = 16 * 8 * R, N = 10, L = 4;
    const struct {
        kvt_layout_kind k;
        uint64_t bs, ts, hs, tensor, k1; /* k1: base of layer 1's K */
    } want[] = {
        {KVT_LAYOUT_VLLM_FLASH_NHD, P, 8 * R, R, 2 * N * P, 0},
        {KVT_LAYOUT_VLLM_FLASH_HND, P, R, 16 * R, 2 * N * P, 0},
        {KVT_LAYOUT_FLASHINFER_NHD, 2 * P, 8 * R, R, 2 * N * P, 0},
        {KVT_LAYOUT_FLASHINFER_HND, 2 * P, R, 16 * R, 2 * N * P, 0},
        {KVT_LAYOUT_VLLM_CROSS_NHD, L * 2 * P, 8 * R, R, N * L * 2 * P,
         2 * P},
        {KVT_LAYOUT_VLLM_CROSS_HND, L * 2 * P, R, L * 2 * 16 * R,
         N * L * 2 * P, 2 * 16 * R},
        {KVT_LAYOUT_SGLANG_MHA, P, 8 * R, R, N * P, 0},
    };
    for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
        fx_kv f;
        assert_true(fx_alloc(&f, want[i].k, &sh));
        assert_int_equal(f.d.block_stride, want[i].bs);
        assert_int_equal(f.d.token_stride, want[i].ts);
        assert_int_equal(f.d.head_stride, want[i].hs);
        assert_int_equal(f.d.tensor_bytes, want[i].tensor);
        uint64_t t1 = want[i].k1 ? f.bases[0] + want[i].k1 : f.bases[1];
        assert_int_equal(f.d.base[2], t1);
        fx_free(&f);
    }
}

static void test_chunk_bytes_and_shape(void **state)
{
    (void)state;
    fx_shape sh = {.layers = 32, .blocks = 2, .block_size = 16, .heads = 8,
                   .head_size = 128, .elem_size = 2};
    fx_kv a, b, m;
    char name[64];
    assert_true(fx_alloc(&a, KVT_LAYOUT_VLLM_FLASH_NHD, &sh));
    assert_true(fx_alloc(&b, KVT_LAYOUT_VLLM_CROSS_HND, &sh));
    sh.head_size = 576;
    assert_true(fx_alloc(&m, KVT_LAYOUT_MLA, &sh));
    /* 256 tokens of Llama-3-8B-like bf16 KV: 32 MiB. */
    assert_int_equal(kvt_layout_chunk_bytes(&a.d, 256), 32u << 20);
    assert_int_equal(kvt_layout_chunk_bytes(&m.d, 256),
                     32ull * 256 * 576 * 2);
    assert_int_equal(kvt_layout_chunk_bytes(&a.d, SIZE_MAX / 2), 0);
    assert_true(kvt_layout_same_shape(&a.d, &b.d));
    assert_false(kvt_layout_same_shape(&a.d, &m.d));
    kvt_layout_shape_str(&a.d, name, sizeof(name));
    assert_string_equal(name, "l32.kv2.h8.d128.e2");
    kvt_layout_shape_str(&m.d, name, sizeof(name));
    assert_string_equal(name, "l32.kv1.h1.d576.e2");
    for (int k = 1; k < KVT_LAYOUT_KIND_COUNT; k++)
        assert_int_equal(
            kvt_layout_kind_parse(kvt_layout_kind_name((kvt_layout_kind)k)),
            k);
    assert_int_equal(kvt_layout_kind_parse("paged"), KVT_LAYOUT_NONE);
    assert_string_equal(kvt_layout_kind_name((kvt_layout_kind)99), "?");
    fx_free(&a);
    fx_free(&b);
    fx_free(&m);
}

/* Each bad parameter alone makes init fail and leaves out alone. */
static void test_init_rejects(void **state)
{
    (void)state;
    fx_shape sh = shape_es(0, 2);
    fx_kv f;
    kvt_layout out;
    assert_true(fx_alloc(&f, KVT_LAYOUT_VLLM_FLASH_NHD, &sh));
    kvt_layout_params ok = f.p;
    assert_int_equal(kvt_layout_init(&out, &ok), KVT_OK);
    assert_int_equal(kvt_layout_init(NULL, &ok), KVT_EINVAL);
    assert_int_equal(kvt_layout_init(&out, NULL), KVT_EINVAL);

    struct { const char *what; kvt_layout_params p; kvt_err want; } bad[24];
    size_t n = 0;
#define BAD(field, value, err)                                              \
    do {                                                                    \
        bad[n].what = #field "=" #value;                                    \
        bad[n].p = ok;                                                      \
        bad[n].p.field = value;                                             \
        bad[n++].want = err;                                                \
    } while (0)
    BAD(kind, KVT_LAYOUT_NONE, KVT_EINVAL);
    BAD(kind, KVT_LAYOUT_KIND_COUNT, KVT_EINVAL);
    BAD(num_layers, 0, KVT_EINVAL);
    BAD(num_layers, KVT_LAYOUT_MAX_LAYERS + 1, KVT_EINVAL);
    BAD(num_blocks, 0, KVT_EINVAL);
    BAD(num_blocks, (uint32_t)INT32_MAX + 1, KVT_EINVAL);
    BAD(block_size, 0, KVT_EINVAL);
    BAD(num_kv_heads, 0, KVT_EINVAL);
    BAD(head_size, 0, KVT_EINVAL);
    BAD(elem_size, 0, KVT_EINVAL);
    BAD(elem_size, 3, KVT_EINVAL);
    BAD(elem_size, 8, KVT_EINVAL);
    BAD(bases, NULL, KVT_EINVAL);
    BAD(n_bases, ok.n_bases + 1, KVT_EINVAL);
    BAD(n_bases, 1, KVT_EINVAL);
    BAD(kind, KVT_LAYOUT_MLA, KVT_EINVAL); /* 3 heads: MLA has one */
    BAD(kind, KVT_LAYOUT_VLLM_CROSS_NHD, KVT_EINVAL); /* wants 1 base */
#undef BAD
    for (size_t i = 0; i < n; i++) {
        memset(&out, 0x5a, sizeof(out));
        uint64_t before = fx_sum_buf(&out, sizeof(out));
        if (kvt_layout_init(&out, &bad[i].p) != bad[i].want)
            fail_msg("%s: want error %d", bad[i].what, (int)bad[i].want);
        assert_true(fx_sum_buf(&out, sizeof(out)) == before);
    }
    /* Sizes whose byte counts overflow 64 bits. */
    kvt_layout_params big = ok;
    big.num_blocks = 0x7fffffff;
    big.head_size = 0xffffffff;
    big.num_kv_heads = 0xffff;
    assert_int_equal(kvt_layout_init(&out, &big), KVT_ETOOBIG);
    /* A NULL or misaligned base. */
    kvt_layout_params p = ok;
    uint64_t bases[3] = {f.bases[0], 0, f.bases[2]};
    p.bases = bases;
    assert_int_equal(kvt_layout_init(&out, &p), KVT_EINVAL);
    bases[1] = f.bases[1] + 1;
    assert_int_equal(kvt_layout_init(&out, &p), KVT_EINVAL);
    bases[1] = UINT64_MAX - 1; /* tensor would wrap the address space */
    assert_int_equal(kvt_layout_init(&out, &p), KVT_ETOOBIG);
    fx_free(&f);
}

static void test_init_rejects_custom(void **state)
{
    (void)state;
    fx_shape sh = shape_es(0, 2);
    fx_kv f;
    kvt_layout out;
    assert_true(fx_alloc(&f, KVT_LAYOUT_CUSTOM, &sh));
    kvt_layout_params p = f.p;
    assert_int_equal(kvt_layout_init(&out, &p), KVT_OK);
    p.num_kv = 3;
    assert_int_equal(kvt_layout_init(&out, &p), KVT_EINVAL);
    p = f.p;
    p.token_stride = 0;
    assert_int_equal(kvt_layout_init(&out, &p), KVT_EINVAL);
    p = f.p;
    p.head_stride = 3; /* not a multiple of elem_size */
    assert_int_equal(kvt_layout_init(&out, &p), KVT_EINVAL);
    p = f.p;
    p.block_stride = UINT64_MAX / 4 * 2; /* aligned, but x10 blocks wraps */
    assert_int_equal(kvt_layout_init(&out, &p), KVT_ETOOBIG);
    fx_free(&f);
}

/* build/tests/unit/test_layout -> build/lib */
static void exe_libdir(char *out, size_t len)
{
    char exe[4096];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    assert_true(n > 0);
    exe[n] = '\0';
    *strrchr(exe, '/') = '\0';
    snprintf(out, len, "%s/../../lib", exe);
}

static void expect_notsup(const char *libdir, const char *needle)
{
    struct kvt_gpu *g = NULL;
    char why[512];
    kvt_err err = kvt_gpu_open(libdir, &g, why, sizeof(why));
    assert_int_equal(err, KVT_ENOTSUP);
    assert_null(g);
    assert_true(why[0] != '\0');
    if (needle != NULL && strstr(why, needle) == NULL)
        fail_msg("reason \"%s\" lacks \"%s\"", why, needle);
}

static void test_gpu_open(void **state)
{
    (void)state;
    char libdir[4200], why[512];
    struct kvt_gpu *g = NULL;
    unsetenv(KVT_CUDA_LIB_ENV);
    exe_libdir(libdir, sizeof(libdir));
    kvt_err err = kvt_gpu_open(libdir, &g, why, sizeof(why));
    if (err == KVT_OK) { /* a machine with a GPU */
        assert_true(kvt_gpu_device_count(g) > 0);
        kvt_gpu_close(g);
    } else {
        assert_int_equal(err, KVT_ENOTSUP);
        assert_true(why[0] != '\0');
        print_message("kvt_gpu_open: %s\n", why);
    }
    kvt_gpu_close(NULL);

    /* Explicitly pointed at nothing, or at something that is no library. */
    setenv(KVT_CUDA_LIB_ENV, "/nonexistent/libkvtier_cuda.so", 1);
    expect_notsup(libdir, "not found");
    char junk[] = "/tmp/kvt_test_layout_XXXXXX";
    int fd = mkstemp(junk);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, "not an ELF file\n", 16), 16);
    close(fd);
    setenv(KVT_CUDA_LIB_ENV, junk, 1);
    expect_notsup(NULL, "cannot load");
    unlink(junk);
    unsetenv(KVT_CUDA_LIB_ENV);
    assert_int_equal(kvt_gpu_open(NULL, NULL, why, sizeof(why)), KVT_EINVAL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_strides),
        cmocka_unit_test(test_gather_matches_shapes),
        cmocka_unit_test(test_round_trip_same_kind),
        cmocka_unit_test(test_round_trip_across_kinds),
        cmocka_unit_test(test_consecutive_ids),
        cmocka_unit_test(test_threads_agree),
        cmocka_unit_test(test_rejects_leave_untouched),
        cmocka_unit_test(test_duplicate_check_large),
        cmocka_unit_test(test_chunk_bytes_and_shape),
        cmocka_unit_test(test_init_rejects),
        cmocka_unit_test(test_init_rejects_custom),
        cmocka_unit_test(test_gpu_open),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
