/* One call of a collective or of send and receive, from the public
 * entry points (cube_all_reduce ... cube_recv) to its answer: its checks,
 * its buffers resolved, whether a capture holds it, and its place in the
 * calling thread's group (cube_group_begin, cube_group_end), whose calls
 * are posted as they are made and run together at the group's end.
 */
#include <stdlib.h>
#include <string.h>

#include "base/grow.h"
#include "core/comm_internal.h"

#define MAX_GROUP_DEPTH 1024

static _Thread_local int group_depth;
static _Thread_local pending *queue;
static _Thread_local size_t queue_len, queue_cap;
/* The first call of the open group that could not be queued (no memory):
 * answered at once, and again by cube_group_end at its place. */
static _Thread_local cube_error *unqueued;
static _Thread_local size_t unqueued_at;

/* --- one call --- */

/* Resolves `h` for this call, needing at least `bytes`; the failure of
 * its buffer goes to *failure when asked. */
static cube_error *take(cube_client *c, cube_handle h, uint64_t bytes,
                        const char *what, const char *fn, core_resolved *out,
                        cube_error **failure)
{
    cube_error *err = core_resolve(c, h, fn, out);
    if (err)
        return cube_error_prefix(err, "%s", what);
    if (out->size < bytes) {
        cube_error *e = cube_error_new(
            CUBE_ERR_INVALID_ARGUMENT,
            "%s: the %s holds %llu bytes; the call needs %llu", fn, what,
            (unsigned long long)out->size, (unsigned long long)bytes);
        core_resolved_drop(c, out);
        return e;
    }
    err = core_materialize(c, out, 1);
    if (err) {
        core_resolved_drop(c, out);
        return err;
    }
    if (failure)
        *failure = core_failure_get(c, out->alloc);
    return NULL;
}

/* In place is the same range, or NCCL's layouts for all-gather and
 * reduce-scatter; any other overlap of the source and the destination
 * would read bytes the call already wrote. */
static cube_error *check_overlap(const cube_collective *mine, const pending *p,
                                 uint64_t src_bytes, uint64_t dst_bytes,
                                 uint64_t one, const char *fn)
{
    if (p->src.alloc != p->dst.alloc)
        return NULL;
    uint64_t s = p->src.offset, d = p->dst.offset;
    if (s + src_bytes <= d || d + dst_bytes <= s)
        return NULL;
    uint64_t mine_at = (uint64_t)mine->rank * one;
    if (mine->kind == CUBE_COLLECTIVE_ALL_GATHER       ? s == d + mine_at
        : mine->kind == CUBE_COLLECTIVE_REDUCE_SCATTER ? d == s + mine_at
                                                       : s == d)
        return NULL;
    return cube_error_new(
        CUBE_ERR_INVALID_ARGUMENT,
        "%s: the source (bytes %llu..%llu) and the "
        "destination (bytes %llu..%llu) of one buffer "
        "overlap other than in place",
        fn, (unsigned long long)s, (unsigned long long)s + src_bytes,
        (unsigned long long)d, (unsigned long long)d + dst_bytes);
}

static int is_reduce_op(uint32_t op)
{
    return op >= CUBE_REDUCE_SUM && op <= CUBE_REDUCE_AVG;
}

/* Whether one rank's call of a communicator of n ranks, made by rank r,
 * is well formed: NULL when it is, else why not. */
