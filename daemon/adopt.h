/*
 * adopt.h -- the DRAM journal kept as the cache changes, and adopting a
 * predecessor's pool at start (see adopt.c, journal.h).
 *
 * Every call is the core thread's and is a no-op when the daemon has no
 * journal (d->journal NULL: no state_dir, or dram.adopt = 0).
 */
#ifndef KVT_ADOPT_H
#define KVT_ADOPT_H

#include <stdint.h>

struct kvtierd;

int adopt_open(struct kvtierd *d);
void adopt_close(struct kvtierd *d);
void adopt_added(struct kvtierd *d, uint32_t slot);   /* a DRAM copy is valid */
void adopt_removed(struct kvtierd *d, uint32_t slot); /* ... no longer */
void adopt_flush(struct kvtierd *d);
void adopt_tick(struct kvtierd *d);

#endif
