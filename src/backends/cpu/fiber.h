/* Fibers for the CPU backend: the units of one cube that call cube_sync()
 * run as fibers on one worker thread, switched cooperatively at each
 * barrier, so a cube of 1024 units needs 1024 small stacks, not 1024 threads.
 *
 * Thread safety: a cpu_fibers object belongs to one thread at a time (the
 * worker that owns it). cpu_fibers_yield() may only be called from inside a
 * fiber started by cpu_fibers_run() on the same object.
 */
#ifndef CUBE_CPU_FIBER_H
#define CUBE_CPU_FIBER_H

#include <stddef.h>
#include <stdint.h>

#include "cubert/error.h"

typedef struct cpu_fibers cpu_fibers;

/* The body of fiber `index` of a run. */
typedef void (*cpu_fiber_fn)(void *arg, uint32_t index);

/* A fiber set whose stacks are `stack_bytes` each (rounded up to pages; a
 * guard page below each stack turns an overflow into a fault, not silent
 * corruption). Stacks are created lazily by cpu_fibers_run and kept for
 * reuse. Errors: CUBE_ERR_INVALID_ARGUMENT (out NULL, stack under 16 KiB),
 * CUBE_ERR_OUT_OF_MEMORY. */
cube_error *cpu_fibers_create(size_t stack_bytes, cpu_fibers **out);

/* Frees every stack. Must not be called while a run is in progress. */
void cpu_fibers_destroy(cpu_fibers *fibers);

/* Runs fn(arg, i) for i in [0, n) as n fibers on the calling thread and
 * returns when all have returned. Fiber 0 starts first; each runs until it
 * calls cpu_fibers_yield() or returns, then the next live fiber in index
 * order (wrapping around) runs. When every fiber yields at the same
 * barriers this is exactly a barrier across the n units.
 * Errors: CUBE_ERR_INVALID_ARGUMENT (n == 0, fn NULL, nested run),
 * CUBE_ERR_OUT_OF_MEMORY (stacks could not be mapped; nothing ran). */
cube_error *cpu_fibers_run(cpu_fibers *fibers, uint32_t n, cpu_fiber_fn fn,
                           void *arg);

/* Called by a running fiber: switches to the next live fiber. Returns when
 * every other live fiber has yielded or finished once. A no-op when called
 * outside a run or when only one fiber is live. */
void cpu_fibers_yield(cpu_fibers *fibers);

/* The fiber set running on the calling thread, or NULL outside a run. The
 * kernel's cube_sync() reaches its fibers through this. */
cpu_fibers *cpu_fibers_current(void);

#endif /* CUBE_CPU_FIBER_H */
