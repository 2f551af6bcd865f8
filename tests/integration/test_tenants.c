/*
 * test_tenants.c -- tenants tied to credentials, tested as the attacker
 * (issue 11).
 *
 * One real kvtierd with three tenants: alpha (uid 50001), beta (uid
 * 50002) and gamma (gid 50100), and 50200 as tenants.admin_group. The
 * socket and pool are world-accessible (pool_mode 0666), so only the
 * tenant checks stand between the clients. Each client runs in a forked
 * child that drops to its uid and gid (the suite runs as root; skipped
 * otherwise) and reports through its exit status; the daemon itself runs
 * as root, an operator. A second daemon opens its sockets to everyone
 * and its pool only to the group users: a tenant outside it cannot open
 * the pool file, maps nothing and works by copying. Every case runs over the fast channel (SO_PEERCRED)
 * and over nng's ipc socket (ipc:peer-uid) alike. Bad tenant lines and a
 * plain tcp listener without daemon.tcp_insecure keep the daemon from
 * starting.
 */
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "client_internal.h"
#include "daemon.h"
#include "kvtier.h"

#define UID_ALPHA 50001
#define UID_BETA 50002
#define UID_GAMMA 50003
#define UID_ADMIN 50004
#define UID_NOBODY 50009
#define GID_GAMMA 50100
#define GID_ADMIN 50200
#define GID_OTHER 50300
#define CFG_LINES 17 /* one more tenant than kvtierd takes */

static struct tdaemon D;

static int setup(void **state)
{
    (void)state;
    const char *extra[] = {
        "--pool-mode", "0666",
        "--tenants.tenant", "name=alpha uids=" "50001" " prefixes=alpha/,shared-a/",
        "--tenants.tenant", "name=beta uids=50002 prefixes=beta/",
        "--tenants.tenant", "name=gamma gids=50100 prefixes=gamma/",
        "--tenants.admin_group", "50200", NULL};
    if (getuid() != 0) return 0; /* the tests skip */
    if (td_init(&D) != 0) return -1;
    chmod(D.dir, 0711); /* other uids reach the socket, nothing else */
    return td_start(&D, extra);
}

static int teardown(void **state)
{
    (void)state;
    if (getuid() != 0) return 0;
    int rc = td_stop(&D);
    td_cleanup(&D);
    return rc;
}

typedef int (*as_fn)(void *arg);

/* Run the role's function (child()) as (uid, gid) in a fresh process, over nng only when nng is
 * set; its exit status (0: every check held). The child execs this test
 * again (main's "--as"): nng's threads do not survive a fork. */
static int run_on(const struct tdaemon *dm, uid_t uid, gid_t gid, int nng,
                  const char *role)
{
    char dir[300];
    snprintf(dir, sizeof dir, "%s", dm->dir);
    const char *argv[] = {"test_tenants", "--as", role, dir, NULL};
    return td_run_self_as(uid, gid, nng, argv);
}

static int run_as(uid_t uid, gid_t gid, int nng, const char *role)
{
    return run_on(&D, uid, gid, nng, role);
}

static kvt_err put1(kvt_client *c, const char *ns, uint64_t seed)
{
    uint8_t buf[4096];
    kvt_key k = td_key(seed);
    const void *b = buf;
    size_t size = sizeof buf;
    td_fill(buf, sizeof buf, seed);
    return kvt_put(c, ns, &k, &b, &size, 1, NULL, NULL);
}

static kvt_err get1(kvt_client *c, const char *ns, uint64_t seed)
{
    uint8_t buf[4096];
    kvt_key k = td_key(seed);
    size_t size = 0;
    return kvt_get_copy(c, ns, &k, buf, sizeof buf, &size);
}

static kvt_err list(kvt_client *c, const char *ns, size_t *n)
{
    Kvtier__Request q = KVTIER__REQUEST__INIT;
    Kvtier__List l = KVTIER__LIST__INIT;
    Kvtier__Response *r = NULL;
    l.ns = (char *)ns;
    q.body_case = KVTIER__REQUEST__BODY_LIST;
    q.list = &l;
    kvt_err e = kvtc_call(c, &q, &r);
    if (e == KVT_OK) {
        *n = r->list->n_entries;
        kvtier__response__free_unpacked(r, NULL);
    }
    return e;
}

