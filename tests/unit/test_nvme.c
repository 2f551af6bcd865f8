/*
 * test_nvme.c -- the NVMe tier on its own (tiers/nvme/nvme.c, tiers/nvme/uring.c):
 * records written from a "pool" buffer and read back byte for byte,
 * headers, the header scan, file growth, and every failure path the tier
 * has: a directory in use, buffer
 * registration refused, a read or write completion that fails, a data
 * file that cannot be created (disk full).
 *
 * Runs in a fresh directory under /tmp (ext4 here: O_DIRECT works); the
 * "pool" is an anonymous 4 KiB-aligned mapping, as the DRAM pool is.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cmocka.h>

#include "daemon.h"
#include "fault.h"
#include "nvme/nvme.h"
#include "nvme/uring.h"

#define POOL (4u << 20)

static char dir[64];
static uint8_t *pool;

static int setup(void **state)
{
    (void)state;
    snprintf(dir, sizeof dir, "/tmp/kvt-nvme-XXXXXX");
    if (!mkdtemp(dir)) return -1;
    pool = mmap(NULL, POOL, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return pool == MAP_FAILED ? -1 : 0;
}

static int teardown(void **state)
{
    (void)state;
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    munmap(pool, POOL);
    return system(cmd) == 0 ? 0 : -1;
}

/* A fresh sub-directory per test. */
static const char *subdir(const char *name)
{
    static char p[128];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    return p;
}

static struct nvme *open_tier(const char *path, uint64_t bytes, uint64_t file_bytes)
{
    const char *dirs[1] = {path};
    struct nvme_opts o = {dirs, 1, bytes, file_bytes, 4, 1, pool, POOL};
    struct nvme *n = NULL;
    char err[256] = "";
    kvt_err e = nvme_open(&o, &n, err, sizeof err);
    if (e != KVT_OK) fprintf(stderr, "nvme_open: %s\n", err);
    assert_int_equal(e, KVT_OK);
    return n;
}

struct done { int calls; kvt_err err; };

static void on_done(void *arg, kvt_err e)
{
    struct done *d = arg;
    d->calls++;
    d->err = e;
}

static void meta_for(struct nvme_meta *m, uint64_t seed, uint32_t size, const void *data)
{
    memset(m, 0, sizeof *m);
    snprintf(m->ns, sizeof m->ns, "test/ns");
    m->key = td_key(seed);
    m->parent = td_key(seed + 1000);
    m->has_parent = 1;
    m->size = size;
    m->csum = kvt_checksum(data, size);
    m->seq = seed;
}

/* Write one record of size bytes from pool[at..]; returns its location. */
static struct tier_loc put(struct nvme *n, uint64_t seed, uint32_t size, size_t at,
                           kvt_err want)
{
    struct tier_loc loc;
    struct nvme_meta m;
    struct done d = {0, KVT_OK};
    td_fill(pool + at, size, seed);
    meta_for(&m, seed, size, pool + at);
    assert_int_equal(n->tier.ops->alloc(&n->tier, nvme_rec_len(size), &loc), KVT_OK);
    assert_int_equal(nvme_write_record(n, &loc, &m, pool + at, on_done, &d), KVT_OK);
    uring_drain(n->ring);
    assert_int_equal(d.calls, 1);
    assert_int_equal(d.err, want);
    return loc;
}

static kvt_err get(struct nvme *n, const struct tier_loc *loc, uint32_t size,
                   size_t at)
{
    struct done d = {0, KVT_OK};
    memset(pool + at, 0, size);
    assert_int_equal(nvme_read_data(n, loc, pool + at, size, on_done, &d), KVT_OK);
    uring_drain(n->ring);
    assert_int_equal(d.calls, 1);
    return d.err;
}

static void check(uint64_t seed, uint32_t size, size_t at)
{
    uint8_t *want = malloc(size);
    td_fill(want, size, seed);
    assert_memory_equal(pool + at, want, size);
    free(want);
}

