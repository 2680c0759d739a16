/* Data between devices (cubert/comm.h): collectives checked against a host
 * reference, driven by one thread (a group) and by one thread per rank;
 * in-place layouts; the failure store; mismatched calls, missing ranks and
 * unmatched sends (errors, never hangs, the communicator still usable);
 * abort; hostile arguments; copies between clients and devices.
 *
 * Ranks need devices of their own: the CPU backend's virtual devices
 * (CUBERT_CPU_DEVICES, set here for the test's own opens), or as many GPUs
 * as there are. A test that needs more devices than the backend has runs
 * with fewer ranks, or is skipped. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "conformance.h"

#define MAX_TEST_RANKS 4

/* Opens up to `want` clients on devices 0.. of the backend under test
 * (at least one: the device conf.client is on) and returns how many. The
 * CPU backend's devices are virtual, as many as CUBERT_CPU_DEVICES says;
 * the other backends do not read it. */
static uint32_t open_ranks(uint32_t want, cube_client **c)
{
    setenv("CUBERT_CPU_DEVICES", "4", 1);
    uint32_t have = 0;
    cube_error *err = cube_device_count(conf.backend, &have);
    CONF_OK(err);
    uint32_t n = want < have ? want : have;
    for (uint32_t i = 0; i < n; i++) {
        char name[64];
        snprintf(name, sizeof name, "%s:%u", conf.backend, i);
        CONF_OK(cube_client_open(name, NULL, &c[i]));
    }
    return n;
}

static void close_ranks(cube_client **c, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++)
        cube_client_close(c[i]);
    unsetenv("CUBERT_CPU_DEVICES");
}

static cube_comm_options quick(uint32_t ms)
{
    cube_comm_options o = cube_comm_options_default();
    o.timeout_ms = ms;
    return o;
}

/* --- element values, exact in every dtype --- */

static double value(uint32_t rank, uint64_t i)
{
    return (double)(1 + (rank + i) % 2);
}

static void put(void *buf, uint64_t i, cube_dtype t, double v)
{
    switch (t) {
    case CUBE_DTYPE_I8: ((int8_t *)buf)[i] = (int8_t)v; break;
    case CUBE_DTYPE_U8: ((uint8_t *)buf)[i] = (uint8_t)v; break;
    case CUBE_DTYPE_I32: ((int32_t *)buf)[i] = (int32_t)v; break;
    case CUBE_DTYPE_U32: ((uint32_t *)buf)[i] = (uint32_t)v; break;
    case CUBE_DTYPE_I64: ((int64_t *)buf)[i] = (int64_t)v; break;
    case CUBE_DTYPE_U64: ((uint64_t *)buf)[i] = (uint64_t)v; break;
    case CUBE_DTYPE_F32: ((float *)buf)[i] = (float)v; break;
    case CUBE_DTYPE_F64: ((double *)buf)[i] = v; break;
    case CUBE_DTYPE_F16:
    case CUBE_DTYPE_BF16: {
        /* Exact small values only: rebias the float's exponent. */
        float f = (float)v;
        uint32_t x;
        memcpy(&x, &f, 4);
        uint16_t h;
        if (t == CUBE_DTYPE_BF16)
            h = (uint16_t)(x >> 16);
        else if (f == 0)
            h = 0;
        else
            h = (uint16_t)(((x >> 16) & 0x8000u) |
                           ((((x >> 23) & 255u) - 112u) << 10) |
                           ((x >> 13) & 1023u));
        ((uint16_t *)buf)[i] = h;
        break;
    }
    }
}

static double get(const void *buf, uint64_t i, cube_dtype t)
{
    switch (t) {
    case CUBE_DTYPE_I8: return ((const int8_t *)buf)[i];
    case CUBE_DTYPE_U8: return ((const uint8_t *)buf)[i];
    case CUBE_DTYPE_I32: return ((const int32_t *)buf)[i];
    case CUBE_DTYPE_U32: return ((const uint32_t *)buf)[i];
    case CUBE_DTYPE_I64: return (double)((const int64_t *)buf)[i];
    case CUBE_DTYPE_U64: return (double)((const uint64_t *)buf)[i];
    case CUBE_DTYPE_F32: return ((const float *)buf)[i];
    case CUBE_DTYPE_F64: return ((const double *)buf)[i];
    case CUBE_DTYPE_F16:
    case CUBE_DTYPE_BF16: {
        uint16_t h = ((const uint16_t *)buf)[i];
        uint32_t x;
        if (t == CUBE_DTYPE_BF16)
            x = (uint32_t)h << 16;
        else if ((h & 0x7fffu) == 0)
            x = (uint32_t)(h & 0x8000u) << 16;
        else
            x = ((uint32_t)(h & 0x8000u) << 16) |
                ((((h >> 10) & 31u) + 112u) << 23) | ((h & 1023u) << 13);
        float f;
        memcpy(&f, &x, 4);
        return f;
    }
    }
    return 0;
}

static int is_float(cube_dtype t)
{
    return t == CUBE_DTYPE_F16 || t == CUBE_DTYPE_BF16 || t == CUBE_DTYPE_F32 ||
           t == CUBE_DTYPE_F64;
}

/* op over ranks of value(r, i), as the contract defines it. */
static double reference(cube_reduce_op op, uint32_t n, uint64_t i, cube_dtype t)
{
    double acc = value(0, i);
    for (uint32_t r = 1; r < n; r++) {
        double v = value(r, i);
        switch (op) {
        case CUBE_REDUCE_SUM:
        case CUBE_REDUCE_AVG: acc += v; break;
        case CUBE_REDUCE_PROD: acc *= v; break;
        case CUBE_REDUCE_MIN: acc = v < acc ? v : acc; break;
        case CUBE_REDUCE_MAX: acc = v > acc ? v : acc; break;
        }
    }
    if (op == CUBE_REDUCE_AVG)
        acc = is_float(t) ? acc / n : (double)((int64_t)acc / (int64_t)n);
    return acc;
}

/* A buffer on `c` holding value(rank, i) for `count` elements. */
static cube_handle filled(cube_client *c, uint32_t rank, uint64_t count,
                          cube_dtype t, uint64_t at)
{
    uint32_t es = cube_dtype_size(t);
    unsigned char *host = calloc(count, es);
    assert_non_null(host);
    for (uint64_t i = 0; i < count; i++)
        put(host, i, t, value(rank, at + i));
    cube_handle h;
    CONF_OK(cube_create(c, host, count * es, &h));
    free(host);
    return h;
}

static void *read_all(cube_client *c, cube_handle h, uint64_t bytes)
{
    void *host = malloc(bytes);
    assert_non_null(host);
    cube_copy_desc d = cube_copy_desc_contiguous(h, bytes, 1);
    void *dst[1] = {host};
    uint64_t size[1] = {bytes};
    CONF_OK(cube_read(c, &d, dst, size, 1));
    return host;
}

static void expect_reduced(cube_client *c, cube_handle h, uint64_t count,
                           cube_dtype t, cube_reduce_op op, uint32_t n,
                           uint64_t at, const char *what)
{
    void *host = read_all(c, h, count * cube_dtype_size(t));
    for (uint64_t i = 0; i < count; i++) {
        double want = reference(op, n, at + i, t), got = get(host, i, t);
        if (got != want)
            fail_msg("%s: dtype %d op %d, %u ranks: element %llu is %g, "
                     "expected %g",
                     what, (int)t, (int)op, n, (unsigned long long)i, got,
                     want);
    }
    free(host);
}

static cube_handle slice_of(cube_client *c, cube_handle h, uint64_t offset,
                            uint64_t size)
{
    cube_handle s;
    CONF_OK(cube_handle_slice(c, h, offset, size, &s));
    return s;
}

/* One thread drives every rank's all-reduce, in one group. */
static cube_error *group_all_reduce(cube_comm **comm, const cube_handle *src,
                                    const cube_handle *dst, uint32_t n,
                                    uint64_t count, cube_dtype t,
                                    cube_reduce_op op)
{
    cube_error *err = cube_group_begin();
    if (err)
        return err;
    for (uint32_t r = 0; r < n; r++)
        CONF_OK(cube_all_reduce(comm[r], src[r], dst[r], count, t, op));
    return cube_group_end();
}

/* Checks every rank's destination holds the sum over the ranks, then
 * gives everything back. */
static void finish_summed(cube_client **c, cube_comm **comm, cube_handle *src,
                          cube_handle *dst, uint32_t n, uint64_t count,
                          cube_dtype t, const char *what)
{
    for (uint32_t r = 0; r < n; r++) {
        expect_reduced(c[r], dst[r], count, t, CUBE_REDUCE_SUM, n, 0, what);
        CONF_OK(cube_handle_release(c[r], src[r]));
        CONF_OK(cube_handle_release(c[r], dst[r]));
        cube_comm_destroy(comm[r]);
    }
    close_ranks(c, n);
}

static void mark_failed(cube_client *c, cube_handle h)
{
    cube_arg a = cube_arg_buffer(h);
    cube_error *err =
        cube_launch(c, conf.k.mark, cube_count_static(1, 1, 1), &a, 1, 0);
    CONF_CODE(err, conf_mark_code());
    cube_error_free(err);
}

/* ------------------------------------------------ every dtype and op */

CONF_TEST_NEEDS(comm_all_reduce_every_dtype_and_op_matches_the_host,
                CUBE_FEATURE_COLLECTIVES)
{
    static const cube_dtype types[] = {
        CUBE_DTYPE_I8,  CUBE_DTYPE_U8,  CUBE_DTYPE_I32, CUBE_DTYPE_U32,
        CUBE_DTYPE_I64, CUBE_DTYPE_U64, CUBE_DTYPE_F16, CUBE_DTYPE_BF16,
        CUBE_DTYPE_F32, CUBE_DTYPE_F64};
    cube_client *c[MAX_TEST_RANKS];
    uint32_t n = open_ranks(4, c);
    cube_comm *comm[MAX_TEST_RANKS];
    CONF_OK(cube_comm_init_all(c, n, NULL, comm));
    for (uint32_t r = 0; r < n; r++) {
        assert_int_equal(cube_comm_rank(comm[r]), r);
        assert_int_equal(cube_comm_size(comm[r]), n);
    }
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        cube_dtype t = types[ti];
        /* More than one chunk of the host engine for the wide types. */
        uint64_t count = cube_dtype_size(t) == 8 ? 5000 : 1001;
        for (cube_reduce_op op = CUBE_REDUCE_SUM; op <= CUBE_REDUCE_AVG; op++) {
            if (op == CUBE_REDUCE_AVG && is_float(t) && n == 3)
                continue; /* x/3 is not exact in every float type */
            cube_handle src[MAX_TEST_RANKS] = {{0}},
                        dst[MAX_TEST_RANKS] = {{0}};
            for (uint32_t r = 0; r < n; r++) {
                src[r] = filled(c[r], r, count, t, 0);
                CONF_OK(cube_empty(c[r], count * cube_dtype_size(t), &dst[r]));
            }
            /* One thread drives every rank. */
            CONF_OK(cube_group_begin());
            for (uint32_t r = 0; r < n; r++)
                CONF_OK(cube_all_reduce(comm[r], src[r], dst[r], count, t, op));
            CONF_OK(cube_group_end());
            for (uint32_t r = 0; r < n; r++) {
                expect_reduced(c[r], dst[r], count, t, op, n, 0, "all-reduce");
                CONF_OK(cube_handle_release(c[r], src[r]));
                CONF_OK(cube_handle_release(c[r], dst[r]));
            }
        }
    }
    for (uint32_t r = 0; r < n; r++)
        cube_comm_destroy(comm[r]);
    close_ranks(c, n);
}

/* ------------------------------------------- one thread per rank */

