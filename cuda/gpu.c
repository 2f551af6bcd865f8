/*
 * gpu.c -- find, load and check libkvtier_cuda.so (see gpu.h).
 *
 * Design: the search is a short fixed list of candidate paths (gpu.h),
 * tried in order with access(); only the first that exists is dlopened, so
 * the reason we report is about the library we meant to load, not about
 * the last place we happened to look. Every step that can fail on a
 * machine without CUDA turns into KVT_ENOTSUP plus a sentence; an ABI
 * mismatch (a stale library next to a newer daemon) is KVT_EPROTO. The
 * handle is opened RTLD_NODELETE: the CUDA runtime registers exit-time
 * handlers and must never be unmapped under them.
 */
#include "gpu.h"

#include <dlfcn.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define GPU_MAX_CANDIDATES 4

struct kvt_gpu {
    const struct kvt_cuda_ops *ops;
    kvt_cuda_ctx *ctx;
    char path[PATH_MAX];
};

/* Any object of this file: dladdr on it names the binary holding us. */
static const char gpu_anchor = 0;

static void gpu_why(char *why, size_t len, const char *fmt, const char *a,
                    const char *b)
{
    if (why != NULL && len > 0)
        snprintf(why, len, fmt, a, b);
}

/* dir/../lib of the running binary, into out (PATH_MAX). */
static int gpu_exe_libdir(char *out)
{
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    if (n <= 0)
        return 0;
    exe[n] = '\0';
    char *slash = strrchr(exe, '/');
    if (slash == NULL)
        return 0;
    *slash = '\0';
    return snprintf(out, PATH_MAX, "%s/../lib", exe) < PATH_MAX;
}

/* Directory of the shared object holding this code, if that is not the
 * main program. */
static int gpu_self_libdir(char *out)
{
    Dl_info info;
    char exe[PATH_MAX], self[PATH_MAX];
    if (dladdr(&gpu_anchor, &info) == 0 || info.dli_fname == NULL ||
        realpath(info.dli_fname, self) == NULL ||
        realpath("/proc/self/exe", exe) == NULL || strcmp(exe, self) == 0)
        return 0;
    char *slash = strrchr(self, '/');
    if (slash == NULL)
        return 0;
    *slash = '\0';
    return snprintf(out, PATH_MAX, "%s", self) < PATH_MAX;
}

/* Candidate library paths in search order; returns how many. */
static int gpu_candidates(const char *libdir,
                          char out[GPU_MAX_CANDIDATES][PATH_MAX])
{
    const char *env = getenv(KVT_CUDA_LIB_ENV);
    char dir[PATH_MAX];
    int n = 0;
    if (env != NULL && env[0] != '\0')
        return snprintf(out[0], PATH_MAX, "%s", env) < PATH_MAX;
    if (libdir != NULL &&
        snprintf(out[n], PATH_MAX, "%s/%s", libdir, KVT_CUDA_LIB_NAME) <
            PATH_MAX)
        n++;
    if (gpu_self_libdir(dir) &&
        snprintf(out[n], PATH_MAX, "%s/%s", dir, KVT_CUDA_LIB_NAME) <
            PATH_MAX)
        n++;
    if (gpu_exe_libdir(dir) &&
        snprintf(out[n], PATH_MAX, "%s/%s", dir, KVT_CUDA_LIB_NAME) <
            PATH_MAX)
        n++;
    return n;
}

/* The first candidate that exists, into path; else a reason. */
static kvt_err gpu_find(const char *libdir, char *path, char *why,
                        size_t why_len)
{
    char cand[GPU_MAX_CANDIDATES][PATH_MAX];
    char tried[1024] = "";
    int n = gpu_candidates(libdir, cand);
    for (int i = 0; i < n; i++) {
        if (access(cand[i], F_OK) == 0) {
            memcpy(path, cand[i], PATH_MAX);
            return KVT_OK;
        }
        size_t used = strlen(tried);
        snprintf(tried + used, sizeof(tried) - used, "%s%s",
                 i > 0 ? ", " : "", cand[i]);
    }
    gpu_why(why, why_len, "%s not found (tried: %s)", KVT_CUDA_LIB_NAME,
            n > 0 ? tried : "nowhere to look");
    return KVT_ENOTSUP;
}

