/*
 * pool.c -- which DRAM pool kvtierd runs on, and how it outlives a restart.
 *
 * Design: a file pool (dram.pool = file) is found again by its path, so
 * any restart adopts it; but every client opens it by name and can
 * truncate it. A memfd pool (memfd) has no name and is sealed, so clients
 * receive it only from the daemon (handlers.c give_pool_fd) and cannot cut
 * it; its one way across a restart is systemd's fd store: once made it is
 * sent with FDSTORE=1 and FDNAME=kvtier-pool, and the next start finds it
 * in LISTEN_FDS. Only a sealed memfd of exactly the pool's size is taken
 * back, and then the journal decides which chunks are adopted, as for the
 * file. dram.pool = auto picks memfd where that round trip is there
 * ($FDSTORE, which systemd sets when FileDescriptorStoreMax= > 0) and the
 * fast channel can carry fds, file elsewhere.
 *
 * A tenant with pool= gets a pool of its own of the same kind, mapped
 * after the default one (dram_add_pool): a file <pool_path>.<name> of
 * mode 0600 that only the daemon opens (its clients are handed its fd,
 * never its path), or a memfd kept in the fd store as
 * kvtier-pool-<name>. Its namespaces (its prefixes, which meet no other
 * tenant's) are stored only there (pool_of_ns).
 */
#include "pool.h"

#include <grp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kvtierd.h"
#include "log.h"
#include "notify.h"

static int want_memfd(const struct kvt_config *c)
{
    const char *store = getenv("FDSTORE");
    if (!strcmp(c->pool_kind, "memfd")) return 1;
    if (strcmp(c->pool_kind, "auto")) return 0;
    return store && strtol(store, NULL, 10) > 0 && c->local_fast &&
           !strncmp(c->socket, "ipc://", 6);
}

/* Take a kept fd out of systemd's store, and close it. */
static void drop_kept(int fd, const char *name)
{
    char err[256], state[128];
    close(fd);
    snprintf(state, sizeof state, "FDSTOREREMOVE=1\nFDNAME=%s", name);
    if (notify_send(state, err, sizeof err) < 0) log_warn("dram", "%s", err);
}

/* The kept pool fd named name systemd handed back, if this run adopts a
 * memfd and the fd is fit (bytes); anything else handed back under the
 * name is logged, dropped from the store (a stale pool would hold its
 * memory there for as long as the unit lives) and closed. */
static int kept_fd(const struct kvtierd *d, int memfd, const char *name,
                   uint64_t bytes)
{
    char err[256];
    int fd = notify_listen_fd(name);
    if (fd < 0) return -1;
    if (!memfd || !d->cfg.dram_adopt) {
        log_info("dram", "dropping the pool fd %s kept in systemd's fd store: "
                 "this run %s", name, memfd ? "does not adopt (dram.adopt = 0)"
                                            : "uses a pool file (dram.pool)");
        drop_kept(fd, name);
        return -1;
    }
    if (dram_memfd_check(fd, bytes, err, sizeof err) == KVT_OK) return fd;
    log_warn("dram", "refusing the pool fd handed back by the fd store (%s): "
             "%s; starting with a fresh pool", name, err);
    drop_kept(fd, name);
    return -1;
}

/* A fresh memfd pool goes into the fd store, so the next start adopts it. */
static void store_fd(const struct kvtierd *d, const char *name, int fd)
{
    char err[256], state[128];
    if (!d->cfg.dram_adopt) return; /* nothing to keep it for */
    snprintf(state, sizeof state, "FDSTORE=1\nFDNAME=%s", name);
    int rv = notify_send_fd(state, fd, err, sizeof err);
    if (rv < 0) log_warn("dram", "%s: the pool will not outlive this run", err);
    else if (rv == 0)
        log_info("dram", "dram.pool = memfd without systemd's fd store "
                 "($NOTIFY_SOCKET unset): the DRAM cache is not kept across "
                 "restarts (dram.pool = file keeps it)");
}

static unsigned group_of(const char *name)
{
    const struct group *g = name[0] ? getgrnam(name) : NULL;
    return g ? (unsigned)g->gr_gid : (unsigned)getegid();
}

