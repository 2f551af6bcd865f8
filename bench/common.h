/*
 * common.h -- what every bench shares: clocks, statistics, keys, buffers,
 * and the servers a bench starts for itself (kvtierd, a bare nng echo).
 *
 * Design: the machines that run these are shared and noisy, so no bench
 * asserts a speed; each figure is a ratio against a baseline measured in
 * the same run, and the two are measured in alternating rounds so that a
 * burst of noise hits both. A bench starts its own servers with fork+exec
 * (never a fork without exec once nng's threads exist), each with a unique
 * socket in a mkdtemp directory and a unique pool file in /dev/shm. Every
 * child is registered: a normal exit or bench_die() SIGTERMs it and removes
 * its files, and PR_SET_PDEATHSIG covers a bench that crashes. Workers of
 * a bench are the bench binary itself, re-executed with a mode argument.
 *
 * Each bench is one translation unit, so everything here is static inline;
 * the registry is a function-local static. Exit status: 0 when the bench
 * ran (a missed target is reported, not failed), 1 when it could not run
 * or saw wrong bytes, 77 when the machine lacks something (skipped).
 */
#ifndef KVT_BENCH_COMMON_H
#define KVT_BENCH_COMMON_H

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <nng/nng.h>
#include <nng/protocol/reqrep0/rep.h>
#include <nng/protocol/reqrep0/req.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "kvtier.h"
#include "kvtier.pb-c.h"

#define BENCH_SKIP 77
#define BENCH_MAX_CHILDREN 16

/* ------------------------------------------------------------ clock -- */

static inline uint64_t bench_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static inline void bench_sleep_ms(unsigned ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Sleep until the monotonic clock reads t (ns); at once if it has. */
static inline void bench_sleep_until(uint64_t t)
{
    struct timespec ts = {(time_t)(t / 1000000000ull), (long)(t % 1000000000ull)};
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
        ;
}

/* ------------------------------------------------- children, cleanup -- */

struct bench_child {
    pid_t pid;
    char dir[128];  /* removed with its files at cleanup, "" for none */
    char pool[128]; /* unlinked at cleanup, "" for none */
    char log[192];  /* shown if the bench fails */
};

struct bench_reg {
    struct bench_child c[BENCH_MAX_CHILDREN];
    int n, failed, hooked;
};

static inline struct bench_reg *bench_reg(void)
{
    static struct bench_reg r;
    return &r;
}

static inline void bench_rm_dir(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, ".."))
            unlinkat(dirfd(d), e->d_name, 0);
    closedir(d);
    rmdir(dir);
}

static inline void bench_show_log(const char *path)
{
    FILE *f = path[0] ? fopen(path, "r") : NULL;
    if (!f) return;
    char line[512];
    fprintf(stderr, "---- %s\n", path);
    while (fgets(line, sizeof line, f)) fputs(line, stderr);
    fclose(f);
}

/* SIGTERM, wait up to 5 s, then SIGKILL. Returns the wait status. */
static inline int bench_reap(pid_t pid)
{
    int st = 0;
    kill(pid, SIGTERM);
    for (int i = 0; i < 500; i++) {
        pid_t w = waitpid(pid, &st, WNOHANG);
        if (w == pid) return st;
        if (w < 0) return 0; /* not ours any more: nothing to judge */
        bench_sleep_ms(10);
    }
    kill(pid, SIGKILL);
    waitpid(pid, &st, 0);
    return st;
}

/* 1 if a child stopped by SIGTERM ended the way it should: exit 0, or
 * killed by that SIGTERM. */
static inline int bench_clean_end(int st)
{
    return (WIFEXITED(st) && WEXITSTATUS(st) == 0) ||
           (WIFSIGNALED(st) && WTERMSIG(st) == SIGTERM);
}

/* Stop, show the log if anything went wrong, remove its files. Returns
 * 1 if it ended cleanly. */
