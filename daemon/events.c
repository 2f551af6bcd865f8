/*
 * events.c -- KV events in vLLM's wire format (see events.h).
 *
 * Design: one publisher thread owns both ZMQ sockets (PUB, and the
 * ROUTER of the replay endpoint); the core thread never touches a ZMQ
 * socket. The hooks append a fixed-size record (kind, medium, key,
 * parent key) to the core thread's pending batch; at the end of every
 * core-loop iteration ev_flush() stamps the batch with the next sequence
 * number and the wall-clock time and puts it on a bounded queue (a mutex
 * held for a pointer swap), writing an eventfd only when the queue goes
 * from empty to non-empty (STYLE §7). A batch also goes as soon as it
 * holds EV_BATCH_MAX records, so one FLUSH of many chunks is several
 * messages. When the queue holds EV_QUEUE_MAX batches the new batch is
 * dropped and its events counted: the core thread never waits, and its
 * sequence number is skipped, so a subscriber sees the gap.
 *
 * The thread zmq_polls the eventfd and the ROUTER socket. For each batch
 * it encodes the msgpack payload, sends [topic, seq as 8 bytes big-endian,
 * payload] on PUB (ZMQ_DONTWAIT: PUB never blocks; it drops per slow
 * subscriber at events.hwm, which libzmq does not report to the sender),
 * and keeps (seq, payload) in a ring of events.buffer_steps entries. A
 * replay request, [identity, "", start seq] as vLLM's ZmqEventPublisher
 * reads it (a DEALER or REQ client), is answered on the thread with
 * [identity, "", topic, seq, payload] for every kept seq >= start, then
 * [identity, "", "", -1 as 8 bytes, ""]. The ROUTER's send HWM is
 * buffer_steps + 1, so a full replay fits.
 *
 * Payload, as msgspec.msgpack.Decoder(vllm.distributed.kv_events.
 * KVEventBatch) of vLLM 0.32 reads it: the batch is array-like
 * [ts float64, [events], dp_rank]; each event is a tagged struct in map
 * form (tag field "type", omit_defaults) with every field that has no
 * default: BlockStored {type, block_hashes, parent_block_hash, token_ids,
 * block_size, lora_id, medium, lora_name}, BlockRemoved {type,
 * block_hashes, medium}, AllBlocksCleared {type}. Block hashes are the
 * 32-byte chunk keys as bin; token_ids is empty (the daemon never sees a
 * token). Adjacent records merge into one event when vLLM would have sent
 * them as one: stored records of one medium that form a chain (each
 * one's parent is the previous key), removed records of one medium.
 *
 * Sequence numbers start at 0 with each daemon start; ev_open publishes
 * AllBlocksCleared and then what the tiers hold, so a restart (seq back
 * to 0) also resets a subscriber's view.
 */
#include "events.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "config.h"
#include "index.h"
#include "kvtier.h"
#include "log.h"
#include "ns.h"

#define EV_BATCH_MAX 4096u /* records per message */
#define EV_QUEUE_MAX 1024u /* batches waiting for the thread */

enum ev_kind { EV_STORED = 1, EV_REMOVED = 2, EV_CLEARED = 3 };
enum ev_medium { EV_CPU = 0, EV_STORAGE = 1 };
static const char *const medium_name[] = {"CPU", "STORAGE"};

struct ev_rec {
    uint8_t kind, medium, has_parent;
    kvt_key key, parent;
};

struct ev_batch {
    struct ev_batch *next;
    uint64_t seq;
    double ts;
    uint32_t n, cap;
    struct ev_rec v[];
};

struct ev_kept { /* one replayable message */
    uint64_t seq;
    uint8_t *p;
    size_t n;
};

struct mp { /* a growing msgpack buffer */
    uint8_t *p;
    size_t n, cap;
};

struct ev {
    /* core thread */
    const struct idx *idx;      /* the chunks named by slot */
    const struct ns_table *ns;  /* CLEAR: is anything else cached? */
    struct ev_batch *cur;
    uint64_t next_seq;
    int quiet; /* a CLEAR that empties everything: removals not published */
    /* queue, guarded by mtx */
    pthread_mutex_t mtx;
    pthread_cond_t room; /* only ev_open's inventory waits on it */
    struct ev_batch *qhead, *qtail;
    uint32_t qlen;
    int stop;
    int efd;
    /* publisher thread (and open/close, when it is not running) */
    void *zctx, *pub, *rep;
    pthread_t thr;
    int thr_started;
    struct ev_kept *ring;
    uint32_t ring_cap, ring_n, ring_first;
    struct mp buf;
    char topic[CFG_STR_MAX];
    size_t topic_len;
    uint64_t dp_rank, block_size;
    /* counters: bumped by either thread, read by metrics */
    struct ev_stats st;
};

