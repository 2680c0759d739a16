/* Launch failures and the failure store, sentence by sentence of the
 * server contract:
 *
 * read   "Several when the work that was supposed to write one of these
 *         buffers failed, whichever stream it ran on — copying bytes out
 *         would hand back whatever was in memory before."
 * sync   "Wait for the completion of every task ..., then answer for
 *         handles: the barrier first, ... then the claim check a read would
 *         have made. An empty handles is the plain barrier plus the device
 *         fault."
 * check  "Whether the bytes the handles name can be trusted, right now and
 *         with no barrier ... Instant — enqueue-time failures only."
 * flush  "a launch failure is not the flush's to report: it lives on the
 *         buffers the launch left unwritten, and surfaces on any read, sync
 *         or check of them."
 * launch "On LaunchMode::Skip the server must still do everything a first
 *         launch does short of dispatching — expand, compile, validate,
 *         fill its caches — and then drop the launch."
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "conformance.h"

#define EXEC CUBE_LAUNCH_EXECUTE

/* Launches the kernel that does not compile over x (IN), y and z (OUT). */
static cube_error *launch_broken(cube_handle x, cube_handle y, cube_handle z,
                                 uint32_t mode)
{
    cube_arg args[3] = {cube_arg_buffer(x), cube_arg_buffer(y),
                        cube_arg_buffer(z)};
    return conf_launch(conf.k.broken, cube_count_static(1, 1, 1), args, 3,
                       mode);
}

/* The `limits` kernels take (x IN, y OUT). */
static cube_error *launch_limits(cube_kernel *k, cube_handle x, cube_handle y,
                                 uint32_t mode)
{
    cube_arg args[2] = {cube_arg_buffer(x), cube_arg_buffer(y)};
    return conf_launch(k, cube_count_static(1, 1, 1), args, 2, mode);
}

static cube_error *launch_scale(cube_kernel *k, cube_handle x, cube_handle y,
                                float a, uint32_t count, uint32_t mode)
{
    cube_arg args[3] = {cube_arg_buffer(x), cube_arg_buffer(y),
                        cube_arg_f32(a)};
    return conf_launch(k, cube_count_static(count, 1, 1), args, 3, mode);
}

/* A float buffer of `n` elements holding base + i. */
static cube_handle floats(uint32_t n, float base)
{
    float *v = malloc(n * 4ull);
    assert_non_null(v);
    for (uint32_t i = 0; i < n; i++)
        v[i] = base + (float)i;
    cube_handle h = conf_create(v, n * 4ull);
    free(v);
    return h;
}

static void expect_floats(cube_handle h, uint32_t n, float scale, float base)
{
    float *v = malloc(n * 4ull);
    assert_non_null(v);
    CONF_READ_OK(h, v, n * 4ull);
    for (uint32_t i = 0; i < n; i++)
        if (v[i] != scale * (base + (float)i))
            fail_msg("element %u: %g, expected %g", i, (double)v[i],
                     (double)(scale * (base + (float)i)));
    free(v);
}

CONF_TEST_NEEDS(launch_compile_error_returns_compile_with_compiler_log,
                CUBE_FEATURE_KERNELS)
{
    cube_handle x = conf_empty(16), y = conf_empty(16), z = conf_empty(16);
    cube_error *err = launch_broken(x, y, z, EXEC);
    CONF_CODE(err, CUBE_ERR_COMPILE);
    /* The message says which kernel; the log is the compiler's, naming the
     * offending identifier. */
    assert_non_null(strstr(cube_error_message(err), "broken"));
    const char *log = cube_error_log(err);
    assert_non_null(log);
    assert_true(log[0] != '\0');
    if (!strstr(log, "conf_undeclared_identifier"))
        fail_msg("the compiler log does not mention the error:\n%s", log);
    cube_error_free(err);
    /* Every launch of it fails the same way (failures are not cached as
     * successes). */
    CONF_EXPECT(launch_broken(x, y, z, EXEC), CUBE_ERR_COMPILE);
    conf_release(x);
    conf_release(y);
    conf_release(z);
}

CONF_TEST_NEEDS(launch_compile_error_is_recorded_on_bound_buffers,
                CUBE_FEATURE_KERNELS)
{
    cube_handle x = floats(4, 1), y = floats(4, 2), z = floats(4, 3);
    cube_handle bystander = floats(4, 4);
    CONF_EXPECT(launch_broken(x, y, z, EXEC), CUBE_ERR_COMPILE);
    /* The signature is unknown, so every bound buffer is suspect. */
    CONF_EXPECT_REFUSED(y, 16, CUBE_ERR_COMPILE);
    CONF_EXPECT_REFUSED(z, 16, CUBE_ERR_COMPILE);
    CONF_EXPECT_REFUSED(x, 16, CUBE_ERR_COMPILE);
    /* A buffer not bound to the launch is untouched. */
    expect_floats(bystander, 4, 1, 4);
    conf_release(x);
    conf_release(y);
    conf_release(z);
    conf_release(bystander);
}

CONF_TEST_NEEDS(read_of_buffer_whose_writer_failed_returns_several,
                CUBE_FEATURE_KERNELS)
{
    enum { COUNT = 100 };
    cube_handle x = floats(COUNT, 0), y = floats(COUNT, 50);
    /* A launch that should have written y fails (RESOURCE_LIMIT). */
    CONF_EXPECT(launch_limits(conf.k.too_many_units, x, y, EXEC),
                CUBE_ERR_RESOURCE_LIMIT);
    CONF_EXPECT_REFUSED(y, COUNT * 4, CUBE_ERR_RESOURCE_LIMIT);
    /* Its input was only read: still trusted. */
    expect_floats(x, COUNT, 1, 0);
    /* Refused again and again, until something writes it. */
    CONF_EXPECT_REFUSED(y, COUNT * 4, CUBE_ERR_RESOURCE_LIMIT);
    conf_release(x);
    conf_release(y);
}

