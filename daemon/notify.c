/*
 * notify.c -- sd_notify(3) in a page (see notify.h).
 */
#include "notify.h"

#include <errno.h>
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
    ssize_t w = sendto(fd, state, strlen(state), MSG_NOSIGNAL,
                       (struct sockaddr *)&sa, (socklen_t)alen);
    int e = errno;
    close(fd);
    if (w == (ssize_t)strlen(state)) return 1;
    snprintf(err, errlen, "notify %s: %s", path, w < 0 ? strerror(e) : "short send");
    return -1;
}

uint64_t notify_watchdog_ms(void)
{
    const char *us = getenv("WATCHDOG_USEC"), *pid = getenv("WATCHDOG_PID");
    if (!us || !us[0]) return 0;
    if (pid && pid[0] && strtol(pid, NULL, 10) != (long)getpid()) return 0;
    unsigned long long v = strtoull(us, NULL, 10);
    return v / 1000;
}
