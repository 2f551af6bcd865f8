/*
 * notify.c -- sd_notify(3) in a page (see notify.h).
 */
#include "notify.h"

#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

/* Fill sa from $NOTIFY_SOCKET; returns the address length or -1. */
static int notify_addr(const char *path, struct sockaddr_un *sa)
{
    size_t n = strlen(path);
    memset(sa, 0, sizeof *sa);
    sa->sun_family = AF_UNIX;
    if ((path[0] != '/' && path[0] != '@') || n < 2 || n >= sizeof sa->sun_path)
        return -1;
    memcpy(sa->sun_path, path, n);
    if (path[0] == '@') sa->sun_path[0] = '\0'; /* abstract namespace */
    return (int)(offsetof(struct sockaddr_un, sun_path) + n);
}

int notify_send(const char *state, char *err, size_t errlen)
{
    return notify_send_fd(state, -1, err, errlen);
}

/* One datagram of state, with fd in SCM_RIGHTS when fd >= 0. */
static ssize_t send_state(int s, const char *state, int fd,
                          const struct sockaddr_un *sa, socklen_t alen)
{
    union {
        struct cmsghdr h;
        char b[CMSG_SPACE(sizeof(int))];
    } u;
    struct iovec iov = {(void *)state, strlen(state)};
    struct msghdr m = {.msg_name = (void *)sa, .msg_namelen = alen,
                       .msg_iov = &iov, .msg_iovlen = 1};
    if (fd >= 0) {
        memset(&u, 0, sizeof u);
        m.msg_control = u.b;
        m.msg_controllen = sizeof u.b;
        struct cmsghdr *c = CMSG_FIRSTHDR(&m);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(sizeof(int));
        memcpy(CMSG_DATA(c), &fd, sizeof fd);
    }
    return sendmsg(s, &m, MSG_NOSIGNAL);
}

int notify_send_fd(const char *state, int pass_fd, char *err, size_t errlen)
{
    const char *path = getenv("NOTIFY_SOCKET");
    struct sockaddr_un sa;
    if (!path || !path[0]) return 0;
    int alen = notify_addr(path, &sa);
    if (alen < 0) {
        snprintf(err, errlen, "NOTIFY_SOCKET '%s' is not a socket path or "
                 "@abstract name", path);
        return -1;
    }
    int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        snprintf(err, errlen, "notify socket: %s", strerror(errno));
        return -1;
    }
    ssize_t w = send_state(fd, state, pass_fd, &sa, (socklen_t)alen);
    int e = errno;
    close(fd);
    if (w == (ssize_t)strlen(state)) return 1;
    snprintf(err, errlen, "notify %s: %s", path, w < 0 ? strerror(e) : "short send");
    return -1;
}

/* Index of name in the colon-separated list names, or -1. */
static long name_index(const char *names, const char *name)
{
    size_t n = strlen(name);
    long i = 0;
    for (const char *p = names; p; i++) {
        const char *end = strchr(p, ':');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        if (len == n && !memcmp(p, name, n)) return i;
        p = end ? end + 1 : NULL;
    }
    return -1;
}

/* LISTEN_* is read once, for this process only, and then cleared so no
 * child takes it for its own; later names are looked up in the copy. */
static struct {
    int read;
    long n;
    char names[4096];
} listen_env;

int notify_listen_fd(const char *name)
{
    if (!listen_env.read) {
        const char *pid = getenv("LISTEN_PID"), *fds = getenv("LISTEN_FDS"),
                   *names = getenv("LISTEN_FDNAMES");
        listen_env.read = 1;
        if (pid && strtol(pid, NULL, 10) == (long)getpid() && names && fds &&
            strlen(names) < sizeof listen_env.names) {
            listen_env.n = strtol(fds, NULL, 10);
            memcpy(listen_env.names, names, strlen(names) + 1);
        }
        unsetenv("LISTEN_PID");
        unsetenv("LISTEN_FDS");
        unsetenv("LISTEN_FDNAMES");
    }
    long i = listen_env.names[0] ? name_index(listen_env.names, name) : -1;
    if (i < 0 || i >= listen_env.n) return -1;
    int fd = 3 + (int)i;
    if (fcntl(fd, F_SETFD, FD_CLOEXEC) != 0) return -1; /* not open */
    return fd;
}

uint64_t notify_watchdog_ms(void)
{
    const char *us = getenv("WATCHDOG_USEC"), *pid = getenv("WATCHDOG_PID");
    if (!us || !us[0]) return 0;
    if (pid && pid[0] && strtol(pid, NULL, 10) != (long)getpid()) return 0;
    unsigned long long v = strtoull(us, NULL, 10);
    return v / 1000;
}
