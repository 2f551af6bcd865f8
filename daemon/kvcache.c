/*
 * kvcache.c -- REGISTER_KV_CACHE, SAVE and LOAD on the core thread (see
 * kvcache.h for the lifetimes).
 *
 * Design: each handler checks the whole request first -- namespace, keys,
 * registration and owner, block ids (in range; distinct for a LOAD, which
 * must not write one block twice), chunk sizes against the registration's,
 * and for a LOAD that every key is cached now -- and answers an error
 * with nothing reserved, pinned or written. Only then does it reserve
 * (SAVE; keys already cached are skipped) or pin (LOAD) and queue the job.
 * LOAD is all or nothing: vLLM's connector loads exactly what lookup said
 * was there, so a key gone since then is KVT_ENOENT, not a short load.
 *
 * Host registrations map a file the engine names. The daemon may run as
 * another user than the engine (root, often), so the path is resolved
 * first without opening anything (O_PATH, no symlink in any component)
 * and the inode checked: a non-empty regular file owned by the
 * connection's peer uid (ipc:// peer credentials) with its owner's read
 * and write bits set. Only then is that inode opened read-write, through
 * its descriptor: an engine can make the daemon read and write nothing it
 * could not open read-write itself (or make so with chmod, as owner), and
 * never makes it open a device or a fifo.
 */
#include "kvcache.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "clock.h"
#include "handlers.h" /* req_alloc, req_fail */
#include "hbm.h"
#include "kvhbm.h"
#include "kvwait.h"
#include "kvxfer.h"
#include "log.h"
#include "wire.h"

/* ------------------------------------------------------------- records */

uint64_t kvc_new_id(struct kvc *k)
{
    if (k->next_id == 0 && getrandom(&k->next_id, sizeof k->next_id, 0) < 0)
        k->next_id = now_ms();
    do k->next_id = (k->next_id + 1) & 0x7fffffffffffffffull;
    while (k->next_id == 0);
    return k->next_id;
}

static struct kvc_xfer **xbucket(struct kvc *k, uint64_t id)
{
    return &k->xb[(id ^ (id >> 17)) % KVC_XFER_BUCKETS];
}

struct kvc_xfer *kvc_xfer_find(struct kvc *k, uint64_t id)
{
    for (struct kvc_xfer *x = *xbucket(k, id); x; x = x->hnext)
        if (x->id == id) return x;
    return NULL;
}

static void xfer_arrays_free(struct kvc_xfer *x)
{
    free(x->slot);
    free(x->parent);
    free(x->pgen);
    free(x->chunk);
    free(x->ids);
    free(x->csum);
    free(x->hent);
}

void kvc_xfer_free(struct kvc *k, struct kvc_xfer *x)
{
    struct kvc_xfer **p = xbucket(k, x->id);
    while (*p != x) p = &(*p)->hnext;
    *p = x->hnext;
    k->n_xfers--;
    xfer_arrays_free(x);
    free(x);
}

static void *xcalloc(size_t n, size_t size)
{
    void *p = calloc(n ? n : 1, size);
    if (!p) {
        log_error("kvcache", "out of memory for a transfer of %zu entries", n);
        abort(); /* control-plane allocation */
    }
    return p;
}

static struct kvc_xfer *xfer_new(struct kvc *k, uint32_t pipe, int kind,
                                 struct kvc_reg *g, uint32_t n)
{
    struct kvc_xfer *x = xcalloc(1, sizeof *x);
    x->k = k;
    x->id = kvc_new_id(k);
    x->pipe = pipe;
    x->kind = (uint8_t)kind;
    x->reg = g;
    g->refs++;
    x->n = n;
    x->slot = xcalloc(n, sizeof *x->slot);
    for (uint32_t i = 0; i < n; i++) x->slot[i] = IDX_NONE;
    x->chunk = xcalloc(n, sizeof *x->chunk);
    x->ids = xcalloc((size_t)n * g->bpc, sizeof *x->ids);
    x->csum = xcalloc(n, sizeof *x->csum);
    x->hent = xcalloc(n, sizeof *x->hent);
    if (kind == KVC_SAVE) {
        x->parent = xcalloc(n, sizeof *x->parent);
        x->pgen = xcalloc(n, sizeof *x->pgen);
    }
    struct kvc_xfer **b = xbucket(k, x->id);
    x->hnext = *b;
    *b = x;
    k->n_xfers++;
    return x;
}

static void reg_release_mem(struct kvc *k, struct kvc_reg *g);

void kvc_reg_unref(struct kvc *k, struct kvc_reg *g)
{
    if (--g->refs > 0) return;
    struct kvc_reg **p = &k->regs;
    while (*p && *p != g) p = &(*p)->next;
    if (*p) *p = g->next;
    reg_release_mem(k, g);
    ns_unhold(k->env.ns, g->ns_id);
    free(g->ns);
    free(g);
}

