/* Graphs, sentence by sentence of the server contract:
 *
 * graph_prepare  "Prepare stream_id for an upcoming graph capture: route
 *                 allocations into a stable pool and snapshot it, so every
 *                 buffer allocated between here and end_capture can be
 *                 pinned for the graph's lifetime."
 * begin_capture  "Begin recording the launches issued on stream_id into a
 *                 graph instead of executing them ... Between this call and
 *                 end_capture the stream must not synchronize — a read, a
 *                 sync or a profile either aborts the capture or is
 *                 refused"
 * end_capture    "Stop recording, store the captured graph in the backend's
 *                 registry, and return its GraphId, ready to replay."
 * replay         "re-running the whole recorded launch sequence against its
 *                 original buffers ... what it reports is the enqueue — an
 *                 unknown or destroyed graph, a refusal ... A failure also
 *                 leaves the graph's write set carrying it, so a read of
 *                 those buffers fails until a replay lands."
 * graph_destroy  "Release the graph identified by graph, destroying whatever
 *                 it recorded and unpinning the buffers it retained ... no
 *                 in-flight replay can still read those buffers once they
 *                 return to the pool ... A no-op ... for an unknown id."
 *                 (cubert's destroy returns an error: an unknown id
 *                 changes nothing and answers CUBE_ERR_NOT_FOUND, as a
 *                 replay of it does.)
 *
 * and the CPU's refinements in cubert/graph.h: inside a capture window a
 * read, a write, a sync or a profile is refused with CUBE_ERR_GRAPH_STATE,
 * allocating is allowed (the graph pins the new buffer), and a launch that
 * fails validation is returned as usual and not recorded.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "conformance.h"

#define EXEC CUBE_LAUNCH_EXECUTE
/* Elements per test buffer: five cubes of 64, the last one partial. */
#define GN 300u
#define GBYTES (GN * 4ull)

/* --- helpers --- */

/* A float buffer of GN elements holding base + step * i. */
static cube_handle g_floats(float base, float step)
{
    float v[GN];
    for (uint32_t i = 0; i < GN; i++)
        v[i] = base + step * (float)i;
    return conf_create(v, GBYTES);
}

static void g_fill_host(float *v, float base, float step)
{
    for (uint32_t i = 0; i < GN; i++)
        v[i] = base + step * (float)i;
}

static void g_read(cube_handle h, float *v)
{
    CONF_READ_OK(h, v, GBYTES);
}

/* Fails unless h holds exactly want[0, GN). */
static void g_expect_at(cube_handle h, const float *want, const char *file,
                        int line)
{
    float got[GN];
    memset(got, 0, sizeof got);
    cube_error *err = conf_read(h, got, GBYTES);
    conf_ok_at(err, "read", file, line);
    for (uint32_t i = 0; i < GN; i++)
        if (got[i] != want[i]) {
            print_error("%s:%d: element %u is %g, expected %g\n", file, line, i,
                        (double)got[i], (double)want[i]);
            _fail(file, line);
        }
}
#define G_EXPECT(h, want) g_expect_at((h), (want), __FILE__, __LINE__)

/* y = a * x + y (x IN, y INOUT). */
static cube_error *g_axpy(cube_handle x, cube_handle y, float a)
{
    cube_arg args[3] = {cube_arg_buffer(x), cube_arg_buffer(y),
                        cube_arg_f32(a)};
    return conf_launch(conf.k.scale_add,
                       cube_count_static(conf_div_up(GN, 64), 1, 1), args, 3,
                       EXEC);
}

/* y = a * x (x IN, y OUT). */
static cube_error *g_scale(cube_handle x, cube_handle y, float a)
{
    cube_arg args[3] = {cube_arg_buffer(x), cube_arg_buffer(y),
                        cube_arg_f32(a)};
    return conf_launch(conf.k.scale,
                       cube_count_static(conf_div_up(GN, 64), 1, 1), args, 3,
                       EXEC);
}

/* y[i] = v + i over GN uint32 (y OUT). */
static cube_error *g_fill(cube_handle y, uint32_t v)
{
    cube_arg args[2] = {cube_arg_buffer(y), cube_arg_u32(v)};
    return conf_launch(conf.k.fill,
                       cube_count_static(conf_div_up(GN, 32), 1, 1), args, 2,
                       EXEC);
}

/* The kernel that does not compile, over (IN, OUT, OUT). */
static cube_error *g_broken(cube_handle x, cube_handle y, cube_handle z)
{
    cube_arg args[3] = {cube_arg_buffer(x), cube_arg_buffer(y),
                        cube_arg_buffer(z)};
    return conf_launch(conf.k.broken, cube_count_static(1, 1, 1), args, 3,
                       EXEC);
}

/* Whether this backend's graphs are recorded by the client (replays run
 * the recorded launches) rather than by the device. */
static int g_software_graphs(void)
{
    cube_utilities u;
    CONF_OK(cube_client_utilities(conf.client, &u));
    return u.software_graphs;
}

/* The warm-up of the documented flow: a buffer of `bytes` made and
 * released after cube_graph_prepare leaves its memory in the persistent
 * pool, so a capture that makes one again needs no new device memory
 * (device graphs refuse a capture that does). */
static void g_warm_up_allocation(uint64_t bytes)
{
    conf_release(conf_empty(bytes));
}

static cube_graph_id g_end(void)
{
    cube_graph_id id = 0;
    CONF_OK(cube_graph_end(conf.client, &id));
    assert_true(id != 0);
    return id;
}

static void g_replay(cube_graph_id id)
{
    CONF_OK(cube_graph_replay(conf.client, id));
}

static void g_destroy(cube_graph_id id)
{
    CONF_OK(cube_graph_destroy(conf.client, id));
}

/* Live allocations on the calling stream, after a barrier. */
static uint64_t g_live(void)
{
    cube_memory_usage u;
    CONF_OK(cube_sync(conf.client, NULL, 0));
    CONF_OK(cube_memory_usage_get(conf.client, &u));
    return u.buffers;
}

/* Fails the test with `what` and the whole of `err` (which it frees). */
static void g_fail_with_at(const char *what, cube_error *err, const char *file,
                           int line)
{
    char *text = cube_error_format(err);
    print_error("%s:%d: %s:\n%s\n", file, line, what, text ? text : "?");
    free(text);
    cube_error_free(err);
    _fail(file, line);
}
#define G_FAIL_WITH(what, err) g_fail_with_at((what), (err), __FILE__, __LINE__)

/* --- the lifecycle --- */

CONF_TEST_NEEDS(graph_capture_records_launches_without_running_them,
                CUBE_FEATURE_KERNELS)
{
    float x0[GN], y0[GN], want[GN];
    g_fill_host(x0, 1, 1);
    g_fill_host(y0, 100, 0.5f);
    cube_handle x = conf_create(x0, GBYTES), y = conf_create(y0, GBYTES);
    CONF_OK(cube_graph_prepare(conf.client));
    /* Warm-up: the sequence once, for real. */
    for (int i = 0; i < 3; i++)
        CONF_OK(g_axpy(x, y, 1));
    for (uint32_t i = 0; i < GN; i++)
        want[i] = y0[i] + 3 * x0[i];
    G_EXPECT(y, want);
    CONF_OK(cube_graph_begin(conf.client));
    cube_code codes[3];
    for (int i = 0; i < 3; i++)
        codes[i] = conf_code(g_axpy(x, y, 1));
    cube_graph_id id = g_end();
    static const cube_code ok3[3] = {CUBE_OK, CUBE_OK, CUBE_OK};
    static const char *const what3[3] = {"launch 1", "launch 2", "launch 3"};
    CONF_EXPECT_CODES(codes, ok3, what3, 3);
    /* Recorded, not run: y is what the warm-up left, and x untouched. */
    G_EXPECT(y, want);
    G_EXPECT(x, x0);
    /* The first replay runs all three. */
    g_replay(id);
    for (uint32_t i = 0; i < GN; i++)
        want[i] += 3 * x0[i];
    G_EXPECT(y, want);
    G_EXPECT(x, x0);
    g_destroy(id);
    conf_release(x);
    conf_release(y);
}

