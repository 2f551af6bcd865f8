/*
 * events.h -- KV events: what each tier stores and drops, published in
 * vLLM's KV-events wire format (ZMQ PUB + msgpack) so that routers that
 * read an engine's events (llm-d's indexer, Dynamo's relay) can read
 * kvtier's beside them. events.c explains the design and the format.
 *
 * Every function is called on the core thread and is a no-op while events
 * are off (events.endpoint empty, d->ev NULL). The hooks only record what
 * happened; ev_flush() hands the iteration's records to the publisher
 * thread as one batch. Nothing here blocks the core thread, except
 * ev_open's start-up inventory, which runs before READY.
 */
#ifndef KVT_EVENTS_H
#define KVT_EVENTS_H

#include <stdint.h>

struct kvtierd;

/* Counters, read by metrics.c (any thread may bump them; see events.c). */
struct ev_stats {
    uint64_t published;  /* events sent on the PUB socket */
    uint64_t dropped;    /* events never sent (queue full, send failed) */
    uint64_t batches;    /* messages sent on the PUB socket */
    uint64_t replays;    /* replay requests served */
};

/* Open the sockets and start the publisher thread when events.endpoint is
 * set, then publish AllBlocksCleared followed by a BlockStored for every
 * chunk the tiers already hold (adopted DRAM chunks, the NVMe index), so
 * a subscriber's view starts right after a restart. Call after the tiers
 * are open. 0, or -1 after logging why (a bad endpoint, one in use). */
int ev_open(struct kvtierd *d);
/* Publish what is pending, stop the thread, close the sockets. Safe on a
 * daemon whose ev_open failed or never ran. */
void ev_close(struct kvtierd *d);

/* The chunk in slot (READY) gained a copy in the tiers named by `tiers`
 * (IDX_DRAM, IDX_NVME bits): BlockStored, medium CPU / STORAGE. */
void ev_stored(struct kvtierd *d, uint32_t slot, uint8_t tiers);
/* The chunk in slot (still READY) loses its copies in `tiers`:
 * BlockRemoved. Call before the index forgets the entry. */
void ev_removed(struct kvtierd *d, uint32_t slot, uint8_t tiers);
/* A CLEAR of namespace ns starts: if it empties the whole cache, this
 * publishes AllBlocksCleared and the removals until ev_clear_end() are not
 * published one by one. */
void ev_clear_begin(struct kvtierd *d, uint16_t ns);
void ev_clear_end(struct kvtierd *d);

/* End of a core-loop iteration: hand the pending events over as one
 * batch (one message). Never blocks: a full queue drops the batch and
 * counts its events. */
void ev_flush(struct kvtierd *d);

/* A snapshot of the counters (zeros while events are off). */
void ev_get_stats(const struct kvtierd *d, struct ev_stats *out);

#endif
