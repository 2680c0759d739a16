/* Hardware graphs through stream capture.
 *
 * A capture runs in thread-local mode, so other threads' driver calls
 * cannot invalidate it. Launches inside it are recorded by the driver, not
 * run; the blocks they touch are noted (cuda_block_before_use) so a replay
 * can order itself after their writers on other streams and mark them
 * written. A capture during which the stream's pools had to take new
 * device memory is rejected at its end: its graph would depend on memory
 * the warm-up did not hold.
 *
 * Locks (docs/threading.md): deferred_lock, then the stream's lock, at
 * the start of a capture; the end takes them one at a time.
 */
#include <stdlib.h>
#include <string.h>

#include "backends/cuda/cuda_internal.h"
#include "base/error.h"

/* Captures this thread began and has not ended, and its capture mode
 * before the first of them. */
static _Thread_local unsigned captures_open;
static _Thread_local int mode_before;

typedef struct cuda_graph {
    CUgraph graph;
    CUgraphExec exec;
    cuda_block **blocks; /* each once */
    size_t count;
    cuda_stream *last; /* the stream of the latest replay */
} cuda_graph;

static uint64_t reserved(mem_manager *m)
{
    cube_memory_usage u;
    mem_usage(m, &u);
    return u.bytes_reserved;
}

cube_error *cuda_begin_capture(cube_server *server, cube_server_stream *stream)
{
    cuda_server *s = (cuda_server *)server;
    cuda_stream *st = NULL;
    cube_error *err = cuda_stream_begin(s, stream, &st);
    if (err)
        return err;
    st->captured_count = 0;
    st->capture_failed = 0;
    st->reserved_at_begin = reserved(st->base->memory);
    /* Other streams waiting on this one during the capture use the record
     * made here (nothing captured runs before a replay). Under the
     * stream's lock, which they take to record its event: they see it
     * recorded before the capture, or capturing, never in between. */
    /* The count of captures changes under deferred_lock, and only when
     * no free is running (a free may synchronize the device, breaking
     * captures); frees count themselves under the same lock and start
     * only while no capture runs. */
    cube_mutex_lock(&s->deferred_lock);
    while (s->frees_running)
        cube_cond_wait(&s->frees_idle, &s->deferred_lock);
    cube_mutex_lock(&st->lock);
    CUresult r = cuda_stream_record_locked(s, st);
    if (r == CUDA_SUCCESS)
        r = s->api->cuStreamBeginCapture(st->cu,
                                         CU_STREAM_CAPTURE_MODE_THREAD_LOCAL);
    if (r == CUDA_SUCCESS) {
        st->capturing = 1;
        atomic_fetch_add(&s->captures, 1);
    }
    cube_mutex_unlock(&st->lock);
    cube_mutex_unlock(&s->deferred_lock);
    if (r != CUDA_SUCCESS)
        return cuda_fail(s, r, CUBE_ERR_GRAPH_STATE, "cuStreamBeginCapture");
    /* The capture is thread-local, so other threads cannot break it; this
     * thread may still work on other streams meanwhile (allocate, copy,
     * wait, end another stream's capture and instantiate its graph),
     * which the thread-local mode would forbid: it goes relaxed while any
     * capture it began is open. Counted, not saved per stream: captures
     * on two streams may end in either order. The capturing stream itself
     * is protected by the client, which refuses reads, writes and syncs
     * on it. */
    if (captures_open++ == 0) {
        mode_before = CU_STREAM_CAPTURE_MODE_RELAXED;
        s->api->cuThreadExchangeStreamCaptureMode(&mode_before);
    }
    return NULL;
}

