/* The CPU backend's worker pool: runs the cubes of a launch across threads.
 *
 * The thread that submits a job works on it too, so a job always makes
 * progress even when every worker is busy with other jobs (other streams):
 * no launch waits on another's cubes, and a kernel using cube_sync() keeps
 * all units of a cube on one thread as fibers, so it cannot deadlock however
 * many jobs are in flight.
 *
 * Thread safety: cpu_workers_run may be called from many threads at once.
 */
#ifndef CUBE_CPU_WORKERS_H
#define CUBE_CPU_WORKERS_H

#include <stdint.h>

#include "backends/cpu/fiber.h"
#include "cubert/error.h"

typedef struct cpu_workers cpu_workers;

/* Per-thread scratch: shared memory of the cube being run and the fibers
 * for cube_sync() kernels. Owned by the thread; freed when it exits. */
typedef struct cpu_thread_local {
    void *shared;
    size_t shared_cap;
    cpu_fibers *fibers;
} cpu_thread_local;

/* The calling thread's scratch (created on first use), or NULL when memory
 * runs out. */
cpu_thread_local *cpu_thread_local_get(void);

/* Runs cubes [begin, end) of a job on the calling thread. Returns an error
 * to fail the job (the remaining cubes still run). */
typedef cube_error *(*cpu_range_fn)(void *ctx, uint32_t begin, uint32_t end,
                                    cpu_thread_local *local);

/* `threads` counts the caller: threads - 1 workers are started.
 * Errors: CUBE_ERR_OUT_OF_MEMORY, CUBE_ERR_IO (thread creation). */
cube_error *cpu_workers_create(uint32_t threads, cpu_workers **out);
void cpu_workers_destroy(cpu_workers *w);
uint32_t cpu_workers_threads(const cpu_workers *w);

/* Runs fn over [0, total) in chunks of `chunk` cubes and returns when all
 * are done, with the first error any chunk returned. */
cube_error *cpu_workers_run(cpu_workers *w, uint32_t total, uint32_t chunk,
                            cpu_range_fn fn, void *ctx);

#endif /* CUBE_CPU_WORKERS_H */
