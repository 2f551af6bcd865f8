/*
 * fuzz_wire.c -- libFuzzer target: any bytes as a request to the daemon's
 * decoder and handlers (tests/lib/fuzz_harness.c). `make fuzz` builds it
 * with clang and runs it over tests/fuzz/corpus/; keep the inputs it finds
 * there, and the unit suite replays them on every `make test`.
 */
#include <stddef.h>
#include <stdint.h>

#include "fuzz_harness.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    kvt_fuzz_one(data, size);
    return 0;
}
