/* Opening a file whose path the user (or whoever controls the filesystem)
 * chose: the configuration file, the log file, the trace file.
 *
 * A plain open() of a FIFO waits for the other end, forever if nobody
 * comes, and opening a device or a socket is never what such a setting
 * means. core_file_open looks at what is at the path before opening it,
 * opens it with O_NONBLOCK (so a FIFO put there in between cannot block
 * either), checks the type again on the open descriptor, and only then
 * clears O_NONBLOCK and, for O_TRUNC, truncates.
 *
 * Thread safety: may be called from any thread; it keeps no state.
 */
#ifndef CUBE_CORE_FILE_OPEN_H
#define CUBE_CORE_FILE_OPEN_H

#include <stddef.h>
#include <stdio.h>
#include <sys/types.h>

/* What core_file_open accepts besides a regular file. */
typedef enum core_file_kinds {
    CORE_FILE_REGULAR = 0,        /* regular files only */
    CORE_FILE_REGULAR_OR_CHAR = 1 /* also a character device: /dev/null, a
                                     terminal */
} core_file_kinds;

/* Opens `path` with `flags` (O_RDONLY, or O_WRONLY with O_CREAT, O_APPEND
 * or O_TRUNC; O_CLOEXEC, O_NOCTTY and O_NONBLOCK are added, and O_TRUNC is
 * applied only to a regular file, after the checks) and `mode` for a file
 * it creates. Anything but what `kinds` accepts (a FIFO, a socket, a
 * directory, a block device) is refused without waiting on it. Returns a
 * blocking descriptor, or -1 with errno set (EINVAL for a refused kind of
 * file, else the system's) and `why` (of `why_size` bytes, may be NULL)
 * holding the reason in words ("it is a FIFO, not a regular file", "No
 * such file or directory"). */
int core_file_open(const char *path, int flags, mode_t mode,
                   core_file_kinds kinds, char *why, size_t why_size);

/* In a fork child, lets go of `f`, a file the parent goes on writing: its
 * descriptor is pointed at /dev/null first, so that closing it writes none
 * of the buffer the child inherited. Without /dev/null, `f` is left open
 * and unused: closing it would write the parent's buffered bytes a second
 * time. Either way the caller forgets `f`. */
void core_file_drop_in_child(FILE *f);

#endif /* CUBE_CORE_FILE_OPEN_H */
