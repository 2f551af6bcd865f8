/*
 * kvtier.h -- the public C API of libkvtier.
 *
 * Design: an engine talks to the kvtierd on its node over nng. Control
 * messages are small protobuf envelopes; bulk bytes go through the daemon's
 * shared-memory DRAM pool, which this library maps at connect time. A put is
 * two-phase (kvt_put_begin hands out writable pool space, kvt_put_commit
 * makes it visible); a get hands out read-only pointers into the pool that
 * stay valid until kvt_release. Clients that cannot map the pool (remote
 * tcp:// clients) use the copying calls, which fall back to bytes inline in
 * the message.
 *
 * Conventions:
 *  - Every call returns a kvt_err; KVT_OK is 0. Out-parameters are written
 *    only on KVT_OK unless said otherwise.
 *  - A kvt_client may be shared by threads: calls on one client are
 *    serialised by an internal lock. For parallel requests open one client
 *    per thread.
 *  - Keys are 32-byte chained hashes (see kvt_hash_chain). A namespace names
 *    what makes two KV blobs incompatible (model, dtype, layout, rank,
 *    tenant); the same key in two namespaces names two different chunks.
 */
#ifndef KVTIER_H
#define KVTIER_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KVT_PROTO_VERSION 1
#define KVT_KEY_LEN 32
#define KVT_NS_MAX 255 /* bytes in a namespace name */

typedef enum kvt_err {
    KVT_OK = 0,
    KVT_EINVAL = 1,    /* bad argument or malformed request */
    KVT_ENOMEM = 2,    /* out of control-plane memory */
    KVT_ENOSPC = 3,    /* pool full after eviction had its chance */
    KVT_ENOENT = 4,    /* key, lease or namespace not found */
    KVT_EEXIST = 5,    /* already present */
    KVT_EPERM = 6,     /* lease belongs to another client */
    KVT_ETIMEDOUT = 7, /* deadline passed */
    KVT_ECLOSED = 8,   /* no daemon at that address, or it went away */
    KVT_EPROTO = 9,    /* undecodable message or protocol version mismatch */
    KVT_EIO = 10,      /* I/O error (pool file, device) */
    KVT_EBUSY = 11,    /* resource in use (socket or pool owned elsewhere) */
    KVT_ECORRUPT = 12, /* checksum mismatch */
    KVT_ENOTSUP = 13,  /* not available here (e.g. zero-copy over tcp) */
    KVT_ETOOBIG = 14,  /* request or chunk over a configured limit */
    KVT_EINTERNAL = 15,
    KVT_ERR_COUNT
} kvt_err;

/* A static, never-NULL description of err. */
const char *kvt_strerror(kvt_err err);

typedef struct kvt_key {
    uint8_t b[KVT_KEY_LEN];
} kvt_key;

typedef enum kvt_tier {
    KVT_TIER_NONE = 0,
    KVT_TIER_HBM = 1,
    KVT_TIER_DRAM = 2,
    KVT_TIER_NVME = 3,
    KVT_TIER_PEER = 4,
} kvt_tier;

/* "none", "hbm", "dram", "nvme", "peer". */
const char *kvt_tier_name(kvt_tier t);

/* ---------------------------------------------------------------- keys -- */

typedef enum kvt_scheme {
    KVT_SCHEME_KVT1 = 0,   /* kvtier's own: namespace and salt in the seed */
    KVT_SCHEME_VLLM = 1,   /* vLLM sha256_cbor block hashes */
    KVT_SCHEME_SGLANG = 2, /* SGLang HiCache chained SHA-256 */
} kvt_scheme;

typedef struct kvt_hash_params {
    kvt_scheme scheme;
    size_t chunk_tokens; /* tokens per chunk; only full chunks are hashed */
    /* kvt1: folded into the seed. */
    const char *ns;
    const void *salt;
    size_t salt_len;
    /* kvt1: bytes appended to every chunk's hash input (LoRA id, ...). */
    const void *extra;
    size_t extra_len;
    /* vllm: the PYTHONHASHSEED string the engine runs with (required). */
    const char *seed;
    /* vllm: extra keys of every block, encoded as a CBOR array of text
     * strings; n_extra_strs == 0 encodes CBOR null. */
    const char *const *extra_strs;
    size_t n_extra_strs;
    /* Optional key of the chunk before tokens[0], to continue a chain. */
    const kvt_key *parent;
} kvt_hash_params;

