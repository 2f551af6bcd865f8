/*
 * main.c -- kvtierd: settings, start-up, the core loop, reload, shutdown.
 *
 * Design (DESIGN §6): the core thread runs one epoll loop over the
 * server's eventfd (requests and pipe events), the metrics endpoint's
 * eventfd (scrapes, rendered here), the workers' completion queue
 * (workq.c), a 100 ms timerfd (lease deadlines, eviction slices, the
 * drain check, the systemd watchdog) and a signalfd; it sleeps at most
 * until the earliest deadline of a parked request (park.c).
 * Start-up takes the socket lock before anything else, so a second daemon
 * on the same socket stops with a clear message and touches nothing; a
 * lock file left by a dead daemon is not locked and is taken over together
 * with its stale socket file. systemd hears STATUS= while the pool and
 * index load and READY=1 only once requests can be served.
 *
 * SIGHUP rebuilds the whole configuration (defaults, --config file, the
 * same flags) and applies only the keys marked reloadable; a file that
 * does not parse changes nothing. SIGTERM (or SIGINT) starts a drain:
 * requests that finish work already begun (commit, abort, release) and
 * stats are served, everything else is refused with KVT_ECLOSED; once no
 * lease is left and no request was served for DRAIN_QUIET_MS (so the last
 * replies leave the socket), or daemon.drain_timeout_ms has passed
 * (leases left are then cancelled), the daemon flushes and exits 0. A
 * second SIGTERM stops at once.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/file.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

#include "peer/cluster.h"
#include "adopt.h"
#include "events.h"
#include "fault.h"
#include "handlers.h"
#include "kvcache.h"
#include "kvtierd.h"
#include "log.h"
#include "local.h"
#include "metrics_http.h"
#include "notify.h"
#include "nvme/nvstore.h"
#include "park.h"
#include "pool.h"
#include "server.h"
#include "stopguard.h"
#include "store.h"
#include "tenant.h"
#include "tierhost.h"
#include "wire.h"
#include "workq.h"

#define TICK_MS 100
#define DRAIN_QUIET_MS 200

/* What SIGHUP rebuilds the configuration from. */
static struct {
    const char *file;
    int argc;
    char **argv; /* the --KEY VALUE flags only */
} boot;

static void usage(FILE *f)
{
    fprintf(f,
            "usage: kvtierd [--config FILE] [--KEY VALUE]...\n"
            "  --config FILE     INI file (see --print-config for every key)\n"
            "  --KEY VALUE       set a key, e.g. --pool-bytes 4G, --dram.low_watermark 0.8\n"
            "  --print-config    print every key as an INI reference with the values\n"
            "                    the other arguments give, and exit\n"
            "  --version         print the version and exit\n"
            "Without --config the embedded defaults apply. SIGHUP reloads the\n"
            "file (log level, watermarks, timeouts); SIGTERM drains and stops.\n"
            "See kvtierd(8) and kvtier.conf(5).\n");
}

/* Print the reference for the file and flags as given (paths not yet
 * derived), after checking they would start. */
static int print_config(void)
{
    struct kvt_config c, check;
    char err[512];
    config_defaults(&c);
    if (boot.file && config_load_file(&c, boot.file, err, sizeof err) != 0) {
        fprintf(stderr, "kvtierd: %s: %s\n", boot.file, err);
        return 2;
    }
    if (config_set_flags(&c, boot.argc, boot.argv, err, sizeof err) != 0) {
        fprintf(stderr, "kvtierd: %s\n", err);
        return 2;
    }
    check = c;
    if (config_finish(&check, err, sizeof err) != 0) {
        fprintf(stderr, "kvtierd: %s\n", err);
        return 2;
    }
    config_print_reference(stdout, &c);
    return 0;
}

/* Split argv into the special options and the key flags (kept in boot).
 * Returns -1 to go on, else an exit code. */
