/* A rank's part of a call, once the rendezvous agreed: issued on the
 * calling thread's stream (the backend's collective slot), recorded in
 * the stream's capture instead, or refused; then settled on the rank's
 * destination (the failure store) and its pins dropped. comm_run_pending
 * drives the calls of one thread, alone or of a group, through all of it.
 */
#include <stdlib.h>
#include <string.h>

#include "core/comm_internal.h"

/* Tags of groups recorded in captures. */
static atomic_uint_fast64_t next_group_tag = 1;

/* The calling thread's stream of p's client (looked up once per call). */
cube_error *comm_stream_of(pending *p, core_stream **out)
{
    if (!p->stream) {
        cube_error *err = core_stream_get(p->comm->client, &p->stream);
        if (err)
            return err;
    }
    *out = p->stream;
    return NULL;
}

/* Issues this rank's part of `set` on its stream. */
static cube_error *issue_set(pending *p, const cube_collective_set *set)
{
    cube_client *c = p->comm->client;
    core_stream *st = NULL;
    cube_error *err = comm_stream_of(p, &st);
    if (err)
        return err;
    core_stream_lock(st);
    err = core_stream_refuse_in_capture(st, "collective");
    if (!err)
        err = p->comm->group->vt->collective(c->server, &st->base,
                                             p->comm->impl, set);
    if (!err)
        st->launches++;
    core_stream_note_failure(st, err);
    p->noted = err != NULL;
    core_stream_unlock(st);
    core_fault_note(c, err);
    /* err is a fresh error, not derived from set. */
    // cppcheck-suppress returnDanglingLifetime
    return err;
}

/* Issues this rank's part on its stream. */
static cube_error *issue(pending *p)
{
    if (!p->call)
        return cube_error_new(CUBE_ERR_INTERNAL,
                              "a collective call was not posted");
    cube_collective_set set = {p->call->calls, p->call->expected, p->index,
                               p->call->shared};
    // cppcheck-suppress returnDanglingLifetime
    return issue_set(p, &set);
}

/* Whether p's call writes the whole of its destination's buffer (a
 * success then clears the buffer's failure). */
static int writes_whole_dst(const pending *p)
{
    return p->has_dst && p->dst.offset == 0 &&
           p->dst_bytes == p->dst.alloc->storage.size;
}

/* Drops the pins of a call that was not run (a dry run). */
void comm_drop_pins(pending *p)
{
    cube_client *c = p->comm->client;
    if (p->has_dst)
        core_resolved_drop(c, &p->dst);
    if (p->has_src)
        core_resolved_drop(c, &p->src);
    p->has_dst = p->has_src = 0;
}

/* Records the outcome on this rank's destination and drops the pins. */
static void settle(pending *p, const cube_error *err)
{
    cube_client *c = p->comm->client;
    if (p->has_dst) {
        /* A refused call (this rank's own, or a peer's, or calls that
         * differ) is the request's; anything else should have written
         * the destination and did not. */
        /* A recorded call wrote nothing yet; a capture on one rank and
         * not another is refused like a mismatch. */
        if (p->capturing) {
            /* the graph's failure store, at each replay */
        } else if (err && !p->local &&
                   cube_error_code(err) != CUBE_ERR_INVALID_ARGUMENT &&
                   cube_error_code(err) != CUBE_ERR_GRAPH_STATE) {
            core_failure_record(c, p->dst.alloc, err);
            /* A failed collective counts in the stream's windows, as a
             * failed launch does. */
            if (!p->noted)
                core_stream_note_failure_now(c, err);
        } else if (!err && writes_whole_dst(p))
            core_failure_clear(c, p->dst.alloc);
        core_resolved_drop(c, &p->dst);
    }
    if (p->has_src)
        core_resolved_drop(c, &p->src);
    cube_error_free(p->local);
    p->local = NULL;
    cube_error_free(p->failure);
    p->failure = NULL;
}

/* A communicator of one rank in this process has no peer to meet: its
 * call (not captured, not in a group) is judged and issued at once, with
 * the answers the rendezvous would give (an abort, its own refusal, a
 * failed source). `failure` is taken. */
cube_error *comm_run_alone(pending *p, const cube_collective *mine,
                           cube_error *failure)
{
    comm_group *g = p->comm->group;
    cube_mutex_lock(&g->lock);
    int aborted = g->aborted;
    cube_mutex_unlock(&g->lock);
    cube_error *err = NULL;
    if (aborted) {
        cube_error_free(p->local);
        p->local = NULL;
        err = comm_aborted_error(mine->kind);
    } else if (p->local) {
        err = cube_error_clone(p->local);
    } else if (failure) {
        err = comm_add_failed_source(NULL, mine, failure);
    } else {
        _Alignas(64) unsigned char shared[CUBE_COLLECTIVE_SHARED];
        memset(shared, 0, sizeof shared);
        cube_collective_set set = {mine, 1, 0, shared};
        err = issue_set(p, &set);
    }
    cube_error_free(failure);
    settle(p, err);
    return err;
}

/* Hands this rank's part to the backend on a stream it is capturing. */
static cube_error *capture_part(cube_client *c, core_stream *st,
                                const pending *p) CUBE_REQUIRES(st->lock)
{
    cube_collective_set set = {p->call->calls, p->call->expected, p->index,
                               p->call->shared};
    /* A fresh error, not derived from set. */
    // cppcheck-suppress returnDanglingLifetime
    return p->comm->group->vt->collective(c->server, &st->base, p->comm->impl,
                                          &set);
}

