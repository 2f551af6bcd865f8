/*
 * evsub.c -- see evsub.h. The msgpack reader handles the types a KV-event
 * batch can hold (nil, bool, ints, float64, str, bin, array, map) and
 * fails on anything else or on a short buffer.
 */
#include "evsub.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "daemon.h"

/* -------------------------------------------------------------- reader */

struct cur {
    const uint8_t *p, *end;
    int err;
};

static uint64_t rd_be(struct cur *c, int n)
{
    uint64_t v = 0;
    if (c->end - c->p < n) {
        c->err = 1;
        return 0;
    }
    for (int i = 0; i < n; i++) v = v << 8 | *c->p++;
    return v;
}

static uint8_t peek(struct cur *c)
{
    if (c->p >= c->end) {
        c->err = 1;
        return 0xc1; /* never used by msgpack */
    }
    return *c->p;
}

/* Array (fix 0x90, 0xdc, 0xdd) or map (0x80, 0xde, 0xdf) length, or -1. */
static long rd_len(struct cur *c, uint8_t fix, uint8_t b16)
{
    uint8_t t = (uint8_t)rd_be(c, 1);
    if ((t & 0xf0) == fix) return t & 0x0f;
    if (t == b16) return (long)rd_be(c, 2);
    if (t == b16 + 1) return (long)rd_be(c, 4);
    c->err = 1;
    return -1;
}

static long rd_arr(struct cur *c) { return rd_len(c, 0x90, 0xdc); }
static long rd_map(struct cur *c) { return rd_len(c, 0x80, 0xde); }

/* Length of a str (want_bin 0) or bin (1) whose bytes follow, or -1. */
static long rd_blob_len(struct cur *c, int want_bin)
{
    uint8_t t = (uint8_t)rd_be(c, 1);
    long n = -1;
    if (!want_bin && (t & 0xe0) == 0xa0) n = t & 0x1f;
    else if (t == (want_bin ? 0xc4 : 0xd9)) n = (long)rd_be(c, 1);
    else if (t == (want_bin ? 0xc5 : 0xda)) n = (long)rd_be(c, 2);
    else if (t == (want_bin ? 0xc6 : 0xdb)) n = (long)rd_be(c, 4);
    if (n < 0 || c->end - c->p < n) {
        c->err = 1;
        return -1;
    }
    return n;
}

/* A str into out (NUL-terminated, cut at cap - 1). */
static void rd_str(struct cur *c, char *out, size_t cap)
{
    long n = rd_blob_len(c, 0);
    out[0] = '\0';
    if (n < 0) return;
    size_t k = (size_t)n < cap - 1 ? (size_t)n : cap - 1;
    memcpy(out, c->p, k);
    out[k] = '\0';
    c->p += n;
}

/* A 32-byte bin into k. */
static void rd_key(struct cur *c, kvt_key *k)
{
    long n = rd_blob_len(c, 1);
    if (n != KVT_KEY_LEN) {
        c->err = 1;
        return;
    }
    memcpy(k->b, c->p, KVT_KEY_LEN);
    c->p += n;
}

static uint64_t rd_uint(struct cur *c)
{
    uint8_t t = (uint8_t)rd_be(c, 1);
    if (t < 0x80) return t;
    if (t >= 0xcc && t <= 0xcf) return rd_be(c, 1 << (t - 0xcc));
    c->err = 1;
    return 0;
}

static double rd_f64(struct cur *c)
{
    if ((uint8_t)rd_be(c, 1) != 0xcb) c->err = 1;
    uint64_t u = rd_be(c, 8);
    double d;
    memcpy(&d, &u, sizeof d);
    return d;
}

static int rd_nil(struct cur *c)
{
    if (peek(c) != 0xc0) return 0;
    c->p++;
    return 1;
}

static void skip(struct cur *c, int depth);

static void skip_n(struct cur *c, long n, int depth)
{
    for (long i = 0; i < n && !c->err; i++) skip(c, depth + 1);
}

