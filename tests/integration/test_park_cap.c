/*
 * test_park_cap.c -- parked requests are capped per client
 * (daemon.park_per_client, issue 11): one client that parks many
 * requests is refused past its cap with KVT_EBUSY, and another client
 * still parks and is answered.
 *
 * Two real daemons on loopback; node 1 is stopped (SIGSTOP), so a LOOKUP
 * of keys missing on node 0 is parked waiting for node 1 until
 * cluster.lookup_timeout_ms. Client A speaks raw nng with several
 * contexts on one connection (libkvtier sends one request at a time, so
 * a client that parks many has to be written this way); client B is an
 * ordinary libkvtier client. Waits bound how long the test waits, they
 * assert no timing.
 */
#include <setjmp.h>
#include <signal.h>
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

#include "daemon.h"
#include "kvtier.h"
#include "kvtier.pb-c.h"

#define CAP 2
#define NS "cap"

static struct tcluster T;

static int setup(void **state)
{
    (void)state;
    const char *extra[] = {"--cluster.lookup_timeout_ms", "3000",
                           "--daemon.park_per_client", "2", NULL};
    setenv("UCX_TLS", "tcp", 1);
    tc_init(&T, 2);
    int rc = 0;
    for (int i = 0; i < 2 && rc == 0; i++) rc = tc_start(&T, i, 60000, extra);
    if (rc == 0) rc = tc_wait_alive(&T, 0, 1, 0) || tc_wait_alive(&T, 1, 1, 0);
    if (rc != 0) tc_teardown(&T);
    return rc ? -1 : 0;
}

static int teardown(void **state)
{
    (void)state;
    kill(T.d[1].pid, SIGCONT);
    return tc_teardown(&T);
}

struct rawreq {
    nng_ctx ctx;
    nng_aio *aio;
};

/* Send a LOOKUP of 2 keys nobody has on r's context; start its receive. */
static void send_lookup(nng_socket s, struct rawreq *r, uint64_t id, uint64_t seed)
{
    Kvtier__Request q = KVTIER__REQUEST__INIT;
    Kvtier__Lookup l = KVTIER__LOOKUP__INIT;
    kvt_key k[2] = {td_key(seed), td_key(seed + 1)};
    ProtobufCBinaryData keys[2] = {{KVT_KEY_LEN, k[0].b}, {KVT_KEY_LEN, k[1].b}};
    nng_msg *m;
    l.ns = NS;
    l.n_keys = 2;
    l.keys = keys;
    q.id = id;
    q.body_case = KVTIER__REQUEST__BODY_LOOKUP;
    q.lookup = &l;
    assert_int_equal(nng_ctx_open(&r->ctx, s), 0);
    assert_int_equal(nng_aio_alloc(&r->aio, NULL, NULL), 0);
    nng_aio_set_timeout(r->aio, 15000);
    assert_int_equal(nng_msg_alloc(&m, kvtier__request__get_packed_size(&q)), 0);
    kvtier__request__pack(&q, nng_msg_body(m));
    nng_aio_set_msg(r->aio, m);
    nng_ctx_send(r->ctx, r->aio);
    nng_aio_wait(r->aio);
    assert_int_equal(nng_aio_result(r->aio), 0);
    nng_ctx_recv(r->ctx, r->aio);
}

/* Wait for r's response; its error code. */
static int answer(struct rawreq *r)
{
    nng_aio_wait(r->aio);
    assert_int_equal(nng_aio_result(r->aio), 0);
    nng_msg *m = nng_aio_get_msg(r->aio);
    Kvtier__Response *rsp = kvtier__response__unpack(NULL, nng_msg_len(m), nng_msg_body(m));
    assert_non_null(rsp);
    int err = rsp->err;
    if (err) fprintf(stderr, "answer: %d %s\n", err, rsp->msg);
    kvtier__response__free_unpacked(rsp, NULL);
    nng_msg_free(m);
    nng_aio_free(r->aio);
    nng_ctx_close(r->ctx);
    return err;
}

static void test_cap_per_client(void **state)
{
    (void)state;
    nng_socket s;
    char url[400];
    struct rawreq a[CAP + 1], again;
    kvt_key k[2] = {td_key(900), td_key(901)};
    size_t n = 99;
    snprintf(url, sizeof url, "ipc://%s", T.d[0].sock);
    assert_int_equal(nng_req0_open(&s), 0);
    nng_socket_set_ms(s, NNG_OPT_REQ_RESENDTIME, NNG_DURATION_INFINITE);
    assert_int_equal(nng_dial(s, url, NULL, 0), 0);
    kill(T.d[1].pid, SIGSTOP);
    for (int i = 0; i < CAP; i++) send_lookup(s, &a[i], 1 + (uint64_t)i, 100 + 10 * (uint64_t)i);
    usleep(300 * 1000); /* let both park before the next one comes */
    send_lookup(s, &a[CAP], 9, 300);
    assert_int_equal(answer(&a[CAP]), KVT_EBUSY); /* past A's cap, at once */
    /* B is not affected by A's cap: its LOOKUP parks and is answered. */
    kvt_client *b = td_connect(&T.d[0]);
    assert_int_equal(kvt_lookup(b, NS, k, 2, &n, NULL), KVT_OK);
    assert_int_equal(n, 0);
    for (int i = 0; i < CAP; i++) assert_int_equal(answer(&a[i]), KVT_OK);
    /* A's parks are answered: A may park again. */
    send_lookup(s, &again, 10, 400);
    assert_int_equal(answer(&again), KVT_OK);
    kill(T.d[1].pid, SIGCONT);
    kvt_close(b);
    tc_close(s);
    assert_true(td_alive(&T.d[0]));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_cap_per_client, setup, teardown),
    };
    if (getenv("KVT_TEST_FILTER")) cmocka_set_test_filter(getenv("KVT_TEST_FILTER"));
    return cmocka_run_group_tests(tests, NULL, NULL);
}
