/* cubert CPU benchmarks.
 *
 * Every cubert figure is printed beside a peer measured in the same run on
 * the same machine, with the ratio, as markdown table rows that can be
 * pasted into docs/BENCHMARKS.md:
 *
 *  (a) bandwidth: y = a*x + y over 64 MiB of floats per array (cube dim
 *      256), counting 12 bytes per element (read x, read y, write y).
 *      Peers: the same loop in plain C under an OpenMP `parallel for` with
 *      the same thread count as the CPU backend's pool, on host arrays of
 *      the same size; and memcpy of 64 MiB split over the same threads,
 *      counting 2 bytes moved per byte copied (read + write). The memcpy is
 *      a ceiling for streaming memory traffic, not the same work.
 *  (b) launch latency: launch + cube_sync(client, NULL, 0) of a tiny kernel
 *      (1 cube of 64 units; and a 4096-element axpy, 16 cubes of 256),
 *      median of many iterations, against an OpenMP `parallel for` over the
 *      same elements (fork + work + join).
 *  (c) compile cache: the first CUBE_LAUNCH_SKIP launch of a never-seen
 *      kernel on a client whose cache directory is a fresh temporary one
 *      (cold: runs the compiler); the first SKIP launch on a new client over
 *      the same directory (disk-cache hit); a second SKIP launch on that
 *      client (in-memory hit). Ratios are against the cold compile.
 *  (d) graph replay: a tiny kernel (1 cube of 4 units) launched 100 times
 *      into a graph; the time of a replay divided by the 100 launches it
 *      runs, against 100 direct cube_launch calls divided by 100 (both
 *      closed by one cube_sync), median over rounds that alternate the two.
 *  (e) profiling overhead: launch + cube_sync of the tiny kernel of (b),
 *      against cube_profile_start + launch + cube_profile_end (which waits
 *      for the launch, as the sync does); and the same around 100 launches.
 *      Medians; the two sides alternate iteration by iteration.
 *  (f) barrier kernels (cube_sync()), three of docs/kernels.md: the tiled
 *      SGEMM at 512^3 (cube dim 16x16, GFLOP/s counting 2n^3), the
 *      shared-memory sum of 16 Mi floats (cube dim 256, 128 cubes, GB/s
 *      counting 4 bytes read per element) and the 5-point stencil over
 *      2048 x 2048 floats with its halo in shared memory (cube dim 32x8,
 *      GB/s counting 4 bytes read and 4 written per point), each with its
 *      units as loops between barriers (cpu_barriers auto, the barrier
 *      pass) and as fibers (cpu_barriers fibers), on clients of their own.
 *      Peers, built with the JIT's flags (bench_cpu_peers.c): the plain C
 *      i-k-j loop and an OpenMP `parallel for simd` reduction; for the
 *      stencil, the same stencil in cube C without shared memory or a
 *      barrier (its units run as one loop). Medians of 7 rounds that
 *      alternate the contenders with 50 ms pauses, after one warm-up
 *      round. PoCL, where libOpenCL.so.1 and PoCL's CPU device are found
 *      (bench_pocl.c): the same three kernels in OpenCL C in the same
 *      rounds, then the axpy over 16 Mi floats and the tiny kernel of (b)
 *      beside cubert's; its kernels are built and run once before the
 *      warm-up round, so its compilation is not timed.
 *  (g) bounds modes: a gather y[i] = x[idx[i]] through CUBE_AT over 16 Mi
 *      floats (cube dim 256), launched unchecked, checked
 *      (CUBE_LAUNCH_CHECKED) and validating (CUBE_LAUNCH_VALIDATE), every
 *      index in range; median of 9 rounds that alternate the three, GB/s
 *      counting 12 bytes per element. Ratios are against unchecked.
 *
 * `bench_cpu [SECTIONS]` runs the sections named by their letters (e.g.
 * `bench_cpu f`), all by default.
 *
 * Times use clock_gettime(CLOCK_MONOTONIC). The whole run takes well under
 * a minute.
 */
#include <errno.h>
#include <ftw.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#ifdef _OPENMP
#include <omp.h>
#define OMP_PARALLEL_FOR _Pragma("omp parallel for schedule(static)")
#define OMP_PARALLEL _Pragma("omp parallel")
#define OMP_PARALLEL_FOR_SUM _Pragma("omp parallel for reduction(+ : sum)")
#else
#define OMP_PARALLEL_FOR
#define OMP_PARALLEL
#define OMP_PARALLEL_FOR_SUM
static int omp_get_thread_num(void)
{
    return 0;
}
static int omp_get_num_threads(void)
{
    return 1;
}
#endif

#include "bench_cpu_peers.h"
#include "bench_pocl.h"
#include "bench_util.h"
#include "cubert/cubert.h"

/* --- helpers --- */

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec * 1e-3;
}

static void pause_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Prints the error in full and frees it; the bench then exits 1. */
static int failed(cube_error *err, const char *what)
{
    if (!err)
        return 0;
    char *text = cube_error_format(err);
    fprintf(stderr, "bench_cpu: %s failed:\n%s\n", what,
            text ? text : cube_error_message(err));
    free(text);
    cube_error_free(err);
    return 1;
}

static cube_error *make_kernel(const char *name, const char *source,
                               uint32_t dim, cube_kernel **out)
{
    cube_kernel_desc desc;
    memset(&desc, 0, sizeof desc);
    desc.name = name;
    desc.source = source;
    desc.cube_dim[0] = dim;
    desc.cube_dim[1] = 1;
    desc.cube_dim[2] = 1;
    return cube_kernel_create(&desc, out);
}

static void row(const char *what, const char *ours, const char *peer,
                const char *theirs, double ratio, const char *note)
{
    printf("| %s | %s | %s | %s | %.3g%s |\n", what, ours, peer, theirs, ratio,
           note ? note : "");
}

static void table_header(const char *ratio_label)
{
    printf("| Benchmark | cubert | Peer | Peer value | %s |\n", ratio_label);
    printf("|---|---:|---|---:|---:|\n");
}

/* A compute-bound loop (no memory traffic), in seconds. */
static double compute_loop_s(long iters)
{
    double t0 = now_us();
    double sum = 0.0;
    OMP_PARALLEL_FOR_SUM
    for (long i = 0; i < iters; i++)
        sum += (double)(i & 7) * 1e-9;
    volatile double sink = sum;
    (void)sink;
    return (now_us() - t0) * 1e-6;
}

/* How much faster a compute-bound OpenMP loop runs on `threads` threads
 * than on one: shared or throttled hosts may give far less than `threads`,
 * and every parallel figure below should be read against it. */
static double compute_scaling(int threads)
{
#ifdef _OPENMP
    const long iters = 100000000L;
    double one[3], all[3];
    for (int r = 0; r < 3; r++) {
        omp_set_num_threads(1);
        one[r] = compute_loop_s(iters);
        omp_set_num_threads(threads);
        all[r] = compute_loop_s(iters);
    }
    return median(one, 3) / median(all, 3);
#else
    (void)threads;
    (void)compute_loop_s;
    return 1.0;
#endif
}

static void print_machine(const cube_properties *p, int threads)
{
    long nproc = sysconf(_SC_NPROCESSORS_ONLN);
    char model[256];
    bench_cpu_model(model, sizeof model);
    printf("# cubert CPU benchmarks\n\n");
    printf("- machine: %ld online CPUs, %s\n", nproc, model);
    printf("- cubert %d.%d.%d, device: %s (%s), %u worker threads\n",
           CUBE_VERSION_MAJOR, CUBE_VERSION_MINOR, CUBE_VERSION_PATCH, p->name,
           p->architecture, p->compute_units);
#ifdef _OPENMP
    printf("- peers: plain C (gcc %s, -O2) with OpenMP, %d threads\n",
           __VERSION__, threads);
    printf("- compute scaling: a compute-bound OpenMP loop runs %.2fx "
           "faster on %d threads than on 1 (ideal: %d)\n",
           compute_scaling(threads), threads, threads);
#else
    printf("- peers: plain C (-O2), 1 thread: built without OpenMP\n");
    (void)threads;
#endif
    printf("\n");
}

/* --- kernels --- */

/* The same kernel with a signed and with an unsigned index: on the CPU
 * backend gcc splits a guarded loop on a signed index and vectorizes it
 * plainly, while an unsigned one (which may wrap) stays scalar. */
static const char axpy_src[] =
    "CUBE_KERNEL(axpy, CUBE_SCALAR(float, a), CUBE_IN(float, x),\n"
    "            CUBE_INOUT(float, y), CUBE_SCALAR(int32_t, n))\n"
    "{\n"
    "    int i = (int)ABSOLUTE_POS_X;\n"
    "    if (i < n)\n"
    "        y[i] = a * x[i] + y[i];\n"
    "}\n";

static const char axpy_unsigned_src[] =
    "CUBE_KERNEL(axpy, CUBE_SCALAR(float, a), CUBE_IN(float, x),\n"
    "            CUBE_INOUT(float, y), CUBE_SCALAR(uint32_t, n))\n"
    "{\n"
    "    unsigned int i = ABSOLUTE_POS_X;\n"
    "    if (i < n)\n"
    "        y[i] = a * x[i] + y[i];\n"
    "}\n";

static const char tiny_src[] = "CUBE_KERNEL(tiny, CUBE_INOUT(float, y))\n"
                               "{\n"
                               "    y[UNIT_POS_X] += 1.0f;\n"
                               "}\n";

/* --- (a) bandwidth --- */

