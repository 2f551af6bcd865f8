/*
 * dram.h -- the shared-memory DRAM tier.
 *
 * Design: one file under /dev/shm (or any path) of pool_bytes, created and
 * flock()ed by the daemon at start, mapped MAP_SHARED by the daemon and by
 * every local client. Space is handed out in 4 KiB units by an O(1) TLSF
 * allocator whose metadata lives on the daemon's heap, never in the pool,
 * because clients can write the pool. The flock is how a second daemon
 * learns the pool is taken; a file left by a dead daemon is not locked and
 * is taken over if it is a regular file of this user with one link (the
 * path is predictable: a new file is created with O_EXCL, never through
 * a symlink).
 * A pool may instead be a memfd (dram_opts.memfd): no name, no flock, no
 * file a client could open or truncate. It is sealed against shrinking
 * and growing once sized, so a client handed its fd (SCM_RIGHTS) can map
 * it but never cut it; across a restart it comes back only as an fd
 * someone kept (systemd's fd store), checked by dram_memfd_check.
 *
 * Pools: tenants that must not read each other's bytes each get a pool of
 * their own (dram_add_pool), a file or memfd like the default one. All
 * pools of a daemon are mapped side by side in one reserved virtual range
 * (dram_opts.reserve), the default pool at offset 0 and each added pool
 * after it, so a chunk's offset is global: it names the pool as well as
 * the place, and everything that registers or addresses the range as a
 * whole (NVMe fixed buffers, the UCX registration, the journal's offsets)
 * needs no change. Each pool has its own allocator; an allocation handle
 * is global too (the pool's hbase plus the allocator's own), so a range is
 * freed by its handle alone. A client is handed one pool (its fd, or the
 * default pool's path) and maps only that.
 */
#ifndef KVT_DRAM_H
#define KVT_DRAM_H

#include <stddef.h>
#include <fcntl.h>
#include <stdint.h>

#include "tier.h"
#include "tlsf.h"

#define DRAM_UNIT 4096u

struct dram_opts {
    const char *path;
    uint64_t bytes;
    unsigned mode;     /* file mode, e.g. 0600 */
    const char *group; /* NULL or "" for the daemon's own */
    int memfd;         /* 1: a sealed memfd, path unused */
    int adopt_fd;      /* memfd only: a kept pool fd to adopt, or -1; the
                        * pool owns it from the call on, even on failure */
};

#define DRAM_MEMFD_NAME "kvtier-pool"
/* The seals a memfd pool carries: its size is fixed for good. */
#define DRAM_MEMFD_SEALS (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL)

/* At most the default pool and one per tenant. */
#define DRAM_POOLS_MAX 17

/* One pool: a file or memfd mapped at base + off. */
struct dram_seg {
    char *path;        /* the file, or "memfd:NAME": a label */
    int fd;
    uint64_t off, bytes;
    struct tlsf *alloc;
    uint32_t hbase, hspan; /* its handles: [hbase, hbase + hspan) */
    int adopted;       /* the contents were kept (dram_open_adopt) */
    int memfd;         /* a sealed memfd: path is only a label */
};

struct dram {
    struct tier tier; /* first: a struct dram is a struct tier */
    /* The default pool (seg[0]), set at open and never changed. */
    char *path;
    int fd;
    struct tlsf *alloc;
    int adopted;
    int memfd;
    uint8_t *base;     /* every pool, side by side */
    uint64_t bytes;    /* the pools mapped so far, in total */
    uint64_t reserve;  /* the virtual range at base */
    struct dram_seg seg[DRAM_POOLS_MAX];
    uint32_t n_seg;
};

/* Is fd a memfd pool of exactly bytes (rounded down to DRAM_UNIT) with
 * the seals a pool has? KVT_OK, or KVT_EINVAL with the reason in err. */
kvt_err dram_memfd_check(int fd, uint64_t bytes, char *err, size_t errlen);

/* Create (or take over a stale) pool. KVT_EBUSY if another live daemon
 * holds it; err receives a sentence either way. */
kvt_err dram_open(const struct dram_opts *o, struct dram **out, char *err,
                  size_t errlen);
/* The same, but a stale file of exactly o->bytes keeps its contents
 * (d->adopted = 1) for the caller to adopt; the allocator starts empty
 * either way. */
kvt_err dram_open_adopt(const struct dram_opts *o, int adopt, struct dram **out,
                        char *err, size_t errlen);
/* The same, with reserve bytes of address space for the pools to be
 * added (dram_add_pool); reserve <= o->bytes: the default pool alone. */
kvt_err dram_open_pools(const struct dram_opts *o, int adopt, uint64_t reserve,
                        struct dram **out, char *err, size_t errlen);
/* Map one more pool (o->path, or a memfd named name) after the last
 * one, inside the range reserved at open; its allocator starts empty and
 * seg[*pool].adopted says whether its contents were kept (adopt, as for
 * dram_open_adopt). KVT_ENOSPC if it does not fit the reserve. */
kvt_err dram_add_pool(struct dram *d, const struct dram_opts *o, const char *name,
                      int adopt, uint32_t *pool, char *err, size_t errlen);
/* Allocate in one pool (the tier's alloc takes pool 0). */
kvt_err dram_alloc_in(struct dram *d, uint32_t pool, uint64_t bytes,
                      struct tier_loc *loc);
/* Usage of one pool. */
void dram_pool_usage(const struct dram *d, uint32_t pool, struct tier_usage *u);
/* Bytes allocated in one pool. */
uint64_t dram_pool_used(const struct dram *d, uint32_t pool);
/* The pool holding global offset off (0 when none does). */
uint32_t dram_pool_of_off(const struct dram *d, uint64_t off);
/* A label of the layout (each pool's path and size), for the journal: a
 * changed layout is another pool. */
void dram_layout(const struct dram *d, char *buf, size_t len);

/* Survive a client truncating the pool file: a SIGBUS inside the pool
 * restores the file's size and the access runs again (dram.c). Install it
 * after any other SIGBUS handler, which it calls for every other fault;
 * dram_close puts that one back. It covers every file pool of d; one
 * struct dram per process. */
void dram_guard(struct dram *d);
/* Times the guard restored the pool's size. */
uint64_t dram_heals(void);
/* Unmap, unlock and (if unlink) remove the file (never a memfd's: it has
 * none). Accepts NULL. */
void dram_close(struct dram *d, int unlink_file);

/* The pool an allocation handle belongs to. */
static inline uint32_t dram_pool_of(const struct dram *d, uint32_t h)
{
    for (uint32_t i = 1; i < d->n_seg; i++)
        if (h - d->seg[i].hbase < d->seg[i].hspan) return i;
    return 0;
}

/* Global byte offset of an allocation handle. */
static inline uint64_t dram_block_off(const struct dram *d, uint32_t h)
{
    const struct dram_seg *s = &d->seg[dram_pool_of(d, h)];
    return s->off + tlsf_block_off(s->alloc, h - s->hbase) * DRAM_UNIT;
}

static inline void *dram_ptr(const struct dram *d, uint64_t off)
{
    return d->base + off;
}

#endif
