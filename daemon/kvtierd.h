/*
 * kvtierd.h -- the daemon's state, owned by the core thread.
 *
 * Design (DESIGN §6): one core thread owns the index, the allocator, the
 * leases and the policy. nng's threads only move messages: they queue a
 * received request and wake the core through an eventfd. Everything in
 * struct kvtierd is therefore touched by the core thread alone and needs
 * no lock; the only shared structure is the server's queue (server.c).
 */
#ifndef KVT_KVTIERD_H
#define KVT_KVTIERD_H

#include <stdint.h>

#include "adopt.h"
#include "clock.h"
#include "config.h"
#include "dram.h"
#include "index.h"
#include "kvtier.h"
#include "lease.h"
#include "metrics.h"
#include "ns.h"
#include "tier_host.h"

struct server;
struct kvc;
struct metrics_http;
struct nvs_ctx;
struct cl_ctx;
struct ev;
struct park_table;
struct tenants;
struct wq_cq;

struct kvtierd {
    struct kvt_config cfg;
    struct dram *dram;
    unsigned pool_gid;     /* group whose members may map a memfd pool */
    uint32_t tenant_pool[CFG_TENANTS_MAX]; /* each tenant's pool (0: the
                                            * default one), pool.c */
    struct idx idx;
    struct ns_table ns;
    struct lease_table leases;
    struct server *srv;
    struct local_srv *local; /* the fast channel, or NULL */
    char local_path[CFG_STR_MAX + 8];
    struct counters st;
    uint32_t *pipes; /* connected nng pipe ids */
    uint32_t n_pipes, cap_pipes;
    uint64_t evict_target; /* >0: some pool has bytes to free in slices */
    uint64_t pool_target[DRAM_POOLS_MAX]; /* each pool's bytes to free */
    char gpu[160];
    struct kvc *kvc;       /* KV-cache registrations, transfers (kvcache.c) */
    struct adopt adopt;    /* the DRAM journal; what start adopted (adopt.c) */
    /* the tiers (tier.h), built from one host of the core's services
     * (tierhost.c) */
    struct tier_host host;
    struct nvs_ctx *nvx;   /* the NVMe tier's context (nvme/nvstore.h) */
    struct cl_ctx *clx;    /* the peer tier's context (peer/cluster.h) */
    struct tier *nvme;     /* the NVMe tier, or NULL without one */
    struct tier *tiers[3]; /* GET / LOOKUP order: dram, nvme, peer */
    uint32_t n_tiers;
    struct ev *ev;         /* KV-events publisher, or NULL when off (events.c) */
    struct park_table *park; /* requests answered later (park.c) */
    struct tenants *tenants; /* who each connection is (tenant.c) */
    struct wq_cq *cq;      /* workers' finished jobs (workq.c) */
    uint64_t start_ms;
    /* operations (main.c, metrics.c) */
    struct met_core met;
    struct metrics_http *http;
    int req_kind;           /* oneof field of the request being handled */
    int draining;           /* SIGTERM seen: only finishing work accepted */
    uint64_t drain_deadline; /* ms (kvtierd_clock): cancel what is left */
    uint64_t last_work_ms;   /* ms: the last request served, not refused */
};

static inline uint64_t kvtierd_clock(const struct kvtierd *d)
{
    return now_ms() - d->start_ms;
}
/* Seconds since start: the index's access times. */
static inline uint32_t kvtierd_secs(const struct kvtierd *d)
{
    return (uint32_t)(kvtierd_clock(d) / 1000);
}

#endif
