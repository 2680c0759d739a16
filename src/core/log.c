/* Log files: cube_log_set_file opens the file the core's way (no FIFO,
 * no socket) and hands it to the logger (src/base/log.c). */
#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>

#include "base/error.h"
#include "base/log.h"
#include "core/file_open.h"

cube_error *cube_log_set_file(const char *path)
{
    if (!path || !*path)
        return cube_error_new(CUBE_ERR_INVALID_ARGUMENT,
                              "cube_log_set_file: path is NULL or empty");
    /* A regular file or a character device (/dev/null, a terminal): a
     * FIFO would block the open until a reader came, and raise SIGPIPE in
     * the program when the reader went away. */
    char why[256];
    int fd = core_file_open(path, O_WRONLY | O_CREAT | O_APPEND, 0600,
                            CORE_FILE_REGULAR_OR_CHAR, why, sizeof why);
    if (fd < 0)
        return cube_error_new(
            CUBE_ERR_IO, "cube_log_set_file: cannot use '%s': %s", path, why);
    FILE *f = fdopen(fd, "a");
    if (!f) {
        close(fd);
        return cube_error_new(CUBE_ERR_IO,
                              "cube_log_set_file: cannot open '%s'", path);
    }
    setvbuf(f, NULL, _IOLBF, 0);
    cube_log_sink_to_file(f);
    return NULL;
}
