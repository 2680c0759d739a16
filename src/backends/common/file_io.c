/* Small file helpers the backends share (file_io.h). */
#include "backends/common/file_io.h"

#include <errno.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

int file_write_all(int fd, const void *data, size_t len)
{
    const unsigned char *p = data;
    while (len > 0) {
        ssize_t n = write(fd, p, len);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

const char *file_strerror(int err, char *buf, size_t size)
{
    /* The GNU strerror_r (the build defines _GNU_SOURCE): thread-safe,
     * unlike strerror. */
    return strerror_r(err, buf, size);
}
