/*
 * config.c -- the key table and its three readers (see config.h).
 */
#include "config.h"

#include <errno.h>
#include <ini.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "xxhash.h"

enum cfg_type { CFG_STR, CFG_U64, CFG_BYTES, CFG_FRAC, CFG_OCTAL, CFG_LEVEL };

struct cfg_key {
    const char *section, *name;
    enum cfg_type type;
    size_t off, size;
    const char *def;
    double min, max;
    const char *help;
};

#define F(field) offsetof(struct kvt_config, field), sizeof(((struct kvt_config *)0)->field)

static const struct cfg_key keys[] = {
    {"daemon", "socket", CFG_STR, F(socket), "ipc://./var/kvtierd.sock", 0, 0,
     "nng url clients dial; ipc:// for local engines"},
    {"daemon", "tcp", CFG_STR, F(tcp), "", 0, 0,
     "optional tcp:// listener for remote clients (copying calls only)"},
    {"daemon", "state_dir", CFG_STR, F(state_dir), "./var", 0, 0,
     "directory for lock files and state"},
    {"daemon", "log_level", CFG_LEVEL, F(log_level), "info", 0, 0,
     "error, warn, info or debug"},
    {"daemon", "contexts", CFG_U64, F(contexts), "32", 1, 1024,
     "requests served concurrently (nng contexts)"},
    {"daemon", "lease_timeout_ms", CFG_U64, F(lease_timeout_ms), "30000", 10,
     86400000, "milliseconds before an unreleased lease is dropped"},
    {"daemon", "max_keys", CFG_U64, F(max_keys), "4096", 1, 1048576,
     "keys one request may carry"},
    {"daemon", "max_msg_bytes", CFG_BYTES, F(max_msg_bytes), "80M", 4096,
     4294967295.0, "largest request message accepted (bytes)"},
    {"dram", "pool_path", CFG_STR, F(pool_path), "", 0, 0,
     "shared-memory pool file; empty: /dev/shm/kvtier-<hash of socket>.pool"},
    {"dram", "pool_bytes", CFG_BYTES, F(pool_bytes), "1G", 1048576, 1099511627776.0,
     "DRAM pool capacity (bytes; K, M, G, T suffixes)"},
    {"dram", "max_chunk_bytes", CFG_BYTES, F(max_chunk_bytes), "256M", 1, 4294967295.0,
     "largest single chunk (bytes)"},
    {"dram", "high_watermark", CFG_FRAC, F(high_watermark), "0.95", 0.01, 1.0,
     "fraction of the pool above which eviction starts"},
    {"dram", "low_watermark", CFG_FRAC, F(low_watermark), "0.85", 0.0, 1.0,
     "fraction of the pool eviction brings usage down to"},
    {"dram", "pool_mode", CFG_OCTAL, F(pool_mode), "0600", 0, 0777,
     "file mode of the pool file and socket (octal)"},
    {"dram", "pool_group", CFG_STR, F(pool_group), "", 0, 0,
     "group owning the pool file and socket (empty: the daemon's)"},
};
#define NKEYS (sizeof keys / sizeof keys[0])

int config_parse_bytes(const char *s, uint64_t *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || errno != 0 || v < 0 || !isfinite(v)) return -1;
    double mul = 1;
    switch (*end) {
    case 'k': case 'K': mul = 1024.0; end++; break;
    case 'm': case 'M': mul = 1048576.0; end++; break;
    case 'g': case 'G': mul = 1073741824.0; end++; break;
    case 't': case 'T': mul = 1099511627776.0; end++; break;
    default: break;
    }
    if (*end == 'i' || *end == 'B') end++;
    if (*end == 'B') end++;
    if (*end != '\0') return -1;
    v *= mul;
    if (v >= 18446744073709551615.0) return -1;
    *out = (uint64_t)v;
    return 0;
}

static int norm_eq(const char *a, const char *b)
{
    for (; *a && *b; a++, b++) {
        char x = *a == '-' ? '_' : *a, y = *b == '-' ? '_' : *b;
        if (x != y) return 0;
    }
    return *a == *b;
}

static const struct cfg_key *find_key(const char *section, const char *name)
{
    const struct cfg_key *hit = NULL;
    for (size_t i = 0; i < NKEYS; i++) {
        if (!norm_eq(keys[i].name, name)) continue;
        if (section && strcmp(keys[i].section, section) != 0) continue;
        if (hit) return NULL; /* ambiguous without a section */
        hit = &keys[i];
    }
    return hit;
}

static int range_err(const struct cfg_key *k, const char *v, char *err,
                     size_t errlen)
{
    snprintf(err, errlen, "%s.%s = '%s': out of range [%g, %g]", k->section,
             k->name, v, k->min, k->max);
    return -1;
}

