/*
 * pool.h -- opening the DRAM pool the configuration asks for (see pool.c).
 */
#ifndef KVT_POOL_H
#define KVT_POOL_H

struct kvtierd;

/* Open d->dram as dram.pool says (file or sealed memfd), adopting what a
 * previous run left where dram.adopt allows: the pool file, or a memfd
 * handed back by systemd's fd store (LISTEN_FDS, name kvtier-pool), which
 * is refused with a log line, and a fresh pool made, when it is not a
 * sealed memfd of the pool's size. A fresh memfd goes into the fd store
 * when $NOTIFY_SOCKET is set. Sets d->pool_gid. 0, or -1 logged. */
int pool_open(struct kvtierd *d);

#endif
