/*
 * nvme.c -- the NVMe tier (see nvme.h).
 *
 * Start-up: lock each directory, open the files already there in number
 * order, give each its allocator (all free: the caller re-reserves what
 * the index names), then register the files and the DRAM pool with the
 * ring. Growth: a new file is created and fallocated only when no open
 * file can hold an allocation; the directory with the fewest bytes grows
 * first, so several devices fill evenly.
 */
#include "nvme.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#include "fault.h"
#include "log.h"
#include "tlsf.h"
#include "uring.h"

#define NVME_MAGIC 0x3152544bu /* "KTR1" */
#define NVME_VERSION 1
#define GROW_RETRY_MS 10000
#define SCAN_WINDOW (8u << 20)
#define REG_PIECE (1ull << 30)
#define CFG_PATH_MAX 1024

/* The header as it lies on disk (little-endian, no padding). */
struct disk_hdr {
    uint32_t magic;
    uint16_t version, ns_len;
    uint64_t seq, csum;
    uint32_t size, flags;
    uint8_t key[KVT_KEY_LEN], parent[KVT_KEY_LEN];
    char ns[256];
    uint64_t hcsum; /* XXH3-64 of every byte above */
};
_Static_assert(sizeof(struct disk_hdr) == 360, "disk header layout");
#define HDR_HAS_PARENT 1u

static uint64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static kvt_err errno_err(int64_t res)
{
    return res == -ENOSPC || res == -EFBIG ? KVT_ENOSPC : KVT_EIO;
}

/* ------------------------------------------------------------- headers */

void nvme_header_encode(const struct nvme_meta *m, void *blk)
{
    struct disk_hdr h;
    memset(&h, 0, sizeof h);
    h.magic = NVME_MAGIC;
    h.version = NVME_VERSION;
    h.ns_len = (uint16_t)strnlen(m->ns, KVT_NS_MAX);
    h.seq = m->seq;
    h.csum = m->csum;
    h.size = m->size;
    h.flags = m->has_parent ? HDR_HAS_PARENT : 0;
    memcpy(h.key, m->key.b, KVT_KEY_LEN);
    if (m->has_parent) memcpy(h.parent, m->parent.b, KVT_KEY_LEN);
    memcpy(h.ns, m->ns, h.ns_len);
    h.hcsum = XXH3_64bits(&h, offsetof(struct disk_hdr, hcsum));
    memset(blk, 0, NVME_HDR);
    memcpy(blk, &h, sizeof h);
}

int nvme_header_decode(const void *blk, struct nvme_meta *m)
{
    struct disk_hdr h;
    memcpy(&h, blk, sizeof h);
    if (h.magic != NVME_MAGIC || h.version != NVME_VERSION) return -1;
    if (h.hcsum != XXH3_64bits(&h, offsetof(struct disk_hdr, hcsum))) return -1;
    if (h.ns_len == 0 || h.ns_len > KVT_NS_MAX || h.size == 0 ||
        memchr(h.ns, 0, h.ns_len) != NULL) /* a name, without a NUL inside */
        return -1;
    memset(m, 0, sizeof *m);
    memcpy(m->ns, h.ns, h.ns_len);
    memcpy(m->key.b, h.key, KVT_KEY_LEN);
    memcpy(m->parent.b, h.parent, KVT_KEY_LEN);
    m->has_parent = (h.flags & HDR_HAS_PARENT) != 0;
    m->size = h.size;
    m->csum = h.csum;
    m->seq = h.seq;
    return 0;
}

void nvme_header_seal(void *blk)
{
    struct disk_hdr h;
    memcpy(&h, blk, sizeof h);
    h.hcsum = XXH3_64bits(&h, offsetof(struct disk_hdr, hcsum));
    memcpy(blk, &h, sizeof h);
}

/* --------------------------------------------------------------- files */