static void count(uint64_t *c, uint64_t n)
{
    __atomic_fetch_add(c, n, __ATOMIC_RELAXED);
}

/* ------------------------------------------------------------- msgpack */

static void mp_put(struct mp *b, const void *s, size_t n)
{
    if (b->n + n > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->n + n) cap *= 2;
        if (!(b->p = realloc(b->p, cap))) abort(); /* control-plane buffer */
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
}

/* A type byte followed by v in `bytes` big-endian bytes. */
static void mp_head(struct mp *b, uint8_t type, uint64_t v, int bytes)
{
    uint8_t t[9] = {type};
    for (int i = 0; i < bytes; i++) t[1 + i] = (uint8_t)(v >> (8 * (bytes - 1 - i)));
    mp_put(b, t, (size_t)bytes + 1);
}

static void mp_uint(struct mp *b, uint64_t v)
{
    if (v < 128) mp_head(b, (uint8_t)v, 0, 0);
    else if (v < 256) mp_head(b, 0xcc, v, 1);
    else if (v < 65536) mp_head(b, 0xcd, v, 2);
    else if (v <= UINT32_MAX) mp_head(b, 0xce, v, 4);
    else mp_head(b, 0xcf, v, 8);
}

/* Array (0x90, 0xdc, 0xdd) or map (0x80, 0xde, 0xdf) header. */
static void mp_len(struct mp *b, uint8_t fix, uint8_t b16, uint32_t n)
{
    if (n < 16) mp_head(b, (uint8_t)(fix | n), 0, 0);
    else if (n < 65536) mp_head(b, b16, n, 2);
    else mp_head(b, (uint8_t)(b16 + 1), n, 4);
}

static void mp_arr(struct mp *b, uint32_t n) { mp_len(b, 0x90, 0xdc, n); }
static void mp_map(struct mp *b, uint32_t n) { mp_len(b, 0x80, 0xde, n); }
static void mp_nil(struct mp *b) { mp_head(b, 0xc0, 0, 0); }

static void mp_str(struct mp *b, const char *s)
{
    size_t n = strlen(s);
    if (n < 32) mp_head(b, (uint8_t)(0xa0 | n), 0, 0);
    else if (n < 256) mp_head(b, 0xd9, n, 1);
    else mp_head(b, 0xda, n, 2); /* our strings are short */
    mp_put(b, s, n);
}

static void mp_bin(struct mp *b, const void *p, size_t n)
{
    mp_head(b, 0xc4, n, 1); /* keys: 32 bytes */
    mp_put(b, p, n);
}

static void mp_f64(struct mp *b, double d)
{
    uint64_t u;
    memcpy(&u, &d, sizeof u);
    mp_head(b, 0xcb, u, 8);
}

/* ------------------------------------------------------------ encoding */

/* 1 if record r continues the event that ends with record p. */
static int merges(const struct ev_rec *p, const struct ev_rec *r)
{
    if (p->kind != r->kind || p->medium != r->medium) return 0;
    if (r->kind == EV_REMOVED) return 1;
    return r->kind == EV_STORED && r->has_parent &&
           memcmp(r->parent.b, p->key.b, KVT_KEY_LEN) == 0;
}

/* The index after the event that starts at record i. */
static uint32_t group_end(const struct ev_batch *b, uint32_t i)
{
    uint32_t j = i + 1;
    while (j < b->n && merges(&b->v[j - 1], &b->v[j])) j++;
    return j;
}

static void enc_hashes(struct mp *m, const struct ev_batch *b, uint32_t i,
                       uint32_t j)
{
    mp_str(m, "block_hashes");
    mp_arr(m, j - i);
    for (uint32_t k = i; k < j; k++) mp_bin(m, b->v[k].key.b, KVT_KEY_LEN);
}

