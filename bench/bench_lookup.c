/*
 * bench_lookup.c -- latency of LOOKUP of a 128-key chain against a bare
 * nng req/rep round trip of the same message sizes.
 *
 * Design: a LOOKUP is one request/response exchange, so its floor is the
 * transport: nng req0 -> rep0 over ipc, with a request as long as the
 * packed LOOKUP of 128 keys and a reply as long as kvtierd's answer (sizes
 * from the protobuf-c packer, not guessed). The baseline server is the
 * bench binary re-executed as a one-thread rep0 echo on its own socket.
 * What kvtierd adds on top is protobuf packing and unpacking on both sides,
 * the hop from nng's thread to the core thread through the eventfd queue,
 * and 128 index probes. The chain (128 chunks of 4 KiB, each the parent of
 * the next) is put once; the two variants are timed in alternating rounds
 * of 2000 calls and every call's latency is kept for p50 and p99.
 */
#include "common.h"

#define NS "llama-3-8b/bf16/vllm-flash/tp1r0"
#define NKEYS 128
#define CHUNK 4096
#define ROUNDS 10
#define PER_ROUND 2000

struct lk {
    kvt_client *c;
    nng_socket bare;
    kvt_key keys[NKEYS];
    size_t req_size, rsp_size;
    uint8_t *req_body;
};

static void put_chain(struct lk *l)
{
    static uint8_t data[NKEYS][CHUNK];
    const void *bufs[NKEYS];
    size_t sizes[NKEYS], n_new;
    for (size_t i = 0; i < NKEYS; i++) {
        l->keys[i] = bench_key(7, i);
        bench_fill(data[i], CHUNK, i);
        bufs[i] = data[i];
        sizes[i] = CHUNK;
    }
    BENCH_KVT(l->c, kvt_put(l->c, NS, l->keys, bufs, sizes, NKEYS, NULL, &n_new));
    if (n_new != NKEYS) bench_die("put of a fresh chain: %zu of %d new", n_new, NKEYS);
}

/* The answers must be right before their speed means anything. */
static void check_answers(struct lk *l)
{
    kvt_tier tiers[NKEYS];
    kvt_key other[NKEYS];
    size_t n;
    BENCH_KVT(l->c, kvt_lookup(l->c, NS, l->keys, NKEYS, &n, tiers));
    if (n != NKEYS) bench_die("lookup of a cached chain: %zu of %d present", n, NKEYS);
    for (size_t i = 0; i < NKEYS; i++)
        if (tiers[i] != KVT_TIER_DRAM) bench_die("key %zu: tier %d, not dram", i, tiers[i]);
    for (size_t i = 0; i < NKEYS; i++) other[i] = bench_key(8, i);
    BENCH_KVT(l->c, kvt_lookup(l->c, NS, other, NKEYS, &n, NULL));
    if (n != 0) bench_die("lookup of an absent chain: %zu present", n);
    size_t got = bench_nng_rt(l->bare, l->req_body, l->req_size);
    if (got != l->rsp_size) bench_die("echo replied %zu bytes, not %zu", got, l->rsp_size);
}

static void one_kvt(struct lk *l)
{
    size_t n;
    BENCH_KVT(l->c, kvt_lookup(l->c, NS, l->keys, NKEYS, &n, NULL));
    if (n != NKEYS) bench_die("chain partly gone: %zu of %d present", n, NKEYS);
}

/* Latency in microseconds of each of count calls, into v. */
static void run_round(struct lk *l, int kvt, double *v, size_t count)
{
    for (size_t i = 0; i < count; i++) {
        uint64_t t0 = bench_now_ns();
        if (kvt) one_kvt(l);
        else bench_nng_rt(l->bare, l->req_body, l->req_size);
        v[i] = (double)(bench_now_ns() - t0) / 1e3;
    }
}

static void report(double *k, double *b, size_t n, const struct lk *l)
{
    double k50 = bench_quantile(k, n, 0.5), k99 = bench_quantile(k, n, 0.99);
    double b50 = bench_quantile(b, n, 0.5), b99 = bench_quantile(b, n, 0.99);
    printf("lookup %d keys  kvtier p50 %.1f us p99 %.1f us  bare nng (%zu/%zu B) "
           "p50 %.1f us p99 %.1f us  ratio p50 %.2f p99 %.2f (target p99 <= 1.5) %s\n",
           NKEYS, k50, k99, l->req_size, l->rsp_size, b50, b99, k50 / b50,
           k99 / b99, bench_verdict(k99 / b99 <= 1.5));
}

int main(int argc, char **argv)
{
    static double k[ROUNDS * PER_ROUND], b[ROUNDS * PER_ROUND];
    static struct lk l;
    struct bench_daemon d;
    char url[256];
    bench_echo_dispatch(argc, argv);
    bench_lookup_sizes(NS, NKEYS, &l.req_size, &l.rsp_size);
    l.req_body = bench_buf(l.req_size, 9);
    bench_echo_start(l.rsp_size, url, sizeof url);
    l.c = bench_daemon_start(&d, "256M");
    l.bare = bench_nng_dial(url);
    put_chain(&l);
    check_answers(&l);
    run_round(&l, 1, k, 1000); /* warm-up */
    run_round(&l, 0, b, 1000);
    for (size_t r = 0; r < ROUNDS; r++) {
        run_round(&l, 0, b + r * PER_ROUND, PER_ROUND);
        run_round(&l, 1, k + r * PER_ROUND, PER_ROUND);
    }
    report(k, b, ROUNDS * PER_ROUND, &l);
    nng_close(l.bare);
    bench_daemon_stop(&d, l.c);
    return 0;
}
