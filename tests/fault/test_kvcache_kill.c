/*
 * test_kvcache_kill.c -- an engine killed (SIGKILL) in the middle of a
 * SAVE, in the middle of a LOAD, and while parked in kvt_kv_wait (on the
 * fast channel and on nng): the daemon drops its registration and its
 * transfers, frees what the SAVE had reserved, unpins what the LOAD was
 * reading, and keeps serving. Also the waits themselves: a timeout, a
 * parked wait answered when its transfer ends, and more waiters than the
 * daemon parks.
 *
 * Transfers are large (24 chunks of 1 MiB) and the daemon runs with the
 * fault hook KVT_FAULT_KV_DELAY_MS=20 (20 ms per chunk), so a transfer
 * takes about half a second and the kill lands mid-flight. nng does not
 * survive fork(), so engines run as fresh execs of this binary.
 */
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>
#include <nng/nng.h>
#include <nng/protocol/reqrep0/req.h>

#include "daemon.h"
#include "kvengine.h"
#include "kvtier.h"
#include "kvtier.pb-c.h"

static struct tdaemon D;

#define NS "kill/ns"
#define CT 64    /* chunk tokens: 4 blocks of 16, 1 MiB */
#define NK 24
#define DELAY_MS 20

/* A daemon whose workers sleep DELAY_MS per chunk. */
static int start_slow(struct tdaemon *d, const char *const *extra)
{
    char delay[16];
    snprintf(delay, sizeof delay, "%d", DELAY_MS);
    setenv("KVT_FAULT_KV_DELAY_MS", delay, 1); /* inherited by the daemon */
    int rc = td_start(d, extra);
    unsetenv("KVT_FAULT_KV_DELAY_MS");
    return rc;
}

static int setup(void **state)
{
    (void)state;
    /* 4 contexts: at most 2 waits parked on nng. */
    const char *extra[] = {"--pool-bytes", "256M", "--contexts", "4", NULL};
    return start_slow(&D, extra);
}

static int teardown(void **state)
{
    (void)state;
    int rc = td_stop(&D);
    td_cleanup(&D);
    return rc;
}

static fx_shape big(void)
{
    return (fx_shape){.layers = 8, .blocks = 128, .block_size = 16, .heads = 8,
                      .head_size = 64, .elem_size = 2};
}

static void keys_of(uint64_t seed, kvt_key *k)
{
    for (size_t i = 0; i < NK; i++) k[i] = td_key(seed * 1000 + i);
}

static long long limit_ms(void)
{
    return getenv("KVT_SAN") ? 10000 : 3000;
}

/* ---------------------------------------------------------- the engine */

/* Register, start transfers, say so, then hang (or wait, parked). A
 * "save" is three transfers of NK / 3 chunks: with two workers, the third
 * is still queued when the engine dies. */
static int child(const char *mode, const char *sock, int wfd, uint64_t seed)
{
    if (strstr(mode, "nng")) setenv("KVTIER_NO_FAST", "1", 1);
    kvt_client *c;
    struct kve e;
    fx_shape s = big();
    kvt_kv_reg reg;
    kvt_key k[NK];
    int32_t ids[NK * 4];
    kvt_xfer x;
    kvt_xfer_status st;
    if (kvt_connect(sock, &c) != KVT_OK || kve_open(&e, KVT_LAYOUT_VLLM_FLASH_NHD, &s, seed))
        return 1;
    if (kve_register(c, &e, NS, CT, &reg, NULL) != KVT_OK) return 2;
    keys_of(seed, k);
    for (int i = 0; i < NK * 4; i++) ids[i] = i;
    kve_close(&e); /* unlinked and unmapped here; the daemon's mapping stays */
    kvt_err r = KVT_OK;
    if (strncmp(mode, "load", 4) == 0)
        r = kvt_kv_load(c, NS, reg, k, NK, ids, NK * 4, &x);
    else if (strncmp(mode, "wait", 4) == 0)
        r = kvt_kv_save(c, NS, reg, k, NK, ids, NK * 4, NULL, &x);
    else
        for (int i = 0; i < 3 && r == KVT_OK; i++)
            r = kvt_kv_save(c, NS, reg, k + i * NK / 3, NK / 3, ids + i * NK / 3 * 4,
                            NK / 3 * 4, NULL, &x);
    if (r != KVT_OK) return 3;
    if (write(wfd, "r", 1) != 1) return 4;
    if (strncmp(mode, "wait", 4) == 0) kvt_kv_wait(c, &x, 1, -1, &st);
    for (;;) pause();
}

