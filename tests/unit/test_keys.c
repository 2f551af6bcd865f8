/*
 * test_keys.c -- chunk keys and checksums against the shared test vectors.
 *
 * Design: the expected keys come from tests/vectors/keys.json, written by
 * an independent Python implementation (tests/python/gen_vectors.py, which
 * tests/python/test_keys.py re-checks), so a bug in common/keys.c cannot
 * hide behind a matching bug here: this file only decodes the vectors and
 * compares. Beyond the vectors it checks properties every scheme must keep
 * (a chain split anywhere and continued with parent gives the same keys;
 * max_keys truncates), the hex helpers, argument validation, and that the
 * fused copy+checksum equals copy-then-checksum.
 *
 * Run from the repository root; KVT_VECTORS overrides the vector path.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "../lib/json.h" /* the Makefile has no -Itests/lib */
#include "kvtier.h"

#define DEFAULT_VECTORS "tests/vectors/keys.json"
#define HEX_LEN (2 * KVT_KEY_LEN + 1)

/* One decoded vector; every pointer is owned by it (see vector_free). */
typedef struct vector {
    const char *name;
    kvt_hash_params p;
    uint32_t *tokens;
    size_t n_tokens;
    kvt_key parent;
    uint8_t *salt, *extra;
    const char **extra_strs;
    kvt_key *want;
    size_t n_want;
} vector;

static json_value *g_doc;

/* --------------------------------------------------------------- helpers */

static void *xcalloc(size_t n, size_t size)
{
    void *p = calloc(n ? n : 1, size);

    assert_non_null(p);
    return p;
}

/* Decode a hex string of any even length into a malloc'd buffer. */
static uint8_t *hex_bytes(const char *hex, size_t *len)
{
    size_t n = strlen(hex);
    uint8_t *b = xcalloc(n / 2, 1);

    assert_int_equal(n % 2, 0);
    for (size_t i = 0; i < n / 2; i++) {
        unsigned v;
        assert_int_equal(sscanf(hex + 2 * i, "%2x", &v), 1);
        b[i] = (uint8_t)v;
    }
    *len = n / 2;
    return b;
}

static const char *str_field(const json_value *v, const char *key)
{
    const char *s = json_string(json_get(v, key));

    if (s == NULL)
        fail_msg("vector field %s is not a string", key);
    return s;
}

static uint64_t uint_field(const json_value *v, const char *key)
{
    uint64_t u = 0;

    if (json_uint(json_get(v, key), &u) != 0)
        fail_msg("vector field %s is not an unsigned integer", key);
    return u;
}

static void decode_tokens(const json_value *jv, vector *v)
{
    const json_value *toks = json_get(jv, "tokens");

    v->n_tokens = json_len(toks);
    v->tokens = xcalloc(v->n_tokens, sizeof *v->tokens);
    for (size_t i = 0; i < v->n_tokens; i++) {
        uint64_t t = 0;
        assert_int_equal(json_uint(json_at(toks, i), &t), 0);
        assert_true(t <= UINT32_MAX);
        v->tokens[i] = (uint32_t)t;
    }
}

static void decode_keys(const json_value *jv, vector *v)
{
    const json_value *keys = json_get(jv, "keys");

    v->n_want = json_len(keys);
    v->want = xcalloc(v->n_want, sizeof *v->want);
    for (size_t i = 0; i < v->n_want; i++)
        assert_int_equal(kvt_key_from_hex(json_string(json_at(keys, i)),
                                          &v->want[i]),
                         KVT_OK);
}

static void decode_extra_strs(const json_value *jv, vector *v)
{
    const json_value *strs = json_get(jv, "extra_strs");

    v->p.n_extra_strs = json_len(strs);
    v->extra_strs = xcalloc(v->p.n_extra_strs, sizeof *v->extra_strs);
    for (size_t i = 0; i < v->p.n_extra_strs; i++) {
        v->extra_strs[i] = json_string(json_at(strs, i));
        assert_non_null(v->extra_strs[i]);
    }
    v->p.extra_strs = v->p.n_extra_strs ? v->extra_strs : NULL;
}

