/* Calls of communicators between processes that the backend follows on
 * the device: each is issued with a ticket, and until the poll slot
 * says how it ended its destination stays pinned, so that a read or a
 * sync of the client (core_comm_reap) can record a failure there. A
 * hardware graph's replay holding such calls is followed the same way,
 * with every buffer the graph writes. Also the issue of a call between
 * processes itself (the backend's engine meets the other processes).
 */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/grow.h"
#include "core/comm_internal.h"

/* Communicators between processes whose calls the backend follows on the
 * device, so that a read or a sync of a client can learn how they ended
 * (core_comm_reap). Taken before a group's reap_lock. */
static cube_mutex remote_lock = CUBE_MUTEX_INIT;
static comm_group *remote_groups CUBE_GUARDED_BY(remote_lock);

/* Asks the backend how g's followed calls ended: a finished one is
 * dropped, a failed one's destination records the failure. Never blocks
 * on the device. Returns how many failed. */
static size_t reap_group(comm_group *g)
{
    cube_comm *comm = g->remote_rank;
    cube_client *c = comm->client;
    size_t failed = 0;
    cube_mutex_lock(&g->reap_lock);
    for (size_t i = 0;;) {
        cube_mutex_lock(&g->lock);
        if (i >= g->inflight_len || !comm->impl) {
            cube_mutex_unlock(&g->lock);
            break;
        }
        remote_call rc = g->inflight[i];
        cube_mutex_unlock(&g->lock);
        int done = 0;
        cube_error *err = g->vt->poll(c->server, comm->impl, rc.ticket, &done);
        if (!done) {
            cube_error_free(err);
            i++;
            continue;
        }
        if (err) {
            err = cube_error_prefix(err, "%s",
                                    rc.writes ? "cube_graph_replay"
                                              : comm_kind_name(rc.kind));
            if (rc.dst)
                core_failure_record(c, rc.dst, err);
            for (size_t w = 0; w < rc.nwrites; w++)
                core_failure_record(c, rc.writes[w], err);
            core_stream_note_failure_now(c, err);
            cube_error_free(err);
            failed++;
        }
        /* Only the reaper removes, and appends go to the end: entry i is
         * still rc. */
        cube_mutex_lock(&g->lock);
        memmove(&g->inflight[i], &g->inflight[i + 1],
                (g->inflight_len - i - 1) * sizeof *g->inflight);
        g->inflight_len--;
        cube_mutex_unlock(&g->lock);
        if (rc.dst)
            core_alloc_unpin(c, rc.dst);
        for (size_t w = 0; w < rc.nwrites; w++)
            core_alloc_unpin(c, rc.writes[w]);
        free(rc.writes);
        atomic_fetch_sub_explicit(&c->comm_inflight, 1, memory_order_release);
    }
    cube_mutex_unlock(&g->reap_lock);
    return failed;
}

size_t core_comm_reap(cube_client *c)
{
    if (!atomic_load_explicit(&c->comm_inflight, memory_order_acquire))
        return 0;
    size_t failed = 0;
    cube_mutex_lock(&remote_lock);
    for (comm_group *g = remote_groups; g; g = g->remote_next)
        if (g->remote_rank->client == c)
            failed += reap_group(g);
    cube_mutex_unlock(&remote_lock);
    return failed;
}

/* The group joins the process's list, whose calls core_comm_reap
 * settles. */
void comm_remote_list(comm_group *g)
{
    cube_mutex_lock(&remote_lock);
    g->remote_next = remote_groups;
    remote_groups = g;
    cube_mutex_unlock(&remote_lock);
}

/* Before a rank between processes goes: waits for its followed calls to
 * end (the backend's watchdog ends each within the timeout after it
 * starts on the device) and takes the group off the process's list. */
void comm_drain_remote(comm_group *g)
{
    if (!g->vt->poll)
        return;
    uint64_t give_up = cube_clock_ns() + 2 * g->timeout_ns + 1000000000ull;
    for (;;) {
        reap_group(g);
        cube_mutex_lock(&g->lock);
        size_t left = g->inflight_len;
        cube_mutex_unlock(&g->lock);
        if (!left || cube_clock_ns() >= give_up)
            break;
        struct timespec pause = {0, 1000000}; /* 1 ms */
        nanosleep(&pause, NULL);
    }
    cube_mutex_lock(&remote_lock);
    for (comm_group **q = &remote_groups; *q; q = &(*q)->remote_next)
        if (*q == g) {
            *q = g->remote_next;
            break;
        }
    cube_mutex_unlock(&remote_lock);
    /* Calls still running past that: their destinations cannot be
     * trusted once the communicator goes. No reaper runs any more (they
     * hold remote_lock throughout), so the list is this thread's. */
    cube_comm *comm = g->remote_rank;
    cube_client *c = comm->client;
    cube_mutex_lock(&g->lock);
    remote_call *left = g->inflight;
    size_t n = g->inflight_len;
    g->inflight = NULL;
    g->inflight_len = g->inflight_cap = 0;
    cube_mutex_unlock(&g->lock);
    for (size_t i = 0; i < n; i++) {
        cube_error *err = cube_error_new(
            CUBE_ERR_ABORTED,
            "%s: the communicator was destroyed before the call finished "
            "on the device",
            left[i].writes ? "cube_graph_replay"
                           : comm_kind_name(left[i].kind));
        if (left[i].dst) {
            core_failure_record(c, left[i].dst, err);
            core_alloc_unpin(c, left[i].dst);
        }
        for (size_t w = 0; left[i].writes && w < left[i].nwrites; w++) {
            core_failure_record(c, left[i].writes[w], err);
            core_alloc_unpin(c, left[i].writes[w]);
        }
        free(left[i].writes);
        cube_error_free(err);
        atomic_fetch_sub_explicit(&c->comm_inflight, 1, memory_order_release);
    }
    free(left);
}

