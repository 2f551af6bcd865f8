/*
 * test_kvcache.c -- engines' KV caches through a real kvtierd: for every
 * layout kind and element size 1, 2 and 4, a fake engine (kvengine.h)
 * registers random tensors in a shared-memory file, SAVEs random blocks
 * as keys, and LOADs them back into other blocks and into a second
 * registration of another kind of the same shape. Every chunk in the pool
 * and every loaded block is checked bit for bit against the engine's own
 * tensors, indexed by its logical shape; blocks a LOAD does not name must
 * not change. Also: a SAVE of cached keys skips them and is done at once,
 * a parent key links the chain, unregister, and what stats say.
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

#include "daemon.h"
#include "kvengine.h"
#include "kvtier.h"

static struct tdaemon D;

#define CHUNK_TOKENS 8
#define N_KEYS 4

static int setup(void **state)
{
    (void)state;
    const char *extra[] = {"--pool-bytes", "256M", NULL};
    return td_start(&D, extra);
}

static int teardown(void **state)
{
    (void)state;
    int rc = td_stop(&D);
    td_cleanup(&D);
    return rc;
}

static const kvt_layout_kind kinds[] = {
    KVT_LAYOUT_VLLM_FLASH_NHD, KVT_LAYOUT_VLLM_FLASH_HND,
    KVT_LAYOUT_FLASHINFER_NHD, KVT_LAYOUT_FLASHINFER_HND,
    KVT_LAYOUT_VLLM_CROSS_NHD, KVT_LAYOUT_VLLM_CROSS_HND,
    KVT_LAYOUT_SGLANG_MHA,     KVT_LAYOUT_CUSTOM,
    KVT_LAYOUT_MLA,
};
#define N_KINDS (sizeof kinds / sizeof kinds[0])

/* Another kind of the same chunk shape (MLA has only itself). */
static kvt_layout_kind partner(size_t i)
{
    if (kinds[i] == KVT_LAYOUT_MLA) return KVT_LAYOUT_MLA;
    return kinds[(i + 1) % (N_KINDS - 1)];
}

static fx_shape shape_of(uint32_t es)
{
    return (fx_shape){.layers = 3, .blocks = 24, .block_size = 4, .heads = 2,
                      .head_size = 12, .elem_size = es};
}

static kvt_key key_of(uint64_t base, size_t i)
{
    return td_key(base * 1000 + i);
}

static void wait_ok(kvt_client *c, kvt_xfer x, uint32_t n_chunks)
{
    kvt_xfer_status st;
    assert_int_equal(kve_wait1(c, x, &st), KVT_OK);
    assert_true(st.done);
    if (st.err != KVT_OK) fail_msg("transfer failed: %s", st.msg);
    assert_int_equal(st.n_chunks, n_chunks);
}

/* Each pooled chunk is exactly the engine's blocks src[i*bpc..]. */
static void check_pool(kvt_client *c, const char *ns, const kvt_key *keys,
                       const struct kve *e, const int32_t *src, uint32_t bpc)
{
    kvt_chunk ch[N_KEYS];
    kvt_lease l;
    size_t got;
    assert_int_equal(kvt_get(c, ns, keys, N_KEYS, &l, ch, &got), KVT_OK);
    assert_int_equal(got, N_KEYS);
    for (size_t i = 0; i < N_KEYS; i++) {
        assert_true(fx_chunk_matches(&e->f, src + i * bpc, bpc, ch[i].data));
        assert_int_equal(kvt_checksum(ch[i].data, ch[i].size), ch[i].checksum);
    }
    assert_int_equal(kvt_release(c, l), KVT_OK);
}

/* Gather blocks ids of e (the CPU reference) into a new buffer. */
static uint8_t *gather(const struct kve *e, const int32_t *ids, size_t n,
                       size_t *len)
{
    *len = kvt_layout_chunk_bytes(&e->f.d, n * e->f.d.block_size);
    uint8_t *b = malloc(*len);
    assert_non_null(b);
    assert_int_equal(kvt_gather_cpu(&e->f.d, ids, n, b, *len), KVT_OK);
    return b;
}

/* Load keys into e's blocks dst; check them against the pooled chunks
 * (i.e. against src of the saving engine) and that no other block moved. */