typedef struct rank_job {
    cube_comm *comm;
    cube_client *client;
    uint32_t rank, n;
    int failures;
    char why[256];
} rank_job;

#define JOB_CHECK(job, cond, ...)                                              \
    do {                                                                       \
        if (!(cond) && !(job)->failures++)                                     \
            snprintf((job)->why, sizeof(job)->why, __VA_ARGS__);               \
    } while (0)

static int job_ok(rank_job *job, cube_error *err, const char *what)
{
    if (!err)
        return 1;
    JOB_CHECK(job, 0, "rank %u: %s: %s", job->rank, what,
              cube_error_message(err));
    cube_error_free(err);
    return 0;
}

static void job_expect(rank_job *job, cube_handle h, uint64_t bytes,
                       const void *want, const char *what)
{
    void *got = malloc(bytes);
    cube_copy_desc d = cube_copy_desc_contiguous(h, bytes, 1);
    void *dst[1] = {got};
    uint64_t size[1] = {bytes};
    if (got && job_ok(job, cube_read(job->client, &d, dst, size, 1), what))
        JOB_CHECK(job, memcmp(got, want, bytes) == 0,
                  "rank %u: %s: wrong bytes", job->rank, what);
    free(got);
}

/* Every collective once, f32, count 777; rank r's source holds
 * r * 1000 + i. */
static void *every_collective(void *arg)
{
    rank_job *job = arg;
    const uint64_t count = 777;
    uint32_t r = job->rank, n = job->n;
    cube_client *c = job->client;
    float *mine = malloc(count * n * sizeof(float));
    float *want = malloc(count * n * sizeof(float));
    if (!mine || !want) {
        JOB_CHECK(job, 0, "out of memory");
        free(mine);
        free(want);
        return NULL;
    }
    for (uint64_t i = 0; i < count * n; i++)
        mine[i] = (float)(r * 1000 + i % 5000);
    cube_handle src, dst;
    if (!job_ok(job, cube_create(c, mine, count * n * 4, &src), "create") ||
        !job_ok(job, cube_empty(c, count * n * 4, &dst), "empty"))
        goto out;

    /* broadcast from the last rank */
    if (job_ok(
            job,
            cube_broadcast(job->comm, src, dst, count, CUBE_DTYPE_F32, n - 1),
            "broadcast")) {
        for (uint64_t i = 0; i < count; i++)
            want[i] = (float)((n - 1) * 1000 + i);
        job_expect(job, dst, count * 4, want, "broadcast");
    }
    /* reduce (max) to rank 0; other ranks pass no destination */
    cube_handle none = {0};
    if (job_ok(job,
               cube_reduce(job->comm, src, r == 0 ? dst : none, count,
                           CUBE_DTYPE_F32, CUBE_REDUCE_MAX, 0),
               "reduce") &&
        r == 0) {
        for (uint64_t i = 0; i < count; i++)
            want[i] = (float)((n - 1) * 1000 + i);
        job_expect(job, dst, count * 4, want, "reduce");
    }
    /* all-gather */
    if (job_ok(job, cube_all_gather(job->comm, src, dst, count, CUBE_DTYPE_F32),
               "all_gather")) {
        for (uint32_t q = 0; q < n; q++)
            for (uint64_t i = 0; i < count; i++)
                want[q * count + i] = (float)(q * 1000 + i);
        job_expect(job, dst, count * n * 4, want, "all_gather");
    }
    /* reduce-scatter (sum) */
    if (job_ok(job,
               cube_reduce_scatter(job->comm, src, dst, count, CUBE_DTYPE_F32,
                                   CUBE_REDUCE_SUM),
               "reduce_scatter")) {
        for (uint64_t i = 0; i < count; i++) {
            float s = 0;
            for (uint32_t q = 0; q < n; q++)
                s += (float)(q * 1000 + (r * count + i) % 5000);
            want[i] = s;
        }
        job_expect(job, dst, count * 4, want, "reduce_scatter");
    }
    /* a ring of sends: to the next rank, from the previous */
    if (n > 1) {
        uint32_t next = (r + 1) % n, prev = (r + n - 1) % n;
        if (r % 2 == 0) {
            job_ok(job, cube_send(job->comm, src, count, CUBE_DTYPE_F32, next),
                   "send");
            job_ok(job, cube_recv(job->comm, dst, count, CUBE_DTYPE_F32, prev),
                   "recv");
        } else {
            job_ok(job, cube_recv(job->comm, dst, count, CUBE_DTYPE_F32, prev),
                   "recv");
            job_ok(job, cube_send(job->comm, src, count, CUBE_DTYPE_F32, next),
                   "send");
        }
        for (uint64_t i = 0; i < count; i++)
            want[i] = (float)(prev * 1000 + i);
        job_expect(job, dst, count * 4, want, "send/recv");
    }
    job_ok(job, cube_handle_release(c, src), "release");
    job_ok(job, cube_handle_release(c, dst), "release");
out:
    free(mine);
    free(want);
    return NULL;
}

static void run_rank_threads(cube_comm **comm, cube_client **c, uint32_t n,
                             void *(*body)(void *))
{
    pthread_t t[MAX_TEST_RANKS];
    rank_job jobs[MAX_TEST_RANKS];
    memset(jobs, 0, sizeof jobs);
    for (uint32_t r = 0; r < n; r++) {
        jobs[r].comm = comm[r];
        jobs[r].client = c[r];
        jobs[r].rank = r;
        jobs[r].n = n;
        assert_int_equal(pthread_create(&t[r], NULL, body, &jobs[r]), 0);
    }
    for (uint32_t r = 0; r < n; r++)
        pthread_join(t[r], NULL);
    for (uint32_t r = 0; r < n; r++)
        if (jobs[r].failures)
            fail_msg("%s", jobs[r].why);
}

CONF_TEST_NEEDS(comm_every_collective_with_a_thread_per_rank_matches_the_host,
                CUBE_FEATURE_COLLECTIVES)
{
    cube_client *c[MAX_TEST_RANKS];
    uint32_t have = open_ranks(4, c);
    for (uint32_t n = 1; n <= have; n++) {
        cube_comm *comm[MAX_TEST_RANKS];
        CONF_OK(cube_comm_init_all(c, n, NULL, comm));
        run_rank_threads(comm, c, n, every_collective);
        for (uint32_t r = 0; r < n; r++)
            cube_comm_destroy(comm[r]);
    }
    close_ranks(c, have);
}

/* ------------------------------------------------------------ in place */

CONF_TEST_NEEDS(comm_in_place_layouts_work_and_other_overlaps_are_refused,
                CUBE_FEATURE_COLLECTIVES)
{
    cube_client *c[MAX_TEST_RANKS];
    uint32_t n = open_ranks(3, c);
    cube_comm *comm[MAX_TEST_RANKS];
    CONF_OK(cube_comm_init_all(c, n, NULL, comm));
    const uint64_t count = 300;
    const cube_dtype t = CUBE_DTYPE_I32;
    cube_handle b[MAX_TEST_RANKS];

    /* all-reduce with src == dst */
    for (uint32_t r = 0; r < n; r++)
        b[r] = filled(c[r], r, count, t, 0);
    CONF_OK(cube_group_begin());
    for (uint32_t r = 0; r < n; r++)
        CONF_OK(
            cube_all_reduce(comm[r], b[r], b[r], count, t, CUBE_REDUCE_SUM));
    CONF_OK(cube_group_end());
    for (uint32_t r = 0; r < n; r++) {
        expect_reduced(c[r], b[r], count, t, CUBE_REDUCE_SUM, n, 0,
                       "in-place all-reduce");
        CONF_OK(cube_handle_release(c[r], b[r]));
    }

    /* all-gather as NCCL does it in place: rank r's source is the r-th
     * count of its destination */
    cube_handle s[MAX_TEST_RANKS];
    for (uint32_t r = 0; r < n; r++) {
        CONF_OK(cube_empty(c[r], count * n * 4, &b[r]));
        cube_handle v = filled(c[r], r, count, t, 0);
        s[r] = slice_of(c[r], b[r], r * count * 4, count * 4);
        CONF_OK(cube_copy_peer(c[r], s[r], c[r], v));
        CONF_OK(cube_handle_release(c[r], v));
    }
    CONF_OK(cube_group_begin());
    for (uint32_t r = 0; r < n; r++)
        CONF_OK(cube_all_gather(comm[r], s[r], b[r], count, t));
    CONF_OK(cube_group_end());
    for (uint32_t r = 0; r < n; r++) {
        int32_t *got = read_all(c[r], b[r], count * n * 4);
        for (uint32_t q = 0; q < n; q++)
            for (uint64_t i = 0; i < count; i++)
                assert_int_equal(got[q * count + i], (int32_t)value(q, i));
        free(got);
    }

    /* reduce-scatter in place: rank r's destination is the r-th count of
     * its source */
    for (uint32_t r = 0; r < n; r++) {
        CONF_OK(cube_handle_release(c[r], s[r]));
        cube_handle v = filled(c[r], r, count * n, t, 0);
        CONF_OK(cube_copy_peer(c[r], b[r], c[r], v));
        CONF_OK(cube_handle_release(c[r], v));
        s[r] = slice_of(c[r], b[r], r * count * 4, count * 4);
    }
    CONF_OK(cube_group_begin());
    for (uint32_t r = 0; r < n; r++)
        CONF_OK(cube_reduce_scatter(comm[r], b[r], s[r], count, t,
                                    CUBE_REDUCE_SUM));
    CONF_OK(cube_group_end());
    for (uint32_t r = 0; r < n; r++)
        expect_reduced(c[r], s[r], count, t, CUBE_REDUCE_SUM, n, r * count,
                       "in-place reduce-scatter");

    /* Any other overlap is refused, on this rank and every other. */
    if (n > 1) {
        cube_handle odd = slice_of(c[0], b[0], 4, count * 4);
        cube_handle whole = slice_of(c[0], b[0], 0, count * 4);
        CONF_OK(cube_group_begin());
        CONF_EXPECT_MSG(
            cube_all_reduce(comm[0], whole, odd, count, t, CUBE_REDUCE_SUM),
            CUBE_ERR_INVALID_ARGUMENT, "overlap");
        for (uint32_t r = 1; r < n; r++)
            CONF_OK(cube_all_reduce(comm[r], s[r], s[r], count, t,
                                    CUBE_REDUCE_SUM));
        cube_error *err = cube_group_end();
        CONF_EXPECT_MSG(err, CUBE_ERR_INVALID_ARGUMENT, "overlap");
        CONF_OK(cube_handle_release(c[0], odd));
        CONF_OK(cube_handle_release(c[0], whole));
        /* Refused everywhere: nothing was recorded on the others. */
        for (uint32_t r = 1; r < n; r++)
            CONF_OK(cube_check(c[r], &s[r], 1));
    }
    for (uint32_t r = 0; r < n; r++) {
        CONF_OK(cube_handle_release(c[r], s[r]));
        CONF_OK(cube_handle_release(c[r], b[r]));
        cube_comm_destroy(comm[r]);
    }
    close_ranks(c, n);
}

/* ----------------------------------------------------------- failures */

