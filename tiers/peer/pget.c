/*
 * pget.c -- GET from peers: the requester's fetch and the holder's pins.
 *
 * Design (DESIGN §3, §5): a GET whose leading keys stop short here asks
 * the global index who holds the rest (gx_resolve), then asks each holder
 * to pin its chunks (PeerPin). The holder pins them as a read lease would
 * (a pinned chunk is neither evicted nor freed), answers with each one's
 * pool offset, size and checksum (PeerPinned), and keeps the pin until
 * PeerUnpin, its deadline (daemon.lease_timeout_ms), or the requester's
 * death. The requester reserves DRAM for each chunk (store_reserve: the
 * slot stays PENDING, invisible), pulls the bytes with UCX one-sided gets
 * straight into it (tiers/peer/peer.c), has the XXH3-64 checksum verified on
 * a worker thread (a workq.c queue; verdicts come back through the
 * daemon's completion queue, so the core never reads a whole chunk), and
 * only then commits the chunk as a
 * local replica; the holder is told to
 * unpin as soon as its chunks are in. The GET is parked (park.c) and
 * answered with the local prefix extended by the verified chunks, once
 * every fetch has ended or at the park's deadline (Get.deadline_ms, else
 * nvme.get_deadline_ms): then fetches still in flight are cancelled, and
 * their reserved space is freed only when UCX has let go of it. A GET
 * whose client leaves is settled the same way, with no answer sent
 * (get_gone): fetches in flight end on their own and free their space.
 * A failed fetch or a dead holder is a miss, counted; no byte of an
 * unverified chunk is ever visible. Bytes that are not the committer's
 * (they fail the checksum, or the holder reports another one) are
 * counted and the chunk is asked of the next further holder the owners
 * listed (gx_resolve's alt, up to GX_ALT_MAX, each once, within the GET's
 * deadline); it is a miss only when none is left.
 *
 * The checksum and size a fetch is held to are the committer's, as the
 * key's owners recorded them in the global index (gx_resolve hands them
 * over with the holders), never the holder's word: a holder that reports
 * another size or checksum is not fetched from, and fetched bytes are
 * verified against the owners' checksum. A holder keeps at most
 * cluster.pins_max_per_peer pins for one member; more are answered as not
 * pinned.
 *
 * Endpoints: a member's UCX identity (worker address, rkey, pool base)
 * comes in its hello and is kept (pg_member_ucx); the endpoint is made
 * only when a fetch from it starts (pg_conn), so a node holds endpoints
 * to the members it reads from, not to every member. They are kept most
 * recently used first on cluster.eps; past cluster.max_peer_eps the least
 * recently used with no fetch in flight is closed (peer_disconnect's
 * bounded close), at once or at a later tick if all are busy: a fetch
 * never loses its endpoint to the cap. A failed endpoint is closed at a
 * tick once idle (the next fetch makes a fresh one); a member that goes
 * down or restarts loses its endpoint and its identity (a restart brings
 * a new worker address); an identity that differs from the one kept
 * closes the endpoint made from it. An identity no endpoint can be made
 * from is forgotten, so the member is asked for it again (have_ucx).
 *
 * KVT_FAULT=peer_corrupt makes a holder flip one byte of the first chunk
 * it pins (restored at unpin): what a requester pulls then fails its
 * checksum. KVT_FAULT=peer_lie does the same and reports the checksum of
 * the flipped bytes, as a dishonest holder would. KVT_FAULT=peer_ep makes
 * making an endpoint fail.
 */
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "cluster_int.h"
#include "fault.h"
#include "log.h"
#include "peer.h"
#include "wire.h"
#include "workq.h"

#define PG_REAP_MS 10000 /* an answered GET waits this long for holders */

enum { PI_NONE = 0, PI_FETCH, PI_VERIFY, PI_OK, PI_MISS };

struct pget;

struct pitem { /* one key fetched from a peer */
    struct wq_csum check; /* its checksum, on the worker */
    struct pget *g;
    struct ppin *pin;
    uint32_t slot;
    uint64_t csum;
    struct gx_sum want; /* the owners' record of the chunk */
    struct peer_fetch *f;
    uint8_t st;
    uint8_t tried; /* of want.alt: further holders asked */
};

struct ppin { /* one PeerPin sent, until its chunks are in */
    uint64_t id;
    uint32_t holder, n, left;
    uint32_t *k;  /* key indices of the GET */
    int answered; /* PeerPinned came */
    struct pget *g;
    struct ppin *next;
};

