/*
 * kvtierctl -- the operator's command line for kvtierd.
 *
 * Design: a thin shell over libkvtier. Every command that prints data has a
 * --json form with one JSON document on stdout; every error is one line on
 * stderr ("kvtierctl: <command>: <reason>") and a non-zero exit: 1 for a
 * failed operation, 2 for bad usage, 3 when the daemon cannot be reached.
 * `hash` needs no daemon.
 */
#include <errno.h>
#include <getopt.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "client_internal.h"
#include "kvtier.h"

struct opts {
    const char *socket, *ns, *key, *parent, *out, *scheme, *salt, *seed, *extra;
    uint64_t bytes, limit, chunk_tokens;
    int json, evict;
};

static const char *cmd = "kvtierctl";

static int die(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int die(int code, const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "kvtierctl: %s: ", cmd);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    return code;
}

static int fail_op(kvt_client *c, kvt_err e)
{
    const char *why = c ? kvt_last_error(c) : "";
    if (why[0]) return die(1, "%s: %s", kvt_strerror(e), why);
    return die(1, "%s", kvt_strerror(e));
}

static void usage(FILE *f)
{
    fprintf(f,
        "usage: kvtierctl [--socket PATH] [--json] COMMAND [ARGS]\n"
        "commands:\n"
        "  status                              is the daemon up (exit 0) or not (3)\n"
        "  stats                               counters, usage, namespaces\n"
        "  ls [--ns NS] [--limit N]            cached chunks\n"
        "  lookup --ns NS KEYHEX...            longest present prefix and tiers\n"
        "  put --ns NS --key KEYHEX [--parent KEYHEX] FILE|-\n"
        "  get --ns NS --key KEYHEX [-o FILE]  (stdout without -o)\n"
        "  delete --ns NS KEYHEX...\n"
        "  clear --ns NS\n"
        "  evict [--bytes N]                   free N bytes (default: to low watermark)\n"
        "  flush [--evict]                     write every DRAM chunk to NVMe now\n"
        "                                      (--evict: then drop the DRAM copies)\n"
        "  verify [--limit N]                  re-read NVMe records, check checksums,\n"
        "                                      drop bad ones (N records at most)\n"
        "  peers                               cluster members: state, round trip,\n"
        "                                      bytes moved\n"
        "  hash --scheme kvt1|vllm|sglang [--ns NS] [--salt S] [--seed S] [--extra E]\n"
        "       --chunk-tokens N TOKEN...      one key per full chunk\n"
        "The socket is --socket, else $KVTIER_SOCKET, else ./var/kvtierd.sock.\n");
}

/* ---------------------------------------------------------------- json */

static void json_str(const char *s)
{
    putchar('"');
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\') printf("\\%c", ch);
        else if (ch < 0x20) printf("\\u%04x", ch);
        else putchar(ch);
    }
    putchar('"');
}

static void hex(const kvt_key *k, char *out)
{
    kvt_key_to_hex(k, out);
}

/* ---------------------------------------------------------------- keys */

static int parse_keys(int argc, char **argv, kvt_key **keys, size_t *n)
{
    *n = (size_t)argc;
    if (*n == 0) return die(2, "no keys given");
    *keys = calloc(*n, sizeof **keys);
    if (!*keys) return die(1, "out of memory");
    for (size_t i = 0; i < *n; i++)
        if (kvt_key_from_hex(argv[i], &(*keys)[i]) != KVT_OK)
            return die(2, "'%s' is not a %d-byte hex key", argv[i], KVT_KEY_LEN);
    return 0;
}

static int need_ns(const struct opts *o)
{
    if (!o->ns) return die(2, "--ns is required");
    return 0;
}

/* ------------------------------------------------------------ commands */

static int do_status(kvt_client *c, const struct opts *o)
{
    kvt_stats s;
    kvt_kv_stats kv;
    kvt_err e = kvt_stats_get(c, &s);
    if (!e) e = kvt_kv_stats_get(c, &kv);
    if (e) return fail_op(c, e);
    if (o->json) {
        printf("{\"up\":true,\"uptime_ms\":%llu,\"pool_bytes\":%llu,\"used_bytes\":%llu,"
               "\"chunks\":%llu,\"clients\":%llu,\"kv_registrations\":%llu,"
               "\"zero_copy\":%s,\"gpu\":",
               (unsigned long long)s.uptime_ms, (unsigned long long)s.pool_bytes,
               (unsigned long long)s.used_bytes, (unsigned long long)s.chunks,
               (unsigned long long)s.clients, (unsigned long long)kv.registrations,
               kvt_zero_copy(c) ? "true" : "false");
        json_str(kv.gpu);
        printf("}\n");
        return 0;
    }
    printf("kvtierd up %.1f s; pool %.1f/%.1f MiB used; %llu chunks; %llu clients; "
           "%llu KV-cache registrations\n"
           "zero-copy: %s; gpu: %s\n", (double)s.uptime_ms / 1000.0,
           (double)s.used_bytes / 1048576.0, (double)s.pool_bytes / 1048576.0,
           (unsigned long long)s.chunks, (unsigned long long)s.clients,
           (unsigned long long)kv.registrations, kvt_zero_copy(c) ? "yes" : "no",
           kv.gpu);
    return 0;
}

