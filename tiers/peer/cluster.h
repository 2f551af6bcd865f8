/*
 * cluster.h -- membership of kvtierd daemons (see cluster.c).
 *
 * Ownership: struct cluster belongs to the core thread (d->cl); NULL when
 * cluster.listen is empty, and every function here accepts that.
 */
#ifndef KVT_CLUSTER_H
#define KVT_CLUSTER_H

#include <stddef.h>
#include <stdint.h>

#include "kvtier.pb-c.h"

struct kvtierd;
struct req;

/* Listen, dial the seeds. 0, or -1 (logged). Nothing when cluster.listen
 * is empty. */
int cluster_open(struct kvtierd *d);
/* The eventfd that wakes the core when daemon-to-daemon messages wait;
 * -1 without a cluster. */
int cluster_fd(const struct kvtierd *d);
/* Handle every queued message. Core thread. */
void cluster_poll(struct kvtierd *d);
/* Heartbeats and failure detection; called every loop tick. */
void cluster_tick(struct kvtierd *d);
/* The PEERS request. */
void cluster_do_peers(struct req *r, struct kvtierd *d, Kvtier__Response *rsp);
/* gidx.c: this node now holds (held = 1) or no longer holds the chunk in
 * a READY slot; its owners are told in the next batch. */
void cluster_held(struct kvtierd *d, uint32_t slot, int held);
/* store_lookup_walk: after the local pass filled lr (arena memory), ask
 * the owners of the keys missing here. 1: the request is parked and
 * answered later (lr is then discarded); 0: answer now with lr, updated
 * with what this node could tell alone. */
int cluster_lookup(struct kvtierd *d, uint32_t pipe, uint64_t req_id,
                   const Kvtier__Lookup *q, Kvtier__LookupResp *lr);
/* pget.c, from store_get_walk: GET after the local pass found
 * slots[0..n): fetch the rest from peers. 1: parked, answered later;
 * 0: answer now. */
int cluster_get(struct kvtierd *d, uint32_t pipe, uint64_t req_id,
                const Kvtier__Get *q, const uint32_t *slots, size_t n);
/* The global index's counters for /metrics; zeros without a cluster. */
struct cluster_index_stats {
    uint64_t moved;          /* entries sent because their owners changed */
    uint64_t query_timeouts; /* owner queries unanswered by the deadline */
};
void cluster_index_stats(struct kvtierd *d, struct cluster_index_stats *st);
/* The peer tier's fd for the core's epoll (-1: none), and its handler. */
int cluster_peer_fd(const struct kvtierd *d);
void cluster_peer_poll(struct kvtierd *d);
/* Close sockets, free queued messages. Accepts a half-open cluster. */
void cluster_close(struct kvtierd *d);

#endif