struct pget {
    struct cl_ctx *d;
    struct park *park; /* while parked; NULL once answered or never */
    uint32_t pipe;
    uint64_t req_id, deadline;
    uint16_t ns;
    int inline_, answered, resolving;
    int sync; /* inside cluster_get: settle must not answer yet */
    uint32_t n_keys, n_local, fetching, pins_out;
    kvt_key *keys;
    uint32_t *slots;
    struct pitem *it;
    struct pget *next;
};

struct hpin { /* holder side: chunks pinned for a peer */
    uint64_t id, deadline;
    uint32_t peer, n, flipped;
    uint64_t lie;     /* KVT_FAULT=peer_lie: the checksum reported for flipped */
    uint32_t *slot;
    struct hpin *next;
};

struct pgs {
    struct workq *wq; /* checksums of fetched chunks; NULL: no peer tier */
    struct pget *gets;
    struct ppin *pins;
    struct hpin *hpins;
    uint64_t next_id;
    uint64_t hits, bad_csum, fetch_failed, expired;
};

static struct pgs *pg_of(struct cl_ctx *d)
{
    return d->cl ? d->cl->pg : NULL;
}

/* ---------------------------------------------------------- endpoints */

static void ep_close(struct cl_ctx *d, struct member *m)
{
    if (!m->conn) return;
    cl_ml_unlink(&d->cl->eps, CL_LK_EP, m);
    peer_disconnect(d->cl->pt, m->conn);
    m->conn = NULL;
}

static void ucx_forget(struct member *m)
{
    free(m->ucx_id);
    m->ucx_id = NULL;
    m->ucx_alen = m->ucx_rlen = 0;
    m->ucx_base = 0;
}

int pg_reachable(const struct cl_ctx *d, const struct member *m)
{
    return m && d->cl->pt && m->ucx_id && (!m->conn || peer_conn_ok(m->conn));
}

/* Past cluster.max_peer_eps, close the least recently used endpoints
 * that no fetch uses (never keep's). */
static void eps_trim(struct cl_ctx *d, const struct member *keep)
{
    struct cluster *c = d->cl;
    uint64_t max = d->cfg.cluster_max_peer_eps;
    for (struct member *m = c->eps.tail, *prev; m && max && c->eps.n > max; m = prev) {
        prev = m->lk[CL_LK_EP].prev;
        if (m == keep || peer_conn_busy(m->conn)) continue;
        ep_close(d, m);
        c->eps_evicted++;
    }
}

/* Failed endpoints no fetch uses are closed (the next fetch makes a
 * fresh one); then the cap, for endpoints that were busy when it was
 * passed. A bounded batch per tick. */
static void eps_tick(struct cl_ctx *d)
{
    struct cluster *c = d->cl;
    uint32_t k = 0;
    for (struct member *m = c->eps.tail, *prev; m && k < 64; m = prev, k++) {
        prev = m->lk[CL_LK_EP].prev;
        if (!peer_conn_ok(m->conn) && !peer_conn_busy(m->conn)) ep_close(d, m);
    }
    eps_trim(d, NULL);
}

/* A new endpoint to m from its identity. 0, or -1: the identity is
 * forgotten, so that m is asked for it again (have_ucx says we lack it). */
static int ep_open(struct cl_ctx *d, struct member *m)
{
    char err[256] = "KVT_FAULT=peer_ep";
    if (!fault_hit(FAULT_PEER_EP) &&
        peer_connect(d->cl->pt, m->ucx_id, m->ucx_alen, m->ucx_id + m->ucx_alen, m->ucx_rlen,
                     m->ucx_base, &m->conn, err, sizeof err) == 0) {
        d->cl->eps_opened++;
        log_debug("peer", "node %u: UCX endpoint made", (unsigned)m->id);
        return 0;
    }
    if (!m->ucx_warned++)
        log_warn("peer", "node %u: no UCX endpoint (its UCX identity is asked for again): %s",
                 (unsigned)m->id, err);
    m->conn = NULL;
    ucx_forget(m);
    return -1;
}

/* m's endpoint for a fetch about to start: made from its identity if it
 * has none, and first in the LRU. NULL if none can be made. */
static struct peer_conn *pg_conn(struct cl_ctx *d, struct member *m)
{
    struct cluster *c = d->cl;
    if (!pg_reachable(d, m)) return NULL;
    if (m->conn) cl_ml_unlink(&c->eps, CL_LK_EP, m);
    else if (ep_open(d, m) != 0) return NULL;
    cl_ml_push(&c->eps, CL_LK_EP, m, 1);
    eps_trim(d, m);
    return m->conn;
}

