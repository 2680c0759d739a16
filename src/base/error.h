/* Error values for the library's own code (memory, core, backends), not
 * part of the public API. The error type and its constructors
 * (cube_error_new, cube_error_wrap, ...) are defined in src/base/error.c
 * and declared in the public cubert/error.h and cubert/backend/errors.h,
 * which this header brings in, so that every layer builds errors from the
 * bottom one.
 *
 * Thread safety: may be called from any thread, with any lock held (the
 * logger's lock comes last in docs/threading.md's order).
 */
#ifndef CUBE_BASE_ERROR_H
#define CUBE_BASE_ERROR_H

#include "cubert/backend/errors.h"
#include "cubert/error.h"

/* Drops `err` on purpose: logs it at debug level with `why` (the reason it
 * may be dropped) and frees it. NULL is nothing to drop. Use it where an
 * error has nowhere to go (a destroy, a fallback that replaces the
 * failed step, a second error after the first is kept), so that a drop
 * reads as a decision and shows up in a debug log; an error already
 * reported or folded into another is freed with cube_error_free. */
void cube_error_ignore(cube_error *err, const char *why);

/* CUBE_ERR_INVALID_ARGUMENT, "<fn>: <name> is NULL": a call's pointer
 * argument `name` that must not be NULL was. */
cube_error *cube_error_null_argument(const char *fn, const char *name);

#endif /* CUBE_BASE_ERROR_H */
