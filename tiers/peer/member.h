/*
 * member.h -- cluster membership behind one interface, pluggable backends.
 *
 * Design: a struct mb holds what every backend shares -- the member table
 * (one allocation per member, found by id through a hash table that grows;
 * no cap), the change callback, the view epoch and the counters -- and a
 * backend (struct mb_ops: the embedded SWIM protocol in swim.c, or a
 * service such as etcd) decides who is alive. The backend changes the
 * table only through the mb_* "backend side" calls below, which fire the
 * change callback and keep the counters, so every backend reports the same
 * events the same way.
 *
 * Nothing here knows the daemon: no kvtierd.h, no nng, no UCX. Time,
 * randomness and the network come in through struct mb_env, so the same
 * code runs in kvtierd and in the deterministic simulator (tests/sim/).
 *
 * Threading: an mb is used by one thread (the daemon's core thread, or the
 * simulator). The caller receives bytes wherever it likes, stamps them with
 * the time they ARRIVED, queues them (bounded) and hands them to
 * mb_receive() on the owning thread: a busy owner then does not turn into
 * false deaths, because replies are judged by when they arrived.
 *
 * Ownership: mb_create() copies the config (strings and metadata too). A
 * struct mb_member pointer stays valid until its MB_EV_GONE callback
 * returns (reaped after cluster-wide death or leave) or mb_destroy(). The
 * `user` field is the caller's: the backend never reads it; the caller
 * frees what hangs there on MB_EV_GONE.
 */
#ifndef KVT_MEMBER_H
#define KVT_MEMBER_H

#include <stddef.h>
#include <stdint.h>

#define MB_ADDR_MAX 128     /* addresses, NUL included */
#define MB_META_MAX 1024    /* per-member metadata bytes (UCX worker address...) */

struct mb;

enum mb_state {
    MB_ALIVE = 0,
    MB_SUSPECT = 1,
    MB_DEAD = 2,
    MB_LEFT = 3,
    MB_NSTATES = 4
};

enum mb_event {
    MB_EV_JOIN = 0,   /* first heard of (or back after being reaped) */
    MB_EV_SUSPECT,    /* alive -> suspect */
    MB_EV_ALIVE,      /* suspect -> alive (refuted), or dead/left -> alive
                         with a newer incarnation (a restart) */
    MB_EV_DEAD,       /* alive or suspect -> dead */
    MB_EV_LEFT,       /* said goodbye (mb_leave on that node) */
    MB_EV_UPDATE,     /* same state, new address or metadata */
    MB_EV_GONE,       /* about to be freed: drop every reference to it */
    MB_NEVENTS
};

/* Message kinds for the counters; backends map theirs onto these. */
enum mb_msg {
    MB_MSG_PING = 0,
    MB_MSG_PING_REQ,
    MB_MSG_ACK,
    MB_MSG_NACK,
    MB_MSG_SYNC,      /* push-pull full state exchange (both directions) */
    MB_MSG_GOSSIP,    /* gossip sent on its own, not piggybacked */
    MB_MSG_LEAVE,
    MB_MSG_SERVICE,   /* requests to a membership service (etcd) */
    MB_NMSGS
};

/* Read-only to everyone but member.c (and `user`, which is the caller's). */
struct mb_member {
    uint32_t id;                 /* never 0 */
    enum mb_state state;
    uint64_t inc;                /* incarnation: only its owner raises it */
    uint64_t since_ms;           /* when state last changed (env clock) */
    char *addr;                  /* where the transport reaches it (shorter
                                    than MB_ADDR_MAX; moves on MB_EV_UPDATE) */
    uint8_t *meta;               /* meta_len opaque bytes (NULL when 0; moves
                                    on MB_EV_UPDATE) */
    uint32_t meta_len;
    void *user;                  /* the caller's; see Ownership above */
    void *be;                    /* the backend's: it frees it before
                                    mb_remove() and in its close() */
};

/* The world outside. send() delivers len bytes to addr, best effort,
 * without blocking (dropping is fine: the protocol copes with loss);
 * 0 or -1. now_ms() is a monotonic clock; rand() 64 random bits. */
struct mb_env {
    void *ctx;
    int (*send)(void *ctx, const char *addr, const void *buf, size_t len);
    uint64_t (*now_ms)(void *ctx);
    uint64_t (*rand)(void *ctx);
};