CONF_TEST_NEEDS(graph_replays_equal_the_same_launches_made_directly,
                CUBE_FEATURE_KERNELS)
{
    enum { K = 4 };
    /* Three different kernels: fill (OUT u32), scale (IN, OUT),
     * scale_add (IN, INOUT). */
    cube_handle x = g_floats(-7, 0.25f);
    cube_handle u = conf_empty(GBYTES), y = conf_empty(GBYTES);
    cube_handle z = g_floats(3, 1);
    cube_handle u2 = conf_empty(GBYTES), y2 = conf_empty(GBYTES);
    cube_handle z2 = g_floats(3, 1);
    CONF_OK(cube_graph_prepare(conf.client));
    CONF_OK(g_fill(u, 7));
    CONF_OK(g_scale(x, y, 2));
    CONF_OK(g_axpy(x, z, 3));
    CONF_OK(cube_graph_begin(conf.client));
    cube_code codes[3];
    codes[0] = conf_code(g_fill(u, 11));
    codes[1] = conf_code(g_scale(x, y, -4));
    codes[2] = conf_code(g_axpy(x, z, 0.5f));
    cube_graph_id id = g_end();
    static const cube_code ok3[3] = {CUBE_OK, CUBE_OK, CUBE_OK};
    static const char *const what3[3] = {"fill", "scale", "scale_add"};
    CONF_EXPECT_CODES(codes, ok3, what3, 3);
    for (int r = 0; r < K; r++)
        g_replay(id);
    /* The same N * K launches on the direct path, from the same start (the
     * warm-up ran once on z). */
    CONF_OK(g_fill(u2, 7));
    CONF_OK(g_scale(x, y2, 2));
    CONF_OK(g_axpy(x, z2, 3));
    for (int r = 0; r < K; r++) {
        CONF_OK(g_fill(u2, 11));
        CONF_OK(g_scale(x, y2, -4));
        CONF_OK(g_axpy(x, z2, 0.5f));
    }
    unsigned char a[GBYTES], b[GBYTES];
    cube_handle ours[3] = {u, y, z}, theirs[3] = {u2, y2, z2};
    for (int i = 0; i < 3; i++) {
        CONF_READ_OK(ours[i], a, GBYTES);
        CONF_READ_OK(theirs[i], b, GBYTES);
        if (memcmp(a, b, GBYTES) != 0)
            fail_msg("%s: the replays and the direct launches differ",
                     what3[i]);
    }
    /* And against the arithmetic. */
    uint32_t uv[GN];
    CONF_READ_OK(u, uv, GBYTES);
    for (uint32_t i = 0; i < GN; i++)
        assert_int_equal(uv[i], 11 + i);
    float x0[GN], want[GN];
    g_read(x, x0);
    for (uint32_t i = 0; i < GN; i++)
        want[i] = -4 * x0[i];
    G_EXPECT(y, want);
    for (uint32_t i = 0; i < GN; i++)
        want[i] = (3 + (float)i) + 3 * x0[i] + K * 0.5f * x0[i];
    G_EXPECT(z, want);
    g_destroy(id);
    cube_handle all[7] = {x, u, y, z, u2, y2, z2};
    for (int i = 0; i < 7; i++)
        conf_release(all[i]);
}

CONF_TEST_NEEDS(graph_replay_uses_inputs_rewritten_between_replays,
                CUBE_FEATURE_KERNELS)
{
    float x0[GN], want[GN];
    cube_handle x = g_floats(1, 1), y = conf_empty(GBYTES);
    CONF_OK(cube_graph_prepare(conf.client));
    CONF_OK(g_scale(x, y, 2));
    CONF_OK(cube_graph_begin(conf.client));
    cube_code code = conf_code(g_scale(x, y, 2));
    cube_graph_id id = g_end();
    assert_int_equal(code, CUBE_OK);
    for (int r = 0; r < 4; r++) {
        g_fill_host(x0, (float)(10 * r) - 5, (float)r + 0.5f);
        CONF_WRITE_OK(x, x0, GBYTES);
        /* Scribble over the output too: the replay must rewrite it. */
        float junk[GN];
        g_fill_host(junk, -1000, 0);
        CONF_WRITE_OK(y, junk, GBYTES);
        g_replay(id);
        for (uint32_t i = 0; i < GN; i++)
            want[i] = 2 * x0[i];
        G_EXPECT(y, want);
        G_EXPECT(x, x0);
    }
    g_destroy(id);
    conf_release(x);
    conf_release(y);
}

CONF_TEST_NEEDS(graph_replay_reads_dynamic_count_from_its_buffer,
                CUBE_FEATURE_KERNELS)
{
    enum { DIM = 32, MAXC = 8, COUNT = DIM * MAXC };
    uint32_t cnt0[3] = {2, 1, 1}, fill[COUNT], got[COUNT];
    for (int i = 0; i < COUNT; i++)
        fill[i] = 0xEEEEEEEEu;
    cube_handle cnt = conf_create(cnt0, sizeof cnt0);
    cube_handle y = conf_create(fill, sizeof fill);
    cube_arg a = cube_arg_buffer(y);
    CONF_OK(cube_graph_prepare(conf.client));
    CONF_OK(cube_graph_begin(conf.client));
    cube_code code = conf_code(
        conf_launch(conf.k.count_probe, cube_count_dynamic(cnt), &a, 1, EXEC));
    cube_graph_id id = g_end();
    if (!g_software_graphs()) {
        /* A device graph fixes its cube counts when it is recorded: a
         * dynamic count is refused inside the capture, which goes on. */
        assert_int_equal(code, CUBE_ERR_UNSUPPORTED);
        g_destroy(id);
        conf_release(cnt);
        conf_release(y);
        return;
    }
    assert_int_equal(code, CUBE_OK);
    static const uint32_t counts[] = {3, 1, 8, 5};
    for (size_t r = 0; r < sizeof counts / sizeof counts[0]; r++) {
        uint32_t n = counts[r];
        uint32_t c3[3] = {n, 1, 1};
        CONF_WRITE_OK(cnt, c3, sizeof c3);
        CONF_WRITE_OK(y, fill, sizeof fill);
        g_replay(id);
        CONF_READ_OK(y, got, sizeof got);
        for (uint32_t i = 0; i < COUNT; i++) {
            uint32_t want = i < n * DIM ? n * 1000u + i / DIM : 0xEEEEEEEEu;
            if (got[i] != want)
                fail_msg("count %u: y[%u] = 0x%x, expected 0x%x", n, i, got[i],
                         want);
        }
    }
    g_destroy(id);
    conf_release(cnt);
    conf_release(y);
}

/* A replay whose dynamic count is zero runs nothing: the launch's outputs
 * keep the failures they carried. */
CONF_TEST_NEEDS(graph_replay_of_dynamic_zero_count_keeps_output_failures,
                CUBE_FEATURE_KERNELS)
{
    uint32_t fill[32];
    memset(fill, 0x5A, sizeof fill);
    cube_handle cnt = conf_create(((uint32_t[3]){1, 1, 1}), 12);
    cube_handle y = conf_create(fill, sizeof fill);
    cube_arg a = cube_arg_buffer(y);
    CONF_OK(cube_graph_prepare(conf.client));
    CONF_OK(cube_graph_begin(conf.client));
    cube_code code = conf_code(
        conf_launch(conf.k.count_probe, cube_count_dynamic(cnt), &a, 1, EXEC));
    cube_graph_id id = g_end();
    if (g_software_graphs()) {
        assert_int_equal(code, CUBE_OK);
        conf_mark_failed(y);
        CONF_WRITE_OK(cnt, ((uint32_t[3]){0, 1, 1}), 12);
        g_replay(id);
        CONF_EXPECT(cube_check(conf.client, &y, 1), CUBE_ERR_SEVERAL);
    }
    g_destroy(id);
    conf_release(cnt);
    conf_release(y);
}

CONF_TEST_NEEDS(
    graph_end_returns_distinct_nonzero_ids_and_unprepares_the_stream,
    CUBE_FEATURE_KERNELS)
{
    cube_handle x = g_floats(1, 1), y = conf_empty(GBYTES);
    CONF_OK(cube_graph_prepare(conf.client));
    CONF_OK(cube_graph_begin(conf.client));
    cube_code c1 = conf_code(g_scale(x, y, 2));
    cube_graph_id a = g_end();
    /* The stream is no longer prepared: begin is refused until prepare. */
    CONF_EXPECT(cube_graph_begin(conf.client), CUBE_ERR_GRAPH_STATE);
    /* Refused means not capturing: a sync is allowed. */
    CONF_OK(cube_sync(conf.client, NULL, 0));
    CONF_OK(cube_graph_prepare(conf.client));
    CONF_OK(cube_graph_begin(conf.client));
    cube_code c2 = conf_code(g_scale(x, y, 3));
    cube_graph_id b = g_end();
    assert_int_equal(c1, CUBE_OK);
    assert_int_equal(c2, CUBE_OK);
    assert_true(a != 0 && b != 0 && a != b);
    CONF_EXPECT(cube_graph_begin(conf.client), CUBE_ERR_GRAPH_STATE);
    /* Each id replays its own graph. */
    float x0[GN], want[GN];
    g_read(x, x0);
    g_replay(b);
    for (uint32_t i = 0; i < GN; i++)
        want[i] = 3 * x0[i];
    G_EXPECT(y, want);
    g_replay(a);
    for (uint32_t i = 0; i < GN; i++)
        want[i] = 2 * x0[i];
    G_EXPECT(y, want);
    g_destroy(a);
    g_destroy(b);
    conf_release(x);
    conf_release(y);
}

CONF_TEST_NEEDS(graph_prepare_twice_is_harmless_and_refused_while_capturing,
                CUBE_FEATURE_KERNELS)
{
    cube_handle x = g_floats(1, 1), y = conf_empty(GBYTES);
    CONF_OK(cube_graph_prepare(conf.client));
    CONF_OK(cube_graph_prepare(conf.client));
    CONF_OK(cube_graph_begin(conf.client));
    cube_code codes[3];
    codes[0] = conf_code(g_scale(x, y, 5));
    codes[1] = conf_code(cube_graph_prepare(conf.client));
    codes[2] = conf_code(g_axpy(x, y, 1));
    cube_graph_id id = g_end();
    static const cube_code want_codes[3] = {CUBE_OK, CUBE_ERR_GRAPH_STATE,
                                            CUBE_OK};
    static const char *const what[3] = {"launch", "prepare while capturing",
                                        "launch after the refusal"};
    CONF_EXPECT_CODES(codes, want_codes, what, 3);
    /* The capture went on: both launches are in the graph. */
    g_replay(id);
    float x0[GN], want[GN];
    g_read(x, x0);
    for (uint32_t i = 0; i < GN; i++)
        want[i] = 6 * x0[i];
    G_EXPECT(y, want);
    g_destroy(id);
    conf_release(x);
    conf_release(y);
}

