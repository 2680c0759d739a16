/* Writes, reads (blocking and asynchronous) and staging buffers.
 *
 * Futures and client close: a future not yet waited on is on its client's
 * list (futures_lock, a leaf). Its state says who owns its read: the
 * caller, once cube_future_wait claimed it (ATTACHED -> WAITING), or
 * cube_client_close, which claims every one left (ATTACHED -> CLOSING),
 * completes its read and leaves it DETACHED. A wait that finds CLOSING
 * waits for DETACHED and then answers from the future alone; close waits
 * for a WAITING future to leave the list before it tears anything down. */
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/backoff.h"
#include "base/dlist.h"
#include "core/client_internal.h"
#include "core/trace.h"

cube_copy_desc cube_copy_desc_contiguous(cube_handle handle, uint64_t bytes,
                                         uint32_t elem_size)
{
    cube_copy_desc d;
    memset(&d, 0, sizeof d);
    d.handle = handle;
    d.rank = 1;
    d.elem_size = elem_size ? elem_size : 1;
    d.shape[0] = bytes / d.elem_size;
    return d;
}

static int mul_overflows(uint64_t a, uint64_t b, uint64_t *out)
{
    return __builtin_mul_overflow(a, b, out);
}

/* Checks descriptor `i` against its resolved handle and fills `op`. */
static cube_error *make_op(const char *fn, size_t i, const cube_copy_desc *d,
                           const core_resolved *r, cube_copy_op *op)
{
    memset(op, 0, sizeof *op);
    if (d->rank == 0 || d->rank > CUBE_MAX_RANK)
        return cube_error_new(CUBE_ERR_INVALID_ARGUMENT,
                              "%s: descs[%zu].rank %u is not in 1..%d", fn, i,
                              d->rank, CUBE_MAX_RANK);
    if (d->elem_size == 0 || d->elem_size > 64)
        return cube_error_new(CUBE_ERR_INVALID_ARGUMENT,
                              "%s: descs[%zu].elem_size %u is not in 1..64", fn,
                              i, d->elem_size);
    int strided = 0;
    for (uint32_t k = 0; k < d->rank; k++)
        strided |= d->strides[k] != 0;
    uint64_t elems = 1, span = 0; /* span: index of the last element */
    uint64_t row = 1;             /* contiguous stride of dimension k */
    int contiguous = 1;
    for (int k = (int)d->rank - 1; k >= 0; k--) {
        uint64_t extent = d->shape[k];
        if (extent == 0)
            return cube_error_new(CUBE_ERR_INVALID_ARGUMENT,
                                  "%s: descs[%zu].shape[%d] is 0", fn, i, k);
        uint64_t stride = strided ? d->strides[k] : row;
        if (strided && stride == 0 && extent > 1)
            return cube_error_new(CUBE_ERR_INVALID_ARGUMENT,
                                  "%s: descs[%zu].strides[%d] is 0 for an "
                                  "extent of %llu",
                                  fn, i, k, (unsigned long long)extent);
        if (extent > 1 && stride != row)
            contiguous = 0;
        uint64_t reach;
        if (mul_overflows(extent - 1, stride, &reach) ||
            __builtin_add_overflow(span, reach, &span) ||
            mul_overflows(elems, extent, &elems) ||
            mul_overflows(row, extent, &row))
            return cube_error_new(CUBE_ERR_INVALID_ARGUMENT,
                                  "%s: descs[%zu] shape and strides overflow "
                                  "64 bits",
                                  fn, i);
        op->shape[k] = extent;
        if (mul_overflows(stride, d->elem_size, &op->byte_strides[k]))
            return cube_error_new(CUBE_ERR_INVALID_ARGUMENT,
                                  "%s: descs[%zu].strides[%d] overflows", fn, i,
                                  k);
    }
    uint64_t bytes, last_byte;
    if (mul_overflows(elems, d->elem_size, &bytes) ||
        mul_overflows(span, d->elem_size, &last_byte) ||
        __builtin_add_overflow(last_byte, d->elem_size, &last_byte))
        return cube_error_new(CUBE_ERR_INVALID_ARGUMENT,
                              "%s: descs[%zu] size overflows 64 bits", fn, i);
    if (last_byte > r->size)
        return cube_error_new(CUBE_ERR_INVALID_ARGUMENT,
                              "%s: descs[%zu] reaches byte %llu but handle "
                              "0x%016llx names %llu bytes",
                              fn, i, (unsigned long long)last_byte,
                              (unsigned long long)d->handle.bits,
                              (unsigned long long)r->size);
    op->binding = core_binding(r);
    op->rank = d->rank;
    op->elem_size = d->elem_size;
    op->bytes = bytes;
    op->contiguous = contiguous;
    return NULL;
}

