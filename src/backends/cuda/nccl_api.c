/* Loading NCCL at run time (nccl_api.h). */
#include "backends/cuda/nccl_api.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "backends/common/library.h"
#include "cubert/backend/errors.h"

static nccl_api api;
static library_once loading = LIBRARY_ONCE_INIT;

/* The entry points. */
static const library_symbol symbols[] = {
#define FN(name) LIBRARY_SYMBOL(api.name, #name)
    /* versions and errors */
    FN(ncclGetVersion),
    FN(ncclGetErrorString),
    FN(ncclGetLastError),
    /* communicators */
    FN(ncclGetUniqueId),
    FN(ncclCommInitRankConfig),
    FN(ncclCommGetAsyncError),
    FN(ncclCommFinalize),
    FN(ncclCommDestroy),
    FN(ncclCommAbort),
    /* collectives, point to point, groups */
    FN(ncclAllReduce),
    FN(ncclBroadcast),
    FN(ncclReduce),
    FN(ncclAllGather),
    FN(ncclReduceScatter),
    FN(ncclSend),
    FN(ncclRecv),
    FN(ncclGroupStart),
    FN(ncclGroupEnd),
#undef FN
};

static void load(void)
{
    static const char *const names[] = {"libnccl.so.2", "libnccl.so", NULL};
    /* On failure loading.failure names each library tried. */
    if (library_load("nccl_library", names, RTLD_NOW | RTLD_LOCAL, symbols,
                     sizeof symbols / sizeof symbols[0], "entry point",
                     "NCCL 2.18 or later is needed", api.path, sizeof api.path,
                     loading.failure, sizeof loading.failure))
        api.ncclGetVersion(&api.version);
}

cube_error *nccl_api_load(const nccl_api **out)
{
    *out = NULL;
    const char *failure = library_once_run(&loading, load);
    if (failure)
        return cube_error_new(CUBE_ERR_UNAVAILABLE,
                              "NCCL could not be loaded (tried %s); set "
                              "CUBERT_NCCL_LIBRARY to its path",
                              failure);
    *out = &api;
    return NULL;
}

const char *nccl_result_text(const nccl_api *a, ncclResult_t r, ncclComm_t comm)
{
    static _Thread_local char text[512];
    const char *name =
        a && a->ncclGetErrorString ? a->ncclGetErrorString(r) : "NCCL error";
    const char *last =
        a && a->ncclGetLastError ? a->ncclGetLastError(comm) : NULL;
    snprintf(text, sizeof text, "%s [%d]%s%s", name ? name : "NCCL error", r,
             last && *last ? ": " : "", last && *last ? last : "");
    return text;
}

void nccl_config_init(nccl_config *cfg, int blocking)
{
    memset(cfg, 0, sizeof *cfg);
    cfg->size = sizeof *cfg;
    cfg->magic = NCCL_CONFIG_MAGIC;
    cfg->version = NCCL_CONFIG_VERSION_2_18;
    cfg->blocking = blocking;
    cfg->cgaClusterSize = cfg->minCTAs = cfg->maxCTAs = cfg->splitShare =
        NCCL_CONFIG_UNDEF_INT;
    cfg->netName = NULL;
}
