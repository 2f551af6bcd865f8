/*
 * test_tlsf.c -- unit tests for the TLSF offset allocator (tiers/tlsf.c).
 *
 * Deterministic: the randomized test uses a fixed seed and checks every
 * operation against a reference model (one byte per unit).  The abort tests
 * run the bad call in a forked child and expect SIGABRT.
 */
#include <fcntl.h>
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

#include "tlsf.h"

/* ---- basic ------------------------------------------------------------- */

static void test_create_args(void **state)
{
	(void)state;
	assert_null(tlsf_create(0));
	assert_null(tlsf_create(TLSF_MAX_CAPACITY + 1));
	assert_null(tlsf_create(UINT64_MAX));
	tlsf_destroy(NULL);
	tlsf *t = tlsf_create(TLSF_MAX_CAPACITY);
	assert_non_null(t);
	assert_int_equal(tlsf_free_units(t), TLSF_MAX_CAPACITY);
	assert_int_equal(tlsf_largest_free(t), TLSF_MAX_CAPACITY);
	assert_int_equal(tlsf_check(t), 0);
	tlsf_destroy(t);
}

static void test_basic(void **state)
{
	(void)state;
	tlsf *t = tlsf_create(1024);
	assert_non_null(t);
	assert_int_equal(tlsf_capacity(t), 1024);
	uint64_t off = 99;
	assert_int_equal(tlsf_alloc(t, 0, &off), TLSF_NONE);
	assert_int_equal(off, 99);
	uint32_t a = tlsf_alloc(t, 10, &off);
	assert_int_not_equal(a, TLSF_NONE);
	assert_int_equal(off, 0);
	uint32_t b = tlsf_alloc(t, 20, &off);
	assert_int_equal(off, 10);
	uint32_t c = tlsf_alloc(t, 30, &off);
	assert_int_equal(off, 30);
	assert_int_equal(tlsf_block_len(t, b), 20);
	assert_int_equal(tlsf_block_off(t, c), 30);
	assert_int_equal(tlsf_free_units(t), 1024 - 60);
	assert_int_equal(tlsf_check(t), 0);

	tlsf_free(t, b); /* hole [10,30) between two used blocks */
	assert_int_equal(tlsf_free_units(t), 1024 - 40);
	assert_int_equal(tlsf_largest_free(t), 1024 - 60);
	assert_int_equal(tlsf_check(t), 0);
	tlsf_free(t, a); /* coalesces with the hole: [0,30) */
	assert_int_equal(tlsf_check(t), 0);
	uint32_t d = tlsf_alloc(t, 30, &off); /* exact fit into [0,30) */
	assert_int_equal(off, 0);
	tlsf_free(t, d);
	tlsf_free(t, c); /* coalesces both sides: one block again */
	assert_int_equal(tlsf_free_units(t), 1024);
	assert_int_equal(tlsf_largest_free(t), 1024);
	assert_true(tlsf_fragmentation(t) == 0.0);
	assert_int_equal(tlsf_check(t), 0);
	assert_int_not_equal(tlsf_alloc(t, 1, NULL), TLSF_NONE);
	tlsf_destroy(t);
}

/* 101 rounds up to a class above its own, so the last fits are only found
 * by the exact-class fallback: TLSF_NONE must mean "nothing fits". */
