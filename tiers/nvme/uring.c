/*
 * uring.c -- see uring.h.
 *
 * An operation is one struct op from first submission to its callback;
 * the SQE's user data points at it. Long transfers are cut at UR_MAX_IO
 * per SQE (the SQE length is 32 bits) and continued like short ones.
 */
#include "uring.h"

#include <errno.h>
#include <liburing.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "fault.h"

#define UR_MAX_IO (1u << 30)
#define UR_MAX_REG 64

struct op {
    uint8_t *buf;
    uint64_t len, done, off;
    int64_t res;                /* held completions: the result */
    unsigned slot;
    int write;
    uring_cb cb;
    void *arg;
    struct op *next;
};

struct uring {
    struct io_uring ring;
    int ring_ok, efd;
    unsigned depth, inflight, queued;
    struct op *q_head, *q_tail; /* waiting for room in the ring */
    struct op *held;            /* fault nvme_hold: done, not yet reported */
    unsigned n_held;
    struct op *free_ops;
    int *fds;                   /* slot -> fd, -1 when empty */
    unsigned max_files;
    int files_reg;
    struct iovec reg[UR_MAX_REG];
    unsigned n_reg;
};

int uring_open(unsigned depth, unsigned max_files, struct uring **out,
               char *err, size_t errlen)
{
    struct uring *u = calloc(1, sizeof *u);
    int rv = -ENOMEM;
    if (!u || !(u->fds = malloc((max_files ? max_files : 1) * sizeof *u->fds)))
        goto fail;
    u->efd = -1;
    u->depth = depth ? depth : 1;
    u->max_files = max_files;
    memset(u->fds, 0xff, (max_files ? max_files : 1) * sizeof *u->fds);
    if ((rv = io_uring_queue_init(u->depth, &u->ring, 0)) != 0) goto fail;
    u->ring_ok = 1;
    u->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (u->efd < 0) rv = -errno;
    else rv = io_uring_register_eventfd(&u->ring, u->efd);
    if (rv != 0) goto fail;
    /* Sparse file table (kernel 5.19+); without it plain fds are used. */
    u->files_reg = max_files && io_uring_register_files_sparse(&u->ring, max_files) == 0;
    *out = u;
    return 0;
fail:
    snprintf(err, errlen, "io_uring (depth %u): %s", depth, strerror(-rv));
    uring_close(u);
    return rv;
}

int uring_fd(const struct uring *u)
{
    return u->efd;
}

unsigned uring_busy(const struct uring *u)
{
    return u->inflight + u->queued + u->n_held;
}

int uring_buffers_registered(const struct uring *u)
{
    return u->n_reg > 0;
}

int uring_files_registered(const struct uring *u)
{
    return u->files_reg;
}

int uring_set_file(struct uring *u, unsigned slot, int fd)
{
    if (slot >= u->max_files) return -EINVAL;
    u->fds[slot] = fd;
    if (!u->files_reg) return 0;
    int rv = io_uring_register_files_update(&u->ring, slot, &fd, 1);
    return rv == 1 ? 0 : (rv < 0 ? rv : -EIO);
}

int uring_register_buffers(struct uring *u, const struct iovec *iov, unsigned n)
{
    if (n == 0 || n > UR_MAX_REG || u->n_reg) return -EINVAL;
    if (fault_hit(FAULT_URING_REGBUF)) return -ENOMEM;
    int rv = io_uring_register_buffers(&u->ring, iov, n);
    if (rv != 0) return rv;
    memcpy(u->reg, iov, n * sizeof *iov);
    u->n_reg = n;
    return 0;
}

/* The registered buffer holding [p, p+len), or -1. */
static int fixed_index(const struct uring *u, const uint8_t *p, uint64_t len)
{
    for (unsigned i = 0; i < u->n_reg; i++) {
        const uint8_t *b = u->reg[i].iov_base;
        if (p >= b && p + len <= b + u->reg[i].iov_len) return (int)i;
    }
    return -1;
}

/* Put the next piece of o into an SQE; the caller checked for room. */
static void prep(struct uring *u, struct op *o)
{
    struct io_uring_sqe *sqe = io_uring_get_sqe(&u->ring);
    uint64_t left = o->len - o->done;
    unsigned n = left > UR_MAX_IO ? UR_MAX_IO : (unsigned)left;
    uint8_t *p = o->buf + o->done;
    int fd = u->files_reg ? (int)o->slot : u->fds[o->slot];
    int fi = fixed_index(u, p, n);
    if (fi >= 0 && o->write) io_uring_prep_write_fixed(sqe, fd, p, n, o->off + o->done, fi);
    else if (fi >= 0) io_uring_prep_read_fixed(sqe, fd, p, n, o->off + o->done, fi);
    else if (o->write) io_uring_prep_write(sqe, fd, p, n, o->off + o->done);
    else io_uring_prep_read(sqe, fd, p, n, o->off + o->done);
    if (u->files_reg) sqe->flags |= IOSQE_FIXED_FILE;
    io_uring_sqe_set_data(sqe, o);
    u->inflight++;
}

