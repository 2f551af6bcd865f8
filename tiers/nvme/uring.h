/*
 * uring.h -- a small io_uring engine for the NVMe tier.
 *
 * Design: one ring owned by the core thread (DESIGN §6). Reads and writes
 * are queued with a completion callback; at most `depth` are in the kernel
 * at once and the rest wait in a FIFO, so a burst of demotions never
 * overruns the ring. The ring signals an eventfd, which the core's epoll
 * loop watches; uring_poll() reaps completions and runs the callbacks on
 * the core thread. A short read or write (legal for O_DIRECT on a regular
 * file) is resubmitted for the rest, so a callback sees all bytes or an
 * error. Files are registered in a sparse table and named by slot;
 * buffers inside a registered region (the DRAM pool) use READ_FIXED /
 * WRITE_FIXED, everything else plain READ / WRITE: registration is an
 * optimisation, never a requirement (it fails under a small
 * RLIMIT_MEMLOCK, and the caller then just goes on).
 *
 * Ownership: the caller owns buffers until their callback ran. Fault
 * injection (fault.h): nvme_read / nvme_write turn a completion into
 * -EIO / -ENOSPC.
 */
#ifndef KVT_URING_H
#define KVT_URING_H

#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

struct uring;

/* res: bytes moved (the whole length) or -errno. */
typedef void (*uring_cb)(void *arg, int64_t res);

/* A ring of depth entries with room for max_files registered files.
 * 0, or -errno with a sentence in err. */
int uring_open(unsigned depth, unsigned max_files, struct uring **out,
               char *err, size_t errlen);
/* Wait for every operation (callbacks run), then free. Accepts NULL. */
void uring_close(struct uring *u);

/* The eventfd the core loop polls. */
int uring_fd(const struct uring *u);
/* Reap completions and run their callbacks; submit what waits. */
void uring_poll(struct uring *u);
/* Block until nothing is in flight or queued (start-up, shutdown). */
void uring_drain(struct uring *u);
/* Operations in the kernel plus those queued behind them. */
unsigned uring_busy(const struct uring *u);

/* Put fd in file slot (registered when the kernel allows). 0 or -errno. */
int uring_set_file(struct uring *u, unsigned slot, int fd);
/* Register buffers for fixed I/O. 0, or -errno (nothing registered). */
int uring_register_buffers(struct uring *u, const struct iovec *iov, unsigned n);
/* 1 if buffers are registered, 1 if files are. */
int uring_buffers_registered(const struct uring *u);
int uring_files_registered(const struct uring *u);

/* Queue a read or write of len bytes at off of the file in slot. */
void uring_read(struct uring *u, unsigned slot, void *buf, uint64_t len,
                uint64_t off, uring_cb cb, void *arg);
void uring_write(struct uring *u, unsigned slot, const void *buf, uint64_t len,
                 uint64_t off, uring_cb cb, void *arg);

#endif