/* --- lifecycle misuse --- */

CONF_TEST_NEEDS(graph_begin_without_prepare_is_graph_state,
                CUBE_FEATURE_KERNELS)
{
    CONF_EXPECT(cube_graph_begin(conf.client), CUBE_ERR_GRAPH_STATE);
    /* Nothing is being captured: launches run and reads work. */
    cube_handle x = g_floats(2, 1), y = conf_empty(GBYTES);
    CONF_OK(g_scale(x, y, 2));
    float x0[GN], want[GN];
    g_read(x, x0);
    for (uint32_t i = 0; i < GN; i++)
        want[i] = 2 * x0[i];
    G_EXPECT(y, want);
    cube_graph_id id = 77;
    CONF_EXPECT(cube_graph_end(conf.client, &id), CUBE_ERR_GRAPH_STATE);
    assert_true(id == 0);
    conf_release(x);
    conf_release(y);
}

CONF_TEST_NEEDS(
    graph_begin_while_capturing_is_graph_state_and_capture_continues,
    CUBE_FEATURE_KERNELS)
{
    cube_handle x = g_floats(1, 1), y = g_floats(10, 2);
    float x0[GN], y0[GN], want[GN];
    g_read(x, x0);
    g_read(y, y0);
    CONF_OK(cube_graph_prepare(conf.client));
    CONF_OK(cube_graph_begin(conf.client));
    cube_code codes[3];
    codes[0] = conf_code(g_axpy(x, y, 1));
    /* A second, overlapping capture on the same stream. */
    codes[1] = conf_code(cube_graph_begin(conf.client));
    codes[2] = conf_code(g_axpy(x, y, 1));
    cube_graph_id id = g_end();
    static const cube_code want_codes[3] = {CUBE_OK, CUBE_ERR_GRAPH_STATE,
                                            CUBE_OK};
    static const char *const what[3] = {"launch", "second begin",
                                        "launch after the refusal"};
    CONF_EXPECT_CODES(codes, want_codes, what, 3);
    /* One capture ended it all: no capture is left open. */
    CONF_EXPECT(cube_graph_end(conf.client, &(cube_graph_id){0}),
                CUBE_ERR_GRAPH_STATE);
    G_EXPECT(y, y0);
    g_replay(id);
    for (uint32_t i = 0; i < GN; i++)
        want[i] = y0[i] + 2 * x0[i];
    G_EXPECT(y, want);
    g_destroy(id);
    conf_release(x);
    conf_release(y);
}

CONF_TEST_NEEDS(graph_end_without_begin_is_graph_state, CUBE_FEATURE_KERNELS)
{
    cube_graph_id id = 123;
    CONF_EXPECT(cube_graph_end(conf.client, &id), CUBE_ERR_GRAPH_STATE);
    assert_true(id == 0);
    /* Prepared but not begun is still not capturing. */
    CONF_OK(cube_graph_prepare(conf.client));
    id = 123;
    CONF_EXPECT(cube_graph_end(conf.client, &id), CUBE_ERR_GRAPH_STATE);
    assert_true(id == 0);
    /* A second end after a capture ended. */
    cube_handle x = g_floats(1, 1), y = conf_empty(GBYTES);
    CONF_OK(cube_graph_prepare(conf.client));
    CONF_OK(cube_graph_begin(conf.client));
    cube_code code = conf_code(g_scale(x, y, 2));
    cube_graph_id g = g_end();
    assert_int_equal(code, CUBE_OK);
    id = 123;
    CONF_EXPECT(cube_graph_end(conf.client, &id), CUBE_ERR_GRAPH_STATE);
    assert_true(id == 0);
    g_destroy(g);
    conf_release(x);
    conf_release(y);
}

CONF_TEST_NEEDS(graph_refused_end_leaves_the_stream_prepared,
                CUBE_FEATURE_KERNELS)
{
    /* A call out of lifecycle order is refused and changes nothing: the
     * stream armed by prepare stays armed. */
    cube_handle x = g_floats(1, 1), y = conf_empty(GBYTES);
    CONF_OK(cube_graph_prepare(conf.client));
    cube_graph_id id = 9;
    CONF_EXPECT(cube_graph_end(conf.client, &id), CUBE_ERR_GRAPH_STATE);
    assert_true(id == 0);
    cube_error *begin = cube_graph_begin(conf.client);
    cube_code code = CUBE_OK;
    if (!begin) {
        code = conf_code(g_scale(x, y, 2));
        id = g_end();
    }
    conf_release(x);
    conf_release(y);
    if (begin)
        G_FAIL_WITH("begin after a refused end", begin);
    assert_int_equal(code, CUBE_OK);
    g_destroy(id);
}

CONF_TEST_NEEDS(graph_replay_of_unknown_or_destroyed_id_is_not_found,
                CUBE_FEATURE_KERNELS)
{
    /* A graph that does not exist is CUBE_ERR_NOT_FOUND, as error.h says
     * of every missing object. */
    CONF_EXPECT(cube_graph_replay(conf.client, 0), CUBE_ERR_NOT_FOUND);
    CONF_EXPECT(cube_graph_replay(conf.client, UINT64_MAX), CUBE_ERR_NOT_FOUND);
    cube_handle x = g_floats(1, 1), y = conf_empty(GBYTES);
    CONF_OK(cube_graph_prepare(conf.client));
    CONF_OK(cube_graph_begin(conf.client));
    cube_code code = conf_code(g_scale(x, y, 2));
    cube_graph_id id = g_end();
    assert_int_equal(code, CUBE_OK);
    g_replay(id);
    float x0[GN], want[GN];
    g_read(x, x0);
    for (uint32_t i = 0; i < GN; i++)
        want[i] = 2 * x0[i];
    G_EXPECT(y, want);
    /* An id near a real one is still unknown. */
    CONF_EXPECT(cube_graph_replay(conf.client, id + 1000003),
                CUBE_ERR_NOT_FOUND);
    g_destroy(id);
    CONF_EXPECT(cube_graph_replay(conf.client, id), CUBE_ERR_NOT_FOUND);
    /* The refused replays touched nothing (y is not marked failed). */
    G_EXPECT(y, want);
    CONF_OK(cube_check(conf.client, &y, 1));
    conf_release(x);
    conf_release(y);
}

CONF_TEST_NEEDS(graph_replay_from_capturing_stream_is_graph_state,
                CUBE_FEATURE_KERNELS)
{
    cube_handle x = g_floats(1, 1), y = g_floats(0, 0);
    cube_handle z = g_floats(5, 1);
    float x0[GN], want[GN];
    g_read(x, x0);
    CONF_OK(cube_graph_prepare(conf.client));
    CONF_OK(cube_graph_begin(conf.client));
    cube_code c0 = conf_code(g_scale(x, y, 2));
    cube_graph_id a = g_end();
    assert_int_equal(c0, CUBE_OK);
    /* Capture a second graph; replaying the first inside it is refused. */
    CONF_OK(cube_graph_prepare(conf.client));
    CONF_OK(cube_graph_begin(conf.client));
    cube_code codes[3];
    codes[0] = conf_code(cube_graph_replay(conf.client, a));
    codes[1] = conf_code(g_axpy(x, z, 1));
    codes[2] = conf_code(cube_graph_replay(conf.client, a));
    cube_graph_id b = g_end();
    static const cube_code want_codes[3] = {CUBE_ERR_GRAPH_STATE, CUBE_OK,
                                            CUBE_ERR_GRAPH_STATE};
    static const char *const what[3] = {"replay while capturing", "launch",
                                        "replay again while capturing"};
    CONF_EXPECT_CODES(codes, want_codes, what, 3);
    /* The refusals ran nothing and marked nothing: y is still zero and
     * trusted. */
    float zero[GN];
    g_fill_host(zero, 0, 0);
    G_EXPECT(y, zero);
    CONF_OK(cube_check(conf.client, &y, 1));
    /* Graph b holds only the launch. */
    g_replay(b);
    for (uint32_t i = 0; i < GN; i++)
        want[i] = 5 + (float)i + x0[i];
    G_EXPECT(z, want);
    G_EXPECT(y, zero);
    /* Out of the capture, a replays. */
    g_replay(a);
    for (uint32_t i = 0; i < GN; i++)
        want[i] = 2 * x0[i];
    G_EXPECT(y, want);
    g_destroy(a);
    g_destroy(b);
    conf_release(x);
    conf_release(y);
    conf_release(z);
}

