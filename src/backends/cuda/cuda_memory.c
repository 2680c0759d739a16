/* Device memory: the storage behind each stream's memory manager (the
 * client owns the managers; cuda_stream_open hands them this storage),
 * device and pinned memory whose free waits for the running captures to
 * end, the block
 * records that carry a buffer's cross-stream state, and the memory slots
 * of the vtable: a released block other streams used is set aside until
 * their uses have completed (cuda_internal.h describes the scheme).
 *
 * Locks (docs/threading.md): a stream's pending_lock, then another
 * stream's lock, the stream's memory manager and blocks_lock; dropped
 * before any wait on the host. deferred_lock alone, never held across a
 * free.
 */
#include <stdlib.h>
#include <string.h>

#include "backends/cuda/cuda_internal.h"
#include "base/grow.h"
#include "base/error.h"
#include "cubert/log.h"

/* --- device storage for the memory managers --- */

cube_error *cuda_device_alloc(void *self, uint64_t size, uint64_t align,
                              uint64_t *address)
{
    cuda_stream *st = self;
    cuda_server *s = st->server;
    (void)align; /* cuMemAlloc aligns to at least 256 bytes */
    /* Allocations come from any thread (see server.h). */
    cube_error *err = cuda_enter(s);
    if (err)
        return err;
    /* A capture on this thread must not see the allocation (the capture is
     * rejected at its end for having allocated, not broken now). */
    int mode = CU_STREAM_CAPTURE_MODE_RELAXED;
    s->api->cuThreadExchangeStreamCaptureMode(&mode);
    CUdeviceptr p = 0;
    CUresult r = s->api->cuMemAlloc(&p, (size_t)size);
    s->api->cuThreadExchangeStreamCaptureMode(&mode);
    if (r != CUDA_SUCCESS)
        return cuda_fail_alloc(s, r, "cuMemAlloc of %llu bytes",
                               (unsigned long long)size);
    *address = p;
    return NULL;
}

/* Frees now; call when no capture runs. */
static void free_now(cuda_server *s, cuda_stream *st, uint64_t address)
{
    int mode = CU_STREAM_CAPTURE_MODE_RELAXED;
    s->api->cuThreadExchangeStreamCaptureMode(&mode);
    if (st) {
        /* A page goes back only when no block of it is live, but work
         * queued before its blocks' release may still run; every other
         * stream's use was ordered before the owner's current point when
         * the block was released, so the owner's end is enough. */
        s->api->cuStreamSynchronize(st->cu);
        s->api->cuMemFree((CUdeviceptr)address);
    } else {
        s->api->cuMemFreeHost((void *)(uintptr_t)address);
    }
    s->api->cuThreadExchangeStreamCaptureMode(&mode);
}

void cuda_free_later(cuda_server *s, cuda_stream *st, uint64_t address)
{
    cube_error_ignore(cuda_enter(s), "a free goes on without its context");
    cube_mutex_lock(&s->deferred_lock);
    if (atomic_load(&s->captures) == 0) {
        /* Counted, so no capture starts until it is over; run without the
         * lock, so other threads' frees do not queue behind its wait. */
        s->frees_running++;
        cube_mutex_unlock(&s->deferred_lock);
        free_now(s, st, address);
        cuda_free_end(s);
        return;
    }
    cuda_deferred *room = cube_grow(s->deferred, s->deferred_count,
                                    &s->deferred_cap, sizeof *room, 16);
    if (!room) {
        cube_mutex_unlock(&s->deferred_lock);
        /* Cannot remember it: leak it rather than break a capture. */
        cube_log_write(CUBE_LOG_WARN, "memory",
                       "out of host memory while a capture runs; %s "
                       "memory at 0x%llx is not freed",
                       st ? "device" : "pinned", (unsigned long long)address);
        return;
    }
    s->deferred = room;
    s->deferred[s->deferred_count].stream = st;
    s->deferred[s->deferred_count].address = address;
    s->deferred_count++;
    cube_mutex_unlock(&s->deferred_lock);
}

