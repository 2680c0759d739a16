/* A fake NCCL: a test double, never a communication library.
 *
 * It lets one GPU test what the CUDA backend does around NCCL calls that
 * never finish (the communicator timeout between processes), which real
 * NCCL cannot show with a single rank. Load it in place of NCCL with
 * CUBERT_NCCL_LIBRARY=<path of this library>. It exports every entry point
 * src/backends/cuda/nccl_api.c resolves, with the ABI nccl_api.h declares,
 * and behaves as one rank of a job whose other ranks never do anything:
 *
 * - ncclGetVersion: 22809 (2.28.9). ncclGetErrorString: NCCL's names.
 *   ncclGetLastError: the text of this thread's last failure, "" if none.
 * - ncclGetUniqueId: distinct bytes per call ("fake-nccl", the process id,
 *   a counter); nothing reads them back.
 * - ncclCommInitRankConfig: any nranks >= 1 and rank below it; returns
 *   ncclSuccess at once whatever the configuration says (blocking or
 *   not), and the communicator's asynchronous error is ncclSuccess from
 *   then on. It needs a current CUDA context: the communicator gets a
 *   4-byte flag in host memory mapped into the device (cuMemHostAlloc
 *   with CU_MEMHOSTALLOC_DEVICEMAP), 0 until ncclCommAbort sets it to 1,
 *   and the two kernels below, loaded into that context.
 * - ncclAllReduce, ncclReduce, ncclAllGather, ncclReduceScatter: one
 *   cuMemcpyDtoDAsync on the given stream of the bytes this rank's
 *   destination would get from its own source, whatever the operation
 *   (as if every peer contributed nothing): all-reduce copies count
 *   elements from sendbuff to recvbuff; reduce does the same on the root
 *   and nothing elsewhere; all-gather copies sendbuff into this rank's
 *   slot of recvbuff (recvbuff + rank * count elements), the other slots
 *   untouched; reduce-scatter copies this rank's slot of sendbuff
 *   (sendbuff + rank * count elements) into recvbuff. In place (source
 *   and destination the same bytes): nothing is enqueued.
 * - ncclBroadcast: a kernel on the stream that spins for
 *   $CUBERT_FAKE_NCCL_SPIN_MS milliseconds of the device's clock
 *   (%globaltimer; default 1000), then, on the root, the copy of count
 *   elements from sendbuff to recvbuff (other ranks' recvbuff untouched).
 *   It shows that a call queued behind others is timed from its start.
 * - ncclRecv: a kernel on the stream that spins until the communicator's
 *   abort flag is 1, then returns: a receive whose sender never comes.
 *   ncclSend: nothing (ncclSuccess).
 * - Both kernels leave early once the abort flag is 1, as NCCL's kernels
 *   do (they poll an abort flag in host-mapped memory).
 * - ncclCommAbort: sets the flag to 1 (the spinning kernels then exit)
 *   and closes the communicator. ncclCommFinalize: ncclSuccess.
 *   ncclCommDestroy: closes the communicator (the flag is left as it is:
 *   a receive still spinning keeps spinning, as NCCL's would).
 *   A closed communicator answers every later call with
 *   ncclInvalidUsage (real NCCL has freed it: the caller's bug, shown).
 *   Communicators and their flags are kept for the life of the process,
 *   so a kernel still polling a flag never reads freed memory.
 * - ncclGroupStart / ncclGroupEnd: nesting counted; calls inside a group
 *   are enqueued at once.
 * Arguments out of range (a NULL communicator, rank, root or peer not
 * below nranks, an unknown data type, a NULL buffer a copy needs) answer
 * ncclInvalidArgument; a failed CUDA call ncclUnhandledCudaError.
 *
 * The CUDA driver is loaded with dlopen("libcuda.so.1") on first use; the
 * kernels are PTX, loaded with cuModuleLoadData into the context current
 * when a communicator is made (each communicator its own module, kept like
 * the communicator: a context made again later never sees stale ones). Thread
 * safety: every entry point may be called from any thread (ncclCommAbort from a
 * thread other than the one enqueueing, as a watchdog does).
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backends/cuda/cuda_api.h"
#include "backends/cuda/nccl_api.h"

#define FAKE_API __attribute__((visibility("default")))

#define FAKE_NCCL_VERSION 22809
#define CU_MEMHOSTALLOC_DEVICEMAP_ 0x02

/* --- the exported entry points, with NCCL's names --- */

