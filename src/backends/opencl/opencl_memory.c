/* Device memory, streams and copies on OpenCL (opencl_internal.h has the
 * scheme): pages as cl_mem under made-up addresses, a stream's in-order
 * queue, the markers that order its commands after other streams', and
 * reads, writes, sync and flush in stream order. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/common/host_memory.h"
#include "backends/opencl/opencl_internal.h"

/* --- pages --- */

static opencl_page *chunk_at(opencl_server *s, uint32_t slot)
{
    return atomic_load_explicit(&s->chunks[slot / OPENCL_CHUNK_PAGES],
                                memory_order_acquire);
}

/* The page behind a made-up address, or NULL. */
static const opencl_page *page_at(opencl_server *s, uint64_t address)
{
    uint64_t slot = address >> OPENCL_PAGE_SHIFT;
    if (slot == 0 || slot >= (uint64_t)OPENCL_PAGE_CHUNKS * OPENCL_CHUNK_PAGES)
        return NULL;
    opencl_page *chunk = chunk_at(s, (uint32_t)slot);
    return chunk ? &chunk[slot % OPENCL_CHUNK_PAGES] : NULL;
}

cl_mem opencl_page_of(opencl_server *s, uint64_t address, uint64_t *offset)
{
    const opencl_page *page = page_at(s, address);
    *offset = address & OPENCL_OFFSET_MASK;
    return page ? page->mem : NULL;
}

/* A free slot, its chunk made. 0 when the table is full or for want of
 * memory. */
static uint32_t slot_take(opencl_server *s) CUBE_REQUIRES(s->pages_lock)
{
    uint32_t slot;
    if (s->page_free_count)
        slot = s->page_free[--s->page_free_count];
    else if (s->page_next + 1 < OPENCL_PAGE_CHUNKS * OPENCL_CHUNK_PAGES)
        slot = ++s->page_next;
    else
        return 0;
    uint32_t c = slot / OPENCL_CHUNK_PAGES;
    if (!atomic_load_explicit(&s->chunks[c], memory_order_relaxed)) {
        opencl_page *chunk = calloc(OPENCL_CHUNK_PAGES, sizeof *chunk);
        if (!chunk) {
            s->page_free[s->page_free_count++] = slot;
            return 0;
        }
        atomic_store_explicit(&s->chunks[c], chunk, memory_order_release);
    }
    return slot;
}

/* cube_storage_ops.alloc: a cl_mem of its own for each page. */
static cube_error *page_alloc(void *self, uint64_t size, uint64_t align,
                              uint64_t *address)
{
    opencl_server *s = self;
    (void)align; /* a page starts at offset 0 of its cl_mem */
    if (size == 0 || size > OPENCL_OFFSET_MASK)
        return cube_error_new(CUBE_ERR_OUT_OF_MEMORY,
                              "opencl: a page of %llu bytes",
                              (unsigned long long)size);
    cl_int r = CL_SUCCESS;
    cl_mem mem = s->api->clCreateBuffer(s->context, CL_MEM_READ_WRITE,
                                        (size_t)size, NULL, &r);
    if (!mem)
        return opencl_fail(r, CUBE_ERR_OUT_OF_MEMORY,
                           "opencl: cannot allocate %llu bytes",
                           (unsigned long long)size);
    cube_mutex_lock(&s->pages_lock);
    uint32_t slot = 0;
    /* The free list can always take back every slot handed out. */
    if (s->page_free_cap <= s->page_next + 1) {
        uint32_t cap = s->page_free_cap ? s->page_free_cap * 2 : 64;
        uint32_t *grown = realloc(s->page_free, cap * sizeof *grown);
        if (grown) {
            s->page_free = grown;
            s->page_free_cap = cap;
        }
    }
    if (s->page_free_cap > s->page_next + 1)
        slot = slot_take(s);
    if (slot) {
        opencl_page *page = &chunk_at(s, slot)[slot % OPENCL_CHUNK_PAGES];
        page->size = size;
        page->mem = mem;
    }
    cube_mutex_unlock(&s->pages_lock);
    if (!slot) {
        s->api->clReleaseMemObject(mem);
        return cube_error_new(CUBE_ERR_OUT_OF_MEMORY,
                              "opencl: no room for another page");
    }
    *address = (uint64_t)slot << OPENCL_PAGE_SHIFT;
    return NULL;
}