static int parse_cmdline(int argc, char **argv)
{
    int print = 0;
    boot.argv = calloc((size_t)argc + 1, sizeof *boot.argv);
    if (!boot.argv) abort();
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) return usage(stdout), 0;
        if (!strcmp(a, "--version")) {
            printf("kvtierd %s (protocol %d)\n", KVT_VERSION, KVT_PROTO_VERSION);
            return 0;
        }
        if (!strcmp(a, "--print-config")) print = 1;
        else if (!strncmp(a, "--config=", 9)) boot.file = a + 9;
        else if (!strcmp(a, "--config") && i + 1 < argc) boot.file = argv[++i];
        else if (!strcmp(a, "--config")) {
            fprintf(stderr, "kvtierd: --config needs a file\n");
            return 2;
        } else boot.argv[boot.argc++] = argv[i];
    }
    return print ? print_config() : -1;
}

static int build_config(struct kvt_config *c)
{
    char err[640];
    if (config_build(c, boot.file, boot.argc, boot.argv, err, sizeof err) == 0)
        return 0;
    fprintf(stderr, "kvtierd: %s\n", err);
    return -1;
}

/* Tell systemd (if it is listening); say once if it cannot hear us. */
static void notify(const char *state)
{
    static int warned;
    char err[256];
    if (notify_send(state, err, sizeof err) < 0 && !warned) {
        warned = 1;
        log_warn("main", "systemd notification failed: %s", err);
    }
}

static int mkdir_p(const char *path)
{
    char buf[CFG_STR_MAX];
    snprintf(buf, sizeof buf, "%s", path);
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/') continue;
        *p = '\0';
        if (mkdir(buf, 0755) != 0 && errno != EEXIST) return -1;
        *p = '/';
    }
    return mkdir(buf, 0755) != 0 && errno != EEXIST ? -1 : 0;
}

/* Lock <socket>.lock; unlink a stale socket file once we hold it. */
static int lock_socket(const char *url, int *lock_fd)
{
    *lock_fd = -1;
    if (strncmp(url, "ipc://", 6) != 0) return 0;
    const char *path = url + 6;
    char lpath[CFG_STR_MAX + 8];
    if (strlen(path) + 6 > sizeof lpath) {
        log_error("main", "socket path too long: %s", path);
        return -1;
    }
    snprintf(lpath, sizeof lpath, "%.*s.lock", CFG_STR_MAX, path);
    int fd = open(lpath, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0) {
        log_error("main", "cannot open %s: %s", lpath, strerror(errno));
        return -1;
    }
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        char pid[32] = "";
        ssize_t n = pread(fd, pid, sizeof pid - 1, 0);
        pid[n > 0 ? n : 0] = '\0';
        log_error("main", "socket %s is in use by another kvtierd (pid %s); "
                  "stop it or choose another --socket", path,
                  pid[0] ? strtok(pid, "\n") : "?");
        close(fd);
        return -1;
    }
    char pid[32];
    int n = snprintf(pid, sizeof pid, "%d\n", (int)getpid());
    if (ftruncate(fd, 0) != 0 || pwrite(fd, pid, (size_t)n, 0) != n)
        log_warn("main", "cannot write pid to %s", lpath);
    if (unlink(path) == 0) log_info("main", "removed stale socket %s", path);
    *lock_fd = fd;
    return 0;
}

/* Bookkeeping after every request, on either channel. */
static void served(struct kvtierd *d, int err, uint64_t t0)
{
    if (!d->draining || err != KVT_ECLOSED) d->last_work_ms = kvtierd_clock(d);
    metrics_request(&d->met, d->req_kind, err, metrics_now_ns() - t0);
}

static nng_msg *on_request(void *arg, uint32_t pipe, const void *body, size_t len)
{
    struct kvtierd *d = arg;
    Kvtier__Response rsp;
    void *scratch = NULL;
    nng_msg *m = NULL;
    uint64_t t0 = metrics_now_ns();
    handle_request(d, pipe, body, len, &rsp, &scratch);
    if (wire_pack(&rsp.base, &m) != 0) m = NULL;
    served(d, rsp.err, t0);
    handle_response_free(&rsp, scratch);
    return m;
}

