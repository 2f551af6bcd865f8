/*
 * tenant.c -- tenants tied to credentials.
 *
 * Design: a namespace is a label, so who may use it is decided by who the
 * client is, never by what it says. Every connection is resolved once,
 * when it arrives, to a tenant or to nobody: a local one (the ipc socket
 * or the fast channel) by the uid and gid the kernel reports for its
 * socket (SO_PEERCRED; nng's ipc:peer-uid/gid), a remote one by the TLS
 * listener whose CA verified its certificate (each tenant with remote
 * clients has its own listener and CA: the handshake itself is the
 * check). Operators -- the daemon's own uid, members of
 * tenants.admin_group, and clients of daemon.tcp (whose CA is the
 * operators') -- may do anything. Each request is then checked in one
 * place, before its handler runs (tenant_check): its namespace must start
 * with one of the tenant's prefixes, and requests over the whole cache
 * (LIST of everything, CLEAR, EVICT, FLUSH, VERIFY, PEERS) are for
 * operators. Requests naming a lease, registration or transfer need no
 * check here: those belong to the connection that made them.
 * Without a tenant line nothing is checked at all: the single
 * zero-configuration tenant is whoever can open the socket, as the
 * socket's and pool's modes decide.
 * The table takes the configuration and the two transports it asks about
 * a connection, nothing else of the daemon. Connections live in a small
 * hash by id (a check per request). Core thread only.
 */
#include "tenant.h"

#include <grp.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config.h"
#include "local.h"
#include "log.h"
#include "server.h"
#include "tlsconf.h"

#define TN_BUCKETS 256
#define TN_URLS (2 + CFG_TENANTS_MAX)
#define TN_GROUPS 256
enum { ROLE_LOCAL = -1, ROLE_OPERATOR = -2 };

struct tconn {
    uint32_t pipe, uid, gid;
    int tenant;   /* index in cfg.tenants, or -1: nobody */
    int operator_;
    int has_cred; /* uid and gid are known */
    struct tconn *next;
};

struct tenants {
    const struct kvt_config *cfg;
    struct server *srv;
    struct local_srv *local;
    int has_admin_gid;
    gid_t admin_gid;
    int role[TN_URLS]; /* of each server url: ROLE_* or a tenant index */
    nng_tls_config *tls[TN_URLS];
    size_t n_urls;
    struct tconn *b[TN_BUCKETS];
};

static int enabled(const struct tenants *t)
{
    return t && t->cfg->tenants.n > 0;
}

static int parse_group(const char *g, gid_t *out)
{
    char *end, buf[4096];
    struct group gr, *res = NULL;
    unsigned long u = strtoul(g, &end, 10);
    if (*g && !*end) {
        *out = (gid_t)u;
        return 0;
    }
    if (getgrnam_r(g, &gr, buf, sizeof buf, &res) != 0 || !res) return -1;
    *out = res->gr_gid;
    return 0;
}

struct tenants *tenant_open(const struct kvt_config *c, char *err, size_t errlen)
{
    struct tenants *t = calloc(1, sizeof *t);
    if (!t) abort(); /* control-plane allocation */
    t->cfg = c;
    if (c->admin_group[0] && parse_group(c->admin_group, &t->admin_gid) != 0) {
        snprintf(err, errlen, "tenants.admin_group '%s': no such group", c->admin_group);
        goto fail;
    }
    t->has_admin_gid = c->admin_group[0] != 0;
    if (enabled(t) && strncmp(c->socket, "ipc://", 6) != 0) {
        snprintf(err, errlen, "with tenants, daemon.socket must be ipc:// (local "
                 "clients are known by their uid and gid)");
        goto fail;
    }
    for (uint32_t i = 0; i < c->tenants.n; i++) {
        const struct kvt_tenant *tn = &c->tenants.v[i];
        log_info("tenant", "%s: %u uids, %u gids, %u prefixes%s%s", tn->name,
                 tn->n_uids, tn->n_gids, tn->n_prefixes,
                 tn->tls[0] ? ", remote clients on " : "", tn->tls);
    }
    return t;
fail:
    free(t);
    return NULL;
}

