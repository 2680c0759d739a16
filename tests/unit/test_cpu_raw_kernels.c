/* Raw C kernels and the CPU backend's disk cache: a raw kernel compiled
 * by one client is loaded from the disk cache by a client opened after
 * it (the device's in-memory cache went with the first), and a shared
 * object, whose bytes are the code, is loaded from them each time and
 * never written to the cache. Observed through the debug log, as an
 * operator would. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cubert/cubert.h>

static void ok(cube_error *err)
{
    if (err) {
        char *text = cube_error_format(err);
        fail_msg("unexpected error: %s", text ? text : "?");
    }
}

/* What the "compile" category said about the kernel under test. */
typedef struct seen {
    int compiled, from_disk;
} seen;

static void sink(void *user, cube_log_level level, const char *category,
                 const char *message)
{
    (void)level;
    seen *s = user;
    if (strcmp(category, "compile") != 0 || strncmp(message, "raw_twice:", 10))
        return;
    if (strstr(message, "loaded from disk cache"))
        s->from_disk++;
    else if (strstr(message, " compiled in "))
        s->compiled++;
}

static const char SRC[] =
    "void raw_twice(const cube_cpu_cube *c)\n"
    "{\n"
    "    uint32_t *y = c->params[0].data;\n"
    "    uint32_t v = *(const uint32_t *)c->params[1].data;\n"
    "    for (uint32_t u = 0; u < c->dim[0]; u++)\n"
    "        y[c->index * c->dim[0] + u] = 2 * v + u;\n"
    "}\n";

/* Opens a CPU client on `cache`, launches `k` once, checks the result,
 * closes (the device, and its in-memory cache, go with it). */
static void launch_once(const char *cache, cube_kernel *k)
{
    cube_client_options o = cube_client_options_default();
    o.cache_dir = cache;
    o.cpu_threads = 2;
    cube_client *c = NULL;
    ok(cube_client_open("cpu", &o, &c));
    cube_handle y = {0};
    ok(cube_empty(c, 8 * 4, &y));
    cube_arg args[2] = {cube_arg_buffer(y), cube_arg_u32(21)};
    ok(cube_launch(c, k, cube_count_static(1, 1, 1), args, 2,
                   CUBE_LAUNCH_EXECUTE));
    uint32_t got[8];
    cube_copy_desc d = cube_copy_desc_contiguous(y, sizeof got, 4);
    void *dst[1] = {got};
    uint64_t size[1] = {sizeof got};
    ok(cube_read(c, &d, dst, size, 1));
    for (uint32_t i = 0; i < 8; i++)
        assert_int_equal(got[i], 42 + i);
    ok(cube_handle_release(c, y));
    cube_client_close(c);
}

static int remove_entry(const char *path, const struct stat *st, int flag,
                        struct FTW *ftw)
{
    (void)st;
    (void)flag;
    (void)ftw;
    return remove(path);
}

/* Set by find_object: a file named *.so under the tree walked. */
static int found_object;

static int find_object(const char *path, const struct stat *st, int flag,
                       struct FTW *ftw)
{
    (void)st;
    (void)ftw;
    size_t n = strlen(path);
    if (flag == FTW_F && n > 3 && strcmp(path + n - 3, ".so") == 0)
        found_object = 1;
    return 0;
}

