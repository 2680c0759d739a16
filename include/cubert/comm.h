/* cubert — data between devices: copies from one client's buffer to
 * another's, and communicators with their collectives.
 *
 * A communicator joins N clients (its ranks, 0..N-1), each on its own
 * device, for collectives: all-reduce, broadcast, reduce, all-gather,
 * reduce-scatter, and point-to-point send and receive. It is made from a
 * set of clients of one process (cube_comm_init_all). The CPU backend runs
 * them between its virtual devices (CUBERT_CPU_DEVICES); CUDA through NCCL.
 *
 * Like a launch, each collective call works on the calling thread's
 * stream of its rank's client, in order with the work issued there before
 * and after: no separate step makes the stream wait for it. It reads its
 * source after the work that last wrote it on any stream, and work on
 * the client's other streams (another thread's kernel, read or copy) that
 * uses a destination after the call returned waits for the call, as it
 * waits for a launch that wrote the buffer. And like a
 * launch it takes part in the failure store: a source buffer that carries
 * a failure on any rank refuses the collective on every rank
 * (CUBE_ERR_SEVERAL, naming the rank) and every rank's destination carries
 * that failure; a collective that completes is a full write of each
 * destination range and clears its failure.
 *
 * Every rank makes the same sequence of collective calls, each with the
 * same kind, count, element type, operation and root (send and receive
 * pair in order between two ranks). Before any byte moves, the ranks'
 * calls are compared: a rank that passed other arguments, or whose call
 * was refused (a bad handle, a buffer too small), refuses the collective
 * on every rank with CUBE_ERR_INVALID_ARGUMENT naming the rank and what
 * differs; nothing is recorded and the communicator stays usable. A rank
 * that does not make its call within the communicator's timeout leaves
 * the others with CUBE_ERR_TIMEOUT (recorded on their destinations, since
 * those were not written), never a hang; the late rank, when it comes,
 * gets the same answer, and the communicator goes on with the next call.
 *
 * One thread may drive every rank: between cube_group_begin() and
 * cube_group_end() collective calls only queue, and cube_group_end runs
 * them (as ncclGroupStart/ncclGroupEnd). Or one thread per rank calls
 * its rank's collectives; a call then returns once every rank's call
 * arrived and its own part was issued.
 *
 * A rank may send to itself (a ring on a one-rank communicator does): a
 * send whose peer is the calling rank and the receive from it are made in
 * one group, where the n-th such send pairs with the n-th such receive
 * of the rank, and they run when the group ends, checked as a pair of
 * ranks' calls are (count and type alike, a refusal of either, a failed
 * source; the send's source and the receive's destination the same range
 * or apart). Since one thread makes a rank's calls, a half that cannot be
 * paired is refused at once (CUBE_ERR_INVALID_ARGUMENT): such a send or
 * receive outside a group, and one whose group ends without its partner.
 * Between processes too, the pair runs in this process (NCCL's send and
 * receive to self in one NCCL group on CUDA; a copy on the CPU).
 *
 * Graphs (cubert/graph.h): a collective of a communicator made by
 * cube_comm_init_all is recorded in a capture when every rank makes it
 * from a capturing stream: the ranks' calls are matched and checked as
 * usual, then each rank's capture records its call (its buffers pinned).
 * On a backend whose graphs are recorded in software (the CPU) the call
 * is recorded instead of run; on one with hardware graphs (CUDA) the
 * backend captures its own part (NCCL's kernels) into the graph. When
 * some ranks capture and others do not, every rank answers
 * CUBE_ERR_GRAPH_STATE and nothing moves or is recorded. A replay meets
 * the other ranks' replays at each recorded collective, as a call does:
 * a software replay issues it then; a hardware replay meets the peers at
 * every collective of the graph before it launches anything, so no
 * rank's device work waits for a peer whose replay was refused. Each rank
 * replays its graph on a thread of its own (a replay waits for the
 * peers', so one thread cannot replay every rank's graph), graphs that
 * differ fail on every rank as calls that differ do, and a rank that does
 * not replay leaves the others with CUBE_ERR_TIMEOUT, recorded on their
 * graphs' outputs. A replay that fails before a collective tells the
 * peers, who answer an error rather than wait.
 *
 * Between processes (cube_comm_init_rank) a capture records the call as
 * well. On the CPU (MPI) the ranks check, moving no data, that every one
 * captures it (else CUBE_ERR_GRAPH_STATE on every rank, nothing
 * recorded), and each replay is then a call, with a call's checks and
 * answers. On CUDA each rank captures NCCL's kernels without asking the
 * peers (NCCL has no way to), so every rank must capture the same calls:
 * a capture on one rank meets whatever the peers issue at that point of
 * the sequence. A replay cannot meet peers in other processes before it
 * launches; instead it is watched as a call is: when the graph's work has
 * not ended the communicator's timeout after the replay started on the
 * device (a peer that does not replay, or not in time), the communicator
 * is aborted, and every buffer the graph writes carries CUBE_ERR_TIMEOUT
 * (seen by the next read, cube_sync or cube_check); later replays answer
 * CUBE_ERR_ABORTED without launching. A replay refused on one rank (an
 * input that carries a failure) aborts its communicator, as a refused
 * call does, and the peers' replays time out.
 *
 * Calls inside a group are captured when the group ends, as it runs
 * them, and each rank's graph replays them as one group again (a send
 * and a receive between two ranks, each in a group, replay without
 * waiting for each other). One thread may capture a group that drives
 * every rank, each rank's client capturing on that thread; each rank's
 * graph is then replayed on a thread of its own.
 *
 * A graph holds its communicator: a rank's communicator destroyed (or
 * aborted) before its graph makes the graph's replays fail with
 * CUBE_ERR_NOT_FOUND (CUBE_ERR_ABORTED), its outputs marked, and its
 * peers time out; on CUDA the rank's NCCL communicator is destroyed when
 * the last graph that captured its calls goes.
 *
 * Element counts are per rank, as in NCCL: all-reduce, broadcast and
 * reduce move `count` elements; all-gather gathers `count` from each rank
 * into count * N; reduce-scatter reduces count * N into `count` per rank.
 * Buffers may be larger than what a call uses (the first bytes are used).
 * A call may work in place: the source and the destination the same
 * range (all-reduce, broadcast, reduce), or as in NCCL rank r's source
 * the r-th count of its destination (all-gather) or its destination the
 * r-th count of its source (reduce-scatter); other overlaps of a rank's
 * source and destination are refused (CUBE_ERR_INVALID_ARGUMENT).
 *
 * Ownership: cube_comm_init_all hands out communicators the caller frees
 * with cube_comm_destroy, each before its client closes.
 * Thread safety: a communicator is used by one thread at a time (its
 * rank's calls are ordered); different ranks' communicators by different
 * threads at once. Errors are listed per call.
 */
