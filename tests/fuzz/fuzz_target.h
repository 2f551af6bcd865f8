/*
 * fuzz_target.h -- what every tests/fuzz/fuzz_<name>.c target defines,
 * besides libFuzzer's entry point: its name (its corpus directory is
 * tests/fuzz/corpus-<name>), its valid seeds, and a clean-up run after the
 * replay so leak checking sees only real leaks.
 */
#ifndef KVT_FUZZ_TARGET_H
#define KVT_FUZZ_TARGET_H

#include <stddef.h>
#include <stdint.h>

extern const char fuzz_target_name[];
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
void fuzz_target_seeds(void (*keep)(const uint8_t *b, size_t n));
void fuzz_target_done(void);

#endif