/* Validates and resolves a batch of descriptors with host buffers. On
 * success the caller owns *res (pinned) and *ops. */
static cube_error *prepare(cube_client *c, const char *fn,
                           const char *buffers_name, const char *sizes_name,
                           const cube_copy_desc *descs, const void *buffers,
                           const uint64_t *sizes, size_t n, core_resolved **res,
                           cube_copy_op **ops)
{
    *res = NULL;
    *ops = NULL;
    if (n == 0)
        return cube_error_new(CUBE_ERR_INVALID_ARGUMENT, "%s: n is 0", fn);
    if (!descs || !buffers || !sizes)
        return cube_error_null_argument(fn, !descs     ? "descs"
                                            : !buffers ? buffers_name
                                                       : sizes_name);
    const void *const *bufs = buffers;
    core_resolved *r = calloc(n, sizeof *r);
    cube_copy_op *o = calloc(n, sizeof *o);
    if (!r || !o) {
        free(r);
        free(o);
        return cube_error_new(CUBE_ERR_OUT_OF_MEMORY, "%s", fn);
    }
    cube_error *err = NULL;
    size_t pinned = 0;
    for (size_t i = 0; i < n && !err; i++) {
        if (!bufs[i]) {
            err = cube_error_new(CUBE_ERR_INVALID_ARGUMENT,
                                 "%s: %s[%zu] is NULL", fn, buffers_name, i);
            break;
        }
        err = core_resolve(c, descs[i].handle, fn, &r[i]);
        if (err) {
            err = cube_error_prefix(err, "descs[%zu]", i);
            break;
        }
        pinned++;
        err = make_op(fn, i, &descs[i], &r[i], &o[i]);
        if (!err && o[i].bytes != sizes[i])
            err =
                cube_error_new(CUBE_ERR_INVALID_ARGUMENT,
                               "%s: %s[%zu] is %llu bytes but descs[%zu] "
                               "covers %llu",
                               fn, sizes_name, i, (unsigned long long)sizes[i],
                               i, (unsigned long long)o[i].bytes);
    }
    if (err) {
        for (size_t j = 0; j < pinned; j++)
            core_resolved_drop(c, &r[j]);
        free(r);
        free(o);
        return err;
    }
    *res = r;
    *ops = o;
    return NULL;
}

/* One trace span for a batch of copies: its byte count and size. */
static void trace_copy(const char *name, cube_stream_id stream, uint64_t t0,
                       const cube_copy_op *ops, size_t n)
{
    uint64_t bytes = 0;
    for (size_t i = 0; i < n; i++)
        bytes += ops[i].bytes;
    char args[96];
    snprintf(args, sizeof args, "{\"bytes\":%llu,\"descriptors\":%zu}",
             (unsigned long long)bytes, n);
    core_trace_span("copy", name, stream, t0, core_clock_ns(), args);
}

static void unpin(cube_client *c, core_resolved *r, size_t n)
{
    for (size_t i = 0; r && i < n; i++)
        core_resolved_drop(c, &r[i]);
    free(r);
}

/* CUBE_ERR_GRAPH_STATE when the stream is capturing. Asked before the
 * failure store and before a buffer made in a dry run is backed (which
 * must not happen under the stream's lock); the call asks again when it
 * holds the stream to issue the copy, for a capture begun meanwhile on a
 * stream shared with another thread. */
static cube_error *refuse_in_capture(core_stream *st, const char *operation)
{
    core_stream_lock(st);
    cube_error *err = core_stream_refuse_in_capture(st, operation);
    core_stream_unlock(st);
    return err;
}