/* A live registration, or NULL with the response failed. */
static struct kvc_reg *reg_own(struct req *r, struct kvc *k, uint32_t pipe,
                               uint64_t id)
{
    for (struct kvc_reg *g = k->regs; g; g = g->next) {
        if (g->id != id || g->dead) continue;
        if (g->pipe == pipe) return g;
        req_fail(r, KVT_EPERM, "registration %llu belongs to another client",
                 (unsigned long long)id);
        return NULL;
    }
    req_fail(r, KVT_ENOENT, "no KV-cache registration %llu",
             (unsigned long long)id);
    return NULL;
}

static uint32_t regs_of(const struct kvc *k, uint32_t pipe)
{
    uint32_t n = 0;
    for (const struct kvc_reg *g = k->regs; g; g = g->next)
        n += !g->dead && g->pipe == pipe;
    return n;
}

static uint32_t xfers_of(const struct kvc *k, uint32_t pipe)
{
    uint32_t n = 0;
    for (int b = 0; b < KVC_XFER_BUCKETS; b++)
        for (const struct kvc_xfer *x = k->xb[b]; x; x = x->hnext)
            n += x->pipe == pipe;
    return n;
}

static void reg_kill(struct kvc *k, struct kvc_reg *g)
{
    if (g->dead) return;
    g->dead = 1;
    k->n_regs--;
    kvc_reg_unref(k, g);
}

/* -------------------------------------------------------- CUDA handles */

static kvt_err ipc_get(struct kvc *k, int device, const uint8_t *h,
                       struct kvc_ipc **out)
{
    for (struct kvc_ipc *c = k->ipcs; c; c = c->next)
        if (c->device == device && !memcmp(c->handle, h, sizeof c->handle)) {
            c->refs++;
            *out = c;
            return KVT_OK;
        }
    void *ptr = NULL;
    kvt_err e = kvt_gpu_ipc_open(k->gpu, device, h, KVT_CUDA_IPC_HANDLE_LEN, &ptr);
    if (e != KVT_OK) return e;
    struct kvc_ipc *c = xcalloc(1, sizeof *c);
    memcpy(c->handle, h, sizeof c->handle);
    c->device = device;
    c->ptr = ptr;
    c->refs = 1;
    c->next = k->ipcs;
    k->ipcs = c;
    *out = c;
    return KVT_OK;
}

static void ipc_put(struct kvc *k, struct kvc_ipc *c)
{
    if (--c->refs > 0) return;
    struct kvc_ipc **p = &k->ipcs;
    while (*p != c) p = &(*p)->next;
    *p = c->next;
    kvt_gpu_ipc_close(k->gpu, c->ptr);
    free(c);
}

static void reg_release_mem(struct kvc *k, struct kvc_reg *g)
{
    if (g->map) munmap(g->map, g->map_len);
    g->map = NULL;
    for (uint32_t i = 0; i < g->n_ipc; i++) ipc_put(k, g->ipc[i]);
    g->n_ipc = 0;
}

/* -------------------------------------------------------- registration */

static kvt_err reg_check(struct req *r, struct kvc *k, uint32_t pipe,
                         const Kvtier__RegisterKvCache *q)
{
    const Kvtier__KvLayout *l = q->layout;
    const Kvtier__KvMemory *m = q->memory;
    if (!wire_ns_ok(q->ns))
        return req_fail(r, KVT_EINVAL, "bad namespace: want 1-%d printable "
                        "bytes without spaces", KVT_NS_MAX);
    if (!l || !m) return req_fail(r, KVT_EINVAL, "layout and memory are required");
    if (l->num_layers == 0 || l->num_layers > KVT_LAYOUT_MAX_LAYERS)
        return req_fail(r, KVT_EINVAL, "num_layers %u: want 1-%d", l->num_layers,
                        KVT_LAYOUT_MAX_LAYERS);
    size_t want = kvt_layout_n_bases((kvt_layout_kind)l->kind, l->num_layers,
                                     l->num_kv);
    if (want == 0 || want > KVT_LAYOUT_MAX_LAYERS * 2)
        return req_fail(r, KVT_EINVAL, "unknown layout kind %u (or num_kv %u)",
                        l->kind, l->num_kv);
    int host = m->shm_path && m->shm_path[0];
    if (host == (m->n_ipc_handles > 0))
        return req_fail(r, KVT_EINVAL, "memory: give a shm_path or IPC "
                        "handles, not %s", host ? "both" : "neither");
    if (m->n_offsets != want || (!host && m->n_ipc_handles != want))
        return req_fail(r, KVT_EINVAL, "%s has %zu tensors: got %zu offsets "
                        "and %zu handles", kvt_layout_kind_name((kvt_layout_kind)l->kind),
                        want, m->n_offsets, m->n_ipc_handles);
    if (q->chunk_tokens == 0 || l->block_size == 0 || q->chunk_tokens % l->block_size)
        return req_fail(r, KVT_EINVAL, "chunk_tokens %u is not a positive "
                        "multiple of block_size %u", q->chunk_tokens, l->block_size);
    char why[128];
    kvt_err ne = ns_admit(k->env.ns, q->ns, pipe, k->env.cfg->ns_per_client, why,
                          sizeof why);
    if (ne != KVT_OK) return req_fail(r, ne, "%s", why);
    if (regs_of(k, pipe) >= KVC_MAX_REGS)
        return req_fail(r, KVT_ETOOBIG, "this connection already has %d "
                        "KV-cache registrations", KVC_MAX_REGS);
    if (!k->env.pipe_alive(k->env.core, pipe))
        return req_fail(r, KVT_ECLOSED, "client connection is gone");
    return KVT_OK;
}

