/*
 * metrics.c -- counting and the Prometheus text rendering (see metrics.h).
 *
 * Design: rendering walks core-thread state once and writes every family
 * with its HELP and TYPE line, even when it has no sample yet (a dashboard
 * then shows 0, not "no data"). Label values are escaped as the exposition
 * format asks (backslash, double quote, newline); namespace names may hold
 * any printable byte. Series that do not exist yet are documented, not
 * faked: per-tier gauges carry the tiers this daemon runs (dram, hbm with
 * a GPU pool, nvme with an NVMe tier); a demotion series exists once a
 * pair of tiers does; there are no peers yet, so the peer gauges read 0.
 */
#include "metrics.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#include "config.h"
#include "dram.h"
#include "events.h"
#include "hbm.h"
#include "index.h"
#include "kvcache.h"
#include "kvtier.pb-c.h"
#include "lease.h"
#include "local.h"
#include "ns.h"
#include "nvme/nvstore.h"
#include "peer/cluster.h"

/* Upper bounds of the latency buckets in nanoseconds. */
static const uint64_t bucket_ns[MET_BUCKETS] = {
    10000,    25000,    50000,     100000,    250000,    500000,
    1000000,  2500000,  5000000,   10000000,  25000000,  50000000,
    100000000, 250000000, 500000000, 1000000000, 2500000000ull,
};

_Static_assert(KVT_ERR_COUNT == 16, "name the new kvt_err in err_names");
static const char *const err_names[KVT_ERR_COUNT] = {
    "OK",     "EINVAL", "ENOMEM",  "ENOSPC",    "ENOENT",  "EEXIST",
    "EPERM",  "ETIMEDOUT", "ECLOSED", "EPROTO", "EIO",     "EBUSY",
    "ECORRUPT", "ENOTSUP", "ETOOBIG", "EINTERNAL",
};

static const char *const op_names[HIT_OPS] = {"lookup", "get"};

uint64_t metrics_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* ------------------------------------------------------------- counting */

void metrics_request(struct met_core *m, int kind, int err, uint64_t elapsed_ns)
{
    if (kind < 0 || kind >= MET_KINDS) kind = MET_KINDS - 1;
    struct met_hist *h = &m->req[kind];
    int b = 0;
    while (b < MET_BUCKETS && elapsed_ns > bucket_ns[b]) b++;
    h->bucket[b]++;
    h->sum_ns += elapsed_ns;
    h->count++;
    if (err > 0 && err < KVT_ERR_COUNT) m->errors[err]++;
}

void metrics_hits(struct ns_table *t, struct met_core *m, uint16_t ns, enum hit_op op,
                  uint64_t hit_chunks, uint64_t miss_chunks, uint64_t hit_bytes)
{
    if (ns == NS_NONE || ns >= t->n) {
        m->unknown_ns_misses[op] += miss_chunks;
        return;
    }
    struct ns_info *ni = &t->v[ns];
    ni->hit_chunks[op] += hit_chunks;
    ni->miss_chunks[op] += miss_chunks;
    ni->hit_bytes[op] += hit_bytes;
}

/* ------------------------------------------------------------ rendering */

struct sbuf {
    char *p;
    size_t n, cap;
};

static void sb_grow(struct sbuf *b, size_t more)
{
    if (b->n + more <= b->cap) return;
    size_t ncap = b->cap ? b->cap : 16384;
    while (ncap < b->n + more) ncap *= 2;
    char *np = realloc(b->p, ncap);
    if (!np) abort(); /* control-plane allocation */
    b->p = np;
    b->cap = ncap;
}

