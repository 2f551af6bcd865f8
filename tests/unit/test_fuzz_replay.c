/*
 * test_fuzz_replay.c -- the wire decoder and every handler, in process,
 * against valid requests of every kind, thousands of deterministic
 * mutations of them, and every file in tests/fuzz/corpus/ (inputs kept
 * from `make fuzz` runs). Under the ASan+UBSan build this is where a memory
 * error in request handling shows up. The harness aborts if the daemon
 * ever answers with bytes that do not decode.
 */
#include <dirent.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "fuzz_harness.h"
#include "kvtier.h"
#include "kvtier.pb-c.h"
#include "mutate.h"

#define MAX_SEED 4096

struct seed {
    uint8_t b[MAX_SEED];
    size_t n;
};

static ProtobufCBinaryData K[4];
static uint8_t kb[4][32];

static void pack(struct seed *s, Kvtier__Request *q)
{
    s->n = kvtier__request__pack(q, s->b);
}

/* One valid request of each kind, sharing keys so they interact. */
static size_t make_seeds(struct seed *s)
{
    size_t n = 0;
    for (int i = 0; i < 4; i++) {
        memset(kb[i], i + 1, 32);
        K[i] = (ProtobufCBinaryData){32, kb[i]};
    }
    uint64_t sizes[4] = {4096, 8192, 100, 1 << 20}, cs[4] = {1, 2, 3, 4};
    Kvtier__Request q = KVTIER__REQUEST__INIT;
    Kvtier__Hello h = KVTIER__HELLO__INIT;
    h.proto_version = KVT_PROTO_VERSION;
    q.body_case = KVTIER__REQUEST__BODY_HELLO, q.hello = &h, pack(&s[n++], &q);
    Kvtier__PutBegin pb = KVTIER__PUT_BEGIN__INIT;
    pb.ns = "f", pb.n_keys = pb.n_sizes = 4, pb.keys = K, pb.sizes = sizes;
    q.body_case = KVTIER__REQUEST__BODY_PUT_BEGIN, q.put_begin = &pb, pack(&s[n++], &q);
    Kvtier__PutCommit pc = KVTIER__PUT_COMMIT__INIT;
    pc.lease = 1, pc.n_checksums = 4, pc.checksums = cs;
    q.body_case = KVTIER__REQUEST__BODY_PUT_COMMIT, q.put_commit = &pc, pack(&s[n++], &q);
    Kvtier__Put p = KVTIER__PUT__INIT;
    p.ns = "f", p.n_keys = p.n_data = 2, p.keys = K, p.data = K + 2;
    q.body_case = KVTIER__REQUEST__BODY_PUT, q.put = &p, pack(&s[n++], &q);
    Kvtier__Lookup lk = KVTIER__LOOKUP__INIT;
    lk.ns = "f", lk.n_keys = 4, lk.keys = K;
    q.body_case = KVTIER__REQUEST__BODY_LOOKUP, q.lookup = &lk, pack(&s[n++], &q);
    Kvtier__Get g = KVTIER__GET__INIT;
    g.ns = "f", g.n_keys = 4, g.keys = K;
    q.body_case = KVTIER__REQUEST__BODY_GET, q.get = &g, pack(&s[n++], &q);
    g.inline_ = 1, pack(&s[n++], &q);
    Kvtier__LeaseReq lr = KVTIER__LEASE_REQ__INIT;
    lr.lease = 2;
    q.body_case = KVTIER__REQUEST__BODY_RELEASE, q.release = &lr, pack(&s[n++], &q);
    q.body_case = KVTIER__REQUEST__BODY_PUT_ABORT, q.put_abort = &lr, pack(&s[n++], &q);
    Kvtier__Delete d = KVTIER__DELETE__INIT;
    d.ns = "f", d.n_keys = 2, d.keys = K;
    q.body_case = KVTIER__REQUEST__BODY_DELETE, q.delete_ = &d, pack(&s[n++], &q);
    Kvtier__Clear cl = KVTIER__CLEAR__INIT;
    cl.ns = "f";
    q.body_case = KVTIER__REQUEST__BODY_CLEAR, q.clear = &cl, pack(&s[n++], &q);
    Kvtier__Stats st = KVTIER__STATS__INIT;
    q.body_case = KVTIER__REQUEST__BODY_STATS, q.stats = &st, pack(&s[n++], &q);
    Kvtier__List ls = KVTIER__LIST__INIT;
    q.body_case = KVTIER__REQUEST__BODY_LIST, q.list = &ls, pack(&s[n++], &q);
    Kvtier__Evict ev = KVTIER__EVICT__INIT;
    q.body_case = KVTIER__REQUEST__BODY_EVICT, q.evict = &ev, pack(&s[n++], &q);
    return n;
}

static uint64_t rng = 0x9E3779B97F4A7C15ull;

static void test_valid_requests(void **state)
{
    (void)state;
    static struct seed s[32];
    size_t n = make_seeds(s);
    assert_int_equal(kvt_fuzz_one(s[0].b, s[0].n), 0); /* HELLO */
    assert_int_equal(kvt_fuzz_one(s[11].b, s[11].n), 0); /* STATS */
    for (size_t i = 0; i < n; i++) kvt_fuzz_one(s[i].b, s[i].n);
    kvt_fuzz_reset();
}

static void test_mutations(void **state)
{
    (void)state;
    static struct seed s[32];
    uint8_t buf[MAX_SEED];
    size_t n = make_seeds(s), len;
    for (int round = 0; round < 20000; round++) {
        const struct seed *p = &s[mut_next(&rng) % n];
        memcpy(buf, p->b, p->n);
        len = p->n;
        for (int m = 1 + (int)(mut_next(&rng) % 4); m > 0; m--)
            mut_one(&rng, buf, &len, MAX_SEED);
        kvt_fuzz_one(buf, len);
    }
    kvt_fuzz_reset();
}

static void test_corpus(void **state)
{
    (void)state;
    const char *dir = getenv("KVT_FUZZ_CORPUS") ? getenv("KVT_FUZZ_CORPUS")
                                                 : "tests/fuzz/corpus";
    DIR *d = opendir(dir);
    if (!d) skip();
    static uint8_t buf[1 << 20];
    struct dirent *e;
    while ((e = readdir(d))) {
        char path[1024];
        if (e->d_name[0] == '.') continue;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        FILE *f = fopen(path, "rb");
        if (!f) continue;
        size_t len = fread(buf, 1, sizeof buf, f);
        fclose(f);
        kvt_fuzz_one(buf, len);
    }
    closedir(d);
    kvt_fuzz_reset();
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_valid_requests),
        cmocka_unit_test(test_mutations),
        cmocka_unit_test(test_corpus),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
