/* The CPU backend's compiler: runs the system C compiler on a translation
 * unit, loads the shared object with dlopen and keeps the objects it built
 * in the backends' verified disk cache (backends/common/disk_cache.h), as
 * <key>.so entries. Only bytes the cache verified are loaded, from a
 * private copy (see cpu_jit_open_bytes).
 *
 * Every object carries a stamp: an exported string, cube__jit_stamp, that
 * names the entry (key and key material) it was built for; it is added to
 * the source after the key is made. A verified entry is loaded only when
 * its bytes hold its own stamp, and kept only when the loaded module's
 * symbol is that stamp: an entry that holds another kernel's object (with a
 * record that matches it) is removed and rebuilt, not run.
 *
 * A cpu_jit never changes after cpu_jit_create, so it needs no lock: all
 * per-call state lives in private temporary directories and files created
 * with O_EXCL, and the disk cache is itself safe to share.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <spawn.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "backends/common/disk_cache.h"
#include "backends/common/file_io.h"
#include "backends/cpu/cpu_jit.h"
#include "backends/cpu/cpu_jit_internal.h"
#include "base/clock.h"
#include "base/error.h"
#include "base/path.h"
#include "cubert/log.h"

/* The stamp (see the top): the symbol, and the text's first words. */
#define CPU_JIT_STAMP_SYMBOL "cube__jit_stamp"
#define CPU_JIT_STAMP_PREFIX "cubert-cpu-jit-stamp "
#define CPU_JIT_STAMP_BUF 96

/* Objects larger than this are not cached (nor read back). */
#define CPU_JIT_MAX_OBJECT ((size_t)1 << 30)

struct cpu_module {
    void *handle;
};

/* ---------------------------------------------------------------- helpers */

/* Reads the object the compiler just wrote (at most `max` bytes) into a new
 * buffer. Returns 0 or an errno value (EFBIG when it is larger). */
static int cpu_jit_read_object(const char *path, size_t max,
                               unsigned char **out, size_t *out_len)
{
    /* O_NONBLOCK: whatever the compiler left there, the open never waits
     * (a FIFO would); only a regular file is read. */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (fd < 0)
        return errno;
    struct stat st;
    int e = 0;
    unsigned char *data = NULL;
    size_t got = 0;
    int fl;
    if (fstat(fd, &st) != 0)
        e = errno;
    else if (!S_ISREG(st.st_mode) || st.st_size < 0)
        e = EINVAL;
    else if ((fl = fcntl(fd, F_GETFL)) < 0 ||
             fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) != 0)
        e = errno;
    else if ((uint64_t)st.st_size > (uint64_t)max)
        e = EFBIG;
    else if (!(data = malloc((size_t)st.st_size + 1)))
        e = ENOMEM;
    while (e == 0 && got < (size_t)st.st_size) {
        ssize_t n = read(fd, data + got, (size_t)st.st_size - got);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            e = errno;
        else if (n == 0)
            break; /* the hash in the cache record covers what was read */
        else
            got += (size_t)n;
    }
    close(fd);
    if (e != 0) {
        free(data);
        return e;
    }
    *out = data;
    *out_len = got;
    return 0;
}

/* Removes a private temporary directory and the files in it. */
static void cpu_jit_remove_dir(const char *path)
{
    DIR *d = opendir(path);
    if (d) {
        int fd = dirfd(d);
        struct dirent *ent;
        while ((ent = readdir(d)) != NULL) {
            if (strcmp(ent->d_name, ".") == 0 || strcmp(ent->d_name, "..") == 0)
                continue;
            unlinkat(fd, ent->d_name, 0);
        }
        closedir(d);
    }
    if (rmdir(path) != 0)
        cube_log_write(CUBE_LOG_DEBUG, "compile",
                       "cannot remove temporary directory '%s'", path);
}

/* Writes `text` to a new private file at `path` (it must not exist); a
 * failed write or close is CUBE_ERR_IO naming `fn` and the path. */
static cube_error *cpu_jit_write_new(const char *path, const char *text,
                                     const char *fn)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    int rc = fd < 0 ? -1 : file_write_all(fd, text, strlen(text));
    int e = errno;
    if (fd >= 0 && close(fd) != 0 && rc == 0) {
        rc = -1;
        e = errno;
    }
    if (rc == 0)
        return NULL;
    char eb[128];
    return cube_error_new(CUBE_ERR_IO, "%s: cannot write '%s': %s", fn, path,
                          file_strerror(e, eb, sizeof eb));
}

