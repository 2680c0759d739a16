/* Profiling windows and the dry-run scope, sentence by sentence of the
 * server contract:
 *
 * start_profile    "Enable collecting timestamps."
 * end_profile      "Disable collecting timestamps." -> Result<ProfileDuration,
 *                  ProfileError>
 * abandon_profile  "Drop the window token opened without measuring it, for
 *                  a caller that will never close it with end_profile ...
 *                  this is the one call that needs none of [the syncing and
 *                  flushing]."
 * launch           "On LaunchMode::Skip the server must still do everything
 *                  a first launch does short of dispatching — expand,
 *                  compile, validate, fill its caches — and then drop the
 *                  launch."
 *
 * and cubert/profile.h: each token is independent (windows nest and
 * overlap), a token belongs to the stream that opened it, a failure inside
 * a window fails its result with CUBE_ERR_PROFILE and that failure as
 * cause; a dry-run scope makes every launch of the process a Skip, nests as
 * a counter and ignores extra ends.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "conformance.h"

#define EXEC CUBE_LAUNCH_EXECUTE
#define PN 4096u
#define PBYTES (PN * 4ull)

/* --- helpers --- */

static cube_handle p_floats(float base, float step)
{
    float *v = malloc(PBYTES);
    assert_non_null(v);
    for (uint32_t i = 0; i < PN; i++)
        v[i] = base + step * (float)i;
    cube_handle h = conf_create(v, PBYTES);
    free(v);
    return h;
}

/* y = a * x + y over PN elements. */
static cube_error *p_axpy(cube_handle x, cube_handle y, float a)
{
    cube_arg args[3] = {cube_arg_buffer(x), cube_arg_buffer(y),
                        cube_arg_f32(a)};
    return conf_launch(conf.k.scale_add,
                       cube_count_static(conf_div_up(PN, 64), 1, 1), args, 3,
                       EXEC);
}

static void p_launches(cube_handle x, cube_handle y, int n)
{
    for (int i = 0; i < n; i++)
        CONF_OK(p_axpy(x, y, 1));
}

static cube_error *p_broken(cube_handle x, cube_handle y, cube_handle z)
{
    cube_arg args[3] = {cube_arg_buffer(x), cube_arg_buffer(y),
                        cube_arg_buffer(z)};
    return conf_launch(conf.k.broken, cube_count_static(1, 1, 1), args, 3,
                       EXEC);
}

static cube_profile_token p_start(void)
{
    cube_profile_token t = 0;
    CONF_OK(cube_profile_start(conf.client, &t));
    return t;
}

static cube_profile_result p_end(cube_profile_token t)
{
    cube_profile_result r;
    memset(&r, 0xAB, sizeof r);
    CONF_OK(cube_profile_end(conf.client, t, &r));
    return r;
}

/* The method a backend measures with: the host clock on every backend
 * whose properties say it times on the host clock (the CPU's do). */
static void p_expect_method(const cube_profile_result *r)
{
    if (conf.props.timing == CUBE_TIMING_HOST_CLOCK)
        assert_int_equal(r->method, CUBE_TIMING_HOST_CLOCK);
    else
        assert_true(r->method == CUBE_TIMING_HOST_CLOCK ||
                    r->method == CUBE_TIMING_DEVICE);
}

/* Every element of h equals want(i) = base + step * i. */
static void p_expect_floats(cube_handle h, float base, float step)
{
    float *v = malloc(PBYTES);
    assert_non_null(v);
    CONF_READ_OK(h, v, PBYTES);
    for (uint32_t i = 0; i < PN; i++)
        if (v[i] != base + step * (float)i) {
            float got = v[i];
            free(v);
            fail_msg("element %u: %g, expected %g", i, (double)got,
                     (double)(base + step * (float)i));
        }
    free(v);
}

/* --- profiling windows --- */

CONF_TEST_NEEDS(profile_window_reports_duration_method_and_launch_count,
                CUBE_FEATURE_KERNELS)
{
    cube_handle x = p_floats(1, 1), y = p_floats(0, 0);
    /* Work before the window is not the window's. */
    p_launches(x, y, 3);
    cube_profile_token t = p_start();
    p_launches(x, y, 5);
    /* Copies are not launches. */
    float v[16] = {0};
    cube_handle small = conf_create(v, sizeof v);
    CONF_READ_OK(small, v, sizeof v);
    cube_profile_result r = p_end(t);
    assert_true(r.seconds > 0);
    assert_true(r.seconds < 60);
    p_expect_method(&r);
    assert_int_equal(r.launches, 5);
    /* The work the window measured is done when end returns. */
    p_expect_floats(y, 8, 8);
    /* An empty window: no launches, a duration that is not negative. */
    t = p_start();
    r = p_end(t);
    assert_int_equal(r.launches, 0);
    assert_true(r.seconds >= 0);
    p_expect_method(&r);
    conf_release(small);
    conf_release(x);
    conf_release(y);
}

