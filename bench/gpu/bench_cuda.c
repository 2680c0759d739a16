/* cubert's CUDA backend beside the raw CUDA driver, in one run on one GPU.
 *
 * Every figure of cubert is printed beside the same work done directly
 * with the driver API (the "peer": the device's primary context, its own
 * non-blocking stream, cuLaunchKernel and cuMemcpy*, kernels compiled from
 * equivalent CUDA C by NVRTC to CUBIN for the device's compute capability),
 * measured in the same process, with the ratio cubert / driver and the aim
 * for that ratio:
 *
 *  (a) launch host cost: host time of the launch calls only, median over
 *      batches (sync between batches, not timed), per launch; an empty
 *      kernel (one u32 scalar, 1 cube of 1 unit; 20 batches of 2000) and a
 *      4-buffer kernel (out[i] = a[i] + b[i] + c[i] over 1M floats, 4096
 *      cubes of 256; 100 batches of 200). Aim <= 1.10.
 *  (b) sustained launches per second: 100k empty launches back to back,
 *      then a sync; launches / time. Aim >= 0.95.
 *  (c) graph replay per node: 100 empty launches captured into a graph
 *      (cube_graph_* / stream capture + cuGraphInstantiate); replays
 *      closed by a sync, time / (replays * 100). Aim <= 1.05.
 *  (d) allocate + release on a pool hit: cube_empty(1 MiB) +
 *      cube_handle_release against cuMemAllocAsync + cuMemFreeAsync on a
 *      stream (the device's default memory pool). Aim <= 0.15.
 *  (e) pinned transfers of 16, 64 and 256 MiB: cube_write (+ sync) and
 *      cube_read from cube_staging buffers against cuMemcpyHtoDAsync /
 *      cuMemcpyDtoHAsync (+ stream sync) from cuMemHostAlloc memory; GB/s.
 *      Aim >= 0.95.
 *  (f) pageable transfers of 256 MiB from malloc'ed, touched memory:
 *      cube_write (+ sync) / cube_read against cuMemcpyHtoD (+ context
 *      sync) / cuMemcpyDtoH; GB/s. Aim >= 3.
 *  (g) 4-byte read round trip: cube_read against cuMemcpyDtoH, median.
 *      Aim <= 1.2.
 *  (h) compile: a new process (this program, re-executed) with
 *      CUBERT_CACHE_DIR set to a fresh directory launches the 4-buffer
 *      kernel for the first time (cold: compiles and fills the cache);
 *      a second new process does the same and loads it from the disk
 *      cache. Its first launch + sync is set against a cold NVRTC compile
 *      + cuModuleLoadData of the equivalent CUDA C in this process.
 *      Aim <= 0.05. cubert's cold first launch is printed too.
 *
 * The two sides alternate round by round (which goes first flips every
 * round). The 4-buffer kernel's results are checked once on both sides,
 * and every transfer is checked byte for byte. Host times use
 * clock_gettime(CLOCK_MONOTONIC). Every CUDA and cubert call is checked;
 * a failure prints the call and exits 1. When cubert cannot open the CUDA
 * device the program says why and exits 77 (skipped).
 *
 *   ./build/bench/bench_cuda [--device N] [--json FILE] [--peer-only]
 *                            [--phases LIST] [--graph-detail]
 *
 * --device N uses "cuda:N" and the driver's device N (default 0); --json
 * also writes the figures to FILE; --peer-only measures the driver side
 * alone (cubert's column reads n/a), for when the backend is missing.
 * --phases runs only the phases named, in the order given (comma
 * separated, a name may come back: check, graph, launch, sustained,
 * alloc, pinned, pageable, roundtrip, compile, cross, threads; "all", the
 * default, is that list in that order); launch needs the add3 buffers, so it
 * runs check first where no check ran before it. --graph-detail adds to the
 * graph phase each side replayed alone (no alternation) and, for the driver,
 * the host time of the launch calls and the device time between two
 * events around the replays, per node.
 * Built only where CMake finds the CUDA toolkit; the program links
 * libcuda and NVRTC, so it starts only where the driver is installed.
 */
#include <cuda.h>
#include <errno.h>
#include <ftw.h>
#include <pthread.h>
#include <math.h>
#include <nvrtc.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../bench_util.h"
#define BENCH_PROGRAM "bench_cuda"
#include "cuda_bench_util.h"
#include "cubert/cubert.h"

/* --- sizes and repetitions --- */

#define LAUNCH_BATCHES 20
#define LAUNCH_BATCH 2000
/* The 4-buffer kernel runs for microseconds on the device: short batches
 * keep the launch queue from filling, which would make the host wait for
 * the device and time the kernel instead of the launch. */
#define LAUNCH4_BATCHES 100
#define LAUNCH4_BATCH 200
#define ADD_N (1u << 20)
#define ADD_DIM 256u

#define SUSTAINED_LAUNCHES 100000
#define SUSTAINED_ROUNDS 3

#define GRAPH_NODES 100
#define GRAPH_REPLAYS 20
#define GRAPH_ROUNDS 30

#define ALLOC_BYTES (1ull << 20)
#define ALLOC_PAIRS 1000
#define ALLOC_ROUNDS 51

#define PINNED_REPS 10
#define PAGEABLE_BYTES (256ull << 20)
#define PAGEABLE_REPS 7

#define ROUNDTRIP_REPS 2000

#define COMPILE_REPS 5
#define CHILD_ROUNDS 3
#define CHILD_FLAG "--first-launch-child"

/* --- failures --- */

/* Exits 1 with the whole error when `err` is set. */
static void ok(cube_error *err, const char *what)
{
    if (!err)
        return;
    char *text = cube_error_format(err);
    fprintf(stderr, "bench_cuda: %s failed:\n%s\n", what,
            text ? text : cube_error_message(err));
    free(text);
    cube_error_free(err);
    exit(1);
}

/* --- kernels --- */

static const char cube_noop_src[] =
    "CUBE_KERNEL(noop, CUBE_SCALAR(uint32_t, n))\n"
    "{\n"
    "    (void)n;\n"
    "}\n";

static const char cube_add3_src[] =
    "CUBE_KERNEL(add3, CUBE_IN(float, a), CUBE_IN(float, b),\n"
    "            CUBE_IN(float, c), CUBE_OUT(float, out),\n"
    "            CUBE_SCALAR(uint32_t, n))\n"
    "{\n"
    "    uint32_t i = ABSOLUTE_POS_X;\n"
    "    if (i < n)\n"
    "        out[i] = a[i] + b[i] + c[i];\n"
    "}\n";

/* The same two kernels in plain CUDA C, for the driver. */
static const char driver_noop_src[] =
    "extern \"C\" __global__ void noop(unsigned int n)\n"
    "{\n"
    "    (void)n;\n"
    "}\n";

static const char driver_add3_src[] =
    "extern \"C\" __global__ void add3(const float *__restrict__ a,\n"
    "                                 const float *__restrict__ b,\n"
    "                                 const float *__restrict__ c,\n"
    "                                 float *__restrict__ out,\n"
    "                                 unsigned int n)\n"
    "{\n"
    "    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
    "    if (i < n)\n"
    "        out[i] = a[i] + b[i] + c[i];\n"
    "}\n";

static cube_kernel *make_kernel(const char *name, const char *source,
                                uint32_t dim)
{
    cube_kernel_desc desc;
    memset(&desc, 0, sizeof desc);
    desc.name = name;
    desc.source = source;
    desc.cube_dim[0] = dim;
    desc.cube_dim[1] = 1;
    desc.cube_dim[2] = 1;
    cube_kernel *k = NULL;
    ok(cube_kernel_create(&desc, &k), "cube_kernel_create");
    return k;
}

/* --- state --- */

static struct {
    int peer_only;
    int graph_detail;
    int device;
    char device_name[32]; /* "cuda:N" */
    cube_client *client;
    CUdevice dev;
    CUcontext ctx;
    CUstream stream;
    int cc_major, cc_minor;
    double first_nvrtc_ms; /* the process's first compile (library load) */
} S;

/* One timed piece of work for one side. */
typedef struct job {
    /* cubert */
    cube_kernel *kernel;
    cube_count count;
    const cube_arg *args;
    size_t nargs;
    cube_graph_id graph;
    cube_handle handle;
    cube_copy_desc desc;
    /* driver */
    CUfunction func;
    unsigned int grid, block;
    void **params;
    CUgraphExec exec;
    CUdeviceptr dptr;
    /* both */
    void *src, *dst;
    uint64_t bytes;
    int n; /* repetitions inside one timed call */
} job;

/* Runs the job and returns the nanoseconds it measured. */
typedef double (*timed_fn)(const job *j);

/* --- timed work, cubert side --- */

static double cb_launches(const job *j)
{
    double t0 = now_ns();
    for (int i = 0; i < j->n; i++)
        ok(cube_launch(S.client, j->kernel, j->count, j->args, j->nargs,
                       CUBE_LAUNCH_EXECUTE),
           "cube_launch");
    double t = now_ns() - t0;
    ok(cube_sync(S.client, NULL, 0), "cube_sync");
    return t;
}

