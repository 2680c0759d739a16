/* CUDA streams, device memory per stream, and ordering across streams
 * (cuda_internal.h describes the scheme). */
#include <stdlib.h>
#include <string.h>

#include "backends/cuda/cuda_internal.h"
#include "cubert/log.h"

/* --- device storage for the memory managers --- */

static cube_error *device_alloc(void *self, uint64_t size, uint64_t align,
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
        return cuda_fail(s, r, CUBE_ERR_OUT_OF_MEMORY,
                         "cuMemAlloc of %llu bytes", (unsigned long long)size);
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
    cube_error_free(cuda_enter(s));
    /* Held through the free: a capture cannot start meanwhile. */
    pthread_mutex_lock(&s->deferred_lock);
    if (atomic_load(&s->captures) == 0) {
        free_now(s, st, address);
        pthread_mutex_unlock(&s->deferred_lock);
        return;
    }
    if (s->deferred_count == s->deferred_cap) {
        size_t cap = s->deferred_cap ? s->deferred_cap * 2 : 16;
        cuda_deferred *grown = realloc(s->deferred, cap * sizeof *grown);
        if (!grown) {
            pthread_mutex_unlock(&s->deferred_lock);
            /* Cannot remember it: leak it rather than break a capture. */
            cube_log_write(CUBE_LOG_WARN, "memory",
                           "out of host memory while a capture runs; %s "
                           "memory at 0x%llx is not freed",
                           st ? "device" : "pinned",
                           (unsigned long long)address);
            return;
        }
        s->deferred = grown;
        s->deferred_cap = cap;
    }
    s->deferred[s->deferred_count].stream = st;
    s->deferred[s->deferred_count].address = address;
    s->deferred_count++;
    pthread_mutex_unlock(&s->deferred_lock);
}

void cuda_free_deferred(cuda_server *s, int force)
{
    pthread_mutex_lock(&s->deferred_lock);
    while (s->deferred_count && (force || atomic_load(&s->captures) == 0)) {
        cuda_deferred d = s->deferred[--s->deferred_count];
        free_now(s, d.stream, d.address);
    }
    pthread_mutex_unlock(&s->deferred_lock);
}

static void device_free(void *self, uint64_t address, uint64_t size)
{
    cuda_stream *st = self;
    (void)size;
    cuda_free_later(st->server, st, address);
}

/* --- streams --- */

static void stream_free(cuda_server *s, cuda_stream *st)
{
    if (st->cu) {
        s->api->cuStreamSynchronize(st->cu);
        cube_error_free(cuda_inflight_reap(s, st, 1));
    }
    if (st->count_host.address)
        mem_free(s->pinned, &st->count_host);
    /* The stream's manager is gone (the client destroys every manager
     * before any stream): what waited for other streams' uses went with
     * its pages (block records go with the server's slabs). */
    st->pending_count = 0;
    pthread_mutex_destroy(&st->pending_lock);
    free(st->pending);
    if (st->event)
        s->api->cuEventDestroy(st->event);
    if (st->done)
        s->api->cuEventDestroy(st->done);
    if (st->cu)
        s->api->cuStreamDestroy(st->cu);
    pthread_mutex_destroy(&st->lock);
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
    pthread_mutex_init(&st->lock, NULL);
    pthread_mutex_init(&st->pending_lock, NULL);
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
    storage->alloc = device_alloc;
    storage->free = device_free;
    stream->impl = st;
    return NULL;
}

void cuda_stream_close(cube_server *server, cube_server_stream *stream)
{
    cuda_server *s = (cuda_server *)server;
    cuda_stream *st = stream->impl;
    if (!st)
        return;
    cube_error_free(cuda_enter(s));
    /* Memory given back while a capture was open still names its stream:
     * the first close frees all of it, while every stream exists. */
    atomic_store(&s->captures, 0);
    cuda_free_deferred(s, 1);
    stream_free(s, st);
    stream->impl = NULL;
}

/* --- ordering --- */

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
    pthread_mutex_lock(&st->lock);
    CUresult r = cuda_stream_record_locked(s, st);
    pthread_mutex_unlock(&st->lock);
    return r ? cuda_fail(s, r, CUBE_ERR_INTERNAL, "cuEventRecord") : NULL;
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