CONF_TEST_NEEDS(profile_windows_nest, CUBE_FEATURE_KERNELS)
{
    cube_handle x = p_floats(1, 1), y = p_floats(0, 0);
    cube_profile_token a = p_start();
    p_launches(x, y, 2);
    cube_profile_token b = p_start();
    assert_true(a != b);
    p_launches(x, y, 3);
    cube_profile_result rb = p_end(b);
    p_launches(x, y, 1);
    cube_profile_result ra = p_end(a);
    assert_int_equal(rb.launches, 3);
    assert_int_equal(ra.launches, 6);
    assert_true(ra.launches >= rb.launches);
    assert_true(rb.seconds > 0);
    assert_true(ra.seconds >= rb.seconds);
    p_expect_method(&ra);
    p_expect_method(&rb);
    /* Deeper: three levels, closed inside out. */
    cube_profile_token t[3];
    for (int i = 0; i < 3; i++) {
        t[i] = p_start();
        p_launches(x, y, 1);
    }
    uint64_t want[3] = {3, 2, 1};
    double prev = 0;
    for (int i = 2; i >= 0; i--) {
        cube_profile_result r = p_end(t[i]);
        assert_int_equal(r.launches, want[i]);
        assert_true(r.seconds >= prev);
        prev = r.seconds;
    }
    conf_release(x);
    conf_release(y);
}

CONF_TEST_NEEDS(profile_windows_overlap, CUBE_FEATURE_KERNELS)
{
    cube_handle x = p_floats(1, 1), y = p_floats(0, 0);
    cube_profile_token a = p_start();
    p_launches(x, y, 2);
    cube_profile_token b = p_start();
    p_launches(x, y, 3);
    /* A closes first, B stays open and keeps counting. */
    cube_profile_result ra = p_end(a);
    p_launches(x, y, 4);
    cube_profile_result rb = p_end(b);
    assert_int_equal(ra.launches, 5);
    assert_int_equal(rb.launches, 7);
    assert_true(ra.seconds > 0);
    assert_true(rb.seconds > 0);
    p_expect_method(&ra);
    p_expect_method(&rb);
    conf_release(x);
    conf_release(y);
}

CONF_TEST_NEEDS(profile_end_twice_is_profile_error, CUBE_FEATURE_KERNELS)
{
    cube_handle x = p_floats(1, 1), y = p_floats(0, 0);
    cube_profile_token t = p_start();
    p_launches(x, y, 1);
    cube_profile_result r = p_end(t);
    assert_int_equal(r.launches, 1);
    memset(&r, 0xAB, sizeof r);
    CONF_EXPECT(cube_profile_end(conf.client, t, &r), CUBE_ERR_PROFILE);
    CONF_EXPECT(cube_profile_end(conf.client, t, &r), CUBE_ERR_PROFILE);
    /* A new window gets a token of its own, never the closed one again. */
    cube_profile_token u = p_start();
    assert_true(u != t);
    CONF_EXPECT(cube_profile_end(conf.client, t, &r), CUBE_ERR_PROFILE);
    r = p_end(u);
    assert_int_equal(r.launches, 0);
    conf_release(x);
    conf_release(y);
}

CONF_TEST(profile_end_of_unknown_token_is_profile_error)
{
    cube_profile_result r;
    CONF_EXPECT(cube_profile_end(conf.client, 0, &r), CUBE_ERR_PROFILE);
    CONF_EXPECT(cube_profile_end(conf.client, UINT64_MAX, &r),
                CUBE_ERR_PROFILE);
    /* An open window is not disturbed by the refusals. */
    cube_profile_token t = p_start();
    CONF_EXPECT(cube_profile_end(conf.client, t + 1000003, &r),
                CUBE_ERR_PROFILE);
    CONF_EXPECT(cube_profile_end(conf.client, ~t, &r), CUBE_ERR_PROFILE);
    r = p_end(t);
    assert_int_equal(r.launches, 0);
}