/* An operator request with no arguments of note: FLUSH, VERIFY or PEERS. */
static kvt_err operator_req(kvt_client *c, Kvtier__Request__BodyCase kind)
{
    Kvtier__Request q = KVTIER__REQUEST__INIT;
    Kvtier__Flush f = KVTIER__FLUSH__INIT;
    Kvtier__Verify v = KVTIER__VERIFY__INIT;
    Kvtier__Peers p = KVTIER__PEERS__INIT;
    Kvtier__Response *r = NULL;
    q.body_case = kind;
    if (kind == KVTIER__REQUEST__BODY_FLUSH) q.flush = &f;
    if (kind == KVTIER__REQUEST__BODY_VERIFY) q.verify = &v;
    if (kind == KVTIER__REQUEST__BODY_PEERS) q.peers = &p;
    kvt_err e = kvtc_call(c, &q, &r);
    if (e == KVT_OK) kvtier__response__free_unpacked(r, NULL);
    return e;
}

static kvt_err stats_ns(kvt_client *c, size_t *n_ns, int *sees_beta)
{
    Kvtier__Request q = KVTIER__REQUEST__INIT;
    Kvtier__Stats s = KVTIER__STATS__INIT;
    Kvtier__Response *r = NULL;
    q.body_case = KVTIER__REQUEST__BODY_STATS;
    q.stats = &s;
    kvt_err e = kvtc_call(c, &q, &r);
    if (e != KVT_OK) return e;
    *n_ns = r->stats->n_ns;
    *sees_beta = 0;
    for (size_t i = 0; i < r->stats->n_ns; i++)
        *sees_beta |= !strncmp(r->stats->ns[i]->ns, "beta/", 5);
    kvtier__response__free_unpacked(r, NULL);
    return KVT_OK;
}

/* Tenant alpha: its own prefixes work, beta's are refused whatever the
 * request, and requests over every tenant are refused. */
static int as_alpha(void *arg)
{
    (void)arg;
    kvt_client *c = NULL;
    kvt_key k = td_key(7);
    size_t n = 0;
    uint64_t u = 0;
    int sees_beta = 1;
    TD_CK(kvt_connect(D.sock, &c) == KVT_OK);
    TD_CK(put1(c, "alpha/m", 1) == KVT_OK);
    TD_CK(put1(c, "shared-a/m", 2) == KVT_OK);
    TD_CK(get1(c, "alpha/m", 1) == KVT_OK);
    TD_CK(kvt_lookup(c, "alpha/m", &k, 1, &n, NULL) == KVT_OK);
    TD_CK(list(c, "alpha/m", &n) == KVT_OK && n == 1);
    TD_CK(get1(c, "beta/m", 7) == KVT_EPERM);
    TD_CK(kvt_lookup(c, "beta/m", &k, 1, &n, NULL) == KVT_EPERM);
    TD_CK(strstr(kvt_last_error(c), "not tenant alpha's") != NULL);
    TD_CK(kvt_delete(c, "beta/m", &k, 1, &n) == KVT_EPERM);
    TD_CK(put1(c, "beta/m", 8) == KVT_EPERM);
    TD_CK(put1(c, "alphabet/m", 8) == KVT_EPERM); /* a prefix is not a substring */
    TD_CK(list(c, "beta/m", &n) == KVT_EPERM);
    TD_CK(list(c, "", &n) == KVT_EPERM);
    TD_CK(strstr(kvt_last_error(c), "not an operator") != NULL);
    TD_CK(kvt_clear(c, "alpha/m", &u) == KVT_EPERM);
    TD_CK(kvt_clear(c, "beta/m", &u) == KVT_EPERM);
    TD_CK(kvt_evict(c, 0, &u) == KVT_EPERM);
    TD_CK(operator_req(c, KVTIER__REQUEST__BODY_FLUSH) == KVT_EPERM);
    TD_CK(operator_req(c, KVTIER__REQUEST__BODY_VERIFY) == KVT_EPERM);
    TD_CK(operator_req(c, KVTIER__REQUEST__BODY_PEERS) == KVT_EPERM);
    TD_CK(stats_ns(c, &n, &sees_beta) == KVT_OK && !sees_beta && n >= 1);
    kvt_close(c);
    return 0;
}

