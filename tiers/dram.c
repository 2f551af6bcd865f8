/*
 * dram.c -- the shared-memory DRAM tier (see dram.h).
 *
 * Start-up order matters: lock first, then size, then map. A daemon that
 * finds the file locked stops before touching it, so a running daemon's
 * clients never see their pool truncated under them. fallocate() reserves
 * the pages up front: a sparse tmpfs file that runs out of room would kill
 * clients with SIGBUS on first touch instead of failing here.
 *
 * The path is predictable, so the file is created with O_EXCL and never
 * through a symlink. A file already there is used only if it is a regular
 * file of this user with one link, not locked by a live daemon: adopted
 * as it is when the caller adopts (its contents are the last run's
 * chunks), else replaced by a new inode that nobody else has open.
 *
 * Clients map the pool read-write, so one can also truncate it, and the
 * daemon's own copies from the pool (inline puts and gets, adoption,
 * workers) would then die of SIGBUS. dram_guard() installs a SIGBUS
 * handler that, for a fault inside the pool of a file found shorter than
 * the pool, restores the file's size and returns: the access runs again
 * on fresh zero pages (the cut chunks read as zeros, no worse than a
 * client writing zeros into them). Any other SIGBUS goes to the handler
 * that was there before. The handler needs the pool in a static: one
 * guarded pool per process.
 *
 * A memfd pool skips all of that: no path to race for, no lock (nobody
 * else can name it), and no truncation to heal. It is sized, reserved,
 * then sealed (shrink, grow, and the seals themselves), so every fd to it,
 * the clients' included, keeps exactly this size; a kept fd offered back
 * at a restart is taken only if it is such a memfd of the very size.
 */
#include "dram.h"

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tlsf.h"

/* Handles a pool's allocator may hand out: below its units, plus a few
 * descriptors a split holds for a moment. */
#define HSPAN_EXTRA 8

kvt_err dram_alloc_in(struct dram *d, uint32_t pool, uint64_t bytes,
                      struct tier_loc *loc)
{
    struct dram_seg *s = &d->seg[pool < d->n_seg ? pool : 0];
    uint64_t units = (bytes + DRAM_UNIT - 1) / DRAM_UNIT, off;
    if (units == 0) units = 1;
    uint32_t h = tlsf_alloc(s->alloc, units, &off);
    if (h == TLSF_NONE) return KVT_ENOSPC;
    if (h >= s->hspan) abort(); /* broken invariant: handles overlap */
    loc->off = s->off + off * DRAM_UNIT;
    loc->len = units * DRAM_UNIT;
    loc->h = s->hbase + h;
    return KVT_OK;
}

static kvt_err dram_alloc(struct tier *t, uint64_t bytes, struct tier_loc *loc)
{
    return dram_alloc_in((struct dram *)t, 0, bytes, loc);
}

uint32_t dram_pool_of_off(const struct dram *d, uint64_t off)
{
    for (uint32_t i = 1; i < d->n_seg; i++)
        if (off - d->seg[i].off < d->seg[i].bytes) return i;
    return 0;
}

/* The range must lie inside one pool. */
static kvt_err dram_alloc_at(struct tier *t, uint64_t off, uint64_t bytes,
                             struct tier_loc *loc)
{
    struct dram *d = (struct dram *)t;
    const struct dram_seg *s = &d->seg[dram_pool_of_off(d, off)];
    uint64_t units = (bytes + DRAM_UNIT - 1) / DRAM_UNIT;
    if (off % DRAM_UNIT || units == 0 || off < s->off) return KVT_EINVAL;
    uint32_t h = tlsf_alloc_at(s->alloc, (off - s->off) / DRAM_UNIT, units);
    if (h == TLSF_NONE) return KVT_ENOSPC;
    if (h >= s->hspan) abort(); /* broken invariant: handles overlap */
    *loc = (struct tier_loc){off, units * DRAM_UNIT, s->hbase + h};
    return KVT_OK;
}