static void sb_printf(struct sbuf *b, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static void sb_printf(struct sbuf *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    sb_grow(b, (size_t)n + 1);
    va_start(ap, fmt);
    vsnprintf(b->p + b->n, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->n += (size_t)n;
}

/* A label value, escaped: \ -> \\, " -> \", newline -> \n. */
static void sb_esc(struct sbuf *b, const char *v)
{
    sb_grow(b, 2 * strlen(v));
    for (; *v; v++) {
        if (*v == '\\' || *v == '"') b->p[b->n++] = '\\';
        if (*v == '\n') {
            b->p[b->n++] = '\\';
            b->p[b->n++] = 'n';
            continue;
        }
        b->p[b->n++] = *v;
    }
}

static void family(struct sbuf *b, const char *name, const char *type,
                   const char *help)
{
    sb_printf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void sample(struct sbuf *b, const char *name, const char *labels,
                   uint64_t v)
{
    sb_printf(b, "%s%s%s%s %llu\n", name, labels[0] ? "{" : "", labels,
              labels[0] ? "}" : "", (unsigned long long)v);
}

/* The ns label: the name, or with metrics.ns_names = 0 a hash of it (the
 * series stay apart and stable across restarts; names stay private). */
static const char *ns_label(const struct met_src *d, const char *ns,
                            char *buf, size_t len)
{
    if (d->cfg->metrics_ns_names) return ns;
    snprintf(buf, len, "h-%016llx",
             (unsigned long long)XXH3_64bits(ns, strlen(ns)));
    return buf;
}

/* name{ns="<escaped>",<rest>} v */
static void sample_ns(struct sbuf *b, const struct met_src *d, const char *name,
                      const char *ns, const char *rest, uint64_t v)
{
    char h[24];
    sb_printf(b, "%s{ns=\"", name);
    sb_esc(b, ns_label(d, ns, h, sizeof h));
    sb_printf(b, "\"%s%s} %llu\n", rest[0] ? "," : "", rest,
              (unsigned long long)v);
}

static void one(struct sbuf *b, const char *name, const char *type,
                const char *help, const char *labels, uint64_t v)
{
    family(b, name, type, help);
    sample(b, name, labels, v);
}

static void render_process(struct sbuf *b, const struct met_src *d)
{
    family(b, "kvtier_build_info", "gauge", "Version of this kvtierd (value 1).");
    sb_printf(b, "kvtier_build_info{version=\"");
    sb_esc(b, KVT_VERSION);
    sb_printf(b, "\"} 1\n");
    family(b, "kvtier_uptime_seconds", "gauge", "Seconds since kvtierd started.");
    sb_printf(b, "kvtier_uptime_seconds %.3f\n", (double)d->uptime_ms / 1000.0);
    one(b, "kvtier_draining", "gauge",
        "1 while a SIGTERM drain refuses new work, else 0.", "",
        (uint64_t)d->draining);
    one(b, "kvtier_clients", "gauge", "Connected client connections.", "",
        d->n_pipes);
    one(b, "kvtier_local_refused_total", "counter",
        "Fast-channel connections closed at accept: daemon.local_max_conns "
        "were open.", "", local_refused(d->local));
    one(b, "kvtier_index_bytes", "gauge",
        "Memory the chunk index and allocator metadata use.", "",
        idx_mem_bytes(d->idx));
    family(b, "kvtier_config_reloads_total", "counter",
           "SIGHUP reloads by result (error: old settings kept).");
    sample(b, "kvtier_config_reloads_total", "result=\"ok\"", d->met->reloads_ok);
    sample(b, "kvtier_config_reloads_total", "result=\"error\"",
           d->met->reloads_failed);
}

/* The tiers this daemon runs: dram always, hbm when a GPU pool is open. */
struct tier_row {
    const char *label;
    struct tier *t;
    double high, low;
};

static int tier_rows(const struct met_src *d, struct tier_row *rows)
{
    int n = 0;
    rows[n++] = (struct tier_row){"tier=\"dram\"", &d->dram->tier,
                                  d->cfg->high_watermark, d->cfg->low_watermark};
    if (d->kvc && d->kvc->hbm)
        rows[n++] = (struct tier_row){"tier=\"hbm\"", &d->kvc->hbm->tier, -1, -1};
    if (d->nvme)
        rows[n++] = (struct tier_row){"tier=\"nvme\"", d->nvme,
                                      d->cfg->nvme_high_watermark,
                                      d->cfg->nvme_low_watermark};
    return n;
}

static void tier_gauges(struct sbuf *b, const struct met_src *d)
{
    struct tier_row rows[4];
    struct tier_usage u[4];
    int n = tier_rows(d, rows);
    for (int i = 0; i < n; i++) rows[i].t->ops->usage(rows[i].t, &u[i]);
    family(b, "kvtier_tier_capacity_bytes", "gauge", "Capacity of each tier.");
    for (int i = 0; i < n; i++) sample(b, "kvtier_tier_capacity_bytes", rows[i].label, u[i].capacity);
    family(b, "kvtier_tier_used_bytes", "gauge",
           "Bytes allocated in each tier (committed and in-flight chunks).");
    for (int i = 0; i < n; i++) sample(b, "kvtier_tier_used_bytes", rows[i].label, u[i].used);
    family(b, "kvtier_tier_high_watermark_bytes", "gauge",
           "Usage above which eviction starts (tiers with watermarks).");
    for (int i = 0; i < n; i++)
        if (rows[i].high >= 0)
            sample(b, "kvtier_tier_high_watermark_bytes", rows[i].label,
                   (uint64_t)((double)u[i].capacity * rows[i].high));
    family(b, "kvtier_tier_low_watermark_bytes", "gauge",
           "Usage eviction brings the tier down to (tiers with watermarks).");
    for (int i = 0; i < n; i++)
        if (rows[i].low >= 0)
            sample(b, "kvtier_tier_low_watermark_bytes", rows[i].label,
                   (uint64_t)((double)u[i].capacity * rows[i].low));
    family(b, "kvtier_tier_fragmentation_ratio", "gauge",
           "1 - largest free block / free bytes (0: unfragmented).");
    for (int i = 0; i < n; i++)
        sb_printf(b, "kvtier_tier_fragmentation_ratio{%s} %.6f\n", rows[i].label,
                  u[i].fragmentation);
}

/* GPU data path (kvcache.c): chunks saved from and loaded into engine
 * KV tensors, LOADs served from HBM, and HBM copies dropped for room
 * (DRAM keeps the chunk: a demotion from an inclusive cache). */
static void render_gpu(struct sbuf *b, const struct met_src *d)
{
    const struct kvc_counters z = {0}, *st = d->kvc ? &d->kvc->st : &z;
    family(b, "kvtier_demotions_total", "counter",
           "Chunks that left a tier for the one below it.");
    if (d->kvc && d->kvc->hbm)
        sample(b, "kvtier_demotions_total", "from=\"hbm\",to=\"dram\"", st->hbm_demoted);
    if (d->nvme)
        sample(b, "kvtier_demotions_total", "from=\"dram\",to=\"nvme\"",
               nvs_stats(d->nvx)->demotions);
    family(b, "kvtier_gpu_chunks_total", "counter",
           "Chunks moved between engine GPU tensors and the cache, by op.");
    sample(b, "kvtier_gpu_chunks_total", "op=\"save\"", st->saved);
    sample(b, "kvtier_gpu_chunks_total", "op=\"load\"", st->loaded);
    one(b, "kvtier_gpu_load_hbm_chunks_total", "counter",
        "Chunks of GPU loads served from the HBM tier (device to device).", "",
        st->hbm_loaded);
    one(b, "kvtier_gpu_transfer_failures_total", "counter",
        "GPU save or load transfers that failed.", "", st->failed);
}

/* The NVMe tier's data path (nvstore.h) and DRAM adoption (adopt.c). */
static void render_nvme(struct sbuf *b, const struct met_src *d)
{
    static const struct nvs_stats zero;
    const struct nvs_stats *st = d->nvme ? nvs_stats(d->nvx) : &zero;
    family(b, "kvtier_promotions_total", "counter",
           "Chunks read back from a lower tier and verified.");
    if (d->nvme) sample(b, "kvtier_promotions_total", "from=\"nvme\",to=\"dram\"", st->promotions);
    family(b, "kvtier_nvme_errors_total", "counter",
           "NVMe tier failures by kind: checksum (record dropped, a miss), read "
           "(a miss), write and no_space (the chunk stays in DRAM), lost_dirty "
           "(a DRAM chunk dropped before it could be written), index (index "
           "batches not written).");
    if (d->nvme) {
        sample(b, "kvtier_nvme_errors_total", "kind=\"checksum\"", st->csum_failures);
        sample(b, "kvtier_nvme_errors_total", "kind=\"read\"", st->read_errors);
        sample(b, "kvtier_nvme_errors_total", "kind=\"write\"", st->write_errors);
        sample(b, "kvtier_nvme_errors_total", "kind=\"no_space\"", st->enospc);
        sample(b, "kvtier_nvme_errors_total", "kind=\"lost_dirty\"", st->lost_dirty);
        sample(b, "kvtier_nvme_errors_total", "kind=\"index\"", nvs_index_errors(d->nvx));
    }
    family(b, "kvtier_nvme_get_waits_total", "counter",
           "GETs that waited for chunks read back from NVMe, by outcome.");
    if (d->nvme) {
        sample(b, "kvtier_nvme_get_waits_total", "outcome=\"done\"",
               st->get_waits - st->get_timeouts);
        sample(b, "kvtier_nvme_get_waits_total", "outcome=\"deadline\"", st->get_timeouts);
    }
    one(b, "kvtier_nvme_verified_records_total", "counter",
        "NVMe records re-read and checked by VERIFY.", "", st->scrubbed);
    one(b, "kvtier_adopted_chunks", "gauge",
        "DRAM chunks adopted at start from the previous run's pool.", "", d->adopted);
}

/* The DRAM pools: "default", and each tenant's own by its name. */
static void render_pools(struct sbuf *b, const struct met_src *d)
{
    char l[96];
    const char *name;
    family(b, "kvtier_pool_capacity_bytes", "gauge", "Size of each DRAM pool.");
    for (uint32_t p = 0; p < d->dram->n_seg; p++) {
        name = d->pool_names ? d->pool_names[p] : NULL;
        snprintf(l, sizeof l, "pool=\"%s\"", name ? name : "?");
        sample(b, "kvtier_pool_capacity_bytes", l, d->dram->seg[p].bytes);
    }
    family(b, "kvtier_pool_used_bytes", "gauge", "Bytes allocated in each DRAM pool.");
    for (uint32_t p = 0; p < d->dram->n_seg; p++) {
        name = d->pool_names ? d->pool_names[p] : NULL;
        snprintf(l, sizeof l, "pool=\"%s\"", name ? name : "?");
        sample(b, "kvtier_pool_used_bytes", l, dram_pool_used(d->dram, p));
    }
}

static void render_tiers(struct sbuf *b, const struct met_src *d)
{
    const char *t = "tier=\"dram\"";
    tier_gauges(b, d);
    render_pools(b, d);
    family(b, "kvtier_tier_chunks", "gauge", "Committed chunks with a copy in each tier.");
    sample(b, "kvtier_tier_chunks", t, d->idx->n_in[0]);
    if (d->nvme) sample(b, "kvtier_tier_chunks", "tier=\"nvme\"", d->idx->n_in[1]);
    one(b, "kvtier_tier_bytes_in_total", "counter",
        "Bytes of chunks committed into each tier.", t, d->st->bytes_in);
    one(b, "kvtier_tier_bytes_out_total", "counter",
        "Bytes of chunks served from each tier (leased or copied).", t,
        d->st->bytes_out);
    family(b, "kvtier_evictions_total", "counter",
           "Chunks dropped from each tier to make room.");
    sample(b, "kvtier_evictions_total", t, d->st->evictions);
    if (d->nvme) sample(b, "kvtier_evictions_total", "tier=\"nvme\"", nvs_stats(d->nvx)->evictions);
    render_gpu(b, d);
    render_nvme(b, d);
    one(b, "kvtier_puts_total", "counter", "Chunks committed (new chunks only).",
        "", d->st->puts);
}

static void ns_series(struct sbuf *b, const struct met_src *d, const char *name,
                      const uint64_t *(*pick)(const struct ns_info *), int tier)
{
    char rest[64];
    for (uint32_t i = 0; i < d->ns->n; i++) {
        const uint64_t *v = pick(&d->ns->v[i]);
        for (int op = 0; op < HIT_OPS; op++) {
            snprintf(rest, sizeof rest, "op=\"%s\"%s", op_names[op],
                     tier ? ",tier=\"dram\"" : "");
            sample_ns(b, d, name, d->ns->v[i].name, rest, v[op]);
        }
    }
}

static const uint64_t *pick_hit_chunks(const struct ns_info *n) { return n->hit_chunks; }
static const uint64_t *pick_miss_chunks(const struct ns_info *n) { return n->miss_chunks; }
static const uint64_t *pick_hit_bytes(const struct ns_info *n) { return n->hit_bytes; }

static void render_hits(struct sbuf *b, const struct met_src *d)
{
    char l[48];
    family(b, "kvtier_hit_chunks_total", "counter",
           "Chunks found by lookup or get, per namespace and tier "
           "(leading prefix only).");
    ns_series(b, d, "kvtier_hit_chunks_total", pick_hit_chunks, 1);
    family(b, "kvtier_hit_bytes_total", "counter",
           "Bytes of the chunks counted in kvtier_hit_chunks_total.");
    ns_series(b, d, "kvtier_hit_bytes_total", pick_hit_bytes, 1);
    family(b, "kvtier_miss_chunks_total", "counter",
           "Chunks asked for and not found (no ns label: a namespace never "
           "stored into).");
    ns_series(b, d, "kvtier_miss_chunks_total", pick_miss_chunks, 0);
    for (int op = 0; op < HIT_OPS; op++) {
        snprintf(l, sizeof l, "op=\"%s\"", op_names[op]);
        sample(b, "kvtier_miss_chunks_total", l, d->met->unknown_ns_misses[op]);
    }
}

static void render_namespaces(struct sbuf *b, const struct met_src *d)
{
    family(b, "kvtier_namespace_chunks", "gauge", "Committed chunks per namespace.");
    for (uint32_t i = 0; i < d->ns->n; i++)
        sample_ns(b, d, "kvtier_namespace_chunks", d->ns->v[i].name, "",
                  d->ns->v[i].chunks);
    family(b, "kvtier_namespace_bytes", "gauge", "Committed bytes per namespace.");
    for (uint32_t i = 0; i < d->ns->n; i++)
        sample_ns(b, d, "kvtier_namespace_bytes", d->ns->v[i].name, "",
                  d->ns->v[i].bytes);
}

static void render_leases(struct sbuf *b, const struct met_src *d)
{
    uint64_t rd, wr;
    lease_counts(d->leases, &rd, &wr);
    family(b, "kvtier_leases", "gauge", "Leases held by clients now, by kind.");
    sample(b, "kvtier_leases", "kind=\"read\"", rd);
    sample(b, "kvtier_leases", "kind=\"write\"", wr);
    one(b, "kvtier_leases_expired_total", "counter",
        "Leases dropped because their deadline passed.", "", d->st->expired_leases);
    one(b, "kvtier_leases_cancelled_total", "counter",
        "Leases dropped when a shutdown drain ran out of time.", "",
        d->met->leases_cancelled);
    char *cm = cluster_metrics(d->clx); /* members, suspicions, traffic */
    sb_printf(b, "%s", cm);
    free(cm);
    uint64_t unproven;
    int insecure = cluster_security(d->clx, &unproven);
    one(b, "kvtier_cluster_insecure", "gauge",
        "1 if the cluster control channel runs without TLS (cluster.insecure).", "",
        (uint64_t)insecure);
    one(b, "kvtier_cluster_unproven_total", "counter",
        "Daemon-to-daemon messages refused because the node id they claim was not "
        "proven by its certificate.", "", unproven);
}

/* The global index (tiers/peer/gidx.c); zeros without a cluster. */
static void render_index(struct sbuf *b, const struct met_src *d)
{
    struct cluster_index_stats ix;
    cluster_index_stats(d->clx, &ix);
    family(b, "kvtier_index_entries_moved_total", "counter",
           "Global index entries sent to new owners after membership changes.");
    sample(b, "kvtier_index_entries_moved_total", "", ix.moved);
    family(b, "kvtier_owner_queries_timed_out_total", "counter",
           "Global index owner queries unanswered by cluster.lookup_timeout_ms.");
    sample(b, "kvtier_owner_queries_timed_out_total", "", ix.query_timeouts);
}

static void render_errors(struct sbuf *b, const struct met_src *d)
{
    char l[48];
    family(b, "kvtier_errors_total", "counter",
           "Error responses by kvt_err code.");
    for (int e = 1; e < KVT_ERR_COUNT; e++) {
        snprintf(l, sizeof l, "err=\"%s\"", err_names[e]);
        sample(b, "kvtier_errors_total", l, d->met->errors[e]);
    }
}

static void render_hist(struct sbuf *b, const char *kind, const struct met_hist *h)
{
    const char *n = "kvtier_request_duration_seconds";
    uint64_t cum = 0;
    for (int i = 0; i < MET_BUCKETS; i++) {
        cum += h->bucket[i];
        sb_printf(b, "%s_bucket{kind=\"%s\",le=\"%g\"} %llu\n", n, kind,
                  (double)bucket_ns[i] / 1e9, (unsigned long long)cum);
    }
    cum += h->bucket[MET_BUCKETS];
    sb_printf(b, "%s_bucket{kind=\"%s\",le=\"+Inf\"} %llu\n", n, kind,
              (unsigned long long)cum);
    sb_printf(b, "%s_sum{kind=\"%s\"} %.9f\n", n, kind, (double)h->sum_ns / 1e9);
    sb_printf(b, "%s_count{kind=\"%s\"} %llu\n", n, kind,
              (unsigned long long)h->count);
}

/* One histogram per request kind the protocol defines, named by its field
 * in the Request oneof, so a kind added to the proto appears by itself. */
static void render_latency(struct sbuf *b, const struct met_src *d)
{
    const ProtobufCMessageDescriptor *md = &kvtier__request__descriptor;
    family(b, "kvtier_request_duration_seconds", "histogram",
           "Core-thread time per request (decode, handle, encode), by kind.");
    render_hist(b, "malformed", &d->met->req[0]);
    for (unsigned i = 0; i < md->n_fields; i++) {
        const ProtobufCFieldDescriptor *f = &md->fields[i];
        if (!(f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF)) continue;
        if (f->id >= MET_KINDS - 1) continue; /* counted in "other" */
        render_hist(b, f->name, &d->met->req[f->id]);
    }
    render_hist(b, "other", &d->met->req[MET_KINDS - 1]);
}

/* KV events (events.c); zeros while events are off. */
static void render_events(struct sbuf *b, const struct met_src *d)
{
    struct ev_stats s;
    ev_get_stats(d->ev, &s);
    family(b, "kvtier_events_total", "counter",
           "KV events (BlockStored, BlockRemoved, AllBlocksCleared records) by "
           "outcome: published on the PUB socket, or dropped (publisher queue "
           "full or send failed; a subscriber's own high-water-mark drops are "
           "not seen by the sender).");
    sample(b, "kvtier_events_total", "outcome=\"published\"", s.published);
    sample(b, "kvtier_events_total", "outcome=\"dropped\"", s.dropped);
    one(b, "kvtier_event_batches_total", "counter",
        "KV-event messages (one batch, one sequence number) published.", "", s.batches);
    one(b, "kvtier_event_replays_total", "counter",
        "Replay requests answered on events.replay_endpoint.", "", s.replays);
}

char *metrics_render(const struct met_src *d, size_t *len)
{
    struct sbuf b = {0};
    render_process(&b, d);
    render_tiers(&b, d);
    render_hits(&b, d);
    render_namespaces(&b, d);
    render_leases(&b, d);
    render_index(&b, d);
    render_errors(&b, d);
    render_latency(&b, d);
    render_events(&b, d);
    *len = b.n;
    return b.p;
}
