/*
 * test_kvcache_badinput.c -- bad KV-cache requests against a real kvtierd.
 *
 * Every bad REGISTER_KV_CACHE, SAVE, LOAD and KvWait must come back as an
 * error with the right kvt_err, and must change nothing: the engine's
 * tensors keep their checksum (nothing written into the cache), the pool
 * keeps its usage (nothing reserved) and chunks a refused LOAD looked at
 * are not left pinned. Then the faults a transfer meets after it was
 * accepted: a chunk scribbled over in the pool (KVT_ECORRUPT, nothing
 * loaded) and an engine file truncated under the daemon (SIGBUS caught:
 * KVT_EIO, daemon up).
 */
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "client_internal.h"
#include "daemon.h"
#include "kvengine.h"
#include "kvtier.h"

static struct tdaemon D;
static char tcp_url[64];

#define NS "bad/ns"
#define CT 8      /* chunk tokens */
#define NK 3      /* keys per transfer */
#define MAX_KEYS 32

static int setup(void **state)
{
    (void)state;
    int port = 20000 + (int)((getpid() + 7) % 20000);
    snprintf(tcp_url, sizeof tcp_url, "tcp://127.0.0.1:%d", port);
    const char *extra[] = {"--max-keys", "32", "--max-chunk-bytes", "16K",
                           "--tcp", tcp_url, "--tcp-insecure", "1", NULL};
    return td_start(&D, extra);
}

static int teardown(void **state)
{
    (void)state;
    int rc = td_stop(&D);
    td_cleanup(&D);
    return rc;
}

static fx_shape shape(void)
{
    return (fx_shape){.layers = 3, .blocks = 24, .block_size = 4, .heads = 2,
                      .head_size = 12, .elem_size = 2};
}

/* An engine with NK keys saved from blocks 0..: the state every transfer
 * case starts from. */
struct eng {
    struct kve e;
    kvt_kv_reg reg;
    uint32_t bpc;
    kvt_key keys[NK];
    int32_t ids[NK * 2];
};

static void eng_up(kvt_client *c, struct eng *g, const char *ns, uint64_t seed)
{
    fx_shape s = shape();
    kvt_kv_info info;
    assert_int_equal(kve_open(&g->e, KVT_LAYOUT_VLLM_FLASH_HND, &s, seed), 0);
    assert_int_equal(kve_register(c, &g->e, ns, CT, &g->reg, &info), KVT_OK);
    g->bpc = info.blocks_per_chunk;
    for (size_t i = 0; i < NK; i++) g->keys[i] = td_key(seed * 100 + i);
    for (size_t i = 0; i < NK * g->bpc; i++) g->ids[i] = (int32_t)i;
    kvt_xfer x;
    kvt_xfer_status st;
    assert_int_equal(kvt_kv_save(c, ns, g->reg, g->keys, NK, g->ids, NK * g->bpc,
                                 NULL, &x), KVT_OK);
    assert_int_equal(kve_wait1(c, x, &st), KVT_OK);
    assert_int_equal(st.err, KVT_OK);
}

static uint64_t used(kvt_client *c)
{
    kvt_stats s;
    assert_int_equal(kvt_stats_get(c, &s), KVT_OK);
    return s.used_bytes;
}

static kvt_kv_stats kvstats(kvt_client *c)
{
    kvt_kv_stats s;
    assert_int_equal(kvt_kv_stats_get(c, &s), KVT_OK);
    return s;
}

/* ------------------------------------------------------- registration */