CONF_TEST_NEEDS(comm_failed_source_refuses_on_every_rank_and_marks_destinations,
                CUBE_FEATURE_COLLECTIVES)
{
    cube_client *c[MAX_TEST_RANKS];
    uint32_t n = open_ranks(3, c);
    cube_comm *comm[MAX_TEST_RANKS];
    CONF_OK(cube_comm_init_all(c, n, NULL, comm));
    const uint64_t count = 64;
    cube_handle src[MAX_TEST_RANKS] = {{0}}, dst[MAX_TEST_RANKS] = {{0}};
    for (uint32_t r = 0; r < n; r++) {
        src[r] = filled(c[r], r, count, CUBE_DTYPE_F32, 0);
        dst[r] = filled(c[r], r, count, CUBE_DTYPE_F32, 0);
    }
    uint32_t bad = n - 1;
    mark_failed(c[bad], src[bad]);
    CONF_OK(cube_group_begin());
    for (uint32_t r = 0; r < n; r++)
        CONF_OK(cube_all_reduce(comm[r], src[r], dst[r], count, CUBE_DTYPE_F32,
                                CUBE_REDUCE_SUM));
    cube_error *err = cube_group_end();
    CONF_CODE(err, CUBE_ERR_SEVERAL);
    char needle[32], *text = cube_error_format(err);
    snprintf(needle, sizeof needle, "rank %u's source", bad);
    if (!text || !strstr(text, needle))
        fail_msg("the error does not name %s: %s", needle, text ? text : "?");
    free(text);
    cube_error_free(err);
    /* Every rank's destination carries it; the sources of the others do
     * not. */
    for (uint32_t r = 0; r < n; r++) {
        CONF_EXPECT(cube_check(c[r], &dst[r], 1), CUBE_ERR_SEVERAL);
        if (r != bad)
            CONF_OK(cube_check(c[r], &src[r], 1));
    }
    /* In a dry run the call is checked and dropped: the destinations
     * keep their failure. */
    CONF_OK(cube_dry_run_begin(c[0]));
    CONF_OK(cube_all_reduce(comm[0], dst[0], dst[0], count, CUBE_DTYPE_F32,
                            CUBE_REDUCE_SUM));
    CONF_OK(cube_dry_run_end(c[0]));
    CONF_EXPECT(cube_check(c[0], &dst[0], 1), CUBE_ERR_SEVERAL);
    /* A rewrite of the source, and the next all-reduce clears them. */
    CONF_OK(cube_handle_release(c[bad], src[bad]));
    src[bad] = filled(c[bad], bad, count, CUBE_DTYPE_F32, 0);
    CONF_OK(group_all_reduce(comm, src, dst, n, count, CUBE_DTYPE_F32,
                             CUBE_REDUCE_SUM));
    finish_summed(c, comm, src, dst, n, count, CUBE_DTYPE_F32,
                  "after the failure");
}

CONF_TEST_NEEDS(
    comm_mismatched_calls_are_refused_everywhere_and_the_comm_goes_on,
    CUBE_FEATURE_COLLECTIVES)
{
    cube_client *c[MAX_TEST_RANKS];
    uint32_t n = open_ranks(3, c);
    if (n < 2) {
        close_ranks(c, n);
        print_message("skipped: one device, no peer to disagree with\n");
        skip();
    }
    cube_comm *comm[MAX_TEST_RANKS];
    CONF_OK(cube_comm_init_all(c, n, NULL, comm));
    const uint64_t count = 32;
    cube_handle src[MAX_TEST_RANKS] = {{0}}, dst[MAX_TEST_RANKS] = {{0}};
    for (uint32_t r = 0; r < n; r++) {
        src[r] = filled(c[r], r, count, CUBE_DTYPE_U32, 0);
        dst[r] = filled(c[r], 9, count, CUBE_DTYPE_U32, 0);
    }
    /* rank 1 asks for fewer elements */
    CONF_OK(cube_group_begin());
    for (uint32_t r = 0; r < n; r++)
        CONF_OK(cube_all_reduce(comm[r], src[r], dst[r], r == 1 ? 16 : count,
                                CUBE_DTYPE_U32, CUBE_REDUCE_SUM));
    CONF_EXPECT_MSG(cube_group_end(), CUBE_ERR_INVALID_ARGUMENT, "differ");
    /* rank 0 another element type, and another kind */
    CONF_OK(cube_group_begin());
    for (uint32_t r = 0; r < n; r++) {
        if (r == 0)
            CONF_OK(cube_broadcast(comm[r], src[r], dst[r], count,
                                   CUBE_DTYPE_I32, 0));
        else
            CONF_OK(cube_all_reduce(comm[r], src[r], dst[r], count,
                                    CUBE_DTYPE_U32, CUBE_REDUCE_SUM));
    }
    CONF_EXPECT_MSG(cube_group_end(), CUBE_ERR_INVALID_ARGUMENT, "differ");
    /* rank 1 passes a released handle: its own call answers NOT_FOUND,
     * the others learn it was refused */
    cube_handle gone = filled(c[1], 1, count, CUBE_DTYPE_U32, 0);
    CONF_OK(cube_handle_release(c[1], gone));
    CONF_OK(cube_group_begin());
    for (uint32_t r = 0; r < n; r++) {
        cube_error *e = cube_all_reduce(comm[r], r == 1 ? gone : src[r], dst[r],
                                        count, CUBE_DTYPE_U32, CUBE_REDUCE_SUM);
        if (r == 1)
            CONF_EXPECT(e, CUBE_ERR_NOT_FOUND);
        else
            CONF_OK(e);
    }
    CONF_EXPECT_MSG(cube_group_end(), CUBE_ERR_INVALID_ARGUMENT,
                    "rank 1's cube_all_reduce was refused");
    /* Refusals record nothing and move nothing. */
    for (uint32_t r = 0; r < n; r++) {
        CONF_OK(cube_check(c[r], &dst[r], 1));
        expect_reduced(c[r], dst[r], count, CUBE_DTYPE_U32, CUBE_REDUCE_SUM, 1,
                       9, "untouched");
    }
    /* The communicator goes on. */
    CONF_OK(group_all_reduce(comm, src, dst, n, count, CUBE_DTYPE_U32,
                             CUBE_REDUCE_SUM));
    finish_summed(c, comm, src, dst, n, count, CUBE_DTYPE_U32,
                  "after the refusals");
}

CONF_TEST_NEEDS(
    comm_missing_rank_and_unmatched_send_time_out_then_the_comm_goes_on,
    CUBE_FEATURE_COLLECTIVES)
{
    cube_client *c[MAX_TEST_RANKS];
    uint32_t n = open_ranks(2, c);
    if (n < 2) {
        close_ranks(c, n);
        print_message("skipped: one device, no peer to wait for\n");
        skip();
    }
    cube_comm *comm[MAX_TEST_RANKS];
    cube_comm_options o = quick(200);
    CONF_OK(cube_comm_init_all(c, n, &o, comm));
    const uint64_t count = 16;
    cube_handle src[2], dst[2];
    for (uint32_t r = 0; r < 2; r++) {
        src[r] = filled(c[r], r, count, CUBE_DTYPE_U32, 0);
        dst[r] = filled(c[r], 7, count, CUBE_DTYPE_U32, 0);
    }
    /* Rank 1 does not come in time: rank 0 times out, its destination
     * carries the timeout, and rank 1's late call gets the same answer. */
    CONF_EXPECT_MSG(cube_all_reduce(comm[0], src[0], dst[0], count,
                                    CUBE_DTYPE_U32, CUBE_REDUCE_SUM),
                    CUBE_ERR_TIMEOUT, "1 of 2");
    CONF_EXPECT(cube_check(c[0], &dst[0], 1), CUBE_ERR_SEVERAL);
    CONF_EXPECT(cube_all_reduce(comm[1], src[1], dst[1], count, CUBE_DTYPE_U32,
                                CUBE_REDUCE_SUM),
                CUBE_ERR_TIMEOUT);
    /* A send without its receive times out; the late receive too. */
    CONF_EXPECT(cube_send(comm[0], src[0], count, CUBE_DTYPE_U32, 1),
                CUBE_ERR_TIMEOUT);
    CONF_EXPECT(cube_recv(comm[1], dst[1], count, CUBE_DTYPE_U32, 0),
                CUBE_ERR_TIMEOUT);
    /* Then both pairs work again. */
    CONF_OK(cube_group_begin());
    for (uint32_t r = 0; r < 2; r++)
        CONF_OK(cube_all_reduce(comm[r], src[r], dst[r], count, CUBE_DTYPE_U32,
                                CUBE_REDUCE_SUM));
    CONF_OK(cube_send(comm[0], src[0], count, CUBE_DTYPE_U32, 1));
    CONF_OK(cube_recv(comm[1], src[1], count, CUBE_DTYPE_U32, 0));
    CONF_OK(cube_group_end());
    for (uint32_t r = 0; r < 2; r++)
        expect_reduced(c[r], dst[r], count, CUBE_DTYPE_U32, CUBE_REDUCE_SUM, 2,
                       0, "after the timeouts");
    expect_reduced(c[1], src[1], count, CUBE_DTYPE_U32, CUBE_REDUCE_SUM, 1, 0,
                   "received");
    /* A rank destroyed while another waits for it: no hang either. */
    cube_comm_destroy(comm[1]);
    CONF_EXPECT(cube_all_reduce(comm[0], src[0], dst[0], count, CUBE_DTYPE_U32,
                                CUBE_REDUCE_SUM),
                CUBE_ERR_TIMEOUT);
    cube_comm_destroy(comm[0]);
    for (uint32_t r = 0; r < 2; r++) {
        CONF_OK(cube_handle_release(c[r], src[r]));
        CONF_OK(cube_handle_release(c[r], dst[r]));
    }
    close_ranks(c, n);
}

static void *abort_later(void *arg)
{
    struct timespec pause = {0, 50 * 1000 * 1000};
    nanosleep(&pause, NULL);
    cube_error_free(cube_comm_abort(arg));
    return NULL;
}

/* A communicator of one rank answers as any rank does, whether its call
 * runs alone or inside a group (which goes through the rendezvous). */
CONF_TEST_NEEDS(comm_one_rank_answers_alone_as_in_a_group,
                CUBE_FEATURE_COLLECTIVES)
{
    cube_client *c[MAX_TEST_RANKS];
    uint32_t n = open_ranks(1, c);
    cube_comm *comm[MAX_TEST_RANKS];
    CONF_OK(cube_comm_init_all(c, n, NULL, comm));
    const uint64_t count = 64;
    for (int grouped = 0; grouped < 2; grouped++) {
        cube_handle src = filled(c[0], 0, count, CUBE_DTYPE_F32, 0);
        cube_handle dst = filled(c[0], 0, count, CUBE_DTYPE_F32, 1);
        cube_handle gone = filled(c[0], 0, count, CUBE_DTYPE_F32, 0);
        CONF_OK(cube_handle_release(c[0], gone));
        cube_error *err = NULL;
#define ONE(call)                                                              \
    do {                                                                       \
        if (grouped) {                                                         \
            CONF_OK(cube_group_begin());                                       \
            cube_error_free(call);                                             \
            err = cube_group_end();                                            \
        } else {                                                               \
            err = (call);                                                      \
        }                                                                      \
    } while (0)
        /* a call: the destination is the source */
        ONE(cube_all_reduce(comm[0], src, dst, count, CUBE_DTYPE_F32,
                            CUBE_REDUCE_SUM));
        CONF_OK(err);
        float a[64], b[64];
        CONF_OK(cube_read_all(c[0], src, a, sizeof a));
        CONF_OK(cube_read_all(c[0], dst, b, sizeof b));
        assert_memory_equal(a, b, sizeof a);
        /* its own refusal: the handle's error, the destination untouched */
        ONE(cube_all_reduce(comm[0], gone, dst, count, CUBE_DTYPE_F32,
                            CUBE_REDUCE_SUM));
        CONF_CODE(err, CUBE_ERR_NOT_FOUND);
        cube_error_free(err);
        CONF_OK(cube_check(c[0], &dst, 1));
        /* a failed source: named, and the destination carries it */
        mark_failed(c[0], src);
        ONE(cube_all_reduce(comm[0], src, dst, count, CUBE_DTYPE_F32,
                            CUBE_REDUCE_SUM));
        CONF_CODE(err, CUBE_ERR_SEVERAL);
        char *text = cube_error_format(err);
        if (!text || !strstr(text, "rank 0's source"))
            fail_msg("the error does not name rank 0's source: %s",
                     text ? text : "?");
        free(text);
        cube_error_free(err);
        CONF_EXPECT(cube_check(c[0], &dst, 1), CUBE_ERR_SEVERAL);
        CONF_OK(cube_handle_release(c[0], src));
        CONF_OK(cube_handle_release(c[0], dst));
    }
    /* after an abort, alone or grouped */
    cube_handle h = filled(c[0], 0, 8, CUBE_DTYPE_U32, 0);
    CONF_OK(cube_comm_abort(comm[0]));
    for (int grouped = 0; grouped < 2; grouped++) {
        cube_error *err = NULL;
        ONE(cube_all_reduce(comm[0], h, h, 8, CUBE_DTYPE_U32, CUBE_REDUCE_SUM));
        CONF_CODE(err, CUBE_ERR_ABORTED);
        cube_error_free(err);
    }
#undef ONE
    CONF_OK(cube_handle_release(c[0], h));
    cube_comm_destroy(comm[0]);
    close_ranks(c, n);
}