#ifndef CUBERT_COMM_H
#define CUBERT_COMM_H

#include <stddef.h>
#include <stdint.h>

#include "cubert/client.h"
#include "cubert/error.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct cube_comm cube_comm;

/* Element types of collectives: the kernel dialect's, plus the halves. */
typedef enum cube_dtype {
    CUBE_DTYPE_I8 = 1,
    CUBE_DTYPE_U8 = 2,
    CUBE_DTYPE_I32 = 3,
    CUBE_DTYPE_U32 = 4,
    CUBE_DTYPE_I64 = 5,
    CUBE_DTYPE_U64 = 6,
    CUBE_DTYPE_F16 = 7,  /* IEEE half */
    CUBE_DTYPE_BF16 = 8, /* bfloat16 */
    CUBE_DTYPE_F32 = 9,
    CUBE_DTYPE_F64 = 10
} cube_dtype;

/* The size in bytes of one element of `dtype`; 0 for a value that is not
 * a cube_dtype. */
CUBE_API uint32_t cube_dtype_size(cube_dtype dtype);

/* Reductions. CUBE_REDUCE_AVG is the sum divided by the ranks (integer
 * division for integer types). Every rank gets the same bytes: elements
 * are combined in rank order. */
typedef enum cube_reduce_op {
    CUBE_REDUCE_SUM = 1,
    CUBE_REDUCE_PROD = 2,
    CUBE_REDUCE_MIN = 3,
    CUBE_REDUCE_MAX = 4,
    CUBE_REDUCE_AVG = 5
} cube_reduce_op;

