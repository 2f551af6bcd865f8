/*
 * lease.c -- read and write leases.
 *
 * Design: a lease is a promise about pool space made to one client (one nng
 * pipe). A write lease owns PENDING chunks until commit; a read lease pins
 * READY chunks so eviction and delete leave their bytes alone. Every lease
 * has a deadline and dies with its pipe, so neither a hung nor a killed
 * client can hold memory. Ids start at a random value and are checked
 * against the owning pipe, so guessing one gains nothing.
 */
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "clock.h"
#include "kvtierd.h"
#include "log.h"
#include "store.h"

static struct lease **bucket(struct kvtierd *d, uint64_t id)
{
    return &d->leases.b[(id ^ (id >> 17)) % LEASE_BUCKETS];
}

struct lease *lease_new(struct kvtierd *d, uint32_t pipe, uint8_t kind,
                        uint32_t n)
{
    struct lease_table *t = &d->leases;
    if (t->next_id == 0 && getrandom(&t->next_id, sizeof t->next_id, 0) < 0)
        t->next_id = now_ms();
    struct lease *l = calloc(1, sizeof *l);
    if (!l || !(l->slot = calloc(n ? n : 1, sizeof *l->slot))) goto oom;
    if (kind == LEASE_WRITE &&
        (!(l->parent = calloc(n ? n : 1, sizeof *l->parent)) ||
         !(l->pgen = calloc(n ? n : 1, sizeof *l->pgen))))
        goto oom;
    do l->id = ++t->next_id & 0x7fffffffffffffffull; while (l->id == 0);
    l->pipe = pipe;
    l->kind = kind;
    l->n = n;
    l->deadline = kvtierd_clock(d) + d->cfg.lease_timeout_ms;
    struct lease **b = bucket(d, l->id);
    l->hnext = *b;
    *b = l;
    t->count++;
    return l;
oom:
    log_error("lease", "out of memory for a lease of %u chunks", n);
    abort();
}

struct lease *lease_find(struct kvtierd *d, uint64_t id)
{
    for (struct lease *l = *bucket(d, id); l; l = l->hnext)
        if (l->id == id) return l;
    return NULL;
}

static void unlink_free(struct kvtierd *d, struct lease *l)
{
    struct lease **p = bucket(d, l->id);
    while (*p != l) p = &(*p)->hnext;
    *p = l->hnext;
    d->leases.count--;
    free(l->slot);
    free(l->parent);
    free(l->pgen);
    free(l);
}

void lease_forget(struct kvtierd *d, struct lease *l)
{
    unlink_free(d, l);
}

void lease_drop(struct kvtierd *d, struct lease *l)
{
    for (uint32_t i = 0; i < l->n; i++) {
        uint32_t s = l->slot[i];
        if (s == IDX_NONE) continue;
        struct idx_entry *e = idx_at(&d->idx, s);
        if (l->kind == LEASE_WRITE) {
            store_free(d, s);
        } else if (idx_unpin(&d->idx, s) == 0 && e->state == IDX_DOOMED) {
            store_free(d, s);
        }
    }
    unlink_free(d, l);
}

/* Drop every lease for which drop_it() says so. */
static uint64_t drop_where(struct kvtierd *d,
                           int (*drop_it)(const struct lease *, uint64_t),
                           uint64_t arg)
{
    uint64_t n = 0;
    for (int b = 0; b < LEASE_BUCKETS; b++) {
        struct lease *l = d->leases.b[b];
        while (l) {
            struct lease *next = l->hnext;
            if (drop_it(l, arg)) {
                lease_drop(d, l);
                n++;
            }
            l = next;
        }
    }
    return n;
}

static int past_deadline(const struct lease *l, uint64_t now)
{
    return l->deadline <= now;
}

static int of_pipe(const struct lease *l, uint64_t pipe)
{
    return l->pipe == (uint32_t)pipe;
}

static int any(const struct lease *l, uint64_t unused)
{
    (void)l;
    (void)unused;
    return 1;
}

void lease_expire(struct kvtierd *d, uint64_t now)
{
    if (d->leases.count == 0) return;
    uint64_t n = drop_where(d, past_deadline, now);
    if (n) {
        d->st.expired_leases += n;
        log_warn("lease", "%llu lease(s) passed their deadline and were dropped",
                 (unsigned long long)n);
    }
}

void lease_drop_pipe(struct kvtierd *d, uint32_t pipe)
{
    if (d->leases.count == 0) return;
    uint64_t n = drop_where(d, of_pipe, pipe);
    if (n) log_debug("lease", "pipe %u closed: dropped %llu lease(s)", pipe,
                     (unsigned long long)n);
}

void lease_drop_all(struct kvtierd *d)
{
    drop_where(d, any, 0);
}
