/* A 2-D stencil with its tile and a one-point halo in shared memory (the
 * kernel of docs/kernels.md): out = 0.5 * in + 0.125 * (the four
 * neighbours), points outside the grid reading 0. Each cube loads its
 * tile once, waits at cube_sync(), then every unit reads its five points
 * from shared memory. The result is checked against plain C.
 * Build: cc stencil.c $(pkg-config --cflags --libs cubert) -lm */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "example_util.h"

static const char *source =
    "#define BX 32\n"
    "#define BY 8\n"
    "#define PITCH (BX + 2)\n"
    "#define LOAD(xx, yy)                                                \\\n"
    "    ((xx) >= 0 && (xx) < (int64_t)w && (yy) >= 0 && (yy) < (int64_t)h \\\n"
    "         ? CUBE_AT(in, (uint64_t)(yy) * w + (uint64_t)(xx))         \\\n"
    "         : 0.0f)\n"
    "CUBE_KERNEL(stencil_shared, CUBE_IN(float, in), CUBE_OUT(float, out),\n"
    "            CUBE_SCALAR(uint32_t, w), CUBE_SCALAR(uint32_t, h),\n"
    "            CUBE_SHARED(float, t, PITCH * (BY + 2)))\n"
    "{\n"
    "    int tx = UNIT_POS_X, ty = UNIT_POS_Y;\n"
    "    int64_t x = ABSOLUTE_POS_X, y = ABSOLUTE_POS_Y;\n"
    "    int c = (ty + 1) * (BX + 2) + tx + 1;\n"
    "    t[c] = LOAD(x, y);\n"
    "    if (tx == 0)\n"
    "        t[c - 1] = LOAD(x - 1, y);\n"
    "    if (tx == BX - 1)\n"
    "        t[c + 1] = LOAD(x + 1, y);\n"
    "    if (ty == 0)\n"
    "        t[c - PITCH] = LOAD(x, y - 1);\n"
    "    if (ty == BY - 1)\n"
    "        t[c + PITCH] = LOAD(x, y + 1);\n"
    "    cube_sync();\n"
    "    float v = 0.5f * t[c] +\n"
    "              0.125f * (t[c - 1] + t[c + 1] + t[c - PITCH] + "
    "t[c + PITCH]);\n"
    "    if (x < w && y < h)\n"
    "        CUBE_AT(out, (uint64_t)y * w + (uint64_t)x) = v;\n"
    "}\n";

/* The same stencil in plain C, point by point. */
static float at(const float *in, long w, long h, long x, long y)
{
    return x >= 0 && x < w && y >= 0 && y < h ? in[y * w + x] : 0.0f;
}

int main(int argc, char **argv)
{
    /* Not multiples of the tile: the edge cubes have units outside. */
    enum { W = 1000, H = 700 };
    float *in = malloc(sizeof(float) * W * H);
    float *out = malloc(sizeof(float) * W * H);
    if (!in || !out)
        return 1;
    for (long i = 0; i < (long)W * H; i++)
        in[i] = (float)((i * 7919) % 101) * 0.01f;

    cube_client *c;
    check(cube_client_open(argc > 1 ? argv[1] : NULL, NULL, &c), "open");
    cube_kernel *k;
    cube_kernel_desc desc = {"stencil_shared", source, {32, 8, 1}};
    check(cube_kernel_create(&desc, &k), "kernel");
    cube_handle hin, hout;
    check(cube_create(c, in, sizeof(float) * W * H, &hin), "create in");
    check(cube_empty(c, sizeof(float) * W * H, &hout), "empty out");
    cube_arg args[] = {cube_arg_buffer(hin), cube_arg_buffer(hout),
                       cube_arg_u32(W), cube_arg_u32(H)};
    check(cube_launch(c, k, cube_count_static((W + 31) / 32, (H + 7) / 8, 1),
                      args, 4, CUBE_LAUNCH_EXECUTE),
          "launch");
    check(cube_read_all(c, hout, out, sizeof(float) * W * H), "read");

    long wrong = 0;
    for (long y = 0; y < H; y++)
        for (long x = 0; x < W; x++) {
            float want =
                0.5f * at(in, W, H, x, y) +
                0.125f * (at(in, W, H, x - 1, y) + at(in, W, H, x + 1, y) +
                          at(in, W, H, x, y - 1) + at(in, W, H, x, y + 1));
            if (fabsf(out[y * W + x] - want) > 1e-5f)
                wrong++;
        }
    printf("5-point stencil over %dx%d points: %ld differ from plain C %s\n", W,
           H, wrong, wrong ? "WRONG" : "ok");

    check(cube_handle_release(c, hin), "release");
    check(cube_handle_release(c, hout), "release");
    cube_kernel_release(k);
    cube_client_close(c);
    free(in);
    free(out);
    return wrong ? 1 : 0;
}
