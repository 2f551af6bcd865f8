/*
 * test_events.c -- KV events from a real kvtierd, read by a ZMQ SUB socket
 * and a msgpack decoder of vLLM's KVEventBatch (tests/lib/evsub.h):
 * every store and drop of the DRAM and NVMe tiers, namespace clears and
 * AllBlocksCleared, sequence numbers, replay, the inventory after a
 * restart, connect-mode endpoints, events off by default, and every way
 * the configuration or the sockets can be refused.
 *
 * Waits are bounded by deadlines only; nothing asserts on time.
 */
#include <fcntl.h>
#include <netinet/in.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "daemon.h"
#include "evsub.h"
#include "kvtier.h"
#include "nvtest.h"

#define WAIT_MS 10000
#define SMALL 16384u
#define CH (256u << 10)

/* A daemon with events on a free port (and replay on ipc in its dir). */
struct evd {
    struct tdaemon D;
    char pub[64], sub[64], replay[400];
    struct evsub s;
    kvt_client *c;
};

/* Start (NVMe tier of nvme_mb when > 0) with events plus `more` args,
 * subscribe and sync. */
static void evd_start(struct evd *x, int nvme_mb, const char *const *more)
{
    const char *args[40];
    int n = 0, port = td_free_port();
    if (!x->D.dir[0]) assert_int_equal(td_init(&x->D), 0);
    snprintf(x->pub, sizeof x->pub, "tcp://*:%d", port);
    snprintf(x->sub, sizeof x->sub, "tcp://127.0.0.1:%d", port);
    snprintf(x->replay, sizeof x->replay, "ipc://%s/replay", x->D.dir);
    const char *ev[] = {"--events.endpoint", x->pub, "--events.replay_endpoint",
                        x->replay, NULL};
    for (int i = 0; ev[i]; i++) args[n++] = ev[i];
    for (int i = 0; more && more[i]; i++) args[n++] = more[i];
    args[n] = NULL;
    if (nvme_mb) assert_int_equal(nvt_start(&x->D, nvme_mb, nvme_mb, args), 0);
    else assert_int_equal(td_start(&x->D, args), 0);
    assert_int_equal(evs_open(&x->s, x->sub, ""), 0);
    x->c = td_connect(&x->D);
    assert_int_equal(evs_sync(&x->s, x->c), 0);
}

/* Every batch decoded, in order, on the expected topic. */
static void evd_check_stream(const struct evsub *s)
{
    assert_int_equal(s->bad_payload, 0);
    assert_int_equal(s->bad_order, 0);
    assert_int_equal(s->bad_topic, 0);
}

static void evd_stop(struct evd *x)
{
    evd_check_stream(&x->s);
    kvt_close(x->c);
    evs_close(&x->s);
    assert_int_equal(td_stop(&x->D), 0);
    td_cleanup(&x->D);
}

/* The record of a stored key on a medium; fails the test if absent. */
static const struct evs_rec *stored(const struct evsub *s, const char *medium,
                                    uint64_t i)
{
    kvt_key k = td_key(i);
    int at = evs_find(s, EVS_STORED, medium, &k);
    if (at < 0) fail_msg("no BlockStored %s for chunk %llu", medium, (unsigned long long)i);
    return &s->v[at];
}

static void assert_parent(const struct evs_rec *r, uint64_t parent)
{
    kvt_key p = td_key(parent);
    assert_true(r->has_parent);
    assert_memory_equal(r->parent.b, p.b, KVT_KEY_LEN);
}

/* ------------------------------------------------------------- DRAM */

/* put -> BlockStored CPU with the chunk keys, chained parents, the
 * configured block_size and dp_rank; delete -> BlockRemoved CPU. */