CONF_TEST(read_refusal_leaves_every_destination_untouched)
{
    enum { COUNT = 64 };
    cube_handle good = floats(COUNT, 1), bad = floats(COUNT, 2);
    conf_mark_failed(bad);
    unsigned char d1[COUNT * 4], d2[COUNT * 4];
    memset(d1, 0xCD, sizeof d1);
    memset(d2, 0xCD, sizeof d2);
    /* The good buffer first: even its bytes must not be copied. */
    cube_copy_desc d[2] = {cube_copy_desc_contiguous(good, sizeof d1, 4),
                           cube_copy_desc_contiguous(bad, sizeof d2, 4)};
    void *dst[2] = {d1, d2};
    uint64_t sz[2] = {sizeof d1, sizeof d2};
    cube_error *err = cube_read(conf.client, d, dst, sz, 2);
    CONF_CODE(err, CUBE_ERR_SEVERAL);
    assert_int_equal(cube_error_cause_count(err), 1);
    cube_error_free(err);
    for (size_t i = 0; i < sizeof d1; i++) {
        assert_int_equal(d1[i], 0xCD);
        assert_int_equal(d2[i], 0xCD);
    }
    /* A strided read of the failed buffer: refused just the same. */
    uint32_t few[4];
    memset(few, 0xCD, sizeof few);
    cube_copy_desc s = cube_copy_desc_contiguous(bad, 16, 4);
    s.strides[0] = 16;
    void *fd[1] = {few};
    uint64_t fs[1] = {sizeof few};
    CONF_EXPECT(cube_read(conf.client, &s, fd, fs, 1), CUBE_ERR_SEVERAL);
    for (int i = 0; i < 4; i++)
        assert_int_equal(few[i], 0xCDCDCDCDu);
    conf_release(good);
    conf_release(bad);
}

CONF_TEST_NEEDS(read_several_has_one_cause_per_failed_buffer,
                CUBE_FEATURE_KERNELS)
{
    cube_handle x = floats(4, 0), y = floats(4, 0), z = floats(4, 0);
    cube_handle ok = floats(4, 0), w = floats(4, 0);
    CONF_EXPECT(launch_broken(x, y, z, EXEC), CUBE_ERR_COMPILE);
    conf_mark_failed(w);
    /* y and z failed to compile, w hit a limit, ok is fine; y named twice
     * (once through a slice) counts once. */
    cube_handle ys = conf_slice(y, 4, 8);
    float b[6][4];
    cube_copy_desc d[6] = {cube_copy_desc_contiguous(ok, 16, 4),
                           cube_copy_desc_contiguous(y, 16, 4),
                           cube_copy_desc_contiguous(z, 16, 4),
                           cube_copy_desc_contiguous(w, 16, 4),
                           cube_copy_desc_contiguous(ys, 8, 4),
                           cube_copy_desc_contiguous(ok, 16, 4)};
    void *dst[6] = {b[0], b[1], b[2], b[3], b[4], b[5]};
    uint64_t sz[6] = {16, 16, 16, 16, 8, 16};
    cube_error *err = cube_read(conf.client, d, dst, sz, 6);
    CONF_CODE(err, CUBE_ERR_SEVERAL);
    assert_int_equal(cube_error_cause_count(err), 3);
    int compile = 0, limit = 0;
    for (size_t i = 0; i < cube_error_cause_count(err); i++) {
        const cube_error *c = cube_error_cause(err, i);
        assert_non_null(c);
        assert_true(cube_error_message(c)[0] != '\0');
        compile += conf_error_has_code(c, CUBE_ERR_COMPILE);
        limit += conf_error_has_code(c, CUBE_ERR_RESOURCE_LIMIT);
    }
    assert_int_equal(compile, 2);
    assert_int_equal(limit, 1);
    cube_error_free(err);
    conf_release(ys);
    conf_release(x);
    conf_release(y);
    conf_release(z);
    conf_release(ok);
    conf_release(w);
}

CONF_TEST_NEEDS(read_refuses_failed_buffer_whichever_stream_ran_the_launch,
                CUBE_FEATURE_KERNELS)
{
    cube_handle x = floats(16, 0), y = floats(16, 0);
    cube_stream_id own = cube_stream_current(conf.client);
    /* The failing launch runs on another stream ... */
    CONF_OK(cube_stream_use(conf.client, 0x5EED0001ull));
    assert_true(cube_stream_current(conf.client) == 0x5EED0001ull);
    CONF_EXPECT(launch_limits(conf.k.too_many_units, x, y, EXEC),
                CUBE_ERR_RESOURCE_LIMIT);
    CONF_OK(cube_stream_use(conf.client, 0));
    assert_true(cube_stream_current(conf.client) == own);
    /* ... and is seen from this one, by read, check and sync. */
    CONF_EXPECT_REFUSED(y, 64, CUBE_ERR_RESOURCE_LIMIT);
    CONF_EXPECT(cube_check(conf.client, &y, 1), CUBE_ERR_SEVERAL);
    CONF_EXPECT(cube_sync(conf.client, &y, 1), CUBE_ERR_SEVERAL);
    /* And from a third stream. */
    CONF_OK(cube_stream_use(conf.client, 0x5EED0002ull));
    CONF_EXPECT_REFUSED(y, 64, CUBE_ERR_RESOURCE_LIMIT);
    CONF_OK(cube_stream_use(conf.client, 0));
    conf_release(x);
    conf_release(y);
}

CONF_TEST(read_of_slice_of_failed_buffer_is_refused)
{
    cube_handle all = floats(64, 0);
    cube_handle lo = conf_slice(all, 0, 128), hi = conf_slice(all, 128, 128);
    /* A launch that should have written the upper half fails. */
    conf_mark_failed(hi);
    CONF_EXPECT_REFUSED(hi, 128, conf_mark_code());
    /* The failure is the allocation's: every view of it is suspect. */
    CONF_EXPECT_REFUSED(all, 256, conf_mark_code());
    CONF_EXPECT_REFUSED(lo, 128, conf_mark_code());
    conf_release(lo);
    conf_release(hi);
    conf_release(all);
}

