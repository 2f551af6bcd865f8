/*
 * nngclose.c -- close nng sockets within a time bound (see nngclose.h).
 */
#include "nngclose.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* Shared by the caller and the helper; whoever finishes last frees it. */
struct closer {
    pthread_mutex_t mtx;
    pthread_cond_t cv;
    int done, abandoned, hang;
    size_t n;
    nng_socket s[];
};

static void closer_free(struct closer *k)
{
    pthread_cond_destroy(&k->cv);
    pthread_mutex_destroy(&k->mtx);
    free(k);
}

static void *closer_main(void *arg)
{
    struct closer *k = arg;
    while (k->hang) pause(); /* the test hook: never returns */
    for (size_t i = 0; i < k->n; i++) nng_close(k->s[i]);
    pthread_mutex_lock(&k->mtx);
    k->done = 1;
    int last = k->abandoned;
    pthread_cond_signal(&k->cv);
    pthread_mutex_unlock(&k->mtx);
    if (last) closer_free(k);
    return NULL;
}

int nngc_close_bounded(const nng_socket *s, size_t n, unsigned ms, int hang)
{
    if (n == 0) return 0;
    struct closer *k = calloc(1, sizeof *k + n * sizeof k->s[0]);
    pthread_attr_t at;
    pthread_t t;
    if (!k) goto inline_close;
    memcpy(k->s, s, n * sizeof k->s[0]);
    k->n = n;
    k->hang = hang;
    pthread_mutex_init(&k->mtx, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&k->cv, &ca);
    pthread_condattr_destroy(&ca);
    pthread_attr_init(&at);
    pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
    int rv = pthread_create(&t, &at, closer_main, k);
    pthread_attr_destroy(&at);
    if (rv != 0) {
        closer_free(k);
        goto inline_close;
    }

    struct timespec dl;
    clock_gettime(CLOCK_MONOTONIC, &dl);
    dl.tv_sec += ms / 1000;
    dl.tv_nsec += (long)(ms % 1000) * 1000000L;
    if (dl.tv_nsec >= 1000000000L) {
        dl.tv_sec++;
        dl.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&k->mtx);
    while (!k->done)
        if (pthread_cond_timedwait(&k->cv, &k->mtx, &dl) == ETIMEDOUT) break;
    int done = k->done;
    if (!done) k->abandoned = 1;
    pthread_mutex_unlock(&k->mtx);
    if (done) closer_free(k); /* the helper has let go of it */
    return done ? 0 : -1;

inline_close: /* no helper thread: close here, unbounded; they did close */
    for (size_t i = 0; i < n; i++) nng_close(s[i]);
    return 0;
}
