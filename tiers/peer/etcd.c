/*
 * etcd.c -- membership from etcd (member.h backend), for sites that run it.
 *
 * Design: each node puts prefix<id> = "v1 <inc> <left> <addr> <meta hex>"
 * under a lease of cfg.lease_ms and keeps the lease alive; every node
 * reads the prefix once (a range) and then watches it from the next
 * revision. A key that appears is a member alive; one that goes is a
 * member dead (its lease ran out: it crashed or was cut off) or, if it
 * said "left" first, a member that left: a leaving node rewrites its key
 * with left = 1 and revokes its lease. etcd's revision is the epoch every
 * node agrees on (mb_set_epoch).
 *
 * etcd speaks HTTP (etcd_client.c), which blocks, and the member table
 * belongs to one thread (member.h). So one worker thread does every
 * request -- grant, put, range, watch, keepalive every lease/3 -- and
 * hands what it learns to the owning thread through a queue under a
 * mutex; tick() drains it and changes the table. The worker never
 * touches the table; the owning thread never waits on etcd, except in
 * leave(), which is bounded by the request timeout.
 *
 * When etcd cannot be reached the worker logs why (once per outage, from
 * tick) and tries again with backoff, on every endpoint. The view is
 * kept as it was meanwhile: nothing is known to have changed. When it is
 * back, a lease that expired meanwhile is granted anew and the key put
 * again, and the table is resynchronised from a fresh range: members
 * missing from it are dead. A watch that fails or whose history was
 * compacted is resynchronised the same way.
 *
 * Everything etcd returns is untrusted: keys outside the prefix, ids that
 * are not decimal 1..2^32-1, values that do not parse are counted as bad
 * and ignored.
 */
#include "etcd.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "etcd_client.h"
#include "log.h"

#define ET_URLS_MAX 1024
#define ET_PREFIX_MAX 256
#define ET_TIMEOUT_MS 2000
#define ET_QUEUE_MAX (1u << 20)

enum et_kind { ET_PUT, ET_DEL, ET_SNAP_BEGIN, ET_SNAP_END, ET_UP, ET_DOWN };

struct et_ev { /* worker -> owning thread */
    enum et_kind kind;
    uint32_t id;
    int left;
    uint64_t inc;
    int64_t rev;
    char addr[MB_ADDR_MAX];
    uint8_t *meta;
    size_t meta_len;
    char err[256];
    struct et_ev *next;
};

struct et {
    struct mb *mb;
    char urls[ET_URLS_MAX], prefix[ET_PREFIX_MAX], self_key[ET_PREFIX_MAX + 16];
    uint32_t lease_s;
    pthread_t thr;
    int started;
    volatile int stop;     /* set by the owning thread */
    pthread_mutex_t mtx;   /* guards q_*, val, vlen, reput, bad */
    struct et_ev *q_head, *q_tail;
    uint32_t q_len;
    int q_lost;            /* events dropped: the worker resyncs */
    char val[EC_MAX_VALUE];
    size_t vlen;
    int reput;             /* the value changed: put it again */
    uint64_t bad;          /* keys or values refused */
    int64_t lease;         /* the worker's (read by leave() after join) */
    /* the owning thread's */
    int up;
    char last_err[256];
    int64_t rev;           /* the newest etcd revision applied: the epoch */
    uint32_t *snap;        /* ids seen in the snapshot being applied */
    size_t n_snap, cap_snap;
};

static struct et *et_of(struct mb *mb)
{
    return mb_backend(mb);
}

/* ------------------------------------------------------------- values */

size_t etcd_value_make(char *out, size_t cap, uint64_t inc, int left, const char *addr,
                       const uint8_t *meta, size_t meta_len)
{
    int n = snprintf(out, cap, "v1 %" PRIu64 " %d %s ", inc, left ? 1 : 0, addr);
    if (n < 0 || (size_t)n + meta_len * 2 + 2 > cap) return 0;
    for (size_t i = 0; i < meta_len; i++) n += snprintf(out + n, 3, "%02x", meta[i]);
    if (!meta_len) out[n++] = '-';
    out[n] = 0;
    return (size_t)n;
}

static int hexval(uint8_t c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
}

