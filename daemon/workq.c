/*
 * workq.c -- the one worker pool and completion queue of the daemon.
 *
 * Design (DESIGN §6, STYLE §7, §15): work that would block or burn the
 * core thread -- a GPU or SIGBUS-guarded copy (kvxfer.c), a checksum of a
 * chunk read back from NVMe (nvio.c) or pulled from a peer (pget.c), a
 * RocksDB batch with its fdatasync (nvindex.c) -- is a job: run() on a
 * worker thread, then done() on the core thread. Each user opens its own
 * queue (its threads, its per-thread state), so a slow copy never waits
 * behind a checksum; every queue hands finished jobs to one completion
 * queue, whose eventfd is written only when its list goes from empty to
 * non-empty, and the core loop runs the done calls from there.
 *
 * Bounded: a queue has a fixed number of threads; one poll runs at most
 * CQ_BATCH done calls and re-arms the eventfd if more wait (STYLE §8).
 * Closing drains (every queued job runs, every done call runs, before
 * workq_close returns) or discards (nothing queued runs, no done call of
 * that queue runs; the caller settles its jobs), as the caller says.
 * Jobs are the caller's memory, so the queue itself never allocates per
 * job.
 */
#include "workq.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "kvtier.h"
#include "log.h"

#define CQ_BATCH 1024
#define WQ_MAX_THREADS 64

struct wq_cq {
    int efd;
    pthread_mutex_t mtx; /* guards head, tail */
    struct wq_job *head, *tail;
};

struct workq {
    struct wq_opts o;
    pthread_t th[WQ_MAX_THREADS];
    unsigned n_th;
    pthread_mutex_t mtx; /* guards head, tail, stop, discard, job->queued */
    pthread_cond_t cv;
    struct wq_job *head, *tail;
    int stop, discard;
};

struct wq_worker {
    struct workq *q;
    unsigned i;
};

/* ------------------------------------------------------ completion queue */

int wq_cq_open(struct wq_cq **out)
{
    struct wq_cq *cq = calloc(1, sizeof *cq);
    if (!cq) abort(); /* start-up allocation */
    cq->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (cq->efd < 0) {
        free(cq);
        return -1;
    }
    pthread_mutex_init(&cq->mtx, NULL);
    *out = cq;
    return 0;
}

int wq_cq_fd(const struct wq_cq *cq)
{
    return cq->efd;
}

static void cq_wake(struct wq_cq *cq)
{
    uint64_t one = 1;
    ssize_t w = write(cq->efd, &one, sizeof one);
    (void)w;
}

/* Any thread: j ran; its done call is due. */
static void cq_push(struct wq_cq *cq, struct wq_job *j)
{
    j->next = NULL;
    pthread_mutex_lock(&cq->mtx);
    int was_empty = cq->head == NULL;
    if (cq->tail) cq->tail->next = j;
    else cq->head = j;
    cq->tail = j;
    pthread_mutex_unlock(&cq->mtx);
    if (was_empty) cq_wake(cq);
}

/* Unlink up to max finished jobs (of queue q only, unless q is NULL). */
static struct wq_job *cq_take(struct wq_cq *cq, const struct workq *q, unsigned max)
{
    struct wq_job *out = NULL, **tail = &out, *prev = NULL;
    pthread_mutex_lock(&cq->mtx);
    for (struct wq_job *j = cq->head, *next; j && max; j = next) {
        next = j->next;
        if (q && j->q != q) {
            prev = j;
            continue;
        }
        if (prev) prev->next = next;
        else cq->head = next;
        if (cq->tail == j) cq->tail = prev;
        j->next = NULL;
        *tail = j;
        tail = &j->next;
        max--;
    }
    int more = cq->head != NULL;
    pthread_mutex_unlock(&cq->mtx);
    if (more && !q) cq_wake(cq); /* come back for the rest */
    return out;
}

static void run_done(struct wq_job *j)
{
    while (j) {
        struct wq_job *next = j->next;
        j->done(j);
        j = next;
    }
}

void wq_cq_poll(struct wq_cq *cq)
{
    uint64_t v;
    ssize_t r = read(cq->efd, &v, sizeof v);
    (void)r;
    run_done(cq_take(cq, NULL, CQ_BATCH));
}

