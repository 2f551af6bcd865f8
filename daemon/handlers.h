/*
 * handlers.h -- one request in, one response out; the connections the
 * daemon knows of (see handlers.c).
 *
 * Core thread only. A struct req lives while its handler runs: what
 * req_alloc hands out is freed with the response (handle_response_free).
 */
#ifndef KVT_HANDLERS_H
#define KVT_HANDLERS_H

#include <stddef.h>
#include <stdint.h>

#include "kvtier.h"
#include "kvtier.pb-c.h"

struct kvtierd;
struct req;

/* Connections: nng pipes and fast-channel ids, as the transports report them. */
void pipe_added(struct kvtierd *d, uint32_t pipe);
void pipe_removed(struct kvtierd *d, uint32_t pipe);
int pipe_alive(const struct kvtierd *d, uint32_t pipe);

/* One request in, one response out (the caller frees both). */
void handle_request(struct kvtierd *d, uint32_t pipe, const uint8_t *buf,
                    size_t len, Kvtier__Response *rsp, void **scratch);
void handle_response_free(Kvtier__Response *rsp, void *scratch);
/* The answer of a parked GET (the NVMe and peer tiers answer late through
 * it), built as do_get builds one: slots[0..n) are its leading chunks now
 * in DRAM. rsp is initialised here; free it with
 * handle_response_free(rsp, *scratch). */
void handle_get_answer(struct kvtierd *d, uint32_t pipe, uint64_t req_id,
                       uint16_t ns, int inline_, uint32_t n_keys,
                       const uint32_t *slots, size_t n, Kvtier__Response *rsp,
                       void **scratch);

/* What a dropped lease lets go of (lease.h's release; arg is the
 * daemon): a write lease's uncommitted chunk is freed, a read lease's
 * chunk unpinned (and freed if it was deleted meanwhile). */
void handle_lease_release(void *arg, uint8_t kind, uint32_t slot);

/* Memory that lives until the response is packed. */
void *req_alloc(struct req *r, size_t size);
/* Set the response's error and text; returns e. */
kvt_err req_fail(struct req *r, kvt_err e, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#endif
