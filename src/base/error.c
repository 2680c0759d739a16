/* Error values: code, message, optional log, causes. The bottom layer's,
 * so that every layer above (memory, core, backends) builds its errors
 * here. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/grow.h"
#include "base/log.h"
#include "base/text_buf.h"

struct cube_error {
    cube_code code;
    char *message;
    char *log;
    cube_error **causes;
    size_t cause_count;
    size_t cause_cap;
    int is_static;
};

/* Returned when an error itself cannot be allocated. Never freed. */
static cube_error oom_error = {
    .code = CUBE_ERR_OUT_OF_MEMORY,
    .message = "out of host memory while reporting an error",
    .is_static = 1,
};

static char *vformat(const char *fmt, va_list ap)
{
    va_list copy;
    va_copy(copy, ap);
    int n = vsnprintf(NULL, 0, fmt, copy);
    va_end(copy);
    if (n < 0)
        return NULL;
    char *s = malloc((size_t)n + 1);
    if (s)
        vsnprintf(s, (size_t)n + 1, fmt, ap);
    return s;
}

cube_error *cube_error_newv(cube_code code, const char *fmt, va_list ap)
{
    cube_error *e = calloc(1, sizeof *e);
    if (!e)
        return &oom_error;
    e->code = code;
    e->message = vformat(fmt ? fmt : "", ap);
    if (!e->message) {
        free(e);
        return &oom_error;
    }
    return e;
}

cube_error *cube_error_new(cube_code code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    cube_error *e = cube_error_newv(code, fmt, ap);
    va_end(ap);
    return e;
}

cube_error *cube_error_set_log(cube_error *err, const char *log)
{
    if (!err || err->is_static || !log)
        return err;
    char *copy = strdup(log);
    if (copy) {
        free(err->log);
        err->log = copy;
    }
    return err;
}

cube_error *cube_error_add_cause(cube_error *parent, cube_error *cause)
{
    if (!cause)
        return parent;
    if (!parent || parent->is_static) {
        cube_error_free(cause);
        return parent;
    }
    cube_error **grown = cube_grow(parent->causes, parent->cause_count,
                                   &parent->cause_cap, sizeof(cube_error *), 4);
    if (!grown) {
        cube_error_free(cause);
        return parent;
    }
    parent->causes = grown;
    parent->causes[parent->cause_count++] = cause;
    return parent;
}

cube_error *cube_error_wrap(cube_error *cause, cube_code code, const char *fmt,
                            ...)
{
    va_list ap;
    va_start(ap, fmt);
    cube_error *e = cube_error_newv(code, fmt, ap);
    va_end(ap);
    return cube_error_add_cause(e, cause);
}

cube_error *cube_error_clone(const cube_error *err)
{
    if (!err)
        return NULL;
    if (err->is_static)
        return (cube_error *)err;
    cube_error *c = cube_error_new(err->code, "%s", err->message);
    cube_error_set_log(c, err->log);
    for (size_t i = 0; i < err->cause_count; i++)
        cube_error_add_cause(c, cube_error_clone(err->causes[i]));
    return c;
}

cube_error *cube_error_prefix(cube_error *err, const char *fmt, ...)
{
    if (!err || err->is_static)
        return err;
    va_list ap;
    va_start(ap, fmt);
    char *prefix = vformat(fmt, ap);
    va_end(ap);
    if (!prefix)
        return err;
    size_t n = strlen(prefix) + strlen(err->message) + 3;
    char *joined = malloc(n);
    if (joined) {
        snprintf(joined, n, "%s: %s", prefix, err->message);
        free(err->message);
        err->message = joined;
    }
    free(prefix);
    return err;
}

void cube_error_free(cube_error *err)
{
    if (!err || err->is_static)
        return;
    for (size_t i = 0; i < err->cause_count; i++)
        cube_error_free(err->causes[i]);
    free(err->causes);
    free(err->message);
    free(err->log);
    free(err);
}

cube_code cube_error_code(const cube_error *err)
{
    return err ? err->code : CUBE_OK;
}

const char *cube_error_message(const cube_error *err)
{
    return err ? err->message : "";
}

const char *cube_error_log(const cube_error *err)
{
    return err ? err->log : NULL;
}

size_t cube_error_cause_count(const cube_error *err)
{
    return err ? err->cause_count : 0;
}