static Kvtier__Response *raw_stats(kvt_client *c, kvt_err *e)
{
    Kvtier__Request q = KVTIER__REQUEST__INIT;
    Kvtier__Stats st = KVTIER__STATS__INIT;
    Kvtier__Response *r = NULL;
    q.body_case = KVTIER__REQUEST__BODY_STATS;
    q.stats = &st;
    *e = kvtc_call(c, &q, &r);
    return r;
}

#define U(x) ((unsigned long long)(x))

/* Per-tier figures: the rest of "dram", then "nvme" if there is one;
 * NVMe activity and DRAM adoption beside "tiers". */
static void tier_json(const Kvtier__TierStats *t)
{
    printf(",\"chunks\":%llu,\"chunk_bytes\":%llu,\"high_watermark\":%llu,"
           "\"low_watermark\":%llu,\"evictions\":%llu,\"fragmentation\":%.4f}",
           U(t->chunks), U(t->chunk_bytes), U(t->high_watermark),
           U(t->low_watermark), U(t->evictions), t->fragmentation);
}

static void nvme_json(const Kvtier__NvmeStats *n)
{
    printf(",\"nvme\":{\"demotions\":%llu,\"demoted_bytes\":%llu,\"promotions\":%llu,"
           "\"promoted_bytes\":%llu,\"checksum_failures\":%llu,\"read_errors\":%llu,"
           "\"write_errors\":%llu,\"enospc\":%llu,\"lost_dirty\":%llu,"
           "\"get_waits\":%llu,\"get_timeouts\":%llu,\"loaded_chunks\":%llu,"
           "\"rebuilt_chunks\":%llu,\"index_errors\":%llu,\"scrubbed\":%llu,"
           "\"scrub_bad\":%llu,\"queued\":%llu,\"inflight\":%llu,"
           "\"dirty_chunks\":%llu,\"write_through\":%s,\"registered_buffers\":%s,"
           "\"buffers_note\":", U(n->demotions), U(n->demoted_bytes), U(n->promotions),
           U(n->promoted_bytes), U(n->checksum_failures), U(n->read_errors),
           U(n->write_errors), U(n->enospc), U(n->lost_dirty), U(n->get_waits),
           U(n->get_timeouts), U(n->loaded_chunks), U(n->rebuilt_chunks),
           U(n->index_errors), U(n->scrubbed), U(n->scrub_bad), U(n->queued),
           U(n->inflight), U(n->dirty_chunks), n->write_through ? "true" : "false",
           n->registered_buffers ? "true" : "false");
    json_str(n->buffers_note);
    printf("}");
}

static void tiers_json(const Kvtier__StatsResp *s)
{
    for (size_t i = 0; i < s->n_tiers; i++) {
        const Kvtier__TierStats *t = s->tiers[i];
        if (t->tier == KVTIER__TIER__TIER_NVME)
            printf(",\"nvme\":{\"capacity\":%llu,\"used\":%llu", U(t->capacity),
                   U(t->used));
        if (t->tier == KVTIER__TIER__TIER_DRAM || t->tier == KVTIER__TIER__TIER_NVME)
            tier_json(t);
    }
    if (!s->n_tiers) printf("}");
    printf("}");
    if (s->nvme) nvme_json(s->nvme);
    printf(",\"adopted_chunks\":%llu,\"adopt_dropped\":%llu", U(s->adopted_chunks),
           U(s->adopt_dropped));
}

