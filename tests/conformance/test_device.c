/* Device features: graphs, timed windows, pitched copies and many threads
 * on one device. Written for a GPU backend (hardware graphs, device
 * timestamps, 2-D copies, a queue per stream) and run unchanged on the CPU,
 * where each test asserts what the CPU documents (software graphs, the
 * host clock, synchronous streams).
 *
 * Sizes follow the backend: small on the CPU, where work is done before a
 * call returns, large on a device, where only long work exposes a race.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "conformance.h"

#define EXEC CUBE_LAUNCH_EXECUTE

/* --- sizes --- */

/* Whether big problems only cost time here (backends.c). */
static int d_small(void)
{
    return conf_backend_note("small_problems") != NULL;
}

static uint32_t d_n(void)
{
    return d_small() ? (1u << 14) : (1u << 20);
}

static uint32_t d_iters(void)
{
    return d_small() ? 8u : 2048u;
}

/* --- helpers --- */

static double d_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static cube_error *d_spin(cube_handle x, cube_handle y, uint32_t n,
                          uint32_t iters)
{
    cube_arg args[3] = {cube_arg_buffer(x), cube_arg_buffer(y),
                        cube_arg_u32(iters)};
    return conf_launch(conf.k.spin,
                       cube_count_static(conf_div_up(n, 256), 1, 1), args, 3,
                       EXEC);
}

static cube_error *d_rewrite(cube_handle x, uint32_t n, uint32_t iters)
{
    cube_arg args[2] = {cube_arg_buffer(x), cube_arg_u32(iters)};
    return conf_launch(conf.k.rewrite,
                       cube_count_static(conf_div_up(n, 256), 1, 1), args, 2,
                       EXEC);
}

/* y[i] = x[i + 1], and 0 past the end: a bounds-checked launch. */
static cube_error *d_shift(cube_handle x, cube_handle y, uint32_t n)
{
    cube_arg args[3] = {cube_arg_buffer(x), cube_arg_buffer(y),
                        cube_arg_u32(1)};
    return conf_launch(conf.k.oob_read,
                       cube_count_static(conf_div_up(n, 32), 1, 1), args, 3,
                       EXEC | CUBE_LAUNCH_CHECKED);
}

static void d_expect_at(const uint32_t *got, const uint32_t *want, uint32_t n,
                        const char *what, int round, const char *file, int line)
{
    for (uint32_t i = 0; i < n; i++)
        if (got[i] != want[i]) {
            print_error("%s:%d: round %d: %s: element %u is 0x%08x, expected "
                        "0x%08x\n",
                        file, line, round, what, i, got[i], want[i]);
            _fail(file, line);
        }
}
#define D_EXPECT(got, want, n, what, round)                                    \
    d_expect_at((got), (want), (n), (what), (round), __FILE__, __LINE__)

/* ========================================================================
 * Graphs
 * ======================================================================== */

/* The chain: t = spin(x); t rewritten in place; y = t shifted by one
 * (checked). Three kernels, each reading what the one before wrote. */
static void d_chain_codes(cube_handle x, cube_handle t, cube_handle y,
                          uint32_t n, uint32_t iters, cube_code codes[3])
{
    codes[0] = conf_code(d_spin(x, t, n, iters));
    codes[1] = conf_code(d_rewrite(t, n, iters));
    codes[2] = conf_code(d_shift(t, y, n));
}

static void d_chain_model(const uint32_t *x, uint32_t *t, uint32_t *y,
                          uint32_t n, uint32_t iters)
{
    conf_spin_model(x, t, n, iters);
    conf_rewritten(t, t, n, iters);
    for (uint32_t i = 0; i < n; i++)
        y[i] = i + 1 < n ? t[i + 1] : 0u;
}

static const cube_code d_ok3[3] = {CUBE_OK, CUBE_OK, CUBE_OK};
static const char *const d_chain_what[3] = {"spin", "rewrite",
                                            "shift (checked)"};

