/* Pinned host memory: the server's pooled manager of it, the buffers
 * handed out through cube_staging (a transfer from or to one needs no
 * staging of its own), and the pinned blocks of a stream's transfers,
 * held until the stream is past their copies.
 *
 * Locks (docs/threading.md): the pinned manager's lock, then
 * deferred_lock (a pinned page given back); staging_lock alone.
 */
#include <stdlib.h>
#include <unistd.h>

#include "backends/cuda/cuda_internal.h"
#include "base/grow.h"

/* Pinned bytes a stream may have in flight from writes before a new one
 * waits for the oldest. */
#define CUDA_INFLIGHT_LIMIT ((uint64_t)64 << 20)

/* --- pinned memory --- */

static cube_error *pinned_alloc(void *self, uint64_t size, uint64_t align,
                                uint64_t *address)
{
    cuda_server *s = self;
    (void)align; /* page-aligned */
    cube_error *err = cuda_enter(s);
    if (err)
        return err;
    void *p = NULL;
    int mode = CU_STREAM_CAPTURE_MODE_RELAXED;
    s->api->cuThreadExchangeStreamCaptureMode(&mode);
    CUresult r =
        s->api->cuMemHostAlloc(&p, (size_t)size, CU_MEMHOSTALLOC_PORTABLE);
    s->api->cuThreadExchangeStreamCaptureMode(&mode);
    if (r != CUDA_SUCCESS)
        return cuda_fail_alloc(s, r, "cuMemHostAlloc of %llu bytes",
                               (unsigned long long)size);
    *address = (uint64_t)(uintptr_t)p;
    return NULL;
}

static void pinned_free(void *self, uint64_t address, uint64_t size)
{
    (void)size;
    cuda_free_later(self, NULL, address);
}

cube_error *cuda_pinned_create(cuda_server *s)
{
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    mem_device dev = {4096, (pages > 0 && page > 0)
                                ? (uint64_t)pages * (uint64_t)page
                                : (uint64_t)1 << 34};
    mem_storage_ops ops = {s, pinned_alloc, pinned_free};
    cube_error *err = mem_manager_create(&ops, &dev, NULL, &s->pinned);
    if (err)
        return err;
    s->copier = cuda_copier_create();
    if (!s->copier)
        return cube_error_new(CUBE_ERR_OUT_OF_MEMORY, "copy helpers");
    return NULL;
}

void cuda_pinned_destroy(cuda_server *s)
{
    cuda_copier_destroy(s->copier);
    s->copier = NULL;
    free(s->staging);
    s->staging = NULL;
    if (s->pinned)
        mem_manager_destroy(s->pinned);
    s->pinned = NULL;
}

/* --- staging --- */

cube_error *cuda_staging(cube_server *server, const uint64_t *sizes, size_t n,
                         void **out)
{
    cuda_server *s = (cuda_server *)server;
    cube_error *err = NULL;
    size_t made = 0;
    for (; made < n && !err; made++) {
        cube_storage b;
        err = mem_alloc(s->pinned, sizes[made], &b);
        if (err)
            break;
        cube_mutex_lock(&s->staging_lock);
        cube_storage *room = cube_grow(s->staging, s->staging_count,
                                       &s->staging_cap, sizeof *room, 16);
        if (!room) {
            cube_mutex_unlock(&s->staging_lock);
            mem_free(s->pinned, &b);
            err = cube_error_new(CUBE_ERR_OUT_OF_MEMORY, "staging");
            break;
        }
        s->staging = room;
        s->staging[s->staging_count++] = b;
        cube_mutex_unlock(&s->staging_lock);
        out[made] = (void *)(uintptr_t)b.address;
    }
    if (err) {
        for (size_t i = 0; i < made; i++) {
            cuda_staging_free(server, out[i]);
            out[i] = NULL;
        }
    }
    return err;
}

void cuda_staging_free(cube_server *server, void *buffer)
{
    cuda_server *s = (cuda_server *)server;
    uint64_t a = (uint64_t)(uintptr_t)buffer;
    cube_mutex_lock(&s->staging_lock);
    for (size_t i = 0; i < s->staging_count; i++) {
        if (s->staging[i].address == a) {
            cube_storage b = s->staging[i];
            s->staging[i] = s->staging[--s->staging_count];
            cube_mutex_unlock(&s->staging_lock);
            mem_free(s->pinned, &b);
            return;
        }
    }
    cube_mutex_unlock(&s->staging_lock);
}

