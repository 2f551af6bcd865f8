/*
 * cluster_int.h -- what cluster.c (membership) and gidx.c (the global
 * index) share. Core thread only, like everything in struct cluster but
 * its receive queue (q_mtx).
 */
#ifndef KVT_CLUSTER_INT_H
#define KVT_CLUSTER_INT_H

#include <nng/nng.h>
#include <pthread.h>
#include <stdint.h>

#include "cluster.h"
#include "kvtier.h"
#include "member.h"
#include "tier.h"
#include "kvtier.pb-c.h"

#define CL_ADDR_MAX 128
#define CL_MAX_MSG (1u << 20)
#define CL_CLOSE_MS 2000u /* bound on closing the cluster's sockets */
#define CL_TOK 16 /* bytes of a member's proof secret (auth_chal) */
#define CL_LINGER_MS 1000u /* an evicted push socket drains this long, then closes */
#define CL_CLOSE_ONE_MS 200u /* bound on closing sockets on the core thread */

struct member {
    uint32_t id;             /* 0: a seed not heard from yet */
    char addr[CL_ADDR_MAX];
    uint64_t inc;
    int state;               /* KVTIER__PEER_STATE__PEER_* */
    nng_socket push;
    int open;
    uint64_t last_heard_ms;
    uint64_t rtt_us, bytes_in, bytes_out;
    uint64_t echo_ns, echo_rx_ns; /* its last sent_ns, when we heard it */
    uint32_t joins;
    /* Its UCX identity, from its hello (learn_ucx): worker address then
     * packed rkey in one malloc'd block, and its pool's base address;
     * NULL until heard, dropped when it restarts or goes down. */
    uint8_t *ucx_id;
    size_t ucx_alen, ucx_rlen;
    uint64_t ucx_base;
    /* UCX endpoint to it, made on the first fetch from it (pget.c,
     * pg_conn) and on cluster.eps while open, or NULL. */
    struct peer_conn *conn;
    int ucx_acked;           /* it has our UCX identity */
    int ucx_warned;          /* said once that no endpoint could be made */
    /* Identity over TLS (cluster.c, "Identity"): chal is our secret for
     * it, sent only over a dial that requires its node name (named);
     * proof is its secret for us, echoed in what we send it. proven: it
     * has echoed chal since it entered the table. */
    uint8_t chal[CL_TOK], proof[CL_TOK];
    int named, have_proof, proven;
    uint64_t last_unproven_ms; /* when an unproven Join from it was answered */
    uint64_t alive_ms;       /* when it was last marked alive */
    uint64_t gx_holds;       /* gidx.c: entries naming it a holder */
    uint64_t pins_held;      /* pget.c: its PeerPins held here */
    struct mb_member *mbm;   /* the membership's record of it, or NULL */
    int gone;                /* reaped: removed from the table at the next tick */
    uint32_t slot;           /* its index in cluster.m */
    /* push is open (open): on cluster.lru (in use) or cluster.linger
     * (evicted, draining until linger_ms), per on_list, through
     * lk[CL_LK_PUSH]; conn is open: on cluster.eps through lk[CL_LK_EP]. */
    int on_list;             /* 0: neither, 1: lru, 2: linger */
    uint64_t linger_ms;
    struct mlink {
        struct member *prev, *next;
    } lk[2];
    struct member *id_next, *addr_next; /* cluster.c's hash chains */
};

/* A list of members with an open connection (cluster.c: push sockets;
 * pget.c: UCX endpoints), linked through member.lk[k] for one k. */
enum { CL_LK_PUSH = 0, CL_LK_EP = 1 };
struct mlist {
    struct member *head, *tail;
    uint32_t n;
};

struct qmsg {
    nng_msg *m;
    uint64_t rx_ms;        /* when it arrived (recv_cb, nng's thread) */
    struct qmsg *next;
};

struct gidx;

/* The listener and its watch (lwatch.c). */
struct lwatch {
    nng_listener l;
    int l_open;
    nng_socket probe;           /* dials our own address while probing */
    int probe_open;
    uint64_t probe_added;       /* pipes taken when the probe began */
    uint64_t probe_until_ms;
    uint64_t next_ms;           /* when the next probe starts */
    uint64_t probes, restarts;
};

