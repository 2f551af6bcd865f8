/*
 * keys.c -- chunk keys: chained SHA-256 over fixed-size token chunks.
 *
 * Design: a key names a whole token prefix, because each chunk's hash input
 * starts with the key of the chunk before it. Three schemes share one loop
 * and differ only in how a chunk is serialised into the hash:
 *
 *  - kvt1 (ours, DESIGN.md section 2): prev || u32le(n) || tokens as u32le
 *    || u32le(len(extra)) || extra, where the chain starts at a seed that
 *    folds in the namespace and salt, so equal tokens in two namespaces
 *    never share a key.
 *  - vllm: vLLM's sha256_cbor block hash, SHA-256 of the canonical CBOR of
 *    (parent bytes, (tokens...), extra keys or None), chain started at
 *    NONE_HASH = sha256_cbor(PYTHONHASHSEED string). The CBOR is encoded by
 *    hand, shortest-form heads as canonical CBOR requires, and streamed into
 *    the digest so no buffer grows with the chunk.
 *  - sglang: SGLang HiCache's get_hash_str, SHA-256(prior digest || tokens
 *    as u32le); the first chunk has no prior.
 *
 * Engine compatibility notes (checked against vLLM vllm/v1/core/
 * kv_cache_utils.py and vllm/utils/hashing.py, SGLang python/sglang/srt/
 * mem_cache/hicache_storage.py): vLLM must run with
 * --prefix-caching-hash-algo sha256_cbor (its default, "sha256", pickles)
 * and a fixed PYTHONHASHSEED. vLLM puts the LoRA name in every block's
 * extra keys but a cache_salt only in block 0's, so a salted request is
 * hashed as two calls: block 0 with the salt, the rest with parent = key 0.
 * Multimodal extra keys ((hash, offset) pairs) are not expressible here.
 * The engine schemes ignore ns, salt and extra; kvt1 needs ns (at most
 * KVT_NS_MAX bytes) and vllm needs seed.
 *
 * Invariants: the functions are pure (no globals, thread-safe); tokens go
 * into the digest in little-endian order whatever the host order; every
 * length that is hashed as a u32 is checked to fit one (KVT_EINVAL if not);
 * *n_keys is written only on KVT_OK (out may hold some keys after an
 * internal libcrypto failure, KVT_EINTERNAL).
 */
#include <stdint.h>
#include <string.h>

#include <openssl/evp.h>

#include "kvtier.h"

/* Bytes of token encoding staged before each EVP_DigestUpdate: enough to
 * amortise the call, small enough for the stack. */
#define STAGE_BYTES 2048
/* Longest CBOR head: initial byte + 8-byte argument. */
#define CBOR_HEAD_MAX 9

enum { CBOR_UINT = 0, CBOR_BYTES = 2, CBOR_TEXT = 3, CBOR_ARRAY = 4 };
#define CBOR_NULL 0xf6

/* A digest in progress. Errors are sticky so hot loops need not check each
 * update; sha_end reports them once. */
typedef struct sha {
    EVP_MD_CTX *md;
    int failed;
} sha;

static void sha_begin(sha *h)
{
    if (EVP_DigestInit_ex(h->md, EVP_sha256(), NULL) != 1)
        h->failed = 1;
}

static void sha_put(sha *h, const void *data, size_t n)
{
    if (n > 0 && EVP_DigestUpdate(h->md, data, n) != 1)
        h->failed = 1;
}

static kvt_err sha_end(sha *h, kvt_key *out)
{
    unsigned int len = 0;

    if (EVP_DigestFinal_ex(h->md, out->b, &len) != 1 || len != KVT_KEY_LEN)
        h->failed = 1;
    return h->failed ? KVT_EINTERNAL : KVT_OK;
}

static void store_u32le(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
    p[2] = (uint8_t)(v >> 16);
    p[3] = (uint8_t)(v >> 24);
}

static void sha_put_u32le(sha *h, uint32_t v)
{
    uint8_t b[4];

    store_u32le(b, v);
    sha_put(h, b, sizeof b);
}

/* Tokens as consecutive u32le, staged through a stack buffer. */
static void sha_put_tokens_le(sha *h, const uint32_t *tok, size_t n)
{
    uint8_t stage[STAGE_BYTES];
    size_t used = 0;

    for (size_t i = 0; i < n; i++) {
        store_u32le(stage + used, tok[i]);
        used += 4;
        if (used == sizeof stage) {
            sha_put(h, stage, used);
            used = 0;
        }
    }
    sha_put(h, stage, used);
}

/* ------------------------------------------------------------------ CBOR */

/* Encode a CBOR head (major type + argument) in its shortest form, as
 * canonical CBOR (RFC 7049 section 3.9) requires. Returns its length. */
