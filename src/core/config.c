/* Configuration from CUBERT_* environment variables and an optional file.
 * Every key is one cube_config_key: the core's are the table below, each
 * backend's come with its cube_backend. The file parser, the reading of
 * the environment, the warnings and the lookups all walk these tables. A
 * variable wins over the file. A malformed value or line is reported
 * through the logger, naming where it came from, and ignored — never
 * fatal. docs/configuration.md lists every key (test_config_docs checks
 * it against the tables). */
#include <ctype.h>
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
#include "core/file_open.h"
#include "cubert/backend/server.h"

/* The longest configuration file path. */
#define CONFIG_PATH_BUF 4096

/* A value is copied out of a line, so it is never longer than a line. */
_Static_assert(CORE_CONFIG_LINE_MAX <= CUBE_CONFIG_TEXT_MAX,
               "a value of a backend's key must fit its slot");
_Static_assert(CORE_CONFIG_BACKEND_KEYS <= 16,
               "backend_set (an unsigned) has a bit per backend key");
/* Word values are stored as int in core_config_file. */
_Static_assert(sizeof(cube_log_level) == sizeof(int),
               "log_level holds a word's value");

static core_config config;
static pthread_once_t config_once = PTHREAD_ONCE_INIT;

/* Settings kept outside core_config; written once by read_config. */
static core_config_file file_settings;
static char file_path[CONFIG_PATH_BUF];
static int file_used;
static int bounds_always;
static char trace_path[CORE_CONFIG_PATH_MAX];
static char trace_origin[CONFIG_PATH_BUF + 32];
static char memory_trace_path[CORE_CONFIG_PATH_MAX];
static char memory_trace_origin[CONFIG_PATH_BUF + 32];

/* Copies `src` into dst[size], cut short if it must be (the keys' max_len
 * keeps values within their destinations). */
static void copy_text(char *dst, size_t size, const char *src)
{
    size_t n = strnlen(src, size - 1);
    memcpy(dst, src, n);
    dst[n] = '\0';
}

/* --- the core's keys ------------------------------------------------------ */

/* How the one-time read applies the value in force. An error is logged and
 * the next place down (the file after the variable) decides instead. */
typedef cube_error *(*apply_fn)(const cube_config_value *value);

/* A key of the core: its description, where core_config_file keeps the
 * file's value (field_size 0: nowhere) and how it is applied (NULL: read
 * elsewhere). */
typedef struct core_key {
    cube_config_key key;
    size_t field;
    size_t field_size;
    unsigned bit; /* of core_config_file.set */
    apply_fn apply;
} core_key;

static cube_error *apply_log_level(const cube_config_value *v)
{
    cube_log_set_level((cube_log_level)v->number);
    return NULL;
}

static cube_error *apply_log_file(const cube_config_value *v)
{
    return cube_log_set_file(v->text);
}

static cube_error *apply_cpu_threads(const cube_config_value *v)
{
    config.cpu_threads = v->number;
    return NULL;
}

static cube_error *apply_cache_dir(const cube_config_value *v)
{
    copy_text(config.cache_dir, sizeof config.cache_dir, v->text);
    config.cache_dir_set = 1;
    return NULL;
}

static cube_error *apply_device(const cube_config_value *v)
{
    copy_text(config.device, sizeof config.device, v->text);
    return NULL;
}

static cube_error *apply_trace(const cube_config_value *v)
{
    copy_text(trace_path, sizeof trace_path, v->text);
    if (v->origin == CUBE_CONFIG_ENVIRONMENT)
        copy_text(trace_origin, sizeof trace_origin, v->variable);
    else
        snprintf(trace_origin, sizeof trace_origin, "the trace key of %s",
                 v->file);
    return NULL;
}

static cube_error *apply_memory_trace(const cube_config_value *v)
{
    copy_text(memory_trace_path, sizeof memory_trace_path, v->text);
    if (v->origin == CUBE_CONFIG_ENVIRONMENT)
        copy_text(memory_trace_origin, sizeof memory_trace_origin, v->variable);
    else
        snprintf(memory_trace_origin, sizeof memory_trace_origin,
                 "the memory_trace key of %s", v->file);
    return NULL;
}

