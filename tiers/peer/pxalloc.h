/*
 * pxalloc.h -- the membership code's control-plane allocations (member.c,
 * swim.c, gossipq.c): a member table, a gossip queue or a message buffer
 * that cannot be had leaves a node that cannot take part, so it aborts
 * with a clear message naming the module (STYLE 5). Pool, GPU and NVMe
 * space never come through here; they fail softly.
 */
#ifndef KVT_PXALLOC_H
#define KVT_PXALLOC_H

#include <stdio.h>
#include <stdlib.h>

/* realloc(p, sz) (sz 0 taken as 1), or abort naming who. */
static inline void *px_realloc(void *p, size_t sz, const char *who)
{
    void *q = realloc(p, sz ? sz : 1);
    if (!q) {
        fprintf(stderr, "%s: out of memory\n", who);
        abort();
    }
    return q;
}

/* calloc(n, sz) (n 0 taken as 1), or abort naming who. */
static inline void *px_calloc(size_t n, size_t sz, const char *who)
{
    void *p = calloc(n ? n : 1, sz);
    if (!p) {
        fprintf(stderr, "%s: out of memory\n", who);
        abort();
    }
    return p;
}

#endif