static int add_file(struct nvme *n, unsigned d, uint32_t num, int fd,
                    uint64_t bytes)
{
    struct tlsf *a = tlsf_create(bytes / NVME_BLOCK);
    if (!a || n->n_files == n->max_files) {
        tlsf_destroy(a);
        return -1;
    }
    unsigned slot = n->n_files;
    if (uring_set_file(n->ring, slot, fd) != 0) {
        tlsf_destroy(a);
        return -1;
    }
    n->files[slot] = (struct nvme_file){fd, (uint16_t)d, num, bytes, a};
    n->n_files++;
    n->dirs[d].bytes += bytes;
    if (num >= n->dirs[d].next_num) n->dirs[d].next_num = num + 1;
    return 0;
}

static void file_path(const struct nvme *n, unsigned d, uint32_t num, char *buf,
                      size_t len)
{
    snprintf(buf, len, "%s/kvtier-%05u.nvd", n->dirs[d].path, num);
}

static void grow_failed(struct nvme *n, unsigned d, int err)
{
    struct nvme_dir *dir = &n->dirs[d];
    n->st.grow_failures++;
    if (!dir->full)
        log_warn("nvme", "cannot grow %s by a %llu MiB file: %s; the tier stays "
                 "at %llu MiB there (retried every %d s)", dir->path,
                 (unsigned long long)(n->file_bytes >> 20), strerror(err),
                 (unsigned long long)(dir->bytes >> 20), GROW_RETRY_MS / 1000);
    dir->full = 1;
    dir->retry_at = mono_ms() + GROW_RETRY_MS;
}

/* Create and reserve the next file of directory d. 0 or -1. */
static int grow(struct nvme *n, unsigned d)
{
    struct nvme_dir *dir = &n->dirs[d];
    char path[CFG_PATH_MAX];
    if (dir->full && mono_ms() < dir->retry_at) return -1;
    uint64_t want = dir->limit > dir->bytes ? dir->limit - dir->bytes : 0;
    if (want > n->file_bytes) want = n->file_bytes;
    want &= ~(uint64_t)(NVME_BLOCK - 1);
    if (want < 2 * NVME_BLOCK || n->n_files == n->max_files) return -1;
    file_path(n, d, dir->next_num, path, sizeof path);
    int fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_DIRECT | O_CLOEXEC, 0600);
    int err = fd < 0 ? errno : 0;
    if (!err && fault_hit(FAULT_NVME_GROW)) err = ENOSPC;
    if (!err && fallocate(fd, 0, 0, (off_t)want) != 0) err = errno;
    if (!err && add_file(n, d, dir->next_num, fd, want) != 0) err = ENOMEM;
    if (err) {
        if (fd >= 0) {
            close(fd);
            unlink(path);
        }
        grow_failed(n, d, err);
        return -1;
    }
    dir->full = 0;
    log_info("nvme", "%s: new data file of %llu MiB", path,
             (unsigned long long)(want >> 20));
    return 0;
}

/* The directory that should grow next: fewest bytes, room left. */
static int grow_some(struct nvme *n)
{
    unsigned order[NVME_MAX_DIRS], k = 0;
    for (unsigned d = 0; d < n->n_dirs; d++) order[k++] = d;
    for (unsigned i = 1; i < k; i++) /* insertion sort by bytes */
        for (unsigned j = i; j > 0 && n->dirs[order[j]].bytes < n->dirs[order[j - 1]].bytes; j--) {
            unsigned t = order[j];
            order[j] = order[j - 1];
            order[j - 1] = t;
        }
    for (unsigned i = 0; i < k; i++)
        if (grow(n, order[i]) == 0) return 0;
    return -1;
}

/* -------------------------------------------------------------- vtable */

static kvt_err alloc_in(struct nvme *n, unsigned f, uint64_t units,
                        struct tier_loc *loc)
{
    uint64_t off;
    uint32_t h = tlsf_alloc(n->files[f].alloc, units, &off);
    if (h == TLSF_NONE) return KVT_ENOSPC;
    loc->off = (uint64_t)f << NVME_FILE_SHIFT | off * NVME_BLOCK;
    loc->len = units * NVME_BLOCK;
    loc->h = h;
    n->cursor = f;
    return KVT_OK;
}

