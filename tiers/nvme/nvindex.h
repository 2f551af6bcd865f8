/*
 * nvindex.h -- the NVMe tier's persistent index: RocksDB, C API.
 *
 * Design (DESIGN §4, §6): RocksDB maps (namespace, key) to where the
 * chunk's record lies (directory, file, offset, length), its size,
 * XXH3-64, parent key, sequence number and last access. It is written
 * only after the record's data write completed (the caller's rule), so it
 * never points at bytes that are not there; at start the whole index is
 * read back (nvx_load) to rebuild the in-memory index and each file's
 * allocator. Writes never block the core thread: nvx_put / nvx_del only
 * append to a queue under a mutex (woken on empty -> non-empty, STYLE §7);
 * one worker thread (a workq.c queue) takes the whole queue, optionally
 * fdatasyncs the data files the batch points into (so that after a power
 * loss the index still never points at lost bytes), and writes it as one
 * rocksdb_writebatch
 * with the WAL on. A process crash loses nothing the worker wrote (the
 * WAL is in the page cache); at worst the last batches are missing, and
 * their records are then free space at the next start. Nothing comes
 * back to the core thread but an error count.
 *
 * Keys: u8 ns_len, ns bytes, 32-byte key. Meta keys begin with 0 (no
 * namespace is empty): "\0format" is written once an index is complete,
 * so an index without it (new, or a rebuild that did not finish) is
 * known not to describe the data files.
 */
#ifndef KVT_NVINDEX_H
#define KVT_NVINDEX_H

#include <stddef.h>
#include <stdint.h>

#include "kvtier.h"

struct nvx;

struct nvx_rec {
    char ns[KVT_NS_MAX + 1];
    kvt_key key, parent;
    int has_parent;
    uint16_t dir;     /* index in nvme.dirs */
    uint32_t num;     /* file number in that directory */
    uint64_t off;     /* byte offset of the record in the file */
    uint32_t len;     /* bytes reserved: header and data */
    uint32_t size;    /* data bytes */
    uint64_t csum, seq;
    uint64_t atime;   /* unix seconds of the last access written */
};

/* Open (creating if missing). *complete = 1 if the index carries the
 * format mark. 0, or -1 with a sentence in err (a damaged directory). */
int nvx_open(const char *path, int fsync_data, struct nvx **out, int *complete,
             char *err, size_t errlen);
/* Remove every record and the mark (an incomplete index before a
 * rebuild). 0 or -1. */
int nvx_wipe(struct nvx *x, char *err, size_t errlen);
/* Write the format mark (the index is complete) and wait for it. */
int nvx_mark_complete(struct nvx *x);

/* Read every record, in key order, on the calling thread (start-up:
 * before the worker has work). Records that do not decode are counted in
 * *bad and deleted. Returns the number passed to fn, or -1. */
long long nvx_load(struct nvx *x, void (*fn)(void *arg, const struct nvx_rec *r),
                   void *arg, uint64_t *bad, char *err, size_t errlen);

/* Queue a put; data_fd is the record's file (synced before the batch when
 * fsync_data is on), or -1. */
void nvx_put(struct nvx *x, const struct nvx_rec *r, int data_fd);
/* Queue a delete. */
void nvx_del(struct nvx *x, const char *ns, const kvt_key *key);
/* Wait until everything queued so far is written. */
void nvx_sync(struct nvx *x);
/* Batches that failed to write (each logged). */
uint64_t nvx_errors(struct nvx *x);
/* Operations written since open. */
uint64_t nvx_written(struct nvx *x);

/* Sync, stop the worker, close. Accepts NULL. */
void nvx_close(struct nvx *x);
/* One RocksDB record (key kl bytes, value vl bytes) into r: 0, or -1 if it
 * is not a record of this format (meta keys, damage). Every field of a
 * decoded record is still only what the disk said: callers check it
 * against the data files (nvme_loc_make). */
int nvx_decode(const uint8_t *k, size_t kl, const uint8_t *v, size_t vl,
               struct nvx_rec *r);

/* Move a damaged index directory aside (path.damaged-<unix time>). */
int nvx_move_aside(const char *path, char *moved, size_t movedlen);

#endif
