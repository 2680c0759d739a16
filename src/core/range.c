/* Ranges (cube_range_push / cube_range_pop): named begin and end events of
 * the calling thread in the trace.
 *
 * Each thread that pushes on a client gets a stack in the client's list,
 * found by the thread's serial under ranges_lock; the stack itself is
 * touched only by its thread, and by cube_client_close once no call is in
 * flight, so pushes and pops take the lock only for the lookup. The lane
 * is the thread's own stream, recorded with each level so that a pop
 * writes its end where the begin went even if the thread changed streams
 * in between. The trace writer drops an end whose begin is not open in the
 * running trace, and ends what is open when a trace stops. */
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "core/client_internal.h"
#include "core/trace.h"
#include "cubert/profile.h"

typedef struct core_range_level {
    cube_stream_id lane;
    char name[CUBE_RANGE_NAME_MAX];
} core_range_level;

typedef struct core_range_stack {
    struct core_range_stack *next;
    uint64_t thread; /* the owning thread's serial */
    uint32_t depth;
    core_range_level level[CUBE_RANGE_MAX_DEPTH];
} core_range_stack;

static atomic_uint_fast64_t next_thread_serial = 1;
static _Thread_local uint64_t thread_serial;

static uint64_t this_thread(void)
{
    if (!thread_serial)
        thread_serial = atomic_fetch_add(&next_thread_serial, 1);
    return thread_serial;
}

/* The calling thread's stack on `c`; made when `create` (NULL when memory
 * runs out), else NULL when it has none. */
static core_range_stack *stack_of(cube_client *c, int create)
{
    uint64_t me = this_thread();
    cube_mutex_lock(&c->ranges_lock);
    core_range_stack *s = c->ranges;
    while (s && s->thread != me)
        s = s->next;
    if (!s && create) {
        s = malloc(sizeof *s);
        if (s) {
            s->thread = me;
            s->depth = 0;
            s->next = c->ranges;
            c->ranges = s;
        }
    }
    cube_mutex_unlock(&c->ranges_lock);
    return s;
}

/* Copies at most `cap` - 1 bytes of `name`, cut back to the start of a
 * UTF-8 sequence so that a long name does not end in half a character. */
static void copy_name(char *dst, size_t cap, const char *name)
{
    size_t n = strnlen(name, cap);
    if (n == cap) {
        n = cap - 1;
        while (n > 0 && ((unsigned char)name[n] & 0xC0) == 0x80)
            n--;
    }
    memcpy(dst, name, n);
    dst[n] = '\0';
}

static cube_error *range_push(cube_client *c, const char *name)
{
    if (!name)
        return cube_error_null_argument("cube_range_push", "name");
    if (!core_trace_on())
        return NULL;
    core_range_stack *s = stack_of(c, 1);
    if (!s)
        return cube_error_new(CUBE_ERR_OUT_OF_MEMORY, "cube_range_push");
    if (s->depth == CUBE_RANGE_MAX_DEPTH)
        return cube_error_new(CUBE_ERR_RESOURCE_LIMIT,
                              "cube_range_push: %d ranges of this thread are "
                              "open on the client (CUBE_RANGE_MAX_DEPTH)",
                              CUBE_RANGE_MAX_DEPTH);
    core_range_level *l = &s->level[s->depth++];
    l->lane = core_stream_own();
    copy_name(l->name, sizeof l->name, name);
    atomic_fetch_add_explicit(&c->ranges_open, 1, memory_order_relaxed);
    core_trace_range(1, l->name, l->lane);
    return NULL;
}

static cube_error *range_pop(cube_client *c)
{
    int tracing = core_trace_on();
    /* Nothing open on the client: the common case while no trace runs. */
    if (!tracing &&
        !atomic_load_explicit(&c->ranges_open, memory_order_relaxed))
        return NULL;
    core_range_stack *s = stack_of(c, 0);
    if (!s || !s->depth)
        return tracing ? cube_error_new(CUBE_ERR_INVALID_ARGUMENT,
                                        "cube_range_pop: no range of this "
                                        "thread is open on the client")
                       : NULL;
    core_range_level *l = &s->level[--s->depth];
    atomic_fetch_sub_explicit(&c->ranges_open, 1, memory_order_relaxed);
    core_trace_range(0, l->name, l->lane);
    return NULL;
}

cube_error *cube_range_push(cube_client *c, const char *name)
{
    if (!c)
        return cube_error_null_argument("cube_range_push", "client");
    CORE_CALL(c, "cube_range_push", range_push(c, name));
}

cube_error *cube_range_pop(cube_client *c)
{
    if (!c)
        return cube_error_null_argument("cube_range_pop", "client");
    CORE_CALL(c, "cube_range_pop", range_pop(c));
}

void core_ranges_close(cube_client *c)
{
    cube_mutex_lock(&c->ranges_lock);
    core_range_stack *s = c->ranges;
    c->ranges = NULL;
    cube_mutex_unlock(&c->ranges_lock);
    while (s) {
        core_range_stack *next = s->next;
        while (s->depth) {
            core_range_level *l = &s->level[--s->depth];
            core_trace_range(0, l->name, l->lane);
        }
        free(s);
        s = next;
    }
    atomic_store_explicit(&c->ranges_open, 0, memory_order_relaxed);
}