static void load_check(kvt_client *c, const char *ns, const kvt_key *keys,
                       struct kve *e, const int32_t *dst, const int32_t *rest,
                       size_t n_rest, uint32_t bpc)
{
    kvt_kv_reg reg;
    size_t lb, la;
    assert_int_equal(kve_register(c, e, ns, CHUNK_TOKENS, &reg, NULL), KVT_OK);
    uint8_t *before = gather(e, rest, n_rest, &lb);
    kvt_xfer x;
    assert_int_equal(kvt_kv_load(c, ns, reg, keys, N_KEYS, dst, N_KEYS * bpc, &x),
                     KVT_OK);
    wait_ok(c, x, N_KEYS);
    kvt_chunk ch[N_KEYS];
    kvt_lease l;
    size_t got;
    assert_int_equal(kvt_get(c, ns, keys, N_KEYS, &l, ch, &got), KVT_OK);
    for (size_t i = 0; i < N_KEYS; i++)
        assert_true(fx_chunk_matches(&e->f, dst + i * bpc, bpc, ch[i].data));
    kvt_release(c, l);
    uint8_t *after = gather(e, rest, n_rest, &la);
    assert_memory_equal(before, after, lb);
    free(before);
    free(after);
    assert_int_equal(kvt_kv_unregister(c, reg), KVT_OK);
}

static void roundtrip(kvt_client *c, size_t ki, uint32_t es, uint64_t seed)
{
    fx_shape s = shape_of(es);
    struct kve a, b;
    char ns[64];
    kvt_key keys[N_KEYS];
    int32_t perm[24], perm_b[24];
    uint64_t rng = seed | 1;
    snprintf(ns, sizeof ns, "kv/%s/e%u", kvt_layout_kind_name(kinds[ki]), es);
    assert_int_equal(kve_open(&a, kinds[ki], &s, seed), 0);
    assert_int_equal(kve_open(&b, partner(ki), &s, seed + 1), 0);
    kvt_kv_reg reg;
    kvt_kv_info info;
    assert_int_equal(kve_register(c, &a, ns, CHUNK_TOKENS, &reg, &info), KVT_OK);
    uint32_t bpc = info.blocks_per_chunk, nb = N_KEYS * bpc;
    assert_int_equal(bpc, CHUNK_TOKENS / s.block_size);
    assert_int_equal(info.chunk_bytes,
                     kvt_layout_chunk_bytes(&a.f.d, CHUNK_TOKENS));
    kve_perm(&rng, perm, s.blocks);
    for (size_t i = 0; i < N_KEYS; i++) keys[i] = key_of(seed, i);
    kvt_xfer x;
    assert_int_equal(kvt_kv_save(c, ns, reg, keys, N_KEYS, perm, nb, NULL, &x),
                     KVT_OK);
    wait_ok(c, x, N_KEYS);
    check_pool(c, ns, keys, &a, perm, bpc);
    /* Into other blocks of the same engine, then into the partner. */
    load_check(c, ns, keys, &a, perm + nb, perm + 2 * nb, s.blocks - 2 * nb, bpc);
    kve_perm(&rng, perm_b, s.blocks);
    load_check(c, ns, keys, &b, perm_b, perm_b + nb, s.blocks - nb, bpc);
    assert_int_equal(kvt_kv_unregister(c, reg), KVT_OK);
    kve_close(&a);
    kve_close(&b);
}

static void test_roundtrip_every_layout(void **state)
{
    (void)state;
    kvt_client *c = td_connect(&D);
    static const uint32_t es[] = {1, 2, 4};
    for (size_t k = 0; k < N_KINDS; k++)
        for (size_t e = 0; e < 3; e++) roundtrip(c, k, es[e], 100 + k * 10 + e);
    kvt_kv_stats st;
    assert_int_equal(kvt_kv_stats_get(c, &st), KVT_OK);
    assert_int_equal(st.registrations, 0);
    assert_int_equal(st.transfers, 0);
    assert_int_equal(st.saved_chunks, N_KINDS * 3 * N_KEYS);
    assert_int_equal(st.loaded_chunks, N_KINDS * 3 * N_KEYS * 2);
    assert_int_equal(st.failed, 0);
    kvt_close(c);
}

/* One engine, registered, with keys saved from blocks 0.. */
struct setup1 {
    struct kve e;
    kvt_kv_reg reg;
    uint32_t bpc;
    kvt_key keys[N_KEYS];
    int32_t ids[N_KEYS * 2];
};

