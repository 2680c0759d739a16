/* Communicators on CUDA (cube_backend.comm, cuda_comm_vtable): NCCL
 * communicators and collectives, each ordered on the calling stream like
 * a launch (after the last writers of what it reads and the other
 * streams' uses of what it writes, and marked as a use of both). Copies
 * between devices are cuda_peer.c's.
 *
 * The core has matched and checked every rank's call before a part comes
 * here, so NCCL only ever sees calls that pair up: every rank of a
 * communicator lives in this process and its calls all arrive before any
 * is issued. On a capturing stream NCCL's kernels go into the graph (the
 * core meets the peers' replays before it launches one). A call NCCL still
 * answers "in progress" is polled against the communicator's timeout and
 * aborted past it, so a broken peer is an error, never a hang.
 *
 * Locks: none of its own; the core holds the calling streams.
 */
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backends/cuda/cuda_internal.h"
#include "backends/cuda/nccl_api.h"
#include "base/clock.h"
#include "base/error.h"
#include "cubert/comm.h"
#include "cubert/log.h"

/* --- NCCL communicators --- */

/* One rank's NCCL state: what the core holds of the rank. */
typedef struct cuda_rank {
    cube_backend_comm base; /* first: the core's handle of the rank */
    const nccl_api *nccl;
    ncclComm_t comm;
    uint64_t timeout_ns;
    int aborted; /* in one process; between processes the watch says */
    int remote;  /* a communicator between processes (non-blocking) */
    cuda_server *server;
    cuda_watch *watch; /* remote: shares the communicator with the
                          watchdog (cuda_watchdog.c) */
} cuda_rank;

/* Ranks whose parts this thread issues between group_begin and group_end,
 * and the streams whose cross-stream event must be recorded once NCCL has
 * enqueued their parts (at ncclGroupEnd). */
#define GROUP_RECORDS 64
static _Thread_local int in_group;
static _Thread_local struct {
    cuda_server *s;
    cuda_stream *st;
} group_records[GROUP_RECORDS];
static _Thread_local size_t group_record_count;
/* Calls of ranks between processes in the group: their end is recorded
 * once NCCL enqueued them (at ncclGroupEnd), and each rank's watch is
 * held (its NCCL communicator used) until then. */
static _Thread_local struct {
    cuda_watch *watch;
    cuda_stream *st;
    uint64_t ticket;
} group_ends[GROUP_RECORDS];
static _Thread_local size_t group_end_count;
static _Thread_local struct cuda_rank *group_held[GROUP_RECORDS];
static _Thread_local size_t group_held_count;

/* Polls a non-blocking communicator until NCCL is done with the last
 * call on it; past `deadline` the communicator is aborted. */
static ncclResult_t settle(const nccl_api *n, ncclComm_t comm,
                           cuda_watch *watch, uint64_t deadline, int *timed_out)
{
    ncclResult_t state = ncclInProgress;
    for (unsigned spins = 0;; spins++) {
        ncclResult_t r = n->ncclCommGetAsyncError(comm, &state);
        if (r != ncclSuccess)
            return r;
        if (state != ncclInProgress)
            return state;
        if (cube_clock_ns() >= deadline) {
            *timed_out = 1;
            if (watch)
                cuda_watch_abort_locked(watch); /* held by the caller */
            else
                n->ncclCommAbort(comm);
            return ncclInProgress;
        }
        if (spins > 64) {
            struct timespec pause = {0, 100000};
            nanosleep(&pause, NULL);
        } else {
            sched_yield();
        }
    }
}

static cube_error *nccl_failure(const nccl_api *n, ncclResult_t r,
                                ncclComm_t comm, int timed_out,
                                const char *what)
{
    if (timed_out)
        return cube_error_new(CUBE_ERR_TIMEOUT,
                              "%s: NCCL did not finish within the timeout; "
                              "the communicator was aborted",
                              what);
    return cube_error_new(r == ncclSystemError || r == ncclRemoteError
                              ? CUBE_ERR_UNAVAILABLE
                              : CUBE_ERR_INTERNAL,
                          "%s: %s", what, nccl_result_text(n, r, comm));
}

/* Loads NCCL into *nccl and makes a new unique id (a communicator's
 * rendezvous). */
static cube_error *nccl_new_id(const nccl_api **nccl, ncclUniqueId *id)
{
    cube_error *err = nccl_api_load(nccl);
    if (err)
        return err;
    ncclResult_t r = (*nccl)->ncclGetUniqueId(id);
    if (r != ncclSuccess)
        return nccl_failure(*nccl, r, NULL, 0, "ncclGetUniqueId");
    return NULL;
}