static int same_ucx(const struct member *m, const Kvtier__PeerMsg *pm)
{
    return m->ucx_id && m->ucx_alen == pm->ucx_addr.len && m->ucx_rlen == pm->ucx_rkey.len &&
           m->ucx_base == pm->pool_base &&
           !memcmp(m->ucx_id, pm->ucx_addr.data, m->ucx_alen) &&
           !memcmp(m->ucx_id + m->ucx_alen, pm->ucx_rkey.data, m->ucx_rlen);
}

void pg_member_ucx(struct cl_ctx *d, struct member *m, const Kvtier__PeerMsg *pm)
{
    if (!pg_of(d) || !d->cl->pt || !pm->ucx_addr.len || !pm->ucx_rkey.len ||
        same_ucx(m, pm))
        return;
    log_info("peer", "node %u: UCX identity received%s", (unsigned)m->id,
             m->ucx_id ? " (a new one: its endpoint is closed)" : "");
    ep_close(d, m);
    ucx_forget(m);
    if (!(m->ucx_id = malloc(pm->ucx_addr.len + pm->ucx_rkey.len))) abort();
    memcpy(m->ucx_id, pm->ucx_addr.data, pm->ucx_addr.len);
    memcpy(m->ucx_id + pm->ucx_addr.len, pm->ucx_rkey.data, pm->ucx_rkey.len);
    m->ucx_alen = pm->ucx_addr.len;
    m->ucx_rlen = pm->ucx_rkey.len;
    m->ucx_base = pm->pool_base;
}

/* ---------------------------------------------------------- holder side */

static void hpin_release(struct cl_ctx *d, struct hpin *h)
{
    struct member *m = cl_find(d->cl, h->peer);
    if (m && m->pins_held) m->pins_held--;
    if (h->flipped != IDX_NONE) ((uint8_t *)th_ptr(d->host, h->flipped))[0] ^= 0xff;
    for (uint32_t i = 0; i < h->n; i++) {
        uint32_t s = h->slot[i];
        if (s == IDX_NONE) continue;
        if (idx_unpin(d->idx, s) == 0 && idx_at(d->idx, s)->state == IDX_DOOMED)
            d->host->free_slot(d->host->core, s);
    }
    free(h->slot);
    free(h);
}

/* Unpin the pin id of peer; with id 0, every pin of peer; with peer 0
 * too, those past their deadline at now. */
static void hpins_drop(struct cl_ctx *d, uint32_t peer, uint64_t now, uint64_t id)
{
    struct pgs *s = pg_of(d);
    for (struct hpin **pp = &s->hpins, *h; (h = *pp);) {
        int drop = id ? h->id == id && h->peer == peer
                 : peer ? h->peer == peer : now >= h->deadline;
        if (!drop) {
            pp = &h->next;
            continue;
        }
        *pp = h->next;
        hpin_release(d, h);
    }
    peer_serving(d->cl->pt, s->hpins != NULL);
}

static uint32_t pin_one(struct cl_ctx *d, uint16_t ns, const uint8_t *key)
{
    if (ns == NS_NONE) return IDX_NONE;
    uint32_t s = idx_find(d->idx, ns, (const kvt_key *)key);
    if (s == IDX_NONE || idx_at(d->idx, s)->state != IDX_READY || !th_in_dram(d->host, s))
        return IDX_NONE;
    idx_pin(d->idx, s);
    return s;
}

static void send_pinned(struct cl_ctx *d, struct member *m, uint64_t id,
                        const struct hpin *h)
{
    uint64_t *v = calloc(3 * (size_t)h->n + 1, sizeof *v);
    if (!v) abort();
    Kvtier__PeerPinned pd = KVTIER__PEER_PINNED__INIT;
    pd.pin_id = id;
    pd.n_offset = pd.n_size = pd.n_checksum = h->n;
    pd.offset = v, pd.size = v + h->n, pd.checksum = v + 2 * (size_t)h->n;
    for (uint32_t i = 0; i < h->n; i++) {
        if (h->slot[i] == IDX_NONE) continue;
        const struct idx_entry *e = idx_at(d->idx, h->slot[i]);
        pd.offset[i] = th_off(d->host, h->slot[i]);
        pd.size[i] = e->size;
        pd.checksum[i] = h->slot[i] == h->flipped && h->lie ? h->lie : e->csum;
    }
    Kvtier__PeerMsg pm = KVTIER__PEER_MSG__INIT;
    pm.body_case = KVTIER__PEER_MSG__BODY_PINNED;
    pm.pinned = &pd;
    cl_send(d, m, &pm);
    free(v);
}

/* KVT_FAULT=peer_corrupt / peer_lie: flip the first byte of pinned chunk
 * i (restored at unpin); lying, report the flipped bytes' checksum. */