/* A fresh private (0700) directory under the temporary base. */
static cube_error *cpu_jit_make_tmpdir(const cpu_jit *jit, const char *what,
                                       char **out)
{
    size_t n = strlen(jit->tmp_base) + strlen(what) + 32;
    char *path = malloc(n);
    if (!path)
        return cube_error_new(CUBE_ERR_OUT_OF_MEMORY,
                              "cpu_jit_load: out of memory");
    snprintf(path, n, "%s/cubert-%s-XXXXXX", jit->tmp_base, what);
    if (!mkdtemp(path)) {
        char eb[128];
        cube_error *err = cube_error_new(
            CUBE_ERR_IO, "cpu_jit_load: cannot create a directory in '%s': %s",
            jit->tmp_base, file_strerror(errno, eb, sizeof eb));
        free(path);
        return err;
    }
    *out = path;
    return NULL;
}

/* A new private temporary directory (named for `tag`) and the path of the
 * file `name` in it, written with `text` unless that is NULL: *dir and
 * *path, for cpu_jit_drop_private to remove even when this fails. `fn`
 * names the caller in messages. */
static cube_error *cpu_jit_private_file(const cpu_jit *jit, const char *tag,
                                        const char *name, const char *text,
                                        char **dir, char **path, const char *fn)
{
    cube_error *err = cpu_jit_make_tmpdir(jit, tag, dir);
    if (err)
        return err;
    *path = cube_path_join(*dir, name);
    if (!*path)
        return cube_error_new(CUBE_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    return text ? cpu_jit_write_new(*path, text, fn) : NULL;
}

/* Removes what cpu_jit_private_file made and frees the names: the file by
 * name first, so the directory goes too when it cannot be listed. */
static void cpu_jit_drop_private(char *dir, char *path)
{
    if (path)
        unlink(path);
    if (dir)
        cpu_jit_remove_dir(dir);
    free(path);
    free(dir);
}

/* --------------------------------------------------------------- the key */

/* Names the entry for (source, flags): everything the object depends on.
 * A NULL string counts as "". */
/* `variant` (NULL for a plain load) names how a derived load turns the
 * source into what is compiled; it is a field of its own only when set,
 * so plain keys are what they always were. */
static void cpu_jit_key_make_variant(const cpu_jit *jit, const char *source,
                                     const char *flags, const char *variant,
                                     disk_cache_key *out)
{
    const char *fields[] = {CPU_JIT_VERSION_TAG,
                            jit->cc,
                            jit->cc_identity,
                            jit->cpu_identity,
                            jit->fixed_flags,
                            jit->cflags,
                            flags,
                            source,
                            variant};
    enum { NFIELDS = sizeof fields / sizeof fields[0] };
    const void *parts[NFIELDS];
    size_t lens[NFIELDS];
    for (size_t i = 0; i < NFIELDS; i++) {
        parts[i] = fields[i] ? fields[i] : "";
        lens[i] = fields[i] ? strlen(fields[i]) : 0;
    }
    disk_cache_key_make(parts, lens, variant ? NFIELDS : NFIELDS - 1, out);
}

static void cpu_jit_key_make(const cpu_jit *jit, const char *source,
                             const char *flags, disk_cache_key *out)
{
    cpu_jit_key_make_variant(jit, source, flags, NULL, out);
}

uint64_t cpu_jit_key(const cpu_jit *jit, const char *source, const char *flags)
{
    if (!jit || !source)
        return 0;
    disk_cache_key key;
    cpu_jit_key_make(jit, source, flags, &key);
    return key.key;
}

/* ------------------------------------------------------------ the stamp */

/* The stamp of the entry `key`: the whole key, so that no other entry's
 * object carries it. */
static void cpu_jit_stamp(const disk_cache_key *key, char *buf, size_t size)
{
    snprintf(buf, size,
             CPU_JIT_STAMP_PREFIX "%016" PRIx64 "%016" PRIx64 "%016" PRIx64,
             key->key, key->material_high, key->material_low);
}

/* `source` with the definition of the stamp after it, or NULL for want of
 * memory. The #line keeps compiler messages about the source pointing at
 * it; the declaration keeps -Wmissing-variable-declarations quiet. */
static char *cpu_jit_stamped_source(const char *source,
                                    const disk_cache_key *key)
{
    char stamp[CPU_JIT_STAMP_BUF];
    cpu_jit_stamp(key, stamp, sizeof stamp);
    static const char fmt[] =
        "%s\n#line 1 \"cubert-stamp\"\n"
        "extern const char " CPU_JIT_STAMP_SYMBOL "[];\n"
        "__attribute__((visibility(\"default\"), used)) const "
        "char " CPU_JIT_STAMP_SYMBOL "[] = \"%s\";\n";
    size_t n = strlen(source) + sizeof fmt + strlen(stamp);
    char *text = malloc(n);
    if (text)
        snprintf(text, n, fmt, source, stamp);
    return text;
}

/* -------------------------------------------------------------- modules */

/* `refused` is the code of the dynamic loader's refusal: CUBE_ERR_IO for
 * an object the compiler just built (the machine's failure), or
 * CUBE_ERR_COMPILE for bytes a caller gave (theirs). */
static cube_error *cpu_jit_dlopen(const char *path, cube_code refused,
                                  cpu_module **out)
{
    cpu_module *m = malloc(sizeof *m);
    if (!m)
        return cube_error_new(CUBE_ERR_OUT_OF_MEMORY,
                              "cpu_jit_load: out of memory");
    m->handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!m->handle) {
        const char *why = dlerror();
        free(m);
        return cube_error_new(refused, "cpu_jit_load: cannot load '%s': %s",
                              path, why ? why : "unknown dlopen error");
    }
    *out = m;
    return NULL;
}

