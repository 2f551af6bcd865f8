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

struct dram {
    struct tier tier; /* first: a struct dram is a struct tier */
    char *path;
    int fd;
    uint8_t *base;
    uint64_t bytes;
    struct tlsf *alloc;
    int adopted;       /* the file's contents were kept (dram_open_adopt) */
    int memfd;         /* a sealed memfd: path is only a label */
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
/* Survive a client truncating the pool file: a SIGBUS inside the pool
 * restores the file's size and the access runs again (dram.c). Install it
 * after any other SIGBUS handler, which it calls for every other fault;
 * dram_close puts that one back. One pool per process. */
void dram_guard(struct dram *d);
/* Times the guard restored the pool's size. */
uint64_t dram_heals(void);
/* Unmap, unlock and (if unlink) remove the file (never a memfd's: it has
 * none). Accepts NULL. */
void dram_close(struct dram *d, int unlink_file);

/* Byte offset of an allocation handle. */
static inline uint64_t dram_block_off(const struct dram *d, uint32_t h)
{
    return tlsf_block_off(d->alloc, h) * DRAM_UNIT;
}

static inline void *dram_ptr(const struct dram *d, uint64_t off)
{
    return d->base + off;
}

#endif
