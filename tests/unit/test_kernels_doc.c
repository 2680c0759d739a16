/* Keeps docs/kernels.md honest: every kernel shown there must compile.
 *
 * The test reads docs/kernels.md (found from this file's own path, so it
 * needs no build setting), takes every ```c block that has a line beginning
 * with CUBE_KERNEL( — a complete kernel source — and, for each kernel the
 * block defines, creates a kernel object over the whole block and launches
 * it with CUBE_LAUNCH_SKIP and no arguments, plain and bounds checked.
 *
 * Skip mode compiles and validates without running. With no arguments the
 * launch cannot match the kernel's signature, so a kernel that compiled is
 * answered with CUBE_ERR_INVALID_ARGUMENT (or with success, should a kernel
 * take nothing but shared memory); a kernel that did not compile is answered
 * with CUBE_ERR_COMPILE, which fails the test and prints the compiler's
 * output. Host-side examples embed kernel source in string literals, whose
 * lines begin with a quote, so they are not mistaken for kernels. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cubert/cubert.h>

#define SELF_SUFFIX "tests/unit/test_kernels_doc.c"
#define DOC_RELATIVE "docs/kernels.md"
#define MIN_KERNELS 4

/* The path of docs/kernels.md: this source file's path with its repository
 * suffix replaced. Caller frees. */
static char *doc_path(void)
{
    /* __FILE__ is whatever path the build passed the compiler: find the
     * suffix at its end. */
    const char *self = __FILE__;
    const char *hit = NULL;
    for (const char *p = strstr(self, SELF_SUFFIX); p;
         p = strstr(p + 1, SELF_SUFFIX))
        hit = p;
    if (!hit || hit[strlen(SELF_SUFFIX)] != '\0')
        fail_msg("cannot locate the repository from __FILE__ = '%s'", self);
    size_t root = (size_t)(hit - self);
    char *path = malloc(root + sizeof DOC_RELATIVE);
    assert_non_null(path);
    memcpy(path, self, root);
    memcpy(path + root, DOC_RELATIVE, sizeof DOC_RELATIVE);
    return path;
}

static char *read_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        fail_msg("cannot open '%s'", path);
    char *data = NULL;
    size_t len = 0, cap = 0;
    for (;;) {
        if (len + 4096 + 1 > cap) {
            cap = cap ? cap * 2 : 16384;
            char *grown = realloc(data, cap);
            if (!grown) {
                free(data);
                fclose(f);
                fail_msg("out of memory reading '%s'", path);
            }
            data = grown;
        }
        size_t n = fread(data + len, 1, 4096, f);
        len += n;
        if (n < 4096)
            break;
    }
    int bad = ferror(f);
    fclose(f);
    if (bad) {
        free(data);
        fail_msg("cannot read '%s'", path);
    }
    data[len] = '\0';
    return data;
}

/* The end of the line starting at `p` (its '\n' or the final NUL). */
static const char *line_end(const char *p)
{
    const char *nl = strchr(p, '\n');
    return nl ? nl : p + strlen(p);
}

static const char *next_line(const char *p)
{
    const char *e = line_end(p);
    return *e ? e + 1 : e;
}

/* Whether the line at `p` is a fence opening a C block: "```c" alone. */
static int opens_c_block(const char *p)
{
    if (strncmp(p, "```c", 4) != 0)
        return 0;
    for (p += 4; *p == ' ' || *p == '\t' || *p == '\r'; p++)
        ;
    return *p == '\n' || *p == '\0';
}

static int closes_block(const char *p)
{
    return strncmp(p, "```", 3) == 0;
}

/* If the line at `p` begins with CUBE_KERNEL( (after blanks), copies the
 * kernel's name into `name` and returns 1. */
static int kernel_line(const char *p, char *name, size_t cap)
{
    while (*p == ' ' || *p == '\t')
        p++;
    static const char head[] = "CUBE_KERNEL(";
    if (strncmp(p, head, sizeof head - 1) != 0)
        return 0;
    p += sizeof head - 1;
    while (*p == ' ' || *p == '\t')
        p++;
    size_t n = 0;
    while ((isalnum((unsigned char)p[n]) || p[n] == '_') && n + 1 < cap)
        n++;
    if (n == 0)
        fail_msg("a CUBE_KERNEL( line in docs/kernels.md names no kernel");
    memcpy(name, p, n);
    name[n] = '\0';
    return 1;
}

