/*
 * tlsf.c -- O(1) TLSF-style offset allocator with out-of-band metadata.
 *
 * Design.  The managed range is shared memory that untrusted clients can
 * write, so nothing about the allocator lives inside it: every block (free
 * or allocated) is a 32-byte descriptor in one heap array, and a handle is
 * simply the descriptor's index.  Each descriptor holds offset, length, the
 * physical neighbours in address order (phys_prev/phys_next) and, while
 * free, its links in a segregated free list (free_prev/free_next).  Unused
 * descriptor slots are chained through free_next and reused first; the
 * array grows by doubling, before any list is touched, so a failed growth
 * leaves the allocator unchanged and is reported as TLSF_NONE (STYLE §5:
 * pool space fails softly).  tlsf_free() never needs a new descriptor.
 *
 * Size classes are the classic TLSF two-level map: first level = log2 of
 * the length, second level = SL_COUNT linear subdivisions of that power of
 * two; lengths below SL_COUNT get exact classes in first level 0.  A bit in
 * fl_map says "some second-level list of this first level is non-empty",
 * a bit in sl_map[fl] says "list (fl, sl) is non-empty".  Allocation rounds
 * the request up to the next class boundary (mapping_search), so the head of
 * any list found by two find-first-set operations fits: O(1), good fit.  If
 * that finds nothing, a block of exactly n's class may still fit; only then
 * is that single list scanned, so TLSF_NONE really means "nothing fits".
 *
 * Invariants (tlsf_check verifies all of them):
 *  - blocks tile [0, capacity) in address order via phys links; node 0 is
 *    always the block at offset 0 (splits keep the left part's node and
 *    merges keep the left node, so it never moves);
 *  - no two physically adjacent blocks are both free (eager coalescing);
 *  - a node is in list (fl, sl) iff it is free and mapping(len) == (fl, sl);
 *    list (fl, sl) non-empty iff its sl_map bit is set, fl_map bit iff
 *    sl_map[fl] != 0;
 *  - free_units == sum of free block lengths.
 * The block state (used / free / unused slot) sits in the two top bits of
 * the length word, which is why capacity is limited to 2^62 - 1.
 */
#include "tlsf.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SL_LOG2 5u
#define SL_COUNT (1u << SL_LOG2)
#define FL_COUNT 60u /* msb <= 62 after rounding -> fl <= 58 */

#define ST_SHIFT 62
#define LEN_MASK ((UINT64_C(1) << ST_SHIFT) - 1)
enum { ST_USED = 0, ST_FREE = 1, ST_DEAD = 2 };

#define NODES_INIT 64u
#define NODES_MAX ((uint64_t)TLSF_NONE) /* indices 0 .. UINT32_MAX-1 */

typedef struct tlsf_node {
	uint64_t off;
	uint64_t lenst; /* length | state << ST_SHIFT */
	uint32_t phys_prev, phys_next;
	uint32_t free_prev, free_next; /* free list, or unused-slot chain */
} tlsf_node;

struct tlsf {
	uint64_t capacity;
	uint64_t free_units;
	uint64_t fl_map;
	uint32_t sl_map[FL_COUNT];
	uint32_t heads[FL_COUNT][SL_COUNT];
	tlsf_node *nodes;
	uint32_t node_cap;   /* slots allocated */
	uint32_t node_count; /* slots ever used (high-water mark) */
	uint32_t unused;     /* head of the unused-slot chain */
	uint32_t n_unused;
	uint32_t at_hint; /* where tlsf_alloc_at starts walking */
};

/* ---- small helpers ---------------------------------------------------- */

static uint64_t nlen(const tlsf_node *nd) { return nd->lenst & LEN_MASK; }
static unsigned nstate(const tlsf_node *nd) { return (unsigned)(nd->lenst >> ST_SHIFT); }

static void nset(tlsf_node *nd, uint64_t len, unsigned st)
{
	nd->lenst = len | ((uint64_t)st << ST_SHIFT);
}