CONF_TEST_NEEDS(profile_abandon_drops_the_window, CUBE_FEATURE_KERNELS)
{
    cube_handle x = p_floats(1, 1), y = p_floats(0, 0);
    cube_profile_token keep = p_start();
    cube_profile_token t = p_start();
    p_launches(x, y, 2);
    cube_profile_abandon(conf.client, t);
    cube_profile_result r;
    CONF_EXPECT(cube_profile_end(conf.client, t, &r), CUBE_ERR_PROFILE);
    /* Unknown tokens, a second abandon, a NULL client: harmless. */
    cube_profile_abandon(conf.client, t);
    cube_profile_abandon(conf.client, 0);
    cube_profile_abandon(conf.client, UINT64_MAX);
    cube_profile_abandon(NULL, keep);
    /* The other window was not touched. */
    p_launches(x, y, 1);
    r = p_end(keep);
    assert_int_equal(r.launches, 3);
    assert_true(r.seconds > 0);
    /* The work issued in the abandoned window was not dropped with it. */
    p_expect_floats(y, 3, 3);
    /* Many abandoned windows leave the stream as it was. */
    for (int i = 0; i < 100; i++)
        cube_profile_abandon(conf.client, p_start());
    t = p_start();
    p_launches(x, y, 1);
    r = p_end(t);
    assert_int_equal(r.launches, 1);
    conf_release(x);
    conf_release(y);
}

CONF_TEST_NEEDS(profile_failed_launch_in_window_fails_end_with_its_cause,
                CUBE_FEATURE_KERNELS)
{
    cube_handle x = p_floats(1, 1), y = p_floats(0, 0);
    cube_handle a = conf_empty(16), b = conf_empty(16), c = conf_empty(16);
    cube_profile_token t = p_start();
    p_launches(x, y, 1);
    CONF_EXPECT(p_broken(a, b, c), CUBE_ERR_COMPILE);
    p_launches(x, y, 1);
    cube_profile_result r;
    memset(&r, 0, sizeof r);
    cube_error *err = cube_profile_end(conf.client, t, &r);
    CONF_CODE(err, CUBE_ERR_PROFILE);
    assert_true(cube_error_cause_count(err) >= 1);
    const cube_error *cause = cube_error_cause(err, 0);
    if (cube_error_code(cause) != CUBE_ERR_COMPILE) {
        char *text = cube_error_format(err);
        print_error("the window's error does not carry the launch's failure "
                    "as its cause:\n%s\n",
                    text ? text : "?");
        free(text);
        cube_error_free(err);
        fail();
    }
    cube_error_free(err);
    /* The window is closed either way. */
    CONF_EXPECT(cube_profile_end(conf.client, t, &r), CUBE_ERR_PROFILE);
    /* The client stays usable and the next window measures again. */
    t = p_start();
    p_launches(x, y, 2);
    r = p_end(t);
    assert_int_equal(r.launches, 2);
    assert_true(r.seconds > 0);
    p_expect_floats(y, 4, 4);
    conf_release(a);
    conf_release(b);
    conf_release(c);
    conf_release(x);
    conf_release(y);
}

CONF_TEST_NEEDS(profile_failure_outside_the_window_does_not_fail_it,
                CUBE_FEATURE_KERNELS)
{
    cube_handle x = p_floats(1, 1), y = p_floats(0, 0);
    cube_handle a = conf_empty(16), b = conf_empty(16), c = conf_empty(16);
    /* Before the window opened. */
    CONF_EXPECT(p_broken(a, b, c), CUBE_ERR_COMPILE);
    cube_profile_token t = p_start();
    p_launches(x, y, 1);
    /* On another stream, while it is open. */
    CONF_OK(cube_stream_use(conf.client, 0x9F0000000000001ull));
    CONF_EXPECT(p_broken(a, b, c), CUBE_ERR_COMPILE);
    conf_mark_failed(c);
    CONF_OK(cube_stream_use(conf.client, 0));
    cube_profile_result r = p_end(t);
    assert_int_equal(r.launches, 1);
    /* After it closed: a later window is not failed by it either. */
    t = p_start();
    r = p_end(t);
    assert_int_equal(r.launches, 0);
    conf_release(a);
    conf_release(b);
    conf_release(c);
    conf_release(x);
    conf_release(y);
}

CONF_TEST_NEEDS(profile_failed_replay_in_window_fails_end, CUBE_FEATURE_KERNELS)
{
    cube_handle x = p_floats(1, 1), y = conf_empty(PBYTES);
    cube_handle j1 = conf_empty(16), j2 = conf_empty(16);
    cube_arg args[3] = {cube_arg_buffer(x), cube_arg_buffer(y),
                        cube_arg_f32(2)};
    CONF_OK(cube_graph_prepare(conf.client));
    CONF_OK(cube_graph_begin(conf.client));
    cube_error *rec =
        conf_launch(conf.k.scale, cube_count_static(conf_div_up(PN, 64), 1, 1),
                    args, 3, EXEC);
    cube_graph_id id = 0;
    cube_error *end = cube_graph_end(conf.client, &id);
    CONF_OK(rec);
    CONF_OK(end);
    /* The graph's input fails; a replay inside a window fails the window. */
    CONF_EXPECT(p_broken(x, j1, j2), CUBE_ERR_COMPILE);
    cube_profile_token t = p_start();
    cube_error *rep = cube_graph_replay(conf.client, id);
    cube_profile_result r;
    cube_error *err = cube_profile_end(conf.client, t, &r);
    CONF_EXPECT(rep, CUBE_ERR_SEVERAL);
    CONF_CODE(err, CUBE_ERR_PROFILE);
    assert_true(cube_error_cause_count(err) >= 1);
    assert_true(conf_error_has_code(err, CUBE_ERR_COMPILE));
    cube_error_free(err);
    CONF_OK(cube_graph_destroy(conf.client, id));
    conf_release(x);
    conf_release(y);
    conf_release(j1);
    conf_release(j2);
}

