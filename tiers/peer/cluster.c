/*
 * cluster.c -- membership: join, heartbeats, failure detection, epochs.
 *
 * Design (DESIGN §5): every daemon with cluster.listen set listens there
 * with an nng pull0 socket and has one push0 socket per member it sends
 * to, dialled on the first send with nng's own reconnect, so a restarted
 * peer is reached again without help. At most cluster.max_conns are in
 * use; past that the least recently used drains for CL_LINGER_MS and is
 * closed (bounded) at a tick. Sends are non-blocking: a message for a
 * member with no connection is dropped, never queued behind a dead peer.
 * The member table has no cap: members are allocated one by one (stable
 * pointers) and hashed by id and by url. nng's receive
 * callback stamps each message with the time it ARRIVED, queues it
 * (bounded: cluster.rx_queue_max, past it dropped and counted) and writes an eventfd
 * when the queue goes from empty to non-empty (STYLE §7); the core thread
 * decodes and applies it, so the member table needs no lock.
 *
 * Who is alive is the membership backend's business (member.h, picked by
 * cluster.membership): swim.c (default; its datagrams ride in PeerMsg.swim
 * over these same sockets and go to mb_receive with their arrival stamp)
 * or etcd.c (a lease and a watch). Its change callback drives this
 * table: a member known to it is dialled, one it holds alive or suspect
 * AND that has done the pairwise hello below is ALIVE here, dead or left
 * is DEAD or LEFT (its UCX endpoint is dropped), and a reaped one leaves
 * the table. The global index hears only transitions of that live set
 * (gx_membership). Nothing is sent to every member on a timer: the cost
 * per node is the backend's (SWIM: one probe per period).
 *
 * The pairwise hello: Join until the pair has proven its ids to each
 * other (below), then Heartbeats only until the peer holds our UCX
 * identity (the endpoint to a member is made on the first fetch from it
 * and capped, pget.c). Both carry the sender's identity (node id, control url,
 * incarnation = its start time); a Join is accepted from anyone with a
 * well-formed identity (a Join is how a node enters). Any other message
 * from a sender not in the table (id and url both) is refused with a log
 * line and a counter, as is anything that does not decode; neither
 * changes the table. A newer incarnation is a restart: the member's
 * endpoint is dropped and the index told it lost everything. The round
 * trip is measured on every membership datagram (PeerSwim echoes the last
 * send time heard from the receiver).
 *
 * Identity (cluster.tls_*, the default): the control channel is nng's
 * tls+tcp with mutual authentication against cluster.tls_ca, so nothing
 * without a certificate from that CA reaches cl_apply(). nng 1.5 does not
 * tell a listener which certificate a pipe presented, so the id a message
 * claims is proven the other way round: every dial to member N requires
 * the name kvtier-node-N in the certificate of whoever answers there, and
 * the messages sent on it carry a random secret (auth_chal) made for N.
 * Only N's certificate can read it; N echoes it (auth_proof) in what it
 * sends back. A message whose proof does not match the secret made for
 * the id it claims is refused and counted (unproven); it changes nothing
 * but may answer a Join (over the named dial, so the real N learns our
 * secret and a restarted N is let in a heartbeat later). A member's
 * address moves only on a proven message, or while it is not alive (the
 * new address is dialled with N's name required, so only N can answer
 * there). The UCX rkey, worker address and pool base go only to members
 * that proved their id, in the hello, never in membership metadata.
 * Membership datagrams are accepted only from a sender proven this way
 * whose SwimMsg names the same id and url, and are sent only to members
 * whose secret we hold (others would refuse them): gossip cannot be
 * injected under another member's id. cluster.insecure = 1 keeps plain
 * tcp, where every claim is believed: a warning in the log, kvtierctl
 * peers and metrics.
 */
#include "cluster.h"

#include <errno.h>
#include <nng/nng.h>
#include <nng/protocol/pipeline0/pull.h>
#include <nng/protocol/pipeline0/push.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

#include "log.h"
#include "cluster_int.h"
#include "etcd.h"
#include "fault.h"
#include "nngclose.h"
#include "peer.h"
#include "swim.h"
#include "tlsconf.h"

/* ns on the monotonic clock (heartbeat round trips, incarnations). */
static uint64_t mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* The membership's clock (and the receive stamps): ms, CLOCK_MONOTONIC,
 * the clock of the timerfd that wakes it. */
static uint64_t mono_ms(void)
{
    return mono_ns() / 1000000;
}

/* ------------------------------------------------------------ receiving */

static void recv_cb(void *arg)
{
    struct cluster *c = arg;
    if (nng_aio_result(c->aio) != 0) {
        if (!c->closing) nng_recv_aio(c->pull, c->aio);
        return;
    }
    nng_msg *msg = nng_aio_get_msg(c->aio);
    uint64_t rx = mono_ms();
    pthread_mutex_lock(&c->q_mtx);
    if (c->q_len >= c->q_max) { /* the core thread is this far behind */
        c->q_drops++;
        pthread_mutex_unlock(&c->q_mtx);
        nng_msg_free(msg);
        if (!c->closing) nng_recv_aio(c->pull, c->aio);
        return;
    }
    struct qmsg *q = malloc(sizeof *q);
    if (!q) abort(); /* control-plane allocation */
    q->m = msg;
    q->rx_ms = rx;
    q->next = NULL;
    c->q_len++;
    int was_empty = c->q_head == NULL;
    if (c->q_tail) c->q_tail->next = q;
    else c->q_head = q;
    c->q_tail = q;
    pthread_mutex_unlock(&c->q_mtx);
    if (was_empty) {
        uint64_t one = 1;
        ssize_t w = write(c->efd, &one, sizeof one);
        (void)w;
    }
    if (!c->closing) nng_recv_aio(c->pull, c->aio);
}

static struct qmsg *take_all(struct cluster *c)
{
    uint64_t v;
    ssize_t r = read(c->efd, &v, sizeof v);
    (void)r;
    pthread_mutex_lock(&c->q_mtx);
    struct qmsg *q = c->q_head;
    c->q_head = c->q_tail = NULL;
    c->q_len = 0;
    pthread_mutex_unlock(&c->q_mtx);
    return q;
}

/* -------------------------------------------------------------- members */

/* The table's hash chains: by id (FNV-1a of the 4 bytes) and by address
 * (FNV-1a of the string). Both hold every member, gone ones included
 * until compact() frees them; lookups skip the gone. */
static uint32_t fnv(const void *p, size_t n)
{
    const uint8_t *b = p;
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 16777619u;
    return h;
}

static struct member **id_head(struct cluster *c, uint32_t id)
{
    return &c->by_id[fnv(&id, sizeof id) & (c->nb - 1)];
}

static struct member **addr_head(struct cluster *c, const char *addr)
{
    return &c->by_addr[fnv(addr, strlen(addr)) & (c->nb - 1)];
}

static void link_member(struct cluster *c, struct member *m)
{
    struct member **h = id_head(c, m->id), **a = addr_head(c, m->addr);
    m->id_next = *h;
    *h = m;
    m->addr_next = *a;
    *a = m;
}

static void unlink_member(struct cluster *c, struct member *m)
{
    struct member **p = id_head(c, m->id);
    while (*p != m) p = &(*p)->id_next;
    *p = m->id_next;
    p = addr_head(c, m->addr);
    while (*p != m) p = &(*p)->addr_next;
    *p = m->addr_next;
}

/* Room for one more member: the index doubles, the chains are rebuilt
 * with twice the buckets when members would outnumber them. */
static void table_grow(struct cluster *c)
{
    if (c->n == c->cap) {
        c->cap = c->cap ? 2 * c->cap : 16;
        if (!(c->m = realloc(c->m, c->cap * sizeof *c->m))) abort();
    }
    if (c->n < c->nb) return;
    free(c->by_id);
    free(c->by_addr);
    c->nb = c->nb ? 2 * c->nb : 64;
    c->by_id = calloc(c->nb, sizeof *c->by_id);
    c->by_addr = calloc(c->nb, sizeof *c->by_addr);
    if (!c->by_id || !c->by_addr) abort(); /* control-plane allocation */
    for (uint32_t i = 0; i < c->n; i++) link_member(c, c->m[i]);
}

