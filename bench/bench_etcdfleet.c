/*
 * bench_etcdfleet.c -- the etcd membership backend at fleet sizes real
 * daemons cannot reach on one machine: N members (tiers/peer/etcd.c, the
 * daemon's code, each with its own worker thread, lease, keepalive and
 * watch stream) in one process against one real etcd on loopback.
 *
 * Design: one owner thread holds every member's table and ticks a member
 * only when the backend asks (its next_tick is due, or its worker woke it
 * through env.wake), as the daemon's core thread does; no daemon, nng or
 * UCX, so N = 1 000 fits where 80-100 real daemons are the limit here.
 * Per N it reports: forming (every member counts N-1 live), idle CPU of
 * this process per member and of etcd, owner ticks per member per second,
 * join (a new member: every view has it), leave (put-left + revoke: every
 * view has it LEFT) and crash (destroyed without leaving: its lease runs
 * out, every view has it DEAD). The baseline, measured in the same run:
 * one raw put seen by one raw watcher (etcd's own notification time), so
 * join and leave read as a multiple of what etcd itself takes.
 *
 *   bench_etcdfleet [N...]     (default 100 300; lease 10 s)
 * Exit 77 when etcd is not installed; 1 when a size could not run.
 */
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "daemon.h"
#include "etcdtest.h"
#include "log.h"
#include "peer/etcd.h"
#include "peer/etcd_client.h"

#define PREFIX "/kvt-bench/"
#define LEASE_MS 10000
#define LIMIT_MS 120000 /* any one wait but forming */
#define FORM_MS 600000
#define IDLE_MS 20000

static struct tetcd E;
static struct mb **M;   /* member i has id i + 1; NULL once gone */
static int NM;          /* slots in M */
static int Wake = -1;
static unsigned long Ticks;
static char Prefix[64];  /* one per size: the last size's leases run out */

static uint64_t env_now(void *ctx) { (void)ctx; return (uint64_t)td_now_ms(); }
static uint64_t env_rand(void *ctx) { (void)ctx; return (uint64_t)random(); }

static int env_send(void *ctx, const char *addr, const void *buf, size_t len)
{
    (void)ctx, (void)addr, (void)buf, (void)len;
    return -1; /* nothing travels between members with etcd */
}

static void env_wake(void *ctx)
{
    uint64_t one = 1;
    (void)ctx;
    ssize_t w = write(Wake, &one, sizeof one);
    (void)w;
}

static struct mb *member(int i)
{
    char addr[64];
    uint8_t meta[8] = {(uint8_t)i, (uint8_t)(i >> 8)}; /* the daemon's 8 bytes */
    snprintf(addr, sizeof addr, "tcp://127.0.0.1:%d", 20000 + i);
    struct mb_config c = {0};
    c.self_id = (uint32_t)i + 1;
    c.self_addr = addr;
    c.meta = meta;
    c.meta_len = sizeof meta;
    c.service_url = E.url;
    c.service_prefix = Prefix;
    c.lease_ms = LEASE_MS;
    c.env = (struct mb_env){NULL, env_send, env_now, env_rand, env_wake};
    const char *why = NULL;
    struct mb *mb = mb_create(&etcd_ops, &c, &why);
    if (!mb || mb_join(mb, NULL, 0) != 0) {
        fprintf(stderr, "bench_etcdfleet: member %d: %s\n", i + 1, why ? why : "join failed");
        exit(1);
    }
    return mb;
}

/* Tick whoever is due, sleep until the next due or a wake; until cond()
 * holds or limit ms pass. Returns the ms taken, or -1 (cond never held;
 * with cond NULL: limit ms, spent). */
static long long pump(int (*cond)(int), int arg, long long limit)
{
    long long t0 = td_now_ms(), now;
    while ((now = td_now_ms()) - t0 < limit) {
        long long due = t0 + limit;
        for (int i = 0; i < NM; i++) {
            if (!M[i]) continue;
            if ((long long)mb_next_tick(M[i]) <= now) {
                mb_tick(M[i], (uint64_t)now);
                Ticks++;
            }
            long long t = (long long)mb_next_tick(M[i]);
            if (t < due) due = t;
        }
        if (cond && cond(arg)) return td_now_ms() - t0;
        struct pollfd p = {.fd = Wake, .events = POLLIN};
        uint64_t v;
        int wait = (int)(due > now ? due - now : 0);
        if (poll(&p, 1, wait < 100 ? wait : 100) == 1) {
            ssize_t r = read(Wake, &v, sizeof v);
            (void)r;
        }
    }
    return cond ? -1 : td_now_ms() - t0;
}