void tenant_attach(struct tenants *t, struct server *srv, struct local_srv *local)
{
    if (!t) return;
    t->srv = srv;
    t->local = local;
}

void tenant_close(struct tenants *t)
{
    if (!t) return;
    for (size_t i = 0; i < TN_BUCKETS; i++)
        while (t->b[i]) {
            struct tconn *c = t->b[i];
            t->b[i] = c->next;
            free(c);
        }
    for (size_t i = 0; i < t->n_urls; i++)
        if (t->tls[i]) nng_tls_config_free(t->tls[i]);
    free(t);
}

/* ------------------------------------------------------------ listeners */

static int add_url(struct tenants *t, const char **urls, nng_tls_config **tls,
                   size_t max, const char *url, int role,
                   const struct tlsconf_files *f, char *err, size_t errlen)
{
    if (t->n_urls == max || t->n_urls == TN_URLS) {
        snprintf(err, errlen, "too many listeners");
        return -1;
    }
    if (!strncmp(url, "tls+tcp://", 10) &&
        tlsconf_build(&t->tls[t->n_urls], 1, f, NULL, err, errlen) != 0)
        return -1;
    urls[t->n_urls] = url;
    tls[t->n_urls] = t->tls[t->n_urls];
    t->role[t->n_urls++] = role;
    return 0;
}

int tenant_listeners(struct tenants *t, const char **urls, nng_tls_config **tls,
                     size_t max, char *err, size_t errlen)
{
    const struct kvt_config *c = t->cfg;
    struct tlsconf_files f = {c->tls_ca, c->tls_cert, c->tls_key};
    if (add_url(t, urls, tls, max, c->socket, ROLE_LOCAL, &f, err, errlen) != 0)
        return -1;
    if (c->tcp[0]) {
        if (!strncmp(c->tcp, "tcp://", 6))
            log_warn("server", "daemon.tcp %s is plain tcp (daemon.tcp_insecure): "
                     "anyone who reaches it can read and overwrite the cache",
                     c->tcp);
        if (add_url(t, urls, tls, max, c->tcp, ROLE_OPERATOR, &f, err, errlen) != 0)
            return -1;
    }
    for (uint32_t i = 0; i < c->tenants.n; i++) {
        const struct kvt_tenant *tn = &c->tenants.v[i];
        struct tlsconf_files tf = {tn->ca, c->tls_cert, c->tls_key};
        if (tn->tls[0] &&
            add_url(t, urls, tls, max, tn->tls, (int)i, &tf, err, errlen) != 0)
            return -1;
    }
    return (int)t->n_urls;
}

/* ---------------------------------------------------------- connections */

static struct tconn **slot_of(struct tenants *t, uint32_t pipe)
{
    struct tconn **pp = &t->b[(pipe ^ (pipe >> 8)) % TN_BUCKETS];
    while (*pp && (*pp)->pipe != pipe) pp = &(*pp)->next;
    return pp;
}

/* Does the client (uid, gid) belong to group g? Its primary gid, or the
 * groups its user name is in. */
static int in_group(uint32_t uid, uint32_t gid, gid_t g)
{
    char buf[4096];
    struct passwd pw, *res = NULL;
    gid_t groups[TN_GROUPS];
    int n = TN_GROUPS;
    if (gid == g) return 1;
    if (getpwuid_r(uid, &pw, buf, sizeof buf, &res) != 0 || !res) return 0;
    if (getgrouplist(res->pw_name, (gid_t)gid, groups, &n) < 0) n = TN_GROUPS;
    for (int i = 0; i < n; i++)
        if (groups[i] == g) return 1;
    return 0;
}

static int lists(const uint32_t *ids, uint32_t n, uint32_t id)
{
    for (uint32_t i = 0; i < n; i++)
        if (ids[i] == id) return 1;
    return 0;
}

