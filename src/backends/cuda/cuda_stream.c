/* The backend's side of a stream: its CUDA stream and events, the
 * sequence that counts what it submits, its cross-stream event (recorded
 * for other streams, which wait on it), and the barriers, sync and flush
 * (cuda_internal.h describes the ordering scheme). */
#include <stdlib.h>
#include <string.h>

#include "backends/cuda/cuda_internal.h"
#include "base/error.h"
#include "cubert/backend/config.h"
#include "cubert/log.h"
#include "cubert/memory.h"

/* --- open and close --- */

static void stream_free(cuda_server *s, cuda_stream *st)
{
    if (st->cu) {
        s->api->cuStreamSynchronize(st->cu);
        cube_error_ignore(cuda_inflight_reap(s, st, 1),
                          "a closing stream has no call left to answer a "
                          "transfer's failure");
    }
    if (st->count_host.address)
        mem_free(s->pinned, &st->count_host);
    /* The stream's manager is gone (the client destroys every manager
     * before any stream): what waited for other streams' uses went with
     * its pages (block records go with the server's slabs). */
    st->pending_count = 0;
    cube_mutex_destroy(&st->pending_lock);
    free(st->pending);
    if (st->event)
        s->api->cuEventDestroy(st->event);
    if (st->done)
        s->api->cuEventDestroy(st->done);
    if (st->cu)
        s->api->cuStreamDestroy(st->cu);
    cube_mutex_destroy(&st->lock);
    free(st->waited);
    free(st->inflight);
    free(st->captured);
    free(st);
}

cube_error *cuda_stream_open(cube_server *server, cube_server_stream *stream,
                             cube_storage_ops *storage)
{
    cuda_server *s = (cuda_server *)server;
    cube_error *err = cuda_enter(s);
    if (err)
        return err;
    cuda_stream *st = calloc(1, sizeof *st);
    if (!st)
        return cube_error_new(CUBE_ERR_OUT_OF_MEMORY, "cuda stream");
    st->server = s;
    st->base = stream;
    st->index = stream->index;
    cube_mutex_init(&st->lock);
    cube_mutex_init(&st->pending_lock);
    const cuda_api *a = s->api;
    CUresult r = a->cuStreamCreate(&st->cu, CU_STREAM_NON_BLOCKING);
    if (r == CUDA_SUCCESS)
        r = a->cuEventCreate(&st->event, CU_EVENT_DISABLE_TIMING);
    if (r == CUDA_SUCCESS)
        r = a->cuEventCreate(&st->done, CU_EVENT_DISABLE_TIMING);
    if (r != CUDA_SUCCESS) {
        err = cuda_fail(s, r, CUBE_ERR_INTERNAL, "cannot create a CUDA stream");
        stream_free(s, st);
        return err;
    }
    storage->self = st;
    storage->alloc = cuda_device_alloc;
    storage->free = cuda_device_free;
    if (s->vm_granularity) {
        storage->granularity = s->vm_granularity;
        storage->reserve = cuda_vm_reserve;
        storage->map = cuda_vm_map;
        storage->unmap = cuda_vm_unmap;
        storage->release = cuda_vm_release;
    }
    storage->preset = cuda_memory_preset(s);
    stream->impl = st;
    return NULL;
}

uint32_t cuda_memory_preset(const cuda_server *s)
{
    cube_config_value v;
    int set = cube_config_lookup("cuda_memory_preset", &v) == 0 &&
              v.origin != CUBE_CONFIG_UNSET;
    uint32_t preset = set ? v.number : CUBE_PRESET_EXPANDABLE;
    /* Expandable pools need virtual memory management: without it the
     * streams start as every other device's do. */
    if (preset == CUBE_PRESET_EXPANDABLE && !s->vm_granularity)
        preset = CUBE_PRESET_SUBSLICES;
    return preset;
}

void cuda_stream_close(cube_server *server, cube_server_stream *stream)
{
    cuda_server *s = (cuda_server *)server;
    cuda_stream *st = stream->impl;
    if (!st)
        return;
    cube_error_ignore(cuda_enter(s),
                      "closing a stream goes on without its context");
    /* Memory given back while a capture was open still names its stream:
     * the first close frees all of it, while every stream exists. */
    atomic_store(&s->captures, 0);
    cuda_free_deferred(s, 1);
    stream_free(s, st);
    stream->impl = NULL;
}

/* --- the cross-stream event --- */

CUresult cuda_stream_record_locked(cuda_server *s, cuda_stream *st)
{
    /* Read before recording: every operation counted by then was submitted
     * before it was counted, so the record covers it. */
    uint64_t seq = atomic_load(&st->seq);
    if (st->event_seq >= seq)
        return CUDA_SUCCESS;
    CUresult r = s->api->cuEventRecord(st->event, st->cu);
    if (r == CUDA_SUCCESS)
        st->event_seq = seq;
    return r;
}