#define BW_BYTES (64ull << 20)
#define BW_N ((uint32_t)(BW_BYTES / sizeof(float)))
#define BW_REPS 15

static void omp_axpy(float a, const float *x, float *y, uint32_t n)
{
    OMP_PARALLEL_FOR
    for (uint32_t i = 0; i < n; i++)
        y[i] = a * x[i] + y[i];
}

static void omp_memcpy(void *dst, const void *src, size_t bytes)
{
    OMP_PARALLEL
    {
        size_t t = (size_t)omp_get_thread_num();
        size_t nt = (size_t)omp_get_num_threads();
        size_t chunk = (bytes / nt + 63) & ~(size_t)63;
        size_t begin = t * chunk;
        size_t end = begin + chunk < bytes ? begin + chunk : bytes;
        if (begin < end)
            memcpy((char *)dst + begin, (const char *)src + begin, end - begin);
    }
}

static int bench_bandwidth(cube_client *c, cube_kernel *axpy, int threads,
                           const char *label, int header)
{
    const uint32_t n = BW_N;
    const float a = 0.5f;
    float *x = malloc(BW_BYTES), *y = malloc(BW_BYTES);
    float *dst = malloc(BW_BYTES);
    cube_handle hx = {0}, hy = {0};
    int rc = 1;
    if (!x || !y || !dst) {
        fprintf(stderr, "bench_cpu: out of host memory\n");
        goto done;
    }
    /* First touch by the threads that will use the pages. */
    OMP_PARALLEL_FOR
    for (uint32_t i = 0; i < n; i++) {
        x[i] = (float)(i & 1023) * (1.0f / 1024.0f);
        y[i] = 0.0f;
        dst[i] = 0.0f;
    }
    if (failed(cube_create(c, x, BW_BYTES, &hx), "cube_create(x)") ||
        failed(cube_create(c, y, BW_BYTES, &hy), "cube_create(y)"))
        goto done;

    double tk[BW_REPS], to[BW_REPS], tc[BW_REPS];
    const double moved = 12.0 * n;
    cube_count count = cube_count_static(n / 256, 1, 1);
    cube_arg args[4] = {cube_arg_f32(a), cube_arg_buffer(hx),
                        cube_arg_buffer(hy), cube_arg_u32(n)};

    /* The three contenders take turns, one run each per round, and the
     * order rotates every round: on this kind of host the first run after
     * a pause is often slower, so each contender goes first equally often
     * and a drift of the machine's speed hits all three alike. A short
     * pause between runs lets the other side's idle threads stop
     * spinning. Two warm-up rounds first (the kernel's first launch
     * compiles it). */
    int launches = 0;
    for (int r = -2; r < BW_REPS; r++) {
        double d[3] = {0, 0, 0};
        for (int turn = 0; turn < 3; turn++) {
            int who = (turn + (r + 2)) % 3;
            double t0 = now_us();
            if (who == 0) {
                if (failed(cube_launch(c, axpy, count, args, 4, 0),
                           "axpy launch") ||
                    failed(cube_sync(c, &hy, 1), "cube_sync"))
                    goto done;
                launches++;
            } else if (who == 1) {
                omp_axpy(a, x, y, n);
            } else {
                omp_memcpy(dst, r & 1 ? x : y, BW_BYTES);
            }
            d[who] = now_us() - t0;
            pause_ms(5);
        }
        if (r >= 0) {
            tk[r] = d[0];
            to[r] = d[1];
            tc[r] = d[2];
        }
    }
    double kern_gbs = moved / median(tk, BW_REPS) * 1e-3;
    double omp_gbs = moved / median(to, BW_REPS) * 1e-3;
    /* memcpy: 2 bytes moved (read + write) per byte copied. */
    double cpy_gbs = 2.0 * (double)BW_BYTES / median(tc, BW_REPS) * 1e-3;
    /* Keep the copies observable. */
    volatile float sink = dst[n / 3] + y[n / 7];
    (void)sink;

    /* Sanity: the kernel's y = launches * a * x. */
    {
        float *back = dst;
        cube_copy_desc d = cube_copy_desc_contiguous(hy, BW_BYTES, 4);
        void *out = back;
        uint64_t size = BW_BYTES;
        if (failed(cube_read(c, &d, (void *const *)&out, &size, 1),
                   "cube_read(y)"))
            goto done;
        double worst = 0.0;
        for (uint32_t i = 0; i < n; i += 4099) {
            double want = (double)launches * a * x[i];
            double e = fabs(back[i] - want) / (want > 0 ? want : 1.0);
            if (!(e <= worst))
                worst = e;
        }
        if (worst > 1e-4) {
            fprintf(stderr,
                    "bench_cpu: axpy result is wrong (relative error "
                    "%.3g)\n",
                    worst);
            goto done;
        }
    }

    if (header) {
        printf("## (a) Elementwise bandwidth: y = a*x + y, 64 MiB per array "
               "(12 bytes/element), median of %d\n\n",
               BW_REPS);
        table_header("cubert ÷ peer");
    }
    char ours[64], peer[96], theirs[64];
    snprintf(ours, sizeof ours, "%.2f GB/s", kern_gbs);
    snprintf(peer, sizeof peer, "C loop, OpenMP parallel for, %d threads",
             threads);
    snprintf(theirs, sizeof theirs, "%.2f GB/s", omp_gbs);
    row(label, ours, peer, theirs, kern_gbs / omp_gbs, NULL);
    snprintf(peer, sizeof peer,
             "memcpy 64 MiB split over %d threads (read+write counted)",
             threads);
    snprintf(theirs, sizeof theirs, "%.2f GB/s", cpy_gbs);
    row(label, ours, peer, theirs, kern_gbs / cpy_gbs, NULL);
    if (!header)
        printf("\n");
    rc = 0;

done:
    if (hx.bits)
        rc |= failed(cube_handle_release(c, hx), "cube_handle_release");
    if (hy.bits)
        rc |= failed(cube_handle_release(c, hy), "cube_handle_release");
    free(x);
    free(y);
    free(dst);
    return rc;
}

/* --- (b) launch latency --- */

#define LAT_ITERS 2000
#define LAT_WARMUP 100

static void omp_tiny(float *y, uint32_t n)
{
    OMP_PARALLEL_FOR
    for (uint32_t i = 0; i < n; i++)
        y[i] += 1.0f;
}

/* Median launch + cube_sync(client, NULL, 0), in µs. */
static int time_launches(cube_client *c, cube_kernel *k, cube_count count,
                         const cube_arg *args, size_t nargs, double *out)
{
    static double t[LAT_ITERS];
    for (int r = -LAT_WARMUP; r < LAT_ITERS; r++) {
        double t0 = now_us();
        cube_error *err = cube_launch(c, k, count, args, nargs, 0);
        if (!err)
            err = cube_sync(c, NULL, 0);
        double dt = now_us() - t0;
        if (failed(err, "launch + cube_sync"))
            return 1;
        if (r >= 0)
            t[r] = dt;
    }
    *out = median(t, LAT_ITERS);
    return 0;
}

static int bench_latency(cube_client *c, cube_kernel *axpy, int threads)
{
    static double t[LAT_ITERS];
    float host[4096], xs[4096];
    for (int i = 0; i < 4096; i++) {
        host[i] = 0.0f;
        xs[i] = (float)i;
    }
    cube_kernel *tiny = NULL;
    cube_handle hy = {0}, hx = {0}, hy2 = {0};
    int rc = 1;
    if (failed(make_kernel("tiny", tiny_src, 64, &tiny),
               "cube_kernel_create(tiny)") ||
        failed(cube_create(c, host, 64 * sizeof(float), &hy), "cube_create") ||
        failed(cube_create(c, xs, sizeof xs, &hx), "cube_create") ||
        failed(cube_create(c, host, sizeof host, &hy2), "cube_create"))
        goto done;

    double k64, k4096, o64, o4096;
    pause_ms(50);
    cube_arg a1[1] = {cube_arg_buffer(hy)};
    if (time_launches(c, tiny, cube_count_static(1, 1, 1), a1, 1, &k64))
        goto done;
    cube_arg a2[4] = {cube_arg_f32(1e-3f), cube_arg_buffer(hx),
                      cube_arg_buffer(hy2), cube_arg_u32(4096)};
    if (time_launches(c, axpy, cube_count_static(16, 1, 1), a2, 4, &k4096))
        goto done;
    pause_ms(50);

    for (int r = -LAT_WARMUP; r < LAT_ITERS; r++) {
        double t0 = now_us();
        omp_tiny(host, 64);
        double dt = now_us() - t0;
        if (r >= 0)
            t[r] = dt;
    }
    o64 = median(t, LAT_ITERS);
    for (int r = -LAT_WARMUP; r < LAT_ITERS; r++) {
        double t0 = now_us();
        omp_axpy(1e-3f, xs, host, 4096);
        double dt = now_us() - t0;
        if (r >= 0)
            t[r] = dt;
    }
    o4096 = median(t, LAT_ITERS);
    volatile float sink = host[17];
    (void)sink;

    printf("## (b) Launch-to-completion latency: launch + cube_sync, median "
           "of %d (after %d warm-up)\n\n",
           LAT_ITERS, LAT_WARMUP);
    table_header("cubert ÷ peer");
    char ours[64], peer[96], theirs[64];
    snprintf(peer, sizeof peer,
             "OpenMP parallel for over 64 elements, %d "
             "threads",
             threads);
    snprintf(ours, sizeof ours, "%.2f µs", k64);
    snprintf(theirs, sizeof theirs, "%.2f µs", o64);
    row("tiny kernel, 1 cube x 64 units", ours, peer, theirs, k64 / o64, NULL);
    snprintf(peer, sizeof peer,
             "OpenMP parallel for axpy over 4096 "
             "elements, %d threads",
             threads);
    snprintf(ours, sizeof ours, "%.2f µs", k4096);
    snprintf(theirs, sizeof theirs, "%.2f µs", o4096);
    row("axpy kernel, 4096 elements (16 cubes x 256)", ours, peer, theirs,
        k4096 / o4096, NULL);
    printf("\n");
    rc = 0;

done:
    if (hy.bits)
        rc |= failed(cube_handle_release(c, hy), "cube_handle_release");
    if (hx.bits)
        rc |= failed(cube_handle_release(c, hx), "cube_handle_release");
    if (hy2.bits)
        rc |= failed(cube_handle_release(c, hy2), "cube_handle_release");
    cube_kernel_release(tiny);
    return rc;
}