/* Parse a scheme name ("kvt1", "vllm", "sglang"); -1 if unknown. */
int kvt_scheme_parse(const char *name);

/*
 * Hash tokens into one key per full chunk of p->chunk_tokens tokens.
 * Writes min(n_tokens / chunk_tokens, max_keys) keys to out and their count
 * to *n_keys. Pure function; thread-safe.
 */
kvt_err kvt_hash_chain(const kvt_hash_params *p, const uint32_t *tokens,
                       size_t n_tokens, kvt_key *out, size_t max_keys,
                       size_t *n_keys);

/* Hex helpers: out must hold 2*KVT_KEY_LEN+1 bytes. */
void kvt_key_to_hex(const kvt_key *k, char *out);
kvt_err kvt_key_from_hex(const char *hex, kvt_key *k);

/* XXH3-64 of data, the checksum PUT_COMMIT records. */
uint64_t kvt_checksum(const void *data, size_t n);
/* Copy n bytes from src to dst and return the XXH3-64 of them, in one pass
 * over cache-sized blocks (cheaper than memcpy followed by kvt_checksum). */
uint64_t kvt_copy_checksum(void *dst, const void *src, size_t n);

/* -------------------------------------------------------------- client -- */

typedef struct kvt_client kvt_client;
typedef uint64_t kvt_lease;

/*
 * Connect to a daemon. url is "ipc:///path", "tls+tcp://host:port",
 * "tcp://host:port" or a plain path (taken as ipc); NULL means
 * $KVTIER_SOCKET, else ./var/kvtierd.sock. A tls+tcp:// client presents
 * the certificate in $KVTIER_TLS_CERT with its key in $KVTIER_TLS_KEY and
 * checks the daemon's against the CA in $KVTIER_TLS_CA (and its name
 * against $KVTIER_TLS_SERVER_NAME when set). A daemon with tenants
 * refuses credentials it does not know: KVT_EPERM.
 * Maps the daemon's DRAM pool when it can (ipc:// only: a tcp:// daemon is
 * taken as remote); without the mapping only copying calls work. On success *out is owned by the caller
 * and freed by kvt_close. A client's leases die with its connection.
 */
kvt_err kvt_connect(const char *url, kvt_client **out);
/* Close, unmap the pool and free. Leases still held are dropped by the
 * daemon. Accepts NULL. Pointers from kvt_get/kvt_put_begin die here. */
void kvt_close(kvt_client *c);
/* Per-request timeout in milliseconds (default 10000). */
void kvt_set_timeout(kvt_client *c, int ms);
/* 1 if the pool is mapped (zero-copy calls available). */
int kvt_zero_copy(const kvt_client *c);
/* Text of the last error the daemon sent on this client (never NULL). */
const char *kvt_last_error(const kvt_client *c);

/*
 * How many leading keys of keys[0..n) are present in namespace ns.
 * tiers, if not NULL, receives n entries: the tier of each key or
 * KVT_TIER_NONE. Changes nothing but recency.
 */
kvt_err kvt_lookup(kvt_client *c, const char *ns, const kvt_key *keys,
                   size_t n, size_t *n_present, kvt_tier *tiers);

/* One chunk of a lease. */
typedef struct kvt_chunk {
    void *data;        /* pool address; NULL for an existing key in a put */
    size_t size;       /* bytes */
    uint64_t checksum; /* recorded XXH3-64 (get only) */
    int exists;        /* put: key already cached, nothing to write */
} kvt_chunk;

