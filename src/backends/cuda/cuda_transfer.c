/* Transfers on CUDA: pageable host memory moved through a pipeline of
 * pinned chunks (packed by the copy helpers while the copy engine moves
 * the previous chunk), pitched 2-D copies for strided layouts, reads whose
 * wait is on the caller's side. The latest read gets its completion event
 * only when more work follows it (the open read): cuda_stream_begin, the
 * preamble of every call that enqueues work, gives it one.
 *
 * Locks (docs/threading.md): the stream's lock, then events_lock (an
 * open read gets its event).
 */
#include <stdlib.h>
#include <string.h>

#include "backends/cuda/cuda_internal.h"
#include "base/error.h"

/* Pageable transfers move in chunks of this size, at most CUDA_RING of
 * them in flight. */
#define CUDA_CHUNK ((uint64_t)8 << 20)
#define CUDA_RING 8

/* --- strided copies --- */

/* Enqueues the copy between packed host memory `host` (pinned) and op's
 * binding: one copy when contiguous, else pitched 2-D copies (one per
 * plane of the outer dimensions). */
static cube_error *enqueue_op(cuda_server *s, cuda_stream *st,
                              const cube_copy_op *op, unsigned char *host,
                              int to_host)
{
    const cuda_api *a = s->api;
    CUdeviceptr dev = op->binding.storage->address + op->binding.offset;
    CUresult r;
    if (op->contiguous) {
        r = to_host ? a->cuMemcpyDtoHAsync(host, dev, op->bytes, st->cu)
                    : a->cuMemcpyHtoDAsync(dev, host, op->bytes, st->cu);
        return r ? cuda_fail(s, r, CUBE_ERR_INTERNAL, "copy of %llu bytes",
                             (unsigned long long)op->bytes)
                 : NULL;
    }
    uint32_t last = op->rank - 1;
    uint64_t es = op->elem_size;
    uint64_t width, height, pitch;
    uint32_t outer;
    if (op->byte_strides[last] == es) {
        width = op->shape[last] * es;
        height = last ? op->shape[last - 1] : 1;
        pitch = last ? op->byte_strides[last - 1] : width;
        outer = last ? last - 1 : 0;
    } else {
        width = es;
        height = op->shape[last];
        pitch = op->byte_strides[last];
        outer = last;
    }
    uint64_t idx[CUBE_MAX_RANK] = {0};
    for (;;) {
        uint64_t base = 0;
        for (uint32_t k = 0; k < outer; k++)
            base += idx[k] * op->byte_strides[k];
        if (pitch >= width) {
            cuda_memcpy2d m;
            memset(&m, 0, sizeof m);
            m.WidthInBytes = width;
            m.Height = height;
            if (to_host) {
                m.srcMemoryType = CU_MEMORYTYPE_DEVICE;
                m.srcDevice = dev + base;
                m.srcPitch = pitch;
                m.dstMemoryType = CU_MEMORYTYPE_HOST;
                m.dstHost = host;
                m.dstPitch = width;
            } else {
                m.srcMemoryType = CU_MEMORYTYPE_HOST;
                m.srcHost = host;
                m.srcPitch = width;
                m.dstMemoryType = CU_MEMORYTYPE_DEVICE;
                m.dstDevice = dev + base;
                m.dstPitch = pitch;
            }
            r = a->cuMemcpy2DAsync(&m, st->cu);
        } else {
            /* Rows that overlap: one copy per row. */
            r = CUDA_SUCCESS;
            for (uint64_t y = 0; y < height && r == CUDA_SUCCESS; y++)
                r = to_host
                        ? a->cuMemcpyDtoHAsync(host + y * width,
                                               dev + base + y * pitch, width,
                                               st->cu)
                        : a->cuMemcpyHtoDAsync(dev + base + y * pitch,
                                               host + y * width, width, st->cu);
        }
        if (r != CUDA_SUCCESS)
            return cuda_fail(s, r, CUBE_ERR_INTERNAL, "strided copy");
        host += width * height;
        int k = (int)outer - 1;
        while (k >= 0 && ++idx[k] == op->shape[k])
            idx[k--] = 0;
        if (k < 0)
            return NULL;
    }
}