struct member *cl_member_new(struct cluster *c, uint32_t id, const char *addr)
{
    table_grow(c);
    struct member *m = calloc(1, sizeof *m);
    if (!m) abort();
    m->id = id;
    snprintf(m->addr, sizeof m->addr, "%s", addr);
    m->slot = c->n;
    c->m[c->n++] = m;
    link_member(c, m);
    return m;
}

void cl_member_drop(struct cluster *c, struct member *m)
{
    unlink_member(c, m);
    c->m[m->slot] = c->m[--c->n];
    c->m[m->slot]->slot = m->slot;
    free(m->ucx_id);
    free(m);
}

void cl_members_free(struct cluster *c)
{
    for (uint32_t i = 0; i < c->n; i++) {
        if (c->m[i]->open) nng_close(c->m[i]->push); /* none after close_sockets */
        free(c->m[i]->ucx_id);
        free(c->m[i]);
    }
    free(c->m);
    free(c->by_id);
    free(c->by_addr);
    c->m = c->by_id = c->by_addr = NULL;
    c->n = c->cap = c->nb = 0;
}

/* A member's id or address changes: its chains with it. */
static void member_rekey(struct cluster *c, struct member *m, uint32_t id, const char *addr)
{
    unlink_member(c, m);
    m->id = id;
    if (addr) snprintf(m->addr, sizeof m->addr, "%s", addr);
    link_member(c, m);
}

/* O(1) for members the backend knows (their record points here); the
 * id chain for the rest (a node heard only through its Join so far). */
struct member *cl_find(struct cluster *c, uint32_t id)
{
    const struct mb_member *b = c->mb && id ? mb_find(c->mb, id) : NULL;
    if (b && b->user && b->id != c->self_id) return b->user;
    if (!c->nb) return NULL;
    for (struct member *m = *id_head(c, id); m; m = m->id_next)
        if (m->id == id && !m->gone) return m;
    return NULL;
}

static int hello_done(const struct cluster *c, const struct member *m);

/* The member at addr; where two are (a node restarted there under
 * another id), the one whose hello is done. */
static struct member *find_addr(struct cluster *c, const char *addr)
{
    struct member *any = NULL;
    if (!c->nb) return NULL;
    for (struct member *m = *addr_head(c, addr); m; m = m->addr_next) {
        if (m->gone || strcmp(m->addr, addr) != 0) continue;
        if (hello_done(c, m)) return m;
        if (!any) any = m;
    }
    return any;
}

static struct member *find_seed(struct cluster *c, const char *addr)
{
    if (!c->nb) return NULL;
    for (struct member *m = *addr_head(c, addr); m; m = m->addr_next)
        if (m->id == 0 && !m->gone && !strcmp(m->addr, addr)) return m;
    return NULL;
}

/* Our TLS config (cluster.tls_*): the server side, or a client that
 * requires node peer's name in the certificate that answers (0: any node
 * the CA signed). NULL, logged with `what`, when it cannot be built. */
static nng_tls_config *tls_config(struct cl_ctx *d, int server, uint32_t peer,
                                  const char *what)
{
    char name[32], err[256];
    struct tlsconf_files f = {d->cfg.cluster_tls_ca, d->cfg.cluster_tls_cert,
                              d->cfg.cluster_tls_key};
    nng_tls_config *cfg;
    snprintf(name, sizeof name, "kvtier-node-%u", (unsigned)peer);
    if (tlsconf_build(&cfg, server, &f, peer ? name : NULL, err, sizeof err) != 0) {
        log_warn("cluster", "%s: TLS: %s", what, err);
        return NULL;
    }
    return cfg;
}

int cl_tls_listener(struct cl_ctx *d, nng_listener l)
{
    nng_tls_config *cfg = tls_config(d, 1, 0, d->cl->self_addr);
    if (!cfg) return NNG_EINVAL;
    int rv = nng_listener_set_ptr(l, NNG_OPT_TLS_CONFIG, cfg);
    nng_tls_config_free(cfg);
    return rv;
}

int cl_tls_dialer(struct cl_ctx *d, nng_dialer dl, uint32_t peer, const char *what)
{
    nng_tls_config *cfg = tls_config(d, 0, peer, what);
    if (!cfg) return NNG_EINVAL;
    int rv = nng_dialer_set_ptr(dl, NNG_OPT_TLS_CONFIG, cfg);
    nng_tls_config_free(cfg);
    return rv;
}

/* The dialer's TLS: m's node name required in the certificate that
 * answers (none for a seed not heard from). */
static int dial_tls(struct cl_ctx *d, struct member *m, nng_dialer dl)
{
    int rv = cl_tls_dialer(d, dl, m->id, m->addr);
    m->named = rv == 0 && m->id != 0;
    return rv;
}

/* ------------------------------------------------------- connections */

void cl_ml_unlink(struct mlist *l, int k, struct member *m)
{
    struct mlink *e = &m->lk[k];
    if (e->prev) e->prev->lk[k].next = e->next;
    else l->head = e->next;
    if (e->next) e->next->lk[k].prev = e->prev;
    else l->tail = e->prev;
    e->prev = e->next = NULL;
    l->n--;
}

void cl_ml_push(struct mlist *l, int k, struct member *m, int at_head)
{
    struct mlink *e = &m->lk[k];
    e->prev = at_head ? NULL : l->tail;
    e->next = at_head ? l->head : NULL;
    if (at_head && l->head) l->head->lk[k].prev = m;
    if (!at_head && l->tail) l->tail->lk[k].next = m;
    if (at_head) l->head = m;
    else l->tail = m;
    if (!l->head) l->head = m;
    if (!l->tail) l->tail = m;
    l->n++;
}

static void ml_unlink(struct mlist *l, struct member *m)
{
    cl_ml_unlink(l, CL_LK_PUSH, m);
}

static void ml_push(struct mlist *l, struct member *m, int at_head)
{
    cl_ml_push(l, CL_LK_PUSH, m, at_head);
}

/* Take m off the list its socket is on (if any). */
static void conn_unlist(struct cluster *c, struct member *m)
{
    if (m->on_list) ml_unlink(m->on_list == 1 ? &c->lru : &c->linger, m);
    m->on_list = 0;
}

/* Close sockets on the core thread within CL_CLOSE_ONE_MS (nng 1.5's
 * close can hang while a dialer reconnects to a peer that is stopping:
 * DESIGN-NOTES "Bounded shutdown"); past it they are abandoned. */
static void socks_close(const nng_socket *s, size_t n)
{
    if (n && nngc_close_bounded(s, n, CL_CLOSE_ONE_MS, fault_hit(FAULT_CONN_CLOSE_HANG)) != 0)
        log_warn("cluster", "%zu socket(s) did not close within %u ms (nng); abandoned",
                 n, CL_CLOSE_ONE_MS);
}

static void member_dial(struct cl_ctx *d, struct member *m)
{
    nng_dialer dl;
    m->named = 0;
    if (nng_push0_open(&m->push) != 0) return;
    m->open = 1;
    nng_socket_set_ms(m->push, NNG_OPT_RECONNMINT, 50);
    nng_socket_set_ms(m->push, NNG_OPT_RECONNMAXT, 500);
    nng_socket_set_ms(m->push, NNG_OPT_SENDTIMEO, 0);
    /* Room for bursts (pins, index batches): a send fails only when the
     * peer is gone or this far behind. */
    nng_socket_set_int(m->push, NNG_OPT_SENDBUF, 1024);
    int rv = nng_dialer_create(&dl, m->push, m->addr);
    if (rv == 0 && d->cl->tls) rv = dial_tls(d, m, dl);
    if (rv == 0) rv = nng_dialer_start(dl, NNG_FLAG_NONBLOCK);
    if (rv != 0) log_warn("cluster", "dial %s: %s", m->addr, nng_strerror(rv));
}

/* Close m's socket now (its address or required name changed, or it
 * leaves the table); the next send dials again. */
