/* DLPack 1.x export and import (cubert/dlpack.h). An exported tensor holds
 * a reference of its own on the buffer (a slice handle) that its deleter
 * gives back; an imported tensor becomes wrapped memory whose release
 * calls the tensor's deleter. */
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "core/client_internal.h"
#include "cubert/dlpack.h"
#include "cubert/interop.h"

/* What an exported tensor owns: its handle, and room for its shape and
 * strides. */
typedef struct export_ctx {
    cube_dl_managed_versioned tensor;
    cube_client *client;
    cube_handle handle;
    int64_t shape[CUBE_MAX_RANK];
    int64_t strides[CUBE_MAX_RANK];
} export_ctx;

static void export_deleter(cube_dl_managed_versioned *self)
{
    if (!self)
        return;
    export_ctx *x = self->manager_ctx;
    cube_error_ignore(cube_handle_release(x->client, x->handle),
                      "a DLPack deleter has no caller to report to");
    free(x);
}

static int dtype_ok(cube_dl_dtype t)
{
    if (t.lanes != 1)
        return 0;
    switch (t.code) {
    case CUBE_DL_INT:
    case CUBE_DL_UINT:
        return t.bits == 8 || t.bits == 16 || t.bits == 32 || t.bits == 64;
    case CUBE_DL_FLOAT: return t.bits == 16 || t.bits == 32 || t.bits == 64;
    case CUBE_DL_BFLOAT: return t.bits == 16;
    case CUBE_DL_BOOL: return t.bits == 8;
    }
    return 0;
}

/* The bytes the elements span (0 for an empty tensor), or UINT64_MAX when
 * it overflows or a stride or extent is negative. */
static uint64_t span_bytes(int32_t ndim, const int64_t *shape,
                           const int64_t *strides, uint64_t elem)
{
    uint64_t last = 0; /* index of the last element, in elements */
    uint64_t dense = 1;
    for (int32_t i = ndim - 1; i >= 0; i--) {
        if (shape[i] < 0 || (strides && strides[i] < 0))
            return UINT64_MAX;
        if (shape[i] == 0)
            return 0;
        uint64_t count = (uint64_t)shape[i];
        uint64_t stride = strides ? (uint64_t)strides[i] : dense;
        if (stride && count - 1 > (UINT64_MAX / 2 - last) / stride)
            return UINT64_MAX;
        last += (count - 1) * stride;
        if (!strides) {
            if (dense > UINT64_MAX / 2 / count)
                return UINT64_MAX;
            dense *= count;
        }
    }
    if (last + 1 > UINT64_MAX / elem)
        return UINT64_MAX;
    return (last + 1) * elem;
}

/* Makes the buffer's bytes ready for the consumer, with the stream
 * entered: its native stream waits, or the host does. */
static cube_error *make_ready(cube_client *c, core_stream *st,
                              const cube_binding *b, void *consumer)
    CUBE_REQUIRES(st->lock)
{
    if (consumer == CUBE_DLPACK_NO_SYNC)
        return NULL;
    if (consumer && c->vt->native_ready)
        return c->vt->native_ready(c->server, &st->base, b, consumer);
    return c->vt->sync(c->server, &st->base, b, 1);
}

