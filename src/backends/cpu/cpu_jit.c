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

#include "backends/common/file_io.h"
#include "backends/cpu/cpu_jit.h"
#include "base/clock.h"
#include "base/path.h"

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
#include "cubert/backend/errors.h"
#include "cubert/log.h"

extern char **environ;

/* Bump when the key material or the fixed flags change: old entries then
 * stop matching and are rebuilt. */
#define CPU_JIT_VERSION_TAG "cubert-cpu-jit-1"

/* The stamp (see the top): the symbol, and the text's first words. */
#define CPU_JIT_STAMP_SYMBOL "cube__jit_stamp"
#define CPU_JIT_STAMP_PREFIX "cubert-cpu-jit-stamp "
#define CPU_JIT_STAMP_BUF 96

/* Objects larger than this are not cached (nor read back). */
#define CPU_JIT_MAX_OBJECT ((size_t)1 << 30)
/* Compiler output kept for the error log; the rest is drained and dropped. */
#define CPU_JIT_MAX_LOG ((size_t)1 << 20)

/* The compiler's arguments, in order: the program, cpu_jit_defaults, the
 * user's cpu_cflags, cpu_jit_required, the per-compile flags (the launch's
 * -DCUBE_CHECKED=...), -o, the source, -lm. Where two options disagree the
 * later one wins, so cpu_cflags can change the defaults (-O1,
 * -march=x86-64-v3, -std=gnu11) but not what a loadable object of the
 * right kernel needs, nor the launch's meaning. */
static const char *const cpu_jit_defaults[] = {
    "-std=c11", "-O3", "-march=native", "-fno-semantic-interposition",
    "-ffp-contract=fast"};
/* -Wl,--no-undefined: a call to a function nothing defines fails the link,
 * a compile error with the linker's message, as NVRTC reports it on CUDA,
 * instead of a failure in dlopen. */
static const char *const cpu_jit_required[] = {"-fPIC", "-shared",
                                               "-Wl,--no-undefined"};
#define CPU_JIT_DEFAULTS_COUNT                                                 \
    (sizeof cpu_jit_defaults / sizeof cpu_jit_defaults[0])
#define CPU_JIT_REQUIRED_COUNT                                                 \
    (sizeof cpu_jit_required / sizeof cpu_jit_required[0])
#define CPU_JIT_FIXED_COUNT (CPU_JIT_DEFAULTS_COUNT + CPU_JIT_REQUIRED_COUNT)

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

struct cpu_module {
    void *handle;
};

/* A growable byte buffer; `failed` records an allocation failure. */
typedef struct cpu_jit_buf {
    char *data;
    size_t len;
    size_t cap;
    bool failed;
} cpu_jit_buf;

/* ---------------------------------------------------------------- helpers */

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
                              file_strerror(errno, eb, sizeof eb));
    /* dup2 onto 1 and 2 must really copy (and so clear close-on-exec):
     * keep the write end off the standard descriptors. */
    if (fds[1] <= STDERR_FILENO) {
        int moved = fcntl(fds[1], F_DUPFD_CLOEXEC, STDERR_FILENO + 1);
        int e = errno;
        close(fds[1]);
        if (moved < 0) {
            close(fds[0]);
            return cube_error_new(CUBE_ERR_IO, "cannot create a pipe: %s",
                                  file_strerror(e, eb, sizeof eb));
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
                              file_strerror(rc, eb, sizeof eb));
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
                              file_strerror(e, eb, sizeof eb));
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

/* The name of signal `sig` for a message ("SIGKILL"), or NULL. */
static const char *cpu_jit_signal_name(int sig)
{
    static const struct {
        int sig;
        const char *name;
    } names[] = {
        {SIGKILL, "SIGKILL"}, {SIGSEGV, "SIGSEGV"}, {SIGABRT, "SIGABRT"},
        {SIGBUS, "SIGBUS"},   {SIGILL, "SIGILL"},   {SIGFPE, "SIGFPE"},
        {SIGTERM, "SIGTERM"}, {SIGINT, "SIGINT"},   {SIGHUP, "SIGHUP"},
        {SIGPIPE, "SIGPIPE"}, {SIGXCPU, "SIGXCPU"}, {SIGXFSZ, "SIGXFSZ"}};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (names[i].sig == sig)
            return names[i].name;
    return NULL;
}

