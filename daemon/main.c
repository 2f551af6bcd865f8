/*
 * main.c -- kvtierd: settings, start-up, the core loop, shutdown.
 *
 * Design (DESIGN §6): the core thread runs one epoll loop over the
 * server's eventfd (requests and pipe events), a 100 ms timerfd (lease
 * deadlines, eviction slices) and a signalfd (SIGTERM/SIGINT stop, SIGHUP
 * reloads). Start-up takes the socket lock before anything else, so a
 * second daemon on the same socket stops with a clear message and touches
 * nothing; a lock file left by a dead daemon is not locked and is taken
 * over together with its stale socket file.
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

#include "kvtierd.h"
#include "log.h"
#include "server.h"
#include "wire.h"

#define TICK_MS 100

uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static void usage(FILE *f)
{
    fprintf(f,
            "usage: kvtierd [--config FILE] [--KEY VALUE]...\n"
            "  --config FILE     INI file (see --print-config for every key)\n"
            "  --KEY VALUE       set a key, e.g. --pool-bytes 4G, --dram.low_watermark 0.8\n"
            "  --print-config    print every key with its default and exit\n"
            "  --version         print the version and exit\n"
            "Without --config the embedded defaults apply.\n");
}

/* First pass finds --config, second applies flags over the file. */
static int parse_args(int argc, char **argv, struct kvt_config *c)
{
    char err[512];
    config_defaults(c);
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            usage(stdout);
            exit(0);
        }
        if (strcmp(argv[i], "--version") == 0) {
            printf("kvtierd %s (protocol %d)\n", KVT_VERSION, KVT_PROTO_VERSION);
            exit(0);
        }
        if (strcmp(argv[i], "--print-config") == 0) {
            config_print_reference(stdout);
            exit(0);
        }
        if (strcmp(argv[i], "--config") == 0 && i + 1 < argc &&
            config_load_file(c, argv[++i], err, sizeof err) != 0) {
            fprintf(stderr, "kvtierd: %s: %s\n", argv[i], err);
            return -1;
        }
    }
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--config") == 0) { i++; continue; }
        const char *a = argv[i], *eq = strchr(a, '=');
        if (strncmp(a, "--", 2) != 0) {
            fprintf(stderr, "kvtierd: unexpected argument '%s'\n", a);
            return -1;
        }
        char key[128];
        const char *val;
        if (eq) {
            snprintf(key, sizeof key, "%.*s", (int)(eq - a - 2), a + 2);
            val = eq + 1;
        } else if (i + 1 < argc) {
            snprintf(key, sizeof key, "%s", a + 2);
            val = argv[++i];
        } else {
            fprintf(stderr, "kvtierd: %s needs a value\n", a);
            return -1;
        }
        if (config_set(c, key, val, err, sizeof err) != 0) {
            fprintf(stderr, "kvtierd: --%s: %s\n", key, err);
            return -1;
        }
    }
    if (config_finish(c, err, sizeof err) != 0) {
        fprintf(stderr, "kvtierd: %s\n", err);
        return -1;
    }
    return 0;
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

static nng_msg *on_request(void *arg, uint32_t pipe, const void *body, size_t len)
{
    struct kvtierd *d = arg;
    Kvtier__Response rsp;
    void *scratch = NULL;
    nng_msg *m = NULL;
    handle_request(d, pipe, body, len, &rsp, &scratch);
    if (wire_pack(&rsp.base, &m) != 0) m = NULL;
    handle_response_free(&rsp, scratch);
    return m;
}

static void on_pipe(void *arg, uint32_t pipe, int added)
{
    struct kvtierd *d = arg;
    if (added) pipe_added(d, pipe);
    else pipe_removed(d, pipe);
}

static int open_tiers(struct kvtierd *d)
{
    char err[512] = "";
    struct dram_opts o = {d->cfg.pool_path, d->cfg.pool_bytes,
                          (unsigned)d->cfg.pool_mode, d->cfg.pool_group};
    if (dram_open(&o, &d->dram, err, sizeof err) != KVT_OK) {
        log_error("dram", "%s", err);
        return -1;
    }
    if (idx_init(&d->idx, d->dram->bytes / DRAM_UNIT) != 0) {
        log_error("index", "out of memory");
        return -1;
    }
    snprintf(d->gpu, sizeof d->gpu, "unavailable: no GPU support loaded");
    return 0;
}

