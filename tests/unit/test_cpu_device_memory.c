/* The memory a virtual CPU device reports: the host's physical memory
 * shared evenly among $CUBERT_CPU_DEVICES devices, so that two devices do
 * not each claim the whole machine. The figure is described before an
 * open and by an open client alike, and it bounds the largest buffer. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdlib.h>
#include <unistd.h>

#include <cubert/cubert.h>

static void ok(cube_error *err)
{
    if (err) {
        char *text = cube_error_format(err);
        cube_error_free(err);
        fail_msg("unexpected error: %s", text ? text : "?");
    }
}

static void expect_code(cube_error *err, cube_code code)
{
    cube_code got = cube_error_code(err);
    cube_error_free(err);
    assert_int_equal(got, code);
}

static uint64_t host_memory(void)
{
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    assert_true(pages > 0 && page > 0);
    return (uint64_t)pages * (uint64_t)page;
}

static uint64_t page_size(void)
{
    return (uint64_t)sysconf(_SC_PAGESIZE);
}

static uint64_t described_memory(const char *device)
{
    cube_device_info info;
    ok(cube_device_describe(device, &info));
    assert_int_equal(info.properties.max_buffer_size,
                     info.properties.memory_total);
    return info.properties.memory_total;
}

static void test_one_device_reports_the_host(void **state)
{
    (void)state;
    unsetenv("CUBERT_CPU_DEVICES");
    assert_int_equal(described_memory("cpu:0"), host_memory());
}

static void test_two_devices_share_the_host(void **state)
{
    (void)state;
    setenv("CUBERT_CPU_DEVICES", "2", 1);
    uint64_t host = host_memory();
    uint64_t share = host / 2 / page_size() * page_size();
    /* Before an open: each device describes its share, and the two add
     * up to the machine at most. */
    assert_int_equal(described_memory("cpu:0"), share);
    assert_int_equal(described_memory("cpu:1"), share);
    assert_true(2 * share <= host);

    /* Open: the clients say the same, and a buffer above the share is
     * too big for the device, while the device stays usable. */
    cube_client *c[2];
    ok(cube_client_open("cpu:0", NULL, &c[0]));
    ok(cube_client_open("cpu:1", NULL, &c[1]));
    for (int i = 0; i < 2; i++) {
        cube_properties p;
        ok(cube_client_properties(c[i], &p));
        assert_int_equal(p.memory_total, share);
        assert_int_equal(p.max_buffer_size, share);
        cube_handle h = {0};
        expect_code(cube_empty(c[i], share + 1, &h), CUBE_ERR_BUFFER_TOO_BIG);
        assert_int_equal(h.bits, 0);
        uint32_t in[4] = {1, 2, 3, (uint32_t)i}, out[4] = {0};
        ok(cube_create(c[i], in, sizeof in, &h));
        ok(cube_read_all(c[i], h, out, sizeof out));
        assert_memory_equal(in, out, sizeof in);
        ok(cube_handle_release(c[i], h));
    }
    cube_client_close(c[0]);
    cube_client_close(c[1]);
    unsetenv("CUBERT_CPU_DEVICES");
    assert_int_equal(described_memory("cpu:0"), host);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_one_device_reports_the_host),
        cmocka_unit_test(test_two_devices_share_the_host),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
