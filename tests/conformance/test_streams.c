/* Streams: the ordering contract across streams, written so that it proves
 * something on a backend whose streams run asynchronously (CUDA: a queue
 * per stream, calls return before the work ends) and passes trivially where
 * every call completes its work before returning (the CPU).
 *
 * The contract (docs/threading.md, cubert/client.h): a buffer written on
 * stream A and then used on stream B waits for A's last write of it; a
 * write on A issued after a read or launch on B (the program ordered them
 * on the host) does not reach what B reads, as the producer and consumer
 * of test_stress.c already expect; a dynamic cube count is read in stream
 * order; a buffer released while another stream still uses it is reused
 * only after that use; a failure recorded on one stream is reported on
 * every other; a device fault breaks every later call on its client until
 * the client is reopened.
 *
 * To make a missing wait visible, the work is large and slow on a device
 * (a million elements, kernels that loop thousands of times per element)
 * and every result depends on all the work before it: `rewrite` maps each
 * element through x = 3x + 1 in place, so a read that misses one rewrite
 * sees a different value, and `spin` reads its input again at its very end.
 * On the CPU the same tests run small.
 */
#include <pthread.h>
#include <spawn.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "conformance.h"

#define EXEC CUBE_LAUNCH_EXECUTE

/* Explicit stream ids of this file: below 2^63, so never a thread's own,
 * and distinct per test (t) and per stream (k). */
#define S_STREAM(t, k)                                                         \
    (0x57E5000000000000ull | ((uint64_t)(t) << 16) | (uint64_t)(k))

/* Launches of `rewrite` per step of a test. */
enum { S_LAUNCHES = 6 };

/* --- sizes --- */

/* Whether big problems only cost time here (backends.c): where the work
 * is done before a call returns, size proves nothing. */
static int s_small(void)
{
    return conf_backend_note("small_problems") != NULL;
}

/* Elements per buffer. */
static uint32_t s_n(void)
{
    return s_small() ? (1u << 16) : (1u << 20);
}

/* Iterations of the kernels' inner loop: a few milliseconds per launch on
 * a GPU, so that the streams overlap for real. */
static uint32_t s_iters(void)
{
    return s_small() ? 8u : 4096u;
}

/* --- helpers --- */

static void s_use(cube_stream_id stream)
{
    CONF_OK(cube_stream_use(conf.client, stream));
}

/* The launches, on the calling thread's current stream of conf.client. */
static cube_error *s_rewrite(cube_handle x, uint32_t n, uint32_t iters)
{
    cube_arg args[2] = {cube_arg_buffer(x), cube_arg_u32(iters)};
    return conf_launch(conf.k.rewrite,
                       cube_count_static(conf_div_up(n, 256), 1, 1), args, 2,
                       EXEC);
}

static cube_error *s_spin(cube_handle x, cube_handle y, uint32_t n,
                          uint32_t iters)
{
    cube_arg args[3] = {cube_arg_buffer(x), cube_arg_buffer(y),
                        cube_arg_u32(iters)};
    return conf_launch(conf.k.spin,
                       cube_count_static(conf_div_up(n, 256), 1, 1), args, 3,
                       EXEC);
}

/* S_LAUNCHES rewrites of x in a row. */
static cube_error *s_rewrites(cube_handle x, uint32_t n, uint32_t iters)
{
    for (int l = 0; l < S_LAUNCHES; l++) {
        cube_error *err = s_rewrite(x, n, iters);
        if (err)
            return err;
    }
    return NULL;
}

/* Fails at the first element where got and want differ, saying how many
 * differ in all. */
static void s_expect_at(const uint32_t *got, const uint32_t *want, uint32_t n,
                        const char *what, int round, const char *file, int line)
{
    uint32_t first = n, bad = 0;
    for (uint32_t i = 0; i < n; i++)
        if (got[i] != want[i]) {
            if (first == n)
                first = i;
            bad++;
        }
    if (!bad)
        return;
    print_error("%s:%d: round %d: %s: element %u is 0x%08x, expected 0x%08x "
                "(%u of %u elements differ)\n",
                file, line, round, what, first, got[first], want[first], bad,
                n);
    _fail(file, line);
}
#define S_EXPECT(got, want, n, what, round)                                    \
    s_expect_at((got), (want), (n), (what), (round), __FILE__, __LINE__)

/* Fails unless err is CUBE_ERR_SEVERAL with a `cause` among its causes;
 * frees it. */
