/* Helpers shared by the CUDA benchmark programs (bench_cuda,
 * graph_replay_driver): checked driver and NVRTC calls that exit with a
 * message, host allocation, a monotonic clock, CUDA C compiled by NVRTC to
 * CUBIN for the device, and the process's thread count. Header-only
 * (static functions): each benchmark is one program. Define BENCH_PROGRAM
 * (the program's name, for messages) before including it. */
#ifndef CUBE_CUDA_BENCH_UTIL_H
#define CUBE_CUDA_BENCH_UTIL_H

#include <cuda.h>
#include <nvrtc.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#ifndef BENCH_PROGRAM
#error "define BENCH_PROGRAM before including cuda_bench_util.h"
#endif

static void cu_check(CUresult r, const char *call, int line)
{
    if (r == CUDA_SUCCESS)
        return;
    const char *name = NULL, *text = NULL;
    cuGetErrorName(r, &name);
    cuGetErrorString(r, &text);
    fprintf(stderr, BENCH_PROGRAM ": line %d: %s failed: %s (%s)\n", line, call,
            name ? name : "unknown error", text ? text : "no description");
    exit(1);
}
#define CK(call) cu_check((call), #call, __LINE__)

static void nvrtc_check(nvrtcResult r, const char *call, int line)
{
    if (r == NVRTC_SUCCESS)
        return;
    fprintf(stderr, BENCH_PROGRAM ": line %d: %s failed: %s\n", line, call,
            nvrtcGetErrorString(r));
    exit(1);
}
#define NV(call) nvrtc_check((call), #call, __LINE__)

static void die(const char *what)
{
    fprintf(stderr, BENCH_PROGRAM ": %s\n", what);
    exit(1);
}

static void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p)
        die("out of host memory");
    return p;
}

static double now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e9 + (double)t.tv_nsec;
}

/* Compiles CUDA C to CUBIN for compute capability major.minor with NVRTC
 * and loads it into the current context. */
static CUmodule nvrtc_module(const char *source, int major, int minor)
{
    nvrtcProgram prog;
    NV(nvrtcCreateProgram(&prog, source, BENCH_PROGRAM ".cu", 0, NULL, NULL));
    char arch[48];
    snprintf(arch, sizeof arch, "--gpu-architecture=sm_%d%d", major, minor);
    const char *opts[] = {arch};
    nvrtcResult r = nvrtcCompileProgram(prog, 1, opts);
    if (r != NVRTC_SUCCESS) {
        size_t n = 0;
        nvrtcGetProgramLogSize(prog, &n);
        char *log = xmalloc(n + 1);
        log[0] = '\0';
        nvrtcGetProgramLog(prog, log);
        fprintf(stderr, BENCH_PROGRAM ": NVRTC (%s): %s\n%s\n", arch,
                nvrtcGetErrorString(r), log);
        exit(1);
    }
    size_t size = 0;
    NV(nvrtcGetCUBINSize(prog, &size));
    char *cubin = xmalloc(size);
    NV(nvrtcGetCUBIN(prog, cubin));
    NV(nvrtcDestroyProgram(&prog));
    CUmodule module;
    CK(cuModuleLoadData(&module, cubin));
    free(cubin);
    return module;
}

/* The number of threads of this process (from /proc/self/status), or -1. */
static int process_threads(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    if (!f)
        return -1;
    char line[256];
    int n = -1;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "Threads: %d", &n) == 1)
            break;
    fclose(f);
    return n;
}

#endif /* CUBE_CUDA_BENCH_UTIL_H */
