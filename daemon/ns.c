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

#include "journal.h"
#include "kvtierd.h"

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
    memset(t, 0, sizeof *t);
}

int ns_held(const struct kvtierd *d, uint16_t id)
{
    return d->ns.v[id].holds > 0 || idx_ns_slots(&d->idx, id) > 0;
}

void ns_hold(struct kvtierd *d, uint16_t id)
{
    if (id != NS_NONE && id < d->ns.n) d->ns.v[id].holds++;
}

void ns_unhold(struct kvtierd *d, uint16_t id)
{
    if (id == NS_NONE || id >= d->ns.n) return;
    if (d->ns.v[id].holds == 0) abort(); /* broken invariant */
    d->ns.v[id].holds--;
}

uint32_t ns_owned(const struct kvtierd *d, uint32_t pipe)
{
    uint32_t n = 0;
    for (uint32_t i = 0; i < d->ns.n; i++)
        if (d->ns.v[i].owner == pipe && ns_held(d, (uint16_t)i)) n++;
    return n;
}

/* An id nobody holds, or NS_NONE. */
static uint16_t unheld(const struct kvtierd *d)
{
    for (uint32_t i = 0; i < d->ns.n; i++)
        if (!ns_held(d, (uint16_t)i)) return (uint16_t)i;
    return NS_NONE;
}

kvt_err ns_admit(struct kvtierd *d, const char *name, uint32_t pipe,
                 char *why, size_t why_len)
{
    uint16_t id = ns_find(&d->ns, name);
    if (id != NS_NONE && ns_held(d, id)) return KVT_OK;
    uint64_t quota = d->cfg.ns_per_client;
    if (pipe != 0 && quota != 0 && ns_owned(d, pipe) >= quota) {
        snprintf(why, why_len, "namespace quota reached: this connection "
                 "holds %llu namespaces (daemon.ns_per_client)",
                 (unsigned long long)quota);
        return KVT_ETOOBIG;
    }
    if (id == NS_NONE && d->ns.n >= NS_LIMIT && unheld(d) == NS_NONE) {
        snprintf(why, why_len, "too many namespaces (%d)", NS_LIMIT);
        return KVT_ENOSPC;
    }
    return KVT_OK;
}

/* Give unheld id a new name: counters start again, the journal names it
 * afresh before its next record. */
static void rename_id(struct kvtierd *d, uint16_t id, const char *name)
{
    struct ns_info *ni = &d->ns.v[id];
    char *copy = strdup(name);
    if (!copy) abort();
    free(ni->name);
    memset(ni, 0, sizeof *ni);
    ni->name = copy;
    if (d->journal) journal_forget_ns(d->journal, id);
}

uint16_t ns_claim(struct kvtierd *d, const char *name, uint32_t pipe)
{
    uint16_t id = ns_find(&d->ns, name);
    if (id == NS_NONE && d->ns.n >= NS_LIMIT) {
        id = unheld(d);
        if (id == NS_NONE) return NS_NONE;
        rename_id(d, id, name);
    } else if (id == NS_NONE) {
        id = ns_intern(&d->ns, name);
    } else if (ns_held(d, id)) {
        return id; /* its creator keeps it */
    }
    d->ns.v[id].owner = pipe;
    return id;
}