static kvt_err nv_alloc(struct tier *t, uint64_t bytes, struct tier_loc *loc)
{
    struct nvme *n = (struct nvme *)t;
    uint64_t units = (bytes + NVME_BLOCK - 1) / NVME_BLOCK;
    if (units == 0) units = 1;
    for (unsigned k = 0; k < n->n_files; k++)
        if (alloc_in(n, (n->cursor + k) % n->n_files, units, loc) == KVT_OK)
            return KVT_OK;
    while (grow_some(n) == 0)
        if (alloc_in(n, n->n_files - 1, units, loc) == KVT_OK) return KVT_OK;
    return KVT_ENOSPC;
}

static kvt_err nv_alloc_at(struct tier *t, uint64_t off, uint64_t bytes,
                           struct tier_loc *loc)
{
    struct nvme *n = (struct nvme *)t;
    struct tier_loc l = {off, bytes, 0};
    unsigned f = nvme_loc_file(&l);
    uint64_t o = nvme_loc_off(&l), units = (bytes + NVME_BLOCK - 1) / NVME_BLOCK;
    if (f >= n->n_files || o % NVME_BLOCK || units == 0) return KVT_EINVAL;
    uint32_t h = tlsf_alloc_at(n->files[f].alloc, o / NVME_BLOCK, units);
    if (h == TLSF_NONE) return KVT_ENOSPC;
    *loc = (struct tier_loc){off, units * NVME_BLOCK, h};
    return KVT_OK;
}

static void nv_free(struct tier *t, const struct tier_loc *loc)
{
    struct nvme *n = (struct nvme *)t;
    tlsf_free(n->files[nvme_loc_file(loc)].alloc, loc->h);
}

struct io_ctx {
    struct nvme *n;
    tier_done_fn done;
    void *arg;
    void *hdr;    /* record writes: the header block, freed at the end */
    int left;     /* writes still in flight */
    int write;
    int64_t err;
    uint64_t bytes;
};

static struct io_ctx *ctx_new(struct nvme *n, tier_done_fn done, void *arg,
                              int write, int left, uint64_t bytes)
{
    struct io_ctx *c = calloc(1, sizeof *c);
    if (!c) abort(); /* control-plane allocation */
    *c = (struct io_ctx){n, done, arg, NULL, left, write, 0, bytes};
    return c;
}

static void io_done(void *arg, int64_t res)
{
    struct io_ctx *c = arg;
    if (res < 0 && c->err == 0) c->err = res;
    if (--c->left > 0) return;
    struct nvme_stats *s = &c->n->st;
    if (c->err) (*(c->write ? &s->write_errors : &s->read_errors))++;
    else if (c->write) s->writes++, s->write_bytes += c->bytes;
    else s->reads++, s->read_bytes += c->bytes;
    free(c->hdr);
    if (c->done) c->done(c->arg, c->err ? errno_err(c->err) : KVT_OK);
    free(c);
}

static kvt_err check_range(const struct nvme *n, const struct tier_loc *loc,
                           uint64_t at, uint64_t len)
{
    unsigned f = nvme_loc_file(loc);
    if (f >= n->n_files || at > loc->len || len > loc->len - at) return KVT_EINVAL;
    if ((nvme_loc_off(loc) + at) % NVME_BLOCK || len % NVME_BLOCK) return KVT_EINVAL;
    return KVT_OK;
}

static kvt_err raw_io(struct nvme *n, int write, const struct tier_loc *loc,
                      uint64_t at, void *buf, uint64_t len, tier_done_fn done,
                      void *arg)
{
    kvt_err e = check_range(n, loc, at, len);
    if (e != KVT_OK) return e;
    struct io_ctx *c = ctx_new(n, done, arg, write, 1, len);
    uint64_t off = nvme_loc_off(loc) + at;
    if (write) uring_write(n->ring, nvme_loc_file(loc), buf, len, off, io_done, c);
    else uring_read(n->ring, nvme_loc_file(loc), buf, len, off, io_done, c);
    return KVT_OK;
}

