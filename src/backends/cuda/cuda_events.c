/* The server's pool of CUDA events (timing enabled), recycled: profiling
 * windows, pinned blocks in flight, reads and the rings of pipelined reads
 * take theirs from here. */
#include <stdlib.h>

#include "backends/cuda/cuda_internal.h"
#include "base/grow.h"

cube_error *cuda_event_get(cuda_server *s, CUevent *out)
{
    cube_mutex_lock(&s->events_lock);
    if (s->free_event_count) {
        *out = s->free_events[--s->free_event_count];
        cube_mutex_unlock(&s->events_lock);
        return NULL;
    }
    cube_mutex_unlock(&s->events_lock);
    CUresult r = s->api->cuEventCreate(out, CU_EVENT_DEFAULT);
    return r ? cuda_fail(s, r, CUBE_ERR_INTERNAL, "cuEventCreate") : NULL;
}

void cuda_event_put(cuda_server *s, CUevent ev)
{
    cube_mutex_lock(&s->events_lock);
    CUevent *room = cube_grow(s->free_events, s->free_event_count,
                              &s->free_event_cap, sizeof *room, 32);
    if (!room) {
        cube_mutex_unlock(&s->events_lock);
        s->api->cuEventDestroy(ev);
        return;
    }
    s->free_events = room;
    s->free_events[s->free_event_count++] = ev;
    cube_mutex_unlock(&s->events_lock);
}

void cuda_events_destroy(cuda_server *s)
{
    for (size_t i = 0; i < s->free_event_count; i++)
        s->api->cuEventDestroy(s->free_events[i]);
    free(s->free_events);
    s->free_events = NULL;
    s->free_event_count = s->free_event_cap = 0;
}
