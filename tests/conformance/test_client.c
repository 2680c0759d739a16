/* Clients, properties, backend names, errors and the logger. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "conformance.h"

/* The backend part of a device string ("cuda:1" -> "cuda"). */
static void backend_of(const char *device, char *out, size_t cap)
{
    size_t n = strcspn(device, ":");
    if (n >= cap)
        n = cap - 1;
    memcpy(out, device, n);
    out[n] = '\0';
}

CONF_TEST(client_open_named_backend_and_cpu_succeed)
{
    cube_client *c = NULL;
    CONF_OK(cube_client_open(conf.backend, NULL, &c));
    assert_non_null(c);
    cube_properties p;
    CONF_OK(cube_client_properties(c, &p));
    char want[32];
    backend_of(conf.backend, want, sizeof want);
    assert_string_equal(p.backend, want);
    cube_client_close(c);

    /* The CPU backend is always built and always runs. */
    c = NULL;
    CONF_OK(cube_client_open("cpu", NULL, &c));
    CONF_OK(cube_client_properties(c, &p));
    assert_string_equal(p.backend, "cpu");
    cube_client_close(c);
    c = NULL;
    CONF_OK(cube_client_open("cpu:0", NULL, &c));
    cube_client_close(c);

    cube_client_close(NULL); /* a no-op */
}

CONF_TEST(client_open_null_device_uses_default)
{
    const char *env = getenv("CUBERT_DEVICE");
    cube_client *c = NULL;
    cube_error *err = cube_client_open(NULL, NULL, &c);
    if (err && env && *env) {
        /* $CUBERT_DEVICE names the default; it may not run here. */
        assert_true(cube_error_code(err) == CUBE_ERR_UNAVAILABLE ||
                    cube_error_code(err) == CUBE_ERR_NOT_FOUND);
        cube_error_free(err);
        assert_null(c);
        return;
    }
    CONF_OK(err);
    assert_non_null(c);
    cube_properties p;
    CONF_OK(cube_client_properties(c, &p));
    if (!env || !*env)
        assert_string_equal(p.backend, "cpu");
    cube_client_close(c);
}

CONF_TEST(client_open_malformed_device_is_invalid_argument)
{
    static const char *const bad[] = {"",           ":0",      "cpu:x",
                                      "cpu:",       "cpu:0x1", "cpu:-1",
                                      "cuda:99999", "cpu:1:2"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cube_client *c = (cube_client *)&bad; /* must be reset to NULL */
        cube_error *err = cube_client_open(bad[i], NULL, &c);
        if (!err || cube_error_code(err) != CUBE_ERR_INVALID_ARGUMENT)
            print_error("device string '%s'\n", bad[i]);
        CONF_EXPECT(err, CUBE_ERR_INVALID_ARGUMENT);
        assert_null(c);
    }
    CONF_EXPECT_MSG(cube_client_open("cpu", NULL, NULL),
                    CUBE_ERR_INVALID_ARGUMENT, "out");
}

CONF_TEST(client_open_unknown_backend_or_index_is_not_found)
{
    cube_client *c = NULL;
    CONF_EXPECT_MSG(cube_client_open("nosuch", NULL, &c), CUBE_ERR_NOT_FOUND,
                    "nosuch");
    assert_null(c);
    /* The CPU backend has one device. */
    CONF_EXPECT(cube_client_open("cpu:1", NULL, &c), CUBE_ERR_NOT_FOUND);
    assert_null(c);
    CONF_EXPECT(cube_client_open("cpu:1024", NULL, &c), CUBE_ERR_NOT_FOUND);
    assert_null(c);
}

/* The same refusals for the backend under test as for "cpu" above: an
 * index it has no device for is NOT_FOUND naming the backend, a malformed
 * index or a name in another case is refused, and none opens a client. */
