/*
 * bench_index.c -- index memory per cached chunk, and LOOKUP throughput
 * with 1, 4 and 16 client processes against bare nng round trips.
 *
 * Design: a node caches hundreds of thousands of chunks, so the index
 * must stay small per chunk; the daemon reports its own index memory
 * (index entries, hash buckets and allocator metadata) in STATS. We fill a
 * 1 GiB pool with 4 KiB chunks in chains of 128 (each chunk the parent of
 * the next, as an engine puts a prompt) and divide index_bytes by chunks.
 * Throughput: worker processes (this binary re-executed, one kvt_client
 * each) send LOOKUPs of a random cached 128-key chain as fast as they can
 * for a fixed window that all of them start together; the baseline is the
 * same number of processes doing bare nng round trips of the same sizes
 * against a one-thread rep0 echo, which, like kvtierd's core thread,
 * serves one request at a time. Workers rebuild keys from (seed, index),
 * so both variants pay the same key generation. Counts come back through
 * a pipe, one line per worker.
 */
#include "common.h"

#define NS "llama-3-8b/bf16/vllm-flash/tp1r0"
#define SEED 11
#define CHAIN 128
#define NCHAINS 1800 /* 230400 chunks of 4 KiB: 88% of the pool */
#define CHUNK 4096
#define WINDOW_NS 2500000000ull
#define LEAD_NS 1000000000ull

/* ------------------------------------------------------------ workers -- */

struct work {
    const char *kind, *url;
    uint64_t nchains, start, end;
    int fd;
    size_t req_size;
};

static void chain_keys(uint64_t chain, kvt_key *keys)
{
    for (uint64_t i = 0; i < CHAIN; i++) keys[i] = bench_key(SEED, chain * CHAIN + i);
}

/* Wait for the common start; a worker that comes late counts over a
 * shorter window, so the aggregate is then an underestimate: say so. */
static void wait_start(const struct work *w)
{
    if (bench_now_ns() > w->start)
        fprintf(stderr, "bench_index: a %s worker started %.0f ms late\n", w->kind,
                (double)(bench_now_ns() - w->start) / 1e6);
    bench_sleep_until(w->start);
}

static uint64_t worker_kvt(const struct work *w, uint64_t *rng)
{
    kvt_client *c;
    kvt_key keys[CHAIN];
    size_t n;
    BENCH_KVT(NULL, kvt_connect(w->url, &c));
    uint64_t count = 0;
    wait_start(w);
    while (bench_now_ns() < w->end) {
        chain_keys(bench_mix((*rng)++) % w->nchains, keys);
        BENCH_KVT(c, kvt_lookup(c, NS, keys, CHAIN, &n, NULL));
        if (n != CHAIN) bench_die("cached chain: %zu of %d present", n, CHAIN);
        count++;
    }
    kvt_close(c);
    return count;
}

static uint64_t worker_nng(const struct work *w, uint64_t *rng)
{
    nng_socket s = bench_nng_dial(w->url);
    uint8_t *body = bench_buf(w->req_size, 5);
    kvt_key keys[CHAIN];
    uint64_t count = 0;
    if (w->req_size < sizeof keys) bench_die("request size %zu too small", w->req_size);
    wait_start(w);
    while (bench_now_ns() < w->end) {
        chain_keys(bench_mix((*rng)++) % w->nchains, keys);
        memcpy(body + w->req_size - sizeof keys, keys, sizeof keys);
        bench_nng_rt(s, body, w->req_size);
        count++;
    }
    nng_close(s);
    return count;
}

/* --worker KIND URL NCHAINS START END FD REQ_SIZE: writes "COUNT\n" to FD. */
static int worker_main(char **argv)
{
    struct work w = {argv[2], argv[3], strtoull(argv[4], NULL, 10),
                     strtoull(argv[5], NULL, 10), strtoull(argv[6], NULL, 10),
                     atoi(argv[7]), strtoull(argv[8], NULL, 10)};
    uint64_t rng = (uint64_t)getpid() << 32, count;
    count = strcmp(w.kind, "kvt") == 0 ? worker_kvt(&w, &rng) : worker_nng(&w, &rng);
    dprintf(w.fd, "%llu\n", (unsigned long long)count);
    return 0;
}

/* ------------------------------------------------------------- parent -- */

