/* The handle table: generation-checked slots, so a released or foreign
 * handle is refused instead of dereferenced. Handle bits: tag (12) |
 * generation (20) | slot index (32). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/client_internal.h"
#include "core/trace.h"

#define GEN_MASK 0xFFFFFu
#define NO_SLOT UINT32_MAX

static cube_handle make_handle(const cube_client *c, uint32_t index,
                               uint32_t gen)
{
    cube_handle h = {((uint64_t)c->tag << 52) | ((uint64_t)gen << 32) | index};
    return h;
}

static core_slot *slot_at(cube_client *c, uint32_t index)
{
    return &c->chunks[index / CORE_CHUNK_SLOTS][index % CORE_CHUNK_SLOTS];
}

void core_handles_init(cube_client *c)
{
    pthread_mutex_init(&c->handles_lock, NULL);
    pthread_mutex_init(&c->defer_lock, NULL);
    c->free_head = c->free_tail = NO_SLOT;
}

/* Allocation records are recycled through a small stash per thread, so
 * the allocate/release hot path calls neither malloc nor a lock for them.
 * Records are plain memory, not tied to a client. */
#define STASH_SIZE 32

typedef struct record_stash {
    core_alloc *items[STASH_SIZE];
    int count;
} record_stash;

static _Thread_local record_stash stash;
static pthread_key_t stash_key;
static pthread_once_t stash_once = PTHREAD_ONCE_INIT;

static void stash_drain(void *unused)
{
    (void)unused;
    while (stash.count > 0)
        free(stash.items[--stash.count]);
}

static void stash_key_init(void)
{
    pthread_key_create(&stash_key, stash_drain);
}

static core_alloc *alloc_record(void)
{
    if (stash.count > 0) {
        core_alloc *a = stash.items[--stash.count];
        memset(a, 0, sizeof *a);
        return a;
    }
    return calloc(1, sizeof(core_alloc));
}

static void free_record(core_alloc *a)
{
    if (stash.count < STASH_SIZE) {
        if (stash.count == 0) {
            /* Registers the drain for this thread's exit. */
            pthread_once(&stash_once, stash_key_init);
            pthread_setspecific(stash_key, &stash);
        }
        stash.items[stash.count++] = a;
        return;
    }
    free(a);
}

static void release_storage(cube_client *c, core_alloc *a)
{
    if (core_trace_on()) {
        char args[64];
        snprintf(args, sizeof args, "{\"bytes\":%llu}",
                 (unsigned long long)a->storage.size);
        core_trace_instant("memory", "release", a->stream, core_clock_ns(),
                           args);
    }
    cube_log_write(CUBE_LOG_TRACE, "memory", "release %llu bytes",
                   (unsigned long long)a->storage.size);
    if (a->deferred) {
        /* Never backed: nothing to give back. */
        cube_error_free(a->failure);
        free_record(a);
        return;
    }
    c->vt->release_memory(c->server, a->stream, &a->storage);
    cube_error_free(a->failure);
    free_record(a);
}

void core_handles_destroy(cube_client *c)
{
    /* Buffers the caller never released go back with the client. */
    for (uint32_t i = 0; i < c->slot_count; i++) {
        core_slot *s = slot_at(c, i);
        if (s->refs == 0)
            continue;
        core_alloc *a = s->alloc;
        s->refs = 0;
        s->alloc = NULL;
        if (a && --a->refs == 0)
            release_storage(c, a);
    }
    for (uint32_t k = 0; k < c->chunk_count; k++)
        free(c->chunks[k]);
    free(c->chunks);
    pthread_mutex_destroy(&c->handles_lock);
    pthread_mutex_destroy(&c->defer_lock);
}

