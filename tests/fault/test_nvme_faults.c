/*
 * test_nvme_faults.c -- the NVMe tier when things go wrong, each fault
 * driven for real or through KVT_FAULT (daemon/fault.h):
 *
 *  - bytes flipped in a data file behind the daemon's back: a GET finds
 *    the checksum wrong, counts it, serves nothing wrong, drops the
 *    record; VERIFY finds the same damage on its own;
 *  - a failing read completion: a miss and a counter, the GET answers;
 *  - a failing write: FLUSH reports it, the chunk stays in DRAM;
 *  - disk full (no data file can be created; and, where loop devices can
 *    be mounted, a real full filesystem): demotion stops with a log line
 *    and a counter, DRAM keeps serving every committed chunk;
 *  - buffer registration refused, injected and for real (CAP_IPC_LOCK
 *    dropped, `ulimit -l 8192`, as for a non-root user here): a log
 *    line, plain I/O, the same bytes.
 */
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "daemon.h"
#include "kvtier.h"
#include "nvtest.h"

#define CH (256u << 10)

static void start_with_fault(struct tdaemon *d, const char *fault, int mb,
                             const char *const *rest)
{
    assert_int_equal(td_init(d), 0);
    if (fault) setenv("KVT_FAULT", fault, 1);
    int rv = nvt_start(d, mb, 16, rest);
    unsetenv("KVT_FAULT");
    assert_int_equal(rv, 0);
}

static void stop(struct tdaemon *d, kvt_client *c)
{
    kvt_close(c);
    assert_int_equal(td_stop(d), 0);
    td_cleanup(d);
}

/* Flip one byte every 64 KiB of the first data file. */
static void flip_bytes(const struct tdaemon *d)
{
    char path[400];
    snprintf(path, sizeof path, "%s/nvme/kvtier-00000.nvd", d->dir);
    int fd = open(path, O_RDWR);
    assert_true(fd >= 0);
    struct stat st;
    assert_int_equal(fstat(fd, &st), 0);
    for (off_t at = 8192 + 100; at < st.st_size; at += 65536) {
        uint8_t b;
        assert_int_equal(pread(fd, &b, 1, at), 1);
        b ^= 0x5a;
        assert_int_equal(pwrite(fd, &b, 1, at), 1);
    }
    assert_int_equal(fsync(fd), 0);
    close(fd);
}

static void test_flipped_bytes_get(void **state)
{
    (void)state;
    struct tdaemon D;
    start_with_fault(&D, NULL, 64, NULL);
    kvt_client *c = td_connect(&D);
    assert_int_equal(nvt_put_chain(c, 1, 12, CH), KVT_OK);
    assert_int_equal(nvt_flush(c, 1, NULL), KVT_OK);
    flip_bytes(&D);
    int served = 0;
    for (int i = 1; i <= 12; i++) served += nvt_check(c, i, CH); /* aborts on a wrong byte */
    uint64_t bad = nvt_stat(c, "checksum_failures");
    assert_int_equal(bad + (uint64_t)served, 12);
    assert_true(bad >= 1);
    assert_true(td_log_has(&D, "checksum mismatch"));
    /* Dropped: the damaged chunks are gone, not retried. */
    assert_int_equal(nvt_stat(c, "nvme.chunks"), (uint64_t)served);
    for (int i = 1; i <= 12; i++) nvt_check(c, i, CH);
    assert_int_equal(nvt_stat(c, "checksum_failures"), bad);
    stop(&D, c);
}

static void test_flipped_bytes_verify(void **state)
{
    (void)state;
    struct tdaemon D;
    start_with_fault(&D, NULL, 64, NULL);
    kvt_client *c = td_connect(&D);
    assert_int_equal(nvt_put_chain(c, 1, 12, CH), KVT_OK);
    assert_int_equal(nvt_flush(c, 1, NULL), KVT_OK);
    Kvtier__VerifyResp vr;
    assert_int_equal(nvt_verify(c, 0, &vr), KVT_OK);
    assert_int_equal(vr.checked, 12);
    assert_int_equal(vr.bad, 0);
    flip_bytes(&D);
    assert_int_equal(nvt_verify(c, 0, &vr), KVT_OK);
    assert_int_equal(vr.checked, 12);
    assert_true(vr.bad >= 1);
    assert_int_equal(nvt_stat(c, "nvme.chunks"), 12 - vr.bad);
    assert_true(td_log_has(&D, "is damaged: dropped"));
    int served = 0;
    for (int i = 1; i <= 12; i++) served += nvt_check(c, i, CH);
    assert_int_equal((uint64_t)served, 12 - vr.bad);
    assert_int_equal(nvt_stat(c, "checksum_failures"), 0); /* none left to find */
    /* A bounded verify looks at no more than it was asked to. */
    assert_int_equal(nvt_verify(c, 3, &vr), KVT_OK);
    assert_true(vr.checked <= 3);
    stop(&D, c);
}