CONF_TEST_NEEDS(profile_refused_calls_do_not_fail_the_window,
                CUBE_FEATURE_KERNELS)
{
    /* A call refused for its lifecycle order ran no work and failed no
     * work: the window around it measures the work that did run. */
    cube_handle x = p_floats(1, 1), y = p_floats(0, 0);
    cube_handle o = conf_empty(PBYTES);
    cube_arg args[3] = {cube_arg_buffer(x), cube_arg_buffer(o),
                        cube_arg_f32(2)};
    cube_count n = cube_count_static(conf_div_up(PN, 64), 1, 1);
    CONF_OK(cube_graph_prepare(conf.client));
    CONF_OK(cube_graph_begin(conf.client));
    cube_error *rec = conf_launch(conf.k.scale, n, args, 3, EXEC);
    cube_graph_id id = 0;
    cube_error *end = cube_graph_end(conf.client, &id);
    CONF_OK(rec);
    CONF_OK(end);

    cube_profile_token t = p_start();
    p_launches(x, y, 1);
    /* Replay of an id that does not exist. */
    CONF_EXPECT(cube_graph_replay(conf.client, id + 7777), CUBE_ERR_NOT_FOUND);
    /* Inside a capture: a write and a replay, both refused. */
    CONF_OK(cube_graph_prepare(conf.client));
    CONF_OK(cube_graph_begin(conf.client));
    float v[PN];
    memset(v, 0, sizeof v);
    cube_error *werr = conf_write(o, v, PBYTES);
    cube_code w = cube_error_code(werr);
    cube_error_free(werr);
    cube_error *rep = cube_graph_replay(conf.client, id);
    cube_graph_id id2 = 0;
    end = cube_graph_end(conf.client, &id2);
    cube_code r_code = cube_error_code(rep);
    cube_error_free(rep);
    CONF_OK(end);
    assert_int_equal(w, CUBE_ERR_GRAPH_STATE);
    assert_int_equal(r_code, CUBE_ERR_GRAPH_STATE);
    CONF_OK(cube_graph_destroy(conf.client, id2));
    /* The refusals left the graph's output trusted. */
    CONF_OK(cube_check(conf.client, &o, 1));
    cube_profile_result r;
    cube_error *err = cube_profile_end(conf.client, t, &r);
    CONF_OK(cube_graph_destroy(conf.client, id));
    conf_release(x);
    conf_release(y);
    conf_release(o);
    CONF_OK(err);
    assert_int_equal(r.launches, 1);
}

CONF_TEST_NEEDS(profile_window_counts_replayed_launches, CUBE_FEATURE_KERNELS)
{
    cube_handle x = p_floats(1, 1), y = p_floats(0, 0);
    CONF_OK(cube_graph_prepare(conf.client));
    CONF_OK(cube_graph_begin(conf.client));
    cube_error *e[3];
    for (int i = 0; i < 3; i++)
        e[i] = p_axpy(x, y, 1);
    cube_graph_id id = 0;
    cube_error *end = cube_graph_end(conf.client, &id);
    for (int i = 0; i < 3; i++)
        CONF_OK(e[i]);
    CONF_OK(end);
    cube_profile_token t = p_start();
    CONF_OK(cube_graph_replay(conf.client, id));
    CONF_OK(cube_graph_replay(conf.client, id));
    p_launches(x, y, 1);
    cube_profile_result r = p_end(t);
    assert_int_equal(r.launches, 7);
    assert_true(r.seconds > 0);
    p_expect_floats(y, 7, 7);
    CONF_OK(cube_graph_destroy(conf.client, id));
    conf_release(x);
    conf_release(y);
}

typedef struct p_peer {
    pthread_barrier_t barrier;
    cube_handle x, y;
    cube_profile_token token;
    cube_error *start_err, *end_err;
    cube_profile_result result;
} p_peer;

/* Opens a window on this thread's own stream, lets the main thread try to
 * close it, then closes it itself. */
