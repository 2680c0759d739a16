/* Loading NCCL at run time (nccl_api.h). */
#include "backends/cuda/nccl_api.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "cubert/backend/errors.h"

static nccl_api api;
static char load_failure[1024]; /* empty: loaded */
static pthread_once_t load_once = PTHREAD_ONCE_INIT;

/* Appends "name: why" to the failure text. */
static void note_try(const char *name, const char *why)
{
    size_t at = strlen(load_failure);
    snprintf(load_failure + at, sizeof load_failure - at, "%s%s: %s",
             at ? "; " : "", name, why ? why : "not found");
}

static void *open_nccl(void)
{
    cube_config_value forced;
    cube_config_lookup("nccl_library", &forced);
    if (forced.text && *forced.text) {
        void *h = dlopen(forced.text, RTLD_NOW | RTLD_LOCAL);
        if (h) {
            snprintf(api.path, sizeof api.path, "%s", forced.text);
            return h;
        }
        char where[256];
        char why[512];
        snprintf(why, sizeof why, "%s (set by %s)", dlerror(),
                 cube_config_where(&forced, where, sizeof where));
        note_try(forced.text, why);
        return NULL;
    }
    static const char *const names[] = {"libnccl.so.2", "libnccl.so", NULL};
    for (size_t i = 0; names[i]; i++) {
        void *h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
        if (h) {
            snprintf(api.path, sizeof api.path, "%s", names[i]);
            return h;
        }
        note_try(names[i], dlerror());
    }
    return NULL;
}

static void load(void)
{
    void *lib = open_nccl();
    if (!lib)
        return; /* load_failure names each library tried */
    struct {
        void **slot;
        const char *name;
    } fns[] = {
#define FN(name) {(void **)&api.name, #name}
        FN(ncclGetVersion),
        FN(ncclGetErrorString),
        FN(ncclGetLastError),
        FN(ncclGetUniqueId),
        FN(ncclCommInitRankConfig),
        FN(ncclCommGetAsyncError),
        FN(ncclCommFinalize),
        FN(ncclCommDestroy),
        FN(ncclCommAbort),
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
    for (size_t i = 0; i < sizeof fns / sizeof fns[0]; i++) {
        *fns[i].slot = dlsym(lib, fns[i].name);
        if (!*fns[i].slot) {
            char why[256];
            snprintf(why, sizeof why,
                     "has no entry point %s (NCCL 2.18 or later is needed)",
                     fns[i].name);
            note_try(api.path, why);
            return;
        }
    }
    api.ncclGetVersion(&api.version);
}

cube_error *nccl_api_load(const nccl_api **out)
{
    *out = NULL;
    pthread_once(&load_once, load);
    if (load_failure[0])
        return cube_error_new(CUBE_ERR_UNAVAILABLE,
                              "NCCL could not be loaded (tried %s); set "
                              "CUBERT_NCCL_LIBRARY to its path",
                              load_failure);
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
