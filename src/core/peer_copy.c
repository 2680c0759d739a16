/* Copies between clients' buffers (cube_copy_peer, cubert/comm.h): the
 * backend's copy_to_peer slot when both clients' devices are of one
 * backend that has it, else through host memory in pieces (a read of the
 * source, then a write of the destination). Either way it is a write of
 * the destination for the failure store.
 *
 * Locks: the two clients' streams, one after the other in address order
 * when the backend copies (never one client's stream while waiting for
 * the other in another order), each alone on the host path.
 */
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "core/client_internal.h"
#include "cubert/comm.h"

/* Host staging goes in pieces of at most this many bytes. */
#define PIECE_BYTES (64ull << 20)

static cube_copy_op whole_op(const core_resolved *r, uint64_t offset,
                             uint64_t bytes)
{
    cube_copy_op op;
    memset(&op, 0, sizeof op);
    op.binding = core_binding(r);
    op.binding.offset += offset;
    op.binding.size = bytes;
    op.rank = 1;
    op.elem_size = 1;
    op.shape[0] = bytes;
    op.byte_strides[0] = 1;
    op.bytes = bytes;
    op.contiguous = 1;
    return op;
}

/* Through the host: the source's stream reads a piece (waiting for its
 * writers), the destination's stream writes it. */
static cube_error *copy_through_host(cube_client *dc, core_stream *ds,
                                     const core_resolved *d, cube_client *sc,
                                     core_stream *ss, const core_resolved *s)
{
    uint64_t size = d->size;
    size_t piece = (size_t)(size < PIECE_BYTES ? size : PIECE_BYTES);
    unsigned char *buf = malloc(piece);
    if (!buf)
        return cube_error_new(CUBE_ERR_OUT_OF_MEMORY,
                              "cube_copy_peer: %zu bytes of host staging",
                              piece);
    cube_error *err = NULL;
    cube_copy_op rop, wop; /* each piece's read and write */
    for (uint64_t at = 0; at < size && !err; at += piece) {
        uint64_t n = size - at < piece ? size - at : piece;
        rop = whole_op(s, at, n);
        void *dst[1] = {buf};
        cube_pending *pending = NULL;
        core_stream_lock(ss);
        err = core_stream_refuse_in_capture(ss, "cube_copy_peer");
        if (!err)
            err = sc->vt->read(sc->server, &ss->base, &rop, 1, dst, &pending);
        core_stream_unlock(ss);
        if (pending) {
            cube_error *w = sc->vt->read_wait
                                ? sc->vt->read_wait(sc->server, pending)
                                : cube_error_new(CUBE_ERR_INTERNAL,
                                                 "backend left a read "
                                                 "pending without read_wait");
            if (!err)
                err = w;
            else
                cube_error_ignore(w, "the copy's first error is reported");
        }
        core_fault_note(sc, err);
        if (err)
            break;
        wop = whole_op(d, at, n);
        const void *src[1] = {buf};
        core_stream_lock(ds);
        err = core_stream_refuse_in_capture(ds, "cube_copy_peer");
        if (!err)
            err = dc->vt->write(dc->server, &ds->base, &wop, 1, src);
        core_stream_unlock(ds);
        core_fault_note(dc, err);
    }
    free(buf);
    return err;
}

/* The backend copies with both streams held (refusing a capture begun on
 * either since the check before). */
static cube_error *copy_held(cube_client *dc, core_stream *ds,
                             const core_resolved *d, cube_client *sc,
                             core_stream *ss, const core_resolved *s)
    CUBE_REQUIRES(ss->lock, ds->lock)
{
    cube_error *err = core_stream_refuse_in_capture(ss, "cube_copy_peer");
    if (!err)
        err = core_stream_refuse_in_capture(ds, "cube_copy_peer");
    if (err)
        return err;
    cube_binding sb = core_binding(s), db = core_binding(d);
    err = sc->vt->copy_to_peer(sc->server, &ss->base, &sb, dc->server,
                               &ds->base, &db);
    /* err is a fresh error, not derived from the bindings. */
    // cppcheck-suppress returnDanglingLifetime
    return err;
}

/* The backend copies device to device. Two streams are taken in address
 * order (docs/threading.md), one when they are the same. */
static cube_error *copy_direct(cube_client *dc, core_stream *ds,
                               const core_resolved *d, cube_client *sc,
                               core_stream *ss, const core_resolved *s)
{
    cube_error *err;
    if (ss == ds) {
        core_stream_lock(ss);
        err = copy_held(dc, ss, d, sc, ss, s);
        core_stream_unlock(ss);
    } else {
        if (ss < ds) {
            core_stream_lock(ss);
            core_stream_lock(ds);
        } else {
            core_stream_lock(ds);
            core_stream_lock(ss);
        }
        err = copy_held(dc, ds, d, sc, ss, s);
        core_stream_unlock(ds);
        core_stream_unlock(ss);
    }
    core_fault_note(dc, err);
    core_fault_note(sc, err);
    return err;
}