/* ------------------------------------------ sends to the calling rank */

/* h's first `bytes` are want's. */
static void expect_bytes(cube_client *c, cube_handle h, const void *want,
                         uint64_t bytes)
{
    void *got = read_all(c, h, bytes);
    assert_memory_equal(got, want, bytes);
    free(got);
}

/* A send to itself and its receive, in one group. */
static cube_error *self_pair(cube_comm *comm, cube_handle src, cube_handle dst,
                             uint64_t send_count, uint64_t recv_count)
{
    uint32_t me = cube_comm_rank(comm);
    CONF_OK(cube_group_begin());
    cube_error *s = cube_send(comm, src, send_count, CUBE_DTYPE_U32, me);
    cube_error *r = cube_recv(comm, dst, recv_count, CUBE_DTYPE_U32, me);
    cube_error *end = cube_group_end();
    cube_error_free(s);
    cube_error_free(r);
    return end;
}

/* A ring on a communicator of one rank is a send to itself and its
 * receive: paired in their group, in order, judged as a pair of ranks'
 * calls are; a lone one, or one outside a group, is refused at once. */
CONF_TEST_NEEDS(comm_send_to_the_calling_rank_pairs_with_its_receive_in_a_group,
                CUBE_FEATURE_COLLECTIVES)
{
    cube_client *c[MAX_TEST_RANKS];
    uint32_t n = open_ranks(2, c);
    cube_comm *one = NULL;
    /* A timeout long enough that a call left waiting fails the test by
     * its own limit. */
    cube_comm_options o = quick(3600u * 1000u);
    CONF_OK(cube_comm_init_all(c, 1, &o, &one));
    const uint64_t count = 1000;
    cube_handle a = filled(c[0], 0, count, CUBE_DTYPE_U32, 0);
    cube_handle b = filled(c[0], 0, count, CUBE_DTYPE_U32, 1);
    cube_handle x = filled(c[0], 0, count, CUBE_DTYPE_U32, 1);
    cube_handle y = filled(c[0], 0, count, CUBE_DTYPE_U32, 0);
    uint32_t *want_a = read_all(c[0], a, count * 4);
    uint32_t *want_b = read_all(c[0], b, count * 4);
    /* the ring: y = a */
    CONF_OK(self_pair(one, a, y, count, count));
    expect_bytes(c[0], y, want_a, count * 4);
    /* two pairs in one group pair in order: x = b, y = a */
    CONF_OK(cube_group_begin());
    CONF_OK(cube_send(one, b, count, CUBE_DTYPE_U32, 0));
    CONF_OK(cube_send(one, a, count, CUBE_DTYPE_U32, 0));
    CONF_OK(cube_recv(one, x, count, CUBE_DTYPE_U32, 0));
    CONF_OK(cube_recv(one, y, count, CUBE_DTYPE_U32, 0));
    CONF_OK(cube_group_end());
    expect_bytes(c[0], x, want_b, count * 4);
    expect_bytes(c[0], y, want_a, count * 4);
    /* the same range in place is a copy onto itself */
    CONF_OK(self_pair(one, a, a, count, count));
    /* Refusals; y holds b's bytes through all of them, untouched. */
    CONF_OK(cube_copy_peer(c[0], y, c[0], b));
    CONF_EXPECT_MSG(cube_send(one, a, count, CUBE_DTYPE_U32, 0),
                    CUBE_ERR_INVALID_ARGUMENT, "one group");
    CONF_EXPECT_MSG(cube_recv(one, y, count, CUBE_DTYPE_U32, 0),
                    CUBE_ERR_INVALID_ARGUMENT, "one group");
    CONF_OK(cube_group_begin());
    CONF_OK(cube_send(one, a, count, CUBE_DTYPE_U32, 0));
    CONF_EXPECT_MSG(cube_group_end(), CUBE_ERR_INVALID_ARGUMENT, "no receive");
    CONF_OK(cube_group_begin());
    CONF_OK(cube_recv(one, y, count, CUBE_DTYPE_U32, 0));
    CONF_EXPECT_MSG(cube_group_end(), CUBE_ERR_INVALID_ARGUMENT, "no send");
    CONF_EXPECT_MSG(self_pair(one, a, y, count, count / 2),
                    CUBE_ERR_INVALID_ARGUMENT, "differ");
    cube_handle lo = slice_of(c[0], b, 0, 400), hi = slice_of(c[0], b, 4, 400);
    CONF_EXPECT_MSG(self_pair(one, lo, hi, 100, 100), CUBE_ERR_INVALID_ARGUMENT,
                    "overlap");
    cube_handle gone = filled(c[0], 0, count, CUBE_DTYPE_U32, 0);
    CONF_OK(cube_handle_release(c[0], gone));
    CONF_EXPECT_MSG(self_pair(one, gone, y, count, count), CUBE_ERR_NOT_FOUND,
                    "source");
    CONF_OK(cube_check(c[0], &y, 1));
    expect_bytes(c[0], y, want_b, count * 4);
    /* a failed source: the receive's destination carries it */
    cube_handle bad = filled(c[0], 0, count, CUBE_DTYPE_U32, 0);
    mark_failed(c[0], bad);
    CONF_EXPECT(self_pair(one, bad, y, count, count), CUBE_ERR_SEVERAL);
    CONF_EXPECT(cube_check(c[0], &y, 1), CUBE_ERR_SEVERAL);
    /* and a pair that runs clears it */
    CONF_OK(self_pair(one, a, y, count, count));
    CONF_OK(cube_check(c[0], &y, 1));
    cube_handle hs[] = {a, b, x, y, lo, hi, bad};
    for (size_t i = 0; i < sizeof hs / sizeof hs[0]; i++)
        CONF_OK(cube_handle_release(c[0], hs[i]));
    cube_comm_destroy(one);
    free(want_a);
    free(want_b);

    /* Two ranks, one thread: rank 1 sends to itself in the group where
     * rank 0 sends to rank 1 and rank 1 to rank 0. */
    if (n >= 2) {
        cube_comm *comm[MAX_TEST_RANKS];
        CONF_OK(cube_comm_init_all(c, 2, &o, comm));
        cube_handle s0 = filled(c[0], 0, count, CUBE_DTYPE_U32, 0);
        cube_handle d0 = filled(c[0], 0, count, CUBE_DTYPE_U32, 0);
        cube_handle s1 = filled(c[1], 1, count, CUBE_DTYPE_U32, 0);
        cube_handle d1 = filled(c[1], 1, count, CUBE_DTYPE_U32, 0);
        cube_handle e1 = filled(c[1], 1, count, CUBE_DTYPE_U32, 0);
        CONF_OK(cube_group_begin());
        CONF_OK(cube_send(comm[1], s1, count, CUBE_DTYPE_U32, 1));
        CONF_OK(cube_send(comm[0], s0, count, CUBE_DTYPE_U32, 1));
        CONF_OK(cube_send(comm[1], s1, count, CUBE_DTYPE_U32, 0));
        CONF_OK(cube_recv(comm[1], d1, count, CUBE_DTYPE_U32, 0));
        CONF_OK(cube_recv(comm[0], d0, count, CUBE_DTYPE_U32, 1));
        CONF_OK(cube_recv(comm[1], e1, count, CUBE_DTYPE_U32, 1));
        CONF_OK(cube_group_end());
        uint32_t *h0 = read_all(c[0], s0, count * 4);
        uint32_t *h1 = read_all(c[1], s1, count * 4);
        expect_bytes(c[0], d0, h1, count * 4);
        expect_bytes(c[1], d1, h0, count * 4);
        expect_bytes(c[1], e1, h1, count * 4);
        free(h0);
        free(h1);
        cube_handle all[] = {s0, d0};
        for (int i = 0; i < 2; i++)
            CONF_OK(cube_handle_release(c[0], all[i]));
        cube_handle all1[] = {s1, d1, e1};
        for (int i = 0; i < 3; i++)
            CONF_OK(cube_handle_release(c[1], all1[i]));
        for (uint32_t r = 0; r < 2; r++)
            cube_comm_destroy(comm[r]);
    }
    close_ranks(c, n);
}

CONF_TEST_NEEDS(comm_abort_wakes_a_waiting_rank_and_refuses_later_calls,
                CUBE_FEATURE_COLLECTIVES)
{
    cube_client *c[MAX_TEST_RANKS];
    uint32_t n = open_ranks(2, c);
    if (n < 2) {
        close_ranks(c, n);
        print_message("skipped: one device, no peer to wait for\n");
        skip();
    }
    cube_comm *comm[MAX_TEST_RANKS];
    cube_comm_options o = quick(60000);
    CONF_OK(cube_comm_init_all(c, n, &o, comm));
    cube_handle h = filled(c[0], 0, 8, CUBE_DTYPE_U32, 0);
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, abort_later, comm[1]), 0);
    CONF_EXPECT(
        cube_all_reduce(comm[0], h, h, 8, CUBE_DTYPE_U32, CUBE_REDUCE_SUM),
        CUBE_ERR_ABORTED);
    pthread_join(t, NULL);
    CONF_EXPECT(
        cube_all_reduce(comm[0], h, h, 8, CUBE_DTYPE_U32, CUBE_REDUCE_SUM),
        CUBE_ERR_ABORTED);
    CONF_EXPECT(cube_comm_abort(NULL), CUBE_ERR_INVALID_ARGUMENT);
    CONF_OK(cube_handle_release(c[0], h));
    for (uint32_t r = 0; r < n; r++)
        cube_comm_destroy(comm[r]);
    close_ranks(c, n);
}

/* ------------------------------------------------- hostile arguments */