static cube_error *apply_bounds_check(const cube_config_value *v)
{
    bounds_always = (int)v->number;
    return NULL;
}

static const cube_config_word log_level_words[] = {
    {"trace", CUBE_LOG_TRACE, 0},
    {"debug", CUBE_LOG_DEBUG, 0},
    {"info", CUBE_LOG_INFO, 0},
    {"warn", CUBE_LOG_WARN, 0},
    {"warning", CUBE_LOG_WARN, 1},
    {"error", CUBE_LOG_ERROR, 0},
    {"off", CUBE_LOG_OFF, 0},
    {"none", CUBE_LOG_OFF, 1},
    {NULL, 0, 0}};

static const cube_config_word bounds_check_words[] = {
    {"launch", 0, 0}, {"always", 1, 0}, {NULL, 0, 0}};

#define FIELD(member)                                                          \
    offsetof(core_config_file, member),                                        \
        sizeof(((core_config_file *)NULL)->member)

/* In the order they are applied: the log settings first, so that warnings
 * about the others go where the user asked. */
static const core_key core_keys[] = {
    {{.name = "config",
      .type = CUBE_CONFIG_PATH,
      .flags = CUBE_CONFIG_ENV_ONLY | CUBE_CONFIG_EMPTY_IS_VALUE,
      .max_len = CONFIG_PATH_BUF - 1,
      .default_text = "$XDG_CONFIG_HOME/cubert/config, else "
                      "$HOME/.config/cubert/config",
      .doc = "the configuration file to read; empty: none"},
     0,
     0,
     0,
     NULL}, /* core_config_locate reads it */
    {{.name = "log_level",
      .type = CUBE_CONFIG_WORD,
      .words = log_level_words,
      .default_text = "warn",
      .doc = "the logger's level: messages below it are dropped"},
     FIELD(log_level),
     CORE_CONFIG_HAS_LOG_LEVEL,
     apply_log_level},
    {{.name = "log_file",
      .type = CUBE_CONFIG_PATH,
      .max_len = CORE_CONFIG_PATH_MAX - 1,
      .default_text = "standard error",
      .doc = "append log messages to this file"},
     FIELD(log_file),
     CORE_CONFIG_HAS_LOG_FILE,
     apply_log_file},
    {{.name = "cpu_threads",
      .type = CUBE_CONFIG_UINT,
      .min = 1,
      .max = 4096,
      .default_text = "one per core",
      .doc = "threads the CPU backend computes with"},
     FIELD(cpu_threads),
     CORE_CONFIG_HAS_CPU_THREADS,
     apply_cpu_threads},
    {{.name = "cache_dir",
      .type = CUBE_CONFIG_PATH,
      .flags = CUBE_CONFIG_EMPTY_IS_VALUE,
      .max_len = CORE_CONFIG_PATH_MAX - 1,
      .default_text = "$XDG_CACHE_HOME/cubert, else $HOME/.cache/cubert",
      .doc = "root of the kernel disk cache; empty: no disk cache"},
     FIELD(cache_dir),
     CORE_CONFIG_HAS_CACHE_DIR,
     apply_cache_dir},
    {{.name = "device",
      .type = CUBE_CONFIG_TEXT,
      .max_len = 63,
      .default_text = "cpu",
      .doc = "the device cube_client_open(NULL, ...) opens: cpu, cuda or "
             "cuda:N"},
     FIELD(device),
     CORE_CONFIG_HAS_DEVICE,
     apply_device},
    {{.name = "trace",
      .type = CUBE_CONFIG_PATH,
      .max_len = CORE_CONFIG_PATH_MAX - 1,
      .default_text = "no trace",
      .doc = "write a trace of the whole process to this file"},
     FIELD(trace),
     CORE_CONFIG_HAS_TRACE,
     apply_trace},
    {{.name = "bounds_check",
      .type = CUBE_CONFIG_WORD,
      .words = bounds_check_words,
      .default_text = "launch",
      .doc = "launch: each launch chooses; always: every launch is checked"},
     FIELD(bounds_always),
     CORE_CONFIG_HAS_BOUNDS_CHECK,
     apply_bounds_check},
    {{.name = "memory_trace",
      .type = CUBE_CONFIG_PATH,
      .max_len = CORE_CONFIG_PATH_MAX - 1,
      .default_text = "no memory trace",
      .doc = "write every buffer allocation and release of the process to "
             "this file, in bench_memory's trace format (%p: the process "
             "id)"},
     FIELD(memory_trace),
     CORE_CONFIG_HAS_MEMORY_TRACE,
     apply_memory_trace},
};

