/* The CUDA context: the device's primary context, made current on each
 * thread before it calls the driver, and the driver's failures turned into
 * cube_errors (a device fault is logged once, when first seen). */
#include <stdarg.h>
#include <stdio.h>

#include "backends/cuda/cuda_internal.h"
#include "cubert/log.h"

cube_error *cuda_enter(cuda_server *s)
{
    CUcontext cur = NULL;
    s->api->cuCtxGetCurrent(&cur);
    if (cur == s->ctx)
        return NULL;
    CUresult r = s->api->cuCtxSetCurrent(s->ctx);
    if (r != CUDA_SUCCESS)
        return cuda_fail(s, r, CUBE_ERR_INTERNAL,
                         "cannot make the CUDA context current");
    return NULL;
}

/* cuda_fail, or with `alloc` cuda_fail_alloc, on fmt's arguments: a
 * failed allocation that met no fault is CUBE_ERR_OUT_OF_MEMORY, or a
 * device fault when the context broke earlier; a fault itself is logged
 * the first time, whatever failed. */
static cube_error *fail_v(cuda_server *s, CUresult r, cube_code code, int alloc,
                          const char *fmt, va_list ap)
    __attribute__((format(printf, 5, 0)));
static cube_error *fail_v(cuda_server *s, CUresult r, cube_code code, int alloc,
                          const char *fmt, va_list ap)
{
    char context[384];
    vsnprintf(context, sizeof context, fmt, ap);
    if (alloc && !cuda_result_is_fault(r)) {
        if (cuda_alloc_code(r, atomic_load(&s->faulted)) ==
            CUBE_ERR_DEVICE_FAULT)
            return cube_error_new(CUBE_ERR_DEVICE_FAULT,
                                  "%s: %s after a device fault; the device "
                                  "context is broken, reopen the client",
                                  context, cuda_result_text(s->api, r));
        return cuda_error(s->api, r, CUBE_ERR_OUT_OF_MEMORY, "%s", context);
    }
    if (alloc)
        code = CUBE_ERR_DEVICE_FAULT;
    if (cuda_result_is_fault(r) && !atomic_exchange(&s->faulted, 1))
        cube_log_write(CUBE_LOG_ERROR, "cuda", "device fault: %s: %s", context,
                       cuda_result_text(s->api, r));
    return cuda_error(s->api, r, code, "%s", context);
}

cube_error *cuda_fail(cuda_server *s, CUresult r, cube_code code,
                      const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    cube_error *err = fail_v(s, r, code, 0, fmt, ap);
    va_end(ap);
    return err;
}

cube_error *cuda_fail_alloc(cuda_server *s, CUresult r, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    /* fail_v picks the code: out of memory, or a device fault. */
    cube_error *err = fail_v(s, r, CUBE_ERR_OUT_OF_MEMORY, 1, fmt, ap);
    va_end(ap);
    return err;
}

cube_error *cuda_context_create(cuda_server *s)
{
    const cuda_api *a = s->api;
    /* The device's primary context, the one the CUDA runtime, PyTorch and
     * CuPy use: device pointers pass between them and cubert as they are.
     * (A context of our own would isolate nothing: the driver keeps a
     * sticky fault per process and device, whatever the context.) */
    CUresult r = a->cuDevicePrimaryCtxRetain(&s->ctx, s->device);
    if (r == CUDA_SUCCESS)
        r = a->cuCtxSetCurrent(s->ctx);
    if (cuda_result_is_fault(r)) {
        /* The fault outlives the clients that saw it: nothing in this
         * process can clear it. */
        if (s->ctx)
            a->cuDevicePrimaryCtxRelease(s->device);
        s->ctx = NULL;
        return cube_error_new(CUBE_ERR_DEVICE_FAULT,
                              "CUDA device %d is unusable in this process "
                              "after a device fault (%s): the CUDA driver "
                              "keeps such a fault until the process exits; "
                              "run the work again in a new process",
                              s->ordinal, cuda_result_text(a, r));
    }
    if (r != CUDA_SUCCESS) {
        if (s->ctx)
            a->cuDevicePrimaryCtxRelease(s->device);
        s->ctx = NULL;
        return cuda_error(a, r, CUBE_ERR_UNAVAILABLE,
                          "cannot use the context of CUDA device %d",
                          s->ordinal);
    }
    return NULL;
}
