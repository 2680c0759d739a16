/* Unit tests of cube_launch's failure paths (src/core/launch.c) that need
 * a failure made on purpose: a compile that fails for want of memory, a
 * directory or a process, and a kernel that fails to compile again and
 * again. They open real clients (cpu, and null where this build has it)
 * and reach into the client's internals only to inject a failure or to
 * count what the client keeps. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/client_internal.h"
#include "cubert/cubert.h"

static void expect_code(cube_error *err, cube_code code, const char *needle)
{
    if (!err)
        fail_msg("expected %s, got success", cube_code_name(code));
    if (cube_error_code(err) != code) {
        char *text = cube_error_format(err);
        fail_msg("expected %s, got %s", cube_code_name(code),
                 text ? text : "?");
    }
    if (needle && !strstr(cube_error_message(err), needle))
        fail_msg("'%s' does not name '%s'", cube_error_message(err), needle);
    cube_error_free(err);
}

static void ok(cube_error *err)
{
    if (err) {
        char *text = cube_error_format(err);
        fail_msg("unexpected error: %s", text ? text : "?");
    }
}

/* A CPU client without a disk cache, so every first launch compiles. */
static cube_client *open_cpu(void)
{
    cube_client_options o = cube_client_options_default();
    o.cache_dir = "";
    o.cpu_threads = 2;
    cube_client *c = NULL;
    ok(cube_client_open("cpu", &o, &c));
    return c;
}

/* A kernel no other test (nor an earlier run's disk cache) has compiled:
 * y = x + bias (IN x, OUT or INOUT y, a u32 scalar). */
static cube_kernel *fresh_kernel(const char *tag, int inout)
{
    static unsigned serial;
    char src[512];
    snprintf(src, sizeof src,
             "/* %s %u %ld */\n"
             "CUBE_KERNEL(add_bias, CUBE_IN(uint32_t, x), %s(uint32_t, y),\n"
             "            CUBE_SCALAR(uint32_t, bias))\n"
             "{\n"
             "    uint32_t i = ABSOLUTE_POS_X;\n"
             "    if (i < CUBE_LEN(y))\n"
             "        y[i] = x[i] + bias;\n"
             "}\n",
             tag, ++serial, (long)getpid(), inout ? "CUBE_INOUT" : "CUBE_OUT");
    cube_kernel_desc d = {"add_bias", src, {64, 1, 1}};
    cube_kernel *k = NULL;
    ok(cube_kernel_create(&d, &k));
    return k;
}

static cube_error *launch_add_bias(cube_client *c, cube_kernel *k,
                                   cube_handle x, cube_handle y, uint32_t bias)
{
    cube_arg args[3] = {cube_arg_buffer(x), cube_arg_buffer(y),
                        cube_arg_u32(bias)};
    return cube_launch(c, k, cube_count_static(1, 1, 1), args, 3, 0);
}

static void expect_u32s(cube_client *c, cube_handle h, const uint32_t *want,
                        uint32_t n)
{
    uint32_t got[64];
    assert_true(n <= 64);
    cube_copy_desc d = cube_copy_desc_contiguous(h, n * 4u, 4);
    void *dst[1] = {got};
    uint64_t size[1] = {n * 4u};
    ok(cube_read(c, &d, dst, size, 1));
    assert_memory_equal(got, want, n * 4u);
}

/* ------------------------------------------- item: transient compile */

/* A compile slot that answers `fail_code` for its next `fail_left` calls,
 * then hands over to the backend's own. */
static const cube_server_vtable *real_vt;
static int fail_left;
static cube_code fail_code;
static int compiles;

static cube_error *failing_compile(cube_server *server,
                                   const cube_kernel *kernel, uint32_t mode,
                                   cube_compiled *out)
{
    compiles++;
    if (fail_left > 0) {
        fail_left--;
        return cube_error_new(fail_code, "injected: %s while compiling '%s'",
                              cube_code_name(fail_code),
                              cube_kernel_name(kernel));
    }
    return real_vt->compile(server, kernel, mode, out);
}

/* Swaps the client's compile slot for failing_compile. */
static void inject_compile_failures(cube_client *c, cube_server_vtable *copy,
                                    cube_code code, int times)
{
    real_vt = c->vt;
    *copy = *c->vt;
    copy->compile = failing_compile;
    c->vt = copy;
    fail_code = code;
    fail_left = times;
    compiles = 0;
}