static void params_of(const Kvtier__KvLayout *l, const uint64_t *bases,
                      size_t n, kvt_layout_params *p)
{
    memset(p, 0, sizeof *p);
    p->kind = (kvt_layout_kind)l->kind;
    p->num_layers = l->num_layers;
    p->num_blocks = l->num_blocks;
    p->block_size = l->block_size;
    p->num_kv_heads = l->num_kv_heads;
    p->head_size = l->head_size;
    p->elem_size = l->elem_size;
    p->bases = bases;
    p->n_bases = n;
    p->num_kv = l->num_kv;
    p->block_stride = l->block_stride;
    p->token_stride = l->token_stride;
    p->head_stride = l->head_stride;
}

static kvt_err layout_init(struct req *r, struct kvc_reg *g,
                           const Kvtier__KvLayout *l, const uint64_t *bases,
                           size_t n)
{
    kvt_layout_params p;
    params_of(l, bases, n, &p);
    kvt_err e = kvt_layout_init(&g->lay, &p);
    if (e != KVT_OK)
        return req_fail(r, e, "bad %s layout (layers %u, blocks %u, block %u, "
                        "heads %u, head %u, elem %u): %s",
                        kvt_layout_kind_name(p.kind), l->num_layers, l->num_blocks,
                        l->block_size, l->num_kv_heads, l->head_size,
                        l->elem_size, kvt_strerror(e));
    g->lay.cpu_threads = 1; /* workers are the parallelism (and SIGBUS-safe) */
    return KVT_OK;
}

/* An O_PATH descriptor of path, resolved without following any symlink
 * (any component: RESOLVE_NO_SYMLINKS; only the last where the kernel
 * has no openat2). Opens nothing: a device or fifo is never opened. */
static int path_fd(const char *path)
{
    /* No O_NOFOLLOW here: a final symlink then fails (ELOOP) like any. */
    struct open_how how = {.flags = O_PATH | O_CLOEXEC,
                           .resolve = RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS};
    int fd = (int)syscall(SYS_openat2, AT_FDCWD, path, &how, sizeof how);
    if (fd < 0 && errno == ENOSYS)
        fd = open(path, O_PATH | O_NOFOLLOW | O_CLOEXEC);
    return fd;
}

/* The rule (kvcache.c design): a regular file, non-empty, reached without
 * a symlink, owned by the peer's uid and readable and writable by its
 * owner -- a file the client could open read-write itself, or make so
 * with chmod. Anything else is refused before it is opened. */
static kvt_err host_file_ok(struct req *r, const struct stat *st,
                            uint64_t uid, const char *path)
{
    if (!S_ISREG(st->st_mode) || st->st_size <= 0)
        return req_fail(r, KVT_EINVAL, "%s is not a non-empty regular file", path);
    if (st->st_uid != uid)
        return req_fail(r, KVT_EPERM, "%s belongs to uid %u, not to the "
                        "client's uid %llu", path, (unsigned)st->st_uid,
                        (unsigned long long)uid);
    if ((st->st_mode & (S_IRUSR | S_IWUSR)) != (S_IRUSR | S_IWUSR))
        return req_fail(r, KVT_EPERM, "%s is not readable and writable by "
                        "its owner (mode %03o)", path, (unsigned)(st->st_mode & 0777));
    return KVT_OK;
}

/* Open and check the engine's file; fd or -1 with the response failed. */
static int host_open(struct req *r, struct kvc *k, const char *path,
                     uint32_t pipe, uint64_t *size)
{
    uint64_t uid;
    struct stat st;
    char proc[64];
    if (k->env.peer_uid(k->env.core, pipe, &uid) != 0) {
        req_fail(r, KVT_ENOTSUP, "host-memory registration needs a local "
                 "connection (the daemon checks the peer's uid)");
        return -1;
    }
    int pfd = path_fd(path), fd = -1;
    if (pfd < 0) {
        kvt_err e = errno == ENOENT ? KVT_ENOENT
                  : errno == EACCES || errno == EPERM ? KVT_EPERM : KVT_EINVAL;
        req_fail(r, e, "cannot open %s: %s", path,
                 errno == ELOOP ? "a symlink on the way" : strerror(errno));
        return -1;
    }
    if (fstat(pfd, &st) != 0) st.st_mode = 0;
    if (host_file_ok(r, &st, uid, path) == KVT_OK) {
        /* The checked inode itself, re-opened through its descriptor. */
        snprintf(proc, sizeof proc, "/proc/self/fd/%d", pfd);
        fd = open(proc, O_RDWR | O_NOCTTY | O_NONBLOCK | O_CLOEXEC);
        if (fd < 0)
            req_fail(r, KVT_EPERM, "cannot open %s: %s", path, strerror(errno));
    }
    close(pfd);
    if (fd >= 0) *size = (uint64_t)st.st_size;
    return fd;
}