CONF_TEST(client_open_bad_index_of_the_backend_under_test_is_refused)
{
    char name[32], dev[64];
    backend_of(conf.backend, name, sizeof name);
    static const char *const malformed[] = {
        ":", ":x", ":-1", ":0x0", ":0:0", ": 0", ":+0", ":1025", ":0 ", ":\t0"};
    for (size_t i = 0; i < sizeof malformed / sizeof malformed[0]; i++) {
        snprintf(dev, sizeof dev, "%s%s", name, malformed[i]);
        cube_client *c = (cube_client *)&dev; /* must be reset to NULL */
        cube_error *err = cube_client_open(dev, NULL, &c);
        if (!err || cube_error_code(err) != CUBE_ERR_INVALID_ARGUMENT)
            print_error("device string '%s'\n", dev);
        CONF_EXPECT(err, CUBE_ERR_INVALID_ARGUMENT);
        assert_null(c);
    }
    /* No backend has 1025 devices; 1024 is a well-formed index. */
    cube_client *c = (cube_client *)&dev;
    snprintf(dev, sizeof dev, "%s:1024", name);
    CONF_EXPECT_MSG(cube_client_open(dev, NULL, &c), CUBE_ERR_NOT_FOUND, name);
    assert_null(c);
    /* Backend names are lower case: the upper-case name is no backend. */
    for (char *p = name; *p; p++)
        if (*p >= 'a' && *p <= 'z')
            *p = (char)(*p - 'a' + 'A');
    c = (cube_client *)&dev;
    CONF_EXPECT_MSG(cube_client_open(name, NULL, &c), CUBE_ERR_NOT_FOUND, name);
    assert_null(c);
}

CONF_TEST(client_open_bad_options_struct_size_is_invalid_argument)
{
    cube_client_options o = cube_client_options_default();
    assert_int_equal(o.struct_size, sizeof o);
    assert_int_equal(o.cpu_threads, 0);
    assert_null(o.cache_dir);
    cube_client *c = NULL;
    o.struct_size = 0;
    CONF_EXPECT_MSG(cube_client_open("cpu", &o, &c), CUBE_ERR_INVALID_ARGUMENT,
                    "struct_size");
    assert_null(c);
    o.struct_size = (uint32_t)sizeof o + 8;
    CONF_EXPECT_MSG(cube_client_open("cpu", &o, &c), CUBE_ERR_INVALID_ARGUMENT,
                    "struct_size");
    assert_null(c);
    o.struct_size = 0xFFFFFFFFu;
    CONF_EXPECT_MSG(cube_client_open("cpu", &o, &c), CUBE_ERR_INVALID_ARGUMENT,
                    "struct_size");
    assert_null(c);
}

/* The suite holds its device open, so this open shares its server: the
 * options it asks for are the open device's (0 and NULL take them). A
 * first open with options is tested where no client is open
 * (tests/unit/test_devices.c). */
CONF_TEST(client_open_with_options_works)
{
    cube_client_options o = cube_client_options_default();
    cube_client *c = NULL;
    CONF_OK(cube_client_open(conf.backend, &o, &c));
    assert_non_null(c);
    cube_properties p;
    CONF_OK(cube_client_properties(c, &p));
    assert_true(p.compute_units >= 1);
    /* A usable client: a buffer round trip. */
    unsigned char in[100], out[100];
    conf_pattern(in, sizeof in, 3);
    cube_handle h;
    CONF_OK(cube_create(c, in, sizeof in, &h));
    cube_copy_desc d = cube_copy_desc_contiguous(h, sizeof out, 1);
    void *dst[1] = {out};
    uint64_t size[1] = {sizeof out};
    CONF_OK(cube_read(c, &d, dst, size, 1));
    assert_memory_equal(in, out, sizeof in);
    CONF_OK(cube_handle_release(c, h));
    cube_client_close(c);
}

/* Every backend refuses the same values, whether it has CPU threads or
 * not: the range is checked before any backend sees the options. */
