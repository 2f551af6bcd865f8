/*
 * test_tenant_pools.c -- a tenant with a DRAM pool of its own, tested as
 * the attacker (issue 11).
 *
 * One real kvtierd (run as root, an operator) with two tenants: alpha
 * (uid 50001) with pool=16M, its own pool, and beta (uid 50002) on the
 * default pool. The default pool and the sockets are world-accessible
 * (pool_mode 0666), so only the daemon's choice of what to hand whom
 * stands between beta and alpha's bytes. Each client runs in a child
 * that drops to its uid and gid and re-execs this test ("--as"; nng's
 * threads do not survive a fork), reporting through its exit status;
 * the suite runs as root and is skipped otherwise.
 *
 * What is checked: alpha is handed its own pool alone (the fd, no path),
 * maps nothing else, and its zero-copy PUT and GET work with the right
 * bytes, which lie in alpha's pool file and not in the default one; beta
 * gets no fd or path of alpha's pool (HELLO over nng and over the fast
 * channel, the fd it receives is the default pool's), cannot open alpha's
 * pool file, and its GET of alpha's key is refused; filling alpha's pool
 * evicts only alpha's chunks (each pool is bounded by its own size);
 * chunks sent to NVMe come back into alpha's pool;
 * both pools are adopted across a restart, file-backed and as memfds
 * handed back by a play fd store (LISTEN_FDS); an operator writing into
 * alpha's namespace copies (it does not map alpha's pool); bad pool
 * lines keep the daemon from starting.
 */
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "client_internal.h"
#include "daemon.h"
#include "kvtier.h"
#include "nvtest.h"
#include "ops.h"

#define UID_ALPHA 50001
#define UID_BETA 50002
#define GID_ALPHA 50101
#define GID_BETA 50102
#define CH 4096
#define BIG (1u << 20)

static const char *const tenants_args[] = {
    "--pool-mode", "0666",
    "--tenants.tenant", "name=alpha uids=50001 prefixes=alpha/ pool=16M",
    "--tenants.tenant", "name=beta uids=50002 prefixes=beta/", NULL};

static struct tdaemon D;
static char alpha_pool[400]; /* in a child: alpha's pool file */

/* extra, then more (both NULL-ended) into out. */
static const char **args2(const char **out, const char *const *extra,
                          const char *const *more)
{
    int n = 0;
    for (int i = 0; extra && extra[i]; i++) out[n++] = extra[i];
    for (int i = 0; more && more[i]; i++) out[n++] = more[i];
    out[n] = NULL;
    return out;
}

static int start(struct tdaemon *d, const char *const *more)
{
    const char *a[32];
    if (!d->dir[0] && td_init(d) != 0) return -1;
    chmod(d->dir, 0711); /* other uids reach the socket, nothing else */
    return td_start(d, args2(a, tenants_args, more));
}

static int setup(void **state)
{
    (void)state;
    if (getuid() != 0) return 0; /* the tests skip */
    memset(&D, 0, sizeof D);
    return start(&D, NULL);
}

static int teardown(void **state)
{
    (void)state;
    if (getuid() != 0) return 0;
    int rc = D.pid ? td_stop(&D) : 0;
    td_cleanup(&D);
    return rc;
}

/* Run role as (uid, gid) against dm, over nng only when nng is set. */
static int run_on(const struct tdaemon *dm, uid_t uid, gid_t gid, int nng,
                  const char *role)
{
    const char *argv[] = {"test_tenant_pools", "--as", role, dm->dir, dm->pool, NULL};
    return td_run_self_as(uid, gid, nng, argv);
}

/* A zero-copy GET of seed's chunk: 0 when its bytes are right. */
static int get_zero_copy(kvt_client *c, const char *ns, uint64_t seed, size_t size)
{
    kvt_key k = td_key(seed);
    kvt_lease l;
    kvt_chunk ch;
    size_t got = 0;
    uint8_t *want = malloc(size);
    td_fill(want, size, seed);
    kvt_err e = kvt_get(c, ns, &k, 1, &l, &ch, &got);
    int ok = e == KVT_OK && got == 1 && ch.size == size && !memcmp(ch.data, want, size);
    if (e == KVT_OK && got) kvt_release(c, l);
    free(want);
    if (!ok) fprintf(stderr, "zero-copy get %s/%llu: %s, %zu\n", ns,
                     (unsigned long long)seed, kvt_strerror(e), got);
    return ok ? 0 : -1;
}