static pid_t spawn(const char *mode, uint64_t seed, int *rfd)
{
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    pid_t pid = fork();
    if (pid == 0) {
        char fd[16], sd[24];
        snprintf(fd, sizeof fd, "%d", fds[1]);
        snprintf(sd, sizeof sd, "%llu", (unsigned long long)seed);
        execl("/proc/self/exe", "test_kvcache_kill", "--child", mode, D.sock, fd,
              sd, (char *)NULL);
        _exit(127);
    }
    close(fds[1]);
    *rfd = fds[0];
    return pid;
}

/* Start an engine and wait until its transfer was accepted. */
static pid_t engine(const char *mode, uint64_t seed)
{
    int rfd;
    char r;
    pid_t pid = spawn(mode, seed, &rfd);
    if (read(rfd, &r, 1) != 1) {
        int st;
        waitpid(pid, &st, 0);
        fail_msg("engine (%s) failed before its transfer: status %d", mode, st);
    }
    close(rfd);
    return pid;
}

static void kill_engine(pid_t pid)
{
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
}

/* ------------------------------------------------------------- checks */

static kvt_kv_stats kvs(kvt_client *c)
{
    kvt_kv_stats s;
    assert_int_equal(kvt_kv_stats_get(c, &s), KVT_OK);
    return s;
}

static uint64_t used(kvt_client *c)
{
    kvt_stats s;
    assert_int_equal(kvt_stats_get(c, &s), KVT_OK);
    return s.used_bytes;
}

/* Registrations down to regs and no transfer left, within the limit. */
static void settles(kvt_client *c, uint64_t regs)
{
    long long t0 = td_now_ms();
    kvt_kv_stats s = kvs(c);
    while ((s.registrations != regs || s.transfers != 0) &&
           td_now_ms() - t0 < limit_ms()) {
        usleep(10000);
        s = kvs(c);
    }
    assert_int_equal(s.registrations, regs);
    assert_int_equal(s.transfers, 0);
}

/* CPU time (ms) the daemon used so far. */
static long long daemon_cpu_ms(void)
{
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)D.pid);
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    char *p = strrchr(buf, ')');
    unsigned long long ut = 0, st = 0;
    assert_int_equal(sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu",
                            &ut, &st), 2);
    return (long long)(ut + st) * 1000 / sysconf(_SC_CLK_TCK);
}

/* A small round trip through a fresh engine: the daemon still serves. */
static void still_serves(kvt_client *c, uint64_t seed)
{
    struct kve e;
    fx_shape s = {.layers = 2, .blocks = 16, .block_size = 16, .heads = 2,
                  .head_size = 64, .elem_size = 2};
    kvt_kv_reg reg;
    kvt_key k = td_key(seed);
    int32_t id = 3;
    kvt_xfer x;
    kvt_xfer_status st;
    assert_int_equal(kve_open(&e, KVT_LAYOUT_VLLM_FLASH_NHD, &s, seed), 0);
    assert_int_equal(kve_register(c, &e, "kill/alive", 16, &reg, NULL), KVT_OK);
    assert_int_equal(kvt_kv_save(c, "kill/alive", reg, &k, 1, &id, 1, NULL, &x), KVT_OK);
    assert_int_equal(kve_wait1(c, x, &st), KVT_OK);
    assert_int_equal(st.err, KVT_OK);
    assert_int_equal(kvt_kv_unregister(c, reg), KVT_OK);
    kve_close(&e);
}

/* -------------------------------------------------------------- tests */

static void test_killed_mid_save(void **state)
{
    (void)state;
    kvt_client *c = td_connect(&D);
    uint64_t u0 = used(c);
    pid_t pid = engine("save", 1);
    usleep(3 * DELAY_MS * 1000); /* a few chunks in */
    assert_int_equal(kvs(c).transfers, 3); /* two running, one queued */
    assert_true(used(c) >= u0 + NK * (1u << 20)); /* reserved */
    kill_engine(pid);
    settles(c, 0);
    assert_int_equal(used(c), u0); /* the reservation is gone */
    kvt_key k[NK];
    size_t present;
    keys_of(1, k);
    assert_int_equal(kvt_lookup(c, NS, k, NK, &present, NULL), KVT_OK);
    assert_int_equal(present, 0); /* never committed */
    still_serves(c, 11);
    kvt_close(c);
}

