/* Summing a million floats: each cube adds its units' partial sums as a
 * tree in shared memory, waiting at cube_sync() between levels, and one
 * unit per cube adds the cube's total to the result atomically (the kernel
 * of docs/kernels.md). The result is checked against plain C.
 * Build: cc reduction.c $(pkg-config --cflags --libs cubert) */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "example_util.h"

static const char *source =
    "#define SUM_UNITS 256\n"
    "CUBE_KERNEL(sum_all, CUBE_IN(float, x), CUBE_INOUT(float, total),\n"
    "            CUBE_SHARED(float, partial, SUM_UNITS))\n"
    "{\n"
    "    uint32_t u = UNIT_POS_X;\n"
    "    uint64_t stride = (uint64_t)CUBE_COUNT_X * CUBE_DIM_X;\n"
    "    float acc = 0.0f;\n"
    "    for (uint64_t i = ABSOLUTE_POS_X; i < CUBE_LEN(x); i += stride)\n"
    "        acc += CUBE_AT(x, i);\n"
    "    partial[u] = acc;\n"
    "    cube_sync();\n"
    "    for (uint32_t half = SUM_UNITS / 2; half > 0; half /= 2) {\n"
    "        if (u < half)\n"
    "            partial[u] += partial[u + half];\n"
    "        cube_sync();\n"
    "    }\n"
    "    if (u == 0)\n"
    "        cube_atomic_add_f32(&CUBE_AT(total, 0), partial[0]);\n"
    "}\n";

int main(int argc, char **argv)
{
    enum { N = 1 << 20 };
    float *x = malloc(N * sizeof *x);
    if (!x)
        return 1;
    double want = 0;
    for (int i = 0; i < N; i++) {
        x[i] = (float)(i % 1000) * 0.001f;
        want += x[i];
    }

    cube_client *c;
    check(cube_client_open(argc > 1 ? argv[1] : NULL, NULL, &c), "open");
    cube_kernel *k;
    cube_kernel_desc desc = {"sum_all", source, {256, 1, 1}};
    check(cube_kernel_create(&desc, &k), "kernel");
    cube_handle hx, htotal;
    float zero = 0.0f;
    check(cube_create(c, x, N * sizeof *x, &hx), "create x");
    check(cube_create(c, &zero, sizeof zero, &htotal), "create total");

    cube_arg args[] = {cube_arg_buffer(hx), cube_arg_buffer(htotal)};
    check(cube_launch(c, k, cube_count_static(64, 1, 1), args, 2,
                      CUBE_LAUNCH_EXECUTE),
          "launch");
    float total;
    check(cube_read_all(c, htotal, &total, sizeof total), "read");

    /* Float sums in another order differ in the last bits. */
    int ok = fabs(total - want) <= 1e-4 * want;
    printf("sum of %d floats: %.3f (plain C: %.3f) %s\n", N, total, want,
           ok ? "ok" : "WRONG");

    check(cube_handle_release(c, hx), "release");
    check(cube_handle_release(c, htotal), "release");
    cube_kernel_release(k);
    cube_client_close(c);
    free(x);
    return ok ? 0 : 1;
}