static inline int bench_child_stop(struct bench_child *c)
{
    int ok = 1;
    if (c->pid > 0) ok = bench_clean_end(bench_reap(c->pid));
    if (bench_reg()->failed || !ok) bench_show_log(c->log);
    if (c->pool[0]) unlink(c->pool);
    if (c->dir[0]) bench_rm_dir(c->dir);
    memset(c, 0, sizeof *c);
    return ok;
}

static inline void bench_cleanup(void)
{
    struct bench_reg *r = bench_reg();
    for (int i = r->n - 1; i >= 0; i--) bench_child_stop(&r->c[i]);
    r->n = 0;
}

static inline void bench_on_signal(int sig)
{
    (void)sig;
    bench_reg()->failed = 1;
    exit(1); /* runs bench_cleanup; good enough for a bench */
}

static inline struct bench_child *bench_track(void)
{
    struct bench_reg *r = bench_reg();
    if (!r->hooked) {
        atexit(bench_cleanup);
        signal(SIGINT, bench_on_signal);
        signal(SIGTERM, bench_on_signal);
        signal(SIGPIPE, SIG_IGN);
        r->hooked = 1;
    }
    if (r->n == BENCH_MAX_CHILDREN) abort();
    struct bench_child *c = &r->c[r->n++];
    memset(c, 0, sizeof *c);
    return c;
}

static inline void bench_die(const char *fmt, ...)
    __attribute__((noreturn, format(printf, 1, 2)));
static inline void bench_die(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "%s: FAIL: ", program_invocation_short_name);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    bench_reg()->failed = 1;
    exit(1);
}

#define BENCH_KVT(c, call)                                                  \
    do {                                                                    \
        kvt_err e_ = (call);                                                \
        if (e_ != KVT_OK)                                                   \
            bench_die("%s:%d: %s: %s (%s)", __FILE__, __LINE__, #call,      \
                      kvt_strerror(e_), kvt_last_error(c));                 \
    } while (0)

/* A private directory for sockets and logs. */
static inline void bench_mkdtemp(char *out, size_t len)
{
    snprintf(out, len, "/tmp/kvtbench.XXXXXX");
    if (!mkdtemp(out)) bench_die("mkdtemp: %s", strerror(errno));
}

/* fork + exec path with argv, stdout and stderr to log ("" keeps the
 * bench's). Only async-signal-safe calls run between fork and exec. */
static inline pid_t bench_spawn(const char *path, char *const argv[], const char *log)
{
    pid_t parent = getpid(), pid = fork();
    if (pid < 0) bench_die("fork: %s", strerror(errno));
    if (pid > 0) return pid;
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent) _exit(1);
    if (log && log[0]) {
        int fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0600);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
            close(fd);
        }
    }
    execv(path, argv);
    _exit(127);
}

/* 1 if the child already exited; it is then reaped and forgotten (its
 * log and files stay for cleanup). */
static inline int bench_child_dead(struct bench_child *c)
{
    int st;
    if (c->pid <= 0) return 1;
    if (waitpid(c->pid, &st, WNOHANG) != c->pid) return 0;
    c->pid = 0;
    return 1;
}

/* ------------------------------------------------------------ kvtierd -- */

struct bench_daemon {
    struct bench_child *ch;
    char url[192];
};

/* Poll kvt_connect until it succeeds (5 s) or the daemon dies. */
static inline kvt_client *bench_daemon_connect(struct bench_daemon *d)
{
    kvt_client *c = NULL;
    for (int i = 0; i < 250; i++) {
        if (kvt_connect(d->url, &c) == KVT_OK) return c;
        if (bench_child_dead(d->ch))
            bench_die("kvtierd exited at start-up (KVTIERD=%s)",
                      getenv("KVTIERD") ? getenv("KVTIERD") : "build/bin/kvtierd");
        bench_sleep_ms(20);
    }
    bench_die("kvtierd did not accept %s within 5 s", d->url);
}

/*
 * Start kvtierd ($KVTIERD, default build/bin/kvtierd) with a pool of
 * pool_bytes ("2G") and return a connected client (caller closes it).
 */