static cube_error *cuda_comm_init(cube_server *const *servers, uint32_t n,
                                  uint64_t timeout_ms,
                                  cube_backend_comm **impls)
{
    const nccl_api *nccl = NULL;
    ncclUniqueId id;
    cube_error *err = nccl_new_id(&nccl, &id);
    if (err)
        return err;
    cuda_rank *ranks = calloc(n, sizeof *ranks);
    if (!ranks)
        return cube_error_new(CUBE_ERR_OUT_OF_MEMORY, "NCCL communicator");
    uint64_t deadline = cube_clock_ns() + timeout_ms * 1000000ull;
    /* Blocking: every rank is made here, in one group, and the core lets
     * a collective reach NCCL only once every rank's call has arrived, so
     * no call can wait on a rank that never comes; a blocking call also
     * costs no polling. */
    nccl_config cfg;
    nccl_config_init(&cfg, 1);
    /* Every rank of this process, from this thread: inside one group, as
     * NCCL requires when one thread makes several ranks. */
    ncclResult_t r = nccl->ncclGroupStart();
    for (uint32_t i = 0; i < n && r == ncclSuccess && !err; i++) {
        cuda_server *s = (cuda_server *)servers[i];
        err = cuda_enter(s);
        if (!err) {
            r = nccl->ncclCommInitRankConfig(&ranks[i].comm, (int)n, id, (int)i,
                                             &cfg);
            if (r == ncclInProgress)
                r = ncclSuccess;
        }
    }
    ncclResult_t end = nccl->ncclGroupEnd();
    if (r == ncclSuccess && end != ncclInProgress)
        r = end;
    int timed_out = 0;
    for (uint32_t i = 0; i < n && !err && r == ncclSuccess; i++)
        if (ranks[i].comm)
            r = settle(nccl, ranks[i].comm, NULL, deadline, &timed_out);
    if (!err && r != ncclSuccess)
        err = nccl_failure(nccl, r, NULL, timed_out,
                           "making the NCCL communicator");
    if (err) {
        for (uint32_t i = 0; i < n; i++)
            if (ranks[i].comm)
                nccl->ncclCommAbort(ranks[i].comm);
        free(ranks);
        return err;
    }
    for (uint32_t i = 0; i < n; i++) {
        cuda_rank *one = malloc(sizeof *one);
        if (!one) {
            for (uint32_t j = 0; j < n; j++) {
                nccl->ncclCommAbort(ranks[j].comm);
                if (j < i)
                    free(impls[j]);
                impls[j] = NULL;
            }
            free(ranks);
            return cube_error_new(CUBE_ERR_OUT_OF_MEMORY, "NCCL communicator");
        }
        *one = ranks[i];
        one->base.vt = &cuda_comm_vtable;
        one->nccl = nccl;
        one->timeout_ns = timeout_ms * 1000000ull;
        impls[i] = &one->base;
    }
    free(ranks);
    cube_log_write(CUBE_LOG_INFO, "cuda",
                   "NCCL %d (%s): communicator of %u rank(s)", nccl->version,
                   nccl->path, n);
    return NULL;
}

static cube_error *cuda_comm_id_new(unsigned char *id)
{
    const nccl_api *nccl = NULL;
    ncclUniqueId uid;
    cube_error *err = nccl_new_id(&nccl, &uid);
    if (err)
        return err;
    _Static_assert(sizeof uid == CUBE_COMM_ID_PAYLOAD,
                   "NCCL's unique id fills the id's payload");
    memcpy(id, &uid, sizeof uid);
    return NULL;
}

