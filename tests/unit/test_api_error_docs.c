/* Keeps the error lists of the public headers honest: a code a public
 * function is seen to return must be named in the comment above its
 * declaration.
 *
 * Each test provokes errors through the public API on a real client, then
 * reads the function's comment in include/cubert/ (the block comment
 * right above its CUBE_API declaration) and checks that it names the code
 * it got, spelled as in error.h (CUBE_ERR_...). Where the code reading of
 * every backend found codes a test cannot provoke on the CPU (a device
 * fault, a driver that fails), the expected list is checked as written. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cubert/cubert.h>

#define HEADERS CUBE_SOURCE_DIR "/include/cubert/"

static char *read_text(const char *path)
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
    fclose(f);
    data[len] = '\0';
    return data;
}

/* The spelling of `code` in error.h. */
static const char *code_spelling(cube_code code)
{
    static const char *const names[] = {
        "CUBE_OK",
        "CUBE_ERR_INVALID_ARGUMENT",
        "CUBE_ERR_NOT_FOUND",
        "CUBE_ERR_OUT_OF_MEMORY",
        "CUBE_ERR_BUFFER_TOO_BIG",
        "CUBE_ERR_POOL_CAPACITY_EXCEEDED",
        "CUBE_ERR_COMPILE",
        "CUBE_ERR_RESOURCE_LIMIT",
        "CUBE_ERR_UNSUPPORTED",
        "CUBE_ERR_GRAPH_STATE",
        "CUBE_ERR_DEVICE_FAULT",
        "CUBE_ERR_SEVERAL",
        "CUBE_ERR_IO",
        "CUBE_ERR_UNAVAILABLE",
        "CUBE_ERR_INTERNAL",
        "CUBE_ERR_STORAGE_MAPPING_FAILED",
        "CUBE_ERR_PROFILE",
        "CUBE_ERR_POOLS_IN_USE",
        "CUBE_ERR_STREAM_UNAVAILABLE",
        "CUBE_ERR_TIMEOUT",
        "CUBE_ERR_ABORTED",
    };
    if ((size_t)code >= sizeof names / sizeof names[0])
        fail_msg("code %d has no spelling here: add it", (int)code);
    return names[code];
}

/* The block comment right above the CUBE_API declaration of `function`
 * in include/cubert/`header` (malloc'd). */
static char *doc_of(const char *header, const char *function)
{
    char path[512];
    snprintf(path, sizeof path, "%s%s", HEADERS, header);
    char *text = read_text(path);
    char call[128];
    snprintf(call, sizeof call, "%s(", function);
    const char *decl = NULL;
    for (const char *p = strstr(text, call); p && !decl;
         p = strstr(p + 1, call)) {
        /* The name must start there, and its declaration is the last
         * CUBE_API before it with no ';' or '{' in between. */
        char before = p > text ? p[-1] : '\n';
        if (before != ' ' && before != '*' && before != '\n')
            continue;
        const char *api = NULL;
        for (const char *q = p; q > text; q--)
            if (strncmp(q, "CUBE_API", 8) == 0) {
                api = q;
                break;
            }
        if (!api || memchr(api, ';', (size_t)(p - api)) ||
            memchr(api, '{', (size_t)(p - api)))
            continue;
        decl = api;
    }
    if (!decl) {
        free(text);
        fail_msg("%s does not declare %s with CUBE_API", header, function);
    }
    /* Back over the blank space between the comment and the declaration. */
    size_t at = (size_t)(decl - text);
    while (at > 0 && (text[at - 1] == ' ' || text[at - 1] == '\n'))
        at--;
    const char *end = text + at;
    if (at < 2 || strncmp(end - 2, "*/", 2) != 0) {
        free(text);
        fail_msg("%s: no comment right above the declaration of %s", header,
                 function);
    }
    const char *start = end - 2;
    while (start > text && strncmp(start, "/*", 2) != 0)
        start--;
    size_t n = (size_t)(end - start);
    char *doc = malloc(n + 1);
    assert_non_null(doc);
    memcpy(doc, start, n);
    doc[n] = '\0';
    free(text);
    return doc;
}