static void member_undial(struct cluster *c, struct member *m)
{
    conn_unlist(c, m);
    if (m->open) socks_close(&m->push, 1);
    m->open = 0;
}

/* Past cluster.max_conns in use, the least recently used (never keep,
 * just used) starts draining. */
static void conns_trim(struct cl_ctx *d, struct member *keep)
{
    struct cluster *c = d->cl;
    uint64_t max = d->cfg.cluster_max_conns;
    while (max && c->lru.n > max && c->lru.tail != keep) {
        struct member *v = c->lru.tail;
        conn_unlist(c, v);
        v->linger_ms = mono_ms() + CL_LINGER_MS;
        ml_push(&c->linger, v, 0);
        v->on_list = 2;
        c->lru_closes++;
    }
}

/* m is about to be sent to: dialled if it has no socket, taken back if
 * its socket drains, and first in the LRU. 0, or -1 (no socket). */
static int conn_use(struct cl_ctx *d, struct member *m)
{
    struct cluster *c = d->cl;
    if (!m->open) member_dial(d, m);
    if (!m->open) return -1;
    conn_unlist(c, m);
    ml_push(&c->lru, m, 1);
    m->on_list = 1;
    conns_trim(d, m);
    return 0;
}

/* Close the drained sockets whose time is up (a bounded batch a tick). */
static void linger_tick(struct cluster *c)
{
    nng_socket s[64];
    size_t n = 0;
    uint64_t now = mono_ms();
    while (c->linger.head && c->linger.head->linger_ms <= now && n < 64) {
        struct member *m = c->linger.head;
        conn_unlist(c, m);
        s[n++] = m->push;
        m->open = 0;
    }
    socks_close(s, n);
}

/* A new table entry (JOINING) dialled at addr. */
static struct member *member_add(struct cl_ctx *d, uint32_t id, const char *addr,
                                 uint64_t inc)
{
    struct member *m = cl_member_new(d->cl, id, addr);
    m->inc = inc;
    m->state = KVTIER__PEER_STATE__PEER_JOINING;
    if (getrandom(m->chal, sizeof m->chal, 0) != (ssize_t)sizeof m->chal) abort();
    return m;
}

/* A seed's id is now known: over TLS, dial it again requiring its name,
 * so that our secret for it can travel. */
static void member_named(struct cl_ctx *d, struct member *m, uint32_t id)
{
    member_rekey(d->cl, m, id, NULL);
    if (d->cl->tls) member_undial(d->cl, m); /* the next send dials it named */
}

/* Dial m at a new address (its id proven, or it is not alive). */
static void member_move(struct cl_ctx *d, struct member *m, const char *addr)
{
    log_info("cluster", "member %u moved: %s -> %s", (unsigned)m->id, m->addr, addr);
    member_undial(d->cl, m);
    member_rekey(d->cl, m, m->id, addr);
}

static const char *state_name(int s)
{
    switch (s) {
    case KVTIER__PEER_STATE__PEER_JOINING: return "joining";
    case KVTIER__PEER_STATE__PEER_ALIVE: return "alive";
    case KVTIER__PEER_STATE__PEER_DEAD: return "dead";
    case KVTIER__PEER_STATE__PEER_LEFT: return "left";
    default: return "none";
    }
}

/* ------------------------------------------------------------- sending */

/* Joins and heartbeats carry our UCX identity until m says it has it
 * (every message says whether we have its). */
static void attach_ucx(struct cluster *c, struct member *m, Kvtier__PeerMsg *pm)
{
    const void *a, *r;
    size_t al, rl;
    pm->have_ucx = m->ucx_id != NULL;
    if (!c->pt || m->ucx_acked || (c->tls && !m->proven) || (pm->body_case != KVTIER__PEER_MSG__BODY_JOIN &&
                                   pm->body_case != KVTIER__PEER_MSG__BODY_HEARTBEAT))
        return;
    peer_self(c->pt, &a, &al, &r, &rl, &pm->pool_base);
    pm->ucx_addr = (ProtobufCBinaryData){al, (uint8_t *)a};
    pm->ucx_rkey = (ProtobufCBinaryData){rl, (uint8_t *)r};
}

int cl_send(struct cl_ctx *d, struct member *m, Kvtier__PeerMsg *pm)
{
    struct cluster *c = d->cl;
    if (!m || conn_use(d, m) != 0) return -1;
    attach_ucx(c, m, pm); /* after the dial: it sets named */
    if (c->tls && m->named) pm->auth_chal = (ProtobufCBinaryData){CL_TOK, m->chal};
    if (c->tls && m->have_proof)
        pm->auth_proof = (ProtobufCBinaryData){CL_TOK, m->proof};
    pm->node_id = c->self_id;
    pm->addr = c->self_addr;
    pm->incarnation = c->inc;
    pm->sent_ns = mono_ns();
    size_t len = kvtier__peer_msg__get_packed_size(pm);
    nng_msg *msg;
    if (!m->open || nng_msg_alloc(&msg, len) != 0) return -1;
    kvtier__peer_msg__pack(pm, nng_msg_body(msg));
    if (nng_sendmsg(m->push, msg, NNG_FLAG_NONBLOCK) != 0) {
        nng_msg_free(msg);
        return -1;
    }
    m->bytes_out += len;
    return 0;
}

static void send_join(struct cl_ctx *d, struct member *m)
{
    if (!m) return;
    Kvtier__PeerMsg pm = KVTIER__PEER_MSG__INIT;
    Kvtier__PeerJoin j = KVTIER__PEER_JOIN__INIT;
    pm.body_case = KVTIER__PEER_MSG__BODY_JOIN;
    pm.join = &j;
    cl_send(d, m, &pm);
}

/* The hello's second half: our UCX identity (attach_ucx) and an echo for
 * the round trip. No member list: who is a member is the backend's. */
static void send_heartbeat(struct cl_ctx *d, struct member *to)
{
    Kvtier__PeerMsg pm = KVTIER__PEER_MSG__INIT;
    Kvtier__PeerHeartbeat hb = KVTIER__PEER_HEARTBEAT__INIT;
    if (to->echo_ns) {
        hb.echo_ns = to->echo_ns;
        hb.held_ns = mono_ns() - to->echo_rx_ns;
    }
    pm.body_case = KVTIER__PEER_MSG__BODY_HEARTBEAT;
    pm.heartbeat = &hb;
    cl_send(d, to, &pm);
}

/* 1 once m and this node have proven their ids to each other (over TLS:
 * it echoed our secret and we hold its secret, so what we send it is
 * accepted); plain tcp: once heard from. */
static int hello_done(const struct cluster *c, const struct member *m)
{
    return m->id && m->proven && (!c->tls || m->have_proof);
}

/* The transport of the membership backend (mb_env.send): one PeerSwim to
 * the member at addr, only when it would be accepted there. */
static int env_send(void *ctx, const char *addr, const void *buf, size_t len)
{
    struct cl_ctx *d = ctx;
    struct member *m = find_addr(d->cl, addr);
    if (!m || !hello_done(d->cl, m)) return -1; /* the hello comes first */
    Kvtier__PeerMsg pm = KVTIER__PEER_MSG__INIT;
    Kvtier__PeerSwim sw = KVTIER__PEER_SWIM__INIT;
    sw.msg = (ProtobufCBinaryData){len, (uint8_t *)buf};
    if (m->echo_ns) {
        sw.echo_ns = m->echo_ns;
        sw.held_ns = mono_ns() - m->echo_rx_ns;
    }
    pm.body_case = KVTIER__PEER_MSG__BODY_SWIM;
    pm.swim = &sw;
    return cl_send(d, m, &pm);
}

static uint64_t env_now(void *ctx)
{
    (void)ctx;
    return mono_ms();
}

/* mb_env.wake, from the etcd worker: its news is picked up by the
 * cluster_poll the queue's eventfd brings (mb_drive asks next_tick). */
static void env_wake(void *ctx)
{
    struct cl_ctx *d = ctx;
    uint64_t one = 1;
    ssize_t w = write(d->cl->efd, &one, sizeof one);
    (void)w;
}