CONF_TEST_NEEDS(
    device_graph_chain_of_three_kernels_replays_like_direct_launches,
    CUBE_FEATURE_KERNELS)
{
    enum { ROUNDS = 5 };
    const uint32_t n = d_n(), iters = d_iters();
    const uint64_t bytes = n * 4ull;
    uint32_t *x0 = conf_host_u32(n), *junk = conf_host_u32(n),
             *want_t = conf_host_u32(n);
    uint32_t *want_y = conf_host_u32(n), *got = conf_host_u32(n),
             *prev_y = conf_host_u32(n);
    conf_pattern(x0, bytes, 0xD1);
    memset(junk, 0xAB, bytes);
    cube_handle x = conf_create(x0, bytes);
    cube_handle t = conf_empty(bytes), y = conf_empty(bytes);
    cube_handle t2 = conf_empty(bytes), y2 = conf_empty(bytes);

    CONF_OK(cube_graph_prepare(conf.client));
    cube_code codes[3];
    /* Warm-up: the chain once, for real. */
    d_chain_codes(x, t, y, n, iters, codes);
    CONF_EXPECT_CODES(codes, d_ok3, d_chain_what, 3);
    CONF_OK(cube_graph_begin(conf.client));
    d_chain_codes(x, t, y, n, iters, codes);
    cube_graph_id id = 0;
    cube_error *ended = cube_graph_end(conf.client, &id);
    CONF_OK(ended);
    CONF_EXPECT_CODES(codes, d_ok3, d_chain_what, 3);
    assert_true(id != 0);

    for (int r = 0; r < ROUNDS; r++) {
        /* A new input, and garbage where the outputs go: the replay must
         * read the one and rewrite the others. */
        conf_pattern(x0, bytes, 0xD100 + (uint32_t)r);
        CONF_WRITE_OK(x, x0, bytes);
        CONF_WRITE_OK(t, junk, bytes);
        CONF_WRITE_OK(y, junk, bytes);
        CONF_OK(cube_graph_replay(conf.client, id));
        /* The same chain, launched directly, into other buffers. */
        d_chain_codes(x, t2, y2, n, iters, codes);
        CONF_EXPECT_CODES(codes, d_ok3, d_chain_what, 3);
        d_chain_model(x0, want_t, want_y, n, iters);
        CONF_READ_OK(t, got, bytes);
        D_EXPECT(got, want_t, n, "t after the replay", r);
        CONF_READ_OK(t2, got, bytes);
        D_EXPECT(got, want_t, n, "t after the direct launches", r);
        CONF_READ_OK(y2, got, bytes);
        D_EXPECT(got, want_y, n, "y after the direct launches", r);
        CONF_READ_OK(y, got, bytes);
        D_EXPECT(got, want_y, n, "y after the replay", r);
        /* New input, new results. */
        if (r > 0 && memcmp(got, prev_y, bytes) == 0)
            fail_msg("round %d: the replay gave the same y as round %d", r,
                     r - 1);
        memcpy(prev_y, got, bytes);
    }
    CONF_OK(cube_graph_destroy(conf.client, id));
    cube_handle all[5] = {x, t, y, t2, y2};
    for (int i = 0; i < 5; i++)
        conf_release(all[i]);
    free(x0);
    free(junk);
    free(want_t);
    free(want_y);
    free(got);
    free(prev_y);
}

