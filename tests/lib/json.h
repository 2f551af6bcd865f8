/*
 * json.h -- a small, strict JSON reader for tests (vectors, fixtures).
 *
 * Design: parse the whole text into a tree of json_value nodes and let the
 * test walk it with the accessors below; nothing is streamed and nothing is
 * written. The grammar is RFC 8259 with two limits: nesting deeper than
 * JSON_MAX_DEPTH and number literals longer than 255 characters are
 * rejected. Strings are decoded to UTF-8 (\u escapes and surrogate pairs
 * included) and NUL-terminated; str_len counts bytes, so a string holding
 * \u0000 is still whole. Integer literals that fit a uint64_t are also kept
 * exactly (is_uint/uint), since a double loses integers above 2^53.
 *
 * Ownership: json_parse and json_parse_file return a tree owned by the
 * caller, released with json_free (which accepts NULL); every pointer into
 * the tree (strings, keys, children) dies with it.
 */
#ifndef KVT_TEST_JSON_H
#define KVT_TEST_JSON_H

#include <stddef.h>
#include <stdint.h>

#define JSON_MAX_DEPTH 256

typedef enum json_type {
    JSON_NULL,
    JSON_BOOL,
    JSON_NUMBER,
    JSON_STRING,
    JSON_ARRAY,
    JSON_OBJECT,
} json_type;

typedef struct json_value {
    json_type type;
    int boolean;   /* JSON_BOOL: 0 or 1 */
    double number; /* JSON_NUMBER */
    int is_uint;   /* JSON_NUMBER: a non-negative integer literal that fits */
    uint64_t uint; /*   a uint64_t, exactly, in uint */
    char *str;     /* JSON_STRING: UTF-8, NUL-terminated */
    size_t str_len;
    size_t n;                   /* JSON_ARRAY / JSON_OBJECT: member count */
    struct json_value **items;  /* members in document order */
    char **keys;                /* JSON_OBJECT: keys[i] names items[i] */
} json_value;

/* Parse len bytes of text (need not be NUL-terminated). On failure return
 * NULL and, if err is not NULL, write a message with the byte offset. */
json_value *json_parse(const char *text, size_t len, char *err,
                       size_t err_len);
/* Read and parse a whole file; NULL with a message on any failure. */
json_value *json_parse_file(const char *path, char *err, size_t err_len);
void json_free(json_value *v);

/* The first member named key of an object; NULL if v is not an object or
 * has no such member. */
const json_value *json_get(const json_value *v, const char *key);
/* Item i of an array; NULL if v is not an array or i is out of range. */
const json_value *json_at(const json_value *v, size_t i);
/* Members of an array or object; 0 for anything else (or NULL). */
size_t json_len(const json_value *v);
/* The string of a JSON_STRING; NULL for anything else. */
const char *json_string(const json_value *v);
/* 0 and *out = value if v is an exact non-negative integer; -1 otherwise. */
int json_uint(const json_value *v, uint64_t *out);

#endif /* KVT_TEST_JSON_H */