/* A compile that fails for want of memory or of a file is returned and
 * recorded on no buffer, the input included: the retry runs. A compile
 * error proper still lands on every bound buffer (the signature is
 * unknown). */
static void test_resource_failure_at_compile_records_nothing(void **state)
{
    (void)state;
    static const cube_code transient[] = {CUBE_ERR_OUT_OF_MEMORY, CUBE_ERR_IO};
    for (size_t t = 0; t < 2; t++) {
        for (int inout = 0; inout < 2; inout++) {
            cube_client *c = open_cpu();
            cube_server_vtable copy;
            inject_compile_failures(c, &copy, transient[t], 2);
            cube_kernel *k = fresh_kernel("transient", inout);
            uint32_t x0[8] = {1, 2, 3, 4, 5, 6, 7, 8}, y0[8] = {0};
            cube_handle x, y;
            ok(cube_create(c, x0, sizeof x0, &x));
            ok(cube_create(c, y0, sizeof y0, &y));
            for (int i = 0; i < 2; i++) {
                expect_code(launch_add_bias(c, k, x, y, 10), transient[t],
                            "injected");
                /* Neither buffer carries it: both read back unchanged. */
                ok(cube_check(c, &x, 1));
                ok(cube_check(c, &y, 1));
                expect_u32s(c, x, x0, 8);
                expect_u32s(c, y, y0, 8);
            }
            /* The retry compiles and runs. */
            ok(launch_add_bias(c, k, x, y, 10));
            uint32_t want[8];
            for (int i = 0; i < 8; i++)
                want[i] = x0[i] + 10;
            expect_u32s(c, y, want, 8);
            assert_int_equal(compiles, 3);
            cube_kernel_release(k);
            cube_client_close(c);
        }
    }

    /* A compile error proper: every bound buffer carries it. */
    cube_client *c = open_cpu();
    cube_server_vtable copy;
    inject_compile_failures(c, &copy, CUBE_ERR_COMPILE, 1);
    cube_kernel *k = fresh_kernel("compile-error", 0);
    uint32_t x0[8] = {1}, y0[8] = {0};
    cube_handle x, y;
    ok(cube_create(c, x0, sizeof x0, &x));
    ok(cube_create(c, y0, sizeof y0, &y));
    expect_code(launch_add_bias(c, k, x, y, 1), CUBE_ERR_COMPILE, "injected");
    expect_code(cube_check(c, &x, 1), CUBE_ERR_SEVERAL, NULL);
    expect_code(cube_check(c, &y, 1), CUBE_ERR_SEVERAL, NULL);
    cube_kernel_release(k);
    cube_client_close(c);
}

/* The real thing: the CPU backend cannot make its private directory (its
 * temporary base does not exist yet) and says CUBE_ERR_IO; once the
 * directory is there the same launch on the same client runs. */
static void test_cpu_compile_without_its_directory_records_nothing(void **state)
{
    (void)state;
    char base[] = "/tmp/cubert-test-launch-XXXXXX";
    assert_non_null(mkdtemp(base));
    char tmp[sizeof base + 16];
    snprintf(tmp, sizeof tmp, "%s/later", base);
    const char *was = getenv("TMPDIR");
    char *saved = was ? strdup(was) : NULL;
    assert_int_equal(setenv("TMPDIR", tmp, 1), 0);
    cube_client *c = open_cpu();
    if (saved)
        assert_int_equal(setenv("TMPDIR", saved, 1), 0);
    else
        assert_int_equal(unsetenv("TMPDIR"), 0);
    free(saved);

    cube_kernel *k = fresh_kernel("no-tmpdir", 0);
    uint32_t x0[8] = {7, 6, 5, 4, 3, 2, 1, 0}, y0[8] = {9, 9, 9, 9, 9, 9, 9, 9};
    cube_handle x, y;
    ok(cube_create(c, x0, sizeof x0, &x));
    ok(cube_create(c, y0, sizeof y0, &y));
    expect_code(launch_add_bias(c, k, x, y, 1), CUBE_ERR_IO, "later");
    ok(cube_check(c, &x, 1));
    ok(cube_check(c, &y, 1));
    expect_u32s(c, x, x0, 8);
    expect_u32s(c, y, y0, 8);

    assert_int_equal(mkdir(tmp, 0700), 0);
    ok(launch_add_bias(c, k, x, y, 1));
    uint32_t want[8];
    for (int i = 0; i < 8; i++)
        want[i] = x0[i] + 1;
    expect_u32s(c, y, want, 8);
    cube_kernel_release(k);
    cube_client_close(c);
    assert_int_equal(rmdir(tmp), 0);
    assert_int_equal(rmdir(base), 0);
}

