/* The CPU backend's portability check (src/backends/cpu/cpu_portability.c):
 * a kernel that would not compile for CUDA warns once, a clean one does
 * not, the key turns it off, a missing C++ compiler is an info line, and a
 * kernel loaded from the disk cache is not checked again. And the preludes
 * agree: the CPU prelude offers kernels the CUDA prelude's macros and
 * functions, plus only the documented CPU-only atomics, and the stand-ins
 * the check compiles the CUDA prelude against declare the math
 * docs/kernels.md promises. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cubert/cubert.h>

#include "backends/cpu/cpu_portability.h"
#include "test_files.h"
#include "test_text.h"

#define OK(call)                                                               \
    do {                                                                       \
        cube_error *e_ = (call);                                               \
        if (e_)                                                                \
            fail_msg("%s: %s", #call, cube_error_message(e_));                 \
    } while (0)

extern const char cube_prelude_cpu[];
extern const char cube_prelude_cuda_portable[];
extern const char cube_prelude_portable[];

/* An implicit conversion from void *: C accepts it, C++ does not. */
static const char void_src[] = "CUBE_KERNEL(port_void, CUBE_INOUT(float, x))\n"
                               "{\n"
                               "    void *v = x;\n"
                               "    float *f = v;\n"
                               "    uint32_t i = ABSOLUTE_POS_X;\n"
                               "    if (i < CUBE_LEN(x))\n"
                               "        f[i] = 2.0f * f[i];\n"
                               "}\n";

/* The same, portable. */
static const char clean_src[] =
    "CUBE_KERNEL(port_clean, CUBE_INOUT(float, x))\n"
    "{\n"
    "    uint32_t i = ABSOLUTE_POS_X;\n"
    "    if (i < CUBE_LEN(x))\n"
    "        CUBE_AT(x, i) = 2.0f * sqrtf(CUBE_AT(x, i) * CUBE_AT(x, i));\n"
    "}\n";

/* A CPU-only atomic (docs/kernels.md, "Atomics"); x doubled all the
 * same. */
static const char atomic_src[] =
    "CUBE_KERNEL(port_atomic, CUBE_INOUT(float, x))\n"
    "{\n"
    "    int64_t seen = 0;\n"
    "    cube_atomic_max_i64(&seen, 1);\n"
    "    uint32_t i = ABSOLUTE_POS_X;\n"
    "    if (i < CUBE_LEN(x) && seen == 1)\n"
    "        CUBE_AT(x, i) = 2.0f * CUBE_AT(x, i);\n"
    "}\n";

/* --------------------------------------------------------------- the log */

static char warn_lines[16384];  /* warnings about portability */
static char info_lines[16384];  /* info lines about the check */
static char debug_lines[16384]; /* "passed the portability check" */

static void append(char *buf, size_t size, const char *message)
{
    size_t n = strlen(buf);
    snprintf(buf + n, size - n, "%s\n", message);
}

static void sink(void *user, cube_log_level level, const char *category,
                 const char *message)
{
    (void)user;
    if (strcmp(category, "compile") != 0)
        return;
    if (level == CUBE_LOG_WARN && strstr(message, "would not compile"))
        append(warn_lines, sizeof warn_lines, message);
    else if (level == CUBE_LOG_INFO && strstr(message, "portability check"))
        append(info_lines, sizeof info_lines, message);
    else if (level == CUBE_LOG_DEBUG && strstr(message, "portability check"))
        append(debug_lines, sizeof debug_lines, message);
}

static size_t count_of(const char *text, const char *needle)
{
    size_t n = 0;
    for (const char *p = strstr(text, needle); p; p = strstr(p + 1, needle))
        n++;
    return n;
}

static int setup(void **state)
{
    (void)state;
    warn_lines[0] = info_lines[0] = debug_lines[0] = '\0';
    unsetenv("CUBERT_CPU_PORTABILITY_CHECK");
    unsetenv("CUBERT_CPU_CXX");
    cube_log_set_level(CUBE_LOG_DEBUG);
    cube_log_set_sink(sink, NULL);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    cube_log_set_sink(NULL, NULL);
    cube_log_set_level(CUBE_LOG_WARN);
    unsetenv("CUBERT_CPU_PORTABILITY_CHECK");
    unsetenv("CUBERT_CPU_CXX");
    return 0;
}

/* Opens a CPU client with the disk cache at `cache` ("" for none),
 * launches `src` in each of `modes` and checks the result: x doubled. */
