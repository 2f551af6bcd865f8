/*
 * fake_cuda.c -- libkvtier_fakecuda.so: the kvt_cuda_ops table of
 * kvt_cuda_api.h done on the CPU, so that machines without a GPU still
 * drive kvtierd's GPU code paths (GPU registrations, the workers' CUDA
 * branch, the HBM tier) in `make test`. Tests point KVT_CUDA_LIB at it.
 *
 * Design: "device memory" is host memory and every pointer is reachable,
 * as with unified addressing. dev_alloc backs each allocation with its own
 * shared-memory file, and a CUDA IPC handle is that file's path, NUL-
 * padded to 64 bytes: ipc_get gives it for an allocation, ipc_open maps
 * it, so an engine in another process hands its tensors over exactly as a
 * GPU engine hands its cudaIpcMemHandle_t (tests may also write a handle
 * by hand for any file). gather/scatter run the CPU
 * reference chunk by chunk and complete at once (sync has nothing to
 * wait for). The real library's contract holds: everything is validated
 * before anything is written.
 *
 * Faults: a comma-separated list of entry names ("open", "host_register",
 * "dev_alloc", "stream_create", "check_layout", "ipc_open", "mem_range",
 * "gather", "scatter", "memcpy", "sync") that fail, taken from $KVT_FAKE_CUDA_FAIL
 * or else from the file $KVT_FAKE_CUDA_FAIL_FILE names, read at every
 * call: a test switches faults in a running daemon by rewriting the file.
 * Only the entry point kvt_cuda_ops_get is exported.
 */
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kvt_cuda_api.h"

#define FK_MAPS 1024

struct kvt_cuda_ctx {
    int devices;
};

struct kvt_cuda_stream {
    int device;
};

static __thread char fk_err[160] = "no error";

/* Mappings: of ipc_open (path empty) and of dev_alloc (path set). */
static pthread_mutex_t fk_mtx = PTHREAD_MUTEX_INITIALIZER; /* guards fk_map */
static struct {
    void *p;
    size_t len;
    char path[KVT_CUDA_IPC_HANDLE_LEN];
} fk_map[FK_MAPS];

/* Remember a mapping; 0, or -1 when the table is full. */
static int fk_remember(void *p, size_t len, const char *path)
{
    int rc = -1;
    pthread_mutex_lock(&fk_mtx);
    for (int i = 0; i < FK_MAPS && rc; i++)
        if (!fk_map[i].p) {
            fk_map[i].p = p;
            fk_map[i].len = len;
            snprintf(fk_map[i].path, sizeof fk_map[i].path, "%s", path);
            rc = 0;
        }
    pthread_mutex_unlock(&fk_mtx);
    return rc;
}

/* Forget p (unmapping it, and removing a dev_alloc file); 0 or -1. */
static int fk_forget(void *p)
{
    int rc = -1;
    pthread_mutex_lock(&fk_mtx);
    for (int i = 0; i < FK_MAPS && rc; i++)
        if (fk_map[i].p == p) {
            munmap(p, fk_map[i].len);
            if (fk_map[i].path[0]) unlink(fk_map[i].path);
            fk_map[i].p = NULL;
            rc = 0;
        }
    pthread_mutex_unlock(&fk_mtx);
    return rc;
}