struct cluster {
    struct tier obj;       /* first: the peer tier behind tier.h */
    struct cl_ctx *d;
    nng_socket pull;
    int pull_open;
    nng_aio *aio;
    int efd;
    pthread_mutex_t q_mtx; /* guards q_head, q_tail, q_len, q_drops */
    struct qmsg *q_head, *q_tail;
    uint64_t q_len, q_drops;
    uint64_t q_max;        /* cluster.rx_queue_max: past it recv_cb drops
                              and counts (membership copes with loss; an
                              index batch or pin lost there is lost) */
    int ep, tfd;           /* cluster_fd: an epoll set of efd and tfd (mb timer) */
    struct mb *mb;         /* membership (member.h): swim or etcd */
    uint64_t mb_due, refutations;
    uint32_t seeded;       /* members taken as seeds (know_first), at most 8 */
    volatile int closing;
    /* The member table: n members, each allocated alone, so a pointer to
     * one stays valid until compact() frees it (reaped, at a tick); m is
     * only an index of them (grows, no cap), and by_id / by_addr chain
     * them by id and by address (nb buckets, a power of two, >= n). */
    struct member **m;
    uint32_t n, cap;
    struct member **by_id, **by_addr;
    uint32_t nb;
    /* Push sockets are dialled on first send; past cluster.max_conns in
     * use, the least recently used is evicted: it drains for
     * CL_LINGER_MS (what it holds may still go out; a send to it takes it
     * back), then closes at a tick. */
    struct mlist lru, linger;  /* lru: most recent first; linger: oldest first */
    uint64_t lru_closes;       /* sockets evicted */
    /* UCX endpoints (pget.c): made on a member's first fetch, most
     * recently used first; past cluster.max_peer_eps the least recently
     * used with no fetch in flight is closed. */
    struct mlist eps;
    uint64_t eps_opened, eps_evicted;
    uint32_t self_id;
    char self_addr[CL_ADDR_MAX];
    uint64_t inc, epoch, rejected, last_hb_ms, last_reject_log_ms;
    int tls;                /* 0: cluster.insecure (plain tcp, claims trusted) */
    const char *scheme;     /* "tls+tcp://" or "tcp://" */
    uint64_t unproven;      /* messages refused: the claimed id was not proven */
    struct gidx *gx;       /* gidx.c */
    struct peer_tier *pt;  /* UCX (tiers/peer/peer.c), or NULL */
    struct pgs *pg;        /* pget.c */
    struct lwatch lw;      /* lwatch.c */
};


static inline uint64_t cl_clock(const struct cl_ctx *d)
{
    return d->host->clock_ms(d->host->core);
}

/* cluster.c */
struct member *cl_find(struct cluster *c, uint32_t id);
/* Our TLS config (cluster.tls_*) set on a listener (server side), or on
 * a dialer that requires node peer's name in the certificate that
 * answers (0: any node the CA signed; `what` names it in the log). An
 * nng error, NNG_EINVAL when the config cannot be built. */
int cl_tls_listener(struct cl_ctx *d, nng_listener l);
int cl_tls_dialer(struct cl_ctx *d, nng_dialer dl, uint32_t peer, const char *what);
/* Take m off l / put it on l (at the head or the tail), linked through
 * m->lk[k]. */
void cl_ml_unlink(struct mlist *l, int k, struct member *m);
void cl_ml_push(struct mlist *l, int k, struct member *m, int at_head);
/* A new member of the table, zeroed but for id and addr (not dialled):
 * the table owns it; it stays at this address until cl_member_drop. */
struct member *cl_member_new(struct cluster *c, uint32_t id, const char *addr);
/* Take m out of the table and free it (its socket must be closed). */
void cl_member_drop(struct cluster *c, struct member *m);
/* Free every member and the table (sockets closed already). */
void cl_members_free(struct cluster *c);
/* Fill in the sender and send without blocking (dropped if m is not
 * connected). pm stays the caller's. */
int cl_send(struct cl_ctx *d, struct member *m, Kvtier__PeerMsg *pm); /* 0 or -1 */
/* Decode, check and apply one PeerMsg as received (cluster_poll; the
 * peer-message fuzz target calls it without sockets), arrived now. */
void cl_apply(struct cl_ctx *d, const uint8_t *buf, size_t len);
/* Count a refused message; log it at most once a second. */
void cl_reject(struct cluster *c, const Kvtier__PeerMsg *pm, const char *why);
static inline int cl_alive(const struct member *m)
{
    return m && m->state == KVTIER__PEER_STATE__PEER_ALIVE;
}

/* gidx.c */
/* This node now holds (held = 1) or no longer holds the chunk in a READY
 * slot (the tier's committed / removed ops); its owners are told in the
 * next batch. */
void cluster_held(struct cl_ctx *d, uint32_t slot, int held);
/* The tier's lookup: after the local pass filled lr (arena memory), ask
 * the owners of the keys missing here. 1: the request is parked and
 * answered later (lr is then discarded); 0: answer now with lr, updated
 * with what this node could tell alone. */
int cluster_lookup(struct cl_ctx *d, uint32_t pipe, uint64_t req_id,
                   const Kvtier__Lookup *q, Kvtier__LookupResp *lr);
int gx_open(struct cl_ctx *d);
void gx_close(struct cl_ctx *d);
void gx_tick(struct cl_ctx *d);
/* Member id became live (alive = 1) or no longer is: owners move; the
 * owners that entered are told what this node holds. */
void gx_membership(struct cl_ctx *d, uint32_t id, int alive);
/* Member id may have dropped what this node holds (it took this node for
 * dead): tell it again what it owns. */
