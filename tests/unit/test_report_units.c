/* The memory report's table form prints byte counts in binary units
 * people read at a glance; the JSON form keeps exact integers. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "cubert/cubert.h"

static void test_table_uses_binary_units_json_exact_bytes(void **state)
{
    (void)state;
    cube_memory_report r;
    memset(&r, 0, sizeof r);
    r.count = 1;
    r.pools[0].config.kind = CUBE_POOL_SLICED;
    r.pools[0].config.page_size = 2u << 20; /* 2 MiB */
    r.pools[0].config.min_size = 131073;    /* 128 KiB + 1 B */
    r.pools[0].config.max_size = 3u << 30;  /* 3 GiB */
    r.pools[0].bytes_in_use = 115159;       /* 112.46 KiB */
    r.pools[0].bytes_reserved = 1000;       /* 1000 B */
    r.usage.bytes_reserved = 5ull << 40;    /* 5 TiB */
    char *t = cube_memory_report_format(&r, CUBE_REPORT_TABLE);
    assert_non_null(t);
    assert_non_null(strstr(t, "2 MiB"));
    assert_non_null(strstr(t, "128 KiB+1B"));
    assert_non_null(strstr(t, "3 GiB"));
    assert_non_null(strstr(t, "112.46 KiB"));
    assert_non_null(strstr(t, "1000 B"));
    assert_non_null(strstr(t, "5 TiB reserved"));
    free(t);
    char *j = cube_memory_report_format(&r, CUBE_REPORT_JSON);
    assert_non_null(j);
    assert_non_null(strstr(j, "\"min_size\":131073"));
    assert_non_null(strstr(j, "\"bytes_in_use\":115159"));
    free(j);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_table_uses_binary_units_json_exact_bytes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
