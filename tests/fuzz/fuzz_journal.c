/*
 * fuzz_journal.c -- the DRAM journal a restarted daemon adopts its
 * predecessor's pool by (daemon/journal.c, daemon/adopt.c): any bytes
 * after a valid header, replayed by the real adoption into a real index
 * over a real 1 MiB pool file. Whatever the journal says, adoption may
 * only commit chunks that lie inside the pool, do not overlap, and whose
 * bytes match their checksum.
 *
 * Input byte 0: odd = the rest is a list of records (u8 length, payload),
 * each framed by the target with its length and checksum so mutated
 * payloads reach the decoder; even = the rest is appended raw (torn and
 * damaged frames).
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "adopt.h"
#include "fuzz_target.h"
#include "dram.h"
#include "index.h"
#include "journal.h"
#include "log.h"
#include "ns.h"

#define POOL (1u << 20)

const char fuzz_target_name[] = "journal";

static char pool_path[128], state[64], jpath[128];
static uint8_t hdr[32];
static int ready;

static void setup(void)
{
    char err[256];
    struct journal *j;
    log_set_level(LOG_ERROR + 1);
    snprintf(pool_path, sizeof pool_path, "/dev/shm/kvt-fuzz-jrnl-%d.pool", (int)getpid());
    snprintf(state, sizeof state, "/tmp/kvt-fuzz-jrnl-%d", (int)getpid());
    snprintf(jpath, sizeof jpath, "%s/dram.journal", state);
    mkdir(state, 0700);
    unlink(jpath);
    /* A header-only journal for this pool: the prefix of every input. */
    if (journal_open(jpath, POOL, pool_path, &j, err, sizeof err) != 0 ||
        journal_snapshot(j, 0, NULL, NULL) != 0)
        abort();
    journal_close(j);
    int fd = open(jpath, O_RDONLY);
    if (fd < 0 || read(fd, hdr, sizeof hdr) != (ssize_t)sizeof hdr) abort();
    close(fd);
    /* The pool the journal describes: a pattern, so checksums can match. */
    fd = open(pool_path, O_RDWR | O_CREAT | O_TRUNC, 0600);
    if (fd < 0) abort();
    static uint8_t p[POOL];
    for (size_t i = 0; i < POOL; i++) p[i] = (uint8_t)(i / 4096);
    if (write(fd, p, POOL) != POOL) abort();
    close(fd);
    ready = 1;
}

static void write_journal(const uint8_t *data, size_t size)
{
    int fd = open(jpath, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd < 0 || write(fd, hdr, sizeof hdr) != (ssize_t)sizeof hdr) abort();
    if (size && data[0] % 2 == 0) {
        if (write(fd, data + 1, size - 1) != (ssize_t)(size - 1)) abort();
    } else {
        for (size_t at = 1; at < size;) {
            uint32_t len = data[at++];
            if (len > size - at) len = (uint32_t)(size - at);
            uint32_t crc = (uint32_t)XXH3_64bits(data + at, len);
            if (write(fd, &len, 4) != 4 || write(fd, &crc, 4) != 4 ||
                write(fd, data + at, len) != (ssize_t)len)
                abort();
            at += len;
        }
    }
    close(fd);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char err[256];
    if (!ready) setup();
    write_journal(data, size);

    /* The module's own context, no daemon: a real pool, index and
     * namespace table. */
    struct idx ix;
    struct ns_table ns = {0};
    struct dram *pool = NULL;
    struct adopt a = {0};
    log_set_level(LOG_ERROR + 1);
    struct dram_opts o = {pool_path, POOL, 0600, NULL, 0, -1};
    if (dram_open_adopt(&o, 1, &pool, err, sizeof err) != KVT_OK || !pool->adopted ||
        idx_init(&ix, POOL / DRAM_UNIT) != 0)
        abort();
    ns.idx = &ix;
    a.idx = &ix;
    a.ns = &ns;
    a.dram = pool;
    if (adopt_open(&a, 1, state, 256u << 10) != 0) abort();

    /* Every adopted chunk: inside the pool, apart from the others, and
     * its bytes are what its checksum says. */
    static uint8_t owner[POOL / DRAM_UNIT];
    memset(owner, 0, sizeof owner);
    uint64_t ready_n = 0;
    for (uint32_t i = 0; i < ix.used; i++) {
        struct idx_entry *e = idx_at(&ix, i);
        if (e->state != IDX_READY) continue;
        ready_n++;
        uint8_t *p = dram_ptr(pool, dram_block_off(pool, e->blk));
        uint8_t *base = pool->base;
        if (p < base || e->size == 0 || (uint64_t)(p - base) + e->size > POOL ||
            kvt_checksum(p, e->size) != e->csum)
            abort();
        for (uint64_t u = (uint64_t)(p - base) / DRAM_UNIT;
             u * DRAM_UNIT < (uint64_t)(p - base) + e->size; u++) {
            if (owner[u]) abort(); /* two chunks in one unit */
            owner[u] = 1;
        }
    }
    if (ready_n != a.adopted) abort();

    adopt_close(&a);
    idx_destroy(&ix);
    ns_free(&ns);
    dram_close(pool, 0);
    return 0;
}

static void rec(uint8_t *b, size_t *n, const uint8_t *p, uint8_t len)
{
    b[(*n)++] = len;
    memcpy(b + *n, p, len);
    *n += len;
}

void fuzz_target_seeds(void (*keep)(const uint8_t *b, size_t n))
{
    /* The payloads as journal.c writes them: NS (type, u16 id, u8 len,
     * name), ADD (type, id, key, u64 off, u32 size, u64 csum, u8
     * has_parent, parent) and DEL (type, id, key). */
    uint8_t ns[4 + 5] = {1, 0, 0, 5, 'm', 'o', 'd', 'e', 'l'};
    uint8_t add[88] = {2, 0, 0};
    uint8_t del[35] = {3, 0, 0};
    static uint8_t page[4096];
    memset(add + 3, 0x11, 32);
    memset(del + 3, 0x11, 32);
    uint64_t off = 8192, csum;
    uint32_t size = 4096;
    memset(page, 2, sizeof page); /* the pattern of the pool's third page */
    csum = kvt_checksum(page, size);
    memcpy(add + 35, &off, 8);
    memcpy(add + 43, &size, 4);
    memcpy(add + 47, &csum, 8);
    uint8_t b[512];
    size_t n = 0;
    b[n++] = 1;
    rec(b, &n, ns, sizeof ns);
    rec(b, &n, add, sizeof add);
    keep(b, n);                   /* one chunk adopted */
    rec(b, &n, del, sizeof del);
    keep(b, n);                   /* added, then deleted */
    n = 1 + 1 + sizeof ns;
    add[3] = 0x22;                /* a second chunk over the same bytes */
    rec(b, &n, add, sizeof add);
    rec(b, &n, add, sizeof add);
    keep(b, n);
    off = POOL - 4096;            /* runs past the pool's end */
    size = 8192;
    memcpy(add + 35, &off, 8);
    memcpy(add + 43, &size, 4);
    n = 1 + 1 + sizeof ns;
    rec(b, &n, add, sizeof add);
    keep(b, n);
    b[0] = 0;                     /* the same bytes unframed */
    keep(b, n);
}

void fuzz_target_done(void)
{
    unlink(jpath);
    rmdir(state);
    unlink(pool_path);
}
