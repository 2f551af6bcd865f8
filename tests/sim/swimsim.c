/*
 * swimsim.c -- the membership simulator: the real swim.c on N simulated
 * nodes (simnet.c), under the injections of issue 12.
 *
 *   swimsim                 the short correctness run of `make test`: N=100,
 *                           asserts properties (no false death on a clean
 *                           network, after a partition heals nor in a
 *                           rolling restart, every crash
 *                           detected by every node, join/leave/partition
 *                           heal converge, the index moves at most 1.5x
 *                           what changed owners and resolves >= 99% of
 *                           LOOKUPs in the rolling restart), never times
 *   swimsim --bench [N...]  every scenario at each N (default 10 100 1000),
 *                           one table row each (scripts/run-bench.sh)
 *   --only A,B,...          with --bench: those scenarios alone
 *   --why                   list (stderr) up to 10 views still differing
 *                           from the truth at the end of a scenario
 *   --progress              report (stderr) every 250 nodes started while a
 *                           cluster forms: virtual time, CPU, heap in use
 *   --fresh                 with --bench: form a cluster per scenario (by
 *                           default the scenarios without loss share one
 *                           formation, each run in a forked child: the
 *                           same rows for a fraction of the CPU)
 *   --seed S                another seed (default 1)
 *   --cpu                   charge each handler's measured CPU time to its
 *                           node (a thread-CPU clock read per handler: about
 *                           3x slower here, and not repeatable); without it
 *                           cpu%/n is the whole process's CPU time per node,
 *                           the simulator's own work included
 *
 *   --keys K                chunks per node for the index columns (default
 *                           min(1000, 100000/N); 0: no index)
 *   --set KEY=V[,KEY=V...]  membership settings instead of member.c's
 *                           defaults (probe_ms, probe_timeout_ms,
 *                           suspicion_mult, suspicion_max_mult, indirect_k,
 *                           retransmit_mult, gossip_ms): what a change of
 *                           default would do, measured before making it
 *
 * The global index (simidx.c: the daemon's republish planner, oplan.c, and
 * owners.c) runs on every node from its own view changes once the cluster
 * has formed; rows report what each membership change cost it and, where
 * LOOKUPs were sampled (rolling2s), how many resolved.
 */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <malloc.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "simidx.h"
#include "simnet.h"
#include "swim.h"

#define S(x) ((uint64_t)(x) * 1000000ull) /* seconds -> us */
/* Observation after an injection: halved in the short run of make test. */
static double tail = 1.0;
static int why;         /* --why: list views still wrong at the end */
static int progress;    /* --progress: report while a cluster forms */
#define T(x) ((uint64_t)((double)(x) * tail * 1e6))

struct opts {
    uint64_t seed;
    int cpu;
    double loss;
    uint32_t jitter;
    long keys;          /* -1: the default for N */
    struct mb_config mbc; /* --set: membership settings (0: default) */
};

#define IX_R 2          /* cluster.replicas */
#define IX_FAILURE_MS 3000 /* cluster.failure_timeout_ms */
#define IX_SAMPLES 20   /* LOOKUPs sampled per 100 ms while sampling */

static struct sidx *ix; /* the index of the cluster being run, or NULL */
static int sampling;

static void fwd_change(void *arg, int obs, struct mb_member *m, enum mb_event ev,
                       enum mb_state old)
{
    (void)arg;
    sidx_on_change(ix, obs, m, ev, old);
}

static void fwd_life(void *arg, int idx, int up)
{
    (void)arg;
    sidx_on_life(ix, idx, up);
}

/* Run to t_us in 100 ms steps: the index's passes and samples between. */
static void advance(struct sim *s, uint64_t t_us)
{
    while (sim_now(s) < t_us) {
        uint64_t t = sim_now(s) + 100000;
        sim_run_until(s, t < t_us ? t : t_us);
        if (!ix) continue;
        sidx_step(ix);
        if (sampling) sidx_sample(ix, IX_SAMPLES);
    }
}

struct result {
    const char *name;
    int n;
    double converge_ms;        /* after the last injection; -1: never */
    struct sim_stats st;
    struct sidx_stats ix;
    int has_ix;
    double secs;               /* measured span */
};

/* What forming and running a scenario cost this process (stderr). */
static double cpu_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Peak resident set of this process, MB (0 where /proc has none). */
static double peak_rss_mb(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    double kb = 0;
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "VmHWM:", 6)) kb = atof(line + 6);
    if (f) fclose(f);
    return kb / 1024;
}