CONF_TEST_NEEDS(check_answers_launch_failure_instantly, CUBE_FEATURE_KERNELS)
{
    cube_handle x = floats(8, 0), y = floats(8, 0), z = floats(8, 0);
    cube_handle ok = floats(8, 0);
    CONF_EXPECT(launch_broken(x, y, z, EXEC), CUBE_ERR_COMPILE);
    cube_handle hs[3] = {ok, y, z};
    cube_error *err = cube_check(conf.client, hs, 3);
    CONF_CODE(err, CUBE_ERR_SEVERAL);
    assert_int_equal(cube_error_cause_count(err), 2);
    for (size_t i = 0; i < 2; i++)
        assert_true(
            conf_error_has_code(cube_error_cause(err, i), CUBE_ERR_COMPILE));
    cube_error_free(err);
    /* The same answer as a read would give, and check does not clear it. */
    CONF_EXPECT_REFUSED(y, 32, CUBE_ERR_COMPILE);
    CONF_EXPECT(cube_check(conf.client, &z, 1), CUBE_ERR_SEVERAL);
    CONF_OK(cube_check(conf.client, &ok, 1));
    conf_release(x);
    conf_release(y);
    conf_release(z);
    conf_release(ok);
}

CONF_TEST_NEEDS(check_of_trusted_buffers_or_no_handles_is_null,
                CUBE_FEATURE_KERNELS)
{
    cube_handle a = floats(8, 0), b = floats(8, 0);
    cube_handle bad = floats(8, 0);
    conf_mark_failed(bad);
    cube_handle hs[2] = {a, b};
    CONF_OK(cube_check(conf.client, hs, 2));
    /* No handles: nothing to answer for, even with failures around. */
    CONF_OK(cube_check(conf.client, NULL, 0));
    CONF_OK(cube_check(conf.client, hs, 0));
    /* After a successful launch its output is trusted. */
    CONF_OK(launch_scale(conf.k.scale, a, b, 2, 1, EXEC));
    CONF_OK(cube_check(conf.client, &b, 1));
    conf_release(a);
    conf_release(b);
    conf_release(bad);
}

CONF_TEST_NEEDS(sync_drains_then_reports_failed_buffers, CUBE_FEATURE_KERNELS)
{
    enum { COUNT = 5000 };
    cube_handle x = floats(COUNT, 0), y = conf_empty(COUNT * 4);
    cube_handle bad = floats(8, 0);
    /* Queue real work, then a failure, then sync on both. */
    CONF_OK(launch_scale(conf.k.scale, x, y, 3, conf_div_up(COUNT, 64), EXEC));
    conf_mark_failed(bad);
    cube_handle hs[2] = {y, bad};
    cube_error *err = cube_sync(conf.client, hs, 2);
    CONF_CODE(err, CUBE_ERR_SEVERAL);
    assert_int_equal(cube_error_cause_count(err), 1);
    assert_true(conf_error_has_code(err, CUBE_ERR_RESOURCE_LIMIT));
    cube_error_free(err);
    /* The healthy one synced fine and holds the work's result. */
    CONF_OK(cube_sync(conf.client, &y, 1));
    expect_floats(y, COUNT, 3, 0);
    conf_release(x);
    conf_release(y);
    conf_release(bad);
}

CONF_TEST_NEEDS(sync_with_no_handles_is_the_plain_barrier, CUBE_FEATURE_KERNELS)
{
    enum { COUNT = 3000 };
    cube_handle x = floats(COUNT, 1), y = conf_empty(COUNT * 4);
    cube_handle bad = floats(8, 0);
    conf_mark_failed(bad);
    CONF_OK(launch_scale(conf.k.scale, x, y, 2, conf_div_up(COUNT, 64), EXEC));
    /* Buffer failures are not its to report: only a device fault is. */
    CONF_OK(cube_sync(conf.client, NULL, 0));
    CONF_OK(cube_sync(conf.client, &bad, 0));
    /* After the barrier the work is done: an async read is ready at once. */
    float *v = malloc(COUNT * 4ull);
    assert_non_null(v);
    cube_copy_desc d = cube_copy_desc_contiguous(y, COUNT * 4ull, 4);
    void *dst[1] = {v};
    uint64_t sz[1] = {COUNT * 4ull};
    cube_future *f = NULL;
    CONF_OK(cube_read_async(conf.client, &d, dst, sz, 1, &f));
    CONF_OK(cube_future_wait(f));
    cube_future_free(f);
    for (uint32_t i = 0; i < COUNT; i++)
        assert_true(v[i] == 2.0f * (1.0f + (float)i));
    free(v);
    /* The failure is still there for whoever asks about the buffer. */
    CONF_EXPECT(cube_sync(conf.client, &bad, 1), CUBE_ERR_SEVERAL);
    conf_release(x);
    conf_release(y);
    conf_release(bad);
}

CONF_TEST(check_and_sync_refuse_released_handles)
{
    cube_handle a = floats(4, 0), gone = floats(4, 0);
    conf_release(gone);
    cube_handle hs[2] = {a, gone};
    CONF_EXPECT(cube_check(conf.client, hs, 2), CUBE_ERR_NOT_FOUND);
    CONF_EXPECT(cube_sync(conf.client, hs, 2), CUBE_ERR_NOT_FOUND);
    CONF_OK(cube_check(conf.client, &a, 1));
    conf_release(a);
}

CONF_TEST_NEEDS(flush_does_not_report_launch_failure, CUBE_FEATURE_KERNELS)
{
    cube_handle x = floats(4, 0), y = floats(4, 0), z = floats(4, 0);
    CONF_OK(cube_flush(conf.client));
    CONF_EXPECT(launch_broken(x, y, z, EXEC), CUBE_ERR_COMPILE);
    CONF_OK(cube_flush(conf.client));
    conf_mark_failed(z);
    CONF_OK(cube_flush(conf.client));
    /* It lives on the buffers instead, and surfaces on read, sync and
     * check of them. */
    CONF_EXPECT_REFUSED(y, 16, CUBE_ERR_COMPILE);
    CONF_EXPECT(cube_sync(conf.client, &y, 1), CUBE_ERR_SEVERAL);
    CONF_EXPECT(cube_check(conf.client, &z, 1), CUBE_ERR_SEVERAL);
    CONF_OK(cube_flush(conf.client));
    conf_release(x);
    conf_release(y);
    conf_release(z);
}

