/*
 * server.h -- the request transport of kvtierd (see server.c).
 */
#ifndef KVT_SERVER_H
#define KVT_SERVER_H

#include <nng/nng.h>
#include <nng/supplemental/tls/tls.h>
#include <stddef.h>
#include <stdint.h>

struct server;

struct server_opts {
    const char *const *urls;
    size_t n_urls;
    uint32_t contexts;
    uint64_t max_msg_bytes;
    unsigned ipc_mode; /* permissions of ipc:// socket files */
    /* One per url (NULL: all plain): the TLS configuration of a tls+tcp://
     * listener, or NULL. nng keeps its own reference. */
    nng_tls_config *const *tls;
};

/* Handle one request body from pipe; return the reply (owned by the
 * server from then on) or NULL to send nothing. Runs on the core thread. */
typedef nng_msg *(*server_handler_fn)(void *arg, uint32_t pipe,
                                      const void *body, size_t len);
/* A client connection came (added = 1) or went. Core thread. */
typedef void (*server_pipe_fn)(void *arg, uint32_t pipe, int added);

int server_open(const struct server_opts *o, struct server **out, char *err,
                size_t errlen);
/* The index in opts.urls of the listener pipe came through, or -1 if the
 * pipe is unknown (gone). Core thread. */
int server_url_of(const struct server *s, uint32_t pipe);
/* The eventfd that becomes readable when requests or pipe events wait. */
int server_fd(const struct server *s);
/* Serve everything queued. Core thread only. */
void server_poll(struct server *s, server_handler_fn fn, server_pipe_fn pfn,
                 void *arg);
/* Run fn(arg) on the core thread, in server_poll, soon. Any thread may
 * post (workers hand results back this way, DESIGN §6). A post still
 * queued when the server closes is freed without running: whoever posts
 * owns arg and must not need the call after server_close. */
void server_post(struct server *s, void (*fn)(void *arg), void *arg);

/* Inside a handler (core thread): answer this request later. What the
 * handler returns is then discarded and the request's context stays
 * parked until server_reply_later, which must be called exactly once per
 * handle (on every path: a parked context serves nobody else). NULL when
 * the request did not come through this server (answer it now). */
struct server_later;
struct server_later *server_defer(struct server *s);
/* Send the deferred reply (owned by the server from then on); rsp NULL
 * sends nothing. Core thread; not after server_close. Modules do not call
 * this: park.c does. */
void server_reply_later(struct server *s, struct server_later *h,
                        nng_msg *rsp);

/* Stop listening, cancel in-flight receives, free. Accepts NULL and
 * half-built servers. */
void server_close(struct server *s);

#endif