static kvt_err nv_write(struct tier *t, const struct tier_loc *loc, uint64_t at,
                        const void *src, uint64_t n, tier_done_fn done, void *arg)
{
    return raw_io((struct nvme *)t, 1, loc, at, (void *)src, n, done, arg);
}

static kvt_err nv_read(struct tier *t, const struct tier_loc *loc, uint64_t at,
                       void *dst, uint64_t n, tier_done_fn done, void *arg)
{
    return raw_io((struct nvme *)t, 0, loc, at, dst, n, done, arg);
}

uint64_t nvme_used(const struct nvme *n)
{
    uint64_t used = 0;
    for (unsigned f = 0; f < n->n_files; f++)
        used += n->files[f].bytes - tlsf_free_units(n->files[f].alloc) * NVME_BLOCK;
    return used;
}

static void nv_usage(struct tier *t, struct tier_usage *u)
{
    struct nvme *n = (struct nvme *)t;
    uint64_t free_all = 0, largest = 0, files = 0;
    memset(u, 0, sizeof *u);
    for (unsigned f = 0; f < n->n_files; f++) {
        uint64_t fr = tlsf_free_units(n->files[f].alloc) * NVME_BLOCK;
        uint64_t lg = tlsf_largest_free(n->files[f].alloc) * NVME_BLOCK;
        free_all += fr;
        files += n->files[f].bytes;
        if (lg > largest) largest = lg;
        u->meta_bytes += tlsf_mem_bytes(n->files[f].alloc);
    }
    u->capacity = n->capacity > files ? n->capacity : files;
    u->used = files - free_all;
    u->free_largest = largest;
    u->fragmentation = free_all ? 1.0 - (double)largest / (double)free_all : 0.0;
}

static void nv_destroy(struct tier *t)
{
    nvme_close((struct nvme *)t);
}

static const struct tier_ops nvme_ops = {
    .name = "nvme",
    .id = KVT_TIER_NVME,
    .alloc = nv_alloc,
    .alloc_at = nv_alloc_at,
    .free = nv_free,
    .write = nv_write,
    .read = nv_read,
    .usage = nv_usage,
    .destroy = nv_destroy,
};

/* -------------------------------------------------------------- records */

kvt_err nvme_write_record(struct nvme *n, const struct tier_loc *loc,
                          const struct nvme_meta *m, const void *data,
                          tier_done_fn done, void *arg)
{
    uint64_t dlen = nvme_rec_len(m->size) - NVME_HDR;
    kvt_err e = check_range(n, loc, 0, NVME_HDR + dlen);
    if (e != KVT_OK) return e;
    void *hdr = aligned_alloc(NVME_BLOCK, NVME_HDR);
    if (!hdr) return KVT_ENOMEM;
    nvme_header_encode(m, hdr);
    struct io_ctx *c = ctx_new(n, done, arg, 1, 2, NVME_HDR + dlen);
    c->hdr = hdr;
    unsigned f = nvme_loc_file(loc);
    uint64_t off = nvme_loc_off(loc);
    uring_write(n->ring, f, data, dlen, off + NVME_HDR, io_done, c);
    uring_write(n->ring, f, hdr, NVME_HDR, off, io_done, c);
    return KVT_OK;
}

kvt_err nvme_read_data(struct nvme *n, const struct tier_loc *loc, void *dst,
                       uint32_t size, tier_done_fn done, void *arg)
{
    return raw_io(n, 0, loc, NVME_HDR, dst, nvme_rec_len(size) - NVME_HDR, done, arg);
}

kvt_err nvme_read_record(struct nvme *n, const struct tier_loc *loc, void *buf,
                         tier_done_fn done, void *arg)
{
    return raw_io(n, 0, loc, 0, buf, loc->len, done, arg);
}