static void test_dram_put_delete(void **state)
{
    (void)state;
    struct evd x = {0};
    const char *more[] = {"--events.block_size", "256", "--events.dp_rank", "3", NULL};
    evd_start(&x, 0, more);
    assert_int_equal(nvt_put_chain(x.c, 1, 3, SMALL), KVT_OK); /* parent 0: absent */
    assert_int_equal(evs_wait(&x.s, 3, WAIT_MS), 3);
    assert_false(stored(&x.s, "CPU", 1)->has_parent); /* the index knows no parent */
    assert_parent(stored(&x.s, "CPU", 2), 1);
    assert_parent(stored(&x.s, "CPU", 3), 2);
    for (size_t i = 0; i < x.s.n; i++) {
        assert_int_equal(x.s.v[i].block_size, 256);
        assert_int_equal(x.s.v[i].dp_rank, 3);
    }
    /* A chain continued from a cached chunk names it as parent. */
    assert_int_equal(nvt_put_chain(x.c, 4, 2, SMALL), KVT_OK);
    assert_int_equal(evs_wait(&x.s, 5, WAIT_MS), 5);
    assert_parent(stored(&x.s, "CPU", 4), 3);
    assert_parent(stored(&x.s, "CPU", 5), 4);
    kvt_key k2 = td_key(2);
    size_t del = 0;
    assert_int_equal(kvt_delete(x.c, NVT_NS, &k2, 1, &del), KVT_OK);
    assert_int_equal(del, 1);
    assert_int_equal(evs_wait(&x.s, 6, WAIT_MS), 6);
    assert_true(evs_find(&x.s, EVS_REMOVED, "CPU", &k2) >= 0);
    assert_int_equal(evs_count(&x.s, EVS_REMOVED, NULL), 1);
    assert_int_equal(evs_count(&x.s, EVS_STORED, "CPU"), 5);
    /* One commit of 20: one event of 20 hashes (a msgpack array16). */
    evs_reset(&x.s);
    assert_int_equal(nvt_put_chain(x.c, 100, 20, SMALL), KVT_OK);
    assert_int_equal(evs_wait(&x.s, 20, WAIT_MS), 20);
    for (uint64_t i = 101; i < 120; i++) assert_parent(stored(&x.s, "CPU", i), i - 1);
    evd_stop(&x);
}

/* A chunk deleted while a reader pins it is removed at the delete (it is
 * invisible from then on), not again when the pin goes. */
static void test_delete_pinned(void **state)
{
    (void)state;
    struct evd x = {0};
    evd_start(&x, 0, NULL);
    assert_int_equal(nvt_put_chain(x.c, 1, 1, SMALL), KVT_OK);
    kvt_key k = td_key(1);
    kvt_chunk ch;
    kvt_lease l;
    size_t got = 0;
    assert_int_equal(kvt_get(x.c, NVT_NS, &k, 1, &l, &ch, &got), KVT_OK);
    assert_int_equal(got, 1);
    assert_int_equal(kvt_delete(x.c, NVT_NS, &k, 1, NULL), KVT_OK);
    assert_int_equal(evs_wait(&x.s, 2, WAIT_MS), 2);
    assert_true(evs_find(&x.s, EVS_REMOVED, "CPU", &k) >= 0);
    assert_int_equal(kvt_release(x.c, l), KVT_OK);
    assert_int_equal(nvt_put_chain(x.c, 2, 1, SMALL), KVT_OK); /* a marker */
    assert_int_equal(evs_wait(&x.s, 3, WAIT_MS), 3);
    assert_int_equal(evs_count(&x.s, EVS_REMOVED, NULL), 1);
    evd_stop(&x);
}

/* Clearing one namespace of two removes its keys; clearing the last one
 * empties the cache: AllBlocksCleared, no per-key removals. */
