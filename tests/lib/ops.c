/*
 * ops.c -- HTTP, log, notify and exposition-format helpers (see ops.h).
 *
 * The parser works line by line with one current family: HELP and TYPE
 * open it, its samples follow, and the next family closes it for good
 * (a family may not reappear). Histogram series are checked as they come:
 * le ascending, counts cumulative, a final +Inf bucket equal to _count.
 */
#include "ops.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

/* ------------------------------------------------------------ log, http */

int ops_wait_log(const struct tdaemon *d, const char *s, int ms)
{
    long long deadline = td_now_ms() + ms;
    do {
        if (td_log_has(d, s)) return 1;
        usleep(20000);
    } while (td_now_ms() < deadline);
    return td_log_has(d, s);
}

int ops_log_lines(const struct tdaemon *d)
{
    FILE *f = fopen(d->log, "r");
    int n = 0, ch;
    while (f && (ch = fgetc(f)) != EOF) n += ch == '\n';
    if (f) fclose(f);
    return n;
}

int ops_metrics_base(const struct tdaemon *d, char *url, size_t len, int ms)
{
    const char *tag = "metrics: serving ";
    char line[2048];
    if (!ops_wait_log(d, tag, ms)) return -1;
    FILE *f = fopen(d->log, "r");
    int found = 0;
    while (f && fgets(line, sizeof line, f)) { /* the last: a restart logs anew */
        char *p = strstr(line, tag);
        if (!p) continue;
        p += strlen(tag);
        char *end = strstr(p, "/metrics");
        if (!end) continue;
        snprintf(url, len, "%.*s", (int)(end - p), p);
        found = 1;
    }
    if (f) fclose(f);
    return found ? 0 : -1;
}

static int dial(const char *base)
{
    char host[64];
    unsigned port;
    if (sscanf(base, "http://%63[0-9.]:%u", host, &port) != 2) return -1;
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    if (inet_pton(AF_INET, host, &sa.sin_addr) != 1) return -1;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd >= 0 && connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0) return fd;
    if (fd >= 0) close(fd);
    return -1;
}

static char *read_all_fd(int fd, size_t *n)
{
    size_t cap = 65536;
    char *b = malloc(cap + 1);
    *n = 0;
    for (;;) {
        struct pollfd p = {fd, POLLIN, 0};
        if (poll(&p, 1, 10000) <= 0) break;
        ssize_t r = read(fd, b + *n, cap - *n);
        if (r <= 0) break;
        *n += (size_t)r;
        if (*n == cap) b = realloc(b, (cap *= 2) + 1);
    }
    b[*n] = '\0';
    return b;
}

int ops_http_get(const char *base, const char *path, int *status, char **body)
{
    char req[512];
    int fd = dial(base);
    if (fd < 0) return -1;
    int n = snprintf(req, sizeof req, "GET %s HTTP/1.1\r\nHost: test\r\n"
                     "Connection: close\r\n\r\n", path);
    if (write(fd, req, (size_t)n) != n) {
        close(fd);
        return -1;
    }
    size_t len;
    char *raw = read_all_fd(fd, &len);
    close(fd);
    char *sep = strstr(raw, "\r\n\r\n");
    if (!sep || sscanf(raw, "HTTP/1.%*d %d", status) != 1) {
        free(raw);
        return -1;
    }
    *body = strdup(sep + 4);
    free(raw);
    return 0;
}

/* -------------------------------------------------------------- notify */

int ops_notify_listen(const char *dir, int abstract)
{
    static int seq;
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    char name[108];
    if (abstract) snprintf(name, sizeof name, "@kvt-test-notify-%d-%d", (int)getpid(), seq++);
    else snprintf(name, sizeof name, "%s/notify-%d.sock", dir, seq++);
    memcpy(sa.sun_path, name, strlen(name));
    if (abstract) sa.sun_path[0] = '\0';
    socklen_t len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + strlen(name));
    int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0 || bind(fd, (struct sockaddr *)&sa, len) != 0) {
        if (fd >= 0) close(fd);
        return -1;
    }
    setenv("NOTIFY_SOCKET", name, 1);
    return fd;
}

