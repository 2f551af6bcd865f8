/*
 * bench_nvme.c -- the NVMe tier against the device's own limits.
 *
 * Design: three figures, each a ratio against a baseline measured in the
 * same run on the same directory (the daemon's NVMe data directory, under
 * /tmp):
 *
 *  1. Write and read bandwidth for 2 MiB and 32 MiB chunks. kvtier: 1 GiB
 *     of chunks is put into DRAM, then FLUSH writes them all (queue depth
 *     32, the daemon's default) and is timed to its answer; FLUSH --evict
 *     leaves them on NVMe only and GETs of 32 chunks at a time read them
 *     back (each read into DRAM and its checksum verified before the GET
 *     is answered), timed to the last answer. Baseline: fio with
 *     --ioengine=io_uring --direct=1, the same block size and queue depth,
 *     1 GiB, in the same directory. Two rounds, alternating: the first
 *     writes into new space on both sides (kvtier: a new data file; fio: a
 *     new file), the second into space written before (kvtier: the space
 *     of the first round's chunks, deleted; fio: its file again): on ext4
 *     the first write of a fallocated range also converts its extents.
 *  2. GET latency of one 2 MiB chunk that is on NVMe only (request to
 *     answer, release after), against a raw O_DIRECT pread of the same
 *     number of bytes from the daemon's data file, interleaved.
 *  3. Restart: a daemon holding N (default 1 000 000, BENCH_NVME_CHUNKS)
 *     indexed 4 KiB chunks on NVMe is stopped (clean, then kill -9) and
 *     started again; the time from exec to the first answered request
 *     (READY comes after the index is loaded) is the figure. Target 3 s.
 *
 * Needs fio for the bandwidth baselines (scripts/deps.sh installs it);
 * without it those lines say SKIPPED.
 */
#include <ftw.h>

#include "client_internal.h"
#include "common.h"

#define NS "bench/nvme"
#define QD "32"
#define ROUNDS 2
#define TOTAL (1ull << 30)

struct nvd {
    struct bench_daemon d;
    kvt_client *c;
    char dir[128], nvdir[160];
    const char *extra[16];
};

/* ------------------------------------------------------------ daemon -- */

static int rm_one(const char *p, const struct stat *st, int flag, struct FTW *f)
{
    (void)st;
    (void)flag;
    (void)f;
    return remove(p);
}

static void start(struct nvd *n, const char *pool, const char *nvme_bytes,
                  const char *const *more)
{
    const char *bin = getenv("KVTIERD");
    char exe[256], pool_path[128];
    snprintf(exe, sizeof exe, "%s", bin && bin[0] ? bin : "build/bin/kvtierd");
    n->d.ch = bench_track();
    if (!n->dir[0]) bench_mkdtemp(n->dir, sizeof n->dir);
    snprintf(n->d.ch->dir, sizeof n->d.ch->dir, "%s", n->dir);
    snprintf(n->nvdir, sizeof n->nvdir, "%s/nvme", n->dir);
    snprintf(pool_path, sizeof pool_path, "/dev/shm/kvtbench-nvme-%.16s.pool",
             n->dir + strlen("/tmp/kvtbench."));
    snprintf(n->d.ch->pool, sizeof n->d.ch->pool, "%s", pool_path);
    snprintf(n->d.ch->log, sizeof n->d.ch->log, "%s/kvtierd.log", n->dir);
    snprintf(n->d.url, sizeof n->d.url, "ipc://%s/kvtierd.sock", n->dir);
    char *argv[40] = {exe, "--socket", n->d.url, "--state-dir", n->dir,
                      "--pool-path", pool_path, "--pool-bytes", (char *)pool,
                      "--log-level", "warn", "--metrics.listen", "",
                      "--nvme.nvme_bytes", (char *)nvme_bytes,
                      "--nvme.queue_depth", QD};
    int k = 17;
    for (int i = 0; more && more[i] && k < 38; i++) argv[k++] = (char *)more[i];
    argv[k] = NULL;
    n->d.ch->pid = bench_spawn(exe, argv, n->d.ch->log);
    n->c = bench_daemon_connect(&n->d);
    kvt_set_timeout(n->c, 600000);
}