/* --- writes --- */

/* A large contiguous write from pageable memory: chunks packed by the
 * copy helpers while the copy engine moves the previous ones. */
static cube_error *write_pipelined(cuda_server *s, cuda_stream *st,
                                   const cube_copy_op *op,
                                   const unsigned char *src)
{
    CUdeviceptr dev = op->binding.storage->address + op->binding.offset;
    cube_error *err = NULL;
    for (uint64_t off = 0; off < op->bytes && !err; off += CUDA_CHUNK) {
        uint64_t n =
            op->bytes - off < CUDA_CHUNK ? op->bytes - off : CUDA_CHUNK;
        cube_storage pin;
        err = cuda_stage(s, st, n, &pin);
        if (err)
            break;
        cuda_copy_bytes(s->copier, (void *)(uintptr_t)pin.address, src + off,
                        n);
        CUresult r = s->api->cuMemcpyHtoDAsync(
            dev + off, (void *)(uintptr_t)pin.address, n, st->cu);
        if (r != CUDA_SUCCESS) {
            mem_free(s->pinned, &pin);
            return cuda_fail(s, r, CUBE_ERR_INTERNAL, "cuMemcpyHtoDAsync");
        }
        err = cuda_inflight_push(s, st, &pin);
    }
    return err;
}

cube_error *cuda_write(cube_server *server, cube_server_stream *stream,
                       const cube_copy_op *ops, size_t n,
                       const void *const *src)
{
    cuda_server *s = (cuda_server *)server;
    cuda_stream *st = NULL;
    cube_error *err = cuda_stream_begin(s, stream, &st);
    int wait_direct = 0;
    for (size_t i = 0; i < n && !err; i++) {
        const cube_copy_op *op = &ops[i];
        cuda_block *blk = op->binding.storage->cookie;
        err = cuda_block_before_use(s, st, blk, 1);
        if (err)
            break;
        const unsigned char *from = src[i];
        if (cuda_is_pinned(s, from, op->bytes)) {
            /* Straight from the caller's pinned buffer; the caller may
             * reuse it when we return, so we wait below. */
            err = enqueue_op(s, st, op, (unsigned char *)(uintptr_t)from, 0);
            wait_direct = 1;
        } else if (op->contiguous && op->bytes > CUDA_CHUNK) {
            err = write_pipelined(s, st, op, from);
        } else {
            cube_storage pin;
            err = cuda_stage(s, st, op->bytes, &pin);
            if (!err) {
                cuda_copy_bytes(s->copier, (void *)(uintptr_t)pin.address, from,
                                op->bytes);
                err = enqueue_op(s, st, op,
                                 (unsigned char *)(uintptr_t)pin.address, 0);
                if (err)
                    mem_free(s->pinned, &pin);
                else
                    err = cuda_inflight_push(s, st, &pin);
            }
        }
        if (!err) {
            uint64_t seq = cuda_stream_next(st);
            if (cuda_block_used(st, blk, seq, 1))
                err = cuda_stream_record(s, st);
        }
    }
    if (!err && wait_direct) {
        CUresult r = s->api->cuEventRecord(st->done, st->cu);
        if (r == CUDA_SUCCESS)
            r = s->api->cuEventSynchronize(st->done);
        if (r != CUDA_SUCCESS)
            err = cuda_fail(s, r, CUBE_ERR_INTERNAL, "write");
    }
    return err;
}

/* --- reads --- */

typedef struct read_item {
    void *dst;
    cube_storage pinned; /* address 0: copied straight into dst */
    uint64_t bytes;
} read_item;

struct cube_pending {
    cuda_server *server;
    cuda_stream *stream;
    CUevent event; /* NULL while it is the stream's open read */
    size_t count;
    read_item items[];
};

/* A large contiguous read into pageable memory, done before returning:
 * the copy engine fills a ring of pinned chunks while the helpers empty
 * the previous ones. */