static void test_killed_mid_load(void **state)
{
    (void)state;
    kvt_client *c = td_connect(&D);
    struct kve e;
    fx_shape s = big();
    kvt_kv_reg reg;
    kvt_key k[NK];
    int32_t ids[NK * 4];
    kvt_xfer x;
    kvt_xfer_status st;
    assert_int_equal(kve_open(&e, KVT_LAYOUT_VLLM_FLASH_NHD, &s, 2), 0);
    assert_int_equal(kve_register(c, &e, NS, CT, &reg, NULL), KVT_OK);
    keys_of(2, k);
    for (int i = 0; i < NK * 4; i++) ids[i] = i;
    assert_int_equal(kvt_kv_save(c, NS, reg, k, NK, ids, NK * 4, NULL, &x), KVT_OK);
    assert_int_equal(kve_wait1(c, x, &st), KVT_OK);
    assert_int_equal(st.err, KVT_OK);
    uint64_t u0 = used(c);
    pid_t pid = engine("load", 2);
    usleep(3 * DELAY_MS * 1000);
    assert_int_equal(kvs(c).transfers, 1);
    kill_engine(pid);
    settles(c, 1); /* ours is left */
    /* Unpinned: deleting frees every chunk at once. */
    size_t del;
    assert_int_equal(kvt_delete(c, NS, k, NK, &del), KVT_OK);
    assert_int_equal(del, NK);
    assert_int_equal(used(c), u0 - NK * (1u << 20));
    assert_int_equal(kvt_kv_unregister(c, reg), KVT_OK);
    kve_close(&e);
    still_serves(c, 12);
    kvt_close(c);
}

/* Killed while its kvt_kv_wait is parked: the daemon notices, and does not
 * spin on the dead connection. */
static void killed_waiting(const char *mode, uint64_t seed)
{
    kvt_client *c = td_connect(&D);
    pid_t pid = engine(mode, seed);
    usleep(100000);
    kill_engine(pid);
    settles(c, 0);
    long long cpu0 = daemon_cpu_ms(), t0 = td_now_ms();
    usleep(400000);
    long long cpu = daemon_cpu_ms() - cpu0, wall = td_now_ms() - t0;
    assert_true(cpu * 2 < wall);
    still_serves(c, seed + 10);
    kvt_close(c);
}

static void test_killed_waiting_fast(void **state)
{
    (void)state;
    killed_waiting("wait", 3);
}

static void test_killed_waiting_nng(void **state)
{
    (void)state;
    killed_waiting("wait-nng", 4);
}

/* Save NK chunks from a fresh engine; the transfer id. */
static kvt_xfer slow_save(kvt_client *c, struct kve *e, kvt_kv_reg *reg,
                          uint64_t seed)
{
    fx_shape s = big();
    kvt_key k[NK];
    int32_t ids[NK * 4];
    kvt_xfer x;
    assert_int_equal(kve_open(e, KVT_LAYOUT_VLLM_FLASH_NHD, &s, seed), 0);
    assert_int_equal(kve_register(c, e, NS, CT, reg, NULL), KVT_OK);
    keys_of(seed, k);
    for (int i = 0; i < NK * 4; i++) ids[i] = i;
    assert_int_equal(kvt_kv_save(c, NS, *reg, k, NK, ids, NK * 4, NULL, &x), KVT_OK);
    return x;
}

/* Waits: a timeout says not done; a long wait ends with the transfer. */
static void waits(uint64_t seed)
{
    kvt_client *c = td_connect(&D);
    struct kve e;
    kvt_kv_reg reg;
    kvt_xfer_status st;
    kvt_xfer x = slow_save(c, &e, &reg, seed);
    long long t0 = td_now_ms();
    assert_int_equal(kvt_kv_wait(c, &x, 1, 50, &st), KVT_ETIMEDOUT);
    long long dt = td_now_ms() - t0;
    assert_true(dt >= 50 && dt < 2000); /* timed out: it did not end (~0.5 s) */
    assert_false(st.done);
    assert_int_equal(kvt_kv_poll(c, &x, 1, &st), KVT_OK);
    assert_false(st.done);
    assert_int_equal(kvt_kv_wait(c, &x, 1, 20000, &st), KVT_OK);
    assert_true(st.done);
    assert_int_equal(st.err, KVT_OK);
    assert_int_equal(st.n_chunks, NK);
    assert_true(td_now_ms() - t0 < 5000);
    assert_int_equal(kvt_kv_unregister(c, reg), KVT_OK);
    kve_close(&e);
    kvt_close(c);
}