static void s_several_at(cube_error *err, cube_code cause, const char *expr,
                         const char *file, int line)
{
    conf_code_at(err, CUBE_ERR_SEVERAL, expr, file, line);
    int ok =
        cube_error_cause_count(err) >= 1 && conf_error_has_code(err, cause);
    if (!ok) {
        char *text = cube_error_format(err);
        print_error("%s:%d: %s: expected [%s] with a [%s] cause, got:\n%s",
                    file, line, expr, cube_code_name(CUBE_ERR_SEVERAL),
                    cube_code_name(cause), text ? text : "?\n");
        free(text);
    }
    cube_error_free(err);
    if (!ok)
        _fail(file, line);
}
#define S_SEVERAL(expr, cause)                                                 \
    s_several_at((expr), (cause), #expr, __FILE__, __LINE__)

/* ========================================================================
 * Producer and consumer on two streams, one thread
 * ======================================================================== */

CONF_TEST_NEEDS(streams_consumer_waits_for_the_last_in_place_rewrite_on_another,
                CUBE_FEATURE_KERNELS)
{
    const cube_stream_id sa = S_STREAM(1, 1), sb = S_STREAM(1, 2);
    const uint32_t n = s_n(), iters = s_iters();
    const uint64_t bytes = n * 4ull;
    uint32_t *x0 = conf_host_u32(n), *zero = conf_host_u32(n),
             *xs = conf_host_u32(n);
    uint32_t *got_x = conf_host_u32(n), *got_y = conf_host_u32(n),
             *want = conf_host_u32(n);
    conf_pattern(x0, bytes, 0xA1);
    memset(zero, 0, bytes);

    /* Both buffers are made (and written) on B before anything happens on
     * A: were work ordered by allocation, or by the stream that made a
     * buffer, B would not wait for A below. */
    s_use(sb);
    cube_handle x = conf_create(zero, bytes);
    cube_handle y = conf_create(zero, bytes);
    /* A overwrites x completely, then rewrites it in place, again and
     * again, with no barrier anywhere. */
    s_use(sa);
    CONF_WRITE_OK(x, x0, bytes);
    for (int round = 1; round <= 3; round++) {
        s_use(sa);
        CONF_OK(s_rewrites(x, n, iters));
        /* B computes from x at once: the launch (or the read) must wait
         * for A's last rewrite. */
        s_use(sb);
        if (round == 2) {
            CONF_READ_OK(x, got_x, bytes);
            CONF_OK(s_spin(x, y, n, iters));
            CONF_READ_OK(y, got_y, bytes);
        } else {
            CONF_OK(s_spin(x, y, n, iters));
            CONF_READ_OK(y, got_y, bytes);
            CONF_READ_OK(x, got_x, bytes);
        }
        s_use(0);
        conf_rewritten(x0, xs, n, (uint64_t)round * S_LAUNCHES * iters);
        S_EXPECT(got_x, xs, n, "x read on B after A's rewrites", round);
        conf_spin_model(xs, want, n, iters);
        S_EXPECT(got_y, want, n, "y computed on B from x", round);
    }
    conf_release(x);
    conf_release(y);
    free(x0);
    free(zero);
    free(xs);
    free(got_x);
    free(got_y);
    free(want);
}

CONF_TEST_NEEDS(
    streams_rewrite_waits_for_reads_issued_earlier_on_another_stream,
    CUBE_FEATURE_KERNELS)
{
    const cube_stream_id sa = S_STREAM(2, 1), sb = S_STREAM(2, 2);
    const uint32_t n = s_n(), iters = s_iters();
    const uint64_t bytes = n * 4ull;
    uint32_t *x0 = conf_host_u32(n), *x1 = conf_host_u32(n),
             *x2 = conf_host_u32(n);
    uint32_t *got_y = conf_host_u32(n), *got_async = conf_host_u32(n),
             *got_x = conf_host_u32(n);
    uint32_t *want = conf_host_u32(n);
    conf_pattern(x0, bytes, 0xA2);
    memset(got_async, 0, bytes);

    s_use(sa);
    cube_handle x = conf_create(x0, bytes);
    CONF_OK(s_rewrites(x, n, iters));
    /* B reads x twice, by a long launch that reads x again at its end and
     * by an asynchronous read queued behind it, both issued before A
     * rewrites x again... */
    s_use(sb);
    cube_handle y = conf_empty(bytes);
    CONF_OK(s_spin(x, y, n, 4 * iters));
    cube_copy_desc d = cube_copy_desc_contiguous(x, bytes, 4);
    void *dst[1] = {got_async};
    uint64_t sz[1] = {bytes};
    cube_future *f = NULL;
    CONF_OK(cube_read_async(conf.client, &d, dst, sz, 1, &f));
    /* ...so the rewrites on A, short ones that write at once, must not
     * reach what B read. */
    s_use(sa);
    CONF_OK(s_rewrites(x, n, 1));
    s_use(sb);
    cube_error *waited = cube_future_wait(f);
    cube_future_free(f);
    CONF_OK(waited);
    CONF_READ_OK(y, got_y, bytes);
    CONF_READ_OK(x, got_x, bytes);
    s_use(0);

    conf_rewritten(x0, x1, n, (uint64_t)S_LAUNCHES * iters);
    conf_rewritten(x0, x2, n, (uint64_t)S_LAUNCHES * (iters + 1));
    conf_spin_model(x1, want, n, 4 * iters);
    S_EXPECT(got_y, want, n, "y launched on B before A's second rewrites", 1);
    S_EXPECT(got_async, x1, n, "x read on B before A's second rewrites", 1);
    S_EXPECT(got_x, x2, n, "x read on B after A's second rewrites", 1);
    conf_release(x);
    conf_release(y);
    free(x0);
    free(x1);
    free(x2);
    free(got_y);
    free(got_async);
    free(got_x);
    free(want);
}

/* ========================================================================
 * Producer and consumer on two threads, each on its own stream
 * ======================================================================== */

enum { PC_LAUNCHES = 2 };

typedef struct s_party {
    int rounds; /* rounds completed */
    int failures;
    char first[1024];
} s_party;

typedef struct s_pc {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    /* Guarded by mu. */
    int ready;     /* the consumer made x and y */
    int published; /* the last round the producer finished issuing */
    int consumed;  /* the last round the consumer checked */
    int stop;      /* someone failed: everybody leaves */
    cube_handle x, y;
    /* Fixed before the threads start. */
    uint32_t n, iters;
    int rounds;
    const uint32_t *x0;
    s_party prod, cons;
} s_pc;

/* Records the first failure of a party (cmocka's asserts stay on the main
 * thread) and tells the other party to stop. Frees err. */
static void s_pc_fail(s_pc *s, s_party *p, int round, const char *what,
                      cube_error *err)
{
    if (p->failures++ == 0) {
        char *text = err ? cube_error_format(err) : NULL;
        snprintf(p->first, sizeof p->first, "round %d: %s%s%s", round, what,
                 text ? ": " : "", text ? text : "");
        free(text);
    }
    cube_error_free(err);
    pthread_mutex_lock(&s->mu);
    s->stop = 1;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

static int s_pc_ok(s_pc *s, s_party *p, int round, const char *what,
                   cube_error *err)
{
    if (!err)
        return 1;
    s_pc_fail(s, p, round, what, err);
    return 0;
}

/* Compares n elements; on a difference records it and returns 0. */
static int s_pc_same(s_pc *s, int round, const uint32_t *got,
                     const uint32_t *want, const char *what)
{
    for (uint32_t i = 0; i < s->n; i++)
        if (got[i] != want[i]) {
            char msg[256];
            snprintf(msg, sizeof msg,
                     "%s: element %u is 0x%08x, expected 0x%08x", what, i,
                     got[i], want[i]);
            s_pc_fail(s, &s->cons, round, msg, NULL);
            return 0;
        }
    return 1;
}

/* The producer rewrites x in place on its own stream, one round at a
 * time, and never starts a round before the consumer has checked the
 * previous one. */
static void *s_producer(void *arg)
{
    s_pc *s = arg;
    pthread_mutex_lock(&s->mu);
    while (!s->ready && !s->stop)
        pthread_cond_wait(&s->cv, &s->mu);
    cube_handle x = s->x;
    int stop = s->stop;
    pthread_mutex_unlock(&s->mu);
    for (int r = 1; r <= s->rounds && !stop; r++) {
        for (int l = 0; l < PC_LAUNCHES; l++)
            if (!s_pc_ok(s, &s->prod, r, "rewrite",
                         s_rewrite(x, s->n, s->iters)))
                return NULL;
        pthread_mutex_lock(&s->mu);
        s->published = r;
        pthread_cond_broadcast(&s->cv);
        while (s->consumed < r && !s->stop)
            pthread_cond_wait(&s->cv, &s->mu);
        stop = s->stop;
        pthread_mutex_unlock(&s->mu);
        if (!stop)
            s->prod.rounds = r;
    }
    return NULL;
}

/* The consumer makes x (on its own stream, so the producer's first
 * rewrite must wait for that write), then after each published round
 * computes from x on its own stream and checks the result against that
 * round. */
static void *s_consumer(void *arg)
{
    s_pc *s = arg;
    cube_client *c = conf.client;
    const uint32_t n = s->n;
    const uint64_t bytes = n * 4ull;
    uint32_t *xs = malloc(bytes), *want = malloc(bytes);
    uint32_t *got_x = malloc(bytes), *got_y = malloc(bytes);
    cube_handle x = {0}, y = {0};
    if (!xs || !want || !got_x || !got_y) {
        s_pc_fail(s, &s->cons, 0, "out of host memory", NULL);
        goto done;
    }
    if (!s_pc_ok(s, &s->cons, 0, "cube_create of x",
                 cube_create(c, s->x0, bytes, &x)) ||
        !s_pc_ok(s, &s->cons, 0, "cube_empty of y", cube_empty(c, bytes, &y)))
        goto done;
    pthread_mutex_lock(&s->mu);
    s->x = x;
    s->y = y;
    s->ready = 1;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    for (int r = 1; r <= s->rounds; r++) {
        pthread_mutex_lock(&s->mu);
        while (s->published < r && !s->stop)
            pthread_cond_wait(&s->cv, &s->mu);
        int stop = s->stop;
        pthread_mutex_unlock(&s->mu);
        if (stop)
            break;
        if (!s_pc_ok(s, &s->cons, r, "spin", s_spin(x, y, n, s->iters)) ||
            !s_pc_ok(s, &s->cons, r, "read of y", conf_read(y, got_y, bytes)))
            break;
        conf_rewritten(s->x0, xs, n,
                       (uint64_t)r * PC_LAUNCHES * (uint64_t)s->iters);
        conf_spin_model(xs, want, n, s->iters);
        if (!s_pc_same(s, r, got_y, want, "y computed from x"))
            break;
        /* Every other round, a plain read of x too. */
        if (r % 2 && !(s_pc_ok(s, &s->cons, r, "read of x",
                               conf_read(x, got_x, bytes)) &&
                       s_pc_same(s, r, got_x, xs, "x")))
            break;
        s->cons.rounds = r;
        pthread_mutex_lock(&s->mu);
        s->consumed = r;
        pthread_cond_broadcast(&s->cv);
        pthread_mutex_unlock(&s->mu);
    }
done:
    /* Were x and y not both made, the producer must not wait for them. */
    if (!s->ready) {
        pthread_mutex_lock(&s->mu);
        s->stop = 1;
        s->x = x;
        s->y = y;
        pthread_cond_broadcast(&s->cv);
        pthread_mutex_unlock(&s->mu);
    }
    free(xs);
    free(want);
    free(got_x);
    free(got_y);
    return NULL;
}

CONF_TEST_NEEDS(streams_two_threads_hand_off_in_place_rewrites_round_by_round,
                CUBE_FEATURE_KERNELS)
{
    /* Compile first: the threads measure ordering, not the compiler. */
    cube_handle warm = conf_empty(1024);
    cube_arg wa[3] = {cube_arg_buffer(warm), cube_arg_buffer(warm),
                      cube_arg_u32(1)};
    cube_count one = cube_count_static(1, 1, 1);
    CONF_OK(conf_launch(conf.k.rewrite, one, wa + 1, 2, CUBE_LAUNCH_SKIP));
    CONF_OK(conf_launch(conf.k.spin, one, wa, 3, CUBE_LAUNCH_SKIP));
    conf_release(warm);

    s_pc s;
    memset(&s, 0, sizeof s);
    assert_int_equal(pthread_mutex_init(&s.mu, NULL), 0);
    assert_int_equal(pthread_cond_init(&s.cv, NULL), 0);
    s.n = s_n();
    s.iters = s_iters();
    s.rounds = s_small() ? 8 : 12;
    uint32_t *x0 = conf_host_u32(s.n);
    conf_pattern(x0, s.n * 4ull, 0xA3);
    s.x0 = x0;
    pthread_t tp, tc;
    assert_int_equal(pthread_create(&tc, NULL, s_consumer, &s), 0);
    assert_int_equal(pthread_create(&tp, NULL, s_producer, &s), 0);
    assert_int_equal(pthread_join(tp, NULL), 0);
    assert_int_equal(pthread_join(tc, NULL), 0);
    pthread_cond_destroy(&s.cv);
    pthread_mutex_destroy(&s.mu);
    free(x0);
    if (s.x.bits)
        conf_release(s.x);
    if (s.y.bits)
        conf_release(s.y);
    if (s.prod.failures)
        print_error("producer: %s\n", s.prod.first);
    if (s.cons.failures)
        print_error("consumer: %s\n", s.cons.first);
    if (s.prod.failures || s.cons.failures)
        fail_msg("the producer or the consumer failed");
    assert_int_equal(s.prod.rounds, s.rounds);
    assert_int_equal(s.cons.rounds, s.rounds);
}

/* ========================================================================
 * A buffer released while another stream still reads it
 * ======================================================================== */

CONF_TEST_NEEDS(
    streams_buffer_released_while_another_stream_reads_it_waits_for_it,
    CUBE_FEATURE_KERNELS)
{
    enum { GARBAGE = 8 };
    const cube_stream_id sa = S_STREAM(4, 1), sb = S_STREAM(4, 2);
    const uint32_t n = s_n(), iters = 4 * s_iters();
    const uint64_t bytes = n * 4ull;
    uint32_t *x0 = conf_host_u32(n), *junk = conf_host_u32(n),
             *got = conf_host_u32(n);
    uint32_t *want = conf_host_u32(n);
    /* Released on the stream that made it, then from a third stream: the
     * memory goes back to A's pools either way. */
    for (int phase = 0; phase < 2; phase++) {
        conf_pattern(x0, bytes, 0xA4 + (uint32_t)phase);
        s_use(sa);
        cube_handle x = conf_create(x0, bytes);
        s_use(sb);
        cube_handle y = conf_empty(bytes);
        /* A long launch on B that reads x until its very end... */
        CONF_OK(s_spin(x, y, n, iters));
        /* ...while x's last handle goes at once... */
        s_use(phase == 0 ? sa : 0);
        conf_release(x);
        /* ...and A, whose pools x came from, asks for buffers of the same
         * size and fills them with garbage, by copies and by a kernel. */
        s_use(sa);
        cube_handle g[GARBAGE];
        for (int k = 0; k < GARBAGE; k++) {
            g[k] = conf_empty(bytes);
            memset(junk, 0xF0 + k, bytes);
            CONF_WRITE_OK(g[k], junk, bytes);
            CONF_OK(s_rewrite(g[k], n, 1));
        }
        s_use(sb);
        CONF_READ_OK(y, got, bytes);
        s_use(0);
        conf_spin_model(x0, want, n, iters);
        S_EXPECT(got, want, n, "y computed on B from x released on A", phase);
        for (int k = 0; k < GARBAGE; k++)
            conf_release(g[k]);
        conf_release(y);
    }
    free(x0);
    free(junk);
    free(got);
    free(want);
}

/* ========================================================================
 * A dynamic cube count written on another stream
 * ======================================================================== */

CONF_TEST_NEEDS(streams_dynamic_count_written_on_another_stream_is_waited_for,
                CUBE_FEATURE_KERNELS)
{
    enum { DIM = 32, MAXC = 8, COUNT = DIM * MAXC };
    const cube_stream_id sa = S_STREAM(5, 1), sb = S_STREAM(5, 2);
    const uint32_t n = s_n(), iters = s_iters();
    static const uint32_t counts[] = {3, 8, 0, 5, 1, 7};
    enum { ROUNDS = sizeof counts / sizeof counts[0] };
    uint32_t fill[COUNT], got[ROUNDS][COUNT];
    for (uint32_t i = 0; i < COUNT; i++)
        fill[i] = 0xEEEEEEEEu;
    uint32_t *scratch0 = conf_host_u32(n);
    conf_pattern(scratch0, n * 4ull, 0xA5);

    /* The count buffer starts at the largest count, made on B. */
    s_use(sb);
    const uint32_t start[3] = {MAXC, 1, 1};
    cube_handle cnt = conf_create(start, sizeof start);
    cube_handle y = conf_create(fill, sizeof fill);
    s_use(sa);
    cube_handle scratch = conf_create(scratch0, n * 4ull);
    for (int r = 0; r < ROUNDS; r++) {
        s_use(sb);
        CONF_WRITE_OK(y, fill, sizeof fill);
        /* A is busy for a while before it writes the count... */
        s_use(sa);
        CONF_OK(s_rewrites(scratch, n, iters));
        cube_arg wc[2] = {cube_arg_buffer(cnt), cube_arg_u32(counts[r])};
        CONF_OK(conf_launch(conf.k.write_count, cube_count_static(1, 1, 1), wc,
                            2, EXEC));
        /* ...and B launches with that count at once. */
        s_use(sb);
        cube_arg pa = cube_arg_buffer(y);
        CONF_OK(conf_launch(conf.k.count_probe, cube_count_dynamic(cnt), &pa, 1,
                            EXEC));
        CONF_READ_OK(y, got[r], sizeof got[r]);
    }
    s_use(0);
    for (int r = 0; r < ROUNDS; r++) {
        uint32_t c = counts[r];
        for (uint32_t i = 0; i < COUNT; i++) {
            uint32_t want = i < c * DIM ? c * 1000u + i / DIM : 0xEEEEEEEEu;
            if (got[r][i] != want)
                fail_msg("round %d, count %u: y[%u] = 0x%x, expected 0x%x", r,
                         c, i, got[r][i], want);
        }
    }
    conf_release(cnt);
    conf_release(y);
    conf_release(scratch);
    free(scratch0);
}

/* ========================================================================
 * Failures across streams
 * ======================================================================== */

CONF_TEST_NEEDS(
    streams_failure_on_one_stream_is_reported_on_others_until_rewritten,
    CUBE_FEATURE_KERNELS)
{
    enum { FN = 1000 };
    const cube_stream_id sa = S_STREAM(6, 1), sb = S_STREAM(6, 2);
    const cube_stream_id sc = S_STREAM(6, 3);
    const uint32_t n = s_n(), iters = s_iters();
    float xv[FN], yv[FN], yw[FN], got[FN];
    for (uint32_t i = 0; i < FN; i++) {
        xv[i] = (float)i;
        yv[i] = 1.0f;
        yw[i] = (float)(2 * i + 5);
    }
    uint32_t *busy0 = conf_host_u32(n);
    conf_pattern(busy0, n * 4ull, 0xA6);
    cube_count cnt = cube_count_static(conf_div_up(FN, 64), 1, 1);

    /* A: busy work, then a launch that fails and marks x. */
    s_use(sa);
    cube_handle busy = conf_create(busy0, n * 4ull);
    cube_handle x = conf_create(xv, sizeof xv);
    CONF_OK(s_rewrites(busy, n, iters));
    conf_mark_failed(x);
    /* B: a launch reading x fails with x's failure as its cause, and marks
     * its output. */
    s_use(sb);
    cube_handle y = conf_create(yv, sizeof yv);
    cube_arg sx[3] = {cube_arg_buffer(x), cube_arg_buffer(y),
                      cube_arg_f32(2.0f)};
    S_SEVERAL(conf_launch(conf.k.scale, cnt, sx, 3, EXEC),
              CUBE_ERR_RESOURCE_LIMIT);
    /* C: a read (leaving its destination alone), a check and a sync of y
     * report it; the plain barrier does not. */
    s_use(sc);
    CONF_EXPECT_REFUSED(y, sizeof yv, CUBE_ERR_RESOURCE_LIMIT);
    S_SEVERAL(cube_check(conf.client, &y, 1), CUBE_ERR_RESOURCE_LIMIT);
    S_SEVERAL(cube_sync(conf.client, &y, 1), CUBE_ERR_RESOURCE_LIMIT);
    S_SEVERAL(cube_check(conf.client, &x, 1), CUBE_ERR_RESOURCE_LIMIT);
    CONF_OK(cube_sync(conf.client, NULL, 0));
    /* A launch on C from y carries the failure on to z. */
    cube_handle z = conf_create(yv, sizeof yv);
    cube_arg sy[3] = {cube_arg_buffer(y), cube_arg_buffer(z),
                      cube_arg_f32(3.0f)};
    S_SEVERAL(conf_launch(conf.k.scale, cnt, sy, 3, EXEC),
              CUBE_ERR_RESOURCE_LIMIT);
    S_SEVERAL(cube_sync(conf.client, &z, 1), CUBE_ERR_RESOURCE_LIMIT);
    /* A full write of y on C clears y, and only y. */
    CONF_WRITE_OK(y, yw, sizeof yw);
    CONF_OK(cube_check(conf.client, &y, 1));
    CONF_OK(cube_sync(conf.client, &y, 1));
    memset(got, 0, sizeof got);
    CONF_READ_OK(y, got, sizeof got);
    assert_memory_equal(got, yw, sizeof yw);
    S_SEVERAL(cube_check(conf.client, &z, 1), CUBE_ERR_RESOURCE_LIMIT);
    S_SEVERAL(cube_check(conf.client, &x, 1), CUBE_ERR_RESOURCE_LIMIT);
    /* B: the launch from the rewritten y now lands and clears z; A: a
     * full write clears x. */
    s_use(sb);
    CONF_OK(conf_launch(conf.k.scale, cnt, sy, 3, EXEC));
    s_use(sa);
    CONF_WRITE_OK(x, xv, sizeof xv);
    s_use(sc);
    CONF_OK(cube_sync(conf.client, &z, 1));
    CONF_OK(cube_check(conf.client, &x, 1));
    memset(got, 0, sizeof got);
    CONF_READ_OK(z, got, sizeof got);
    s_use(0);
    for (uint32_t i = 0; i < FN; i++)
        if (got[i] != 3.0f * yw[i])
            fail_msg("z[%u] = %g, expected %g", i, (double)got[i],
                     (double)(3.0f * yw[i]));
    conf_release(busy);
    conf_release(x);
    conf_release(y);
    conf_release(z);
    free(busy0);
}

/* ========================================================================
 * Copies, failures and releases across streams, with no kernel
 * ======================================================================== */

/* What streams owe a caller on any backend, one that runs no kernels
 * included: a write on one stream is what a read on another sees, with no
 * barrier on the writer's stream; a failure recorded on one stream is
 * refused by reads, checks and syncs on the others until a full write on
 * yet another clears it; a buffer may be released on a stream other
 * than the one that made it. */
CONF_TEST(streams_copies_failures_and_releases_cross_streams)
{
    enum { N = 1u << 14 };
    const cube_stream_id sa = S_STREAM(9, 1), sb = S_STREAM(9, 2);
    const cube_stream_id sc = S_STREAM(9, 3);
    unsigned char *v = malloc(N), *w = malloc(N), *got = malloc(N);
    assert_non_null(v);
    assert_non_null(w);
    assert_non_null(got);
    conf_pattern(v, N, 0xB1);
    conf_pattern(w, N, 0xB2);

    /* A makes and writes; B reads. */
    s_use(sa);
    cube_handle x = conf_create(v, N);
    cube_handle y = conf_empty(N);
    CONF_WRITE_OK(y, w, N);
    s_use(sb);
    CONF_READ_OK(x, got, N);
    assert_memory_equal(got, v, N);
    CONF_READ_OK(y, got, N);
    assert_memory_equal(got, w, N);
    /* B rewrites the lower half of x through a slice; A reads it all. */
    cube_handle lo = conf_slice(x, 0, N / 2);
    CONF_WRITE_OK(lo, w, N / 2);
    s_use(sa);
    CONF_READ_OK(x, got, N);
    assert_memory_equal(got, w, N / 2);
    assert_memory_equal(got + N / 2, v + N / 2, N / 2);

    /* A: a launch that should have written y fails; B and C see it. */
    conf_mark_failed(y);
    s_use(sb);
    CONF_EXPECT_REFUSED(y, N, conf_mark_code());
    S_SEVERAL(cube_check(conf.client, &y, 1), conf_mark_code());
    s_use(sc);
    S_SEVERAL(cube_sync(conf.client, &y, 1), conf_mark_code());
    CONF_OK(cube_sync(conf.client, NULL, 0));
    CONF_OK(cube_check(conf.client, &x, 1));
    /* C: a full write clears it for every stream. */
    CONF_WRITE_OK(y, v, N);
    s_use(sa);
    CONF_OK(cube_check(conf.client, &y, 1));
    CONF_READ_OK(y, got, N);
    assert_memory_equal(got, v, N);

    /* Released on streams other than the one that made them. */
    s_use(sb);
    conf_release(lo);
    conf_release(x);
    s_use(sc);
    conf_release(y);
    s_use(0);
    free(v);
    free(w);
    free(got);
}

/* ========================================================================
 * Stream ids
 * ======================================================================== */

typedef struct s_other {
    cube_stream_id id;
    cube_error *err;
} s_other;

/* One allocation on a new thread's own stream. */
static void *s_other_main(void *arg)
{
    s_other *o = arg;
    cube_handle h = {0};
    o->id = cube_stream_current(conf.client);
    o->err = cube_empty(conf.client, 64, &h);
    if (!o->err)
        o->err = cube_handle_release(conf.client, h);
    return NULL;
}

static size_t s_count_of(const cube_stream_id *ids, size_t n, cube_stream_id id)
{
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        k += ids[i] == id;
    return k;
}

/* Every initialized stream; caller frees. Asserts no id appears twice. */
static cube_stream_id *s_ids(size_t *n)
{
    size_t count = 0;
    CONF_OK(cube_stream_ids(conf.client, NULL, 0, &count));
    assert_true(count >= 1);
    cube_stream_id *ids = calloc(count + 8, sizeof *ids);
    assert_non_null(ids);
    size_t again = 0;
    CONF_OK(cube_stream_ids(conf.client, ids, count + 8, &again));
    assert_true(again >= count);
    assert_true(again <= count + 8);
    for (size_t i = 0; i < again; i++) {
        assert_true(ids[i] != 0);
        if (s_count_of(ids, again, ids[i]) != 1)
            fail_msg("stream 0x%llx is listed %zu times",
                     (unsigned long long)ids[i],
                     s_count_of(ids, again, ids[i]));
    }
    *n = again;
    return ids;
}

CONF_TEST_NEEDS(
    streams_ids_list_each_stream_once_explicit_ids_are_separate_queues,
    CUBE_FEATURE_KERNELS)
{
    const cube_stream_id s1 = S_STREAM(7, 1), s2 = S_STREAM(7, 2);
    const uint32_t n = s_n(), iters = s_iters();
    const uint64_t bytes = n * 4ull;
    const cube_stream_id own = cube_stream_current(conf.client);
    assert_true(own != 0 && own != s1 && own != s2);
    uint32_t *a0 = conf_host_u32(n), *b0 = conf_host_u32(n),
             *got_a = conf_host_u32(n);
    uint32_t *got_b = conf_host_u32(n), *want = conf_host_u32(n);
    conf_pattern(a0, bytes, 0xA7);
    conf_pattern(b0, bytes, 0xA8);

    /* Work on the own stream and on two explicit ones. */
    cube_handle h = conf_empty(64);
    s_use(s1);
    cube_handle a = conf_create(a0, bytes);
    CONF_OK(s_rewrites(a, n, iters));
    s_use(s2);
    cube_handle b = conf_create(b0, bytes);
    CONF_OK(s_rewrites(b, n, iters));
    /* Each reads what the other queue wrote, with no barrier on the
     * writer's stream. */
    CONF_READ_OK(a, got_a, bytes);
    s_use(s1);
    CONF_READ_OK(b, got_b, bytes);
    s_use(0);
    conf_rewritten(a0, want, n, (uint64_t)S_LAUNCHES * iters);
    S_EXPECT(got_a, want, n, "a, written on s1, read on s2", 1);
    conf_rewritten(b0, want, n, (uint64_t)S_LAUNCHES * iters);
    S_EXPECT(got_b, want, n, "b, written on s2, read on s1", 1);

    /* A thread's own stream is listed too. */
    s_other o = {0, NULL};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, s_other_main, &o), 0);
    assert_int_equal(pthread_join(t, NULL), 0);
    CONF_OK(o.err);
    assert_true(o.id != 0 && o.id != own && o.id != s1 && o.id != s2);

    size_t count = 0;
    cube_stream_id *ids = s_ids(&count);
    assert_int_equal(s_count_of(ids, count, own), 1);
    assert_int_equal(s_count_of(ids, count, s1), 1);
    assert_int_equal(s_count_of(ids, count, s2), 1);
    assert_int_equal(s_count_of(ids, count, o.id), 1);
    free(ids);
    /* Using a stream again adds nothing. */
    s_use(s1);
    CONF_OK(cube_sync(conf.client, NULL, 0));
    s_use(s2);
    CONF_OK(cube_flush(conf.client));
    s_use(0);
    size_t again = 0;
    ids = s_ids(&again);
    assert_int_equal(again, count);
    free(ids);

    conf_release(h);
    conf_release(a);
    conf_release(b);
    free(a0);
    free(b0);
    free(got_a);
    free(got_b);
    free(want);
}