CONF_TEST(full_write_clears_failure)
{
    /* Odd sizes too: "full" is the buffer's size, not its padded size. */
    static const uint32_t sizes[] = {4, 100, 333, 4096};
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        uint32_t n = sizes[s];
        unsigned char *v = malloc(n), *got = malloc(n);
        assert_non_null(v);
        assert_non_null(got);
        conf_pattern(v, n, 80 + (uint32_t)s);
        cube_handle h = conf_empty(n);
        conf_mark_failed(h);
        CONF_EXPECT_REFUSED(h, n, conf_mark_code());
        CONF_WRITE_OK(h, v, n);
        CONF_OK(cube_check(conf.client, &h, 1));
        CONF_OK(cube_sync(conf.client, &h, 1));
        memset(got, 0, n);
        CONF_READ_OK(h, got, n);
        assert_memory_equal(got, v, n);
        conf_release(h);
        free(v);
        free(got);
    }
    /* A full write through a handle retained twice, and through a slice
     * that covers the whole buffer. */
    unsigned char v[64];
    conf_pattern(v, sizeof v, 90);
    cube_handle h = conf_empty(sizeof v);
    cube_handle whole = conf_slice(h, 0, sizeof v);
    conf_mark_failed(h);
    CONF_WRITE_OK(whole, v, sizeof v);
    CONF_OK(cube_check(conf.client, &h, 1));
    conf_release(whole);
    conf_release(h);
}

CONF_TEST(partial_write_keeps_failure)
{
    unsigned char v[256];
    conf_pattern(v, sizeof v, 91);
    cube_handle h = conf_empty(sizeof v);
    conf_mark_failed(h);
    /* Half the buffer through a slice. */
    cube_handle half = conf_slice(h, 0, 128);
    CONF_WRITE_OK(half, v, 128);
    CONF_EXPECT(cube_check(conf.client, &h, 1), CUBE_ERR_SEVERAL);
    CONF_EXPECT_REFUSED(half, 128, conf_mark_code());
    /* The first bytes through the whole handle. */
    cube_copy_desc d = cube_copy_desc_contiguous(h, 200, 1);
    const void *src[1] = {v};
    uint64_t sz[1] = {200};
    CONF_OK(cube_write(conf.client, &d, src, sz, 1));
    CONF_EXPECT(cube_check(conf.client, &h, 1), CUBE_ERR_SEVERAL);
    /* A strided write that touches every other element. */
    cube_copy_desc e = cube_copy_desc_contiguous(h, 128, 1);
    e.strides[0] = 2;
    sz[0] = 128;
    CONF_OK(cube_write(conf.client, &e, src, sz, 1));
    CONF_EXPECT(cube_check(conf.client, &h, 1), CUBE_ERR_SEVERAL);
    /* The full write does clear it. */
    CONF_WRITE_OK(h, v, sizeof v);
    CONF_OK(cube_check(conf.client, &h, 1));
    conf_release(half);
    conf_release(h);
}

CONF_TEST_NEEDS(failed_input_carries_forward_to_outputs, CUBE_FEATURE_KERNELS)
{
    enum { COUNT = 100 };
    cube_handle x = floats(COUNT, 0), y = floats(COUNT, 7);
    conf_mark_failed(x);
    /* Computing from untrusted bytes is refused; the output inherits. */
    cube_error *err = launch_scale(conf.k.scale, x, y, 2, 2, EXEC);
    CONF_CODE(err, CUBE_ERR_SEVERAL);
    assert_true(conf_error_has_code(err, CUBE_ERR_RESOURCE_LIMIT));
    cube_error_free(err);
    CONF_EXPECT_REFUSED(y, COUNT * 4, CUBE_ERR_RESOURCE_LIMIT);
    /* Transitively: y feeds z. */
    cube_handle z = floats(COUNT, 0);
    CONF_EXPECT(launch_scale(conf.k.scale, y, z, 2, 2, EXEC), CUBE_ERR_SEVERAL);
    CONF_EXPECT_REFUSED(z, COUNT * 4, CUBE_ERR_RESOURCE_LIMIT);
    /* Repairing the input repairs the chain. */
    float v[COUNT];
    for (int i = 0; i < COUNT; i++)
        v[i] = (float)i;
    CONF_WRITE_OK(x, v, sizeof v);
    CONF_OK(launch_scale(conf.k.scale, x, y, 2, 2, EXEC));
    CONF_OK(launch_scale(conf.k.scale, y, z, 2, 2, EXEC));
    expect_floats(z, COUNT, 4, 0);
    conf_release(x);
    conf_release(y);
    conf_release(z);
}

CONF_TEST_NEEDS(failed_inout_buffer_refuses_launch, CUBE_FEATURE_KERNELS)
{
    enum { COUNT = 64 };
    cube_handle x = floats(COUNT, 0), y = floats(COUNT, 0);
    conf_mark_failed(y);
    /* scale_add reads y (INOUT): it cannot compute from stale bytes. */
    CONF_EXPECT(launch_scale(conf.k.scale_add, x, y, 1, 1, EXEC),
                CUBE_ERR_SEVERAL);
    CONF_EXPECT_REFUSED(y, COUNT * 4, CUBE_ERR_RESOURCE_LIMIT);
    expect_floats(x, COUNT, 1, 0);
    conf_release(x);
    conf_release(y);
}

CONF_TEST_NEEDS(failed_dynamic_count_buffer_carries_forward,
                CUBE_FEATURE_KERNELS)
{
    uint32_t c[3] = {1, 1, 1};
    cube_handle cnt = conf_create(c, sizeof c);
    conf_mark_failed(cnt);
    uint32_t fill[32];
    memset(fill, 0x11, sizeof fill);
    cube_handle y = conf_create(fill, sizeof fill);
    cube_arg a = cube_arg_buffer(y);
    CONF_EXPECT(
        conf_launch(conf.k.count_probe, cube_count_dynamic(cnt), &a, 1, EXEC),
        CUBE_ERR_SEVERAL);
    CONF_EXPECT_REFUSED(y, sizeof fill, CUBE_ERR_RESOURCE_LIMIT);
    conf_release(cnt);
    conf_release(y);
}

CONF_TEST_NEEDS(successful_launch_clears_output_failure, CUBE_FEATURE_KERNELS)
{
    enum { COUNT = 64 };
    cube_handle x = floats(COUNT, 0), y = floats(COUNT, 0);
    conf_mark_failed(y);
    CONF_EXPECT_REFUSED(y, COUNT * 4, CUBE_ERR_RESOURCE_LIMIT);
    /* y is the launch's OUT: it now holds what the launch computed. */
    CONF_OK(launch_scale(conf.k.scale, x, y, 5, 1, EXEC));
    CONF_OK(cube_check(conf.client, &y, 1));
    expect_floats(y, COUNT, 5, 0);
    conf_release(x);
    conf_release(y);
}

