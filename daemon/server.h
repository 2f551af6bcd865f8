/*
 * server.h -- the request transport of kvtierd (see server.c).
 */
#ifndef KVT_SERVER_H
#define KVT_SERVER_H

#include <nng/nng.h>
#include <stddef.h>
#include <stdint.h>

struct server;

struct server_opts {
    const char *const *urls;
    size_t n_urls;
    uint32_t contexts;
    uint64_t max_msg_bytes;
    unsigned ipc_mode; /* permissions of ipc:// socket files */
};

/* Handle one request body from pipe; return the reply (owned by the
 * server from then on) or NULL to send nothing. Runs on the core thread. */
typedef nng_msg *(*server_handler_fn)(void *arg, uint32_t pipe,
                                      const void *body, size_t len);
/* A client connection came (added = 1) or went. Core thread. */
typedef void (*server_pipe_fn)(void *arg, uint32_t pipe, int added);

int server_open(const struct server_opts *o, struct server **out, char *err,
                size_t errlen);
/* The eventfd that becomes readable when requests or pipe events wait. */
int server_fd(const struct server *s);
/* Serve everything queued. Core thread only. */
void server_poll(struct server *s, server_handler_fn fn, server_pipe_fn pfn,
                 void *arg);
/* Stop listening, cancel in-flight receives, free. Accepts NULL and
 * half-built servers. */
void server_close(struct server *s);

#endif