static int fault_flip(struct cl_ctx *d, struct hpin *h, uint32_t i)
{
    int lie = fault_hit(FAULT_PEER_LIE);
    if (!lie && !fault_hit(FAULT_PEER_CORRUPT)) return 0;
    uint8_t *p = th_ptr(d->host, h->slot[i]);
    p[0] ^= 0xff;
    h->flipped = h->slot[i];
    if (lie) h->lie = kvt_checksum(p, idx_at(d->idx, h->slot[i])->size);
    return 1;
}

void pg_on_pin(struct cl_ctx *d, struct member *m, const Kvtier__PeerMsg *pm)
{
    const Kvtier__PeerPin *p = pm->pin;
    struct hpin *h = calloc(1, sizeof *h);
    if (!h || !(h->slot = calloc(p->n_keys + 1, sizeof *h->slot))) abort();
    uint16_t ns = d->host->ns_find(d->host->core, p->ns);
    uint32_t pinned = 0;
    h->id = p->pin_id;
    h->peer = m->id;
    h->n = (uint32_t)p->n_keys;
    h->flipped = IDX_NONE;
    h->deadline = cl_clock(d) + d->cfg.lease_timeout_ms;
    int room = ++m->pins_held <= d->cfg.cluster_pins_max_per_peer; /* back at release */
    for (uint32_t i = 0; i < h->n; i++)
        pinned += (h->slot[i] = room ? pin_one(d, ns, p->keys[i].data) : IDX_NONE) != IDX_NONE;
    for (uint32_t i = 0; i < h->n && pinned; i++)
        if (h->slot[i] != IDX_NONE && fault_flip(d, h, i)) break;
    send_pinned(d, m, p->pin_id, h);
    if (!pinned) {
        hpin_release(d, h);
        return;
    }
    h->next = pg_of(d)->hpins;
    pg_of(d)->hpins = h;
    peer_serving(d->cl->pt, 1);
}

void pg_on_unpin(struct cl_ctx *d, struct member *m, const Kvtier__PeerMsg *pm)
{
    hpins_drop(d, m->id, 0, pm->unpin->pin_id);
}

/* ------------------------------------------------------- requester side */

static void send_unpin(struct cl_ctx *d, uint32_t holder, uint64_t id)
{
    struct member *m = cl_find(d->cl, holder);
    if (!m) return;
    Kvtier__PeerUnpin u = KVTIER__PEER_UNPIN__INIT;
    u.pin_id = id;
    Kvtier__PeerMsg pm = KVTIER__PEER_MSG__INIT;
    pm.body_case = KVTIER__PEER_MSG__BODY_UNPIN;
    pm.unpin = &u;
    cl_send(d, m, &pm);
}

static void pget_free(struct cl_ctx *d, struct pget *g)
{
    struct pgs *s = pg_of(d);
    for (struct pget **pp = &s->gets; *pp; pp = &(*pp)->next)
        if (*pp == g) {
            *pp = g->next;
            break;
        }
    d->host->ns_unhold(d->host->core, g->ns);
    free(g->keys);
    free(g->slots);
    free(g->it);
    free(g);
}

static void maybe_free(struct cl_ctx *d, struct pget *g)
{
    if (g->answered && !g->fetching && !g->pins_out && !g->resolving) pget_free(d, g);
}

/* Commit the verified chunks in key order, each the parent of the next. */
static void commit_fetched(struct cl_ctx *d, struct pget *g)
{
    for (uint32_t k = g->n_local; k < g->n_keys; k++) {
        struct pitem *it = &g->it[k];
        if (it->st != PI_OK) continue;
        uint32_t parent = k && g->slots[k - 1] != IDX_NONE ? g->slots[k - 1] : IDX_NONE;
        if (parent != IDX_NONE && idx_at(d->idx, parent)->state != IDX_READY)
            parent = IDX_NONE;
        d->host->commit(d->host->core, it->slot, it->csum, parent);
        g->slots[k] = it->slot;
        it->st = PI_NONE; /* the index owns it now */
        pg_of(d)->hits++;
    }
}

/* Let go of the local prefix pinned while the GET waited. */
static void unpin_local(struct cl_ctx *d, struct pget *g)
{
    for (uint32_t k = 0; k < g->n_local; k++)
        if (idx_unpin(d->idx, g->slots[k]) == 0 &&
            idx_at(d->idx, g->slots[k])->state == IDX_DOOMED)
            d->host->free_slot(d->host->core, g->slots[k]), g->slots[k] = IDX_NONE;
}