static uint64_t env_rand(void *ctx)
{
    uint64_t v;
    (void)ctx;
    if (getrandom(&v, sizeof v, 0) != (ssize_t)sizeof v) v = mono_ns() * 0x9e3779b97f4a7c15ull;
    return v;
}

/* ------------------------------------------------------------- applying */

/* Count every refusal; log at most one a second (a misconfigured peer
 * would otherwise flood the log at its heartbeat rate). */
static int reject_log_due(struct cluster *c)
{
    uint64_t now = mono_ns() / 1000000;
    c->rejected++;
    if (c->last_reject_log_ms && now - c->last_reject_log_ms < 1000) return 0;
    c->last_reject_log_ms = now;
    return 1;
}

void cl_reject(struct cluster *c, const Kvtier__PeerMsg *pm, const char *why)
{
    if (reject_log_due(c))
        log_warn("cluster", "rejected a message from %s (node %u): %s (%llu rejected)",
                 pm->addr, (unsigned)pm->node_id, why, (unsigned long long)c->rejected);
}

static void set_state(struct cl_ctx *d, struct member *m, int st, const char *why)
{
    struct cluster *c = d->cl;
    if (m->state == st) return;
    log_info("cluster", "member %u (%s): %s -> %s (%s); epoch %llu", (unsigned)m->id,
             m->addr, state_name(m->state), state_name(st), why,
             (unsigned long long)(c->epoch + 1));
    int was_alive = m->state == KVTIER__PEER_STATE__PEER_ALIVE;
    m->state = st;
    if (st == KVTIER__PEER_STATE__PEER_ALIVE) {
        m->alive_ms = cl_clock(d);
        m->joins++;
    }
    c->epoch++;
    if (was_alive || st == KVTIER__PEER_STATE__PEER_ALIVE)
        gx_membership(d, m->id, st == KVTIER__PEER_STATE__PEER_ALIVE);
    if (was_alive) pg_member_down(d, m);
}

/* m's state here from the backend's record and the hello: alive or
 * suspect there and the hello done is ALIVE; dead or left there is DEAD
 * or LEFT; unknown there (or reaped) is no longer ALIVE. */
static void recompute(struct cl_ctx *d, struct member *m, const char *why)
{
    const struct mb_member *b = m->mbm;
    int st = m->state;
    if (!b) {
        if (st == KVTIER__PEER_STATE__PEER_ALIVE) st = KVTIER__PEER_STATE__PEER_DEAD;
    } else if (b->state == MB_ALIVE || b->state == MB_SUSPECT) {
        if (hello_done(d->cl, m)) st = KVTIER__PEER_STATE__PEER_ALIVE;
    } else {
        st = b->state == MB_LEFT ? KVTIER__PEER_STATE__PEER_LEFT
                                 : KVTIER__PEER_STATE__PEER_DEAD;
    }
    set_state(d, m, st, why);
}

/* The sender is m and spoke; a newer incarnation is a restart. */
static void heard(struct cl_ctx *d, struct member *m, const Kvtier__PeerMsg *pm,
                  size_t len)
{
    struct cluster *c = d->cl;
    uint64_t now = cl_clock(d);
    int rejoin = m->inc != 0 && pm->incarnation > m->inc;
    m->proven = 1;
    if (rejoin) {
        pg_member_down(d, m); /* its UCX endpoint is stale */
        if (cl_alive(m)) { /* it lost its index: a JOIN again (gidx.c) */
            log_info("cluster", "member %u (%s): restarted; epoch %llu", (unsigned)m->id,
                     m->addr, (unsigned long long)++c->epoch);
            m->joins++;
            gx_membership(d, m->id, 1);
        }
    }
    m->inc = pm->incarnation;
    m->last_heard_ms = now;
    m->bytes_in += len;
    m->echo_ns = pm->sent_ns;
    m->echo_rx_ns = mono_ns();
}

static int valid_addr(const struct cluster *c, const char *a)
{
    size_t n = strlen(c->scheme);
    return a && !strncmp(a, c->scheme, n) && strlen(a) > n && strlen(a) < CL_ADDR_MAX;
}

static void on_heartbeat(struct member *m, const Kvtier__PeerMsg *pm)
{
    const Kvtier__PeerHeartbeat *hb = pm->heartbeat;
    if (hb->echo_ns && hb->echo_ns <= mono_ns()) {
        uint64_t rt = mono_ns() - hb->echo_ns;
        m->rtt_us = (rt > hb->held_ns ? rt - hb->held_ns : 0) / 1000;
    }
}

/* A membership datagram from m (proven): its SwimMsg must speak for the
 * same id and url, then it goes to the backend with its arrival time. */
static void on_swim(struct cl_ctx *d, struct member *m, const Kvtier__PeerMsg *pm,
                    uint64_t rx_ms)
{
    struct cluster *c = d->cl;
    const Kvtier__PeerSwim *sw = pm->swim;
    Kvtier__SwimMsg *sm = kvtier__swim_msg__unpack(NULL, sw->msg.len, sw->msg.data);
    if (!sm || sm->from != m->id || strcmp(sm->from_addr, m->addr) != 0) {
        cl_reject(c, pm, sm ? "membership message for another member" : "bad membership message");
        if (sm) kvtier__swim_msg__free_unpacked(sm, NULL);
        return;
    }
    kvtier__swim_msg__free_unpacked(sm, NULL);
    if (sw->echo_ns && sw->echo_ns <= mono_ns()) {
        uint64_t rt = mono_ns() - sw->echo_ns;
        m->rtt_us = (rt > sw->held_ns ? rt - sw->held_ns : 0) / 1000;
    }
    if (c->mb) mb_receive(c->mb, sw->msg.data, sw->msg.len, rx_ms);
}

/* May a Join naming m move it to another address? Plain tcp: a newer
 * incarnation may. TLS: a proven sender may, and anyone may while m is
 * not alive, since the new address is dialled with m's name required. */
static int may_move(const struct cluster *c, const struct member *m,
                    const Kvtier__PeerMsg *pm, int ok)
{
    if (!c->tls) return pm->incarnation > m->inc;
    return ok || !cl_alive(m);
}

/* A Join: add or adopt the sender, then answer with our view at once. */
static struct member *on_join(struct cl_ctx *d, const Kvtier__PeerMsg *pm, int ok)
{
    struct cluster *c = d->cl;
    struct member *m = cl_find(c, pm->node_id);
    if (m && strcmp(m->addr, pm->addr) != 0) {
        if (!may_move(c, m, pm, ok)) return NULL; /* keep ours */
        member_move(d, m, pm->addr);
    }
    if (!m && (m = find_seed(c, pm->addr))) member_named(d, m, pm->node_id);
    if (!m) m = member_add(d, pm->node_id, pm->addr, 0);
    return m;
}

/* Incarnations are start times in microseconds: one far in the future
 * would make every later message of the real node look old. */
static int sane_incarnation(uint64_t inc)
{
    return inc <= ((uint64_t)time(NULL) + 86400) * 1000000ull;
}

static const char *check_sender(const struct cluster *c, const Kvtier__PeerMsg *pm)
{
    if (pm->body_case == KVTIER__PEER_MSG__BODY__NOT_SET) return "no body";
    if (pm->node_id == 0 || !valid_addr(c, pm->addr)) return "bad sender identity";
    if (pm->node_id == c->self_id) return "sender claims this node's id";
    if (!sane_incarnation(pm->incarnation)) return "incarnation in the future";
    return NULL;
}

/* ------------------------------------------------------------- identity */

/* 1 if pm may speak for m: plain tcp believes the claim; over TLS, pm
 * must echo the secret that only m's certificate could read. */
static int proven(const struct cluster *c, const struct member *m,
                  const Kvtier__PeerMsg *pm)
{
    if (!c->tls) return 1;
    if (!m || m->id != pm->node_id || pm->auth_proof.len != CL_TOK) return 0;
    uint8_t diff = 0;
    for (int i = 0; i < CL_TOK; i++) diff |= pm->auth_proof.data[i] ^ m->chal[i];
    return diff == 0;
}

