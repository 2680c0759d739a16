/* The OpenCL backend beside raw OpenCL calls on the same device, in the
 * same run, and beside cubert's CUDA backend where there is one:
 *   launch  host time per enqueue of an empty kernel: cube_launch against
 *           clSetKernelArg + clEnqueueNDRangeKernel (medians of rounds)
 *   write / read  64 MiB: cube_write / cube_read against blocking
 *           clEnqueueWriteBuffer / clEnqueueReadBuffer
 *   compile a kernel built cold by clBuildProgram against the same kernel
 *           loaded from cubert's disk cache by a fresh server
 *   axpy    y = a*x + y over 16 Mi floats: opencl against cuda (cubert
 *           both), device time from profiling windows
 * The device is opencl:0 (CUBERT_OPENCL_PLATFORM picks the platform).
 * `bench_opencl [--rounds N]`. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cubert/cubert.h>

#include "backends/opencl/opencl_api.h"
#include "bench_util.h"

#define ENQUEUES 2000
#define BYTES ((size_t)64 << 20)
#define AXPY_N (16u << 20)

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void die(cube_error *err, const char *what)
{
    char *text = cube_error_format(err);
    fprintf(stderr, "bench_opencl: %s: %s", what, text ? text : "?\n");
    free(text);
    cube_error_free(err);
    exit(1);
}
#define CHECK(call, what)                                                      \
    do {                                                                       \
        cube_error *e_ = (call);                                               \
        if (e_)                                                                \
            die(e_, what);                                                     \
    } while (0)

/* --- the raw side --- */

typedef struct raw {
    const opencl_api *a;
    cl_device_id dev;
    cl_context ctx;
    cl_command_queue q;
} raw;

static const char raw_src[] =
    "__kernel void empty(__global float *y, ulong n) { }\n"
    "__kernel void axpy(__global const float *x, __global float *y, float a,"
    " ulong n) { size_t i = get_global_id(0); if (i < n) y[i] = a * x[i] + "
    "y[i]; }\n";

/* opencl:0 as the backend numbers it: the first device of the first
 * platform that CUBERT_OPENCL_PLATFORM keeps. */
static int raw_open(raw *r)
{
    if (opencl_api_load(&r->a))
        return -1;
    const char *only = getenv("CUBERT_OPENCL_PLATFORM");
    cl_platform_id p[16];
    cl_uint np = 0;
    r->a->clGetPlatformIDs(16, p, &np);
    for (cl_uint i = 0; i < np && i < 16; i++) {
        char name[256] = "", vendor[256] = "";
        r->a->clGetPlatformInfo(p[i], CL_PLATFORM_NAME, sizeof name, name,
                                NULL);
        r->a->clGetPlatformInfo(p[i], CL_PLATFORM_VENDOR, sizeof vendor, vendor,
                                NULL);
        if (only && *only && !strcasestr(name, only) &&
            !strcasestr(vendor, only))
            continue;
        cl_uint nd = 0;
        if (r->a->clGetDeviceIDs(p[i], CL_DEVICE_TYPE_ALL, 1, &r->dev, &nd) !=
                CL_SUCCESS ||
            nd == 0)
            continue;
        cl_context_properties props[] = {CL_CONTEXT_PLATFORM,
                                         (cl_context_properties)p[i], 0};
        cl_int e = 0;
        r->ctx = r->a->clCreateContext(props, 1, &r->dev, NULL, NULL, &e);
        r->q =
            r->ctx ? r->a->clCreateCommandQueue(r->ctx, r->dev, 0, &e) : NULL;
        return r->q ? 0 : -1;
    }
    return -1;
}

static cl_program raw_build(raw *r, double *ms)
{
    const char *src = raw_src;
    cl_int e = 0;
    double t0 = now();
    cl_program prog =
        r->a->clCreateProgramWithSource(r->ctx, 1, &src, NULL, &e);
    if (prog &&
        r->a->clBuildProgram(prog, 1, &r->dev, "", NULL, NULL) != CL_SUCCESS)
        prog = NULL;
    *ms = (now() - t0) * 1e3;
    return prog;
}

/* --- cubert's side --- */

static const char empty_src[] =
    "CUBE_KERNEL(empty, CUBE_INOUT(float, y)) { }\n";
static const char axpy_src[] =
    "CUBE_KERNEL(axpy, CUBE_IN(float, x), CUBE_INOUT(float, y),\n"
    "            CUBE_SCALAR(float, a))\n"
    "{\n    uint32_t i = ABSOLUTE_POS_X;\n"
    "    if (i < CUBE_LEN(y))\n"
    "        CUBE_AT(y, i) = a * CUBE_AT(x, i) + CUBE_AT(y, i);\n}\n";

static double launch_cost(cube_client *c, cube_kernel *k, cube_handle y)
{
    cube_arg arg = cube_arg_buffer(y);
    double t0 = now();
    for (int i = 0; i < ENQUEUES; i++)
        CHECK(cube_launch(c, k, cube_count_static(1, 1, 1), &arg, 1,
                          CUBE_LAUNCH_EXECUTE),
              "launch");
    double t = (now() - t0) / ENQUEUES;
    CHECK(cube_sync(c, NULL, 0), "sync");
    return t;
}