CONF_TEST_NEEDS(device_graph_misuse_is_graph_state_and_leaves_the_stream_usable,
                CUBE_FEATURE_KERNELS)
{
    const uint32_t n = d_n(), iters = d_iters();
    const uint64_t bytes = n * 4ull;
    uint32_t *x0 = conf_host_u32(n), *got = conf_host_u32(n),
             *want = conf_host_u32(n);
    conf_pattern(x0, bytes, 0xD2);
    cube_handle x = conf_create(x0, bytes), y = conf_empty(bytes);

    /* Out of order, outside any capture. */
    CONF_EXPECT(cube_graph_begin(conf.client), CUBE_ERR_GRAPH_STATE);
    cube_graph_id none = 0;
    CONF_EXPECT(cube_graph_end(conf.client, &none), CUBE_ERR_GRAPH_STATE);
    CONF_EXPECT(cube_graph_replay(conf.client, 0x6A0000000000D2ull),
                CUBE_ERR_NOT_FOUND);

    /* Inside the window: whatever would synchronize is refused, and the
     * capture goes on. A window opened before stays open. */
    cube_profile_token before = 0;
    CONF_OK(cube_profile_start(conf.client, &before));
    CONF_OK(cube_graph_prepare(conf.client));
    CONF_OK(cube_graph_begin(conf.client));
    enum { NC = 9 };
    cube_code codes[NC];
    int k = 0;
    codes[k++] = conf_code(d_spin(x, y, n, iters));
    memset(got, 0xCD, bytes);
    codes[k++] = conf_code(conf_read(y, got, bytes));
    codes[k++] = conf_code(cube_sync(conf.client, NULL, 0));
    codes[k++] = conf_code(cube_sync(conf.client, &y, 1));
    cube_profile_token inside = 0;
    codes[k++] = conf_code(cube_profile_start(conf.client, &inside));
    cube_profile_result res;
    codes[k++] = conf_code(cube_profile_end(conf.client, before, &res));
    codes[k++] = conf_code(cube_graph_begin(conf.client));
    codes[k++] = conf_code(cube_graph_replay(conf.client, 0x6A0000000000D2ull));
    codes[k++] = conf_code(d_rewrite(y, n, iters));
    cube_graph_id id = 0;
    cube_error *ended = cube_graph_end(conf.client, &id);
    CONF_OK(ended);
    static const cube_code want_codes[NC] = {CUBE_OK,
                                             CUBE_ERR_GRAPH_STATE,
                                             CUBE_ERR_GRAPH_STATE,
                                             CUBE_ERR_GRAPH_STATE,
                                             CUBE_ERR_GRAPH_STATE,
                                             CUBE_ERR_GRAPH_STATE,
                                             CUBE_ERR_GRAPH_STATE,
                                             CUBE_ERR_GRAPH_STATE,
                                             CUBE_OK};
    static const char *const what[NC] = {"launch 1 in the window",
                                         "cube_read in the window",
                                         "cube_sync (no handles)",
                                         "cube_sync (y)",
                                         "cube_profile_start in the window",
                                         "cube_profile_end in the window",
                                         "cube_graph_begin while capturing",
                                         "cube_graph_replay while capturing",
                                         "launch 2 in the window"};
    assert_int_equal(k, NC);
    CONF_EXPECT_CODES(codes, want_codes, what, NC);
    assert_true(id != 0);
    for (uint32_t i = 0; i < n; i++)
        if (got[i] != 0xCDCDCDCDu)
            fail_msg("a refused read wrote element %u", i);
    CONF_OK(cube_profile_end(conf.client, before, &res));

    /* The graph holds both launches; end unprepared the stream. */
    CONF_EXPECT(cube_graph_begin(conf.client), CUBE_ERR_GRAPH_STATE);
    CONF_OK(cube_graph_replay(conf.client, id));
    CONF_READ_OK(y, got, bytes);
    conf_spin_model(x0, want, n, iters);
    conf_rewritten(want, want, n, iters);
    D_EXPECT(got, want, n, "y after the replay", 1);
    /* A destroyed graph is gone: replaying or destroying it again is
     * CUBE_ERR_NOT_FOUND. */
    CONF_OK(cube_graph_destroy(conf.client, id));
    CONF_EXPECT(cube_graph_replay(conf.client, id), CUBE_ERR_NOT_FOUND);
    CONF_EXPECT(cube_graph_destroy(conf.client, id), CUBE_ERR_NOT_FOUND);
    /* The stream works as before. */
    CONF_OK(cube_sync(conf.client, &y, 1));
    CONF_OK(d_spin(x, y, n, iters));
    CONF_READ_OK(y, got, bytes);
    conf_spin_model(x0, want, n, iters);
    D_EXPECT(got, want, n, "y launched after the graph", 2);
    conf_release(x);
    conf_release(y);
    free(x0);
    free(got);
    free(want);
}

