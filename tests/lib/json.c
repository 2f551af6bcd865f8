/*
 * json.c -- recursive-descent JSON reader for tests; see json.h.
 *
 * Design: one cursor (struct parser) walks the text; every parse_* function
 * either consumes a complete production and returns a node, or records the
 * first error (message + offset) and returns NULL, leaving cleanup of
 * half-built nodes to json_free, which accepts them. Recursion is bounded
 * by JSON_MAX_DEPTH, so hostile input cannot exhaust the stack. Allocation
 * failure is reported like a syntax error; this code only runs in tests.
 */
#include "json.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NUMBER_MAX 255

struct parser {
    const char *p, *end, *start;
    int depth;
    char *err;
    size_t err_len;
    int failed;
};

__attribute__((format(printf, 2, 3)))
static void fail(struct parser *ps, const char *fmt, ...)
{
    va_list ap;
    int off;

    if (ps->failed)
        return;
    ps->failed = 1;
    if (ps->err == NULL || ps->err_len == 0)
        return;
    off = snprintf(ps->err, ps->err_len, "json: offset %zu: ",
                   (size_t)(ps->p - ps->start));
    if (off < 0 || (size_t)off >= ps->err_len)
        return;
    va_start(ap, fmt);
    vsnprintf(ps->err + off, ps->err_len - (size_t)off, fmt, ap);
    va_end(ap);
}

static void skip_ws(struct parser *ps)
{
    while (ps->p < ps->end && (*ps->p == ' ' || *ps->p == '\t' ||
                               *ps->p == '\n' || *ps->p == '\r'))
        ps->p++;
}

/* Consume c if it is next (after whitespace). */
static int accept(struct parser *ps, char c)
{
    skip_ws(ps);
    if (ps->p < ps->end && *ps->p == c) {
        ps->p++;
        return 1;
    }
    return 0;
}

static json_value *new_value(struct parser *ps, json_type type)
{
    json_value *v = calloc(1, sizeof *v);

    if (v == NULL)
        fail(ps, "out of memory");
    else
        v->type = type;
    return v;
}

void json_free(json_value *v)
{
    if (v == NULL)
        return;
    for (size_t i = 0; i < v->n; i++) {
        json_free(v->items[i]);
        if (v->keys != NULL)
            free(v->keys[i]);
    }
    free(v->items);
    free(v->keys);
    free(v->str);
    free(v);
}

/* -------------------------------------------------------------- strings */

typedef struct sbuf {
    char *b;
    size_t len, cap;
} sbuf;

static int sbuf_put(sbuf *s, const char *data, size_t n)
{
    if (s->len + n + 1 > s->cap) {
        size_t cap = s->cap ? s->cap : 32;
        while (cap < s->len + n + 1)
            cap *= 2;
        char *b = realloc(s->b, cap);
        if (b == NULL)
            return -1;
        s->b = b;
        s->cap = cap;
    }
    memcpy(s->b + s->len, data, n);
    s->len += n;
    s->b[s->len] = '\0';
    return 0;
}

static int sbuf_put_utf8(sbuf *s, uint32_t cp)
{
    char u[4];
    size_t n;

    if (cp < 0x80) {
        u[0] = (char)cp;
        n = 1;
    } else if (cp < 0x800) {
        u[0] = (char)(0xc0 | cp >> 6);
        u[1] = (char)(0x80 | (cp & 0x3f));
        n = 2;
    } else if (cp < 0x10000) {
        u[0] = (char)(0xe0 | cp >> 12);
        u[1] = (char)(0x80 | ((cp >> 6) & 0x3f));
        u[2] = (char)(0x80 | (cp & 0x3f));
        n = 3;
    } else {
        u[0] = (char)(0xf0 | cp >> 18);
        u[1] = (char)(0x80 | ((cp >> 12) & 0x3f));
        u[2] = (char)(0x80 | ((cp >> 6) & 0x3f));
        u[3] = (char)(0x80 | (cp & 0x3f));
        n = 4;
    }
    return sbuf_put(s, u, n);
}