/* ========================================================================
 * A device fault, and a new client after it
 * ======================================================================== */

enum { DF_N = 1000 };

static cube_error *s_scale_add_on(cube_client *c, cube_handle x, cube_handle y)
{
    cube_arg args[3] = {cube_arg_buffer(x), cube_arg_buffer(y),
                        cube_arg_f32(2.0f)};
    return cube_launch(c, conf.k.scale_add,
                       cube_count_static(conf_div_up(DF_N, 64), 1, 1), args, 3,
                       EXEC);
}

static cube_error *s_read_on(cube_client *c, cube_handle h, void *dst,
                             uint64_t size)
{
    cube_copy_desc d = cube_copy_desc_contiguous(h, size, 4);
    void *dsts[1] = {dst};
    uint64_t sz[1] = {size};
    return cube_read(c, &d, dsts, sz, 1);
}

static cube_error *s_write_on(cube_client *c, cube_handle h, const void *src,
                              uint64_t size)
{
    cube_copy_desc d = cube_copy_desc_contiguous(h, size, 4);
    const void *srcs[1] = {src};
    uint64_t sz[1] = {size};
    return cube_write(c, &d, srcs, sz, 1);
}

/* A thread of its own, on its own stream, asks the broken client for a
 * buffer and for a barrier. */
