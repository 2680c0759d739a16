/* The handle table: generation-checked slots, so a released or foreign
 * handle is refused instead of dereferenced. Handle bits: tag (12) |
 * generation (20) | slot index (32).
 *
 * Locks (docs/threading.md): defer_lock, then the backend's memory locks
 * (backing a dry-run buffer); handles_lock alone, never held while
 * memory is given back.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/client_internal.h"
#include "core/trace.h"
#include "memory/memory_manager.h"

#define GEN_MASK 0xFFFFFu
#define NO_SLOT UINT32_MAX

static cube_handle make_handle(const cube_client *c, uint32_t index,
                               uint32_t gen)
{
    cube_handle h = {((uint64_t)c->tag << 52) | ((uint64_t)gen << 32) | index};
    return h;
}

/* The slot at `index`, or NULL when its chunk does not exist. */
static core_slot *slot_at(cube_client *c, uint32_t index)
{
    core_slot *chunk = atomic_load_explicit(
        &c->chunks[index / CORE_CHUNK_SLOTS], memory_order_acquire);
    return chunk ? &chunk[index % CORE_CHUNK_SLOTS] : NULL;
}

static uint32_t state_gen(uint64_t state)
{
    return (uint32_t)(state >> 32);
}

static uint32_t state_refs(uint64_t state)
{
    return (uint32_t)state;
}

cube_error *core_handles_init(cube_client *c)
{
    /* The chunk pointers are allocated once and never move. */
    c->chunks = calloc(CORE_MAX_CHUNKS, sizeof *c->chunks);
    if (!c->chunks)
        return cube_error_new(CUBE_ERR_OUT_OF_MEMORY,
                              "the handle table (%zu bytes)",
                              (size_t)CORE_MAX_CHUNKS * sizeof *c->chunks);
    cube_mutex_init(&c->handles_lock);
    cube_mutex_init(&c->defer_lock);
    c->free_head = c->free_tail = NO_SLOT;
    atomic_init(&c->hot_slot, NO_SLOT);
    atomic_init(&c->slot_count, 0);
    return NULL;
}

/* Allocation records are recycled through a small stash per thread, so
 * the allocate/release hot path calls neither malloc nor a lock for them.
 * Records are plain memory, not tied to a client. */
#define STASH_SIZE 32

typedef struct record_stash {
    core_alloc *items[STASH_SIZE];
    // cppcheck-suppress unusedStructMember
    int count; /* (cppcheck does not follow _Thread_local) */
    // cppcheck-suppress unusedStructMember
    int registered; /* the drain is set for this thread's exit */
} record_stash;

static _Thread_local record_stash stash;
static pthread_key_t stash_key;
static pthread_once_t stash_once = PTHREAD_ONCE_INIT;

static void stash_drain(void *unused)
{
    (void)unused;
    while (stash.count > 0)
        free(stash.items[--stash.count]);
    /* A record freed by a later exit handler registers the drain again. */
    stash.registered = 0;
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
        if (!stash.registered) {
            /* Registers the drain for this thread's exit, once. */
            pthread_once(&stash_once, stash_key_init);
            pthread_setspecific(stash_key, &stash);
            stash.registered = 1;
        }
        stash.items[stash.count++] = a;
        return;
    }
    free(a);
}

cube_error *core_storage_alloc(cube_client *c, core_stream *st, uint64_t size,
                               cube_storage *out)
{
    if (c->vt->initialize_memory)
        return c->vt->initialize_memory(c->server, &st->base, size, out);
    return mem_alloc(st->base.memory, size, out);
}

static void release_storage(cube_client *c, core_alloc *a)
{
    if (core_trace_on()) {
        char args[64];
        snprintf(args, sizeof args, "{\"bytes\":%llu}",
                 (unsigned long long)a->storage.size);
        core_trace_instant("memory", "release", a->stream->base.id,
                           core_clock_ns(), args);
    }
    if (cube_log_enabled(CUBE_LOG_TRACE))
        cube_log_write(CUBE_LOG_TRACE, "memory", "release %llu bytes",
                       (unsigned long long)a->storage.size);
    if (a->deferred) {
        /* Never backed: nothing to give back. */
        cube_error_free(a->failure);
        free_record(a);
        return;
    }
    if (c->vt->release_memory)
        c->vt->release_memory(c->server, &a->stream->base, &a->storage);
    else
        mem_free(a->stream->base.memory, &a->storage);
    cube_error_free(a->failure);
    free_record(a);
}

