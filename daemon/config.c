/*
 * config.c -- the key table and its three readers (see config.h).
 */
#include "config.h"

#include <errno.h>
#include <ini.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "tlsconf.h"
#include "xxhash.h"

enum cfg_type {
    CFG_STR, CFG_U64, CFG_BYTES, CFG_FRAC, CFG_OCTAL, CFG_LEVEL, CFG_ADDR,
    CFG_TENANT /* repeatable: each line adds one tenant (struct kvt_tenants) */
};

struct cfg_key {
    const char *section, *name;
    enum cfg_type type;
    size_t off, size;
    const char *def;
    double min, max;
    const char *unit; /* "" for strings and names */
    int reload;       /* 1: SIGHUP applies a new value at run time */
    const char *help;
};

#define F(field) offsetof(struct kvt_config, field), sizeof(((struct kvt_config *)0)->field)

static const struct cfg_key keys[] = {
    {"daemon", "socket", CFG_STR, F(socket), "ipc://./var/kvtierd.sock", 0, 0,
     "url", 0, "nng url clients dial; ipc:// for local engines"},
    {"daemon", "tcp", CFG_STR, F(tcp), "", 0, 0, "url", 0,
     "optional tcp:// listener for remote clients (copying calls only)"},
    {"daemon", "state_dir", CFG_STR, F(state_dir), "./var", 0, 0, "path", 0,
     "directory for lock files and state"},
    {"daemon", "log_level", CFG_LEVEL, F(log_level), "info", 0, 0, "level", 1,
     "error, warn, info or debug"},
    {"daemon", "contexts", CFG_U64, F(contexts), "32", 1, 1024, "count", 0,
     "requests served concurrently (nng contexts)"},
    {"daemon", "lease_timeout_ms", CFG_U64, F(lease_timeout_ms), "30000", 10,
     86400000, "ms", 1, "milliseconds before an unreleased lease is dropped"},
    {"daemon", "max_keys", CFG_U64, F(max_keys), "4096", 1, 1048576, "count", 0,
     "keys one request may carry"},
    {"daemon", "ns_per_client", CFG_U64, F(ns_per_client), "256", 0, 4096,
     "count", 1, "namespaces one connection may hold (chunks, leases or "
     "registrations in them); 0: no limit but the table's 4096"},
    {"daemon", "max_msg_bytes", CFG_BYTES, F(max_msg_bytes), "80M", 4096,
     4294967295.0, "bytes", 0, "largest request message accepted"},
    {"daemon", "drain_timeout_ms", CFG_U64, F(drain_timeout_ms), "5000", 0,
     600000, "ms", 1,
     "on SIGTERM, how long to wait for clients to finish their leases"},
    {"daemon", "shutdown_timeout_ms", CFG_U64, F(shutdown_timeout_ms), "15000", 0,
     600000, "ms", 1,
     "after the drain, how long the stop may take (closing the cluster, writing "
     "the pool journal and NVMe index) before the process exits anyway with "
     "status 1, logging the step it was stuck in; 0: unbounded"},
    {"daemon", "local_fast", CFG_U64, F(local_fast), "1", 0, 1, "bool", 0,
     "1: also serve local clients on a Unix stream socket beside the ipc one "
     "(<socket path>.fast), far faster than nng here; 0: nng only"},
    {"daemon", "local_max_conns", CFG_U64, F(local_max_conns), "1024", 1, 1048576,
     "count", 0, "fast-channel connections open at most; past it a new one is "
     "closed at once and its client stays on nng"},
    {"daemon", "park_per_client", CFG_U64, F(park_per_client), "8", 1, 1024,
     "count", 1, "requests one connection may have waiting at once (a GET on "
     "NVMe reads or peers, a LOOKUP on the cluster, FLUSH, VERIFY, KV_WAIT); "
     "past it such a request is refused with KVT_EBUSY and other clients are "
     "not affected"},
    {"daemon", "socket_mode", CFG_OCTAL, F(socket_mode), "0", 0, 0777, "mode", 0,
     "file mode of the ipc and fast-channel sockets (octal); 0: dram.pool_mode. "
     "With tenants the sockets may be opened wider than the pool: clients the "
     "pool's mode keeps out use copying calls"},
    {"daemon", "tls_cert", CFG_STR, F(tls_cert), "", 0, 0, "path", 0,
     "PEM certificate the tls+tcp:// client listeners present (daemon.tcp and "
     "the tenants' tls= listeners)"},
    {"daemon", "tls_key", CFG_STR, F(tls_key), "", 0, 0, "path", 0,
     "PEM private key of daemon.tls_cert"},
    {"daemon", "tls_ca", CFG_STR, F(tls_ca), "", 0, 0, "path", 0,
     "PEM CA certificates that sign the client certificates daemon.tcp "
     "accepts; a client without one is refused during the handshake"},
    {"daemon", "tcp_insecure", CFG_U64, F(tcp_insecure), "0", 0, 1, "bool", 0,
     "1: daemon.tcp may be a plain tcp:// url (no encryption, no client "
     "authentication; a warning is logged); refused when tenants are set"},
    {"tenants", "tenant", CFG_TENANT, F(tenants), "", 0, 0, "spec", 0,
     "one tenant per line, repeatable: name=NAME uids=U,.. gids=G,.. "
     "prefixes=P,.. [tls=tls+tcp://HOST:PORT ca=PATH] [pool=BYTES]. A local client (ipc "
     "socket, fast channel) belongs to the first tenant listing its uid or "
     "gid (SO_PEERCRED); a remote one to the tenant whose tls= listener "
     "verified its certificate against that tenant's ca. A tenant uses only "
     "namespaces starting with one of its prefixes. No line: one tenant, "
     "everything allowed to whoever can open the socket. With tenants, "
     "credentials no tenant lists are refused. pool=BYTES (at least 1M) gives "
     "the tenant a DRAM pool of its own, of dram.pool's kind (a file beside "
     "dram.pool_path, <pool_path>.<name>, mode 0600, or a memfd): its "
     "namespaces are stored only there, its clients are handed only that "
     "pool's fd and map no other; its prefixes may meet no other tenant's"},
    {"tenants", "admin_group", CFG_STR, F(admin_group), "", 0, 0, "group", 0,
     "group (name or gid) whose members, and the daemon's own uid, are "
     "operators: LIST of every namespace, CLEAR, EVICT, FLUSH, VERIFY, PEERS "
     "and any namespace. Only the daemon's uid when empty. Used only when "
     "tenants are set; clients of daemon.tcp are operators then"},
    {"dram", "pool_path", CFG_STR, F(pool_path), "", 0, 0, "path", 0,
     "shared-memory pool file; empty: /dev/shm/kvtier-<hash of socket>.pool"},
    {"dram", "pool", CFG_STR, F(pool_kind), "auto", 0, 0, "kind", 0,
     "memfd: the pool is a sealed memfd (F_SEAL_SHRINK|F_SEAL_GROW) that "
     "clients receive over the fast channel (SCM_RIGHTS), so none can shrink "
     "it; kept across restarts only through systemd's fd store "
     "(FileDescriptorStoreMax=). file: a file at dram.pool_path that clients "
     "open by path; kept across restarts without systemd (dram.adopt). auto: "
     "memfd when systemd gives this service an fd store ($FDSTORE) and the "
     "fast channel is on, else file"},
    {"dram", "pool_bytes", CFG_BYTES, F(pool_bytes), "1G", 1048576,
     1099511627776.0, "bytes", 0, "DRAM pool capacity (K, M, G, T suffixes)"},
    {"dram", "max_chunk_bytes", CFG_BYTES, F(max_chunk_bytes), "256M", 1,
     4294967295.0, "bytes", 0, "largest single chunk"},
    {"dram", "high_watermark", CFG_FRAC, F(high_watermark), "0.95", 0.01, 1.0,
     "fraction", 1, "fraction of the pool above which eviction starts"},
    {"dram", "low_watermark", CFG_FRAC, F(low_watermark), "0.85", 0.0, 1.0,
     "fraction", 1, "fraction of the pool eviction brings usage down to"},
    {"dram", "pool_mode", CFG_OCTAL, F(pool_mode), "0600", 0, 0777, "mode", 0,
     "file mode of the pool file and socket (octal)"},
    {"dram", "pool_group", CFG_STR, F(pool_group), "", 0, 0, "group", 0,
     "group owning the pool file and socket (empty: the daemon's)"},
    {"hbm", "hbm_bytes", CFG_BYTES, F(hbm_bytes), "0", 0, 1099511627776.0,
     "bytes", 0, "daemon-owned GPU pool above DRAM (the HBM tier, device 0); "
     "0: off. Needs a GPU: kvtierd will not start with hbm_bytes > 0 where "
     "GPU transfers are unavailable"},
    {"dram", "adopt", CFG_U64, F(dram_adopt), "1", 0, 1, "bool", 0,
     "1: a stop leaves the pool file and a journal of its chunks in state_dir, "
     "and the next kvtierd adopts them (checksums verified before serving), so "
     "a restart or upgrade keeps the DRAM cache; 0: the pool starts empty and "
     "is removed at stop"},
    {"dram", "plain_lru", CFG_U64, F(plain_lru), "0", 0, 1, "bool", 0,
     "1: evict the least recently used chunk whatever it is (DRAM and NVMe); "
     "0: prefix-aware eviction, only chunks with no cached descendants are "
     "victims (a shared prefix outlives its continuations). For comparing "
     "policies (bench_replay)"},
    {"nvme", "dirs", CFG_STR, F(nvme_dirs), "", 0, 0, "paths", 0,
     "comma-separated data directories, one per device (O_DIRECT files); "
     "empty: <state_dir>/nvme"},
    {"nvme", "nvme_bytes", CFG_BYTES, F(nvme_bytes), "0", 0, 1125899906842624.0,
     "bytes", 0, "NVMe tier capacity per directory; 0: no NVMe tier. Data files "
     "are created (fallocated) as space is needed"},
    {"nvme", "file_bytes", CFG_BYTES, F(nvme_file_bytes), "1G", 1048576,
     1099511627776.0, "bytes", 0, "size of each preallocated data file"},
    {"nvme", "queue_depth", CFG_U64, F(nvme_queue_depth), "32", 1, 4096, "count",
     0, "io_uring operations in flight at once"},
    {"nvme", "register_buffers", CFG_U64, F(nvme_register_buffers), "1", 0, 1,
     "bool", 0, "1: register the DRAM pool with io_uring (fixed buffers) when "
     "the locked-memory limit allows, else plain reads and writes; 0: never"},
    {"nvme", "write_through", CFG_U64, F(nvme_write_through), "0", 0, 1, "bool",
     0, "0: write-back (a chunk is written to NVMe when DRAM evicts it); 1: "
     "write-through (every commit is also written to NVMe)"},
    {"nvme", "nvme_high_watermark", CFG_FRAC, F(nvme_high_watermark), "0.95",
     0.01, 1.0, "fraction", 1, "NVMe usage above which its coldest leaves are "
     "dropped"},
    {"nvme", "nvme_low_watermark", CFG_FRAC, F(nvme_low_watermark), "0.85", 0.0,
     1.0, "fraction", 1, "NVMe usage that dropping brings it down to"},
    {"nvme", "index_path", CFG_STR, F(nvme_index_path), "", 0, 0, "path", 0,
     "RocksDB directory of the NVMe index; empty: <state_dir>/nvme-index"},
    {"nvme", "fsync", CFG_U64, F(nvme_fsync), "1", 0, 1, "bool", 0,
     "1: fdatasync data files before their records are indexed (the index "
     "then survives power loss too); 0: survive process crashes only"},
    {"nvme", "get_deadline_ms", CFG_U64, F(nvme_get_deadline_ms), "2000", 1,
     600000, "ms", 1, "how long a GET that names no deadline waits for chunks "
     "read back from NVMe before answering with what is in DRAM"},
    {"metrics", "listen", CFG_ADDR, F(metrics_listen), "127.0.0.1:9464", 0,
     65535, "host:port", 0,
     "address of the Prometheus /metrics endpoint; port 0 picks a free one; "
     "empty disables"},
    {"metrics", "ns_names", CFG_U64, F(metrics_ns_names), "1", 0, 1, "bool", 1,
     "1: the ns label of per-namespace series is the namespace's name; 0: "
     "\"h-\" and 16 hex digits of its XXH3-64, so a scrape does not list the "
     "tenants"},
    {"cluster", "node_id", CFG_U64, F(cluster_node_id), "0", 0, 4294967295.0,
     "id", 0, "this node's id, unique among the members (1 or more when "
     "cluster.listen is set)"},
    {"cluster", "listen", CFG_STR, F(cluster_listen), "", 0, 0, "url", 0,
     "tls+tcp://host:port of the daemon-to-daemon control channel (tcp:// "
     "only with cluster.insecure = 1); empty: no cluster (a single node)"},
    {"cluster", "seeds", CFG_STR, F(cluster_seeds), "", 0, 0, "urls", 0,
     "comma-separated control urls of members to join through; empty: wait "
     "for others to join this node"},
    {"cluster", "tls_cert", CFG_STR, F(cluster_tls_cert), "", 0, 0, "path", 0,
     "PEM certificate this node presents on the control channel; its subject "
     "CN or a DNS subjectAltName must be kvtier-node-<node_id>"},
    {"cluster", "tls_key", CFG_STR, F(cluster_tls_key), "", 0, 0, "path", 0,
     "PEM private key (unencrypted) of cluster.tls_cert"},
    {"cluster", "tls_ca", CFG_STR, F(cluster_tls_ca), "", 0, 0, "path", 0,
     "PEM CA certificate(s) every member's certificate must chain to; a node "
     "without one cannot connect, join, gossip, publish or pin"},
    {"cluster", "insecure", CFG_U64, F(cluster_insecure), "0", 0, 1, "bool", 0,
     "1: plain tcp:// without TLS or authentication (anyone who reaches the "
     "port can join, read the pool and poison the index); logged as a warning "
     "and shown by kvtierctl peers and the metrics"},
    {"cluster", "index_max_per_peer", CFG_U64, F(cluster_index_max_per_peer), "1048576",
     1, 1e9, "entries", 0, "global index entries this node keeps naming any one "
     "member as a holder; further adds from it are refused and counted"},
    {"cluster", "pins_max_per_peer", CFG_U64, F(cluster_pins_max_per_peer), "1024", 1,
     1e6, "pins", 0, "PeerPin requests of one member held here at once (each "
     "pins up to daemon.max_keys chunks); more are answered as not pinned"},
    {"cluster", "heartbeat_ms", CFG_U64, F(cluster_heartbeat_ms), "500", 50,
     60000, "ms", 0, "interval of the pairwise hello (identity proof, UCX "
     "address exchange) repeated to a member until it is done; not a "
     "liveness signal"},
    {"cluster", "failure_timeout_ms", CFG_U64, F(cluster_failure_ms), "3000",
     100, 600000, "ms", 0, "how long views are taken to need to agree after a "
     "membership change (owners keep and ask one more owner meanwhile)"},
    {"cluster", "probe_ms", CFG_U64, F(cluster_probe_ms), "700", 20, 60000, "ms", 0,
     "SWIM protocol period: one probe of one random member each (membership = "
     "swim)"},
    {"cluster", "probe_timeout_ms", CFG_U64, F(cluster_probe_timeout_ms), "350", 10,
     60000, "ms", 0, "SWIM: direct ack wait before asking others to probe; "
     "below cluster.probe_ms"},
    {"cluster", "suspicion_mult", CFG_U64, F(cluster_suspicion_mult), "2", 1, 100,
     "count", 0, "SWIM: a suspect is declared dead after suspicion_mult x "
     "log10(members+1) x probe_ms with every confirmation, up to 6 times that "
     "with none"},
    {"cluster", "reap_ms", CFG_U64, F(cluster_reap_ms), "60000", 100, 86400000, "ms",
     0, "dead and left members are forgotten this long after (SWIM)"},
    {"cluster", "rx_queue_max", CFG_U64, F(cluster_rx_queue_max), "16384", 1, 1e7,
     "messages", 0, "daemon-to-daemon messages waiting for the core thread at "
     "most; more are dropped and counted (membership copes with loss; an index "
     "update or pin dropped is lost)"},
    {"cluster", "max_conns", CFG_U64, F(cluster_max_conns), "256", 1, 1048576,
     "count", 0, "connections to members in use at most: each is dialled when "
     "something is first sent there; past this many the least recently used "
     "is closed (after a second to drain) and dialled again when needed"},
    {"cluster", "max_peer_eps", CFG_U64, F(cluster_max_peer_eps), "256", 1, 1048576,
     "count", 0, "UCX endpoints to members open at most: each is made when a GET "
     "first fetches from that member; past this many the least recently used "
     "one with no fetch in flight is closed and made again when needed"},
    {"cluster", "replicas", CFG_U64, F(cluster_replicas), "2", 1, 8, "count", 0,
     "owners of each global index entry (rendezvous hashing over the live "
     "members)"},
    {"cluster", "lookup_timeout_ms", CFG_U64, F(cluster_lookup_ms), "500", 10,
     60000, "ms", 1, "how long a LOOKUP waits for the owners of keys missing "
     "here before answering with what it has"},
    {"cluster", "ucx_wakeup", CFG_U64, F(cluster_ucx_wakeup), "1", 0, 1, "bool", 0,
     "1: the UCX worker wakes the daemon through its event fd and endpoints "
     "fail their requests when the peer dies (tcp, RDMA); 0: for the "
     "shared-memory transports (UCX_TLS=sm), which offer neither in UCX 1.13: "
     "the worker is polled while peer fetches or pins are outstanding, and a "
     "dead peer's fetches end at the GET deadline or when the member is marked "
     "dead. UCX picks the transport (UCX_TLS)"},
    {"cluster", "membership", CFG_STR, F(cluster_membership), "swim", 0, 0, "name", 0,
     "how members find each other: swim (embedded, no service needed) or etcd "
     "(members register under cluster.etcd_prefix with a lease and watch it; "
     "etcd's revision is the epoch)"},
    {"cluster", "etcd_endpoints", CFG_STR, F(cluster_etcd_endpoints), "", 0, 0, "urls",
     0, "comma-separated http://host:port of etcd's client urls (v3 JSON gateway), "
     "for cluster.membership = etcd"},
    {"cluster", "etcd_prefix", CFG_STR, F(cluster_etcd_prefix), "/kvtier/members/", 0,
     0, "key", 0, "etcd key prefix under which each member registers as "
     "<prefix><node_id> (at most 255 bytes)"},
    {"cluster", "etcd_lease_s", CFG_U64, F(cluster_etcd_lease_s), "10", 2, 3600, "s", 0,
     "lease of a member's etcd key, kept alive every third of it: a member that "
     "stops is seen dead this long after"},
    {"events", "endpoint", CFG_STR, F(events_endpoint), "", 0, 0, "url", 0,
     "ZMQ endpoint of the KV-events PUB socket (vLLM's KV-events format, for "
     "routers such as llm-d or Dynamo); tcp://*:PORT or ipc://PATH binds, "
     "tcp://HOST:PORT connects (to a subscriber that binds), as vLLM does; "
     "empty: no events and no ZMQ socket"},
    {"events", "replay_endpoint", CFG_STR, F(events_replay_endpoint), "", 0, 0,
     "url", 0, "ZMQ ROUTER endpoint (bound) where a subscriber asks for the "
     "kept batches from a sequence number on, as from vLLM's "
     "ZmqEventPublisher; empty: no replay"},
    {"events", "topic", CFG_STR, F(events_topic), "", 0, 0, "text", 0,
     "topic frame of every message; empty (vLLM's default) matches every "
     "subscription"},
    {"events", "block_size", CFG_U64, F(events_block_size), "16", 1, 1048576,
     "tokens", 0, "block_size of BlockStored events: set it to the connector's "
     "chunk tokens, the tokens behind one key"},
    {"events", "buffer_steps", CFG_U64, F(events_buffer_steps), "10000", 1,
     1000000, "count", 0, "batches kept for replay (the newest)"},
    {"events", "hwm", CFG_U64, F(events_hwm), "100000", 0, 10000000, "count", 0,
     "ZMQ send high-water mark of the PUB socket: messages queued per "
     "subscriber before that subscriber misses messages (0: no limit)"},
    {"events", "dp_rank", CFG_U64, F(events_dp_rank), "0", 0, 65535, "rank", 0,
     "data_parallel_rank written into every batch"},
};
#define NKEYS (sizeof keys / sizeof keys[0])

