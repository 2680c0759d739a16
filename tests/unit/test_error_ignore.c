/* cube_error_ignore (src/base/error.h): an error dropped on purpose is
 * freed, and logged at debug level with the reason; NULL is nothing.
 *
 * The library is linked statically into this test with free() wrapped
 * (-Wl,--wrap=free, tests/CMakeLists.txt): __wrap_free below notes each
 * pointer the library frees, so the test sees the error itself go. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "cubert/backend/errors.h"
#include "cubert/log.h"

void __real_free(void *p);
void __wrap_free(void *p);

/* The pointers freed since the test's setup, the first FREED_MAX of them
 * (the test runs on one thread). */
#define FREED_MAX 256
static void *freed[FREED_MAX];
static size_t freed_count;

void __wrap_free(void *p)
{
    if (p && freed_count < FREED_MAX)
        freed[freed_count] = p;
    if (p)
        freed_count++;
    __real_free(p);
}

static int was_freed(const void *p)
{
    for (size_t i = 0; i < freed_count && i < FREED_MAX; i++)
        if (freed[i] == p)
            return 1;
    return 0;
}

typedef struct captured {
    int count;
    cube_log_level level;
    char category[32];
    char message[512];
} captured;

static void sink(void *user, cube_log_level level, const char *category,
                 const char *message)
{
    captured *c = user;
    c->count++;
    c->level = level;
    snprintf(c->category, sizeof c->category, "%s", category);
    snprintf(c->message, sizeof c->message, "%s", message);
}

static captured seen;
static cube_log_level saved_level;

static int setup(void **state)
{
    (void)state;
    memset(&seen, 0, sizeof seen);
    saved_level = cube_log_get_level();
    cube_log_set_sink(sink, &seen);
    freed_count = 0;
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    cube_log_set_sink(NULL, NULL);
    cube_log_set_level(saved_level);
    return 0;
}

/* Freed, and one debug message with the reason, the code, the message
 * and its causes. */
static void test_logs_and_frees(void **state)
{
    (void)state;
    cube_log_set_level(CUBE_LOG_DEBUG);
    cube_error *err =
        cube_error_wrap(cube_error_new(CUBE_ERR_OUT_OF_MEMORY, "the cause"),
                        CUBE_ERR_INTERNAL, "cannot make the context current");
    cube_error_ignore(err, "a destroy goes on without its context");
    assert_true(was_freed(err));
    assert_int_equal(seen.count, 1);
    assert_int_equal(seen.level, CUBE_LOG_DEBUG);
    assert_string_equal(seen.category, "error");
    assert_non_null(strstr(seen.message, "a destroy goes on without its "
                                         "context"));
    assert_non_null(strstr(seen.message,
                           "[internal error] cannot make the context current"));
    assert_non_null(strstr(seen.message, "[out of memory] the cause"));
    /* One line per error, no newline at the end. */
    size_t n = strlen(seen.message);
    assert_true(n > 0 && seen.message[n - 1] != '\n');
}

/* Above debug level: nothing logged, still freed. */
static void test_quiet_above_debug(void **state)
{
    (void)state;
    cube_log_set_level(CUBE_LOG_INFO);
    cube_error *err = cube_error_new(CUBE_ERR_TIMEOUT, "too slow");
    cube_error_ignore(err, "the next one is tried");
    assert_true(was_freed(err));
    assert_int_equal(seen.count, 0);
}

/* NULL is no error: nothing logged, nothing freed. A missing reason is
 * said to be missing. */
static void test_null_and_no_reason(void **state)
{
    (void)state;
    cube_log_set_level(CUBE_LOG_TRACE);
    cube_error_ignore(NULL, "nothing failed");
    assert_int_equal(seen.count, 0);
    assert_int_equal(freed_count, 0);

    cube_error *err = cube_error_new(CUBE_ERR_IO, "gone");
    cube_error_ignore(err, NULL);
    assert_true(was_freed(err));
    assert_int_equal(seen.count, 1);
    assert_non_null(strstr(seen.message, "no reason given"));
    assert_non_null(strstr(seen.message, "gone"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_logs_and_frees, setup, teardown),
        cmocka_unit_test_setup_teardown(test_quiet_above_debug, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_null_and_no_reason, setup,
                                        teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
