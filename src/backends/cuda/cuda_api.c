/* Loading the CUDA driver and NVRTC at run time (cuda_api.h). */
#include "backends/cuda/cuda_api.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/common/library.h"
#include "cubert/backend/errors.h"
#include "cubert/memory.h"

static cuda_api api;
static library_once loading = LIBRARY_ONCE_INIT;

static const cube_config_word cuda_preset_words[] = {
    {"subslices", CUBE_PRESET_SUBSLICES, 0},
    {"exclusive", CUBE_PRESET_EXCLUSIVE, 0},
    {"expandable", CUBE_PRESET_EXPANDABLE, 0},
    {NULL, 0, 0}};

const cube_config_key cuda_config_keys[] = {
    LIBRARY_CONFIG_KEY("cuda_library", "libcuda.so.1, else libcuda.so",
                       "the CUDA driver library to load"),
    LIBRARY_CONFIG_KEY("nvrtc_library",
                       "libnvrtc.so.13, .12, libnvrtc.so, then "
                       "/usr/local/cuda/lib64/libnvrtc.so",
                       "the NVRTC library to load"),
    LIBRARY_CONFIG_KEY("nccl_library", "libnccl.so.2, else libnccl.so",
                       "the NCCL library CUDA collectives load"),
    {.name = "cuda_memory_preset",
     .type = CUBE_CONFIG_WORD,
     .words = cuda_preset_words,
     .default_text = "expandable (subslices without virtual memory "
                     "management)",
     .doc = "the pools a stream starts with while the client installed "
            "none: expandable, subslices or exclusive"},
    {.name = "cuda_peer_access",
     .type = CUBE_CONFIG_UINT,
     .min = 0,
     .max = 1,
     .default_text = "1",
     .doc = "0 leaves peer access between GPUs off: copies between them "
            "are staged by the driver (for tests and comparisons)"},
    {.name = NULL}};

/* Opens the library configuration key `key` names, else the first of
 * `names` that loads; records the path. On failure says so in
 * loading.failure: "<what>: <why><hint>". */
static void *open_first(const char *key, const char *const *names, char *path,
                        size_t cap, const char *what, const char *hint)
{
    char why[400];
    cube_config_value forced;
    cube_config_lookup(key, &forced);
    if (forced.text && *forced.text) {
        void *h = dlopen(forced.text, RTLD_NOW | RTLD_LOCAL);
        if (!h) {
            char where[512];
            snprintf(why, sizeof why, "%s: cannot load '%s': %s",
                     cube_config_where(&forced, where, sizeof where),
                     forced.text, dlerror());
            snprintf(loading.failure, sizeof loading.failure, "%s: %s%s", what,
                     why, hint);
        } else {
            snprintf(path, cap, "%s", forced.text);
        }
        return h;
    }
    const char *last = "";
    for (size_t i = 0; names[i]; i++) {
        void *h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
        if (h) {
            snprintf(path, cap, "%s", names[i]);
            return h;
        }
        last = dlerror();
    }
    snprintf(why, sizeof why, "none of %s%s%s could be loaded (last: %s)",
             names[0], names[1] ? ", " : "", names[1] ? names[1] : "",
             last ? last : "");
    snprintf(loading.failure, sizeof loading.failure, "%s: %s%s", what, why,
             hint);
    return NULL;
}

/* Every entry point: `symbol` is the versioned name the driver exports for
 * the ABI declared in cuda_api.h; an optional one may be missing. */