/* Whether `st` still captures for client `c` (a call made in its capture
 * is recorded there). */
static int still_capturing(const core_stream *st, const cube_client *c)
    CUBE_REQUIRES(st->lock)
{
    return st->capture && st->capture_client == c;
}

/* Records p's call `mine` in the capture of `st`, unless the capture
 * ended since the call was made. */
cube_error *comm_record_in_capture(pending *p, core_stream *st,
                                   const cube_collective *mine)
    CUBE_REQUIRES(st->lock)
{
    cube_client *c = p->comm->client;
    if (!still_capturing(st, c))
        return cube_error_new(CUBE_ERR_GRAPH_STATE,
                              "%s: the capture ended before the call was "
                              "recorded",
                              comm_kind_name(mine->kind));
    return core_graph_record_collective(
        c, st, p->comm, mine, p->has_src ? p->src.alloc : NULL,
        p->has_dst ? p->dst.alloc : NULL, writes_whole_dst(p), p->hardware,
        p->group);
}

/* Records this rank's part, agreed by every rank, in the capture of its
 * stream instead of running it. */
static cube_error *record(pending *p)
{
    cube_client *c = p->comm->client;
    if (!p->call)
        return cube_error_new(CUBE_ERR_INTERNAL,
                              "a collective call was not posted");
    core_stream *st = NULL;
    cube_error *err = comm_stream_of(p, &st);
    if (err)
        return err;
    const cube_collective *mine = &p->call->calls[p->index];
    core_stream_lock(st);
    if (p->hardware && still_capturing(st, c)) {
        /* The backend captures its part into the stream's graph; the
         * entry keeps it in the rendezvous and the failure store. */
        err = capture_part(c, st, p);
        p->noted = err != NULL;
        core_stream_note_failure(st, err);
    }
    if (!err)
        err = comm_record_in_capture(p, st, mine);
    core_stream_unlock(st);
    core_fault_note(c, err);
    return err;
}

/* --- running a thread's calls --- */

/* Whether p's call is met by the backend's engine with other processes'
 * calls (a send to itself never meets another process's call). */
static int meets_remote(const pending *p)
{
    return p->comm->group->remote && !p->self;
}

/* Whether p's call may run, once posted: NULL when it may (a call between
 * processes always goes to the backend's engine), else what to answer
 * (a call that was not posted was refused: its own refusal). */
static cube_error *rendezvous_answer(pending *p)
{
    if (meets_remote(p))
        return NULL;
    if (p->local)
        return cube_error_clone(p->local);
    if (p->call)
        return comm_await(p);
    return cube_error_new(CUBE_ERR_INTERNAL,
                          "a collective call was not posted");
}

/* Runs this rank's part of p's call: to the backend's engine between
 * processes, into the capture of a capturing stream, else on the
 * stream. */
static cube_error *run_part(pending *p)
{
    if (meets_remote(p))
        return comm_issue_remote(p);
    return p->capturing ? record(p) : issue(p);
}

/* The backend of the calls in a[0..n) that may run, and how many there
 * are (*count; the backend is NULL when none may). */
static const cube_comm_vtable *runnable(const pending *a, size_t n,
                                        size_t *count)
{
    const cube_comm_vtable *vt = NULL;
    *count = 0;
    for (size_t i = 0; i < n; i++)
        if (!a[i].result) {
            vt = a[i].comm->group->vt;
            (*count)++;
        }
    return vt;
}

/* Leaves each call of a[0..n) and settles it; returns the first error
 * (its index in *first_at, when not NULL) and frees the others. */
static cube_error *settle_all(pending *a, size_t n, size_t *first_at)
{
    cube_error *first = NULL;
    for (size_t i = 0; i < n; i++) {
        if (a[i].call)
            comm_leave(&a[i], n == 1);
        settle(&a[i], a[i].result);
        if (a[i].result && !first) {
            first = a[i].result;
            if (first_at)
                *first_at = i;
        } else
            cube_error_free(a[i].result);
        a[i].result = NULL;
    }
    return first;
}

/* Runs the pending calls a[0..n): waits for each, issues the parts that
 * may run (inside the backend's group when there are several), then
 * settles each. Returns the first error (its index in *first_at, when
 * not NULL); each failed call's destination carries its own. */
cube_error *comm_run_pending(pending *a, size_t n, size_t *first_at)
{
    for (size_t i = 0; i < n; i++)
        a[i].result = rendezvous_answer(&a[i]);
    size_t count = 0;
    const cube_comm_vtable *vt = runnable(a, n, &count);
    int grouped = count > 1 && vt->group_begin && !a[0].agree_only;
    if (n > 1) {
        /* Captured calls of one group are replayed as one. */
        uint64_t tag = atomic_fetch_add(&next_group_tag, 1);
        for (size_t i = 0; i < n; i++)
            a[i].group = tag;
    }
    if (grouped)
        vt->group_begin();
    for (size_t i = 0; i < n; i++)
        if (!a[i].result && !a[i].agree_only)
            a[i].result = run_part(&a[i]);
    if (grouped) {
        cube_error *e = vt->group_end();
        for (size_t i = 0; e && i < n; i++)
            if (!a[i].result)
                a[i].result = cube_error_clone(e);
        cube_error_free(e);
    }
    /* Every part of this thread is marked issued before any waits for
     * the peers' (one lock for both when there is one). */
    for (size_t i = 0; i < n && n > 1; i++)
        if (a[i].call)
            comm_mark_issued(&a[i]);
    return settle_all(a, n, first_at);
}