static void decode_params(const json_value *jv, vector *v)
{
    const json_value *seed = json_get(jv, "seed");
    const char *parent = json_string(json_get(jv, "parent"));
    int scheme = kvt_scheme_parse(str_field(jv, "scheme"));

    assert_true(scheme >= 0);
    v->p.scheme = (kvt_scheme)scheme;
    v->p.chunk_tokens = (size_t)uint_field(jv, "chunk_tokens");
    v->p.ns = str_field(jv, "ns");
    v->salt = hex_bytes(str_field(jv, "salt_hex"), &v->p.salt_len);
    v->p.salt = v->salt;
    v->extra = hex_bytes(str_field(jv, "extra_hex"), &v->p.extra_len);
    v->p.extra = v->extra;
    assert_non_null(seed);
    v->p.seed = json_string(seed);
    assert_true(v->p.seed != NULL || seed->type == JSON_NULL);
    if (parent != NULL) {
        assert_int_equal(kvt_key_from_hex(parent, &v->parent), KVT_OK);
        v->p.parent = &v->parent;
    }
    decode_extra_strs(jv, v);
}

/* Decode vector i of the document; strings point into g_doc. */
static void vector_decode(size_t i, vector *v)
{
    const json_value *jv = json_at(json_get(g_doc, "vectors"), i);

    assert_non_null(jv);
    memset(v, 0, sizeof *v);
    v->name = str_field(jv, "name");
    decode_params(jv, v);
    decode_tokens(jv, v);
    decode_keys(jv, v);
}

static void vector_free(vector *v)
{
    free(v->tokens);
    free(v->salt);
    free(v->extra);
    free(v->extra_strs);
    free(v->want);
}

static size_t vector_count(void)
{
    return json_len(json_get(g_doc, "vectors"));
}

static void assert_key_equal(const char *name, size_t i, const kvt_key *got,
                             const kvt_key *want)
{
    char g[HEX_LEN], w[HEX_LEN];

    if (memcmp(got->b, want->b, KVT_KEY_LEN) == 0)
        return;
    kvt_key_to_hex(got, g);
    kvt_key_to_hex(want, w);
    fail_msg("%s key[%zu]: got %s want %s", name, i, g, w);
}

/* ----------------------------------------------------------- the vectors */

static void check_vector(const vector *v)
{
    size_t cap = v->n_want + 2, n = 12345;
    kvt_key *out = xcalloc(cap, sizeof *out);

    assert_int_equal(kvt_hash_chain(&v->p, v->tokens, v->n_tokens, out, cap,
                                    &n),
                     KVT_OK);
    if (n != v->n_want)
        fail_msg("%s: %zu keys, want %zu", v->name, n, v->n_want);
    for (size_t i = 0; i < n; i++)
        assert_key_equal(v->name, i, &out[i], &v->want[i]);
    free(out);
}

static void test_vectors(void **state)
{
    size_t per_scheme[3] = {0, 0, 0};

    (void)state;
    assert_true(vector_count() >= 30);
    for (size_t i = 0; i < vector_count(); i++) {
        vector v;
        vector_decode(i, &v);
        check_vector(&v);
        per_scheme[v.p.scheme]++;
        vector_free(&v);
    }
    for (size_t s = 0; s < 3; s++)
        assert_true(per_scheme[s] >= 5);
}

/* max_keys caps the output; 0 keys need no out array at all. */
static void check_truncation(const vector *v)
{
    kvt_key one[2];
    size_t n = 99;

    memset(one, 0xee, sizeof one);
    assert_int_equal(kvt_hash_chain(&v->p, v->tokens, v->n_tokens, one, 1, &n),
                     KVT_OK);
    assert_int_equal(n, 1);
    assert_key_equal(v->name, 0, &one[0], &v->want[0]);
    assert_int_equal(one[1].b[0], 0xee); /* nothing past max_keys */
    n = 99;
    assert_int_equal(kvt_hash_chain(&v->p, v->tokens, v->n_tokens, NULL, 0, &n),
                     KVT_OK);
    assert_int_equal(n, 0);
}

