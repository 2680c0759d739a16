/* PoCL as a peer of bench_cpu's barrier kernels (see bench_pocl.h).
 *
 * The OpenCL C kernels below are section (f)'s cube C kernels written
 * again: the same tiles in __local memory, barrier(CLK_LOCAL_MEM_FENCE)
 * where the cube C calls cube_sync(), the same work-group sizes (fixed
 * with reqd_work_group_size, as a cube's dim is fixed when the JIT
 * compiles it). OpenCL 1.2 has no atomic float add: the sum's one atomic
 * per work-group is a compare-and-swap loop, and `half` (a type in
 * OpenCL C) is spelled `hw`. The programs are built with
 * no options (OpenCL C contracts a*b+c by default, as the JIT's
 * -ffp-contract=fast does). */
#include "bench_pocl.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* The few OpenCL 1.2 types, constants and entry points used here,
 * declared from the Khronos API so that the bench needs no OpenCL headers
 * or library at build time (libOpenCL.so.1, the ICD loader, is opened at
 * run time). */
typedef int32_t cl_int;
typedef uint32_t cl_uint;
typedef uint64_t cl_ulong;
typedef cl_ulong cl_bitfield;
typedef struct _cl_platform_id *cl_platform_id;
typedef struct _cl_device_id *cl_device_id;
typedef struct _cl_context *cl_context;
typedef struct _cl_command_queue *cl_command_queue;
typedef struct _cl_mem *cl_mem;
typedef struct _cl_program *cl_program;
typedef struct _cl_kernel *cl_kernel;
typedef struct _cl_event *cl_event;

#define CL_SUCCESS 0
#define CL_TRUE 1
#define CL_DEVICE_TYPE_CPU ((cl_bitfield)1 << 1)
#define CL_PLATFORM_VERSION 0x0901
#define CL_PLATFORM_NAME 0x0902
#define CL_DEVICE_MAX_COMPUTE_UNITS 0x1002
#define CL_DEVICE_NAME 0x102B
#define CL_PROGRAM_BUILD_LOG 0x1183
#define CL_MEM_READ_WRITE ((cl_bitfield)1 << 0)
#define CL_MEM_READ_ONLY ((cl_bitfield)1 << 2)
#define CL_MEM_COPY_HOST_PTR ((cl_bitfield)1 << 5)

typedef struct cl_api {
    cl_int (*GetPlatformIDs)(cl_uint, cl_platform_id *, cl_uint *);
    cl_int (*GetPlatformInfo)(cl_platform_id, cl_uint, size_t, void *,
                              size_t *);
    cl_int (*GetDeviceIDs)(cl_platform_id, cl_bitfield, cl_uint, cl_device_id *,
                           cl_uint *);
    cl_int (*GetDeviceInfo)(cl_device_id, cl_uint, size_t, void *, size_t *);
    cl_context (*CreateContext)(const intptr_t *, cl_uint, const cl_device_id *,
                                void (*)(const char *, const void *, size_t,
                                         void *),
                                void *, cl_int *);
    cl_command_queue (*CreateCommandQueue)(cl_context, cl_device_id,
                                           cl_bitfield, cl_int *);
    cl_program (*CreateProgramWithSource)(cl_context, cl_uint, const char **,
                                          const size_t *, cl_int *);
    cl_int (*BuildProgram)(cl_program, cl_uint, const cl_device_id *,
                           const char *, void (*)(cl_program, void *), void *);
    cl_int (*GetProgramBuildInfo)(cl_program, cl_device_id, cl_uint, size_t,
                                  void *, size_t *);
    cl_kernel (*CreateKernel)(cl_program, const char *, cl_int *);
    cl_int (*SetKernelArg)(cl_kernel, cl_uint, size_t, const void *);
    cl_mem (*CreateBuffer)(cl_context, cl_bitfield, size_t, void *, cl_int *);
    cl_int (*EnqueueNDRangeKernel)(cl_command_queue, cl_kernel, cl_uint,
                                   const size_t *, const size_t *,
                                   const size_t *, cl_uint, const cl_event *,
                                   cl_event *);
    cl_int (*EnqueueReadBuffer)(cl_command_queue, cl_mem, cl_uint, size_t,
                                size_t, void *, cl_uint, const cl_event *,
                                cl_event *);
    cl_int (*EnqueueWriteBuffer)(cl_command_queue, cl_mem, cl_uint, size_t,
                                 size_t, const void *, cl_uint,
                                 const cl_event *, cl_event *);
    cl_int (*Finish)(cl_command_queue);
    cl_int (*ReleaseMemObject)(cl_mem);
    cl_int (*ReleaseKernel)(cl_kernel);
    cl_int (*ReleaseProgram)(cl_program);
    cl_int (*ReleaseCommandQueue)(cl_command_queue);
    cl_int (*ReleaseContext)(cl_context);
} cl_api;

