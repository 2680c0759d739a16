/* The memory trace (memory_trace.h): a buffered FILE under one lock, ids
 * counted under it, and `active` for the hooks' fast path (one relaxed
 * atomic load when off). The file is created with mode 0600, or
 * truncated: one process, one trace ("%p" in the path becomes the process
 * id, for programs that start several). A child made by fork() drops the
 * trace without writing its copy of the buffer, as the event trace does
 * (trace.c). */
#include "core/memory_trace.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/mutex.h"
#include "core/config.h"
#include "core/file_open.h"
#include "cubert/log.h"

typedef unsigned long long ull;

static atomic_int active;
static cube_mutex lock = CUBE_MUTEX_INIT;
static pthread_once_t env_once = PTHREAD_ONCE_INIT;
static FILE *file CUBE_GUARDED_BY(lock);
static char path[CORE_CONFIG_PATH_MAX + 32] CUBE_GUARDED_BY(lock);
static uint64_t next_id CUBE_GUARDED_BY(lock);

/* Stops recording after a failed write, with one warning. */
static void fail_locked(int error) CUBE_REQUIRES(lock);

static void fail_locked(int error)
{
    atomic_store_explicit(&active, 0, memory_order_relaxed);
    cube_log_write(CUBE_LOG_WARN, "memory",
                   "writing the memory trace '%s' failed (%s); recording "
                   "stops, the file ends early",
                   path, strerror(error ? error : EIO));
    fclose(file);
    file = NULL;
}

static void at_exit(void)
{
    core_memory_trace_flush();
}

static void fork_prepare(void) CUBE_NO_TSA;
static void fork_parent(void) CUBE_NO_TSA;
static void fork_child(void) CUBE_NO_TSA;

static void fork_prepare(void)
{
    cube_mutex_lock(&lock);
}

static void fork_parent(void)
{
    cube_mutex_unlock(&lock);
}

static void fork_child(void)
{
    if (file) {
        atomic_store_explicit(&active, 0, memory_order_relaxed);
        core_file_drop_in_child(file);
        file = NULL;
    }
    cube_mutex_unlock(&lock);
}

/* The configured path with each "%p" replaced by the process id. */
static void expand(const char *in, char *out, size_t size)
{
    size_t n = 0;
    for (; *in && n + 1 < size; in++) {
        if (in[0] == '%' && in[1] == 'p') {
            int w = snprintf(out + n, size - n, "%ld", (long)getpid());
            n = w > 0 && (size_t)w < size - n ? n + (size_t)w : size - 1;
            in++;
        } else {
            out[n++] = *in;
        }
    }
    out[n] = '\0';
}

static void start_from_config(void)
{
    const char *configured = core_config_memory_trace_path();
    if (!configured || !*configured)
        return;
    char where[CORE_CONFIG_PATH_MAX + 32];
    expand(configured, where, sizeof where);
    char why[160] = "";
    int fd = core_file_open(where, O_WRONLY | O_CREAT | O_TRUNC, 0600,
                            CORE_FILE_REGULAR_OR_CHAR, why, sizeof why);
    FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
    if (!f) {
        if (fd >= 0) {
            snprintf(why, sizeof why, "%s", strerror(errno));
            close(fd);
        }
        cube_log_write(CUBE_LOG_WARN, "memory",
                       "cannot write the memory trace named by %s ('%s'): "
                       "%s; not recording",
                       core_config_memory_trace_origin(), where, why);
        return;
    }
    /* Large writes, few system calls: the hooks run on the allocation
     * path. */
    setvbuf(f, NULL, _IOFBF, 1u << 20);
    cube_mutex_lock(&lock);
    file = f;
    snprintf(path, sizeof path, "%s", where);
    next_id = 0;
    if (fprintf(file,
                "# cubert memory trace of process %ld: every buffer "
                "allocation and release; format: 'a <id> <bytes>' / "
                "'f <id>'\n",
                (long)getpid()) < 0)
        fail_locked(errno);
    else
        atomic_store_explicit(&active, 1, memory_order_relaxed);
    cube_mutex_unlock(&lock);
    if (atexit(at_exit) != 0 ||
        pthread_atfork(fork_prepare, fork_parent, fork_child) != 0)
        cube_log_write(CUBE_LOG_DEBUG, "memory",
                       "cannot register the memory trace's exit or fork "
                       "handlers");
    cube_log_write(CUBE_LOG_INFO, "memory", "recording a memory trace in '%s'",
                   where);
}

void core_memory_trace_from_env(void)
{
    pthread_once(&env_once, start_from_config);
}

uint64_t core_memory_trace_alloc(uint64_t bytes)
{
    if (!atomic_load_explicit(&active, memory_order_relaxed))
        return 0;
    uint64_t id = 0;
    cube_mutex_lock(&lock);
    if (file) {
        id = ++next_id;
        if (fprintf(file, "a %llu %llu\n", (ull)id, (ull)bytes) < 0) {
            fail_locked(errno);
            id = 0;
        }
    }
    cube_mutex_unlock(&lock);
    return id;
}

void core_memory_trace_free(uint64_t id)
{
    if (!id || !atomic_load_explicit(&active, memory_order_relaxed))
        return;
    cube_mutex_lock(&lock);
    if (file && fprintf(file, "f %llu\n", (ull)id) < 0)
        fail_locked(errno);
    cube_mutex_unlock(&lock);
}

void core_memory_trace_flush(void)
{
    if (!atomic_load_explicit(&active, memory_order_relaxed))
        return;
    cube_mutex_lock(&lock);
    if (file && fflush(file) != 0)
        fail_locked(errno);
    cube_mutex_unlock(&lock);
}