static size_t cbor_head(uint8_t *b, unsigned major, uint64_t v)
{
    uint8_t m = (uint8_t)(major << 5);
    size_t width;

    if (v < 24) {
        b[0] = (uint8_t)(m | v);
        return 1;
    }
    if (v <= 0xff) {
        b[0] = m | 24;
        width = 1;
    } else if (v <= 0xffff) {
        b[0] = m | 25;
        width = 2;
    } else if (v <= 0xffffffffu) {
        b[0] = m | 26;
        width = 4;
    } else {
        b[0] = m | 27;
        width = 8;
    }
    for (size_t i = 0; i < width; i++)
        b[1 + i] = (uint8_t)(v >> (8 * (width - 1 - i)));
    return 1 + width;
}

static void sha_put_cbor_head(sha *h, unsigned major, uint64_t v)
{
    uint8_t b[CBOR_HEAD_MAX];

    sha_put(h, b, cbor_head(b, major, v));
}

static void sha_put_cbor_text(sha *h, const char *s)
{
    size_t n = strlen(s);

    sha_put_cbor_head(h, CBOR_TEXT, n);
    sha_put(h, s, n);
}

/* A CBOR array of unsigned integers, staged through a stack buffer. */
static void sha_put_cbor_tokens(sha *h, const uint32_t *tok, size_t n)
{
    uint8_t stage[STAGE_BYTES];
    size_t used = 0;

    sha_put_cbor_head(h, CBOR_ARRAY, n);
    for (size_t i = 0; i < n; i++) {
        if (used > sizeof stage - CBOR_HEAD_MAX) {
            sha_put(h, stage, used);
            used = 0;
        }
        used += cbor_head(stage + used, CBOR_UINT, tok[i]);
    }
    sha_put(h, stage, used);
}

/* ---------------------------------------------------------------- chains */

/* kvt1 seed: SHA-256("kvt1" || u32le(len ns) || ns || u32le(len salt) || salt). */
static kvt_err kvt1_seed(sha *h, const kvt_hash_params *p, kvt_key *seed)
{
    size_t ns_len = strlen(p->ns);

    sha_begin(h);
    sha_put(h, "kvt1", 4);
    sha_put_u32le(h, (uint32_t)ns_len);
    sha_put(h, p->ns, ns_len);
    sha_put_u32le(h, (uint32_t)p->salt_len);
    sha_put(h, p->salt, p->salt_len);
    return sha_end(h, seed);
}

/* vLLM NONE_HASH: sha256_cbor(PYTHONHASHSEED string). */
static kvt_err vllm_none_hash(sha *h, const kvt_hash_params *p, kvt_key *seed)
{
    sha_begin(h);
    sha_put_cbor_text(h, p->seed);
    return sha_end(h, seed);
}

static void kvt1_chunk(sha *h, const kvt_hash_params *p, const uint32_t *tok)
{
    sha_put_u32le(h, (uint32_t)p->chunk_tokens);
    sha_put_tokens_le(h, tok, p->chunk_tokens);
    sha_put_u32le(h, (uint32_t)p->extra_len);
    sha_put(h, p->extra, p->extra_len);
}

/* The CBOR triple (parent bytes, tokens, extra keys or null). */
static void vllm_chunk(sha *h, const kvt_hash_params *p, const kvt_key *prev,
                       const uint32_t *tok)
{
    sha_put_cbor_head(h, CBOR_ARRAY, 3);
    sha_put_cbor_head(h, CBOR_BYTES, KVT_KEY_LEN);
    sha_put(h, prev->b, KVT_KEY_LEN);
    sha_put_cbor_tokens(h, tok, p->chunk_tokens);
    if (p->n_extra_strs == 0) {
        uint8_t null = CBOR_NULL;
        sha_put(h, &null, 1);
        return;
    }
    sha_put_cbor_head(h, CBOR_ARRAY, p->n_extra_strs);
    for (size_t i = 0; i < p->n_extra_strs; i++)
        sha_put_cbor_text(h, p->extra_strs[i]);
}

/* One chunk's key. prev is NULL only for SGLang's first chunk. */
static kvt_err hash_chunk(sha *h, const kvt_hash_params *p,
                          const kvt_key *prev, const uint32_t *tok,
                          kvt_key *out)
{
    sha_begin(h);
    if (p->scheme == KVT_SCHEME_VLLM) {
        vllm_chunk(h, p, prev, tok);
    } else {
        if (prev != NULL)
            sha_put(h, prev->b, KVT_KEY_LEN);
        if (p->scheme == KVT_SCHEME_KVT1)
            kvt1_chunk(h, p, tok);
        else
            sha_put_tokens_le(h, tok, p->chunk_tokens);
    }
    return sha_end(h, out);
}

/* Where the chain starts: the caller's parent, else the scheme's seed
 * (none for SGLang: *start = NULL). */
