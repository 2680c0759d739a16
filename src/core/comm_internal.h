/* What the files of communicators share (comm.c, comm_rendezvous.c,
 * comm_issue.c, comm_call.c, comm_follow.c, comm_replay.c): the
 * communicator and its group, the record where the ranks' calls of one
 * collective meet, a thread's call on its way, and the functions one file
 * calls in another (prefix comm_). Not used outside src/core/comm*.c; the
 * rest of the core sees communicators through client_internal.h.
 *
 * Locks, in the order they nest (docs/threading.md has them in the
 * library's order):
 *   1. remote_lock (comm_follow.c), the process's list of communicators
 *      between processes: held while their followed calls are reaped;
 *   2. a group's reap_lock: one reaper of the group's followed calls at a
 *      time, held across the backend's poll slot and while a failed
 *      call's destination records its failure (which enters the calling
 *      thread's stream);
 *   3. a stream's lock: held around the backend's collective slot (and
 *      the capture's record of a call), never while waiting for peers;
 *   4. a group's `lock`, a leaf: held only to post, judge and wait, and
 *      to edit the group's list of followed calls; never across a backend
 *      call, and dropped before a stream's lock is taken.
 * Functions marked CUBE_EXCLUDES take the lock they name themselves.
 */
#ifndef CUBE_CORE_COMM_INTERNAL_H
#define CUBE_CORE_COMM_INTERNAL_H

#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "base/clock.h"
#include "core/client_internal.h"
#include "cubert/comm.h"

/* The calls of one collective (or of one send and its receive). */
typedef struct comm_call {
    /* first: its alignment would pad the fields around it */
    _Alignas(64) unsigned char shared[CUBE_COLLECTIVE_SHARED];
    uint64_t seq;
    int p2p;           /* a send and its receive */
    uint32_t from, to; /* p2p: the sender and the receiver */
    uint32_t expected; /* calls to meet: the ranks, or 2 */
    uint32_t arrived;
    uint32_t issued;        /* calls whose part was issued (or will never be) */
    uint32_t left;          /* calls whose rank is done with the record */
    int ready;              /* every call arrived and was judged */
    int cancelled;          /* timed out before every call arrived */
    cube_error *verdict;    /* why no rank runs it, or NULL */
    cube_collective *calls; /* by rank, or [send, receive] */
    cube_error **refused;   /* per call: why its rank refused it */
    cube_error **failed;    /* per call: its source's failure */
    unsigned char *capturing; /* per call: made on a capturing stream */
    struct comm_call *next;
} comm_call;

/* A call of a communicator between processes that the backend follows on
 * the device (its ticket) until the poll slot says how it ended; its
 * destination pinned so that a failure can be recorded there. */
typedef struct remote_call {
    uint64_t ticket;
    core_alloc *dst; /* or NULL */
    cube_collective_kind kind;
    /* A hardware graph's replay instead (kind unused): every buffer the
     * graph writes, pinned; the array is the entry's. */
    core_alloc **writes;
    size_t nwrites;
} remote_call;

