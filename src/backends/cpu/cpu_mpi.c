/* The CPU backend's communicators (cpu_comm_vtable, at the end): ranks
 * in this process are threads over host memory (host_collective.c);
 * ranks in other processes go through MPI (Open MPI, loaded at run time:
 * mpi_api.h), which the rest of this file is about.
 *
 * The processes are the ranks of one MPI job; a communicator is a
 * duplicate of MPI_COMM_WORLD. Every call first exchanges a small header
 * with the ranks it involves (all of them for a collective, the peer for a
 * send or a receive): whether this rank refused the call or its source
 * failed, whether it captures the call in a graph, and the call's kind,
 * count, element type, operation and root. Only when every header says
 * yes and they all agree does data move, straight between the ranks'
 * buffers (a capture moves none: each replay is a call again); otherwise
 * every rank answers the same error and nothing moved. Each wait polls MPI
 * against the communicator's timeout: a rank that never comes makes the others
 * answer CUBE_ERR_TIMEOUT (the small header buffers of the abandoned exchange
 * are left to MPI, never the caller's), and the communicator is then aborted,
 * since MPI cannot cancel a collective.
 *
 * Locks: mpi_lock (a leaf) around every MPI call; waits poll with it
 * dropped.
 */
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "backends/common/host_memory.h"
#include "backends/cpu/cpu_mpi.h"
#include "backends/cpu/mpi_api.h"
#include "base/clock.h"
#include "base/mutex.h"
#include "cubert/backend/errors.h"
#include "cubert/comm.h"
#include "cubert/log.h"

/* MPI is called under this lock only. */
static cube_mutex mpi_lock = CUBE_MUTEX_INIT;
/* The halves' datatypes and reductions, made once. */
static MPI_Datatype t_f16, t_bf16;
static MPI_Op half_ops[CUBE_REDUCE_AVG + 1];
static pthread_once_t setup_once = PTHREAD_ONCE_INIT;
static char setup_failure[512];
static const mpi_api *mpi;

#define ID_TAG "cubert-mpi"
#define HEADER_WORDS 8
#define TAG_HEADER 7001
#define TAG_DATA 7002

/* A rank between processes; a rank in this process has none (NULL). */
typedef struct cpu_mpi_rank {
    cube_backend_comm base; /* first: what the core holds */
    MPI_Comm comm;
    uint32_t rank, nranks;
    uint64_t timeout_ns;
    atomic_int broken; /* an exchange timed out: MPI cannot take it back */
} cpu_mpi_rank;

static cube_error *mpi_failure(int code, const char *what)
{
    return cube_error_new(CUBE_ERR_INTERNAL, "%s: %s", what,
                          mpi_error_text(mpi, code));
}

/* --- halves: MPI has no such types; they reduce through float --- */

static void half_reduce(void *in, void *inout, int *len, MPI_Datatype *type,
                        uint32_t op)
{
    uint32_t dtype = *type == t_bf16 ? CUBE_DTYPE_BF16 : CUBE_DTYPE_F16;
    host_reduce_combine(inout, in, (size_t)*len, dtype, op);
}
static void half_sum(void *i, void *o, int *n, MPI_Datatype *t)
{
    half_reduce(i, o, n, t, CUBE_REDUCE_SUM);
}
static void half_prod(void *i, void *o, int *n, MPI_Datatype *t)
{
    half_reduce(i, o, n, t, CUBE_REDUCE_PROD);
}
static void half_min(void *i, void *o, int *n, MPI_Datatype *t)
{
    half_reduce(i, o, n, t, CUBE_REDUCE_MIN);
}
static void half_max(void *i, void *o, int *n, MPI_Datatype *t)
{
    half_reduce(i, o, n, t, CUBE_REDUCE_MAX);
}

/* Starts MPI when the program has not (and finalizes it at exit), and
 * makes the halves' types and operations. */