static void stats_json(const Kvtier__StatsResp *s)
{
    printf("{\"version\":\"%s\",\"pid\":%u,\"uptime_ms\":%llu,\"pool_bytes\":%llu,"
           "\"used_bytes\":%llu,\"high_watermark\":%llu,\"low_watermark\":%llu,"
           "\"chunks\":%llu,\"namespaces\":%llu,\"leases\":%llu,\"clients\":%llu,"
           "\"hits\":%llu,\"misses\":%llu,\"puts\":%llu,\"evictions\":%llu,"
           "\"bytes_in\":%llu,\"bytes_out\":%llu,\"fragmentation\":%.4f,"
           "\"index_bytes\":%llu,\"errors\":%llu,\"expired_leases\":%llu,\"gpu\":",
           s->version, s->pid, U(s->uptime_ms), U(s->pool_bytes), U(s->used_bytes),
           U(s->high_watermark), U(s->low_watermark), U(s->chunks), U(s->namespaces),
           U(s->leases), U(s->clients), U(s->hits), U(s->misses), U(s->puts),
           U(s->evictions), U(s->bytes_in), U(s->bytes_out), s->fragmentation,
           U(s->index_bytes), U(s->errors), U(s->expired_leases));
    json_str(s->gpu);
    printf(",\"kv_registrations\":%llu,\"kv_transfers\":%llu,\"kv_saved_chunks\":%llu,"
           "\"kv_loaded_chunks\":%llu,\"kv_failed\":%llu", U(s->kv_registrations),
           U(s->kv_transfers), U(s->kv_saved_chunks), U(s->kv_loaded_chunks),
           U(s->kv_failed));
    printf(",\"tiers\":{\"hbm\":{\"capacity\":%llu,\"used\":%llu,"
           "\"loaded_chunks\":%llu,\"demoted\":%llu},"
           "\"dram\":{\"capacity\":%llu,\"used\":%llu",
           U(s->hbm_bytes), U(s->hbm_used), U(s->kv_hbm_loaded_chunks),
           U(s->kv_hbm_demoted), U(s->pool_bytes), U(s->used_bytes));
    tiers_json(s);
    printf(",\"ns\":[");
    for (size_t i = 0; i < s->n_ns; i++) {
        printf("%s{\"ns\":", i ? "," : "");
        json_str(s->ns[i]->ns);
        printf(",\"chunks\":%llu,\"bytes\":%llu,\"hits\":%llu,\"misses\":%llu}",
               U(s->ns[i]->chunks), U(s->ns[i]->bytes), U(s->ns[i]->hits),
               U(s->ns[i]->misses));
    }
    printf("]}\n");
}

static void tiers_text(const Kvtier__StatsResp *s)
{
    for (size_t i = 0; i < s->n_tiers; i++) {
        const Kvtier__TierStats *t = s->tiers[i];
        printf("  tier %-5s %llu / %llu bytes (%.1f%%); %llu chunks of %llu bytes; "
               "%llu evictions\n", t->tier == KVTIER__TIER__TIER_NVME ? "nvme" : "dram",
               U(t->used), U(t->capacity),
               t->capacity ? 100.0 * (double)t->used / (double)t->capacity : 0.0,
               U(t->chunks), U(t->chunk_bytes), U(t->evictions));
    }
    const Kvtier__NvmeStats *n = s->nvme;
    if (n) {
        printf("nvme           %llu demotions (%llu bytes), %llu promotions (%llu bytes), "
               "%llu dirty chunks, %s\n", U(n->demotions), U(n->demoted_bytes),
               U(n->promotions), U(n->promoted_bytes), U(n->dirty_chunks),
               n->write_through ? "write-through" : "write-back");
        printf("nvme errors    %llu checksum, %llu read, %llu write, %llu no space, "
               "%llu lost dirty; %llu GETs waited (%llu timed out)\n",
               U(n->checksum_failures), U(n->read_errors), U(n->write_errors),
               U(n->enospc), U(n->lost_dirty), U(n->get_waits), U(n->get_timeouts));
        printf("nvme index     %llu loaded, %llu rebuilt at start; %llu write errors; "
               "%llu verified, %llu bad; buffers %s%s\n", U(n->loaded_chunks),
               U(n->rebuilt_chunks), U(n->index_errors), U(n->scrubbed), U(n->scrub_bad),
               n->registered_buffers ? "registered" : "not registered: ",
               n->registered_buffers ? "" : n->buffers_note);
    }
    if (s->adopted_chunks || s->adopt_dropped)
        printf("adopted        %llu DRAM chunks from the last run (%llu dropped)\n",
               U(s->adopted_chunks), U(s->adopt_dropped));
}

static void stats_text(const Kvtier__StatsResp *s)
{
    uint64_t lk = s->hits + s->misses;
    printf("version        %s (pid %u, up %.1f s)\n", s->version, s->pid,
           (double)s->uptime_ms / 1000.0);
    printf("dram           %llu / %llu bytes (%.1f%%), watermarks %llu / %llu\n",
           U(s->used_bytes), U(s->pool_bytes),
           s->pool_bytes ? 100.0 * (double)s->used_bytes / (double)s->pool_bytes : 0.0,
           U(s->low_watermark), U(s->high_watermark));
    printf("chunks         %llu in %llu namespace(s); fragmentation %.3f\n",
           U(s->chunks), U(s->namespaces), s->fragmentation);
    printf("hit rate       %.3f (%llu hits, %llu misses; chunk-weighted)\n",
           lk ? (double)s->hits / (double)lk : 0.0, U(s->hits), U(s->misses));
    printf("traffic        %llu puts, %llu bytes in, %llu bytes out, %llu evictions\n",
           U(s->puts), U(s->bytes_in), U(s->bytes_out), U(s->evictions));
    printf("clients        %llu connected, %llu leases (%llu expired)\n",
           U(s->clients), U(s->leases), U(s->expired_leases));
    printf("index          %llu bytes; errors %llu; gpu: %s\n", U(s->index_bytes),
           U(s->errors), s->gpu);
    printf("kv cache       %llu registrations, %llu transfers open; %llu chunks saved, "
           "%llu loaded, %llu transfers failed\n", U(s->kv_registrations),
           U(s->kv_transfers), U(s->kv_saved_chunks), U(s->kv_loaded_chunks),
           U(s->kv_failed));
    if (s->hbm_bytes)
        printf("hbm            %llu / %llu bytes; %llu chunks loaded from it, %llu "
               "demoted\n", U(s->hbm_used), U(s->hbm_bytes),
               U(s->kv_hbm_loaded_chunks), U(s->kv_hbm_demoted));
    tiers_text(s);
    for (size_t i = 0; i < s->n_ns; i++)
        printf("  ns %-40s %8llu chunks %12llu bytes %llu/%llu hit/miss\n",
               s->ns[i]->ns, U(s->ns[i]->chunks), U(s->ns[i]->bytes),
               U(s->ns[i]->hits), U(s->ns[i]->misses));
}