static void test_exhaust(void **state)
{
	(void)state;
	tlsf *t = tlsf_create(1010);
	uint32_t h[10];
	uint64_t off;
	for (int i = 0; i < 10; i++) {
		h[i] = tlsf_alloc(t, 101, &off);
		assert_int_not_equal(h[i], TLSF_NONE);
		assert_int_equal(off, 101 * (uint64_t)i);
	}
	assert_int_equal(tlsf_free_units(t), 0);
	assert_int_equal(tlsf_largest_free(t), 0);
	assert_int_equal(tlsf_alloc(t, 1, &off), TLSF_NONE);
	tlsf_free(t, h[4]);
	assert_int_equal(tlsf_alloc(t, 102, &off), TLSF_NONE);
	h[4] = tlsf_alloc(t, 101, &off);
	assert_int_not_equal(h[4], TLSF_NONE);
	assert_int_equal(off, 404);
	for (int i = 0; i < 10; i++)
		tlsf_free(t, h[i]);
	assert_int_equal(tlsf_check(t), 0);
	uint32_t all = tlsf_alloc(t, 1010, &off); /* whole pool, exact */
	assert_int_not_equal(all, TLSF_NONE);
	assert_int_equal(off, 0);
	assert_int_equal(tlsf_alloc(t, 1, &off), TLSF_NONE);
	tlsf_free(t, all);
	assert_int_equal(tlsf_alloc(t, 1011, &off), TLSF_NONE);
	assert_int_equal(tlsf_check(t), 0);
	tlsf_destroy(t);
}

/* ---- adoption ---------------------------------------------------------- */

static void test_alloc_at(void **state)
{
	(void)state;
	tlsf *t = tlsf_create(10000);
	/* out of order on purpose: the chain walk goes both ways */
	uint32_t r1 = tlsf_alloc_at(t, 100, 50);
	uint32_t r2 = tlsf_alloc_at(t, 5000, 1000);
	uint32_t r3 = tlsf_alloc_at(t, 0, 10);
	uint32_t r4 = tlsf_alloc_at(t, 9990, 10);
	assert_true(r1 != TLSF_NONE && r2 != TLSF_NONE && r3 != TLSF_NONE && r4 != TLSF_NONE);
	assert_int_equal(tlsf_block_off(t, r1), 100);
	assert_int_equal(tlsf_block_len(t, r2), 1000);
	assert_int_equal(tlsf_check(t), 0);

	assert_int_equal(tlsf_alloc_at(t, 120, 10), TLSF_NONE); /* inside r1 */
	assert_int_equal(tlsf_alloc_at(t, 90, 20), TLSF_NONE);  /* overlaps r1 */
	assert_int_equal(tlsf_alloc_at(t, 140, 20), TLSF_NONE); /* overlaps r1 */
	assert_int_equal(tlsf_alloc_at(t, 9995, 10), TLSF_NONE);
	assert_int_equal(tlsf_alloc_at(t, 10000, 1), TLSF_NONE);
	assert_int_equal(tlsf_alloc_at(t, 200, 0), TLSF_NONE);
	assert_int_equal(tlsf_alloc_at(t, 200, UINT64_MAX), TLSF_NONE);
	assert_int_equal(tlsf_check(t), 0);

	uint64_t off;
	uint32_t a1 = tlsf_alloc(t, 90, &off);
	assert_int_equal(off, 10);
	uint32_t a2 = tlsf_alloc(t, 4850, &off);
	assert_int_equal(off, 150);
	uint32_t a3 = tlsf_alloc(t, 3990, &off);
	assert_int_equal(off, 6000);
	assert_int_equal(tlsf_free_units(t), 0);
	assert_int_equal(tlsf_check(t), 0);

	uint32_t hs[] = {r2, a1, r4, a3, r1, r3, a2};
	for (size_t i = 0; i < sizeof(hs) / sizeof(hs[0]); i++) {
		tlsf_free(t, hs[i]);
		assert_int_equal(tlsf_check(t), 0);
	}
	assert_int_equal(tlsf_largest_free(t), 10000);
	assert_int_not_equal(tlsf_alloc_at(t, 0, 10000), TLSF_NONE);
	tlsf_destroy(t);
}

/* ---- statistics -------------------------------------------------------- */

