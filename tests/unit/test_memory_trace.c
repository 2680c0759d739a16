/* The memory trace (CUBERT_MEMORY_TRACE, src/core/memory_trace.c): a
 * program run with it set writes every allocation and release, from any
 * thread, in the format bench_memory replays; its own parser
 * (bench/trace_file.h) reads the file back and the events pair up. A
 * trace that cannot be written logs one warning and every call still
 * succeeds.
 *
 * The configuration is read once per process, so each case is a run of
 * its own: no argument records into a file, "full" into /dev/full. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../../bench/trace_file.h"
#include "cubert/cubert.h"

#define THREADS 4
#define PER_THREAD 300

static cube_client *client;

/* Each thread allocates PER_THREAD buffers of varied sizes on its own
 * stream, releasing all but every tenth at once and the rest at the end;
 * returns the bytes it allocated in total. */
static void *worker(void *arg)
{
    uint64_t *total = arg;
    cube_handle kept[PER_THREAD];
    size_t nkept = 0;
    for (int i = 0; i < PER_THREAD; i++) {
        uint64_t size = 1 + (uint64_t)((i * 7919) % 100000);
        cube_handle h;
        if (cube_empty(client, size, &h) != NULL)
            return NULL;
        *total += size;
        if (i % 10 == 0)
            kept[nkept++] = h;
        else if (cube_handle_release(client, h) != NULL)
            return NULL;
    }
    for (size_t i = 0; i < nkept; i++)
        if (cube_handle_release(client, kept[i]) != NULL)
            return NULL;
    return arg;
}

static void test_records_every_allocation_and_release(void **state)
{
    (void)state;
    char dir[] = "/tmp/cubert-memory-trace-XXXXXX";
    assert_non_null(mkdtemp(dir));
    char configured[256], path[256];
    snprintf(configured, sizeof configured, "%s/run-%%p.trace", dir);
    snprintf(path, sizeof path, "%s/run-%ld.trace", dir, (long)getpid());
    setenv("CUBERT_MEMORY_TRACE", configured, 1);

    assert_null(cube_client_open("cpu", NULL, &client));
    pthread_t t[THREADS];
    uint64_t totals[THREADS] = {0};
    for (int i = 0; i < THREADS; i++)
        assert_int_equal(pthread_create(&t[i], NULL, worker, &totals[i]), 0);
    void *ok[THREADS];
    for (int i = 0; i < THREADS; i++)
        assert_int_equal(pthread_join(t[i], &ok[i]), 0);
    /* One buffer still live when the client closes: its release is
     * recorded by the close. */
    cube_handle last;
    assert_null(cube_empty(client, 12345, &last));
    cube_client_close(client);
    for (int i = 0; i < THREADS; i++)
        assert_non_null(ok[i]);

    trace tr;
    trace_summary sum;
    assert_int_equal(trace_load(path, &tr), 0);
    assert_non_null(strstr(tr.header, "cubert memory trace"));
    assert_int_equal(trace_check(path, &tr, &sum), 0);
    assert_int_equal(sum.allocs, THREADS * PER_THREAD + 1);
    assert_int_equal(sum.frees, sum.allocs);
    assert_int_equal(sum.left_live, 0);
    uint64_t want = 12345, got = 0;
    for (int i = 0; i < THREADS; i++)
        want += totals[i];
    for (size_t i = 0; i < tr.count; i++)
        got += tr.ops[i].free ? 0 : tr.ops[i].size;
    assert_int_equal(got, want);
    free(tr.ops);
    unlink(path);
    rmdir(dir);
}

static int warnings;

static void count_warnings(void *user, cube_log_level level,
                           const char *category, const char *message)
{
    (void)user;
    (void)category;
    if (level >= CUBE_LOG_WARN && strstr(message, "memory trace"))
        warnings++;
}

static void test_a_failed_write_warns_once_and_fails_no_call(void **state)
{
    (void)state;
    setenv("CUBERT_MEMORY_TRACE", "/dev/full", 1);
    cube_log_set_sink(count_warnings, NULL);
    assert_null(cube_client_open("cpu", NULL, &client));
    /* Several times the writer's buffer, so writes fail before the close
     * flushes. */
    for (int i = 0; i < 200000; i++) {
        cube_handle h;
        assert_null(cube_empty(client, 64 + (uint64_t)(i % 4096), &h));
        assert_null(cube_handle_release(client, h));
    }
    cube_client_close(client);
    assert_null(cube_client_open("cpu", NULL, &client));
    cube_handle h;
    assert_null(cube_empty(client, 100, &h));
    assert_null(cube_handle_release(client, h));
    cube_client_close(client);
    cube_log_set_sink(NULL, NULL);
    assert_int_equal(warnings, 1);
}

int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "full") == 0) {
        const struct CMUnitTest full[] = {
            cmocka_unit_test(test_a_failed_write_warns_once_and_fails_no_call),
        };
        return cmocka_run_group_tests(full, NULL, NULL);
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_records_every_allocation_and_release),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