/* Answer with the local prefix plus the verified chunks that follow
 * (nothing is sent once the client left: g->park is NULL then). */
static void answer(struct cl_ctx *d, struct pget *g)
{
    commit_fetched(d, g);
    uint32_t n = 0;
    unpin_local(d, g);
    while (n < g->n_keys && g->slots[n] != IDX_NONE &&
           idx_at(d->idx, g->slots[n])->state == IDX_READY)
        n++;
    g->answered = 1;
    if (!g->park) return;
    d->host->get_answer(d->host->core, g->park, g->ns, g->inline_, g->n_keys,
                        g->slots, n);
    g->park = NULL;
}

static void ppin_free(struct cl_ctx *d, struct ppin *p)
{
    struct pgs *s = pg_of(d);
    for (struct ppin **pp = &s->pins; *pp; pp = &(*pp)->next)
        if (*pp == p) {
            *pp = p->next;
            break;
        }
    if (p->g) p->g->pins_out--;
    free(p->k);
    free(p);
}

static void settle(struct cl_ctx *d, struct pget *g)
{
    if (g->sync) return;
    if (!g->answered && !g->fetching && !g->pins_out && !g->resolving) answer(d, g);
    maybe_free(d, g);
}

/* The item is settled (verified, or a miss): free its space if it will
 * not be kept; unpin once its pin is done. */
static void item_done(struct cl_ctx *d, struct pitem *it)
{
    struct pget *g = it->g;
    g->fetching--;
    if (it->st == PI_MISS || g->answered) {
        d->host->free_slot(d->host->core, it->slot);
        it->st = PI_MISS;
    }
    struct ppin *p = it->pin;
    if (--p->left == 0) {
        send_unpin(d, p->holder, p->id);
        ppin_free(d, p);
    }
    settle(d, g);
}

static void send_pin(struct cl_ctx *d, struct pget *g, uint32_t holder, const uint32_t *k,
                     uint32_t n, const char *ns);

/* Key k of g came from a holder as bytes that are not the committer's:
 * ask the next further holder the owners listed that has an endpoint
 * (each at most once). 1 if one was asked; 0: the key is a miss. */
static int try_next(struct cl_ctx *d, struct pget *g, uint32_t k)
{
    struct pitem *it = &g->it[k];
    while (!g->answered && it->tried < it->want.n_alt && it->tried < GX_ALT_MAX) {
        uint32_t h = it->want.alt[it->tried++];
        struct member *m = cl_find(d->cl, h);
        if (h == d->cl->self_id || !pg_reachable(d, m)) continue;
        log_warn("peer", "trying node %u for the chunk instead", (unsigned)h);
        send_pin(d, g, h, &k, 1, d->host->ns_name(d->host->core, g->ns));
        return 1;
    }
    return 0;
}

/* The worker's verdict on a fetched chunk (core thread). */
static void verified(struct wq_job *j)
{
    struct pitem *it = (struct pitem *)((char *)j - offsetof(struct pitem, check));
    struct pget *g = it->g;
    struct cl_ctx *d = g->d;
    if (!it->check.ok) {
        pg_of(d)->bad_csum++;
        log_warn("peer", "chunk from node %u failed its checksum",
                 (unsigned)it->pin->holder);
        try_next(d, g, (uint32_t)(it - g->it)); /* before item_done: g stays open */
        it->st = PI_MISS;
    } else {
        struct member *m = cl_find(d->cl, it->pin->holder);
        if (m) m->bytes_in += it->check.n;
        it->st = PI_OK;
    }
    item_done(d, it);
}

/* A fetch ended: a failure settles the item now; bytes go to the worker
 * for their checksum (the item stays counted in g->fetching meanwhile). */
static void fetched(void *arg, int status)
{
    struct pitem *it = arg;
    struct pget *g = it->g;
    struct cl_ctx *d = g->d;
    struct pgs *s = pg_of(d);
    it->f = NULL;
    if (status != 0 || !s->wq) {
        s->fetch_failed += status != 0;
        it->st = PI_MISS;
        item_done(d, it);
        return;
    }
    wq_csum_init(&it->check, th_ptr(d->host, it->slot), idx_at(d->idx, it->slot)->size,
                 it->csum, verified);
    it->st = PI_VERIFY;
    wq_submit(s->wq, &it->check.job);
}