static double cb_sustained(const job *j)
{
    double t0 = now_ns();
    for (int i = 0; i < j->n; i++)
        ok(cube_launch(S.client, j->kernel, j->count, j->args, j->nargs,
                       CUBE_LAUNCH_EXECUTE),
           "cube_launch");
    ok(cube_sync(S.client, NULL, 0), "cube_sync");
    return now_ns() - t0;
}

static double cb_replays(const job *j)
{
    double t0 = now_ns();
    for (int i = 0; i < j->n; i++)
        ok(cube_graph_replay(S.client, j->graph), "cube_graph_replay");
    ok(cube_sync(S.client, NULL, 0), "cube_sync");
    return now_ns() - t0;
}

static double cb_alloc(const job *j)
{
    cube_handle h;
    double t0 = now_ns();
    for (int i = 0; i < j->n; i++) {
        ok(cube_empty(S.client, j->bytes, &h), "cube_empty");
        ok(cube_handle_release(S.client, h), "cube_handle_release");
    }
    return now_ns() - t0;
}

static double cb_write(const job *j)
{
    const void *src = j->src;
    double t0 = now_ns();
    ok(cube_write(S.client, &j->desc, &src, &j->bytes, 1), "cube_write");
    ok(cube_sync(S.client, &j->handle, 1), "cube_sync");
    return now_ns() - t0;
}

static double cb_read(const job *j)
{
    void *dst = j->dst;
    double t0 = now_ns();
    ok(cube_read(S.client, &j->desc, &dst, &j->bytes, 1), "cube_read");
    return now_ns() - t0;
}

/* --- timed work, driver side --- */

static double dr_launches(const job *j)
{
    double t0 = now_ns();
    for (int i = 0; i < j->n; i++)
        CK(cuLaunchKernel(j->func, j->grid, 1, 1, j->block, 1, 1, 0, S.stream,
                          j->params, NULL));
    double t = now_ns() - t0;
    CK(cuStreamSynchronize(S.stream));
    return t;
}

static double dr_sustained(const job *j)
{
    double t0 = now_ns();
    for (int i = 0; i < j->n; i++)
        CK(cuLaunchKernel(j->func, j->grid, 1, 1, j->block, 1, 1, 0, S.stream,
                          j->params, NULL));
    CK(cuStreamSynchronize(S.stream));
    return now_ns() - t0;
}

static double dr_replays(const job *j)
{
    double t0 = now_ns();
    for (int i = 0; i < j->n; i++)
        CK(cuGraphLaunch(j->exec, S.stream));
    CK(cuStreamSynchronize(S.stream));
    return now_ns() - t0;
}

static double dr_alloc(const job *j)
{
    CUdeviceptr p;
    double t0 = now_ns();
    for (int i = 0; i < j->n; i++) {
        CK(cuMemAllocAsync(&p, (size_t)j->bytes, S.stream));
        CK(cuMemFreeAsync(p, S.stream));
    }
    double t = now_ns() - t0;
    CK(cuStreamSynchronize(S.stream));
    return t;
}

static double dr_write_pinned(const job *j)
{
    double t0 = now_ns();
    CK(cuMemcpyHtoDAsync(j->dptr, j->src, (size_t)j->bytes, S.stream));
    CK(cuStreamSynchronize(S.stream));
    return now_ns() - t0;
}

static double dr_read_pinned(const job *j)
{
    double t0 = now_ns();
    CK(cuMemcpyDtoHAsync(j->dst, j->dptr, (size_t)j->bytes, S.stream));
    CK(cuStreamSynchronize(S.stream));
    return now_ns() - t0;
}

/* From pageable memory cuMemcpyHtoD may return once the data is staged,
 * before it reaches the device: the context sync waits for the rest. */
static double dr_write_pageable(const job *j)
{
    double t0 = now_ns();
    CK(cuMemcpyHtoD(j->dptr, j->src, (size_t)j->bytes));
    CK(cuCtxSynchronize());
    return now_ns() - t0;
}

static double dr_read_pageable(const job *j)
{
    double t0 = now_ns();
    CK(cuMemcpyDtoH(j->dst, j->dptr, (size_t)j->bytes));
    return now_ns() - t0;
}

/* Runs `warm` untimed rounds, then `reps` rounds of one call per side,
 * the side that goes first flipping every round. tc/td receive the
 * measured nanoseconds; without cubert (--peer-only) tc is left alone. */
static void alternate(timed_fn fc, const job *jc, timed_fn fd, const job *jd,
                      int warm, int reps, double *tc, double *td)
{
    for (int r = -warm; r < reps; r++) {
        for (int turn = 0; turn < 2; turn++) {
            int driver = (turn + r + warm) % 2;
            if (driver) {
                CK(cuCtxSetCurrent(S.ctx));
                double t = fd(jd);
                if (r >= 0)
                    td[r] = t;
            } else if (!S.peer_only) {
                double t = fc(jc);
                if (r >= 0)
                    tc[r] = t;
            }
        }
    }
}

/* --- results --- */

typedef struct result {
    char id[8];
    char name[160];
    char unit[24];      /* as printed */
    char unit_json[24]; /* ASCII */
    double cubert;      /* NAN: not measured */
    double driver;
    char aim_op; /* '<': ratio at most aim; '>': at least; 0: none */
    double aim;
} result;

#define MAX_RESULTS 48
static result results[MAX_RESULTS];
static int nresults;

static double ratio_of(const result *r)
{
    return r->cubert / r->driver;
}

/* 1 met, 0 missed, -1 no aim or nothing to compare. */
static int aim_met(const result *r)
{
    double q = ratio_of(r);
    if (!r->aim_op || isnan(q))
        return -1;
    return r->aim_op == '<' ? q <= r->aim : q >= r->aim;
}

static void fmt_value(char *out, size_t cap, double v)
{
    if (isnan(v))
        snprintf(out, cap, "n/a");
    else if (fabs(v) >= 1e3)
        snprintf(out, cap, "%.0f", v);
    else
        snprintf(out, cap, "%.4g", v);
}

static void fmt_aim(char *out, size_t cap, const result *r)
{
    if (!r->aim_op)
        snprintf(out, cap, "none");
    else
        snprintf(out, cap, "%s %.2f", r->aim_op == '<' ? "<=" : ">=", r->aim);
}

/* Records a measurement and prints it: cubert's figure, the driver's and
 * the ratio with its aim, one line each. */
static void report(const char *id, const char *name, const char *unit,
                   const char *unit_json, double cubert, double driver,
                   char aim_op, double aim)
{
    if (nresults == MAX_RESULTS)
        die("too many results");
    result *r = &results[nresults++];
    memset(r, 0, sizeof *r);
    snprintf(r->id, sizeof r->id, "%s", id);
    snprintf(r->name, sizeof r->name, "%s", name);
    snprintf(r->unit, sizeof r->unit, "%s", unit);
    snprintf(r->unit_json, sizeof r->unit_json, "%s", unit_json);
    r->cubert = cubert;
    r->driver = driver;
    r->aim_op = aim_op;
    r->aim = aim;

    char c[32], d[32], q[32], a[32];
    fmt_value(c, sizeof c, cubert);
    fmt_value(d, sizeof d, driver);
    fmt_value(q, sizeof q, ratio_of(r));
    fmt_aim(a, sizeof a, r);
    int met = aim_met(r);
    printf("[%s] %s\n", id, name);
    printf("    cubert      %s %s\n", c, unit);
    printf("    raw driver  %s %s\n", d, unit);
    printf("    ratio       %s (cubert / driver; aim %s%s)\n", q, a,
           met < 0 ? ""
           : met   ? ": met"
                   : ": NOT met");
    fflush(stdout);
}

static void print_table(void)
{
    int met = 0, total = 0;
    printf("\n| | Measurement | cubert | raw driver | cubert ÷ driver | aim "
           "| met |\n");
    printf("|---|---|---:|---:|---:|---|---|\n");
    for (int i = 0; i < nresults; i++) {
        const result *r = &results[i];
        char c[32], d[32], q[32], a[32];
        fmt_value(c, sizeof c, r->cubert);
        fmt_value(d, sizeof d, r->driver);
        fmt_value(q, sizeof q, ratio_of(r));
        fmt_aim(a, sizeof a, r);
        int m = aim_met(r);
        if (m >= 0) {
            total++;
            met += m;
        }
        printf("| %s | %s | %s %s | %s %s | %s | %s | %s |\n", r->id, r->name,
               c, r->unit, d, r->unit, q, a,
               m < 0 ? "-"
               : m   ? "yes"
                     : "**no**");
    }
    printf("\nAims met: %d of %d.\n", met, total);
}

static void json_string(FILE *f, const char *s)
{
    fputc('"', f);
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\')
            fprintf(f, "\\%c", ch);
        else if (ch < 0x20)
            fprintf(f, "\\u%04x", ch);
        else
            fputc(ch, f);
    }
    fputc('"', f);
}

static void json_number(FILE *f, double v)
{
    if (isnan(v) || isinf(v))
        fprintf(f, "null");
    else
        fprintf(f, "%.9g", v);
}

