/*
 * daemon.h -- start and stop real kvtierd processes from tests.
 *
 * Each daemon gets its own temporary directory (socket, state, log) and its
 * own pool file under /dev/shm, so tests never share state and may run
 * several daemons at once. The binary is $KVTIERD or build/bin/kvtierd.
 */
#ifndef KVT_TEST_DAEMON_H
#define KVT_TEST_DAEMON_H

#include <stdio.h>
#include <sys/types.h>

#include <nng/nng.h>

#include "kvtier.h"
#include "kvtier.pb-c.h"

struct tdaemon {
    pid_t pid;
    char dir[256];
    char sock[320];
    char pool[320];
    char log[320];
};

/* Make the directory and names; start nothing. */
int td_init(struct tdaemon *d);
/* Start kvtierd with these extra args (NULL-terminated, may be NULL) and
 * wait until it answers. 0 on success. */
int td_start(struct tdaemon *d, const char *const *extra);
/* Start without waiting; returns the pid. */
pid_t td_spawn(struct tdaemon *d, const char *const *extra);
/* The same two, handing fd (if >= 0) to the daemon as systemd hands back
 * a stored fd: as fd 3, with LISTEN_FDS=1, LISTEN_FDNAMES=name and
 * LISTEN_PID=its pid. */
int td_start_fd(struct tdaemon *d, const char *const *extra, int fd, const char *name);
pid_t td_spawn_fd(struct tdaemon *d, const char *const *extra, int fd, const char *name);
/* The same with n_fds fds (at most 16) under their names, as fds 3... */
int td_start_fds(struct tdaemon *d, const char *const *extra, const int *fds,
                 const char *const *names, int n_fds);
pid_t td_spawn_fds(struct tdaemon *d, const char *const *extra, const int *fds,
                   const char *const *names, int n_fds);
/* Wait for the process to exit (up to ms); its exit status or -1. */
int td_wait_exit(pid_t pid, int ms);
/* SIGTERM and wait; returns the exit status (0 = clean). */
int td_stop(struct tdaemon *d);
/* SIGKILL and reap. */
void td_kill(struct tdaemon *d);
/* Remove the directory and pool file. */
void td_cleanup(struct tdaemon *d);
/* Connect a client (asserts success). */
kvt_client *td_connect(const struct tdaemon *d);
/* A raw stream socket connected to the daemon's fast channel (its socket
 * path + ".fast"), for tests that speak the framing themselves; -1 on
 * failure. */
int td_fast_connect(const struct tdaemon *d);
/* HELLO over a raw fast-channel connection (td_fast_connect): the answer
 * into *r (free it with kvtier__response__free_unpacked) and the fd that
 * came with it into *fd (-1: none; the caller closes it). 0, or -1 if no
 * answer came or it does not parse. */
int td_fast_hello(const struct tdaemon *d, Kvtier__Response **r, int *fd);
/* A datagram socket bound at d's dir/notify, as systemd's
 * $NOTIFY_SOCKET; its path into path. The socket, or -1. */
int td_notify_socket(const struct tdaemon *d, char *path, size_t len);
/* Wait until end (td_now_ms) for one datagram on s: its text into buf
 * (NUL-ended), the fd that came with it into *fd (-1: none; the caller
 * closes it). Its length, or -1 if none came by then. */
int td_notify_recv(int s, char *buf, size_t len, int *fd, long long end);
/* Start a daemon of its own with extra and expect it to refuse: 0 if it
 * exits unsuccessfully within 10 s and its log contains says, else -1
 * (saying on stderr what the log lacks). Its files are removed. */
int td_refused(const char *const *extra, const char *says);
/* Run this test binary again (/proc/self/exe with argv, NULL-ended,
 * argv[0] its name) as uid and gid with no supplementary groups, and with
 * KVTIER_NO_FAST=1 when nng is set: its exit status; 100 the ids could
 * not be taken, 101 fork or wait failed, 102 killed by a signal, 103 exec
 * failed. A fresh process, not only a fork: nng's threads do not survive
 * a fork. */
int td_run_self_as(uid_t uid, gid_t gid, int nng, const char *const *argv);
/* In such a child: report the failed check and return 1 (its status). */
#define TD_CK(x)                                                               \
    do {                                                                       \
        if (!(x)) {                                                            \
            fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #x); \
            return 1;                                                          \
        }                                                                      \
    } while (0)
/* 1 if the daemon's log contains s. */
int td_log_has(const struct tdaemon *d, const char *s);
/* A tcp port on 127.0.0.1 free right now (bound, read back, closed):
 * fixed ranges collide with ephemeral ports and concurrent suites. */
int td_free_port(void);
/* 1 if the process still runs (not exited, not a zombie). */
int td_alive(const struct tdaemon *d);