static void test_register_files(void **state)
{
    (void)state;
    kvt_client *c = td_connect(&D);
    struct kve e;
    fx_shape s = shape();
    kvt_kv_reg reg;
    assert_int_equal(kve_open(&e, KVT_LAYOUT_VLLM_FLASH_NHD, &s, 1), 0);
    const kvt_layout_params *p = &e.f.p;
    /* No such file; a directory; not a regular file; a symlink. */
    assert_int_equal(kvt_kv_register_host(c, NS, p, CT, "/dev/shm/kvt-none", e.map,
                                          &reg, NULL), KVT_ENOENT);
    assert_int_equal(kvt_kv_register_host(c, NS, p, CT, "/dev/shm", e.map, &reg,
                                          NULL), KVT_EINVAL);
    assert_int_equal(kvt_kv_register_host(c, NS, p, CT, "/dev/null", e.map, &reg,
                                          NULL), KVT_EINVAL);
    char link[128];
    snprintf(link, sizeof link, "%s.link", e.path);
    assert_int_equal(symlink(e.path, link), 0);
    assert_int_equal(kvt_kv_register_host(c, NS, p, CT, link, e.map, &reg, NULL),
                     KVT_EINVAL);
    unlink(link);
    assert_non_null(strstr(kvt_last_error(c), "symlink"));
    /* A symlink earlier on the path: a directory link to the file's. */
    char dir[128], dlink[160], via[400];
    snprintf(dir, sizeof dir, "%s", e.path);
    *strrchr(dir, '/') = '\0';
    snprintf(dlink, sizeof dlink, "%s.dlink", e.path);
    assert_int_equal(symlink(dir, dlink), 0);
    snprintf(via, sizeof via, "%s%s", dlink, strrchr(e.path, '/'));
    assert_int_equal(kvt_kv_register_host(c, NS, p, CT, via, e.map, &reg, NULL),
                     KVT_EINVAL);
    unlink(dlink);
    /* A fifo (never opened: no writer would make that hang) and another
     * device than /dev/null. */
    char fifo[128];
    snprintf(fifo, sizeof fifo, "%s.fifo", e.path);
    assert_int_equal(mkfifo(fifo, 0600), 0);
    assert_int_equal(kvt_kv_register_host(c, NS, p, CT, fifo, e.map, &reg, NULL),
                     KVT_EINVAL);
    unlink(fifo);
    assert_int_equal(kvt_kv_register_host(c, NS, p, CT, "/dev/zero", e.map, &reg,
                                          NULL), KVT_EINVAL);
    /* The client's own file, but not writable by its owner: the daemon
     * (root here) could write it, the client could not. */
    assert_int_equal(chmod(e.path, 0400), 0);
    assert_int_equal(kvt_kv_register_host(c, NS, p, CT, e.path, e.map, &reg, NULL),
                     KVT_EPERM);
    assert_non_null(strstr(kvt_last_error(c), "not readable and writable"));
    assert_int_equal(chmod(e.path, 0600), 0);
    /* Not the client's: another owner (root) or no access (others). */
    if (geteuid() == 0) assert_int_equal(chown(e.path, 65534, 65534), 0);
    else assert_int_equal(chmod(e.path, 0), 0);
    assert_int_equal(kvt_kv_register_host(c, NS, p, CT, e.path, e.map, &reg, NULL),
                     KVT_EPERM);
    if (geteuid() == 0) assert_int_equal(chown(e.path, 0, 0), 0);
    else assert_int_equal(chmod(e.path, 0600), 0);
    /* Empty. */
    char empty[128];
    snprintf(empty, sizeof empty, "%s.empty", e.path);
    int fd = open(empty, O_CREAT | O_RDWR, 0600);
    assert_true(fd >= 0);
    close(fd);
    assert_int_equal(kvt_kv_register_host(c, NS, p, CT, empty, e.map, &reg, NULL),
                     KVT_EINVAL);
    unlink(empty);
    /* Tensors past the end: an offset beyond it, a tensor across it. */
    assert_int_equal(kvt_kv_register_host(c, NS, p, CT, e.path, e.map - e.len,
                                          &reg, NULL), KVT_EINVAL);
    assert_int_equal(e.f.tensor_bytes % 64, 0); /* so the last one ends at EOF */
    assert_int_equal(kvt_kv_register_host(c, NS, p, CT, e.path, e.map - 64, &reg,
                                          NULL), KVT_EINVAL);
    assert_non_null(strstr(kvt_last_error(c), "does not fit"));
    assert_int_equal(kvstats(c).registrations, 0);
    kve_close(&e);
    kvt_close(c);
}