static void skip(struct cur *c, int depth)
{
    uint8_t t = peek(c);
    if (c->err || depth > 16) {
        c->err = 1;
        return;
    }
    if (t < 0x80 || t >= 0xe0 || t == 0xc0 || t == 0xc2 || t == 0xc3) c->p++;
    else if ((t & 0xf0) == 0x90 || t == 0xdc || t == 0xdd) skip_n(c, rd_arr(c), depth);
    else if ((t & 0xf0) == 0x80 || t == 0xde || t == 0xdf) skip_n(c, 2 * rd_map(c), depth);
    else if ((t & 0xe0) == 0xa0 || (t >= 0xd9 && t <= 0xdb)) c->p += rd_blob_len(c, 0);
    else if (t >= 0xc4 && t <= 0xc6) c->p += rd_blob_len(c, 1);
    else if (t >= 0xcc && t <= 0xd3) c->p += 1 + (1 << ((t - 0xcc) & 3));
    else if (t == 0xca || t == 0xcb) c->p += t == 0xca ? 5 : 9;
    else c->err = 1;
    if (c->p > c->end) c->err = 1;
}

/* ------------------------------------------------------------- records */

static struct evs_rec *add(struct evsub *s)
{
    if (s->n == s->cap) {
        s->cap = s->cap ? 2 * s->cap : 256;
        s->v = realloc(s->v, s->cap * sizeof *s->v);
        if (!s->v) abort();
    }
    struct evs_rec *r = &s->v[s->n++];
    memset(r, 0, sizeof *r);
    return r;
}

/* What one event says, before it becomes records. */
struct event {
    char type[32], medium[16];
    kvt_key hashes[512];
    long n_hashes;
    int has_parent, seen_parent, seen_tokens, seen_bs, seen_lora, seen_medium,
        seen_lora_name;
    kvt_key parent;
    uint64_t block_size;
};

static void rd_hashes(struct cur *c, struct event *ev)
{
    long n = rd_arr(c);
    if (n < 0 || n > 512) {
        c->err = 1;
        return;
    }
    ev->n_hashes = n;
    for (long i = 0; i < n && !c->err; i++) rd_key(c, &ev->hashes[i]);
}

static void rd_field(struct cur *c, struct event *ev, const char *k)
{
    if (!strcmp(k, "type")) rd_str(c, ev->type, sizeof ev->type);
    else if (!strcmp(k, "block_hashes")) rd_hashes(c, ev);
    else if (!strcmp(k, "parent_block_hash")) {
        ev->seen_parent = 1;
        if (!rd_nil(c)) rd_key(c, &ev->parent), ev->has_parent = 1;
    } else if (!strcmp(k, "medium")) {
        ev->seen_medium = 1;
        if (!rd_nil(c)) rd_str(c, ev->medium, sizeof ev->medium);
    } else if (!strcmp(k, "block_size")) {
        ev->seen_bs = 1;
        ev->block_size = rd_uint(c);
    } else {
        ev->seen_tokens |= !strcmp(k, "token_ids");
        ev->seen_lora |= !strcmp(k, "lora_id");
        ev->seen_lora_name |= !strcmp(k, "lora_name");
        skip(c, 2);
    }
}

/* 0 if the event has every field vLLM's struct requires. */
static int complete(const struct event *ev)
{
    if (!strcmp(ev->type, "AllBlocksCleared")) return 0;
    if (!strcmp(ev->type, "BlockRemoved")) return ev->seen_medium ? 0 : -1;
    if (strcmp(ev->type, "BlockStored") != 0) return -1;
    return ev->seen_parent && ev->seen_tokens && ev->seen_bs && ev->seen_lora &&
           ev->seen_medium && ev->seen_lora_name ? 0 : -1;
}

static void emit(struct evsub *s, const struct event *ev, uint64_t seq)
{
    int kind = !strcmp(ev->type, "BlockStored")    ? EVS_STORED
               : !strcmp(ev->type, "BlockRemoved") ? EVS_REMOVED
                                                   : EVS_CLEARED;
    for (long i = 0; i < (kind == EVS_CLEARED ? 1 : ev->n_hashes); i++) {
        struct evs_rec *r = add(s);
        r->seq = seq;
        r->kind = kind;
        snprintf(r->medium, sizeof r->medium, "%s", ev->medium);
        if (kind == EVS_CLEARED) break;
        r->key = ev->hashes[i];
        r->block_size = ev->block_size;
        r->has_parent = i > 0 || ev->has_parent;
        if (r->has_parent) r->parent = i > 0 ? ev->hashes[i - 1] : ev->parent;
    }
}

static int rd_event(struct cur *c, struct evsub *s, uint64_t seq)
{
    struct event *ev = calloc(1, sizeof *ev);
    char k[64];
    long n = rd_map(c);
    for (long i = 0; i < n && !c->err; i++) {
        rd_str(c, k, sizeof k);
        if (!c->err) rd_field(c, ev, k);
    }
    int rc = c->err || complete(ev) ? -1 : 0;
    if (rc == 0) emit(s, ev, seq);
    free(ev);
    return rc;
}

