/*
 * swim.h -- the embedded membership backend: SWIM with the Lifeguard
 * refinements (see swim.c). Use it through member.h:
 *
 *     struct mb *mb = mb_create(&swim_ops, &cfg, &why);
 */
#ifndef KVT_SWIM_H
#define KVT_SWIM_H

#include "member.h"

extern const struct mb_ops swim_ops;

#endif
