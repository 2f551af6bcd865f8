/*
 * simnet.c -- a deterministic discrete-event network for membership code.
 *
 * Design: one thread, one event heap ordered by (virtual time, sequence
 * number), so a seed fixes every run. Each simulated node is a real
 * struct mb (the real backend, e.g. swim.c) whose env is wired here: send()
 * schedules a delivery after the link's latency unless the link drops it
 * (loss, partition), now_ms() is the node's virtual clock, rand() the
 * simulation's generator. A node runs one handler at a time: a message
 * that arrives while it is busy or paused waits in its bounded inbox,
 * stamped with its ARRIVAL time (the receive timestamp member.h asks
 * for). With charge_cpu the CPU time a handler really took (thread CPU
 * clock) keeps the node busy that long in virtual time -- so the cost of
 * the real code shows up as delay -- at the price of exact repeatability.
 *
 * Truth vs view: `disagree` counts pairs (observer up, other node) where
 * the observer's view (alive/suspect = live) differs from the truth
 * (running = live), kept incrementally from the change callbacks and the
 * injections, so convergence is known after every event at any N.
 */
#include "simnet.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { EV_DELIVER, EV_WAKE, EV_TICK };

struct msg {
    uint64_t rx;            /* arrival, us */
    size_t len;
    struct msg *next;
    uint8_t buf[];
};

struct event {
    uint64_t t, seq;
    int kind, node;
    struct msg *m;          /* EV_DELIVER */
};

struct node {
    struct sim *s;
    int idx, up, left, counting;
    uint32_t id;
    char addr[32];
    struct mb *mb;
    uint64_t vnow, busy_until, paused_until, last_pause_end, tick_at, wake_at;
    uint64_t crash_t, first_detect, started;
    int detect_pending;
    struct msg *in_head, *in_tail;
    size_t nin;
    int group;
    uint64_t heal_inc;      /* its incarnation when the last partition healed */
    uint32_t lives;         /* starts so far */
    uint8_t meta[MB_META_MAX];
    uint64_t cpu_ns;
    struct mb_stats base;   /* the mb counters at the last reset */
};

struct sim {
    struct sim_cfg cfg;
    struct node **v;
    size_t n, cap;
    struct event *h;
    size_t nh, hcap;
    uint64_t now, seq, rng;
    int64_t disagree;
    uint64_t converged_at;
    int part_on, healed;    /* a partition is on / has been healed */
    int slow_from, slow_to;
    uint32_t slow_us;
    double slow_loss;
    struct sim_stats st;    /* simnet's own counters */
    struct mb_stats gone;   /* counters of nodes destroyed since reset */
    uint64_t proc_cpu0;     /* process CPU at the last reset (no charge_cpu) */
    double *det_first, *det_all;
    size_t ndf, nda, capdf, capda;
    struct sim_mem mem;     /* messages held: in flight and in inboxes */
};

static void *xalloc(void *p, size_t sz)
{
    void *q = realloc(p, sz ? sz : 1);
    if (!q) abort();
    return q;
}