int evs_decode(struct evsub *s, uint64_t seq, const uint8_t *p, size_t n)
{
    struct cur c = {p, p + n, 0};
    size_t first = s->n;
    long top = rd_arr(&c);
    if (top < 2 || top > 3) return -1;
    rd_f64(&c);
    long ne = rd_arr(&c);
    for (long i = 0; i < ne && !c.err; i++)
        if (rd_event(&c, s, seq) != 0) c.err = 1;
    uint64_t dp = top == 3 && !rd_nil(&c) ? rd_uint(&c) : 0;
    if (c.err || c.p != c.end) return -1;
    for (size_t i = first; i < s->n; i++) s->v[i].dp_rank = dp;
    return 0;
}

/* ------------------------------------------------------------- sockets */

static int open_sub(struct evsub *s, const char *url, const char *topic, int bind)
{
    memset(s, 0, sizeof *s);
    snprintf(s->topic, sizeof s->topic, "%s", topic);
    s->ctx = zmq_ctx_new();
    s->sock = zmq_socket(s->ctx, ZMQ_SUB);
    int linger = 0;
    zmq_setsockopt(s->sock, ZMQ_LINGER, &linger, sizeof linger);
    if (zmq_setsockopt(s->sock, ZMQ_SUBSCRIBE, "", 0) != 0) return -1;
    return (bind ? zmq_bind(s->sock, url) : zmq_connect(s->sock, url)) == 0 ? 0 : -1;
}

int evs_open(struct evsub *s, const char *url, const char *topic)
{
    return open_sub(s, url, topic, 0);
}

int evs_open_bound(struct evsub *s, const char *url, const char *topic)
{
    return open_sub(s, url, topic, 1);
}

void evs_close(struct evsub *s)
{
    if (s->sock) zmq_close(s->sock);
    if (s->ctx) zmq_ctx_term(s->ctx);
    free(s->v);
    memset(s, 0, sizeof *s);
}

void evs_reset(struct evsub *s)
{
    s->n = 0;
}

/* Read the rest of a multipart message into frames (up to 8). */
static int recv_frames(void *sock, zmq_msg_t *f, int cap, int ms)
{
    zmq_pollitem_t it = {sock, 0, ZMQ_POLLIN, 0};
    if (zmq_poll(&it, 1, ms) <= 0) return 0;
    int n = 0, more = 1;
    while (more) {
        zmq_msg_t junk, *m = n < cap ? &f[n] : &junk;
        zmq_msg_init(m);
        if (zmq_msg_recv(m, sock, 0) < 0) return -1;
        more = zmq_msg_more(m);
        if (m == &junk) zmq_msg_close(m);
        n++;
    }
    return n;
}

static uint64_t be_of(const zmq_msg_t *m)
{
    const uint8_t *p = zmq_msg_data((zmq_msg_t *)m);
    uint64_t v = 0;
    for (size_t i = 0; i < zmq_msg_size((zmq_msg_t *)m) && i < 8; i++) v = v << 8 | p[i];
    return v;
}

/* One [topic, seq, payload] message, already received into f. */
static void take_msg(struct evsub *s, zmq_msg_t *f)
{
    uint64_t seq = be_of(&f[1]);
    if (zmq_msg_size(&f[0]) != strlen(s->topic) ||
        memcmp(zmq_msg_data(&f[0]), s->topic, strlen(s->topic)) != 0)
        s->bad_topic++;
    if (s->msgs && seq <= s->last_seq) s->bad_order++;
    if (zmq_msg_size(&f[1]) != 8 ||
        evs_decode(s, seq, zmq_msg_data(&f[2]), zmq_msg_size(&f[2])) != 0) {
        fprintf(stderr, "evsub: batch %llu does not decode\n", (unsigned long long)seq);
        s->bad_payload++;
    }
    s->last_seq = seq;
    s->msgs++;
}

/* Receive one message within ms; 1 if one came. */
static int recv_one(struct evsub *s, int ms)
{
    zmq_msg_t f[8];
    int n = recv_frames(s->sock, f, 8, ms);
    if (n <= 0) return 0;
    if (n == 3) take_msg(s, f);
    else s->bad_payload++;
    for (int i = 0; i < n && i < 8; i++) zmq_msg_close(&f[i]);
    return 1;
}

size_t evs_wait(struct evsub *s, size_t n, int ms)
{
    long long end = td_now_ms() + ms;
    while (s->n < n && td_now_ms() < end) recv_one(s, 50);
    return s->n;
}