#define CORE_KEY_COUNT (sizeof core_keys / sizeof core_keys[0])

/* --- all keys ------------------------------------------------------------- */

/* A key of the core or of a backend. */
typedef struct key_ref {
    const cube_config_key *key;
    const core_key *core; /* NULL: a backend's key */
    const char *owner;
    size_t slot; /* a backend's key: its place in core_config_file.backend */
} key_ref;

/* Key `index` of all: the core's, then each backend's. Returns 0, or -1
 * past the last. */
static int key_at(size_t index, key_ref *out)
{
    if (index < CORE_KEY_COUNT) {
        *out = (key_ref){&core_keys[index].key, &core_keys[index], "core", 0};
        return 0;
    }
    size_t slot = 0;
    const cube_backend *const *backends = core_backends();
    for (size_t b = 0; backends && backends[b]; b++) {
        const cube_config_key *keys = backends[b]->config_keys;
        for (size_t i = 0; keys && keys[i].name; i++, slot++) {
            if (CORE_KEY_COUNT + slot == index) {
                *out = (key_ref){&keys[i], NULL, backends[b]->name, slot};
                return 0;
            }
        }
    }
    return -1;
}

/* The key named [name, name + len), case ignored. Returns 0, or -1. */
static int key_find(const char *name, size_t len, key_ref *out)
{
    for (size_t i = 0; key_at(i, out) == 0; i++)
        if (strlen(out->key->name) == len &&
            strncasecmp(name, out->key->name, len) == 0)
            return 0;
    return -1;
}

const cube_config_key *core_config_key_at(size_t index, const char **owner)
{
    key_ref k;
    if (key_at(index, &k) != 0)
        return NULL;
    if (owner)
        *owner = k.owner;
    return k.key;
}

/* --- values --------------------------------------------------------------- */

enum check { CHECK_OK, CHECK_BAD, CHECK_LONG };

/* Whether `key` accepts v (n bytes, NUL-terminated); a number or word's
 * value goes to *number. */
static enum check check_value(const cube_config_key *key, const char *v,
                              size_t n, uint32_t *number)
{
    *number = 0;
    switch (key->type) {
    case CUBE_CONFIG_UINT: {
        /* Digits only: strtoul would also take blanks and a sign. */
        if (*v < '0' || *v > '9')
            return CHECK_BAD;
        char *end;
        errno = 0;
        unsigned long x = strtoul(v, &end, 10);
        if (errno || *end || x < key->min || x > key->max)
            return CHECK_BAD;
        *number = (uint32_t)x;
        return CHECK_OK;
    }
    case CUBE_CONFIG_WORD:
        for (const cube_config_word *w = key->words; w && w->word; w++) {
            if (strcasecmp(v, w->word) == 0) {
                *number = (uint32_t)w->value;
                return CHECK_OK;
            }
        }
        return CHECK_BAD;
    case CUBE_CONFIG_TEXT:
    case CUBE_CONFIG_PATH: return n > key->max_len ? CHECK_LONG : CHECK_OK;
    }
    return CHECK_BAD;
}