int pool_open(struct kvtierd *d)
{
    char err[512] = "";
    int memfd = want_memfd(&d->cfg);
    struct dram_opts o = {d->cfg.pool_path, d->cfg.pool_bytes,
                          (unsigned)d->cfg.pool_mode, d->cfg.pool_group, memfd,
                          kept_fd(d, memfd, DRAM_MEMFD_NAME, d->cfg.pool_bytes)};
    int kept = o.adopt_fd >= 0;
    if (dram_open_pools(&o, (int)d->cfg.dram_adopt, pool_reserve(&d->cfg), &d->dram, err,
                        sizeof err) != KVT_OK) {
        log_error("dram", "%s", err);
        return -1;
    }
    d->pool_gid = group_of(d->cfg.pool_group);
    if (memfd && (!d->cfg.local_fast || strncmp(d->cfg.socket, "ipc://", 6)))
        log_warn("dram", "dram.pool = memfd without the fast channel (an ipc:// "
                 "daemon.socket and daemon.local_fast = 1): no client can be "
                 "handed the pool, all of them copy");
    if (memfd && kept)
        log_info("dram", "pool: the memfd kept in systemd's fd store (%llu MiB)",
                 (unsigned long long)(d->dram->bytes >> 20));
    else if (memfd)
        store_fd(d, DRAM_MEMFD_NAME, d->dram->fd);
    return 0;
}

uint64_t pool_reserve(const struct kvt_config *c)
{
    uint64_t n = c->pool_bytes / DRAM_UNIT * DRAM_UNIT;
    for (uint32_t i = 0; i < c->tenants.n; i++)
        n += c->tenants.v[i].pool_bytes / DRAM_UNIT * DRAM_UNIT;
    return n;
}

/* Tenant i's own pool, as the default one is opened. */
static int open_tenant(struct kvtierd *d, uint32_t i, int memfd)
{
    const struct kvt_tenant *tn = &d->cfg.tenants.v[i];
    char err[512] = "", path[CFG_STR_MAX + 80], name[96];
    snprintf(path, sizeof path, "%s.%s", d->cfg.pool_path, tn->name);
    snprintf(name, sizeof name, "%s-%s", DRAM_MEMFD_NAME, tn->name);
    struct dram_opts o = {path, tn->pool_bytes, 0600, NULL, memfd,
                          kept_fd(d, memfd, name, tn->pool_bytes)};
    int kept = o.adopt_fd >= 0;
    if (dram_add_pool(d->dram, &o, name, (int)d->cfg.dram_adopt, &d->tenant_pool[i],
                      err, sizeof err) != KVT_OK) {
        log_error("dram", "tenant %s's pool: %s", tn->name, err);
        return -1;
    }
    const struct dram_seg *s = &d->dram->seg[d->tenant_pool[i]];
    log_info("dram", "tenant %s: a pool of its own, %s (%llu MiB)%s", tn->name, s->path,
             (unsigned long long)(s->bytes >> 20), s->adopted ? ", kept" : "");
    if (memfd && !kept) store_fd(d, name, s->fd);
    return 0;
}

int pool_open_tenants(struct kvtierd *d)
{
    int memfd = d->dram->memfd;
    for (uint32_t i = 0; i < d->cfg.tenants.n; i++) {
        d->tenant_pool[i] = 0;
        if (d->cfg.tenants.v[i].pool_bytes && open_tenant(d, i, memfd) != 0) return -1;
    }
    if (d->dram->n_seg > 1 && !d->cfg.local_fast)
        log_warn("dram", "tenants' own pools are handed out only on the fast channel "
                 "(daemon.local_fast = 0): their clients copy");
    return 0;
}

static int has_prefix(const struct kvt_tenant *t, const char *ns)
{
    for (uint32_t i = 0; i < t->n_prefixes; i++)
        if (!strncmp(ns, t->prefixes[i], strlen(t->prefixes[i]))) return 1;
    return 0;
}

uint32_t pool_of_ns(const struct kvtierd *d, const char *ns)
{
    if (d->dram->n_seg < 2) return 0;
    for (uint32_t i = 0; i < d->cfg.tenants.n; i++)
        if (d->tenant_pool[i] && has_prefix(&d->cfg.tenants.v[i], ns))
            return d->tenant_pool[i];
    return 0;
}