static cube_error *write_call(cube_client *c, const cube_copy_desc *descs,
                              const void *const *sources, const uint64_t *sizes,
                              size_t n)
{
    CORE_CHECK_CLIENT(c, "cube_write");
    core_resolved *r = NULL;
    cube_copy_op *ops = NULL;
    cube_error *err = prepare(c, "cube_write", "sources", "source_sizes", descs,
                              sources, sizes, n, &r, &ops);
    if (err)
        return err;
    /* A capture refuses the write before anything else happens: a buffer
     * made in a dry run stays without memory. */
    core_stream *st = NULL;
    err = core_stream_get(c, &st);
    if (!err)
        err = refuse_in_capture(st, "cube_write");
    if (!err)
        err = core_materialize(c, r, n);
    if (err) {
        unpin(c, r, n);
        free(ops);
        return err;
    }
    core_stream_lock(st);
    err = core_stream_refuse_in_capture(st, "cube_write");
    if (err) {
        /* Refused, not failed: nothing was written and no buffer changes
         * state. */
        core_stream_unlock(st);
        unpin(c, r, n);
        free(ops);
        return err;
    }
    uint64_t t0 = core_trace_on() ? core_clock_ns() : 0;
    err = c->vt->write(c->server, &st->base, ops, n, sources);
    if (t0)
        trace_copy("write", st->base.id, t0, ops, n);
    core_stream_note_failure(st, err);
    core_stream_unlock(st);
    for (size_t i = 0; i < n; i++) {
        if (err) {
            /* The write did not land: its buffers cannot be trusted. */
            core_failure_record(c, r[i].alloc, err);
        } else if (ops[i].contiguous && r[i].offset == 0 &&
                   ops[i].bytes == r[i].alloc->storage.size) {
            /* A successful full write makes the bytes trustworthy again. */
            core_failure_clear(c, r[i].alloc);
        }
    }
    core_fault_note(c, err);
    unpin(c, r, n);
    free(ops);
    return err;
}

cube_error *cube_write(cube_client *c, const cube_copy_desc *descs,
                       const void *const *sources, const uint64_t *sizes,
                       size_t n)
{
    CORE_CALL(c, "cube_write", write_call(c, descs, sources, sizes, n));
}

enum {
    FUTURE_ATTACHED = 0, /* on the client's list, its read outstanding */
    FUTURE_WAITING = 1,  /* cube_future_wait is completing it */
    FUTURE_CLOSING = 2,  /* cube_client_close is completing it */
    FUTURE_DETACHED = 3, /* completed by close: the client may be gone */
    FUTURE_POLLING = 4   /* cube_future_ready is asking the backend */
};

struct cube_future {
    cube_client *client;
    cube_pending *pending;
    cube_error *result;
    core_resolved *resolved;
    size_t n;
    int done;
    atomic_int state;
    /* On the client's list while ATTACHED (futures_lock). */
    struct cube_future *prev, *next;
};

static void future_link(cube_client *c, cube_future *f)
{
    cube_mutex_lock(&c->futures_lock);
    f->prev = NULL;
    f->next = c->futures;
    if (c->futures)
        c->futures->prev = f;
    c->futures = f;
    cube_mutex_unlock(&c->futures_lock);
}

static void future_unlink(cube_client *c, cube_future *f)
    CUBE_REQUIRES(c->futures_lock)
{
    CUBE_DLIST_UNLINK(c->futures, f, prev, next);
    f->prev = f->next = NULL;
}

/* Waits for the future's read and drops its pins; the result stays in
 * f->result. f->pending is left as it is (cube_future_ready may read it
 * meanwhile): the caller's wait clears it, a detached future never uses
 * it again. */
static void future_complete(cube_client *c, cube_future *f)
{
    if (f->pending) {
        cube_error *err = c->vt->read_wait
                              ? c->vt->read_wait(c->server, f->pending)
                              : cube_error_new(CUBE_ERR_INTERNAL,
                                               "backend left a read pending "
                                               "without read_wait");
        core_fault_note(c, err);
        if (!f->result)
            f->result = err;
        else
            cube_error_ignore(err, "the read's first error is kept");
        /* A collective between processes that wrote these buffers may
         * have failed on the device while the read waited (its watchdog
         * aborted it): the bytes read are not its result. */
        if (!f->result &&
            atomic_load_explicit(&c->comm_inflight, memory_order_acquire)) {
            core_comm_reap(c);
            f->result =
                core_failure_claim_check(c, f->resolved, f->n, "cube_read");
        }
    }
    unpin(c, f->resolved, f->n);
    f->resolved = NULL;
}