static cube_error *cuda_comm_init_rank(cube_server *server,
                                       const unsigned char *id, uint32_t nranks,
                                       uint32_t rank, uint64_t timeout_ms,
                                       cube_backend_comm **impl)
{
    cuda_server *s = (cuda_server *)server;
    *impl = NULL;
    const nccl_api *nccl = NULL;
    cube_error *err = nccl_api_load(&nccl);
    if (!err)
        err = cuda_enter(s);
    if (err)
        return err;
    cuda_rank *one = calloc(1, sizeof *one);
    if (!one)
        return cube_error_new(CUBE_ERR_OUT_OF_MEMORY, "NCCL communicator");
    one->base.vt = &cuda_comm_vtable;
    one->nccl = nccl;
    one->timeout_ns = timeout_ms * 1000000ull;
    one->remote = 1;
    /* Non-blocking: the other ranks are in other processes, where nothing
     * of cubert's can tell whether they come; every wait is polled
     * against the timeout. */
    nccl_config cfg;
    nccl_config_init(&cfg, 0);
    ncclUniqueId uid;
    memcpy(&uid, id, sizeof uid);
    ncclResult_t r = nccl->ncclCommInitRankConfig(&one->comm, (int)nranks, uid,
                                                  (int)rank, &cfg);
    int timed_out = 0;
    if (r == ncclSuccess || r == ncclInProgress)
        r = settle(nccl, one->comm, NULL, cube_clock_ns() + one->timeout_ns,
                   &timed_out);
    if (r != ncclSuccess) {
        err = nccl_failure(nccl, r, one->comm, timed_out,
                           "joining the NCCL communicator");
        if (!timed_out && one->comm)
            nccl->ncclCommAbort(one->comm);
        free(one);
        return err;
    }
    one->server = s;
    err = cuda_watch_open(s, nccl, one->comm, one->timeout_ns, &one->watch);
    if (err) {
        nccl->ncclCommAbort(one->comm);
        free(one);
        return err;
    }
    *impl = &one->base;
    cube_log_write(CUBE_LOG_INFO, "cuda",
                   "NCCL %d (%s): rank %u of %u between processes",
                   nccl->version, nccl->path, rank, nranks);
    return NULL;
}

static void cuda_comm_destroy(cube_server *server, cube_backend_comm *impl)
{
    cuda_rank *rank = (cuda_rank *)impl;
    if (!rank)
        return;
    cuda_server *s = (cuda_server *)server;
    cube_error_ignore(cuda_enter(s), "destroying a communicator goes on "
                                     "without its context");
    /* The watchdog lets go first (it may have aborted the communicator,
     * which freed it). */
    if (rank->watch && cuda_watch_close(rank->watch))
        rank->aborted = 1;
    rank->watch = NULL;
    if (rank->aborted) {
        free(rank);
        return;
    }
    /* Finalize flushes the rank's work; a peer that never comes makes it
     * time out, and the communicator is aborted instead. */
    int timed_out = 0;
    ncclResult_t r = rank->nccl->ncclCommFinalize(rank->comm);
    if (r == ncclSuccess || r == ncclInProgress)
        r = settle(rank->nccl, rank->comm, NULL,
                   cube_clock_ns() + rank->timeout_ns, &timed_out);
    if (timed_out)
        free(rank); /* settle aborted it, which frees it */
    else {
        if (r == ncclSuccess)
            rank->nccl->ncclCommDestroy(rank->comm);
        else
            rank->nccl->ncclCommAbort(rank->comm);
        free(rank);
    }
}

static void cuda_comm_abort(cube_server *server, cube_backend_comm *impl)
{
    (void)server;
    cuda_rank *rank = (cuda_rank *)impl;
    if (!rank || rank->aborted)
        return;
    if (rank->watch) {
        cuda_watch_abort(rank->watch);
        return;
    }
    rank->aborted = 1;
    rank->nccl->ncclCommAbort(rank->comm);
}

static ncclDataType_t nccl_type(uint32_t dtype)
{
    switch (dtype) {
    case CUBE_DTYPE_I8: return ncclInt8;
    case CUBE_DTYPE_U8: return ncclUint8;
    case CUBE_DTYPE_I32: return ncclInt32;
    case CUBE_DTYPE_U32: return ncclUint32;
    case CUBE_DTYPE_I64: return ncclInt64;
    case CUBE_DTYPE_U64: return ncclUint64;
    case CUBE_DTYPE_F16: return ncclFloat16;
    case CUBE_DTYPE_BF16: return ncclBfloat16;
    case CUBE_DTYPE_F64: return ncclFloat64;
    default: return ncclFloat32;
    }
}

static ncclRedOp_t nccl_op(uint32_t op)
{
    switch (op) {
    case CUBE_REDUCE_PROD: return ncclProd;
    case CUBE_REDUCE_MIN: return ncclMin;
    case CUBE_REDUCE_MAX: return ncclMax;
    case CUBE_REDUCE_AVG: return ncclAvg;
    default: return ncclSum;
    }
}

static void *addr(const cube_binding *b)
{
    return b->storage ? (void *)(uintptr_t)(b->storage->address + b->offset)
                      : NULL;
}

