/* The CPU backend's compiler: runs the system C compiler on a translation
 * unit, loads the shared object with dlopen and keeps a verified on-disk
 * cache of the objects it built.
 *
 * Disk cache layout (one directory, 0700, owned by the user):
 *   <key>.so    the object, exactly as the compiler wrote it
 *   <key>.meta  a text record: version tag, the 64-bit key, the XXH3-128 of
 *               the whole key material, the object's size and its XXH3-128
 * An entry is used only when its meta matches the key material we expect
 * and the object's size and hash match the meta; anything else is removed
 * and rebuilt. Entries are written under temporary names and renamed into
 * place, the object before its meta, so a meta that exists always names a
 * complete object (and any mismatch is caught by the hash anyway).
 *
 * A cpu_jit never changes after cpu_jit_create, so it needs no lock: all
 * per-call state lives in private temporary directories and files created
 * with O_EXCL.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include "backends/cpu/cpu_jit.h"

#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <spawn.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* Lets the XXH3 state live on the stack: cpu_jit_key cannot report an
 * allocation failure. The header and library come from the same package. */
#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>

#include "cubert/backend/errors.h"
#include "cubert/log.h"

extern char **environ;

/* Bump when the key material, the meta format or the fixed flags change:
 * old entries then stop matching and are rebuilt. */
#define CPU_JIT_VERSION_TAG "cubert-cpu-jit-1"

/* Objects larger than this are not cached (nor read back). */
#define CPU_JIT_MAX_OBJECT ((size_t)1 << 30)
/* A meta record is ~150 bytes; anything this large is not one of ours. */
#define CPU_JIT_MAX_META 4096
/* Compiler output kept for the error log; the rest is drained and dropped. */
#define CPU_JIT_MAX_LOG ((size_t)1 << 20)

static const char *const cpu_jit_fixed_flags[] = {
    "-std=c11",          "-O3",
    "-march=native",     "-fPIC",
    "-shared",           "-fno-semantic-interposition",
    "-ffp-contract=fast"};
#define CPU_JIT_FIXED_COUNT                                                    \
    (sizeof cpu_jit_fixed_flags / sizeof cpu_jit_fixed_flags[0])

struct cpu_jit {
    char *cc;           /* compiler program (argv[0], found through PATH) */
    char *cflags;       /* extra flags for every compile ("" for none) */
    char *cc_identity;  /* first line of `cc --version` */
    char *cpu_identity; /* model name and feature flags from /proc/cpuinfo */
    char *fixed_flags;  /* cpu_jit_fixed_flags joined, for the key */
    char *tmp_base;     /* where private temporary directories go */
    char *cache_path;   /* the disk cache directory, for messages; or NULL */
    int cache_fd;       /* that directory, opened and checked once; or -1 */
};

struct cpu_module {
    void *handle;
};

/* Everything about one (source, flags) pair that names its cache entry. */
typedef struct cpu_jit_keyinfo {
    uint64_t key;
    XXH128_hash_t material; /* wide hash of the same material, for the meta */
    char hex[17];
} cpu_jit_keyinfo;

/* A growable byte buffer; `failed` records an allocation failure. */
typedef struct cpu_jit_buf {
    char *data;
    size_t len;
    size_t cap;
    bool failed;
} cpu_jit_buf;

/* ---------------------------------------------------------------- helpers */

static const char *cpu_jit_strerror(int err, char *buf, size_t size)
{
    /* The GNU strerror_r (we build with _GNU_SOURCE): thread-safe, unlike
     * strerror. */
    return strerror_r(err, buf, size);
}

static double cpu_jit_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static void cpu_jit_buf_append(cpu_jit_buf *b, const void *data, size_t len)
{
    if (b->failed)
        return;
    if (b->len + len + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + len + 1)
            cap *= 2;
        char *grown = realloc(b->data, cap);
        if (!grown) {
            b->failed = true;
            return;
        }
        b->data = grown;
        b->cap = cap;
    }
    memcpy(b->data + b->len, data, len);
    b->len += len;
    b->data[b->len] = '\0';
}

static int cpu_jit_write_all(int fd, const void *data, size_t len)
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

/* Reads all of `fd` (a regular file of `size` bytes per fstat) into a new
 * buffer with a NUL after the data. Returns 0 or an errno value. */
static int cpu_jit_read_fd(int fd, size_t size, unsigned char **out,
                           size_t *out_len)
{
    unsigned char *data = malloc(size + 1);
    if (!data)
        return ENOMEM;
    size_t got = 0;
    while (got < size) {
        ssize_t n = read(fd, data + got, size - got);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            int e = errno;
            free(data);
            return e;
        }
        if (n == 0)
            break; /* shrank since fstat: the hash check will say so */
        got += (size_t)n;
    }
    data[got] = '\0';
    *out = data;
    *out_len = got;
    return 0;
}

/* Opens `name` under `dirfd` (no symlinks), checks it is a regular file of
 * at most `max` bytes and reads it. Returns 0 or an errno value (EINVAL for
 * a file that is not a regular file or is too large). */