cube_error *cuda_stream_record(cuda_server *s, cuda_stream *st)
{
    cube_mutex_lock(&st->lock);
    CUresult r = cuda_stream_record_locked(s, st);
    cube_mutex_unlock(&st->lock);
    return r ? cuda_fail(s, r, CUBE_ERR_INTERNAL, "cuEventRecord") : NULL;
}

/* Makes `cu` wait for `other` up to `seq`; returns the sequence the wait
 * covers (0 when nothing was needed). */
static cube_error *wait_on(cuda_server *s, CUstream cu, cuda_stream *other,
                           uint64_t seq, uint64_t *covered)
{
    CUresult r = CUDA_SUCCESS;
    cube_mutex_lock(&other->lock);
    if (other->event_seq < seq && !other->capturing)
        r = cuda_stream_record_locked(s, other);
    /* A capturing stream had its event recorded when the capture began,
     * and nothing captured has run: that record covers what there is. */
    if (r == CUDA_SUCCESS)
        r = s->api->cuStreamWaitEvent(cu, other->event, 0);
    *covered = other->event_seq;
    cube_mutex_unlock(&other->lock);
    if (cube_log_enabled(CUBE_LOG_TRACE))
        cube_log_write(CUBE_LOG_TRACE, "cuda",
                       "a stream waits for stream 0x%016llx up to operation "
                       "%llu (its event covers %llu)",
                       (unsigned long long)other->base->id,
                       (unsigned long long)seq, (unsigned long long)*covered);
    return r ? cuda_fail(s, r, CUBE_ERR_INTERNAL,
                         "ordering after stream 0x%016llx",
                         (unsigned long long)other->base->id)
             : NULL;
}

cube_error *cuda_stream_wait_for(cuda_server *s, cuda_stream *st,
                                 uint32_t index, uint64_t seq)
{
    if (index == st->index || seq == 0)
        return NULL;
    if (index >= st->waited_cap) {
        uint32_t cap = st->waited_cap ? st->waited_cap : 8;
        while (cap <= index)
            cap *= 2;
        uint64_t *grown = realloc(st->waited, cap * sizeof *grown);
        if (!grown)
            return cube_error_new(CUBE_ERR_OUT_OF_MEMORY, "stream ordering");
        memset(grown + st->waited_cap, 0,
               (cap - st->waited_cap) * sizeof *grown);
        st->waited = grown;
        st->waited_cap = cap;
    }
    if (st->waited[index] >= seq)
        return NULL;
    if (st->capturing)
        return NULL; /* the capture began after waiting for everything */
    uint64_t covered = 0;
    cube_error *err =
        wait_on(s, st->cu, cuda_stream_at(s, index), seq, &covered);
    if (!err && covered > st->waited[index])
        st->waited[index] = covered;
    return err;
}

/* --- barriers --- */

cube_error *cuda_sync(cube_server *server, cube_server_stream *stream,
                      const cube_binding *bindings, size_t n)
{
    cuda_server *s = (cuda_server *)server;
    cuda_stream *st = stream->impl;
    cube_error *err = cuda_enter(s);
    for (size_t i = 0; i < n && !err; i++) {
        cuda_block *blk = bindings[i].storage->cookie;
        uint64_t w = atomic_load(&blk->writer);
        if (w && CUDA_TAG_INDEX(w) != st->index)
            err =
                cuda_stream_wait_for(s, st, CUDA_TAG_INDEX(w), CUDA_TAG_SEQ(w));
    }
    if (err)
        return err;
    CUresult r = s->api->cuStreamSynchronize(st->cu);
    if (r != CUDA_SUCCESS)
        return cuda_fail(s, r, CUBE_ERR_INTERNAL, "cuStreamSynchronize");
    cuda_pending_reap(s, st, 0);
    return cuda_inflight_reap(s, st, 0);
}

cube_error *cuda_flush(cube_server *server, cube_server_stream *stream)
{
    /* The driver submits work as it is enqueued; what is left to report is
     * a broken context. */
    cuda_server *s = (cuda_server *)server;
    cuda_stream *st = stream->impl;
    cube_error *err = cuda_enter(s);
    if (err)
        return err;
    CUresult r = s->api->cuEventQuery(st->done);
    if (r != CUDA_SUCCESS && r != CUDA_ERROR_NOT_READY &&
        cuda_result_is_fault(r))
        return cuda_fail(s, r, CUBE_ERR_INTERNAL, "flush");
    return NULL;
}