/* Keep the secret m's sender made for us, to echo. A proven message, a
 * Join (a restarted node has a new one) or a first one may set it. */
static void take_chal(const struct cluster *c, struct member *m, const Kvtier__PeerMsg *pm,
                      int ok)
{
    if (!c->tls || pm->auth_chal.len != CL_TOK) return;
    if (!ok && m->have_proof && pm->body_case != KVTIER__PEER_MSG__BODY_JOIN) return;
    memcpy(m->proof, pm->auth_chal.data, CL_TOK);
    m->have_proof = 1;
}

static void send_join(struct cl_ctx *d, struct member *m);

/* A message whose claimed id is not proven: refused and counted. A Join
 * is answered (at most once a heartbeat) over the named dial, so the
 * real holder of that id learns our secret and proves itself next time. */
static void on_unproven(struct cl_ctx *d, struct member *m, const Kvtier__PeerMsg *pm)
{
    struct cluster *c = d->cl;
    uint64_t now = cl_clock(d);
    int join = pm->body_case == KVTIER__PEER_MSG__BODY_JOIN;
    if (!join) c->unproven++; /* a Join unproven is how every node enters */
    cl_reject(c, pm, "sender's node id not proven");
    /* named: the dial to m requires its name (or will, once dialled) */
    if (!join || !(m->open ? m->named : m->id != 0) ||
        (m->last_unproven_ms && now - m->last_unproven_ms < d->cfg.cluster_heartbeat_ms))
        return;
    m->last_unproven_ms = now;
    send_join(d, m);
}

/* m's UCX identity is kept; the endpoint is made on the first fetch
 * from m (pget.c). */
static void learn_ucx(struct cl_ctx *d, struct member *m, const Kvtier__PeerMsg *pm)
{
    m->ucx_acked = pm->have_ucx;
    pg_member_ucx(d, m, pm);
}

/* A Join from a member we hold alive, same incarnation: it took us for
 * dead (or never heard us), so as an owner it dropped what we hold while
 * our own view did not change. Tell the owners again. */
static void on_join_from_alive(struct cl_ctx *d, struct member *m)
{
    send_heartbeat(d, m);
    /* Over TLS a joiner proves itself before it hears us prove ourselves,
     * so its next Join may cross our answer: what it was just sent as a
     * new member needs no resend. */
    if (cl_clock(d) - m->alive_ms >= 2 * d->cfg.cluster_heartbeat_ms)
        gx_republish(d, m->id);
}

static void dispatch(struct cl_ctx *d, struct member *m, const Kvtier__PeerMsg *pm,
                     int was_alive, int first, uint64_t rx_ms)
{
    learn_ucx(d, m, pm);
    switch (pm->body_case) {
    case KVTIER__PEER_MSG__BODY_JOIN:
        if (was_alive) on_join_from_alive(d, m);
        else send_heartbeat(d, m);
        break;
    case KVTIER__PEER_MSG__BODY_HEARTBEAT:
        on_heartbeat(m, pm);
        /* Just proven: our UCX identity goes back now, not a tick later.
         * And a Heartbeat that brought m's identity is answered once it is
         * held, so m hears have_ucx and stops: else, once m held ours and
         * we stopped, m repeated its Heartbeats for ever where nothing else
         * flows between idle members (etcd). The answer brings no identity
         * once m holds ours, so this does not ping-pong. */
        if ((first && d->cl->tls) || (pm->ucx_addr.len && m->ucx_id)) send_heartbeat(d, m);
        break;
    case KVTIER__PEER_MSG__BODY_SWIM: on_swim(d, m, pm, rx_ms); break;
    case KVTIER__PEER_MSG__BODY_INDEX: gx_on_index(d, m, pm); break;
    case KVTIER__PEER_MSG__BODY_WHO_HAS: gx_on_who_has(d, m, pm); break;
    case KVTIER__PEER_MSG__BODY_HOLDERS: gx_on_holders(d, m, pm); break;
    case KVTIER__PEER_MSG__BODY_PIN: pg_on_pin(d, m, pm); break;
    case KVTIER__PEER_MSG__BODY_PINNED: pg_on_pinned(d, m, pm); break;
    case KVTIER__PEER_MSG__BODY_UNPIN: pg_on_unpin(d, m, pm); break;
    default: cl_reject(d->cl, pm, "unknown body"); break;
    }
}

/* A node that knows no live member (started without seeds, or restarted
 * so) takes the first member it completes a hello with as its seed:
 * SWIM's join sync goes there. */
static void know_first(struct cl_ctx *d, struct member *m)
{
    struct cluster *c = d->cl;
    if (!c->mb || m->gone || m->mbm || !hello_done(c, m) || mb_live(c->mb) ||
        strcmp(mb_backend_name(c->mb), "swim") != 0 || c->seeded >= 8)
        return;
    const char *a = m->addr;
    c->seeded++;
    mb_join(c->mb, &a, 1);
}

static void apply_at(struct cl_ctx *d, const uint8_t *buf, size_t len, uint64_t rx_ms)
{
    struct cluster *c = d->cl;
    Kvtier__PeerMsg *pm = kvtier__peer_msg__unpack(NULL, len, buf);
    const char *why = pm ? check_sender(c, pm) : "does not decode";
    if (why) {
        if (reject_log_due(c))
            log_warn("cluster", "rejected a %zu-byte message: %s (%llu rejected)", len,
                     why, (unsigned long long)c->rejected);
        if (pm) kvtier__peer_msg__free_unpacked(pm, NULL);
        return;
    }
    struct member *m = cl_find(c, pm->node_id);
    if (!m && (m = find_seed(c, pm->addr))) member_named(d, m, pm->node_id);
    int ok = proven(c, m, pm);
    if (pm->body_case == KVTIER__PEER_MSG__BODY_JOIN) m = on_join(d, pm, ok);
    else if (m && strcmp(m->addr, pm->addr) != 0) m = NULL;
    if (m) take_chal(c, m, pm, ok);
    if (!m) {
        if (c->tls && cl_find(c, pm->node_id)) c->unproven++; /* a member's id */
        cl_reject(c, pm, "not a member");
    } else if (!ok) {
        on_unproven(d, m, pm);
    } else if (m->inc && pm->incarnation < m->inc) {
        cl_reject(c, pm, "an old incarnation");
    } else if ((why = gx_check(d, m, pm)) || (why = pg_check(d, m, pm))) {
        cl_reject(c, pm, why);
    } else {
        int was_alive = cl_alive(m) && pm->incarnation == m->inc, first = !m->proven;
        heard(d, m, pm, len);
        dispatch(d, m, pm, was_alive, first, rx_ms);
        if (!m->gone && !cl_alive(m)) recompute(d, m, "hello done"); /* maybe now */
        know_first(d, m);
    }
    kvtier__peer_msg__free_unpacked(pm, NULL);
}

void cl_apply(struct cl_ctx *d, const uint8_t *buf, size_t len)
{
    apply_at(d, buf, len, mono_ms());
}

static void mb_drive(struct cl_ctx *d);

/* Messages, then the membership's timers (what arrived may move them;
 * the timerfd in cluster_fd's set wakes this too). */
void cluster_poll(struct cl_ctx *d)
{
    if (!d->cl) return;
    if (fault_hit(FAULT_CLUSTER_STALL)) {
        struct timespec ts = {1, 0};
        nanosleep(&ts, NULL);
    }
    struct qmsg *q = take_all(d->cl);
    while (q) {
        struct qmsg *next = q->next;
        apply_at(d, nng_msg_body(q->m), nng_msg_len(q->m), q->rx_ms);
        nng_msg_free(q->m);
        free(q);
        q = next;
    }
    mb_drive(d);
}

/* ------------------------------------------------------- the membership */

/* Every member's metadata is its start time (PeerMsg.incarnation, 8 bytes
 * little-endian): no secrets, no rkeys. One newer than the process we did
 * the hello with is a restart: that hello no longer holds (its secrets are
 * new), so the member is not ALIVE here until it is done again -- and the
 * restart is counted once, when it is. */