static cube_error *check_call(const cube_collective *mine, uint32_t n,
                              uint32_t r)
{
    const char *fn = comm_kind_name(mine->kind);
    uint32_t es = cube_dtype_size((cube_dtype)mine->dtype);
    if (mine->count == 0)
        return cube_error_new(CUBE_ERR_INVALID_ARGUMENT, "%s: count is 0", fn);
    if (!es)
        return cube_error_new(CUBE_ERR_INVALID_ARGUMENT,
                              "%s: dtype %u is not a cube_dtype", fn,
                              mine->dtype);
    if (comm_is_reduction(mine->kind) && !is_reduce_op(mine->op))
        return cube_error_new(CUBE_ERR_INVALID_ARGUMENT,
                              "%s: op %u is not a cube_reduce_op", fn,
                              mine->op);
    if (comm_has_root(mine->kind) && mine->root >= n)
        return cube_error_new(CUBE_ERR_INVALID_ARGUMENT,
                              "%s: root %u is not a rank (0..%u)", fn,
                              mine->root, n - 1);
    if (comm_is_p2p(mine->kind) && mine->peer >= n)
        return cube_error_new(CUBE_ERR_INVALID_ARGUMENT,
                              "%s: peer %u is not a rank (0..%u)", fn,
                              mine->peer, n - 1);
    /* Outside a group the one thread that makes this rank's calls could
     * never make the other half: refused rather than left to time out. */
    if (comm_to_itself(mine, r) && group_depth == 0)
        return cube_error_new(CUBE_ERR_INVALID_ARGUMENT,
                              "%s: peer %u is the calling rank; a send to "
                              "itself and its receive are made in one group "
                              "(cube_group_begin)",
                              fn, mine->peer);
    if (mine->count > UINT64_MAX / es / n)
        return cube_error_new(CUBE_ERR_INVALID_ARGUMENT,
                              "%s: count %llu overflows", fn,
                              (unsigned long long)mine->count);
    return NULL;
}

/* The bytes rank r's call (checked) reads from its source and writes to
 * its destination; `one` is one rank's part. */
static void call_bytes(const cube_collective *mine, uint32_t n, uint32_t r,
                       uint64_t one, uint64_t *src_bytes, uint64_t *dst_bytes)
{
    uint64_t all = one * n;
    *src_bytes = *dst_bytes = 0;
    switch (mine->kind) {
    case CUBE_COLLECTIVE_ALL_REDUCE: *src_bytes = *dst_bytes = one; break;
    case CUBE_COLLECTIVE_BROADCAST:
        *src_bytes = r == mine->root ? one : 0;
        *dst_bytes = one;
        break;
    case CUBE_COLLECTIVE_REDUCE:
        *src_bytes = one;
        *dst_bytes = r == mine->root ? one : 0;
        break;
    case CUBE_COLLECTIVE_ALL_GATHER:
        *src_bytes = one;
        *dst_bytes = all;
        break;
    case CUBE_COLLECTIVE_REDUCE_SCATTER:
        *src_bytes = all;
        *dst_bytes = one;
        break;
    case CUBE_COLLECTIVE_SEND: *src_bytes = one; break;
    case CUBE_COLLECTIVE_RECV: *dst_bytes = one; break;
    }
}

/* Checks one rank's call and resolves its buffers into p. A refusal
 * goes to p->local: the call is still posted, so the peers learn of it. */
static cube_error *prepare(pending *p, cube_collective *mine, cube_handle src,
                           cube_handle dst, cube_error **failure)
{
    cube_comm *comm = p->comm;
    cube_client *c = comm->client;
    const char *fn = comm_kind_name(mine->kind);
    uint32_t n = comm->group->n, r = comm->rank;
    if (atomic_load_explicit(&c->dev->faulted, memory_order_acquire))
        return core_fault_get(c);
    cube_error *err = check_call(mine, n, r);
    if (err)
        return err;
    uint64_t one = mine->count * cube_dtype_size((cube_dtype)mine->dtype);
    uint64_t src_bytes, dst_bytes;
    call_bytes(mine, n, r, one, &src_bytes, &dst_bytes);
    if (src_bytes) {
        err = take(c, src, src_bytes, "source", fn, &p->src, failure);
        if (err)
            return err;
        p->has_src = 1;
        mine->src = core_binding(&p->src);
    }
    if (dst_bytes) {
        err = take(c, dst, dst_bytes, "destination", fn, &p->dst, NULL);
        if (err)
            return err;
        p->has_dst = 1;
        p->dst_bytes = dst_bytes;
        mine->dst = core_binding(&p->dst);
    }
    if (p->has_src && p->has_dst)
        return check_overlap(mine, p, src_bytes, dst_bytes, one, fn);
    return NULL;
}

/* Room in this thread's group queue for one more call; 0 for want of
 * memory. */
static int queue_reserve(void)
{
    pending *grown = cube_grow(queue, queue_len, &queue_cap, sizeof *grown, 8);
    if (!grown)
        return 0;
    queue = grown;
    return 1;
}