CONF_TEST_NEEDS(graph_capture_is_per_stream_other_streams_run_and_replay,
                CUBE_FEATURE_KERNELS)
{
    const cube_stream_id other = 0x6A0000000000001ull;
    cube_handle x = g_floats(1, 1), y = conf_empty(GBYTES);
    cube_handle w = conf_empty(GBYTES);
    float x0[GN], want[GN], got[GN];
    g_read(x, x0);
    CONF_OK(cube_graph_prepare(conf.client));
    CONF_OK(cube_graph_begin(conf.client));
    cube_code c0 = conf_code(g_scale(x, y, 2));
    cube_graph_id a = g_end();
    assert_int_equal(c0, CUBE_OK);

    CONF_OK(cube_graph_prepare(conf.client));
    CONF_OK(cube_graph_begin(conf.client));
    cube_code codes[6];
    codes[0] = conf_code(g_scale(x, w, 7));
    /* On another stream, everything runs as usual while this one
     * captures: a launch, a replay, a read, a sync. */
    codes[1] = conf_code(cube_stream_use(conf.client, other));
    codes[2] = conf_code(cube_graph_replay(conf.client, a));
    memset(got, 0, sizeof got);
    codes[3] = conf_code(conf_read(y, got, GBYTES));
    codes[4] = conf_code(cube_sync(conf.client, NULL, 0));
    codes[5] = conf_code(cube_stream_use(conf.client, 0));
    cube_graph_id b = g_end();
    static const cube_code ok6[6] = {CUBE_OK, CUBE_OK, CUBE_OK,
                                     CUBE_OK, CUBE_OK, CUBE_OK};
    static const char *const what[6] = {
        "launch (captured)", "cube_stream_use(other)", "replay on other",
        "read on other",     "sync on other",          "cube_stream_use(0)"};
    CONF_EXPECT_CODES(codes, ok6, what, 6);
    for (uint32_t i = 0; i < GN; i++) {
        want[i] = 2 * x0[i];
        if (got[i] != want[i])
            fail_msg("the replay on the other stream: y[%u] = %g, expected "
                     "%g",
                     i, (double)got[i], (double)want[i]);
    }
    G_EXPECT(y, want);
    /* The captured launch did not run; the replay of b runs it. */
    g_replay(b);
    for (uint32_t i = 0; i < GN; i++)
        want[i] = 7 * x0[i];
    G_EXPECT(w, want);
    g_destroy(a);
    g_destroy(b);
    conf_release(x);
    conf_release(y);
    conf_release(w);
}

/* --- inside the capture window --- */

CONF_TEST_NEEDS(
    graph_capture_refuses_read_write_sync_and_profile_then_continues,
    CUBE_FEATURE_KERNELS)
{
    float x0[GN], y0[GN], want[GN];
    cube_handle x = g_floats(1, 1), y = g_floats(-3, 0.5f);
    g_read(x, x0);
    g_read(y, y0);
    cube_profile_token before = 0;
    CONF_OK(cube_profile_start(conf.client, &before));
    CONF_OK(cube_graph_prepare(conf.client));
    CONF_OK(cube_graph_begin(conf.client));

    enum { NC = 11 };
    cube_code codes[NC];
    int i = 0;
    codes[i++] = conf_code(g_axpy(x, y, 1));
    /* read: refused, and its destination untouched */
    float dst[GN];
    memset(dst, 0xCD, sizeof dst);
    codes[i++] = conf_code(conf_read(y, dst, GBYTES));
    /* read_async: refused at once or at the wait */
    {
        cube_copy_desc d = cube_copy_desc_contiguous(y, GBYTES, 4);
        void *dsts[1] = {dst};
        uint64_t sz[1] = {GBYTES};
        cube_future *f = NULL;
        cube_error *err = cube_read_async(conf.client, &d, dsts, sz, 1, &f);
        if (!err)
            err = cube_future_wait(f);
        codes[i++] = conf_code(err);
        cube_future_free(f);
    }
    /* write: refused, nothing written */
    float junk[GN];
    g_fill_host(junk, -999, 0);
    codes[i++] = conf_code(conf_write(y, junk, GBYTES));
    codes[i++] = conf_code(cube_sync(conf.client, NULL, 0));
    codes[i++] = conf_code(cube_sync(conf.client, &y, 1));
    cube_profile_token inside = 0;
    codes[i++] = conf_code(cube_profile_start(conf.client, &inside));
    cube_profile_result res;
    codes[i++] = conf_code(cube_profile_end(conf.client, before, &res));
    /* The capture goes on. */
    codes[i++] = conf_code(g_axpy(x, y, 2));
    codes[i++] = conf_code(conf_read(x, dst, GBYTES));
    codes[i++] = conf_code(g_axpy(x, y, 4));
    cube_graph_id id = g_end();

    static const cube_code want_codes[NC] = {CUBE_OK,
                                             CUBE_ERR_GRAPH_STATE,
                                             CUBE_ERR_GRAPH_STATE,
                                             CUBE_ERR_GRAPH_STATE,
                                             CUBE_ERR_GRAPH_STATE,
                                             CUBE_ERR_GRAPH_STATE,
                                             CUBE_ERR_GRAPH_STATE,
                                             CUBE_ERR_GRAPH_STATE,
                                             CUBE_OK,
                                             CUBE_ERR_GRAPH_STATE,
                                             CUBE_OK};
    static const char *const what[NC] = {"launch 1",
                                         "cube_read",
                                         "cube_read_async",
                                         "cube_write",
                                         "cube_sync (no handles)",
                                         "cube_sync (y)",
                                         "cube_profile_start",
                                         "cube_profile_end",
                                         "launch 2",
                                         "cube_read of an input",
                                         "launch 3"};
    assert_int_equal(i, NC);
    CONF_EXPECT_CODES(codes, want_codes, what, NC);
    for (uint32_t k = 0; k < GN; k++)
        if (memcmp(&dst[k], &(uint32_t){0xCDCDCDCDu}, 4) != 0)
            fail_msg("a refused read wrote element %u of its destination", k);
    /* Nothing ran and nothing was written: y as before. */
    G_EXPECT(y, y0);
    /* The window opened before the capture stayed open; it closes now. */
    CONF_OK(cube_profile_end(conf.client, before, &res));
    /* All three launches were recorded. */
    g_replay(id);
    for (uint32_t k = 0; k < GN; k++)
        want[k] = y0[k] + 7 * x0[k];
    G_EXPECT(y, want);
    g_destroy(id);
    conf_release(x);
    conf_release(y);
}

CONF_TEST(graph_capture_refusal_comes_before_the_failure_store)
{
    /* Inside a capture window a read, a sync or a profile is refused with
     * CUBE_ERR_GRAPH_STATE whatever the buffers named: the refusal comes
     * first, so a failed buffer does not turn it into CUBE_ERR_SEVERAL.
     * Out of the window the failure store answers again. Every backend
     * records (software) graphs, with or without kernels. */
    cube_handle bad = conf_empty(64), fine = conf_empty(64);
    conf_mark_failed(bad);
    cube_handle both[2] = {fine, bad};
    unsigned char dst[64];
    memset(dst, 0xCD, sizeof dst);
    CONF_OK(cube_graph_prepare(conf.client));
    CONF_OK(cube_graph_begin(conf.client));
    enum { NC = 6 };
    cube_code codes[NC];
    int i = 0;
    codes[i++] = conf_code(conf_read(bad, dst, sizeof dst));
    {
        cube_copy_desc d[2] = {cube_copy_desc_contiguous(fine, 64, 1),
                               cube_copy_desc_contiguous(bad, 64, 1)};
        void *dsts[2] = {dst, dst};
        uint64_t sz[2] = {64, 64};
        cube_future *f = NULL;
        cube_error *err = cube_read_async(conf.client, d, dsts, sz, 2, &f);
        if (!err)
            err = cube_future_wait(f);
        codes[i++] = conf_code(err);
        cube_future_free(f);
    }
    codes[i++] = conf_code(cube_sync(conf.client, &bad, 1));
    codes[i++] = conf_code(cube_sync(conf.client, both, 2));
    /* A graph that does not exist: the capture still answers first. */
    codes[i++] = conf_code(cube_graph_replay(conf.client, UINT64_MAX));
    cube_profile_result res;
    codes[i++] = conf_code(cube_profile_end(conf.client, UINT64_MAX - 1, &res));
    cube_graph_id id = 0;
    CONF_OK(cube_graph_end(conf.client, &id));
    static const cube_code want[NC] = {
        CUBE_ERR_GRAPH_STATE, CUBE_ERR_GRAPH_STATE, CUBE_ERR_GRAPH_STATE,
        CUBE_ERR_GRAPH_STATE, CUBE_ERR_GRAPH_STATE, CUBE_ERR_GRAPH_STATE};
    static const char *const what[NC] = {
        "cube_read of a failed buffer",
        "cube_read_async of a failed buffer",
        "cube_sync of a failed buffer",
        "cube_sync of a trusted and a failed buffer",
        "cube_graph_replay of an unknown id",
        "cube_profile_end of an unknown token"};
    assert_int_equal(i, NC);
    CONF_EXPECT_CODES(codes, want, what, NC);
    for (size_t k = 0; k < sizeof dst; k++)
        assert_int_equal(dst[k], 0xCD);
    /* Out of the window: the failure store's answer. */
    CONF_EXPECT_REFUSED(bad, 64, conf_mark_code());
    CONF_EXPECT(cube_sync(conf.client, &bad, 1), CUBE_ERR_SEVERAL);
    CONF_EXPECT(cube_graph_replay(conf.client, UINT64_MAX), CUBE_ERR_NOT_FOUND);
    g_destroy(id);
    conf_release(bad);
    conf_release(fine);
}