/* Loads verified bytes. We copy them to a fresh private file and dlopen
 * that, rather than dlopen the cache file (or /proc/self/fd/N of it):
 *  - what gets mapped is exactly the bytes we hashed; the cache file could
 *    be rewritten in place between our check and dlopen's own open;
 *  - a fresh inode per load keeps modules independent (glibc returns the
 *    existing handle, with its global state, for a path or inode already
 *    loaded);
 *  - it needs no /proc. The copy of an object is cheap next to dlopen. */
static cube_error *cpu_jit_open_bytes(const cpu_jit *jit,
                                      const unsigned char *bytes, size_t len,
                                      cube_code refused, cpu_module **out)
{
    char *dir = NULL, *path = NULL;
    cube_error *err = cpu_jit_private_file(jit, "so", "module.so", NULL, &dir,
                                           &path, "cpu_jit_load");
    if (err) {
        cpu_jit_drop_private(dir, path);
        return err;
    }
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0 || file_write_all(fd, bytes, len) != 0) {
        char eb[128];
        err = cube_error_new(CUBE_ERR_IO, "cpu_jit_load: cannot write '%s': %s",
                             path, file_strerror(errno, eb, sizeof eb));
    }
    if (fd >= 0 && close(fd) != 0 && !err) {
        char eb[128];
        err = cube_error_new(CUBE_ERR_IO, "cpu_jit_load: cannot write '%s': %s",
                             path, file_strerror(errno, eb, sizeof eb));
    }
    if (!err)
        err = cpu_jit_dlopen(path, refused, out);
    /* The mapping outlives the name (and no descriptor is left). */
    cpu_jit_drop_private(dir, path);
    return err;
}

void *cpu_module_symbol(const cpu_module *module, const char *name)
{
    if (!module || !name)
        return NULL;
    return dlsym(module->handle, name);
}

void cpu_module_close(cpu_module *module)
{
    if (!module)
        return;
    dlclose(module->handle);
    free(module);
}

/* Whether the loaded module is the one built for `key`. */
static bool cpu_jit_module_is(const cpu_module *module,
                              const disk_cache_key *key)
{
    char stamp[CPU_JIT_STAMP_BUF];
    cpu_jit_stamp(key, stamp, sizeof stamp);
    const char *found = cpu_module_symbol(module, CPU_JIT_STAMP_SYMBOL);
    return found && strncmp(found, stamp, sizeof stamp) == 0;
}

/* ------------------------------------------------------------- building */

/* Compiles in a private temporary directory, loads the result and stores
 * it in the disk cache (when there is one). */
