/*
 * test_ops_fail.c -- the operations surface's failure paths: a bad or
 * taken metrics address stops start-up with a clear message (and the line
 * number for a file), a notification socket that cannot be reached is
 * logged once and otherwise ignored, and --print-config refuses what the
 * daemon would refuse.
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "daemon.h"
#include "kvtier.h"
#include "ops.h"

static struct tdaemon D;

static int teardown(void **state)
{
    (void)state;
    td_cleanup(&D);
    memset(&D, 0, sizeof D);
    unsetenv("NOTIFY_SOCKET");
    return 0;
}

static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

/* Start with extra args; expect the process to exit with code. */
static void expect_exit(const char *const *extra, int code)
{
    pid_t p = td_spawn(&D, extra);
    assert_int_equal(td_wait_exit(p, 15000), code);
}

static void test_bad_metrics_address(void **state)
{
    (void)state;
    char path[400];
    assert_int_equal(td_init(&D), 0);
    snprintf(path, sizeof path, "%s/m.conf", D.dir);
    write_file(path, "[daemon]\nlog_level = info\n[metrics]\nlisten = nonsense\n");
    const char *file[] = {"--config", path, NULL};
    expect_exit(file, 2);
    assert_true(td_log_has(&D, "line 4: metrics.listen = 'nonsense'"));
    const char *flag[] = {"--metrics.listen", "127.0.0.1:70000", NULL};
    expect_exit(flag, 2);
    assert_true(td_log_has(&D, "--metrics.listen: metrics.listen = '127.0.0.1:70000'"));
    const char *v6[] = {"--metrics.listen", "::1:9464", NULL};
    expect_exit(v6, 2);
}

static void test_metrics_port_taken(void **state)
{
    (void)state;
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET};
    socklen_t len = sizeof sa;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(bind(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    assert_int_equal(listen(fd, 1), 0);
    assert_int_equal(getsockname(fd, (struct sockaddr *)&sa, &len), 0);
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%u", ntohs(sa.sin_port));
    assert_int_equal(td_init(&D), 0);
    const char *extra[] = {"--metrics.listen", addr, NULL};
    expect_exit(extra, 1);
    assert_true(td_log_has(&D, "metrics: cannot serve on"));
    /* Nothing was left behind: the same socket starts cleanly afterwards. */
    close(fd);
    const char *any[] = {"--metrics.listen", "127.0.0.1:0", NULL};
    assert_int_equal(td_start(&D, any), 0);
}

static void test_unreachable_notify_socket(void **state)
{
    (void)state;
    assert_int_equal(td_init(&D), 0);
    setenv("NOTIFY_SOCKET", "/nonexistent/notify.sock", 1);
    assert_int_equal(td_start(&D, NULL), 0);
    kvt_client *c = td_connect(&D);
    kvt_close(c);
    assert_true(ops_wait_log(&D, "systemd notification failed", 5000));
    assert_int_equal(td_stop(&D), 0);
    /* Not a path or @name at all. */
    setenv("NOTIFY_SOCKET", "relative.sock", 1);
    assert_int_equal(td_start(&D, NULL), 0);
    assert_true(ops_wait_log(&D, "is not a socket path or @abstract name", 5000));
    assert_int_equal(td_stop(&D), 0);
}

/* A scrape that finds the hand-off queue full gets 503 at once (the bound
 * shrunk to 0 so every scrape finds it full); the daemon serves on. */
static void test_scrape_queue_full(void **state)
{
    (void)state;
    char base[128], *body = NULL;
    int status = 0;
    setenv("KVT_FAULT_METRICS_QUEUE", "0", 1);
    assert_int_equal(td_init(&D), 0);
    const char *extra[] = {"--metrics.listen", "127.0.0.1:0", NULL};
    int rc = td_start(&D, extra);
    unsetenv("KVT_FAULT_METRICS_QUEUE");
    assert_int_equal(rc, 0);
    assert_int_equal(ops_metrics_base(&D, base, sizeof base, 5000), 0);
    assert_int_equal(ops_http_get(base, "/metrics", &status, &body), 0);
    assert_int_equal(status, 503);
    free(body);
    kvt_client *c = td_connect(&D);
    kvt_close(c);
    assert_int_equal(td_stop(&D), 0);
}

/* Run kvtierd with argv (no daemon started); its exit status. */
static int run_cmd(const char *const *argv)
{
    pid_t p = fork();
    if (p == 0) {
        const char *bin = getenv("KVTIERD");
        freopen("/dev/null", "w", stdout);
        freopen("/dev/null", "w", stderr);
        execv(bin && bin[0] ? bin : "build/bin/kvtierd", (char *const *)argv);
        _exit(127);
    }
    int st;
    waitpid(p, &st, 0);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void test_print_config_checks(void **state)
{
    (void)state;
    const char *ok[] = {"kvtierd", "--print-config", "--pool-bytes", "2G", NULL};
    const char *low[] = {"kvtierd", "--print-config", "--low-watermark", "0.99", NULL};
    const char *range[] = {"kvtierd", "--print-config", "--drain-timeout-ms", "999999999", NULL};
    const char *nofile[] = {"kvtierd", "--config", NULL};
    const char *missing[] = {"kvtierd", "--print-config", "--config", "/nonexistent.conf", NULL};
    assert_int_equal(run_cmd(ok), 0);
    assert_int_equal(run_cmd(low), 2);
    assert_int_equal(run_cmd(range), 2);
    assert_int_equal(run_cmd(nofile), 2);
    assert_int_equal(run_cmd(missing), 2);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_bad_metrics_address, teardown),
        cmocka_unit_test_teardown(test_metrics_port_taken, teardown),
        cmocka_unit_test_teardown(test_unreachable_notify_socket, teardown),
        cmocka_unit_test_teardown(test_print_config_checks, teardown),
        cmocka_unit_test_teardown(test_scrape_queue_full, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