int config_parse_bytes(const char *s, uint64_t *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || errno != 0 || v < 0 || !isfinite(v)) return -1;
    double mul = 1;
    switch (*end) {
    case 'k': case 'K': mul = 1024.0; end++; break;
    case 'm': case 'M': mul = 1048576.0; end++; break;
    case 'g': case 'G': mul = 1073741824.0; end++; break;
    case 't': case 'T': mul = 1099511627776.0; end++; break;
    default: break;
    }
    if (*end == 'i' || *end == 'B') end++;
    if (*end == 'B') end++;
    if (*end != '\0') return -1;
    v *= mul;
    if (v >= 18446744073709551615.0) return -1;
    *out = (uint64_t)v;
    return 0;
}

static int norm_eq(const char *a, const char *b)
{
    for (; *a && *b; a++, b++) {
        char x = *a == '-' ? '_' : *a, y = *b == '-' ? '_' : *b;
        if (x != y) return 0;
    }
    return *a == *b;
}

static const struct cfg_key *find_key(const char *section, const char *name)
{
    const struct cfg_key *hit = NULL;
    for (size_t i = 0; i < NKEYS; i++) {
        if (!norm_eq(keys[i].name, name)) continue;
        if (section && strcmp(keys[i].section, section) != 0) continue;
        if (hit) return NULL; /* ambiguous without a section */
        hit = &keys[i];
    }
    return hit;
}

