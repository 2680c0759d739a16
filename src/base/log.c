/* The process-wide logger: a level, one sink, stderr by default. Opening a
 * log file is the core's (src/core/log.c). */
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "base/log.h"
#include "base/mutex.h"

static _Atomic int log_level = CUBE_LOG_WARN;
static cube_mutex sink_lock = CUBE_MUTEX_INIT;
static cube_log_sink_fn sink_fn CUBE_GUARDED_BY(sink_lock);
static void *sink_user CUBE_GUARDED_BY(sink_lock);
static FILE *sink_file CUBE_GUARDED_BY(sink_lock);

static const char *level_name(cube_log_level level)
{
    static const char *names[] = {"trace", "debug", "info",
                                  "warn",  "error", "off"};
    return (level >= CUBE_LOG_TRACE && level <= CUBE_LOG_OFF) ? names[level]
                                                              : "?";
}

void cube_log_set_level(cube_log_level level)
{
    if (level < CUBE_LOG_TRACE)
        level = CUBE_LOG_TRACE;
    if (level > CUBE_LOG_OFF)
        level = CUBE_LOG_OFF;
    atomic_store(&log_level, (int)level);
}

cube_log_level cube_log_get_level(void)
{
    return (cube_log_level)atomic_load(&log_level);
}

int cube_log_enabled(cube_log_level level)
{
    return level != CUBE_LOG_OFF && (int)level >= atomic_load(&log_level);
}

void cube_log_set_sink(cube_log_sink_fn sink, void *user)
{
    cube_mutex_lock(&sink_lock);
    sink_fn = sink;
    sink_user = user;
    cube_mutex_unlock(&sink_lock);
}

void cube_log_sink_to_file(FILE *f)
{
    cube_mutex_lock(&sink_lock);
    if (sink_file)
        fclose(sink_file);
    sink_file = f;
    sink_fn = NULL;
    cube_mutex_unlock(&sink_lock);
}

int cube_log_level_parse(const char *name, cube_log_level *out)
{
    static const struct {
        const char *name;
        cube_log_level level;
    } table[] = {{"trace", CUBE_LOG_TRACE},  {"debug", CUBE_LOG_DEBUG},
                 {"info", CUBE_LOG_INFO},    {"warn", CUBE_LOG_WARN},
                 {"warning", CUBE_LOG_WARN}, {"error", CUBE_LOG_ERROR},
                 {"off", CUBE_LOG_OFF},      {"none", CUBE_LOG_OFF}};
    if (!name || !out)
        return -1;
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++) {
        if (strcasecmp(name, table[i].name) == 0) {
            *out = table[i].level;
            return 0;
        }
    }
    return -1;
}

char *cube_vformat(char *small, size_t size, const char *fmt, va_list ap)
{
    va_list again;
    va_copy(again, ap);
    int n = vsnprintf(small, size, fmt, ap);
    char *text = n < 0 ? NULL : small;
    if (n >= 0 && (size_t)n >= size) {
        char *big = malloc((size_t)n + 1);
        if (big) {
            vsnprintf(big, (size_t)n + 1, fmt, again);
            text = big;
        }
    }
    va_end(again);
    return text;
}

void cube_log_write(cube_log_level level, const char *category, const char *fmt,
                    ...)
{
    if (!cube_log_enabled(level))
        return;
    char stack_buf[512];
    va_list ap;
    va_start(ap, fmt);
    char *msg = cube_vformat(stack_buf, sizeof stack_buf, fmt, ap);
    va_end(ap);
    if (!msg)
        return;
    if (!category)
        category = "cubert";
    cube_mutex_lock(&sink_lock);
    if (sink_fn) {
        sink_fn(sink_user, level, category, msg);
    } else {
        FILE *out = sink_file ? sink_file : stderr;
        fprintf(out, "cubert %s [%s] %s\n", level_name(level), category, msg);
    }
    cube_mutex_unlock(&sink_lock);
    if (msg != stack_buf)
        free(msg);
}