int ops_notify_wait(int fd, const char *want, int ms, char *log, size_t cap)
{
    long long deadline = td_now_ms() + ms;
    while (td_now_ms() < deadline) {
        struct pollfd p = {fd, POLLIN, 0};
        if (poll(&p, 1, 100) <= 0) continue;
        char buf[4096];
        ssize_t r = recv(fd, buf, sizeof buf - 1, 0);
        if (r <= 0) continue;
        buf[r] = '\0';
        size_t used = strlen(log);
        snprintf(log + used, cap - used, "%s|", buf);
        if (strstr(buf, want)) return 1;
    }
    return 0;
}

/* ---------------------------------------------------------- exposition */

struct fam {
    char name[128], type[16];
    int help, typed, samples;
};

struct hist {
    char key[512]; /* labels without le */
    double le, cum;
    int open;      /* buckets seen, +Inf not yet */
};

struct infv {
    char key[512];
    double v;
};

struct pst {
    struct prom *p;
    struct fam *f;
    size_t nf;
    struct fam *cur;
    struct hist h;
    struct infv *inf;
    size_t ninf;
    int line;
};

static int perr(struct pst *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int perr(struct pst *s, const char *fmt, ...)
{
    va_list ap;
    int n = snprintf(s->p->err, sizeof s->p->err, "line %d: ", s->line);
    va_start(ap, fmt);
    vsnprintf(s->p->err + n, sizeof s->p->err - (size_t)n, fmt, ap);
    va_end(ap);
    return -1;
}

static size_t name_len(const char *p, int metric)
{
    size_t n = 0;
    if (!(isalpha((unsigned char)p[0]) || p[0] == '_' || (metric && p[0] == ':'))) return 0;
    while (isalnum((unsigned char)p[n]) || p[n] == '_' || (metric && p[n] == ':')) n++;
    return n;
}

static struct fam *fam_find(struct pst *s, const char *name, size_t n)
{
    for (size_t i = 0; i < s->nf; i++)
        if (strlen(s->f[i].name) == n && !strncmp(s->f[i].name, name, n)) return &s->f[i];
    return NULL;
}

/* The family a HELP or TYPE line names; opens it (closing the current). */
static struct fam *fam_open(struct pst *s, const char *name, size_t n)
{
    struct fam *f = fam_find(s, name, n);
    if (f && f != s->cur) return NULL; /* a family may not reappear */
    if (!f) {
        s->f = realloc(s->f, (s->nf + 1) * sizeof *s->f);
        f = &s->f[s->nf++];
        memset(f, 0, sizeof *f);
        snprintf(f->name, sizeof f->name, "%.*s", (int)n, name);
    }
    if (s->h.open) return NULL; /* previous histogram series unfinished */
    s->cur = f;
    return f;
}

static int meta_line(struct pst *s, const char *l)
{
    int help = !strncmp(l, "# HELP ", 7), type = !strncmp(l, "# TYPE ", 7);
    if (!help && !type) return perr(s, "comment that is neither HELP nor TYPE");
    size_t n = name_len(l + 7, 1);
    if (n == 0 || l[7 + n] != ' ') return perr(s, "bad metric name in %s", l);
    struct fam *f = fam_open(s, l + 7, n);
    if (!f) return perr(s, "family %.*s reappears or interrupts a histogram", (int)n, l + 7);
    const char *rest = l + 8 + n;
    if (help) {
        if (f->help++) return perr(s, "second HELP for %s", f->name);
        for (const char *c = rest; *c; c++)
            if (*c == '\\' && (*++c != '\\' && *c != 'n'))
                return perr(s, "bad escape in HELP");
        return 0;
    }
    if (f->typed++ || f->samples) return perr(s, "TYPE for %s repeated or late", f->name);
    static const char *const types[] = {"counter", "gauge", "histogram", "summary", "untyped"};
    for (int i = 0; i < 5; i++)
        if (!strcmp(rest, types[i])) {
            snprintf(f->type, sizeof f->type, "%s", rest);
            return 0;
        }
    return perr(s, "unknown type '%s'", rest);
}

/* Parse {a="x",b="y"}; *end after the brace. Labels must be unique. */
static int parse_labels(struct pst *s, const char *p, const char **end)
{
    char seen[16][64];
    int ns = 0;
    if (*p != '{') {
        *end = p;
        return 0;
    }
    p++;
    while (*p != '}') {
        size_t n = name_len(p, 0);
        if (n == 0 || n >= 64 || p[n] != '=' || p[n + 1] != '"')
            return perr(s, "bad label at '%.20s'", p);
        for (int i = 0; i < ns; i++)
            if (strlen(seen[i]) == n && !strncmp(seen[i], p, n))
                return perr(s, "label %.*s twice", (int)n, p);
        if (ns < 16) snprintf(seen[ns++], 64, "%.*s", (int)n, p);
        p += n + 2;
        for (; *p != '"'; p++) {
            if (!*p) return perr(s, "unterminated label value");
            if (*p == '\\' && !strchr("\\\"n", *++p)) return perr(s, "bad escape \\%c", *p);
        }
        p++;
        if (*p == ',') p++;
        else if (*p != '}') return perr(s, "expected , or } after a label");
    }
    *end = p + 1;
    return 0;
}

static int parse_value(const char *v, double *out)
{
    char *e;
    if (!strcmp(v, "+Inf")) *out = INFINITY;
    else if (!strcmp(v, "-Inf")) *out = -INFINITY;
    else if (!strcmp(v, "NaN")) *out = NAN;
    else {
        if (!*v || isspace((unsigned char)*v)) return -1;
        *out = strtod(v, &e);
        if (*e) return -1;
    }
    return 0;
}

/* Copy labels into key without the le pair; put le's value in *le. */
static int split_le(const char *labels, char *key, size_t cap, double *le)
{
    const char *p = strstr(labels, "le=\"");
    if (!p || (p != labels && p[-1] != ',')) return -1;
    const char *q = strchr(p + 4, '"');
    char v[64];
    snprintf(v, sizeof v, "%.*s", (int)(q - p - 4), p + 4);
    if (parse_value(v, le) != 0) return -1;
    size_t a = (size_t)(p - labels);
    snprintf(key, cap, "%.*s%s", (int)(a ? a - 1 : 0), labels, q[1] == ',' ? q + 1 : "");
    if (a == 0 && q[1] == ',') snprintf(key, cap, "%s", q + 2);
    return 0;
}

static int hist_bucket(struct pst *s, const char *labels, double v)
{
    char key[512];
    double le;
    if (split_le(labels, key, sizeof key, &le) != 0) return perr(s, "_bucket without le");
    if (!s->h.open || strcmp(key, s->h.key)) {
        if (s->h.open) return perr(s, "series %s ended without +Inf", s->h.key);
        snprintf(s->h.key, sizeof s->h.key, "%s", key);
        s->h.open = 1;
        s->h.le = -INFINITY;
        s->h.cum = 0;
    }
    if (!(le > s->h.le)) return perr(s, "le not ascending");
    if (v < s->h.cum) return perr(s, "bucket counts not cumulative");
    s->h.le = le;
    s->h.cum = v;
    if (isinf(le)) {
        s->h.open = 0;
        s->inf = realloc(s->inf, (s->ninf + 1) * sizeof *s->inf);
        snprintf(s->inf[s->ninf].key, sizeof s->inf->key, "%s", key);
        s->inf[s->ninf++].v = v;
    }
    return 0;
}

static int hist_count(struct pst *s, const char *labels, double v)
{
    for (size_t i = 0; i < s->ninf; i++)
        if (!strcmp(s->inf[i].key, labels))
            return s->inf[i].v == v ? 0 : perr(s, "_count != +Inf bucket");
    return perr(s, "_count before its +Inf bucket");
}

/* Check the sample belongs to the current family; histogram rules. */
static int family_rules(struct pst *s, const char *name, const char *labels, double v)
{
    struct fam *f = s->cur;
    if (!f || !f->typed) return perr(s, "sample %s outside a typed family", name);
    size_t fl = strlen(f->name);
    if (strcmp(f->type, "histogram")) {
        if (strcmp(name, f->name)) return perr(s, "%s in family %s", name, f->name);
        return 0;
    }
    if (strncmp(name, f->name, fl)) return perr(s, "%s in family %s", name, f->name);
    const char *suf = name + fl;
    if (!strcmp(suf, "_bucket")) return hist_bucket(s, labels, v);
    if (s->h.open) return perr(s, "%s inside an unfinished bucket series", name);
    if (!strcmp(suf, "_count")) return hist_count(s, labels, v);
    if (!strcmp(suf, "_sum")) return 0;
    return perr(s, "%s is not _bucket/_sum/_count", name);
}

static int sample_line(struct pst *s, const char *l)
{
    size_t n = name_len(l, 1);
    const char *lab, *end = NULL;
    if (n == 0) return perr(s, "bad sample name");
    lab = l + n;
    if (parse_labels(s, lab, &end) != 0) return -1;
    if (*end != ' ') return perr(s, "want one space before the value");
    double v;
    if (parse_value(end + 1, &v) != 0) return perr(s, "bad value (or a timestamp) '%s'", end + 1);
    char name[160], labels[1024];
    snprintf(name, sizeof name, "%.*s", (int)n, l);
    size_t ll = (size_t)(end - lab);
    snprintf(labels, sizeof labels, "%.*s", ll >= 2 ? (int)(ll - 2) : 0, lab + 1);
    for (size_t i = 0; i < s->p->n; i++)
        if (!strcmp(s->p->s[i].name, name) && !strcmp(s->p->s[i].labels, labels))
            return perr(s, "duplicate series %s{%s}", name, labels);
    if (family_rules(s, name, labels, v) != 0) return -1;
    s->cur->samples++;
    s->p->s = realloc(s->p->s, (s->p->n + 1) * sizeof *s->p->s);
    s->p->s[s->p->n++] = (struct prom_sample){strdup(name), strdup(labels), v};
    return 0;
}

static int finish_parse(struct pst *s)
{
    if (s->h.open) return perr(s, "last histogram series without +Inf");
    for (size_t i = 0; i < s->nf; i++)
        if (!s->f[i].help || !s->f[i].typed)
            return perr(s, "family %s lacks HELP or TYPE", s->f[i].name);
    return 0;
}

int prom_parse(const char *text, struct prom *p)
{
    struct pst s = {.p = p};
    memset(p, 0, sizeof *p);
    int rc = 0;
    const char *l = text;
    if (!*text || text[strlen(text) - 1] != '\n') return perr(&s, "text does not end in a newline");
    while (rc == 0 && *l) {
        const char *nl = strchr(l, '\n');
        char *line = strndup(l, (size_t)(nl - l));
        s.line++;
        if (!*line) rc = perr(&s, "blank line");
        else if (line[0] == '#') rc = meta_line(&s, line);
        else rc = sample_line(&s, line);
        free(line);
        l = nl + 1;
    }
    if (rc == 0) rc = finish_parse(&s);
    free(s.f);
    free(s.inf);
    return rc;
}

void prom_free(struct prom *p)
{
    for (size_t i = 0; i < p->n; i++) {
        free(p->s[i].name);
        free(p->s[i].labels);
    }
    free(p->s);
    p->s = NULL;
    p->n = 0;
}

double prom_get(const struct prom *p, const char *name, const char *labels)
{
    for (size_t i = 0; i < p->n; i++)
        if (!strcmp(p->s[i].name, name) && !strcmp(p->s[i].labels, labels))
            return p->s[i].value;
    return -1;
}

double prom_sum(const struct prom *p, const char *name, const char *sub)
{
    double v = 0;
    for (size_t i = 0; i < p->n; i++)
        if (!strcmp(p->s[i].name, name) && (!sub || strstr(p->s[i].labels, sub)))
            v += p->s[i].value;
    return v;
}

void prom_unescape(const char *in, size_t n, char *out, size_t outlen)
{
    size_t o = 0;
    for (size_t i = 0; i < n && o + 1 < outlen; i++) {
        char c = in[i];
        if (c == '\\' && i + 1 < n) {
            c = in[++i];
            if (c == 'n') c = '\n';
        }
        out[o++] = c;
    }
    out[o] = '\0';
}