void gx_republish(struct cl_ctx *d, uint32_t id);
/* This node is leaving: hand each entry it owns to the member that takes
 * its place, and send every batch now. Returns how many entries. */
int gx_leave(struct cl_ctx *d);
struct gx_stats {
    uint64_t entries;        /* index entries held here as an owner */
    uint64_t moved;          /* entries sent because their owners changed */
    uint64_t handed;         /* of which handed over by gx_leave */
    uint64_t query_timeouts; /* owner queries unanswered by the deadline */
    uint64_t peer_hits;      /* LOOKUP keys found on other nodes */
    uint32_t batches;        /* per-owner batches waiting */
    uint32_t pass;           /* 1: a membership pass is due or under way */
    uint32_t log;            /* changes not yet applied to every slot */
    uint32_t sweep;          /* 1: an owner-side sweep is due or under way */
};
void gx_stats(struct cl_ctx *d, struct gx_stats *st);
/* Why an index message from member m is malformed, or NULL. Checked
 * before the message counts for anything (liveness included). */
const char *gx_check(struct cl_ctx *d, const struct member *m, const Kvtier__PeerMsg *pm);
/* Daemon-to-daemon messages of the index, from member m (checked). */
void gx_on_index(struct cl_ctx *d, struct member *m, const Kvtier__PeerMsg *pm);
void gx_on_who_has(struct cl_ctx *d, struct member *m, const Kvtier__PeerMsg *pm);
void gx_on_holders(struct cl_ctx *d, struct member *m, const Kvtier__PeerMsg *pm);
void gx_fill_peers(struct cl_ctx *d, Kvtier__PeersResp *pr);
uint64_t gx_ns_hash(const char *ns);
/* What the owners recorded of a chunk: its committer's checksum and size;
 * from gx_resolve, also the further live holders of it (besides the one
 * named), for a requester to try when a holder's bytes fail the checksum. */
#define GX_ALT_MAX 3
struct gx_sum {
    uint64_t csum, size;
    uint32_t alt[GX_ALT_MAX];
    uint32_t n_alt;
};
/* Find a live holder other than this node for each of keys[0..n) (all in
 * one namespace): done(d, arg, holders, sums, n) is called exactly once,
 * with holders[i] a member id or 0 and sums[i] what the owner that named
 * it recorded (and the other live holders it knows), within cluster.lookup_timeout_ms, maybe before gx_resolve
 * returns. keys must stay valid until then. */
typedef void (*gx_done_fn)(struct cl_ctx *d, void *arg, const uint32_t *holders,
                           const struct gx_sum *sums, uint32_t n);
void gx_resolve(struct cl_ctx *d, const kvt_key *keys, uint32_t n, uint64_t nsh,
                gx_done_fn done, void *arg);

/* pget.c */
/* The tier's get: GET after the local pass found slots[0..n): fetch the
 * rest from peers. 1: parked, answered later; 0: answer now. */
int cluster_get(struct cl_ctx *d, uint32_t pipe, uint64_t req_id,
                const Kvtier__Get *q, const uint32_t *slots, size_t n);
int pg_open(struct cl_ctx *d);
void pg_close(struct cl_ctx *d); /* answers parked GETs, closes endpoints */
void pg_free(struct cl_ctx *d);  /* after gx_close */
void pg_tick(struct cl_ctx *d);
void pg_poll(struct cl_ctx *d); /* the peer tier's fd: UCX, checksum results */
void pg_member_down(struct cl_ctx *d, struct member *m);

/* lwatch.c: the listener on cl->pull at self_addr, and its watch. */
int lw_open(struct cl_ctx *d);   /* an nng error, or 0 */
int lw_listen(struct cl_ctx *d); /* a new listener; an nng error, or 0 */
void lw_tick(struct cl_ctx *d);  /* core thread, every cluster tick */
void lw_close(struct cl_ctx *d); /* the probe socket, if one is open */
/* m's UCX identity (learn_ucx): kept for its first fetch; one that
 * differs from what was kept closes the endpoint made from that. */
void pg_member_ucx(struct cl_ctx *d, struct member *m, const Kvtier__PeerMsg *pm);
/* 1 if a fetch from m may be tried: this node has a peer tier, m's UCX
 * identity is known and no endpoint to it has failed since. */
int pg_reachable(const struct cl_ctx *d, const struct member *m);
const char *pg_check(struct cl_ctx *d, const struct member *m, const Kvtier__PeerMsg *pm);
void pg_on_pin(struct cl_ctx *d, struct member *m, const Kvtier__PeerMsg *pm);
void pg_on_pinned(struct cl_ctx *d, struct member *m, const Kvtier__PeerMsg *pm);
void pg_on_unpin(struct cl_ctx *d, struct member *m, const Kvtier__PeerMsg *pm);
void pg_fill_peers(struct cl_ctx *d, Kvtier__PeersResp *pr);

#endif