static void dram_free(struct tier *t, const struct tier_loc *loc)
{
    struct dram *d = (struct dram *)t;
    struct dram_seg *s = &d->seg[dram_pool_of(d, loc->h)];
    tlsf_free(s->alloc, loc->h - s->hbase);
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

uint64_t dram_pool_used(const struct dram *d, uint32_t pool)
{
    const struct dram_seg *s = &d->seg[pool];
    return s->bytes - tlsf_free_units(s->alloc) * DRAM_UNIT;
}

void dram_pool_usage(const struct dram *d, uint32_t pool, struct tier_usage *u)
{
    const struct dram_seg *s = &d->seg[pool];
    u->capacity = s->bytes;
    u->used = dram_pool_used(d, pool);
    u->free_largest = tlsf_largest_free(s->alloc) * DRAM_UNIT;
    u->fragmentation = tlsf_fragmentation(s->alloc);
    u->meta_bytes = tlsf_mem_bytes(s->alloc);
}

/* Every pool together; the largest free block is the largest of any. */
static void dram_usage(struct tier *t, struct tier_usage *u)
{
    struct dram *d = (struct dram *)t;
    uint64_t free_all = 0;
    memset(u, 0, sizeof *u);
    for (uint32_t i = 0; i < d->n_seg; i++) {
        struct tier_usage p;
        dram_pool_usage(d, i, &p);
        u->capacity += p.capacity;
        u->used += p.used;
        u->meta_bytes += p.meta_bytes;
        free_all += p.capacity - p.used;
        if (p.free_largest > u->free_largest) u->free_largest = p.free_largest;
    }
    u->fragmentation = free_all ? 1.0 - (double)u->free_largest / (double)free_all : 0;
}

void dram_layout(const struct dram *d, char *buf, size_t len)
{
    size_t n = 0;
    buf[0] = '\0';
    for (uint32_t i = 0; i < d->n_seg && n < len; i++) {
        int w = snprintf(buf + n, len - n, "%s%s", i ? ";" : "", d->seg[i].path);
        if (w < 0) break;
        n += (size_t)w;
        if (i && n < len) {
            w = snprintf(buf + n, len - n, "=%llu", (unsigned long long)d->seg[i].bytes);
            if (w > 0) n += (size_t)w;
        }
    }
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
    .write_at = dram_write,
    .read_at = dram_read,
    .usage = dram_usage,
    .destroy = dram_destroy,
};

static kvt_err lock_pool(struct dram_seg *d, char *err, size_t errlen)
{
    if (flock(d->fd, LOCK_EX | LOCK_NB) == 0) return KVT_OK;
    if (errno == EWOULDBLOCK) {
        snprintf(err, errlen, "pool %s is in use by another kvtierd", d->path);
        return KVT_EBUSY;
    }
    snprintf(err, errlen, "pool %s: flock: %s", d->path, strerror(errno));
    return KVT_EIO;
}

static kvt_err set_owner(struct dram_seg *d, const struct dram_opts *o, char *err,
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

static kvt_err size_file(struct dram_seg *d, int adopt, char *err, size_t errlen)
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
    return KVT_OK;
}

kvt_err dram_open(const struct dram_opts *o, struct dram **out, char *err,
                  size_t errlen)
{
    return dram_open_adopt(o, 0, out, err, errlen);
}

/* A pool file that is already there may be used: a regular file of this
 * user with one link (no hard link to something else). */
static kvt_err check_existing(struct dram_seg *d, char *err, size_t errlen)
{
    struct stat st;
    if (fstat(d->fd, &st) != 0 || !S_ISREG(st.st_mode) ||
        st.st_uid != geteuid() || st.st_nlink != 1) {
        snprintf(err, errlen, "pool %s exists and is not a regular file of "
                 "this user with one link; remove it", d->path);
        return KVT_EPERM;
    }
    return KVT_OK;
}

/* Create the pool file (O_EXCL), or take over an existing one (ours, not
 * locked): kept for adoption, else replaced by a new inode. */
static kvt_err open_file(struct dram_seg *d, const struct dram_opts *o, int adopt,
                         char *err, size_t errlen)
{
    const int mk = O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC;
    kvt_err e;
    if ((d->fd = open(o->path, mk, o->mode)) >= 0) return lock_pool(d, err, errlen);
    if (errno != EEXIST) goto fail;
    d->fd = open(o->path, O_RDWR | O_NOFOLLOW | O_NOCTTY | O_NONBLOCK | O_CLOEXEC);
    if (d->fd < 0) goto fail;
    if ((e = check_existing(d, err, errlen)) != KVT_OK) return e;
    if ((e = lock_pool(d, err, errlen)) != KVT_OK || adopt) return e;
    /* Stale and not adopted: a fresh inode. The lock on the old one is
     * held until then, so a second daemon starting now loses the race at
     * the lock or at O_EXCL. */
    int old = d->fd;
    if (unlink(o->path) != 0 && errno != ENOENT) {
        d->fd = -1;
        close(old);
        goto fail;
    }
    d->fd = open(o->path, mk, o->mode);
    close(old);
    if (d->fd >= 0) return lock_pool(d, err, errlen);
    if (errno == EEXIST) {
        snprintf(err, errlen, "pool %s is in use by another kvtierd", o->path);
        return KVT_EBUSY;
    }
fail:
    snprintf(err, errlen, "pool %s: %s", o->path,
             errno == ELOOP ? "is a symlink" : strerror(errno));
    return errno == ELOOP ? KVT_EPERM : KVT_EIO;
}

kvt_err dram_memfd_check(int fd, uint64_t bytes, char *err, size_t errlen)
{
    struct stat st;
    int seals = fcntl(fd, F_GET_SEALS);
    bytes = bytes / DRAM_UNIT * DRAM_UNIT;
    if (seals < 0 || fstat(fd, &st) != 0) {
        snprintf(err, errlen, "fd %d is not a sealable memfd", fd);
        return KVT_EINVAL;
    }
    if ((seals & DRAM_MEMFD_SEALS) != DRAM_MEMFD_SEALS) {
        snprintf(err, errlen, "fd %d is not sealed against shrinking and "
                 "growing (seals 0x%x)", fd, (unsigned)seals);
        return KVT_EINVAL;
    }
    if ((uint64_t)st.st_size != bytes) {
        snprintf(err, errlen, "fd %d holds %llu bytes, the pool is %llu", fd,
                 (unsigned long long)st.st_size, (unsigned long long)bytes);
        return KVT_EINVAL;
    }
    return KVT_OK;
}

/* Size, reserve and seal a fresh memfd. */
static kvt_err make_memfd(struct dram_seg *d, const char *name, char *err,
                          size_t errlen)
{
    int rv;
    d->fd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (d->fd < 0 || ftruncate(d->fd, (off_t)d->bytes) != 0) {
        snprintf(err, errlen, "pool memfd: %s", strerror(errno));
        return KVT_EIO;
    }
    if ((rv = posix_fallocate(d->fd, 0, (off_t)d->bytes)) != 0) {
        snprintf(err, errlen, "pool memfd: cannot reserve %llu bytes: %s",
                 (unsigned long long)d->bytes, strerror(rv));
        return KVT_ENOSPC;
    }
    if (fcntl(d->fd, F_ADD_SEALS, DRAM_MEMFD_SEALS) != 0) {
        snprintf(err, errlen, "pool memfd: cannot seal: %s", strerror(errno));
        return KVT_EIO;
    }
    return KVT_OK;
}

/* The memfd pool: the kept fd if it passes dram_memfd_check (the caller
 * checked and logged already; checked again so nothing unchecked is
 * mapped), else a fresh one. */
static kvt_err open_memfd(struct dram_seg *d, const struct dram_opts *o,
                          const char *name, char *err, size_t errlen)
{
    d->memfd = 1;
    if (o->adopt_fd >= 0) {
        d->fd = o->adopt_fd;
        kvt_err e = dram_memfd_check(d->fd, d->bytes, err, errlen);
        if (e != KVT_OK) return e;
        d->adopted = 1;
    } else {
        kvt_err e = make_memfd(d, name, err, errlen);
        if (e != KVT_OK) return e;
    }
    return KVT_OK;
}

static kvt_err open_pool(struct dram_seg *d, const struct dram_opts *o,
                         const char *name, int adopt, char *err, size_t errlen)
{
    kvt_err e;
    if (o->memfd) return open_memfd(d, o, name, err, errlen);
    if ((e = open_file(d, o, adopt, err, errlen)) != KVT_OK) return e;
    if ((e = set_owner(d, o, err, errlen)) != KVT_OK) return e;
    return size_file(d, adopt, err, errlen);
}

/* Open pool s (bytes set) as o says, map it at base + s->off and give it
 * an allocator. The seg owns o->adopt_fd from here on. */
static kvt_err open_seg(struct dram *d, struct dram_seg *s, const struct dram_opts *o,
                        const char *name, int adopt, char *err, size_t errlen)
{
    char label[300];
    kvt_err e;
    s->fd = o->memfd ? o->adopt_fd : -1; /* owned from here on */
    snprintf(label, sizeof label, "memfd:%s", name);
    if (!(s->path = strdup(o->memfd ? label : o->path))) return KVT_ENOMEM;
    if ((e = open_pool(s, o, name, adopt, err, errlen)) != KVT_OK) return e;
    void *p = mmap(d->base + s->off, s->bytes, PROT_READ | PROT_WRITE,
                   MAP_SHARED | MAP_FIXED, s->fd, 0);
    if (p == MAP_FAILED) {
        snprintf(err, errlen, "pool %s: mmap: %s", s->path, strerror(errno));
        return KVT_EIO;
    }
    if (!(s->alloc = tlsf_create(s->bytes / DRAM_UNIT))) {
        snprintf(err, errlen, "pool allocator: out of memory");
        return KVT_ENOMEM;
    }
    s->hspan = (uint32_t)(s->bytes / DRAM_UNIT + HSPAN_EXTRA);
    d->bytes = s->off + s->bytes;
    d->n_seg++;
    return KVT_OK;
}

/* Pools of one daemon share the handle space and the reserve. */
static kvt_err seg_fits(const struct dram *d, uint64_t bytes, char *err,
                        size_t errlen)
{
    const struct dram_seg *last = &d->seg[d->n_seg - 1];
    uint64_t hnext = (uint64_t)last->hbase + last->hspan;
    if (d->n_seg == DRAM_POOLS_MAX || bytes == 0 || bytes > d->reserve - d->bytes ||
        hnext + bytes / DRAM_UNIT + HSPAN_EXTRA >= TLSF_NONE) {
        snprintf(err, errlen, "pool of %llu bytes does not fit beside the others",
                 (unsigned long long)bytes);
        return KVT_ENOSPC;
    }
    return KVT_OK;
}

kvt_err dram_add_pool(struct dram *d, const struct dram_opts *o, const char *name,
                      int adopt, uint32_t *pool, char *err, size_t errlen)
{
    uint64_t bytes = o->bytes / DRAM_UNIT * DRAM_UNIT;
    kvt_err e = seg_fits(d, bytes, err, errlen);
    if (e != KVT_OK) {
        if (o->memfd && o->adopt_fd >= 0) close(o->adopt_fd);
        return e;
    }
    const struct dram_seg *last = &d->seg[d->n_seg - 1];
    struct dram_seg *s = &d->seg[d->n_seg];
    *s = (struct dram_seg){.off = d->bytes, .bytes = bytes,
                           .hbase = last->hbase + last->hspan};
    e = open_seg(d, s, o, name, adopt, err, errlen);
    if (e == KVT_ENOMEM && err[0] == '\0') snprintf(err, errlen, "out of memory");
    if (e != KVT_OK) { /* not counted: undo here */
        if (s->fd >= 0) close(s->fd);
        tlsf_destroy(s->alloc);
        free(s->path);
        mmap(d->base + s->off, s->bytes, PROT_NONE,
             MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
        *s = (struct dram_seg){.fd = -1};
        return e;
    }
    *pool = d->n_seg - 1;
    return KVT_OK;
}

/* The virtual range every pool will live in: nothing behind it yet. */
static kvt_err reserve_range(struct dram *d, uint64_t bytes, char *err, size_t errlen)
{
    d->reserve = bytes;
    d->base = mmap(NULL, bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                   -1, 0);
    if (d->base != MAP_FAILED) return KVT_OK;
    d->base = NULL;
    snprintf(err, errlen, "pool: cannot reserve %llu bytes of address space: %s",
             (unsigned long long)bytes, strerror(errno));
    return KVT_ENOMEM;
}

kvt_err dram_open_adopt(const struct dram_opts *o, int adopt, struct dram **out,
                        char *err, size_t errlen)
{
    return dram_open_pools(o, adopt, 0, out, err, errlen);
}

kvt_err dram_open_pools(const struct dram_opts *o, int adopt, uint64_t reserve,
                        struct dram **out, char *err, size_t errlen)
{
    kvt_err e = KVT_ENOMEM;
    uint64_t bytes = o->bytes / DRAM_UNIT * DRAM_UNIT;
    struct dram *d = calloc(1, sizeof *d);
    if (!d) {
        if (o->memfd && o->adopt_fd >= 0) close(o->adopt_fd);
        goto fail;
    }
    d->tier.ops = &dram_ops;
    d->fd = d->seg[0].fd = -1;
    d->seg[0].bytes = bytes;
    if ((e = reserve_range(d, reserve > bytes ? reserve / DRAM_UNIT * DRAM_UNIT : bytes,
                           err, errlen)) != KVT_OK) {
        if (o->memfd && o->adopt_fd >= 0) close(o->adopt_fd);
        goto fail;
    }
    e = open_seg(d, &d->seg[0], o, DRAM_MEMFD_NAME, adopt, err, errlen);
    d->path = d->seg[0].path;
    d->fd = d->seg[0].fd;
    d->alloc = d->seg[0].alloc;
    d->adopted = d->seg[0].adopted;
    d->memfd = d->seg[0].memfd;
    if (e != KVT_OK) {
        d->n_seg = 1; /* dram_close frees what open_seg made */
        goto fail;
    }
    *out = d;
    return KVT_OK;
fail:
    if (e == KVT_ENOMEM && err[0] == '\0') snprintf(err, errlen, "out of memory");
    dram_close(d, 0);
    return e;
}

/* ------------------------------------------------------ the SIGBUS guard */

/* The file pools dram_guard covers: [base, base + bytes) backed by fd. */
static struct {
    uint8_t *base;
    uint64_t bytes;
    int fd;
} guarded[DRAM_POOLS_MAX];
static uint8_t *guarded_base;     /* the struct dram guarded, or NULL */
static struct sigaction prev_bus; /* what SIGBUS did before */
static volatile sig_atomic_t heals;

static const char heal_msg[] = "kvtierd: dram: the pool file was truncated "
                               "(by a client?); its size is restored, the "
                               "chunks cut off read as zeros\n";

/* Restore the size of the file pool holding a, if it was cut. */
static int heal(const uint8_t *a)
{
    struct stat st;
    for (size_t i = 0; i < DRAM_POOLS_MAX; i++) {
        if (!guarded[i].base || a < guarded[i].base ||
            a >= guarded[i].base + guarded[i].bytes)
            continue;
        return fstat(guarded[i].fd, &st) == 0 &&
               (uint64_t)st.st_size < guarded[i].bytes &&
               ftruncate(guarded[i].fd, (off_t)guarded[i].bytes) == 0;
    }
    return 0;
}

/* Async-signal-safe throughout: fstat, ftruncate, write, sigaction. */
static void on_bus(int sig, siginfo_t *si, void *uc)
{
    if (guarded_base && si && heal(si->si_addr)) {
        heals++;
        ssize_t w = write(2, heal_msg, sizeof heal_msg - 1);
        (void)w;
        return; /* the access runs again, on the restored size */
    }
    if (prev_bus.sa_flags & SA_SIGINFO) {
        prev_bus.sa_sigaction(sig, si, uc);
    } else if (prev_bus.sa_handler != SIG_IGN && prev_bus.sa_handler != SIG_DFL) {
        prev_bus.sa_handler(sig);
    } else {
        /* Returning re-runs the access, which then takes this action. */
        sigaction(sig, &prev_bus, NULL);
    }
}

/* Only file pools: a sealed memfd cannot be cut. */
void dram_guard(struct dram *d)
{
    struct sigaction sa;
    int any = 0;
    for (uint32_t i = 0; i < d->n_seg; i++) {
        const struct dram_seg *s = &d->seg[i];
        if (s->memfd) continue;
        guarded[i].fd = s->fd;
        guarded[i].bytes = s->bytes;
        guarded[i].base = d->base + s->off;
        any = 1;
    }
    if (!any) return;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_bus;
    sa.sa_flags = SA_SIGINFO | SA_NODEFER;
    sigemptyset(&sa.sa_mask);
    guarded_base = d->base;
    (void)sigaction(SIGBUS, &sa, &prev_bus); /* valid arguments: no error */
}

uint64_t dram_heals(void)
{
    return (uint64_t)heals;
}

void dram_close(struct dram *d, int unlink_file)
{
    if (!d) return;
    if (d->base && guarded_base == d->base) {
        (void)sigaction(SIGBUS, &prev_bus, NULL);
        guarded_base = NULL;
        memset(guarded, 0, sizeof guarded);
    }
    if (d->base) munmap(d->base, d->reserve);
    for (uint32_t i = 0; i < d->n_seg; i++) {
        struct dram_seg *s = &d->seg[i];
        if (unlink_file && !s->memfd && s->path && s->fd >= 0) unlink(s->path);
        if (s->fd >= 0) close(s->fd);
        tlsf_destroy(s->alloc);
        free(s->path);
    }
    free(d);
}
