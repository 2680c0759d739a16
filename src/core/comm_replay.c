/* Collectives recorded in graphs (graph.c): the holds that keep a
 * communicator's group, and a rank's backend communicator, alive for the
 * graphs that name them, and the replay of recorded calls through the
 * rendezvous, meeting the peers' replays as calls meet.
 */
#include <stdlib.h>

#include "base/error.h"
#include "core/comm_internal.h"

void core_comm_hold(cube_comm *comm, int hardware)
{
    comm_group *g = comm->group;
    cube_mutex_lock(&g->lock);
    g->holds++;
    if (hardware)
        comm->hw_holds++;
    cube_mutex_unlock(&g->lock);
}

void core_comm_release(cube_comm *comm, int hardware)
{
    comm_group *g = comm->group;
    cube_mutex_lock(&g->lock);
    int destroy_now = 0;
    if (hardware && --comm->hw_holds == 0 && comm->destroy_deferred) {
        comm->destroy_deferred = 0;
        destroy_now = 1;
    }
    cube_mutex_unlock(&g->lock);
    /* The last graph holding this rank's device work is gone (the backend
     * waited for its replays): the rank's destroy can finish. */
    if (destroy_now && g->vt->destroy && comm->impl)
        g->vt->destroy(comm->client->server, comm->impl);
    if (destroy_now)
        comm->impl = NULL;
    cube_mutex_lock(&g->lock);
    int last = --g->holds == 0 && g->alive == 0;
    cube_mutex_unlock(&g->lock);
    if (last)
        comm_free_ranks(comm);
}

/* Whether the rank's communicator was destroyed (between processes the
 * group is this rank alone). */
static int rank_gone(const cube_comm *comm)
{
    comm_group *g = comm->group;
    cube_mutex_lock(&g->lock);
    int gone = g->gone ? g->gone[comm->rank] : g->alive == 0;
    cube_mutex_unlock(&g->lock);
    return gone;
}

static cube_error *destroyed_error(const cube_comm *comm,
                                   cube_collective_kind kind)
{
    return cube_error_new(CUBE_ERR_NOT_FOUND,
                          "%s: rank %u's communicator was destroyed after "
                          "the graph recorded it",
                          comm_kind_name(kind), comm->rank);
}

/* Meets the peers' replays of a recorded call: issued when `agree_only`
 * is 0. */
static cube_error *replay(cube_comm *comm, const cube_collective *call,
                          core_alloc *dst, cube_error *refusal, int agree_only)
{
    comm_group *g = comm->group;
    if (rank_gone(comm)) {
        /* No rank of it can meet this one: the peers' replays time out
         * (or see it gone). */
        cube_error_free(refusal);
        return destroyed_error(comm, call->kind);
    }
    pending p;
    memset(&p, 0, sizeof p);
    p.comm = comm;
    p.local = refusal;
    /* A send to itself comes here refused only (else it is paired). */
    p.self = comm_to_itself(call, comm->rank);
    if (g->remote && !p.self) {
        /* The backend's engine meets the other processes: a hardware
         * graph's replay has nothing to agree (the replay_begin slot follows
         * its device work), but a refusal is told as a call's is. */
        if (agree_only && !refusal)
            return NULL;
        p.mine = *call;
        p.replay_dst = dst;
        return comm_run_pending(&p, 1, NULL);
    }
    p.agree_only = agree_only;
    cube_collective mine = *call;
    comm_post(&p, &mine, NULL);
    return comm_run_pending(&p, 1, NULL);
}

static const core_recorded_call *nth(const core_recorded_call *calls,
                                     size_t stride, size_t i)
{
    return (const core_recorded_call *)(const void *)((const char *)calls +
                                                      i * stride);
}

/* Makes p the replay of recorded call r of a group, posted unless it
 * waits to be paired or goes to the backend's engine; `refusal` (kept) is
 * its rank's refusal, or NULL. */
static void replay_post(pending *p, const core_recorded_call *r,
                        const cube_error *refusal, int agree_only)
{
    p->comm = r->comm;
    p->local = refusal ? cube_error_clone(refusal) : NULL;
    p->mine = r->call;
    p->self = comm_to_itself(&r->call, r->comm->rank);
    if (p->self) {
        /* paired with its partner (comm_pair_self), as at the group's end */
        p->agree_only = agree_only;
        p->replay_dst = r->dst;
    } else if (r->comm->group->remote) {
        /* nothing to agree between processes; a refusal is told */
        p->agree_only = agree_only && !refusal;
        p->replay_dst = r->dst;
    } else {
        p->agree_only = agree_only;
        cube_collective mine = r->call;
        comm_post(p, &mine, NULL);
    }
}

cube_error *core_comm_replay_calls(const core_recorded_call *calls, size_t n,
                                   size_t stride, cube_error *refusal,
                                   int agree_only)
{
    /* A send to itself replays with its receive, recorded in its group. */
    if (n == 1 && !comm_to_itself(&calls->call, calls->comm->rank))
        return replay(calls->comm, &calls->call, calls->dst, refusal,
                      agree_only);
    /* Every call of the group is posted before any waits (a send and its
     * receive on each of two ranks would otherwise wait for each other). */
    pending *a = calloc(n, sizeof *a);
    if (!a) {
        cube_error *err = cube_error_new(CUBE_ERR_OUT_OF_MEMORY,
                                         "cube_graph_replay: a group of %zu "
                                         "calls",
                                         n);
        for (size_t i = 0; i < n; i++) {
            const core_recorded_call *r = nth(calls, stride, i);
            cube_error_ignore(replay(r->comm, &r->call, r->dst,
                                     cube_error_clone(err), agree_only),
                              "each call is refused with the out-of-memory "
                              "returned for the group");
        }
        cube_error_free(refusal);
        return err;
    }
    /* A rank destroyed since refuses the whole group. */
    cube_error *gone = NULL;
    for (size_t i = 0; i < n && !gone; i++) {
        const core_recorded_call *r = nth(calls, stride, i);
        if (rank_gone(r->comm))
            gone = destroyed_error(r->comm, r->call.kind);
    }
    if (gone && !refusal)
        refusal = cube_error_clone(gone);
    size_t posted = 0;
    for (size_t i = 0; i < n; i++) {
        const core_recorded_call *r = nth(calls, stride, i);
        if (rank_gone(r->comm))
            continue; /* no peer can meet it */
        replay_post(&a[posted++], r, refusal, agree_only);
    }
    comm_pair_self(a, posted);
    cube_error *err = comm_run_pending(a, posted, NULL);
    free(a);
    cube_error_free(refusal);
    if (gone) {
        cube_error_free(err);
        return gone;
    }
    return err;
}

int core_comm_remote(const cube_comm *comm)
{
    return comm->group->remote;
}