/* --- (c) compile cache --- */

#define CACHE_REPS 3

static int rm_entry(const char *path, const struct stat *sb, int flag,
                    struct FTW *ftw)
{
    (void)sb;
    (void)flag;
    (void)ftw;
    if (remove(path) != 0)
        fprintf(stderr, "bench_cpu: cannot remove %s: %s\n", path,
                strerror(errno));
    return 0;
}

/* One SKIP launch of `k` on `c` (which must compile, load or find it),
 * timed in ms. */
static int skip_launch(cube_client *c, cube_kernel *k, double *ms)
{
    cube_handle hx = {0}, hy = {0};
    float v[256] = {0};
    int rc = 1;
    if (failed(cube_create(c, v, sizeof v, &hx), "cube_create") ||
        failed(cube_create(c, v, sizeof v, &hy), "cube_create"))
        goto done;
    cube_arg args[4] = {cube_arg_f32(1.0f), cube_arg_buffer(hx),
                        cube_arg_buffer(hy), cube_arg_u32(256)};
    double t0 = now_us();
    cube_error *err = cube_launch(c, k, cube_count_static(1, 1, 1), args, 4,
                                  CUBE_LAUNCH_SKIP);
    *ms = (now_us() - t0) * 1e-3;
    if (failed(err, "SKIP launch"))
        goto done;
    rc = 0;
done:
    if (hx.bits)
        rc |= failed(cube_handle_release(c, hx), "cube_handle_release");
    if (hy.bits)
        rc |= failed(cube_handle_release(c, hy), "cube_handle_release");
    return rc;
}

