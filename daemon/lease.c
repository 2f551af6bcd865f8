/*
 * lease.c -- read and write leases.
 *
 * Design: a lease is a promise about pool space made to one client (one nng
 * pipe). A write lease owns PENDING chunks until commit; a read lease pins
 * READY chunks so eviction and delete leave their bytes alone. Every lease
 * has a deadline and dies with its pipe, so neither a hung nor a killed
 * client can hold memory. Ids start at a random value and are checked
 * against the owning pipe, so guessing one gains nothing. What a lease
 * holds is the caller's business: the table calls back to release it.
 */
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "clock.h"
#include "index.h"
#include "lease.h"
#include "log.h"

static struct lease **bucket(const struct lease_table *t, uint64_t id)
{
    return (struct lease **)&t->b[(id ^ (id >> 17)) % LEASE_BUCKETS];
}

void lease_init(struct lease_table *t, lease_release_fn release, void *arg)
{
    t->release = release;
    t->arg = arg;
}

struct lease *lease_new(struct lease_table *t, uint32_t pipe, uint8_t kind,
                        uint32_t n, uint64_t deadline)
{
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
    l->deadline = deadline;
    struct lease **b = bucket(t, l->id);
    l->hnext = *b;
    *b = l;
    t->count++;
    return l;
oom:
    log_error("lease", "out of memory for a lease of %u chunks", n);
    abort();
}

struct lease *lease_find(const struct lease_table *t, uint64_t id)
{
    for (struct lease *l = *bucket(t, id); l; l = l->hnext)
        if (l->id == id) return l;
    return NULL;
}

kvt_err lease_own(const struct lease_table *t, uint64_t id, uint32_t pipe,
                  uint8_t kind, struct lease **out)
{
    struct lease *l = lease_find(t, id);
    *out = NULL;
    if (!l || l->kind != kind) return KVT_ENOENT;
    if (l->pipe != pipe) return KVT_EPERM;
    *out = l;
    return KVT_OK;
}

static void unlink_free(struct lease_table *t, struct lease *l)
{
    struct lease **p = bucket(t, l->id);
    while (*p != l) p = &(*p)->hnext;
    *p = l->hnext;
    t->count--;
    free(l->slot);
    free(l->parent);
    free(l->pgen);
    free(l);
}

void lease_forget(struct lease_table *t, struct lease *l)
{
    unlink_free(t, l);
}

void lease_drop(struct lease_table *t, struct lease *l)
{
    for (uint32_t i = 0; i < l->n; i++)
        if (l->slot[i] != IDX_NONE) t->release(t->arg, l->kind, l->slot[i]);
    unlink_free(t, l);
}

/* Drop every lease for which drop_it() says so. */
static uint64_t drop_where(struct lease_table *t,
                           int (*drop_it)(const struct lease *, uint64_t),
                           uint64_t arg)
{
    uint64_t n = 0;
    for (int b = 0; b < LEASE_BUCKETS; b++) {
        struct lease *l = t->b[b];
        while (l) {
            struct lease *next = l->hnext;
            if (drop_it(l, arg)) {
                lease_drop(t, l);
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

uint64_t lease_expire(struct lease_table *t, uint64_t now)
{
    if (t->count == 0) return 0;
    uint64_t n = drop_where(t, past_deadline, now);
    if (n) log_warn("lease", "%llu lease(s) passed their deadline and were dropped",
                    (unsigned long long)n);
    return n;
}

void lease_drop_pipe(struct lease_table *t, uint32_t pipe)
{
    if (t->count == 0) return;
    uint64_t n = drop_where(t, of_pipe, pipe);
    if (n) log_debug("lease", "pipe %u closed: dropped %llu lease(s)", pipe,
                     (unsigned long long)n);
}

void lease_drop_all(struct lease_table *t)
{
    drop_where(t, any, 0);
}

void lease_counts(const struct lease_table *t, uint64_t *read, uint64_t *write)
{
    *read = *write = 0;
    for (int i = 0; i < LEASE_BUCKETS && *read + *write < t->count; i++)
        for (const struct lease *l = t->b[i]; l; l = l->hnext)
            (*(l->kind == LEASE_READ ? read : write))++;
}