/* The next space-separated field of v[*at..len) into f (cap), or -1. */
static int field(const uint8_t *v, size_t len, size_t *at, char *f, size_t cap)
{
    size_t n = 0;
    while (*at < len && v[*at] != ' ') {
        if (n + 1 == cap || v[*at] < 0x21 || v[*at] > 0x7e) return -1;
        f[n++] = (char)v[(*at)++];
    }
    f[n] = 0;
    if (*at < len) (*at)++;
    return n ? 0 : -1;
}

static int parse_u64(const char *s, uint64_t max, uint64_t *out)
{
    uint64_t v = 0;
    if (!*s || strlen(s) > 20) return -1;
    for (; *s; s++) {
        if (*s < '0' || *s > '9' || v > (UINT64_MAX - 9) / 10) return -1;
        v = v * 10 + (uint64_t)(*s - '0');
    }
    if (v > max) return -1;
    *out = v;
    return 0;
}

int etcd_value_parse(const uint8_t *v, size_t len, uint64_t *inc, int *left, char *addr,
                     uint8_t *meta, size_t *meta_len)
{
    char f[MB_META_MAX * 2 + 2];
    size_t at = 0;
    uint64_t l;
    if (field(v, len, &at, f, sizeof f) < 0 || strcmp(f, "v1")) return -1;
    if (field(v, len, &at, f, sizeof f) < 0 || parse_u64(f, UINT64_MAX, inc) < 0) return -1;
    if (field(v, len, &at, f, sizeof f) < 0 || parse_u64(f, 1, &l) < 0) return -1;
    *left = (int)l;
    if (field(v, len, &at, addr, MB_ADDR_MAX) < 0) return -1;
    if (field(v, len, &at, f, sizeof f) < 0 || at != len) return -1;
    *meta_len = 0;
    if (!strcmp(f, "-")) return 0;
    size_t n = strlen(f);
    if (n % 2 || n / 2 > MB_META_MAX) return -1;
    for (size_t i = 0; i < n; i += 2) {
        int hi = hexval((uint8_t)f[i]), lo = hexval((uint8_t)f[i + 1]);
        if (hi < 0 || lo < 0) return -1;
        meta[(*meta_len)++] = (uint8_t)(hi << 4 | lo);
    }
    return 0;
}

/* -------------------------------------------------------- the worker */

static void push(struct et *e, struct et_ev *ev)
{
    pthread_mutex_lock(&e->mtx);
    if (e->q_len >= ET_QUEUE_MAX && ev->kind != ET_DOWN) {
        e->q_lost = 1;
        pthread_mutex_unlock(&e->mtx);
        free(ev->meta);
        free(ev);
        return;
    }
    ev->next = NULL;
    if (e->q_tail) e->q_tail->next = ev;
    else e->q_head = ev;
    e->q_tail = ev;
    e->q_len++;
    pthread_mutex_unlock(&e->mtx);
}

static struct et_ev *ev_new(enum et_kind k, int64_t rev)
{
    struct et_ev *ev = calloc(1, sizeof *ev);
    if (!ev) abort(); /* control-plane allocation */
    ev->kind = k;
    ev->rev = rev;
    return ev;
}

static void count_bad(struct et *e)
{
    pthread_mutex_lock(&e->mtx);
    e->bad++;
    pthread_mutex_unlock(&e->mtx);
}

/* The member id named by key (prefix<decimal id>), or 0. */
static uint32_t key_id(const struct et *e, const uint8_t *key, size_t klen)
{
    size_t pl = strlen(e->prefix);
    char digits[16];
    uint64_t id;
    if (klen <= pl || klen - pl >= sizeof digits || memcmp(key, e->prefix, pl)) return 0;
    memcpy(digits, key + pl, klen - pl);
    digits[klen - pl] = 0;
    if (digits[0] == '0' || parse_u64(digits, UINT32_MAX, &id) < 0) return 0;
    return (uint32_t)id;
}

static void on_kv(void *arg, const uint8_t *key, size_t klen, const uint8_t *val, size_t vlen,
                  int deleted, int64_t rev)
{
    struct et *e = arg;
    uint32_t id = key_id(e, key, klen);
    uint8_t meta[MB_META_MAX];
    if (!id) {
        count_bad(e);
        return;
    }
    struct et_ev *ev = ev_new(deleted ? ET_DEL : ET_PUT, rev);
    ev->id = id;
    if (!deleted) {
        if (etcd_value_parse(val, vlen, &ev->inc, &ev->left, ev->addr, meta, &ev->meta_len) <
            0) {
            free(ev);
            count_bad(e);
            return;
        }
        if (ev->meta_len && !(ev->meta = malloc(ev->meta_len))) abort();
        memcpy(ev->meta, meta, ev->meta_len);
    }
    if (deleted && id == mb_self(e->mb)->id) { /* our key went: put it back */
        pthread_mutex_lock(&e->mtx);
        e->reput = 1;
        pthread_mutex_unlock(&e->mtx);
    }
    push(e, ev);
}

