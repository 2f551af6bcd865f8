/*
 * gossipq.c -- SWIM's gossip queue (see gossipq.h): claims in a dense
 * array, an open-addressing id hash (linear probing, backward-shift
 * deletion, grown at half load) over it, and a doubly linked FIFO per
 * send count through it. Removing a claim moves the last one into its
 * slot, fixing that one's links and hash entry.
 *
 * Memory: a claim is 64 bytes, plus one block for its address and
 * metadata (alive claims only), plus 4-8 bytes of hash.
 */
#include "gossipq.h"
#include "pxalloc.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NIL UINT32_MAX

static char no_addr[1]; /* the address of non-alive claims */

#define xrealloc(p, sz) px_realloc(p, sz, "gossipq")

static size_t home(const struct gq *q, uint32_t id)
{
    uint32_t h = id; /* a 32-bit finaliser: ids may be sequential or random */
    h ^= h >> 16;
    h *= 0x7feb352dU;
    h ^= h >> 15;
    h *= 0x846ca68bU;
    h ^= h >> 16;
    return h & (q->hcap - 1);
}

/* The hash position holding id, or the empty one where it would go. */
static size_t hpos(const struct gq *q, uint32_t id)
{
    size_t i = home(q, id);
    while (q->h[i] && q->v[q->h[i] - 1].id != id) i = (i + 1) & (q->hcap - 1);
    return i;
}

static void hgrow(struct gq *q)
{
    free(q->h);
    q->hcap = q->hcap ? 2 * q->hcap : 32;
    q->h = xrealloc(NULL, q->hcap * sizeof *q->h);
    memset(q->h, 0, q->hcap * sizeof *q->h);
    for (size_t s = 0; s < q->n; s++) q->h[hpos(q, q->v[s].id)] = (uint32_t)s + 1;
}

/* Backward-shift deletion: entries after i that may sit at i move up. */
static void hdel(struct gq *q, size_t i)
{
    size_t mask = q->hcap - 1;
    for (size_t j = (i + 1) & mask; q->h[j]; j = (j + 1) & mask) {
        size_t k = home(q, q->v[q->h[j] - 1].id);
        if ((j > i && (k <= i || k > j)) || (j < i && k <= i && k > j)) {
            q->h[i] = q->h[j];
            i = j;
        }
    }
    q->h[i] = 0;
}

static void lists_reach(struct gq *q, uint32_t tx)
{
    if (tx < q->nl) return;
    size_t nl = q->nl ? q->nl : 16;
    while (nl <= tx) nl *= 2;
    q->head = xrealloc(q->head, nl * sizeof *q->head);
    q->tail = xrealloc(q->tail, nl * sizeof *q->tail);
    for (size_t l = q->nl; l < nl; l++) q->head[l] = q->tail[l] = NIL;
    q->nl = nl;
}

static void link_tail(struct gq *q, uint32_t s)
{
    struct gq_claim *c = &q->v[s];
    lists_reach(q, c->tx);
    c->next = NIL;
    c->prev = q->tail[c->tx];
    if (c->prev != NIL) q->v[c->prev].next = s;
    else q->head[c->tx] = s;
    q->tail[c->tx] = s;
}

static void unlink_slot(struct gq *q, uint32_t s)
{
    struct gq_claim *c = &q->v[s];
    if (c->prev != NIL) q->v[c->prev].next = c->next;
    else q->head[c->tx] = c->next;
    if (c->next != NIL) q->v[c->next].prev = c->prev;
    else q->tail[c->tx] = c->prev;
}

static void block_free(struct gq_claim *c)
{
    if (c->addr && c->addr != no_addr) free(c->addr);
    c->addr = no_addr;
    c->meta = NULL;
}

/* Take slot s out: its links, its hash entry, its block; the last claim
 * moves into s. */
