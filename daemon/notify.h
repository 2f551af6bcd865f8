/*
 * notify.h -- the systemd notification protocol, without libsystemd.
 *
 * Design: under Type=notify systemd passes $NOTIFY_SOCKET, a unix datagram
 * socket (a path, or an abstract name spelled with a leading '@'); a
 * service reports "READY=1", "STATUS=...", "STOPPING=1", "RELOADING=1" and
 * "WATCHDOG=1" by sending newline-separated assignments to it. One
 * datagram per call, sent on a fresh socket, so nothing is held open and a
 * daemon not run by systemd (no variable) pays nothing. Failing to notify
 * is never fatal: the caller logs it once.
 * The fd store rides the same socket: "FDSTORE=1\nFDNAME=x" with the fd
 * in SCM_RIGHTS makes systemd keep it (FileDescriptorStoreMax= > 0), and
 * the next start of the service gets it back as one of $LISTEN_FDS
 * (numbered from 3, named in $LISTEN_FDNAMES, for $LISTEN_PID only).
 */
#ifndef KVT_NOTIFY_H
#define KVT_NOTIFY_H

#include <stddef.h>
#include <stdint.h>

/* Send state (e.g. "READY=1\nSTATUS=serving"). 1 if sent, 0 when there is
 * no $NOTIFY_SOCKET, -1 with a sentence in err when sending failed. */
int notify_send(const char *state, char *err, size_t errlen);

/* The same, with fd attached (SCM_RIGHTS): for FDSTORE=1. */
int notify_send_fd(const char *state, int fd, char *err, size_t errlen);

/* The fd systemd passed under name (LISTEN_FDNAMES), when LISTEN_PID is
 * ours; -1 when none. The caller owns it. At start, once per name (each
 * pool): the LISTEN_* variables are read and removed at the first call,
 * so nothing we start inherits them. */
int notify_listen_fd(const char *name);

/* The watchdog interval systemd asks for ($WATCHDOG_USEC, honoured only
 * when $WATCHDOG_PID is unset or ours), in ms; 0 when none. */
uint64_t notify_watchdog_ms(void);

#endif
