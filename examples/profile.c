/* Seeing what ran: a profiling window around some launches (how long their
 * work took, and how that was measured), a trace file that Perfetto or
 * chrome://tracing opens (every launch, copy and allocation as an event),
 * and the memory report of the calling stream.
 * Build: cc profile.c $(pkg-config --cflags --libs cubert)
 * Run: ./profile [DEVICE] [TRACE.json] */
#include <stdio.h>
#include <stdlib.h>

#include "example_util.h"

static const char *source =
    "CUBE_KERNEL(square, CUBE_INOUT(float, y))\n"
    "{\n"
    "    uint32_t i = ABSOLUTE_POS_X;\n"
    "    if (i < CUBE_LEN(y))\n"
    "        CUBE_AT(y, i) = CUBE_AT(y, i) * CUBE_AT(y, i);\n"
    "}\n";

int main(int argc, char **argv)
{
    const char *trace = argc > 2 ? argv[2] : "cubert-trace.json";
    check(cube_trace_start(trace), "trace");
    cube_client *c;
    check(cube_client_open(argc > 1 ? argv[1] : NULL, NULL, &c), "open");
    cube_kernel *k;
    cube_kernel_desc desc = {"square", source, {256, 1, 1}};
    check(cube_kernel_create(&desc, &k), "kernel");
    enum { N = 1 << 22 };
    cube_handle y;
    check(cube_empty(c, N * 4, &y), "empty");
    cube_arg arg = cube_arg_buffer(y);
    cube_count n = cube_count_static(N / 256, 1, 1);
    check(cube_launch(c, k, n, &arg, 1, CUBE_LAUNCH_EXECUTE), "warm up");

    cube_profile_token t;
    check(cube_profile_start(c, &t), "profile");
    for (int i = 0; i < 10; i++)
        check(cube_launch(c, k, n, &arg, 1, CUBE_LAUNCH_EXECUTE), "launch");
    cube_profile_result r;
    check(cube_profile_end(c, t, &r), "profile end");
    printf("%llu launches over %d floats: %.3f ms (%s)\n",
           (unsigned long long)r.launches, N, r.seconds * 1e3,
           r.method == CUBE_TIMING_DEVICE ? "device timer" : "host clock");

    cube_memory_report rep;
    check(cube_memory_report_get(c, &rep), "report");
    char *text = cube_memory_report_format(&rep, CUBE_REPORT_TABLE);
    printf("%s", text ? text : "");
    free(text);

    check(cube_handle_release(c, y), "release");
    cube_kernel_release(k);
    cube_client_close(c);
    check(cube_trace_stop(), "trace stop");
    printf("trace written to %s (open it in https://ui.perfetto.dev)\n", trace);
    return r.launches == 10 ? 0 : 1;
}
