/*
 * local.h -- the local fast channel: protobuf requests over a Unix stream
 * socket served by the core thread itself (see local.c).
 */
#ifndef KVT_LOCAL_H
#define KVT_LOCAL_H

#include <stddef.h>
#include <stdint.h>

#include "kvtier.pb-c.h"

/* Connection ids start here, above every nng pipe id (nng's are 31-bit),
 * so leases can be owned by either kind of connection. */
#define LOCAL_ID_BASE 0x80000000u

struct local_srv;

typedef void (*local_handler_fn)(void *arg, uint32_t conn, const uint8_t *body,
                                 size_t len, Kvtier__Response *rsp, void **scratch);
typedef void (*local_free_fn)(Kvtier__Response *rsp, void *scratch);
typedef void (*local_conn_fn)(void *arg, uint32_t conn, int added);

struct local_opts {
    const char *path;
    unsigned mode;
    const char *group;
    uint64_t max_msg_bytes;
    local_handler_fn handle;
    local_free_fn free_rsp;
    local_conn_fn conn;
    void *arg;
    uint32_t max_conns; /* open connections at most; 0: no limit */
};

/* Listen on o->path (a stale file there is replaced: the caller holds the
 * daemon's socket lock). 0, or -1 with a sentence in err. */
int local_open(const struct local_opts *o, struct local_srv **out, char *err,
               size_t errlen);
/* One fd for the core's epoll: readable when any connection has work. */
int local_fd(const struct local_srv *s);
/* Accept, read, serve and write whatever is ready, bounded per call. */
void local_poll(struct local_srv *s);
/* Open connections. */
uint32_t local_count(const struct local_srv *s);
/* Connections closed at accept because max_conns were open. */
uint64_t local_refused(const struct local_srv *s);
/* The uid of the process at the other end of conn (SO_PEERCRED). 0, or
 * -1 if there is no such connection. */
int local_peer_uid(const struct local_srv *s, uint32_t conn, uint64_t *uid);
/* Its uid and primary gid (SO_PEERCRED). 0, or -1 as local_peer_uid. */
int local_peer_cred(const struct local_srv *s, uint32_t conn, uint32_t *uid,
                    uint32_t *gid);

/* Inside the handler (core thread): answer this request later. Its
 * response is then not sent, and the connection is not read from until
 * local_reply_later (a client sends one request at a time anyway). NULL
 * when no local request is being handled. */
struct local_later;
struct local_later *local_defer(struct local_srv *s);
/* Called by a handler: send a copy of fd with the reply it is making
 * (SCM_RIGHTS on the reply's first byte). 0, or -1 when no local request
 * is being handled or fd cannot be copied; the caller keeps fd. */
int local_attach_fd(struct local_srv *s, int fd);
/* Send the deferred reply; rsp NULL sends nothing. Core thread; the
 * handle dies with its connection, so it must be dropped when the
 * connection is reported removed (rsp NULL is then still allowed, from
 * that report). Modules do not call this: park.c does, and keeps that
 * rule for all of them. */
void local_reply_later(struct local_srv *s, struct local_later *h,
                       const Kvtier__Response *rsp);

/* Close every connection (each reported as removed), the listener, and
 * unlink the socket file. Accepts NULL. */
void local_close(struct local_srv *s);

#endif