static int open_server(struct kvtierd *d)
{
    char err[512] = "";
    const char *urls[2] = {d->cfg.socket, d->cfg.tcp};
    struct server_opts o = {urls, d->cfg.tcp[0] ? 2 : 1, (uint32_t)d->cfg.contexts,
                            d->cfg.max_msg_bytes, (unsigned)d->cfg.pool_mode};
    if (server_open(&o, &d->srv, err, sizeof err) != 0) {
        log_error("server", "%s", err);
        return -1;
    }
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

static void on_tick(struct kvtierd *d, int tfd)
{
    uint64_t n;
    ssize_t r = read(tfd, &n, sizeof n);
    (void)r;
    lease_expire(d, kvtierd_clock(d));
    store_watermark(d);
}

/* 1 to keep running. */
static int on_signal(struct kvtierd *d, int sfd)
{
    struct signalfd_siginfo si;
    (void)d;
    while (read(sfd, &si, sizeof si) == (ssize_t)sizeof si) {
        if (si.ssi_signo == SIGHUP) {
            log_info("main", "SIGHUP: nothing to reload yet");
            continue;
        }
        log_info("main", "signal %u: shutting down", si.ssi_signo);
        return 0;
    }
    return 1;
}

static int run_loop(struct kvtierd *d)
{
    int tfd, sfd, sv = server_fd(d->srv);
    if (make_fds(&tfd, &sfd) != 0) {
        log_error("main", "timerfd/signalfd: %s", strerror(errno));
        return -1;
    }
    int ep = epoll_create1(EPOLL_CLOEXEC);
    int fds[3] = {sv, tfd, sfd};
    for (int i = 0; i < 3; i++) {
        struct epoll_event ev = {.events = EPOLLIN, .data.fd = fds[i]};
        epoll_ctl(ep, EPOLL_CTL_ADD, fds[i], &ev);
    }
    int running = 1;
    while (running) {
        struct epoll_event evs[4];
        int n = epoll_wait(ep, evs, 4, -1);
        for (int i = 0; i < n && running; i++) {
            if (evs[i].data.fd == sv) server_poll(d->srv, on_request, on_pipe, d);
            else if (evs[i].data.fd == tfd) on_tick(d, tfd);
            else running = on_signal(d, sfd);
        }
        if (d->evict_target) store_watermark(d);
    }
    close(ep);
    close(tfd);
    close(sfd);
    return 0;
}

static void shutdown_all(struct kvtierd *d, int lock_fd)
{
    server_close(d->srv);
    if (d->dram) lease_drop_all(d);
    idx_destroy(&d->idx);
    ns_free(&d->ns);
    dram_close(d->dram, 1);
    free(d->pipes);
    if (lock_fd >= 0) close(lock_fd);
}

int main(int argc, char **argv)
{
    static struct kvtierd d;
    int lock_fd = -1, rc = 1;
    sigset_t set;
    block_signals(&set);
    if (parse_args(argc, argv, &d.cfg) != 0) return 2;
    log_set_level(log_level_parse(d.cfg.log_level));
    d.start_ms = now_ms();
    if (mkdir_p(d.cfg.state_dir) != 0) {
        log_error("main", "cannot create state dir %s: %s", d.cfg.state_dir,
                  strerror(errno));
        return 1;
    }
    if (lock_socket(d.cfg.socket, &lock_fd) != 0) return 1;
    if (open_tiers(&d) != 0 || open_server(&d) != 0) goto out;
    log_info("main", "kvtierd %s ready: pool %s (%llu MiB), %llu contexts, pid %d",
             KVT_VERSION, d.dram->path,
             (unsigned long long)(d.dram->bytes >> 20),
             (unsigned long long)d.cfg.contexts, (int)getpid());
    rc = run_loop(&d) == 0 ? 0 : 1;
out:
    shutdown_all(&d, lock_fd);
    if (rc == 0) log_info("main", "stopped");
    return rc;
}