static void test_fragmentation(void **state)
{
	(void)state;
	tlsf *t = tlsf_create(1000);
	uint32_t h[10];
	for (int i = 0; i < 10; i++)
		h[i] = tlsf_alloc(t, 100, NULL);
	assert_true(tlsf_fragmentation(t) == 0.0); /* nothing free */
	tlsf_free(t, h[0]);
	tlsf_free(t, h[2]);
	tlsf_free(t, h[4]);
	assert_int_equal(tlsf_free_units(t), 300);
	assert_int_equal(tlsf_largest_free(t), 100);
	assert_float_equal(tlsf_fragmentation(t), 2.0 / 3.0, 1e-12);
	tlsf_free(t, h[1]); /* [0,300) now one block */
	assert_int_equal(tlsf_largest_free(t), 300);
	assert_float_equal(tlsf_fragmentation(t), 0.25, 1e-12);
	tlsf_free(t, h[9]);
	tlsf_free(t, h[7]);
	assert_float_equal(tlsf_fragmentation(t), 1.0 - 300.0 / 600.0, 1e-12);
	assert_int_equal(tlsf_check(t), 0);
	tlsf_destroy(t);
}

static void test_mem_bytes(void **state)
{
	(void)state;
	tlsf *t = tlsf_create(1 << 20);
	size_t m0 = tlsf_mem_bytes(t);
	assert_true(m0 > 0);
	for (int i = 0; i < 10000; i++)
		assert_int_not_equal(tlsf_alloc(t, 3, NULL), TLSF_NONE);
	size_t m1 = tlsf_mem_bytes(t);
	assert_true(m1 > m0);
	assert_true(m1 - m0 <= 2 * 10001 * 32); /* 32-byte nodes, doubling */
	assert_int_equal(tlsf_check(t), 0);
	tlsf_destroy(t);
}

/* ---- large capacity ---------------------------------------------------- */

static void test_large(void **state)
{
	(void)state;
	const uint64_t cap = UINT64_C(1) << 36, mb = UINT64_C(1) << 20;
	tlsf *t = tlsf_create(cap);
	assert_non_null(t);
	uint64_t off;
	uint32_t a = tlsf_alloc(t, cap / 2, &off);
	assert_int_equal(off, 0);
	uint32_t b = tlsf_alloc_at(t, cap - mb, mb);
	assert_int_not_equal(b, TLSF_NONE);
	uint32_t c = tlsf_alloc(t, cap / 4, &off);
	assert_int_equal(off, cap / 2);
	uint64_t rest = cap - cap / 2 - cap / 4 - mb;
	assert_int_equal(tlsf_largest_free(t), rest);
	assert_int_equal(tlsf_alloc(t, rest + 1, &off), TLSF_NONE);
	uint32_t d = tlsf_alloc(t, rest, &off);
	assert_int_not_equal(d, TLSF_NONE);
	assert_int_equal(off, cap / 2 + cap / 4);
	assert_int_equal(tlsf_alloc(t, 1, &off), TLSF_NONE);
	assert_int_equal(tlsf_check(t), 0);
	tlsf_free(t, c);
	tlsf_free(t, a);
	tlsf_free(t, d);
	tlsf_free(t, b);
	assert_int_equal(tlsf_free_units(t), cap);
	assert_int_equal(tlsf_check(t), 0);
	tlsf_destroy(t);

	t = tlsf_create(UINT64_C(1) << 40);
	assert_non_null(t);
	assert_int_not_equal(tlsf_alloc_at(t, (UINT64_C(1) << 40) - 1, 1), TLSF_NONE);
	assert_int_equal(tlsf_largest_free(t), (UINT64_C(1) << 40) - 1);
	tlsf_destroy(t);
}

/* ---- randomized against a reference model ----------------------------- */

#define R_CAP 65536u
#define R_OPS 200000
#define R_MAXH (1u << 20)

typedef struct {
	tlsf *t;
	uint8_t used[R_CAP]; /* reference: 1 = allocated unit */
	uint64_t ref_free;
	uint32_t live[R_CAP];  /* live handles */
	uint32_t nlive;
	int32_t *slot;         /* handle -> index in live, -1 if not live */
	uint64_t rng;
	uint64_t fails;
} rmodel;