/* Start pulling item k of g from the holder's pool. */
static int start_fetch(struct cl_ctx *d, struct pget *g, struct ppin *p, uint32_t k,
                       uint64_t off, uint64_t size, uint64_t csum)
{
    struct pitem *it = &g->it[k];
    struct member *m = cl_find(d->cl, p->holder);
    uint32_t slot;
    if (size && (size != it->want.size || csum != it->want.csum)) {
        /* not the committer's chunk: never fetched, let alone kept */
        pg_of(d)->bad_csum++;
        log_warn("peer", "node %u offers a chunk whose size or checksum differs from "
                 "its owners' record", (unsigned)p->holder);
        try_next(d, g, k);
        return 0;
    }
    csum = it->want.csum;
    struct peer_conn *pc;
    if (!m || size == 0 || size > d->cfg.max_chunk_bytes ||
        idx_find(d->idx, g->ns, &g->keys[k]) != IDX_NONE || !(pc = pg_conn(d, m)) ||
        d->host->reserve(d->host->core, g->ns, &g->keys[k], size, &slot) != KVT_OK)
        return 0;
    it->g = g;
    it->pin = p;
    it->slot = slot;
    it->csum = csum;
    it->f = peer_fetch(d->cl->pt, pc, off, th_ptr(d->host, slot), size, fetched, it);
    if (!it->f) {
        d->host->free_slot(d->host->core, slot);
        return 0;
    }
    it->st = PI_FETCH;
    g->fetching++;
    p->left++;
    return 1;
}

static int pinned_ok(const struct ppin *p, const Kvtier__PeerPinned *pd)
{
    return pd->n_offset == p->n && pd->n_size == p->n && pd->n_checksum == p->n;
}

const char *pg_check(struct cl_ctx *d, const struct member *m, const Kvtier__PeerMsg *pm)
{
    if (pm->body_case == KVTIER__PEER_MSG__BODY_PIN) {
        const Kvtier__PeerPin *p = pm->pin;
        if (!p->ns || !p->ns[0] || p->n_keys == 0 || p->n_keys > d->cfg.max_keys)
            return "malformed pin request";
        for (size_t i = 0; i < p->n_keys; i++)
            if (!wire_key_ok(&p->keys[i])) return "malformed pin request";
        return NULL;
    }
    if (pm->body_case != KVTIER__PEER_MSG__BODY_PINNED) return NULL;
    struct ppin *p = pg_of(d) ? pg_of(d)->pins : NULL;
    while (p && !(p->id == pm->pinned->pin_id && p->holder == m->id)) p = p->next;
    if (!p || p->answered) return "pinned answer to no pin request";
    return pinned_ok(p, pm->pinned) ? NULL : "malformed pinned answer";
}

void pg_on_pinned(struct cl_ctx *d, struct member *m, const Kvtier__PeerMsg *pm)
{
    const Kvtier__PeerPinned *pd = pm->pinned;
    struct ppin *p = pg_of(d)->pins;
    while (p && !(p->id == pd->pin_id && p->holder == m->id)) p = p->next;
    struct pget *g = p->g;
    p->answered = 1;
    for (uint32_t j = 0; j < p->n && g && !g->answered; j++)
        start_fetch(d, g, p, p->k[j], pd->offset[j], pd->size[j], pd->checksum[j]);
    if (p->left == 0) { /* nothing to pull: let go at once */
        send_unpin(d, p->holder, p->id);
        ppin_free(d, p);
    }
    if (g) settle(d, g);
}

/* Ask holder for keys of g at indices k[0..n). */
static void send_pin(struct cl_ctx *d, struct pget *g, uint32_t holder, const uint32_t *k,
                     uint32_t n, const char *ns)
{
    struct pgs *s = pg_of(d);
    struct ppin *p = calloc(1, sizeof *p);
    ProtobufCBinaryData *kv = calloc(n, sizeof *kv);
    if (!p || !kv || !(p->k = calloc(n, sizeof *p->k))) abort();
    memcpy(p->k, k, n * sizeof *k);
    p->id = ++s->next_id;
    p->holder = holder;
    p->n = n;
    p->g = g;
    p->next = s->pins;
    s->pins = p;
    g->pins_out++;
    for (uint32_t i = 0; i < n; i++) kv[i] = (ProtobufCBinaryData){KVT_KEY_LEN, g->keys[k[i]].b};
    Kvtier__PeerPin pin = KVTIER__PEER_PIN__INIT;
    pin.pin_id = p->id;
    pin.ns = (char *)ns;
    pin.keys = kv;
    pin.n_keys = n;
    Kvtier__PeerMsg pm = KVTIER__PEER_MSG__INIT;
    pm.body_case = KVTIER__PEER_MSG__BODY_PIN;
    pm.pin = &pin;
    cl_send(d, cl_find(d->cl, holder), &pm);
    free(kv);
}