typedef struct cube_comm_options {
    /* sizeof(cube_comm_options): lets the struct grow compatibly. */
    uint32_t struct_size;
    /* How long a rank waits for the others to join a call before it
     * answers CUBE_ERR_TIMEOUT, in milliseconds; 0: 300000 (5 minutes).
     * Between processes on CUDA also how long a call may run on the
     * device before the communicator is aborted. */
    uint32_t timeout_ms;
} cube_comm_options;

/* Default options (every field zero except struct_size). */
CUBE_API cube_comm_options cube_comm_options_default(void);

/* The most ranks a communicator has. */
#define CUBE_MAX_RANKS 1024u

/* Makes a communicator of `n` ranks (1..CUBE_MAX_RANKS) over `clients`
 * (rank i is clients[i]), one per client, into comms[0..n-1]. The clients
 * belong to one backend and each to a device of its own (a device cannot
 * be two ranks). `options` may be NULL.
 * Errors: CUBE_ERR_INVALID_ARGUMENT (NULL clients, comms or a client in
 * it, n out of range, clients of different backends or of one device, a
 * malformed options struct), CUBE_ERR_UNSUPPORTED (the backend has no
 * collectives), CUBE_ERR_UNAVAILABLE (NCCL could not be loaded: the
 * message names what was tried), CUBE_ERR_OUT_OF_MEMORY, the device fault
 * of a client. On error comms holds no communicator. */
CUBE_API CUBE_MUST_USE cube_error *
cube_comm_init_all(cube_client *const *clients, uint32_t n,
                   const cube_comm_options *options, cube_comm **comms);

/* --- between processes --- */

/* The size of a communicator id, and of the text cube_comm_id_format
 * writes (with its NUL). */
#define CUBE_COMM_ID_BYTES 144
#define CUBE_COMM_ID_TEXT (12 + 2 * CUBE_COMM_ID_BYTES + 1)

/* Names a communicator between processes: made once by one of them,
 * handed to the others (in an environment variable or a file, as text:
 * cube_comm_id_format), and given to cube_comm_init_rank by each. A plain
 * value. */
typedef struct cube_comm_id {
    unsigned char bytes[CUBE_COMM_ID_BYTES];
} cube_comm_id;

/* A new id for a communicator of `backend`'s devices across processes:
 * CUDA through NCCL (its unique id; NCCL is loaded), the CPU through MPI
 * (the processes are the ranks of one MPI job, started by mpirun, and the
 * communicator's ranks are their ranks in it). Errors:
 * CUBE_ERR_INVALID_ARGUMENT (NULL), CUBE_ERR_NOT_FOUND (no such backend),
 * CUBE_ERR_UNSUPPORTED (the backend has no communicators between
 * processes), CUBE_ERR_UNAVAILABLE (NCCL could not be loaded; this build
 * has no MPI; the message says which). */
CUBE_API CUBE_MUST_USE cube_error *cube_comm_id_new(const char *backend,
                                                    cube_comm_id *out);

/* `id` as text ("cubert-comm:" and hexadecimal digits) into text[0, cap).
 * Errors: CUBE_ERR_INVALID_ARGUMENT (NULL, cap below
 * CUBE_COMM_ID_TEXT). */
CUBE_API CUBE_MUST_USE cube_error *cube_comm_id_format(const cube_comm_id *id,
                                                       char *text, size_t cap);

/* The id `text` (cube_comm_id_format's, trailing blanks and newline
 * allowed) spells. Errors: CUBE_ERR_INVALID_ARGUMENT (NULL, not such a
 * text; *out is zeroed). */
CUBE_API CUBE_MUST_USE cube_error *cube_comm_id_parse(const char *text,
                                                      cube_comm_id *out);

/* This process's place in a job of several processes, as the program
 * that started them (the launcher) tells it through the environment. A
 * plain value; `launcher` is a static string. */