void cuda_free_deferred(cuda_server *s, int force)
{
    cube_mutex_lock(&s->deferred_lock);
    if ((s->deferred_count == 0 && !s->vm_later) ||
        (!force && atomic_load(&s->captures) != 0)) {
        cube_mutex_unlock(&s->deferred_lock);
        return;
    }
    /* The lists are taken whole and freed without the lock, counted as a
     * running free like any other. */
    cuda_deferred *list = s->deferred;
    size_t n = s->deferred_count;
    cuda_vm_range *ranges = s->vm_later;
    s->deferred = NULL;
    s->deferred_count = s->deferred_cap = 0;
    s->vm_later = NULL;
    s->frees_running++;
    cube_mutex_unlock(&s->deferred_lock);
    while (n > 0) {
        n--;
        free_now(s, list[n].stream, list[n].address);
    }
    free(list);
    cuda_vm_free_ranges(s, ranges);
    cuda_free_end(s);
}

void cuda_device_free(void *self, uint64_t address, uint64_t size)
{
    cuda_stream *st = self;
    (void)size;
    cuda_free_later(st->server, st, address);
}

/* --- block records --- */

/* Block records come from slabs the server owns (all freed with it) and
 * are recycled through a small per-thread cache, so allocating and
 * releasing a buffer takes no lock here; the server-wide list behind it
 * takes the overflow. A cache left by a closed server is recognized by its
 * serial and dropped without being touched. */
#define CUDA_BLOCK_SLAB 256
#define CUDA_BLOCK_CACHE 64

typedef struct block_cache_t {
    // cppcheck-suppress unusedStructMember
    uint64_t serial;
    // cppcheck-suppress unusedStructMember
    cuda_block *head;
    // cppcheck-suppress unusedStructMember
    unsigned count;
} block_cache_t;
static _Thread_local block_cache_t block_cache;

static cuda_block *block_new(cuda_server *s)
{
    if (block_cache.serial == s->serial && block_cache.head) {
        cuda_block *b = block_cache.head;
        block_cache.head = b->next_free;
        block_cache.count--;
        return b;
    }
    cube_mutex_lock(&s->blocks_lock);
    if (!s->free_blocks) {
        cuda_block *slab = malloc(CUDA_BLOCK_SLAB * sizeof *slab);
        void **grown =
            slab ? realloc(s->slabs, (s->slab_count + 1) * sizeof *grown)
                 : NULL;
        if (!grown) {
            free(slab);
            cube_mutex_unlock(&s->blocks_lock);
            return NULL;
        }
        s->slabs = grown;
        s->slabs[s->slab_count++] = slab;
        for (size_t i = 0; i < CUDA_BLOCK_SLAB; i++) {
            slab[i].next_free = s->free_blocks;
            s->free_blocks = &slab[i];
        }
    }
    cuda_block *b = s->free_blocks;
    s->free_blocks = b->next_free;
    cube_mutex_unlock(&s->blocks_lock);
    return b;
}

static void block_recycle(cuda_server *s, cuda_block *b)
{
    if (block_cache.serial != s->serial) {
        block_cache.serial = s->serial;
        block_cache.head = NULL;
        block_cache.count = 0;
    }
    if (block_cache.count < CUDA_BLOCK_CACHE) {
        b->next_free = block_cache.head;
        block_cache.head = b;
        block_cache.count++;
        return;
    }
    cube_mutex_lock(&s->blocks_lock);
    b->next_free = s->free_blocks;
    s->free_blocks = b;
    cube_mutex_unlock(&s->blocks_lock);
}

/* --- the memory slots --- */