size_t evs_drain(struct evsub *s, int ms)
{
    long long end = td_now_ms() + ms;
    while (td_now_ms() < end) recv_one(s, 20);
    return s->n;
}

/* Put and delete probe chunk `seed` in namespace "evsync". */
static kvt_err probe(kvt_client *c, uint64_t seed)
{
    kvt_key k = td_key(seed);
    const char body[] = "probe";
    const void *bufs[1] = {body};
    size_t sz = sizeof body;
    kvt_err e = kvt_put(c, "evsync", &k, bufs, &sz, 1, NULL, NULL);
    return e ? e : kvt_delete(c, "evsync", &k, 1, NULL);
}

int evs_sync(struct evsub *s, kvt_client *c)
{
    /* Until the subscription is live, messages are lost: probe until one
     * arrives. From then on they come in order, so once the removal of a
     * last marker probe is here, nothing older is still on its way. */
    for (int i = 0; i < 200 && s->msgs == 0; i++) {
        if (probe(c, 0x5e5e00 + (uint64_t)i) != KVT_OK) return -1;
        recv_one(s, 50);
    }
    kvt_key marker = td_key(0x5e5eff);
    if (s->msgs == 0 || probe(c, 0x5e5eff) != KVT_OK) return -1;
    long long end = td_now_ms() + 5000;
    while (evs_find(s, EVS_REMOVED, "CPU", &marker) < 0 && td_now_ms() < end)
        recv_one(s, 50);
    int ok = evs_find(s, EVS_REMOVED, "CPU", &marker) >= 0;
    evs_reset(s);
    return ok ? 0 : -1;
}

int evs_find(const struct evsub *s, int kind, const char *medium,
             const kvt_key *key)
{
    for (size_t i = 0; i < s->n; i++) {
        const struct evs_rec *r = &s->v[i];
        if (r->kind != kind || (medium && strcmp(r->medium, medium) != 0)) continue;
        if (!key || memcmp(r->key.b, key->b, KVT_KEY_LEN) == 0) return (int)i;
    }
    return -1;
}

size_t evs_count(const struct evsub *s, int kind, const char *medium)
{
    size_t n = 0;
    for (size_t i = 0; i < s->n; i++)
        n += s->v[i].kind == kind && (!medium || !strcmp(s->v[i].medium, medium));
    return n;
}

/* ------------------------------------------------------------- replay */

/* One reply [empty, topic, seq, payload]; 1 = a batch, 0 = the end
 * marker, -1 = bad framing or nothing within ms. */
static int replay_reply(struct evsub *out, void *sock, uint64_t *seq, int ms)
{
    zmq_msg_t f[8];
    int n = recv_frames(sock, f, 8, ms), rc = -1;
    if (n == 4 && zmq_msg_size(&f[0]) == 0 && zmq_msg_size(&f[2]) == 8) {
        *seq = be_of(&f[2]);
        if (*seq == UINT64_MAX) rc = zmq_msg_size(&f[3]) == 0 ? 0 : -1;
        else if (evs_decode(out, *seq, zmq_msg_data(&f[3]), zmq_msg_size(&f[3])) == 0)
            rc = 1;
    }
    for (int i = 0; i < n && i < 8; i++) zmq_msg_close(&f[i]);
    return rc;
}

int evs_replay(const char *url, uint64_t start, int junk_first,
               struct evsub *out, uint64_t *seqs, size_t cap, int ms)
{
    memset(out, 0, sizeof *out);
    void *ctx = zmq_ctx_new(), *sock = zmq_socket(ctx, ZMQ_DEALER);
    int linger = 0, got = -1;
    uint8_t req[8];
    for (int i = 0; i < 8; i++) req[i] = (uint8_t)(start >> (56 - 8 * i));
    zmq_setsockopt(sock, ZMQ_LINGER, &linger, sizeof linger);
    if (zmq_connect(sock, url) == 0 && (!junk_first || zmq_send(sock, "", 0, 0) == 0) &&
        zmq_send(sock, "", 0, ZMQ_SNDMORE) == 0 &&
        zmq_send(sock, req, 8, 0) == 8) {
        uint64_t seq;
        int rc;
        got = 0;
        while ((rc = replay_reply(out, sock, &seq, ms)) == 1)
            if ((size_t)got < cap) seqs[got++] = seq;
        if (rc < 0) got = -1;
    }
    zmq_close(sock);
    zmq_ctx_term(ctx);
    return got;
}