static void *p_peer_main(void *arg)
{
    p_peer *p = arg;
    p->start_err = cube_profile_start(conf.client, &p->token);
    if (!p->start_err) {
        cube_arg args[3] = {cube_arg_buffer(p->x), cube_arg_buffer(p->y),
                            cube_arg_f32(1)};
        for (int i = 0; i < 2; i++) {
            cube_error *err = cube_launch(
                conf.client, conf.k.scale_add,
                cube_count_static(conf_div_up(PN, 64), 1, 1), args, 3, EXEC);
            if (err && !p->start_err)
                p->start_err = err;
            else
                cube_error_free(err);
        }
    }
    pthread_barrier_wait(&p->barrier);
    pthread_barrier_wait(&p->barrier);
    if (!p->start_err)
        p->end_err = cube_profile_end(conf.client, p->token, &p->result);
    return NULL;
}

CONF_TEST_NEEDS(profile_token_of_another_threads_stream_is_profile_error,
                CUBE_FEATURE_KERNELS)
{
    p_peer p;
    memset(&p, 0, sizeof p);
    p.x = p_floats(1, 1);
    p.y = p_floats(0, 0);
    assert_int_equal(pthread_barrier_init(&p.barrier, NULL, 2), 0);
    /* This thread has a window of its own open meanwhile. */
    cube_profile_token mine = p_start();
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, p_peer_main, &p), 0);
    pthread_barrier_wait(&p.barrier);
    cube_profile_result r;
    cube_error *err = cube_profile_end(conf.client, p.token, &r);
    cube_profile_abandon(conf.client, p.token); /* not ours: ignored */
    pthread_barrier_wait(&p.barrier);
    assert_int_equal(pthread_join(t, NULL), 0);
    pthread_barrier_destroy(&p.barrier);
    CONF_OK(p.start_err);
    CONF_EXPECT(err, CUBE_ERR_PROFILE);
    /* Its own thread closes it fine, and it saw only its own launches. */
    CONF_OK(p.end_err);
    assert_int_equal(p.result.launches, 2);
    assert_true(p.result.seconds > 0);
    r = p_end(mine);
    assert_int_equal(r.launches, 0);
    /* The same holds for a stream named with cube_stream_use: a window of
     * stream S is closed on S only. */
    const cube_stream_id s = 0x9F0000000000002ull;
    CONF_OK(cube_stream_use(conf.client, s));
    cube_profile_token ts = p_start();
    CONF_OK(cube_stream_use(conf.client, 0));
    CONF_EXPECT(cube_profile_end(conf.client, ts, &r), CUBE_ERR_PROFILE);
    CONF_OK(cube_stream_use(conf.client, s));
    r = p_end(ts);
    CONF_OK(cube_stream_use(conf.client, 0));
    assert_int_equal(r.launches, 0);
    conf_release(p.x);
    conf_release(p.y);
}

static void p_sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0) {
    }
}

static double p_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

CONF_TEST(profile_window_measures_what_its_timing_method_says)
{
    /* cubert/profile.h: on the host clock (a backend that runs work at
     * issue time) a window measures the time spent running the work
     * issued in it, so the host idling inside the window does not count:
     * an empty window around a 30 ms sleep reports 0, and one with a copy
     * on each side of a 60 ms sleep reports the copies only. With device
     * timestamps a window spans its start to the end of its last work on
     * the device's clock, idle time included. */
    cube_profile_token t = p_start();
    double t0 = p_now();
    p_sleep_ms(30);
    double slept = p_now() - t0;
    cube_profile_result empty = p_end(t);
    p_expect_method(&empty);
    assert_int_equal(empty.launches, 0);

    const uint64_t bytes = 1u << 20;
    unsigned char *host = malloc(bytes);
    assert_non_null(host);
    conf_pattern(host, bytes, 0x30);
    cube_handle h = conf_empty(bytes);
    t = p_start();
    double c0 = p_now();
    CONF_WRITE_OK(h, host, bytes);
    double c1 = p_now();
    p_sleep_ms(60);
    double c2 = p_now();
    CONF_READ_OK(h, host, bytes);
    double c3 = p_now();
    cube_profile_result copies = p_end(t);
    /* What the two calls took on the host clock, whatever the build
     * (sanitizers slow copies down): the window may not report more. */
    double copy_calls = (c1 - c0) + (c3 - c2);
    p_expect_method(&copies);
    conf_release(h);
    free(host);

    if (empty.method == CUBE_TIMING_HOST_CLOCK) {
        if (empty.seconds != 0)
            fail_msg("an empty window around a %.1f ms sleep took %g s",
                     slept * 1e3, empty.seconds);
        if (!(copies.seconds > 0 && copies.seconds <= copy_calls + 1e-4))
            fail_msg("two 1 MiB copies (their calls took %g s) around a "
                     "60 ms sleep took %g s",
                     copy_calls, copies.seconds);
    } else {
        /* The device's clock and the host's: a millisecond of slack. */
        if (!(empty.seconds >= slept - 1e-3))
            fail_msg("an empty window around a %.1f ms sleep took %g s on "
                     "the device",
                     slept * 1e3, empty.seconds);
        if (!(copies.seconds >= 0.060 - 1e-3))
            fail_msg("two copies around a 60 ms sleep took %g s on the "
                     "device",
                     copies.seconds);
    }
}