static int do_stats(kvt_client *c, const struct opts *o)
{
    kvt_err e;
    Kvtier__Response *r = raw_stats(c, &e);
    if (e) return fail_op(c, e);
    if (r->body_case != KVTIER__RESPONSE__BODY_STATS) {
        kvtier__response__free_unpacked(r, NULL);
        return fail_op(c, KVT_EPROTO);
    }
    if (o->json) stats_json(r->stats);
    else stats_text(r->stats);
    kvtier__response__free_unpacked(r, NULL);
    return 0;
}

static void print_entry(const Kvtier__Entry *en, int json, int first)
{
    char h[2 * KVT_KEY_LEN + 1] = "?";
    if (en->key.len == KVT_KEY_LEN) hex((const kvt_key *)en->key.data, h);
    if (!json) {
        printf("%s %-5s %10llu %016llx pins=%u age=%llums %s\n", h,
               kvt_tier_name((kvt_tier)en->tier), U(en->size), U(en->checksum),
               en->pins, U(en->age_ms), en->ns);
        return;
    }
    printf("%s{\"ns\":", first ? "" : ",");
    json_str(en->ns);
    printf(",\"key\":\"%s\",\"tier\":\"%s\",\"size\":%llu,\"checksum\":\"%016llx\","
           "\"pins\":%u,\"age_ms\":%llu}", h, kvt_tier_name((kvt_tier)en->tier),
           U(en->size), U(en->checksum), en->pins, U(en->age_ms));
}

static int do_ls(kvt_client *c, const struct opts *o)
{
    Kvtier__List l = KVTIER__LIST__INIT;
    uint64_t shown = 0, limit = o->limit ? o->limit : UINT64_MAX;
    l.ns = (char *)(o->ns ? o->ns : "");
    if (o->json) printf("[");
    do {
        Kvtier__Request q = KVTIER__REQUEST__INIT;
        Kvtier__Response *r;
        q.body_case = KVTIER__REQUEST__BODY_LIST;
        q.list = &l;
        l.limit = limit - shown < 1000 ? (uint32_t)(limit - shown) : 1000;
        kvt_err e = kvtc_call(c, &q, &r);
        if (e) return fail_op(c, e);
        for (size_t i = 0; i < r->list->n_entries; i++, shown++)
            print_entry(r->list->entries[i], o->json, shown == 0);
        l.cursor = r->list->next;
        kvtier__response__free_unpacked(r, NULL);
    } while (l.cursor && shown < limit);
    if (o->json) printf("]\n");
    return 0;
}

static int do_lookup(kvt_client *c, const struct opts *o, int argc, char **argv)
{
    kvt_key *keys = NULL;
    size_t n, present;
    int rc = need_ns(o) ? 2 : parse_keys(argc, argv, &keys, &n);
    if (rc) return free(keys), rc;
    kvt_tier *tiers = calloc(n, sizeof *tiers);
    kvt_err e = kvt_lookup(c, o->ns, keys, n, &present, tiers);
    if (e) rc = fail_op(c, e);
    else if (o->json) {
        printf("{\"present\":%zu,\"keys\":[", present);
        for (size_t i = 0; i < n; i++)
            printf("%s{\"key\":\"%s\",\"tier\":\"%s\"}", i ? "," : "", argv[i],
                   kvt_tier_name(tiers[i]));
        printf("]}\n");
    } else {
        printf("present %zu/%zu\n", present, n);
        for (size_t i = 0; i < n; i++) printf("%s %s\n", argv[i], kvt_tier_name(tiers[i]));
    }
    free(tiers);
    free(keys);
    return rc;
}

