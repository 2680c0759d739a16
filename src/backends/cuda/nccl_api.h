/* NCCL, loaded with dlopen at run time.
 *
 * cubert is built without NCCL: this file declares the few types,
 * constants and entry points the CUDA backend's collectives use, with
 * NCCL's ABI (2.18 and later). The library is looked for when the first
 * communicator is made: $CUBERT_NCCL_LIBRARY, else libnccl.so.2, else
 * libnccl.so. Without it collectives answer CUBE_ERR_UNAVAILABLE naming
 * what was tried; nothing else of the backend needs it.
 *
 * Thread safety: nccl_api_load may be called from any thread; the table
 * never changes and is never freed.
 */
#ifndef CUBE_NCCL_API_H
#define CUBE_NCCL_API_H

#include <limits.h>
#include <stddef.h>

#include "cubert/backend/config.h"
#include "cubert/error.h"

typedef int ncclResult_t;
typedef struct ncclComm *ncclComm_t;
typedef int ncclDataType_t;
typedef int ncclRedOp_t;
typedef struct CUstream_st *nccl_stream; /* cudaStream_t is a CUstream */

#define NCCL_UNIQUE_ID_BYTES 128
typedef struct {
    char internal[NCCL_UNIQUE_ID_BYTES];
} ncclUniqueId;

enum {
    ncclSuccess = 0,
    ncclUnhandledCudaError = 1,
    ncclSystemError = 2,
    ncclInternalError = 3,
    ncclInvalidArgument = 4,
    ncclInvalidUsage = 5,
    ncclRemoteError = 6,
    ncclInProgress = 7
};

enum {
    ncclInt8 = 0,
    ncclUint8 = 1,
    ncclInt32 = 2,
    ncclUint32 = 3,
    ncclInt64 = 4,
    ncclUint64 = 5,
    ncclFloat16 = 6,
    ncclFloat32 = 7,
    ncclFloat64 = 8,
    ncclBfloat16 = 9
};

enum { ncclSum = 0, ncclProd = 1, ncclMax = 2, ncclMin = 3, ncclAvg = 4 };

/* The communicator configuration as of NCCL 2.18: a library reads the
 * fields the version it is handed names, so a later NCCL takes it too. */
#define NCCL_CONFIG_MAGIC 0xcafebeefu
#define NCCL_CONFIG_VERSION_2_18 21800u
#define NCCL_CONFIG_UNDEF_INT INT_MIN
typedef struct nccl_config {
    size_t size;
    unsigned int magic;
    unsigned int version;
    int blocking;
    int cgaClusterSize;
    int minCTAs;
    int maxCTAs;
    const char *netName;
    int splitShare;
} nccl_config;

typedef struct nccl_api {
    char path[512]; /* the library loaded */
    int version;    /* ncclGetVersion */
#define NCCL_FN(ret, name, args) ret(*name) args;
    NCCL_FN(ncclResult_t, ncclGetVersion, (int *))
    NCCL_FN(const char *, ncclGetErrorString, (ncclResult_t))
    NCCL_FN(const char *, ncclGetLastError, (ncclComm_t))
    NCCL_FN(ncclResult_t, ncclGetUniqueId, (ncclUniqueId *))
    NCCL_FN(ncclResult_t, ncclCommInitRankConfig,
            (ncclComm_t *, int, ncclUniqueId, int, nccl_config *))
    NCCL_FN(ncclResult_t, ncclCommGetAsyncError, (ncclComm_t, ncclResult_t *))
    NCCL_FN(ncclResult_t, ncclCommFinalize, (ncclComm_t))
    NCCL_FN(ncclResult_t, ncclCommDestroy, (ncclComm_t))
    NCCL_FN(ncclResult_t, ncclCommAbort, (ncclComm_t))
    NCCL_FN(ncclResult_t, ncclAllReduce,
            (const void *, void *, size_t, ncclDataType_t, ncclRedOp_t,
             ncclComm_t, nccl_stream))
    NCCL_FN(ncclResult_t, ncclBroadcast,
            (const void *, void *, size_t, ncclDataType_t, int, ncclComm_t,
             nccl_stream))
    NCCL_FN(ncclResult_t, ncclReduce,
            (const void *, void *, size_t, ncclDataType_t, ncclRedOp_t, int,
             ncclComm_t, nccl_stream))
    NCCL_FN(ncclResult_t, ncclAllGather,
            (const void *, void *, size_t, ncclDataType_t, ncclComm_t,
             nccl_stream))
    NCCL_FN(ncclResult_t, ncclReduceScatter,
            (const void *, void *, size_t, ncclDataType_t, ncclRedOp_t,
             ncclComm_t, nccl_stream))
    NCCL_FN(ncclResult_t, ncclSend,
            (const void *, size_t, ncclDataType_t, int, ncclComm_t,
             nccl_stream))
    NCCL_FN(ncclResult_t, ncclRecv,
            (void *, size_t, ncclDataType_t, int, ncclComm_t, nccl_stream))
    NCCL_FN(ncclResult_t, ncclGroupStart, (void))
    NCCL_FN(ncclResult_t, ncclGroupEnd, (void))
#undef NCCL_FN
} nccl_api;

/* Loads NCCL once per process. Errors: CUBE_ERR_UNAVAILABLE naming every
 * library tried and why each failed. */
cube_error *nccl_api_load(const nccl_api **out);

/* A configuration NCCL 2.18 and later read: `blocking` or not, every
 * other field left to NCCL. */
void nccl_config_init(nccl_config *cfg, int blocking);

/* "ncclInvalidUsage (message)" for messages; thread-local storage. */
const char *nccl_result_text(const nccl_api *a, ncclResult_t r,
                             ncclComm_t comm);

#endif /* CUBE_NCCL_API_H */