CONF_TEST(profile_null_arguments_are_invalid_argument)
{
    cube_profile_token t = 0;
    cube_profile_result r;
    CONF_EXPECT(cube_profile_start(NULL, &t), CUBE_ERR_INVALID_ARGUMENT);
    CONF_EXPECT(cube_profile_start(conf.client, NULL),
                CUBE_ERR_INVALID_ARGUMENT);
    t = p_start();
    CONF_EXPECT(cube_profile_end(NULL, t, &r), CUBE_ERR_INVALID_ARGUMENT);
    CONF_EXPECT(cube_profile_end(conf.client, t, NULL),
                CUBE_ERR_INVALID_ARGUMENT);
    /* The refusals left the window open. */
    r = p_end(t);
    assert_int_equal(r.launches, 0);
}

/* Needs no kernel: windows around copies only, nested, measure on the
 * backend's clock and count no launch; a launch that fails inside a window
 * (a compile error, or CUBE_ERR_UNSUPPORTED where the backend runs no
 * kernels) fails the window with that failure as its cause; an abandoned
 * window is gone. */
CONF_TEST(profile_windows_around_copies_and_a_failed_launch)
{
    float *v = malloc(PBYTES);
    assert_non_null(v);
    for (uint32_t i = 0; i < PN; i++)
        v[i] = (float)i;
    cube_handle x = conf_empty(PBYTES);
    cube_profile_token outer = p_start();
    CONF_WRITE_OK(x, v, PBYTES);
    cube_profile_token inner = p_start();
    assert_true(inner != outer);
    CONF_READ_OK(x, v, PBYTES);
    cube_profile_result ri = p_end(inner);
    CONF_WRITE_OK(x, v, PBYTES);
    cube_profile_result ro = p_end(outer);
    assert_int_equal(ri.launches, 0);
    assert_int_equal(ro.launches, 0);
    assert_true(ri.seconds >= 0);
    assert_true(ro.seconds >= ri.seconds);
    assert_true(ro.seconds < 60);
    p_expect_method(&ri);
    p_expect_method(&ro);
    free(v);

    cube_handle a = conf_empty(16), b = conf_empty(16), c = conf_empty(16);
    cube_code want =
        conf_runs_kernels() ? CUBE_ERR_COMPILE : CUBE_ERR_UNSUPPORTED;
    cube_profile_token t = p_start();
    CONF_EXPECT(p_broken(a, b, c), want);
    cube_profile_result r;
    cube_error *err = cube_profile_end(conf.client, t, &r);
    CONF_CODE(err, CUBE_ERR_PROFILE);
    assert_true(conf_error_has_code(err, want));
    cube_error_free(err);
    CONF_EXPECT(cube_profile_end(conf.client, t, &r), CUBE_ERR_PROFILE);

    float few[2];
    t = p_start();
    CONF_READ_OK(x, few, sizeof few);
    cube_profile_abandon(conf.client, t);
    CONF_EXPECT(cube_profile_end(conf.client, t, &r), CUBE_ERR_PROFILE);
    conf_release(a);
    conf_release(b);
    conf_release(c);
    conf_release(x);
}

/* --- dry run --- */

static const char SRC_DRY_PROBE[] =
    "CUBE_KERNEL(dry_probe, CUBE_OUT(uint32_t, y), CUBE_SCALAR(uint32_t, v))\n"
    "{\n"
    "    uint32_t i = ABSOLUTE_POS_X;\n"
    "    if (i < CUBE_LEN(y)) y[i] = v;\n"
    "}\n";

/* Leaves every dry-run scope this test may have left open. */
static void p_dry_run_reset(void)
{
    for (int i = 0; i < 64 && cube_dry_run_active(conf.client); i++)
        CONF_OK(cube_dry_run_end(conf.client));
}

/* Needs no kernel: a launch inside a dry run changes no buffer and no
 * failure record, whether it compiles (a Skip) or fails to (a backend that
 * runs no kernels still says so); after the scope the same launch runs,
 * or fails and is recorded on its buffer. */