static void test_wait_fast(void **state)
{
    (void)state;
    waits(5);
}

static void test_wait_nng(void **state)
{
    (void)state;
    setenv("KVTIER_NO_FAST", "1", 1);
    waits(6);
    unsetenv("KVTIER_NO_FAST");
}

/* Three nng clients wait at once; with 4 contexts the daemon parks two
 * and answers the third at once, and its library polls: all finish. */
static void *waiter(void *arg)
{
    uint64_t seed = (uint64_t)(uintptr_t)arg;
    kvt_client *c = td_connect(&D);
    struct kve e;
    kvt_kv_reg reg;
    kvt_xfer_status st;
    kvt_xfer x = slow_save(c, &e, &reg, seed);
    kvt_err r = kvt_kv_wait(c, &x, 1, 20000, &st);
    kve_close(&e);
    kvt_close(c);
    return (void *)(uintptr_t)(r == KVT_OK && st.err == KVT_OK);
}

static void test_more_waiters_than_parked(void **state)
{
    (void)state;
    pthread_t t[3];
    setenv("KVTIER_NO_FAST", "1", 1);
    for (uintptr_t i = 0; i < 3; i++)
        assert_int_equal(pthread_create(&t[i], NULL, waiter, (void *)(20 + i)), 0);
    for (int i = 0; i < 3; i++) {
        void *ok;
        pthread_join(t[i], &ok);
        assert_true((uintptr_t)ok);
    }
    unsetenv("KVTIER_NO_FAST");
    kvt_client *c = td_connect(&D);
    settles(c, 0);
    kvt_close(c);
}

/* Chunks deleted while a LOAD reads them stay until it is done. */
static void test_delete_during_load(void **state)
{
    (void)state;
    kvt_client *c = td_connect(&D);
    struct kve e;
    kvt_kv_reg reg;
    kvt_xfer_status st;
    kvt_key k[NK];
    int32_t ids[NK * 4];
    kvt_xfer x = slow_save(c, &e, &reg, 30);
    assert_int_equal(kve_wait1(c, x, &st), KVT_OK);
    uint64_t u0 = used(c);
    keys_of(30, k);
    for (int i = 0; i < NK * 4; i++) ids[i] = i; /* back where they came from */
    uint64_t sum = kve_sum(&e);
    assert_int_equal(kvt_kv_load(c, NS, reg, k, NK, ids, NK * 4, &x), KVT_OK);
    size_t del, present;
    assert_int_equal(kvt_delete(c, NS, k, NK, &del), KVT_OK);
    assert_int_equal(del, NK);
    assert_int_equal(kvt_lookup(c, NS, k, NK, &present, NULL), KVT_OK);
    assert_int_equal(present, 0); /* gone for everyone else at once */
    assert_int_equal(used(c), u0); /* but still there for the LOAD */
    assert_int_equal(kve_wait1(c, x, &st), KVT_OK);
    assert_int_equal(st.err, KVT_OK);
    assert_int_equal(used(c), u0 - NK * (1u << 20));
    assert_int_equal(kve_sum(&e), sum);
    assert_int_equal(kvt_kv_unregister(c, reg), KVT_OK);
    kve_close(&e);
    kvt_close(c);
}

/* SIGTERM while transfers run: they are cancelled, the daemon exits 0
 * (and, in the sanitizer build, without leaks). */
static void test_shutdown_mid_transfer(void **state)
{
    (void)state;
    struct tdaemon d2 = {0};
    const char *extra[] = {"--pool-bytes", "128M", "--daemon.drain_timeout_ms", "0",
                           NULL};
    assert_int_equal(start_slow(&d2, extra), 0);
    kvt_client *c = td_connect(&d2);
    struct kve e[3];
    kvt_kv_reg reg[3];
    for (int i = 0; i < 3; i++) /* the third queued behind two */
        (void)slow_save(c, &e[i], &reg[i], 31 + (uint64_t)i);
    usleep(50000);
    assert_int_equal(td_stop(&d2), 0);
    kvt_close(c);
    for (int i = 0; i < 3; i++) kve_close(&e[i]);
    td_cleanup(&d2);
}