typedef struct s_faulted {
    cube_client *client;
    cube_code empty, sync;
} s_faulted;

static void *s_faulted_main(void *arg)
{
    s_faulted *f = arg;
    cube_handle h = {0};
    cube_error *err = cube_empty(f->client, 256, &h);
    f->empty = cube_error_code(err);
    cube_error_free(err);
    err = cube_sync(f->client, NULL, 0);
    f->sync = cube_error_code(err);
    cube_error_free(err);
    return NULL;
}

/* Releasing on a broken client: freed, or refused with the fault. */
static void s_release_on_faulted(cube_client *c, cube_handle h)
{
    cube_error *err = cube_handle_release(c, h);
    if (err)
        CONF_EXPECT(err, CUBE_ERR_DEVICE_FAULT);
}

/* The scenario itself, run in a process of its own (main.c's
 * --device-fault mode): on CUDA a sticky fault breaks every context of the
 * process, the suite's client included, so only a process whose one
 * client faults can show the reopen. */
void conf_device_fault_scenario(void **state)
{
    (void)state;
    float xv[DF_N], yv[DF_N], got[DF_N], want[DF_N];
    for (uint32_t i = 0; i < DF_N; i++) {
        xv[i] = (float)i;
        yv[i] = 1.0f;
        want[i] = 2.0f * xv[i] + yv[i];
    }
    /* A client of its own: the fault must not reach conf.client. */
    cube_client *c = NULL;
    CONF_OK(cube_client_open(conf.backend, NULL, &c));
    cube_handle x = {0}, y = {0}, t = {0};
    CONF_OK(cube_create(c, xv, sizeof xv, &x));
    CONF_OK(cube_create(c, yv, sizeof yv, &y));
    CONF_OK(cube_empty(c, 256 * 4, &t));
    /* It works before the fault. */
    CONF_OK(s_scale_add_on(c, x, y));
    CONF_OK(cube_sync(c, NULL, 0));
    /* The trap kernel compiles and validates (a Skip runs nothing)... */
    cube_arg ta = cube_arg_buffer(t);
    cube_count tc = cube_count_static(8, 1, 1);
    CONF_OK(cube_launch(c, conf.k.trap, tc, &ta, 1, CUBE_LAUNCH_SKIP));
    /* ...and breaks the device when it runs: the launch reports it, or,
     * where faults arrive asynchronously, the next barrier. */
    cube_error *err = cube_launch(c, conf.k.trap, tc, &ta, 1, EXEC);
    if (!err) {
        /* Before any call waited on it, the fault meets an allocation that
         * needs new device memory: that is the device fault too, never
         * "out of memory". */
        struct timespec pause = {0, 200 * 1000 * 1000};
        nanosleep(&pause, NULL);
        cube_handle big = {0};
        err = cube_empty(c, (uint64_t)256 << 20, &big);
        if (!err) {
            CONF_OK(cube_handle_release(c, big));
            err = cube_sync(c, NULL, 0);
        }
    }
    CONF_EXPECT(err, CUBE_ERR_DEVICE_FAULT);

    /* From now on every call that works on the device reports the fault,
     * again and again. */
    for (int k = 0; k < 2; k++) {
        CONF_EXPECT(s_scale_add_on(c, x, y), CUBE_ERR_DEVICE_FAULT);
        memset(got, 0xCD, sizeof got);
        CONF_EXPECT(s_read_on(c, y, got, sizeof got), CUBE_ERR_DEVICE_FAULT);
        for (uint32_t i = 0; i < DF_N; i++)
            if (memcmp(&got[i], &(uint32_t){0xCDCDCDCDu}, 4) != 0)
                fail_msg("a refused read wrote element %u", i);
        {
            cube_copy_desc d = cube_copy_desc_contiguous(y, sizeof got, 4);
            void *dsts[1] = {got};
            uint64_t sz[1] = {sizeof got};
            cube_future *f = NULL;
            err = cube_read_async(c, &d, dsts, sz, 1, &f);
            if (!err) {
                err = cube_future_wait(f);
                cube_future_free(f);
            }
            CONF_EXPECT(err, CUBE_ERR_DEVICE_FAULT);
        }
        CONF_EXPECT(s_write_on(c, y, yv, sizeof yv), CUBE_ERR_DEVICE_FAULT);
        cube_handle h = {0};
        CONF_EXPECT(cube_create(c, yv, sizeof yv, &h), CUBE_ERR_DEVICE_FAULT);
        CONF_EXPECT(cube_empty(c, 4096, &h), CUBE_ERR_DEVICE_FAULT);
        CONF_EXPECT(cube_sync(c, NULL, 0), CUBE_ERR_DEVICE_FAULT);
        CONF_EXPECT(cube_sync(c, &y, 1), CUBE_ERR_DEVICE_FAULT);
        CONF_EXPECT(cube_flush(c), CUBE_ERR_DEVICE_FAULT);
        CONF_EXPECT(cube_launch(c, conf.k.trap, tc, &ta, 1, EXEC),
                    CUBE_ERR_DEVICE_FAULT);
    }
    /* Also on another thread's stream. */
    s_faulted f = {c, CUBE_OK, CUBE_OK};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, s_faulted_main, &f), 0);
    assert_int_equal(pthread_join(th, NULL), 0);
    assert_int_equal(f.empty, CUBE_ERR_DEVICE_FAULT);
    assert_int_equal(f.sync, CUBE_ERR_DEVICE_FAULT);
    s_release_on_faulted(c, x);
    s_release_on_faulted(c, y);
    s_release_on_faulted(c, t);
    cube_client_close(c);

    /* A new client on the same device runs new work correctly. The CUDA
     * driver keeps a sticky fault until the process exits: there the
     * reopen must say so, and the recovery is shown by a new process (the
     * parent test runs one). */
    c = NULL;
    cube_error *reopen = cube_client_open(conf.backend, NULL, &c);
    if (reopen && conf_backend_note("device_fault_lasts_the_process") &&
        cube_error_code(reopen) == CUBE_ERR_DEVICE_FAULT &&
        strstr(cube_error_message(reopen), "new process")) {
        cube_error_free(reopen);
        return;
    }
    CONF_OK(reopen);
    CONF_OK(cube_create(c, xv, sizeof xv, &x));
    CONF_OK(cube_create(c, yv, sizeof yv, &y));
    CONF_OK(s_scale_add_on(c, x, y));
    CONF_OK(cube_sync(c, &y, 1));
    memset(got, 0, sizeof got);
    CONF_OK(s_read_on(c, y, got, sizeof got));
    assert_memory_equal(got, want, sizeof want);
    CONF_OK(cube_handle_release(c, x));
    CONF_OK(cube_handle_release(c, y));
    cube_client_close(c);
}

