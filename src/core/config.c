/* Configuration from CUBERT_* environment variables and an optional file,
 * read once. A variable wins over the file. A malformed value or line is
 * reported through the logger, naming where it came from, and ignored —
 * never fatal. docs/configuration.md lists every key. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "core/client_internal.h"
#include "core/config.h"

/* The longest configuration file path. */
#define CONFIG_PATH_BUF 4096

static core_config config;
static pthread_once_t config_once = PTHREAD_ONCE_INIT;

/* Settings kept outside core_config; written once by read_config. */
static core_config_file file_settings;
static char file_path[CONFIG_PATH_BUF];
static int file_used;
static int bounds_always;
static char trace_path[CORE_CONFIG_PATH_MAX];
static char trace_origin[CONFIG_PATH_BUF + 32];

/* --- the file's text ------------------------------------------------------ */

enum config_key {
    KEY_LOG_LEVEL,
    KEY_LOG_FILE,
    KEY_CPU_THREADS,
    KEY_CACHE_DIR,
    KEY_DEVICE,
    KEY_TRACE,
    KEY_BOUNDS_CHECK,
    KEY_COUNT
};

static const char *const key_names[KEY_COUNT] = {
    "log_level", "log_file", "cpu_threads", "cache_dir",
    "device",    "trace",    "bounds_check"};

/* Longest text shown of a key that is not one. */
#define KEY_SHOWN 64

static int is_blank(char c)
{
    return c == ' ' || c == '\t' || c == '\r' || c == '\v' || c == '\f';
}

/* Trims blanks from both ends of [*s, *s + *n). */
static void trim(const char **s, size_t *n)
{
    while (*n && is_blank(**s)) {
        (*s)++;
        (*n)--;
    }
    while (*n && is_blank((*s)[*n - 1]))
        (*n)--;
}

/* Parses a decimal thread count, 1..4096. Returns 0 on success. */
static int parse_threads(const char *v, uint32_t *out)
{
    if (*v < '0' || *v > '9')
        return -1;
    char *end;
    errno = 0;
    unsigned long n = strtoul(v, &end, 10);
    if (errno || *end || n == 0 || n > 4096)
        return -1;
    *out = (uint32_t)n;
    return 0;
}

/* Parses "launch" (0) or "always" (1). Returns 0 on success. */
static int parse_bounds(const char *v, int *always)
{
    if (strcasecmp(v, "launch") == 0)
        *always = 0;
    else if (strcasecmp(v, "always") == 0)
        *always = 1;
    else
        return -1;
    return 0;
}

/* Copies a path value into dst (CORE_CONFIG_PATH_MAX bytes). Returns 0 on
 * success, -1 when it does not fit. */
static int keep_path(char *dst, size_t size, const char *v, size_t n)
{
    if (n >= size)
        return -1;
    memcpy(dst, v, n);
    dst[n] = '\0';
    return 0;
}

/* Applies `key = value` (value NUL-terminated, n bytes). */
static void apply_value(const char *origin, unsigned line, enum config_key key,
                        const char *value, size_t n, core_config_file *out)
{
    const char *name = key_names[key];
    unsigned bit = 1u << key;
    if (n == 0 && key != KEY_CACHE_DIR) {
        out->set &= ~bit;
        return;
    }
    switch (key) {
    case KEY_LOG_LEVEL:
        if (cube_log_level_parse(value, &out->log_level) != 0) {
            cube_log_write(CUBE_LOG_WARN, "config",
                           "%s:%u: %s '%s' is not one of trace, debug, info, "
                           "warn, error, off; line ignored",
                           origin, line, name, value);
            return;
        }
        break;
    case KEY_CPU_THREADS:
        if (parse_threads(value, &out->cpu_threads) != 0) {
            cube_log_write(CUBE_LOG_WARN, "config",
                           "%s:%u: %s '%s' is not a number in 1..4096; line "
                           "ignored",
                           origin, line, name, value);
            return;
        }
        break;
    case KEY_BOUNDS_CHECK:
        if (parse_bounds(value, &out->bounds_always) != 0) {
            cube_log_write(CUBE_LOG_WARN, "config",
                           "%s:%u: %s '%s' is not 'launch' or 'always'; line "
                           "ignored",
                           origin, line, name, value);
            return;
        }
        break;
    case KEY_DEVICE:
    case KEY_LOG_FILE:
    case KEY_CACHE_DIR:
    case KEY_TRACE: {
        char *dst = key == KEY_DEVICE      ? out->device
                    : key == KEY_LOG_FILE  ? out->log_file
                    : key == KEY_CACHE_DIR ? out->cache_dir
                                           : out->trace;
        size_t size = key == KEY_DEVICE ? sizeof out->device
                                        : (size_t)CORE_CONFIG_PATH_MAX;
        if (keep_path(dst, size, value, n) != 0) {
            cube_log_write(CUBE_LOG_WARN, "config",
                           "%s:%u: %s is longer than %zu bytes; line ignored",
                           origin, line, name, size - 1);
            return;
        }
        break;
    }
    case KEY_COUNT: return;
    }
    out->set |= bit;
}