static cube_error *read_pipelined(cuda_server *s, cuda_stream *st,
                                  const cube_copy_op *op, unsigned char *dst)
{
    const cuda_api *a = s->api;
    CUdeviceptr dev = op->binding.storage->address + op->binding.offset;
    uint64_t chunks = (op->bytes + CUDA_CHUNK - 1) / CUDA_CHUNK;
    cube_storage ring[CUDA_RING];
    CUevent ev[CUDA_RING];
    memset(ring, 0, sizeof ring);
    memset(ev, 0, sizeof ev);
    uint64_t slots = chunks < CUDA_RING ? chunks : CUDA_RING;
    /* (cppcheck takes chunks for 0 in this function; the caller sends
     * only reads of more than two chunks.) */
    cube_error *err = NULL;
    // cppcheck-suppress knownConditionTrueFalse
    for (uint64_t i = 0; i < slots && !err; i++) {
        err = mem_alloc(s->pinned, CUDA_CHUNK, &ring[i]);
        if (!err)
            err = cuda_event_get(s, &ev[i]);
    }
    CUresult r = CUDA_SUCCESS;
    /* Enqueue chunk c into slot c % slots. */
    uint64_t next = 0, done = 0;
    while (!err && done < chunks) {
        // cppcheck-suppress knownConditionTrueFalse
        while (next < chunks && next - done < slots) {
            uint64_t k = next % slots, off = next * CUDA_CHUNK;
            uint64_t len =
                op->bytes - off < CUDA_CHUNK ? op->bytes - off : CUDA_CHUNK;
            r = a->cuMemcpyDtoHAsync((void *)(uintptr_t)ring[k].address,
                                     dev + off, len, st->cu);
            if (r == CUDA_SUCCESS)
                r = a->cuEventRecord(ev[k], st->cu);
            if (r != CUDA_SUCCESS)
                break;
            next++;
        }
        if (r != CUDA_SUCCESS)
            break;
        uint64_t k = done % slots, off = done * CUDA_CHUNK;
        uint64_t len =
            op->bytes - off < CUDA_CHUNK ? op->bytes - off : CUDA_CHUNK;
        r = a->cuEventSynchronize(ev[k]);
        if (r != CUDA_SUCCESS)
            break;
        cuda_copy_bytes(s->copier, dst + off,
                        (void *)(uintptr_t)ring[k].address, len);
        done++;
    }
    if (!err && r != CUDA_SUCCESS)
        err = cuda_fail(s, r, CUBE_ERR_INTERNAL, "read of %llu bytes",
                        (unsigned long long)op->bytes);
    if (err)
        a->cuStreamSynchronize(st->cu); /* nothing may still write the ring */
    for (uint64_t i = 0; i < slots; i++) {
        if (ring[i].address)
            mem_free(s->pinned, &ring[i]);
        if (ev[i])
            cuda_event_put(s, ev[i]);
    }
    return err;
}

static void pending_free(cuda_server *s, cube_pending *p)
{
    for (size_t i = 0; i < p->count; i++)
        if (p->items[i].pinned.address)
            mem_free(s->pinned, &p->items[i].pinned);
    if (p->event)
        cuda_event_put(s, p->event);
    free(p);
}

cube_error *cuda_read(cube_server *server, cube_server_stream *stream,
                      const cube_copy_op *ops, size_t n, void *const *dst,
                      cube_pending **pending)
{
    cuda_server *s = (cuda_server *)server;
    *pending = NULL;
    cuda_stream *st = NULL;
    cube_error *err = cuda_stream_begin(s, stream, &st);
    if (err)
        return err;
    cube_pending *p = calloc(1, sizeof *p + n * sizeof(read_item));
    if (!p)
        return cube_error_new(CUBE_ERR_OUT_OF_MEMORY, "read");
    p->server = s;
    size_t queued = 0;
    int shared = 0;
    for (size_t i = 0; i < n && !err; i++) {
        const cube_copy_op *op = &ops[i];
        cuda_block *blk = op->binding.storage->cookie;
        err = cuda_block_before_use(s, st, blk, 0);
        if (err)
            break;
        read_item *it = &p->items[p->count++];
        it->dst = dst[i];
        it->bytes = op->bytes;
        if (cuda_is_pinned(s, dst[i], op->bytes)) {
            err = enqueue_op(s, st, op, dst[i], 1);
            queued++;
        } else if (op->contiguous && op->bytes > 2 * CUDA_CHUNK) {
            p->count--; /* done here, nothing left for the wait */
            err = read_pipelined(s, st, op, dst[i]);
        } else {
            err = mem_alloc(s->pinned, op->bytes, &it->pinned);
            if (!err)
                err = enqueue_op(s, st, op,
                                 (unsigned char *)(uintptr_t)it->pinned.address,
                                 1);
            queued++;
        }
        if (!err)
            shared |= cuda_block_used(st, blk, cuda_stream_next(st), 0);
    }
    if (!err && shared)
        err = cuda_stream_record(s, st); /* writers elsewhere wait for it */
    if (!err && queued) {
        /* No event yet: see cuda_stream.open_read. */
        p->stream = st;
        cube_mutex_lock(&st->lock);
        atomic_store(&st->open_read, p);
        cube_mutex_unlock(&st->lock);
    }
    if (err) {
        if (queued)
            s->api->cuStreamSynchronize(st->cu);
        pending_free(s, p);
        return err;
    }
    if (!queued) {
        pending_free(s, p);
        return NULL;
    }
    *pending = p;
    return NULL;
}

