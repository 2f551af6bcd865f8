/*
 * lwatch.c -- the cluster's listener, and a watch that starts it again
 * when it no longer accepts.
 *
 * Why: under load a node's listener was seen to stop handing new
 * connections up for good while the pipes it had kept working: a member
 * that restarted dialled, its TLS and SP handshakes completed, and then
 * nothing read its connection (a Recv-Q that only grew on the accepted
 * socket, 30 s long), so the hello with it never completed and it was
 * never counted live again (test_cluster_eps, node 4 restarted and node 1
 * refused, 1 run in ~35 under load). The likely cause is nng 1.5 itself:
 * a connection whose negotiation fails hands its error to the listener's
 * pending accept, and on NNG_ECLOSED or NNG_ECANCELED the listener takes
 * "no further action" (core/listener.c) -- the connections that negotiate
 * after it wait in the transport for an accept that never comes.
 *
 * Design: nng says nothing when its listener stops, so the listener is
 * probed: LW_EVERY_MS after the last probe ended, a push socket dials our
 * own address (TLS: with our certificate, our own node name required) and
 * the probe passes once the pull socket reports a pipe added
 * (NNG_PIPE_EV_ADD_POST: any pipe will do, the listener still accepts).
 * No pipe within LW_PROBE_MS: the listener is closed -- its pipes with
 * it; members redial within 500 ms -- and a new one is started at the
 * same address, logged and counted (kvtier_cluster_listener_restarts_total).
 * The probe sends nothing; it costs one TLS handshake with ourselves
 * every 5 s. KVT_FAULT=listen_stop=N closes the listener at the Nth
 * probe's start, as nng's would stop.
 */
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "cluster_int.h"
#include "fault.h"
#include "log.h"
#include "nngclose.h"

#include <nng/protocol/pipeline0/push.h>

#define LW_EVERY_MS 5000u /* a probe starts this long after the last ended */
#define LW_PROBE_MS 5000u /* a probe that brings no pipe this long: restart */

/* Pipes the pull sockets took, counted on nng's threads. A process-wide
 * counter, not a field: a close abandoned past its bound leaves nng's
 * threads running after the cluster is freed. */
static atomic_uint_fast64_t added;

static void pipe_added(nng_pipe p, nng_pipe_ev ev, void *arg)
{
    (void)p, (void)ev, (void)arg;
    atomic_fetch_add(&added, 1);
}

int lw_listen(struct cl_ctx *d)
{
    struct cluster *c = d->cl;
    struct lwatch *w = &c->lw;
    nng_listener l;
    int rv = nng_listener_create(&l, c->pull, c->self_addr);
    if (rv == 0 && c->tls) rv = cl_tls_listener(d, l);
    if (rv == 0) rv = nng_listener_start(l, 0);
    if (rv != 0) return rv;
    w->l = l;
    w->l_open = 1;
    return 0;
}

int lw_open(struct cl_ctx *d)
{
    struct cluster *c = d->cl;
    c->lw.next_ms = cl_clock(d) + LW_EVERY_MS;
    int rv = nng_pipe_notify(c->pull, NNG_PIPE_EV_ADD_POST, pipe_added, NULL);
    return rv ? rv : lw_listen(d);
}

static void probe_close(struct lwatch *w)
{
    if (w->probe_open && nngc_close_bounded(&w->probe, 1, CL_CLOSE_ONE_MS, 0) != 0)
        log_warn("cluster", "the listener's probe socket did not close within %u ms (nng); "
                 "abandoned", CL_CLOSE_ONE_MS);
    w->probe_open = 0;
}

static void probe_start(struct cl_ctx *d, uint64_t now)
{
    struct cluster *c = d->cl;
    struct lwatch *w = &c->lw;
    nng_dialer dl;
    w->probes++;
    if (nng_push0_open(&w->probe) != 0) return;
    w->probe_open = 1;
    w->probe_added = atomic_load(&added);
    w->probe_until_ms = now + LW_PROBE_MS;
    int rv = nng_dialer_create(&dl, w->probe, c->self_addr);
    if (rv == 0 && c->tls) rv = cl_tls_dialer(d, dl, c->self_id, "listener probe");
    if (rv == 0) rv = nng_dialer_start(dl, NNG_FLAG_NONBLOCK);
    if (rv != 0) {
        log_warn("cluster", "probe of the listener at %s: %s", c->self_addr, nng_strerror(rv));
        probe_close(w);
    }
}

/* The probe brought no pipe: a new listener at the same address. */
static void restart(struct cl_ctx *d)
{
    struct cluster *c = d->cl;
    struct lwatch *w = &c->lw;
    log_warn("cluster", "listener at %s took no connection from this node within %u ms; "
             "listening again (members redial)", c->self_addr, LW_PROBE_MS);
    if (w->l_open) nng_listener_close(w->l);
    w->l_open = 0;
    w->restarts++;
    int rv = lw_listen(d);
    if (rv != 0)
        log_warn("cluster", "listen again at %s: %s (tried again in %u ms)", c->self_addr,
                 nng_strerror(rv), LW_EVERY_MS);
}

/* A probe in flight: passed once a pipe came up, else past its time the
 * listener is started again. */
static void probe_check(struct cl_ctx *d, uint64_t now)
{
    struct lwatch *w = &d->cl->lw;
    int passed = atomic_load(&added) != w->probe_added;
    if (!passed && now < w->probe_until_ms) return;
    probe_close(w);
    w->next_ms = now + LW_EVERY_MS;
    if (!passed) restart(d);
}

void lw_tick(struct cl_ctx *d)
{
    struct cluster *c = d->cl;
    struct lwatch *w = &c->lw;
    uint64_t now = cl_clock(d);
    if (w->probe_open) {
        probe_check(d, now);
        return;
    }
    if (now < w->next_ms) return;
    w->next_ms = now + LW_EVERY_MS;
    if (!w->l_open && lw_listen(d) != 0) return; /* a restart that failed */
    if (fault_hit(FAULT_LISTEN_STOP))
        nng_listener_close(w->l); /* l_open stays: restart closes it (ENOENT) */
    probe_start(d, now);
}

void lw_close(struct cl_ctx *d)
{
    probe_close(&d->cl->lw);
}
