/* Unit tests of error values and the logger. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cubert/backend/errors.h"
#include "cubert/log.h"

static void test_error_basics(void **state)
{
    (void)state;
    cube_error *e = cube_error_new(CUBE_ERR_COMPILE, "kernel %s", "k");
    cube_error_set_log(e, "line 1\nline 2");
    assert_int_equal(cube_error_code(e), CUBE_ERR_COMPILE);
    assert_string_equal(cube_error_message(e), "kernel k");
    assert_string_equal(cube_error_log(e), "line 1\nline 2");
    e = cube_error_prefix(e, "launch %d", 3);
    assert_string_equal(cube_error_message(e), "launch 3: kernel k");
    cube_error *s = cube_error_wrap(e, CUBE_ERR_SEVERAL, "two");
    cube_error_add_cause(s, cube_error_new(CUBE_ERR_OUT_OF_MEMORY, "oom"));
    assert_int_equal(cube_error_cause_count(s), 2);
    assert_int_equal(cube_error_code(cube_error_cause(s, 1)),
                     CUBE_ERR_OUT_OF_MEMORY);
    assert_null(cube_error_cause(s, 2));
    cube_error *c = cube_error_clone(s);
    char *text = cube_error_format(c);
    assert_non_null(strstr(text, "[several errors] two"));
    assert_non_null(strstr(text, "  [compile error] launch 3: kernel k"));
    assert_non_null(strstr(text, "line 2"));
    free(text);
    cube_error_free(c);
    cube_error_free(s);
}

static void test_null_is_success(void **state)
{
    (void)state;
    assert_int_equal(cube_error_code(NULL), CUBE_OK);
    assert_string_equal(cube_error_message(NULL), "");
    assert_null(cube_error_log(NULL));
    assert_int_equal(cube_error_cause_count(NULL), 0);
    assert_null(cube_error_clone(NULL));
    cube_error_free(NULL);
    for (int c = 0; c <= CUBE_CODE_LAST; c++)
        assert_non_null(cube_code_name((cube_code)c));
}

typedef struct captured {
    int count;
    char last[256];
} captured;

static void sink(void *user, cube_log_level level, const char *category,
                 const char *message)
{
    (void)level;
    captured *c = user;
    c->count++;
    snprintf(c->last, sizeof c->last, "%s:%s", category, message);
}

static void test_logger_levels_and_sink(void **state)
{
    (void)state;
    captured cap = {0};
    cube_log_level old = cube_log_get_level();
    cube_log_set_sink(sink, &cap);
    cube_log_set_level(CUBE_LOG_WARN);
    cube_log_write(CUBE_LOG_INFO, "test", "dropped");
    assert_int_equal(cap.count, 0);
    cube_log_write(CUBE_LOG_ERROR, "test", "kept %d", 7);
    assert_int_equal(cap.count, 1);
    assert_string_equal(cap.last, "test:kept 7");
    char big[2000];
    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    cube_log_write(CUBE_LOG_ERROR, "test", "%s", big);
    assert_int_equal(cap.count, 2);
    cube_log_level parsed;
    assert_int_equal(cube_log_level_parse("debug", &parsed), 0);
    assert_int_equal(parsed, CUBE_LOG_DEBUG);
    assert_int_equal(cube_log_level_parse("loud", &parsed), -1);
    cube_error *err = cube_log_set_file("");
    assert_int_equal(cube_error_code(err), CUBE_ERR_INVALID_ARGUMENT);
    cube_error_free(err);
    err = cube_log_set_file("/nonexistent-dir/x.log");
    assert_int_equal(cube_error_code(err), CUBE_ERR_IO);
    cube_error_free(err);
    cube_log_set_sink(NULL, NULL);
    cube_log_set_level(old);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_error_basics),
        cmocka_unit_test(test_null_is_success),
        cmocka_unit_test(test_logger_levels_and_sink),
    };
    return cmocka_run_group_tests_name("error", tests, NULL, NULL);
}
