/*
 * pool.h -- opening the DRAM pool the configuration asks for (see pool.c).
 */
#ifndef KVT_POOL_H
#define KVT_POOL_H

#include <stdint.h>

struct kvt_config;
struct kvtierd;

/* Open d->dram as dram.pool says (file or sealed memfd), adopting what a
 * previous run left where dram.adopt allows: the pool file, or a memfd
 * handed back by systemd's fd store (LISTEN_FDS, name kvtier-pool), which
 * is refused with a log line, and a fresh pool made, when it is not a
 * sealed memfd of the pool's size. A fresh memfd goes into the fd store
 * when $NOTIFY_SOCKET is set. Sets d->pool_gid. 0, or -1 logged. */
int pool_open(struct kvtierd *d);
/* Then a pool of its own for each tenant with pool=, of the same kind,
 * adopted likewise (file <pool_path>.<name>, or the memfd kept as
 * kvtier-pool-<name>); fills d->tenant_pool. 0, or -1 logged. */
int pool_open_tenants(struct kvtierd *d);
/* The pool a namespace's chunks live in: its tenant's own, or 0. */
uint32_t pool_of_ns(const struct kvtierd *d, const char *ns);
/* The bytes every pool needs, the default and the tenants' own. */
uint64_t pool_reserve(const struct kvt_config *c);

#endif