/* Parses one line, [s, s + n), without its newline. */
static void parse_line(const char *origin, unsigned line, const char *s,
                       size_t n, core_config_file *out)
{
    trim(&s, &n);
    if (n == 0 || s[0] == '#')
        return;
    const char *eq = memchr(s, '=', n);
    const char *key = s;
    size_t key_len = eq ? (size_t)(eq - s) : n;
    trim(&key, &key_len);
    int shown = (int)(key_len < KEY_SHOWN ? key_len : KEY_SHOWN);
    if (n > CORE_CONFIG_LINE_MAX) {
        cube_log_write(CUBE_LOG_WARN, "config",
                       "%s:%u: key '%.*s': the line is longer than %d bytes; "
                       "line ignored",
                       origin, line, shown, key, CORE_CONFIG_LINE_MAX);
        return;
    }
    if (!eq) {
        cube_log_write(CUBE_LOG_WARN, "config",
                       "%s:%u: key '%.*s' is not followed by '= value'; line "
                       "ignored",
                       origin, line, shown, key);
        return;
    }
    if (key_len == 0) {
        cube_log_write(CUBE_LOG_WARN, "config",
                       "%s:%u: key '': there is no key before '='; line "
                       "ignored",
                       origin, line);
        return;
    }
    enum config_key k = KEY_COUNT;
    for (int i = 0; i < KEY_COUNT; i++) {
        if (strlen(key_names[i]) == key_len &&
            strncasecmp(key, key_names[i], key_len) == 0) {
            k = (enum config_key)i;
            break;
        }
    }
    if (k == KEY_COUNT) {
        cube_log_write(CUBE_LOG_WARN, "config",
                       "%s:%u: key '%.*s' is unknown; line ignored", origin,
                       line, shown, key);
        return;
    }

    const char *v = eq + 1;
    size_t v_len = n - (size_t)(v - s);
    trim(&v, &v_len);
    if (v_len && v[0] == '"') {
        const char *close = memchr(v + 1, '"', v_len - 1);
        if (!close) {
            cube_log_write(CUBE_LOG_WARN, "config",
                           "%s:%u: key '%s': the value's closing quote is "
                           "missing; line ignored",
                           origin, line, key_names[k]);
            return;
        }
        const char *rest = close + 1;
        size_t rest_len = v_len - (size_t)(rest - v);
        trim(&rest, &rest_len);
        if (rest_len && rest[0] != '#') {
            cube_log_write(CUBE_LOG_WARN, "config",
                           "%s:%u: key '%s': text follows the closing quote; "
                           "line ignored",
                           origin, line, key_names[k]);
            return;
        }
        v++;
        v_len = (size_t)(close - v);
    } else {
        for (size_t i = 0; i < v_len; i++) {
            if (v[i] == '#' && (i == 0 || is_blank(v[i - 1]))) {
                v_len = i;
                break;
            }
        }
        trim(&v, &v_len);
    }
    /* The line fits CORE_CONFIG_LINE_MAX, so the value does too. */
    char value[CORE_CONFIG_LINE_MAX + 1];
    memcpy(value, v, v_len);
    value[v_len] = '\0';
    apply_value(origin, line, k, value, v_len, out);
}

void core_config_parse_text(const char *origin, const char *text,
                            core_config_file *out)
{
    if (!out)
        return;
    memset(out, 0, sizeof *out);
    if (!text)
        return;
    if (!origin)
        origin = "configuration";
    /* A UTF-8 byte order mark is not part of the first key. */
    if (strncmp(text, "\xEF\xBB\xBF", 3) == 0)
        text += 3;
    unsigned line = 1;
    for (const char *s = text; *s; line++) {
        const char *nl = strchr(s, '\n');
        size_t n = nl ? (size_t)(nl - s) : strlen(s);
        parse_line(origin, line, s, n, out);
        if (!nl)
            break;
        s = nl + 1;
    }
}

