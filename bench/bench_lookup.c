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
 * the next) is put once; the variants are timed in alternating rounds
 * of 2000 calls and every call's latency is kept for p50 and p99.
 *
 * Local clients talk to kvtierd over its fast channel (a Unix stream
 * socket served by the core thread), so two more lines give the whole
 * picture: kvtier with the fast channel switched off (KVTIER_NO_FAST, every
 * request through nng), and a bare Unix stream round trip of the same
 * sizes to a one-thread echo process, the floor of the fast channel.
 */
#include <sys/socket.h>

#include "common.h"

#define NS "llama-3-8b/bf16/vllm-flash/tp1r0"
#define NKEYS 128
#define CHUNK 4096
#define ROUNDS 10
#define PER_ROUND 2000

struct lk {
    kvt_client *c, *c_nng;
    int ufd; /* bare Unix stream echo */
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

static void one_kvt(struct lk *l, kvt_client *c)
{
    size_t n;
    BENCH_KVT(c, kvt_lookup(c, NS, l->keys, NKEYS, &n, NULL));
    if (n != NKEYS) bench_die("chain partly gone: %zu of %d present", n, NKEYS);
}

/* ---- a bare Unix stream echo: 4-byte length, body; reply rsp_size ---- */

static int io_full(int fd, void *buf, size_t n, int wr)
{
    uint8_t *p = buf;
    while (n) {
        ssize_t r = wr ? write(fd, p, n) : read(fd, p, n);
        if (r <= 0) return -1;
        p += r;
        n -= (size_t)r;
    }
    return 0;
}

static void unix_echo(int fd, size_t rsp_size)
{
    static uint8_t buf[1 << 16];
    uint32_t len;
    while (io_full(fd, &len, 4, 0) == 0 && len <= sizeof buf &&
           io_full(fd, buf, len, 0) == 0) {
        len = (uint32_t)rsp_size;
        if (io_full(fd, &len, 4, 1) || io_full(fd, buf, rsp_size, 1)) break;
    }
    _exit(0);
}

/* Fork the echo before any thread exists. */
static int unix_echo_start(size_t rsp_size)
{
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0)
        bench_die("socketpair: %s", strerror(errno));
    pid_t pid = fork();
    if (pid == 0) {
        close(sv[0]);
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        unix_echo(sv[1], rsp_size);
    }
    close(sv[1]);
    return sv[0];
}

static void unix_rt(struct lk *l)
{
    static uint8_t rsp[1 << 16];
    uint32_t len = (uint32_t)l->req_size;
    if (io_full(l->ufd, &len, 4, 1) || io_full(l->ufd, l->req_body, l->req_size, 1) ||
        io_full(l->ufd, &len, 4, 0) || len > sizeof rsp || io_full(l->ufd, rsp, len, 0))
        bench_die("unix echo failed");
}

enum variant { V_BARE_NNG, V_KVT, V_KVT_NNG, V_BARE_UNIX, V_COUNT };

/* Latency in microseconds of each of count calls, into v. */
static void run_round(struct lk *l, int which, double *v, size_t count)
{
    for (size_t i = 0; i < count; i++) {
        uint64_t t0 = bench_now_ns();
        if (which == V_KVT) one_kvt(l, l->c);
        else if (which == V_KVT_NNG) one_kvt(l, l->c_nng);
        else if (which == V_BARE_UNIX) unix_rt(l);
        else bench_nng_rt(l->bare, l->req_body, l->req_size);
        v[i] = (double)(bench_now_ns() - t0) / 1e3;
    }
}

static void report(double **v, size_t n, const struct lk *l)
{
    double p50[V_COUNT], p99[V_COUNT];
    for (int i = 0; i < V_COUNT; i++) {
        p50[i] = bench_quantile(v[i], n, 0.5);
        p99[i] = bench_quantile(v[i], n, 0.99);
    }
    printf("lookup %d keys  kvtier p50 %.1f us p99 %.1f us  bare nng (%zu/%zu B) "
           "p50 %.1f us p99 %.1f us  ratio p50 %.2f p99 %.2f (target p99 <= 1.5) %s\n",
           NKEYS, p50[V_KVT], p99[V_KVT], l->req_size, l->rsp_size, p50[V_BARE_NNG],
           p99[V_BARE_NNG], p50[V_KVT] / p50[V_BARE_NNG], p99[V_KVT] / p99[V_BARE_NNG],
           bench_verdict(p99[V_KVT] / p99[V_BARE_NNG] <= 1.5));
    printf("  kvtier over nng only p50 %.1f us p99 %.1f us (ratio to bare nng p99 %.2f); "
           "bare unix stream p50 %.1f us p99 %.1f us (kvtier / bare unix p99 %.2f)\n",
           p50[V_KVT_NNG], p99[V_KVT_NNG], p99[V_KVT_NNG] / p99[V_BARE_NNG],
           p50[V_BARE_UNIX], p99[V_BARE_UNIX], p99[V_KVT] / p99[V_BARE_UNIX]);
}

int main(int argc, char **argv)
{
    static double v[V_COUNT][ROUNDS * PER_ROUND];
    double *vp[V_COUNT] = {v[0], v[1], v[2], v[3]};
    static struct lk l;
    struct bench_daemon d;
    char url[256];
    bench_echo_dispatch(argc, argv);
    bench_lookup_sizes(NS, NKEYS, &l.req_size, &l.rsp_size);
    l.ufd = unix_echo_start(l.rsp_size);
    l.req_body = bench_buf(l.req_size, 9);
    bench_echo_start(l.rsp_size, url, sizeof url);
    l.c = bench_daemon_start(&d, "256M");
    setenv("KVTIER_NO_FAST", "1", 1);
    l.c_nng = bench_daemon_connect(&d);
    unsetenv("KVTIER_NO_FAST");
    l.bare = bench_nng_dial(url);
    put_chain(&l);
    check_answers(&l);
    for (int w = 0; w < V_COUNT; w++) run_round(&l, w, v[w], 1000); /* warm-up */
    for (size_t r = 0; r < ROUNDS; r++)
        for (int w = 0; w < V_COUNT; w++) run_round(&l, w, v[w] + r * PER_ROUND, PER_ROUND);
    report(vp, ROUNDS * PER_ROUND, &l);
    kvt_close(l.c_nng);
    close(l.ufd);
    nng_close(l.bare);
    bench_daemon_stop(&d, l.c);
    return 0;
}