/* Four hex digits after "\u"; -1 if malformed. */
static long read_hex4(struct parser *ps)
{
    long v = 0;

    if (ps->end - ps->p < 4)
        return -1;
    for (int i = 0; i < 4; i++) {
        char c = *ps->p++;
        int d = (c >= '0' && c <= '9')   ? c - '0'
                : (c >= 'a' && c <= 'f') ? c - 'a' + 10
                : (c >= 'A' && c <= 'F') ? c - 'A' + 10
                                         : -1;
        if (d < 0)
            return -1;
        v = v << 4 | d;
    }
    return v;
}

/* The code point of a \u escape (cursor after the 'u'), joining a
 * surrogate pair; -1 if malformed or a lone surrogate. */
static long read_unicode(struct parser *ps)
{
    long hi = read_hex4(ps), lo;

    if (hi < 0 || (hi >= 0xdc00 && hi <= 0xdfff))
        return -1;
    if (hi < 0xd800 || hi > 0xdbff)
        return hi;
    if (ps->end - ps->p < 2 || ps->p[0] != '\\' || ps->p[1] != 'u')
        return -1;
    ps->p += 2;
    lo = read_hex4(ps);
    if (lo < 0xdc00 || lo > 0xdfff)
        return -1;
    return 0x10000 + ((hi - 0xd800) << 10) + (lo - 0xdc00);
}

/* One escape (cursor after the backslash) appended to s; -1 if bad. */
static int read_escape(struct parser *ps, sbuf *s)
{
    static const char from[] = "\"\\/bfnrt", to[] = "\"\\/\b\f\n\r\t";
    const char *hit;
    long cp;

    if (ps->p >= ps->end)
        return -1;
    if (*ps->p == 'u') {
        ps->p++;
        cp = read_unicode(ps);
        return cp < 0 ? -1 : sbuf_put_utf8(s, (uint32_t)cp);
    }
    hit = memchr(from, *ps->p, sizeof from - 1);
    if (hit == NULL)
        return -1;
    ps->p++;
    return sbuf_put(s, &to[hit - from], 1);
}

/* A string literal (cursor on the opening quote) into s. */
static int read_string(struct parser *ps, sbuf *s)
{
    ps->p++;
    if (sbuf_put(s, "", 0) < 0)
        return -1;
    while (ps->p < ps->end && *ps->p != '"') {
        const char *run = ps->p;
        while (ps->p < ps->end && *ps->p != '"' && *ps->p != '\\' &&
               (unsigned char)*ps->p >= 0x20)
            ps->p++;
        if (sbuf_put(s, run, (size_t)(ps->p - run)) < 0)
            return -1;
        if (ps->p < ps->end && (unsigned char)*ps->p < 0x20)
            return -1;
        if (ps->p < ps->end && *ps->p == '\\') {
            ps->p++;
            if (read_escape(ps, s) < 0)
                return -1;
        }
    }
    if (ps->p >= ps->end)
        return -1;
    ps->p++;
    return 0;
}

static json_value *parse_string(struct parser *ps)
{
    sbuf s = {NULL, 0, 0};
    json_value *v;

    if (read_string(ps, &s) < 0) {
        free(s.b);
        fail(ps, "bad string");
        return NULL;
    }
    v = new_value(ps, JSON_STRING);
    if (v == NULL) {
        free(s.b);
        return NULL;
    }
    v->str = s.b;
    v->str_len = s.len;
    return v;
}

/* -------------------------------------------------------------- numbers */

static const char *skip_digits(const char *p, const char *end)
{
    while (p < end && *p >= '0' && *p <= '9')
        p++;
    return p;
}

/* End of a number literal starting at p, per the RFC 8259 grammar; NULL if
 * malformed. *integral says whether it had no sign, fraction or exponent. */
static const char *scan_number(const char *p, const char *end, int *integral)
{
    const char *q;

    *integral = !(p < end && *p == '-');
    if (!*integral)
        p++;
    if (p < end && *p == '0')
        p++;
    else if (p < end && *p >= '1' && *p <= '9')
        p = skip_digits(p, end);
    else
        return NULL;
    if (p < end && *p == '.') {
        *integral = 0;
        q = skip_digits(p + 1, end);
        if (q == p + 1)
            return NULL;
        p = q;
    }
    if (p < end && (*p == 'e' || *p == 'E')) {
        *integral = 0;
        p++;
        if (p < end && (*p == '+' || *p == '-'))
            p++;
        q = skip_digits(p, end);
        if (q == p)
            return NULL;
        p = q;
    }
    return p;
}