void wq_cq_close(struct wq_cq *cq)
{
    if (!cq) return;
    close(cq->efd);
    pthread_mutex_destroy(&cq->mtx);
    free(cq);
}

/* ---------------------------------------------------------------- workers */

static struct wq_job *pop(struct workq *q)
{
    pthread_mutex_lock(&q->mtx);
    while (!q->head && !q->stop) pthread_cond_wait(&q->cv, &q->mtx);
    struct wq_job *j = q->discard ? NULL : q->head;
    if (j) {
        if (!(q->head = j->next)) q->tail = NULL;
        j->queued = 0;
    }
    pthread_mutex_unlock(&q->mtx);
    return j;
}

static void *worker_main(void *arg)
{
    struct wq_worker w = *(struct wq_worker *)arg;
    struct workq *q = w.q;
    free(arg);
    void *tls = q->o.thread_init ? q->o.thread_init(q->o.arg, w.i) : NULL;
    struct wq_job *j;
    while ((j = pop(q))) {
        void (*done)(struct wq_job *) = j->done; /* j may be gone after run */
        j->run(j, tls);
        if (done) cq_push(q->o.cq, j);
    }
    if (q->o.thread_fini) q->o.thread_fini(tls);
    return NULL;
}

int workq_open(const struct wq_opts *o, struct workq **out)
{
    struct workq *q = calloc(1, sizeof *q);
    if (!q) abort(); /* start-up allocation */
    q->o = *o;
    pthread_mutex_init(&q->mtx, NULL);
    pthread_cond_init(&q->cv, NULL);
    *out = q;
    for (unsigned i = 0; i < o->threads && i < WQ_MAX_THREADS; i++) {
        struct wq_worker *w = malloc(sizeof *w);
        if (!w) abort();
        *w = (struct wq_worker){q, i};
        if (pthread_create(&q->th[i], NULL, worker_main, w) != 0) {
            free(w);
            log_error("workq", "%s: cannot start worker %u", o->name, i);
            workq_close(q, WQ_DISCARD);
            *out = NULL;
            return -1;
        }
        q->n_th = i + 1;
    }
    return 0;
}

void wq_submit(struct workq *q, struct wq_job *j)
{
    j->q = q;
    j->next = NULL;
    pthread_mutex_lock(&q->mtx);
    j->queued = 1;
    if (q->tail) q->tail->next = j;
    else q->head = j;
    q->tail = j;
    pthread_cond_signal(&q->cv);
    pthread_mutex_unlock(&q->mtx);
}

int wq_unqueue(struct workq *q, struct wq_job *j)
{
    int taken = 0;
    pthread_mutex_lock(&q->mtx);
    if (j->queued) {
        struct wq_job **pp = &q->head, *prev = NULL;
        while (*pp != j) {
            prev = *pp;
            pp = &(*pp)->next;
        }
        *pp = j->next;
        if (q->tail == j) q->tail = prev;
        j->queued = 0;
        taken = 1;
    }
    pthread_mutex_unlock(&q->mtx);
    return taken;
}

/* ------------------------------------------------------------- checksums */

static void csum_run(struct wq_job *j, void *tls)
{
    struct wq_csum *c = (struct wq_csum *)j;
    (void)tls;
    c->ok = kvt_checksum(c->p, (size_t)c->n) == c->want;
}

void wq_csum_init(struct wq_csum *c, const void *p, unsigned long long n,
                  unsigned long long want, void (*done)(struct wq_job *j))
{
    *c = (struct wq_csum){.job = {.run = csum_run, .done = done}, .p = p, .n = n,
                          .want = want};
}

void workq_close(struct workq *q, enum wq_close_mode mode)
{
    if (!q) return;
    pthread_mutex_lock(&q->mtx);
    q->stop = 1;
    q->discard = mode == WQ_DISCARD;
    pthread_cond_broadcast(&q->cv);
    pthread_mutex_unlock(&q->mtx);
    for (unsigned i = 0; i < q->n_th; i++) pthread_join(q->th[i], NULL);
    for (struct wq_job *j = q->head; j; j = j->next) j->queued = 0; /* not run */
    struct wq_job *fin = q->o.cq ? cq_take(q->o.cq, q, UINT32_MAX) : NULL;
    if (mode == WQ_DRAIN) run_done(fin);
    pthread_cond_destroy(&q->cv);
    pthread_mutex_destroy(&q->mtx);
    free(q);
}