/* 1 if name, given without a section, is a key of more than one section;
 * err then names them. */
static int ambiguous(const char *name, char *err, size_t errlen)
{
    int n = 0, at;
    at = snprintf(err, errlen, "key '%s' is in more than one section (", name);
    for (size_t i = 0; i < NKEYS; i++) {
        if (!norm_eq(keys[i].name, name)) continue;
        if (at >= 0 && (size_t)at < errlen)
            at += snprintf(err + at, errlen - (size_t)at, "%s%s.%s", n ? ", " : "",
                           keys[i].section, keys[i].name);
        n++;
    }
    if (n > 1 && at >= 0 && (size_t)at < errlen)
        snprintf(err + at, errlen - (size_t)at, "): name its section");
    return n > 1;
}

static int range_err(const struct cfg_key *k, const char *v, char *err,
                     size_t errlen)
{
    snprintf(err, errlen, "%s.%s = '%s': out of range [%g, %g]", k->section,
             k->name, v, k->min, k->max);
    return -1;
}

static int set_number(const struct cfg_key *k, void *dst, const char *v,
                      char *err, size_t errlen)
{
    uint64_t u;
    char *end;
    errno = 0;
    if (k->type == CFG_FRAC) {
        double d = strtod(v, &end);
        if (end == v || *end || errno || d < k->min || d > k->max)
            return range_err(k, v, err, errlen);
        *(double *)dst = d;
        return 0;
    }
    if (k->type == CFG_BYTES) {
        if (config_parse_bytes(v, &u) != 0) return range_err(k, v, err, errlen);
    } else {
        u = strtoull(v, &end, k->type == CFG_OCTAL ? 8 : 10);
        if (end == v || *end || errno || v[0] == '-')
            return range_err(k, v, err, errlen);
    }
    if ((double)u < k->min || (double)u > k->max) return range_err(k, v, err, errlen);
    *(uint64_t *)dst = u;
    return 0;
}