CONF_TEST_NEEDS(graph_capture_allows_check_and_allocation, CUBE_FEATURE_KERNELS)
{
    cube_handle x = g_floats(1, 1), y = conf_empty(GBYTES);
    cube_handle bad = g_floats(0, 0);
    conf_mark_failed(bad);
    uint64_t live0 = g_live();
    CONF_OK(cube_graph_prepare(conf.client));
    g_warm_up_allocation(4096);
    CONF_OK(cube_graph_begin(conf.client));
    cube_code codes[6];
    codes[0] = conf_code(g_scale(x, y, 2));
    codes[1] = conf_code(cube_check(conf.client, &x, 1));
    codes[2] = conf_code(cube_check(conf.client, NULL, 0));
    codes[3] = conf_code(cube_check(conf.client, &bad, 1));
    cube_handle fresh = {0};
    codes[4] = conf_code(cube_empty(conf.client, 4096, &fresh));
    uint64_t size = 0;
    codes[5] = conf_code(cube_handle_size(conf.client, fresh, &size));
    cube_graph_id id = g_end();
    static const cube_code want_codes[6] = {CUBE_OK,          CUBE_OK, CUBE_OK,
                                            CUBE_ERR_SEVERAL, CUBE_OK, CUBE_OK};
    static const char *const what[6] = {
        "launch",           "cube_check(x)",
        "cube_check(none)", "cube_check(failed buffer)",
        "cube_empty",       "cube_handle_size"};
    CONF_EXPECT_CODES(codes, want_codes, what, 6);
    assert_true(fresh.bits != 0);
    assert_true(size == 4096);
    /* The new buffer is an ordinary one. */
    unsigned char pat[4096], got[4096];
    conf_pattern(pat, sizeof pat, 31);
    CONF_WRITE_OK(fresh, pat, sizeof pat);
    CONF_READ_OK(fresh, got, sizeof got);
    assert_memory_equal(pat, got, sizeof pat);
    conf_release(fresh);
    g_destroy(id);
    assert_int_equal(g_live(), live0);
    conf_release(x);
    conf_release(y);
    conf_release(bad);
}

CONF_TEST_NEEDS(graph_pins_buffer_allocated_in_window_until_destroy,
                CUBE_FEATURE_KERNELS)
{
    float x0[GN], want[GN];
    cube_handle x = g_floats(2, 0.5f), w = conf_empty(GBYTES);
    g_read(x, x0);
    uint64_t live0 = g_live();
    CONF_OK(cube_graph_prepare(conf.client));
    g_warm_up_allocation(GBYTES);
    CONF_OK(cube_graph_begin(conf.client));
    /* A scratch buffer made inside the window, written and read by the
     * recorded launches: z = 2x, w = 3z. */
    cube_handle z = {0};
    cube_code codes[3];
    codes[0] = conf_code(cube_empty(conf.client, GBYTES, &z));
    codes[1] = z.bits ? conf_code(g_scale(x, z, 2)) : CUBE_ERR_NOT_FOUND;
    codes[2] = z.bits ? conf_code(g_scale(z, w, 3)) : CUBE_ERR_NOT_FOUND;
    cube_graph_id id = g_end();
    static const cube_code ok3[3] = {CUBE_OK, CUBE_OK, CUBE_OK};
    static const char *const what[3] = {"cube_empty", "scale into scratch",
                                        "scale from scratch"};
    CONF_EXPECT_CODES(codes, ok3, what, 3);
    assert_int_equal(g_live(), live0 + 1);
    /* The handle goes; the graph keeps the memory. */
    conf_release(z);
    CONF_EXPECT(cube_handle_size(conf.client, z, &(uint64_t){0}),
                CUBE_ERR_NOT_FOUND);
    assert_int_equal(g_live(), live0 + 1);
    for (int r = 0; r < 3; r++) {
        float junk[GN];
        g_fill_host(junk, -1, 0);
        CONF_WRITE_OK(w, junk, GBYTES);
        g_replay(id);
        for (uint32_t i = 0; i < GN; i++)
            want[i] = 6 * x0[i];
        G_EXPECT(w, want);
    }
    assert_int_equal(g_live(), live0 + 1);
    /* Destroy unpins it: the memory goes back. */
    g_destroy(id);
    assert_int_equal(g_live(), live0);
    conf_release(x);
    conf_release(w);
}

CONF_TEST_NEEDS(graph_keeps_recorded_buffers_alive_after_their_handles_go,
                CUBE_FEATURE_KERNELS)
{
    float x0[GN], want[GN];
    cube_handle x = g_floats(4, -0.25f), y = conf_empty(GBYTES);
    cube_handle w = conf_empty(GBYTES);
    g_read(x, x0);
    uint64_t live0 = g_live();
    CONF_OK(cube_graph_prepare(conf.client));
    CONF_OK(g_scale(x, y, -1));
    CONF_OK(g_scale(y, w, 2));
    CONF_OK(cube_graph_begin(conf.client));
    cube_code c1 = conf_code(g_scale(x, y, -1));
    cube_code c2 = conf_code(g_scale(y, w, 2));
    cube_graph_id id = g_end();
    assert_int_equal(c1, CUBE_OK);
    assert_int_equal(c2, CUBE_OK);
    /* Only w is still named by the test. */
    conf_release(x);
    conf_release(y);
    assert_int_equal(g_live(), live0);
    float junk[GN];
    g_fill_host(junk, 0, 0);
    CONF_WRITE_OK(w, junk, GBYTES);
    g_replay(id);
    for (uint32_t i = 0; i < GN; i++)
        want[i] = -2 * x0[i];
    G_EXPECT(w, want);
    g_destroy(id);
    assert_int_equal(g_live(), live0 - 2);
    conf_release(w);
}

CONF_TEST_NEEDS(graph_prepare_and_warm_up_leave_the_capture_nothing_to_allocate,
                CUBE_FEATURE_KERNELS)
{
    float x0[GN], want[GN];
    cube_handle x = g_floats(1, 2), y = conf_empty(GBYTES);
    g_read(x, x0);
    CONF_OK(cube_graph_prepare(conf.client));
    /* The warm-up makes the sequence's buffers; the capture reuses them. */
    cube_handle t = conf_empty(GBYTES);
    CONF_OK(g_scale(x, t, 2));
    CONF_OK(g_axpy(t, y, 1));
    uint64_t live_warm = g_live();
    CONF_OK(cube_graph_begin(conf.client));
    cube_code c1 = conf_code(g_scale(x, t, 2));
    cube_code c2 = conf_code(g_axpy(t, y, 1));
    cube_graph_id id = g_end();
    assert_int_equal(c1, CUBE_OK);
    assert_int_equal(c2, CUBE_OK);
    /* The graph pins what it names and nothing more. */
    assert_int_equal(g_live(), live_warm);
    conf_release(t);
    assert_int_equal(g_live(), live_warm);
    float zero[GN];
    g_fill_host(zero, 0, 0);
    CONF_WRITE_OK(y, zero, GBYTES);
    g_replay(id);
    g_replay(id);
    for (uint32_t i = 0; i < GN; i++)
        want[i] = 4 * x0[i];
    G_EXPECT(y, want);
    g_destroy(id);
    assert_int_equal(g_live(), live_warm - 1);
    conf_release(x);
    conf_release(y);
}

CONF_TEST_NEEDS(
    graph_launch_failing_validation_in_window_is_returned_not_recorded,
    CUBE_FEATURE_KERNELS)
{
    float x0[GN], y0[GN], want[GN];
    cube_handle x = g_floats(1, 1), y = g_floats(20, -1);
    cube_handle a = g_floats(0, 1), b = g_floats(0, 2), c = g_floats(0, 3);
    g_read(x, x0);
    g_read(y, y0);
    cube_handle gone = conf_empty(64);
    conf_release(gone);
    uint64_t live0 = g_live();
    CONF_OK(cube_graph_prepare(conf.client));
    CONF_OK(cube_graph_begin(conf.client));
    enum { NC = 8 };
    cube_code codes[NC];
    codes[0] = conf_code(g_axpy(x, y, 1));
    /* Arguments that do not fit the kernel. */
    cube_arg two[2] = {cube_arg_buffer(a), cube_arg_buffer(b)};
    codes[1] = conf_code(conf_launch(conf.k.scale_add,
                                     cube_count_static(1, 1, 1), two, 2, EXEC));
    /* Over the unit limit. */
    codes[2] = conf_code(conf_launch(conf.k.too_many_units,
                                     cube_count_static(1, 1, 1), two, 2, EXEC));
    /* Does not compile. */
    codes[3] = conf_code(g_broken(a, b, c));
    /* A zero cube count and a released handle. */
    cube_arg three[3] = {cube_arg_buffer(a), cube_arg_buffer(b),
                         cube_arg_f32(1)};
    codes[4] = conf_code(conf_launch(
        conf.k.scale_add, cube_count_static(0, 1, 1), three, 3, EXEC));
    cube_arg with_gone[3] = {cube_arg_buffer(a), cube_arg_buffer(gone),
                             cube_arg_f32(1)};
    codes[5] = conf_code(conf_launch(
        conf.k.scale_add, cube_count_static(1, 1, 1), with_gone, 3, EXEC));
    /* Returned as usual: the failures are on the buffers. */
    codes[6] = conf_code(cube_check(conf.client, &c, 1));
    codes[7] = conf_code(g_axpy(x, y, 2));
    cube_graph_id id = g_end();
    static const cube_code want_codes[NC] = {CUBE_OK,
                                             CUBE_ERR_INVALID_ARGUMENT,
                                             CUBE_ERR_RESOURCE_LIMIT,
                                             CUBE_ERR_COMPILE,
                                             CUBE_ERR_INVALID_ARGUMENT,
                                             CUBE_ERR_NOT_FOUND,
                                             CUBE_ERR_SEVERAL,
                                             CUBE_OK};
    static const char *const what[NC] = {
        "good launch",          "argument count mismatch",
        "over the unit limit",  "compile error",
        "zero cube count",      "released handle",
        "cube_check of output", "good launch after the failures"};
    CONF_EXPECT_CODES(codes, want_codes, what, NC);
    CONF_EXPECT_REFUSED(c, GBYTES, CUBE_ERR_COMPILE);
    /* Not recorded: the graph pins none of a, b, c... */
    conf_release(a);
    conf_release(b);
    conf_release(c);
    assert_int_equal(g_live(), live0 - 3);
    /* ... and its replay runs only the two good launches, successfully. */
    G_EXPECT(y, y0);
    g_replay(id);
    for (uint32_t i = 0; i < GN; i++)
        want[i] = y0[i] + 3 * x0[i];
    G_EXPECT(y, want);
    g_destroy(id);
    conf_release(x);
    conf_release(y);
}

