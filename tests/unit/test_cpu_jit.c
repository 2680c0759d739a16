/* Unit tests for the CPU backend's compiler and its disk cache. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "backends/common/disk_cache.h"
#include "backends/cpu/cpu_jit.h"
#include "cubert/cubert.h"
#include "cubert/log.h"
#include "test_files.h"

/* Besides its entries, a cache directory in use holds its secret (the key
 * of the records' digests). */
#define SECRET_FILES 1
#define SECRET_NAME "secret"
static const char *const ADD_SRC = "int add(int a, int b) { return a + b; }\n";
static const char *const DELTA_SRC = "#ifndef DELTA\n#define DELTA 0\n#endif\n"
                                     "int add(int a, int b) "
                                     "{ return a + b + DELTA; }\n";
static const char *const COUNTER_SRC =
    "static int counter;\nint bump(void) { return ++counter; }\n";

/* ------------------------------------------------------------- log capture */

static pthread_mutex_t capture_lock = PTHREAD_MUTEX_INITIALIZER;
static int capture_warns;
static int capture_trace_source;
static int capture_debug_compiled;
static char capture_last_warn[1024];

static void capture_sink(void *user, cube_log_level level, const char *category,
                         const char *message)
{
    (void)user;
    pthread_mutex_lock(&capture_lock);
    if (level == CUBE_LOG_WARN) {
        capture_warns++;
        snprintf(capture_last_warn, sizeof capture_last_warn, "[%s] %s",
                 category, message);
    }
    if (level == CUBE_LOG_TRACE && strstr(message, "return a + b"))
        capture_trace_source++;
    if (level == CUBE_LOG_DEBUG && strncmp(message, "compiled ", 9) == 0 &&
        strstr(message, " ms"))
        capture_debug_compiled++;
    pthread_mutex_unlock(&capture_lock);
}

static void capture_reset(void)
{
    pthread_mutex_lock(&capture_lock);
    capture_warns = 0;
    capture_trace_source = 0;
    capture_debug_compiled = 0;
    capture_last_warn[0] = '\0';
    pthread_mutex_unlock(&capture_lock);
}

static int capture_warn_count(void)
{
    pthread_mutex_lock(&capture_lock);
    int n = capture_warns;
    pthread_mutex_unlock(&capture_lock);
    return n;
}

/* ------------------------------------------------------------------ helpers */

/* fopen, linked with -Wl,--wrap=fopen (tests/CMakeLists.txt): refuses
 * /proc/cpuinfo while fail_cpuinfo is set. */
FILE *__real_fopen(const char *path, const char *mode);
FILE *__wrap_fopen(const char *path, const char *mode);
static int fail_cpuinfo;

FILE *__wrap_fopen(const char *path, const char *mode)
{
    if (fail_cpuinfo && strcmp(path, "/proc/cpuinfo") == 0) {
        errno = EACCES;
        return NULL;
    }
    return __real_fopen(path, mode);
}

static char *make_tmpdir(void)
{
    return make_tmpdir_named("/tmp/cubert-test-jit-XXXXXX");
}

static void entry_path(char *buf, size_t size, const char *dir, uint64_t key,
                       const char *ext)
{
    snprintf(buf, size, "%s/%016" PRIx64 ".%s", dir, key, ext);
}

static int file_exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}

static cpu_jit *make_jit(const char *cache_dir, const char *cflags)
{
    cpu_jit_options opts = {
        .cc = NULL, .cflags = cflags, .cache_dir = cache_dir};
    cpu_jit *jit = NULL;
    cube_error *err = cpu_jit_create(&opts, &jit);
    assert_null(err);
    assert_non_null(jit);
    return jit;
}

static int call_add(const cpu_module *m, int a, int b)
{
    void *sym = cpu_module_symbol(m, "add");
    assert_non_null(sym);
    int (*fn)(int, int);
    memcpy(&fn, &sym, sizeof fn);
    return fn(a, b);
}

static int call_bump(const cpu_module *m)
{
    void *sym = cpu_module_symbol(m, "bump");
    assert_non_null(sym);
    int (*fn)(void);
    memcpy(&fn, &sym, sizeof fn);
    return fn();
}

/* Loads `source` with a fresh jit on `dir`; checks the origin and that
 * add(2, 3) == 5 + delta. */
static void load_expect(const char *dir, const char *source, const char *flags,
                        cpu_jit_origin expect, int delta)
{
    cpu_jit *jit = make_jit(dir, NULL);
    cpu_module *m = NULL;
    cpu_jit_origin origin = (cpu_jit_origin)-1;
    cube_error *err = cpu_jit_load(jit, source, flags, &m, &origin);
    if (err)
        fail_msg("load failed: %s", cube_error_message(err));
    assert_int_equal(origin, expect);
    assert_int_equal(call_add(m, 2, 3), 5 + delta);
    cpu_module_close(m);
    cpu_jit_destroy(jit);
}

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static void write_file(const char *path, const void *data, size_t len)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(data, 1, len, f), len);
    assert_int_equal(fclose(f), 0);
}

static char *read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    assert_int_equal(fseek(f, 0, SEEK_END), 0);
    long n = ftell(f);
    assert_true(n >= 0);
    rewind(f);
    char *data = malloc((size_t)n + 1);
    assert_non_null(data);
    assert_int_equal(fread(data, 1, (size_t)n, f), (size_t)n);
    data[n] = '\0';
    fclose(f);
    *len = (size_t)n;
    return data;
}

/* Sets an environment variable for one test, restoring it afterwards. */
typedef struct saved_env {
    const char *name;
    char *value;
} saved_env;

static saved_env env_set(const char *name, const char *value)
{
    const char *old = getenv(name);
    saved_env s = {name, old ? strdup(old) : NULL};
    if (value)
        setenv(name, value, 1);
    else
        unsetenv(name);
    return s;
}

static void env_restore(saved_env s)
{
    if (s.value)
        setenv(s.name, s.value, 1);
    else
        unsetenv(s.name);
    free(s.value);
}

static int setup(void **state)
{
    (void)state;
    capture_reset();
    return 0;
}

/* -------------------------------------------------------------------- tests */

static void test_compile_and_call(void **state)
{
    (void)state;
    char *dir = make_tmpdir();
    cpu_jit *jit = make_jit(dir, NULL);
    cpu_module *m = NULL;
    cpu_jit_origin origin = CPU_JIT_DISK;
    cube_error *err = cpu_jit_load(jit, ADD_SRC, NULL, &m, &origin);
    assert_null(err);
    assert_non_null(m);
    assert_int_equal(origin, CPU_JIT_COMPILED);
    assert_int_equal(call_add(m, 2, 3), 5);
    assert_int_equal(call_add(m, -7, 3), -4);
    assert_null(cpu_module_symbol(m, "no_such_symbol"));

    /* Exactly the entry: no temporary files left behind. */
    char path[512];
    uint64_t key = cpu_jit_key(jit, ADD_SRC, NULL);
    entry_path(path, sizeof path, dir, key, "so");
    assert_true(file_exists(path));
    entry_path(path, sizeof path, dir, key, "meta");
    assert_true(file_exists(path));
    assert_int_equal(count_entries(dir), 2 + SECRET_FILES);
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal(st.st_mode & 077, 0);

    /* origin may be NULL. */
    cpu_module *m2 = NULL;
    assert_null(cpu_jit_load(jit, ADD_SRC, NULL, &m2, NULL));
    assert_int_equal(call_add(m2, 1, 1), 2);
    cpu_module_close(m2);
    cpu_module_close(m);
    cpu_jit_destroy(jit);
    assert_int_equal(capture_warn_count(), 0);
    rm_tree(dir);
}

