/* cubert — the logger.
 *
 * cubert never prints on its own: everything it has to say goes through this
 * process-wide logger, which drops messages below its level and hands the
 * rest to one sink. The default sink writes to stderr at level WARN.
 * CUBERT_LOG_LEVEL and CUBERT_LOG_FILE (or the configuration file's
 * log_level and log_file) are read once, at the first cube_client_open,
 * and then override earlier cube_log_set_* calls.
 *
 * Categories name where a message comes from: "compile", "launch", "memory",
 * "profile", "config", "client", "cpu", "cuda".
 *
 * Thread safety: every function here may be called from any thread. The
 * sink is called under the logger's lock, one message at a time, so it
 * need not be thread-safe, but it must not log itself (that deadlocks).
 */
#ifndef CUBERT_LOG_H
#define CUBERT_LOG_H

#include "cubert/error.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum cube_log_level {
    CUBE_LOG_TRACE = 0,
    CUBE_LOG_DEBUG = 1,
    CUBE_LOG_INFO = 2,
    CUBE_LOG_WARN = 3,
    CUBE_LOG_ERROR = 4,
    CUBE_LOG_OFF = 5
} cube_log_level;

/* A sink receives each message at or above the level. `category` and
 * `message` are borrowed for the duration of the call. */
typedef void (*cube_log_sink_fn)(void *user, cube_log_level level,
                                 const char *category, const char *message);

CUBE_API void cube_log_set_level(cube_log_level level);
CUBE_API cube_log_level cube_log_get_level(void);

/* Replaces the sink; NULL restores the stderr sink. `user` is borrowed and
 * must stay valid until the sink is replaced. */
CUBE_API void cube_log_set_sink(cube_log_sink_fn sink, void *user);

/* Sends messages to the file at `path` (appended, created 0600): a regular
 * file or a character device (/dev/null, a terminal). A FIFO, a socket or a
 * directory is refused without waiting on it. Errors:
 * CUBE_ERR_INVALID_ARGUMENT (NULL or empty path), CUBE_ERR_IO (cannot open,
 * or not a regular file or a character device; the message says which). */
CUBE_API CUBE_MUST_USE cube_error *cube_log_set_file(const char *path);

/* Parses "trace", "debug", "info", "warn", "error" or "off". Returns 0 and
 * sets *out on success, -1 on an unknown name. */
CUBE_API int cube_log_level_parse(const char *name, cube_log_level *out);

/* Writes one message (printf format) through the logger. For backends and
 * tools; applications may use it too. */
CUBE_API void cube_log_write(cube_log_level level, const char *category,
                             const char *fmt, ...) CUBE_PRINTF(3, 4);

/* True when a message at `level` would be kept: check before building an
 * expensive message. */
CUBE_API int cube_log_enabled(cube_log_level level);

#ifdef __cplusplus
}
#endif

#endif /* CUBERT_LOG_H */