/* Room in g's list of followed calls for one more; 0 for want of
 * memory. */
static int inflight_room(comm_group *g) CUBE_REQUIRES(g->lock)
{
    remote_call *grown = cube_grow(g->inflight, g->inflight_len,
                                   &g->inflight_cap, sizeof *grown, 16);
    if (!grown)
        return 0;
    g->inflight = grown;
    return 1;
}

/* Room for one more followed call, made before the call is issued: a call
 * that could not be followed is refused rather than run blind. */
static cube_error *reserve_inflight(comm_group *g, const char *fn)
{
    cube_mutex_lock(&g->lock);
    int room = inflight_room(g);
    cube_mutex_unlock(&g->lock);
    return room ? NULL : cube_error_new(CUBE_ERR_OUT_OF_MEMORY, "%s", fn);
}

/* Appends a followed call (room was reserved; grown here should another
 * thread have taken it). 0 when it could not be. */
static int inflight_push(comm_group *g, remote_call rc)
{
    cube_mutex_lock(&g->lock);
    int room = inflight_room(g);
    if (room)
        g->inflight[g->inflight_len++] = rc;
    cube_mutex_unlock(&g->lock);
    return room;
}

/* What cannot be followed is not trusted. */
static void unfollowed(cube_client *c, core_alloc *const *a, size_t n,
                       const char *fn)
{
    cube_error *err = cube_error_new(CUBE_ERR_OUT_OF_MEMORY,
                                     "%s: no memory to follow the call on "
                                     "the device",
                                     fn);
    for (size_t i = 0; i < n; i++)
        if (a[i])
            core_failure_record(c, a[i], err);
    cube_error_free(err);
}

/* Follows call `ticket` of p (room was reserved). */
static void follow(pending *p, uint64_t ticket)
{
    comm_group *g = p->comm->group;
    cube_client *c = p->comm->client;
    core_alloc *dst = p->has_dst ? p->dst.alloc : p->replay_dst;
    if (dst)
        core_alloc_pin(c, dst);
    atomic_fetch_add_explicit(&c->comm_inflight, 1, memory_order_release);
    if (!inflight_push(g, (remote_call){ticket, dst, p->mine.kind, NULL, 0})) {
        unfollowed(c, &dst, 1, comm_kind_name(p->mine.kind));
        if (dst)
            core_alloc_unpin(c, dst);
        atomic_fetch_sub_explicit(&c->comm_inflight, 1, memory_order_release);
    }
}

/* What a rank's call between processes answers: its own refusal, else
 * its failed source, else how the backend's issue went (`err`, taken). */
static cube_error *remote_answer(const pending *p, cube_error *err)
{
    if (p->local) {
        cube_error_free(err);
        return cube_error_clone(p->local);
    }
    if (p->failure) {
        cube_error_free(err);
        return cube_error_wrap(cube_error_clone(p->failure), CUBE_ERR_SEVERAL,
                               "%s: the source cannot be trusted (the work "
                               "that should have written it failed), so no "
                               "rank runs it",
                               comm_kind_name(p->mine.kind));
    }
    return err;
}

/* Issues a call of a communicator between processes: the backend's
 * engine tells the other processes when this rank refused it or its
 * source failed (or, without a way to, aborts the communicator so that
 * they do not wait), and answers for theirs. The rank's own refusal is
 * its answer; a failed source refuses with CUBE_ERR_SEVERAL. On a
 * capturing stream the backend checks the call with the peers (software
 * graphs) or captures its part (hardware graphs), and the call is then
 * recorded in the capture. */
