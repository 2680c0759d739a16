/* Opening user-chosen files without blocking on a FIFO (file_open.h). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include "core/file_open.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int kind_accepted(mode_t mode, core_file_kinds kinds)
{
    return S_ISREG(mode) ||
           (kinds == CORE_FILE_REGULAR_OR_CHAR && S_ISCHR(mode));
}

static const char *kind_name(mode_t mode)
{
    if (S_ISFIFO(mode))
        return "a FIFO (named pipe)";
    if (S_ISSOCK(mode))
        return "a socket";
    if (S_ISDIR(mode))
        return "a directory";
    if (S_ISBLK(mode))
        return "a block device";
    if (S_ISCHR(mode))
        return "a character device";
    return "not a regular file";
}

/* Fills `why` for a file of the wrong kind; returns -1 with errno EINVAL. */
static int refuse(mode_t mode, core_file_kinds kinds, char *why,
                  size_t why_size)
{
    if (why && why_size)
        snprintf(
            why, why_size, "it is %s, not a regular file%s", kind_name(mode),
            kinds == CORE_FILE_REGULAR_OR_CHAR ? " or a character device" : "");
    errno = EINVAL;
    return -1;
}

/* Fills `why` with the message for errno value `e`; returns -1 with errno
 * set to `e`. */
static int fail(int e, const char *step, char *why, size_t why_size)
{
    if (why && why_size) {
        char eb[128];
        /* The GNU strerror_r: thread-safe, unlike strerror. */
        const char *text = strerror_r(e, eb, sizeof eb);
        snprintf(why, why_size, "%s%s%s", step ? step : "", step ? ": " : "",
                 text);
    }
    errno = e;
    return -1;
}

int core_file_open(const char *path, int flags, mode_t mode,
                   core_file_kinds kinds, char *why, size_t why_size)
{
    if (why && why_size)
        why[0] = '\0';
    if (!path || !*path)
        return fail(EINVAL, NULL, why, why_size);
    /* Look first: a FIFO, socket or device is refused without being
     * opened, which could block or have effects of its own. */
    struct stat st;
    if (stat(path, &st) == 0 && !kind_accepted(st.st_mode, kinds))
        return refuse(st.st_mode, kinds, why, why_size);
    /* O_NONBLOCK covers whatever replaces the file after that look: the
     * open of a FIFO then returns at once (or fails with ENXIO when
     * writing and nobody reads), and the check below refuses it. */
    int open_flags = (flags & ~O_TRUNC) | O_CLOEXEC | O_NOCTTY | O_NONBLOCK;
    int fd;
    do {
        fd = open(path, open_flags, mode);
    } while (fd < 0 && errno == EINTR);
    if (fd < 0)
        return fail(errno, NULL, why, why_size);
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return fail(e, "cannot stat it", why, why_size);
    }
    if (!kind_accepted(st.st_mode, kinds)) {
        close(fd);
        return refuse(st.st_mode, kinds, why, why_size);
    }
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) != 0) {
        int e = errno;
        close(fd);
        return fail(e, "cannot make it blocking", why, why_size);
    }
    if ((flags & O_TRUNC) && S_ISREG(st.st_mode) && ftruncate(fd, 0) != 0) {
        int e = errno;
        close(fd);
        return fail(e, "cannot truncate it", why, why_size);
    }
    return fd;
}

void core_file_drop_in_child(FILE *f)
{
    int null_fd = open("/dev/null", O_WRONLY | O_CLOEXEC);
    if (null_fd < 0)
        return;
    dup2(null_fd, fileno(f));
    close(null_fd);
    fclose(f);
}
