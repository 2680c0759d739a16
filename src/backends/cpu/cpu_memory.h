/* The CPU backend's memory: aligned host memory behind one memory manager
 * per stream, each built with the layout installed when the stream first
 * allocated (or rebuilt by an install while it is empty).
 *
 * Thread safety: all functions may be called from any thread.
 */
#ifndef CUBE_CPU_MEMORY_H
#define CUBE_CPU_MEMORY_H

#include "memory/memory_manager.h"

typedef struct cpu_memory cpu_memory;

/* Errors: CUBE_ERR_OUT_OF_MEMORY. */
cube_error *cpu_memory_create(const mem_device *dev, cpu_memory **out);
/* Frees every manager and what it holds. */
void cpu_memory_destroy(cpu_memory *mem);

/* The manager of `stream`, created on first use when `create` is nonzero;
 * NULL (and no error) for a stream that never allocated when it is zero.
 * Errors: CUBE_ERR_OUT_OF_MEMORY. */
cube_error *cpu_memory_stream(cpu_memory *mem, cube_stream_id stream,
                              int create, mem_manager **out);

/* Makes `layout` the one new streams get and rebuilds `stream`'s pools.
 * Errors: as mem_install (CUBE_ERR_POOLS_IN_USE keeps the stream's old
 * pools; the layout still applies to new streams). */
cube_error *cpu_memory_install(cpu_memory *mem, cube_stream_id stream,
                               const cube_memory_layout *layout);

/* Sets `stream`'s persistent routing (creating its manager). */
cube_error *cpu_memory_persistent(cpu_memory *mem, cube_stream_id stream,
                                  int persistent);

#endif /* CUBE_CPU_MEMORY_H */