FAKE_API ncclResult_t ncclGetVersion(int *version);
FAKE_API const char *ncclGetErrorString(ncclResult_t result);
FAKE_API const char *ncclGetLastError(ncclComm_t comm);
FAKE_API ncclResult_t ncclGetUniqueId(ncclUniqueId *id);
FAKE_API ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks,
                                             ncclUniqueId id, int rank,
                                             nccl_config *config);
FAKE_API ncclResult_t ncclCommGetAsyncError(ncclComm_t comm,
                                            ncclResult_t *state);
FAKE_API ncclResult_t ncclCommFinalize(ncclComm_t comm);
FAKE_API ncclResult_t ncclCommDestroy(ncclComm_t comm);
FAKE_API ncclResult_t ncclCommAbort(ncclComm_t comm);
FAKE_API ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff,
                                    size_t count, ncclDataType_t datatype,
                                    ncclRedOp_t op, ncclComm_t comm,
                                    nccl_stream stream);
FAKE_API ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff,
                                    size_t count, ncclDataType_t datatype,
                                    int root, ncclComm_t comm,
                                    nccl_stream stream);
FAKE_API ncclResult_t ncclReduce(const void *sendbuff, void *recvbuff,
                                 size_t count, ncclDataType_t datatype,
                                 ncclRedOp_t op, int root, ncclComm_t comm,
                                 nccl_stream stream);
FAKE_API ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff,
                                    size_t sendcount, ncclDataType_t datatype,
                                    ncclComm_t comm, nccl_stream stream);
FAKE_API ncclResult_t ncclReduceScatter(const void *sendbuff, void *recvbuff,
                                        size_t recvcount,
                                        ncclDataType_t datatype, ncclRedOp_t op,
                                        ncclComm_t comm, nccl_stream stream);
FAKE_API ncclResult_t ncclSend(const void *sendbuff, size_t count,
                               ncclDataType_t datatype, int peer,
                               ncclComm_t comm, nccl_stream stream);
FAKE_API ncclResult_t ncclRecv(void *recvbuff, size_t count,
                               ncclDataType_t datatype, int peer,
                               ncclComm_t comm, nccl_stream stream);
FAKE_API ncclResult_t ncclGroupStart(void);
FAKE_API ncclResult_t ncclGroupEnd(void);

/* Each entry point has exactly the type the loader's table expects. */
#define SAME_ABI(name)                                                         \
    _Static_assert(__builtin_types_compatible_p(                               \
                       __typeof__(&name), __typeof__(((nccl_api *)0)->name)),  \
                   #name " differs from nccl_api.h")
SAME_ABI(ncclGetVersion);
SAME_ABI(ncclGetErrorString);
SAME_ABI(ncclGetLastError);
SAME_ABI(ncclGetUniqueId);
SAME_ABI(ncclCommInitRankConfig);
SAME_ABI(ncclCommGetAsyncError);
SAME_ABI(ncclCommFinalize);
SAME_ABI(ncclCommDestroy);
SAME_ABI(ncclCommAbort);
SAME_ABI(ncclAllReduce);
SAME_ABI(ncclBroadcast);
SAME_ABI(ncclReduce);
SAME_ABI(ncclAllGather);
SAME_ABI(ncclReduceScatter);
SAME_ABI(ncclSend);
SAME_ABI(ncclRecv);
SAME_ABI(ncclGroupStart);
SAME_ABI(ncclGroupEnd);

/* --- the CUDA driver, the few entry points used --- */

static struct {
    CUresult (*cuInit)(unsigned);
    CUresult (*cuCtxGetCurrent)(CUcontext *);
    CUresult (*cuMemHostAlloc)(void **, size_t, unsigned);
    CUresult (*cuMemHostGetDevicePointer)(CUdeviceptr *, void *, unsigned);
    CUresult (*cuModuleLoadData)(CUmodule *, const void *);
    CUresult (*cuModuleGetFunction)(CUfunction *, CUmodule, const char *);
    CUresult (*cuLaunchKernel)(CUfunction, unsigned, unsigned, unsigned,
                               unsigned, unsigned, unsigned, unsigned, CUstream,
                               void **, void **);
    CUresult (*cuMemcpyDtoDAsync)(CUdeviceptr, CUdeviceptr, size_t, CUstream);
} drv;
static char drv_failure[256]; /* empty: loaded */
static pthread_once_t drv_once = PTHREAD_ONCE_INIT;

static void drv_load(void)
{
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        snprintf(drv_failure, sizeof drv_failure, "%s", dlerror());
        return;
    }
    struct {
        void **slot;
        const char *symbol; /* the versioned name of the ABI declared */
    } fns[] = {
        {(void **)&drv.cuInit, "cuInit"},
        {(void **)&drv.cuCtxGetCurrent, "cuCtxGetCurrent"},
        {(void **)&drv.cuMemHostAlloc, "cuMemHostAlloc"},
        {(void **)&drv.cuMemHostGetDevicePointer,
         "cuMemHostGetDevicePointer_v2"},
        {(void **)&drv.cuModuleLoadData, "cuModuleLoadData"},
        {(void **)&drv.cuModuleGetFunction, "cuModuleGetFunction"},
        {(void **)&drv.cuLaunchKernel, "cuLaunchKernel"},
        {(void **)&drv.cuMemcpyDtoDAsync, "cuMemcpyDtoDAsync_v2"},
    };
    for (size_t i = 0; i < sizeof fns / sizeof fns[0]; i++) {
        *fns[i].slot = dlsym(lib, fns[i].symbol);
        if (!*fns[i].slot) {
            snprintf(drv_failure, sizeof drv_failure,
                     "libcuda.so.1 has no entry point %s", fns[i].symbol);
            return;
        }
    }
    CUresult r = drv.cuInit(0);
    if (r != CUDA_SUCCESS)
        snprintf(drv_failure, sizeof drv_failure, "cuInit: CUDA error %d", r);
}