static int bench_cache(void)
{
    char dir[] = "/tmp/cubert-bench-XXXXXX";
    if (!mkdtemp(dir)) {
        fprintf(stderr, "bench_cpu: mkdtemp: %s\n", strerror(errno));
        return 1;
    }
    double cold[CACHE_REPS], disk[CACHE_REPS], mem[CACHE_REPS];
    int rc = 1;
    for (int r = 0; r < CACHE_REPS; r++) {
        /* A fresh cache directory per round (the JIT creates it). */
        char sub[sizeof dir + 16];
        snprintf(sub, sizeof sub, "%s/r%d", dir, r);
        cube_client_options opts = cube_client_options_default();
        opts.cache_dir = sub;
        /* A source no cache has seen: a unique comment. */
        char src[sizeof axpy_src + 128];
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        snprintf(src, sizeof src, "/* bench_cpu cold %ld %lld.%09ld #%d */\n%s",
                 (long)getpid(), (long long)ts.tv_sec, ts.tv_nsec, r, axpy_src);
        cube_kernel *k = NULL;
        if (failed(make_kernel("axpy", src, 256, &k), "cube_kernel_create"))
            goto done;

        cube_client *c1 = NULL;
        if (failed(cube_client_open("cpu", &opts, &c1), "cube_client_open")) {
            cube_kernel_release(k);
            goto done;
        }
        int bad = skip_launch(c1, k, &cold[r]);
        cube_client_close(c1);

        cube_client *c2 = NULL;
        if (!bad &&
            failed(cube_client_open("cpu", &opts, &c2), "cube_client_open"))
            bad = 1;
        if (!bad)
            bad = skip_launch(c2, k, &disk[r]) || skip_launch(c2, k, &mem[r]);
        cube_client_close(c2);
        cube_kernel_release(k);
        if (bad)
            goto done;
    }
    double c0 = median(cold, CACHE_REPS), d0 = median(disk, CACHE_REPS),
           m0 = median(mem, CACHE_REPS);

    printf("## (c) Compile cache: first CUBE_LAUNCH_SKIP launch, median of "
           "%d fresh kernels\n\n",
           CACHE_REPS);
    table_header("cubert ÷ cold");
    char ours[64], theirs[64], note[64];
    snprintf(theirs, sizeof theirs, "%.3g ms", c0);
    row("cold compile (fresh cache dir, unique source)", theirs, "cold compile",
        theirs, 1.0, NULL);
    snprintf(ours, sizeof ours, "%.3g ms", d0);
    snprintf(note, sizeof note, " (%.0fx faster)", c0 / d0);
    row("disk-cache hit (new client, same cache dir)", ours, "cold compile",
        theirs, d0 / c0, note);
    snprintf(ours, sizeof ours, "%.3g ms", m0);
    snprintf(note, sizeof note, " (%.0fx faster)", c0 / m0);
    row("in-memory hit (second SKIP launch, same client)", ours, "cold compile",
        theirs, m0 / c0, note);
    printf("\n");
    rc = 0;

done:
    nftw(dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    return rc;
}

/* --- (d) graph replay --- */

#define GRAPH_LAUNCHES 100
#define GRAPH_REPLAYS 20
#define GRAPH_ROUNDS 60

/* One timed block: GRAPH_REPLAYS replays of `g`, or as many rounds of
 * GRAPH_LAUNCHES direct launches, closed by a barrier; µs per launch. */
static int graph_block(cube_client *c, cube_graph_id g, cube_kernel *k,
                       const cube_arg *args, int direct, double *us)
{
    double t0 = now_us();
    cube_error *err = NULL;
    for (int r = 0; r < GRAPH_REPLAYS && !err; r++) {
        if (!direct) {
            err = cube_graph_replay(c, g);
            continue;
        }
        for (int i = 0; i < GRAPH_LAUNCHES && !err; i++)
            err = cube_launch(c, k, cube_count_static(1, 1, 1), args, 1, 0);
    }
    if (!err)
        err = cube_sync(c, NULL, 0);
    double dt = now_us() - t0;
    if (failed(err, direct ? "direct launches" : "graph replays"))
        return 1;
    *us = dt / (double)(GRAPH_REPLAYS * GRAPH_LAUNCHES);
    return 0;
}

static int bench_graph(cube_client *c)
{
    enum { UNITS = 4 };
    float host[UNITS] = {0};
    cube_kernel *k = NULL;
    cube_handle hy = {0};
    cube_graph_id g = 0;
    double tg[GRAPH_ROUNDS], td[GRAPH_ROUNDS];
    int rc = 1;
    if (failed(make_kernel("tiny", tiny_src, UNITS, &k),
               "cube_kernel_create(tiny)") ||
        failed(cube_create(c, host, sizeof host, &hy), "cube_create"))
        goto done;
    cube_arg args[1] = {cube_arg_buffer(hy)};
    /* Prepare, warm up (compiles), capture. */
    if (failed(cube_graph_prepare(c), "cube_graph_prepare"))
        goto done;
    for (int i = 0; i < GRAPH_LAUNCHES; i++)
        if (failed(cube_launch(c, k, cube_count_static(1, 1, 1), args, 1, 0),
                   "warm-up launch"))
            goto done;
    if (failed(cube_graph_begin(c), "cube_graph_begin"))
        goto done;
    cube_error *err = NULL;
    for (int i = 0; i < GRAPH_LAUNCHES && !err; i++)
        err = cube_launch(c, k, cube_count_static(1, 1, 1), args, 1, 0);
    cube_error *end = cube_graph_end(c, &g);
    if (failed(err, "captured launch") || failed(end, "cube_graph_end"))
        goto done;
    double runs = GRAPH_LAUNCHES; /* the warm-up */
    pause_ms(50);
    /* Two warm-up rounds, then rounds that alternate which side goes
     * first. */
    for (int r = -2; r < GRAPH_ROUNDS; r++) {
        double d[2];
        for (int turn = 0; turn < 2; turn++) {
            int direct = (turn + r + 2) % 2;
            if (graph_block(c, g, k, args, direct, &d[direct]))
                goto done;
            runs += GRAPH_REPLAYS * GRAPH_LAUNCHES;
        }
        if (r >= 0) {
            tg[r] = d[0];
            td[r] = d[1];
        }
    }
    /* Sanity: every launch, recorded or direct, added 1. */
    {
        float back[UNITS];
        cube_copy_desc d = cube_copy_desc_contiguous(hy, sizeof back, 4);
        void *out = back;
        uint64_t size = sizeof back;
        if (failed(cube_read(c, &d, (void *const *)&out, &size, 1),
                   "cube_read(y)"))
            goto done;
        for (int i = 0; i < UNITS; i++)
            if (back[i] != (float)runs) {
                fprintf(stderr,
                        "bench_cpu: graph result is wrong: y[%d] = %g, "
                        "expected %g\n",
                        i, (double)back[i], runs);
                goto done;
            }
    }
    double g0 = median(tg, GRAPH_ROUNDS), d0 = median(td, GRAPH_ROUNDS);

    printf("## (d) Graph replay: cost per recorded launch, %d launches per "
           "graph, %d replays per round, median of %d rounds\n\n",
           GRAPH_LAUNCHES, GRAPH_REPLAYS, GRAPH_ROUNDS);
    table_header("replay ÷ direct");
    char ours[64], theirs[64], note[64];
    snprintf(ours, sizeof ours, "%.3f µs", g0);
    snprintf(theirs, sizeof theirs, "%.3f µs", d0);
    snprintf(note, sizeof note, " (aim ≤ 0.3; %.1fx cheaper)", d0 / g0);
    row("graph replay, per launch (tiny kernel, 1 cube x 4 units)", ours,
        "direct cube_launch, per launch", theirs, g0 / d0, note);
    printf("\n");
    rc = 0;

done:
    if (g)
        rc |= failed(cube_graph_destroy(c, g), "cube_graph_destroy");
    if (hy.bits)
        rc |= failed(cube_handle_release(c, hy), "cube_handle_release");
    cube_kernel_release(k);
    return rc;
}

/* --- (e) profiling overhead --- */

#define PROF_ITERS 2000
#define PROF_WARMUP 100
#define PROF_BATCH 100

/* One iteration: `launches` launches closed by cube_sync (profiled == 0) or
 * by cube_profile_end of a window opened before them; µs. */
static int profile_iter(cube_client *c, cube_kernel *k, const cube_arg *args,
                        int launches, int profiled, double *us)
{
    cube_profile_token t = 0;
    cube_profile_result res;
    memset(&res, 0, sizeof res);
    double t0 = now_us();
    cube_error *err = profiled ? cube_profile_start(c, &t) : NULL;
    for (int i = 0; i < launches && !err; i++)
        err = cube_launch(c, k, cube_count_static(1, 1, 1), args, 1, 0);
    if (!err)
        err = profiled ? cube_profile_end(c, t, &res) : cube_sync(c, NULL, 0);
    *us = now_us() - t0;
    if (failed(err, profiled ? "profiled launch" : "launch + cube_sync"))
        return 1;
    if (profiled &&
        (res.launches != (uint64_t)launches || !(res.seconds > 0))) {
        fprintf(stderr,
                "bench_cpu: profile window reports %llu launches in %g s, "
                "expected %d in a positive time\n",
                (unsigned long long)res.launches, res.seconds, launches);
        return 1;
    }
    return 0;
}

/* Medians of the plain and the profiled side, alternating. */
static int profile_pair(cube_client *c, cube_kernel *k, const cube_arg *args,
                        int launches, int iters, double *plain,
                        double *profiled)
{
    static double tp[PROF_ITERS], tw[PROF_ITERS];
    for (int r = -PROF_WARMUP; r < iters; r++) {
        double d[2];
        for (int turn = 0; turn < 2; turn++) {
            int prof = (turn + r + PROF_WARMUP) % 2;
            if (profile_iter(c, k, args, launches, prof, &d[prof]))
                return 1;
        }
        if (r >= 0) {
            tp[r] = d[0];
            tw[r] = d[1];
        }
    }
    *plain = median(tp, (size_t)iters);
    *profiled = median(tw, (size_t)iters);
    return 0;
}

static int bench_profile(cube_client *c)
{
    float host[64] = {0};
    cube_kernel *k = NULL;
    cube_handle hy = {0};
    int rc = 1;
    if (failed(make_kernel("tiny", tiny_src, 64, &k),
               "cube_kernel_create(tiny)") ||
        failed(cube_create(c, host, sizeof host, &hy), "cube_create"))
        goto done;
    cube_arg args[1] = {cube_arg_buffer(hy)};
    double p1, w1, p100, w100;
    pause_ms(50);
    if (profile_pair(c, k, args, 1, PROF_ITERS, &p1, &w1) ||
        profile_pair(c, k, args, PROF_BATCH, PROF_ITERS / 10, &p100, &w100))
        goto done;

    printf("## (e) Profiling overhead: a profile window around the work, "
           "median of %d (1 launch) and %d (%d launches), after %d warm-up\n\n",
           PROF_ITERS, PROF_ITERS / 10, PROF_BATCH, PROF_WARMUP);
    table_header("profiled ÷ plain");
    char ours[64], theirs[64], note[64];
    snprintf(ours, sizeof ours, "%.2f µs", w1);
    snprintf(theirs, sizeof theirs, "%.2f µs", p1);
    snprintf(note, sizeof note, " (%+.2f µs)", w1 - p1);
    row("profile_start + launch + profile_end (tiny kernel, 1 cube x 64 "
        "units)",
        ours, "launch + cube_sync", theirs, w1 / p1, note);
    snprintf(ours, sizeof ours, "%.2f µs", w100);
    snprintf(theirs, sizeof theirs, "%.2f µs", p100);
    snprintf(note, sizeof note, " (%+.2f µs)", w100 - p100);
    row("profile_start + 100 launches + profile_end", ours,
        "100 launches + cube_sync", theirs, w100 / p100, note);
    printf("\n");
    rc = 0;

done:
    if (hy.bits)
        rc |= failed(cube_handle_release(c, hy), "cube_handle_release");
    cube_kernel_release(k);
    return rc;
}

/* --- main --- */

/* --- (f) barrier kernels --- */

static const char sgemm_src[] =
    "#define TILE 16\n"
    "CUBE_KERNEL(matmul_tiled, CUBE_IN(float, a), CUBE_IN(float, b),\n"
    "            CUBE_OUT(float, c), CUBE_SCALAR(uint32_t, n),\n"
    "            CUBE_SHARED(float, ta, TILE * TILE),\n"
    "            CUBE_SHARED(float, tb, TILE * TILE))\n"
    "{\n"
    "    uint32_t tx = UNIT_POS_X, ty = UNIT_POS_Y;\n"
    "    uint64_t row = ABSOLUTE_POS_Y, col = ABSOLUTE_POS_X;\n"
    "    float acc = 0.0f;\n"
    "    for (uint32_t t = 0; t < (n + TILE - 1) / TILE; t++) {\n"
    "        uint64_t ak = (uint64_t)t * TILE + tx;\n"
    "        uint64_t bk = (uint64_t)t * TILE + ty;\n"
    "        ta[ty * TILE + tx] = (row < n && ak < n) ? CUBE_AT(a, row * n + "
    "ak) : 0.0f;\n"
    "        tb[ty * TILE + tx] = (bk < n && col < n) ? CUBE_AT(b, bk * n + "
    "col) : 0.0f;\n"
    "        cube_sync();\n"
    "        for (uint32_t k = 0; k < TILE; k++)\n"
    "            acc += ta[ty * TILE + k] * tb[k * TILE + tx];\n"
    "        cube_sync();\n"
    "    }\n"
    "    if (row < n && col < n)\n"
    "        CUBE_AT(c, row * n + col) = acc;\n"
    "}\n";

static const char sum_src[] =
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

/* docs/kernels.md, "A 2-D stencil with a halo in shared memory", and the
 * same stencil read straight from the buffer. */
#define STENCIL_LOAD                                                           \
    "#define LOAD(xx, yy)                                                  "   \
    "\\\n"                                                                     \
    "    ((xx) >= 0 && (xx) < (int64_t)w && (yy) >= 0 && (yy) < (int64_t)h "   \
    "\\\n"                                                                     \
    "         ? CUBE_AT(in, (uint64_t)(yy) * w + (uint64_t)(xx))           "   \
    "\\\n"                                                                     \
    "         : 0.0f)\n"
static const char stencil_src[] =
    "#define BX 32\n"
    "#define BY 8\n"
    "#define PITCH (BX + 2)\n" STENCIL_LOAD
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
    "              0.125f * (t[c - 1] + t[c + 1] + t[c - PITCH] + t[c + "
    "PITCH]);\n"
    "    if (x < w && y < h)\n"
    "        CUBE_AT(out, (uint64_t)y * w + (uint64_t)x) = v;\n"
    "}\n";

static const char stencil_plain_src[] = STENCIL_LOAD
    "CUBE_KERNEL(stencil_plain, CUBE_IN(float, in), CUBE_OUT(float, out),\n"
    "            CUBE_SCALAR(uint32_t, w), CUBE_SCALAR(uint32_t, h))\n"
    "{\n"
    "    int64_t x = ABSOLUTE_POS_X, y = ABSOLUTE_POS_Y;\n"
    "    float v = 0.5f * LOAD(x, y) +\n"
    "              0.125f * (LOAD(x - 1, y) + LOAD(x + 1, y) + LOAD(x, y - 1) "
    "+\n"
    "                        LOAD(x, y + 1));\n"
    "    if (x < w && y < h)\n"
    "        CUBE_AT(out, (uint64_t)y * w + (uint64_t)x) = v;\n"
    "}\n";

#define BAR_N 512u
#define BAR_SUM_N ((size_t)16 << 20)
#define BAR_SUM_CUBES 128u
#define BAR_ROUNDS 7
#define BAR_ST_W 2048u
#define BAR_ST_H 2048u
#define BAR_ST_N ((size_t)BAR_ST_W * BAR_ST_H)

/* One side of (f): a client with cpu_barriers `mode`, its kernels and
 * buffers. */
typedef struct bar_side {
    cube_client *c;
    cube_kernel *mm, *sum, *st, *st_plain;
    cube_handle a, b, cm, x, total, sin, sout;
    char mm_src[sizeof sgemm_src + 32], sum_src[sizeof sum_src + 32];
    char st_src[sizeof stencil_src + 32];
} bar_side;

/* Seconds for one launch of the stencil over BAR_ST_W x BAR_ST_H, with
 * shared memory or (plain) without, launched and synced. */
static cube_error *bar_stencil(bar_side *s, int plain, double *sec)
{
    cube_arg ta[] = {cube_arg_buffer(s->sin), cube_arg_buffer(s->sout),
                     cube_arg_u32(BAR_ST_W), cube_arg_u32(BAR_ST_H)};
    double t0 = now_us();
    cube_error *err =
        cube_launch(s->c, plain ? s->st_plain : s->st,
                    cube_count_static(BAR_ST_W / 32, BAR_ST_H / 8, 1), ta, 4,
                    CUBE_LAUNCH_EXECUTE);
    if (!err)
        err = cube_sync(s->c, NULL, 0);
    *sec = (now_us() - t0) * 1e-6;
    return err;
}

static cube_error *bar_open(bar_side *s, const char *mode, const float *a,
                            const float *b, const float *x)
{
    memset(s, 0, sizeof *s);
    /* A compiled kernel is shared by the clients of a device: the sources
     * differ by a comment, so that each side compiles its own. */
    snprintf(s->mm_src, sizeof s->mm_src, "%s/* %s */\n", sgemm_src, mode);
    snprintf(s->sum_src, sizeof s->sum_src, "%s/* %s */\n", sum_src, mode);
    snprintf(s->st_src, sizeof s->st_src, "%s/* %s */\n", stencil_src, mode);
    setenv("CUBERT_CPU_BARRIERS", mode, 1);
    cube_error *err = cube_client_open("cpu", NULL, &s->c);
    cube_kernel_desc dm = {"matmul_tiled", s->mm_src, {16, 16, 1}};
    cube_kernel_desc ds = {"sum_all", s->sum_src, {256, 1, 1}};
    cube_kernel_desc dt = {"stencil_shared", s->st_src, {32, 8, 1}};
    cube_kernel_desc dp = {"stencil_plain", stencil_plain_src, {32, 8, 1}};
    const uint64_t mat = (uint64_t)BAR_N * BAR_N * sizeof(float);
    float zero = 0.0f;
    if (!err)
        err = cube_kernel_create(&dm, &s->mm);
    if (!err)
        err = cube_kernel_create(&ds, &s->sum);
    if (!err)
        err = cube_create(s->c, a, mat, &s->a);
    if (!err)
        err = cube_create(s->c, b, mat, &s->b);
    if (!err)
        err = cube_empty(s->c, mat, &s->cm);
    if (!err)
        err = cube_create(s->c, x, BAR_SUM_N * sizeof(float), &s->x);
    if (!err)
        err = cube_create(s->c, &zero, sizeof zero, &s->total);
    if (!err)
        err = cube_kernel_create(&dt, &s->st);
    if (!err)
        err = cube_kernel_create(&dp, &s->st_plain);
    if (!err)
        err = cube_create(s->c, x, BAR_ST_N * sizeof(float), &s->sin);
    if (!err)
        err = cube_empty(s->c, BAR_ST_N * sizeof(float), &s->sout);
    for (int plain = 0; plain < 2 && !err; plain++) {
        double t;
        err = bar_stencil(s, plain, &t);
    }
    /* The first launches compile (cpu_barriers is read then). */
    cube_arg ma[] = {cube_arg_buffer(s->a), cube_arg_buffer(s->b),
                     cube_arg_buffer(s->cm), cube_arg_u32(BAR_N)};
    cube_arg sa[] = {cube_arg_buffer(s->x), cube_arg_buffer(s->total)};
    if (!err)
        err = cube_launch(s->c, s->mm,
                          cube_count_static(BAR_N / 16, BAR_N / 16, 1), ma, 4,
                          CUBE_LAUNCH_EXECUTE);
    if (!err)
        err = cube_launch(s->c, s->sum, cube_count_static(BAR_SUM_CUBES, 1, 1),
                          sa, 2, CUBE_LAUNCH_EXECUTE);
    if (!err)
        err = cube_sync(s->c, NULL, 0);
    unsetenv("CUBERT_CPU_BARRIERS");
    return err;
}

static void bar_close(bar_side *s)
{
    if (s->c) {
        cube_handle hs[] = {s->a, s->b, s->cm, s->x, s->total, s->sin, s->sout};
        for (size_t i = 0; i < sizeof hs / sizeof hs[0]; i++)
            if (hs[i].bits)
                cube_error_free(cube_handle_release(s->c, hs[i]));
    }
    cube_kernel_release(s->mm);
    cube_kernel_release(s->sum);
    cube_kernel_release(s->st);
    cube_kernel_release(s->st_plain);
    cube_client_close(s->c);
}

/* Seconds for one SGEMM (mm) or one sum, launched and synced. */
static cube_error *bar_time(bar_side *s, int mm, double *sec)
{
    cube_arg ma[] = {cube_arg_buffer(s->a), cube_arg_buffer(s->b),
                     cube_arg_buffer(s->cm), cube_arg_u32(BAR_N)};
    cube_arg sa[] = {cube_arg_buffer(s->x), cube_arg_buffer(s->total)};
    double t0 = now_us();
    cube_error *err =
        mm ? cube_launch(s->c, s->mm,
                         cube_count_static(BAR_N / 16, BAR_N / 16, 1), ma, 4,
                         CUBE_LAUNCH_EXECUTE)
           : cube_launch(s->c, s->sum, cube_count_static(BAR_SUM_CUBES, 1, 1),
                         sa, 2, CUBE_LAUNCH_EXECUTE);
    if (!err)
        err = cube_sync(s->c, NULL, 0);
    *sec = (now_us() - t0) * 1e-6;
    return err;
}

/* The largest difference between the SGEMM result and a double-precision
 * reference, on every 17th row. */
static double bar_sgemm_error(bar_side *s, const float *a, const float *b,
                              float *c)
{
    const uint64_t mat = (uint64_t)BAR_N * BAR_N * sizeof(float);
    cube_copy_desc d = cube_copy_desc_contiguous(s->cm, mat, sizeof(float));
    void *dst[] = {c};
    uint64_t size[] = {mat};
    cube_error *err = cube_read(s->c, &d, dst, size, 1);
    if (err) {
        cube_error_free(err);
        return INFINITY;
    }
    double worst = 0.0;
    for (uint32_t i = 0; i < BAR_N; i += 17)
        for (uint32_t j = 0; j < BAR_N; j++) {
            double ref = 0.0;
            for (uint32_t k = 0; k < BAR_N; k++)
                ref += (double)a[(size_t)i * BAR_N + k] *
                       (double)b[(size_t)k * BAR_N + j];
            double e = fabs(ref - (double)c[(size_t)i * BAR_N + j]);
            if (e > worst)
                worst = e;
        }
    return worst;
}

/* Whether both stencils give the same bytes; `scratch` holds BAR_ST_N
 * floats twice. */
static int bar_stencil_same(bar_side *s, float *scratch)
{
    cube_copy_desc d = cube_copy_desc_contiguous(
        s->sout, BAR_ST_N * sizeof(float), sizeof(float));
    uint64_t size[] = {BAR_ST_N * sizeof(float)};
    for (int plain = 0; plain < 2; plain++) {
        double t;
        void *dst[] = {scratch + (size_t)plain * BAR_ST_N};
        cube_error *err = bar_stencil(s, plain, &t);
        if (!err)
            err = cube_read(s->c, &d, dst, size, 1);
        if (err) {
            cube_error_free(err);
            return 0;
        }
    }
    return memcmp(scratch, scratch + BAR_ST_N, BAR_ST_N * sizeof(float)) == 0;
}

/* A PoCL call failed: say why, close it and go on without it (PoCL is a
 * peer; its failure does not fail the bench). Returns 0. */
static int pocl_failed(bench_pocl **o, int rc, char *why, size_t cap)
{
    if (rc) {
        snprintf(why, cap, "%s", bench_pocl_error(*o));
        bench_pocl_close(*o);
        *o = NULL;
    }
    return 0;
}

/* Checks PoCL's results: the SGEMM against cubert's (loops) result and a
 * double-precision reference, the sum against the exact one, the stencil
 * against cubert's. Nonzero, with the reason in `why`, when one is off.
 * `c` and `scratch` are host arrays (BAR_N^2 floats and 2 * BAR_ST_N
 * floats) free for use. */
static int pocl_check(bench_pocl *o, bar_side *s, const float *a,
                      const float *b, float *c, float *scratch, char *why,
                      size_t cap)
{
    float *mine = malloc((size_t)BAR_N * BAR_N * sizeof(float));
    int bad = !mine;
    if (bad)
        snprintf(why, cap, "out of host memory");
    if (!bad && bench_pocl_read_c(o, c)) {
        snprintf(why, cap, "%s", bench_pocl_error(o));
        bad = 1;
    }
    if (!bad) {
        /* cubert's SGEMM result into `mine`. */
        const uint64_t mat = (uint64_t)BAR_N * BAR_N * sizeof(float);
        cube_copy_desc d = cube_copy_desc_contiguous(s->cm, mat, sizeof(float));
        void *dst[] = {mine};
        uint64_t size[] = {mat};
        cube_error *err = cube_read(s->c, &d, dst, size, 1);
        if (err) {
            cube_error_free(err);
            snprintf(why, cap, "cube_read of cubert's SGEMM failed");
            bad = 1;
        }
    }
    double worst_ref = 0.0, worst_cube = 0.0;
    for (uint32_t i = 0; !bad && i < BAR_N; i += 17)
        for (uint32_t j = 0; j < BAR_N; j++) {
            double ref = 0.0;
            for (uint32_t k = 0; k < BAR_N; k++)
                ref += (double)a[(size_t)i * BAR_N + k] *
                       (double)b[(size_t)k * BAR_N + j];
            double got = c[(size_t)i * BAR_N + j];
            double e = fabs(ref - got);
            double ec = fabs((double)mine[(size_t)i * BAR_N + j] - got);
            worst_ref = e > worst_ref ? e : worst_ref;
            worst_cube = ec > worst_cube ? ec : worst_cube;
        }
    if (!bad && !(worst_ref < 1e-3)) {
        snprintf(why, cap, "its SGEMM is wrong: max abs error %.3g", worst_ref);
        bad = 1;
    }
    /* The sum: x[i] = i % 3, summed exactly in double. */
    float total = 0.0f;
    if (!bad && bench_pocl_sum_once(o, &total)) {
        snprintf(why, cap, "%s", bench_pocl_error(o));
        bad = 1;
    }
    double exact = 0.0;
    for (size_t i = 0; i < BAR_SUM_N; i++)
        exact += (double)(i % 3);
    double sum_err = fabs((double)total - exact) / exact;
    if (!bad && !(sum_err < 1e-5)) {
        snprintf(why, cap, "its sum is wrong: %.9g, exact %.9g", total, exact);
        bad = 1;
    }
    /* The stencil against cubert's (shared-memory, units as loops). */
    double worst_st = 0.0;
    if (!bad) {
        double t;
        cube_copy_desc d = cube_copy_desc_contiguous(
            s->sout, BAR_ST_N * sizeof(float), sizeof(float));
        uint64_t size[] = {BAR_ST_N * sizeof(float)};
        void *dst[] = {scratch};
        cube_error *err = bar_stencil(s, 0, &t);
        if (!err)
            err = cube_read(s->c, &d, dst, size, 1);
        if (err) {
            cube_error_free(err);
            snprintf(why, cap, "cube_read of cubert's stencil failed");
            bad = 1;
        } else if (bench_pocl_read_stencil(o, scratch + BAR_ST_N)) {
            snprintf(why, cap, "%s", bench_pocl_error(o));
            bad = 1;
        }
        for (size_t i = 0; !bad && i < BAR_ST_N; i++) {
            double e = fabs((double)scratch[i] - scratch[BAR_ST_N + i]);
            worst_st = e > worst_st ? e : worst_st;
        }
        if (!bad && !(worst_st < 1e-5)) {
            snprintf(why, cap, "its stencil differs from cubert's by %.3g",
                     worst_st);
            bad = 1;
        }
    }
    if (!bad)
        printf("PoCL results: SGEMM max abs error %.2g against double "
               "precision, %.2g against cubert's; sum %.9g (exact %.9g); "
               "stencil within %.2g of cubert's\n\n",
               worst_ref, worst_cube, total, exact, worst_st);
    free(mine);
    return bad;
}

#define POCL_AXPY_ROUNDS 15
#define POCL_LAT_BLOCKS 10
#define POCL_LAT_BLOCK 200

/* Beside PoCL, on the loops client: the axpy of (a) over the sum's 16 Mi
 * floats (12 bytes per element) and the tiny kernel of (b), launch (or
 * enqueue) to completion. The axpy's two sides alternate run by run with
 * 5 ms pauses, the latency's in blocks of POCL_LAT_BLOCK after 50 ms
 * pauses; medians. */
static int pocl_extras(bar_side *s, bench_pocl **ocl, char *why, size_t cap)
{
    float *y = calloc(BAR_SUM_N, sizeof(float));
    float tiny_host[64] = {0};
    cube_kernel *axpy = NULL, *tiny = NULL;
    cube_handle hy = {0}, ht = {0};
    static double ta[POCL_AXPY_ROUNDS], to[POCL_AXPY_ROUNDS];
    static double la[POCL_LAT_BLOCKS * POCL_LAT_BLOCK],
        lo[POCL_LAT_BLOCKS * POCL_LAT_BLOCK];
    int rc = 1;
    if (!y) {
        fprintf(stderr, "bench_cpu: out of memory\n");
        return 1;
    }
    if (failed(make_kernel("axpy", axpy_src, 256, &axpy), "axpy kernel") ||
        failed(make_kernel("tiny", tiny_src, 64, &tiny), "tiny kernel") ||
        failed(cube_create(s->c, y, BAR_SUM_N * sizeof(float), &hy),
               "cube_create") ||
        failed(cube_create(s->c, tiny_host, sizeof tiny_host, &ht),
               "cube_create"))
        goto done;
    const uint32_t n = (uint32_t)BAR_SUM_N;
    cube_arg aa[4] = {cube_arg_f32(0.5f), cube_arg_buffer(s->x),
                      cube_arg_buffer(hy), cube_arg_u32(n)};
    cube_arg targ[1] = {cube_arg_buffer(ht)};
    for (int r = -2; *ocl && r < POCL_AXPY_ROUNDS; r++) {
        double d[2];
        for (int turn = 0; turn < 2; turn++) {
            int who = (turn + r + 2) % 2;
            if (who == 0) {
                double t0 = now_us();
                if (failed(cube_launch(s->c, axpy,
                                       cube_count_static(n / 256, 1, 1), aa, 4,
                                       0),
                           "axpy launch") ||
                    failed(cube_sync(s->c, NULL, 0), "cube_sync"))
                    goto done;
                d[0] = (now_us() - t0) * 1e-6;
            } else if (bench_pocl_axpy(*ocl, &d[1])) {
                pocl_failed(ocl, 1, why, cap);
                break;
            }
            pause_ms(5);
        }
        if (r >= 0 && *ocl) {
            ta[r] = d[0];
            to[r] = d[1];
        }
    }
    for (int r = -1; *ocl && r < POCL_LAT_BLOCKS; r++) {
        for (int who = 0; who < 2 && *ocl; who++) {
            pause_ms(50);
            for (int i = 0; i < POCL_LAT_BLOCK; i++) {
                double t;
                if (who == 0) {
                    double t0 = now_us();
                    if (failed(cube_launch(s->c, tiny,
                                           cube_count_static(1, 1, 1), targ, 1,
                                           0),
                               "tiny launch") ||
                        failed(cube_sync(s->c, NULL, 0), "cube_sync"))
                        goto done;
                    t = (now_us() - t0) * 1e-6;
                } else if (bench_pocl_tiny(*ocl, &t)) {
                    pocl_failed(ocl, 1, why, cap);
                    break;
                }
                if (r >= 0)
                    (who ? lo : la)[r * POCL_LAT_BLOCK + i] = t;
            }
        }
    }
    if (*ocl) {
        /* PoCL's y: one run per round, two warm-up rounds and the one in
         * bench_pocl_open, each adding 0.5 x. */
        if (bench_pocl_read_y(*ocl, y)) {
            pocl_failed(ocl, 1, why, cap);
        } else {
            double worst = 0.0;
            int runs = POCL_AXPY_ROUNDS + 3;
            for (size_t i = 0; i < BAR_SUM_N; i += 4099) {
                double want = runs * 0.5 * (double)(i % 3);
                double e = fabs(y[i] - want);
                worst = e > worst ? e : worst;
            }
            if (worst > 1e-4) {
                snprintf(why, cap, "its axpy is wrong (error %.3g)", worst);
                bench_pocl_close(*ocl);
                *ocl = NULL;
            }
        }
    }
    if (*ocl) {
        double bytes = 12.0 * BAR_SUM_N;
        double ga = bytes / median(ta, POCL_AXPY_ROUNDS) * 1e-9;
        double go = bytes / median(to, POCL_AXPY_ROUNDS) * 1e-9;
        size_t nl = POCL_LAT_BLOCKS * POCL_LAT_BLOCK;
        double ua = median(la, nl) * 1e6, uo = median(lo, nl) * 1e6;
        char ours[64], theirs[64];
        snprintf(ours, sizeof ours, "%.2f GB/s", ga);
        snprintf(theirs, sizeof theirs, "%.2f GB/s", go);
        row("axpy, 16 Mi floats (65536 cubes of 256), 12 bytes/element", ours,
            "PoCL, same kernel in OpenCL C", theirs, ga / go, NULL);
        snprintf(ours, sizeof ours, "%.2f µs", ua);
        snprintf(theirs, sizeof theirs, "%.2f µs", uo);
        row("tiny kernel, 1 cube x 64 units, launch + sync (enqueue + "
            "clFinish)",
            ours, "PoCL, same kernel in OpenCL C", theirs, ua / uo,
            " (lower is better)");
    }
    rc = 0;
done:
    if (hy.bits)
        rc |= failed(cube_handle_release(s->c, hy), "cube_handle_release");
    if (ht.bits)
        rc |= failed(cube_handle_release(s->c, ht), "cube_handle_release");
    cube_kernel_release(axpy);
    cube_kernel_release(tiny);
    free(y);
    return rc;
}

/* A copy of the sum's input on transparent huge pages where the system
 * gives them (2 MiB aligned, madvise(MADV_HUGEPAGE)), as the CPU backend
 * asks for its large buffers: the peer is timed over it too, so that
 * neither side has the TLB's and the prefetchers' advantage alone. NULL
 * when the mapping fails. Freed with huge_copy_free. */
#define HUGE_PAGE ((size_t)2 << 20)
static float *huge_copy(const float *x, size_t n)
{
    size_t bytes = n * sizeof(float);
    size_t len = bytes + HUGE_PAGE;
    char *p = mmap(NULL, len, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return NULL;
    char *a = (char *)(((uintptr_t)p + HUGE_PAGE - 1) & ~(HUGE_PAGE - 1));
    /* The slack goes back; what is left starts on a huge page. */
    if (a > p)
        munmap(p, (size_t)(a - p));
    if (a + bytes < p + len)
        munmap(a + bytes, (size_t)(p + len - (a + bytes)));
    (void)madvise(a, bytes, MADV_HUGEPAGE);
    memcpy(a, x, bytes);
    return (float *)(void *)a;
}

static void huge_copy_free(float *p, size_t n)
{
    if (p)
        munmap(p, n * sizeof(float));
}

static int bench_barriers(int threads)
{
    const size_t mat = (size_t)BAR_N * BAR_N;
    float *a = malloc(mat * sizeof(float)), *b = malloc(mat * sizeof(float));
    float *c = malloc(mat * sizeof(float));
    float *x = malloc(BAR_SUM_N * sizeof(float));
    if (!a || !b || !c || !x) {
        free(a);
        free(b);
        free(c);
        free(x);
        fprintf(stderr, "bench_cpu: out of memory\n");
        return 1;
    }
    for (size_t i = 0; i < mat; i++) {
        a[i] = (float)((i * 7) % 13) / 13.0f - 0.5f;
        b[i] = (float)((i * 5) % 11) / 11.0f - 0.5f;
    }
    for (size_t i = 0; i < BAR_SUM_N; i++)
        x[i] = (float)(i % 3);
    float *xh = huge_copy(x, BAR_SUM_N);
    bar_side loops, fibers;
    int rc = failed(bar_open(&loops, "auto", a, b, x), "barrier kernels "
                                                       "(auto)") ||
             failed(bar_open(&fibers, "fibers", a, b, x),
                    "barrier kernels (fibers)");
    /* PoCL: opening it builds its kernels and runs each once, so its
     * compilation is not timed. */
    char pocl_why[256] = "";
    bench_pocl_problem prob = {
        a, b, BAR_N, x, BAR_SUM_N, BAR_SUM_CUBES, BAR_ST_W, BAR_ST_H};
    bench_pocl *ocl =
        rc ? NULL : bench_pocl_open(&prob, threads, pocl_why, sizeof pocl_why);
    double mm_l[BAR_ROUNDS], mm_f[BAR_ROUNDS], mm_p[BAR_ROUNDS];
    double su_l[BAR_ROUNDS], su_f[BAR_ROUNDS], su_p[BAR_ROUNDS];
    double su_h[BAR_ROUNDS];
    double st_l[BAR_ROUNDS], st_f[BAR_ROUNDS], st_p[BAR_ROUNDS];
    double mm_o[BAR_ROUNDS], su_o[BAR_ROUNDS], st_o[BAR_ROUNDS];
    volatile float sink = 0.0f;
    for (int r = -1; !rc && r < BAR_ROUNDS; r++) {
        /* Pauses between contenders: idle threads of one side (OpenMP's
         * spin, the pool's) must not compete with the next. */
        double t;
        int k = r < 0 ? 0 : r;
        rc = failed(bar_time(&loops, 1, &t), "SGEMM (loops)");
        mm_l[k] = t;
        pause_ms(50);
        rc = rc || failed(bar_time(&fibers, 1, &t), "SGEMM (fibers)");
        mm_f[k] = t;
        pause_ms(50);
        double t0 = now_us();
        bench_peer_sgemm_ikj(a, b, c, BAR_N);
        mm_p[k] = (now_us() - t0) * 1e-6;
        pause_ms(50);
        if (ocl) {
            rc = rc || pocl_failed(&ocl, bench_pocl_sgemm(ocl, &mm_o[k]),
                                   pocl_why, sizeof pocl_why);
            pause_ms(50);
        }
        rc = rc || failed(bar_time(&loops, 0, &t), "sum (loops)");
        su_l[k] = t;
        pause_ms(50);
        rc = rc || failed(bar_time(&fibers, 0, &t), "sum (fibers)");
        su_f[k] = t;
        pause_ms(50);
        t0 = now_us();
        sink += bench_peer_sum(x, BAR_SUM_N);
        su_p[k] = (now_us() - t0) * 1e-6;
        pause_ms(50);
        if (xh) {
            t0 = now_us();
            sink += bench_peer_sum(xh, BAR_SUM_N);
            su_h[k] = (now_us() - t0) * 1e-6;
            pause_ms(50);
        }
        if (ocl) {
            rc = rc || pocl_failed(&ocl, bench_pocl_sum(ocl, &su_o[k]),
                                   pocl_why, sizeof pocl_why);
            pause_ms(50);
        }
        rc = rc || failed(bar_stencil(&loops, 0, &t), "stencil (loops)");
        st_l[k] = t;
        pause_ms(50);
        rc = rc || failed(bar_stencil(&fibers, 0, &t), "stencil (fibers)");
        st_f[k] = t;
        pause_ms(50);
        rc = rc || failed(bar_stencil(&loops, 1, &t), "stencil (plain)");
        st_p[k] = t;
        pause_ms(50);
        if (ocl) {
            rc = rc || pocl_failed(&ocl, bench_pocl_stencil(ocl, &st_o[k]),
                                   pocl_why, sizeof pocl_why);
            pause_ms(50);
        }
    }
    (void)sink;
    if (!rc) {
        double el = bar_sgemm_error(&loops, a, b, c);
        double ef = bar_sgemm_error(&fibers, a, b, c);
        double flop = 2.0 * BAR_N * BAR_N * BAR_N;
        double gl = flop / median(mm_l, BAR_ROUNDS) * 1e-9;
        double gf = flop / median(mm_f, BAR_ROUNDS) * 1e-9;
        double gp = flop / median(mm_p, BAR_ROUNDS) * 1e-9;
        double bytes = (double)BAR_SUM_N * sizeof(float);
        double bl = bytes / median(su_l, BAR_ROUNDS) * 1e-9;
        double bf = bytes / median(su_f, BAR_ROUNDS) * 1e-9;
        double bp = bytes / median(su_p, BAR_ROUNDS) * 1e-9;
        printf("\n### (f) Barrier kernels: units as loops (barrier pass) "
               "and as fibers\n\n");
        printf("SGEMM max abs error against double precision: loops %.2g, "
               "fibers %.2g\n\n",
               el, ef);
        table_header("cubert ÷ peer");
        char ours[64], peer[96], theirs[64];
        snprintf(peer, sizeof peer,
                 "C i-k-j loop, OpenMP, %d threads, JIT flags", threads);
        snprintf(theirs, sizeof theirs, "%.1f GFLOP/s", gp);
        snprintf(ours, sizeof ours, "%.1f GFLOP/s", gl);
        row("tiled SGEMM 512³, units as loops", ours, peer, theirs, gl / gp,
            NULL);
        snprintf(ours, sizeof ours, "%.2f GFLOP/s", gf);
        row("tiled SGEMM 512³, units as fibers", ours, peer, theirs, gf / gp,
            NULL);
        snprintf(peer, sizeof peer,
                 "OpenMP parallel for simd reduction, %d threads, JIT flags",
                 threads);
        snprintf(theirs, sizeof theirs, "%.1f GB/s", bp);
        snprintf(ours, sizeof ours, "%.1f GB/s", bl);
        row("sum of 16 Mi floats (128 cubes of 256), units as loops", ours,
            peer, theirs, bl / bp, NULL);
        snprintf(ours, sizeof ours, "%.2f GB/s", bf);
        row("sum of 16 Mi floats (128 cubes of 256), units as fibers", ours,
            peer, theirs, bf / bp, NULL);
        if (xh) {
            double bh = bytes / median(su_h, BAR_ROUNDS) * 1e-9;
            snprintf(peer, sizeof peer,
                     "the same OpenMP reduction over a copy on huge pages "
                     "(MADV_HUGEPAGE)");
            snprintf(theirs, sizeof theirs, "%.1f GB/s", bh);
            snprintf(ours, sizeof ours, "%.1f GB/s", bl);
            row("sum of 16 Mi floats (128 cubes of 256), units as loops", ours,
                peer, theirs, bl / bh, NULL);
        }
        /* Stencil: 4 bytes read and 4 written per point. */
        double sbytes = (double)BAR_ST_N * 2 * sizeof(float);
        double sl = sbytes / median(st_l, BAR_ROUNDS) * 1e-9;
        double sf = sbytes / median(st_f, BAR_ROUNDS) * 1e-9;
        double sp = sbytes / median(st_p, BAR_ROUNDS) * 1e-9;
        snprintf(peer, sizeof peer,
                 "the same stencil without shared memory (cube C, units as "
                 "one loop)");
        snprintf(theirs, sizeof theirs, "%.1f GB/s", sp);
        snprintf(ours, sizeof ours, "%.1f GB/s", sl);
        row("5-point stencil 2048², halo in shared memory, units as loops",
            ours, peer, theirs, sl / sp, NULL);
        snprintf(ours, sizeof ours, "%.2f GB/s", sf);
        row("5-point stencil 2048², halo in shared memory, units as fibers",
            ours, peer, theirs, sf / sp, NULL);
        printf("\nStencil with shared memory and without: %s\n",
               bar_stencil_same(&loops, x) ? "same result" : "DIFFERENT");
        printf("\nUnits as loops ÷ as fibers: SGEMM %.1fx, sum %.1fx, "
               "stencil %.1fx\n\n",
               gl / gf, bl / bf, sl / sf);
        if (ocl &&
            pocl_check(ocl, &loops, a, b, c, x, pocl_why, sizeof pocl_why))
            bench_pocl_close(ocl), ocl = NULL;
        if (ocl) {
            double go = flop / median(mm_o, BAR_ROUNDS) * 1e-9;
            double bo = bytes / median(su_o, BAR_ROUNDS) * 1e-9;
            double so = sbytes / median(st_o, BAR_ROUNDS) * 1e-9;
            printf("#### Beside PoCL: the same kernels in OpenCL C on "
                   "PoCL's CPU device (%s)\n\n",
                   bench_pocl_name(ocl));
            table_header("cubert ÷ PoCL");
            snprintf(peer, sizeof peer, "PoCL, same kernel in OpenCL C");
            snprintf(ours, sizeof ours, "%.1f GFLOP/s", gl);
            snprintf(theirs, sizeof theirs, "%.2f GFLOP/s", go);
            row("tiled SGEMM 512³, units as loops", ours, peer, theirs, gl / go,
                NULL);
            snprintf(ours, sizeof ours, "%.1f GB/s", bl);
            snprintf(theirs, sizeof theirs, "%.2f GB/s", bo);
            row("sum of 16 Mi floats (128 cubes of 256), units as loops", ours,
                peer, theirs, bl / bo, NULL);
            snprintf(ours, sizeof ours, "%.1f GB/s", sl);
            snprintf(theirs, sizeof theirs, "%.2f GB/s", so);
            row("5-point stencil 2048², halo in shared memory, units as loops",
                ours, peer, theirs, sl / so, NULL);
            rc = pocl_extras(&loops, &ocl, pocl_why, sizeof pocl_why);
            printf("\n");
            if (!ocl)
                printf("PoCL: stopped (%s)\n\n", pocl_why);
        } else {
            printf("PoCL: skipped (%s)\n\n", pocl_why);
        }
    }
    bench_pocl_close(ocl);
    bar_close(&loops);
    bar_close(&fibers);
    free(a);
    free(b);
    free(c);
    free(x);
    huge_copy_free(xh, BAR_SUM_N);
    return rc;
}

/* --- (g) bounds modes --- */

static const char gather_src[] =
    "CUBE_KERNEL(gather, CUBE_IN(float, x), CUBE_IN(uint32_t, idx),\n"
    "            CUBE_OUT(float, y))\n"
    "{\n"
    "    uint32_t i = ABSOLUTE_POS_X;\n"
    "    if (i < CUBE_LEN(y))\n"
    "        CUBE_AT(y, i) = CUBE_AT(x, CUBE_AT(idx, i));\n"
    "}\n";

#define GATHER_N ((uint32_t)16 << 20)
#define GATHER_ROUNDS 9

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static int bench_bounds(cube_client *c)
{
    cube_kernel *k = NULL;
    if (failed(make_kernel("gather", gather_src, 256, &k),
               "cube_kernel_create(gather)"))
        return 1;
    float *x = malloc((size_t)GATHER_N * 4);
    uint32_t *idx = malloc((size_t)GATHER_N * 4);
    cube_handle hx = {0}, hi = {0}, hy = {0};
    int rc = !x || !idx;
    for (uint32_t i = 0; !rc && i < GATHER_N; i++) {
        x[i] = (float)i;
        /* A stride that visits every element once, in scattered order. */
        idx[i] = (uint32_t)(((uint64_t)i * 40503u) % GATHER_N);
    }
    if (!rc)
        rc =
            failed(cube_create(c, x, (uint64_t)GATHER_N * 4, &hx),
                   "cube_create(x)") ||
            failed(cube_create(c, idx, (uint64_t)GATHER_N * 4, &hi),
                   "cube_create(idx)") ||
            failed(cube_empty(c, (uint64_t)GATHER_N * 4, &hy), "cube_empty(y)");
    static const uint32_t modes[3] = {0, CUBE_LAUNCH_CHECKED,
                                      CUBE_LAUNCH_VALIDATE};
    static const char *const names[3] = {"unchecked", "checked (CHECKED)",
                                         "validating (VALIDATE)"};
    double t[3][GATHER_ROUNDS];
    cube_arg args[3] = {cube_arg_buffer(hx), cube_arg_buffer(hi),
                        cube_arg_buffer(hy)};
    cube_count count = cube_count_static(GATHER_N / 256, 1, 1);
    /* One warm-up launch per mode compiles each form. */
    for (int m = 0; !rc && m < 3; m++)
        rc = failed(cube_launch(c, k, count, args, 3, modes[m]),
                    "cube_launch(gather)");
    for (int r = 0; !rc && r < GATHER_ROUNDS; r++)
        for (int m = 0; !rc && m < 3; m++) {
            pause_ms(5);
            double t0 = now_us();
            rc = failed(cube_launch(c, k, count, args, 3, modes[m]),
                        "cube_launch(gather)") ||
                 failed(cube_sync(c, NULL, 0), "cube_sync");
            t[m][r] = now_us() - t0;
        }
    if (!rc) {
        printf("\n### (g) bounds modes: gather through CUBE_AT, 16 Mi "
               "floats, cube dim 256\n\n");
        table_header("ratio to unchecked");
        double med[3];
        for (int m = 0; m < 3; m++) {
            qsort(t[m], GATHER_ROUNDS, sizeof t[m][0], cmp_double);
            med[m] = t[m][GATHER_ROUNDS / 2];
        }
        for (int m = 0; m < 3; m++) {
            char ours[64], theirs[64];
            snprintf(ours, sizeof ours, "%.2f ms (%.1f GB/s)", med[m] * 1e-3,
                     12.0 * GATHER_N / (med[m] * 1e3));
            snprintf(theirs, sizeof theirs, "%.2f ms", med[0] * 1e-3);
            row(names[m], ours, "unchecked", theirs, med[m] / med[0], NULL);
        }
    }
    cube_handle made[3] = {hx, hi, hy};
    for (int m = 0; m < 3; m++)
        if (made[m].bits)
            cube_error_free(cube_handle_release(c, made[m]));
    free(x);
    free(idx);
    cube_kernel_release(k);
    return rc;
}

int main(int argc, char **argv)
{
    /* `bench_cpu [SECTIONS]`: the letters of the sections to run (e.g.
     * `bench_cpu f`); all of them by default. */
    const char *only = argc > 1 ? argv[1] : "abcdefg";
    if (argc > 2 || !only[0] || strspn(only, "abcdefg") != strlen(only)) {
        fprintf(stderr, "usage: bench_cpu [SECTIONS] (letters of a-g, e.g. "
                        "f; all by default)\n");
        return 2;
    }
#define WANT(letter) (strchr(only, letter) != NULL)
    double start = now_us();
    cube_client *c = NULL;
    if (failed(cube_client_open("cpu", NULL, &c), "cube_client_open"))
        return 1;
    cube_properties p;
    if (failed(cube_client_properties(c, &p), "cube_client_properties")) {
        cube_client_close(c);
        return 1;
    }
    int threads = (int)(p.compute_units ? p.compute_units : 1);
#ifdef _OPENMP
    omp_set_num_threads(threads);
#else
    threads = 1;
#endif
    print_machine(&p, threads);

    cube_kernel *axpy = NULL, *axpy_u = NULL;
    int rc = failed(make_kernel("axpy", axpy_src, 256, &axpy),
                    "cube_kernel_create(axpy)") ||
             failed(make_kernel("axpy", axpy_unsigned_src, 256, &axpy_u),
                    "cube_kernel_create(axpy, unsigned index)");
    if (!rc && WANT('a'))
        rc = bench_bandwidth(c, axpy, threads,
                             "axpy kernel (int index), cube dim 256, "
                             "65536 cubes",
                             1);
    if (!rc && WANT('a'))
        rc = bench_bandwidth(c, axpy_u, threads,
                             "axpy kernel (unsigned index), cube dim 256, "
                             "65536 cubes",
                             0);
    if (!rc && WANT('b'))
        rc = bench_latency(c, axpy, threads);
    if (!rc && WANT('f'))
        rc = bench_barriers(threads);
    if (!rc && WANT('g'))
        rc = bench_bounds(c);
    cube_kernel_release(axpy);
    cube_kernel_release(axpy_u);
    cube_client_close(c);
    if (!rc && WANT('c'))
        rc = bench_cache();
    /* (d) and (e) on a client of their own, after the compile-cache runs. */
    if (!rc && (WANT('d') || WANT('e'))) {
        cube_client *g = NULL;
        rc = failed(cube_client_open("cpu", NULL, &g), "cube_client_open");
        if (!rc && WANT('d'))
            rc = bench_graph(g);
        if (!rc && WANT('e'))
            rc = bench_profile(g);
        cube_client_close(g);
    }

    printf(
        "Notes: the peers are compiled with the bench (-O2); the kernels "
        "by the CPU backend's JIT (-O3 -march=native). Bandwidth runs the "
        "three contenders in turn, one run each per round, with 5 ms "
        "pauses; latency runs each side as one block after a 50 ms "
        "pause, so neither side's idle spinning threads compete with the "
        "other. Graph replay (d) alternates its two sides round by round and "
        "profiling (e) iteration by iteration, on a client of their own. "
        "PoCL (f) runs the same kernels in OpenCL C, enqueue + clFinish "
        "timed in the same alternating rounds; its kernels are built and "
        "run once before the warm-up round, so PoCL's compilation (its "
        "LLVM, at build and at first enqueue) is not timed. "
        "OpenMP keeps its default wait policy. Times: "
        "clock_gettime(CLOCK_MONOTONIC).\n");
    printf("\nbench_cpu: %s in %.1f s\n", rc ? "FAILED" : "done",
           (now_us() - start) * 1e-6);
    return rc ? 1 : 0;
}