CONF_TEST_NEEDS(comm_hostile_arguments_get_clear_errors_and_change_nothing,
                CUBE_FEATURE_COLLECTIVES)
{
    cube_client *c[MAX_TEST_RANKS];
    uint32_t n = open_ranks(2, c);
    cube_comm *comm[MAX_TEST_RANKS];
    cube_comm_options bad_size = cube_comm_options_default();
    bad_size.struct_size = 3;
    CONF_EXPECT(cube_comm_init_all(NULL, 1, NULL, comm),
                CUBE_ERR_INVALID_ARGUMENT);
    CONF_EXPECT(cube_comm_init_all(c, 1, NULL, NULL),
                CUBE_ERR_INVALID_ARGUMENT);
    CONF_EXPECT_MSG(cube_comm_init_all(c, 0, NULL, comm),
                    CUBE_ERR_INVALID_ARGUMENT, "n = 0");
    CONF_EXPECT(cube_comm_init_all(c, 1, &bad_size, comm),
                CUBE_ERR_INVALID_ARGUMENT);
    cube_client *twice[2] = {c[0], conf.client};
    CONF_EXPECT_MSG(cube_comm_init_all(twice, 2, NULL, comm),
                    CUBE_ERR_INVALID_ARGUMENT, "device of its own");
    cube_client *holes[2] = {c[0], NULL};
    CONF_EXPECT(cube_comm_init_all(holes, 2, NULL, comm),
                CUBE_ERR_INVALID_ARGUMENT);
    if (strcmp(conf.props.backend, "cpu") != 0) { /* cpu is another one */
        cube_client *cpu = NULL;
        CONF_OK(cube_client_open("cpu", NULL, &cpu));
        cube_client *mixed[2] = {c[0], cpu};
        CONF_EXPECT_MSG(cube_comm_init_all(mixed, 2, NULL, comm),
                        CUBE_ERR_INVALID_ARGUMENT, "one backend");
        cube_client_close(cpu);
    }
    /* Refusals on a communicator of one rank: no peer to wait for. */
    cube_comm *one = NULL;
    CONF_OK(cube_comm_init_all(c, 1, NULL, &one));
    cube_handle h = filled(c[0], 0, 8, CUBE_DTYPE_U32, 0);
    cube_handle small = filled(c[0], 0, 2, CUBE_DTYPE_U32, 0);
    CONF_EXPECT_MSG(
        cube_all_reduce(NULL, h, h, 8, CUBE_DTYPE_U32, CUBE_REDUCE_SUM),
        CUBE_ERR_INVALID_ARGUMENT, "comm is NULL");
    CONF_EXPECT_MSG(
        cube_all_reduce(one, h, h, 0, CUBE_DTYPE_U32, CUBE_REDUCE_SUM),
        CUBE_ERR_INVALID_ARGUMENT, "count is 0");
    CONF_EXPECT_MSG(
        cube_all_reduce(one, h, h, 8, (cube_dtype)0, CUBE_REDUCE_SUM),
        CUBE_ERR_INVALID_ARGUMENT, "dtype");
    CONF_EXPECT_MSG(
        cube_all_reduce(one, h, h, 8, (cube_dtype)11, CUBE_REDUCE_SUM),
        CUBE_ERR_INVALID_ARGUMENT, "dtype");
    CONF_EXPECT_MSG(
        cube_all_reduce(one, h, h, 8, CUBE_DTYPE_U32, (cube_reduce_op)6),
        CUBE_ERR_INVALID_ARGUMENT, "op");
    CONF_EXPECT_MSG(cube_broadcast(one, h, h, 8, CUBE_DTYPE_U32, 1),
                    CUBE_ERR_INVALID_ARGUMENT, "root");
    CONF_EXPECT_MSG(
        cube_all_reduce(one, h, small, 8, CUBE_DTYPE_U32, CUBE_REDUCE_SUM),
        CUBE_ERR_INVALID_ARGUMENT, "holds 8 bytes");
    CONF_EXPECT_MSG(cube_all_reduce(one, h, h, UINT64_MAX / 2, CUBE_DTYPE_U32,
                                    CUBE_REDUCE_SUM),
                    CUBE_ERR_INVALID_ARGUMENT, "overflows");
    CONF_EXPECT_MSG(cube_all_reduce(one, conf.sentinel, h, 8, CUBE_DTYPE_U32,
                                    CUBE_REDUCE_SUM),
                    CUBE_ERR_NOT_FOUND, "source");
    CONF_EXPECT_MSG(cube_send(one, h, 8, CUBE_DTYPE_U32, 0),
                    CUBE_ERR_INVALID_ARGUMENT, "peer");
    CONF_EXPECT_MSG(cube_recv(one, h, 8, CUBE_DTYPE_U32, 1),
                    CUBE_ERR_INVALID_ARGUMENT, "peer");
    /* A group whose call was refused answers the refusal at its end. */
    CONF_OK(cube_group_begin());
    CONF_EXPECT(cube_all_reduce(one, h, h, 0, CUBE_DTYPE_U32, CUBE_REDUCE_SUM),
                CUBE_ERR_INVALID_ARGUMENT);
    CONF_EXPECT_MSG(cube_group_end(), CUBE_ERR_INVALID_ARGUMENT, "count");
    /* And the communicator still works. */
    CONF_OK(cube_all_reduce(one, h, h, 8, CUBE_DTYPE_U32, CUBE_REDUCE_SUM));
    CONF_EXPECT_MSG(cube_group_end(), CUBE_ERR_INVALID_ARGUMENT, "no group");
    assert_int_equal(cube_comm_rank(NULL), 0);
    assert_int_equal(cube_comm_size(NULL), 0);
    assert_int_equal(cube_dtype_size((cube_dtype)0), 0);
    assert_int_equal(cube_dtype_size(CUBE_DTYPE_BF16), 2);
    cube_comm_destroy(NULL);
    /* Nothing changed: the buffer holds its bytes, no failure. */
    CONF_OK(cube_check(c[0], &h, 1));
    expect_reduced(c[0], h, 8, CUBE_DTYPE_U32, CUBE_REDUCE_SUM, 1, 0,
                   "untouched");
    CONF_OK(cube_handle_release(c[0], h));
    CONF_OK(cube_handle_release(c[0], small));
    cube_comm_destroy(one);
    close_ranks(c, n);
}

/* -------------------------------------------------------- peer copies */

CONF_TEST(comm_copy_peer_between_clients_devices_and_backends)
{
    cube_client *c[MAX_TEST_RANKS];
    uint32_t n = open_ranks(2, c);
    cube_client *same = NULL, *host = NULL;
    CONF_OK(cube_client_open(conf.backend, NULL, &same)); /* c[0]'s device */
    /* Another backend's client, whose memory is the host's. */
    CONF_OK(cube_client_open(
        strcmp(conf.props.backend, "cpu") == 0 ? "null" : "cpu", NULL, &host));
    unsigned char in[1000], out[1000];
    conf_pattern(in, sizeof in, 77);
    cube_handle a;
    CONF_OK(cube_create(c[0], in, sizeof in, &a));
    cube_client *targets[4] = {c[n - 1], same, c[0], host};
    for (int t = 0; t < 4; t++) {
        cube_client *d = targets[t];
        cube_handle b;
        CONF_OK(cube_empty(d, sizeof in, &b));
        CONF_OK(cube_copy_peer(d, b, c[0], a));
        cube_copy_desc desc = cube_copy_desc_contiguous(b, sizeof out, 1);
        void *dst[1] = {out};
        uint64_t size[1] = {sizeof out};
        CONF_OK(cube_read(d, &desc, dst, size, 1));
        assert_memory_equal(in, out, sizeof in);
        /* and back, through a slice */
        cube_handle part;
        CONF_OK(cube_handle_slice(d, b, 100, 200, &part));
        cube_handle back;
        CONF_OK(cube_empty(c[0], 200, &back));
        CONF_OK(cube_copy_peer(c[0], back, d, part));
        desc = cube_copy_desc_contiguous(back, 200, 1);
        size[0] = 200;
        CONF_OK(cube_read(c[0], &desc, dst, size, 1));
        assert_memory_equal(in + 100, out, 200);
        /* sizes differ; a foreign handle; a NULL client */
        CONF_EXPECT_MSG(cube_copy_peer(c[0], back, d, b),
                        CUBE_ERR_INVALID_ARGUMENT, "same");
        if (d != c[0])
            CONF_EXPECT_MSG(cube_copy_peer(d, a, c[0], a), CUBE_ERR_NOT_FOUND,
                            "destination");
        CONF_EXPECT(cube_copy_peer(NULL, b, c[0], a),
                    CUBE_ERR_INVALID_ARGUMENT);
        CONF_EXPECT(cube_copy_peer(d, b, NULL, a), CUBE_ERR_INVALID_ARGUMENT);
        /* a failed source refuses and the destination carries it; a full
         * copy clears it again */
        mark_failed(c[0], back);
        CONF_EXPECT(cube_copy_peer(d, part, c[0], back), CUBE_ERR_SEVERAL);
        CONF_EXPECT(cube_check(d, &b, 1), CUBE_ERR_SEVERAL);
        CONF_OK(cube_copy_peer(d, b, c[0], a));
        CONF_OK(cube_check(d, &b, 1));
        CONF_OK(cube_handle_release(c[0], back));
        CONF_OK(cube_handle_release(d, part));
        CONF_OK(cube_handle_release(d, b));
    }
    CONF_OK(cube_handle_release(c[0], a));
    cube_client_close(host);
    cube_client_close(same);
    close_ranks(c, n);
}

/* ---------------------------------------------------------- ordering */

typedef struct reader_job {
    cube_client *client;
    cube_handle x, y;
    uint32_t count;
    cube_error *err;
    float *seen; /* x as a read on this thread's stream found it */
} reader_job;

/* A kernel and a read of x on this thread's stream, with no barrier
 * before them: both wait for the collective that wrote x. */
static void *scale_on_another_stream(void *arg)
{
    reader_job *j = arg;
    cube_arg args[3] = {cube_arg_buffer(j->x), cube_arg_buffer(j->y),
                        cube_arg_f32(2.0f)};
    j->err = cube_launch(j->client, conf.k.scale,
                         cube_count_static(conf_div_up(j->count, 64), 1, 1),
                         args, 3, 0);
    if (!j->err)
        j->err =
            cube_read_all(j->client, j->x, j->seen, (uint64_t)j->count * 4);
    if (!j->err)
        j->err = cube_sync(j->client, &j->y, 1);
    return NULL;
}

CONF_TEST_NEEDS(comm_kernel_on_another_stream_sees_the_reduced_buffer,
                CUBE_FEATURE_KERNELS | CUBE_FEATURE_COLLECTIVES)
{
    cube_client *c[MAX_TEST_RANKS];
    uint32_t n = open_ranks(2, c);
    cube_comm *comm[MAX_TEST_RANKS];
    CONF_OK(cube_comm_init_all(c, n, NULL, comm));
    const uint32_t count = 1 << 20;
    cube_handle src[MAX_TEST_RANKS] = {{0}}, dst[MAX_TEST_RANKS] = {{0}};
    for (uint32_t r = 0; r < n; r++) {
        src[r] = filled(c[r], r, count, CUBE_DTYPE_F32, 0);
        CONF_OK(cube_empty(c[r], count * 4, &dst[r]));
    }
    CONF_OK(group_all_reduce(comm, src, dst, n, count, CUBE_DTYPE_F32,
                             CUBE_REDUCE_SUM));
    /* Another thread (its own stream) reads rank 0's result at once. */
    reader_job j = {c[0], dst[0], {0}, count, NULL, malloc((size_t)count * 4)};
    assert_non_null(j.seen);
    CONF_OK(cube_empty(c[0], count * 4, &j.y));
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, scale_on_another_stream, &j), 0);
    pthread_join(t, NULL);
    CONF_OK(j.err);
    float *got = read_all(c[0], j.y, count * 4);
    for (uint32_t i = 0; i < count; i++) {
        float sum = (float)reference(CUBE_REDUCE_SUM, n, i, CUBE_DTYPE_F32);
        if (got[i] != 2.0f * sum || j.seen[i] != sum)
            fail_msg("element %u is %g (read %g)", i, got[i], j.seen[i]);
    }
    free(got);
    free(j.seen);
    CONF_OK(cube_handle_release(c[0], j.y));
    for (uint32_t r = 0; r < n; r++) {
        CONF_OK(cube_handle_release(c[r], src[r]));
        CONF_OK(cube_handle_release(c[r], dst[r]));
        cube_comm_destroy(comm[r]);
    }
    close_ranks(c, n);
}

