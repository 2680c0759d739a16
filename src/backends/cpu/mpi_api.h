/* Open MPI, loaded with dlopen at run time, for the CPU backend's
 * communicators between processes.
 *
 * cubert is built without MPI: this file declares the few types and entry
 * points it uses, with Open MPI's ABI (4.x and 5.x, libmpi.so.40): handles
 * are pointers, and the predefined ones (MPI_COMM_WORLD, MPI_FLOAT,
 * MPI_SUM, ...) are the addresses of the library's globals, found with
 * dlsym. The library is looked for when a communicator between processes
 * is first made: $CUBERT_MPI_LIBRARY, else libmpi.so.40, else libmpi.so.
 * Without it such communicators answer CUBE_ERR_UNAVAILABLE.
 *
 * Thread safety: mpi_api_load may be called from any thread; the table
 * never changes and is never freed. MPI itself is called only under
 * mpi_lock (cpu_mpi.c), so any thread level from MPI_THREAD_SERIALIZED up
 * will do.
 */
#ifndef CUBE_CPU_MPI_API_H
#define CUBE_CPU_MPI_API_H

#include "cubert/error.h"

typedef struct ompi_communicator_t *MPI_Comm;
typedef struct ompi_datatype_t *MPI_Datatype;
typedef struct ompi_op_t *MPI_Op;
typedef struct ompi_request_t *MPI_Request;
typedef void(MPI_User_function)(void *, void *, int *, MPI_Datatype *);

#define MPI_SUCCESS 0
#define MPI_IN_PLACE ((void *)1)
#define MPI_STATUS_IGNORE ((void *)0)
#define MPI_THREAD_SERIALIZED 2
#define MPI_THREAD_MULTIPLE 3
#define MPI_MAX_ERROR_STRING 256

typedef struct mpi_api {
    char path[512]; /* the library loaded */
    /* Predefined handles: addresses of the library's globals. */
    MPI_Comm comm_world;
    MPI_Datatype t_byte, t_i8, t_u8, t_i32, t_u32, t_i64, t_u64, t_u16, t_float,
        t_double;
    MPI_Op op_sum, op_prod, op_min, op_max;
#define MPI_FN(name, args) int(*name) args;
    MPI_FN(MPI_Initialized, (int *))
    MPI_FN(MPI_Finalized, (int *))
    MPI_FN(MPI_Init_thread, (int *, char ***, int, int *))
    MPI_FN(MPI_Query_thread, (int *))
    MPI_FN(MPI_Finalize, (void))
    MPI_FN(MPI_Comm_size, (MPI_Comm, int *))
    MPI_FN(MPI_Comm_rank, (MPI_Comm, int *))
    MPI_FN(MPI_Comm_idup, (MPI_Comm, MPI_Comm *, MPI_Request *))
    MPI_FN(MPI_Comm_free, (MPI_Comm *))
    MPI_FN(MPI_Error_string, (int, char *, int *))
    MPI_FN(MPI_Test, (MPI_Request *, int *, void *))
    MPI_FN(MPI_Testall, (int, MPI_Request *, int *, void *))
    MPI_FN(MPI_Type_contiguous, (int, MPI_Datatype, MPI_Datatype *))
    MPI_FN(MPI_Type_commit, (MPI_Datatype *))
    MPI_FN(MPI_Op_create, (MPI_User_function *, int, MPI_Op *))
    MPI_FN(MPI_Iallreduce, (const void *, void *, int, MPI_Datatype, MPI_Op,
                            MPI_Comm, MPI_Request *))
    MPI_FN(MPI_Ireduce, (const void *, void *, int, MPI_Datatype, MPI_Op, int,
                         MPI_Comm, MPI_Request *))
    MPI_FN(MPI_Ibcast,
           (void *, int, MPI_Datatype, int, MPI_Comm, MPI_Request *))
    MPI_FN(MPI_Iallgather, (const void *, int, MPI_Datatype, void *, int,
                            MPI_Datatype, MPI_Comm, MPI_Request *))
    MPI_FN(MPI_Ireduce_scatter_block, (const void *, void *, int, MPI_Datatype,
                                       MPI_Op, MPI_Comm, MPI_Request *))
    MPI_FN(MPI_Isend,
           (const void *, int, MPI_Datatype, int, int, MPI_Comm, MPI_Request *))
    MPI_FN(MPI_Irecv,
           (void *, int, MPI_Datatype, int, int, MPI_Comm, MPI_Request *))
#undef MPI_FN
} mpi_api;

/* Loads Open MPI once per process. Errors: CUBE_ERR_UNAVAILABLE naming
 * every library tried and why it failed. */
cube_error *mpi_api_load(const mpi_api **out);

/* MPI's text for error code `code` (thread-local storage). */
const char *mpi_error_text(const mpi_api *a, int code);

#endif /* CUBE_CPU_MPI_API_H */
