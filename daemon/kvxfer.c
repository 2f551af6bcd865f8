/*
 * kvxfer.c -- the transfer workers: gather (SAVE) and scatter (LOAD)
 * between an engine's KV cache and the DRAM pool, off the core thread.
 *
 * Design: KVC_WORKERS threads take whole transfers from one queue (mutex
 * + condvar) and copy chunk by chunk, checking the transfer's cancel flag
 * between chunks, so a closed connection stops its transfer within one
 * chunk. The workers are a workq.c queue; the result goes back to the
 * core thread through its completion queue (xfer_done); only the core
 * touches the index, so only the core commits, frees or unpins
 * (kvc_xfer_settle).
 *
 * A LOAD checks every chunk's checksum before it writes the first byte,
 * so a chunk scribbled over in the shared pool is KVT_ECORRUPT with the
 * engine's cache untouched. A SAVE records the checksum of what it
 * gathered, as PUT_COMMIT would.
 *
 * The engine can shrink or truncate the file it registered at any time,
 * and a copy from a mapped page past the end of a file raises SIGBUS.
 * Workers copy under a guard: a SIGBUS while a worker is armed jumps back
 * out of the copy and fails the transfer with KVT_EIO; anywhere else the
 * signal keeps its default action. Copies therefore run on the worker's
 * own thread (registrations set cpu_threads = 1).
 */
#include <setjmp.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "kvcache.h"
#include "kvhbm.h"
#include "kvwait.h"
#include "log.h"

/* ----------------------------------------------------------- SIGBUS guard */

static __thread sigjmp_buf kvc_jb;
static __thread volatile sig_atomic_t kvc_armed;

static void on_sigbus(int sig, siginfo_t *si, void *uctx)
{
    (void)si, (void)uctx;
    if (kvc_armed) {
        kvc_armed = 0;
        siglongjmp(kvc_jb, 1);
    }
    /* Not ours: returning re-runs the access, which now takes the default
     * action, as if no handler had been installed. */
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = SIG_DFL;
    sigaction(sig, &sa, NULL);
}

void kvc_sigbus_install(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_sigbus;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    (void)sigaction(SIGBUS, &sa, NULL); /* valid signal and handler: no error */
}

/* --------------------------------------------------------------- copying */

static kvt_err fail_msg(struct kvc_xfer *x, kvt_err e, const char *what)
{
    snprintf(x->msg, sizeof x->msg, "%s", what);
    return e;
}

/* The fault hook's delay, in slices; 1 if the transfer is cancelled. */
static int stop_here(const struct kvc *k, struct kvc_xfer *x)
{
    for (unsigned t = 0; t < k->fault_delay_ms && !atomic_load(&x->cancel); t += 5) {
        struct timespec ts = {0, 5 * 1000000L};
        nanosleep(&ts, NULL);
    }
    return atomic_load(&x->cancel);
}

/* LOAD: every chunk intact before the first byte lands in the engine.
 * Copies in HBM are the daemon's own (no client can write them) and not
 * readable by the CPU: their DRAM chunk was checked when they were made. */
static kvt_err verify(struct kvc_xfer *x)
{
    const struct kvc_reg *g = x->reg;
    for (uint32_t j = 0; j < x->n_move; j++)
        if (!x->hent[j] && kvt_checksum(x->chunk[j], g->chunk_bytes) != x->csum[j]) {
            snprintf(x->msg, sizeof x->msg, "chunk %u failed its checksum in "
                     "the pool: nothing loaded", j);
            return KVT_ECORRUPT;
        }
    return KVT_OK;
}

static void checksums(struct kvc_xfer *x)
{
    for (uint32_t j = 0; j < x->n_move; j++)
        x->csum[j] = kvt_checksum(x->chunk[j], x->reg->chunk_bytes);
}

static kvt_err copy_host(struct kvc *k, struct kvc_xfer *x)
{
    const struct kvc_reg *g = x->reg;
    for (uint32_t j = 0; j < x->n_move; j++) {
        if (stop_here(k, x)) return fail_msg(x, KVT_ECLOSED, "cancelled");
        const int32_t *ids = x->ids + (size_t)j * g->bpc;
        kvt_err e = x->kind == KVC_SAVE
            ? kvt_gather_cpu(&g->lay, ids, g->bpc, x->chunk[j], g->chunk_bytes)
            : kvt_scatter_cpu(&g->lay, ids, g->bpc, x->chunk[j], g->chunk_bytes);
        if (e != KVT_OK) return fail_msg(x, e, "CPU gather/scatter refused the chunk");
    }
    if (x->kind == KVC_SAVE) checksums(x);
    return KVT_OK;
}