static inline kvt_client *bench_daemon_start(struct bench_daemon *d,
                                             const char *pool_bytes)
{
    const char *bin = getenv("KVTIERD");
    char exe[256], dir[128], pool[128];
    snprintf(exe, sizeof exe, "%s", bin && bin[0] ? bin : "build/bin/kvtierd");
    if (access(exe, X_OK) != 0) bench_die("no kvtierd at %s (set KVTIERD)", exe);
    d->ch = bench_track();
    bench_mkdtemp(dir, sizeof dir);
    snprintf(d->ch->dir, sizeof d->ch->dir, "%s", dir);
    snprintf(pool, sizeof pool, "/dev/shm/kvtbench-%d-%.16s.pool", (int)getpid(),
             dir + strlen("/tmp/kvtbench."));
    snprintf(d->ch->pool, sizeof d->ch->pool, "%s", pool);
    snprintf(d->ch->log, sizeof d->ch->log, "%s/kvtierd.log", dir);
    snprintf(d->url, sizeof d->url, "ipc://%s/kvtierd.sock", dir);
    char *argv[] = {exe, "--socket", d->url, "--state-dir", dir,
                    "--pool-path", pool, "--pool-bytes", (char *)pool_bytes,
                    "--log-level", "warn", NULL};
    d->ch->pid = bench_spawn(exe, argv, d->ch->log);
    return bench_daemon_connect(d);
}

/* Close the client, stop the daemon, and fail if it did not end cleanly
 * (a crash during the bench is a failure even if every call returned). */
static inline void bench_daemon_stop(struct bench_daemon *d, kvt_client *c)
{
    kvt_close(c);
    if (!bench_child_stop(d->ch))
        bench_die("kvtierd did not shut down cleanly (log above)");
}

/* ------------------------------------------------------ bare nng echo -- */

/*
 * The baseline server: one thread, an nng rep0 socket on its own ipc
 * url, answering every request with a fresh message of rep_size bytes
 * (as kvtierd frees the request and packs a new response). Runs in a
 * re-executed copy of the bench until SIGTERM.
 */
static inline int bench_echo_main(const char *url, size_t rep_size)
{
    nng_socket s;
    int rv = nng_rep0_open(&s);
    if (rv == 0) rv = nng_listen(s, url, NULL, 0);
    if (rv != 0) {
        fprintf(stderr, "echo: %s: %s\n", url, nng_strerror(rv));
        return 1;
    }
    for (;;) {
        nng_msg *in, *out;
        if (nng_recvmsg(s, &in, 0) != 0) continue;
        nng_msg_free(in);
        if (nng_msg_alloc(&out, rep_size) != 0) continue;
        memset(nng_msg_body(out), 0x5a, rep_size);
        if (nng_sendmsg(s, out, 0) != 0) nng_msg_free(out);
    }
}

/* If argv asks for the echo server ("--echo URL SIZE"), run it. */
static inline void bench_echo_dispatch(int argc, char **argv)
{
    if (argc == 4 && strcmp(argv[1], "--echo") == 0)
        exit(bench_echo_main(argv[2], strtoull(argv[3], NULL, 10)));
}

/* Start the echo server in its own directory; its url lands in url. */
static inline void bench_echo_start(size_t rep_size, char *url, size_t len)
{
    struct bench_child *c = bench_track();
    char size[32];
    bench_mkdtemp(c->dir, sizeof c->dir);
    snprintf(c->log, sizeof c->log, "%s/echo.log", c->dir);
    snprintf(url, len, "ipc://%s/echo.sock", c->dir);
    snprintf(size, sizeof size, "%zu", rep_size);
    char *argv[] = {program_invocation_name, "--echo", url, size, NULL};
    c->pid = bench_spawn("/proc/self/exe", argv, c->log);
}

