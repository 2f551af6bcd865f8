/*
 * metrics_http.h -- the HTTP endpoint that serves /metrics (see the .c).
 */
#ifndef KVT_METRICS_HTTP_H
#define KVT_METRICS_HTTP_H

#include <stddef.h>

struct met_src;
struct metrics_http;

/* Listen on "host:port" (config metrics.listen; port 0 picks one). The
 * address actually bound is written to url ("http://127.0.0.1:40123").
 * 0, or -1 with a sentence in err. */
int metrics_http_open(const char *listen, struct metrics_http **out,
                      char *url, size_t urllen, char *err, size_t errlen);
/* Readable when scrapes wait for the core thread. */
int metrics_http_fd(const struct metrics_http *m);
/* Answer every waiting scrape from src (metrics.h). Core thread only. */
void metrics_http_poll(struct metrics_http *m, const struct met_src *src);
/* Answer waiting scrapes with 503, stop listening, free. Accepts NULL. */
void metrics_http_close(struct metrics_http *m);

#endif
