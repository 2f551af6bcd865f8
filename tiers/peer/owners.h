/*
 * owners.h -- rendezvous (highest random weight) owners of a global index
 * key, and how they move when one member joins or leaves (see owners.c).
 *
 * Pure functions over arrays of member ids: no daemon state, no I/O, so
 * the cluster simulator links this file as it is. A view is the ids of
 * the live members, this node included, in any order; ids are nonzero.
 * Owner arrays are in no particular order.
 */
#ifndef KVT_OWNERS_H
#define KVT_OWNERS_H

#include <stdint.h>

#include "kvtier.h"

#define OW_MAX_REPLICAS 8
#define OW_NONE UINT32_MAX

enum ow_change {
    OW_JOIN,   /* the member became live */
    OW_LEAVE,  /* the member is no longer live */
    OW_RESEND, /* nothing moved, but the member lost what it was told */
};

/* The score of member id for (k, nsh); a higher (score, id) ranks first. */
uint64_t ow_score(const kvt_key *k, uint64_t nsh, uint32_t id);

/* 1 if member a ranks before member b for (k, nsh). */
int ow_outranks(const kvt_key *k, uint64_t nsh, uint32_t a, uint32_t b);

/* The min(r, n) best-ranked ids of view[0..n) for (k, nsh), best first;
 * returns how many. r is at most OW_MAX_REPLICAS + 1 (the owners and the
 * member that would take an owner's place); more is cut to that. O(n). */
uint32_t owners_of(const kvt_key *k, uint64_t nsh, const uint32_t *view, uint32_t n,
                   uint32_t r, uint32_t *out);

/* Apply one change of member `who` to the owners o[0..*n) of (k, nsh)
 * (r wanted), updating o and *n in place. Returns the member that must
 * now be told about the key -- one that entered the owners, or for
 * OW_RESEND (and OW_JOIN of a member already an owner: it restarted) the
 * member itself when it is an owner -- or OW_NONE when nothing changed
 * for this key. A join costs r + 1 scores; a leave costs nothing unless
 * `who` was an owner (R/N of the keys), when the vacancy is filled from
 * view[0..nview), the view after the change (O(nview)). */
uint32_t owners_delta(const kvt_key *k, uint64_t nsh, uint32_t *o, uint32_t *n, uint32_t r,
                      uint32_t who, enum ow_change ch, const uint32_t *view, uint32_t nview);

#endif
