/* The OpenCL backend's internals that need no device: error names and
 * codes, the page table's lookups of addresses that name no page, and how
 * the backend says it cannot run (no loader, a platform no driver has).
 * Loading and device discovery happen once per process, so each of those
 * runs in a child of its own. The suite (tests/conformance) covers the
 * rest on a real device. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cubert/cubert.h>

#include "backends/opencl/opencl_internal.h"

static void test_error_names_and_codes(void **state)
{
    (void)state;
    assert_string_equal(opencl_error_name(CL_OUT_OF_RESOURCES),
                        "CL_OUT_OF_RESOURCES");
    assert_string_equal(opencl_error_name(-9999), "an OpenCL error");
    cube_error *e = opencl_fail(CL_MEM_OBJECT_ALLOCATION_FAILURE,
                                CUBE_ERR_INTERNAL, "page of %d bytes", 64);
    assert_int_equal(cube_error_code(e), CUBE_ERR_OUT_OF_MEMORY);
    assert_non_null(strstr(cube_error_message(e), "page of 64 bytes"));
    assert_non_null(
        strstr(cube_error_message(e), "CL_MEM_OBJECT_ALLOCATION_FAILURE"));
    cube_error_free(e);
    e = opencl_fail(CL_INVALID_VALUE, CUBE_ERR_COMPILE, "x");
    assert_int_equal(cube_error_code(e), CUBE_ERR_COMPILE);
    cube_error_free(e);
}

/* Addresses that name no page: slot 0, a slot past the table, a slot
 * whose chunk was never made. None is a cl_mem. */
static void test_addresses_without_a_page_have_none(void **state)
{
    (void)state;
    opencl_server *s = calloc(1, sizeof *s);
    assert_non_null(s);
    uint64_t off = 1;
    assert_null(opencl_page_of(s, 0, &off));
    assert_int_equal(off, 0);
    assert_null(opencl_page_of(s, 123, &off));
    assert_int_equal(off, 123);
    assert_null(opencl_page_of(s, UINT64_MAX, &off));
    assert_null(opencl_page_of(s, (uint64_t)7 << OPENCL_PAGE_SHIFT, &off));
    free(s);
}

/* In a child: opens "opencl" with `var`=`value` set and expects `code`
 * and `needle` in the message. */
static void expect_open_fails(const char *var, const char *value,
                              cube_code code, const char *needle)
{
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        setenv(var, value, 1);
        cube_client *c = NULL;
        cube_error *err = cube_client_open("opencl", NULL, &c);
        /* Without a loader at all, that is the answer whatever is set. */
        int ok = err && cube_error_code(err) == code &&
                 (strstr(cube_error_message(err), needle) != NULL ||
                  strstr(cube_error_message(err), "no OpenCL ICD loader"));
        if (!ok && err)
            fprintf(stderr, "got: %s\n", cube_error_message(err));
        cube_error_free(err);
        if (c)
            cube_client_close(c);
        _exit(ok ? 0 : 1);
    }
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
}

static void test_missing_loader_is_unavailable_naming_it(void **state)
{
    (void)state;
    expect_open_fails("CUBERT_OPENCL_LIBRARY", "/no/such/libOpenCL.so",
                      CUBE_ERR_UNAVAILABLE, "/no/such/libOpenCL.so");
}

static void test_platform_no_driver_has_is_unavailable(void **state)
{
    (void)state;
    expect_open_fails("CUBERT_OPENCL_PLATFORM", "no-such-platform",
                      CUBE_ERR_UNAVAILABLE, "no-such-platform");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_error_names_and_codes),
        cmocka_unit_test(test_addresses_without_a_page_have_none),
        cmocka_unit_test(test_missing_loader_is_unavailable_naming_it),
        cmocka_unit_test(test_platform_no_driver_has_is_unavailable),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