/* What `key` accepts, for "is not ..." warnings: "a number in 1..4096",
 * "'launch' or 'always'", "one of trace, debug, ...". */
static const char *accepted(const cube_config_key *key, char *buf, size_t size)
{
    if (key->type == CUBE_CONFIG_UINT) {
        snprintf(buf, size, "a number in %u..%u", (unsigned)key->min,
                 (unsigned)key->max);
        return buf;
    }
    size_t shown = 0;
    for (const cube_config_word *w = key->words; w && w->word; w++)
        shown += !w->alias;
    size_t len = 0;
    buf[0] = '\0';
    if (shown != 2)
        len += (size_t)snprintf(buf, size, "one of ");
    size_t i = 0;
    for (const cube_config_word *w = key->words; w && w->word; w++) {
        if (w->alias || len >= size)
            continue;
        const char *sep = i == 0 ? "" : shown == 2 ? " or " : ", ";
        const char *quote = shown == 2 ? "'" : "";
        len += (size_t)snprintf(buf + len, size - len, "%s%s%s%s", sep, quote,
                                w->word, quote);
        i++;
    }
    return buf;
}

/* Starts *out for key k: unset. */
static void value_init(const key_ref *k, cube_config_value *out)
{
    memset(out, 0, sizeof *out);
    out->key = k->key;
    out->owner = k->owner;
    int n = snprintf(out->variable, sizeof out->variable, "CUBERT_%s",
                     k->key->name);
    for (int i = 0; i < n && out->variable[i]; i++)
        out->variable[i] = (char)toupper((unsigned char)out->variable[i]);
}

/* The variable's value, when it is set and usable. Returns 0, or -1 (after
 * a warning when `warn` and the variable is set but not usable). */
static int from_env(int warn, cube_config_value *out)
{
    const cube_config_key *key = out->key;
    const char *v = getenv(out->variable);
    if (!v || (!*v && !(key->flags & CUBE_CONFIG_EMPTY_IS_VALUE)))
        return -1;
    uint32_t number;
    switch (check_value(key, v, strlen(v), &number)) {
    case CHECK_OK:
        out->origin = CUBE_CONFIG_ENVIRONMENT;
        out->text =
            key->type == CUBE_CONFIG_TEXT || key->type == CUBE_CONFIG_PATH
                ? v
                : NULL;
        out->number = number;
        return 0;
    case CHECK_BAD:
        if (warn) {
            char expect[160];
            cube_log_write(CUBE_LOG_WARN, "config",
                           "%s='%s' is not %s; ignored", out->variable, v,
                           accepted(key, expect, sizeof expect));
        }
        break;
    case CHECK_LONG:
        if (warn)
            cube_log_write(CUBE_LOG_WARN, "config",
                           "%s is longer than %zu bytes; ignored",
                           out->variable, key->max_len);
        break;
    }
    out->rejected = v;
    return -1;
}

/* The file's value, when it has one. Returns 0, or -1. */
static int from_file(const key_ref *k, const core_config_file *fs,
                     const char *path, cube_config_value *out)
{
    const cube_config_key *key = k->key;
    const char *stored;
    if (k->core) {
        if (!k->core->field_size || !(fs->set & k->core->bit))
            return -1;
        stored = (const char *)fs + k->core->field;
    } else {
        if (k->slot >= CORE_CONFIG_BACKEND_KEYS ||
            !(fs->backend_set & (1u << k->slot)))
            return -1;
        stored = fs->backend[k->slot];
    }
    out->origin = CUBE_CONFIG_FILE;
    out->file = path;
    out->text = NULL;
    out->number = 0;
    switch (key->type) {
    case CUBE_CONFIG_TEXT:
    case CUBE_CONFIG_PATH: out->text = stored; break;
    case CUBE_CONFIG_UINT:
    case CUBE_CONFIG_WORD:
        if (k->core) {
            /* The parser stored the number (uint32_t) or word (int). */
            if (key->type == CUBE_CONFIG_UINT) {
                memcpy(&out->number, stored, sizeof out->number);
            } else {
                int w;
                memcpy(&w, stored, sizeof w);
                out->number = (uint32_t)w;
            }
        } else {
            /* The parser checked the text, so this cannot fail. */
            check_value(key, stored, strlen(stored), &out->number);
        }
        break;
    }
    return 0;
}