static int read_all(const char *path, uint8_t **buf, size_t *len)
{
    FILE *f = strcmp(path, "-") == 0 ? stdin : fopen(path, "rb");
    if (!f) return die(1, "%s: %s", path, strerror(errno));
    size_t cap = 1 << 20, n = 0;
    uint8_t *b = malloc(cap);
    for (size_t r; b && (r = fread(b + n, 1, cap - n, f)) > 0;) {
        n += r;
        if (n == cap) b = realloc(b, cap *= 2);
    }
    int err = !b || ferror(f);
    *buf = NULL;
    if (f != stdin) fclose(f);
    if (err) return free(b), die(1, "%s: read failed", path);
    *buf = b;
    *len = n;
    return 0;
}

static int one_key(const struct opts *o, kvt_key *k, const char *s)
{
    if (!s) return die(2, "--key is required");
    if (kvt_key_from_hex(s, k) != KVT_OK)
        return die(2, "'%s' is not a %d-byte hex key", s, KVT_KEY_LEN);
    (void)o;
    return 0;
}

static int do_put(kvt_client *c, const struct opts *o, int argc, char **argv)
{
    kvt_key k, p;
    uint8_t *buf = NULL;
    size_t len, n_new = 0;
    int rc;
    if ((rc = need_ns(o)) || (rc = one_key(o, &k, o->key))) return rc;
    if (o->parent && (rc = one_key(o, &p, o->parent))) return rc;
    if (argc != 1) return die(2, "want exactly one FILE (or -)");
    if ((rc = read_all(argv[0], &buf, &len))) return rc;
    if (len == 0) return free(buf), die(1, "%s is empty; chunks hold at least one byte", argv[0]);
    const void *bufs[1] = {buf};
    kvt_err e = kvt_put(c, o->ns, &k, bufs, &len, 1, o->parent ? &p : NULL, &n_new);
    free(buf);
    if (e) return fail_op(c, e);
    if (o->json) printf("{\"size\":%zu,\"new\":%s}\n", len, n_new ? "true" : "false");
    else printf("%s %zu bytes%s\n", o->key, len, n_new ? "" : " (already cached)");
    return 0;
}

static int write_out(const char *path, const void *buf, size_t len)
{
    FILE *f = path ? fopen(path, "wb") : stdout;
    if (!f) return die(1, "%s: %s", path, strerror(errno));
    int bad = fwrite(buf, 1, len, f) != len;
    if (path && fclose(f) != 0) bad = 1;
    return bad ? die(1, "%s: write failed", path ? path : "stdout") : 0;
}

static int do_get(kvt_client *c, const struct opts *o)
{
    kvt_key k;
    int rc;
    size_t size = 0;
    if ((rc = need_ns(o)) || (rc = one_key(o, &k, o->key))) return rc;
    kvt_err e = kvt_get_copy(c, o->ns, &k, NULL, 0, &size);
    if (e != KVT_ETOOBIG) return e ? fail_op(c, e) : write_out(o->out, "", 0);
    uint8_t *buf = malloc(size);
    if (!buf) return die(1, "out of memory for %zu bytes", size);
    e = kvt_get_copy(c, o->ns, &k, buf, size, &size);
    rc = e ? fail_op(c, e) : write_out(o->out, buf, size);
    free(buf);
    return rc;
}

static int print_count(const struct opts *o, const char *what, uint64_t n)
{
    if (o->json) printf("{\"%s\":%llu}\n", what, U(n));
    else printf("%s %llu\n", what, U(n));
    return 0;
}

static int do_delete(kvt_client *c, const struct opts *o, int argc, char **argv)
{
    kvt_key *keys = NULL;
    size_t n, del = 0;
    int rc = need_ns(o) ? 2 : parse_keys(argc, argv, &keys, &n);
    if (rc) return free(keys), rc;
    kvt_err e = kvt_delete(c, o->ns, keys, n, &del);
    free(keys);
    return e ? fail_op(c, e) : print_count(o, "deleted", del);
}

static int do_clear(kvt_client *c, const struct opts *o)
{
    uint64_t n = 0;
    if (need_ns(o)) return 2;
    kvt_err e = kvt_clear(c, o->ns, &n);
    return e ? fail_op(c, e) : print_count(o, "deleted", n);
}

static int do_evict(kvt_client *c, const struct opts *o)
{
    uint64_t freed = 0;
    kvt_err e = kvt_evict(c, o->bytes, &freed);
    return e ? fail_op(c, e) : print_count(o, "freed_bytes", freed);
}

/* FLUSH and VERIFY wait for the device: no request timeout. */
static int nvme_call(kvt_client *c, Kvtier__Request *q, Kvtier__Response__BodyCase bc,
                     Kvtier__Response **r)
{
    kvt_set_timeout(c, 24 * 3600 * 1000);
    kvt_err e = kvtc_call(c, q, r);
    if (e) return fail_op(c, e);
    if ((*r)->body_case == bc) return 0;
    kvtier__response__free_unpacked(*r, NULL);
    return fail_op(c, KVT_EPROTO);
}