static void alloc_ref(core_alloc *a)
{
    atomic_fetch_add_explicit(&a->refs, 1, memory_order_relaxed);
}

static void alloc_unref(cube_client *c, core_alloc *a)
{
    if (atomic_fetch_sub_explicit(&a->refs, 1, memory_order_acq_rel) == 1)
        release_storage(c, a);
}

void core_handles_destroy(cube_client *c)
{
    /* Buffers the caller never released go back with the client. */
    uint32_t count = atomic_load(&c->slot_count);
    for (uint32_t i = 0; i < count; i++) {
        core_slot *s = slot_at(c, i);
        if (!s || state_refs(atomic_load(&s->state)) == 0)
            continue;
        core_alloc *a = s->alloc;
        atomic_store(&s->state, 0);
        s->alloc = NULL;
        if (a)
            alloc_unref(c, a);
    }
    for (uint32_t k = 0; k < CORE_MAX_CHUNKS; k++)
        free(atomic_load(&c->chunks[k]));
    free((void *)c->chunks);
    c->chunks = NULL;
    cube_mutex_destroy(&c->handles_lock);
    cube_mutex_destroy(&c->defer_lock);
}

/* A free slot index, under handles_lock. A new slot starts at
 * generation 1; a reused one has the generation its release set. */
static cube_error *take_slot(cube_client *c, uint32_t *out)
    CUBE_REQUIRES(c->handles_lock);

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
    uint32_t count = atomic_load_explicit(&c->slot_count, memory_order_relaxed);
    if (count == CORE_MAX_CHUNKS * CORE_CHUNK_SLOTS)
        return cube_error_new(CUBE_ERR_OUT_OF_MEMORY,
                              "the handle table is full (%u live handles)",
                              count);
    if (count % CORE_CHUNK_SLOTS == 0) {
        core_slot *chunk = aligned_alloc(_Alignof(core_slot),
                                         CORE_CHUNK_SLOTS * sizeof *chunk);
        if (!chunk)
            return cube_error_new(CUBE_ERR_OUT_OF_MEMORY, "handle table");
        memset(chunk, 0, CORE_CHUNK_SLOTS * sizeof *chunk);
        atomic_store_explicit(&c->chunks[count / CORE_CHUNK_SLOTS], chunk,
                              memory_order_release);
    }
    atomic_store_explicit(&slot_at(c, count)->state, (uint64_t)1 << 32,
                          memory_order_relaxed);
    atomic_store_explicit(&c->slot_count, count + 1, memory_order_release);
    *out = count;
    return NULL;
}

/* Retires a slot whose count reached zero: the generation moves on, so
 * its handles stop resolving, and the slot goes to the free list. The
 * caller then drops the slot's reference on its allocation. */
static void put_slot(cube_client *c, uint32_t i, core_slot *s)
{
    uint32_t gen = (state_gen(atomic_load(&s->state)) + 1) & GEN_MASK;
    if (gen == 0)
        gen = 1;
    s->alloc = NULL;
    s->next_free = NO_SLOT;
    /* Count 0: no lookup pins it from here on, whatever list it is in. */
    atomic_store_explicit(&s->state, (uint64_t)gen << 32, memory_order_release);
    /* It becomes the hot slot; the one it replaces joins the free list. */
    uint32_t old =
        atomic_exchange_explicit(&c->hot_slot, i, memory_order_acq_rel);
    if (old == NO_SLOT)
        return;
    cube_mutex_lock(&c->handles_lock);
    if (c->free_tail == NO_SLOT)
        c->free_head = old;
    else
        slot_at(c, c->free_tail)->next_free = old;
    c->free_tail = old;
    cube_mutex_unlock(&c->handles_lock);
}