/* ------------------------------------------- several waits, one pipe */

/* A raw req0 socket with contexts: concurrent requests on one pipe, which
 * libkvtier never sends but a client may. */
struct raw {
    nng_socket s;
    nng_ctx ctx[3];
    nng_aio *aio[3];
};

static void raw_open(struct raw *r)
{
    char url[400];
    snprintf(url, sizeof url, "ipc://%s", D.sock);
    assert_int_equal(nng_req0_open(&r->s), 0);
    nng_socket_set_ms(r->s, NNG_OPT_REQ_RESENDTIME, NNG_DURATION_INFINITE);
    assert_int_equal(nng_dial(r->s, url, NULL, 0), 0);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(nng_ctx_open(&r->ctx[i], r->s), 0);
        assert_int_equal(nng_aio_alloc(&r->aio[i], NULL, NULL), 0);
        nng_aio_set_timeout(r->aio[i], 10000);
    }
}

static void raw_close(struct raw *r)
{
    for (int i = 0; i < 3; i++) nng_aio_free(r->aio[i]);
    nng_close(r->s);
}

/* Send q on context i and start receiving its answer. */
static void raw_send(struct raw *r, int i, Kvtier__Request *q)
{
    static uint64_t id = 1000;
    nng_msg *m;
    q->id = ++id;
    assert_int_equal(nng_msg_alloc(&m, kvtier__request__get_packed_size(q)), 0);
    kvtier__request__pack(q, nng_msg_body(m));
    nng_aio_set_msg(r->aio[i], m);
    nng_ctx_send(r->ctx[i], r->aio[i]);
    nng_aio_wait(r->aio[i]);
    assert_int_equal(nng_aio_result(r->aio[i]), 0);
    nng_ctx_recv(r->ctx[i], r->aio[i]);
}

static Kvtier__Response *raw_recv(struct raw *r, int i)
{
    nng_aio_wait(r->aio[i]);
    assert_int_equal(nng_aio_result(r->aio[i]), 0);
    nng_msg *m = nng_aio_get_msg(r->aio[i]);
    Kvtier__Response *rsp = kvtier__response__unpack(NULL, nng_msg_len(m),
                                                     nng_msg_body(m));
    nng_msg_free(m);
    assert_non_null(rsp);
    assert_int_equal(rsp->err, 0);
    return rsp;
}

static Kvtier__Response *raw_call(struct raw *r, Kvtier__Request *q)
{
    raw_send(r, 0, q);
    return raw_recv(r, 0);
}

static uint64_t raw_register(struct raw *r, const struct kve *e)
{
    Kvtier__KvLayout l = KVTIER__KV_LAYOUT__INIT;
    l.kind = e->f.p.kind, l.num_layers = e->f.p.num_layers;
    l.num_blocks = e->f.p.num_blocks, l.block_size = e->f.p.block_size;
    l.num_kv_heads = e->f.p.num_kv_heads, l.head_size = e->f.p.head_size;
    l.elem_size = e->f.p.elem_size;
    uint64_t off[KVT_LAYOUT_MAX_LAYERS];
    for (size_t i = 0; i < e->f.n_tensors; i++) off[i] = e->f.bases[i] - (uintptr_t)e->map;
    Kvtier__KvMemory m = KVTIER__KV_MEMORY__INIT;
    m.shm_path = (char *)e->path;
    m.offsets = off;
    m.n_offsets = e->f.n_tensors;
    Kvtier__RegisterKvCache rk = KVTIER__REGISTER_KV_CACHE__INIT;
    rk.ns = NS;
    rk.layout = &l;
    rk.memory = &m;
    rk.chunk_tokens = CT;
    Kvtier__Request q = KVTIER__REQUEST__INIT;
    q.body_case = KVTIER__REQUEST__BODY_REGISTER_KV_CACHE;
    q.register_kv_cache = &rk;
    Kvtier__Response *rsp = raw_call(r, &q);
    uint64_t reg = rsp->register_kv_cache->reg;
    kvtier__response__free_unpacked(rsp, NULL);
    return reg;
}

