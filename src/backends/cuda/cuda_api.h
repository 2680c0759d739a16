/* The CUDA driver API and NVRTC, loaded with dlopen at run time.
 *
 * cubert is built without CUDA headers or libraries: this file declares
 * the few types, constants and entry points the backend uses, with the
 * driver's ABI (the versioned symbol each one resolves to is named in
 * cuda_api.c). One binary then runs with or without a GPU, and without a
 * GPU `cuda_api_load` says why.
 *
 * Thread safety: cuda_api_load may be called from any thread; the table it
 * returns never changes and is never freed (the libraries stay loaded for
 * the life of the process, as the driver expects).
 */
#ifndef CUBE_CUDA_API_H
#define CUBE_CUDA_API_H

#include <stddef.h>
#include <stdint.h>

#include "cubert/backend/config.h"
#include "cubert/error.h"

typedef int CUresult;
typedef int CUdevice;
typedef uint64_t CUdeviceptr;
typedef struct CUctx_st *CUcontext;
typedef struct CUmod_st *CUmodule;
typedef struct CUfunc_st *CUfunction;
typedef struct CUstream_st *CUstream;
typedef struct CUevent_st *CUevent;
typedef struct CUgraph_st *CUgraph;
typedef struct CUgraphExec_st *CUgraphExec;
typedef struct CUarray_st *CUarray;
typedef struct _nvrtcProgram *nvrtcProgram;
typedef int nvrtcResult;

enum {
    CUDA_SUCCESS = 0,
    CUDA_ERROR_INVALID_VALUE = 1,
    CUDA_ERROR_OUT_OF_MEMORY = 2,
    CUDA_ERROR_NOT_INITIALIZED = 3,
    CUDA_ERROR_NO_DEVICE = 100,
    CUDA_ERROR_INVALID_DEVICE = 101,
    CUDA_ERROR_INVALID_CONTEXT = 201,
    CUDA_ERROR_INVALID_HANDLE = 400,
    CUDA_ERROR_ECC_UNCORRECTABLE = 214,
    CUDA_ERROR_NOT_READY = 600,
    CUDA_ERROR_ILLEGAL_ADDRESS = 700,
    CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES = 701,
    CUDA_ERROR_LAUNCH_TIMEOUT = 702,
    CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED = 704,
    CUDA_ERROR_CONTEXT_IS_DESTROYED = 709,
    CUDA_ERROR_ASSERT = 710,
    CUDA_ERROR_HARDWARE_STACK_ERROR = 714,
    CUDA_ERROR_ILLEGAL_INSTRUCTION = 715,
    CUDA_ERROR_MISALIGNED_ADDRESS = 716,
    CUDA_ERROR_INVALID_ADDRESS_SPACE = 717,
    CUDA_ERROR_INVALID_PC = 718,
    CUDA_ERROR_LAUNCH_FAILED = 719,
    CUDA_ERROR_STREAM_CAPTURE_INVALIDATED = 901
};

/* The driver's name for the legacy default stream (CU_STREAM_LEGACY). */
#define CUDA_STREAM_LEGACY ((CUstream)(uintptr_t)1)

/* Pointer attributes (CUpointer_attribute). */
enum {
    CU_POINTER_ATTRIBUTE_MEMORY_TYPE = 2,
    CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL = 9,
    CU_POINTER_ATTRIBUTE_RANGE_START_ADDR = 11,
    CU_POINTER_ATTRIBUTE_RANGE_SIZE = 12
};

/* Device attributes (CUdevice_attribute). */
enum {
    CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK = 1,
    CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X = 2,
    CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y = 3,
    CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z = 4,
    CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X = 5,
    CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y = 6,
    CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z = 7,
    CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK = 8,
    CU_DEVICE_ATTRIBUTE_WARP_SIZE = 10,
    CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16,
    CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT = 40,
    CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING = 41,
    CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75,
    CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76,
    CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN = 97,
    CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED = 102
};

/* Function attributes (CUfunction_attribute). */
enum {
    CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK = 0,
    CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES = 1,
    CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES = 3,
    CU_FUNC_ATTRIBUTE_NUM_REGS = 4,
    CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8
};