/* A free slot index, under handles_lock. */
static cube_error *take_slot(cube_client *c, uint32_t *out)
{
    if (c->free_head != NO_SLOT) {
        uint32_t i = c->free_head;
        core_slot *s = slot_at(c, i);
        c->free_head = s->next_free;
        if (c->free_head == NO_SLOT)
            c->free_tail = NO_SLOT;
        *out = i;
        return NULL;
    }
    if (c->slot_count == UINT32_MAX - 1)
        return cube_error_new(CUBE_ERR_OUT_OF_MEMORY,
                              "the client has 2^32-2 live handles");
    if (c->slot_count % CORE_CHUNK_SLOTS == 0) {
        if (c->chunk_count == c->chunk_cap) {
            uint32_t cap = c->chunk_cap ? c->chunk_cap * 2 : 16;
            core_slot **grown = realloc(c->chunks, cap * sizeof(core_slot *));
            if (!grown)
                return cube_error_new(CUBE_ERR_OUT_OF_MEMORY, "handle table");
            c->chunks = grown;
            c->chunk_cap = cap;
        }
        core_slot *chunk = calloc(CORE_CHUNK_SLOTS, sizeof *chunk);
        if (!chunk)
            return cube_error_new(CUBE_ERR_OUT_OF_MEMORY, "handle table");
        c->chunks[c->chunk_count++] = chunk;
    }
    *out = c->slot_count++;
    slot_at(c, *out)->gen = 1;
    return NULL;
}

static void put_slot(cube_client *c, uint32_t i)
{
    core_slot *s = slot_at(c, i);
    s->gen = (s->gen + 1) & GEN_MASK;
    if (s->gen == 0)
        s->gen = 1;
    s->alloc = NULL;
    s->next_free = NO_SLOT;
    if (c->free_tail == NO_SLOT)
        c->free_head = i;
    else
        slot_at(c, c->free_tail)->next_free = i;
    c->free_tail = i;
}

/* Looks `h` up under handles_lock; NULL when it names no live slot. */
static core_slot *lookup(cube_client *c, cube_handle h, uint32_t *index)
{
    uint32_t tag = (uint32_t)(h.bits >> 52);
    uint32_t gen = (uint32_t)(h.bits >> 32) & GEN_MASK;
    uint32_t i = (uint32_t)h.bits;
    if (tag != c->tag || i >= c->slot_count)
        return NULL;
    core_slot *s = slot_at(c, i);
    if (s->refs == 0 || s->gen != gen)
        return NULL;
    if (index)
        *index = i;
    return s;
}

static cube_error *not_found(const cube_client *c, cube_handle h,
                             const char *what)
{
    uint32_t tag = (uint32_t)(h.bits >> 52);
    if (h.bits == 0)
        return cube_error_new(CUBE_ERR_NOT_FOUND,
                              "%s: the handle is zero (never created)", what);
    if (tag != c->tag)
        return cube_error_new(CUBE_ERR_NOT_FOUND,
                              "%s: handle 0x%016llx belongs to another client",
                              what, (unsigned long long)h.bits);
    return cube_error_new(CUBE_ERR_NOT_FOUND,
                          "%s: handle 0x%016llx was released", what,
                          (unsigned long long)h.bits);
}

cube_error *core_resolve(cube_client *c, cube_handle h, const char *what,
                         core_resolved *out)
{
    pthread_mutex_lock(&c->handles_lock);
    core_slot *s = lookup(c, h, NULL);
    if (!s) {
        pthread_mutex_unlock(&c->handles_lock);
        return not_found(c, h, what);
    }
    s->alloc->refs++;
    out->handle = h;
    out->alloc = s->alloc;
    out->offset = s->offset;
    out->size = s->size;
    pthread_mutex_unlock(&c->handles_lock);
    return NULL;
}

void core_resolved_drop(cube_client *c, core_resolved *r)
{
    if (!r->alloc)
        return;
    pthread_mutex_lock(&c->handles_lock);
    int last = --r->alloc->refs == 0;
    pthread_mutex_unlock(&c->handles_lock);
    if (last)
        release_storage(c, r->alloc);
    r->alloc = NULL;
}

void core_alloc_pin(cube_client *c, core_alloc *a)
{
    pthread_mutex_lock(&c->handles_lock);
    a->refs++;
    pthread_mutex_unlock(&c->handles_lock);
}

void core_alloc_unpin(cube_client *c, core_alloc *a)
{
    pthread_mutex_lock(&c->handles_lock);
    int last = --a->refs == 0;
    pthread_mutex_unlock(&c->handles_lock);
    if (last)
        release_storage(c, a);
}

