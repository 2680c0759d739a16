/* Small file helpers the backends share (the disk cache, the CPU JIT).
 * Thread safety: both functions may be called from any thread. */
#ifndef CUBE_FILE_IO_H
#define CUBE_FILE_IO_H

#include <stddef.h>

/* Writes all `len` bytes to `fd`, retrying after signals. Returns 0, or -1
 * with errno set. */
int file_write_all(int fd, const void *data, size_t len);

/* The message for errno value `err`, in `buf` (or a static string). */
const char *file_strerror(int err, char *buf, size_t size);

#endif /* CUBE_FILE_IO_H */