typedef struct cube_comm_job {
    uint32_t rank;        /* 0..size-1: the communicator's rank to take */
    uint32_t size;        /* the job's processes: the communicator's ranks */
    uint32_t local_rank;  /* among the job's processes on this host: which
                             device to open (the rank, where the launcher
                             does not say) */
    const char *launcher; /* "Open MPI", "torchrun" or "Slurm" */
} cube_comm_job;

/* Reads this process's rank, the job's size and the local rank from the
 * variables of the first launcher in this order whose rank or size
 * variable is set:
 *   Open MPI's mpirun: OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE,
 *     OMPI_COMM_WORLD_LOCAL_RANK;
 *   torchrun (and PyTorch's env:// convention): RANK, WORLD_SIZE,
 *     LOCAL_RANK;
 *   Slurm's srun: SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID.
 * A launcher run by another sets its own variables over the outer one's
 * (mpirun or torchrun inside a Slurm allocation, where SLURM_PROCID
 * numbers the srun tasks, not the processes), so the inner one is read
 * and the others' are ignored; Open MPI's come before torchrun's, whose
 * names are the likelier to be left in an environment by hand. The rank
 * and the size must both be set, as decimal digits alone (no sign, no
 * blanks), with the size in 1..CUBE_MAX_RANKS and the rank and the local
 * rank below it; the local rank may be unset.
 *
 * With it a process joins its job's communicator: it opens the device of
 * its local rank (e.g. "cuda:<local_rank>"), rank 0 makes the id
 * (cube_comm_id_new; on CUDA the id holds that process's address, so a
 * process of the job makes it, not a script before the launch) and hands
 * its text (cube_comm_id_format) to the others, which read it with
 * cube_comm_id_parse, then every process calls cube_comm_init_rank with
 * the job's rank and size. The text may go through a file in a folder
 * every process sees, a fresh one per job: rank 0 writes it under a
 * temporary name and renames it into place, so that a reader never sees
 * half of it, and the others wait for the file at most the
 * communicator's timeout (examples/multi_process.c does this). On the CPU
 * the processes are joined by MPI, so they must be started by mpirun
 * (`mpirun -n N`; as root `mpirun --allow-run-as-root`); processes
 * started otherwise, torchrun's for instance, join on CUDA only (NCCL).
 *
 * Reads the environment: not to be called while another thread changes
 * it. Errors: CUBE_ERR_INVALID_ARGUMENT (out NULL; a variable of the
 * launcher read that is not a decimal number, out of range, or missing
 * beside its partner: the message names it and its value),
 * CUBE_ERR_NOT_FOUND (no launcher's variables are set: a process
 * started alone). On error *out is zeroed. */
CUBE_API CUBE_MUST_USE cube_error *cube_comm_job_from_env(cube_comm_job *out);

/* Makes this process's rank `rank` of the `nranks`-rank communicator `id`
 * names, on `client`'s device; every rank calls it in its own process
 * with the same id. Blocks until every rank joined, at most the options'
 * timeout. Between processes the ranks' calls cannot be compared before
 * they run: a call one rank refuses (its arguments, its buffers) or whose
 * source carries a failure is answered on that rank as in one process,
 * and the others learn of it — through MPI on the CPU (they answer
 * CUBE_ERR_INVALID_ARGUMENT or CUBE_ERR_SEVERAL); on CUDA, NCCL cannot
 * tell them, so the refusing rank aborts the communicator and the others
 * answer CUBE_ERR_ABORTED or CUBE_ERR_TIMEOUT, never a hang. On CUDA a
 * call returns once NCCL queued it on the device, where a peer that
 * never makes the matching call (a crashed process, a send without its
 * receive) would leave it waiting: a watchdog thread aborts the
 * communicator once a call has run on the device for the timeout (timed
 * from when the call starts there, not from when it was queued behind
 * other work) or NCCL reports an error (a peer aborted). That call's
 * destination, and those of the calls of the rank still running, then
 * carry CUBE_ERR_TIMEOUT (or CUBE_ERR_ABORTED): a read or a cube_sync
 * naming one answers CUBE_ERR_SEVERAL with it as the cause once the
 * stream got past the call, and later calls on the communicator answer
 * CUBE_ERR_ABORTED; the client works on. The caller frees the
 * communicator with cube_comm_destroy (it first waits, at most about
 * twice the timeout, for calls still running on the device).
 * Errors: CUBE_ERR_INVALID_ARGUMENT (NULL client, id or out, rank not
 * below nranks, nranks out of range, an id not made by cube_comm_id_new
 * or made for another backend, malformed options), CUBE_ERR_UNSUPPORTED
 * (the backend has none), CUBE_ERR_UNAVAILABLE (NCCL or MPI missing, or
 * the process is not part of an MPI job of nranks processes),
 * CUBE_ERR_TIMEOUT (a rank did not join in time), CUBE_ERR_OUT_OF_MEMORY,
 * CUBE_ERR_DEVICE_FAULT. */
