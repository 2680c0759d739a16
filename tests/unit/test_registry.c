/* Unit tests of the backend registry: the table CMake generates from the
 * list of backends agrees with itself and with the lookups, and a backend
 * the project has but this build left out is told apart from a name that
 * is no backend at all. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>

#include "core/client_internal.h"
#include "core/registry.h"

static size_t count(const char *const *names)
{
    size_t n = 0;
    while (names[n])
        n++;
    return n;
}

static void test_names_match_the_backends(void **state)
{
    (void)state;
    const cube_backend *const *all = core_backends();
    const char *const *names = cube_backend_names();
    assert_non_null(all);
    assert_non_null(names);
    size_t n = count(names);
    int cpu = 0;
    for (size_t i = 0; i < n; i++) {
        /* The name a folder registers is the name its struct carries. */
        assert_non_null(all[i]);
        assert_string_equal(all[i]->name, names[i]);
        assert_non_null(all[i]->device_count);
        assert_non_null(all[i]->open);
        assert_ptr_equal(core_backend_find(names[i]), all[i]);
        assert_false(core_backend_left_out(names[i]));
        for (size_t j = 0; j < i; j++)
            assert_string_not_equal(names[j], names[i]);
        cpu |= strcmp(names[i], "cpu") == 0;
    }
    assert_null(all[n]);
    assert_true(cpu);
}

static void test_unknown_names_are_not_found(void **state)
{
    (void)state;
    static const char *const unknown[] = {"nosuch", "", "CPU", "cpu0"};
    for (size_t i = 0; i < sizeof unknown / sizeof unknown[0]; i++) {
        assert_null(core_backend_find(unknown[i]));
        assert_false(core_backend_left_out(unknown[i]));
    }
    cube_client *c = NULL;
    cube_error *err = cube_client_open("nosuch", NULL, &c);
    assert_int_equal(cube_error_code(err), CUBE_ERR_NOT_FOUND);
    assert_non_null(strstr(cube_error_message(err), "nosuch"));
    cube_error_free(err);
    assert_null(c);
}

static void test_left_out_backends_are_unavailable(void **state)
{
    (void)state;
    /* The public list is the registry's, and shares no name with the
     * backends built. */
    assert_ptr_equal(cube_backend_names_left_out(), core_registry_left_out);
    for (size_t i = 0; core_registry_left_out[i]; i++)
        for (size_t j = 0; cube_backend_names()[j]; j++)
            assert_string_not_equal(core_registry_left_out[i],
                                    cube_backend_names()[j]);
    for (size_t i = 0; core_registry_left_out[i]; i++) {
        const char *name = core_registry_left_out[i];
        assert_true(core_backend_left_out(name));
        assert_null(core_backend_find(name));
        cube_client *c = NULL;
        cube_error *err = cube_client_open(name, NULL, &c);
        assert_int_equal(cube_error_code(err), CUBE_ERR_UNAVAILABLE);
        assert_non_null(
            strstr(cube_error_message(err), "not part of this build"));
        assert_non_null(strstr(cube_error_message(err), name));
        cube_error_free(err);
        assert_null(c);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_names_match_the_backends),
        cmocka_unit_test(test_unknown_names_are_not_found),
        cmocka_unit_test(test_left_out_backends_are_unavailable),
    };
    return cmocka_run_group_tests_name("registry", tests, NULL, NULL);
}
