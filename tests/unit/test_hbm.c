/*
 * test_hbm.c -- the HBM tier (tiers/hbm.c) over the fake CUDA library
 * (tests/fake_cuda, loaded by kvt_gpu_open through KVT_CUDA_LIB), so its
 * allocator, copies and failures run on machines without a GPU: units and
 * rounding, KVT_ENOSPC when full and again after a free, bounds of write
 * and read, a failing copy or sync as KVT_EIO, done() called, usage, and
 * start-up that cannot get device memory or a stream. Skips (77) when the
 * fake library was not built.
 */
#include <libgen.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "gpu.h"
#include "hbm.h"

static struct kvt_gpu *G;

static int setup(void **state)
{
    (void)state;
    char exe[512], lib[600], why[256];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0) return -1;
    exe[n] = '\0';
    /* build/tests/unit/test_hbm -> build/lib */
    snprintf(lib, sizeof lib, "%s/../../lib/libkvtier_fakecuda.so", dirname(exe));
    if (access(lib, R_OK) != 0) {
        fprintf(stderr, "skipped: %s not built\n", lib);
        exit(77);
    }
    setenv("KVT_CUDA_LIB", lib, 1);
    unsetenv("KVT_FAKE_CUDA_FAIL_FILE");
    return kvt_gpu_open(NULL, &G, why, sizeof why) == KVT_OK ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    kvt_gpu_close(G);
    return 0;
}

static kvt_err open_hbm(uint64_t bytes, struct hbm **h)
{
    char err[256];
    return hbm_open(kvt_gpu_ops(G), kvt_gpu_ctx(G), 0, bytes, h, err, sizeof err);
}

static int done_calls;
static kvt_err done_err;

static void on_done(void *arg, kvt_err e)
{
    (void)arg;
    done_calls++;
    done_err = e;
}

static void test_alloc_and_copy(void **state)
{
    (void)state;
    struct hbm *h;
    assert_int_equal(open_hbm(4 * HBM_UNIT + 100, &h), KVT_OK);
    struct tier *t = &h->tier;
    struct tier_usage u;
    t->ops->usage(t, &u);
    assert_int_equal(u.capacity, 4 * HBM_UNIT); /* rounded down */
    assert_int_equal(u.used, 0);
    struct tier_loc a, b, c;
    assert_int_equal(t->ops->alloc(t, HBM_UNIT + 1, &a), KVT_OK); /* 2 units */
    assert_int_equal(a.len, 2 * HBM_UNIT);
    assert_int_equal(t->ops->alloc(t, 0, &b), KVT_OK);             /* 1 unit */
    assert_int_equal(t->ops->alloc(t, 2 * HBM_UNIT, &c), KVT_ENOSPC);
    t->ops->usage(t, &u);
    assert_int_equal(u.used, 3 * HBM_UNIT);
    assert_int_equal(t->ops->alloc_at(t, 0, HBM_UNIT, &c), KVT_ENOTSUP);
    /* A round trip through device memory. */
    static uint8_t in[HBM_UNIT * 2], out[HBM_UNIT * 2];
    for (size_t i = 0; i < sizeof in; i++) in[i] = (uint8_t)(i * 7 + 3);
    done_calls = 0;
    assert_int_equal(t->ops->write_at(t, &a, 0, in, sizeof in, on_done, NULL), KVT_OK);
    assert_int_equal(done_calls, 1);
    assert_int_equal(done_err, KVT_OK);
    assert_int_equal(t->ops->read_at(t, &a, 0, out, sizeof out, NULL, NULL), KVT_OK);
    assert_memory_equal(in, out, sizeof in);
    assert_ptr_equal(hbm_ptr(h, a.off), h->base + a.off);
    /* Out of the range. */
    assert_int_equal(t->ops->write_at(t, &b, 1, in, HBM_UNIT, NULL, NULL), KVT_EINVAL);
    assert_int_equal(t->ops->read_at(t, &b, HBM_UNIT + 1, out, 0, NULL, NULL), KVT_EINVAL);
    /* Freed space is space again, once it is contiguous. */
    t->ops->free(t, &a);
    assert_int_equal(t->ops->alloc(t, 3 * HBM_UNIT, &c), KVT_ENOSPC);
    t->ops->free(t, &b);
    assert_int_equal(t->ops->alloc(t, 4 * HBM_UNIT, &c), KVT_OK);
    t->ops->free(t, &c);
    t->ops->usage(t, &u);
    assert_int_equal(u.used, 0);
    t->ops->destroy(t);
}

static void test_copy_faults(void **state)
{
    (void)state;
    struct hbm *h;
    assert_int_equal(open_hbm(HBM_UNIT, &h), KVT_OK);
    struct tier *t = &h->tier;
    struct tier_loc a;
    uint8_t buf[64] = {1};
    assert_int_equal(t->ops->alloc(t, 64, &a), KVT_OK);
    setenv("KVT_FAKE_CUDA_FAIL", "memcpy", 1);
    done_calls = 0;
    assert_int_equal(t->ops->write_at(t, &a, 0, buf, 64, on_done, NULL), KVT_EIO);
    assert_int_equal(done_calls, 1);
    assert_int_equal(done_err, KVT_EIO);
    setenv("KVT_FAKE_CUDA_FAIL", "sync", 1);
    assert_int_equal(t->ops->read_at(t, &a, 0, buf, 64, NULL, NULL), KVT_EIO);
    unsetenv("KVT_FAKE_CUDA_FAIL");
    t->ops->free(t, &a);
    hbm_close(h);
}

static void test_open_faults(void **state)
{
    (void)state;
    struct hbm *h = NULL;
    char err[256];
    assert_int_equal(open_hbm(HBM_UNIT - 1, &h), KVT_EINVAL); /* < one unit */
    assert_int_equal(hbm_open(kvt_gpu_ops(G), kvt_gpu_ctx(G), -1, HBM_UNIT, &h,
                              err, sizeof err), KVT_EINVAL);
    assert_int_equal(hbm_open(kvt_gpu_ops(G), kvt_gpu_ctx(G), 1, HBM_UNIT, &h,
                              err, sizeof err), KVT_EINVAL); /* one device */
    setenv("KVT_FAKE_CUDA_FAIL", "dev_alloc", 1);
    assert_int_equal(hbm_open(kvt_gpu_ops(G), kvt_gpu_ctx(G), 0, HBM_UNIT, &h,
                              err, sizeof err), KVT_ENOSPC);
    assert_non_null(strstr(err, "cannot set up"));
    setenv("KVT_FAKE_CUDA_FAIL", "stream_create", 1);
    assert_int_equal(open_hbm(HBM_UNIT, &h), KVT_EIO);
    unsetenv("KVT_FAKE_CUDA_FAIL");
    assert_null(h);
    hbm_close(NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_alloc_and_copy),
        cmocka_unit_test(test_copy_faults),
        cmocka_unit_test(test_open_faults),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