/* Holders known: pin the leading run of keys a connected peer holds. */
static void resolved(struct cl_ctx *d, void *arg, const uint32_t *holders,
                     const struct gx_sum *sums, uint32_t n)
{
    struct pget *g = arg;
    for (uint32_t j = 0; j < n; j++) g->it[g->n_local + j].want = sums[j];
    g->resolving = 0;
    if (g->answered) {
        maybe_free(d, g);
        return;
    }
    uint32_t run = 0, *k = calloc(n + 1, sizeof *k);
    if (!k) abort();
    while (run < n && holders[run]) {
        if (!pg_reachable(d, cl_find(d->cl, holders[run]))) break;
        run++;
    }
    for (uint32_t i = 0; i < run && !g->answered; i++) {
        if (!holders[i]) continue;
        uint32_t h = holders[i], c = 0;
        for (uint32_t j = i; j < run; j++)
            if (holders[j] == h) k[c++] = g->n_local + j;
        for (uint32_t j = i; j < run; j++) /* taken */
            if (holders[j] == h && j != i) ((uint32_t *)holders)[j] = 0;
        send_pin(d, g, h, k, c, d->host->ns_name(d->host->core, g->ns));
    }
    free(k);
    settle(d, g);
}

static struct pget *pget_new(struct cl_ctx *d, const Kvtier__Get *q, uint16_t ns,
                             const uint32_t *slots, size_t n)
{
    struct pget *g = calloc(1, sizeof *g);
    if (!g) abort();
    g->d = d;
    g->ns = ns;
    d->host->ns_hold(d->host->core, ns); /* parked: no slot may hold it yet (ns.h) */
    g->inline_ = q->inline_;
    g->n_keys = (uint32_t)q->n_keys;
    g->n_local = (uint32_t)n;
    g->keys = calloc(g->n_keys, sizeof *g->keys);
    g->slots = calloc(g->n_keys, sizeof *g->slots);
    g->it = calloc(g->n_keys, sizeof *g->it);
    if (!g->keys || !g->slots || !g->it) abort();
    for (uint32_t i = 0; i < g->n_keys; i++) {
        memcpy(g->keys[i].b, q->keys[i].data, KVT_KEY_LEN);
        g->slots[i] = i < n ? slots[i] : IDX_NONE;
    }
    for (uint32_t i = 0; i < n; i++) idx_pin(d->idx, slots[i]); /* kept till the answer */
    return g;
}

/* Past the deadline: answer with what is verified, cancel the rest. */
static void expire(struct cl_ctx *d, struct pget *g)
{
    pg_of(d)->expired++;
    for (uint32_t k = g->n_local; k < g->n_keys; k++)
        if (g->it[k].f) peer_cancel(d->cl->pt, g->it[k].f);
    answer(d, g);
    maybe_free(d, g);
}

/* park.c: the client left. Settle as an answer would, sending nothing. */
static void get_gone(void *ctx, void *owner)
{
    struct cl_ctx *d = ctx;
    struct pget *g = owner;
    g->park = NULL;
    answer(d, g);
    maybe_free(d, g);
}

static void get_due(void *ctx, void *owner)
{
    struct cl_ctx *d = ctx;
    expire(d, owner);
}

static const struct park_ops get_ops = {get_gone, get_due};

int cluster_get(struct cl_ctx *d, uint32_t pipe, uint64_t req_id, const Kvtier__Get *q,
                const uint32_t *slots, size_t n)
{
    struct pgs *s = pg_of(d);
    if (!s || !d->cl->pt || q->local_only || n >= q->n_keys) return 0;
    uint16_t ns = d->host->ns_claim(d->host->core, q->ns, 0);
    if (ns == NS_NONE) return 0;
    struct pget *g = pget_new(d, q, ns, slots, n);
    uint64_t dl = q->deadline_ms ? q->deadline_ms : d->cfg.nvme_get_deadline_ms;
    g->pipe = pipe;
    g->req_id = req_id;
    g->deadline = cl_clock(d) + dl;
    g->next = s->gets;
    s->gets = g;
    g->resolving = g->sync = 1;
    gx_resolve(d, g->keys + n, g->n_keys - (uint32_t)n, gx_ns_hash(q->ns), resolved, g);
    g->sync = 0;
    int waiting = g->pins_out || g->fetching || g->resolving;
    if (waiting && (g->park = d->host->park(d->host->core, pipe, req_id, &get_ops, d, g))) {
        d->host->park_deadline(d->host->core, g->park, g->deadline);
        return 1;
    }
    unpin_local(d, g); /* answered now, by the caller, with the local prefix */
    g->answered = 1;   /* what is in flight ends without a reply */
    maybe_free(d, g);
    return 0;
}