static void on_pipe(void *arg, uint32_t pipe, int added)
{
    struct kvtierd *d = arg;
    if (added) pipe_added(d, pipe);
    else pipe_removed(d, pipe);
}

/* adopt.c's question "which pool does ns belong in" (pool.c answers). */
static uint32_t adopt_pool_of(void *arg, const char *ns)
{
    return pool_of_ns(arg, ns);
}

static int open_tiers(struct kvtierd *d)
{
    if (pool_open(d) != 0 || pool_open_tenants(d) != 0) return -1;
    if (idx_init(&d->idx, d->dram->bytes / DRAM_UNIT + nvs_index_slots(&d->nvx->cfg)) != 0) {
        log_error("index", "out of memory");
        return -1;
    }
    d->idx.nv_active = nvs_index_slots(&d->nvx->cfg) > 0; /* before any insert */
    tierhost_attach(d);
    d->idx.plain_lru = d->cfg.plain_lru != 0;
    lease_init(&d->leases, handle_lease_release, d);
    d->ns.idx = &d->idx;
    d->adopt.idx = &d->idx;
    d->adopt.ns = &d->ns;
    d->adopt.dram = d->dram;
    d->adopt.pool_of = adopt_pool_of;
    d->adopt.pool_arg = d;
    if (adopt_open(&d->adopt, (int)d->cfg.dram_adopt, d->cfg.state_dir,
                   d->cfg.max_chunk_bytes) != 0)
        return -1; /* the last run's DRAM chunks */
    if (nvs_open(d->nvx) != 0) return -1; /* loads the NVMe index */
    tierhost_order(d);
    return tierhost_kvc_open(d); /* fills d->gpu; refuses hbm_bytes without a GPU */
}

static void on_local_request(void *arg, uint32_t conn, const uint8_t *body,
                             size_t len, Kvtier__Response *rsp, void **scratch)
{
    uint64_t t0 = metrics_now_ns();
    handle_request(arg, conn, body, len, rsp, scratch);
    served(arg, rsp->err, t0);
}

/* daemon.socket_mode, or the pool's mode when it is 0. */
static unsigned socket_mode(const struct kvtierd *d)
{
    return (unsigned)(d->cfg.socket_mode ? d->cfg.socket_mode : d->cfg.pool_mode);
}

/* The fast channel sits beside the ipc socket: <path>.fast. */
static int open_local(struct kvtierd *d)
{
    char err[512] = "";
    if (!d->cfg.local_fast || strncmp(d->cfg.socket, "ipc://", 6) != 0) return 0;
    snprintf(d->local_path, sizeof d->local_path, "%s.fast", d->cfg.socket + 6);
    struct local_opts o = {d->local_path, socket_mode(d),
                           d->cfg.pool_group, d->cfg.max_msg_bytes, on_local_request,
                           handle_response_free, on_pipe, d,
                           (uint32_t)d->cfg.local_max_conns};
    if (local_open(&o, &d->local, err, sizeof err) != 0) {
        log_error("local", "%s", err);
        d->local_path[0] = '\0';
        return -1;
    }
    return 0;
}

static int open_server(struct kvtierd *d)
{
    char err[512] = "";
    const char *urls[2 + CFG_TENANTS_MAX];
    nng_tls_config *tls[2 + CFG_TENANTS_MAX];
    int n = (d->tenants = tenant_open(&d->cfg, err, sizeof err))
                ? tenant_listeners(d->tenants, urls, tls, 2 + CFG_TENANTS_MAX, err,
                                   sizeof err)
                : -1;
    struct server_opts o = {urls, n > 0 ? (size_t)n : 0, (uint32_t)d->cfg.contexts,
                            d->cfg.max_msg_bytes, socket_mode(d), tls};
    if (n < 0 || server_open(&o, &d->srv, err, sizeof err) != 0) {
        log_error("server", "%s", err);
        return -1;
    }
    return 0;
}

