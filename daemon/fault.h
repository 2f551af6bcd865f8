/*
 * fault.h -- fault injection at the daemon's I/O boundaries (STYLE §11).
 *
 * Design: tests make a boundary fail without root tricks or a broken disk.
 * The environment variable KVT_FAULT names the points and which of their
 * occurrences fail, read once at start (fault_init):
 *
 *     KVT_FAULT="nvme_read=1,nvme_write=3+,nvme_grow=1+,uring_regbuf=1"
 *
 * (and index_put: a record written but never indexed; nvme_hold: a read
 * that completes only when a later I/O does; peer_corrupt: a holder
 * flips a byte of a chunk a peer is about to pull; peer_lie: and reports
 * the checksum of what it flipped; nng_close_hang and shutdown_hang: a
 * stop that never finishes by itself; conn_close_hang: a member's socket
 * that never closes; peer_ep: a UCX endpoint that cannot be made;
 * listen_stop: a cluster listener that accepts no more).
 *
 * "name=N" fails the Nth occurrence only (counting from 1), "name=N+"
 * fails the Nth and every later one. Occurrences are counted per point on
 * the core thread, so a run is deterministic. An unknown name stops the
 * daemon at start (a typo must not silently test nothing). Production
 * runs have KVT_FAULT unset and pay one branch per point.
 */
#ifndef KVT_FAULT_H
#define KVT_FAULT_H

enum fault_point {
    FAULT_NVME_READ,    /* a read completion fails with -EIO */
    FAULT_NVME_WRITE,   /* a write completion fails with -ENOSPC */
    FAULT_NVME_GROW,    /* creating (fallocating) a data file: ENOSPC */
    FAULT_URING_REGBUF, /* registering buffers with io_uring: -ENOMEM */
    FAULT_INDEX_PUT,    /* a written record is not indexed (as if the
                         * daemon died between the two) */
    FAULT_NVME_HOLD,    /* a read completion is held back until another
                         * I/O completes (a slow device) */
    FAULT_PEER_CORRUPT, /* a holder flips a byte of a chunk it pins for a
                         * peer (pget.c): the peer's checksum must catch it */
    FAULT_PEER_LIE,     /* the same, and the holder reports the checksum of
                         * the flipped bytes: only the committer's (from the
                         * index owners) can catch it */
    FAULT_NNG_CLOSE_HANG, /* closing the cluster's sockets never returns
                           * (nng 1.5's close deadlock, common/nngclose.h) */
    FAULT_SHUTDOWN_HANG,  /* the shutdown stops for good after the cluster
                           * is closed: the shutdown watchdog must end it */
    FAULT_CLUSTER_STALL, /* the core thread stalls 1 s before it handles
                          * queued daemon-to-daemon messages (a busy
                          * core): the receive queue fills */
    FAULT_CONN_CLOSE_HANG, /* closing a member's push socket on the core
                            * thread (evicted or superseded) never returns:
                            * the close must stay bounded */
    FAULT_PEER_EP,      /* making a UCX endpoint for a fetch fails (pget.c):
                         * the member's identity is asked for again */
    FAULT_LISTEN_STOP,  /* the cluster's listener stops accepting at a
                         * check of its watch (lwatch.c), as nng 1.5's does
                         * after a peer's failed handshake */
    FAULT_COUNT
};

/* Parse spec (NULL: getenv("KVT_FAULT")). 0, or -1 with a sentence in
 * err. Resets every counter. */
int fault_init(const char *spec, char *err, unsigned long errlen);
/* Count one occurrence of p; 1 if it must fail. */
int fault_hit(enum fault_point p);

#endif