CONF_TEST_NEEDS(
    device_graph_capture_that_allocates_follows_the_backends_graph_kind,
    CUBE_FEATURE_KERNELS)
{
    /* A size no earlier test asked for, odd, so no cached block fits. */
    const uint64_t big =
        d_small() ? (3ull << 20) + 4 * 37 : (96ull << 20) + 4 * 37;
    const uint32_t bn = (uint32_t)(big / 4);
    const uint32_t n = d_n(), iters = d_iters();
    const uint64_t bytes = n * 4ull;
    cube_utilities u;
    CONF_OK(cube_client_utilities(conf.client, &u));
    uint32_t *x0 = conf_host_u32(n);
    conf_pattern(x0, bytes, 0xD3);
    cube_handle x = conf_create(x0, bytes), y = conf_empty(bytes);

    CONF_OK(cube_graph_prepare(conf.client));
    CONF_OK(d_spin(x, y, n, iters));
    CONF_OK(cube_graph_begin(conf.client));
    cube_code codes[3];
    codes[0] = conf_code(d_spin(x, y, n, iters));
    /* New memory inside the window, written by a recorded launch. */
    cube_handle fresh = {0};
    codes[1] = conf_code(cube_empty(conf.client, big, &fresh));
    cube_arg fa[2] = {cube_arg_buffer(fresh), cube_arg_u32(5)};
    codes[2] =
        fresh.bits
            ? conf_code(conf_launch(
                  conf.k.fill, cube_count_static(conf_div_up(bn, 32), 1, 1), fa,
                  2, EXEC))
            : CUBE_ERR_NOT_FOUND;
    cube_graph_id id = 0;
    cube_code end = conf_code(cube_graph_end(conf.client, &id));
    static const char *const what[3] = {"launch in the window",
                                        "cube_empty in the window",
                                        "launch on the new buffer"};
    CONF_EXPECT_CODES(codes, d_ok3, what, 3);

    if (u.software_graphs) {
        /* Software graphs (cubert/graph.h): allocating in the window is
         * allowed, and the graph pins the new buffer. */
        assert_int_equal(end, CUBE_OK);
        assert_true(id != 0);
        uint32_t *got = conf_host_u32(bn);
        memset(got, 0, big);
        CONF_WRITE_OK(fresh, got, big);
        CONF_OK(cube_graph_replay(conf.client, id));
        CONF_READ_OK(fresh, got, big);
        for (uint32_t i = 0; i < bn; i++)
            if (got[i] != 5u + i) {
                uint32_t v = got[i];
                free(got);
                fail_msg("fresh[%u] = %u after the replay, expected %u", i, v,
                         5u + i);
            }
        free(got);
        CONF_OK(cube_graph_destroy(conf.client, id));
    } else {
        /* Hardware graphs: a capture that needed memory the prepared pool
         * did not hold cannot be replayed safely, and is refused when it
         * ends; the stream is no longer capturing. */
        cube_error *synced = cube_sync(conf.client, NULL, 0);
        if (cube_error_code(synced) == CUBE_ERR_GRAPH_STATE) {
            /* Still capturing: end it, so the tests after this one run on
             * a stream in its normal state, then fail. */
            cube_graph_id stray = 0;
            cube_error_free(cube_graph_end(conf.client, &stray));
            if (stray)
                cube_error_free(cube_graph_destroy(conf.client, stray));
        }
        assert_int_equal(end, CUBE_ERR_GRAPH_STATE);
        CONF_OK(synced);
    }
    conf_release(fresh);
    /* Either way the stream goes on working. */
    uint32_t *got = conf_host_u32(n), *want = conf_host_u32(n);
    CONF_OK(d_rewrite(y, n, 1));
    CONF_READ_OK(y, got, bytes);
    conf_spin_model(x0, want, n, iters);
    conf_rewritten(want, want, n, 1);
    D_EXPECT(got, want, n, "y after the capture", 1);
    conf_release(x);
    conf_release(y);
    free(x0);
    free(got);
    free(want);
}

/* ========================================================================
 * Timed windows
 * ======================================================================== */

static void d_expect_method(const cube_profile_result *r)
{
    /* cube_properties.timing says how the device's windows are timed. */
    assert_int_equal(r->method, conf.props.timing);
    if (strcmp(conf.props.backend, "cuda") == 0)
        assert_int_equal(r->method, CUBE_TIMING_DEVICE);
}

