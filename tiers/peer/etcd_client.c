/*
 * etcd_client.c -- etcd v3 over its JSON gateway (etcd_client.h).
 *
 * Design: etcd 3.4 (Debian's etcd-server) answers POSTs of JSON on
 * /v3/lease/grant, /v3/lease/keepalive, /v3/lease/revoke, /v3/kv/put,
 * /v3/kv/range and /v3/watch, the last as a stream of one JSON object a
 * line; keys and values are base64, 64-bit numbers are strings. That is
 * enough for membership, so no gRPC client is needed: libcurl does HTTP
 * and a small tokenizer here reads the answers.
 *
 * The tokenizer (jparse) turns a bounded reply into a flat array of
 * tokens (object, array, string, primitive) with parent links, in one
 * pass without recursion; lookups walk that array. It validates enough
 * for what is read (strings closed, brackets matched, no control bytes)
 * and everything read is checked for type and size, so a hostile or
 * broken endpoint produces an error, not a crash or an unbounded
 * allocation. Replies are capped at EC_MAX_BODY, watch lines at
 * EC_MAX_LINE, token counts at EC_MAX_TOKENS.
 */
#include "etcd_client.h"

#include <curl/curl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define EC_MAX_TOKENS 65536
#define EC_URL_MAX 256

struct ec {
    CURL *h;
    char url[EC_MAX_URLS][EC_URL_MAX];
    int n_url, cur;
    long timeout_ms;
    char *body;   /* the reply being read */
    size_t len;
    int overflow; /* the reply passed EC_MAX_BODY */
};

