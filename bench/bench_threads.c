/* Launch throughput from several threads sharing one client, against the
 * single-thread figure from the same run.
 *
 * Each thread launches a tiny kernel (one cube of 4 units, writing its own
 * buffer) on its own stream as fast as it can, for a fixed number of
 * launches; the figure is launches per second over all threads. A second
 * table does the same with the threads sharing one input buffer that one
 * of them rewrites (reads from other streams of a buffer written on
 * another stream), against each thread using only its own buffers.
 *
 * A last table sets the cost of a dependency across streams beside one on
 * the same stream: pairs of launches where the second reads what the first
 * wrote, both on one stream, or the first on stream 1 and the second on
 * stream 2 (cube_stream_use), so the second waits for exactly that write.
 *
 * `./build/bench/bench_threads [DEVICE]` (DEVICE defaults to cpu; part of
 * `make bench`).
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cubert/cubert.h>

#define LAUNCHES 20000
#define ROUNDS 5

static const char tiny_src[] =
    "CUBE_KERNEL(tiny, CUBE_IN(float, x), CUBE_OUT(float, y))\n"
    "{\n"
    "    y[UNIT_POS_X] = x[UNIT_POS_X] + 1.0f;\n"
    "}\n";

static cube_client *client;
static cube_kernel *tiny;
static cube_handle shared_input;

typedef struct worker {
    pthread_t thread;
    int share; /* read the shared input instead of an own one */
    int failed;
} worker;

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void *work(void *arg)
{
    worker *w = arg;
    cube_handle x = {0}, y = {0};
    float init[4] = {1, 2, 3, 4};
    cube_error *err = cube_create(client, init, sizeof init, &x);
    if (!err)
        err = cube_empty(client, sizeof init, &y);
    cube_arg args[2] = {cube_arg_buffer(w->share ? shared_input : x),
                        cube_arg_buffer(y)};
    for (int i = 0; i < LAUNCHES && !err; i++)
        err = cube_launch(client, tiny, cube_count_static(1, 1, 1), args, 2,
                          CUBE_LAUNCH_EXECUTE);
    if (!err)
        err = cube_sync(client, NULL, 0);
    if (err) {
        char *text = cube_error_format(err);
        fprintf(stderr, "bench_threads: %s", text ? text : "?\n");
        free(text);
        cube_error_free(err);
        w->failed = 1;
    }
    cube_error_free(cube_handle_release(client, x));
    cube_error_free(cube_handle_release(client, y));
    return NULL;
}

/* Launches per second with `n` threads, best of ROUNDS. */
static double measure(int n, int share)
{
    double best = 0;
    for (int r = 0; r < ROUNDS; r++) {
        worker w[8];
        memset(w, 0, sizeof w);
        double t0 = now_s();
        for (int i = 0; i < n; i++) {
            w[i].share = share;
            pthread_create(&w[i].thread, NULL, work, &w[i]);
        }
        for (int i = 0; i < n; i++)
            pthread_join(w[i].thread, NULL);
        double dt = now_s() - t0;
        for (int i = 0; i < n; i++)
            if (w[i].failed)
                return -1;
        double rate = (double)n * LAUNCHES / dt;
        if (rate > best)
            best = rate;
    }
    return best;
}

#define PAIRS 20000

static const char step_src[] =
    "CUBE_KERNEL(step, CUBE_INOUT(uint32_t, x))\n"
    "{\n"
    "    if (ABSOLUTE_POS_X == 0)\n"
    "        CUBE_AT(x, 0) = CUBE_AT(x, 0) * 3u + 1u;\n"
    "}\n";

/* Seconds per dependent pair, best of ROUNDS; checks the final value
 * against the same recurrence on the host. */