/* Enqueues this rank's NCCL call. */
static ncclResult_t enqueue(const nccl_api *n, ncclComm_t comm,
                            const cube_collective *c, CUstream cu)
{
    ncclDataType_t t = nccl_type(c->dtype);
    switch (c->kind) {
    case CUBE_COLLECTIVE_ALL_REDUCE:
        return n->ncclAllReduce(addr(&c->src), addr(&c->dst), c->count, t,
                                nccl_op(c->op), comm, cu);
    case CUBE_COLLECTIVE_BROADCAST:
        return n->ncclBroadcast(addr(&c->src), addr(&c->dst), c->count, t,
                                (int)c->root, comm, cu);
    case CUBE_COLLECTIVE_REDUCE:
        return n->ncclReduce(addr(&c->src), addr(&c->dst), c->count, t,
                             nccl_op(c->op), (int)c->root, comm, cu);
    case CUBE_COLLECTIVE_ALL_GATHER:
        return n->ncclAllGather(addr(&c->src), addr(&c->dst), c->count, t, comm,
                                cu);
    case CUBE_COLLECTIVE_REDUCE_SCATTER:
        return n->ncclReduceScatter(addr(&c->src), addr(&c->dst), c->count, t,
                                    nccl_op(c->op), comm, cu);
    case CUBE_COLLECTIVE_SEND:
        return n->ncclSend(addr(&c->src), c->count, t, (int)c->peer, comm, cu);
    case CUBE_COLLECTIVE_RECV:
        return n->ncclRecv(addr(&c->dst), c->count, t, (int)c->peer, comm, cu);
    }
    return ncclInvalidArgument;
}

/* A part on its way: its stream, its buffers' blocks, and the ticket
 * that follows it on the device (0: not followed). */
typedef struct part {
    const cube_collective *c;
    cuda_stream *st;
    cuda_block *src, *dst;
    uint64_t ticket;
} part;

/* Before the part is enqueued: its stream is entered and waits for the
 * last users of its buffers; a part `watch` follows (a rank between
 * processes, held, when the core asks for a ticket and the stream does
 * not capture) has its start recorded. */
static cube_error *part_begin(cuda_server *s, cube_server_stream *stream,
                              const cube_collective_set *set, cuda_watch *watch,
                              part *p)
{
    p->c = &set->calls[set->index];
    p->src = p->c->src.storage ? p->c->src.storage->cookie : NULL;
    p->dst = p->c->dst.storage ? p->c->dst.storage->cookie : NULL;
    p->ticket = 0;
    p->st = NULL;
    cube_error *err = cuda_stream_begin(s, stream, &p->st);
    if (!err && p->src)
        err = cuda_block_before_use(s, p->st, p->src, 0);
    if (!err && p->dst)
        err = cuda_block_before_use(s, p->st, p->dst, 1);
    int follow = !err && watch && set->ticket && !p->st->capturing;
    if (!err && follow && in_group && group_end_count == GROUP_RECORDS)
        err = cube_error_new(CUBE_ERR_RESOURCE_LIMIT,
                             "more than %d calls between processes in one "
                             "group",
                             GROUP_RECORDS);
    if (!err && follow)
        err = cuda_watch_begin(watch, p->st->cu, &p->ticket);
    return err;
}

/* Enqueues the part with NCCL; outside a group, waits until NCCL took
 * it (past the timeout the communicator is aborted). */
static cube_error *part_enqueue(cuda_rank *rank, cuda_watch *watch,
                                const part *p)
{
    ncclResult_t r = enqueue(rank->nccl, rank->comm, p->c, p->st->cu);
    int timed_out = 0;
    if (r == ncclInProgress && !in_group)
        r = settle(rank->nccl, rank->comm, watch,
                   cube_clock_ns() + rank->timeout_ns, &timed_out);
    else if (r == ncclInProgress)
        r = ncclSuccess; /* enqueued at the group's end */
    if (r == ncclSuccess)
        return NULL;
    if (p->ticket)
        cuda_watch_cancel(watch, p->ticket);
    if (timed_out)
        rank->aborted = 1;
    return nccl_failure(rank->nccl, r, rank->comm, timed_out, "NCCL");
}

/* After the part was enqueued: its end is recorded for the watch (in a
 * group: at the group's end) and its ticket handed to the core. */