static void seterr(char *err, size_t errlen, const char *fmt, ...)
{
    va_list ap;
    if (!err || !errlen) return;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

/* ------------------------------------------------------------- base64 */

static const char b64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

size_t ec_b64_encode(const void *in, size_t len, char *out)
{
    const uint8_t *p = in;
    size_t o = 0;
    for (size_t i = 0; i < len; i += 3) {
        uint32_t v = (uint32_t)p[i] << 16;
        if (i + 1 < len) v |= (uint32_t)p[i + 1] << 8;
        if (i + 2 < len) v |= p[i + 2];
        out[o++] = b64[v >> 18 & 63];
        out[o++] = b64[v >> 12 & 63];
        out[o++] = i + 1 < len ? b64[v >> 6 & 63] : '=';
        out[o++] = i + 2 < len ? b64[v & 63] : '=';
    }
    out[o] = 0;
    return o;
}

static int b64_val(char c)
{
    const char *p = c ? strchr(b64, c) : NULL;
    return p ? (int)(p - b64) : -1;
}

long ec_b64_decode(const char *in, size_t len, uint8_t *out, size_t cap)
{
    size_t o = 0;
    if (len % 4) return -1;
    for (size_t i = 0; i < len; i += 4) {
        int v[4], pad = 0;
        for (int j = 0; j < 4; j++) {
            if (in[i + j] == '=' && i + 4 == len && j >= 2) {
                v[j] = 0, pad++;
                continue;
            }
            if (pad || (v[j] = b64_val(in[i + j])) < 0) return -1;
        }
        uint32_t x = (uint32_t)v[0] << 18 | (uint32_t)v[1] << 12 | (uint32_t)v[2] << 6 | v[3];
        for (int j = 0; j < 3 - pad; j++) {
            if (o == cap) return -1;
            out[o++] = (uint8_t)(x >> (16 - 8 * j));
        }
    }
    return (long)o;
}

/* ---------------------------------------------------------- tokenizer */

enum { JT_OBJ = 1, JT_ARR, JT_STR, JT_PRIM };

struct jt {
    uint8_t type, key; /* key: a string naming an object member */
    int start, end;    /* [start, end) in the text; strings without quotes */
    int parent, size;  /* size: children so far */
};

struct jdoc {
    const char *s;
    struct jt *t;
    int n;
};

static int jadd(struct jdoc *d, int max, int type, int start, int parent)
{
    if (d->n == max) return -1;
    struct jt *t = &d->t[d->n];
    t->type = (uint8_t)type;
    t->start = start;
    t->end = -1;
    t->parent = parent;
    t->size = 0;
    t->key = 0;
    if (parent >= 0) {
        struct jt *p = &d->t[parent];
        t->key = p->type == JT_OBJ && p->size % 2 == 0;
        if (p->type == JT_OBJ && p->size % 2 == 0 && type != JT_STR) return -1;
        p->size++;
    } else if (d->n) {
        return -1; /* one value at top level */
    }
    return d->n++;
}

static int jstring(const char *s, int len, int i)
{
    for (i++; i < len; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"') return i;
        if (c < 0x20) return -1;
        if (c == '\\' && ++i >= len) return -1;
    }
    return -1;
}

/* Tokens of s[0..len), or -1. */
static int jparse(struct jdoc *d, const char *s, int len, int max)
{
    int sup = -1;
    d->s = s;
    d->n = 0;
    for (int i = 0; i < len; i++) {
        char c = s[i];
        int k;
        switch (c) {
        case '{': case '[':
            if ((k = jadd(d, max, c == '{' ? JT_OBJ : JT_ARR, i, sup)) < 0) return -1;
            sup = k;
            break;
        case '}': case ']':
            if (sup < 0 || d->t[sup].type != (c == '}' ? JT_OBJ : JT_ARR)) return -1;
            if (c == '}' && d->t[sup].size % 2) return -1;
            d->t[sup].end = i + 1;
            sup = d->t[sup].parent;
            break;
        case '"': {
            int e = jstring(s, len, i);
            if (e < 0 || (k = jadd(d, max, JT_STR, i + 1, sup)) < 0) return -1;
            d->t[k].end = e;
            i = e;
            break;
        }
        case ' ': case '\t': case '\r': case '\n': case ':': case ',':
            break;
        default: {
            int e = i;
            while (e < len && (s[e] == '-' || s[e] == '+' || s[e] == '.' ||
                               (s[e] >= '0' && s[e] <= '9') || (s[e] >= 'a' && s[e] <= 'z') ||
                               s[e] == 'E'))
                e++;
            if (e == i || (k = jadd(d, max, JT_PRIM, i, sup)) < 0) return -1;
            d->t[k].end = e;
            i = e - 1;
        }
        }
    }
    return sup == -1 && d->n > 0 && d->t[0].end > 0 ? d->n : -1;
}

/* The value of member `name` of object o, or -1. */
static int jget(const struct jdoc *d, int o, const char *name)
{
    if (o < 0 || d->t[o].type != JT_OBJ) return -1;
    size_t nl = strlen(name);
    for (int j = o + 1; j + 1 < d->n && d->t[j].start < d->t[o].end; j++) {
        const struct jt *t = &d->t[j];
        if (t->parent != o || !t->key) continue;
        if ((size_t)(t->end - t->start) == nl && !memcmp(d->s + t->start, name, nl))
            return j + 1;
    }
    return -1;
}

/* The next child of container c after token j (j = c for the first). */
static int jnext(const struct jdoc *d, int c, int j)
{
    for (j++; j < d->n && d->t[j].start < d->t[c].end; j++)
        if (d->t[j].parent == c) return j;
    return -1;
}

/* A 64-bit integer, as a number or a string of digits; def if absent. */
static int jint(const struct jdoc *d, int j, int64_t def, int64_t *out)
{
    *out = def;
    if (j < 0) return 0;
    const struct jt *t = &d->t[j];
    if (t->type != JT_STR && t->type != JT_PRIM) return -1;
    int i = t->start, neg = 0;
    uint64_t v = 0;
    if (i < t->end && d->s[i] == '-') neg = 1, i++;
    if (i == t->end || t->end - i > 19) return -1;
    for (; i < t->end; i++) {
        if (d->s[i] < '0' || d->s[i] > '9') return -1;
        v = v * 10 + (uint64_t)(d->s[i] - '0');
    }
    if (v > INT64_MAX) return -1;
    *out = neg ? -(int64_t)v : (int64_t)v;
    return 0;
}

static int jis(const struct jdoc *d, int j, const char *lit)
{
    size_t n = strlen(lit);
    return j >= 0 && (size_t)(d->t[j].end - d->t[j].start) == n &&
           !memcmp(d->s + d->t[j].start, lit, n);
}

/* base64 string token j into out (cap); -1 if not one. */
static long jb64(const struct jdoc *d, int j, uint8_t *out, size_t cap)
{
    if (j < 0) return 0; /* absent: empty (etcd leaves empty values out) */
    if (d->t[j].type != JT_STR) return -1;
    return ec_b64_decode(d->s + d->t[j].start, (size_t)(d->t[j].end - d->t[j].start), out, cap);
}

static int parse_doc(struct jdoc *d, const char *json, size_t len)
{
    if (len > EC_MAX_BODY) return -1;
    int max = (int)(len / 2 + 2 < EC_MAX_TOKENS ? len / 2 + 2 : EC_MAX_TOKENS);
    if (!(d->t = malloc((size_t)max * sizeof *d->t))) return -1;
    if (jparse(d, json, (int)len, max) < 0) {
        free(d->t);
        d->t = NULL;
        return -1;
    }
    return 0;
}

/* One mvccpb.KeyValue object: fn(key, value). */
static int emit_kv(const struct jdoc *d, int kv, int deleted, ec_kv_fn fn, void *arg)
{
    uint8_t key[EC_MAX_KEY], val[EC_MAX_VALUE];
    int64_t mod;
    if (kv < 0 || d->t[kv].type != JT_OBJ) return -1;
    long kl = jb64(d, jget(d, kv, "key"), key, sizeof key);
    long vl = jb64(d, jget(d, kv, "value"), val, sizeof val);
    if (kl <= 0 || vl < 0 || jint(d, jget(d, kv, "mod_revision"), 0, &mod) < 0) return -1;
    fn(arg, key, (size_t)kl, val, deleted ? 0 : (size_t)vl, deleted, mod);
    return 0;
}

static int header_rev(const struct jdoc *d, int o, int64_t *rev)
{
    int h = jget(d, o, "header");
    return h >= 0 ? jint(d, jget(d, h, "revision"), 0, rev) : -1;
}

int ec_parse_range(const char *json, size_t len, ec_kv_fn fn, void *arg, int64_t *rev)
{
    struct jdoc d;
    int rc = -1;
    if (parse_doc(&d, json, len) < 0) return -1;
    int kvs = jget(&d, 0, "kvs");
    if (header_rev(&d, 0, rev) < 0 || (kvs >= 0 && d.t[kvs].type != JT_ARR)) goto out;
    for (int j = kvs >= 0 ? jnext(&d, kvs, kvs) : -1; j >= 0; j = jnext(&d, kvs, j))
        if (emit_kv(&d, j, 0, fn, arg) < 0) goto out;
    rc = 0;
out:
    free(d.t);
    return rc;
}

int ec_parse_watch(const char *json, size_t len, ec_kv_fn fn, void *arg, int64_t *rev,
                   int *compacted)
{
    struct jdoc d;
    int rc = -1;
    int64_t comp;
    *compacted = 0;
    if (parse_doc(&d, json, len) < 0) return -1;
    int r = jget(&d, 0, "result");
    if (r < 0 || header_rev(&d, r, rev) < 0) goto out; /* an error object, or no header */
    if (jint(&d, jget(&d, r, "compact_revision"), 0, &comp) < 0) goto out;
    *compacted = comp > 0 || jis(&d, jget(&d, r, "canceled"), "true");
    int ev = jget(&d, r, "events");
    if (ev >= 0 && d.t[ev].type != JT_ARR) goto out;
    for (int j = ev >= 0 ? jnext(&d, ev, ev) : -1; j >= 0; j = jnext(&d, ev, j)) {
        int type = jget(&d, j, "type");
        if (type >= 0 && !jis(&d, type, "PUT") && !jis(&d, type, "DELETE")) goto out;
        if (emit_kv(&d, jget(&d, j, "kv"), jis(&d, type, "DELETE"), fn, arg) < 0) goto out;
    }
    rc = 0;
out:
    free(d.t);
    return rc;
}

/* ---------------------------------------------------------------- HTTP */

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;

static void curl_init(void)
{
    curl_global_init(CURL_GLOBAL_DEFAULT);
}

static size_t on_body(char *p, size_t sz, size_t n, void *arg)
{
    struct ec *ec = arg;
    size_t len = sz * n;
    if (ec->len + len > EC_MAX_BODY) {
        ec->overflow = 1;
        return 0; /* curl fails the transfer */
    }
    char *b = realloc(ec->body, ec->len + len + 1);
    if (!b) return 0;
    ec->body = b;
    memcpy(b + ec->len, p, len);
    ec->len += len;
    b[ec->len] = 0;
    return len;
}

struct ec *ec_new(const char *endpoints, long timeout_ms, char *err, size_t errlen)
{
    pthread_once(&curl_once, curl_init);
    struct ec *ec = calloc(1, sizeof *ec);
    char buf[EC_MAX_URLS * EC_URL_MAX], *save = NULL;
    if (!ec) abort(); /* control-plane allocation */
    snprintf(buf, sizeof buf, "%s", endpoints ? endpoints : "");
    for (char *s = strtok_r(buf, ", ", &save); s; s = strtok_r(NULL, ", ", &save)) {
        if (ec->n_url == EC_MAX_URLS || strncmp(s, "http://", 7) || strlen(s) < 8 ||
            strlen(s) >= EC_URL_MAX - 32) {
            seterr(err, errlen, "etcd endpoint '%s': want at most %d http://host:port", s,
                   EC_MAX_URLS);
            free(ec);
            return NULL;
        }
        snprintf(ec->url[ec->n_url++], EC_URL_MAX, "%s", s);
    }
    if (!ec->n_url || !(ec->h = curl_easy_init())) {
        seterr(err, errlen, ec->n_url ? "curl_easy_init failed" : "no etcd endpoint");
        free(ec);
        return NULL;
    }
    ec->timeout_ms = timeout_ms;
    return ec;
}

void ec_free(struct ec *ec)
{
    if (!ec) return;
    if (ec->h) curl_easy_cleanup(ec->h);
    free(ec->body);
    free(ec);
}

const char *ec_url(const struct ec *ec)
{
    return ec->url[ec->cur];
}

static void setup(CURL *h, const char *url, const char *body, struct curl_slist *hd)
{
    curl_easy_reset(h);
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_POST, 1L);
    curl_easy_setopt(h, CURLOPT_POSTFIELDS, body);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, hd);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http");
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, 1000L);
}

