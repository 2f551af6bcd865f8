/*
 * daemon.c -- test helpers that run real kvtierd processes (see daemon.h).
 */
#include "daemon.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <grp.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "client_internal.h"
#include "nngclose.h"
#include "tlsconf.h"

#include <nng/protocol/pipeline0/push.h>

int td_free_port(void)
{
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    int fd = socket(AF_INET, SOCK_STREAM, 0), port = -1;
    if (fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
        getsockname(fd, (struct sockaddr *)&a, &len) == 0)
        port = ntohs(a.sin_port);
    if (fd >= 0) close(fd);
    return port;
}

long long td_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static const char *bin(void)
{
    const char *b = getenv("KVTIERD");
    return b && b[0] ? b : "build/bin/kvtierd";
}

int td_init(struct tdaemon *d)
{
    memset(d, 0, sizeof *d);
    const char *base = getenv("KVT_TEST_DIR"); /* where kept logs go */
    snprintf(d->dir, sizeof d->dir, "%s/kvt-test-XXXXXX", base && base[0] ? base : "/tmp");
    if (!mkdtemp(d->dir)) return -1;
    snprintf(d->sock, sizeof d->sock, "%s/kvtierd.sock", d->dir);
    snprintf(d->pool, sizeof d->pool, "/dev/shm/kvt-test-%s.pool", strrchr(d->dir, '-') + 1);
    snprintf(d->log, sizeof d->log, "%s/kvtierd.log", d->dir);
    return 0;
}

pid_t td_spawn(struct tdaemon *d, const char *const *extra)
{
    return td_spawn_fd(d, extra, -1, NULL);
}

/* As systemd hands a service its stored fds: fds 3.. and LISTEN_*
 * naming them for this very process. */
static void pass_listen_fds(const int *fds, const char *const *names, int n)
{
    char pid[32], count[16], all[1024] = "";
    if (n <= 0 || fds[0] < 0) return;
    int high[16];
    for (int i = 0; i < n && i < 16; i++) /* out of the way of 3.. first */
        if ((high[i] = fcntl(fds[i], F_DUPFD, 64)) < 0) _exit(126);
    for (int i = 0; i < n && i < 16; i++) {
        if (dup2(high[i], 3 + i) != 3 + i) _exit(126);
        fcntl(3 + i, F_SETFD, 0);
        close(high[i]);
        snprintf(all + strlen(all), sizeof all - strlen(all), "%s%s", i ? ":" : "",
                 names[i]);
    }
    snprintf(pid, sizeof pid, "%d", (int)getpid());
    snprintf(count, sizeof count, "%d", n);
    setenv("LISTEN_PID", pid, 1);
    setenv("LISTEN_FDS", count, 1);
    setenv("LISTEN_FDNAMES", all, 1);
}

pid_t td_spawn_fd(struct tdaemon *d, const char *const *extra, int fd, const char *name)
{
    const char *names[1] = {name};
    return td_spawn_fds(d, extra, &fd, names, fd >= 0 ? 1 : 0);
}

