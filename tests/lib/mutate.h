/*
 * mutate.h -- deterministic byte mutations for replaying fuzz targets in
 * the suite (tests/fuzz/replay_main.c, tests/unit/test_fuzz_replay.c):
 * bit flips, random bytes, truncation, boundary values over 4 or 8 bytes,
 * and growth, driven by a caller-owned xorshift state so every run sees
 * the same inputs.
 */
#ifndef KVT_TEST_MUTATE_H
#define KVT_TEST_MUTATE_H

#include <stddef.h>
#include <stdint.h>

/* The next value of the xorshift state *rng (never seed it with 0). */
uint64_t mut_next(uint64_t *rng);
/* One mutation of b[0..*n), which may grow up to cap bytes. */
void mut_one(uint64_t *rng, uint8_t *b, size_t *n, size_t cap);

#endif
