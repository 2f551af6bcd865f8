/*
 * tierhost.c -- the services the core lends its tiers (tier_host.h) and
 * the GPU data path (struct kvc_env, kvcache.h).
 *
 * Design: the NVMe and peer tiers are leaves (STYLE §16): they never see
 * struct kvtierd. Each call a tier makes into the core lands here and is
 * answered by the core module that owns it: placement and eviction
 * (store.c), namespaces (ns.c), events (events.c), the DRAM journal
 * (adopt.c), parked requests (park.c), replies (handlers.c). The tiers'
 * configuration is copied into their contexts here too, at start and on
 * SIGHUP, so a reloaded value reaches them as it reaches the core.
 *
 * Each call hands the owning module its own part of the daemon (the
 * namespace table, the park table, the events publisher), never the
 * daemon; only placement (store.c) and the GET answer (handlers.c) are
 * the core's wiring modules and take it whole. The GPU data path
 * (kvcache.c) is built on the same host, plus the namespace table, the
 * configuration and two questions about a connection.
 */
#include "tierhost.h"

#include <stdio.h>
#include <stdlib.h>

#include "adopt.h"
#include "events.h"
#include "handlers.h" /* req_alloc, req_fail, handle_get_answer, pipe_alive */
#include "kvcache.h"
#include "kvtierd.h"
#include "local.h"
#include "metrics.h"
#include "ns.h"
#include "nvme/nvstore.h"
#include "park.h"
#include "peer/cluster.h"
#include "store.h"

static struct kvtierd *core_of(void *core)
{
    return core;
}

static uint64_t h_clock_ms(void *core)
{
    return kvtierd_clock(core);
}

static uint64_t h_now_ns(void *core)
{
    (void)core;
    return metrics_now_ns();
}

static const char *h_ns_name(void *core, uint16_t ns)
{
    return core_of(core)->ns.v[ns].name;
}

static uint16_t h_ns_find(void *core, const char *name)
{
    return ns_find(&core_of(core)->ns, name);
}

static uint16_t h_ns_intern(void *core, const char *name)
{
    return ns_intern(&core_of(core)->ns, name);
}

static uint16_t h_ns_claim(void *core, const char *name, uint32_t pipe)
{
    return ns_claim(&core_of(core)->ns, name, pipe);
}

static void h_ns_hold(void *core, uint16_t ns)
{
    ns_hold(&core_of(core)->ns, ns);
}

static void h_ns_unhold(void *core, uint16_t ns)
{
    ns_unhold(&core_of(core)->ns, ns);
}

static void h_ns_loaded(void *core, uint16_t ns, uint64_t bytes)
{
    struct ns_info *ni = &core_of(core)->ns.v[ns];
    ni->chunks++;
    ni->bytes += bytes;
}

static kvt_err h_reserve(void *core, uint16_t ns, const kvt_key *key,
                         uint64_t size, uint32_t *slot)
{
    return store_reserve(core, ns, key, size, slot);
}

static void h_commit(void *core, uint32_t slot, uint64_t csum, uint32_t parent)
{
    store_commit(core, slot, csum, parent);
}

static void h_free_slot(void *core, uint32_t slot)
{
    store_free(core, slot);
}

static kvt_err h_alloc_dram(void *core, uint16_t ns, uint64_t size, uint32_t *blk)
{
    return store_alloc_dram(core, ns, size, blk);
}

static void h_drop_dram(void *core, uint32_t slot)
{
    store_drop_dram(core, slot);
}

static void h_watermark(void *core)
{
    store_watermark(core);
}

static void h_dram_added(void *core, uint32_t slot)
{
    adopt_added(&core_of(core)->adopt, slot);
}

static void h_ev_stored(void *core, uint32_t slot, uint8_t tier)
{
    ev_stored(core_of(core)->ev, slot, tier);
}

static void h_ev_removed(void *core, uint32_t slot, uint8_t tier)
{
    ev_removed(core_of(core)->ev, slot, tier);
}