/* Whether a capture can hold comm's calls: in one process always;
 * between processes when the backend's graphs are software ones, or when
 * it follows a hardware graph's replays (replay_begin and _end). */
static int capture_holds_calls(const cube_comm *comm)
{
    const cube_comm_vtable *cvt = comm->group->vt;
    return !comm->group->remote || !comm->client->vt->begin_capture ||
           (cvt->replay_begin && cvt->replay_end);
}

/* Whether the calling thread's stream captures p's call (p->capturing,
 * p->hardware), or refuses it (p->local).
 *
 * In one process a capture records the call once every rank's call
 * agreed (each capturing): a software graph re-issues it at each replay,
 * a hardware graph (CUDA) holds the backend's own captured call, and its
 * replays first meet the peers' so that no rank launches device work its
 * peers will not match. Between processes the backend's engine checks
 * that every rank captures (software graphs), or captures its part and
 * follows each replay's device work (hardware graphs, replay_begin).
 * A group's calls are recorded together at its end and replayed as a
 * group. */
static void capture_mode(pending *p, const cube_collective *mine)
{
    cube_comm *comm = p->comm;
    core_stream *st = NULL;
    p->local = comm_stream_of(p, &st);
    if (p->local)
        return;
    core_stream_lock(st);
    if (!st->capture) {
        /* a call */
    } else if (st->capture_client == comm->client &&
               capture_holds_calls(comm)) {
        p->capturing = 1;
        p->hardware = comm->client->vt->begin_capture != NULL;
    } else
        p->local =
            core_stream_refuse_in_capture(st, comm_kind_name(mine->kind));
    core_stream_unlock(st);
}

/* Whether p's call has no peer to meet: a communicator of one rank in
 * this process, outside a group and a capture. */
static int runs_alone(const pending *p)
{
    const comm_group *g = p->comm->group;
    return g->n == 1 && !g->remote && group_depth == 0 && !p->capturing;
}

static cube_error *collective_call(cube_comm *comm, cube_collective mine,
                                   cube_handle src, cube_handle dst)
{
    pending p;
    memset(&p, 0, sizeof p);
    p.comm = comm;
    mine.rank = comm->rank;
    mine.nranks = comm->group->n;
    cube_error *failure = NULL;
    p.local = prepare(&p, &mine, src, dst, &failure);
    if (!p.local && core_dry_run_active(comm->client)) {
        /* Checked and dropped, as a launch in a dry run: nothing ran, so
         * nothing is recorded or cleared. */
        cube_error_free(failure);
        comm_drop_pins(&p);
        return NULL;
    }
    if (!p.local)
        capture_mode(&p, &mine);
    if (runs_alone(&p))
        return comm_run_alone(&p, &mine, failure);
    /* A call of a group takes its place in the queue before it is posted:
     * one that cannot be queued is refused like any of this rank's own
     * refusals, which the peers learn of at once instead of waiting for a
     * call that never comes. */
    int queued = group_depth > 0 && queue_reserve();
    if (group_depth > 0 && !queued) {
        cube_error_free(p.local);
        p.local = cube_error_new(CUBE_ERR_OUT_OF_MEMORY,
                                 "%s: no memory to queue the call in its "
                                 "group",
                                 comm_kind_name(mine.kind));
    }
    /* This rank's own refusal is its answer; the peers learn of it. A send
     * to itself waits for its partner in the group (comm_pair_self). */
    p.self = queued && comm_to_itself(&mine, comm->rank);
    if (comm->group->remote || p.self) {
        p.mine = mine;
        p.failure = failure;
    } else {
        comm_post(&p, &mine, failure);
    }
    cube_error *own = p.local ? cube_error_clone(p.local) : NULL;
    if (queued) {
        queue[queue_len++] = p;
        return own;
    }
    if (group_depth > 0 && !unqueued) {
        unqueued = own ? cube_error_clone(own) : NULL;
        unqueued_at = queue_len;
    }
    cube_error *e = comm_run_pending(&p, 1, NULL);
    cube_error_free(own);
    return e;
}

/* The public calls: counted in flight on the rank's client. */
#define COMM_CALL(comm, fn, mine, src, dst)                                    \
    do {                                                                       \
        if (!(comm))                                                           \
            return cube_error_new(CUBE_ERR_INVALID_ARGUMENT,                   \
                                  fn ": comm is NULL");                        \
        CORE_CALL((comm)->client, fn,                                          \
                  collective_call((comm), (mine), (src), (dst)));              \
    } while (0)