static void setup(void)
{
    int inited = 0, finalized = 0, provided = 0;
    mpi->MPI_Finalized(&finalized);
    if (finalized) {
        snprintf(setup_failure, sizeof setup_failure,
                 "MPI was already finalized in this process");
        return;
    }
    mpi->MPI_Initialized(&inited);
    if (!inited) {
        int rc =
            mpi->MPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, &provided);
        if (rc != MPI_SUCCESS) {
            snprintf(setup_failure, sizeof setup_failure, "MPI_Init_thread: %s",
                     mpi_error_text(mpi, rc));
            return;
        }
        /* cubert started MPI, so cubert ends it: a process that leaves
         * without MPI_Finalize fails its whole job. */
        atexit((void (*)(void))mpi->MPI_Finalize);
    } else {
        mpi->MPI_Query_thread(&provided);
    }
    if (provided < MPI_THREAD_SERIALIZED) {
        snprintf(setup_failure, sizeof setup_failure,
                 "MPI was started with thread level %d; cubert needs "
                 "MPI_THREAD_SERIALIZED or more",
                 provided);
        return;
    }
    MPI_User_function *fns[] = {NULL,     half_sum, half_prod,
                                half_min, half_max, half_sum};
    if (mpi->MPI_Type_contiguous(1, mpi->t_u16, &t_f16) != MPI_SUCCESS ||
        mpi->MPI_Type_commit(&t_f16) != MPI_SUCCESS ||
        mpi->MPI_Type_contiguous(1, mpi->t_u16, &t_bf16) != MPI_SUCCESS ||
        mpi->MPI_Type_commit(&t_bf16) != MPI_SUCCESS) {
        snprintf(setup_failure, sizeof setup_failure,
                 "cannot make MPI types for halves");
        return;
    }
    for (int op = CUBE_REDUCE_SUM; op <= CUBE_REDUCE_AVG; op++)
        if (mpi->MPI_Op_create(fns[op], 1, &half_ops[op]) != MPI_SUCCESS) {
            snprintf(setup_failure, sizeof setup_failure,
                     "cannot make MPI operations for halves");
            return;
        }
}

static cube_error *ready(void)
{
    cube_error *err = mpi_api_load(&mpi);
    if (err)
        return err;
    cube_mutex_lock(&mpi_lock);
    pthread_once(&setup_once, setup);
    cube_mutex_unlock(&mpi_lock);
    if (setup_failure[0])
        return cube_error_new(CUBE_ERR_UNAVAILABLE, "%s", setup_failure);
    return NULL;
}

/* Waits for `n` requests until `deadline`. 1: done; 0: timed out. */
static int wait_all(MPI_Request *req, int n, uint64_t deadline, int *rc)
{
    for (unsigned spins = 0;; spins++) {
        int done = 0;
        cube_mutex_lock(&mpi_lock);
        *rc = mpi->MPI_Testall(n, req, &done, MPI_STATUS_IGNORE);
        cube_mutex_unlock(&mpi_lock);
        if (*rc != MPI_SUCCESS || done)
            return 1;
        if (cube_clock_ns() >= deadline)
            return 0;
        if (spins < 256) {
            sched_yield();
        } else {
            struct timespec pause = {0, 50000};
            nanosleep(&pause, NULL);
        }
    }
}

/* --- ids and communicators --- */

static cube_error *cpu_mpi_comm_id_new(unsigned char *id)
{
    /* MPI needs no id: the job's ranks are the communicator's. The bytes
     * name it, so that ranks given different ids are told apart. */
    memset(id, 0, CUBE_COMM_ID_PAYLOAD);
    memcpy(id, ID_TAG, sizeof ID_TAG - 1);
    if (getrandom(id + 16, 16, 0) != 16)
        for (int i = 0; i < 16; i++)
            id[16 + i] = (unsigned char)(cube_clock_ns() >> (i % 8 * 8));
    return NULL;
}

/* A 63-bit digest of the id, for the ranks to compare theirs. */
static int64_t id_digest(const unsigned char *id)
{
    uint64_t h = 1469598103934665603ull;
    for (int i = 0; i < CUBE_COMM_ID_PAYLOAD; i++)
        h = (h ^ id[i]) * 1099511628211ull;
    return (int64_t)(h >> 1);
}

