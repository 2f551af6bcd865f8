/*
 * tlsconf.c -- nng TLS configurations from PEM files (see tlsconf.h).
 */
#include "tlsconf.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PEM_MAX (1u << 20)

/* The whole file, NUL-terminated (PEM is text); NULL with err set. */
static char *slurp(const char *path, char *err, size_t errlen)
{
    FILE *f = fopen(path, "re");
    char *buf = NULL;
    size_t n = 0;
    if (!f) {
        snprintf(err, errlen, "%s: %s", path, strerror(errno));
        return NULL;
    }
    buf = malloc(PEM_MAX + 1);
    if (!buf) abort(); /* control-plane allocation */
    n = fread(buf, 1, PEM_MAX + 1, f);
    fclose(f);
    if (n == 0 || n > PEM_MAX) {
        snprintf(err, errlen, "%s: %s", path, n ? "over 1 MiB" : "empty");
        free(buf);
        return NULL;
    }
    buf[n] = '\0';
    return buf;
}

static int has(const char *s)
{
    return s && s[0];
}

static int own_cert(nng_tls_config *c, const struct tlsconf_files *f, char *err,
                    size_t errlen)
{
    char *cert = slurp(f->cert, err, errlen);
    char *key = cert ? slurp(f->key, err, errlen) : NULL;
    int rv = key ? nng_tls_config_own_cert(c, cert, key, NULL) : -1;
    if (rv > 0)
        snprintf(err, errlen, "certificate %s with key %s: %s", f->cert, f->key,
                 nng_strerror(rv));
    free(cert);
    free(key);
    return rv ? -1 : 0;
}

static int peer_auth(nng_tls_config *c, int server, const struct tlsconf_files *f,
                     char *err, size_t errlen)
{
    int rv = 0;
    if (has(f->ca)) {
        rv = nng_tls_config_ca_file(c, f->ca);
        if (rv == 0) rv = nng_tls_config_auth_mode(c, NNG_TLS_AUTH_MODE_REQUIRED);
    } else if (server) {
        rv = nng_tls_config_auth_mode(c, NNG_TLS_AUTH_MODE_NONE);
    } else {
        snprintf(err, errlen, "a TLS client needs the CA of the server's certificate");
        return -1;
    }
    if (rv == 0 && !server && has(f->server_name))
        rv = nng_tls_config_server_name(c, f->server_name);
    if (rv != 0)
        snprintf(err, errlen, "CA %s: %s", has(f->ca) ? f->ca : "(none)",
                 nng_strerror(rv));
    return rv ? -1 : 0;
}

int tlsconf_new(int server, const struct tlsconf_files *f, nng_tls_config **out,
                char *err, size_t errlen)
{
    nng_tls_config *c = NULL;
    if (has(f->cert) != has(f->key) || (server && !has(f->cert))) {
        snprintf(err, errlen, "TLS wants a certificate and its key together%s",
                 server ? " (a server must have them)" : "");
        return -1;
    }
    int rv = nng_tls_config_alloc(&c, server ? NNG_TLS_MODE_SERVER : NNG_TLS_MODE_CLIENT);
    if (rv != 0) {
        snprintf(err, errlen, "TLS: %s", nng_strerror(rv));
        return -1;
    }
    if ((has(f->cert) && own_cert(c, f, err, errlen) != 0) ||
        peer_auth(c, server, f, err, errlen) != 0) {
        nng_tls_config_free(c);
        return -1;
    }
    *out = c;
    return 0;
}