static void test_disk_hit(void **state)
{
    (void)state;
    char *dir = make_tmpdir();
    cpu_jit *jit = make_jit(dir, NULL);
    cpu_module *m = NULL;
    cpu_jit_origin origin;
    double t0 = now_ms();
    assert_null(cpu_jit_load(jit, ADD_SRC, NULL, &m, &origin));
    double compile_ms = now_ms() - t0;
    assert_int_equal(origin, CPU_JIT_COMPILED);
    cpu_module_close(m);
    cpu_jit_destroy(jit);

    jit = make_jit(dir, NULL);
    t0 = now_ms();
    assert_null(cpu_jit_load(jit, ADD_SRC, NULL, &m, &origin));
    double disk_ms = now_ms() - t0;
    assert_int_equal(origin, CPU_JIT_DISK);
    assert_int_equal(call_add(m, 40, 2), 42);
    cpu_module_close(m);
    cpu_jit_destroy(jit);
    print_message("cold compile %.2f ms, disk load %.3f ms\n", compile_ms,
                  disk_ms);
    assert_int_equal(capture_warn_count(), 0);
    rm_tree(dir);
}

static void test_flipped_byte_rebuilt(void **state)
{
    (void)state;
    char *dir = make_tmpdir();
    load_expect(dir, ADD_SRC, NULL, CPU_JIT_COMPILED, 0);
    cpu_jit *jit = make_jit(dir, NULL);
    char path[512];
    entry_path(path, sizeof path, dir, cpu_jit_key(jit, ADD_SRC, NULL), "so");
    cpu_jit_destroy(jit);

    size_t len;
    char *data = read_file(path, &len);
    assert_true(len > 100);
    data[len / 2] ^= 0x40;
    write_file(path, data, len);
    free(data);

    load_expect(dir, ADD_SRC, NULL, CPU_JIT_COMPILED, 0);
    assert_int_equal(capture_warn_count(), 1);
    assert_non_null(strstr(capture_last_warn, "corrupt"));
    /* The entry was rewritten and is good again. */
    load_expect(dir, ADD_SRC, NULL, CPU_JIT_DISK, 0);
    assert_int_equal(capture_warn_count(), 1);
    rm_tree(dir);
}

static void test_truncated_rebuilt(void **state)
{
    (void)state;
    char *dir = make_tmpdir();
    load_expect(dir, ADD_SRC, NULL, CPU_JIT_COMPILED, 0);
    cpu_jit *jit = make_jit(dir, NULL);
    char path[512];
    entry_path(path, sizeof path, dir, cpu_jit_key(jit, ADD_SRC, NULL), "so");
    cpu_jit_destroy(jit);

    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal(truncate(path, st.st_size / 2), 0);
    load_expect(dir, ADD_SRC, NULL, CPU_JIT_COMPILED, 0);
    assert_int_equal(capture_warn_count(), 1);
    assert_non_null(strstr(capture_last_warn, "truncated"));
    load_expect(dir, ADD_SRC, NULL, CPU_JIT_DISK, 0);

    /* Empty is truncated too. */
    assert_int_equal(truncate(path, 0), 0);
    load_expect(dir, ADD_SRC, NULL, CPU_JIT_COMPILED, 0);
    assert_int_equal(capture_warn_count(), 2);
    rm_tree(dir);
}

static void test_foreign_meta_rebuilt(void **state)
{
    (void)state;
    char *dir = make_tmpdir();
    load_expect(dir, ADD_SRC, NULL, CPU_JIT_COMPILED, 0);
    load_expect(dir, DELTA_SRC, "-DDELTA=1", CPU_JIT_COMPILED, 1);
    cpu_jit *jit = make_jit(dir, NULL);
    char add_meta[512], delta_meta[512], delta_so[512], add_so[512];
    entry_path(add_meta, sizeof add_meta, dir, cpu_jit_key(jit, ADD_SRC, NULL),
               "meta");
    entry_path(add_so, sizeof add_so, dir, cpu_jit_key(jit, ADD_SRC, NULL),
               "so");
    entry_path(delta_meta, sizeof delta_meta, dir,
               cpu_jit_key(jit, DELTA_SRC, "-DDELTA=1"), "meta");
    entry_path(delta_so, sizeof delta_so, dir,
               cpu_jit_key(jit, DELTA_SRC, "-DDELTA=1"), "so");
    cpu_jit_destroy(jit);

    /* A meta for another key, even with its own matching object: the pair
     * verifies as a pair but belongs to another key. */
    size_t len;
    char *meta = read_file(delta_meta, &len);
    write_file(add_meta, meta, len);
    free(meta);
    char *so = read_file(delta_so, &len);
    write_file(add_so, so, len);
    free(so);
    load_expect(dir, ADD_SRC, NULL, CPU_JIT_COMPILED, 0);
    assert_int_equal(capture_warn_count(), 1);
    assert_non_null(strstr(capture_last_warn, "another key"));
    load_expect(dir, ADD_SRC, NULL, CPU_JIT_DISK, 0);

    /* A meta from another version of the format. */
    meta = read_file(add_meta, &len);
    meta[strlen("cubert-cpu-jit-")] = '9';
    write_file(add_meta, meta, len);
    free(meta);
    load_expect(dir, ADD_SRC, NULL, CPU_JIT_COMPILED, 0);
    assert_int_equal(capture_warn_count(), 2);

    /* Garbage. */
    write_file(add_meta, "hello\n", 6);
    load_expect(dir, ADD_SRC, NULL, CPU_JIT_COMPILED, 0);
    assert_int_equal(capture_warn_count(), 3);
    load_expect(dir, ADD_SRC, NULL, CPU_JIT_DISK, 0);
    rm_tree(dir);
}

/* A FIFO in place of the object or the record: the load returns (SIGALRM
 * ends a regression that waits for a writer), rebuilds and replaces it. */
static void test_fifo_entry_rebuilt(void **state)
{
    (void)state;
    char *dir = make_tmpdir();
    load_expect(dir, ADD_SRC, NULL, CPU_JIT_COMPILED, 0);
    cpu_jit *jit = make_jit(dir, NULL);
    char meta[512], so[512];
    entry_path(meta, sizeof meta, dir, cpu_jit_key(jit, ADD_SRC, NULL), "meta");
    entry_path(so, sizeof so, dir, cpu_jit_key(jit, ADD_SRC, NULL), "so");
    cpu_jit_destroy(jit);
    const char *const paths[] = {so, meta};
    for (int i = 0; i < 2; i++) {
        assert_int_equal(unlink(paths[i]), 0);
        assert_int_equal(mkfifo(paths[i], 0600), 0);
        alarm(20);
        load_expect(dir, ADD_SRC, NULL, CPU_JIT_COMPILED, 0);
        alarm(0);
        assert_int_equal(capture_warn_count(), i + 1);
        assert_non_null(strstr(capture_last_warn, "not a regular file"));
        struct stat st;
        assert_int_equal(lstat(paths[i], &st), 0);
        assert_true(S_ISREG(st.st_mode));
        load_expect(dir, ADD_SRC, NULL, CPU_JIT_DISK, 0);
    }
    rm_tree(dir);
}

