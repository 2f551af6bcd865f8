/*
 * lease.h -- read and write leases (see lease.c).
 *
 * The table knows leases, their owners and their deadlines, not what a
 * lease holds: dropping one hands each of its slots back through the
 * release function given to lease_init (the daemon's unpins a read
 * lease's chunks and frees a write lease's uncommitted ones,
 * handlers.c). So the table needs nothing of the daemon but that call.
 *
 * Ownership: a lease belongs to its table from lease_new until lease_drop
 * or lease_forget frees it; its slot, parent and pgen arrays go with it.
 * A pointer from lease_find is valid until the core thread returns to its
 * loop (expiry and a closed connection free leases there). Core thread
 * only.
 */
#ifndef KVT_LEASE_H
#define KVT_LEASE_H

#include <stdint.h>

#include "kvtier.h"

enum lease_kind { LEASE_READ = 1, LEASE_WRITE = 2 };

struct lease {
    uint64_t id;
    uint32_t pipe;
    uint8_t kind;
    uint64_t deadline; /* ms, on the caller's clock (kvtierd_clock) */
    uint32_t n;
    uint32_t *slot;    /* index slots; IDX_NONE for keys that existed */
    uint32_t *parent;  /* write: parent slot of each, or IDX_NONE */
    uint32_t *pgen;    /* write: generation of that parent */
    struct lease *hnext;
};

#define LEASE_BUCKETS 4096

/* Let go of slot (never IDX_NONE) of a dropped lease of that kind. */
typedef void (*lease_release_fn)(void *arg, uint8_t kind, uint32_t slot);

struct lease_table {
    struct lease *b[LEASE_BUCKETS];
    uint64_t next_id;
    uint64_t count;
    lease_release_fn release;
    void *arg;
};

/* Before the first lease (the table may be zeroed memory). */
void lease_init(struct lease_table *t, lease_release_fn release, void *arg);
/* A lease of n slots (all 0: the caller fills them) for connection pipe,
 * due at deadline. Aborts when out of memory (a control-plane
 * allocation, STYLE §5). */
struct lease *lease_new(struct lease_table *t, uint32_t pipe, uint8_t kind,
                        uint32_t n, uint64_t deadline);
struct lease *lease_find(const struct lease_table *t, uint64_t id);
/* The lease id of that kind owned by connection pipe: KVT_OK, KVT_ENOENT
 * (none of that kind), or KVT_EPERM (another connection's). */
kvt_err lease_own(const struct lease_table *t, uint64_t id, uint32_t pipe,
                  uint8_t kind, struct lease **out);
/* Release every slot (lease_init's release), then free the lease. */
void lease_drop(struct lease_table *t, struct lease *l);
/* Free a committed write lease without releasing its slots. */
void lease_forget(struct lease_table *t, struct lease *l);
/* Drop the leases whose deadline is at or before now; returns how many. */
uint64_t lease_expire(struct lease_table *t, uint64_t now);
/* pipe closed: drop its leases. */
void lease_drop_pipe(struct lease_table *t, uint32_t pipe);
void lease_drop_all(struct lease_table *t);
/* Leases held now, by kind. */
void lease_counts(const struct lease_table *t, uint64_t *read, uint64_t *write);

#endif
