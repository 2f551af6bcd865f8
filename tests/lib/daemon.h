/*
 * daemon.h -- start and stop real kvtierd processes from tests.
 *
 * Each daemon gets its own temporary directory (socket, state, log) and its
 * own pool file under /dev/shm, so tests never share state and may run
 * several daemons at once. The binary is $KVTIERD or build/bin/kvtierd.
 */
#ifndef KVT_TEST_DAEMON_H
#define KVT_TEST_DAEMON_H

#include <sys/types.h>

#include "kvtier.h"

struct tdaemon {
    pid_t pid;
    char dir[256];
    char sock[320];
    char pool[320];
    char log[320];
};

/* Make the directory and names; start nothing. */
int td_init(struct tdaemon *d);
/* Start kvtierd with these extra args (NULL-terminated, may be NULL) and
 * wait until it answers. 0 on success. */
int td_start(struct tdaemon *d, const char *const *extra);
/* Start without waiting; returns the pid. */
pid_t td_spawn(struct tdaemon *d, const char *const *extra);
/* Wait for the process to exit (up to ms); its exit status or -1. */
int td_wait_exit(pid_t pid, int ms);
/* SIGTERM and wait; returns the exit status (0 = clean). */
int td_stop(struct tdaemon *d);
/* SIGKILL and reap. */
void td_kill(struct tdaemon *d);
/* Remove the directory and pool file. */
void td_cleanup(struct tdaemon *d);
/* Connect a client (asserts success). */
kvt_client *td_connect(const struct tdaemon *d);
/* 1 if the daemon's log contains s. */
int td_log_has(const struct tdaemon *d, const char *s);
/* A tcp port on 127.0.0.1 free right now (bound, read back, closed):
 * fixed ranges collide with ephemeral ports and concurrent suites. */
int td_free_port(void);
/* Milliseconds on a monotonic clock. */
long long td_now_ms(void);
/* Deterministic bytes for (seed, i), and a key from a seed. */
void td_fill(void *buf, size_t n, uint64_t seed);
kvt_key td_key(uint64_t seed);

#endif