static cube_error *export_call(cube_client *c, cube_handle h,
                               cube_dl_dtype dtype, int32_t ndim,
                               const int64_t *shape, const int64_t *strides,
                               void *consumer, cube_dl_managed_versioned **out)
{
    CORE_CHECK_CLIENT_OUT(c, out, "cube_dlpack_export");
    *out = NULL;
    if (ndim < 0 || ndim > CUBE_MAX_RANK || (ndim > 0 && !shape))
        return cube_error_new(CUBE_ERR_INVALID_ARGUMENT,
                              "cube_dlpack_export: ndim %d is not in 0..%d "
                              "(or shape is NULL)",
                              (int)ndim, CUBE_MAX_RANK);
    if (!dtype_ok(dtype))
        return cube_error_new(CUBE_ERR_INVALID_ARGUMENT,
                              "cube_dlpack_export: dtype (code %u, %u bits, "
                              "%u lanes) is not one DLPack consumers take "
                              "from cubert",
                              dtype.code, dtype.bits, dtype.lanes);
    uint64_t need = span_bytes(ndim, shape, strides, dtype.bits / 8u);
    if (need == UINT64_MAX)
        return cube_error_new(CUBE_ERR_INVALID_ARGUMENT,
                              "cube_dlpack_export: a negative extent or "
                              "stride, or a span that overflows");
    core_resolved r;
    cube_error *err = core_resolve(c, h, "cube_dlpack_export", &r);
    if (err)
        return err;
    if (need > r.size) {
        err = cube_error_new(CUBE_ERR_INVALID_ARGUMENT,
                             "cube_dlpack_export: the elements span %llu "
                             "bytes; the handle holds %llu",
                             (unsigned long long)need,
                             (unsigned long long)r.size);
        core_resolved_drop(c, &r);
        return err;
    }
    /* A read's claim check, before anything is handed out. */
    err = core_failure_claim_check(c, &r, 1, "cube_dlpack_export");
    if (!err)
        err = core_materialize(c, &r, 1);
    core_stream *st = NULL;
    if (!err)
        err = core_stream_get(c, &st);
    if (!err) {
        cube_binding b = core_binding(&r);
        core_stream_lock(st);
        err = core_stream_refuse_in_capture(st, "cube_dlpack_export");
        if (!err)
            err = make_ready(c, st, &b, consumer);
        core_stream_unlock(st);
        core_fault_note(c, err);
    }
    export_ctx *x = err ? NULL : calloc(1, sizeof *x);
    if (!x) {
        core_resolved_drop(c, &r);
        return err ? err
                   : cube_error_new(CUBE_ERR_OUT_OF_MEMORY,
                                    "cube_dlpack_export");
    }
    /* The tensor's own reference: a slice over the same range. */
    x->client = c;
    err = cube_handle_slice(c, h, 0, r.size, &x->handle);
    if (err) {
        free(x);
        core_resolved_drop(c, &r);
        return err;
    }
    cube_dl_managed_versioned *t = &x->tensor;
    t->version.major = CUBE_DLPACK_MAJOR;
    t->version.minor = CUBE_DLPACK_MINOR;
    t->manager_ctx = x;
    t->deleter = export_deleter;
    t->flags = 0;
    t->dl_tensor.data =
        (void *)(uintptr_t)(r.alloc->storage.address + r.offset);
    t->dl_tensor.device.device_type =
        c->vt->native_stream ? CUBE_DL_CUDA : CUBE_DL_CPU;
    t->dl_tensor.device.device_id =
        c->vt->native_stream ? (int32_t)c->dev->index : 0;
    t->dl_tensor.ndim = ndim;
    t->dl_tensor.dtype = dtype;
    for (int32_t i = 0; i < ndim; i++) {
        x->shape[i] = shape[i];
        x->strides[i] = strides ? strides[i] : 0;
    }
    if (!strides && ndim > 0) {
        int64_t dense = 1;
        for (int32_t i = ndim - 1; i >= 0; i--) {
            x->strides[i] = dense;
            dense *= shape[i];
        }
    }
    t->dl_tensor.shape = x->shape;
    t->dl_tensor.strides = ndim > 0 ? x->strides : NULL;
    t->dl_tensor.byte_offset = 0;
    core_resolved_drop(c, &r);
    *out = t;
    return NULL;
}

cube_error *cube_dlpack_export(cube_client *c, cube_handle h,
                               cube_dl_dtype dtype, int32_t ndim,
                               const int64_t *shape, const int64_t *strides,
                               void *consumer_stream,
                               cube_dl_managed_versioned **out)
{
    if (out)
        *out = NULL;
    CORE_CALL(
        c, "cube_dlpack_export",
        export_call(c, h, dtype, ndim, shape, strides, consumer_stream, out));
}

/* --- import --- */

static void call_versioned_deleter(void *user)
{
    cube_dl_managed_versioned *t = user;
    if (t->deleter)
        t->deleter(t);
}

static void call_legacy_deleter(void *user)
{
    cube_dl_managed *t = user;
    if (t->deleter)
        t->deleter(t);
}

