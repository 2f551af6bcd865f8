/*
 * test_badinput.c -- bad bytes and bad requests against a real kvtierd.
 *
 * Every case must come back as an error response with a kvt_err code, and
 * the daemon and the same connection must keep serving afterwards.
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

#include "client_internal.h"
#include "daemon.h"
#include "kvtier.h"

static struct tdaemon D;

static int setup(void **state)
{
    (void)state;
    const char *extra[] = {"--max-keys", "64", "--max-chunk-bytes", "1M",
                           "--max-msg-bytes", "2M", NULL};
    return td_start(&D, extra);
}

static int teardown(void **state)
{
    (void)state;
    int rc = td_stop(&D);
    td_cleanup(&D);
    return rc;
}

/* The connection still answers a STATS. */
static void still_serving(kvt_client *c)
{
    kvt_stats s;
    assert_int_equal(kvt_stats_get(c, &s), KVT_OK);
}

/* Send raw bytes; expect an error response with one of the codes. */
static int raw_err(kvt_client *c, const void *buf, size_t len)
{
    Kvtier__Response *r = NULL;
    assert_int_equal(kvtc_call_raw(c, buf, len, &r), KVT_OK);
    int err = r->err;
    assert_true(r->msg != NULL && r->msg[0] != '\0');
    kvtier__response__free_unpacked(r, NULL);
    return err;
}

static void test_random_bytes(void **state)
{
    (void)state;
    kvt_client *c = td_connect(&D);
    uint8_t buf[512];
    srand(42);
    int errors = 0;
    for (int i = 0; i < 300; i++) {
        size_t len = (size_t)(rand() % (int)sizeof buf) + 1;
        for (size_t j = 0; j < len; j++) buf[j] = (uint8_t)rand();
        int err = raw_err(c, buf, len);
        errors += err == KVT_EPROTO || err == KVT_EINVAL;
    }
    assert_int_equal(errors, 300);
    assert_int_equal(raw_err(c, "", 0), KVT_EINVAL); /* empty: no request kind */
    still_serving(c);
    kvt_close(c);
}

static size_t pack_put_begin(uint8_t **out, size_t n_keys, size_t key_len,
                             uint64_t size)
{
    Kvtier__Request q = KVTIER__REQUEST__INIT;
    Kvtier__PutBegin pb = KVTIER__PUT_BEGIN__INIT;
    ProtobufCBinaryData *keys = calloc(n_keys, sizeof *keys);
    uint64_t *sizes = calloc(n_keys, sizeof *sizes);
    uint8_t *kb = calloc(n_keys, key_len ? key_len : 1);
    for (size_t i = 0; i < n_keys; i++) {
        kb[i * key_len] = (uint8_t)i;
        keys[i] = (ProtobufCBinaryData){key_len, kb + i * key_len};
        sizes[i] = size;
    }
    pb.ns = "bad";
    pb.n_keys = pb.n_sizes = n_keys;
    pb.keys = keys;
    pb.sizes = sizes;
    q.id = 7;
    q.body_case = KVTIER__REQUEST__BODY_PUT_BEGIN;
    q.put_begin = &pb;
    size_t len = kvtier__request__get_packed_size(&q);
    *out = malloc(len);
    kvtier__request__pack(&q, *out);
    free(keys);
    free(sizes);
    free(kb);
    return len;
}

static void test_truncated(void **state)
{
    (void)state;
    kvt_client *c = td_connect(&D);
    uint8_t *buf;
    size_t len = pack_put_begin(&buf, 4, KVT_KEY_LEN, 4096);
    kvt_stats before, after;
    assert_int_equal(kvt_stats_get(c, &before), KVT_OK);
    for (size_t cut = 1; cut < len; cut++) {
        Kvtier__Response *r = NULL;
        assert_int_equal(kvtc_call_raw(c, buf, cut, &r), KVT_OK);
        /* A prefix may still parse (fewer keys than sizes, say); it must
         * then be refused or, if complete enough, be a valid put. */
        if (r->err == 0) {
            assert_int_equal(r->body_case, KVTIER__RESPONSE__BODY_PUT_BEGIN);
            Kvtier__LeaseReq lr = KVTIER__LEASE_REQ__INIT;
            Kvtier__Request q = KVTIER__REQUEST__INIT;
            Kvtier__Response *r2;
            lr.lease = r->put_begin->lease;
            q.body_case = KVTIER__REQUEST__BODY_PUT_ABORT;
            q.put_abort = &lr;
            assert_int_equal(kvtc_call(c, &q, &r2), KVT_OK);
            kvtier__response__free_unpacked(r2, NULL);
        } else {
            assert_true(r->err == KVT_EPROTO || r->err == KVT_EINVAL);
        }
        kvtier__response__free_unpacked(r, NULL);
    }
    free(buf);
    assert_int_equal(kvt_stats_get(c, &after), KVT_OK);
    assert_int_equal(after.used_bytes, before.used_bytes);
    assert_int_equal(after.leases, 0);
    kvt_close(c);
}