static void test_register_layouts(void **state)
{
    (void)state;
    kvt_client *c = td_connect(&D);
    struct kve e;
    fx_shape s = shape();
    kvt_kv_reg reg;
    assert_int_equal(kve_open(&e, KVT_LAYOUT_VLLM_FLASH_NHD, &s, 2), 0);
    kvt_layout_params p = e.f.p;
    p.elem_size = 3; /* the daemon's kvt_layout_init refuses it */
    assert_int_equal(kvt_kv_register_host(c, NS, &p, CT, e.path, e.map, &reg, NULL),
                     KVT_EINVAL);
    p = e.f.p;
    p.kind = (kvt_layout_kind)99;
    assert_int_equal(kvt_kv_register_host(c, NS, &p, CT, e.path, e.map, &reg, NULL),
                     KVT_EINVAL);
    p = e.f.p;
    p.num_layers = 300;
    assert_int_equal(kvt_kv_register_host(c, NS, &p, CT, e.path, e.map, &reg, NULL),
                     KVT_EINVAL);
    p = e.f.p;
    p.n_bases--; /* one offset short */
    assert_int_equal(kvt_kv_register_host(c, NS, &p, CT, e.path, e.map, &reg, NULL),
                     KVT_EINVAL);
    /* chunk_tokens: not a multiple of block_size; more blocks than the
     * cache has; a chunk over max_chunk_bytes (16K). */
    assert_int_equal(kve_register(c, &e, NS, 6, &reg, NULL), KVT_EINVAL);
    assert_int_equal(kve_register(c, &e, NS, 4 * 25, &reg, NULL), KVT_EINVAL);
    assert_int_equal(kve_register(c, &e, NS, 4 * 24, &reg, NULL), KVT_ETOOBIG);
    /* A GPU registration where the daemon has no GPU. */
    uint8_t handles[3 * 64] = {0};
    uint64_t offs[3] = {0, 0, 0};
    assert_int_equal(kvt_kv_register_cuda(c, NS, &e.f.p, CT, 0, handles, offs,
                                          &reg, NULL), KVT_ENOTSUP);
    assert_non_null(strstr(kvt_last_error(c), "unavailable"));
    assert_int_equal(kvstats(c).registrations, 0);
    kve_close(&e);
    kvt_close(c);
}

/* Send a REGISTER_KV_CACHE built by hand; the daemon's error. */
static kvt_err raw_register(kvt_client *c, const char *ns, Kvtier__KvLayout *l,
                            Kvtier__KvMemory *m, uint32_t ct)
{
    Kvtier__RegisterKvCache rk = KVTIER__REGISTER_KV_CACHE__INIT;
    rk.ns = (char *)ns;
    rk.layout = l;
    rk.memory = m;
    rk.chunk_tokens = ct;
    Kvtier__Request q = KVTIER__REQUEST__INIT;
    q.body_case = KVTIER__REQUEST__BODY_REGISTER_KV_CACHE;
    q.register_kv_cache = &rk;
    Kvtier__Response *r = NULL;
    kvt_err e = kvtc_call(c, &q, &r);
    if (r) kvtier__response__free_unpacked(r, NULL);
    return e;
}

static void test_register_raw(void **state)
{
    (void)state;
    kvt_client *c = td_connect(&D);
    struct kve e;
    fx_shape s = shape();
    assert_int_equal(kve_open(&e, KVT_LAYOUT_VLLM_FLASH_NHD, &s, 3), 0);
    Kvtier__KvLayout l = KVTIER__KV_LAYOUT__INIT;
    l.kind = KVT_LAYOUT_VLLM_FLASH_NHD;
    l.num_layers = 3, l.num_blocks = 24, l.block_size = 4;
    l.num_kv_heads = 2, l.head_size = 12, l.elem_size = 2;
    uint64_t offs[3] = {4096, 8192, 12288};
    uint8_t h[64] = {0};
    ProtobufCBinaryData hs[3] = {{64, h}, {64, h}, {64, h}};
    Kvtier__KvMemory m = KVTIER__KV_MEMORY__INIT;
    m.offsets = offs;
    m.n_offsets = 3;
    /* Neither a file nor handles; both; no layout; no memory; bad ns. */
    assert_int_equal(raw_register(c, NS, &l, &m, CT), KVT_EINVAL);
    m.shm_path = e.path;
    m.ipc_handles = hs;
    m.n_ipc_handles = 3;
    assert_int_equal(raw_register(c, NS, &l, &m, CT), KVT_EINVAL);
    m.ipc_handles = NULL;
    m.n_ipc_handles = 0;
    assert_int_equal(raw_register(c, NS, NULL, &m, CT), KVT_EINVAL);
    assert_int_equal(raw_register(c, NS, &l, NULL, CT), KVT_EINVAL);
    assert_int_equal(raw_register(c, "bad ns", &l, &m, CT), KVT_EINVAL);
    assert_int_equal(raw_register(c, NS, &l, &m, 0), KVT_EINVAL);
    /* Good, to be sure the cases above failed for their own reason. */
    assert_int_equal(raw_register(c, NS, &l, &m, CT), KVT_OK);
    kve_close(&e);
    kvt_close(c);
}