/* ---------------------------------------- collectives in graph captures */

/* A step: a = 2x (kernel), b = the all-reduce of a, y = 3b (kernel). Each
 * rank captures it on its own thread and replays it there. */
enum { G_REPLAY, G_MIXED, G_MISMATCH, G_RING };
#define G_COUNT 1000u
static int graph_mode;

static cube_error *g_scale(cube_client *c, cube_handle x, cube_handle y,
                           float a)
{
    cube_arg args[3] = {cube_arg_buffer(x), cube_arg_buffer(y),
                        cube_arg_f32(a)};
    return cube_launch(c, conf.k.scale,
                       cube_count_static(conf_div_up(G_COUNT, 64), 1, 1), args,
                       3, 0);
}

static cube_error *g_step(rank_job *job, const cube_handle *h, uint64_t count)
{
    cube_error *err = g_scale(job->client, h[0], h[1], 2.0f);
    if (!err)
        err = cube_all_reduce(job->comm, h[1], h[2], count, CUBE_DTYPE_F32,
                              CUBE_REDUCE_SUM);
    if (!err)
        err = g_scale(job->client, h[2], h[3], 3.0f);
    return err;
}

/* Rank r's input in round k, and y's expected element i. */
static float g_x(uint32_t k, uint32_t r, uint64_t i)
{
    return (float)(k * 100 + r * 10 + i % 7);
}

static int g_write_x(rank_job *job, cube_handle x, uint32_t k)
{
    float host[G_COUNT];
    for (uint64_t i = 0; i < G_COUNT; i++)
        host[i] = g_x(k, job->rank, i);
    cube_copy_desc d = cube_copy_desc_contiguous(x, sizeof host, 1);
    const void *src[1] = {host};
    uint64_t size[1] = {sizeof host};
    return job_ok(job, cube_write(job->client, &d, src, size, 1), "write x");
}

/* y after a step of round k over `count` elements (the rest as round
 * `rest_k` left them). */
static void g_expect_y(rank_job *job, cube_handle y, uint32_t k, uint64_t count,
                       uint32_t rest_k, const char *what)
{
    float want[G_COUNT];
    for (uint64_t i = 0; i < G_COUNT; i++) {
        float s = 0;
        for (uint32_t q = 0; q < job->n; q++)
            s += 2.0f * g_x(i < count ? k : rest_k, q, i);
        want[i] = 3.0f * s;
    }
    job_expect(job, y, sizeof want, want, what);
}

static void g_expect_code(rank_job *job, cube_error *err, cube_code code,
                          const char *what)
{
    JOB_CHECK(job, cube_error_code(err) == code,
              "rank %u: %s: code %d, expected %d (%s)", job->rank, what,
              (int)cube_error_code(err), (int)code,
              err ? cube_error_message(err) : "no error");
    cube_error_free(err);
}

/* A ring step in one group: each rank sends a = 2x to the next rank and
 * receives the previous rank's into b; then y = 3b. Without the group
 * each rank's send would wait for a receive its peer has not made. */
static cube_error *g_ring(rank_job *job, const cube_handle *h)
{
    uint32_t next = (job->rank + 1) % job->n,
             prev = (job->rank + job->n - 1) % job->n;
    cube_error *err = g_scale(job->client, h[0], h[1], 2.0f);
    if (err)
        return err;
    CONF_OK(cube_group_begin());
    cube_error *s = cube_send(job->comm, h[1], G_COUNT, CUBE_DTYPE_F32, next);
    cube_error *r = cube_recv(job->comm, h[2], G_COUNT, CUBE_DTYPE_F32, prev);
    err = cube_group_end();
    if (!err)
        err = s ? s : r;
    if (err != s)
        cube_error_free(s);
    if (err != r)
        cube_error_free(r);
    if (!err)
        err = g_scale(job->client, h[2], h[3], 3.0f);
    return err;
}

/* Prepares, warms up with the step once, and captures it. */
static int g_capture(rank_job *job, const cube_handle *h, uint64_t count,
                     cube_graph_id *id)
{
    cube_client *c = job->client;
    return job_ok(job, cube_graph_prepare(c), "prepare") &&
           job_ok(job, g_step(job, h, count), "warm-up") &&
           job_ok(job, cube_graph_begin(c), "begin") &&
           job_ok(job, g_step(job, h, count), "captured step") &&
           job_ok(job, cube_graph_end(c, id), "end");
}

static void *graph_body(void *arg)
{
    rank_job *job = arg;
    cube_client *c = job->client;
    uint32_t r = job->rank;
    cube_handle h[4] = {{0}};
    cube_graph_id id = 0, other = 0;
    for (int i = 0; i < 4; i++)
        if (!job_ok(job, cube_empty(c, G_COUNT * 4, &h[i]), "empty"))
            goto out;
    if (!g_write_x(job, h[0], 0))
        goto out;
    switch (graph_mode) {
    case G_REPLAY:
        if (!g_capture(job, h, G_COUNT, &id))
            break;
        for (uint32_t k = 1; k <= 3; k++) {
            /* New inputs; the replay reads them and rewrites y. */
            if (!g_write_x(job, h[0], k) ||
                !job_ok(job, cube_graph_replay(c, id), "replay"))
                break;
            g_expect_y(job, h[3], k, G_COUNT, k, "y after a replay");
        }
        break;
    case G_MIXED: {
        /* Rank 0 captures, the others call: every rank is refused before
         * a byte moves, and the communicator goes on. */
        job_ok(job, g_step(job, h, G_COUNT), "step");
        float junk[G_COUNT];
        for (uint64_t i = 0; i < G_COUNT; i++)
            junk[i] = -1.0f;
        cube_copy_desc d = cube_copy_desc_contiguous(h[2], sizeof junk, 1);
        const void *src[1] = {junk};
        uint64_t size[1] = {sizeof junk};
        job_ok(job, cube_write(c, &d, src, size, 1), "write b");
        if (r == 0) {
            job_ok(job, cube_graph_prepare(c), "prepare");
            job_ok(job, cube_graph_begin(c), "begin");
        }
        g_expect_code(job,
                      cube_all_reduce(job->comm, h[1], h[2], G_COUNT,
                                      CUBE_DTYPE_F32, CUBE_REDUCE_SUM),
                      CUBE_ERR_GRAPH_STATE, "all-reduce, one rank capturing");
        if (r == 0 && job_ok(job, cube_graph_end(c, &id), "end"))
            job_ok(job, cube_graph_destroy(c, id), "destroy");
        id = 0;
        job_ok(job, cube_check(c, &h[2], 1), "b after the refusal");
        job_expect(job, h[2], sizeof junk, junk, "b untouched");
        if (job_ok(job, g_step(job, h, G_COUNT), "step after the refusal"))
            g_expect_y(job, h[3], 0, G_COUNT, 0, "y after the refusal");
        break;
    }
    case G_RING: {
        /* The ring's group captured on every rank and replayed there. */
        if (!job_ok(job, cube_graph_prepare(c), "prepare") ||
            !job_ok(job, g_ring(job, h), "warm-up ring") ||
            !job_ok(job, cube_graph_begin(c), "begin") ||
            !job_ok(job, g_ring(job, h), "captured ring") ||
            !job_ok(job, cube_graph_end(c, &id), "end"))
            break;
        uint32_t prev = (r + job->n - 1) % job->n;
        for (uint32_t k = 1; k <= 3; k++) {
            if (!g_write_x(job, h[0], k) ||
                !job_ok(job, cube_graph_replay(c, id), "replay"))
                break;
            float want[G_COUNT];
            for (uint64_t i = 0; i < G_COUNT; i++)
                want[i] = 3.0f * 2.0f * g_x(k, prev, i);
            job_expect(job, h[3], sizeof want, want, "y after a ring replay");
        }
        break;
    }
    case G_MISMATCH:
        /* Two graphs with all-reduces of different counts: rank 0
         * replays one and the others the other; every rank is refused. */
        if (!g_capture(job, h, G_COUNT, &id) ||
            !g_capture(job, h, G_COUNT / 2, &other))
            break;
        g_expect_code(job, cube_graph_replay(c, r == 0 ? id : other),
                      CUBE_ERR_INVALID_ARGUMENT, "mismatched replays");
        for (uint32_t k = 1; k <= 2; k++) {
            if (!g_write_x(job, h[0], k) ||
                !job_ok(job, cube_graph_replay(c, k == 1 ? id : other),
                        "replay after the mismatch"))
                break;
            /* The short graph leaves the rest of y as the last long one
             * made it. */
            g_expect_y(job, h[3], k, k == 1 ? G_COUNT : G_COUNT / 2, 1,
                       "y after a replay");
        }
        break;
    }
out:
    if (id)
        job_ok(job, cube_graph_destroy(c, id), "destroy");
    if (other)
        job_ok(job, cube_graph_destroy(c, other), "destroy");
    for (int i = 0; i < 4; i++)
        if (h[i].bits)
            job_ok(job, cube_handle_release(c, h[i]), "release");
    return NULL;
}

/* A graph holds its collectives' communicator: after the rank's destroy
 * (or an abort) a replay is refused, and the graph still goes cleanly
 * afterwards (on CUDA the NCCL communicator of a hardware graph is
 * destroyed then). One rank, so it runs on a single device too. */
static void graph_outlives_comm(int abort_first)
{
    cube_client *c[MAX_TEST_RANKS];
    uint32_t n = open_ranks(1, c);
    cube_comm *comm[MAX_TEST_RANKS];
    cube_comm_options o = quick(60000);
    CONF_OK(cube_comm_init_all(c, n, &o, comm));
    cube_handle h[4];
    for (int i = 0; i < 4; i++)
        CONF_OK(cube_empty(c[0], G_COUNT * 4, &h[i]));
    float x[G_COUNT], got[G_COUNT];
    for (uint64_t i = 0; i < G_COUNT; i++)
        x[i] = (float)(i % 13);
    CONF_OK(cube_write_all(c[0], h[0], x, sizeof x));
    rank_job job = {0};
    job.client = c[0];
    job.comm = comm[0];
    job.n = 1;
    cube_graph_id id = 0;
    CONF_OK(cube_graph_prepare(c[0]));
    CONF_OK(g_step(&job, h, G_COUNT));
    CONF_OK(cube_graph_begin(c[0]));
    CONF_OK(g_step(&job, h, G_COUNT));
    CONF_OK(cube_graph_end(c[0], &id));
    CONF_OK(cube_graph_replay(c[0], id));
    CONF_OK(cube_read_all(c[0], h[3], got, sizeof got));
    for (uint64_t i = 0; i < G_COUNT; i++)
        if (got[i] != 6.0f * x[i])
            fail_msg("y[%llu] is %g", (unsigned long long)i, got[i]);
    if (abort_first) {
        CONF_OK(cube_comm_abort(comm[0]));
        CONF_EXPECT(cube_graph_replay(c[0], id), CUBE_ERR_ABORTED);
    } else {
        cube_comm_destroy(comm[0]);
        comm[0] = NULL;
        CONF_EXPECT(cube_graph_replay(c[0], id), CUBE_ERR_NOT_FOUND);
    }
    /* The refused replay's outputs cannot be trusted; the client goes on. */
    CONF_EXPECT(cube_check(c[0], &h[3], 1), CUBE_ERR_SEVERAL);
    CONF_OK(cube_graph_destroy(c[0], id));
    CONF_OK(g_scale(c[0], h[0], h[3], 5.0f));
    CONF_OK(cube_read_all(c[0], h[3], got, sizeof got));
    for (uint64_t i = 0; i < G_COUNT; i++)
        if (got[i] != 5.0f * x[i])
            fail_msg("y[%llu] is %g after the graph", (unsigned long long)i,
                     got[i]);
    for (int i = 0; i < 4; i++)
        CONF_OK(cube_handle_release(c[0], h[i]));
    if (comm[0])
        cube_comm_destroy(comm[0]);
    close_ranks(c, n);
}

