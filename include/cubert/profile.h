/* cubert — profiling windows, tracing and dry runs.
 *
 * Profiling: cube_profile_start opens a window on the calling thread's
 * stream and hands back a token; cube_profile_end closes it and reports how
 * long the work issued in the window took and how that was measured:
 *  - CUBE_TIMING_HOST_CLOCK (CPU, null: backends that run work at issue
 *    time): the time spent running the launches, writes, reads and
 *    replays issued on the stream while the window was open, summed. Time
 *    the host spends between those calls does not count: a window in
 *    which no work was issued reports 0, however long it stayed open.
 *  - CUBE_TIMING_DEVICE (CUDA): the device's clock from the window's start
 *    to the end of the last work issued in it, on the stream. Time the
 *    stream sat idle in between, waiting for the host to issue work,
 *    counts.
 * Windows nest and overlap freely: each token is independent.
 * cube_profile_abandon drops a window without measuring it, with no sync
 * and no flush.
 *
 * Tracing: while a trace runs, cubert writes Chrome trace-event JSON
 * (launches with kernel and cube count, kernel compile requests with
 * their outcome, copies, allocations, releases, syncs; one track per
 * stream; ranges, below, on the calling thread's) that Perfetto opens. Setting
 * CUBERT_TRACE to a path starts one at the first cube_client_open.
 *
 * Dry run: between cube_dry_run_begin(client) and the matching
 * cube_dry_run_end(client), every launch the calling thread issues on that
 * client behaves as CUBE_LAUNCH_SKIP: compiled, validated and cached, then
 * dropped (a graph replay runs nothing). Other threads, and the same thread
 * on other clients, are not affected. Scopes nest per thread and client.
 * Buffers the thread makes on the client inside a scope are
 * handed out without memory (a size that can never fit is still refused);
 * they get memory at their first real use — a write, a read or a launch
 * outside a scope — and if that fails, the call and later reads report
 * CUBE_ERR_STORAGE_MAPPING_FAILED for them, with the pool's error as its
 * cause. A sync or a check is no use of that kind: a buffer never backed
 * was never written, so cube_sync has nothing to wait for on it and
 * cube_check nothing to find but the failure store's answer; neither
 * backs it.
 *
 * Thread safety: all functions may be called from any thread.
 */
#ifndef CUBERT_PROFILE_H
#define CUBERT_PROFILE_H

#include <stdint.h>

#include "cubert/client.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef uint64_t cube_profile_token;

typedef struct cube_profile_result {
    double seconds;            /* the window's work, as `method` says */
    cube_timing_method method; /* how it was measured */
    uint64_t launches;         /* launches issued in the window */
} cube_profile_result;

/* Opens a window on the calling thread's stream.
 * Errors: CUBE_ERR_INVALID_ARGUMENT (NULL), CUBE_ERR_GRAPH_STATE (the
 * stream is capturing a graph), CUBE_ERR_OUT_OF_MEMORY,
 * CUBE_ERR_DEVICE_FAULT. */
CUBE_API CUBE_MUST_USE cube_error *cube_profile_start(cube_client *client,
                                                      cube_profile_token *out);

/* Closes the window: waits for the work issued in it, then fills *out.
 * A launch, write or replay that failed on the stream inside the window
 * fails the window's result: CUBE_ERR_PROFILE with that failure as cause
 * (the window is closed either way). Errors: CUBE_ERR_INVALID_ARGUMENT,
 * CUBE_ERR_PROFILE (unknown, already closed, or another stream's token; or
 * a failure inside the window), CUBE_ERR_GRAPH_STATE (the stream is
 * capturing, whatever the token; the window stays open),
 * CUBE_ERR_DEVICE_FAULT. */
CUBE_API CUBE_MUST_USE cube_error *cube_profile_end(cube_client *client,
                                                    cube_profile_token token,
                                                    cube_profile_result *out);

/* Drops the window without measuring it: no sync, no flush. An unknown
 * token is ignored. */
