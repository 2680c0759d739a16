/* The CPU backend's barrier pass: rewrites the body of a cube C kernel
 * that calls cube_sync() into loops over the units of a cube, split at the
 * barriers (x innermost, the cube dimension compiled in as constants), so
 * that a cube runs as plain loops the C compiler can vectorize instead of
 * one fiber per unit with a context switch per barrier.
 *
 * It accepts a structured subset (docs/kernels.md, "How the CPU backend
 * runs a kernel"): barriers as whole statements, in the body itself or
 * under if/for/while/do whose conditions are uniform across the cube.
 * Anything else is refused with a reason, and the kernel runs on fibers.
 * The body is parsed with libclang (cpu_libclang.h); the output is C text
 * for the same compiler as every kernel.
 *
 * Thread safety: any number of calls may run at once. */
#ifndef CUBE_CPU_BARRIER_PASS_H
#define CUBE_CPU_BARRIER_PASS_H

#include <stddef.h>

/* The pass's version, part of the disk cache's key of its output: bump it
 * whenever the text the pass writes for a kernel changes. */
#define CPU_BARRIER_PASS_VERSION 4

typedef enum cpu_barrier_pass_status {
    CPU_BARRIER_PASS_DONE = 0,    /* *out holds the text to append */
    CPU_BARRIER_PASS_REFUSED = 1, /* why[] says why: run the units as fibers */
    CPU_BARRIER_PASS_NO_MEMORY = 2
} cpu_barrier_pass_status;

/* `source` is the whole translation unit the kernel is compiled as (the
 * preludes, then the user's text); `name` the kernel's entry; `dim` its
 * cube dimension. On CPU_BARRIER_PASS_DONE, *out (free it) is C text to append
 * to `source`: it defines cube__cubes_<name>(launch, begin, end, shared),
 * which runs whole cubes [begin, end), and cube__cubes_dim_<name>[3].
 * Otherwise *out is NULL and why (size why_len) says why, in a few words. */
cpu_barrier_pass_status cpu_barrier_pass_transform(const char *source,
                                                   const char *name,
                                                   const unsigned dim[3],
                                                   char **out, char *why,
                                                   size_t why_len);

#endif /* CUBE_CPU_BARRIER_PASS_H */