/* Pins a holder never answered, long after their GET was answered. */
static void reap(struct cl_ctx *d, uint64_t now)
{
    struct pgs *s = pg_of(d);
    for (struct ppin *p = s->pins, *next; p; p = next) {
        next = p->next;
        struct pget *g = p->g;
        if (p->answered || !g->answered || now < g->deadline + PG_REAP_MS) continue;
        ppin_free(d, p);
        maybe_free(d, g);
    }
}

void pg_tick(struct cl_ctx *d)
{
    struct pgs *s = pg_of(d);
    if (!s) return;
    uint64_t now = cl_clock(d);
    hpins_drop(d, 0, now, 0);
    reap(d, now); /* parked GETs' deadlines are park.c's */
    if (d->cl->pt) peer_progress(d->cl->pt);
    eps_tick(d);
}

void pg_poll(struct cl_ctx *d)
{
    if (!pg_of(d) || !d->cl->pt) return;
    peer_progress(d->cl->pt);
}

/* m died or restarted: its pins here go, our pins there are misses, and
 * its endpoint is closed (its fetches fail from the next progress) and
 * its UCX identity forgotten (a restart has a new one, sent again since
 * we no longer say have_ucx). */
void pg_member_down(struct cl_ctx *d, struct member *m)
{
    struct pgs *s = pg_of(d);
    if (!s) return;
    hpins_drop(d, m->id, 0, 0);
    for (struct ppin *p = s->pins, *next; p; p = next) {
        next = p->next;
        if (p->holder != m->id || p->answered) continue;
        struct pget *g = p->g;
        ppin_free(d, p);
        settle(d, g);
    }
    ep_close(d, m);
    ucx_forget(m);
    m->ucx_acked = 0;
}

int pg_open(struct cl_ctx *d)
{
    char err[256];
    if (fault_init(NULL, err, sizeof err) != 0) { /* peer_corrupt */
        log_error("peer", "%s", err);
        return -1;
    }
    struct pgs *s = calloc(1, sizeof *s);
    if (!s) abort();
    d->cl->pg = s;
    if (!d->dram) { /* no pool to serve (the peer-message fuzz target) */
        log_info("peer", "no DRAM pool: no peer tier");
        return 0;
    }
    if (peer_open(d->dram->base, d->dram->bytes, (int)d->cfg.cluster_ucx_wakeup, &d->cl->pt,
                  err, sizeof err) != 0) {
        log_warn("peer", "no peer tier (GETs stay local): %s", err);
        return 0;
    }
    struct wq_opts o = {.name = "peer-checksum", .threads = 1, .cq = d->cq};
    if (workq_open(&o, &s->wq) != 0) {
        log_error("peer", "cannot start the checksum worker");
        return -1;
    }
    log_info("peer", "peer tier ready: DRAM pool registered with UCX");
    return 0;
}

void pg_close(struct cl_ctx *d)
{
    struct pgs *s = pg_of(d);
    if (!s) return;
    for (struct pget *g = s->gets, *next; g; g = next) {
        next = g->next;
        if (!g->answered) expire(d, g);
    }
    hpins_drop(d, 0, UINT64_MAX, 0);
    for (uint32_t i = 0; i < d->cl->n; i++) ep_close(d, d->cl->m[i]);
    if (d->cl->pt) peer_progress(d->cl->pt); /* fetches end: space freed */
    workq_close(s->wq, WQ_DRAIN); /* checks what is queued; verdicts applied */
    s->wq = NULL;
}

/* After gx_close (resolutions answered): free what is left. */
void pg_free(struct cl_ctx *d)
{
    struct pgs *s = pg_of(d);
    if (!s) return;
    while (s->pins) ppin_free(d, s->pins);
    while (s->gets) pget_free(d, s->gets);
    peer_close(d->cl->pt);
    d->cl->pt = NULL;
    free(s);
    d->cl->pg = NULL;
}

void pg_fill_peers(struct cl_ctx *d, Kvtier__PeersResp *pr)
{
    struct pgs *s = pg_of(d);
    if (!s) return;
    uint64_t bytes, failed;
    peer_counts(d->cl->pt, &bytes, &failed);
    pr->peer_tier = d->cl->pt != NULL;
    pr->remote_hits = s->hits;
    pr->bad_checksums = s->bad_csum;
    pr->fetch_failures = s->fetch_failed;
    pr->get_deadlines = s->expired;
    pr->fetched_bytes = bytes;
    for (const struct hpin *h = s->hpins; h; h = h->next) pr->pinned_for_peers++;
}