/* Called synchronously from inside mb_* calls that change the table. It
 * may read (mb_find, mb_at, mb_epoch...) but must not call mb_tick,
 * mb_receive, mb_join, mb_leave, mb_set_meta or mb_destroy. `old` is the
 * state before (equal to m->state for JOIN/UPDATE/GONE). */
typedef void (*mb_change_fn)(void *arg, struct mb *mb, struct mb_member *m,
                             enum mb_event ev, enum mb_state old);

/* Zero means "the default" for every number (see mb_config_defaults). */
struct mb_config {
    uint32_t self_id;            /* != 0 */
    const char *self_addr;       /* < MB_ADDR_MAX */
    const void *meta;            /* this node's metadata, copied */
    size_t meta_len;             /* <= MB_META_MAX */
    uint64_t inc;                /* starting incarnation (0: env clock) */

    uint32_t probe_ms;           /* protocol period: one probe each (700) */
    uint32_t probe_timeout_ms;   /* direct ack wait before ping-req (350) */
    uint32_t indirect_k;         /* members asked to probe for us (3) */
    uint32_t suspicion_mult;     /* suspicion timeout = mult * log10(n+1) *
                                    probe_ms at full confirmation (2) */
    uint32_t suspicion_max_mult; /* ... and max_mult times that with none (6) */
    uint32_t retransmit_mult;    /* gossip sent mult * log10(n+1) times (4) */
    uint32_t max_msg_bytes;      /* one datagram, piggyback included (1400) */
    uint32_t awareness_max;      /* local health multiplier cap (8) */
    uint32_t gossip_ms;          /* extra gossip rounds (200; UINT32_MAX off) */
    uint32_t gossip_nodes;       /* members per gossip round (3) */
    uint32_t sync_ms;            /* push-pull with one random member (30000) */
    uint32_t reap_ms;            /* dead/left kept this long, then GONE (60000) */

    /* Backends that use a service (ignored by swim). Valid only during
     * mb_create(): such a backend copies them in open(); NULL after. */
    const char *service_url;     /* e.g. "http://127.0.0.1:2379" */
    const char *service_prefix;  /* key prefix, e.g. "/kvtier/members/" */
    uint32_t lease_ms;           /* registration lease (10000) */

    mb_change_fn on_change;
    void *on_change_arg;
    struct mb_env env;
};

/* Fill the zero numbers of cfg with the defaults above. */
void mb_config_defaults(struct mb_config *cfg);

/* Counters for Prometheus; read with mb_stats(). Monotonic unless noted. */
struct mb_stats {
    uint64_t members[MB_NSTATES];   /* gauge: members by state, self excluded */
    uint64_t events[MB_NEVENTS];    /* change callbacks fired, by event */
    uint64_t suspicions;            /* times this node suspected a member */
    uint64_t refutations;           /* this node refuted a suspicion or death
                                       of itself (incarnation bump) */
    uint64_t false_deaths;          /* a member this node held dead came back
                                       with a newer incarnation */
    uint64_t msgs_tx[MB_NMSGS], bytes_tx[MB_NMSGS];
    uint64_t msgs_rx[MB_NMSGS], bytes_rx[MB_NMSGS];
    uint64_t rx_bad;                /* undecodable or malformed messages */
    uint64_t tx_fail;               /* env.send() refused */
    uint64_t probes, probes_failed; /* direct probes; those needing ping-req
                                       that still got no ack */
    uint64_t health;                /* gauge: local health score (0 = good) */
};

/* ---------------------------------------------------- the backend vtable */

struct mb_ops {
    const char *name;
    /* Set up backend state (mb_set_backend); 0 or -1. */
    int (*open)(struct mb *mb);
    /* Free backend state; no callbacks may fire. Accepts a failed open. */
    void (*close)(struct mb *mb);
    /* Contact the seed addresses (not this node's own). 0 or -1. */
    int (*join)(struct mb *mb, const char *const *seeds, size_t n, uint64_t now_ms);
    /* Timers: call at least every next_tick() (or every ~10 ms). */
    void (*tick)(struct mb *mb, uint64_t now_ms);
    /* One message from the transport, rx_ms = when it arrived. */
    void (*receive)(struct mb *mb, const void *buf, size_t len, uint64_t rx_ms);
    /* Say goodbye; afterwards tick/receive do nothing. 0 or -1. */
    int (*leave)(struct mb *mb, uint64_t now_ms);
    /* This node's metadata changed (already in mb_self): spread it. */
    void (*meta_changed)(struct mb *mb, uint64_t now_ms);
    /* The next time tick has work (absolute ms); NULL: poll. */
    uint64_t (*next_tick)(struct mb *mb);
    /* The caller talks to a node at addr that this table does not hold
     * (its own hello with it is done): ask it for its claim. NULL: the
     * backend learns members otherwise (etcd). */
    void (*ask)(struct mb *mb, const char *addr);
};