/* A remote (tcp://) client cannot have its memory mapped. */
static void test_register_remote(void **state)
{
    (void)state;
    kvt_client *c;
    struct kve e;
    fx_shape s = shape();
    kvt_kv_reg reg;
    assert_int_equal(kvt_connect(tcp_url, &c), KVT_OK);
    assert_int_equal(kve_open(&e, KVT_LAYOUT_VLLM_FLASH_NHD, &s, 4), 0);
    assert_int_equal(kve_register(c, &e, NS, CT, &reg, NULL), KVT_ENOTSUP);
    kve_close(&e);
    kvt_close(c);
}

static void test_register_limit(void **state)
{
    (void)state;
    kvt_client *c = td_connect(&D);
    struct kve e;
    fx_shape s = shape();
    kvt_kv_reg reg;
    assert_int_equal(kve_open(&e, KVT_LAYOUT_VLLM_FLASH_NHD, &s, 5), 0);
    for (int i = 0; i < 64; i++)
        assert_int_equal(kve_register(c, &e, NS, CT, &reg, NULL), KVT_OK);
    assert_int_equal(kve_register(c, &e, NS, CT, &reg, NULL), KVT_ETOOBIG);
    kvt_close(c); /* all 64 go with the connection */
    c = td_connect(&D);
    long long t0 = td_now_ms();
    while (kvstats(c).registrations != 0 && td_now_ms() - t0 < 3000) usleep(5000);
    assert_int_equal(kvstats(c).registrations, 0);
    kve_close(&e);
    kvt_close(c);
}

/* A registration creating a namespace counts against the connection's
 * namespace quota (daemon.ns_per_client, 256 here) like a put does. */
static void test_register_ns_quota(void **state)
{
    (void)state;
    kvt_client *c = td_connect(&D);
    struct kve e;
    fx_shape s = shape();
    kvt_kv_reg reg;
    char ns[64], buf[64] = {0};
    const void *bp = buf;
    size_t sz = sizeof buf;
    kvt_key k = td_key(4242);
    for (int i = 0; i < 256; i++) {
        snprintf(ns, sizeof ns, "quota/%d", i);
        assert_int_equal(kvt_put(c, ns, &k, &bp, &sz, 1, NULL, NULL), KVT_OK);
    }
    assert_int_equal(kve_open(&e, KVT_LAYOUT_VLLM_FLASH_NHD, &s, 6), 0);
    assert_int_equal(kve_register(c, &e, "quota/new", CT, &reg, NULL), KVT_ETOOBIG);
    assert_non_null(strstr(kvt_last_error(c), "namespace quota"));
    /* One it holds is fine; so is a new one once one is freed. */
    assert_int_equal(kve_register(c, &e, "quota/3", CT, &reg, NULL), KVT_OK);
    uint64_t n = 0;
    assert_int_equal(kvt_clear(c, "quota/7", &n), KVT_OK);
    assert_int_equal(kve_register(c, &e, "quota/new", CT, &reg, NULL), KVT_OK);
    for (int i = 0; i < 256; i++) {
        snprintf(ns, sizeof ns, "quota/%d", i);
        assert_int_equal(kvt_clear(c, ns, &n), KVT_OK);
    }
    kve_close(&e);
    kvt_close(c);
}

/* ----------------------------------------------------------- transfers */