static void boot_check(struct member *m, const struct mb_member *b)
{
    uint64_t boot = 0;
    if (b->meta_len != 8) return;
    for (int i = 7; i >= 0; i--) boot = boot << 8 | b->meta[i];
    if (!m->inc || boot <= m->inc) return;
    m->proven = m->have_proof = 0;
}

/* The backend's change callback (member.h): it may not call mb_tick and
 * friends, and apply() may hold a struct member across it, so a reaped
 * member is only marked here and leaves the table at the next tick. */
static void on_mb(void *arg, struct mb *mb, struct mb_member *b, enum mb_event ev,
                  enum mb_state old)
{
    struct cl_ctx *d = arg;
    struct cluster *c = d->cl;
    struct member *m = b->user;
    (void)mb, (void)old;
    if (c->closing) return;
    if (ev == MB_EV_GONE) {
        if (!m) return;
        b->user = NULL;
        m->mbm = NULL;
        recompute(d, m, "reaped");
        m->gone = 1;
        return;
    }
    if (!m && !(m = cl_find(c, b->id)) && (m = find_seed(c, b->addr)))
        member_named(d, m, b->id);
    if (!m) m = member_add(d, b->id, b->addr, 0);
    m->mbm = b;
    b->user = m;
    boot_check(m, b);
    /* A member not alive here may move: the new address is dialled with
     * its name required (TLS), so only it can answer there. */
    if (strcmp(m->addr, b->addr) != 0 && !cl_alive(m)) member_move(d, m, b->addr);
    recompute(d, m, mb_event_name(ev));
}

/* Free the members marked gone (no pointer to one is held between
 * calls); the last entry of the index fills the hole. */
static void compact(struct cl_ctx *d)
{
    struct cluster *c = d->cl;
    for (uint32_t i = 0; i < c->n;) {
        struct member *m = c->m[i];
        if (!m->gone) {
            i++;
            continue;
        }
        pg_member_down(d, m);
        member_undial(c, m);
        log_info("cluster", "member %u (%s) forgotten", (unsigned)m->id, m->addr);
        cl_member_drop(c, m);
    }
}

/* When the backend's timers want to run next (swim's timers; etcd's next
 * reap, or now when its worker has news: env_wake). Never busy-loops. */
static uint64_t mb_due(struct cluster *c, uint64_t now)
{
    uint64_t due = mb_next_tick(c->mb);
    return due < now + 2 ? now + 2 : due;
}

/* Run the backend's timers when due and re-arm the timer that wakes the
 * core for the next ones. A refutation means some member took this node
 * for suspect or dead (maybe dropping what it holds as an owner): tell
 * every live member again what it owns. */
static void mb_drive(struct cl_ctx *d)
{
    struct cluster *c = d->cl;
    if (!c->mb) return;
    uint64_t now = mono_ms(), v;
    ssize_t r = read(c->tfd, &v, sizeof v);
    (void)r;
    if (now >= c->mb_due || mb_next_tick(c->mb) <= now) mb_tick(c->mb, now);
    c->mb_due = mb_due(c, now);
    struct itimerspec it = {{0, 0}, {(time_t)(c->mb_due / 1000),
                                     (long)(c->mb_due % 1000) * 1000000L}};
    timerfd_settime(c->tfd, TFD_TIMER_ABSTIME, &it, NULL);
    const struct mb_stats *st = mb_stats(c->mb);
    if (st->refutations == c->refutations) return;
    c->refutations = st->refutations;
    for (uint32_t i = 0; i < c->n; i++)
        if (cl_alive(c->m[i])) gx_republish(d, c->m[i]->id);
}

/* The hello, repeated every cluster.heartbeat_ms until done: Joins to a
 * seed, to a node heard only through its Join, and to a member the backend
 * holds live, while the hello is not done; then Heartbeats until it holds
 * our UCX identity. Joins also go to members held dead until they are
 * reaped: a dead member may have restarted knowing nobody (no seeds), and
 * a Join is the one message it accepts from us. Nothing to members that
 * left. A member whose hello is done but whom the backend does not hold
 * (the join gossip missed this node) is asked for its claim (mb_ask). */
static void hello_tick(struct cl_ctx *d)
{
    struct cluster *c = d->cl;
    uint64_t now = cl_clock(d);
    if (now - c->last_hb_ms < d->cfg.cluster_heartbeat_ms) return;
    c->last_hb_ms = now;
    for (uint32_t i = 0; i < c->n; i++) {
        struct member *m = c->m[i];
        int live = m->mbm && (m->mbm->state == MB_ALIVE || m->mbm->state == MB_SUSPECT);
        if (m->gone || (m->mbm && !live && m->mbm->state == MB_LEFT)) continue;
        if (!hello_done(c, m) || (m->mbm && !live)) send_join(d, m);
        else if (c->pt && !m->ucx_acked) send_heartbeat(d, m);
        /* hello done, yet the backend has not heard of it: ask it */
        if (c->mb && !m->mbm && hello_done(c, m)) mb_ask(c->mb, m->addr);
    }
}

void cluster_tick(struct cl_ctx *d)
{
    struct cluster *c = d->cl;
    if (!c) return;
    compact(d);
    linger_tick(c);
    lw_tick(d);
    mb_drive(d);
    gx_tick(d);
    pg_tick(d);
    hello_tick(d);
}

/* ------------------------------------------------------------ open/close */

static void add_seeds(struct cl_ctx *d)
{
    char buf[CL_STR_MAX], *save = NULL;
    snprintf(buf, sizeof buf, "%s", d->cfg.cluster_seeds);
    for (char *s = strtok_r(buf, ", ", &save); s; s = strtok_r(NULL, ", ", &save)) {
        if (!strcmp(s, d->cl->self_addr)) continue;
        if (!valid_addr(d->cl, s)) {
            log_warn("cluster", "seed '%s' ignored: want %shost:port", s, d->cl->scheme);
            continue;
        }
        if (!find_seed(d->cl, s)) member_add(d, 0, s, 0);
    }
}

/* The pull socket; its listener (lwatch.c) requires a client certificate
 * from the CA, so a node without one never gets a message through. */
static int listen_pull(struct cl_ctx *d)
{
    struct cluster *c = d->cl;
    int rv = nng_pull0_open(&c->pull);
    if (rv == 0) {
        c->pull_open = 1;
        nng_socket_set_size(c->pull, NNG_OPT_RECVMAXSZ, CL_MAX_MSG);
        rv = nng_aio_alloc(&c->aio, recv_cb, c);
    }
    if (rv == 0) rv = lw_open(d);
    if (rv != 0) {
        log_error("cluster", "cannot listen on %s: %s", c->self_addr, nng_strerror(rv));
        return -1;
    }
    nng_recv_aio(c->pull, c->aio);
    return 0;
}

/* ------------------------------------------------ the tier behind tier.h */

static int op_get(struct tier *t, struct tier_walk *w)
{
    struct cl_ctx *d = ((struct cluster *)t)->d;
    return cluster_get(d, w->pipe, w->req_id, w->get, w->slots, w->n);
}

static int op_lookup(struct tier *t, struct tier_walk *w)
{
    struct cl_ctx *d = ((struct cluster *)t)->d;
    return cluster_lookup(d, w->pipe, w->req_id, w->lookup, w->lr);
}

static void op_committed(struct tier *t, uint32_t slot)
{
    cluster_held(((struct cluster *)t)->d, slot, 1);
}

static void op_removed(struct tier *t, uint32_t slot)
{
    cluster_held(((struct cluster *)t)->d, slot, 0);
}

static const struct tier_ops cl_tier_ops = {
    .name = "peer",
    .id = KVT_TIER_PEER,
    .get = op_get,
    .lookup = op_lookup,
    .committed = op_committed,
    .removed = op_removed,
};

struct tier *cluster_tier(const struct cl_ctx *d)
{
    return d->cl ? &d->cl->obj : NULL;
}