/* --- destroy --- */

CONF_TEST_NEEDS(graph_destroy_of_unknown_or_destroyed_id_is_not_found,
                CUBE_FEATURE_KERNELS)
{
    /* Nothing to release: the call changes nothing, and says so. */
    CONF_EXPECT(cube_graph_destroy(conf.client, 0), CUBE_ERR_NOT_FOUND);
    CONF_EXPECT(cube_graph_destroy(conf.client, UINT64_MAX),
                CUBE_ERR_NOT_FOUND);
    cube_handle x = g_floats(1, 1), y = conf_empty(GBYTES);
    uint64_t live0 = g_live();
    CONF_OK(cube_graph_prepare(conf.client));
    CONF_OK(cube_graph_begin(conf.client));
    cube_code code = conf_code(g_scale(x, y, 2));
    cube_graph_id id = g_end();
    assert_int_equal(code, CUBE_OK);
    /* Destroying some other id leaves this graph replayable. */
    CONF_EXPECT(cube_graph_destroy(conf.client, id + 999983),
                CUBE_ERR_NOT_FOUND);
    g_replay(id);
    g_destroy(id);
    /* Twice: the second names a graph that is gone. */
    CONF_EXPECT(cube_graph_destroy(conf.client, id), CUBE_ERR_NOT_FOUND);
    assert_int_equal(g_live(), live0);
    float x0[GN], want[GN];
    g_read(x, x0);
    for (uint32_t i = 0; i < GN; i++)
        want[i] = 2 * x0[i];
    G_EXPECT(y, want);
    conf_release(x);
    conf_release(y);
}

CONF_TEST_NEEDS(graph_destroy_right_after_replay_leaves_its_results_intact,
                CUBE_FEATURE_KERNELS)
{
    float x0[GN], want[GN];
    cube_handle x = g_floats(3, 3), w = conf_empty(GBYTES);
    g_read(x, x0);
    uint64_t live0 = g_live();
    for (int r = 0; r < 20; r++) {
        CONF_OK(cube_graph_prepare(conf.client));
        CONF_OK(cube_graph_begin(conf.client));
        cube_handle z = {0};
        cube_code codes[3];
        codes[0] = conf_code(cube_empty(conf.client, GBYTES, &z));
        codes[1] =
            z.bits ? conf_code(g_scale(x, z, (float)r)) : CUBE_ERR_NOT_FOUND;
        codes[2] = z.bits ? conf_code(g_scale(z, w, 2)) : CUBE_ERR_NOT_FOUND;
        cube_graph_id id = g_end();
        static const cube_code ok3[3] = {CUBE_OK, CUBE_OK, CUBE_OK};
        static const char *const what[3] = {"cube_empty", "scale", "scale"};
        CONF_EXPECT_CODES(codes, ok3, what, 3);
        conf_release(z);
        /* No barrier between the replay and the destroy: the memory the
         * graph pinned goes back only once the replay is done with it. */
        g_replay(id);
        g_destroy(id);
        /* Reuse the memory at once. */
        cube_handle reuse = conf_empty(GBYTES);
        float junk[GN];
        g_fill_host(junk, -5, 0);
        CONF_WRITE_OK(reuse, junk, GBYTES);
        for (uint32_t i = 0; i < GN; i++)
            want[i] = 2 * (float)r * x0[i];
        G_EXPECT(w, want);
        conf_release(reuse);
    }
    assert_int_equal(g_live(), live0);
    conf_release(x);
    conf_release(w);
}

/* --- failures --- */

CONF_TEST_NEEDS(
    graph_failed_input_fails_replay_and_outputs_until_a_replay_lands,
    CUBE_FEATURE_KERNELS)
{
    float x0[GN], want[GN];
    cube_handle x = g_floats(1, 1), y = conf_empty(GBYTES);
    cube_handle z = conf_empty(GBYTES);
    cube_handle j1 = conf_empty(16), j2 = conf_empty(16);
    g_read(x, x0);
    CONF_OK(cube_graph_prepare(conf.client));
    CONF_OK(g_scale(x, y, 2));
    CONF_OK(g_scale(x, z, 3));
    CONF_OK(cube_graph_begin(conf.client));
    cube_code c1 = conf_code(g_scale(x, y, 2));
    cube_code c2 = conf_code(g_scale(x, z, 3));
    cube_graph_id id = g_end();
    assert_int_equal(c1, CUBE_OK);
    assert_int_equal(c2, CUBE_OK);
    g_replay(id);
    for (uint32_t i = 0; i < GN; i++)
        want[i] = 2 * x0[i];
    G_EXPECT(y, want);

    /* The input now carries a compile failure. */
    CONF_EXPECT(g_broken(x, j1, j2), CUBE_ERR_COMPILE);
    cube_error *err = cube_graph_replay(conf.client, id);
    CONF_CODE(err, CUBE_ERR_SEVERAL);
    if (!conf_error_has_code(err, CUBE_ERR_COMPILE))
        G_FAIL_WITH("the replay's error does not carry the input's failure",
                    err);
    cube_error_free(err);
    /* Every buffer the graph writes carries it now. */
    CONF_EXPECT_REFUSED(y, GBYTES, CUBE_ERR_COMPILE);
    CONF_EXPECT_REFUSED(z, GBYTES, CUBE_ERR_COMPILE);
    CONF_EXPECT(cube_check(conf.client, &y, 1), CUBE_ERR_SEVERAL);
    CONF_EXPECT(cube_sync(conf.client, &z, 1), CUBE_ERR_SEVERAL);
    /* Again and again, while the input is untrusted. */
    CONF_EXPECT(cube_graph_replay(conf.client, id), CUBE_ERR_SEVERAL);
    CONF_EXPECT_REFUSED(y, GBYTES, CUBE_ERR_COMPILE);

    /* A full write clears the input; the next replay lands. */
    g_fill_host(x0, -2, 0.75f);
    CONF_WRITE_OK(x, x0, GBYTES);
    g_replay(id);
    for (uint32_t i = 0; i < GN; i++)
        want[i] = 2 * x0[i];
    G_EXPECT(y, want);
    for (uint32_t i = 0; i < GN; i++)
        want[i] = 3 * x0[i];
    G_EXPECT(z, want);
    CONF_OK(cube_check(conf.client, &y, 1));
    g_destroy(id);
    cube_handle all[5] = {x, y, z, j1, j2};
    for (int i = 0; i < 5; i++)
        conf_release(all[i]);
}

CONF_TEST_NEEDS(graph_recorded_launch_changes_no_failure_state_until_replay,
                CUBE_FEATURE_KERNELS)
{
    float x0[GN], want[GN];
    cube_handle x = g_floats(1, 1), y = conf_empty(GBYTES);
    g_read(x, x0);
    /* y carries a failure; a launch that writes it is recorded, not run. */
    conf_mark_failed(y);
    CONF_OK(cube_graph_prepare(conf.client));
    CONF_OK(cube_graph_begin(conf.client));
    cube_code c1 = conf_code(g_scale(x, y, 2));
    cube_graph_id id = g_end();
    assert_int_equal(c1, CUBE_OK);
    CONF_EXPECT_REFUSED(y, GBYTES, CUBE_ERR_RESOURCE_LIMIT);
    /* The replay runs it: y is trusted again. */
    g_replay(id);
    CONF_OK(cube_check(conf.client, &y, 1));
    for (uint32_t i = 0; i < GN; i++)
        want[i] = 2 * x0[i];
    G_EXPECT(y, want);
    g_destroy(id);
    conf_release(x);
    conf_release(y);
}

CONF_TEST_NEEDS(graph_buffer_written_before_read_is_not_a_replay_input,
                CUBE_FEATURE_KERNELS)
{
    /* y is written (OUT) by the first launch, then updated (INOUT) by the
     * second: its earlier contents are no input of the graph. Made
     * directly, this sequence succeeds as soon as x is trusted again; so
     * must its replay. */
    float x0[GN], want[GN];
    cube_handle x = g_floats(1, 1), y = conf_empty(GBYTES);
    g_read(x, x0);
    CONF_OK(cube_graph_prepare(conf.client));
    CONF_OK(cube_graph_begin(conf.client));
    cube_code c1 = conf_code(g_scale(x, y, 2));
    cube_code c2 = conf_code(g_axpy(x, y, 1));
    cube_graph_id id = g_end();
    assert_int_equal(c1, CUBE_OK);
    assert_int_equal(c2, CUBE_OK);
    g_replay(id);
    for (uint32_t i = 0; i < GN; i++)
        want[i] = 3 * x0[i];
    G_EXPECT(y, want);
    /* The input fails (a launch that should have written it failed). */
    conf_mark_failed(x);
    CONF_EXPECT(cube_graph_replay(conf.client, id), CUBE_ERR_SEVERAL);
    CONF_EXPECT_REFUSED(y, GBYTES, CUBE_ERR_RESOURCE_LIMIT);
    /* The same sequence made directly, from this state, would run: */
    g_fill_host(x0, 5, -0.5f);
    CONF_WRITE_OK(x, x0, GBYTES);
    cube_error *err = cube_graph_replay(conf.client, id);
    if (err) {
        g_destroy(id);
        conf_release(x);
        conf_release(y);
        G_FAIL_WITH("the replay after the input was rewritten failed; a "
                    "buffer the graph writes before it reads it was taken "
                    "for an input",
                    err);
    }
    for (uint32_t i = 0; i < GN; i++)
        want[i] = 3 * x0[i];
    G_EXPECT(y, want);
    g_destroy(id);
    conf_release(x);
    conf_release(y);
}

