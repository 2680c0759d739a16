/* cubert — the communicator vtable: what a backend implements for
 * communicators and collectives (ServerCommunication, but for
 * cube_copy_peer, which is a server slot: cubert/backend/server.h).
 *
 * A backend with collectives points cube_backend.comm at one
 * cube_comm_vtable; NULL there means it has none (cube_comm_init_all,
 * cube_comm_init_rank and cube_comm_id_new answer CUBE_ERR_UNSUPPORTED).
 * One rank of a communicator, as the backend keeps it, is a
 * cube_backend_comm, which init or init_rank makes and destroy frees; the
 * core hands it back to every slot that acts on that rank.
 *
 * The client (src/core) is the only caller of these slots. It matches
 * and checks the calls of every rank of a collective before a part
 * reaches the backend (the rendezvous), so that a backend only ever sees
 * calls that pair up; see cube_collective_set for what it is handed. The
 * ranks' parts come from the threads that made the calls, several at
 * once, each with its calling stream held (the stream slots' rule in
 * server.h): a backend protects what its ranks share. Slots marked
 * (optional) may be NULL; the client then applies the default each
 * names. Every slot that can fail returns `cube_error *` (NULL on
 * success) which the client owns.
 */
#ifndef CUBERT_BACKEND_COMM_H
#define CUBERT_BACKEND_COMM_H

#include <stdint.h>

#include "cubert/backend/server.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The backend's part of a cube_comm_id. */
#define CUBE_COMM_ID_PAYLOAD 128

/* Collectives as the core hands them to a backend (cubert/comm.h). */
typedef enum cube_collective_kind {
    CUBE_COLLECTIVE_ALL_REDUCE = 1,
    CUBE_COLLECTIVE_BROADCAST = 2,
    CUBE_COLLECTIVE_REDUCE = 3,
    CUBE_COLLECTIVE_ALL_GATHER = 4,
    CUBE_COLLECTIVE_REDUCE_SCATTER = 5,
    CUBE_COLLECTIVE_SEND = 6,
    CUBE_COLLECTIVE_RECV = 7
} cube_collective_kind;

/* One rank's call: its buffers (storage NULL where the call has none:
 * a broadcast's source off the root, a reduce's destination off it, the
 * destination of a send, the source of a receive) and the call's
 * arguments, checked by the core. */
typedef struct cube_collective {
    cube_collective_kind kind;
    cube_binding src, dst;
    uint64_t count;  /* elements per rank, as in cubert/comm.h */
    uint32_t dtype;  /* cube_dtype */
    uint32_t op;     /* cube_reduce_op, for reductions */
    uint32_t root;   /* broadcast, reduce */
    uint32_t peer;   /* send, receive */
    uint32_t rank;   /* the caller's rank */
    uint32_t nranks; /* the communicator's size */
} cube_collective;

/* Every call of one collective, handed to each rank's collective slot
 * once all of them arrived and agreed: `calls` by rank (nranks entries),
 * or for a send and its receive the two calls ([0] the send, [1] the
 * receive; both the same rank's for a send to itself, which the core
 * pairs and hands over this way on a communicator between processes
 * too, with `remote` 0, inside group_begin/group_end). The caller's own call is
 * calls[index]. `shared` is CUBE_COLLECTIVE_SHARED bytes the core zeroes for
 * the calls of this one collective to coordinate through (host backends share
 * its work out there); it lives until every call of it returned. */
#define CUBE_COLLECTIVE_SHARED 128
typedef struct cube_collective_set {
    const cube_collective *calls;
    uint32_t count;
    uint32_t index;
    void *shared;
    /* A communicator between processes (made by init_rank): `calls`
     * is this rank's call alone, which the backend's engine matches with
     * the other processes'. `refused` (this rank refused the call: its
     * arguments, its buffers) or `failed` (its source carries a failure)
     * set: the backend moves no data and tells the other ranks, so that
     * they answer an error rather than wait (an engine that cannot tell
     * them aborts the communicator), and returns NULL (the core answers
     * for this rank). The backend answers CUBE_ERR_INVALID_ARGUMENT or
     * CUBE_ERR_SEVERAL for a refusal or a failure of another rank's. */
    int remote;
    const cube_error *refused;
    const cube_error *failed;
    /* remote only (else NULL): where a backend whose part finishes on the
     * device later, and may fail there past the call (a peer process that
     * never comes: its watchdog aborts the communicator), puts a nonzero
     * ticket for poll. Left 0: nothing to follow. */
    uint64_t *ticket;
    /* remote only: the call is made on a capturing stream, to be recorded
     * in a graph rather than run. A backend with software graphs (no
     * begin_capture) moves no data: its engine checks that every rank
     * captures the call too and answers CUBE_ERR_GRAPH_STATE on every
     * rank when some do not (NULL: the core records it; each replay then
     * issues it as a call). A backend with hardware graphs captures its
     * part into the stream's graph as it would issue it; it need not ask
     * the peers (the graph's replays are followed through
     * replay_begin). */
    int capturing;
} cube_collective_set;

/* One rank of a communicator as a backend keeps it. A backend's own
 * struct starts with this member (as a server starts with cube_server)
 * and the backend owns the rest; `vt` is the table whose init or
 * init_rank made it. The core keeps the pointer from init or init_rank
 * until it calls destroy, and frees nothing of it. */
typedef struct cube_backend_comm {
    const cube_comm_vtable *vt;
} cube_backend_comm;