pid_t td_spawn_fds(struct tdaemon *d, const char *const *extra, const int *fds,
                   const char *const *names, int n_fds)
{
    char url[400];
    snprintf(url, sizeof url, "ipc://%s", d->sock);
    /* Port 0: every test daemon gets a free metrics port of its own. */
    const char *argv[64] = {bin(), "--socket", url, "--state-dir", d->dir,
                            "--pool-path", d->pool, "--pool-bytes", "64M",
                            "--metrics.listen", "127.0.0.1:0"};
    int n = 11;
    for (int i = 0; extra && extra[i] && n < 62; i++) argv[n++] = extra[i];
    argv[n] = NULL;
    pid_t parent = getpid(), pid = fork();
    if (pid == 0) {
        /* A test that dies or fails half-way must not leave daemons. */
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        if (getppid() != parent) _exit(0);
        int lfd = open(d->log, O_WRONLY | O_CREAT | O_APPEND, 0644);
        if (lfd >= 0) dup2(lfd, 2);
        pass_listen_fds(fds, names, n_fds);
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    return pid;
}

int td_start(struct tdaemon *d, const char *const *extra)
{
    return td_start_fd(d, extra, -1, NULL);
}

int td_start_fd(struct tdaemon *d, const char *const *extra, int fd, const char *name)
{
    const char *names[1] = {name};
    return td_start_fds(d, extra, &fd, names, fd >= 0 ? 1 : 0);
}

int td_start_fds(struct tdaemon *d, const char *const *extra, const int *fds,
                 const char *const *names, int n_fds)
{
    if (!d->dir[0] && td_init(d) != 0) return -1;
    d->pid = td_spawn_fds(d, extra, fds, names, n_fds);
    if (d->pid < 0) return -1;
    long long deadline = td_now_ms() + (getenv("KVT_SAN") ? 20000 : 8000);
    while (td_now_ms() < deadline) {
        kvt_client *c;
        if (kvt_connect(d->sock, &c) == KVT_OK) {
            kvt_close(c);
            return 0;
        }
        if (waitpid(d->pid, NULL, WNOHANG) == d->pid) {
            d->pid = 0; /* reaped: never signal that pid again */
            break;
        }
        usleep(20000);
    }
    fprintf(stderr, "td_start: kvtierd did not come up; log %s\n", d->log);
    return -1;
}

int td_wait_exit(pid_t pid, int ms)
{
    long long deadline = td_now_ms() + ms;
    int st;
    while (td_now_ms() < deadline) {
        if (waitpid(pid, &st, WNOHANG) == pid)
            return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        usleep(10000);
    }
    return -1;
}

int td_stop(struct tdaemon *d)
{
    if (d->pid <= 0) return -1;
    kill(d->pid, SIGTERM);
    int rc = td_wait_exit(d->pid, 15000);
    if (rc < 0) td_kill(d);
    d->pid = 0;
    return rc;
}

void td_kill(struct tdaemon *d)
{
    if (d->pid <= 0) return;
    kill(d->pid, SIGKILL);
    waitpid(d->pid, NULL, 0);
    d->pid = 0;
}

void td_cleanup(struct tdaemon *d)
{
    char cmd[400];
    if (d->pid > 0) td_stop(d);
    if (d->pool[0]) { /* and the per-tenant pools beside it, <pool>.<tenant> */
        unlink(d->pool);
        snprintf(cmd, sizeof cmd, "rm -f '%s'.*", d->pool);
        if (system(cmd) != 0) fprintf(stderr, "cannot remove %s.*\n", d->pool);
    }
    if (getenv("KVT_KEEP_LOGS")) return;
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", d->dir);
    if (d->dir[0] && system(cmd) != 0) fprintf(stderr, "cannot remove %s\n", d->dir);
}

kvt_client *td_connect(const struct tdaemon *d)
{
    kvt_client *c = NULL;
    kvt_err e = kvt_connect(d->sock, &c);
    if (e != KVT_OK) {
        fprintf(stderr, "td_connect %s: %s\n", d->sock, kvt_strerror(e));
        abort();
    }
    return c;
}

int td_log_has(const struct tdaemon *d, const char *s)
{
    FILE *f = fopen(d->log, "r");
    char line[2048];
    int found = 0;
    while (f && !found && fgets(line, sizeof line, f)) found = strstr(line, s) != NULL;
    if (f) fclose(f);
    return found;
}

static uint64_t splitmix(uint64_t *x)
{
    uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

void td_fill(void *buf, size_t n, uint64_t seed)
{
    uint8_t *p = buf;
    uint64_t x = seed;
    for (size_t i = 0; i < n; i += 8) {
        uint64_t v = splitmix(&x);
        memcpy(p + i, &v, n - i < 8 ? n - i : 8);
    }
}

kvt_key td_key(uint64_t seed)
{
    kvt_key k;
    td_fill(k.b, sizeof k.b, seed ^ 0x6b657973ull);
    return k;
}

int td_alive(const struct tdaemon *d)
{
    return d->pid > 0 && waitpid(d->pid, NULL, WNOHANG) == 0;
}

void tc_close(nng_socket s)
{
    if (nngc_close_bounded(&s, 1, 3000, 0) != 0)
        fprintf(stderr, "tc_close: libnng did not close a socket within 3 s; left to exit\n");
}

/* ---------------------------------------------------------------- clusters */

void tc_init(struct tcluster *c, int n)
{
    memset(c, 0, sizeof *c);
    c->n = n;
}

/* ------------------------------------------------------------ certificates */

static char certdir[64];

static void rm_certs(void)
{
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", certdir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", certdir);
}

const char *tc_certs(void)
{
    char cmd[256];
    if (certdir[0]) return certdir;
    if (system("openssl version >/dev/null 2>&1") != 0) {
        printf("openssl CLI missing: skipped\n");
        exit(77);
    }
    snprintf(certdir, sizeof certdir, "/tmp/kvt-certs-XXXXXX");
    if (!mkdtemp(certdir)) abort();
    atexit(rm_certs);
    snprintf(cmd, sizeof cmd, "bash tests/lib/mkcerts.sh '%s' 8", certdir);
    if (system(cmd) != 0) {
        fprintf(stderr, "tests/lib/mkcerts.sh failed (run from the source root)\n");
        abort();
    }
    return certdir;
}

int tc_tls_args(const char **argv, const char *name)
{
    static char paths[64][3][128];
    static int next;
    char (*p)[128] = paths[next++ % 64];
    snprintf(p[0], sizeof p[0], "%s/ca.crt", tc_certs());
    snprintf(p[1], sizeof p[1], "%s/%s.crt", tc_certs(), name);
    snprintf(p[2], sizeof p[2], "%s/%s.key", tc_certs(), name);
    argv[0] = "--cluster.tls_ca", argv[1] = p[0];
    argv[2] = "--cluster.tls_cert", argv[3] = p[1];
    argv[4] = "--cluster.tls_key", argv[5] = p[2];
    return 6;
}

/* A client TLS config that presents no certificate. */
static int bare_tls(nng_tls_config **cfg, const char *ca)
{
    int rv = nng_tls_config_alloc(cfg, NNG_TLS_MODE_CLIENT);
    if (rv == 0) rv = nng_tls_config_ca_file(*cfg, ca);
    return rv;
}

int tc_dial(nng_socket *s, const char *url, const char *name, int foreign)
{
    char ca[128], crt[128], key[128], err[256];
    nng_tls_config *cfg = NULL;
    nng_dialer dl;
    int rv = nng_push0_open(s);
    if (rv == 0) rv = nng_dialer_create(&dl, *s, url);
    if (rv != 0 || strncmp(url, "tls+", 4) != 0) return rv ? rv : nng_dialer_start(dl, 0);
    snprintf(ca, sizeof ca, "%s/%s.crt", tc_certs(), foreign ? "foreign-ca" : "ca");
    snprintf(crt, sizeof crt, "%s/%s.crt", tc_certs(), name ? name : "");
    snprintf(key, sizeof key, "%s/%s.key", tc_certs(), name ? name : "");
    struct tlsconf_files f = {ca, crt, key};
    if (name && tlsconf_build(&cfg, 0, &f, NULL, err, sizeof err) != 0) {
        fprintf(stderr, "tc_dial: %s\n", err);
        return NNG_EINVAL;
    }
    if (!name && (rv = bare_tls(&cfg, ca)) != 0) return rv;
    rv = nng_dialer_set_ptr(dl, NNG_OPT_TLS_CONFIG, cfg);
    nng_tls_config_free(cfg);
    return rv ? rv : nng_dialer_start(dl, 0);
}

/* ---------------------------------------------------------------- clusters */

static int start_once(struct tcluster *c, int i, int fail_ms, const char *const *extra)
{
    char id[16], fail[32], cert[32];
    const char *argv[64] = {"--cluster.node_id", id, "--cluster.listen", c->url[i],
                            "--cluster.seeds", i ? c->url[c->seed[i]] : "",
                            "--cluster.heartbeat_ms", "100",
                            "--cluster.failure_timeout_ms", fail,
                            "--cluster.probe_ms", "200", "--cluster.probe_timeout_ms", "100",
                            /* the suspicion timeout the cluster tests were
                               written for (the default is 2) */
                            "--cluster.suspicion_mult", "3"};
    int n = 16;
    snprintf(id, sizeof id, "%d", i + 1);
    snprintf(fail, sizeof fail, "%d", fail_ms);
    snprintf(cert, sizeof cert, "node-%d", i + 1);
    if (c->insecure) {
        argv[n++] = "--cluster.insecure";
        argv[n++] = "1";
    } else {
        n += tc_tls_args(argv + n, c->cert[i] ? c->cert[i] : cert);
    }
    for (int k = 0; extra && extra[k] && n < 62; k++) argv[n++] = extra[k];
    argv[n] = NULL;
    return td_start(&c->d[i], argv);
}

/* The port is picked just before the start, and picked again if another
 * process took it meanwhile (a free port is only free when looked at). */
int tc_start(struct tcluster *c, int i, int fail_ms, const char *const *extra)
{
    for (int tries = 0; tries < 3; tries++) {
        if (tries || !c->url[i][0])
            snprintf(c->url[i], sizeof c->url[i], "%s://127.0.0.1:%d",
                     c->insecure ? "tcp" : "tls+tcp", td_free_port());
        if (start_once(c, i, fail_ms, extra) == 0) {
            if (c->c[i]) kvt_close(c->c[i]); /* a restart: the old one's */
            c->c[i] = td_connect(&c->d[i]);
            return 0;
        }
        int busy = td_log_has(&c->d[i], "Address in use");
        td_kill(&c->d[i]);
        if (!busy) return -1;
    }
    return -1;
}

int tc_stop(struct tcluster *c, int i)
{
    if (c->c[i]) kvt_close(c->c[i]);
    c->c[i] = NULL;
    if (c->d[i].pid <= 0) return 0;
    int rc = td_stop(&c->d[i]);
    if (rc == 0) return 0;
    /* Say why: the exit status (-1: still running after 15 s, then
     * killed) and the end of its log, which is removed at cleanup. */
    char cmd[400];
    fprintf(stderr, "node %d did not stop cleanly (status %d); its log ends:\n", i + 1, rc);
    snprintf(cmd, sizeof cmd, "tail -n 25 '%s' | grep -v 'UCX  ERROR' >&2", c->d[i].log);
    if (system(cmd) != 0) fprintf(stderr, "(no log)\n");
    return -1;
}

int tc_teardown(struct tcluster *c)
{
    int rc = 0;
    for (int i = 0; i < c->n; i++) {
        if (c->d[i].pid > 0) kill(c->d[i].pid, SIGCONT); /* a stopped one */
        if (tc_stop(c, i) != 0) rc = -1;
        td_cleanup(&c->d[i]);
    }
    return rc;
}

/* 1 if node i's view has `alive` live members (with endpoints, if ucx). */
kvt_err tc_peers(kvt_client *c, Kvtier__Response **r)
{
    Kvtier__Peers p = KVTIER__PEERS__INIT;
    Kvtier__Request q = KVTIER__REQUEST__INIT;
    q.body_case = KVTIER__REQUEST__BODY_PEERS;
    q.peers = &p;
    *r = NULL;
    return kvtc_call(c, &q, r);
}

int tc_get_checked(kvt_client *c, const char *ns, uint64_t seed, size_t size,
                   uint32_t deadline_ms)
{
    kvt_key k = td_key(seed);
    ProtobufCBinaryData kb = {KVT_KEY_LEN, k.b};
    Kvtier__Get g = KVTIER__GET__INIT;
    g.ns = (char *)ns, g.keys = &kb, g.n_keys = 1, g.inline_ = 1;
    g.deadline_ms = deadline_ms;
    Kvtier__Request q = KVTIER__REQUEST__INIT;
    q.body_case = KVTIER__REQUEST__BODY_GET;
    q.get = &g;
    Kvtier__Response *r = NULL;
    if (kvtc_call(c, &q, &r) != KVT_OK) return -1;
    int found = r->err == 0 && r->get ? (int)r->get->n_data : -1;
    if (found > 0) {
        uint8_t *want = malloc(size);
        if (!want) abort();
        td_fill(want, size, seed);
        if (r->get->data[0].len != size || memcmp(r->get->data[0].data, want, size) != 0)
            found = -1; /* a wrong byte */
        free(want);
    }
    kvtier__response__free_unpacked(r, NULL);
    return found;
}

uint64_t tc_counter(kvt_client *c, size_t off)
{
    Kvtier__Response *r = NULL;
    kvt_err e = tc_peers(c, &r);
    if (e != KVT_OK || !r->peers) {
        fprintf(stderr, "tc_counter: PEERS failed: %s\n", kvt_strerror(e));
        abort();
    }
    uint64_t v;
    memcpy(&v, (const char *)r->peers + off, sizeof v);
    kvtier__response__free_unpacked(r, NULL);
    return v;
}

kvt_err tc_put(kvt_client *c, const char *ns, uint64_t seed, size_t size)
{
    uint8_t *buf = malloc(size);
    if (!buf) abort();
    kvt_key k = td_key(seed);
    const void *b = buf;
    td_fill(buf, size, seed);
    kvt_err e = kvt_put(c, ns, &k, &b, &size, 1, NULL, NULL);
    free(buf);
    return e;
}

int tc_lookup(kvt_client *c, const char *ns, uint64_t first, uint32_t n, int local_only,
              int *tiers)
{
    ProtobufCBinaryData kb[TC_LOOKUP_MAX];
    kvt_key keys[TC_LOOKUP_MAX];
    if (n == 0 || n > TC_LOOKUP_MAX) return -1;
    for (uint32_t j = 0; j < n; j++) {
        keys[j] = td_key(first + j);
        kb[j] = (ProtobufCBinaryData){KVT_KEY_LEN, keys[j].b};
    }
    Kvtier__Lookup l = KVTIER__LOOKUP__INIT;
    l.ns = (char *)ns, l.keys = kb, l.n_keys = n, l.local_only = local_only;
    Kvtier__Request q = KVTIER__REQUEST__INIT;
    q.body_case = KVTIER__REQUEST__BODY_LOOKUP;
    q.lookup = &l;
    Kvtier__Response *r = NULL;
    if (kvtc_call(c, &q, &r) != KVT_OK) return -1;
    int got = -1;
    if (r->err == 0 && r->lookup && r->lookup->n_tiers == n) {
        got = (int)r->lookup->n_present;
        for (uint32_t j = 0; tiers && j < n; j++) tiers[j] = r->lookup->tiers[j];
    }
    kvtier__response__free_unpacked(r, NULL);
    return got;
}

int tc_found(kvt_client *c, const char *ns, uint64_t seed)
{
    int t;
    if (tc_lookup(c, ns, seed, 1, 0, &t) < 0) return -1;
    return t != KVTIER__TIER__TIER_NONE;
}

int tc_wait_found(kvt_client *c, const char *ns, uint64_t seed, int ms)
{
    for (int t = 0; t * 25 < ms; t++, usleep(25000)) {
        int f = tc_found(c, ns, seed);
        if (f != 0) return f > 0 ? 0 : -1;
    }
    return -1;
}

static int view_ok(struct tcluster *c, int i, int alive, int ucx)
{
    Kvtier__Response *r = NULL;
    if (tc_peers(c->c[i], &r) != KVT_OK || !r->peers) {
        if (r) kvtier__response__free_unpacked(r, NULL);
        return 0;
    }
    int n = 0;
    for (size_t k = 0; k < r->peers->n_peers; k++)
        n += r->peers->peers[k]->state == KVTIER__PEER_STATE__PEER_ALIVE ||
             r->peers->peers[k]->state == KVTIER__PEER_STATE__PEER_SUSPECT; /* live */
    int ok = n == alive && (!ucx || r->peers->peer_tier);
    kvtier__response__free_unpacked(r, NULL);
    return ok;
}

int tc_wait_alive(struct tcluster *c, int i, int alive, int ucx)
{
    for (int t = 0; t < 600; t++, usleep(50000))
        if (view_ok(c, i, alive, ucx)) return 0;
    fprintf(stderr, "node %d: %d live members not seen\n", i + 1, alive);
    return -1;
}

int td_fast_connect(const struct tdaemon *d)
{
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    int n = snprintf(a.sun_path, sizeof a.sun_path, "%s.fast", d->sock);
    if (n <= 0 || (size_t)n >= sizeof a.sun_path) return -1;
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    if (fd < 0) return -1;
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

/* Read one length-framed answer on s into in (at most cap bytes), taking
 * an fd passed beside it; the frame's length, or -1. */
static int read_frame(int s, uint8_t *in, size_t cap, int *fd)
{
    union {
        struct cmsghdr c;
        char b[CMSG_SPACE(sizeof(int))];
    } u;
    size_t have = 0, len = 0;
    while (have < 4 || have < 4 + len) {
        struct iovec iov = {in + have, cap - have};
        struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.b,
                           .msg_controllen = sizeof u.b};
        ssize_t r = recvmsg(s, &m, MSG_CMSG_CLOEXEC);
        if (r <= 0) return -1;
        struct cmsghdr *c = CMSG_FIRSTHDR(&m);
        if (c && c->cmsg_type == SCM_RIGHTS) memcpy(fd, CMSG_DATA(c), sizeof *fd);
        have += (size_t)r;
        if (have >= 4) len = in[0] | (size_t)in[1] << 8 | (size_t)in[2] << 16 | (size_t)in[3] << 24;
        if (have >= 4 && 4 + len > cap) return -1;
    }
    return (int)len;
}

int td_fast_hello(const struct tdaemon *d, Kvtier__Response **r, int *fd)
{
    *r = NULL;
    *fd = -1;
    int s = td_fast_connect(d);
    if (s < 0) return -1;
    Kvtier__Request q = KVTIER__REQUEST__INIT;
    Kvtier__Hello h = KVTIER__HELLO__INIT;
    h.proto_version = KVT_PROTO_VERSION;
    q.id = 1;
    q.body_case = KVTIER__REQUEST__BODY_HELLO;
    q.hello = &h;
    uint8_t out[256], in[4096];
    size_t n = kvtier__request__pack(&q, out + 4);
    for (int i = 0; i < 4; i++) out[i] = (uint8_t)(n >> (8 * i));
    int len = -1;
    if (write(s, out, n + 4) == (ssize_t)(n + 4)) len = read_frame(s, in, sizeof in, fd);
    close(s);
    if (len >= 0) *r = kvtier__response__unpack(NULL, (size_t)len, in + 4);
    return *r ? 0 : -1;
}

int td_notify_socket(const struct tdaemon *d, char *path, size_t len)
{
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    snprintf(path, len, "%.90s/notify", d->dir);
    snprintf(a.sun_path, sizeof a.sun_path, "%.100s", path);
    int s = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (s < 0) return -1;
    if (bind(s, (struct sockaddr *)&a, sizeof a) != 0) {
        close(s);
        return -1;
    }
    return s;
}

int td_notify_recv(int s, char *buf, size_t len, int *fd, long long end)
{
    while (td_now_ms() < end) {
        struct pollfd p = {s, POLLIN, 0};
        if (poll(&p, 1, 100) != 1) continue;
        union {
            struct cmsghdr c;
            char b[CMSG_SPACE(sizeof(int))];
        } u;
        struct iovec iov = {buf, len - 1};
        struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.b,
                           .msg_controllen = sizeof u.b};
        ssize_t r = recvmsg(s, &m, MSG_CMSG_CLOEXEC);
        if (r < 0) continue;
        buf[r] = '\0';
        *fd = -1;
        struct cmsghdr *c = CMSG_FIRSTHDR(&m);
        if (c && c->cmsg_type == SCM_RIGHTS) memcpy(fd, CMSG_DATA(c), sizeof *fd);
        return (int)r;
    }
    return -1;
}

int td_run_self_as(uid_t uid, gid_t gid, int nng, const char *const *argv)
{
    fflush(NULL);
    pid_t p = fork();
    if (p == 0) {
        if (setgroups(0, NULL) != 0 || setgid(gid) != 0 || setuid(uid) != 0) _exit(100);
        if (nng) setenv("KVTIER_NO_FAST", "1", 1);
        execv("/proc/self/exe", (char *const *)argv);
        _exit(103);
    }
    int st = 0;
    if (p < 0 || waitpid(p, &st, 0) != p) return 101;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 102;
}

int td_refused(const char *const *extra, const char *says)
{
    struct tdaemon B;
    memset(&B, 0, sizeof B);
    if (td_init(&B) != 0) return -1;
    pid_t p = td_spawn(&B, extra);
    int rc = p > 0 && td_wait_exit(p, 10000) != 0 ? 0 : -1;
    if (rc == 0 && !td_log_has(&B, says)) {
        fprintf(stderr, "log lacks '%s'\n", says);
        rc = -1;
    }
    td_cleanup(&B);
    return rc;
}
