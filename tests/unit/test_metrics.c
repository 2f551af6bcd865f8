/*
 * test_metrics.c -- the Prometheus text (daemon/metrics.c) rendered from a
 * struct met_src built here, with no daemon: a real DRAM pool, index,
 * namespace table and lease table, the counters, and the tiers that are
 * off (no NVMe, no GPU data path, no events, a peer tier context with no
 * cluster). Each series is checked for the value the parts hold, the
 * hits counted through metrics_hits land on their namespace (or on the
 * unknown-namespace series), and metrics.ns_names = 0 hides the names.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "config.h"
#include "dram.h"
#include "index.h"
#include "lease.h"
#include "log.h"
#include "metrics.h"
#include "ns.h"
#include "peer/cluster.h"

#define POOL (1u << 20)
#define CH 4096u

static char pool_path[96];

struct parts {
    struct kvt_config cfg;
    struct met_core met;
    struct counters st;
    struct ns_table ns;
    struct idx ix;
    struct lease_table leases;
    struct dram *pool;
    struct cl_ctx clx; /* no cluster: the peer tier's counters are zeros */
    struct met_src src;
};

static void no_release(void *arg, uint8_t kind, uint32_t slot)
{
    (void)arg, (void)kind, (void)slot;
}

static struct parts *parts_open(void)
{
    char err[256] = "";
    struct parts *p = calloc(1, sizeof *p);
    assert_non_null(p);
    config_defaults(&p->cfg);
    struct dram_opts o = {pool_path, POOL, 0600, NULL, 0, -1};
    assert_int_equal(dram_open(&o, &p->pool, err, sizeof err), KVT_OK);
    assert_int_equal(idx_init(&p->ix, POOL / DRAM_UNIT), 0);
    p->ns.idx = &p->ix;
    lease_init(&p->leases, no_release, NULL);
    p->src = (struct met_src){.cfg = &p->cfg, .met = &p->met, .st = &p->st,
                              .ns = &p->ns, .idx = &p->ix, .leases = &p->leases,
                              .dram = p->pool, .clx = &p->clx};
    return p;
}

static void parts_close(struct parts *p)
{
    lease_drop_all(&p->leases);
    idx_destroy(&p->ix);
    ns_free(&p->ns);
    dram_close(p->pool, 1);
    free(p);
}

/* A committed DRAM chunk of namespace ns, counted as the core counts. */
static void put(struct parts *p, uint16_t ns, uint8_t n)
{
    struct tier_loc loc;
    kvt_key k;
    memset(&k, n, sizeof k);
    assert_int_equal(p->pool->tier.ops->alloc(&p->pool->tier, CH, &loc), KVT_OK);
    uint32_t slot = idx_insert(&p->ix, ns, &k);
    assert_int_not_equal(slot, IDX_NONE);
    idx_at(&p->ix, slot)->blk = loc.h;
    idx_at(&p->ix, slot)->size = CH;
    idx_commit(&p->ix, slot, IDX_NONE, 0);
    p->ns.v[ns].chunks++;
    p->ns.v[ns].bytes += CH;
    p->st.puts++;
    p->st.bytes_in += CH;
}

/* The text, NUL-terminated, for strstr. */
static char *render(const struct parts *p)
{
    size_t len = 0;
    char *t = metrics_render(&p->src, &len);
    assert_non_null(t);
    assert_true(len > 0);
    char *s = malloc(len + 1);
    assert_non_null(s);
    memcpy(s, t, len);
    s[len] = '\0';
    free(t);
    return s;
}

/* The line "series value" is in text. */
static void has(const char *text, const char *line)
{
    char want[256];
    snprintf(want, sizeof want, "\n%s\n", line);
    if (!strstr(text, want)) fail_msg("no line '%s' in the metrics", line);
}

static void test_render_from_parts(void **state)
{
    (void)state;
    struct parts *p = parts_open();
    uint16_t a = ns_intern(&p->ns, "tenant-a");
    put(p, a, 1);
    put(p, a, 2);
    put(p, a, 3);
    metrics_hits(&p->ns, &p->met, a, HIT_LOOKUP, 3, 1, 3 * CH);
    metrics_hits(&p->ns, &p->met, a, HIT_GET, 2, 0, 2 * CH);
    metrics_hits(&p->ns, &p->met, NS_NONE, HIT_GET, 0, 5, 0);
    lease_new(&p->leases, 9, LEASE_READ, 1, 1000);
    lease_new(&p->leases, 9, LEASE_WRITE, 1, 1000);
    lease_new(&p->leases, 10, LEASE_WRITE, 1, 1000);
    p->st.bytes_out = 12345;
    p->met.reloads_ok = 2;
    p->src.n_pipes = 4;
    p->src.draining = 1;
    p->src.adopted = 7;
    p->src.uptime_ms = 2500;

    char *t = render(p);
    has(t, "kvtier_clients 4");
    has(t, "kvtier_draining 1");
    has(t, "kvtier_uptime_seconds 2.500");
    has(t, "kvtier_adopted_chunks 7");
    has(t, "kvtier_config_reloads_total{result=\"ok\"} 2");
    has(t, "kvtier_tier_chunks{tier=\"dram\"} 3");
    has(t, "kvtier_puts_total 3");
    has(t, "kvtier_namespace_chunks{ns=\"tenant-a\"} 3");
    has(t, "kvtier_namespace_bytes{ns=\"tenant-a\"} 12288");
    has(t, "kvtier_hit_chunks_total{ns=\"tenant-a\",op=\"lookup\",tier=\"dram\"} 3");
    has(t, "kvtier_hit_chunks_total{ns=\"tenant-a\",op=\"get\",tier=\"dram\"} 2");
    has(t, "kvtier_hit_bytes_total{ns=\"tenant-a\",op=\"get\",tier=\"dram\"} 8192");
    has(t, "kvtier_miss_chunks_total{ns=\"tenant-a\",op=\"lookup\"} 1");
    has(t, "kvtier_miss_chunks_total{op=\"get\"} 5");
    has(t, "kvtier_leases{kind=\"read\"} 1");
    has(t, "kvtier_leases{kind=\"write\"} 2");
    has(t, "kvtier_cluster_insecure 0");
    /* Tiers that are off have no rows. */
    assert_null(strstr(t, "tier=\"nvme\""));
    assert_null(strstr(t, "tier=\"hbm\""));
    free(t);
    parts_close(p);
}

static void test_ns_names_hidden(void **state)
{
    (void)state;
    struct parts *p = parts_open();
    p->cfg.metrics_ns_names = 0;
    uint16_t a = ns_intern(&p->ns, "secret/tenant");
    put(p, a, 1);
    char *t = render(p);
    assert_null(strstr(t, "secret/tenant"));
    assert_non_null(strstr(t, "kvtier_namespace_chunks{ns=\"h-"));
    free(t);
    parts_close(p);
}

int main(void)
{
    snprintf(pool_path, sizeof pool_path, "/dev/shm/kvt-metrics-%d.pool", (int)getpid());
    log_set_level(LOG_ERROR);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_render_from_parts),
        cmocka_unit_test(test_ns_names_hidden),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
