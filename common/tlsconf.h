/*
 * tlsconf.h -- nng TLS configurations from PEM files (see tlsconf.c).
 *
 * Ownership: a config returned here holds one reference; give it to an
 * endpoint (NNG_OPT_TLS_CONFIG takes its own) and drop yours with
 * nng_tls_config_free.
 */
#ifndef KVT_TLSCONF_H
#define KVT_TLSCONF_H

#include <stddef.h>

#include <nng/nng.h>
#include <nng/supplemental/tls/tls.h>

/* Largest PEM file read (a CA bundle, a certificate chain, a key). */
#define TLSCONF_FILE_MAX (1u << 20)

struct tlsconf_files {
    const char *ca;   /* PEM: the CA(s) a peer's certificate must chain to */
    const char *cert; /* PEM: this side's certificate (chain) */
    const char *key;  /* PEM: its private key, unencrypted */
};

/* A configuration for a listener (server = 1) or a dialer (server = 0)
 * that presents f->cert and requires the peer's certificate to chain to
 * f->ca (mutual authentication, TLS 1.2 or newer). peer_name, when not
 * NULL, must also be a name in the peer's certificate (dialers). 0, or -1
 * with the reason in err. */
int tlsconf_build(nng_tls_config **out, int server, const struct tlsconf_files *f,
                  const char *peer_name, char *err, size_t errlen);

/* 1 if the three files can be read and make a configuration (checked at
 * startup so a typo stops the daemon instead of every connection). */
int tlsconf_check(const struct tlsconf_files *f, char *err, size_t errlen);

#endif
