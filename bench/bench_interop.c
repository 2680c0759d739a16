/* The host cost of sharing memory: cube_wrap_memory + cube_handle_release
 * of memory another library owns, beside cube_empty + cube_handle_release
 * on a pool hit, and cube_native_buffer_get, on one device (the CPU, or
 * the one named). Medians of 9 rounds of 100,000 pairs, per pair.
 *
 * Usage: bench_interop [DEVICE] */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "bench_util.h"
#include "cubert/cubert.h"

#define ROUNDS 9
#define PAIRS 100000

static void ok(cube_error *err, const char *what)
{
    if (!err)
        return;
    fprintf(stderr, "bench_interop: %s: %s\n", what, cube_error_message(err));
    exit(1);
}

static double now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e9 + (double)t.tv_nsec;
}

static void nothing(void *user)
{
    (void)user;
}

int main(int argc, char **argv)
{
    const char *device = argc > 1 ? argv[1] : "cpu";
    char model[256];
    bench_cpu_model(model, sizeof model);
    cube_client *c = NULL;
    ok(cube_client_open(device, NULL, &c), "open");
    /* What to wrap: the native memory of a buffer of a second client. */
    cube_client *owner = NULL;
    ok(cube_client_open(device, NULL, &owner), "open");
    cube_handle held;
    ok(cube_empty(owner, 1 << 20, &held), "empty");
    cube_native_buffer nb;
    ok(cube_native_buffer_get(owner, held, &nb), "native");
    double wrap[ROUNDS], empty[ROUNDS], native[ROUNDS];
    for (int r = 0; r < ROUNDS; r++) {
        double t0 = now_ns();
        for (int i = 0; i < PAIRS; i++) {
            cube_handle h;
            ok(cube_wrap_memory(c, nb.address, nb.size, nothing, NULL, &h),
               "wrap");
            ok(cube_handle_release(c, h), "release");
        }
        double t1 = now_ns();
        for (int i = 0; i < PAIRS; i++) {
            cube_handle h;
            ok(cube_empty(c, 1 << 20, &h), "empty");
            ok(cube_handle_release(c, h), "release");
        }
        double t2 = now_ns();
        for (int i = 0; i < PAIRS; i++) {
            cube_native_buffer x;
            ok(cube_native_buffer_get(owner, held, &x), "native");
        }
        double t3 = now_ns();
        wrap[r] = (t1 - t0) / PAIRS;
        empty[r] = (t2 - t1) / PAIRS;
        native[r] = (t3 - t2) / PAIRS;
    }
    printf("%s on %s\n\n", device, model);
    printf("| %s | wrap + release | empty + release (pool hit) | "
           "native address |\n| --- | ---: | ---: | ---: |\n",
           device);
    printf("| ns per call | %.1f | %.1f | %.1f |\n", median(wrap, ROUNDS),
           median(empty, ROUNDS), median(native, ROUNDS));
    ok(cube_handle_release(owner, held), "release");
    cube_client_close(owner);
    cube_client_close(c);
    return 0;
}
