/* Unit tests of the CPU worker pool: every cube runs exactly once, errors
 * surface, and several submitters at once all finish (the submitter works
 * on its own job, so no job waits on another's). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "backends/cpu/cpu_workers.h"
#include "cubert/backend/errors.h"

typedef struct counts {
    atomic_uint *hits;
    uint32_t fail_at; /* a cube index that fails, or UINT32_MAX */
} counts;

static cube_error *count_range(void *ctx, uint32_t begin, uint32_t end,
                               cpu_thread_local *local)
{
    counts *c = ctx;
    /* No cmocka asserts here: this runs on worker threads too. */
    if (!local)
        return cube_error_new(CUBE_ERR_INTERNAL, "no thread scratch");
    cube_error *err = NULL;
    for (uint32_t i = begin; i < end; i++) {
        atomic_fetch_add(&c->hits[i], 1);
        if (i == c->fail_at && !err)
            err = cube_error_new(CUBE_ERR_INTERNAL, "cube %u failed", i);
    }
    return err;
}

static void run_and_check(cpu_workers *w, uint32_t total, uint32_t chunk)
{
    counts c = {calloc(total, sizeof(atomic_uint)), UINT32_MAX};
    assert_non_null(c.hits);
    assert_null(cpu_workers_run(w, total, chunk, count_range, &c));
    for (uint32_t i = 0; i < total; i++)
        assert_int_equal(atomic_load(&c.hits[i]), 1);
    free(c.hits);
}

static void test_every_cube_once(void **state)
{
    (void)state;
    cpu_workers *w;
    assert_null(cpu_workers_create(4, &w));
    assert_int_equal(cpu_workers_threads(w), 4);
    run_and_check(w, 1, 1);
    run_and_check(w, 1000, 7);
    run_and_check(w, 100000, 64);
    run_and_check(w, 12345, 0); /* chunk 0 counts as 1 */
    assert_null(cpu_workers_run(w, 0, 1, count_range, NULL));
    cpu_workers_destroy(w);
}

static void test_single_thread_pool(void **state)
{
    (void)state;
    cpu_workers *w;
    assert_null(cpu_workers_create(1, &w));
    run_and_check(w, 5000, 10);
    cpu_workers_destroy(w);
}

static void test_error_surfaces_and_all_cubes_run(void **state)
{
    (void)state;
    cpu_workers *w;
    assert_null(cpu_workers_create(3, &w));
    counts c = {calloc(4096, sizeof(atomic_uint)), 1000};
    cube_error *err = cpu_workers_run(w, 4096, 16, count_range, &c);
    assert_int_equal(cube_error_code(err), CUBE_ERR_INTERNAL);
    cube_error_free(err);
    for (uint32_t i = 0; i < 4096; i++)
        assert_int_equal(atomic_load(&c.hits[i]), 1);
    free(c.hits);
    cpu_workers_destroy(w);
}

static void *submitter(void *arg)
{
    cpu_workers *w = arg;
    for (int rep = 0; rep < 50; rep++)
        run_and_check(w, 2000 + (uint32_t)rep, 3);
    return NULL;
}

static void test_concurrent_submitters(void **state)
{
    (void)state;
    cpu_workers *w;
    assert_null(cpu_workers_create(2, &w));
    pthread_t t[6];
    for (int i = 0; i < 6; i++)
        assert_int_equal(pthread_create(&t[i], NULL, submitter, w), 0);
    for (int i = 0; i < 6; i++)
        pthread_join(t[i], NULL);
    cpu_workers_destroy(w);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_cube_once),
        cmocka_unit_test(test_single_thread_pool),
        cmocka_unit_test(test_error_surfaces_and_all_cubes_run),
        cmocka_unit_test(test_concurrent_submitters),
    };
    return cmocka_run_group_tests_name("cpu_workers", tests, NULL, NULL);
}