/* An error reply ({"error": ..., "code": N}) as a sentence; 0 if none. */
static int reply_error(const char *body, size_t len, char *err, size_t errlen)
{
    struct jdoc d;
    if (parse_doc(&d, body, len) < 0) {
        seterr(err, errlen, "reply is not JSON");
        return -1;
    }
    int e = jget(&d, 0, "error"), rc = 0;
    if (e >= 0 && d.t[e].type == JT_STR) {
        int l = d.t[e].end - d.t[e].start;
        seterr(err, errlen, "etcd: %.*s", l > 200 ? 200 : l, body + d.t[e].start);
        rc = -1;
    }
    free(d.t);
    return rc;
}

/* POST body to path; on success ec->body holds the reply (JSON object,
 * not an error). Tries each endpoint once, from the one last used. */
static int call(struct ec *ec, const char *path, const char *body, char *err, size_t errlen)
{
    char url[EC_URL_MAX + 64];
    struct curl_slist *hd = curl_slist_append(NULL, "Content-Type: application/json");
    int rc = -1;
    for (int tries = 0; tries < ec->n_url && rc < 0; tries++) {
        if (tries) ec->cur = (ec->cur + 1) % ec->n_url;
        snprintf(url, sizeof url, "%s%s", ec->url[ec->cur], path);
        setup(ec->h, url, body, hd);
        curl_easy_setopt(ec->h, CURLOPT_TIMEOUT_MS, ec->timeout_ms);
        curl_easy_setopt(ec->h, CURLOPT_WRITEFUNCTION, on_body);
        curl_easy_setopt(ec->h, CURLOPT_WRITEDATA, ec);
        ec->len = 0;
        ec->overflow = 0;
        CURLcode cc = curl_easy_perform(ec->h);
        long status = 0;
        curl_easy_getinfo(ec->h, CURLINFO_RESPONSE_CODE, &status);
        if (cc != CURLE_OK) {
            seterr(err, errlen, "%s: %s", url,
                   ec->overflow ? "reply too large" : curl_easy_strerror(cc));
        } else if (!ec->body || !ec->len) {
            seterr(err, errlen, "%s: empty reply (HTTP %ld)", url, status);
        } else if (reply_error(ec->body, ec->len, err, errlen) == 0 && status == 200) {
            rc = 0;
        } else if (status != 200 && reply_error(ec->body, ec->len, err, errlen) == 0) {
            seterr(err, errlen, "%s: HTTP %ld", url, status);
        } else {
            break; /* etcd answered with an error: another endpoint would too */
        }
    }
    curl_slist_free_all(hd);
    return rc;
}

