/*
 * nvindex.c -- see nvindex.h.
 *
 * Value layout (version 1, little-endian): u8 version, u8 flags (bit 0:
 * parent follows), u16 dir, u32 file number, u64 offset, u32 reserved
 * length, u32 size, u64 checksum, u64 sequence, u64 atime, then the
 * 32-byte parent key if flagged.
 */
#include "nvindex.h"

#include <errno.h>
#include <stddef.h>
#include <pthread.h>
#include <rocksdb/c.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "log.h"
#include "workq.h"

#define VAL_VERSION 1
#define VAL_BASE 48
#define KEY_MAX (1 + KVT_NS_MAX + KVT_KEY_LEN)
#define FORMAT_KEY "\0format"
#define FORMAT_KEY_LEN 7
#define FORMAT_VAL "kvtier-nvx-1"
#define MAX_SYNC_FDS 64

enum { OP_PUT = 1, OP_DEL = 2 };

struct op {
    uint8_t kind, vlen;
    uint16_t klen;
    int fd;
    uint8_t k[KEY_MAX];
    uint8_t v[VAL_BASE + KVT_KEY_LEN];
};

struct opq {
    struct op *v;
    size_t n, cap;
};

struct nvx {
    rocksdb_t *db;
    rocksdb_options_t *opts;
    rocksdb_writeoptions_t *wo;
    rocksdb_readoptions_t *ro;
    int fsync_data;
    struct workq *wq;     /* one writer thread (workq.c) */
    struct wq_job job;    /* "write what is queued"; submitted when q fills */
    pthread_mutex_t mtx;  /* guards q, mine, busy, submitted, errors, written */
    pthread_cond_t idle;
    struct opq q, mine;   /* queued; being written */
    int busy, submitted;
    uint64_t errors, written;
};

/* ------------------------------------------------------------ encoding */

static uint16_t enc_key(uint8_t *k, const char *ns, const kvt_key *key)
{
    size_t n = strnlen(ns, KVT_NS_MAX);
    k[0] = (uint8_t)n;
    memcpy(k + 1, ns, n);
    memcpy(k + 1 + n, key->b, KVT_KEY_LEN);
    return (uint16_t)(1 + n + KVT_KEY_LEN);
}

#define PUT(p, x) (memcpy((p), &(x), sizeof(x)), (p) += sizeof(x))
#define GET(p, x) (memcpy(&(x), (p), sizeof(x)), (p) += sizeof(x))

static uint8_t enc_val(uint8_t *v, const struct nvx_rec *r)
{
    uint8_t *p = v, ver = VAL_VERSION, fl = r->has_parent ? 1 : 0;
    PUT(p, ver);
    PUT(p, fl);
    PUT(p, r->dir);
    PUT(p, r->num);
    PUT(p, r->off);
    PUT(p, r->len);
    PUT(p, r->size);
    PUT(p, r->csum);
    PUT(p, r->seq);
    PUT(p, r->atime);
    if (r->has_parent) {
        memcpy(p, r->parent.b, KVT_KEY_LEN);
        p += KVT_KEY_LEN;
    }
    return (uint8_t)(p - v);
}

int nvx_decode(const uint8_t *k, size_t kl, const uint8_t *v, size_t vl,
               struct nvx_rec *r)
{
    if (kl < 2 || k[0] == 0 || kl != 1u + k[0] + KVT_KEY_LEN ||
        vl < VAL_BASE || memchr(k + 1, 0, k[0]) != NULL)
        return -1;
    memset(r, 0, sizeof *r);
    memcpy(r->ns, k + 1, k[0]);
    memcpy(r->key.b, k + 1 + k[0], KVT_KEY_LEN);
    const uint8_t *p = v;
    uint8_t ver, fl;
    GET(p, ver);
    GET(p, fl);
    if (ver != VAL_VERSION || vl != VAL_BASE + ((fl & 1) ? KVT_KEY_LEN : 0u))
        return -1;
    GET(p, r->dir);
    GET(p, r->num);
    GET(p, r->off);
    GET(p, r->len);
    GET(p, r->size);
    GET(p, r->csum);
    GET(p, r->seq);
    GET(p, r->atime);
    r->has_parent = fl & 1;
    if (r->has_parent) memcpy(r->parent.b, p, KVT_KEY_LEN);
    return r->size && r->len ? 0 : -1;
}

/* -------------------------------------------------------------- worker */

static void sync_fds(const struct op *ops, size_t n)
{
    int fds[MAX_SYNC_FDS], k = 0;
    for (size_t i = 0; i < n; i++) {
        int fd = ops[i].fd, seen = 0;
        for (int j = 0; j < k && !seen; j++) seen = fds[j] == fd;
        if (fd < 0 || seen) continue;
        if (k == MAX_SYNC_FDS) {
            for (int j = 0; j < k; j++) fdatasync(fds[j]);
            k = 0;
        }
        fds[k++] = fd;
    }
    for (int j = 0; j < k; j++) fdatasync(fds[j]);
}