/* Fails unless the comment of `function` names `code`. */
static void expect_documented_at(const char *header, const char *function,
                                 cube_code code, const char *file, int line)
{
    char *doc = doc_of(header, function);
    const char *name = code_spelling(code);
    /* A whole word: CUBE_ERR_PROFILE must not match inside a longer name. */
    int found = 0;
    size_t len = strlen(name);
    for (const char *p = strstr(doc, name); p && !found;
         p = strstr(p + 1, name)) {
        char after = p[len];
        found = !(after == '_' || (after >= 'A' && after <= 'Z'));
    }
    if (!found) {
        print_error("%s:%d: the comment of %s in %s does not name %s:\n%s\n",
                    file, line, function, header, name, doc);
        free(doc);
        _fail(file, line);
    }
    free(doc);
}
#define EXPECT_DOCUMENTED(header, function, code)                              \
    expect_documented_at((header), (function), (code), __FILE__, __LINE__)

/* Fails unless err has `code` and the comment of `function` names it;
 * frees err. */
static void expect_returned_at(cube_error *err, cube_code code,
                               const char *header, const char *function,
                               const char *file, int line)
{
    cube_code got = cube_error_code(err);
    if (got != code) {
        print_error("%s:%d: %s returned %s (%s), expected %s\n", file, line,
                    function, code_spelling(got), cube_error_message(err),
                    code_spelling(code));
        cube_error_free(err);
        _fail(file, line);
    }
    cube_error_free(err);
    expect_documented_at(header, function, code, file, line);
}
#define EXPECT_RETURNED(err, code, header, function)                           \
    expect_returned_at((err), (code), (header), (function), __FILE__, __LINE__)

static cube_client *open_client(const char *backend)
{
    cube_client *c = NULL;
    cube_error *err = cube_client_open(backend, NULL, &c);
    if (err) {
        print_error("%s: %s\n", backend, cube_error_message(err));
        cube_error_free(err);
        return NULL;
    }
    return c;
}

/* cube_staging refuses a size no host memory can hold with
 * CUBE_ERR_BUFFER_TOO_BIG before allocating anything, on every backend
 * (the client checks it; CUDA's pinned manager answers the same for a size
 * above the host's memory). The rest of its list comes from reading the
 * CPU (the client's aligned memory), null (the same) and CUDA (pinned
 * memory: a refused cuMemHostAlloc, a broken context, a context that
 * cannot be made current) paths. */
static void staging_errors_are_documented(void **state)
{
    (void)state;
    const char *const backends[] = {"cpu", "null"};
    for (size_t b = 0; b < 2; b++) {
        cube_client *c = open_client(backends[b]);
        if (!c) {
            assert_true(b > 0); /* the CPU backend is always built */
            continue;
        }
        cube_properties p;
        assert_null(cube_client_properties(c, &p));
        uint64_t sizes[2] = {64, p.memory_total + 1};
        void *out[2] = {(void *)sizes, (void *)sizes};
        EXPECT_RETURNED(cube_staging(c, sizes, 2, out), CUBE_ERR_BUFFER_TOO_BIG,
                        "buffer.h", "cube_staging");
        /* Nothing was allocated, and nothing is left to free. */
        assert_null(out[0]);
        assert_null(out[1]);
        EXPECT_RETURNED(cube_staging(c, sizes, 0, out),
                        CUBE_ERR_INVALID_ARGUMENT, "buffer.h", "cube_staging");
        uint64_t zero = 0;
        EXPECT_RETURNED(cube_staging(c, &zero, 1, out),
                        CUBE_ERR_INVALID_ARGUMENT, "buffer.h", "cube_staging");
        cube_client_close(c);
    }
    EXPECT_RETURNED(cube_staging(NULL, NULL, 0, NULL),
                    CUBE_ERR_INVALID_ARGUMENT, "buffer.h", "cube_staging");
    static const cube_code listed[] = {
        CUBE_ERR_INVALID_ARGUMENT, CUBE_ERR_BUFFER_TOO_BIG,
        CUBE_ERR_OUT_OF_MEMORY, CUBE_ERR_DEVICE_FAULT, CUBE_ERR_INTERNAL};
    for (size_t i = 0; i < sizeof listed / sizeof listed[0]; i++)
        EXPECT_DOCUMENTED("buffer.h", "cube_staging", listed[i]);
}