static cube_error *part_follow(cuda_watch *watch,
                               const cube_collective_set *set, const part *p)
{
    if (!p->ticket)
        return NULL;
    if (!in_group) {
        cube_error *err = cuda_watch_end(watch, p->st->cu, p->ticket);
        if (err)
            return err;
    } else {
        group_ends[group_end_count].watch = watch;
        group_ends[group_end_count].st = p->st;
        group_ends[group_end_count].ticket = p->ticket;
        group_end_count++;
    }
    *set->ticket = p->ticket;
    return NULL;
}

/* Marks the part as a read of its source and a write of its destination
 * on its stream; a buffer other streams use gets the stream's event
 * recorded after it (in a group: after ncclGroupEnd). */
static cube_error *part_mark(cuda_server *s, const part *p)
{
    if (p->st->capturing)
        return NULL; /* captured, not run: no buffer changes */
    uint64_t seq = cuda_stream_next(p->st);
    int shared = 0;
    if (p->src)
        shared |= cuda_block_used(p->st, p->src, seq, 0);
    if (p->dst)
        shared |= cuda_block_used(p->st, p->dst, seq, 1);
    if (!shared)
        return NULL;
    if (!in_group)
        return cuda_stream_record(s, p->st);
    /* NCCL enqueues grouped parts at ncclGroupEnd: the event that marks
     * them is recorded after it. */
    if (group_record_count == GROUP_RECORDS)
        return cube_error_new(CUBE_ERR_RESOURCE_LIMIT,
                              "more than %d shared buffers in one group",
                              GROUP_RECORDS);
    group_records[group_record_count].s = s;
    group_records[group_record_count].st = p->st;
    group_record_count++;
    return NULL;
}

/* Issues the rank's part on its stream; `watch` (a rank between
 * processes, held) follows it on the device when the core asks. */
static cube_error *issue_part(cuda_server *s, cube_server_stream *stream,
                              cuda_rank *rank, const cube_collective_set *set,
                              cuda_watch *watch)
{
    part p;
    cube_error *err = part_begin(s, stream, set, watch, &p);
    if (!err)
        err = part_enqueue(rank, watch, &p);
    if (!err)
        err = part_follow(watch, set, &p);
    if (!err)
        err = part_mark(s, &p);
    return err;
}

/* Whether this thread's group already holds `w`. */
static int group_holds(const cuda_rank *rank)
{
    for (size_t i = 0; i < group_held_count; i++)
        if (group_held[i] == rank)
            return 1;
    return 0;
}

static cube_error *cuda_collective(cube_server *server,
                                   cube_server_stream *stream,
                                   cube_backend_comm *impl,
                                   const cube_collective_set *set)
{
    cuda_server *s = (cuda_server *)server;
    cuda_rank *rank = (cuda_rank *)impl;
    cuda_watch *w = rank->watch;
    if (!w) {
        if (rank->aborted)
            return cube_error_new(CUBE_ERR_ABORTED,
                                  "the NCCL communicator was aborted");
        return issue_part(s, stream, rank, set, NULL);
    }
    /* Between processes the watchdog shares the communicator: it is held
     * for the call, or in a group until the group's end. */
    if (!(in_group && group_holds(rank))) {
        if (cuda_watch_acquire(w))
            return cube_error_new(CUBE_ERR_ABORTED,
                                  "the NCCL communicator was aborted");
        if (in_group) {
            if (group_held_count == GROUP_RECORDS) {
                cuda_watch_release(w);
                return cube_error_new(CUBE_ERR_RESOURCE_LIMIT,
                                      "more than %d communicators between "
                                      "processes in one group",
                                      GROUP_RECORDS);
            }
            group_held[group_held_count++] = rank;
        }
    }
    cube_error *err = NULL;
    if (set->refused || set->failed)
        /* NCCL cannot tell the other processes that this rank will not
         * come: abort, so that their calls fail instead of waiting. */
        cuda_watch_abort_locked(w);
    else
        err = issue_part(s, stream, rank, set, w);
    if (!in_group)
        cuda_watch_release(w);
    return err;
}

static cube_error *cuda_collective_poll(cube_server *server,
                                        cube_backend_comm *impl,
                                        uint64_t ticket, int *done)
{
    (void)server;
    cuda_rank *rank = (cuda_rank *)impl;
    if (!rank->watch) {
        *done = 1; /* in one process nothing is followed */
        return NULL;
    }
    return cuda_watch_poll(rank->watch, ticket, done);
}