static void test_roundtrip(void **state)
{
    (void)state;
    assert_int_equal(fault_init("", NULL, 0), 0);
    struct nvme *n = open_tier(subdir("rt"), 16u << 20, 8u << 20);
    assert_string_equal(n->regbuf_why, "");
    uint32_t sizes[3] = {1, 100000, 1u << 20};
    struct tier_loc locs[3];
    for (int i = 0; i < 3; i++) locs[i] = put(n, 10 + i, sizes[i], 0, KVT_OK);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(get(n, &locs[i], sizes[i], 2u << 20), KVT_OK);
        check(10 + i, sizes[i], 2u << 20);
    }
    /* A whole record: the header says what was written. */
    uint8_t *buf = aligned_alloc(4096, locs[1].len);
    struct done d = {0, KVT_OK};
    struct nvme_meta m;
    assert_int_equal(nvme_read_record(n, &locs[1], buf, on_done, &d), KVT_OK);
    uring_drain(n->ring);
    assert_int_equal(d.err, KVT_OK);
    assert_int_equal(nvme_header_decode(buf, &m), 0);
    assert_string_equal(m.ns, "test/ns");
    assert_int_equal(m.size, 100000);
    assert_int_equal(m.seq, 11);
    assert_true(m.has_parent);
    kvt_key k = td_key(11);
    assert_memory_equal(m.key.b, k.b, 32);
    assert_int_equal(m.csum, kvt_checksum(buf + NVME_HDR, 100000));
    buf[17] ^= 1; /* any flipped header bit fails the header checksum */
    assert_int_equal(nvme_header_decode(buf, &m), -1);
    free(buf);
    assert_int_equal(n->st.writes, 3);
    assert_int_equal(n->st.reads, 4);
    nvme_close(n);
}

struct found { int n; uint64_t seqs[8]; };

static void on_found(void *arg, unsigned file, uint64_t off, const struct nvme_meta *m)
{
    struct found *f = arg;
    (void)file;
    (void)off;
    if (f->n < 8) f->seqs[f->n] = m->seq;
    f->n++;
}

/* The scan finds intact records and skips one whose data was damaged. */
static void test_scan(void **state)
{
    (void)state;
    assert_int_equal(fault_init("", NULL, 0), 0);
    struct nvme *n = open_tier(subdir("scan"), 16u << 20, 8u << 20);
    struct tier_loc a = put(n, 1, 5000, 0, KVT_OK);
    struct tier_loc b = put(n, 2, 70000, 0, KVT_OK);
    put(n, 3, 4096, 0, KVT_OK);
    (void)a;
    /* Damage b's data behind the tier's back. */
    uint8_t *blk = aligned_alloc(4096, 4096);
    struct done d = {0, KVT_OK};
    assert_int_equal(n->tier.ops->read_at(&n->tier, &b, NVME_HDR, blk, 4096, on_done, &d), KVT_OK);
    uring_drain(n->ring);
    blk[100] ^= 0x40;
    assert_int_equal(n->tier.ops->write_at(&n->tier, &b, NVME_HDR, blk, 4096, on_done, &d), KVT_OK);
    uring_drain(n->ring);
    assert_int_equal(d.err, KVT_OK);
    free(blk);
    char err[256];
    struct found f = {0, {0}};
    assert_int_equal(nvme_scan(n, on_found, &f, err, sizeof err), 2);
    assert_int_equal(f.seqs[0], 1);
    assert_int_equal(f.seqs[1], 3);
    nvme_close(n);
}

/* Files are created as space is needed, up to bytes per directory; then
 * ENOSPC. A re-opened tier finds the files again. */
static void test_grow_and_full(void **state)
{
    (void)state;
    assert_int_equal(fault_init("", NULL, 0), 0);
    struct nvme *n = open_tier(subdir("grow"), 3u << 20, 1u << 20);
    assert_int_equal(n->n_files, 0);
    struct tier_loc loc;
    int got = 0;
    while (n->tier.ops->alloc(&n->tier, nvme_rec_len(600000), &loc) == KVT_OK) got++;
    assert_int_equal(n->n_files, 3);
    assert_int_equal(got, 3); /* one ~600 KB record per 1 MiB file */
    struct tier_usage u;
    n->tier.ops->usage(&n->tier, &u);
    assert_int_equal(u.capacity, 3u << 20);
    assert_int_equal(u.used, 3 * nvme_rec_len(600000));
    nvme_close(n);
    n = open_tier(subdir("grow"), 3u << 20, 1u << 20);
    assert_int_equal(n->n_files, 3);
    assert_int_equal(nvme_used(n), 0); /* the index re-reserves, not the tier */
    assert_int_equal(nvme_loc_make(n, 0, 2, 8192, 8192, &loc), KVT_OK);
    assert_int_equal(nvme_loc_file(&loc), 2);
    assert_int_equal(n->tier.ops->alloc_at(&n->tier, loc.off, loc.len, &loc), KVT_OK);
    assert_int_equal(n->tier.ops->alloc_at(&n->tier, loc.off, 4096, &loc), KVT_ENOSPC);
    assert_int_equal(nvme_loc_make(n, 0, 9, 0, 8192, &loc), KVT_ENOENT);
    nvme_close(n);
}

