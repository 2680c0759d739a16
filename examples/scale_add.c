/* The smallest complete cubert program: y = a*x + y on the CPU backend.
 * Build: cc scale_add.c $(pkg-config --cflags --libs cubert) */
#include <stdio.h>
#include <stdlib.h>

#include <cubert/cubert.h>

static const char *source =
    "CUBE_KERNEL(scale_add, CUBE_IN(float, x), CUBE_INOUT(float, y),\n"
    "            CUBE_SCALAR(float, a))\n"
    "{\n"
    "    int i = (int)ABSOLUTE_POS_X;\n"
    "    if (i < (int)CUBE_LEN(y))\n"
    "        CUBE_AT(y, i) = a * CUBE_AT(x, i) + CUBE_AT(y, i);\n"
    "}\n";

static int fail(cube_error *err)
{
    char *text = cube_error_format(err);
    fprintf(stderr, "%s", text ? text : "out of memory\n");
    free(text);
    cube_error_free(err);
    return 1;
}

int main(void)
{
    enum { N = 1000 };
    float x[N], y[N];
    for (int i = 0; i < N; i++) {
        x[i] = (float)i;
        y[i] = 1.0f;
    }

    cube_client *client;
    cube_error *err = cube_client_open("cpu", NULL, &client);
    if (err)
        return fail(err);

    cube_kernel *kernel;
    cube_kernel_desc desc = {"scale_add", source, {256, 1, 1}};
    cube_handle hx, hy;
    if ((err = cube_kernel_create(&desc, &kernel)) ||
        (err = cube_create(client, x, sizeof x, &hx)) ||
        (err = cube_create(client, y, sizeof y, &hy)))
        return fail(err);

    cube_arg args[] = {cube_arg_buffer(hx), cube_arg_buffer(hy),
                       cube_arg_f32(2.0f)};
    err = cube_launch(client, kernel, cube_count_static((N + 255) / 256, 1, 1),
                      args, 3, CUBE_LAUNCH_EXECUTE);
    if (err)
        return fail(err);

    /* The read fails, copying nothing, if the launch that should have
     * written y failed. */
    cube_copy_desc d = cube_copy_desc_contiguous(hy, sizeof y, sizeof(float));
    void *dst[] = {y};
    uint64_t size[] = {sizeof y};
    if ((err = cube_read(client, &d, dst, size, 1)))
        return fail(err);
    printf("y[10] = %g (expected 21)\n", y[10]);

    cube_error_free(cube_handle_release(client, hx));
    cube_error_free(cube_handle_release(client, hy));
    cube_kernel_release(kernel);
    cube_client_close(client);
    return y[10] == 21.0f ? 0 : 1;
}