/* cube_storage_ops.free: OpenCL keeps the memory until the commands
 * already enqueued on it have run. */
static void page_free(void *self, uint64_t address, uint64_t size)
{
    opencl_server *s = self;
    (void)size;
    uint64_t slot = address >> OPENCL_PAGE_SHIFT;
    uint64_t offset = 0;
    cl_mem mem = opencl_page_of(s, address, &offset);
    if (!mem || offset)
        return;
    cube_mutex_lock(&s->pages_lock);
    opencl_page *page = &chunk_at(s, (uint32_t)slot)[slot % OPENCL_CHUNK_PAGES];
    page->mem = NULL;
    page->size = 0;
    s->page_free[s->page_free_count++] = (uint32_t)slot;
    cube_mutex_unlock(&s->pages_lock);
    s->api->clReleaseMemObject(mem);
}

/* --- streams --- */

cube_error *opencl_stream_open(cube_server *server, cube_server_stream *stream,
                               cube_storage_ops *storage)
{
    opencl_server *s = (opencl_server *)server;
    opencl_stream *st = calloc(1, sizeof *st);
    if (!st)
        return cube_error_new(CUBE_ERR_OUT_OF_MEMORY, "opencl stream");
    cl_int r = CL_SUCCESS;
    /* Profiling on: windows read the queue's timestamps. */
    st->queue = s->api->clCreateCommandQueue(s->context, s->device,
                                             CL_QUEUE_PROFILING_ENABLE, &r);
    if (!st->queue) {
        free(st);
        return opencl_fail(r, CUBE_ERR_OUT_OF_MEMORY,
                           "opencl: cannot create a command queue");
    }
    stream->impl = st;
    memset(storage, 0, sizeof *storage);
    storage->self = s;
    storage->alloc = page_alloc;
    storage->free = page_free;
    return NULL;
}

void opencl_stream_close(cube_server *server, cube_server_stream *stream)
{
    opencl_server *s = (opencl_server *)server;
    opencl_stream *st = stream->impl;
    if (!st)
        return;
    s->api->clFinish(st->queue);
    if (st->sinks)
        s->api->clReleaseMemObject(st->sinks);
    s->api->clReleaseCommandQueue(st->queue);
    free(st->seen);
    free(st);
    stream->impl = NULL;
}

cube_error *opencl_native_stream(cube_server *server,
                                 cube_server_stream *stream, void **out)
{
    (void)server;
    *out = ((opencl_stream *)stream->impl)->queue;
    return NULL;
}

cube_error *opencl_wrap_memory(cube_server *server, cube_server_stream *stream,
                               uint64_t address, uint64_t size,
                               cube_storage *out)
{
    (void)stream;
    const opencl_page *page = page_at((opencl_server *)server, address);
    uint64_t offset = address & OPENCL_OFFSET_MASK;
    if (!page || !page->mem)
        return cube_error_new(CUBE_ERR_INVALID_ARGUMENT,
                              "0x%llx is not memory of this OpenCL device (an "
                              "address cube_native_buffer_get gave)",
                              (unsigned long long)address);
    if (offset > page->size || size > page->size - offset)
        return cube_error_new(CUBE_ERR_INVALID_ARGUMENT,
                              "[0x%llx, +%llu) runs past the end of its "
                              "allocation (%llu bytes)",
                              (unsigned long long)address,
                              (unsigned long long)size,
                              (unsigned long long)page->size);
    memset(out, 0, sizeof *out);
    out->address = address;
    out->size = size;
    return NULL;
}