static void test_transfer_refused(void **state)
{
    (void)state;
    kvt_client *c = td_connect(&D);
    struct eng g;
    eng_up(c, &g, NS "/x", 10);
    uint64_t sum = kve_sum(&g.e), u = used(c);
    kvt_key fresh[NK] = {td_key(901), td_key(902), td_key(903)};
    int32_t ids[NK * 2];
    size_t nb = NK * g.bpc;
    kvt_xfer x;
    for (size_t i = 0; i < nb; i++) ids[i] = (int32_t)(10 + i);
    /* Block ids out of range, either end; save and load alike. */
    ids[3] = -1;
    assert_int_equal(kvt_kv_save(c, NS "/x", g.reg, fresh, NK, ids, nb, NULL, &x),
                     KVT_EINVAL);
    assert_int_equal(kvt_kv_load(c, NS "/x", g.reg, g.keys, NK, ids, nb, &x),
                     KVT_EINVAL);
    ids[3] = 24;
    assert_int_equal(kvt_kv_save(c, NS "/x", g.reg, fresh, NK, ids, nb, NULL, &x),
                     KVT_EINVAL);
    assert_int_equal(kvt_kv_load(c, NS "/x", g.reg, g.keys, NK, ids, nb, &x),
                     KVT_EINVAL);
    /* One block twice in a load. */
    ids[3] = ids[0];
    assert_int_equal(kvt_kv_load(c, NS "/x", g.reg, g.keys, NK, ids, nb, &x),
                     KVT_EINVAL);
    ids[3] = 13;
    /* Block ids not n_keys * blocks_per_chunk. */
    assert_int_equal(kvt_kv_load(c, NS "/x", g.reg, g.keys, NK, ids, nb - 1, &x),
                     KVT_EINVAL);
    /* Another namespace than the registration's. */
    assert_int_equal(kvt_kv_load(c, "other/ns", g.reg, g.keys, NK, ids, nb, &x),
                     KVT_EINVAL);
    /* An unknown registration. */
    assert_int_equal(kvt_kv_load(c, NS "/x", g.reg ^ 0x5a5a5a, g.keys, NK, ids, nb,
                                 &x), KVT_ENOENT);
    /* Too many keys for max_keys (32). */
    kvt_key many[MAX_KEYS + 1];
    int32_t many_ids[(MAX_KEYS + 1) * 2] = {0};
    for (size_t i = 0; i <= MAX_KEYS; i++) many[i] = td_key(950 + i);
    assert_int_equal(kvt_kv_save(c, NS "/x", g.reg, many, MAX_KEYS + 1, many_ids,
                                 (MAX_KEYS + 1) * g.bpc, NULL, &x), KVT_ETOOBIG);
    assert_int_equal(kve_sum(&g.e), sum);
    assert_int_equal(used(c), u);
    assert_int_equal(kvstats(c).transfers, 0);
    kve_close(&g.e);
    kvt_close(c);
}

/* A key absent at LOAD time: nothing written, nothing left pinned. */
static void test_load_absent(void **state)
{
    (void)state;
    kvt_client *c = td_connect(&D);
    struct eng g;
    eng_up(c, &g, NS "/absent", 11);
    uint64_t sum = kve_sum(&g.e);
    kvt_key keys[NK] = {g.keys[0], g.keys[1], td_key(777)};
    int32_t ids[NK * 2];
    for (size_t i = 0; i < NK * g.bpc; i++) ids[i] = (int32_t)(12 + i);
    kvt_xfer x;
    assert_int_equal(kvt_kv_load(c, NS "/absent", g.reg, keys, NK, ids,
                                 NK * g.bpc, &x), KVT_ENOENT);
    assert_non_null(strstr(kvt_last_error(c), "not cached"));
    assert_int_equal(kve_sum(&g.e), sum);
    /* Unpinned: deleting frees the space at once. */
    uint64_t u = used(c);
    size_t del;
    assert_int_equal(kvt_delete(c, NS "/absent", g.keys, NK, &del), KVT_OK);
    assert_int_equal(del, NK);
    assert_true(used(c) < u);
    kve_close(&g.e);
    kvt_close(c);
}

/* Chunks saved with one chunk size do not load (or re-save) through a
 * registration of another. */
static void test_chunk_size_mismatch(void **state)
{
    (void)state;
    kvt_client *c = td_connect(&D);
    struct eng g;
    eng_up(c, &g, NS "/size", 12);
    kvt_kv_reg small;
    kvt_kv_info info;
    assert_int_equal(kve_register(c, &g.e, NS "/size", CT / 2, &small, &info),
                     KVT_OK);
    assert_int_equal(info.blocks_per_chunk, g.bpc / 2);
    uint64_t sum = kve_sum(&g.e), u = used(c);
    int32_t ids[NK];
    for (size_t i = 0; i < NK; i++) ids[i] = (int32_t)(20 + i);
    kvt_xfer x;
    assert_int_equal(kvt_kv_load(c, NS "/size", small, g.keys, NK, ids, NK, &x),
                     KVT_EINVAL);
    assert_int_equal(kvt_kv_save(c, NS "/size", small, g.keys, NK, ids, NK, NULL,
                                 &x), KVT_EINVAL);
    assert_int_equal(kve_sum(&g.e), sum);
    assert_int_equal(used(c), u);
    kve_close(&g.e);
    kvt_close(c);
}

