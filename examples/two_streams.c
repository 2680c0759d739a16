/* Two threads, two streams: each thread works on a stream of its own (the
 * default), fills a buffer and scales it with a kernel, with no lock and
 * no wait on the other; the main thread then reads both results. A read
 * waits for the work that wrote its buffer, on whichever stream it ran.
 * Build: cc two_streams.c $(pkg-config --cflags --libs cubert) -pthread */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "example_util.h"

static const char *source =
    "CUBE_KERNEL(scale, CUBE_INOUT(float, y), CUBE_SCALAR(float, a))\n"
    "{\n"
    "    uint32_t i = ABSOLUTE_POS_X;\n"
    "    if (i < CUBE_LEN(y))\n"
    "        CUBE_AT(y, i) = a * CUBE_AT(y, i);\n"
    "}\n";

enum { N = 100000 };

typedef struct {
    cube_client *c;
    cube_kernel *k;
    float factor;
    cube_handle out;
} job;

static void *worker(void *arg)
{
    job *j = arg;
    float *v = malloc(N * sizeof *v);
    if (!v)
        exit(1);
    for (int i = 0; i < N; i++)
        v[i] = (float)i;
    check(cube_create(j->c, v, N * sizeof *v, &j->out), "create");
    cube_arg args[] = {cube_arg_buffer(j->out), cube_arg_f32(j->factor)};
    check(cube_launch(j->c, j->k, cube_count_static((N + 255) / 256, 1, 1),
                      args, 2, CUBE_LAUNCH_EXECUTE),
          "launch");
    printf("thread scaling by %g worked on stream %llu\n", j->factor,
           (unsigned long long)cube_stream_current(j->c));
    free(v);
    return NULL;
}

int main(int argc, char **argv)
{
    cube_client *c;
    check(cube_client_open(argc > 1 ? argv[1] : NULL, NULL, &c), "open");
    cube_kernel *k;
    cube_kernel_desc desc = {"scale", source, {256, 1, 1}};
    check(cube_kernel_create(&desc, &k), "kernel");

    job jobs[2] = {{c, k, 2.0f, {0}}, {c, k, 3.0f, {0}}};
    pthread_t t[2];
    for (int i = 0; i < 2; i++)
        if (pthread_create(&t[i], NULL, worker, &jobs[i]) != 0)
            return 1;
    for (int i = 0; i < 2; i++)
        pthread_join(t[i], NULL);

    /* The main thread's stream reads what the workers' streams wrote. */
    float *got = malloc(N * sizeof *got);
    int ok = got != NULL;
    for (int j = 0; ok && j < 2; j++) {
        check(cube_read_all(c, jobs[j].out, got, N * sizeof *got), "read");
        for (int i = 0; i < N; i++)
            ok &= got[i] == jobs[j].factor * (float)i;
        check(cube_handle_release(c, jobs[j].out), "release");
    }
    printf("both results %s\n", ok ? "ok" : "WRONG");
    free(got);
    cube_kernel_release(k);
    cube_client_close(c);
    return ok ? 0 : 1;
}
