/* Devices: the list without opening anything, one server per device per
 * process, what clients of one device share and what each keeps, options
 * that conflict with an open device, and virtual CPU devices. Each test
 * leaves no client open, so every test's first open opens the server. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "core/client_internal.h"
#include "cubert/cubert.h"

static void ok_(cube_error *err, const char *what, int line)
{
    if (err) {
        char *text = cube_error_format(err);
        fail_msg("line %d: %s: %s", line, what, text ? text : "?");
    }
}
#define ok(call) ok_((call), #call, __LINE__)

static void expect_(cube_error *err, cube_code code, const char *needle,
                    const char *what, int line)
{
    if (cube_error_code(err) != code)
        fail_msg("line %d: %s: expected code %d, got %d (%s)", line, what,
                 (int)code, (int)cube_error_code(err),
                 err ? cube_error_message(err) : "success");
    if (needle && !strstr(cube_error_message(err), needle))
        fail_msg("line %d: %s: '%s' does not say '%s'", line, what,
                 cube_error_message(err), needle);
    cube_error_free(err);
}
#define expect(call, code, needle)                                             \
    expect_((call), (code), (needle), #call, __LINE__)

static cube_client *open_client(const char *device,
                                const cube_client_options *o)
{
    cube_client *c = NULL;
    ok(cube_client_open(device, o, &c));
    assert_non_null(c);
    return c;
}

static uint32_t clients_of(cube_client *c)
{
    cube_device_info info;
    ok(cube_client_device(c, &info));
    return info.clients;
}

static cube_kernel *fill_kernel(void)
{
    static const char src[] =
        "CUBE_KERNEL(dev_fill, CUBE_OUT(uint32_t, y), CUBE_SCALAR(uint32_t, "
        "v))\n"
        "{\n"
        "    uint32_t i = ABSOLUTE_POS_X;\n"
        "    if (i < CUBE_LEN(y))\n"
        "        y[i] = v + i;\n"
        "}\n";
    cube_kernel_desc d = {"dev_fill", src, {64, 1, 1}};
    cube_kernel *k = NULL;
    ok(cube_kernel_create(&d, &k));
    return k;
}

static cube_error *fill(cube_client *c, cube_kernel *k, cube_handle y,
                        uint32_t v)
{
    cube_arg args[2] = {cube_arg_buffer(y), cube_arg_u32(v)};
    return cube_launch(c, k, cube_count_static(1, 1, 1), args, 2, 0);
}

static void expect_filled(cube_client *c, cube_handle h, uint32_t v)
{
    uint32_t got[16];
    cube_copy_desc d = cube_copy_desc_contiguous(h, sizeof got, 4);
    void *dst[1] = {got};
    uint64_t size[1] = {sizeof got};
    ok(cube_read(c, &d, dst, size, 1));
    for (uint32_t i = 0; i < 16; i++)
        assert_int_equal(got[i], v + i);
}

/* ------------------------------------------------------------ the list */

static void test_count_and_describe_without_opening(void **state)
{
    (void)state;
    uint32_t n = 99;
    ok(cube_device_count("cpu", &n));
    assert_int_equal(n, 1);
    ok(cube_device_count("null", &n));
    assert_int_equal(n, 1);

    cube_device_info info;
    ok(cube_device_describe("cpu", &info));
    assert_string_equal(info.device, "cpu:0");
    assert_int_equal(info.index, 0);
    assert_int_equal(info.clients, 0); /* nothing opened */
    assert_string_equal(info.properties.backend, "cpu");
    assert_true(info.properties.compute_units >= 1);
    assert_true(info.properties.features & CUBE_FEATURE_KERNELS);

    /* What the open device reports is what the description said. */
    cube_client *c = open_client("cpu:0", NULL);
    cube_properties p;
    ok(cube_client_properties(c, &p));
    assert_memory_equal(&p, &info.properties, sizeof p);
    ok(cube_device_describe("cpu", &info));
    assert_int_equal(info.clients, 1);
    cube_client_close(c);

    ok(cube_device_describe("null:0", &info));
    assert_string_equal(info.properties.backend, "null");
    assert_false(info.properties.features & CUBE_FEATURE_KERNELS);
}