/*
 * Phase one of a zero-copy put: reserve pool space for n chunks. parent, if
 * not NULL, is the key of the chunk that precedes keys[0] (so eviction knows
 * the prefix); keys[i-1] is taken as the parent of keys[i]. chunks[i].data
 * is writable until commit or abort; keys already cached come back with
 * exists = 1 and data = NULL. Needs the pool mapped (KVT_ENOTSUP otherwise,
 * and also when ns lives in a pool this client does not map, a tenant's
 * own: kvt_put then copies). An uncommitted lease expires after the daemon's lease timeout.
 */
kvt_err kvt_put_begin(kvt_client *c, const char *ns, const kvt_key *keys,
                      const size_t *sizes, size_t n, const kvt_key *parent,
                      kvt_lease *lease, kvt_chunk *chunks);
/* Make the chunks of a put visible. chunks and n are what kvt_put_begin
 * returned. checksums holds one XXH3-64 per chunk (entries for existing keys
 * are ignored), or is NULL to have the library compute them from the pool
 * bytes (kvt_copy_checksum while writing is cheaper). The lease is gone
 * afterwards, whatever the result. */
kvt_err kvt_put_commit(kvt_client *c, kvt_lease lease, const kvt_chunk *chunks,
                       size_t n, const uint64_t *checksums);
/* Drop an uncommitted put; its space is freed and nothing becomes visible. */
kvt_err kvt_put_abort(kvt_client *c, kvt_lease lease);

/*
 * Copying put of n chunks: through the pool when mapped, else inline in the
 * message. *n_new (may be NULL) receives how many chunks were new.
 */
kvt_err kvt_put(kvt_client *c, const char *ns, const kvt_key *keys,
                const void *const *bufs, const size_t *sizes, size_t n,
                const kvt_key *parent, size_t *n_new);

/*
 * Pin the leading present chunks of keys[0..n) and return read-only
 * pointers to them in chunks[0..*n_got). The pointers stay valid until
 * kvt_release(lease) or kvt_close. *n_got may be 0 (lease is then 0 and
 * needs no release). Needs the pool mapped, and ns in the pool this client
 * maps (KVT_ENOTSUP otherwise; kvt_get_copy then copies).
 */
kvt_err kvt_get(kvt_client *c, const char *ns, const kvt_key *keys, size_t n,
                kvt_lease *lease, kvt_chunk *chunks, size_t *n_got);
/* Unpin a get lease. */
kvt_err kvt_release(kvt_client *c, kvt_lease lease);

/*
 * Copy one chunk into buf (cap bytes). *size receives its size; if cap is
 * too small, KVT_ETOOBIG and *size tells how much is needed. KVT_ENOENT if
 * absent. Works with or without the pool mapped.
 */
kvt_err kvt_get_copy(kvt_client *c, const char *ns, const kvt_key *key,
                     void *buf, size_t cap, size_t *size);

/* Delete keys; leased chunks are dropped once released. */
kvt_err kvt_delete(kvt_client *c, const char *ns, const kvt_key *keys,
                   size_t n, size_t *n_deleted);
/* Delete every chunk of a namespace. */
kvt_err kvt_clear(kvt_client *c, const char *ns, uint64_t *n_deleted);
/* Evict unpinned chunks until at least bytes are free (0: to the low
 * watermark). *freed receives the bytes freed. */
kvt_err kvt_evict(kvt_client *c, uint64_t bytes, uint64_t *freed);

typedef struct kvt_stats {
    uint64_t pool_bytes;     /* capacity of the DRAM pool */
    uint64_t used_bytes;     /* allocated, committed or not */
    uint64_t chunks;         /* committed chunks */
    uint64_t namespaces;
    uint64_t leases;         /* open read and write leases */
    uint64_t clients;        /* connected pipes */
    uint64_t hits, misses;   /* chunk-weighted, LOOKUP and GET */
    uint64_t puts, evictions;
    uint64_t bytes_in, bytes_out;
    double fragmentation;    /* 1 - largest free block / total free */
    uint64_t index_bytes;    /* memory of the index */
    uint64_t uptime_ms;
} kvt_stats;