static void drop(struct gq *q, uint32_t s)
{
    unlink_slot(q, s);
    hdel(q, hpos(q, q->v[s].id));
    block_free(&q->v[s]);
    uint32_t last = (uint32_t)--q->n;
    if (s == last) return;
    struct gq_claim *c = &q->v[s];
    *c = q->v[last];
    if (c->prev != NIL) q->v[c->prev].next = s;
    else q->head[c->tx] = s;
    if (c->next != NIL) q->v[c->next].prev = s;
    else q->tail[c->tx] = s;
    q->h[hpos(q, c->id)] = s + 1;
}

void gq_init(struct gq *q) { memset(q, 0, sizeof *q); }

void gq_free(struct gq *q)
{
    for (size_t s = 0; s < q->n; s++) block_free(&q->v[s]);
    free(q->v);
    free(q->h);
    free(q->head);
    free(q->tail);
    gq_init(q);
}

size_t gq_len(const struct gq *q) { return q->n; }

struct gq_claim *gq_find(const struct gq *q, uint32_t id)
{
    if (!q->n) return NULL;
    uint32_t v = q->h[hpos(q, id)];
    return v ? &q->v[v - 1] : NULL;
}

/* A new claim about id: a slot and a hash entry, no list yet. */
static struct gq_claim *add(struct gq *q, uint32_t id)
{
    if (2 * (q->n + 1) > q->hcap) hgrow(q);
    if (q->n == q->cap) {
        q->cap = q->cap ? 2 * q->cap : 16;
        q->v = xrealloc(q->v, q->cap * sizeof *q->v);
    }
    struct gq_claim *c = &q->v[q->n];
    memset(c, 0, sizeof *c);
    c->id = id;
    c->addr = no_addr;
    q->h[hpos(q, id)] = (uint32_t)q->n + 1;
    q->n++;
    return c;
}

struct gq_claim *gq_put(struct gq *q, uint32_t id, int state, uint64_t inc, const char *addr,
                        const void *meta, size_t meta_len, uint32_t from)
{
    char *blk = no_addr;
    uint8_t *md = NULL;
    size_t alen = addr && addr[0] ? strlen(addr) + 1 : 0;
    size_t mlen = meta ? meta_len : 0;
    if (alen || mlen) { /* built before the old block goes: no aliasing */
        blk = xrealloc(NULL, (alen ? alen : 1) + mlen);
        blk[0] = 0;
        if (alen) memcpy(blk, addr, alen);
        md = mlen ? (uint8_t *)blk + (alen ? alen : 1) : NULL;
        if (mlen) memcpy(md, meta, mlen);
    }
    struct gq_claim *c = gq_find(q, id);
    if (c) {
        unlink_slot(q, (uint32_t)(c - q->v));
        block_free(c);
    } else {
        c = add(q, id);
    }
    c->state = state;
    c->inc = inc;
    c->from = from;
    c->tx = 0;
    c->mark = 0;
    c->size = 0;
    c->addr = blk;
    c->meta = md;
    c->meta_len = (uint32_t)mlen;
    link_tail(q, (uint32_t)(c - q->v));
    return c;
}

struct gq_claim *gq_first(const struct gq *q, uint32_t tx)
{
    return tx < q->nl && q->head[tx] != NIL ? &q->v[q->head[tx]] : NULL;
}

struct gq_claim *gq_next(const struct gq *q, const struct gq_claim *c)
{
    return c->next != NIL ? &q->v[c->next] : NULL;
}

void gq_sent(struct gq *q, uint32_t id, uint32_t lim)
{
    struct gq_claim *c = gq_find(q, id);
    if (!c) return;
    uint32_t s = (uint32_t)(c - q->v);
    if (c->tx + 1 >= lim) {
        drop(q, s);
        return;
    }
    unlink_slot(q, s);
    c->tx++;
    link_tail(q, s);
}

void gq_trim(struct gq *q, uint32_t lim)
{
    for (size_t l = lim; l < q->nl; l++)
        while (q->head[l] != NIL) drop(q, q->head[l]);
}