static kvt_err wk_stream(struct kvc_wk *w, int dev, kvt_cuda_stream **s)
{
    if (dev < 0 || dev >= KVC_MAX_DEVICES) return KVT_EINVAL;
    if (!w->stream[dev]) {
        kvt_err e = kvt_gpu_stream_create(w->k->gpu, dev, &w->stream[dev]);
        if (e != KVT_OK) return e;
    }
    *s = w->stream[dev];
    return KVT_OK;
}

/* SAVE: copy the new chunks the core gave an HBM copy into it, from the
 * pool (write-through: DRAM stays the tier of record). */
static kvt_err fill_hbm(struct kvc *k, struct kvc_xfer *x, kvt_cuda_stream *s)
{
    const struct kvt_cuda_ops *o = kvt_gpu_ops(k->gpu);
    kvt_err e = KVT_OK;
    int any = 0;
    for (uint32_t j = 0; j < x->n_move && e == KVT_OK; j++) {
        if (!x->hent[j]) continue;
        e = o->memcpy_async(kvt_gpu_ctx(k->gpu), x->hent[j]->dev, x->chunk[j],
                            x->reg->chunk_bytes, s);
        any = 1;
    }
    return e == KVT_OK && any ? kvt_gpu_sync(k->gpu, s) : e;
}

/* One launch for the whole transfer, then a sync on the worker's stream. */
static kvt_err copy_cuda(struct kvc_wk *w, struct kvc_xfer *x)
{
    struct kvc *k = w->k;
    const struct kvc_reg *g = x->reg;
    kvt_cuda_stream *s;
    if (stop_here(k, x)) return fail_msg(x, KVT_ECLOSED, "cancelled");
    kvt_err e = wk_stream(w, g->device, &s);
    size_t nb = (size_t)x->n_move * g->bpc;
    if (e == KVT_OK)
        e = x->kind == KVC_SAVE
            ? kvt_gpu_gather(k->gpu, &g->lay, x->ids, nb, g->bpc, x->chunk,
                             g->chunk_bytes, s)
            : kvt_gpu_scatter(k->gpu, &g->lay, x->ids, nb, g->bpc,
                              (const void *const *)x->chunk, g->chunk_bytes, s);
    if (e == KVT_OK) e = kvt_gpu_sync(k->gpu, s);
    if (e != KVT_OK) {
        snprintf(x->msg, sizeof x->msg, "CUDA %s failed: %s",
                 x->kind == KVC_SAVE ? "gather" : "scatter",
                 kvt_gpu_last_error(k->gpu));
        return e;
    }
    if (x->kind == KVC_SAVE) {
        checksums(x);
        x->hbm_ok = fill_hbm(k, x, s) == KVT_OK;
    }
    return KVT_OK;
}

static kvt_err run_job(struct kvc_wk *w, struct kvc_xfer *x)
{
    if (atomic_load(&x->cancel)) return fail_msg(x, KVT_ECLOSED, "cancelled");
    if (x->kind == KVC_LOAD) {
        kvt_err e = verify(x);
        if (e != KVT_OK) return e;
    }
    return x->reg->mem == KVC_MEM_CUDA ? copy_cuda(w, x) : copy_host(w->k, x);
}

/* 1 if a SIGBUS cut the job short; else *out is its result. */
static int run_guarded(struct kvc_wk *w, struct kvc_xfer *x, kvt_err *out)
{
    if (sigsetjmp(kvc_jb, 1) != 0) return 1;
    kvc_armed = 1;
    *out = run_job(w, x);
    kvc_armed = 0;
    return 0;
}

/* ------------------------------------------------------- core: settling */

/* Parent slot of chunk i, if it still names the chunk it named. */
static uint32_t live_parent(const struct idx *ix, const struct kvc_xfer *x,
                            uint32_t i)
{
    uint32_t p = x->parent[i];
    if (p == IDX_NONE) return IDX_NONE;
    const struct idx_entry *e = idx_at(ix, p);
    if (e->gen != x->pgen[i] || (e->state != IDX_READY && e->state != IDX_PENDING))
        return IDX_NONE;
    return p;
}

/* The HBM copies of a SAVE: findable if the chunks and copies are good. */
static void save_settle_hbm(struct kvc *k, struct kvc_xfer *x, int commit)
{
    for (uint32_t j = 0; j < x->n_move; j++) {
        if (!x->hent[j]) continue;
        if (commit && x->hbm_ok) kvh_commit(k, x->hent[j]);
        else kvh_drop(k, x->hent[j]);
        x->hent[j] = NULL;
    }
}

