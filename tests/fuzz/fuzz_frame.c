/*
 * fuzz_frame.c -- the fast channel's framing (daemon/local.c): any byte
 * stream a client can send, written in pieces whose sizes the input
 * chooses, then the client's half-close. The server must answer every
 * whole frame it accepts with a reply that decodes, skip oversized ones
 * with an error, never read past what it was sent, and report the
 * connection gone exactly once.
 *
 * Input: byte 0 = piece size (1..256), the rest = the stream.
 */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "fuzz_target.h"
#include "kvtier.h"
#include "local.h"
#include "log.h"

#define MAXMSG 512u

const char fuzz_target_name[] = "frame";

static struct local_srv *S;
static char path[108];
static unsigned added, removed, served;

static void handle(void *arg, uint32_t conn, const uint8_t *body, size_t len,
                   Kvtier__Response *rsp, void **scratch)
{
    (void)arg, (void)conn, (void)body;
    if (len > MAXMSG) abort(); /* the channel must not hand over a bigger body */
    kvtier__response__init(rsp);
    rsp->id = len;
    *scratch = NULL;
    served++;
}

static void free_rsp(Kvtier__Response *rsp, void *scratch)
{
    (void)rsp, (void)scratch;
}

static void on_conn(void *arg, uint32_t conn, int add)
{
    (void)arg, (void)conn;
    if (add) added++;
    else removed++;
}

static void setup(void)
{
    char err[256];
    log_set_level(LOG_ERROR);
    snprintf(path, sizeof path, "/tmp/kvt-fuzz-frame-%d.sock", (int)getpid());
    struct local_opts o = {path, 0600, NULL, MAXMSG, handle, free_rsp, on_conn, NULL, 4};
    if (local_open(&o, &S, err, sizeof err) != 0) {
        fprintf(stderr, "fuzz_frame: %s\n", err);
        abort();
    }
}

/* Read and check whole replies from buf; returns bytes consumed. */
static size_t check_replies(const uint8_t *buf, size_t len)
{
    size_t at = 0;
    while (len - at >= 4) {
        uint32_t n = buf[at] | buf[at + 1] << 8 | buf[at + 2] << 16 |
                     (uint32_t)buf[at + 3] << 24;
        if (n > len - at - 4) break;
        Kvtier__Response *r = kvtier__response__unpack(NULL, n, buf + at + 4);
        if (!r) abort(); /* every reply decodes */
        kvtier__response__free_unpacked(r, NULL);
        at += 4 + n;
    }
    return at;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!S) setup();
    if (size < 1) return 0;
    size_t piece = 1 + data[0], at = 1;
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    memcpy(a.sun_path, path, strlen(path) + 1);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0);
    if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a) != 0) abort();
    unsigned rm0 = removed;
    static uint8_t in[1 << 16];
    size_t have = 0;
    int shut = 0;
    for (int round = 0; round < 20000 && removed == rm0; round++) {
        if (at < size) {
            size_t n = size - at < piece ? size - at : piece;
            ssize_t w = send(fd, data + at, n, MSG_NOSIGNAL);
            if (w > 0) at += (size_t)w;
            else if (w < 0 && errno != EAGAIN) at = size; /* closed on us */
        } else if (!shut) {
            shutdown(fd, SHUT_WR);
            shut = 1;
        }
        local_poll(S);
        ssize_t r = recv(fd, in + have, sizeof in - have, 0);
        if (r > 0) {
            have += (size_t)r;
            size_t used = check_replies(in, have);
            memmove(in, in + used, have - used);
            have -= used;
        } else if (r == 0 && shut) {
            break; /* the server closed: the stream ended mid-frame or was refused */
        }
    }
    close(fd);
    for (int i = 0; i < 1000 && removed == rm0; i++) local_poll(S);
    if (removed != rm0 + 1) abort(); /* gone, reported once */
    return 0;
}

static void put_frame(uint8_t *b, size_t *n, const void *body, uint32_t len)
{
    memcpy(b + *n, &len, 4); /* little-endian hosts only, as the channel */
    if (body) memcpy(b + *n + 4, body, len);
    *n += 4 + (body ? len : 0);
}

void fuzz_target_seeds(void (*keep)(const uint8_t *b, size_t n))
{
    uint8_t b[4096];
    size_t n = 0;
    static const char body[] = "a request body";
    b[n++] = 255;
    put_frame(b, &n, body, sizeof body);
    put_frame(b, &n, body, 3);
    keep(b, n);
    b[0] = 0; /* one byte at a time */
    keep(b, n);
    n = 1;
    put_frame(b, &n, NULL, MAXMSG + 1); /* oversized, its bytes follow */
    memset(b + n, 'x', 600);
    n += 600;
    put_frame(b, &n, body, sizeof body);
    keep(b, n);
    n = 1;
    put_frame(b, &n, NULL, 0); /* empty body */
    put_frame(b, &n, NULL, 0xffffffffu);
    keep(b, n);
}

void fuzz_target_done(void)
{
    local_close(S);
    S = NULL;
}