static double form_cpu, form_virt, form_heap;

/* --why: up to 10 views that differ from the truth, and what the other
 * side of each pair holds. */
static void list_wrong(struct sim *s, const char *name)
{
    int ob[10], nd[10];
    size_t k = sim_disagree(s) ? sim_diff(s, ob, nd, 10) : 0;
    for (size_t i = 0; i < k; i++) {
        const struct mb_member *m = mb_find(sim_mb(s, ob[i]), (uint32_t)nd[i] + 1);
        const struct mb_member *b =
            sim_up(s, nd[i]) ? mb_find(sim_mb(s, nd[i]), (uint32_t)ob[i] + 1) : NULL;
        fprintf(stderr,
                "swimsim: %s: node %d holds node %d %s (inc %llu, since %.1f s ago);"
                " it is %s%s%s\n",
                name, ob[i], nd[i], m ? mb_state_name(m->state) : "unknown",
                m ? (unsigned long long)m->inc : 0ull,
                m ? ((double)sim_now(s) / 1e3 - (double)m->since_ms) / 1e3 : 0.0,
                sim_up(s, nd[i]) ? "running" : "down", sim_up(s, nd[i]) ? " and holds it " : "",
                sim_up(s, nd[i]) ? (b ? mb_state_name(b->state) : "unknown") : "");
    }
}

/* A fresh cluster of n nodes, formed and converged (views match the
 * truth) plus 5 s; no index yet (attach). */
static struct sim *form(int n, const struct opts *o, double loss)
{
    double c0 = cpu_s();
    struct sim_cfg c = {0};
    c.seed = o->seed * 7919 + (uint64_t)n;
    c.lat_us = 200;
    c.jitter_us = o->jitter ? o->jitter : 300;
    c.loss = loss;
    c.charge_cpu = o->cpu;
    c.ops = &swim_ops;
    c.on_change = fwd_change;
    c.on_life = fwd_life;
    static const uint8_t meta[8] = {1}; /* the daemon's: its boot incarnation */
    c.mbc = o->mbc;
    c.mbc.meta = meta;
    c.mbc.meta_len = sizeof meta;
    struct sim *s = sim_new(&c);
    sim_start(s, -1, -1);
    /* Nodes arrive 20 ms apart, each through a random earlier one. */
    for (int i = 1; i < n; i++) {
        sim_run_until(s, sim_now(s) + 20000);
        sim_start(s, -1, (int)(sim_rand(s) % (uint64_t)i));
        if (progress && i % 250 == 0)
            fprintf(stderr, "swimsim: forming N=%d: %d started, %.1f s virtual, %.1f s CPU,"
                    " heap in use %.0f MB\n", n, i + 1, (double)sim_now(s) / 1e6,
                    cpu_s() - c0, (double)mallinfo2().uordblks / 1e6);
    }
    uint64_t cap = sim_now(s) + S(300);
    for (int sec = 1; sim_disagree(s) != 0 && sim_now(s) < cap; sec++) {
        sim_run_until(s, sim_now(s) + S(1));
        if (why && sec % 10 == 0) {
            fprintf(stderr, "swimsim: forming N=%d: %.1f s virtual, %lld views wrong\n", n,
                    (double)sim_now(s) / 1e6, (long long)sim_disagree(s));
            list_wrong(s, "forming");
        }
    }
    form_virt = (double)sim_now(s) / 1e6;
    sim_run_until(s, sim_now(s) + S(5));
    form_cpu = cpu_s() - c0;
    form_heap = (double)mallinfo2().uordblks / 1e6;
    return s;
}

/* Attach the index to a formed cluster and zero the counters. */
static void attach(struct sim *s, int n, const struct opts *o)
{
    long k = o->keys >= 0 ? o->keys : 100000 / n < 1000 ? 100000 / n : 1000;
    if (k > 0) ix = sidx_new(s, IX_R, (uint32_t)k, IX_FAILURE_MS);
    sim_reset_stats(s);
}

static int random_up(struct sim *s, int not)
{
    size_t n = sim_nodes(s);
    for (;;) {
        int i = (int)(sim_rand(s) % n);
        if (i != not && sim_up(s, i)) return i;
    }
}

