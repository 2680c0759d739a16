/* The handle table: generation-checked slots, so a released or foreign
 * handle is refused instead of dereferenced. Handle bits: tag (12) |
 * generation (26) | slot index (26).
 *
 * No (tag, generation, index) triple is issued twice in a process, so a
 * handle names at most one buffer ever, however many clients come and go:
 * - a tag belongs to one open client at a time (4095 tags: at most 4095
 *   clients are open at once);
 * - a slot's generation only grows, and a slot that has issued its last
 *   generation is spent (never reused) rather than wrapped;
 * - a client that takes a tag another client held before starts each slot
 *   index at the first generation its predecessors did not issue there
 *   (tag_gens: 4 bytes per slot index, kept per tag while the process
 *   lives).
 *
 * Locks (docs/threading.md): defer_lock, then the backend's memory locks
 * (backing a dry-run buffer); handles_lock alone, never held while
 * memory is given back; tags_lock (process-wide) alone. snapshot_lock is
 * snapshot.c's (above defer_lock).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "core/client_internal.h"
#include "core/memory_trace.h"
#include "core/trace.h"
#include "memory/memory_manager.h"

#define TAG_SHIFT CORE_HANDLE_TAG_SHIFT
#define GEN_SHIFT CORE_HANDLE_GEN_SHIFT
#define GEN_MAX CORE_HANDLE_GEN_MAX
#define INDEX_MASK CORE_HANDLE_INDEX_MASK
#define TAG_COUNT (CORE_MAX_CLIENTS + 1u) /* tag 0 is never given */
#define NO_SLOT UINT32_MAX

_Static_assert(INDEX_MASK + (uint64_t)1 ==
                   (uint64_t)CORE_MAX_CHUNKS * CORE_CHUNK_SLOTS,
               "every slot index fits the handle's index bits");
_Static_assert((uint64_t)GEN_MAX + 1 == 1ull << (TAG_SHIFT - GEN_SHIFT) &&
                   (uint64_t)TAG_COUNT == 1ull << (64 - TAG_SHIFT),
               "tag, generation and index fill the 64 bits");

/* The serial of the client holding each tag; 0: free; TAG_SPENT: never
 * given again. Written under tags_lock, read without it. */
#define TAG_SPENT UINT64_MAX
static _Atomic uint64_t tag_holder[TAG_COUNT];

/* Per tag, what the clients that held it issued: for each slot index
 * below `count`, the first generation not issued there yet (0: the index
 * is spent). */
typedef struct tag_gens {
    uint32_t *next;
    uint32_t count;
} tag_gens;

static cube_mutex tags_lock = CUBE_MUTEX_INIT;
static tag_gens tag_gen[TAG_COUNT] CUBE_GUARDED_BY(tags_lock);

static cube_handle make_handle(const cube_client *c, uint32_t index,
                               uint32_t gen)
{
    cube_handle h = {((uint64_t)c->tag << TAG_SHIFT) |
                     ((uint64_t)gen << GEN_SHIFT) | index};
    return h;
}

static uint32_t handle_tag(cube_handle h)
{
    return (uint32_t)(h.bits >> TAG_SHIFT);
}

static uint32_t handle_gen(cube_handle h)
{
    return (uint32_t)(h.bits >> GEN_SHIFT) & GEN_MAX;
}