static void set_uint(json_value *v, const char *text)
{
    uint64_t u = 0;

    for (const char *c = text; *c; c++) {
        unsigned d = (unsigned)(*c - '0');
        if (u > (UINT64_MAX - d) / 10)
            return;
        u = u * 10 + d;
    }
    v->is_uint = 1;
    v->uint = u;
}

static json_value *parse_number(struct parser *ps)
{
    char text[NUMBER_MAX + 1];
    int integral;
    const char *e = scan_number(ps->p, ps->end, &integral);
    json_value *v;

    if (e == NULL || (size_t)(e - ps->p) > NUMBER_MAX) {
        fail(ps, e == NULL ? "bad number" : "number too long");
        return NULL;
    }
    memcpy(text, ps->p, (size_t)(e - ps->p));
    text[e - ps->p] = '\0';
    v = new_value(ps, JSON_NUMBER);
    if (v == NULL)
        return NULL;
    ps->p = e;
    v->number = strtod(text, NULL);
    if (integral)
        set_uint(v, text);
    return v;
}

/* ------------------------------------------------------- compound values */

static json_value *parse_value(struct parser *ps);

/* Append item (and key, for objects) to v; frees them on failure. */
static int add_member(struct parser *ps, json_value *v, char *key,
                      json_value *item)
{
    json_value **items = realloc(v->items, (v->n + 1) * sizeof *items);
    char **keys = NULL;

    if (items != NULL)
        v->items = items;
    if (items != NULL && v->type == JSON_OBJECT) {
        keys = realloc(v->keys, (v->n + 1) * sizeof *keys);
        if (keys != NULL)
            v->keys = keys;
    }
    if (items == NULL || (v->type == JSON_OBJECT && keys == NULL)) {
        fail(ps, "out of memory");
        free(key);
        json_free(item);
        return -1;
    }
    v->items[v->n] = item;
    if (keys != NULL)
        keys[v->n] = key;
    v->n++;
    return 0;
}

/* "key": value, with the cursor before the key. */
static int parse_member(struct parser *ps, json_value *obj)
{
    sbuf key = {NULL, 0, 0};
    json_value *item;

    skip_ws(ps);
    if (ps->p >= ps->end || *ps->p != '"' || read_string(ps, &key) < 0) {
        free(key.b);
        fail(ps, "expected a string key");
        return -1;
    }
    if (!accept(ps, ':')) {
        free(key.b);
        fail(ps, "expected ':'");
        return -1;
    }
    item = parse_value(ps);
    if (item == NULL) {
        free(key.b);
        return -1;
    }
    return add_member(ps, obj, key.b, item);
}

static int parse_item(struct parser *ps, json_value *arr)
{
    json_value *item = parse_value(ps);

    return item == NULL ? -1 : add_member(ps, arr, NULL, item);
}

/* '[' items ']' or '{' members '}', cursor on the opening bracket. */
static json_value *parse_compound(struct parser *ps, json_type type)
{
    char close = type == JSON_ARRAY ? ']' : '}';
    json_value *v = new_value(ps, type);

    ps->p++;
    if (v == NULL || accept(ps, close))
        return v;
    do {
        int rc = type == JSON_ARRAY ? parse_item(ps, v) : parse_member(ps, v);
        if (rc < 0) {
            json_free(v);
            return NULL;
        }
    } while (accept(ps, ','));
    if (!accept(ps, close)) {
        fail(ps, "expected ',' or '%c'", close);
        json_free(v);
        return NULL;
    }
    return v;
}