cube_error *opencl_native_wait(cube_server *server, cube_server_stream *stream,
                               void *foreign)
{
    opencl_server *s = (opencl_server *)server;
    opencl_stream *st = stream->impl;
    if (!foreign)
        return NULL;
    if (foreign == (void *)(uintptr_t)1 || foreign == (void *)(uintptr_t)2)
        return cube_error_new(CUBE_ERR_INVALID_ARGUMENT,
                              "CUDA's default streams do not exist on "
                              "OpenCL: name a cl_command_queue");
    cl_event done = NULL;
    cl_int r = s->api->clEnqueueMarkerWithWaitList((cl_command_queue)foreign, 0,
                                                   NULL, &done);
    if (r != CL_SUCCESS)
        return opencl_fail(r, CUBE_ERR_INVALID_ARGUMENT,
                           "cube_native_wait: not a command queue of this "
                           "device");
    r = s->api->clEnqueueMarkerWithWaitList(st->queue, 1, &done, NULL);
    s->api->clReleaseEvent(done);
    opencl_enqueued(st);
    return r == CL_SUCCESS
               ? NULL
               : opencl_fail(r, CUBE_ERR_INTERNAL, "cube_native_wait");
}

cube_error *opencl_sinks(opencl_server *s, opencl_stream *st, uint64_t bytes,
                         cl_mem *out)
{
    if (st->sink_bytes < bytes) {
        uint64_t want = st->sink_bytes * 2 > bytes ? st->sink_bytes * 2 : bytes;
        cl_int r = CL_SUCCESS;
        cl_mem mem = s->api->clCreateBuffer(s->context, CL_MEM_READ_WRITE,
                                            (size_t)want, NULL, &r);
        if (!mem)
            return opencl_fail(r, CUBE_ERR_OUT_OF_MEMORY,
                               "opencl: %llu bytes of scratch for a "
                               "bounds-checked launch (64 per unit)",
                               (unsigned long long)want);
        /* Launches already enqueued keep the old one alive. */
        if (st->sinks)
            s->api->clReleaseMemObject(st->sinks);
        st->sinks = mem;
        st->sink_bytes = want;
    }
    *out = st->sinks;
    return NULL;
}

/* --- ordering across streams --- */

cube_error *opencl_waits(opencl_server *s, cube_server_stream *stream,
                         opencl_wait_list *w)
{
    opencl_stream *st = stream->impl;
    w->events = w->small;
    w->n = 0;
    uint32_t count = cube_server_stream_count(&s->base);
    if (count > st->seen_cap) {
        uint64_t *grown = realloc(st->seen, count * sizeof *grown);
        if (!grown)
            return cube_error_new(CUBE_ERR_OUT_OF_MEMORY, "opencl stream");
        memset(grown + st->seen_cap, 0, (count - st->seen_cap) * sizeof *grown);
        st->seen = grown;
        st->seen_cap = count;
    }
    size_t cap = sizeof w->small / sizeof w->small[0];
    for (uint32_t i = 0; i < count; i++) {
        if (i == stream->index)
            continue;
        cube_server_stream *other = cube_server_stream_at(&s->base, i);
        opencl_stream *ot = other ? other->impl : NULL;
        if (!ot)
            continue;
        uint64_t seq = atomic_load_explicit(&ot->seq, memory_order_acquire);
        if (seq == st->seen[i])
            continue;
        if (w->n == cap) {
            cl_event *grown = malloc(cap * 2 * OPENCL_HANDLE_SIZE);
            if (!grown) {
                opencl_waits_release(s, w);
                return cube_error_new(CUBE_ERR_OUT_OF_MEMORY, "opencl waits");
            }
            memcpy(grown, w->events, w->n * OPENCL_HANDLE_SIZE);
            if (w->events != w->small)
                free(w->events);
            w->events = grown;
            cap *= 2;
        }
        /* Another thread may be enqueueing on that queue: OpenCL's calls
         * are thread-safe, and every command counted in `seq` is already
         * in it, ahead of the marker. */
        cl_int r = s->api->clEnqueueMarkerWithWaitList(ot->queue, 0, NULL,
                                                       &w->events[w->n]);
        if (r != CL_SUCCESS) {
            opencl_waits_release(s, w);
            return opencl_fail(r, CUBE_ERR_DEVICE_FAULT,
                               "opencl: ordering after stream %u", i);
        }
        w->n++;
        st->seen[i] = seq;
    }
    return NULL;
}

