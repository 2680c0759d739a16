/* Graph replay with the CUDA driver alone, in a process that holds only
 * what it is told to: the figure bench_cuda's graph phase (c) measures,
 * without bench_cuda's other phases and without cubert.
 *
 * The graph: GRAPH nodes of an empty kernel (1 block of 1 thread)
 * captured on a non-blocking stream of the device's primary context
 * (thread-local capture mode) and instantiated with no flags, the kernel
 * compiled by NVRTC to CUBIN for the device's compute capability, as
 * bench_cuda does. Timing as bench_cuda's: per round, REPLAYS cuGraphLaunch
 * calls then one cuStreamSynchronize on the host clock
 * (CLOCK_MONOTONIC), 2 warm-up rounds, the median of ROUNDS rounds, per
 * node. Each result line also gives the host time of the launch calls
 * alone and, from a second set of rounds with an event recorded before and
 * after the replays, the device time between them, both per node.
 *
 * Three measurements, in this order:
 *   plain-before  the kernel without parameters, in a module of its own,
 *                 before anything below is set up;
 *   plain-after   the same graph again, once the options' extras are held
 *                 (with none, a repeat: the run's own noise);
 *   kernel        with --params or --module: a graph of that kernel,
 *                 extras held.
 *
 *   graph_replay_driver [--device N] [--params none|u32|abi]
 *       [--module alone|with-add3] [--streams N] [--events N]
 *       [--pinned MIB] [--devmem MIB] [--threads K] [--prelaunch N]
 *       [--alternate] [--rounds R] [--replays N] [--nodes N]
 *       [--label TEXT]
 *
 * --params u32 gives the kernel bench_cuda's driver parameter (one
 * unsigned int), --params abi cubert's (an int, then the unsigned int);
 * --module with-add3 compiles it in one program with bench_cuda's 4-buffer
 * kernel, as bench_cuda compiles its module. --streams N holds N more
 * non-blocking streams, each with two events (timing disabled) recorded on
 * it, as a cubert stream has; --events N holds N events (default flags),
 * each recorded once; --pinned and --devmem hold that many MiB of pinned
 * host memory (cuMemHostAlloc, portable) and of device memory (cuMemAlloc
 * in 4 MiB pieces), written once; --threads K starts K threads that sleep
 * on a condition variable until the end, as cubert's copy helpers do;
 * --prelaunch N launches the measured kernel N times back to back, then
 * synchronizes, before the later measurements (bench_cuda's launch
 * phases do 1.1M launches before its graph phase), handing the driver one
 * packed parameter buffer (as cubert does) with --prelaunch-extra, an
 * array of parameter pointers otherwise, and on two streams in turn
 * (three rounds each, as bench_cuda alternates its sides) with
 * --prelaunch-two; --alternate replays a
 * second graph of the same shape on a second stream between the rounds,
 * the side that goes first flipping every round, as bench_cuda alternates
 * cubert and the driver.
 *
 * Output: one line per measurement,
 *   result LABEL NAME wall=.. device=.. launch=.. wall_min=.. [partner=..]
 *       threads=N
 * in µs per node (threads: the process's, then). Exits 77 (skipped) when the
 * driver cannot start or has no device, 2 on a bad option, 1 when a call fails
 * (the call is named).
 */
#include <cuda.h>
#include <nvrtc.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../bench_util.h"
#define BENCH_PROGRAM "graph_replay_driver"
#include "cuda_bench_util.h"

#define PIECE_BYTES ((size_t)4 << 20)
#define MAX_ROUNDS 1000
#define MAX_THREADS 256

/* --- failures --- */

/* --- kernels: bench_cuda's sources, and the parameterless one --- */

static const char noop_none_src[] = "extern \"C\" __global__ void noop(void)\n"
                                    "{\n"
                                    "}\n";