static struct park *h_park(void *core, uint32_t pipe, uint64_t req_id,
                           const struct park_ops *ops, void *ctx, void *owner)
{
    return park_defer(core_of(core)->park, pipe, req_id, ops, ctx, owner);
}

static void h_park_deadline(void *core, struct park *p, uint64_t deadline)
{
    (void)core;
    park_set_deadline(p, deadline);
}

static void h_park_answer(void *core, struct park *p, const Kvtier__Response *rsp)
{
    park_answer(core_of(core)->park, p, rsp);
}

static void h_get_answer(void *core, struct park *p, uint16_t ns, int inline_,
                         uint32_t n_keys, const uint32_t *slots, size_t n)
{
    Kvtier__Response rsp;
    void *scratch = NULL;
    handle_get_answer(core, park_pipe(p), park_req_id(p), ns, inline_, n_keys,
                      slots, n, &rsp, &scratch);
    park_answer(core_of(core)->park, p, &rsp);
    handle_response_free(&rsp, scratch);
}

static kvt_err h_req_fail(struct req *r, kvt_err e, const char *msg)
{
    return req_fail(r, e, "%s", msg);
}

static const struct tier_host host_calls = {
    .clock_ms = h_clock_ms,
    .now_ns = h_now_ns,
    .ns_name = h_ns_name,
    .ns_find = h_ns_find,
    .ns_intern = h_ns_intern,
    .ns_claim = h_ns_claim,
    .ns_hold = h_ns_hold,
    .ns_unhold = h_ns_unhold,
    .ns_loaded = h_ns_loaded,
    .reserve = h_reserve,
    .commit = h_commit,
    .free_slot = h_free_slot,
    .alloc_dram = h_alloc_dram,
    .drop_dram = h_drop_dram,
    .watermark = h_watermark,
    .dram_added = h_dram_added,
    .ev_stored = h_ev_stored,
    .ev_removed = h_ev_removed,
    .park = h_park,
    .park_deadline = h_park_deadline,
    .park_pipe = park_pipe,
    .park_req_id = park_req_id,
    .park_answer = h_park_answer,
    .get_answer = h_get_answer,
    .req_alloc = req_alloc,
    .req_fail = h_req_fail,
};

void tierhost_conf(struct kvtierd *d)
{
    const struct kvt_config *c = &d->cfg;
    struct nvs_conf *n = &d->nvx->cfg;
    snprintf(n->nvme_dirs, sizeof n->nvme_dirs, "%s", c->nvme_dirs);
    snprintf(n->nvme_index_path, sizeof n->nvme_index_path, "%s", c->nvme_index_path);
    n->nvme_bytes = c->nvme_bytes;
    n->nvme_file_bytes = c->nvme_file_bytes;
    n->nvme_queue_depth = c->nvme_queue_depth;
    n->nvme_register_buffers = c->nvme_register_buffers;
    n->nvme_write_through = c->nvme_write_through;
    n->nvme_fsync = c->nvme_fsync;
    n->nvme_get_deadline_ms = c->nvme_get_deadline_ms;
    n->nvme_high_watermark = c->nvme_high_watermark;
    n->nvme_low_watermark = c->nvme_low_watermark;
    struct cl_conf *k = &d->clx->cfg;
    snprintf(k->cluster_listen, sizeof k->cluster_listen, "%s", c->cluster_listen);
    snprintf(k->cluster_seeds, sizeof k->cluster_seeds, "%s", c->cluster_seeds);
    snprintf(k->cluster_membership, sizeof k->cluster_membership, "%s",
             c->cluster_membership);
    snprintf(k->cluster_tls_cert, sizeof k->cluster_tls_cert, "%s", c->cluster_tls_cert);
    snprintf(k->cluster_tls_key, sizeof k->cluster_tls_key, "%s", c->cluster_tls_key);
    snprintf(k->cluster_tls_ca, sizeof k->cluster_tls_ca, "%s", c->cluster_tls_ca);
    k->cluster_insecure = c->cluster_insecure;
    k->cluster_index_max_per_peer = c->cluster_index_max_per_peer;
    k->cluster_pins_max_per_peer = c->cluster_pins_max_per_peer;
    k->cluster_node_id = c->cluster_node_id;
    k->cluster_heartbeat_ms = c->cluster_heartbeat_ms;
    k->cluster_failure_ms = c->cluster_failure_ms;
    k->cluster_replicas = c->cluster_replicas;
    k->cluster_lookup_ms = c->cluster_lookup_ms;
    k->cluster_ucx_wakeup = c->cluster_ucx_wakeup;
    snprintf(k->cluster_etcd_endpoints, sizeof k->cluster_etcd_endpoints, "%s",
             c->cluster_etcd_endpoints);
    snprintf(k->cluster_etcd_prefix, sizeof k->cluster_etcd_prefix, "%s",
             c->cluster_etcd_prefix);
    k->cluster_etcd_lease_s = c->cluster_etcd_lease_s;
    k->cluster_probe_ms = c->cluster_probe_ms;
    k->cluster_probe_timeout_ms = c->cluster_probe_timeout_ms;
    k->cluster_suspicion_mult = c->cluster_suspicion_mult;
    k->cluster_reap_ms = c->cluster_reap_ms;
    k->cluster_rx_queue_max = c->cluster_rx_queue_max;
    k->cluster_max_conns = c->cluster_max_conns;
    k->cluster_max_peer_eps = c->cluster_max_peer_eps;
    k->lease_timeout_ms = c->lease_timeout_ms;
    k->max_chunk_bytes = c->max_chunk_bytes;
    k->max_keys = c->max_keys;
    k->nvme_get_deadline_ms = c->nvme_get_deadline_ms;
}