kvt_err nvme_loc_make(const struct nvme *n, unsigned dir, uint32_t num,
                      uint64_t off, uint64_t len, struct tier_loc *loc)
{
    static unsigned last; /* loads come sorted: usually the same file */
    unsigned f = last < n->n_files && n->files[last].dir == dir &&
                         n->files[last].num == num ? last : n->n_files;
    for (unsigned i = 0; f == n->n_files && i < n->n_files; i++)
        if (n->files[i].dir == dir && n->files[i].num == num) f = i;
    if (f == n->n_files || off % NVME_BLOCK || len == 0 || off >= n->files[f].bytes ||
        len > n->files[f].bytes - off)
        return KVT_ENOENT; /* off and len come from the disk: no sum may wrap */
    last = f;
    *loc = (struct tier_loc){(uint64_t)f << NVME_FILE_SHIFT | off, len, 0};
    return KVT_OK;
}

/* ------------------------------------------------------------ start-up */

static int mkdirs(const char *path)
{
    char buf[CFG_PATH_MAX];
    snprintf(buf, sizeof buf, "%s", path);
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/') continue;
        *p = '\0';
        if (mkdir(buf, 0755) != 0 && errno != EEXIST) return -1;
        *p = '/';
    }
    return mkdir(buf, 0755) != 0 && errno != EEXIST ? -1 : 0;
}

static int num_of(const char *name, uint32_t *num)
{
    unsigned v;
    char tail[8];
    if (sscanf(name, "kvtier-%u.nv%7s", &v, tail) != 2 || strcmp(tail, "d") != 0)
        return -1;
    *num = v;
    return 0;
}

static int cmp_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return (x > y) - (x < y);
}

/* The numbers of the data files in a directory, sorted; count or -1. */
static int list_files(const char *path, uint32_t **out)
{
    DIR *dp = opendir(path);
    if (!dp) return -1;
    uint32_t *v = NULL, num;
    int n = 0, cap = 0;
    struct dirent *de;
    while ((de = readdir(dp)) != NULL) {
        if (num_of(de->d_name, &num) != 0) continue;
        if (n == cap) {
            cap = cap ? cap * 2 : 16;
            uint32_t *nv = realloc(v, (size_t)cap * sizeof *v);
            if (!nv) abort();
            v = nv;
        }
        v[n++] = num;
    }
    closedir(dp);
    if (n) qsort(v, (size_t)n, sizeof *v, cmp_u32);
    *out = v;
    return n;
}

static kvt_err open_existing(struct nvme *n, unsigned d, const uint32_t *nums,
                             int cnt, char *err, size_t errlen)
{
    char path[CFG_PATH_MAX];
    for (int i = 0; i < cnt; i++) {
        struct stat st;
        file_path(n, d, nums[i], path, sizeof path);
        int fd = open(path, O_RDWR | O_DIRECT | O_CLOEXEC);
        if (fd < 0 || fstat(fd, &st) != 0) {
            snprintf(err, errlen, "nvme: %s: %s", path, strerror(errno));
            if (fd >= 0) close(fd);
            return KVT_EIO;
        }
        uint64_t bytes = (uint64_t)st.st_size & ~(uint64_t)(NVME_BLOCK - 1);
        if (bytes < 2 * NVME_BLOCK || add_file(n, d, nums[i], fd, bytes) != 0) {
            log_warn("nvme", "%s: %llu bytes, not usable; ignored", path,
                     (unsigned long long)st.st_size);
            close(fd);
        }
    }
    return KVT_OK;
}

/* Create and lock the directory. */
static kvt_err lock_dir(struct nvme_dir *dir, char *err, size_t errlen)
{
    char path[CFG_PATH_MAX];
    if (mkdirs(dir->path) != 0) {
        snprintf(err, errlen, "nvme: cannot create %s: %s", dir->path, strerror(errno));
        return KVT_EIO;
    }
    snprintf(path, sizeof path, "%s/kvtier.lock", dir->path);
    dir->lock_fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (dir->lock_fd < 0 || flock(dir->lock_fd, LOCK_EX | LOCK_NB) != 0) {
        snprintf(err, errlen, "nvme: %s: %s", dir->path, errno == EWOULDBLOCK ?
                 "in use by another kvtierd" : strerror(errno));
        return KVT_EBUSY;
    }
    return KVT_OK;
}

/* Register the DRAM pool in pieces of at most 1 GiB (the kernel's limit
 * per buffer); say why not when it cannot be done. */