CUBE_API void cube_profile_abandon(cube_client *client,
                                   cube_profile_token token);

/* Starts writing a trace to `path` (created or truncated, mode 0600): a
 * regular file or a character device (/dev/null). A FIFO, a socket or a
 * directory is refused without waiting on it. Errors:
 * CUBE_ERR_INVALID_ARGUMENT (NULL or empty path, or a trace is already
 * running), CUBE_ERR_IO (cannot open, or not a regular file or a character
 * device), CUBE_ERR_OUT_OF_MEMORY. */
CUBE_API CUBE_MUST_USE cube_error *cube_trace_start(const char *path);

/* Finishes the trace file (valid JSON from then on) and stops tracing.
 * Errors: CUBE_ERR_IO (the file could not be completed). Without a running
 * trace it does nothing. */
CUBE_API CUBE_MUST_USE cube_error *cube_trace_stop(void);

/* Ranges: named spans of the calling thread that show in the trace, like
 * NVTX ranges. cube_range_push writes a begin ("B") event named `name` on
 * the calling thread's own track (the track of the stream the thread gets
 * by default, whatever cube_stream_use chose) and cube_range_pop the end
 * ("E") of the thread's innermost open range on `client`. Ranges nest per
 * thread and client, at most CUBE_RANGE_MAX_DEPTH deep. `name` is copied
 * (its first CUBE_RANGE_NAME_MAX - 1 bytes, cut back to a whole UTF-8
 * character) and escaped for JSON; bytes that are not UTF-8 show as
 * U+FFFD.
 *
 * While no trace runs, both do nothing and return NULL (the arguments are
 * still checked): a range pushed then is not remembered, so its pop, should
 * a trace have started in between, is refused as a pop without a push.
 * A pop while no trace runs ends the innermost range left from a trace
 * that has stopped, if any. Ranges still open when the client closes are
 * ended then, and those open when the trace stops are ended in its file,
 * so every begin in a trace file has its end. Ranges of one thread on two
 * clients share the thread's track: pop them in the reverse order of
 * their pushes. Thread safety: any thread; each works on its own ranges.
 */
#define CUBE_RANGE_MAX_DEPTH 64
#define CUBE_RANGE_NAME_MAX 256

/* Opens a range named `name` (copied) on the calling thread's track.
 * Errors: CUBE_ERR_INVALID_ARGUMENT (client or name NULL, or the client is
 * closing), CUBE_ERR_RESOURCE_LIMIT (CUBE_RANGE_MAX_DEPTH ranges of the
 * calling thread are open on the client), CUBE_ERR_OUT_OF_MEMORY. A failed
 * call opens nothing. */
CUBE_API CUBE_MUST_USE cube_error *cube_range_push(cube_client *client,
                                                   const char *name);

/* Ends the calling thread's innermost range on `client`.
 * Errors: CUBE_ERR_INVALID_ARGUMENT (client NULL, the client is closing,
 * or, while a trace runs, no range of the calling thread is open on it);
 * a failed call ends nothing. */
CUBE_API CUBE_MUST_USE cube_error *cube_range_pop(cube_client *client);

/* Enters and leaves a dry-run scope of the calling thread on `client`
 * (see above); scopes nest. A scope left open when the client closes ends
 * with it.
 * Errors (begin): CUBE_ERR_INVALID_ARGUMENT (client NULL),
 * CUBE_ERR_RESOURCE_LIMIT (the thread has scopes open on 8 open clients).
 * Errors (end): CUBE_ERR_INVALID_ARGUMENT (client NULL, or no scope of the
 * calling thread is open on it). */
CUBE_API CUBE_MUST_USE cube_error *cube_dry_run_begin(cube_client *client);
CUBE_API CUBE_MUST_USE cube_error *cube_dry_run_end(cube_client *client);
/* Nonzero while the calling thread has a dry-run scope open on `client`
 * (0 for NULL). */
CUBE_API int cube_dry_run_active(cube_client *client);

#ifdef __cplusplus
}
#endif

#endif /* CUBERT_PROFILE_H */
