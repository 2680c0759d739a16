/* Validating launches (CUBE_LAUNCH_VALIDATE): out-of-range CUBE_AT
 * accesses behave as checked ones and are reported as the launch's
 * failure, recorded on the buffers the kernel writes. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "conformance.h"

#define VALIDATE CUBE_LAUNCH_VALIDATE

/* Fails unless err is CUBE_ERR_INVALID_ARGUMENT and its message holds
 * every one of the NULL-terminated needles; frees err. */
static void expect_report_at(cube_error *err, const char *const *needles,
                             const char *file, int line)
{
    if (!err) {
        print_error("%s:%d: the validating launch succeeded\n", file, line);
        _fail(file, line);
    }
    const char *msg = cube_error_message(err);
    int bad = cube_error_code(err) != CUBE_ERR_INVALID_ARGUMENT;
    for (size_t i = 0; needles[i] && !bad; i++)
        bad = strstr(msg, needles[i]) == NULL;
    if (bad) {
        char *text = cube_error_format(err);
        print_error("%s:%d: unexpected report:\n%s\n", file, line,
                    text ? text : "?");
        free(text);
        cube_error_free(err);
        _fail(file, line);
    }
    cube_error_free(err);
}
#define EXPECT_REPORT(err, ...)                                                \
    expect_report_at((err), (const char *const[]){__VA_ARGS__, NULL},          \
                     __FILE__, __LINE__)

CONF_TEST_NEEDS(validate_write_past_end_reports_kernel_buffer_index_length,
                CUBE_FEATURE_KERNELS)
{
    /* 127 elements, 4 cubes of 32 units: unit 127 alone writes past. */
    enum { N = 127 };
    uint32_t init[N + 1];
    for (uint32_t i = 0; i <= N; i++)
        init[i] = 0xA0000000u + i;
    cube_handle all = conf_create(init, sizeof init);
    cube_handle y = conf_slice(all, 0, N * 4);
    cube_arg args[2] = {cube_arg_buffer(y), cube_arg_u32(7)};
    EXPECT_REPORT(conf_launch(conf.k.oob_write, cube_count_static(4, 1, 1),
                              args, 2, VALIDATE),
                  "oob_write", "parameter 0 'y'", "indexed at 127",
                  "length is 127 elements", "1 out-of-range");
    /* The output carries the failure (its whole allocation does). */
    CONF_EXPECT_REFUSED(y, N * 4, CUBE_ERR_INVALID_ARGUMENT);
    CONF_EXPECT_REFUSED(all, sizeof init, CUBE_ERR_INVALID_ARGUMENT);
    conf_release(y);
    conf_release(all);
}

CONF_TEST_NEEDS(validate_read_past_end_reports_input_and_fails_outputs,
                CUBE_FEATURE_KERNELS)
{
    enum { NB = 100 };
    uint32_t init[2 * NB];
    for (uint32_t i = 0; i < 2 * NB; i++)
        init[i] = 1000u + i;
    cube_handle all = conf_create(init, sizeof init);
    cube_handle x = conf_slice(all, 0, NB * 4);
    cube_handle y = conf_empty(NB * 4);
    /* y[i] = x[i + 1]: only i = 99 reads past x's 100 elements. */
    cube_arg args[3] = {cube_arg_buffer(x), cube_arg_buffer(y),
                        cube_arg_u32(1)};
    EXPECT_REPORT(conf_launch(conf.k.oob_read,
                              cube_count_static(conf_div_up(NB, 32), 1, 1),
                              args, 3, VALIDATE),
                  "oob_read", "parameter 0 'x'", "indexed at 100",
                  "length is 100 elements", "1 out-of-range");
    /* y is what the kernel writes: it carries the failure; x, only read,
     * does not. */
    CONF_EXPECT_REFUSED(y, NB * 4, CUBE_ERR_INVALID_ARGUMENT);
    CONF_OK(cube_check(conf.client, &x, 1));
    conf_release(x);
    conf_release(y);
    conf_release(all);
}

CONF_TEST_NEEDS(validate_counts_every_out_of_range_access, CUBE_FEATURE_KERNELS)
{
    /* 10 cubes of 32 units over 100 elements: 220 writes past the end;
     * which one is first depends on the schedule. */
    cube_handle y = conf_empty(100 * 4);
    cube_arg args[2] = {cube_arg_buffer(y), cube_arg_u32(3)};
    EXPECT_REPORT(conf_launch(conf.k.oob_write, cube_count_static(10, 1, 1),
                              args, 2, VALIDATE | CUBE_LAUNCH_CHECKED),
                  "oob_write", "'y'", "length is 100 elements",
                  "220 out-of-range");
    conf_release(y);
}

