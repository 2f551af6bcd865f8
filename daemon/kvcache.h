/*
 * kvcache.h -- engines' KV-cache registrations and the SAVE/LOAD transfers
 * kvtierd runs for them (DESIGN §3, last part).
 *
 * Design: an engine registers its paged KV tensors once (a layout plus a
 * shared-memory file, or CUDA IPC handles) and then only names blocks and
 * keys. The core thread validates a whole request before anything moves,
 * reserves (SAVE) or pins (LOAD) the pool chunks, and queues one job per
 * request to a small pool of worker threads that do the gather or scatter
 * (kvt_gather_cpu / kvt_gpu_gather); the worker hands the result back
 * through server_post, and the core commits or unpins (DESIGN §6: no bulk
 * copy on the core thread). While a SAVE runs its chunks are PENDING, so
 * invisible; while a LOAD runs its chunks are pinned.
 *
 * Lifetimes, the invariants everything here keeps:
 *  - A registration belongs to one connection (nng pipe) and is counted:
 *    one reference while registered, one per transfer using it. Unregister
 *    or a closed connection takes the first away; the mapping (or the IPC
 *    handles) goes only when the last transfer has finished, so a worker
 *    never touches memory that is gone.
 *  - A transfer's pool chunks are owned by the transfer, not by a lease,
 *    so no lease deadline or disconnect frees space a worker still writes.
 *    A closed connection cancels its queued transfers at once and marks
 *    running ones orphaned: they stop at the next chunk, and the core then
 *    frees (SAVE) or unpins (LOAD) their chunks. An orphaned SAVE never
 *    commits.
 *  - A finished transfer is kept until KvWait reports it once, or until
 *    its connection closes; a connection holds at most KVC_MAX_XFERS.
 *
 * Everything in struct kvc is the core thread's, except the worker queue
 * (guarded by kvc_pool.mtx) and each transfer's cancel flag (atomic).
 *
 * Context: this module and its three helpers (kvxfer.c, kvwait.c,
 * kvhbm.c) never see the daemon. They are built from a struct kvc_env
 * (main.c fills it once): the core's host services (tier_host.h) for the
 * index, the DRAM pool, the completion queue, placement (reserve, commit,
 * free, watermark), the clock and parking -- the same door the tiers use;
 * the namespace table for admission and holds; the configuration, read
 * live so a SIGHUP reaches it; the daemon's bytes-out counter; and two
 * questions about a client connection.
 */
#ifndef KVT_KVCACHE_H
#define KVT_KVCACHE_H

#include <nng/nng.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "gpu.h"
#include "kvtier.pb-c.h"
#include "config.h"
#include "layout.h"
#include "ns.h"
#include "tier.h"
#include "tier_host.h"
#include "workq.h"

#define KVC_MAX_REGS 64        /* registrations per connection */
#define KVC_MAX_XFERS 1024     /* uncollected transfers per connection */
#define KVC_WORKERS 2          /* worker threads */
#define KVC_MAX_DEVICES 16     /* GPU streams per worker */
#define KVC_WAIT_MAX_MS 60000  /* longest a KvWait is parked */
#define KVC_XFER_BUCKETS 1024
#define KVC_HBM_BUCKETS 4096
#define KVC_MSG 160

struct hbm;

enum kvc_mem { KVC_MEM_HOST = 1, KVC_MEM_CUDA = 2 };
enum kvc_kind { KVC_SAVE = 1, KVC_LOAD = 2 };
enum kvc_xstate { KVC_QUEUED = 0, KVC_DONE = 1 }; /* the core's view */

/* A CUDA IPC handle opened once per daemon, shared by registrations. */
struct kvc_ipc {
    uint8_t handle[KVT_CUDA_IPC_HANDLE_LEN];
    int device;
    void *ptr;
    uint32_t refs;
    struct kvc_ipc *next;
};

struct kvc_reg {
    uint64_t id;
    uint32_t pipe;
    uint32_t refs;   /* registered + transfers using it */
    int dead;        /* unregistered or its connection closed */
    int mem;         /* enum kvc_mem */
    int device;      /* CUDA */
    char *ns;
    uint16_t ns_id;  /* held while the record lives (ns.h) */
    kvt_layout lay;  /* immutable once registered: workers read it */
    uint32_t bpc;    /* blocks per chunk */
    uint64_t chunk_bytes;
    void *map;       /* host: the engine's file, mapped */
    size_t map_len;
    struct kvc_ipc *ipc[KVT_LAYOUT_MAX_LAYERS * 2]; /* CUDA: per tensor */
    uint32_t n_ipc;
    struct kvc_reg *next;
};

struct kvc;

/* An HBM copy of a DRAM chunk (kvhbm.c). */
struct kvc_hent {
    uint32_t slot, gen;    /* the DRAM chunk it copies */
    struct tier_loc loc;
    void *dev;             /* its device address */
    uint32_t pins;         /* LOADs reading it */
    uint8_t linked;        /* committed: hashed and on the LRU */
    struct kvc_hent *hnext, *prev, *next;
};

struct kvc_hcache {
    struct kvc_hent *b[KVC_HBM_BUCKETS]; /* by slot */
    struct kvc_hent *head, *tail;        /* LRU, head = most recent */
    uint64_t n;
};

