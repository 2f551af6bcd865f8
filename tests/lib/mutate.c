/*
 * mutate.c -- see mutate.h.
 */
#include "mutate.h"

#include <string.h>

uint64_t mut_next(uint64_t *rng)
{
    uint64_t x = *rng;
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    return *rng = x;
}

void mut_one(uint64_t *rng, uint8_t *b, size_t *n, size_t cap)
{
    static const uint64_t edge[] = {0, 1, 0x7f, 0xff, 0xffff, 0xffffffffu,
                                    UINT64_MAX, UINT64_MAX - 4095, 1ull << 40};
    switch (mut_next(rng) % 5) {
    case 0: if (*n) b[mut_next(rng) % *n] ^= (uint8_t)(1u << (mut_next(rng) % 8)); break;
    case 1: if (*n) b[mut_next(rng) % *n] = (uint8_t)mut_next(rng); break;
    case 2: if (*n) *n = mut_next(rng) % *n; break;
    case 3: /* a boundary value over 4 or 8 bytes */
        if (*n >= 8) {
            uint64_t x = edge[mut_next(rng) % (sizeof edge / sizeof edge[0])];
            size_t at = mut_next(rng) % (*n - 7);
            memcpy(b + at, &x, mut_next(rng) % 2 ? 8 : 4);
        }
        break;
    default: if (*n < cap) b[(*n)++] = (uint8_t)mut_next(rng); break;
    }
}
