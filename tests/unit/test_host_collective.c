/* The host engine of collectives (backends/common/host_collective.c),
 * driven directly: results of every kind against a plain loop, below and
 * above the size from which destinations are written with streaming
 * stores, with the ranks' calls made by one thread and by several.
 *
 * Then the core's group queue on the CPU backend when memory runs out:
 * this executable is linked with -Wl,--wrap=realloc (tests/CMakeLists.txt),
 * so the library's reallocs come through __wrap_realloc below, which can
 * refuse the next one. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "backends/common/host_memory.h"
#include "cubert/comm.h"
#include "cubert/cubert.h"

void *__real_realloc(void *p, size_t n);
void *__wrap_realloc(void *p, size_t n);

/* fail_next: refuse the next realloc; every one is counted, and the
 * refused one's number kept. */
static int fail_next;
static unsigned reallocs, refused_as;

void *__wrap_realloc(void *p, size_t n)
{
    reallocs++;
    if (fail_next) {
        fail_next = 0;
        refused_as = reallocs;
        return NULL;
    }
    return __real_realloc(p, n);
}

#define RANKS 2

typedef struct rank_bufs {
    cube_storage src, dst;
    float *s, *d;
} rank_bufs;

static void make(rank_bufs *b, uint64_t src_elems, uint64_t dst_elems,
                 uint32_t rank)
{
    /* aligned_alloc wants a size that is a multiple of the alignment */
    b->s = aligned_alloc(64, (src_elems * 4 + 63) & ~(uint64_t)63);
    b->d = aligned_alloc(64, (dst_elems * 4 + 63) & ~(uint64_t)63);
    assert_non_null(b->s);
    assert_non_null(b->d);
    for (uint64_t i = 0; i < src_elems; i++)
        b->s[i] = (float)(rank + 1) * (float)(i % 1000);
    memset(b->d, 0xEE, dst_elems * 4);
    b->src = (cube_storage){(uint64_t)(uintptr_t)b->s, src_elems * 4, NULL};
    b->dst = (cube_storage){(uint64_t)(uintptr_t)b->d, dst_elems * 4, NULL};
}

static void give_back(rank_bufs *b)
{
    free(b->s);
    free(b->d);
}

typedef struct job {
    cube_collective_set set;
    cube_server_stream stream;
} job;

static void *run(void *arg)
{
    job *j = arg;
    assert_null(host_collective(NULL, &j->stream, NULL, &j->set));
    return NULL;
}

/* Runs `kind` over RANKS ranks of `count` elements, from one thread or one
 * thread per rank. */
static void collective(cube_collective_kind kind, uint64_t count, rank_bufs *b,
                       int threads)
{
    cube_collective calls[RANKS];
    memset(calls, 0, sizeof calls);
    for (uint32_t r = 0; r < RANKS; r++) {
        calls[r].kind = kind;
        calls[r].count = count;
        calls[r].dtype = CUBE_DTYPE_F32;
        calls[r].op = CUBE_REDUCE_SUM;
        calls[r].rank = r;
        calls[r].nranks = RANKS;
        calls[r].src = (cube_binding){&b[r].src, 0, b[r].src.size};
        calls[r].dst = (cube_binding){&b[r].dst, 0, b[r].dst.size};
    }
    _Alignas(64) unsigned char shared[CUBE_COLLECTIVE_SHARED];
    memset(shared, 0, sizeof shared);
    job jobs[RANKS];
    pthread_t t[RANKS];
    for (uint32_t r = 0; r < RANKS; r++) {
        memset(&jobs[r], 0, sizeof jobs[r]);
        jobs[r].set =
            (cube_collective_set){calls, RANKS, r, shared, 0, NULL, NULL};
        if (threads)
            assert_int_equal(pthread_create(&t[r], NULL, run, &jobs[r]), 0);
        else
            run(&jobs[r]);
    }
    for (uint32_t r = 0; threads && r < RANKS; r++)
        pthread_join(t[r], NULL);
}