CONF_TEST_NEEDS(graph_buffer_read_before_written_stays_a_replay_input,
                CUBE_FEATURE_KERNELS)
{
    /* w is read (y += w) before the graph rewrites it (w = 2x): its bytes
     * at replay time are an input, and a failure on it refuses the
     * replay. */
    float x0[GN], w0[GN], y0[GN], want[GN];
    cube_handle x = g_floats(1, 1), w = g_floats(3, 0.5f);
    cube_handle y = g_floats(0, 0);
    g_read(x, x0);
    g_read(w, w0);
    g_read(y, y0);
    CONF_OK(cube_graph_prepare(conf.client));
    CONF_OK(cube_graph_begin(conf.client));
    cube_code c1 = conf_code(g_axpy(w, y, 1));
    cube_code c2 = conf_code(g_scale(x, w, 2));
    cube_graph_id id = g_end();
    assert_int_equal(c1, CUBE_OK);
    assert_int_equal(c2, CUBE_OK);
    conf_mark_failed(w);
    CONF_EXPECT(cube_graph_replay(conf.client, id), CUBE_ERR_SEVERAL);
    CONF_EXPECT_REFUSED(y, GBYTES, CUBE_ERR_RESOURCE_LIMIT);
    /* Rewriting w is not enough: y (read and written) carries the failure
     * now, as it would after the same launches made directly; and the
     * refused replay marks everything the graph writes again, w too. */
    CONF_WRITE_OK(w, w0, GBYTES);
    CONF_EXPECT(cube_graph_replay(conf.client, id), CUBE_ERR_SEVERAL);
    CONF_EXPECT_REFUSED(w, GBYTES, CUBE_ERR_RESOURCE_LIMIT);
    /* Both inputs rewritten: the replay lands. */
    CONF_WRITE_OK(w, w0, GBYTES);
    CONF_WRITE_OK(y, y0, GBYTES);
    g_replay(id);
    for (uint32_t i = 0; i < GN; i++)
        want[i] = y0[i] + w0[i];
    G_EXPECT(y, want);
    for (uint32_t i = 0; i < GN; i++)
        want[i] = 2 * x0[i];
    G_EXPECT(w, want);
    g_destroy(id);
    conf_release(x);
    conf_release(w);
    conf_release(y);
}

CONF_TEST_NEEDS(graph_left_undestroyed_is_freed_by_client_close,
                CUBE_FEATURE_KERNELS)
{
    cube_client *c = NULL;
    CONF_OK(cube_client_open(conf.backend, NULL, &c));
    float v[GN];
    g_fill_host(v, 1, 1);
    cube_handle x = {0}, y = {0}, s = {0};
    CONF_OK(cube_create(c, v, GBYTES, &x));
    CONF_OK(cube_empty(c, GBYTES, &y));
    cube_arg args[3] = {cube_arg_buffer(x), cube_arg_buffer(y),
                        cube_arg_f32(2)};
    cube_count n = cube_count_static(conf_div_up(GN, 64), 1, 1);
    CONF_OK(cube_graph_prepare(c));
    CONF_OK(cube_graph_begin(c));
    CONF_OK(cube_launch(c, conf.k.scale, n, args, 3, EXEC));
    cube_graph_id id = 0;
    CONF_OK(cube_graph_end(c, &id));
    CONF_OK(cube_graph_replay(c, id));
    /* A second graph, and a capture left open holding a scratch buffer. */
    CONF_OK(cube_graph_prepare(c));
    CONF_OK(cube_graph_begin(c));
    CONF_OK(cube_launch(c, conf.k.scale_add, n, args, 3, EXEC));
    cube_graph_id id2 = 0;
    CONF_OK(cube_graph_end(c, &id2));
    CONF_OK(cube_graph_prepare(c));
    CONF_OK(cube_graph_begin(c));
    CONF_OK(cube_empty(c, GBYTES, &s));
    cube_arg sargs[3] = {cube_arg_buffer(x), cube_arg_buffer(s),
                         cube_arg_f32(3)};
    CONF_OK(cube_launch(c, conf.k.scale, n, sargs, 3, EXEC));
    /* The caller drops every handle and forgets the graphs: close frees
     * them all (a leak checker sees the rest). */
    CONF_OK(cube_handle_release(c, x));
    CONF_OK(cube_handle_release(c, s));
    cube_client_close(c);
}

/* --- threads --- */

enum { GT_THREADS = 2, GT_ROUNDS = 12, GT_REPLAYS = 10 };

typedef struct gt_worker {
    int id;
    pthread_barrier_t *barrier;
    int failures;
    char first[512];
} gt_worker;

static void gt_fail(gt_worker *w, int round, const char *what, cube_error *err)
{
    if (!w->failures++) {
        char *text = err ? cube_error_format(err) : NULL;
        snprintf(w->first, sizeof w->first, "thread %d, round %d: %s%s%s",
                 w->id, round, what, text ? ": " : "", text ? text : "");
        free(text);
    }
    cube_error_free(err);
}