static double pairs(cube_kernel *step, int cross)
{
    double best = 1e30;
    for (int r = 0; r < ROUNDS; r++) {
        uint32_t v = 7, want = 7;
        cube_handle x;
        cube_error *err = cube_create(client, &v, 4, &x);
        cube_arg a[1] = {cube_arg_buffer(x)};
        double t0 = now_s();
        for (int i = 0; i < PAIRS && !err; i++) {
            for (int k = 0; k < 2 && !err; k++) {
                if (cross)
                    err = cube_stream_use(client, (cube_stream_id)(1 + k));
                if (!err)
                    err = cube_launch(client, step, cube_count_static(1, 1, 1),
                                      a, 1, CUBE_LAUNCH_EXECUTE);
                want = want * 3u + 1u;
            }
        }
        cube_copy_desc d = cube_copy_desc_contiguous(x, 4, 4);
        void *dst = &v;
        uint64_t size = 4;
        if (!err)
            err = cube_read(client, &d, &dst, &size, 1);
        double dt = now_s() - t0;
        cube_error_free(cube_stream_use(client, 0));
        cube_error_free(cube_handle_release(client, x));
        if (err || v != want) {
            fprintf(stderr, "bench_threads: dependent pairs %s: %s\n",
                    cross ? "across streams" : "on one stream",
                    err ? cube_error_message(err) : "wrong result");
            cube_error_free(err);
            exit(1);
        }
        if (dt / PAIRS < best)
            best = dt / PAIRS;
    }
    return best;
}

int main(int argc, char **argv)
{
    const char *device = argc > 1 ? argv[1] : "cpu";
    cube_error *err = cube_client_open(device, NULL, &client);
    cube_kernel_desc d = {"tiny", tiny_src, {4, 1, 1}};
    float init[4] = {1, 2, 3, 4};
    if (!err)
        err = cube_kernel_create(&d, &tiny);
    if (!err)
        err = cube_create(client, init, sizeof init, &shared_input);
    if (err) {
        fprintf(stderr, "bench_threads: %s\n", cube_error_message(err));
        cube_error_free(err);
        return 1;
    }
    cube_properties p;
    cube_error_free(cube_client_properties(client, &p));
    printf("# cubert launch throughput from several threads\n\n");
    printf("- machine: %s, %u worker threads; %d launches per thread, best "
           "of %d rounds\n\n",
           p.name, p.compute_units, LAUNCHES, ROUNDS);
    printf("| Threads | launches/s, own buffers | launches/s, shared input "
           "| own ÷ 1 thread | shared ÷ own |\n|---:|---:|---:|---:|---:|\n");
    double one = 0;
    int counts[4] = {1, 2, 4, 8};
    for (int i = 0; i < 4; i++) {
        double own = measure(counts[i], 0);
        double shared = measure(counts[i], 1);
        if (own < 0 || shared < 0)
            return 1;
        if (i == 0)
            one = own;
        printf("| %d | %.0f | %.0f | %.2f | %.2f |\n", counts[i], own, shared,
               own / one, shared / own);
    }
    printf("\nEach thread works on its own stream. 'Shared input' reads one "
           "buffer from every stream.\n");

    cube_kernel *step = NULL;
    cube_kernel_desc sd = {"step", step_src, {1, 1, 1}};
    err = cube_kernel_create(&sd, &step);
    if (err) {
        fprintf(stderr, "bench_threads: %s\n", cube_error_message(err));
        cube_error_free(err);
        return 1;
    }
    pairs(step, 0); /* compiles, warms the pools */
    double same = pairs(step, 0), cross = pairs(step, 1);
    printf("\n# a dependency across streams against one on the same "
           "stream\n\n");
    printf("| Dependent pair (write, then a write reading it) | µs per pair "
           "| ÷ same stream |\n|---|---:|---:|\n");
    printf("| both launches on one stream | %.3f | 1.00 |\n", same * 1e6);
    printf("| first on stream 1, second on stream 2 | %.3f | %.2f |\n",
           cross * 1e6, cross / same);
    printf("\n%d pairs per round, best of %d rounds, final value checked "
           "against the host; includes the read at the end.\n",
           PAIRS, ROUNDS);
    cube_kernel_release(step);
    cube_error_free(cube_handle_release(client, shared_input));
    cube_kernel_release(tiny);
    cube_client_close(client);
    return 0;
}
