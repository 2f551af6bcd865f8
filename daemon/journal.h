/*
 * journal.h -- the journal of committed DRAM chunks, so that a restarted
 * kvtierd can adopt the pool file its predecessor left (DESIGN §4).
 *
 * Design: the pool file outlives the process (a clean stop keeps it with
 * dram.adopt = 1; kill -9 always does). What it does not say is which
 * ranges hold which chunk: that is this journal, <state_dir>/dram.journal,
 * an append-only log of ADD (namespace, key, offset, size, checksum,
 * parent) and DEL (namespace, key) records, each with its own length and
 * checksum so a torn tail is found and ignored. Only committed chunks are
 * ever added, so a put in progress at a crash never reappears. Records
 * are buffered on the core thread and written (write(2), no fsync: a
 * process crash loses nothing written; the pool itself is in memory and
 * does not survive a reboot anyway) before any reply that reports a
 * commit; every commit path ends in store_watermark, which flushes. A
 * DEL may be lost in a crash; the chunk then comes back from the journal
 * but its checksum (verified before anything is served) no longer
 * matches if its space was reused, and it is dropped.
 *
 * The journal is rewritten as a snapshot (sorted by offset, so adoption
 * reserves ranges in O(1) each) at start, at a clean stop, and when the
 * log has grown to several times the snapshot's size. Its header names
 * the pool's size and path: a journal for another pool is ignored.
 */
#ifndef KVT_JOURNAL_H
#define KVT_JOURNAL_H

#include <stddef.h>
#include <stdint.h>

#include "kvtier.h"

struct journal;

/* One chunk as the journal describes it. */
struct jrec {
    const char *ns;
    kvt_key key, parent;
    int has_parent;
    uint64_t off;
    uint32_t size;
    uint64_t csum;
};

/* Open path for a pool (bytes, path). Nothing is read yet. 0 or -1 (err). */
int journal_open(const char *path, uint64_t pool_bytes, const char *pool_path,
                 struct journal **out, char *err, size_t errlen);
/* Replay the log: add(arg, rec) for every ADD, del(arg, ns, key) for
 * every DEL, in order, up to the first damaged record. Returns records
 * read, 0 for no (or another pool's) journal, -1 on a read error. */
long long journal_replay(struct journal *j, void (*add)(void *, const struct jrec *),
                         void (*del)(void *, const char *, const kvt_key *),
                         void *arg);

/* ns_id was renamed: its next record logs its name again. */
void journal_forget_ns(struct journal *j, uint16_t ns_id);
/* Buffer records (ns_id names ns; its name is logged once per file). */
void journal_add(struct journal *j, uint16_t ns_id, const char *ns,
                 const struct jrec *r);
void journal_del(struct journal *j, uint16_t ns_id, const char *ns,
                 const kvt_key *key);
/* Write what is buffered. 0, or -1 (logged once; adoption then just
 * finds less). */
int journal_flush(struct journal *j);
/* Bytes in the file, and records added since the last snapshot. */
uint64_t journal_size(const struct journal *j);

/* Rewrite as a snapshot of n chunks (next(arg, i, &ns_id, &rec) fills
 * chunk i), replacing the file atomically. 0 or -1. */
int journal_snapshot(struct journal *j, size_t n,
                     void (*next)(void *arg, size_t i, uint16_t *ns_id,
                                  struct jrec *r),
                     void *arg);
/* Flush and close. Accepts NULL. */
void journal_close(struct journal *j);

#endif