kvt_err kvt_stats_get(kvt_client *c, kvt_stats *out);

/* ------------------------------------------------- KV-cache transfers -- */

/*
 * An engine registers its paged KV cache with the daemon once, then only
 * names blocks and keys: kvt_kv_save has the daemon gather blocks into
 * chunks in its pool and commit them; kvt_kv_load has it scatter cached
 * chunks into blocks. Both return at once with a transfer id while the
 * daemon's worker threads copy; kvt_kv_poll and kvt_kv_wait collect the
 * result, so an engine step never waits on kvtier unless it asks to.
 *
 * The cache is described by a kvt_layout_params: kind, shape, element
 * size, and one address per tensor. Chunk i of a transfer covers blocks
 * block_ids[i * bpc .. (i + 1) * bpc), bpc = chunk_tokens / block_size,
 * and is stored in kvtier's canonical order, so a chunk saved through one
 * layout loads through any other of the same shape (layers, K/V, heads,
 * head size, element size) and chunk_tokens.
 *
 * Contract:
 *  - A registration belongs to the connection that made it and ends with
 *    kvt_kv_unregister or the connection (kvt_close, or the process
 *    dying). The daemon keeps the engine's memory mapped until its last
 *    transfer has finished, so the engine may free its tensors once
 *    unregistered and every transfer collected.
 *  - kvt_kv_save skips keys already cached. Until the transfer is done
 *    its chunks are invisible; the engine must not overwrite the named
 *    blocks before then.
 *  - kvt_kv_load is all or nothing: every key must be cached when the
 *    request arrives (KVT_ENOENT otherwise), block ids must be distinct,
 *    and every chunk must have this registration's size (KVT_EINVAL): a
 *    refused request writes nothing. The engine must not read the named
 *    blocks until the transfer is done.
 *  - Done transfers are reported once and then forgotten; a connection
 *    may have at most 1024 transfers not yet reported (KVT_EBUSY). One
 *    poll or wait names at most the daemon's max_keys transfers.
 *  - kvt_kv_wait holds the client's lock while it waits: a thread that
 *    must not block while another waits uses a client of its own.
 */
typedef uint64_t kvt_kv_reg;
typedef uint64_t kvt_xfer;

/* Where K and V of block b live, per engine and attention backend (the
 * exact shapes and strides of each kind: cuda/layout.h in the sources). */
typedef enum kvt_layout_kind {
    KVT_LAYOUT_NONE = 0,
    KVT_LAYOUT_VLLM_FLASH_NHD = 1,
    KVT_LAYOUT_VLLM_FLASH_HND = 2,
    KVT_LAYOUT_FLASHINFER_NHD = 3,
    KVT_LAYOUT_FLASHINFER_HND = 4,
    KVT_LAYOUT_VLLM_CROSS_NHD = 5,
    KVT_LAYOUT_VLLM_CROSS_HND = 6,
    KVT_LAYOUT_SGLANG_MHA = 7,
    KVT_LAYOUT_MLA = 8,
    KVT_LAYOUT_CUSTOM = 9,
    KVT_LAYOUT_KIND_COUNT
} kvt_layout_kind;

/* What the engine knows about its tensors. */
typedef struct kvt_layout_params {
    kvt_layout_kind kind;
    uint32_t num_layers;
    uint32_t num_blocks;   /* per layer; SGLang: token slots / page_size */
    uint32_t block_size;   /* tokens per block (SGLang: page_size) */
    uint32_t num_kv_heads; /* MLA: 1 */
    uint32_t head_size;    /* elements per row; MLA: kv_lora_rank + rope */
    uint32_t elem_size;    /* bytes per element: 1 (fp8), 2 (bf16), 4 */
    const uint64_t *bases; /* tensor addresses, as many as the kind says */
    size_t n_bases;
    /* CUSTOM only: bases[l * num_kv + kv], strides in bytes. */
    uint32_t num_kv;
    uint64_t block_stride, token_stride, head_stride;
} kvt_layout_params;


