/*
 * client.c -- libkvtier: connection, requests, and the mapped pool.
 *
 * Design: a kvt_client is one nng req0 socket dialled to one daemon, plus
 * the daemon's DRAM pool mapped MAP_SHARED when the pool file can be opened
 * (same host). Every call is one request/response exchange under the
 * client's lock; req0's automatic resend is switched off, because resending
 * a PUT_BEGIN would reserve space twice. Offsets the daemon returns are
 * checked against the mapping before they become pointers, so a confused
 * daemon cannot make the library write outside the pool.
 */
#include "client_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <nng/nng.h>
#include <nng/protocol/reqrep0/req.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "wire.h"

#define RAW_ID UINT64_MAX /* raw calls: any response id is theirs */

struct kvt_client {
    nng_socket sock;
    int open;
    pthread_mutex_t mtx; /* serialises requests on this client */
    uint64_t next_id;
    uint8_t *pool;
    uint64_t pool_bytes;
    uint64_t client_id;
    uint32_t max_keys;
    char last_err[256];
    char gpu[160];
};

static void set_err(kvt_client *c, const char *msg)
{
    snprintf(c->last_err, sizeof c->last_err, "%s", msg ? msg : "");
}

const char *kvt_last_error(const kvt_client *c)
{
    return c ? c->last_err : "no client";
}

int kvt_zero_copy(const kvt_client *c)
{
    return c && c->pool != NULL;
}

void kvt_set_timeout(kvt_client *c, int ms)
{
    nng_socket_set_ms(c->sock, NNG_OPT_RECVTIMEO, ms);
    nng_socket_set_ms(c->sock, NNG_OPT_SENDTIMEO, ms);
}

static kvt_err exchange(kvt_client *c, nng_msg *out, Kvtier__Response **rsp,
                        uint64_t id)
{
    int rv = nng_sendmsg(c->sock, out, 0);
    if (rv != 0) {
        nng_msg_free(out);
        set_err(c, nng_strerror(rv));
        return wire_nng_err(rv);
    }
    nng_msg *in;
    if ((rv = nng_recvmsg(c->sock, &in, 0)) != 0) {
        set_err(c, nng_strerror(rv));
        return wire_nng_err(rv);
    }
    *rsp = kvtier__response__unpack(NULL, nng_msg_len(in), nng_msg_body(in));
    nng_msg_free(in);
    if (!*rsp) {
        set_err(c, "undecodable response");
        return KVT_EPROTO;
    }
    if (id != RAW_ID && (*rsp)->id != id) {
        set_err(c, "response id does not match the request");
        kvtier__response__free_unpacked(*rsp, NULL);
        return KVT_EPROTO;
    }
    return KVT_OK;
}

kvt_err kvtc_call(kvt_client *c, Kvtier__Request *q, Kvtier__Response **rsp)
{
    nng_msg *out;
    pthread_mutex_lock(&c->mtx);
    q->id = ++c->next_id;
    int rv = wire_pack(&q->base, &out);
    kvt_err e = rv ? wire_nng_err(rv) : exchange(c, out, rsp, q->id);
    if (e == KVT_OK && (*rsp)->err != 0) {
        e = (kvt_err)(*rsp)->err;
        set_err(c, (*rsp)->msg);
        kvtier__response__free_unpacked(*rsp, NULL);
        *rsp = NULL;
    }
    pthread_mutex_unlock(&c->mtx);
    return e;
}

kvt_err kvtc_call_raw(kvt_client *c, const void *buf, size_t len,
                      Kvtier__Response **rsp)
{
    nng_msg *out;
    int rv = nng_msg_alloc(&out, len);
    if (rv != 0) return wire_nng_err(rv);
    memcpy(nng_msg_body(out), buf, len);
    pthread_mutex_lock(&c->mtx);
    kvt_err e = exchange(c, out, rsp, RAW_ID);
    pthread_mutex_unlock(&c->mtx);
    return e;
}

static void map_pool(kvt_client *c, const char *path, uint64_t bytes)
{
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0) return; /* remote or no permission: copying calls only */
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED) return;
    c->pool = p;
    c->pool_bytes = bytes;
}

/* Only ipc:// peers share our host; a tcp:// daemon is remote even when
 * its pool path happens to exist here. */
static kvt_err hello(kvt_client *c, int local)
{
    Kvtier__Request q = KVTIER__REQUEST__INIT;
    Kvtier__Hello h = KVTIER__HELLO__INIT;
    Kvtier__Response *r;
    h.proto_version = KVT_PROTO_VERSION;
    h.client_name = "libkvtier";
    h.pid = (uint32_t)getpid();
    q.body_case = KVTIER__REQUEST__BODY_HELLO;
    q.hello = &h;
    kvt_err e = kvtc_call(c, &q, &r);
    if (e != KVT_OK) return e;
    if (r->body_case != KVTIER__RESPONSE__BODY_HELLO) {
        kvtier__response__free_unpacked(r, NULL);
        return KVT_EPROTO;
    }
    c->client_id = r->hello->client_id;
    c->max_keys = r->hello->max_keys;
    snprintf(c->gpu, sizeof c->gpu, "%s", r->hello->gpu);
    if (local && r->hello->pool_path[0])
        map_pool(c, r->hello->pool_path, r->hello->pool_bytes);
    kvtier__response__free_unpacked(r, NULL);
    return KVT_OK;
}

static const char *default_url(const char *url, char *buf, size_t len)
{
    if (!url || !url[0]) url = getenv("KVTIER_SOCKET");
    if (!url || !url[0]) url = "./var/kvtierd.sock";
    if (strstr(url, "://")) return url;
    snprintf(buf, len, "ipc://%s", url);
    return buf;
}

kvt_err kvt_connect(const char *url, kvt_client **out)
{
    char buf[1100];
    if (!out) return KVT_EINVAL;
    kvt_client *c = calloc(1, sizeof *c);
    if (!c) return KVT_ENOMEM;
    pthread_mutex_init(&c->mtx, NULL);
    url = default_url(url, buf, sizeof buf);
    int rv = nng_req0_open(&c->sock);
    if (rv == 0) {
        c->open = 1;
        nng_socket_set_ms(c->sock, NNG_OPT_REQ_RESENDTIME, NNG_DURATION_INFINITE);
        nng_socket_set_size(c->sock, NNG_OPT_RECVMAXSZ, 0);
        kvt_set_timeout(c, 10000);
        rv = nng_dial(c->sock, url, NULL, 0);
    }
    kvt_err e = rv ? wire_nng_err(rv) : hello(c, strncmp(url, "ipc://", 6) == 0);
    if (e != KVT_OK) {
        kvt_close(c);
        return e;
    }
    *out = c;
    return KVT_OK;
}

void kvt_close(kvt_client *c)
{
    if (!c) return;
    if (c->open) nng_close(c->sock);
    if (c->pool) munmap(c->pool, c->pool_bytes);
    pthread_mutex_destroy(&c->mtx);
    free(c);
}

void *kvtc_pool_ptr(const kvt_client *c, uint64_t off, uint64_t size)
{
    if (!c->pool || off > c->pool_bytes || size > c->pool_bytes - off) return NULL;
    return c->pool + off;
}

const char *kvtc_gpu(const kvt_client *c)
{
    return c->gpu;
}
