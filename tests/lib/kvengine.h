/*
 * kvengine.h -- a fake inference engine for the KV-cache tests: paged KV
 * tensors of any layout kind in one shared-memory file, filled with
 * random bytes, registered with a daemon through libkvtier.
 *
 * Design: the tensors are cuda/test/fixture.h's (fx_kv), only placed in a
 * file under /dev/shm at a 4 KiB header's distance (so offsets are not
 * all zero), which is what a CPU engine would hand kvtierd. Checks use
 * fx_chunk_matches, which indexes each engine's logical shape without
 * layout.c, so a chunk that is wrong in the daemon is wrong here too.
 * Header-only (static inline); each test binary includes it once.
 *
 * Ownership: kve_open creates and maps the file; kve_close unmaps and
 * removes it.
 */
#ifndef KVT_TEST_KVENGINE_H
#define KVT_TEST_KVENGINE_H

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "daemon.h"
#include "kvtier.h"
#include "layout.h"
#include "test/fixture.h"

#define KVE_HEADER 4096

struct kve {
    fx_kv f;
    char path[96];
    uint8_t *map;
    size_t len;
};

/* Create, size, map and fill the file; 0 or -1. */
static inline int kve_open(struct kve *e, kvt_layout_kind kind,
                           const fx_shape *s, uint64_t seed)
{
    static unsigned serial;
    memset(e, 0, sizeof *e);
    fx_params(&e->f, kind, s);
    for (size_t i = 0; i < e->f.n_tensors; i++) e->f.bases[i] = 4096;
    if (kvt_layout_init(&e->f.d, &e->f.p) != KVT_OK) return -1;
    size_t tb = (e->f.d.tensor_bytes + 63) / 64 * 64;
    e->f.tensor_bytes = e->f.d.tensor_bytes;
    e->len = KVE_HEADER + e->f.n_tensors * tb;
    snprintf(e->path, sizeof e->path, "/dev/shm/kvt-engine-%d-%u", (int)getpid(),
             __atomic_fetch_add(&serial, 1, __ATOMIC_RELAXED)); /* threads too */
    int fd = open(e->path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0 || ftruncate(fd, (off_t)e->len) != 0) return -1;
    void *m = mmap(NULL, e->len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (m == MAP_FAILED) return -1;
    e->map = m;
    for (size_t i = 0; i < e->f.n_tensors; i++) {
        e->f.mem[i] = e->map + KVE_HEADER + i * tb;
        e->f.bases[i] = (uint64_t)(uintptr_t)e->f.mem[i];
    }
    td_fill(e->map, e->len, seed);
    return kvt_layout_init(&e->f.d, &e->f.p) == KVT_OK ? 0 : -1;
}

static inline void kve_close(struct kve *e)
{
    if (e->map) munmap(e->map, e->len);
    if (e->path[0]) unlink(e->path);
    e->map = NULL;
    e->path[0] = '\0';
}

static inline kvt_err kve_register(kvt_client *c, const struct kve *e,
                                   const char *ns, size_t chunk_tokens,
                                   kvt_kv_reg *reg, kvt_kv_info *info)
{
    return kvt_kv_register_host(c, ns, &e->f.p, chunk_tokens, e->path, e->map,
                                reg, info);
}

/* FNV-1a of the whole file: "nothing was written" checks. */
static inline uint64_t kve_sum(const struct kve *e)
{
    return fx_sum_buf(e->map, e->len);
}

/* A random permutation of [0, n) into out (n entries). */
static inline void kve_perm(uint64_t *rng, int32_t *out, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++) out[i] = (int32_t)i;
    for (uint32_t i = n; i > 1; i--) {
        uint32_t j = (uint32_t)(fx_rand(rng) % i);
        int32_t t = out[i - 1];
        out[i - 1] = out[j];
        out[j] = t;
    }
}

/* Wait for one transfer; its status in *st. */
static inline kvt_err kve_wait1(kvt_client *c, kvt_xfer x, kvt_xfer_status *st)
{
    return kvt_kv_wait(c, &x, 1, 20000, st);
}

#endif