/* Writes `bytes` as the entry for the key whose record is at `meta_path`
 * in the cache directory `dir`, through the disk cache itself: the record
 * is valid (it is written with the directory's secret) and describes the
 * bytes, as a writer holding the secret, or a bug, would leave it. The key
 * and the version tag are read from the record being replaced. */
static void rewrite_entry(const char *dir, const char *meta_path,
                          const char *ext, const unsigned char *bytes,
                          size_t len)
{
    size_t meta_len;
    char *meta = read_file(meta_path, &meta_len);
    char tag[256] = "";
    disk_cache_key key;
    memset(&key, 0, sizeof key);
    int found = 0;
    char *save = NULL;
    for (char *line = strtok_r(meta, "\n", &save); line;
         line = strtok_r(NULL, "\n", &save)) {
        if (!tag[0])
            snprintf(tag, sizeof tag, "%s", line);
        else if (sscanf(line, "key %16" SCNx64, &key.key) == 1)
            found |= 1;
        else if (sscanf(line, "material %16" SCNx64 "%16" SCNx64,
                        &key.material_high, &key.material_low) == 2)
            found |= 2;
    }
    free(meta);
    assert_int_equal(found, 3);
    snprintf(key.hex, sizeof key.hex, "%016" PRIx64, key.key);
    disk_cache *cache = NULL;
    assert_null(disk_cache_open(dir, "cpu", ext, tag, &cache));
    assert_non_null(disk_cache_path(cache));
    disk_cache_put(cache, &key, bytes, len);
    disk_cache_close(cache);
}

/* A valid record for another kernel's object: the record and the object
 * agree, so only the module itself can tell. It is never used: the load
 * rebuilds, the entry is replaced, and the next load comes from disk. */
static void test_forged_entry_rebuilt(void **state)
{
    (void)state;
    char *dir = make_tmpdir();
    load_expect(dir, ADD_SRC, NULL, CPU_JIT_COMPILED, 0);
    load_expect(dir, DELTA_SRC, "-DDELTA=1", CPU_JIT_COMPILED, 1);
    cpu_jit *jit = make_jit(dir, NULL);
    char add_meta[512], add_so[512], delta_so[512];
    uint64_t add_key = cpu_jit_key(jit, ADD_SRC, NULL);
    entry_path(add_meta, sizeof add_meta, dir, add_key, "meta");
    entry_path(add_so, sizeof add_so, dir, add_key, "so");
    entry_path(delta_so, sizeof delta_so, dir,
               cpu_jit_key(jit, DELTA_SRC, "-DDELTA=1"), "so");
    cpu_jit_destroy(jit);

    size_t len;
    char *delta = read_file(delta_so, &len);
    rewrite_entry(dir, add_meta, ".so", (unsigned char *)delta, len);
    assert_int_equal(capture_warn_count(), 0);

    load_expect(dir, ADD_SRC, NULL, CPU_JIT_COMPILED, 0);
    assert_int_equal(capture_warn_count(), 1);
    assert_non_null(strstr(capture_last_warn, "not the kernel"));
    /* Replaced by the real one. */
    size_t now_len;
    char *now = read_file(add_so, &now_len);
    assert_true(now_len != len || memcmp(now, delta, len) != 0);
    free(now);
    load_expect(dir, ADD_SRC, NULL, CPU_JIT_DISK, 0);
    assert_int_equal(capture_warn_count(), 1);
    free(delta);

    /* An object that quotes the entry's stamp in its bytes, but is another
     * kernel: it passes the first look, and the loaded module's own stamp
     * gives it away. */
    size_t add_len;
    char *add = read_file(add_so, &add_len);
    static const char prefix[] = "cubert-cpu-jit-stamp ";
    char *at = memmem(add, add_len, prefix, sizeof prefix - 1);
    assert_non_null(at);
    char decoy[512];
    snprintf(decoy, sizeof decoy,
             "const char *decoy_text = \"%s\";\n"
             "int add(int a, int b) { return a + b + 1; }\n",
             at);
    free(add);
    char *other = make_tmpdir();
    load_expect(other, decoy, NULL, CPU_JIT_COMPILED, 1);
    jit = make_jit(other, NULL);
    char decoy_so[512];
    entry_path(decoy_so, sizeof decoy_so, other, cpu_jit_key(jit, decoy, NULL),
               "so");
    cpu_jit_destroy(jit);
    char *bytes = read_file(decoy_so, &len);
    rewrite_entry(dir, add_meta, ".so", (unsigned char *)bytes, len);
    free(bytes);
    capture_reset();
    load_expect(dir, ADD_SRC, NULL, CPU_JIT_COMPILED, 0);
    assert_int_equal(capture_warn_count(), 1);
    assert_non_null(strstr(capture_last_warn, "names another entry"));
    load_expect(dir, ADD_SRC, NULL, CPU_JIT_DISK, 0);
    rm_tree(other);
    rm_tree(dir);
}

/* The same forgery by someone who can write the cache but not read its
 * secret: a record made in another cache directory does not verify here,
 * so the object is never even loaded. */
static void test_forged_entry_without_secret(void **state)
{
    (void)state;
    char *dir = make_tmpdir();
    char *other = make_tmpdir();
    load_expect(dir, ADD_SRC, NULL, CPU_JIT_COMPILED, 0);
    load_expect(other, DELTA_SRC, "-DDELTA=1", CPU_JIT_COMPILED, 1);
    load_expect(other, ADD_SRC, NULL, CPU_JIT_COMPILED, 0);
    cpu_jit *jit = make_jit(dir, NULL);
    uint64_t add_key = cpu_jit_key(jit, ADD_SRC, NULL);
    uint64_t delta_key = cpu_jit_key(jit, DELTA_SRC, "-DDELTA=1");
    cpu_jit_destroy(jit);
    char path[512], delta_so[512];
    entry_path(path, sizeof path, other, add_key, "meta");
    entry_path(delta_so, sizeof delta_so, other, delta_key, "so");
    size_t len;
    char *delta = read_file(delta_so, &len);
    /* In `other`, the entry for add now holds delta's object. */
    rewrite_entry(other, path, ".so", (unsigned char *)delta, len);
    free(delta);
    for (int i = 0; i < 2; i++) {
        const char *ext = i ? "meta" : "so";
        char from[512], to[512];
        entry_path(from, sizeof from, other, add_key, ext);
        entry_path(to, sizeof to, dir, add_key, ext);
        size_t n;
        char *data = read_file(from, &n);
        write_file(to, data, n);
        free(data);
    }
    load_expect(dir, ADD_SRC, NULL, CPU_JIT_COMPILED, 0);
    assert_int_equal(capture_warn_count(), 1);
    assert_non_null(strstr(capture_last_warn, "another secret"));
    load_expect(dir, ADD_SRC, NULL, CPU_JIT_DISK, 0);
    rm_tree(other);
    rm_tree(dir);
}

/* A secret changed in place is used, and nothing written with the old one
 * verifies: every entry is rebuilt. One that is not private is replaced. */