/* Move queued operations into the ring while it has room; submit. */
static void pump(struct uring *u)
{
    unsigned n = 0;
    while (u->q_head && u->inflight < u->depth) {
        struct op *o = u->q_head;
        u->q_head = o->next;
        if (!u->q_head) u->q_tail = NULL;
        u->queued--;
        prep(u, o);
        n++;
    }
    if (n) io_uring_submit(&u->ring);
}

static void enqueue(struct uring *u, struct op *o)
{
    o->next = NULL;
    if (u->q_tail) u->q_tail->next = o;
    else u->q_head = o;
    u->q_tail = o;
    u->queued++;
}

static void submit(struct uring *u, int write, unsigned slot, void *buf,
                   uint64_t len, uint64_t off, uring_cb cb, void *arg)
{
    struct op *o = u->free_ops;
    if (o) u->free_ops = o->next;
    else if (!(o = malloc(sizeof *o))) abort(); /* control-plane allocation */
    *o = (struct op){buf, len, 0, off, 0, slot, write, cb, arg, NULL};
    enqueue(u, o);
    pump(u);
}

void uring_read(struct uring *u, unsigned slot, void *buf, uint64_t len,
                uint64_t off, uring_cb cb, void *arg)
{
    submit(u, 0, slot, buf, len, off, cb, arg);
}

void uring_write(struct uring *u, unsigned slot, const void *buf, uint64_t len,
                 uint64_t off, uring_cb cb, void *arg)
{
    submit(u, 1, slot, (void *)buf, len, off, cb, arg);
}

static void finish(struct uring *u, struct op *o, int64_t res)
{
    uring_cb cb = o->cb;
    void *arg = o->arg;
    o->next = u->free_ops;
    u->free_ops = o;
    cb(arg, res);
}

/* One completion: continue a short transfer, or report. */
static void complete(struct uring *u, struct op *o, int res)
{
    u->inflight--;
    if (res >= 0 && fault_hit(o->write ? FAULT_NVME_WRITE : FAULT_NVME_READ))
        res = o->write ? -ENOSPC : -EIO;
    if (res == 0) res = -EIO; /* end of file: a record past the file */
    if (res < 0) {
        finish(u, o, res);
        return;
    }
    o->done += (uint64_t)res;
    if (o->done < o->len) {
        enqueue(u, o); /* the rest, in order behind what waits */
        return;
    }
    if (!o->write && fault_hit(FAULT_NVME_HOLD)) {
        o->res = (int64_t)o->len;
        o->next = u->held;
        u->held = o;
        u->n_held++;
        return;
    }
    finish(u, o, (int64_t)o->len);
}

/* Report held completions (after another I/O completed, or at drain). */
static void release_held(struct uring *u)
{
    while (u->held) {
        struct op *o = u->held;
        u->held = o->next;
        u->n_held--;
        finish(u, o, o->res);
    }
}

static void reap(struct uring *u)
{
    struct io_uring_cqe *cqe;
    unsigned held = u->n_held, n = 0;
    struct op *keep = u->held;
    while (io_uring_peek_cqe(&u->ring, &cqe) == 0) {
        struct op *o = io_uring_cqe_get_data(cqe);
        int res = cqe->res;
        io_uring_cqe_seen(&u->ring, cqe);
        complete(u, o, res);
        n++;
    }
    if (held && n && u->held == keep) release_held(u); /* none newly held */
}

void uring_poll(struct uring *u)
{
    uint64_t v;
    ssize_t r = read(u->efd, &v, sizeof v);
    (void)r;
    reap(u);
    pump(u);
}

void uring_drain(struct uring *u)
{
    for (;;) {
        struct io_uring_cqe *cqe;
        release_held(u);
        if (!u->inflight && !u->queued) break;
        pump(u);
        if (u->inflight && io_uring_wait_cqe(&u->ring, &cqe) != 0) continue;
        reap(u);
    }
}

void uring_close(struct uring *u)
{
    if (!u) return;
    if (u->ring_ok) {
        uring_drain(u);
        io_uring_queue_exit(&u->ring);
    }
    while (u->free_ops) {
        struct op *o = u->free_ops;
        u->free_ops = o->next;
        free(o);
    }
    if (u->efd >= 0) close(u->efd);
    free(u->fds);
    free(u);
}