typedef struct kvt_kv_info {
    uint64_t chunk_bytes;      /* one chunk in the pool */
    uint32_t blocks_per_chunk; /* block ids per key in a transfer */
    char shape[64];            /* "l32.kv2.h8.d128.e2": put it in the ns */
} kvt_kv_info;

/*
 * Register KV tensors that live in a shared-memory file (CPU engines, and
 * tests): the engine has path mapped MAP_SHARED at map_base, and
 * p->bases[i] are the tensors' addresses in that mapping. The file must
 * belong to the calling process's user; the connection must be local.
 * info may be NULL.
 */
kvt_err kvt_kv_register_host(kvt_client *c, const char *ns,
                             const struct kvt_layout_params *p,
                             size_t chunk_tokens, const char *path,
                             const void *map_base, kvt_kv_reg *reg,
                             kvt_kv_info *info);
/*
 * Register KV tensors in GPU memory: ipc_handles holds p->n_bases
 * cudaIpcMemHandle_t (64 bytes each, back to back), tensor i at
 * offsets[i] into the allocation of handle i (p->bases is not read);
 * device is the daemon's ordinal for the GPU. KVT_ENOTSUP where the daemon
 * has no GPU (kvt_kv_stats_get says why).
 */
kvt_err kvt_kv_register_cuda(kvt_client *c, const char *ns,
                             const struct kvt_layout_params *p,
                             size_t chunk_tokens, int device,
                             const void *ipc_handles, const uint64_t *offsets,
                             kvt_kv_reg *reg, kvt_kv_info *info);
kvt_err kvt_kv_unregister(kvt_client *c, kvt_kv_reg reg);

/* Save blocks as keys[0..n_keys): n_block_ids == n_keys *
 * blocks_per_chunk. parent (may be NULL) is the key before keys[0]. */
kvt_err kvt_kv_save(kvt_client *c, const char *ns, kvt_kv_reg reg,
                    const kvt_key *keys, size_t n_keys,
                    const int32_t *block_ids, size_t n_block_ids,
                    const kvt_key *parent, kvt_xfer *xfer);
/* Load keys[0..n_keys) into blocks; all or nothing (see above). */
kvt_err kvt_kv_load(kvt_client *c, const char *ns, kvt_kv_reg reg,
                    const kvt_key *keys, size_t n_keys,
                    const int32_t *block_ids, size_t n_block_ids,
                    kvt_xfer *xfer);

typedef struct kvt_xfer_status {
    kvt_xfer xfer;
    int done;
    kvt_err err;        /* the transfer's result, once done */
    uint32_t n_chunks;  /* chunks it moves */
    uint32_t n_skipped; /* save: keys that were cached already */
    char msg[160];      /* why, when err != KVT_OK */
} kvt_xfer_status;

/* The state of each of xfers[0..n) into st[0..n), without waiting. */
kvt_err kvt_kv_poll(kvt_client *c, const kvt_xfer *xfers, size_t n,
                    kvt_xfer_status *st);
/* Wait until every one is done (KVT_OK: see each st[i].err) or timeout_ms
 * passed (KVT_ETIMEDOUT: st[i].done says which finished); < 0: no limit. */
kvt_err kvt_kv_wait(kvt_client *c, const kvt_xfer *xfers, size_t n,
                    int timeout_ms, kvt_xfer_status *st);

typedef struct kvt_kv_stats {
    uint64_t registrations;  /* live, all clients */
    uint64_t transfers;      /* not yet reported */
    uint64_t saved_chunks, loaded_chunks, failed;
    uint64_t hbm_bytes, hbm_used; /* HBM tier; 0: off */
    uint64_t hbm_loaded_chunks;   /* LOAD chunks read from HBM copies */
    uint64_t hbm_demoted;         /* HBM copies dropped for room */
    char gpu[160];           /* "available: ..." or "unavailable: why" */
} kvt_kv_stats;

kvt_err kvt_kv_stats_get(kvt_client *c, kvt_kv_stats *out);

#ifdef __cplusplus
}
#endif
#endif /* KVTIER_H */