/* Runs the scenario above in a child process (this program again, in its
 * --device-fault mode) and then checks that this process's client, which
 * shared nothing with the child, still works. */
CONF_TEST_NEEDS(
    streams_device_fault_breaks_every_call_until_the_client_is_reopened,
    CUBE_FEATURE_KERNELS)
{
    char self[4096];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    assert_true(n > 0);
    self[n] = '\0';
    char *argv[] = {self, (char *)conf.backend, "--device-fault", NULL};
    pid_t pid = 0;
    assert_int_equal(
        posix_spawn(&pid, self, NULL, NULL, argv, conf_start_environ()), 0);
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        fail_msg("the device-fault scenario failed in its process (status "
                 "0x%x; its output is above)",
                 status);
    /* After the faulted process is gone, a new one runs new work on the
     * device: this process's client below, opened before the fault and
     * never touched by it, and a new client opened now. */
    cube_client *fresh = NULL;
    CONF_OK(cube_client_open(conf.backend, NULL, &fresh));
    cube_client_close(fresh);

    float xv[DF_N], yv[DF_N], got[DF_N], want[DF_N];
    for (uint32_t i = 0; i < DF_N; i++) {
        xv[i] = (float)i;
        yv[i] = 1.0f;
        want[i] = 2.0f * xv[i] + yv[i];
    }
    cube_handle hx = conf_create(xv, sizeof xv),
                hy = conf_create(yv, sizeof yv);
    CONF_OK(s_scale_add_on(conf.client, hx, hy));
    memset(got, 0, sizeof got);
    CONF_READ_OK(hy, got, sizeof got);
    assert_memory_equal(got, want, sizeof want);
    conf_release(hx);
    conf_release(hy);
}
