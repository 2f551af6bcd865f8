/*
 * test_peer_prot.c -- what UCX 1.13 does with a remote write into a pool
 * registered for remote read only (tiers/peer/peer.c registers the DRAM
 * pool with UCP_MEM_MAP_PROT_REMOTE_READ and hands its packed rkey, worker
 * address and base to proven members only).
 *
 * The pool side is the daemon's own code (peer_open over a buffer); the
 * other side is raw UCX, as a certified member that obtained the rkey
 * would use it: an endpoint to the pool's worker, the rkey unpacked, a
 * ucp_get_nbx of the pool (which must work: the wiring is right) and a
 * ucp_put_nbx of other bytes over it. Each loopback transport is tried
 * alone (UCX_TLS=tcp, posix, sysv, cma with tcp for its active messages)
 * and UCX's own choice (UCX_TLS=all), in this one process.
 *
 * What it shows, and asserts: no transport of UCX 1.13 on loopback
 * enforces the read-only protection -- the put completes and the pool's
 * bytes change (docs/DESIGN-NOTES.md, "Remote memory"). The protection
 * is enforced only by RDMA hardware (verbs registers the memory without
 * IBV_ACCESS_REMOTE_WRITE), which this machine has none of. Should a
 * future UCX refuse the put, the test fails and the note must be updated:
 * it records the behaviour, it does not pass regardless. What kvtier
 * itself enforces -- the rkey goes only to members that proved their
 * certificate's node id -- is tested with real daemons in
 * test_cluster_tls (outsiders never get "UCX identity received").
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include <cmocka.h>
#include <ucp/api/ucp.h>

#include "log.h"
#include "peer/peer.h"

#define POOL (1u << 20)
#define SPAN 4096u

struct attacker {
    ucp_context_h ctx;
    ucp_worker_h w;
    ucp_ep_h ep;
    ucp_rkey_h rkey;
};

static void attacker_open(struct attacker *a, struct peer_tier *t)
{
    const void *addr, *rk;
    size_t alen, rlen;
    uint64_t base;
    ucp_config_t *cfg;
    peer_self(t, &addr, &alen, &rk, &rlen, &base);
    assert_int_equal(ucp_config_read(NULL, NULL, &cfg), UCS_OK);
    ucp_params_t p = {.field_mask = UCP_PARAM_FIELD_FEATURES, .features = UCP_FEATURE_RMA};
    assert_int_equal(ucp_init(&p, cfg, &a->ctx), UCS_OK);
    ucp_config_release(cfg);
    ucp_worker_params_t wp = {.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
                              .thread_mode = UCS_THREAD_MODE_SINGLE};
    assert_int_equal(ucp_worker_create(a->ctx, &wp, &a->w), UCS_OK);
    ucp_ep_params_t ep = {.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS,
                          .address = addr};
    assert_int_equal(ucp_ep_create(a->w, &ep, &a->ep), UCS_OK);
    assert_int_equal(ucp_ep_rkey_unpack(a->ep, rk, &a->rkey), UCS_OK);
}

static void attacker_close(struct attacker *a)
{
    ucp_rkey_destroy(a->rkey);
    ucp_request_param_t p = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
                             .flags = UCP_EP_CLOSE_FLAG_FORCE};
    ucs_status_ptr_t r = ucp_ep_close_nbx(a->ep, &p);
    while (r && UCS_PTR_IS_PTR(r) && ucp_request_check_status(r) == UCS_INPROGRESS)
        ucp_worker_progress(a->w);
    if (r && UCS_PTR_IS_PTR(r)) ucp_request_free(r);
    ucp_worker_destroy(a->w);
    ucp_cleanup(a->ctx);
}

/* Wait for r, progressing both sides (the pool's side serves software
 * emulated RMA from its own progress). The operation's status. */
static ucs_status_t wait_op(struct attacker *a, struct peer_tier *t, ucs_status_ptr_t r)
{
    if (r == NULL) return UCS_OK;
    if (UCS_PTR_IS_ERR(r)) return UCS_PTR_STATUS(r);
    ucs_status_t st;
    for (long i = 0; (st = ucp_request_check_status(r)) == UCS_INPROGRESS; i++) {
        ucp_worker_progress(a->w);
        peer_progress(t);
        if (i > 50000000L) break;
    }
    ucp_request_free(r);
    return st;
}

static ucs_status_t flush(struct attacker *a, struct peer_tier *t)
{
    ucp_request_param_t p = {0};
    return wait_op(a, t, ucp_ep_flush_nbx(a->ep, &p));
}

/* One transport alone: 1 if the put changed the pool, 0 if it did not. */
static int put_lands(const char *tls)
{
    char err[256];
    struct peer_tier *t;
    struct attacker a;
    setenv("UCX_TLS", tls, 1);
    uint8_t *pool = mmap(NULL, POOL, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    assert_true(pool != MAP_FAILED);
    memset(pool, 0x5a, POOL);
    if (peer_open(pool, POOL, 0, &t, err, sizeof err) != 0) fail_msg("%s: %s", tls, err);
    attacker_open(&a, t);
    const void *addr, *rk;
    size_t alen, rlen;
    uint64_t base;
    peer_self(t, &addr, &alen, &rk, &rlen, &base);

    /* The rkey reads the pool: the wiring is right. */
    uint8_t *got = calloc(1, SPAN), *mine = malloc(SPAN);
    ucp_request_param_t p = {0};
    assert_int_equal(wait_op(&a, t, ucp_get_nbx(a.ep, got, SPAN, base + SPAN, a.rkey, &p)),
                     UCS_OK);
    assert_int_equal(flush(&a, t), UCS_OK);
    assert_memory_equal(got, pool + SPAN, SPAN);

    /* The write: its own status, the flush's, then the pool's bytes. */
    memset(mine, 0xee, SPAN);
    ucs_status_t put = wait_op(&a, t, ucp_put_nbx(a.ep, mine, SPAN, base + SPAN, a.rkey, &p));
    ucs_status_t fl = flush(&a, t);
    for (int i = 0; i < 1000; i++) peer_progress(t), ucp_worker_progress(a.w);
    int changed = 0;
    for (uint32_t i = 0; i < SPAN; i++) changed |= pool[SPAN + i] != 0x5a;
    printf("UCX_TLS=%-7s get ok; put: %s, flush: %s; pool bytes %s\n", tls,
           ucs_status_string(put), ucs_status_string(fl),
           changed ? "OVERWRITTEN" : "unchanged");
    attacker_close(&a);
    peer_close(t);
    munmap(pool, POOL);
    free(got);
    free(mine);
    unsetenv("UCX_TLS");
    return changed;
}

static void test_tcp(void **state)
{
    (void)state;
    assert_int_equal(put_lands("tcp"), 1);
}

static void test_posix(void **state)
{
    (void)state;
    assert_int_equal(put_lands("posix"), 1);
}

static void test_sysv(void **state)
{
    (void)state;
    assert_int_equal(put_lands("sysv"), 1);
}

static void test_cma(void **state) /* cma has no active messages: tcp carries them */
{
    (void)state;
    assert_int_equal(put_lands("cma,tcp"), 1);
}

static void test_default(void **state) /* what UCX picks when left alone */
{
    (void)state;
    assert_int_equal(put_lands("all"), 1);
}

int main(void)
{
    log_set_level(LOG_ERROR);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tcp),
        cmocka_unit_test(test_posix),
        cmocka_unit_test(test_sysv),
        cmocka_unit_test(test_cma),
        cmocka_unit_test(test_default),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