#define GT_CALL(w, round, expr)                                                \
    do {                                                                       \
        cube_error *gt_err_ = (expr);                                          \
        if (gt_err_)                                                           \
            gt_fail((w), (round), #expr, gt_err_);                             \
    } while (0)

/* Each round: both threads capture at once (a barrier inside the window),
 * then replay their own graph, then check the result. */
static void *gt_capture_main(void *arg)
{
    gt_worker *w = arg;
    cube_client *c = conf.client;
    float x0[GN], y0[GN], got[GN];
    for (int r = 0; r < GT_ROUNDS; r++) {
        float a = (float)(w->id + 1);
        g_fill_host(x0, (float)(w->id * 100 + r), 1);
        g_fill_host(y0, (float)r, -1);
        cube_handle x = {0}, y = {0};
        GT_CALL(w, r, cube_create(c, x0, GBYTES, &x));
        GT_CALL(w, r, cube_create(c, y0, GBYTES, &y));
        cube_arg args[3] = {cube_arg_buffer(x), cube_arg_buffer(y),
                            cube_arg_f32(a)};
        cube_count n = cube_count_static(conf_div_up(GN, 64), 1, 1);
        GT_CALL(w, r, cube_graph_prepare(c));
        GT_CALL(w, r, cube_graph_begin(c));
        pthread_barrier_wait(w->barrier);
        for (int i = 0; i < 3; i++)
            GT_CALL(w, r, cube_launch(c, conf.k.scale_add, n, args, 3, EXEC));
        pthread_barrier_wait(w->barrier);
        cube_graph_id id = 0;
        GT_CALL(w, r, cube_graph_end(c, &id));
        /* Recorded only: y is untouched. */
        cube_copy_desc d = cube_copy_desc_contiguous(y, GBYTES, 4);
        void *dst[1] = {got};
        uint64_t sz[1] = {GBYTES};
        GT_CALL(w, r, cube_read(c, &d, dst, sz, 1));
        if (memcmp(got, y0, GBYTES) != 0)
            gt_fail(w, r, "the capture ran a launch", NULL);
        for (int k = 0; k < GT_REPLAYS; k++)
            GT_CALL(w, r, cube_graph_replay(c, id));
        GT_CALL(w, r, cube_read(c, &d, dst, sz, 1));
        for (uint32_t i = 0; i < GN; i++) {
            float want = y0[i];
            for (int k = 0; k < 3 * GT_REPLAYS; k++)
                want = a * x0[i] + want;
            if (got[i] != want) {
                gt_fail(w, r, "wrong result after the replays", NULL);
                break;
            }
        }
        GT_CALL(w, r, cube_graph_destroy(c, id));
        GT_CALL(w, r, cube_handle_release(c, x));
        GT_CALL(w, r, cube_handle_release(c, y));
    }
    return NULL;
}

static void gt_join_and_report(pthread_t *t, gt_worker *w, int n)
{
    for (int i = 0; i < n; i++)
        assert_int_equal(pthread_join(t[i], NULL), 0);
    int failures = 0;
    for (int i = 0; i < n; i++) {
        if (w[i].failures)
            print_error("%s (%d failures)\n", w[i].first, w[i].failures);
        failures += w[i].failures;
    }
    assert_int_equal(failures, 0);
}

/* Compiles the kernels the threads use, before they start. */
static void gt_warm_kernels(void)
{
    cube_handle h = conf_empty(GBYTES);
    CONF_OK(g_scale(h, h, 0));
    CONF_OK(g_fill(h, 0));
    CONF_OK(g_axpy(h, h, 0));
    conf_release(h);
}

CONF_TEST_NEEDS(graph_two_threads_capture_and_replay_their_own_graphs_at_once,
                CUBE_FEATURE_KERNELS)
{
    gt_warm_kernels();
    pthread_barrier_t barrier;
    assert_int_equal(pthread_barrier_init(&barrier, NULL, GT_THREADS), 0);
    gt_worker w[GT_THREADS];
    pthread_t t[GT_THREADS];
    memset(w, 0, sizeof w);
    for (int i = 0; i < GT_THREADS; i++) {
        w[i].id = i;
        w[i].barrier = &barrier;
        assert_int_equal(pthread_create(&t[i], NULL, gt_capture_main, &w[i]),
                         0);
    }
    gt_join_and_report(t, w, GT_THREADS);
    pthread_barrier_destroy(&barrier);
}

typedef struct gt_replayer {
    gt_worker w;
    cube_graph_id id;
    int replays;       /* how many to make; 0: until refused */
    atomic_int *stop;  /* set once the graph is destroyed */
    int refused_after; /* replays refused once the graph was gone */
} gt_replayer;

static void *gt_replay_main(void *arg)
{
    gt_replayer *p = arg;
    if (p->replays) {
        for (int k = 0; k < p->replays; k++)
            GT_CALL(&p->w, k, cube_graph_replay(conf.client, p->id));
        return NULL;
    }
    /* Until the graph is destroyed, every replay succeeds; after, every
     * one is refused with NOT_FOUND. */
    for (int k = 0;; k++) {
        int gone = atomic_load(p->stop);
        cube_error *err = cube_graph_replay(conf.client, p->id);
        if (!err) {
            if (gone)
                gt_fail(&p->w, k, "a replay of a destroyed graph ran", NULL);
            continue;
        }
        if (cube_error_code(err) != CUBE_ERR_NOT_FOUND) {
            gt_fail(&p->w, k, "replay", err);
            return NULL;
        }
        cube_error_free(err);
        if (++p->refused_after >= 3)
            return NULL;
    }
}

CONF_TEST_NEEDS(graph_replayed_from_several_threads_at_once,
                CUBE_FEATURE_KERNELS)
{
    enum { REPLAYERS = 4, EACH = 50 };
    gt_warm_kernels();
    float x0[GN], want[GN];
    cube_handle x = g_floats(1, 0.5f), y = conf_empty(GBYTES);
    cube_handle u = conf_empty(GBYTES);
    g_read(x, x0);
    CONF_OK(cube_graph_prepare(conf.client));
    CONF_OK(cube_graph_begin(conf.client));
    cube_code c1 = conf_code(g_scale(x, y, 3));
    cube_code c2 = conf_code(g_fill(u, 40));
    cube_graph_id id = g_end();
    assert_int_equal(c1, CUBE_OK);
    assert_int_equal(c2, CUBE_OK);
    gt_replayer p[REPLAYERS];
    pthread_t t[REPLAYERS];
    memset(p, 0, sizeof p);
    for (int i = 0; i < REPLAYERS; i++) {
        p[i].w.id = i;
        p[i].id = id;
        p[i].replays = EACH;
        assert_int_equal(pthread_create(&t[i], NULL, gt_replay_main, &p[i]), 0);
    }
    for (int i = 0; i < REPLAYERS; i++)
        assert_int_equal(pthread_join(t[i], NULL), 0);
    for (int i = 0; i < REPLAYERS; i++)
        if (p[i].w.failures)
            fail_msg("%s", p[i].w.first);
    for (uint32_t i = 0; i < GN; i++)
        want[i] = 3 * x0[i];
    G_EXPECT(y, want);
    uint32_t uv[GN];
    CONF_READ_OK(u, uv, GBYTES);
    for (uint32_t i = 0; i < GN; i++)
        assert_int_equal(uv[i], 40 + i);
    g_destroy(id);
    conf_release(x);
    conf_release(y);
    conf_release(u);
}

CONF_TEST_NEEDS(graph_destroyed_while_other_threads_replay_it_is_safe,
                CUBE_FEATURE_KERNELS)
{
    enum { REPLAYERS = 3 };
    gt_warm_kernels();
    cube_handle x = g_floats(1, 1), w = conf_empty(GBYTES);
    uint64_t live0 = g_live();
    CONF_OK(cube_graph_prepare(conf.client));
    CONF_OK(cube_graph_begin(conf.client));
    /* The graph owns its scratch buffer alone. */
    cube_handle z = {0};
    cube_code codes[3];
    codes[0] = conf_code(cube_empty(conf.client, GBYTES, &z));
    codes[1] = z.bits ? conf_code(g_scale(x, z, 2)) : CUBE_ERR_NOT_FOUND;
    codes[2] = z.bits ? conf_code(g_scale(z, w, 2)) : CUBE_ERR_NOT_FOUND;
    cube_graph_id id = g_end();
    static const cube_code ok3[3] = {CUBE_OK, CUBE_OK, CUBE_OK};
    static const char *const what[3] = {"cube_empty", "scale", "scale"};
    CONF_EXPECT_CODES(codes, ok3, what, 3);
    conf_release(z);
    atomic_int stop;
    atomic_init(&stop, 0);
    gt_replayer p[REPLAYERS];
    pthread_t t[REPLAYERS];
    memset(p, 0, sizeof p);
    for (int i = 0; i < REPLAYERS; i++) {
        p[i].w.id = i;
        p[i].id = id;
        p[i].stop = &stop;
        assert_int_equal(pthread_create(&t[i], NULL, gt_replay_main, &p[i]), 0);
    }
    /* Let them replay a while, then pull the graph from under them. */
    struct timespec ts = {0, 20 * 1000 * 1000};
    nanosleep(&ts, NULL);
    cube_error *err = cube_graph_destroy(conf.client, id);
    atomic_store(&stop, 1);
    for (int i = 0; i < REPLAYERS; i++)
        assert_int_equal(pthread_join(t[i], NULL), 0);
    CONF_OK(err);
    for (int i = 0; i < REPLAYERS; i++) {
        if (p[i].w.failures)
            fail_msg("%s", p[i].w.first);
        assert_true(p[i].refused_after >= 3);
    }
    /* The scratch buffer went with the graph. */
    assert_int_equal(g_live(), live0);
    float x0[GN], want[GN];
    g_read(x, x0);
    for (uint32_t i = 0; i < GN; i++)
        want[i] = 4 * x0[i];
    G_EXPECT(w, want);
    conf_release(x);
    conf_release(w);
}

/* --- dry run and arguments --- */

CONF_TEST_NEEDS(graph_replay_inside_dry_run_does_nothing, CUBE_FEATURE_KERNELS)
{
    float x0[GN], y0[GN], want[GN];
    cube_handle x = g_floats(1, 1), y = g_floats(7, 7);
    g_read(x, x0);
    g_read(y, y0);
    CONF_OK(cube_graph_prepare(conf.client));
    CONF_OK(cube_graph_begin(conf.client));
    cube_code c1 = conf_code(g_axpy(x, y, 1));
    cube_graph_id id = g_end();
    assert_int_equal(c1, CUBE_OK);
    CONF_OK(cube_dry_run_begin(conf.client));
    cube_code in_dry[2];
    in_dry[0] = conf_code(cube_graph_replay(conf.client, id));
    in_dry[1] = conf_code(cube_graph_replay(conf.client, id));
    CONF_OK(cube_dry_run_end(conf.client));
    static const cube_code ok2[2] = {CUBE_OK, CUBE_OK};
    static const char *const what[2] = {"replay in a dry run",
                                        "second replay in a dry run"};
    CONF_EXPECT_CODES(in_dry, ok2, what, 2);
    G_EXPECT(y, y0);
    g_replay(id);
    for (uint32_t i = 0; i < GN; i++)
        want[i] = y0[i] + x0[i];
    G_EXPECT(y, want);
    g_destroy(id);
    conf_release(x);
    conf_release(y);
}

CONF_TEST_NEEDS(graph_null_client_or_out_is_invalid_argument,
                CUBE_FEATURE_KERNELS)
{
    CONF_EXPECT(cube_graph_prepare(NULL), CUBE_ERR_INVALID_ARGUMENT);
    CONF_EXPECT(cube_graph_begin(NULL), CUBE_ERR_INVALID_ARGUMENT);
    cube_graph_id id = 5;
    CONF_EXPECT(cube_graph_end(NULL, &id), CUBE_ERR_INVALID_ARGUMENT);
    CONF_EXPECT(cube_graph_replay(NULL, 1), CUBE_ERR_INVALID_ARGUMENT);
    CONF_EXPECT(cube_graph_destroy(NULL, 1), CUBE_ERR_INVALID_ARGUMENT);
    /* end with out NULL while capturing: refused, and the capture is still
     * there to end properly. */
    cube_handle x = g_floats(1, 1), y = conf_empty(GBYTES);
    CONF_OK(cube_graph_prepare(conf.client));
    CONF_OK(cube_graph_begin(conf.client));
    cube_code c1 = conf_code(g_scale(x, y, 2));
    cube_code c2 = conf_code(cube_graph_end(conf.client, NULL));
    cube_graph_id g = g_end();
    assert_int_equal(c1, CUBE_OK);
    assert_int_equal(c2, CUBE_ERR_INVALID_ARGUMENT);
    g_replay(g);
    g_destroy(g);
    conf_release(x);
    conf_release(y);
}