static void setup1(kvt_client *c, struct setup1 *s, const char *ns, uint64_t seed)
{
    fx_shape sh = shape_of(2);
    kvt_kv_info info;
    assert_int_equal(kve_open(&s->e, KVT_LAYOUT_VLLM_FLASH_NHD, &sh, seed), 0);
    assert_int_equal(kve_register(c, &s->e, ns, CHUNK_TOKENS, &s->reg, &info), KVT_OK);
    s->bpc = info.blocks_per_chunk;
    for (size_t i = 0; i < N_KEYS; i++) s->keys[i] = key_of(seed, i);
    for (size_t i = 0; i < N_KEYS * s->bpc; i++) s->ids[i] = (int32_t)i;
    kvt_xfer x;
    assert_int_equal(kvt_kv_save(c, ns, s->reg, s->keys, N_KEYS, s->ids,
                                 N_KEYS * s->bpc, NULL, &x), KVT_OK);
    wait_ok(c, x, N_KEYS);
}

static void test_save_skips_cached(void **state)
{
    (void)state;
    kvt_client *c = td_connect(&D);
    struct setup1 s;
    setup1(c, &s, "kv/skip", 7);
    kvt_xfer x;
    kvt_xfer_status st;
    /* The same keys from other blocks: nothing to write, done at once. */
    int32_t other[N_KEYS * 2];
    for (size_t i = 0; i < N_KEYS * s.bpc; i++) other[i] = (int32_t)(23 - i);
    assert_int_equal(kvt_kv_save(c, "kv/skip", s.reg, s.keys, N_KEYS, other,
                                 N_KEYS * s.bpc, NULL, &x), KVT_OK);
    assert_int_equal(kvt_kv_poll(c, &x, 1, &st), KVT_OK);
    assert_true(st.done);
    assert_int_equal(st.err, KVT_OK);
    assert_int_equal(st.n_chunks, 0);
    assert_int_equal(st.n_skipped, N_KEYS);
    /* Reported once: asking again names an unknown transfer. */
    assert_int_equal(kvt_kv_poll(c, &x, 1, &st), KVT_ENOENT);
    /* The pool still holds the first engine blocks. */
    check_pool(c, "kv/skip", s.keys, &s.e, s.ids, s.bpc);
    kvt_close(c);
    kve_close(&s.e);
}

/* A parent key given with the save is the first chunk's parent: deleting
 * chunks keeps working, and lookup sees the whole chain. */
static void test_save_with_parent(void **state)
{
    (void)state;
    kvt_client *c = td_connect(&D);
    struct setup1 s;
    setup1(c, &s, "kv/parent", 8);
    kvt_key more[2] = {key_of(80, 0), key_of(80, 1)};
    kvt_xfer x;
    assert_int_equal(kvt_kv_save(c, "kv/parent", s.reg, more, 2, s.ids,
                                 2 * s.bpc, &s.keys[N_KEYS - 1], &x), KVT_OK);
    wait_ok(c, x, 2);
    kvt_key all[N_KEYS + 2];
    memcpy(all, s.keys, sizeof s.keys);
    memcpy(all + N_KEYS, more, sizeof more);
    size_t present;
    assert_int_equal(kvt_lookup(c, "kv/parent", all, N_KEYS + 2, &present, NULL),
                     KVT_OK);
    assert_int_equal(present, N_KEYS + 2);
    kvt_close(c);
    kve_close(&s.e);
}

/* Unregister: later transfers name an unknown registration; stats count
 * registrations and say whether GPU transfers are available. */
static void test_unregister(void **state)
{
    (void)state;
    kvt_client *c = td_connect(&D);
    struct setup1 s;
    setup1(c, &s, "kv/unreg", 9);
    kvt_kv_stats st;
    assert_int_equal(kvt_kv_stats_get(c, &st), KVT_OK);
    assert_int_equal(st.registrations, 1);
    assert_int_equal(kvt_kv_unregister(c, s.reg), KVT_OK);
    assert_int_equal(kvt_kv_unregister(c, s.reg), KVT_ENOENT);
    kvt_xfer x;
    assert_int_equal(kvt_kv_load(c, "kv/unreg", s.reg, s.keys, N_KEYS, s.ids,
                                 N_KEYS * s.bpc, &x), KVT_ENOENT);
    assert_int_equal(kvt_kv_stats_get(c, &st), KVT_OK);
    assert_int_equal(st.registrations, 0);
    assert_non_null(strstr(st.gpu, "available"));
    kvt_close(c);
    kve_close(&s.e);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_roundtrip_every_layout),
        cmocka_unit_test(test_save_skips_cached),
        cmocka_unit_test(test_save_with_parent),
        cmocka_unit_test(test_unregister),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