static void save_settle(struct kvc *k, struct kvc_xfer *x, int commit)
{
    const struct tier_host *h = k->env.host;
    uint32_t j = 0;
    save_settle_hbm(k, x, commit);
    for (uint32_t i = 0; i < x->n; i++) {
        uint32_t s = x->slot[i];
        if (s == IDX_NONE) continue;
        if (commit) h->commit(h->core, s, x->csum[j], live_parent(h->idx, x, i));
        else h->free_slot(h->core, s);
        j++;
    }
    if (commit) h->watermark(h->core);
}

static void load_settle(struct kvc *k, struct kvc_xfer *x, int ok)
{
    const struct tier_host *h = k->env.host;
    for (uint32_t j = 0; j < x->n_move; j++) {
        if (!x->hent[j]) continue;
        x->hent[j]->pins--;
        x->hent[j] = NULL;
        k->st.hbm_loaded += ok;
    }
    for (uint32_t i = 0; i < x->n; i++) {
        uint32_t s = x->slot[i];
        if (s == IDX_NONE) continue;
        if (idx_unpin(h->idx, s) == 0 && idx_at(h->idx, s)->state == IDX_DOOMED)
            h->free_slot(h->core, s);
    }
    if (ok) *k->env.bytes_out += (uint64_t)x->n * x->reg->chunk_bytes;
}

void kvc_xfer_settle(struct kvc *k, struct kvc_xfer *x, kvt_err err)
{
    if (x->state == KVC_DONE) return;
    x->state = KVC_DONE;
    x->err = err;
    if (err != KVT_OK && !x->msg[0])
        snprintf(x->msg, sizeof x->msg, "%s", kvt_strerror(err));
    if (x->kind == KVC_SAVE) save_settle(k, x, err == KVT_OK);
    else load_settle(k, x, err == KVT_OK);
    kvc_reg_unref(k, x->reg);
    x->reg = NULL;
}

static struct kvc_xfer *xfer_of(struct wq_job *j)
{
    return (struct kvc_xfer *)((char *)j - offsetof(struct kvc_xfer, job));
}

/* Core thread, from the completion queue: a worker finished x. */
static void xfer_done(struct wq_job *j)
{
    struct kvc_xfer *x = xfer_of(j);
    struct kvc *k = x->k;
    uint32_t n = x->n_move;
    kvt_err e = x->orphan ? KVT_ECLOSED : x->err;
    kvc_xfer_settle(k, x, e);
    if (e == KVT_OK) *(x->kind == KVC_SAVE ? &k->st.saved : &k->st.loaded) += n;
    else k->st.failed++;
    if (e != KVT_OK)
        log_debug("kvcache", "transfer %llu: %s: %s", (unsigned long long)x->id,
                  kvt_strerror(e), x->msg);
    if (x->orphan) {
        kvc_xfer_free(k, x);
        return;
    }
    kvc_wait_notify(k, x->pipe);
}

/* ---------------------------------------------------------------- workers */

static void xfer_run(struct wq_job *j, void *tls)
{
    struct kvc_wk *w = tls;
    struct kvc_xfer *x = xfer_of(j);
    kvt_err e = KVT_OK;
    if (run_guarded(w, x, &e)) {
        kvc_armed = 0;
        e = fail_msg(x, KVT_EIO, "the engine's memory went away during the "
                     "copy (SIGBUS: was its file truncated?)");
    }
    x->err = e;
}

static void *worker_init(void *arg, unsigned i)
{
    struct kvc *k = arg;
    k->pool.wk[i].k = k;
    return &k->pool.wk[i];
}

static void worker_fini(void *tls)
{
    struct kvc_wk *w = tls;
    for (int dev = 0; dev < KVC_MAX_DEVICES; dev++)
        if (w->stream[dev]) kvt_gpu_stream_destroy(w->k->gpu, w->stream[dev]);
}

int kvc_pool_start(struct kvc *k)
{
    struct wq_opts o = {"kv-transfer", KVC_WORKERS, k->env.host->cq, worker_init,
                        worker_fini, k};
    return workq_open(&o, &k->pool.q);
}

void kvc_pool_stop(struct kvc *k)
{
    workq_close(k->pool.q, WQ_DISCARD);
    k->pool.q = NULL;
}

void kvc_pool_push(struct kvc *k, struct kvc_xfer *x)
{
    x->job.run = xfer_run;
    x->job.done = xfer_done;
    wq_submit(k->pool.q, &x->job);
}

int kvc_pool_unqueue(struct kvc *k, struct kvc_xfer *x)
{
    return wq_unqueue(k->pool.q, &x->job);
}
