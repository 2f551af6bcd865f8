/*
 * journal.c -- see journal.h.
 *
 * File: a 32-byte header (magic, pool bytes, XXH3 of the pool path,
 * creation time), then records: u32 payload length, u32 low half of the
 * payload's XXH3-64, payload. Payloads: NS (1, u16 id, u8 len, name),
 * ADD (2, u16 ns, key, u64 off, u32 size, u64 csum, u8 has_parent,
 * parent), DEL (3, u16 ns, key). Namespace ids are the writing daemon's;
 * a replay maps them back to names through the NS records.
 */
#include "journal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#include "log.h"

#define J_MAGIC "KVTJRNL1"
#define J_HDR 32
#define J_NS_MAX 4096
enum { R_NS = 1, R_ADD = 2, R_DEL = 3 };

struct journal {
    char *path;
    int fd;
    uint64_t pool_bytes, path_hash, size;
    uint8_t *buf;
    size_t n, cap;
    uint8_t logged[J_NS_MAX / 8]; /* ns ids whose NS record is in the file */
    char *names[J_NS_MAX];        /* replay: ns id -> name */
    int write_failed;
};

static void hdr_encode(const struct journal *j, uint8_t *h)
{
    uint64_t now = (uint64_t)time(NULL);
    memset(h, 0, J_HDR);
    memcpy(h, J_MAGIC, 8);
    memcpy(h + 8, &j->pool_bytes, 8);
    memcpy(h + 16, &j->path_hash, 8);
    memcpy(h + 24, &now, 8);
}

int journal_open(const char *path, uint64_t pool_bytes, const char *pool_path,
                 struct journal **out, char *err, size_t errlen)
{
    struct journal *j = calloc(1, sizeof *j);
    if (!j || !(j->path = strdup(path))) abort(); /* start-up allocation */
    j->pool_bytes = pool_bytes;
    j->path_hash = XXH3_64bits(pool_path, strlen(pool_path));
    j->fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (j->fd < 0) {
        snprintf(err, errlen, "journal %s: %s", path, strerror(errno));
        journal_close(j);
        return -1;
    }
    *out = j;
    return 0;
}

/* ------------------------------------------------------------- writing */

static uint8_t *room(struct journal *j, size_t more)
{
    if (j->n + more > j->cap) {
        size_t ncap = j->cap ? j->cap * 2 : 65536;
        while (ncap < j->n + more) ncap *= 2;
        uint8_t *nb = realloc(j->buf, ncap);
        if (!nb) abort(); /* control-plane allocation */
        j->buf = nb;
        j->cap = ncap;
    }
    return j->buf + j->n;
}

/* Frame the payload just written at buf[n+8 .. n+8+len). */
static void frame(struct journal *j, uint32_t len)
{
    uint8_t *p = j->buf + j->n;
    uint32_t crc = (uint32_t)XXH3_64bits(p + 8, len);
    memcpy(p, &len, 4);
    memcpy(p + 4, &crc, 4);
    j->n += 8 + len;
}

static void put_ns(struct journal *j, uint16_t id, const char *ns)
{
    if (id >= J_NS_MAX || (j->logged[id / 8] & (1u << (id % 8)))) return;
    size_t len = strnlen(ns, 255);
    uint8_t *p = room(j, 8 + 4 + len) + 8;
    p[0] = R_NS;
    memcpy(p + 1, &id, 2);
    p[3] = (uint8_t)len;
    memcpy(p + 4, ns, len);
    frame(j, (uint32_t)(4 + len));
    j->logged[id / 8] |= (uint8_t)(1u << (id % 8));
}

void journal_forget_ns(struct journal *j, uint16_t ns_id)
{
    if (ns_id < J_NS_MAX) j->logged[ns_id / 8] &= (uint8_t)~(1u << (ns_id % 8));
}

void journal_add(struct journal *j, uint16_t ns_id, const char *ns,
                 const struct jrec *r)
{
    put_ns(j, ns_id, ns);
    uint8_t *p = room(j, 8 + 88) + 8, hp = r->has_parent ? 1 : 0;
    p[0] = R_ADD;
    memcpy(p + 1, &ns_id, 2);
    memcpy(p + 3, r->key.b, KVT_KEY_LEN);
    memcpy(p + 35, &r->off, 8);
    memcpy(p + 43, &r->size, 4);
    memcpy(p + 47, &r->csum, 8);
    p[55] = hp;
    memcpy(p + 56, hp ? r->parent.b : r->key.b, KVT_KEY_LEN);
    frame(j, 88);
}

void journal_del(struct journal *j, uint16_t ns_id, const char *ns,
                 const kvt_key *key)
{
    put_ns(j, ns_id, ns);
    uint8_t *p = room(j, 8 + 35) + 8;
    p[0] = R_DEL;
    memcpy(p + 1, &ns_id, 2);
    memcpy(p + 3, key->b, KVT_KEY_LEN);
    frame(j, 35);
}