/* bench_cuda's driver_noop_src. */
static const char noop_u32_src[] =
    "extern \"C\" __global__ void noop(unsigned int n)\n"
    "{\n"
    "    (void)n;\n"
    "}\n";

/* The parameters of cubert's entry for CUBE_KERNEL(noop,
 * CUBE_SCALAR(uint32_t, n)): the ABI tag, then the scalar. */
static const char noop_abi_src[] =
    "extern \"C\" __global__ void noop(int abi, const unsigned int n)\n"
    "{\n"
    "    (void)abi;\n"
    "    (void)n;\n"
    "}\n";

/* bench_cuda's driver_add3_src. */
static const char add3_src[] =
    "extern \"C\" __global__ void add3(const float *__restrict__ a,\n"
    "                                 const float *__restrict__ b,\n"
    "                                 const float *__restrict__ c,\n"
    "                                 float *__restrict__ out,\n"
    "                                 unsigned int n)\n"
    "{\n"
    "    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
    "    if (i < n)\n"
    "        out[i] = a[i] + b[i] + c[i];\n"
    "}\n";

/* --- options and state --- */

enum { PARAMS_NONE, PARAMS_U32, PARAMS_ABI };

static struct {
    int device;
    int params;    /* PARAMS_* */
    int with_add3; /* --module with-add3 */
    long streams, events, pinned_mib, devmem_mib, threads, prelaunch;
    int prelaunch_extra; /* prelaunches hand one packed parameter buffer */
    int prelaunch_two;   /* and take turns on two streams, three rounds */
    int alternate;
    int rounds, replays, nodes;
    const char *label;
} O = {0, PARAMS_NONE, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 30, 20, 100, "run"};

static struct {
    CUdevice dev;
    CUcontext ctx;
    CUstream stream, partner_stream;
    int cc_major, cc_minor;
    /* the kernels' argument values (all zero) and lists */
    int abi;
    unsigned int zero;
    void *u32_params[1], *abi_params[2];
} S;

/* A captured graph and what launching it needs. */
typedef struct graph {
    CUgraph graph;
    CUgraphExec exec;
    CUstream stream;
} graph;

static void capture(graph *g, CUfunction f, void **params, CUstream stream)
{
    g->stream = stream;
    CK(cuStreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
    for (int i = 0; i < O.nodes; i++)
        CK(cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, stream, params, NULL));
    CK(cuStreamEndCapture(stream, &g->graph));
    CK(cuGraphInstantiate(&g->exec, g->graph, 0));
}

static void graph_destroy(graph *g)
{
    CK(cuGraphExecDestroy(g->exec));
    CK(cuGraphDestroy(g->graph));
}

/* --- helper threads --- */

static struct {
    pthread_mutex_t lock;
    pthread_cond_t wake;
    int quit;
    pthread_t ids[MAX_THREADS];
    long count;
} H = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, {0}, 0};

static void *helper_main(void *arg)
{
    (void)arg;
    pthread_mutex_lock(&H.lock);
    while (!H.quit)
        pthread_cond_wait(&H.wake, &H.lock);
    pthread_mutex_unlock(&H.lock);
    return NULL;
}

static void helpers_start(long n)
{
    for (long i = 0; i < n; i++) {
        if (pthread_create(&H.ids[i], NULL, helper_main, NULL) != 0)
            die("pthread_create failed");
        H.count++;
    }
}

static void helpers_stop(void)
{
    pthread_mutex_lock(&H.lock);
    H.quit = 1;
    pthread_cond_broadcast(&H.wake);
    pthread_mutex_unlock(&H.lock);
    for (long i = 0; i < H.count; i++)
        pthread_join(H.ids[i], NULL);
    H.count = 0;
}

/* --- measuring --- */

/* REPLAYS launches of g then a sync; host nanoseconds of the whole and,
 * in *launch_ns, of the launch calls. */