struct kvc_xfer {
    struct kvc *k;
    uint64_t id;
    uint32_t pipe;
    uint8_t kind;     /* enum kvc_kind */
    uint8_t state;    /* enum kvc_xstate */
    uint8_t orphan;   /* its connection closed: discard the result */
    atomic_int cancel; /* core -> worker: stop at the next chunk */
    struct kvc_reg *reg; /* holds a reference */
    uint32_t n;       /* chunks named by the request */
    uint32_t n_move;  /* chunks the worker moves (SAVE: the new ones) */
    uint32_t *slot;   /* [n] index slots; IDX_NONE: SAVE skipped it */
    uint32_t *parent, *pgen; /* [n] SAVE: parent slot and generation */
    void **chunk;     /* [n_move] pool addresses (worker input) */
    int32_t *ids;     /* [n_move * bpc] block ids (worker input) */
    uint64_t *csum;   /* [n_move] SAVE: out; LOAD: expected */
    struct kvc_hent **hent; /* [n_move] HBM copies: SAVE fills, LOAD reads */
    uint8_t hbm_ok;   /* SAVE: the worker filled its copies */
    kvt_err err;      /* worker output, then the transfer's result */
    char msg[KVC_MSG];
    uint64_t stamp;   /* KvWait duplicate check */
    struct kvc_xfer *hnext; /* id hash chain */
    struct wq_job job;      /* on the workers' queue (workq.c) */
};

/* A KvWait parked until its transfers finish or its deadline passes. */
struct kvc_waiter {
    uint32_t pipe;
    struct park *park; /* park.c: the request, its deadline */
    uint64_t *xfers;
    uint32_t n;
    struct kvc_waiter *next;
};

/* One worker thread and what it keeps across jobs. */
struct kvc_wk {
    struct kvc *k;
    kvt_cuda_stream *stream[KVC_MAX_DEVICES]; /* created on first use */
};

struct kvc_pool {
    struct workq *q;               /* KVC_WORKERS threads (workq.c) */
    struct kvc_wk wk[KVC_WORKERS]; /* each worker's own */
};

struct kvc_counters {
    uint64_t saved, loaded, failed;
    uint64_t hbm_loaded;  /* chunks a LOAD read from HBM */
    uint64_t hbm_demoted; /* copies dropped for room (DRAM keeps them) */
};

/* What the GPU data path is built with; every pointer outlives it. */
struct kvc_env {
    const struct tier_host *host; /* index, pool, cq, placement, clock, parks */
    struct ns_table *ns;          /* admission (ns_admit), claims and holds */
    const struct kvt_config *cfg; /* max_keys, max_chunk_bytes,
                                   * ns_per_client, hbm_bytes: read live */
    uint64_t *bytes_out;          /* the daemon's counter: bytes LOADs sent */
    void *core;                   /* handed to the two calls below */
    /* 1 while connection pipe is open. */
    int (*pipe_alive)(void *core, uint32_t pipe);
    /* The uid at the other end of a local connection; -1 for a remote one. */
    int (*peer_uid)(void *core, uint32_t pipe, uint64_t *uid);
};

#define KVC_GPU_STATUS 160

struct kvc {
    struct kvc_env env;
    char gpu_status[KVC_GPU_STATUS]; /* "available: ..." / "unavailable: why" */
    struct kvt_gpu *gpu;  /* NULL: no GPU here */
    struct hbm *hbm;      /* NULL: hbm_bytes = 0 */
    struct kvc_hcache hc; /* what HBM holds (kvhbm.c) */
    int pool_registered;  /* DRAM pool cudaHostRegister'ed */
    struct kvc_reg *regs;
    uint64_t n_regs;      /* live (not dead) */
    struct kvc_ipc *ipcs;
    struct kvc_xfer *xb[KVC_XFER_BUCKETS];
    uint64_t n_xfers;
    uint64_t next_id, stamp;
    struct kvc_waiter *waiters;
    uint32_t n_waiters;
    struct kvc_pool pool;
    struct kvc_counters st;
    unsigned fault_delay_ms; /* KVT_FAULT_KV_DELAY_MS: sleep per chunk */
};

/* ---- main.c: start and stop ------------------------------------------ */

/* Load CUDA if it is here (kvc_gpu_status says how it went), open the HBM
 * tier if hbm_bytes asks for one, start the workers. *out is set even on
 * failure (for kvc_close). -1 (logged) when the daemon must not start:
 * hbm_bytes > 0 without a usable GPU. */
int kvc_open(const struct kvc_env *env, struct kvc **out);
/* Stop the workers, drop every transfer and registration, free k. Core
 * thread, before server_close. Accepts NULL and a k whose kvc_open
 * failed. */
void kvc_close(struct kvc *k);
/* What a client can expect of GPU registrations (HELLO, STATS). */
const char *kvc_gpu_status(const struct kvc *k);
/* Transfers not yet collected and KvWaits parked (the drain waits). */
uint64_t kvc_unfinished(const struct kvc *k);

/* ---- handlers.c -------------------------------------------------------- */

struct req;

void kvc_do_register(struct req *r, struct kvc *k, uint32_t pipe,
                     const Kvtier__RegisterKvCache *q, Kvtier__Response *rsp);
void kvc_do_unregister(struct req *r, struct kvc *k, uint32_t pipe,
                       const Kvtier__UnregisterKvCache *q,
                       Kvtier__Response *rsp);
void kvc_do_transfer(struct req *r, struct kvc *k, uint32_t pipe,
                     const Kvtier__KvTransfer *q, int kind,
                     Kvtier__Response *rsp);
/* Accepts NULL (no GPU data path yet). */
void kvc_pipe_removed(struct kvc *k, uint32_t pipe);
void kvc_fill_stats(const struct kvc *k, Kvtier__StatsResp *s);

/* ---- for kvxfer.c, kvwait.c and kvhbm.c -------------------------------- */

struct kvc_xfer *kvc_xfer_find(struct kvc *k, uint64_t id);
/* Unhash and free a transfer record (its chunks already settled). */
void kvc_xfer_free(struct kvc *k, struct kvc_xfer *x);
void kvc_reg_unref(struct kvc *k, struct kvc_reg *g);
uint64_t kvc_new_id(struct kvc *k);

#endif
