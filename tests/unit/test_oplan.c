/*
 * test_oplan.c -- the index's republish planner (tiers/peer/oplan.c),
 * which gidx.c and the simulator share: a slot never told tells all its
 * owners; one up to date tells nobody; after logged changes it tells
 * exactly the members that entered its owners (checked against a
 * brute-force owners_of over the view after the changes; an owner that
 * left and was replaced back within one batch of changes may be told
 * again), or a restarted
 * owner (resend); a record older than a dropped log tells every owner.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "peer/oplan.h"
#include "peer/owners.h"

static kvt_key key(uint32_t i)
{
    kvt_key k;
    memset(&k, 0, sizeof k);
    memcpy(k.b, &i, sizeof i);
    return k;
}

static int has(const uint32_t *o, uint32_t n, uint32_t id)
{
    for (uint32_t i = 0; i < n; i++)
        if (o[i] == id) return 1;
    return 0;
}

static void test_first_publish_and_up_to_date(void **state)
{
    (void)state;
    struct oplan p;
    op_init(&p, 2);
    uint32_t view[] = {1, 2, 3, 4, 5}, o[OW_MAX_REPLICAS], n, t[OW_MAX_REPLICAS], moved;
    kvt_key k = key(7);
    uint32_t c = op_catch_up(&p, op_rec(&p, 3), &k, 9, view, 5, o, &n, t, &moved);
    assert_int_equal(n, 2);
    assert_int_equal(c, 2);
    assert_int_equal(moved, 0); /* a first publish moves nothing */
    uint32_t want[OW_MAX_REPLICAS];
    assert_int_equal(owners_of(&k, 9, view, 5, 2, want), 2);
    assert_true(has(o, n, want[0]) && has(o, n, want[1]));
    assert_int_equal(op_catch_up(&p, op_rec(&p, 3), &k, 9, view, 5, o, &n, t, &moved), 0);
    op_free(&p);
}

/* Random joins and leaves: each catch-up tells exactly the owners that
 * entered since the slot was last brought up to date. */
static void test_replay_tells_who_entered(void **state)
{
    (void)state;
    struct oplan p;
    op_init(&p, 2);
    uint32_t view[64] = {1, 2, 3, 4, 5, 6}, nv = 6, next = 7, rng = 12345, told = 0, need = 0;
    enum { KEYS = 200 };
    for (uint32_t s = 0; s < KEYS; s++) {
        kvt_key k = key(s);
        uint32_t o[OW_MAX_REPLICAS], n, t[OW_MAX_REPLICAS], moved;
        op_catch_up(&p, op_rec(&p, s), &k, 1, view, nv, o, &n, t, &moved);
    }
    for (int round = 0; round < 30; round++) {
        uint32_t before[KEYS][OW_MAX_REPLICAS], nb[KEYS];
        for (uint32_t s = 0; s < KEYS; s++) nb[s] = op_load(&p, op_rec(&p, s), before[s]);
        for (int ch = 0; ch < 3; ch++) {
            rng = rng * 1103515245u + 12345u;
            if ((rng >> 16) % 2 && nv > 3) { /* a leave */
                uint32_t i = (rng >> 8) % nv, id = view[i];
                view[i] = view[--nv];
                op_log(&p, id, OW_LEAVE);
            } else if (nv < 64) {
                view[nv++] = next;
                op_log(&p, next++, OW_JOIN);
            }
        }
        for (uint32_t s = 0; s < KEYS; s++) {
            kvt_key k = key(s);
            uint32_t o[OW_MAX_REPLICAS], n, t[OW_MAX_REPLICAS], moved, want[OW_MAX_REPLICAS];
            uint32_t c = op_catch_up(&p, op_rec(&p, s), &k, 1, view, nv, o, &n, t, &moved);
            uint32_t nw = owners_of(&k, 1, view, nv, 2, want);
            assert_int_equal(n, nw);
            for (uint32_t i = 0; i < nw; i++) assert_true(has(o, n, want[i]));
            uint32_t entered = 0;
            for (uint32_t i = 0; i < n; i++)
                if (!has(before[s], nb[s], o[i])) {
                    entered++;
                    assert_true(has(t, c, o[i])); /* every member that entered */
                }
            /* ... and no more, but for an owner that left and came back
             * within the round (a join then a leave of a newer member). */
            assert_true(c <= n);
            for (uint32_t i = 0; i < c; i++) assert_true(has(o, n, t[i]));
            told += c;
            need += entered;
        }
        op_settle(&p);
    }
    assert_true(need > 0 && 2 * told <= 3 * need); /* re-tells are rare */
    op_free(&p);
}

static void test_resend_and_dropped_log(void **state)
{
    (void)state;
    struct oplan p;
    op_init(&p, 2);
    uint32_t view[] = {1, 2, 3, 4}, o[OW_MAX_REPLICAS], n, t[OW_MAX_REPLICAS], moved;
    kvt_key k = key(1);
    op_catch_up(&p, op_rec(&p, 0), &k, 0, view, 4, o, &n, t, &moved);
    uint32_t owner = o[0], other = 0;
    for (uint32_t i = 0; i < 4; i++)
        if (!has(o, n, view[i])) other = view[i];
    op_log(&p, other, OW_RESEND); /* not an owner: nothing */
    assert_int_equal(op_catch_up(&p, op_rec(&p, 0), &k, 0, view, 4, o, &n, t, &moved), 0);
    op_log(&p, owner, OW_RESEND); /* an owner restarted: it alone */
    assert_int_equal(op_catch_up(&p, op_rec(&p, 0), &k, 0, view, 4, o, &n, t, &moved), 1);
    assert_int_equal(t[0], owner);
    assert_int_equal(moved, 1);
    for (uint32_t i = 0; i <= OP_LOG_MAX; i++) op_log(&p, other, OW_RESEND); /* the log fills */
    assert_int_equal(op_catch_up(&p, op_rec(&p, 0), &k, 0, view, 4, o, &n, t, &moved), 2);
    assert_int_equal(moved, 2); /* told in full */
    op_free(&p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_first_publish_and_up_to_date),
        cmocka_unit_test(test_replay_tells_who_entered),
        cmocka_unit_test(test_resend_and_dropped_log),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
