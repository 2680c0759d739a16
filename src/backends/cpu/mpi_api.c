/* Loading Open MPI at run time (mpi_api.h). */
#include "backends/cpu/mpi_api.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "cubert/backend/config.h"
#include "backends/common/library.h"
#include "cubert/backend/errors.h"

static mpi_api api;
static library_once loading = LIBRARY_ONCE_INIT;

/* The entry points, then the predefined handles (the library's globals). */
static const library_symbol symbols[] = {
#define FN(name) LIBRARY_SYMBOL(api.name, #name)
#define GLOBAL(field, name) LIBRARY_SYMBOL(api.field, name)
    FN(MPI_Initialized),
    FN(MPI_Finalized),
    FN(MPI_Init_thread),
    FN(MPI_Query_thread),
    FN(MPI_Finalize),
    FN(MPI_Comm_size),
    FN(MPI_Comm_rank),
    FN(MPI_Comm_idup),
    FN(MPI_Comm_free),
    FN(MPI_Error_string),
    FN(MPI_Test),
    FN(MPI_Testall),
    FN(MPI_Type_contiguous),
    FN(MPI_Type_commit),
    FN(MPI_Op_create),
    FN(MPI_Iallreduce),
    FN(MPI_Ireduce),
    FN(MPI_Ibcast),
    FN(MPI_Iallgather),
    FN(MPI_Ireduce_scatter_block),
    FN(MPI_Isend),
    FN(MPI_Irecv),
    GLOBAL(comm_world, "ompi_mpi_comm_world"),
    GLOBAL(t_byte, "ompi_mpi_byte"),
    GLOBAL(t_i8, "ompi_mpi_int8_t"),
    GLOBAL(t_u8, "ompi_mpi_uint8_t"),
    GLOBAL(t_i32, "ompi_mpi_int32_t"),
    GLOBAL(t_u32, "ompi_mpi_uint32_t"),
    GLOBAL(t_i64, "ompi_mpi_int64_t"),
    GLOBAL(t_u64, "ompi_mpi_uint64_t"),
    GLOBAL(t_u16, "ompi_mpi_uint16_t"),
    GLOBAL(t_float, "ompi_mpi_float"),
    GLOBAL(t_double, "ompi_mpi_double"),
    GLOBAL(op_sum, "ompi_mpi_op_sum"),
    GLOBAL(op_prod, "ompi_mpi_op_prod"),
    GLOBAL(op_min, "ompi_mpi_op_min"),
    GLOBAL(op_max, "ompi_mpi_op_max"),
#undef FN
#undef GLOBAL
};

static void load(void)
{
    static const char *const names[] = {"libmpi.so.40", "libmpi.so", NULL};
    /* Open MPI loads its components as plugins that resolve symbols of
     * libmpi itself: the library must be global. */
    library_load("mpi_library", names, RTLD_NOW | RTLD_GLOBAL, symbols,
                 sizeof symbols / sizeof symbols[0], "symbol",
                 "Open MPI 4 or later is needed", api.path, sizeof api.path,
                 loading.failure, sizeof loading.failure);
}

cube_error *mpi_api_load(const mpi_api **out)
{
    *out = NULL;
    const char *failure = library_once_run(&loading, load);
    if (failure)
        return cube_error_new(CUBE_ERR_UNAVAILABLE,
                              "Open MPI could not be loaded (tried %s); "
                              "install it (openmpi-bin) or set "
                              "CUBERT_MPI_LIBRARY to libmpi's path",
                              failure);
    *out = &api;
    return NULL;
}

const char *mpi_error_text(const mpi_api *a, int code)
{
    static _Thread_local char text[MPI_MAX_ERROR_STRING + 32];
    char msg[MPI_MAX_ERROR_STRING] = "";
    int len = 0;
    if (a && a->MPI_Error_string &&
        a->MPI_Error_string(code, msg, &len) == MPI_SUCCESS)
        snprintf(text, sizeof text, "%s [%d]", msg, code);
    else
        snprintf(text, sizeof text, "MPI error %d", code);
    return text;
}
