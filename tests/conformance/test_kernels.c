/* Kernels: elementwise work, positions, scalars, shared memory and
 * cube_sync, atomics, dynamic cube counts, bounds checking, kernel
 * objects. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "conformance.h"

#define EXEC CUBE_LAUNCH_EXECUTE

CONF_TEST_NEEDS(kernel_scale_add_elementwise_for_uneven_sizes,
                CUBE_FEATURE_KERNELS)
{
    static const uint32_t sizes[] = {1, 2, 63, 64, 65, 127, 1000, 4097, 100003};
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        uint32_t n = sizes[s];
        float *x = malloc(n * sizeof *x), *y = malloc(n * sizeof *y);
        float *got = malloc(n * sizeof *got);
        assert_non_null(x);
        assert_non_null(y);
        assert_non_null(got);
        /* Small integers: exact in float whatever the evaluation order. */
        for (uint32_t i = 0; i < n; i++) {
            x[i] = (float)(i % 1000);
            y[i] = (float)(i % 7) - 3.0f;
        }
        cube_handle hx = conf_create(x, n * 4ull),
                    hy = conf_create(y, n * 4ull);
        cube_arg args[3] = {cube_arg_buffer(hx), cube_arg_buffer(hy),
                            cube_arg_f32(3.0f)};
        CONF_OK(conf_launch(conf.k.scale_add,
                            cube_count_static(conf_div_up(n, 64), 1, 1), args,
                            3, EXEC));
        CONF_READ_OK(hy, got, n * 4ull);
        for (uint32_t i = 0; i < n; i++)
            if (got[i] != 3.0f * x[i] + y[i])
                fail_msg("n=%u: y[%u] = %g, expected %g", n, i, (double)got[i],
                         (double)(3.0f * x[i] + y[i]));
        /* x was an input: unchanged. */
        CONF_READ_OK(hx, got, n * 4ull);
        assert_memory_equal(got, x, n * 4ull);
        conf_release(hx);
        conf_release(hy);
        free(x);
        free(y);
        free(got);
    }
}

CONF_TEST_NEEDS(kernel_launches_on_one_stream_run_in_order,
                CUBE_FEATURE_KERNELS)
{
    enum { COUNT = 777, ROUNDS = 10 };
    float x[COUNT], y[COUNT], got[COUNT];
    for (int i = 0; i < COUNT; i++) {
        x[i] = (float)(i % 13);
        y[i] = 1.0f;
    }
    cube_handle hx = conf_create(x, sizeof x), hy = conf_create(y, sizeof y);
    cube_arg args[3] = {cube_arg_buffer(hx), cube_arg_buffer(hy),
                        cube_arg_f32(1.0f)};
    for (int r = 0; r < ROUNDS; r++)
        CONF_OK(conf_launch(conf.k.scale_add,
                            cube_count_static(conf_div_up(COUNT, 64), 1, 1),
                            args, 3, EXEC));
    /* Then y = 2 * y: a different kernel, reading the same buffer. */
    cube_handle hz = conf_empty(sizeof y);
    cube_arg args2[3] = {cube_arg_buffer(hy), cube_arg_buffer(hz),
                         cube_arg_f32(2.0f)};
    CONF_OK(conf_launch(conf.k.scale,
                        cube_count_static(conf_div_up(COUNT, 64), 1, 1), args2,
                        3, EXEC));
    CONF_READ_OK(hz, got, sizeof got);
    for (int i = 0; i < COUNT; i++)
        assert_true(got[i] == 2.0f * (1.0f + ROUNDS * x[i]));
    conf_release(hx);
    conf_release(hy);
    conf_release(hz);
}

CONF_TEST_NEEDS(kernel_on_slices_writes_only_the_slice, CUBE_FEATURE_KERNELS)
{
    enum { COUNT = 300, OFF = 100, LEN = 70 };
    float all[COUNT], got[COUNT];
    for (int i = 0; i < COUNT; i++)
        all[i] = (float)i;
    cube_handle h = conf_create(all, sizeof all);
    cube_handle in = conf_slice(h, 0, LEN * 4);
    cube_handle out = conf_slice(h, OFF * 4, LEN * 4);
    cube_arg args[3] = {cube_arg_buffer(in), cube_arg_buffer(out),
                        cube_arg_f32(-1.0f)};
    /* More units than the slice has elements: CUBE_LEN is the slice's. */
    CONF_OK(
        conf_launch(conf.k.scale, cube_count_static(4, 1, 1), args, 3, EXEC));
    CONF_READ_OK(h, got, sizeof got);
    for (int i = 0; i < COUNT; i++) {
        float want = (i >= OFF && i < OFF + LEN) ? -(float)(i - OFF) : (float)i;
        assert_true(got[i] == want);
    }
    conf_release(in);
    conf_release(out);
    conf_release(h);
}

/* Launches `k` over `args`, expecting CUBE_ERR_INVALID_ARGUMENT that
 * names the argument, its offset and the alignment it needs. */
