/* Configuration from CUBERT_* environment variables, read once.
 * A malformed value is reported through the logger, naming the variable,
 * and ignored — never fatal. docs/configuration.md lists every key. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/client_internal.h"

static core_config config;
static pthread_once_t config_once = PTHREAD_ONCE_INIT;

static void read_config(void)
{
    const char *v;
    if ((v = getenv("CUBERT_LOG_LEVEL")) && *v) {
        cube_log_level level;
        if (cube_log_level_parse(v, &level) == 0)
            cube_log_set_level(level);
        else
            cube_log_write(CUBE_LOG_WARN, "config",
                           "CUBERT_LOG_LEVEL='%s' is not one of trace, debug, "
                           "info, warn, error, off; keeping '%s'",
                           v, "warn");
    }
    if ((v = getenv("CUBERT_LOG_FILE")) && *v) {
        cube_error *err = cube_log_set_file(v);
        if (err) {
            cube_log_write(CUBE_LOG_WARN, "config",
                           "CUBERT_LOG_FILE: %s; logging to stderr",
                           cube_error_message(err));
            cube_error_free(err);
        }
    }
    if ((v = getenv("CUBERT_CPU_THREADS")) && *v) {
        char *end;
        errno = 0;
        unsigned long n = strtoul(v, &end, 10);
        if (errno || *end || n == 0 || n > 4096)
            cube_log_write(CUBE_LOG_WARN, "config",
                           "CUBERT_CPU_THREADS='%s' is not a number in "
                           "1..4096; using one thread per core",
                           v);
        else
            config.cpu_threads = (uint32_t)n;
    }
    if ((v = getenv("CUBERT_CACHE_DIR"))) {
        if (strlen(v) >= sizeof config.cache_dir)
            cube_log_write(CUBE_LOG_WARN, "config",
                           "CUBERT_CACHE_DIR is longer than %zu bytes; "
                           "using the default",
                           sizeof config.cache_dir - 1);
        else {
            snprintf(config.cache_dir, sizeof config.cache_dir, "%s", v);
            config.cache_dir_set = 1;
        }
    }
    if ((v = getenv("CUBERT_DEVICE")) && *v) {
        if (strlen(v) >= sizeof config.device)
            cube_log_write(CUBE_LOG_WARN, "config",
                           "CUBERT_DEVICE is too long; using 'cpu'");
        else
            snprintf(config.device, sizeof config.device, "%s", v);
    }
}

const core_config *core_config_get(void)
{
    pthread_once(&config_once, read_config);
    return &config;
}