static double raw_launch_cost(raw *r, cl_kernel k, cl_mem y)
{
    cl_ulong n = 64;
    size_t one = 1;
    double t0 = now();
    for (int i = 0; i < ENQUEUES; i++) {
        r->a->clSetKernelArg(k, 0, sizeof y, &y);
        r->a->clSetKernelArg(k, 1, sizeof n, &n);
        r->a->clEnqueueNDRangeKernel(r->q, k, 1, NULL, &one, &one, 0, NULL,
                                     NULL);
    }
    double t = (now() - t0) / ENQUEUES;
    r->a->clFinish(r->q);
    return t;
}

/* The device time of `reps` axpy launches, per launch. */
static double axpy_time(cube_client *c, cube_kernel *k, cube_handle x,
                        cube_handle y, int reps)
{
    cube_arg args[] = {cube_arg_buffer(x), cube_arg_buffer(y),
                       cube_arg_f32(0.5f)};
    cube_count n = cube_count_static(AXPY_N / 256, 1, 1);
    CHECK(cube_launch(c, k, n, args, 3, CUBE_LAUNCH_EXECUTE), "axpy");
    CHECK(cube_sync(c, NULL, 0), "sync");
    cube_profile_token t = 0;
    CHECK(cube_profile_start(c, &t), "profile");
    for (int i = 0; i < reps; i++)
        CHECK(cube_launch(c, k, n, args, 3, CUBE_LAUNCH_EXECUTE), "axpy");
    cube_profile_result res;
    CHECK(cube_profile_end(c, t, &res), "profile");
    return res.seconds / reps;
}

static double axpy_on(const char *device, int reps)
{
    cube_client *c = NULL;
    cube_error *err = cube_client_open(device, NULL, &c);
    if (err) {
        printf("| axpy %s | skipped: %s |\n", device, cube_error_message(err));
        cube_error_free(err);
        return 0;
    }
    cube_kernel *k = NULL;
    cube_kernel_desc d = {"axpy", axpy_src, {256, 1, 1}};
    CHECK(cube_kernel_create(&d, &k), "kernel");
    float *h = malloc((size_t)AXPY_N * 4);
    for (uint32_t i = 0; i < AXPY_N; i++)
        h[i] = (float)(i % 97);
    cube_handle x, y;
    CHECK(cube_create(c, h, (uint64_t)AXPY_N * 4, &x), "x");
    CHECK(cube_create(c, h, (uint64_t)AXPY_N * 4, &y), "y");
    double s = axpy_time(c, k, x, y, reps);
    cube_error_free(cube_handle_release(c, x));
    cube_error_free(cube_handle_release(c, y));
    cube_kernel_release(k);
    cube_client_close(c);
    free(h);
    return s;
}