/* The backend named by cluster.membership, with the [cluster] knobs. */
static struct mb *mb_open(struct cl_ctx *d, const char **why)
{
    struct cluster *c = d->cl;
    const struct cl_conf *k = &d->cfg;
    struct mb_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.self_id = c->self_id;
    cfg.self_addr = c->self_addr;
    cfg.inc = c->inc;
    uint8_t boot[8];
    for (int i = 0; i < 8; i++) boot[i] = (uint8_t)(c->inc >> (8 * i));
    cfg.meta = boot;
    cfg.meta_len = sizeof boot;
    cfg.probe_ms = (uint32_t)k->cluster_probe_ms;
    cfg.probe_timeout_ms = (uint32_t)k->cluster_probe_timeout_ms;
    cfg.suspicion_mult = (uint32_t)k->cluster_suspicion_mult;
    cfg.reap_ms = (uint32_t)k->cluster_reap_ms;
    cfg.service_url = k->cluster_etcd_endpoints;
    cfg.service_prefix = k->cluster_etcd_prefix;
    cfg.lease_ms = (uint32_t)(k->cluster_etcd_lease_s * 1000);
    cfg.on_change = on_mb;
    cfg.on_change_arg = d;
    cfg.env = (struct mb_env){d, env_send, env_now, env_rand, env_wake};
    int etcd = !strcmp(k->cluster_membership, "etcd");
    return mb_create(etcd ? &etcd_ops : &swim_ops, &cfg, why);
}

/* Start the membership: swim contacts the seeds (its syncs go once the
 * hello with each is done), etcd registers and watches. */
static int mb_start(struct cl_ctx *d)
{
    struct cluster *c = d->cl;
    const char *why = NULL, **seeds = calloc((size_t)c->n + 1, sizeof *seeds);
    size_t n = 0;
    if (!seeds) abort();
    if (!(c->mb = mb_open(d, &why))) {
        log_error("cluster", "membership %s: %s", d->cfg.cluster_membership,
                  why ? why : "cannot start");
        free(seeds);
        return -1;
    }
    for (uint32_t i = 0; i < c->n; i++)
        if (c->m[i]->id == 0) seeds[n++] = c->m[i]->addr;
    int rv = mb_join(c->mb, n ? seeds : NULL, n);
    free(seeds);
    if (rv != 0)
        log_warn("cluster", "membership %s: join did not start; retrying in the background",
                 d->cfg.cluster_membership);
    mb_drive(d);
    return 0;
}

/* cluster_fd: one epoll set of the queue's eventfd and the membership's
 * timerfd, so the core needs one fd and cluster_poll serves both. */
static int poll_set(struct cluster *c)
{
    struct epoll_event e1 = {.events = EPOLLIN, .data.fd = c->efd};
    struct epoll_event e2 = {.events = EPOLLIN, .data.fd = c->tfd};
    if (c->ep < 0 || c->efd < 0 || c->tfd < 0 ||
        epoll_ctl(c->ep, EPOLL_CTL_ADD, c->efd, &e1) != 0 ||
        epoll_ctl(c->ep, EPOLL_CTL_ADD, c->tfd, &e2) != 0) {
        log_error("cluster", "eventfd/timerfd/epoll: %s", strerror(errno));
        return -1;
    }
    return 0;
}

int cluster_open(struct cl_ctx *d)
{
    if (!d->cfg.cluster_listen[0]) return 0;
    struct cluster *c = calloc(1, sizeof *c);
    if (!c) abort();
    d->cl = c;
    c->obj.ops = &cl_tier_ops;
    c->d = d;
    c->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    c->tfd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
    c->ep = epoll_create1(EPOLL_CLOEXEC);
    pthread_mutex_init(&c->q_mtx, NULL);
    c->q_max = d->cfg.cluster_rx_queue_max ? d->cfg.cluster_rx_queue_max : 16384;
    c->self_id = (uint32_t)d->cfg.cluster_node_id;
    snprintf(c->self_addr, sizeof c->self_addr, "%.*s", CL_ADDR_MAX - 1,
             d->cfg.cluster_listen);
    c->inc = (uint64_t)time(NULL) * 1000000ull + mono_ns() / 1000 % 1000000ull;
    c->tls = !d->cfg.cluster_insecure;
    c->scheme = c->tls ? "tls+tcp://" : "tcp://";
    if (!c->tls)
        log_warn("cluster", "cluster.insecure = 1: plain tcp without authentication; "
                 "anyone who reaches %s can join, read the pool and poison the index",
                 c->self_addr);
    if (poll_set(c) != 0 || strlen(d->cfg.cluster_listen) >= CL_ADDR_MAX ||
        listen_pull(d) != 0)
        return -1;
    add_seeds(d);
    if (gx_open(d) != 0 || pg_open(d) != 0 || mb_start(d) != 0) return -1;
    log_info("cluster", "node %u listening on %s; %u seed(s); membership %s",
             (unsigned)c->self_id, c->self_addr, (unsigned)c->n, mb_backend_name(c->mb));
    return 0;
}

int cluster_fd(const struct cl_ctx *d)
{
    return d->cl ? d->cl->ep : -1;
}

/* The pull socket and every member's push socket, closed within
 * CL_CLOSE_MS (common/nngclose.h: nng 1.5 can deadlock in nng_close while
 * a dialer reconnects to a peer stopping at the same time). Past the
 * bound they are left to the process's exit, with a warning. */
static int close_sockets(struct cluster *c)
{
    nng_socket *s = calloc((size_t)c->n + 1, sizeof *s);
    size_t n = 0;
    if (!s) { /* no room for the list: close them here, unbounded */
        if (c->pull_open) nng_close(c->pull);
        for (uint32_t i = 0; i < c->n; i++)
            if (c->m[i]->open) nng_close(c->m[i]->push);
        c->pull_open = 0;
        return 0;
    }
    if (c->pull_open) s[n++] = c->pull;
    c->pull_open = 0;
    for (uint32_t i = 0; i < c->n; i++) {
        if (c->m[i]->open) s[n++] = c->m[i]->push;
        c->m[i]->open = 0;
    }
    uint64_t t0 = mono_ns();
    int wedged = nngc_close_bounded(s, n, CL_CLOSE_MS, fault_hit(FAULT_NNG_CLOSE_HANG)) != 0;
    if (wedged)
        log_warn("cluster", "%zu socket(s) did not close within %u ms (nng); "
                 "left to the process's exit", n, CL_CLOSE_MS);
    else
        log_debug("cluster", "%zu socket(s) closed in %llu ms", n,
                  (unsigned long long)((mono_ns() - t0) / 1000000));
    free(s);
    return wedged;
}

/* The receive aio of a wedged close: nng may still hold it, so it is not
 * freed; kept here so the process's exit finds it referenced. */
static nng_aio *wedged_aio;

int cluster_close(struct cl_ctx *d)
{
    struct cluster *c = d->cl;
    if (!c) return 0;
    /* Owners hand off, then the Leave is gossiped (etcd: put-left and
     * revoke), and both get 100 ms to leave before the sockets close. */
    int handed = gx_leave(d) > 0, left = c->mb && mb_leave(c->mb) == 0;
    if (handed || left) {
        struct timespec ts = {0, 100 * 1000000L};
        nanosleep(&ts, NULL);
    }
    c->closing = 1;
    mb_destroy(c->mb); /* its GONE callbacks see closing and do nothing */
    c->mb = NULL;
    pg_close(d); /* answers parked GETs */
    gx_close(d); /* answers parked lookups */
    pg_free(d);
    if (c->aio) nng_aio_stop(c->aio); /* no recv_cb after this */
    lw_close(d);
    int wedged = close_sockets(c);
    if (wedged) wedged_aio = c->aio; /* nng's threads are stuck: touch nothing */
    else if (c->aio) nng_aio_free(c->aio);
    struct qmsg *q = c->q_head;
    while (q) {
        struct qmsg *next = q->next;
        nng_msg_free(q->m);
        free(q);
        q = next;
    }
    if (c->efd >= 0) close(c->efd);
    if (c->tfd >= 0) close(c->tfd);
    if (c->ep >= 0) close(c->ep);
    pthread_mutex_destroy(&c->q_mtx);
    cl_members_free(c);
    free(c);
    d->cl = NULL;
    return wedged;
}