static void test_secret_tampered_rebuilds(void **state)
{
    (void)state;
    char *dir = make_tmpdir();
    load_expect(dir, ADD_SRC, NULL, CPU_JIT_COMPILED, 0);
    char secret[512];
    snprintf(secret, sizeof secret, "%s/" SECRET_NAME, dir);
    size_t len;
    char *bytes = read_file(secret, &len);
    assert_true(len > 0);
    bytes[0] ^= 0x5a;
    write_file(secret, bytes, len);
    free(bytes);
    load_expect(dir, ADD_SRC, NULL, CPU_JIT_COMPILED, 0);
    assert_int_equal(capture_warn_count(), 1);
    assert_non_null(strstr(capture_last_warn, "another secret"));
    load_expect(dir, ADD_SRC, NULL, CPU_JIT_DISK, 0);

    capture_reset();
    assert_int_equal(chmod(secret, 0640), 0);
    load_expect(dir, ADD_SRC, NULL, CPU_JIT_COMPILED, 0);
    assert_int_equal(capture_warn_count(), 2); /* the secret, the entry */
    struct stat st;
    assert_int_equal(stat(secret, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0600);
    load_expect(dir, ADD_SRC, NULL, CPU_JIT_DISK, 0);
    assert_int_equal(capture_warn_count(), 2);
    rm_tree(dir);
}

/* Through the public API: a launch whose cache entry was replaced by a
 * valid entry of another kernel compiles again and computes the right
 * answer, and the entry is replaced; later processes load the good one. */
static const char *const FILL_ONE =
    "CUBE_KERNEL(fill_one, CUBE_OUT(int, y))\n"
    "{\n"
    "    uint32_t i = ABSOLUTE_POS_X;\n"
    "    if (i < CUBE_LEN(y)) CUBE_AT(y, i) = 1;\n"
    "}\n";
static const char *const FILL_TWO =
    "CUBE_KERNEL(fill_two, CUBE_OUT(int, y))\n"
    "{\n"
    "    uint32_t i = ABSOLUTE_POS_X;\n"
    "    if (i < CUBE_LEN(y)) CUBE_AT(y, i) = 2;\n"
    "}\n";

/* Opens a CPU client on the cache root `root`, runs `name` from `source`
 * over 64 ints and returns y[0] and y[63] summed, or -1 when the launch
 * or the read fails. */
static int run_fill(const char *root, const char *name, const char *source)
{
    cube_client_options opts = cube_client_options_default();
    opts.cache_dir = root;
    cube_client *client = NULL;
    cube_error *err = cube_client_open("cpu", &opts, &client);
    if (err)
        fail_msg("open: %s", cube_error_message(err));
    cube_kernel_desc desc = {name, source, {64, 1, 1}};
    cube_kernel *kernel = NULL;
    assert_null(cube_kernel_create(&desc, &kernel));
    int y[64];
    memset(y, 0, sizeof y);
    cube_handle h;
    assert_null(cube_create(client, y, sizeof y, &h));
    cube_arg args[] = {cube_arg_buffer(h)};
    int result = -1;
    err = cube_launch(client, kernel, cube_count_static(1, 1, 1), args, 1,
                      CUBE_LAUNCH_EXECUTE);
    if (!err) {
        cube_copy_desc d = cube_copy_desc_contiguous(h, sizeof y, sizeof(int));
        void *dst[] = {y};
        uint64_t size[] = {sizeof y};
        err = cube_read(client, &d, dst, size, 1);
    }
    if (!err)
        result = y[0] + y[63];
    cube_error_free(err);
    cube_error_free(cube_handle_release(client, h));
    cube_kernel_release(kernel);
    cube_client_close(client);
    return result;
}

/* The one file in `dir` whose name ends in `ext`. */
static void only_file(const char *dir, const char *ext, char *out, size_t size)
{
    DIR *d = opendir(dir);
    assert_non_null(d);
    int n = 0;
    struct dirent *ent;
    size_t el = strlen(ext);
    while ((ent = readdir(d)) != NULL) {
        size_t l = strlen(ent->d_name);
        if (l > el && ent->d_name[0] != '.' &&
            strcmp(ent->d_name + l - el, ext) == 0) {
            snprintf(out, size, "%s/%s", dir, ent->d_name);
            n++;
        }
    }
    closedir(d);
    assert_int_equal(n, 1);
}

/* Through the public API, with CUBERT_CPU_CFLAGS set: a checked launch is
 * compiled with CUBE_CHECKED=1 whatever the variable says, and a kernel
 * that calls a function nothing defines is a compile error with the log. */
static const char *const WHICH_CHECK =
    "CUBE_KERNEL(which_check, CUBE_OUT(int, y))\n"
    "{\n"
    "    uint32_t i = ABSOLUTE_POS_X;\n"
    "    if (i < CUBE_LEN(y)) CUBE_AT(y, i) = 10 + CUBE_CHECKED;\n"
    "}\n";
static const char *const CALLS_NOTHING =
    "int cube_test_defined_nowhere(unsigned);\n"
    "CUBE_KERNEL(calls_nothing, CUBE_OUT(int, y))\n"
    "{\n"
    "    uint32_t i = ABSOLUTE_POS_X;\n"
    "    if (i < CUBE_LEN(y)) CUBE_AT(y, i) = cube_test_defined_nowhere(i);\n"
    "}\n";

static void test_launch_flags_and_undefined_symbols(void **state)
{
    (void)state;
    char *root = make_tmpdir();
    saved_env f = env_set("CUBERT_CPU_CFLAGS", "-DCUBE_CHECKED=0");
    cube_client_options opts = cube_client_options_default();
    opts.cache_dir = root;
    cube_client *client = NULL;
    assert_null(cube_client_open("cpu", &opts, &client));
    cube_kernel_desc desc = {"which_check", WHICH_CHECK, {16, 1, 1}};
    cube_kernel *kernel = NULL;
    assert_null(cube_kernel_create(&desc, &kernel));
    int y[16];
    cube_handle h;
    assert_null(cube_empty(client, sizeof y, &h));
    cube_arg args[] = {cube_arg_buffer(h)};
    cube_copy_desc d = cube_copy_desc_contiguous(h, sizeof y, sizeof(int));
    void *dst[] = {y};
    uint64_t size[] = {sizeof y};
    for (int checked = 0; checked < 2; checked++) {
        assert_null(
            cube_launch(client, kernel, cube_count_static(1, 1, 1), args, 1,
                        checked ? CUBE_LAUNCH_CHECKED : CUBE_LAUNCH_EXECUTE));
        assert_null(cube_read(client, &d, dst, size, 1));
        assert_int_equal(y[0], 10 + checked);
        assert_int_equal(y[15], 10 + checked);
    }
    cube_kernel_release(kernel);

    cube_kernel_desc bad = {"calls_nothing", CALLS_NOTHING, {16, 1, 1}};
    assert_null(cube_kernel_create(&bad, &kernel));
    cube_error *err = cube_launch(client, kernel, cube_count_static(1, 1, 1),
                                  args, 1, CUBE_LAUNCH_EXECUTE);
    assert_int_equal(cube_error_code(err), CUBE_ERR_COMPILE);
    const char *log = cube_error_log(err);
    if (!log || !strstr(log, "cube_test_defined_nowhere"))
        fail_msg("the log does not name the symbol: %s", log ? log : "(none)");
    cube_error_free(err);
    cube_kernel_release(kernel);
    cube_error_free(cube_handle_release(client, h));
    cube_client_close(client);
    env_restore(f);
    rm_tree(root);
}

static void test_forged_entry_launch(void **state)
{
    (void)state;
    char *root_one = make_tmpdir();
    char *root_two = make_tmpdir();
    assert_int_equal(run_fill(root_one, "fill_one", FILL_ONE), 2);
    assert_int_equal(run_fill(root_two, "fill_two", FILL_TWO), 4);
    char dir_one[512], dir_two[512], meta_one[600], so_one[600], so_two[600];
    snprintf(dir_one, sizeof dir_one, "%s/cpu", root_one);
    snprintf(dir_two, sizeof dir_two, "%s/cpu", root_two);
    only_file(dir_one, ".meta", meta_one, sizeof meta_one);
    only_file(dir_one, ".so", so_one, sizeof so_one);
    only_file(dir_two, ".so", so_two, sizeof so_two);
    size_t len;
    char *two = read_file(so_two, &len);
    rewrite_entry(dir_one, meta_one, ".so", (unsigned char *)two, len);

    capture_reset();
    for (int i = 0; i < 2; i++)
        assert_int_equal(run_fill(root_one, "fill_one", FILL_ONE), 2);
    assert_int_equal(capture_warn_count(), 1);
    assert_non_null(strstr(capture_last_warn, "not the kernel"));
    size_t now_len;
    char *now = read_file(so_one, &now_len);
    assert_true(now_len != len || memcmp(now, two, len) != 0);
    free(now);
    free(two);
    rm_tree(root_one);
    rm_tree(root_two);
}

static void test_missing_meta_rebuilt(void **state)
{
    (void)state;
    char *dir = make_tmpdir();
    load_expect(dir, ADD_SRC, NULL, CPU_JIT_COMPILED, 0);
    cpu_jit *jit = make_jit(dir, NULL);
    char meta[512], so[512];
    entry_path(meta, sizeof meta, dir, cpu_jit_key(jit, ADD_SRC, NULL), "meta");
    entry_path(so, sizeof so, dir, cpu_jit_key(jit, ADD_SRC, NULL), "so");
    cpu_jit_destroy(jit);

    assert_int_equal(unlink(meta), 0);
    load_expect(dir, ADD_SRC, NULL, CPU_JIT_COMPILED, 0);
    load_expect(dir, ADD_SRC, NULL, CPU_JIT_DISK, 0);
    /* A meta without its object: rebuilt too. */
    assert_int_equal(unlink(so), 0);
    load_expect(dir, ADD_SRC, NULL, CPU_JIT_COMPILED, 0);
    load_expect(dir, ADD_SRC, NULL, CPU_JIT_DISK, 0);
    assert_int_equal(count_entries(dir), 2 + SECRET_FILES);
    rm_tree(dir);
}

static void test_syntax_error(void **state)
{
    (void)state;
    char *dir = make_tmpdir();
    cpu_jit *jit = make_jit(dir, NULL);
    cpu_module *m = (cpu_module *)&m; /* must be reset to NULL */
    cube_error *err = cpu_jit_load(
        jit, "int add(int a, int b) { return a + ; }\n", NULL, &m, NULL);
    assert_non_null(err);
    assert_null(m);
    assert_int_equal(cube_error_code(err), CUBE_ERR_COMPILE);
    assert_non_null(strstr(cube_error_message(err), "'cc'"));
    assert_non_null(strstr(cube_error_message(err), "status 1"));
    const char *log = cube_error_log(err);
    assert_non_null(log);
    assert_non_null(strstr(log, "error"));
    assert_non_null(strstr(log, "expected expression"));
    cube_error_free(err);
    assert_int_equal(count_entries(dir), SECRET_FILES);

    /* A bad flag is a compile error too. */
    err = cpu_jit_load(jit, ADD_SRC, "-fno-such-flag-at-all", &m, NULL);
    assert_int_equal(cube_error_code(err), CUBE_ERR_COMPILE);
    assert_non_null(strstr(cube_error_log(err), "no-such-flag"));
    cube_error_free(err);

    /* A function nothing defines: a compile error (the link refuses the
     * undefined symbol), with the linker's message as the log, as NVRTC
     * would report it on CUDA; not a failure to load. */
    err = cpu_jit_load(jit,
                       "int cubert_undefined_thing(void);\n"
                       "int add(int a, int b) "
                       "{ return a + b + cubert_undefined_thing(); }\n",
                       NULL, &m, NULL);
    assert_int_equal(cube_error_code(err), CUBE_ERR_COMPILE);
    assert_null(m);
    assert_non_null(cube_error_log(err));
    assert_non_null(strstr(cube_error_log(err), "cubert_undefined_thing"));
    cube_error_free(err);
    assert_int_equal(count_entries(dir), SECRET_FILES);

    /* The jit still works. */
    assert_null(cpu_jit_load(jit, ADD_SRC, NULL, &m, NULL));
    assert_int_equal(call_add(m, 1, 2), 3);
    cpu_module_close(m);
    cpu_jit_destroy(jit);
    rm_tree(dir);
}

/* The macros that carry the launch's meaning (CUBE_CHECKED) come from the
 * per-compile flags; cpu_cflags cannot redefine them. Its -D/-U of a CUBE_
 * macro is dropped with a warning, and the per-compile flags come last. */
static const char *const CHECKED_SRC =
    "#ifndef CUBE_CHECKED\n#define CUBE_CHECKED 7\n#endif\n"
    "#ifndef DELTA\n#define DELTA 0\n#endif\n"
    "int add(int a, int b) { return a + b + 100 * CUBE_CHECKED + DELTA; }\n";

static void test_cflags_cannot_redefine_cube_macros(void **state)
{
    (void)state;
    static const char *const cflags[] = {
        "-DCUBE_CHECKED=0 -DDELTA=1", "-DDELTA=1 -UCUBE_CHECKED",
        "-D CUBE_CHECKED=0 -DDELTA=1", "-DDELTA=1 -U CUBE_CHECKED",
        "-DDELTA=1\t-DCUBE_CHECKED"};
    for (size_t i = 0; i < sizeof cflags / sizeof cflags[0]; i++) {
        char *dir = make_tmpdir();
        capture_reset();
        cpu_jit *jit = make_jit(dir, cflags[i]);
        assert_int_equal(capture_warn_count(), 1);
        assert_non_null(strstr(capture_last_warn, "CUBE_CHECKED"));
        for (int checked = 0; checked < 2; checked++) {
            cpu_module *m = NULL;
            cube_error *err = cpu_jit_load(
                jit, CHECKED_SRC,
                checked ? "-DCUBE_CHECKED=1" : "-DCUBE_CHECKED=0", &m, NULL);
            if (err)
                fail_msg("%s: %s\n%s", cflags[i], cube_error_message(err),
                         cube_error_log(err) ? cube_error_log(err) : "");
            /* The launch's value, and the rest of cpu_cflags still used. */
            assert_int_equal(call_add(m, 2, 3), 5 + 100 * checked + 1);
            cpu_module_close(m);
        }
        cpu_jit_destroy(jit);
        assert_int_equal(capture_warn_count(), 1);
        rm_tree(dir);
    }
    /* Other macros are the user's, even CUBE without the underscore. */
    char *dir = make_tmpdir();
    capture_reset();
    cpu_jit *jit = make_jit(dir, "-DCUBEX_CHECKED=1 -DCUBE -DDELTA=2");
    assert_int_equal(capture_warn_count(), 0);
    cpu_jit_destroy(jit);
    rm_tree(dir);
}

static void test_missing_compiler(void **state)
{
    (void)state;
    char *dir = make_tmpdir();
    cpu_jit_options opts = {
        .cc = "/nonexistent/cc", .cflags = NULL, .cache_dir = dir};
    cpu_jit *jit = NULL;
    assert_null(cpu_jit_create(&opts, &jit));
    assert_non_null(jit);
    assert_true(capture_warn_count() >= 1); /* cannot identify it */
    for (int i = 0; i < 2; i++) {
        cpu_module *m = NULL;
        cube_error *err = cpu_jit_load(jit, ADD_SRC, NULL, &m, NULL);
        assert_int_equal(cube_error_code(err), CUBE_ERR_IO);
        assert_non_null(strstr(cube_error_message(err), "/nonexistent/cc"));
        assert_null(m);
        cube_error_free(err);
    }
    assert_true(cpu_jit_key(jit, ADD_SRC, NULL) != 0);
    cpu_jit_destroy(jit);
    /* A compiler that cannot be identified leaves the disk cache off. */
    assert_int_equal(count_entries(dir), 0);
    /* Nothing broke for a good compiler on the same cache. */
    load_expect(dir, ADD_SRC, NULL, CPU_JIT_COMPILED, 0);
    rm_tree(dir);
}

/* A compiler that dies of a signal, or fails without a word, failed for
 * the machine, not for the source: CUBE_ERR_IO naming the signal, never
 * CUBE_ERR_COMPILE. `cc` answers --version, then runs `body`. */
static void expect_machine_failure(const char *body, const char *needle)
{
    char *dir = make_tmpdir();
    char cc[512], script[1024];
    snprintf(cc, sizeof cc, "%s/dying-cc", dir);
    int n = snprintf(script, sizeof script,
                     "#!/bin/sh\n"
                     "if [ \"$1\" = --version ]; then echo dying-cc 1; "
                     "exit 0; fi\n%s\n",
                     body);
    write_file(cc, script, (size_t)n);
    assert_int_equal(chmod(cc, 0700), 0);
    cpu_jit_options opts = {.cc = cc, .cflags = NULL, .cache_dir = dir};
    cpu_jit *jit = NULL;
    assert_null(cpu_jit_create(&opts, &jit));
    cpu_module *m = NULL;
    cube_error *err = cpu_jit_load(jit, ADD_SRC, NULL, &m, NULL);
    assert_null(m);
    if (!err || cube_error_code(err) != CUBE_ERR_IO)
        fail_msg("%s: expected CUBE_ERR_IO, got %s: %s", body,
                 err ? cube_code_name(cube_error_code(err)) : "success",
                 err ? cube_error_message(err) : "");
    if (!strstr(cube_error_message(err), needle))
        fail_msg("'%s' does not name '%s'", cube_error_message(err), needle);
    assert_non_null(strstr(cube_error_message(err), "dying-cc"));
    cube_error_free(err);
    cpu_jit_destroy(jit);
    rm_tree(dir);
}

static void test_compiler_killed_is_io(void **state)
{
    (void)state;
    expect_machine_failure("kill -KILL $$", "signal 9 (SIGKILL)");
    expect_machine_failure("kill -SEGV $$", "signal 11 (SIGSEGV)");
    expect_machine_failure("exit 1", "no diagnostics");
    expect_machine_failure(
        "echo 'gcc: fatal error: Killed signal terminated program cc1'; "
        "exit 1",
        "status 1");
}

/* Opens a jit on `dir` with compiler `cc` (NULL: the default), expecting
 * the warning that its disk cache is off because `what` cannot be
 * identified; two loads both compile and nothing reaches `dir`. */
static void expect_no_disk_cache(const char *dir, const char *cc,
                                 const char *what)
{
    for (int round = 0; round < 2; round++) {
        capture_reset();
        cpu_jit_options opts = {.cc = cc, .cflags = NULL, .cache_dir = dir};
        cpu_jit *jit = NULL;
        assert_null(cpu_jit_create(&opts, &jit));
        assert_int_equal(capture_warn_count(), 1);
        assert_non_null(strstr(capture_last_warn, "disk cache is off"));
        assert_non_null(strstr(capture_last_warn, what));
        cpu_module *m = NULL;
        cpu_jit_origin origin = CPU_JIT_DISK;
        cube_error *err = cpu_jit_load(jit, ADD_SRC, NULL, &m, &origin);
        if (err)
            fail_msg("load failed: %s", cube_error_message(err));
        assert_int_equal(origin, CPU_JIT_COMPILED);
        assert_int_equal(call_add(m, 2, 3), 5);
        cpu_module_close(m);
        cpu_jit_destroy(jit);
        assert_int_equal(capture_warn_count(), 1);
        assert_int_equal(count_entries(dir), 0);
    }
}

/* The key names the CPU and the compiler; when either cannot be
 * identified there is no disk cache (an entry could be another machine's
 * or another compiler's), with one warning, and kernels still compile. */
static void test_unknown_identity_disables_disk_cache(void **state)
{
    (void)state;
    char *dir = make_tmpdir();
    fail_cpuinfo = 1;
    expect_no_disk_cache(dir, NULL, "/proc/cpuinfo");
    fail_cpuinfo = 0;

    char cc[512];
    static const char script[] = "#!/bin/sh\n"
                                 "if [ \"$1\" = --version ]; then exit 1; fi\n"
                                 "exec cc \"$@\"\n";
    char *bin = make_tmpdir();
    snprintf(cc, sizeof cc, "%s/mute-cc", bin);
    write_file(cc, script, sizeof script - 1);
    assert_int_equal(chmod(cc, 0700), 0);
    expect_no_disk_cache(dir, cc, "--version");
    rm_tree(bin);

    /* Identified, the same directory caches again. */
    load_expect(dir, ADD_SRC, NULL, CPU_JIT_COMPILED, 0);
    load_expect(dir, ADD_SRC, NULL, CPU_JIT_DISK, 0);
    rm_tree(dir);
}

static void test_flags_change_key(void **state)
{
    (void)state;
    char *dir = make_tmpdir();
    cpu_jit *jit = make_jit(dir, NULL);
    uint64_t plain = cpu_jit_key(jit, DELTA_SRC, NULL);
    assert_int_equal(plain, cpu_jit_key(jit, DELTA_SRC, ""));
    assert_int_not_equal(plain, cpu_jit_key(jit, DELTA_SRC, "-DDELTA=5"));
    assert_int_not_equal(cpu_jit_key(jit, DELTA_SRC, "-DDELTA=5"),
                         cpu_jit_key(jit, DELTA_SRC, "-DDELTA=6"));
    assert_int_not_equal(plain, cpu_jit_key(jit, ADD_SRC, NULL));
    /* Fields are separated: moving text from flags into source differs. */
    assert_int_not_equal(cpu_jit_key(jit, "ab", "c"),
                         cpu_jit_key(jit, "a", "bc"));
    assert_int_equal(cpu_jit_key(NULL, ADD_SRC, NULL), 0);
    assert_int_equal(cpu_jit_key(jit, NULL, NULL), 0);

    /* Deterministic across jits with the same configuration. */
    cpu_jit *again = make_jit(dir, NULL);
    assert_int_equal(plain, cpu_jit_key(again, DELTA_SRC, NULL));
    cpu_jit_destroy(again);
    /* Option flags are part of the key too. */
    cpu_jit *opt = make_jit(dir, "-DDELTA=100");
    assert_int_not_equal(plain, cpu_jit_key(opt, DELTA_SRC, NULL));

    /* The flags reach the compiler and the cache keeps them apart. */
    load_expect(dir, DELTA_SRC, "-DDELTA=5", CPU_JIT_COMPILED, 5);
    load_expect(dir, DELTA_SRC, NULL, CPU_JIT_COMPILED, 0);
    load_expect(dir, DELTA_SRC, "  -DDELTA=6\t-O1 ", CPU_JIT_COMPILED, 6);
    load_expect(dir, DELTA_SRC, "-DDELTA=5", CPU_JIT_DISK, 5);
    cpu_module *m = NULL;
    cpu_jit_origin origin;
    assert_null(cpu_jit_load(opt, DELTA_SRC, NULL, &m, &origin));
    assert_int_equal(origin, CPU_JIT_COMPILED);
    assert_int_equal(call_add(m, 2, 3), 105);
    cpu_module_close(m);
    cpu_jit_destroy(opt);
    cpu_jit_destroy(jit);
    rm_tree(dir);
}

static void test_no_disk_cache(void **state)
{
    (void)state;
    char *tmp = make_tmpdir();
    char *env_cache = make_tmpdir();
    saved_env t = env_set("TMPDIR", tmp);
    saved_env c = env_set("CUBERT_CACHE_DIR", env_cache);
    cpu_jit *jit = make_jit("", NULL);
    for (int i = 0; i < 2; i++) {
        cpu_module *m = NULL;
        cpu_jit_origin origin = CPU_JIT_DISK;
        assert_null(cpu_jit_load(jit, ADD_SRC, NULL, &m, &origin));
        assert_int_equal(origin, CPU_JIT_COMPILED);
        /* The object is already unlinked while the module is loaded. */
        assert_int_equal(count_entries(tmp), 0);
        assert_int_equal(call_add(m, 20, 22), 42);
        cpu_module_close(m);
    }
    /* A failed compile cleans up too. */
    cpu_module *m = NULL;
    cube_error *err = cpu_jit_load(jit, "syntax error", NULL, &m, NULL);
    assert_int_equal(cube_error_code(err), CUBE_ERR_COMPILE);
    cube_error_free(err);
    cpu_jit_destroy(jit);
    env_restore(c);
    env_restore(t);
    assert_int_equal(count_entries(tmp), 0);
    assert_int_equal(count_entries(env_cache), 0);
    assert_int_equal(capture_warn_count(), 0);
    rm_tree(tmp);
    rm_tree(env_cache);
}

static void test_default_cache_dir_from_env(void **state)
{
    (void)state;
    char *base = make_tmpdir();
    saved_env c = env_set("CUBERT_CACHE_DIR", base);
    cpu_jit *jit = NULL;
    assert_null(cpu_jit_create(NULL, &jit));
    cpu_module *m = NULL;
    assert_null(cpu_jit_load(jit, ADD_SRC, NULL, &m, NULL));
    assert_int_equal(call_add(m, 1, 1), 2);
    cpu_module_close(m);
    char path[600], sub[512];
    snprintf(sub, sizeof sub, "%s/cpu", base);
    entry_path(path, sizeof path, sub, cpu_jit_key(jit, ADD_SRC, NULL), "so");
    assert_true(file_exists(path));
    struct stat st;
    assert_int_equal(stat(sub, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0700);
    cpu_jit_destroy(jit);
    env_restore(c);
    rm_tree(base);
}

static void test_nested_cache_dir_created(void **state)
{
    (void)state;
    char *base = make_tmpdir();
    char nested[512];
    snprintf(nested, sizeof nested, "%s/a/b/c/", base);
    load_expect(nested, ADD_SRC, NULL, CPU_JIT_COMPILED, 0);
    load_expect(nested, ADD_SRC, NULL, CPU_JIT_DISK, 0);
    assert_int_equal(count_entries(nested), 2 + SECRET_FILES);
    assert_int_equal(capture_warn_count(), 0);
    rm_tree(base);
}

static void test_insecure_cache_dir_refused(void **state)
{
    (void)state;
    char *dir = make_tmpdir();
    assert_int_equal(chmod(dir, 0777), 0);
    cpu_jit *jit = make_jit(dir, NULL);
    assert_int_equal(capture_warn_count(), 1);
    assert_non_null(strstr(capture_last_warn, "disk cache disabled"));
    assert_non_null(strstr(capture_last_warn, "writable"));
    for (int i = 0; i < 2; i++) {
        cpu_module *m = NULL;
        cpu_jit_origin origin = CPU_JIT_DISK;
        assert_null(cpu_jit_load(jit, ADD_SRC, NULL, &m, &origin));
        assert_int_equal(origin, CPU_JIT_COMPILED);
        assert_int_equal(call_add(m, 2, 2), 4);
        cpu_module_close(m);
    }
    cpu_jit_destroy(jit);
    assert_int_equal(count_entries(dir), 0);

    /* A symbolic link to a good directory is refused as well. */
    assert_int_equal(chmod(dir, 0700), 0);
    char *real = make_tmpdir();
    char link[512];
    snprintf(link, sizeof link, "%s/link", dir);
    assert_int_equal(symlink(real, link), 0);
    capture_reset();
    jit = make_jit(link, NULL);
    assert_int_equal(capture_warn_count(), 1);
    assert_non_null(strstr(capture_last_warn, "symbolic link"));
    cpu_module *m = NULL;
    assert_null(cpu_jit_load(jit, ADD_SRC, NULL, &m, NULL));
    assert_int_equal(call_add(m, 2, 2), 4);
    cpu_module_close(m);
    cpu_jit_destroy(jit);
    assert_int_equal(count_entries(real), 0);
    rm_tree(real);
    rm_tree(dir);
}

/* CUBERT_CACHE_DIR names the root; the CPU backend's folder is <root>/cpu.
 * A root open to the group, or a symbolic link, is refused like the folder
 * would be: the jit still works, without a disk cache. */
static void expect_root_refused(const char *root, const char *says)
{
    saved_env c = env_set("CUBERT_CACHE_DIR", root);
    capture_reset();
    cpu_jit *jit = NULL;
    assert_null(cpu_jit_create(NULL, &jit));
    assert_int_equal(capture_warn_count(), 1);
    assert_non_null(strstr(capture_last_warn, "disk cache disabled"));
    assert_non_null(strstr(capture_last_warn, root));
    assert_non_null(strstr(capture_last_warn, says));
    cpu_module *m = NULL;
    cpu_jit_origin origin = CPU_JIT_DISK;
    assert_null(cpu_jit_load(jit, ADD_SRC, NULL, &m, &origin));
    assert_int_equal(origin, CPU_JIT_COMPILED);
    assert_int_equal(call_add(m, 2, 2), 4);
    cpu_module_close(m);
    cpu_jit_destroy(jit);
    env_restore(c);
}

static void test_insecure_cache_root_refused(void **state)
{
    (void)state;
    char *root = make_tmpdir();
    assert_int_equal(chmod(root, 0770), 0);
    expect_root_refused(root, "writable");
    assert_int_equal(count_entries(root), 0);

    assert_int_equal(chmod(root, 0700), 0);
    char *holder = make_tmpdir();
    char link[512];
    snprintf(link, sizeof link, "%s/link", holder);
    assert_int_equal(symlink(root, link), 0);
    expect_root_refused(link, "symbolic link");
    assert_int_equal(count_entries(root), 0);
    rm_tree(holder);
    rm_tree(root);
}

static void test_null_arguments(void **state)
{
    (void)state;
    char *dir = make_tmpdir();
    cube_error *err = cpu_jit_create(NULL, NULL);
    assert_int_equal(cube_error_code(err), CUBE_ERR_INVALID_ARGUMENT);
    cube_error_free(err);

    cpu_jit *jit = make_jit(dir, NULL);
    cpu_module *m = NULL;
    err = cpu_jit_load(NULL, ADD_SRC, NULL, &m, NULL);
    assert_int_equal(cube_error_code(err), CUBE_ERR_INVALID_ARGUMENT);
    cube_error_free(err);
    err = cpu_jit_load(jit, NULL, NULL, &m, NULL);
    assert_int_equal(cube_error_code(err), CUBE_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(cube_error_message(err), "source"));
    cube_error_free(err);
    err = cpu_jit_load(jit, ADD_SRC, NULL, NULL, NULL);
    assert_int_equal(cube_error_code(err), CUBE_ERR_INVALID_ARGUMENT);
    cube_error_free(err);
    assert_null(m);

    assert_null(cpu_module_symbol(NULL, "add"));
    cpu_module_close(NULL);
    cpu_jit_destroy(NULL);
    cpu_jit_destroy(jit);
    assert_int_equal(count_entries(dir), SECRET_FILES);
    rm_tree(dir);
}

static void test_modules_independent(void **state)
{
    (void)state;
    char *dir = make_tmpdir();
    cpu_jit *jit = make_jit(dir, NULL);
    cpu_module *a = NULL, *b = NULL, *c = NULL;
    cpu_jit_origin oa, ob, oc;
    assert_null(cpu_jit_load(jit, COUNTER_SRC, NULL, &a, &oa));
    assert_null(cpu_jit_load(jit, COUNTER_SRC, NULL, &b, &ob));
    assert_null(cpu_jit_load(jit, COUNTER_SRC, NULL, &c, &oc));
    assert_int_equal(oa, CPU_JIT_COMPILED);
    assert_int_equal(ob, CPU_JIT_DISK);
    assert_int_equal(oc, CPU_JIT_DISK);
    assert_int_equal(call_bump(a), 1);
    assert_int_equal(call_bump(a), 2);
    assert_int_equal(call_bump(b), 1);
    assert_int_equal(call_bump(c), 1);
    cpu_module_close(b);
    assert_int_equal(call_bump(a), 3);
    assert_int_equal(call_bump(c), 2);
    cpu_module_close(a);
    cpu_module_close(c);
    cpu_jit_destroy(jit);
    rm_tree(dir);
}

static void test_logging(void **state)
{
    (void)state;
    char *dir = make_tmpdir();
    cube_log_level old = cube_log_get_level();
    cube_log_set_level(CUBE_LOG_TRACE);
    load_expect(dir, ADD_SRC, NULL, CPU_JIT_COMPILED, 0);
    cube_log_set_level(old);
    pthread_mutex_lock(&capture_lock);
    int trace = capture_trace_source, debug = capture_debug_compiled;
    pthread_mutex_unlock(&capture_lock);
    assert_int_equal(trace, 1);
    assert_int_equal(debug, 1);
    rm_tree(dir);
}

#define THREADS 8

typedef struct thread_arg {
    cpu_jit *jit;
    const char *dir; /* non-NULL: each thread makes its own jit */
    int ok;
    cpu_jit_origin origin;
} thread_arg;

static void *thread_load(void *p)
{
    thread_arg *arg = p;
    cpu_jit *jit = arg->jit;
    if (arg->dir) {
        cpu_jit_options opts = {
            .cc = NULL, .cflags = NULL, .cache_dir = arg->dir};
        cube_error *err = cpu_jit_create(&opts, &jit);
        if (err) {
            cube_error_free(err);
            return NULL;
        }
    }
    cpu_module *m = NULL;
    cube_error *err = cpu_jit_load(jit, ADD_SRC, NULL, &m, &arg->origin);
    if (!err) {
        void *sym = cpu_module_symbol(m, "add");
        int (*fn)(int, int) = NULL;
        if (sym)
            memcpy(&fn, &sym, sizeof fn);
        arg->ok = fn && fn(19, 23) == 42;
        cpu_module_close(m);
    }
    cube_error_free(err);
    if (arg->dir)
        cpu_jit_destroy(jit);
    return NULL;
}

static void run_threads(cpu_jit *jit, const char *dir, thread_arg *args)
{
    pthread_t threads[THREADS];
    for (int i = 0; i < THREADS; i++) {
        args[i] = (thread_arg){
            .jit = jit, .dir = dir, .ok = 0, .origin = (cpu_jit_origin)-1};
        assert_int_equal(
            pthread_create(&threads[i], NULL, thread_load, &args[i]), 0);
    }
    for (int i = 0; i < THREADS; i++) {
        assert_int_equal(pthread_join(threads[i], NULL), 0);
        assert_true(args[i].ok);
    }
}

static void test_threads(void **state)
{
    (void)state;
    char *dir = make_tmpdir();
    thread_arg args[THREADS];

    /* One shared jit, cold cache: every load succeeds. */
    cpu_jit *jit = make_jit(dir, NULL);
    run_threads(jit, NULL, args);
    /* Warm cache: all from disk. */
    run_threads(jit, NULL, args);
    for (int i = 0; i < THREADS; i++)
        assert_int_equal(args[i].origin, CPU_JIT_DISK);
    cpu_jit_destroy(jit);

    /* Separate jits (as separate processes would be), cold cache. */
    char *dir2 = make_tmpdir();
    run_threads(NULL, dir2, args);
    assert_int_equal(count_entries(dir2), 2 + SECRET_FILES);
    load_expect(dir2, ADD_SRC, NULL, CPU_JIT_DISK, 0);

    assert_int_equal(capture_warn_count(), 0);
    assert_int_equal(count_entries(dir), 2 + SECRET_FILES);
    rm_tree(dir);
    rm_tree(dir2);
}

int main(void)
{
    cube_log_set_sink(capture_sink, NULL);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_compile_and_call, setup),
        cmocka_unit_test_setup(test_disk_hit, setup),
        cmocka_unit_test_setup(test_flipped_byte_rebuilt, setup),
        cmocka_unit_test_setup(test_truncated_rebuilt, setup),
        cmocka_unit_test_setup(test_foreign_meta_rebuilt, setup),
        cmocka_unit_test_setup(test_missing_meta_rebuilt, setup),
        cmocka_unit_test_setup(test_forged_entry_rebuilt, setup),
        cmocka_unit_test_setup(test_forged_entry_without_secret, setup),
        cmocka_unit_test_setup(test_secret_tampered_rebuilds, setup),
        cmocka_unit_test_setup(test_forged_entry_launch, setup),
        cmocka_unit_test_setup(test_fifo_entry_rebuilt, setup),
        cmocka_unit_test_setup(test_syntax_error, setup),
        cmocka_unit_test_setup(test_missing_compiler, setup),
        cmocka_unit_test_setup(test_compiler_killed_is_io, setup),
        cmocka_unit_test_setup(test_unknown_identity_disables_disk_cache,
                               setup),
        cmocka_unit_test_setup(test_cflags_cannot_redefine_cube_macros, setup),
        cmocka_unit_test_setup(test_launch_flags_and_undefined_symbols, setup),
        cmocka_unit_test_setup(test_flags_change_key, setup),
        cmocka_unit_test_setup(test_no_disk_cache, setup),
        cmocka_unit_test_setup(test_default_cache_dir_from_env, setup),
        cmocka_unit_test_setup(test_nested_cache_dir_created, setup),
        cmocka_unit_test_setup(test_insecure_cache_dir_refused, setup),
        cmocka_unit_test_setup(test_insecure_cache_root_refused, setup),
        cmocka_unit_test_setup(test_null_arguments, setup),
        cmocka_unit_test_setup(test_modules_independent, setup),
        cmocka_unit_test_setup(test_logging, setup),
        cmocka_unit_test_setup(test_threads, setup),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    cube_log_set_sink(NULL, NULL);
    return rc;
}
