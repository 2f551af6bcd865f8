/*
 * tlsf.h -- O(1) TLSF-style offset allocator over abstract units.
 *
 * Manages the unit range [0, capacity) and only hands out offsets; it never
 * touches the managed memory.  All metadata lives in ordinary heap memory
 * (out of band), so the range itself may be mapped writable by untrusted
 * processes.  The DRAM tier uses 4 KiB units.
 *
 * Ownership: the caller owns the tlsf object and frees it with
 * tlsf_destroy(), which invalidates every handle.  A handle (uint32_t) names
 * one allocated block from tlsf_alloc()/tlsf_alloc_at() until tlsf_free();
 * after that the same number may be handed out again for another block, so
 * a stale handle is only detected while its slot is still unused.
 *
 * Not thread-safe: one thread owns a tlsf (or the caller locks around it).
 */
#ifndef KVT_TLSF_H
#define KVT_TLSF_H

#include <stdint.h>
#include <stddef.h>

typedef struct tlsf tlsf;

#define TLSF_NONE UINT32_MAX

/* Largest capacity accepted by tlsf_create() (lengths keep two spare bits). */
#define TLSF_MAX_CAPACITY ((UINT64_C(1) << 62) - 1)

/* Manage units [0, capacity).  NULL on bad args (0 or > TLSF_MAX_CAPACITY)
 * or out of memory. */
tlsf *tlsf_create(uint64_t capacity);
void tlsf_destroy(tlsf *t); /* accepts NULL */

/* Allocate n >= 1 units: returns a block handle and writes the unit offset to
 * *off (off may be NULL), or TLSF_NONE if no free block can hold n (or
 * n == 0).  Good fit in O(1) via two-level segregated bitmaps; the block is
 * split so exactly n units are allocated.  Only when no size class above n's
 * own holds a block does it scan n's class list (pool nearly full for n).
 * TLSF_NONE is also returned, softly, when the descriptor array cannot grow
 * (heap exhausted or 2^32-1 blocks); nothing changes in that case. */
uint32_t tlsf_alloc(tlsf *t, uint64_t n, uint64_t *off);

/* Reserve exactly [off, off+n), which must lie inside one free block: returns
 * the handle or TLSF_NONE (also for n == 0, out of range, overlap with an
 * allocated block, or descriptor growth failure).  Meant for start-up
 * adoption of blocks a previous daemon left: walks the address-ordered block
 * chain from the last adopted block, so adopting in ascending offset order
 * is O(1) each, any order O(number of blocks). */
uint32_t tlsf_alloc_at(tlsf *t, uint64_t off, uint64_t n);

/* Free a handle from tlsf_alloc/tlsf_alloc_at; coalesces with free physical
 * neighbours in O(1).  An invalid or already-free handle is a broken
 * invariant: abort() with a message. */
void tlsf_free(tlsf *t, uint32_t h);

/* Offset / length (exactly the n requested) of an allocated block.  An
 * invalid handle aborts like tlsf_free(). */
uint64_t tlsf_block_off(const tlsf *t, uint32_t h);
uint64_t tlsf_block_len(const tlsf *t, uint32_t h);

uint64_t tlsf_capacity(const tlsf *t);
uint64_t tlsf_free_units(const tlsf *t);
/* Exact size of the largest free block: O(1) to find its size class, then a
 * scan of that one class list (stats path, not the allocation path). */
uint64_t tlsf_largest_free(const tlsf *t);
double tlsf_fragmentation(const tlsf *t); /* 1 - largest/free; 0 if none free */
size_t tlsf_mem_bytes(const tlsf *t);     /* heap bytes used by the metadata */

/* Debug check of every invariant (free lists vs bitmaps, address-ordered
 * neighbour links, no two adjacent free blocks, sum of lengths == capacity,
 * unused-slot list).  O(blocks).  Returns 0 if OK, -1 otherwise. */
int tlsf_check(const tlsf *t);

#endif /* KVT_TLSF_H */