cube_error *cuda_initialize_memory(cube_server *server,
                                   cube_server_stream *stream, uint64_t size,
                                   cube_storage *out)
{
    cuda_server *s = (cuda_server *)server;
    cuda_stream *st = stream->impl;
    cuda_pending_reap(s, st, 0);
    cuda_block *blk = block_new(s);
    if (!blk)
        return cube_error_new(CUBE_ERR_OUT_OF_MEMORY, "buffer record");
    cube_error *err = mem_alloc(stream->memory, size, &blk->inner);
    if (err && cube_error_code(err) == CUBE_ERR_OUT_OF_MEMORY &&
        atomic_load(&st->has_pending)) {
        /* Memory set aside for other streams' uses: wait for them. */
        cube_error_ignore(err, "blocks released by other streams' uses are "
                               "waited for and the allocation retried");
        cuda_pending_reap(s, st, 1);
        err = mem_alloc(stream->memory, size, &blk->inner);
    }
    if (err) {
        block_recycle(s, blk);
        return err;
    }
    blk->owner = st;
    /* The memory's previous life ended on the owner stream (uses on other
     * streams completed before it came back): a first use on another
     * stream orders after the owner's work so far. */
    uint64_t seq = atomic_load(&st->seq);
    atomic_init(&blk->writer, seq ? CUDA_TAG(st->index, seq) : 0);
    for (int i = 0; i < CUDA_USE_SLOTS; i++)
        atomic_init(&blk->uses[i], 0);
    atomic_init(&blk->shared, 0);
    atomic_init(&blk->many, 0);
    out->address = blk->inner.address;
    out->size = blk->inner.size;
    out->cookie = blk;
    out->pool = blk->inner.pool;
    return NULL;
}

/* Whether stream `index` has completed its operation `seq`. A write of a
 * shared block records the stream's event right after it; a read does
 * not, so the event is recorded here when it does not cover `seq` yet (a
 * later record covers more, which only delays the reuse). A capturing
 * stream is left alone: its event was recorded when the capture began,
 * after every use that ran before it, and nothing captured runs. */
static int use_done(cuda_server *s, uint32_t index, uint64_t seq, int wait)
{
    cuda_stream *o = cuda_stream_at(s, index);
    cube_mutex_lock(&o->lock);
    if (o->event_seq < seq && !o->capturing) {
        /* As cuda_stream_record_locked (a layer above) records it. */
        uint64_t now = atomic_load(&o->seq);
        if (s->api->cuEventRecord(o->event, o->cu) == CUDA_SUCCESS)
            o->event_seq = now;
    }
    int covered = o->event_seq >= seq;
    cube_mutex_unlock(&o->lock);
    if (!covered)
        return 0;
    CUresult r = wait ? s->api->cuEventSynchronize(o->event)
                      : s->api->cuEventQuery(o->event);
    /* Any other answer is a broken context: the memory is moot. */
    return r != CUDA_ERROR_NOT_READY;
}

/* Gives back the released blocks of `list` whose other-stream uses have
 * completed (all of them, waiting, when `wait`); returns how many are
 * kept, packed at the front. */
static size_t reap_list(cuda_server *s, cuda_stream *st,
                        cuda_pending_free *list, size_t n, int wait)
{
    size_t kept = 0;
    for (size_t i = 0; i < n; i++) {
        cuda_pending_free *p = &list[i];
        int done = 1;
        for (uint32_t k = 0; k < p->count && done; k++)
            done = use_done(s, p->waits[k].index, p->waits[k].seq, wait);
        if (done || wait) {
            mem_free(st->base->memory, &p->blk->inner);
            block_recycle(s, p->blk);
        } else {
            list[kept++] = *p;
        }
    }
    return kept;
}

void cuda_pending_reap(cuda_server *s, cuda_stream *st, int wait)
{
    if (!atomic_load_explicit(&st->has_pending, memory_order_acquire))
        return;
    cube_error_ignore(cuda_enter(s), "reaping goes on without the context: "
                                     "a failed query counts as done");
    cube_mutex_lock(&st->pending_lock);
    if (!wait) {
        /* Queries only: nothing here waits. */
        st->pending_count = reap_list(s, st, st->pending, st->pending_count, 0);
        atomic_store(&st->has_pending, st->pending_count != 0);
        cube_mutex_unlock(&st->pending_lock);
        return;
    }
    /* Waiting on the host: the list is taken whole, so releases from
     * other threads go on into a new one meanwhile. */
    cuda_pending_free *list = st->pending;
    size_t n = st->pending_count;
    st->pending = NULL;
    st->pending_count = st->pending_cap = 0;
    atomic_store(&st->has_pending, 0);
    cube_mutex_unlock(&st->pending_lock);
    reap_list(s, st, list, n, 1);
    free(list);
}

