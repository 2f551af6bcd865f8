/*
 * checksum.c -- XXH3-64 chunk checksums, alone or fused with the copy.
 *
 * Design: a chunk is checksummed when it enters the pool and verified when
 * it comes back from a slower tier. Hashing right after the copy would
 * stream the chunk through the cache twice, so kvt_copy_checksum copies in
 * blocks small enough to stay in L2 and hashes each block from the
 * destination while it is still hot. The block size changes only speed:
 * XXH3's streaming API gives the same value as the one-shot call, so
 * kvt_copy_checksum(dst, src, n) == kvt_checksum(src, n) always (seed 0).
 * The streaming state lives on the stack (it needs XXH_STATIC_LINKING_ONLY
 * for its size), so neither call allocates or fails. src and dst must not
 * overlap, as for memcpy.
 */
#define XXH_STATIC_LINKING_ONLY
#include <string.h>

#include <xxhash.h>

#include "kvtier.h"

/* Bytes copied and hashed per step: two blocks (source and destination)
 * fit comfortably in a 256 KiB+ L2. */
#define COPY_BLOCK (64u * 1024u)

uint64_t kvt_checksum(const void *data, size_t n)
{
    return XXH3_64bits(data, n);
}

uint64_t kvt_copy_checksum(void *dst, const void *src, size_t n)
{
    XXH3_state_t st;
    unsigned char *d = dst;
    const unsigned char *s = src;

    if (n <= COPY_BLOCK) {
        if (n > 0)
            memcpy(d, s, n);
        return XXH3_64bits(d, n);
    }
    XXH3_INITSTATE(&st);
    XXH3_64bits_reset(&st);
    for (size_t off = 0; off < n; off += COPY_BLOCK) {
        size_t len = n - off < COPY_BLOCK ? n - off : COPY_BLOCK;
        memcpy(d + off, s + off, len);
        XXH3_64bits_update(&st, d + off, len);
    }
    return XXH3_64bits_digest(&st);
}