static void expect_misaligned(cube_kernel *k, const cube_arg *args,
                              size_t nargs, uint32_t mode, unsigned arg,
                              unsigned offset, unsigned align)
{
    cube_error *err =
        conf_launch(k, cube_count_static(1, 1, 1), args, nargs, mode);
    CONF_CODE(err, CUBE_ERR_INVALID_ARGUMENT);
    char want[3][64];
    snprintf(want[0], sizeof want[0], "args[%u]", arg);
    snprintf(want[1], sizeof want[1], "byte offset %u ", offset);
    snprintf(want[2], sizeof want[2], "aligned to %u bytes", align);
    for (int i = 0; i < 3; i++)
        if (!strstr(cube_error_message(err), want[i]))
            fail_msg("'%s' does not name '%s'", cube_error_message(err),
                     want[i]);
    cube_error_free(err);
}

/* A slice whose start is not aligned for the elements of the parameter it
 * is bound to (on CUDA a device fault that breaks the context) is refused
 * before anything runs, in Skip mode too, and recorded nowhere; an aligned
 * slice of the same buffer runs. */
CONF_TEST_NEEDS(kernel_slice_misaligned_for_its_elements_is_refused,
                CUBE_FEATURE_KERNELS)
{
    enum { BYTES = 256 };
    unsigned char bytes[BYTES], got[BYTES];
    conf_pattern(bytes, sizeof bytes, 11);
    cube_handle h = conf_create(bytes, sizeof bytes);
    /* fill is (OUT uint32_t y, uint32_t v). */
    for (unsigned off = 1; off < 4; off++) {
        cube_handle s = conf_slice(h, off, 128);
        cube_arg args[2] = {cube_arg_buffer(s), cube_arg_u32(7)};
        expect_misaligned(conf.k.fill, args, 2, EXEC, 0, off, 4);
        expect_misaligned(conf.k.fill, args, 2, CUBE_LAUNCH_SKIP, 0, off, 4);
        /* Nothing ran and nothing is recorded, on the slice or its
         * buffer. */
        CONF_OK(cube_check(conf.client, (cube_handle[2]){s, h}, 2));
        conf_release(s);
    }
    /* The message names the buffer by its label too. */
    CONF_OK(cube_handle_set_label(conf.client, h, "stencil input"));
    cube_handle lab = conf_slice(h, 1, 128);
    cube_arg lab_args[2] = {cube_arg_buffer(lab), cube_arg_u32(7)};
    CONF_EXPECT_MSG(
        conf_launch(conf.k.fill, cube_count_static(1, 1, 1), lab_args, 2, EXEC),
        CUBE_ERR_INVALID_ARGUMENT, "\"stencil input\"");
    conf_release(lab);
    /* A slice of a slice: the offset that counts is the composed one. */
    cube_handle outer = conf_slice(h, 2, 200);
    cube_handle inner = conf_slice(outer, 4, 128);
    cube_arg nested[2] = {cube_arg_buffer(inner), cube_arg_u32(7)};
    expect_misaligned(conf.k.fill, nested, 2, EXEC, 0, 6, 4);
    conf_release(inner);
    conf_release(outer);
    /* An input is held to the rule as well: scale is (IN float x, OUT
     * float y, float a). */
    cube_handle x = conf_slice(h, 130, 64), y = conf_slice(h, 64, 64);
    cube_arg scale_args[3] = {cube_arg_buffer(x), cube_arg_buffer(y),
                              cube_arg_f32(2)};
    expect_misaligned(conf.k.scale, scale_args, 3, EXEC, 0, 130, 4);
    conf_release(x);
    conf_release(y);
    /* Eight-byte elements need eight: scalars is (OUT double fd, OUT
     * uint64_t iu, six scalars). */
    cube_handle fd = conf_slice(h, 4, 16), iu = conf_slice(h, 32, 32);
    cube_arg scalar_args[8] = {cube_arg_buffer(fd),
                               cube_arg_buffer(iu),
                               cube_arg_f32(1),
                               cube_arg_f64(2),
                               cube_arg_i32(3),
                               cube_arg_u64(4),
                               cube_arg_scalar(&(uint8_t){5}, 1),
                               cube_arg_scalar(&(int16_t){6}, 2)};
    expect_misaligned(conf.k.scalars, scalar_args, 8, EXEC, 0, 4, 8);
    conf_release(fd);
    conf_release(iu);
    CONF_OK(cube_check(conf.client, &h, 1));
    CONF_READ_OK(h, got, sizeof got);
    assert_memory_equal(got, bytes, sizeof bytes);
    /* A buffer made in a dry run has no memory yet: its slice's offset
     * is what counts, and the dry run's launch is refused alike. */
    CONF_OK(cube_dry_run_begin(conf.client));
    cube_handle later = conf_empty(256);
    cube_handle later2 = conf_slice(later, 2, 128);
    cube_arg dry[2] = {cube_arg_buffer(later2), cube_arg_u32(7)};
    expect_misaligned(conf.k.fill, dry, 2, EXEC, 0, 2, 4);
    CONF_OK(cube_dry_run_end(conf.client));
    conf_release(later2);
    conf_release(later);

    /* Aligned slices of the same buffer run. */
    cube_handle s4 = conf_slice(h, 4, 128);
    cube_arg args[2] = {cube_arg_buffer(s4), cube_arg_u32(7)};
    CONF_OK(
        conf_launch(conf.k.fill, cube_count_static(1, 1, 1), args, 2, EXEC));
    uint32_t filled[32];
    CONF_READ_OK(s4, filled, sizeof filled);
    for (uint32_t i = 0; i < 32; i++)
        assert_int_equal(filled[i], 7 + i);
    conf_release(s4);
    /* One-byte elements go anywhere. */
    cube_kernel *bytes_k =
        conf_kernel("set_bytes",
                    "CUBE_KERNEL(set_bytes, CUBE_OUT(uint8_t, y))\n"
                    "{\n"
                    "    uint32_t i = ABSOLUTE_POS_X;\n"
                    "    if (i < CUBE_LEN(y))\n"
                    "        y[i] = (uint8_t)(i + 1);\n"
                    "}\n",
                    32, 1, 1);
    cube_handle s1 = conf_slice(h, 201, 5);
    cube_arg one[1] = {cube_arg_buffer(s1)};
    CONF_OK(conf_launch(bytes_k, cube_count_static(1, 1, 1), one, 1, EXEC));
    unsigned char five[5];
    CONF_READ_OK(s1, five, sizeof five);
    for (int i = 0; i < 5; i++)
        assert_int_equal(five[i], i + 1);
    conf_release(s1);
    cube_kernel_release(bytes_k);
    conf_release(h);
}