CONF_TEST_NEEDS(launch_over_unit_limit_is_resource_limit_on_outputs,
                CUBE_FEATURE_KERNELS)
{
    cube_handle x = floats(16, 0), y = floats(16, 3);
    cube_error *err = launch_limits(conf.k.too_many_units, x, y, EXEC);
    CONF_CODE(err, CUBE_ERR_RESOURCE_LIMIT);
    assert_non_null(strstr(cube_error_message(err), "limits"));
    cube_error_free(err);
    CONF_EXPECT_REFUSED(y, 64, CUBE_ERR_RESOURCE_LIMIT);
    /* The signature is known: the input is not an output, so trusted. */
    expect_floats(x, 16, 1, 0);
    CONF_OK(cube_check(conf.client, &x, 1));
    /* mark: one unit more along x than the device allows. */
    cube_handle m = floats(4, 0);
    conf_mark_failed(m);
    CONF_EXPECT_REFUSED(m, 16, CUBE_ERR_RESOURCE_LIMIT);
    conf_release(x);
    conf_release(y);
    conf_release(m);
}

CONF_TEST_NEEDS(launch_over_cube_dim_limit_is_resource_limit,
                CUBE_FEATURE_KERNELS)
{
    cube_handle x = floats(16, 0), y = floats(16, 0);
    CONF_EXPECT(launch_limits(conf.k.dim_z_over, x, y, EXEC),
                CUBE_ERR_RESOURCE_LIMIT);
    CONF_EXPECT_REFUSED(y, 64, CUBE_ERR_RESOURCE_LIMIT);
    expect_floats(x, 16, 1, 0);
    conf_release(x);
    conf_release(y);
}

CONF_TEST_NEEDS(launch_over_shared_memory_limit_is_resource_limit,
                CUBE_FEATURE_KERNELS)
{
    cube_handle x = floats(32, 0), y = floats(32, 0);
    cube_arg args[2] = {cube_arg_buffer(x), cube_arg_buffer(y)};
    cube_error *err = conf_launch(conf.k.shared_over,
                                  cube_count_static(1, 1, 1), args, 2, EXEC);
    CONF_CODE(err, CUBE_ERR_RESOURCE_LIMIT);
    assert_non_null(strstr(cube_error_message(err), "shared"));
    cube_error_free(err);
    CONF_EXPECT_REFUSED(y, 128, CUBE_ERR_RESOURCE_LIMIT);
    expect_floats(x, 32, 1, 0);
    conf_release(x);
    conf_release(y);
}

CONF_TEST_NEEDS(launch_at_shared_memory_limit_runs, CUBE_FEATURE_KERNELS)
{
    cube_handle x = floats(64, 0), y = conf_empty(64 * 4);
    cube_arg args[2] = {cube_arg_buffer(x), cube_arg_buffer(y)};
    CONF_OK(conf_launch(conf.k.shared_at, cube_count_static(2, 1, 1), args, 2,
                        EXEC));
    float got[64];
    CONF_READ_OK(y, got, sizeof got);
    for (int i = 0; i < 64; i++)
        assert_true(got[i] == (float)i + 2.0f);
    conf_release(x);
    conf_release(y);
}

CONF_TEST_NEEDS(launch_cube_count_over_limit_is_resource_limit,
                CUBE_FEATURE_KERNELS)
{
    cube_handle x = floats(16, 0), y = floats(16, 0);
    cube_arg args[3] = {cube_arg_buffer(x), cube_arg_buffer(y),
                        cube_arg_f32(1)};
    for (int axis = 0; axis < 3; axis++) {
        uint32_t max = conf.props.max_cube_count[axis];
        if (max == UINT32_MAX)
            continue;
        uint32_t n[3] = {1, 1, 1};
        n[axis] = max + 1;
        CONF_EXPECT(conf_launch(conf.k.scale,
                                cube_count_static(n[0], n[1], n[2]), args, 3,
                                EXEC),
                    CUBE_ERR_RESOURCE_LIMIT);
    }
    /* A dynamic count over the limit is found at execution: it lands on
     * the outputs. */
    if (conf.props.max_cube_count[1] < UINT32_MAX) {
        uint32_t c[3] = {1, conf.props.max_cube_count[1] + 1, 1};
        cube_handle cnt = conf_create(c, sizeof c);
        cube_arg a = cube_arg_buffer(y);
        cube_error *err = conf_launch(conf.k.count_probe,
                                      cube_count_dynamic(cnt), &a, 1, EXEC);
        if (err)
            CONF_EXPECT(err, CUBE_ERR_RESOURCE_LIMIT);
        CONF_EXPECT(cube_sync(conf.client, &y, 1), CUBE_ERR_SEVERAL);
        conf_release(cnt);
    }
    expect_floats(x, 16, 1, 0);
    conf_release(x);
    conf_release(y);
}

CONF_TEST_NEEDS(launch_argument_count_mismatch_is_invalid_and_marks_outputs,
                CUBE_FEATURE_KERNELS)
{
    cube_handle x = floats(16, 0), y = floats(16, 0);
    /* scale takes (x, y, a): give (x, y). */
    cube_arg args[2] = {cube_arg_buffer(x), cube_arg_buffer(y)};
    CONF_EXPECT(
        conf_launch(conf.k.scale, cube_count_static(1, 1, 1), args, 2, EXEC),
        CUBE_ERR_INVALID_ARGUMENT);
    /* y is bound where the kernel writes: it cannot be trusted. */
    CONF_EXPECT_REFUSED(y, 64, CUBE_ERR_INVALID_ARGUMENT);
    CONF_WRITE_OK(y, (float[16]){0}, 64);
    /* Too many: (x, y, a, a). */
    cube_arg more[4] = {cube_arg_buffer(x), cube_arg_buffer(y), cube_arg_f32(1),
                        cube_arg_f32(1)};
    CONF_EXPECT(
        conf_launch(conf.k.scale, cube_count_static(1, 1, 1), more, 4, EXEC),
        CUBE_ERR_INVALID_ARGUMENT);
    CONF_EXPECT_REFUSED(y, 64, CUBE_ERR_INVALID_ARGUMENT);
    /* None: nothing bound, nothing recorded. */
    CONF_EXPECT(
        conf_launch(conf.k.scale, cube_count_static(1, 1, 1), NULL, 0, EXEC),
        CUBE_ERR_INVALID_ARGUMENT);
    conf_release(x);
    conf_release(y);
}

