/*
 * test_local_frame.c -- the fast channel's framing (local.c) in process:
 * a server on a temporary Unix socket, driven by local_poll from the test
 * thread, and a raw client socket. Frames are a 4-byte little-endian
 * length and a body; several in one write are served in order, one split
 * into single bytes is served once complete, one over max_msg_bytes gets
 * KVT_ETOOBIG and its bytes are skipped so the next frame is served; a
 * parked request holds the connection's later frames back until it is
 * answered; a closing client is reported once.
 */
#include <errno.h>
#include <poll.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cmocka.h>

#include "kvtier.h"
#include "local.h"
#include "log.h"

#define MAXMSG 1024

static struct local_srv *S;
static char path[108];
static int added, removed, park_next;
static struct local_later *parked;

/* The reply says which body it answers: id = its length, msg = its text. */
static void handle(void *arg, uint32_t conn, const uint8_t *body, size_t len,
                   Kvtier__Response *rsp, void **scratch)
{
    (void)arg, (void)conn;
    kvtier__response__init(rsp);
    char *m = calloc(1, len + 1);
    memcpy(m, body, len);
    rsp->id = len;
    rsp->msg = m;
    *scratch = m;
    if (park_next) {
        park_next = 0;
        parked = local_defer(S);
    }
}

static void free_rsp(Kvtier__Response *rsp, void *scratch)
{
    (void)rsp;
    free(scratch);
}

static void on_conn(void *arg, uint32_t conn, int add)
{
    (void)arg;
    assert_true(conn >= LOCAL_ID_BASE);
    *(add ? &added : &removed) += 1;
}

static int setup(void **state)
{
    (void)state;
    char err[256];
    log_set_level(LOG_ERROR);
    snprintf(path, sizeof path, "/tmp/kvt-frame-%d.sock", (int)getpid());
    struct local_opts o = {path, 0600, NULL, MAXMSG, handle, free_rsp, on_conn, NULL, 0};
    return local_open(&o, &S, err, sizeof err);
}

static int teardown(void **state)
{
    (void)state;
    local_close(S);
    return 0;
}

static int dial(void)
{
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    memcpy(a.sun_path, path, strlen(path) + 1);
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    for (int i = 0; i < 100 && !added; i++) local_poll(S);
    return fd;
}

static size_t frame(uint8_t *out, const char *body, uint32_t len)
{
    out[0] = (uint8_t)len, out[1] = (uint8_t)(len >> 8);
    out[2] = (uint8_t)(len >> 16), out[3] = (uint8_t)(len >> 24);
    if (body) memcpy(out + 4, body, strlen(body));
    return 4 + (body ? strlen(body) : 0);
}

/* Serve until a whole reply is readable on fd (bounded); 1 if it came. */
static int serve_until_reply(int fd)
{
    for (int i = 0; i < 2000; i++) {
        local_poll(S);
        struct pollfd p = {fd, POLLIN, 0};
        if (poll(&p, 1, 1) == 1) return 1;
    }
    return 0;
}

/* Read one reply (serving meanwhile); its id and msg. */
static uint64_t reply(int fd, char *msg, size_t cap)
{
    uint8_t buf[4096];
    size_t got = 0, need = 4;
    while (got < need) {
        assert_true(serve_until_reply(fd));
        ssize_t r = recv(fd, buf + got, need - got, 0);
        assert_true(r > 0);
        got += (size_t)r;
        if (got == 4 && need == 4)
            need = 4 + (buf[0] | buf[1] << 8 | buf[2] << 16 | (uint32_t)buf[3] << 24);
    }
    Kvtier__Response *r = kvtier__response__unpack(NULL, need - 4, buf + 4);
    assert_non_null(r);
    uint64_t id = r->id;
    snprintf(msg, cap, "%s", r->msg ? r->msg : "");
    if (r->err == KVT_ETOOBIG) id = UINT64_MAX;
    kvtier__response__free_unpacked(r, NULL);
    return id;
}

static void test_frames_in_one_write_and_split(void **state)
{
    (void)state;
    char m[256];
    uint8_t buf[256];
    int fd = dial();
    size_t n = frame(buf, "one", 3);
    n += frame(buf + n, "second", 6);
    assert_int_equal(send(fd, buf, n, 0), (ssize_t)n);
    assert_int_equal(reply(fd, m, sizeof m), 3);
    assert_string_equal(m, "one");
    assert_int_equal(reply(fd, m, sizeof m), 6);
    assert_string_equal(m, "second");
    n = frame(buf, "split up", 8);
    for (size_t i = 0; i < n; i++) { /* a byte at a time, served between */
        assert_int_equal(send(fd, buf + i, 1, 0), 1);
        local_poll(S);
    }
    assert_int_equal(reply(fd, m, sizeof m), 8);
    assert_string_equal(m, "split up");
    close(fd);
    for (int i = 0; i < 100 && removed < added; i++) local_poll(S);
    assert_int_equal(removed, added);
}

static void test_oversized_skipped_in_step(void **state)
{
    (void)state;
    char m[256];
    static uint8_t buf[MAXMSG * 3];
    int fd = dial();
    size_t n = frame(buf, NULL, MAXMSG * 2); /* over max_msg_bytes */
    memset(buf + n, 'x', MAXMSG * 2);
    n += MAXMSG * 2;
    n += frame(buf + n, "after", 5);
    size_t off = 0;
    while (off < n) { /* the socket buffer may take it in parts */
        ssize_t w = send(fd, buf + off, n - off, MSG_DONTWAIT);
        if (w > 0) off += (size_t)w;
        else assert_true(errno == EAGAIN || errno == EWOULDBLOCK);
        local_poll(S);
    }
    assert_int_equal(reply(fd, m, sizeof m), UINT64_MAX); /* KVT_ETOOBIG */
    assert_int_equal(reply(fd, m, sizeof m), 5);          /* still in step */
    assert_string_equal(m, "after");
    close(fd);
}

static void test_parked_holds_later_frames(void **state)
{
    (void)state;
    char m[256];
    uint8_t buf[64];
    int fd = dial();
    park_next = 1;
    size_t n = frame(buf, "wait", 4);
    n += frame(buf + n, "next", 4);
    assert_int_equal(send(fd, buf, n, 0), (ssize_t)n);
    for (int i = 0; i < 200 && !parked; i++) local_poll(S);
    assert_non_null(parked);
    for (int i = 0; i < 50; i++) local_poll(S);
    struct pollfd p = {fd, POLLIN, 0};
    assert_int_equal(poll(&p, 1, 0), 0); /* nothing answered meanwhile */
    Kvtier__Response rsp = KVTIER__RESPONSE__INIT;
    rsp.id = 99;
    rsp.msg = "late";
    local_reply_later(S, parked, &rsp);
    parked = NULL;
    assert_int_equal(reply(fd, m, sizeof m), 99);
    assert_string_equal(m, "late");
    assert_int_equal(reply(fd, m, sizeof m), 4); /* then the next one */
    assert_string_equal(m, "next");
    close(fd);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_frames_in_one_write_and_split),
        cmocka_unit_test(test_oversized_skipped_in_step),
        cmocka_unit_test(test_parked_holds_later_frames),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