/* Stop (SIGTERM) or kill (SIGKILL); keep the files unless done. */
static void stop(struct nvd *n, int kill9, int done)
{
    kvt_close(n->c);
    n->c = NULL;
    if (kill9) {
        kill(n->d.ch->pid, SIGKILL);
        waitpid(n->d.ch->pid, NULL, 0);
        n->d.ch->pid = 0;
    } else if (!bench_clean_end(bench_reap(n->d.ch->pid))) {
        bench_show_log(n->d.ch->log);
        bench_die("kvtierd did not shut down cleanly");
    }
    n->d.ch->pid = 0;
    if (!done) {
        n->d.ch->dir[0] = n->d.ch->pool[0] = '\0'; /* the next start reuses them */
        return;
    }
    unlink(n->d.ch->pool);
    nftw(n->dir, rm_one, 16, FTW_DEPTH | FTW_PHYS);
    n->dir[0] = n->d.ch->dir[0] = '\0';
}

static Kvtier__Response *call(kvt_client *c, Kvtier__Request *q,
                              Kvtier__Response__BodyCase bc)
{
    Kvtier__Response *r = NULL;
    kvt_err e = kvtc_call(c, q, &r);
    if (e || r->body_case != bc)
        bench_die("request %d: %s (%s)", (int)q->body_case, kvt_strerror(e), kvt_last_error(c));
    return r;
}

static void flush(kvt_client *c, int evict, uint64_t want)
{
    Kvtier__Flush f = KVTIER__FLUSH__INIT;
    Kvtier__Request q = KVTIER__REQUEST__INIT;
    f.evict = evict;
    q.body_case = KVTIER__REQUEST__BODY_FLUSH;
    q.flush = &f;
    Kvtier__Response *r = call(c, &q, KVTIER__RESPONSE__BODY_FLUSH);
    if (r->flush->failed || r->flush->written + r->flush->clean < want)
        bench_die("flush wrote %llu, %llu clean, %llu failed; want %llu",
                  (unsigned long long)r->flush->written,
                  (unsigned long long)r->flush->clean,
                  (unsigned long long)r->flush->failed, (unsigned long long)want);
    kvtier__response__free_unpacked(r, NULL);
}

static uint64_t stat_nvme(kvt_client *c, int loaded)
{
    Kvtier__Stats st = KVTIER__STATS__INIT;
    Kvtier__Request q = KVTIER__REQUEST__INIT;
    q.body_case = KVTIER__REQUEST__BODY_STATS;
    q.stats = &st;
    Kvtier__Response *r = call(c, &q, KVTIER__RESPONSE__BODY_STATS);
    uint64_t v = !r->stats->nvme ? 0 : loaded ? r->stats->nvme->loaded_chunks
                                              : r->stats->nvme->demotions;
    kvtier__response__free_unpacked(r, NULL);
    return v;
}

/* Put keys (seed, first..first+n) of size bytes, batch per request. */
static void put_many(kvt_client *c, uint64_t seed, uint64_t first, uint64_t n,
                     size_t size, size_t batch, const uint8_t *src)
{
    kvt_key *keys = calloc(batch, sizeof *keys);
    size_t *sizes = calloc(batch, sizeof *sizes);
    kvt_chunk *ch = calloc(batch, sizeof *ch);
    uint64_t *cs = calloc(batch, sizeof *cs);
    for (uint64_t i = 0; i < n; i += batch) {
        size_t m = n - i < batch ? (size_t)(n - i) : batch;
        kvt_lease l;
        for (size_t j = 0; j < m; j++) {
            keys[j] = bench_key(seed, first + i + j);
            sizes[j] = size;
        }
        BENCH_KVT(c, kvt_put_begin(c, NS, keys, sizes, m, NULL, &l, ch));
        for (size_t j = 0; j < m; j++)
            cs[j] = ch[j].exists ? 0 : kvt_copy_checksum(ch[j].data, src + (j % 4) * 64, size);
        BENCH_KVT(c, kvt_put_commit(c, l, ch, m, cs));
    }
    free(keys);
    free(sizes);
    free(ch);
    free(cs);
}

/* ------------------------------------------------------------- fio -- */