static void raw_source_is_loaded_from_disk_by_a_later_client(void **state)
{
    (void)state;
    char dir[] = "/tmp/cubert-raw-cache-XXXXXX";
    assert_non_null(mkdtemp(dir));
    seen s = {0, 0};
    cube_log_set_level(CUBE_LOG_DEBUG);
    cube_log_set_sink(sink, &s);

    cube_raw_param params[2] = {{CUBE_RAW_BUFFER_OUT, 4}, {CUBE_RAW_SCALAR, 4}};
    cube_raw_kernel_desc d;
    memset(&d, 0, sizeof d);
    d.name = "raw_twice";
    d.format = CUBE_KERNEL_C_SOURCE;
    d.source = SRC;
    d.params = params;
    d.nparams = 2;
    d.cube_dim[0] = 8;
    d.options = "-O1";
    cube_kernel *k = NULL;
    ok(cube_kernel_create_raw(&d, &k));

    launch_once(dir, k);
    assert_int_equal(s.compiled, 1);
    assert_int_equal(s.from_disk, 0);
    launch_once(dir, k);
    assert_int_equal(s.compiled, 1);
    assert_int_equal(s.from_disk, 1);
    /* Another kernel object with the same description is the same entry. */
    cube_kernel *same = NULL;
    ok(cube_kernel_create_raw(&d, &same));
    launch_once(dir, same);
    assert_int_equal(s.from_disk, 2);
    cube_kernel_release(same);
    /* Other options are another object. */
    d.options = "-O2";
    cube_kernel *other = NULL;
    ok(cube_kernel_create_raw(&d, &other));
    launch_once(dir, other);
    assert_int_equal(s.compiled, 2);
    cube_kernel_release(other);
    cube_kernel_release(k);
    cube_log_set_sink(NULL, NULL);
    cube_log_set_level(CUBE_LOG_WARN);
    nftw(dir, remove_entry, 8, FTW_DEPTH | FTW_PHYS);
}

/* A shared object is not compiled, and its bytes are not cached: the
 * cache directory holds nothing after it ran. */
static void raw_shared_object_is_not_written_to_the_cache(void **state)
{
    (void)state;
    char dir[] = "/tmp/cubert-raw-so-XXXXXX";
    assert_non_null(mkdtemp(dir));
    char src[128], so[128], cmd[512];
    snprintf(src, sizeof src, "%s/k.c", dir);
    snprintf(so, sizeof so, "%s/k.so", dir);
    FILE *f = fopen(src, "w");
    assert_non_null(f);
    fprintf(f,
            "#include <stdint.h>\n#include <cubert/cpu_kernel.h>\n"
            "void raw_twice(const cube_cpu_cube *c);\n%s",
            SRC);
    fclose(f);
    snprintf(cmd, sizeof cmd, "cc -shared -fPIC -I%s/include -o %s %s",
             CUBE_SOURCE_DIR, so, src);
    assert_int_equal(system(cmd), 0);
    f = fopen(so, "rb");
    assert_non_null(f);
    assert_int_equal(fseek(f, 0, SEEK_END), 0);
    long len = ftell(f);
    assert_true(len > 0);
    rewind(f);
    unsigned char *bytes = malloc((size_t)len);
    assert_non_null(bytes);
    assert_int_equal(fread(bytes, 1, (size_t)len, f), (size_t)len);
    fclose(f);
    nftw(dir, remove_entry, 8, FTW_DEPTH | FTW_PHYS);

    char cache[] = "/tmp/cubert-raw-so-cache-XXXXXX";
    assert_non_null(mkdtemp(cache));
    cube_raw_param params[2] = {{CUBE_RAW_BUFFER_OUT, 4}, {CUBE_RAW_SCALAR, 4}};
    cube_raw_kernel_desc d;
    memset(&d, 0, sizeof d);
    d.name = "raw_twice";
    d.format = CUBE_KERNEL_SHARED_OBJECT;
    d.binary = bytes;
    d.binary_size = (size_t)len;
    d.params = params;
    d.nparams = 2;
    d.cube_dim[0] = 8;
    cube_kernel *k = NULL;
    ok(cube_kernel_create_raw(&d, &k));
    free(bytes);
    launch_once(cache, k);
    launch_once(cache, k);
    /* The cache's own files (its secret) may appear; no object does. */
    found_object = 0;
    nftw(cache, find_object, 8, FTW_PHYS);
    assert_int_equal(found_object, 0);
    cube_kernel_release(k);
    nftw(cache, remove_entry, 8, FTW_DEPTH | FTW_PHYS);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(raw_source_is_loaded_from_disk_by_a_later_client),
        cmocka_unit_test(raw_shared_object_is_not_written_to_the_cache),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
