/*
 * events.h -- KV events: what each tier stores and drops, published in
 * vLLM's KV-events wire format (ZMQ PUB + msgpack) so that routers that
 * read an engine's events (llm-d's indexer, Dynamo's relay) can read
 * kvtier's beside them. events.c explains the design and the format.
 *
 * Every function is called on the core thread and is a no-op while events
 * are off (events.endpoint empty: the publisher is NULL). The hooks only
 * record what happened; ev_flush() hands the iteration's records to the
 * publisher thread as one batch. Nothing here blocks the core thread, except
 * ev_open's start-up inventory, which runs before READY.
 */
#ifndef KVT_EVENTS_H
#define KVT_EVENTS_H

#include <stdint.h>

struct ev;
struct idx;
struct kvt_config;
struct ns_table;

/* Counters, read by metrics.c (any thread may bump them; see events.c). */
struct ev_stats {
    uint64_t published;  /* events sent on the PUB socket */
    uint64_t dropped;    /* events never sent (queue full, send failed) */
    uint64_t batches;    /* messages sent on the PUB socket */
    uint64_t replays;    /* replay requests served */
};

/* When events.endpoint is set: open the sockets and start the publisher
 * thread into *out, then publish AllBlocksCleared followed by a
 * BlockStored for every chunk the tiers already hold (adopted DRAM
 * chunks, the NVMe index), so a subscriber's view starts right after a
 * restart. Call after the tiers are open; idx and ns (read for chunk keys
 * and by CLEAR) must outlive the publisher. Otherwise *out = NULL: events
 * are off. 0, or -1 after logging why (a bad endpoint, one in use); *out
 * may then be half-built, for ev_close. */
int ev_open(const struct kvt_config *c, const struct idx *idx,
            const struct ns_table *ns, struct ev **out);
/* Publish what is pending, stop the thread, close the sockets. Accepts
 * NULL and a publisher whose ev_open failed. */
void ev_close(struct ev *e);

/* The chunk in slot (READY) gained a copy in the tiers named by `tiers`
 * (IDX_DRAM, IDX_NVME bits): BlockStored, medium CPU / STORAGE. The
 * placement code and the tiers (through their host) call these two. */
void ev_stored(struct ev *e, uint32_t slot, uint8_t tiers);
/* The chunk in slot (still READY) loses its copies in `tiers`:
 * BlockRemoved. Call before the index forgets the entry. */
void ev_removed(struct ev *e, uint32_t slot, uint8_t tiers);
/* A CLEAR of namespace ns starts: if it empties the whole cache, this
 * publishes AllBlocksCleared and the removals until ev_clear_end() are not
 * published one by one. */
void ev_clear_begin(struct ev *e, uint16_t ns);
void ev_clear_end(struct ev *e);

/* End of a core-loop iteration: hand the pending events over as one
 * batch (one message). Never blocks: a full queue drops the batch and
 * counts its events. */
void ev_flush(struct ev *e);

/* A snapshot of the counters (zeros while events are off). */
void ev_get_stats(const struct ev *e, struct ev_stats *out);

#endif
