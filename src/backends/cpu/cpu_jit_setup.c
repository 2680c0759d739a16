/* Creating the CPU JIT: the backend's configuration keys, the probes of
 * the compiler and the CPU that name them in the key, and the user's
 * cflags with cubert's own macros filtered out. */
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

#include "backends/common/library.h"
#include "backends/cpu/cpu_jit_internal.h"
#include "base/error.h"
#include "cubert/log.h"

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
    text_buf_append(&id, "", 0);
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
                text_buf_append(&id, line, strlen(line));
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
    LIBRARY_CONFIG_KEY(
        "cpu_libclang", "libclang.so.1, else libclang-<N>.so.1 (N 19 to 11)",
        "the libclang library the CPU backend's barrier pass loads"),
    {.name = "cpu_barriers",
     .type = CUBE_CONFIG_WORD,
     .words = cpu_barriers_words,
     .default_text = "auto",
     .doc = "auto: kernels with cube_sync() run their units as loops where "
            "the barrier pass can; fibers: always as fibers"},
    LIBRARY_CONFIG_KEY("mpi_library", "libmpi.so.40, else libmpi.so",
                       "the Open MPI library the CPU backend's communicators "
                       "between processes load"),
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
    text_buf_append(&kept, "", 0);
    text_buf_append(&dropped, "", 0);
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
                text_buf_append(to, " ", 1);
            text_buf_append(to, pending, strlen(pending));
            text_buf_append(to, " ", 1);
            text_buf_append(to, w, strlen(w));
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
            text_buf_append(to, " ", 1);
        text_buf_append(to, w, strlen(w));
    }
    if (pending) { /* a lone -D at the end: the compiler will say */
        if (kept.len)
            text_buf_append(&kept, " ", 1);
        text_buf_append(&kept, pending, strlen(pending));
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

/* The user's cflags: the options', else the key cpu_cflags (NULL when
 * neither is set), with where they came from in where[0, size). */
static const char *cpu_jit_user_cflags(const cpu_jit_options *options,
                                       char *where, size_t size)
{
    const char *cflags = options ? options->cflags : NULL;
    snprintf(where, size, "cpu_jit_options.cflags");
    if (!cflags) {
        cube_config_value v;
        if (cube_config_lookup("cpu_cflags", &v) == 0 && v.text) {
            cflags = v.text;
            cube_config_where(&v, where, size);
        }
    }
    return cflags;
}

/* The disk cache's directory, with disk_cache_open's meaning (NULL for the
 * default, "" for none). The key names the CPU and the compiler: without
 * either an entry could be shared by another CPU or another compiler, so
 * there is no disk cache (kernels are compiled and kept in memory). */
static const char *cpu_jit_cache_dir(const cpu_jit_options *options,
                                     bool cpu_known, bool cc_known)
{
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
    return cache_dir;
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
    char where[CUBE_CONFIG_TEXT_MAX + 64];
    const char *cflags = cpu_jit_user_cflags(options, where, sizeof where);
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

    cube_error *err =
        disk_cache_open(cpu_jit_cache_dir(options, cpu_known, cc_known), "cpu",
                        ".so", CPU_JIT_VERSION_TAG, &jit->cache);
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
