/*
 * bench_gidx.c -- what one membership change costs the global index, per
 * holder of K chunks, at N = 10, 100, 1000 and 5000 members (R = 2).
 *
 * Design: the real ownership code and the daemon's republish planner
 * (tiers/peer/owners.c, oplan.c), no daemons: a holder of K = 100 000
 * keys sees one member join. Entries: the old index resent every key to
 * each of its R owners (R*K per holder); the new one sends each key whose
 * owners changed to the member that entered, as the planner decides
 * (op_catch_up over the logged join, the per-slot owners it kept), in
 * batches of 512 per destination. CPU: the old index found each key's
 * owners by scoring all N members (owners_of); the new one replays the
 * change against the R owners it kept (op_catch_up). Both are timed in the same
 * run, in alternating rounds, and reported as a ratio. The loops are
 * single-threaded and CPU-bound, so they are timed in this thread's CPU
 * time: a shared machine's other load does not count.
 */
#include "common.h"

#include "peer/oplan.h"
#include "peer/owners.h"

#define K 100000u
#define R 2u
#define ROUNDS 3

static uint64_t cpu_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static uint32_t view[5001];

/* Per key, over the first m keys (fewer at large N: the old way is slow). */
static double time_full(const kvt_key *keys, uint32_t n, uint32_t m, uint32_t *sink)
{
    uint32_t o[OW_MAX_REPLICAS];
    uint64_t t0 = cpu_ns();
    for (uint32_t i = 0; i < m; i++) *sink += owners_of(&keys[i], 7, view, n, R, o);
    return (double)(cpu_ns() - t0) / m;
}

/* owners[i*R..] are key i's owners before the join of id n + 1: the
 * planner's records as a settled holder has them, then the join logged
 * and every slot brought up to date (timed). */
static double time_delta(const kvt_key *keys, const uint32_t *owners, uint32_t n,
                         uint32_t *moved)
{
    static struct oplan p;
    op_init(&p, R);
    for (uint32_t i = 0; i < K; i++) op_store(&p, op_rec(&p, i), &owners[i * R], R);
    op_log(&p, n + 1, OW_JOIN);
    uint64_t t0 = cpu_ns();
    *moved = 0;
    for (uint32_t i = 0; i < K; i++) {
        uint32_t o[OW_MAX_REPLICAS], c, t[OW_MAX_REPLICAS], mv;
        *moved += op_catch_up(&p, op_rec(&p, i), &keys[i], 7, view, n + 1, o, &c, t, &mv);
    }
    double ns = (double)(cpu_ns() - t0) / K;
    op_free(&p);
    return ns;
}

int main(void)
{
    static const uint32_t sizes[] = {10, 100, 1000, 5000};
    kvt_key *keys = calloc(K, sizeof *keys);
    uint32_t *owners = calloc((size_t)K * R, sizeof *owners), sink = 0;
    if (!keys || !owners) return 1;
    for (uint32_t i = 0; i < K; i++) keys[i] = bench_key(5, i);
    for (uint32_t i = 0; i <= 5000; i++) view[i] = i + 1;
    printf("one join, one holder of %u keys, R = %u\n", K, R);
    for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++) {
        uint32_t n = sizes[s], moved = 0;
        for (uint32_t i = 0; i < K; i++) owners_of(&keys[i], 7, view, n, R, &owners[i * R]);
        double full = 1e30, delta = 1e30;
        for (int r = 0; r < ROUNDS; r++) { /* best of alternating rounds */
            uint32_t m = n > 100 ? K / (n / 100) : K;
            double f = time_full(keys, n, m, &sink), d = time_delta(keys, owners, n, &moved);
            if (f < full) full = f;
            if (d < delta) delta = d;
        }
        printf("N=%-5u entries sent %6u in %u msgs (old: %u in %u, %.3fx; ideal R*K/N = %.0f)  "
               "ownership per key %7.3f us (old: %7.3f us, %.1fx faster)\n",
               n, moved, (moved + 511) / 512, R * K, n * ((R * K / n + 511) / 512),
               (double)moved / (R * K), (double)R * K / (n + 1), delta / 1e3, full / 1e3,
               full / delta);
    }
    free(keys);
    free(owners);
    return sink == 0;
}