static int cpu_jit_read_at(int dirfd, const char *name, size_t max,
                           unsigned char **out, size_t *out_len)
{
    int fd = openat(dirfd, name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0)
        return errno;
    struct stat st;
    int e = 0;
    if (fstat(fd, &st) != 0)
        e = errno;
    else if (!S_ISREG(st.st_mode) || st.st_size < 0 ||
             (uint64_t)st.st_size > (uint64_t)max)
        e = EINVAL;
    else
        e = cpu_jit_read_fd(fd, (size_t)st.st_size, out, out_len);
    close(fd);
    return e;
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
            jit->tmp_base, cpu_jit_strerror(errno, eb, sizeof eb));
        free(path);
        return err;
    }
    *out = path;
    return NULL;
}

static char *cpu_jit_join(const char *a, const char *b)
{
    size_t n = strlen(a) + strlen(b) + 2;
    char *s = malloc(n);
    if (s)
        snprintf(s, n, "%s/%s", a, b);
    return s;
}

/* ---------------------------------------------------- running the compiler */

/* Runs argv (argv[0] looked up in PATH, no shell) with stdin on /dev/null
 * and stdout+stderr captured. On success *output is the captured text (NUL
 * terminated, caller frees) and *status the raw wait status. Errors:
 * CUBE_ERR_IO (cannot start or wait), CUBE_ERR_OUT_OF_MEMORY. */
static cube_error *cpu_jit_run(const char *const *argv, char **output,
                               int *status)
{
    char eb[128];
    int fds[2];
    /* Close-on-exec so children other threads spawn meanwhile do not
     * inherit the pipe and hold our read open past the compiler's exit. */
    if (pipe2(fds, O_CLOEXEC) != 0)
        return cube_error_new(CUBE_ERR_IO, "cannot create a pipe: %s",
                              cpu_jit_strerror(errno, eb, sizeof eb));
    /* dup2 onto 1 and 2 must really copy (and so clear close-on-exec):
     * keep the write end off the standard descriptors. */
    if (fds[1] <= STDERR_FILENO) {
        int moved = fcntl(fds[1], F_DUPFD_CLOEXEC, STDERR_FILENO + 1);
        int e = errno;
        close(fds[1]);
        if (moved < 0) {
            close(fds[0]);
            return cube_error_new(CUBE_ERR_IO, "cannot create a pipe: %s",
                                  cpu_jit_strerror(e, eb, sizeof eb));
        }
        fds[1] = moved;
    }

    posix_spawn_file_actions_t fa;
    posix_spawnattr_t attr;
    int rc = posix_spawn_file_actions_init(&fa);
    if (rc != 0) {
        close(fds[0]);
        close(fds[1]);
        return cube_error_new(CUBE_ERR_OUT_OF_MEMORY,
                              "cannot prepare to run '%s'", argv[0]);
    }
    rc = posix_spawnattr_init(&attr);
    if (rc != 0) {
        posix_spawn_file_actions_destroy(&fa);
        close(fds[0]);
        close(fds[1]);
        return cube_error_new(CUBE_ERR_OUT_OF_MEMORY,
                              "cannot prepare to run '%s'", argv[0]);
    }
    rc = posix_spawn_file_actions_addopen(&fa, STDIN_FILENO, "/dev/null",
                                          O_RDONLY, 0);
    if (rc == 0)
        rc = posix_spawn_file_actions_adddup2(&fa, fds[1], STDOUT_FILENO);
    if (rc == 0)
        rc = posix_spawn_file_actions_adddup2(&fa, fds[1], STDERR_FILENO);
    /* The compiler must not inherit this thread's signal mask, nor an
     * ignored SIGCHLD (the gcc driver waits for its own children). */
    sigset_t mask, defaults;
    sigemptyset(&mask);
    sigemptyset(&defaults);
    sigaddset(&defaults, SIGCHLD);
    sigaddset(&defaults, SIGPIPE);
    if (rc == 0)
        rc = posix_spawnattr_setsigmask(&attr, &mask);
    if (rc == 0)
        rc = posix_spawnattr_setsigdefault(&attr, &defaults);
    if (rc == 0)
        rc = posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK |
                                                 POSIX_SPAWN_SETSIGDEF);
    pid_t pid = -1;
    if (rc == 0)
        rc = posix_spawnp(&pid, argv[0], &fa, &attr, (char *const *)argv,
                          environ);
    posix_spawn_file_actions_destroy(&fa);
    posix_spawnattr_destroy(&attr);
    close(fds[1]);
    if (rc != 0) {
        close(fds[0]);
        return cube_error_new(CUBE_ERR_IO, "cannot run '%s': %s", argv[0],
                              cpu_jit_strerror(rc, eb, sizeof eb));
    }

    cpu_jit_buf out = {0};
    cpu_jit_buf_append(&out, "", 0);
    bool clipped = false;
    char chunk[4096];
    for (;;) {
        ssize_t n = read(fds[0], chunk, sizeof chunk);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        /* Keep draining past the limit so the compiler never blocks. */
        if (out.len + (size_t)n <= CPU_JIT_MAX_LOG)
            cpu_jit_buf_append(&out, chunk, (size_t)n);
        else
            clipped = true;
    }
    close(fds[0]);
    if (clipped)
        cpu_jit_buf_append(&out, "\n[output truncated]\n", 20);

    int wstatus = 0;
    pid_t w;
    do {
        w = waitpid(pid, &wstatus, 0);
    } while (w < 0 && errno == EINTR);
    if (w < 0) {
        int e = errno;
        free(out.data);
        return cube_error_new(CUBE_ERR_IO, "cannot wait for '%s': %s", argv[0],
                              cpu_jit_strerror(e, eb, sizeof eb));
    }
    if (out.failed) {
        free(out.data);
        return cube_error_new(CUBE_ERR_OUT_OF_MEMORY,
                              "out of memory reading the output of '%s'",
                              argv[0]);
    }
    *output = out.data;
    *status = wstatus;
    return NULL;
}

