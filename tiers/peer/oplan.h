/*
 * oplan.h -- which index entries a holder must send when the view changes:
 * the owners it last told for each local slot, and the log of membership
 * changes they do not reflect yet (see oplan.c).
 *
 * Pure bookkeeping over member ids and keys: no daemon state, no I/O, so
 * gidx.c and the cluster simulator (tests/sim/) run the same planner.
 *
 * Ownership: struct oplan is embedded by its user (fields read-only
 * outside oplan.c); op_init() before use, op_free() releases the slot
 * records. A record pointer from op_rec() stays valid until the next
 * op_rec() or op_free().
 */
#ifndef KVT_OPLAN_H
#define KVT_OPLAN_H

#include <stdint.h>

#include "owners.h"

#define OP_LOG_MAX 1024
#define OP_TELL_MAX 16

struct op_change {
    uint32_t id;
    enum ow_change kind;
};

struct oplan {
    /* Per slot: the change sequence its owners reflect (0: never told),
     * then r owner ids (OW_NONE for none). */
    uint32_t r, *so, so_slots;
    /* Changes not yet applied to every slot: log[i] has sequence
     * log_base + i; a slot at log_base + log_n is up to date. */
    struct op_change log[OP_LOG_MAX];
    uint32_t log_base, log_n;
};

/* r owners per key (at most OW_MAX_REPLICAS). */
void op_init(struct oplan *p, uint32_t r);
void op_free(struct oplan *p);
/* The sequence number of the view now. */
uint32_t op_seq(const struct oplan *p);
/* Log one change. A full log is dropped: the slots it covered are told
 * in full at their next catch-up, as a fresh publish would. */
void op_log(struct oplan *p, uint32_t id, enum ow_change kind);
/* Every slot reflects the whole log (a pass ended): empty it. */
void op_settle(struct oplan *p);
/* Slot s's record (grown on demand, zeroed: never told). */
uint32_t *op_rec(struct oplan *p, uint32_t s);
/* The owners in rec; returns how many. */
uint32_t op_load(const struct oplan *p, const uint32_t *rec, uint32_t *o);
/* rec now says: owners o[0..n), told at the current sequence. */
void op_store(struct oplan *p, uint32_t *rec, const uint32_t *o, uint32_t n);
/* Bring the slot of record rec, holding (k, nsh), up to date with the log
 * against view[0..nv) (live members and this node, as now); its owners
 * out in o[0..*n), and rec updated. The owners that must now be told go
 * to t[] (returns how many, at most OW_MAX_REPLICAS; none when the slot
 * was up to date); *moved is what this counts as entries moved (the
 * members that entered, or every owner when the record predates the log;
 * 0 for a slot never told). */
uint32_t op_catch_up(struct oplan *p, uint32_t *rec, const kvt_key *k, uint64_t nsh,
                     const uint32_t *view, uint32_t nv, uint32_t *o, uint32_t *n, uint32_t *t,
                     uint32_t *moved);

#endif
