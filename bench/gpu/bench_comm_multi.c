/* Communication across GPUs beside raw NCCL and driver calls in the same
 * process: all-reduce over every GPU (one cubert communicator per device,
 * cube_comm_init_all, driven by one thread in a group) against NCCL
 * communicators of its own on the same devices (ncclCommInitRankConfig in
 * a group, ncclAllReduce in a group), in place and out of place, reported
 * as bus bandwidth (2 (n-1)/n bytes per rank); and cube_copy_peer from
 * GPU 0 to GPU 1 and back against cuMemcpyPeerAsync (peer access on for
 * both). Every all-reduce result is checked once per size.
 *
 * Usage: bench_comm_multi [--json FILE]. NCCL from $CUBERT_NCCL_LIBRARY,
 * else libnccl.so.2. Exits 77 with fewer than two GPUs or no NCCL. Keep
 * NCCL_NVLS_ENABLE=0 set. */
#define BENCH_PROGRAM "bench_comm_multi"
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/cuda/nccl_api.h"
#include "cubert/cubert.h"
#include "cuda_bench_util.h"
#include "comm_bench_util.h"

#define MAX_GPUS 8

/* Iterations for `bytes`: about 0.2 s at 200 GB/s, 10 to 2000. */
static int iterations(uint64_t bytes)
{
    uint64_t n = 40000000000ull / (bytes + 4000000ull);
    return n < 10 ? 10 : n > 2000 ? 2000 : (int)n;
}

typedef struct {
    uint32_t n;
    cube_client *c[MAX_GPUS];
    cube_comm *comm[MAX_GPUS];
    const nccl_api *nccl;
    CUcontext ctx[MAX_GPUS];
    CUstream raw[MAX_GPUS];
    ncclComm_t rc[MAX_GPUS];
} bench;

static void ours_all_reduce(bench *b, const cube_handle *src,
                            const cube_handle *dst, uint64_t count)
{
    ok(cube_group_begin(), "group");
    for (uint32_t r = 0; r < b->n; r++)
        ok(cube_all_reduce(b->comm[r], src[r], dst[r], count, CUBE_DTYPE_F32,
                           CUBE_REDUCE_SUM),
           "all-reduce");
    ok(cube_group_end(), "group end");
}

static void theirs_all_reduce(bench *b, CUdeviceptr *src, CUdeviceptr *dst,
                              uint64_t count)
{
    nccl_ok(b->nccl, b->nccl->ncclGroupStart(), "ncclGroupStart");
    for (uint32_t r = 0; r < b->n; r++)
        nccl_ok(b->nccl,
                b->nccl->ncclAllReduce((void *)src[r], (void *)dst[r], count,
                                       ncclFloat32, ncclSum, b->rc[r],
                                       (nccl_stream)b->raw[r]),
                "ncclAllReduce");
    nccl_ok(b->nccl, b->nccl->ncclGroupEnd(), "ncclGroupEnd");
}

static void ours_wait(bench *b)
{
    for (uint32_t r = 0; r < b->n; r++)
        ok(cube_sync(b->c[r], NULL, 0), "sync");
}

static void theirs_wait(bench *b)
{
    for (uint32_t r = 0; r < b->n; r++) {
        CK(cuCtxSetCurrent(b->ctx[r]));
        CK(cuStreamSynchronize(b->raw[r]));
    }
}

/* Rank r's source holds r + 1 everywhere: the sum is n (n + 1) / 2. */
static void check_sum(bench *b, const cube_handle *dst, uint64_t count)
{
    float want = (float)(b->n * (b->n + 1) / 2);
    uint64_t probe = count < 4096 ? count : 4096;
    float *host = xmalloc(probe * sizeof *host);
    for (uint32_t r = 0; r < b->n; r++) {
        cube_handle head;
        ok(cube_handle_slice(b->c[r], dst[r], 0, probe * 4, &head), "slice");
        cube_copy_desc d = cube_copy_desc_contiguous(head, probe * 4, 4);
        void *dsts[1] = {host};
        uint64_t sizes[1] = {probe * 4};
        ok(cube_read(b->c[r], &d, dsts, sizes, 1), "read");
        ok(cube_handle_release(b->c[r], head), "release");
        for (uint64_t i = 0; i < probe; i++)
            if (host[i] != want) {
                fprintf(stderr,
                        BENCH_PROGRAM ": rank %u element %llu is %g, not %g\n",
                        r, (unsigned long long)i, host[i], want);
                exit(1);
            }
    }
    free(host);
}