static void test_read_error(void **state)
{
    (void)state;
    struct tdaemon D;
    start_with_fault(&D, "nvme_read=1", 64, NULL);
    kvt_client *c = td_connect(&D);
    assert_int_equal(nvt_put_chain(c, 1, 2, CH), KVT_OK);
    assert_int_equal(nvt_flush(c, 1, NULL), KVT_OK);
    assert_false(nvt_check(c, 1, CH)); /* the read fails: a miss */
    assert_int_equal(nvt_stat(c, "read_errors"), 1);
    assert_true(td_log_has(&D, "reading a record failed"));
    assert_true(nvt_check(c, 1, CH)); /* the record was kept */
    assert_true(nvt_check(c, 2, CH));
    stop(&D, c);
}

static void test_write_error(void **state)
{
    (void)state;
    struct tdaemon D;
    start_with_fault(&D, "nvme_write=1+", 64, NULL);
    kvt_client *c = td_connect(&D);
    assert_int_equal(nvt_put_chain(c, 1, 4, CH), KVT_OK);
    Kvtier__FlushResp fr;
    assert_int_equal(nvt_flush(c, 1, &fr), KVT_OK);
    assert_int_equal(fr.written, 0);
    assert_int_equal(fr.failed, 4);
    assert_true(nvt_stat(c, "enospc") >= 4);
    assert_int_equal(nvt_stat(c, "dram.chunks"), 4);
    for (int i = 1; i <= 4; i++) assert_true(nvt_check(c, i, CH));
    stop(&D, c);
}

/* Every put lands above the DRAM high watermark, so the daemon tries to
 * demote; the disk takes nothing; every chunk still comes back. */
static void check_disk_full(struct tdaemon *D, kvt_client *c)
{
    for (int k = 0; k < 6; k++) assert_int_equal(nvt_put_chain(c, 1 + 4 * k, 4, CH), KVT_OK);
    assert_true(nvt_wait_stat(c, "enospc", 1, 10000) >= 1);
    assert_true(td_log_has(D, "demotion stops"));
    assert_true(td_log_has(D, "cannot grow"));
    for (int i = 1; i <= 24; i++) assert_true(nvt_check(c, i, CH));
    assert_int_equal(nvt_stat(c, "lost_dirty"), 0);
    assert_int_equal(nvt_stat(c, "dram.chunks"), 24);
    Kvtier__FlushResp fr;
    assert_int_equal(nvt_flush(c, 0, &fr), KVT_OK);
    assert_int_equal(fr.written, 0);
    assert_int_equal(fr.failed, 24);
}

static void test_disk_full_injected(void **state)
{
    (void)state;
    struct tdaemon D;
    const char *rest[] = {"--pool-bytes", "8M", "--high-watermark", "0.5",
                          "--low-watermark", "0.25", NULL};
    start_with_fault(&D, "nvme_grow=1+", 64, rest);
    kvt_client *c = td_connect(&D);
    check_disk_full(&D, c);
    stop(&D, c);
}

/* A real full filesystem: a 16 MiB ext4 image, loop-mounted and filled
 * before the daemon starts. Skipped where mounting is not allowed. */
static void test_disk_full_loop(void **state)
{
    (void)state;
    struct tdaemon D;
    char cmd[2048], mnt[300], img[300], dirs[320];
    assert_int_equal(td_init(&D), 0);
    snprintf(img, sizeof img, "%s/fs.img", D.dir);
    snprintf(mnt, sizeof mnt, "%s/mnt", D.dir);
    snprintf(cmd, sizeof cmd, "mkdir -p %s && truncate -s 16M %s && mkfs.ext4 -q %s "
             ">/dev/null 2>&1 && mount -o loop %s %s >/dev/null 2>&1", mnt, img,
             img, img, mnt);
    if (geteuid() != 0 || system(cmd) != 0) {
        td_cleanup(&D);
        skip();
    }
    snprintf(cmd, sizeof cmd, "mkdir %s/nvme && touch %s/nvme/kvtier.lock && "
             "dd if=/dev/zero of=%s/fill bs=1M >/dev/null 2>&1; sync", mnt, mnt, mnt);
    assert_true(system(cmd) >= 0);
    snprintf(dirs, sizeof dirs, "%s/nvme", mnt);
    const char *rest[] = {"--pool-bytes", "8M", "--high-watermark", "0.5",
                          "--low-watermark", "0.25", "--nvme.dirs", dirs, NULL};
    int rv = nvt_start(&D, 64, 4, rest);
    if (rv == 0) {
        kvt_client *c = td_connect(&D);
        check_disk_full(&D, c);
        kvt_close(c);
        assert_int_equal(td_stop(&D), 0);
    }
    snprintf(cmd, sizeof cmd, "umount %s", mnt);
    assert_int_equal(system(cmd), 0);
    td_cleanup(&D);
    assert_int_equal(rv, 0);
}