CONF_TEST(client_open_cpu_threads_out_of_range_is_invalid_argument)
{
    static const uint32_t bad[] = {CUBE_MAX_CPU_THREADS + 1u, 1u << 20,
                                   UINT32_MAX};
    cube_client_options o = cube_client_options_default();
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        o.cpu_threads = bad[i];
        cube_client *c = (cube_client *)&o; /* must be reset to NULL */
        cube_error *err = cube_client_open(conf.backend, &o, &c);
        char range[32];
        snprintf(range, sizeof range, "1..%u", CUBE_MAX_CPU_THREADS);
        const char *msg = err ? cube_error_message(err) : "";
        if (!strstr(msg, range))
            print_error("cpu_threads %u: '%s' does not name the range %s\n",
                        bad[i], msg, range);
        assert_non_null(strstr(msg, range));
        CONF_EXPECT_MSG(err, CUBE_ERR_INVALID_ARGUMENT, "cpu_threads");
        assert_null(c);
    }
    /* Values in the range open (0: the default) where the threads do not
     * shape the device; where they do, the device the suite holds open
     * has its threads already, and another number is refused as a
     * conflict with it, naming the option, not the range. */
    int shaped = conf_backend_note("cpu_threads_shape_the_device") != NULL;
    static const uint32_t good[] = {0, 1, 2};
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        o.cpu_threads = good[i];
        cube_client *c = NULL;
        cube_error *err = cube_client_open(conf.backend, &o, &c);
        if (err && good[i] && shaped) {
            CONF_EXPECT_MSG(err, CUBE_ERR_INVALID_ARGUMENT, "already open");
            assert_null(c);
            continue;
        }
        CONF_OK(err);
        assert_non_null(c);
        cube_client_close(c);
    }
}

CONF_TEST(client_close_frees_what_the_caller_did_not_release)
{
    /* Buffers, slices, extra references, staging buffers, compiled kernels
     * and a pending future's pins: all go with the client (ASan's leak
     * check is the judge). */
    cube_client *c = NULL;
    CONF_OK(cube_client_open(conf.backend, NULL, &c));
    unsigned char bytes[256];
    conf_pattern(bytes, sizeof bytes, 5);
    cube_handle a, b, s;
    CONF_OK(cube_create(c, bytes, sizeof bytes, &a));
    CONF_OK(cube_empty(c, 1u << 16, &b));
    CONF_OK(cube_handle_slice(c, a, 8, 8, &s));
    CONF_OK(cube_handle_retain(c, b));
    uint64_t size[1] = {128};
    void *stage[1] = {NULL};
    CONF_OK(cube_staging(c, size, 1, stage));
    /* Where no kernel runs, the launch leaves a failed cache entry and a
     * failure record instead of a compiled kernel: those go too. */
    cube_arg args[2] = {cube_arg_buffer(b), cube_arg_u32(1)};
    cube_error *err = cube_launch(c, conf.k.fill, cube_count_static(4, 1, 1),
                                  args, 2, CUBE_LAUNCH_EXECUTE);
    if (conf_runs_kernels())
        CONF_OK(err);
    else
        CONF_EXPECT(err, CUBE_ERR_UNSUPPORTED);
    cube_client_close(c);
}

/* Starts a read of `size` bytes of `h` on `c` into `dst`. */
static cube_future *start_read(cube_client *c, cube_handle h, void *dst,
                               uint64_t size)
{
    cube_copy_desc d = cube_copy_desc_contiguous(h, size, 1);
    void *dsts[1] = {dst};
    uint64_t sizes[1] = {size};
    cube_future *f = NULL;
    CONF_OK(cube_read_async(c, &d, dsts, sizes, 1, &f));
    assert_non_null(f);
    return f;
}

/* A future not waited on when its client closes: close completes the read
 * (the destination holds the bytes) and the future outlives the client;
 * waiting on it or freeing it later touches nothing of the client. */