static unsigned msb64(uint64_t x) { return 63u - (unsigned)__builtin_clzll(x); }

static void mapping(uint64_t size, unsigned *fl, unsigned *sl)
{
	if (size < SL_COUNT) {
		*fl = 0;
		*sl = (unsigned)size;
		return;
	}
	unsigned m = msb64(size);
	*fl = m - SL_LOG2 + 1;
	*sl = (unsigned)(size >> (m - SL_LOG2)) - SL_COUNT;
}

/* Class to start searching from: every block in it or above holds n. */
static void mapping_search(uint64_t n, unsigned *fl, unsigned *sl)
{
	if (n >= SL_COUNT)
		n += (UINT64_C(1) << (msb64(n) - SL_LOG2)) - 1;
	mapping(n, fl, sl);
}

static void die(const char *fn, uint32_t h, const char *why)
{
	fprintf(stderr, "tlsf: %s(handle %u): %s\n", fn, (unsigned)h, why);
	abort();
}

/* Always-on check: h must name an allocated block. */
static tlsf_node *used_node(const tlsf *t, uint32_t h, const char *fn)
{
	if (t == NULL)
		die(fn, h, "NULL allocator");
	if (h >= t->node_count)
		die(fn, h, "handle out of range");
	tlsf_node *nd = &t->nodes[h];
	if (nstate(nd) != ST_USED)
		die(fn, h, nstate(nd) == ST_FREE ? "block is free (double free?)"
						  : "handle not allocated");
	return nd;
}

/* ---- free lists ------------------------------------------------------- */

static void list_insert(tlsf *t, uint32_t i)
{
	tlsf_node *nd = &t->nodes[i];
	unsigned fl, sl;
	mapping(nlen(nd), &fl, &sl);
	uint32_t head = t->heads[fl][sl];
	nd->free_prev = TLSF_NONE;
	nd->free_next = head;
	if (head != TLSF_NONE)
		t->nodes[head].free_prev = i;
	t->heads[fl][sl] = i;
	t->sl_map[fl] |= 1u << sl;
	t->fl_map |= UINT64_C(1) << fl;
	nset(nd, nlen(nd), ST_FREE);
	t->free_units += nlen(nd);
}

static void list_remove(tlsf *t, uint32_t i)
{
	tlsf_node *nd = &t->nodes[i];
	unsigned fl, sl;
	mapping(nlen(nd), &fl, &sl);
	if (nd->free_prev != TLSF_NONE)
		t->nodes[nd->free_prev].free_next = nd->free_next;
	else
		t->heads[fl][sl] = nd->free_next;
	if (nd->free_next != TLSF_NONE)
		t->nodes[nd->free_next].free_prev = nd->free_prev;
	if (t->heads[fl][sl] == TLSF_NONE) {
		t->sl_map[fl] &= ~(1u << sl);
		if (t->sl_map[fl] == 0)
			t->fl_map &= ~(UINT64_C(1) << fl);
	}
	nset(nd, nlen(nd), ST_USED);
	t->free_units -= nlen(nd);
}

/* ---- descriptor slots ------------------------------------------------- */

/* Make sure k more nodes can be taken without failing. */
static int reserve_nodes(tlsf *t, uint32_t k)
{
	uint64_t avail = (uint64_t)t->n_unused + (t->node_cap - t->node_count);
	if (avail >= k)
		return 0;
	uint64_t cap = (uint64_t)t->node_cap * 2;
	if (cap > NODES_MAX)
		cap = NODES_MAX;
	if (cap - t->node_count + t->n_unused < k)
		return -1;
	tlsf_node *p = realloc(t->nodes, (size_t)cap * sizeof(*p));
	if (p == NULL)
		return -1;
	t->nodes = p;
	t->node_cap = (uint32_t)cap;
	return 0;
}

/* Take a slot (reserve_nodes() must have guaranteed one). */
static uint32_t node_take(tlsf *t)
{
	uint32_t i = t->unused;
	if (i != TLSF_NONE) {
		t->unused = t->nodes[i].free_next;
		t->n_unused--;
	} else {
		i = t->node_count++;
	}
	return i;
}