static void graph_run(int mode, uint32_t want)
{
    cube_client *c[MAX_TEST_RANKS];
    uint32_t n = open_ranks(want, c);
    /* The plain replay and the ring (on one rank, sends to itself) run
     * on fewer ranks too. */
    if (n < want && mode != G_REPLAY && mode != G_RING) {
        close_ranks(c, n);
        print_message("skipped: fewer devices than ranks\n");
        skip();
    }
    cube_comm *comm[MAX_TEST_RANKS];
    cube_comm_options o = quick(60000);
    CONF_OK(cube_comm_init_all(c, n, &o, comm));
    graph_mode = mode;
    run_rank_threads(comm, c, n, graph_body);
    for (uint32_t r = 0; r < n; r++)
        cube_comm_destroy(comm[r]);
    close_ranks(c, n);
}

CONF_TEST_NEEDS(comm_graph_step_with_all_reduce_replays_like_the_host,
                CUBE_FEATURE_KERNELS | CUBE_FEATURE_GRAPHS |
                    CUBE_FEATURE_COLLECTIVES)
{
    graph_run(G_REPLAY, 3);
}

CONF_TEST_NEEDS(comm_graph_group_of_sends_and_receives_replays_as_a_group,
                CUBE_FEATURE_KERNELS | CUBE_FEATURE_GRAPHS |
                    CUBE_FEATURE_COLLECTIVES)
{
    graph_run(G_RING, 3);
}

/* The ring on one rank: each replay sends to itself and receives it. */
CONF_TEST_NEEDS(comm_graph_ring_on_one_rank_replays_its_send_to_itself,
                CUBE_FEATURE_KERNELS | CUBE_FEATURE_GRAPHS |
                    CUBE_FEATURE_COLLECTIVES)
{
    graph_run(G_RING, 1);
}

/* One thread captures a group that drives every rank (each rank's client
 * capturing on that thread); each rank then replays its own graph on a
 * thread of its own. */
typedef struct driven {
    cube_client *c;
    cube_graph_id id;
    cube_error *err;
} driven;

static void *replay_driven(void *arg)
{
    driven *d = arg;
    d->err = cube_graph_replay(d->c, d->id);
    return NULL;
}

CONF_TEST_NEEDS(comm_graph_group_driven_by_one_thread_replays_per_rank,
                CUBE_FEATURE_GRAPHS | CUBE_FEATURE_COLLECTIVES)
{
    cube_client *c[MAX_TEST_RANKS];
    uint32_t n = open_ranks(3, c);
    cube_comm *comm[MAX_TEST_RANKS];
    cube_comm_options o = quick(60000);
    CONF_OK(cube_comm_init_all(c, n, &o, comm));
    cube_handle x[MAX_TEST_RANKS], y[MAX_TEST_RANKS];
    float host[G_COUNT];
    for (uint32_t r = 0; r < n; r++) {
        CONF_OK(cube_empty(c[r], sizeof host, &x[r]));
        CONF_OK(cube_empty(c[r], sizeof host, &y[r]));
        CONF_OK(cube_graph_prepare(c[r]));
    }
    /* Warm-up, then the capture: every rank's all-reduce in one group. */
    driven d[MAX_TEST_RANKS];
    for (int pass = 0; pass < 2; pass++) {
        if (pass)
            for (uint32_t r = 0; r < n; r++)
                CONF_OK(cube_graph_begin(c[r]));
        CONF_OK(cube_group_begin());
        for (uint32_t r = 0; r < n; r++)
            CONF_OK(cube_all_reduce(comm[r], x[r], y[r], G_COUNT,
                                    CUBE_DTYPE_F32, CUBE_REDUCE_SUM));
        CONF_OK(cube_group_end());
    }
    for (uint32_t r = 0; r < n; r++) {
        d[r].c = c[r];
        CONF_OK(cube_graph_end(c[r], &d[r].id));
    }
    for (uint32_t k = 1; k <= 2; k++) {
        for (uint32_t r = 0; r < n; r++) {
            for (uint64_t i = 0; i < G_COUNT; i++)
                host[i] = g_x(k, r, i);
            CONF_OK(cube_write_all(c[r], x[r], host, sizeof host));
        }
        pthread_t t[MAX_TEST_RANKS];
        for (uint32_t r = 0; r < n; r++)
            assert_int_equal(pthread_create(&t[r], NULL, replay_driven, &d[r]),
                             0);
        for (uint32_t r = 0; r < n; r++) {
            pthread_join(t[r], NULL);
            CONF_OK(d[r].err);
        }
        for (uint32_t r = 0; r < n; r++) {
            float got[G_COUNT];
            CONF_OK(cube_read_all(c[r], y[r], got, sizeof got));
            for (uint64_t i = 0; i < G_COUNT; i++) {
                float want = 0;
                for (uint32_t q = 0; q < n; q++)
                    want += g_x(k, q, i);
                if (got[i] != want)
                    fail_msg("rank %u: y[%llu] is %g, not %g", r,
                             (unsigned long long)i, got[i], want);
            }
        }
    }
    for (uint32_t r = 0; r < n; r++) {
        CONF_OK(cube_graph_destroy(c[r], d[r].id));
        CONF_OK(cube_handle_release(c[r], x[r]));
        CONF_OK(cube_handle_release(c[r], y[r]));
        cube_comm_destroy(comm[r]);
    }
    close_ranks(c, n);
}

CONF_TEST_NEEDS(comm_graph_capture_on_one_rank_only_is_refused_on_every_rank,
                CUBE_FEATURE_KERNELS | CUBE_FEATURE_GRAPHS |
                    CUBE_FEATURE_COLLECTIVES)
{
    graph_run(G_MIXED, 2);
}

/* The step of every rank, driven from one thread: the all-reduces meet in
 * one group, so none of them waits for a peer's thread. */
static void g_step_all(cube_client **c, cube_comm **comm, cube_handle (*h)[4],
                       uint32_t n)
{
    for (uint32_t r = 0; r < n; r++)
        CONF_OK(g_scale(c[r], h[r][0], h[r][1], 2.0f));
    CONF_OK(cube_group_begin());
    for (uint32_t r = 0; r < n; r++)
        CONF_OK(cube_all_reduce(comm[r], h[r][1], h[r][2], G_COUNT,
                                CUBE_DTYPE_F32, CUBE_REDUCE_SUM));
    CONF_OK(cube_group_end());
    for (uint32_t r = 0; r < n; r++)
        CONF_OK(g_scale(c[r], h[r][2], h[r][3], 3.0f));
}

/* Rank 1 destroys its graph without replaying it: rank 0's replay times
 * out and its outputs carry the failure, rank 1's late call meets the same
 * answer, and both go on. One thread drives both ranks and every call
 * meant to meet its peer is in a group, so only the calls meant to time
 * out can: a busy machine cannot make the others late for the short
 * timeout. */
CONF_TEST_NEEDS(comm_graph_replay_without_the_peer_times_out_and_marks_outputs,
                CUBE_FEATURE_KERNELS | CUBE_FEATURE_GRAPHS |
                    CUBE_FEATURE_COLLECTIVES)
{
    cube_client *c[MAX_TEST_RANKS];
    uint32_t n = open_ranks(2, c);
    if (n < 2) {
        close_ranks(c, n);
        print_message("skipped: one device, no peer to wait for\n");
        skip();
    }
    cube_comm *comm[MAX_TEST_RANKS];
    cube_comm_options o = quick(200);
    CONF_OK(cube_comm_init_all(c, n, &o, comm));
    cube_handle h[2][4];
    cube_graph_id id[2];
    float host[G_COUNT];
    for (uint32_t r = 0; r < n; r++) {
        for (int i = 0; i < 4; i++)
            CONF_OK(cube_empty(c[r], sizeof host, &h[r][i]));
        for (uint64_t i = 0; i < G_COUNT; i++)
            host[i] = g_x(0, r, i);
        CONF_OK(cube_write_all(c[r], h[r][0], host, sizeof host));
        CONF_OK(cube_graph_prepare(c[r]));
    }
    /* Warm-up, then the capture. */
    g_step_all(c, comm, h, n);
    for (uint32_t r = 0; r < n; r++)
        CONF_OK(cube_graph_begin(c[r]));
    g_step_all(c, comm, h, n);
    for (uint32_t r = 0; r < n; r++)
        CONF_OK(cube_graph_end(c[r], &id[r]));
    CONF_OK(cube_graph_destroy(c[1], id[1]));
    CONF_EXPECT_MSG(cube_graph_replay(c[0], id[0]), CUBE_ERR_TIMEOUT,
                    "1 of 2 ranks");
    CONF_EXPECT(cube_check(c[0], &h[0][3], 1), CUBE_ERR_SEVERAL);
    /* The late rank's call meets the timed-out one's answer. */
    CONF_EXPECT(cube_all_reduce(comm[1], h[1][1], h[1][2], G_COUNT,
                                CUBE_DTYPE_F32, CUBE_REDUCE_SUM),
                CUBE_ERR_TIMEOUT);
    /* Then the step runs again on both. */
    g_step_all(c, comm, h, n);
    for (uint32_t r = 0; r < n; r++) {
        float got[G_COUNT];
        CONF_OK(cube_read_all(c[r], h[r][3], got, sizeof got));
        for (uint64_t i = 0; i < G_COUNT; i++) {
            float want = 0;
            for (uint32_t q = 0; q < n; q++)
                want += 2.0f * g_x(0, q, i);
            want *= 3.0f;
            if (got[i] != want)
                fail_msg("rank %u: y[%llu] is %g after the timeout, not %g", r,
                         (unsigned long long)i, got[i], want);
        }
    }
    CONF_OK(cube_graph_destroy(c[0], id[0]));
    for (uint32_t r = 0; r < n; r++) {
        for (int i = 0; i < 4; i++)
            CONF_OK(cube_handle_release(c[r], h[r][i]));
        cube_comm_destroy(comm[r]);
    }
    close_ranks(c, n);
}

CONF_TEST_NEEDS(comm_graph_mismatched_replays_are_refused_on_every_rank,
                CUBE_FEATURE_KERNELS | CUBE_FEATURE_GRAPHS |
                    CUBE_FEATURE_COLLECTIVES)
{
    graph_run(G_MISMATCH, 2);
}

CONF_TEST_NEEDS(comm_graph_replay_after_the_comm_is_destroyed_is_refused,
                CUBE_FEATURE_KERNELS | CUBE_FEATURE_GRAPHS |
                    CUBE_FEATURE_COLLECTIVES)
{
    graph_outlives_comm(0);
}

CONF_TEST_NEEDS(comm_graph_replay_after_an_abort_is_refused,
                CUBE_FEATURE_KERNELS | CUBE_FEATURE_GRAPHS |
                    CUBE_FEATURE_COLLECTIVES)
{
    graph_outlives_comm(1);
}

/* ------------------------------------------------ ids between processes */