/* Hashing chunk 0, then the rest with parent = key 0, gives the same keys. */
static void check_split(const vector *v)
{
    kvt_hash_params tail = v->p;
    size_t n = 0, ct = v->p.chunk_tokens;
    kvt_key *out = xcalloc(v->n_want, sizeof *out);

    tail.parent = &v->want[0];
    assert_int_equal(kvt_hash_chain(&tail, v->tokens + ct, v->n_tokens - ct,
                                    out, v->n_want, &n),
                     KVT_OK);
    assert_int_equal(n, v->n_want - 1);
    for (size_t i = 0; i < n; i++)
        assert_key_equal(v->name, i + 1, &out[i], &v->want[i + 1]);
    free(out);
}

static void test_truncation_and_split(void **state)
{
    size_t checked = 0;

    (void)state;
    for (size_t i = 0; i < vector_count(); i++) {
        vector v;
        vector_decode(i, &v);
        if (v.n_want >= 2) {
            check_truncation(&v);
            check_split(&v);
            checked++;
        }
        vector_free(&v);
    }
    assert_true(checked >= 20);
}

/* -------------------------------------------------------------- hex keys */

static void test_hex_round_trip(void **state)
{
    kvt_key k, back;
    char hex[HEX_LEN], upper[HEX_LEN];

    (void)state;
    for (int round = 0; round < 64; round++) {
        for (size_t i = 0; i < KVT_KEY_LEN; i++)
            k.b[i] = (uint8_t)(round * 37 + i * 11);
        kvt_key_to_hex(&k, hex);
        assert_int_equal(strlen(hex), 2 * KVT_KEY_LEN);
        assert_int_equal(kvt_key_from_hex(hex, &back), KVT_OK);
        assert_memory_equal(k.b, back.b, KVT_KEY_LEN);
        for (size_t i = 0; i < sizeof hex; i++)
            upper[i] = (char)(hex[i] >= 'a' ? hex[i] - 'a' + 'A' : hex[i]);
        assert_int_equal(kvt_key_from_hex(upper, &back), KVT_OK);
        assert_memory_equal(k.b, back.b, KVT_KEY_LEN);
    }
    memset(k.b, 0xab, KVT_KEY_LEN);
    kvt_key_to_hex(&k, hex);
    assert_string_equal(hex, "abababababababababababababababab"
                             "abababababababababababababababab");
}

static void expect_bad_hex(const char *hex)
{
    kvt_key k;

    memset(k.b, 0x5c, KVT_KEY_LEN);
    assert_int_equal(kvt_key_from_hex(hex, &k), KVT_EINVAL);
    for (size_t i = 0; i < KVT_KEY_LEN; i++)
        assert_int_equal(k.b[i], 0x5c); /* untouched on error */
}

static void test_bad_hex(void **state)
{
    char buf[2 * KVT_KEY_LEN + 8];
    kvt_key k;
    const size_t spots[] = {0, 1, 31, 62, 63};
    const char bad[] = {'g', 'G', ' ', '-', 'x', ':'};

    (void)state;
    expect_bad_hex(NULL);
    expect_bad_hex("");
    memset(buf, '0', sizeof buf);
    buf[2 * KVT_KEY_LEN - 1] = '\0';
    expect_bad_hex(buf); /* 63 digits */
    buf[2 * KVT_KEY_LEN - 1] = '0';
    buf[2 * KVT_KEY_LEN + 1] = '\0';
    expect_bad_hex(buf); /* 65 digits */
    buf[2 * KVT_KEY_LEN] = '\0';
    assert_int_equal(kvt_key_from_hex(buf, &k), KVT_OK);
    assert_int_equal(kvt_key_from_hex(buf, NULL), KVT_EINVAL);
    for (size_t s = 0; s < sizeof spots / sizeof spots[0]; s++) {
        for (size_t b = 0; b < sizeof bad; b++) {
            buf[spots[s]] = bad[b];
            expect_bad_hex(buf);
        }
        buf[spots[s]] = '0';
    }
}