/* dlopen path and fetch its ops table, checked against our ABI. */
static kvt_err gpu_load(const char *path, const struct kvt_cuda_ops **ops,
                        char *why, size_t why_len)
{
    void *dl = dlopen(path, RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
    if (dl == NULL) {
        const char *e = dlerror();
        if (e != NULL && strstr(e, "libcudart") != NULL)
            gpu_why(why, why_len, "libcudart not found: %s%s", e, "");
        else
            gpu_why(why, why_len, "cannot load %s: %s", path,
                    e != NULL ? e : "?");
        return KVT_ENOTSUP;
    }
    kvt_cuda_ops_get_fn get;
    *(void **)&get = dlsym(dl, KVT_CUDA_SYMBOL);
    const struct kvt_cuda_ops *o = get != NULL ? get() : NULL;
    dlclose(dl); /* RTLD_NODELETE: stays mapped */
    if (o == NULL) {
        gpu_why(why, why_len, "%s has no %s", path, KVT_CUDA_SYMBOL);
        return KVT_EPROTO;
    }
    if (o->abi_version != KVT_CUDA_ABI_VERSION ||
        o->layout_size != sizeof(kvt_layout)) {
        gpu_why(why, why_len, "%s: ABI mismatch (%s)", path,
                "rebuild it with this tree");
        return KVT_EPROTO;
    }
    *ops = o;
    return KVT_OK;
}

kvt_err kvt_gpu_open(const char *libdir, struct kvt_gpu **out, char *why,
                     size_t why_len)
{
    struct kvt_gpu *g;
    kvt_err err;
    if (why != NULL && why_len > 0)
        why[0] = '\0';
    if (out == NULL)
        return KVT_EINVAL;
    g = calloc(1, sizeof(*g));
    if (g == NULL)
        return KVT_ENOMEM;
    err = gpu_find(libdir, g->path, why, why_len);
    if (err == KVT_OK)
        err = gpu_load(g->path, &g->ops, why, why_len);
    if (err == KVT_OK)
        err = g->ops->open(&g->ctx, why, why_len);
    if (err != KVT_OK) {
        free(g);
        return err;
    }
    *out = g;
    return KVT_OK;
}

void kvt_gpu_close(struct kvt_gpu *g)
{
    if (g == NULL)
        return;
    if (g->ops != NULL && g->ctx != NULL)
        g->ops->close(g->ctx);
    free(g);
}

const struct kvt_cuda_ops *kvt_gpu_ops(const struct kvt_gpu *g)
{
    return g->ops;
}

kvt_cuda_ctx *kvt_gpu_ctx(const struct kvt_gpu *g)
{
    return g->ctx;
}

int kvt_gpu_device_count(const struct kvt_gpu *g)
{
    return g->ops->device_count(g->ctx);
}

const char *kvt_gpu_lib_path(const struct kvt_gpu *g)
{
    return g->path;
}

const char *kvt_gpu_last_error(const struct kvt_gpu *g)
{
    return g->ops->last_error();
}

kvt_err kvt_gpu_stream_create(struct kvt_gpu *g, int device,
                              kvt_cuda_stream **out)
{
    return g->ops->stream_create(g->ctx, device, out);
}

void kvt_gpu_stream_destroy(struct kvt_gpu *g, kvt_cuda_stream *s)
{
    g->ops->stream_destroy(g->ctx, s);
}

kvt_err kvt_gpu_sync(struct kvt_gpu *g, kvt_cuda_stream *s)
{
    return g->ops->sync(g->ctx, s);
}

kvt_err kvt_gpu_host_register(struct kvt_gpu *g, void *p, size_t len)
{
    return g->ops->host_register(g->ctx, p, len);
}

kvt_err kvt_gpu_host_unregister(struct kvt_gpu *g, void *p)
{
    return g->ops->host_unregister(g->ctx, p);
}

kvt_err kvt_gpu_ipc_open(struct kvt_gpu *g, int device, const void *handle,
                         size_t handle_len, void **dev_ptr)
{
    return g->ops->ipc_open(g->ctx, device, handle, handle_len, dev_ptr);
}

kvt_err kvt_gpu_ipc_close(struct kvt_gpu *g, void *dev_ptr)
{
    return g->ops->ipc_close(g->ctx, dev_ptr);
}

kvt_err kvt_gpu_check_layout(struct kvt_gpu *g, int device,
                             const kvt_layout *d)
{
    return g->ops->check_layout(g->ctx, device, d);
}

kvt_err kvt_gpu_mem_range(struct kvt_gpu *g, int device, const void *p,
                          uint64_t *base, uint64_t *size)
{
    return g->ops->mem_range(g->ctx, device, p, base, size);
}

kvt_err kvt_gpu_gather(struct kvt_gpu *g, const kvt_layout *d,
                       const int32_t *block_ids, size_t n_blocks,
                       size_t blocks_per_chunk, void *const *chunks,
                       size_t chunk_len, kvt_cuda_stream *s)
{
    return g->ops->gather(g->ctx, d, block_ids, n_blocks, blocks_per_chunk,
                          chunks, chunk_len, s);
}

kvt_err kvt_gpu_scatter(struct kvt_gpu *g, const kvt_layout *d,
                        const int32_t *block_ids, size_t n_blocks,
                        size_t blocks_per_chunk, const void *const *chunks,
                        size_t chunk_len, kvt_cuda_stream *s)
{
    return g->ops->scatter(g->ctx, d, block_ids, n_blocks, blocks_per_chunk,
                           chunks, chunk_len, s);
}