#define FN(field, symbol) LIBRARY_SYMBOL(api.field, symbol)
#define FN_OPT(field, symbol) LIBRARY_SYMBOL_OPTIONAL(api.field, symbol)
static const library_symbol drv_symbols[] = {
    FN(cuInit, "cuInit"),
    FN(cuDriverGetVersion, "cuDriverGetVersion"),
    FN(cuGetErrorName, "cuGetErrorName"),
    FN(cuGetErrorString, "cuGetErrorString"),
    FN(cuDeviceGetCount, "cuDeviceGetCount"),
    FN(cuDeviceGet, "cuDeviceGet"),
    FN(cuDeviceGetName, "cuDeviceGetName"),
    FN(cuDeviceGetAttribute, "cuDeviceGetAttribute"),
    FN(cuDeviceTotalMem, "cuDeviceTotalMem_v2"),
    FN(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain"),
    FN(cuDevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2"),
    FN_OPT(cuFuncGetParamInfo, "cuFuncGetParamInfo"),
    FN_OPT(cuMemGetAllocationGranularity, "cuMemGetAllocationGranularity"),
    FN_OPT(cuMemAddressReserve, "cuMemAddressReserve"),
    FN_OPT(cuMemAddressFree, "cuMemAddressFree"),
    FN_OPT(cuMemCreate, "cuMemCreate"),
    FN_OPT(cuMemRelease, "cuMemRelease"),
    FN_OPT(cuMemMap, "cuMemMap"),
    FN_OPT(cuMemUnmap, "cuMemUnmap"),
    FN_OPT(cuMemSetAccess, "cuMemSetAccess"),
    FN(cuCtxSetCurrent, "cuCtxSetCurrent"),
    FN(cuCtxGetCurrent, "cuCtxGetCurrent"),
    FN(cuMemGetInfo, "cuMemGetInfo_v2"),
    FN(cuPointerGetAttributes, "cuPointerGetAttributes"),
    FN(cuMemAlloc, "cuMemAlloc_v2"),
    FN(cuMemFree, "cuMemFree_v2"),
    FN(cuMemHostAlloc, "cuMemHostAlloc"),
    FN(cuMemFreeHost, "cuMemFreeHost"),
    FN(cuMemcpyHtoDAsync, "cuMemcpyHtoDAsync_v2"),
    FN(cuMemcpyDtoHAsync, "cuMemcpyDtoHAsync_v2"),
    FN(cuMemcpyDtoDAsync, "cuMemcpyDtoDAsync_v2"),
    FN(cuMemcpyPeerAsync, "cuMemcpyPeerAsync"),
    FN(cuDeviceCanAccessPeer, "cuDeviceCanAccessPeer"),
    FN(cuCtxEnablePeerAccess, "cuCtxEnablePeerAccess"),
    FN(cuMemcpy2DAsync, "cuMemcpy2DAsync_v2"),
    FN(cuMemcpyDtoH, "cuMemcpyDtoH_v2"),
    FN(cuStreamCreate, "cuStreamCreate"),
    FN(cuStreamDestroy, "cuStreamDestroy_v2"),
    FN(cuStreamSynchronize, "cuStreamSynchronize"),
    FN(cuStreamQuery, "cuStreamQuery"),
    FN(cuStreamWaitEvent, "cuStreamWaitEvent"),
    FN(cuEventCreate, "cuEventCreate"),
    FN(cuEventDestroy, "cuEventDestroy_v2"),
    FN(cuEventRecord, "cuEventRecord"),
    FN(cuEventQuery, "cuEventQuery"),
    FN(cuEventSynchronize, "cuEventSynchronize"),
    FN(cuEventElapsedTime, "cuEventElapsedTime"),
    FN(cuModuleLoadData, "cuModuleLoadData"),
    FN(cuModuleUnload, "cuModuleUnload"),
    FN(cuModuleGetFunction, "cuModuleGetFunction"),
    FN(cuModuleGetGlobal, "cuModuleGetGlobal_v2"),
    FN(cuFuncGetAttribute, "cuFuncGetAttribute"),
    FN(cuFuncSetAttribute, "cuFuncSetAttribute"),
    FN(cuLaunchKernel, "cuLaunchKernel"),
    FN(cuStreamBeginCapture, "cuStreamBeginCapture_v2"),
    FN(cuStreamEndCapture, "cuStreamEndCapture"),
    FN(cuThreadExchangeStreamCaptureMode, "cuThreadExchangeStreamCaptureMode"),
    FN(cuGraphInstantiateWithFlags, "cuGraphInstantiateWithFlags"),
    FN(cuGraphLaunch, "cuGraphLaunch"),
    FN(cuGraphExecDestroy, "cuGraphExecDestroy"),
    FN(cuGraphDestroy, "cuGraphDestroy"),
};
static const library_symbol rtc_symbols[] = {
    FN(nvrtcVersion, "nvrtcVersion"),
    FN(nvrtcGetErrorString, "nvrtcGetErrorString"),
    FN(nvrtcCreateProgram, "nvrtcCreateProgram"),
    FN(nvrtcDestroyProgram, "nvrtcDestroyProgram"),
    FN(nvrtcCompileProgram, "nvrtcCompileProgram"),
    FN(nvrtcGetProgramLogSize, "nvrtcGetProgramLogSize"),
    FN(nvrtcGetProgramLog, "nvrtcGetProgramLog"),
    FN(nvrtcGetPTXSize, "nvrtcGetPTXSize"),
    FN(nvrtcGetPTX, "nvrtcGetPTX"),
    FN_OPT(nvrtcGetCUBINSize, "nvrtcGetCUBINSize"),
    FN_OPT(nvrtcGetCUBIN, "nvrtcGetCUBIN"),
    FN_OPT(nvrtcGetNumSupportedArchs, "nvrtcGetNumSupportedArchs"),
    FN_OPT(nvrtcGetSupportedArchs, "nvrtcGetSupportedArchs"),
};
#undef FN
#undef FN_OPT

static void load(void)
{
    static const char *const drv_names[] = {"libcuda.so.1", "libcuda.so", NULL};
    static const char *const rtc_names[] = {
        "libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so",
        "/usr/local/cuda/lib64/libnvrtc.so", NULL};
    void *drv = open_first("cuda_library", drv_names, api.driver_path,
                           sizeof api.driver_path, "no CUDA driver",
                           " (is the NVIDIA driver installed?)");
    if (!drv)
        return;
    const char *missing = library_resolve(
        drv, drv_symbols, sizeof drv_symbols / sizeof drv_symbols[0]);
    if (missing)
        goto fail;

    CUresult r = api.cuInit(0);
    if (r != CUDA_SUCCESS) {
        snprintf(loading.failure, sizeof loading.failure,
                 "the CUDA driver (%s) did not initialize: %s", api.driver_path,
                 cuda_result_text(&api, r));
        return;
    }
    api.cuDriverGetVersion(&api.driver_version);
    int count = 0;
    r = api.cuDeviceGetCount(&count);
    if (r != CUDA_SUCCESS || count == 0) {
        snprintf(loading.failure, sizeof loading.failure,
                 "the CUDA driver (%s) sees no device%s%s", api.driver_path,
                 r ? ": " : "", r ? cuda_result_text(&api, r) : "");
        return;
    }

    void *rtc = open_first("nvrtc_library", rtc_names, api.nvrtc_path,
                           sizeof api.nvrtc_path,
                           "no NVRTC (the CUDA runtime compiler)", "");
    if (!rtc)
        return;
    missing = library_resolve(rtc, rtc_symbols,
                              sizeof rtc_symbols / sizeof rtc_symbols[0]);
    if (missing)
        goto fail;
    api.nvrtcVersion(&api.nvrtc_major, &api.nvrtc_minor);
    return;
fail:
    snprintf(loading.failure, sizeof loading.failure,
             "CUDA cannot be used: the library has no entry point %s (too "
             "old?)",
             missing);
}

cube_error *cuda_api_load(const cuda_api **out)
{
    *out = NULL;
    const char *failure = library_once_run(&loading, load);
    if (failure)
        return cube_error_new(CUBE_ERR_UNAVAILABLE, "%s", failure);
    *out = &api;
    return NULL;
}

const char *cuda_result_text(const cuda_api *a, CUresult r)
{
    static _Thread_local char text[256];
    const char *name = NULL, *desc = NULL;
    if (a && a->cuGetErrorName)
        a->cuGetErrorName(r, &name);
    if (a && a->cuGetErrorString)
        a->cuGetErrorString(r, &desc);
    snprintf(text, sizeof text, "%s (%s)", name ? name : "CUDA error",
             desc ? desc : "no description");
    if (!name) {
        char code[32];
        snprintf(code, sizeof code, " [code %d]", r);
        strncat(text, code, sizeof text - strlen(text) - 1);
    }
    return text;
}

int cuda_result_is_fault(CUresult r)
{
    switch (r) {
    case CUDA_ERROR_ECC_UNCORRECTABLE:
    case CUDA_ERROR_ILLEGAL_ADDRESS:
    case CUDA_ERROR_LAUNCH_TIMEOUT:
    case CUDA_ERROR_CONTEXT_IS_DESTROYED:
    case CUDA_ERROR_ASSERT:
    case CUDA_ERROR_HARDWARE_STACK_ERROR:
    case CUDA_ERROR_ILLEGAL_INSTRUCTION:
    case CUDA_ERROR_MISALIGNED_ADDRESS:
    case CUDA_ERROR_INVALID_ADDRESS_SPACE:
    case CUDA_ERROR_INVALID_PC:
    case CUDA_ERROR_LAUNCH_FAILED: return 1;
    default: return 0;
    }
}

cube_code cuda_alloc_code(CUresult r, int broken)
{
    return cuda_result_is_fault(r) || broken ? CUBE_ERR_DEVICE_FAULT
                                             : CUBE_ERR_OUT_OF_MEMORY;
}

cube_error *cuda_error(const cuda_api *a, CUresult r, cube_code code,
                       const char *fmt, ...)
{
    char context[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(context, sizeof context, fmt, ap);
    va_end(ap);
    if (cuda_result_is_fault(r))
        return cube_error_new(CUBE_ERR_DEVICE_FAULT,
                              "%s: %s; the device context is broken, reopen "
                              "the client",
                              context, cuda_result_text(a, r));
    if (r == CUDA_ERROR_OUT_OF_MEMORY)
        code = CUBE_ERR_OUT_OF_MEMORY;
    return cube_error_new(code, "%s: %s", context, cuda_result_text(a, r));
}