/* The real thing again: the C compiler is killed by a signal (as the
 * out-of-memory killer would). That is CUBE_ERR_IO naming the signal,
 * recorded on no buffer, not a compile error; once the compiler lives
 * the same launch on the same client runs. */
static void test_cpu_compiler_killed_records_nothing(void **state)
{
    (void)state;
    char base[] = "/tmp/cubert-test-launch-XXXXXX";
    assert_non_null(mkdtemp(base));
    char cc[sizeof base + 16], alive[sizeof base + 16];
    snprintf(cc, sizeof cc, "%s/cc", base);
    snprintf(alive, sizeof alive, "%s/alive", base);
    FILE *f = fopen(cc, "w");
    assert_non_null(f);
    fprintf(f,
            "#!/bin/sh\n"
            "if [ \"$1\" = --version ] || [ -e '%s' ]; then exec cc \"$@\"; "
            "fi\n"
            "kill -KILL $$\n",
            alive);
    assert_int_equal(fclose(f), 0);
    assert_int_equal(chmod(cc, 0700), 0);
    const char *was = getenv("CUBERT_CPU_CC");
    char *saved = was ? strdup(was) : NULL;
    assert_int_equal(setenv("CUBERT_CPU_CC", cc, 1), 0);
    cube_client *c = open_cpu();
    if (saved)
        assert_int_equal(setenv("CUBERT_CPU_CC", saved, 1), 0);
    else
        assert_int_equal(unsetenv("CUBERT_CPU_CC"), 0);
    free(saved);

    cube_kernel *k = fresh_kernel("killed-cc", 0);
    uint32_t x0[8] = {7, 6, 5, 4, 3, 2, 1, 0}, y0[8] = {9, 9, 9, 9, 9, 9, 9, 9};
    cube_handle x, y;
    ok(cube_create(c, x0, sizeof x0, &x));
    ok(cube_create(c, y0, sizeof y0, &y));
    expect_code(launch_add_bias(c, k, x, y, 1), CUBE_ERR_IO, "SIGKILL");
    ok(cube_check(c, &x, 1));
    ok(cube_check(c, &y, 1));
    expect_u32s(c, y, y0, 8);

    f = fopen(alive, "w");
    assert_non_null(f);
    assert_int_equal(fclose(f), 0);
    ok(launch_add_bias(c, k, x, y, 1));
    uint32_t want[8];
    for (int i = 0; i < 8; i++)
        want[i] = x0[i] + 1;
    expect_u32s(c, y, want, 8);
    cube_kernel_release(k);
    cube_client_close(c);
    assert_int_equal(unlink(alive), 0);
    assert_int_equal(unlink(cc), 0);
    assert_int_equal(rmdir(base), 0);
}

/* ------------------------------------------ item: failing kernels */

/* The cache's entries, counted by walking its buckets. */
static size_t walk_cache(const cube_client *c)
{
    size_t n = 0;
    for (size_t b = 0; b < CORE_CACHE_BUCKETS; b++)
        for (const core_cache_entry *e = c->dev->cache[b]; e; e = e->next)
            n++;
    return n;
}

enum { FAILING_LAUNCHES = 10000 };

/* Launches `k` over (x, y) FAILING_LAUNCHES times, each failing with
 * `code`; the cache keeps one entry for it (one per compile mode). */
