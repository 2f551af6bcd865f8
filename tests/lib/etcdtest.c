/*
 * etcdtest.c -- start, wait for, kill and clean up a real etcd (see
 * etcdtest.h). Readiness is etcd answering a range through the same
 * client the daemon uses (tiers/peer/etcd_client.c), not a sleep.
 */
#include "etcdtest.h"

#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include "daemon.h"
#include "peer/etcd_client.h"

int te_init(struct tetcd *e, const char *tag)
{
    e->pid = -1;
    if (system("command -v etcd >/dev/null 2>&1") != 0) {
        fprintf(stderr, "etcd is not installed (scripts/deps.sh installs etcd-server)\n");
        exit(77);
    }
    snprintf(e->dir, sizeof e->dir, "/tmp/kvt-%s-XXXXXX", tag);
    if (!mkdtemp(e->dir)) return -1;
    snprintf(e->url, sizeof e->url, "http://127.0.0.1:%d", td_free_port());
    snprintf(e->peer, sizeof e->peer, "http://127.0.0.1:%d", td_free_port());
    return 0;
}

static void spawn(struct tetcd *e)
{
    /* --initial-cluster must name this member and its peer url */
    char data[300], cl[200], log[300];
    snprintf(data, sizeof data, "%s/data", e->dir);
    snprintf(cl, sizeof cl, "default=%s", e->peer);
    snprintf(log, sizeof log, "%s/etcd.log", e->dir);
    e->pid = fork();
    if (e->pid == 0) {
        if (!freopen(log, "a", stdout) || !freopen(log, "a", stderr)) _exit(126);
        execlp("etcd", "etcd", "--data-dir", data, "--listen-client-urls", e->url,
               "--advertise-client-urls", e->url, "--listen-peer-urls", e->peer,
               "--initial-advertise-peer-urls", e->peer, "--initial-cluster", cl,
               (char *)NULL);
        _exit(127);
    }
}

static void nothing(void *arg, const uint8_t *k, size_t kl, const uint8_t *v, size_t vl,
                    int del, int64_t rev)
{
    (void)arg, (void)k, (void)kl, (void)v, (void)vl, (void)del, (void)rev;
}

int te_start(struct tetcd *e, const char *prefix)
{
    spawn(e);
    if (e->pid < 0) return -1;
    char err[256];
    struct ec *ec = ec_new(e->url, 500, err, sizeof err);
    int64_t rev;
    int rc = -1;
    for (long long end = td_now_ms() + 20000; ec && td_now_ms() < end && rc < 0;) {
        rc = ec_range_prefix(ec, prefix, nothing, NULL, &rev, err, sizeof err);
        if (rc < 0) usleep(100 * 1000);
    }
    ec_free(ec);
    return rc;
}

void te_kill(struct tetcd *e)
{
    if (e->pid <= 0) return;
    kill(e->pid, SIGKILL);
    waitpid(e->pid, NULL, 0);
    e->pid = -1;
}

int te_cleanup(struct tetcd *e)
{
    te_kill(e);
    if (!e->dir[0]) return 0;
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", e->dir);
    return system(cmd) == 0 ? 0 : -1;
}