/* Every tensor inside the file. */
static kvt_err host_bounds(struct req *r, const struct kvc_reg *g,
                           const uint64_t *off, size_t n, const char *path)
{
    for (size_t i = 0; i < n; i++)
        if (off[i] > g->map_len || g->lay.tensor_bytes > g->map_len - off[i])
            return req_fail(r, KVT_EINVAL, "tensor %zu (%llu bytes at offset "
                            "%llu) does not fit in %s (%zu bytes)", i,
                            (unsigned long long)g->lay.tensor_bytes,
                            (unsigned long long)off[i], path, g->map_len);
    return KVT_OK;
}

static kvt_err reg_host(struct req *r, struct kvc *k, struct kvc_reg *g,
                        uint32_t pipe, const Kvtier__RegisterKvCache *q)
{
    const Kvtier__KvMemory *m = q->memory;
    uint64_t size, bases[KVT_LAYOUT_MAX_LAYERS * 2];
    int fd = host_open(r, k, m->shm_path, pipe, &size);
    if (fd < 0) return KVT_EINVAL;
    void *map = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (map == MAP_FAILED)
        return req_fail(r, KVT_EIO, "cannot map %s: %s", m->shm_path, strerror(errno));
    g->mem = KVC_MEM_HOST;
    g->map = map;
    g->map_len = size;
    for (size_t i = 0; i < m->n_offsets; i++) {
        if (m->offsets[i] >= size)
            return req_fail(r, KVT_EINVAL, "tensor %zu: offset %llu is past the "
                            "end of %s (%llu bytes)", i,
                            (unsigned long long)m->offsets[i], m->shm_path,
                            (unsigned long long)size);
        bases[i] = (uint64_t)(uintptr_t)map + m->offsets[i];
    }
    kvt_err e = layout_init(r, g, q->layout, bases, m->n_offsets);
    return e ? e : host_bounds(r, g, m->offsets, m->n_offsets, m->shm_path);
}

/* Every tensor inside the allocation its IPC handle opened: a client's
 * offset can reach nothing of the daemon's address space but what it
 * exported itself. One text for every failure, so a refusal tells the
 * client nothing about what is mapped where. */
static kvt_err ipc_bounds(struct req *r, struct kvc *k, const struct kvc_reg *g,
                          const uint64_t *off, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        uint64_t base = 0, size = 0;
        uint64_t at = (uint64_t)(uintptr_t)g->ipc[i]->ptr;
        int in = kvt_gpu_mem_range(k->gpu, g->device, g->ipc[i]->ptr, &base,
                                   &size) == KVT_OK &&
                 at >= base && at - base <= size &&
                 off[i] <= size - (at - base) &&
                 g->lay.tensor_bytes <= size - (at - base) - off[i];
        if (!in)
            return req_fail(r, KVT_EINVAL, "tensor %zu (%llu bytes at offset "
                            "%llu) does not lie inside its IPC allocation", i,
                            (unsigned long long)g->lay.tensor_bytes,
                            (unsigned long long)off[i]);
    }
    return KVT_OK;
}

static kvt_err reg_cuda(struct req *r, struct kvc *k, struct kvc_reg *g,
                        const Kvtier__RegisterKvCache *q)
{
    const Kvtier__KvMemory *m = q->memory;
    uint64_t bases[KVT_LAYOUT_MAX_LAYERS * 2];
    if (!k->gpu)
        return req_fail(r, KVT_ENOTSUP, "GPU registration needs CUDA in "
                        "kvtierd; GPU transfers are %s", k->gpu_status);
    if (m->device < 0 || m->device >= kvt_gpu_device_count(k->gpu))
        return req_fail(r, KVT_EINVAL, "device %d: kvtierd sees %d", m->device,
                        kvt_gpu_device_count(k->gpu));
    g->mem = KVC_MEM_CUDA;
    g->device = m->device;
    for (size_t i = 0; i < m->n_ipc_handles; i++) {
        if (m->ipc_handles[i].len != KVT_CUDA_IPC_HANDLE_LEN)
            return req_fail(r, KVT_EINVAL, "IPC handle %zu is %zu bytes, want %d",
                            i, m->ipc_handles[i].len, KVT_CUDA_IPC_HANDLE_LEN);
        kvt_err e = ipc_get(k, m->device, m->ipc_handles[i].data, &g->ipc[i]);
        if (e != KVT_OK)
            return req_fail(r, e, "cannot open IPC handle %zu: %s", i,
                            kvt_gpu_last_error(k->gpu));
        g->n_ipc = (uint32_t)i + 1;
        bases[i] = (uint64_t)(uintptr_t)g->ipc[i]->ptr + m->offsets[i];
    }
    kvt_err e = layout_init(r, g, q->layout, bases, m->n_offsets);
    if (e == KVT_OK) e = ipc_bounds(r, k, g, m->offsets, m->n_offsets);
    if (e == KVT_OK && kvt_gpu_check_layout(k->gpu, g->device, &g->lay) != KVT_OK)
        e = req_fail(r, KVT_EINVAL, "tensors not usable from device %d: %s",
                     g->device, kvt_gpu_last_error(k->gpu));
    return e;
}