static double replay_round(const graph *g, double *launch_ns)
{
    double t0 = now_ns();
    for (int i = 0; i < O.replays; i++)
        CK(cuGraphLaunch(g->exec, g->stream));
    double t1 = now_ns();
    CK(cuStreamSynchronize(g->stream));
    double t2 = now_ns();
    if (launch_ns)
        *launch_ns = t1 - t0;
    return t2 - t0;
}

/* The same with an event before and after the launches: device
 * nanoseconds between them. */
static double replay_round_events(const graph *g, CUevent e0, CUevent e1)
{
    CK(cuEventRecord(e0, g->stream));
    for (int i = 0; i < O.replays; i++)
        CK(cuGraphLaunch(g->exec, g->stream));
    CK(cuEventRecord(e1, g->stream));
    CK(cuStreamSynchronize(g->stream));
    float ms = 0;
    CK(cuEventElapsedTime(&ms, e0, e1));
    return (double)ms * 1e6;
}

/* Times g (and the partner between rounds, where given) and prints one
 * result line. */
static void measure(const char *name, const graph *g, const graph *partner)
{
    static double wall[MAX_ROUNDS], launch[MAX_ROUNDS], dev[MAX_ROUNDS],
        other[MAX_ROUNDS];
    const int warm = 2;
    for (int r = -warm; r < O.rounds; r++) {
        for (int turn = 0; turn < 2; turn++) {
            int mine = (turn + r + warm) % 2;
            if (mine) {
                double l = 0, w = replay_round(g, &l);
                if (r >= 0) {
                    wall[r] = w;
                    launch[r] = l;
                }
            } else if (partner) {
                double w = replay_round(partner, NULL);
                if (r >= 0)
                    other[r] = w;
            }
        }
    }
    CUevent e0, e1;
    CK(cuEventCreate(&e0, CU_EVENT_DEFAULT));
    CK(cuEventCreate(&e1, CU_EVENT_DEFAULT));
    for (int r = -warm; r < O.rounds; r++) {
        for (int turn = 0; turn < 2; turn++) {
            int mine = (turn + r + warm) % 2;
            if (mine) {
                double d = replay_round_events(g, e0, e1);
                if (r >= 0)
                    dev[r] = d;
            } else if (partner) {
                replay_round(partner, NULL);
            }
        }
    }
    CK(cuEventDestroy(e0));
    CK(cuEventDestroy(e1));

    double per = (double)O.replays * O.nodes * 1e3; /* ns -> µs per node */
    double w = median(wall, (size_t)O.rounds) / per;
    double wmin = wall[0] / per; /* sorted by median() */
    double l = median(launch, (size_t)O.rounds) / per;
    double d = median(dev, (size_t)O.rounds) / per;
    printf("result %s %s wall=%.4f device=%.4f launch=%.4f wall_min=%.4f",
           O.label, name, w, d, l, wmin);
    if (partner)
        printf(" partner=%.4f", median(other, (size_t)O.rounds) / per);
    printf(" threads=%d\n", process_threads());
    fflush(stdout);
}

/* --- options --- */

static void usage(FILE *f)
{
    fprintf(f,
            "usage: graph_replay_driver [--device N] [--params none|u32|abi]\n"
            "         [--module alone|with-add3] [--streams N] [--events N]\n"
            "         [--pinned MIB] [--devmem MIB] [--threads K]\n"
            "         [--prelaunch N] [--prelaunch-extra] [--prelaunch-two]\n"
            "         [--alternate] [--rounds R]\n"
            "         [--replays N] [--nodes N] [--label TEXT]\n"
            "  Replays a graph of empty kernels with the CUDA driver alone\n"
            "  and prints µs per node: plain-before (nothing held),\n"
            "  plain-after (the options' extras held) and, with --params or\n"
            "  --module, kernel (that kernel's graph). Exits 77 without a\n"
            "  CUDA device.\n");
}

