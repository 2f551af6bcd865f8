/*
 * checksum_impl.h -- the body of the checksum functions, compiled twice:
 * once for baseline x86-64 (checksum.c) and once with AVX2 enabled
 * (checksum_avx2.c), with XXH3 inlined so each copy gets the vector code
 * of its own target. checksum.c picks one at run time. Define CSUM_SUFFIX
 * before including.
 *
 * Large copies use non-temporal stores: a chunk written into the pool is
 * read later by another process, not by this core, so pulling the
 * destination lines into cache first (a read for ownership per line) would
 * only double the memory traffic. Each block is hashed from the source
 * first, which brings it into L1/L2, and then streamed out from there, so
 * the source is read from memory once.
 */
#define XXH_INLINE_ALL
#define XXH_STATIC_LINKING_ONLY
#include <stdint.h>
#include <string.h>
#include <xxhash.h>
#ifdef __x86_64__
#include <immintrin.h>
#endif

#define CSUM_CAT2(a, b) a##b
#define CSUM_CAT(a, b) CSUM_CAT2(a, b)
#define CSUM_FN(name) CSUM_CAT(name, CSUM_SUFFIX)

/* Bytes hashed then copied per step; stays in L2 between the two. */
#define CSUM_BLOCK (64u * 1024u)
/* Below this, ordinary stores: the bytes may well be read again soon. */
#define CSUM_NT_MIN (512u * 1024u)

uint64_t CSUM_FN(csum_oneshot_)(const void *data, size_t n);
uint64_t CSUM_FN(csum_copy_)(void *dst, const void *src, size_t n);

uint64_t CSUM_FN(csum_oneshot_)(const void *data, size_t n)
{
    return XXH3_64bits(data, n);
}

#ifdef __x86_64__
/* Copy len bytes to a 16-byte aligned dst with streaming stores. */
static void CSUM_FN(stream_copy_)(unsigned char *d, const unsigned char *s, size_t len)
{
    size_t i = 0;
#ifdef __AVX2__
    if (((uintptr_t)d & 31) == 0)
        for (; i + 128 <= len; i += 128)
            for (int k = 0; k < 128; k += 32)
                _mm256_stream_si256((__m256i *)(d + i + k),
                                    _mm256_loadu_si256((const __m256i *)(s + i + k)));
#endif
    for (; i + 64 <= len; i += 64)
        for (int k = 0; k < 64; k += 16)
            _mm_stream_si128((__m128i *)(d + i + k),
                             _mm_loadu_si128((const __m128i *)(s + i + k)));
    if (i < len) memcpy(d + i, s + i, len - i);
}

static uint64_t CSUM_FN(copy_nt_)(unsigned char *d, const unsigned char *s, size_t n)
{
    XXH3_state_t st;
    XXH3_INITSTATE(&st);
    XXH3_64bits_reset(&st);
    size_t head = (16 - ((uintptr_t)d & 15)) & 15;
    XXH3_64bits_update(&st, s, head);
    memcpy(d, s, head);
    for (size_t off = head; off < n; off += CSUM_BLOCK) {
        size_t len = n - off < CSUM_BLOCK ? n - off : CSUM_BLOCK;
        XXH3_64bits_update(&st, s + off, len);
        CSUM_FN(stream_copy_)(d + off, s + off, len);
    }
    _mm_sfence();
    return XXH3_64bits_digest(&st);
}
#endif

/* Ordinary stores, blockwise, hashing each block while it is hot. */
static uint64_t CSUM_FN(copy_cached_)(unsigned char *d, const unsigned char *s, size_t n)
{
    if (n <= CSUM_BLOCK) {
        if (n) memcpy(d, s, n);
        return XXH3_64bits(d, n);
    }
    XXH3_state_t st;
    XXH3_INITSTATE(&st);
    XXH3_64bits_reset(&st);
    for (size_t off = 0; off < n; off += CSUM_BLOCK) {
        size_t len = n - off < CSUM_BLOCK ? n - off : CSUM_BLOCK;
        memcpy(d + off, s + off, len);
        XXH3_64bits_update(&st, d + off, len);
    }
    return XXH3_64bits_digest(&st);
}

uint64_t CSUM_FN(csum_copy_)(void *dst, const void *src, size_t n)
{
#ifdef __x86_64__
    if (n >= CSUM_NT_MIN) return CSUM_FN(copy_nt_)(dst, src, n);
#endif
    return CSUM_FN(copy_cached_)(dst, src, n);
}