CONF_TEST_NEEDS(
    device_profile_window_times_real_work_and_inner_window_is_not_longer,
    CUBE_FEATURE_KERNELS)
{
    const uint32_t n = d_n(), iters = 4 * d_iters();
    const uint64_t bytes = n * 4ull;
    uint32_t *x0 = conf_host_u32(n), *got = conf_host_u32(n),
             *want = conf_host_u32(n);
    conf_pattern(x0, bytes, 0xD4);
    cube_handle x = conf_create(x0, bytes), y = conf_empty(bytes);
    /* Compiled before the windows open. */
    CONF_OK(d_spin(x, y, n, iters));
    CONF_OK(cube_sync(conf.client, NULL, 0));

    double t0 = d_now();
    cube_profile_token outer = 0, inner = 0;
    CONF_OK(cube_profile_start(conf.client, &outer));
    CONF_OK(d_spin(x, y, n, iters));
    CONF_OK(d_rewrite(y, n, iters));
    CONF_OK(cube_profile_start(conf.client, &inner));
    for (int i = 0; i < 3; i++)
        CONF_OK(d_rewrite(y, n, iters));
    cube_profile_result ri, ro;
    memset(&ri, 0xAB, sizeof ri);
    memset(&ro, 0xAB, sizeof ro);
    CONF_OK(cube_profile_end(conf.client, inner, &ri));
    CONF_OK(d_rewrite(y, n, iters));
    CONF_OK(cube_profile_end(conf.client, outer, &ro));
    double host = d_now() - t0;

    assert_int_equal(ri.launches, 3);
    assert_int_equal(ro.launches, 6);
    d_expect_method(&ri);
    d_expect_method(&ro);
    if (!(ri.seconds > 0))
        fail_msg("the inner window took %g s", ri.seconds);
    if (!(ro.seconds >= ri.seconds))
        fail_msg("the outer window (%g s) is shorter than the inner (%g s)",
                 ro.seconds, ri.seconds);
    /* The work happened between the first start and the last end, as the
     * host saw them (a millisecond of slack for the two clocks). */
    if (!(ro.seconds <= host + 1e-3))
        fail_msg("the outer window took %g s, the host saw %g s", ro.seconds,
                 host);
    /* And it is done when the window ends. */
    CONF_READ_OK(y, got, bytes);
    conf_spin_model(x0, want, n, iters);
    for (int i = 0; i < 5; i++)
        conf_rewritten(want, want, n, iters);
    D_EXPECT(got, want, n, "y after the windows", 1);
    conf_release(x);
    conf_release(y);
    free(x0);
    free(got);
    free(want);
}

/* ========================================================================
 * Pitched copies
 * ======================================================================== */

/* Rows of W floats inside rows of P floats (the pitch). */
enum { PR = 1000, PW = 37, PP = 64 };

/* Distinct values everywhere: row r, column c of the padded buffer. */
static void d_pitched_fill(float *m, uint32_t rows, float base)
{
    for (uint32_t r = 0; r < rows; r++)
        for (uint32_t c = 0; c < PP; c++)
            m[(size_t)r * PP + c] = base + (float)(r * 100 + c);
}

static cube_copy_desc d_pitched(cube_handle h, uint64_t rows, uint64_t cols)
{
    cube_copy_desc d;
    memset(&d, 0, sizeof d);
    d.handle = h;
    d.rank = 2;
    d.shape[0] = rows;
    d.shape[1] = cols;
    d.strides[0] = PP;
    d.strides[1] = 1;
    d.elem_size = 4;
    return d;
}

static cube_error *d_read1(const cube_copy_desc *d, void *dst, uint64_t size)
{
    void *dsts[1] = {dst};
    uint64_t sizes[1] = {size};
    return cube_read(conf.client, d, dsts, sizes, 1);
}

static cube_error *d_write1(const cube_copy_desc *d, const void *src,
                            uint64_t size)
{
    const void *srcs[1] = {src};
    uint64_t sizes[1] = {size};
    return cube_write(conf.client, d, srcs, sizes, 1);
}

/* Whole buffer of `elems` floats against the model, byte for byte. */
static void d_whole_at(cube_handle h, const float *model, uint64_t elems,
                       const char *what, const char *file, int line)
{
    float *got = malloc(elems * 4);
    assert_non_null(got);
    memset(got, 0, elems * 4);
    cube_error *err = conf_read(h, got, elems * 4);
    if (err)
        free(got);
    conf_ok_at(err, "read of the whole buffer", file, line);
    for (uint64_t i = 0; i < elems; i++)
        if (memcmp(&got[i], &model[i], 4) != 0) {
            print_error("%s:%d: %s: row %llu, column %llu is %g, expected "
                        "%g\n",
                        file, line, what, (unsigned long long)(i / PP),
                        (unsigned long long)(i % PP), (double)got[i],
                        (double)model[i]);
            free(got);
            _fail(file, line);
        }
    free(got);
}
#define D_WHOLE(h, model, elems, what)                                         \
    d_whole_at((h), (model), (elems), (what), __FILE__, __LINE__)