static kvt_err get_copy(kvt_client *c, const char *ns, uint64_t seed)
{
    uint8_t buf[CH];
    kvt_key k = td_key(seed);
    size_t size = 0;
    return kvt_get_copy(c, ns, &k, buf, sizeof buf, &size);
}

/* Does this process map a file whose path is exactly path? */
static int maps_path(const char *path)
{
    char line[1024];
    int found = 0;
    FILE *f = fopen("/proc/self/maps", "r");
    if (!f) return -1;
    while (fgets(line, sizeof line, f)) {
        char *p = strchr(line, '/');
        if (!p) continue;
        p[strcspn(p, "\n")] = '\0';
        if (!strcmp(p, path)) found = 1;
    }
    fclose(f);
    return found;
}

/* Does this process map a memfd named name? */
static int maps_memfd(const char *name)
{
    char line[1024], want[128];
    int found = 0;
    snprintf(want, sizeof want, "/memfd:%s ", name);
    FILE *f = fopen("/proc/self/maps", "r");
    if (!f) return -1;
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = ' ';
        if (strstr(line, want)) found = 1;
    }
    fclose(f);
    return found;
}

/* ----------------------------------------------------------- the roles */

/* alpha: its own pool, mapped alone; zero-copy works and is right. */
static int as_alpha(void)
{
    kvt_client *c = NULL;
    /* fd only: the file is the daemon's, 0600 (a memfd pool has none) */
    TD_CK(open(alpha_pool, O_RDONLY) < 0 && (errno == EACCES || errno == ENOENT));
    TD_CK(kvt_connect(D.sock, &c) == KVT_OK);
    TD_CK(kvt_zero_copy(c));
    TD_CK(kvtc_pool_id(c) != 0);
    TD_CK(maps_path(D.pool) == 0);                /* not the default pool */
    TD_CK(maps_path(alpha_pool) == 1 || maps_memfd("kvtier-pool-alpha") == 1);
    TD_CK(maps_memfd("kvtier-pool") == 0);
    for (uint64_t s = 1; s <= 8; s++) TD_CK(tc_put(c, "alpha/m", s, CH) == KVT_OK);
    for (uint64_t s = 1; s <= 8; s++) TD_CK(get_zero_copy(c, "alpha/m", s, CH) == 0);
    TD_CK(get_copy(c, "alpha/m", 3) == KVT_OK);
    TD_CK(tc_put(c, "beta/m", 9, CH) == KVT_EPERM);
    kvt_close(c);
    return 0;
}

/* alpha after a restart: what it put is there, zero-copy, bytes right. */
static int as_alpha_again(void)
{
    kvt_client *c = NULL;
    TD_CK(kvt_connect(D.sock, &c) == KVT_OK);
    TD_CK(kvt_zero_copy(c));
    for (uint64_t s = 1; s <= 8; s++) TD_CK(get_zero_copy(c, "alpha/m", s, CH) == 0);
    kvt_close(c);
    return 0;
}

/* HELLO again on c's own transport (nng with KVTIER_NO_FAST): the
 * answer names the default pool only. */
static int hello_names_default(kvt_client *c)
{
    uint8_t buf[256];
    Kvtier__Request q = KVTIER__REQUEST__INIT;
    Kvtier__Hello h = KVTIER__HELLO__INIT;
    Kvtier__Response *r = NULL;
    h.proto_version = KVT_PROTO_VERSION;
    q.body_case = KVTIER__REQUEST__BODY_HELLO;
    q.hello = &h;
    size_t n = kvtier__request__pack(&q, buf);
    TD_CK(kvtc_call_raw(c, buf, n, &r) == KVT_OK);
    TD_CK(r && r->body_case == KVTIER__RESPONSE__BODY_HELLO);
    TD_CK(r->hello->pool == 0 && r->hello->pool_offset == 0);
    TD_CK(!strcmp(r->hello->pool_path, D.pool) || !r->hello->pool_path[0]); /* memfd */
    kvtier__response__free_unpacked(r, NULL);
    return 0;
}