static uint64_t rnd(rmodel *m)
{
	m->rng ^= m->rng << 13;
	m->rng ^= m->rng >> 7;
	m->rng ^= m->rng << 17;
	return m->rng;
}

static uint64_t rnd_size(rmodel *m)
{
	uint64_t r = rnd(m) % 100;
	uint64_t lim = r < 70 ? 64 : r < 95 ? 1024 : 8192;
	return 1 + rnd(m) % lim;
}

static uint64_t ref_largest(const rmodel *m)
{
	uint64_t best = 0, run = 0;
	for (uint32_t u = 0; u < R_CAP; u++) {
		run = m->used[u] ? 0 : run + 1;
		best = run > best ? run : best;
	}
	return best;
}

static int ref_range_free(const rmodel *m, uint64_t off, uint64_t n)
{
	if (off >= R_CAP || n > R_CAP - off)
		return 0;
	for (uint64_t u = off; u < off + n; u++)
		if (m->used[u])
			return 0;
	return 1;
}

/* A successful allocation: check it against the model and record it. */
static void ref_take(rmodel *m, uint32_t h, uint64_t off, uint64_t n)
{
	assert_true(h < R_MAXH);
	assert_int_equal(m->slot[h], -1); /* handle not already live */
	assert_true(off < R_CAP && n <= R_CAP - off);
	assert_int_equal(tlsf_block_off(m->t, h), off);
	assert_int_equal(tlsf_block_len(m->t, h), n);
	for (uint64_t u = off; u < off + n; u++) {
		assert_int_equal(m->used[u], 0); /* no overlap */
		m->used[u] = 1;
	}
	m->ref_free -= n;
	m->slot[h] = (int32_t)m->nlive;
	m->live[m->nlive++] = h;
}

static void r_alloc(rmodel *m)
{
	uint64_t n = rnd_size(m), off;
	uint32_t h = tlsf_alloc(m->t, n, &off);
	if (h != TLSF_NONE) {
		ref_take(m, h, off, n);
		return;
	}
	assert_true(n > tlsf_largest_free(m->t));
	if (m->fails++ % 16 == 0)
		assert_true(n > ref_largest(m)); /* truly nothing fits */
}

/* Random range: must succeed exactly when every unit of it is free. */
static void r_alloc_at_random(rmodel *m)
{
	uint64_t off = rnd(m) % R_CAP, n = 1 + rnd(m) % 256;
	uint32_t h = tlsf_alloc_at(m->t, off, n);
	if (ref_range_free(m, off, n))
		ref_take(m, h, off, n);
	else
		assert_int_equal(h, TLSF_NONE);
}

/* A sub-range of a free run found in the model: must succeed. */
static void r_alloc_at_free(rmodel *m)
{
	uint64_t u = rnd(m) % R_CAP, a = u, b = u + 1;
	if (m->used[u])
		return;
	while (a > 0 && !m->used[a - 1])
		a--;
	while (b < R_CAP && !m->used[b])
		b++;
	uint64_t off = a + rnd(m) % (b - a);
	uint64_t n = 1 + rnd(m) % (b - off);
	uint32_t h = tlsf_alloc_at(m->t, off, n);
	assert_int_not_equal(h, TLSF_NONE);
	ref_take(m, h, off, n);
}

static void r_free(rmodel *m)
{
	uint32_t i = (uint32_t)(rnd(m) % m->nlive), h = m->live[i];
	uint64_t off = tlsf_block_off(m->t, h), n = tlsf_block_len(m->t, h);
	for (uint64_t u = off; u < off + n; u++) {
		assert_int_equal(m->used[u], 1);
		m->used[u] = 0;
	}
	m->ref_free += n;
	tlsf_free(m->t, h);
	m->slot[h] = -1;
	m->live[i] = m->live[--m->nlive];
	m->slot[m->live[i]] = (int32_t)i;
	if (i == m->nlive)
		m->slot[h] = -1;
}