static void test_oversized_fields(void **state)
{
    (void)state;
    kvt_client *c = td_connect(&D);
    /* Field 12 (put_begin), length-delimited, claiming 2 GiB. */
    const uint8_t huge[] = {0x62, 0xff, 0xff, 0xff, 0xff, 0x07, 0x0a, 0x01};
    assert_int_equal(raw_err(c, huge, sizeof huge), KVT_EPROTO);
    /* Unknown request kind: field 99 as a varint. */
    const uint8_t unknown[] = {0x98, 0x06, 0x01};
    assert_int_equal(raw_err(c, unknown, sizeof unknown), KVT_EINVAL);
    uint8_t *buf;
    size_t len = pack_put_begin(&buf, 65, KVT_KEY_LEN, 4096);
    assert_int_equal(raw_err(c, buf, len), KVT_ETOOBIG);
    free(buf);
    len = pack_put_begin(&buf, 2, 31, 4096);
    assert_int_equal(raw_err(c, buf, len), KVT_EINVAL);
    free(buf);
    len = pack_put_begin(&buf, 1, KVT_KEY_LEN, 2u << 20);
    assert_int_equal(raw_err(c, buf, len), KVT_ETOOBIG);
    free(buf);
    len = pack_put_begin(&buf, 1, KVT_KEY_LEN, 0);
    assert_int_equal(raw_err(c, buf, len), KVT_EINVAL);
    free(buf);
    still_serving(c);
    kvt_close(c);
}

static void test_bad_namespaces_and_version(void **state)
{
    (void)state;
    kvt_client *c = td_connect(&D);
    kvt_key k = td_key(1);
    size_t present;
    Kvtier__Request q = KVTIER__REQUEST__INIT;
    Kvtier__Lookup lk = KVTIER__LOOKUP__INIT;
    ProtobufCBinaryData kb = {KVT_KEY_LEN, k.b};
    Kvtier__Response *r;
    lk.ns = "has space";
    lk.n_keys = 1;
    lk.keys = &kb;
    q.body_case = KVTIER__REQUEST__BODY_LOOKUP;
    q.lookup = &lk;
    assert_int_equal(kvtc_call(c, &q, &r), KVT_EINVAL);
    lk.ns = "";
    assert_int_equal(kvtc_call(c, &q, &r), KVT_EINVAL);
    lk.n_keys = 0;
    lk.ns = "ok";
    assert_int_equal(kvtc_call(c, &q, &r), KVT_EINVAL);
    assert_int_equal(kvt_lookup(c, "has space", &k, 1, &present, NULL), KVT_EINVAL);
    Kvtier__Hello h = KVTIER__HELLO__INIT;
    h.proto_version = 999;
    q.body_case = KVTIER__REQUEST__BODY_HELLO;
    q.hello = &h;
    assert_int_equal(kvtc_call(c, &q, &r), KVT_EPROTO);
    assert_non_null(strstr(kvt_last_error(c), "999"));
    still_serving(c);
    kvt_close(c);
}

static void test_foreign_and_missing_leases(void **state)
{
    (void)state;
    kvt_client *a = td_connect(&D), *b = td_connect(&D);
    kvt_key k = td_key(2);
    size_t size = 4096, got;
    kvt_chunk ch, rch;
    kvt_lease wl, rl;
    assert_int_equal(kvt_put_begin(a, "leases", &k, &size, 1, NULL, &wl, &ch), KVT_OK);
    /* b may not commit, abort or release a's leases. */
    assert_int_equal(kvt_put_commit(b, wl, &ch, 1, NULL), KVT_EPERM);
    assert_int_equal(kvt_put_abort(b, wl), KVT_EPERM);
    uint64_t cs[2] = {1, 2};
    assert_int_equal(kvt_put_commit(a, wl, &ch, 2, cs), KVT_EINVAL); /* count */
    memset(ch.data, 1, size);
    assert_int_equal(kvt_put_commit(a, wl, &ch, 1, NULL), KVT_OK);
    assert_int_equal(kvt_get(a, "leases", &k, 1, &rl, &rch, &got), KVT_OK);
    assert_int_equal(kvt_release(b, rl), KVT_EPERM);
    assert_int_equal(kvt_put_abort(a, rl), KVT_ENOENT); /* wrong kind */
    assert_int_equal(kvt_release(a, 123456789), KVT_ENOENT);
    assert_int_equal(kvt_release(a, rl), KVT_OK);
    still_serving(a);
    still_serving(b);
    kvt_close(a);
    kvt_close(b);
}

static void test_message_over_limit(void **state)
{
    (void)state;
    kvt_client *c = td_connect(&D);
    size_t len = 3u << 20; /* over --max-msg-bytes 2M */
    uint8_t *buf = calloc(1, len);
    Kvtier__Response *r = NULL;
    kvt_set_timeout(c, 1500);
    kvt_err e = kvtc_call_raw(c, buf, len, &r);
    /* The transport drops an over-limit message; the caller gets a
     * timeout or a closed connection, never a crash of the daemon. */
    assert_true(e == KVT_ETIMEDOUT || e == KVT_ECLOSED || e == KVT_OK);
    if (r) kvtier__response__free_unpacked(r, NULL);
    free(buf);
    kvt_close(c);
    c = td_connect(&D);
    still_serving(c);
    kvt_close(c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_random_bytes),
        cmocka_unit_test(test_truncated),
        cmocka_unit_test(test_oversized_fields),
        cmocka_unit_test(test_bad_namespaces_and_version),
        cmocka_unit_test(test_foreign_and_missing_leases),
        cmocka_unit_test(test_message_over_limit),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
