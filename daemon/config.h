/*
 * config.h -- kvtierd's settings: embedded defaults, an INI file, flags.
 *
 * Design: one table describes every key (section, name, type, default,
 * range, unit, whether SIGHUP may change it). The INI parser, the
 * command-line flags (--name or --section.name), the reference printed by
 * --print-config (deploy/kvtierd.conf is that output) and the reload diff
 * all read that table, so a key cannot exist in one place and not another.
 * Unknown keys and out-of-range values are errors that name the line (or
 * the flag); the daemon refuses to start on them, and a reload that meets
 * one keeps every old setting.
 */
#ifndef KVT_CONFIG_H
#define KVT_CONFIG_H

#include <stddef.h>
#include <stdio.h>
#include <stdint.h>

#define CFG_STR_MAX 512

/* [tenants] (tenant.c): who may use which namespaces. No tenant line: one
 * tenant, everything allowed to whoever can reach the socket. */
#define CFG_TENANTS_MAX 16
#define CFG_TENANT_IDS 16
#define CFG_TENANT_PREFIXES 8

struct kvt_tenant {
    char name[64];
    char spec[CFG_STR_MAX];     /* the line as written (print, diff) */
    uint32_t uids[CFG_TENANT_IDS], gids[CFG_TENANT_IDS];
    uint32_t n_uids, n_gids;
    char prefixes[CFG_TENANT_PREFIXES][64]; /* namespace name prefixes */
    uint32_t n_prefixes;
    char tls[128];              /* tls+tcp:// listener of its remote clients */
    char ca[CFG_STR_MAX];       /* CA that signs its client certificates */
    uint64_t pool_bytes;        /* >0: its own DRAM pool of this size */
};

struct kvt_tenants {
    struct kvt_tenant v[CFG_TENANTS_MAX];
    uint32_t n;
};

struct kvt_config {
    /* [daemon] */
    char socket[CFG_STR_MAX];     /* nng url clients dial (ipc://...) */
    char tcp[CFG_STR_MAX];        /* optional second listener (tcp://...) */
    char state_dir[CFG_STR_MAX];  /* lock files and state */
    char log_level[16];
    uint64_t contexts;            /* concurrent nng contexts */
    uint64_t lease_timeout_ms;    /* write and read lease deadline */
    uint64_t max_keys;            /* keys per request */
    uint64_t ns_per_client;       /* namespaces one connection may hold */
    uint64_t max_msg_bytes;       /* largest request accepted */
    uint64_t drain_timeout_ms;    /* SIGTERM: wait this long for leases */
    uint64_t shutdown_timeout_ms; /* then the stop ends within this (stopguard.c) */
    uint64_t local_fast;          /* serve the local fast channel */
    uint64_t local_max_conns;     /* fast-channel connections at most */
    uint64_t park_per_client;     /* parked requests one connection may hold */
    uint64_t socket_mode;         /* octal mode of the sockets; 0: pool_mode */
    char tls_cert[CFG_STR_MAX];   /* PEM certificate of the tls+tcp listeners */
    char tls_key[CFG_STR_MAX];    /* ... and its private key */
    char tls_ca[CFG_STR_MAX];     /* CA of daemon.tcp's client certificates */
    uint64_t tcp_insecure;        /* 1: daemon.tcp may be plain tcp:// */
    /* [tenants] */
    struct kvt_tenants tenants;
    char admin_group[64];         /* group whose members are operators */
    /* [dram] */
    char pool_path[CFG_STR_MAX];  /* shared-memory file; empty: derived */
    uint64_t pool_bytes;
    uint64_t max_chunk_bytes;
    double high_watermark;        /* fraction of pool_bytes */
    double low_watermark;
    uint64_t pool_mode;           /* octal file mode */
    char pool_group[64];          /* group that may map the pool */
    char pool_kind[16];           /* dram.pool: file, memfd or auto */
    /* [hbm] */
    uint64_t hbm_bytes;           /* GPU pool of the HBM tier; 0: off */
    /* [nvme] and DRAM adoption (nvstore.c, journal.c) */
    uint64_t dram_adopt;          /* keep the pool file and adopt it at start */
    uint64_t plain_lru;           /* eviction ignores the prefix tree */
    char nvme_dirs[CFG_STR_MAX];  /* comma list; empty: <state_dir>/nvme */
    uint64_t nvme_bytes;          /* per directory; 0: no NVMe tier */
    uint64_t nvme_file_bytes;     /* size of each preallocated data file */
    uint64_t nvme_queue_depth;    /* io_uring entries */
    uint64_t nvme_register_buffers; /* try fixed buffers over the pool */
    uint64_t nvme_write_through;  /* 1: every commit is also written */
    double nvme_high_watermark, nvme_low_watermark;
    char nvme_index_path[CFG_STR_MAX]; /* RocksDB; empty: <state_dir>/nvme-index */
    uint64_t nvme_fsync;          /* fdatasync data before indexing it */
    uint64_t nvme_get_deadline_ms; /* GET waits this long for NVMe reads */
    /* [metrics] */
    char metrics_listen[CFG_STR_MAX]; /* host:port of /metrics; "" = off */
    uint64_t metrics_ns_names;    /* 1: ns label is the name; 0: a hash */
    /* [cluster] (cluster.c); off while listen is empty */
    uint64_t cluster_node_id;     /* this node's id, unique in the cluster */
    char cluster_listen[CFG_STR_MAX]; /* tcp://host:port of the control channel */
    char cluster_seeds[CFG_STR_MAX];  /* comma list of members' listen urls */
    char cluster_tls_cert[CFG_STR_MAX]; /* PEM files of the control channel's TLS */
    char cluster_tls_key[CFG_STR_MAX];
    char cluster_tls_ca[CFG_STR_MAX];
    uint64_t cluster_insecure;    /* 1: plain tcp, no authentication */
    uint64_t cluster_index_max_per_peer; /* index entries naming one member */
    uint64_t cluster_pins_max_per_peer;  /* pins one member holds here */
    uint64_t cluster_heartbeat_ms;
    uint64_t cluster_failure_ms;  /* silent this long: dead */
    uint64_t cluster_replicas;    /* owners of each global index entry */
    uint64_t cluster_lookup_ms;   /* LOOKUP waits this long for owners */
    uint64_t cluster_ucx_wakeup;  /* 1: UCX event fd; 0: poll (shared memory) */
    char cluster_membership[CFG_STR_MAX];     /* "swim" or "etcd" */
    char cluster_etcd_endpoints[CFG_STR_MAX]; /* comma list of http://host:port */
    char cluster_etcd_prefix[CFG_STR_MAX];    /* member keys' prefix */
    uint64_t cluster_etcd_lease_s; /* registration lease */
    uint64_t cluster_probe_ms;         /* SWIM protocol period */
    uint64_t cluster_probe_timeout_ms; /* SWIM direct ack wait */
    uint64_t cluster_suspicion_mult;   /* SWIM suspicion timeout factor */
    uint64_t cluster_reap_ms;          /* dead/left members forgotten after */
    uint64_t cluster_rx_queue_max;     /* messages waiting for the core, at most */
    uint64_t cluster_max_conns;        /* push sockets to members in use, at most */
    uint64_t cluster_max_peer_eps;     /* UCX endpoints to members open, at most */
    /* [events] (events.c); off while endpoint is empty */
    char events_endpoint[CFG_STR_MAX];        /* ZMQ PUB url */
    char events_replay_endpoint[CFG_STR_MAX]; /* ZMQ ROUTER url; "" = none */
    char events_topic[CFG_STR_MAX];           /* topic frame */
    uint64_t events_block_size;   /* tokens per key, for BlockStored */
    uint64_t events_buffer_steps; /* batches kept for replay */
    uint64_t events_hwm;          /* PUB send high-water mark */
    uint64_t events_dp_rank;      /* data_parallel_rank of every batch */
};