static pid_t spawn_worker(const char *kind, const char *url, uint64_t start,
                         int fd, size_t req_size)
{
    char a[5][32];
    snprintf(a[0], sizeof a[0], "%d", NCHAINS);
    snprintf(a[1], sizeof a[1], "%llu", (unsigned long long)start);
    snprintf(a[2], sizeof a[2], "%llu", (unsigned long long)(start + WINDOW_NS));
    snprintf(a[3], sizeof a[3], "%d", fd);
    snprintf(a[4], sizeof a[4], "%zu", req_size);
    char *argv[] = {program_invocation_name, "--worker", (char *)kind, (char *)url,
                    a[0], a[1], a[2], a[3], a[4], NULL};
    return bench_spawn("/proc/self/exe", argv, "");
}

/* Sum the workers' counts and reap them; any failed worker fails us. */
static uint64_t collect(int rfd, const pid_t *pids, int nproc)
{
    FILE *f = fdopen(rfd, "r");
    unsigned long long v;
    uint64_t sum = 0;
    int got = 0, st;
    while (f && fscanf(f, "%llu", &v) == 1) sum += v, got++;
    if (f) fclose(f);
    for (int i = 0; i < nproc; i++) {
        if (waitpid(pids[i], &st, 0) != pids[i]) bench_die("waitpid: %s", strerror(errno));
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) bench_die("a lookup worker failed");
    }
    if (got != nproc) bench_die("%d of %d workers reported", got, nproc);
    return sum;
}

/* Lookups per second of nproc workers of one kind. */
static double run_workers(const char *kind, const char *url, int nproc,
                          size_t req_size)
{
    int p[2];
    pid_t pids[16];
    if (nproc > 16 || pipe(p) != 0) bench_die("pipe: %s", strerror(errno));
    uint64_t start = bench_now_ns() + LEAD_NS;
    for (int i = 0; i < nproc; i++) pids[i] = spawn_worker(kind, url, start, p[1], req_size);
    close(p[1]);
    return (double)collect(p[0], pids, nproc) / ((double)WINDOW_NS / 1e9);
}

static void fill(kvt_client *c)
{
    static uint8_t src[CHUNK];
    kvt_key keys[CHAIN];
    size_t sizes[CHAIN];
    kvt_chunk ch[CHAIN];
    uint64_t cs[CHAIN];
    kvt_lease l;
    bench_fill(src, CHUNK, 3);
    for (int i = 0; i < CHAIN; i++) sizes[i] = CHUNK;
    for (uint64_t n = 0; n < NCHAINS; n++) {
        chain_keys(n, keys);
        BENCH_KVT(c, kvt_put_begin(c, NS, keys, sizes, CHAIN, NULL, &l, ch));
        for (int i = 0; i < CHAIN; i++) cs[i] = kvt_copy_checksum(ch[i].data, src, CHUNK);
        BENCH_KVT(c, kvt_put_commit(c, l, ch, CHAIN, cs));
    }
}

static void report_memory(kvt_client *c)
{
    kvt_stats st;
    BENCH_KVT(c, kvt_stats_get(c, &st));
    if (st.chunks != (uint64_t)NCHAINS * CHAIN)
        bench_die("%llu chunks cached after putting %d (evicted below the "
                  "high watermark?)", (unsigned long long)st.chunks, NCHAINS * CHAIN);
    double per = (double)st.index_bytes / (double)st.chunks;
    printf("index memory  %llu chunks of 4KiB  index_bytes %llu  %.1f B/chunk "
           "(target <= 128) %s\n", (unsigned long long)st.chunks,
           (unsigned long long)st.index_bytes, per, bench_verdict(per <= 128));
    fflush(stdout);
}

int main(int argc, char **argv)
{
    static const int procs[] = {1, 4, 16};
    struct bench_daemon d;
    size_t req, rsp;
    char echo[256];
    bench_echo_dispatch(argc, argv);
    if (argc == 9 && strcmp(argv[1], "--worker") == 0) return worker_main(argv);
    bench_lookup_sizes(NS, CHAIN, &req, &rsp);
    bench_echo_start(rsp, echo, sizeof echo);
    kvt_client *c = bench_daemon_start(&d, "1G");
    fill(c);
    report_memory(c);
    for (size_t i = 0; i < sizeof procs / sizeof procs[0]; i++) {
        double k = run_workers("kvt", d.url, procs[i], req);
        double b = run_workers("nng", echo, procs[i], req);
        printf("index lookups %2d procs  kvtier %.0f/s  bare nng %.0f/s  ratio %.2f "
               "(%d-key LOOKUPs; no target)\n", procs[i], k, b, k / b, CHAIN);
        fflush(stdout);
    }
    bench_daemon_stop(&d, c);
    return 0;
}
