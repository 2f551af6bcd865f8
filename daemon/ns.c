/*
 * ns.c -- namespace names <-> 16-bit ids.
 *
 * Design: the index stores a 2-byte id per chunk instead of the name. A
 * fleet runs a handful of namespaces (model x dtype x layout x rank x
 * tenant), so a linear table is searched; ids are never reused while the
 * daemon runs, so stale ids cannot alias a new name.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