static void fill(bench *b, const cube_handle *src, uint64_t count)
{
    float *host = xmalloc(count * sizeof *host);
    for (uint32_t r = 0; r < b->n; r++) {
        for (uint64_t i = 0; i < count; i++)
            host[i] = (float)(r + 1);
        cube_copy_desc d = cube_copy_desc_contiguous(src[r], count * 4, 4);
        const void *srcs[1] = {host};
        uint64_t sizes[1] = {count * 4};
        ok(cube_write(b->c[r], &d, srcs, sizes, 1), "write");
    }
    free(host);
}

static void all_reduce_table(bench *b, FILE *out)
{
    double factor = 2.0 * (b->n - 1) / b->n;
    printf("all-reduce over %u GPUs, bus bandwidth (GB/s) and time per "
           "call (us)\n",
           b->n);
    printf("%-11s %10s %10s %9s %9s %7s   %s\n", "bytes", "cubert us",
           "NCCL us", "cubert", "NCCL", "ratio", "in place: cubert/NCCL us");
    int first = 1;
    for (uint64_t bytes = 1024; bytes <= (1ull << 30); bytes *= 4) {
        uint64_t count = bytes / 4;
        cube_handle src[MAX_GPUS], dst[MAX_GPUS];
        CUdeviceptr rs[MAX_GPUS], rd[MAX_GPUS];
        for (uint32_t r = 0; r < b->n; r++) {
            ok(cube_empty(b->c[r], bytes, &src[r]), "empty");
            ok(cube_empty(b->c[r], bytes, &dst[r]), "empty");
            CK(cuCtxSetCurrent(b->ctx[r]));
            CK(cuMemAlloc(&rs[r], bytes));
            CK(cuMemAlloc(&rd[r], bytes));
            CK(cuMemsetD8(rs[r], 0, bytes));
        }
        fill(b, src, count);
        int iters = iterations(bytes);
        for (int w = 0; w < 3; w++) {
            ours_all_reduce(b, src, dst, count);
            theirs_all_reduce(b, rs, rd, count);
        }
        ours_wait(b);
        theirs_wait(b);
        check_sum(b, dst, count);
        double t0 = now_ns();
        for (int i = 0; i < iters; i++)
            ours_all_reduce(b, src, dst, count);
        ours_wait(b);
        double t1 = now_ns();
        for (int i = 0; i < iters; i++)
            theirs_all_reduce(b, rs, rd, count);
        theirs_wait(b);
        double t2 = now_ns();
        for (int i = 0; i < iters; i++)
            ours_all_reduce(b, dst, dst, count);
        ours_wait(b);
        double t3 = now_ns();
        for (int i = 0; i < iters; i++)
            theirs_all_reduce(b, rd, rd, count);
        theirs_wait(b);
        double t4 = now_ns();
        double ours = (t1 - t0) / iters / 1e3, theirs = (t2 - t1) / iters / 1e3;
        double ours_in = (t3 - t2) / iters / 1e3,
               theirs_in = (t4 - t3) / iters / 1e3;
        printf("%-11llu %10.2f %10.2f %9.1f %9.1f %7.3f   %.2f / %.2f (%.3f)\n",
               (unsigned long long)bytes, ours, theirs,
               factor * bytes / ours / 1e3, factor * bytes / theirs / 1e3,
               theirs / ours, ours_in, theirs_in, theirs_in / ours_in);
        if (out)
            fprintf(out,
                    "%s    {\"bytes\": %llu, \"iterations\": %d, "
                    "\"cubert_us\": %.3f, \"nccl_us\": %.3f, "
                    "\"cubert_busbw\": %.2f, \"nccl_busbw\": %.2f, "
                    "\"ratio\": %.4f, \"cubert_in_place_us\": %.3f, "
                    "\"nccl_in_place_us\": %.3f}",
                    first ? "" : ",\n", (unsigned long long)bytes, iters, ours,
                    theirs, factor * bytes / ours / 1e3,
                    factor * bytes / theirs / 1e3, theirs / ours, ours_in,
                    theirs_in);
        first = 0;
        for (uint32_t r = 0; r < b->n; r++) {
            ok(cube_handle_release(b->c[r], src[r]), "release");
            ok(cube_handle_release(b->c[r], dst[r]), "release");
            CK(cuCtxSetCurrent(b->ctx[r]));
            CK(cuMemFree(rs[r]));
            CK(cuMemFree(rd[r]));
        }
    }
}