CONF_TEST(dry_run_launch_changes_no_buffer_or_failure_record)
{
    enum { N = 64 };
    uint32_t before[N], got[N];
    conf_pattern(before, sizeof before, 0xD7);
    cube_handle y = conf_create(before, sizeof before);
    cube_arg args[2] = {cube_arg_buffer(y), cube_arg_u32(5)};
    cube_count two = cube_count_static(2, 1, 1); /* fill: 32 units a cube */
    cube_code want = conf_runs_kernels() ? CUBE_OK : CUBE_ERR_UNSUPPORTED;
    p_dry_run_reset();
    CONF_OK(cube_dry_run_begin(conf.client));
    cube_code in_scope =
        conf_code(conf_launch(conf.k.fill, two, args, 2, EXEC));
    CONF_OK(cube_dry_run_end(conf.client));
    assert_int_equal(in_scope, want);
    CONF_OK(cube_check(conf.client, &y, 1));
    CONF_READ_OK(y, got, sizeof got);
    assert_memory_equal(got, before, sizeof got);

    assert_int_equal(conf_code(conf_launch(conf.k.fill, two, args, 2, EXEC)),
                     want);
    if (conf_runs_kernels()) {
        CONF_READ_OK(y, got, sizeof got);
        for (uint32_t i = 0; i < N; i++)
            assert_int_equal(got[i], 5 + i);
    } else {
        CONF_EXPECT_REFUSED(y, sizeof got, CUBE_ERR_UNSUPPORTED);
    }
    conf_release(y);
}

CONF_TEST_NEEDS(dry_run_launches_compile_and_validate_but_change_no_buffer,
                CUBE_FEATURE_KERNELS)
{
    cube_handle x = p_floats(1, 1), y = p_floats(5, 0);
    cube_handle a = p_floats(0, 1), b = p_floats(0, 2), c = p_floats(0, 3);
    cube_kernel *fresh = conf_kernel("dry_probe", SRC_DRY_PROBE, 16, 1, 1);
    p_dry_run_reset();
    assert_false(cube_dry_run_active(conf.client));
    CONF_OK(cube_dry_run_begin(conf.client));
    int active = cube_dry_run_active(conf.client);
    cube_code codes[5];
    cube_error *e[5];
    e[0] = p_axpy(x, y, 1);
    e[1] = p_broken(a, b, c);
    cube_arg two[2] = {cube_arg_buffer(a), cube_arg_buffer(b)};
    e[2] = conf_launch(conf.k.too_many_units, cube_count_static(1, 1, 1), two,
                       2, EXEC);
    e[3] =
        conf_launch(conf.k.scale_add, cube_count_static(1, 1, 1), two, 2, EXEC);
    /* A kernel no launch has compiled yet compiles in the dry run. */
    cube_arg probe[2] = {cube_arg_buffer(c), cube_arg_u32(9)};
    e[4] = conf_launch(fresh, cube_count_static(1, 1, 1), probe, 2, EXEC);
    CONF_OK(cube_dry_run_end(conf.client));
    for (int i = 0; i < 5; i++) {
        codes[i] = cube_error_code(e[i]);
        cube_error_free(e[i]);
    }
    assert_true(active);
    assert_false(cube_dry_run_active(conf.client));
    assert_int_equal(codes[0], CUBE_OK);
    assert_int_equal(codes[1], CUBE_ERR_COMPILE);
    assert_int_equal(codes[2], CUBE_ERR_RESOURCE_LIMIT);
    assert_int_equal(codes[3], CUBE_ERR_INVALID_ARGUMENT);
    assert_int_equal(codes[4], CUBE_OK);
    /* No buffer changed, and no failure was recorded on any. */
    p_expect_floats(y, 5, 0);
    p_expect_floats(a, 0, 1);
    p_expect_floats(b, 0, 2);
    p_expect_floats(c, 0, 3);
    cube_handle all[5] = {x, y, a, b, c};
    CONF_OK(cube_check(conf.client, all, 5));
    /* Out of the scope the same launch runs. */
    CONF_OK(p_axpy(x, y, 1));
    p_expect_floats(y, 6, 1);
    CONF_OK(conf_launch(fresh, cube_count_static(1, 1, 1), probe, 2, EXEC));
    uint32_t got[4];
    CONF_READ_OK(c, got, sizeof got);
    for (int i = 0; i < 4; i++)
        assert_int_equal(got[i], 9);
    cube_kernel_release(fresh);
    for (int i = 0; i < 5; i++)
        conf_release(all[i]);
}