static int set_number(const struct cfg_key *k, void *dst, const char *v,
                      char *err, size_t errlen)
{
    uint64_t u;
    char *end;
    errno = 0;
    if (k->type == CFG_FRAC) {
        double d = strtod(v, &end);
        if (end == v || *end || errno || d < k->min || d > k->max)
            return range_err(k, v, err, errlen);
        *(double *)dst = d;
        return 0;
    }
    if (k->type == CFG_BYTES) {
        if (config_parse_bytes(v, &u) != 0) return range_err(k, v, err, errlen);
    } else {
        u = strtoull(v, &end, k->type == CFG_OCTAL ? 8 : 10);
        if (end == v || *end || errno || v[0] == '-')
            return range_err(k, v, err, errlen);
    }
    if ((double)u < k->min || (double)u > k->max) return range_err(k, v, err, errlen);
    *(uint64_t *)dst = u;
    return 0;
}

static int set_value(struct kvt_config *c, const struct cfg_key *k,
                     const char *v, char *err, size_t errlen)
{
    void *dst = (char *)c + k->off;
    switch (k->type) {
    case CFG_LEVEL:
        if (log_level_parse(v) < 0) {
            snprintf(err, errlen, "%s.%s = '%s': not a log level", k->section,
                     k->name, v);
            return -1;
        }
        /* fallthrough */
    case CFG_STR:
        if (strlen(v) >= k->size) {
            snprintf(err, errlen, "%s.%s: value too long", k->section, k->name);
            return -1;
        }
        memcpy(dst, v, strlen(v) + 1);
        return 0;
    default:
        return set_number(k, dst, v, err, errlen);
    }
}

void config_defaults(struct kvt_config *c)
{
    char err[256];
    memset(c, 0, sizeof *c);
    for (size_t i = 0; i < NKEYS; i++)
        if (set_value(c, &keys[i], keys[i].def, err, sizeof err) != 0) abort();
}

int config_set(struct kvt_config *c, const char *key, const char *value,
               char *err, size_t errlen)
{
    char section[64] = "";
    const char *name = key, *dot = strchr(key, '.');
    if (dot) {
        size_t n = (size_t)(dot - key);
        if (n >= sizeof section) n = sizeof section - 1;
        memcpy(section, key, n);
        section[n] = '\0';
        name = dot + 1;
    }
    const struct cfg_key *k = find_key(dot ? section : NULL, name);
    if (!k) {
        snprintf(err, errlen, "unknown key '%s'", key);
        return -1;
    }
    return set_value(c, k, value, err, errlen);
}

struct ini_ctx {
    struct kvt_config *c;
    char msg[256]; /* first error; inih reports its line */
    int failed;
};

static int ini_cb(void *user, const char *section, const char *name,
                  const char *value)
{
    struct ini_ctx *x = user;
    if (x->failed) return 0;
    const struct cfg_key *k = find_key(section, name);
    if (!k) {
        snprintf(x->msg, sizeof x->msg, "unknown key '%s' in [%s]", name, section);
        x->failed = 1;
        return 0;
    }
    if (set_value(x->c, k, value, x->msg, sizeof x->msg) != 0) {
        x->failed = 1;
        return 0;
    }
    return 1;
}

int config_load_file(struct kvt_config *c, const char *path, char *err,
                     size_t errlen)
{
    struct ini_ctx x = {.c = c};
    FILE *f = fopen(path, "r");
    if (!f) {
        snprintf(err, errlen, "%s: %s", path, strerror(errno));
        return -1;
    }
    int rv = ini_parse_file(f, ini_cb, &x);
    fclose(f);
    if (x.failed) {
        snprintf(err, errlen, "line %d: %s", rv, x.msg);
        return -1;
    }
    if (rv != 0) {
        snprintf(err, errlen, "%s: line %d: syntax error", path, rv);
        return -1;
    }
    return 0;
}

int config_finish(struct kvt_config *c, char *err, size_t errlen)
{
    if (c->low_watermark >= c->high_watermark) {
        snprintf(err, errlen, "dram.low_watermark (%g) must be below "
                 "dram.high_watermark (%g)", c->low_watermark, c->high_watermark);
        return -1;
    }
    if (c->max_chunk_bytes > c->pool_bytes) c->max_chunk_bytes = c->pool_bytes;
    if (strncmp(c->socket, "ipc://", 6) != 0 && strncmp(c->socket, "tcp://", 6) != 0) {
        snprintf(err, errlen, "daemon.socket '%s': want ipc:// or tcp://", c->socket);
        return -1;
    }
    if (c->tcp[0] && strncmp(c->tcp, "tcp://", 6) != 0) {
        snprintf(err, errlen, "daemon.tcp '%s': want tcp://host:port", c->tcp);
        return -1;
    }
    if (c->pool_path[0] == '\0')
        snprintf(c->pool_path, sizeof c->pool_path, "/dev/shm/kvtier-%016llx.pool",
                 (unsigned long long)XXH3_64bits(c->socket, strlen(c->socket)));
    return 0;
}

void config_print_reference(FILE *f)
{
    const char *sec = "";
    for (size_t i = 0; i < NKEYS; i++) {
        if (strcmp(sec, keys[i].section) != 0) {
            sec = keys[i].section;
            fprintf(f, "%s[%s]\n", i ? "\n" : "", sec);
        }
        fprintf(f, "# %s\n%s = %s\n", keys[i].help, keys[i].name, keys[i].def);
    }
}
