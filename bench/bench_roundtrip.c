/*
 * bench_roundtrip.c -- the zero-copy round trip against two plain memcpys.
 *
 * Design: an engine saving a chunk copies its buffer into the pool
 * (kvt_put_begin, kvt_copy_checksum, kvt_put_commit); loading it, it takes
 * a read lease (kvt_get), copies the chunk out and releases. That is two
 * copies plus four small requests, so the physical limit is two memcpys of
 * the same bytes through a buffer of the same size (src -> tmp -> dst),
 * which is the baseline. Every iteration puts a new key, as a cache does;
 * eviction makes room, so the pool space each put gets cycles through the
 * whole pool. Before timing, the pool is written through once, so the
 * timed loop takes no first-touch page faults (the baseline's buffers are
 * warm too); a new size evicts what the last one left, fragments and all. The
 * two are timed in alternating rounds and the medians compared; a second
 * line splits the kvtier time into its requests and its two copies. The
 * bytes are checked once outside the timed loops.
 */
#include "common.h"

#define NS "bench/roundtrip"
#define POOL "2G"
#define POOL_BYTES (2ull << 30)
#define ROUNDS 7
#define ROUND_NS 250000000ull /* per round and variant */

/* Where the time of a kvtier round trip goes, summed over iterations. */
struct phases {
    uint64_t req, copy_in, copy_out, n;
};

struct rt {
    kvt_client *c;
    uint8_t *src, *tmp, *dst;
    size_t size;
    uint64_t next_key;
    struct phases ph;
};

/* Put src as a new key, get it back into dst, and account the phases.
 * Returns the chunk checksum the get reported. */
static uint64_t kvt_round_trip(struct rt *r)
{
    uint64_t t[6];
    uint64_t cs = bench_kvt_rt(r->c, NS, bench_key(1, r->next_key++), r->src,
                               r->dst, r->size, t);
    r->ph.req += (t[1] - t[0]) + (t[3] - t[2]) + (t[5] - t[4]);
    r->ph.copy_in += t[2] - t[1];
    r->ph.copy_out += t[4] - t[3];
    r->ph.n++;
    return cs;
}

static void memcpy_twice(struct rt *r)
{
    memcpy(r->tmp, r->src, r->size);
    bench_clobber(r->tmp);
    memcpy(r->dst, r->tmp, r->size);
    bench_clobber(r->dst);
}

/* Bytes per second of one variant over one round. */
static double round_gbs(struct rt *r, int kvt)
{
    uint64_t t0 = bench_now_ns(), t, n = 0;
    do {
        if (kvt) kvt_round_trip(r);
        else memcpy_twice(r);
        n++;
    } while ((t = bench_now_ns()) - t0 < ROUND_NS || n < 3);
    return (double)(n * r->size) / (double)(t - t0);
}

/* Wrong bytes are a failure, not a figure. */
static void check_bytes(struct rt *r)
{
    bench_fill(r->src, r->size, 0xC0FFEE + r->size);
    memset(r->dst, 0, r->size);
    uint64_t cs = kvt_round_trip(r);
    if (memcmp(r->src, r->dst, r->size) != 0)
        bench_die("%zu-byte chunk came back with different bytes", r->size);
    if (cs != kvt_checksum(r->src, r->size))
        bench_die("%zu-byte chunk: recorded checksum %016llx, bytes hash to %016llx",
                  r->size, (unsigned long long)cs,
                  (unsigned long long)kvt_checksum(r->src, r->size));
}

/* Microseconds per iteration of the kvtier round trip, by phase. */
static void print_phases(const struct rt *r, const char *name, double mg)
{
    double n = (double)r->ph.n;
    printf("  %-6s per chunk: 4 requests %.0f us, copy in + checksum %.0f us, "
           "copy out %.0f us; memcpy x2 %.0f us\n", name, (double)r->ph.req / n / 1e3,
           (double)r->ph.copy_in / n / 1e3, (double)r->ph.copy_out / n / 1e3,
           (double)r->size / mg / 1e3);
}

static void measure(struct rt *r)
{
    double k[ROUNDS], m[ROUNDS];
    char name[32];
    check_bytes(r);
    for (int i = 0; i < 3; i++) { /* warm caches and branch predictors */
        kvt_round_trip(r);
        memcpy_twice(r);
    }
    memset(&r->ph, 0, sizeof r->ph);
    for (int i = 0; i < ROUNDS; i++) {
        m[i] = round_gbs(r, 0);
        k[i] = round_gbs(r, 1);
    }
    double kg = bench_quantile(k, ROUNDS, 0.5), mg = bench_quantile(m, ROUNDS, 0.5);
    double ratio = kg / mg;
    int targeted = r->size >= (2u << 20);
    printf("roundtrip %-6s  kvtier %5.2f GB/s  memcpy x2 %5.2f GB/s  ratio %.2f",
           bench_size_name(r->size, name, sizeof name), kg, mg, ratio);
    if (targeted) printf(" (target >= 0.85) %s\n", bench_verdict(ratio >= 0.85));
    else printf(" (no target)\n");
    print_phases(r, name, mg);
    fflush(stdout);
}