/* --- failures: this thread's last text --- */

static _Thread_local char last_error[512];

static ncclResult_t fail(ncclResult_t r, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static ncclResult_t fail(ncclResult_t r, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    return r;
}

static ncclResult_t cuda_fail(CUresult r, const char *what)
{
    return fail(ncclUnhandledCudaError, "fake NCCL: %s: CUDA error %d", what,
                r);
}

static ncclResult_t drv_ready(void)
{
    pthread_once(&drv_once, drv_load);
    if (drv_failure[0])
        return fail(ncclSystemError, "fake NCCL: no CUDA driver: %s",
                    drv_failure);
    return ncclSuccess;
}

/* --- the kernels --- */

/* One thread each. The flag pointer is the device address of the
 * communicator's host-mapped abort flag; volatile loads see the host's
 * store. nanosleep keeps the spinning thread from hogging its SM. */
static const char kernels_ptx[] =
    ".version 7.8\n"
    ".target sm_80\n"
    ".address_size 64\n"
    "\n"
    "// Spins until *flag != 0: a receive whose sender never comes.\n"
    ".visible .entry fake_nccl_wait_abort(.param .u64 flag)\n"
    "{\n"
    "    .reg .pred %p;\n"
    "    .reg .b32 %v;\n"
    "    .reg .b64 %a;\n"
    "    ld.param.u64 %a, [flag];\n"
    "    cvta.to.global.u64 %a, %a;\n"
    "WAIT_LOOP:\n"
    "    ld.volatile.global.u32 %v, [%a];\n"
    "    setp.ne.u32 %p, %v, 0;\n"
    "    @%p bra WAIT_DONE;\n"
    "    nanosleep.u32 1000;\n"
    "    bra.uni WAIT_LOOP;\n"
    "WAIT_DONE:\n"
    "    ret;\n"
    "}\n"
    "\n"
    "// Spins for ns nanoseconds of %globaltimer, or until *flag != 0.\n"
    ".visible .entry fake_nccl_spin(.param .u64 flag, .param .u64 ns)\n"
    "{\n"
    "    .reg .pred %p;\n"
    "    .reg .b32 %v;\n"
    "    .reg .b64 %a, %t, %end;\n"
    "    ld.param.u64 %a, [flag];\n"
    "    cvta.to.global.u64 %a, %a;\n"
    "    ld.param.u64 %end, [ns];\n"
    "    mov.u64 %t, %globaltimer;\n"
    "    add.u64 %end, %end, %t;\n"
    "SPIN_LOOP:\n"
    "    ld.volatile.global.u32 %v, [%a];\n"
    "    setp.ne.u32 %p, %v, 0;\n"
    "    @%p bra SPIN_DONE;\n"
    "    mov.u64 %t, %globaltimer;\n"
    "    setp.ge.u64 %p, %t, %end;\n"
    "    @%p bra SPIN_DONE;\n"
    "    nanosleep.u32 1000;\n"
    "    bra.uni SPIN_LOOP;\n"
    "SPIN_DONE:\n"
    "    ret;\n"
    "}\n";

/* The kernels, loaded into the current context. */
static ncclResult_t load_kernels(CUfunction *wait_abort, CUfunction *spin)
{
    CUcontext ctx = NULL;
    CUresult r = drv.cuCtxGetCurrent(&ctx);
    if (r != CUDA_SUCCESS)
        return cuda_fail(r, "cuCtxGetCurrent");
    if (!ctx)
        return fail(ncclInvalidUsage, "fake NCCL: no current CUDA context");
    CUmodule m = NULL;
    if ((r = drv.cuModuleLoadData(&m, kernels_ptx)) != CUDA_SUCCESS)
        return cuda_fail(r, "cuModuleLoadData (the kernels' PTX)");
    if ((r = drv.cuModuleGetFunction(wait_abort, m, "fake_nccl_wait_abort")) !=
            CUDA_SUCCESS ||
        (r = drv.cuModuleGetFunction(spin, m, "fake_nccl_spin")) !=
            CUDA_SUCCESS)
        return cuda_fail(r, "cuModuleGetFunction");
    return ncclSuccess;
}

/* --- communicators --- */

enum { COMM_LIVE, COMM_ABORTED, COMM_DESTROYED };

struct ncclComm {
    int nranks, rank;
    _Atomic uint32_t *flag;      /* host address of the abort flag */
    CUdeviceptr flag_dev;        /* its device address */
    CUfunction wait_abort, spin; /* in the context current at init */
    atomic_int state;
    struct ncclComm *next; /* every communicator made, kept (see above) */
};

static struct ncclComm *comms;
static pthread_mutex_t comm_lock = PTHREAD_MUTEX_INITIALIZER;

static ncclResult_t comm_usable(ncclComm_t comm)
{
    if (!comm)
        return fail(ncclInvalidArgument, "fake NCCL: NULL communicator");
    switch (atomic_load(&comm->state)) {
    case COMM_ABORTED:
        return fail(ncclInvalidUsage,
                    "fake NCCL: the communicator was aborted (NCCL has freed "
                    "it)");
    case COMM_DESTROYED:
        return fail(ncclInvalidUsage,
                    "fake NCCL: the communicator was destroyed (NCCL has "
                    "freed it)");
    default: return ncclSuccess;
    }
}

static size_t type_size(ncclDataType_t t)
{
    switch (t) {
    case ncclInt8:
    case ncclUint8: return 1;
    case ncclFloat16:
    case ncclBfloat16: return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32: return 4;
    case ncclInt64:
    case ncclUint64:
    case ncclFloat64: return 8;
    default: return 0;
    }
}

/* The checks every call makes: a live communicator, a known type, a rank
 * (root or peer; -1: none) below nranks. */
static ncclResult_t check_call(ncclComm_t comm, ncclDataType_t t, int peer,
                               size_t *elem)
{
    ncclResult_t r = comm_usable(comm);
    if (r != ncclSuccess)
        return r;
    *elem = type_size(t);
    if (!*elem)
        return fail(ncclInvalidArgument, "fake NCCL: unknown data type %d", t);
    if (peer != -1 && (peer < 0 || peer >= comm->nranks))
        return fail(ncclInvalidArgument,
                    "fake NCCL: rank %d out of range (%d ranks)", peer,
                    comm->nranks);
    return ncclSuccess;
}

/* dst[0, bytes) = src[0, bytes) on the stream; nothing in place or for 0
 * bytes. */
static ncclResult_t copy(const void *src, void *dst, size_t bytes,
                         CUstream stream)
{
    if (bytes == 0 || src == dst)
        return ncclSuccess;
    if (!src || !dst)
        return fail(ncclInvalidArgument, "fake NCCL: NULL buffer");
    CUresult r =
        drv.cuMemcpyDtoDAsync((CUdeviceptr)(uintptr_t)dst,
                              (CUdeviceptr)(uintptr_t)src, bytes, stream);
    return r == CUDA_SUCCESS ? ncclSuccess : cuda_fail(r, "cuMemcpyDtoDAsync");
}

static ncclResult_t launch(CUfunction f, void **params, CUstream stream)
{
    CUresult r =
        drv.cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, stream, params, NULL);
    return r == CUDA_SUCCESS ? ncclSuccess : cuda_fail(r, "cuLaunchKernel");
}

