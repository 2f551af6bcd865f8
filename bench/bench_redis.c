/*
 * bench_redis.c -- kvtier's zero-copy put/get against Redis over loopback.
 *
 * Design: Redis is what people reach for first as a shared KV-cache store,
 * so it is the peer baseline. Both sides do what an engine does with one
 * chunk: store it from a source buffer, fetch it back and copy it into a
 * destination buffer. Redis: SET, GET (hiredis copies the reply into its
 * own buffer; we copy that into dst), then DEL to keep its memory flat.
 * kvtier: put_begin + copy with checksum + commit, get + copy out +
 * release; eviction makes room, and each size starts from an emptied pool.
 * Both get distinct keys per iteration and are warmed first; they are timed in alternating rounds and the medians
 * compared. Redis runs on a free loopback port with persistence off; no
 * redis-server on the machine means a clear SKIPPED line and exit 77.
 */
#include <arpa/inet.h>
#include <hiredis/hiredis.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include "common.h"

#define NS "bench/redis"
#define POOL "1G"
#define POOL_BYTES (1ull << 30)
#define ROUNDS 5
#define ROUND_NS 400000000ull

struct rd {
    kvt_client *c;
    redisContext *r;
    uint8_t *src, *dst;
    size_t size;
    uint64_t next_key;
};

/* ------------------------------------------------------------ server -- */

/* Full path of redis-server on PATH, or NULL. */
static const char *find_redis(char *buf, size_t len)
{
    const char *path = getenv("PATH");
    char dirs[4096];
    snprintf(dirs, sizeof dirs, "%s", path ? path : "/usr/bin:/usr/sbin");
    for (char *save, *d = strtok_r(dirs, ":", &save); d; d = strtok_r(NULL, ":", &save)) {
        snprintf(buf, len, "%s/redis-server", d);
        if (access(buf, X_OK) == 0) return buf;
    }
    return NULL;
}

/* A loopback port nobody listens on right now. */
static int free_port(void)
{
    struct sockaddr_in a = {.sin_family = AF_INET};
    socklen_t al = sizeof a;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) != 0 ||
        getsockname(fd, (struct sockaddr *)&a, &al) != 0)
        bench_die("cannot find a free loopback port: %s", strerror(errno));
    close(fd);
    return ntohs(a.sin_port);
}

static redisContext *redis_connect(int port, struct bench_child *ch)
{
    struct timeval tv = {1, 0};
    for (int i = 0; i < 250; i++) {
        redisContext *r = redisConnectWithTimeout("127.0.0.1", port, tv);
        redisReply *rep = r && !r->err ? redisCommand(r, "PING") : NULL;
        int ok = rep && rep->type == REDIS_REPLY_STATUS;
        if (rep) freeReplyObject(rep);
        if (ok) return r;
        if (r) redisFree(r);
        if (bench_child_dead(ch)) bench_die("redis-server exited at start-up");
        bench_sleep_ms(20);
    }
    bench_die("redis-server did not answer on port %d within 5 s", port);
}

static redisContext *redis_start(const char *exe)
{
    struct bench_child *c = bench_track();
    char port[16], dir[128];
    bench_mkdtemp(dir, sizeof dir);
    snprintf(c->dir, sizeof c->dir, "%s", dir);
    snprintf(c->log, sizeof c->log, "%s/redis.log", dir);
    snprintf(port, sizeof port, "%d", free_port());
    char *argv[] = {(char *)exe, "--port", port, "--bind", "127.0.0.1",
                    "--save", "", "--appendonly", "no", "--daemonize", "no",
                    "--dir", dir, NULL};
    c->pid = bench_spawn(exe, argv, c->log);
    redisContext *r = redis_connect(atoi(port), c);
    struct timeval tv = {30, 0};
    redisSetTimeout(r, tv);
    return r;
}

/* ------------------------------------------------------- round trips -- */

