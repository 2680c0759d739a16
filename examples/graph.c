/* A graph: three launches recorded once and replayed, with the input
 * rewritten between replays. Replay skips the launch path (no lookup, no
 * validation); on CUDA it is one driver call for the whole sequence.
 * The documented flow: prepare, run the sequence once (its buffers
 * exist), capture, replay.
 * Build: cc graph.c $(pkg-config --cflags --libs cubert) */
#include <stdio.h>
#include <stdlib.h>

#include "example_util.h"

static const char *source =
    "CUBE_KERNEL(axpb, CUBE_IN(float, x), CUBE_OUT(float, y),\n"
    "            CUBE_SCALAR(float, a), CUBE_SCALAR(float, b))\n"
    "{\n"
    "    uint32_t i = ABSOLUTE_POS_X;\n"
    "    if (i < CUBE_LEN(y))\n"
    "        CUBE_AT(y, i) = a * CUBE_AT(x, i) + b;\n"
    "}\n";

enum { N = 4096 };

/* y = 2x + 1, z = 3y, w = z - 5: three launches. */
static void sequence(cube_client *c, cube_kernel *k, cube_handle x,
                     cube_handle y, cube_handle z, cube_handle w)
{
    cube_count n = cube_count_static(N / 256, 1, 1);
    cube_arg a1[] = {cube_arg_buffer(x), cube_arg_buffer(y), cube_arg_f32(2),
                     cube_arg_f32(1)};
    cube_arg a2[] = {cube_arg_buffer(y), cube_arg_buffer(z), cube_arg_f32(3),
                     cube_arg_f32(0)};
    cube_arg a3[] = {cube_arg_buffer(z), cube_arg_buffer(w), cube_arg_f32(1),
                     cube_arg_f32(-5)};
    check(cube_launch(c, k, n, a1, 4, CUBE_LAUNCH_EXECUTE), "launch 1");
    check(cube_launch(c, k, n, a2, 4, CUBE_LAUNCH_EXECUTE), "launch 2");
    check(cube_launch(c, k, n, a3, 4, CUBE_LAUNCH_EXECUTE), "launch 3");
}

int main(int argc, char **argv)
{
    cube_client *c;
    check(cube_client_open(argc > 1 ? argv[1] : NULL, NULL, &c), "open");
    cube_kernel *k;
    cube_kernel_desc desc = {"axpb", source, {256, 1, 1}};
    check(cube_kernel_create(&desc, &k), "kernel");
    cube_handle x, y, z, w;
    check(cube_empty(c, N * 4, &x), "x");
    check(cube_empty(c, N * 4, &y), "y");
    check(cube_empty(c, N * 4, &z), "z");
    check(cube_empty(c, N * 4, &w), "w");
    float *v = malloc(N * 4);
    if (!v)
        return 1;
    for (int i = 0; i < N; i++)
        v[i] = 0;
    check(cube_write_all(c, x, v, N * 4), "write");

    check(cube_graph_prepare(c), "prepare");
    sequence(c, k, x, y, z, w); /* warm up: compiles, sizes the pools */
    check(cube_graph_begin(c), "begin");
    sequence(c, k, x, y, z, w); /* recorded, not run */
    cube_graph_id g;
    check(cube_graph_end(c, &g), "end");

    int ok = 1;
    for (int round = 1; round <= 3; round++) {
        for (int i = 0; i < N; i++)
            v[i] = (float)(round * i % 100);
        check(cube_write_all(c, x, v, N * 4), "write");
        check(cube_graph_replay(c, g), "replay");
        float *got = malloc(N * 4);
        if (!got)
            return 1;
        check(cube_read_all(c, w, got, N * 4), "read");
        for (int i = 0; i < N; i++)
            ok &= got[i] == 3 * (2 * v[i] + 1) - 5;
        printf("replay %d: w[7] = %g (3 (2x + 1) - 5 with x = %g)\n", round,
               got[7], v[7]);
        free(got);
    }
    printf("graph replays %s\n", ok ? "ok" : "WRONG");
    check(cube_graph_destroy(c, g), "destroy");
    cube_handle hs[] = {x, y, z, w};
    for (int i = 0; i < 4; i++)
        check(cube_handle_release(c, hs[i]), "release");
    free(v);
    cube_kernel_release(k);
    cube_client_close(c);
    return ok ? 0 : 1;
}