static const char SRC_FILL[] =
    "CUBE_KERNEL(fill, CUBE_OUT(uint32_t, y), CUBE_SCALAR(uint32_t, v))\n"
    "{\n"
    "    uint32_t i = ABSOLUTE_POS_X;\n"
    "    if (i < CUBE_LEN(y))\n"
    "        y[i] = v + i;\n"
    "}\n";

/* A buffer made in a dry run that cannot be backed at its first real use
 * fails that use with CUBE_ERR_STORAGE_MAPPING_FAILED, whichever call it
 * is: a launch, a write or a read. */
static void first_use_mapping_failure_is_documented(void **state)
{
    (void)state;
    cube_client *c = open_client("cpu");
    assert_non_null(c);
    cube_properties p;
    assert_null(cube_client_properties(c, &p));
    uint64_t page = 256 * p.memory_alignment;
    /* One exclusive pool capped at one page, whose range holds every
     * size used here: a second buffer cannot be backed while one lives. */
    cube_memory_layout l;
    memset(&l, 0, sizeof l);
    l.count = 1;
    l.pools[0].kind = CUBE_POOL_EXCLUSIVE;
    l.pools[0].page_size = page;
    l.pools[0].min_size = 1;
    l.pools[0].max_size = page;
    l.pools[0].cap = page;
    assert_null(cube_install_memory_pools(c, &l));

    assert_null(cube_dry_run_begin(c));
    cube_handle first = {0}, h[3] = {{0}};
    assert_null(cube_empty(c, page, &first));
    for (int i = 0; i < 3; i++)
        assert_null(cube_empty(c, page, &h[i]));
    assert_null(cube_dry_run_end(c));
    unsigned char *bytes = calloc(page, 1);
    assert_non_null(bytes);
    cube_copy_desc d0 = cube_copy_desc_contiguous(first, page, 1);
    const void *src[1] = {bytes};
    uint64_t size[1] = {page};
    assert_null(cube_write(c, &d0, src, size, 1));

    cube_kernel_desc kd = {"fill", SRC_FILL, {32, 1, 1}};
    cube_kernel *k = NULL;
    assert_null(cube_kernel_create(&kd, &k));
    cube_arg args[2] = {cube_arg_buffer(h[0]), cube_arg_u32(1)};
    EXPECT_RETURNED(cube_launch(c, k, cube_count_static(1, 1, 1), args, 2,
                                CUBE_LAUNCH_EXECUTE),
                    CUBE_ERR_STORAGE_MAPPING_FAILED, "kernel.h", "cube_launch");
    cube_copy_desc d1 = cube_copy_desc_contiguous(h[1], page, 1);
    EXPECT_RETURNED(cube_write(c, &d1, src, size, 1),
                    CUBE_ERR_STORAGE_MAPPING_FAILED, "buffer.h", "cube_write");
    cube_copy_desc d2 = cube_copy_desc_contiguous(h[2], page, 1);
    void *dst[1] = {bytes};
    EXPECT_RETURNED(cube_read(c, &d2, dst, size, 1),
                    CUBE_ERR_STORAGE_MAPPING_FAILED, "buffer.h", "cube_read");
    cube_kernel_release(k);
    free(bytes);
    cube_client_close(c);
}

/* A graph id that names no graph (never handed out, or destroyed) is
 * CUBE_ERR_NOT_FOUND for replay and destroy, as error.h says of a missing
 * graph. */
