/* Unit tests of the null backend (src/backends/null): what it registers,
 * the slots it fills and leaves empty, its storage under sizes that cannot
 * be served, its refusal to compile, and the device strings that name it
 * wrongly. The conformance suite runs the rest against it
 * (conformance.null). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>

#include "backends/common/host_memory.h"
#include "cubert/backend/comm.h"
#include "cubert/backend/server.h"
#include "cubert/cubert.h"

extern const cube_backend cube_backend_null;

static void expect_code(cube_error *err, cube_code code, const char *needle)
{
    assert_non_null(err);
    assert_int_equal(cube_error_code(err), code);
    if (needle && !strstr(cube_error_message(err), needle))
        fail_msg("'%s' does not name '%s'", cube_error_message(err), needle);
    cube_error_free(err);
}

static cube_server *open_server(void)
{
    cube_client_options o = cube_client_options_default();
    cube_server *s = NULL;
    assert_null(cube_backend_null.open(0, &o, &s));
    assert_non_null(s);
    assert_non_null(s->vt);
    return s;
}

/* The registration: one device, the name the registry looks up. */
static void test_registration(void **state)
{
    (void)state;
    assert_string_equal(cube_backend_null.name, "null");
    uint32_t n = 0;
    assert_null(cube_backend_null.device_count(&n));
    assert_int_equal(n, 1);
    assert_null(cube_backend_null.config_keys);
    int listed = 0;
    for (const char *const *b = cube_backend_names(); *b; b++)
        listed |= strcmp(*b, "null") == 0;
    assert_true(listed);
}

/* The template fills every slot the client calls unconditionally and
 * leaves every optional one NULL, so a copy of it starts from the
 * contract's defaults. */
static void test_slots(void **state)
{
    (void)state;
    cube_server *s = open_server();
    const cube_server_vtable *vt = s->vt;
    assert_string_equal(vt->name, "null");
    assert_non_null(vt->destroy);
    assert_non_null(vt->properties);
    assert_non_null(vt->stream_open);
    assert_non_null(vt->read);
    assert_non_null(vt->write);
    assert_non_null(vt->sync);
    assert_non_null(vt->compile);
    assert_non_null(vt->compiled_release);
    assert_non_null(vt->launch);
    assert_non_null(vt->flush);
    assert_null(vt->stream_close);
    assert_null(vt->initialize_memory);
    assert_null(vt->release_memory);
    assert_null(vt->memory_reclaim);
    assert_null(vt->read_wait);
    assert_null(vt->check);
    assert_null(vt->staging);
    assert_null(vt->staging_free);
    assert_null(vt->graph_prepare);
    assert_null(vt->begin_capture);
    assert_null(vt->end_capture);
    assert_null(vt->replay);
    assert_null(vt->graph_destroy);
    assert_null(vt->start_profile);
    assert_null(vt->end_profile);
    assert_null(vt->abandon_profile);
    /* ServerCommunication from the shared host-memory code: the peer
     * copy, and the communicator table with the collective slot alone
     * (no per-rank state, no grouping, nothing between processes). */
    assert_non_null(vt->copy_to_peer);
    const cube_comm_vtable *comm = cube_backend_null.comm;
    assert_ptr_equal(comm, &host_comm_vtable);
    assert_non_null(comm->collective);
    assert_null(comm->init);
    assert_null(comm->init_rank);
    assert_null(comm->id_new);
    assert_null(comm->destroy);
    assert_null(comm->abort);
    assert_null(comm->poll);
    assert_null(comm->replay_begin);
    assert_null(comm->replay_end);
    assert_null(comm->group_begin);
    assert_null(comm->group_end);
    vt->destroy(s);
}

/* A host "device" with no kernel features, timed on the host clock. */
static void test_properties(void **state)
{
    (void)state;
    cube_server *s = open_server();
    cube_properties p;
    memset(&p, 0xAB, sizeof p);
    assert_null(s->vt->properties(s, &p));
    assert_string_equal(p.backend, "null");
    assert_int_equal(p.features & CUBE_FEATURE_KERNELS, 0);
    assert_int_equal(p.features, CUBE_FEATURE_HOST_MEMORY);
    assert_int_equal(p.timing, CUBE_TIMING_HOST_CLOCK);
    assert_int_equal(p.memory_alignment, 64);
    assert_true(p.memory_total > 0);
    assert_true(p.max_buffer_size <= p.memory_total);
    assert_int_equal(p.max_units_per_cube, 1);
    s->vt->destroy(s);
}

/* The storage a stream gets: aligned host memory for sizes that are not a
 * multiple of the alignment, OUT_OF_MEMORY (never a wrapped size, never a
 * crash) for sizes no host can give. */
static void test_storage(void **state)
{
    (void)state;
    cube_server *s = open_server();
    cube_server_stream stream;
    memset(&stream, 0, sizeof stream);
    cube_storage_ops ops;
    memset(&ops, 0, sizeof ops);
    assert_null(s->vt->stream_open(s, &stream, &ops));
    assert_non_null(ops.alloc);
    assert_non_null(ops.free);
    assert_null(stream.impl);
    static const uint64_t sizes[] = {1, 63, 64, 65, 4097};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        uint64_t addr = 0;
        assert_null(ops.alloc(ops.self, sizes[i], 64, &addr));
        assert_true(addr != 0);
        assert_int_equal(addr % 64, 0);
        memset((void *)(uintptr_t)addr, 0x5A, (size_t)sizes[i]);
        ops.free(ops.self, addr, sizes[i]);
    }
    /* Rounding these up to the alignment would wrap around. */
    static const uint64_t huge[] = {UINT64_MAX, UINT64_MAX - 62};
    for (size_t i = 0; i < sizeof huge / sizeof huge[0]; i++) {
        uint64_t addr = 0;
        expect_code(ops.alloc(ops.self, huge[i], 64, &addr),
                    CUBE_ERR_OUT_OF_MEMORY, "host memory");
        assert_int_equal(addr, 0);
    }
    s->vt->destroy(s);
}