cube_error *cuda_end_capture(cube_server *server, cube_server_stream *stream,
                             uint64_t *graph)
{
    cuda_server *s = (cuda_server *)server;
    *graph = 0;
    cuda_stream *st = stream->impl;
    cube_error *err = NULL;
    if (!st->capturing)
        err =
            cube_error_new(CUBE_ERR_GRAPH_STATE, "the stream is not capturing");
    if (!err)
        err = cuda_enter(s);
    if (err)
        return err;
    CUgraph g = NULL;
    cube_mutex_lock(&st->lock);
    CUresult r = s->api->cuStreamEndCapture(st->cu, &g);
    st->capturing = 0;
    cube_mutex_unlock(&st->lock);
    /* The thread's mode comes back once its last open capture ended (a
     * capture ended by another thread than began it leaves this one's
     * count alone). */
    if (captures_open && --captures_open == 0)
        s->api->cuThreadExchangeStreamCaptureMode(&mode_before);
    cube_mutex_lock(&s->deferred_lock);
    int last = atomic_fetch_sub(&s->captures, 1) == 1;
    cube_mutex_unlock(&s->deferred_lock);
    if (last)
        cuda_free_deferred(s, 0);
    uint64_t grown = reserved(st->base->memory) - st->reserved_at_begin;
    if (r != CUDA_SUCCESS) {
        err = cuda_fail(s, r, CUBE_ERR_GRAPH_STATE,
                        "the capture was invalidated");
    } else if (reserved(st->base->memory) > st->reserved_at_begin) {
        err = cube_error_new(CUBE_ERR_GRAPH_STATE,
                             "the capture had to take %llu bytes of new "
                             "device memory; run the work once after "
                             "cube_graph_prepare (a warm-up) so the capture "
                             "finds its memory in the pools",
                             (unsigned long long)grown);
    }
    cuda_graph *cg = NULL;
    if (!err) {
        cg = calloc(1, sizeof *cg);
        if (cg && st->captured_count) {
            cg->blocks = malloc(st->captured_count * sizeof *cg->blocks);
            if (!cg->blocks) {
                free(cg);
                cg = NULL;
            }
        }
        if (!cg)
            err = cube_error_new(CUBE_ERR_OUT_OF_MEMORY, "graph");
    }
    if (!err) {
        r = s->api->cuGraphInstantiateWithFlags(&cg->exec, g, 0);
        if (r != CUDA_SUCCESS)
            err = cuda_fail(s, r, CUBE_ERR_GRAPH_STATE,
                            "cuGraphInstantiateWithFlags");
    }
    if (err) {
        if (cg) {
            free(cg->blocks);
            free(cg);
        }
        if (g)
            s->api->cuGraphDestroy(g);
        st->captured_count = 0;
        return err;
    }
    cg->graph = g;
    if (st->captured_count)
        memcpy(cg->blocks, st->captured,
               st->captured_count * sizeof *cg->blocks);
    cg->count = st->captured_count;
    st->captured_count = 0;
    *graph = (uint64_t)(uintptr_t)cg;
    return NULL;
}

cube_error *cuda_replay(cube_server *server, cube_server_stream *stream,
                        uint64_t graph)
{
    cuda_server *s = (cuda_server *)server;
    cuda_graph *cg = (cuda_graph *)(uintptr_t)graph;
    cuda_stream *st = NULL;
    cube_error *err = cuda_stream_begin(s, stream, &st);
    for (size_t i = 0; i < cg->count && !err; i++)
        err = cuda_block_before_use(s, st, cg->blocks[i], 1);
    if (err)
        return err;
    CUresult r = s->api->cuGraphLaunch(cg->exec, st->cu);
    if (r != CUDA_SUCCESS)
        return cuda_fail(s, r, CUBE_ERR_INTERNAL, "cuGraphLaunch");
    cg->last = st;
    uint64_t seq = cuda_stream_next(st);
    int shared = 0;
    /* Every block the graph touches counts as written: the replay is one
     * operation, and inputs are never rewritten by other streams while it
     * may run without their own ordering. */
    for (size_t i = 0; i < cg->count; i++)
        shared |= cuda_block_used(st, cg->blocks[i], seq, 1);
    return shared ? cuda_stream_record(s, st) : NULL;
}

void cuda_graph_destroy(cube_server *server, cube_server_stream *stream,
                        uint64_t graph)
{
    (void)stream;
    cuda_server *s = (cuda_server *)server;
    cuda_graph *cg = (cuda_graph *)(uintptr_t)graph;
    if (!cg)
        return;
    cube_error_ignore(cuda_enter(s),
                      "destroying a graph goes on without its context");
    /* A replay still running reads the graph's buffers: let it finish
     * before the caller unpins them. */
    if (cg->last)
        s->api->cuStreamSynchronize(cg->last->cu);
    s->api->cuGraphExecDestroy(cg->exec);
    s->api->cuGraphDestroy(cg->graph);
    free(cg->blocks);
    free(cg);
}