static int all_live(int n)
{
    for (int i = 0; i < NM; i++)
        if (M[i] && (int)mb_live(M[i]) != n) return 0;
    return 1;
}

static enum mb_state state_at(int obs, uint32_t id)
{
    struct mb_member *m = mb_find(M[obs], id);
    return m ? m->state : MB_NSTATES;
}

static enum mb_state Want;
static int all_see(int id) /* every other view has member id in Want */
{
    for (int i = 0; i < NM; i++)
        if (M[i] && i + 1 != id && state_at(i, (uint32_t)id) != Want) return 0;
    return 1;
}

/* Where all_see(id) fails: the views by the state they hold id in. */
static void why_not(int id)
{
    int by[MB_NSTATES + 1] = {0};
    for (int i = 0; i < NM; i++)
        if (M[i] && i + 1 != id) by[state_at(i, (uint32_t)id)]++;
    fprintf(stderr, "member %d, wanted %s:", id, mb_state_name(Want));
    for (int st = 0; st <= MB_NSTATES; st++)
        if (by[st]) fprintf(stderr, " %d %s", by[st], st < MB_NSTATES ? mb_state_name(st) : "absent");
    fprintf(stderr, "\n");
}

static long long cpu_ms_of(const char *statpath)
{
    char b[1024];
    FILE *f = fopen(statpath, "r");
    if (!f) return -1;
    size_t n = fread(b, 1, sizeof b - 1, f);
    fclose(f);
    b[n] = 0;
    char *p = strrchr(b, ')');
    unsigned long long ut = 0, st = 0;
    if (!p || sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut,
                     &st) != 2)
        return -1;
    return (long long)((ut + st) * 1000 / (unsigned long long)sysconf(_SC_CLK_TCK));
}

static long long etcd_cpu_ms(void)
{
    char p[64];
    snprintf(p, sizeof p, "/proc/%d/stat", (int)E.pid);
    return cpu_ms_of(p);
}

/* ---------------------------------------------------- the baseline */

static long long Seen_ms;
static void seen(void *arg, const uint8_t *k, size_t kl, const uint8_t *v, size_t vl, int del,
                 int64_t rev)
{
    (void)arg, (void)k, (void)kl, (void)v, (void)vl, (void)del, (void)rev;
    if (!Seen_ms) Seen_ms = td_now_ms();
}

/* One raw put seen by one raw watcher: median of 5, ms. */
static double raw_notify_ms(void)
{
    char err[256];
    double t[5];
    struct ec *ec = ec_new(E.url, 2000, err, sizeof err), *wc = ec_new(E.url, 2000, err,
                                                                        sizeof err);
    int64_t rev;
    volatile int stop = 0;
    ec_put(ec, "/kvt-bench/raw/x", "a", 1, 0, &rev, err, sizeof err);
    struct ec_watch *w = ec_watch_open(wc, "/kvt-bench/raw/", rev + 1, seen, NULL, err,
                                       sizeof err);
    ec_watch_run(w, &stop, 300, err, sizeof err); /* the stream is up */
    for (int r = 0; r < 5; r++) {
        Seen_ms = 0;
        long long t0 = td_now_ms();
        ec_put(ec, "/kvt-bench/raw/x", "b", 1, 0, &rev, err, sizeof err);
        while (!Seen_ms && td_now_ms() - t0 < 5000) ec_watch_run(w, &stop, 5, err, sizeof err);
        t[r] = Seen_ms ? (double)(Seen_ms - t0) : -1;
    }
    ec_watch_close(w);
    ec_free(ec);
    ec_free(wc);
    for (int i = 1; i < 5; i++)
        for (int j = i; j > 0 && t[j] < t[j - 1]; j--) {
            double x = t[j];
            t[j] = t[j - 1];
            t[j - 1] = x;
        }
    return t[2];
}