static void test_clear(void **state)
{
    (void)state;
    struct evd x = {0};
    evd_start(&x, 0, NULL);
    const char body[] = "0123456789";
    const void *bufs[1] = {body};
    size_t sz = sizeof body;
    for (uint64_t i = 1; i <= 5; i++) {
        kvt_key k = td_key(i);
        assert_int_equal(kvt_put(x.c, i <= 3 ? "a" : "b", &k, bufs, &sz, 1, NULL, NULL),
                         KVT_OK);
    }
    assert_int_equal(evs_wait(&x.s, 5, WAIT_MS), 5);
    uint64_t n = 0;
    assert_int_equal(kvt_clear(x.c, "a", &n), KVT_OK);
    assert_int_equal(n, 3);
    assert_int_equal(evs_wait(&x.s, 8, WAIT_MS), 8);
    for (uint64_t i = 1; i <= 3; i++) {
        kvt_key k = td_key(i);
        assert_true(evs_find(&x.s, EVS_REMOVED, "CPU", &k) >= 0);
    }
    assert_int_equal(evs_count(&x.s, EVS_CLEARED, NULL), 0);
    assert_int_equal(kvt_clear(x.c, "b", &n), KVT_OK);
    assert_int_equal(n, 2);
    assert_int_equal(evs_wait(&x.s, 9, WAIT_MS), 9);
    assert_int_equal(evs_count(&x.s, EVS_CLEARED, NULL), 1);
    assert_int_equal(evs_count(&x.s, EVS_REMOVED, NULL), 3);
    evd_stop(&x);
}

/* ------------------------------------------------------------- NVMe */

static size_t wait_count(struct evd *x, int kind, const char *medium, size_t want)
{
    long long end = td_now_ms() + WAIT_MS;
    while (evs_count(&x->s, kind, medium) < want && td_now_ms() < end)
        evs_wait(&x->s, x->s.n + 1, 100);
    return evs_count(&x->s, kind, medium);
}

/* flush -> BlockStored STORAGE; evicting DRAM copies -> BlockRemoved
 * CPU; NVMe full -> BlockRemoved STORAGE of exactly the chunks NVMe
 * dropped; a GET of an NVMe-only chunk -> BlockStored CPU. */
static void test_nvme(void **state)
{
    (void)state;
    struct evd x = {0};
    const char *more[] = {"--nvme.nvme_high_watermark", "1.0",
                          "--nvme.nvme_low_watermark", "0.9", NULL};
    evd_start(&x, 4, more); /* 15 records of 260 KiB */
    assert_int_equal(nvt_put_chain(x.c, 1, 10, CH), KVT_OK);
    assert_int_equal(wait_count(&x, EVS_STORED, "CPU", 10), 10);
    Kvtier__FlushResp fr;
    assert_int_equal(nvt_flush(x.c, 0, &fr), KVT_OK);
    assert_int_equal(fr.written, 10);
    assert_int_equal(wait_count(&x, EVS_STORED, "STORAGE", 10), 10);
    for (uint64_t i = 2; i <= 10; i++) assert_parent(stored(&x.s, "STORAGE", i), i - 1);
    uint64_t freed = 0;
    assert_int_equal(kvt_evict(x.c, 64u << 20, &freed), KVT_OK);
    assert_int_equal(wait_count(&x, EVS_REMOVED, "CPU", 10), 10);
    assert_int_equal(evs_count(&x.s, EVS_REMOVED, "STORAGE"), 0);
    for (uint64_t i = 1; i <= 10; i++) {
        kvt_key k = td_key(i);
        assert_true(evs_find(&x.s, EVS_REMOVED, "CPU", &k) >= 0);
    }
    /* A second chain pushes the first one's tail off NVMe. */
    evs_reset(&x.s);
    assert_int_equal(nvt_put_chain(x.c, 50, 10, CH), KVT_OK);
    assert_int_equal(nvt_flush(x.c, 1, &fr), KVT_OK);
    assert_int_equal(fr.written, 10);
    uint64_t ev = nvt_stat(x.c, "nvme.evictions");
    assert_true(ev >= 5 && ev != UINT64_MAX);
    assert_int_equal(wait_count(&x, EVS_STORED, "STORAGE", 10), 10);
    assert_int_equal(wait_count(&x, EVS_REMOVED, "CPU", 10), 10); /* --evict */
    assert_int_equal(wait_count(&x, EVS_REMOVED, "STORAGE", ev), ev);
    kvt_tier t[10];
    size_t head = nvt_lookup(x.c, 1, 10, 0, t);
    for (uint64_t i = 1; i <= 10; i++) {
        kvt_key k = td_key(i);
        assert_int_equal(evs_find(&x.s, EVS_REMOVED, "STORAGE", &k) >= 0, i > head);
    }
    /* Reading one back puts a DRAM copy there again. */
    evs_reset(&x.s);
    assert_true(nvt_check(x.c, 50, CH));
    assert_int_equal(wait_count(&x, EVS_STORED, "CPU", 1), 1);
    stored(&x.s, "CPU", 50);
    evd_stop(&x);
}