/* Run to t_end; converge_ms = time from `since` to the last convergence. */
static void finish(struct sim *s, struct result *r, uint64_t t0, uint64_t since, uint64_t t_end)
{
    advance(s, t_end);
    uint64_t c = sim_converged_at(s);
    if (why) list_wrong(s, r->name);
    r->converge_ms = sim_disagree(s) == 0 ? (c > since ? (double)(c - since) / 1000.0 : 0) : -1;
    sim_stats(s, &r->st);
    if (ix) sidx_stats(ix, &r->ix);
    r->has_ix = ix != NULL;
    r->secs = (double)(t_end - t0) / 1e6;
}

static void sc_clean(struct sim *s, struct result *r)
{
    uint64_t t0 = sim_now(s);
    finish(s, r, t0, t0, t0 + T(60));
}

static void sc_slow_link(struct sim *s, struct result *r)
{
    uint64_t t0 = sim_now(s);
    sim_slow_link(s, 1, 2, 300000, 0.30);
    finish(s, r, t0, t0, t0 + T(60));
}

static void sc_pause(struct sim *s, struct result *r, uint32_t ms)
{
    uint64_t t0 = sim_now(s);
    sim_pause(s, 3, ms);
    finish(s, r, t0, t0 + (uint64_t)ms * 1000, t0 + T(60));
}

static void sc_partition(struct sim *s, struct result *r)
{
    size_t n = sim_nodes(s);
    int *g = calloc(n, sizeof *g);
    for (size_t i = 0; i < n; i++) g[i] = i >= n / 2;
    uint64_t t0 = sim_now(s);
    sim_partition(s, g, 1);
    advance(s, t0 + S(30));
    uint64_t heal = sim_now(s);
    sim_partition(s, g, 0);
    free(g);
    finish(s, r, t0, heal, heal + T(180));
}

static void sc_join(struct sim *s, struct result *r)
{
    uint64_t t0 = sim_now(s);
    sim_start(s, -1, random_up(s, -1));
    finish(s, r, t0, t0, t0 + T(30));
}

static void sc_leave(struct sim *s, struct result *r)
{
    uint64_t t0 = sim_now(s);
    sim_leave(s, random_up(s, 0));
    finish(s, r, t0, t0, t0 + T(30));
}

static void sc_crash(struct sim *s, struct result *r)
{
    int k = (int)sim_nodes(s) / 100;
    uint64_t t0 = sim_now(s);
    for (int i = 0; i < (k ? k : 1); i++) sim_crash(s, random_up(s, 0));
    finish(s, r, t0, t0, t0 + S(90));
}

/* 1% of the nodes per minute crash and are replaced by new ones. */
static void sc_churn(struct sim *s, struct result *r)
{
    size_t n = sim_nodes(s);
    uint64_t t0 = sim_now(s), every = S(60) / (n / 100 ? n / 100 : 1), last = t0;
    for (uint64_t t = t0 + every; t <= t0 + S(180); t += every) {
        advance(s, t);
        sim_crash(s, random_up(s, 0));
        sim_start(s, -1, random_up(s, -1));
        last = t;
    }
    finish(s, r, t0, last, last + S(90));
}

/* One node per 2 s: down, back 1 s later with a new incarnation. */
static void sc_rolling(struct sim *s, struct result *r)
{
    size_t n = sim_nodes(s), k = n < 30 ? n : 30;
    if (tail < 1) k = 10;
    uint64_t t0 = sim_now(s), last = t0;
    sampling = 1;
    for (size_t i = 0; i < k; i++) {
        int v = (int)((i + 1) % n);
        advance(s, t0 + S(2) * i);
        sim_crash(s, v);
        advance(s, sim_now(s) + S(1));
        sim_start(s, v, random_up(s, v));
        last = sim_now(s);
    }
    finish(s, r, t0, last, last + T(90));
    sampling = 0;
}

/* ------------------------------------------------------------- printing */

static void header(void)
{
    printf("%-12s %5s %9s %6s %6s %6s %6s %9s %9s %8s %8s %8s %8s %7s %6s %8s %9s %7s %7s %6s\n",
           "scenario", "N",
           "converge", "false", "byPaus", "ofPaus", "partD", "det50/99", "all50/99", "msg/n/s",
           "B/n/s", "cpu%/n", "susp/n/m", "refut", "ix:chg", "ent/chg",
           "ideal/chg", "msg/chg", "resolv%", "tmo%");
}

/* The index's columns: changes, entries / ideal / messages per change,
 * sampled LOOKUPs resolved and cut by a timeout. */