/* compile says why nothing runs, naming the kernel; launch answers the
 * same should it ever be reached. */
static void test_compile_and_launch_are_unsupported(void **state)
{
    (void)state;
    cube_server *s = open_server();
    cube_kernel_desc d = {
        "answer", "CUBE_KERNEL(answer, CUBE_OUT(int, y)) {}", {1, 1, 1}};
    cube_kernel *k = NULL;
    assert_null(cube_kernel_create(&d, &k));
    cube_compiled out;
    memset(&out, 0, sizeof out);
    cube_error *err = s->vt->compile(s, k, 0, &out);
    assert_non_null(err);
    assert_int_equal(cube_error_code(err), CUBE_ERR_UNSUPPORTED);
    assert_non_null(strstr(cube_error_message(err), "answer"));
    expect_code(err, CUBE_ERR_UNSUPPORTED, "runs no kernels");
    s->vt->compiled_release(s, &out); /* what the client does at close */
    cube_dispatch dispatch;
    memset(&dispatch, 0, sizeof dispatch);
    dispatch.compiled = &out;
    expect_code(s->vt->launch(s, NULL, &dispatch), CUBE_ERR_UNSUPPORTED,
                "runs no kernels");
    cube_kernel_release(k);
    s->vt->destroy(s);
}

/* Through the public API: a launch fails with UNSUPPORTED and lands on
 * the buffer it binds, like any compile error. */
static void test_launch_failure_is_recorded(void **state)
{
    (void)state;
    cube_client *c = NULL;
    assert_null(cube_client_open("null", NULL, &c));
    cube_kernel_desc d = {
        "fill", "CUBE_KERNEL(fill, CUBE_OUT(int, y)) {}", {1, 1, 1}};
    cube_kernel *k = NULL;
    assert_null(cube_kernel_create(&d, &k));
    int v[4] = {1, 2, 3, 4};
    cube_handle h = {0};
    assert_null(cube_create(c, v, sizeof v, &h));
    cube_arg a = cube_arg_buffer(h);
    expect_code(cube_launch(c, k, cube_count_static(1, 1, 1), &a, 1,
                            CUBE_LAUNCH_EXECUTE),
                CUBE_ERR_UNSUPPORTED, "null backend runs no kernels");
    cube_error *err = cube_check(c, &h, 1);
    assert_non_null(err);
    assert_int_equal(cube_error_code(err), CUBE_ERR_SEVERAL);
    assert_int_equal(cube_error_cause_count(err), 1);
    assert_int_equal(cube_error_code(cube_error_cause(err, 0)),
                     CUBE_ERR_UNSUPPORTED);
    cube_error_free(err);
    assert_null(cube_handle_release(c, h));
    cube_kernel_release(k);
    cube_client_close(c);
}

/* Device strings that name the null backend wrongly. */
static void test_bad_device_strings(void **state)
{
    (void)state;
    static const struct {
        const char *device;
        cube_code code;
        const char *needle;
    } bad[] = {
        {"null:1", CUBE_ERR_NOT_FOUND, "1 device"},
        {"null:1024", CUBE_ERR_NOT_FOUND, "index 1024"},
        {"null:", CUBE_ERR_INVALID_ARGUMENT, "null:"},
        {"null:x", CUBE_ERR_INVALID_ARGUMENT, "null:x"},
        {"null:-1", CUBE_ERR_INVALID_ARGUMENT, "null:-1"},
        {"null: 0", CUBE_ERR_INVALID_ARGUMENT, "null: 0"},
        {"null:0:0", CUBE_ERR_INVALID_ARGUMENT, "null:0:0"},
        {"NULL", CUBE_ERR_NOT_FOUND, "NULL"},
        {"null0", CUBE_ERR_NOT_FOUND, "null0"},
        {"nul", CUBE_ERR_NOT_FOUND, "nul"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cube_client *c = (cube_client *)&bad; /* must be reset to NULL */
        cube_error *err = cube_client_open(bad[i].device, NULL, &c);
        if (!err || cube_error_code(err) != bad[i].code)
            print_error("device string '%s'\n", bad[i].device);
        expect_code(err, bad[i].code, bad[i].needle);
        assert_null(c);
    }
    cube_client *c = NULL;
    assert_null(cube_client_open("null:0", NULL, &c));
    cube_client_close(c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_registration),
        cmocka_unit_test(test_slots),
        cmocka_unit_test(test_properties),
        cmocka_unit_test(test_storage),
        cmocka_unit_test(test_compile_and_launch_are_unsupported),
        cmocka_unit_test(test_launch_failure_is_recorded),
        cmocka_unit_test(test_bad_device_strings),
    };
    return cmocka_run_group_tests_name("null_server", tests, NULL, NULL);
}