CONF_TEST(device_pitched_copies_touch_exactly_their_rows_and_keep_the_padding)
{
    /* The pitch is what the pitched layout gives for 37 floats on 256-byte
     * rows; the last row needs only its real elements. */
    uint64_t shape[2] = {PR, PW}, strides[2] = {0, 0}, need = 0;
    CONF_OK(cube_layout_strides(CUBE_LAYOUT_PITCHED, 2, shape, 4, 256, strides,
                                &need));
    assert_int_equal(strides[0], PP);
    assert_int_equal(strides[1], 1);
    assert_int_equal(need, ((uint64_t)(PR - 1) * PP + PW) * 4);

    const uint64_t elems = (uint64_t)PR * PP;
    float *model = malloc(elems * 4), *block = malloc((size_t)PR * PW * 4);
    float *got = malloc((size_t)PR * PW * 4);
    assert_non_null(model);
    assert_non_null(block);
    assert_non_null(got);
    d_pitched_fill(model, PR, 0.5f);
    cube_handle h = conf_create(model, elems * 4);

    /* 1. All 1000 x 37: the 27 floats of padding per row stay. */
    for (uint32_t r = 0; r < PR; r++)
        for (uint32_t c = 0; c < PW; c++) {
            block[r * PW + c] = -(float)(r * 1000 + c) - 1.0f;
            model[(size_t)r * PP + c] = block[r * PW + c];
        }
    cube_copy_desc all = d_pitched(h, PR, PW);
    CONF_OK(d_write1(&all, block, (uint64_t)PR * PW * 4));
    D_WHOLE(h, model, elems, "after the 1000 x 37 write");
    memset(got, 0, (size_t)PR * PW * 4);
    CONF_OK(d_read1(&all, got, (uint64_t)PR * PW * 4));
    assert_memory_equal(got, block, (size_t)PR * PW * 4);

    /* 2. A 250 x 19 block at row 123, column 11, through a slice that ends
     * exactly at the block's last element. */
    enum { R0 = 123, C0 = 11, BH = 250, BW = 19 };
    uint64_t off = ((uint64_t)R0 * PP + C0) * 4;
    uint64_t span = ((uint64_t)(BH - 1) * PP + BW) * 4;
    cube_handle s = conf_slice(h, off, span);
    for (uint32_t r = 0; r < BH; r++)
        for (uint32_t c = 0; c < BW; c++) {
            block[r * BW + c] = 7.0e6f + (float)(r * 100 + c);
            model[(size_t)(R0 + r) * PP + C0 + c] = block[r * BW + c];
        }
    cube_copy_desc sub = d_pitched(s, BH, BW);
    CONF_OK(d_write1(&sub, block, (uint64_t)BH * BW * 4));
    D_WHOLE(h, model, elems, "after the 250 x 19 write at (123, 11)");
    memset(got, 0, (size_t)BH * BW * 4);
    CONF_OK(d_read1(&sub, got, (uint64_t)BH * BW * 4));
    assert_memory_equal(got, block, (size_t)BH * BW * 4);
    /* One row longer does not fit the slice: refused, nothing written. */
    cube_copy_desc over = d_pitched(s, BH + 1, BW);
    float *more = calloc((size_t)(BH + 1) * BW, 4);
    assert_non_null(more);
    CONF_EXPECT(d_write1(&over, more, (uint64_t)(BH + 1) * BW * 4),
                CUBE_ERR_INVALID_ARGUMENT);
    free(more);
    D_WHOLE(h, model, elems, "after a refused write");

    /* 3. Both blocks read in one call. */
    float *got2 = malloc((size_t)BH * BW * 4);
    assert_non_null(got2);
    cube_copy_desc two[2] = {all, sub};
    void *dsts[2] = {got, got2};
    uint64_t sizes[2] = {(uint64_t)PR * PW * 4, (uint64_t)BH * BW * 4};
    CONF_OK(cube_read(conf.client, two, dsts, sizes, 2));
    for (uint32_t r = 0; r < PR; r++)
        for (uint32_t c = 0; c < PW; c++)
            if (memcmp(&got[r * PW + c], &model[(size_t)r * PP + c], 4))
                fail_msg("batched read: row %u, column %u", r, c);
    for (uint32_t r = 0; r < BH; r++)
        for (uint32_t c = 0; c < BW; c++)
            if (memcmp(&got2[r * BW + c],
                       &model[(size_t)(R0 + r) * PP + C0 + c], 4))
                fail_msg("batched read of the block: row %u, column %u", r, c);
    free(got2);

    /* 4. A buffer of exactly the size the layout needs (no padding after
     * the last row): the whole 1000 x 37 in and out again. */
    cube_handle tight = conf_create(model, need);
    for (uint32_t r = 0; r < PR; r++)
        for (uint32_t c = 0; c < PW; c++) {
            block[r * PW + c] = 3.0f * (float)(r * PW + c) + 0.25f;
            model[(size_t)r * PP + c] = block[r * PW + c];
        }
    cube_copy_desc tall = d_pitched(tight, PR, PW);
    CONF_OK(d_write1(&tall, block, (uint64_t)PR * PW * 4));
    D_WHOLE(tight, model, need / 4, "the tight buffer after the write");
    memset(got, 0, (size_t)PR * PW * 4);
    CONF_OK(d_read1(&tall, got, (uint64_t)PR * PW * 4));
    assert_memory_equal(got, block, (size_t)PR * PW * 4);

    conf_release(s);
    conf_release(h);
    conf_release(tight);
    free(model);
    free(block);
    free(got);
}

