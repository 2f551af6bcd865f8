/*
 * err.c -- kvt_err texts and tier names.
 *
 * Design: errors are values (STYLE §3). The table is indexed by the enum,
 * so a new code needs a new line here; kvt_strerror never returns NULL,
 * even for a code it does not know (a newer daemon may send one).
 */
#include "kvtier.h"

static const char *const err_text[KVT_ERR_COUNT] = {
    [KVT_OK] = "ok",
    [KVT_EINVAL] = "invalid argument or request",
    [KVT_ENOMEM] = "out of memory",
    [KVT_ENOSPC] = "no space left in the cache",
    [KVT_ENOENT] = "not found",
    [KVT_EEXIST] = "already exists",
    [KVT_EPERM] = "not permitted (owned by another client)",
    [KVT_ETIMEDOUT] = "timed out",
    [KVT_ECLOSED] = "no daemon at that address, or connection closed",
    [KVT_EPROTO] = "protocol error",
    [KVT_EIO] = "input/output error",
    [KVT_EBUSY] = "resource busy",
    [KVT_ECORRUPT] = "checksum mismatch",
    [KVT_ENOTSUP] = "not supported here",
    [KVT_ETOOBIG] = "too big",
    [KVT_EINTERNAL] = "internal error",
};

const char *kvt_strerror(kvt_err err)
{
    if ((unsigned)err >= KVT_ERR_COUNT || err_text[err] == NULL)
        return "unknown error";
    return err_text[err];
}

const char *kvt_tier_name(kvt_tier t)
{
    switch (t) {
    case KVT_TIER_HBM: return "hbm";
    case KVT_TIER_DRAM: return "dram";
    case KVT_TIER_NVME: return "nvme";
    case KVT_TIER_PEER: return "peer";
    default: return "none";
    }
}
