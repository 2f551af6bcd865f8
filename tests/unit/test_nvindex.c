/*
 * test_nvindex.c -- the NVMe tier's RocksDB index (tiers/nvme/nvindex.c):
 * queued puts and deletes written by the worker, reloaded after a close;
 * the format mark; a record that does not decode (dropped and counted); a
 * damaged directory (open fails, moved aside, a fresh index opens);
 * wiping an incomplete index.
 */
#include <rocksdb/c.h>
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
#include "nvme/nvindex.h"

static char dir[64], path[128];

static int setup(void **state)
{
    (void)state;
    snprintf(dir, sizeof dir, "/tmp/kvt-nvx-XXXXXX");
    if (!mkdtemp(dir)) return -1;
    snprintf(path, sizeof path, "%s/index", dir);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    return system(cmd) == 0 ? 0 : -1;
}

static void rec_for(struct nvx_rec *r, uint64_t i)
{
    memset(r, 0, sizeof *r);
    snprintf(r->ns, sizeof r->ns, "ns%llu", (unsigned long long)(i % 3));
    r->key = td_key(i);
    r->has_parent = i % 2;
    r->parent = td_key(i + 7);
    r->dir = (uint16_t)(i % 2);
    r->num = (uint32_t)i / 10;
    r->off = i * 8192;
    r->len = 8192;
    r->size = (uint32_t)(100 + i);
    r->csum = i * 31;
    r->seq = i + 1;
    r->atime = 1000 + i;
}

struct seen {
    int n;
    int got[1000];
};

static void on_rec(void *arg, const struct nvx_rec *r)
{
    struct seen *s = arg;
    uint64_t i = r->seq - 1;
    struct nvx_rec want;
    rec_for(&want, i);
    assert_true(i < 1000);
    assert_string_equal(r->ns, want.ns);
    assert_memory_equal(r->key.b, want.key.b, 32);
    assert_int_equal(r->has_parent, want.has_parent);
    if (want.has_parent) assert_memory_equal(r->parent.b, want.parent.b, 32);
    assert_int_equal(r->dir, want.dir);
    assert_int_equal(r->num, want.num);
    assert_int_equal(r->off, want.off);
    assert_int_equal(r->size, want.size);
    assert_int_equal(r->csum, want.csum);
    assert_int_equal(r->atime, want.atime);
    s->got[i]++;
    s->n++;
}

static struct nvx *open_ok(int *complete)
{
    struct nvx *x = NULL;
    char err[256] = "";
    int rv = nvx_open(path, 0, &x, complete, err, sizeof err);
    if (rv != 0) fprintf(stderr, "%s\n", err);
    assert_int_equal(rv, 0);
    return x;
}

static void test_put_del_reload(void **state)
{
    (void)state;
    int complete = -1;
    struct nvx *x = open_ok(&complete);
    assert_int_equal(complete, 0);
    struct nvx_rec r;
    for (uint64_t i = 0; i < 1000; i++) {
        rec_for(&r, i);
        nvx_put(x, &r, -1);
    }
    for (uint64_t i = 0; i < 1000; i += 10) {
        rec_for(&r, i);
        nvx_del(x, r.ns, &r.key);
    }
    assert_int_equal(nvx_mark_complete(x), 0);
    assert_int_equal(nvx_written(x), 1100);
    assert_int_equal(nvx_errors(x), 0);
    nvx_close(x);

    x = open_ok(&complete);
    assert_int_equal(complete, 1);
    static struct seen s;
    uint64_t bad = 99;
    char err[256];
    assert_int_equal(nvx_load(x, on_rec, &s, &bad, err, sizeof err), 900);
    assert_int_equal(bad, 0);
    for (int i = 0; i < 1000; i++) assert_int_equal(s.got[i], i % 10 ? 1 : 0);
    nvx_close(x);
}

/* A value that does not decode is dropped and counted, not fatal. */
static void test_bad_record(void **state)
{
    (void)state;
    int complete;
    char *err = NULL;
    rocksdb_options_t *o = rocksdb_options_create();
    rocksdb_t *db = rocksdb_open(o, path, &err);
    assert_null(err);
    rocksdb_writeoptions_t *wo = rocksdb_writeoptions_create();
    const char key[] = "\x02nsAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA";
    rocksdb_put(db, wo, key, sizeof key - 1, "junk", 4, &err);
    assert_null(err);
    rocksdb_writeoptions_destroy(wo);
    rocksdb_close(db);
    rocksdb_options_destroy(o);

    struct nvx *x = open_ok(&complete);
    static struct seen s;
    uint64_t bad;
    char e[256];
    assert_int_equal(nvx_load(x, on_rec, &s, &bad, e, sizeof e), 900);
    assert_int_equal(bad, 1);
    nvx_close(x);
    x = open_ok(&complete);
    memset(&s, 0, sizeof s);
    assert_int_equal(nvx_load(x, on_rec, &s, &bad, e, sizeof e), 900);
    assert_int_equal(bad, 0); /* it was deleted */
    /* Wiping leaves nothing, not even the mark. */
    assert_int_equal(nvx_wipe(x, e, sizeof e), 0);
    nvx_close(x);
    x = open_ok(&complete);
    assert_int_equal(complete, 0);
    assert_int_equal(nvx_load(x, on_rec, &s, &bad, e, sizeof e), 0);
    nvx_close(x);
}

/* A directory RocksDB cannot open: an error with a sentence; moved
 * aside, a fresh index opens in its place. */
static void test_damaged_dir(void **state)
{
    (void)state;
    char p[160], moved[200], err[512] = "";
    snprintf(p, sizeof p, "%s/CURRENT", path);
    FILE *f = fopen(p, "w");
    assert_non_null(f);
    fputs("MANIFEST-999999\n", f);
    fclose(f);
    struct nvx *x = NULL;
    int complete;
    assert_int_equal(nvx_open(path, 0, &x, &complete, err, sizeof err), -1);
    assert_non_null(strstr(err, "index"));
    assert_int_equal(nvx_move_aside(path, moved, sizeof moved), 0);
    assert_int_equal(access(moved, F_OK), 0);
    x = open_ok(&complete);
    assert_int_equal(complete, 0);
    nvx_close(x);
    nvx_close(NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_put_del_reload),
        cmocka_unit_test(test_bad_record),
        cmocka_unit_test(test_damaged_dir),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