/* Fill c with the embedded defaults. */
void config_defaults(struct kvt_config *c);

/* Load an INI file over c. 0, or -1 with a message in err naming the line. */
int config_load_file(struct kvt_config *c, const char *path, char *err,
                     size_t errlen);

/* Set one key from "section.name" or a unique "name" (dashes and
 * underscores alike). 0, or -1 with a message in err. */
int config_set(struct kvt_config *c, const char *key, const char *value,
               char *err, size_t errlen);

/* Check cross-key rules (low < high, ...) and derive empty paths. */
int config_finish(struct kvt_config *c, char *err, size_t errlen);

/* Apply "--key value" / "--key=value" flags (argv-style, argc entries)
 * over c. 0, or -1 with a message in err naming the flag. */
int config_set_flags(struct kvt_config *c, int argc, char *const *argv,
                     char *err, size_t errlen);

/* Defaults, then the file (NULL: none), then the flags, then
 * config_finish: what start-up and every SIGHUP reload run. 0 or -1. */
int config_build(struct kvt_config *c, const char *file, int argc,
                 char *const *argv, char *err, size_t errlen);

/* Print every key as a commented INI reference: help, unit, default,
 * whether SIGHUP reloads it, and the value in c (NULL: the defaults). */
void config_print_reference(FILE *f, const struct kvt_config *c);

/* Called once per key whose value differs between two configs. */
typedef void (*config_change_fn)(void *arg, const char *key,
                                 const char *from, const char *to,
                                 int reloadable);

/* Report every key that differs between a and b; returns how many. */
int config_diff(const struct kvt_config *a, const struct kvt_config *b,
                config_change_fn fn, void *arg);

/* Copy the keys SIGHUP may change from src into dst. */
void config_apply_reloadable(struct kvt_config *dst,
                             const struct kvt_config *src);

/* Split a metrics address "host:port" or "[v6]:port". 0 or -1. */
int config_parse_hostport(const char *s, char *host, size_t hostlen,
                          unsigned *port);

/* Parse "64M", "1G", "4096", "1.5G" into bytes; -1 on junk or overflow. */
int config_parse_bytes(const char *s, uint64_t *out);

#endif
