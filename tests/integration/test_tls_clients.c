/*
 * test_tls_clients.c -- the remote client listeners over TLS, tested as
 * the attacker (issue 11).
 *
 * A CA per party is made with the openssl command in a temporary
 * directory: the operators' (it also signs the daemon's certificate),
 * alpha's and beta's. One real kvtierd serves daemon.tcp (tls+tcp,
 * operators' CA) and a tls+tcp listener per tenant (that tenant's CA).
 * A client with alpha's certificate is alpha on alpha's listener and is
 * refused on beta's and on the operators'; no certificate, a self-signed
 * one, or plain tcp to a TLS port are refused during the handshake; the
 * operators' certificate may CLEAR. Plain tcp is served only with
 * daemon.tcp_insecure, and says so in the log.
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
#include <nng/nng.h>
#include <nng/protocol/reqrep0/req.h>
#include <nng/supplemental/tls/tls.h>

#include "client_internal.h"
#include "daemon.h"
#include "kvtier.h"
#include "kvtier.pb-c.h"

static struct tdaemon D;
static char dir[64], url_op[64], url_a[64], url_b[64];

/* A CA (ca-NAME.pem), or a certificate NAME.pem / NAME.key with common
 * name cn signed by CA ca ("" : self-signed). */
static int make_ca(const char *name)
{
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "cd %s && openssl req -x509 -newkey ec -pkeyopt "
             "ec_paramgen_curve:P-256 -nodes -keyout ca-%s.key -out ca-%s.pem "
             "-days 2 -subj /CN=kvt-test-ca-%s >/dev/null 2>&1", dir, name, name, name);
    return system(cmd);
}

static int make_cert(const char *name, const char *cn, const char *ca)
{
    char cmd[1400];
    if (!ca[0])
        snprintf(cmd, sizeof cmd, "cd %s && openssl req -x509 -newkey ec -pkeyopt "
                 "ec_paramgen_curve:P-256 -nodes -keyout %s.key -out %s.pem -days 2 "
                 "-subj /CN=%s >/dev/null 2>&1", dir, name, name, cn);
    else
        snprintf(cmd, sizeof cmd, "cd %s && openssl req -newkey ec -pkeyopt "
                 "ec_paramgen_curve:P-256 -nodes -keyout %s.key -out %s.csr -subj "
                 "/CN=%s >/dev/null 2>&1 && openssl x509 -req -in %s.csr -CA ca-%s.pem "
                 "-CAkey ca-%s.key -CAcreateserial -out %s.pem -days 2 >/dev/null 2>&1",
                 dir, name, name, cn, name, ca, ca, name);
    return system(cmd);
}

static int make_pki(void)
{
    snprintf(dir, sizeof dir, "/tmp/kvt-pki-XXXXXX");
    if (!mkdtemp(dir)) return -1;
    return make_ca("op") || make_ca("a") || make_ca("b") ||
           make_cert("server", "127.0.0.1", "op") || make_cert("op", "ops", "op") ||
           make_cert("alpha", "alpha", "a") || make_cert("beta", "beta", "b") ||
           make_cert("rogue", "alpha", "");
}

static char *in_dir(char *buf, size_t len, const char *file)
{
    snprintf(buf, len, "%s/%s", dir, file);
    return buf;
}

static int setup(void **state)
{
    (void)state;
    char cert[128], key[128], ca[128], ta[512], tb[512], caa[128], cab[128];
    if (make_pki() != 0) return -1;
    snprintf(url_op, sizeof url_op, "tls+tcp://127.0.0.1:%d", td_free_port());
    snprintf(url_a, sizeof url_a, "tls+tcp://127.0.0.1:%d", td_free_port());
    snprintf(url_b, sizeof url_b, "tls+tcp://127.0.0.1:%d", td_free_port());
    snprintf(ta, sizeof ta, "name=alpha uids=50001 prefixes=alpha/ tls=%s ca=%s",
             url_a, in_dir(caa, sizeof caa, "ca-a.pem"));
    snprintf(tb, sizeof tb, "name=beta prefixes=beta/ tls=%s ca=%s", url_b,
             in_dir(cab, sizeof cab, "ca-b.pem"));
    const char *extra[] = {
        "--tcp", url_op,
        "--daemon.tls_cert", in_dir(cert, sizeof cert, "server.pem"),
        "--daemon.tls_key", in_dir(key, sizeof key, "server.key"),
        "--daemon.tls_ca", in_dir(ca, sizeof ca, "ca-op.pem"),
        "--tenants.tenant", ta, "--tenants.tenant", tb, NULL};
    if (td_init(&D) != 0) return -1;
    return td_start(&D, extra);
}

static int teardown(void **state)
{
    (void)state;
    char cmd[128];
    int rc = td_stop(&D);
    td_cleanup(&D);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0) rc = -1;
    return rc;
}

