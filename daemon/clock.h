/*
 * clock.h -- the daemon's one clock (see clock.c): CLOCK_MONOTONIC in
 * milliseconds. kvtierd_clock() in kvtierd.h counts from the start.
 */
#ifndef KVT_CLOCK_H
#define KVT_CLOCK_H

#include <stdint.h>

uint64_t now_ms(void);

#endif
