/* Copies between devices' buffers (cube_copy_peer, the copy_to_peer
 * slot), ordered on the calling streams like a launch: after the last
 * writers of what it reads and the other streams' uses of what it
 * writes, and marked as a use of both. Peer access between two contexts
 * is enabled the first time one copies from the other (unless
 * cuda_peer_access is off); without it the driver stages the copy.
 *
 * Locks: none of its own; the core holds the calling streams.
 */
#include <stdatomic.h>

#include "backends/cuda/cuda_internal.h"
#include "cubert/backend/config.h"
#include "cubert/log.h"

/* Lets `dst`'s context reach `src`'s memory directly, once per pair;
 * without peer access the driver stages the copy itself. */
static void enable_peer_access(cuda_server *dst, cuda_server *src)
{
    int ordinal = src->ordinal;
    if (ordinal < 0 || ordinal >= CUDA_MAX_PEERS)
        return;
    if (atomic_exchange(&dst->peer_tried[ordinal], 1))
        return;
    cube_config_value off;
    if (cube_config_lookup("cuda_peer_access", &off) == 0 &&
        off.origin != CUBE_CONFIG_UNSET && off.number == 0) {
        cube_log_write(CUBE_LOG_INFO, "cuda",
                       "peer access from device %d to %d left off "
                       "(CUBERT_CUDA_PEER_ACCESS=0)",
                       dst->ordinal, src->ordinal);
        return;
    }
    int can = 0;
    const cuda_api *a = dst->api;
    if (a->cuDeviceCanAccessPeer(&can, dst->device, src->device) !=
            CUDA_SUCCESS ||
        !can) {
        cube_log_write(CUBE_LOG_INFO, "cuda",
                       "no peer access from device %d to %d: copies between "
                       "them go through the host",
                       dst->ordinal, src->ordinal);
        return;
    }
    CUresult r = a->cuCtxEnablePeerAccess(src->ctx, 0);
    if (r != CUDA_SUCCESS && r != CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED)
        cube_log_write(CUBE_LOG_WARN, "cuda",
                       "cannot enable peer access from device %d to %d: %s",
                       dst->ordinal, src->ordinal, cuda_result_text(a, r));
}

/* Marks the copy just enqueued on `st` as a read of `src` and a write of
 * `dst` (both blocks of st's server). */
static cube_error *note_copy(cuda_server *s, cuda_stream *st, cuda_block *src,
                             cuda_block *dst)
{
    uint64_t seq = cuda_stream_next(st);
    int shared = 0;
    if (src)
        shared |= cuda_block_used(st, src, seq, 0);
    if (dst)
        shared |= cuda_block_used(st, dst, seq, 1);
    return shared ? cuda_stream_record(s, st) : NULL;
}

/* Both buffers on one device: one device-to-device copy on the
 * destination's stream. */
static cube_error *copy_on_device(cuda_server *s, cube_server_stream *stream,
                                  const cube_binding *src,
                                  const cube_binding *dst)
{
    cuda_stream *st = NULL;
    cube_error *err = cuda_stream_begin(s, stream, &st);
    if (!err)
        err = cuda_block_before_use(s, st, src->storage->cookie, 0);
    if (!err)
        err = cuda_block_before_use(s, st, dst->storage->cookie, 1);
    if (err)
        return err;
    CUresult r = s->api->cuMemcpyDtoDAsync(dst->storage->address + dst->offset,
                                           src->storage->address + src->offset,
                                           dst->size, st->cu);
    if (r != CUDA_SUCCESS)
        return cuda_fail(s, r, CUBE_ERR_INTERNAL, "cuMemcpyDtoDAsync");
    return note_copy(s, st, src->storage->cookie, dst->storage->cookie);
}

cube_error *cuda_copy_to_peer(cube_server *server, cube_server_stream *stream,
                              const cube_binding *src, cube_server *peer,
                              cube_server_stream *peer_stream,
                              const cube_binding *dst)
{
    cuda_server *a = (cuda_server *)server, *b = (cuda_server *)peer;
    if (a == b)
        return copy_on_device(a, peer_stream, src, dst);
    /* The source's side: after its last writer, an event the copy waits
     * for. */
    cuda_stream *sa = NULL, *sb = NULL;
    CUevent ready = NULL, done = NULL;
    cube_error *err = cuda_stream_begin(a, stream, &sa);
    if (!err)
        err = cuda_block_before_use(a, sa, src->storage->cookie, 0);
    if (!err)
        err = cuda_event_get(a, &ready);
    if (!err) {
        CUresult r = a->api->cuEventRecord(ready, sa->cu);
        if (r != CUDA_SUCCESS)
            err = cuda_fail(a, r, CUBE_ERR_INTERNAL, "cuEventRecord");
    }
    /* The destination's side: the copy, after the destination's other
     * uses and the source's event. */
    if (!err)
        err = cuda_stream_begin(b, peer_stream, &sb);
    if (!err)
        err = cuda_block_before_use(b, sb, dst->storage->cookie, 1);
    if (!err) {
        enable_peer_access(b, a);
        CUresult r = b->api->cuStreamWaitEvent(sb->cu, ready, 0);
        if (r == CUDA_SUCCESS)
            r = b->api->cuMemcpyPeerAsync(
                dst->storage->address + dst->offset, b->ctx,
                src->storage->address + src->offset, a->ctx, dst->size, sb->cu);
        if (r != CUDA_SUCCESS)
            err = cuda_fail(b, r, CUBE_ERR_INTERNAL, "cuMemcpyPeerAsync");
    }
    if (!err)
        err = note_copy(b, sb, NULL, dst->storage->cookie);
    /* Back on the source's stream: later writers of the source there wait
     * for the copy. */
    if (!err)
        err = cuda_event_get(b, &done);
    if (!err) {
        CUresult r = b->api->cuEventRecord(done, sb->cu);
        if (r == CUDA_SUCCESS) {
            err = cuda_enter(a);
            if (!err)
                r = a->api->cuStreamWaitEvent(sa->cu, done, 0);
        }
        if (!err && r != CUDA_SUCCESS)
            err = cuda_fail(a, r, CUBE_ERR_INTERNAL, "cuStreamWaitEvent");
    }
    if (!err)
        err = note_copy(a, sa, src->storage->cookie, NULL);
    /* An event may go back to its pool once the waits are enqueued: a
     * wait takes the record it sees when it is made. */
    if (ready)
        cuda_event_put(a, ready);
    if (done)
        cuda_event_put(b, done);
    return err;
}
