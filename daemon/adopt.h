/*
 * adopt.h -- the DRAM journal kept as the cache changes, and adopting a
 * predecessor's pool at start (see adopt.c, journal.h).
 *
 * Context: struct adopt holds the three handles the module works on --
 * the index it replays into, the namespace table (ids by name; it tells
 * the table of the journal, for renames) and the DRAM pool the chunks
 * live in, with which of its pools a namespace belongs in -- filled in
 * by the caller before adopt_open, and the module's
 * own state: the journal and what adoption counted (read by STATS and
 * metrics). Every call is the core thread's and, but adopt_open, is a
 * no-op while there is no journal (no state_dir, or dram.adopt = 0).
 */
#ifndef KVT_ADOPT_H
#define KVT_ADOPT_H

#include <stdint.h>

struct dram;
struct idx;
struct journal;
struct ns_table;

struct adopt {
    /* the caller's, outliving the module */
    struct idx *idx;
    struct ns_table *ns;
    struct dram *dram;
    /* the pool (dram segment) a namespace's chunks belong in, or NULL:
     * all in pool 0 (tenants with a pool of their own keep to theirs) */
    uint32_t (*pool_of)(void *arg, const char *ns);
    void *pool_arg;
    /* the module's */
    struct journal *journal; /* committed DRAM chunks, or NULL */
    uint64_t adopted;        /* chunks adopted at start */
    uint64_t dropped;        /* ... found corrupt and dropped */
};

/* When enabled: open state_dir/dram.journal, adopt what it names of the
 * pool if the pool was kept (dram->adopted; chunks over max_chunk_bytes
 * are not), and write the journal afresh. 0, or -1 (logged) when the
 * journal cannot be opened. */
int adopt_open(struct adopt *a, int enabled, const char *state_dir,
               uint64_t max_chunk_bytes);
/* Write the snapshot a successor adopts by, close the journal. */
void adopt_close(struct adopt *a);
void adopt_added(struct adopt *a, uint32_t slot);   /* a DRAM copy is valid */
void adopt_removed(struct adopt *a, uint32_t slot); /* ... no longer */
void adopt_flush(struct adopt *a);
/* Once a loop iteration: flush, or compact when the log has grown. */
void adopt_tick(struct adopt *a);

#endif