/* What the ranks of one communicator share. */
typedef struct comm_group {
    cube_mutex lock;
    pthread_cond_t changed; /* a call arrived, was judged or cancelled */
    uint32_t n;
    uint32_t alive CUBE_GUARDED_FIELD(lock); /* ranks not destroyed */
    /* Recorded collectives in live graphs: the group (and the ranks'
     * array) outlives the ranks' destroy until their graphs go. */
    uint32_t holds CUBE_GUARDED_FIELD(lock);
    unsigned char *gone CUBE_GUARDED_FIELD(lock); /* per rank: destroyed */
    uint64_t timeout_ns;
    int aborted CUBE_GUARDED_FIELD(lock);
    uint64_t *seq CUBE_GUARDED_FIELD(lock);      /* per rank */
    uint64_t *send_seq CUBE_GUARDED_FIELD(lock); /* per (from, to) */
    uint64_t *recv_seq CUBE_GUARDED_FIELD(lock); /* per (from, to) */
    comm_call *calls CUBE_GUARDED_FIELD(lock);   /* pending */
    /* A freed record of each size (collective, p2p), kept for the next
     * call: a steady stream of calls allocates nothing. */
    comm_call *spare[2] CUBE_GUARDED_FIELD(lock);
    const cube_comm_vtable *vt; /* the backend's */
    /* Made from an id for ranks in other processes: this process holds
     * one rank, and the backend's engine meets the others
     * (cube_comm_init_rank). */
    int remote;
    /* remote: its calls still followed on the device (tickets), oldest
     * first; appended by the rank's thread, removed by a reaper. */
    remote_call *inflight CUBE_GUARDED_FIELD(lock);
    size_t inflight_len CUBE_GUARDED_FIELD(lock);
    size_t inflight_cap CUBE_GUARDED_FIELD(lock);
    cube_mutex reap_lock;          /* remote: one reaper at a time */
    struct cube_comm *remote_rank; /* the rank of this process */
    struct comm_group *remote_next CUBE_GUARDED_FIELD(remote_lock);
} comm_group;

/* One rank of a communicator. In one process the ranks of a group are one
 * array (rank i at index i). */
struct cube_comm {
    comm_group *group;
    uint32_t rank;
    cube_client *client;
    cube_backend_comm *impl; /* the backend's, or NULL */
    /* Hardware graphs holding this rank's captured device work: its
     * backend communicator is destroyed when the last of them goes, if
     * cube_comm_destroy came first (destroy_deferred). Under the group's
     * lock. */
    uint32_t hw_holds;
    int destroy_deferred;
};

/* A call this thread posted and has yet to run (right away, or at the
 * end of its group). */
typedef struct pending {
    cube_comm *comm;
    comm_call *call;
    uint32_t index;    /* its place in call->calls */
    cube_error *local; /* its own rank's refusal, answered as is */
    core_resolved src, dst;
    int has_src, has_dst;
    uint64_t dst_bytes;
    uint64_t deadline_ns; /* set when the call first has to wait */
    cube_error *result;   /* the answer, once run */
    int noted;            /* the stream counted the failure for its windows */
    /* Made on a capturing stream: once the ranks agree it is recorded in
     * the capture, not run, and the failure store is the graph's. */
    int capturing;
    /* The capture is the backend's (a hardware graph): the backend
     * captures the call itself when it is recorded. */
    int hardware;
    /* A hardware graph's replay: the ranks only agree; the graph runs the
     * call. */
    int agree_only;
    /* A call of a communicator between processes: its arguments and its
     * source's failure, handed to the backend with it. */
    cube_collective mine;
    cube_error *failure;
    /* A software graph's replay of such a call: its destination (the
     * graph pins it), marked when the call fails on the device later. */
    core_alloc *replay_dst;
    /* Recorded in a capture as part of a group: the group's tag. */
    uint64_t group;
    /* The calling thread's stream of the rank's client, once looked up. */
    core_stream *stream;
    /* This rank's call was the last to arrive and judged the record: it
     * knows the verdict without waiting. */
    int judged;
    /* A send or receive whose peer is the calling rank: not posted, but
     * paired by comm_pair_self with its partner of the same group (its
     * arguments and source's failure kept in mine and failure). */
    int self;
} pending;

/* --- names and small predicates --- */

static inline int comm_is_reduction(cube_collective_kind kind)
{
    return kind == CUBE_COLLECTIVE_ALL_REDUCE ||
           kind == CUBE_COLLECTIVE_REDUCE ||
           kind == CUBE_COLLECTIVE_REDUCE_SCATTER;
}

static inline int comm_is_p2p(cube_collective_kind kind)
{
    return kind == CUBE_COLLECTIVE_SEND || kind == CUBE_COLLECTIVE_RECV;
}

/* The collectives that name a root rank. */
static inline int comm_has_root(cube_collective_kind kind)
{
    return kind == CUBE_COLLECTIVE_BROADCAST || kind == CUBE_COLLECTIVE_REDUCE;
}