/* Registrations and transfers belong to their connection. */
static void test_other_client(void **state)
{
    (void)state;
    kvt_client *c = td_connect(&D), *o = td_connect(&D);
    struct eng g;
    eng_up(c, &g, NS "/own", 13);
    int32_t ids[NK * 2];
    for (size_t i = 0; i < NK * g.bpc; i++) ids[i] = (int32_t)(12 + i);
    kvt_xfer x;
    kvt_xfer_status st;
    assert_int_equal(kvt_kv_load(o, NS "/own", g.reg, g.keys, NK, ids, NK * g.bpc,
                                 &x), KVT_EPERM);
    assert_int_equal(kvt_kv_unregister(o, g.reg), KVT_EPERM);
    assert_int_equal(kvt_kv_load(c, NS "/own", g.reg, g.keys, NK, ids, NK * g.bpc,
                                 &x), KVT_OK);
    assert_int_equal(kvt_kv_poll(o, &x, 1, &st), KVT_EPERM);
    assert_int_equal(kve_wait1(c, x, &st), KVT_OK);
    kve_close(&g.e);
    kvt_close(o);
    kvt_close(c);
}

static kvt_err raw_wait(kvt_client *c, uint64_t *ids, size_t n)
{
    Kvtier__KvWait w = KVTIER__KV_WAIT__INIT;
    w.xfers = ids;
    w.n_xfers = n;
    Kvtier__Request q = KVTIER__REQUEST__INIT;
    q.body_case = KVTIER__REQUEST__BODY_KV_WAIT;
    q.kv_wait = &w;
    Kvtier__Response *r = NULL;
    kvt_err e = kvtc_call(c, &q, &r);
    if (r) kvtier__response__free_unpacked(r, NULL);
    return e;
}

static kvt_err raw_transfer(kvt_client *c, Kvtier__KvTransfer *t)
{
    Kvtier__Request q = KVTIER__REQUEST__INIT;
    q.body_case = KVTIER__REQUEST__BODY_KV_SAVE;
    q.kv_save = t;
    Kvtier__Response *r = NULL;
    kvt_err e = kvtc_call(c, &q, &r);
    if (r) kvtier__response__free_unpacked(r, NULL);
    return e;
}

static void test_raw_requests(void **state)
{
    (void)state;
    kvt_client *c = td_connect(&D);
    struct eng g;
    eng_up(c, &g, NS "/raw", 14);
    /* Waits: none, unknown, twice the same, more than max_keys. */
    uint64_t w[MAX_KEYS + 1] = {0};
    assert_int_equal(raw_wait(c, w, 0), KVT_EINVAL);
    w[0] = 12345;
    assert_int_equal(raw_wait(c, w, 1), KVT_ENOENT);
    kvt_xfer x;
    int32_t ids[NK * 2];
    for (size_t i = 0; i < NK * g.bpc; i++) ids[i] = (int32_t)i;
    assert_int_equal(kvt_kv_save(c, NS "/raw", g.reg, g.keys, NK, ids, NK * g.bpc,
                                 NULL, &x), KVT_OK);
    w[0] = w[1] = x;
    assert_int_equal(raw_wait(c, w, 2), KVT_EINVAL);
    assert_int_equal(raw_wait(c, w, MAX_KEYS + 1), KVT_ETOOBIG);
    kvt_xfer_status st;
    assert_int_equal(kvt_kv_poll(c, &x, 1, &st), KVT_OK);
    /* Transfers: bad namespace, no keys, a short key, a short parent. */
    ProtobufCBinaryData k[1] = {{KVT_KEY_LEN, g.keys[0].b}};
    Kvtier__KvTransfer t = KVTIER__KV_TRANSFER__INIT;
    t.ns = "bad ns";
    t.reg = g.reg;
    t.keys = k;
    t.n_keys = 1;
    t.block_ids = ids;
    t.n_block_ids = g.bpc;
    assert_int_equal(raw_transfer(c, &t), KVT_EINVAL);
    t.ns = NS "/raw";
    t.n_keys = 0;
    assert_int_equal(raw_transfer(c, &t), KVT_EINVAL);
    t.n_keys = 1;
    k[0].len = 5;
    assert_int_equal(raw_transfer(c, &t), KVT_EINVAL);
    k[0].len = KVT_KEY_LEN;
    t.parent = (ProtobufCBinaryData){5, g.keys[1].b};
    assert_int_equal(raw_transfer(c, &t), KVT_EINVAL);
    t.parent.len = 0;
    assert_int_equal(raw_transfer(c, &t), KVT_OK); /* and that was all */
    kve_close(&g.e);
    kvt_close(c);
}

