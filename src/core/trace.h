/* Tracing: Chrome trace-event JSON (opens in Perfetto and chrome://tracing).
 *
 * The core calls these hooks around launches, copies, allocations,
 * releases and syncs; they cost one atomic load when tracing is off. Events
 * carry the stream as their thread, so each stream is one track.
 *
 * Thread safety: every function may be called from any thread.
 */
#ifndef CUBE_CORE_TRACE_H
#define CUBE_CORE_TRACE_H

#include <stdint.h>

#include "cubert/client.h"

/* Nanoseconds on the monotonic clock (the trace's time base). */
uint64_t core_clock_ns(void);

/* Nonzero while a trace is being written. */
int core_trace_on(void);

/* A span [start_ns, end_ns) named `name` in category `cat` on `stream`.
 * `args_json` is NULL or the text of a JSON object ("{\"bytes\":16}"),
 * copied. */
void core_trace_span(const char *cat, const char *name, cube_stream_id stream,
                     uint64_t start_ns, uint64_t end_ns, const char *args_json);

/* A point event at `at_ns`. */
void core_trace_instant(const char *cat, const char *name,
                        cube_stream_id stream, uint64_t at_ns,
                        const char *args_json);

/* A counter sample ("C" event) named `name` on `stream`'s lane, stamped
 * with the clock when it is written, so that each lane's counter samples
 * appear in time order. `args_json`: an object of numbers, one series
 * each ("{\"reserved\":4096,\"live\":64}"), copied. */
void core_trace_counter(const char *name, cube_stream_id stream,
                        const char *args_json);

/* A range's begin ("B", `begin` nonzero) or end ("E") on `lane`, named
 * `name` (escaped, copied), stamped with the clock when it is written so
 * that each lane's ranges are in time order. An end on a lane with no
 * range open in the running trace is dropped (its begin went to an earlier
 * trace); ranges still open when the trace stops are ended then, so every
 * begin in a file has its end. */
void core_trace_range(int begin, const char *name, cube_stream_id lane);

/* Starts tracing to $CUBERT_TRACE if it is set and no trace is running;
 * called once by the first cube_client_open. A failure is logged, not
 * returned. */
void core_trace_from_env(void);

#endif /* CUBE_CORE_TRACE_H */