/* Checks the positions kernel's four outputs against a reference. */
static void check_positions(cube_kernel *k, uint32_t dx, uint32_t dy,
                            uint32_t dz, uint32_t nx, uint32_t ny, uint32_t nz)
{
    uint32_t w = nx * dx, h = ny * dy, d = nz * dz;
    uint64_t total = (uint64_t)w * h * d, bytes = total * 4;
    cube_handle px = conf_empty(bytes), py = conf_empty(bytes);
    cube_handle pz = conf_empty(bytes), lin = conf_empty(bytes);
    cube_arg args[4] = {cube_arg_buffer(px), cube_arg_buffer(py),
                        cube_arg_buffer(pz), cube_arg_buffer(lin)};
    CONF_OK(conf_launch(k, cube_count_static(nx, ny, nz), args, 4, EXEC));
    uint32_t *gx = malloc(bytes), *gy = malloc(bytes), *gz = malloc(bytes);
    uint32_t *gl = malloc(bytes);
    assert_non_null(gx);
    assert_non_null(gy);
    assert_non_null(gz);
    assert_non_null(gl);
    CONF_READ_OK(px, gx, bytes);
    CONF_READ_OK(py, gy, bytes);
    CONF_READ_OK(pz, gz, bytes);
    CONF_READ_OK(lin, gl, bytes);
    for (uint32_t cz = 0; cz < nz; cz++)
        for (uint32_t cy = 0; cy < ny; cy++)
            for (uint32_t cx = 0; cx < nx; cx++)
                for (uint32_t uz = 0; uz < dz; uz++)
                    for (uint32_t uy = 0; uy < dy; uy++)
                        for (uint32_t ux = 0; ux < dx; ux++) {
                            uint32_t x = cx * dx + ux, y = cy * dy + uy;
                            uint32_t z = cz * dz + uz;
                            uint32_t i = x + w * (y + h * z);
                            uint32_t cube = cx + nx * (cy + ny * cz);
                            uint32_t unit = ux + dx * (uy + dy * uz);
                            if (gx[i] != x || gy[i] != y || gz[i] != z ||
                                gl[i] != cube * dx * dy * dz + unit)
                                fail_msg("position (%u,%u,%u): got (%u,%u,%u) "
                                         "lin %u, expected lin %u",
                                         x, y, z, gx[i], gy[i], gz[i], gl[i],
                                         cube * dx * dy * dz + unit);
                        }
    free(gx);
    free(gy);
    free(gz);
    free(gl);
    conf_release(px);
    conf_release(py);
    conf_release(pz);
    conf_release(lin);
}

CONF_TEST_NEEDS(kernel_2d_positions_match_reference, CUBE_FEATURE_KERNELS)
{
    check_positions(conf.k.pos2d, 8, 4, 1, 3, 5, 1);
    check_positions(conf.k.pos2d, 8, 4, 1, 1, 1, 1);
    check_positions(conf.k.pos2d, 8, 4, 1, 7, 2, 3); /* 2-D cubes, 3-D count */
}

CONF_TEST_NEEDS(kernel_3d_positions_match_reference, CUBE_FEATURE_KERNELS)
{
    check_positions(conf.k.pos3d, 4, 2, 3, 2, 3, 2);
    check_positions(conf.k.pos3d, 4, 2, 3, 5, 1, 1);
}