/* At most 1024 transfers not yet reported per connection. */
static void test_uncollected_limit(void **state)
{
    (void)state;
    kvt_client *c = td_connect(&D);
    struct eng g;
    eng_up(c, &g, NS "/busy", 15);
    static kvt_xfer xs[1024];
    static kvt_xfer_status st[1024];
    for (int i = 0; i < 1024; i++) /* all cached: done at once, unreported */
        assert_int_equal(kvt_kv_save(c, NS "/busy", g.reg, g.keys, NK, g.ids,
                                     NK * g.bpc, NULL, &xs[i]), KVT_OK);
    kvt_xfer x;
    assert_int_equal(kvt_kv_save(c, NS "/busy", g.reg, g.keys, NK, g.ids,
                                 NK * g.bpc, NULL, &x), KVT_EBUSY);
    for (int i = 0; i < 1024; i += MAX_KEYS)
        assert_int_equal(kvt_kv_wait(c, xs + i, MAX_KEYS, 1000, st + i), KVT_OK);
    assert_int_equal(kvstats(c).transfers, 0);
    assert_int_equal(kvt_kv_save(c, NS "/busy", g.reg, g.keys, NK, g.ids,
                                 NK * g.bpc, NULL, &x), KVT_OK);
    kve_close(&g.e);
    kvt_close(c);
}

/* A SAVE larger than the whole pool: KVT_ENOSPC, nothing kept. */
static void test_save_enospc(void **state)
{
    (void)state;
    struct tdaemon small = {0};
    const char *extra[] = {"--pool-bytes", "1M", NULL};
    assert_int_equal(td_start(&small, extra), 0);
    kvt_client *c = td_connect(&small);
    struct kve e;
    fx_shape s = shape();
    kvt_kv_reg reg;
    kvt_kv_info info;
    assert_int_equal(kve_open(&e, KVT_LAYOUT_VLLM_FLASH_NHD, &s, 16), 0);
    assert_int_equal(kve_register(c, &e, NS, 4 * 24, &reg, &info), KVT_OK);
    kvt_key keys[40];
    static int32_t ids[40 * 24];
    for (int i = 0; i < 40; i++) keys[i] = td_key(1600 + i);
    for (int i = 0; i < 40 * 24; i++) ids[i] = i % 24;
    kvt_xfer x;
    assert_true(40 * info.chunk_bytes > (1u << 20));
    assert_int_equal(kvt_kv_save(c, NS, reg, keys, 40, ids, 40 * 24, NULL, &x),
                     KVT_ENOSPC);
    assert_int_equal(used(c), 0);
    assert_int_equal(kvstats(c).transfers, 0);
    kve_close(&e);
    kvt_close(c);
    assert_int_equal(td_stop(&small), 0);
    td_cleanup(&small);
}

/* ------------------------------------------- faults after acceptance */

/* A chunk scribbled over in the shared pool is never loaded. */
static void test_load_corrupt_chunk(void **state)
{
    (void)state;
    kvt_client *c = td_connect(&D);
    struct eng g;
    eng_up(c, &g, NS "/corrupt", 17);
    kvt_chunk ch;
    kvt_lease l;
    size_t got;
    assert_int_equal(kvt_get(c, NS "/corrupt", &g.keys[1], 1, &l, &ch, &got), KVT_OK);
    ((uint8_t *)ch.data)[100] ^= 0x5a; /* a client that writes the pool */
    kvt_release(c, l);
    uint64_t sum = kve_sum(&g.e);
    int32_t ids[NK * 2];
    for (size_t i = 0; i < NK * g.bpc; i++) ids[i] = (int32_t)(12 + i);
    kvt_xfer x;
    kvt_xfer_status st;
    assert_int_equal(kvt_kv_load(c, NS "/corrupt", g.reg, g.keys, NK, ids,
                                 NK * g.bpc, &x), KVT_OK);
    assert_int_equal(kve_wait1(c, x, &st), KVT_OK);
    assert_int_equal(st.err, KVT_ECORRUPT);
    assert_non_null(strstr(st.msg, "checksum"));
    assert_int_equal(kve_sum(&g.e), sum);
    assert_true(kvstats(c).failed >= 1);
    kve_close(&g.e);
    kvt_close(c);
}

/* The engine truncates its file under the daemon: the copy hits SIGBUS,
 * which fails the transfer (KVT_EIO) and nothing else. */