static json_value *parse_literal(struct parser *ps)
{
    static const struct {
        const char *word;
        json_type type;
        int boolean;
    } lits[] = {{"null", JSON_NULL, 0}, {"true", JSON_BOOL, 1},
                {"false", JSON_BOOL, 0}};

    for (size_t i = 0; i < sizeof lits / sizeof lits[0]; i++) {
        size_t n = strlen(lits[i].word);
        if ((size_t)(ps->end - ps->p) >= n &&
            memcmp(ps->p, lits[i].word, n) == 0) {
            json_value *v = new_value(ps, lits[i].type);
            if (v != NULL) {
                v->boolean = lits[i].boolean;
                ps->p += n;
            }
            return v;
        }
    }
    fail(ps, "unexpected character");
    return NULL;
}

static json_value *parse_value(struct parser *ps)
{
    json_value *v;

    skip_ws(ps);
    if (ps->p >= ps->end) {
        fail(ps, "unexpected end of input");
        return NULL;
    }
    if (++ps->depth > JSON_MAX_DEPTH) {
        fail(ps, "nested deeper than %d", JSON_MAX_DEPTH);
        return NULL;
    }
    if (*ps->p == '{' || *ps->p == '[')
        v = parse_compound(ps, *ps->p == '[' ? JSON_ARRAY : JSON_OBJECT);
    else if (*ps->p == '"')
        v = parse_string(ps);
    else if (*ps->p == '-' || (*ps->p >= '0' && *ps->p <= '9'))
        v = parse_number(ps);
    else
        v = parse_literal(ps);
    ps->depth--;
    return v;
}

/* ------------------------------------------------------------------ API */

json_value *json_parse(const char *text, size_t len, char *err,
                       size_t err_len)
{
    struct parser ps = {text, text + len, text, 0, err, err_len, 0};
    json_value *v;

    if (err != NULL && err_len > 0)
        err[0] = '\0';
    if (text == NULL) {
        ps.p = ps.end = ps.start = "";
        fail(&ps, "no text");
        return NULL;
    }
    v = parse_value(&ps);
    skip_ws(&ps);
    if (v != NULL && ps.p != ps.end) {
        fail(&ps, "trailing characters");
        json_free(v);
        v = NULL;
    }
    return v;
}

/* The whole file in a malloc'd buffer; NULL on any failure. */
static char *read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    sbuf s = {NULL, 0, 0};
    char chunk[4096];
    size_t n;

    if (f == NULL)
        return NULL;
    while ((n = fread(chunk, 1, sizeof chunk, f)) > 0) {
        if (sbuf_put(&s, chunk, n) < 0)
            break;
    }
    if (ferror(f) || !feof(f) || sbuf_put(&s, "", 0) < 0) {
        free(s.b);
        s.b = NULL;
    }
    fclose(f);
    *len = s.len;
    return s.b;
}

json_value *json_parse_file(const char *path, char *err, size_t err_len)
{
    size_t len = 0;
    char *text = path != NULL ? read_file(path, &len) : NULL;
    json_value *v;

    if (text == NULL) {
        if (err != NULL && err_len > 0)
            snprintf(err, err_len, "json: cannot read %s: %s",
                     path != NULL ? path : "(null)", strerror(errno));
        return NULL;
    }
    v = json_parse(text, len, err, err_len);
    free(text);
    return v;
}

const json_value *json_get(const json_value *v, const char *key)
{
    if (v == NULL || v->type != JSON_OBJECT || key == NULL)
        return NULL;
    for (size_t i = 0; i < v->n; i++)
        if (strcmp(v->keys[i], key) == 0)
            return v->items[i];
    return NULL;
}

const json_value *json_at(const json_value *v, size_t i)
{
    if (v == NULL || v->type != JSON_ARRAY || i >= v->n)
        return NULL;
    return v->items[i];
}

size_t json_len(const json_value *v)
{
    if (v == NULL || (v->type != JSON_ARRAY && v->type != JSON_OBJECT))
        return 0;
    return v->n;
}

const char *json_string(const json_value *v)
{
    return v != NULL && v->type == JSON_STRING ? v->str : NULL;
}

int json_uint(const json_value *v, uint64_t *out)
{
    if (v == NULL || v->type != JSON_NUMBER || !v->is_uint)
        return -1;
    *out = v->uint;
    return 0;
}