static void down(struct et *e, const char *err)
{
    struct et_ev *ev = ev_new(ET_DOWN, 0);
    snprintf(ev->err, sizeof ev->err, "%s", err);
    push(e, ev);
}

/* Put our value (again) under the lease, granting one if needed. */
static int register_self(struct et *e, struct ec *ec, char *err, size_t errlen)
{
    char val[EC_MAX_VALUE];
    size_t vlen;
    int64_t rev;
    if (!e->lease && ec_grant(ec, e->lease_s, &e->lease, err, errlen) < 0) return -1;
    pthread_mutex_lock(&e->mtx);
    memcpy(val, e->val, e->vlen);
    vlen = e->vlen;
    e->reput = 0;
    pthread_mutex_unlock(&e->mtx);
    if (ec_put(ec, e->self_key, val, vlen, e->lease, &rev, err, errlen) < 0) {
        if (strstr(err, "lease not found")) e->lease = 0; /* expired: grant anew */
        return -1;
    }
    return 0;
}

static int keepalive(struct et *e, struct ec *ec, char *err, size_t errlen)
{
    int64_t ttl;
    int again;
    if (ec_keepalive(ec, e->lease, &ttl, err, errlen) < 0) return -1;
    if (ttl == 0) {
        snprintf(err, errlen, "lease %" PRId64 " expired", e->lease);
        e->lease = 0;
        return -1;
    }
    pthread_mutex_lock(&e->mtx);
    again = e->reput || e->q_lost;
    pthread_mutex_unlock(&e->mtx);
    if (again && register_self(e, ec, err, errlen) < 0) return -1;
    return e->q_lost ? -1 : 0;
}

/* Register, read the prefix, watch it until something fails (-1) or
 * the owning thread stops us (0). */
static int session(struct et *e, struct ec *ec, char *err, size_t errlen)
{
    int64_t rev;
    if (register_self(e, ec, err, errlen) < 0) return -1;
    pthread_mutex_lock(&e->mtx);
    e->q_lost = 0;
    pthread_mutex_unlock(&e->mtx);
    push(e, ev_new(ET_SNAP_BEGIN, 0));
    if (ec_range_prefix(ec, e->prefix, on_kv, e, &rev, err, errlen) < 0) return -1;
    push(e, ev_new(ET_SNAP_END, rev));
    struct ec_watch *w = ec_watch_open(ec, e->prefix, rev + 1, on_kv, e, err, errlen);
    if (!w) return -1;
    push(e, ev_new(ET_UP, rev));
    long every = (long)e->lease_s * 1000 / 3;
    int rc;
    while ((rc = ec_watch_run(w, &e->stop, every > 0 ? every : 300, err, errlen)) == 1)
        if (keepalive(e, ec, err, errlen) < 0) {
            rc = -1;
            break;
        }
    ec_watch_close(w);
    return rc;
}

static void nap(struct et *e, long ms)
{
    for (; ms > 0 && !e->stop; ms -= 100) {
        struct timespec ts = {0, 100 * 1000000L};
        nanosleep(&ts, NULL);
    }
}

static void *worker(void *arg)
{
    struct et *e = arg;
    char err[256];
    long backoff = 200;
    struct ec *ec = ec_new(e->urls, ET_TIMEOUT_MS, err, sizeof err);
    if (!ec) {
        down(e, err);
        return NULL;
    }
    while (!e->stop) {
        if (session(e, ec, err, sizeof err) == 0) break;
        if (e->stop) break;
        down(e, err);
        nap(e, backoff);
        backoff = backoff * 2 > 2000 ? 2000 : backoff * 2;
    }
    ec_free(ec);
    return NULL;
}

/* ------------------------------------------------- the owning thread */

static void snap_add(struct et *e, uint32_t id)
{
    if (e->n_snap == e->cap_snap) {
        e->cap_snap = e->cap_snap ? e->cap_snap * 2 : 64;
        if (!(e->snap = realloc(e->snap, e->cap_snap * sizeof *e->snap))) abort();
    }
    e->snap[e->n_snap++] = id;
}