static void node_release(tlsf *t, uint32_t i)
{
	tlsf_node *nd = &t->nodes[i];
	nset(nd, 0, ST_DEAD);
	nd->phys_prev = nd->phys_next = nd->free_prev = TLSF_NONE;
	nd->free_next = t->unused;
	t->unused = i;
	t->n_unused++;
}

/* ---- physical chain --------------------------------------------------- */

/* Cut the first len units off block i (not in a list); the rest becomes a
 * new node right after it, returned (also not in a list). */
static uint32_t phys_split(tlsf *t, uint32_t i, uint64_t len)
{
	uint32_t r = node_take(t);
	tlsf_node *a = &t->nodes[i], *b = &t->nodes[r];
	b->off = a->off + len;
	nset(b, nlen(a) - len, ST_USED);
	b->phys_prev = i;
	b->phys_next = a->phys_next;
	if (a->phys_next != TLSF_NONE)
		t->nodes[a->phys_next].phys_prev = r;
	a->phys_next = r;
	nset(a, len, nstate(a));
	return r;
}

/* Absorb right neighbour r into i (neither in a list); r's slot is freed. */
static void phys_merge(tlsf *t, uint32_t i, uint32_t r)
{
	tlsf_node *a = &t->nodes[i], *b = &t->nodes[r];
	nset(a, nlen(a) + nlen(b), nstate(a));
	a->phys_next = b->phys_next;
	if (b->phys_next != TLSF_NONE)
		t->nodes[b->phys_next].phys_prev = i;
	if (t->at_hint == r)
		t->at_hint = i;
	node_release(t, r);
}

/* ---- create / destroy ------------------------------------------------- */

tlsf *tlsf_create(uint64_t capacity)
{
	if (capacity == 0 || capacity > TLSF_MAX_CAPACITY)
		return NULL;
	tlsf *t = calloc(1, sizeof(*t));
	if (t == NULL)
		goto fail;
	memset(t->heads, 0xff, sizeof(t->heads));
	t->nodes = malloc(NODES_INIT * sizeof(*t->nodes));
	if (t->nodes == NULL)
		goto fail;
	t->capacity = capacity;
	t->node_cap = NODES_INIT;
	t->node_count = 1;
	t->unused = TLSF_NONE;
	tlsf_node *nd = &t->nodes[0];
	nd->off = 0;
	nset(nd, capacity, ST_USED);
	nd->phys_prev = nd->phys_next = TLSF_NONE;
	list_insert(t, 0);
	return t;
fail:
	tlsf_destroy(t);
	return NULL;
}

void tlsf_destroy(tlsf *t)
{
	if (t == NULL)
		return;
	free(t->nodes);
	free(t);
}

/* ---- allocation ------------------------------------------------------- */

static uint32_t find_from(const tlsf *t, unsigned fl, unsigned sl)
{
	if (fl >= FL_COUNT)
		return TLSF_NONE;
	uint32_t slm = t->sl_map[fl] & (~0u << sl);
	if (slm == 0) {
		uint64_t flm = t->fl_map & (~UINT64_C(0) << (fl + 1));
		if (flm == 0)
			return TLSF_NONE;
		fl = (unsigned)__builtin_ctzll(flm);
		slm = t->sl_map[fl];
	}
	return t->heads[fl][__builtin_ctz(slm)];
}

/* Only reached when no class above n's own has a block. */
static uint32_t scan_exact(const tlsf *t, uint64_t n)
{
	unsigned fl, sl;
	mapping(n, &fl, &sl);
	for (uint32_t i = t->heads[fl][sl]; i != TLSF_NONE; i = t->nodes[i].free_next)
		if (nlen(&t->nodes[i]) >= n)
			return i;
	return TLSF_NONE;
}

