/*
 * tenant.h -- who a connection is, and what it may ask (see tenant.c).
 */
#ifndef KVT_TENANT_H
#define KVT_TENANT_H

#include <stddef.h>
#include <stdint.h>

#include <nng/nng.h>
#include <nng/supplemental/tls/tls.h>

#include "kvtier.h"
#include "kvtier.pb-c.h"

struct kvtierd;

/* Resolve tenants.admin_group and make d->tenants. 0, or -1 with a
 * sentence in err (an unknown group). Before the listeners open. */
int tenant_open(struct kvtierd *d, char *err, size_t errlen);
/* Accepts a daemon whose tenants never opened. */
void tenant_close(struct kvtierd *d);

/* The urls the nng server listens on, in order, with the TLS
 * configuration of each (NULL: none): daemon.socket, daemon.tcp if set,
 * then each tenant's tls= listener. tenant.c remembers which is which.
 * Returns how many (at most max), or -1 with a sentence in err. The TLS
 * configurations stay owned here. */
int tenant_listeners(struct kvtierd *d, const char **urls,
                     nng_tls_config **tls, size_t max, char *err, size_t errlen);

/* A connection came or went (nng pipe or fast-channel connection). */
void tenant_conn_added(struct kvtierd *d, uint32_t pipe);
void tenant_conn_removed(struct kvtierd *d, uint32_t pipe);

/* May pipe make request q? KVT_OK, or KVT_EPERM with the reason in why:
 * credentials no tenant lists, a namespace outside the tenant's
 * prefixes, or an operator request from a non-operator. Always KVT_OK
 * without tenants (the single zero-configuration tenant). */
kvt_err tenant_check(struct kvtierd *d, uint32_t pipe, const Kvtier__Request *q,
                     char *why, size_t why_len);
/* 1 if pipe may see namespace ns (STATS lists only those). */
int tenant_ns_visible(struct kvtierd *d, uint32_t pipe, const char *ns);

#endif