enum {
    CU_STREAM_NON_BLOCKING = 1,
    CU_EVENT_DEFAULT = 0,
    CU_EVENT_BLOCKING_SYNC = 1,
    CU_EVENT_DISABLE_TIMING = 2,
    CU_MEMHOSTALLOC_PORTABLE = 1,
    CU_STREAM_CAPTURE_MODE_GLOBAL = 0,
    CU_STREAM_CAPTURE_MODE_THREAD_LOCAL = 1,
    CU_STREAM_CAPTURE_MODE_RELAXED = 2,
    CU_MEMORYTYPE_HOST = 1,
    CU_MEMORYTYPE_DEVICE = 2
};

/* Virtual memory management (CUDA 10.2+): physical allocations mapped
 * into reserved address ranges. The structures have the driver's layout
 * (CUmemLocation, CUmemAllocationProp, CUmemAccessDesc). */
typedef unsigned long long CUmemGenericAllocationHandle;

enum {
    CU_MEM_ALLOCATION_TYPE_PINNED = 1,
    CU_MEM_HANDLE_TYPE_NONE = 0,
    CU_MEM_LOCATION_TYPE_DEVICE = 1,
    CU_MEM_ACCESS_FLAGS_PROT_READWRITE = 3,
    CU_MEM_ALLOC_GRANULARITY_MINIMUM = 0
};

typedef struct cuda_mem_location {
    int type; /* CU_MEM_LOCATION_TYPE_* */
    int id;   /* the device ordinal */
} cuda_mem_location;

typedef struct cuda_mem_allocation_prop {
    int type;                 /* CU_MEM_ALLOCATION_TYPE_* */
    int requestedHandleTypes; /* CU_MEM_HANDLE_TYPE_* */
    cuda_mem_location location;
    void *win32HandleMetaData;
    struct {
        unsigned char compressionType;
        unsigned char gpuDirectRDMACapable;
        unsigned short usage;
        unsigned char reserved[4];
    } allocFlags;
} cuda_mem_allocation_prop;

typedef struct cuda_mem_access_desc {
    cuda_mem_location location;
    int flags; /* CU_MEM_ACCESS_FLAGS_* */
} cuda_mem_access_desc;

/* CUDA_MEMCPY2D (the _v2 layout, size_t fields). */
typedef struct cuda_memcpy2d {
    size_t srcXInBytes, srcY;
    int srcMemoryType;
    const void *srcHost;
    CUdeviceptr srcDevice;
    CUarray srcArray;
    size_t srcPitch;
    size_t dstXInBytes, dstY;
    int dstMemoryType;
    void *dstHost;
    CUdeviceptr dstDevice;
    CUarray dstArray;
    size_t dstPitch;
    size_t WidthInBytes, Height;
} cuda_memcpy2d;

#define CUDA_FN(ret, name, args) ret(*name) args;

