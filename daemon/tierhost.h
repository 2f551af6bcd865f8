/*
 * tierhost.h -- the core's side of tier_host.h and of the GPU data path's
 * struct kvc_env (see tierhost.c).
 *
 * Ownership: d->host, d->nvx and d->clx belong to the core thread; the
 * tiers keep pointers to them until tierhost_close.
 */
#ifndef KVT_TIERHOST_H
#define KVT_TIERHOST_H

struct kvtierd;

/* Build the tiers' contexts (configuration copied in; host calls set).
 * Before the NVMe index size is asked and before any tier opens. */
void tierhost_init(struct kvtierd *d);
/* The index, pool and completion queue exist: hand them to the tiers. */
void tierhost_attach(struct kvtierd *d);
/* Copy the configuration into the tiers' contexts again (SIGHUP). */
void tierhost_conf(struct kvtierd *d);
/* After the tiers opened: the order GET and LOOKUP walk them in
 * (d->tiers: dram, nvme, peer; absent ones left out). */
void tierhost_order(struct kvtierd *d);
/* After every tier closed. */
void tierhost_close(struct kvtierd *d);
/* Open the GPU data path on the host (kvc_open), after tierhost_attach;
 * fills d->kvc and d->gpu. -1 when the daemon must not start. */
int tierhost_kvc_open(struct kvtierd *d);
/* kvc_close, and d->kvc = NULL. Accepts a daemon without one. */
void tierhost_kvc_close(struct kvtierd *d);

#endif