static void enc_stored(struct ev *e, const struct ev_batch *b, uint32_t i,
                       uint32_t j)
{
    struct mp *m = &e->buf;
    const struct ev_rec *r = &b->v[i];
    mp_map(m, 8);
    mp_str(m, "type");
    mp_str(m, "BlockStored");
    enc_hashes(m, b, i, j);
    mp_str(m, "parent_block_hash");
    if (r->has_parent) mp_bin(m, r->parent.b, KVT_KEY_LEN);
    else mp_nil(m);
    mp_str(m, "token_ids");
    mp_arr(m, 0);
    mp_str(m, "block_size");
    mp_uint(m, e->block_size);
    mp_str(m, "lora_id");
    mp_nil(m);
    mp_str(m, "medium");
    mp_str(m, medium_name[r->medium]);
    mp_str(m, "lora_name");
    mp_nil(m);
}

static void enc_event(struct ev *e, const struct ev_batch *b, uint32_t i,
                      uint32_t j)
{
    struct mp *m = &e->buf;
    if (b->v[i].kind == EV_STORED) {
        enc_stored(e, b, i, j);
    } else if (b->v[i].kind == EV_REMOVED) {
        mp_map(m, 3);
        mp_str(m, "type");
        mp_str(m, "BlockRemoved");
        enc_hashes(m, b, i, j);
        mp_str(m, "medium");
        mp_str(m, medium_name[b->v[i].medium]);
    } else {
        mp_map(m, 1);
        mp_str(m, "type");
        mp_str(m, "AllBlocksCleared");
    }
}

/* [ts, [events], dp_rank] into e->buf. */
static void encode(struct ev *e, const struct ev_batch *b)
{
    uint32_t groups = 0;
    for (uint32_t i = 0; i < b->n; i = group_end(b, i)) groups++;
    e->buf.n = 0;
    mp_arr(&e->buf, 3);
    mp_f64(&e->buf, b->ts);
    mp_arr(&e->buf, groups);
    for (uint32_t i = 0, j; i < b->n; i = j) {
        j = group_end(b, i);
        enc_event(e, b, i, j);
    }
    mp_uint(&e->buf, e->dp_rank);
}

/* ------------------------------------------------------ publisher thread */

static void be64(uint8_t out[8], uint64_t v)
{
    for (int i = 0; i < 8; i++) out[i] = (uint8_t)(v >> (56 - 8 * i));
}

/* Keep the payload in e->buf for replay, dropping the oldest when full. */
static void keep(struct ev *e, uint64_t seq)
{
    uint8_t *p = malloc(e->buf.n ? e->buf.n : 1);
    if (!p) abort();
    memcpy(p, e->buf.p, e->buf.n);
    if (e->ring_n == e->ring_cap) {
        free(e->ring[e->ring_first].p);
        e->ring_first = (e->ring_first + 1) % e->ring_cap;
        e->ring_n--;
    }
    e->ring[(e->ring_first + e->ring_n) % e->ring_cap] = (struct ev_kept){seq, p, e->buf.n};
    e->ring_n++;
}

/* Send [topic, seq, payload] on sock, after a prefix of frames (the
 * replay's identity and delimiter); 0 or -1. Never blocks. */
static int send_msg(void *sock, const void *const *pre, const size_t *pre_n,
                    int n_pre, const char *topic, size_t topic_n,
                    const uint8_t seq[8], const void *p, size_t n)
{
    const int more = ZMQ_SNDMORE | ZMQ_DONTWAIT;
    for (int i = 0; i < n_pre; i++)
        if (zmq_send(sock, pre[i], pre_n[i], more) < 0) return -1;
    if (zmq_send(sock, topic, topic_n, more) < 0 || zmq_send(sock, seq, 8, more) < 0 ||
        zmq_send(sock, p, n, ZMQ_DONTWAIT) < 0)
        return -1;
    return 0;
}

static void publish(struct ev *e, struct ev_batch *b)
{
    uint8_t seq[8];
    be64(seq, b->seq);
    encode(e, b);
    if (send_msg(e->pub, NULL, NULL, 0, e->topic, e->topic_len, seq, e->buf.p,
                 e->buf.n) == 0) {
        count(&e->st.published, b->n);
        count(&e->st.batches, 1);
    } else {
        count(&e->st.dropped, b->n);
    }
    if (e->rep) keep(e, b->seq);
}

/* Answer one request [identity, "", start seq]: every kept message with
 * seq >= start, then the end marker. */