/* HELLO on a raw fast-channel connection: the answer names the default
 * pool, and the fd that comes with it, if any, is not alpha's pool. */
static int fast_fd_not_alpha(void)
{
    struct stat a = {0}, got;
    Kvtier__Response *r;
    int rx;
    TD_CK(td_fast_hello(&D, &r, &rx) == 0);
    TD_CK(stat(alpha_pool, &a) == 0 || errno == ENOENT); /* none: memfd pools */
    TD_CK(r->body_case == KVTIER__RESPONSE__BODY_HELLO);
    TD_CK(r->hello->pool == 0 && r->hello->pool_offset == 0);
    TD_CK(r->hello->pool_bytes == 64u << 20);
    kvtier__response__free_unpacked(r, NULL);
    if (rx >= 0) {
        TD_CK(fstat(rx, &got) == 0);
        TD_CK(got.st_ino != a.st_ino || got.st_dev != a.st_dev);
        TD_CK((uint64_t)got.st_size == 64u << 20);
        close(rx);
    }
    return 0;
}

/* beta: the default pool, nothing of alpha's. */
static int as_beta(void)
{
    kvt_client *c = NULL;
    TD_CK(open(alpha_pool, O_RDONLY) < 0 && (errno == EACCES || errno == ENOENT));
    TD_CK(open(alpha_pool, O_RDWR) < 0 && (errno == EACCES || errno == ENOENT));
    TD_CK(fast_fd_not_alpha() == 0);
    TD_CK(kvt_connect(D.sock, &c) == KVT_OK);
    TD_CK(hello_names_default(c) == 0);
    TD_CK(kvt_zero_copy(c));
    TD_CK(kvtc_pool_id(c) == 0);
    TD_CK(maps_path(alpha_pool) == 0);
    TD_CK(maps_memfd("kvtier-pool-alpha") == 0);
    TD_CK(tc_put(c, "beta/m", 21, CH) == KVT_OK);
    TD_CK(get_zero_copy(c, "beta/m", 21, CH) == 0);
    TD_CK(get_copy(c, "alpha/m", 1) == KVT_EPERM);
    kvt_key k = td_key(1);
    kvt_lease l;
    kvt_chunk ch;
    size_t got = 9;
    TD_CK(kvt_get(c, "alpha/m", &k, 1, &l, &ch, &got) == KVT_EPERM);
    /* An offset in alpha's pool cannot be turned into a pointer here. */
    TD_CK(kvtc_pool_ptr(c, 1, 64u << 20, CH) == NULL);
    TD_CK(kvtc_pool_ptr(c, 0, 64u << 20, CH) == NULL);
    kvt_close(c);
    return 0;
}

static int as_beta_again(void)
{
    kvt_client *c = NULL;
    TD_CK(kvt_connect(D.sock, &c) == KVT_OK);
    TD_CK(get_zero_copy(c, "beta/m", 21, CH) == 0);
    kvt_close(c);
    return 0;
}

/* alpha fills its 16 MiB pool with 1 MiB chunks, three times over. */
static int as_alpha_flood(void)
{
    kvt_client *c = NULL;
    TD_CK(kvt_connect(D.sock, &c) == KVT_OK);
    for (uint64_t s = 100; s < 148; s++) TD_CK(tc_put(c, "alpha/big", s, BIG) == KVT_OK);
    TD_CK(get_zero_copy(c, "alpha/big", 147, BIG) == 0);
    kvt_key k = td_key(100); /* the first went to make room */
    kvt_lease l;
    kvt_chunk ch;
    size_t got = 9;
    TD_CK(kvt_get(c, "alpha/big", &k, 1, &l, &ch, &got) == KVT_OK && got == 0);
    kvt_close(c);
    return 0;
}

/* ------------------------------------------------------------ helpers */

