/*
 * fault.c -- see fault.h. A handful of points, a fixed table, no locks:
 * every point is reached on the core thread (or, at start, before any
 * thread exists).
 */
#include "fault.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const names[FAULT_COUNT] = {
    "nvme_read", "nvme_write", "nvme_grow", "uring_regbuf", "index_put",
    "nvme_hold", "peer_corrupt", "peer_lie", "nng_close_hang", "shutdown_hang",
    "cluster_stall", "conn_close_hang", "peer_ep", "listen_stop",
};

static struct {
    uint64_t nth;  /* 0: never */
    int and_after; /* "N+" */
    uint64_t seen;
} pts[FAULT_COUNT];

static int set_point(const char *name, size_t len, const char *val, char *err,
                     unsigned long errlen)
{
    for (int p = 0; p < FAULT_COUNT; p++) {
        if (strlen(names[p]) != len || strncmp(names[p], name, len) != 0) continue;
        char *end;
        unsigned long long n = strtoull(val, &end, 10);
        if (end == val || n == 0 || (*end && *end != '+' && *end != ',')) break;
        pts[p].nth = n;
        pts[p].and_after = *end == '+';
        return 0;
    }
    snprintf(err, errlen, "KVT_FAULT: bad entry '%.*s' (want NAME=N or NAME=N+; "
             "names: nvme_read, nvme_write, nvme_grow, uring_regbuf, index_put, "
             "nvme_hold, peer_corrupt, peer_lie, nng_close_hang, shutdown_hang, "
             "cluster_stall, conn_close_hang, peer_ep, listen_stop)", (int)len, name);
    return -1;
}

int fault_init(const char *spec, char *err, unsigned long errlen)
{
    memset(pts, 0, sizeof pts);
    if (!spec) spec = getenv("KVT_FAULT");
    for (const char *p = spec; p && *p;) {
        const char *comma = strchr(p, ','), *eq = strchr(p, '=');
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        if (!eq || (comma && eq > comma)) {
            snprintf(err, errlen, "KVT_FAULT: '%.*s' has no '='", (int)len, p);
            return -1;
        }
        if (set_point(p, (size_t)(eq - p), eq + 1, err, errlen) != 0) return -1;
        p = comma ? comma + 1 : p + len;
    }
    return 0;
}

int fault_hit(enum fault_point p)
{
    if (pts[p].nth == 0) return 0;
    uint64_t n = ++pts[p].seen;
    return n == pts[p].nth || (pts[p].and_after && n > pts[p].nth);
}