CONF_TEST(client_close_completes_outstanding_futures)
{
    cube_client *c = NULL;
    CONF_OK(cube_client_open(conf.backend, NULL, &c));
    unsigned char bytes[4096], got[4096], got2[4096];
    conf_pattern(bytes, sizeof bytes, 11);
    memset(got, 0, sizeof got);
    cube_handle h;
    CONF_OK(cube_create(c, bytes, sizeof bytes, &h));
    cube_future *f = start_read(c, h, got, sizeof got);
    cube_future *unwaited = start_read(c, h, got2, sizeof got2);
    cube_client_close(c);
    assert_int_equal(cube_future_ready(f), 1);
    CONF_OK(cube_future_wait(f));
    assert_memory_equal(got, bytes, sizeof bytes);
    CONF_OK(cube_future_wait(f)); /* a second wait: nothing more */
    cube_future_free(f);
    cube_future_free(unwaited);
    assert_memory_equal(got2, bytes, sizeof bytes);
}

typedef struct future_waiter {
    cube_future *f;
    cube_error *err;
} future_waiter;

static void *wait_future(void *arg)
{
    future_waiter *w = arg;
    w->err = cube_future_wait(w->f);
    cube_future_free(w->f);
    return NULL;
}

/* One thread waits on a future while another closes its client: whichever
 * completes the read, the wait answers it and nothing freed is touched
 * (the sanitizer builds judge). */
CONF_TEST(client_close_while_another_thread_waits_on_a_future)
{
    unsigned char bytes[1 << 14], got[1 << 14];
    conf_pattern(bytes, sizeof bytes, 12);
    for (int round = 0; round < 40; round++) {
        cube_client *c = NULL;
        CONF_OK(cube_client_open(conf.backend, NULL, &c));
        cube_handle h;
        CONF_OK(cube_create(c, bytes, sizeof bytes, &h));
        memset(got, 0, sizeof got);
        future_waiter w = {start_read(c, h, got, sizeof got), NULL};
        pthread_t t;
        assert_int_equal(pthread_create(&t, NULL, wait_future, &w), 0);
        cube_client_close(c);
        assert_int_equal(pthread_join(t, NULL), 0);
        CONF_OK(w.err);
        assert_memory_equal(got, bytes, sizeof bytes);
    }
}

static int is_power_of_two(uint64_t v)
{
    return v && (v & (v - 1)) == 0;
}

CONF_TEST(client_properties_are_sane)
{
    cube_properties p;
    memset(&p, 0xAB, sizeof p);
    CONF_OK(cube_client_properties(conf.client, &p));
    assert_non_null(memchr(p.backend, '\0', sizeof p.backend));
    assert_non_null(memchr(p.name, '\0', sizeof p.name));
    assert_non_null(memchr(p.architecture, '\0', sizeof p.architecture));
    char want[32];
    backend_of(conf.backend, want, sizeof want);
    assert_string_equal(p.backend, want);
    assert_true(p.name[0] != '\0');
    assert_true(p.architecture[0] != '\0');
    for (int i = 0; i < 3; i++) {
        assert_true(p.max_cube_dim[i] >= 1);
        assert_true(p.max_cube_dim[i] <= p.max_units_per_cube);
        assert_true(p.max_cube_count[i] >= 1);
    }
    assert_true(p.max_units_per_cube >= 1);
    if (strcmp(p.backend, "cpu") == 0) {
        /* The CPU backend's own promises: here the backend called cpu
         * is the subject, not a capability a test depends on. */
        assert_true(p.max_units_per_cube >= 1024);
        assert_true(p.max_cube_dim[0] >= 1024);
        uint32_t want_features =
            CUBE_FEATURE_ATOMIC_F32_ADD | CUBE_FEATURE_F64 |
            CUBE_FEATURE_SHARED_MEMORY | CUBE_FEATURE_CUBE_SYNC |
            CUBE_FEATURE_BOUNDS_CHECK | CUBE_FEATURE_DYNAMIC_COUNT |
            CUBE_FEATURE_GRAPHS | CUBE_FEATURE_HOST_MEMORY;
        assert_int_equal(p.features & want_features, want_features);
        assert_int_equal(p.timing, CUBE_TIMING_HOST_CLOCK);
    }
    /* Graphs work wherever kernels run: the client records a software
     * graph when the device records none (cube_utilities says which). */
    if (p.features & CUBE_FEATURE_KERNELS)
        assert_true(p.features & CUBE_FEATURE_GRAPHS);
    if (p.features & CUBE_FEATURE_SHARED_MEMORY)
        assert_true(p.max_shared_memory >= 1024);
    assert_true(is_power_of_two(p.memory_alignment));
    assert_true(p.memory_total > 0);
    assert_true(p.max_buffer_size > 0);
    assert_true(p.max_buffer_size <= p.memory_total);
    assert_true(p.compute_units >= 1);
    assert_true(p.timing == CUBE_TIMING_HOST_CLOCK ||
                p.timing == CUBE_TIMING_DEVICE);
    /* Stable: the same answer twice. */
    cube_properties q;
    memset(&q, 0, sizeof q);
    CONF_OK(cube_client_properties(conf.client, &q));
    assert_memory_equal(&p, &q, sizeof p);
    assert_true(cube_stream_current(conf.client) != 0);
    assert_int_equal(cube_stream_current(NULL), 0);
}