/* ---------------------------------------------------------------- PEERS */

static void fill_peer(struct cl_ctx *d, const struct member *m, Kvtier__PeerInfo *p)
{
    kvtier__peer_info__init(p);
    p->node_id = m->id;
    p->addr = (char *)m->addr;
    p->state = (Kvtier__PeerState)m->state;
    if (cl_alive(m) && m->mbm && m->mbm->state == MB_SUSPECT)
        p->state = KVTIER__PEER_STATE__PEER_SUSPECT;
    p->incarnation = m->inc;
    p->rtt_us = m->rtt_us;
    p->bytes_in = m->bytes_in;
    p->bytes_out = m->bytes_out;
    p->last_heard_ms = m->last_heard_ms ? cl_clock(d) - m->last_heard_ms : 0;
    p->joins = m->joins;
}

void cluster_do_peers(struct req *r, struct cl_ctx *d, Kvtier__Response *rsp)
{
    struct cluster *c = d->cl;
    Kvtier__PeersResp *pr = d->host->req_alloc(r, sizeof *pr);
    kvtier__peers_resp__init(pr);
    rsp->body_case = KVTIER__RESPONSE__BODY_PEERS;
    rsp->peers = pr;
    if (!c) return;
    pr->enabled = 1;
    pr->node_id = c->self_id;
    pr->addr = c->self_addr;
    /* swim: this node's count of changes; etcd: the revision, the same on
     * every node */
    pr->epoch = c->mb && !strcmp(mb_backend_name(c->mb), "etcd") ? mb_epoch(c->mb) : c->epoch;
    pr->incarnation = c->inc;
    pr->rejected = c->rejected;
    pr->insecure = !c->tls;
    pr->unproven = c->unproven;
    gx_fill_peers(d, pr);
    pg_fill_peers(d, pr);
    pr->peers = d->host->req_alloc(r, (c->n + 1) * sizeof *pr->peers);
    Kvtier__PeerInfo *pv = d->host->req_alloc(r, (c->n + 1) * sizeof *pv);
    for (uint32_t i = 0; i < c->n; i++) {
        if (c->m[i]->gone) continue;
        fill_peer(d, c->m[i], &pv[pr->n_peers]);
        pr->peers[pr->n_peers] = &pv[pr->n_peers];
        pr->n_peers++;
    }
}

int cluster_peer_fd(const struct cl_ctx *d)
{
    return d->cl ? peer_fd(d->cl->pt) : -1;
}

void cluster_peer_poll(struct cl_ctx *d)
{
    if (d->cl) pg_poll(d);
}

int cluster_security(const struct cl_ctx *d, uint64_t *unproven)
{
    *unproven = d->cl ? d->cl->unproven : 0;
    return d->cl && !d->cl->tls;
}

/* ------------------------------------------------------------- /metrics */

struct mtext {
    char *p;
    size_t len, cap;
};

static void mt_printf(struct mtext *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void mt_printf(struct mtext *t, const char *fmt, ...)
{
    va_list ap;
    for (;;) {
        va_start(ap, fmt);
        int n = vsnprintf(t->p + t->len, t->cap - t->len, fmt, ap);
        va_end(ap);
        if (n < 0) return;
        if ((size_t)n < t->cap - t->len) {
            t->len += (size_t)n;
            return;
        }
        t->cap = 2 * t->cap + (size_t)n;
        if (!(t->p = realloc(t->p, t->cap))) abort(); /* control-plane allocation */
    }
}

static void mt_family(struct mtext *t, const char *name, const char *type, const char *help)
{
    mt_printf(t, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* Messages and bytes by type and direction, from the backend's counters. */
static void mt_traffic(struct mtext *t, const struct mb_stats *st)
{
    static const char *const dir[2] = {"tx", "rx"};
    mt_family(t, "kvtier_cluster_membership_messages_total", "counter",
              "Membership messages by type and direction.");
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < MB_NMSGS; i++)
            mt_printf(t, "kvtier_cluster_membership_messages_total{type=\"%s\",dir=\"%s\"} %llu\n",
                      mb_msg_name(i), dir[k],
                      (unsigned long long)(st ? (k ? st->msgs_rx[i] : st->msgs_tx[i]) : 0));
    mt_family(t, "kvtier_cluster_membership_bytes_total", "counter",
              "Membership bytes by message type and direction.");
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < MB_NMSGS; i++)
            mt_printf(t, "kvtier_cluster_membership_bytes_total{type=\"%s\",dir=\"%s\"} %llu\n",
                      mb_msg_name(i), dir[k],
                      (unsigned long long)(st ? (k ? st->bytes_rx[i] : st->bytes_tx[i]) : 0));
}

static void mt_one(struct mtext *t, const char *name, const char *type, const char *help,
                   uint64_t v)
{
    mt_family(t, name, type, help);
    mt_printf(t, "%s %llu\n", name, (unsigned long long)v);
}

char *cluster_metrics(const struct cl_ctx *d)
{
    struct cluster *c = d->cl;
    const struct mb_stats *st = c && c->mb ? mb_stats(c->mb) : NULL;
    struct mtext t = {NULL, 0, 0};
    uint64_t drops = 0;
    t.cap = 4096;
    if (!(t.p = malloc(t.cap))) abort();
    t.p[0] = '\0';
    mt_family(&t, "kvtier_peers", "gauge",
              "Cluster members by state in this node's membership view (itself excluded).");
    for (int s = 0; s < MB_NSTATES; s++)
        mt_printf(&t, "kvtier_peers{state=\"%s\"} %llu\n", mb_state_name(s),
                  (unsigned long long)(st ? st->members[s] : 0));
    mt_one(&t, "kvtier_cluster_suspicions_total", "counter",
           "Times this node suspected a member.", st ? st->suspicions : 0);
    mt_one(&t, "kvtier_cluster_refutations_total", "counter",
           "Times this node refuted a suspicion or death of itself.", st ? st->refutations : 0);
    mt_one(&t, "kvtier_cluster_false_deaths_total", "counter",
           "Members this node held dead that came back with a newer incarnation.",
           st ? st->false_deaths : 0);
    mt_traffic(&t, st);
    if (c) {
        pthread_mutex_lock(&c->q_mtx);
        drops = c->q_drops;
        pthread_mutex_unlock(&c->q_mtx);
    }
    mt_one(&t, "kvtier_cluster_rx_queue_dropped_total", "counter",
           "Daemon-to-daemon messages dropped because the receive queue was full.", drops);
    mt_one(&t, "kvtier_cluster_open_connections", "gauge",
           "Connections to members in use (at most cluster.max_conns).", c ? c->lru.n : 0);
    mt_one(&t, "kvtier_cluster_draining_connections", "gauge",
           "Connections evicted and draining before they close.", c ? c->linger.n : 0);
    mt_one(&t, "kvtier_cluster_lru_closes_total", "counter",
           "Connections closed because cluster.max_conns were in use (least recently used).",
           c ? c->lru_closes : 0);
    mt_one(&t, "kvtier_cluster_peer_endpoints", "gauge",
           "UCX endpoints to members open (at most cluster.max_peer_eps once idle).",
           c ? c->eps.n : 0);
    mt_one(&t, "kvtier_cluster_peer_endpoints_opened_total", "counter",
           "UCX endpoints made, each on a first fetch from a member.", c ? c->eps_opened : 0);
    mt_one(&t, "kvtier_cluster_peer_endpoints_evicted_total", "counter",
           "UCX endpoints closed because cluster.max_peer_eps were open (least recently "
           "used, none with a fetch in flight).", c ? c->eps_evicted : 0);
    mt_one(&t, "kvtier_cluster_listener_probes_total", "counter",
           "Probes of the cluster listener (a connection to itself, every 5 s).",
           c ? c->lw.probes : 0);
    mt_one(&t, "kvtier_cluster_listener_restarts_total", "counter",
           "Cluster listeners started again because a probe found them accepting nothing.",
           c ? c->lw.restarts : 0);
    return t.p;
}
