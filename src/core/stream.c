/* Streams: which stream a thread works on, the client's table of stream
 * objects, and entering a stream to issue work on it.
 *
 * A stream object is created once, the first time its id is used, and
 * lives until the client closes. It carries what backends see
 * (cube_server_stream: id, dense index, memory manager, the backend's own
 * state) and the client's per-stream state (capture, profiling windows,
 * allocation mode) under the stream's lock.
 *
 * Locks: streams_lock (creating a stream; the layout new streams get) may
 * be taken alone or before a memory manager's lock (the manager is built
 * under it); a stream's `lock` is never taken while streams_lock is held.
 */
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "core/client_internal.h"
#include "memory/memory_manager.h"

static atomic_uint_fast64_t next_thread_stream = 1;

/* The calling thread's own stream id (the same for every client). */
static _Thread_local cube_stream_id thread_stream;

/* Streams a thread chose with cube_stream_use, per client. A choice on a
 * client that has closed since is given back by the next
 * cube_stream_use that looks for room. */
#define STREAM_OVERRIDES 8
/* An entry's value is the stream chosen. */
static _Thread_local core_client_entry overrides[STREAM_OVERRIDES];

/* How many of `overrides` are in use: the common case, none, skips the
 * search. */
static _Thread_local int override_count;

/* A thread's own stream id has the top bit set, so ids an application
 * picks below 2^63 never land on some thread's stream by accident. */
#define OWN_STREAM_BIT (1ull << 63)

static cube_stream_id own_stream(void)
{
    if (!thread_stream)
        thread_stream =
            OWN_STREAM_BIT | atomic_fetch_add(&next_thread_stream, 1);
    return thread_stream;
}

cube_stream_id core_stream_own(void)
{
    return own_stream();
}

cube_stream_id cube_stream_current(cube_client *c)
{
    if (!c)
        return 0;
    for (int i = 0; override_count && i < STREAM_OVERRIDES; i++)
        if (overrides[i].client_serial == c->serial)
            return overrides[i].value;
    return own_stream();
}

cube_error *cube_stream_use(cube_client *c, cube_stream_id stream)
{
    if (!c)
        return cube_error_null_argument("cube_stream_use", "client");
    for (int i = 0; i < STREAM_OVERRIDES; i++) {
        if (overrides[i].client_serial == c->serial) {
            if (stream == 0) {
                overrides[i].client_serial = 0;
                override_count--;
            } else {
                overrides[i].value = stream;
            }
            return NULL;
        }
    }
    if (stream == 0)
        return NULL;
    /* Choices on clients closed since give their room back. */
    if (core_client_entry_take(overrides, STREAM_OVERRIDES, &override_count, c,
                               stream) < 0)
        return cube_error_new(CUBE_ERR_RESOURCE_LIMIT,
                              "cube_stream_use: a thread may name streams on "
                              "at most %d open clients at once",
                              STREAM_OVERRIDES);
    return NULL;
}

/* --- the table --- */

core_stream *core_stream_at(const core_device *d, uint32_t index)
{
    if (index >= atomic_load_explicit(&d->stream_count, memory_order_acquire))
        return NULL;
    /* The chunk was published before the count that covers it. */
    core_stream **chunk = atomic_load_explicit(
        &((core_device *)d)->stream_chunks[index / CORE_STREAM_CHUNK],
        memory_order_acquire);
    return chunk[index % CORE_STREAM_CHUNK];
}

cube_server_stream *cube_server_stream_at(const cube_server *server,
                                          uint32_t index)
{
    core_stream *s = core_stream_at(server->device, index);
    return s ? &s->base : NULL;
}

uint32_t cube_server_stream_count(const cube_server *server)
{
    return atomic_load_explicit(&server->device->stream_count,
                                memory_order_acquire);
}

core_stream *core_stream_find(core_device *d, cube_stream_id id)
{
    uint32_t n = atomic_load_explicit(&d->stream_count, memory_order_acquire);
    for (uint32_t i = 0; i < n; i++) {
        core_stream *s = core_stream_at(d, i);
        if (s->base.id == id)
            return s;
    }
    return NULL;
}

static void stream_free(core_device *d, core_stream *s)
{
    if (s->base.memory)
        mem_manager_destroy(s->base.memory);
    s->base.memory = NULL;
    if (d->vt->stream_close)
        d->vt->stream_close(d->server, &s->base);
    cube_mutex_destroy(&s->lock);
    free(s->windows);
    cube_error_free(s->last_failure);
    free(s);
}