static void test_list_refuses_bad_names(void **state)
{
    (void)state;
    uint32_t n = 7;
    cube_device_info info;
    expect(cube_device_count(NULL, &n), CUBE_ERR_INVALID_ARGUMENT, "backend");
    expect(cube_device_count("cpu", NULL), CUBE_ERR_INVALID_ARGUMENT, "out");
    expect(cube_device_count("nope", &n), CUBE_ERR_NOT_FOUND, "nope");
    assert_int_equal(n, 0);
    expect(cube_device_describe(NULL, &info), CUBE_ERR_INVALID_ARGUMENT,
           "device");
    expect(cube_device_describe("cpu", NULL), CUBE_ERR_INVALID_ARGUMENT, "out");
    expect(cube_device_describe("cpu:1", &info), CUBE_ERR_NOT_FOUND, "index 1");
    expect(cube_device_describe("cpu:-1", &info), CUBE_ERR_INVALID_ARGUMENT,
           "index");
    expect(cube_device_describe(":0", &info), CUBE_ERR_INVALID_ARGUMENT,
           "malformed");
    expect(cube_device_describe("nope:0", &info), CUBE_ERR_NOT_FOUND, "nope");
    expect(cube_client_device(NULL, &info), CUBE_ERR_INVALID_ARGUMENT,
           "client");
    /* A CUDA build without a GPU says why, never crashes. */
    cube_error *err = cube_device_count("cuda", &n);
    if (err) {
        assert_int_equal(cube_error_code(err), CUBE_ERR_UNAVAILABLE);
        cube_error_free(err);
    }
}

/* ------------------------------------------------ one server per device */

static void test_second_open_shares_the_server(void **state)
{
    (void)state;
    cube_client_options o = cube_client_options_default();
    o.cpu_threads = 2;
    o.cache_dir = "";
    cube_client *a = open_client("cpu", &o);
    cube_properties pa;
    ok(cube_client_properties(a, &pa));
    assert_int_equal(pa.compute_units, 2); /* the first open's options */
    cube_client *b = open_client("cpu:0", NULL);
    assert_ptr_equal(a->dev, b->dev);
    assert_ptr_equal(a->server, b->server);
    assert_int_equal(clients_of(a), 2);
    /* Asking for the same options is no conflict. */
    cube_client *b2 = open_client("cpu", &o);
    assert_int_equal(clients_of(b2), 3);
    cube_client_close(b2);

    /* One kernel cache: b's launch of a kernel a compiled is a hit. */
    cube_kernel *k = fill_kernel();
    cube_handle ya, yb;
    ok(cube_empty(a, 64, &ya));
    ok(fill(a, k, ya, 5));
    size_t entries = core_cache_entry_count(a);
    ok(cube_empty(b, 64, &yb));
    ok(fill(b, k, yb, 9));
    assert_int_equal(core_cache_entry_count(b), entries);
    expect_filled(a, ya, 5);
    expect_filled(b, yb, 9);

    /* One pool per stream: this thread's stream holds both buffers. */
    cube_memory_usage ua, ub;
    ok(cube_memory_usage_get(a, &ua));
    ok(cube_memory_usage_get(b, &ub));
    assert_int_equal(ua.buffers, 2);
    assert_memory_equal(&ua, &ub, sizeof ua);

    /* Handles stay each client's own. */
    uint32_t out[16];
    cube_copy_desc d = cube_copy_desc_contiguous(ya, sizeof out, 4);
    void *dst[1] = {out};
    uint64_t size[1] = {sizeof out};
    expect(cube_read(b, &d, dst, size, 1), CUBE_ERR_NOT_FOUND, NULL);
    expect(cube_handle_release(b, ya), CUBE_ERR_NOT_FOUND, NULL);
    expect_filled(a, ya, 5);

    /* Closing one client leaves the other's buffers and the server. */
    cube_client_close(a);
    assert_int_equal(clients_of(b), 1);
    expect_filled(b, yb, 9);
    ok(cube_memory_usage_get(b, &ub));
    assert_int_equal(ub.buffers, 1);
    ok(fill(b, k, yb, 11));
    expect_filled(b, yb, 11);
    ok(cube_handle_release(b, yb));
    cube_kernel_release(k);
    cube_client_close(b);

    /* The last close closed the server: other options open now. */
    o.cpu_threads = 1;
    cube_client *c = open_client("cpu", &o);
    ok(cube_client_properties(c, &pa));
    assert_int_equal(pa.compute_units, 1);
    cube_client_close(c);
}