CONF_TEST_NEEDS(kernel_scalars_of_every_size_arrive_intact,
                CUBE_FEATURE_KERNELS)
{
    cube_handle fd = conf_empty(2 * sizeof(double));
    cube_handle iu = conf_empty(4 * sizeof(uint64_t));
    const float f = 1.5f;
    const double d = 1e300 + 0.25e300; /* not a float */
    const int32_t i32 = -123456789;
    const uint64_t u64 = 0xFEDCBA9876543210ull;
    const uint8_t u8 = 0xAB;
    const int16_t i16 = -12345;
    cube_arg args[8] = {cube_arg_buffer(fd),     cube_arg_buffer(iu),
                        cube_arg_f32(f),         cube_arg_f64(d),
                        cube_arg_i32(i32),       cube_arg_u64(u64),
                        cube_arg_scalar(&u8, 1), cube_arg_scalar(&i16, 2)};
    CONF_OK(
        conf_launch(conf.k.scalars, cube_count_static(1, 1, 1), args, 8, EXEC));
    double gd[2];
    uint64_t gu[4];
    CONF_READ_OK(fd, gd, sizeof gd);
    CONF_READ_OK(iu, gu, sizeof gu);
    assert_true(gd[0] == (double)f);
    assert_true(gd[1] == d);
    assert_int_equal(gu[0], (uint64_t)(int64_t)i32);
    assert_true(gu[1] == u64);
    assert_int_equal(gu[2], u8);
    assert_int_equal(gu[3], (uint64_t)(int64_t)i16);
    conf_release(fd);
    conf_release(iu);
}

CONF_TEST_NEEDS(kernel_shared_memory_reverse_with_cube_dims_1_4_256_1024,
                CUBE_FEATURE_KERNELS)
{
    static const uint32_t dims[4] = {1, 4, 256, 1024};
    for (int k = 0; k < 4; k++) {
        uint32_t dim = dims[k], cubes = 3, n = dim * cubes;
        float *x = malloc(n * 4ull), *got = malloc(n * 4ull);
        assert_non_null(x);
        assert_non_null(got);
        for (uint32_t i = 0; i < n; i++)
            x[i] = (float)i;
        cube_handle hx = conf_create(x, n * 4ull), hy = conf_empty(n * 4ull);
        cube_arg args[2] = {cube_arg_buffer(hx), cube_arg_buffer(hy)};
        CONF_OK(conf_launch(conf.k.reverse[k], cube_count_static(cubes, 1, 1),
                            args, 2, EXEC));
        CONF_READ_OK(hy, got, n * 4ull);
        for (uint32_t c = 0; c < cubes; c++)
            for (uint32_t u = 0; u < dim; u++) {
                float want = x[c * dim + (dim - 1 - u)];
                if (got[c * dim + u] != want)
                    fail_msg("dim %u cube %u unit %u: %g, expected %g", dim, c,
                             u, (double)got[c * dim + u], (double)want);
            }
        conf_release(hx);
        conf_release(hy);
        free(x);
        free(got);
    }
}

CONF_TEST_NEEDS(kernel_shared_memory_tree_reduction_with_cube_sync,
                CUBE_FEATURE_KERNELS)
{
    static const uint32_t dims[3] = {4, 256, 1024};
    for (int k = 0; k < 3; k++) {
        uint32_t dim = dims[k], cubes = 5, n = dim * cubes;
        float *x = malloc(n * 4ull);
        float sums[5], want[5] = {0};
        assert_non_null(x);
        for (uint32_t i = 0; i < n; i++) {
            x[i] = (float)((i * 7u) % 17u);
            want[i / dim] += x[i];
        }
        cube_handle hx = conf_create(x, n * 4ull), hs = conf_empty(sizeof sums);
        cube_arg args[2] = {cube_arg_buffer(hx), cube_arg_buffer(hs)};
        CONF_OK(conf_launch(conf.k.reduce[k], cube_count_static(cubes, 1, 1),
                            args, 2, EXEC));
        CONF_READ_OK(hs, sums, sizeof sums);
        for (uint32_t c = 0; c < cubes; c++)
            if (sums[c] != want[c])
                fail_msg("dim %u cube %u: sum %g, expected %g", dim, c,
                         (double)sums[c], (double)want[c]);
        conf_release(hx);
        conf_release(hs);
        free(x);
    }
}

CONF_TEST_NEEDS(kernel_atomic_u32_and_i32_adds_are_exact, CUBE_FEATURE_KERNELS)
{
    enum { COUNT = 65536, BINS = 16 };
    uint32_t *x = malloc(COUNT * 4);
    assert_non_null(x);
    for (uint32_t i = 0; i < COUNT; i++)
        x[i] = i + 1; /* 1..N: sum N(N+1)/2 = 2147516416 fits u32 */
    uint32_t zero[BINS] = {0};
    cube_handle hx = conf_create(x, COUNT * 4);
    cube_handle total = conf_create(zero, 4),
                bins = conf_create(zero, sizeof zero);
    cube_handle neg = conf_create(zero, 4);
    cube_arg args[4] = {cube_arg_buffer(hx), cube_arg_buffer(total),
                        cube_arg_buffer(bins), cube_arg_buffer(neg)};
    for (int round = 1; round <= 2; round++) {
        CONF_OK(conf_launch(conf.k.atomic_int,
                            cube_count_static(COUNT / 256, 1, 1), args, 4,
                            EXEC));
        uint32_t t, b[BINS];
        int32_t ng;
        CONF_READ_OK(total, &t, 4);
        CONF_READ_OK(bins, b, sizeof b);
        CONF_READ_OK(neg, &ng, 4);
        assert_int_equal(t, (uint32_t)(2147516416ull * (uint64_t)round));
        for (int i = 0; i < BINS; i++)
            assert_int_equal(b[i], (uint32_t)round * (COUNT / BINS));
        assert_int_equal(ng, -COUNT * round);
    }
    conf_release(hx);
    conf_release(total);
    conf_release(bins);
    conf_release(neg);
    free(x);
}