static void register_pool(struct nvme *n, const struct nvme_opts *o)
{
    struct iovec iov[64];
    unsigned k = 0;
    if (!o->register_buffers || !o->pool) {
        snprintf(n->regbuf_why, sizeof n->regbuf_why, "switched off");
        return;
    }
    for (uint64_t at = 0; at < o->pool_bytes && k < 64; at += REG_PIECE, k++) {
        iov[k].iov_base = (uint8_t *)o->pool + at;
        iov[k].iov_len = o->pool_bytes - at < REG_PIECE ? o->pool_bytes - at : REG_PIECE;
    }
    int rv = uring_register_buffers(n->ring, iov, k);
    if (rv == 0) return;
    snprintf(n->regbuf_why, sizeof n->regbuf_why, "%s%s", strerror(-rv),
             rv == -ENOMEM ? " (locked-memory limit, ulimit -l)" : "");
    log_info("nvme", "registered buffers unavailable: %s; using plain io_uring "
             "reads and writes", n->regbuf_why);
}

static unsigned files_needed(const struct nvme_opts *o, const int *existing)
{
    uint64_t total = 0;
    for (unsigned d = 0; d < o->n_dirs; d++) {
        uint64_t want = (o->bytes_per_dir + o->file_bytes - 1) / o->file_bytes;
        total += want > (uint64_t)existing[d] ? want : (uint64_t)existing[d];
    }
    return total + 1 > 65535 ? 65535 : (unsigned)total + 1;
}

static kvt_err open_dirs(struct nvme *n, const struct nvme_opts *o, char *err,
                         size_t errlen)
{
    uint32_t *nums[NVME_MAX_DIRS] = {0};
    int cnt[NVME_MAX_DIRS] = {0};
    kvt_err e = KVT_OK;
    for (unsigned d = 0; d < n->n_dirs && e == KVT_OK; d++) {
        e = lock_dir(&n->dirs[d], err, errlen);
        if (e == KVT_OK && (cnt[d] = list_files(n->dirs[d].path, &nums[d])) < 0) {
            snprintf(err, errlen, "nvme: %s: %s", n->dirs[d].path, strerror(errno));
            e = KVT_EIO;
        }
    }
    n->max_files = e == KVT_OK ? files_needed(o, cnt) : 0;
    if (e == KVT_OK && !(n->files = calloc(n->max_files, sizeof *n->files))) e = KVT_ENOMEM;
    if (e == KVT_OK && uring_open(o->depth, n->max_files, &n->ring, err, errlen) != 0)
        e = KVT_EIO;
    for (unsigned d = 0; d < n->n_dirs && e == KVT_OK; d++)
        e = open_existing(n, d, nums[d], cnt[d], err, errlen);
    for (unsigned d = 0; d < n->n_dirs; d++) free(nums[d]);
    return e;
}

kvt_err nvme_open(const struct nvme_opts *o, struct nvme **out, char *err,
                  size_t errlen)
{
    if (o->n_dirs == 0 || o->n_dirs > NVME_MAX_DIRS || o->file_bytes < 2 * NVME_BLOCK) {
        snprintf(err, errlen, "nvme: want 1-%d directories and files of 8 KiB or more",
                 NVME_MAX_DIRS);
        return KVT_EINVAL;
    }
    struct nvme *n = calloc(1, sizeof *n);
    if (!n) return KVT_ENOMEM;
    n->tier.ops = &nvme_ops;
    n->n_dirs = o->n_dirs;
    n->file_bytes = o->file_bytes & ~(uint64_t)(NVME_BLOCK - 1);
    for (unsigned d = 0; d < o->n_dirs; d++) {
        n->dirs[d].lock_fd = -1;
        n->dirs[d].limit = o->bytes_per_dir;
        n->capacity += o->bytes_per_dir;
        if (!(n->dirs[d].path = strdup(o->dirs[d]))) abort();
    }
    kvt_err e = open_dirs(n, o, err, errlen);
    if (e != KVT_OK) {
        nvme_close(n);
        return e;
    }
    register_pool(n, o);
    *out = n;
    return KVT_OK;
}