CONF_TEST_NEEDS(launch_scalar_for_buffer_is_invalid_and_marks_outputs,
                CUBE_FEATURE_KERNELS)
{
    cube_handle x = floats(16, 0), y = floats(16, 0);
    /* (x, scalar, scalar): the output position holds no buffer. */
    cube_arg args[3] = {cube_arg_buffer(x), cube_arg_f32(1), cube_arg_f32(1)};
    CONF_EXPECT(
        conf_launch(conf.k.scale, cube_count_static(1, 1, 1), args, 3, EXEC),
        CUBE_ERR_INVALID_ARGUMENT);
    /* (scalar, y, a): a handle's bits are not a buffer; y is bound where
     * the kernel writes, so it cannot be trusted. */
    args[0] = cube_arg_u64(x.bits);
    args[1] = cube_arg_buffer(y);
    CONF_EXPECT(
        conf_launch(conf.k.scale, cube_count_static(1, 1, 1), args, 3, EXEC),
        CUBE_ERR_INVALID_ARGUMENT);
    CONF_EXPECT_REFUSED(y, 64, CUBE_ERR_INVALID_ARGUMENT);
    conf_release(x);
    conf_release(y);
}

CONF_TEST_NEEDS(launch_buffer_for_scalar_is_invalid_and_marks_outputs,
                CUBE_FEATURE_KERNELS)
{
    cube_handle x = floats(16, 0), y = floats(16, 0);
    cube_arg args[3] = {cube_arg_buffer(x), cube_arg_buffer(y),
                        cube_arg_buffer(x)};
    CONF_EXPECT(
        conf_launch(conf.k.scale, cube_count_static(1, 1, 1), args, 3, EXEC),
        CUBE_ERR_INVALID_ARGUMENT);
    CONF_EXPECT_REFUSED(y, 64, CUBE_ERR_INVALID_ARGUMENT);
    conf_release(x);
    conf_release(y);
}

CONF_TEST_NEEDS(launch_wrong_scalar_size_is_invalid_and_marks_outputs,
                CUBE_FEATURE_KERNELS)
{
    cube_handle x = floats(16, 0), y = floats(16, 0);
    static const uint32_t sizes[] = {1, 2, 8};
    for (size_t i = 0; i < 3; i++) {
        double v = 1.0;
        cube_arg args[3] = {cube_arg_buffer(x), cube_arg_buffer(y),
                            cube_arg_scalar(&v, sizes[i])};
        CONF_EXPECT_MSG(conf_launch(conf.k.scale, cube_count_static(1, 1, 1),
                                    args, 3, EXEC),
                        CUBE_ERR_INVALID_ARGUMENT, "scalar");
        CONF_EXPECT_REFUSED(y, 64, CUBE_ERR_INVALID_ARGUMENT);
        CONF_WRITE_OK(y, (float[16]){0}, 64);
    }
    /* A scalar size the API does not know (not 1, 2, 4 or 8). */
    cube_arg args[3] = {cube_arg_buffer(x), cube_arg_buffer(y),
                        cube_arg_f32(1)};
    args[2].size = 3;
    CONF_EXPECT(
        conf_launch(conf.k.scale, cube_count_static(1, 1, 1), args, 3, EXEC),
        CUBE_ERR_INVALID_ARGUMENT);
    args[2].size = 16;
    CONF_EXPECT(
        conf_launch(conf.k.scale, cube_count_static(1, 1, 1), args, 3, EXEC),
        CUBE_ERR_INVALID_ARGUMENT);
    conf_release(x);
    conf_release(y);
}

/* Once the kernel compiled its signature is known, even when the arguments
 * do not fit it: a buffer given where the kernel only reads, or where it
 * takes a scalar, or past its last parameter, keeps its bytes trusted;
 * only one given where the kernel writes (OUT, INOUT) carries the
 * failure. */
CONF_TEST_NEEDS(launch_argument_mismatch_marks_no_buffer_the_kernel_reads,
                CUBE_FEATURE_KERNELS)
{
    cube_handle x = floats(16, 1), y = floats(16, 0), z = floats(16, 5);
    /* scale is (IN x, OUT y, a); scale_add is (IN x, INOUT y, a). */
    cube_kernel *kernels[2] = {conf.k.scale, conf.k.scale_add};
    for (int k = 0; k < 2; k++) {
        const cube_arg few[2] = {cube_arg_buffer(x), cube_arg_buffer(y)};
        const cube_arg many[4] = {cube_arg_buffer(x), cube_arg_buffer(y),
                                  cube_arg_f32(1), cube_arg_buffer(z)};
        const cube_arg buffer_for_scalar[3] = {
            cube_arg_buffer(x), cube_arg_buffer(y), cube_arg_buffer(z)};
        const cube_arg scalar_for_input[3] = {
            cube_arg_f32(1), cube_arg_buffer(y), cube_arg_f32(1)};
        const struct {
            const cube_arg *args;
            size_t n;
        } cases[4] = {
            {few, 2}, {many, 4}, {buffer_for_scalar, 3}, {scalar_for_input, 3}};
        for (int i = 0; i < 4; i++) {
            CONF_EXPECT(conf_launch(kernels[k], cube_count_static(1, 1, 1),
                                    cases[i].args, cases[i].n, EXEC),
                        CUBE_ERR_INVALID_ARGUMENT);
            /* x is bound only where the kernel reads, z where it takes a
             * scalar or past its parameters: both still trusted. */
            CONF_OK(cube_check(conf.client, (cube_handle[2]){x, z}, 2));
            expect_floats(x, 16, 1, 1);
            expect_floats(z, 16, 1, 5);
            CONF_EXPECT_REFUSED(y, 64, CUBE_ERR_INVALID_ARGUMENT);
            CONF_WRITE_OK(y, (float[16]){0}, 64);
        }
    }
    /* With x trusted, the corrected launch runs. */
    CONF_OK(launch_scale(conf.k.scale, x, y, 2, 1, EXEC));
    expect_floats(y, 16, 2, 1);
    conf_release(x);
    conf_release(y);
    conf_release(z);
}