static cube_error *cpu_mpi_comm_init_rank(cube_server *server,
                                          const unsigned char *id,
                                          uint32_t nranks, uint32_t rank,
                                          uint64_t timeout_ms,
                                          cube_backend_comm **impl)
{
    (void)server;
    *impl = NULL;
    if (memcmp(id, ID_TAG, sizeof ID_TAG - 1) != 0)
        return cube_error_new(CUBE_ERR_INVALID_ARGUMENT,
                              "the id was not made for the CPU backend's "
                              "MPI communicators");
    cube_error *err = ready();
    if (err)
        return err;
    int size = 0, me = 0;
    cube_mutex_lock(&mpi_lock);
    mpi->MPI_Comm_size(mpi->comm_world, &size);
    mpi->MPI_Comm_rank(mpi->comm_world, &me);
    cube_mutex_unlock(&mpi_lock);
    if ((uint32_t)size != nranks || (uint32_t)me != rank)
        return cube_error_new(CUBE_ERR_UNAVAILABLE,
                              "this process is rank %d of an MPI job of %d; "
                              "the communicator asks for rank %u of %u (start "
                              "the ranks with mpirun -n %u, one per rank, in "
                              "rank order)",
                              me, size, rank, nranks, nranks);
    cpu_mpi_rank *r = calloc(1, sizeof *r);
    if (!r)
        return cube_error_new(CUBE_ERR_OUT_OF_MEMORY, "MPI communicator");
    r->base.vt = &cpu_comm_vtable;
    r->rank = rank;
    r->nranks = nranks;
    r->timeout_ns = timeout_ms * 1000000ull;
    uint64_t deadline = cube_clock_ns() + r->timeout_ns;
    MPI_Request req;
    int rc;
    cube_mutex_lock(&mpi_lock);
    rc = mpi->MPI_Comm_idup(mpi->comm_world, &r->comm, &req);
    cube_mutex_unlock(&mpi_lock);
    if (rc != MPI_SUCCESS) {
        free(r);
        return mpi_failure(rc, "MPI_Comm_idup");
    }
    if (!wait_all(&req, 1, deadline, &rc)) {
        free(r); /* the duplicate, if it ever comes, stays MPI's */
        return cube_error_new(CUBE_ERR_TIMEOUT,
                              "not every one of the %u ranks joined within "
                              "%llu ms",
                              nranks, (unsigned long long)timeout_ms);
    }
    /* Every rank must hold the same id: compare digests. */
    int64_t mine[2] = {id_digest(id), -id_digest(id)}, all[2];
    cube_mutex_lock(&mpi_lock);
    rc = mpi->MPI_Iallreduce(mine, all, 2, mpi->t_i64, mpi->op_max, r->comm,
                             &req);
    cube_mutex_unlock(&mpi_lock);
    if (rc == MPI_SUCCESS && !wait_all(&req, 1, deadline, &rc))
        rc = -1;
    if (rc != MPI_SUCCESS || all[0] != -all[1]) {
        cube_mutex_lock(&mpi_lock);
        mpi->MPI_Comm_free(&r->comm);
        cube_mutex_unlock(&mpi_lock);
        free(r);
        return rc != MPI_SUCCESS
                   ? cube_error_new(CUBE_ERR_TIMEOUT,
                                    "the ranks did not agree on the id "
                                    "within the timeout")
                   : cube_error_new(CUBE_ERR_INVALID_ARGUMENT,
                                    "the ranks were given different ids");
    }
    *impl = &r->base;
    cube_log_write(CUBE_LOG_INFO, "cpu", "MPI (%s): rank %u of %u", mpi->path,
                   rank, nranks);
    return NULL;
}

static void cpu_mpi_comm_destroy(cube_server *server, cube_backend_comm *impl)
{
    (void)server;
    cpu_mpi_rank *r = (cpu_mpi_rank *)impl;
    if (!r)
        return;
    /* A communicator that timed out may still have MPI work that never
     * ends: it is left to MPI rather than freed under it. */
    if (!atomic_load(&r->broken)) {
        cube_mutex_lock(&mpi_lock);
        mpi->MPI_Comm_free(&r->comm);
        cube_mutex_unlock(&mpi_lock);
    }
    free(r);
}

static void cpu_mpi_comm_abort(cube_server *server, cube_backend_comm *impl)
{
    (void)server;
    cpu_mpi_rank *r = (cpu_mpi_rank *)impl;
    if (r)
        atomic_store(&r->broken, 1);
}

/* --- collectives --- */

static MPI_Datatype mpi_type(uint32_t dtype)
{
    switch (dtype) {
    case CUBE_DTYPE_I8: return mpi->t_i8;
    case CUBE_DTYPE_U8: return mpi->t_u8;
    case CUBE_DTYPE_I32: return mpi->t_i32;
    case CUBE_DTYPE_U32: return mpi->t_u32;
    case CUBE_DTYPE_I64: return mpi->t_i64;
    case CUBE_DTYPE_U64: return mpi->t_u64;
    case CUBE_DTYPE_F16: return t_f16;
    case CUBE_DTYPE_BF16: return t_bf16;
    case CUBE_DTYPE_F64: return mpi->t_double;
    default: return mpi->t_float;
    }
}

