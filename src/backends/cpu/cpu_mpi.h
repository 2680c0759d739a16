/* The CPU backend's communicators (cpu_mpi.c): ranks in this process
 * are threads over host memory (host_collective.c), ranks in other
 * processes go through MPI. */
#ifndef CUBE_CPU_MPI_H
#define CUBE_CPU_MPI_H

#include "cubert/backend/comm.h"

/* cube_backend.comm of the CPU backend. */
extern const cube_comm_vtable cpu_comm_vtable;

#endif /* CUBE_CPU_MPI_H */
