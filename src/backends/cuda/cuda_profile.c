/* Profiling windows on CUDA: a pair of events from the server's pool
 * recorded around the window, timed on the device. */
#include <stdlib.h>

#include "backends/cuda/cuda_internal.h"

typedef struct cuda_window {
    CUevent start, end;
} cuda_window;

cube_error *cuda_start_profile(cube_server *server, cube_server_stream *stream,
                               uint64_t *token)
{
    cuda_server *s = (cuda_server *)server;
    cuda_stream *st = NULL;
    cube_error *err = cuda_stream_begin(s, stream, &st);
    if (err)
        return err;
    cuda_window *w = calloc(1, sizeof *w);
    if (!w)
        return cube_error_new(CUBE_ERR_OUT_OF_MEMORY, "profile");
    err = cuda_event_get(s, &w->start);
    if (!err)
        err = cuda_event_get(s, &w->end);
    if (!err) {
        CUresult r = s->api->cuEventRecord(w->start, st->cu);
        if (r != CUDA_SUCCESS)
            err = cuda_fail(s, r, CUBE_ERR_PROFILE, "cuEventRecord");
    }
    if (err) {
        if (w->start)
            cuda_event_put(s, w->start);
        if (w->end)
            cuda_event_put(s, w->end);
        free(w);
        return err;
    }
    *token = (uint64_t)(uintptr_t)w;
    return NULL;
}

static void window_free(cuda_server *s, cuda_window *w)
{
    cuda_event_put(s, w->start);
    cuda_event_put(s, w->end);
    free(w);
}

cube_error *cuda_end_profile(cube_server *server, cube_server_stream *stream,
                             uint64_t token, double *seconds,
                             cube_timing_method *method)
{
    cuda_server *s = (cuda_server *)server;
    cuda_window *w = (cuda_window *)(uintptr_t)token;
    cuda_stream *st = NULL;
    cube_error *err = cuda_stream_begin(s, stream, &st);
    if (err) {
        window_free(s, w);
        return err;
    }
    const cuda_api *a = s->api;
    float ms = 0;
    CUresult r = a->cuEventRecord(w->end, st->cu);
    if (r == CUDA_SUCCESS)
        r = a->cuEventSynchronize(w->end);
    if (r == CUDA_SUCCESS)
        r = a->cuEventElapsedTime(&ms, w->start, w->end);
    window_free(s, w);
    if (r != CUDA_SUCCESS)
        return cuda_fail(s, r, CUBE_ERR_PROFILE, "timing a profile window");
    *seconds = (double)ms / 1e3;
    *method = CUBE_TIMING_DEVICE;
    return cuda_inflight_reap(s, st, 0);
}

void cuda_abandon_profile(cube_server *server, cube_server_stream *stream,
                          uint64_t token)
{
    (void)stream;
    /* The start event may still be pending: re-recording a pooled event
     * later is allowed, so it goes back without a wait. */
    window_free((cuda_server *)server, (cuda_window *)(uintptr_t)token);
}