/* Describes a wait status for a message: "exited with status 1". */
static void cpu_jit_describe_status(int status, char *buf, size_t size)
{
    if (WIFEXITED(status))
        snprintf(buf, size, "exited with status %d", WEXITSTATUS(status));
    else if (WIFSIGNALED(status))
        snprintf(buf, size, "was killed by signal %d", WTERMSIG(status));
    else
        snprintf(buf, size, "ended with wait status %d", status);
}

/* Number of space-separated words in `s`. */
static size_t cpu_jit_count_words(const char *s)
{
    size_t n = 0;
    bool in_word = false;
    for (; s && *s; s++) {
        bool space = (*s == ' ' || *s == '\t' || *s == '\n' || *s == '\r' ||
                      *s == '\v' || *s == '\f');
        if (!space && !in_word)
            n++;
        in_word = !space;
    }
    return n;
}

/* Splits the writable copy `s` in place, appending its words to argv. */
static void cpu_jit_split_words(char *s, const char **argv, size_t *argc)
{
    char *save = NULL;
    for (char *w = strtok_r(s, " \t\n\r\v\f", &save); w;
         w = strtok_r(NULL, " \t\n\r\v\f", &save))
        argv[(*argc)++] = w;
}

/* Runs the compiler on src_path, writing so_path. */
static cube_error *cpu_jit_compile(const cpu_jit *jit, const char *flags,
                                   const char *hex, const char *src_path,
                                   const char *so_path)
{
    size_t max_args = 1 + CPU_JIT_FIXED_COUNT + 3 + cpu_jit_count_words(flags) +
                      cpu_jit_count_words(jit->cflags) + 2;
    const char **argv = calloc(max_args, sizeof *argv);
    char *flags_copy = strdup(flags ? flags : "");
    char *cflags_copy = strdup(jit->cflags);
    if (!argv || !flags_copy || !cflags_copy) {
        free(argv);
        free(flags_copy);
        free(cflags_copy);
        return cube_error_new(CUBE_ERR_OUT_OF_MEMORY,
                              "cpu_jit_load: out of memory");
    }
    size_t argc = 0;
    argv[argc++] = jit->cc;
    for (size_t i = 0; i < CPU_JIT_FIXED_COUNT; i++)
        argv[argc++] = cpu_jit_fixed_flags[i];
    argv[argc++] = "-o";
    argv[argc++] = so_path;
    argv[argc++] = src_path;
    cpu_jit_split_words(flags_copy, argv, &argc);
    cpu_jit_split_words(cflags_copy, argv, &argc);
    /* Kernels call math functions; the object must not depend on the host
     * program having loaded libm. Libraries go after the sources. */
    argv[argc++] = "-lm";
    argv[argc] = NULL;

    char *output = NULL;
    int status = 0;
    double t0 = cpu_jit_now_ms();
    cube_error *err = cpu_jit_run(argv, &output, &status);
    double ms = cpu_jit_now_ms() - t0;
    free(argv);
    free(flags_copy);
    free(cflags_copy);
    if (err)
        return cube_error_prefix(err, "cpu_jit_load");

    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        char how[64];
        cpu_jit_describe_status(status, how, sizeof how);
        err = cube_error_new(CUBE_ERR_COMPILE,
                             "cpu_jit_load: compiler '%s' %s compiling %s",
                             jit->cc, how, hex);
        cube_error_set_log(err, output);
        cube_log_write(CUBE_LOG_DEBUG, "compile",
                       "compile of %s failed after %.1f ms", hex, ms);
        free(output);
        return err;
    }
    cube_log_write(CUBE_LOG_DEBUG, "compile", "compiled %s with %s in %.1f ms",
                   hex, jit->cc, ms);
    if (output[0])
        cube_log_write(CUBE_LOG_DEBUG, "compile", "compiler output for %s:\n%s",
                       hex, output);
    free(output);
    return NULL;
}

/* --------------------------------------------------------------- the key */

/* Feeds one field as (8-byte little-endian length, bytes): length prefixes
 * keep ("ab","c") and ("a","bc") apart. */
static void cpu_jit_feed(XXH3_state_t *narrow, XXH3_state_t *wide,
                         const char *s)
{
    if (!s)
        s = "";
    size_t len = strlen(s);
    unsigned char prefix[8];
    for (int i = 0; i < 8; i++)
        prefix[i] = (unsigned char)((uint64_t)len >> (8 * i));
    XXH3_64bits_update(narrow, prefix, sizeof prefix);
    XXH3_64bits_update(narrow, s, len);
    if (wide) {
        XXH3_128bits_update(wide, prefix, sizeof prefix);
        XXH3_128bits_update(wide, s, len);
    }
}

