/*
 * oplan.c -- the republish planner of the global index (oplan.h).
 *
 * Design: a holder keeps, for each chunk it holds, the owners it last
 * told (R ids and the change sequence number they reflect), and logs each
 * membership change. Bringing a slot up to date replays the logged
 * changes one by one against its owners (owners_delta: R + 1 scores per
 * join, nothing per leave unless the leaver was an owner), and names only
 * the owners that entered, or a member that restarted (it lost what it
 * was told). So a change costs ~R·K entries cluster-wide, not N·R·K. A
 * slot never told, or told before the oldest logged change, gets its
 * owners scored afresh (O(N)) and tells them all. Sequence 0 means "never
 * told", so sequences start at 1.
 */
#include "oplan.h"

#include <stdlib.h>
#include <string.h>

void op_init(struct oplan *p, uint32_t r)
{
    memset(p, 0, sizeof *p);
    p->r = r < OW_MAX_REPLICAS ? r : OW_MAX_REPLICAS;
    p->log_base = 1; /* 0: never told */
}

void op_free(struct oplan *p)
{
    free(p->so);
    p->so = NULL;
    p->so_slots = 0;
}

uint32_t op_seq(const struct oplan *p) { return p->log_base + p->log_n; }

void op_log(struct oplan *p, uint32_t id, enum ow_change kind)
{
    if (p->log_n == OP_LOG_MAX) { /* older slots are told in full */
        p->log_base += p->log_n + 1;
        p->log_n = 0;
    }
    p->log[p->log_n++] = (struct op_change){id, kind};
}

void op_settle(struct oplan *p)
{
    p->log_base = op_seq(p);
    p->log_n = 0;
}

uint32_t *op_rec(struct oplan *p, uint32_t s)
{
    if (s >= p->so_slots) {
        uint32_t n = p->so_slots ? p->so_slots : 1024;
        while (n <= s) n *= 2;
        p->so = realloc(p->so, (size_t)n * (p->r + 1) * sizeof *p->so);
        if (!p->so) abort(); /* control-plane allocation */
        memset(p->so + (size_t)p->so_slots * (p->r + 1), 0,
               (size_t)(n - p->so_slots) * (p->r + 1) * sizeof *p->so);
        p->so_slots = n;
    }
    return p->so + (size_t)s * (p->r + 1);
}

uint32_t op_load(const struct oplan *p, const uint32_t *rec, uint32_t *o)
{
    uint32_t n = 0;
    for (uint32_t i = 0; i < p->r; i++)
        if (rec[1 + i] != OW_NONE) o[n++] = rec[1 + i];
    return n;
}

void op_store(struct oplan *p, uint32_t *rec, const uint32_t *o, uint32_t n)
{
    rec[0] = op_seq(p);
    for (uint32_t i = 0; i < p->r; i++) rec[1 + i] = i < n ? o[i] : OW_NONE;
}

static int has(const uint32_t *o, uint32_t n, uint32_t id)
{
    for (uint32_t i = 0; i < n; i++)
        if (o[i] == id) return 1;
    return 0;
}

/* Apply the logged changes since seq to owners o[0..*n); the members
 * that entered go to tl (*nt of them; *nt > OP_TELL_MAX: too many to
 * keep, tell every owner). */
static void replay(const struct oplan *p, const kvt_key *k, uint64_t nsh, uint32_t seq,
                   const uint32_t *view, uint32_t nv, uint32_t *o, uint32_t *n, uint32_t *tl,
                   uint32_t *nt)
{
    for (; seq < op_seq(p); seq++) {
        const struct op_change *c = &p->log[seq - p->log_base];
        uint32_t t = owners_delta(k, nsh, o, n, p->r, c->id, c->kind, view, nv);
        if (t == OW_NONE) continue;
        if (*nt < OP_TELL_MAX) tl[*nt] = t;
        ++*nt;
    }
}

uint32_t op_catch_up(struct oplan *p, uint32_t *rec, const kvt_key *k, uint64_t nsh,
                     const uint32_t *view, uint32_t nv, uint32_t *o, uint32_t *n, uint32_t *t,
                     uint32_t *moved)
{
    uint32_t tl[OP_TELL_MAX], nt = 0, told = 0;
    *n = op_load(p, rec, o);
    *moved = 0;
    if (rec[0] == op_seq(p)) return 0;
    if (rec[0] == 0 || rec[0] < p->log_base) { /* never told, or older than the log */
        *n = owners_of(k, nsh, view, nv, p->r, o);
        for (uint32_t i = 0; i < *n; i++) t[told++] = o[i];
        *moved = rec[0] ? *n : 0;
    } else {
        replay(p, k, nsh, rec[0], view, nv, o, n, tl, &nt);
        for (uint32_t i = 0; i < *n; i++)
            if (nt > OP_TELL_MAX || has(tl, nt, o[i])) t[told++] = o[i];
        *moved = nt > OP_TELL_MAX ? *n : nt;
    }
    op_store(p, rec, o, *n);
    return told;
}