static void test_conflicting_options_are_refused(void **state)
{
    (void)state;
    cube_client_options o = cube_client_options_default();
    o.cpu_threads = 2;
    o.cache_dir = "";
    cube_client *a = open_client("cpu", &o);
    cube_handle h;
    uint32_t v[4] = {1, 2, 3, 4};
    ok(cube_create(a, v, sizeof v, &h));

    cube_client *b = (cube_client *)&o;
    cube_client_options other = o;
    other.cpu_threads = 3;
    expect(cube_client_open("cpu", &other, &b), CUBE_ERR_INVALID_ARGUMENT,
           "cpu_threads 2");
    assert_null(b);
    other = o;
    other.cache_dir = "/nonexistent/elsewhere";
    expect(cube_client_open("cpu", &other, &b), CUBE_ERR_INVALID_ARGUMENT,
           "cache_dir");
    assert_null(b);
    /* A backend whose servers have no CPU threads ignores them. */
    cube_client *n1 = open_client("null", NULL);
    other = cube_client_options_default();
    other.cpu_threads = 7;
    cube_client *n2 = open_client("null", &other);
    assert_ptr_equal(n1->dev, n2->dev);
    cube_client_close(n2);
    cube_client_close(n1);

    /* The refusals changed nothing. */
    assert_int_equal(clients_of(a), 1);
    uint32_t got[4];
    cube_copy_desc d = cube_copy_desc_contiguous(h, sizeof got, 4);
    void *dst[1] = {got};
    uint64_t size[1] = {sizeof got};
    ok(cube_read(a, &d, dst, size, 1));
    assert_memory_equal(got, v, sizeof v);
    ok(cube_handle_release(a, h));
    cube_client_close(a);
}

/* ---------------------------------------------- what each client keeps */

static void
test_dry_run_profiles_and_captures_stay_with_their_client(void **state)
{
    (void)state;
    cube_client *a = open_client("cpu", NULL);
    cube_client *b = open_client("cpu", NULL);
    cube_kernel *k = fill_kernel();
    cube_handle ya, yb;
    ok(cube_empty(a, 64, &ya));
    ok(cube_empty(b, 64, &yb));
    ok(fill(b, k, yb, 1));

    /* a's dry run drops a's launches only. */
    ok(cube_dry_run_begin(a));
    ok(fill(a, k, ya, 3));
    ok(fill(b, k, yb, 4));
    ok(cube_dry_run_end(a));
    expect_filled(b, yb, 4);

    /* a's window is not b's to end, on the very same stream. */
    cube_profile_token t = 0;
    ok(cube_profile_start(a, &t));
    cube_profile_result r;
    expect(cube_profile_end(b, t, &r), CUBE_ERR_PROFILE, "another client");
    ok(cube_profile_end(a, t, &r));

    /* a's capture: b's launch on the captured stream is refused and
     * recorded nowhere; b cannot end a's capture. */
    ok(fill(a, k, ya, 6));
    ok(cube_graph_prepare(a));
    ok(cube_graph_begin(a));
    ok(fill(a, k, ya, 7));
    expect(fill(b, k, yb, 8), CUBE_ERR_GRAPH_STATE, "another client");
    ok(cube_check(b, &yb, 1));
    cube_graph_id g = 0;
    expect(cube_graph_end(b, &g), CUBE_ERR_GRAPH_STATE, "not capturing");
    ok(cube_graph_end(a, &g));
    ok(fill(b, k, yb, 8));
    expect_filled(b, yb, 8);
    ok(cube_graph_replay(a, g));
    expect_filled(a, ya, 7);
    expect(cube_graph_replay(b, g), CUBE_ERR_NOT_FOUND, NULL);
    ok(cube_graph_destroy(a, g));

    /* A client closed in the middle of a capture and a window ends them:
     * the stream serves b again. */
    ok(cube_profile_start(b, &t));
    ok(cube_graph_prepare(a));
    ok(cube_graph_begin(a));
    ok(fill(a, k, ya, 13)); /* recorded, never run */
    ok(cube_handle_release(a, ya));
    cube_client_close(a);
    ok(fill(b, k, yb, 12));
    ok(cube_profile_end(b, t, &r));
    assert_int_equal(r.launches, 1);
    expect_filled(b, yb, 12);
    ok(cube_handle_release(b, yb));
    cube_kernel_release(k);
    cube_client_close(b);
}

/* A device fault is every client's of the device, and a later open gets a
 * fresh server. */
static void test_fault_is_the_devices_and_a_new_open_starts_afresh(void **state)
{
    (void)state;
    cube_client *a = open_client("cpu", NULL);
    cube_client *b = open_client("cpu", NULL);
    cube_error *fault = cube_error_new(CUBE_ERR_DEVICE_FAULT, "test fault");
    core_fault_note(a, fault);
    cube_error_free(fault);
    cube_handle h;
    expect(cube_empty(b, 16, &h), CUBE_ERR_DEVICE_FAULT, "test fault");
    expect(cube_sync(a, NULL, 0), CUBE_ERR_DEVICE_FAULT, "test fault");

    cube_client *c = open_client("cpu", NULL);
    assert_ptr_not_equal(c->dev, a->dev);
    assert_int_equal(clients_of(c), 1);
    ok(cube_empty(c, 16, &h));
    ok(cube_handle_release(c, h));
    cube_client_close(a);
    cube_client_close(b);
    cube_client *d = open_client("cpu", NULL);
    assert_ptr_equal(d->dev, c->dev);
    cube_client_close(d);
    cube_client_close(c);
}

