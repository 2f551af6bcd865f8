/*
 * kvxfer.h -- the workers of the KV-cache transfers and settling their
 * results on the core thread (see kvxfer.c; the lifetimes are kvcache.h's).
 */
#ifndef KVT_KVXFER_H
#define KVT_KVXFER_H

#include <stdint.h>

#include "kvcache.h"

int kvc_pool_start(struct kvc *k);
/* Join the workers; transfers still queued are not run, and results not
 * yet handed back are dropped: the caller settles every transfer. */
void kvc_pool_stop(struct kvc *k);
void kvc_pool_push(struct kvc *k, struct kvc_xfer *x);
/* Take x off the queue if no worker has it yet: 1 if taken. */
int kvc_pool_unqueue(struct kvc *k, struct kvc_xfer *x);
/* Core thread: settle a transfer's chunks (commit, free or unpin) and
 * drop its registration reference. err is the result to record. */
void kvc_xfer_settle(struct kvc *k, struct kvc_xfer *x, kvt_err err);
/* Install the SIGBUS guard workers copy under (again: harmless). */
void kvc_sigbus_install(void);

#endif