/* --------------------------------------------------------- bad arguments */

static const uint32_t toks8[8] = {1, 2, 3, 4, 5, 6, 7, 8};

static void expect_einval(const kvt_hash_params *p, const uint32_t *t,
                          size_t nt, kvt_key *out, size_t max)
{
    size_t n = 777;

    assert_int_equal(kvt_hash_chain(p, t, nt, out, max, &n), KVT_EINVAL);
    assert_int_equal(n, 777); /* *n_keys untouched on error */
}

static kvt_hash_params base_params(kvt_scheme s)
{
    kvt_hash_params p;

    memset(&p, 0, sizeof p);
    p.scheme = s;
    p.chunk_tokens = 4;
    p.ns = "ns";
    p.seed = "0";
    return p;
}

static void test_bad_params_common(void **state)
{
    kvt_key out[2];
    size_t n;

    (void)state;
    for (int s = KVT_SCHEME_KVT1; s <= KVT_SCHEME_SGLANG; s++) {
        kvt_hash_params p = base_params((kvt_scheme)s);
        expect_einval(NULL, toks8, 8, out, 2);
        assert_int_equal(kvt_hash_chain(&p, toks8, 8, out, 2, NULL), KVT_EINVAL);
        expect_einval(&p, NULL, 8, out, 2);
        expect_einval(&p, toks8, 8, NULL, 2);
        p.chunk_tokens = 0;
        expect_einval(&p, toks8, 8, out, 2);
        p.chunk_tokens = 4;
        /* Fine: no tokens and no room need no pointers. */
        assert_int_equal(kvt_hash_chain(&p, NULL, 0, NULL, 0, &n), KVT_OK);
        assert_int_equal(n, 0);
        assert_int_equal(kvt_hash_chain(&p, NULL, 0, out, 2, &n), KVT_OK);
        assert_int_equal(n, 0);
    }
    kvt_hash_params p = base_params((kvt_scheme)7);
    expect_einval(&p, toks8, 8, out, 2);
}

static void test_bad_params_kvt1(void **state)
{
    char long_ns[KVT_NS_MAX + 2];
    kvt_key out[2];
    kvt_hash_params p = base_params(KVT_SCHEME_KVT1);
    size_t n;

    (void)state;
    p.ns = NULL;
    expect_einval(&p, toks8, 8, out, 2);
    memset(long_ns, 'n', sizeof long_ns);
    long_ns[KVT_NS_MAX + 1] = '\0';
    p.ns = long_ns;
    expect_einval(&p, toks8, 8, out, 2);
    long_ns[KVT_NS_MAX] = '\0';
    assert_int_equal(kvt_hash_chain(&p, toks8, 8, out, 2, &n), KVT_OK);
    p = base_params(KVT_SCHEME_KVT1);
    p.salt_len = 3;
    expect_einval(&p, toks8, 8, out, 2);
    p = base_params(KVT_SCHEME_KVT1);
    p.extra_len = 3;
    expect_einval(&p, toks8, 8, out, 2);
#if SIZE_MAX > UINT32_MAX
    p = base_params(KVT_SCHEME_KVT1);
    p.chunk_tokens = (size_t)UINT32_MAX + 1;
    expect_einval(&p, toks8, 8, out, 2);
#endif
}

static void test_bad_params_vllm(void **state)
{
    const char *with_null[] = {"lora", NULL};
    kvt_key out[2];
    kvt_hash_params p = base_params(KVT_SCHEME_VLLM);
    size_t n;

    (void)state;
    p.seed = NULL;
    expect_einval(&p, toks8, 8, out, 2);
    p = base_params(KVT_SCHEME_VLLM);
    p.n_extra_strs = 1;
    expect_einval(&p, toks8, 8, out, 2);
    p.extra_strs = with_null;
    p.n_extra_strs = 2;
    expect_einval(&p, toks8, 8, out, 2);
    p.n_extra_strs = 1;
    assert_int_equal(kvt_hash_chain(&p, toks8, 8, out, 2, &n), KVT_OK);
    assert_int_equal(n, 2);
    /* ns is not part of vLLM's hash: none at all is fine. */
    p.ns = NULL;
    assert_int_equal(kvt_hash_chain(&p, toks8, 8, out, 2, &n), KVT_OK);
}