uint32_t tlsf_alloc(tlsf *t, uint64_t n, uint64_t *off)
{
	if (t == NULL || n == 0 || n > t->free_units)
		return TLSF_NONE;
	unsigned fl, sl;
	mapping_search(n, &fl, &sl);
	uint32_t i = find_from(t, fl, sl);
	if (i == TLSF_NONE)
		i = scan_exact(t, n);
	if (i == TLSF_NONE || reserve_nodes(t, 1) != 0)
		return TLSF_NONE;
	list_remove(t, i);
	if (nlen(&t->nodes[i]) > n)
		list_insert(t, phys_split(t, i, n));
	if (off != NULL)
		*off = t->nodes[i].off;
	return i;
}

/* Block containing unit off, walking the chain from a still-live hint. */
static uint32_t block_at(const tlsf *t, uint64_t off)
{
	uint32_t i = t->at_hint;
	if (i >= t->node_count || nstate(&t->nodes[i]) == ST_DEAD)
		i = 0;
	while (t->nodes[i].off > off)
		i = t->nodes[i].phys_prev;
	while (off - t->nodes[i].off >= nlen(&t->nodes[i]))
		i = t->nodes[i].phys_next;
	return i;
}

uint32_t tlsf_alloc_at(tlsf *t, uint64_t off, uint64_t n)
{
	if (t == NULL || n == 0 || off >= t->capacity || n > t->capacity - off)
		return TLSF_NONE;
	uint32_t i = block_at(t, off);
	tlsf_node *nd = &t->nodes[i];
	if (nstate(nd) != ST_FREE || off + n > nd->off + nlen(nd))
		return TLSF_NONE;
	if (reserve_nodes(t, 2) != 0)
		return TLSF_NONE;
	list_remove(t, i);
	uint32_t m = i;
	if (off > t->nodes[i].off) {
		m = phys_split(t, i, off - t->nodes[i].off);
		list_insert(t, i);
	}
	if (nlen(&t->nodes[m]) > n)
		list_insert(t, phys_split(t, m, n));
	t->at_hint = m;
	return m;
}

void tlsf_free(tlsf *t, uint32_t h)
{
	used_node(t, h, "tlsf_free");
	uint32_t prev = t->nodes[h].phys_prev, next = t->nodes[h].phys_next;
	if (next != TLSF_NONE && nstate(&t->nodes[next]) == ST_FREE) {
		list_remove(t, next);
		phys_merge(t, h, next);
	}
	if (prev != TLSF_NONE && nstate(&t->nodes[prev]) == ST_FREE) {
		list_remove(t, prev);
		phys_merge(t, prev, h);
		h = prev;
	}
	list_insert(t, h);
}

/* ---- queries ---------------------------------------------------------- */

uint64_t tlsf_block_off(const tlsf *t, uint32_t h)
{
	return used_node(t, h, "tlsf_block_off")->off;
}

uint64_t tlsf_block_len(const tlsf *t, uint32_t h)
{
	return nlen(used_node(t, h, "tlsf_block_len"));
}

uint64_t tlsf_capacity(const tlsf *t) { return t->capacity; }
uint64_t tlsf_free_units(const tlsf *t) { return t->free_units; }

uint64_t tlsf_largest_free(const tlsf *t)
{
	if (t->fl_map == 0)
		return 0;
	unsigned fl = msb64(t->fl_map);
	unsigned sl = 31u - (unsigned)__builtin_clz(t->sl_map[fl]);
	uint64_t best = 0;
	for (uint32_t i = t->heads[fl][sl]; i != TLSF_NONE; i = t->nodes[i].free_next)
		if (nlen(&t->nodes[i]) > best)
			best = nlen(&t->nodes[i]);
	return best;
}

double tlsf_fragmentation(const tlsf *t)
{
	if (t->free_units == 0)
		return 0.0;
	return 1.0 - (double)tlsf_largest_free(t) / (double)t->free_units;
}

/* Resident metadata: slots ever used. The array's capacity beyond them
 * comes from realloc (mremap for large arrays) and is never touched, so it
 * costs address space, not memory. */