/* Map path (size len, created if create) read-write. */
static void *fk_map_file(const char *path, size_t *len, int create)
{
    struct stat st;
    int fd = open(path, O_RDWR | O_CLOEXEC | (create ? O_CREAT | O_EXCL : 0), 0600);
    if (fd < 0) return NULL;
    if (create && ftruncate(fd, (off_t)*len) != 0) {
        close(fd);
        return NULL;
    }
    if (!create && (fstat(fd, &st) != 0 || st.st_size <= 0)) {
        close(fd);
        return NULL;
    }
    if (!create) *len = (size_t)st.st_size;
    void *p = mmap(NULL, *len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    return p == MAP_FAILED ? NULL : p;
}

/* The fault list: the variable, or the file's first line. */
static const char *fk_fault_list(char *buf, size_t len)
{
    const char *v = getenv("KVT_FAKE_CUDA_FAIL"), *f = getenv("KVT_FAKE_CUDA_FAIL_FILE");
    if (v || !f) return v;
    FILE *fp = fopen(f, "r");
    buf[0] = '\0';
    if (fp) {
        if (!fgets(buf, (int)len, fp)) buf[0] = '\0';
        fclose(fp);
    }
    buf[strcspn(buf, "\n")] = '\0';
    return buf;
}

/* 1 if the test asked op to fail (and say so in last_error). */
static int fk_fails(const char *op)
{
    char buf[256];
    const char *v = fk_fault_list(buf, sizeof buf);
    size_t n = strlen(op);
    for (const char *p = v; p && *p;) {
        if (strncmp(p, op, n) == 0 && (p[n] == ',' || p[n] == '\0')) {
            snprintf(fk_err, sizeof fk_err, "fake CUDA: %s failed (injected)", op);
            return 1;
        }
        p = strchr(p, ',');
        if (p) p++;
    }
    return 0;
}

static kvt_err fk_open(kvt_cuda_ctx **out, char *why, size_t why_len)
{
    if (fk_fails("open")) {
        snprintf(why, why_len, "fake CUDA: no device (injected)");
        return KVT_ENOTSUP;
    }
    kvt_cuda_ctx *c = calloc(1, sizeof *c);
    if (!c) return KVT_ENOMEM;
    c->devices = 1;
    *out = c;
    return KVT_OK;
}

static void fk_close(kvt_cuda_ctx *c) { free(c); }
static int fk_device_count(const kvt_cuda_ctx *c) { return c->devices; }
static const char *fk_last_error(void) { return fk_err; }

static kvt_err fk_stream_create(kvt_cuda_ctx *c, int device, kvt_cuda_stream **out)
{
    if (device < 0 || device >= c->devices) return KVT_EINVAL;
    if (fk_fails("stream_create")) return KVT_EIO;
    kvt_cuda_stream *s = calloc(1, sizeof *s);
    if (!s) return KVT_ENOMEM;
    s->device = device;
    *out = s;
    return KVT_OK;
}

static kvt_err fk_stream_wrap(kvt_cuda_ctx *c, int device, void *cs,
                              kvt_cuda_stream **out)
{
    (void)cs;
    return fk_stream_create(c, device, out);
}

static void fk_stream_destroy(kvt_cuda_ctx *c, kvt_cuda_stream *s)
{
    (void)c;
    free(s);
}

static kvt_err fk_sync(kvt_cuda_ctx *c, kvt_cuda_stream *s)
{
    (void)c, (void)s;
    return fk_fails("sync") ? KVT_EIO : KVT_OK;
}

static kvt_err fk_host_alloc(kvt_cuda_ctx *c, size_t len, void **out)
{
    (void)c;
    return (*out = malloc(len ? len : 1)) ? KVT_OK : KVT_ENOSPC;
}

static kvt_err fk_free(kvt_cuda_ctx *c, void *p)
{
    (void)c;
    free(p);
    return KVT_OK;
}

static kvt_err fk_host_register(kvt_cuda_ctx *c, void *p, size_t len)
{
    (void)c, (void)p, (void)len;
    return fk_fails("host_register") ? KVT_ENOSPC : KVT_OK;
}

static kvt_err fk_host_unregister(kvt_cuda_ctx *c, void *p)
{
    (void)c, (void)p;
    return KVT_OK;
}

static kvt_err fk_dev_alloc(kvt_cuda_ctx *c, int device, size_t len, void **out)
{
    static unsigned serial;
    char path[KVT_CUDA_IPC_HANDLE_LEN];
    if (device < 0 || device >= c->devices) return KVT_EINVAL;
    if (fk_fails("dev_alloc")) return KVT_ENOSPC;
    snprintf(path, sizeof path, "/dev/shm/kvt-fakecuda-%d-%u", (int)getpid(),
             __atomic_fetch_add(&serial, 1, __ATOMIC_RELAXED));
    size_t n = len ? len : 1;
    void *p = fk_map_file(path, &n, 1);
    if (!p || fk_remember(p, n, path) != 0) {
        if (p) munmap(p, n);
        unlink(path);
        return KVT_ENOSPC;
    }
    *out = p;
    return KVT_OK;
}

static kvt_err fk_dev_free(kvt_cuda_ctx *c, void *p)
{
    (void)c;
    return fk_forget(p) == 0 ? KVT_OK : KVT_EINVAL;
}

static kvt_err fk_memcpy_async(kvt_cuda_ctx *c, void *dst, const void *src,
                               size_t len, kvt_cuda_stream *s)
{
    (void)c, (void)s;
    if (fk_fails("memcpy")) return KVT_EIO;
    memcpy(dst, src, len);
    return KVT_OK;
}

static kvt_err fk_memset_async(kvt_cuda_ctx *c, void *dst, int byte, size_t len,
                               kvt_cuda_stream *s)
{
    (void)c, (void)s;
    memset(dst, byte, len);
    return KVT_OK;
}

static kvt_err fk_check_layout(kvt_cuda_ctx *c, int device, const kvt_layout *d)
{
    (void)d;
    if (device < 0 || device >= c->devices) return KVT_EINVAL;
    return fk_fails("check_layout") ? KVT_EINVAL : KVT_OK;
}

/* Validate everything, as the real kernels' wrappers do, before copying. */
static kvt_err fk_check(const kvt_layout *d, const int32_t *ids, size_t n,
                        size_t bpc, size_t chunk_len, int unique)
{
    if (!d || !ids || n == 0 || bpc == 0 || n % bpc) return KVT_EINVAL;
    if (chunk_len != kvt_layout_chunk_bytes(d, bpc * d->block_size)) return KVT_EINVAL;
    return kvt_layout_check_blocks(d, ids, n, unique);
}

static kvt_err fk_gather(kvt_cuda_ctx *c, const kvt_layout *d, const int32_t *ids,
                         size_t n, size_t bpc, void *const *chunks, size_t len,
                         kvt_cuda_stream *s)
{
    (void)c, (void)s;
    kvt_err e = fk_check(d, ids, n, bpc, len, 0);
    if (e != KVT_OK) return e;
    if (fk_fails("gather")) return KVT_EIO;
    for (size_t i = 0; i < n / bpc && e == KVT_OK; i++)
        e = kvt_gather_cpu(d, ids + i * bpc, bpc, chunks[i], len);
    return e;
}

static kvt_err fk_scatter(kvt_cuda_ctx *c, const kvt_layout *d, const int32_t *ids,
                          size_t n, size_t bpc, const void *const *chunks,
                          size_t len, kvt_cuda_stream *s)
{
    (void)c, (void)s;
    kvt_err e = fk_check(d, ids, n, bpc, len, 1);
    if (e != KVT_OK) return e;
    if (fk_fails("scatter")) return KVT_EIO;
    for (size_t i = 0; i < n / bpc && e == KVT_OK; i++)
        e = kvt_scatter_cpu(d, ids + i * bpc, bpc, chunks[i], len);
    return e;
}

static kvt_err fk_gather_staged(kvt_cuda_ctx *c, const kvt_layout *d,
                                const int32_t *ids, size_t n, size_t bpc,
                                void *const *chunks, size_t len, void *stage,
                                size_t stage_len, kvt_cuda_stream *s)
{
    (void)stage, (void)stage_len;
    return fk_gather(c, d, ids, n, bpc, chunks, len, s);
}

static kvt_err fk_scatter_staged(kvt_cuda_ctx *c, const kvt_layout *d,
                                 const int32_t *ids, size_t n, size_t bpc,
                                 const void *const *chunks, size_t len,
                                 void *stage, size_t stage_len, kvt_cuda_stream *s)
{
    (void)stage, (void)stage_len;
    return fk_scatter(c, d, ids, n, bpc, chunks, len, s);
}

/* The handle of a dev_alloc allocation (its base address only). */
static kvt_err fk_ipc_get(kvt_cuda_ctx *c, void *p, void *h, size_t len)
{
    (void)c;
    kvt_err e = KVT_EINVAL;
    if (len != KVT_CUDA_IPC_HANDLE_LEN) return e;
    pthread_mutex_lock(&fk_mtx);
    for (int i = 0; i < FK_MAPS && e; i++)
        if (fk_map[i].p == p && fk_map[i].path[0]) {
            memset(h, 0, len);
            memcpy(h, fk_map[i].path, strlen(fk_map[i].path));
            e = KVT_OK;
        }
    pthread_mutex_unlock(&fk_mtx);
    return e;
}

/* The handle names a file; map all of it. */
static kvt_err fk_ipc_open(kvt_cuda_ctx *c, int device, const void *h,
                           size_t len, void **out)
{
    char path[KVT_CUDA_IPC_HANDLE_LEN + 1];
    if (device < 0 || device >= c->devices || len != KVT_CUDA_IPC_HANDLE_LEN)
        return KVT_EINVAL;
    if (fk_fails("ipc_open")) return KVT_EIO;
    memcpy(path, h, len);
    path[len] = '\0';
    size_t n = 0;
    void *p = fk_map_file(path, &n, 0);
    if (!p) {
        snprintf(fk_err, sizeof fk_err, "fake CUDA: cannot open handle %.64s", path);
        return KVT_EINVAL;
    }
    if (fk_remember(p, n, "") != 0) {
        munmap(p, n);
        return KVT_ENOSPC;
    }
    *out = p;
    return KVT_OK;
}

static kvt_err fk_ipc_close(kvt_cuda_ctx *c, void *p)
{
    (void)c;
    return fk_forget(p) == 0 ? KVT_OK : KVT_EINVAL;
}

/* cuMemGetAddressRange over the mappings: the one holding p. */
static kvt_err fk_mem_range(kvt_cuda_ctx *c, int device, const void *p,
                            uint64_t *base, uint64_t *size)
{
    kvt_err e = KVT_EINVAL;
    if (device < 0 || device >= c->devices) return KVT_EINVAL;
    if (fk_fails("mem_range")) return KVT_EIO;
    const char *q = p;
    pthread_mutex_lock(&fk_mtx);
    for (int i = 0; i < FK_MAPS && e != KVT_OK; i++) {
        const char *b = fk_map[i].p;
        if (b && q >= b && q < b + fk_map[i].len) {
            *base = (uint64_t)(uintptr_t)b;
            *size = fk_map[i].len;
            e = KVT_OK;
        }
    }
    pthread_mutex_unlock(&fk_mtx);
    if (e != KVT_OK) snprintf(fk_err, sizeof fk_err, "fake CUDA: not an allocation");
    return e;
}

static const struct kvt_cuda_ops fk_ops = {
    .abi_version = KVT_CUDA_ABI_VERSION,
    .layout_size = sizeof(kvt_layout),
    .open = fk_open,
    .close = fk_close,
    .device_count = fk_device_count,
    .last_error = fk_last_error,
    .stream_create = fk_stream_create,
    .stream_wrap = fk_stream_wrap,
    .stream_destroy = fk_stream_destroy,
    .sync = fk_sync,
    .host_alloc = fk_host_alloc,
    .host_free = fk_free,
    .host_register = fk_host_register,
    .host_unregister = fk_host_unregister,
    .dev_alloc = fk_dev_alloc,
    .dev_free = fk_dev_free,
    .memcpy_async = fk_memcpy_async,
    .memset_async = fk_memset_async,
    .check_layout = fk_check_layout,
    .gather = fk_gather,
    .scatter = fk_scatter,
    .gather_staged = fk_gather_staged,
    .scatter_staged = fk_scatter_staged,
    .ipc_get = fk_ipc_get,
    .ipc_open = fk_ipc_open,
    .ipc_close = fk_ipc_close,
    .mem_range = fk_mem_range,
};

__attribute__((visibility("default"))) const struct kvt_cuda_ops *
kvt_cuda_ops_get(void)
{
    return &fk_ops;
}