CONF_TEST_NEEDS(validate_in_range_launch_succeeds_and_clears_output_failure,
                CUBE_FEATURE_KERNELS)
{
    enum { N = 128 };
    uint32_t got[N];
    cube_handle y = conf_empty(N * 4);
    conf_mark_failed(y);
    CONF_EXPECT_REFUSED(y, N * 4, conf_mark_code());
    cube_arg args[2] = {cube_arg_buffer(y), cube_arg_u32(5)};
    CONF_OK(conf_launch(conf.k.oob_write, cube_count_static(4, 1, 1), args, 2,
                        VALIDATE));
    CONF_OK(cube_check(conf.client, &y, 1));
    CONF_READ_OK(y, got, sizeof got);
    for (uint32_t i = 0; i < N; i++)
        assert_int_equal(got[i], 5);
    /* After a failed validating launch, the next clean one clears it. */
    cube_arg wide[2] = {cube_arg_buffer(y), cube_arg_u32(6)};
    EXPECT_REPORT(conf_launch(conf.k.oob_write, cube_count_static(5, 1, 1),
                              wide, 2, VALIDATE),
                  "32 out-of-range");
    CONF_EXPECT_REFUSED(y, N * 4, CUBE_ERR_INVALID_ARGUMENT);
    CONF_OK(conf_launch(conf.k.oob_write, cube_count_static(4, 1, 1), wide, 2,
                        VALIDATE));
    CONF_READ_OK(y, got, sizeof got);
    for (uint32_t i = 0; i < N; i++)
        assert_int_equal(got[i], 6);
    conf_release(y);
}

/* A kernel with barriers and shared memory runs alike validated. */
static const char SRC_SYNC_SHIFT[] =
    "CUBE_KERNEL(sync_shift, CUBE_IN(uint32_t, x), CUBE_OUT(uint32_t, y),\n"
    "            CUBE_SHARED(uint32_t, tile, 64))\n"
    "{\n"
    "    uint32_t u = UNIT_POS_X, i = ABSOLUTE_POS_X;\n"
    "    tile[u] = CUBE_AT(x, i + 1);\n"
    "    cube_sync();\n"
    "    CUBE_AT(y, i) = tile[CUBE_DIM_X - 1 - u];\n"
    "}\n";

CONF_TEST_NEEDS(validate_kernel_with_cube_sync_reports_and_computes,
                CUBE_FEATURE_KERNELS)
{
    enum { N = 128 };
    uint32_t x0[N], got[N];
    for (uint32_t i = 0; i < N; i++)
        x0[i] = 1 + i;
    cube_kernel *k = conf_kernel("sync_shift", SRC_SYNC_SHIFT, 64, 1, 1);
    cube_handle x = conf_create(x0, sizeof x0), y = conf_empty(N * 4);
    cube_arg args[2] = {cube_arg_buffer(x), cube_arg_buffer(y)};
    EXPECT_REPORT(conf_launch(k, cube_count_static(2, 1, 1), args, 2, VALIDATE),
                  "sync_shift", "parameter 0 'x'", "indexed at 128",
                  "1 out-of-range");
    /* The same launch checked computes what the validating one did. */
    CONF_OK(conf_launch(k, cube_count_static(2, 1, 1), args, 2,
                        CUBE_LAUNCH_CHECKED));
    CONF_READ_OK(y, got, sizeof got);
    for (uint32_t i = 0; i < N; i++) {
        uint32_t c = i / 64, u = i % 64, src = c * 64 + 63 - u + 1;
        assert_int_equal(got[i], src < N ? x0[src] : 0);
    }
    cube_kernel_release(k);
    conf_release(x);
    conf_release(y);
}

CONF_TEST_NEEDS(validate_launch_is_refused_while_capturing,
                CUBE_FEATURE_KERNELS)
{
    cube_handle y = conf_empty(128 * 4);
    cube_arg args[2] = {cube_arg_buffer(y), cube_arg_u32(1)};
    CONF_OK(cube_graph_prepare(conf.client));
    /* Warm-up: both forms compiled, so the capture only sees the
     * refusal. */
    CONF_OK(conf_launch(conf.k.oob_write, cube_count_static(4, 1, 1), args, 2,
                        VALIDATE));
    CONF_OK(
        conf_launch(conf.k.oob_write, cube_count_static(4, 1, 1), args, 2, 0));
    CONF_OK(cube_graph_begin(conf.client));
    cube_code refused = conf_code(conf_launch(
        conf.k.oob_write, cube_count_static(4, 1, 1), args, 2, VALIDATE));
    cube_code recorded = conf_code(
        conf_launch(conf.k.oob_write, cube_count_static(4, 1, 1), args, 2, 0));
    cube_graph_id id = 0;
    CONF_OK(cube_graph_end(conf.client, &id));
    assert_int_equal(refused, CUBE_ERR_GRAPH_STATE);
    assert_int_equal(recorded, CUBE_OK);
    /* Refused, recorded nowhere. */
    CONF_OK(cube_check(conf.client, &y, 1));
    CONF_OK(cube_graph_destroy(conf.client, id));
    conf_release(y);
}