static cube_collective make(cube_collective_kind kind, uint64_t count,
                            cube_dtype dtype, uint32_t op, uint32_t root,
                            uint32_t peer)
{
    cube_collective m;
    memset(&m, 0, sizeof m);
    m.kind = kind;
    m.count = count;
    m.dtype = (uint32_t)dtype;
    m.op = op;
    m.root = root;
    m.peer = peer;
    return m;
}

static const cube_handle no_handle = {0};

cube_error *cube_all_reduce(cube_comm *comm, cube_handle src, cube_handle dst,
                            uint64_t count, cube_dtype dtype, cube_reduce_op op)
{
    COMM_CALL(comm, "cube_all_reduce",
              make(CUBE_COLLECTIVE_ALL_REDUCE, count, dtype, op, 0, 0), src,
              dst);
}

cube_error *cube_broadcast(cube_comm *comm, cube_handle src, cube_handle dst,
                           uint64_t count, cube_dtype dtype, uint32_t root)
{
    COMM_CALL(comm, "cube_broadcast",
              make(CUBE_COLLECTIVE_BROADCAST, count, dtype, 0, root, 0), src,
              dst);
}

cube_error *cube_reduce(cube_comm *comm, cube_handle src, cube_handle dst,
                        uint64_t count, cube_dtype dtype, cube_reduce_op op,
                        uint32_t root)
{
    COMM_CALL(comm, "cube_reduce",
              make(CUBE_COLLECTIVE_REDUCE, count, dtype, op, root, 0), src,
              dst);
}

cube_error *cube_all_gather(cube_comm *comm, cube_handle src, cube_handle dst,
                            uint64_t count, cube_dtype dtype)
{
    COMM_CALL(comm, "cube_all_gather",
              make(CUBE_COLLECTIVE_ALL_GATHER, count, dtype, 0, 0, 0), src,
              dst);
}

cube_error *cube_reduce_scatter(cube_comm *comm, cube_handle src,
                                cube_handle dst, uint64_t count,
                                cube_dtype dtype, cube_reduce_op op)
{
    COMM_CALL(comm, "cube_reduce_scatter",
              make(CUBE_COLLECTIVE_REDUCE_SCATTER, count, dtype, op, 0, 0), src,
              dst);
}

cube_error *cube_send(cube_comm *comm, cube_handle src, uint64_t count,
                      cube_dtype dtype, uint32_t peer)
{
    COMM_CALL(comm, "cube_send",
              make(CUBE_COLLECTIVE_SEND, count, dtype, 0, 0, peer), src,
              no_handle);
}

cube_error *cube_recv(cube_comm *comm, cube_handle dst, uint64_t count,
                      cube_dtype dtype, uint32_t peer)
{
    COMM_CALL(comm, "cube_recv",
              make(CUBE_COLLECTIVE_RECV, count, dtype, 0, 0, peer), no_handle,
              dst);
}

/* --- groups --- */

cube_error *cube_group_begin(void)
{
    if (group_depth >= MAX_GROUP_DEPTH)
        return cube_error_new(CUBE_ERR_RESOURCE_LIMIT,
                              "cube_group_begin: groups nest at most %d deep",
                              MAX_GROUP_DEPTH);
    group_depth++;
    return NULL;
}

cube_error *cube_group_end(void)
{
    if (group_depth == 0)
        return cube_error_new(CUBE_ERR_INVALID_ARGUMENT,
                              "cube_group_end: no group is open on this "
                              "thread");
    if (--group_depth > 0)
        return NULL;
    pending *a = queue;
    size_t n = queue_len, first_at = n;
    queue = NULL;
    queue_len = queue_cap = 0;
    comm_pair_self(a, n);
    cube_error *err = comm_run_pending(a, n, &first_at);
    free(a);
    /* A call that could not be queued failed at its place among them. */
    if (unqueued && (!err || unqueued_at <= first_at)) {
        cube_error_free(err);
        err = unqueued;
    } else {
        cube_error_free(unqueued);
    }
    unqueued = NULL;
    return err;
}