/* The live slot `h` names, with its count raised by one (a pin), or NULL.
 * One compare-and-swap decides: a slot being released (count 0) or reused
 * (another generation) is refused. */
static core_slot *pin_slot(cube_client *c, cube_handle h, uint32_t *index)
{
    uint32_t tag = (uint32_t)(h.bits >> 52);
    uint32_t gen = (uint32_t)(h.bits >> 32) & GEN_MASK;
    uint32_t i = (uint32_t)h.bits;
    if (tag != c->tag ||
        i >= atomic_load_explicit(&c->slot_count, memory_order_acquire))
        return NULL;
    core_slot *s = slot_at(c, i);
    if (!s)
        return NULL;
    uint64_t st = atomic_load_explicit(&s->state, memory_order_acquire);
    for (;;) {
        if ((state_gen(st) & GEN_MASK) != gen || state_refs(st) == 0 ||
            state_refs(st) == UINT32_MAX)
            return NULL;
        if (atomic_compare_exchange_weak_explicit(&s->state, &st, st + 1,
                                                  memory_order_acq_rel,
                                                  memory_order_acquire))
            break;
    }
    if (index)
        *index = i;
    return s;
}

/* Drops one count of slot `i`; the last retires it. */
static void unpin_slot(cube_client *c, uint32_t i, core_slot *s)
{
    uint64_t before =
        atomic_fetch_sub_explicit(&s->state, 1, memory_order_acq_rel);
    if (state_refs(before) == 1) {
        core_alloc *a = s->alloc;
        put_slot(c, i, s);
        alloc_unref(c, a);
    }
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
    uint32_t i;
    core_slot *s = pin_slot(c, h, &i);
    if (!s)
        return not_found(c, h, what);
    out->handle = h;
    out->alloc = s->alloc;
    out->offset = s->offset;
    out->size = s->size;
    out->slot = s;
    out->slot_index = i;
    return NULL;
}

void core_resolved_drop(cube_client *c, core_resolved *r)
{
    if (!r->alloc)
        return;
    unpin_slot(c, r->slot_index, r->slot);
    r->alloc = NULL;
    r->slot = NULL;
}

void core_alloc_pin(cube_client *c, core_alloc *a)
{
    (void)c;
    alloc_ref(a);
}

void core_alloc_unpin(cube_client *c, core_alloc *a)
{
    alloc_unref(c, a);
}

