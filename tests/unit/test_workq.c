/*
 * test_workq.c -- the worker queues and the completion queue (workq.c):
 * every job runs once on a worker and its done call once on the polling
 * thread; a job taken back before it ran never runs; closing drains
 * (queued jobs run, done calls run) or discards (neither); one poll runs a
 * bounded number of done calls and leaves the fd readable for the rest;
 * per-thread state reaches run(); the shared checksum job. Waits poll,
 * nothing is timed.
 */
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "kvtier.h"
#include "workq.h"

struct tjob {
    struct wq_job job;
    int ran, done;
    void *tls;
    pthread_mutex_t *gate; /* held: run waits on it */
};

static void t_run(struct wq_job *j, void *tls)
{
    struct tjob *t = (struct tjob *)j;
    if (t->gate) {
        pthread_mutex_lock(t->gate);
        pthread_mutex_unlock(t->gate);
    }
    t->tls = tls;
    __atomic_add_fetch(&t->ran, 1, __ATOMIC_SEQ_CST);
}

static void t_done(struct wq_job *j)
{
    ((struct tjob *)j)->done++;
}

static int readable(struct wq_cq *cq)
{
    struct pollfd p = {wq_cq_fd(cq), POLLIN, 0};
    return poll(&p, 1, 0) == 1;
}

/* Poll until n done calls have run among jobs (bounded wait). */
static void poll_until(struct wq_cq *cq, struct tjob *jobs, int n)
{
    for (int tries = 0; tries < 20000; tries++) {
        int d = 0;
        for (int i = 0; i < n; i++) d += jobs[i].done;
        if (d == n) return;
        struct pollfd p = {wq_cq_fd(cq), POLLIN, 0};
        if (poll(&p, 1, 10) == 1) wq_cq_poll(cq);
    }
    fail_msg("done calls did not all come");
}

static void init_jobs(struct tjob *jobs, int n, pthread_mutex_t *gate)
{
    memset(jobs, 0, n * sizeof *jobs);
    for (int i = 0; i < n; i++)
        jobs[i].job = (struct wq_job){.run = t_run, .done = t_done}, jobs[i].gate = gate;
}

static void test_every_job_once(void **state)
{
    (void)state;
    enum { N = 3000 }; /* more than one poll's batch */
    static struct tjob jobs[N];
    struct wq_cq *cq;
    struct workq *q;
    assert_int_equal(wq_cq_open(&cq), 0);
    struct wq_opts o = {.name = "t", .threads = 3, .cq = cq};
    assert_int_equal(workq_open(&o, &q), 0);
    init_jobs(jobs, N, NULL);
    for (int i = 0; i < N; i++) wq_submit(q, &jobs[i].job);
    poll_until(cq, jobs, N);
    for (int i = 0; i < N; i++) {
        assert_int_equal(jobs[i].ran, 1);
        assert_int_equal(jobs[i].done, 1);
    }
    workq_close(q, WQ_DRAIN);
    assert_false(readable(cq));
    wq_cq_close(cq);
}

/* Wait until every job ran on a worker (none polled yet). */
static void wait_ran(struct tjob *jobs, int n)
{
    for (int tries = 0; tries < 20000; tries++) {
        int r = 0;
        for (int i = 0; i < n; i++) r += __atomic_load_n(&jobs[i].ran, __ATOMIC_SEQ_CST);
        if (r == n) return;
        usleep(1000);
    }
    fail_msg("jobs did not all run");
}

static void test_poll_is_bounded(void **state)
{
    (void)state;
    enum { N = 2500 };
    static struct tjob jobs[N];
    struct wq_cq *cq;
    struct workq *q;
    assert_int_equal(wq_cq_open(&cq), 0);
    struct wq_opts o = {.name = "t", .threads = 1, .cq = cq};
    assert_int_equal(workq_open(&o, &q), 0);
    init_jobs(jobs, N, NULL);
    for (int i = 0; i < N; i++) wq_submit(q, &jobs[i].job);
    wait_ran(jobs, N);
    wq_cq_poll(cq);
    int d = 0;
    for (int i = 0; i < N; i++) d += jobs[i].done;
    assert_true(d > 0 && d < N); /* one batch, not everything */
    assert_true(readable(cq));   /* the rest is still announced */
    poll_until(cq, jobs, N);
    workq_close(q, WQ_DRAIN);
    wq_cq_close(cq);
}

