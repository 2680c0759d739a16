/* cubert — graphs: record a sequence of launches once, replay it cheaply.
 *
 * The lifecycle, per stream (the calling thread's):
 *   cube_graph_prepare  arms the stream for a capture;
 *   (warm up: run the sequence once, so its buffers exist)
 *   cube_graph_begin    from here launches are recorded, not run;
 *   cube_graph_end      stops recording and returns the graph's id;
 *   cube_graph_replay   re-runs the recorded launches against the same
 *                       buffers, on the calling stream, as often as wanted;
 *   cube_graph_destroy  releases the graph and the buffers it pinned.
 *
 * A recorded launch is fully resolved: compiled kernel, buffers, scalars,
 * cube count. Replay skips the launch path (no cache lookup, no validation,
 * no argument packing). A graph keeps every buffer it records alive until
 * it is destroyed; change their contents between replays with cube_write.
 * Backends without hardware graphs (the CPU) record a software graph in
 * the client; its replay stays linear in the number of launches.
 *
 * Inside a capture window a read, a write (cube_create writes), a sync, a
 * profile or a replay on that stream is refused with CUBE_ERR_GRAPH_STATE
 * (it cannot be recorded, and running it would break the sequence); for
 * cube_read_async the refusal comes from cube_future_wait. Malformed
 * arguments are answered first, as anywhere (a released or foreign handle
 * is CUBE_ERR_NOT_FOUND, a descriptor past its range
 * CUBE_ERR_INVALID_ARGUMENT); then the refusal comes before any answer
 * about the state of the call's buffers, graph or token: a read of a
 * buffer that carries a failure, a replay of an unknown graph, the end of
 * an unknown profiling window are all CUBE_ERR_GRAPH_STATE in the window,
 * and nothing changes state. Allocating with
 * cube_empty is allowed; the graph pins every buffer a recorded launch
 * names. Launches that fail validation inside the window are returned as
 * usual and not recorded.
 *
 * Collectives: a software capture (the CPU backend) records the
 * collectives of communicators made by cube_comm_init_all when every
 * rank's stream captures them (cubert/comm.h, Graphs). Such a graph's
 * replay waits for the other ranks' replays at each collective, so each
 * rank replays on a thread of its own; a replay that fails stops and its
 * remaining collectives are refused on every rank. Destroy the graph
 * before its communicator.
 *
 * Failures: a replay checks the graph's inputs first; an input that carries
 * a failure, or a launch that fails while replaying, stops the replay and
 * records the error on every buffer the graph writes, so reads of them fail
 * until a replay lands.
 *
 * Thread safety: all calls may be made from any thread; capture state is
 * per stream, so two threads on two streams may capture at once. A graph
 * may be replayed from several threads; cube_graph_destroy frees it only
 * after replays in progress have finished.
 */
#ifndef CUBERT_GRAPH_H
#define CUBERT_GRAPH_H

#include <stdint.h>

#include "cubert/client.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef uint64_t cube_graph_id;

/* Arms the calling stream for a capture. Calling it again before the
 * capture is harmless. Errors: CUBE_ERR_INVALID_ARGUMENT (client NULL),
 * CUBE_ERR_GRAPH_STATE (the stream is capturing), CUBE_ERR_DEVICE_FAULT. */
CUBE_API CUBE_MUST_USE cube_error *cube_graph_prepare(cube_client *client);

/* Starts recording. Errors: CUBE_ERR_INVALID_ARGUMENT,
 * CUBE_ERR_GRAPH_STATE (not prepared, or already capturing),
 * CUBE_ERR_OUT_OF_MEMORY, CUBE_ERR_DEVICE_FAULT. */
CUBE_API CUBE_MUST_USE cube_error *cube_graph_begin(cube_client *client);

/* Stops recording and stores the graph; *out receives its id (never 0).
 * The stream is no longer prepared: prepare again for the next capture.
 * Errors: CUBE_ERR_INVALID_ARGUMENT, CUBE_ERR_GRAPH_STATE (not capturing),
 * CUBE_ERR_OUT_OF_MEMORY (the capture is dropped). */
CUBE_API CUBE_MUST_USE cube_error *cube_graph_end(cube_client *client,
                                                  cube_graph_id *out);

/* Replays the graph on the calling stream. What it reports is the enqueue:
 * a replay from a capturing stream (CUBE_ERR_GRAPH_STATE, whatever the
 * id), an id that names no graph (CUBE_ERR_NOT_FOUND: never handed out by
 * cube_graph_end, or destroyed), or a failure as described above (which
 * is also recorded on the graph's outputs). Inside a dry-run scope a
 * replay of a live graph does nothing. Errors: CUBE_ERR_INVALID_ARGUMENT,
 * CUBE_ERR_GRAPH_STATE, CUBE_ERR_NOT_FOUND, CUBE_ERR_SEVERAL (an input
 * cannot be trusted), the error of a failed launch, CUBE_ERR_DEVICE_FAULT;
 * for a recorded collective what a call answers (cubert/comm.h):
 * CUBE_ERR_TIMEOUT (a rank did not replay), CUBE_ERR_INVALID_ARGUMENT
 * (the ranks' graphs differ, or a peer's replay failed before it),
 * CUBE_ERR_SEVERAL, CUBE_ERR_ABORTED, CUBE_ERR_GRAPH_STATE (a peer's
 * stream is capturing), CUBE_ERR_NOT_FOUND (this rank's communicator was
 * destroyed). */
CUBE_API CUBE_MUST_USE cube_error *cube_graph_replay(cube_client *client,
                                                     cube_graph_id graph);

/* Destroys the graph once no replay of it runs, and unpins its buffers.
 * An id that names no graph (never handed out, or already destroyed)
 * changes nothing and is CUBE_ERR_NOT_FOUND, as for cube_graph_replay.
 * Errors: CUBE_ERR_INVALID_ARGUMENT (client NULL), CUBE_ERR_NOT_FOUND. */
CUBE_API CUBE_MUST_USE cube_error *cube_graph_destroy(cube_client *client,
                                                      cube_graph_id graph);

#ifdef __cplusplus
}
#endif

#endif /* CUBERT_GRAPH_H */