/* Flip one byte every 64 KiB of the first NVMe data file. */
static void flip_bytes(const struct tdaemon *d)
{
    char path[400];
    struct stat st;
    snprintf(path, sizeof path, "%s/nvme/kvtier-00000.nvd", d->dir);
    int fd = open(path, O_RDWR);
    assert_true(fd >= 0);
    assert_int_equal(fstat(fd, &st), 0);
    for (off_t at = 8192 + 100; at < st.st_size; at += 65536) {
        uint8_t b;
        assert_int_equal(pread(fd, &b, 1, at), 1);
        b ^= 0x5a;
        assert_int_equal(pwrite(fd, &b, 1, at), 1);
    }
    close(fd);
}

/* A record that comes back damaged, read by a GET or by VERIFY, is
 * dropped: BlockRemoved STORAGE, one per dropped record. */
static void test_nvme_damaged(void **state)
{
    (void)state;
    struct evd x = {0};
    evd_start(&x, 16, NULL);
    assert_int_equal(nvt_put_chain(x.c, 1, 12, CH), KVT_OK);
    assert_int_equal(nvt_flush(x.c, 1, NULL), KVT_OK);
    assert_int_equal(wait_count(&x, EVS_REMOVED, "CPU", 12), 12);
    flip_bytes(&x.D);
    evs_reset(&x.s);
    int served = 0;
    for (int i = 1; i <= 6; i++) served += nvt_check(x.c, i, CH);
    uint64_t bad = nvt_stat(x.c, "checksum_failures");
    assert_int_equal(bad + (uint64_t)served, 6);
    Kvtier__VerifyResp vr;
    assert_int_equal(nvt_verify(x.c, 0, &vr), KVT_OK);
    assert_true(bad + vr.bad >= 1);
    assert_int_equal(wait_count(&x, EVS_REMOVED, "STORAGE", bad + vr.bad), bad + vr.bad);
    assert_int_equal(wait_count(&x, EVS_STORED, "CPU", (size_t)served), served);
    assert_int_equal(nvt_stat(x.c, "nvme.chunks"), 12 - bad - vr.bad);
    evd_stop(&x);
}

/* ------------------------------------------------------------- replay */

/* The replay socket answers with the kept batches (the newest
 * buffer_steps) from a sequence number on, then the end marker; the
 * payloads are the ones published live. A malformed request is ignored. */
static void test_replay(void **state)
{
    (void)state;
    struct evd x = {0};
    const char *more[] = {"--events.buffer_steps", "3", NULL};
    evd_start(&x, 0, more);
    for (uint64_t i = 1; i <= 6; i++)
        assert_int_equal(nvt_put_chain(x.c, 10 * i, 1, SMALL), KVT_OK);
    assert_int_equal(evs_wait(&x.s, 6, WAIT_MS), 6);
    uint64_t last = x.s.v[x.s.n - 1].seq, seqs[16];
    struct evsub r;
    /* After a request of the wrong shape (ignored), the next is served. */
    int n = evs_replay(x.replay, 0, 1, &r, seqs, 16, WAIT_MS);
    assert_int_equal(n, 3);
    assert_int_equal(seqs[2], last);
    for (int i = 1; i < n; i++) assert_true(seqs[i] > seqs[i - 1]);
    for (size_t i = 0; i < r.n; i++) { /* same records as live */
        int at = evs_find(&x.s, r.v[i].kind, r.v[i].medium, &r.v[i].key);
        assert_true(at >= 0);
        assert_int_equal(x.s.v[at].seq, r.v[i].seq);
    }
    evs_close(&r);
    assert_int_equal(evs_replay(x.replay, last, 0, &r, seqs, 16, WAIT_MS), 1);
    assert_int_equal(seqs[0], last);
    evs_close(&r);
    assert_int_equal(evs_replay(x.replay, last + 1, 0, &r, seqs, 16, WAIT_MS), 0);
    evs_close(&r);
    evd_stop(&x);
}