cube_error *core_materialize(cube_client *c, const core_resolved *r, size_t n)
{
    cube_error *err = NULL;
    for (size_t i = 0; i < n && !err; i++) {
        core_alloc *a = r[i].alloc;
        if (!a)
            continue;
        pthread_mutex_lock(&c->defer_lock);
        if (a->deferred) {
            cube_storage st;
            cube_error *cause = c->vt->initialize_memory(c->server, a->stream,
                                                         a->storage.size, &st);
            if (cause) {
                err = cube_error_wrap(cause, CUBE_ERR_STORAGE_MAPPING_FAILED,
                                      "buffer 0x%016llx, made in a dry run, "
                                      "could not be backed at its first "
                                      "use (%llu bytes)",
                                      (unsigned long long)r[i].handle.bits,
                                      (unsigned long long)a->storage.size);
            } else {
                a->storage = st;
                a->deferred = 0;
            }
        }
        pthread_mutex_unlock(&c->defer_lock);
        if (err)
            core_failure_record(c, a, err);
    }
    return err;
}

cube_binding core_binding(const core_resolved *r)
{
    cube_binding b = {&r->alloc->storage, r->offset, r->size};
    return b;
}

/* Publishes a new slot naming `a` [offset, offset+size). */
static cube_error *publish(cube_client *c, core_alloc *a, uint64_t offset,
                           uint64_t size, cube_handle *out)
{
    uint32_t i = 0;
    cube_error *err = take_slot(c, &i);
    if (err)
        return err;
    core_slot *s = slot_at(c, i);
    s->refs = 1;
    s->alloc = a;
    s->offset = offset;
    s->size = size;
    a->refs++;
    *out = make_handle(c, i, s->gen);
    return NULL;
}

cube_error *cube_empty(cube_client *c, uint64_t size, cube_handle *out)
{
    CORE_CHECK_CLIENT(c, "cube_empty");
    if (!out)
        return cube_error_new(CUBE_ERR_INVALID_ARGUMENT,
                              "cube_empty: out is NULL");
    out->bits = 0;
    if (size == 0)
        return cube_error_new(CUBE_ERR_INVALID_ARGUMENT,
                              "cube_empty: size is 0");
    core_alloc *a = alloc_record();
    if (!a)
        return cube_error_new(CUBE_ERR_OUT_OF_MEMORY, "cube_empty");
    /* Memory calls need no stream order (the backend's memory is
     * thread-safe, see server.h): the stream is only looked up. */
    core_stream *st = NULL;
    cube_error *err = core_stream_get(c, &st);
    if (err) {
        free_record(a);
        return err;
    }
    a->stream = st->id;
    if (cube_dry_run_active()) {
        /* A dry run hands out buffers without backing; they get memory at
         * their first real use. A size that can never fit is still
         * refused now. */
        if (size > c->props.max_buffer_size)
            err = cube_error_new(CUBE_ERR_BUFFER_TOO_BIG,
                                 "a buffer of %llu bytes can never fit: the "
                                 "largest this device holds is %llu bytes",
                                 (unsigned long long)size,
                                 (unsigned long long)c->props.max_buffer_size);
        a->deferred = 1;
        a->storage.size = size;
    } else {
        err = c->vt->initialize_memory(c->server, st->id, size, &a->storage);
    }
    if (err) {
        free_record(a);
        core_fault_note(c, err);
        return cube_error_prefix(err, "cube_empty(%llu bytes)",
                                 (unsigned long long)size);
    }
    pthread_mutex_lock(&c->handles_lock);
    err = publish(c, a, 0, size, out);
    pthread_mutex_unlock(&c->handles_lock);
    if (err) {
        release_storage(c, a);
        return err;
    }
    if (core_trace_on()) {
        char args[64];
        snprintf(args, sizeof args, "{\"bytes\":%llu}",
                 (unsigned long long)size);
        core_trace_instant("memory", "alloc", a->stream, core_clock_ns(), args);
    }
    cube_log_write(CUBE_LOG_TRACE, "memory", "alloc %llu bytes -> 0x%016llx",
                   (unsigned long long)size, (unsigned long long)out->bits);
    return NULL;
}