void core_futures_detach(cube_client *c)
{
    for (unsigned spins = 0;; spins++) {
        cube_future *claimed = NULL;
        cube_mutex_lock(&c->futures_lock);
        for (cube_future *f = c->futures; f && !claimed; f = f->next) {
            int expected = FUTURE_ATTACHED;
            if (atomic_compare_exchange_strong_explicit(
                    &f->state, &expected, FUTURE_CLOSING, memory_order_acquire,
                    memory_order_relaxed))
                claimed = f;
        }
        if (claimed)
            future_unlink(c, claimed);
        int left = c->futures != NULL;
        cube_mutex_unlock(&c->futures_lock);
        if (claimed) {
            future_complete(c, claimed);
            atomic_store_explicit(&claimed->state, FUTURE_DETACHED,
                                  memory_order_release);
        } else if (!left) {
            return;
        } else {
            cube_backoff(spins); /* a wait on another thread is finishing */
        }
    }
}

static cube_error *read_async_call(cube_client *c, const cube_copy_desc *descs,
                                   void *const *destinations,
                                   const uint64_t *sizes, size_t n,
                                   cube_future **out)
{
    if (!out)
        return cube_error_null_argument("cube_read_async", "out");
    *out = NULL;
    CORE_CHECK_CLIENT(c, "cube_read");
    core_resolved *r = NULL;
    cube_copy_op *ops = NULL;
    cube_error *err =
        prepare(c, "cube_read", "destinations", "destination_sizes", descs,
                destinations, sizes, n, &r, &ops);
    if (err)
        return err;
    cube_future *f = calloc(1, sizeof *f);
    if (!f) {
        unpin(c, r, n);
        free(ops);
        return cube_error_new(CUBE_ERR_OUT_OF_MEMORY, "cube_read");
    }
    f->client = c;
    f->resolved = r;
    f->n = n;
    atomic_init(&f->state, FUTURE_ATTACHED);
    future_link(c, f);
    /* A capture refuses the read first, whatever the buffers hold; then
     * the claim check, before any byte is copied. */
    core_stream *st = NULL;
    f->result = core_stream_get(c, &st);
    if (!f->result)
        f->result = refuse_in_capture(st, "cube_read");
    if (!f->result) {
        /* What the backend learned of collectives between processes that
         * wrote these buffers counts as known. */
        core_comm_reap(c);
        f->result = core_failure_claim_check(c, r, n, "cube_read");
    }
    if (!f->result)
        f->result = core_materialize(c, r, n);
    if (!f->result) {
        core_stream_lock(st);
        f->result = core_stream_refuse_in_capture(st, "cube_read");
        uint64_t t0 = core_trace_on() ? core_clock_ns() : 0;
        if (!f->result)
            f->result = c->vt->read(c->server, &st->base, ops, n, destinations,
                                    &f->pending);
        if (t0)
            trace_copy("read", st->base.id, t0, ops, n);
        core_stream_unlock(st);
        core_fault_note(c, f->result);
    }
    free(ops);
    *out = f;
    return NULL;
}

cube_error *cube_read_async(cube_client *c, const cube_copy_desc *descs,
                            void *const *destinations, const uint64_t *sizes,
                            size_t n, cube_future **out)
{
    if (out)
        *out = NULL;
    CORE_CALL(c, "cube_read_async",
              read_async_call(c, descs, destinations, sizes, n, out));
}

cube_error *cube_future_wait(cube_future *f)
{
    if (!f)
        return cube_error_new(CUBE_ERR_INVALID_ARGUMENT,
                              "cube_future_wait: future is NULL");
    if (f->done)
        return NULL;
    int state = FUTURE_ATTACHED;
    /* A look by cube_future_ready lets go at once. */
    while (!atomic_compare_exchange_weak_explicit(
               &f->state, &state, FUTURE_WAITING, memory_order_acquire,
               memory_order_acquire) &&
           (state == FUTURE_POLLING || state == FUTURE_ATTACHED)) {
        state = FUTURE_ATTACHED;
        sched_yield();
    }
    if (state == FUTURE_ATTACHED) {
        /* The caller's: close waits until it leaves the list. */
        cube_client *c = f->client;
        future_complete(c, f);
        f->pending = NULL;
        cube_mutex_lock(&c->futures_lock);
        future_unlink(c, f);
        cube_mutex_unlock(&c->futures_lock);
        /* Nothing of the client is touched from here on. */
    } else {
        /* cube_client_close completed the read (or is completing it): the
         * answer is in the future, the client may be gone. */
        for (unsigned spins = 0;
             atomic_load_explicit(&f->state, memory_order_acquire) !=
             FUTURE_DETACHED;
             spins++)
            cube_backoff(spins);
    }
    f->done = 1;
    cube_error *result = f->result;
    f->result = NULL;
    return result;
}

