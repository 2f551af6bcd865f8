/*
 * tlsconf.c -- one way to build the nng TLS configurations kvtier uses.
 *
 * Design: every TLS endpoint of the daemon (the cluster's control channel,
 * the remote client listener) authenticates both ends against one CA, so
 * the configuration is always the same three PEM files plus, on a dialer,
 * the name the peer's certificate must carry. nng reads PEM from memory;
 * the files are read here, bounded by TLSCONF_FILE_MAX, so a wrong path
 * or a huge file is an error value at startup rather than a failed
 * handshake later. The key material is wiped from our buffers once mbedTLS
 * has parsed it.
 */
#include "tlsconf.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The whole file as a NUL-terminated string (caller frees), or NULL. */
static char *slurp(const char *path, size_t *len, char *err, size_t errlen)
{
    FILE *f = path && path[0] ? fopen(path, "re") : NULL;
    char *buf = NULL;
    size_t n = 0;
    if (!f) {
        snprintf(err, errlen, "cannot open '%s': %s", path ? path : "",
                 path && path[0] ? strerror(errno) : "no file named");
        return NULL;
    }
    buf = malloc(TLSCONF_FILE_MAX + 1);
    if (buf) n = fread(buf, 1, TLSCONF_FILE_MAX + 1, f);
    if (!buf || ferror(f) || n > TLSCONF_FILE_MAX) {
        snprintf(err, errlen, "cannot read '%s' (at most %u bytes)", path,
                 TLSCONF_FILE_MAX);
        free(buf);
        buf = NULL;
    } else {
        buf[n] = 0;
        *len = n;
    }
    fclose(f);
    return buf;
}

static void wipe_free(char *p, size_t n)
{
    if (!p) return;
    volatile char *v = p;
    for (size_t i = 0; i < n; i++) v[i] = 0;
    free(p);
}

static int nng_fail(char *err, size_t errlen, const char *what, const char *path, int rv)
{
    snprintf(err, errlen, "%s '%s': %s", what, path, nng_strerror(rv));
    return -1;
}

/* Load the files into cfg. */
static int load(nng_tls_config *cfg, const struct tlsconf_files *f, char *err,
                size_t errlen)
{
    size_t cal = 0, cl = 0, kl = 0;
    char *ca = slurp(f->ca, &cal, err, errlen);
    char *cert = ca ? slurp(f->cert, &cl, err, errlen) : NULL;
    char *key = cert ? slurp(f->key, &kl, err, errlen) : NULL;
    int rc = -1, rv;
    if (!key) goto out;
    if ((rv = nng_tls_config_ca_chain(cfg, ca, NULL)) != 0)
        nng_fail(err, errlen, "CA", f->ca, rv);
    else if ((rv = nng_tls_config_own_cert(cfg, cert, key, NULL)) != 0)
        nng_fail(err, errlen, "certificate or key", f->cert, rv);
    else
        rc = 0;
out:
    free(ca);
    free(cert);
    wipe_free(key, kl);
    return rc;
}

int tlsconf_build(nng_tls_config **out, int server, const struct tlsconf_files *f,
                  const char *peer_name, char *err, size_t errlen)
{
    nng_tls_config *cfg = NULL;
    int rv = nng_tls_config_alloc(&cfg, server ? NNG_TLS_MODE_SERVER : NNG_TLS_MODE_CLIENT);
    *out = NULL;
    if (rv != 0) return nng_fail(err, errlen, "TLS", nng_tls_engine_name(), rv);
    if (load(cfg, f, err, errlen) != 0) goto fail;
    if ((rv = nng_tls_config_auth_mode(cfg, NNG_TLS_AUTH_MODE_REQUIRED)) != 0 ||
        (rv = nng_tls_config_version(cfg, NNG_TLS_1_2, NNG_TLS_1_3)) != 0) {
        nng_fail(err, errlen, "TLS settings", nng_tls_engine_name(), rv);
        goto fail;
    }
    if (peer_name && (rv = nng_tls_config_server_name(cfg, peer_name)) != 0) {
        nng_fail(err, errlen, "peer name", peer_name, rv);
        goto fail;
    }
    *out = cfg;
    return 0;
fail:
    nng_tls_config_free(cfg);
    return -1;
}

int tlsconf_check(const struct tlsconf_files *f, char *err, size_t errlen)
{
    nng_tls_config *cfg;
    if (tlsconf_build(&cfg, 1, f, NULL, err, errlen) != 0) return 0;
    nng_tls_config_free(cfg);
    return 1;
}