CONF_TEST(launch_zero_static_count_is_invalid_and_records_nothing)
{
    cube_handle x = floats(16, 0), y = floats(16, 9);
    static const uint32_t counts[][3] = {
        {0, 1, 1}, {1, 0, 1}, {1, 1, 0}, {0, 0, 0}};
    for (size_t i = 0; i < 4; i++) {
        CONF_EXPECT_MSG(
            conf_launch(
                conf.k.scale,
                cube_count_static(counts[i][0], counts[i][1], counts[i][2]),
                (cube_arg[3]){cube_arg_buffer(x), cube_arg_buffer(y),
                              cube_arg_f32(2)},
                3, EXEC),
            CUBE_ERR_INVALID_ARGUMENT, "count");
    }
    CONF_OK(cube_check(conf.client, (cube_handle[2]){x, y}, 2));
    expect_floats(y, 16, 1, 9);
    conf_release(x);
    conf_release(y);
}

CONF_TEST_NEEDS(launch_unknown_mode_bits_are_invalid_and_record_nothing,
                CUBE_FEATURE_KERNELS)
{
    cube_handle x = floats(16, 0), y = floats(16, 9);
    static const uint32_t modes[] = {1u << 3, 1u << 31, 0xFFFFFFFFu,
                                     CUBE_LAUNCH_CHECKED | (1u << 5)};
    for (size_t i = 0; i < 4; i++) {
        CONF_EXPECT_MSG(launch_scale(conf.k.scale, x, y, 2, 1, modes[i]),
                        CUBE_ERR_INVALID_ARGUMENT, "mode");
    }
    CONF_OK(cube_check(conf.client, (cube_handle[2]){x, y}, 2));
    expect_floats(y, 16, 1, 9);
    /* Checked, Validate, Skip and both are known. */
    CONF_OK(launch_scale(conf.k.scale, x, y, 2, 1,
                         CUBE_LAUNCH_SKIP | CUBE_LAUNCH_VALIDATE));
    expect_floats(y, 16, 1, 9);
    CONF_OK(launch_scale(conf.k.scale, x, y, 2, 1,
                         CUBE_LAUNCH_SKIP | CUBE_LAUNCH_CHECKED));
    expect_floats(y, 16, 1, 9);
    CONF_OK(launch_scale(conf.k.scale, x, y, 2, 1, CUBE_LAUNCH_CHECKED));
    expect_floats(y, 16, 2, 0);
    conf_release(x);
    conf_release(y);
}

CONF_TEST(launch_null_kernel_args_and_bad_arg_kind_are_invalid)
{
    cube_handle x = floats(16, 0), y = floats(16, 9);
    cube_arg args[3] = {cube_arg_buffer(x), cube_arg_buffer(y),
                        cube_arg_f32(2)};
    CONF_EXPECT_MSG(
        conf_launch(NULL, cube_count_static(1, 1, 1), args, 3, EXEC),
        CUBE_ERR_INVALID_ARGUMENT, "kernel");
    CONF_EXPECT_MSG(
        conf_launch(conf.k.scale, cube_count_static(1, 1, 1), NULL, 3, EXEC),
        CUBE_ERR_INVALID_ARGUMENT, "args");
    args[2].kind = (cube_arg_kind)0;
    CONF_EXPECT(
        conf_launch(conf.k.scale, cube_count_static(1, 1, 1), args, 3, EXEC),
        CUBE_ERR_INVALID_ARGUMENT);
    args[2].kind = (cube_arg_kind)77;
    CONF_EXPECT(
        conf_launch(conf.k.scale, cube_count_static(1, 1, 1), args, 3, EXEC),
        CUBE_ERR_INVALID_ARGUMENT);
    /* More arguments than any kernel may take. */
    cube_arg many[64];
    for (int i = 0; i < 64; i++)
        many[i] = cube_arg_f32(0);
    CONF_EXPECT(
        conf_launch(conf.k.scale, cube_count_static(1, 1, 1), many, 64, EXEC),
        CUBE_ERR_INVALID_ARGUMENT);
    CONF_OK(cube_check(conf.client, (cube_handle[2]){x, y}, 2));
    expect_floats(y, 16, 1, 9);
    conf_release(x);
    conf_release(y);
}

CONF_TEST(launch_released_or_foreign_handle_is_not_found_records_nothing)
{
    cube_handle x = floats(16, 0), y = floats(16, 9), gone = floats(16, 0);
    conf_release(gone);
    CONF_EXPECT(launch_scale(conf.k.scale, gone, y, 2, 1, EXEC),
                CUBE_ERR_NOT_FOUND);
    CONF_EXPECT(launch_scale(conf.k.scale, x, gone, 2, 1, EXEC),
                CUBE_ERR_NOT_FOUND);
    cube_client *other = NULL;
    CONF_OK(cube_client_open(conf.backend, NULL, &other));
    cube_handle foreign;
    CONF_OK(cube_empty(other, 64, &foreign));
    CONF_EXPECT(launch_scale(conf.k.scale, foreign, y, 2, 1, EXEC),
                CUBE_ERR_NOT_FOUND);
    CONF_EXPECT(launch_scale(conf.k.scale, x, foreign, 2, 1, EXEC),
                CUBE_ERR_NOT_FOUND);
    CONF_OK(cube_handle_release(other, foreign));
    cube_client_close(other);
    CONF_OK(cube_check(conf.client, (cube_handle[2]){x, y}, 2));
    expect_floats(y, 16, 1, 9);
    conf_release(x);
    conf_release(y);
}

CONF_TEST_NEEDS(launch_kernel_name_not_in_source_is_compile_error,
                CUBE_FEATURE_KERNELS)
{
    cube_handle y = floats(4, 0);
    cube_arg a = cube_arg_buffer(y);
    cube_error *err = conf_launch(conf.k.missing_entry,
                                  cube_count_static(1, 1, 1), &a, 1, EXEC);
    CONF_CODE(err, CUBE_ERR_COMPILE);
    assert_non_null(strstr(cube_error_message(err), "not_defined_here"));
    cube_error_free(err);
    CONF_EXPECT_REFUSED(y, 16, CUBE_ERR_COMPILE);
    conf_release(y);
}

/* --- Skip --- */