int config_parse_hostport(const char *s, char *host, size_t hostlen,
                          unsigned *port)
{
    const char *colon = strrchr(s, ':'), *h = s;
    size_t hl = colon ? (size_t)(colon - s) : 0;
    if (!colon || hl == 0 || colon[1] == '\0') return -1;
    if (h[0] == '[') { /* [v6]:port */
        if (hl < 3 || h[hl - 1] != ']') return -1;
        h++;
        hl -= 2;
    } else if (memchr(h, ':', hl)) {
        return -1; /* a bare v6 address needs brackets */
    }
    char *end;
    errno = 0;
    unsigned long p = strtoul(colon + 1, &end, 10);
    if (*end || errno || p > 65535 || colon[1] == '-' || colon[1] == '+')
        return -1;
    if (hl >= hostlen || memchr(h, ' ', hl) || memchr(h, '/', hl)) return -1;
    memcpy(host, h, hl);
    host[hl] = '\0';
    *port = (unsigned)p;
    return 0;
}

static int check_addr(const struct cfg_key *k, const char *v, char *err,
                      size_t errlen)
{
    char host[CFG_STR_MAX];
    unsigned port;
    if (v[0] == '\0' || config_parse_hostport(v, host, sizeof host, &port) == 0)
        return 0;
    snprintf(err, errlen, "%s.%s = '%s': want host:port with a port in "
             "[0, 65535], [v6]:port, or empty to disable", k->section,
             k->name, v);
    return -1;
}

