/*
 * workq.h -- worker threads and the completion queue back to the core
 * thread (see workq.c).
 *
 * Ownership: a job is the caller's memory (embed struct wq_job in the
 * object the work is about). Between wq_submit and the job's done call
 * (or wq_unqueue returning 1, or a discarding close) the queue uses
 * j->next and j->q and the caller must not free the job. run() may not
 * touch the job after returning if it has no done function (the caller
 * may submit it again at once).
 */
#ifndef KVT_WORKQ_H
#define KVT_WORKQ_H

struct wq_cq;
struct workq;

struct wq_job {
    /* On a worker thread; tls is what thread_init returned for it. */
    void (*run)(struct wq_job *j, void *tls);
    /* On the core thread (wq_cq_poll), after run; NULL: nothing to say. */
    void (*done)(struct wq_job *j);
    struct workq *q;   /* the queue's */
    struct wq_job *next;
    int queued;        /* waiting for a worker */
};

struct wq_opts {
    const char *name;     /* for log lines */
    unsigned threads;     /* 1 or more */
    struct wq_cq *cq;     /* where done calls go; NULL if no job has one */
    /* Optional, on each worker as it starts / before it exits. */
    void *(*thread_init)(void *arg, unsigned i);
    void (*thread_fini)(void *tls);
    void *arg;
};

/* The completion queue: one eventfd the core loop watches. 0 or -1. */
int wq_cq_open(struct wq_cq **out);
int wq_cq_fd(const struct wq_cq *cq);
/* Run done calls of finished jobs, at most a bounded number per call
 * (the fd stays readable while more wait). Core thread. */
void wq_cq_poll(struct wq_cq *cq);
/* Accepts NULL. Every queue using it must be closed first. */
void wq_cq_close(struct wq_cq *cq);

/* Start o->threads workers. 0, or -1 (the queue is closed again). */
int workq_open(const struct wq_opts *o, struct workq **out);
/* Queue j (any thread). */
void wq_submit(struct workq *q, struct wq_job *j);
/* Take j back if no worker has started it: 1, else 0 (its done call
 * will come). */
int wq_unqueue(struct workq *q, struct wq_job *j);

/* The job two queues share: the XXH3-64 of p[0..n) compared with want
 * (ok = 1 if equal). done is the caller's, on the core thread. */
struct wq_csum {
    struct wq_job job;
    const void *p;
    unsigned long long n, want;
    int ok;
};
void wq_csum_init(struct wq_csum *c, const void *p, unsigned long long n,
                  unsigned long long want, void (*done)(struct wq_job *j));

enum wq_close_mode {
    WQ_DRAIN,   /* workers run every queued job; then every done call runs */
    WQ_DISCARD, /* queued jobs are not run; no done call of this queue runs:
                 * the caller settles its jobs itself */
};
/* Stop the workers (running jobs end first), then as mode says. Core
 * thread; accepts NULL. */
void workq_close(struct workq *q, enum wq_close_mode mode);

#endif