static void launch_failing(cube_client *c, cube_kernel *k, cube_code code,
                           size_t entries_before)
{
    uint32_t zero[8] = {0};
    cube_handle x, y;
    ok(cube_create(c, zero, sizeof zero, &x));
    ok(cube_create(c, zero, sizeof zero, &y));
    for (int i = 0; i < FAILING_LAUNCHES; i++) {
        uint32_t mode = i % 2 ? CUBE_LAUNCH_CHECKED : 0;
        cube_arg args[3] = {cube_arg_buffer(x), cube_arg_buffer(y),
                            cube_arg_u32(1)};
        cube_error *err =
            cube_launch(c, k, cube_count_static(1, 1, 1), args, 3, mode);
        assert_non_null(err);
        assert_int_equal(cube_error_code(err), code);
        cube_error_free(err);
        if (walk_cache(c) > entries_before + 2)
            fail_msg("after %d failed launches the cache holds %zu entries "
                     "(at most %zu expected)",
                     i + 1, walk_cache(c), entries_before + 2);
    }
    assert_int_equal(walk_cache(c), entries_before + 2);
    assert_int_equal(core_cache_entry_count(c), walk_cache(c));
    ok(cube_handle_release(c, x));
    ok(cube_handle_release(c, y));
}

/* A kernel whose compile fails every time (the null backend's every
 * kernel; an injected compile error on the CPU) holds one cache entry per
 * compile mode however often it is launched, and a later compile that
 * succeeds takes that entry. */
static void test_failing_kernel_keeps_one_cache_entry(void **state)
{
    (void)state;
    cube_client *c = NULL;
    cube_error *err = cube_client_open("null", NULL, &c);
    if (err && cube_error_code(err) == CUBE_ERR_UNAVAILABLE) {
        cube_error_free(err); /* a build without the null backend */
    } else {
        ok(err);
        cube_kernel *k = fresh_kernel("null", 0);
        launch_failing(c, k, CUBE_ERR_UNSUPPORTED, 0);
        cube_kernel_release(k);
        cube_client_close(c);
    }

    c = open_cpu();
    cube_server_vtable copy;
    inject_compile_failures(c, &copy, CUBE_ERR_COMPILE, FAILING_LAUNCHES);
    cube_kernel *k = fresh_kernel("cpu", 0);
    launch_failing(c, k, CUBE_ERR_COMPILE, 0);
    assert_int_equal(compiles, FAILING_LAUNCHES);
    /* The compile now succeeds, in the entry the failures left. */
    uint32_t x0[8] = {1, 2, 3, 4, 5, 6, 7, 8}, y0[8] = {0};
    cube_handle x, y;
    ok(cube_create(c, x0, sizeof x0, &x));
    ok(cube_create(c, y0, sizeof y0, &y));
    ok(launch_add_bias(c, k, x, y, 1));
    uint32_t want[8];
    for (int i = 0; i < 8; i++)
        want[i] = x0[i] + 1;
    expect_u32s(c, y, want, 8);
    assert_int_equal(walk_cache(c), 2);
    /* A real compile error, a few times (each one runs the compiler). */
    cube_kernel_desc d = {"broken",
                          "CUBE_KERNEL(broken, CUBE_OUT(uint32_t, y))"
                          "{ y[0] = not_declared; }\n",
                          {1, 1, 1}};
    cube_kernel *broken = NULL;
    ok(cube_kernel_create(&d, &broken));
    for (int i = 0; i < 3; i++) {
        cube_arg arg = cube_arg_buffer(y);
        expect_code(
            cube_launch(c, broken, cube_count_static(1, 1, 1), &arg, 1, 0),
            CUBE_ERR_COMPILE, NULL);
    }
    assert_int_equal(walk_cache(c), 3);
    assert_int_equal(core_cache_entry_count(c), 3);
    cube_kernel_release(broken);
    cube_kernel_release(k);
    cube_client_close(c);
}

/* ------------------------------------- item: close while others call */

/* A thread that calls in a loop on `c` until a call answers that the
 * client is closing; then it touches the client no more. */
typedef struct caller {
    cube_client *c;
    cube_kernel *k; /* NULL: no launches (a backend without kernels) */
    cube_handle x, y;
    atomic_int calls;   /* calls that succeeded */
    atomic_int refused; /* 1 once a call answered "closing" */
    char unexpected[512];
} caller;

