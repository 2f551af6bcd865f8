/*
 * tenant.h -- who a connection is, and what it may ask (see tenant.c).
 */
#ifndef KVT_TENANT_H
#define KVT_TENANT_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include <nng/nng.h>
#include <nng/supplemental/tls/tls.h>

#include "kvtier.h"
#include "kvtier.pb-c.h"

struct kvt_config;
struct local_srv;
struct server;
struct tenants;

/* The tenants of c (which must outlive them: tenant lines are not
 * reloaded), with tenants.admin_group resolved. NULL with a sentence in
 * err (an unknown group, a socket that cannot tell uids). Before the
 * listeners open. */
struct tenants *tenant_open(const struct kvt_config *c, char *err, size_t errlen);
/* The transports connections are asked about (either may be NULL), once
 * they are open. Accepts t NULL. */
void tenant_attach(struct tenants *t, struct server *srv, struct local_srv *local);
/* Accepts NULL. The TLS configurations go too (nng keeps its own). */
void tenant_close(struct tenants *t);

/* The urls the nng server listens on, in order, with the TLS
 * configuration of each (NULL: none): daemon.socket, daemon.tcp if set,
 * then each tenant's tls= listener. The table remembers which is which.
 * Returns how many (at most max), or -1 with a sentence in err. The TLS
 * configurations stay owned here. */
int tenant_listeners(struct tenants *t, const char **urls, nng_tls_config **tls,
                     size_t max, char *err, size_t errlen);

/* A connection came or went (nng pipe or fast-channel connection): its
 * credentials are resolved once, while it is connected. */
void tenant_conn_added(struct tenants *t, uint32_t pipe);
void tenant_conn_removed(struct tenants *t, uint32_t pipe);

/* May pipe make request q? KVT_OK, or KVT_EPERM with the reason in why:
 * credentials no tenant lists, a namespace outside the tenant's
 * prefixes, or an operator request from a non-operator. Always KVT_OK
 * without tenants (the single zero-configuration tenant). */
kvt_err tenant_check(struct tenants *t, uint32_t pipe, const Kvtier__Request *q,
                     char *why, size_t why_len);
/* 1 if pipe, a fast-channel connection, may be handed the pool's fd:
 * the daemon's uid, root, or a client the pool's mode lets in as the
 * file-backed pool would (group bits for members of group, other bits
 * for the rest); with tenants it must also be an operator or belong to
 * a tenant. 0 for nng pipes and unknown credentials. */
int tenant_may_map(struct tenants *t, uint32_t pipe, unsigned mode, gid_t group);
/* The tenant (index in the configuration's tenants) pipe belongs to, or
 * -1: none, or no tenants. */
int tenant_of(struct tenants *t, uint32_t pipe);
/* 1 if pipe, a fast-channel connection whose credentials are known,
 * belongs to tenant i: it may be handed that tenant's own pool. */
int tenant_may_map_own(struct tenants *t, uint32_t pipe, int i);
/* 1 if pipe may see namespace ns (STATS lists only those). */
int tenant_ns_visible(struct tenants *t, uint32_t pipe, const char *ns);

#endif
