/*
 * tlsconf.h -- one nng TLS configuration from PEM files, for every
 * tls+tcp:// endpoint kvtier opens: the daemon's client listeners and the
 * client library's dialer (and whatever else speaks nng's TLS).
 *
 * Design: nng's TLS transport (mbedTLS underneath) does the handshake; all
 * kvtier decides is who proves what. A CA given means the peer must present
 * a certificate that CA signed, or the handshake fails before any message
 * is read (NNG_TLS_AUTH_MODE_REQUIRED); no CA means the peer is not asked.
 * Certificate and key are read here (both or neither), so a missing or
 * unreadable file is an error that names it rather than a failed
 * handshake later.
 */
#ifndef KVT_TLSCONF_H
#define KVT_TLSCONF_H

#include <stddef.h>

#include <nng/nng.h>
#include <nng/supplemental/tls/tls.h>

struct tlsconf_files {
    const char *cert;        /* PEM certificate chain, or NULL / "" */
    const char *key;         /* its PEM private key, or NULL / "" */
    const char *ca;          /* PEM CA the peer's certificate must chain to */
    const char *server_name; /* client: name the server's certificate must
                                carry (NULL / "": the CA alone decides) */
};

/* A configuration for a server (listener) or a client (dialer). The
 * caller owns *out (nng_tls_config_free; nng holds its own reference once
 * it is set on a listener or dialer). 0, or -1 with a sentence in err. */
int tlsconf_new(int server, const struct tlsconf_files *f, nng_tls_config **out,
                char *err, size_t errlen);

#endif