static uint64_t raw_save(struct raw *r, uint64_t reg, uint64_t seed, size_t n)
{
    kvt_key k[NK];
    ProtobufCBinaryData kb[NK];
    int32_t ids[NK * 4];
    keys_of(seed, k);
    for (size_t i = 0; i < n; i++) kb[i] = (ProtobufCBinaryData){KVT_KEY_LEN, k[i].b};
    for (size_t i = 0; i < n * 4; i++) ids[i] = (int32_t)i;
    Kvtier__KvTransfer t = KVTIER__KV_TRANSFER__INIT;
    t.ns = NS, t.reg = reg, t.keys = kb, t.n_keys = n;
    t.block_ids = ids, t.n_block_ids = n * 4;
    Kvtier__Request q = KVTIER__REQUEST__INIT;
    q.body_case = KVTIER__REQUEST__BODY_KV_SAVE;
    q.kv_save = &t;
    Kvtier__Response *rsp = raw_call(r, &q);
    uint64_t x = rsp->kv_transfer->xfer;
    kvtier__response__free_unpacked(rsp, NULL);
    return x;
}

static void raw_wait(struct raw *r, int i, uint64_t *ids, size_t n, uint32_t ms)
{
    Kvtier__KvWait w = KVTIER__KV_WAIT__INIT;
    w.xfers = ids, w.n_xfers = n, w.timeout_ms = ms;
    Kvtier__Request q = KVTIER__REQUEST__INIT;
    q.body_case = KVTIER__REQUEST__BODY_KV_WAIT;
    q.kv_wait = &w;
    raw_send(r, i, &q);
}

/* W1 waits for [x, y] (3 s), W2 for [y] (100 ms), both parked; x ends,
 * a poll collects it; W2 times out first; y ends and W1 hears that x was
 * collected meanwhile. Another connection closing leaves both alone. */
static void test_waits_on_one_connection(void **state)
{
    (void)state;
    struct raw r;
    struct kve e;
    fx_shape s = big();
    raw_open(&r);
    assert_int_equal(kve_open(&e, KVT_LAYOUT_VLLM_FLASH_NHD, &s, 40), 0);
    uint64_t reg = raw_register(&r, &e);
    uint64_t xy[2] = {raw_save(&r, reg, 41, 1), raw_save(&r, reg, 42, NK)};
    raw_wait(&r, 1, xy, 2, 3000);
    raw_wait(&r, 2, xy + 1, 1, 100);
    usleep(4 * DELAY_MS * 1000); /* x (one chunk) is done */
    kvt_close(td_connect(&D));
    raw_wait(&r, 0, xy, 1, 0);
    Kvtier__Response *p = raw_recv(&r, 0);
    assert_true(p->kv_wait->status[0]->done);
    kvtier__response__free_unpacked(p, NULL);
    Kvtier__Response *w2 = raw_recv(&r, 2);
    assert_false(w2->kv_wait->status[0]->done);
    kvtier__response__free_unpacked(w2, NULL);
    Kvtier__Response *w1 = raw_recv(&r, 1);
    assert_true(w1->kv_wait->status[0]->done);
    assert_int_equal(w1->kv_wait->status[0]->err, KVT_ENOENT);
    assert_string_equal(w1->kv_wait->status[0]->msg, "already collected");
    assert_true(w1->kv_wait->status[1]->done);
    assert_int_equal(w1->kv_wait->status[1]->err, KVT_OK);
    kvtier__response__free_unpacked(w1, NULL);
    raw_close(&r);
    kve_close(&e);
    kvt_client *c = td_connect(&D);
    settles(c, 0);
    kvt_close(c);
}

int main(int argc, char **argv)
{
    if (argc == 6 && strcmp(argv[1], "--child") == 0)
        return child(argv[2], argv[3], atoi(argv[4]), strtoull(argv[5], NULL, 10));
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_killed_mid_save),
        cmocka_unit_test(test_killed_mid_load),
        cmocka_unit_test(test_killed_waiting_fast),
        cmocka_unit_test(test_killed_waiting_nng),
        cmocka_unit_test(test_wait_fast),
        cmocka_unit_test(test_wait_nng),
        cmocka_unit_test(test_more_waiters_than_parked),
        cmocka_unit_test(test_delete_during_load),
        cmocka_unit_test(test_waits_on_one_connection),
        cmocka_unit_test(test_shutdown_mid_transfer),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