/* After a restart (the DRAM pool adopted) seq starts again at 0 with
 * AllBlocksCleared, then a BlockStored for every chunk the daemon holds. */
static void test_restart_inventory(void **state)
{
    (void)state;
    struct evd x = {0};
    evd_start(&x, 0, NULL);
    assert_int_equal(nvt_put_chain(x.c, 1, 4, SMALL), KVT_OK);
    assert_int_equal(evs_wait(&x.s, 4, WAIT_MS), 4);
    kvt_close(x.c);
    evs_close(&x.s);
    assert_int_equal(td_stop(&x.D), 0);
    evd_start(&x, 0, NULL);
    struct evsub r;
    uint64_t seqs[16];
    assert_true(evs_replay(x.replay, 0, 0, &r, seqs, 16, WAIT_MS) >= 1);
    assert_int_equal(seqs[0], 0);
    assert_true(r.n >= 5);
    assert_int_equal(r.v[0].kind, EVS_CLEARED);
    for (uint64_t i = 1; i <= 4; i++) stored(&r, "CPU", i);
    assert_parent(stored(&r, "CPU", 4), 3);
    evs_close(&r);
    evd_stop(&x);
}

/* tcp://HOST:PORT connects, as in vLLM: the subscriber binds (llm-d). */
static void test_connect_mode(void **state)
{
    (void)state;
    struct tdaemon D;
    struct evsub s;
    char bind_url[64], url[64];
    int port = td_free_port();
    snprintf(bind_url, sizeof bind_url, "tcp://127.0.0.1:%d", port);
    snprintf(url, sizeof url, "tcp://127.0.0.1:%d", port);
    assert_int_equal(evs_open_bound(&s, bind_url, "kv@node@model"), 0);
    const char *args[] = {"--events.endpoint", url, "--events.topic", "kv@node@model", NULL};
    assert_int_equal(td_init(&D), 0);
    assert_int_equal(td_start(&D, args), 0);
    assert_true(td_log_has(&D, "connected to"));
    kvt_client *c = td_connect(&D);
    assert_int_equal(evs_sync(&s, c), 0);
    assert_int_equal(nvt_put_chain(c, 1, 2, SMALL), KVT_OK);
    assert_int_equal(evs_wait(&s, 2, WAIT_MS), 2);
    stored(&s, "CPU", 2);
    evd_check_stream(&s);
    kvt_close(c);
    evs_close(&s);
    assert_int_equal(td_stop(&D), 0);
    td_cleanup(&D);
}

/* --------------------------------------------------- off and refused */

/* 1 if a thread of pid is one of libzmq's (a ZMQ context exists). */
static int has_zmq_thread(pid_t pid)
{
    char cmd[128], line[64];
    snprintf(cmd, sizeof cmd, "cat /proc/%d/task/*/comm 2>/dev/null", (int)pid);
    FILE *f = popen(cmd, "r");
    int hit = 0;
    while (f && fgets(line, sizeof line, f)) hit |= strncmp(line, "ZMQbg", 5) == 0;
    if (f) pclose(f);
    return hit;
}

static void test_off_by_default(void **state)
{
    (void)state;
    struct tdaemon D;
    assert_int_equal(td_init(&D), 0);
    assert_int_equal(td_start(&D, NULL), 0);
    kvt_client *c = td_connect(&D);
    assert_int_equal(nvt_put_chain(c, 1, 2, SMALL), KVT_OK);
    assert_false(has_zmq_thread(D.pid));
    assert_false(td_log_has(&D, "events:"));
    kvt_close(c);
    assert_int_equal(td_stop(&D), 0);
    td_cleanup(&D);
    /* The check itself sees libzmq's threads when events are on. */
    struct evd x = {0};
    evd_start(&x, 0, NULL);
    assert_true(has_zmq_thread(x.D.pid));
    evd_stop(&x);
}

