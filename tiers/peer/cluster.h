/*
 * cluster.h -- membership of kvtierd daemons (see cluster.c), the global
 * index (gidx.c) and GETs pulled from peers (pget.c): the peer tier.
 *
 * Ownership: the core owns a struct cl_ctx (zeroed; host and cfg filled)
 * and passes it to every call; the room's state (struct cluster) hangs
 * off it, NULL when cluster.listen is empty, and every function here
 * accepts that. The core reaches the tier's GET and LOOKUP only through
 * its struct tier (cluster_tier, tier.h).
 */
#ifndef KVT_CLUSTER_H
#define KVT_CLUSTER_H

#include <stddef.h>
#include <stdint.h>

#include "kvtier.pb-c.h"
#include "tier_host.h"

struct cluster;
struct req;
struct tier;

#define CL_STR_MAX 512

/* The tier's configuration ([cluster] keys and the few others it uses),
 * filled by the core at start and again when SIGHUP reloads. */
struct cl_conf {
    char cluster_listen[CL_STR_MAX];
    char cluster_seeds[CL_STR_MAX];
    char cluster_membership[CL_STR_MAX];
    char cluster_tls_cert[CL_STR_MAX]; /* PEM files of the control channel's TLS */
    char cluster_tls_key[CL_STR_MAX];
    char cluster_tls_ca[CL_STR_MAX];
    uint64_t cluster_insecure;           /* 1: plain tcp, no authentication */
    uint64_t cluster_index_max_per_peer; /* index entries naming one member */
    uint64_t cluster_pins_max_per_peer;  /* pins one member holds here */
    uint64_t cluster_node_id, cluster_heartbeat_ms, cluster_failure_ms;
    uint64_t cluster_replicas, cluster_lookup_ms, cluster_ucx_wakeup;
    char cluster_etcd_endpoints[CL_STR_MAX], cluster_etcd_prefix[CL_STR_MAX];
    uint64_t cluster_etcd_lease_s, cluster_probe_ms, cluster_probe_timeout_ms;
    uint64_t cluster_suspicion_mult, cluster_reap_ms, cluster_rx_queue_max;
    uint64_t cluster_max_conns; /* push sockets in use at most; 0: no cap */
    uint64_t cluster_max_peer_eps; /* UCX endpoints open at most; 0: no cap */
    uint64_t lease_timeout_ms, max_chunk_bytes, max_keys, nvme_get_deadline_ms;
};

/* The tier's context: what it is built with, and its state. */
struct cl_ctx {
    const struct tier_host *host;
    struct cl_conf cfg;
    struct idx *idx;     /* host->idx */
    struct dram *dram;   /* host->dram */
    struct wq_cq *cq;    /* host->cq */
    struct cluster *cl;  /* membership, or NULL without [cluster] */
};

/* Listen, dial the seeds. 0, or -1 (logged). Nothing when cluster.listen
 * is empty. */
int cluster_open(struct cl_ctx *d);
/* The eventfd that wakes the core when daemon-to-daemon messages wait;
 * -1 without a cluster. */
int cluster_fd(const struct cl_ctx *d);
/* Handle every queued message. Core thread. */
void cluster_poll(struct cl_ctx *d);
/* Heartbeats and failure detection; called every loop tick. */
void cluster_tick(struct cl_ctx *d);
/* The PEERS request. */
void cluster_do_peers(struct req *r, struct cl_ctx *d, Kvtier__Response *rsp);
/* The peer tier behind tier.h (get: pull over UCX what peers hold;
 * lookup: ask the owners of the keys missing here; committed / removed:
 * tell the owners this node holds a chunk or no longer does); NULL
 * without a cluster. */
struct tier *cluster_tier(const struct cl_ctx *d);
/* The global index's counters for /metrics; zeros without a cluster. */
struct cluster_index_stats {
    uint64_t moved;          /* entries sent because their owners changed */
    uint64_t query_timeouts; /* owner queries unanswered by the deadline */
};
void cluster_index_stats(struct cl_ctx *d, struct cluster_index_stats *st);
/* The peer tier's fd for the core's epoll (-1: none), and its handler. */
int cluster_peer_fd(const struct cl_ctx *d);
void cluster_peer_poll(struct cl_ctx *d);
/* 1 if the cluster runs without TLS (cluster.insecure); *unproven gets
 * the messages refused because their sender's id was not proven. */
int cluster_security(const struct cl_ctx *d, uint64_t *unproven);
/* The membership's Prometheus series (members by state, suspicions,
 * refutations, false deaths, messages and bytes by type and direction,
 * receive-queue drops) as exposition text; malloc'd, the caller frees.
 * Without a cluster: the families with zero samples. */
char *cluster_metrics(const struct cl_ctx *d);
/* Close sockets, free queued messages. Accepts a half-open cluster.
 * Returns 1 when libnng was found wedged (the sockets' bounded close was
 * abandoned): the caller then leaves its other nng sockets to the exit. */
int cluster_close(struct cl_ctx *d);

#endif