static void unknown_graph_is_documented(void **state)
{
    (void)state;
    cube_client *c = open_client("cpu");
    assert_non_null(c);
    EXPECT_RETURNED(cube_graph_replay(c, 0), CUBE_ERR_NOT_FOUND, "graph.h",
                    "cube_graph_replay");
    EXPECT_RETURNED(cube_graph_destroy(c, 0), CUBE_ERR_NOT_FOUND, "graph.h",
                    "cube_graph_destroy");
    EXPECT_RETURNED(cube_graph_destroy(c, UINT64_MAX), CUBE_ERR_NOT_FOUND,
                    "graph.h", "cube_graph_destroy");
    cube_client_close(c);
}

/* cube_kernel_create_raw refuses bad descriptors with
 * CUBE_ERR_INVALID_ARGUMENT and lists running out of memory; a raw
 * kernel's launch answers CUBE_ERR_UNSUPPORTED on another backend,
 * CUBE_ERR_COMPILE for code that does not build and
 * CUBE_ERR_INVALID_ARGUMENT for arguments that do not fit the declared
 * parameters, each of which cube_launch's comment names. */
static void raw_kernel_errors_are_documented(void **state)
{
    (void)state;
    cube_raw_param params[2] = {{CUBE_RAW_BUFFER_OUT, 4}, {CUBE_RAW_SCALAR, 4}};
    cube_raw_kernel_desc d;
    memset(&d, 0, sizeof d);
    d.name = "raw_doc";
    d.format = CUBE_KERNEL_C_SOURCE;
    d.source = "void raw_doc(const cube_cpu_cube *c) { (void)c; }\n";
    d.params = params;
    d.nparams = 2;
    cube_kernel *k = NULL;
    EXPECT_RETURNED(cube_kernel_create_raw(NULL, &k), CUBE_ERR_INVALID_ARGUMENT,
                    "kernel.h", "cube_kernel_create_raw");
    params[1].size = 3;
    EXPECT_RETURNED(cube_kernel_create_raw(&d, &k), CUBE_ERR_INVALID_ARGUMENT,
                    "kernel.h", "cube_kernel_create_raw");
    params[1].size = 4;
    EXPECT_DOCUMENTED("kernel.h", "cube_kernel_create_raw",
                      CUBE_ERR_OUT_OF_MEMORY);
    EXPECT_DOCUMENTED("kernel.h", "cube_kernel_create_raw",
                      CUBE_ERR_UNSUPPORTED);
    EXPECT_DOCUMENTED("kernel.h", "cube_kernel_create_raw", CUBE_ERR_COMPILE);

    cube_client *c = open_client("cpu");
    assert_non_null(c);
    cube_handle y = {0};
    assert_null(cube_empty(c, 64, &y));
    cube_arg args[2] = {cube_arg_buffer(y), cube_arg_u32(1)};
    assert_null(cube_kernel_create_raw(&d, &k));
    EXPECT_RETURNED(cube_launch(c, k, cube_count_static(1, 1, 1), args, 1,
                                CUBE_LAUNCH_EXECUTE),
                    CUBE_ERR_INVALID_ARGUMENT, "kernel.h", "cube_launch");
    assert_null(cube_launch(c, k, cube_count_static(1, 1, 1), args, 2,
                            CUBE_LAUNCH_EXECUTE));
    cube_kernel_release(k);
    d.source = "void raw_doc(const cube_cpu_cube *c) { not C }\n";
    assert_null(cube_kernel_create_raw(&d, &k));
    EXPECT_RETURNED(cube_launch(c, k, cube_count_static(1, 1, 1), args, 2,
                                CUBE_LAUNCH_EXECUTE),
                    CUBE_ERR_COMPILE, "kernel.h", "cube_launch");
    cube_kernel_release(k);
    d.format = CUBE_KERNEL_CUDA_SOURCE;
    assert_null(cube_kernel_create_raw(&d, &k));
    EXPECT_RETURNED(cube_launch(c, k, cube_count_static(1, 1, 1), args, 2,
                                CUBE_LAUNCH_EXECUTE),
                    CUBE_ERR_UNSUPPORTED, "kernel.h", "cube_launch");
    cube_kernel_release(k);
    assert_null(cube_handle_release(c, y));
    cube_client_close(c);
}

