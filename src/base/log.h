/* The process-wide logger for the library's own code. Its level, sink and
 * cube_log_write are defined in src/base/log.c and declared in the public
 * cubert/log.h, which this header brings in, so that every layer logs
 * through the bottom one; cube_log_set_file, which opens files the core's
 * way, is in src/core/log.c.
 *
 * Thread safety: as cubert/log.h (the sink runs under the logger's lock,
 * the last lock in docs/threading.md's order).
 */
#ifndef CUBE_BASE_LOG_H
#define CUBE_BASE_LOG_H

#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>

#include "cubert/log.h"

/* Sends messages to `f` (owned from now on) in place of the sink; the file
 * it replaces, if any, is closed. For cube_log_set_file, which opens and
 * checks `f`. */
void cube_log_sink_to_file(FILE *f);

/* `fmt` with `ap` formatted into `small` (`size` bytes) when it fits, else
 * into a buffer of its own: returns `small`, or that buffer for the
 * caller to free, or `small` holding the text cut short when no buffer
 * could be had; NULL when the format itself failed. A text of any length
 * without an allocation in the common, short case. */
char *cube_vformat(char *small, size_t size, const char *fmt, va_list ap);

#endif /* CUBE_BASE_LOG_H */