/* A whole number in [lo, hi] from s, or exit 2. */
static long number(const char *s, long lo, long hi)
{
    char *end = NULL;
    long v = strtol(s, &end, 10);
    if (!end || end == s || *end || v < lo || v > hi) {
        fprintf(stderr,
                "graph_replay_driver: '%s' is not a number in [%ld, %ld]\n", s,
                lo, hi);
        usage(stderr);
        exit(2);
    }
    return v;
}

static void parse(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            usage(stdout);
            exit(0);
        } else if (strcmp(a, "--alternate") == 0) {
            O.alternate = 1;
            continue;
        } else if (strcmp(a, "--prelaunch-extra") == 0) {
            O.prelaunch_extra = 1;
            continue;
        } else if (strcmp(a, "--prelaunch-two") == 0) {
            O.prelaunch_two = 1;
            continue;
        }
        if (!v) {
            usage(stderr);
            exit(2);
        }
        i++;
        if (strcmp(a, "--device") == 0) {
            O.device = (int)number(v, 0, 1024);
        } else if (strcmp(a, "--params") == 0) {
            if (strcmp(v, "none") == 0)
                O.params = PARAMS_NONE;
            else if (strcmp(v, "u32") == 0)
                O.params = PARAMS_U32;
            else if (strcmp(v, "abi") == 0)
                O.params = PARAMS_ABI;
            else {
                usage(stderr);
                exit(2);
            }
        } else if (strcmp(a, "--module") == 0) {
            if (strcmp(v, "alone") == 0)
                O.with_add3 = 0;
            else if (strcmp(v, "with-add3") == 0)
                O.with_add3 = 1;
            else {
                usage(stderr);
                exit(2);
            }
        } else if (strcmp(a, "--streams") == 0) {
            O.streams = number(v, 0, 1024);
        } else if (strcmp(a, "--events") == 0) {
            O.events = number(v, 0, 1000000);
        } else if (strcmp(a, "--pinned") == 0) {
            O.pinned_mib = number(v, 0, 1 << 20);
        } else if (strcmp(a, "--devmem") == 0) {
            O.devmem_mib = number(v, 0, 1 << 20);
        } else if (strcmp(a, "--threads") == 0) {
            O.threads = number(v, 0, MAX_THREADS);
        } else if (strcmp(a, "--prelaunch") == 0) {
            O.prelaunch = number(v, 0, 100000000);
        } else if (strcmp(a, "--rounds") == 0) {
            O.rounds = (int)number(v, 1, MAX_ROUNDS);
        } else if (strcmp(a, "--replays") == 0) {
            O.replays = (int)number(v, 1, 100000);
        } else if (strcmp(a, "--nodes") == 0) {
            O.nodes = (int)number(v, 1, 100000);
        } else if (strcmp(a, "--label") == 0) {
            O.label = v;
        } else {
            usage(stderr);
            exit(2);
        }
    }
}

/* --- main --- */