int core_config_load_file(const char *path, const char *via,
                          core_config_file *out)
{
    if (out)
        memset(out, 0, sizeof *out);
    if (!path || !*path || !out)
        return -1;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        if (via || (e != ENOENT && e != ENOTDIR))
            cube_log_write(CUBE_LOG_WARN, "config",
                           "%s%scannot open the configuration file '%s': %s; "
                           "not using it",
                           via ? via : "", via ? ": " : "", path, strerror(e));
        return -1;
    }
    size_t cap = 4096, len = 0;
    char *text = malloc(cap);
    const char *problem = text ? NULL : "out of memory";
    int read_errno = 0;
    while (!problem) {
        if (len + 1 == cap) {
            if (cap > CORE_CONFIG_FILE_MAX) {
                problem = "the file is too large";
                break;
            }
            char *bigger = realloc(text, cap * 2);
            if (!bigger) {
                problem = "out of memory";
                break;
            }
            text = bigger;
            cap *= 2;
        }
        ssize_t got = read(fd, text + len, cap - 1 - len);
        if (got < 0) {
            if (errno == EINTR)
                continue;
            read_errno = errno;
            problem = "cannot read it";
            break;
        }
        if (got == 0)
            break;
        len += (size_t)got;
        if (len > CORE_CONFIG_FILE_MAX)
            problem = "the file is too large";
    }
    close(fd);
    if (!problem) {
        text[len] = '\0';
        if (memchr(text, '\0', len))
            problem = "the file holds a NUL byte";
    }
    if (problem) {
        cube_log_write(CUBE_LOG_WARN, "config",
                       "%s%sconfiguration file '%s': %s%s%s; not using it",
                       via ? via : "", via ? ": " : "", path, problem,
                       read_errno ? ": " : "",
                       read_errno ? strerror(read_errno) : "");
        free(text);
        return -1;
    }
    core_config_parse_text(path, text, out);
    free(text);
    return 0;
}

const char *core_config_locate(char *buf, size_t size, int *explicit_path)
{
    if (explicit_path)
        *explicit_path = 0;
    if (!buf || size == 0)
        return NULL;
    const char *v = getenv("CUBERT_CONFIG");
    int n;
    if (v) {
        if (explicit_path)
            *explicit_path = 1;
        if (!*v)
            return NULL;
        n = snprintf(buf, size, "%s", v);
    } else if ((v = getenv("XDG_CONFIG_HOME")) && v[0] == '/') {
        n = snprintf(buf, size, "%s/cubert/config", v);
    } else if ((v = getenv("HOME")) && *v) {
        n = snprintf(buf, size, "%s/.config/cubert/config", v);
    } else {
        return NULL;
    }
    if (n < 0 || (size_t)n >= size)
        return NULL;
    return buf;
}

/* --- the one-time read ---------------------------------------------------- */

/* Copies `src` into dst[size], cut short if it must be (callers check the
 * length first). */
static void copy_text(char *dst, size_t size, const char *src)
{
    size_t n = strnlen(src, size - 1);
    memcpy(dst, src, n);
    dst[n] = '\0';
}

/* Reads the file, then each variable, which wins when it is set and
 * usable; an unusable variable is reported and the file's value (or the
 * default) stays. */