/* Parked requests answer through the transports: after they open. */
static int open_park(struct kvtierd *d)
{
    struct park_env env = {d->srv, d->local, (uint32_t)d->cfg.contexts / 2};
    return park_open(&env, &d->park);
}

static int open_metrics(struct kvtierd *d)
{
    char err[640] = "", url[CFG_STR_MAX + 32];
    if (!d->cfg.metrics_listen[0]) {
        log_info("metrics", "disabled (metrics.listen is empty)");
        return 0;
    }
    if (metrics_http_open(d->cfg.metrics_listen, &d->http, url, sizeof url, err,
                          sizeof err) != 0) {
        log_error("metrics", "%s", err);
        return -1;
    }
    log_info("metrics", "serving %s/metrics", url);
    return 0;
}

/* Open everything requests need, telling systemd what is going on. */
static int open_all(struct kvtierd *d)
{
    char st[CFG_STR_MAX + 64], ferr[256];
    if (fault_init(NULL, ferr, sizeof ferr) != 0) { /* KVT_FAULT, tests only */
        log_error("main", "%s", ferr);
        return -1;
    }
    snprintf(st, sizeof st, "STATUS=opening DRAM pool (%llu MiB) and index",
             (unsigned long long)(d->cfg.pool_bytes >> 20));
    notify(st);
    tierhost_init(d); /* the tiers' contexts */
    if (wq_cq_open(&d->cq) != 0 || open_tiers(d) != 0 ||
        ev_open(&d->cfg, &d->idx, &d->ns, &d->ev) != 0)
        return -1;
    notify("STATUS=starting listeners");
    if (open_server(d) != 0 || open_local(d) != 0 || open_park(d) != 0 ||
        open_metrics(d) != 0 || cluster_open(d->clx) != 0)
        return -1;
    tierhost_order(d);
    tenant_attach(d->tenants, d->srv, d->local); /* before the loop serves */
    return 0;
}

/* Block the signals we read from a signalfd, before any thread exists,
 * so nng's threads inherit the mask and never take them. */
static void block_signals(sigset_t *set)
{
    sigemptyset(set);
    sigaddset(set, SIGTERM);
    sigaddset(set, SIGINT);
    sigaddset(set, SIGHUP);
    pthread_sigmask(SIG_BLOCK, set, NULL);
    signal(SIGPIPE, SIG_IGN);
}

static int make_fds(int *tfd, int *sfd)
{
    sigset_t set;
    block_signals(&set);
    *sfd = signalfd(-1, &set, SFD_NONBLOCK | SFD_CLOEXEC);
    *tfd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
    if (*sfd < 0 || *tfd < 0) return -1;
    struct itimerspec it = {{0, TICK_MS * 1000000L}, {0, TICK_MS * 1000000L}};
    return timerfd_settime(*tfd, 0, &it, NULL);
}

struct loop {
    int ep, tfd, sfd, sv, lfd, mfd, nfd, cfd, pfd, wfd;
    uint64_t wd_ms, wd_last; /* systemd watchdog interval, last ping */
    int running;
};

static void begin_drain(struct kvtierd *d, unsigned signo)
{
    char st[96];
    d->draining = 1;
    d->drain_deadline = kvtierd_clock(d) + d->cfg.drain_timeout_ms;
    sg_stage("the drain");
    if (d->cfg.shutdown_timeout_ms)
        sg_arm(d->cfg.drain_timeout_ms + d->cfg.shutdown_timeout_ms);
    log_info("main", "signal %u: draining: new work refused; waiting up to "
             "%llu ms for %llu lease(s)", signo,
             (unsigned long long)d->cfg.drain_timeout_ms,
             (unsigned long long)d->leases.count);
    snprintf(st, sizeof st, "STOPPING=1\nSTATUS=draining %llu lease(s)",
             (unsigned long long)d->leases.count);
    notify(st);
}

/* Work clients began and have not finished: leases, and GPU transfers
 * not yet collected or waited on. */