/* cube_copy_peer from GPU `from` to GPU `to` against cuMemcpyPeerAsync on
 * the destination's raw stream. */
static void peer_table(bench *b, uint32_t from, uint32_t to, FILE *out,
                       int *first)
{
    printf("\ncopy GPU %u -> GPU %u (GB/s: bytes moved per second)\n", from,
           to);
    printf("%-11s %10s %10s %9s %9s %7s\n", "bytes", "cubert us", "driver us",
           "cubert", "driver", "ratio");
    for (uint64_t bytes = 1ull << 20; bytes <= (1ull << 30); bytes *= 4) {
        cube_handle src, dst;
        ok(cube_empty(b->c[from], bytes, &src), "empty");
        ok(cube_empty(b->c[to], bytes, &dst), "empty");
        CUdeviceptr rs, rd;
        CK(cuCtxSetCurrent(b->ctx[from]));
        CK(cuMemAlloc(&rs, bytes));
        CK(cuCtxSetCurrent(b->ctx[to]));
        CK(cuMemAlloc(&rd, bytes));
        int iters = iterations(bytes);
        for (int w = 0; w < 3; w++) {
            ok(cube_copy_peer(b->c[to], dst, b->c[from], src), "copy");
            CK(cuMemcpyPeerAsync(rd, b->ctx[to], rs, b->ctx[from], bytes,
                                 b->raw[to]));
        }
        ok(cube_sync(b->c[to], NULL, 0), "sync");
        CK(cuStreamSynchronize(b->raw[to]));
        double t0 = now_ns();
        for (int i = 0; i < iters; i++)
            ok(cube_copy_peer(b->c[to], dst, b->c[from], src), "copy");
        ok(cube_sync(b->c[to], NULL, 0), "sync");
        double t1 = now_ns();
        for (int i = 0; i < iters; i++)
            CK(cuMemcpyPeerAsync(rd, b->ctx[to], rs, b->ctx[from], bytes,
                                 b->raw[to]));
        CK(cuStreamSynchronize(b->raw[to]));
        double t2 = now_ns();
        double ours = (t1 - t0) / iters / 1e3, theirs = (t2 - t1) / iters / 1e3;
        printf("%-11llu %10.2f %10.2f %9.1f %9.1f %7.3f\n",
               (unsigned long long)bytes, ours, theirs, bytes / ours / 1e3,
               bytes / theirs / 1e3, theirs / ours);
        if (out)
            fprintf(out,
                    "%s    {\"from\": %u, \"to\": %u, \"bytes\": %llu, "
                    "\"cubert_us\": %.3f, \"driver_us\": %.3f, "
                    "\"ratio\": %.4f}",
                    *first ? "" : ",\n", from, to, (unsigned long long)bytes,
                    ours, theirs, theirs / ours);
        *first = 0;
        ok(cube_handle_release(b->c[from], src), "release");
        ok(cube_handle_release(b->c[to], dst), "release");
        CK(cuCtxSetCurrent(b->ctx[from]));
        CK(cuMemFree(rs));
        CK(cuCtxSetCurrent(b->ctx[to]));
        CK(cuMemFree(rd));
    }
}