/* "1,2,3" into ids; 0 or -1. */
static int parse_ids(const char *v, uint32_t *ids, uint32_t *n)
{
    char *end;
    for (const char *p = v; *p; p = end + (*end == ',')) {
        errno = 0;
        unsigned long u = strtoul(p, &end, 10);
        if (end == p || errno || u > UINT32_MAX || (*end && *end != ',') ||
            *p == '-' || *n == CFG_TENANT_IDS)
            return -1;
        ids[(*n)++] = (uint32_t)u;
    }
    return *n ? 0 : -1;
}

static int parse_prefixes(const char *v, struct kvt_tenant *t)
{
    for (const char *p = v; *p;) {
        size_t len = strcspn(p, ",");
        if (len == 0 || len >= sizeof t->prefixes[0] ||
            t->n_prefixes == CFG_TENANT_PREFIXES)
            return -1;
        memcpy(t->prefixes[t->n_prefixes], p, len);
        t->prefixes[t->n_prefixes++][len] = '\0';
        p += len + (p[len] == ',');
    }
    return t->n_prefixes ? 0 : -1;
}

static int copy_field(char *dst, size_t cap, const char *v)
{
    if (!v[0] || strlen(v) >= cap) return -1;
    memcpy(dst, v, strlen(v) + 1);
    return 0;
}

/* One "field=value" of a tenant line. */
static int tenant_field(struct kvt_tenant *t, const char *f, size_t flen,
                        const char *v)
{
#define IS(name) (flen == sizeof name - 1 && !memcmp(f, name, flen))
    if (IS("name")) return copy_field(t->name, sizeof t->name, v);
    if (IS("uids")) return parse_ids(v, t->uids, &t->n_uids);
    if (IS("gids")) return parse_ids(v, t->gids, &t->n_gids);
    if (IS("prefixes")) return parse_prefixes(v, t);
    if (IS("tls"))
        return strncmp(v, "tls+tcp://", 10) ? -1 : copy_field(t->tls, sizeof t->tls, v);
    if (IS("ca")) return copy_field(t->ca, sizeof t->ca, v);
    if (IS("pool"))
        return config_parse_bytes(v, &t->pool_bytes) != 0 || t->pool_bytes < (1u << 20)
                   ? -1 : 0;
    return -1;
#undef IS
}

static int tenant_err(const char *v, const char *why, char *err, size_t errlen)
{
    snprintf(err, errlen, "tenants.tenant = '%s': %s (want name=NAME uids=U,.. "
             "gids=G,.. prefixes=P,.. [tls=tls+tcp://HOST:PORT ca=PATH] [pool=BYTES])",
             v, why);
    return -1;
}

#define NAME_CHARS "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_."

/* Could a namespace start with a prefix of a and one of b? (One prefix
 * is a prefix of the other.) */
static int prefixes_meet(const struct kvt_tenant *a, const struct kvt_tenant *b)
{
    for (uint32_t i = 0; i < a->n_prefixes; i++)
        for (uint32_t j = 0; j < b->n_prefixes; j++) {
            size_t la = strlen(a->prefixes[i]), lb = strlen(b->prefixes[j]);
            if (!strncmp(a->prefixes[i], b->prefixes[j], la < lb ? la : lb)) return 1;
        }
    return 0;
}

/* A tenant line, whitespace-separated fields, appended to ts. */
static int add_tenant(struct kvt_tenants *ts, const char *v, char *err,
                      size_t errlen)
{
    char buf[CFG_STR_MAX], *save = NULL;
    if (v[0] == '\0') return 0; /* the default: no tenant */
    if (ts->n == CFG_TENANTS_MAX) return tenant_err(v, "too many tenants", err, errlen);
    if (strlen(v) >= sizeof buf) return tenant_err(v, "too long", err, errlen);
    struct kvt_tenant *t = &ts->v[ts->n];
    memset(t, 0, sizeof *t);
    memcpy(t->spec, v, strlen(v) + 1);
    memcpy(buf, v, strlen(v) + 1);
    for (char *tok = strtok_r(buf, " \t", &save); tok; tok = strtok_r(NULL, " \t", &save)) {
        char *eq = strchr(tok, '=');
        if (!eq || tenant_field(t, tok, (size_t)(eq - tok), eq + 1) != 0)
            return tenant_err(v, tok, err, errlen);
    }
    if (!t->name[0]) return tenant_err(v, "no name", err, errlen);
    if (!t->n_prefixes) return tenant_err(v, "no prefixes", err, errlen);
    if (!t->n_uids && !t->n_gids && !t->tls[0])
        return tenant_err(v, "no uids, gids or tls listener", err, errlen);
    if (!t->tls[0] != !t->ca[0])
        return tenant_err(v, "tls and ca go together", err, errlen);
    for (uint32_t i = 0; i < ts->n; i++)
        if (!strcmp(ts->v[i].name, t->name))
            return tenant_err(v, "name used twice", err, errlen);
    if (t->pool_bytes && t->name[strspn(t->name, NAME_CHARS)])
        return tenant_err(v, "a tenant with its own pool names a file and an fd: "
                          "its name may hold only letters, digits, '-', '_' and '.'",
                          err, errlen);
    for (uint32_t i = 0; i < ts->n; i++)
        if ((t->pool_bytes || ts->v[i].pool_bytes) && prefixes_meet(t, &ts->v[i]))
            return tenant_err(v, "a tenant with its own pool shares no namespace "
                              "prefix with another tenant", err, errlen);
    ts->n++;
    return 0;
}