int cube_future_ready(const cube_future *f)
{
    if (!f)
        return 0;
    if (f->done)
        return 1;
    int state = atomic_load_explicit(&f->state, memory_order_acquire);
    if (state == FUTURE_DETACHED)
        return 1;
    /* Close may be completing it (and reads, never writes, f->pending
     * until DETACHED). */
    if (state == FUTURE_CLOSING)
        return 0;
    if (!f->pending)
        return 1;
    /* Ask the backend whether the device is done, holding the read as a
     * wait does so that close cannot free it meanwhile (close waits for
     * it to be let go). The future is the caller's, not const. */
    cube_future *mine = (cube_future *)(uintptr_t)f;
    int expected = FUTURE_ATTACHED;
    if (!atomic_compare_exchange_strong_explicit(
            &mine->state, &expected, FUTURE_POLLING, memory_order_acquire,
            memory_order_acquire))
        return 0;
    cube_client *c = mine->client;
    int ready = c->vt->read_poll && c->vt->read_poll(c->server, mine->pending);
    atomic_store_explicit(&mine->state, FUTURE_ATTACHED, memory_order_release);
    return ready;
}

void cube_future_free(cube_future *f)
{
    if (!f)
        return;
    if (!f->done)
        cube_error_ignore(cube_future_wait(f), "a future freed unwaited "
                                               "drops its read's result");
    free(f);
}

static cube_error *read_call(cube_client *c, const cube_copy_desc *descs,
                             void *const *destinations, const uint64_t *sizes,
                             size_t n)
{
    cube_future *f;
    cube_error *err = cube_read_async(c, descs, destinations, sizes, n, &f);
    if (err)
        return err;
    err = cube_future_wait(f);
    cube_future_free(f);
    return err;
}

cube_error *cube_read(cube_client *c, const cube_copy_desc *descs,
                      void *const *destinations, const uint64_t *sizes,
                      size_t n)
{
    CORE_CALL(c, "cube_read", read_call(c, descs, destinations, sizes, n));
}

/* --- staging --- */

#define STAGING_ALIGN 4096

static void staging_forget_locked(cube_client *c, size_t i)
{
    c->staging[i] = c->staging[--c->staging_count];
}

static void staging_release(cube_client *c, void *p)
{
    if (c->vt->staging_free)
        c->vt->staging_free(c->server, p);
    else
        free(p);
}

static cube_error *staging_call(cube_client *c, const uint64_t *sizes, size_t n,
                                void **out)
{
    CORE_CHECK_CLIENT(c, "cube_staging");
    if (!sizes || !out || n == 0)
        return cube_error_new(CUBE_ERR_INVALID_ARGUMENT, "cube_staging: %s",
                              n == 0   ? "n is 0"
                              : !sizes ? "sizes is NULL"
                                       : "out is NULL");
    /* Whatever fails, the caller finds no buffer to free. */
    for (size_t i = 0; i < n; i++)
        out[i] = NULL;
    for (size_t i = 0; i < n; i++) {
        if (sizes[i] == 0)
            return cube_error_new(CUBE_ERR_INVALID_ARGUMENT,
                                  "cube_staging: sizes[%zu] is 0", i);
        if (sizes[i] > c->props.memory_total)
            return cube_error_new(CUBE_ERR_BUFFER_TOO_BIG,
                                  "cube_staging: sizes[%zu] = %llu bytes is "
                                  "more than the device's %llu bytes of "
                                  "memory: it can never be staged",
                                  i, (unsigned long long)sizes[i],
                                  (unsigned long long)c->props.memory_total);
    }
    cube_error *err = NULL;
    if (c->vt->staging) {
        err = c->vt->staging(c->server, sizes, n, out);
    } else {
        for (size_t i = 0; i < n && !err; i++) {
            uint64_t rounded =
                (sizes[i] + STAGING_ALIGN - 1) & ~(uint64_t)(STAGING_ALIGN - 1);
            out[i] = aligned_alloc(STAGING_ALIGN, rounded);
            if (!out[i]) {
                err = cube_error_new(CUBE_ERR_OUT_OF_MEMORY,
                                     "cube_staging: %llu bytes",
                                     (unsigned long long)sizes[i]);
                for (size_t j = 0; j < i; j++) {
                    free(out[j]);
                    out[j] = NULL;
                }
            }
        }
    }
    if (err) {
        /* A pinned allocation can break a device's context. */
        core_fault_note(c, err);
        return err;
    }
    cube_mutex_lock(&c->staging_lock);
    if (c->staging_count + n > c->staging_cap) {
        size_t cap = c->staging_cap ? c->staging_cap : 16;
        while (cap < c->staging_count + n)
            cap *= 2;
        void **grown = realloc(c->staging, cap * sizeof *grown);
        if (!grown) {
            cube_mutex_unlock(&c->staging_lock);
            for (size_t i = 0; i < n; i++) {
                staging_release(c, out[i]);
                out[i] = NULL;
            }
            return cube_error_new(CUBE_ERR_OUT_OF_MEMORY, "cube_staging");
        }
        c->staging = grown;
        c->staging_cap = cap;
    }
    for (size_t i = 0; i < n; i++)
        c->staging[c->staging_count++] = out[i];
    cube_mutex_unlock(&c->staging_lock);
    return NULL;
}