/* ---------------------------------------------------------- caller side */

/* NULL on a bad config (a reason in *why when why != NULL) or failed open.
 * Self is in the table (mb_self) but not counted in members[]. */
struct mb *mb_create(const struct mb_ops *ops, const struct mb_config *cfg,
                     const char **why);
/* Frees every member (MB_EV_GONE fired for each) and the backend. NULL ok. */
void mb_destroy(struct mb *mb);

int mb_join(struct mb *mb, const char *const *seeds, size_t n);
/* Ask the node at addr, which this table does not hold, for its claim
 * (ops->ask); nothing after a leave or without the op. */
void mb_ask(struct mb *mb, const char *addr);
void mb_tick(struct mb *mb, uint64_t now_ms);
void mb_receive(struct mb *mb, const void *buf, size_t len, uint64_t rx_ms);
int mb_leave(struct mb *mb);
uint64_t mb_next_tick(struct mb *mb);
/* Replace this node's metadata and spread it. 0, or -1 if too long. */
int mb_set_meta(struct mb *mb, const void *meta, size_t len);

/* Lookup by id (self included); NULL if unknown. O(1). */
struct mb_member *mb_find(const struct mb *mb, uint32_t id);
struct mb_member *mb_self(const struct mb *mb);
/* Iteration over the other members in any state, i in [0, mb_count).
 * The order changes when a member is added or freed. */
size_t mb_count(const struct mb *mb);
struct mb_member *mb_at(const struct mb *mb, size_t i);
/* Members ALIVE or SUSPECT, self excluded (a suspect still owns keys). */
size_t mb_live(const struct mb *mb);
/* The view number: raised on every change of the table's states (swim), or
 * the service's revision (etcd). Comparable only on one node for swim. */
uint64_t mb_epoch(const struct mb *mb);
const struct mb_stats *mb_stats(const struct mb *mb);
const char *mb_state_name(enum mb_state s);
const char *mb_event_name(enum mb_event e);
const char *mb_msg_name(enum mb_msg t);
const char *mb_backend_name(const struct mb *mb);

/* --------------------------------------------------------- backend side */

const struct mb_config *mb_cfg(const struct mb *mb); /* defaults filled */
void *mb_backend(const struct mb *mb);
void mb_set_backend(struct mb *mb, void *be);
uint64_t mb_now(const struct mb *mb);   /* env.now_ms */
uint64_t mb_rand(const struct mb *mb);  /* env.rand */
/* env.send, counted as type t; 0 or -1 (counted in tx_fail). */
int mb_send(struct mb *mb, const char *addr, const void *buf, size_t len, enum mb_msg t);
/* Count a received message of type t (or a bad one: mb_count_bad). */
void mb_count_rx(struct mb *mb, enum mb_msg t, size_t len);
void mb_count_bad(struct mb *mb);
struct mb_stats *mb_stats_mut(struct mb *mb);

/* Add a member (MB_EV_JOIN, or nothing for DEAD/LEFT: known but never
 * seen). NULL if id is 0, self, already present, or addr/meta too long. */
struct mb_member *mb_add(struct mb *mb, uint32_t id, const char *addr,
                         const void *meta, size_t meta_len, uint64_t inc,
                         enum mb_state st);
/* Move m to st at incarnation inc, firing the matching event: ALIVE from
 * DEAD/LEFT fires MB_EV_ALIVE and counts a false death if it was DEAD. No
 * event when neither changes. */
void mb_set_state(struct mb *mb, struct mb_member *m, enum mb_state st, uint64_t inc);
/* New address and/or metadata (MB_EV_UPDATE if anything changed). -1 if
 * too long. */
int mb_update(struct mb *mb, struct mb_member *m, const char *addr,
              const void *meta, size_t meta_len);
/* Free m (MB_EV_GONE first). m is invalid afterwards. */
void mb_remove(struct mb *mb, struct mb_member *m);
/* A service backend sets the epoch (its revision); swim never calls it. */
void mb_set_epoch(struct mb *mb, uint64_t epoch);

#endif