/* Write one batch; 0 or -1 (logged). Worker thread. */
static int write_batch(struct nvx *x, const struct op *ops, size_t n)
{
    char *err = NULL;
    if (x->fsync_data) sync_fds(ops, n);
    rocksdb_writebatch_t *b = rocksdb_writebatch_create();
    for (size_t i = 0; i < n; i++) {
        if (ops[i].kind == OP_PUT)
            rocksdb_writebatch_put(b, (const char *)ops[i].k, ops[i].klen,
                                   (const char *)ops[i].v, ops[i].vlen);
        else
            rocksdb_writebatch_delete(b, (const char *)ops[i].k, ops[i].klen);
    }
    rocksdb_write(x->db, x->wo, b, &err);
    rocksdb_writebatch_destroy(b);
    if (!err) return 0;
    log_error("nvindex", "writing %zu index updates: %s", n, err);
    rocksdb_free(err);
    return -1;
}

/* The writer's job: take the whole queue, write it as one batch. It is
 * submitted again only when the queue goes from empty to non-empty. */
static void write_queued(struct wq_job *j, void *tls)
{
    struct nvx *x = (struct nvx *)((char *)j - offsetof(struct nvx, job));
    (void)tls;
    pthread_mutex_lock(&x->mtx);
    struct opq t = x->q;
    x->q = x->mine;
    x->mine = t;
    x->submitted = 0;
    x->busy = 1;
    pthread_mutex_unlock(&x->mtx);
    int rv = x->mine.n ? write_batch(x, x->mine.v, x->mine.n) : 0;
    pthread_mutex_lock(&x->mtx);
    if (rv != 0) x->errors++;
    x->written += x->mine.n;
    x->mine.n = 0;
    x->busy = 0;
    pthread_cond_broadcast(&x->idle);
    pthread_mutex_unlock(&x->mtx);
}

/* Caller holds x->mtx: wake the writer for what was just queued. */
static void do_kick(struct nvx *x)
{
    if (x->submitted) return;
    x->submitted = 1;
    wq_submit(x->wq, &x->job);
}

static struct op *q_add(struct nvx *x)
{
    struct opq *q = &x->q;
    if (q->n == q->cap) {
        size_t ncap = q->cap ? q->cap * 2 : 256;
        struct op *nv = realloc(q->v, ncap * sizeof *nv);
        if (!nv) abort(); /* control-plane allocation */
        q->v = nv;
        q->cap = ncap;
    }
    return &q->v[q->n++];
}

void nvx_put(struct nvx *x, const struct nvx_rec *r, int data_fd)
{
    pthread_mutex_lock(&x->mtx);
    struct op *o = q_add(x);
    o->kind = OP_PUT;
    o->fd = data_fd;
    o->klen = enc_key(o->k, r->ns, &r->key);
    o->vlen = enc_val(o->v, r);
    do_kick(x);
    pthread_mutex_unlock(&x->mtx);
}

void nvx_del(struct nvx *x, const char *ns, const kvt_key *key)
{
    pthread_mutex_lock(&x->mtx);
    struct op *o = q_add(x);
    o->kind = OP_DEL;
    o->fd = -1;
    o->klen = enc_key(o->k, ns, key);
    o->vlen = 0;
    do_kick(x);
    pthread_mutex_unlock(&x->mtx);
}

void nvx_sync(struct nvx *x)
{
    pthread_mutex_lock(&x->mtx);
    while (x->q.n || x->busy) pthread_cond_wait(&x->idle, &x->mtx);
    pthread_mutex_unlock(&x->mtx);
}

static uint64_t read_counter(struct nvx *x, const uint64_t *c)
{
    pthread_mutex_lock(&x->mtx);
    uint64_t v = *c;
    pthread_mutex_unlock(&x->mtx);
    return v;
}

uint64_t nvx_errors(struct nvx *x)
{
    return read_counter(x, &x->errors);
}

uint64_t nvx_written(struct nvx *x)
{
    return read_counter(x, &x->written);
}

/* ---------------------------------------------------------- open, load */

static int has_format(struct nvx *x)
{
    size_t len = 0;
    char *err = NULL;
    char *v = rocksdb_get(x->db, x->ro, FORMAT_KEY, FORMAT_KEY_LEN, &len, &err);
    int ok = v && !err && len == strlen(FORMAT_VAL) && memcmp(v, FORMAT_VAL, len) == 0;
    rocksdb_free(v);
    rocksdb_free(err);
    return ok;
}

static rocksdb_options_t *make_options(void)
{
    rocksdb_options_t *o = rocksdb_options_create();
    rocksdb_options_set_create_if_missing(o, 1);
    rocksdb_options_set_compression(o, rocksdb_no_compression);
    rocksdb_options_set_keep_log_file_num(o, 2);
    rocksdb_options_set_max_log_file_size(o, 1 << 20);
    rocksdb_options_set_info_log_level(o, 2); /* warnings and up */
    return o;
}