/* A req0 socket dialled to url, retried for up to 5 s. */
static inline nng_socket bench_nng_dial(const char *url)
{
    nng_socket s;
    int rv = nng_req0_open(&s);
    if (rv != 0) bench_die("nng_req0_open: %s", nng_strerror(rv));
    nng_socket_set_ms(s, NNG_OPT_REQ_RESENDTIME, NNG_DURATION_INFINITE);
    nng_socket_set_ms(s, NNG_OPT_RECVTIMEO, 10000);
    for (int i = 0; i < 250; i++) {
        if ((rv = nng_dial(s, url, NULL, 0)) == 0) return s;
        bench_sleep_ms(20);
    }
    bench_die("cannot dial %s: %s", url, nng_strerror(rv));
}

/* One bare round trip: req_size bytes (from body) out, the reply back. */
static inline size_t bench_nng_rt(nng_socket s, const void *body, size_t req_size)
{
    nng_msg *m;
    int rv = nng_msg_alloc(&m, req_size);
    if (rv == 0) {
        memcpy(nng_msg_body(m), body, req_size);
        if ((rv = nng_sendmsg(s, m, 0)) != 0) nng_msg_free(m);
    }
    if (rv == 0) rv = nng_recvmsg(s, &m, 0);
    if (rv != 0) bench_die("bare nng round trip: %s", nng_strerror(rv));
    size_t got = nng_msg_len(m);
    nng_msg_free(m);
    return got;
}

/*
 * Packed sizes of a LOOKUP of n keys in ns and of kvtierd's answer when
 * all n are present, so that the bare baseline moves the same bytes.
 */
static inline void bench_lookup_sizes(const char *ns, size_t n, size_t *req,
                                      size_t *rsp)
{
    static uint8_t zero[KVT_KEY_LEN];
    ProtobufCBinaryData *keys = calloc(n, sizeof *keys);
    Kvtier__Tier *tiers = calloc(n, sizeof *tiers);
    if (!keys || !tiers) bench_die("out of memory");
    for (size_t i = 0; i < n; i++) {
        keys[i] = (ProtobufCBinaryData){KVT_KEY_LEN, zero};
        tiers[i] = KVTIER__TIER__TIER_DRAM;
    }
    Kvtier__Lookup lk = KVTIER__LOOKUP__INIT;
    Kvtier__Request q = KVTIER__REQUEST__INIT;
    lk.ns = (char *)ns, lk.n_keys = n, lk.keys = keys;
    q.id = 20000, q.body_case = KVTIER__REQUEST__BODY_LOOKUP, q.lookup = &lk;
    Kvtier__LookupResp lr = KVTIER__LOOKUP_RESP__INIT;
    Kvtier__Response r = KVTIER__RESPONSE__INIT;
    lr.n_present = (uint32_t)n, lr.n_tiers = n, lr.tiers = tiers;
    r.id = 20000, r.body_case = KVTIER__RESPONSE__BODY_LOOKUP, r.lookup = &lr;
    *req = protobuf_c_message_get_packed_size(&q.base);
    *rsp = protobuf_c_message_get_packed_size(&r.base);
    free(keys);
    free(tiers);
}

/* ------------------------------------------------------ keys, buffers -- */

static inline uint64_t bench_mix(uint64_t x)
{
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

/* A pseudo-random key, a pure function of (seed, i): workers rebuild the
 * keys the parent put without being told them. */
static inline kvt_key bench_key(uint64_t seed, uint64_t i)
{
    kvt_key k;
    for (int w = 0; w < 4; w++) {
        uint64_t v = bench_mix(seed * 0x100000001B3ull + i * 4 + (uint64_t)w);
        memcpy(k.b + 8 * w, &v, 8);
    }
    return k;
}

/* Fill n bytes with a pattern that depends on seed. */
static inline void bench_fill(void *p, size_t n, uint64_t seed)
{
    uint8_t *b = p;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t v = bench_mix(seed + i);
        memcpy(b + i, &v, 8);
    }
    for (; i < n; i++) b[i] = (uint8_t)bench_mix(seed + i);
}