static void test_engine_file_truncated(void **state)
{
    (void)state;
    kvt_client *c = td_connect(&D);
    struct eng g;
    eng_up(c, &g, NS "/trunc", 18);
    assert_int_equal(truncate(g.e.path, KVE_HEADER), 0);
    kvt_key fresh[NK] = {td_key(18001), td_key(18002), td_key(18003)};
    kvt_xfer x[2];
    kvt_xfer_status st[2];
    int32_t ids[NK * 2];
    for (size_t i = 0; i < NK * g.bpc; i++) ids[i] = (int32_t)(12 + i);
    assert_int_equal(kvt_kv_save(c, NS "/trunc", g.reg, fresh, NK, g.ids,
                                 NK * g.bpc, NULL, &x[0]), KVT_OK);
    assert_int_equal(kvt_kv_load(c, NS "/trunc", g.reg, g.keys, NK, ids,
                                 NK * g.bpc, &x[1]), KVT_OK);
    assert_int_equal(kvt_kv_wait(c, x, 2, 20000, st), KVT_OK);
    assert_int_equal(st[0].err, KVT_EIO);
    assert_int_equal(st[1].err, KVT_EIO);
    assert_non_null(strstr(st[0].msg, "SIGBUS"));
    size_t present;
    assert_int_equal(kvt_lookup(c, NS "/trunc", fresh, NK, &present, NULL), KVT_OK);
    assert_int_equal(present, 0);
    assert_int_equal(kvt_kv_unregister(c, g.reg), KVT_OK);
    kvt_close(c);
    /* The daemon is fine: a new engine saves and loads. */
    c = td_connect(&D);
    struct eng h;
    eng_up(c, &h, NS "/after", 19);
    kve_close(&h.e);
    kve_close(&g.e);
    kvt_close(c);
}

/* hbm_bytes > 0 where GPU transfers are unavailable: no start. */
static void test_hbm_needs_gpu(void **state)
{
    (void)state;
    struct tdaemon d = {0};
    assert_int_equal(td_init(&d), 0);
    const char *extra[] = {"--hbm-bytes", "1G", NULL};
    unsetenv("KVT_CUDA_LIB");
    pid_t pid = td_spawn(&d, extra);
    assert_int_equal(td_wait_exit(pid, 20000), 1);
    assert_true(td_log_has(&d, "set hbm_bytes = 0 to run without it"));
    td_cleanup(&d);
}

/* Namespaces are interned at registration; the table is finite. */
static void test_namespace_limit(void **state)
{
    (void)state;
    kvt_client *c = td_connect(&D);
    uint8_t b[16] = {1};
    const void *bufs[1] = {b};
    size_t len = sizeof b;
    char ns[32];
    kvt_key k = td_key(42);
    /* Fill the table with held namespaces, a fresh connection every 200
     * (under daemon.ns_per_client): ids nobody holds are reused, so the
     * refusal comes once every one of the 4096 holds chunks. */
    kvt_err err = KVT_OK;
    uint64_t i;
    for (i = 0; i <= 4096 && err == KVT_OK; i++) {
        if (i % 200 == 199) {
            kvt_close(c);
            c = td_connect(&D);
        }
        snprintf(ns, sizeof ns, "fill/%llu", (unsigned long long)i);
        err = kvt_put(c, ns, &k, bufs, &len, 1, NULL, NULL);
    }
    assert_int_equal(err, KVT_ENOSPC);
    assert_non_null(strstr(kvt_last_error(c), "too many namespaces"));
    assert_true(i > 4000);
    struct kve e;
    fx_shape sh = shape();
    kvt_kv_reg reg;
    assert_int_equal(kve_open(&e, KVT_LAYOUT_VLLM_FLASH_NHD, &sh, 20), 0);
    assert_int_equal(kve_register(c, &e, "one/more/ns", CT, &reg, NULL), KVT_ENOSPC);
    snprintf(ns, sizeof ns, "fill/%llu", (unsigned long long)(i - 2));
    assert_int_equal(kve_register(c, &e, ns, CT, &reg, NULL), KVT_OK);
    kve_close(&e);
    kvt_close(c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_register_files),
        cmocka_unit_test(test_register_layouts),
        cmocka_unit_test(test_register_raw),
        cmocka_unit_test(test_register_remote),
        cmocka_unit_test(test_register_limit),
        cmocka_unit_test(test_register_ns_quota),
        cmocka_unit_test(test_transfer_refused),
        cmocka_unit_test(test_load_absent),
        cmocka_unit_test(test_chunk_size_mismatch),
        cmocka_unit_test(test_other_client),
        cmocka_unit_test(test_raw_requests),
        cmocka_unit_test(test_uncollected_limit),
        cmocka_unit_test(test_save_enospc),
        cmocka_unit_test(test_load_corrupt_chunk),
        cmocka_unit_test(test_engine_file_truncated),
        cmocka_unit_test(test_hbm_needs_gpu),
        cmocka_unit_test(test_namespace_limit), /* last: fills the table */
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
