/* The CPU JIT's own files and what they share (cpu_jit.h is its API):
 *
 *   cpu_jit.c           the cache and the loader: keys, stamps, building an
 *                       object through the disk cache, loading it
 *   cpu_jit_compiler.c  running the compiler: a child process with its
 *                       output captured, its status, the argument list
 *   cpu_jit_setup.c     creation: the configuration keys, the probes of the
 *                       compiler and the CPU, the user's cflags filtered
 *
 * Thread safety: as cpu_jit.h (a cpu_jit never changes after creation).
 */
#ifndef CUBE_CPU_JIT_INTERNAL_H
#define CUBE_CPU_JIT_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>

#include "backends/common/disk_cache.h"
#include "base/text_buf.h"
#include "backends/cpu/cpu_jit.h"
#include "cubert/error.h"

/* Bump when the key material or the fixed flags change: old entries then
 * stop matching and are rebuilt. */
#define CPU_JIT_VERSION_TAG "cubert-cpu-jit-1"

struct cpu_jit {
    char *cc;           /* compiler program (argv[0], found through PATH) */
    char *cflags;       /* extra flags for every compile ("" for none), with
                           no -D/-U of a CUBE_ macro */
    char *cc_identity;  /* first line of `cc --version` */
    char *cpu_identity; /* model name and feature flags from /proc/cpuinfo */
    char *fixed_flags;  /* the defaults and required flags, for the key */
    char *tmp_base;     /* where private temporary directories go */
    disk_cache *cache;  /* the disk cache (possibly disabled) */
};

/* A growable byte buffer (text_buf_append appends to it). */
typedef text_buf cpu_jit_buf;

/* Runs argv (argv[0] looked up in PATH, no shell) with stdin on /dev/null
 * and stdout+stderr captured. On success *output is the captured text (NUL
 * terminated, caller frees) and *status the raw wait status. Errors:
 * CUBE_ERR_IO (cannot start or wait), CUBE_ERR_OUT_OF_MEMORY. */
cube_error *cpu_jit_run(const char *const *argv, char **output, int *status);

/* Runs the compiler on src_path, writing so_path; `hex` names the entry in
 * the messages. Errors: CUBE_ERR_COMPILE (the source failed: the
 * compiler's output is the error's log), CUBE_ERR_IO (the compiler itself
 * failed, killed or out of resources, or could not run), as cpu_jit_run. */
cube_error *cpu_jit_compile(const cpu_jit *jit, const char *flags,
                            const char *hex, const char *src_path,
                            const char *so_path);

/* The fixed flags (defaults, then required, with "| " where the user's
 * go), for the key. NULL for want of memory. */
char *cpu_jit_join_fixed_flags(void);

#endif /* CUBE_CPU_JIT_INTERNAL_H */