void opencl_waits_release(opencl_server *s, opencl_wait_list *w)
{
    for (cl_uint i = 0; i < w->n; i++)
        s->api->clReleaseEvent(w->events[i]);
    if (w->events != w->small)
        free(w->events);
    w->events = w->small;
    w->n = 0;
}

/* --- copies --- */

/* A blocking call failed after work ran: the device is broken when the
 * code says the queue is (CL_OUT_OF_RESOURCES is how NVIDIA's driver
 * reports a kernel's illegal access). */
static cube_error *blocking_failed(opencl_server *s, cl_int r, const char *what)
{
    if (r == CL_OUT_OF_RESOURCES ||
        r == CL_EXEC_STATUS_ERROR_FOR_EVENTS_IN_WAIT_LIST) {
        char why[200];
        snprintf(why, sizeof why, "%s failed: %s (%d)", what,
                 opencl_error_name(r), (int)r);
        opencl_fault_set(s, why);
        return opencl_fault_check(s);
    }
    return opencl_fail(r, CUBE_ERR_INTERNAL, "opencl: %s", what);
}

/* The bytes a strided op spans from its first element. */
static uint64_t op_span(const cube_copy_op *op)
{
    uint64_t span = op->elem_size;
    for (uint32_t k = 0; k < op->rank; k++)
        if (op->shape[k])
            span += (op->shape[k] - 1) * op->byte_strides[k];
    return span;
}

/* host_copy_op between `host` (packed) and `image`, a host copy of the
 * op's span. */
static void pack_image(const cube_copy_op *op, unsigned char *image,
                       unsigned char *host, int to_host)
{
    cube_storage fake = {.address = (uint64_t)(uintptr_t)image};
    cube_copy_op local = *op;
    local.binding.storage = &fake;
    local.binding.offset = 0;
    host_copy_op(&local, host, to_host);
}

/* Reads [offset, offset + bytes) of `mem` into `dst`, blocking, after the
 * waits. */
static cube_error *read_range(opencl_server *s, opencl_stream *st, cl_mem mem,
                              uint64_t offset, uint64_t bytes, void *dst,
                              opencl_wait_list *w)
{
    cl_int r = s->api->clEnqueueReadBuffer(st->queue, mem, CL_TRUE,
                                           (size_t)offset, (size_t)bytes, dst,
                                           w->n, w->n ? w->events : NULL, NULL);
    opencl_enqueued(st);
    opencl_waits_release(s, w);
    return r == CL_SUCCESS ? NULL : blocking_failed(s, r, "a read");
}

static cube_error *write_range(opencl_server *s, opencl_stream *st, cl_mem mem,
                               uint64_t offset, uint64_t bytes, const void *src,
                               opencl_wait_list *w)
{
    /* Blocking: the caller may reuse its memory when write returns. */
    cl_int r = s->api->clEnqueueWriteBuffer(
        st->queue, mem, CL_TRUE, (size_t)offset, (size_t)bytes, src, w->n,
        w->n ? w->events : NULL, NULL);
    opencl_enqueued(st);
    opencl_waits_release(s, w);
    return r == CL_SUCCESS ? NULL : blocking_failed(s, r, "a write");
}

/* One op between its binding and packed host bytes: a dense one in one
 * transfer; a strided one through a host image of its span (a write
 * reads the span first, so the bytes between the elements stay). */