/* Field `name` of the reply's top object as an integer. */
static int reply_int(struct ec *ec, const char *name, int64_t def, int64_t *out, char *err,
                     size_t errlen)
{
    struct jdoc d;
    int rc = -1;
    if (parse_doc(&d, ec->body, ec->len) == 0) {
        int o = 0;
        if (jget(&d, 0, "result") >= 0) o = jget(&d, 0, "result"); /* keepalive */
        rc = jint(&d, jget(&d, o, name), def, out);
        free(d.t);
    }
    if (rc < 0) seterr(err, errlen, "etcd reply: no valid '%s'", name);
    return rc;
}

int ec_grant(struct ec *ec, uint32_t ttl_s, int64_t *lease, char *err, size_t errlen)
{
    char body[64];
    snprintf(body, sizeof body, "{\"TTL\":%u}", (unsigned)ttl_s);
    if (call(ec, "/v3/lease/grant", body, err, errlen) < 0) return -1;
    if (reply_int(ec, "ID", 0, lease, err, errlen) < 0) return -1;
    if (*lease <= 0) {
        seterr(err, errlen, "etcd granted no lease");
        return -1;
    }
    return 0;
}

int ec_keepalive(struct ec *ec, int64_t lease, int64_t *ttl_s, char *err, size_t errlen)
{
    char body[64];
    snprintf(body, sizeof body, "{\"ID\":%" PRId64 "}", lease);
    if (call(ec, "/v3/lease/keepalive", body, err, errlen) < 0) return -1;
    if (reply_int(ec, "TTL", 0, ttl_s, err, errlen) < 0) return -1;
    if (*ttl_s < 0) *ttl_s = 0;
    return 0;
}