static const char cl_source[] =
    "#define TILE 16\n"
    "__kernel __attribute__((reqd_work_group_size(TILE, TILE, 1)))\n"
    "void matmul_tiled(__global const float *a, __global const float *b,\n"
    "                  __global float *c, uint n)\n"
    "{\n"
    "    __local float ta[TILE * TILE], tb[TILE * TILE];\n"
    "    uint tx = get_local_id(0), ty = get_local_id(1);\n"
    "    ulong row = get_global_id(1), col = get_global_id(0);\n"
    "    float acc = 0.0f;\n"
    "    for (uint t = 0; t < (n + TILE - 1) / TILE; t++) {\n"
    "        ulong ak = (ulong)t * TILE + tx;\n"
    "        ulong bk = (ulong)t * TILE + ty;\n"
    "        ta[ty * TILE + tx] = (row < n && ak < n) ? a[row * n + ak] : "
    "0.0f;\n"
    "        tb[ty * TILE + tx] = (bk < n && col < n) ? b[bk * n + col] : "
    "0.0f;\n"
    "        barrier(CLK_LOCAL_MEM_FENCE);\n"
    "        for (uint k = 0; k < TILE; k++)\n"
    "            acc += ta[ty * TILE + k] * tb[k * TILE + tx];\n"
    "        barrier(CLK_LOCAL_MEM_FENCE);\n"
    "    }\n"
    "    if (row < n && col < n)\n"
    "        c[row * n + col] = acc;\n"
    "}\n"
    "\n"
    "#define SUM_UNITS 256\n"
    "static void atomic_add_f32(volatile __global float *p, float v)\n"
    "{\n"
    "    volatile __global uint *u = (volatile __global uint *)p;\n"
    "    uint old = *u, seen;\n"
    "    while ((seen = atomic_cmpxchg(u, old, as_uint(as_float(old) + v)))"
    " != old)\n"
    "        old = seen;\n"
    "}\n"
    "__kernel __attribute__((reqd_work_group_size(SUM_UNITS, 1, 1)))\n"
    "void sum_all(__global const float *x, ulong len, __global float *total)\n"
    "{\n"
    "    __local float partial[SUM_UNITS];\n"
    "    uint u = get_local_id(0);\n"
    "    ulong stride = get_global_size(0);\n"
    "    float acc = 0.0f;\n"
    "    for (ulong i = get_global_id(0); i < len; i += stride)\n"
    "        acc += x[i];\n"
    "    partial[u] = acc;\n"
    "    barrier(CLK_LOCAL_MEM_FENCE);\n"
    "    for (uint hw = SUM_UNITS / 2; hw > 0; hw /= 2) {\n"
    "        if (u < hw)\n"
    "            partial[u] += partial[u + hw];\n"
    "        barrier(CLK_LOCAL_MEM_FENCE);\n"
    "    }\n"
    "    if (u == 0)\n"
    "        atomic_add_f32(total, partial[0]);\n"
    "}\n"
    "\n"
    "#define BX 32\n"
    "#define BY 8\n"
    "#define PITCH (BX + 2)\n"
    "#define LOAD(xx, yy) \\\n"
    "    ((xx) >= 0 && (xx) < (long)w && (yy) >= 0 && (yy) < (long)h \\\n"
    "         ? in[(ulong)(yy) * w + (ulong)(xx)] : 0.0f)\n"
    "__kernel __attribute__((reqd_work_group_size(BX, BY, 1)))\n"
    "void stencil_shared(__global const float *in, __global float *out,\n"
    "                    uint w, uint h)\n"
    "{\n"
    "    __local float t[PITCH * (BY + 2)];\n"
    "    int tx = get_local_id(0), ty = get_local_id(1);\n"
    "    long x = get_global_id(0), y = get_global_id(1);\n"
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
    "    barrier(CLK_LOCAL_MEM_FENCE);\n"
    "    float v = 0.5f * t[c] +\n"
    "              0.125f * (t[c - 1] + t[c + 1] + t[c - PITCH] + t[c + "
    "PITCH]);\n"
    "    if (x < w && y < h)\n"
    "        out[(ulong)y * w + (ulong)x] = v;\n"
    "}\n"
    "\n"
    "__kernel __attribute__((reqd_work_group_size(256, 1, 1)))\n"
    "void axpy(float a, __global const float *x, __global float *y, int n)\n"
    "{\n"
    "    int i = (int)get_global_id(0);\n"
    "    if (i < n)\n"
    "        y[i] = a * x[i] + y[i];\n"
    "}\n"
    "\n"
    "__kernel __attribute__((reqd_work_group_size(64, 1, 1)))\n"
    "void tiny(__global float *y)\n"
    "{\n"
    "    y[get_local_id(0)] += 1.0f;\n"
    "}\n";