/* The entry points, each resolved once. */
typedef struct cuda_api {
    /* driver */
    CUDA_FN(CUresult, cuInit, (unsigned))
    CUDA_FN(CUresult, cuDriverGetVersion, (int *))
    CUDA_FN(CUresult, cuGetErrorName, (CUresult, const char **))
    CUDA_FN(CUresult, cuGetErrorString, (CUresult, const char **))
    CUDA_FN(CUresult, cuDeviceGetCount, (int *))
    CUDA_FN(CUresult, cuDeviceGet, (CUdevice *, int))
    CUDA_FN(CUresult, cuDeviceGetName, (char *, int, CUdevice))
    CUDA_FN(CUresult, cuDeviceGetAttribute, (int *, int, CUdevice))
    CUDA_FN(CUresult, cuDeviceTotalMem, (size_t *, CUdevice))
    CUDA_FN(CUresult, cuDevicePrimaryCtxRetain, (CUcontext *, CUdevice))
    CUDA_FN(CUresult, cuDevicePrimaryCtxRelease, (CUdevice))
    CUDA_FN(CUresult, cuCtxSetCurrent, (CUcontext))
    CUDA_FN(CUresult, cuCtxGetCurrent, (CUcontext *))
    CUDA_FN(CUresult, cuMemGetInfo, (size_t *, size_t *))
    /* What a pointer is (wrapping foreign memory). */
    CUDA_FN(CUresult, cuPointerGetAttributes,
            (unsigned int, int *, void **, CUdeviceptr))
    CUDA_FN(CUresult, cuMemAlloc, (CUdeviceptr *, size_t))
    CUDA_FN(CUresult, cuMemFree, (CUdeviceptr))
    CUDA_FN(CUresult, cuMemHostAlloc, (void **, size_t, unsigned))
    CUDA_FN(CUresult, cuMemFreeHost, (void *))
    CUDA_FN(CUresult, cuMemcpyHtoDAsync,
            (CUdeviceptr, const void *, size_t, CUstream))
    CUDA_FN(CUresult, cuMemcpyDtoHAsync,
            (void *, CUdeviceptr, size_t, CUstream))
    CUDA_FN(CUresult, cuMemcpyDtoDAsync,
            (CUdeviceptr, CUdeviceptr, size_t, CUstream))
    /* Copies between devices (peer copies). */
    CUDA_FN(CUresult, cuMemcpyPeerAsync,
            (CUdeviceptr, CUcontext, CUdeviceptr, CUcontext, size_t, CUstream))
    CUDA_FN(CUresult, cuDeviceCanAccessPeer, (int *, CUdevice, CUdevice))
    CUDA_FN(CUresult, cuCtxEnablePeerAccess, (CUcontext, unsigned))
    CUDA_FN(CUresult, cuMemcpy2DAsync, (const cuda_memcpy2d *, CUstream))
    CUDA_FN(CUresult, cuMemcpyDtoH, (void *, CUdeviceptr, size_t))
    CUDA_FN(CUresult, cuStreamCreate, (CUstream *, unsigned))
    CUDA_FN(CUresult, cuStreamDestroy, (CUstream))
    CUDA_FN(CUresult, cuStreamSynchronize, (CUstream))
    CUDA_FN(CUresult, cuStreamQuery, (CUstream))
    CUDA_FN(CUresult, cuStreamWaitEvent, (CUstream, CUevent, unsigned))
    CUDA_FN(CUresult, cuEventCreate, (CUevent *, unsigned))
    CUDA_FN(CUresult, cuEventDestroy, (CUevent))
    CUDA_FN(CUresult, cuEventRecord, (CUevent, CUstream))
    CUDA_FN(CUresult, cuEventQuery, (CUevent))
    CUDA_FN(CUresult, cuEventSynchronize, (CUevent))
    CUDA_FN(CUresult, cuEventElapsedTime, (float *, CUevent, CUevent))
    CUDA_FN(CUresult, cuModuleLoadData, (CUmodule *, const void *))
    CUDA_FN(CUresult, cuModuleUnload, (CUmodule))
    CUDA_FN(CUresult, cuModuleGetFunction,
            (CUfunction *, CUmodule, const char *))
    CUDA_FN(CUresult, cuModuleGetGlobal,
            (CUdeviceptr *, size_t *, CUmodule, const char *))
    CUDA_FN(CUresult, cuFuncGetAttribute, (int *, int, CUfunction))
    CUDA_FN(CUresult, cuFuncSetAttribute, (CUfunction, int, int))
    CUDA_FN(CUresult, cuLaunchKernel,
            (CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned,
             unsigned, unsigned, CUstream, void **, void **))
    CUDA_FN(CUresult, cuStreamBeginCapture, (CUstream, int))
    CUDA_FN(CUresult, cuStreamEndCapture, (CUstream, CUgraph *))
    CUDA_FN(CUresult, cuThreadExchangeStreamCaptureMode, (int *))
    CUDA_FN(CUresult, cuGraphInstantiateWithFlags,
            (CUgraphExec *, CUgraph, unsigned long long))
    CUDA_FN(CUresult, cuGraphLaunch, (CUgraphExec, CUstream))
    CUDA_FN(CUresult, cuGraphExecDestroy, (CUgraphExec))
    CUDA_FN(CUresult, cuGraphDestroy, (CUgraph))
    /* Offsets of a kernel's parameters (CUDA 12.4+), so a launch can hand
     * the driver one packed buffer; NULL: pointers per parameter. */
    CUDA_FN(CUresult, cuFuncGetParamInfo,
            (CUfunction, size_t, size_t *, size_t *))
    /* Virtual memory management, for expandable pools; NULL when the
     * driver lacks any of them (expandable pools are then unsupported). */
    CUDA_FN(CUresult, cuMemGetAllocationGranularity,
            (size_t *, const cuda_mem_allocation_prop *, int))
    CUDA_FN(CUresult, cuMemAddressReserve,
            (CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long))
    CUDA_FN(CUresult, cuMemAddressFree, (CUdeviceptr, size_t))
    CUDA_FN(CUresult, cuMemCreate,
            (CUmemGenericAllocationHandle *, size_t,
             const cuda_mem_allocation_prop *, unsigned long long))
    CUDA_FN(CUresult, cuMemRelease, (CUmemGenericAllocationHandle))
    CUDA_FN(CUresult, cuMemMap,
            (CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle,
             unsigned long long))
    CUDA_FN(CUresult, cuMemUnmap, (CUdeviceptr, size_t))
    CUDA_FN(CUresult, cuMemSetAccess,
            (CUdeviceptr, size_t, const cuda_mem_access_desc *, size_t))

    /* NVRTC */
    CUDA_FN(nvrtcResult, nvrtcVersion, (int *, int *))
    CUDA_FN(const char *, nvrtcGetErrorString, (nvrtcResult))
    CUDA_FN(nvrtcResult, nvrtcCreateProgram,
            (nvrtcProgram *, const char *, const char *, int,
             const char *const *, const char *const *))
    CUDA_FN(nvrtcResult, nvrtcDestroyProgram, (nvrtcProgram *))
    CUDA_FN(nvrtcResult, nvrtcCompileProgram,
            (nvrtcProgram, int, const char *const *))
    CUDA_FN(nvrtcResult, nvrtcGetProgramLogSize, (nvrtcProgram, size_t *))
    CUDA_FN(nvrtcResult, nvrtcGetProgramLog, (nvrtcProgram, char *))
    CUDA_FN(nvrtcResult, nvrtcGetPTXSize, (nvrtcProgram, size_t *))
    CUDA_FN(nvrtcResult, nvrtcGetPTX, (nvrtcProgram, char *))
    /* CUBIN output (NVRTC 11.1+); NULL when absent: PTX is used. */
    CUDA_FN(nvrtcResult, nvrtcGetCUBINSize, (nvrtcProgram, size_t *))
    CUDA_FN(nvrtcResult, nvrtcGetCUBIN, (nvrtcProgram, char *))
    CUDA_FN(nvrtcResult, nvrtcGetNumSupportedArchs, (int *))
    CUDA_FN(nvrtcResult, nvrtcGetSupportedArchs, (int *))

    int driver_version; /* e.g. 13000 */
    int nvrtc_major, nvrtc_minor;
    char driver_path[256], nvrtc_path[256];
} cuda_api;