static kvt_err chain_start(sha *h, const kvt_hash_params *p, kvt_key *seed,
                           const kvt_key **start)
{
    kvt_err err = KVT_OK;

    *start = p->parent;
    if (p->parent != NULL || p->scheme == KVT_SCHEME_SGLANG)
        return KVT_OK;
    if (p->scheme == KVT_SCHEME_KVT1)
        err = kvt1_seed(h, p, seed);
    else
        err = vllm_none_hash(h, p, seed);
    *start = seed;
    return err;
}

/* ------------------------------------------------------------ validation */

static int bytes_ok(const void *data, size_t len)
{
    return (len == 0 || data != NULL) && len <= UINT32_MAX;
}

static int scheme_params_ok(const kvt_hash_params *p)
{
    switch (p->scheme) {
    case KVT_SCHEME_KVT1:
        return p->ns != NULL && strlen(p->ns) <= KVT_NS_MAX &&
               p->chunk_tokens <= UINT32_MAX &&
               bytes_ok(p->salt, p->salt_len) &&
               bytes_ok(p->extra, p->extra_len);
    case KVT_SCHEME_VLLM:
        if (p->seed == NULL || (p->n_extra_strs > 0 && p->extra_strs == NULL))
            return 0;
        for (size_t i = 0; i < p->n_extra_strs; i++)
            if (p->extra_strs[i] == NULL)
                return 0;
        return 1;
    case KVT_SCHEME_SGLANG:
        return 1;
    }
    return 0;
}

static int params_ok(const kvt_hash_params *p, const uint32_t *tokens,
                     size_t n_tokens, const kvt_key *out, size_t max_keys,
                     const size_t *n_keys)
{
    if (p == NULL || n_keys == NULL || p->chunk_tokens == 0)
        return 0;
    if ((n_tokens > 0 && tokens == NULL) || (max_keys > 0 && out == NULL))
        return 0;
    return scheme_params_ok(p);
}

/* ------------------------------------------------------------------- API */

int kvt_scheme_parse(const char *name)
{
    static const char *const names[] = {
        [KVT_SCHEME_KVT1] = "kvt1",
        [KVT_SCHEME_VLLM] = "vllm",
        [KVT_SCHEME_SGLANG] = "sglang",
    };

    if (name == NULL)
        return -1;
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (strcmp(name, names[i]) == 0)
            return (int)i;
    return -1;
}

static kvt_err hash_chain(sha *h, const kvt_hash_params *p,
                          const uint32_t *tokens, kvt_key *out, size_t n)
{
    kvt_key seed;
    const kvt_key *prev;
    kvt_err err = chain_start(h, p, &seed, &prev);

    for (size_t i = 0; i < n && err == KVT_OK; i++) {
        err = hash_chunk(h, p, prev, tokens + i * p->chunk_tokens, &out[i]);
        prev = &out[i];
    }
    return err;
}

kvt_err kvt_hash_chain(const kvt_hash_params *p, const uint32_t *tokens,
                       size_t n_tokens, kvt_key *out, size_t max_keys,
                       size_t *n_keys)
{
    size_t n;
    kvt_err err;
    sha h = {NULL, 0};

    if (!params_ok(p, tokens, n_tokens, out, max_keys, n_keys))
        return KVT_EINVAL;
    n = n_tokens / p->chunk_tokens;
    if (n > max_keys)
        n = max_keys;
    if (n > 0) {
        h.md = EVP_MD_CTX_new();
        if (h.md == NULL)
            return KVT_ENOMEM;
        err = hash_chain(&h, p, tokens, out, n);
        EVP_MD_CTX_free(h.md);
        if (err != KVT_OK)
            return err;
    }
    *n_keys = n;
    return KVT_OK;
}

void kvt_key_to_hex(const kvt_key *k, char *out)
{
    static const char digits[] = "0123456789abcdef";

    for (size_t i = 0; i < KVT_KEY_LEN; i++) {
        out[2 * i] = digits[k->b[i] >> 4];
        out[2 * i + 1] = digits[k->b[i] & 0xf];
    }
    out[2 * KVT_KEY_LEN] = '\0';
}

static int hex_nibble(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/* Exactly 2*KVT_KEY_LEN hex digits, either case, then the terminator. */
kvt_err kvt_key_from_hex(const char *hex, kvt_key *k)
{
    kvt_key tmp;

    if (hex == NULL || k == NULL)
        return KVT_EINVAL;
    for (size_t i = 0; i < KVT_KEY_LEN; i++) {
        int hi = hex_nibble(hex[2 * i]);
        int lo = hi < 0 ? -1 : hex_nibble(hex[2 * i + 1]);
        if (lo < 0)
            return KVT_EINVAL;
        tmp.b[i] = (uint8_t)(hi << 4 | lo);
    }
    if (hex[2 * KVT_KEY_LEN] != '\0')
        return KVT_EINVAL;
    *k = tmp;
    return KVT_OK;
}