static void write_json(const char *path, const char *gpu, const char *cpu,
                       int driver_version, int nvrtc_major, int nvrtc_minor,
                       const cube_properties *props)
{
    FILE *f = fopen(path, "w");
    if (!f) {
        fprintf(stderr, "bench_cuda: cannot write %s: %s\n", path,
                strerror(errno));
        exit(1);
    }
    fprintf(f, "{\n  \"benchmark\": \"bench_cuda\",\n  \"gpu\": ");
    json_string(f, gpu);
    fprintf(f, ",\n  \"device_index\": %d,\n", S.device);
    fprintf(f, "  \"compute_capability\": \"%d.%d\",\n", S.cc_major,
            S.cc_minor);
    fprintf(f, "  \"driver_version\": %d,\n", driver_version);
    fprintf(f, "  \"nvrtc_version\": \"%d.%d\",\n", nvrtc_major, nvrtc_minor);
    fprintf(f, "  \"cpu\": ");
    json_string(f, cpu);
    fprintf(f, ",\n  \"cubert_version\": \"%d.%d.%d\",\n", CUBE_VERSION_MAJOR,
            CUBE_VERSION_MINOR, CUBE_VERSION_PATCH);
    fprintf(f, "  \"cubert_device\": ");
    if (props) {
        fprintf(f, "{\"name\": ");
        json_string(f, props->name);
        fprintf(f, ", \"architecture\": ");
        json_string(f, props->architecture);
        fprintf(f, "}");
    } else {
        fprintf(f, "null");
    }
    fprintf(f, ",\n  \"peer_only\": %s,\n", S.peer_only ? "true" : "false");
    fprintf(f, "  \"measurements\": [\n");
    int met = 0, total = 0;
    for (int i = 0; i < nresults; i++) {
        const result *r = &results[i];
        int m = aim_met(r);
        if (m >= 0) {
            total++;
            met += m;
        }
        fprintf(f, "    {\"id\": ");
        json_string(f, r->id);
        fprintf(f, ", \"name\": ");
        json_string(f, r->name);
        fprintf(f, ", \"unit\": ");
        json_string(f, r->unit_json);
        fprintf(f, ", \"cubert\": ");
        json_number(f, r->cubert);
        fprintf(f, ", \"driver\": ");
        json_number(f, r->driver);
        fprintf(f, ", \"ratio\": ");
        json_number(f, ratio_of(r));
        if (r->aim_op) {
            fprintf(f, ", \"aim\": {\"op\": \"%s\", \"value\": ",
                    r->aim_op == '<' ? "<=" : ">=");
            json_number(f, r->aim);
            fprintf(f, "}");
        } else {
            fprintf(f, ", \"aim\": null");
        }
        fprintf(f, ", \"met\": %s}%s\n",
                m < 0 ? "null"
                : m   ? "true"
                      : "false",
                i + 1 < nresults ? "," : "");
    }
    fprintf(f, "  ],\n  \"aims_met\": %d,\n  \"aims_total\": %d\n}\n", met,
            total);
    if (fclose(f) != 0) {
        fprintf(stderr, "bench_cuda: cannot write %s: %s\n", path,
                strerror(errno));
        exit(1);
    }
}

/* --- shared buffers of the launch benchmarks --- */

static struct {
    cube_kernel *noop, *add3;
    cube_handle a, b, c, out;
    cube_arg noop_args[1], add3_args[5];
    CUmodule module;
    CUfunction f_noop, f_add3;
    CUdeviceptr da, db, dc, dout;
    unsigned int zero, n;
    void *noop_params[1], *add3_params[5];
    int checked; /* the add3 buffers exist and were checked */
} K;

/* What every phase needs: the empty kernel on both sides (cubert's
 * compiles at its first launch) and the 4-buffer kernel's description. */
static void prepare_kernels(void)
{
    K.zero = 0;
    K.noop_params[0] = &K.zero;
    if (!S.peer_only) {
        K.noop = make_kernel("noop", cube_noop_src, 1);
        K.add3 = make_kernel("add3", cube_add3_src, ADD_DIM);
        K.noop_args[0] = cube_arg_u32(0);
    }
}

/* Fills the inputs on both sides, runs the 4-buffer kernel once over a
 * poisoned output and checks every element. */
static void setup_and_check_add3(void)
{
    if (K.checked)
        return;
    K.checked = 1;
    const uint64_t bytes = (uint64_t)ADD_N * sizeof(float);
    float *a = xmalloc(bytes), *b = xmalloc(bytes), *c = xmalloc(bytes);
    float *poison = xmalloc(bytes), *back = xmalloc(bytes);
    for (uint32_t i = 0; i < ADD_N; i++) {
        a[i] = (float)(i & 1023);
        b[i] = (float)((i >> 10) & 255) * 0.5f;
        c[i] = 0.25f + (float)(i % 7);
    }
    memset(poison, 0xff, bytes); /* NaN */
    K.n = ADD_N;

    CK(cuCtxSetCurrent(S.ctx));
    CK(cuMemAlloc(&K.da, bytes));
    CK(cuMemAlloc(&K.db, bytes));
    CK(cuMemAlloc(&K.dc, bytes));
    CK(cuMemAlloc(&K.dout, bytes));
    CK(cuMemcpyHtoD(K.da, a, bytes));
    CK(cuMemcpyHtoD(K.db, b, bytes));
    CK(cuMemcpyHtoD(K.dc, c, bytes));
    CK(cuMemcpyHtoD(K.dout, poison, bytes));
    K.add3_params[0] = &K.da;
    K.add3_params[1] = &K.db;
    K.add3_params[2] = &K.dc;
    K.add3_params[3] = &K.dout;
    K.add3_params[4] = &K.n;
    CK(cuLaunchKernel(K.f_add3, ADD_N / ADD_DIM, 1, 1, ADD_DIM, 1, 1, 0,
                      S.stream, K.add3_params, NULL));
    CK(cuStreamSynchronize(S.stream));
    CK(cuMemcpyDtoH(back, K.dout, bytes));
    for (uint32_t i = 0; i < ADD_N; i++)
        if (back[i] != a[i] + b[i] + c[i]) {
            fprintf(stderr,
                    "bench_cuda: driver add3 is wrong at %u: %g, expected "
                    "%g\n",
                    i, (double)back[i], (double)(a[i] + b[i] + c[i]));
            exit(1);
        }

    if (!S.peer_only) {
        ok(cube_create(S.client, a, bytes, &K.a), "cube_create(a)");
        ok(cube_create(S.client, b, bytes, &K.b), "cube_create(b)");
        ok(cube_create(S.client, c, bytes, &K.c), "cube_create(c)");
        ok(cube_create(S.client, poison, bytes, &K.out), "cube_create(out)");
        K.add3_args[0] = cube_arg_buffer(K.a);
        K.add3_args[1] = cube_arg_buffer(K.b);
        K.add3_args[2] = cube_arg_buffer(K.c);
        K.add3_args[3] = cube_arg_buffer(K.out);
        K.add3_args[4] = cube_arg_u32(ADD_N);
        ok(cube_launch(S.client, K.add3,
                       cube_count_static(ADD_N / ADD_DIM, 1, 1), K.add3_args, 5,
                       CUBE_LAUNCH_EXECUTE),
           "cube_launch(add3)");
        ok(cube_launch(S.client, K.noop, cube_count_static(1, 1, 1),
                       K.noop_args, 1, CUBE_LAUNCH_EXECUTE),
           "cube_launch(noop)");
        memset(back, 0, bytes);
        cube_copy_desc d = cube_copy_desc_contiguous(K.out, bytes, 4);
        void *dst = back;
        ok(cube_read(S.client, &d, &dst, &bytes, 1), "cube_read(out)");
        for (uint32_t i = 0; i < ADD_N; i++)
            if (back[i] != a[i] + b[i] + c[i]) {
                fprintf(stderr,
                        "bench_cuda: cubert add3 is wrong at %u: %g, "
                        "expected %g\n",
                        i, (double)back[i], (double)(a[i] + b[i] + c[i]));
                exit(1);
            }
    }
    printf("- check: add3 over %u floats is right on both sides\n\n", ADD_N);
    free(a);
    free(b);
    free(c);
    free(poison);
    free(back);
}

static job noop_job(int n, int cubert)
{
    job j;
    memset(&j, 0, sizeof j);
    j.n = n;
    if (cubert) {
        j.kernel = K.noop;
        j.count = cube_count_static(1, 1, 1);
        j.args = K.noop_args;
        j.nargs = 1;
    } else {
        j.func = K.f_noop;
        j.grid = 1;
        j.block = 1;
        j.params = K.noop_params;
    }
    return j;
}

static job add3_job(int n, int cubert)
{
    job j;
    memset(&j, 0, sizeof j);
    j.n = n;
    if (cubert) {
        j.kernel = K.add3;
        j.count = cube_count_static(ADD_N / ADD_DIM, 1, 1);
        j.args = K.add3_args;
        j.nargs = 5;
    } else {
        j.func = K.f_add3;
        j.grid = ADD_N / ADD_DIM;
        j.block = ADD_DIM;
        j.params = K.add3_params;
    }
    return j;
}