int main(int argc, char **argv)
{
    const char *json = NULL;
    (void)nvrtc_module; /* shared helpers this program does not need */
    (void)process_threads;
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "--json") == 0 && i + 1 < argc)
            json = argv[++i];
    static bench b;
    cube_error *err = cube_device_count("cuda", &b.n);
    if (err || b.n < 2) {
        fprintf(stderr, BENCH_PROGRAM ": needs two GPUs (%s)\n",
                err ? cube_error_message(err) : "fewer found");
        cube_error_free(err);
        return 77;
    }
    if (b.n > MAX_GPUS)
        b.n = MAX_GPUS;
    for (uint32_t r = 0; r < b.n; r++) {
        char name[32];
        snprintf(name, sizeof name, "cuda:%u", r);
        ok(cube_client_open(name, NULL, &b.c[r]), name);
    }
    err = cube_comm_init_all(b.c, b.n, NULL, b.comm);
    if (err) {
        fprintf(stderr, BENCH_PROGRAM ": %s\n", cube_error_message(err));
        return cube_error_code(err) == CUBE_ERR_UNAVAILABLE ? 77 : 1;
    }
    ok(nccl_api_load(&b.nccl), "NCCL");
    /* The raw side: the primary contexts cubert uses too. */
    CK(cuInit(0));
    for (uint32_t r = 0; r < b.n; r++) {
        CUdevice dev;
        CK(cuDeviceGet(&dev, (int)r));
        CK(cuDevicePrimaryCtxRetain(&b.ctx[r], dev));
        CK(cuCtxSetCurrent(b.ctx[r]));
        CK(cuStreamCreate(&b.raw[r], CU_STREAM_NON_BLOCKING));
    }
    /* Peer access for the driver's copies, as cubert turns it on for its
     * own; already on is fine. */
    for (uint32_t r = 0; r < b.n; r++)
        for (uint32_t p = 0; p < b.n; p++)
            if (p != r) {
                CK(cuCtxSetCurrent(b.ctx[r]));
                CUresult pr = cuCtxEnablePeerAccess(b.ctx[p], 0);
                if (pr != CUDA_SUCCESS &&
                    pr != CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED)
                    CK(pr);
            }
    ncclUniqueId id;
    nccl_ok(b.nccl, b.nccl->ncclGetUniqueId(&id), "ncclGetUniqueId");
    nccl_config cfg;
    nccl_config_init(&cfg, 1);
    nccl_ok(b.nccl, b.nccl->ncclGroupStart(), "ncclGroupStart");
    for (uint32_t r = 0; r < b.n; r++) {
        CK(cuCtxSetCurrent(b.ctx[r]));
        nccl_ok(b.nccl,
                b.nccl->ncclCommInitRankConfig(&b.rc[r], (int)b.n, id, (int)r,
                                               &cfg),
                "ncclCommInitRankConfig");
    }
    nccl_ok(b.nccl, b.nccl->ncclGroupEnd(), "ncclGroupEnd");

    FILE *out = json ? fopen(json, "w") : NULL;
    if (out)
        fprintf(out,
                "{\n  \"nccl\": %d,\n  \"gpus\": %u,\n  \"all_reduce\": [\n",
                b.nccl->version, b.n);
    printf("NCCL %d (%s), %u GPUs\n", b.nccl->version, b.nccl->path, b.n);
    all_reduce_table(&b, out);
    if (out)
        fprintf(out, "\n  ],\n  \"copy_peer\": [\n");
    int first = 1;
    peer_table(&b, 0, 1, out, &first);
    peer_table(&b, 1, 0, out, &first);
    if (out) {
        fprintf(out, "\n  ]\n}\n");
        fclose(out);
    }
    for (uint32_t r = 0; r < b.n; r++) {
        b.nccl->ncclCommDestroy(b.rc[r]);
        CK(cuCtxSetCurrent(b.ctx[r]));
        CK(cuStreamDestroy(b.raw[r]));
        cube_comm_destroy(b.comm[r]);
    }
    for (uint32_t r = 0; r < b.n; r++) {
        cube_client_close(b.c[r]);
        CUdevice dev;
        CK(cuDeviceGet(&dev, (int)r));
        CK(cuDevicePrimaryCtxRelease(dev));
    }
    return 0;
}
