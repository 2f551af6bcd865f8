/*
 * test_tier_nvme.c -- the NVMe tier as one object behind tier.h, built
 * without a daemon: its context (nvstore.h) is filled here with a host of
 * the test's own (tier_host.h: a DRAM pool, an index, a completion queue,
 * placement calls that do what store.c does), over real data files,
 * real io_uring and a real RocksDB index in a temporary directory.
 *
 * Driven through the ops alone: write (demote a chunk from its DRAM slot;
 * its DRAM copy goes once written), read (promote it back; bytes checked),
 * a record corrupted on disk (read fails with KVT_ECORRUPT, the chunk is
 * gone), get (a GET of a chunk only on NVMe is parked, then answered
 * through the host), usage, and a reopen that finds the written chunk in
 * the index again.
 */
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "daemon.h"
#include "dram.h"
#include "index.h"
#include "log.h"
#include "nvme/nvstore.h"
#include "nvme/nvstore_int.h" /* white box: where a record sits, to corrupt it */
#include "tier.h"
#include "workq.h"

#define POOL (8u << 20)
#define CH 100000u /* not a multiple of the block size */

uint64_t now_ms(void);

/* ------------------------------------------------------------- the host */

struct fake_park {
    uint32_t pipe;
    uint64_t req_id, deadline;
};

static struct {
    char dir[64], pool[96];
    struct dram *dram;
    struct idx idx;
    struct wq_cq *cq;
    struct tier_host host;
    struct nvs_ctx ctx;
    uint64_t t0;
    const char *ns[4];
    uint16_t n_ns;
    /* what the tier asked of its host */
    int drops, frees, stored, removed, added, loaded;
    int answers;
    size_t answered_n;
    uint32_t answered_pipe;
    struct fake_park *parked;
} H;

static uint64_t h_clock_ms(void *core)
{
    (void)core;
    return now_ms() - H.t0;
}

static const char *h_ns_name(void *core, uint16_t ns)
{
    (void)core;
    return H.ns[ns];
}

static uint16_t h_ns_intern(void *core, const char *name)
{
    (void)core;
    for (uint16_t i = 0; i < H.n_ns; i++)
        if (strcmp(H.ns[i], name) == 0) return i;
    if (H.n_ns == 4) return NS_NONE;
    H.ns[H.n_ns] = strdup(name);
    return H.n_ns++;
}

static void h_ns_loaded(void *core, uint16_t ns, uint64_t bytes)
{
    (void)core, (void)ns, (void)bytes;
    H.loaded++;
}

static void free_blk(uint32_t slot)
{
    struct idx_entry *e = idx_at(&H.idx, slot);
    if (e->blk == IDX_NONE) return;
    struct tier_loc loc = {0, 0, e->blk};
    H.dram->tier.ops->free(&H.dram->tier, &loc);
    e->blk = IDX_NONE;
}

/* As store_free: the DRAM copy, the tier's copy, the slot. */
static void h_free_slot(void *core, uint32_t slot)
{
    (void)core;
    struct tier *t = nvs_tier(&H.ctx);
    H.frees++;
    free_blk(slot);
    if (t) t->ops->release(t, slot);
    idx_remove(&H.idx, slot);
}

static kvt_err h_alloc_dram(void *core, uint16_t ns, uint64_t size, uint32_t *blk)
{
    (void)core;
    (void)ns;
    struct tier_loc loc;
    kvt_err e = H.dram->tier.ops->alloc(&H.dram->tier, size, &loc);
    if (e == KVT_OK) *blk = loc.h;
    return e;
}

static void h_drop_dram(void *core, uint32_t slot)
{
    (void)core;
    H.drops++;
    free_blk(slot);
    idx_set_tier(&H.idx, slot, (uint8_t)(idx_at(&H.idx, slot)->tier & ~IDX_DRAM));
}

static void h_watermark(void *core)
{
    (void)core;
}

static void h_dram_added(void *core, uint32_t slot)
{
    (void)core, (void)slot;
    H.added++;
}

static void h_ev_stored(void *core, uint32_t slot, uint8_t tier)
{
    (void)core, (void)slot, (void)tier;
    H.stored++;
}

static void h_ev_removed(void *core, uint32_t slot, uint8_t tier)
{
    (void)core, (void)slot, (void)tier;
    H.removed++;
}