/* A send or receive whose peer is the calling rank. */
static inline int comm_to_itself(const cube_collective *call, uint32_t rank)
{
    return comm_is_p2p(call->kind) && call->peer == rank;
}

/* --- comm.c: the object --- */

/* The public function of a call of `kind`, for errors ("cube_send"). */
const char *comm_kind_name(cube_collective_kind kind);
/* CUBE_ERR_ABORTED for a call of `kind`. */
cube_error *comm_aborted_error(cube_collective_kind kind);
/* Frees comm's group and its ranks: call once no rank is alive and no
 * graph holds the group, with none of its locks held. */
void comm_free_ranks(cube_comm *comm);

/* --- comm_rendezvous.c: where the ranks' calls meet --- */

/* Frees a record and what it holds. */
void comm_call_free(comm_call *k);
/* Adds call `c`'s failed source (`failed`, cloned) to `several`, made
 * first when NULL; returns it. */
cube_error *comm_add_failed_source(cube_error *several,
                                   const cube_collective *c,
                                   const cube_error *failed);
/* Posts this thread's call `mine` (`failure`, its source's, taken) in
 * the record its sequence number names; p->call is set, or p->local
 * says why not. */
void comm_post(pending *p, const cube_collective *mine, cube_error *failure)
    CUBE_EXCLUDES(p->comm->group->lock);
/* Waits until p's call is judged, cancelled (the timeout) or aborted:
 * NULL when this rank may run its part, else what to answer. */
cube_error *comm_await(pending *p) CUBE_EXCLUDES(p->comm->group->lock);
/* This rank's part of p's call was issued (or will never be). */
void comm_mark_issued(pending *p) CUBE_EXCLUDES(p->comm->group->lock);
/* This rank is done with p's call (marked issued first when `mark`);
 * the last rank to leave frees the record. */
void comm_leave(pending *p, int mark) CUBE_EXCLUDES(p->comm->group->lock);
/* Pairs the sends to the calling rank in a[0..n) with their receives,
 * judged at once; refuses those left without a partner. Takes each
 * call's group lock in turn: call with none held. */
void comm_pair_self(pending *a, size_t n);

/* --- comm_issue.c: a rank's part --- */

/* The calling thread's stream of p's client, looked up once per call.
 * Call with no stream entered. */
cube_error *comm_stream_of(pending *p, core_stream **out);
/* Drops the pins of p's buffers without settling them (a dry run). */
void comm_drop_pins(pending *p);
/* Judges and issues the call of a communicator of one rank in this
 * process at once (`failure` taken). Call with no stream entered and no
 * group's lock held. */
cube_error *comm_run_alone(pending *p, const cube_collective *mine,
                           cube_error *failure);
/* Records p's call `mine` in the capture of `st`, or refuses it when
 * the capture ended since the call was made. */
cube_error *comm_record_in_capture(pending *p, core_stream *st,
                                   const cube_collective *mine)
    CUBE_REQUIRES(st->lock);
/* Runs the calls a[0..n) this thread posted (or queued): waits, issues,
 * settles; the first error, its index in *first_at when not NULL. Call
 * with no stream entered and no group's lock held. */
cube_error *comm_run_pending(pending *a, size_t n, size_t *first_at);

/* --- comm_follow.c: calls between processes followed on the device --- */

/* Puts the group of a communicator between processes whose backend
 * follows its calls on the process's list. Takes remote_lock. */
void comm_remote_list(comm_group *g);
/* Before a rank between processes goes: waits a while for its followed
 * calls, takes the group off the list, and marks the destinations of
 * calls still running. Takes remote_lock, then the group's locks. */
void comm_drain_remote(comm_group *g) CUBE_EXCLUDES(g->reap_lock, g->lock);
/* Issues p's call of a communicator between processes through the
 * backend's engine, followed on the device when the backend can. Call
 * with no stream entered and no group's lock held. */
cube_error *comm_issue_remote(pending *p);

#endif /* CUBE_CORE_COMM_INTERNAL_H */