static int tenant_of_cred(const struct kvt_tenants *ts, uint32_t uid, uint32_t gid)
{
    for (uint32_t i = 0; i < ts->n; i++)
        if (lists(ts->v[i].uids, ts->v[i].n_uids, uid)) return (int)i;
    for (uint32_t i = 0; i < ts->n; i++) {
        const struct kvt_tenant *t = &ts->v[i];
        for (uint32_t j = 0; j < t->n_gids; j++)
            if (in_group(uid, gid, (gid_t)t->gids[j])) return (int)i;
    }
    return -1;
}

static int nng_cred(uint32_t pipe, uint32_t *uid, uint32_t *gid)
{
    nng_pipe p = NNG_PIPE_INITIALIZER;
    uint64_t u, g;
    p.id = pipe;
    if (nng_pipe_get_uint64(p, NNG_OPT_IPC_PEER_UID, &u) != 0 ||
        nng_pipe_get_uint64(p, NNG_OPT_IPC_PEER_GID, &g) != 0)
        return -1;
    *uid = (uint32_t)u;
    *gid = (uint32_t)g;
    return 0;
}

static void resolve(struct tenants *t, struct tconn *c)
{
    int role = ROLE_LOCAL, rv;
    c->tenant = -1;
    if (c->pipe >= LOCAL_ID_BASE) {
        rv = local_peer_cred(t->local, c->pipe, &c->uid, &c->gid);
    } else {
        int u = t->srv ? server_url_of(t->srv, c->pipe) : -1;
        if (u < 0 || (size_t)u >= t->n_urls) return; /* gone already */
        role = t->role[u];
        rv = role == ROLE_LOCAL ? nng_cred(c->pipe, &c->uid, &c->gid) : -1;
    }
    if (role == ROLE_OPERATOR) c->operator_ = 1;
    if (role >= 0) c->tenant = role; /* its listener's CA verified it */
    if (role != ROLE_LOCAL || rv != 0) return;
    c->has_cred = 1;
    c->operator_ = c->uid == (uint32_t)geteuid() ||
                   (t->has_admin_gid && in_group(c->uid, c->gid, t->admin_gid));
    c->tenant = tenant_of_cred(&t->cfg->tenants, c->uid, c->gid);
}

static const char *who(const struct tconn *c, char *buf, size_t len)
{
    if (c->has_cred) snprintf(buf, len, "uid %u gid %u", c->uid, c->gid);
    else snprintf(buf, len, "remote client %u", c->pipe);
    return buf;
}

/* The record of a connected pipe; one not (or no longer) connected is
 * resolved afresh each time and kept nowhere: its requests are still
 * checked, and nothing leaks. */
static const struct tconn *conn_of(struct tenants *t, uint32_t pipe)
{
    static struct tconn passing;
    struct tconn *c = *slot_of(t, pipe);
    if (c) return c;
    passing = (struct tconn){.pipe = pipe};
    resolve(t, &passing);
    return &passing;
}

void tenant_conn_added(struct tenants *t, uint32_t pipe)
{
    char w[64];
    if (!enabled(t)) return;
    struct tconn **pp = slot_of(t, pipe);
    if (*pp) return;
    struct tconn *c = calloc(1, sizeof *c);
    if (!c) abort(); /* control-plane allocation */
    c->pipe = pipe;
    resolve(t, c);
    *pp = c;
    if (c->tenant < 0 && !c->operator_)
        log_warn("tenant", "%s belongs to no tenant: its requests are refused",
                 who(c, w, sizeof w));
}

void tenant_conn_removed(struct tenants *t, uint32_t pipe)
{
    if (!t) return;
    struct tconn **pp = slot_of(t, pipe), *c = *pp;
    if (!c) return;
    *pp = c->next;
    free(c);
}

/* --------------------------------------------------------------- checks */

static int prefix_ok(const struct kvt_tenant *t, const char *ns)
{
    for (uint32_t i = 0; i < t->n_prefixes; i++)
        if (!strncmp(ns, t->prefixes[i], strlen(t->prefixes[i]))) return 1;
    return 0;
}

/* The namespace a request names, "" for none, NULL for an operator
 * request. */