static cube_error *cpu_jit_build(const cpu_jit *jit, const char *source,
                                 const char *flags, const disk_cache_key *key,
                                 cpu_module **out)
{
    if (cube_log_enabled(CUBE_LOG_TRACE))
        cube_log_write(CUBE_LOG_TRACE, "compile",
                       "source of %s (flags '%s'):\n%s", key->hex,
                       flags ? flags : "", source);
    char *dir = NULL, *src_path = NULL, *so_path = NULL;
    char *stamped = cpu_jit_stamped_source(source, key);
    cube_error *err =
        stamped ? cpu_jit_private_file(jit, "cc", "kernel.c", stamped, &dir,
                                       &src_path, "cpu_jit_load")
                : cube_error_new(CUBE_ERR_OUT_OF_MEMORY,
                                 "cpu_jit_load: out of memory");
    if (!err && !(so_path = cube_path_join(dir, "kernel.so")))
        err = cube_error_new(CUBE_ERR_OUT_OF_MEMORY,
                             "cpu_jit_load: out of memory");
    if (err)
        goto done;

    err = cpu_jit_compile(jit, flags, key->hex, src_path, so_path);
    if (err)
        goto done;
    /* The freshly written file is a new inode in a private directory, so it
     * can be loaded directly. */
    err = cpu_jit_dlopen(so_path, CUBE_ERR_IO, out);
    if (err)
        goto done;

    if (disk_cache_path(jit->cache) && !cpu_jit_module_is(*out, key)) {
        /* The compiler dropped the stamp (some option of cpu_cflags?): the
         * object works, but a cached copy could never be told from another
         * kernel's, so it is not cached. */
        cube_log_write(CUBE_LOG_WARN, "compile",
                       "not caching %s: the object lacks its stamp "
                       "(" CPU_JIT_STAMP_SYMBOL ")",
                       key->hex);
    } else if (disk_cache_path(jit->cache)) {
        /* Cache the bytes read here: the record then describes exactly what
         * is written to the cache. */
        unsigned char *bytes = NULL;
        size_t len = 0;
        int e = cpu_jit_read_object(so_path, CPU_JIT_MAX_OBJECT, &bytes, &len);
        if (e == 0) {
            disk_cache_put(jit->cache, key, bytes, len);
            free(bytes);
        } else {
            char eb[128];
            cube_log_write(CUBE_LOG_WARN, "compile",
                           "not caching %s: cannot read '%s': %s", key->hex,
                           so_path, file_strerror(e, eb, sizeof eb));
        }
    }
done:
    /* The files made here go by name first, so the directory goes too
     * when it cannot be listed. */
    if (so_path)
        unlink(so_path);
    free(so_path);
    cpu_jit_drop_private(dir, src_path);
    free(stamped);
    return err;
}

cube_error *cpu_jit_run_on_source(const cpu_jit *jit, const char *const *argv,
                                  const char *source, const char *file_name,
                                  char **output, int *status)
{
    if (output)
        *output = NULL;
    if (!jit || !argv || !argv[0] || !source || !file_name || !output ||
        !status || strchr(file_name, '/'))
        return cube_error_new(CUBE_ERR_INVALID_ARGUMENT,
                              "cpu_jit_run_on_source: %s",
                              !jit || !argv || !argv[0] ? "no program"
                              : !source || !file_name   ? "no source"
                              : !output || !status      ? "no output"
                                                        : "bad file name");
    size_t argc = 0;
    while (argv[argc])
        argc++;
    char *dir = NULL, *path = NULL;
    const char **args = calloc(argc + 2, sizeof *args);
    cube_error *err =
        args ? cpu_jit_private_file(jit, "check", file_name, source, &dir,
                                    &path, "cpu_jit_run_on_source")
             : cube_error_new(CUBE_ERR_OUT_OF_MEMORY,
                              "cpu_jit_run_on_source: out of memory");
    if (err)
        goto done;
    memcpy(args, argv, argc * sizeof *args);
    args[argc] = path;
    args[argc + 1] = NULL;
    err = cpu_jit_run(args, output, status);
done:
    cpu_jit_drop_private(dir, path);
    free(args);
    return err;
}

/* Loads the disk cache's entry for `key`, when there is a verified one
 * that is the kernel it is filed under. Returns true with *out set, or
 * false (no entry, or a bad one, removed with a warning) to build. */