static void ix_cols(const struct result *r)
{
    const struct sidx_stats *x = &r->ix;
    char e[16] = "-", i[16] = "-", m[16] = "-", res[16] = "-", tmo[16] = "-";
    if (r->has_ix && x->changes) {
        double c = (double)x->changes;
        snprintf(e, sizeof e, "%.0f", (double)x->entries / c);
        snprintf(i, sizeof i, "%.0f", (double)x->ideal / c);
        snprintf(m, sizeof m, "%.1f", (double)x->msgs / c);
    }
    if (r->has_ix && x->lookups) {
        snprintf(res, sizeof res, "%.2f", 100.0 * (double)x->resolved / (double)x->lookups);
        snprintf(tmo, sizeof tmo, "%.2f", 100.0 * (double)x->timeouts / (double)x->lookups);
    }
    printf(" %6llu %8s %9s %7s %7s %6s\n", r->has_ix ? (unsigned long long)x->changes : 0ull, e, i,
           m, res, tmo);
}

static void row(const struct result *r)
{
    const struct sim_stats *st = &r->st;
    double msgs = 0, bytes = 0, ns = (double)st->node_seconds_us / 1e6;
    for (int t = 0; t < MB_NMSGS; t++) {
        msgs += (double)st->msgs_tx[t];
        bytes += (double)st->bytes_tx[t];
    }
    char conv[16], d1[24], d2[24];
    if (r->converge_ms < 0) snprintf(conv, sizeof conv, "never");
    else snprintf(conv, sizeof conv, "%.1fs", r->converge_ms / 1000);
    snprintf(d1, sizeof d1, st->detect_first_p50 < 0 ? "-" : "%.1f/%.1f",
             st->detect_first_p50 / 1000, st->detect_first_p99 / 1000);
    snprintf(d2, sizeof d2, st->detect_all_p50 < 0 ? "-" : "%.1f/%.1f",
             st->detect_all_p50 / 1000, st->detect_all_p99 / 1000);
    printf("%-12s %5d %9s %6llu %6llu %6llu %6llu %9s %9s %8.2f %8.0f %8.4f %8.3f %7llu", r->name,
           r->n, conv, (unsigned long long)st->false_deaths,
           (unsigned long long)st->false_deaths_by_paused,
           (unsigned long long)st->deaths_of_paused,
           (unsigned long long)st->deaths_partitioned, d1, d2, ns > 0 ? msgs / ns : 0,
           ns > 0 ? bytes / ns : 0, ns > 0 ? 100.0 * (double)st->cpu_ns / 1e9 / ns : 0,
           ns > 0 ? (double)st->suspicions / ns * 60 : 0, (unsigned long long)st->refutations);
    ix_cols(r);
    fflush(stdout);
}

typedef void (*scenario_fn)(struct sim *, struct result *);

static void pause2(struct sim *s, struct result *r) { sc_pause(s, r, 2000); }
static void pause5(struct sim *s, struct result *r) { sc_pause(s, r, 5000); }
static void pause10(struct sim *s, struct result *r) { sc_pause(s, r, 10000); }

static const struct {
    const char *name;
    scenario_fn fn;
    double loss;
} scenarios[] = {
    {"clean", sc_clean, 0},      {"loss5%", sc_clean, 0.05},   {"slowlink", sc_slow_link, 0},
    {"pause2s", pause2, 0},      {"pause5s", pause5, 0},       {"pause10s", pause10, 0},
    {"partition", sc_partition, 0}, {"join", sc_join, 0},      {"leave", sc_leave, 0},
    {"crash1%", sc_crash, 0},    {"churn1%/min", sc_churn, 0}, {"rolling2s", sc_rolling, 0},
};

/* One scenario on a fresh cluster, or on `base` (formed without loss,
 * owned by the caller: the caller runs this in a child of fork(), so the
 * cluster is the same for every scenario and formed once). */
static struct result run_one(int idx, int n, const struct opts *o, struct sim *base)
{
    struct result r = {.name = scenarios[idx].name, .n = n};
    double c0 = cpu_s();
    struct sim *s = base ? base : form(n, o, scenarios[idx].loss);
    double fc = base ? 0 : form_cpu;
    attach(s, n, o);
    if (ix) sidx_reset_stats(ix);
    scenarios[idx].fn(s, &r);
    const struct sim_mem *mm = sim_mem(s);
    fprintf(stderr,
            "swimsim: %s N=%d: formed in %.1f s virtual, %.1f s CPU, heap in use %.0f MB;"
            " scenario %.1f s CPU; peak RSS %.0f MB; messages held at most %llu (%.1f MB)\n",
            r.name, n, form_virt, form_cpu, form_heap, cpu_s() - c0 - fc, peak_rss_mb(),
            (unsigned long long)mm->peak_msgs, (double)mm->peak_bytes / 1e6);
    sidx_free(ix);
    ix = NULL;
    if (!base) sim_free(s);
    return r;
}