static int do_flush(kvt_client *c, const struct opts *o)
{
    Kvtier__Flush f = KVTIER__FLUSH__INIT;
    Kvtier__Request q = KVTIER__REQUEST__INIT;
    Kvtier__Response *r;
    f.evict = o->evict;
    q.body_case = KVTIER__REQUEST__BODY_FLUSH;
    q.flush = &f;
    int rc = nvme_call(c, &q, KVTIER__RESPONSE__BODY_FLUSH, &r);
    if (rc) return rc;
    const Kvtier__FlushResp *fr = r->flush;
    if (o->json)
        printf("{\"written\":%llu,\"bytes\":%llu,\"failed\":%llu,\"clean\":%llu}\n",
               U(fr->written), U(fr->bytes), U(fr->failed), U(fr->clean));
    else
        printf("flushed %llu chunks (%llu bytes) to NVMe; %llu already there; %llu "
               "failed\n", U(fr->written), U(fr->bytes), U(fr->clean), U(fr->failed));
    rc = fr->failed ? die(1, "%llu chunks could not be written", U(fr->failed)) : 0;
    kvtier__response__free_unpacked(r, NULL);
    return rc;
}

static int do_verify(kvt_client *c, const struct opts *o)
{
    Kvtier__Verify v = KVTIER__VERIFY__INIT;
    Kvtier__Request q = KVTIER__REQUEST__INIT;
    Kvtier__Response *r;
    v.max_records = o->limit > UINT32_MAX ? UINT32_MAX : (uint32_t)o->limit;
    q.body_case = KVTIER__REQUEST__BODY_VERIFY;
    q.verify = &v;
    int rc = nvme_call(c, &q, KVTIER__RESPONSE__BODY_VERIFY, &r);
    if (rc) return rc;
    const Kvtier__VerifyResp *vr = r->verify;
    if (o->json)
        printf("{\"checked\":%llu,\"bytes\":%llu,\"bad\":%llu,\"read_errors\":%llu}\n",
               U(vr->checked), U(vr->bytes), U(vr->bad), U(vr->read_errors));
    else
        printf("verified %llu NVMe records (%llu bytes): %llu bad (dropped), %llu "
               "unreadable\n", U(vr->checked), U(vr->bytes), U(vr->bad),
               U(vr->read_errors));
    rc = vr->bad || vr->read_errors
             ? die(1, "%llu bad records dropped, %llu unreadable", U(vr->bad),
                   U(vr->read_errors))
             : 0;
    kvtier__response__free_unpacked(r, NULL);
    return rc;
}

static const char *peer_state(Kvtier__PeerState s)
{
    switch (s) {
    case KVTIER__PEER_STATE__PEER_JOINING: return "joining";
    case KVTIER__PEER_STATE__PEER_ALIVE: return "alive";
    case KVTIER__PEER_STATE__PEER_DEAD: return "dead";
    case KVTIER__PEER_STATE__PEER_SUSPECT: return "suspect";
    case KVTIER__PEER_STATE__PEER_LEFT: return "left";
    default: return "none";
    }
}

static void print_peers_json(const Kvtier__PeersResp *p)
{
    printf("{\"enabled\":%s,\"node_id\":%u,\"addr\":", p->enabled ? "true" : "false",
           p->node_id);
    json_str(p->addr);
    printf(",\"epoch\":%llu,\"incarnation\":%llu,\"rejected\":%llu,\"index_entries\":%llu,"
           "\"peer_hits\":%llu,\"lookup_timeouts\":%llu,\"index_moved\":%llu,"
           "\"insecure\":%s,\"unproven\":%llu,\"index_conflicts\":%llu,",
           U(p->epoch), U(p->incarnation), U(p->rejected), U(p->index_entries),
           U(p->peer_hits), U(p->lookup_timeouts), U(p->index_moved),
           p->insecure ? "true" : "false", U(p->unproven), U(p->index_conflicts));
    printf("\"peer_tier\":%s,\"remote_hits\":%llu,\"bad_checksums\":%llu,"
           "\"fetch_failures\":%llu,\"get_deadlines\":%llu,\"fetched_bytes\":%llu,"
           "\"peers\":[",
           p->peer_tier ? "true" : "false", U(p->remote_hits), U(p->bad_checksums),
           U(p->fetch_failures), U(p->get_deadlines), U(p->fetched_bytes));
    for (size_t i = 0; i < p->n_peers; i++) {
        const Kvtier__PeerInfo *q = p->peers[i];
        printf("%s{\"node_id\":%u,\"addr\":", i ? "," : "", q->node_id);
        json_str(q->addr);
        printf(",\"state\":\"%s\",\"incarnation\":%llu,\"rtt_us\":%llu,"
               "\"bytes_in\":%llu,\"bytes_out\":%llu,\"last_heard_ms\":%llu,"
               "\"joins\":%u}", peer_state(q->state), U(q->incarnation), U(q->rtt_us),
               U(q->bytes_in), U(q->bytes_out), U(q->last_heard_ms), q->joins);
    }
    printf("]}\n");
}