static MPI_Op mpi_op(uint32_t dtype, uint32_t op)
{
    if (dtype == CUBE_DTYPE_F16 || dtype == CUBE_DTYPE_BF16)
        return half_ops[op];
    switch (op) {
    case CUBE_REDUCE_PROD: return mpi->op_prod;
    case CUBE_REDUCE_MIN: return mpi->op_min;
    case CUBE_REDUCE_MAX: return mpi->op_max;
    default: return mpi->op_sum; /* the average divides afterwards */
    }
}

static unsigned char *addr(const cube_binding *b)
{
    return (unsigned char *)(uintptr_t)b->storage->address + b->offset;
}

/* The header: [refused, failed, kind, count, dtype, op, root, capturing],
 * and for
 * a collective its negation beside it, so that one MAX tells both the
 * largest and the smallest of each word across the ranks. */
static void header_of(const cube_collective_set *set, int64_t *h)
{
    const cube_collective *c = &set->calls[set->index];
    int p2p =
        c->kind == CUBE_COLLECTIVE_SEND || c->kind == CUBE_COLLECTIVE_RECV;
    h[0] = set->refused != NULL;
    h[1] = set->failed != NULL;
    h[2] = p2p ? 0 : c->kind;
    h[3] = (int64_t)c->count;
    h[4] = c->dtype;
    h[5] = c->kind == CUBE_COLLECTIVE_ALL_REDUCE ||
                   c->kind == CUBE_COLLECTIVE_REDUCE ||
                   c->kind == CUBE_COLLECTIVE_REDUCE_SCATTER
               ? c->op
               : 0;
    h[6] = c->kind == CUBE_COLLECTIVE_BROADCAST ||
                   c->kind == CUBE_COLLECTIVE_REDUCE
               ? c->root
               : 0;
    h[7] = set->capturing != 0;
}

/* What the exchanged headers say: NULL when the data may move. */
static cube_error *verdict(const int64_t *max, const int64_t *min, int self_bad,
                           const char *what)
{
    if (self_bad)
        return NULL; /* the core answers this rank's own refusal */
    if (max[7] != min[7])
        return cube_error_new(CUBE_ERR_GRAPH_STATE,
                              "%s: some ranks capture the call in a graph "
                              "and others do not; every rank captures a "
                              "collective or none does, so no rank runs or "
                              "records it",
                              what);
    if (max[0])
        return cube_error_new(CUBE_ERR_INVALID_ARGUMENT,
                              "%s: another rank's call was refused, so no "
                              "rank runs it",
                              what);
    if (max[1])
        return cube_error_new(CUBE_ERR_SEVERAL,
                              "%s: another rank's source cannot be trusted "
                              "(the work that should have written it "
                              "failed), so no rank runs it",
                              what);
    for (int i = 2; i < HEADER_WORDS; i++)
        if (max[i] != min[i])
            return cube_error_new(CUBE_ERR_INVALID_ARGUMENT,
                                  "%s: the ranks' calls differ (kind, count, "
                                  "element type, operation or root); no rank "
                                  "runs it",
                                  what);
    return NULL;
}