CONF_TEST_NEEDS(kernel_atomic_f32_add_is_exact, CUBE_FEATURE_KERNELS)
{
    enum { COUNT = 65536 };
    float *x = malloc(COUNT * 4);
    assert_non_null(x);
    for (uint32_t i = 0; i < COUNT; i++)
        x[i] = 0.5f; /* every partial sum is exact in float */
    float acc = 10.0f;
    cube_handle hx = conf_create(x, COUNT * 4), ha = conf_create(&acc, 4);
    cube_arg args[2] = {cube_arg_buffer(hx), cube_arg_buffer(ha)};
    CONF_OK(conf_launch(conf.k.atomic_f32, cube_count_static(COUNT / 256, 1, 1),
                        args, 2, EXEC));
    float got = 0;
    CONF_READ_OK(ha, &got, 4);
    assert_true(got == 10.0f + COUNT * 0.5f);
    conf_release(hx);
    conf_release(ha);
    free(x);
}

CONF_TEST_NEEDS(kernel_dynamic_count_sees_count_written_by_previous_kernel,
                CUBE_FEATURE_KERNELS)
{
    enum { DIM = 32, MAXC = 8, COUNT = DIM * MAXC };
    /* The count lives in a slice of a larger buffer, after junk. */
    uint32_t init[16];
    for (int i = 0; i < 16; i++)
        init[i] = 0xFFFFFFFFu;
    init[4] = 1;
    init[5] = 1;
    init[6] = 1;
    cube_handle store = conf_create(init, sizeof init);
    cube_handle cnt = conf_slice(store, 16, 12);
    uint32_t fill[COUNT], got[COUNT];
    for (int i = 0; i < COUNT; i++)
        fill[i] = 0xEEEEEEEEu;
    cube_handle y = conf_create(fill, sizeof fill);
    static const uint32_t counts[] = {5, 2, 8, 1};
    for (size_t r = 0; r < sizeof counts / sizeof counts[0]; r++) {
        uint32_t n = counts[r];
        CONF_WRITE_OK(y, fill, sizeof fill);
        cube_arg a1[2] = {cube_arg_buffer(cnt), cube_arg_u32(n)};
        CONF_OK(conf_launch(conf.k.write_count, cube_count_static(1, 1, 1), a1,
                            2, EXEC));
        /* No barrier in between: stream order alone makes the count
         * visible. */
        cube_arg a2[1] = {cube_arg_buffer(y)};
        CONF_OK(conf_launch(conf.k.count_probe, cube_count_dynamic(cnt), a2, 1,
                            EXEC));
        CONF_READ_OK(y, got, sizeof got);
        for (uint32_t i = 0; i < COUNT; i++) {
            uint32_t want = i < n * DIM ? n * 1000u + i / DIM : 0xEEEEEEEEu;
            if (got[i] != want)
                fail_msg("count %u: y[%u] = 0x%x, expected 0x%x", n, i, got[i],
                         want);
        }
    }
    uint32_t back[16];
    CONF_READ_OK(store, back, sizeof back);
    assert_int_equal(back[3], 0xFFFFFFFFu);
    assert_int_equal(back[7], 0xFFFFFFFFu);
    assert_int_equal(back[4], 1);
    conf_release(cnt);
    conf_release(store);
    conf_release(y);
}

CONF_TEST(kernel_dynamic_count_buffer_under_12_bytes_is_invalid)
{
    uint32_t c[3] = {1, 1, 1};
    cube_handle whole = conf_create(c, sizeof c);
    cube_handle small = conf_slice(whole, 0, 11);
    uint32_t fill[32];
    memset(fill, 0x5A, sizeof fill);
    cube_handle y = conf_create(fill, sizeof fill);
    cube_arg a[1] = {cube_arg_buffer(y)};
    CONF_EXPECT(
        conf_launch(conf.k.count_probe, cube_count_dynamic(small), a, 1, EXEC),
        CUBE_ERR_INVALID_ARGUMENT);
    /* An argument error: nothing recorded, nothing run. */
    uint32_t got[32];
    CONF_READ_OK(y, got, sizeof got);
    assert_memory_equal(got, fill, sizeof fill);
    conf_release(small);
    conf_release(whole);
    conf_release(y);
}

/* Zero cubes: a static count with a zero component is a mistake in the
 * call, refused before anything else on every backend; a dynamic count is
 * only known when the launch executes, and one with a zero component runs
 * nothing and succeeds (on a backend without kernels the launch fails at
 * compile, as every launch there does). */