/* ========================================================================
 * Many threads on one device
 * ======================================================================== */

enum { DT_THREADS = 8, DT_ROUNDS = 200 };

typedef struct d_worker {
    int id;
    cube_stream_id stream;
    cube_handle shared;       /* read only, made by the main thread */
    const float *shared_host; /* what it holds */
    uint32_t nmax;
    long long checked;
    int failures;
    char first[512];
} d_worker;

static void d_worker_fail(d_worker *w, int round, const char *what,
                          cube_error *err)
{
    if (w->failures++ == 0) {
        char *text = err ? cube_error_format(err) : NULL;
        snprintf(w->first, sizeof w->first, "thread %d, round %d: %s%s%s",
                 w->id, round, what, text ? ": " : "", text ? text : "");
        free(text);
    }
    cube_error_free(err);
}

static cube_error *d_axpy_on(cube_handle x, cube_handle y, uint32_t n, float a)
{
    cube_arg args[3] = {cube_arg_buffer(x), cube_arg_buffer(y),
                        cube_arg_f32(a)};
    return conf_launch(conf.k.scale_add,
                       cube_count_static(conf_div_up(n, 64), 1, 1), args, 3,
                       EXEC);
}

/* Each round: a new x (create) and y (empty, then written), y = a * shared
 * + y, y = x + y, read and checked, both released. Values stay small
 * integers, so float arithmetic is exact. */
static void *d_worker_main(void *arg)
{
    d_worker *w = arg;
    cube_client *c = conf.client;
    w->stream = cube_stream_current(c);
    float *x = malloc((size_t)w->nmax * 4), *y0 = malloc((size_t)w->nmax * 4);
    float *got = malloc((size_t)w->nmax * 4);
    if (!x || !y0 || !got) {
        d_worker_fail(w, 0, "out of host memory", NULL);
        goto done;
    }
    const float a = (float)(w->id + 1);
    for (int r = 0; r < DT_ROUNDS && w->failures < 3; r++) {
        uint32_t n = 1 + (uint32_t)(w->id * 7919 + r * 131) % w->nmax;
        uint64_t bytes = n * 4ull;
        for (uint32_t i = 0; i < n; i++) {
            x[i] = (float)((i + (uint32_t)r) % 512);
            y0[i] = (float)((int)(i % 7) - w->id);
        }
        cube_handle hx = {0}, hy = {0};
        cube_error *err = cube_create(c, x, bytes, &hx);
        if (err) {
            d_worker_fail(w, r, "cube_create", err);
            continue;
        }
        err = cube_empty(c, bytes, &hy);
        if (err) {
            d_worker_fail(w, r, "cube_empty", err);
            cube_error_free(cube_handle_release(c, hx));
            continue;
        }
        if ((err = conf_write(hy, y0, bytes)))
            d_worker_fail(w, r, "cube_write", err);
        else if ((err = d_axpy_on(w->shared, hy, n, a)))
            d_worker_fail(w, r, "launch on the shared input", err);
        else if ((err = d_axpy_on(hx, hy, n, 1.0f)))
            d_worker_fail(w, r, "launch on the own input", err);
        else if ((err = conf_read(hy, got, bytes)))
            d_worker_fail(w, r, "cube_read", err);
        else
            for (uint32_t i = 0; i < n; i++) {
                float want = a * w->shared_host[i] + y0[i] + x[i];
                if (got[i] != want) {
                    char msg[128];
                    snprintf(msg, sizeof msg, "y[%u] = %g, expected %g", i,
                             (double)got[i], (double)want);
                    d_worker_fail(w, r, msg, NULL);
                    break;
                }
                w->checked++;
            }
        if ((err = cube_handle_release(c, hx)))
            d_worker_fail(w, r, "release of x", err);
        if ((err = cube_handle_release(c, hy)))
            d_worker_fail(w, r, "release of y", err);
    }
done:
    free(x);
    free(y0);
    free(got);
    return NULL;
}