/* Range errors, provoked on a CPU client while a trace runs (to
 * /dev/null). */
static void range_errors_are_documented(void **state)
{
    (void)state;
    assert_null(cube_trace_start("/dev/null"));
    cube_client *c = open_client("cpu");
    assert_non_null(c);
    EXPECT_RETURNED(cube_range_push(NULL, "x"), CUBE_ERR_INVALID_ARGUMENT,
                    "profile.h", "cube_range_push");
    EXPECT_RETURNED(cube_range_push(c, NULL), CUBE_ERR_INVALID_ARGUMENT,
                    "profile.h", "cube_range_push");
    EXPECT_RETURNED(cube_range_pop(c), CUBE_ERR_INVALID_ARGUMENT, "profile.h",
                    "cube_range_pop");
    for (int i = 0; i < CUBE_RANGE_MAX_DEPTH; i++)
        assert_null(cube_range_push(c, "r"));
    EXPECT_RETURNED(cube_range_push(c, "r"), CUBE_ERR_RESOURCE_LIMIT,
                    "profile.h", "cube_range_push");
    EXPECT_DOCUMENTED("profile.h", "cube_range_push", CUBE_ERR_OUT_OF_MEMORY);
    cube_client_close(c); /* ends the open ranges */
    assert_null(cube_trace_stop());
}

/* cube_memory_snapshot's bad input, on a CPU client and without one. */
static void snapshot_errors_are_documented(void **state)
{
    (void)state;
    cube_client *c = open_client("cpu");
    assert_non_null(c);
    cube_buffer_info list[2];
    memset(list, 0, sizeof list);
    list[0].struct_size = sizeof list[0];
    size_t count = 0;
    EXPECT_RETURNED(
        cube_memory_snapshot(NULL, CUBE_MEMORY_STREAM, list, 2, &count),
        CUBE_ERR_INVALID_ARGUMENT, "memory.h", "cube_memory_snapshot");
    EXPECT_RETURNED(cube_memory_snapshot(c, CUBE_MEMORY_STREAM, list, 2, NULL),
                    CUBE_ERR_INVALID_ARGUMENT, "memory.h",
                    "cube_memory_snapshot");
    EXPECT_RETURNED(
        cube_memory_snapshot(c, CUBE_MEMORY_STREAM, NULL, 2, &count),
        CUBE_ERR_INVALID_ARGUMENT, "memory.h", "cube_memory_snapshot");
    list[0].struct_size = CUBE_BUFFER_INFO_V1_SIZE - 1;
    EXPECT_RETURNED(
        cube_memory_snapshot(c, CUBE_MEMORY_STREAM, list, 2, &count),
        CUBE_ERR_INVALID_ARGUMENT, "memory.h", "cube_memory_snapshot");
    list[0].struct_size = sizeof list[0];
    EXPECT_RETURNED(
        cube_memory_snapshot(c, (cube_memory_scope)9, list, 2, &count),
        CUBE_ERR_INVALID_ARGUMENT, "memory.h", "cube_memory_snapshot");
    assert_null(cube_memory_snapshot(c, CUBE_MEMORY_DEVICE, list, 2, &count));
    assert_int_equal(count, 0);
    cube_client_close(c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(staging_errors_are_documented),
        cmocka_unit_test(first_use_mapping_failure_is_documented),
        cmocka_unit_test(unknown_graph_is_documented),
        cmocka_unit_test(raw_kernel_errors_are_documented),
        cmocka_unit_test(range_errors_are_documented),
        cmocka_unit_test(snapshot_errors_are_documented),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