static void replay_to(struct ev *e, const zmq_msg_t *id, uint64_t start)
{
    const void *pre[2] = {zmq_msg_data((zmq_msg_t *)id), ""};
    const size_t pre_n[2] = {zmq_msg_size((zmq_msg_t *)id), 0};
    uint8_t seq[8];
    for (uint32_t k = 0; k < e->ring_n; k++) {
        const struct ev_kept *m = &e->ring[(e->ring_first + k) % e->ring_cap];
        if (m->seq < start) continue;
        be64(seq, m->seq);
        if (send_msg(e->rep, pre, pre_n, 2, e->topic, e->topic_len, seq, m->p, m->n) != 0)
            return; /* the client went away or is too far behind */
    }
    be64(seq, UINT64_MAX); /* -1 as a signed 8-byte integer */
    send_msg(e->rep, pre, pre_n, 2, "", 0, seq, "", 0);
    count(&e->st.replays, 1);
}

/* Read one multipart request; 1 if one was read (valid or not). */
static int replay_one(struct ev *e)
{
    zmq_msg_t f[3];
    int n = 0, more = 1;
    for (; more; n++) {
        zmq_msg_t tmp, *m = n < 3 ? &f[n] : &tmp;
        zmq_msg_init(m);
        if (zmq_msg_recv(m, e->rep, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(m);
            for (int i = 0; i < n && i < 3; i++) zmq_msg_close(&f[i]);
            return 0;
        }
        more = zmq_msg_more(m);
        if (m == &tmp) zmq_msg_close(m);
    }
    size_t len = n == 3 ? zmq_msg_size(&f[2]) : 0;
    if (n == 3 && len <= 8) {
        const uint8_t *s = zmq_msg_data(&f[2]);
        uint64_t start = 0;
        for (size_t i = 0; i < len; i++) start = start << 8 | s[i];
        replay_to(e, &f[0], start);
    } else {
        log_warn("events", "replay request of %d frame(s) ignored: want "
                 "[\"\", start seq as 8 bytes big-endian]", n - 1);
    }
    for (int i = 0; i < n && i < 3; i++) zmq_msg_close(&f[i]);
    return 1;
}

/* Take the whole queue; *stop tells whether the thread should end. */
static struct ev_batch *take(struct ev *e, int *stop)
{
    uint64_t v;
    ssize_t r = read(e->efd, &v, sizeof v);
    (void)r;
    pthread_mutex_lock(&e->mtx);
    struct ev_batch *b = e->qhead;
    e->qhead = e->qtail = NULL;
    e->qlen = 0;
    *stop = e->stop;
    pthread_cond_broadcast(&e->room);
    pthread_mutex_unlock(&e->mtx);
    return b;
}

static void *ev_main(void *arg)
{
    struct ev *e = arg;
    zmq_pollitem_t it[2] = {{NULL, e->efd, ZMQ_POLLIN, 0}, {e->rep, 0, ZMQ_POLLIN, 0}};
    int stop = 0;
    while (!stop) {
        if (zmq_poll(it, e->rep ? 2 : 1, -1) < 0) {
            if (errno == ETERM) break;
            continue; /* EINTR */
        }
        if (e->rep && (it[1].revents & ZMQ_POLLIN))
            while (replay_one(e)) {}
        if (!(it[0].revents & ZMQ_POLLIN)) continue;
        for (struct ev_batch *b = take(e, &stop), *nx; b; b = nx) {
            nx = b->next;
            publish(e, b);
            free(b);
        }
    }
    return NULL;
}

/* ----------------------------------------------------------- core side */

/* Queue a batch; wait for room only if asked (start-up), else drop. */
static void push(struct ev *e, struct ev_batch *b, int wait)
{
    b->seq = e->next_seq++;
    b->next = NULL;
    pthread_mutex_lock(&e->mtx);
    while (wait && e->qlen >= EV_QUEUE_MAX) pthread_cond_wait(&e->room, &e->mtx);
    if (e->qlen >= EV_QUEUE_MAX) {
        pthread_mutex_unlock(&e->mtx);
        count(&e->st.dropped, b->n);
        free(b);
        return;
    }
    int wake = e->qhead == NULL;
    if (e->qtail) e->qtail->next = b;
    else e->qhead = b;
    e->qtail = b;
    e->qlen++;
    pthread_mutex_unlock(&e->mtx);
    if (wake) {
        uint64_t one = 1;
        ssize_t r = write(e->efd, &one, sizeof one);
        (void)r;
    }
}

static double wall_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void flush_batch(struct ev *e, int wait)
{
    struct ev_batch *b = e->cur;
    if (!b) return;
    e->cur = NULL;
    b->ts = wall_now();
    push(e, b, wait);
}

/* Room for one more record in the pending batch (a new one as needed). */
static struct ev_rec *next_rec(struct ev *e, int wait)
{
    if (e->cur && e->cur->n == EV_BATCH_MAX) flush_batch(e, wait);
    struct ev_batch *b = e->cur;
    if (!b || b->n == b->cap) {
        uint32_t cap = b ? b->cap * 2 : 64;
        b = realloc(b, sizeof *b + cap * sizeof b->v[0]);
        if (!b) abort(); /* control-plane allocation */
        if (!e->cur) b->n = 0; /* a new batch, not a grown one */
        b->cap = cap;
        e->cur = b;
    }
    return &b->v[b->n++];
}

/* The key of the chunk's parent, if the index still knows it. */
static int parent_of(const struct idx *x, const struct idx_entry *e, kvt_key *out)
{
    if (e->parent == IDX_NONE) return 0;
    const struct idx_entry *p = idx_at(x, e->parent);
    if (p->gen != e->parent_gen || p->state == IDX_FREE) return 0;
    *out = p->key;
    return 1;
}

/* One record per tier bit of `tiers` (DRAM first). */
static void record(struct ev *e, uint32_t slot, uint8_t tiers, uint8_t kind,
                   int wait)
{
    const struct idx_entry *en = idx_at(e->idx, slot);
    if (en->state != IDX_READY) return;
    for (int m = EV_CPU; m <= EV_STORAGE; m++) {
        if (!(tiers & (m == EV_CPU ? IDX_DRAM : IDX_NVME))) continue;
        struct ev_rec *r = next_rec(e, wait);
        r->kind = kind;
        r->medium = (uint8_t)m;
        r->key = en->key;
        r->has_parent = kind == EV_STORED && parent_of(e->idx, en, &r->parent);
    }
}

void ev_stored(struct ev *e, uint32_t slot, uint8_t tiers)
{
    if (e) record(e, slot, tiers, EV_STORED, 0);
}

void ev_removed(struct ev *e, uint32_t slot, uint8_t tiers)
{
    if (e && !e->quiet) record(e, slot, tiers, EV_REMOVED, 0);
}

static void all_cleared(struct ev *e, int wait)
{
    struct ev_rec *r = next_rec(e, wait);
    memset(r, 0, sizeof *r);
    r->kind = EV_CLEARED;
}

void ev_clear_begin(struct ev *e, uint16_t ns)
{
    if (!e || ns == NS_NONE || e->ns->v[ns].chunks == 0) return;
    for (uint32_t i = 0; i < e->ns->n; i++)
        if (i != ns && e->ns->v[i].chunks) return; /* others stay: per key */
    all_cleared(e, 0);
    e->quiet = 1;
}

void ev_clear_end(struct ev *e)
{
    if (e) e->quiet = 0;
}

void ev_flush(struct ev *e)
{
    if (e) flush_batch(e, 0);
}

void ev_get_stats(const struct ev *e, struct ev_stats *out)
{
    memset(out, 0, sizeof *out);
    if (!e) return;
    const struct ev_stats *s = &e->st;
    out->published = __atomic_load_n(&s->published, __ATOMIC_RELAXED);
    out->dropped = __atomic_load_n(&s->dropped, __ATOMIC_RELAXED);
    out->batches = __atomic_load_n(&s->batches, __ATOMIC_RELAXED);
    out->replays = __atomic_load_n(&s->replays, __ATOMIC_RELAXED);
}

/* AllBlocksCleared, then every chunk the tiers hold (start-up only: may
 * wait for the thread). */
static void inventory(struct ev *e)
{
    all_cleared(e, 1);
    for (uint32_t s = 0; s < e->idx->used; s++)
        record(e, s, idx_at(e->idx, s)->tier, EV_STORED, 1);
    flush_batch(e, 1);
}

/* ------------------------------------------------------- open and close */

/* vLLM's rule (ZmqEventPublisher._is_bind_endpoint): bind wildcard, ipc
 * and inproc endpoints; connect to the rest, e.g. a subscriber that
 * binds (llm-d's indexer). */
static int is_bind(const char *url)
{
    return strchr(url, '*') || strstr(url, "::") || !strncmp(url, "ipc://", 6) ||
           !strncmp(url, "inproc://", 9);
}

static void *open_sock(struct ev *e, int type, const char *key, const char *url,
                       int hwm, int bind)
{
    void *s = zmq_socket(e->zctx, type);
    int linger = 0;
    if (!s || zmq_setsockopt(s, ZMQ_LINGER, &linger, sizeof linger) != 0 ||
        zmq_setsockopt(s, ZMQ_SNDHWM, &hwm, sizeof hwm) != 0 ||
        (bind ? zmq_bind(s, url) : zmq_connect(s, url)) != 0) {
        log_error("events", "events.%s '%s': cannot %s: %s", key, url,
                  bind ? "bind" : "connect", zmq_strerror(zmq_errno()));
        if (s) zmq_close(s);
        return NULL;
    }
    char last[CFG_STR_MAX + 64] = "";
    size_t n = sizeof last - 1;
    if (!bind || zmq_getsockopt(s, ZMQ_LAST_ENDPOINT, last, &n) != 0) n = 0;
    last[n] = '\0';
    log_info("events", "publishing KV events: %s %s (%s)", bind ? "bound" : "connected to",
             last[0] ? last : url, type == ZMQ_PUB ? "PUB" : "replay ROUTER");
    return s;
}

static int open_sockets(struct ev *e, const struct kvt_config *c)
{
    e->zctx = zmq_ctx_new();
    if (!e->zctx) {
        log_error("events", "zmq_ctx_new: %s", zmq_strerror(zmq_errno()));
        return -1;
    }
    e->pub = open_sock(e, ZMQ_PUB, "endpoint", c->events_endpoint,
                       (int)c->events_hwm, is_bind(c->events_endpoint));
    if (!e->pub) return -1;
    if (!c->events_replay_endpoint[0]) return 0;
    e->rep = open_sock(e, ZMQ_ROUTER, "replay_endpoint", c->events_replay_endpoint,
                       (int)c->events_buffer_steps + 1, 1);
    return e->rep ? 0 : -1;
}

static struct ev *ev_new(const struct kvt_config *c)
{
    struct ev *e = calloc(1, sizeof *e);
    if (!e) abort();
    e->efd = -1;
    pthread_mutex_init(&e->mtx, NULL);
    pthread_cond_init(&e->room, NULL);
    snprintf(e->topic, sizeof e->topic, "%s", c->events_topic);
    e->topic_len = strlen(e->topic);
    e->dp_rank = c->events_dp_rank;
    e->block_size = c->events_block_size;
    e->ring_cap = (uint32_t)c->events_buffer_steps;
    return e;
}

int ev_open(const struct kvt_config *c, const struct idx *idx,
            const struct ns_table *ns, struct ev **out)
{
    *out = NULL;
    if (!c->events_endpoint[0]) return 0;
    struct ev *e = *out = ev_new(c);
    e->idx = idx;
    e->ns = ns;
    if (open_sockets(e, c) != 0) return -1;
    if (e->rep && !(e->ring = calloc(e->ring_cap, sizeof *e->ring))) abort();
    e->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (e->efd < 0 || pthread_create(&e->thr, NULL, ev_main, e) != 0) {
        log_error("events", "cannot start the publisher thread: %s", strerror(errno));
        return -1;
    }
    e->thr_started = 1;
    inventory(e);
    return 0;
}

static void stop_thread(struct ev *e)
{
    uint64_t one = 1;
    pthread_mutex_lock(&e->mtx);
    e->stop = 1;
    pthread_mutex_unlock(&e->mtx);
    ssize_t r = write(e->efd, &one, sizeof one);
    (void)r;
    pthread_join(e->thr, NULL);
}

void ev_close(struct ev *e)
{
    if (!e) return;
    if (e->thr_started) {
        flush_batch(e, 1);
        stop_thread(e);
    }
    free(e->cur);
    for (struct ev_batch *b = e->qhead, *nx; b; b = nx) nx = b->next, free(b);
    for (uint32_t k = 0; k < e->ring_n; k++)
        free(e->ring[(e->ring_first + k) % e->ring_cap].p);
    free(e->ring);
    free(e->buf.p);
    if (e->pub) zmq_close(e->pub);
    if (e->rep) zmq_close(e->rep);
    if (e->zctx) zmq_ctx_term(e->zctx);
    if (e->efd >= 0) close(e->efd);
    pthread_mutex_destroy(&e->mtx);
    pthread_cond_destroy(&e->room);
    free(e);
}
