/*
 * test_member.c -- the membership table's own rules (tiers/peer/member.c),
 * under a backend that does nothing and a clock the test sets.
 *
 * The reap: members DEAD or LEFT for reap_ms are removed (GONE fired),
 * ALIVE and SUSPECT ones never, and the next reap due is reported. A
 * state set later in the same tick than the `now` the tick was given
 * (the daemon's clock moved on while it worked) is not "older than
 * reap_ms": it used to be, as an unsigned now - since_ms wrapped, and
 * such a member was reaped at once -- forgotten the moment it died or
 * left, so a stale claim could bring it back.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <cmocka.h>

#include "peer/member.h"

static uint64_t Clock;
static int Gone;

static uint64_t now_ms(void *ctx) { (void)ctx; return Clock; }
static uint64_t rnd(void *ctx) { (void)ctx; return 4; }

static int no_send(void *ctx, const char *addr, const void *buf, size_t len)
{
    (void)ctx, (void)addr, (void)buf, (void)len;
    return -1;
}

static void on_change(void *arg, struct mb *mb, struct mb_member *m, enum mb_event ev,
                      enum mb_state old)
{
    (void)arg, (void)mb, (void)m, (void)old;
    if (ev == MB_EV_GONE) Gone++;
}

static const struct mb_ops idle_ops = {.name = "idle"};

static struct mb *table(void)
{
    struct mb_config c = {0};
    c.self_id = 1;
    c.self_addr = "tcp://127.0.0.1:1";
    c.reap_ms = 1000;
    c.on_change = on_change;
    c.env = (struct mb_env){NULL, no_send, now_ms, rnd, NULL};
    struct mb *mb = mb_create(&idle_ops, &c, NULL);
    assert_non_null(mb);
    char addr[32];
    for (uint32_t id = 2; id <= 5; id++) {
        snprintf(addr, sizeof addr, "tcp://127.0.0.1:%u", (unsigned)id);
        assert_non_null(mb_add(mb, id, addr, NULL, 0, 1, MB_ALIVE));
    }
    return mb;
}

static void test_reap_after_reap_ms(void **state)
{
    (void)state;
    Clock = 10000;
    Gone = 0;
    struct mb *mb = table();
    assert_int_equal(mb_reap(mb, Clock), UINT64_MAX); /* nobody down */
    mb_set_state(mb, mb_find(mb, 2), MB_DEAD, 1);
    Clock = 10400;
    mb_set_state(mb, mb_find(mb, 3), MB_LEFT, 1);
    mb_set_state(mb, mb_find(mb, 4), MB_SUSPECT, 1);
    assert_int_equal(mb_reap(mb, 10999), 11000);      /* 2 is due first */
    assert_int_equal(mb_count(mb), 4);
    assert_int_equal(mb_reap(mb, 11000), 11400);      /* 2 goes, 3 next */
    assert_null(mb_find(mb, 2));
    assert_int_equal(Gone, 1);
    assert_int_equal(mb_reap(mb, 99999), UINT64_MAX); /* 3 goes */
    assert_null(mb_find(mb, 3));
    assert_non_null(mb_find(mb, 4));                  /* suspect stays */
    assert_non_null(mb_find(mb, 5));                  /* alive stays */
    assert_int_equal(Gone, 2);
    mb_destroy(mb);
}

/* A tick given now = 20000 declares 2 dead at 20003 (mb_now moved on),
 * then reaps with its own now: 2 is 0 ms dead, not 2^64 - 3. */
static void test_reap_state_newer_than_now(void **state)
{
    (void)state;
    Clock = 20003;
    Gone = 0;
    struct mb *mb = table();
    mb_set_state(mb, mb_find(mb, 2), MB_DEAD, 1);
    assert_int_equal(mb_find(mb, 2)->since_ms, 20003);
    assert_int_equal(mb_reap(mb, 20000), 21003);
    assert_non_null(mb_find(mb, 2));
    assert_int_equal(Gone, 0);
    assert_int_equal(mb_reap(mb, 21003), UINT64_MAX);
    assert_null(mb_find(mb, 2));
    mb_destroy(mb);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reap_after_reap_ms),
        cmocka_unit_test(test_reap_state_newer_than_now),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
