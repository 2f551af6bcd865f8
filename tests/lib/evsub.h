/*
 * evsub.h -- a KV-events subscriber for tests: a ZMQ SUB socket, a strict
 * msgpack decoder of vLLM's KVEventBatch as kvtierd encodes it, and the
 * replay request of vLLM's ZmqEventPublisher.
 *
 * Design: every received batch is flattened into one record per block
 * hash, so a test asks "was key K stored on STORAGE, with parent P?"
 * without caring how the publisher grouped hashes into events. A stored
 * record's parent is the event's parent_block_hash for its first hash and
 * the previous hash for the others (vLLM's meaning of a stored chain).
 * The decoder refuses anything vLLM's msgspec decoder would refuse that
 * we can check cheaply (wrong shapes, a BlockStored missing a required
 * field, unknown event types), so a bad payload fails the test.
 * Waiting is bounded by deadlines only; nothing asserts on time.
 */
#ifndef KVT_TEST_EVSUB_H
#define KVT_TEST_EVSUB_H

#include <stddef.h>
#include <stdint.h>

#include "kvtier.h"

enum { EVS_STORED = 1, EVS_REMOVED = 2, EVS_CLEARED = 3 };

struct evs_rec {
    uint64_t seq;        /* of the batch it came in */
    int kind;            /* EVS_* */
    char medium[16];     /* "CPU", "STORAGE"; "" for AllBlocksCleared */
    kvt_key key;
    int has_parent;
    kvt_key parent;
    uint64_t block_size; /* stored only */
    uint64_t dp_rank;    /* of the batch */
};

struct evsub {
    void *ctx, *sock;
    struct evs_rec *v;
    size_t n, cap;
    size_t msgs;       /* batches received */
    uint64_t last_seq;
    int bad_order;     /* a sequence number not above the one before */
    int bad_payload;   /* a payload that did not decode */
    int bad_topic;     /* a topic other than the expected one */
    char topic[64];
};

/* Connect a SUB socket to url, subscribed to every topic; messages must
 * carry `topic`. 0 or -1. */
int evs_open(struct evsub *s, const char *url, const char *topic);
/* The same, binding url (for a publisher that connects). */
int evs_open_bound(struct evsub *s, const char *url, const char *topic);
void evs_close(struct evsub *s);
/* Forget the records received so far (keeps the sequence check). */
void evs_reset(struct evsub *s);
/* Receive until at least n records are held or ms pass; returns s->n. */
size_t evs_wait(struct evsub *s, size_t n, int ms);
/* Receive whatever arrives within ms; returns s->n. */
size_t evs_drain(struct evsub *s, int ms);
/* Put probe chunks in namespace "evsync" until the subscription is live
 * (a message arrives), then delete them and forget every record. 0 or -1. */
int evs_sync(struct evsub *s, kvt_client *c);
/* Decode one payload into records. 0 or -1. */
int evs_decode(struct evsub *s, uint64_t seq, const uint8_t *p, size_t n);
/* Index of the first record of this kind, medium and key, or -1. */
int evs_find(const struct evsub *s, int kind, const char *medium,
             const kvt_key *key);
/* Records of this kind (and medium, if not NULL). */
size_t evs_count(const struct evsub *s, int kind, const char *medium);

/* Ask a replay endpoint for every batch from seq start on (after a
 * malformed request, one frame only, if junk_first). Decodes the batches
 * into out (zeroed first; free with evs_close) and stores their sequence
 * numbers in seqs (up to cap). Returns the number of batches before the
 * end marker, or -1 (no end marker within ms, bad framing). */
int evs_replay(const char *url, uint64_t start, int junk_first,
               struct evsub *out, uint64_t *seqs, size_t cap, int ms);

#endif