CONF_TEST_NEEDS(dry_run_scopes_nest_and_launches_run_after_the_last_end,
                CUBE_FEATURE_KERNELS)
{
    cube_handle x = p_floats(1, 1), y = p_floats(0, 0);
    p_dry_run_reset();
    CONF_OK(cube_dry_run_begin(conf.client));
    CONF_OK(cube_dry_run_begin(conf.client));
    CONF_OK(cube_dry_run_end(conf.client));
    int still = cube_dry_run_active(conf.client);
    cube_error *e1 = p_axpy(x, y, 1);
    CONF_OK(cube_dry_run_begin(conf.client));
    CONF_OK(cube_dry_run_end(conf.client));
    int again = cube_dry_run_active(conf.client);
    cube_error *e2 = p_axpy(x, y, 1);
    CONF_OK(cube_dry_run_end(conf.client));
    int after = cube_dry_run_active(conf.client);
    p_dry_run_reset();
    CONF_OK(e1);
    CONF_OK(e2);
    assert_true(still);
    assert_true(again);
    assert_false(after);
    p_expect_floats(y, 0, 0);
    CONF_OK(p_axpy(x, y, 1));
    p_expect_floats(y, 1, 1);
    conf_release(x);
    conf_release(y);
}

CONF_TEST_NEEDS(dry_run_end_without_begin_is_refused, CUBE_FEATURE_KERNELS)
{
    cube_handle x = p_floats(1, 1), y = p_floats(0, 0);
    p_dry_run_reset();
    CONF_EXPECT(cube_dry_run_end(conf.client), CUBE_ERR_INVALID_ARGUMENT);
    CONF_EXPECT(cube_dry_run_end(conf.client), CUBE_ERR_INVALID_ARGUMENT);
    CONF_EXPECT(cube_dry_run_begin(NULL), CUBE_ERR_INVALID_ARGUMENT);
    CONF_EXPECT(cube_dry_run_end(NULL), CUBE_ERR_INVALID_ARGUMENT);
    assert_false(cube_dry_run_active(NULL));
    int after_ends = cube_dry_run_active(conf.client);
    CONF_OK(p_axpy(x, y, 1));
    /* The refused ends banked no credit: one begin is active again. */
    CONF_OK(cube_dry_run_begin(conf.client));
    int active = cube_dry_run_active(conf.client);
    cube_error *e = p_axpy(x, y, 1);
    CONF_OK(cube_dry_run_end(conf.client));
    int ended = cube_dry_run_active(conf.client);
    p_dry_run_reset();
    CONF_OK(e);
    assert_false(after_ends);
    assert_true(active);
    assert_false(ended);
    p_expect_floats(y, 1, 1);
    conf_release(x);
    conf_release(y);
}

static void *p_dry_begin_main(void *arg)
{
    cube_error **out = arg;
    /* Opened and left open on this thread: ends with nothing here. */
    *out = cube_dry_run_begin(conf.client);
    return NULL;
}

typedef struct p_dry_launcher {
    cube_handle x, y;
    int active;
    cube_error *err;
} p_dry_launcher;

static void *p_dry_launch_main(void *arg)
{
    p_dry_launcher *l = arg;
    l->active = cube_dry_run_active(conf.client);
    l->err = p_axpy(l->x, l->y, 1);
    return NULL;
}

CONF_TEST_NEEDS(dry_run_scope_covers_only_the_thread_and_client_that_opened_it,
                CUBE_FEATURE_KERNELS)
{
    cube_handle x = p_floats(1, 1), y = p_floats(0, 0);
    p_dry_run_reset();
    CONF_OK(p_axpy(x, y, 0)); /* compiled before the threads */
    pthread_t t;
    /* Opened on another thread: not in force on this one. */
    cube_error *begun = NULL;
    assert_int_equal(pthread_create(&t, NULL, p_dry_begin_main, &begun), 0);
    assert_int_equal(pthread_join(t, NULL), 0);
    CONF_OK(begun);
    assert_false(cube_dry_run_active(conf.client));
    CONF_OK(p_axpy(x, y, 1));
    p_expect_floats(y, 1, 1);
    /* Opened here: in force here, not on another thread's launch. */
    CONF_OK(cube_dry_run_begin(conf.client));
    int active = cube_dry_run_active(conf.client);
    cube_error *e1 = p_axpy(x, y, 1);
    p_dry_launcher l;
    memset(&l, 0, sizeof l);
    l.x = x;
    l.y = y;
    assert_int_equal(pthread_create(&t, NULL, p_dry_launch_main, &l), 0);
    assert_int_equal(pthread_join(t, NULL), 0);
    /* Nor on another client of the same thread. */
    cube_client *other = NULL;
    CONF_OK(cube_client_open(conf.backend, NULL, &other));
    int other_active = cube_dry_run_active(other);
    cube_client_close(other);
    CONF_OK(cube_dry_run_end(conf.client));
    int after = cube_dry_run_active(conf.client);
    CONF_OK(e1);
    CONF_OK(l.err);
    assert_true(active);
    assert_false(l.active);
    assert_false(other_active);
    assert_false(after);
    /* This thread's launch was dropped, the other thread's ran. */
    p_expect_floats(y, 2, 2);
    conf_release(x);
    conf_release(y);
}