static struct park *h_park(void *core, uint32_t pipe, uint64_t req_id,
                           const struct park_ops *ops, void *ctx, void *owner)
{
    (void)core, (void)ops, (void)ctx, (void)owner;
    struct fake_park *p = calloc(1, sizeof *p);
    assert_non_null(p);
    p->pipe = pipe;
    p->req_id = req_id;
    H.parked = p;
    return (struct park *)p;
}

static void h_park_deadline(void *core, struct park *p, uint64_t deadline)
{
    (void)core;
    ((struct fake_park *)p)->deadline = deadline;
}

static uint32_t h_park_pipe(const struct park *p)
{
    return ((const struct fake_park *)p)->pipe;
}

static uint64_t h_park_req_id(const struct park *p)
{
    return ((const struct fake_park *)p)->req_id;
}

static void h_park_answer(void *core, struct park *p, const Kvtier__Response *rsp)
{
    (void)core, (void)rsp;
    if ((struct fake_park *)p == H.parked) H.parked = NULL;
    free(p);
}

static void h_get_answer(void *core, struct park *p, uint16_t ns, int inline_,
                         uint32_t n_keys, const uint32_t *slots, size_t n)
{
    (void)ns, (void)inline_, (void)n_keys;
    for (size_t i = 0; i < n; i++) /* every chunk answered is in DRAM */
        assert_true(idx_at(&H.idx, slots[i])->tier & IDX_DRAM);
    H.answers++;
    H.answered_n = n;
    H.answered_pipe = h_park_pipe(p);
    h_park_answer(core, p, NULL);
}

static const struct tier_host host_calls = {
    .clock_ms = h_clock_ms,
    .ns_name = h_ns_name,
    .ns_intern = h_ns_intern,
    .ns_loaded = h_ns_loaded,
    .free_slot = h_free_slot,
    .alloc_dram = h_alloc_dram,
    .drop_dram = h_drop_dram,
    .watermark = h_watermark,
    .dram_added = h_dram_added,
    .ev_stored = h_ev_stored,
    .ev_removed = h_ev_removed,
    .park = h_park,
    .park_deadline = h_park_deadline,
    .park_pipe = h_park_pipe,
    .park_req_id = h_park_req_id,
    .park_answer = h_park_answer,
    .get_answer = h_get_answer,
};

/* ------------------------------------------------------------- helpers */

static void open_ctx(void)
{
    memset(&H.ctx, 0, sizeof H.ctx);
    H.ctx.host = &H.host;
    H.ctx.idx = &H.idx;
    H.ctx.dram = H.dram;
    H.ctx.cq = H.cq;
    struct nvs_conf *c = &H.ctx.cfg;
    snprintf(c->nvme_dirs, sizeof c->nvme_dirs, "%s/nvme", H.dir);
    snprintf(c->nvme_index_path, sizeof c->nvme_index_path, "%s/index", H.dir);
    c->nvme_bytes = 64u << 20;
    c->nvme_file_bytes = 16u << 20;
    c->nvme_queue_depth = 8;
    c->nvme_register_buffers = 0;
    c->nvme_fsync = 0;
    c->nvme_get_deadline_ms = 60000;
    c->nvme_high_watermark = 0.95;
    c->nvme_low_watermark = 0.85;
    assert_int_equal(nvs_open(&H.ctx), 0);
    assert_non_null(nvs_tier(&H.ctx));
}

static void close_ctx(void)
{
    nvs_close(&H.ctx);
    assert_null(nvs_tier(&H.ctx));
}

static uint64_t index_slots(void)
{
    static const struct nvs_conf c = {.nvme_bytes = 64u << 20, .nvme_dirs = "d"};
    return POOL / DRAM_UNIT + nvs_index_slots(&c);
}

static int setup(void **state)
{
    (void)state;
    char err[256] = "";
    memset(&H, 0, sizeof H);
    log_set_level(LOG_ERROR);
    snprintf(H.dir, sizeof H.dir, "/tmp/kvt-tier-nvme-XXXXXX");
    if (!mkdtemp(H.dir)) return -1;
    snprintf(H.pool, sizeof H.pool, "/dev/shm/kvt-tier-nvme-%d.pool", (int)getpid());
    struct dram_opts o = {H.pool, POOL, 0600, NULL, 0, -1};
    if (dram_open(&o, &H.dram, err, sizeof err) != KVT_OK) return -1;
    if (idx_init(&H.idx, index_slots()) != 0) return -1;
    H.idx.nv_active = 1;
    if (wq_cq_open(&H.cq) != 0) return -1;
    H.host = host_calls;
    H.host.core = &H;
    H.host.idx = &H.idx;
    H.host.dram = H.dram;
    H.host.cq = H.cq;
    H.t0 = now_ms();
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    char cmd[128];
    wq_cq_close(H.cq);
    idx_destroy(&H.idx);
    dram_close(H.dram, 1);
    for (uint16_t i = 0; i < H.n_ns; i++) free((char *)H.ns[i]);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", H.dir);
    return system(cmd) == 0 ? 0 : -1;
}