static void test_unqueue_and_close(void **state)
{
    (void)state;
    enum { N = 8 };
    struct tjob jobs[N];
    pthread_mutex_t gate = PTHREAD_MUTEX_INITIALIZER;
    struct wq_cq *cq;
    struct workq *q;
    assert_int_equal(wq_cq_open(&cq), 0);
    struct wq_opts o = {.name = "t", .threads = 1, .cq = cq};
    assert_int_equal(workq_open(&o, &q), 0);
    init_jobs(jobs, N, &gate);
    pthread_mutex_lock(&gate); /* the worker cannot get past the first job */
    for (int i = 0; i < N; i++) wq_submit(q, &jobs[i].job);
    assert_int_equal(wq_unqueue(q, &jobs[N - 1].job), 1); /* not started */
    assert_int_equal(wq_unqueue(q, &jobs[N - 1].job), 0); /* not queued now */
    pthread_mutex_unlock(&gate);
    workq_close(q, WQ_DRAIN); /* every other job runs, every done call runs */
    for (int i = 0; i < N - 1; i++) {
        assert_int_equal(jobs[i].ran, 1);
        assert_int_equal(jobs[i].done, 1);
    }
    assert_int_equal(jobs[N - 1].ran, 0);
    assert_int_equal(jobs[N - 1].done, 0);

    /* Discarding: jobs that ran have no done call, not even later. */
    assert_int_equal(workq_open(&o, &q), 0);
    init_jobs(jobs, N, NULL);
    for (int i = 0; i < N; i++) wq_submit(q, &jobs[i].job);
    wait_ran(jobs, N);
    workq_close(q, WQ_DISCARD);
    wq_cq_poll(cq);
    for (int i = 0; i < N; i++) assert_int_equal(jobs[i].done, 0);

    /* ... and queued jobs do not run (no worker here to take them). */
    o.threads = 0;
    assert_int_equal(workq_open(&o, &q), 0);
    init_jobs(jobs, N, NULL);
    for (int i = 0; i < N; i++) wq_submit(q, &jobs[i].job);
    workq_close(q, WQ_DISCARD);
    for (int i = 0; i < N; i++) assert_int_equal(jobs[i].ran + jobs[i].done, 0);
    wq_cq_close(cq);
}

static int inits, finis;
static void *t_init(void *arg, unsigned i)
{
    __atomic_add_fetch(&inits, 1, __ATOMIC_SEQ_CST);
    return (char *)arg + i;
}
static void t_fini(void *tls)
{
    (void)tls;
    __atomic_add_fetch(&finis, 1, __ATOMIC_SEQ_CST);
}

static void test_thread_state(void **state)
{
    (void)state;
    static char base[4];
    struct tjob jobs[16];
    struct wq_cq *cq;
    struct workq *q;
    assert_int_equal(wq_cq_open(&cq), 0);
    struct wq_opts o = {"t", 4, cq, t_init, t_fini, base};
    assert_int_equal(workq_open(&o, &q), 0);
    init_jobs(jobs, 16, NULL);
    for (int i = 0; i < 16; i++) wq_submit(q, &jobs[i].job);
    poll_until(cq, jobs, 16);
    for (int i = 0; i < 16; i++)
        assert_true((char *)jobs[i].tls >= base && (char *)jobs[i].tls < base + 4);
    workq_close(q, WQ_DRAIN);
    assert_int_equal(inits, 4);
    assert_int_equal(finis, 4);
    wq_cq_close(cq);
}

static int csum_seen;
static void csum_done(struct wq_job *j)
{
    csum_seen = 1 + ((struct wq_csum *)j)->ok;
}

static void test_checksum_job(void **state)
{
    (void)state;
    static uint8_t buf[1 << 16];
    for (size_t i = 0; i < sizeof buf; i++) buf[i] = (uint8_t)(i * 7);
    struct wq_cq *cq;
    struct workq *q;
    struct wq_csum c;
    assert_int_equal(wq_cq_open(&cq), 0);
    struct wq_opts o = {.name = "t", .threads = 1, .cq = cq};
    assert_int_equal(workq_open(&o, &q), 0);
    wq_csum_init(&c, buf, sizeof buf, kvt_checksum(buf, sizeof buf), csum_done);
    wq_submit(q, &c.job);
    workq_close(q, WQ_DRAIN);
    assert_int_equal(csum_seen, 2); /* ok */
    assert_int_equal(workq_open(&o, &q), 0);
    wq_csum_init(&c, buf, sizeof buf, kvt_checksum(buf, sizeof buf) ^ 1, csum_done);
    wq_submit(q, &c.job);
    workq_close(q, WQ_DRAIN);
    assert_int_equal(csum_seen, 1); /* a mismatch */
    wq_cq_close(cq);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_job_once),
        cmocka_unit_test(test_poll_is_bounded),
        cmocka_unit_test(test_unqueue_and_close),
        cmocka_unit_test(test_thread_state),
        cmocka_unit_test(test_checksum_job),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