int main(int argc, char **argv)
{
    int rounds = 7;
    if (argc == 3 && strcmp(argv[1], "--rounds") == 0)
        rounds = atoi(argv[2]) > 0 ? atoi(argv[2]) : 7;
    raw r;
    memset(&r, 0, sizeof r);
    if (raw_open(&r)) {
        printf("bench_opencl: no OpenCL device here; skipped\n");
        return 0;
    }
    /* A cache of its own, so that the compile figure is a cold build and
     * a disk-cache hit. */
    char cache[] = "/tmp/cubert-bench-opencl-XXXXXX";
    if (!mkdtemp(cache))
        return 1;
    setenv("CUBERT_CACHE_DIR", cache, 1);

    cube_client *c = NULL;
    CHECK(cube_client_open("opencl", NULL, &c), "open");
    cube_properties props;
    CHECK(cube_client_properties(c, &props), "properties");
    char cpu[256];
    bench_cpu_model(cpu, sizeof cpu);
    printf("host: %s\ndevice: opencl:0 = %s, %s\n\n", cpu, props.name,
           props.architecture);

    /* The first build of a process also starts the compiler: built twice,
     * the second is the figure (POCL_KERNEL_CACHE=0 keeps PoCL from
     * serving it from its own cache). */
    double build_ms = 0;
    cl_program warm = raw_build(&r, &build_ms);
    if (warm)
        r.a->clReleaseProgram(warm);
    cl_program prog = raw_build(&r, &build_ms);
    cl_int e = 0;
    cl_kernel rk = prog ? r.a->clCreateKernel(prog, "empty", &e) : NULL;
    cl_mem ry = r.a->clCreateBuffer(r.ctx, CL_MEM_READ_WRITE, BYTES, NULL, &e);
    if (!rk || !ry) {
        printf("bench_opencl: the raw side failed (%s)\n",
               opencl_error_name(e));
        return 1;
    }
    cube_kernel *empty = NULL;
    cube_kernel_desc ed = {"empty", empty_src, {1, 1, 1}};
    CHECK(cube_kernel_create(&ed, &empty), "kernel");
    cube_handle y;
    CHECK(cube_empty(c, BYTES, &y), "buffer");

    /* Compile: cold (the first launch builds and caches), then a fresh
     * server loading it from the disk cache. */
    cube_arg arg = cube_arg_buffer(y);
    double t0 = now();
    CHECK(cube_launch(c, empty, cube_count_static(1, 1, 1), &arg, 1,
                      CUBE_LAUNCH_EXECUTE),
          "first launch");
    CHECK(cube_sync(c, NULL, 0), "sync");
    double cold_ms = (now() - t0) * 1e3;
    cube_error_free(cube_handle_release(c, y));
    cube_client_close(c);
    CHECK(cube_client_open("opencl", NULL, &c), "reopen");
    CHECK(cube_empty(c, BYTES, &y), "buffer");
    arg = cube_arg_buffer(y);
    t0 = now();
    CHECK(cube_launch(c, empty, cube_count_static(1, 1, 1), &arg, 1,
                      CUBE_LAUNCH_EXECUTE),
          "first launch");
    CHECK(cube_sync(c, NULL, 0), "sync");
    double hit_ms = (now() - t0) * 1e3;

    double *ours = calloc((size_t)rounds, sizeof *ours);
    double *theirs = calloc((size_t)rounds, sizeof *theirs);
    for (int i = 0; i < rounds; i++) {
        theirs[i] = raw_launch_cost(&r, rk, ry);
        ours[i] = launch_cost(c, empty, y);
    }
    double l_ours = median(ours, (size_t)rounds),
           l_raw = median(theirs, (size_t)rounds);

    unsigned char *host = malloc(BYTES);
    memset(host, 7, BYTES);
    cube_copy_desc d = cube_copy_desc_contiguous(y, BYTES, 4);
    const void *src[] = {host};
    void *dst[] = {host};
    uint64_t size[] = {BYTES};
    double w_ours[16] = {0}, w_raw[16] = {0}, r_ours[16] = {0}, r_raw[16] = {0};
    int tr = rounds < 16 ? rounds : 16;
    for (int i = 0; i < tr; i++) {
        t0 = now();
        r.a->clEnqueueWriteBuffer(r.q, ry, CL_TRUE, 0, BYTES, host, 0, NULL,
                                  NULL);
        w_raw[i] = now() - t0;
        t0 = now();
        CHECK(cube_write(c, &d, src, size, 1), "write");
        w_ours[i] = now() - t0;
        t0 = now();
        r.a->clEnqueueReadBuffer(r.q, ry, CL_TRUE, 0, BYTES, host, 0, NULL,
                                 NULL);
        r_raw[i] = now() - t0;
        t0 = now();
        CHECK(cube_read(c, &d, dst, size, 1), "read");
        r_ours[i] = now() - t0;
    }
    double gb = (double)BYTES / 1e9;
    double wo = gb / median(w_ours, (size_t)tr),
           wr = gb / median(w_raw, (size_t)tr);
    double ro = gb / median(r_ours, (size_t)tr),
           rr = gb / median(r_raw, (size_t)tr);

    printf("| figure | cubert | raw OpenCL | ratio |\n|---|---|---|---|\n");
    printf("| launch host time (us, median of %d rounds of %d) | %.2f | %.2f "
           "| %.3f |\n",
           rounds, ENQUEUES, l_ours * 1e6, l_raw * 1e6, l_ours / l_raw);
    printf("| write 64 MiB (GB/s) | %.2f | %.2f | %.3f |\n", wo, wr, wo / wr);
    printf("| read 64 MiB (GB/s) | %.2f | %.2f | %.3f |\n", ro, rr, ro / rr);
    printf("| first launch: cold build (ms) | %.1f | %.1f (clBuildProgram) "
           "| %.3f |\n",
           cold_ms, build_ms, cold_ms / build_ms);
    printf("| first launch: disk-cache hit (ms) | %.2f | %.1f "
           "(clBuildProgram) | %.3f |\n",
           hit_ms, build_ms, hit_ms / build_ms);

    cube_error_free(cube_handle_release(c, y));
    cube_kernel_release(empty);
    cube_client_close(c);

    double ao = axpy_on("opencl", 20), ac = axpy_on("cuda", 20);
    double abytes = 3.0 * AXPY_N * 4 / 1e9;
    if (ao > 0)
        printf("| axpy 16 Mi floats, opencl (GB/s) | %.1f | | |\n",
               abytes / ao);
    if (ao > 0 && ac > 0)
        printf("| axpy 16 Mi floats, cuda (GB/s) | %.1f | | opencl/cuda "
               "%.3f |\n",
               abytes / ac, (abytes / ao) / (abytes / ac));
    free(host);
    free(ours);
    free(theirs);
    char cmd[64];
    snprintf(cmd, sizeof cmd, "rm -rf %s", cache);
    if (system(cmd) != 0)
        return 1;
    return 0;
}