CONF_TEST(comm_ids_round_trip_and_bad_ids_and_ranks_are_refused)
{
    cube_comm_id id, back;
    cube_error *err = cube_comm_id_new(conf.backend, &id);
    if (cube_error_code(err) == CUBE_ERR_UNSUPPORTED ||
        cube_error_code(err) == CUBE_ERR_UNAVAILABLE) {
        print_message("skipped: %s\n", cube_error_message(err));
        cube_error_free(err);
        skip();
    }
    CONF_OK(err);
    char text[CUBE_COMM_ID_TEXT];
    CONF_OK(cube_comm_id_format(&id, text, sizeof text));
    assert_int_equal(strlen(text), CUBE_COMM_ID_TEXT - 1);
    /* A file's trailing newline is fine. */
    char line[CUBE_COMM_ID_TEXT + 2];
    snprintf(line, sizeof line, "%s\n", text);
    CONF_OK(cube_comm_id_parse(line, &back));
    assert_memory_equal(&id, &back, sizeof id);
    /* Two ids differ. */
    cube_comm_id other;
    CONF_OK(cube_comm_id_new(conf.backend, &other));
    assert_memory_not_equal(&id, &other, sizeof id);

    CONF_EXPECT(cube_comm_id_new(NULL, &id), CUBE_ERR_INVALID_ARGUMENT);
    CONF_EXPECT(cube_comm_id_new(conf.backend, NULL),
                CUBE_ERR_INVALID_ARGUMENT);
    CONF_EXPECT(cube_comm_id_new("nope", &other), CUBE_ERR_NOT_FOUND);
    CONF_EXPECT(cube_comm_id_format(&id, text, 10), CUBE_ERR_INVALID_ARGUMENT);
    CONF_EXPECT(cube_comm_id_format(NULL, text, sizeof text),
                CUBE_ERR_INVALID_ARGUMENT);
    CONF_EXPECT(cube_comm_id_parse(NULL, &back), CUBE_ERR_INVALID_ARGUMENT);
    CONF_EXPECT(cube_comm_id_parse("cubert-comm:00", &back),
                CUBE_ERR_INVALID_ARGUMENT);
    char bad[CUBE_COMM_ID_TEXT];
    memcpy(bad, text, sizeof bad);
    bad[20] = 'x';
    CONF_EXPECT_MSG(cube_comm_id_parse(bad, &back), CUBE_ERR_INVALID_ARGUMENT,
                    "hexadecimal");
    memcpy(bad, text, sizeof bad);
    bad[12] = bad[12] == '0' ? '1' : '0'; /* the magic */
    CONF_EXPECT(cube_comm_id_parse(bad, &back), CUBE_ERR_INVALID_ARGUMENT);

    /* Ranks, ids and options refused before anything is started. */
    cube_comm *comm = (cube_comm *)&id;
    CONF_EXPECT(cube_comm_init_rank(NULL, &id, 2, 0, NULL, &comm),
                CUBE_ERR_INVALID_ARGUMENT);
    assert_null(comm);
    CONF_EXPECT(cube_comm_init_rank(conf.client, NULL, 2, 0, NULL, &comm),
                CUBE_ERR_INVALID_ARGUMENT);
    CONF_EXPECT(cube_comm_init_rank(conf.client, &id, 2, 0, NULL, NULL),
                CUBE_ERR_INVALID_ARGUMENT);
    CONF_EXPECT_MSG(cube_comm_init_rank(conf.client, &id, 2, 2, NULL, &comm),
                    CUBE_ERR_INVALID_ARGUMENT, "rank 2 of 2");
    CONF_EXPECT(cube_comm_init_rank(conf.client, &id, 0, 0, NULL, &comm),
                CUBE_ERR_INVALID_ARGUMENT);
    cube_comm_options bad_size = cube_comm_options_default();
    bad_size.struct_size = 1;
    CONF_EXPECT(cube_comm_init_rank(conf.client, &id, 2, 0, &bad_size, &comm),
                CUBE_ERR_INVALID_ARGUMENT);
    cube_comm_id forged = id;
    forged.bytes[0] ^= 1;
    CONF_EXPECT_MSG(
        cube_comm_init_rank(conf.client, &forged, 2, 0, NULL, &comm),
        CUBE_ERR_INVALID_ARGUMENT, "cube_comm_id_new");
    /* An id of another backend (cpu, where it makes ids here). */
    if (strcmp(conf.props.backend, "cpu") != 0) {
        cube_comm_id cpu_id;
        cube_error *no_id = cube_comm_id_new("cpu", &cpu_id);
        if (!no_id)
            CONF_EXPECT_MSG(
                cube_comm_init_rank(conf.client, &cpu_id, 2, 0, NULL, &comm),
                CUBE_ERR_INVALID_ARGUMENT, "backend");
        cube_error_free(no_id);
    }
    assert_null(comm);
    if (conf_backend_skips_rest("lone_rank_between_processes_is_an_mpi_job"))
        return;

    /* A communicator between processes of one rank, on this device: the
     * engine's own path (NCCL's unique id on CUDA). */
    CONF_OK(cube_comm_init_rank(conf.client, &id, 1, 0, NULL, &comm));
    assert_non_null(comm);
    cube_handle h = filled(conf.client, 0, 64, CUBE_DTYPE_F32, 0);
    cube_handle d;
    CONF_OK(cube_empty(conf.client, 64 * 4, &d));
    CONF_OK(cube_all_reduce(comm, h, d, 64, CUBE_DTYPE_F32, CUBE_REDUCE_SUM));
    expect_reduced(conf.client, d, 64, CUBE_DTYPE_F32, CUBE_REDUCE_SUM, 1, 0,
                   "one rank between processes");
    /* A refused call is this rank's answer; the engine cannot tell the
     * other processes, so the communicator is aborted. */
    CONF_EXPECT(cube_all_reduce(comm, h, d, 0, CUBE_DTYPE_F32, CUBE_REDUCE_SUM),
                CUBE_ERR_INVALID_ARGUMENT);
    CONF_EXPECT(
        cube_all_reduce(comm, h, d, 64, CUBE_DTYPE_F32, CUBE_REDUCE_SUM),
        CUBE_ERR_ABORTED);
    conf_release(h);
    conf_release(d);
    cube_comm_destroy(comm);
}

/* ---------------------------------------- a job's place from its launcher */

static const char *const job_vars[] = {"OMPI_COMM_WORLD_RANK",
                                       "OMPI_COMM_WORLD_SIZE",
                                       "OMPI_COMM_WORLD_LOCAL_RANK",
                                       "RANK",
                                       "WORLD_SIZE",
                                       "LOCAL_RANK",
                                       "SLURM_PROCID",
                                       "SLURM_NTASKS",
                                       "SLURM_LOCALID"};
#define JOB_VARS (sizeof job_vars / sizeof job_vars[0])

static void job_env_clear(void)
{
    for (size_t i = 0; i < JOB_VARS; i++)
        unsetenv(job_vars[i]);
}

/* Sets "NAME=value" pairs (a value NULL leaves NAME unset). */
static void job_env(const char *const *pairs, size_t n)
{
    job_env_clear();
    for (size_t i = 0; i + 1 < n; i += 2)
        if (pairs[i + 1])
            setenv(pairs[i], pairs[i + 1], 1);
}

static void expect_job(uint32_t rank, uint32_t size, uint32_t local,
                       const char *launcher)
{
    cube_comm_job job;
    CONF_OK(cube_comm_job_from_env(&job));
    assert_int_equal(job.rank, rank);
    assert_int_equal(job.size, size);
    assert_int_equal(job.local_rank, local);
    assert_string_equal(job.launcher, launcher);
}

/* The documented order, the inner launcher's values, and a clear error
 * for each hostile value (the message naming the variable), *out zeroed;
 * the process's own environment comes back afterwards. */
CONF_TEST(comm_job_from_the_launchers_environment_in_order_hostile_refused)
{
    char *saved[JOB_VARS];
    for (size_t i = 0; i < JOB_VARS; i++) {
        const char *v = getenv(job_vars[i]);
        saved[i] = v ? strdup(v) : NULL;
    }
    CONF_EXPECT(cube_comm_job_from_env(NULL), CUBE_ERR_INVALID_ARGUMENT);
    job_env_clear();
    CONF_EXPECT_MSG(cube_comm_job_from_env(&(cube_comm_job){0}),
                    CUBE_ERR_NOT_FOUND, "OMPI_COMM_WORLD_RANK");
    const char *ompi[] = {"OMPI_COMM_WORLD_RANK",       "3",
                          "OMPI_COMM_WORLD_SIZE",       "4",
                          "OMPI_COMM_WORLD_LOCAL_RANK", "1"};
    job_env(ompi, 6);
    expect_job(3, 4, 1, "Open MPI");
    const char *torch[] = {"RANK", "5", "WORLD_SIZE", "8", "LOCAL_RANK", "1"};
    job_env(torch, 6);
    expect_job(5, 8, 1, "torchrun");
    const char *slurm[] = {"SLURM_PROCID", "0", "SLURM_NTASKS", "1"};
    job_env(slurm, 4);
    expect_job(0, 1, 0, "Slurm"); /* no local rank: the rank */
    /* Launchers that disagree: the inner one's values (torchrun under
     * srun; mpirun with torchrun's names left in the environment). */
    const char *nested[] = {"SLURM_PROCID",  "1", "SLURM_NTASKS", "2",
                            "SLURM_LOCALID", "0", "RANK",         "6",
                            "WORLD_SIZE",    "8", "LOCAL_RANK",   "2"};
    job_env(nested, 12);
    expect_job(6, 8, 2, "torchrun");
    const char *stale[] = {"RANK",
                           "0",
                           "WORLD_SIZE",
                           "2",
                           "OMPI_COMM_WORLD_RANK",
                           "1",
                           "OMPI_COMM_WORLD_SIZE",
                           "2"};
    job_env(stale, 8);
    expect_job(1, 2, 1, "Open MPI");
    /* Hostile values of the launcher read: never a fall-through to the
     * next launcher, never a number made up. */
    static const struct {
        const char *rank, *size, *local, *needle;
    } bad[] = {
        {"x", "4", NULL, "RANK"},          {"-1", "4", NULL, "RANK"},
        {"1", "-4", NULL, "WORLD_SIZE"},   {" 1", "4", NULL, "RANK"},
        {"1", "4 ", NULL, "WORLD_SIZE"},   {"+1", "4", NULL, "RANK"},
        {"", "4", NULL, "RANK"},           {"4", "4", NULL, "RANK=4"},
        {"9", "4", NULL, "RANK=9"},        {"0", "0", NULL, "WORLD_SIZE=0"},
        {"0", "1025", NULL, "WORLD_SIZE"}, {"0", "99999999999", NULL, "WORLD"},
        {"1", NULL, NULL, "WORLD_SIZE"},   {NULL, "4", NULL, "RANK"},
        {"1", "4", "4", "LOCAL_RANK"},     {"1", "4", "one", "LOCAL_RANK"},
        {"1", "4", "", "LOCAL_RANK"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        const char *pairs[] = {
            "RANK",         bad[i].rank,  "WORLD_SIZE",   bad[i].size,
            "LOCAL_RANK",   bad[i].local, "SLURM_PROCID", "0",
            "SLURM_NTASKS", "1"};
        job_env(pairs, 10);
        cube_comm_job job;
        memset(&job, 0xAB, sizeof job);
        CONF_EXPECT_MSG(cube_comm_job_from_env(&job), CUBE_ERR_INVALID_ARGUMENT,
                        bad[i].needle);
        assert_int_equal(job.rank, 0);
        assert_int_equal(job.size, 0);
        assert_null(job.launcher);
    }
    const char *bad_ompi[] = {"OMPI_COMM_WORLD_RANK",       "1",
                              "OMPI_COMM_WORLD_SIZE",       "2",
                              "OMPI_COMM_WORLD_LOCAL_RANK", "2"};
    job_env(bad_ompi, 6);
    CONF_EXPECT_MSG(cube_comm_job_from_env(&(cube_comm_job){0}),
                    CUBE_ERR_INVALID_ARGUMENT, "OMPI_COMM_WORLD_LOCAL_RANK");
    job_env_clear();
    for (size_t i = 0; i < JOB_VARS; i++) {
        if (saved[i])
            setenv(job_vars[i], saved[i], 1);
        free(saved[i]);
    }
}
