/* cubert — building errors (for backend authors and cubert itself).
 *
 * Constructors never fail: when memory for an error cannot be had they return
 * a shared static out-of-memory error that cube_error_free() ignores, so an
 * error path never turns into a NULL (success) by accident.
 *
 * Thread safety: all functions may be called from any thread.
 */
#ifndef CUBERT_BACKEND_ERRORS_H
#define CUBERT_BACKEND_ERRORS_H

#include <stdarg.h>

#include "cubert/error.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A new error with a printf-formatted message. Caller owns it. */
CUBE_API CUBE_MUST_USE CUBE_RETURNS_NONNULL cube_error *
cube_error_new(cube_code code, const char *fmt, ...) CUBE_PRINTF(2, 3);
CUBE_API CUBE_MUST_USE CUBE_RETURNS_NONNULL cube_error *
cube_error_newv(cube_code code, const char *fmt, va_list ap);

/* Attaches a copy of `log` (for example a compiler's output) to `err` and
 * returns `err`. */
CUBE_API cube_error *cube_error_set_log(cube_error *err, const char *log);

/* Appends `cause` to `parent`'s causes; ownership of `cause` transfers to
 * `parent`. Returns `parent`. */
CUBE_API cube_error *cube_error_add_cause(cube_error *parent,
                                          cube_error *cause);

/* A new error of `code` whose single cause is `cause` (ownership
 * transfers); the message is printf-formatted. */
CUBE_API CUBE_MUST_USE cube_error *
cube_error_wrap(cube_error *cause, cube_code code, const char *fmt, ...)
    CUBE_PRINTF(3, 4);

/* A deep copy of `err` (NULL for NULL). Caller owns it. */
CUBE_API CUBE_MUST_USE cube_error *cube_error_clone(const cube_error *err);

/* Returns `err` with "context: " put in front of its message. */
CUBE_API cube_error *cube_error_prefix(cube_error *err, const char *fmt, ...)
    CUBE_PRINTF(2, 3);

#ifdef __cplusplus
}
#endif

#endif /* CUBERT_BACKEND_ERRORS_H */