/* $CUBERT_FAKE_NCCL_SPIN_MS, else 1000. */
static uint64_t spin_ns(void)
{
    const char *text = getenv("CUBERT_FAKE_NCCL_SPIN_MS");
    uint64_t ms = 1000;
    if (text && *text) {
        char *end = NULL;
        unsigned long long v = strtoull(text, &end, 10);
        if (end && *end == '\0' && v <= 3600000ull)
            ms = v;
    }
    return ms * 1000000ull;
}

/* --- the entry points --- */

ncclResult_t ncclGetVersion(int *version)
{
    if (!version)
        return fail(ncclInvalidArgument, "fake NCCL: NULL version");
    *version = FAKE_NCCL_VERSION;
    return ncclSuccess;
}

const char *ncclGetErrorString(ncclResult_t result)
{
    switch (result) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error";
    case ncclSystemError: return "unhandled system error";
    case ncclInternalError: return "internal error";
    case ncclInvalidArgument: return "invalid argument";
    case ncclInvalidUsage: return "invalid usage";
    case ncclRemoteError:
        return "remote process exited or there was a "
               "network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
    }
}

const char *ncclGetLastError(ncclComm_t comm)
{
    (void)comm;
    return last_error;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId *id)
{
    static atomic_uint counter;
    if (!id)
        return fail(ncclInvalidArgument, "fake NCCL: NULL id");
    memset(id, 0, sizeof *id);
    snprintf(id->internal, sizeof id->internal, "fake-nccl %ld %u",
             (long)getpid(), atomic_fetch_add(&counter, 1));
    return ncclSuccess;
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t *out, int nranks,
                                    ncclUniqueId id, int rank,
                                    nccl_config *config)
{
    (void)id;
    (void)config; /* blocking or not: the call is done when it returns */
    if (!out)
        return fail(ncclInvalidArgument, "fake NCCL: NULL communicator");
    *out = NULL;
    if (nranks < 1 || rank < 0 || rank >= nranks)
        return fail(ncclInvalidArgument,
                    "fake NCCL: rank %d of %d ranks is out of range", rank,
                    nranks);
    ncclResult_t nr = drv_ready();
    if (nr != ncclSuccess)
        return nr;
    struct ncclComm *c = calloc(1, sizeof *c);
    if (!c)
        return fail(ncclSystemError, "fake NCCL: out of memory");
    void *flag = NULL;
    CUresult r = drv.cuMemHostAlloc(&flag, sizeof(uint32_t),
                                    CU_MEMHOSTALLOC_PORTABLE |
                                        CU_MEMHOSTALLOC_DEVICEMAP_);
    if (r == CUDA_SUCCESS) {
        c->flag = flag;
        atomic_store(c->flag, 0);
        r = drv.cuMemHostGetDevicePointer(&c->flag_dev, flag, 0);
    }
    if (r != CUDA_SUCCESS) {
        /* The flag, if any, stays: freeing it needs a context that may
         * be the failing one, and a test makes few. */
        free(c);
        return cuda_fail(r, "the abort flag (cuMemHostAlloc with "
                            "CU_MEMHOSTALLOC_DEVICEMAP)");
    }
    nr = load_kernels(&c->wait_abort, &c->spin);
    if (nr != ncclSuccess) {
        free(c);
        return nr;
    }
    c->nranks = nranks;
    c->rank = rank;
    atomic_init(&c->state, COMM_LIVE);
    pthread_mutex_lock(&comm_lock);
    c->next = comms;
    comms = c;
    pthread_mutex_unlock(&comm_lock);
    *out = c;
    return ncclSuccess;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *state)
{
    ncclResult_t r = comm_usable(comm);
    if (r != ncclSuccess)
        return r;
    if (!state)
        return fail(ncclInvalidArgument, "fake NCCL: NULL state");
    *state = ncclSuccess; /* every call is enqueued before it returns */
    return ncclSuccess;
}

