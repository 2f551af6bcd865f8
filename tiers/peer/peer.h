/*
 * peer.h -- the peer tier: other nodes' DRAM pools over UCX (see peer.c).
 *
 * Ownership: one struct peer_tier per daemon, used by the core thread
 * only. A struct peer_conn belongs to its tier and dies with
 * peer_disconnect or peer_close. A struct peer_fetch lives from
 * peer_fetch until its done callback has returned; the caller may
 * peer_cancel it until then, never after.
 */
#ifndef KVT_PEER_H
#define KVT_PEER_H

#include <stddef.h>
#include <stdint.h>

#define PEER_SLICE (8u << 20) /* largest single UCX get (tcp stalls above) */

struct peer_tier;
struct peer_conn;
struct peer_fetch;

/* status: 0, or -1 (the peer failed, the fetch was cancelled, ...). */
typedef void (*peer_done_fn)(void *arg, int status);

/* A UCX context and worker, the pool [base, base+bytes) registered once.
 * wakeup 1: the worker's event fd wakes the core; 0: polled while
 * fetches are in flight (shared-memory transports). 0, or -1 with a
 * sentence in err. */
int peer_open(void *base, uint64_t bytes, int wakeup, struct peer_tier **out,
              char *err, size_t errlen);
/* Force-close every endpoint (their fetches fail), free. Accepts NULL. */
void peer_close(struct peer_tier *t);
/* Readable when peer_progress has work: add it to the core's epoll. */
int peer_fd(const struct peer_tier *t);
/* Drive UCX: completions call their done callbacks. */
void peer_progress(struct peer_tier *t);
/* What a peer needs to read this pool: the worker address, the packed
 * rkey, the pool's base address. Valid until peer_close. */
void peer_self(const struct peer_tier *t, const void **addr, size_t *alen,
               const void **rkey, size_t *rlen, uint64_t *base);

/* An endpoint to a peer (error mode PEER: a dead peer fails its fetches
 * instead of hanging them). 0 or -1 with err. */
int peer_connect(struct peer_tier *t, const void *addr, size_t alen,
                 const void *rkey, size_t rlen, uint64_t base,
                 struct peer_conn **out, char *err, size_t errlen);
/* 0 once UCX has reported the endpoint failed. */
int peer_conn_ok(const struct peer_conn *c);
/* 1 while a fetch on c is in flight (closing c would cancel it). */
int peer_conn_busy(const struct peer_conn *c);
/* Fail its fetches, close, free. Accepts NULL. */
void peer_disconnect(struct peer_tier *t, struct peer_conn *c);

/* Read len bytes at offset off of the peer's pool into local, in slices
 * of at most PEER_SLICE. done(arg, status) is called once, from
 * peer_progress (never from inside this call). NULL if it cannot start
 * (the connection failed; out of memory): done is then never called. */
struct peer_fetch *peer_fetch(struct peer_tier *t, struct peer_conn *c,
                              uint64_t off, void *local, uint64_t len,
                              peer_done_fn done, void *arg);
/* Stop a fetch: it completes (done, status -1) from peer_progress once
 * UCX has let go of every slice; only then may local be reused. */
void peer_cancel(struct peer_tier *t, struct peer_fetch *f);

/* Peers may be reading our pool now (chunks pinned for them): without
 * wakeup, keep progressing the worker meanwhile. */
void peer_serving(struct peer_tier *t, int on);

/* Make peer_fd readable (any thread): a worker has results for the core. */
void peer_kick(struct peer_tier *t);

/* Bytes fetched and fetches failed since open. */
void peer_counts(const struct peer_tier *t, uint64_t *bytes, uint64_t *failed);

#endif