/* Median of v[0, n) divided by `per`; NAN without cubert for cubert's
 * column (cubert != 0). */
static double med(double *v, int n, double per, int cubert)
{
    if (cubert && S.peer_only)
        return NAN;
    return median(v, (size_t)n) / per;
}

/* --- (a) launch host cost --- */

static void bench_launch_cost(void)
{
    setup_and_check_add3(); /* a2 launches over the add3 buffers */
    static double tc[LAUNCH4_BATCHES], td[LAUNCH4_BATCHES];
    job jc = noop_job(LAUNCH_BATCH, 1), jd = noop_job(LAUNCH_BATCH, 0);
    alternate(cb_launches, &jc, dr_launches, &jd, 2, LAUNCH_BATCHES, tc, td);
    char name[160];
    snprintf(name, sizeof name,
             "launch host cost, empty kernel (one u32, 1 cube x 1 unit), "
             "median of %d batches of %d",
             LAUNCH_BATCHES, LAUNCH_BATCH);
    report("a1", name, "µs/launch", "us/launch",
           med(tc, LAUNCH_BATCHES, LAUNCH_BATCH * 1e3, 1),
           med(td, LAUNCH_BATCHES, LAUNCH_BATCH * 1e3, 0), '<', 1.10);

    jc = add3_job(LAUNCH4_BATCH, 1);
    jd = add3_job(LAUNCH4_BATCH, 0);
    alternate(cb_launches, &jc, dr_launches, &jd, 2, LAUNCH4_BATCHES, tc, td);
    snprintf(name, sizeof name,
             "launch host cost, 4-buffer kernel (3 in, 1 out, 1M floats, "
             "4096 cubes x 256), median of %d batches of %d",
             LAUNCH4_BATCHES, LAUNCH4_BATCH);
    report("a2", name, "µs/launch", "us/launch",
           med(tc, LAUNCH4_BATCHES, LAUNCH4_BATCH * 1e3, 1),
           med(td, LAUNCH4_BATCHES, LAUNCH4_BATCH * 1e3, 0), '<', 1.10);
}

/* --- (b) sustained launches --- */

static void bench_sustained(void)
{
    double tc[SUSTAINED_ROUNDS], td[SUSTAINED_ROUNDS];
    job jc = noop_job(SUSTAINED_LAUNCHES, 1),
        jd = noop_job(SUSTAINED_LAUNCHES, 0);
    alternate(cb_sustained, &jc, dr_sustained, &jd, 1, SUSTAINED_ROUNDS, tc,
              td);
    double c = med(tc, SUSTAINED_ROUNDS, 1.0, 1);
    double d = med(td, SUSTAINED_ROUNDS, 1.0, 0);
    char name[160];
    snprintf(name, sizeof name,
             "sustained launches, %d empty launches then one sync, median "
             "of %d",
             SUSTAINED_LAUNCHES, SUSTAINED_ROUNDS);
    report("b", name, "launches/s", "launches/s",
           SUSTAINED_LAUNCHES / (c * 1e-9), SUSTAINED_LAUNCHES / (d * 1e-9),
           '>', 0.95);
}

/* --- (c) graph replay --- */

/* --graph-detail: each side replayed alone, and the driver's replays
 * split into the host time of the launch calls and the device time
 * between two events recorded around them. One line each, µs per node,
 * medians of GRAPH_ROUNDS rounds after 2 warm-up rounds. */
static void graph_detail(const job *jc, const job *jd, double alt_c,
                         double alt_d)
{
    double per = (double)GRAPH_REPLAYS * GRAPH_NODES * 1e3;
    double wall[GRAPH_ROUNDS], host[GRAPH_ROUNDS], dev[GRAPH_ROUNDS];
    CK(cuCtxSetCurrent(S.ctx));
    for (int r = -2; r < GRAPH_ROUNDS; r++) {
        double t0 = now_ns();
        for (int i = 0; i < jd->n; i++)
            CK(cuGraphLaunch(jd->exec, S.stream));
        double t1 = now_ns();
        CK(cuStreamSynchronize(S.stream));
        double t2 = now_ns();
        if (r >= 0) {
            wall[r] = t2 - t0;
            host[r] = t1 - t0;
        }
    }
    CUevent e0, e1;
    CK(cuEventCreate(&e0, CU_EVENT_DEFAULT));
    CK(cuEventCreate(&e1, CU_EVENT_DEFAULT));
    for (int r = -2; r < GRAPH_ROUNDS; r++) {
        CK(cuEventRecord(e0, S.stream));
        for (int i = 0; i < jd->n; i++)
            CK(cuGraphLaunch(jd->exec, S.stream));
        CK(cuEventRecord(e1, S.stream));
        CK(cuStreamSynchronize(S.stream));
        float ms = 0;
        CK(cuEventElapsedTime(&ms, e0, e1));
        if (r >= 0)
            dev[r] = (double)ms * 1e6;
    }
    CK(cuEventDestroy(e0));
    CK(cuEventDestroy(e1));
    printf("    graph detail (µs per node, median of %d rounds of %d "
           "replays):\n",
           GRAPH_ROUNDS, GRAPH_REPLAYS);
    printf("    detail alternated-cubert wall=%.4f\n", alt_c);
    printf("    detail alternated-driver wall=%.4f\n", alt_d);
    double w = median(wall, GRAPH_ROUNDS) / per;
    double h = median(host, GRAPH_ROUNDS) / per;
    double d = median(dev, GRAPH_ROUNDS) / per;
    printf("    detail driver-alone wall=%.4f device=%.4f launch=%.4f\n", w, d,
           h);
    if (!S.peer_only) {
        for (int r = -2; r < GRAPH_ROUNDS; r++) {
            double t = cb_replays(jc);
            if (r >= 0)
                wall[r] = t;
        }
        printf("    detail cubert-alone wall=%.4f\n",
               median(wall, GRAPH_ROUNDS) / per);
    }
    printf("    detail process threads=%d\n", process_threads());
    fflush(stdout);
}

