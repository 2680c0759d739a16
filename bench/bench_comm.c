/* Collectives between the CPU backend's virtual devices (ranks are threads
 * of this process) beside the bandwidth bound of the same memory traffic:
 * an all-reduce of S bytes over N ranks reads every rank's source and
 * writes every rank's destination (N * S read, N * S written), which N
 * threads doing one memcpy of S bytes each also do. The ratio is that
 * memcpy time over the all-reduce's: 1.0 is the bound.
 *
 * Usage: bench_comm [MiB] (default 64). One thread per rank calls; the
 * median of 9 rounds is reported. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bench_util.h"
#include "cubert/cubert.h"

#define ROUNDS 9
#define MAX_RANKS 8

static void ok(cube_error *err, const char *what)
{
    if (!err)
        return;
    fprintf(stderr, "bench_comm: %s: %s\n", what, cube_error_message(err));
    exit(1);
}

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

typedef struct rank {
    cube_comm *comm;
    cube_handle src, dst;
    uint64_t count;
    pthread_barrier_t *start;
    unsigned char *a, *b; /* the memcpy peer's buffers */
    size_t bytes;
} rank;

static void *all_reduce_once(void *arg)
{
    rank *r = arg;
    pthread_barrier_wait(r->start);
    ok(cube_all_reduce(r->comm, r->src, r->dst, r->count, CUBE_DTYPE_F32,
                       CUBE_REDUCE_SUM),
       "all-reduce");
    return NULL;
}

static void *memcpy_once(void *arg)
{
    rank *r = arg;
    pthread_barrier_wait(r->start);
    memcpy(r->b, r->a, r->bytes);
    return NULL;
}

/* Runs `fn` on n threads at once; the wall time from release to the last
 * join. */
static double timed(rank *ranks, uint32_t n, void *(*fn)(void *))
{
    pthread_t t[MAX_RANKS];
    pthread_barrier_t start;
    pthread_barrier_init(&start, NULL, n + 1);
    for (uint32_t i = 0; i < n; i++) {
        ranks[i].start = &start;
        pthread_create(&t[i], NULL, fn, &ranks[i]);
    }
    double t0 = now_s();
    pthread_barrier_wait(&start);
    for (uint32_t i = 0; i < n; i++)
        pthread_join(t[i], NULL);
    double t1 = now_s();
    pthread_barrier_destroy(&start);
    return t1 - t0;
}

int main(int argc, char **argv)
{
    uint64_t mib = argc > 1 ? strtoull(argv[1], NULL, 10) : 64;
    if (!mib)
        mib = 64;
    size_t bytes = (size_t)(mib << 20);
    char model[256];
    bench_cpu_model(model, sizeof model);
    printf("all-reduce of %llu MiB f32 between CPU devices (%s, %ld cores)\n",
           (unsigned long long)mib, model, sysconf(_SC_NPROCESSORS_ONLN));
    printf("%6s %14s %14s %12s %8s\n", "ranks", "all-reduce ms", "memcpy ms",
           "GB/s moved", "ratio");
    setenv("CUBERT_CPU_DEVICES", "8", 1);
    static const uint32_t counts[] = {2, 4, 8};
    for (size_t k = 0; k < sizeof counts / sizeof counts[0]; k++) {
        uint32_t n = counts[k];
        cube_client *c[MAX_RANKS];
        cube_comm *comm[MAX_RANKS];
        rank ranks[MAX_RANKS];
        memset(ranks, 0, sizeof ranks);
        unsigned char *host = malloc(bytes);
        if (!host) {
            fprintf(stderr, "bench_comm: out of memory\n");
            return 1;
        }
        memset(host, 0, bytes);
        for (uint32_t i = 0; i < n; i++) {
            char name[16];
            snprintf(name, sizeof name, "cpu:%u", i);
            ok(cube_client_open(name, NULL, &c[i]), "open");
            ok(cube_create(c[i], host, bytes, &ranks[i].src), "create");
            ok(cube_empty(c[i], bytes, &ranks[i].dst), "empty");
            ranks[i].count = bytes / 4;
            ranks[i].a = malloc(bytes);
            ranks[i].b = malloc(bytes);
            if (!ranks[i].a || !ranks[i].b) {
                fprintf(stderr, "bench_comm: out of memory\n");
                return 1;
            }
            memset(ranks[i].a, 1, bytes);
            memset(ranks[i].b, 2, bytes);
            ranks[i].bytes = bytes;
        }
        free(host);
        ok(cube_comm_init_all(c, n, NULL, comm), "comm");
        for (uint32_t i = 0; i < n; i++)
            ranks[i].comm = comm[i];
        double ar[ROUNDS], mc[ROUNDS];
        timed(ranks, n, all_reduce_once); /* warm-up */
        timed(ranks, n, memcpy_once);
        for (int r = 0; r < ROUNDS; r++) {
            ar[r] = timed(ranks, n, all_reduce_once);
            mc[r] = timed(ranks, n, memcpy_once);
        }
        double a = median(ar, ROUNDS), m = median(mc, ROUNDS);
        printf("%6u %14.2f %14.2f %12.2f %8.3f\n", n, a * 1e3, m * 1e3,
               2.0 * n * (double)bytes / a / 1e9, m / a);
        for (uint32_t i = 0; i < n; i++) {
            cube_comm_destroy(comm[i]);
            ok(cube_handle_release(c[i], ranks[i].src), "release");
            ok(cube_handle_release(c[i], ranks[i].dst), "release");
            cube_client_close(c[i]);
            free(ranks[i].a);
            free(ranks[i].b);
        }
    }
    return 0;
}