ncclResult_t ncclCommFinalize(ncclComm_t comm)
{
    return comm_usable(comm);
}

ncclResult_t ncclCommDestroy(ncclComm_t comm)
{
    ncclResult_t r = comm_usable(comm);
    if (r == ncclSuccess)
        atomic_store(&comm->state, COMM_DESTROYED);
    return r;
}

ncclResult_t ncclCommAbort(ncclComm_t comm)
{
    ncclResult_t r = comm_usable(comm);
    if (r != ncclSuccess)
        return r;
    /* The device's volatile loads of the mapped flag see this store; the
     * kernels waiting on it then return and the stream moves on. */
    atomic_store(comm->flag, 1);
    atomic_store(&comm->state, COMM_ABORTED);
    return ncclSuccess;
}

ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count,
                           ncclDataType_t datatype, ncclRedOp_t op,
                           ncclComm_t comm, nccl_stream stream)
{
    (void)op;
    size_t elem = 0;
    ncclResult_t r = check_call(comm, datatype, -1, &elem);
    return r != ncclSuccess ? r
                            : copy(sendbuff, recvbuff, count * elem, stream);
}

ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count,
                           ncclDataType_t datatype, int root, ncclComm_t comm,
                           nccl_stream stream)
{
    size_t elem = 0;
    ncclResult_t r = check_call(comm, datatype, root, &elem);
    if (r != ncclSuccess)
        return r;
    uint64_t ns = spin_ns();
    void *params[] = {&comm->flag_dev, &ns};
    r = launch(comm->spin, params, stream);
    if (r == ncclSuccess && comm->rank == root)
        r = copy(sendbuff, recvbuff, count * elem, stream);
    return r;
}

