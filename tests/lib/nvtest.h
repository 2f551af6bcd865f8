/*
 * nvtest.h -- helpers the NVMe-tier tests share: daemons with an NVMe
 * tier, FLUSH / VERIFY / stats through raw requests, chains of chunks
 * whose bytes are a pure function of their seed (td_fill), and waiting
 * for a counter (never a timing assertion: a deadline only bounds how long
 * a test waits before it fails).
 */
#ifndef KVT_TEST_NVTEST_H
#define KVT_TEST_NVTEST_H

#include <stddef.h>
#include <stdint.h>

#include "daemon.h"
#include "kvtier.h"
#include "kvtier.pb-c.h"

#define NVT_NS "nv"

/* Extra daemon args for an NVMe tier of mb MiB in <dir>/nvme, files of
 * file_mb MiB, ended by NULL; more args may follow in rest (NULL-ended). */
void nvt_args(const char **out, size_t cap, int mb, int file_mb,
              const char *const *rest);
/* Start a daemon with the NVMe tier and these extra args. 0 or -1. */
int nvt_start(struct tdaemon *d, int nvme_mb, int file_mb, const char *const *rest);

/* Chunk i of a test: key td_key(i), size_of(i) bytes of td_fill(.., i). */
size_t nvt_size(uint64_t i, size_t base);
/* Put chunks base..base+n-1 of size bytes as a chain (each the parent of
 * the next). KVT_OK or the error. */
kvt_err nvt_put_chain(kvt_client *c, uint64_t base, size_t n, size_t size);
/* 1 if chunk i comes back (inline copy) with exactly its bytes, 0 if it
 * is absent; aborts the test on wrong bytes. */
int nvt_check(kvt_client *c, uint64_t i, size_t size);
/* Tiers of chunks base..base+n-1 (LOOKUP, prefetch as given). Returns
 * the number present as a prefix. */
size_t nvt_lookup(kvt_client *c, uint64_t base, size_t n, int prefetch,
                  kvt_tier *tiers);

kvt_err nvt_flush(kvt_client *c, int evict, Kvtier__FlushResp *out);
kvt_err nvt_verify(kvt_client *c, uint32_t max, Kvtier__VerifyResp *out);
/* The daemon's stats (free with kvtier__response__free_unpacked). */
Kvtier__Response *nvt_stats(kvt_client *c);
/* One NVMe counter by field name of NvmeStats, or tier figure
 * "dram.chunks", "nvme.used", ... ; UINT64_MAX if absent. */
uint64_t nvt_stat(kvt_client *c, const char *name);
/* Poll until nvt_stat(name) >= want or ms pass; returns the last value. */
uint64_t nvt_wait_stat(kvt_client *c, const char *name, uint64_t want, int ms);

#endif