/* Whether [p, p + bytes) lies inside a buffer handed out by cube_staging. */
int cuda_is_pinned(cuda_server *s, const void *p, uint64_t bytes)
{
    uint64_t a = (uint64_t)(uintptr_t)p;
    int found = 0;
    cube_mutex_lock(&s->staging_lock);
    for (size_t i = 0; i < s->staging_count && !found; i++) {
        const cube_storage *st = &s->staging[i];
        found = a >= st->address && a - st->address <= st->size &&
                bytes <= st->size - (a - st->address);
    }
    cube_mutex_unlock(&s->staging_lock);
    return found;
}

/* --- pinned blocks in flight --- */

cube_error *cuda_inflight_reap(cuda_server *s, cuda_stream *st, int all)
{
    cube_error *err = NULL;
    while (st->inflight_count) {
        cuda_inflight *f = &st->inflight[st->inflight_head];
        CUresult r = all ? s->api->cuEventSynchronize(f->event)
                         : s->api->cuEventQuery(f->event);
        if (r == CUDA_ERROR_NOT_READY)
            break;
        if (r != CUDA_SUCCESS && !err)
            err = cuda_fail(s, r, CUBE_ERR_INTERNAL, "a transfer");
        mem_free(s->pinned, &f->pinned);
        cuda_event_put(s, f->event);
        st->inflight_bytes -= f->pinned.size;
        st->inflight_head = (st->inflight_head + 1) % st->inflight_cap;
        st->inflight_count--;
    }
    return err;
}

/* Hands `pinned` to the stream until the work enqueued so far is done. */
cube_error *cuda_inflight_push(cuda_server *s, cuda_stream *st,
                               cube_storage *pinned)
{
    CUevent ev = NULL;
    cube_error *err = cuda_event_get(s, &ev);
    CUresult r = err ? CUDA_SUCCESS : s->api->cuEventRecord(ev, st->cu);
    if (!err && r != CUDA_SUCCESS) {
        err = cuda_fail(s, r, CUBE_ERR_INTERNAL, "cuEventRecord");
        cuda_event_put(s, ev);
    }
    if (!err && st->inflight_count == st->inflight_cap) {
        size_t cap = st->inflight_cap ? st->inflight_cap * 2 : 16;
        cuda_inflight *grown = malloc(cap * sizeof *grown);
        if (!grown) {
            err = cube_error_new(CUBE_ERR_OUT_OF_MEMORY, "transfer");
            cuda_event_put(s, ev);
        } else {
            for (size_t i = 0; i < st->inflight_count; i++)
                grown[i] =
                    st->inflight[(st->inflight_head + i) % st->inflight_cap];
            free(st->inflight);
            st->inflight = grown;
            st->inflight_head = 0;
            st->inflight_cap = cap;
        }
    }
    if (err) {
        /* Cannot track it: wait for the copy, then give it back. */
        s->api->cuStreamSynchronize(st->cu);
        mem_free(s->pinned, pinned);
        return err;
    }
    cuda_inflight *f = &st->inflight[(st->inflight_head + st->inflight_count) %
                                     st->inflight_cap];
    f->pinned = *pinned;
    f->event = ev;
    st->inflight_count++;
    st->inflight_bytes += pinned->size;
    return NULL;
}

/* A pinned block of `bytes` for a write on `st`, after giving back what
 * finished and, past the limit, waiting for the oldest. */
cube_error *cuda_stage(cuda_server *s, cuda_stream *st, uint64_t bytes,
                       cube_storage *out)
{
    cube_error *err = cuda_inflight_reap(s, st, 0);
    while (!err && st->inflight_count &&
           st->inflight_bytes + bytes > CUDA_INFLIGHT_LIMIT) {
        cuda_inflight *f = &st->inflight[st->inflight_head];
        CUresult r = s->api->cuEventSynchronize(f->event);
        if (r != CUDA_SUCCESS)
            err = cuda_fail(s, r, CUBE_ERR_INTERNAL, "a transfer");
        else
            err = cuda_inflight_reap(s, st, 0);
    }
    return err ? err : mem_alloc(s->pinned, bytes, out);
}