ncclResult_t ncclReduce(const void *sendbuff, void *recvbuff, size_t count,
                        ncclDataType_t datatype, ncclRedOp_t op, int root,
                        ncclComm_t comm, nccl_stream stream)
{
    (void)op;
    size_t elem = 0;
    ncclResult_t r = check_call(comm, datatype, root, &elem);
    if (r != ncclSuccess || comm->rank != root)
        return r;
    return copy(sendbuff, recvbuff, count * elem, stream);
}

ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff,
                           size_t sendcount, ncclDataType_t datatype,
                           ncclComm_t comm, nccl_stream stream)
{
    size_t elem = 0;
    ncclResult_t r = check_call(comm, datatype, -1, &elem);
    if (r != ncclSuccess)
        return r;
    if (!recvbuff)
        return fail(ncclInvalidArgument, "fake NCCL: NULL buffer");
    size_t bytes = sendcount * elem;
    return copy(sendbuff, (char *)recvbuff + (size_t)comm->rank * bytes, bytes,
                stream);
}

ncclResult_t ncclReduceScatter(const void *sendbuff, void *recvbuff,
                               size_t recvcount, ncclDataType_t datatype,
                               ncclRedOp_t op, ncclComm_t comm,
                               nccl_stream stream)
{
    (void)op;
    size_t elem = 0;
    ncclResult_t r = check_call(comm, datatype, -1, &elem);
    if (r != ncclSuccess)
        return r;
    if (!sendbuff)
        return fail(ncclInvalidArgument, "fake NCCL: NULL buffer");
    size_t bytes = recvcount * elem;
    return copy((const char *)sendbuff + (size_t)comm->rank * bytes, recvbuff,
                bytes, stream);
}

ncclResult_t ncclSend(const void *sendbuff, size_t count,
                      ncclDataType_t datatype, int peer, ncclComm_t comm,
                      nccl_stream stream)
{
    (void)sendbuff;
    (void)count;
    (void)stream;
    size_t elem = 0;
    return check_call(comm, datatype, peer, &elem);
}

ncclResult_t ncclRecv(void *recvbuff, size_t count, ncclDataType_t datatype,
                      int peer, ncclComm_t comm, nccl_stream stream)
{
    (void)recvbuff;
    (void)count;
    size_t elem = 0;
    ncclResult_t r = check_call(comm, datatype, peer, &elem);
    if (r != ncclSuccess)
        return r;
    void *params[] = {&comm->flag_dev};
    return launch(comm->wait_abort, params, stream);
}

static _Thread_local int group_depth;

ncclResult_t ncclGroupStart(void)
{
    group_depth++;
    return ncclSuccess;
}

ncclResult_t ncclGroupEnd(void)
{
    if (group_depth == 0)
        return fail(ncclInvalidUsage,
                    "fake NCCL: ncclGroupEnd without ncclGroupStart");
    group_depth--;
    return ncclSuccess;
}
