/* The CPU backend's portability check (cpu_portability.h): the C++
 * compiler, syntax-only, over the text NVRTC would compile, with host
 * stand-ins for NVRTC's built-ins in front.
 *
 * The checked kernel ids are a small list under a mutex: a
 * server compiles each kernel once per mode, and the check, which does not
 * depend on the mode in any way NVRTC cares about, runs for the first. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include "backends/cpu/cpu_portability.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>

#include "base/grow.h"
#include "backends/common/kernel_source.h"
#include "base/clock.h"
#include "base/error.h"
#include "cubert/backend/config.h"
#include "cubert/backend/errors.h"
#include "cubert/log.h"

extern const char cube_prelude_portable[];
extern const char cube_prelude_cuda_portable[];

/* The C++ compilers tried, in order, when the key cpu_cxx is unset. */
static const char *const cpu_portability_default_cxx[] = {"c++", "g++"};
#define CPU_PORTABILITY_NDEFAULT                                               \
    (sizeof cpu_portability_default_cxx / sizeof cpu_portability_default_cxx[0])

/* At most this much of the compiler's first error line goes in the
 * warning. */
#define CPU_PORTABILITY_LINE_MAX 400

struct cpu_portability {
    pthread_mutex_t lock;
    uint64_t *checked; /* kernel ids checked (or being checked) */
    size_t count, cap;
    bool unavailable; /* no C++ compiler could be run: no more checks */
};

cpu_portability *cpu_portability_create(void)
{
    cpu_portability *p = calloc(1, sizeof *p);
    if (!p)
        return NULL;
    if (pthread_mutex_init(&p->lock, NULL) != 0) {
        free(p);
        return NULL;
    }
    return p;
}

void cpu_portability_destroy(cpu_portability *p)
{
    if (!p)
        return;
    pthread_mutex_destroy(&p->lock);
    free(p->checked);
    free(p);
}

char *cpu_portability_source(const char *name, const char *user)
{
    if (!name || !user)
        return NULL;
    /* The host stand-ins, then the CUDA prelude the kernel is checked
     * against, then the common prelude. */
    const char *preludes[] = {cube_prelude_portable,
                              cube_prelude_cuda_portable};
    return kernel_source_cube_c(preludes, 2, name, user);
}

/* Claims `id` for checking: false when it was checked already, the
 * checker is off, or the list cannot grow. */
static bool cpu_portability_claim(cpu_portability *p, uint64_t id)
{
    bool claim = true;
    pthread_mutex_lock(&p->lock);
    if (p->unavailable)
        claim = false;
    for (size_t i = 0; claim && i < p->count; i++)
        if (p->checked[i] == id)
            claim = false;
    if (claim) {
        uint64_t *room =
            cube_grow(p->checked, p->count, &p->cap, sizeof *room, 16);
        if (room)
            p->checked = room;
        else
            claim = false;
    }
    if (claim)
        p->checked[p->count++] = id;
    pthread_mutex_unlock(&p->lock);
    return claim;
}

/* The first line of `output` that reports an error (GCC and Clang write
 * "file:line:col: error: ..." or "fatal error:"), else its first
 * non-blank line, copied into buf. */
static void cpu_portability_first_error(const char *output, char *buf,
                                        size_t size)
{
    const char *pick = NULL;
    for (const char *line = output; *line && !pick;) {
        size_t n = strcspn(line, "\n");
        const char *e = strstr(line, "error");
        if (e && (size_t)(e - line) < n)
            pick = line;
        line += n + (line[n] == '\n');
    }
    if (!pick)
        pick = output + strspn(output, " \t\r\n");
    size_t n = strcspn(pick, "\r\n");
    if (n >= size)
        n = size - 1;
    memcpy(buf, pick, n);
    buf[n] = '\0';
}