static int set_value(struct kvt_config *c, const struct cfg_key *k,
                     const char *v, char *err, size_t errlen)
{
    void *dst = (char *)c + k->off;
    switch (k->type) {
    case CFG_TENANT:
        return add_tenant(dst, v, err, errlen);
    case CFG_ADDR:
        if (check_addr(k, v, err, errlen) != 0) return -1;
        goto copy;
    case CFG_LEVEL:
        if (log_level_parse(v) < 0) {
            snprintf(err, errlen, "%s.%s = '%s': not a log level", k->section,
                     k->name, v);
            return -1;
        }
        /* fallthrough */
    case CFG_STR:
    copy:
        if (strlen(v) >= k->size) {
            snprintf(err, errlen, "%s.%s: value too long", k->section, k->name);
            return -1;
        }
        memcpy(dst, v, strlen(v) + 1);
        return 0;
    default:
        return set_number(k, dst, v, err, errlen);
    }
}

void config_defaults(struct kvt_config *c)
{
    char err[256];
    memset(c, 0, sizeof *c);
    for (size_t i = 0; i < NKEYS; i++)
        if (set_value(c, &keys[i], keys[i].def, err, sizeof err) != 0) abort();
}

int config_set(struct kvt_config *c, const char *key, const char *value,
               char *err, size_t errlen)
{
    char section[64] = "";
    const char *name = key, *dot = strchr(key, '.');
    if (dot) {
        size_t n = (size_t)(dot - key);
        if (n >= sizeof section) n = sizeof section - 1;
        memcpy(section, key, n);
        section[n] = '\0';
        name = dot + 1;
    }
    const struct cfg_key *k = find_key(dot ? section : NULL, name);
    if (!k && !dot && ambiguous(name, err, errlen)) return -1;
    if (!k) {
        snprintf(err, errlen, "unknown key '%s'", key);
        return -1;
    }
    return set_value(c, k, value, err, errlen);
}

struct ini_ctx {
    struct kvt_config *c;
    char msg[256]; /* first error; inih reports its line */
    int failed;
};

static int ini_cb(void *user, const char *section, const char *name,
                  const char *value)
{
    struct ini_ctx *x = user;
    if (x->failed) return 0;
    const struct cfg_key *k = find_key(section, name);
    if (!k) {
        snprintf(x->msg, sizeof x->msg, "unknown key '%s' in [%s]", name, section);
        x->failed = 1;
        return 0;
    }
    if (set_value(x->c, k, value, x->msg, sizeof x->msg) != 0) {
        x->failed = 1;
        return 0;
    }
    return 1;
}

int config_load_file(struct kvt_config *c, const char *path, char *err,
                     size_t errlen)
{
    struct ini_ctx x = {.c = c};
    FILE *f = fopen(path, "r");
    if (!f) {
        snprintf(err, errlen, "%s", strerror(errno));
        return -1;
    }
    int rv = ini_parse_file(f, ini_cb, &x);
    fclose(f);
    if (x.failed) {
        snprintf(err, errlen, "line %d: %s", rv, x.msg);
        return -1;
    }
    if (rv != 0) {
        snprintf(err, errlen, "line %d: syntax error", rv);
        return -1;
    }
    return 0;
}

/* A ZMQ endpoint kvtierd can use: tcp:// or ipc:// (inproc:// would only
 * reach the daemon itself). */
static int zmq_url_ok(const char *u)
{
    return (!strncmp(u, "tcp://", 6) && u[6]) || (!strncmp(u, "ipc://", 6) && u[6]);
}

static int check_events(const struct kvt_config *c, char *err, size_t errlen)
{
    const char *ep = c->events_endpoint, *rp = c->events_replay_endpoint;
    if (ep[0] && !zmq_url_ok(ep)) {
        snprintf(err, errlen, "events.endpoint '%s': want tcp://HOST:PORT, "
                 "tcp://*:PORT or ipc://PATH", ep);
        return -1;
    }
    if (rp[0] && (!ep[0] || !zmq_url_ok(rp) || !strcmp(rp, ep))) {
        snprintf(err, errlen, "events.replay_endpoint '%s': want tcp://*:PORT or "
                 "ipc://PATH, other than events.endpoint, which must be set", rp);
        return -1;
    }
    return 0;
}

/* [cluster]: TLS with the three files, or plain tcp only when asked for. */
static int check_cluster(const struct kvt_config *c, char *err, size_t errlen)
{
    const char *l = c->cluster_listen;
    const char *want = c->cluster_insecure ? "tcp://" : "tls+tcp://";
    char why[256];
    if (!l[0]) return 0;
    if (strncmp(l, want, strlen(want)) != 0 || c->cluster_node_id == 0) {
        snprintf(err, errlen, "cluster.listen '%s' wants %shost:port%s and a "
                 "cluster.node_id of 1 or more", l, want,
                 c->cluster_insecure ? " (cluster.insecure = 1)" : "");
        return -1;
    }
    if (c->cluster_insecure) return 0;
    struct tlsconf_files f = {c->cluster_tls_ca, c->cluster_tls_cert, c->cluster_tls_key};
    if (!f.ca[0] || !f.cert[0] || !f.key[0]) {
        snprintf(err, errlen, "cluster.listen '%s' needs cluster.tls_cert, cluster.tls_key "
                 "and cluster.tls_ca (or cluster.insecure = 1 with tcp://)", l);
        return -1;
    }
    if (!tlsconf_check(&f, why, sizeof why)) {
        snprintf(err, errlen, "cluster TLS: %s", why);
        return -1;
    }
    return 0;
}

/* The remote client listeners: TLS with client certificates, or plain tcp
 * only when asked for by name and never beside tenants. */