/* Connect to url presenting NAME.pem (NULL: no certificate). */
static kvt_err dial(const char *url, const char *name, kvt_client **c)
{
    char cert[128], key[128], ca[128], f[64];
    setenv("KVTIER_TLS_CA", in_dir(ca, sizeof ca, "ca-op.pem"), 1);
    unsetenv("KVTIER_TLS_CERT");
    unsetenv("KVTIER_TLS_KEY");
    if (name) {
        snprintf(f, sizeof f, "%s.pem", name);
        setenv("KVTIER_TLS_CERT", in_dir(cert, sizeof cert, f), 1);
        snprintf(f, sizeof f, "%s.key", name);
        setenv("KVTIER_TLS_KEY", in_dir(key, sizeof key, f), 1);
    }
    *c = NULL;
    return kvt_connect(url, c);
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
    uint8_t buf[4096], want[4096];
    kvt_key k = td_key(seed);
    size_t size = 0;
    kvt_err e = kvt_get_copy(c, ns, &k, buf, sizeof buf, &size);
    td_fill(want, sizeof want, seed);
    if (e == KVT_OK && (size != sizeof buf || memcmp(buf, want, size))) return KVT_ECORRUPT;
    return e;
}

/* alpha's certificate on alpha's listener: tenant alpha, nothing more. */
static void test_alpha_cert_is_alpha(void **state)
{
    (void)state;
    kvt_client *c;
    uint64_t u;
    assert_int_equal(dial(url_a, "alpha", &c), KVT_OK);
    assert_int_equal(put1(c, "alpha/r", 1), KVT_OK);
    assert_int_equal(get1(c, "alpha/r", 1), KVT_OK);
    assert_int_equal(put1(c, "beta/r", 2), KVT_EPERM);
    assert_int_equal(get1(c, "beta/r", 3), KVT_EPERM);
    assert_int_equal(kvt_clear(c, "alpha/r", &u), KVT_EPERM);
    assert_int_equal(kvt_evict(c, 0, &u), KVT_EPERM);
    kvt_close(c);
}

/* The operators' certificate on daemon.tcp: an operator. */
static void test_operator_cert(void **state)
{
    (void)state;
    kvt_client *c;
    uint64_t u = 0;
    assert_int_equal(dial(url_op, "op", &c), KVT_OK);
    assert_int_equal(put1(c, "beta/r", 3), KVT_OK);
    assert_int_equal(get1(c, "beta/r", 3), KVT_OK);
    assert_int_equal(kvt_clear(c, "beta/r", &u), KVT_OK);
    assert_int_equal(u, 1);
    kvt_close(c);
}

/* A client that presents no certificate at all (libkvtier will not dial
 * so, hence raw nng): the daemon must not answer its HELLO. 1 if it got
 * no answer. */
static int no_cert_refused(const char *url)
{
    char ca[128];
    nng_socket s;
    nng_dialer d;
    nng_tls_config *t;
    nng_msg *m;
    Kvtier__Request q = KVTIER__REQUEST__INIT;
    Kvtier__Hello h = KVTIER__HELLO__INIT;
    h.proto_version = KVT_PROTO_VERSION;
    q.body_case = KVTIER__REQUEST__BODY_HELLO;
    q.hello = &h;
    assert_int_equal(nng_req0_open(&s), 0);
    nng_socket_set_ms(s, NNG_OPT_RECVTIMEO, 3000);
    nng_socket_set_ms(s, NNG_OPT_SENDTIMEO, 3000);
    assert_int_equal(nng_tls_config_alloc(&t, NNG_TLS_MODE_CLIENT), 0);
    assert_int_equal(nng_tls_config_ca_file(t, in_dir(ca, sizeof ca, "ca-op.pem")), 0);
    assert_int_equal(nng_tls_config_auth_mode(t, NNG_TLS_AUTH_MODE_REQUIRED), 0);
    assert_int_equal(nng_dialer_create(&d, s, url), 0);
    assert_int_equal(nng_dialer_set_ptr(d, NNG_OPT_TLS_CONFIG, t), 0);
    nng_tls_config_free(t);
    int refused = nng_dialer_start(d, 0) != 0;
    if (!refused) {
        assert_int_equal(nng_msg_alloc(&m, kvtier__request__get_packed_size(&q)), 0);
        kvtier__request__pack(&q, nng_msg_body(m));
        if (nng_sendmsg(s, m, 0) != 0) nng_msg_free(m);
        refused = nng_recvmsg(s, &m, 0) != 0;
        if (!refused) nng_msg_free(m);
    }
    tc_close(s);
    return refused;
}

/* Every client that cannot prove it belongs there is refused before its
 * first request is read. */
