/*
 * fuzz_nvme.c -- what the NVMe tier reads back from disk at start: record
 * headers in a data file (nvme_scan, when the index is lost) and RocksDB
 * index records (nvx_decode, then the placement checks the loader makes:
 * nvme_loc_make and a reservation in the file's allocator). A real data
 * directory in a temporary folder with one 256 KiB file, real io_uring.
 *
 * Input byte 0: even = the rest is the data file's contents (every block
 * that starts with the header magic gets its own checksum recomputed, so
 * mutated fields reach the checks behind it); odd = the rest is one index
 * record: u8 key length, the key, then the value.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fuzz_target.h"
#include "kvtier.h"
#include "log.h"
#include "nvme/nvindex.h"
#include "nvme/nvme.h"

#define FILE_BYTES (256u << 10)
#define MAGIC 0x3152544bu

const char fuzz_target_name[] = "nvme";

static struct nvme *N;
static char dir[64], file[128];
static uint8_t *img;

static void setup(void)
{
    char err[256];
    log_set_level(LOG_ERROR);
    snprintf(dir, sizeof dir, "/tmp/kvt-fuzz-nvme-%d", (int)getpid());
    snprintf(file, sizeof file, "%s/kvtier-00000.nvd", dir);
    if (mkdir(dir, 0700) != 0 && errno != EEXIST) abort();
    int fd = open(file, O_RDWR | O_CREAT | O_TRUNC, 0600);
    if (fd < 0 || ftruncate(fd, FILE_BYTES) != 0) abort();
    close(fd);
    const char *dirs[] = {dir};
    struct nvme_opts o = {dirs, 1, 4 * FILE_BYTES, FILE_BYTES, 8, 0, NULL, 0};
    if (nvme_open(&o, &N, err, sizeof err) != KVT_OK || N->n_files != 1) {
        fprintf(stderr, "fuzz_nvme: %s\n", err);
        abort();
    }
    if (!(img = aligned_alloc(NVME_BLOCK, FILE_BYTES))) abort();
}

static void on_rec(void *arg, unsigned f, uint64_t off, const struct nvme_meta *m)
{
    (*(unsigned *)arg)++;
    struct tier_loc loc;
    uint64_t len = nvme_rec_len(m->size);
    /* What the scan hands over must lie inside the file and re-encode. */
    if (f != 0 || off % NVME_BLOCK || m->size == 0 || off + len > FILE_BYTES ||
        m->ns[0] == 0 || memchr(m->ns, 0, sizeof m->ns) == NULL ||
        nvme_loc_make(N, 0, 0, off, len, &loc) != KVT_OK ||
        kvt_checksum(img + off + NVME_HDR, m->size) != m->csum)
        abort();
    uint8_t blk[NVME_HDR];
    struct nvme_meta back;
    nvme_header_encode(m, blk);
    if (nvme_header_decode(blk, &back) != 0 || back.size != m->size ||
        strcmp(back.ns, m->ns) != 0 || memcmp(&back.key, &m->key, sizeof m->key) != 0)
        abort();
}

static void scan_image(const uint8_t *data, size_t size)
{
    char err[256];
    memset(img, 0, FILE_BYTES);
    memcpy(img, data, size < FILE_BYTES ? size : FILE_BYTES);
    for (size_t b = 0; b < FILE_BYTES; b += NVME_BLOCK) {
        uint32_t magic;
        memcpy(&magic, img + b, 4);
        if (magic == MAGIC) nvme_header_seal(img + b);
    }
    int fd = open(file, O_WRONLY);
    if (fd < 0 || pwrite(fd, img, FILE_BYTES, 0) != FILE_BYTES || fsync(fd) != 0) abort();
    close(fd);
    unsigned found = 0;
    if (nvme_scan(N, on_rec, &found, err, sizeof err) != (long long)found) abort();
}