static void fill(uint8_t *p, size_t n, uint64_t seed)
{
    for (size_t i = 0; i < n; i++) p[i] = (uint8_t)(seed * 131 + i * 7 + (i >> 9));
}

/* A committed chunk of CH bytes in DRAM, as a PUT leaves one. */
static uint32_t put_chunk(uint16_t ns, uint64_t seed)
{
    kvt_key k = td_key(seed);
    uint32_t blk = IDX_NONE;
    assert_int_equal(h_alloc_dram(NULL, 0, CH, &blk), KVT_OK);
    uint32_t slot = idx_insert(&H.idx, ns, &k);
    assert_int_not_equal(slot, IDX_NONE);
    struct idx_entry *e = idx_at(&H.idx, slot);
    e->blk = blk;
    e->size = CH;
    fill(th_ptr(&H.host, slot), CH, seed);
    e->csum = kvt_checksum(th_ptr(&H.host, slot), CH);
    idx_commit(&H.idx, slot, IDX_NONE, 0);
    struct tier *t = nvs_tier(&H.ctx);
    t->ops->committed(t, slot); /* write-back: nothing queued */
    return slot;
}

struct done {
    int calls;
    kvt_err err;
};

static void on_done(void *arg, kvt_err e)
{
    struct done *d = arg;
    d->calls++;
    d->err = e;
}

/* Run the tier's completions (the core loop's job) until *flag is set;
 * bounded so a lost completion fails instead of hanging. */
static void run_until(const int *flag)
{
    for (int i = 0; i < 20000 && !*flag; i++) {
        nvs_poll(&H.ctx);
        wq_cq_poll(H.cq);
        if (!*flag) usleep(500);
    }
    assert_true(*flag);
}

static int bytes_ok(uint32_t slot, uint64_t seed)
{
    uint8_t *want = malloc(CH);
    assert_non_null(want);
    fill(want, CH, seed);
    int ok = memcmp(th_ptr(&H.host, slot), want, CH) == 0;
    free(want);
    return ok;
}

/* Demote a chunk through the tier's write op and wait for it. */
static void demote(struct tier *t, uint32_t slot)
{
    struct done d = {0, KVT_EINTERNAL};
    int drops = H.drops;
    assert_int_equal(t->ops->write(t, slot, on_done, &d), KVT_OK);
    assert_int_equal(t->ops->demoting(t), CH); /* its DRAM copy is on its way out */
    run_until(&d.calls);
    assert_int_equal(d.calls, 1);
    assert_int_equal(d.err, KVT_OK);
    assert_int_equal(t->ops->demoting(t), 0);
    assert_int_equal(H.drops, drops + 1); /* the DRAM copy went once written */
    assert_int_equal(idx_at(&H.idx, slot)->tier, IDX_NVME);
}

/* ---------------------------------------------------------------- tests */