static kvt_err reg_chunking(struct req *r, const struct kvc *k, struct kvc_reg *g,
                            uint32_t chunk_tokens)
{
    g->bpc = chunk_tokens / g->lay.block_size;
    g->chunk_bytes = kvt_layout_chunk_bytes(&g->lay, chunk_tokens);
    if (g->bpc > g->lay.num_blocks)
        return req_fail(r, KVT_EINVAL, "a chunk of %u blocks does not fit in "
                        "%u blocks", g->bpc, g->lay.num_blocks);
    if (g->chunk_bytes == 0 || g->chunk_bytes > k->env.cfg->max_chunk_bytes)
        return req_fail(r, KVT_ETOOBIG, "a chunk of %u tokens is %llu bytes: "
                        "over max_chunk_bytes (%llu)", chunk_tokens,
                        (unsigned long long)g->chunk_bytes,
                        (unsigned long long)k->env.cfg->max_chunk_bytes);
    return KVT_OK;
}

static void reg_respond(struct req *r, const struct kvc_reg *g,
                        Kvtier__Response *rsp)
{
    Kvtier__RegisterKvCacheResp *rr = req_alloc(r, sizeof *rr);
    kvtier__register_kv_cache_resp__init(rr);
    rr->reg = g->id;
    rr->chunk_bytes = g->chunk_bytes;
    rr->blocks_per_chunk = g->bpc;
    rr->shape = req_alloc(r, 64);
    kvt_layout_shape_str(&g->lay, rr->shape, 64);
    rsp->body_case = KVTIER__RESPONSE__BODY_REGISTER_KV_CACHE;
    rsp->register_kv_cache = rr;
}

void kvc_do_register(struct req *r, struct kvc *k, uint32_t pipe,
                     const Kvtier__RegisterKvCache *q, Kvtier__Response *rsp)
{
    if (reg_check(r, k, pipe, q) != KVT_OK) return;
    struct kvc_reg *g = xcalloc(1, sizeof *g);
    int host = q->memory->shm_path && q->memory->shm_path[0];
    kvt_err e = host ? reg_host(r, k, g, pipe, q) : reg_cuda(r, k, g, q);
    if (e == KVT_OK) e = reg_chunking(r, k, g, q->chunk_tokens);
    if (e != KVT_OK) {
        reg_release_mem(k, g);
        free(g);
        return;
    }
    g->id = kvc_new_id(k);
    g->pipe = pipe;
    g->refs = 1;
    g->ns = strdup(q->ns);
    if (!g->ns) abort();
    g->ns_id = ns_claim(k->env.ns, q->ns, pipe); /* admitted above */
    ns_hold(k->env.ns, g->ns_id); /* SAVE finds it there while registered */
    g->next = k->regs;
    k->regs = g;
    k->n_regs++;
    log_debug("kvcache", "pipe %u: registration %llu: %s, %s, %u blocks", pipe,
              (unsigned long long)g->id, kvt_layout_kind_name(g->lay.kind),
              host ? q->memory->shm_path : "CUDA IPC", g->lay.num_blocks);
    reg_respond(r, g, rsp);
}

void kvc_do_unregister(struct req *r, struct kvc *k, uint32_t pipe,
                       const Kvtier__UnregisterKvCache *q, Kvtier__Response *rsp)
{
    struct kvc_reg *g = reg_own(r, k, pipe, q->reg);
    if (!g) return;
    reg_kill(k, g);
    Kvtier__CountResp *c = req_alloc(r, sizeof *c);
    kvtier__count_resp__init(c);
    c->count = 1;
    rsp->body_case = KVTIER__RESPONSE__BODY_COUNT;
    rsp->count = c;
}

/* ------------------------------------------------------------ transfers */

static const kvt_key *key_at(const Kvtier__KvTransfer *q, size_t i)
{
    return (const kvt_key *)q->keys[i].data;
}

static kvt_err check_ids(struct req *r, const kvt_layout *lay,
                         const int32_t *ids, size_t n, int unique)
{
    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0 || (uint32_t)ids[i] >= lay->num_blocks)
            return req_fail(r, KVT_EINVAL, "block id %d (entry %zu) is out of "
                            "range: the cache has %u blocks", ids[i], i,
                            lay->num_blocks);
    kvt_err e = kvt_layout_check_blocks(lay, ids, n, unique);
    if (e != KVT_OK)
        return req_fail(r, e, "a LOAD names one block twice: nothing loaded");
    return KVT_OK;
}