/* Describes a wait status for a message: "exited with status 1", "was
 * killed by signal 9 (SIGKILL)". */
static void cpu_jit_describe_status(int status, char *buf, size_t size)
{
    if (WIFEXITED(status)) {
        snprintf(buf, size, "exited with status %d", WEXITSTATUS(status));
    } else if (WIFSIGNALED(status)) {
        const char *name = cpu_jit_signal_name(WTERMSIG(status));
        snprintf(buf, size, "was killed by signal %d%s%s%s", WTERMSIG(status),
                 name ? " (" : "", name ? name : "", name ? ")" : "");
    } else {
        snprintf(buf, size, "ended with wait status %d", status);
    }
}

/* Whether a failed compile is the machine's rather than the source's: the
 * compiler was killed by a signal (the out-of-memory killer, a crash, a
 * time limit), its driver says one of its own programs was (GCC: "signal
 * terminated program cc1"; Clang: "failed due to signal", "unable to
 * execute command"), or it failed without a word of diagnostics. Another
 * attempt may succeed; the source was never judged. */
static bool cpu_jit_failure_is_machine(int status, const char *output)
{
    if (!WIFEXITED(status))
        return true;
    static const char *const driver_says[] = {"signal terminated program",
                                              "failed due to signal",
                                              "unable to execute command"};
    for (size_t i = 0; i < sizeof driver_says / sizeof driver_says[0]; i++)
        if (strstr(output, driver_says[i]))
            return true;
    return output[strspn(output, " \t\r\n")] == '\0';
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
    for (size_t i = 0; i < CPU_JIT_DEFAULTS_COUNT; i++)
        argv[argc++] = cpu_jit_defaults[i];
    cpu_jit_split_words(cflags_copy, argv, &argc);
    for (size_t i = 0; i < CPU_JIT_REQUIRED_COUNT; i++)
        argv[argc++] = cpu_jit_required[i];
    cpu_jit_split_words(flags_copy, argv, &argc);
    argv[argc++] = "-o";
    argv[argc++] = so_path;
    argv[argc++] = src_path;
    /* Kernels call math functions; the object must not depend on the host
     * program having loaded libm. Libraries go after the sources. */
    argv[argc++] = "-lm";
    argv[argc] = NULL;

    char *output = NULL;
    int status = 0;
    double t0 = cube_clock_ms();
    cube_error *err = cpu_jit_run(argv, &output, &status);
    double ms = cube_clock_ms() - t0;
    free(argv);
    free(flags_copy);
    free(cflags_copy);
    if (err)
        return cube_error_prefix(err, "cpu_jit_load");

    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        char how[64];
        cpu_jit_describe_status(status, how, sizeof how);
        if (cpu_jit_failure_is_machine(status, output))
            err = cube_error_new(CUBE_ERR_IO,
                                 "cpu_jit_load: compiler '%s' %s compiling "
                                 "%s%s (the compiler failed, not the "
                                 "source: another attempt may succeed)",
                                 jit->cc, how, hex,
                                 output[0] ? "" : ", with no diagnostics");
        else
            err = cube_error_new(CUBE_ERR_COMPILE,
                                 "cpu_jit_load: compiler '%s' %s compiling %s",
                                 jit->cc, how, hex);
        if (output[0])
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
    char *dir = NULL;
    cube_error *err = cpu_jit_make_tmpdir(jit, "so", &dir);
    if (err)
        return err;
    char *path = cube_path_join(dir, "module.so");
    if (!path) {
        cpu_jit_remove_dir(dir);
        free(dir);
        return cube_error_new(CUBE_ERR_OUT_OF_MEMORY,
                              "cpu_jit_load: out of memory");
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
    /* The mapping outlives the name. The file goes by its name first, so
     * the directory goes too when it cannot be listed (no descriptor
     * left). */
    unlink(path);
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
    char *dir = NULL;
    cube_error *err = cpu_jit_make_tmpdir(jit, "cc", &dir);
    if (err)
        return err;
    char *src_path = cube_path_join(dir, "kernel.c");
    char *so_path = cube_path_join(dir, "kernel.so");
    char *stamped = cpu_jit_stamped_source(source, key);
    if (!src_path || !so_path || !stamped) {
        err = cube_error_new(CUBE_ERR_OUT_OF_MEMORY,
                             "cpu_jit_load: out of memory");
        goto done;
    }

    err = cpu_jit_write_new(src_path, stamped, "cpu_jit_load");
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
    if (src_path)
        unlink(src_path);
    if (so_path)
        unlink(so_path);
    cpu_jit_remove_dir(dir);
    free(stamped);
    free(src_path);
    free(so_path);
    free(dir);
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
    char *dir = NULL;
    cube_error *err = cpu_jit_make_tmpdir(jit, "check", &dir);
    if (err)
        return err;
    char *path = cube_path_join(dir, file_name);
    const char **args = calloc(argc + 2, sizeof *args);
    if (!path || !args) {
        err = cube_error_new(CUBE_ERR_OUT_OF_MEMORY,
                             "cpu_jit_run_on_source: out of memory");
        goto done;
    }
    err = cpu_jit_write_new(path, source, "cpu_jit_run_on_source");
    if (err)
        goto done;
    memcpy(args, argv, argc * sizeof *args);
    args[argc] = path;
    args[argc + 1] = NULL;
    err = cpu_jit_run(args, output, status);
done:
    if (path)
        unlink(path);
    cpu_jit_remove_dir(dir);
    free(args);
    free(path);
    free(dir);
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

/* ------------------------------------------------------------- creation */

/* First line of `cc --version`; "unknown" with *known false when it
 * cannot be run (loads will then fail with the reason), fails or says
 * nothing. NULL for want of memory. */
static char *cpu_jit_probe_compiler(const char *cc, bool *known)
{
    const char *argv[] = {cc, "--version", NULL};
    char *output = NULL;
    int status = 0;
    *known = false;
    cube_error *err = cpu_jit_run(argv, &output, &status);
    if (err) {
        cube_log_write(CUBE_LOG_WARN, "compile",
                       "cannot identify the C compiler: %s",
                       cube_error_message(err));
        cube_error_free(err);
        return strdup("unknown");
    }
    output[strcspn(output, "\n")] = '\0';
    if (!output[0] || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        free(output);
        return strdup("unknown");
    }
    *known = true;
    return output;
}

/* The CPU's identity for the key: -march=native output depends on it.
 * *known is false when /proc/cpuinfo cannot be read to its end or names
 * none of the fields. NULL for want of memory. */
static char *cpu_jit_probe_cpu(bool *known)
{
    /* x86 names the first two; arm64 the rest. The first of each is kept
     * (heterogeneous cores may differ; the first core is what we saw). */
    static const char *const fields[] = {"model name", "flags", "Features",
                                         "CPU implementer", "CPU part"};
    enum { NFIELDS = sizeof fields / sizeof fields[0] };
    cpu_jit_buf id = {0};
    cpu_jit_buf_append(&id, "", 0);
    *known = false;
    FILE *f = fopen("/proc/cpuinfo", "re");
    if (f) {
        bool seen[NFIELDS] = {false};
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
        /* Every field found, or the whole file read without one missed. */
        *known = found == NFIELDS || (found > 0 && feof(f) && !ferror(f));
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
        const char *f = i < CPU_JIT_DEFAULTS_COUNT
                            ? cpu_jit_defaults[i]
                            : cpu_jit_required[i - CPU_JIT_DEFAULTS_COUNT];
        if (i)
            cpu_jit_buf_append(&b, " ", 1);
        /* The user's flags go between the two groups. */
        if (i == CPU_JIT_DEFAULTS_COUNT)
            cpu_jit_buf_append(&b, "| ", 2);
        cpu_jit_buf_append(&b, f, strlen(f));
    }
    if (b.failed) {
        free(b.data);
        return NULL;
    }
    return b.data;
}

/* TMPDIR is the system's, not a cubert key. */
static const char *cpu_jit_env(const char *name)
{
    const char *v = getenv(name);
    return v && *v ? v : NULL;
}

static const cube_config_word cpu_barriers_words[] = {
    {"auto", CPU_BARRIERS_AUTO, 0},
    {"fibers", CPU_BARRIERS_FIBERS, 0},
    {NULL, 0, 0}};

const cube_config_key cpu_config_keys[] = {
    {.name = "cpu_cc",
     .type = CUBE_CONFIG_TEXT,
     .max_len = CUBE_CONFIG_TEXT_MAX,
     .default_text = "cc",
     .doc = "the C compiler the CPU backend runs: a program name or a path"},
    {.name = "cpu_cxx",
     .type = CUBE_CONFIG_TEXT,
     .max_len = CUBE_CONFIG_TEXT_MAX,
     .default_text = "c++, else g++",
     .doc = "the C++ compiler of the CPU backend's portability check: a "
            "program name or a path"},
    {.name = "cpu_portability_check",
     .type = CUBE_CONFIG_UINT,
     .min = 0,
     .max = 1,
     .default_text = "1",
     .doc = "1: check each newly compiled cube C kernel as CUDA C++ with the "
            "C++ compiler and warn when it would not compile there; 0: off"},
    {.name = "cpu_cflags",
     .type = CUBE_CONFIG_TEXT,
     .max_len = CUBE_CONFIG_TEXT_MAX,
     .default_text = "none",
     .doc = "extra options for every CPU kernel compilation, separated by "
            "blanks"},
    {.name = "cpu_libclang",
     .type = CUBE_CONFIG_TEXT,
     .max_len = CUBE_CONFIG_TEXT_MAX,
     .default_text = "libclang.so.1, else libclang-<N>.so.1 (N 19 to 11)",
     .doc = "the libclang library the CPU backend's barrier pass loads: a "
            "path or a name the dynamic loader finds"},
    {.name = "cpu_barriers",
     .type = CUBE_CONFIG_WORD,
     .words = cpu_barriers_words,
     .default_text = "auto",
     .doc = "auto: kernels with cube_sync() run their units as loops where "
            "the barrier pass can; fibers: always as fibers"},
    {.name = "mpi_library",
     .type = CUBE_CONFIG_TEXT,
     .max_len = CUBE_CONFIG_TEXT_MAX,
     .default_text = "libmpi.so.40, else libmpi.so",
     .doc = "the Open MPI library the CPU backend's communicators between "
            "processes load: a path or a name the dynamic loader finds"},
    {.name = "cpu_devices",
     .type = CUBE_CONFIG_UINT,
     .min = 1,
     .max = 256,
     .default_text = "1",
     .doc = "how many virtual CPU devices (cpu:0 .. cpu:N-1) the CPU backend "
            "offers; the online cores are shared among them"},
    {.name = NULL}};

/* Whether `word` (a -D or -U option, or the word after a lone -D or -U
 * when `after_flag`) names a CUBE_ macro. */
static bool cpu_jit_names_cube_macro(const char *word, bool after_flag)
{
    if (!after_flag) {
        if (word[0] != '-' || (word[1] != 'D' && word[1] != 'U'))
            return false;
        word += 2;
    }
    return strncmp(word, "CUBE_", 5) == 0;
}

/* `cflags` without the options that define or undefine a CUBE_ macro
 * (-DCUBE_X, -DCUBE_X=v, -UCUBE_X, and -D/-U followed by such a word):
 * those names are cubert's, and the launch sets the ones that carry its
 * meaning (CUBE_CHECKED). Each dropped option is reported, once, naming
 * `where`. Words are rejoined with one space. NULL for want of memory. */
static char *cpu_jit_filter_cflags(const char *cflags, const char *where)
{
    char *copy = strdup(cflags);
    cpu_jit_buf kept = {0}, dropped = {0};
    cpu_jit_buf_append(&kept, "", 0);
    cpu_jit_buf_append(&dropped, "", 0);
    if (!copy) {
        free(kept.data);
        free(dropped.data);
        return NULL;
    }
    const char *pending = NULL; /* a lone -D or -U */
    char *save = NULL;
    for (char *w = strtok_r(copy, " \t\n\r\v\f", &save); w;
         w = strtok_r(NULL, " \t\n\r\v\f", &save)) {
        bool lone = strcmp(w, "-D") == 0 || strcmp(w, "-U") == 0;
        cpu_jit_buf *to = &kept;
        if (pending) {
            if (cpu_jit_names_cube_macro(w, true))
                to = &dropped;
            if (to->len)
                cpu_jit_buf_append(to, " ", 1);
            cpu_jit_buf_append(to, pending, strlen(pending));
            cpu_jit_buf_append(to, " ", 1);
            cpu_jit_buf_append(to, w, strlen(w));
            pending = NULL;
            continue;
        }
        if (lone) {
            pending = w;
            continue;
        }
        if (cpu_jit_names_cube_macro(w, false))
            to = &dropped;
        if (to->len)
            cpu_jit_buf_append(to, " ", 1);
        cpu_jit_buf_append(to, w, strlen(w));
    }
    if (pending) { /* a lone -D at the end: the compiler will say */
        if (kept.len)
            cpu_jit_buf_append(&kept, " ", 1);
        cpu_jit_buf_append(&kept, pending, strlen(pending));
    }
    if (dropped.len && !dropped.failed)
        cube_log_write(CUBE_LOG_WARN, "config",
                       "%s: ignoring '%s': the CUBE_ macros (CUBE_CHECKED "
                       "and the others) are set by cubert for each compile",
                       where, dropped.data);
    free(copy);
    free(dropped.data);
    if (kept.failed) {
        free(kept.data);
        return NULL;
    }
    return kept.data;
}

void cpu_jit_destroy(cpu_jit *jit)
{
    if (!jit)
        return;
    disk_cache_close(jit->cache);
    free(jit->cc);
    free(jit->cflags);
    free(jit->cc_identity);
    free(jit->cpu_identity);
    free(jit->fixed_flags);
    free(jit->tmp_base);
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

    const char *cc = options ? options->cc : NULL;
    if (!cc || !*cc)
        cc = cube_config_text("cpu_cc");
    const char *cflags = options ? options->cflags : NULL;
    char where[CUBE_CONFIG_TEXT_MAX + 64];
    snprintf(where, sizeof where, "cpu_jit_options.cflags");
    if (!cflags) {
        cube_config_value v;
        if (cube_config_lookup("cpu_cflags", &v) == 0 && v.text) {
            cflags = v.text;
            cube_config_where(&v, where, sizeof where);
        }
    }
    const char *tmp = cpu_jit_env("TMPDIR");
    jit->cc = strdup(cc ? cc : "cc");
    jit->cflags = cpu_jit_filter_cflags(cflags ? cflags : "", where);
    jit->tmp_base = strdup(tmp && tmp[0] == '/' ? tmp : "/tmp");
    jit->fixed_flags = cpu_jit_join_fixed_flags();
    bool cpu_known = false, cc_known = false;
    jit->cpu_identity = cpu_jit_probe_cpu(&cpu_known);
    if (!jit->cc || !jit->cflags || !jit->tmp_base || !jit->fixed_flags ||
        !jit->cpu_identity)
        goto oom;
    jit->cc_identity = cpu_jit_probe_compiler(jit->cc, &cc_known);
    if (!jit->cc_identity)
        goto oom;

    /* Same meaning as disk_cache_open's dir: NULL for the default, ""
     * for none. The key names the CPU and the compiler: without either
     * an entry could be shared by another CPU or another compiler, so
     * there is no disk cache (kernels are compiled and kept in memory). */
    const char *cache_dir = options ? options->cache_dir : NULL;
    if ((!cpu_known || !cc_known) && !(cache_dir && !cache_dir[0])) {
        cube_log_write(CUBE_LOG_WARN, "compile",
                       "cpu jit: the disk cache is off: cannot identify %s%s%s "
                       "for its key; kernels are compiled and kept in memory",
                       cpu_known ? "" : "the CPU (/proc/cpuinfo)",
                       !cpu_known && !cc_known ? " nor " : "",
                       cc_known ? "" : "the C compiler (its --version)");
        cache_dir = "";
    }
    cube_error *err = disk_cache_open(cache_dir, "cpu", ".so",
                                      CPU_JIT_VERSION_TAG, &jit->cache);
    if (err) {
        cpu_jit_destroy(jit);
        return cube_error_prefix(err, "cpu_jit_create");
    }
    cube_log_write(
        CUBE_LOG_DEBUG, "compile", "cpu jit: compiler '%s' (%s), disk cache %s",
        jit->cc, jit->cc_identity,
        disk_cache_path(jit->cache) ? disk_cache_path(jit->cache) : "off");
    *out = jit;
    return NULL;
oom:
    cpu_jit_destroy(jit);
    return cube_error_new(CUBE_ERR_OUT_OF_MEMORY,
                          "cpu_jit_create: out of memory");
}