/* Runs `cxx` over `text`: as cpu_jit_run_on_source. */
static cube_error *cpu_portability_run(const cpu_jit *jit, const char *cxx,
                                       const char *flags, const char *text,
                                       char **output, int *status)
{
    /* -nostdinc: NVRTC has no system headers; -w: only errors matter. */
    static const char *const fixed[] = {
        "-x", "c++", "-std=c++17", "-fsyntax-only", "-nostdinc", "-w"};
    enum { NFIXED = sizeof fixed / sizeof fixed[0], NFLAGS = 8 };
    const char *argv[1 + NFIXED + NFLAGS + 1];
    size_t argc = 0;
    argv[argc++] = cxx;
    for (size_t i = 0; i < NFIXED; i++)
        argv[argc++] = fixed[i];
    char *copy = strdup(flags ? flags : "");
    if (!copy)
        return cube_error_new(CUBE_ERR_OUT_OF_MEMORY,
                              "portability check: out of memory");
    char *save = NULL;
    for (char *w = strtok_r(copy, " \t", &save);
         w && argc < 1 + NFIXED + NFLAGS; w = strtok_r(NULL, " \t", &save))
        argv[argc++] = w;
    argv[argc] = NULL;
    cube_error *err =
        cpu_jit_run_on_source(jit, argv, text, "check.cc", output, status);
    free(copy);
    return err;
}

void cpu_portability_check(cpu_portability *p, const cpu_jit *jit,
                           uint64_t kernel_id, const char *name,
                           const char *user, const char *flags)
{
    if (!p || !jit || !name || !user)
        return;
    cube_config_value v;
    if (cube_config_lookup("cpu_portability_check", &v) == 0 &&
        v.origin != CUBE_CONFIG_UNSET && v.number == 0)
        return;
    if (!cpu_portability_claim(p, kernel_id))
        return;
    const char *named = NULL;
    if (cube_config_lookup("cpu_cxx", &v) == 0 &&
        v.origin != CUBE_CONFIG_UNSET && v.text && v.text[0])
        named = v.text;
    char *text = cpu_portability_source(name, user);
    if (!text) {
        cube_log_write(CUBE_LOG_INFO, "compile",
                       "kernel '%s': portability check skipped: out of memory",
                       name);
        return;
    }
    double t0 = cube_clock_ms();
    char *output = NULL;
    int status = 0;
    const char *cxx = NULL;
    cube_error *err = NULL;
    for (size_t i = 0; i < (named ? 1 : CPU_PORTABILITY_NDEFAULT); i++) {
        cube_error_ignore(err, "the next C++ compiler is tried");
        cxx = named ? named : cpu_portability_default_cxx[i];
        err = cpu_portability_run(jit, cxx, flags, text, &output, &status);
        /* Another compiler only when this one could not be run. */
        if (!err || cube_error_code(err) != CUBE_ERR_IO)
            break;
    }
    free(text);
    double ms = cube_clock_ms() - t0;
    if (err && cube_error_code(err) == CUBE_ERR_IO) {
        /* No C++ compiler: say so once, and check nothing more here. */
        pthread_mutex_lock(&p->lock);
        p->unavailable = true;
        pthread_mutex_unlock(&p->lock);
        cube_log_write(CUBE_LOG_INFO, "compile",
                       "the portability check is off on this device: no C++ "
                       "compiler (%s; the key cpu_cxx names one)",
                       cube_error_message(err));
        cube_error_free(err);
        return;
    }
    if (err) {
        cube_log_write(CUBE_LOG_INFO, "compile",
                       "kernel '%s': portability check skipped: %s", name,
                       cube_error_message(err));
        cube_error_free(err);
        return;
    }
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
        cube_log_write(CUBE_LOG_DEBUG, "compile",
                       "kernel '%s' passed the portability check (%s, %.1f ms)",
                       name, cxx, ms);
    } else if (WIFEXITED(status) && strstr(output, "error")) {
        char line[CPU_PORTABILITY_LINE_MAX];
        cpu_portability_first_error(output, line, sizeof line);
        cube_log_write(CUBE_LOG_WARN, "compile",
                       "kernel '%s' would not compile for CUDA (checked as "
                       "CUDA C++ with %s): %s; it runs on the CPU as it is "
                       "(cpu_portability_check=0 turns this check off)",
                       name, cxx, line);
        cube_log_write(CUBE_LOG_DEBUG, "compile",
                       "portability check of kernel '%s':\n%s", name, output);
    } else {
        /* Killed, or failed without a word: the source was not judged. */
        cube_log_write(CUBE_LOG_INFO, "compile",
                       "kernel '%s': portability check inconclusive: %s "
                       "ended with wait status %d",
                       name, cxx, status);
    }
    free(output);
}