static void test_scheme_parse(void **state)
{
    (void)state;
    assert_int_equal(kvt_scheme_parse("kvt1"), KVT_SCHEME_KVT1);
    assert_int_equal(kvt_scheme_parse("vllm"), KVT_SCHEME_VLLM);
    assert_int_equal(kvt_scheme_parse("sglang"), KVT_SCHEME_SGLANG);
    assert_int_equal(kvt_scheme_parse("KVT1"), -1);
    assert_int_equal(kvt_scheme_parse("kvt"), -1);
    assert_int_equal(kvt_scheme_parse("sglang "), -1);
    assert_int_equal(kvt_scheme_parse(""), -1);
    assert_int_equal(kvt_scheme_parse(NULL), -1);
}

/* -------------------------------------------------------------- checksums */

static void check_copy_checksum(size_t n, size_t src_off, size_t dst_off)
{
    uint8_t *src = xcalloc(n + src_off, 1);
    uint8_t *dst = xcalloc(n + dst_off + 1, 1);
    uint64_t x = 0x9e3779b97f4a7c15ull;

    for (size_t i = 0; i < n; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        src[src_off + i] = (uint8_t)x;
    }
    dst[dst_off + n] = 0x77;
    assert_true(kvt_copy_checksum(dst + dst_off, src + src_off, n) ==
                kvt_checksum(src + src_off, n));
    if (n > 0)
        assert_memory_equal(dst + dst_off, src + src_off, n);
    assert_int_equal(dst[dst_off + n], 0x77); /* no overrun */
    free(src);
    free(dst);
}

static void test_copy_checksum(void **state)
{
    const size_t sizes[] = {0, 1, 4095, 65535, 65536, 65537, 131072,
                            3u << 20, (3u << 20) + 7};

    (void)state;
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        check_copy_checksum(sizes[i], 0, 0);
        check_copy_checksum(sizes[i], 1, 3); /* unaligned */
    }
}

static void test_checksum_known(void **state)
{
    uint8_t a[3] = {1, 2, 3}, b[3] = {1, 2, 4};

    (void)state;
    /* XXH3-64 of the empty input, seed 0 (xxHash reference value). */
    assert_true(kvt_checksum(NULL, 0) == 0x2D06800538D394C2ull);
    assert_true(kvt_copy_checksum(NULL, NULL, 0) == 0x2D06800538D394C2ull);
    assert_true(kvt_checksum(a, 3) != kvt_checksum(b, 3));
}

/* ----------------------------------------------------------------- setup */

static int load_vectors(void **state)
{
    const char *path = getenv("KVT_VECTORS");
    char err[256];

    (void)state;
    if (path == NULL || *path == '\0')
        path = DEFAULT_VECTORS;
    g_doc = json_parse_file(path, err, sizeof err);
    if (g_doc == NULL) {
        fprintf(stderr, "test_keys: %s (run from the repo root or set "
                        "KVT_VECTORS)\n", err);
        return -1;
    }
    return 0;
}

static int free_vectors(void **state)
{
    (void)state;
    json_free(g_doc);
    g_doc = NULL;
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_vectors),
        cmocka_unit_test(test_truncation_and_split),
        cmocka_unit_test(test_hex_round_trip),
        cmocka_unit_test(test_bad_hex),
        cmocka_unit_test(test_bad_params_common),
        cmocka_unit_test(test_bad_params_kvt1),
        cmocka_unit_test(test_bad_params_vllm),
        cmocka_unit_test(test_scheme_parse),
        cmocka_unit_test(test_copy_checksum),
        cmocka_unit_test(test_checksum_known),
    };

    return cmocka_run_group_tests(tests, load_vectors, free_vectors);
}
