/*
 * client_internal.h -- what libkvtier's own files and kvtierctl share
 * beyond the public header. Not installed.
 */
#ifndef KVT_CLIENT_INTERNAL_H
#define KVT_CLIENT_INTERNAL_H

#include "kvtier.h"
#include "kvtier.pb-c.h"

/* Send q (its id is assigned here) and receive the response. On KVT_OK
 * *rsp is owned by the caller (kvtier__response__free_unpacked); a daemon
 * error is returned as its code with the text in kvt_last_error. */
kvt_err kvtc_call(kvt_client *c, Kvtier__Request *q, Kvtier__Response **rsp);
/* Send raw bytes as a request (tests of bad input); the response is
 * returned as is, error or not. */
kvt_err kvtc_call_raw(kvt_client *c, const void *buf, size_t len,
                      Kvtier__Response **rsp);
/* Pointer to global offset off of pool (as the answer names it) in the
 * mapped pool, or NULL if unmapped, another pool, or out of range. */
void *kvtc_pool_ptr(const kvt_client *c, uint32_t pool, uint64_t off, uint64_t size);
/* The pool this client was told of at HELLO (0: the default). */
uint32_t kvtc_pool_id(const kvt_client *c);
const char *kvtc_gpu(const kvt_client *c);
/* The per-request timeout (kvt_set_timeout), in milliseconds. */
int kvtc_timeout_ms(const kvt_client *c);

#endif