static int check_tcp(const struct kvt_config *c, char *err, size_t errlen)
{
    int plain = !strncmp(c->tcp, "tcp://", 6), tls = !strncmp(c->tcp, "tls+tcp://", 10);
    int any_tls = tls;
    for (uint32_t i = 0; i < c->tenants.n; i++) any_tls |= c->tenants.v[i].tls[0] != 0;
    if (c->tcp[0] && !plain && !tls) {
        snprintf(err, errlen, "daemon.tcp '%s': want tls+tcp://host:port (or "
                 "tcp:// with daemon.tcp_insecure = 1)", c->tcp);
        return -1;
    }
    if (plain && (!c->tcp_insecure || c->tenants.n)) {
        snprintf(err, errlen, "daemon.tcp '%s' is plain tcp: anyone who reaches "
                 "it may read and write the cache; use tls+tcp:// or set "
                 "daemon.tcp_insecure = 1 (not allowed with tenants)", c->tcp);
        return -1;
    }
    if (any_tls && (!c->tls_cert[0] || !c->tls_key[0] || (tls && !c->tls_ca[0]))) {
        snprintf(err, errlen, "a tls+tcp:// listener needs daemon.tls_cert and "
                 "daemon.tls_key%s", tls ? ", and daemon.tcp needs daemon.tls_ca" : "");
        return -1;
    }
    return 0;
}

int config_finish(struct kvt_config *c, char *err, size_t errlen)
{
    if (c->low_watermark >= c->high_watermark) {
        snprintf(err, errlen, "dram.low_watermark (%g) must be below "
                 "dram.high_watermark (%g)", c->low_watermark, c->high_watermark);
        return -1;
    }
    if (c->max_chunk_bytes > c->pool_bytes) c->max_chunk_bytes = c->pool_bytes;
    if (strncmp(c->socket, "ipc://", 6) != 0 && strncmp(c->socket, "tcp://", 6) != 0) {
        snprintf(err, errlen, "daemon.socket '%s': want ipc:// or tcp://", c->socket);
        return -1;
    }
    if (check_tcp(c, err, errlen) != 0) return -1;
    if (strcmp(c->pool_kind, "file") && strcmp(c->pool_kind, "memfd") &&
        strcmp(c->pool_kind, "auto")) {
        snprintf(err, errlen, "dram.pool '%s': want file, memfd or auto", c->pool_kind);
        return -1;
    }
    if (c->nvme_low_watermark >= c->nvme_high_watermark) {
        snprintf(err, errlen, "nvme.nvme_low_watermark (%g) must be below "
                 "nvme.nvme_high_watermark (%g)", c->nvme_low_watermark,
                 c->nvme_high_watermark);
        return -1;
    }
    if (check_cluster(c, err, errlen) != 0) return -1;
    if (strcmp(c->cluster_membership, "swim") && strcmp(c->cluster_membership, "etcd")) {
        snprintf(err, errlen, "cluster.membership '%s': want swim or etcd",
                 c->cluster_membership);
        return -1;
    }
    if (!strcmp(c->cluster_membership, "etcd") &&
        (!c->cluster_etcd_endpoints[0] || !c->cluster_etcd_prefix[0] ||
         strlen(c->cluster_etcd_prefix) > 255)) {
        snprintf(err, errlen, "cluster.membership = etcd wants cluster.etcd_endpoints and "
                 "a cluster.etcd_prefix of 1 to 255 bytes");
        return -1;
    }
    if (c->cluster_probe_timeout_ms >= c->cluster_probe_ms) {
        snprintf(err, errlen, "cluster.probe_timeout_ms (%llu) must be below "
                 "cluster.probe_ms (%llu)", (unsigned long long)c->cluster_probe_timeout_ms,
                 (unsigned long long)c->cluster_probe_ms);
        return -1;
    }
    if (c->cluster_failure_ms <= c->cluster_heartbeat_ms) {
        snprintf(err, errlen, "cluster.failure_timeout_ms (%llu) must exceed "
                 "cluster.heartbeat_ms (%llu)", (unsigned long long)c->cluster_failure_ms,
                 (unsigned long long)c->cluster_heartbeat_ms);
        return -1;
    }
    if (check_events(c, err, errlen) != 0) return -1;
    if (c->nvme_dirs[0] == '\0')
        snprintf(c->nvme_dirs, sizeof c->nvme_dirs, "%.*s/nvme", CFG_STR_MAX - 8,
                 c->state_dir);
    if (c->nvme_index_path[0] == '\0')
        snprintf(c->nvme_index_path, sizeof c->nvme_index_path, "%.*s/nvme-index",
                 CFG_STR_MAX - 16, c->state_dir);
    if (c->pool_path[0] == '\0')
        snprintf(c->pool_path, sizeof c->pool_path, "/dev/shm/kvtier-%016llx.pool",
                 (unsigned long long)XXH3_64bits(c->socket, strlen(c->socket)));
    return 0;
}

static void format_u64(enum cfg_type t, uint64_t u, char *buf, size_t len)
{
    static const char sfx[] = "KMGT";
    if (t == CFG_OCTAL) {
        snprintf(buf, len, "0%llo", (unsigned long long)u);
        return;
    }
    for (int i = 3; t == CFG_BYTES && i >= 0; i--) {
        uint64_t m = 1ull << (10 * (i + 1));
        if (u && u % m == 0) {
            snprintf(buf, len, "%llu%c", (unsigned long long)(u / m), sfx[i]);
            return;
        }
    }
    snprintf(buf, len, "%llu", (unsigned long long)u);
}

static int is_text(enum cfg_type t)
{
    return t == CFG_STR || t == CFG_LEVEL || t == CFG_ADDR || t == CFG_TENANT;
}

/* Tenants for the diff: their names and a hash of every line. */
static void format_tenants(const struct kvt_tenants *ts, char *buf, size_t len)
{
    uint64_t h = 0;
    size_t at = 0;
    buf[0] = '\0';
    for (uint32_t i = 0; i < ts->n && at < len; i++) {
        h = XXH3_64bits_withSeed(ts->v[i].spec, strlen(ts->v[i].spec), h);
        at += (size_t)snprintf(buf + at, len - at, "%s%s", i ? "," : "",
                               ts->v[i].name);
    }
    if (ts->n && at < len)
        snprintf(buf + at, len - at, " (%016llx)", (unsigned long long)h);
}

