/*
 * ns.h -- namespace ids: who holds one, when it is reused, and the quota
 * of namespaces one connection may hold.
 *
 * Lifetime: an id is *held* while the index has a slot of it (any state
 * but FREE: pending writes, ready chunks in any tier, doomed pinned ones)
 * or something outside the index took a hold (a KV-cache registration, a
 * parked cluster GET). An id nobody holds keeps its name -- the same name
 * finds it again -- until a new name needs an id and the table is full:
 * then it is renamed. Nothing may keep an id across a return to the event
 * loop without a slot or a hold.
 */
#ifndef KVT_NS_H
#define KVT_NS_H

#include <stddef.h>
#include <stdint.h>

#include "kvtier.h"
#include "metrics.h"

#define NS_NONE UINT16_MAX
#define NS_LIMIT 4096

struct ns_info {
    char *name;
    uint32_t owner; /* connection that created it, 0: the daemon (ns.h) */
    uint32_t holds; /* holders besides index slots (ns.h) */
    uint64_t chunks, bytes, hits, misses;
    /* metrics.c: by enum hit_op */
    uint64_t hit_chunks[HIT_OPS], miss_chunks[HIT_OPS], hit_bytes[HIT_OPS];
};

struct idx;
struct journal;

/* The table and the two handles it reads: the index, whose slots hold
 * ids (idx_ns_slots), and the DRAM journal, told when an id is renamed
 * (NULL: none). Set before the first ns_admit / ns_claim. */
struct ns_table {
    struct ns_info *v;
    uint32_t n, cap;
    const struct idx *idx;
    struct journal *journal;
};

/* The id of name, or NS_NONE; and the id of name created if need be
 * (NS_NONE: the table is full). The table alone, no holds. */
uint16_t ns_find(const struct ns_table *t, const char *name);
uint16_t ns_intern(struct ns_table *t, const char *name);
void ns_free(struct ns_table *t);

/* May connection pipe (0: the daemon itself) use namespace name, creating
 * it if it is new or unheld? KVT_OK, or an error with its text in why:
 * KVT_ETOOBIG past quota (daemon.ns_per_client; 0: none), KVT_ENOSPC with
 * the table full of held namespaces. Changes nothing. */
kvt_err ns_admit(const struct ns_table *t, const char *name, uint32_t pipe,
                 uint64_t quota, char *why, size_t why_len);
int ns_held(const struct ns_table *t, uint16_t id);
/* Held namespaces that connection pipe created. */
uint32_t ns_owned(const struct ns_table *t, uint32_t pipe);

/* The id of name, created (or an unheld id renamed) for pipe; NS_NONE when
 * ns_admit would refuse the table. The caller must hold it before it
 * returns to the loop (an index slot or ns_hold). No quota check. */
uint16_t ns_claim(struct ns_table *t, const char *name, uint32_t pipe);
void ns_hold(struct ns_table *t, uint16_t id);
void ns_unhold(struct ns_table *t, uint16_t id);

#endif