/*
 * Clusters of real daemons on loopback: node i (0-based) has node id i+1,
 * listens on url[i] (a free port picked by tc_init) and is seeded by node
 * seed[i] (node 0 unless set; node 0 itself has no seed). Heartbeats every 100 ms; a node silent for fail_ms is dead.
 * The control channel is TLS (tls+tcp://) with node i presenting
 * tc_certs()/node-<i+1>.crt, unless insecure is set (tcp://,
 * cluster.insecure = 1) or cert[i] names another certificate of
 * tc_certs() ("foreign-4", "expired-2", ...).
 */
#define TC_MAX 4
struct tcluster {
    int n;
    int insecure;
    struct tdaemon d[TC_MAX];
    char url[TC_MAX][64];
    kvt_client *c[TC_MAX]; /* one client per started node */
    int seed[TC_MAX];      /* node i's seed is node seed[i] (default 0) */
    const char *cert[TC_MAX];
};
/* n nodes, none started; ports are picked as each starts. */
void tc_init(struct tcluster *c, int n);
/* Start node i with the cluster args, then extra (NULL-ended, may be
 * NULL), and connect c->c[i]. url[i] is set by then. 0, or -1. */
int tc_start(struct tcluster *c, int i, int fail_ms, const char *const *extra);
/* Close node i's client, SIGTERM it: 0, or -1 if it did not stop
 * cleanly (a sanitizer report is an unclean stop). */
int tc_stop(struct tcluster *c, int i);
/* Stop every node, remove their files: 0, or -1 if one was unclean. */
int tc_teardown(struct tcluster *c);
/* Wait (up to 30 s) until node i sees `alive` members alive and, with
 * ucx set, has the peer tier and endpoints to them. 0, or -1. */
int tc_wait_alive(struct tcluster *c, int i, int alive, int ucx);

/* The directory of test certificates (tests/lib/mkcerts.sh: ca.crt,
 * node-N, foreign-N, expired-N for N = 1..8), made once per process with
 * the openssl CLI and removed at exit. Exits 77 (skip) without openssl. */
const char *tc_certs(void);
/* The --cluster.tls_* arguments for certificate `name` of tc_certs()
 * into argv[0..6); returns 6. */
int tc_tls_args(const char **argv, const char *name);
/* Open a push socket on s and dial url: over TLS with certificate `name`
 * of tc_certs() (NULL: none, only the CA) and the test CA (foreign: the
 * other CA). Blocks until connected; the nng result. */
int tc_dial(nng_socket *s, const char *url, const char *name, int foreign);
/* Close a socket a test dialled to a daemon, waiting at most 3 s: libnng
 * 1.5 can deadlock in nng_close while its dialer races the peer's exit
 * (nngclose.h); the test then goes on and the socket is left to exit. */
void tc_close(nng_socket s);

/* Ask c for the cluster's view (PEERS): the call's result; on KVT_OK *r
 * holds the answer (free it with kvtier__response__free_unpacked). */
kvt_err tc_peers(kvt_client *c, Kvtier__Response **r);

/* The uint64 field at byte offset off (offsetof(Kvtier__PeersResp, f))
 * of c's PEERS answer; aborts, saying why, if the call fails. */
uint64_t tc_counter(kvt_client *c, size_t off);

/* Inline GET on c of the key of `seed` in ns, whose chunk holds size
 * bytes made by td_fill(seed): 1 found with exactly those bytes, 0
 * missed, -1 the call failed or a byte is wrong. */
int tc_get_checked(kvt_client *c, const char *ns, uint64_t seed, size_t size,
                   uint32_t deadline_ms);

/* PUT on c, in ns, the key of `seed` with one chunk of size bytes made
 * by td_fill(seed): the call's result. */
kvt_err tc_put(kvt_client *c, const char *ns, uint64_t seed, size_t size);
/* LOOKUP on c, in ns, of the keys of seeds first..first+n-1 (n at most
 * TC_LOOKUP_MAX), local_only as the request's flag: how many are present,
 * each key's tier in tiers[] when not NULL; -1 the call failed. */
#define TC_LOOKUP_MAX 64
int tc_lookup(kvt_client *c, const char *ns, uint64_t first, uint32_t n, int local_only,
              int *tiers);
/* LOOKUP on c of the key of `seed` in ns: 1 found (any tier), 0 not, -1
 * the call failed. */
int tc_found(kvt_client *c, const char *ns, uint64_t seed);
/* Poll tc_found every 25 ms for up to ms: 0 once found, -1 if never (or
 * a call failed). */
int tc_wait_found(kvt_client *c, const char *ns, uint64_t seed, int ms);

/* Milliseconds on a monotonic clock. */
long long td_now_ms(void);
/* Deterministic bytes for (seed, i), and a key from a seed. */
void td_fill(void *buf, size_t n, uint64_t seed);
kvt_key td_key(uint64_t seed);

#endif