/* Hashes the key material; `wide` (may be NULL) gets the same bytes. */
static uint64_t cpu_jit_hash_material(const cpu_jit *jit, const char *source,
                                      const char *flags, XXH128_hash_t *wide)
{
    XXH3_state_t narrow_state, wide_state;
    XXH3_INITSTATE(&narrow_state);
    XXH3_INITSTATE(&wide_state);
    XXH3_64bits_reset(&narrow_state);
    XXH3_128bits_reset(&wide_state);
    XXH3_state_t *w = wide ? &wide_state : NULL;
    cpu_jit_feed(&narrow_state, w, CPU_JIT_VERSION_TAG);
    cpu_jit_feed(&narrow_state, w, jit->cc);
    cpu_jit_feed(&narrow_state, w, jit->cc_identity);
    cpu_jit_feed(&narrow_state, w, jit->cpu_identity);
    cpu_jit_feed(&narrow_state, w, jit->fixed_flags);
    cpu_jit_feed(&narrow_state, w, jit->cflags);
    cpu_jit_feed(&narrow_state, w, flags);
    cpu_jit_feed(&narrow_state, w, source);
    if (wide)
        *wide = XXH3_128bits_digest(&wide_state);
    return XXH3_64bits_digest(&narrow_state);
}

uint64_t cpu_jit_key(const cpu_jit *jit, const char *source, const char *flags)
{
    if (!jit || !source)
        return 0;
    return cpu_jit_hash_material(jit, source, flags, NULL);
}

static void cpu_jit_keyinfo_make(const cpu_jit *jit, const char *source,
                                 const char *flags, cpu_jit_keyinfo *ki)
{
    ki->key = cpu_jit_hash_material(jit, source, flags, &ki->material);
    snprintf(ki->hex, sizeof ki->hex, "%016" PRIx64, ki->key);
}

/* -------------------------------------------------------------- modules */