static int write_all(int fd, const uint8_t *p, size_t n)
{
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return -1;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

int journal_flush(struct journal *j)
{
    if (!j || j->n == 0) return 0;
    int rv = write_all(j->fd, j->buf, j->n);
    if (rv == 0) j->size += j->n;
    else if (!j->write_failed++)
        log_error("journal", "%s: %s: chunks committed from now on may not be "
                  "adopted after a restart", j->path, strerror(errno));
    j->n = 0;
    return rv;
}

uint64_t journal_size(const struct journal *j)
{
    return j->size + j->n;
}

int journal_snapshot(struct journal *j, size_t n,
                     void (*next)(void *arg, size_t i, uint16_t *ns_id,
                                  struct jrec *r),
                     void *arg)
{
    char tmp[4096];
    struct jrec r;
    uint16_t id;
    snprintf(tmp, sizeof tmp, "%s.tmp", j->path);
    int fd = open(tmp, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) goto fail;
    j->n = 0;
    memset(j->logged, 0, sizeof j->logged);
    hdr_encode(j, room(j, J_HDR));
    j->n = J_HDR;
    for (size_t i = 0; i < n; i++) {
        next(arg, i, &id, &r);
        journal_add(j, id, r.ns, &r);
    }
    if (write_all(fd, j->buf, j->n) != 0 || rename(tmp, j->path) != 0) goto fail;
    close(j->fd);
    j->fd = fd;
    j->size = j->n;
    j->n = 0;
    return 0;
fail:
    log_error("journal", "snapshot %s: %s", tmp, strerror(errno));
    if (fd >= 0) close(fd);
    unlink(tmp);
    j->n = 0;
    return -1;
}

/* ------------------------------------------------------------ replay */

static uint8_t *read_file(int fd, size_t *len)
{
    struct stat st;
    if (fstat(fd, &st) != 0) return NULL;
    uint8_t *b = malloc((size_t)st.st_size + 1);
    if (!b) abort(); /* start-up allocation */
    ssize_t r = pread(fd, b, (size_t)st.st_size, 0);
    if (r < 0) {
        free(b);
        return NULL;
    }
    *len = (size_t)r;
    return b;
}

static int hdr_matches(const struct journal *j, const uint8_t *b, size_t len)
{
    uint64_t bytes, hash;
    if (len < J_HDR || memcmp(b, J_MAGIC, 8) != 0) return 0;
    memcpy(&bytes, b + 8, 8);
    memcpy(&hash, b + 16, 8);
    return bytes == j->pool_bytes && hash == j->path_hash;
}

/* One payload; -1 if it does not decode. */
static int replay_one(struct journal *j, const uint8_t *p, uint32_t len,
                      void (*add)(void *, const struct jrec *),
                      void (*del)(void *, const char *, const kvt_key *), void *arg)
{
    uint16_t id;
    if (len < 3) return -1;
    memcpy(&id, p + 1, 2);
    if (id >= J_NS_MAX) return -1;
    if (p[0] == R_NS) {
        if (len < 4 || len != 4u + p[3] || p[3] == 0 ||
            memchr(p + 4, 0, p[3]) != NULL)
            return -1;
        free(j->names[id]);
        if (!(j->names[id] = strndup((const char *)p + 4, p[3]))) abort();
        return 0;
    }
    if (!j->names[id]) return -1;
    struct jrec r = {.ns = j->names[id]};
    if (p[0] == R_DEL && len == 35) {
        memcpy(r.key.b, p + 3, KVT_KEY_LEN);
        del(arg, r.ns, &r.key);
        return 0;
    }
    if (p[0] != R_ADD || len != 88) return -1;
    memcpy(r.key.b, p + 3, KVT_KEY_LEN);
    memcpy(&r.off, p + 35, 8);
    memcpy(&r.size, p + 43, 4);
    memcpy(&r.csum, p + 47, 8);
    r.has_parent = p[55] != 0;
    memcpy(r.parent.b, p + 56, KVT_KEY_LEN);
    add(arg, &r);
    return 0;
}

long long journal_replay(struct journal *j, void (*add)(void *, const struct jrec *),
                         void (*del)(void *, const char *, const kvt_key *),
                         void *arg)
{
    size_t len = 0, at = J_HDR;
    long long n = 0;
    uint8_t *b = read_file(j->fd, &len);
    if (!b) return -1;
    if (!hdr_matches(j, b, len)) {
        free(b);
        return 0;
    }
    while (at + 8 <= len) {
        uint32_t plen, crc;
        memcpy(&plen, b + at, 4);
        memcpy(&crc, b + at + 4, 4);
        if (plen > len - at - 8 || (uint32_t)XXH3_64bits(b + at + 8, plen) != crc) break;
        if (replay_one(j, b + at + 8, plen, add, del, arg) != 0) break;
        at += 8 + plen;
        n++;
    }
    if (at < len)
        log_warn("journal", "%s: %zu bytes after record %lld do not decode "
                 "(a torn write): ignored", j->path, len - at, n);
    free(b);
    return n;
}

void journal_close(struct journal *j)
{
    if (!j) return;
    if (j->fd >= 0) {
        journal_flush(j);
        close(j->fd);
    }
    for (int i = 0; i < J_NS_MAX; i++) free(j->names[i]);
    free(j->buf);
    free(j->path);
    free(j);
}