static void test_no_registered_buffers(void **state)
{
    (void)state;
    struct tdaemon D;
    start_with_fault(&D, "uring_regbuf=1", 64, NULL);
    kvt_client *c = td_connect(&D);
    assert_true(td_log_has(&D, "registered buffers unavailable"));
    assert_int_equal(nvt_stat(c, "registered_buffers"), 0);
    assert_int_equal(nvt_put_chain(c, 1, 8, CH), KVT_OK);
    assert_int_equal(nvt_flush(c, 1, NULL), KVT_OK);
    for (int i = 1; i <= 8; i++) assert_true(nvt_check(c, i, CH));
    stop(&D, c);
    /* Without the fault they are registered (root here; a non-root user
     * under an 8 MiB limit takes the path above). */
    start_with_fault(&D, NULL, 64, NULL);
    c = td_connect(&D);
    if (geteuid() == 0) assert_int_equal(nvt_stat(c, "registered_buffers"), 1);
    stop(&D, c);
}

/* The real thing: no CAP_IPC_LOCK and `ulimit -l 8192` (a non-root
 * user's limit here) cannot pin a 64 MiB pool: plain I/O, same bytes.
 * Needs root (to drop the capability) and capsh. */
static void test_memlock_limit(void **state)
{
    (void)state;
    struct tdaemon D;
    char wrap[400], real[300];
    const char *bin = getenv("KVTIERD");
    if (geteuid() != 0 || system("command -v capsh >/dev/null 2>&1") != 0) skip();
    assert_int_equal(td_init(&D), 0);
    snprintf(real, sizeof real, "%s", bin && bin[0] ? bin : "build/bin/kvtierd");
    snprintf(wrap, sizeof wrap, "%s/kvtierd-memlock.sh", D.dir);
    FILE *f = fopen(wrap, "w");
    assert_non_null(f);
    fprintf(f, "#!/bin/sh\nexec capsh --drop=cap_ipc_lock -- -c "
               "'ulimit -l 8192; exec \"$0\" \"$@\"' '%s' \"$@\"\n", real);
    fclose(f);
    assert_int_equal(chmod(wrap, 0755), 0);
    setenv("KVTIERD", wrap, 1);
    int rv = nvt_start(&D, 64, 16, NULL);
    setenv("KVTIERD", real, 1);
    assert_int_equal(rv, 0);
    kvt_client *c = td_connect(&D);
    assert_true(td_log_has(&D, "locked-memory limit"));
    assert_int_equal(nvt_stat(c, "registered_buffers"), 0);
    assert_int_equal(nvt_put_chain(c, 1, 8, CH), KVT_OK);
    assert_int_equal(nvt_flush(c, 1, NULL), KVT_OK);
    for (int i = 1; i <= 8; i++) assert_true(nvt_check(c, i, CH));
    stop(&D, c);
}

static void test_bad_fault_spec(void **state)
{
    (void)state;
    struct tdaemon D;
    const char *args[32];
    assert_int_equal(td_init(&D), 0);
    nvt_args(args, 32, 64, 16, NULL);
    setenv("KVT_FAULT", "no_such_point=1", 1);
    pid_t pid = td_spawn(&D, args);
    unsetenv("KVT_FAULT");
    assert_int_not_equal(td_wait_exit(pid, 10000), 0);
    assert_true(td_log_has(&D, "KVT_FAULT"));
    td_cleanup(&D);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_flipped_bytes_get),
        cmocka_unit_test(test_flipped_bytes_verify),
        cmocka_unit_test(test_read_error),
        cmocka_unit_test(test_write_error),
        cmocka_unit_test(test_disk_full_injected),
        cmocka_unit_test(test_disk_full_loop),
        cmocka_unit_test(test_no_registered_buffers),
        cmocka_unit_test(test_memlock_limit),
        cmocka_unit_test(test_bad_fault_spec),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