static redisReply *redis_do(struct rd *d, int argc, const char **argv,
                            const size_t *lens, int want)
{
    redisReply *rep = redisCommandArgv(d->r, argc, argv, lens);
    if (!rep) bench_die("redis %s: %s", argv[0], d->r->errstr);
    if (rep->type != want)
        bench_die("redis %s: reply type %d (%s)", argv[0], rep->type,
                  rep->type == REDIS_REPLY_ERROR ? rep->str : "?");
    return rep;
}

/* SET, GET into dst, DEL: one chunk through Redis. */
static void redis_rt(struct rd *d)
{
    kvt_key k = bench_key(2, d->next_key++);
    const char *set[] = {"SET", (const char *)k.b, (const char *)d->src};
    size_t set_len[] = {3, KVT_KEY_LEN, d->size};
    freeReplyObject(redis_do(d, 3, set, set_len, REDIS_REPLY_STATUS));
    const char *get[] = {"GET", (const char *)k.b}, *del[] = {"DEL", (const char *)k.b};
    size_t get_len[] = {3, KVT_KEY_LEN};
    redisReply *rep = redis_do(d, 2, get, get_len, REDIS_REPLY_STRING);
    if (rep->len != d->size) bench_die("redis GET: %zu bytes, not %zu", rep->len, d->size);
    memcpy(d->dst, rep->str, rep->len);
    freeReplyObject(rep);
    freeReplyObject(redis_do(d, 2, del, get_len, REDIS_REPLY_INTEGER));
}

static void kvt_rt(struct rd *d)
{
    bench_kvt_rt(d->c, NS, bench_key(3, d->next_key++), d->src, d->dst, d->size, NULL);
}

static double round_gbs(struct rd *d, int kvt)
{
    uint64_t t0 = bench_now_ns(), t, n = 0;
    do {
        if (kvt) kvt_rt(d);
        else redis_rt(d);
        n++;
    } while ((t = bench_now_ns()) - t0 < ROUND_NS || n < 3);
    return (double)(n * d->size) / (double)(t - t0);
}

static void check_bytes(struct rd *d, int kvt)
{
    bench_fill(d->src, d->size, 0xBEEF + d->size + (uint64_t)kvt);
    memset(d->dst, 0, d->size);
    if (kvt) kvt_rt(d);
    else redis_rt(d);
    if (memcmp(d->src, d->dst, d->size) != 0)
        bench_die("%s returned different bytes for a %zu-byte chunk",
                  kvt ? "kvtier" : "redis", d->size);
}

static void measure(struct rd *d, double target)
{
    double k[ROUNDS], r[ROUNDS];
    char name[32];
    check_bytes(d, 0);
    check_bytes(d, 1);
    for (int i = 0; i < 2; i++) {
        redis_rt(d);
        kvt_rt(d);
    }
    for (int i = 0; i < ROUNDS; i++) {
        r[i] = round_gbs(d, 0);
        k[i] = round_gbs(d, 1);
    }
    double kg = bench_quantile(k, ROUNDS, 0.5), rg = bench_quantile(r, ROUNDS, 0.5);
    printf("redis %-5s  kvtier %5.2f GB/s  redis %5.2f GB/s  ratio %.1f "
           "(target >= %.0f) %s\n", bench_size_name(d->size, name, sizeof name),
           kg, rg, kg / rg, target, bench_verdict(kg / rg >= target));
    fflush(stdout);
}

int main(void)
{
    char exe[512];
    struct bench_daemon dm;
    struct rd d = {0};
    if (!find_redis(exe, sizeof exe)) {
        printf("redis SKIPPED: redis-server not found on PATH "
               "(apt-get install redis-server)\n");
        return BENCH_SKIP;
    }
    d.r = redis_start(exe);
    d.c = bench_daemon_start(&dm, POOL);
    if (!kvt_zero_copy(d.c)) bench_die("the pool is not mapped: no zero-copy path");
    d.src = bench_buf(32u << 20, 1);
    d.dst = bench_buf(32u << 20, 2);
    bench_kvt_warm(d.c, NS, 4, POOL_BYTES, d.src, d.dst);
    d.size = 2u << 20;
    measure(&d, 2);
    d.size = 32u << 20;
    measure(&d, 10);
    redisFree(d.r);
    bench_daemon_stop(&dm, d.c);
    return 0;
}