CONF_TEST(client_backend_names_lists_cpu_and_is_terminated)
{
    const char *const *names = cube_backend_names();
    assert_non_null(names);
    int cpu = 0;
    size_t n = 0;
    for (; names[n]; n++) {
        assert_true(names[n][0] != '\0');
        cpu |= strcmp(names[n], "cpu") == 0;
        for (size_t j = 0; j < n; j++)
            assert_true(strcmp(names[j], names[n]) != 0);
        assert_true(n < 64);
    }
    assert_true(cpu);
    /* Every name opens, or says why it cannot run here. */
    for (size_t i = 0; names[i]; i++) {
        cube_client *c = NULL;
        cube_error *err = cube_client_open(names[i], NULL, &c);
        if (err) {
            assert_int_equal(cube_error_code(err), CUBE_ERR_UNAVAILABLE);
            assert_true(cube_error_message(err)[0] != '\0');
            cube_error_free(err);
            assert_null(c);
        } else {
            cube_client_close(c);
        }
    }
}

CONF_TEST_NEEDS(error_accessors_tolerate_null_and_format_whole_error,
                CUBE_FEATURE_KERNELS)
{
    assert_int_equal(cube_error_code(NULL), CUBE_OK);
    assert_string_equal(cube_error_message(NULL), "");
    assert_null(cube_error_log(NULL));
    assert_int_equal(cube_error_cause_count(NULL), 0);
    assert_null(cube_error_cause(NULL, 0));
    cube_error_free(NULL);
    char *text = cube_error_format(NULL);
    assert_non_null(text);
    free(text);

    /* A real error: a compile failure has a message, a log, no causes. */
    cube_handle x = conf_empty(16), y = conf_empty(16), z = conf_empty(16);
    cube_arg args[3] = {cube_arg_buffer(x), cube_arg_buffer(y),
                        cube_arg_buffer(z)};
    cube_error *err = conf_launch(conf.k.broken, cube_count_static(1, 1, 1),
                                  args, 3, CUBE_LAUNCH_EXECUTE);
    CONF_CODE(err, CUBE_ERR_COMPILE);
    assert_null(cube_error_cause(err, cube_error_cause_count(err)));
    text = cube_error_format(err);
    assert_non_null(text);
    assert_non_null(strstr(text, cube_code_name(CUBE_ERR_COMPILE)));
    assert_non_null(strstr(text, cube_error_message(err)));
    assert_non_null(strstr(text, "conf_undeclared_identifier"));
    free(text);
    cube_error_free(err);

    /* A SEVERAL error formats its causes too. */
    unsigned char buf[16];
    err = conf_read(y, buf, sizeof buf);
    CONF_CODE(err, CUBE_ERR_SEVERAL);
    assert_true(cube_error_cause_count(err) >= 1);
    text = cube_error_format(err);
    assert_non_null(text);
    assert_non_null(strstr(text, cube_code_name(CUBE_ERR_SEVERAL)));
    assert_non_null(strstr(text, cube_code_name(CUBE_ERR_COMPILE)));
    free(text);
    cube_error_free(err);
    conf_release(x);
    conf_release(y);
    conf_release(z);
}

