/*
 * gossipq.h -- SWIM's gossip queue: at most one claim per member, taken
 * least-sent first and, among claims sent as often, oldest first.
 *
 * Every operation is O(1) (amortised over growth): an id hash finds the
 * claim about a member, and one FIFO list per send count gives the
 * least-sent ones without looking at the rest. While a fleet forms every
 * node queues a claim per member it learns -- thousands -- and each
 * message it sends takes a few dozen of them; a pass over the whole
 * queue per message made forming N nodes cost O(N^3).
 *
 * A pointer to a claim stays valid until the next gq_put, gq_sent,
 * gq_trim or gq_free (claims live in one dense array).
 */
#ifndef KVT_GOSSIPQ_H
#define KVT_GOSSIPQ_H

#include <stddef.h>
#include <stdint.h>

struct gq_claim {
    uint32_t id, from;
    uint32_t tx;                      /* times sent */
    uint32_t mark;                    /* the caller's (swim: the message
                                         that took it last) */
    int state;
    uint32_t meta_len;
    uint64_t inc;
    char *addr;                       /* "" or the start of its block */
    uint8_t *meta;                    /* in the block, or NULL */
    size_t size;                      /* the caller's (packed size) */
    uint32_t prev, next;              /* its send-count list, as slots */
};

struct gq {
    struct gq_claim *v;               /* dense */
    size_t n, cap;
    uint32_t *h;                      /* id hash: slot + 1, 0 = empty */
    size_t hcap;                      /* power of two, at most half full */
    uint32_t *head, *tail;            /* per send count: FIFO of slots */
    size_t nl;
};

void gq_init(struct gq *q);
void gq_free(struct gq *q);
size_t gq_len(const struct gq *q);
struct gq_claim *gq_find(const struct gq *q, uint32_t id);

/* The claim about id becomes (state, inc, addr, meta, from), sent 0
 * times, the newest of those: a queued one is replaced. addr and meta
 * (NULL: none) are copied into one block; mark and size are zeroed. */
struct gq_claim *gq_put(struct gq *q, uint32_t id, int state, uint64_t inc, const char *addr,
                        const void *meta, size_t meta_len, uint32_t from);

/* The oldest claim sent tx times, and the one after c among those. */
struct gq_claim *gq_first(const struct gq *q, uint32_t tx);
struct gq_claim *gq_next(const struct gq *q, const struct gq_claim *c);

/* The claim about id was sent once more: last of those sent as often,
 * or dropped once sent lim times. */
void gq_sent(struct gq *q, uint32_t id, uint32_t lim);

/* Drop every claim sent lim times or more (lim went down). */
void gq_trim(struct gq *q, uint32_t lim);

#endif
