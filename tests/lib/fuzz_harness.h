/*
 * fuzz_harness.h -- feed one request body to an in-process daemon core.
 *
 * The harness owns a small kvtierd state (an 8 MiB pool under /dev/shm, the
 * index, leases) built on first use, and runs each input through the same
 * decoder and handlers a real request meets, then packs the response. Used
 * by the libFuzzer target (tests/fuzz/fuzz_wire.c, `make fuzz`) and by the
 * corpus replay in the unit suite, so every crash a fuzzer finds becomes a
 * regression test under ASan+UBSan.
 */
#ifndef KVT_FUZZ_HARNESS_H
#define KVT_FUZZ_HARNESS_H

#include <stddef.h>
#include <stdint.h>

/* Returns the kvt_err the daemon answered (0 for success). */
int kvt_fuzz_one(const uint8_t *data, size_t size);
/* Drop every lease and the state; the next call starts afresh. */
void kvt_fuzz_reset(void);

#endif
