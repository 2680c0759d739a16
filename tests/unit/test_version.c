/* The version: the library's answer equals the headers' macros, and both
 * equal the project's version in CMake (what pkg-config and
 * find_package report). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <cmocka.h>

#include "cubert/cubert.h"

static void test_library_matches_headers_and_project(void **state)
{
    (void)state;
    char want[32];
    snprintf(want, sizeof want, "%d.%d.%d", CUBE_VERSION_MAJOR,
             CUBE_VERSION_MINOR, CUBE_VERSION_PATCH);
    assert_string_equal(cube_version(), want);
    assert_string_equal(cube_version(), CUBE_PROJECT_VERSION);
    assert_int_equal(cube_version_hex(), (uint32_t)CUBE_VERSION_HEX);
    assert_int_equal(cube_version_hex() >> 16, CUBE_VERSION_MAJOR);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_library_matches_headers_and_project),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