static int cmp_id(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

/* The snapshot is whole: members live here but absent there are dead. */
static void snap_end(struct et *e)
{
    if (e->n_snap) qsort(e->snap, e->n_snap, sizeof *e->snap, cmp_id); /* snap NULL if 0 */
    for (size_t i = 0; i < mb_count(e->mb); i++) {
        struct mb_member *m = mb_at(e->mb, i);
        if ((m->state == MB_ALIVE || m->state == MB_SUSPECT) &&
            (!e->n_snap || !bsearch(&m->id, e->snap, e->n_snap, sizeof *e->snap, cmp_id)))
            mb_set_state(e->mb, m, MB_DEAD, m->inc);
    }
    e->n_snap = (size_t)-1; /* no snapshot under way */
}

static void apply_put(struct et *e, struct et_ev *ev, int in_snap)
{
    struct mb_member *m = mb_find(e->mb, ev->id);
    if (ev->id == mb_self(e->mb)->id) return;
    if (in_snap) snap_add(e, ev->id);
    if (!m) {
        if (!ev->left)
            mb_add(e->mb, ev->id, ev->addr, ev->meta, ev->meta_len, ev->inc, MB_ALIVE);
        return;
    }
    if (ev->left) {
        mb_set_state(e->mb, m, MB_LEFT, m->inc);
        return;
    }
    mb_update(e->mb, m, ev->addr, ev->meta, ev->meta_len);
    mb_set_state(e->mb, m, MB_ALIVE, ev->inc);
}

static void apply(struct et *e, struct et_ev *ev)
{
    struct mb_member *m;
    if (ev->rev > e->rev) e->rev = ev->rev;
    switch (ev->kind) {
    case ET_SNAP_BEGIN: e->n_snap = 0; break;
    case ET_SNAP_END: snap_end(e); break;
    case ET_PUT: apply_put(e, ev, e->n_snap != (size_t)-1); break;
    case ET_DEL:
        m = mb_find(e->mb, ev->id);
        if (m && (m->state == MB_ALIVE || m->state == MB_SUSPECT))
            mb_set_state(e->mb, m, MB_DEAD, m->inc);
        break;
    case ET_UP:
        if (!e->up)
            log_info("etcd", "registered as %s at %s; %zu member(s) known", e->self_key,
                     e->urls, mb_live(e->mb));
        e->up = 1;
        e->last_err[0] = 0;
        break;
    case ET_DOWN:
        if (e->up || strcmp(e->last_err, ev->err))
            log_warn("etcd", "membership service unavailable (%s); retrying; the view is "
                     "kept as it was", ev->err);
        e->up = 0;
        e->n_snap = (size_t)-1;
        snprintf(e->last_err, sizeof e->last_err, "%s", ev->err);
        mb_stats_mut(e->mb)->tx_fail++;
        break;
    }
}

static void reap(struct et *e, uint64_t now)
{
    uint64_t keep = mb_cfg(e->mb)->reap_ms;
    for (size_t i = 0; i < mb_count(e->mb);) {
        struct mb_member *m = mb_at(e->mb, i);
        if ((m->state == MB_DEAD || m->state == MB_LEFT) && now >= m->since_ms + keep)
            mb_remove(e->mb, m); /* the last one moves into slot i */
        else
            i++;
    }
}

static void et_tick(struct mb *mb, uint64_t now)
{
    struct et *e = et_of(mb);
    pthread_mutex_lock(&e->mtx);
    struct et_ev *q = e->q_head;
    uint64_t bad = e->bad;
    e->q_head = e->q_tail = NULL;
    e->q_len = 0;
    e->bad = 0;
    pthread_mutex_unlock(&e->mtx);
    for (uint64_t i = 0; i < bad; i++) mb_count_bad(mb);
    while (q) {
        struct et_ev *next = q->next;
        if (q->kind != ET_DOWN && q->kind != ET_UP) mb_count_rx(mb, MB_MSG_SERVICE, 0);
        apply(e, q);
        free(q->meta);
        free(q);
        q = next;
    }
    /* The table's own changes bump its epoch; etcd's revision is the one
     * every node agrees on. */
    if (e->rev > 0) mb_set_epoch(mb, (uint64_t)e->rev);
    reap(e, now);
}

static void set_value(struct et *e, int left)
{
    const struct mb_member *s = mb_self(e->mb);
    pthread_mutex_lock(&e->mtx);
    e->vlen = etcd_value_make(e->val, sizeof e->val, s->inc, left, s->addr, s->meta,
                              s->meta_len);
    e->reput = 1;
    pthread_mutex_unlock(&e->mtx);
}

static int et_open(struct mb *mb)
{
    const struct mb_config *c = mb_cfg(mb);
    struct et *e = calloc(1, sizeof *e);
    if (!e) abort();
    mb_set_backend(mb, e);
    e->mb = mb;
    e->n_snap = (size_t)-1;
    pthread_mutex_init(&e->mtx, NULL);
    if (!c->service_url || !*c->service_url || strlen(c->service_url) >= sizeof e->urls ||
        !c->service_prefix || !*c->service_prefix ||
        strlen(c->service_prefix) >= sizeof e->prefix) {
        log_error("etcd", "want cluster.etcd_endpoints and a cluster.etcd_prefix of at most "
                  "%d bytes", ET_PREFIX_MAX - 1);
        return -1;
    }
    snprintf(e->urls, sizeof e->urls, "%s", c->service_url);
    snprintf(e->prefix, sizeof e->prefix, "%s", c->service_prefix);
    snprintf(e->self_key, sizeof e->self_key, "%s%u", e->prefix, (unsigned)c->self_id);
    e->lease_s = (uint32_t)((c->lease_ms + 999) / 1000);
    if (e->lease_s < 2) e->lease_s = 2;
    set_value(e, 0);
    if (!e->vlen) {
        log_error("etcd", "this node's address and metadata do not fit an etcd value");
        return -1;
    }
    return 0;
}

static void stop_worker(struct et *e)
{
    if (!e->started) return;
    e->stop = 1;
    pthread_join(e->thr, NULL);
    e->started = 0;
}

static void et_close(struct mb *mb)
{
    struct et *e = et_of(mb);
    if (!e) return;
    stop_worker(e); /* the lease is left to expire: only leave() revokes */
    for (struct et_ev *q = e->q_head, *n; q; q = n) {
        n = q->next;
        free(q->meta);
        free(q);
    }
    pthread_mutex_destroy(&e->mtx);
    free(e->snap);
    free(e);
    mb_set_backend(mb, NULL);
}

static int et_join(struct mb *mb, const char *const *seeds, size_t n, uint64_t now)
{
    struct et *e = et_of(mb);
    (void)seeds, (void)n, (void)now; /* etcd is the only seed */
    if (e->started) return 0;
    e->stop = 0;
    if (pthread_create(&e->thr, NULL, worker, e) != 0) return -1;
    e->started = 1;
    return 0;
}

static void et_receive(struct mb *mb, const void *buf, size_t len, uint64_t rx_ms)
{
    (void)buf, (void)len, (void)rx_ms;
    mb_count_bad(mb); /* nothing travels between members with etcd */
}

/* Say "left", then revoke the lease: watchers see the key go. */
static int et_leave(struct mb *mb, uint64_t now)
{
    struct et *e = et_of(mb);
    char err[256];
    int64_t rev;
    (void)now;
    stop_worker(e);
    if (!e->lease) return -1;
    struct ec *ec = ec_new(e->urls, ET_TIMEOUT_MS / 2, err, sizeof err);
    set_value(e, 1);
    int rc = ec ? 0 : -1;
    if (rc == 0 && ec_put(ec, e->self_key, e->val, e->vlen, e->lease, &rev, err, sizeof err) < 0)
        rc = -1;
    if (ec && ec_revoke(ec, e->lease, err, sizeof err) < 0) rc = -1;
    if (rc < 0) log_warn("etcd", "leave: %s (the lease expires by itself)", err);
    e->lease = 0;
    ec_free(ec);
    return rc;
}

static void et_meta_changed(struct mb *mb, uint64_t now)
{
    (void)now;
    set_value(et_of(mb), 0);
}

int etcd_up(struct mb *mb, char *err, size_t errlen)
{
    struct et *e = et_of(mb);
    if (err && errlen) snprintf(err, errlen, "%s", e->last_err);
    return e->up;
}

const struct mb_ops etcd_ops = {
    .name = "etcd",
    .open = et_open,
    .close = et_close,
    .join = et_join,
    .tick = et_tick,
    .receive = et_receive,
    .leave = et_leave,
    .meta_changed = et_meta_changed,
    .next_tick = NULL,
};