static kvt_err check_transfer(struct req *r, struct kvc *k, uint32_t pipe,
                              const Kvtier__KvTransfer *q, int kind,
                              struct kvc_reg **out)
{
    if (!wire_ns_ok(q->ns))
        return req_fail(r, KVT_EINVAL, "bad namespace");
    if (q->n_keys == 0 || q->n_keys > k->env.cfg->max_keys)
        return req_fail(r, q->n_keys ? KVT_ETOOBIG : KVT_EINVAL, "%zu keys: "
                        "want 1-%llu", q->n_keys,
                        (unsigned long long)k->env.cfg->max_keys);
    for (size_t i = 0; i < q->n_keys; i++)
        if (!wire_key_ok(&q->keys[i]))
            return req_fail(r, KVT_EINVAL, "key %zu is %zu bytes, want %d", i,
                            q->keys[i].len, KVT_KEY_LEN);
    if (q->parent.len != 0 && !wire_key_ok(&q->parent))
        return req_fail(r, KVT_EINVAL, "parent key is %zu bytes", q->parent.len);
    struct kvc_reg *g = reg_own(r, k, pipe, q->reg);
    if (!g) return KVT_ENOENT;
    if (strcmp(q->ns, g->ns) != 0)
        return req_fail(r, KVT_EINVAL, "namespace %s does not match "
                        "registration %llu's (%s)", q->ns,
                        (unsigned long long)g->id, g->ns);
    if (q->n_block_ids != q->n_keys * g->bpc)
        return req_fail(r, KVT_EINVAL, "%zu block ids for %zu keys: want %u "
                        "per key", q->n_block_ids, q->n_keys, g->bpc);
    if (check_ids(r, &g->lay, q->block_ids, q->n_block_ids, kind == KVC_LOAD))
        return KVT_EINVAL;
    if (xfers_of(k, pipe) >= KVC_MAX_XFERS)
        return req_fail(r, KVT_EBUSY, "%d transfers not yet collected on this "
                        "connection: wait for some first", KVC_MAX_XFERS);
    *out = g;
    return KVT_OK;
}

/* A chunk cached (or being saved) under this key with another size. */
static kvt_err save_sizes(struct req *r, struct kvc *k, uint16_t ns,
                          const Kvtier__KvTransfer *q, uint64_t chunk_bytes)
{
    const struct tier_host *h = k->env.host;
    for (size_t i = 0; ns != NS_NONE && i < q->n_keys; i++) {
        uint32_t s = idx_find(h->idx, ns, key_at(q, i));
        if (s == IDX_NONE) continue;
        const struct idx_entry *e = idx_at(h->idx, s);
        if (e->state != IDX_DOOMED && e->size != chunk_bytes)
            return req_fail(r, KVT_EINVAL, "key %zu is cached as %llu bytes; "
                            "this registration's chunks are %llu bytes", i,
                            (unsigned long long)e->size,
                            (unsigned long long)chunk_bytes);
    }
    return KVT_OK;
}

static uint32_t parent_of(struct kvc *k, uint16_t ns,
                          const Kvtier__KvTransfer *q, size_t i)
{
    const struct tier_host *h = k->env.host;
    if (i > 0) return idx_find(h->idx, ns, key_at(q, i - 1));
    if (q->parent.len == 0) return IDX_NONE;
    return idx_find(h->idx, ns, (const kvt_key *)q->parent.data);
}

/* Reserve the new keys; on failure the caller settles x (frees them). */
static kvt_err save_reserve(struct req *r, struct kvc *k, uint16_t ns,
                            struct kvc_xfer *x, const Kvtier__KvTransfer *q)
{
    const struct tier_host *h = k->env.host;
    const struct kvc_reg *g = x->reg;
    for (uint32_t i = 0; i < x->n; i++) {
        uint32_t have = idx_find(h->idx, ns, key_at(q, i));
        uint32_t p = parent_of(k, ns, q, i);
        x->parent[i] = p;
        x->pgen[i] = p == IDX_NONE ? 0 : idx_at(h->idx, p)->gen;
        if (have != IDX_NONE && idx_at(h->idx, have)->state != IDX_DOOMED)
            continue; /* cached or being saved: skip */
        kvt_err e = h->reserve(h->core, ns, key_at(q, i), g->chunk_bytes,
                               &x->slot[i]);
        if (e != KVT_OK)
            return req_fail(r, e, "cannot reserve %llu bytes for chunk %u: %s",
                            (unsigned long long)g->chunk_bytes, i, kvt_strerror(e));
        uint32_t j = x->n_move++;
        x->chunk[j] = th_ptr(h, x->slot[i]);
        if (g->mem == KVC_MEM_CUDA && k->hbm && g->device == k->hbm->device)
            x->hent[j] = kvh_reserve(k, x->slot[i],
                                     idx_at(h->idx, x->slot[i])->gen, g->chunk_bytes);
        memcpy(x->ids + (size_t)j * g->bpc, q->block_ids + (size_t)i * g->bpc,
               g->bpc * sizeof *x->ids);
    }
    return KVT_OK;
}