cube_error *cube_staging(cube_client *c, const uint64_t *sizes, size_t n,
                         void **out)
{
    CORE_CALL(c, "cube_staging", staging_call(c, sizes, n, out));
}

static cube_error *staging_free_call(cube_client *c, void *buffer)
{
    if (!c)
        return cube_error_null_argument("cube_staging_free", "client");
    if (!buffer)
        return NULL;
    cube_mutex_lock(&c->staging_lock);
    size_t i = 0;
    while (i < c->staging_count && c->staging[i] != buffer)
        i++;
    if (i == c->staging_count) {
        cube_mutex_unlock(&c->staging_lock);
        return cube_error_new(CUBE_ERR_NOT_FOUND,
                              "cube_staging_free: %p is not a staging buffer "
                              "of this client",
                              buffer);
    }
    staging_forget_locked(c, i);
    cube_mutex_unlock(&c->staging_lock);
    staging_release(c, buffer);
    return NULL;
}

cube_error *cube_staging_free(cube_client *c, void *buffer)
{
    CORE_CALL(c, "cube_staging_free", staging_free_call(c, buffer));
}

void core_staging_destroy(cube_client *c)
{
    for (size_t i = 0; i < c->staging_count; i++)
        staging_release(c, c->staging[i]);
    free(c->staging);
    c->staging = NULL;
    c->staging_count = 0;
}

/* --- whole-buffer reads and writes ---------------------------------------- */

/* The descriptor of all of `h` once `size` and `p` are checked against
 * it. */
static cube_error *whole_buffer(const char *fn, const char *what,
                                cube_client *c, cube_handle h, const void *p,
                                uint64_t size, cube_copy_desc *out)
{
    if (!c)
        return cube_error_null_argument(fn, "client");
    if (!p)
        return cube_error_null_argument(fn, what);
    uint64_t have = 0;
    cube_error *err = cube_handle_size(c, h, &have);
    if (err)
        return err;
    if (size != have)
        return cube_error_new(CUBE_ERR_INVALID_ARGUMENT,
                              "%s: size is %llu bytes but the buffer holds "
                              "%llu",
                              fn, (unsigned long long)size,
                              (unsigned long long)have);
    *out = cube_copy_desc_contiguous(h, have, 1);
    return NULL;
}

cube_error *cube_write_all(cube_client *c, cube_handle h, const void *src,
                           uint64_t size)
{
    cube_copy_desc d;
    cube_error *err =
        whole_buffer("cube_write_all", "src", c, h, src, size, &d);
    if (err)
        return err;
    const void *srcs[1] = {src};
    uint64_t sizes[1] = {size};
    return cube_write(c, &d, srcs, sizes, 1);
}

cube_error *cube_read_all(cube_client *c, cube_handle h, void *dst,
                          uint64_t size)
{
    cube_copy_desc d;
    cube_error *err = whole_buffer("cube_read_all", "dst", c, h, dst, size, &d);
    if (err)
        return err;
    void *dsts[1] = {dst};
    uint64_t sizes[1] = {size};
    return cube_read(c, &d, dsts, sizes, 1);
}