/* Makes `cu` wait for `other` up to `seq`; returns the sequence the wait
 * covers (0 when nothing was needed). */
static cube_error *wait_on(cuda_server *s, CUstream cu, cuda_stream *other,
                           uint64_t seq, uint64_t *covered)
{
    CUresult r = CUDA_SUCCESS;
    pthread_mutex_lock(&other->lock);
    if (other->event_seq < seq && !other->capturing)
        r = cuda_stream_record_locked(s, other);
    /* A capturing stream had its event recorded when the capture began,
     * and nothing captured has run: that record covers what there is. */
    if (r == CUDA_SUCCESS)
        r = s->api->cuStreamWaitEvent(cu, other->event, 0);
    *covered = other->event_seq;
    pthread_mutex_unlock(&other->lock);
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

static void note_use(cuda_stream *st, cuda_block *blk, uint64_t seq)
{
    uint64_t tag = CUDA_TAG(st->index, seq);
    for (int i = 0; i < CUDA_USE_SLOTS; i++) {
        uint64_t cur = atomic_load(&blk->uses[i]);
        while (cur == 0 || CUDA_TAG_INDEX(cur) == st->index) {
            if (atomic_compare_exchange_weak(&blk->uses[i], &cur, tag))
                return;
        }
    }
    atomic_store(&blk->many, 1);
}

/* Before a write on `st`: every other stream's use of the block, issued
 * earlier, must be done first (a write after a read elsewhere). */
static cube_error *wait_for_uses(cuda_server *s, cuda_stream *st,
                                 cuda_block *blk)
{
    cube_error *err = NULL;
    if (atomic_load(&blk->many)) {
        /* More streams than the slots remember: wait for all of them. */
        uint32_t n = cuda_stream_count(s);
        for (uint32_t i = 0; i < n && !err; i++)
            err = cuda_stream_wait_for(s, st, i,
                                       atomic_load(&cuda_stream_at(s, i)->seq));
        return err;
    }
    for (int i = 0; i < CUDA_USE_SLOTS && !err; i++) {
        uint64_t u = atomic_load(&blk->uses[i]);
        if (u && CUDA_TAG_INDEX(u) != st->index)
            err =
                cuda_stream_wait_for(s, st, CUDA_TAG_INDEX(u), CUDA_TAG_SEQ(u));
    }
    return err;
}

cube_error *cuda_block_before_use(cuda_server *s, cuda_stream *st,
                                  cuda_block *blk, int write)
{
    if (st->capturing)
        return cuda_capture_note(st, blk);
    uint64_t w = atomic_load_explicit(&blk->writer, memory_order_acquire);
    cube_error *err = NULL;
    if (w && CUDA_TAG_INDEX(w) != st->index)
        err = cuda_stream_wait_for(s, st, CUDA_TAG_INDEX(w), CUDA_TAG_SEQ(w));
    if (!err && write &&
        atomic_load_explicit(&blk->shared, memory_order_relaxed))
        err = wait_for_uses(s, st, blk);
    return err;
}

int cuda_block_used(cuda_stream *st, cuda_block *blk, uint64_t seq, int written)
{
    if (blk->owner != st &&
        !atomic_load_explicit(&blk->shared, memory_order_relaxed))
        atomic_store(&blk->shared, 1);
    /* Only blocks two streams touch need their uses remembered. */
    if (atomic_load_explicit(&blk->shared, memory_order_relaxed))
        note_use(st, blk, seq);
    if (written)
        atomic_store_explicit(&blk->writer, CUDA_TAG(st->index, seq),
                              memory_order_release);
    return atomic_load_explicit(&blk->shared, memory_order_relaxed);
}

/* --- the memory slots --- */

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
    pthread_mutex_lock(&s->blocks_lock);
    if (!s->free_blocks) {
        cuda_block *slab = malloc(CUDA_BLOCK_SLAB * sizeof *slab);
        void **grown =
            slab ? realloc(s->slabs, (s->slab_count + 1) * sizeof *grown)
                 : NULL;
        if (!grown) {
            free(slab);
            pthread_mutex_unlock(&s->blocks_lock);
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
    pthread_mutex_unlock(&s->blocks_lock);
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
    pthread_mutex_lock(&s->blocks_lock);
    b->next_free = s->free_blocks;
    s->free_blocks = b;
    pthread_mutex_unlock(&s->blocks_lock);
}

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
        cube_error_free(err);
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
    return NULL;
}

/* Whether stream `index` has completed its operation `seq`. Every use of
 * a shared block records the stream's event right after it, so the event
 * covers `seq`; a later record covers more, which only delays the reuse.
 * Nothing is enqueued on the other stream: its thread may be capturing. */
static int use_done(cuda_server *s, uint32_t index, uint64_t seq, int wait)
{
    cuda_stream *o = cuda_stream_at(s, index);
    pthread_mutex_lock(&o->lock);
    int covered = o->event_seq >= seq;
    pthread_mutex_unlock(&o->lock);
    if (!covered)
        return 0; /* its thread records it with its next shared use */
    CUresult r = wait ? s->api->cuEventSynchronize(o->event)
                      : s->api->cuEventQuery(o->event);
    /* Any other answer is a broken context: the memory is moot. */
    return r != CUDA_ERROR_NOT_READY;
}

void cuda_pending_reap(cuda_server *s, cuda_stream *st, int wait)
{
    if (!atomic_load_explicit(&st->has_pending, memory_order_acquire))
        return;
    cube_error_free(cuda_enter(s));
    pthread_mutex_lock(&st->pending_lock);
    size_t kept = 0;
    for (size_t i = 0; i < st->pending_count; i++) {
        cuda_pending_free *p = &st->pending[i];
        int done = 1;
        for (uint32_t k = 0; k < p->count && done; k++)
            done = use_done(s, p->waits[k].index, p->waits[k].seq, wait);
        if (done || wait) {
            mem_free(st->base->memory, &p->blk->inner);
            block_recycle(s, p->blk);
        } else {
            st->pending[kept++] = *p;
        }
    }
    st->pending_count = kept;
    atomic_store(&st->has_pending, kept != 0);
    pthread_mutex_unlock(&st->pending_lock);
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
        /* More users than the slots remember: every stream's latest
         * record (each user recorded its event after its use). */
        uint32_t n = cuda_stream_count(s);
        for (uint32_t i = 0; i < n && p.count < CUDA_USE_SLOTS + 1; i++)
            if (i != owner->index) {
                p.waits[p.count].index = i;
                p.waits[p.count].seq = 0;
                p.count++;
            }
        if (n > CUDA_USE_SLOTS + 2) {
            /* Too many to list: wait here, on the host, for each one. */
            cube_error_free(cuda_enter(s));
            for (uint32_t i = 0; i < n; i++)
                if (i != owner->index)
                    use_done(s, i, 0, 1);
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
    pthread_mutex_lock(&owner->pending_lock);
    if (owner->pending_count == owner->pending_cap) {
        size_t cap = owner->pending_cap ? owner->pending_cap * 2 : 16;
        cuda_pending_free *grown = realloc(owner->pending, cap * sizeof *grown);
        if (!grown) {
            pthread_mutex_unlock(&owner->pending_lock);
            /* Cannot keep it aside: wait for its users here. */
            cube_error_free(cuda_enter(s));
            for (uint32_t k = 0; k < p.count; k++)
                use_done(s, p.waits[k].index, p.waits[k].seq, 1);
            mem_free(owner->base->memory, &blk->inner);
            block_recycle(s, blk);
            return;
        }
        owner->pending = grown;
        owner->pending_cap = cap;
    }
    owner->pending[owner->pending_count++] = p;
    atomic_store_explicit(&owner->has_pending, 1, memory_order_release);
    pthread_mutex_unlock(&owner->pending_lock);
}

void cuda_memory_reclaim(cube_server *server, cube_server_stream *stream)
{
    cuda_server *s = (cuda_server *)server;
    cube_error_free(cuda_enter(s));
    cuda_pending_reap(s, stream->impl, 0);
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