static uint64_t unfinished(const struct kvtierd *d)
{
    uint64_t n = d->leases.count;
    n += kvc_unfinished(d->kvc);
    return n;
}

/* 1 once the drain is over: nothing left, or out of time (then cancel). */
static int drain_done(struct kvtierd *d)
{
    uint64_t now = kvtierd_clock(d);
    if (unfinished(d) == 0 && now - d->last_work_ms >= DRAIN_QUIET_MS)
        return 1;
    if (now < d->drain_deadline) return 0;
    if (unfinished(d)) {
        log_warn("main", "drain deadline passed: cancelling %llu lease(s); "
                 "%llu GPU transfer(s) left uncollected",
                 (unsigned long long)d->leases.count,
                 (unsigned long long)(unfinished(d) - d->leases.count));
        d->met.leases_cancelled += d->leases.count;
        lease_drop_all(&d->leases);
    }
    return 1;
}

static void on_tick(struct kvtierd *d, struct loop *lp)
{
    uint64_t n;
    ssize_t r = read(lp->tfd, &n, sizeof n);
    (void)r;
    uint64_t now = kvtierd_clock(d);
    d->st.expired_leases += lease_expire(&d->leases, now);
    store_watermark(d);
    nvs_tick(d->nvx);
    adopt_tick(&d->adopt);
    cluster_tick(d->clx);
    if (lp->wd_ms && now - lp->wd_last >= lp->wd_ms / 2) {
        notify("WATCHDOG=1");
        lp->wd_last = now;
    }
}

static void log_change(void *arg, const char *key, const char *from,
                       const char *to, int reloadable)
{
    int *restart = arg;
    if (reloadable) {
        log_info("config", "%s: %s -> %s", key, from[0] ? from : "(empty)",
                 to[0] ? to : "(empty)");
        return;
    }
    (*restart)++;
    log_warn("config", "%s: %s -> %s takes a restart; keeping %s", key,
             from[0] ? from : "(empty)", to[0] ? to : "(empty)",
             from[0] ? from : "(empty)");
}

/* SIGHUP: rebuild the config; apply what may change at run time. */
static void reload(struct kvtierd *d)
{
    struct kvt_config nc;
    char err[640];
    int restart = 0;
    if (!boot.file) {
        log_warn("config", "SIGHUP: started without --config; nothing to reload");
        return;
    }
    notify("RELOADING=1\nSTATUS=reloading configuration");
    if (config_build(&nc, boot.file, boot.argc, boot.argv, err, sizeof err) != 0) {
        d->met.reloads_failed++;
        log_error("config", "reload failed, running settings kept: %s", err);
    } else {
        int n = config_diff(&d->cfg, &nc, log_change, &restart);
        config_apply_reloadable(&d->cfg, &nc);
        tierhost_conf(d);
        log_set_level(log_level_parse(d->cfg.log_level));
        d->met.reloads_ok++;
        log_info("config", "reloaded %s: %d change(s) applied, %d need a restart",
                 boot.file, n - restart, restart);
    }
    notify("READY=1\nSTATUS=serving");
}

/* Read the signalfd: SIGHUP reloads, SIGTERM/SIGINT drains, twice stops. */
static void on_signal(struct kvtierd *d, struct loop *lp)
{
    struct signalfd_siginfo si;
    while (lp->running && read(lp->sfd, &si, sizeof si) == (ssize_t)sizeof si) {
        if (si.ssi_signo == SIGHUP) reload(d);
        else if (!d->draining) begin_drain(d, si.ssi_signo);
        else {
            log_warn("main", "signal %u while draining: stopping now", si.ssi_signo);
            d->met.leases_cancelled += d->leases.count;
            lp->running = 0;
        }
    }
}