static cube_error *one_call(caller *w, int i)
{
    uint32_t buf[256];
    memset(buf, i, sizeof buf);
    cube_copy_desc d = cube_copy_desc_contiguous(w->y, sizeof buf, 4);
    switch (i % 8) {
    case 0:
        if (w->k) {
            cube_arg args[3] = {cube_arg_buffer(w->x), cube_arg_buffer(w->y),
                                cube_arg_u32(1)};
            return cube_launch(w->c, w->k, cube_count_static(256, 1, 1), args,
                               3, 0);
        }
        return cube_flush(w->c);
    case 1: {
        const void *src[1] = {buf};
        uint64_t size[1] = {sizeof buf};
        return cube_write(w->c, &d, src, size, 1);
    }
    case 2: {
        void *dst[1] = {buf};
        uint64_t size[1] = {sizeof buf};
        return cube_read(w->c, &d, dst, size, 1);
    }
    case 3: return cube_sync(w->c, &w->y, 1);
    case 4: return cube_check(w->c, &w->x, 1);
    case 5: {
        uint64_t size = 0;
        return cube_handle_size(w->c, w->x, &size);
    }
    case 6: {
        cube_handle h = {0}, s = {0};
        cube_error *err = cube_empty(w->c, 64, &h);
        if (!err)
            err = cube_handle_slice(w->c, h, 16, 16, &s);
        if (!err)
            err = cube_handle_release(w->c, h);
        if (!err)
            err = cube_handle_release(w->c, s);
        return err;
    }
    default: {
        cube_memory_usage u;
        return cube_memory_usage_get(w->c, &u);
    }
    }
}

static void *call_until_refused(void *arg)
{
    caller *w = arg;
    for (int i = 0;; i++) {
        cube_error *err = one_call(w, i);
        if (!err) {
            atomic_fetch_add(&w->calls, 1);
            continue;
        }
        if (cube_error_code(err) != CUBE_ERR_INVALID_ARGUMENT ||
            !strstr(cube_error_message(err), "the client is closing"))
            snprintf(w->unexpected, sizeof w->unexpected, "call %d: %s: %s",
                     i % 8, cube_code_name(cube_error_code(err)),
                     cube_error_message(err));
        cube_error_free(err);
        atomic_store(&w->refused, 1);
        return NULL;
    }
}

/* The closing hook: close has begun refusing calls; wait (bounded) until
 * the caller has been refused and stopped, so that no call of it can
 * start after the client is freed. */
static void wait_for_refusal(void *arg)
{
    caller *w = arg;
    for (int i = 0; i < 20000 && !atomic_load(&w->refused); i++)
        usleep(500);
}

static void close_while_calling(cube_client *c, cube_kernel *k)
{
    caller *w = calloc(1, sizeof *w);
    assert_non_null(w);
    w->c = c;
    w->k = k;
    uint32_t init[256] = {0};
    ok(cube_create(c, init, sizeof init, &w->x));
    ok(cube_create(c, init, sizeof init, &w->y));
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, call_until_refused, w), 0);
    /* Let it get going: a few hundred calls of every kind. */
    for (int i = 0; i < 20000 && atomic_load(&w->calls) < 300; i++)
        usleep(500);
    c->closing_hook = wait_for_refusal;
    c->closing_hook_arg = w;
    cube_client_close(c);
    assert_int_equal(pthread_join(t, NULL), 0);
    if (w->unexpected[0])
        fail_msg("%s", w->unexpected);
    assert_true(atomic_load(&w->refused));
    assert_true(atomic_load(&w->calls) >= 300);
    free(w);
}

/* cube_client_close while another thread launches, writes, reads, syncs,
 * checks and makes and releases buffers in a loop: the calls in flight finish,
 * the ones that start later are refused with CUBE_ERR_INVALID_ARGUMENT, nothing
 * crashes. */
static void test_close_while_another_thread_calls(void **state)
{
    (void)state;
    for (int round = 0; round < 3; round++) {
        cube_client *c = open_cpu();
        cube_kernel *k = fresh_kernel("close", 1);
        close_while_calling(c, k);
        cube_kernel_release(k);
    }
    cube_client *c = NULL;
    cube_error *err = cube_client_open("null", NULL, &c);
    if (err && cube_error_code(err) == CUBE_ERR_UNAVAILABLE) {
        cube_error_free(err);
        return;
    }
    ok(err);
    close_while_calling(c, NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_resource_failure_at_compile_records_nothing),
        cmocka_unit_test(
            test_cpu_compile_without_its_directory_records_nothing),
        cmocka_unit_test(test_cpu_compiler_killed_records_nothing),
        cmocka_unit_test(test_failing_kernel_keeps_one_cache_entry),
        cmocka_unit_test(test_close_while_another_thread_calls),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