/* Compiles kernel `name` of `source` through a skipped launch in `mode`. */
static void check_kernel(cube_client *client, const char *name,
                         const char *source, uint32_t mode)
{
    cube_kernel_desc desc;
    memset(&desc, 0, sizeof desc);
    desc.name = name;
    desc.source = source;
    desc.cube_dim[0] = 64;
    desc.cube_dim[1] = 1;
    desc.cube_dim[2] = 1;
    cube_kernel *kernel = NULL;
    cube_error *err = cube_kernel_create(&desc, &kernel);
    if (err) {
        char *text = cube_error_format(err);
        print_error("kernel '%s': %s\n", name, text ? text : "?");
        free(text);
        cube_error_free(err);
        fail();
    }
    err =
        cube_launch(client, kernel, cube_count_static(1, 1, 1), NULL, 0, mode);
    cube_kernel_release(kernel);
    cube_code code = cube_error_code(err);
    if (code != CUBE_OK && code != CUBE_ERR_INVALID_ARGUMENT) {
        char *text = cube_error_format(err);
        print_error("kernel '%s' in docs/kernels.md (%s) does not build:\n%s\n"
                    "source:\n%s\n",
                    name,
                    (mode & CUBE_LAUNCH_CHECKED) ? "checked" : "unchecked",
                    text ? text : cube_error_message(err), source);
        free(text);
        cube_error_free(err);
        fail();
    }
    cube_error_free(err);
}

/* Every kernel of the page through `device`'s compiler. A backend that
 * cannot run here is skipped when `optional`, with the reason. */
static void every_kernel_compiles_on(const char *device, int optional)
{
    cube_client_options options = cube_client_options_default();
    options.cpu_threads = 2;
    cube_client *client = NULL;
    cube_error *err = cube_client_open(device, &options, &client);
    if (err && optional && cube_error_code(err) == CUBE_ERR_UNAVAILABLE) {
        print_message("%s: %s\n", device, cube_error_message(err));
        cube_error_free(err);
        skip();
    }
    if (err) {
        char *text = cube_error_format(err);
        print_error("cube_client_open: %s\n", text ? text : "?");
        free(text);
        cube_error_free(err);
        fail();
    }
    char *path = doc_path();
    char *doc = read_file(path);

    size_t kernels = 0, blocks = 0;
    const char *p = doc;
    while (*p) {
        if (!opens_c_block(p)) {
            p = next_line(p);
            continue;
        }
        const char *body = next_line(p);
        const char *end = body;
        while (*end && !closes_block(end))
            end = next_line(end);
        if (!*end)
            fail_msg("%s: a ```c block is not closed", path);

        size_t len = (size_t)(end - body);
        char *source = malloc(len + 1);
        assert_non_null(source);
        memcpy(source, body, len);
        source[len] = '\0';

        int has_kernel = 0;
        char name[128];
        for (const char *l = source; *l; l = next_line(l)) {
            if (!kernel_line(l, name, sizeof name))
                continue;
            has_kernel = 1;
            print_message("kernel %s\n", name);
            check_kernel(client, name, source, CUBE_LAUNCH_SKIP);
            check_kernel(client, name, source,
                         CUBE_LAUNCH_SKIP | CUBE_LAUNCH_CHECKED);
            kernels++;
        }
        blocks += has_kernel;
        free(source);
        p = next_line(end);
    }

    print_message("%zu kernels in %zu blocks of %s\n", kernels, blocks, path);
    cube_client_close(client);
    free(doc);
    free(path);
    assert_true(kernels >= MIN_KERNELS);
}

static void test_every_kernel_in_the_doc_compiles(void **state)
{
    (void)state;
    every_kernel_compiles_on("cpu", 0);
}

/* The same through OpenCL C, where the machine has an OpenCL device. */
static void test_every_kernel_in_the_doc_compiles_for_opencl(void **state)
{
    (void)state;
    const char *const *names = cube_backend_names();
    for (size_t i = 0; names[i]; i++)
        if (strcmp(names[i], "opencl") == 0) {
            every_kernel_compiles_on("opencl", 1);
            return;
        }
    print_message("the opencl backend is not part of this build\n");
    skip();
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_kernel_in_the_doc_compiles),
        cmocka_unit_test(test_every_kernel_in_the_doc_compiles_for_opencl),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