int ec_revoke(struct ec *ec, int64_t lease, char *err, size_t errlen)
{
    char body[64];
    snprintf(body, sizeof body, "{\"ID\":%" PRId64 "}", lease);
    return call(ec, "/v3/lease/revoke", body, err, errlen);
}

int ec_put(struct ec *ec, const char *key, const void *val, size_t vlen, int64_t lease,
           int64_t *rev, char *err, size_t errlen)
{
    size_t kl = strlen(key);
    if (kl == 0 || kl > EC_MAX_KEY || vlen > EC_MAX_VALUE) {
        seterr(err, errlen, "key or value too long");
        return -1;
    }
    char kb[EC_MAX_KEY * 2], vb[EC_MAX_VALUE * 2], body[EC_MAX_KEY * 2 + EC_MAX_VALUE * 2 + 96];
    ec_b64_encode(key, kl, kb);
    ec_b64_encode(val, vlen, vb);
    snprintf(body, sizeof body, "{\"key\":\"%s\",\"value\":\"%s\",\"lease\":%" PRId64 "}", kb,
             vb, lease);
    if (call(ec, "/v3/kv/put", body, err, errlen) < 0) return -1;
    struct jdoc d;
    int rc = parse_doc(&d, ec->body, ec->len);
    if (rc == 0) {
        rc = header_rev(&d, 0, rev);
        free(d.t);
    }
    if (rc < 0) seterr(err, errlen, "etcd put: reply has no revision");
    return rc;
}

/* The key just after every key that starts with prefix. */
static void prefix_end(const char *prefix, char *kb, char *eb)
{
    uint8_t e[EC_MAX_KEY];
    size_t n = strlen(prefix);
    memcpy(e, prefix, n);
    while (n && e[n - 1] == 0xff) n--;
    if (n) e[n - 1]++;
    ec_b64_encode(prefix, strlen(prefix), kb);
    if (n) ec_b64_encode(e, n, eb);
    else snprintf(eb, 8, "AA=="); /* "\0": every key */
}

int ec_range_prefix(struct ec *ec, const char *prefix, ec_kv_fn fn, void *arg, int64_t *rev,
                    char *err, size_t errlen)
{
    char kb[EC_MAX_KEY * 2], eb[EC_MAX_KEY * 2], body[EC_MAX_KEY * 4 + 64];
    if (!*prefix || strlen(prefix) > EC_MAX_KEY) {
        seterr(err, errlen, "bad prefix");
        return -1;
    }
    prefix_end(prefix, kb, eb);
    snprintf(body, sizeof body, "{\"key\":\"%s\",\"range_end\":\"%s\"}", kb, eb);
    if (call(ec, "/v3/kv/range", body, err, errlen) < 0) return -1;
    if (ec_parse_range(ec->body, ec->len, fn, arg, rev) < 0) {
        seterr(err, errlen, "etcd range: malformed reply");
        return -1;
    }
    return 0;
}

/* --------------------------------------------------------------- watch */

struct ec_watch {
    CURLM *m;
    CURL *h;
    struct curl_slist *hd;
    char body[EC_MAX_KEY * 4 + 128];
    char *line; /* the message being received */
    size_t len;
    int bad;    /* a line too long or malformed */
    int compacted;
    int64_t rev;
    ec_kv_fn fn;
    void *arg;
};

