/* The memory trace (CUBERT_MEMORY_TRACE): every buffer allocation and
 * release of the process, one line each, in the format bench_memory
 * replays (bench/traces/gen_training_trace.py describes it):
 *
 *   # a header line
 *   a <id> <bytes>   a buffer of <bytes> bytes got memory; ids from 1
 *   f <id>           its memory went back to the device's pools
 *
 * Started by the first cube_client_open when the setting names a file.
 * Thread safety: every function may be called from any thread; one lock
 * guards the buffered writer. A failed write logs one warning and stops
 * the recording; it never fails the caller.
 */
#ifndef CUBE_CORE_MEMORY_TRACE_H
#define CUBE_CORE_MEMORY_TRACE_H

#include <stdint.h>

/* Opens the file the memory_trace setting names, once per process (the
 * first client open calls it). */
void core_memory_trace_from_env(void);

/* Records an allocation of `bytes`; returns its id, or 0 when nothing
 * records (pass the id to core_memory_trace_free). */
uint64_t core_memory_trace_alloc(uint64_t bytes);

/* Records the release of allocation `id` (0: nothing). */
void core_memory_trace_free(uint64_t id);

/* Writes what is buffered (at client close and at exit). */
void core_memory_trace_flush(void);

#endif /* CUBE_CORE_MEMORY_TRACE_H */