int nvx_open(const char *path, int fsync_data, struct nvx **out, int *complete,
             char *err, size_t errlen)
{
    struct nvx *x = calloc(1, sizeof *x);
    char *rerr = NULL;
    if (!x) abort();
    x->fsync_data = fsync_data;
    pthread_mutex_init(&x->mtx, NULL);
    pthread_cond_init(&x->idle, NULL);
    x->job.run = write_queued;
    x->opts = make_options();
    x->wo = rocksdb_writeoptions_create();
    x->ro = rocksdb_readoptions_create();
    x->db = rocksdb_open(x->opts, path, &rerr);
    if (!x->db) {
        snprintf(err, errlen, "index %s: %s", path, rerr ? rerr : "cannot open");
        rocksdb_free(rerr);
        nvx_close(x);
        return -1;
    }
    *complete = has_format(x);
    struct wq_opts o = {.name = "nvme-index", .threads = 1};
    if (workq_open(&o, &x->wq) != 0) abort();
    *out = x;
    return 0;
}

int nvx_mark_complete(struct nvx *x)
{
    char *err = NULL;
    rocksdb_writeoptions_t *wo = rocksdb_writeoptions_create();
    nvx_sync(x);
    rocksdb_writeoptions_set_sync(wo, 1);
    rocksdb_put(x->db, wo, FORMAT_KEY, FORMAT_KEY_LEN, FORMAT_VAL, strlen(FORMAT_VAL), &err);
    rocksdb_writeoptions_destroy(wo);
    if (!err) return 0;
    log_error("nvindex", "writing the format mark: %s", err);
    rocksdb_free(err);
    return -1;
}

int nvx_wipe(struct nvx *x, char *err, size_t errlen)
{
    char *rerr = NULL;
    nvx_sync(x);
    rocksdb_writebatch_t *b = rocksdb_writebatch_create();
    rocksdb_iterator_t *it = rocksdb_create_iterator(x->db, x->ro);
    for (rocksdb_iter_seek_to_first(it); rocksdb_iter_valid(it); rocksdb_iter_next(it)) {
        size_t kl;
        const char *k = rocksdb_iter_key(it, &kl);
        rocksdb_writebatch_delete(b, k, kl);
    }
    rocksdb_iter_destroy(it);
    rocksdb_write(x->db, x->wo, b, &rerr);
    rocksdb_writebatch_destroy(b);
    if (!rerr) return 0;
    snprintf(err, errlen, "clearing the index: %s", rerr);
    rocksdb_free(rerr);
    return -1;
}

long long nvx_load(struct nvx *x, void (*fn)(void *arg, const struct nvx_rec *r),
                   void *arg, uint64_t *bad, char *err, size_t errlen)
{
    long long n = 0;
    char *rerr = NULL;
    struct nvx_rec r;
    rocksdb_writebatch_t *drop = rocksdb_writebatch_create();
    rocksdb_iterator_t *it = rocksdb_create_iterator(x->db, x->ro);
    *bad = 0;
    for (rocksdb_iter_seek_to_first(it); rocksdb_iter_valid(it); rocksdb_iter_next(it)) {
        size_t kl, vl;
        const char *k = rocksdb_iter_key(it, &kl), *v = rocksdb_iter_value(it, &vl);
        if (kl && k[0] == 0) continue; /* meta */
        if (nvx_decode((const uint8_t *)k, kl, (const uint8_t *)v, vl, &r) != 0) {
            rocksdb_writebatch_delete(drop, k, kl);
            (*bad)++;
            continue;
        }
        fn(arg, &r);
        n++;
    }
    rocksdb_iter_get_error(it, &rerr);
    rocksdb_iter_destroy(it);
    if (!rerr && *bad) rocksdb_write(x->db, x->wo, drop, &rerr);
    rocksdb_writebatch_destroy(drop);
    if (!rerr) return n;
    snprintf(err, errlen, "reading the index: %s", rerr);
    rocksdb_free(rerr);
    return -1;
}

void nvx_close(struct nvx *x)
{
    if (!x) return;
    workq_close(x->wq, WQ_DRAIN); /* the writer empties the queue first */
    if (x->db) rocksdb_close(x->db);
    if (x->wo) rocksdb_writeoptions_destroy(x->wo);
    if (x->ro) rocksdb_readoptions_destroy(x->ro);
    if (x->opts) rocksdb_options_destroy(x->opts);
    pthread_mutex_destroy(&x->mtx);
    pthread_cond_destroy(&x->idle);
    free(x->q.v);
    free(x->mine.v);
    free(x);
}

int nvx_move_aside(const char *path, char *moved, size_t movedlen)
{
    snprintf(moved, movedlen, "%s.damaged-%lld", path, (long long)time(NULL));
    return rename(path, moved) == 0 || errno == ENOENT ? 0 : -1;
}