CUBE_API CUBE_MUST_USE cube_error *
cube_comm_init_rank(cube_client *client, const cube_comm_id *id,
                    uint32_t nranks, uint32_t rank,
                    const cube_comm_options *options, cube_comm **out);

/* Frees one rank's communicator; the group's shared state goes with the
 * last. NULL is a no-op. A rank's calls queued in an open group must have
 * run (cube_group_end) before. Peers' calls waiting for this rank end with
 * CUBE_ERR_TIMEOUT. */
CUBE_API void cube_comm_destroy(cube_comm *comm);

/* Aborts the communicator for every rank: calls waiting in it return
 * CUBE_ERR_ABORTED at once, and so does every later call on any of its
 * ranks. Errors: CUBE_ERR_INVALID_ARGUMENT (comm NULL). */
CUBE_API CUBE_MUST_USE cube_error *cube_comm_abort(cube_comm *comm);

/* The rank and the number of ranks; 0 for NULL. */
CUBE_API uint32_t cube_comm_rank(const cube_comm *comm);
CUBE_API uint32_t cube_comm_size(const cube_comm *comm);

/* dst = op over ranks of src, on every rank.
 *
 * This and every collective below: handles are the rank's client's. Errors
 * (besides those
 * the introduction describes: CUBE_ERR_INVALID_ARGUMENT for a call that
 * differs from the other ranks' or a rank's refused call,
 * CUBE_ERR_SEVERAL for a failed source on some rank, CUBE_ERR_TIMEOUT,
 * CUBE_ERR_ABORTED): CUBE_ERR_INVALID_ARGUMENT (comm NULL, count 0, a
 * dtype, op, root or peer out of range, a buffer smaller than the call
 * needs — also refused on the other ranks; a send to the calling rank or
 * a receive from it outside a group), CUBE_ERR_NOT_FOUND (a
 * released or foreign handle), CUBE_ERR_GRAPH_STATE (some ranks' streams
 * are capturing a graph and others' are not, or the calling stream is
 * capturing where collectives are not recorded: see Graphs above),
 * CUBE_ERR_DEVICE_FAULT, CUBE_ERR_OUT_OF_MEMORY (the call's record or its
 * place in a group's queue, or a dry run's buffer backed at first use:
 * CUBE_ERR_STORAGE_MAPPING_FAILED),
 * CUBE_ERR_RESOURCE_LIMIT (more than 64 buffers that other streams share
 * in one CUDA group), and what the backend's engine answers (NCCL's errors
 * as CUBE_ERR_INTERNAL or CUBE_ERR_UNAVAILABLE, with NCCL's text). Inside a
 * dry-run scope a call is checked on its own rank and dropped: every rank must
 * then be in a dry run alike. */
CUBE_API CUBE_MUST_USE cube_error *
cube_all_reduce(cube_comm *comm, cube_handle src, cube_handle dst,
                uint64_t count, cube_dtype dtype, cube_reduce_op op);
/* dst = root's src, on every rank. src is read on the root only (other
 * ranks may pass the zero handle). Errors: as cube_all_reduce. */
CUBE_API CUBE_MUST_USE cube_error *
cube_broadcast(cube_comm *comm, cube_handle src, cube_handle dst,
               uint64_t count, cube_dtype dtype, uint32_t root);
/* root's dst = op over ranks of src. dst is written on the root only
 * (other ranks may pass the zero handle). Errors: as cube_all_reduce. */
CUBE_API CUBE_MUST_USE cube_error *
cube_reduce(cube_comm *comm, cube_handle src, cube_handle dst, uint64_t count,
            cube_dtype dtype, cube_reduce_op op, uint32_t root);