static cube_error *cpu_jit_dlopen(const char *path, cpu_module **out)
{
    cpu_module *m = malloc(sizeof *m);
    if (!m)
        return cube_error_new(CUBE_ERR_OUT_OF_MEMORY,
                              "cpu_jit_load: out of memory");
    m->handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!m->handle) {
        const char *why = dlerror();
        free(m);
        return cube_error_new(CUBE_ERR_IO, "cpu_jit_load: cannot load '%s': %s",
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
                                      cpu_module **out)
{
    char *dir = NULL;
    cube_error *err = cpu_jit_make_tmpdir(jit, "so", &dir);
    if (err)
        return err;
    char *path = cpu_jit_join(dir, "module.so");
    if (!path) {
        cpu_jit_remove_dir(dir);
        free(dir);
        return cube_error_new(CUBE_ERR_OUT_OF_MEMORY,
                              "cpu_jit_load: out of memory");
    }
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0 || cpu_jit_write_all(fd, bytes, len) != 0) {
        char eb[128];
        err = cube_error_new(CUBE_ERR_IO, "cpu_jit_load: cannot write '%s': %s",
                             path, cpu_jit_strerror(errno, eb, sizeof eb));
    }
    if (fd >= 0 && close(fd) != 0 && !err) {
        char eb[128];
        err = cube_error_new(CUBE_ERR_IO, "cpu_jit_load: cannot write '%s': %s",
                             path, cpu_jit_strerror(errno, eb, sizeof eb));
    }
    if (!err)
        err = cpu_jit_dlopen(path, out);
    /* The mapping outlives the name. */
    cpu_jit_remove_dir(dir);
    free(path);
    free(dir);
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

/* ----------------------------------------------------------- disk cache */

/* The meta record for an object of `len` bytes hashing to `hash`. The first
 * three lines identify the entry; the last two describe the object. */
static void cpu_jit_meta_format(const cpu_jit_keyinfo *ki, size_t len,
                                XXH128_hash_t hash, char *buf, size_t size,
                                size_t *header_len)
{
    int h = snprintf(buf, size,
                     CPU_JIT_VERSION_TAG "\nkey %s\nmaterial %016" PRIx64
                                         "%016" PRIx64 "\n",
                     ki->hex, ki->material.high64, ki->material.low64);
    snprintf(buf + h, size - (size_t)h,
             "size %zu\nxxh3-128 %016" PRIx64 "%016" PRIx64 "\n", len,
             hash.high64, hash.low64);
    *header_len = (size_t)h;
}

static void cpu_jit_entry_names(const cpu_jit_keyinfo *ki, char *so_name,
                                char *meta_name, size_t size)
{
    snprintf(so_name, size, "%s.so", ki->hex);
    snprintf(meta_name, size, "%s.meta", ki->hex);
}

static void cpu_jit_cache_remove(const cpu_jit *jit, const cpu_jit_keyinfo *ki)
{
    char so_name[32], meta_name[32];
    cpu_jit_entry_names(ki, so_name, meta_name, sizeof so_name);
    /* The meta first: without it the object is ignored. */
    unlinkat(jit->cache_fd, meta_name, 0);
    unlinkat(jit->cache_fd, so_name, 0);
}

typedef enum cpu_jit_lookup {
    CPU_JIT_MISS, /* no usable entry; nothing was removed */
    CPU_JIT_HIT,  /* *bytes hold a verified object */
    CPU_JIT_BAD   /* an entry failed verification and was removed */
} cpu_jit_lookup;

/* Looks up and verifies the entry for `ki`, reading the object into memory
 * (verified bytes are then loaded from that copy, see cpu_jit_open_bytes).
 */
static cpu_jit_lookup cpu_jit_cache_lookup(const cpu_jit *jit,
                                           const cpu_jit_keyinfo *ki,
                                           unsigned char **bytes, size_t *len)
{
    char so_name[32], meta_name[32], eb[128];
    cpu_jit_entry_names(ki, so_name, meta_name, sizeof so_name);

    unsigned char *meta = NULL;
    size_t meta_len = 0;
    int e = cpu_jit_read_at(jit->cache_fd, meta_name, CPU_JIT_MAX_META, &meta,
                            &meta_len);
    if (e == ENOENT || e == ENOMEM) {
        /* Missing meta: never written, or a writer is between its two
         * renames. Rebuilding rewrites both. */
        return CPU_JIT_MISS;
    }
    const char *why = NULL;
    unsigned char *so = NULL;
    size_t so_len = 0;
    if (e != 0) {
        why = cpu_jit_strerror(e, eb, sizeof eb);
    } else {
        e = cpu_jit_read_at(jit->cache_fd, so_name, CPU_JIT_MAX_OBJECT, &so,
                            &so_len);
        if (e == ENOENT || e == ENOMEM) {
            free(meta);
            return CPU_JIT_MISS;
        }
        if (e != 0)
            why = cpu_jit_strerror(e, eb, sizeof eb);
    }
    if (!why) {
        char expect[256];
        size_t header_len;
        cpu_jit_meta_format(ki, so_len, XXH3_128bits(so, so_len), expect,
                            sizeof expect, &header_len);
        size_t expect_len = strlen(expect);
        if (meta_len < header_len || memcmp(meta, expect, header_len) != 0) {
            why = "its record was written for another key or version";
        } else if (meta_len != expect_len ||
                   memcmp(meta, expect, expect_len) != 0) {
            /* The header matched, so the object is not what was stored. */
            char size_line[48];
            snprintf(size_line, sizeof size_line, "size %zu\n", so_len);
            why = strstr((const char *)meta + header_len, size_line)
                      ? "its object is corrupt (hash mismatch)"
                      : "its object is truncated or resized";
        }
    }
    free(meta);
    if (why) {
        free(so);
        cube_log_write(CUBE_LOG_WARN, "compile",
                       "disk cache entry %s in '%s' is bad (%s); removing it "
                       "and rebuilding",
                       ki->hex, jit->cache_path, why);
        cpu_jit_cache_remove(jit, ki);
        return CPU_JIT_BAD;
    }
    *bytes = so;
    *len = so_len;
    return CPU_JIT_HIT;
}

/* Creates a new file with a unique name starting with `prefix` in the cache
 * directory. mkstemp has no *at form; O_CREAT|O_EXCL on a fresh name gives
 * the same guarantee and keeps every access relative to the directory we
 * checked at create time (a later swap of the path for a symlink cannot
 * redirect us). Returns the fd or -1 with errno set. */
static int cpu_jit_create_temp_at(int dirfd, const char *prefix, char *name,
                                  size_t size)
{
    static atomic_uint_fast64_t counter;
    for (int attempt = 0; attempt < 100; attempt++) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        uint64_t seed[4] = {(uint64_t)ts.tv_sec, (uint64_t)ts.tv_nsec,
                            (uint64_t)getpid(),
                            (uint64_t)atomic_fetch_add(&counter, 1)};
        snprintf(name, size, "%s%016" PRIx64, prefix,
                 XXH3_64bits(seed, sizeof seed));
        int fd =
            openat(dirfd, name,
                   O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
        if (fd >= 0 || errno != EEXIST)
            return fd;
    }
    errno = EEXIST;
    return -1;
}

/* Writes `len` bytes to a new temporary file in the cache and fsyncs it.
 * Returns 0, or -1 with errno set (and nothing left behind). */
static int cpu_jit_write_temp(const cpu_jit *jit, const char *prefix,
                              const void *data, size_t len, char *name,
                              size_t size)
{
    int fd = cpu_jit_create_temp_at(jit->cache_fd, prefix, name, size);
    if (fd < 0)
        return -1;
    int rc = cpu_jit_write_all(fd, data, len);
    if (rc == 0)
        rc = fsync(fd);
    int e = errno;
    if (close(fd) != 0 && rc == 0) {
        rc = -1;
        e = errno;
    }
    if (rc != 0) {
        unlinkat(jit->cache_fd, name, 0);
        errno = e;
    }
    return rc;
}

/* Stores an object in the disk cache. Failures only cost a rebuild later,
 * so they are warnings. Order: both files are written and synced under
 * temporary names; then the object is renamed into place, then the meta.
 * A reader that finds a meta therefore finds a complete object (a new one,
 * or an older one that the hash check rejects); concurrent writers of the
 * same key each rename complete files, so the last writer wins. */
static void cpu_jit_cache_store(const cpu_jit *jit, const cpu_jit_keyinfo *ki,
                                const unsigned char *bytes, size_t len)
{
    char so_name[32], meta_name[32], so_tmp[64], meta_tmp[64], prefix[48];
    char meta[256], eb[128];
    size_t header_len;
    cpu_jit_entry_names(ki, so_name, meta_name, sizeof so_name);
    cpu_jit_meta_format(ki, len, XXH3_128bits(bytes, len), meta, sizeof meta,
                        &header_len);

    const char *step = "write the object";
    snprintf(prefix, sizeof prefix, ".%s.so.tmp-", ki->hex);
    if (cpu_jit_write_temp(jit, prefix, bytes, len, so_tmp, sizeof so_tmp) != 0)
        goto fail;
    step = "write the record";
    snprintf(prefix, sizeof prefix, ".%s.meta.tmp-", ki->hex);
    if (cpu_jit_write_temp(jit, prefix, meta, strlen(meta), meta_tmp,
                           sizeof meta_tmp) != 0) {
        int e = errno;
        unlinkat(jit->cache_fd, so_tmp, 0);
        errno = e;
        goto fail;
    }
    step = "rename the object";
    if (renameat(jit->cache_fd, so_tmp, jit->cache_fd, so_name) != 0) {
        int e = errno;
        unlinkat(jit->cache_fd, so_tmp, 0);
        unlinkat(jit->cache_fd, meta_tmp, 0);
        errno = e;
        goto fail;
    }
    step = "rename the record";
    if (renameat(jit->cache_fd, meta_tmp, jit->cache_fd, meta_name) != 0) {
        int e = errno;
        unlinkat(jit->cache_fd, meta_tmp, 0);
        errno = e;
        goto fail;
    }
    /* Make the renames durable; a crash before this only loses the entry
     * (a meta without its object, or neither), never pairs wrong ones. */
    fsync(jit->cache_fd);
    return;
fail:
    cube_log_write(CUBE_LOG_WARN, "compile",
                   "cannot %s of disk cache entry %s in '%s': %s", step,
                   ki->hex, jit->cache_path,
                   cpu_jit_strerror(errno, eb, sizeof eb));
}

/* ------------------------------------------------------------- building */

/* Compiles in a private temporary directory, loads the result and stores
 * it in the disk cache (when there is one). */
static cube_error *cpu_jit_build(const cpu_jit *jit, const char *source,
                                 const char *flags, const cpu_jit_keyinfo *ki,
                                 cpu_module **out)
{
    if (cube_log_enabled(CUBE_LOG_TRACE))
        cube_log_write(CUBE_LOG_TRACE, "compile",
                       "source of %s (flags '%s'):\n%s", ki->hex,
                       flags ? flags : "", source);
    char *dir = NULL;
    cube_error *err = cpu_jit_make_tmpdir(jit, "cc", &dir);
    if (err)
        return err;
    char *src_path = cpu_jit_join(dir, "kernel.c");
    char *so_path = cpu_jit_join(dir, "kernel.so");
    if (!src_path || !so_path) {
        err = cube_error_new(CUBE_ERR_OUT_OF_MEMORY,
                             "cpu_jit_load: out of memory");
        goto done;
    }

    int fd = open(src_path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    int rc = fd < 0 ? -1 : cpu_jit_write_all(fd, source, strlen(source));
    int e = errno;
    if (fd >= 0 && close(fd) != 0 && rc == 0) {
        rc = -1;
        e = errno;
    }
    if (rc != 0) {
        char eb[128];
        err = cube_error_new(CUBE_ERR_IO, "cpu_jit_load: cannot write '%s': %s",
                             src_path, cpu_jit_strerror(e, eb, sizeof eb));
        goto done;
    }

    err = cpu_jit_compile(jit, flags, ki->hex, src_path, so_path);
    if (err)
        goto done;
    /* The freshly written file is a new inode in a private directory, so it
     * can be loaded directly. */
    err = cpu_jit_dlopen(so_path, out);
    if (err)
        goto done;

    if (jit->cache_fd >= 0) {
        /* Cache the bytes read here: the meta then describes exactly what
         * is written to the cache. */
        unsigned char *bytes = NULL;
        size_t len = 0;
        e = cpu_jit_read_at(AT_FDCWD, so_path, CPU_JIT_MAX_OBJECT, &bytes,
                            &len);
        if (e == 0) {
            cpu_jit_cache_store(jit, ki, bytes, len);
            free(bytes);
        } else {
            char eb[128];
            cube_log_write(CUBE_LOG_WARN, "compile",
                           "not caching %s: cannot read '%s': %s", ki->hex,
                           so_path, cpu_jit_strerror(e, eb, sizeof eb));
        }
    }
done:
    cpu_jit_remove_dir(dir);
    free(src_path);
    free(so_path);
    free(dir);
    return err;
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
    cpu_jit_keyinfo ki;
    cpu_jit_keyinfo_make(jit, source, flags, &ki);

    if (jit->cache_fd >= 0) {
        double t0 = cpu_jit_now_ms();
        unsigned char *bytes = NULL;
        size_t len = 0;
        if (cpu_jit_cache_lookup(jit, &ki, &bytes, &len) == CPU_JIT_HIT) {
            cube_error *err = cpu_jit_open_bytes(jit, bytes, len, out);
            free(bytes);
            if (!err) {
                cube_log_write(CUBE_LOG_DEBUG, "compile",
                               "loaded %s from the disk cache in %.2f ms",
                               ki.hex, cpu_jit_now_ms() - t0);
                if (origin)
                    *origin = CPU_JIT_DISK;
                return NULL;
            }
            /* Verified but unloadable (for example a library it needs is
             * gone): drop it and rebuild. */
            cube_log_write(CUBE_LOG_WARN, "compile",
                           "disk cache entry %s did not load (%s); rebuilding",
                           ki.hex, cube_error_message(err));
            cube_error_free(err);
            cpu_jit_cache_remove(jit, &ki);
        }
    }
    cube_error *err = cpu_jit_build(jit, source, flags, &ki, out);
    if (!err && origin)
        *origin = CPU_JIT_COMPILED;
    return err;
}

/* ------------------------------------------------------------- creation */

/* First line of `cc --version`; "unknown" when it cannot be run (loads
 * will then fail with the reason). */
static char *cpu_jit_probe_compiler(const char *cc)
{
    const char *argv[] = {cc, "--version", NULL};
    char *output = NULL;
    int status = 0;
    cube_error *err = cpu_jit_run(argv, &output, &status);
    if (err) {
        cube_log_write(CUBE_LOG_WARN, "compile",
                       "cannot identify the C compiler: %s",
                       cube_error_message(err));
        cube_error_free(err);
        return strdup("unknown");
    }
    output[strcspn(output, "\n")] = '\0';
    if (!output[0]) {
        free(output);
        return strdup("unknown");
    }
    return output;
}

/* The CPU's identity for the key: -march=native output depends on it. */
static char *cpu_jit_probe_cpu(void)
{
    /* x86 names the first two; arm64 the rest. The first of each is kept
     * (heterogeneous cores may differ; the first core is what we saw). */
    static const char *const fields[] = {"model name", "flags", "Features",
                                         "CPU implementer", "CPU part"};
    enum { NFIELDS = sizeof fields / sizeof fields[0] };
    bool seen[NFIELDS] = {false};
    cpu_jit_buf id = {0};
    cpu_jit_buf_append(&id, "", 0);
    FILE *f = fopen("/proc/cpuinfo", "re");
    if (f) {
        char *line = NULL;
        size_t cap = 0;
        size_t found = 0;
        while (found < NFIELDS && getline(&line, &cap, f) > 0) {
            for (size_t i = 0; i < NFIELDS; i++) {
                size_t n = strlen(fields[i]);
                if (seen[i] || strncmp(line, fields[i], n) != 0 ||
                    (line[n] != ' ' && line[n] != '\t' && line[n] != ':'))
                    continue;
                seen[i] = true;
                found++;
                cpu_jit_buf_append(&id, line, strlen(line));
            }
        }
        free(line);
        fclose(f);
    }
    if (id.failed) {
        free(id.data);
        return NULL;
    }
    return id.data;
}

static char *cpu_jit_join_fixed_flags(void)
{
    cpu_jit_buf b = {0};
    cpu_jit_buf_append(&b, "", 0);
    for (size_t i = 0; i < CPU_JIT_FIXED_COUNT; i++) {
        if (i)
            cpu_jit_buf_append(&b, " ", 1);
        cpu_jit_buf_append(&b, cpu_jit_fixed_flags[i],
                           strlen(cpu_jit_fixed_flags[i]));
    }
    if (b.failed) {
        free(b.data);
        return NULL;
    }
    return b.data;
}

static const char *cpu_jit_env(const char *name)
{
    const char *v = getenv(name);
    return v && *v ? v : NULL;
}

/* The default cache directory, or NULL with *oom false when there is none
 * (no usable environment variable). */
static char *cpu_jit_default_cache_dir(bool *oom)
{
    const char *base;
    const char *tail;
    *oom = false;
    if ((base = cpu_jit_env("CUBERT_CACHE_DIR")) != NULL) {
        tail = "cpu";
    } else if ((base = cpu_jit_env("XDG_CACHE_HOME")) != NULL &&
               base[0] == '/') {
        tail = "cubert/cpu"; /* XDG says relative values are ignored */
    } else if ((base = cpu_jit_env("HOME")) != NULL) {
        tail = ".cache/cubert/cpu";
    } else {
        return NULL;
    }
    char *path = cpu_jit_join(base, tail);
    if (!path)
        *oom = true;
    return path;
}

/* mkdir -p with 0700 for every directory it creates. Returns 0 or errno. */
static int cpu_jit_mkdirs(char *path)
{
    for (char *p = path + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = '\0';
        int rc = mkdir(path, 0700);
        int e = errno;
        *p = '/';
        if (rc != 0 && e != EEXIST)
            return e;
    }
    if (mkdir(path, 0700) != 0 && errno != EEXIST)
        return errno;
    return 0;
}

/* Creates and opens the cache directory, refusing one that another user
 * could tamper with. Returns the directory fd, or -1 after a warning. */
static int cpu_jit_open_cache_dir(char *path)
{
    char eb[128];
    /* A trailing slash would make O_NOFOLLOW follow a final symlink. */
    size_t n = strlen(path);
    while (n > 1 && path[n - 1] == '/')
        path[--n] = '\0';
    int e = cpu_jit_mkdirs(path);
    if (e != 0) {
        cube_log_write(CUBE_LOG_WARN, "compile",
                       "disk cache disabled: cannot create '%s': %s", path,
                       cpu_jit_strerror(e, eb, sizeof eb));
        return -1;
    }
    struct stat st;
    if (lstat(path, &st) == 0 && S_ISLNK(st.st_mode)) {
        cube_log_write(CUBE_LOG_WARN, "compile",
                       "disk cache disabled: '%s' is a symbolic link", path);
        return -1;
    }
    /* O_NOFOLLOW also closes the window between lstat and open. */
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) {
        cube_log_write(CUBE_LOG_WARN, "compile",
                       "disk cache disabled: cannot open '%s': %s", path,
                       cpu_jit_strerror(errno, eb, sizeof eb));
        return -1;
    }
    const char *why = NULL;
    if (fstat(fd, &st) != 0)
        why = "cannot stat it";
    else if (st.st_uid != geteuid())
        why = "it is owned by another user";
    else if (st.st_mode & (S_IWGRP | S_IWOTH))
        why = "it is writable by group or others (chmod 700 fixes that)";
    if (why) {
        cube_log_write(CUBE_LOG_WARN, "compile",
                       "disk cache disabled: refusing '%s': %s", path, why);
        close(fd);
        return -1;
    }
    return fd;
}

void cpu_jit_destroy(cpu_jit *jit)
{
    if (!jit)
        return;
    if (jit->cache_fd >= 0)
        close(jit->cache_fd);
    free(jit->cc);
    free(jit->cflags);
    free(jit->cc_identity);
    free(jit->cpu_identity);
    free(jit->fixed_flags);
    free(jit->tmp_base);
    free(jit->cache_path);
    free(jit);
}

cube_error *cpu_jit_create(const cpu_jit_options *options, cpu_jit **out)
{
    if (!out)
        return cube_error_new(CUBE_ERR_INVALID_ARGUMENT,
                              "cpu_jit_create: out is NULL");
    *out = NULL;
    cpu_jit *jit = calloc(1, sizeof *jit);
    if (!jit)
        return cube_error_new(CUBE_ERR_OUT_OF_MEMORY,
                              "cpu_jit_create: out of memory");
    jit->cache_fd = -1;

    const char *cc = options ? options->cc : NULL;
    if (!cc || !*cc)
        cc = cpu_jit_env("CUBERT_CPU_CC");
    const char *cflags = options ? options->cflags : NULL;
    if (!cflags)
        cflags = getenv("CUBERT_CPU_CFLAGS");
    const char *tmp = cpu_jit_env("TMPDIR");
    jit->cc = strdup(cc ? cc : "cc");
    jit->cflags = strdup(cflags ? cflags : "");
    jit->tmp_base = strdup(tmp && tmp[0] == '/' ? tmp : "/tmp");
    jit->fixed_flags = cpu_jit_join_fixed_flags();
    jit->cpu_identity = cpu_jit_probe_cpu();
    if (!jit->cc || !jit->cflags || !jit->tmp_base || !jit->fixed_flags ||
        !jit->cpu_identity)
        goto oom;
    jit->cc_identity = cpu_jit_probe_compiler(jit->cc);
    if (!jit->cc_identity)
        goto oom;

    const char *dir = options ? options->cache_dir : NULL;
    if (dir) {
        if (*dir && !(jit->cache_path = strdup(dir)))
            goto oom;
    } else {
        bool oom = false;
        jit->cache_path = cpu_jit_default_cache_dir(&oom);
        if (oom)
            goto oom;
        if (!jit->cache_path)
            cube_log_write(CUBE_LOG_INFO, "compile",
                           "disk cache disabled: no CUBERT_CACHE_DIR, "
                           "XDG_CACHE_HOME or HOME");
    }
    if (jit->cache_path) {
        jit->cache_fd = cpu_jit_open_cache_dir(jit->cache_path);
        if (jit->cache_fd < 0) {
            free(jit->cache_path);
            jit->cache_path = NULL;
        }
    }
    cube_log_write(CUBE_LOG_DEBUG, "compile",
                   "cpu jit: compiler '%s' (%s), disk cache %s", jit->cc,
                   jit->cc_identity, jit->cache_path ? jit->cache_path : "off");
    *out = jit;
    return NULL;
oom:
    cpu_jit_destroy(jit);
    return cube_error_new(CUBE_ERR_OUT_OF_MEMORY,
                          "cpu_jit_create: out of memory");
}
