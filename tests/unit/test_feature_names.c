/* cube_feature_name: every CUBE_FEATURE_* bit of cubert/client.h has its
 * enumerator's name in lower case; 0, several bits and unknown bits have
 * none. Read from the header itself, so a new bit cannot go unnamed. */
#include <ctype.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "cubert/cubert.h"

static void test_every_bit_of_the_header_is_named(void **state)
{
    (void)state;
    FILE *f = fopen(CUBE_SOURCE_DIR "/include/cubert/client.h", "r");
    assert_non_null(f);
    char line[256];
    uint32_t seen = 0;
    while (fgets(line, sizeof line, f)) {
        char name[64];
        unsigned shift;
        if (sscanf(line, " CUBE_FEATURE_%63[A-Z0-9_] = 1u << %u", name,
                   &shift) != 2)
            continue;
        for (char *p = name; *p; p++)
            *p = (char)tolower((unsigned char)*p);
        const char *got = cube_feature_name(1u << shift);
        assert_non_null(got);
        assert_string_equal(got, name);
        seen |= 1u << shift;
    }
    fclose(f);
    assert_true(seen & CUBE_FEATURE_KERNELS);
    assert_null(cube_feature_name(0));
    assert_null(cube_feature_name(CUBE_FEATURE_F64 | CUBE_FEATURE_GRAPHS));
    for (uint32_t bit = 1; bit; bit <<= 1)
        if (!(seen & bit))
            assert_null(cube_feature_name(bit));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_bit_of_the_header_is_named),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