/* ------------------------------------------------ virtual CPU devices */

static void test_virtual_cpu_devices_are_separate_servers(void **state)
{
    (void)state;
    setenv("CUBERT_CPU_DEVICES", "3", 1);
    uint32_t n = 0;
    ok(cube_device_count("cpu", &n));
    assert_int_equal(n, 3);
    cube_device_info info;
    ok(cube_device_describe("cpu:2", &info));
    assert_string_equal(info.device, "cpu:2");
    assert_int_equal(info.index, 2);
    expect(cube_device_describe("cpu:3", &info), CUBE_ERR_NOT_FOUND, "3 ");

    cube_client *c[3];
    cube_kernel *k = fill_kernel();
    cube_handle y[3];
    for (int i = 0; i < 3; i++) {
        char name[16];
        snprintf(name, sizeof name, "cpu:%d", i);
        c[i] = open_client(name, NULL);
        ok(cube_empty(c[i], 64, &y[i]));
        ok(fill(c[i], k, y[i], 100u * (uint32_t)i));
    }
    assert_ptr_not_equal(c[0]->dev, c[1]->dev);
    assert_ptr_not_equal(c[1]->dev, c[2]->dev);
    for (int i = 0; i < 3; i++) {
        expect_filled(c[i], y[i], 100u * (uint32_t)i);
        /* Each device's memory is its own. */
        cube_memory_usage u;
        ok(cube_memory_usage_get(c[i], &u));
        assert_int_equal(u.buffers, 1);
        ok(cube_client_device(c[i], &info));
        assert_int_equal(info.index, (uint32_t)i);
        ok(cube_handle_release(c[i], y[i]));
        cube_client_close(c[i]);
    }
    cube_kernel_release(k);
    unsetenv("CUBERT_CPU_DEVICES");
    ok(cube_device_count("cpu", &n));
    assert_int_equal(n, 1);
}

/* ------------------------------------------------ opens and closes race */

static void *open_close_loop(void *arg)
{
    (void)arg;
    for (int i = 0; i < 50; i++) {
        cube_client *c = NULL;
        cube_error *err = cube_client_open("null", NULL, &c);
        if (err) {
            cube_error_free(err);
            return (void *)1;
        }
        cube_handle h;
        uint64_t v = (uint64_t)i;
        err = cube_create(c, &v, sizeof v, &h);
        if (!err) {
            uint64_t got = 0;
            cube_copy_desc d = cube_copy_desc_contiguous(h, 8, 8);
            void *dst[1] = {&got};
            uint64_t size[1] = {8};
            err = cube_read(c, &d, dst, size, 1);
            if (!err && got != v)
                err = cube_error_new(CUBE_ERR_INTERNAL, "wrong bytes");
        }
        cube_client_close(c);
        if (err) {
            cube_error_free(err);
            return (void *)1;
        }
    }
    return NULL;
}

static void test_threads_open_and_close_one_device(void **state)
{
    (void)state;
    enum { THREADS = 4 };
    pthread_t t[THREADS];
    for (int i = 0; i < THREADS; i++)
        assert_int_equal(pthread_create(&t[i], NULL, open_close_loop, NULL), 0);
    for (int i = 0; i < THREADS; i++) {
        void *res = NULL;
        pthread_join(t[i], &res);
        assert_null(res);
    }
    cube_device_info info;
    ok(cube_device_describe("null", &info));
    assert_int_equal(info.clients, 0);
}

int main(void)
{
    unsetenv("CUBERT_CPU_DEVICES");
    unsetenv("CUBERT_CPU_THREADS");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_count_and_describe_without_opening),
        cmocka_unit_test(test_list_refuses_bad_names),
        cmocka_unit_test(test_second_open_shares_the_server),
        cmocka_unit_test(test_conflicting_options_are_refused),
        cmocka_unit_test(
            test_dry_run_profiles_and_captures_stay_with_their_client),
        cmocka_unit_test(
            test_fault_is_the_devices_and_a_new_open_starts_afresh),
        cmocka_unit_test(test_virtual_cpu_devices_are_separate_servers),
        cmocka_unit_test(test_threads_open_and_close_one_device),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
