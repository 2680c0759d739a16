/* PoCL (OpenCL on the CPU) as a peer of bench_cpu's barrier kernels:
 * OpenCL C versions of section (f)'s tiled SGEMM, shared-memory sum and
 * stencil (same tiling, work-group sizes and local memory), an axpy and a
 * tiny kernel, run through the OpenCL ICD loader on PoCL's CPU device.
 * libOpenCL.so.1 is loaded at run time: the bench builds without OpenCL
 * and prints why PoCL is skipped when it is missing. */
#ifndef CUBE_BENCH_POCL_H
#define CUBE_BENCH_POCL_H

#include <stddef.h>
#include <stdint.h>

typedef struct bench_pocl bench_pocl;

/* The problem of section (f); the host arrays are copied to the device. */
typedef struct bench_pocl_problem {
    const float *a, *b; /* n x n, row-major */
    uint32_t n;         /* a multiple of 16 */
    const float *x;     /* sum_n floats; the stencil reads st_w * st_h */
    size_t sum_n;
    uint32_t sum_groups; /* work-groups of 256 */
    uint32_t st_w, st_h; /* multiples of 32 and 8 */
} bench_pocl_problem;

/* Opens PoCL's CPU device with at most `threads` threads, builds the
 * kernels, creates the buffers and runs every kernel once, so that PoCL's
 * own compilation (at build and at first enqueue) is done before any
 * timed run. NULL with the reason in `why` when OpenCL, PoCL or its CPU
 * device is missing or a step fails. */
bench_pocl *bench_pocl_open(const bench_pocl_problem *p, int threads, char *why,
                            size_t cap);
void bench_pocl_close(bench_pocl *o);

/* "PoCL 3.1 ..., N compute units" */
const char *bench_pocl_name(const bench_pocl *o);
/* The last OpenCL error, after a call below returned nonzero. */
const char *bench_pocl_error(const bench_pocl *o);

/* One enqueue + clFinish, in seconds; 0 or nonzero on an OpenCL error. */
int bench_pocl_sgemm(bench_pocl *o, double *sec);
int bench_pocl_sum(bench_pocl *o, double *sec); /* adds into the total */
int bench_pocl_stencil(bench_pocl *o, double *sec);
/* y = a*x + y over sum_n floats (x is the sum's input; work-groups of
 * 256). */
int bench_pocl_axpy(bench_pocl *o, double *sec);
/* The tiny kernel (1 work-group of 64, y[i] += 1). */
int bench_pocl_tiny(bench_pocl *o, double *sec);

/* Results, read back: c (n x n), the stencil's output (st_w x st_h). */
int bench_pocl_read_c(bench_pocl *o, float *c);
int bench_pocl_read_stencil(bench_pocl *o, float *out);
/* The axpy's y (sum_n floats). */
int bench_pocl_read_y(bench_pocl *o, float *y);
/* Sets the total to 0, runs the sum once and reads the total. */
int bench_pocl_sum_once(bench_pocl *o, float *total);

#endif