/* Is the chunk of seed (CH bytes) in the file at path? */
static int file_holds(const char *path, uint64_t seed)
{
    uint8_t want[CH];
    struct stat st;
    int fd = open(path, O_RDONLY);
    if (fd < 0 || fstat(fd, &st) != 0) return -1;
    void *m = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    if (m == MAP_FAILED) return -1;
    td_fill(want, sizeof want, seed);
    int found = memmem(m, (size_t)st.st_size, want, sizeof want) != NULL;
    munmap(m, (size_t)st.st_size);
    return found;
}

static void pool_file_of(const struct tdaemon *d, char *buf, size_t len)
{
    snprintf(buf, len, "%s.alpha", d->pool);
}

/* ------------------------------------------------------------- tests */

static void test_alpha_own_pool(void **state)
{
    (void)state;
    char ap[400];
    if (getuid() != 0) skip();
    pool_file_of(&D, ap, sizeof ap);
    struct stat st;
    assert_int_equal(stat(ap, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0600);
    assert_int_equal(st.st_size, 16 << 20);
    assert_int_equal(run_on(&D, UID_ALPHA, GID_ALPHA, 0, "alpha"), 0);
    assert_int_equal(run_on(&D, UID_ALPHA, GID_ALPHA, 1, "alpha"), 0);
    /* The bytes lie in alpha's pool, never in the shared one. */
    assert_int_equal(file_holds(ap, 5), 1);
    assert_int_equal(file_holds(D.pool, 5), 0);
}

static void test_beta_kept_out(void **state)
{
    (void)state;
    if (getuid() != 0) skip();
    assert_int_equal(run_on(&D, UID_ALPHA, GID_ALPHA, 0, "alpha"), 0);
    assert_int_equal(run_on(&D, UID_BETA, GID_BETA, 0, "beta"), 0);
    assert_int_equal(run_on(&D, UID_BETA, GID_BETA, 1, "beta"), 0);
    assert_int_equal(file_holds(D.pool, 21), 1);
}

/* An operator (root, the default pool) writes into alpha's namespace:
 * the answer names alpha's pool, which it does not map, so it copies;
 * alpha then reads it zero-copy. */
static void test_operator_copies(void **state)
{
    (void)state;
    char ap[400];
    if (getuid() != 0) skip();
    pool_file_of(&D, ap, sizeof ap);
    kvt_client *op = td_connect(&D);
    assert_true(kvt_zero_copy(op));
    assert_int_equal(tc_put(op, "alpha/m", 7, CH), KVT_OK);
    assert_int_equal(get_copy(op, "alpha/m", 7), KVT_OK);
    kvt_key k = td_key(7);
    kvt_lease l;
    kvt_chunk ch;
    size_t got;
    assert_int_equal(kvt_get(op, "alpha/m", &k, 1, &l, &ch, &got), KVT_ENOTSUP);
    kvt_close(op);
    assert_int_equal(file_holds(ap, 7), 1);
    assert_int_equal(file_holds(D.pool, 7), 0);
}

/* Flooding alpha's pool evicts alpha's chunks only: beta's stay. */
static void test_pool_bounded(void **state)
{
    (void)state;
    if (getuid() != 0) skip();
    assert_int_equal(run_on(&D, UID_BETA, GID_BETA, 0, "beta"), 0);
    assert_int_equal(run_on(&D, UID_ALPHA, GID_ALPHA, 0, "alpha-flood"), 0);
    assert_int_equal(run_on(&D, UID_BETA, GID_BETA, 0, "beta-again"), 0);
    char base[128], *body = NULL;
    int status = 0;
    assert_int_equal(ops_metrics_base(&D, base, sizeof base, 5000), 0);
    assert_int_equal(ops_http_get(base, "/metrics", &status, &body), 0);
    assert_int_equal(status, 200);
    assert_non_null(strstr(body, "kvtier_pool_capacity_bytes{pool=\"alpha\"} 16777216"));
    assert_non_null(strstr(body, "kvtier_pool_capacity_bytes{pool=\"default\"} 67108864"));
    const char *a = strstr(body, "kvtier_pool_used_bytes{pool=\"alpha\"} ");
    const char *d = strstr(body, "kvtier_pool_used_bytes{pool=\"default\"} ");
    assert_non_null(a);
    assert_non_null(d);
    unsigned long long ua = strtoull(strchr(a, ' ') + 1, NULL, 10);
    unsigned long long ud = strtoull(strchr(d, ' ') + 1, NULL, 10);
    assert_true(ua >= 8ull << 20 && ua <= 16ull << 20); /* full, within its size */
    assert_true(ud >= CH && ud < 8ull << 20);           /* beta's chunks only */
    free(body);
}

/* One pool's used bytes from the daemon's metrics. */
static unsigned long long pool_used(const struct tdaemon *d, const char *pool)
{
    char base[128], *body = NULL, want[96];
    int status = 0;
    assert_int_equal(ops_metrics_base(d, base, sizeof base, 5000), 0);
    assert_int_equal(ops_http_get(base, "/metrics", &status, &body), 0);
    assert_int_equal(status, 200);
    snprintf(want, sizeof want, "kvtier_pool_used_bytes{pool=\"%s\"} ", pool);
    const char *at = strstr(body, want);
    assert_non_null(at);
    unsigned long long v = strtoull(at + strlen(want), NULL, 10);
    free(body);
    return v;
}

/* With an NVMe tier: FLUSH --evict sends alpha's chunks down, and its
 * zero-copy GET brings them back into alpha's pool, not the default. */
static void test_nvme_back_to_own_pool(void **state)
{
    (void)state;
    if (getuid() != 0) skip();
    const char *a[48];
    struct tdaemon R;
    memset(&R, 0, sizeof R);
    assert_int_equal(td_init(&R), 0);
    chmod(R.dir, 0711);
    nvt_args(a, 48, 64, 16, tenants_args);
    assert_int_equal(td_start(&R, a), 0);
    assert_int_equal(run_on(&R, UID_ALPHA, GID_ALPHA, 0, "alpha"), 0);
    assert_true(pool_used(&R, "alpha") >= 8 * CH);
    kvt_client *op = td_connect(&R);
    Kvtier__FlushResp fr;
    assert_int_equal(nvt_flush(op, 1, &fr), KVT_OK);
    assert_int_equal(fr.failed, 0);
    assert_int_equal(pool_used(&R, "alpha"), 0);
    assert_int_equal(run_on(&R, UID_ALPHA, GID_ALPHA, 0, "alpha-again"), 0);
    assert_true(pool_used(&R, "alpha") >= 8 * CH);
    assert_int_equal(pool_used(&R, "default"), 0);
    assert_true(nvt_stat(op, "promotions") >= 8);
    kvt_close(op);
    assert_int_equal(td_stop(&R), 0);
    td_cleanup(&R);
}

/* File-backed pools: a restart adopts both. */
static void test_restart_file(void **state)
{
    (void)state;
    if (getuid() != 0) skip();
    const char *adopt[] = {"--dram.adopt", "1", NULL};
    struct tdaemon R;
    memset(&R, 0, sizeof R);
    assert_int_equal(start(&R, adopt), 0);
    assert_int_equal(run_on(&R, UID_ALPHA, GID_ALPHA, 0, "alpha"), 0);
    assert_int_equal(run_on(&R, UID_BETA, GID_BETA, 0, "beta"), 0);
    assert_int_equal(td_stop(&R), 0);
    assert_int_equal(start(&R, adopt), 0);
    assert_true(td_log_has(&R, "adopted 9 chunks"));
    assert_int_equal(run_on(&R, UID_ALPHA, GID_ALPHA, 0, "alpha-again"), 0);
    assert_int_equal(run_on(&R, UID_BETA, GID_BETA, 0, "beta-again"), 0);
    assert_int_equal(td_stop(&R), 0);
    td_cleanup(&R);
}

/* A datagram socket at dir/notify, as systemd's $NOTIFY_SOCKET. */
static int notify_socket(const struct tdaemon *d, char *path, size_t len)
{
    int s = td_notify_socket(d, path, len);
    assert_true(s >= 0);
    return s;
}

static int alpha_removed; /* FDSTOREREMOVE of alpha's name was seen */

/* The fds stored under the two names (waits up to 10 s each). */
static void await_stored(int s, int *def, int *alpha)
{
    long long end = td_now_ms() + (getenv("KVT_SAN") ? 30000 : 10000);
    char buf[512];
    int fd;
    *def = *alpha = -1;
    while ((*def < 0 || *alpha < 0) && td_notify_recv(s, buf, sizeof buf, &fd, end) >= 0) {
        if (strstr(buf, "FDSTOREREMOVE=1\nFDNAME=kvtier-pool-alpha")) alpha_removed = 1;
        if (strstr(buf, "FDSTORE=1\nFDNAME=kvtier-pool-alpha") && fd >= 0) *alpha = fd;
        else if (strstr(buf, "FDSTORE=1\nFDNAME=kvtier-pool") && fd >= 0) *def = fd;
        else if (fd >= 0) close(fd);
    }
}

/* Memfd pools in a play fd store: both handed back at the restart and
 * adopted; nothing is stored again. */
static void test_restart_memfd(void **state)
{
    (void)state;
    if (getuid() != 0) skip();
    const char *more[] = {"--dram.adopt", "1", "--dram.pool", "memfd", NULL};
    const char *a[32];
    char npath[108];
    struct tdaemon R;
    memset(&R, 0, sizeof R);
    assert_int_equal(td_init(&R), 0);
    chmod(R.dir, 0711);
    int ns = notify_socket(&R, npath, sizeof npath);
    setenv("NOTIFY_SOCKET", npath, 1);
    int rv = td_start(&R, args2(a, tenants_args, more));
    unsetenv("NOTIFY_SOCKET");
    assert_int_equal(rv, 0);
    int fds[2];
    await_stored(ns, &fds[0], &fds[1]);
    assert_true(fds[0] >= 0 && fds[1] >= 0);
    assert_int_equal(run_on(&R, UID_ALPHA, GID_ALPHA, 0, "alpha"), 0);
    assert_int_equal(run_on(&R, UID_BETA, GID_BETA, 0, "beta"), 0);
    assert_int_equal(td_stop(&R), 0);
    const char *names[2] = {"kvtier-pool", "kvtier-pool-alpha"};
    setenv("NOTIFY_SOCKET", npath, 1);
    rv = td_start_fds(&R, args2(a, tenants_args, more), fds, names, 2);
    unsetenv("NOTIFY_SOCKET");
    assert_int_equal(rv, 0);
    assert_true(td_log_has(&R, "adopted 9 chunks"));
    assert_true(td_log_has(&R, "tenant alpha: a pool of its own, memfd:kvtier-pool-alpha"));
    assert_int_equal(run_on(&R, UID_ALPHA, GID_ALPHA, 0, "alpha-again"), 0);
    assert_int_equal(run_on(&R, UID_BETA, GID_BETA, 0, "beta-again"), 0);
    assert_int_equal(td_stop(&R), 0);
    close(fds[0]);
    close(fds[1]);
    close(ns);
    td_cleanup(&R);
}

static void test_bad_pool_lines(void **state)
{
    (void)state;
    const char *small[] = {"--tenants.tenant", "name=x uids=1 prefixes=x/ pool=4K", NULL};
    const char *name[] = {"--tenants.tenant", "name=x/y uids=1 prefixes=x/ pool=8M", NULL};
    const char *meet[] = {"--tenants.tenant", "name=x uids=1 prefixes=x/ pool=8M",
                          "--tenants.tenant", "name=y uids=2 prefixes=x/a", NULL};
    assert_int_equal(td_refused(small, "pool=4K"), 0);
    assert_int_equal(td_refused(name, "its name may hold only"), 0);
    assert_int_equal(td_refused(meet, "shares no namespace prefix"), 0);
    /* A symlink where alpha's pool file goes: no start, nothing followed. */
    struct tdaemon B;
    char ap[400];
    memset(&B, 0, sizeof B);
    assert_int_equal(td_init(&B), 0);
    pool_file_of(&B, ap, sizeof ap);
    assert_int_equal(symlink("/etc/passwd", ap), 0);
    pid_t p = td_spawn(&B, tenants_args);
    assert_true(p > 0);
    assert_true(td_wait_exit(p, 10000) != 0);
    assert_true(td_log_has(&B, "tenant alpha's pool"));
    assert_true(td_log_has(&B, "is a symlink"));
    unlink(ap);
    td_cleanup(&B);
}

/* A memfd handed back under alpha's name but of the wrong size is
 * refused, dropped from the store, and alpha gets a fresh pool. */
static void test_memfd_misfit(void **state)
{
    (void)state;
    if (getuid() != 0) skip();
    const char *more[] = {"--dram.adopt", "1", "--dram.pool", "memfd", NULL};
    const char *a[32], *names[1] = {"kvtier-pool-alpha"};
    char npath[108];
    struct tdaemon R;
    memset(&R, 0, sizeof R);
    assert_int_equal(td_init(&R), 0);
    chmod(R.dir, 0711);
    int ns = notify_socket(&R, npath, sizeof npath);
    int bad = memfd_create("kvtier-pool-alpha", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    assert_true(bad >= 0);
    assert_int_equal(ftruncate(bad, 8 << 20), 0);
    assert_int_equal(fcntl(bad, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL), 0);
    setenv("NOTIFY_SOCKET", npath, 1);
    int rv = td_start_fds(&R, args2(a, tenants_args, more), &bad, names, 1);
    unsetenv("NOTIFY_SOCKET");
    assert_int_equal(rv, 0);
    close(bad);
    assert_true(td_log_has(&R, "refusing the pool fd handed back by the fd store "
                               "(kvtier-pool-alpha)"));
    int fds[2];
    alpha_removed = 0;
    await_stored(ns, &fds[0], &fds[1]); /* both stored afresh */
    assert_true(fds[0] >= 0 && fds[1] >= 0);
    assert_true(alpha_removed);
    struct stat st;
    assert_int_equal(fstat(fds[1], &st), 0);
    assert_int_equal(st.st_size, 16 << 20);
    assert_int_equal(run_on(&R, UID_ALPHA, GID_ALPHA, 0, "alpha"), 0);
    assert_int_equal(td_stop(&R), 0);
    close(fds[0]);
    close(fds[1]);
    close(ns);
    td_cleanup(&R);
}

/* The child: run one role against the daemon in dir. */
static int child(const char *role, const char *dir, const char *pool)
{
    static const struct { const char *name; int (*fn)(void); } roles[] = {
        {"alpha", as_alpha}, {"alpha-again", as_alpha_again},
        {"alpha-flood", as_alpha_flood}, {"beta", as_beta},
        {"beta-again", as_beta_again}};
    snprintf(D.dir, sizeof D.dir, "%s", dir);
    snprintf(D.sock, sizeof D.sock, "%s/kvtierd.sock", dir);
    snprintf(D.pool, sizeof D.pool, "%s", pool);
    pool_file_of(&D, alpha_pool, sizeof alpha_pool);
    for (size_t i = 0; i < sizeof roles / sizeof roles[0]; i++)
        if (!strcmp(roles[i].name, role)) return roles[i].fn();
    return 104;
}

int main(int argc, char **argv)
{
    if (argc == 5 && !strcmp(argv[1], "--as")) return child(argv[2], argv[3], argv[4]);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_alpha_own_pool),
        cmocka_unit_test(test_beta_kept_out),
        cmocka_unit_test(test_operator_copies),
        cmocka_unit_test(test_pool_bounded),
        cmocka_unit_test(test_nvme_back_to_own_pool),
        cmocka_unit_test(test_restart_file),
        cmocka_unit_test(test_restart_memfd),
        cmocka_unit_test(test_memfd_misfit),
        cmocka_unit_test(test_bad_pool_lines),
    };
    if (getenv("KVT_TEST_FILTER")) cmocka_set_test_filter(getenv("KVT_TEST_FILTER"));
    return cmocka_run_group_tests(tests, setup, teardown);
}
