/* cube_memory_snapshot: the client's live buffers, listed on demand from
 * its handle table. Nothing is kept per buffer for it beyond what the
 * allocation already has at hand (the first handle's bits, the pool's
 * report position in its storage), so allocating costs nothing more.
 *
 * Each walk has a number; a buffer gets the number of the walk that lists
 * it, so its slices (more slots of the same record) are passed over. Walks
 * of one client take turns under snapshot_lock, or two would overwrite
 * each other's marks.
 *
 * Locks (docs/threading.md): snapshot_lock, then defer_lock (a buffer made
 * in a dry run), the labels' lock (a leaf) and a memory manager's lock
 * (the pool's kind); a last unpin during the walk gives memory back, as a
 * release would, under snapshot_lock.
 */
#include <stddef.h>
#include <string.h>

#include "base/error.h"
#include "core/client_internal.h"
#include "memory/memory_manager.h"

_Static_assert(sizeof(cube_buffer_info) >= CUBE_BUFFER_INFO_V1_SIZE,
               "cube_buffer_info only grows");

typedef struct snapshot_walk {
    uint64_t serial;         /* this walk's number */
    const core_stream *only; /* CUBE_MEMORY_STREAM: that stream; else NULL */
    unsigned char *out;      /* the caller's array */
    size_t stride;           /* out[0].struct_size */
    size_t cap, count;
} snapshot_walk;

static void buffer_info(cube_client *c, core_alloc *a, cube_buffer_info *info)
{
    memset(info, 0, sizeof *info);
    info->struct_size = (uint32_t)sizeof *info;
    info->handle.bits = a->first_handle;
    info->stream = a->stream->base.id;
    info->pool = CUBE_BUFFER_NO_POOL;
    if (atomic_load_explicit(&a->deferred, memory_order_acquire)) {
        /* Backing writes the storage under defer_lock. */
        cube_mutex_lock(&c->defer_lock);
        int deferred = atomic_load_explicit(&a->deferred, memory_order_relaxed);
        info->size = a->storage.size;
        uint32_t pool = a->storage.pool;
        cube_mutex_unlock(&c->defer_lock);
        if (deferred)
            info->flags |= CUBE_BUFFER_DEFERRED;
        else
            info->pool = pool;
    } else {
        info->size = a->storage.size;
        if (a->foreign)
            info->flags |= CUBE_BUFFER_FOREIGN;
        else
            info->pool = a->storage.pool;
    }
    /* A live buffer keeps its stream's layout from being rebuilt, so the
     * position names the pool that served it. */
    if (info->pool != CUBE_BUFFER_NO_POOL &&
        !mem_pool_kind(a->stream->base.memory, info->pool, &info->pool_kind))
        info->pool = CUBE_BUFFER_NO_POOL;
    core_buffer_label(a, info->label);
}

static void visit(cube_client *c, core_alloc *a, void *user)
{
    snapshot_walk *w = user;
    if (w->only && a->stream != w->only)
        return;
    if (a->listed == w->serial)
        return; /* a slice of a buffer already listed */
    a->listed = w->serial;
    if (w->count < w->cap) {
        cube_buffer_info info;
        buffer_info(c, a, &info);
        size_t n = w->stride < sizeof info ? w->stride : sizeof info;
        info.struct_size = (uint32_t)n;
        memcpy(w->out + w->count * w->stride, &info, n);
    }
    w->count++;
}

static cube_error *memory_snapshot_call(cube_client *c, cube_memory_scope scope,
                                        cube_buffer_info *out, size_t cap,
                                        size_t *count)
{
    if (count)
        *count = 0;
    if (!c || !count)
        return cube_error_null_argument("cube_memory_snapshot",
                                        c ? "count" : "client");
    if (cap > 0 && !out)
        return cube_error_new(CUBE_ERR_INVALID_ARGUMENT,
                              "cube_memory_snapshot: out is NULL and cap is "
                              "%zu (pass cap 0 to count only)",
                              cap);
    /* Counting only fills no struct. */
    cube_error *err = core_memory_query_check(
        "cube_memory_snapshot", scope, cap > 0 ? "out[0].struct_size" : NULL,
        cap > 0 ? out[0].struct_size : 0, CUBE_BUFFER_INFO_V1_SIZE,
        "cube_buffer_info");
    if (err)
        return err;
    snapshot_walk w;
    memset(&w, 0, sizeof w);
    w.out = (unsigned char *)out;
    w.stride = cap > 0 ? out[0].struct_size : 0;
    w.cap = cap;
    if (scope == CUBE_MEMORY_STREAM) {
        /* A stream that never existed holds nothing: not worth making. */
        w.only = core_stream_find(c->dev, cube_stream_current(c));
        if (!w.only)
            return NULL;
    }
    cube_mutex_lock(&c->snapshot_lock);
    w.serial = ++c->snapshot_serial;
    core_handles_walk(c, visit, &w);
    cube_mutex_unlock(&c->snapshot_lock);
    *count = w.count;
    return NULL;
}

cube_error *cube_memory_snapshot(cube_client *c, cube_memory_scope scope,
                                 cube_buffer_info *out, size_t cap,
                                 size_t *count)
{
    CORE_CALL(c, "cube_memory_snapshot",
              memory_snapshot_call(c, scope, out, cap, count));
}