static void bench_graph(void)
{
    job jc = noop_job(GRAPH_REPLAYS, 1), jd = noop_job(GRAPH_REPLAYS, 0);
    if (!S.peer_only) {
        ok(cube_graph_prepare(S.client), "cube_graph_prepare");
        ok(cube_launch(S.client, K.noop, jc.count, K.noop_args, 1,
                       CUBE_LAUNCH_EXECUTE),
           "warm-up launch");
        ok(cube_graph_begin(S.client), "cube_graph_begin");
        for (int i = 0; i < GRAPH_NODES; i++)
            ok(cube_launch(S.client, K.noop, jc.count, K.noop_args, 1,
                           CUBE_LAUNCH_EXECUTE),
               "captured cube_launch");
        ok(cube_graph_end(S.client, &jc.graph), "cube_graph_end");
    }
    CK(cuCtxSetCurrent(S.ctx));
    CUgraph graph;
    CK(cuStreamBeginCapture(S.stream, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
    for (int i = 0; i < GRAPH_NODES; i++)
        CK(cuLaunchKernel(K.f_noop, 1, 1, 1, 1, 1, 1, 0, S.stream,
                          K.noop_params, NULL));
    CK(cuStreamEndCapture(S.stream, &graph));
    CK(cuGraphInstantiate(&jd.exec, graph, 0));

    double tc[GRAPH_ROUNDS], td[GRAPH_ROUNDS];
    alternate(cb_replays, &jc, dr_replays, &jd, 2, GRAPH_ROUNDS, tc, td);
    double per = (double)GRAPH_REPLAYS * GRAPH_NODES * 1e3;
    char name[160];
    snprintf(name, sizeof name,
             "graph replay per node, %d empty launches per graph, %d "
             "replays + sync per round, median of %d",
             GRAPH_NODES, GRAPH_REPLAYS, GRAPH_ROUNDS);
    double c = med(tc, GRAPH_ROUNDS, per, 1), d = med(td, GRAPH_ROUNDS, per, 0);
    report("c", name, "µs/node", "us/node", c, d, '<', 1.05);
    if (S.graph_detail)
        graph_detail(&jc, &jd, c, d);

    if (!S.peer_only)
        ok(cube_graph_destroy(S.client, jc.graph), "cube_graph_destroy");
    CK(cuGraphExecDestroy(jd.exec));
    CK(cuGraphDestroy(graph));
}

/* --- (d) allocation --- */

static void bench_alloc(void)
{
    job j;
    memset(&j, 0, sizeof j);
    j.bytes = ALLOC_BYTES;
    j.n = ALLOC_PAIRS;
    double tc[ALLOC_ROUNDS], td[ALLOC_ROUNDS];
    alternate(cb_alloc, &j, dr_alloc, &j, 2, ALLOC_ROUNDS, tc, td);
    char name[160];
    snprintf(name, sizeof name,
             "allocate + release 1 MiB on a pool hit (cube_empty + "
             "cube_handle_release; cuMemAllocAsync + cuMemFreeAsync), median "
             "of %d rounds of %d",
             ALLOC_ROUNDS, ALLOC_PAIRS);
    report("d", name, "ns/pair", "ns/pair",
           med(tc, ALLOC_ROUNDS, ALLOC_PAIRS, 1),
           med(td, ALLOC_ROUNDS, ALLOC_PAIRS, 0), '<', 0.15);
}

/* --- (e) pinned and (f) pageable transfers --- */

static void fill_pattern(void *p, uint64_t bytes, uint32_t seed)
{
    uint32_t *w = p;
    uint64_t n = bytes / 4;
    uint32_t x = seed * 2654435761u + 1u;
    for (uint64_t i = 0; i < n; i++) {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        w[i] = x;
    }
}

static void check_same(const void *a, const void *b, uint64_t bytes,
                       const char *what)
{
    if (memcmp(a, b, (size_t)bytes) != 0) {
        fprintf(stderr, "bench_cuda: %s: the bytes read back differ\n", what);
        exit(1);
    }
}

static void report_transfer(const char *id, const char *what, uint64_t bytes,
                            int reps, double *tc, double *td, double aim)
{
    char name[160];
    snprintf(name, sizeof name, "%s %llu MiB, median of %d", what,
             (unsigned long long)(bytes >> 20), reps);
    /* bytes per ns = GB/s */
    double c = med(tc, reps, 1.0, 1), d = med(td, reps, 1.0, 0);
    report(id, name, "GB/s", "GB/s", (double)bytes / c, (double)bytes / d, '>',
           aim);
}

static void bench_pinned(void)
{
    static const uint64_t sizes[3] = {16ull << 20, 64ull << 20, 256ull << 20};
    static const char *ids[3][2] = {
        {"e16-w", "e16-r"}, {"e64-w", "e64-r"}, {"e256-w", "e256-r"}};
    for (int s = 0; s < 3; s++) {
        uint64_t bytes = sizes[s];
        job jc, jd;
        memset(&jc, 0, sizeof jc);
        memset(&jd, 0, sizeof jd);
        jc.bytes = jd.bytes = bytes;
        if (!S.peer_only) {
            uint64_t two[2] = {bytes, bytes};
            void *bufs[2];
            ok(cube_staging(S.client, two, 2, bufs), "cube_staging");
            jc.src = bufs[0];
            jc.dst = bufs[1];
            ok(cube_empty(S.client, bytes, &jc.handle), "cube_empty");
            jc.desc = cube_copy_desc_contiguous(jc.handle, bytes, 4);
            fill_pattern(jc.src, bytes, (uint32_t)s + 1);
            memset(jc.dst, 0, (size_t)bytes);
        }
        CK(cuCtxSetCurrent(S.ctx));
        CK(cuMemHostAlloc(&jd.src, (size_t)bytes, 0));
        CK(cuMemHostAlloc(&jd.dst, (size_t)bytes, 0));
        CK(cuMemAlloc(&jd.dptr, (size_t)bytes));
        fill_pattern(jd.src, bytes, (uint32_t)s + 11);
        memset(jd.dst, 0, (size_t)bytes);

        double tc[PINNED_REPS], td[PINNED_REPS];
        alternate(cb_write, &jc, dr_write_pinned, &jd, 2, PINNED_REPS, tc, td);
        report_transfer(ids[s][0],
                        "pinned write (host to device, cube_staging; "
                        "cuMemHostAlloc + cuMemcpyHtoDAsync)",
                        bytes, PINNED_REPS, tc, td, 0.95);
        alternate(cb_read, &jc, dr_read_pinned, &jd, 2, PINNED_REPS, tc, td);
        report_transfer(ids[s][1],
                        "pinned read (device to host, cube_staging; "
                        "cuMemHostAlloc + cuMemcpyDtoHAsync)",
                        bytes, PINNED_REPS, tc, td, 0.95);

        if (!S.peer_only) {
            check_same(jc.src, jc.dst, bytes, "cubert pinned transfer");
            ok(cube_handle_release(S.client, jc.handle), "cube_handle_release");
            ok(cube_staging_free(S.client, jc.src), "cube_staging_free");
            ok(cube_staging_free(S.client, jc.dst), "cube_staging_free");
        }
        check_same(jd.src, jd.dst, bytes, "driver pinned transfer");
        CK(cuMemFree(jd.dptr));
        CK(cuMemFreeHost(jd.src));
        CK(cuMemFreeHost(jd.dst));
    }
}

static void bench_pageable(void)
{
    const uint64_t bytes = PAGEABLE_BYTES;
    job jc, jd;
    memset(&jc, 0, sizeof jc);
    memset(&jd, 0, sizeof jd);
    /* Both sides move the same two pageable buffers (touched). */
    void *src = xmalloc((size_t)bytes), *dst = xmalloc((size_t)bytes);
    fill_pattern(src, bytes, 99);
    memset(dst, 0, (size_t)bytes);
    jc.src = jd.src = src;
    jc.dst = jd.dst = dst;
    jc.bytes = jd.bytes = bytes;
    if (!S.peer_only) {
        ok(cube_empty(S.client, bytes, &jc.handle), "cube_empty");
        jc.desc = cube_copy_desc_contiguous(jc.handle, bytes, 4);
    }
    CK(cuCtxSetCurrent(S.ctx));
    CK(cuMemAlloc(&jd.dptr, (size_t)bytes));

    double tc[PAGEABLE_REPS], td[PAGEABLE_REPS];
    alternate(cb_write, &jc, dr_write_pageable, &jd, 1, PAGEABLE_REPS, tc, td);
    report_transfer("f-w",
                    "pageable write (host to device from malloc'ed memory; "
                    "cuMemcpyHtoD + cuCtxSynchronize)",
                    bytes, PAGEABLE_REPS, tc, td, 3.0);
    alternate(cb_read, &jc, dr_read_pageable, &jd, 1, PAGEABLE_REPS, tc, td);
    report_transfer("f-r",
                    "pageable read (device to host into malloc'ed memory; "
                    "cuMemcpyDtoH)",
                    bytes, PAGEABLE_REPS, tc, td, 3.0);

    /* Each side's copy checked on its own. */
    if (!S.peer_only) {
        memset(dst, 0, (size_t)bytes);
        cb_read(&jc);
        check_same(src, dst, bytes, "cubert pageable transfer");
        ok(cube_handle_release(S.client, jc.handle), "cube_handle_release");
    }
    memset(dst, 0, (size_t)bytes);
    CK(cuCtxSetCurrent(S.ctx));
    dr_read_pageable(&jd);
    check_same(src, dst, bytes, "driver pageable transfer");
    CK(cuMemFree(jd.dptr));
    free(src);
    free(dst);
}

/* --- (g) 4-byte round trip --- */

static void bench_roundtrip(void)
{
    const uint32_t value = 0x2468ace1u;
    uint32_t back_c = 0, back_d = 0;
    job jc, jd;
    memset(&jc, 0, sizeof jc);
    memset(&jd, 0, sizeof jd);
    jc.bytes = jd.bytes = 4;
    jc.dst = &back_c;
    jd.dst = &back_d;
    if (!S.peer_only) {
        ok(cube_create(S.client, &value, 4, &jc.handle), "cube_create");
        jc.desc = cube_copy_desc_contiguous(jc.handle, 4, 4);
    }
    CK(cuCtxSetCurrent(S.ctx));
    CK(cuMemAlloc(&jd.dptr, 4));
    CK(cuMemcpyHtoD(jd.dptr, &value, 4));

    static double tc[ROUNDTRIP_REPS], td[ROUNDTRIP_REPS];
    alternate(cb_read, &jc, dr_read_pageable, &jd, 100, ROUNDTRIP_REPS, tc, td);
    if ((!S.peer_only && back_c != value) || back_d != value) {
        fprintf(stderr,
                "bench_cuda: 4-byte read gave %#x (cubert), %#x (driver); "
                "expected %#x\n",
                back_c, back_d, value);
        exit(1);
    }
    char name[160];
    snprintf(name, sizeof name,
             "4-byte read round trip (cube_read; cuMemcpyDtoH), median of %d",
             ROUNDTRIP_REPS);
    report("g", name, "µs", "us", med(tc, ROUNDTRIP_REPS, 1e3, 1),
           med(td, ROUNDTRIP_REPS, 1e3, 0), '<', 1.2);
    if (!S.peer_only)
        ok(cube_handle_release(S.client, jc.handle), "cube_handle_release");
    CK(cuMemFree(jd.dptr));
}

/* --- (h) compile and disk cache --- */

/* The child: opens a client (CUBERT_CACHE_DIR comes from the environment
 * the parent gave it), launches the 4-buffer kernel for the first time in
 * this process and prints how long that launch + sync took. */
static int first_launch_child(const char *device)
{
    cube_client *c = NULL;
    ok(cube_client_open(device, NULL, &c), "cube_client_open (child)");
    cube_kernel *k = make_kernel("add3", cube_add3_src, ADD_DIM);
    const uint64_t bytes = (uint64_t)ADD_N * sizeof(float);
    cube_handle h[4];
    for (int i = 0; i < 4; i++)
        ok(cube_empty(c, bytes, &h[i]), "cube_empty (child)");
    cube_arg args[5] = {cube_arg_buffer(h[0]), cube_arg_buffer(h[1]),
                        cube_arg_buffer(h[2]), cube_arg_buffer(h[3]),
                        cube_arg_u32(ADD_N)};
    double t0 = now_ns();
    ok(cube_launch(c, k, cube_count_static(ADD_N / ADD_DIM, 1, 1), args, 5,
                   CUBE_LAUNCH_EXECUTE),
       "first cube_launch (child)");
    ok(cube_sync(c, NULL, 0), "cube_sync (child)");
    double ms = (now_ns() - t0) * 1e-6;
    printf("first_launch_ms %.6f\n", ms);
    for (int i = 0; i < 4; i++)
        ok(cube_handle_release(c, h[i]), "cube_handle_release (child)");
    cube_kernel_release(k);
    cube_client_close(c);
    return 0;
}

extern char **environ;

/* Runs this program again (fork + exec /proc/self/exe) as a first-launch
 * child with CUBERT_CACHE_DIR=cache_dir; returns the time it reports. */
static double run_child(const char *cache_dir)
{
    /* Everything the child needs is built before the fork: between fork
     * and exec it only calls async-signal-safe functions. */
    size_t n = 0;
    while (environ[n])
        n++;
    char **envp = xmalloc((n + 2) * sizeof *envp);
    size_t m = 0;
    static const char key[] = "CUBERT_CACHE_DIR=";
    for (size_t i = 0; i < n; i++)
        if (strncmp(environ[i], key, sizeof key - 1) != 0)
            envp[m++] = environ[i];
    size_t len = sizeof key + strlen(cache_dir);
    char *var = xmalloc(len);
    snprintf(var, len, "%s%s", key, cache_dir);
    envp[m++] = var;
    envp[m] = NULL;
    static char prog[] = "bench_cuda", flag[] = CHILD_FLAG;
    char *argv[] = {prog, flag, S.device_name, NULL};

    int fds[2];
    if (pipe(fds) != 0)
        die("pipe failed");
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0)
        die("fork failed");
    if (pid == 0) {
        dup2(fds[1], STDOUT_FILENO);
        close(fds[0]);
        close(fds[1]);
        execve("/proc/self/exe", argv, envp);
        _exit(127);
    }
    close(fds[1]);
    char out[4096];
    size_t got = 0;
    for (;;) {
        ssize_t r = read(fds[0], out + got, sizeof out - 1 - got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break;
        got += (size_t)r;
        if (got == sizeof out - 1)
            break;
    }
    out[got] = '\0';
    close(fds[0]);
    int status = 0;
    while (waitpid(pid, &status, 0) < 0)
        if (errno != EINTR)
            die("waitpid failed");
    free(var);
    free(envp);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        fprintf(stderr,
                "bench_cuda: the first-launch child failed (status %d); its "
                "output:\n%s\n",
                status, out);
        exit(1);
    }
    const char *line = strstr(out, "first_launch_ms ");
    double ms = 0;
    if (!line || sscanf(line, "first_launch_ms %lf", &ms) != 1) {
        fprintf(stderr, "bench_cuda: the child reported no time:\n%s\n", out);
        exit(1);
    }
    return ms;
}

static long tree_files;

static int count_entry(const char *path, const struct stat *sb, int flag,
                       struct FTW *ftw)
{
    (void)path;
    (void)sb;
    (void)ftw;
    if (flag == FTW_F)
        tree_files++;
    return 0;
}

static int remove_entry(const char *path, const struct stat *sb, int flag,
                        struct FTW *ftw)
{
    (void)sb;
    (void)flag;
    (void)ftw;
    if (remove(path) != 0)
        fprintf(stderr, "bench_cuda: cannot remove %s: %s\n", path,
                strerror(errno));
    return 0;
}

static void bench_compile(void)
{
    /* The driver: cold NVRTC compiles + loads of the 4-buffer kernel, each
     * of a source no compile has seen (NVRTC keeps no cache; the comment
     * makes sure). */
    double td[COMPILE_REPS];
    size_t cap = sizeof driver_add3_src + 96;
    char *src = xmalloc(cap);
    CK(cuCtxSetCurrent(S.ctx));
    for (int r = 0; r < COMPILE_REPS; r++) {
        snprintf(src, cap, "/* bench_cuda cold compile %ld #%d */\n%s",
                 (long)getpid(), r, driver_add3_src);
        double t0 = now_ns();
        CUmodule mod = nvrtc_module(src, S.cc_major, S.cc_minor);
        CUfunction f;
        CK(cuModuleGetFunction(&f, mod, "add3"));
        td[r] = (now_ns() - t0) * 1e-6;
        CK(cuModuleUnload(mod));
    }
    free(src);
    double driver_ms = median(td, COMPILE_REPS);

    double cold_ms = NAN, disk_ms = NAN;
    long files = 0;
    if (!S.peer_only) {
        char base[] = "/tmp/cubert-bench-cuda-XXXXXX";
        if (!mkdtemp(base))
            die("mkdtemp failed");
        double cold[CHILD_ROUNDS], disk[CHILD_ROUNDS];
        for (int r = 0; r < CHILD_ROUNDS; r++) {
            char dir[sizeof base + 16];
            snprintf(dir, sizeof dir, "%s/r%d", base, r);
            cold[r] = run_child(dir);
            tree_files = 0;
            nftw(dir, count_entry, 16, FTW_PHYS);
            files = tree_files;
            disk[r] = run_child(dir);
        }
        nftw(base, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
        cold_ms = median(cold, CHILD_ROUNDS);
        disk_ms = median(disk, CHILD_ROUNDS);
    }
    char name[200];
    snprintf(name, sizeof name,
             "first launch + sync of the 4-buffer kernel in a new process, "
             "from cubert's disk cache; driver: cold NVRTC compile + "
             "cuModuleLoadData (median of %d)",
             COMPILE_REPS);
    report("h1", name, "ms", "ms", disk_ms, driver_ms, '<', 0.05);
    snprintf(name, sizeof name,
             "cubert's cold first launch + sync in a new process (compiles, "
             "fills the cache); driver: as h1");
    report("h2", name, "ms", "ms", cold_ms, driver_ms, 0, 0);
    printf("    (%d child pairs; the cache held %ld file%s after a cold "
           "child; this process's first NVRTC compile, loading NVRTC, took "
           "%.1f ms)\n",
           S.peer_only ? 0 : CHILD_ROUNDS, files, files == 1 ? "" : "s",
           S.first_nvrtc_ms);
    if (!S.peer_only && files == 0)
        printf("    WARNING: cubert wrote nothing to its disk cache: h1 did "
               "not load from it\n");
}

/* --- main --- */

static void usage(FILE *f)
{
    fprintf(f, "usage: bench_cuda [--device N] [--json FILE] [--peer-only]\n"
               "                  [--phases LIST] [--graph-detail]\n"
               "  cubert's CUDA backend beside the raw CUDA driver on GPU N "
               "(default 0).\n"
               "  --json FILE     also write the figures as JSON\n"
               "  --peer-only     measure the driver side only\n"
               "  --phases LIST   run these phases in this order, comma "
               "separated:\n"
               "                  check, graph, launch, sustained, alloc, "
               "pinned, pageable,\n"
               "                  roundtrip, compile, cross, threads "
               "(default: all, in this order)\n"
               "  --graph-detail  in the graph phase, also time each side "
               "alone and split\n"
               "                  the driver's replays into launch calls "
               "and device time\n"
               "Exits 77 when cubert cannot open the CUDA device.\n");
}

/* --- (x) a dependency across streams against one on the same stream --- */

#define XS_PAIRS 500
#define XS_ROUNDS 20

static const char cube_touch_src[] =
    "CUBE_KERNEL(touch, CUBE_INOUT(uint32_t, x))\n"
    "{\n"
    "    if (ABSOLUTE_POS_X == 0)\n"
    "        CUBE_AT(x, 0) += 1;\n"
    "}\n";
static const char driver_touch_src[] =
    "extern \"C\" __global__ void touch(unsigned int *x)\n"
    "{\n"
    "    if (blockIdx.x * blockDim.x + threadIdx.x == 0)\n"
    "        x[0] += 1;\n"
    "}\n";

static struct {
    cube_kernel *touch;
    cube_handle x;
    cube_arg args[1];
    CUfunction f;
    CUdeviceptr dx;
    void *params[1];
    CUstream other;
    CUevent ev_a, ev_b;
    int cross;
} X;

/* XS_PAIRS dependent pairs: a write of x, then a write that reads it,
 * on one stream or on two (stream ids 1 and 2). */
static double cb_pairs(const job *j)
{
    (void)j;
    cube_count one = cube_count_static(1, 1, 1);
    double t0 = now_ns();
    for (int i = 0; i < XS_PAIRS; i++) {
        if (X.cross)
            ok(cube_stream_use(S.client, 1), "cube_stream_use");
        ok(cube_launch(S.client, X.touch, one, X.args, 1, CUBE_LAUNCH_EXECUTE),
           "cube_launch(touch)");
        if (X.cross)
            ok(cube_stream_use(S.client, 2), "cube_stream_use");
        ok(cube_launch(S.client, X.touch, one, X.args, 1, CUBE_LAUNCH_EXECUTE),
           "cube_launch(touch)");
    }
    double t = now_ns() - t0;
    if (X.cross) {
        ok(cube_stream_use(S.client, 1), "cube_stream_use");
        ok(cube_sync(S.client, NULL, 0), "cube_sync");
        ok(cube_stream_use(S.client, 2), "cube_stream_use");
    }
    ok(cube_sync(S.client, NULL, 0), "cube_sync");
    ok(cube_stream_use(S.client, 0), "cube_stream_use");
    return t;
}

/* The same with the driver: on two streams each write first waits for an
 * event recorded after the other stream's write. */
static double dr_pairs(const job *j)
{
    (void)j;
    double t0 = now_ns();
    for (int i = 0; i < XS_PAIRS; i++) {
        if (X.cross) {
            CK(cuStreamWaitEvent(S.stream, X.ev_b, 0));
            CK(cuLaunchKernel(X.f, 1, 1, 1, 1, 1, 1, 0, S.stream, X.params,
                              NULL));
            CK(cuEventRecord(X.ev_a, S.stream));
            CK(cuStreamWaitEvent(X.other, X.ev_a, 0));
            CK(cuLaunchKernel(X.f, 1, 1, 1, 1, 1, 1, 0, X.other, X.params,
                              NULL));
            CK(cuEventRecord(X.ev_b, X.other));
        } else {
            for (int k = 0; k < 2; k++)
                CK(cuLaunchKernel(X.f, 1, 1, 1, 1, 1, 1, 0, S.stream, X.params,
                                  NULL));
        }
    }
    double t = now_ns() - t0;
    CK(cuStreamSynchronize(S.stream));
    CK(cuStreamSynchronize(X.other));
    return t;
}

static void bench_cross_stream(void)
{
    CK(cuCtxSetCurrent(S.ctx));
    CUmodule m = nvrtc_module(driver_touch_src, S.cc_major, S.cc_minor);
    CK(cuModuleGetFunction(&X.f, m, "touch"));
    CK(cuMemAlloc(&X.dx, 4));
    CK(cuMemsetD8(X.dx, 0, 4));
    CK(cuStreamCreate(&X.other, CU_STREAM_NON_BLOCKING));
    CK(cuEventCreate(&X.ev_a, CU_EVENT_DISABLE_TIMING));
    CK(cuEventCreate(&X.ev_b, CU_EVENT_DISABLE_TIMING));
    CK(cuEventRecord(X.ev_b, X.other));
    X.params[0] = &X.dx;
    uint32_t zero = 0;
    if (!S.peer_only) {
        X.touch = make_kernel("touch", cube_touch_src, 1);
        ok(cube_create(S.client, &zero, 4, &X.x), "cube_create(x)");
        X.args[0] = cube_arg_buffer(X.x);
    }
    double same_c[XS_ROUNDS], same_d[XS_ROUNDS], cross_c[XS_ROUNDS],
        cross_d[XS_ROUNDS];
    job none;
    memset(&none, 0, sizeof none);
    X.cross = 0;
    alternate(cb_pairs, &none, dr_pairs, &none, 2, XS_ROUNDS, same_c, same_d);
    X.cross = 1;
    alternate(cb_pairs, &none, dr_pairs, &none, 2, XS_ROUNDS, cross_c, cross_d);
    double sc = med(same_c, XS_ROUNDS, XS_PAIRS * 1e3, 1);
    double sd = med(same_d, XS_ROUNDS, XS_PAIRS * 1e3, 0);
    double xc = med(cross_c, XS_ROUNDS, XS_PAIRS * 1e3, 1);
    double xd = med(cross_d, XS_ROUNDS, XS_PAIRS * 1e3, 0);
    report("x1",
           "dependent pair on one stream: write x, then a write reading x "
           "(host µs per pair)",
           "µs/pair", "us/pair", sc, sd, 0, 0);
    report("x2",
           "dependent pair across two streams (cubert orders by last writer; "
           "driver: event record + stream wait per write)",
           "µs/pair", "us/pair", xc, xd, 0, 0);
    if (!S.peer_only) {
        uint32_t got = 0;
        cube_copy_desc d = cube_copy_desc_contiguous(X.x, 4, 4);
        void *dst = &got;
        uint64_t size = 4;
        ok(cube_read(S.client, &d, &dst, &size, 1), "cube_read(x)");
        uint32_t want = 2u * XS_PAIRS * (2u + XS_ROUNDS) * 2u;
        printf("    cubert: a cross-stream pair costs %.2fx a same-stream "
               "pair; x counted %u of %u writes (%s)\n",
               xc / sc, got, want, got == want ? "ordered" : "LOST WRITES");
        if (got != want)
            exit(1);
        ok(cube_handle_release(S.client, X.x), "cube_handle_release");
        cube_kernel_release(X.touch);
    }
    CK(cuCtxSetCurrent(S.ctx));
    CK(cuEventDestroy(X.ev_a));
    CK(cuEventDestroy(X.ev_b));
    CK(cuStreamDestroy(X.other));
    CK(cuMemFree(X.dx));
    CK(cuModuleUnload(m));
}

/* --- (t) launch throughput from several threads, each on its own stream --- */

#define THREAD_LAUNCHES 20000
#define THREAD_ROUNDS 5
#define MAX_THREADS 16

typedef struct thread_run {
    int cubert;
    int threads;
    pthread_barrier_t start, end;
    CUstream streams[MAX_THREADS];
} thread_run;

typedef struct thread_arg {
    thread_run *run;
    int index;
} thread_arg;

static void *launch_thread(void *p)
{
    const thread_arg *a = p;
    thread_run *run = a->run;
    if (run->cubert) {
        /* The first launch creates the thread's own stream: before the
         * clock starts. */
        ok(cube_launch(S.client, K.noop, cube_count_static(1, 1, 1),
                       K.noop_args, 1, CUBE_LAUNCH_EXECUTE),
           "cube_launch");
        ok(cube_sync(S.client, NULL, 0), "cube_sync");
    } else {
        CK(cuCtxSetCurrent(S.ctx));
    }
    pthread_barrier_wait(&run->start);
    for (int i = 0; i < THREAD_LAUNCHES; i++) {
        if (run->cubert)
            ok(cube_launch(S.client, K.noop, cube_count_static(1, 1, 1),
                           K.noop_args, 1, CUBE_LAUNCH_EXECUTE),
               "cube_launch");
        else
            CK(cuLaunchKernel(K.f_noop, 1, 1, 1, 1, 1, 1, 0,
                              run->streams[a->index], K.noop_params, NULL));
    }
    if (run->cubert)
        ok(cube_sync(S.client, NULL, 0), "cube_sync");
    else
        CK(cuStreamSynchronize(run->streams[a->index]));
    pthread_barrier_wait(&run->end);
    return NULL;
}

/* Launches per second from `threads` threads of one side. */
static double thread_round(thread_run *run)
{
    pthread_t tid[MAX_THREADS];
    thread_arg args[MAX_THREADS];
    pthread_barrier_init(&run->start, NULL, (unsigned)run->threads + 1);
    pthread_barrier_init(&run->end, NULL, (unsigned)run->threads + 1);
    for (int i = 0; i < run->threads; i++) {
        args[i].run = run;
        args[i].index = i;
        if (pthread_create(&tid[i], NULL, launch_thread, &args[i]) != 0)
            die("pthread_create");
    }
    pthread_barrier_wait(&run->start);
    double t0 = now_ns();
    pthread_barrier_wait(&run->end);
    double t = now_ns() - t0;
    for (int i = 0; i < run->threads; i++)
        pthread_join(tid[i], NULL);
    pthread_barrier_destroy(&run->start);
    pthread_barrier_destroy(&run->end);
    return (double)run->threads * THREAD_LAUNCHES / (t * 1e-9);
}

static void bench_threads(void)
{
    static const int counts[] = {1, 2, 4, 8, 16};
    thread_run run;
    memset(&run, 0, sizeof run);
    for (int i = 0; i < MAX_THREADS; i++)
        CK(cuStreamCreate(&run.streams[i], CU_STREAM_NON_BLOCKING));
    for (size_t k = 0; k < sizeof counts / sizeof counts[0]; k++) {
        run.threads = counts[k];
        double best_c = 0, best_d = 0;
        /* The sides take turns; the best round of each counts (threads
         * are at the mercy of the scheduler, the best round is the
         * least disturbed). */
        for (int r = 0; r < THREAD_ROUNDS; r++) {
            for (int side = 0; side < 2; side++) {
                run.cubert = (side + r) % 2 == 0;
                if (S.peer_only && run.cubert)
                    continue;
                double v = thread_round(&run);
                if (run.cubert && v > best_c)
                    best_c = v;
                if (!run.cubert && v > best_d)
                    best_d = v;
            }
        }
        char id[16], name[200];
        snprintf(id, sizeof id, "t%d", counts[k]);
        snprintf(name, sizeof name,
                 "launch throughput from %d thread%s, each on its own stream "
                 "(%d empty launches + sync per thread), best of %d",
                 counts[k], counts[k] > 1 ? "s" : "", THREAD_LAUNCHES,
                 THREAD_ROUNDS);
        report(id, name, "launches/s", "launches/s", best_c, best_d,
               counts[k] >= 8 ? '>' : 0, 0.95);
    }
    for (int i = 0; i < MAX_THREADS; i++)
        CK(cuStreamDestroy(run.streams[i]));
}

/* --- phases --- */

typedef struct phase {
    const char *name;
    void (*run)(void);
} phase;

/* In the order of a full run. Graph replay runs before the launch phases:
 * once a process has launched about 100,000 kernels on each of two streams
 * in turn (as the launch phases do, cubert's stream and the driver's), the
 * driver replays every graph of that process about a third slower per
 * node, on the device, whoever launches it — a driver-only program shows
 * it too (graph_replay_driver --prelaunch 100000 --prelaunch-two: 0.54 ->
 * 0.72 µs per node on an H200, and no change with one stream). */
static const phase all_phases[] = {
    {"check", setup_and_check_add3}, {"graph", bench_graph},
    {"launch", bench_launch_cost},   {"sustained", bench_sustained},
    {"alloc", bench_alloc},          {"pinned", bench_pinned},
    {"pageable", bench_pageable},    {"roundtrip", bench_roundtrip},
    {"compile", bench_compile},      {"cross", bench_cross_stream},
    {"threads", bench_threads}};
#define NPHASES ((int)(sizeof all_phases / sizeof all_phases[0]))
#define MAX_RUN 32

/* Parses "graph" or "launch,alloc,graph" (or "all") into run[]; returns
 * the count, or -1 after printing what is wrong. */
static int parse_phases(const char *list, int run[MAX_RUN])
{
    int n = 0;
    const char *p = list;
    for (;;) {
        size_t len = strcspn(p, ",");
        int found = -1;
        for (int i = 0; i < NPHASES; i++)
            if (strlen(all_phases[i].name) == len &&
                strncmp(p, all_phases[i].name, len) == 0)
                found = i;
        if (len == 3 && strncmp(p, "all", 3) == 0) {
            for (int i = 0; i < NPHASES && n < MAX_RUN; i++)
                run[n++] = i;
        } else if (found < 0) {
            fprintf(stderr, "bench_cuda: unknown phase '%.*s'\n", (int)len, p);
            return -1;
        } else if (n == MAX_RUN) {
            fprintf(stderr, "bench_cuda: at most %d phases\n", MAX_RUN);
            return -1;
        } else {
            run[n++] = found;
        }
        if (!p[len])
            break;
        p += len + 1;
    }
    return n;
}

int main(int argc, char **argv)
{
    if (argc == 3 && strcmp(argv[1], CHILD_FLAG) == 0)
        return first_launch_child(argv[2]);

    const char *json = NULL;
    int run[MAX_RUN], nrun = 0;
    for (int i = 0; i < NPHASES; i++)
        run[nrun++] = i;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--json") == 0 && i + 1 < argc) {
            json = argv[++i];
        } else if (strcmp(argv[i], "--phases") == 0 && i + 1 < argc) {
            nrun = parse_phases(argv[++i], run);
            if (nrun < 0) {
                usage(stderr);
                return 2;
            }
        } else if (strcmp(argv[i], "--graph-detail") == 0) {
            S.graph_detail = 1;
        } else if (strcmp(argv[i], "--device") == 0 && i + 1 < argc) {
            char *end = NULL;
            long d = strtol(argv[++i], &end, 10);
            if (!end || *end || d < 0 || d > 1024) {
                usage(stderr);
                return 2;
            }
            S.device = (int)d;
        } else if (strcmp(argv[i], "--peer-only") == 0) {
            S.peer_only = 1;
        } else if (strcmp(argv[i], "--help") == 0 ||
                   strcmp(argv[i], "-h") == 0) {
            usage(stdout);
            return 0;
        } else {
            usage(stderr);
            return 2;
        }
    }
    snprintf(S.device_name, sizeof S.device_name, "cuda:%d", S.device);
    double start = now_ns();

    cube_properties props;
    cube_utilities util;
    memset(&props, 0, sizeof props);
    memset(&util, 0, sizeof util);
    if (!S.peer_only) {
        cube_error *err = cube_client_open(S.device_name, NULL, &S.client);
        if (err) {
            printf("bench_cuda: cubert cannot open \"%s\": %s: %s\n"
                   "bench_cuda: skipped (nothing measured)\n",
                   S.device_name, cube_code_name(cube_error_code(err)),
                   cube_error_message(err));
            cube_error_free(err);
            return 77;
        }
        ok(cube_client_properties(S.client, &props), "cube_client_properties");
        ok(cube_client_utilities(S.client, &util), "cube_client_utilities");
    }

    CUresult init = cuInit(0);
    if (init != CUDA_SUCCESS && S.peer_only) {
        const char *text = NULL;
        cuGetErrorString(init, &text);
        printf("bench_cuda: the CUDA driver cannot start: %s; skipped\n",
               text ? text : "unknown error");
        return 77;
    }
    CK(init);
    CK(cuDeviceGet(&S.dev, S.device));
    CK(cuDevicePrimaryCtxRetain(&S.ctx, S.dev));
    CK(cuCtxSetCurrent(S.ctx));
    CK(cuStreamCreate(&S.stream, CU_STREAM_NON_BLOCKING));
    CK(cuDeviceGetAttribute(
        &S.cc_major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, S.dev));
    CK(cuDeviceGetAttribute(
        &S.cc_minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, S.dev));
    char gpu[256];
    CK(cuDeviceGetName(gpu, (int)sizeof gpu, S.dev));
    size_t mem = 0;
    CK(cuDeviceTotalMem(&mem, S.dev));
    int driver_version = 0, nv_major = 0, nv_minor = 0;
    CK(cuDriverGetVersion(&driver_version));
    NV(nvrtcVersion(&nv_major, &nv_minor));
    char cpu[256];
    bench_cpu_model(cpu, sizeof cpu);

    size_t cap = sizeof driver_noop_src + sizeof driver_add3_src;
    char *src = xmalloc(cap);
    snprintf(src, cap, "%s\n%s", driver_noop_src, driver_add3_src);
    double t0 = now_ns();
    K.module = nvrtc_module(src, S.cc_major, S.cc_minor);
    S.first_nvrtc_ms = (now_ns() - t0) * 1e-6;
    free(src);
    CK(cuModuleGetFunction(&K.f_noop, K.module, "noop"));
    CK(cuModuleGetFunction(&K.f_add3, K.module, "add3"));

    printf("# cubert CUDA backend beside the raw CUDA driver\n\n");
    printf("- GPU %d: %s, compute capability %d.%d, %zu MiB; driver API "
           "%d.%d, NVRTC %d.%d\n",
           S.device, gpu, S.cc_major, S.cc_minor, mem >> 20,
           driver_version / 1000, driver_version % 1000 / 10, nv_major,
           nv_minor);
    printf("- host: %ld online CPUs, %s\n", sysconf(_SC_NPROCESSORS_ONLN), cpu);
    if (S.peer_only)
        printf("- cubert: not measured (--peer-only)\n");
    else
        printf("- cubert %d.%d.%d on \"%s\": %s (%s), %s graphs, %s staging\n",
               CUBE_VERSION_MAJOR, CUBE_VERSION_MINOR, CUBE_VERSION_PATCH,
               S.device_name, props.name, props.architecture,
               util.software_graphs ? "software" : "hardware",
               props.features & CUBE_FEATURE_PINNED_STAGING ? "pinned"
                                                            : "unpinned");
    printf("- raw driver: primary context, one non-blocking stream, "
           "kernels compiled by NVRTC to CUBIN for sm_%d%d\n",
           S.cc_major, S.cc_minor);

    prepare_kernels();
    for (int i = 0; i < nrun; i++)
        all_phases[run[i]].run();

    print_table();
    if (json)
        write_json(json, gpu, cpu, driver_version, nv_major, nv_minor,
                   S.peer_only ? NULL : &props);

    if (!S.peer_only) {
        if (K.checked) {
            ok(cube_handle_release(S.client, K.a), "cube_handle_release");
            ok(cube_handle_release(S.client, K.b), "cube_handle_release");
            ok(cube_handle_release(S.client, K.c), "cube_handle_release");
            ok(cube_handle_release(S.client, K.out), "cube_handle_release");
        }
        cube_kernel_release(K.noop);
        cube_kernel_release(K.add3);
        cube_client_close(S.client);
    }
    CK(cuCtxSetCurrent(S.ctx));
    if (K.checked) {
        CK(cuMemFree(K.da));
        CK(cuMemFree(K.db));
        CK(cuMemFree(K.dc));
        CK(cuMemFree(K.dout));
    }
    CK(cuModuleUnload(K.module));
    CK(cuStreamDestroy(S.stream));
    CK(cuDevicePrimaryCtxRelease(S.dev));
    printf("\nbench_cuda: done in %.1f s\n", (now_ns() - start) * 1e-9);
    return 0;
}