static uint32_t handle_index(cube_handle h)
{
    return (uint32_t)h.bits & INDEX_MASK;
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

int core_client_is_open(uint32_t tag, uint64_t serial)
{
    return tag < TAG_COUNT &&
           atomic_load_explicit(&tag_holder[tag], memory_order_acquire) ==
               serial;
}

int core_client_entry_take(core_client_entry *t, int n, int *used,
                           const cube_client *c, uint64_t value)
{
    int i = -1;
    for (int k = 0; k < n && i < 0; k++)
        if (t[k].client_serial == 0)
            i = k;
    /* A serial is never reused, so a closed client's entry matches no
     * client and can go. */
    for (int k = 0; k < n && i < 0; k++) {
        if (!core_client_is_open(t[k].client_tag, t[k].client_serial)) {
            t[k].client_serial = 0;
            (*used)--;
            i = k;
        }
    }
    if (i < 0)
        return -1;
    t[i].client_serial = c->serial;
    t[i].client_tag = c->tag;
    t[i].value = value;
    (*used)++;
    return i;
}

/* Gives `c` the lowest free tag, with what its predecessors issued. */
static cube_error *tag_take(cube_client *c)
{
    cube_mutex_lock(&tags_lock);
    for (uint32_t t = 1; t < TAG_COUNT; t++) {
        if (atomic_load_explicit(&tag_holder[t], memory_order_relaxed))
            continue;
        atomic_store_explicit(&tag_holder[t], c->serial, memory_order_release);
        c->tag = t;
        c->gen_start = tag_gen[t].next;
        c->gen_start_count = tag_gen[t].count;
        cube_mutex_unlock(&tags_lock);
        return NULL;
    }
    cube_mutex_unlock(&tags_lock);
    return cube_error_new(CUBE_ERR_RESOURCE_LIMIT,
                          "at most %u clients may be open at once in a "
                          "process",
                          TAG_COUNT - 1);
}

/* The first generation slot `s` has not issued (0: none is left). */
static uint32_t slot_next_gen(const core_slot *s)
{
    uint64_t st = atomic_load_explicit(&s->state, memory_order_relaxed);
    uint32_t gen = state_gen(st);
    if (gen == 0 || state_refs(st) == 0)
        return gen; /* spent, or free with a generation not yet issued */
    return gen < GEN_MAX ? gen + 1 : 0;
}

/* Leaves what `c` issued to the next holder of its tag (at close, before
 * any slot is cleared). When that record cannot grow, the tag is spent:
 * no later client gets it. */
static void tag_save(cube_client *c)
{
    uint32_t count = atomic_load(&c->slot_count);
    cube_mutex_lock(&tags_lock);
    tag_gens *g = &tag_gen[c->tag];
    if (count > g->count) {
        uint32_t *grown = realloc(g->next, count * sizeof *grown);
        if (!grown) {
            atomic_store_explicit(&tag_holder[c->tag], TAG_SPENT,
                                  memory_order_release);
            cube_mutex_unlock(&tags_lock);
            cube_log_write(CUBE_LOG_WARN, "client",
                           "out of memory at close: handle tag %u is not "
                           "given to another client",
                           c->tag);
            return;
        }
        g->next = grown;
        g->count = count;
    }
    for (uint32_t i = 0; i < count; i++)
        g->next[i] = slot_next_gen(slot_at(c, i));
    cube_mutex_unlock(&tags_lock);
}

/* Frees the tag of `c` for the next client (unless it is spent). */
static void tag_give_back(cube_client *c)
{
    cube_mutex_lock(&tags_lock);
    if (atomic_load_explicit(&tag_holder[c->tag], memory_order_relaxed) ==
        c->serial)
        atomic_store_explicit(&tag_holder[c->tag], 0, memory_order_release);
    cube_mutex_unlock(&tags_lock);
}

cube_error *core_handles_init(cube_client *c)
{
    cube_mutex_init(&c->handles_lock);
    cube_mutex_init(&c->defer_lock);
    cube_mutex_init(&c->snapshot_lock);
    c->free_head = c->free_tail = NO_SLOT;
    atomic_init(&c->hot_slot, NO_SLOT);
    atomic_init(&c->slot_count, 0);
    c->tag = 0;
    /* The chunk pointers are allocated once and never move. */
    c->chunks = calloc(CORE_MAX_CHUNKS, sizeof *c->chunks);
    cube_error *err =
        c->chunks ? tag_take(c)
                  : cube_error_new(CUBE_ERR_OUT_OF_MEMORY,
                                   "the handle table (%zu bytes)",
                                   (size_t)CORE_MAX_CHUNKS * sizeof *c->chunks);
    if (err) {
        free((void *)c->chunks);
        c->chunks = NULL;
        cube_mutex_destroy(&c->handles_lock);
        cube_mutex_destroy(&c->defer_lock);
        cube_mutex_destroy(&c->snapshot_lock);
    }
    return err;
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
    if (a->label)
        free(a->label);
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

/* The stream's memory as a counter track of the trace: reserved and
 * live bytes after an allocation or a release. */
static void trace_memory_counter(core_stream *st)
{
    cube_memory_usage u;
    mem_usage(st->base.memory, &u);
    char name[48], args[96];
    snprintf(name, sizeof name, "memory 0x%llx",
             (unsigned long long)st->base.id);
    snprintf(args, sizeof args, "{\"reserved\":%llu,\"live\":%llu}",
             (unsigned long long)u.bytes_reserved,
             (unsigned long long)u.bytes_in_use);
    core_trace_counter(name, st->base.id, args);
}

static void release_storage(cube_client *c, core_alloc *a)
{
    int traced = core_trace_on();
    if (traced) {
        char args[96 + CUBE_LABEL_MAX], label[CUBE_LABEL_MAX + 1];
        /* Labels hold no byte JSON would need escaped. */
        core_buffer_label(a, label);
        snprintf(args, sizeof args,
                 "{\"bytes\":%llu,\"buffer\":\"0x%016llx\"%s%s%s}",
                 (unsigned long long)a->storage.size,
                 (unsigned long long)a->first_handle,
                 label[0] ? ",\"label\":\"" : "", label, label[0] ? "\"" : "");
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
    if (a->foreign) {
        /* Its owner's: once no queued work can touch it, handed back. */
        if (c->vt->unwrap_memory)
            c->vt->unwrap_memory(c->server, &a->stream->base, &a->storage);
        atomic_fetch_sub(&c->foreign_buffers, 1);
        atomic_fetch_sub(&c->foreign_bytes, a->storage.size);
        if (a->release)
            a->release(a->release_user);
        cube_error_free(a->failure);
        free_record(a);
        return;
    }
    core_memory_trace_free(a->trace_id);
    if (c->vt->release_memory)
        c->vt->release_memory(c->server, &a->stream->base, &a->storage);
    else
        mem_free(a->stream->base.memory, &a->storage);
    if (traced)
        trace_memory_counter(a->stream);
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
    tag_save(c);
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
    tag_give_back(c);
    cube_mutex_destroy(&c->handles_lock);
    cube_mutex_destroy(&c->defer_lock);
    cube_mutex_destroy(&c->snapshot_lock);
}

/* A free slot index, under handles_lock. A new slot starts at the first
 * generation the tag's earlier clients did not issue there (1 for an
 * index they never used); a reused one has the generation its release
 * set. An index the earlier clients spent is skipped. */
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
    for (;;) {
        uint32_t count =
            atomic_load_explicit(&c->slot_count, memory_order_relaxed);
        if (count == CORE_MAX_CHUNKS * CORE_CHUNK_SLOTS)
            return cube_error_new(CUBE_ERR_OUT_OF_MEMORY,
                                  "the handle table is full (%u slots)", count);
        if (count % CORE_CHUNK_SLOTS == 0) {
            core_slot *chunk = aligned_alloc(_Alignof(core_slot),
                                             CORE_CHUNK_SLOTS * sizeof *chunk);
            if (!chunk)
                return cube_error_new(CUBE_ERR_OUT_OF_MEMORY, "handle table");
            memset(chunk, 0, CORE_CHUNK_SLOTS * sizeof *chunk);
            atomic_store_explicit(&c->chunks[count / CORE_CHUNK_SLOTS], chunk,
                                  memory_order_release);
        }
        uint32_t gen = count < c->gen_start_count ? c->gen_start[count] : 1;
        /* A spent index keeps state 0: no handle resolves to it. */
        atomic_store_explicit(&slot_at(c, count)->state, (uint64_t)gen << 32,
                              memory_order_relaxed);
        atomic_store_explicit(&c->slot_count, count + 1, memory_order_release);
        if (gen != 0) {
            *out = count;
            return NULL;
        }
    }
}

/* take_slot under handles_lock, kept out of line: inlined, its loop
 * would make publish spill registers on the hot-slot path too. */
#if defined(__GNUC__)
#define OUT_OF_LINE __attribute__((noinline))
#else
#define OUT_OF_LINE
#endif

static OUT_OF_LINE uint32_t take_slot_locked(cube_client *c, cube_error **err)
{
    uint32_t i = NO_SLOT;
    cube_mutex_lock(&c->handles_lock);
    *err = take_slot(c, &i);
    cube_mutex_unlock(&c->handles_lock);
    return i;
}

/* Retires a slot whose count reached zero: the generation moves on, so
 * its handles stop resolving, and the slot goes to the free list; a slot
 * that issued its last generation is spent instead and never reused. The
 * caller then drops the slot's reference on its allocation. */
static void put_slot(cube_client *c, uint32_t i, core_slot *s)
{
    uint32_t gen = state_gen(atomic_load(&s->state)) + 1;
    s->alloc = NULL;
    s->next_free = NO_SLOT;
    if (gen > GEN_MAX) {
        atomic_store_explicit(&s->state, 0, memory_order_release);
        return;
    }
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
    uint32_t gen = handle_gen(h);
    uint32_t i = handle_index(h);
    if (handle_tag(h) != c->tag ||
        i >= atomic_load_explicit(&c->slot_count, memory_order_acquire))
        return NULL;
    core_slot *s = slot_at(c, i);
    if (!s)
        return NULL;
    uint64_t st = atomic_load_explicit(&s->state, memory_order_acquire);
    for (;;) {
        if (state_gen(st) != gen || state_refs(st) == 0 ||
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

void core_handles_walk(cube_client *c,
                       void (*visit)(cube_client *c, core_alloc *a, void *user),
                       void *user)
{
    uint32_t count = atomic_load_explicit(&c->slot_count, memory_order_acquire);
    for (uint32_t i = 0; i < count; i++) {
        core_slot *s = slot_at(c, i);
        if (!s)
            continue;
        /* pin_slot's compare-and-swap, for whichever generation is live:
         * a slot being released (count 0) is passed over. */
        uint64_t st = atomic_load_explicit(&s->state, memory_order_acquire);
        int pinned = 0;
        while (!pinned) {
            if (state_refs(st) == 0 || state_refs(st) == UINT32_MAX)
                break;
            pinned = atomic_compare_exchange_weak_explicit(
                &s->state, &st, st + 1, memory_order_acq_rel,
                memory_order_acquire);
        }
        if (!pinned)
            continue;
        visit(c, s->alloc, user);
        unpin_slot(c, i, s);
    }
}

static cube_error *not_found(const cube_client *c, cube_handle h,
                             const char *what)
{
    uint32_t i = handle_index(h);
    if (h.bits == 0)
        return cube_error_new(CUBE_ERR_NOT_FOUND,
                              "%s: the handle is zero (never created)", what);
    /* Generations at an index only grow: one below where this client
     * began was issued by an earlier holder of the tag. */
    if (handle_tag(h) != c->tag ||
        (i < c->gen_start_count &&
         (c->gen_start[i] == 0 || handle_gen(h) < c->gen_start[i])))
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
                char name[CORE_BUFFER_NAME_MAX];
                core_buffer_name(a, r[i].handle.bits, name);
                err =
                    cube_error_wrap(cause, CUBE_ERR_STORAGE_MAPPING_FAILED,
                                    "buffer %s, made in a dry run, "
                                    "could not be backed at its first "
                                    "use (%llu bytes)",
                                    name, (unsigned long long)a->storage.size);
            } else {
                a->storage = st;
                a->trace_id = core_memory_trace_alloc(st.size);
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
 * reference on `a`. Takes handles_lock unless the hot slot is free.
 * `first`: the buffer's first handle, which names it from then on (set
 * before the slot is visible, so a concurrent snapshot reads it whole). */
static cube_error *publish(cube_client *c, core_alloc *a, uint64_t offset,
                           uint64_t size, cube_handle *out, int first)
{
    /* The slot released last, without the lock, when there is one. */
    uint32_t i =
        atomic_exchange_explicit(&c->hot_slot, NO_SLOT, memory_order_acq_rel);
    if (i == NO_SLOT) {
        cube_error *err = NULL;
        i = take_slot_locked(c, &err);
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
    *out = make_handle(c, i, (uint32_t)gen);
    if (first)
        a->first_handle = out->bits;
    /* The fields above become visible with the count of one. */
    atomic_store_explicit(&s->state, (gen << 32) | 1, memory_order_release);
    return NULL;
}

cube_error *core_publish_foreign(cube_client *c, core_stream *s,
                                 const cube_storage *st,
                                 void (*release)(void *), void *user,
                                 cube_handle *out)
{
    core_alloc *a = alloc_record();
    if (!a)
        return cube_error_new(CUBE_ERR_OUT_OF_MEMORY, "cube_wrap_memory");
    a->stream = s;
    a->storage = *st;
    a->foreign = 1;
    a->release = release;
    a->release_user = user;
    cube_error *err = publish(c, a, 0, st->size, out, 1);
    if (err) {
        free_record(a);
        return err;
    }
    atomic_fetch_add(&c->foreign_buffers, 1);
    atomic_fetch_add(&c->foreign_bytes, st->size);
    return NULL;
}

static cube_error *empty_call(cube_client *c, uint64_t size, cube_handle *out)
{
    CORE_CHECK_CLIENT_OUT(c, out, "cube_empty");
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
    /* A size that can never fit is refused before any memory is asked
     * for (on OpenCL the largest buffer is smaller than the device). */
    if (size > c->props.max_buffer_size)
        err = cube_error_new(CUBE_ERR_BUFFER_TOO_BIG,
                             "a buffer of %llu bytes can never fit: the "
                             "largest this device holds is %llu bytes",
                             (unsigned long long)size,
                             (unsigned long long)c->props.max_buffer_size);
    else if (core_dry_run_active(c)) {
        /* A dry run hands out buffers without backing; they get memory at
         * their first real use. */
        atomic_store_explicit(&a->deferred, 1, memory_order_relaxed);
        a->storage.size = size;
    } else {
        err = core_storage_alloc(c, st, size, &a->storage);
        if (!err)
            a->trace_id = core_memory_trace_alloc(size);
    }
    if (err) {
        free_record(a);
        core_fault_note(c, err);
        return cube_error_prefix(err, "cube_empty(%llu bytes)",
                                 (unsigned long long)size);
    }
    err = publish(c, a, 0, size, out, 1);
    if (err) {
        release_storage(c, a);
        return err;
    }
    if (core_trace_on()) {
        char args[96];
        snprintf(args, sizeof args, "{\"bytes\":%llu,\"buffer\":\"0x%016llx\"}",
                 (unsigned long long)size, (unsigned long long)out->bits);
        core_trace_instant("memory", "alloc", st->base.id, core_clock_ns(),
                           args);
        trace_memory_counter(st);
    }
    if (cube_log_enabled(CUBE_LOG_TRACE))
        cube_log_write(CUBE_LOG_TRACE, "memory",
                       "alloc %llu bytes -> 0x%016llx",
                       (unsigned long long)size, (unsigned long long)out->bits);
    return NULL;
}

cube_error *cube_empty(cube_client *c, uint64_t size, cube_handle *out)
{
    if (out)
        out->bits = 0;
    CORE_CALL(c, "cube_empty", empty_call(c, size, out));
}

static cube_error *create_call(cube_client *c, const void *bytes, uint64_t size,
                               cube_handle *out)
{
    CORE_CHECK_CLIENT_OUT(c, out, "cube_create");
    out->bits = 0;
    if (!bytes)
        return cube_error_null_argument("cube_create", "bytes");
    cube_handle h = {0};
    cube_error *err = cube_empty(c, size, &h);
    if (err)
        return cube_error_prefix(err, "cube_create");
    cube_copy_desc d = cube_copy_desc_contiguous(h, size, 1);
    const void *src[1] = {bytes};
    uint64_t sizes[1] = {size};
    err = cube_write(c, &d, src, sizes, 1);
    if (err) {
        cube_error_ignore(cube_handle_release(c, h),
                          "cube_create reports the write's error");
        return cube_error_prefix(err, "cube_create");
    }
    *out = h;
    return NULL;
}

cube_error *cube_create(cube_client *c, const void *bytes, uint64_t size,
                        cube_handle *out)
{
    if (out)
        out->bits = 0;
    CORE_CALL(c, "cube_create", create_call(c, bytes, size, out));
}

static cube_error *handle_retain_call(cube_client *c, cube_handle h)
{
    if (!c)
        return cube_error_null_argument("cube_handle_retain", "client");
    /* A pin is exactly one more reference. */
    if (pin_slot(c, h, NULL))
        return NULL;
    return not_found(c, h, "cube_handle_retain");
}

cube_error *cube_handle_retain(cube_client *c, cube_handle h)
{
    CORE_CALL(c, "cube_handle_retain", handle_retain_call(c, h));
}

static cube_error *handle_release_call(cube_client *c, cube_handle h)
{
    if (!c)
        return cube_error_null_argument("cube_handle_release", "client");
    uint32_t gen = handle_gen(h);
    uint32_t i = handle_index(h);
    core_slot *s = NULL;
    if (handle_tag(h) == c->tag &&
        i < atomic_load_explicit(&c->slot_count, memory_order_acquire))
        s = slot_at(c, i);
    if (!s)
        return not_found(c, h, "cube_handle_release");
    uint64_t st = atomic_load_explicit(&s->state, memory_order_acquire);
    for (;;) {
        if (state_gen(st) != gen || state_refs(st) == 0)
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

cube_error *cube_handle_release(cube_client *c, cube_handle h)
{
    CORE_CALL(c, "cube_handle_release", handle_release_call(c, h));
}

static cube_error *handle_slice_call(cube_client *c, cube_handle h,
                                     uint64_t offset, uint64_t size,
                                     cube_handle *out)
{
    if (!c)
        return cube_error_null_argument("cube_handle_slice", "client");
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
        err = publish(c, s->alloc, s->offset + offset, size, out, 0);
    unpin_slot(c, i, s);
    return err;
}

cube_error *cube_handle_slice(cube_client *c, cube_handle h, uint64_t offset,
                              uint64_t size, cube_handle *out)
{
    if (out)
        out->bits = 0;
    CORE_CALL(c, "cube_handle_slice",
              handle_slice_call(c, h, offset, size, out));
}

static cube_error *handle_size_call(cube_client *c, cube_handle h,
                                    uint64_t *out)
{
    if (!c || !out)
        return cube_error_null_argument("cube_handle_size",
                                        c ? "out" : "client");
    uint32_t i;
    core_slot *s = pin_slot(c, h, &i);
    if (!s)
        return not_found(c, h, "cube_handle_size");
    *out = s->size;
    unpin_slot(c, i, s);
    return NULL;
}

cube_error *cube_handle_size(cube_client *c, cube_handle h, uint64_t *out)
{
    CORE_CALL(c, "cube_handle_size", handle_size_call(c, h, out));
}

/* Labels: rare to set, read only on error, trace and report paths, so one
 * process-wide lock guards every record's `label`. */
static cube_mutex labels_lock = CUBE_MUTEX_INIT;

void core_buffer_label(const core_alloc *a, char out[CUBE_LABEL_MAX + 1])
{
    out[0] = 0;
    cube_mutex_lock(&labels_lock);
    if (a->label)
        snprintf(out, CUBE_LABEL_MAX + 1, "%s", a->label);
    cube_mutex_unlock(&labels_lock);
}

void core_buffer_name(const core_alloc *a, uint64_t bits,
                      char out[CORE_BUFFER_NAME_MAX])
{
    char label[CUBE_LABEL_MAX + 1];
    core_buffer_label(a, label);
    if (label[0])
        snprintf(out, CORE_BUFFER_NAME_MAX, "0x%016llx \"%s\"",
                 (unsigned long long)bits, label);
    else
        snprintf(out, CORE_BUFFER_NAME_MAX, "0x%016llx",
                 (unsigned long long)bits);
}

/* 1 when `label` may be a label (see cube_handle_set_label). */
static int label_ok(const char *label, size_t *len)
{
    size_t n = 0;
    for (; label[n]; n++) {
        unsigned char ch = (unsigned char)label[n];
        if (n == CUBE_LABEL_MAX || ch < 0x20 || ch > 0x7e || ch == '"' ||
            ch == '\\')
            return 0;
    }
    *len = n;
    return 1;
}

static cube_error *handle_set_label_call(cube_client *c, cube_handle h,
                                         const char *label)
{
    if (!c)
        return cube_error_null_argument("cube_handle_set_label", "client");
    size_t len = 0;
    if (label && !label_ok(label, &len))
        return cube_error_new(
            CUBE_ERR_INVALID_ARGUMENT,
            "cube_handle_set_label: a label is at most %d bytes of printable "
            "ASCII other than '\"' and '\\\\'",
            CUBE_LABEL_MAX);
    uint32_t i;
    core_slot *s = pin_slot(c, h, &i);
    if (!s)
        return not_found(c, h, "cube_handle_set_label");
    char *copy = NULL;
    if (len) {
        copy = malloc(len + 1);
        if (!copy) {
            unpin_slot(c, i, s);
            return cube_error_new(CUBE_ERR_OUT_OF_MEMORY,
                                  "cube_handle_set_label: %zu bytes", len + 1);
        }
        memcpy(copy, label, len + 1);
    }
    core_alloc *a = s->alloc;
    cube_mutex_lock(&labels_lock);
    char *old = a->label;
    a->label = copy;
    cube_mutex_unlock(&labels_lock);
    free(old);
    if (core_trace_on()) {
        /* The alloc event came before any label: this one names it. */
        char args[96 + CUBE_LABEL_MAX];
        snprintf(args, sizeof args,
                 "{\"buffer\":\"0x%016llx\",\"label\":\"%s\"}",
                 (unsigned long long)a->first_handle, copy ? copy : "");
        core_trace_instant("memory", "label", a->stream->base.id,
                           core_clock_ns(), args);
    }
    unpin_slot(c, i, s);
    return NULL;
}

cube_error *cube_handle_set_label(cube_client *c, cube_handle h,
                                  const char *label)
{
    CORE_CALL(c, "cube_handle_set_label", handle_set_label_call(c, h, label));
}

static cube_error *handle_label_call(cube_client *c, cube_handle h, char *out,
                                     size_t cap)
{
    if (!c || !out || cap == 0)
        return cube_error_new(CUBE_ERR_INVALID_ARGUMENT,
                              "cube_handle_label: %s",
                              !c     ? "client is NULL"
                              : !out ? "out is NULL"
                                     : "cap is 0");
    out[0] = 0;
    uint32_t i;
    core_slot *s = pin_slot(c, h, &i);
    if (!s)
        return not_found(c, h, "cube_handle_label");
    char label[CUBE_LABEL_MAX + 1];
    core_buffer_label(s->alloc, label);
    unpin_slot(c, i, s);
    size_t n = strlen(label);
    if (n >= cap)
        return cube_error_new(CUBE_ERR_INVALID_ARGUMENT,
                              "cube_handle_label: the label takes %zu bytes, "
                              "out has %zu",
                              n + 1, cap);
    memcpy(out, label, n + 1);
    return NULL;
}

cube_error *cube_handle_label(cube_client *c, cube_handle h, char *out,
                              size_t cap)
{
    CORE_CALL(c, "cube_handle_label", handle_label_call(c, h, out, cap));
}