static int watch_line(struct ec_watch *w)
{
    int64_t rev = 0;
    int comp = 0;
    size_t n = w->len;
    while (n && (w->line[n - 1] == '\r' || w->line[n - 1] == ' ')) n--;
    if (!n) return 0;
    if (ec_parse_watch(w->line, n, w->fn, w->arg, &rev, &comp) < 0) return -1;
    if (comp) w->compacted = 1;
    if (rev > w->rev) w->rev = rev;
    return comp ? -1 : 0;
}

static size_t on_watch(char *p, size_t sz, size_t n, void *arg)
{
    struct ec_watch *w = arg;
    size_t len = sz * n;
    for (size_t i = 0; i < len; i++) {
        if (p[i] == '\n') {
            if (watch_line(w) < 0) {
                w->bad = 1;
                return 0;
            }
            w->len = 0;
            continue;
        }
        if (w->len == EC_MAX_LINE) {
            w->bad = 1;
            return 0;
        }
        w->line[w->len++] = p[i];
    }
    return len;
}

struct ec_watch *ec_watch_open(struct ec *ec, const char *prefix, int64_t from_rev,
                               ec_kv_fn fn, void *arg, char *err, size_t errlen)
{
    char kb[EC_MAX_KEY * 2], eb[EC_MAX_KEY * 2], url[EC_URL_MAX + 16];
    if (!*prefix || strlen(prefix) > EC_MAX_KEY) {
        seterr(err, errlen, "bad prefix");
        return NULL;
    }
    struct ec_watch *w = calloc(1, sizeof *w);
    if (!w || !(w->line = malloc(EC_MAX_LINE))) abort(); /* control-plane allocation */
    prefix_end(prefix, kb, eb);
    snprintf(w->body, sizeof w->body,
             "{\"create_request\":{\"key\":\"%s\",\"range_end\":\"%s\","
             "\"start_revision\":%" PRId64 "}}",
             kb, eb, from_rev);
    w->fn = fn;
    w->arg = arg;
    w->rev = from_rev - 1;
    w->hd = curl_slist_append(NULL, "Content-Type: application/json");
    w->m = curl_multi_init();
    w->h = curl_easy_init();
    if (!w->m || !w->h) {
        seterr(err, errlen, "curl init failed");
        ec_watch_close(w);
        return NULL;
    }
    snprintf(url, sizeof url, "%s/v3/watch", ec_url(ec));
    setup(w->h, url, w->body, w->hd);
    curl_easy_setopt(w->h, CURLOPT_WRITEFUNCTION, on_watch);
    curl_easy_setopt(w->h, CURLOPT_WRITEDATA, w);
    curl_multi_add_handle(w->m, w->h);
    return w;
}

static long mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int ec_watch_run(struct ec_watch *w, const volatile int *stop, long every_ms, char *err,
                 size_t errlen)
{
    long t0 = mono_ms();
    while (!*stop) {
        int running = 0, left;
        curl_multi_perform(w->m, &running);
        CURLMsg *msg = curl_multi_info_read(w->m, &left);
        if (msg && msg->msg == CURLMSG_DONE) {
            seterr(err, errlen, "watch ended: %s",
                   w->compacted ? "history compacted"
                   : w->bad     ? "malformed or oversized message"
                                : curl_easy_strerror(msg->data.result));
            return -1;
        }
        if (!running) {
            seterr(err, errlen, "watch ended");
            return -1;
        }
        long wait = every_ms > 0 ? every_ms - (mono_ms() - t0) : 60000;
        if (wait <= 0) return 1;
        if (*stop) break;
        curl_multi_poll(w->m, NULL, 0, (int)(wait < 60000 ? wait : 60000), NULL);
    }
    return 0;
}

void ec_watch_wakeup(struct ec_watch *w)
{
    curl_multi_wakeup(w->m);
}

int64_t ec_watch_rev(const struct ec_watch *w)
{
    return w->rev;
}

void ec_watch_close(struct ec_watch *w)
{
    if (!w) return;
    if (w->m && w->h) curl_multi_remove_handle(w->m, w->h);
    if (w->h) curl_easy_cleanup(w->h);
    if (w->m) curl_multi_cleanup(w->m);
    curl_slist_free_all(w->hd);
    free(w->line);
    free(w);
}