static void run(const char *name, const char *src, const char *cache,
                const uint32_t *modes, size_t nmodes)
{
    cube_client_options o;
    memset(&o, 0, sizeof o);
    o.struct_size = sizeof o;
    o.cache_dir = cache;
    o.cpu_threads = 1;
    cube_client *c;
    OK(cube_client_open("cpu", &o, &c));
    cube_kernel_desc d = {name, src, {64, 1, 1}};
    cube_kernel *k;
    OK(cube_kernel_create(&d, &k));
    for (size_t m = 0; m < nmodes; m++) {
        float x[128];
        for (int i = 0; i < 128; i++)
            x[i] = (float)i;
        cube_handle h;
        OK(cube_create(c, x, sizeof x, &h));
        cube_arg args[] = {cube_arg_buffer(h)};
        OK(cube_launch(c, k, cube_count_static(2, 1, 1), args, 1,
                       CUBE_LAUNCH_EXECUTE | modes[m]));
        float y[128];
        cube_copy_desc cd = cube_copy_desc_contiguous(h, sizeof y, 4);
        void *dst[] = {y};
        uint64_t size[] = {sizeof y};
        OK(cube_read(c, &cd, dst, size, 1));
        for (int i = 0; i < 128; i++)
            assert_true(y[i] == 2.0f * (float)i);
        OK(cube_handle_release(c, h));
    }
    cube_kernel_release(k);
    cube_client_close(c);
}

static const uint32_t three_modes[] = {0, CUBE_LAUNCH_CHECKED,
                                       CUBE_LAUNCH_VALIDATE};

/* ------------------------------------------------------------- the check */

static void void_conversion_warns_once(void **state)
{
    (void)state;
    run("port_void", void_src, "", three_modes, 3);
    assert_int_equal(count_of(warn_lines, "would not compile"), 1);
    assert_non_null(strstr(warn_lines, "kernel 'port_void'"));
    /* The compiler's first error, pointing into the kernel's source. */
    assert_non_null(strstr(warn_lines, "port_void.cube.c:4"));
    assert_non_null(strstr(warn_lines, "error"));
}

static void cpu_only_atomic_warns(void **state)
{
    (void)state;
    run("port_atomic", atomic_src, "", three_modes, 1);
    assert_int_equal(count_of(warn_lines, "would not compile"), 1);
    assert_non_null(strstr(warn_lines, "cube_atomic_max_i64"));
}

/* What the check says is what NVRTC does: on a machine with a CUDA
 * device, the kernels it warns about fail to compile there and the clean
 * one compiles. Skipped without one. */
static void cuda_agrees(void **state)
{
    (void)state;
    cube_client *c = NULL;
    cube_error *err = cube_client_open("cuda", NULL, &c);
    if (err) {
        print_message("skipped: no CUDA device (%s)\n",
                      cube_error_message(err));
        cube_error_free(err);
        skip();
    }
    static const struct {
        const char *name, *src;
        int compiles;
    } cases[] = {{"port_void", void_src, 0},
                 {"port_atomic", atomic_src, 0},
                 {"port_clean", clean_src, 1}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        cube_kernel_desc d = {cases[i].name, cases[i].src, {64, 1, 1}};
        cube_kernel *k;
        OK(cube_kernel_create(&d, &k));
        cube_handle h;
        OK(cube_empty(c, 512, &h));
        cube_arg args[] = {cube_arg_buffer(h)};
        err = cube_launch(c, k, cube_count_static(2, 1, 1), args, 1,
                          CUBE_LAUNCH_SKIP);
        if (cases[i].compiles) {
            OK(err);
        } else {
            if (!err)
                fail_msg("kernel '%s' compiled for CUDA", cases[i].name);
            assert_int_equal(cube_error_code(err), CUBE_ERR_COMPILE);
            cube_error_free(err);
        }
        cube_error_free(cube_handle_release(c, h));
        cube_kernel_release(k);
    }
    cube_client_close(c);
}

static void clean_kernel_is_quiet(void **state)
{
    (void)state;
    run("port_clean", clean_src, "", three_modes, 3);
    assert_string_equal(warn_lines, "");
    assert_int_equal(count_of(debug_lines, "passed the portability check"), 1);
}

static void key_turns_it_off(void **state)
{
    (void)state;
    setenv("CUBERT_CPU_PORTABILITY_CHECK", "0", 1);
    run("port_void", void_src, "", three_modes, 1);
    assert_string_equal(warn_lines, "");
    assert_string_equal(debug_lines, "");
    assert_string_equal(info_lines, "");
}