static int loop_open(struct kvtierd *d, struct loop *lp)
{
    memset(lp, 0, sizeof *lp);
    lp->tfd = lp->sfd = -1;
    lp->sv = server_fd(d->srv);
    lp->lfd = d->local ? local_fd(d->local) : -1;
    lp->mfd = d->http ? metrics_http_fd(d->http) : -1;
    lp->nfd = nvs_fd(d->nvx);
    lp->cfd = cluster_fd(d->clx);
    lp->pfd = cluster_peer_fd(d->clx);
    lp->wfd = wq_cq_fd(d->cq);
    lp->ep = epoll_create1(EPOLL_CLOEXEC);
    if (make_fds(&lp->tfd, &lp->sfd) != 0 || lp->ep < 0) {
        log_error("main", "epoll/timerfd/signalfd: %s", strerror(errno));
        return -1;
    }
    int fds[9] = {lp->sv, lp->tfd, lp->sfd, lp->lfd, lp->mfd,
                  lp->nfd, lp->cfd, lp->pfd, lp->wfd};
    for (int i = 0; i < 9; i++) {
        if (fds[i] < 0) continue;
        struct epoll_event ev = {.events = EPOLLIN, .data.fd = fds[i]};
        if (epoll_ctl(lp->ep, EPOLL_CTL_ADD, fds[i], &ev) != 0) {
            log_error("main", "epoll_ctl: %s", strerror(errno));
            return -1;
        }
    }
    lp->wd_ms = notify_watchdog_ms();
    lp->running = 1;
    return 0;
}

static void loop_close(struct loop *lp)
{
    if (lp->ep >= 0) close(lp->ep);
    if (lp->tfd >= 0) close(lp->tfd);
    if (lp->sfd >= 0) close(lp->sfd);
}

/* The parts of the daemon the metrics report on (metrics.h), as they are
 * now; then answer the scrapes waiting. */
static void scrape(struct kvtierd *d)
{
    const char *pools[DRAM_POOLS_MAX] = {"default"};
    for (uint32_t i = 0; i < d->cfg.tenants.n; i++)
        if (d->tenant_pool[i]) pools[d->tenant_pool[i]] = d->cfg.tenants.v[i].name;
    struct met_src s = {
        .pool_names = pools,
        .cfg = &d->cfg, .met = &d->met, .st = &d->st, .ns = &d->ns,
        .idx = &d->idx, .leases = &d->leases, .dram = d->dram, .kvc = d->kvc,
        .nvme = d->nvme, .nvx = d->nvx, .clx = d->clx, .ev = d->ev,
        .local = d->local, .uptime_ms = kvtierd_clock(d),
        .adopted = d->adopt.adopted, .n_pipes = d->n_pipes,
        .draining = d->draining,
    };
    metrics_http_poll(d->http, &s);
}

static void dispatch_fd(struct kvtierd *d, struct loop *lp, int fd)
{
    if (fd == lp->sv) server_poll(d->srv, on_request, on_pipe, d);
    else if (fd == lp->tfd) on_tick(d, lp);
    else if (fd == lp->sfd) on_signal(d, lp);
    else if (fd == lp->lfd) local_poll(d->local);
    else if (fd == lp->mfd) scrape(d);
    else if (fd == lp->nfd) nvs_poll(d->nvx);
    else if (fd == lp->cfd) cluster_poll(d->clx);
    else if (fd == lp->pfd) cluster_peer_poll(d->clx);
    else if (fd == lp->wfd) wq_cq_poll(d->cq);
}

static int run_loop(struct kvtierd *d)
{
    struct loop lp;
    int rc = loop_open(d, &lp);
    while (rc == 0 && lp.running) {
        struct epoll_event evs[8];
        int n = epoll_wait(lp.ep, evs, 8, park_wait_ms(d->park, kvtierd_clock(d)));
        if (n < 0 && errno != EINTR) {
            log_error("main", "epoll_wait: %s", strerror(errno));
            rc = -1;
        }
        for (int i = 0; i < n && lp.running; i++) dispatch_fd(d, &lp, evs[i].data.fd);
        if (lp.running) park_run_due(d->park, kvtierd_clock(d));
        if (d->evict_target) store_watermark(d);
        ev_flush(d->ev); /* this iteration's KV events: one message */
        if (d->draining && lp.running && drain_done(d)) lp.running = 0;
    }
    loop_close(&lp);
    return rc;
}