/* dst[i * count ..] = rank i's src[0 .. count), on every rank. Errors: as
 * cube_all_reduce. */
CUBE_API CUBE_MUST_USE cube_error *
cube_all_gather(cube_comm *comm, cube_handle src, cube_handle dst,
                uint64_t count, cube_dtype dtype);
/* dst[0 .. count) on rank r = op over ranks of src[r * count ..]. Errors:
 * as cube_all_reduce. */
CUBE_API CUBE_MUST_USE cube_error *
cube_reduce_scatter(cube_comm *comm, cube_handle src, cube_handle dst,
                    uint64_t count, cube_dtype dtype, cube_reduce_op op);
/* Point to point: `peer`'s matching cube_recv gets src's first count
 * elements. The n-th send from a to b pairs with the n-th receive at b
 * from a. `peer` may be the calling rank, inside a group (see above).
 * Errors: as cube_all_reduce. */
CUBE_API CUBE_MUST_USE cube_error *cube_send(cube_comm *comm, cube_handle src,
                                             uint64_t count, cube_dtype dtype,
                                             uint32_t peer);
CUBE_API CUBE_MUST_USE cube_error *cube_recv(cube_comm *comm, cube_handle dst,
                                             uint64_t count, cube_dtype dtype,
                                             uint32_t peer);

/* Groups, per thread and nestable: calls between the outermost begin and
 * end queue (checked on their own rank at once), and the end runs them
 * together, waiting for every rank they involve. cube_group_end returns
 * the first failure among them (each failed call's destination carries
 * its own). A call that finds no memory to queue answers
 * CUBE_ERR_OUT_OF_MEMORY at once and is refused as a rank's own refusal
 * is: the other ranks' calls of that collective answer
 * CUBE_ERR_INVALID_ARGUMENT naming the rank (at once, or at their group's
 * end) rather than wait, nothing is recorded on any buffer, and the group
 * stays open with the calls queued before and after it; cube_group_end
 * counts it among the failures at its place. Errors of cube_group_end:
 * CUBE_ERR_INVALID_ARGUMENT (no group open; a send to the calling rank
 * or a receive from it without its partner in the group), those of the
 * queued calls. cube_group_begin fails only with CUBE_ERR_RESOURCE_LIMIT
 * (more than 1024 levels). */
CUBE_API CUBE_MUST_USE cube_error *cube_group_begin(void);
CUBE_API CUBE_MUST_USE cube_error *cube_group_end(void);

/* Copies src's bytes (a buffer or a slice of `src_client`) into dst's (of
 * `dst_client`, which may be the same client, another client of the same
 * device, or a client of another device or backend). The two ranges have
 * the same size. Ordered after the work that last wrote src and before
 * the work issued after it on the calling thread's stream of dst's
 * client, which readers of dst on other streams wait for as after a
 * launch. Like a launch it takes part in the failure store (a capture's
 * refusal comes first): a source that
 * carries a failure refuses the copy (CUBE_ERR_SEVERAL) and dst carries
 * that failure; a copy that ran clears dst's failure when dst is its whole
 * buffer. Devices of one backend copy directly (CUDA: peer to peer where
 * the hardware allows, else through the host); other pairs go through
 * host memory. Inside a dry-run scope on dst_client it is checked and
 * dropped. Errors: CUBE_ERR_INVALID_ARGUMENT (a client NULL, sizes that
 * differ, two ranges of one buffer that overlap without being the same),
 * CUBE_ERR_NOT_FOUND (a handle not of its client),
 * CUBE_ERR_SEVERAL, CUBE_ERR_GRAPH_STATE (a stream involved is
 * capturing), CUBE_ERR_OUT_OF_MEMORY (host staging), CUBE_ERR_DEVICE_FAULT
 * (of either client). */
CUBE_API CUBE_MUST_USE cube_error *cube_copy_peer(cube_client *dst_client,
                                                  cube_handle dst,
                                                  cube_client *src_client,
                                                  cube_handle src);

#ifdef __cplusplus
}
#endif

#endif /* CUBERT_COMM_H */