/* kvtierd refuses to start (exit 2) and names the key. */
static void refused(const char *const *args, const char *want)
{
    struct tdaemon D;
    assert_int_equal(td_init(&D), 0);
    pid_t pid = td_spawn(&D, args);
    assert_int_equal(td_wait_exit(pid, WAIT_MS), 2);
    if (!td_log_has(&D, want)) fail_msg("log lacks '%s'", want);
    assert_false(td_log_has(&D, "Sanitizer"));
    td_cleanup(&D);
}

static void test_bad_config(void **state)
{
    (void)state;
    const char *a1[] = {"--events.endpoint", "udp://*:5557", NULL};
    const char *a2[] = {"--events.endpoint", "inproc://kv", NULL};
    const char *a3[] = {"--events.replay_endpoint", "tcp://*:5558", NULL};
    const char *a4[] = {"--events.endpoint", "tcp://*:5557", "--events.replay_endpoint",
                        "tcp://*:5557", NULL};
    const char *a5[] = {"--events.endpoint", "tcp://*:5557", "--events.replay_endpoint",
                        "tcp://", NULL};
    const char *a6[] = {"--events.buffer_steps", "0", NULL};
    const char *a7[] = {"--events.block_size", "0", NULL};
    const char *a8[] = {"--events.dp_rank", "70000", NULL};
    const char *a9[] = {"--events.hwm", "-1", NULL};
    const char *a10[] = {"--events.endpoint", "tcp://", NULL};
    refused(a1, "events.endpoint 'udp://*:5557'");
    refused(a2, "events.endpoint 'inproc://kv'");
    refused(a3, "events.replay_endpoint 'tcp://*:5558'");
    refused(a4, "events.replay_endpoint 'tcp://*:5557'");
    refused(a5, "events.replay_endpoint 'tcp://'");
    refused(a6, "events.buffer_steps = '0': out of range");
    refused(a7, "events.block_size = '0': out of range");
    refused(a8, "events.dp_rank = '70000': out of range");
    refused(a9, "events.hwm = '-1': out of range");
    refused(a10, "events.endpoint 'tcp://'");
}

/* A listening socket on 0.0.0.0:port; returns its fd. */
static int occupy(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    assert_int_equal(listen(fd, 1), 0);
    return fd;
}

/* An endpoint in use stops the daemon (exit 1) with the reason, and
 * leaves nothing behind (the sanitizer build checks for leaks). */
static void in_use(const char *key, int busy_pub)
{
    struct tdaemon D;
    char busy[64], free_url[64], want[160];
    int port = td_free_port(), fd = occupy(port);
    snprintf(busy, sizeof busy, "tcp://*:%d", port);
    snprintf(free_url, sizeof free_url, "tcp://*:%d", td_free_port());
    const char *args[] = {"--events.endpoint", busy_pub ? busy : free_url,
                          "--events.replay_endpoint", busy_pub ? free_url : busy, NULL};
    assert_int_equal(td_init(&D), 0);
    pid_t pid = td_spawn(&D, args);
    assert_int_equal(td_wait_exit(pid, WAIT_MS), 1);
    snprintf(want, sizeof want, "events.%s '%s': cannot bind: Address already in use",
             key, busy);
    if (!td_log_has(&D, want)) fail_msg("log lacks '%s'", want);
    assert_false(td_log_has(&D, "Sanitizer")); /* a half-open publisher closed whole */
    close(fd);
    td_cleanup(&D);
}

static void test_endpoint_in_use(void **state)
{
    (void)state;
    in_use("endpoint", 1);
    in_use("replay_endpoint", 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dram_put_delete),
        cmocka_unit_test(test_delete_pinned),
        cmocka_unit_test(test_clear),
        cmocka_unit_test(test_nvme),
        cmocka_unit_test(test_nvme_damaged),
        cmocka_unit_test(test_replay),
        cmocka_unit_test(test_restart_inventory),
        cmocka_unit_test(test_connect_mode),
        cmocka_unit_test(test_off_by_default),
        cmocka_unit_test(test_bad_config),
        cmocka_unit_test(test_endpoint_in_use),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