/* ---- batched: one request moves BATCH chunks, as an engine saving or
 * loading a whole prompt does (16 x 256 tokens = a 4096-token prompt). */

#define BATCH 16

/* Put BATCH new chunks of r->size from src (BATCH * size bytes), get them
 * back into dst: four requests for the whole batch. */
static void kvt_batch(struct rt *r)
{
    kvt_key keys[BATCH];
    size_t sizes[BATCH], got;
    kvt_chunk ch[BATCH];
    uint64_t cs[BATCH];
    kvt_lease wl, rl;
    for (int i = 0; i < BATCH; i++) {
        keys[i] = bench_key(1, r->next_key++);
        sizes[i] = r->size;
    }
    BENCH_KVT(r->c, kvt_put_begin(r->c, NS, keys, sizes, BATCH, NULL, &wl, ch));
    for (int i = 0; i < BATCH; i++)
        cs[i] = kvt_copy_checksum(ch[i].data, r->src + (size_t)i * r->size, r->size);
    BENCH_KVT(r->c, kvt_put_commit(r->c, wl, ch, BATCH, cs));
    BENCH_KVT(r->c, kvt_get(r->c, NS, keys, BATCH, &rl, ch, &got));
    if (got != BATCH) bench_die("batch get found %zu of %d chunks", got, BATCH);
    for (int i = 0; i < BATCH; i++)
        memcpy(r->dst + (size_t)i * r->size, ch[i].data, r->size);
    BENCH_KVT(r->c, kvt_release(r->c, rl));
}

static void memcpy_batch(struct rt *r)
{
    for (int i = 0; i < BATCH; i++) {
        memcpy(r->tmp + (size_t)i * r->size, r->src + (size_t)i * r->size, r->size);
        bench_clobber(r->tmp);
    }
    for (int i = 0; i < BATCH; i++) {
        memcpy(r->dst + (size_t)i * r->size, r->tmp + (size_t)i * r->size, r->size);
        bench_clobber(r->dst);
    }
}

static double batch_gbs(struct rt *r, int kvt)
{
    uint64_t t0 = bench_now_ns(), t, n = 0;
    do {
        if (kvt) kvt_batch(r);
        else memcpy_batch(r);
        n++;
    } while ((t = bench_now_ns()) - t0 < ROUND_NS || n < 3);
    return (double)(n * BATCH * r->size) / (double)(t - t0);
}

static void measure_batch(struct rt *r)
{
    double k[ROUNDS], m[ROUNDS];
    char name[32];
    bench_fill(r->src, BATCH * r->size, 0xBA7C4 + r->size);
    kvt_batch(r);
    if (memcmp(r->src, r->dst, BATCH * r->size) != 0)
        bench_die("batch of %d x %zu bytes came back different", BATCH, r->size);
    memcpy_batch(r);
    for (int i = 0; i < ROUNDS; i++) {
        m[i] = batch_gbs(r, 0);
        k[i] = batch_gbs(r, 1);
    }
    double kg = bench_quantile(k, ROUNDS, 0.5), mg = bench_quantile(m, ROUNDS, 0.5);
    printf("roundtrip %dx%-4s kvtier %5.2f GB/s  memcpy x2 %5.2f GB/s  ratio %.2f "
           "(16 chunks per request; target >= 0.85) %s\n", BATCH,
           bench_size_name(r->size, name, sizeof name), kg, mg, kg / mg,
           bench_verdict(kg / mg >= 0.85));
    fflush(stdout);
}

int main(void)
{
    static const size_t sizes[] = {256u << 10, 2u << 20, 32u << 20};
    struct bench_daemon d;
    struct rt r = {0};
    size_t max = BATCH * (2u << 20); /* also 32 MiB */
    r.c = bench_daemon_start(&d, POOL);
    if (!kvt_zero_copy(r.c)) bench_die("the pool is not mapped: no zero-copy path");
    r.src = bench_buf(max, 1);
    r.tmp = bench_buf(max, 2);
    r.dst = bench_buf(max, 3);
    r.next_key = bench_kvt_warm(r.c, NS, 1, POOL_BYTES, r.src, r.dst);
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        r.size = sizes[i];
        measure(&r);
    }
    r.size = 2u << 20;
    measure_batch(&r);
    bench_daemon_stop(&d, r.c);
    return 0;
}
