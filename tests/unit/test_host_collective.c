/* The host engine of collectives (backends/common/host_collective.c),
 * driven directly: results of every kind against a plain loop, below and
 * above the size from which destinations are written with streaming
 * stores, with the ranks' calls made by one thread and by several. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "backends/common/host_memory.h"
#include "cubert/comm.h"

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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_all_reduce_small_and_streamed),
        cmocka_unit_test(test_reduce_scatter_small_and_streamed),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