static void no_cxx_is_an_info_line(void **state)
{
    (void)state;
    setenv("CUBERT_CPU_CXX", "/nonexistent/cubert-test-c++", 1);
    run("port_void", void_src, "", three_modes, 3);
    assert_string_equal(warn_lines, "");
    assert_int_equal(count_of(info_lines, "portability check is off"), 1);
    assert_non_null(strstr(info_lines, "/nonexistent/cubert-test-c++"));
}

static void disk_hit_is_not_checked(void **state)
{
    (void)state;
    char *dir = make_tmpdir_named("/tmp/cubert-port-XXXXXX");
    run("port_void", void_src, dir, three_modes, 1);
    assert_int_equal(count_of(warn_lines, "would not compile"), 1);
    warn_lines[0] = debug_lines[0] = info_lines[0] = '\0';
    /* A new client: the kernel comes from the disk cache. */
    run("port_void", void_src, dir, three_modes, 1);
    assert_string_equal(warn_lines, "");
    assert_string_equal(debug_lines, "");
    run("port_clean", clean_src, dir, three_modes, 1);
    assert_int_equal(count_of(debug_lines, "passed the portability check"), 1);
    debug_lines[0] = '\0';
    run("port_clean", clean_src, dir, three_modes, 1);
    assert_string_equal(debug_lines, "");
    rm_tree(dir);
}

/* ---------------------------------------------------- the preludes agree */

/* A set of names, as one string "\nname\nname\n...". */
typedef struct name_set {
    char text[16384];
} name_set;

static int set_has(const name_set *s, const char *name)
{
    char key[160];
    snprintf(key, sizeof key, "\n%s\n", name);
    return strstr(s->text, key) != NULL;
}

static void set_add(name_set *s, const char *name, size_t n)
{
    char buf[128];
    assert_true(n < sizeof buf);
    memcpy(buf, name, n);
    buf[n] = '\0';
    if (!s->text[0])
        snprintf(s->text, sizeof s->text, "\n");
    if (set_has(s, buf))
        return;
    size_t len = strlen(s->text);
    snprintf(s->text + len, sizeof s->text - len, "%s\n", buf);
}

/* Every name of `a` that `b` lacks, other than those of `except`, is
 * reported; returns how many. */
static int missing_from(const name_set *a, const char *a_name,
                        const name_set *b, const char *b_name,
                        const name_set *except)
{
    int missing = 0;
    for (const char *p = a->text + 1; *p;) {
        size_t n = strcspn(p, "\n");
        char name[128];
        snprintf(name, sizeof name, "%.*s", (int)n, p);
        if (!set_has(b, name) && !(except && set_has(except, name))) {
            print_error("%s has '%s', %s has not\n", a_name, name, b_name);
            missing++;
        }
        p += n + 1;
    }
    return missing;
}

static int ident_char(char c)
{
    return isalnum((unsigned char)c) || c == '_';
}

/* Internal to the preludes: cube__ and CUBE__ names and the
 * implementation's (leading underscore). */
static int is_internal(const char *name)
{
    return name[0] == '_' || strncmp(name, "cube__", 6) == 0 ||
           strncmp(name, "CUBE__", 6) == 0;
}

/* The public names a prelude gives kernels: its #define'd macros, the
 * functions it defines (cube_...( outside macros), and the functions its
 * generator macros make: a body naming cube_x_##suffix, instantiated as
 * GEN(sfx, ...), makes cube_x_sfx. */
