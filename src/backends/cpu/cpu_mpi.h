/* The CPU backend's communicators between processes, through MPI
 * (cpu_mpi.c): the slots cpu_server.c puts in its vtable and backend. */
#ifndef CUBE_CPU_MPI_H
#define CUBE_CPU_MPI_H

#include "cubert/backend/server.h"

/* cube_backend.comm_id_new: the CUBE_COMM_ID_PAYLOAD bytes of a new id. */
cube_error *cpu_mpi_comm_id_new(unsigned char *id);
/* comm_init_rank, comm_destroy, comm_abort of a communicator between
 * processes (a NULL impl, the in-process kind, is left alone). */
cube_error *cpu_mpi_comm_init_rank(cube_server *server, const unsigned char *id,
                                   uint32_t nranks, uint32_t rank,
                                   uint64_t timeout_ms, void **impl);
void cpu_mpi_comm_destroy(cube_server *server, void *impl);
void cpu_mpi_comm_abort(cube_server *server, void *impl);
/* The collective slot for a set with `remote` set. */
cube_error *cpu_mpi_collective(cube_server *server, cube_server_stream *stream,
                               void *impl, const cube_collective_set *set);

#endif /* CUBE_CPU_MPI_H */