static void index_record(const uint8_t *data, size_t size)
{
    struct nvx_rec r;
    if (size < 1 || (size_t)data[0] > size - 1) return;
    size_t kl = data[0];
    if (nvx_decode(data + 1, kl, data + 1 + kl, size - 1 - kl, &r) != 0) return;
    if (r.ns[0] == 0 || memchr(r.ns, 0, sizeof r.ns) == NULL) abort();
    /* The loader's checks, in its order; a record that passes them may
     * only name space inside the file. */
    struct tier_loc loc;
    if (r.len != nvme_rec_len(r.size) ||
        nvme_loc_make(N, r.dir, r.num, r.off, r.len, &loc) != KVT_OK)
        return;
    if (r.dir != 0 || r.num != 0 || r.off + r.len > FILE_BYTES || r.off + r.len < r.off)
        abort();
    struct tier_loc got;
    if (N->tier.ops->alloc_at(&N->tier, loc.off, loc.len, &got) == KVT_OK)
        N->tier.ops->free(&N->tier, &got);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!N) setup();
    if (size < 1) return 0;
    if (data[0] % 2 == 0) scan_image(data + 1, size - 1);
    else index_record(data + 1, size - 1);
    return 0;
}

void fuzz_target_seeds(void (*keep)(const uint8_t *b, size_t n))
{
    static uint8_t b[1 + 3 * NVME_BLOCK];
    struct nvme_meta m = {.ns = "model-a", .size = 100, .seq = 7};
    memset(m.key.b, 0xab, sizeof m.key.b);
    memset(b, 0, sizeof b);
    b[0] = 0;
    memset(b + 1 + NVME_HDR, 'k', m.size);
    m.csum = kvt_checksum(b + 1 + NVME_HDR, m.size);
    nvme_header_encode(&m, b + 1);
    keep(b, sizeof b);                /* one record */
    keep(b, 1 + NVME_HDR + 50);       /* torn: data cut short */
    b[1 + 96] = 0;                    /* a NUL inside the namespace name */
    keep(b, sizeof b);
    b[1 + 96] = 'm';
    m.size = 5000;                    /* runs past a short image */
    nvme_header_encode(&m, b + 1);
    keep(b, sizeof b);

    /* Index records: key = u8 ns length, ns, 32-byte key. The value is
     * written the way nvindex.c lays it out: version, flags, dir, num, off,
     * len, size, csum, seq, atime (48 bytes), then the parent if flagged. */
    uint8_t v[1 + 1 + 40 + 48 + 32];
    size_t n = 0;
    v[n++] = 1;
    v[n++] = 1 + 7 + 32;
    v[n++] = 7;
    memcpy(v + n, "model-a", 7), n += 7;
    memset(v + n, 0xab, 32), n += 32;
    uint8_t ver = 1, fl = 0;
    uint16_t d = 0;
    uint32_t num = 0, len = 2 * NVME_BLOCK, sz = 100;
    uint64_t off = NVME_BLOCK, csum = 1, seq = 2, atime = 3;
    memcpy(v + n, &ver, 1), n += 1;
    memcpy(v + n, &fl, 1), n += 1;
    memcpy(v + n, &d, 2), n += 2;
    memcpy(v + n, &num, 4), n += 4;
    memcpy(v + n, &off, 8), n += 8;
    memcpy(v + n, &len, 4), n += 4;
    memcpy(v + n, &sz, 4), n += 4;
    memcpy(v + n, &csum, 8), n += 8;
    memcpy(v + n, &seq, 8), n += 8;
    memcpy(v + n, &atime, 8), n += 8;
    keep(v, n);
    off = UINT64_MAX - NVME_BLOCK + 1; /* wraps when the length is added */
    memcpy(v + 1 + 1 + 40 + 8, &off, 8);
    keep(v, n);
}

void fuzz_target_done(void)
{
    nvme_close(N);
    N = NULL;
    free(img);
    unlink(file);
    rmdir(dir);
}