static void public_names(const char *text, name_set *out)
{
    memset(out, 0, sizeof *out);
    const char *line = text;
    while (*line) {
        size_t n = strcspn(line, "\n");
        const char *p = line + strspn(line, " \t");
        if (strncmp(p, "#define", 7) == 0) {
            p += 7;
            p += strspn(p, " \t");
            size_t m = 0;
            while (ident_char(p[m]))
                m++;
            char macro[128];
            snprintf(macro, sizeof macro, "%.*s", (int)m, p);
            if (!is_internal(macro))
                set_add(out, p, m);
            /* A generator: collect its cube_x_##suffix prefixes, then
             * find its instantiations. */
            const char *end = line;
            for (;;) {
                size_t k = strcspn(end, "\n");
                int more = k > 0 && end[k - 1] == '\\';
                const char *q = end;
                while ((q = strstr(q, "cube_")) && q < end + k) {
                    const char *hash = strstr(q, "##suffix");
                    size_t plen = 0;
                    while (ident_char(q[plen]))
                        plen++;
                    if (hash == q + plen && (q == text || !ident_char(q[-1]))) {
                        char inst[160];
                        snprintf(inst, sizeof inst, "\n%s(", macro);
                        for (const char *u = strstr(text, inst); u;
                             u = strstr(u + 1, inst)) {
                            const char *s = u + strlen(inst);
                            size_t sl = strcspn(s, ",)");
                            char name[128];
                            snprintf(name, sizeof name, "%.*s%.*s", (int)plen,
                                     q, (int)sl, s);
                            set_add(out, name, strlen(name));
                        }
                    }
                    q += plen ? plen : 1;
                }
                end += k + (end[k] == '\n');
                if (!more || !*end)
                    break;
            }
            line = end;
            continue;
        }
        /* A function defined outside any macro: cube_x( at a declaration
         * (a type before it on the line). */
        for (const char *q = line; (q = strstr(q, "cube_")) && q < line + n;) {
            size_t m = 0;
            while (ident_char(q[m]))
                m++;
            int starts = q == line || !ident_char(q[-1]);
            if (starts && q[m] == '(' && q > line && q[-1] == ' ') {
                char name[128];
                snprintf(name, sizeof name, "%.*s", (int)m, q);
                if (!is_internal(name))
                    set_add(out, q, m);
            }
            q += m ? m : 1;
        }
        line += n + (line[n] == '\n');
    }
}

/* The CPU-only names docs/kernels.md lists ("Only on the CPU backend"). */
static const char *const cpu_only[] = {
    "cube_atomic_sub_i64", "cube_atomic_exchange_i64", "cube_atomic_cas_i64",
    "cube_atomic_max_i64", "cube_atomic_min_i64"};

static void preludes_offer_the_same_names(void **state)
{
    (void)state;
    static name_set cpu, cuda, except;
    public_names(cube_prelude_cpu, &cpu);
    public_names(cube_prelude_cuda_portable, &cuda);
    memset(&except, 0, sizeof except);
    char *doc = read_text(CUBE_SOURCE_DIR "/docs/kernels.md");
    const char *only = strstr(doc, "Only on the CPU backend");
    assert_non_null(only);
    for (size_t i = 0; i < sizeof cpu_only / sizeof cpu_only[0]; i++) {
        char quoted[96];
        snprintf(quoted, sizeof quoted, "`%s`", cpu_only[i]);
        const char *at = strstr(only, quoted);
        /* Listed in that paragraph, not merely somewhere. */
        assert_true(at && at < only + 400);
        set_add(&except, cpu_only[i], strlen(cpu_only[i]));
    }
    free(doc);
    /* The extraction found what it must. */
    assert_true(set_has(&cuda, "CUBE_DEVICE") && set_has(&cuda, "cube_sync") &&
                set_has(&cuda, "cube_atomic_cas_u64") &&
                set_has(&cuda, "cube_atomic_add_i64"));
    int bad =
        missing_from(&cpu, "prelude_cpu.h", &cuda, "prelude_cuda.h", &except) +
        missing_from(&cuda, "prelude_cuda.h", &cpu, "prelude_cpu.h", NULL);
    /* The exceptions are the CPU's to have, and only its. */
    bad +=
        missing_from(&except, "the CPU-only list", &cpu, "prelude_cpu.h", NULL);
    assert_int_equal(bad, 0);
}

/* The check compiles the CUDA prelude itself, not a copy. */
static void check_uses_the_cuda_prelude(void **state)
{
    (void)state;
    char *file = read_text(CUBE_SOURCE_DIR "/src/backends/cuda/prelude_cuda.h");
    assert_string_equal(file, cube_prelude_cuda_portable);
    free(file);
    char *text = cpu_portability_source("k", "int x;");
    assert_non_null(text);
    assert_non_null(strstr(text, cube_prelude_cuda_portable));
    assert_true(strstr(text, cube_prelude_portable) == text);
    assert_non_null(strstr(text, "#line 1 \"k.cube.c\"\nint x;"));
    free(text);
}

/* Every CUDA built-in the CUDA prelude uses has a stand-in, and every
 * stand-in is such a built-in or the math docs/kernels.md promises. */