/* Creates stream `id` at the next index. Under streams_lock. */
static cube_error *stream_create(core_device *d, cube_stream_id id,
                                 core_stream **out)
    CUBE_REQUIRES(d->streams_lock)
{
    uint32_t index =
        atomic_load_explicit(&d->stream_count, memory_order_relaxed);
    if (index >= CUBE_MAX_STREAMS)
        return cube_error_new(CUBE_ERR_RESOURCE_LIMIT,
                              "a device has at most %u streams",
                              CUBE_MAX_STREAMS);
    uint32_t k = index / CORE_STREAM_CHUNK;
    core_stream **chunk =
        atomic_load_explicit(&d->stream_chunks[k], memory_order_relaxed);
    if (!chunk) {
        chunk = calloc(CORE_STREAM_CHUNK, sizeof *chunk);
        if (!chunk)
            return cube_error_new(CUBE_ERR_OUT_OF_MEMORY, "stream table");
        atomic_store_explicit(&d->stream_chunks[k], chunk,
                              memory_order_release);
    }
    core_stream *s = calloc(1, sizeof *s);
    if (!s)
        return cube_error_new(CUBE_ERR_OUT_OF_MEMORY, "stream");
    s->base.id = id;
    s->base.index = index;
    cube_mutex_init(&s->lock);
    cube_storage_ops ops;
    memset(&ops, 0, sizeof ops);
    cube_error *err = d->vt->stream_open(d->server, &s->base, &ops);
    if (err) {
        cube_mutex_destroy(&s->lock);
        free(s);
        /* A fresh error, not derived from ops. */
        // cppcheck-suppress returnDanglingLifetime
        return err;
    }
    mem_device dev = {d->props.memory_alignment, d->props.memory_total};
    /* An installed layout wins; else the storage's preset (CUDA's
     * expandable pools), else the manager's default. */
    cube_memory_layout start;
    const cube_memory_layout *layout = d->has_layout ? &d->layout : NULL;
    if (!layout && ops.preset &&
        (ops.preset != CUBE_PRESET_EXPANDABLE || ops.map)) {
        err = mem_layout_preset((cube_layout_preset)ops.preset, &dev, &start);
        if (err) {
            stream_free(d, s);
            return err;
        }
        layout = &start;
    }
    err = mem_manager_create(&ops, &dev, layout, &s->base.memory);
    if (err) {
        stream_free(d, s);
        return err;
    }
    chunk[index % CORE_STREAM_CHUNK] = s;
    atomic_store_explicit(&d->stream_count, index + 1, memory_order_release);
    *out = s;
    return NULL;
}

void core_streams_destroy(core_device *d)
{
    uint32_t n = atomic_load(&d->stream_count);
    /* Every manager first: a backend's storage may need its stream state
     * (and other streams') to give memory back. */
    for (uint32_t i = 0; i < n; i++) {
        core_stream *s = core_stream_at(d, i);
        mem_manager_destroy(s->base.memory);
        s->base.memory = NULL;
    }
    for (uint32_t i = 0; i < n; i++)
        stream_free(d, core_stream_at(d, i));
    for (uint32_t k = 0; k < CORE_STREAM_CHUNKS; k++)
        free(atomic_load(&d->stream_chunks[k]));
    memset(d->stream_chunks, 0, sizeof d->stream_chunks);
    atomic_store(&d->stream_count, 0);
}

/* The streams a thread used last (a few: a copy between two clients, or
 * one thread driving every rank's collectives, alternate between them),
 * per thread: streams live as long as their client and client serials
 * are never reused, so a hit needs no lock. */
#define RECENT_STREAMS 4
static _Thread_local struct {
    struct {
        // cppcheck-suppress unusedStructMember
        uint64_t client_serial; /* (cppcheck does not follow _Thread_local) */
        // cppcheck-suppress unusedStructMember
        cube_stream_id id;
        // cppcheck-suppress unusedStructMember
        core_stream *stream;
    } at[RECENT_STREAMS];
    // cppcheck-suppress unusedStructMember
    unsigned last, next; /* the last hit (looked at first), the next to go */
} recent;