/* name is one of the comma-separated list. */
static int listed(const char *list, const char *name)
{
    size_t n = strlen(name);
    for (const char *p = list; p && *p; p = strchr(p, ',') ? strchr(p, ',') + 1 : NULL)
        if (!strncmp(p, name, n) && (p[n] == ',' || p[n] == 0)) return 1;
    return 0;
}

static struct result run_one_fresh(int idx, int n, const struct opts *o)
{
    return run_one(idx, n, o, NULL);
}

/* Every selected scenario at size n, one row each, in order. Scenarios
 * without loss share one formation: the cluster is formed once and each
 * runs in a child of fork() (copy-on-write), waited for before the next,
 * which prints what a fresh formation would (same seed, same events) at
 * a fraction of the CPU -- forming is most of a run at N >= 1 000.
 * `fresh` forms a cluster per scenario instead. */
static int bench_size(int n, const struct opts *o, const char *only, int fresh)
{
    struct sim *base = NULL;
    int bad = 0;
    for (size_t i = 0; i < sizeof scenarios / sizeof scenarios[0]; i++) {
        if (only && !listed(only, scenarios[i].name)) continue;
        if (fresh) {
            struct result r = run_one((int)i, n, o, NULL);
            row(&r);
            continue;
        }
        if (!base && scenarios[i].loss == 0) base = form(n, o, 0);
        fflush(stdout);
        fflush(stderr);
        pid_t pid = fork();
        if (pid < 0) {
            perror("swimsim: fork");
            return 1;
        }
        if (pid == 0) {
            struct result r = run_one((int)i, n, o, scenarios[i].loss == 0 ? base : NULL);
            row(&r);
            fflush(stdout);
            fflush(stderr);
            _exit(0);
        }
        int st = 0;
        if (waitpid(pid, &st, 0) < 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
            fprintf(stderr, "swimsim: %s N=%d failed (status %d)\n", scenarios[i].name, n, st);
            bad = 1;
        }
    }
    sim_free(base);
    return bad;
}

/* ---------------------------------------------------------- short test */

static int fails;

#define CHECK(cond, ...) \
    do { \
        if (!(cond)) { \
            printf("FAIL %s: ", r.name); \
            printf(__VA_ARGS__); \
            printf("\n"); \
            fails++; \
        } \
    } while (0)

static int find(const char *name)
{
    for (size_t i = 0; i < sizeof scenarios / sizeof scenarios[0]; i++)
        if (!strcmp(scenarios[i].name, name)) return (int)i;
    abort();
}

/* The index moved at most 1.5 times what had to move. */
static void check_moved(const struct result *rr)
{
    struct result r = *rr;
    CHECK(r.has_ix && r.ix.changes > 0, "the index saw no change");
    CHECK(2 * r.ix.entries <= 3 * r.ix.ideal, "%llu entries moved for %llu keys that changed owners",
          (unsigned long long)r.ix.entries, (unsigned long long)r.ix.ideal);
}

