/*
 * etcdtest.h -- a real etcd for tests, on loopback in a temporary
 * directory.
 *
 * One single-member etcd per struct: its data and log (etcd.log) live in
 * dir, its client and peer urls are free ports picked at init. Killed with
 * SIGKILL and started again it keeps its data (same dir, same urls), so a
 * test can take etcd away and bring it back.
 */
#ifndef KVT_TEST_ETCDTEST_H
#define KVT_TEST_ETCDTEST_H

#include <sys/types.h>

struct tetcd {
    pid_t pid; /* -1 while not running */
    char dir[256];
    char url[128];  /* client url: http://127.0.0.1:<port> */
    char peer[128]; /* peer url */
};

/* Exit 77 (skip) if etcd is not installed; else make the directory
 * /tmp/kvt-<tag>-XXXXXX and pick the urls, starting nothing. 0, or -1. */
int te_init(struct tetcd *e, const char *tag);
/* Start etcd and wait (up to 20 s) until it answers a range of prefix.
 * 0, or -1. */
int te_start(struct tetcd *e, const char *prefix);
/* SIGKILL and reap it, if running. */
void te_kill(struct tetcd *e);
/* te_kill, then remove the directory: 0, or -1. */
int te_cleanup(struct tetcd *e);

#endif