static bool cpu_jit_load_cached(const cpu_jit *jit, const disk_cache_key *key,
                                cpu_module **out)
{
    double t0 = cube_clock_ms();
    unsigned char *bytes = NULL;
    size_t len = 0;
    if (disk_cache_get(jit->cache, key, CPU_JIT_MAX_OBJECT, &bytes, &len) !=
        DISK_CACHE_HIT)
        return false;
    /* Its own stamp must be in the bytes before anything of the object
     * runs (a constructor would, in dlopen), and be the module's symbol
     * once it is loaded. */
    char stamp[CPU_JIT_STAMP_BUF];
    cpu_jit_stamp(key, stamp, sizeof stamp);
    const char *wrong = NULL;
    cube_error *err = NULL;
    if (!memmem(bytes, len, stamp, strlen(stamp))) {
        wrong = "its object does not carry the entry's stamp";
    } else if (!(err = cpu_jit_open_bytes(jit, bytes, len, CUBE_ERR_IO, out)) &&
               !cpu_jit_module_is(*out, key)) {
        wrong =
            "the loaded module's " CPU_JIT_STAMP_SYMBOL " names another entry";
        cpu_module_close(*out);
        *out = NULL;
    }
    free(bytes);
    if (wrong) {
        cube_log_write(CUBE_LOG_WARN, "compile",
                       "disk cache entry %s is not the kernel it is filed "
                       "under (%s); removing it and rebuilding",
                       key->hex, wrong);
    } else if (err) {
        /* Verified but unloadable (for example a library it needs is
         * gone). */
        cube_log_write(CUBE_LOG_WARN, "compile",
                       "disk cache entry %s did not load (%s); rebuilding",
                       key->hex, cube_error_message(err));
        cube_error_free(err);
    } else {
        cube_log_write(CUBE_LOG_DEBUG, "compile",
                       "loaded %s from the disk cache in %.2f ms", key->hex,
                       cube_clock_ms() - t0);
        return true;
    }
    disk_cache_remove(jit->cache, key);
    return false;
}

cube_error *cpu_jit_load(cpu_jit *jit, const char *source, const char *flags,
                         cpu_module **out, cpu_jit_origin *origin)
{
    if (out)
        *out = NULL;
    if (!jit || !source || !out)
        return cube_error_new(CUBE_ERR_INVALID_ARGUMENT,
                              "cpu_jit_load: %s is NULL",
                              !jit      ? "jit"
                              : !source ? "source"
                                        : "out");
    disk_cache_key key;
    cpu_jit_key_make(jit, source, flags, &key);

    if (disk_cache_path(jit->cache) && cpu_jit_load_cached(jit, &key, out)) {
        if (origin)
            *origin = CPU_JIT_DISK;
        return NULL;
    }
    cube_error *err = cpu_jit_build(jit, source, flags, &key, out);
    if (!err && origin)
        *origin = CPU_JIT_COMPILED;
    return err;
}

cube_error *cpu_jit_load_derived(cpu_jit *jit, const char *source,
                                 const char *flags, const char *variant,
                                 cpu_jit_derive_fn derive, void *ctx,
                                 cpu_module **out, cpu_jit_origin *origin)
{
    if (out)
        *out = NULL;
    if (!jit || !source || !variant || !derive || !out)
        return cube_error_new(CUBE_ERR_INVALID_ARGUMENT,
                              "cpu_jit_load_derived: %s is NULL",
                              !jit       ? "jit"
                              : !source  ? "source"
                              : !variant ? "variant"
                              : !derive  ? "derive"
                                         : "out");
    disk_cache_key key;
    cpu_jit_key_make_variant(jit, source, flags, variant, &key);
    if (disk_cache_path(jit->cache) && cpu_jit_load_cached(jit, &key, out)) {
        if (origin)
            *origin = CPU_JIT_DISK;
        return NULL;
    }
    char *text = NULL;
    if (derive(ctx, source, &text) != 0 || !text)
        return NULL;
    cube_error *err = cpu_jit_build(jit, text, flags, &key, out);
    free(text);
    if (!err && origin)
        *origin = CPU_JIT_COMPILED;
    return err;
}

cube_error *cpu_jit_load_object(cpu_jit *jit, const void *bytes, size_t len,
                                cpu_module **out)
{
    if (out)
        *out = NULL;
    if (!jit || !bytes || !len || !out)
        return cube_error_new(CUBE_ERR_INVALID_ARGUMENT,
                              "cpu_jit_load_object: %s",
                              !jit     ? "jit is NULL"
                              : !bytes ? "bytes is NULL"
                              : !len   ? "len is 0"
                                       : "out is NULL");
    return cpu_jit_open_bytes(jit, bytes, len, CUBE_ERR_COMPILE, out);
}
