/*
 * nvme.h -- the NVMe tier: records in large preallocated files, O_DIRECT,
 * moved by io_uring straight between the DRAM pool and the device.
 *
 * Design (DESIGN §4): each data directory (one per device) holds files
 * kvtier-NNNNN.nvd of file_bytes each, created one at a time as space is
 * needed and reserved whole with fallocate, so a write inside a file can
 * never meet a full disk: a full disk shows up, once, as a file that
 * cannot be created (the tier then stays at the size it has; a log line
 * and a counter say so). Each file has its own O(1) TLSF allocator in
 * 4 KiB units, whose metadata lives on the heap; at start it is rebuilt
 * from the index (nvme_alloc_at), never from the disk.
 *
 * A record is a 4 KiB header block followed by the data rounded up to
 * 4 KiB. The header names the chunk (magic, format version, namespace,
 * key, parent key, length, XXH3-64 of the data, a sequence number) and
 * carries its own checksum, so a lost index can be rebuilt by scanning
 * headers (nvme_scan) and a stale or torn record is told apart from a
 * live one. The header and the data are two writes; the record counts
 * only once both completed, and the index entry is written after that
 * (nvindex.h), so the index never points at bytes that are not there.
 *
 * Where a record lives: tier_loc.off = file << NVME_FILE_SHIFT | offset,
 * tier_loc.len = bytes reserved (header included), tier_loc.h = the
 * file's allocator handle. All calls are made on the core thread.
 */
#ifndef KVT_NVME_H
#define KVT_NVME_H

#include <stddef.h>
#include <stdint.h>

#include "kvtier.h"
#include "tier.h"

#define NVME_BLOCK 4096u
#define NVME_HDR NVME_BLOCK
#define NVME_FILE_SHIFT 40
#define NVME_MAX_DIRS 16

struct uring;
struct tlsf;

/* What a record says about its chunk. */
struct nvme_meta {
    char ns[KVT_NS_MAX + 1];
    kvt_key key, parent;
    int has_parent;
    uint32_t size;
    uint64_t csum; /* XXH3-64 of the size data bytes */
    uint64_t seq;
};

struct nvme_opts {
    const char *const *dirs;
    unsigned n_dirs;
    uint64_t bytes_per_dir;
    uint64_t file_bytes;
    unsigned depth;
    int register_buffers;         /* try to register pool (below) */
    void *pool;                   /* the DRAM pool, for fixed buffers */
    uint64_t pool_bytes;
};

struct nvme_dir {
    char *path;
    int lock_fd;
    uint64_t limit, bytes;        /* allowed, and in files now */
    unsigned next_num;            /* number of the next file */
    int full;                     /* could not grow; retried later */
    uint64_t retry_at;            /* ms (monotonic) */
};

struct nvme_file {
    int fd;
    uint16_t dir;
    uint32_t num;
    uint64_t bytes;
    struct tlsf *alloc;
};

struct nvme_stats {
    uint64_t reads, writes, read_bytes, write_bytes;
    uint64_t read_errors, write_errors, grow_failures;
};

struct nvme {
    struct tier tier;             /* first: a struct nvme is a struct tier */
    struct uring *ring;
    struct nvme_dir dirs[NVME_MAX_DIRS];
    unsigned n_dirs;
    struct nvme_file *files;
    unsigned n_files, max_files, cursor;
    uint64_t file_bytes, capacity;
    char regbuf_why[160];         /* why buffers are not registered, or "" */
    struct nvme_stats st;
};

/* Open (or create) the directories and the files already in them. Every
 * directory is locked (a second daemon on it stops here). KVT_OK, or an
 * error with a sentence in err. */
kvt_err nvme_open(const struct nvme_opts *o, struct nvme **out, char *err,
                  size_t errlen);
/* Finish in-flight I/O (callbacks run), close everything. Accepts NULL. */
void nvme_close(struct nvme *n);

/* Reserved bytes of a record of size data bytes. */
static inline uint64_t nvme_rec_len(uint64_t size)
{
    return NVME_HDR + (size + NVME_BLOCK - 1) / NVME_BLOCK * NVME_BLOCK;
}
static inline unsigned nvme_loc_file(const struct tier_loc *l)
{
    return (unsigned)(l->off >> NVME_FILE_SHIFT);
}
static inline uint64_t nvme_loc_off(const struct tier_loc *l)
{
    return l->off & ((1ull << NVME_FILE_SHIFT) - 1);
}

/* Write a record: header from m, then data (m->size bytes, rounded up to
 * 4 KiB, so the buffer must extend that far: a pool allocation does).
 * done(arg, err) runs once both writes finished. */
kvt_err nvme_write_record(struct nvme *n, const struct tier_loc *loc,
                          const struct nvme_meta *m, const void *data,
                          tier_done_fn done, void *arg);
/* Read a record's data (size bytes rounded up to 4 KiB) into dst. */
kvt_err nvme_read_data(struct nvme *n, const struct tier_loc *loc, void *dst,
                       uint32_t size, tier_done_fn done, void *arg);
/* Read a whole record (loc->len bytes: header and data) into buf. */
kvt_err nvme_read_record(struct nvme *n, const struct tier_loc *loc, void *buf,
                         tier_done_fn done, void *arg);

/* Encode m into a header block (NVME_HDR bytes); decode one: 0 if it is a
 * valid header of this format (magic, version, own checksum), else -1. */
void nvme_header_encode(const struct nvme_meta *m, void *blk);
int nvme_header_decode(const void *blk, struct nvme_meta *m);
/* Recompute a header block's own checksum over whatever its fields hold
 * (tests and fuzzing: lets a mutated header reach the field checks). */
void nvme_header_seal(void *blk);

/* The file slot and location of a record at (dir, num, off); KVT_ENOENT if
 * no such file is open. */
kvt_err nvme_loc_make(const struct nvme *n, unsigned dir, uint32_t num,
                      uint64_t off, uint64_t len, struct tier_loc *loc);

/* Synchronously read every file's headers (start-up, index lost): for
 * each record whose header and data checksum hold, fn(arg, file, off,
 * meta). Returns records found, or -1 on an I/O error (err says). */
long long nvme_scan(struct nvme *n, void (*fn)(void *arg, unsigned file,
                    uint64_t off, const struct nvme_meta *m), void *arg,
                    char *err, size_t errlen);

/* Space held by records, and capacity (what the directories may grow to). */
uint64_t nvme_used(const struct nvme *n);

#endif