/* Key k's value: the variable, else the file, else unset. */
static void resolve(const key_ref *k, const core_config_file *fs,
                    const char *path, int warn, cube_config_value *out)
{
    value_init(k, out);
    if (from_env(warn, out) != 0)
        from_file(k, fs, path, out);
}

/* --- the file's text ------------------------------------------------------ */

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

/* Applies `key = value` (value NUL-terminated, n bytes) to *out. */
static void store_value(const char *origin, unsigned line, const key_ref *k,
                        const char *value, size_t n, core_config_file *out)
{
    const cube_config_key *key = k->key;
    if (!k->core && k->slot >= CORE_CONFIG_BACKEND_KEYS) {
        cube_log_write(CUBE_LOG_WARN, "config",
                       "%s:%u: key '%s': the backends have more than %d keys "
                       "and this one cannot be kept; line ignored",
                       origin, line, key->name, CORE_CONFIG_BACKEND_KEYS);
        return;
    }
    unsigned bit = k->core ? k->core->bit : 1u << k->slot;
    unsigned *set = k->core ? &out->set : &out->backend_set;
    if (n == 0 && !(key->flags & CUBE_CONFIG_EMPTY_IS_VALUE)) {
        *set &= ~bit;
        return;
    }
    uint32_t number;
    enum check c = check_value(key, value, n, &number);
    /* Guards the copy below should a key's max_len outgrow its field. */
    if (c == CHECK_OK && k->core &&
        (key->type == CUBE_CONFIG_TEXT || key->type == CUBE_CONFIG_PATH) &&
        n >= k->core->field_size)
        c = CHECK_LONG;
    if (c == CHECK_BAD) {
        char expect[160];
        cube_log_write(CUBE_LOG_WARN, "config",
                       "%s:%u: %s '%s' is not %s; line ignored", origin, line,
                       key->name, value, accepted(key, expect, sizeof expect));
        return;
    }
    if (c == CHECK_LONG) {
        cube_log_write(CUBE_LOG_WARN, "config",
                       "%s:%u: %s is longer than %zu bytes; line ignored",
                       origin, line, key->name, key->max_len);
        return;
    }
    if (!k->core) {
        /* The value came from a line, so it fits (see the assertion). */
        memcpy(out->backend[k->slot], value, n + 1);
    } else if (key->type == CUBE_CONFIG_TEXT || key->type == CUBE_CONFIG_PATH) {
        memcpy((char *)out + k->core->field, value, n + 1);
    } else if (key->type == CUBE_CONFIG_UINT) {
        memcpy((char *)out + k->core->field, &number, sizeof number);
    } else {
        int w = (int)number;
        memcpy((char *)out + k->core->field, &w, sizeof w);
    }
    *set |= bit;
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
    key_ref k;
    if (key_find(key, key_len, &k) != 0) {
        cube_log_write(CUBE_LOG_WARN, "config",
                       "%s:%u: key '%.*s' is unknown; line ignored", origin,
                       line, shown, key);
        return;
    }
    if (k.key->flags & CUBE_CONFIG_ENV_ONLY) {
        cube_config_value only;
        value_init(&k, &only);
        cube_log_write(CUBE_LOG_WARN, "config",
                       "%s:%u: key '%s' can only be set by the variable %s; "
                       "line ignored",
                       origin, line, k.key->name, only.variable);
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
                           origin, line, k.key->name);
            return;
        }
        const char *rest = close + 1;
        size_t rest_len = v_len - (size_t)(rest - v);
        trim(&rest, &rest_len);
        if (rest_len && rest[0] != '#') {
            cube_log_write(CUBE_LOG_WARN, "config",
                           "%s:%u: key '%s': text follows the closing quote; "
                           "line ignored",
                           origin, line, k.key->name);
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
    store_value(origin, line, &k, value, v_len, out);
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
    /* Without blocking on a FIFO, and only a regular file: a device or a
     * pipe is never a configuration file. */
    char why[256];
    int fd =
        core_file_open(path, O_RDONLY, 0, CORE_FILE_REGULAR, why, sizeof why);
    if (fd < 0) {
        int e = errno;
        if (via || (e != ENOENT && e != ENOTDIR))
            cube_log_write(CUBE_LOG_WARN, "config",
                           "%s%scannot use the configuration file '%s': %s; "
                           "not using it",
                           via ? via : "", via ? ": " : "", path, why);
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

/* Reads the file, then applies each core key: the variable when it is set
 * and usable, else the file's value; a value that cannot be applied is
 * reported and the next one tried; with neither, the default stays. */
static void read_config(void)
{
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

    for (size_t i = 0; i < CORE_KEY_COUNT; i++) {
        const core_key *ck = &core_keys[i];
        if (!ck->apply)
            continue;
        key_ref k = {&ck->key, ck, "core", 0};
        cube_config_value v;
        value_init(&k, &v);
        for (int place = 0; place < 2; place++) {
            int found = place == 0
                            ? from_env(1, &v)
                            : from_file(&k, &file_settings,
                                        file_used ? file_path : NULL, &v);
            if (found != 0)
                continue;
            cube_error *err = ck->apply(&v);
            if (!err)
                break;
            char where[CONFIG_PATH_BUF + 64];
            cube_log_write(CUBE_LOG_WARN, "config", "%s: %s",
                           cube_config_where(&v, where, sizeof where),
                           cube_error_message(err));
            cube_error_free(err);
        }
    }
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

const char *core_config_memory_trace_path(void)
{
    pthread_once(&config_once, read_config);
    return memory_trace_path[0] ? memory_trace_path : NULL;
}

const char *core_config_memory_trace_origin(void)
{
    pthread_once(&config_once, read_config);
    return memory_trace_origin;
}

/* --- lookups -------------------------------------------------------------- */

int core_config_resolve(const core_config_file *file, const char *path,
                        const char *name, int warn, cube_config_value *out)
{
    if (!out)
        return -1;
    memset(out, 0, sizeof *out);
    key_ref k;
    if (!file || !name || key_find(name, strlen(name), &k) != 0)
        return -1;
    resolve(&k, file, path, warn, out);
    return 0;
}

int cube_config_lookup(const char *name, cube_config_value *out)
{
    pthread_once(&config_once, read_config);
    return core_config_resolve(&file_settings, file_used ? file_path : NULL,
                               name, 1, out);
}

const char *cube_config_text(const char *name)
{
    cube_config_value v;
    if (cube_config_lookup(name, &v) != 0)
        return NULL;
    return v.text;
}

int cube_config_entry(size_t index, cube_config_value *out)
{
    if (!out)
        return -1;
    memset(out, 0, sizeof *out);
    key_ref k;
    if (key_at(index, &k) != 0)
        return -1;
    pthread_once(&config_once, read_config);
    resolve(&k, &file_settings, file_used ? file_path : NULL, 0, out);
    return 0;
}

const char *cube_config_where(const cube_config_value *value, char *buf,
                              size_t size)
{
    if (!buf || size == 0)
        return "";
    if (!value || !value->key)
        snprintf(buf, size, "nowhere");
    else if (value->origin == CUBE_CONFIG_ENVIRONMENT)
        snprintf(buf, size, "%s", value->variable);
    else if (value->origin == CUBE_CONFIG_FILE)
        snprintf(buf, size, "%s in %s", value->key->name,
                 value->file ? value->file : "the configuration file");
    else
        snprintf(buf, size, "default");
    return buf;
}

const char *cube_config_file(void)
{
    return core_config_file_path();
}
