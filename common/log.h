/*
 * log.h -- one line per event, to stderr: time, level, subsystem, text.
 *
 * Design: journald and kubectl logs both read stderr, so that is the only
 * sink. The level check is an inline compare, so a disabled debug line on a
 * hot path costs one branch and formats nothing.
 */
#ifndef KVT_LOG_H
#define KVT_LOG_H

enum log_level { LOG_ERROR = 0, LOG_WARN = 1, LOG_INFO = 2, LOG_DEBUG = 3 };

extern int log_level_cur;

/* Parse "error", "warn", "info", "debug"; -1 if unknown. */
int log_level_parse(const char *s);
const char *log_level_name(int level);
void log_set_level(int level);

void log_emit(int level, const char *subsys, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#define log_at(lvl, subsys, ...)                                            \
    do {                                                                    \
        if ((lvl) <= log_level_cur) log_emit((lvl), (subsys), __VA_ARGS__); \
    } while (0)
#define log_error(s, ...) log_at(LOG_ERROR, s, __VA_ARGS__)
#define log_warn(s, ...) log_at(LOG_WARN, s, __VA_ARGS__)
#define log_info(s, ...) log_at(LOG_INFO, s, __VA_ARGS__)
#define log_debug(s, ...) log_at(LOG_DEBUG, s, __VA_ARGS__)

#endif