static const char *ns_of(const Kvtier__Request *q)
{
    switch (q->body_case) {
    case KVTIER__REQUEST__BODY_LOOKUP: return q->lookup->ns;
    case KVTIER__REQUEST__BODY_PUT_BEGIN: return q->put_begin->ns;
    case KVTIER__REQUEST__BODY_PUT: return q->put->ns;
    case KVTIER__REQUEST__BODY_GET: return q->get->ns;
    case KVTIER__REQUEST__BODY_DELETE: return q->delete_->ns;
    case KVTIER__REQUEST__BODY_REGISTER_KV_CACHE: return q->register_kv_cache->ns;
    case KVTIER__REQUEST__BODY_KV_SAVE: return q->kv_save->ns;
    case KVTIER__REQUEST__BODY_KV_LOAD: return q->kv_load->ns;
    case KVTIER__REQUEST__BODY_LIST: return q->list->ns[0] ? q->list->ns : NULL;
    case KVTIER__REQUEST__BODY_CLEAR:
    case KVTIER__REQUEST__BODY_EVICT:
    case KVTIER__REQUEST__BODY_FLUSH:
    case KVTIER__REQUEST__BODY_VERIFY:
    case KVTIER__REQUEST__BODY_PEERS: return NULL;
    default: return ""; /* HELLO, STATS, and what names this client's own */
    }
}

kvt_err tenant_check(struct tenants *t, uint32_t pipe, const Kvtier__Request *q,
                     char *why, size_t why_len)
{
    char w[64];
    if (!enabled(t)) return KVT_OK;
    const struct tconn *c = conn_of(t, pipe);
    if (c->operator_) return KVT_OK;
    if (c->tenant < 0) {
        snprintf(why, why_len, "%s belongs to no tenant: no tenants.tenant line "
                 "lists it", who(c, w, sizeof w));
        return KVT_EPERM;
    }
    const struct kvt_tenant *tn = &t->cfg->tenants.v[c->tenant];
    const char *ns = ns_of(q);
    if (!ns) {
        snprintf(why, why_len, "%s (tenant %s) is not an operator: this request "
                 "spans every tenant (tenants.admin_group)", who(c, w, sizeof w),
                 tn->name);
        return KVT_EPERM;
    }
    if (ns[0] && !prefix_ok(tn, ns)) {
        snprintf(why, why_len, "namespace '%.64s' is not tenant %s's (its "
                 "prefixes are set in tenants.tenant)", ns, tn->name);
        return KVT_EPERM;
    }
    return KVT_OK;
}

int tenant_ns_visible(struct tenants *t, uint32_t pipe, const char *ns)
{
    if (!enabled(t)) return 1;
    const struct tconn *c = conn_of(t, pipe);
    if (c->operator_) return 1;
    return c->tenant >= 0 && prefix_ok(&t->cfg->tenants.v[c->tenant], ns);
}

/* The pool's mode read as a file's would be, for the client's uid and
 * gid: rw for owner, group or others, whichever class it falls in. */
static int mode_lets(const struct tconn *c, unsigned mode, gid_t group)
{
    if (c->uid == 0 || c->uid == (uint32_t)geteuid()) return 1;
    if (in_group(c->uid, c->gid, group)) return (mode & 060) == 060;
    return (mode & 006) == 006;
}

int tenant_may_map(struct tenants *t, uint32_t pipe, unsigned mode, gid_t group)
{
    if (!t || pipe < LOCAL_ID_BASE) return 0;
    const struct tconn *c = conn_of(t, pipe);
    if (!c->has_cred) return 0;
    if (enabled(t) && !c->operator_ && c->tenant < 0) return 0;
    return mode_lets(c, mode, group);
}

int tenant_of(struct tenants *t, uint32_t pipe)
{
    if (!enabled(t)) return -1;
    return conn_of(t, pipe)->tenant;
}

int tenant_may_map_own(struct tenants *t, uint32_t pipe, int i)
{
    if (!enabled(t) || pipe < LOCAL_ID_BASE || i < 0) return 0;
    const struct tconn *c = conn_of(t, pipe);
    return c->has_cred && c->tenant == i;
}
