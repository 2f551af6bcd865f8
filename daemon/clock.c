/*
 * clock.c -- the daemon's one clock: CLOCK_MONOTONIC in milliseconds, so
 * deadlines never jump with the wall clock. Kept out of main.c so that
 * tests and the fuzz harness, which link the daemon without its main, have
 * it too.
 */
#include <stdint.h>
#include <time.h>

#include "clock.h"

uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}