static kvt_err save_prepare(struct req *r, struct kvc *k, struct kvc_xfer *x,
                            const Kvtier__KvTransfer *q)
{
    uint16_t ns = ns_find(k->env.ns, q->ns); /* interned by the registration */
    if (ns == NS_NONE) {
        log_error("kvcache", "namespace %s of registration %llu is missing",
                  q->ns, (unsigned long long)x->reg->id);
        abort(); /* broken invariant */
    }
    if (save_sizes(r, k, ns, q, x->reg->chunk_bytes) != KVT_OK) return KVT_EINVAL;
    return save_reserve(r, k, ns, x, q);
}

/* Every key cached now, at the registration's chunk size; then pin. */
static kvt_err load_prepare(struct req *r, struct kvc *k, struct kvc_xfer *x,
                            const Kvtier__KvTransfer *q)
{
    const struct tier_host *h = k->env.host;
    const struct kvc_reg *g = x->reg;
    uint16_t ns = ns_find(k->env.ns, q->ns);
    uint32_t *slot = req_alloc(r, x->n * sizeof *slot);
    for (uint32_t i = 0; i < x->n; i++) {
        uint32_t s = ns == NS_NONE ? IDX_NONE : idx_find(h->idx, ns, key_at(q, i));
        if (s == IDX_NONE || idx_at(h->idx, s)->state != IDX_READY)
            return req_fail(r, KVT_ENOENT, "key %u of %u is not cached: nothing "
                            "loaded", i, x->n);
        if (!th_in_dram(h, s)) /* NVMe only: GET or LOOKUP prefetch first */
            return req_fail(r, KVT_ENOENT, "key %u of %u is on NVMe only (LOOKUP "
                            "with prefetch brings it up): nothing loaded", i, x->n);
        if (idx_at(h->idx, s)->size != g->chunk_bytes)
            return req_fail(r, KVT_EINVAL, "key %u is cached as %llu bytes; this "
                            "registration's chunks are %llu bytes (layout or "
                            "chunk_tokens differ): nothing loaded", i,
                            (unsigned long long)idx_at(h->idx, s)->size,
                            (unsigned long long)g->chunk_bytes);
        slot[i] = s;
    }
    memcpy(x->slot, slot, x->n * sizeof *slot);
    uint64_t now = h->clock_ms(h->core);
    for (uint32_t i = 0; i < x->n; i++) {
        idx_pin(h->idx, x->slot[i]);
        idx_touch(h->idx, x->slot[i], now);
        x->chunk[i] = th_ptr(h, x->slot[i]);
        x->csum[i] = idx_at(h->idx, x->slot[i])->csum;
        if (g->mem == KVC_MEM_CUDA && (x->hent[i] = kvh_find(k, x->slot[i], g->device))) {
            x->hent[i]->pins++;
            x->chunk[i] = x->hent[i]->dev; /* device to device */
        }
    }
    memcpy(x->ids, q->block_ids, q->n_block_ids * sizeof *x->ids);
    x->n_move = x->n;
    return KVT_OK;
}

void kvc_do_transfer(struct req *r, struct kvc *k, uint32_t pipe,
                     const Kvtier__KvTransfer *q, int kind, Kvtier__Response *rsp)
{
    struct kvc_reg *g = NULL;
    if (check_transfer(r, k, pipe, q, kind, &g) != KVT_OK) return;
    struct kvc_xfer *x = xfer_new(k, pipe, kind, g, (uint32_t)q->n_keys);
    kvt_err e = kind == KVC_SAVE ? save_prepare(r, k, x, q) : load_prepare(r, k, x, q);
    if (e != KVT_OK) {
        kvc_xfer_settle(k, x, e); /* releases what was reserved */
        kvc_xfer_free(k, x);
        return;
    }
    Kvtier__KvTransferResp *tr = req_alloc(r, sizeof *tr);
    kvtier__kv_transfer_resp__init(tr);
    tr->xfer = x->id;
    tr->n_chunks = x->n_move;
    tr->n_skipped = x->n - x->n_move;
    rsp->body_case = KVTIER__RESPONSE__BODY_KV_TRANSFER;
    rsp->kv_transfer = tr;
    if (x->n_move == 0) kvc_xfer_settle(k, x, KVT_OK); /* all cached already */
    else kvc_pool_push(k, x);
}

/* ------------------------------------------------------ pipes and stats */

static void drop_xfer(struct kvc *k, struct kvc_xfer *x)
{
    if (x->state == KVC_DONE) {
        kvc_xfer_free(k, x);
    } else if (kvc_pool_unqueue(k, x)) {
        kvc_xfer_settle(k, x, KVT_ECLOSED);
        kvc_xfer_free(k, x);
    } else { /* a worker has it: settled and freed when it hands it back */
        x->orphan = 1;
        atomic_store(&x->cancel, 1);
    }
}

void kvc_pipe_removed(struct kvc *k, uint32_t pipe)
{
    if (!k) return;
    for (int b = 0; b < KVC_XFER_BUCKETS; b++) {
        struct kvc_xfer *x = k->xb[b];
        while (x) {
            struct kvc_xfer *next = x->hnext;
            if (x->pipe == pipe && !x->orphan) drop_xfer(k, x);
            x = next;
        }
    }
    struct kvc_reg *g = k->regs;
    while (g) {
        struct kvc_reg *next = g->next;
        if (g->pipe == pipe) reg_kill(k, g);
        g = next;
    }
}