CONF_TEST(kernel_zero_count_static_is_refused_dynamic_runs_nothing)
{
    static const uint32_t zeros[][3] = {
        {0, 1, 1}, {1, 0, 1}, {1, 1, 0}, {0, 0, 0}};
    uint32_t fill[32], got[32];
    memset(fill, 0x5A, sizeof fill);
    cube_handle y = conf_create(fill, sizeof fill);
    cube_handle cnt = conf_empty(12);
    cube_arg a[1] = {cube_arg_buffer(y)};
    for (size_t z = 0; z < 4; z++) {
        const uint32_t *n = zeros[z];
        for (int skip = 0; skip < 2; skip++) {
            uint32_t mode = skip ? CUBE_LAUNCH_SKIP : EXEC;
            CONF_EXPECT_MSG(conf_launch(conf.k.count_probe,
                                        cube_count_static(n[0], n[1], n[2]), a,
                                        1, mode),
                            CUBE_ERR_INVALID_ARGUMENT, "count");
            CONF_OK(cube_check(conf.client, &y, 1));

            CONF_WRITE_OK(cnt, n, 12);
            cube_error *err = conf_launch(conf.k.count_probe,
                                          cube_count_dynamic(cnt), a, 1, mode);
            if (conf_runs_kernels()) {
                CONF_OK(err);
                CONF_OK(cube_check(conf.client, (cube_handle[2]){y, cnt}, 2));
            } else {
                CONF_EXPECT(err, conf_mark_code());
                CONF_WRITE_OK(y, fill, sizeof fill);
            }
            CONF_READ_OK(y, got, sizeof got);
            assert_memory_equal(got, fill, sizeof fill);
        }
    }
    if (conf_runs_kernels()) {
        /* The same buffer with one cube in it runs. */
        CONF_WRITE_OK(cnt, ((uint32_t[3]){1, 1, 1}), 12);
        CONF_OK(conf_launch(conf.k.count_probe, cube_count_dynamic(cnt), a, 1,
                            EXEC));
        CONF_READ_OK(y, got, sizeof got);
        for (int i = 0; i < 32; i++)
            assert_int_equal(got[i], 1000);
    }
    conf_release(cnt);
    conf_release(y);
}

/* A dynamic count of zero runs nothing, so it rewrites nothing: an output
 * that carried a failure keeps it (a static count's launch that ran clears
 * it: a full write). */
CONF_TEST_NEEDS(kernel_dynamic_zero_count_keeps_output_failures,
                CUBE_FEATURE_KERNELS)
{
    uint32_t fill[32];
    memset(fill, 0x5A, sizeof fill);
    cube_handle y = conf_create(fill, sizeof fill);
    cube_handle cnt = conf_create(((uint32_t[3]){0, 1, 1}), 12);
    cube_arg a[1] = {cube_arg_buffer(y)};
    conf_mark_failed(y);
    CONF_OK(
        conf_launch(conf.k.count_probe, cube_count_dynamic(cnt), a, 1, EXEC));
    CONF_EXPECT(cube_check(conf.client, &y, 1), CUBE_ERR_SEVERAL);
    CONF_EXPECT_REFUSED(y, sizeof fill, conf_mark_code());
    /* One cube: the launch ran, its output is trusted again. */
    CONF_WRITE_OK(cnt, ((uint32_t[3]){1, 1, 1}), 12);
    CONF_OK(
        conf_launch(conf.k.count_probe, cube_count_dynamic(cnt), a, 1, EXEC));
    CONF_OK(cube_check(conf.client, &y, 1));
    conf_release(cnt);
    conf_release(y);
}

/* Three neighbouring slices of one allocation: A | B | C. */
enum { NB = 100 };

CONF_TEST_NEEDS(kernel_checked_write_past_end_leaves_neighbours_intact,
                CUBE_FEATURE_KERNELS)
{
    uint32_t init[3 * NB], got[3 * NB];
    for (uint32_t i = 0; i < NB; i++) {
        init[i] = 0xA0000000u + i;
        init[NB + i] = 0xB0000000u + i;
        init[2 * NB + i] = 0xC0000000u + i;
    }
    cube_handle all = conf_create(init, sizeof init);
    cube_handle b = conf_slice(all, NB * 4, NB * 4);
    cube_arg args[2] = {cube_arg_buffer(b), cube_arg_u32(7)};
    /* Units for 2 * NB + some elements, B has NB. */
    CONF_OK(conf_launch(conf.k.oob_write,
                        cube_count_static(conf_div_up(2 * NB + 50, 32), 1, 1),
                        args, 2, CUBE_LAUNCH_CHECKED));
    CONF_READ_OK(all, got, sizeof got);
    for (uint32_t i = 0; i < NB; i++) {
        assert_int_equal(got[i], init[i]);
        assert_int_equal(got[NB + i], 7);
        assert_int_equal(got[2 * NB + i], init[2 * NB + i]);
    }
    /* The slice at the start too (writes land only forward of it here,
     * but the indices past its end are the neighbours). */
    cube_handle a = conf_slice(all, 0, NB * 4);
    cube_arg args2[2] = {cube_arg_buffer(a), cube_arg_u32(9)};
    CONF_OK(conf_launch(conf.k.oob_write, cube_count_static(10, 1, 1), args2, 2,
                        CUBE_LAUNCH_CHECKED));
    CONF_READ_OK(all, got, sizeof got);
    for (uint32_t i = 0; i < NB; i++) {
        assert_int_equal(got[i], 9);
        assert_int_equal(got[NB + i], 7);
        assert_int_equal(got[2 * NB + i], init[2 * NB + i]);
    }
    conf_release(a);
    conf_release(b);
    conf_release(all);
}

