/* Running the compiler for the CPU JIT: a child process (no shell) with
 * its output captured, what its exit status means, and the argument list
 * of a compile. */
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

#include "backends/common/file_io.h"
#include "backends/cpu/cpu_jit_internal.h"
#include "base/clock.h"
#include "base/error.h"
#include "cubert/log.h"

extern char **environ;

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

/* ---------------------------------------------------- running the compiler */

cube_error *cpu_jit_run(const char *const *argv, char **output, int *status)
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
    text_buf_append(&out, "", 0);
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
            text_buf_append(&out, chunk, (size_t)n);
        else
            clipped = true;
    }
    close(fds[0]);
    if (clipped)
        text_buf_append(&out, "\n[output truncated]\n", 20);

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

cube_error *cpu_jit_compile(const cpu_jit *jit, const char *flags,
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

char *cpu_jit_join_fixed_flags(void)
{
    cpu_jit_buf b = {0};
    text_buf_append(&b, "", 0);
    for (size_t i = 0; i < CPU_JIT_FIXED_COUNT; i++) {
        const char *f = i < CPU_JIT_DEFAULTS_COUNT
                            ? cpu_jit_defaults[i]
                            : cpu_jit_required[i - CPU_JIT_DEFAULTS_COUNT];
        if (i)
            text_buf_append(&b, " ", 1);
        /* The user's flags go between the two groups. */
        if (i == CPU_JIT_DEFAULTS_COUNT)
            text_buf_append(&b, "| ", 2);
        text_buf_append(&b, f, strlen(f));
    }
    if (b.failed) {
        free(b.data);
        return NULL;
    }
    return b.data;
}