CONF_TEST_NEEDS(device_eight_threads_own_streams_200_rounds_share_one_input,
                CUBE_FEATURE_KERNELS)
{
    const uint32_t nmax = d_small() ? 3000u : (1u << 18);
    const uint64_t bytes = nmax * 4ull;
    /* Compiled before the threads start. */
    cube_handle warm = conf_empty(256);
    cube_arg wa[3] = {cube_arg_buffer(warm), cube_arg_buffer(warm),
                      cube_arg_f32(1)};
    CONF_OK(conf_launch(conf.k.scale_add, cube_count_static(1, 1, 1), wa, 3,
                        CUBE_LAUNCH_SKIP));
    CONF_OK(conf_launch(conf.k.scale, cube_count_static(1, 1, 1), wa, 3,
                        CUBE_LAUNCH_SKIP));
    conf_release(warm);

    /* The shared input is the result of a launch on this thread's stream
     * whose own input is released at once; the threads start with no
     * barrier, so their first use waits for that launch. */
    float *seed = malloc(bytes), *shared_host = malloc(bytes);
    assert_non_null(seed);
    assert_non_null(shared_host);
    for (uint32_t i = 0; i < nmax; i++) {
        seed[i] = (float)((int)(i % 97) - 48);
        shared_host[i] = 2.0f * seed[i];
    }
    cube_handle hs = conf_create(seed, bytes), shared = conf_empty(bytes);
    cube_arg sa[3] = {cube_arg_buffer(hs), cube_arg_buffer(shared),
                      cube_arg_f32(2.0f)};
    CONF_OK(conf_launch(conf.k.scale,
                        cube_count_static(conf_div_up(nmax, 64), 1, 1), sa, 3,
                        EXEC));
    conf_release(hs);

    d_worker w[DT_THREADS];
    pthread_t t[DT_THREADS];
    memset(w, 0, sizeof w);
    for (int i = 0; i < DT_THREADS; i++) {
        w[i].id = i;
        w[i].shared = shared;
        w[i].shared_host = shared_host;
        w[i].nmax = nmax;
        assert_int_equal(pthread_create(&t[i], NULL, d_worker_main, &w[i]), 0);
    }
    for (int i = 0; i < DT_THREADS; i++)
        assert_int_equal(pthread_join(t[i], NULL), 0);
    int failures = 0;
    for (int i = 0; i < DT_THREADS; i++) {
        if (w[i].failures)
            print_error("%s (%d failures)\n", w[i].first, w[i].failures);
        failures += w[i].failures;
    }
    assert_int_equal(failures, 0);
    for (int i = 0; i < DT_THREADS; i++) {
        assert_true(w[i].checked > 0);
        assert_true(w[i].stream != 0);
        assert_true(w[i].stream != cube_stream_current(conf.client));
        for (int j = 0; j < i; j++)
            assert_true(w[i].stream != w[j].stream);
    }
    /* Read by all, written by none. */
    float *got = malloc(bytes);
    assert_non_null(got);
    CONF_READ_OK(shared, got, bytes);
    assert_memory_equal(got, shared_host, bytes);
    free(got);
    conf_release(shared);
    free(seed);
    free(shared_host);
}