/* Checks a tensor for `c` and wraps the bytes its elements span. */
static cube_error *import_tensor(cube_client *c, const cube_dl_tensor *t,
                                 void (*release)(void *), void *user,
                                 cube_handle *out)
{
    int cuda = c->vt->native_stream != NULL;
    int32_t type = t->device.device_type;
    int right = cuda ? type == CUBE_DL_CUDA &&
                           t->device.device_id == (int32_t)c->dev->index
                     : type == CUBE_DL_CPU || type == CUBE_DL_CUDA_HOST;
    if (!right)
        return cube_error_new(CUBE_ERR_INVALID_ARGUMENT,
                              "cube_dlpack_import: the tensor is on device "
                              "type %d, id %d; the client is %s",
                              (int)type, (int)t->device.device_id, c->device);
    if (t->ndim < 0 || t->ndim > 64 || (t->ndim > 0 && !t->shape) ||
        t->dtype.lanes == 0 || t->dtype.bits == 0 || t->dtype.bits % 8)
        return cube_error_new(CUBE_ERR_INVALID_ARGUMENT,
                              "cube_dlpack_import: a malformed tensor (ndim "
                              "%d, %u-bit elements, %u lanes)",
                              (int)t->ndim, t->dtype.bits, t->dtype.lanes);
    uint64_t elem = (uint64_t)t->dtype.bits / 8u * t->dtype.lanes;
    uint64_t bytes = span_bytes(t->ndim, t->shape, t->strides, elem);
    if (bytes == UINT64_MAX || bytes == 0)
        return cube_error_new(CUBE_ERR_INVALID_ARGUMENT,
                              "cube_dlpack_import: the tensor %s",
                              bytes ? "has a negative extent or stride, or "
                                      "spans more than fits"
                                    : "has no element");
    /* Both sums are checked here, before anything is wrapped: a
     * byte_offset that wraps would start the buffer before `data`, over
     * bytes the tensor does not describe. */
    uint64_t data = (uint64_t)(uintptr_t)t->data;
    if (t->byte_offset > UINT64_MAX - data)
        return cube_error_new(CUBE_ERR_INVALID_ARGUMENT,
                              "cube_dlpack_import: byte_offset %llu from "
                              "data 0x%llx runs past the end of the address "
                              "space",
                              (unsigned long long)t->byte_offset,
                              (unsigned long long)data);
    uint64_t address = data + t->byte_offset;
    if (bytes > UINT64_MAX - address)
        return cube_error_new(CUBE_ERR_INVALID_ARGUMENT,
                              "cube_dlpack_import: the tensor's %llu bytes "
                              "at 0x%llx (data plus byte_offset) run past "
                              "the end of the address space",
                              (unsigned long long)bytes,
                              (unsigned long long)address);
    return cube_wrap_memory(c, address, bytes, release, user, out);
}

/* The arguments both imports take, checked, with *out cleared first. */
static cube_error *import_args(const char *fn, const cube_client *c,
                               const void *t, cube_handle *out)
{
    if (out)
        out->bits = 0;
    if (!c || !t || !out)
        return cube_error_null_argument(fn, !c   ? "client"
                                            : !t ? "tensor"
                                                 : "out");
    return NULL;
}

cube_error *cube_dlpack_import(cube_client *c, cube_dl_managed_versioned *t,
                               cube_handle *out)
{
    cube_error *err = import_args("cube_dlpack_import", c, t, out);
    if (err)
        return err;
    if (t->version.major != 1)
        return cube_error_new(CUBE_ERR_INVALID_ARGUMENT,
                              "cube_dlpack_import: DLPack %u.%u; cubert "
                              "takes 1.x",
                              t->version.major, t->version.minor);
    if (t->flags & CUBE_DL_FLAG_READ_ONLY)
        return cube_error_new(CUBE_ERR_UNSUPPORTED,
                              "cube_dlpack_import: the tensor is read-only, "
                              "and a cubert buffer can be written");
    return import_tensor(c, &t->dl_tensor, call_versioned_deleter, t, out);
}

cube_error *cube_dlpack_import_legacy(cube_client *c, cube_dl_managed *t,
                                      cube_handle *out)
{
    cube_error *err = import_args("cube_dlpack_import_legacy", c, t, out);
    if (err)
        return err;
    return import_tensor(c, &t->dl_tensor, call_legacy_deleter, t, out);
}