struct cube_comm_vtable {
    /* (optional) init: makes the backend's state of each rank of a new
     * communicator over `servers` (n ranks, one server each, all of this
     * backend) into comms[i] (NULL when it keeps none), giving up after
     * `timeout_ms`. Called once for the whole communicator, from the one
     * thread that calls cube_comm_init_all. Without it every rank's is
     * NULL (a host backend's ranks need no state: collective works from
     * the set alone). Errors: the engine's (CUBE_ERR_UNAVAILABLE when it
     * cannot be loaded, CUBE_ERR_OUT_OF_MEMORY, CUBE_ERR_TIMEOUT); on an
     * error no rank is left made, and the core answers it. */
    cube_error *(*init)(cube_server *const *servers, uint32_t n,
                        uint64_t timeout_ms, cube_backend_comm **comms);
    /* (optional) init_rank: makes rank `rank` of `nranks` of a
     * communicator between processes, named by `id` (what id_new made in
     * one of them, CUBE_COMM_ID_PAYLOAD bytes), in *out; every rank makes
     * its own, in its own process. Called from the thread that calls
     * cube_comm_init_rank, for a client of `server`. Gives up after
     * `timeout_ms` (CUBE_ERR_TIMEOUT); CUBE_ERR_UNAVAILABLE when the
     * engine cannot be loaded or the peers not reached. Without it such
     * communicators are CUBE_ERR_UNSUPPORTED. */
    cube_error *(*init_rank)(cube_server *server, const unsigned char *id,
                             uint32_t nranks, uint32_t rank,
                             uint64_t timeout_ms, cube_backend_comm **out);
    /* (optional, with init_rank) id_new: fills the CUBE_COMM_ID_PAYLOAD
     * bytes that name a new communicator between processes
     * (cube_comm_id_new). No server is needed: any thread, before any
     * device is open. Errors: CUBE_ERR_UNAVAILABLE (the engine cannot be
     * loaded or started). Without it cube_comm_id_new answers
     * CUBE_ERR_UNSUPPORTED. */
    cube_error *(*id_new)(unsigned char *id);
    /* (optional) destroy: frees one rank's `comm` (never NULL), `server`
     * being the server of the rank's client. Called once per rank that
     * init or init_rank made, from the thread that destroys the rank or
     * drops the last graph holding its captured work, once none of its
     * calls can still be issued. Never fails. Without it nothing is
     * freed. */
    void (*destroy)(cube_server *server, cube_backend_comm *comm);
    /* (optional) abort: stops one rank's work in flight (never blocks),
     * for cube_comm_abort: from any thread, while other threads may be
     * inside collective or poll for the rank (never NULL). Without it
     * only the core's waits are woken. */
    void (*abort)(cube_server *server, cube_backend_comm *comm);
    /* collective: issues the calling rank's part (set->calls[set->index])
     * of a collective on `stream`, ordered like a launch that reads src
     * and writes dst; `comm` is the rank's (NULL where init kept none).
     * Every call of the set is made, by whichever threads issued them;
     * a call returns once its rank's part is issued (a host backend:
     * done, destinations written). Called with the stream held. An error
     * means the part did not run; the core records it on the
     * destination. Required: a table without it is the same as none. */
    cube_error *(*collective)(cube_server *server, cube_server_stream *stream,
                              cube_backend_comm *comm,
                              const cube_collective_set *set);
    /* (optional, with tickets) poll: how the call `ticket` (from
     * set->ticket) of rank `comm` ended on the device. *done 0: it has
     * not finished yet (NULL returned); 1: it finished (NULL) or failed
     * (the error: its destination cannot be trusted). A ticket answered
     * done is forgotten; one never polled is forgotten when its rank is
     * destroyed. Any thread; never blocks. Without it the core follows
     * nothing: a call is done when collective returns. */
    cube_error *(*poll)(cube_server *server, cube_backend_comm *comm,
                        uint64_t ticket, int *done);
    /* (optional, with hardware graphs and poll) replay_begin /
     * replay_end: bracket the launch of a hardware graph that captured
     * calls of communicator `comm` (between processes) on `stream`.
     * Begin holds the communicator (the backend does not abort it until
     * end) and starts following the replay's device work in *ticket;
     * CUBE_ERR_ABORTED when the communicator was aborted (the graph holds
     * work of it and must not launch). End, with `launched` 1, marks the
     * end of the replay's work on the stream (the ticket then answers
     * through poll, failed when the work did not end within the timeout
     * after it started, or the communicator was aborted first); with
     * `launched` 0 forgets the ticket. End lets the communicator go in
     * either case. Called by the thread replaying the graph, with the
     * stream held. Errors of begin: CUBE_ERR_ABORTED,
     * CUBE_ERR_OUT_OF_MEMORY, a driver error; of end: a driver error (the
     * ticket is then forgotten). Without them such a graph's replay is
     * CUBE_ERR_UNSUPPORTED, and a capture between processes refuses the
     * calls. */
    cube_error *(*replay_begin)(cube_server *server, cube_server_stream *stream,
                                cube_backend_comm *comm, uint64_t *ticket);
    cube_error *(*replay_end)(cube_server *server, cube_server_stream *stream,
                              cube_backend_comm *comm, uint64_t ticket,
                              int launched);
    /* (optional, both or neither) group_begin / group_end: bracket the
     * parts one thread issues for several ranks at once (NCCL's group
     * calls). They act on no rank and no server: the state is the calling
     * thread's, and only collective calls of that thread come between
     * them. An error of group_end is given to each part issued in the
     * group that had none. Without them the parts are issued one by
     * one. */
    void (*group_begin)(void);
    cube_error *(*group_end)(void);
};

#ifdef __cplusplus
}
#endif

#endif /* CUBERT_BACKEND_COMM_H */