/* CUBE_ERR_GRAPH_STATE when either stream is capturing. */
static cube_error *refuse_captures(core_stream *ss, core_stream *ds)
{
    core_stream_lock(ss);
    cube_error *err = core_stream_refuse_in_capture(ss, "cube_copy_peer");
    core_stream_unlock(ss);
    if (!err && ds != ss) {
        core_stream_lock(ds);
        err = core_stream_refuse_in_capture(ds, "cube_copy_peer");
        core_stream_unlock(ds);
    }
    return err;
}

static cube_error *copy_peer_call(cube_client *dc, cube_handle dst,
                                  cube_client *sc, cube_handle src)
{
    CORE_CHECK_CLIENT(dc, "cube_copy_peer");
    CORE_CHECK_CLIENT(sc, "cube_copy_peer");
    core_resolved s, d;
    cube_error *err = core_resolve(sc, src, "cube_copy_peer", &s);
    if (err)
        return cube_error_prefix(err, "source");
    err = core_resolve(dc, dst, "cube_copy_peer", &d);
    if (err) {
        core_resolved_drop(sc, &s);
        return cube_error_prefix(err, "destination");
    }
    if (s.size != d.size)
        err = cube_error_new(CUBE_ERR_INVALID_ARGUMENT,
                             "cube_copy_peer: the source holds %llu bytes "
                             "and the destination %llu; they must be the "
                             "same",
                             (unsigned long long)s.size,
                             (unsigned long long)d.size);
    else if (s.alloc == d.alloc && s.offset != d.offset &&
             s.offset < d.offset + d.size && d.offset < s.offset + s.size)
        /* A device copies ranges that overlap in no defined order. */
        err = cube_error_new(CUBE_ERR_INVALID_ARGUMENT,
                             "cube_copy_peer: the source (bytes %llu..%llu) "
                             "and the destination (bytes %llu..%llu) of one "
                             "buffer overlap",
                             (unsigned long long)s.offset,
                             (unsigned long long)s.offset + s.size,
                             (unsigned long long)d.offset,
                             (unsigned long long)d.offset + d.size);
    core_stream *ss = NULL, *ds = NULL;
    if (!err)
        err = core_stream_get(sc, &ss);
    if (!err)
        err = core_stream_get(dc, &ds);
    /* A capture refuses first, whatever the buffers hold. */
    if (!err)
        err = refuse_captures(ss, ds);
    if (!err && !core_dry_run_active(dc)) {
        /* A failed source refuses, and the destination carries it. */
        cube_error *f = core_failure_get(sc, s.alloc);
        if (f)
            err = cube_error_wrap(f, CUBE_ERR_SEVERAL,
                                  "cube_copy_peer: the source cannot be "
                                  "trusted (the work that should have "
                                  "written it failed)");
        if (!err)
            err = core_materialize(sc, &s, 1);
        if (!err)
            err = core_materialize(dc, &d, 1);
        if (!err)
            err = sc->vt == dc->vt && sc->vt->copy_to_peer
                      ? copy_direct(dc, ds, &d, sc, ss, &s)
                      : copy_through_host(dc, ds, &d, sc, ss, &s);
        if (err && cube_error_code(err) != CUBE_ERR_GRAPH_STATE) {
            core_failure_record(dc, d.alloc, err);
            core_stream_note_failure_now(dc, err);
        } else if (!err && d.offset == 0 && d.size == d.alloc->storage.size)
            core_failure_clear(dc, d.alloc);
    }
    core_resolved_drop(dc, &d);
    core_resolved_drop(sc, &s);
    return err;
}

cube_error *cube_copy_peer(cube_client *dst_client, cube_handle dst,
                           cube_client *src_client, cube_handle src)
{
    if (!dst_client || !src_client)
        return cube_error_new(CUBE_ERR_INVALID_ARGUMENT,
                              "cube_copy_peer: %s client is NULL",
                              dst_client ? "the source" : "the destination");
    /* In flight on both clients, so neither closes under the copy. */
    core_call_shard *other = NULL;
    if (src_client != dst_client) {
        other = core_call_enter(src_client);
        if (!other)
            return core_call_refused("cube_copy_peer");
    }
    core_call_shard *mine = core_call_enter(dst_client);
    cube_error *err = mine ? copy_peer_call(dst_client, dst, src_client, src)
                           : core_call_refused("cube_copy_peer");
    if (mine)
        core_call_leave(mine);
    if (other)
        core_call_leave(other);
    return err;
}