static void r_step(rmodel *m, int op)
{
	uint64_t r = rnd(m) % 100;
	if (m->nlive > 0 && r < 42)
		r_free(m);
	else if (r < 95)
		r_alloc(m);
	else if (r < 98)
		r_alloc_at_random(m);
	else
		r_alloc_at_free(m);
	assert_int_equal(tlsf_free_units(m->t), m->ref_free);
	if (op % 1000 == 0) {
		assert_int_equal(tlsf_check(m->t), 0);
		assert_int_equal(tlsf_largest_free(m->t), ref_largest(m));
	}
}

static void test_random(void **state)
{
	(void)state;
	rmodel *m = calloc(1, sizeof(*m));
	assert_non_null(m);
	m->slot = malloc(R_MAXH * sizeof(*m->slot));
	assert_non_null(m->slot);
	memset(m->slot, 0xff, R_MAXH * sizeof(*m->slot));
	m->t = tlsf_create(R_CAP);
	m->ref_free = R_CAP;
	m->rng = 0x9e3779b97f4a7c15ull;
	for (int op = 0; op < R_OPS; op++)
		r_step(m, op);
	assert_true(m->fails > 0); /* the pool did run full */
	while (m->nlive > 0)
		r_free(m);
	assert_int_equal(tlsf_free_units(m->t), R_CAP);
	assert_int_equal(tlsf_largest_free(m->t), R_CAP);
	assert_int_equal(tlsf_check(m->t), 0);
	tlsf_destroy(m->t);
	free(m->slot);
	free(m);
}

/* ---- broken invariants abort ------------------------------------------- */

enum { BAD_DOUBLE, BAD_RANGE, BAD_NONE, BAD_FREEBLOCK, BAD_LEN_AFTER_FREE };

static void bad_op(int kind)
{
	tlsf *t = tlsf_create(100);
	uint32_t h = tlsf_alloc(t, 10, NULL); /* leaves the rest free */
	uint32_t other = tlsf_alloc_at(t, 50, 10);
	switch (kind) {
	case BAD_DOUBLE: tlsf_free(t, h); tlsf_free(t, h); break;
	case BAD_RANGE: tlsf_free(t, 1000); break;
	case BAD_NONE: tlsf_free(t, TLSF_NONE); break;
	case BAD_FREEBLOCK: /* a handle that is neither h nor other is free */
		tlsf_free(t, (h != 1 && other != 1) ? 1 : 2); break;
	case BAD_LEN_AFTER_FREE: tlsf_free(t, other); (void)tlsf_block_len(t, other); break;
	}
}

static void expect_abort(int kind)
{
	fflush(stdout);
	fflush(stderr);
	pid_t pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		int fd = open("/dev/null", O_WRONLY);
		if (fd >= 0)
			dup2(fd, STDERR_FILENO);
		bad_op(kind);
		_exit(0);
	}
	int st = 0;
	assert_int_equal(waitpid(pid, &st, 0), pid);
	assert_true(WIFSIGNALED(st));
	assert_int_equal(WTERMSIG(st), SIGABRT);
}

static void test_bad_handle_aborts(void **state)
{
	(void)state;
	expect_abort(BAD_DOUBLE);
	expect_abort(BAD_RANGE);
	expect_abort(BAD_NONE);
	expect_abort(BAD_FREEBLOCK);
	expect_abort(BAD_LEN_AFTER_FREE);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_create_args),
		cmocka_unit_test(test_basic),
		cmocka_unit_test(test_exhaust),
		cmocka_unit_test(test_alloc_at),
		cmocka_unit_test(test_fragmentation),
		cmocka_unit_test(test_mem_bytes),
		cmocka_unit_test(test_large),
		cmocka_unit_test(test_random),
		cmocka_unit_test(test_bad_handle_aborts),
	};
	return cmocka_run_group_tests_name("tlsf", tests, NULL, NULL);
}
