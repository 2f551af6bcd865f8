/*
 * kvwait.h -- KvWait: a client waits for its transfers, parked until they
 * finish or its deadline passes (see kvwait.c; a client leaving: park.h).
 * Core thread only.
 */
#ifndef KVT_KVWAIT_H
#define KVT_KVWAIT_H

#include <stdint.h>

#include "kvcache.h"

struct req;

void kvc_do_wait(struct req *r, struct kvc *k, uint32_t pipe,
                 const Kvtier__KvWait *q, Kvtier__Response *rsp);

/* A transfer of pipe finished: answer the waits it completes. */
void kvc_wait_notify(struct kvc *k, uint32_t pipe);
void kvc_wait_close(struct kvc *k);

#endif