static void read_config(void)
{
    const core_config_file *fs = &file_settings;
    int explicit_path = 0;
    const char *path =
        core_config_locate(file_path, sizeof file_path, &explicit_path);
    const char *env_config = getenv("CUBERT_CONFIG");
    if (!path && env_config && *env_config)
        cube_log_write(CUBE_LOG_WARN, "config",
                       "CUBERT_CONFIG is longer than %zu bytes; not reading "
                       "a configuration file",
                       sizeof file_path - 1);
    const char *via = explicit_path ? "CUBERT_CONFIG" : NULL;
    if (path && core_config_load_file(path, via, &file_settings) == 0) {
        file_used = 1;
        cube_log_write(CUBE_LOG_DEBUG, "config", "read '%s'", path);
    }

    const char *v;
    int done = 0;
    if ((v = getenv("CUBERT_LOG_LEVEL")) && *v) {
        cube_log_level level;
        if (cube_log_level_parse(v, &level) == 0) {
            cube_log_set_level(level);
            done = 1;
        } else {
            cube_log_write(CUBE_LOG_WARN, "config",
                           "CUBERT_LOG_LEVEL='%s' is not one of trace, debug, "
                           "info, warn, error, off; ignored",
                           v);
        }
    }
    if (!done && (fs->set & CORE_CONFIG_HAS_LOG_LEVEL))
        cube_log_set_level(fs->log_level);

    done = 0;
    if ((v = getenv("CUBERT_LOG_FILE")) && *v) {
        cube_error *err = cube_log_set_file(v);
        if (err) {
            cube_log_write(CUBE_LOG_WARN, "config", "CUBERT_LOG_FILE: %s",
                           cube_error_message(err));
            cube_error_free(err);
        } else {
            done = 1;
        }
    }
    if (!done && (fs->set & CORE_CONFIG_HAS_LOG_FILE)) {
        cube_error *err = cube_log_set_file(fs->log_file);
        if (err) {
            cube_log_write(CUBE_LOG_WARN, "config", "log_file in %s: %s",
                           file_path, cube_error_message(err));
            cube_error_free(err);
        }
    }

    done = 0;
    if ((v = getenv("CUBERT_CPU_THREADS")) && *v) {
        if (parse_threads(v, &config.cpu_threads) == 0)
            done = 1;
        else
            cube_log_write(CUBE_LOG_WARN, "config",
                           "CUBERT_CPU_THREADS='%s' is not a number in "
                           "1..4096; ignored",
                           v);
    }
    if (!done && (fs->set & CORE_CONFIG_HAS_CPU_THREADS))
        config.cpu_threads = fs->cpu_threads;

    done = 0;
    if ((v = getenv("CUBERT_CACHE_DIR"))) {
        if (strlen(v) >= sizeof config.cache_dir) {
            cube_log_write(CUBE_LOG_WARN, "config",
                           "CUBERT_CACHE_DIR is longer than %zu bytes; "
                           "ignored",
                           sizeof config.cache_dir - 1);
        } else {
            copy_text(config.cache_dir, sizeof config.cache_dir, v);
            config.cache_dir_set = 1;
            done = 1;
        }
    }
    if (!done && (fs->set & CORE_CONFIG_HAS_CACHE_DIR)) {
        copy_text(config.cache_dir, sizeof config.cache_dir, fs->cache_dir);
        config.cache_dir_set = 1;
    }

    done = 0;
    if ((v = getenv("CUBERT_DEVICE")) && *v) {
        if (strlen(v) >= sizeof config.device) {
            cube_log_write(CUBE_LOG_WARN, "config",
                           "CUBERT_DEVICE is longer than %zu bytes; ignored",
                           sizeof config.device - 1);
        } else {
            copy_text(config.device, sizeof config.device, v);
            done = 1;
        }
    }
    if (!done && (fs->set & CORE_CONFIG_HAS_DEVICE))
        copy_text(config.device, sizeof config.device, fs->device);

    done = 0;
    if ((v = getenv("CUBERT_TRACE")) && *v) {
        if (strlen(v) >= sizeof trace_path) {
            cube_log_write(CUBE_LOG_WARN, "config",
                           "CUBERT_TRACE is longer than %zu bytes; ignored",
                           sizeof trace_path - 1);
        } else {
            copy_text(trace_path, sizeof trace_path, v);
            copy_text(trace_origin, sizeof trace_origin, "CUBERT_TRACE");
            done = 1;
        }
    }
    if (!done && (fs->set & CORE_CONFIG_HAS_TRACE)) {
        copy_text(trace_path, sizeof trace_path, fs->trace);
        snprintf(trace_origin, sizeof trace_origin, "the trace key of %s",
                 file_path);
    }

    done = 0;
    if ((v = getenv("CUBERT_BOUNDS_CHECK")) && *v) {
        if (parse_bounds(v, &bounds_always) == 0)
            done = 1;
        else
            cube_log_write(CUBE_LOG_WARN, "config",
                           "CUBERT_BOUNDS_CHECK='%s' is not 'launch' or "
                           "'always'; ignored",
                           v);
    }
    if (!done && (fs->set & CORE_CONFIG_HAS_BOUNDS_CHECK))
        bounds_always = fs->bounds_always;
}

const core_config *core_config_get(void)
{
    pthread_once(&config_once, read_config);
    return &config;
}

const char *core_config_file_path(void)
{
    pthread_once(&config_once, read_config);
    return file_used ? file_path : NULL;
}

int core_config_bounds_always(void)
{
    pthread_once(&config_once, read_config);
    return bounds_always;
}

const char *core_config_trace_path(void)
{
    pthread_once(&config_once, read_config);
    return trace_path[0] ? trace_path : NULL;
}

const char *core_config_trace_origin(void)
{
    pthread_once(&config_once, read_config);
    return trace_origin;
}