/* Exchanges headers; NULL with *go set when the data may move. */
static cube_error *exchange(cpu_mpi_rank *r, const cube_collective_set *set,
                            uint64_t deadline, int *go)
{
    const cube_collective *c = &set->calls[set->index];
    int p2p =
        c->kind == CUBE_COLLECTIVE_SEND || c->kind == CUBE_COLLECTIVE_RECV;
    int self_bad = set->refused || set->failed;
    /* Heap, not stack: after a timeout MPI may still write them. */
    int64_t *buf = calloc((size_t)4 * HEADER_WORDS, sizeof *buf);
    if (!buf)
        return cube_error_new(CUBE_ERR_OUT_OF_MEMORY, "MPI header");
    int64_t *mine = buf, *theirs = buf + (size_t)2 * HEADER_WORDS;
    header_of(set, mine);
    MPI_Request req[2];
    int n, rc;
    cube_mutex_lock(&mpi_lock);
    if (p2p) {
        /* the peer's header, and this one to it */
        n = 2;
        rc = mpi->MPI_Irecv(theirs, HEADER_WORDS, mpi->t_i64, (int)c->peer,
                            TAG_HEADER, r->comm, &req[0]);
        if (rc == MPI_SUCCESS)
            rc = mpi->MPI_Isend(mine, HEADER_WORDS, mpi->t_i64, (int)c->peer,
                                TAG_HEADER, r->comm, &req[1]);
    } else {
        n = 1;
        for (int i = 0; i < HEADER_WORDS; i++)
            mine[HEADER_WORDS + i] = -mine[i];
        rc = mpi->MPI_Iallreduce(mine, theirs, 2 * HEADER_WORDS, mpi->t_i64,
                                 mpi->op_max, r->comm, &req[0]);
    }
    cube_mutex_unlock(&mpi_lock);
    if (rc != MPI_SUCCESS) {
        free(buf);
        return mpi_failure(rc, "MPI");
    }
    if (!wait_all(req, n, deadline, &rc)) {
        atomic_store(&r->broken, 1); /* buf stays MPI's */
        return cube_error_new(CUBE_ERR_TIMEOUT,
                              "not every rank the call involves made it "
                              "within the communicator's timeout; nothing "
                              "moved, and the communicator is aborted (MPI "
                              "cannot take the call back)");
    }
    cube_error *err = NULL;
    if (rc != MPI_SUCCESS) {
        err = mpi_failure(rc, "MPI");
    } else if (p2p) {
        int64_t max[HEADER_WORDS], min[HEADER_WORDS];
        for (int i = 0; i < HEADER_WORDS; i++) {
            max[i] = mine[i] > theirs[i] ? mine[i] : theirs[i];
            min[i] = mine[i] < theirs[i] ? mine[i] : theirs[i];
        }
        err = verdict(max, min, self_bad, "send/receive");
    } else {
        int64_t min[HEADER_WORDS];
        for (int i = 0; i < HEADER_WORDS; i++)
            min[i] = -theirs[HEADER_WORDS + i];
        err = verdict(theirs, min, self_bad, "collective");
    }
    free(buf);
    /* A capture only checks: the replays move the data. */
    *go = !err && !self_bad && !set->capturing;
    return err;
}

/* Starts the data's movement: `req` and *n the requests to wait for; a
 * copy in `tmp` (the caller frees it) where MPI's layout differs. */
static int start_data(cpu_mpi_rank *r, const cube_collective *c,
                      MPI_Request *req, int *n, unsigned char **tmp)
{
    uint32_t es = cube_dtype_size((cube_dtype)c->dtype);
    int count = (int)c->count, bytes = (int)(c->count * es);
    MPI_Datatype t = mpi_type(c->dtype);
    MPI_Op op = mpi_op(c->dtype, c->op);
    unsigned char *src = c->src.storage ? addr(&c->src) : NULL;
    unsigned char *dst = c->dst.storage ? addr(&c->dst) : NULL;
    *n = 1;
    switch (c->kind) {
    case CUBE_COLLECTIVE_ALL_REDUCE:
        return mpi->MPI_Iallreduce(src == dst ? MPI_IN_PLACE : src, dst, count,
                                   t, op, r->comm, req);
    case CUBE_COLLECTIVE_REDUCE:
        return mpi->MPI_Ireduce(r->rank == c->root && src == dst ? MPI_IN_PLACE
                                                                 : src,
                                dst, count, t, op, (int)c->root, r->comm, req);
    case CUBE_COLLECTIVE_BROADCAST:
        if (r->rank == c->root && src && dst && src != dst)
            memmove(dst, src, (size_t)bytes);
        return mpi->MPI_Ibcast(dst, bytes, mpi->t_byte, (int)c->root, r->comm,
                               req);
    case CUBE_COLLECTIVE_ALL_GATHER:
        /* NCCL's in-place layout is MPI's: this rank's part in place. */
        return mpi->MPI_Iallgather(
            src == dst + (size_t)r->rank * bytes ? MPI_IN_PLACE : src, bytes,
            mpi->t_byte, dst, bytes, mpi->t_byte, r->comm, req);
    case CUBE_COLLECTIVE_REDUCE_SCATTER:
        if (c->src.storage == c->dst.storage &&
            dst < src + (size_t)bytes * r->nranks && src < dst + bytes) {
            /* in place NCCL's way, which MPI lays out otherwise */
            *tmp = malloc((size_t)bytes * r->nranks);
            if (!*tmp)
                return -2;
            memcpy(*tmp, src, (size_t)bytes * r->nranks);
            src = *tmp;
        }
        return mpi->MPI_Ireduce_scatter_block(src, dst, count, t, op, r->comm,
                                              req);
    case CUBE_COLLECTIVE_SEND:
        return mpi->MPI_Isend(src, bytes, mpi->t_byte, (int)c->peer, TAG_DATA,
                              r->comm, req);
    case CUBE_COLLECTIVE_RECV:
        return mpi->MPI_Irecv(dst, bytes, mpi->t_byte, (int)c->peer, TAG_DATA,
                              r->comm, req);
    }
    return -1;
}