cube_error *cube_create(cube_client *c, const void *bytes, uint64_t size,
                        cube_handle *out)
{
    CORE_CHECK_CLIENT(c, "cube_create");
    if (!out)
        return cube_error_new(CUBE_ERR_INVALID_ARGUMENT,
                              "cube_create: out is NULL");
    out->bits = 0;
    if (!bytes)
        return cube_error_new(CUBE_ERR_INVALID_ARGUMENT,
                              "cube_create: bytes is NULL");
    cube_handle h = {0};
    cube_error *err = cube_empty(c, size, &h);
    if (err)
        return cube_error_prefix(err, "cube_create");
    cube_copy_desc d = cube_copy_desc_contiguous(h, size, 1);
    const void *src[1] = {bytes};
    uint64_t sizes[1] = {size};
    err = cube_write(c, &d, src, sizes, 1);
    if (err) {
        cube_error_free(cube_handle_release(c, h));
        return cube_error_prefix(err, "cube_create");
    }
    *out = h;
    return NULL;
}

cube_error *cube_handle_retain(cube_client *c, cube_handle h)
{
    if (!c)
        return cube_error_new(CUBE_ERR_INVALID_ARGUMENT,
                              "cube_handle_retain: client is NULL");
    pthread_mutex_lock(&c->handles_lock);
    core_slot *s = lookup(c, h, NULL);
    cube_error *err = NULL;
    if (!s)
        err = not_found(c, h, "cube_handle_retain");
    else if (s->refs == UINT32_MAX)
        err = cube_error_new(CUBE_ERR_INVALID_ARGUMENT,
                             "cube_handle_retain: reference count would "
                             "overflow");
    else
        s->refs++;
    pthread_mutex_unlock(&c->handles_lock);
    return err;
}

cube_error *cube_handle_release(cube_client *c, cube_handle h)
{
    if (!c)
        return cube_error_new(CUBE_ERR_INVALID_ARGUMENT,
                              "cube_handle_release: client is NULL");
    core_alloc *dead = NULL;
    pthread_mutex_lock(&c->handles_lock);
    uint32_t index;
    core_slot *s = lookup(c, h, &index);
    if (!s) {
        pthread_mutex_unlock(&c->handles_lock);
        return not_found(c, h, "cube_handle_release");
    }
    if (--s->refs == 0) {
        core_alloc *a = s->alloc;
        put_slot(c, index);
        if (--a->refs == 0)
            dead = a;
    }
    pthread_mutex_unlock(&c->handles_lock);
    if (dead)
        release_storage(c, dead);
    return NULL;
}

cube_error *cube_handle_slice(cube_client *c, cube_handle h, uint64_t offset,
                              uint64_t size, cube_handle *out)
{
    if (!c)
        return cube_error_new(CUBE_ERR_INVALID_ARGUMENT,
                              "cube_handle_slice: client is NULL");
    if (!out)
        return cube_error_new(CUBE_ERR_INVALID_ARGUMENT,
                              "cube_handle_slice: out is NULL");
    out->bits = 0;
    pthread_mutex_lock(&c->handles_lock);
    core_slot *s = lookup(c, h, NULL);
    cube_error *err = NULL;
    if (!s) {
        err = not_found(c, h, "cube_handle_slice");
    } else if (size == 0 || offset > s->size || size > s->size - offset) {
        err =
            cube_error_new(CUBE_ERR_INVALID_ARGUMENT,
                           "cube_handle_slice: range [%llu, +%llu) is empty "
                           "or runs past the handle's %llu bytes",
                           (unsigned long long)offset, (unsigned long long)size,
                           (unsigned long long)s->size);
    } else {
        err = publish(c, s->alloc, s->offset + offset, size, out);
    }
    pthread_mutex_unlock(&c->handles_lock);
    return err;
}

cube_error *cube_handle_size(cube_client *c, cube_handle h, uint64_t *out)
{
    if (!c || !out)
        return cube_error_new(CUBE_ERR_INVALID_ARGUMENT,
                              "cube_handle_size: %s is NULL",
                              c ? "out" : "client");
    pthread_mutex_lock(&c->handles_lock);
    core_slot *s = lookup(c, h, NULL);
    cube_error *err = NULL;
    if (!s)
        err = not_found(c, h, "cube_handle_size");
    else
        *out = s->size;
    pthread_mutex_unlock(&c->handles_lock);
    return err;
}