CONF_TEST(error_code_names_are_distinct_and_non_empty)
{
    for (int a = CUBE_OK; a <= CUBE_CODE_LAST; a++) {
        const char *na = cube_code_name((cube_code)a);
        assert_non_null(na);
        assert_true(na[0] != '\0');
        for (int b = CUBE_OK; b < a; b++)
            assert_true(strcmp(na, cube_code_name((cube_code)b)) != 0);
    }
    assert_non_null(cube_code_name((cube_code)999));
}

/* --- the logger --- */

static int sink_hits;
static char sink_last[256];
static char sink_category[32];

static void test_sink(void *user, cube_log_level level, const char *category,
                      const char *message)
{
    (void)level;
    if (user != &sink_hits)
        return;
    if (strstr(message, "conformance probe")) {
        sink_hits++;
        snprintf(sink_last, sizeof sink_last, "%s", message);
        snprintf(sink_category, sizeof sink_category, "%s", category);
    }
}

CONF_TEST(log_level_parse_and_sink_receive_messages)
{
    static const struct {
        const char *name;
        cube_log_level level;
    } levels[] = {{"trace", CUBE_LOG_TRACE}, {"debug", CUBE_LOG_DEBUG},
                  {"info", CUBE_LOG_INFO},   {"warn", CUBE_LOG_WARN},
                  {"error", CUBE_LOG_ERROR}, {"off", CUBE_LOG_OFF}};
    for (size_t i = 0; i < sizeof levels / sizeof levels[0]; i++) {
        cube_log_level l = CUBE_LOG_OFF;
        assert_int_equal(cube_log_level_parse(levels[i].name, &l), 0);
        assert_int_equal(l, levels[i].level);
    }
    cube_log_level l = CUBE_LOG_INFO;
    assert_int_equal(cube_log_level_parse("loud", &l), -1);
    assert_int_equal(l, CUBE_LOG_INFO);

    cube_log_level saved = cube_log_get_level();
    sink_hits = 0;
    cube_log_set_sink(test_sink, &sink_hits);
    cube_log_set_level(CUBE_LOG_ERROR);
    assert_true(cube_log_enabled(CUBE_LOG_ERROR));
    assert_false(cube_log_enabled(CUBE_LOG_WARN));
    cube_log_write(CUBE_LOG_WARN, "client", "conformance probe %d", 1);
    assert_int_equal(sink_hits, 0); /* below the level: dropped */
    cube_log_write(CUBE_LOG_ERROR, "client", "conformance probe %d", 42);
    assert_int_equal(sink_hits, 1);
    assert_non_null(strstr(sink_last, "42"));
    assert_string_equal(sink_category, "client");
    cube_log_set_sink(NULL, NULL);
    cube_log_set_level(saved);

    CONF_EXPECT(cube_log_set_file(NULL), CUBE_ERR_INVALID_ARGUMENT);
    CONF_EXPECT(cube_log_set_file(""), CUBE_ERR_INVALID_ARGUMENT);
    CONF_EXPECT(cube_log_set_file("/nonexistent-dir-cubert/x/log.txt"),
                CUBE_ERR_IO);
}
