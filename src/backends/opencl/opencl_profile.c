/* Profiling windows on OpenCL: a window's start and end are markers on the
 * stream's queue (created with CL_QUEUE_PROFILING_ENABLE), and its
 * duration is the device's time between their ends — the work enqueued in
 * between, as the device ran it. A token is the start marker's event. */
#include "backends/opencl/opencl_internal.h"

/* A marker after the stream's work so far (and after the other streams'
 * work it must follow). */
static cube_error *marker(opencl_server *s, cube_server_stream *stream,
                          cl_event *out)
{
    opencl_stream *st = stream->impl;
    opencl_wait_list w;
    cube_error *err = opencl_waits(s, stream, &w);
    if (err)
        return err;
    cl_int r = s->api->clEnqueueMarkerWithWaitList(st->queue, w.n,
                                                   w.n ? w.events : NULL, out);
    opencl_waits_release(s, &w);
    opencl_enqueued(st);
    if (r != CL_SUCCESS)
        return opencl_fail(r, CUBE_ERR_DEVICE_FAULT,
                           "opencl: a profiling marker");
    return NULL;
}

cube_error *opencl_start_profile(cube_server *server,
                                 cube_server_stream *stream, uint64_t *token)
{
    opencl_server *s = (opencl_server *)server;
    cube_error *err = opencl_fault_check(s);
    if (err)
        return err;
    cl_event start = NULL;
    err = marker(s, stream, &start);
    if (err)
        return err;
    *token = (uint64_t)(uintptr_t)start;
    return NULL;
}

static cube_error *event_end(opencl_server *s, cl_event e, cl_ulong *ns)
{
    cl_int r = s->api->clGetEventProfilingInfo(e, CL_PROFILING_COMMAND_END,
                                               sizeof *ns, ns, NULL);
    return r == CL_SUCCESS
               ? NULL
               : opencl_fail(r, CUBE_ERR_INTERNAL,
                             "opencl: reading a profiling timestamp");
}

cube_error *opencl_end_profile(cube_server *server, cube_server_stream *stream,
                               uint64_t token, double *seconds,
                               cube_timing_method *method)
{
    opencl_server *s = (opencl_server *)server;
    cl_event start = (cl_event)(uintptr_t)token;
    cl_event end = NULL;
    cube_error *err = marker(s, stream, &end);
    cl_int r = CL_SUCCESS;
    if (!err) {
        r = s->api->clWaitForEvents(1, &end);
        if (r != CL_SUCCESS)
            err = opencl_fail(r, CUBE_ERR_DEVICE_FAULT,
                              "opencl: waiting for a profiling window");
    }
    cl_ulong t0 = 0, t1 = 0;
    if (!err)
        err = event_end(s, start, &t0);
    if (!err)
        err = event_end(s, end, &t1);
    if (!err) {
        *seconds = t1 > t0 ? (double)(t1 - t0) * 1e-9 : 0.0;
        *method = CUBE_TIMING_DEVICE;
    }
    if (end)
        s->api->clReleaseEvent(end);
    s->api->clReleaseEvent(start);
    return err ? err : opencl_fault_check(s);
}

void opencl_abandon_profile(cube_server *server, cube_server_stream *stream,
                            uint64_t token)
{
    opencl_server *s = (opencl_server *)server;
    (void)stream;
    s->api->clReleaseEvent((cl_event)(uintptr_t)token);
}