/* The operator (root, the daemon's uid) puts beta's chunk; alpha cannot
 * touch it; it is still there afterwards. */
static void cross_tenant(int nng)
{
    kvt_client *op = td_connect(&D);
    size_t n = 0;
    kvt_key k = td_key(7);
    assert_int_equal(put1(op, "beta/m", 7), KVT_OK);
    assert_int_equal(run_as(UID_ALPHA, GID_OTHER, nng, "alpha"), 0);
    assert_int_equal(kvt_lookup(op, "beta/m", &k, 1, &n, NULL), KVT_OK);
    assert_int_equal(n, 1);
    assert_int_equal(get1(op, "alpha/m", 1), KVT_OK); /* operators see all */
    assert_int_equal(list(op, "", &n), KVT_OK);
    assert_true(n >= 3);
    kvt_close(op);
}

static void test_cross_tenant_fast(void **state)
{
    (void)state;
    if (getuid() != 0) skip();
    cross_tenant(0);
}

static void test_cross_tenant_nng(void **state)
{
    (void)state;
    if (getuid() != 0) skip();
    cross_tenant(1);
}

/* Beta may read its own chunk (put by the operator) and nothing of
 * alpha's. */
static int as_beta(void *arg)
{
    (void)arg;
    kvt_client *c = NULL;
    TD_CK(kvt_connect(D.sock, &c) == KVT_OK);
    TD_CK(get1(c, "beta/m", 7) == KVT_OK);
    TD_CK(get1(c, "alpha/m", 1) == KVT_EPERM);
    kvt_close(c);
    return 0;
}

static void test_beta_own_only(void **state)
{
    (void)state;
    if (getuid() != 0) skip();
    kvt_client *op = td_connect(&D);
    assert_int_equal(put1(op, "beta/m", 7), KVT_OK);
    assert_int_equal(put1(op, "alpha/m", 1), KVT_OK);
    kvt_close(op);
    assert_int_equal(run_as(UID_BETA, GID_OTHER, 0, "beta"), 0);
    assert_int_equal(run_as(UID_BETA, GID_OTHER, 1, "beta"), 0);
}

/* Credentials no tenant lists: refused from the first request on. */
static int as_nobody(void *arg)
{
    (void)arg;
    kvt_client *c = NULL;
    TD_CK(kvt_connect(D.sock, &c) == KVT_EPERM);
    return 0;
}

static void test_unknown_refused(void **state)
{
    (void)state;
    if (getuid() != 0) skip();
    assert_int_equal(run_as(UID_NOBODY, GID_OTHER, 0, "nobody"), 0);
    assert_int_equal(run_as(UID_NOBODY, GID_OTHER, 1, "nobody"), 0);
    assert_true(td_log_has(&D, "uid 50009 gid 50300 belongs to no tenant"));
}

/* gamma is matched by its gid alone. */
static int as_gamma(void *arg)
{
    (void)arg;
    kvt_client *c = NULL;
    TD_CK(kvt_connect(D.sock, &c) == KVT_OK);
    TD_CK(put1(c, "gamma/m", 30) == KVT_OK);
    TD_CK(get1(c, "gamma/m", 30) == KVT_OK);
    TD_CK(put1(c, "alpha/m", 31) == KVT_EPERM);
    kvt_close(c);
    return 0;
}

static void test_gid_tenant(void **state)
{
    (void)state;
    if (getuid() != 0) skip();
    assert_int_equal(run_as(UID_GAMMA, GID_GAMMA, 0, "gamma"), 0);
    assert_int_equal(run_as(UID_GAMMA, GID_GAMMA, 1, "gamma"), 0);
}