CONF_TEST_NEEDS(skip_launch_leaves_buffers_unchanged, CUBE_FEATURE_KERNELS)
{
    enum { COUNT = 100 };
    cube_handle x = floats(COUNT, 1), y = floats(COUNT, 50);
    CONF_OK(launch_scale(conf.k.scale, x, y, 3, 2, CUBE_LAUNCH_SKIP));
    CONF_OK(launch_scale(conf.k.scale_add, x, y, 3, 2, CUBE_LAUNCH_SKIP));
    CONF_OK(cube_sync(conf.client, (cube_handle[2]){x, y}, 2));
    expect_floats(y, COUNT, 1, 50);
    expect_floats(x, COUNT, 1, 1);
    /* With a dynamic count: nothing runs either. */
    uint32_t c[3] = {3, 1, 1};
    cube_handle cnt = conf_create(c, sizeof c);
    cube_arg a = cube_arg_buffer(y);
    CONF_OK(conf_launch(conf.k.count_probe, cube_count_dynamic(cnt), &a, 1,
                        CUBE_LAUNCH_SKIP));
    expect_floats(y, COUNT, 1, 50);
    conf_release(cnt);
    conf_release(x);
    conf_release(y);
}

CONF_TEST_NEEDS(skip_launch_still_reports_compile_error, CUBE_FEATURE_KERNELS)
{
    cube_handle x = floats(4, 0), y = floats(4, 0), z = floats(4, 0);
    cube_error *err = launch_broken(x, y, z, CUBE_LAUNCH_SKIP);
    CONF_CODE(err, CUBE_ERR_COMPILE);
    assert_non_null(cube_error_log(err));
    assert_non_null(strstr(cube_error_log(err), "conf_undeclared_identifier"));
    cube_error_free(err);
    cube_arg a = cube_arg_buffer(y);
    CONF_EXPECT(conf_launch(conf.k.missing_entry, cube_count_static(1, 1, 1),
                            &a, 1, CUBE_LAUNCH_SKIP),
                CUBE_ERR_COMPILE);
    CONF_EXPECT(launch_broken(x, y, z, CUBE_LAUNCH_SKIP | CUBE_LAUNCH_CHECKED),
                CUBE_ERR_COMPILE);
    /* Whatever Skip recorded, a full write makes the buffers good again. */
    float zero[4] = {0};
    CONF_WRITE_OK(x, zero, 16);
    CONF_WRITE_OK(y, zero, 16);
    CONF_WRITE_OK(z, zero, 16);
    conf_release(x);
    conf_release(y);
    conf_release(z);
}

CONF_TEST_NEEDS(skip_launch_still_validates_limits_and_arguments,
                CUBE_FEATURE_KERNELS)
{
    cube_handle x = floats(32, 0), y = floats(32, 0);
    CONF_EXPECT(launch_limits(conf.k.too_many_units, x, y, CUBE_LAUNCH_SKIP),
                CUBE_ERR_RESOURCE_LIMIT);
    CONF_EXPECT(launch_limits(conf.k.dim_z_over, x, y, CUBE_LAUNCH_SKIP),
                CUBE_ERR_RESOURCE_LIMIT);
    cube_arg two[2] = {cube_arg_buffer(x), cube_arg_buffer(y)};
    CONF_EXPECT(conf_launch(conf.k.shared_over, cube_count_static(1, 1, 1), two,
                            2, CUBE_LAUNCH_SKIP),
                CUBE_ERR_RESOURCE_LIMIT);
    CONF_EXPECT(conf_launch(conf.k.scale, cube_count_static(1, 1, 1), two, 2,
                            CUBE_LAUNCH_SKIP),
                CUBE_ERR_INVALID_ARGUMENT);
    double d = 1;
    cube_arg wrong[3] = {cube_arg_buffer(x), cube_arg_buffer(y),
                         cube_arg_scalar(&d, 8)};
    CONF_EXPECT(conf_launch(conf.k.scale, cube_count_static(1, 1, 1), wrong, 3,
                            CUBE_LAUNCH_SKIP),
                CUBE_ERR_INVALID_ARGUMENT);
    CONF_EXPECT(launch_scale(conf.k.scale, x, y, 1, 0, CUBE_LAUNCH_SKIP),
                CUBE_ERR_INVALID_ARGUMENT);
    cube_handle gone = floats(4, 0);
    conf_release(gone);
    CONF_EXPECT(launch_scale(conf.k.scale, x, gone, 1, 1, CUBE_LAUNCH_SKIP),
                CUBE_ERR_NOT_FOUND);
    float zero[32] = {0};
    CONF_WRITE_OK(x, zero, sizeof zero);
    CONF_WRITE_OK(y, zero, sizeof zero);
    conf_release(x);
    conf_release(y);
}

CONF_TEST_NEEDS(skip_then_execute_runs_the_kernel, CUBE_FEATURE_KERNELS)
{
    enum { COUNT = 50 };
    uint32_t init[COUNT], got[COUNT];
    for (int i = 0; i < COUNT; i++)
        init[i] = 0xABCD0000u + (uint32_t)i;
    cube_handle y = conf_create(init, sizeof init);
    cube_arg args[2] = {cube_arg_buffer(y), cube_arg_u32(42)};
    /* skip_probe is launched nowhere else: this Skip is its first launch
     * on the client (compile and cache), and drops it. */
    CONF_OK(conf_launch(conf.k.skip_probe, cube_count_static(4, 1, 1), args, 2,
                        CUBE_LAUNCH_SKIP));
    CONF_READ_OK(y, got, sizeof got);
    assert_memory_equal(got, init, sizeof init);
    CONF_OK(cube_check(conf.client, &y, 1));
    /* The Execute launch that follows runs. */
    CONF_OK(conf_launch(conf.k.skip_probe, cube_count_static(4, 1, 1), args, 2,
                        CUBE_LAUNCH_EXECUTE));
    CONF_READ_OK(y, got, sizeof got);
    for (int i = 0; i < COUNT; i++)
        assert_int_equal(got[i], 42);
    /* Skip again after Execute: still nothing happens. */
    args[1] = cube_arg_u32(7);
    CONF_OK(conf_launch(conf.k.skip_probe, cube_count_static(4, 1, 1), args, 2,
                        CUBE_LAUNCH_SKIP));
    CONF_READ_OK(y, got, sizeof got);
    for (int i = 0; i < COUNT; i++)
        assert_int_equal(got[i], 42);
    conf_release(y);
}