enum { K_MM, K_SUM, K_ST, K_AXPY, K_TINY, K_COUNT };
static const char *const kernel_names[K_COUNT] = {
    "matmul_tiled", "sum_all", "stencil_shared", "axpy", "tiny"};
enum { B_A, B_B, B_C, B_X, B_TOTAL, B_SOUT, B_Y, B_TINY, B_COUNT };

struct bench_pocl {
    void *lib;
    cl_api cl;
    cl_context ctx;
    cl_command_queue q;
    cl_device_id dev;
    cl_program prog;
    cl_kernel k[K_COUNT];
    cl_mem buf[B_COUNT];
    bench_pocl_problem p;
    char name[256];
    char error[256];
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Records a failed call; returns 1 when `rc` is an error. */
static int cl_failed(bench_pocl *o, cl_int rc, const char *what)
{
    if (rc == CL_SUCCESS)
        return 0;
    snprintf(o->error, sizeof o->error, "%s returned OpenCL error %d", what,
             (int)rc);
    return 1;
}

static int load_api(bench_pocl *o)
{
    o->lib = dlopen("libOpenCL.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!o->lib) {
        snprintf(o->error, sizeof o->error,
                 "libOpenCL.so.1 not found: install pocl-opencl-icd and "
                 "ocl-icd-libopencl1");
        return 1;
    }
#define SYM(field, name)                                                       \
    do {                                                                       \
        *(void **)&o->cl.field = dlsym(o->lib, name);                          \
        if (!o->cl.field) {                                                    \
            snprintf(o->error, sizeof o->error, "libOpenCL.so.1 lacks %s",     \
                     name);                                                    \
            return 1;                                                          \
        }                                                                      \
    } while (0)
    SYM(GetPlatformIDs, "clGetPlatformIDs");
    SYM(GetPlatformInfo, "clGetPlatformInfo");
    SYM(GetDeviceIDs, "clGetDeviceIDs");
    SYM(GetDeviceInfo, "clGetDeviceInfo");
    SYM(CreateContext, "clCreateContext");
    SYM(CreateCommandQueue, "clCreateCommandQueue");
    SYM(CreateProgramWithSource, "clCreateProgramWithSource");
    SYM(BuildProgram, "clBuildProgram");
    SYM(GetProgramBuildInfo, "clGetProgramBuildInfo");
    SYM(CreateKernel, "clCreateKernel");
    SYM(SetKernelArg, "clSetKernelArg");
    SYM(CreateBuffer, "clCreateBuffer");
    SYM(EnqueueNDRangeKernel, "clEnqueueNDRangeKernel");
    SYM(EnqueueReadBuffer, "clEnqueueReadBuffer");
    SYM(EnqueueWriteBuffer, "clEnqueueWriteBuffer");
    SYM(Finish, "clFinish");
    SYM(ReleaseMemObject, "clReleaseMemObject");
    SYM(ReleaseKernel, "clReleaseKernel");
    SYM(ReleaseProgram, "clReleaseProgram");
    SYM(ReleaseCommandQueue, "clReleaseCommandQueue");
    SYM(ReleaseContext, "clReleaseContext");
#undef SYM
    return 0;
}

/* Finds PoCL's platform (by its name) and its CPU device. */
static int find_device(bench_pocl *o)
{
    cl_platform_id plats[16];
    cl_uint np = 0;
    cl_int rc = o->cl.GetPlatformIDs(16, plats, &np);
    if (rc != CL_SUCCESS || np == 0) {
        snprintf(o->error, sizeof o->error,
                 "no OpenCL platform (clGetPlatformIDs: %d); install "
                 "pocl-opencl-icd",
                 (int)rc);
        return 1;
    }
    char seen[128] = "";
    for (cl_uint i = 0; i < np && i < 16; i++) {
        char pname[128] = "", pver[128] = "";
        o->cl.GetPlatformInfo(plats[i], CL_PLATFORM_NAME, sizeof pname, pname,
                              NULL);
        o->cl.GetPlatformInfo(plats[i], CL_PLATFORM_VERSION, sizeof pver, pver,
                              NULL);
        if (!strstr(pname, "Portable Computing Language")) {
            size_t len = strlen(seen);
            snprintf(seen + len, sizeof seen - len, "%s%s", len ? ", " : "",
                     pname);
            continue;
        }
        cl_uint nd = 0;
        if (o->cl.GetDeviceIDs(plats[i], CL_DEVICE_TYPE_CPU, 1, &o->dev, &nd) !=
                CL_SUCCESS ||
            nd == 0) {
            snprintf(o->error, sizeof o->error, "PoCL has no CPU device");
            return 1;
        }
        char dname[128] = "";
        cl_uint cus = 0;
        o->cl.GetDeviceInfo(o->dev, CL_DEVICE_NAME, sizeof dname, dname, NULL);
        o->cl.GetDeviceInfo(o->dev, CL_DEVICE_MAX_COMPUTE_UNITS, sizeof cus,
                            &cus, NULL);
        /* "OpenCL 3.0 PoCL 3.1+debian  Linux, <build options>": keep
         * "PoCL 3.1+debian". */
        const char *v = strstr(pver, "PoCL");
        v = v ? v : pver;
        size_t vlen = strcspn(v, ",");
        if (strstr(v, "  ") && (size_t)(strstr(v, "  ") - v) < vlen)
            vlen = (size_t)(strstr(v, "  ") - v);
        snprintf(o->name, sizeof o->name, "%.*s, %s, %u compute units",
                 (int)vlen, v, dname, (unsigned)cus);
        return 0;
    }
    snprintf(o->error, sizeof o->error, "no PoCL platform (found: %s)",
             seen[0] ? seen : "none");
    return 1;
}

static int build(bench_pocl *o)
{
    cl_int rc;
    o->ctx = o->cl.CreateContext(NULL, 1, &o->dev, NULL, NULL, &rc);
    if (cl_failed(o, rc, "clCreateContext"))
        return 1;
    o->q = o->cl.CreateCommandQueue(o->ctx, o->dev, 0, &rc);
    if (cl_failed(o, rc, "clCreateCommandQueue"))
        return 1;
    const char *src = cl_source;
    o->prog = o->cl.CreateProgramWithSource(o->ctx, 1, &src, NULL, &rc);
    if (cl_failed(o, rc, "clCreateProgramWithSource"))
        return 1;
    rc = o->cl.BuildProgram(o->prog, 1, &o->dev, "", NULL, NULL);
    if (rc != CL_SUCCESS) {
        /* The first error line of the build log. */
        static char log[16384];
        log[0] = '\0';
        o->cl.GetProgramBuildInfo(o->prog, o->dev, CL_PROGRAM_BUILD_LOG,
                                  sizeof log, log, NULL);
        log[sizeof log - 1] = '\0';
        char *line = strstr(log, "error:");
        line = line ? line : log;
        line[strcspn(line, "\n")] = '\0';
        snprintf(o->error, sizeof o->error, "clBuildProgram: %d: %.200s",
                 (int)rc, line);
        if (getenv("BENCH_POCL_LOG"))
            fprintf(stderr, "%s\n", log);
        return 1;
    }
    for (int i = 0; i < K_COUNT; i++) {
        o->k[i] = o->cl.CreateKernel(o->prog, kernel_names[i], &rc);
        if (cl_failed(o, rc, "clCreateKernel"))
            return 1;
    }
    return 0;
}

static cl_mem make_buffer(bench_pocl *o, size_t bytes, const void *init,
                          int read_only, cl_int *rc)
{
    cl_bitfield flags = read_only ? CL_MEM_READ_ONLY : CL_MEM_READ_WRITE;
    if (init)
        flags |= CL_MEM_COPY_HOST_PTR;
    return o->cl.CreateBuffer(o->ctx, flags, bytes, (void *)init, rc);
}

static int make_buffers(bench_pocl *o)
{
    const bench_pocl_problem *p = &o->p;
    const size_t mat = (size_t)p->n * p->n * sizeof(float);
    const size_t st = (size_t)p->st_w * p->st_h * sizeof(float);
    float zero[64] = {0};
    float *y = calloc(p->sum_n, sizeof(float));
    if (!y) {
        snprintf(o->error, sizeof o->error, "out of host memory");
        return 1;
    }
    struct {
        int id;
        size_t bytes;
        const void *init;
        int ro;
    } want[B_COUNT] = {
        {B_A, mat, p->a, 1},
        {B_B, mat, p->b, 1},
        {B_C, mat, NULL, 0},
        {B_X, p->sum_n * sizeof(float), p->x, 1},
        {B_TOTAL, sizeof(float), zero, 0},
        {B_SOUT, st, NULL, 0},
        {B_Y, p->sum_n * sizeof(float), y, 0},
        {B_TINY, sizeof zero, zero, 0},
    };
    int failed = 0;
    for (int i = 0; i < B_COUNT && !failed; i++) {
        cl_int rc;
        o->buf[want[i].id] =
            make_buffer(o, want[i].bytes, want[i].init, want[i].ro, &rc);
        failed = cl_failed(o, rc, "clCreateBuffer");
    }
    free(y);
    return failed;
}

static int set_args(bench_pocl *o)
{
    const bench_pocl_problem *p = &o->p;
    cl_ulong len = p->sum_n;
    float a = 0.5f;
    cl_int n_axpy = (cl_int)p->sum_n;
    cl_api *cl = &o->cl;
    cl_kernel *k = o->k;
    cl_mem *b = o->buf;
    cl_int rc = CL_SUCCESS;
#define ARG(kern, i, size, ptr)                                                \
    if (rc == CL_SUCCESS)                                                      \
    rc = cl->SetKernelArg(k[kern], i, size, ptr)
    ARG(K_MM, 0, sizeof(cl_mem), &b[B_A]);
    ARG(K_MM, 1, sizeof(cl_mem), &b[B_B]);
    ARG(K_MM, 2, sizeof(cl_mem), &b[B_C]);
    ARG(K_MM, 3, sizeof(cl_uint), &p->n);
    ARG(K_SUM, 0, sizeof(cl_mem), &b[B_X]);
    ARG(K_SUM, 1, sizeof(cl_ulong), &len);
    ARG(K_SUM, 2, sizeof(cl_mem), &b[B_TOTAL]);
    /* The stencil reads the first st_w x st_h floats of x. */
    ARG(K_ST, 0, sizeof(cl_mem), &b[B_X]);
    ARG(K_ST, 1, sizeof(cl_mem), &b[B_SOUT]);
    ARG(K_ST, 2, sizeof(cl_uint), &p->st_w);
    ARG(K_ST, 3, sizeof(cl_uint), &p->st_h);
    ARG(K_AXPY, 0, sizeof(float), &a);
    ARG(K_AXPY, 1, sizeof(cl_mem), &b[B_X]);
    ARG(K_AXPY, 2, sizeof(cl_mem), &b[B_Y]);
    ARG(K_AXPY, 3, sizeof(cl_int), &n_axpy);
    ARG(K_TINY, 0, sizeof(cl_mem), &b[B_TINY]);
#undef ARG
    return cl_failed(o, rc, "clSetKernelArg");
}

/* Enqueues kernel `k` over `global` with work-groups of `local`, waits
 * for it; seconds in *sec. */
static int run(bench_pocl *o, int k, size_t gx, size_t gy, size_t lx, size_t ly,
               double *sec)
{
    size_t global[2] = {gx, gy}, local[2] = {lx, ly};
    double t0 = now_s();
    cl_int rc = o->cl.EnqueueNDRangeKernel(o->q, o->k[k], 2, NULL, global,
                                           local, 0, NULL, NULL);
    if (rc == CL_SUCCESS)
        rc = o->cl.Finish(o->q);
    *sec = now_s() - t0;
    return cl_failed(o, rc, kernel_names[k]);
}

int bench_pocl_sgemm(bench_pocl *o, double *sec)
{
    return run(o, K_MM, o->p.n, o->p.n, 16, 16, sec);
}

int bench_pocl_sum(bench_pocl *o, double *sec)
{
    return run(o, K_SUM, (size_t)o->p.sum_groups * 256, 1, 256, 1, sec);
}

int bench_pocl_stencil(bench_pocl *o, double *sec)
{
    return run(o, K_ST, o->p.st_w, o->p.st_h, 32, 8, sec);
}

int bench_pocl_axpy(bench_pocl *o, double *sec)
{
    size_t g = (o->p.sum_n + 255) / 256 * 256;
    return run(o, K_AXPY, g, 1, 256, 1, sec);
}

int bench_pocl_tiny(bench_pocl *o, double *sec)
{
    return run(o, K_TINY, 64, 1, 64, 1, sec);
}

static int read_buf(bench_pocl *o, int b, size_t bytes, void *dst)
{
    return cl_failed(o,
                     o->cl.EnqueueReadBuffer(o->q, o->buf[b], CL_TRUE, 0, bytes,
                                             dst, 0, NULL, NULL),
                     "clEnqueueReadBuffer");
}

int bench_pocl_read_c(bench_pocl *o, float *c)
{
    return read_buf(o, B_C, (size_t)o->p.n * o->p.n * sizeof(float), c);
}

int bench_pocl_read_stencil(bench_pocl *o, float *out)
{
    return read_buf(o, B_SOUT, (size_t)o->p.st_w * o->p.st_h * sizeof(float),
                    out);
}

int bench_pocl_read_y(bench_pocl *o, float *y)
{
    return read_buf(o, B_Y, o->p.sum_n * sizeof(float), y);
}

int bench_pocl_sum_once(bench_pocl *o, float *total)
{
    float zero = 0.0f;
    double t;
    if (cl_failed(o,
                  o->cl.EnqueueWriteBuffer(o->q, o->buf[B_TOTAL], CL_TRUE, 0,
                                           sizeof zero, &zero, 0, NULL, NULL),
                  "clEnqueueWriteBuffer") ||
        bench_pocl_sum(o, &t))
        return 1;
    return read_buf(o, B_TOTAL, sizeof *total, total);
}

bench_pocl *bench_pocl_open(const bench_pocl_problem *p, int threads, char *why,
                            size_t cap)
{
    bench_pocl *o = calloc(1, sizeof *o);
    if (!o) {
        snprintf(why, cap, "out of host memory");
        return NULL;
    }
    o->p = *p;
    /* PoCL's CPU device starts one thread per core unless told: give it
     * the CPU backend's count (POCL_MAX_PTHREAD_COUNT in PoCL 3.x,
     * POCL_CPU_MAX_CU_COUNT in later ones). A value already in the
     * environment wins. */
    char count[16];
    snprintf(count, sizeof count, "%d", threads > 0 ? threads : 1);
    setenv("POCL_MAX_PTHREAD_COUNT", count, 0);
    setenv("POCL_CPU_MAX_CU_COUNT", count, 0);
    double t;
    int failed = load_api(o) || find_device(o) || build(o) || make_buffers(o) ||
                 set_args(o) || bench_pocl_sgemm(o, &t) ||
                 bench_pocl_sum(o, &t) || bench_pocl_stencil(o, &t) ||
                 bench_pocl_axpy(o, &t) || bench_pocl_tiny(o, &t);
    if (failed) {
        snprintf(why, cap, "%s", o->error);
        bench_pocl_close(o);
        return NULL;
    }
    return o;
}

const char *bench_pocl_name(const bench_pocl *o)
{
    return o->name;
}

const char *bench_pocl_error(const bench_pocl *o)
{
    return o->error;
}

void bench_pocl_close(bench_pocl *o)
{
    if (!o)
        return;
    if (o->q)
        o->cl.Finish(o->q);
    for (int i = 0; i < B_COUNT; i++)
        if (o->buf[i])
            o->cl.ReleaseMemObject(o->buf[i]);
    for (int i = 0; i < K_COUNT; i++)
        if (o->k[i])
            o->cl.ReleaseKernel(o->k[i]);
    if (o->prog)
        o->cl.ReleaseProgram(o->prog);
    if (o->q)
        o->cl.ReleaseCommandQueue(o->q);
    if (o->ctx)
        o->cl.ReleaseContext(o->ctx);
    /* libOpenCL stays loaded: PoCL's threads and atexit handlers may
     * still refer to it. */
    free(o);
}
