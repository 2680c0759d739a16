/* Sharing memory and streams with other libraries (cubert/interop.h):
 * native views of buffers and streams, foreign writes ordered, and memory
 * cubert did not allocate wrapped as buffers. */
#include <string.h>

#include "core/client_internal.h"
#include "cubert/interop.h"

static cube_error *native_buffer_call(cube_client *c, cube_handle h,
                                      cube_native_buffer *out)
{
    CORE_CHECK_CLIENT_OUT(c, out, "cube_native_buffer_get");
    memset(out, 0, sizeof *out);
    core_resolved r;
    cube_error *err = core_resolve(c, h, "cube_native_buffer_get", &r);
    if (err)
        return err;
    /* A dry run's buffer gets its memory now: an address is a use. */
    err = core_materialize(c, &r, 1);
    if (!err) {
        out->address = r.alloc->storage.address + r.offset;
        out->size = r.size;
        out->host_accessible = c->vt->native_stream == NULL;
    }
    core_resolved_drop(c, &r);
    return err;
}

cube_error *cube_native_buffer_get(cube_client *c, cube_handle h,
                                   cube_native_buffer *out)
{
    CORE_CALL(c, "cube_native_buffer_get", native_buffer_call(c, h, out));
}

static cube_error *native_stream_call(cube_client *c, void **out)
{
    CORE_CHECK_CLIENT_OUT(c, out, "cube_native_stream");
    *out = NULL;
    if (!c->vt->native_stream)
        return NULL;
    core_stream *st = NULL;
    cube_error *err = core_stream_get(c, &st);
    if (!err)
        err = c->vt->native_stream(c->server, &st->base, out);
    core_fault_note(c, err);
    return err;
}

cube_error *cube_native_stream(cube_client *c, void **out)
{
    CORE_CALL(c, "cube_native_stream", native_stream_call(c, out));
}

/* The backend's native_written for `r`, the binding on this frame. */
static cube_error *written_slot(cube_client *c, core_stream *st,
                                const core_resolved *r)
{
    cube_binding b = core_binding(r);
    /* The error returned is the backend's own allocation, not `b`. */
    // cppcheck-suppress returnDanglingLifetime
    return c->vt->native_written(c->server, &st->base, &b);
}

static cube_error *native_written_call(cube_client *c, cube_handle h)
{
    CORE_CHECK_CLIENT(c, "cube_native_written");
    core_resolved r;
    cube_error *err = core_resolve(c, h, "cube_native_written", &r);
    if (err)
        return err;
    core_stream *st = NULL;
    err = core_materialize(c, &r, 1);
    if (!err)
        err = core_stream_get(c, &st);
    if (!err) {
        core_stream_lock(st);
        err = core_stream_refuse_in_capture(st, "cube_native_written");
        if (!err && c->vt->native_written)
            err = written_slot(c, st, &r);
        core_stream_unlock(st);
        core_fault_note(c, err);
    }
    /* The owner of the foreign work says it wrote the range: a write of
     * the whole buffer makes it trustworthy again, as cube_write does. */
    if (!err && r.offset == 0 && r.size == r.alloc->storage.size)
        core_failure_clear(c, r.alloc);
    core_resolved_drop(c, &r);
    return err;
}

cube_error *cube_native_written(cube_client *c, cube_handle h)
{
    CORE_CALL(c, "cube_native_written", native_written_call(c, h));
}

static cube_error *native_wait_call(cube_client *c, void *foreign)
{
    CORE_CHECK_CLIENT(c, "cube_native_wait");
    if (!c->vt->native_wait && foreign)
        return cube_error_new(CUBE_ERR_INVALID_ARGUMENT,
                              "cube_native_wait: the %s backend has no "
                              "native streams (foreign must be NULL)",
                              c->vt->name);
    /* Argument errors first, then a capture's refusal, on every backend
     * alike. */
    core_stream *st = NULL;
    cube_error *err = core_stream_enter_uncaptured(c, "cube_native_wait", &st);
    if (err)
        return err;
    if (c->vt->native_wait)
        err = c->vt->native_wait(c->server, &st->base, foreign);
    core_stream_unlock(st);
    core_fault_note(c, err);
    return err;
}

cube_error *cube_native_wait(cube_client *c, void *foreign)
{
    CORE_CALL(c, "cube_native_wait", native_wait_call(c, foreign));
}

static cube_error *wrap_call(cube_client *c, uint64_t address, uint64_t size,
                             cube_release_fn release, void *user,
                             cube_handle *out)
{
    CORE_CHECK_CLIENT_OUT(c, out, "cube_wrap_memory");
    out->bits = 0;
    if (!address || !size)
        return cube_error_new(CUBE_ERR_INVALID_ARGUMENT,
                              "cube_wrap_memory: %s is 0",
                              address ? "size" : "address");
    if (address % CUBE_WRAP_ALIGNMENT)
        return cube_error_new(CUBE_ERR_INVALID_ARGUMENT,
                              "cube_wrap_memory: address 0x%llx is not a "
                              "multiple of %u",
                              (unsigned long long)address, CUBE_WRAP_ALIGNMENT);
    if (address + size < address)
        return cube_error_new(CUBE_ERR_INVALID_ARGUMENT,
                              "cube_wrap_memory: %llu bytes at 0x%llx run "
                              "past the end of the address space",
                              (unsigned long long)size,
                              (unsigned long long)address);
    if (!c->vt->wrap_memory)
        return cube_error_new(CUBE_ERR_UNSUPPORTED,
                              "cube_wrap_memory: the %s backend cannot wrap "
                              "memory it did not allocate",
                              c->props.backend);
    core_stream *st = NULL;
    cube_error *err = core_stream_get(c, &st);
    if (err)
        return err;
    cube_storage storage;
    memset(&storage, 0, sizeof storage);
    err = c->vt->wrap_memory(c->server, &st->base, address, size, &storage);
    if (err) {
        core_fault_note(c, err);
        return cube_error_prefix(err, "cube_wrap_memory");
    }
    err = core_publish_foreign(c, st, &storage, release, user, out);
    if (err && c->vt->unwrap_memory)
        c->vt->unwrap_memory(c->server, &st->base, &storage);
    return err;
}

cube_error *cube_wrap_memory(cube_client *c, uint64_t address, uint64_t size,
                             cube_release_fn release, void *user,
                             cube_handle *out)
{
    if (out)
        out->bits = 0;
    CORE_CALL(c, "cube_wrap_memory",
              wrap_call(c, address, size, release, user, out));
}