static cube_error *cpu_mpi_collective(cube_server *server,
                                      cube_server_stream *stream,
                                      cube_backend_comm *impl,
                                      const cube_collective_set *set)
{
    (void)server;
    cpu_mpi_rank *r = (cpu_mpi_rank *)impl;
    const cube_collective *c = &set->calls[set->index];
    if (atomic_load(&r->broken))
        return cube_error_new(CUBE_ERR_ABORTED,
                              "the communicator was aborted (an earlier call "
                              "timed out, or cube_comm_abort)");
    uint64_t bytes = c->count * cube_dtype_size((cube_dtype)c->dtype);
    if (bytes > 0x7fffffffull)
        return cube_error_new(CUBE_ERR_UNSUPPORTED,
                              "MPI communicators move at most 2 GiB per "
                              "rank and call (%llu bytes asked)",
                              (unsigned long long)bytes);
    uint64_t t0 = host_busy_begin(stream);
    uint64_t deadline = cube_clock_ns() + r->timeout_ns;
    int go = 0;
    cube_error *err = exchange(r, set, deadline, &go);
    if (err || !go) {
        host_busy_end(stream, t0);
        return err;
    }
    MPI_Request req;
    int n = 0, rc;
    unsigned char *tmp = NULL;
    cube_mutex_lock(&mpi_lock);
    rc = start_data(r, c, &req, &n, &tmp);
    cube_mutex_unlock(&mpi_lock);
    if (rc == -2)
        err = cube_error_new(CUBE_ERR_OUT_OF_MEMORY, "reduce-scatter copy");
    else if (rc != MPI_SUCCESS)
        err = mpi_failure(rc, "starting the call");
    else if (!wait_all(&req, n, deadline, &rc)) {
        /* Every rank agreed, so this only happens to a rank that died:
         * MPI keeps the buffers, so does the copy. */
        atomic_store(&r->broken, 1);
        tmp = NULL;
        err = cube_error_new(CUBE_ERR_TIMEOUT,
                             "a rank stopped in the middle of the call; the "
                             "communicator is aborted");
    } else if (rc != MPI_SUCCESS) {
        err = mpi_failure(rc, "MPI");
    }
    free(tmp);
    /* The average: MPI summed, each rank divides. */
    if (!err && c->op == CUBE_REDUCE_AVG && c->dst.storage &&
        (c->kind == CUBE_COLLECTIVE_ALL_REDUCE ||
         c->kind == CUBE_COLLECTIVE_REDUCE_SCATTER ||
         (c->kind == CUBE_COLLECTIVE_REDUCE && r->rank == c->root)))
        host_reduce_divide(addr(&c->dst), (size_t)c->count, c->dtype,
                           r->nranks);
    host_busy_end(stream, t0);
    return err;
}

/* --- the table --- */

/* The collective slot: ranks in this process are threads over host
 * memory (host_collective); ranks in other processes go through MPI. */
static cube_error *cpu_collective(cube_server *server,
                                  cube_server_stream *stream,
                                  cube_backend_comm *comm,
                                  const cube_collective_set *set)
{
    return set->remote ? cpu_mpi_collective(server, stream, comm, set)
                       : host_collective(server, stream, comm, set);
}

/* In one process the ranks keep no state (no init: each is NULL, which
 * destroy and abort leave alone); between processes each is a
 * cpu_mpi_rank. Nothing is grouped or followed on a device. */
const cube_comm_vtable cpu_comm_vtable = {
    .init_rank = cpu_mpi_comm_init_rank,
    .id_new = cpu_mpi_comm_id_new,
    .destroy = cpu_mpi_comm_destroy,
    .abort = cpu_mpi_comm_abort,
    .collective = cpu_collective,
};