void nvme_close(struct nvme *n)
{
    if (!n) return;
    uring_close(n->ring); /* finishes in-flight I/O first */
    for (unsigned f = 0; f < n->n_files; f++) {
        close(n->files[f].fd);
        tlsf_destroy(n->files[f].alloc);
    }
    for (unsigned d = 0; d < n->n_dirs; d++) {
        if (n->dirs[d].lock_fd >= 0) close(n->dirs[d].lock_fd);
        free(n->dirs[d].path);
    }
    free(n->files);
    free(n);
}

/* ---------------------------------------------------------------- scan */

struct scan {
    struct nvme *n;
    unsigned f;
    uint8_t *win;      /* SCAN_WINDOW bytes of the file from win_off */
    uint64_t win_off, win_len;
    uint8_t *big;      /* a record that does not fit the window */
    size_t big_cap;
};

static int scan_fill(struct scan *s, uint64_t pos)
{
    const struct nvme_file *f = &s->n->files[s->f];
    uint64_t len = f->bytes - pos < SCAN_WINDOW ? f->bytes - pos : SCAN_WINDOW;
    ssize_t r = pread(f->fd, s->win, len, (off_t)pos);
    if (r < 0 || (uint64_t)r < len) return -1;
    s->win_off = pos;
    s->win_len = len;
    return 0;
}

/* The data of a record at pos (header there already checked), or NULL. */
static const uint8_t *scan_data(struct scan *s, uint64_t pos, uint64_t dlen)
{
    uint64_t at = pos + NVME_HDR;
    if (at + dlen <= s->win_off + s->win_len) return s->win + (at - s->win_off);
    if (dlen > s->big_cap) {
        free(s->big);
        s->big_cap = dlen;
        if (!(s->big = aligned_alloc(NVME_BLOCK, dlen))) abort();
    }
    const struct nvme_file *f = &s->n->files[s->f];
    ssize_t r = pread(f->fd, s->big, dlen, (off_t)at);
    return r == (ssize_t)dlen ? s->big : NULL;
}

/* One file: returns records found or -1. */
static long long scan_file(struct scan *s, void (*fn)(void *, unsigned, uint64_t,
                           const struct nvme_meta *), void *arg)
{
    const struct nvme_file *f = &s->n->files[s->f];
    struct nvme_meta m;
    long long found = 0;
    s->win_len = 0;
    for (uint64_t pos = 0; pos + NVME_HDR <= f->bytes;) {
        if (pos < s->win_off || pos + NVME_HDR > s->win_off + s->win_len)
            if (scan_fill(s, pos) != 0) return -1;
        uint64_t dlen;
        if (nvme_header_decode(s->win + (pos - s->win_off), &m) != 0 ||
            pos + (dlen = nvme_rec_len(m.size) - NVME_HDR) + NVME_HDR > f->bytes) {
            pos += NVME_BLOCK;
            continue;
        }
        const uint8_t *data = scan_data(s, pos, dlen);
        if (!data || kvt_checksum(data, m.size) != m.csum) {
            pos += NVME_BLOCK; /* torn or stale: its space is free */
            continue;
        }
        fn(arg, s->f, pos, &m);
        found++;
        pos += NVME_HDR + dlen;
    }
    return found;
}

long long nvme_scan(struct nvme *n, void (*fn)(void *arg, unsigned file,
                    uint64_t off, const struct nvme_meta *m), void *arg,
                    char *err, size_t errlen)
{
    struct scan s = {n, 0, aligned_alloc(NVME_BLOCK, SCAN_WINDOW), 0, 0, NULL, 0};
    long long total = 0;
    if (!s.win) abort();
    for (s.f = 0; s.f < n->n_files; s.f++) {
        long long k = scan_file(&s, fn, arg);
        if (k < 0) {
            snprintf(err, errlen, "nvme: reading %s file %u: %s",
                     n->dirs[n->files[s.f].dir].path, n->files[s.f].num, strerror(errno));
            total = -1;
            break;
        }
        total += k;
    }
    free(s.win);
    free(s.big);
    return total;
}
