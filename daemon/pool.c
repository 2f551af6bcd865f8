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
static void drop_kept(int fd)
{
    char err[256];
    close(fd);
    if (notify_send("FDSTOREREMOVE=1\nFDNAME=" DRAM_MEMFD_NAME, err, sizeof err) < 0)
        log_warn("dram", "%s", err);
}

/* The kept pool fd systemd handed back, if this run adopts a memfd and
 * the fd is fit; anything else handed back under the name is logged,
 * dropped from the store (a stale pool would hold its memory there for
 * as long as the unit lives) and closed. */
static int kept_fd(const struct kvtierd *d, int memfd)
{
    char err[256];
    int fd = notify_listen_fd(DRAM_MEMFD_NAME);
    if (fd < 0) return -1;
    if (!memfd || !d->cfg.dram_adopt) {
        log_info("dram", "dropping the pool fd kept in systemd's fd store: "
                 "this run %s", memfd ? "does not adopt (dram.adopt = 0)"
                                      : "uses a pool file (dram.pool)");
        drop_kept(fd);
        return -1;
    }
    if (dram_memfd_check(fd, d->cfg.pool_bytes, err, sizeof err) == KVT_OK) return fd;
    log_warn("dram", "refusing the pool fd handed back by the fd store (%s): "
             "%s; starting with a fresh pool", DRAM_MEMFD_NAME, err);
    drop_kept(fd);
    return -1;
}

/* A fresh memfd pool goes into the fd store, so the next start adopts it. */
static void store_fd(const struct kvtierd *d)
{
    char err[256];
    if (!d->cfg.dram_adopt) return; /* nothing to keep it for */
    int rv = notify_send_fd("FDSTORE=1\nFDNAME=" DRAM_MEMFD_NAME, d->dram->fd, err,
                            sizeof err);
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
                          kept_fd(d, memfd)};
    int kept = o.adopt_fd >= 0;
    if (dram_open_adopt(&o, (int)d->cfg.dram_adopt, &d->dram, err, sizeof err) != KVT_OK) {
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
        store_fd(d);
    return 0;
}
