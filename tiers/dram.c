/*
 * dram.c -- the shared-memory DRAM tier (see dram.h).
 *
 * Start-up order matters: lock first, then size, then map. A daemon that
 * finds the file locked stops before touching it, so a running daemon's
 * clients never see their pool truncated under them. fallocate() reserves
 * the pages up front: a sparse tmpfs file that runs out of room would kill
 * clients with SIGBUS on first touch instead of failing here.
 */
#include "dram.h"

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tlsf.h"

static kvt_err dram_alloc(struct tier *t, uint64_t bytes, struct tier_loc *loc)
{
    struct dram *d = (struct dram *)t;
    uint64_t units = (bytes + DRAM_UNIT - 1) / DRAM_UNIT, off;
    if (units == 0) units = 1;
    uint32_t h = tlsf_alloc(d->alloc, units, &off);
    if (h == TLSF_NONE) return KVT_ENOSPC;
    loc->off = off * DRAM_UNIT;
    loc->len = units * DRAM_UNIT;
    loc->h = h;
    return KVT_OK;
}

static kvt_err dram_alloc_at(struct tier *t, uint64_t off, uint64_t bytes,
                             struct tier_loc *loc)
{
    struct dram *d = (struct dram *)t;
    uint64_t units = (bytes + DRAM_UNIT - 1) / DRAM_UNIT;
    if (off % DRAM_UNIT || units == 0) return KVT_EINVAL;
    uint32_t h = tlsf_alloc_at(d->alloc, off / DRAM_UNIT, units);
    if (h == TLSF_NONE) return KVT_ENOSPC;
    *loc = (struct tier_loc){off, units * DRAM_UNIT, h};
    return KVT_OK;
}

static void dram_free(struct tier *t, const struct tier_loc *loc)
{
    tlsf_free(((struct dram *)t)->alloc, loc->h);
}

static kvt_err dram_write(struct tier *t, const struct tier_loc *loc,
                          uint64_t at, const void *src, uint64_t n,
                          tier_done_fn done, void *arg)
{
    struct dram *d = (struct dram *)t;
    if (at > loc->len || n > loc->len - at) return KVT_EINVAL;
    memcpy(d->base + loc->off + at, src, n);
    if (done) done(arg, KVT_OK);
    return KVT_OK;
}

static kvt_err dram_read(struct tier *t, const struct tier_loc *loc,
                         uint64_t at, void *dst, uint64_t n, tier_done_fn done,
                         void *arg)
{
    struct dram *d = (struct dram *)t;
    if (at > loc->len || n > loc->len - at) return KVT_EINVAL;
    memcpy(dst, d->base + loc->off + at, n);
    if (done) done(arg, KVT_OK);
    return KVT_OK;
}

static void dram_usage(struct tier *t, struct tier_usage *u)
{
    struct dram *d = (struct dram *)t;
    u->capacity = d->bytes;
    u->used = d->bytes - tlsf_free_units(d->alloc) * DRAM_UNIT;
    u->free_largest = tlsf_largest_free(d->alloc) * DRAM_UNIT;
    u->fragmentation = tlsf_fragmentation(d->alloc);
    u->meta_bytes = tlsf_mem_bytes(d->alloc);
}

static void dram_destroy(struct tier *t)
{
    dram_close((struct dram *)t, 1);
}

static const struct tier_ops dram_ops = {
    .name = "dram",
    .id = KVT_TIER_DRAM,
    .alloc = dram_alloc,
    .alloc_at = dram_alloc_at,
    .free = dram_free,
    .write = dram_write,
    .read = dram_read,
    .usage = dram_usage,
    .destroy = dram_destroy,
};

static kvt_err lock_pool(struct dram *d, char *err, size_t errlen)
{
    if (flock(d->fd, LOCK_EX | LOCK_NB) == 0) return KVT_OK;
    if (errno == EWOULDBLOCK) {
        snprintf(err, errlen, "pool %s is in use by another kvtierd", d->path);
        return KVT_EBUSY;
    }
    snprintf(err, errlen, "pool %s: flock: %s", d->path, strerror(errno));
    return KVT_EIO;
}