uint64_t sim_rand(struct sim *s) /* splitmix64 */
{
    uint64_t z = (s->rng += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static double unit(struct sim *s) { return (double)(sim_rand(s) >> 11) / 9007199254740992.0; }

/* ---------------------------------------------------------------- heap */

static int before(const struct event *a, const struct event *b)
{
    return a->t != b->t ? a->t < b->t : a->seq < b->seq;
}

static void push(struct sim *s, uint64_t t, int kind, int node, struct msg *m)
{
    if (s->nh == s->hcap) {
        s->hcap = s->hcap ? 2 * s->hcap : 1024;
        s->h = xalloc(s->h, s->hcap * sizeof *s->h);
    }
    size_t i = s->nh++;
    struct event e = {t, s->seq++, kind, node, m};
    while (i && before(&e, &s->h[(i - 1) / 2])) {
        s->h[i] = s->h[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    s->h[i] = e;
}

static struct event pop(struct sim *s)
{
    struct event top = s->h[0], last = s->h[--s->nh];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= s->nh) break;
        if (c + 1 < s->nh && before(&s->h[c + 1], &s->h[c])) c++;
        if (!before(&s->h[c], &last)) break;
        s->h[i] = s->h[c];
        i = c;
    }
    if (s->nh) s->h[i] = last;
    return top;
}

/* ------------------------------------------------------------ messages */

/* Every message is counted while held (in flight or queued), so a run can
 * tell what its peak memory went to. */
static struct msg *msg_new(struct sim *s, size_t len)
{
    struct msg *m = xalloc(NULL, sizeof *m + len);
    m->len = len;
    s->mem.msgs++;
    s->mem.bytes += len;
    if (s->mem.msgs > s->mem.peak_msgs) s->mem.peak_msgs = s->mem.msgs;
    if (s->mem.bytes > s->mem.peak_bytes) s->mem.peak_bytes = s->mem.bytes;
    return m;
}
static void msg_free(struct sim *s, struct msg *m)
{
    if (!m) return;
    s->mem.msgs--;
    s->mem.bytes -= m->len;
    free(m);
}

/* ---------------------------------------------------------------- truth */

static int truth(const struct node *n) { return n && n->up; }

static int live_in(const struct node *obs, uint32_t id)
{
    const struct mb_member *m = obs->mb ? mb_find(obs->mb, id) : NULL;
    return m && (m->state == MB_ALIVE || m->state == MB_SUSPECT);
}

static void set_converged(struct sim *s)
{
    if (s->disagree == 0 && !s->converged_at) s->converged_at = s->now ? s->now : 1;
    if (s->disagree != 0) s->converged_at = 0;
}

/* Node j's truth flips to `up`: every counting observer's row moves. */
static void truth_flip(struct sim *s, struct node *j, int up)
{
    for (size_t i = 0; i < s->n; i++) {
        struct node *o = s->v[i];
        if (o == j || !o->counting) continue;
        int l = live_in(o, j->id);
        s->disagree += (l != up) - (l != !up);
    }
}

static int64_t row(struct sim *s, struct node *o)
{
    int64_t r = 0;
    for (size_t i = 0; i < s->n; i++)
        if (s->v[i] != o) r += live_in(o, s->v[i]->id) != truth(s->v[i]);
    return r;
}

/* --------------------------------------------------------- percentiles */

static void sample(double **a, size_t *n, size_t *cap, double v)
{
    if (*n == *cap) {
        *cap = *cap ? 2 * *cap : 64;
        *a = xalloc(*a, *cap * sizeof **a);
    }
    (*a)[(*n)++] = v;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double pct(double *a, size_t n, double p)
{
    if (!n) return -1;
    qsort(a, n, sizeof *a, cmp_d);
    size_t i = (size_t)(p * (double)(n - 1) + 0.5);
    return a[i];
}

/* ------------------------------------------------------------ callbacks */

static int live_state(enum mb_state st) { return st == MB_ALIVE || st == MB_SUSPECT; }

/* A death is the partition's doing, not a false one, when the declarer
 * could not reach the node: across an active partition, or across a
 * healed one about the life the node lived through it (the incarnation it
 * had at the heal; once it has refuted, a death of the new life is
 * false again). Stale claims that cross the healed line and kill a node
 * on the declarer's own side are false: that declarer could reach it. */
static void on_dead(struct sim *s, struct node *o, struct node *j, uint64_t inc)
{
    if (!j) return;
    if (j->up && j->group != o->group &&
        (s->part_on || (s->healed && inc <= j->heal_inc))) {
        s->st.deaths_partitioned++;
        return;
    }
    if (j->up) {
        int paused_obs = o->last_pause_end && s->now - o->last_pause_end < 30000000;
        if (j->paused_until > s->now || (j->last_pause_end && s->now - j->last_pause_end < 1000000)) {
            s->st.deaths_of_paused++;
        } else {
            s->st.false_deaths++;
            if (paused_obs) s->st.false_deaths_by_paused++;
        }
        return;
    }
    if (j->left) {
        s->st.left_as_dead++;
        return;
    }
    s->st.detections++;
    double ms = (double)(s->now - j->crash_t) / 1000.0;
    sample(&s->det_all, &s->nda, &s->capda, ms);
    if (j->detect_pending) {
        j->detect_pending = 0;
        s->st.crashes_detected++;
        sample(&s->det_first, &s->ndf, &s->capdf, ms);
    }
}

static void changed(void *arg, struct mb *mb, struct mb_member *m, enum mb_event ev,
                    enum mb_state old)
{
    (void)mb;
    struct node *o = arg;
    struct sim *s = o->s;
    struct node *j = m->id >= 1 && m->id <= s->n ? s->v[m->id - 1] : NULL;
    if (o->counting && j && ev != MB_EV_UPDATE) {
        int was = ev == MB_EV_JOIN ? 0 : live_state(old);
        int is = ev == MB_EV_GONE ? 0 : live_state(m->state);
        int t = truth(j);
        s->disagree += (is != t) - (was != t);
    }
    if (ev == MB_EV_DEAD) on_dead(s, o, j, m->inc);
    if (s->cfg.on_change) s->cfg.on_change(s->cfg.on_change_arg, o->idx, m, ev, old);
}

/* ------------------------------------------------------------------ env */

static int addr_idx(const struct sim *s, const char *addr)
{
    int i;
    if (sscanf(addr, "sim://%d", &i) != 1 || i < 0 || (size_t)i >= s->n) return -1;
    return i;
}

static int env_send(void *ctx, const char *addr, const void *buf, size_t len)
{
    struct node *from = ctx;
    struct sim *s = from->s;
    int to = addr_idx(s, addr);
    if (to < 0) return -1;
    struct node *dst = s->v[to];
    double loss = s->cfg.loss;
    uint64_t lat = s->cfg.lat_us + (s->cfg.jitter_us ? sim_rand(s) % s->cfg.jitter_us : 0);
    if (from->idx == s->slow_from && to == s->slow_to) {
        lat += s->slow_us;
        loss = 1 - (1 - loss) * (1 - s->slow_loss);
    }
    if ((s->part_on && from->group != dst->group) || (loss > 0 && unit(s) < loss)) {
        s->st.msgs_dropped++;
        return 0; /* the network ate it; the sender cannot tell */
    }
    struct msg *m = msg_new(s, len);
    m->next = NULL;
    memcpy(m->buf, buf, len);
    push(s, from->vnow + lat, EV_DELIVER, to, m);
    return 0;
}

static uint64_t env_now(void *ctx) { return ((struct node *)ctx)->vnow / 1000; }
static uint64_t env_rand(void *ctx) { return sim_rand(((struct node *)ctx)->s); }

/* ------------------------------------------------------------- handlers */


static uint64_t cpu_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static uint64_t proc_cpu(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static uint64_t ready_at(const struct node *n)
{
    return n->busy_until > n->paused_until ? n->busy_until : n->paused_until;
}

static void schedule_tick(struct sim *s, struct node *n)
{
    if (!n->up) return;
    uint64_t t = mb_next_tick(n->mb) * 1000;
    if (t <= n->vnow) t = n->vnow + 1000;
    if (t < ready_at(n)) t = ready_at(n);
    if (n->tick_at && n->tick_at <= t) return;
    n->tick_at = t;
    push(s, t, EV_TICK, n->idx, NULL);
}

/* Run one handler at virtual time t: a message (m) or the timers. */
static void run(struct sim *s, struct node *n, uint64_t t, struct msg *m)
{
    n->vnow = t;
    uint64_t c0 = s->cfg.charge_cpu ? cpu_now() : 0;
    if (m) mb_receive(n->mb, m->buf, m->len, m->rx / 1000);
    else mb_tick(n->mb, t / 1000);
    uint64_t dt = s->cfg.charge_cpu ? cpu_now() - c0 : 0;
    n->cpu_ns += dt;
    s->st.cpu_ns += dt;
    n->busy_until = t + (s->cfg.charge_cpu ? (dt + 999) / 1000 : 0);
}

static void drain(struct sim *s, struct node *n)
{
    while (n->in_head && n->up) {
        struct msg *m = n->in_head;
        n->in_head = m->next;
        if (!n->in_head) n->in_tail = NULL;
        n->nin--;
        uint64_t t = ready_at(n) > s->now ? ready_at(n) : s->now;
        run(s, n, t, m);
        msg_free(s, m);
    }
}

static void wake_later(struct sim *s, struct node *n)
{
    uint64_t t = ready_at(n) > s->now ? ready_at(n) : s->now;
    if (n->wake_at >= t && n->wake_at > s->now) return;
    n->wake_at = t;
    push(s, t, EV_WAKE, n->idx, NULL);
}

static void on_deliver(struct sim *s, struct node *n, struct msg *m)
{
    m->rx = s->now;
    if (!n->up) {
        msg_free(s, m);
        return;
    }
    if (ready_at(n) > s->now || n->in_head) {
        if (n->nin >= s->cfg.inbox_max) { /* the bounded receive queue */
            s->st.inbox_dropped++;
            msg_free(s, m);
            return;
        }
        if (n->in_tail) n->in_tail->next = m;
        else n->in_head = m;
        n->in_tail = m;
        n->nin++;
        wake_later(s, n);
        return;
    }
    run(s, n, s->now, m);
    msg_free(s, m);
    schedule_tick(s, n);
}

static void on_timer(struct sim *s, struct node *n, int kind, uint64_t t)
{
    if (!n->up) return;
    if (kind == EV_TICK) {
        if (t != n->tick_at) return; /* superseded */
        n->tick_at = 0;
    }
    if (ready_at(n) > s->now) {
        if (n->paused_until <= s->now && n->last_pause_end < n->paused_until)
            n->last_pause_end = n->paused_until;
        wake_later(s, n);
        return;
    }
    if (n->paused_until && n->paused_until <= s->now && n->last_pause_end < n->paused_until)
        n->last_pause_end = n->paused_until;
    drain(s, n);
    if (n->up) run(s, n, ready_at(n) > s->now ? ready_at(n) : s->now, NULL);
    schedule_tick(s, n);
}

void sim_run_until(struct sim *s, uint64_t t_us)
{
    while (s->nh && s->h[0].t <= t_us) {
        struct event e = pop(s);
        s->now = e.t;
        struct node *n = s->v[e.node];
        if (e.kind == EV_DELIVER) on_deliver(s, n, e.m);
        else on_timer(s, n, e.kind, e.t);
        set_converged(s);
    }
    if (s->now < t_us) s->now = t_us;
}

/* ------------------------------------------------------------ lifecycle */

struct sim *sim_new(const struct sim_cfg *cfg)
{
    struct sim *s = xalloc(NULL, sizeof *s);
    memset(s, 0, sizeof *s);
    s->cfg = *cfg;
    if (!s->cfg.inbox_max) s->cfg.inbox_max = 1024;
    s->rng = cfg->seed;
    s->slow_from = s->slow_to = -1;
    return s;
}

static void stats_add(struct mb_stats *a, const struct mb_stats *b, int sign)
{
    for (int t = 0; t < MB_NMSGS; t++) {
        a->msgs_tx[t] += (uint64_t)sign * b->msgs_tx[t];
        a->bytes_tx[t] += (uint64_t)sign * b->bytes_tx[t];
    }
    a->suspicions += (uint64_t)sign * b->suspicions;
    a->refutations += (uint64_t)sign * b->refutations;
}

static void stop(struct sim *s, struct node *n)
{
    if (!n->up) return;
    s->disagree -= row(s, n);
    n->counting = 0;
    n->up = 0;
    truth_flip(s, n, 0);
    if (s->cfg.on_life) s->cfg.on_life(s->cfg.on_change_arg, n->idx, 0);
    struct mb_stats cur = *mb_stats(n->mb);
    stats_add(&s->gone, &cur, 1);
    stats_add(&s->gone, &n->base, -1);
    memset(&n->base, 0, sizeof n->base);
    s->st.node_seconds_us += s->now - n->started;
    mb_destroy(n->mb);
    n->mb = NULL;
    for (struct msg *m = n->in_head, *x; m; m = x) {
        x = m->next;
        msg_free(s, m);
    }
    n->in_head = n->in_tail = NULL;
    n->nin = 0;
    n->tick_at = 0;
    set_converged(s);
}

int sim_start(struct sim *s, int idx, int seed)
{
    struct node *n;
    if (idx < 0) {
        if (s->n == s->cap) {
            s->cap = s->cap ? 2 * s->cap : 64;
            s->v = xalloc(s->v, s->cap * sizeof *s->v);
        }
        n = xalloc(NULL, sizeof *n);
        memset(n, 0, sizeof *n);
        n->s = s;
        n->idx = (int)s->n;
        n->id = (uint32_t)s->n + 1;
        snprintf(n->addr, sizeof n->addr, "sim://%d", n->idx);
        s->v[s->n++] = n;
    } else {
        n = s->v[idx];
        if (n->up) return idx;
    }
    struct mb_config c = s->cfg.mbc;
    c.self_id = n->id;
    c.self_addr = n->addr;
    c.inc = s->now / 1000 + 1;
    /* A restarted daemon has new metadata (a new UCX worker address):
     * stamp the life into the template's first bytes. */
    n->lives++;
    if (c.meta_len >= sizeof n->lives && c.meta_len <= sizeof n->meta) {
        memcpy(n->meta, c.meta, c.meta_len);
        memcpy(n->meta, &n->lives, sizeof n->lives);
        c.meta = n->meta;
    }
    c.on_change = changed;
    c.on_change_arg = n;
    c.env = (struct mb_env){n, env_send, env_now, env_rand, NULL};
    n->vnow = s->now;
    n->busy_until = n->paused_until = 0;
    n->left = 0;
    n->mb = mb_create(s->cfg.ops, &c, NULL);
    if (!n->mb) abort();
    n->up = 1;
    n->started = s->now;
    truth_flip(s, n, 1);
    s->disagree += row(s, n);
    n->counting = 1;
    set_converged(s);
    if (s->cfg.on_life) s->cfg.on_life(s->cfg.on_change_arg, n->idx, 1);
    if (seed >= 0 && seed != n->idx) {
        const char *a = s->v[seed]->addr;
        mb_join(n->mb, &a, 1);
    }
    schedule_tick(s, n);
    return n->idx;
}

void sim_crash(struct sim *s, int idx)
{
    struct node *n = s->v[idx];
    if (!n->up) return;
    n->crash_t = s->now;
    n->detect_pending = 1;
    s->st.crashes++;
    stop(s, n);
}

void sim_leave(struct sim *s, int idx)
{
    struct node *n = s->v[idx];
    if (!n->up) return;
    n->vnow = s->now;
    mb_leave(n->mb);
    n->left = 1;
    stop(s, n);
    n->left = 1;
}

void sim_pause(struct sim *s, int idx, uint32_t ms)
{
    struct node *n = s->v[idx];
    n->paused_until = s->now + (uint64_t)ms * 1000;
}

void sim_partition(struct sim *s, const int *group, int on)
{
    if (s->part_on && !on) {
        s->healed = 1;
        for (size_t i = 0; i < s->n; i++) {
            struct node *n = s->v[i];
            n->heal_inc = n->up ? mb_self(n->mb)->inc : 0;
        }
    }
    s->part_on = on;
    for (size_t i = 0; i < s->n && group; i++) s->v[i]->group = group[i];
}

void sim_slow_link(struct sim *s, int from, int to, uint32_t extra_us, double loss)
{
    s->slow_from = from;
    s->slow_to = to;
    s->slow_us = extra_us;
    s->slow_loss = loss;
}

void sim_free(struct sim *s)
{
    if (!s) return;
    for (size_t i = 0; i < s->n; i++) {
        struct node *n = s->v[i];
        n->counting = 0;
        if (n->mb) mb_destroy(n->mb);
        for (struct msg *m = n->in_head, *x; m; m = x) {
            x = m->next;
            msg_free(s, m);
        }
        free(n);
    }
    for (size_t i = 0; i < s->nh; i++) msg_free(s, s->h[i].m);
    free(s->h);
    free(s->v);
    free(s->det_first);
    free(s->det_all);
    free(s);
}

/* -------------------------------------------------------------- queries */

uint64_t sim_now(const struct sim *s) { return s->now; }
size_t sim_nodes(const struct sim *s) { return s->n; }
int sim_up(const struct sim *s, int idx) { return s->v[idx]->up; }
struct mb *sim_mb(const struct sim *s, int idx) { return s->v[idx]->mb; }
int64_t sim_disagree(const struct sim *s) { return s->disagree; }
uint64_t sim_converged_at(const struct sim *s) { return s->converged_at; }
const struct sim_mem *sim_mem(const struct sim *s) { return &s->mem; }

size_t sim_diff(const struct sim *s, int *obs, int *node, size_t max)
{
    size_t got = 0;
    for (size_t i = 0; i < s->n; i++) {
        const struct node *o = s->v[i];
        if (!o->counting) continue;
        for (size_t j = 0; j < s->n && got < max; j++)
            if (j != i && live_in(o, s->v[j]->id) != truth(s->v[j])) {
                obs[got] = (int)i;
                node[got++] = (int)j;
            }
    }
    return got;
}

void sim_reset_stats(struct sim *s)
{
    memset(&s->st, 0, sizeof s->st);
    memset(&s->gone, 0, sizeof s->gone);
    s->ndf = s->nda = 0;
    s->proc_cpu0 = proc_cpu();
    for (size_t i = 0; i < s->n; i++) {
        struct node *n = s->v[i];
        if (n->up) {
            n->base = *mb_stats(n->mb);
            n->started = s->now;
        }
        n->detect_pending = 0;
    }
}

void sim_stats(struct sim *s, struct sim_stats *out)
{
    *out = s->st;
    if (!s->cfg.charge_cpu) out->cpu_ns = proc_cpu() - s->proc_cpu0; /* simulator included */
    struct mb_stats sum = s->gone;
    for (size_t i = 0; i < s->n; i++) {
        struct node *n = s->v[i];
        if (!n->up) continue;
        stats_add(&sum, mb_stats(n->mb), 1);
        stats_add(&sum, &n->base, -1);
        out->node_seconds_us += s->now - n->started;
    }
    memcpy(out->msgs_tx, sum.msgs_tx, sizeof sum.msgs_tx);
    memcpy(out->bytes_tx, sum.bytes_tx, sizeof sum.bytes_tx);
    out->suspicions = sum.suspicions;
    out->refutations = sum.refutations;
    out->detect_first_p50 = pct(s->det_first, s->ndf, 0.5);
    out->detect_first_p99 = pct(s->det_first, s->ndf, 0.99);
    out->detect_all_p50 = pct(s->det_all, s->nda, 0.5);
    out->detect_all_p99 = pct(s->det_all, s->nda, 0.99);
}