static void check_all_reduce(uint64_t count, int threads)
{
    rank_bufs b[RANKS];
    for (uint32_t r = 0; r < RANKS; r++)
        make(&b[r], count, count, r);
    collective(CUBE_COLLECTIVE_ALL_REDUCE, count, b, threads);
    for (uint32_t r = 0; r < RANKS; r++)
        for (uint64_t i = 0; i < count; i++)
            if (b[r].d[i] != 3.0f * (float)(i % 1000))
                fail_msg("rank %u element %llu: %g", r, (unsigned long long)i,
                         b[r].d[i]);
    for (uint32_t r = 0; r < RANKS; r++)
        give_back(&b[r]);
}

static void check_reduce_scatter(uint64_t count, int threads)
{
    rank_bufs b[RANKS];
    for (uint32_t r = 0; r < RANKS; r++)
        make(&b[r], count * RANKS, count, r);
    collective(CUBE_COLLECTIVE_REDUCE_SCATTER, count, b, threads);
    for (uint32_t r = 0; r < RANKS; r++)
        for (uint64_t i = 0; i < count; i++)
            if (b[r].d[i] != 3.0f * (float)((r * count + i) % 1000))
                fail_msg("rank %u element %llu: %g", r, (unsigned long long)i,
                         b[r].d[i]);
    for (uint32_t r = 0; r < RANKS; r++)
        give_back(&b[r]);
}

/* 1000 elements stay below the streaming size; 16 Mi floats per rank (64
 * MiB each, 128 MiB written in all) go above it. */
static void test_all_reduce_small_and_streamed(void **state)
{
    (void)state;
    check_all_reduce(1000, 0);
    check_all_reduce(1000, 1);
    check_all_reduce((uint64_t)16 << 20, 1);
    check_all_reduce(((uint64_t)16 << 20) + 3, 0); /* a ragged last chunk */
}

static void test_reduce_scatter_small_and_streamed(void **state)
{
    (void)state;
    check_reduce_scatter(777, 1);
    check_reduce_scatter((uint64_t)16 << 20, 1);
}

/* --- a group's queue out of memory --- */

#define QRANKS 3u
#define QCOUNT 64ull

static void ok(cube_error *err)
{
    if (err) {
        char *text = cube_error_format(err);
        fail_msg("%s", text ? text : "?");
    }
}

static void expect_code(cube_error *err, cube_code code, const char *what)
{
    if (cube_error_code(err) != code)
        fail_msg("%s: code %d (%s), expected %d", what,
                 (int)cube_error_code(err),
                 err ? cube_error_message(err) : "no error", (int)code);
    cube_error_free(err);
}

/* Rank r's source holds r + 1, its destination -1. */
static void fill(cube_client **c, cube_handle *src, cube_handle *dst)
{
    for (uint32_t r = 0; r < QRANKS; r++) {
        float s[QCOUNT], d[QCOUNT];
        for (uint32_t i = 0; i < QCOUNT; i++) {
            s[i] = (float)(r + 1);
            d[i] = -1.0f;
        }
        ok(cube_write_all(c[r], src[r], s, sizeof s));
        ok(cube_write_all(c[r], dst[r], d, sizeof d));
    }
}

/* Every rank's destination holds `want` and carries no failure. */
static void expect_dst(cube_client **c, const cube_handle *dst, float want)
{
    for (uint32_t r = 0; r < QRANKS; r++) {
        float d[QCOUNT];
        ok(cube_check(c[r], &dst[r], 1));
        ok(cube_read_all(c[r], dst[r], d, sizeof d));
        for (uint32_t i = 0; i < QCOUNT; i++)
            if (d[i] != want)
                fail_msg("rank %u: element %u is %g, not %g", r, i, d[i], want);
    }
}

/* Every rank's all-reduce in one group, which runs. */
static void sum_in_a_group(cube_client **c, cube_comm **comm,
                           const cube_handle *src, const cube_handle *dst)
{
    ok(cube_group_begin());
    for (uint32_t r = 0; r < QRANKS; r++)
        ok(cube_all_reduce(comm[r], src[r], dst[r], QCOUNT, CUBE_DTYPE_F32,
                           CUBE_REDUCE_SUM));
    ok(cube_group_end());
    expect_dst(c, dst, 6.0f);
}

