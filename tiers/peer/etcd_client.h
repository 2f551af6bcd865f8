/*
 * etcd_client.h -- the few calls of etcd's v3 JSON gateway that membership
 * needs, over libcurl (see etcd_client.c).
 *
 * Ownership: a struct ec is one curl handle and belongs to one thread at
 * a time; ec_free accepts NULL. Keys and values go in and come out as
 * raw bytes (the gateway's base64 is handled here). Every answer is
 * untrusted: sizes are bounded (EC_MAX_BODY for a reply, EC_MAX_LINE for
 * one watch message, EC_MAX_KEY / EC_MAX_VALUE per key and value) and a
 * reply that does not have the expected shape is an error, never a crash.
 *
 * Errors: 0 on success, -1 with a sentence in err (errlen bytes, always
 * NUL-terminated).
 */
#ifndef KVT_ETCD_CLIENT_H
#define KVT_ETCD_CLIENT_H

#include <stddef.h>
#include <stdint.h>

#define EC_MAX_BODY (4u << 20)
#define EC_MAX_LINE (1u << 20)
#define EC_MAX_KEY 512
#define EC_MAX_VALUE 4096
#define EC_MAX_URLS 8

struct ec;

/* One key seen in a range or a watch event. deleted: a DELETE event
 * (val is then empty). mod_rev: the revision that wrote (or deleted) it. */
typedef void (*ec_kv_fn)(void *arg, const uint8_t *key, size_t klen, const uint8_t *val,
                         size_t vlen, int deleted, int64_t mod_rev);

/* endpoints: comma-separated http://host:port (at most EC_MAX_URLS);
 * timeout_ms bounds every request but a watch. NULL on a bad list (a
 * sentence in err). A failed request moves on to the next endpoint. */
struct ec *ec_new(const char *endpoints, long timeout_ms, char *err, size_t errlen);
void ec_free(struct ec *ec);
/* The endpoint in use (for log lines). */
const char *ec_url(const struct ec *ec);

int ec_grant(struct ec *ec, uint32_t ttl_s, int64_t *lease, char *err, size_t errlen);
/* *ttl_s: what is left of the lease; 0 when etcd no longer has it. */
int ec_keepalive(struct ec *ec, int64_t lease, int64_t *ttl_s, char *err, size_t errlen);
int ec_revoke(struct ec *ec, int64_t lease, char *err, size_t errlen);
/* Put key = val under lease (0: none). *rev: the revision it made. */
int ec_put(struct ec *ec, const char *key, const void *val, size_t vlen, int64_t lease,
           int64_t *rev, char *err, size_t errlen);
/* Every key under prefix, fn for each; *rev: the store's revision. */
int ec_range_prefix(struct ec *ec, const char *prefix, ec_kv_fn fn, void *arg, int64_t *rev,
                    char *err, size_t errlen);

/* A watch of every key under prefix from revision from_rev on, streamed:
 * ec_watch_run blocks, calling fn for each event and stopping when the
 * stream ends (-1, err), when *stop becomes nonzero (returns 0), or when
 * every > 0 ms passed (returns 1 so the caller can do something and call
 * it again: the stream stays open). It sleeps until the stream has bytes
 * or `every` is up: whoever sets *stop calls ec_watch_wakeup, from any
 * thread, while w is open. */
struct ec_watch;
struct ec_watch *ec_watch_open(struct ec *ec, const char *prefix, int64_t from_rev,
                               ec_kv_fn fn, void *arg, char *err, size_t errlen);
int ec_watch_run(struct ec_watch *w, const volatile int *stop, long every_ms, char *err,
                 size_t errlen);
/* The newest revision the stream has reported (its headers included). */
int64_t ec_watch_rev(const struct ec_watch *w);
/* Interrupt the wait of ec_watch_run on w (any thread; w stays open). */
void ec_watch_wakeup(struct ec_watch *w);
void ec_watch_close(struct ec_watch *w);

/* The parsers behind the calls, for tests: -1 on anything malformed. */
int ec_parse_range(const char *json, size_t len, ec_kv_fn fn, void *arg, int64_t *rev);
/* One watch message. *rev: its header's revision; *compacted: the watch
 * was cancelled because from_rev is compacted (resync with a range). */
int ec_parse_watch(const char *json, size_t len, ec_kv_fn fn, void *arg, int64_t *rev,
                   int *compacted);
/* Standard base64 with padding; -1 if out is too small or in is not
 * base64. Returns the decoded length. */
long ec_b64_decode(const char *in, size_t len, uint8_t *out, size_t cap);
size_t ec_b64_encode(const void *in, size_t len, char *out); /* out: 4*ceil(len/3)+1 */

#endif