/* --- the open read --- */

static cube_error *cuda_stream_seal_slow(cuda_server *s, cuda_stream *st)
{
    CUresult r = CUDA_SUCCESS;
    cube_error *err = NULL;
    cube_mutex_lock(&st->lock);
    cube_pending *p = atomic_load(&st->open_read);
    if (p) {
        err = cuda_event_get(s, &p->event);
        if (!err) {
            r = s->api->cuEventRecord(p->event, st->cu);
            if (r != CUDA_SUCCESS) {
                cuda_event_put(s, p->event);
                p->event = NULL; /* its wait synchronizes the stream */
            }
        }
        atomic_store(&st->open_read, NULL);
    }
    cube_mutex_unlock(&st->lock);
    if (!err && r != CUDA_SUCCESS)
        err = cuda_fail(s, r, CUBE_ERR_INTERNAL, "cuEventRecord");
    return err;
}

/* Call before enqueueing anything on `st`: gives the open read, if any,
 * its own completion event first. */
static inline cube_error *cuda_stream_seal(cuda_server *s, cuda_stream *st)
{
    if (!atomic_load_explicit(&st->open_read, memory_order_acquire))
        return NULL;
    return cuda_stream_seal_slow(s, st);
}

cube_error *cuda_stream_begin(cuda_server *s, cube_server_stream *stream,
                              cuda_stream **out)
{
    *out = stream->impl;
    cube_error *err = cuda_enter(s);
    if (!err)
        err = cuda_stream_seal(s, *out);
    return err;
}

int cuda_read_poll(cube_server *server, cube_pending *p)
{
    cuda_server *s = (cuda_server *)server;
    cube_error *err = cuda_enter(s);
    if (err) {
        cube_error_ignore(err, "the poll answers done and the wait "
                               "reports the failure");
        return 1;
    }
    cuda_stream *st = p->stream;
    /* As read_wait: without an event the stream's end is the read's. */
    cube_mutex_lock(&st->lock);
    CUresult r = p->event ? s->api->cuEventQuery(p->event)
                          : s->api->cuStreamQuery(st->cu);
    cube_mutex_unlock(&st->lock);
    return r != CUDA_ERROR_NOT_READY;
}

cube_error *cuda_read_wait(cube_server *server, cube_pending *p)
{
    cuda_server *s = (cuda_server *)server;
    cube_error *err = cuda_enter(s);
    cuda_stream *st = p->stream;
    cube_mutex_lock(&st->lock);
    if (atomic_load(&st->open_read) == p)
        atomic_store(&st->open_read, NULL);
    CUevent ev = p->event;
    cube_mutex_unlock(&st->lock);
    /* Nothing was enqueued after the read (else it has an event): the
     * stream's end is the read's end. */
    CUresult r = err  ? CUDA_SUCCESS
                 : ev ? s->api->cuEventSynchronize(ev)
                      : s->api->cuStreamSynchronize(st->cu);
    if (!err && r != CUDA_SUCCESS)
        err = cuda_fail(s, r, CUBE_ERR_INTERNAL, "read");
    for (size_t i = 0; i < p->count && !err; i++)
        if (p->items[i].pinned.address)
            cuda_copy_bytes(s->copier, p->items[i].dst,
                            (void *)(uintptr_t)p->items[i].pinned.address,
                            p->items[i].bytes);
    pending_free(s, p);
    return err;
}