/* A member of tenants.admin_group, in no tenant, does what operators do. */
static int as_admin(void *arg)
{
    (void)arg;
    kvt_client *c = NULL;
    size_t n = 0;
    uint64_t u = 0;
    TD_CK(kvt_connect(D.sock, &c) == KVT_OK);
    TD_CK(list(c, "", &n) == KVT_OK && n >= 1);
    TD_CK(get1(c, "beta/m", 7) == KVT_OK);
    TD_CK(kvt_clear(c, "beta/m", &u) == KVT_OK && u == 1);
    TD_CK(kvt_evict(c, 4096, &u) == KVT_OK);
    kvt_close(c);
    return 0;
}

static void test_admin_group(void **state)
{
    (void)state;
    if (getuid() != 0) skip();
    kvt_client *op = td_connect(&D);
    assert_int_equal(put1(op, "beta/m", 7), KVT_OK);
    assert_int_equal(run_as(UID_ADMIN, GID_ADMIN, 0, "admin"), 0);
    assert_int_equal(put1(op, "beta/m", 7), KVT_OK);
    assert_int_equal(run_as(UID_ADMIN, GID_ADMIN, 1, "admin"), 0);
    kvt_close(op);
}

/* A tenant in the pool's group maps the pool and moves to the fast
 * channel. */
static int as_pooled(void *arg)
{
    (void)arg;
    kvt_client *c = NULL;
    int fd = open(D.pool, O_RDONLY);
    TD_CK(fd >= 0);
    close(fd);
    TD_CK(kvt_connect(D.sock, &c) == KVT_OK);
    TD_CK(kvt_zero_copy(c));
    TD_CK(put1(c, "alpha/p", 40) == KVT_OK);
    kvt_close(c);
    return 0;
}

/* A tenant outside the pool's group cannot open the pool file, so it
 * cannot read the other tenants' bytes; it still works, copying. */
static int as_unpooled(void *arg)
{
    (void)arg;
    kvt_client *c = NULL;
    TD_CK(open(D.pool, O_RDONLY) < 0 && errno == EACCES);
    TD_CK(open(D.pool, O_RDWR) < 0 && errno == EACCES);
    TD_CK(kvt_connect(D.sock, &c) == KVT_OK);
    TD_CK(!kvt_zero_copy(c));
    TD_CK(put1(c, "beta/p", 41) == KVT_OK);
    TD_CK(get1(c, "beta/p", 41) == KVT_OK);
    TD_CK(get1(c, "alpha/p", 40) == KVT_EPERM);
    kvt_close(c);
    return 0;
}

/* The socket open to every tenant (daemon.socket_mode), the pool only to
 * its group (users): tenant beta, outside it, cannot map it. */
static void test_pool_kept_from_tenant(void **state)
{
    (void)state;
    struct group *g = getgrnam("users");
    if (getuid() != 0 || !g) skip();
    struct tdaemon P;
    const char *extra[] = {
        "--pool-mode", "0660", "--pool-group", "users", "--socket-mode", "0666",
        "--tenants.tenant", "name=alpha uids=50001 prefixes=alpha/",
        "--tenants.tenant", "name=beta uids=50002 prefixes=beta/", NULL};
    assert_int_equal(td_init(&P), 0);
    chmod(P.dir, 0711);
    assert_int_equal(td_start(&P, extra), 0);
    assert_int_equal(run_on(&P, UID_ALPHA, g->gr_gid, 0, "pooled"), 0);
    assert_int_equal(run_on(&P, UID_BETA, GID_OTHER, 0, "unpooled"), 0);
    assert_int_equal(run_on(&P, UID_BETA, GID_OTHER, 1, "unpooled"), 0);
    assert_int_equal(td_stop(&P), 0);
    td_cleanup(&P);
}