static void test_write_read_get_corrupt_reopen(void **state)
{
    (void)state;
    open_ctx();
    struct tier *t = nvs_tier(&H.ctx);
    assert_string_equal(t->ops->name, "nvme");
    assert_int_equal(t->ops->id, KVT_TIER_NVME);
    assert_null(t->ops->lookup); /* the core's index answers for local tiers */
    uint16_t ns = h_ns_intern(NULL, "t/ns");

    /* write: demote A from DRAM; read: promote it back, bytes intact */
    uint32_t a = put_chunk(ns, 1);
    demote(t, a);
    struct done r = {0, KVT_EINTERNAL};
    assert_int_equal(t->ops->read(t, a, on_done, &r), KVT_OK);
    run_until(&r.calls);
    assert_int_equal(r.err, KVT_OK);
    assert_int_equal(idx_at(&H.idx, a)->tier, IDX_DRAM | IDX_NVME);
    assert_true(bytes_ok(a, 1));
    assert_int_equal(H.added, 1); /* the host heard the DRAM copy is valid */
    /* a chunk already in DRAM is not read, and done is not called */
    struct done no = {0, KVT_OK};
    assert_int_equal(t->ops->read(t, a, on_done, &no), KVT_EBUSY);
    /* nor is a chunk already on NVMe written again */
    assert_int_equal(t->ops->write(t, a, on_done, &no), KVT_EBUSY);
    for (int i = 0; i < 20; i++) nvs_poll(&H.ctx), wq_cq_poll(H.cq);
    assert_int_equal(no.calls, 0);

    /* get: a GET of [A in DRAM, B only on NVMe] is parked until B is
     * read back, then answered through the host with both */
    uint32_t b = put_chunk(ns, 2);
    demote(t, b);
    uint32_t slots[2] = {a, b};
    Kvtier__Get q = KVTIER__GET__INIT;
    q.n_keys = 2;
    struct tier_walk w = {.pipe = 7, .req_id = 99, .ns = ns, .get = &q,
                          .slots = slots, .n = 2};
    assert_int_equal(t->ops->get(t, &w), TIER_PARKED);
    assert_non_null(H.parked);
    assert_true(H.parked->deadline > 0);
    run_until(&H.answers);
    assert_int_equal(H.answered_n, 2);
    assert_int_equal(H.answered_pipe, 7);
    assert_true(bytes_ok(b, 2));
    /* all in DRAM now: answered at once, nothing parked */
    w.n = 2;
    assert_int_equal(t->ops->get(t, &w), TIER_NOW);
    assert_int_equal(w.n, 2);
    assert_int_equal(H.answers, 1);

    /* a record corrupted on disk: the read fails, the chunk is gone */
    uint32_t c = put_chunk(ns, 3);
    demote(t, c);
    struct tier_loc l = nvs_loc_of(&H.ctx, c);
    char path[64];
    snprintf(path, sizeof path, "/proc/self/fd/%d",
             H.ctx.nvs->tier->files[nvme_loc_file(&l)].fd);
    int fd = open(path, O_RDWR);
    assert_true(fd >= 0);
    uint8_t byte;
    off_t at = (off_t)(nvme_loc_off(&l) + NVME_HDR + 5000);
    assert_int_equal(pread(fd, &byte, 1, at), 1);
    byte ^= 0xff;
    assert_int_equal(pwrite(fd, &byte, 1, at), 1);
    assert_int_equal(fdatasync(fd), 0);
    close(fd);
    int frees = H.frees;
    struct done bad = {0, KVT_OK};
    assert_int_equal(t->ops->read(t, c, on_done, &bad), KVT_OK);
    run_until(&bad.calls);
    assert_int_equal(bad.err, KVT_ECORRUPT);
    assert_int_equal(H.frees, frees + 1); /* no copy left: the slot went */
    assert_int_equal(nvs_stats(&H.ctx)->csum_failures, 1);
    kvt_key kc = td_key(3);
    assert_int_equal(idx_find(&H.idx, ns, &kc), IDX_NONE);

    struct tier_usage u;
    t->ops->usage(t, &u);
    assert_int_equal(u.capacity, 64u << 20);
    assert_true(u.used >= 2 * nvme_rec_len(CH)); /* A and B */
    assert_int_equal(nvs_stats(&H.ctx)->demotions, 3);
    assert_int_equal(nvs_stats(&H.ctx)->promotions, 2);

    /* reopen into a fresh index, as a restarted daemon does: A and B
     * are loaded from the RocksDB index, only on NVMe, and B reads back
     * intact */
    close_ctx();
    idx_destroy(&H.idx);
    assert_int_equal(idx_init(&H.idx, index_slots()), 0);
    H.idx.nv_active = 1;
    H.loaded = 0;
    open_ctx();
    t = nvs_tier(&H.ctx);
    assert_int_equal(H.loaded, 2);
    kvt_key kb = td_key(2);
    uint32_t sb = idx_find(&H.idx, h_ns_intern(NULL, "t/ns"), &kb);
    assert_int_not_equal(sb, IDX_NONE);
    assert_int_equal(idx_at(&H.idx, sb)->tier, IDX_NVME);
    struct done r2 = {0, KVT_EINTERNAL};
    assert_int_equal(t->ops->read(t, sb, on_done, &r2), KVT_OK);
    run_until(&r2.calls);
    assert_int_equal(r2.err, KVT_OK);
    assert_true(bytes_ok(sb, 2));
    close_ctx();
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_write_read_get_corrupt_reopen, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