static cube_error *copy_op(opencl_server *s, cube_server_stream *stream,
                           const cube_copy_op *op, unsigned char *host,
                           int to_host)
{
    opencl_stream *st = stream->impl;
    uint64_t offset = 0;
    cl_mem mem = opencl_page_of(
        s, op->binding.storage->address + op->binding.offset, &offset);
    if (!mem)
        return cube_error_new(CUBE_ERR_INTERNAL,
                              "opencl: a binding outside every page");
    opencl_wait_list w;
    cube_error *err = opencl_waits(s, stream, &w);
    if (err)
        return err;
    if (op->contiguous)
        return to_host ? read_range(s, st, mem, offset, op->bytes, host, &w)
                       : write_range(s, st, mem, offset, op->bytes, host, &w);
    uint64_t span = op_span(op);
    unsigned char *image = malloc(span ? (size_t)span : 1);
    if (!image) {
        opencl_waits_release(s, &w);
        return cube_error_new(CUBE_ERR_OUT_OF_MEMORY,
                              "opencl: %llu bytes to stage a strided copy",
                              (unsigned long long)span);
    }
    err = read_range(s, st, mem, offset, span, image, &w);
    if (!err) {
        pack_image(op, image, host, to_host);
        if (!to_host)
            err = write_range(s, st, mem, offset, span, image, &w);
    }
    free(image);
    return err;
}

cube_error *opencl_read(cube_server *server, cube_server_stream *stream,
                        const cube_copy_op *ops, size_t n, void *const *dst,
                        cube_pending **pending)
{
    opencl_server *s = (opencl_server *)server;
    *pending = NULL;
    cube_error *err = opencl_fault_check(s);
    for (size_t i = 0; i < n && !err; i++)
        err = copy_op(s, stream, &ops[i], dst[i], 1);
    return err;
}

cube_error *opencl_write(cube_server *server, cube_server_stream *stream,
                         const cube_copy_op *ops, size_t n,
                         const void *const *src)
{
    opencl_server *s = (opencl_server *)server;
    cube_error *err = opencl_fault_check(s);
    for (size_t i = 0; i < n && !err; i++)
        err =
            copy_op(s, stream, &ops[i], (unsigned char *)(uintptr_t)src[i], 0);
    return err;
}

/* --- barriers --- */

/* A kernel's cube_trap() sets the device's trap word: once seen, the
 * device is broken. */
static cube_error *trap_check(opencl_server *s, opencl_stream *st)
{
    if (!atomic_load_explicit(&s->trap_kernels, memory_order_relaxed))
        return NULL;
    cl_uint word = 0;
    cl_int r = s->api->clEnqueueReadBuffer(st->queue, s->trap, CL_TRUE, 0,
                                           sizeof word, &word, 0, NULL, NULL);
    if (r != CL_SUCCESS)
        return blocking_failed(s, r, "reading the trap word");
    if (word)
        opencl_fault_set(s, "a kernel called cube_trap()");
    return opencl_fault_check(s);
}

cube_error *opencl_sync(cube_server *server, cube_server_stream *stream,
                        const cube_binding *bindings, size_t n)
{
    (void)bindings;
    (void)n;
    opencl_server *s = (opencl_server *)server;
    opencl_stream *st = stream->impl;
    cube_error *err = opencl_fault_check(s);
    if (err)
        return err;
    /* Every other stream's work issued so far, then this stream's. */
    opencl_wait_list w;
    err = opencl_waits(s, stream, &w);
    if (err)
        return err;
    cl_int r = w.n ? s->api->clWaitForEvents(w.n, w.events) : CL_SUCCESS;
    opencl_waits_release(s, &w);
    if (r == CL_SUCCESS)
        r = s->api->clFinish(st->queue);
    if (r != CL_SUCCESS)
        return blocking_failed(s, r, "a sync");
    return trap_check(s, st);
}

cube_error *opencl_flush(cube_server *server, cube_server_stream *stream)
{
    opencl_server *s = (opencl_server *)server;
    opencl_stream *st = stream->impl;
    cl_int r = s->api->clFlush(st->queue);
    if (r != CL_SUCCESS)
        return blocking_failed(s, r, "a flush");
    return opencl_fault_check(s);
}