CONF_TEST_NEEDS(kernel_checked_read_past_end_gives_zero, CUBE_FEATURE_KERNELS)
{
    uint32_t init[3 * NB];
    for (uint32_t i = 0; i < 3 * NB; i++)
        init[i] = 1000u + i; /* never 0 */
    cube_handle all = conf_create(init, sizeof init);
    cube_handle x = conf_slice(all, NB * 4, NB * 4); /* B */
    cube_handle y = conf_empty(NB * 4);
    static const uint32_t offsets[] = {0,  NB / 2,   NB - 1,
                                       NB, 1u << 30, 0xFFFFFFFFu};
    for (size_t k = 0; k < sizeof offsets / sizeof offsets[0]; k++) {
        uint32_t off = offsets[k], got[NB];
        cube_arg args[3] = {cube_arg_buffer(x), cube_arg_buffer(y),
                            cube_arg_u32(off)};
        CONF_OK(conf_launch(conf.k.oob_read,
                            cube_count_static(conf_div_up(NB, 32), 1, 1), args,
                            3, CUBE_LAUNCH_CHECKED));
        CONF_READ_OK(y, got, sizeof got);
        for (uint32_t i = 0; i < NB; i++) {
            uint64_t j = (uint64_t)i + off;
            uint32_t want = j < NB ? init[NB + j] : 0;
            if (got[i] != want)
                fail_msg("offset %u: y[%u] = %u, expected %u", off, i, got[i],
                         want);
        }
    }
    conf_release(x);
    conf_release(y);
    conf_release(all);
}

CONF_TEST_NEEDS(kernel_math_functions_and_device_helpers, CUBE_FEATURE_KERNELS)
{
    enum { COUNT = 200 };
    float x[COUNT], got[COUNT];
    for (int i = 0; i < COUNT; i++)
        x[i] = (float)(i - 100) * 0.37f;
    cube_handle hx = conf_create(x, sizeof x), hy = conf_empty(sizeof x);
    cube_arg args[2] = {cube_arg_buffer(hx), cube_arg_buffer(hy)};
    CONF_OK(conf_launch(conf.k.math,
                        cube_count_static(conf_div_up(COUNT, 64), 1, 1), args,
                        2, EXEC));
    CONF_READ_OK(hy, got, sizeof got);
    for (int i = 0; i < COUNT; i++) {
        double v = x[i];
        double want = sqrt(fabs(v)) + 1.0 + fabs(v) + 2.0 * v;
        assert_true(fabs(got[i] - want) <= 1e-4 * (1.0 + fabs(want)));
    }
    conf_release(hx);
    conf_release(hy);
}

CONF_TEST_NEEDS(kernel_source_with_two_entries_runs_the_named_one,
                CUBE_FEATURE_KERNELS)
{
    uint32_t zero = 0, got = 0;
    cube_handle y = conf_create(&zero, 4);
    cube_arg a = cube_arg_buffer(y);
    CONF_OK(conf_launch(conf.k.two_entries, cube_count_static(1, 1, 1), &a, 1,
                        EXEC));
    CONF_READ_OK(y, &got, 4);
    assert_int_equal(got, 2);
    assert_string_equal(cube_kernel_name(conf.k.two_entries), "entry_two");
    conf_release(y);
}

CONF_TEST_NEEDS(kernel_object_is_usable_on_two_clients, CUBE_FEATURE_KERNELS)
{
    cube_client *other = NULL;
    CONF_OK(cube_client_open(conf.backend, NULL, &other));
    enum { COUNT = 100 };
    uint32_t got[COUNT];
    cube_handle h;
    CONF_OK(cube_empty(other, sizeof got, &h));
    cube_arg args[2] = {cube_arg_buffer(h), cube_arg_u32(5)};
    CONF_OK(cube_launch(other, conf.k.fill,
                        cube_count_static(conf_div_up(COUNT, 32), 1, 1), args,
                        2, EXEC));
    cube_copy_desc d = cube_copy_desc_contiguous(h, sizeof got, 4);
    void *dst[1] = {got};
    uint64_t sz[1] = {sizeof got};
    CONF_OK(cube_read(other, &d, dst, sz, 1));
    for (uint32_t i = 0; i < COUNT; i++)
        assert_int_equal(got[i], 5 + i);
    CONF_OK(cube_handle_release(other, h));
    cube_client_close(other);

    /* And still on ours after the other client is gone. */
    cube_handle mine = conf_empty(sizeof got);
    args[0] = cube_arg_buffer(mine);
    args[1] = cube_arg_u32(9);
    CONF_OK(conf_launch(conf.k.fill,
                        cube_count_static(conf_div_up(COUNT, 32), 1, 1), args,
                        2, EXEC));
    CONF_READ_OK(mine, got, sizeof got);
    for (uint32_t i = 0; i < COUNT; i++)
        assert_int_equal(got[i], 9 + i);
    conf_release(mine);
}

