/* The CPU backend's compiler: turns a C translation unit into a loaded
 * shared object by running the system C compiler, with an on-disk cache.
 *
 * Cache entries live in a private directory (0700, owned by the user;
 * default $XDG_CACHE_HOME/cubert/cpu, else $HOME/.cache/cubert/cpu). Each is
 * written to a temporary name and renamed into place, so readers never see
 * a half-written file, and carries a record of its key and a digest of its
 * bytes, keyed with the cache's secret, that is checked before the object is
 * loaded: a corrupt, truncated or foreign entry is rebuilt, never loaded.
 * Each object also carries a stamp naming its entry, checked in its bytes
 * before it is loaded and as a symbol after: an entry holding another
 * kernel's object is rebuilt.
 *
 * Thread safety: a cpu_jit may be used from any number of threads at once.
 * A cpu_module is immutable and may be shared; close it once.
 */
#ifndef CUBE_CPU_JIT_H
#define CUBE_CPU_JIT_H

#include <stdint.h>

#include "cubert/backend/config.h"
#include "cubert/error.h"

/* The CPU backend's configuration keys (cpu_cc, cpu_cflags, ...), for its
 * cube_backend: the compiler is what reads most of them. */
extern const cube_config_key cpu_config_keys[];

/* The values of the key cpu_barriers. */
enum { CPU_BARRIERS_AUTO = 0, CPU_BARRIERS_FIBERS = 1 };

typedef struct cpu_jit cpu_jit;
typedef struct cpu_module cpu_module;

typedef struct cpu_jit_options {
    /* Compiler command (a program name or path); NULL: the key cpu_cc
     * ($CUBERT_CPU_CC, else the file's), else "cc". */
    const char *cc;
    /* Extra flags for every compile (space separated), placed after the
     * defaults (-std=c11 -O3 -march=native ...) and before the required
     * flags (-fPIC -shared -Wl,--no-undefined) and cpu_jit_load's `flags`,
     * so they can change the former but not the latter; a -D or -U of a
     * CUBE_ macro is dropped with a warning. NULL: the key cpu_cflags,
     * else none. */
    const char *cflags;
    /* Cache directory; NULL: the default above; "" disables the disk
     * cache (objects are then built in a private temporary directory). */
    const char *cache_dir;
} cpu_jit_options;

/* Where cpu_jit_load found the module. */
typedef enum cpu_jit_origin {
    CPU_JIT_COMPILED = 0, /* ran the compiler */
    CPU_JIT_DISK = 1      /* loaded a verified disk-cache entry */
} cpu_jit_origin;

/* Errors: CUBE_ERR_INVALID_ARGUMENT (out NULL), CUBE_ERR_OUT_OF_MEMORY.
 * An unusable cache directory is not an error: the disk cache is disabled
 * with a warning through the logger. So is a compiler or CPU that cannot
 * be identified for the key (`cc --version` fails or prints nothing,
 * /proc/cpuinfo cannot be read or names none of its fields): one warning,
 * and no disk cache for this jit. */
cube_error *cpu_jit_create(const cpu_jit_options *options, cpu_jit **out);
void cpu_jit_destroy(cpu_jit *jit);

/* Compiles `source` (a complete C11 translation unit) with optimization
 * (-O3, native code for this machine) plus `flags` (may be NULL; they come
 * last, so they win over the options' cflags) into a shared object linked
 * with -Wl,--no-undefined, and loads it. The cache key covers the source, the
 * flags, the compiler's identity (its --version output) and the machine's CPU.
 * Errors: CUBE_ERR_INVALID_ARGUMENT, CUBE_ERR_COMPILE (the compiler's
 * output is the error's log; a symbol nothing defines is one, from the
 * linker), CUBE_ERR_IO (cannot run the compiler or load the object; the
 * compiler, or a program its driver ran, was killed by a signal; it failed
 * without any diagnostics: the message names the signal or says so, and
 * any output is the log), CUBE_ERR_OUT_OF_MEMORY. `origin` may be NULL. */
cube_error *cpu_jit_load(cpu_jit *jit, const char *source, const char *flags,
                         cpu_module **out, cpu_jit_origin *origin);

/* Makes the text to compile from `source` on a cache miss: 0 with *text
 * set (malloc'd; the loader frees it), or nonzero (and *text NULL) to
 * refuse, the caller's reasons kept in `ctx`. */
typedef int (*cpu_jit_derive_fn)(void *ctx, const char *source, char **text);

/* As cpu_jit_load, for a translation unit derived from `source` (the CPU
 * barrier pass's output): the cache key covers `source`, `flags` and
 * `variant` (what the derivation is, its version included) instead of
 * the derived text, so a disk hit skips `derive` altogether. On a miss,
 * `derive` runs; if it refuses, *out is NULL and no error is returned.
 * Errors: those of cpu_jit_load. */
cube_error *cpu_jit_load_derived(cpu_jit *jit, const char *source,
                                 const char *flags, const char *variant,
                                 cpu_jit_derive_fn derive, void *ctx,
                                 cpu_module **out, cpu_jit_origin *origin);

/* Loads a shared object given as `len` bytes (a raw kernel's): they are
 * written to a fresh file in a private temporary directory, loaded from
 * there with dlopen (its constructors run) and the file removed; nothing
 * is cached on disk. Errors: CUBE_ERR_INVALID_ARGUMENT, CUBE_ERR_IO (the
 * directory or file cannot be made or written), CUBE_ERR_COMPILE (the
 * dynamic loader refuses the object: the message is its own),
 * CUBE_ERR_OUT_OF_MEMORY. */
cube_error *cpu_jit_load_object(cpu_jit *jit, const void *bytes, size_t len,
                                cpu_module **out);

/* Runs `argv` (a NULL-terminated list; argv[0] is found through PATH, no
 * shell) with one more argument: the path of a file named `file_name` (no
 * '/') holding `source`, in a private temporary directory that is removed
 * before the call returns. stdin is /dev/null; stdout and stderr are
 * captured into *output (malloc'd, NUL terminated; the caller frees it) and
 * *status is the raw wait status. For checks that only read the source
 * (a syntax-only pass of another compiler); nothing is cached.
 * Errors: CUBE_ERR_INVALID_ARGUMENT, CUBE_ERR_IO (the directory or file
 * cannot be made or written; the program cannot be run or waited for),
 * CUBE_ERR_OUT_OF_MEMORY; *output is then NULL. */
cube_error *cpu_jit_run_on_source(const cpu_jit *jit, const char *const *argv,
                                  const char *source, const char *file_name,
                                  char **output, int *status);

/* The address of the exported symbol `name`, or NULL. */
void *cpu_module_symbol(const cpu_module *module, const char *name);

/* Unloads the module. NULL is a no-op. */
void cpu_module_close(cpu_module *module);

/* The 64-bit key cpu_jit_load would use for (source, flags) — for tests
 * and for the client's in-memory cache. */
uint64_t cpu_jit_key(const cpu_jit *jit, const char *source, const char *flags);

#endif /* CUBE_CPU_JIT_H */
