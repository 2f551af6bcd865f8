/*
 * wire.h -- framing shared by libkvtier and kvtierd: a protobuf message in,
 * an nng message out, and back.
 *
 * Design: one nng message carries exactly one packed Request or Response,
 * nothing else, so a decoder never needs a length prefix of its own. The
 * generated protobuf-c code does the parsing and enforces field types; these
 * helpers only add the checks every handler needs (key length, namespace).
 */
#ifndef KVT_WIRE_H
#define KVT_WIRE_H

#include <nng/nng.h>
#include <protobuf-c/protobuf-c.h>

#include "kvtier.h"
#include "kvtier.pb-c.h"

/* Pack m into a new nng message. 0 or an nng error. */
int wire_pack(const ProtobufCMessage *m, nng_msg **out);

/* 1 if b holds exactly one key. */
static inline int wire_key_ok(const ProtobufCBinaryData *b)
{
    return b->len == KVT_KEY_LEN && b->data != NULL;
}

/* 1 if ns is a valid namespace name: 1..KVT_NS_MAX bytes of printable
 * ASCII with no spaces. */
int wire_ns_ok(const char *ns);

/* kvt_err <-> nng error, for the transport edge. */
kvt_err wire_nng_err(int rv);

#endif