static void stand_ins_match_cuda_and_the_docs(void **state)
{
    (void)state;
    static name_set used, stood, math_doc, math_decl;
    memset(&used, 0, sizeof used);
    memset(&stood, 0, sizeof stood);
    memset(&math_doc, 0, sizeof math_doc);
    memset(&math_decl, 0, sizeof math_decl);
    static const char *const dims[] = {"threadIdx", "blockIdx", "blockDim",
                                       "gridDim"};
    const char *t = cube_prelude_cuda_portable;
    for (const char *p = t; *p;) {
        /* n##__len is the kernel's name pasted, not a built-in. */
        if (!ident_char(*p) || (p > t && (ident_char(p[-1]) || p[-1] == '#'))) {
            p++;
            continue;
        }
        size_t m = 0;
        while (ident_char(p[m]))
            m++;
        char name[128];
        snprintf(name, sizeof name, "%.*s", (int)m, p);
        int builtin =
            (strncmp(name, "__", 2) == 0 && strcmp(name, "__VA_ARGS__") != 0 &&
             strcmp(name, "__attribute__") != 0) ||
            (strncmp(name, "atomic", 6) == 0 &&
             isupper((unsigned char)name[6]));
        for (size_t i = 0; i < 4; i++)
            builtin |= strcmp(name, dims[i]) == 0;
        if (builtin)
            set_add(&used, name, m);
        p += m;
    }
    /* The stand-ins: macros, declared functions and objects. */
    const char *s = cube_prelude_portable;
    for (const char *p = s; (p = strstr(p, "#define ")); p += 8) {
        const char *q = p + 8;
        size_t m = 0;
        while (ident_char(q[m]))
            m++;
        if (strncmp(q, "CUBE__", 6) != 0)
            set_add(&stood, q, m);
    }
    for (size_t i = 0; i < 4; i++)
        if (strstr(s, dims[i]))
            set_add(&stood, dims[i], strlen(dims[i]));
    static const char *const fns[] = {
        "__syncthreads(", "__trap(",    "atomicAdd(", "atomicExch(",
        "atomicCAS(",     "atomicMax(", "atomicMin(", "atomicSub(",
        "atomicAnd(",     "atomicOr("};
    for (size_t i = 0; i < sizeof fns / sizeof fns[0]; i++)
        if (strstr(s, fns[i]))
            set_add(&stood, fns[i], strlen(fns[i]) - 1);
    set_add(&used, "__CUDACC_RTC__", 14); /* the prelude tests it */
    int bad = missing_from(&used, "prelude_cuda.h", &stood,
                           "prelude_portable.h", NULL) +
              missing_from(&stood, "prelude_portable.h", &used,
                           "prelude_cuda.h", NULL);

    /* The math: CUBE__MATHn(name) declares name and namef. */
    for (const char *p = s; (p = strstr(p, "\nCUBE__MATH")); p++) {
        const char *q = strchr(p, '(');
        size_t m = strcspn(q + 1, ")");
        char name[64];
        snprintf(name, sizeof name, "%.*sf", (int)m, q + 1);
        set_add(&math_decl, name, strlen(name));
    }
    char *doc = read_text(CUBE_SOURCE_DIR "/docs/kernels.md");
    const char *from = strstr(doc, "\n## Math\n");
    assert_non_null(from);
    const char *to = strstr(from, "the same names without the `f`");
    assert_non_null(to);
    for (const char *p = from; (p = strchr(p, '`')) && p < to;) {
        size_t m = strcspn(p + 1, "`");
        size_t id = 0;
        while (id < m && ident_char(p[1 + id]))
            id++;
        if (id == m) /* a name, not `<math.h>` */
            set_add(&math_doc, p + 1, m);
        p += m + 2;
    }
    free(doc);
    assert_true(set_has(&math_doc, "sqrtf") && set_has(&math_doc, "fmaf"));
    bad += missing_from(&math_doc, "docs/kernels.md", &math_decl,
                        "prelude_portable.h", NULL) +
           missing_from(&math_decl, "prelude_portable.h", &math_doc,
                        "docs/kernels.md", NULL);
    assert_int_equal(bad, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(preludes_offer_the_same_names),
        cmocka_unit_test(check_uses_the_cuda_prelude),
        cmocka_unit_test(stand_ins_match_cuda_and_the_docs),
        cmocka_unit_test_setup_teardown(void_conversion_warns_once, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(cpu_only_atomic_warns, setup, teardown),
        cmocka_unit_test(cuda_agrees),
        cmocka_unit_test_setup_teardown(clean_kernel_is_quiet, setup, teardown),
        cmocka_unit_test_setup_teardown(key_turns_it_off, setup, teardown),
        cmocka_unit_test_setup_teardown(no_cxx_is_an_info_line, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(disk_hit_is_not_checked, setup,
                                        teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