const cube_error *cube_error_cause(const cube_error *err, size_t i)
{
    return (err && i < err->cause_count) ? err->causes[i] : NULL;
}

const char *cube_code_name(cube_code code)
{
    switch (code) {
    case CUBE_OK: return "ok";
    case CUBE_ERR_INVALID_ARGUMENT: return "invalid argument";
    case CUBE_ERR_NOT_FOUND: return "not found";
    case CUBE_ERR_OUT_OF_MEMORY: return "out of memory";
    case CUBE_ERR_BUFFER_TOO_BIG: return "buffer too big";
    case CUBE_ERR_POOL_CAPACITY_EXCEEDED: return "pool capacity exceeded";
    case CUBE_ERR_COMPILE: return "compile error";
    case CUBE_ERR_RESOURCE_LIMIT: return "resource limit";
    case CUBE_ERR_UNSUPPORTED: return "unsupported";
    case CUBE_ERR_GRAPH_STATE: return "graph state";
    case CUBE_ERR_DEVICE_FAULT: return "device fault";
    case CUBE_ERR_SEVERAL: return "several errors";
    case CUBE_ERR_IO: return "i/o error";
    case CUBE_ERR_UNAVAILABLE: return "unavailable";
    case CUBE_ERR_INTERNAL: return "internal error";
    case CUBE_ERR_STORAGE_MAPPING_FAILED: return "storage mapping failed";
    case CUBE_ERR_PROFILE: return "profile error";
    case CUBE_ERR_POOLS_IN_USE: return "pools in use";
    case CUBE_ERR_STREAM_UNAVAILABLE: return "stream unavailable";
    case CUBE_ERR_TIMEOUT: return "timeout";
    case CUBE_ERR_ABORTED: return "aborted";
    }
    return "unknown error";
}

/* cube_error_format's text: a text_buf (base/text_buf.h). */
typedef text_buf text;

static void text_append(text *t, const char *s)
{
    text_buf_append(t, s, strlen(s));
}

static void text_indent_lines(text *t, const char *s, int depth)
{
    /* Each line of a multi-line message or log keeps the indentation. */
    const char *line = s;
    while (*line) {
        const char *nl = strchr(line, '\n');
        size_t n = nl ? (size_t)(nl - line) : strlen(line);
        for (int i = 0; i < depth; i++)
            text_append(t, "  ");
        char chunk[256];
        while (n > 0) {
            size_t k = n < sizeof chunk - 1 ? n : sizeof chunk - 1;
            memcpy(chunk, line, k);
            chunk[k] = '\0';
            text_append(t, chunk);
            line += k;
            n -= k;
        }
        text_append(t, "\n");
        line = nl ? nl + 1 : line;
        if (!nl)
            break;
    }
}

static void format_into(text *t, const cube_error *err, int depth)
{
    char head[64];
    snprintf(head, sizeof head, "[%s] ", cube_code_name(err->code));
    for (int i = 0; i < depth; i++)
        text_append(t, "  ");
    text_append(t, head);
    text_indent_lines(t, err->message, 0);
    if (err->log && *err->log) {
        text_indent_lines(t, "log:", depth + 1);
        text_indent_lines(t, err->log, depth + 2);
    }
    for (size_t i = 0; i < err->cause_count; i++)
        format_into(t, err->causes[i], depth + 1);
}

char *cube_error_format(const cube_error *err)
{
    text t = {0};
    if (!err)
        text_append(&t, "[ok]\n");
    else
        format_into(&t, err, 0);
    if (t.failed) {
        free(t.data);
        return NULL;
    }
    return t.data;
}

void cube_error_ignore(cube_error *err, const char *why)
{
    if (!err)
        return;
    if (cube_log_enabled(CUBE_LOG_DEBUG)) {
        char *formatted = cube_error_format(err);
        size_t n = formatted ? strlen(formatted) : 0;
        while (n && formatted[n - 1] == '\n')
            formatted[--n] = '\0';
        cube_log_write(CUBE_LOG_DEBUG, "error", "dropped (%s): %s",
                       why && *why ? why : "no reason given",
                       formatted ? formatted : err->message);
        free(formatted);
    }
    cube_error_free(err);
}

cube_error *cube_error_null_argument(const char *fn, const char *name)
{
    return cube_error_new(CUBE_ERR_INVALID_ARGUMENT, "%s: %s is NULL", fn,
                          name);
}