static void print_peers(const Kvtier__PeersResp *p)
{
    if (!p->enabled) {
        printf("cluster off (cluster.listen is empty)\n");
        return;
    }
    printf("node %u at %s, epoch %llu, %llu message(s) rejected (%llu with an unproven "
           "node id)\n", p->node_id, p->addr, U(p->epoch), U(p->rejected), U(p->unproven));
    if (p->insecure)
        printf("WARNING: cluster.insecure = 1: plain tcp, no TLS, members not "
               "authenticated\n");
    printf("global index: %llu entries owned here, %llu keys found on peers, %llu owner "
           "queries timed out, %llu entries moved to new owners, %llu adds refused\n",
           U(p->index_entries), U(p->peer_hits), U(p->lookup_timeouts), U(p->index_moved),
           U(p->index_conflicts));
    printf("peer tier: %s; %llu chunks fetched (%llu bytes), %llu bad checksums, %llu "
           "failed fetches, %llu GETs cut by their deadline\n",
           p->peer_tier ? "up" : "off", U(p->remote_hits), U(p->fetched_bytes),
           U(p->bad_checksums), U(p->fetch_failures), U(p->get_deadlines));
    printf("%-6s %-28s %-8s %10s %12s %12s %10s\n", "NODE", "ADDR", "STATE", "RTT_US",
           "BYTES_IN", "BYTES_OUT", "HEARD_MS");
    for (size_t i = 0; i < p->n_peers; i++) {
        const Kvtier__PeerInfo *q = p->peers[i];
        printf("%-6u %-28s %-8s %10llu %12llu %12llu %10llu\n", q->node_id, q->addr,
               peer_state(q->state), U(q->rtt_us), U(q->bytes_in), U(q->bytes_out),
               U(q->last_heard_ms));
    }
}

static int do_peers(kvt_client *c, const struct opts *o)
{
    Kvtier__Peers p = KVTIER__PEERS__INIT;
    Kvtier__Request q = KVTIER__REQUEST__INIT;
    Kvtier__Response *r;
    q.body_case = KVTIER__REQUEST__BODY_PEERS;
    q.peers = &p;
    kvt_err e = kvtc_call(c, &q, &r);
    if (e) return fail_op(c, e);
    if (r->body_case != KVTIER__RESPONSE__BODY_PEERS) {
        kvtier__response__free_unpacked(r, NULL);
        return fail_op(c, KVT_EPROTO);
    }
    if (o->json) print_peers_json(r->peers);
    else print_peers(r->peers);
    kvtier__response__free_unpacked(r, NULL);
    return 0;
}

static int parse_tokens(int argc, char **argv, uint32_t *tok)
{
    for (int i = 0; i < argc; i++) {
        char *end;
        errno = 0;
        unsigned long long v = strtoull(argv[i], &end, 10);
        if (end == argv[i] || *end || errno || v > UINT32_MAX || argv[i][0] == '-')
            return die(2, "token '%s' is not an integer in [0, 2^32)", argv[i]);
        tok[i] = (uint32_t)v;
    }
    return 0;
}

static int do_hash(const struct opts *o, int argc, char **argv)
{
    int scheme = kvt_scheme_parse(o->scheme ? o->scheme : "kvt1");
    if (scheme < 0) return die(2, "unknown scheme '%s' (kvt1, vllm, sglang)", o->scheme);
    if (o->chunk_tokens == 0) return die(2, "--chunk-tokens N is required");
    uint32_t *tok = calloc((size_t)argc + 1, sizeof *tok);
    int rc = parse_tokens(argc, argv, tok);
    if (rc) return free(tok), rc;
    size_t max = (size_t)argc / o->chunk_tokens + 1, n = 0;
    kvt_key *keys = calloc(max, sizeof *keys);
    const char *extra[1] = {o->extra};
    kvt_hash_params p = {.scheme = (kvt_scheme)scheme, .chunk_tokens = o->chunk_tokens,
                         .ns = o->ns ? o->ns : "", .salt = o->salt,
                         .salt_len = o->salt ? strlen(o->salt) : 0, .seed = o->seed};
    if (o->extra && scheme == KVT_SCHEME_KVT1) p.extra = o->extra, p.extra_len = strlen(o->extra);
    if (o->extra && scheme == KVT_SCHEME_VLLM) p.extra_strs = extra, p.n_extra_strs = 1;
    kvt_err e = kvt_hash_chain(&p, tok, (size_t)argc, keys, max, &n);
    if (e) rc = die(2, "%s (vllm needs --seed, the engine's PYTHONHASHSEED)", kvt_strerror(e));
    for (size_t i = 0; !e && i < n; i++) {
        char h[2 * KVT_KEY_LEN + 1];
        hex(&keys[i], h);
        if (o->json) printf("%s\"%s\"", i ? "," : "[", h);
        else printf("%s\n", h);
    }
    if (!e && o->json) printf(n ? "]\n" : "[]\n");
    free(keys);
    free(tok);
    return rc;
}

