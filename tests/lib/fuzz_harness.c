/*
 * fuzz_harness.c -- see fuzz_harness.h.
 */
#include "fuzz_harness.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kvcache.h"
#include "handlers.h"
#include "kvtierd.h"
#include "workq.h"
#include "log.h"
#include "tierhost.h"

#define FUZZ_PIPE 7u

static struct kvtierd *fz;
static char fz_pool[128];

static void fuzz_init(void)
{
    char err[256] = "";
    fz = calloc(1, sizeof *fz);
    if (!fz) abort();
    config_defaults(&fz->cfg);
    fz->cfg.pool_bytes = 8u << 20;
    fz->cfg.max_chunk_bytes = 4u << 20;
    fz->cfg.max_keys = 256;
    snprintf(fz_pool, sizeof fz_pool, "/dev/shm/kvt-fuzz-%d.pool", (int)getpid());
    struct dram_opts o = {fz_pool, fz->cfg.pool_bytes, 0600, NULL, 0, -1};
    if (dram_open(&o, &fz->dram, err, sizeof err) != KVT_OK ||
        idx_init(&fz->idx, fz->dram->bytes / DRAM_UNIT) != 0) {
        fprintf(stderr, "fuzz harness: %s\n", err);
        abort();
    }
    fz->start_ms = now_ms();
    fz->ns.idx = &fz->idx;
    lease_init(&fz->leases, handle_lease_release, fz);
    log_set_level(LOG_ERROR);
    if (wq_cq_open(&fz->cq) != 0) abort();
    tierhost_init(fz); /* the tiers' contexts: no NVMe tier, no cluster */
    tierhost_attach(fz);
    tierhost_order(fz);
    if (tierhost_kvc_open(fz) != 0) abort(); /* KV-cache state */
    pipe_added(fz, FUZZ_PIPE);
}

void kvt_fuzz_reset(void)
{
    if (!fz) return;
    tierhost_kvc_close(fz);
    wq_cq_close(fz->cq);
    tierhost_close(fz);
    lease_drop_all(&fz->leases);
    idx_destroy(&fz->idx);
    ns_free(&fz->ns);
    dram_close(fz->dram, 1);
    free(fz->pipes);
    free(fz);
    fz = NULL;
}

int kvt_fuzz_one(const uint8_t *data, size_t size)
{
    Kvtier__Response rsp;
    void *scratch = NULL;
    if (!fz) fuzz_init();
    handle_request(fz, FUZZ_PIPE, data, size, &rsp, &scratch);
    size_t len = kvtier__response__get_packed_size(&rsp);
    uint8_t *out = malloc(len ? len : 1);
    if (!out) abort();
    kvtier__response__pack(&rsp, out);
    Kvtier__Response *back = kvtier__response__unpack(NULL, len, out);
    if (!back) abort(); /* the daemon must always send a decodable answer */
    kvtier__response__free_unpacked(back, NULL);
    free(out);
    int err = rsp.err;
    handle_response_free(&rsp, scratch);
    if (fz->leases.count > 64) lease_drop_all(&fz->leases); /* keep the pool usable */
    return err;
}
