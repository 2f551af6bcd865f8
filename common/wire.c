/*
 * wire.c -- see wire.h.
 */
#include "wire.h"

#include <string.h>

int wire_pack(const ProtobufCMessage *m, nng_msg **out)
{
    size_t len = protobuf_c_message_get_packed_size(m);
    nng_msg *msg;
    int rv = nng_msg_alloc(&msg, len);
    if (rv != 0) return rv;
    protobuf_c_message_pack(m, nng_msg_body(msg));
    *out = msg;
    return 0;
}

int wire_ns_ok(const char *ns)
{
    if (ns == NULL) return 0;
    size_t n = strlen(ns);
    if (n == 0 || n > KVT_NS_MAX) return 0;
    for (size_t i = 0; i < n; i++)
        if (ns[i] <= ' ' || ns[i] > '~') return 0;
    return 1;
}

kvt_err wire_nng_err(int rv)
{
    switch (rv) {
    case 0: return KVT_OK;
    case NNG_ETIMEDOUT: return KVT_ETIMEDOUT;
    case NNG_ECONNREFUSED:
    case NNG_ECLOSED:
    case NNG_ECONNSHUT:
    case NNG_ECONNRESET:
    case NNG_ENOENT: return KVT_ECLOSED;
    case NNG_ENOMEM: return KVT_ENOMEM;
    case NNG_EMSGSIZE: return KVT_ETOOBIG;
    case NNG_EINVAL:
    case NNG_EADDRINVAL: return KVT_EINVAL;
    case NNG_EPROTO: return KVT_EPROTO;
    default: return KVT_EIO;
    }
}