/* The value of key k in c as the INI file would spell it. */
static void format_value(const struct kvt_config *c, const struct cfg_key *k,
                         char *buf, size_t len)
{
    const void *src = (const char *)c + k->off;
    if (k->type == CFG_TENANT) format_tenants(src, buf, len);
    else if (is_text(k->type)) snprintf(buf, len, "%s", (const char *)src);
    else if (k->type == CFG_FRAC) snprintf(buf, len, "%g", *(const double *)src);
    else format_u64(k->type, *(const uint64_t *)src, buf, len);
}

/* "; range 1M to 1T" for numeric keys, "" for the rest. */
static void format_range(const struct cfg_key *k, char *buf, size_t len)
{
    char lo[32], hi[32];
    buf[0] = '\0';
    if (is_text(k->type)) return;
    if (k->type == CFG_FRAC) {
        snprintf(buf, len, "; range %g to %g", k->min, k->max);
        return;
    }
    format_u64(k->type, (uint64_t)k->min, lo, sizeof lo);
    format_u64(k->type, (uint64_t)k->max, hi, sizeof hi);
    snprintf(buf, len, "; range %s to %s", lo, hi);
}

/* "# text" folded at 76 columns on spaces. */
static void print_wrapped(FILE *f, const char *text)
{
    const char *p = text;
    while (*p) {
        size_t n = strlen(p);
        if (n > 74) {
            n = 74;
            while (n > 0 && p[n] != ' ') n--;
            if (n == 0) n = strcspn(p, " ");
        }
        fprintf(f, "# %.*s\n", (int)n, p);
        p += n;
        while (*p == ' ') p++;
    }
}

static void print_key(FILE *f, const struct cfg_key *k,
                      const struct kvt_config *c, const struct kvt_config *def)
{
    char val[CFG_STR_MAX], dv[CFG_STR_MAX], range[96];
    format_value(c, k, val, sizeof val);
    format_value(def, k, dv, sizeof dv);
    format_range(k, range, sizeof range);
    print_wrapped(f, k->help);
    fprintf(f, "# unit: %s%s; default: %s%s\n", k->unit, range,
            dv[0] ? dv : "(empty)", k->reload ? "; SIGHUP reloads it" : "");
    if (k->type == CFG_TENANT) { /* one line per tenant */
        const struct kvt_tenants *ts = (const void *)((const char *)c + k->off);
        for (uint32_t i = 0; i < ts->n; i++)
            fprintf(f, "%s = %s\n", k->name, ts->v[i].spec);
        if (!ts->n) fprintf(f, "#%s =\n", k->name);
        return;
    }
    fprintf(f, "%s%s =%s%s\n", strcmp(val, dv) ? "" : "#", k->name,
            val[0] ? " " : "", val);
}

void config_print_reference(FILE *f, const struct kvt_config *c)
{
    struct kvt_config def;
    const char *sec = "";
    config_defaults(&def);
    if (!c) c = &def;
    fprintf(f, "# kvtierd configuration (INI). Every key, its unit and default;\n"
               "# a commented-out key is at its default. Written by\n"
               "# `kvtierd --print-config`; see kvtier.conf(5).\n");
    for (size_t i = 0; i < NKEYS; i++) {
        if (strcmp(sec, keys[i].section) != 0) {
            sec = keys[i].section;
            fprintf(f, "\n[%s]\n", sec);
        }
        print_key(f, &keys[i], c, &def);
    }
}

int config_diff(const struct kvt_config *a, const struct kvt_config *b,
                config_change_fn fn, void *arg)
{
    char va[CFG_STR_MAX], vb[CFG_STR_MAX], name[96];
    int n = 0;
    for (size_t i = 0; i < NKEYS; i++) {
        format_value(a, &keys[i], va, sizeof va);
        format_value(b, &keys[i], vb, sizeof vb);
        if (strcmp(va, vb) == 0) continue;
        snprintf(name, sizeof name, "%s.%s", keys[i].section, keys[i].name);
        if (fn) fn(arg, name, va, vb, keys[i].reload);
        n++;
    }
    return n;
}

void config_apply_reloadable(struct kvt_config *dst,
                             const struct kvt_config *src)
{
    for (size_t i = 0; i < NKEYS; i++)
        if (keys[i].reload)
            memcpy((char *)dst + keys[i].off, (const char *)src + keys[i].off,
                   keys[i].size);
}

/* One flag at argv[*i]: "--key value" or "--key=value". */
static int set_flag(struct kvt_config *c, int argc, char *const *argv, int *i,
                    char *err, size_t errlen)
{
    const char *a = argv[*i], *eq = strchr(a, '='), *val;
    char key[128], msg[384];
    if (strncmp(a, "--", 2) != 0) {
        snprintf(err, errlen, "unexpected argument '%s'", a);
        return -1;
    }
    if (eq) {
        snprintf(key, sizeof key, "%.*s", (int)(eq - a - 2), a + 2);
        val = eq + 1;
    } else if (*i + 1 < argc) {
        snprintf(key, sizeof key, "%s", a + 2);
        val = argv[++*i];
    } else {
        snprintf(err, errlen, "%s needs a value", a);
        return -1;
    }
    if (config_set(c, key, val, msg, sizeof msg) == 0) return 0;
    snprintf(err, errlen, "--%s: %s", key, msg);
    return -1;
}

int config_set_flags(struct kvt_config *c, int argc, char *const *argv,
                     char *err, size_t errlen)
{
    for (int i = 0; i < argc; i++)
        if (set_flag(c, argc, argv, &i, err, errlen) != 0) return -1;
    return 0;
}

int config_build(struct kvt_config *c, const char *file, int argc,
                 char *const *argv, char *err, size_t errlen)
{
    char msg[512];
    config_defaults(c);
    if (file && config_load_file(c, file, msg, sizeof msg) != 0) {
        snprintf(err, errlen, "%s: %s", file, msg);
        return -1;
    }
    if (config_set_flags(c, argc, argv, err, errlen) != 0) return -1;
    return config_finish(c, err, errlen);
}
