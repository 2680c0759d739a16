/* Unit tests of the CUDA backend's loader and error mapping that need no
 * GPU: a driver library that cannot be loaded makes the backend
 * unavailable with a message naming what was tried, every other backend
 * keeps working, and driver errors map to the right cubert codes. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>

#include "backends/cuda/cuda_api.h"
#include "cubert/backend/errors.h"
#include "cubert/cubert.h"

/* Runs first: the loader reads the variable once per process. */
static void test_missing_driver_is_unavailable_and_says_why(void **state)
{
    (void)state;
    setenv("CUBERT_CUDA_LIBRARY", "/nonexistent/libcuda-for-a-test.so", 1);
    const cuda_api *api = (const cuda_api *)1;
    cube_error *err = cuda_api_load(&api);
    assert_non_null(err);
    assert_null(api);
    assert_int_equal(cube_error_code(err), CUBE_ERR_UNAVAILABLE);
    assert_non_null(strstr(cube_error_message(err), "CUBERT_CUDA_LIBRARY"));
    assert_non_null(
        strstr(cube_error_message(err), "/nonexistent/libcuda-for-a-test.so"));
    cube_error_free(err);

    /* The answer is remembered, and the public API says the same. */
    err = cuda_api_load(&api);
    assert_int_equal(cube_error_code(err), CUBE_ERR_UNAVAILABLE);
    cube_error_free(err);
    cube_client *c = NULL;
    err = cube_client_open("cuda", NULL, &c);
    assert_null(c);
    assert_int_equal(cube_error_code(err), CUBE_ERR_UNAVAILABLE);
    assert_non_null(strstr(cube_error_message(err), "CUBERT_CUDA_LIBRARY"));
    cube_error_free(err);
    err = cube_client_open("cuda:3", NULL, &c);
    assert_int_equal(cube_error_code(err), CUBE_ERR_UNAVAILABLE);
    cube_error_free(err);

    /* The CPU backend is untouched. */
    err = cube_client_open("cpu", NULL, &c);
    assert_null(err);
    cube_client_close(c);

    /* Both backends are compiled in, whatever the machine. */
    const char *const *names = cube_backend_names();
    int cpu = 0, cuda = 0;
    for (size_t i = 0; names[i]; i++) {
        cpu |= strcmp(names[i], "cpu") == 0;
        cuda |= strcmp(names[i], "cuda") == 0;
    }
    assert_true(cpu && cuda);
}

static void test_sticky_errors_are_device_faults(void **state)
{
    (void)state;
    static const CUresult sticky[] = {
        CUDA_ERROR_ILLEGAL_ADDRESS,       CUDA_ERROR_LAUNCH_FAILED,
        CUDA_ERROR_MISALIGNED_ADDRESS,    CUDA_ERROR_ILLEGAL_INSTRUCTION,
        CUDA_ERROR_HARDWARE_STACK_ERROR,  CUDA_ERROR_INVALID_PC,
        CUDA_ERROR_INVALID_ADDRESS_SPACE, CUDA_ERROR_ASSERT,
        CUDA_ERROR_LAUNCH_TIMEOUT,        CUDA_ERROR_ECC_UNCORRECTABLE};
    for (size_t i = 0; i < sizeof sticky / sizeof sticky[0]; i++) {
        assert_true(cuda_result_is_fault(sticky[i]));
        cube_error *err =
            cuda_error(NULL, sticky[i], CUBE_ERR_INTERNAL, "step %zu", i);
        assert_int_equal(cube_error_code(err), CUBE_ERR_DEVICE_FAULT);
        assert_non_null(strstr(cube_error_message(err), "step"));
        cube_error_free(err);
    }
    static const CUresult plain[] = {CUDA_SUCCESS,
                                     CUDA_ERROR_INVALID_VALUE,
                                     CUDA_ERROR_OUT_OF_MEMORY,
                                     CUDA_ERROR_NOT_READY,
                                     CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES,
                                     CUDA_ERROR_STREAM_CAPTURE_INVALIDATED};
    for (size_t i = 0; i < sizeof plain / sizeof plain[0]; i++)
        assert_false(cuda_result_is_fault(plain[i]));
}

static void test_error_codes_and_text(void **state)
{
    (void)state;
    /* Out of memory is retryable, whatever code the caller proposed. */
    cube_error *err = cuda_error(NULL, CUDA_ERROR_OUT_OF_MEMORY,
                                 CUBE_ERR_INTERNAL, "cuMemAlloc of %d", 5);
    assert_int_equal(cube_error_code(err), CUBE_ERR_OUT_OF_MEMORY);
    assert_non_null(strstr(cube_error_message(err), "cuMemAlloc of 5"));
    cube_error_free(err);
    /* Other errors keep the proposed code; without the driver's names the
     * message still carries the numeric code. */
    err = cuda_error(NULL, CUDA_ERROR_INVALID_VALUE, CUBE_ERR_GRAPH_STATE,
                     "capture");
    assert_int_equal(cube_error_code(err), CUBE_ERR_GRAPH_STATE);
    assert_non_null(strstr(cube_error_message(err), "[code 1]"));
    cube_error_free(err);
    assert_non_null(strstr(cuda_result_text(NULL, 700), "code 700"));
}

/* An allocation that fails on a broken context is the device fault, not a
 * shortage: a sticky error itself, or any error once the context is known
 * to be broken (the driver may say out of memory). */
static void test_allocation_failures_consult_the_context(void **state)
{
    (void)state;
    assert_int_equal(cuda_alloc_code(CUDA_ERROR_OUT_OF_MEMORY, 0),
                     CUBE_ERR_OUT_OF_MEMORY);
    assert_int_equal(cuda_alloc_code(CUDA_ERROR_INVALID_VALUE, 0),
                     CUBE_ERR_OUT_OF_MEMORY);
    assert_int_equal(cuda_alloc_code(CUDA_ERROR_ILLEGAL_ADDRESS, 0),
                     CUBE_ERR_DEVICE_FAULT);
    assert_int_equal(cuda_alloc_code(CUDA_ERROR_LAUNCH_FAILED, 0),
                     CUBE_ERR_DEVICE_FAULT);
    assert_int_equal(cuda_alloc_code(CUDA_ERROR_OUT_OF_MEMORY, 1),
                     CUBE_ERR_DEVICE_FAULT);
    assert_int_equal(cuda_alloc_code(CUDA_ERROR_INVALID_VALUE, 1),
                     CUBE_ERR_DEVICE_FAULT);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_missing_driver_is_unavailable_and_says_why),
        cmocka_unit_test(test_sticky_errors_are_device_faults),
        cmocka_unit_test(test_error_codes_and_text),
        cmocka_unit_test(test_allocation_failures_consult_the_context),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