/* fio's bandwidth in bytes/s for rw ("write" or "read"), or -1. */
static double fio_bw(const char *dir, const char *rw, size_t bs)
{
    char cmd[1024], line[8192];
    snprintf(cmd, sizeof cmd, "fio --name=kvtbench --filename=%s/fio.dat "
             "--ioengine=io_uring --direct=1 --rw=%s --bs=%zu --iodepth=" QD
             " --size=%llu --output-format=terse --terse-version=3 2>/dev/null",
             dir, rw, bs, (unsigned long long)TOTAL);
    FILE *p = popen(cmd, "r");
    if (!p) return -1;
    double bw = -1;
    while (fgets(line, sizeof line, p)) {
        char *f = line;
        int field = 1, want = strcmp(rw, "read") == 0 ? 7 : 48;
        while (f && field < want) {
            f = strchr(f, ';');
            if (f) f++;
            field++;
        }
        if (f) bw = strtod(f, NULL) * 1024.0; /* KiB/s */
    }
    pclose(p);
    return bw;
}

static int have_fio(void)
{
    return system("fio --version >/dev/null 2>&1") == 0;
}

/* -------------------------------------------------------- bandwidth -- */

/* GET every chunk (on NVMe only) 32 at a time; bytes/s. */
static double read_all(kvt_client *c, uint64_t seed, uint64_t n, size_t size)
{
    kvt_key keys[32];
    kvt_chunk ch[32];
    uint64_t t0 = bench_now_ns();
    for (uint64_t i = 0; i < n; i += 32) {
        size_t m = n - i < 32 ? (size_t)(n - i) : 32, got;
        kvt_lease l;
        for (size_t j = 0; j < m; j++) keys[j] = bench_key(seed, i + j);
        BENCH_KVT(c, kvt_get(c, NS, keys, m, &l, ch, &got));
        if (got != m) bench_die("GET of %zu chunks on NVMe found %zu", m, got);
        BENCH_KVT(c, kvt_release(c, l));
    }
    return (double)(n * size) / ((double)(bench_now_ns() - t0) / 1e9);
}

/* Delete chunks (seed, 0..n): their NVMe space is free for the next. */
static void delete_all(kvt_client *c, uint64_t seed, uint64_t n)
{
    kvt_key keys[64];
    for (uint64_t i = 0; i < n; i += 64) {
        size_t m = n - i < 64 ? (size_t)(n - i) : 64, got;
        for (size_t j = 0; j < m; j++) keys[j] = bench_key(seed, i + j);
        BENCH_KVT(c, kvt_delete(c, NS, keys, m, &got));
    }
}

static void report(const char *what, const char *name, double k, double f)
{
    printf("nvme %-16s %-6s kvtier %6.2f GB/s   fio %6.2f GB/s   ratio %.2f  (target >= 0.9: %s)\n",
           what, name, k / 1e9, f / 1e9, f > 0 ? k / f : 0,
           f > 0 ? bench_verdict(k >= 0.9 * f) : "SKIPPED, no fio");
}

/* Round 0 writes into new file space (fio: a new file); round 1 into the
 * space round 0 freed (fio: the same file again). */
static void bandwidth(size_t size, int fio)
{
    struct nvd n = {0};
    char name[16], fdat[256];
    const char *more[] = {"--high-watermark", "0.99", "--low-watermark", "0.98",
                          "--nvme.file_bytes", "2G", NULL};
    uint64_t cnt = TOTAL / size;
    double kw[ROUNDS], kr[ROUNDS], fw[ROUNDS] = {0}, fr[ROUNDS] = {0};
    uint8_t *src = bench_buf(size + 4096, 7);
    start(&n, "1200M", "4G", more);
    snprintf(fdat, sizeof fdat, "%s/fio.dat", n.nvdir);
    for (int round = 0; round < ROUNDS; round++) {
        uint64_t seed = 100 + (uint64_t)round;
        if (round) delete_all(n.c, seed - 1, cnt);
        put_many(n.c, seed, 0, cnt, size, size >= (32u << 20) ? 2 : 16, src);
        uint64_t t0 = bench_now_ns();
        flush(n.c, 0, cnt);
        kw[round] = (double)(cnt * size) / ((double)(bench_now_ns() - t0) / 1e9);
        flush(n.c, 1, cnt); /* clean now: only drops the DRAM copies */
        kr[round] = read_all(n.c, seed, cnt, size);
        uint64_t freed;
        BENCH_KVT(n.c, kvt_evict(n.c, 1ull << 40, &freed));
        if (fio) {
            fw[round] = fio_bw(n.nvdir, "write", size);
            fr[round] = fio_bw(n.nvdir, "read", size);
        }
    }
    bench_size_name(size, name, sizeof name);
    report("write (new space)", name, kw[0], fw[0]);
    report("write (reused)", name, kw[1], fw[1]);
    report("read", name, kr[0] > kr[1] ? kr[0] : kr[1], fr[0] > fr[1] ? fr[0] : fr[1]);
    unlink(fdat);
    stop(&n, 0, 1);
    free(src);
}

