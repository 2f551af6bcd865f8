/*
 * test_checksum.c -- both builds of the checksum (baseline and AVX2) agree
 * with the distribution's libxxhash for every size and alignment, copy or
 * no copy, cached or streaming stores.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include <cmocka.h>

#include "kvtier.h"

uint64_t csum_oneshot_base(const void *data, size_t n);
uint64_t csum_copy_base(void *dst, const void *src, size_t n);
#ifdef __x86_64__
uint64_t csum_oneshot_avx2(const void *data, size_t n);
uint64_t csum_copy_avx2(void *dst, const void *src, size_t n);
#endif

static void check_one(const uint8_t *src, uint8_t *dst, size_t n)
{
    uint64_t want = XXH3_64bits(src, n);
    assert_true(csum_oneshot_base(src, n) == want);
    memset(dst, 0, n + 64);
    assert_true(csum_copy_base(dst, src, n) == want);
    assert_memory_equal(dst, src, n);
    assert_int_equal(dst[n], 0); /* nothing written past the end */
#ifdef __x86_64__
    if (__builtin_cpu_supports("avx2")) {
        assert_true(csum_oneshot_avx2(src, n) == want);
        memset(dst, 0, n + 64);
        assert_true(csum_copy_avx2(dst, src, n) == want);
        assert_memory_equal(dst, src, n);
        assert_int_equal(dst[n], 0);
    }
#endif
    assert_true(kvt_copy_checksum(dst, src, n) == want);
}

static void test_sizes_and_alignments(void **state)
{
    (void)state;
    size_t max = (3u << 20) + 200;
    uint8_t *src = malloc(max + 64), *dst = malloc(max + 128);
    for (size_t i = 0; i < max + 64; i++) src[i] = (uint8_t)(i * 131 + (i >> 9));
    const size_t sizes[] = {0, 1, 15, 16, 17, 240, 241, 4096, 65535, 65536, 65537,
                            (512u << 10) - 1, 512u << 10, (512u << 10) + 33,
                            1u << 20, 3u << 20, (3u << 20) + 131};
    for (size_t a = 0; a < 4; a++)
        for (size_t b = 0; b < 3; b++)
            for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
                check_one(src + a * 7, dst + b * 13, sizes[i]);
    free(src);
    free(dst);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sizes_and_alignments),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
