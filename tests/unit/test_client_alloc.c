/* cube_client_open when memory runs out: an open that cannot allocate
 * what the client needs fails with CUBE_ERR_OUT_OF_MEMORY and leaves
 * nothing behind, never a client that cannot hold a buffer.
 *
 * This executable is linked with -Wl,--wrap=calloc (tests/CMakeLists.txt),
 * so every calloc of the statically linked library comes through
 * __wrap_calloc below, which can refuse chosen calls. Calls from shared
 * libraries (libc itself, cmocka) are not wrapped. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "core/client_internal.h"
#include "cubert/cubert.h"

void *__real_calloc(size_t n, size_t size);
void *__wrap_calloc(size_t n, size_t size);

/* Refuse the call numbered fail_at (1-based) after arming, or every call
 * for fail_n elements of fail_size bytes. Tests run on one thread; the
 * backends' own threads see the counters too, which is why the sweep
 * below uses the null backend (no threads). */
static int armed;
static unsigned long calls, fail_at;
static size_t fail_n, fail_size;

void *__wrap_calloc(size_t n, size_t size)
{
    if (armed) {
        calls++;
        if (calls == fail_at || (fail_n && n == fail_n && size == fail_size))
            return NULL;
    }
    return __real_calloc(n, size);
}

static void disarm(void)
{
    armed = 0;
    calls = fail_at = 0;
    fail_n = fail_size = 0;
}

static int built(const char *backend)
{
    for (const char *const *n = cube_backend_names(); *n; n++)
        if (strcmp(*n, backend) == 0)
            return 1;
    return 0;
}

/* The client opened usably: a buffer round trip. */
static void expect_usable(cube_client *c)
{
    unsigned char in[64], out[64];
    for (size_t i = 0; i < sizeof in; i++)
        in[i] = (unsigned char)(i * 7 + 1);
    cube_handle h;
    cube_error *err = cube_create(c, in, sizeof in, &h);
    if (err)
        print_error("%s\n", cube_error_message(err));
    assert_null(err);
    cube_copy_desc d = cube_copy_desc_contiguous(h, sizeof out, 1);
    void *dst[1] = {out};
    uint64_t size[1] = {sizeof out};
    assert_null(cube_read(c, &d, dst, size, 1));
    assert_memory_equal(in, out, sizeof in);
    assert_null(cube_handle_release(c, h));
}

/* The handle table's chunk array cannot be allocated: the open fails
 * (it used to succeed with a client whose every allocation failed), and
 * failing it over and over leaks nothing that a later open needs. */
static void open_fails_when_the_handle_table_cannot_be_allocated(void **state)
{
    (void)state;
    static const char *const devices[] = {"null", "cpu"};
    for (size_t k = 0; k < sizeof devices / sizeof devices[0]; k++) {
        if (!built(devices[k]))
            continue;
        /* More failed opens than clients may be open at once. */
        int rounds = k == 0 ? 5000 : 20; /* the CPU backend's is slower */
        for (int round = 0; round < rounds; round++) {
            fail_n = CORE_MAX_CHUNKS;
            fail_size = sizeof(_Atomic(core_slot *));
            armed = 1;
            cube_client *c = (cube_client *)&fail_n; /* must be reset */
            cube_error *err = cube_client_open(devices[k], NULL, &c);
            disarm();
            if (cube_error_code(err) != CUBE_ERR_OUT_OF_MEMORY)
                print_error("%s, round %d: %s\n", devices[k], round,
                            err ? cube_error_message(err) : "opened");
            assert_int_equal(cube_error_code(err), CUBE_ERR_OUT_OF_MEMORY);
            cube_error_free(err);
            assert_null(c);
        }
        cube_client *c = NULL;
        assert_null(cube_client_open(devices[k], NULL, &c));
        expect_usable(c);
        cube_client_close(c);
    }
}

/* Each calloc of an open refused in turn: every open either fails with
 * CUBE_ERR_OUT_OF_MEMORY and no client, or gives a usable client. */
static void open_with_each_calloc_refused_in_turn_fails_cleanly(void **state)
{
    (void)state;
    if (!built("null"))
        skip();
    /* The configuration is read at the first open; read it now. */
    cube_client *c = NULL;
    assert_null(cube_client_open("null", NULL, &c));
    cube_client_close(c);
    unsigned long refused = 0;
    for (unsigned long k = 1;; k++) {
        fail_at = k;
        armed = 1;
        c = NULL;
        cube_error *err = cube_client_open("null", NULL, &c);
        unsigned long made = calls;
        disarm();
        if (err) {
            if (cube_error_code(err) != CUBE_ERR_OUT_OF_MEMORY)
                print_error("calloc %lu refused: %s\n", k,
                            cube_error_message(err));
            assert_int_equal(cube_error_code(err), CUBE_ERR_OUT_OF_MEMORY);
            cube_error_free(err);
            assert_null(c);
            refused++;
            continue;
        }
        assert_non_null(c);
        expect_usable(c);
        cube_client_close(c);
        if (made < k)
            break; /* the open made fewer calls: all were refused once */
    }
    assert_true(refused >= 2); /* the client and its handle table */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(open_fails_when_the_handle_table_cannot_be_allocated),
        cmocka_unit_test(open_with_each_calloc_refused_in_turn_fails_cleanly),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