/* A hardware graph holding this rank's captured calls (between
 * processes) is launched between these two: the communicator is held
 * (the watchdog aborts it only after end), and the replay's work is
 * followed as a call's is, its timeout running from when the graph
 * starts on the device. */
static cube_error *cuda_comm_replay_begin(cube_server *server,
                                          cube_server_stream *stream,
                                          cube_backend_comm *impl,
                                          uint64_t *ticket)
{
    cuda_server *s = (cuda_server *)server;
    cuda_rank *rank = (cuda_rank *)impl;
    *ticket = 0;
    if (!rank->watch)
        return cube_error_new(CUBE_ERR_INTERNAL,
                              "a replay followed on a communicator in one "
                              "process");
    if (cuda_watch_acquire(rank->watch))
        return cube_error_new(CUBE_ERR_ABORTED,
                              "the NCCL communicator was aborted; the graph "
                              "holds work of it and is not launched");
    cuda_stream *st = NULL;
    cube_error *err = cuda_stream_begin(s, stream, &st);
    if (!err)
        err = cuda_watch_begin(rank->watch, st->cu, ticket);
    if (err)
        cuda_watch_release(rank->watch);
    return err;
}

static cube_error *cuda_comm_replay_end(cube_server *server,
                                        cube_server_stream *stream,
                                        cube_backend_comm *impl,
                                        uint64_t ticket, int launched)
{
    cuda_server *s = (cuda_server *)server;
    cuda_rank *rank = (cuda_rank *)impl;
    cuda_watch *w = rank->watch;
    if (!w)
        return NULL;
    cuda_stream *st = NULL;
    cube_error *err = launched ? cuda_stream_begin(s, stream, &st) : NULL;
    if (!err && launched)
        err = cuda_watch_end(w, st->cu, ticket);
    else
        cuda_watch_cancel(w, ticket);
    cuda_watch_release(w);
    return err;
}

static void cuda_group_begin(void)
{
    const nccl_api *nccl = NULL;
    cube_error *err = nccl_api_load(&nccl);
    if (err) {
        cube_error_ignore(err, "without NCCL no communicator exists for a "
                               "group to hold");
        return;
    }
    nccl->ncclGroupStart();
    in_group = 1;
    group_record_count = 0;
    group_end_count = 0;
    group_held_count = 0;
}

static cube_error *cuda_group_end(void)
{
    const nccl_api *nccl = NULL;
    cube_error *err = nccl_api_load(&nccl);
    if (err)
        return err;
    in_group = 0;
    ncclResult_t r = nccl->ncclGroupEnd();
    /* Non-blocking communicators (between processes) may still be
     * enqueueing: the records below must come after, so wait for each
     * to land (past its timeout it is aborted). */
    if (r == ncclInProgress)
        r = ncclSuccess;
    int timed_out = 0;
    for (size_t i = 0; i < group_held_count && r == ncclSuccess; i++)
        r = settle(nccl, group_held[i]->comm, group_held[i]->watch,
                   cube_clock_ns() + group_held[i]->timeout_ns, &timed_out);
    for (size_t i = 0; i < group_end_count; i++) {
        cuda_stream *st = group_ends[i].st;
        if (r == ncclSuccess && !err)
            err = cuda_watch_end(group_ends[i].watch, st->cu,
                                 group_ends[i].ticket);
        else
            cuda_watch_cancel(group_ends[i].watch, group_ends[i].ticket);
    }
    group_end_count = 0;
    for (size_t i = 0; i < group_held_count; i++)
        cuda_watch_release(group_held[i]->watch);
    group_held_count = 0;
    for (size_t i = 0; i < group_record_count && !err; i++)
        err = cuda_stream_record(group_records[i].s, group_records[i].st);
    group_record_count = 0;
    if (!err && r != ncclSuccess)
        err = nccl_failure(nccl, r, NULL, timed_out, "ncclGroupEnd");
    return err;
}

const cube_comm_vtable cuda_comm_vtable = {
    .init = cuda_comm_init,
    .init_rank = cuda_comm_init_rank,
    .id_new = cuda_comm_id_new,
    .destroy = cuda_comm_destroy,
    .abort = cuda_comm_abort,
    .collective = cuda_collective,
    .poll = cuda_collective_poll,
    .replay_begin = cuda_comm_replay_begin,
    .replay_end = cuda_comm_replay_end,
    .group_begin = cuda_group_begin,
    .group_end = cuda_group_end,
};
