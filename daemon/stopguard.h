/*
 * stopguard.h -- a bound on how long the daemon takes to stop.
 *
 * Design: a stop must end whatever peers, clients or libraries do (a
 * peer that stopped answering, nng 1.5's close deadlock, a device that
 * never completes). When the stop begins, sg_arm() starts one thread that
 * sleeps until the bound; sg_done() at the end of the shutdown wakes and
 * joins it. If the bound passes first, the thread logs the step the
 * shutdown was stuck in (sg_stage) and ends the process with _exit(1):
 * the same as a kill -9 to everything kvtierd keeps for a restart (the
 * pool journal and NVMe index are crash-safe), but bounded and explained.
 *
 * Threading: sg_* are called from the core thread; the guard's thread
 * only reads the stage name (a pointer to a string literal).
 */
#ifndef KVT_STOPGUARD_H
#define KVT_STOPGUARD_H

#include <stdint.h>

/* Start the guard: the process ends ms from now unless sg_done() runs
 * first. 0 ms: no guard. A second call does nothing. 0, or -1 (no thread:
 * the stop goes on unguarded, with a warning). */
int sg_arm(uint64_t ms);
/* Name the step the shutdown is in now (a string literal). */
void sg_stage(const char *what);
/* The stop finished: stop the guard. Safe without sg_arm. */
void sg_done(void);

#endif
