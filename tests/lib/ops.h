/*
 * ops.h -- test helpers for the operations surface: the metrics endpoint
 * (a tiny HTTP GET and a strict Prometheus text-format parser), waiting on
 * log lines, and a systemd notification socket stand-in.
 *
 * The parser rejects anything the 0.0.4 text format does not allow, plus
 * what kvtierd promises never to write (blank lines, timestamps, samples
 * outside a declared family), so a test that parses a scrape has also
 * checked its syntax.
 */
#ifndef KVT_TEST_OPS_H
#define KVT_TEST_OPS_H

#include <stddef.h>

#include "daemon.h"

/* The daemon's metrics url from its log ("http://127.0.0.1:PORT"), without
 * the path; waits up to ms for the line. 0 or -1. */
int ops_metrics_base(const struct tdaemon *d, char *url, size_t len, int ms);

/* GET base+path. *status receives the HTTP status, *body a malloc'd
 * NUL-terminated body (caller frees). 0, or -1 if no response came. */
int ops_http_get(const char *base, const char *path, int *status, char **body);

/* Wait up to ms for the daemon's log to contain s. 1 if it did. */
int ops_wait_log(const struct tdaemon *d, const char *s, int ms);
/* Lines in the daemon's log so far. */
int ops_log_lines(const struct tdaemon *d);

/* ---------------------------------------------------------- exposition */

struct prom_sample {
    char *name;   /* sample name (with _bucket/_sum/_count) */
    char *labels; /* labels as written, without braces ("" if none) */
    double value;
};

struct prom {
    struct prom_sample *s;
    size_t n;
    char err[256]; /* why parsing failed */
};

/* Parse a scrape strictly; 0, or -1 with the reason (and line) in p->err. */
int prom_parse(const char *text, struct prom *p);
void prom_free(struct prom *p);
/* The value of the sample named name with exactly these labels (as
 * written, e.g. "tier=\"dram\""); -1 if absent. */
double prom_get(const struct prom *p, const char *name, const char *labels);
/* Sum of every sample named name whose labels contain sub (NULL: all). */
double prom_sum(const struct prom *p, const char *name, const char *sub);
/* Unescape a label value written between quotes (\\, \", \n). */
void prom_unescape(const char *in, size_t n, char *out, size_t outlen);

/* -------------------------------------------------------------- notify */

/* Bind a datagram socket at an abstract name (abstract = 1) or a path
 * under dir, and point $NOTIFY_SOCKET at it. Returns the fd or -1. */
int ops_notify_listen(const char *dir, int abstract);
/* Read datagrams for up to ms until one contains want; appends everything
 * read to log (cap bytes). 1 if want was seen. */
int ops_notify_wait(int fd, const char *want, int ms, char *log, size_t cap);

#endif