static int short_run(const struct opts *o)
{
    const int n = 100;
    tail = 0.5;
    header();
    struct result r = run_one_fresh(find("clean"), n, o);
    row(&r);
    CHECK(r.st.false_deaths == 0, "%llu false deaths on a clean network",
          (unsigned long long)r.st.false_deaths);
    CHECK(r.converge_ms >= 0, "views differ from the truth");

    r = run_one_fresh(find("crash1%"), n, o);
    row(&r);
    CHECK(r.st.crashes_detected == r.st.crashes, "%llu of %llu crashes detected",
          (unsigned long long)r.st.crashes_detected, (unsigned long long)r.st.crashes);
    CHECK(r.converge_ms >= 0, "some node still holds a crashed node live");
    CHECK(r.st.false_deaths == 0, "false deaths");
    check_moved(&r);

    r = run_one_fresh(find("pause5s"), n, o);
    row(&r);
    CHECK(r.st.false_deaths == 0, "a paused node caused %llu false deaths",
          (unsigned long long)r.st.false_deaths);
    CHECK(r.converge_ms >= 0, "no convergence after the pause");

    r = run_one_fresh(find("partition"), n, o);
    row(&r);
    CHECK(r.converge_ms >= 0, "the healed partition did not converge");
    CHECK(r.st.false_deaths == 0, "%llu false deaths after the heal",
          (unsigned long long)r.st.false_deaths);

    r = run_one_fresh(find("join"), n, o);
    row(&r);
    CHECK(r.converge_ms >= 0, "the join did not converge");
    check_moved(&r);
    r = run_one_fresh(find("leave"), n, o);
    row(&r);
    CHECK(r.converge_ms >= 0, "the leave did not converge");
    CHECK(r.st.left_as_dead == 0, "a node that left was declared dead");
    check_moved(&r);

    r = run_one_fresh(find("rolling2s"), n, o);
    row(&r);
    CHECK(r.converge_ms >= 0, "the rolling restart did not converge");
    CHECK(r.st.false_deaths == 0, "%llu running members declared dead in the rolling restart",
          (unsigned long long)r.st.false_deaths);
    check_moved(&r);
    CHECK(r.ix.lookups > 0 && 100 * r.ix.resolved >= 99 * r.ix.lookups,
          "%llu of %llu LOOKUPs resolved during the rolling restart",
          (unsigned long long)r.ix.resolved, (unsigned long long)r.ix.lookups);
    printf("%s\n", fails ? "swimsim: FAILED" : "swimsim: all properties hold");
    return fails ? 1 : 0;
}

/* --set's list into o->mbc; 0 if every key is known. */
static int set_cfg(struct opts *o, const char *list)
{
    static const struct {
        const char *key;
        size_t off;
    } keys[] = {
#define K(f) {#f, offsetof(struct mb_config, f)}
        K(probe_ms), K(probe_timeout_ms), K(suspicion_mult), K(suspicion_max_mult),
        K(indirect_k), K(retransmit_mult), K(gossip_ms),
#undef K
    };
    for (const char *p = list; p && *p; p = strchr(p, ',') ? strchr(p, ',') + 1 : NULL) {
        const char *eq = strchr(p, '=');
        size_t i = 0, len = eq ? (size_t)(eq - p) : 0;
        while (i < sizeof keys / sizeof keys[0] &&
               (strlen(keys[i].key) != len || strncmp(keys[i].key, p, len)))
            i++;
        if (!eq || i == sizeof keys / sizeof keys[0]) return -1;
        uint32_t v = (uint32_t)strtoul(eq + 1, NULL, 10);
        memcpy((char *)&o->mbc + keys[i].off, &v, sizeof v);
    }
    return 0;
}

int main(int argc, char **argv)
{
    struct opts o = {1, 0, 0, 0, -1, {0}};
    int bench = 0, fresh = 0, sizes[16], ns = 0;
    const char *only = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--bench")) bench = 1;
        else if (!strcmp(argv[i], "--cpu")) o.cpu = 1;
        else if (!strcmp(argv[i], "--fresh")) fresh = 1;
        else if (!strcmp(argv[i], "--why")) why = 1;
        else if (!strcmp(argv[i], "--progress")) progress = 1;
        else if (!strcmp(argv[i], "--seed") && i + 1 < argc) o.seed = strtoull(argv[++i], NULL, 10);
        else if (!strcmp(argv[i], "--only") && i + 1 < argc) only = argv[++i];
        else if (!strcmp(argv[i], "--keys") && i + 1 < argc) o.keys = atol(argv[++i]);
        else if (!strcmp(argv[i], "--set") && i + 1 < argc && !set_cfg(&o, argv[i + 1])) i++;
        else if (ns < 16 && atoi(argv[i]) > 1) sizes[ns++] = atoi(argv[i]);
        else {
            fprintf(stderr, "usage: swimsim [--bench [--only A,B,...] [N...]] [--seed S] [--cpu] [--keys K] [--set KEY=V,...] [--fresh] [--why] [--progress]\n");
            return 2;
        }
    }
    if (!bench) return short_run(&o);
    if (!ns) {
        sizes[ns++] = 10;
        sizes[ns++] = 100;
        sizes[ns++] = 1000;
    }
    printf("swimsim --bench: seed %llu, latency 200-500 us, %s; converge = after the"
           " last injection; det = crash detection s (first node / every node)\n",
           (unsigned long long)o.seed,
           o.cpu ? "handler CPU charged" : "cpu = process CPU time (simulator included)");
    header();
    int bad = 0;
    for (int k = 0; k < ns; k++) bad |= bench_size(sizes[k], &o, only, fresh);
    return bad;
}