void kvc_fill_stats(const struct kvc *k, Kvtier__StatsResp *s)
{
    if (!k) return;
    s->kv_registrations = k->n_regs;
    s->kv_transfers = k->n_xfers;
    s->kv_saved_chunks = k->st.saved;
    s->kv_loaded_chunks = k->st.loaded;
    s->kv_failed = k->st.failed;
    s->kv_hbm_loaded_chunks = k->st.hbm_loaded;
    s->kv_hbm_demoted = k->st.hbm_demoted;
    if (k->hbm) {
        struct tier_usage u;
        k->hbm->tier.ops->usage(&k->hbm->tier, &u);
        s->hbm_bytes = u.capacity;
        s->hbm_used = u.used;
    }
}

const char *kvc_gpu_status(const struct kvc *k)
{
    return k ? k->gpu_status : "unavailable: not started";
}

uint64_t kvc_unfinished(const struct kvc *k)
{
    return k ? k->n_xfers + k->n_waiters : 0;
}

/* ------------------------------------------------------- start and stop */

/* k->gpu_status says what a client can expect of GPU registrations. */
static void gpu_open(struct kvc *k)
{
    const struct dram *pool = k->env.host->dram;
    char why[KVC_GPU_STATUS - 16];
    kvt_err e = kvt_gpu_open(NULL, &k->gpu, why, sizeof why);
    if (e == KVT_OK && kvt_gpu_host_register(k->gpu, pool->base,
                                             pool->bytes) != KVT_OK) {
        snprintf(why, sizeof why, "cannot register the DRAM pool with CUDA: %s",
                 kvt_gpu_last_error(k->gpu));
        kvt_gpu_close(k->gpu);
        k->gpu = NULL;
        e = KVT_ENOTSUP;
    }
    if (e != KVT_OK) {
        snprintf(k->gpu_status, sizeof k->gpu_status, "unavailable: %s", why);
        return;
    }
    k->pool_registered = 1;
    snprintf(k->gpu_status, sizeof k->gpu_status, "available: %d device(s)",
             kvt_gpu_device_count(k->gpu));
}

static int hbm_start(struct kvc *k)
{
    char err[256];
    uint64_t bytes = k->env.cfg->hbm_bytes;
    if (bytes == 0) return 0;
    if (!k->gpu) {
        log_error("hbm", "hbm_bytes = %llu asks for an HBM tier, but GPU "
                  "transfers are %s; set hbm_bytes = 0 to run without it",
                  (unsigned long long)bytes, k->gpu_status);
        return -1;
    }
    if (hbm_open(kvt_gpu_ops(k->gpu), kvt_gpu_ctx(k->gpu), 0, bytes,
                 &k->hbm, err, sizeof err) != KVT_OK) {
        log_error("hbm", "%s", err);
        return -1;
    }
    log_info("hbm", "HBM tier: %llu MiB on device 0",
             (unsigned long long)(k->hbm->bytes >> 20));
    return 0;
}

static void fault_hooks(struct kvc *k)
{
    const char *v = getenv("KVT_FAULT_KV_DELAY_MS");
    if (v && v[0]) {
        k->fault_delay_ms = (unsigned)strtoul(v, NULL, 10);
        log_warn("kvcache", "fault injection: %u ms delay per chunk copied",
                 k->fault_delay_ms);
    }
}

int kvc_open(const struct kvc_env *env, struct kvc **out)
{
    struct kvc *k = xcalloc(1, sizeof *k);
    *out = k;
    k->env = *env;
    gpu_open(k);
    log_info("kvcache", "GPU transfers %s", k->gpu_status);
    if (hbm_start(k) != 0) return -1;
    fault_hooks(k);
    kvc_sigbus_install();
    dram_guard(env->host->dram); /* after: it chains to the workers' guard */
    if (kvc_pool_start(k) != 0) {
        log_error("kvcache", "cannot start the transfer workers");
        return -1;
    }
    return 0;
}

void kvc_close(struct kvc *k)
{
    if (!k) return;
    for (int b = 0; b < KVC_XFER_BUCKETS; b++)
        for (struct kvc_xfer *x = k->xb[b]; x; x = x->hnext)
            atomic_store(&x->cancel, 1);
    kvc_pool_stop(k);
    kvc_wait_close(k);
    for (int b = 0; b < KVC_XFER_BUCKETS; b++)
        while (k->xb[b]) {
            kvc_xfer_settle(k, k->xb[b], KVT_ECLOSED);
            kvc_xfer_free(k, k->xb[b]);
        }
    while (k->regs) {
        struct kvc_reg *g = k->regs;
        g->refs = 1;
        kvc_reg_unref(k, g);
    }
    if (k->hbm) kvh_close(k);
    hbm_close(k->hbm);
    if (k->pool_registered) kvt_gpu_host_unregister(k->gpu, k->env.host->dram->base);
    kvt_gpu_close(k->gpu);
    free(k);
}