static void test_bad_config(void **state)
{
    (void)state;
    const char *no_prefix[] = {"--tenants.tenant", "name=x uids=1", NULL};
    const char *no_ids[] = {"--tenants.tenant", "name=x prefixes=x/", NULL};
    const char *bad_uid[] = {"--tenants.tenant", "name=x uids=1,-2 prefixes=x/", NULL};
    const char *twice[] = {"--tenants.tenant", "name=x uids=1 prefixes=x/",
                           "--tenants.tenant", "name=x uids=2 prefixes=y/", NULL};
    const char *field[] = {"--tenants.tenant", "name=x uids=1 prefixes=x/ colour=red", NULL};
    const char *group[] = {"--tenants.tenant", "name=x uids=1 prefixes=x/",
                           "--tenants.admin_group", "no-such-group-kvt", NULL};
    char url[64];
    snprintf(url, sizeof url, "tcp://127.0.0.1:%d", td_free_port());
    const char *plain[] = {"--tcp", url, NULL};
    const char *plain_tenants[] = {"--tcp", url, "--tcp-insecure", "1",
                                   "--tenants.tenant", "name=x uids=1 prefixes=x/", NULL};
    assert_int_equal(td_refused(no_prefix, "no prefixes"), 0);
    assert_int_equal(td_refused(no_ids, "no uids, gids or tls listener"), 0);
    assert_int_equal(td_refused(bad_uid, "uids=1,-2"), 0);
    assert_int_equal(td_refused(twice, "name used twice"), 0);
    assert_int_equal(td_refused(field, "colour=red"), 0);
    assert_int_equal(td_refused(group, "no such group"), 0);
    char many[CFG_LINES][64];
    const char *too_many[2 * CFG_LINES + 1];
    for (int i = 0; i < CFG_LINES; i++) {
        snprintf(many[i], sizeof many[i], "name=t%d uids=%d prefixes=t%d/", i, i, i);
        too_many[2 * i] = "--tenants.tenant";
        too_many[2 * i + 1] = many[i];
    }
    too_many[2 * CFG_LINES] = NULL;
    const char *tls_no_ca[] = {"--tenants.tenant",
                               "name=x prefixes=x/ tls=tls+tcp://127.0.0.1:1", NULL};
    const char *tcp_socket[] = {"--socket", "tcp://127.0.0.1:1", "--tenants.tenant",
                                "name=x uids=1 prefixes=x/", NULL};
    const char *not_tls[] = {"--tenants.tenant", "name=x prefixes=x/ "
                             "tls=tcp://127.0.0.1:1 ca=/x", NULL};
    assert_int_equal(td_refused(too_many, "too many tenants"), 0);
    assert_int_equal(td_refused(tls_no_ca, "tls and ca go together"), 0);
    assert_int_equal(td_refused(tcp_socket, "daemon.socket must be ipc://"), 0);
    assert_int_equal(td_refused(not_tls, "tls=tcp://127.0.0.1:1"), 0);
    assert_int_equal(td_refused(plain, "is plain tcp"), 0);
    assert_int_equal(td_refused(plain_tenants, "not allowed with tenants"), 0);
}


/* The child of run_as: run one role's checks against the daemon in dir. */
static int child(const char *role, const char *dir)
{
    static const struct { const char *name; as_fn fn; } roles[] = {
        {"alpha", as_alpha}, {"beta", as_beta}, {"nobody", as_nobody},
        {"gamma", as_gamma}, {"admin", as_admin}, {"pooled", as_pooled},
        {"unpooled", as_unpooled}};
    snprintf(D.dir, sizeof D.dir, "%s", dir);
    snprintf(D.sock, sizeof D.sock, "%s/kvtierd.sock", dir);
    snprintf(D.pool, sizeof D.pool, "/dev/shm/kvt-test-%s.pool", dir + 14);
    for (size_t i = 0; i < sizeof roles / sizeof roles[0]; i++)
        if (!strcmp(roles[i].name, role)) return roles[i].fn(NULL);
    return 104;
}

int main(int argc, char **argv)
{
    if (argc == 4 && !strcmp(argv[1], "--as")) return child(argv[2], argv[3]);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cross_tenant_fast),
        cmocka_unit_test(test_cross_tenant_nng),
        cmocka_unit_test(test_beta_own_only),
        cmocka_unit_test(test_unknown_refused),
        cmocka_unit_test(test_gid_tenant),
        cmocka_unit_test(test_admin_group),
        cmocka_unit_test(test_pool_kept_from_tenant),
        cmocka_unit_test(test_bad_config),
    };
    if (getenv("KVT_TEST_FILTER")) cmocka_set_test_filter(getenv("KVT_TEST_FILTER"));
    return cmocka_run_group_tests(tests, setup, teardown);
}