int main(int argc, char **argv)
{
    parse(argc, argv);

    CUresult init = cuInit(0);
    if (init != CUDA_SUCCESS) {
        const char *text = NULL;
        cuGetErrorString(init, &text);
        printf("graph_replay_driver: the CUDA driver cannot start: %s "
               "(CUresult %d); skipped\n",
               text ? text : "unknown error", (int)init);
        return 77;
    }
    int count = 0;
    CK(cuDeviceGetCount(&count));
    if (O.device >= count) {
        printf("graph_replay_driver: there is no CUDA device %d (%d found); "
               "skipped\n",
               O.device, count);
        return 77;
    }
    CK(cuDeviceGet(&S.dev, O.device));
    CK(cuDevicePrimaryCtxRetain(&S.ctx, S.dev));
    CK(cuCtxSetCurrent(S.ctx));
    CK(cuStreamCreate(&S.stream, CU_STREAM_NON_BLOCKING));
    CK(cuDeviceGetAttribute(
        &S.cc_major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, S.dev));
    CK(cuDeviceGetAttribute(
        &S.cc_minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, S.dev));
    char gpu[256];
    CK(cuDeviceGetName(gpu, (int)sizeof gpu, S.dev));
    int driver_version = 0, nv_major = 0, nv_minor = 0;
    CK(cuDriverGetVersion(&driver_version));
    NV(nvrtcVersion(&nv_major, &nv_minor));
    char cpu[256];
    bench_cpu_model(cpu, sizeof cpu);
    const char *loading = getenv("CUDA_MODULE_LOADING");
    static const char *param_names[] = {"none", "u32", "abi"};
    printf("# graph replay, CUDA driver alone: %s (sm_%d%d), driver API "
           "%d.%d, NVRTC %d.%d; %ld CPUs, %s\n",
           gpu, S.cc_major, S.cc_minor, driver_version / 1000,
           driver_version % 1000 / 10, nv_major, nv_minor,
           sysconf(_SC_NPROCESSORS_ONLN), cpu);
    printf("# label %s: %d nodes, %d replays + sync per round, median of %d "
           "rounds; params %s, module %s, streams +%ld, events +%ld, "
           "pinned %ld MiB, devmem %ld MiB, threads +%ld, prelaunch %ld, "
           "alternate %s, CUDA_MODULE_LOADING=%s\n",
           O.label, O.nodes, O.replays, O.rounds, param_names[O.params],
           O.with_add3 ? "with-add3" : "alone", O.streams, O.events,
           O.pinned_mib, O.devmem_mib, O.threads, O.prelaunch,
           O.alternate ? "yes" : "no", loading ? loading : "(unset)");
    fflush(stdout);

    /* plain-before: nothing else held */
    CUmodule plain_mod = nvrtc_module(noop_none_src, S.cc_major, S.cc_minor);
    CUfunction plain_f;
    CK(cuModuleGetFunction(&plain_f, plain_mod, "noop"));
    graph plain;
    capture(&plain, plain_f, NULL, S.stream);
    measure("plain-before", &plain, NULL);

    /* the extras */
    helpers_start(O.threads);
    CUstream *streams = xmalloc((size_t)O.streams * sizeof *streams);
    CUevent *stream_events = xmalloc((size_t)O.streams * 2 * sizeof(CUevent));
    for (long i = 0; i < O.streams; i++) {
        CK(cuStreamCreate(&streams[i], CU_STREAM_NON_BLOCKING));
        for (int k = 0; k < 2; k++) {
            CUevent *e = &stream_events[2 * i + k];
            CK(cuEventCreate(e, CU_EVENT_DISABLE_TIMING));
            CK(cuEventRecord(*e, streams[i]));
        }
    }
    CUevent *events = xmalloc((size_t)O.events * sizeof *events);
    for (long i = 0; i < O.events; i++) {
        CK(cuEventCreate(&events[i], CU_EVENT_DEFAULT));
        CK(cuEventRecord(events[i], S.stream));
    }
    void *pinned = NULL;
    if (O.pinned_mib) {
        size_t bytes = (size_t)O.pinned_mib << 20;
        CK(cuMemHostAlloc(&pinned, bytes, CU_MEMHOSTALLOC_PORTABLE));
        memset(pinned, 0x5a, bytes);
    }
    size_t pieces = ((size_t)O.devmem_mib << 20) / PIECE_BYTES +
                    (((size_t)O.devmem_mib << 20) % PIECE_BYTES != 0);
    CUdeviceptr *dmem = xmalloc(pieces * sizeof *dmem);
    for (size_t i = 0; i < pieces; i++) {
        CK(cuMemAlloc(&dmem[i], PIECE_BYTES));
        CK(cuMemsetD8Async(dmem[i], 0x5a, PIECE_BYTES, S.stream));
    }

    /* the measured kernel */
    S.zero = 0;
    S.abi = 0;
    S.u32_params[0] = &S.zero;
    S.abi_params[0] = &S.abi;
    S.abi_params[1] = &S.zero;
    static const char *const srcs[] = {noop_none_src, noop_u32_src,
                                       noop_abi_src};
    void **params = O.params == PARAMS_U32   ? S.u32_params
                    : O.params == PARAMS_ABI ? S.abi_params
                                             : NULL;
    int own_kernel = O.params != PARAMS_NONE || O.with_add3;
    CUmodule kmod = NULL;
    CUfunction kf = plain_f;
    graph kernel;
    if (own_kernel) {
        size_t cap = strlen(srcs[O.params]) + sizeof add3_src + 2;
        char *src = xmalloc(cap);
        snprintf(src, cap, "%s%s%s", srcs[O.params], O.with_add3 ? "\n" : "",
                 O.with_add3 ? add3_src : "");
        kmod = nvrtc_module(src, S.cc_major, S.cc_minor);
        free(src);
        CK(cuModuleGetFunction(&kf, kmod, "noop"));
        capture(&kernel, kf, params, S.stream);
    }
    /* As cubert launches: one packed buffer through `extra`. */
    _Alignas(16) unsigned char packed[16] = {0};
    size_t packed_size = O.params == PARAMS_ABI   ? 8
                         : O.params == PARAMS_U32 ? 4
                                                  : 0;
    void *extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, packed,
                     CU_LAUNCH_PARAM_BUFFER_SIZE, &packed_size,
                     CU_LAUNCH_PARAM_END};
    CUstream second = NULL;
    if (O.prelaunch_two)
        CK(cuStreamCreate(&second, CU_STREAM_NON_BLOCKING));
    for (int round = 0; round < (O.prelaunch_two ? 6 : 1); round++) {
        CUstream on = round % 2 ? second : S.stream;
        for (long i = 0; i < O.prelaunch; i++)
            CK(cuLaunchKernel(kf, 1, 1, 1, 1, 1, 1, 0, on,
                              O.prelaunch_extra ? NULL : params,
                              O.prelaunch_extra ? extra : NULL));
        CK(cuStreamSynchronize(on));
    }
    CK(cuStreamSynchronize(S.stream));

    graph partner;
    if (O.alternate) {
        CK(cuStreamCreate(&S.partner_stream, CU_STREAM_NON_BLOCKING));
        capture(&partner, plain_f, NULL, S.partner_stream);
    }

    measure("plain-after", &plain, O.alternate ? &partner : NULL);
    if (own_kernel) {
        char name[64];
        snprintf(name, sizeof name, "kernel-%s-%s", param_names[O.params],
                 O.with_add3 ? "with-add3" : "alone");
        measure(name, &kernel, O.alternate ? &partner : NULL);
    }

    /* teardown */
    if (second)
        CK(cuStreamDestroy(second));
    if (O.alternate) {
        graph_destroy(&partner);
        CK(cuStreamDestroy(S.partner_stream));
    }
    if (own_kernel) {
        graph_destroy(&kernel);
        CK(cuModuleUnload(kmod));
    }
    CK(cuStreamSynchronize(S.stream));
    for (size_t i = 0; i < pieces; i++)
        CK(cuMemFree(dmem[i]));
    free(dmem);
    if (pinned)
        CK(cuMemFreeHost(pinned));
    for (long i = 0; i < O.events; i++)
        CK(cuEventDestroy(events[i]));
    free(events);
    for (long i = 0; i < O.streams; i++) {
        CK(cuEventDestroy(stream_events[2 * i]));
        CK(cuEventDestroy(stream_events[2 * i + 1]));
        CK(cuStreamDestroy(streams[i]));
    }
    free(stream_events);
    free(streams);
    helpers_stop();
    graph_destroy(&plain);
    CK(cuModuleUnload(plain_mod));
    CK(cuStreamDestroy(S.stream));
    CK(cuDevicePrimaryCtxRelease(S.dev));
    return 0;
}
