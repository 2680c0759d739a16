/* Choosing how a stream's memory is pooled: a layout of one's own (small
 * buffers packed into 64 KiB pages, the rest one page each), installed
 * before the stream allocates, then the expandable preset (virtual
 * address ranges whose pages are mapped on demand). The report shows
 * where the buffers went; the counters what it cost.
 * Build: cc memory_layout.c $(pkg-config --cflags --libs cubert) */
#include <stdio.h>
#include <stdlib.h>

#include "example_util.h"

static void show(cube_client *c, const char *title)
{
    cube_memory_report rep;
    check(cube_memory_report_get(c, &rep), "report");
    char *text = cube_memory_report_format(&rep, CUBE_REPORT_TABLE);
    printf("%s\n%s\n", title, text ? text : "");
    free(text);
}

int main(int argc, char **argv)
{
    cube_client *c;
    check(cube_client_open(argc > 1 ? argv[1] : NULL, NULL, &c), "open");

    /* Two pools, in routing order: requests up to 4 KiB share 64 KiB
     * pages; anything larger gets a page of its own, given back after
     * 100 ms unused. */
    cube_memory_layout mine = {0};
    mine.count = 2;
    mine.pools[0] =
        (cube_pool_config){CUBE_POOL_SLICED, 64 << 10, 1, 4 << 10, 0, 0};
    mine.pools[1] = (cube_pool_config){
        CUBE_POOL_EXCLUSIVE, 1ull << 30, (4 << 10) + 1, 1ull << 30, 0, 100};
    check(cube_memory_layout_validate(c, &mine), "validate");
    check(cube_install_memory_pools(c, &mine), "install");

    enum { SMALL = 100 };
    cube_handle small[SMALL], big;
    for (int i = 0; i < SMALL; i++)
        check(cube_empty(c, 1024, &small[i]), "small buffer");
    check(cube_empty(c, 3 << 20, &big), "big buffer");
    cube_memory_report rep;
    check(cube_memory_report_get(c, &rep), "report");
    /* 100 KiB of small buffers fill two 64 KiB pages. */
    int ok = rep.pools[0].buffers == SMALL && rep.pools[0].pages == 2 &&
             rep.pools[1].buffers == 1;
    show(c, "a layout of one's own: 100 buffers of 1 KiB and one of 3 MiB");
    for (int i = 0; i < SMALL; i++)
        check(cube_handle_release(c, small[i]), "release");
    check(cube_handle_release(c, big), "release");

    /* The expandable preset, where the device's storage has virtual
     * memory: large buffers come from one reserved range, its pages
     * mapped when first used and given back by cleanup. */
    cube_memory_layout expandable;
    check(cube_memory_layout_preset(c, CUBE_PRESET_EXPANDABLE, &expandable),
          "preset");
    cube_error *err = cube_install_memory_pools(c, &expandable);
    if (err && cube_error_code(err) == CUBE_ERR_UNSUPPORTED) {
        printf("this device has no virtual memory for the expandable "
               "preset: %s\n",
               cube_error_message(err));
        cube_error_free(err);
    } else {
        check(err, "install expandable");
        cube_handle h[4];
        for (int i = 0; i < 4; i++)
            check(cube_empty(c, (uint64_t)(i + 1) << 20, &h[i]), "buffer");
        for (int i = 0; i < 4; i++)
            check(cube_handle_release(c, h[i]), "release");
        check(cube_memory_cleanup(c), "cleanup");
        cube_memory_stats st = {.struct_size = sizeof st};
        check(cube_memory_stats_get(c, CUBE_MEMORY_STREAM, &st), "stats");
        printf("stream so far: %llu allocations; %llu device allocations "
               "and page maps, %llu frees and unmaps; %llu bytes reserved "
               "after cleanup\n",
               (unsigned long long)st.allocations,
               (unsigned long long)st.device_allocations,
               (unsigned long long)st.device_frees,
               (unsigned long long)st.reserved_bytes);
        ok = ok && st.allocations >= 4;
    }
    cube_client_close(c);
    printf("%s\n", ok ? "ok" : "WRONG");
    return ok ? 0 : 1;
}