/* -------------------------------------------------------------- driver */

static int parse_u64(const char *s, uint64_t *out)
{
    char *end;
    errno = 0;
    *out = strtoull(s, &end, 10);
    if (end == s || *end || errno || s[0] == '-') return die(2, "'%s' is not a number", s);
    return 0;
}

/* Options before the command stop at it ('+'); after it they may be
 * mixed with the command's arguments. */
static int parse_opts(int argc, char **argv, struct opts *o, int stop_at_cmd)
{
    static const struct option lo[] = {
        {"socket", 1, 0, 'S'}, {"json", 0, 0, 'j'}, {"ns", 1, 0, 'n'},
        {"key", 1, 0, 'k'}, {"parent", 1, 0, 'p'}, {"bytes", 1, 0, 'b'},
        {"limit", 1, 0, 'l'}, {"scheme", 1, 0, 's'}, {"salt", 1, 0, 'a'},
        {"seed", 1, 0, 'e'}, {"extra", 1, 0, 'x'}, {"chunk-tokens", 1, 0, 'c'},
        {"evict", 0, 0, 'E'}, {"help", 0, 0, 'h'}, {0, 0, 0, 0}};
    int ch, rc = 0;
    while (!rc && (ch = getopt_long(argc, argv, stop_at_cmd ? "+o:hj" : "o:hj", lo, NULL)) != -1) {
        switch (ch) {
        case 'S': o->socket = optarg; break;
        case 'j': o->json = 1; break;
        case 'n': o->ns = optarg; break;
        case 'k': o->key = optarg; break;
        case 'p': o->parent = optarg; break;
        case 'o': o->out = optarg; break;
        case 'b': rc = parse_u64(optarg, &o->bytes); break;
        case 'l': rc = parse_u64(optarg, &o->limit); break;
        case 'c': rc = parse_u64(optarg, &o->chunk_tokens); break;
        case 's': o->scheme = optarg; break;
        case 'a': o->salt = optarg; break;
        case 'e': o->seed = optarg; break;
        case 'x': o->extra = optarg; break;
        case 'E': o->evict = 1; break;
        case 'h': usage(stdout); exit(0);
        default: return 2;
        }
    }
    return rc;
}

static int run(kvt_client *c, const struct opts *o, int argc, char **argv)
{
    if (!strcmp(cmd, "status")) return do_status(c, o);
    if (!strcmp(cmd, "stats")) return do_stats(c, o);
    if (!strcmp(cmd, "ls")) return do_ls(c, o);
    if (!strcmp(cmd, "lookup")) return do_lookup(c, o, argc, argv);
    if (!strcmp(cmd, "put")) return do_put(c, o, argc, argv);
    if (!strcmp(cmd, "get")) return do_get(c, o);
    if (!strcmp(cmd, "delete")) return do_delete(c, o, argc, argv);
    if (!strcmp(cmd, "clear")) return do_clear(c, o);
    if (!strcmp(cmd, "evict")) return do_evict(c, o);
    if (!strcmp(cmd, "flush")) return do_flush(c, o);
    if (!strcmp(cmd, "verify")) return do_verify(c, o);
    if (!strcmp(cmd, "peers")) return do_peers(c, o);
    return die(2, "unknown command (see kvtierctl --help)");
}

static const char *const commands[] = {"status", "stats", "ls", "lookup", "put", "get",
                                       "delete", "clear", "evict", "hash", "flush",
                                       "verify", "peers", NULL};

static int known(const char *s)
{
    for (int i = 0; commands[i]; i++)
        if (!strcmp(commands[i], s)) return 1;
    return 0;
}

int main(int argc, char **argv)
{
    struct opts o = {0};
    int rc = parse_opts(argc, argv, &o, 1);
    if (rc) return rc;
    if (optind >= argc) {
        usage(stderr);
        return 2;
    }
    cmd = argv[optind];
    if (!known(cmd)) return die(2, "unknown command (see kvtierctl --help)");
    optind++;
    /* Options may also follow the command. */
    int sub_argc = argc - optind + 1;
    char **sub_argv = argv + optind - 1;
    optind = 0; /* 0 makes GNU getopt start over, not just rewind */
    if ((rc = parse_opts(sub_argc, sub_argv, &o, 0))) return rc;
    if (!strcmp(cmd, "hash")) return do_hash(&o, sub_argc - optind, sub_argv + optind);
    kvt_client *c = NULL;
    kvt_err e = kvt_connect(o.socket, &c);
    if (e) {
        const char *s = o.socket ? o.socket : getenv("KVTIER_SOCKET");
        return die(3, "cannot reach kvtierd at %s: %s", s ? s : "./var/kvtierd.sock",
                   kvt_strerror(e));
    }
    rc = run(c, &o, sub_argc - optind, sub_argv + optind);
    kvt_close(c);
    return rc;
}
