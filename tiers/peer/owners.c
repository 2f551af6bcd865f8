/*
 * owners.c -- rendezvous owners of a global index key (owners.h).
 *
 * Design: each member of the view scores the key, XXH3(key, nsh ^ id*phi);
 * the R best (score, then id on a tie) are the key's owners. Because a
 * score depends only on the key and the member, one member joining or
 * leaving moves at most one owner of each key, and whether it does is
 * decided by comparing that member alone with the current owners: a
 * joiner enters iff it outranks the lowest owner (R + 1 scores); a
 * leaver that was not an owner changes nothing, and one that was is
 * replaced by the best member outside the owners (a scan of the view,
 * needed for only R/N of the keys). A caller that kept each key's owners
 * therefore pays O(R) per key per change instead of O(N).
 */
#include "owners.h"

#include <string.h>
#include <xxhash.h>

uint64_t ow_score(const kvt_key *k, uint64_t nsh, uint32_t id)
{
    return XXH3_64bits_withSeed(k->b, KVT_KEY_LEN, nsh ^ (id * 0x9E3779B97F4A7C15ull));
}

/* (sa, a) ranks before (sb, b). */
static int before(uint64_t sa, uint32_t a, uint64_t sb, uint32_t b)
{
    return sa > sb || (sa == sb && a > b);
}

int ow_outranks(const kvt_key *k, uint64_t nsh, uint32_t a, uint32_t b)
{
    return before(ow_score(k, nsh, a), a, ow_score(k, nsh, b), b);
}

uint32_t owners_of(const kvt_key *k, uint64_t nsh, const uint32_t *view, uint32_t n,
                   uint32_t r, uint32_t *out)
{
    uint64_t sc[OW_MAX_REPLICAS + 1];
    uint32_t got = 0;
    if (r > OW_MAX_REPLICAS + 1) r = OW_MAX_REPLICAS + 1;
    for (uint32_t i = 0; i < n && r; i++) {
        uint64_t s = ow_score(k, nsh, view[i]);
        uint32_t j;
        if (got < r) j = got++;
        else if (before(s, view[i], sc[r - 1], out[r - 1])) j = r - 1;
        else continue;
        for (; j > 0 && before(s, view[i], sc[j - 1], out[j - 1]); j--) {
            sc[j] = sc[j - 1];
            out[j] = out[j - 1];
        }
        sc[j] = s;
        out[j] = view[i];
    }
    return got;
}

static int index_of(const uint32_t *o, uint32_t n, uint32_t id)
{
    for (uint32_t i = 0; i < n; i++)
        if (o[i] == id) return (int)i;
    return -1;
}

static uint32_t join(const kvt_key *k, uint64_t nsh, uint32_t *o, uint32_t *n, uint32_t r,
                     uint32_t who)
{
    if (index_of(o, *n, who) >= 0) return who; /* restarted: it lost the entry */
    if (*n < r) {
        o[(*n)++] = who;
        return who;
    }
    uint32_t low = 0;
    uint64_t low_s = ow_score(k, nsh, o[0]);
    for (uint32_t i = 1; i < *n; i++) {
        uint64_t s = ow_score(k, nsh, o[i]);
        if (before(low_s, o[low], s, o[i])) low = i, low_s = s;
    }
    if (!before(ow_score(k, nsh, who), who, low_s, o[low])) return OW_NONE;
    o[low] = who;
    return who;
}

static uint32_t leave(const kvt_key *k, uint64_t nsh, uint32_t *o, uint32_t *n, uint32_t who,
                      const uint32_t *view, uint32_t nview)
{
    int at = index_of(o, *n, who);
    if (at < 0) return OW_NONE;
    o[at] = o[--*n];
    uint32_t best = OW_NONE;
    uint64_t best_s = 0;
    for (uint32_t i = 0; i < nview; i++) {
        if (view[i] == who || index_of(o, *n, view[i]) >= 0) continue;
        uint64_t s = ow_score(k, nsh, view[i]);
        if (best == OW_NONE || before(s, view[i], best_s, best)) best = view[i], best_s = s;
    }
    if (best != OW_NONE) o[(*n)++] = best;
    return best;
}

uint32_t owners_delta(const kvt_key *k, uint64_t nsh, uint32_t *o, uint32_t *n, uint32_t r,
                      uint32_t who, enum ow_change ch, const uint32_t *view, uint32_t nview)
{
    if (r > OW_MAX_REPLICAS) r = OW_MAX_REPLICAS;
    switch (ch) {
    case OW_JOIN: return join(k, nsh, o, n, r, who);
    case OW_LEAVE: return leave(k, nsh, o, n, who, view, nview);
    case OW_RESEND: return index_of(o, *n, who) >= 0 ? who : OW_NONE;
    }
    return OW_NONE;
}
