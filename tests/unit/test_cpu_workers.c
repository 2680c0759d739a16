/* Unit tests of the CPU worker pool: every cube runs exactly once, errors
 * surface, and several submitters at once all finish (the submitter works
 * on its own job, so no job waits on another's); and, through a cpu client,
 * a launch of few but heavy cubes runs them on several threads at once. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/cpu/cpu_workers.h"
#include "cubert/cubert.h"
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

/* Each of two one-unit cubes counts itself in, then waits (a bounded spin)
 * for the other to come in too, and notes whether it did: both notes set
 * means both cubes ran at the same time. */
static const char meet_src[] =
    "CUBE_KERNEL(meet, CUBE_INOUT(uint32_t, f))\n"
    "{\n"
    "    cube_atomic_add_u32(&CUBE_AT(f, 0), 1u);\n"
    "    uint32_t in = 0;\n"
    "    for (uint32_t i = 0; i < 20000000u && in < 2u; i++)\n"
    "        in = cube_atomic_add_u32(&CUBE_AT(f, 0), 0u);\n"
    "    CUBE_AT(f, 1 + CUBE_POS_X) = in >= 2u;\n"
    "}\n";

static void fail_on(cube_error *err, const char *what)
{
    if (err) {
        char *t = cube_error_format(err);
        fail_msg("%s: %s", what, t ? t : "?");
    }
}

/* Few units (2) but much work each: the backend must not keep them on the
 * calling thread. The first launch may (nothing is known of the kernel
 * yet); one of the next few must have run both cubes at once. */
static void test_few_heavy_cubes_run_at_once(void **state)
{
    (void)state;
    cube_client_options o;
    memset(&o, 0, sizeof o);
    o.struct_size = sizeof o;
    o.cache_dir = "";
    o.cpu_threads = 2;
    cube_client *c;
    fail_on(cube_client_open("cpu", &o, &c), "cube_client_open");
    cube_kernel_desc d = {"meet", meet_src, {1, 1, 1}};
    cube_kernel *k;
    fail_on(cube_kernel_create(&d, &k), "cube_kernel_create");
    int together = 0;
    for (int launch = 0; launch < 6 && !together; launch++) {
        uint32_t f[3] = {0, 0, 0};
        cube_handle h;
        fail_on(cube_create(c, f, sizeof f, &h), "cube_create");
        cube_arg a[] = {cube_arg_buffer(h)};
        fail_on(cube_launch(c, k, cube_count_static(2, 1, 1), a, 1,
                            CUBE_LAUNCH_EXECUTE),
                "cube_launch");
        cube_copy_desc cd = cube_copy_desc_contiguous(h, sizeof f, 4);
        void *dst[] = {f};
        uint64_t size[] = {sizeof f};
        fail_on(cube_read(c, &cd, dst, size, 1), "cube_read");
        fail_on(cube_handle_release(c, h), "cube_handle_release");
        assert_int_equal(f[0], 2);
        together = f[1] && f[2];
    }
    assert_true(together);
    cube_kernel_release(k);
    cube_client_close(c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_cube_once),
        cmocka_unit_test(test_single_thread_pool),
        cmocka_unit_test(test_error_surfaces_and_all_cubes_run),
        cmocka_unit_test(test_concurrent_submitters),
        cmocka_unit_test(test_few_heavy_cubes_run_at_once),
    };
    return cmocka_run_group_tests_name("cpu_workers", tests, NULL, NULL);
}
