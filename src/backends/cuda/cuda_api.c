/* Loading the CUDA driver and NVRTC at run time (cuda_api.h). */
#include "backends/cuda/cuda_api.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cubert/backend/errors.h"
#include "cubert/memory.h"

static cuda_api api;
static char load_failure[512]; /* empty: loaded */
static pthread_once_t load_once = PTHREAD_ONCE_INIT;

static const cube_config_word cuda_preset_words[] = {
    {"subslices", CUBE_PRESET_SUBSLICES, 0},
    {"exclusive", CUBE_PRESET_EXCLUSIVE, 0},
    {"expandable", CUBE_PRESET_EXPANDABLE, 0},
    {NULL, 0, 0}};

const cube_config_key cuda_config_keys[] = {
    {.name = "cuda_library",
     .type = CUBE_CONFIG_TEXT,
     .max_len = CUBE_CONFIG_TEXT_MAX,
     .default_text = "libcuda.so.1, else libcuda.so",
     .doc = "the CUDA driver library to load: a path or a name the dynamic "
            "loader finds"},
    {.name = "nvrtc_library",
     .type = CUBE_CONFIG_TEXT,
     .max_len = CUBE_CONFIG_TEXT_MAX,
     .default_text = "libnvrtc.so.13, .12, libnvrtc.so, then "
                     "/usr/local/cuda/lib64/libnvrtc.so",
     .doc = "the NVRTC library to load: a path or a name the dynamic loader "
            "finds"},
    {.name = "nccl_library",
     .type = CUBE_CONFIG_TEXT,
     .max_len = CUBE_CONFIG_TEXT_MAX,
     .default_text = "libnccl.so.2, else libnccl.so",
     .doc = "the NCCL library CUDA collectives load: a path or a name the "
            "dynamic loader finds"},
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
 * `names` that loads; records the path. */
static void *open_first(const char *key, const char *const *names, char *path,
                        size_t cap, char *why, size_t why_cap)
{
    cube_config_value forced;
    cube_config_lookup(key, &forced);
    if (forced.text && *forced.text) {
        void *h = dlopen(forced.text, RTLD_NOW | RTLD_LOCAL);
        if (!h) {
            char where[512];
            snprintf(why, why_cap, "%s: cannot load '%s': %s",
                     cube_config_where(&forced, where, sizeof where),
                     forced.text, dlerror());
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
    snprintf(why, why_cap, "none of %s%s%s could be loaded (last: %s)",
             names[0], names[1] ? ", " : "", names[1] ? names[1] : "",
             last ? last : "");
    return NULL;
}

/* Resolves every entry point: `symbol` is the versioned name the driver
 * exports for the ABI declared in cuda_api.h. */
static int resolve(void *lib, void **slot, const char *symbol, int optional,
                   char *why, size_t cap)
{
    *slot = dlsym(lib, symbol);
    if (!*slot && !optional) {
        snprintf(why, cap, "the library has no entry point %s (too old?)",
                 symbol);
        return -1;
    }
    return 0;
}

#define DRV(field, symbol)                                                     \
    if (resolve(drv, (void **)&api.field, symbol, 0, why, sizeof why))         \
        goto fail;
#define DRV_OPT(field, symbol)                                                 \
    resolve(drv, (void **)&api.field, symbol, 1, why, sizeof why);
#define RTC(field, symbol)                                                     \
    if (resolve(rtc, (void **)&api.field, symbol, 0, why, sizeof why))         \
        goto fail;
#define RTC_OPT(field, symbol)                                                 \
    resolve(rtc, (void **)&api.field, symbol, 1, why, sizeof why);

static void load(void)
{
    char why[400] = "";
    static const char *const drv_names[] = {"libcuda.so.1", "libcuda.so", NULL};
    static const char *const rtc_names[] = {
        "libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so",
        "/usr/local/cuda/lib64/libnvrtc.so", NULL};
    void *drv = open_first("cuda_library", drv_names, api.driver_path,
                           sizeof api.driver_path, why, sizeof why);
    if (!drv) {
        snprintf(load_failure, sizeof load_failure,
                 "no CUDA driver: %s (is the NVIDIA driver installed?)", why);
        return;
    }
    DRV(cuInit, "cuInit")
    DRV(cuDriverGetVersion, "cuDriverGetVersion")
    DRV(cuGetErrorName, "cuGetErrorName")
    DRV(cuGetErrorString, "cuGetErrorString")
    DRV(cuDeviceGetCount, "cuDeviceGetCount")
    DRV(cuDeviceGet, "cuDeviceGet")
    DRV(cuDeviceGetName, "cuDeviceGetName")
    DRV(cuDeviceGetAttribute, "cuDeviceGetAttribute")
    DRV(cuDeviceTotalMem, "cuDeviceTotalMem_v2")
    DRV(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain")
    DRV(cuDevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2")
    DRV_OPT(cuFuncGetParamInfo, "cuFuncGetParamInfo")
    DRV_OPT(cuMemGetAllocationGranularity, "cuMemGetAllocationGranularity")
    DRV_OPT(cuMemAddressReserve, "cuMemAddressReserve")
    DRV_OPT(cuMemAddressFree, "cuMemAddressFree")
    DRV_OPT(cuMemCreate, "cuMemCreate")
    DRV_OPT(cuMemRelease, "cuMemRelease")
    DRV_OPT(cuMemMap, "cuMemMap")
    DRV_OPT(cuMemUnmap, "cuMemUnmap")
    DRV_OPT(cuMemSetAccess, "cuMemSetAccess")
    DRV(cuCtxSetCurrent, "cuCtxSetCurrent")
    DRV(cuCtxGetCurrent, "cuCtxGetCurrent")
    DRV(cuMemGetInfo, "cuMemGetInfo_v2")
    DRV(cuPointerGetAttributes, "cuPointerGetAttributes")
    DRV(cuMemAlloc, "cuMemAlloc_v2")
    DRV(cuMemFree, "cuMemFree_v2")
    DRV(cuMemHostAlloc, "cuMemHostAlloc")
    DRV(cuMemFreeHost, "cuMemFreeHost")
    DRV(cuMemcpyHtoDAsync, "cuMemcpyHtoDAsync_v2")
    DRV(cuMemcpyDtoHAsync, "cuMemcpyDtoHAsync_v2")
    DRV(cuMemcpyDtoDAsync, "cuMemcpyDtoDAsync_v2")
    DRV(cuMemcpyPeerAsync, "cuMemcpyPeerAsync")
    DRV(cuDeviceCanAccessPeer, "cuDeviceCanAccessPeer")
    DRV(cuCtxEnablePeerAccess, "cuCtxEnablePeerAccess")
    DRV(cuMemcpy2DAsync, "cuMemcpy2DAsync_v2")
    DRV(cuMemcpyDtoH, "cuMemcpyDtoH_v2")
    DRV(cuStreamCreate, "cuStreamCreate")
    DRV(cuStreamDestroy, "cuStreamDestroy_v2")
    DRV(cuStreamSynchronize, "cuStreamSynchronize")
    DRV(cuStreamQuery, "cuStreamQuery")
    DRV(cuStreamWaitEvent, "cuStreamWaitEvent")
    DRV(cuEventCreate, "cuEventCreate")
    DRV(cuEventDestroy, "cuEventDestroy_v2")
    DRV(cuEventRecord, "cuEventRecord")
    DRV(cuEventQuery, "cuEventQuery")
    DRV(cuEventSynchronize, "cuEventSynchronize")
    DRV(cuEventElapsedTime, "cuEventElapsedTime")
    DRV(cuModuleLoadData, "cuModuleLoadData")
    DRV(cuModuleUnload, "cuModuleUnload")
    DRV(cuModuleGetFunction, "cuModuleGetFunction")
    DRV(cuModuleGetGlobal, "cuModuleGetGlobal_v2")
    DRV(cuFuncGetAttribute, "cuFuncGetAttribute")
    DRV(cuFuncSetAttribute, "cuFuncSetAttribute")
    DRV(cuLaunchKernel, "cuLaunchKernel")
    DRV(cuStreamBeginCapture, "cuStreamBeginCapture_v2")
    DRV(cuStreamEndCapture, "cuStreamEndCapture")
    DRV(cuThreadExchangeStreamCaptureMode, "cuThreadExchangeStreamCaptureMode")
    DRV(cuGraphInstantiateWithFlags, "cuGraphInstantiateWithFlags")
    DRV(cuGraphLaunch, "cuGraphLaunch")
    DRV(cuGraphExecDestroy, "cuGraphExecDestroy")
    DRV(cuGraphDestroy, "cuGraphDestroy")

    CUresult r = api.cuInit(0);
    if (r != CUDA_SUCCESS) {
        snprintf(load_failure, sizeof load_failure,
                 "the CUDA driver (%s) did not initialize: %s", api.driver_path,
                 cuda_result_text(&api, r));
        return;
    }
    api.cuDriverGetVersion(&api.driver_version);
    int count = 0;
    r = api.cuDeviceGetCount(&count);
    if (r != CUDA_SUCCESS || count == 0) {
        snprintf(load_failure, sizeof load_failure,
                 "the CUDA driver (%s) sees no device%s%s", api.driver_path,
                 r ? ": " : "", r ? cuda_result_text(&api, r) : "");
        return;
    }

    void *rtc = open_first("nvrtc_library", rtc_names, api.nvrtc_path,
                           sizeof api.nvrtc_path, why, sizeof why);
    if (!rtc) {
        snprintf(load_failure, sizeof load_failure,
                 "no NVRTC (the CUDA runtime compiler): %s", why);
        return;
    }
    RTC(nvrtcVersion, "nvrtcVersion")
    RTC(nvrtcGetErrorString, "nvrtcGetErrorString")
    RTC(nvrtcCreateProgram, "nvrtcCreateProgram")
    RTC(nvrtcDestroyProgram, "nvrtcDestroyProgram")
    RTC(nvrtcCompileProgram, "nvrtcCompileProgram")
    RTC(nvrtcGetProgramLogSize, "nvrtcGetProgramLogSize")
    RTC(nvrtcGetProgramLog, "nvrtcGetProgramLog")
    RTC(nvrtcGetPTXSize, "nvrtcGetPTXSize")
    RTC(nvrtcGetPTX, "nvrtcGetPTX")
    RTC_OPT(nvrtcGetCUBINSize, "nvrtcGetCUBINSize")
    RTC_OPT(nvrtcGetCUBIN, "nvrtcGetCUBIN")
    RTC_OPT(nvrtcGetNumSupportedArchs, "nvrtcGetNumSupportedArchs")
    RTC_OPT(nvrtcGetSupportedArchs, "nvrtcGetSupportedArchs")
    api.nvrtcVersion(&api.nvrtc_major, &api.nvrtc_minor);
    return;
fail:
    snprintf(load_failure, sizeof load_failure, "CUDA cannot be used: %s", why);
}

cube_error *cuda_api_load(const cuda_api **out)
{
    *out = NULL;
    pthread_once(&load_once, load);
    if (load_failure[0])
        return cube_error_new(CUBE_ERR_UNAVAILABLE, "%s", load_failure);
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