cube_error *cuda_native_stream(cube_server *server, cube_server_stream *stream,
                               void **out)
{
    cuda_stream *st = NULL;
    cube_error *err = cuda_stream_begin((cuda_server *)server, stream, &st);
    if (!err)
        *out = st->cu;
    return err;
}

cube_error *cuda_native_written(cube_server *server, cube_server_stream *stream,
                                const cube_binding *binding)
{
    cuda_server *s = (cuda_server *)server;
    cuda_stream *st = NULL;
    cube_error *err = cuda_stream_begin(s, stream, &st);
    if (err)
        return err;
    /* The foreign work is already on this stream's queue: it counts as
     * this stream's write of the block, which other streams then wait
     * for. */
    uint64_t seq = cuda_stream_next(st);
    if (cuda_block_used(st, binding->storage->cookie, seq, 1))
        return cuda_stream_record(s, st);
    return NULL;
}

cube_error *cuda_native_ready(cube_server *server, cube_server_stream *stream,
                              const cube_binding *binding, void *foreign)
{
    cuda_server *s = (cuda_server *)server;
    cuda_stream *st = NULL;
    cube_error *err = cuda_stream_begin(s, stream, &st);
    /* This stream first waits for the buffer's last writer elsewhere;
     * then `foreign` waits for this stream's work so far. */
    if (!err)
        err = cuda_block_before_use(s, st, binding->storage->cookie, 0);
    if (err)
        return err;
    /* A stream with nothing left to run (that wait included) gives the
     * consumer nothing to wait for: one query instead of an event record
     * and a wait, the common case of a tensor handed over long after it
     * was made. */
    if (s->api->cuStreamQuery(st->cu) == CUDA_SUCCESS)
        return NULL;
    CUevent ev = NULL;
    err = cuda_event_get(s, &ev);
    if (err)
        return err;
    CUresult r = s->api->cuEventRecord(ev, st->cu);
    if (r == CUDA_SUCCESS)
        r = s->api->cuStreamWaitEvent((CUstream)foreign, ev, 0);
    cuda_event_put(s, ev);
    return r == CUDA_SUCCESS ? NULL
                             : cuda_fail(s, r, CUBE_ERR_INTERNAL,
                                         "making the consumer's stream wait");
}

cube_error *cuda_native_wait(cube_server *server, cube_server_stream *stream,
                             void *foreign)
{
    cuda_server *s = (cuda_server *)server;
    cuda_stream *st = NULL;
    cube_error *err = cuda_stream_begin(s, stream, &st);
    if (err)
        return err;
    /* NULL names the legacy default stream, as the driver reads 0. */
    CUstream f = foreign ? (CUstream)foreign : CUDA_STREAM_LEGACY;
    /* Foreign work that is all done needs no wait (see native_ready). */
    CUresult r = s->api->cuStreamQuery(f);
    if (r == CUDA_SUCCESS)
        return NULL;
    CUevent ev = NULL;
    err = cuda_event_get(s, &ev);
    if (err)
        return err;
    r = s->api->cuEventRecord(ev, f);
    if (r == CUDA_SUCCESS)
        r = s->api->cuStreamWaitEvent(st->cu, ev, 0);
    cuda_event_put(s, ev);
    if (r == CUDA_SUCCESS)
        return NULL;
    /* A handle the driver refuses is the caller's mistake, not a fault. */
    return r == CUDA_ERROR_INVALID_HANDLE || r == CUDA_ERROR_INVALID_VALUE ||
                   r == CUDA_ERROR_INVALID_CONTEXT
               ? cuda_error(s->api, r, CUBE_ERR_INVALID_ARGUMENT,
                            "cube_native_wait: the driver refuses stream %p",
                            foreign)
               : cuda_fail(s, r, CUBE_ERR_INTERNAL,
                           "waiting for a foreign stream");
}