/* What a restart needs written before exit. The pool file (kept with
 * dram.adopt), its journal and the NVMe index are written out in
 * shutdown_all (adopt_close, nvs_close), once leases are gone. */
static int flush_for_restart(struct kvtierd *d)
{
    (void)d;
    return 0;
}

static void shutdown_all(struct kvtierd *d, int lock_fd)
{
    sg_arm(d->cfg.shutdown_timeout_ms); /* armed already when a drain ran */
    sg_stage("NVMe I/O");
    if (d->nvx) nvs_quiesce(d->nvx); /* NVMe I/O done, parked requests answered */
    sg_stage("GPU transfers");
    tierhost_kvc_close(d); /* workers first: they post to the server */
    sg_stage("the cluster");
    int wedged = d->clx ? cluster_close(d->clx) : 0;
    if (fault_hit(FAULT_SHUTDOWN_HANG)) {
        sg_stage("shutdown_hang (KVT_FAULT)");
        for (;;) pause(); /* signals are blocked: forever */
    }
    if (d->nvx) tierhost_order(d); /* the peer tier is gone */
    sg_stage("client transports");
    park_close(d->park); /* what no module answered: dropped, before the transports */
    d->park = NULL;
    metrics_http_close(d->http);
    d->http = NULL;
    local_close(d->local);
    d->local = NULL;
    if (!wedged) { /* else nng_close would wait on nng's stuck threads */
        server_close(d->srv);
        d->srv = NULL;
    } else {
        log_warn("main", "nng is wedged: the client socket is left to the process's exit");
    }
    tenant_close(d->tenants);
    d->tenants = NULL;
    if (d->dram) lease_drop_all(&d->leases);
    sg_stage("the NVMe index");
    if (d->nvx) {
        nvs_close(d->nvx);
        tierhost_order(d); /* the NVMe tier is gone */
    }
    sg_stage("the pool journal");
    adopt_close(&d->adopt); /* the journal the next daemon adopts the pool by */
    sg_stage("memory");
    ev_close(d->ev);
    d->ev = NULL;
    idx_destroy(&d->idx);
    ns_free(&d->ns);
    dram_close(d->dram, !d->cfg.dram_adopt);
    free(d->pipes);
    wq_cq_close(d->cq); /* every queue is closed by now */
    tierhost_close(d);
    if (lock_fd >= 0) close(lock_fd);
    sg_done();
}

int main(int argc, char **argv)
{
    static struct kvtierd d;
    int lock_fd = -1, rc = 1;
    sigset_t set;
    block_signals(&set);
    if ((rc = parse_cmdline(argc, argv)) >= 0) goto done;
    rc = 2;
    if (build_config(&d.cfg) != 0) goto done;
    rc = 1;
    log_set_level(log_level_parse(d.cfg.log_level));
    d.start_ms = now_ms();
    if (mkdir_p(d.cfg.state_dir) != 0) {
        log_error("main", "cannot create state dir %s: %s", d.cfg.state_dir,
                  strerror(errno));
        goto done;
    }
    if (lock_socket(d.cfg.socket, &lock_fd) != 0) goto done;
    if (open_all(&d) != 0) goto out;
    log_info("main", "kvtierd %s ready: pool %s (%llu MiB), %llu contexts, pid %d",
             KVT_VERSION, d.dram->path,
             (unsigned long long)(d.dram->bytes >> 20),
             (unsigned long long)d.cfg.contexts, (int)getpid());
    notify("READY=1\nSTATUS=serving");
    rc = run_loop(&d) == 0 ? 0 : 1;
    if (flush_for_restart(&d) != 0) rc = 1;
out:
    shutdown_all(&d, lock_fd);
    if (rc == 0) log_info("main", "stopped");
done:
    free(boot.argv);
    return rc;
}