#undef CUDA_FN

/* Loads libcuda and NVRTC (once per process) and initializes the driver.
 * Errors: CUBE_ERR_UNAVAILABLE with the reason (no driver library, no
 * NVRTC, an entry point missing, cuInit failed, no device). The result is
 * remembered: later calls answer the same. The returned table is static.
 * The keys cuda_library and nvrtc_library ($CUBERT_CUDA_LIBRARY,
 * $CUBERT_NVRTC_LIBRARY) name the libraries to load instead of the default
 * search. */
cube_error *cuda_api_load(const cuda_api **out);

/* The CUDA backend's configuration keys, for its cube_backend: the loader
 * is what reads them. */
extern const cube_config_key cuda_config_keys[];

/* "CUDA_ERROR_NAME (description)" for `r`, in a static string. */
const char *cuda_result_text(const cuda_api *api, CUresult r);

/* Whether `r` leaves the context unusable (a sticky error: every later
 * call fails until the context is destroyed). */
int cuda_result_is_fault(CUresult r);

/* A cube_error for a failed driver call: CUBE_ERR_DEVICE_FAULT for sticky
 * errors, CUBE_ERR_OUT_OF_MEMORY for CUDA_ERROR_OUT_OF_MEMORY, else
 * `code`; the message is the formatted context plus the driver's name and
 * description of `r`. */
cube_error *cuda_error(const cuda_api *api, CUresult r, cube_code code,
                       const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* The code of a failed allocation (cuMemAlloc, cuMemHostAlloc):
 * CUBE_ERR_DEVICE_FAULT for a sticky error, and for any error once the
 * context is known to be broken (`broken`: an earlier call met a sticky
 * error); else CUBE_ERR_OUT_OF_MEMORY. A broken context's allocations
 * fail for that reason, whatever the driver calls it: retrying after
 * freeing memory cannot help. */
cube_code cuda_alloc_code(CUresult r, int broken);

#endif /* CUBE_CUDA_API_H */