cube_error *core_materialize(cube_client *c, const core_resolved *r, size_t n)
{
    cube_error *err = NULL;
    for (size_t i = 0; i < n && !err; i++) {
        core_alloc *a = r[i].alloc;
        if (!a || !atomic_load_explicit(&a->deferred, memory_order_acquire))
            continue;
        cube_mutex_lock(&c->defer_lock);
        if (a->deferred) {
            cube_storage st;
            cube_error *cause =
                core_storage_alloc(c, a->stream, a->storage.size, &st);
            if (cause) {
                err = cube_error_wrap(cause, CUBE_ERR_STORAGE_MAPPING_FAILED,
                                      "buffer 0x%016llx, made in a dry run, "
                                      "could not be backed at its first "
                                      "use (%llu bytes)",
                                      (unsigned long long)r[i].handle.bits,
                                      (unsigned long long)a->storage.size);
            } else {
                a->storage = st;
                atomic_store_explicit(&a->deferred, 0, memory_order_release);
            }
        }
        cube_mutex_unlock(&c->defer_lock);
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

/* Publishes a new slot naming `a` [offset, offset+size), holding one
 * reference on `a`. Takes handles_lock unless the hot slot is free. */
static cube_error *publish(cube_client *c, core_alloc *a, uint64_t offset,
                           uint64_t size, cube_handle *out)
{
    /* The slot released last, without the lock, when there is one. */
    uint32_t i =
        atomic_exchange_explicit(&c->hot_slot, NO_SLOT, memory_order_acq_rel);
    if (i == NO_SLOT) {
        cube_mutex_lock(&c->handles_lock);
        cube_error *err = take_slot(c, &i);
        cube_mutex_unlock(&c->handles_lock);
        if (err)
            return err;
    }
    core_slot *s = slot_at(c, i);
    s->alloc = a;
    s->offset = offset;
    s->size = size;
    alloc_ref(a);
    uint64_t gen =
        state_gen(atomic_load_explicit(&s->state, memory_order_relaxed));
    /* The fields above become visible with the count of one. */
    atomic_store_explicit(&s->state, (gen << 32) | 1, memory_order_release);
    *out = make_handle(c, i, (uint32_t)gen & GEN_MASK);
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
    a->stream = st;
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
        atomic_store_explicit(&a->deferred, 1, memory_order_relaxed);
        a->storage.size = size;
    } else {
        err = core_storage_alloc(c, st, size, &a->storage);
    }
    if (err) {
        free_record(a);
        core_fault_note(c, err);
        return cube_error_prefix(err, "cube_empty(%llu bytes)",
                                 (unsigned long long)size);
    }
    err = publish(c, a, 0, size, out);
    if (err) {
        release_storage(c, a);
        return err;
    }
    if (core_trace_on()) {
        char args[64];
        snprintf(args, sizeof args, "{\"bytes\":%llu}",
                 (unsigned long long)size);
        core_trace_instant("memory", "alloc", st->base.id, core_clock_ns(),
                           args);
    }
    if (cube_log_enabled(CUBE_LOG_TRACE))
        cube_log_write(CUBE_LOG_TRACE, "memory",
                       "alloc %llu bytes -> 0x%016llx",
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
    /* A pin is exactly one more reference. */
    if (pin_slot(c, h, NULL))
        return NULL;
    return not_found(c, h, "cube_handle_retain");
}

cube_error *cube_handle_release(cube_client *c, cube_handle h)
{
    if (!c)
        return cube_error_new(CUBE_ERR_INVALID_ARGUMENT,
                              "cube_handle_release: client is NULL");
    uint32_t tag = (uint32_t)(h.bits >> 52);
    uint32_t gen = (uint32_t)(h.bits >> 32) & GEN_MASK;
    uint32_t i = (uint32_t)h.bits;
    core_slot *s = NULL;
    if (tag == c->tag &&
        i < atomic_load_explicit(&c->slot_count, memory_order_acquire))
        s = slot_at(c, i);
    if (!s)
        return not_found(c, h, "cube_handle_release");
    uint64_t st = atomic_load_explicit(&s->state, memory_order_acquire);
    for (;;) {
        if ((state_gen(st) & GEN_MASK) != gen || state_refs(st) == 0)
            return not_found(c, h, "cube_handle_release");
        if (atomic_compare_exchange_weak_explicit(&s->state, &st, st - 1,
                                                  memory_order_acq_rel,
                                                  memory_order_acquire))
            break;
    }
    if (state_refs(st) == 1) {
        core_alloc *a = s->alloc;
        put_slot(c, i, s);
        alloc_unref(c, a);
    }
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
    uint32_t i;
    core_slot *s = pin_slot(c, h, &i);
    if (!s)
        return not_found(c, h, "cube_handle_slice");
    cube_error *err = NULL;
    if (size == 0 || offset > s->size || size > s->size - offset)
        err =
            cube_error_new(CUBE_ERR_INVALID_ARGUMENT,
                           "cube_handle_slice: range [%llu, +%llu) is empty "
                           "or runs past the handle's %llu bytes",
                           (unsigned long long)offset, (unsigned long long)size,
                           (unsigned long long)s->size);
    else
        err = publish(c, s->alloc, s->offset + offset, size, out);
    unpin_slot(c, i, s);
    return err;
}

cube_error *cube_handle_size(cube_client *c, cube_handle h, uint64_t *out)
{
    if (!c || !out)
        return cube_error_new(CUBE_ERR_INVALID_ARGUMENT,
                              "cube_handle_size: %s is NULL",
                              c ? "out" : "client");
    uint32_t i;
    core_slot *s = pin_slot(c, h, &i);
    if (!s)
        return not_found(c, h, "cube_handle_size");
    *out = s->size;
    unpin_slot(c, i, s);
    return NULL;
}