/* Disk full: the data file cannot be created; the tier says ENOSPC and
 * counts it, and works again once files can be created. */
static void test_grow_fails(void **state)
{
    (void)state;
    assert_int_equal(fault_init("nvme_grow=1", NULL, 0), 0);
    struct nvme *n = open_tier(subdir("full"), 4u << 20, 1u << 20);
    struct tier_loc loc;
    assert_int_equal(n->tier.ops->alloc(&n->tier, 8192, &loc), KVT_ENOSPC);
    assert_int_equal(n->st.grow_failures, 1);
    assert_int_equal(n->n_files, 0);
    assert_int_equal(access("/tmp", F_OK), 0);
    n->dirs[0].retry_at = 0; /* skip the back-off */
    assert_int_equal(n->tier.ops->alloc(&n->tier, 8192, &loc), KVT_OK);
    assert_int_equal(n->n_files, 1);
    nvme_close(n);
}

/* Registration refused (as under an 8 MiB locked-memory limit): I/O
 * still works, through plain reads and writes. */
static void test_no_registered_buffers(void **state)
{
    (void)state;
    assert_int_equal(fault_init("uring_regbuf=1", NULL, 0), 0);
    struct nvme *n = open_tier(subdir("noreg"), 4u << 20, 4u << 20);
    assert_string_not_equal(n->regbuf_why, "");
    assert_false(uring_buffers_registered(n->ring));
    struct tier_loc loc = put(n, 7, 300000, 4096, KVT_OK);
    assert_int_equal(get(n, &loc, 300000, 1u << 20), KVT_OK);
    check(7, 300000, 1u << 20);
    nvme_close(n);
}

/* A failing read completion: the callback gets KVT_EIO, the next read of
 * the same record works. A failing write: KVT_ENOSPC. */
static void test_io_errors(void **state)
{
    (void)state;
    assert_int_equal(fault_init("nvme_read=1,nvme_write=3", NULL, 0), 0);
    struct nvme *n = open_tier(subdir("ioerr"), 4u << 20, 4u << 20);
    struct tier_loc loc = put(n, 8, 10000, 0, KVT_OK); /* writes 1 and 2 */
    assert_int_equal(get(n, &loc, 10000, 8192), KVT_EIO);
    assert_int_equal(n->st.read_errors, 1);
    assert_int_equal(get(n, &loc, 10000, 8192), KVT_OK);
    check(8, 10000, 8192);
    put(n, 9, 10000, 0, KVT_ENOSPC); /* write 3 fails */
    assert_int_equal(n->st.write_errors, 1);
    nvme_close(n);
}

static void test_bad_dirs(void **state)
{
    (void)state;
    assert_int_equal(fault_init("", NULL, 0), 0);
    const char *dirs[1] = {subdir("busy")};
    struct nvme_opts o = {dirs, 1, 1u << 20, 1u << 20, 4, 0, NULL, 0};
    struct nvme *a = NULL, *b = NULL;
    char err[256] = "";
    assert_int_equal(nvme_open(&o, &a, err, sizeof err), KVT_OK);
    assert_int_equal(nvme_open(&o, &b, err, sizeof err), KVT_EBUSY);
    assert_non_null(strstr(err, "in use"));
    nvme_close(a);
    o.n_dirs = 0;
    assert_int_equal(nvme_open(&o, &b, err, sizeof err), KVT_EINVAL);
    char ferr[128];
    assert_int_equal(fault_init("nvme_read=x", ferr, sizeof ferr), -1);
    assert_int_equal(fault_init("bogus=1", ferr, sizeof ferr), -1);
    assert_int_equal(fault_init("nvme_read", ferr, sizeof ferr), -1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_roundtrip),
        cmocka_unit_test(test_scan),
        cmocka_unit_test(test_grow_and_full),
        cmocka_unit_test(test_grow_fails),
        cmocka_unit_test(test_no_registered_buffers),
        cmocka_unit_test(test_io_errors),
        cmocka_unit_test(test_bad_dirs),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