/* ---------------------------------------------------------- latency -- */

static void latency(void)
{
    enum { N = 48 };
    size_t size = 2u << 20;
    struct nvd n = {0};
    uint8_t *src = bench_buf(size + 4096, 9);
    double k[N], raw[N];
    start(&n, "256M", "1G", NULL);
    put_many(n.c, 5, 0, N, size, 8, src);
    flush(n.c, 1, N);
    char path[256];
    snprintf(path, sizeof path, "%s/kvtier-00000.nvd", n.nvdir);
    int fd = open(path, O_RDONLY | O_DIRECT);
    uint8_t *buf = aligned_alloc(4096, size);
    if (fd < 0 || !buf) bench_die("%s: %s", path, strerror(errno));
    for (int i = 0; i < N; i++) {
        kvt_key key = bench_key(5, (uint64_t)i);
        kvt_chunk ch;
        kvt_lease l;
        size_t got;
        uint64_t t0 = bench_now_ns();
        BENCH_KVT(n.c, kvt_get(n.c, NS, &key, 1, &l, &ch, &got));
        k[i] = (double)(bench_now_ns() - t0) / 1e3;
        if (got != 1) bench_die("chunk %d not found", i);
        BENCH_KVT(n.c, kvt_release(n.c, l));
        off_t at = (off_t)((uint64_t)(N - 1 - i) * (size + 4096) + 4096);
        t0 = bench_now_ns();
        if (pread(fd, buf, size, at) != (ssize_t)size) bench_die("pread: %s", strerror(errno));
        raw[i] = (double)(bench_now_ns() - t0) / 1e3;
    }
    close(fd);
    double k50 = bench_quantile(k, N, 0.5), k99 = bench_quantile(k, N, 0.99);
    double r50 = bench_quantile(raw, N, 0.5), r99 = bench_quantile(raw, N, 0.99);
    printf("nvme GET 2MiB (NVMe only)  p50 %7.0f us  p99 %7.0f us;  raw O_DIRECT read p50 %7.0f us  "
           "p99 %7.0f us;  p50 ratio %.2f\n", k50, k99, r50, r99, k50 / r50);
    free(buf);
    free(src);
    stop(&n, 0, 1);
}

/* ---------------------------------------------------------- restart -- */

static double restart_once(struct nvd *n, const char *const *more, uint64_t want)
{
    uint64_t t0 = bench_now_ns();
    start(n, "256M", "9G", more);
    double s = (double)(bench_now_ns() - t0) / 1e9;
    uint64_t got = stat_nvme(n->c, 1);
    if (got != want) bench_die("restart indexed %llu chunks, want %llu",
                               (unsigned long long)got, (unsigned long long)want);
    return s;
}

static void restart(void)
{
    const char *env = getenv("BENCH_NVME_CHUNKS");
    uint64_t total = env ? strtoull(env, NULL, 10) : 1000000;
    const char *more[] = {"--max-keys", "8192", NULL};
    struct nvd n = {0};
    uint8_t *src = bench_buf(8192, 11);
    start(&n, "256M", "9G", more);
    uint64_t t0 = bench_now_ns();
    for (uint64_t i = 0; i < total; i += 32768) {
        uint64_t m = total - i < 32768 ? total - i : 32768;
        put_many(n.c, 77, i, m, 4096, 8192, src);
        flush(n.c, 1, m);
    }
    double fill = (double)(bench_now_ns() - t0) / 1e9;
    stop(&n, 0, 0);
    double clean = restart_once(&n, more, total);
    stop(&n, 1, 0);
    double killed = restart_once(&n, more, total);
    printf("nvme restart with %llu indexed chunks of 4 KiB: %.2f s after a clean stop, "
           "%.2f s after kill -9  (target <= 3 s: %s; filling took %.0f s)\n",
           (unsigned long long)total, clean, killed,
           bench_verdict(clean <= 3.0 && killed <= 3.0), fill);
    stop(&n, 0, 1);
    free(src);
}

int main(void)
{
    int fio = have_fio();
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (!fio) printf("fio not found: bandwidth baselines SKIPPED (scripts/deps.sh installs it)\n");
    bandwidth(2u << 20, fio);
    bandwidth(32u << 20, fio);
    latency();
    restart();
    return 0;
}