cube_error *core_stream_get(cube_client *c, core_stream **out)
{
    cube_stream_id id = cube_stream_current(c);
    if (recent.at[recent.last].client_serial == c->serial &&
        recent.at[recent.last].id == id) {
        *out = recent.at[recent.last].stream;
        return NULL;
    }
    for (unsigned i = 0; i < RECENT_STREAMS; i++)
        if (recent.at[i].client_serial == c->serial && recent.at[i].id == id) {
            recent.last = i;
            *out = recent.at[i].stream;
            return NULL;
        }
    core_device *d = c->dev;
    core_stream *s = core_stream_find(d, id);
    if (!s) {
        cube_mutex_lock(&d->streams_lock);
        /* Another thread naming the same id may have created it. */
        s = core_stream_find(d, id);
        cube_error *err = s ? NULL : stream_create(d, id, &s);
        cube_mutex_unlock(&d->streams_lock);
        if (err)
            return err;
    }
    unsigned slot = recent.next++ % RECENT_STREAMS;
    recent.at[slot].client_serial = c->serial;
    recent.at[slot].id = id;
    recent.at[slot].stream = s;
    recent.last = slot;
    *out = s;
    return NULL;
}

void core_stream_lock(core_stream *s)
{
    cube_mutex_lock(&s->lock);
}

void core_stream_unlock(core_stream *s)
{
    cube_mutex_unlock(&s->lock);
}

cube_error *core_stream_refuse_in_capture(const core_stream *s,
                                          const char *operation)
{
    if (!s->capture)
        return NULL;
    return cube_error_new(CUBE_ERR_GRAPH_STATE,
                          "%s: stream 0x%016llx is capturing a graph; a "
                          "capture cannot record this, so it is refused "
                          "until cube_graph_end",
                          operation, (unsigned long long)s->base.id);
}

cube_error *core_stream_enter(cube_client *c, core_stream **out)
{
    core_stream *s = NULL;
    cube_error *err = core_stream_get(c, &s);
    if (err)
        return err;
    core_stream_lock(s);
    *out = s;
    return NULL;
}

int core_stream_enter_or_drop(cube_client *c, const char *why,
                              core_stream **out)
{
    cube_error *err = core_stream_enter(c, out);
    if (err) {
        cube_error_ignore(err, why);
        return 0;
    }
    return 1;
}

cube_error *core_stream_enter_uncaptured(cube_client *c, const char *operation,
                                         core_stream **out)
{
    core_stream *s = NULL;
    cube_error *err = core_stream_enter(c, &s);
    if (err)
        return err;
    err = core_stream_refuse_in_capture(s, operation);
    if (err) {
        core_stream_unlock(s);
        return err;
    }
    *out = s;
    return NULL;
}

void core_stream_note_failure(core_stream *s, const cube_error *err)
{
    if (!err)
        return;
    s->failures++;
    if (s->window_count) {
        /* Kept only for open windows, which report it as their cause. */
        cube_error_free(s->last_failure);
        s->last_failure = cube_error_clone(err);
    }
}

void core_stream_note_failure_now(cube_client *c, const cube_error *err)
{
    core_stream *s = NULL;
    if (!core_stream_enter_or_drop(c,
                                   "a thread without a stream has no window "
                                   "to note the failure in; the buffers hold "
                                   "it",
                                   &s))
        return;
    core_stream_note_failure(s, err);
    core_stream_unlock(s);
}

static cube_error *stream_ids_call(cube_client *c, cube_stream_id *ids,
                                   size_t capacity, size_t *count)
{
    if (!c || !count || (capacity && !ids))
        return cube_error_new(CUBE_ERR_INVALID_ARGUMENT, "cube_stream_ids: %s",
                              !c       ? "client is NULL"
                              : !count ? "count is NULL"
                                       : "ids is NULL with capacity > 0");
    uint32_t n =
        atomic_load_explicit(&c->dev->stream_count, memory_order_acquire);
    *count = n;
    for (uint32_t i = 0; i < n && i < capacity; i++)
        ids[i] = core_stream_at(c->dev, i)->base.id;
    return NULL;
}

cube_error *cube_stream_ids(cube_client *c, cube_stream_id *ids,
                            size_t capacity, size_t *count)
{
    CORE_CALL(c, "cube_stream_ids", stream_ids_call(c, ids, capacity, count));
}
