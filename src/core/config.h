/* Configuration: the optional configuration file, the table of keys and
 * the settings that do not live in core_config (client_internal.h).
 *
 * Settings come from CUBERT_* environment variables and from a file of
 * `key = value` lines; a variable wins over the file. Every key is one
 * cube_config_key (cubert/backend/config.h): the core's are listed in
 * config.c, each backend's in its cube_backend. The core's settings are
 * read once per process, by the first of core_config_get,
 * core_config_bounds_always, core_config_trace_path or
 * core_config_trace_origin; backends look theirs up with
 * cube_config_lookup when they open. docs/configuration.md lists every
 * key.
 *
 * Thread safety: every function may be called from any thread.
 */
#ifndef CUBE_CORE_CONFIG_H
#define CUBE_CORE_CONFIG_H

#include <stddef.h>
#include <stdint.h>

#include "cubert/backend/config.h"
#include "cubert/log.h"

/* Longest path value kept, terminator included. */
#define CORE_CONFIG_PATH_MAX 1024
/* Longest line of the file, terminator not included. */
#define CORE_CONFIG_LINE_MAX 4096
/* Largest file read. */
#define CORE_CONFIG_FILE_MAX ((size_t)256 * 1024)
/* Backends' keys a file can set, over all backends. */
#define CORE_CONFIG_BACKEND_KEYS 16

/* Bits of core_config_file.set: which keys the file gave a usable value. */
enum {
    CORE_CONFIG_HAS_LOG_LEVEL = 1u << 0,
    CORE_CONFIG_HAS_LOG_FILE = 1u << 1,
    CORE_CONFIG_HAS_CPU_THREADS = 1u << 2,
    CORE_CONFIG_HAS_CACHE_DIR = 1u << 3,
    CORE_CONFIG_HAS_DEVICE = 1u << 4,
    CORE_CONFIG_HAS_TRACE = 1u << 5,
    CORE_CONFIG_HAS_BOUNDS_CHECK = 1u << 6,
    CORE_CONFIG_HAS_MEMORY_TRACE = 1u << 7
};

/* What a configuration file says. A field is meaningful only when its bit
 * is in `set`; backend[i] only when bit i is in `backend_set`. */
typedef struct core_config_file {
    unsigned set;
    cube_log_level log_level;
    char log_file[CORE_CONFIG_PATH_MAX];
    uint32_t cpu_threads;                 /* 1..4096 */
    char cache_dir[CORE_CONFIG_PATH_MAX]; /* "": disk cache off */
    char device[64];
    char trace[CORE_CONFIG_PATH_MAX];
    int bounds_always; /* bounds_check: 0 "launch", 1 "always" */
    char memory_trace[CORE_CONFIG_PATH_MAX];
    /* The backends' keys, as written, in the order core_config_key_at
     * lists them after the core's. */
    unsigned backend_set;
    char backend[CORE_CONFIG_BACKEND_KEYS][CUBE_CONFIG_TEXT_MAX + 1];
} core_config_file;

/* Parses the text of a configuration file into *out, which it first
 * clears (nothing set). `origin` names the text in warnings (the file's
 * path); `text` is NUL-terminated, NULL reads as empty.
 *
 * The format: one `key = value` per line; blank lines are skipped; `#`
 * starts a comment at the beginning of a line or after a blank outside
 * double quotes; blanks around keys and values are trimmed; a value may be
 * wrapped in double quotes (kept verbatim, no escapes). Keys are the
 * names of the keys (the core's and the backends'), in any case. A later
 * line for the same key replaces an earlier one. An empty value leaves the
 * key unset, except for keys flagged CUBE_CONFIG_EMPTY_IS_VALUE (cache_dir,
 * where it turns the disk cache off).
 *
 * A line that is not `key = value`, names an unknown key or one only the
 * environment sets, holds a value the key does not accept, or is longer
 * than CORE_CONFIG_LINE_MAX bytes is logged as a warning ("config"
 * category) naming the origin, line number and key, and ignored. Never
 * fails. */
void core_config_parse_text(const char *origin, const char *text,
                            core_config_file *out);

/* Reads the file at `path` and parses it into *out (always cleared first).
 * `via` names where the path came from for warnings ("CUBERT_CONFIG"), or
 * is NULL for a default location, where a file that does not exist is not
 * worth a warning. A file that cannot be read, is larger than
 * CORE_CONFIG_FILE_MAX or holds a NUL byte is logged as a warning and
 * contributes nothing. Returns 0 when the file was read, -1 otherwise. */
int core_config_load_file(const char *path, const char *via,
                          core_config_file *out);

/* The configuration file this process would read, from the environment:
 * $CUBERT_CONFIG when set (empty: none), else
 * $XDG_CONFIG_HOME/cubert/config when XDG_CONFIG_HOME is absolute, else
 * $HOME/.config/cubert/config when HOME is set; NULL when none. The path is
 * written into buf (size bytes; NULL when it does not fit). *explicit_path
 * (may be NULL) is set to 1 when the path came from CUBERT_CONFIG. */
const char *core_config_locate(char *buf, size_t size, int *explicit_path);

/* The file the one-time read used, or NULL when none was read. */
const char *core_config_file_path(void);

/* Nonzero when every launch must be bounds-checked (bounds_check =
 * always); zero when each launch chooses (the default). */
int core_config_bounds_always(void);

/* The path a trace should be written to (CUBERT_TRACE, else the file's
 * trace key), or NULL when unset. */
const char *core_config_trace_path(void);

/* Where core_config_trace_path came from, for messages: "CUBERT_TRACE" or
 * "the trace key of <file>"; "" when unset. */
const char *core_config_trace_origin(void);

/* The path the memory trace is written to (CUBERT_MEMORY_TRACE, else the
 * file's memory_trace key), or NULL when unset; where it came from, for
 * messages, as core_config_trace_origin. */
const char *core_config_memory_trace_path(void);
const char *core_config_memory_trace_origin(void);

/* Key `index` of all keys: the core's, then each backend's in the order of
 * core_backends(). *owner (may be NULL) is set to "core" or the backend's
 * name. NULL past the last key. Reads no setting. */
const cube_config_key *core_config_key_at(size_t index, const char **owner);

/* Key `name`'s value as cube_config_lookup finds it, but from the parsed
 * file *file (read from `path`, which may be NULL) instead of the one the
 * process read, and logging a variable the key does not accept only when
 * `warn` is nonzero. Returns 0, or -1 when there is no such key. */
int core_config_resolve(const core_config_file *file, const char *path,
                        const char *name, int warn, cube_config_value *out);

#endif /* CUBE_CORE_CONFIG_H */