void cuda_release_memory(cube_server *server, cube_server_stream *stream,
                         cube_storage *storage)
{
    (void)stream;
    cuda_server *s = (cuda_server *)server;
    cuda_block *blk = storage->cookie;
    cuda_stream *owner = blk->owner;
    if (!atomic_load(&blk->shared)) {
        /* Only its own stream used it: reuse there is in stream order. */
        mem_free(owner->base->memory, &blk->inner);
        block_recycle(s, blk);
        return;
    }
    cuda_pending_free p;
    memset(&p, 0, sizeof p);
    p.blk = blk;
    if (atomic_load(&blk->many)) {
        /* More users than the slots remember: every other stream's work
         * so far (use_done records its event when it must). */
        uint32_t n = cuda_stream_count(s);
        for (uint32_t i = 0; i < n && p.count < CUDA_USE_SLOTS + 1; i++)
            if (i != owner->index) {
                p.waits[p.count].index = i;
                p.waits[p.count].seq = atomic_load(&cuda_stream_at(s, i)->seq);
                p.count++;
            }
        if (n > CUDA_USE_SLOTS + 2) {
            /* Too many to list: wait here, on the host, for each one. */
            cube_error_ignore(cuda_enter(s), "waiting for other streams' "
                                             "uses goes on without the "
                                             "context");
            for (uint32_t i = 0; i < n; i++)
                if (i != owner->index)
                    use_done(s, i, atomic_load(&cuda_stream_at(s, i)->seq), 1);
            p.count = 0;
        }
    } else {
        for (int i = 0; i < CUDA_USE_SLOTS; i++) {
            uint64_t u = atomic_load(&blk->uses[i]);
            if (u && CUDA_TAG_INDEX(u) != owner->index) {
                p.waits[p.count].index = CUDA_TAG_INDEX(u);
                p.waits[p.count].seq = CUDA_TAG_SEQ(u);
                p.count++;
            }
        }
        uint64_t w = atomic_load(&blk->writer);
        if (w && CUDA_TAG_INDEX(w) != owner->index) {
            p.waits[p.count].index = CUDA_TAG_INDEX(w);
            p.waits[p.count].seq = CUDA_TAG_SEQ(w);
            p.count++;
        }
    }
    if (p.count == 0) {
        mem_free(owner->base->memory, &blk->inner);
        block_recycle(s, blk);
        return;
    }
    cube_mutex_lock(&owner->pending_lock);
    cuda_pending_free *room = cube_grow(owner->pending, owner->pending_count,
                                        &owner->pending_cap, sizeof *room, 16);
    if (!room) {
        cube_mutex_unlock(&owner->pending_lock);
        /* Cannot keep it aside: wait for its users here. */
        cube_error_ignore(cuda_enter(s), "waiting for other streams' "
                                         "uses goes on without the "
                                         "context");
        for (uint32_t k = 0; k < p.count; k++)
            use_done(s, p.waits[k].index, p.waits[k].seq, 1);
        mem_free(owner->base->memory, &blk->inner);
        block_recycle(s, blk);
        return;
    }
    owner->pending = room;
    owner->pending[owner->pending_count++] = p;
    atomic_store_explicit(&owner->has_pending, 1, memory_order_release);
    cube_mutex_unlock(&owner->pending_lock);
}