CONF_TEST(kernel_create_rejects_bad_descriptors)
{
    static const char *const bad_names[] = {"",    "1abc", "a-b",   "a b",
                                            "a.b", "é",    "name\n"};
    cube_kernel *k = NULL;
    for (size_t i = 0; i < sizeof bad_names / sizeof bad_names[0]; i++) {
        cube_kernel_desc d = {bad_names[i], "int x;", {1, 1, 1}};
        k = (cube_kernel *)&d;
        CONF_EXPECT_MSG(cube_kernel_create(&d, &k), CUBE_ERR_INVALID_ARGUMENT,
                        "name");
        assert_null(k);
    }
    char longname[300];
    memset(longname, 'a', sizeof longname - 1);
    longname[sizeof longname - 1] = '\0';
    cube_kernel_desc d = {longname, "int x;", {1, 1, 1}};
    CONF_EXPECT(cube_kernel_create(&d, &k), CUBE_ERR_INVALID_ARGUMENT);
    d.name = "fine";
    d.source = "";
    CONF_EXPECT_MSG(cube_kernel_create(&d, &k), CUBE_ERR_INVALID_ARGUMENT,
                    "source");
    d.source = "int x;";
    d.cube_dim[0] = 65536;
    d.cube_dim[1] = 65536;
    d.cube_dim[2] = 2;
    CONF_EXPECT_MSG(cube_kernel_create(&d, &k), CUBE_ERR_INVALID_ARGUMENT,
                    "cube_dim");
    assert_null(k);
    /* Accepted: underscores, digits after the first character, dim 0. */
    cube_kernel_desc ok = {"_a1_B2", "int x;", {0, 0, 0}};
    CONF_OK(cube_kernel_create(&ok, &k));
    assert_string_equal(cube_kernel_name(k), "_a1_B2");
    cube_kernel_release(k);
}

CONF_TEST(kernel_id_is_stable_and_distinguishes_kernels)
{
    cube_kernel *a = conf_kernel("fill", "int fill;", 32, 1, 1);
    cube_kernel *b = conf_kernel("fill", "int fill;", 32, 1, 1);
    cube_kernel *c = conf_kernel("fill", "int fill;", 32, 2, 1);
    cube_kernel *d = conf_kernel("fill", "int fill; ", 32, 1, 1);
    cube_kernel *e = conf_kernel("fil", "lint fill;", 32, 1, 1);
    cube_kernel *z = conf_kernel("fill", "int fill;", 32, 0, 0); /* 0 = 1 */
    assert_true(cube_kernel_id(a) != 0);
    assert_true(cube_kernel_id(a) == cube_kernel_id(b));
    assert_true(cube_kernel_id(a) == cube_kernel_id(z));
    assert_true(cube_kernel_id(a) != cube_kernel_id(c));
    assert_true(cube_kernel_id(a) != cube_kernel_id(d));
    assert_true(cube_kernel_id(a) != cube_kernel_id(e));
    assert_true(cube_kernel_id(conf.k.pos2d) != cube_kernel_id(conf.k.pos3d));
    assert_int_equal(cube_kernel_id(NULL), 0);
    assert_string_equal(cube_kernel_name(NULL), "");
    cube_kernel_release(a);
    cube_kernel_release(b);
    cube_kernel_release(c);
    cube_kernel_release(d);
    cube_kernel_release(e);
    cube_kernel_release(z);
    cube_kernel_release(NULL);
}

CONF_TEST_NEEDS(kernel_retain_release_keeps_kernel_alive, CUBE_FEATURE_KERNELS)
{
    /* A copy of the fill kernel with its own object: retained twice,
     * released three times; launches work until the last release. */
    cube_kernel_desc d = {"fill",
                          "CUBE_KERNEL(fill, CUBE_OUT(uint32_t, y), "
                          "CUBE_SCALAR(uint32_t, v))\n"
                          "{\n"
                          "    uint32_t i = ABSOLUTE_POS_X;\n"
                          "    if (i < CUBE_LEN(y))\n"
                          "        y[i] = v + i;\n"
                          "}\n",
                          {32, 1, 1}};
    cube_kernel *k = NULL;
    CONF_OK(cube_kernel_create(&d, &k));
    cube_kernel_retain(k);
    cube_kernel_retain(k);
    cube_kernel_release(k);
    cube_kernel_release(k);
    uint32_t got[40];
    cube_handle y = conf_empty(sizeof got);
    cube_arg args[2] = {cube_arg_buffer(y), cube_arg_u32(3)};
    CONF_OK(conf_launch(k, cube_count_static(2, 1, 1), args, 2, EXEC));
    /* The client's cache may keep its own reference: releasing ours while
     * the client lives must not break later launches of an equal kernel. */
    cube_kernel_release(k);
    cube_kernel *again = NULL;
    CONF_OK(cube_kernel_create(&d, &again));
    args[1] = cube_arg_u32(4);
    CONF_OK(conf_launch(again, cube_count_static(2, 1, 1), args, 2, EXEC));
    CONF_READ_OK(y, got, sizeof got);
    for (uint32_t i = 0; i < 40; i++)
        assert_int_equal(got[i], 4 + i);
    cube_kernel_release(again);
    conf_release(y);
}