/* A page-aligned buffer, written through so that no page fault lands in
 * a timed loop. Never freed before exit is fine for a bench. */
static inline uint8_t *bench_buf(size_t n, uint64_t seed)
{
    size_t al = (n + 4095) & ~(size_t)4095;
    uint8_t *p = aligned_alloc(4096, al ? al : 4096);
    if (!p) bench_die("out of memory for %zu bytes", n);
    bench_fill(p, n, seed);
    return p;
}

/* ------------------------------------------------ kvtier round trip -- */

/*
 * The zero-copy round trip an engine does: put_begin, copy src into the
 * pool with the checksum computed on the way, commit; get, copy the chunk
 * out into dst, release. Returns the checksum the get reported. t, if not
 * NULL, receives 6 timestamps: before put_begin, after it, after the copy
 * in, after commit+get, after the copy out, after release.
 */
static inline uint64_t bench_kvt_rt(kvt_client *c, const char *ns, kvt_key k,
                                    const void *src, void *dst, size_t size,
                                    uint64_t *t)
{
    uint64_t ts[6];
    kvt_lease wl, rl;
    kvt_chunk ch;
    size_t got;
    t = t ? t : ts;
    t[0] = bench_now_ns();
    BENCH_KVT(c, kvt_put_begin(c, ns, &k, &size, 1, NULL, &wl, &ch));
    if (ch.exists) bench_die("fresh key reported as existing");
    t[1] = bench_now_ns();
    uint64_t cs = kvt_copy_checksum(ch.data, src, size);
    t[2] = bench_now_ns();
    BENCH_KVT(c, kvt_put_commit(c, wl, &ch, 1, &cs));
    BENCH_KVT(c, kvt_get(c, ns, &k, 1, &rl, &ch, &got));
    if (got != 1 || ch.size != size)
        bench_die("get of a just-committed chunk: %zu chunks, %zu bytes", got, ch.size);
    t[3] = bench_now_ns();
    memcpy(dst, ch.data, ch.size);
    t[4] = bench_now_ns();
    BENCH_KVT(c, kvt_release(c, rl));
    t[5] = bench_now_ns();
    return ch.checksum;
}

/*
 * Write the whole pool once (1.2x pool_bytes in 2 MiB round trips, keys
 * (seed, 0..)) so that every page exists and is mapped in this client
 * before anything is timed. Returns how many keys it used.
 */
static inline uint64_t bench_kvt_warm(kvt_client *c, const char *ns, uint64_t seed,
                                      uint64_t pool_bytes, const void *src, void *dst)
{
    size_t sz = 2u << 20;
    uint64_t n = pool_bytes / sz * 6 / 5;
    for (uint64_t i = 0; i < n; i++)
        bench_kvt_rt(c, ns, bench_key(seed, i), src, dst, sz, NULL);
    return n;
}

/* ---------------------------------------------------------- statistics -- */

static inline int bench_cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The p-quantile (0..1) of v[0..n); sorts v. */
static inline double bench_quantile(double *v, size_t n, double p)
{
    if (n == 0) return 0;
    qsort(v, n, sizeof *v, bench_cmp_double);
    size_t i = (size_t)(p * (double)(n - 1) + 0.5);
    return v[i < n ? i : n - 1];
}

static inline const char *bench_verdict(int met)
{
    return met ? "met" : "MISSED";
}

/* "256KiB", "2MiB", "32MiB". */
static inline const char *bench_size_name(size_t n, char *buf, size_t len)
{
    if (n >= (1u << 20) && n % (1u << 20) == 0) snprintf(buf, len, "%zuMiB", n >> 20);
    else if (n >= 1024 && n % 1024 == 0) snprintf(buf, len, "%zuKiB", n >> 10);
    else snprintf(buf, len, "%zuB", n);
    return buf;
}

/* Compiler barrier: the baseline's copies must not be optimised away. */
static inline void bench_clobber(void *p)
{
    __asm__ volatile("" : : "r"(p) : "memory");
}

#endif