static kvt_err set_owner(struct dram *d, const struct dram_opts *o, char *err,
                         size_t errlen)
{
    if (fchmod(d->fd, o->mode) != 0) goto fail;
    if (o->group && o->group[0]) {
        struct group *g = getgrnam(o->group);
        if (!g) {
            snprintf(err, errlen, "pool group '%s' does not exist", o->group);
            return KVT_EINVAL;
        }
        if (fchown(d->fd, (uid_t)-1, g->gr_gid) != 0) goto fail;
    }
    return KVT_OK;
fail:
    snprintf(err, errlen, "pool %s: %s", d->path, strerror(errno));
    return KVT_EIO;
}

static kvt_err size_and_map(struct dram *d, int adopt, char *err, size_t errlen)
{
    int rv;
    struct stat st;
    d->adopted = adopt && fstat(d->fd, &st) == 0 && (uint64_t)st.st_size == d->bytes;
    if (!d->adopted && (ftruncate(d->fd, 0) != 0 || ftruncate(d->fd, (off_t)d->bytes) != 0)) {
        snprintf(err, errlen, "pool %s: ftruncate: %s", d->path, strerror(errno));
        return KVT_EIO;
    }
    if ((rv = posix_fallocate(d->fd, 0, (off_t)d->bytes)) != 0) {
        snprintf(err, errlen, "pool %s: cannot reserve %llu bytes: %s", d->path,
                 (unsigned long long)d->bytes, strerror(rv));
        return KVT_ENOSPC;
    }
    d->base = mmap(NULL, d->bytes, PROT_READ | PROT_WRITE, MAP_SHARED, d->fd, 0);
    if (d->base == MAP_FAILED) {
        d->base = NULL;
        snprintf(err, errlen, "pool %s: mmap: %s", d->path, strerror(errno));
        return KVT_EIO;
    }
    return KVT_OK;
}

kvt_err dram_open(const struct dram_opts *o, struct dram **out, char *err,
                  size_t errlen)
{
    return dram_open_adopt(o, 0, out, err, errlen);
}

kvt_err dram_open_adopt(const struct dram_opts *o, int adopt, struct dram **out,
                        char *err, size_t errlen)
{
    kvt_err e = KVT_ENOMEM;
    struct dram *d = calloc(1, sizeof *d);
    if (!d) goto fail;
    d->fd = -1;
    if (!(d->path = strdup(o->path))) goto fail;
    d->tier.ops = &dram_ops;
    d->bytes = o->bytes / DRAM_UNIT * DRAM_UNIT;
    d->fd = open(o->path, O_RDWR | O_CREAT | O_CLOEXEC, o->mode);
    if (d->fd < 0) {
        snprintf(err, errlen, "pool %s: %s", o->path, strerror(errno));
        e = KVT_EIO;
        goto fail;
    }
    if ((e = lock_pool(d, err, errlen)) != KVT_OK) goto fail;
    if ((e = set_owner(d, o, err, errlen)) != KVT_OK) goto fail;
    if ((e = size_and_map(d, adopt, err, errlen)) != KVT_OK) goto fail;
    if (!(d->alloc = tlsf_create(d->bytes / DRAM_UNIT))) {
        snprintf(err, errlen, "pool allocator: out of memory");
        e = KVT_ENOMEM;
        goto fail;
    }
    *out = d;
    return KVT_OK;
fail:
    if (e == KVT_ENOMEM && err[0] == '\0') snprintf(err, errlen, "out of memory");
    dram_close(d, 0);
    return e;
}

void dram_close(struct dram *d, int unlink_file)
{
    if (!d) return;
    if (d->base) munmap(d->base, d->bytes);
    if (unlink_file && d->path && d->fd >= 0) unlink(d->path);
    if (d->fd >= 0) close(d->fd);
    tlsf_destroy(d->alloc);
    free(d->path);
    free(d);
}