static void test_refused(void **state)
{
    (void)state;
    kvt_client *c;
    char plain[64];
    assert_int_not_equal(dial(url_a, "beta", &c), KVT_OK);  /* beta's CA */
    assert_int_not_equal(dial(url_b, "alpha", &c), KVT_OK); /* alpha's CA */
    assert_int_not_equal(dial(url_op, "alpha", &c), KVT_OK);
    assert_int_not_equal(dial(url_a, NULL, &c), KVT_OK);    /* libkvtier: no */
    assert_true(no_cert_refused(url_a));                    /* the daemon: no */
    assert_true(no_cert_refused(url_op));
    assert_int_not_equal(dial(url_a, "rogue", &c), KVT_OK); /* self-signed */
    assert_int_not_equal(dial(url_op, NULL, &c), KVT_OK);
    snprintf(plain, sizeof plain, "tcp://%s", url_a + 10);
    assert_int_not_equal(kvt_connect(plain, &c), KVT_OK);  /* no TLS at all */
    /* and the daemon still serves the ones that can */
    assert_int_equal(dial(url_b, "beta", &c), KVT_OK);
    assert_int_equal(put1(c, "beta/r", 4), KVT_OK);
    kvt_close(c);
    assert_true(td_alive(&D));
}

/* A TLS client without the server's CA is refused by the library. */
static void test_client_needs_ca(void **state)
{
    (void)state;
    kvt_client *c = NULL;
    char cert[128], key[128];
    unsetenv("KVTIER_TLS_CA");
    setenv("KVTIER_TLS_CERT", in_dir(cert, sizeof cert, "alpha.pem"), 1);
    setenv("KVTIER_TLS_KEY", in_dir(key, sizeof key, "alpha.key"), 1);
    assert_int_not_equal(kvt_connect(url_a, &c), KVT_OK);
}

/* Plain tcp only when asked for, with a warning; a missing key file, a
 * tls listener without certificate or a key named without its section
 * where two sections have it keep the daemon from starting. */
static void test_insecure_and_bad_files(void **state)
{
    (void)state;
    struct tdaemon P;
    char url[64], cert[128], ta[256];
    kvt_client *c;
    snprintf(url, sizeof url, "tcp://127.0.0.1:%d", td_free_port());
    const char *insecure[] = {"--tcp", url, "--tcp-insecure", "1", NULL};
    assert_int_equal(td_init(&P), 0);
    assert_int_equal(td_start(&P, insecure), 0);
    assert_true(td_log_has(&P, "is plain tcp (daemon.tcp_insecure)"));
    assert_int_equal(kvt_connect(url, &c), KVT_OK);
    assert_int_equal(put1(c, "any/r", 5), KVT_OK);
    kvt_close(c);
    assert_int_equal(td_stop(&P), 0);
    td_cleanup(&P);

    const char *missing[] = {"--tcp", url_op, "--daemon.tls_cert",
                             in_dir(cert, sizeof cert, "server.pem"), "--daemon.tls_key",
                             "/nonexistent/key.pem", "--daemon.tls_ca", cert, NULL};
    snprintf(ta, sizeof ta, "name=a prefixes=a/ tls=%s ca=%s", url_a, cert);
    const char *no_cert[] = {"--tenants.tenant", ta, NULL};
    const char *no_ca[] = {"--tcp", url_op, "--daemon.tls_cert", cert, "--daemon.tls_key", cert, NULL};
    /* tls_cert is a key of [daemon] and of [cluster]: its section is wanted */
    const char *bare[] = {"--tls-cert", cert, NULL};
    const char *const *bad[] = {missing, no_cert, no_ca, bare};
    const char *says[] = {"/nonexistent/key.pem", "needs daemon.tls_cert",
                          "daemon.tcp needs daemon.tls_ca",
                          "more than one section (daemon.tls_cert, cluster.tls_cert)"};
    for (int i = 0; i < 4; i++) {
        assert_int_equal(td_init(&P), 0);
        pid_t p = td_spawn(&P, bad[i]);
        assert_true(p > 0);
        assert_true(td_wait_exit(p, 10000) != 0);
        if (!td_log_has(&P, says[i])) fprintf(stderr, "log lacks '%s'\n", says[i]);
        assert_true(td_log_has(&P, says[i]));
        td_cleanup(&P);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_alpha_cert_is_alpha),
        cmocka_unit_test(test_operator_cert),
        cmocka_unit_test(test_refused),
        cmocka_unit_test(test_client_needs_ca),
        cmocka_unit_test(test_insecure_and_bad_files),
    };
    if (getenv("KVT_TEST_FILTER")) cmocka_set_test_filter(getenv("KVT_TEST_FILTER"));
    return cmocka_run_group_tests(tests, setup, teardown);
}