/* The call whose place in the group's queue cannot be made: refused at
 * once with CUBE_ERR_OUT_OF_MEMORY (only the queue's realloc failed), the
 * peers' queued calls refused at the group's end instead of waiting for
 * it (the communicator's timeout, an hour, would fail the test by its
 * own limit), nothing recorded on any buffer, and the group and the
 * communicator working on. */
static void
test_a_call_the_group_cannot_queue_is_refused_everywhere(void **state)
{
    (void)state;
    setenv("CUBERT_CPU_DEVICES", "3", 1);
    cube_client *c[QRANKS];
    for (uint32_t r = 0; r < QRANKS; r++) {
        char name[16];
        snprintf(name, sizeof name, "cpu:%u", r);
        ok(cube_client_open(name, NULL, &c[r]));
    }
    cube_comm_options o = cube_comm_options_default();
    o.timeout_ms = 3600u * 1000u;
    cube_comm *comm[QRANKS];
    ok(cube_comm_init_all(c, QRANKS, &o, comm));
    cube_handle src[QRANKS], dst[QRANKS];
    for (uint32_t r = 0; r < QRANKS; r++) {
        ok(cube_empty(c[r], QCOUNT * 4, &src[r]));
        ok(cube_empty(c[r], QCOUNT * 4, &dst[r]));
    }
    /* Each thread's stream looked up once before. */
    fill(c, src, dst);
    sum_in_a_group(c, comm, src, dst);

    /* The first call of a group (the queue grows from nothing) and the
     * last of a round of calls whose peers are queued already (the queue
     * grows from 8 to 16 at its 9th call). */
    for (int last = 0; last < 2; last++) {
        fill(c, src, dst);
        ok(cube_group_begin());
        uint32_t rounds = last ? 3 : 1;
        for (uint32_t k = 0; k < rounds; k++)
            for (uint32_t r = 0; r < QRANKS; r++) {
                int fails = last ? k == 2 && r == QRANKS - 1 : r == 0;
                reallocs = refused_as = 0;
                fail_next = fails;
                cube_error *err =
                    cube_all_reduce(comm[r], src[r], dst[r], QCOUNT,
                                    CUBE_DTYPE_F32, CUBE_REDUCE_SUM);
                fail_next = 0;
                if (fails) {
                    /* the call's first realloc: the queue's */
                    assert_int_equal(refused_as, 1);
                    expect_code(err, CUBE_ERR_OUT_OF_MEMORY, "unqueued call");
                } else {
                    ok(err);
                }
            }
        /* Rounds before the refused one ran; the refused round ran on no
         * rank; the group's answer is its first failure: the call that
         * could not be queued, or a peer's call before it, refused. */
        cube_error *end = cube_group_end();
        char *text = cube_error_format(end);
        if (last && (!text || !strstr(text, "rank 2's cube_all_reduce was "
                                            "refused")))
            fail_msg("the peers' answer does not name rank 2: %s",
                     text ? text : "?");
        free(text);
        expect_code(end,
                    last ? CUBE_ERR_INVALID_ARGUMENT : CUBE_ERR_OUT_OF_MEMORY,
                    "cube_group_end");
        expect_dst(c, dst, last ? 6.0f : -1.0f);
    }
    /* And the communicator goes on. */
    sum_in_a_group(c, comm, src, dst);
    for (uint32_t r = 0; r < QRANKS; r++) {
        ok(cube_handle_release(c[r], src[r]));
        ok(cube_handle_release(c[r], dst[r]));
        cube_comm_destroy(comm[r]);
        cube_client_close(c[r]);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_all_reduce_small_and_streamed),
        cmocka_unit_test(test_reduce_scatter_small_and_streamed),
        cmocka_unit_test(
            test_a_call_the_group_cannot_queue_is_refused_everywhere),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
