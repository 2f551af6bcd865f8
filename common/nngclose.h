/*
 * nngclose.h -- close nng sockets within a time bound.
 *
 * Design: nng 1.5 (the Debian library) can deadlock inside nng_close()
 * when a dialer is reconnecting to a peer that went away at the same
 * moment (seen with 60 cluster daemons stopped together: the closing
 * thread waits on a condition that threads blocked on the resolver's lock
 * never signal). A daemon must stop whatever its peers do, so sockets
 * whose close may race a peer's exit are closed on a helper thread, and
 * the caller waits at most a bound. Past it, the helper is left behind
 * (detached, holding its own copy of the socket ids, touching nothing of
 * the caller's) and the process exits around it; nothing is lost, since
 * what a restart needs is written by the caller after this returns.
 */
#ifndef KVT_NNGCLOSE_H
#define KVT_NNGCLOSE_H

#include <stddef.h>

#include <nng/nng.h>

/* Close the n sockets of s (copied; s may be freed after the call),
 * waiting at most ms. hang != 0 makes the helper block before closing (a
 * test hook standing in for the deadlock). 0 when every socket closed
 * (also when the helper could not start: then they were closed here,
 * unbounded), -1 when the bound passed (the sockets are abandoned to
 * process exit). */
int nngc_close_bounded(const nng_socket *s, size_t n, unsigned ms, int hang);

#endif
