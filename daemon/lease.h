/*
 * lease.h -- read and write leases (see lease.c).
 *
 * Ownership: a lease belongs to the table in struct kvtierd from lease_new
 * until lease_drop or lease_forget frees it; its slot, parent and pgen
 * arrays go with it. A pointer from lease_find is valid until the core
 * thread returns to its loop (expiry and a closed connection free leases
 * there). Core thread only.
 */
#ifndef KVT_LEASE_H
#define KVT_LEASE_H

#include <stdint.h>

struct kvtierd;

enum lease_kind { LEASE_READ = 1, LEASE_WRITE = 2 };

struct lease {
    uint64_t id;
    uint32_t pipe;
    uint8_t kind;
    uint64_t deadline; /* ms since start */
    uint32_t n;
    uint32_t *slot;    /* index slots; IDX_NONE for keys that existed */
    uint32_t *parent;  /* write: parent slot of each, or IDX_NONE */
    uint32_t *pgen;    /* write: generation of that parent */
    struct lease *hnext;
};

#define LEASE_BUCKETS 4096

struct lease_table {
    struct lease *b[LEASE_BUCKETS];
    uint64_t next_id;
    uint64_t count;
};

struct lease *lease_new(struct kvtierd *d, uint32_t pipe, uint8_t kind,
                        uint32_t n);
struct lease *lease_find(struct kvtierd *d, uint64_t id);
/* Drop: unpin a read lease, free the pending chunks of a write lease. */
void lease_drop(struct kvtierd *d, struct lease *l);
/* Forget a committed write lease without touching its chunks. */
void lease_forget(struct kvtierd *d, struct lease *l);
void lease_expire(struct kvtierd *d, uint64_t now);
void lease_drop_pipe(struct kvtierd *d, uint32_t pipe);
void lease_drop_all(struct kvtierd *d);

#endif