cube_error *comm_issue_remote(pending *p)
{
    cube_client *c = p->comm->client;
    core_stream *st = NULL;
    cube_error *err = comm_stream_of(p, &st);
    if (err) {
        cube_error_free(p->local);
        p->local = err;
    }
    _Alignas(64) unsigned char shared[CUBE_COLLECTIVE_SHARED];
    memset(shared, 0, sizeof shared);
    comm_group *g = p->comm->group;
    uint64_t ticket = 0;
    const cube_comm_vtable *vt = p->comm->group->vt;
    int followed = vt->poll != NULL && !p->capturing;
    if (followed) {
        /* Earlier calls that ended are settled first, so their failures
         * are on their destinations before this call reads them. */
        reap_group(g);
        if (!p->local)
            p->local = reserve_inflight(g, comm_kind_name(p->mine.kind));
    }
    cube_collective_set set = {
        &p->mine,    1,        0,          shared,
        1,           p->local, p->failure, followed ? &ticket : NULL,
        p->capturing};
    if (!st)
        return cube_error_clone(p->local);
    core_stream_lock(st);
    err = vt->collective(c->server, &st->base, p->comm->impl, &set);
    if (!err && ticket)
        follow(p, ticket);
    int ran = !err && !p->local && !p->failure;
    if (ran && p->capturing) {
        /* Every rank captures it (or the backend captured its part): the
         * capture holds it from here. */
        err = comm_record_in_capture(p, st, &p->mine);
    } else if (ran) {
        st->launches++;
    }
    core_stream_note_failure(st, err);
    p->noted = err != NULL;
    core_stream_unlock(st);
    core_fault_note(c, err);
    return remote_answer(p, err);
}

/* --- hardware graphs holding calls between processes --- */

struct core_replay_watch {
    cube_comm *comm;
    uint64_t ticket;
    core_alloc **writes; /* a copy of the graph's, pinned once followed */
    size_t nwrites;
};

cube_error *core_comm_replay_begin(cube_comm *comm, core_stream *st,
                                   core_alloc *const *writes, size_t nwrites,
                                   core_replay_watch **out)
{
    *out = NULL;
    comm_group *g = comm->group;
    cube_client *c = comm->client;
    cube_mutex_lock(&g->lock);
    int gone = g->alive == 0, aborted = g->aborted;
    cube_mutex_unlock(&g->lock);
    if (gone)
        return cube_error_new(CUBE_ERR_NOT_FOUND,
                              "cube_graph_replay: rank %u's communicator was "
                              "destroyed after the graph recorded it",
                              comm->rank);
    if (aborted || !comm->impl)
        return cube_error_new(CUBE_ERR_ABORTED,
                              "cube_graph_replay: the communicator of rank "
                              "%u was aborted",
                              comm->rank);
    if (!g->vt->replay_begin || !g->vt->replay_end)
        return cube_error_new(CUBE_ERR_UNSUPPORTED,
                              "cube_graph_replay: the %s backend cannot "
                              "follow a graph's calls between processes",
                              c->props.backend);
    core_replay_watch *w = calloc(1, sizeof *w);
    core_alloc **copy = nwrites ? malloc(nwrites * sizeof(core_alloc *)) : NULL;
    if (!w || (nwrites && !copy)) {
        free(copy);
        free(w);
        return cube_error_new(CUBE_ERR_OUT_OF_MEMORY, "cube_graph_replay");
    }
    cube_error *err = reserve_inflight(g, "cube_graph_replay");
    if (!err)
        err = g->vt->replay_begin(c->server, &st->base, comm->impl, &w->ticket);
    if (err) {
        free(copy);
        free(w);
        return err;
    }
    if (nwrites)
        memcpy(copy, writes, nwrites * sizeof(core_alloc *));
    w->comm = comm;
    w->writes = copy;
    w->nwrites = nwrites;
    *out = w;
    return NULL;
}

cube_error *core_comm_replay_end(core_replay_watch *w, core_stream *st,
                                 int launched)
{
    if (!w)
        return NULL;
    cube_comm *comm = w->comm;
    comm_group *g = comm->group;
    cube_client *c = comm->client;
    cube_error *err = g->vt->replay_end(c->server, &st->base, comm->impl,
                                        w->ticket, launched);
    if (!err && launched && w->ticket) {
        /* Followed like a call: its failure goes on every buffer the graph
         * writes (room was reserved at the beginning). */
        for (size_t i = 0; i < w->nwrites; i++)
            core_alloc_pin(c, w->writes[i]);
        atomic_fetch_add_explicit(&c->comm_inflight, 1, memory_order_release);
        if (inflight_push(g, (remote_call){w->ticket, NULL,
                                           CUBE_COLLECTIVE_ALL_REDUCE,
                                           w->writes, w->nwrites})) {
            w->writes = NULL;
        } else {
            unfollowed(c, w->writes, w->nwrites, "cube_graph_replay");
            for (size_t i = 0; i < w->nwrites; i++)
                core_alloc_unpin(c, w->writes[i]);
            atomic_fetch_sub_explicit(&c->comm_inflight, 1,
                                      memory_order_release);
        }
    }
    free(w->writes);
    free(w);
    return err;
}