void tierhost_init(struct kvtierd *d)
{
    d->host = host_calls;
    d->host.core = d;
    d->nvx = calloc(1, sizeof *d->nvx);
    d->clx = calloc(1, sizeof *d->clx);
    if (!d->nvx || !d->clx) abort(); /* start-up allocation */
    d->nvx->host = &d->host;
    d->clx->host = &d->host;
    tierhost_conf(d);
}

void tierhost_attach(struct kvtierd *d)
{
    d->host.idx = &d->idx;
    d->host.dram = d->dram;
    d->host.cq = d->cq;
    d->nvx->idx = d->clx->idx = &d->idx;
    d->nvx->dram = d->clx->dram = d->dram;
    d->nvx->cq = d->clx->cq = d->cq;
}

void tierhost_order(struct kvtierd *d)
{
    struct tier *v[] = {d->dram ? &d->dram->tier : NULL, nvs_tier(d->nvx),
                        cluster_tier(d->clx)};
    d->nvme = v[1];
    d->n_tiers = 0;
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++)
        if (v[i]) d->tiers[d->n_tiers++] = v[i];
}

void tierhost_close(struct kvtierd *d)
{
    d->nvme = NULL;
    d->n_tiers = 0;
    free(d->nvx);
    free(d->clx);
    d->nvx = NULL;
    d->clx = NULL;
}

/* ---------------------------------------------------- the GPU data path */

static int k_pipe_alive(void *core, uint32_t pipe)
{
    return pipe_alive(core, pipe);
}

/* nng ipc:// or the fast channel; -1 for a remote connection. */
static int k_peer_uid(void *core, uint32_t pipe, uint64_t *uid)
{
    if (pipe >= LOCAL_ID_BASE) return local_peer_uid(core_of(core)->local, pipe, uid);
    nng_pipe p = NNG_PIPE_INITIALIZER;
    p.id = pipe;
    return nng_pipe_get_uint64(p, NNG_OPT_IPC_PEER_UID, uid) == 0 ? 0 : -1;
}

int tierhost_kvc_open(struct kvtierd *d)
{
    struct kvc_env env = {&d->host, &d->ns, &d->cfg, &d->st.bytes_out, d,
                          k_pipe_alive, k_peer_uid};
    int rv = kvc_open(&env, &d->kvc);
    snprintf(d->gpu, sizeof d->gpu, "%s", kvc_gpu_status(d->kvc));
    return rv;
}

void tierhost_kvc_close(struct kvtierd *d)
{
    kvc_close(d->kvc);
    d->kvc = NULL;
}