/* ---------------------------------------------------------- one size */

static int run(int n)
{
    snprintf(Prefix, sizeof Prefix, PREFIX "n%d/", n);
    NM = n + 1; /* the joiner's slot */
    M = calloc((size_t)NM, sizeof *M);
    Ticks = 0;
    long long t0 = td_now_ms();
    for (int i = 0; i < n; i++) M[i] = member(i);
    long long form = pump(all_live, n - 1, FORM_MS);
    if (form < 0) return fprintf(stderr, "N = %d: did not form in %d s\n", n, FORM_MS / 1000), 1;
    form = td_now_ms() - t0;
    pump(NULL, 0, 3000); /* settle: the keepalives start */

    long long p0 = cpu_ms_of("/proc/self/stat"), e0 = etcd_cpu_ms();
    unsigned long k0 = Ticks;
    long long i0 = td_now_ms();
    pump(NULL, 0, IDLE_MS);
    double secs = (double)(td_now_ms() - i0) / 1000.0;
    double pc = (double)(cpu_ms_of("/proc/self/stat") - p0) / 10.0 / secs;
    double ec = (double)(etcd_cpu_ms() - e0) / 10.0 / secs;
    double ticks = (double)(Ticks - k0) / secs / n;

    M[n] = member(n); /* join */
    Want = MB_ALIVE;
    long long join = pump(all_see, n + 1, LIMIT_MS);
    if (join < 0) why_not(n + 1);
    Want = MB_LEFT; /* leave: member 1 (its put-left and revoke are inside) */
    long long l0 = td_now_ms();
    mb_leave(M[0]);
    long long leave = pump(all_see, 1, LIMIT_MS);
    if (leave >= 0) leave = td_now_ms() - l0;
    else why_not(1);
    mb_destroy(M[0]);
    M[0] = NULL;
    Want = MB_DEAD; /* crash: member 2, its lease runs out */
    mb_destroy(M[1]);
    M[1] = NULL;
    long long crash = pump(all_see, 2, LIMIT_MS);
    if (crash < 0) why_not(2);

    double raw = raw_notify_ms();
    printf("%-6d %7.2f s %9.3f %10.2f %10.2f %8lld ms %8lld ms %8.2f s %9.1f ms %7.1fx %7.1fx\n",
           n, (double)form / 1000, pc / n, ec, ticks, join, leave, (double)crash / 1000, raw,
           raw > 0 ? (double)join / raw : 0, raw > 0 ? (double)leave / raw : 0);
    fflush(stdout);
    for (int i = 0; i < NM; i++) mb_destroy(M[i]); /* workers stop; leases run out */
    free(M);
    M = NULL;
    return join < 0 || leave < 0 || crash < 0;
}

/* A bench stopped by its timeout takes its etcd with it. */
static void on_term(int sig)
{
    if (E.pid > 0) kill(E.pid, SIGKILL);
    signal(sig, SIG_DFL);
    raise(sig);
}

int main(int argc, char **argv)
{
    int sizes[16], ns = 0, rc = 0;
    for (int i = 1; i < argc && ns < 16; i++) sizes[ns++] = atoi(argv[i]);
    if (!ns) sizes[ns++] = 100, sizes[ns++] = 300;
    log_set_level(LOG_ERROR);
    signal(SIGTERM, on_term);
    signal(SIGINT, on_term);
    if (te_init(&E, "etcdfleet") != 0 || te_start(&E, PREFIX) != 0) {
        fprintf(stderr, "bench_etcdfleet: etcd did not start\n");
        return 1;
    }
    Wake = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    printf("etcd membership, N members in one process against one etcd on loopback "
           "(lease %d s)\n", LEASE_MS / 1000);
    printf("%-6s %9s %9s %10s %10s %11s %11s %10s %12s %8s %8s\n", "N", "formed",
           "cpu%/mbr", "etcd cpu%", "ticks/m/s", "join", "leave", "crash", "raw notify",
           "join/raw", "leave/raw");
    for (int i = 0; i < ns; i++) rc |= run(sizes[i]);
    te_cleanup(&E);
    return rc;
}
