/*
 * ns.c -- namespace names <-> 16-bit ids, and their reuse.
 *
 * Design: the index stores a 2-byte id per chunk instead of the name. A
 * fleet runs a handful of namespaces (model x dtype x layout x rank x
 * tenant), so a linear table of at most NS_LIMIT is searched. A client
 * can name any number of namespaces over time, so ids are reused: an id
 * that no index slot and no other holder references (ns.h) is renamed
 * when a new name needs an id and the table is full. Renaming is safe
 * because nothing keyed by the id survives it: the index has no slot of
 * it, registrations and parked GETs hold theirs, the NVMe index and the
 * cluster use names, and the journal is told to write the new name
 * before the id's next record.
 *
 * Quota: each id remembers the connection that created (or revived) it;
 * a connection may hold at most daemon.ns_per_client namespaces, so one
 * client cannot take the whole table from the others.
 */
#include "ns.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "index.h"
#include "journal.h"

uint16_t ns_find(const struct ns_table *t, const char *name)
{
    for (uint32_t i = 0; i < t->n; i++)
        if (strcmp(t->v[i].name, name) == 0) return (uint16_t)i;
    return NS_NONE;
}

uint16_t ns_intern(struct ns_table *t, const char *name)
{
    uint16_t id = ns_find(t, name);
    if (id != NS_NONE) return id;
    if (t->n >= NS_LIMIT) return NS_NONE;
    if (t->n == t->cap) {
        uint32_t ncap = t->cap ? t->cap * 2 : 16;
        struct ns_info *nv = realloc(t->v, ncap * sizeof *nv);
        if (!nv) abort(); /* control-plane allocation: fail loudly */
        t->v = nv;
        t->cap = ncap;
    }
    struct ns_info *ni = &t->v[t->n];
    memset(ni, 0, sizeof *ni);
    if (!(ni->name = strdup(name))) abort();
    return (uint16_t)t->n++;
}

void ns_free(struct ns_table *t)
{
    for (uint32_t i = 0; i < t->n; i++) free(t->v[i].name);
    free(t->v);
    t->v = NULL;
    t->n = t->cap = 0;
}

int ns_held(const struct ns_table *t, uint16_t id)
{
    return t->v[id].holds > 0 || idx_ns_slots(t->idx, id) > 0;
}

void ns_hold(struct ns_table *t, uint16_t id)
{
    if (id != NS_NONE && id < t->n) t->v[id].holds++;
}

void ns_unhold(struct ns_table *t, uint16_t id)
{
    if (id == NS_NONE || id >= t->n) return;
    if (t->v[id].holds == 0) abort(); /* broken invariant */
    t->v[id].holds--;
}

uint32_t ns_owned(const struct ns_table *t, uint32_t pipe)
{
    uint32_t n = 0;
    for (uint32_t i = 0; i < t->n; i++)
        if (t->v[i].owner == pipe && ns_held(t, (uint16_t)i)) n++;
    return n;
}

/* An id nobody holds, or NS_NONE. */
static uint16_t unheld(const struct ns_table *t)
{
    for (uint32_t i = 0; i < t->n; i++)
        if (!ns_held(t, (uint16_t)i)) return (uint16_t)i;
    return NS_NONE;
}

kvt_err ns_admit(const struct ns_table *t, const char *name, uint32_t pipe,
                 uint64_t quota, char *why, size_t why_len)
{
    uint16_t id = ns_find(t, name);
    if (id != NS_NONE && ns_held(t, id)) return KVT_OK;
    if (pipe != 0 && quota != 0 && ns_owned(t, pipe) >= quota) {
        snprintf(why, why_len, "namespace quota reached: this connection "
                 "holds %llu namespaces (daemon.ns_per_client)",
                 (unsigned long long)quota);
        return KVT_ETOOBIG;
    }
    if (id == NS_NONE && t->n >= NS_LIMIT && unheld(t) == NS_NONE) {
        snprintf(why, why_len, "too many namespaces (%d)", NS_LIMIT);
        return KVT_ENOSPC;
    }
    return KVT_OK;
}

/* Give unheld id a new name: counters start again, the journal names it
 * afresh before its next record. */
static void rename_id(struct ns_table *t, uint16_t id, const char *name)
{
    struct ns_info *ni = &t->v[id];
    char *copy = strdup(name);
    if (!copy) abort();
    free(ni->name);
    memset(ni, 0, sizeof *ni);
    ni->name = copy;
    if (t->journal) journal_forget_ns(t->journal, id);
}

uint16_t ns_claim(struct ns_table *t, const char *name, uint32_t pipe)
{
    uint16_t id = ns_find(t, name);
    if (id == NS_NONE && t->n >= NS_LIMIT) {
        id = unheld(t);
        if (id == NS_NONE) return NS_NONE;
        rename_id(t, id, name);
    } else if (id == NS_NONE) {
        id = ns_intern(t, name);
    } else if (ns_held(t, id)) {
        return id; /* its creator keeps it */
    }
    t->v[id].owner = pipe;
    return id;
}
