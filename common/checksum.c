/*
 * checksum.c -- XXH3-64 chunk checksums, alone or fused with the copy.
 *
 * Design: a chunk is checksummed when it enters the pool and verified when
 * it comes back from a slower tier, so the hash sits on the data path and
 * must run near memory speed. The work is in checksum_impl.h, built twice
 * (baseline x86-64 here, AVX2 in checksum_avx2.c) and chosen once at run
 * time: the distribution's libxxhash is built for the baseline ISA and
 * hashes at a third of the AVX2 speed. Streaming and one-shot XXH3 agree,
 * so kvt_copy_checksum(dst, src, n) == kvt_checksum(src, n) always
 * (seed 0). Neither call allocates or fails. src and dst must not overlap.
 */
#include <stddef.h>
#include <stdint.h>

#include "kvtier.h"

#define CSUM_SUFFIX base
#include "checksum_impl.h"

#ifdef __x86_64__
uint64_t csum_oneshot_avx2(const void *data, size_t n);
uint64_t csum_copy_avx2(void *dst, const void *src, size_t n);

static int have_avx2(void)
{
    static int v = -1;
    if (v < 0) v = __builtin_cpu_supports("avx2") ? 1 : 0;
    return v;
}
#else
#define have_avx2() 0
#define csum_oneshot_avx2 csum_oneshot_base
#define csum_copy_avx2 csum_copy_base
#endif

uint64_t kvt_checksum(const void *data, size_t n)
{
    return have_avx2() ? csum_oneshot_avx2(data, n) : csum_oneshot_base(data, n);
}

uint64_t kvt_copy_checksum(void *dst, const void *src, size_t n)
{
    return have_avx2() ? csum_copy_avx2(dst, src, n) : csum_copy_base(dst, src, n);
}