size_t tlsf_mem_bytes(const tlsf *t)
{
	return sizeof(*t) + (size_t)t->node_count * sizeof(tlsf_node);
}

/* ---- invariant check -------------------------------------------------- */

#define CHECK(c)                                                               \
	do {                                                                   \
		if (!(c)) {                                                    \
			fprintf(stderr, "tlsf_check: %s failed (line %d)\n",    \
				#c, __LINE__);                                 \
			return -1;                                             \
		}                                                              \
	} while (0)

/* Address-ordered chain: tiles [0, capacity), links agree, no free pair. */
static int check_phys(const tlsf *t, uint64_t *nblocks, uint64_t *nfree, uint64_t *units)
{
	uint64_t pos = 0, steps = 0;
	uint32_t prev = TLSF_NONE;
	int prev_free = 0;
	*nblocks = *nfree = *units = 0;
	for (uint32_t i = 0; i != TLSF_NONE; prev = i, i = t->nodes[i].phys_next) {
		CHECK(i < t->node_count && ++steps <= t->node_count);
		const tlsf_node *nd = &t->nodes[i];
		CHECK(nstate(nd) != ST_DEAD && nlen(nd) > 0);
		CHECK(nd->phys_prev == prev && nd->off == pos);
		int is_free = nstate(nd) == ST_FREE;
		CHECK(!(is_free && prev_free));
		pos += nlen(nd);
		CHECK(pos <= t->capacity);
		(*nblocks)++;
		*nfree += (uint64_t)is_free;
		*units += is_free ? nlen(nd) : 0;
		prev_free = is_free;
	}
	CHECK(pos == t->capacity);
	return 0;
}

/* One segregated list: members free, in the right class, links agree. */
static int check_list(const tlsf *t, unsigned fl, unsigned sl, uint64_t *count)
{
	uint32_t prev = TLSF_NONE;
	for (uint32_t i = t->heads[fl][sl]; i != TLSF_NONE; prev = i, i = t->nodes[i].free_next) {
		CHECK(i < t->node_count && ++*count <= t->node_count);
		const tlsf_node *nd = &t->nodes[i];
		unsigned f, s;
		mapping(nlen(nd), &f, &s);
		CHECK(nstate(nd) == ST_FREE && f == fl && s == sl);
		CHECK(nd->free_prev == prev);
	}
	return 0;
}

static int check_lists(const tlsf *t, uint64_t *count)
{
	*count = 0;
	for (unsigned fl = 0; fl < FL_COUNT; fl++) {
		for (unsigned sl = 0; sl < SL_COUNT; sl++) {
			int nonempty = t->heads[fl][sl] != TLSF_NONE;
			CHECK(nonempty == !!(t->sl_map[fl] & (1u << sl)));
			if (check_list(t, fl, sl, count) != 0)
				return -1;
		}
		CHECK(!!t->sl_map[fl] == !!(t->fl_map & (UINT64_C(1) << fl)));
	}
	CHECK((t->fl_map >> FL_COUNT) == 0);
	return 0;
}

static int check_unused(const tlsf *t, uint64_t *count)
{
	*count = 0;
	for (uint32_t i = t->unused; i != TLSF_NONE; i = t->nodes[i].free_next) {
		CHECK(i < t->node_count && ++*count <= t->node_count);
		CHECK(nstate(&t->nodes[i]) == ST_DEAD);
	}
	CHECK(*count == t->n_unused);
	return 0;
}

int tlsf_check(const tlsf *t)
{
	uint64_t nblocks, nfree, units, listed, unused;
	CHECK(t != NULL && t->node_count <= t->node_cap && t->node_count > 0);
	if (check_phys(t, &nblocks, &nfree, &units) != 0 ||
	    check_lists(t, &listed) != 0 || check_unused(t, &unused) != 0)
		return -1;
	CHECK(listed == nfree && units == t->free_units);
	CHECK(nblocks + unused == t->node_count);
	return 0;
}
