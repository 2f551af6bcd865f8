/*
 * test_kvcache_inproc.c -- what a real daemon cannot be made to show on
 * demand, driven in-process: a request whose connection is already gone
 * when the core thread reaches it (nng reports the close first) must not
 * leave a registration behind; and a SIGBUS outside a worker's guarded
 * copy keeps its default action (the guard must not swallow real faults,
 * nor loop on them).
 */
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "handlers.h"
#include "kvcache.h"
#include "kvtierd.h"
#include "kvxfer.h"
#include "log.h"
#include "tierhost.h"
#include "workq.h"

static struct kvtierd *D;
static char pool[96];

static int setup(void **state)
{
    (void)state;
    char err[256] = "";
    D = calloc(1, sizeof *D);
    config_defaults(&D->cfg);
    D->cfg.pool_bytes = 4u << 20;
    snprintf(pool, sizeof pool, "/dev/shm/kvt-inproc-%d.pool", (int)getpid());
    struct dram_opts o = {pool, D->cfg.pool_bytes, 0600, NULL, 0, -1};
    if (dram_open(&o, &D->dram, err, sizeof err) != KVT_OK ||
        idx_init(&D->idx, D->dram->bytes / DRAM_UNIT) != 0)
        return -1;
    D->start_ms = now_ms();
    D->ns.idx = &D->idx;
    log_set_level(LOG_ERROR);
    unsetenv("KVT_CUDA_LIB");
    if (wq_cq_open(&D->cq) != 0) return -1;
    tierhost_init(D);
    tierhost_attach(D);
    return tierhost_kvc_open(D);
}

static int teardown(void **state)
{
    (void)state;
    tierhost_kvc_close(D);
    tierhost_close(D);
    wq_cq_close(D->cq);
    idx_destroy(&D->idx);
    ns_free(&D->ns);
    dram_close(D->dram, 1);
    free(D->pipes);
    free(D);
    return 0;
}

static int handle(uint32_t pipe, Kvtier__Request *q)
{
    Kvtier__Response rsp;
    void *scratch = NULL;
    size_t len = kvtier__request__get_packed_size(q);
    uint8_t *buf = malloc(len);
    kvtier__request__pack(q, buf);
    handle_request(D, pipe, buf, len, &rsp, &scratch);
    int err = rsp.err;
    handle_response_free(&rsp, scratch);
    free(buf);
    return err;
}

static void test_register_from_closed_connection(void **state)
{
    (void)state;
    Kvtier__KvLayout l = KVTIER__KV_LAYOUT__INIT;
    l.kind = KVT_LAYOUT_VLLM_FLASH_NHD, l.num_layers = 1, l.num_blocks = 4;
    l.block_size = 4, l.num_kv_heads = 1, l.head_size = 8, l.elem_size = 2;
    uint64_t off[1] = {0};
    Kvtier__KvMemory m = KVTIER__KV_MEMORY__INIT;
    m.shm_path = pool, m.offsets = off, m.n_offsets = 1;
    Kvtier__RegisterKvCache rk = KVTIER__REGISTER_KV_CACHE__INIT;
    rk.ns = "inproc", rk.layout = &l, rk.memory = &m, rk.chunk_tokens = 4;
    Kvtier__Request q = KVTIER__REQUEST__INIT;
    q.body_case = KVTIER__REQUEST__BODY_REGISTER_KV_CACHE;
    q.register_kv_cache = &rk;
    assert_int_equal(handle(42, &q), KVT_ECLOSED); /* pipe 42 never came */
    pipe_added(D, 42);
    /* Alive, but not an nng ipc pipe: no peer credentials to check. */
    assert_int_equal(handle(42, &q), KVT_ENOTSUP);
    pipe_removed(D, 42);
    Kvtier__StatsResp s = KVTIER__STATS_RESP__INIT;
    kvc_fill_stats(D->kvc, &s);
    assert_int_equal(s.kv_registrations, 0);
}

/* In a child: install the guard, then fault outside it. */
static void fault_unguarded(void)
{
    char path[96];
    snprintf(path, sizeof path, "/dev/shm/kvt-inproc-bus-%d", (int)getpid());
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
    if (fd < 0 || ftruncate(fd, 8192) != 0) _exit(2);
    volatile uint8_t *p = mmap(NULL, 8192, PROT_READ, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED || ftruncate(fd, 0) != 0) _exit(3);
    unlink(path);
    kvc_sigbus_install();
    (void)p[4096]; /* past the end of the file now: SIGBUS */
    _exit(0);
}

static void test_sigbus_outside_guard(void **state)
{
    (void)state;
    pid_t pid = fork();
    if (pid == 0) fault_unguarded();
    int st;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFSIGNALED(st));
    assert_int_equal(WTERMSIG(st), SIGBUS);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_register_from_closed_connection),
        cmocka_unit_test(test_sigbus_outside_guard),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