cube_error *cuda_wrap_memory(cube_server *server, cube_server_stream *stream,
                             uint64_t address, uint64_t size, cube_storage *out)
{
    cuda_server *s = (cuda_server *)server;
    const cuda_api *a = s->api;
    cube_error *err = cuda_enter(s);
    if (err)
        return err;
    /* One driver call for the four facts (this is on the path of every
     * DLPack import): an unknown pointer reads as type 0, no error. */
    unsigned int type = 0;
    int ordinal = -1;
    CUdeviceptr base = 0;
    size_t len = 0;
    int attrs[4] = {
        CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
        CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, CU_POINTER_ATTRIBUTE_RANGE_SIZE};
    void *data[4] = {&type, &ordinal, &base, &len};
    CUresult r =
        a->cuPointerGetAttributes(4, attrs, data, (CUdeviceptr)address);
    if (cuda_result_is_fault(r))
        return cuda_fail(s, r, CUBE_ERR_DEVICE_FAULT, "cuPointerGetAttributes");
    if (r != CUDA_SUCCESS || type == 0)
        return cube_error_new(CUBE_ERR_INVALID_ARGUMENT,
                              "0x%llx is not memory CUDA knows (host memory "
                              "from malloc or the stack?): wrap device "
                              "memory of %s",
                              (unsigned long long)address, s->props.name);
    if (type != CU_MEMORYTYPE_DEVICE)
        return cube_error_new(CUBE_ERR_INVALID_ARGUMENT,
                              "0x%llx is host memory CUDA pinned or mapped, "
                              "not device memory",
                              (unsigned long long)address);
    if (ordinal >= 0 && ordinal != s->ordinal)
        return cube_error_new(CUBE_ERR_INVALID_ARGUMENT,
                              "0x%llx is memory of CUDA device %d; this "
                              "client is on device %d",
                              (unsigned long long)address, ordinal, s->ordinal);
    if (len && address + size > (uint64_t)base + len)
        return cube_error_new(CUBE_ERR_INVALID_ARGUMENT,
                              "%llu bytes at 0x%llx run past the end of "
                              "their allocation (%zu bytes at 0x%llx)",
                              (unsigned long long)size,
                              (unsigned long long)address, len,
                              (unsigned long long)base);
    cuda_block *blk = block_new(s);
    if (!blk)
        return cube_error_new(CUBE_ERR_OUT_OF_MEMORY, "buffer record");
    blk->inner.address = address;
    blk->inner.size = size;
    blk->inner.cookie = NULL;
    blk->owner = stream->impl;
    /* Whatever wrote it before is the caller's to have ordered
     * (cubert/interop.h). */
    atomic_init(&blk->writer, 0);
    for (int i = 0; i < CUDA_USE_SLOTS; i++)
        atomic_init(&blk->uses[i], 0);
    atomic_init(&blk->shared, 0);
    atomic_init(&blk->many, 0);
    out->address = address;
    out->size = size;
    out->cookie = blk;
    return NULL;
}

/* Waits for `cu` unless it has nothing left to run: a query is cheaper
 * than a synchronization that finds the stream idle. */
static void idle_or_synchronize(cuda_server *s, CUstream cu)
{
    if (s->api->cuStreamQuery(cu) != CUDA_SUCCESS)
        s->api->cuStreamSynchronize(cu);
}

void cuda_unwrap_memory(cube_server *server, cube_server_stream *stream,
                        cube_storage *storage)
{
    (void)stream;
    cuda_server *s = (cuda_server *)server;
    cuda_block *blk = storage->cookie;
    cube_error_ignore(cuda_enter(s), "giving foreign memory back goes on "
                                     "without the context");
    /* The owner gets its memory back only when no queued work can touch
     * it: the streams that used it are waited for here (rare: foreign
     * memory comes and goes with a tensor, not per launch). */
    if (!atomic_load(&blk->shared)) {
        idle_or_synchronize(s, blk->owner->cu);
    } else {
        uint32_t n = cuda_stream_count(s);
        for (uint32_t i = 0; i < n; i++)
            idle_or_synchronize(s, cuda_stream_at(s, i)->cu);
    }
    block_recycle(s, blk);
}

void cuda_memory_reclaim(cube_server *server, cube_server_stream *stream)
{
    cuda_server *s = (cuda_server *)server;
    cube_error_ignore(cuda_enter(s), "a reclaim goes on without the context");
    cuda_pending_reap(s, stream->impl, 0);
}
