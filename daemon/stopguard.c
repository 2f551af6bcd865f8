/*
 * stopguard.c -- see stopguard.h.
 */
#include "stopguard.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "log.h"

static struct {
    int armed, efd;
    uint64_t ms;
    pthread_t t;
    _Atomic(const char *) stage;
} g = {.efd = -1};

static uint64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static void *guard_main(void *arg)
{
    (void)arg;
    uint64_t end = mono_ms() + g.ms;
    for (;;) {
        uint64_t now = mono_ms();
        if (now >= end) break;
        uint64_t left = end - now;
        struct pollfd p = {.fd = g.efd, .events = POLLIN};
        int n = poll(&p, 1, left > 60000 ? 60000 : (int)left);
        if (n > 0) return NULL; /* sg_done */
        if (n < 0 && errno != EINTR) break;
    }
    const char *st = atomic_load(&g.stage);
    log_error("main", "stop did not finish within daemon.shutdown_timeout_ms = %llu ms "
              "(stuck in: %s); exiting now", (unsigned long long)g.ms, st ? st : "?");
    _exit(1);
}

int sg_arm(uint64_t ms)
{
    if (g.armed || ms == 0) return 0;
    g.efd = eventfd(0, EFD_CLOEXEC);
    g.ms = ms;
    if (g.efd < 0 || pthread_create(&g.t, NULL, guard_main, NULL) != 0) {
        log_warn("main", "no shutdown guard (%s): the stop is not bounded",
                 g.efd < 0 ? "eventfd" : "thread");
        if (g.efd >= 0) close(g.efd);
        g.efd = -1;
        return -1;
    }
    g.armed = 1;
    return 0;
}

void sg_stage(const char *what)
{
    atomic_store(&g.stage, what);
}

void sg_done(void)
{
    if (!g.armed) return;
    uint64_t one = 1;
    if (write(g.efd, &one, sizeof one) != (ssize_t)sizeof one)
        log_warn("main", "shutdown guard: cannot wake it");
    pthread_join(g.t, NULL);
    close(g.efd);
    g.efd = -1;
    g.armed = 0;
}
