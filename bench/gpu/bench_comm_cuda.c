/* Communication on CUDA beside raw NCCL and driver calls in the same
 * process: all-reduce through a cubert communicator against ncclAllReduce
 * on a communicator of its own (same library, same device, buffers of the
 * same sizes), and cube_copy_peer between two clients of one device against
 * cuMemcpyDtoDAsync. With one GPU the communicators have one rank, which
 * measures what cubert adds to each call (the rendezvous, the failure
 * store, the ordering) over NCCL's own cost; bus bandwidth across GPUs needs
 * several.
 *
 * Usage: bench_comm_cuda [--json FILE]. NCCL comes from
 * $CUBERT_NCCL_LIBRARY, else libnccl.so.2. Exits 77 when there is no GPU
 * or no NCCL. Keep NCCL_NVLS_ENABLE=0 set. */
#define BENCH_PROGRAM "bench_comm_cuda"
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/cuda/nccl_api.h"
#include "cubert/cubert.h"
#include "cuda_bench_util.h"
#include "comm_bench_util.h"

#define ROUNDS 5

/* The median of v[0..n) (sorted in place). */
static double median(double *v, int n)
{
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && v[j - 1] > v[j]; j--) {
            double t = v[j];
            v[j] = v[j - 1];
            v[j - 1] = t;
        }
    return v[n / 2];
}

/* Iterations for `bytes`: enough for about 0.2 s at 1 TB/s, at least 20. */
static int iterations(uint64_t bytes)
{
    uint64_t n = 200000000000ull / (bytes + 20000000ull);
    return n < 20 ? 20 : n > 5000 ? 5000 : (int)n;
}

int main(int argc, char **argv)
{
    const char *json = NULL;
    (void)nvrtc_module; /* shared helpers this program does not need */
    (void)process_threads;
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "--json") == 0 && i + 1 < argc)
            json = argv[++i];
    cube_client *a = NULL, *b = NULL;
    cube_error *err = cube_client_open("cuda:0", NULL, &a);
    if (err) {
        fprintf(stderr, BENCH_PROGRAM ": no GPU: %s\n",
                cube_error_message(err));
        return 77;
    }
    ok(cube_client_open("cuda:0", NULL, &b), "second client");
    cube_comm *comm = NULL;
    err = cube_comm_init_all(&a, 1, NULL, &comm);
    if (err) {
        fprintf(stderr, BENCH_PROGRAM ": %s\n", cube_error_message(err));
        return cube_error_code(err) == CUBE_ERR_UNAVAILABLE ? 77 : 1;
    }
    const nccl_api *n = NULL;
    ok(nccl_api_load(&n), "NCCL");
    /* The raw side: the same primary context cubert uses. */
    CUdevice dev;
    CUcontext ctx;
    CK(cuInit(0));
    CK(cuDeviceGet(&dev, 0));
    CK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CK(cuCtxSetCurrent(ctx));
    CUstream raw;
    CK(cuStreamCreate(&raw, CU_STREAM_NON_BLOCKING));
    ncclUniqueId id;
    nccl_ok(n, n->ncclGetUniqueId(&id), "ncclGetUniqueId");
    ncclComm_t rc;
    nccl_config cfg;
    nccl_config_init(&cfg, 1);
    nccl_ok(n, n->ncclCommInitRankConfig(&rc, 1, id, 0, &cfg),
            "ncclCommInitRankConfig");

    FILE *out = json ? fopen(json, "w") : NULL;
    if (out)
        fprintf(out, "{\n  \"nccl\": %d,\n  \"all_reduce\": [\n", n->version);
    printf("NCCL %d (%s), one rank on %s\n", n->version, n->path, "cuda:0");
    printf("%-10s %12s %12s %12s %12s %8s\n", "all-reduce", "cubert us",
           "NCCL us", "cubert GB/s", "NCCL GB/s", "ratio");
    int first = 1;
    for (uint64_t bytes = 1024; bytes <= (1ull << 30); bytes *= 4) {
        uint64_t count = bytes / 4;
        cube_handle src, dst;
        ok(cube_empty(a, bytes, &src), "empty");
        ok(cube_empty(a, bytes, &dst), "empty");
        CUdeviceptr rs, rd;
        CK(cuMemAlloc(&rs, bytes));
        CK(cuMemAlloc(&rd, bytes));
        CK(cuMemsetD8(rs, 0, bytes));
        int iters = iterations(bytes);
        /* warm-up, then timed */
        for (int w = 0; w < 3; w++) {
            ok(cube_all_reduce(comm, src, dst, count, CUBE_DTYPE_F32,
                               CUBE_REDUCE_SUM),
               "all-reduce");
            nccl_ok(n,
                    n->ncclAllReduce((void *)rs, (void *)rd, count, ncclFloat32,
                                     ncclSum, rc, (nccl_stream)raw),
                    "ncclAllReduce");
        }
        ok(cube_sync(a, NULL, 0), "sync");
        CK(cuStreamSynchronize(raw));
        /* Rounds in which the two sides take turns going first (the one
         * that goes second finds the caches and clocks warmer): the
         * median of each side's rounds. */
        double ours_r[ROUNDS], theirs_r[ROUNDS];
        for (int round = 0; round < ROUNDS; round++)
            for (int turn = 0; turn < 2; turn++) {
                double s0 = now_ns();
                if ((round + turn) % 2 == 0) {
                    for (int i = 0; i < iters; i++)
                        ok(cube_all_reduce(comm, src, dst, count,
                                           CUBE_DTYPE_F32, CUBE_REDUCE_SUM),
                           "all-reduce");
                    ok(cube_sync(a, NULL, 0), "sync");
                    ours_r[round] = (now_ns() - s0) / iters / 1e3;
                } else {
                    for (int i = 0; i < iters; i++)
                        nccl_ok(n,
                                n->ncclAllReduce((void *)rs, (void *)rd, count,
                                                 ncclFloat32, ncclSum, rc,
                                                 (nccl_stream)raw),
                                "ncclAllReduce");
                    CK(cuStreamSynchronize(raw));
                    theirs_r[round] = (now_ns() - s0) / iters / 1e3;
                }
            }
        double t0 = now_ns();
        for (int i = 0; i < iters; i++)
            ok(cube_all_reduce(comm, src, dst, count, CUBE_DTYPE_F32,
                               CUBE_REDUCE_SUM),
               "all-reduce");
        double issued_ours = now_ns();
        ok(cube_sync(a, NULL, 0), "sync");
        double t1 = now_ns();
        for (int i = 0; i < iters; i++)
            nccl_ok(n,
                    n->ncclAllReduce((void *)rs, (void *)rd, count, ncclFloat32,
                                     ncclSum, rc, (nccl_stream)raw),
                    "ncclAllReduce");
        double issued_theirs = now_ns();
        CK(cuStreamSynchronize(raw));
        /* The host's share: the time to issue the calls, before the
         * wait; and cubert's checks alone (a dry run checks a call and
         * drops it before the rendezvous and NCCL). */
        if (bytes <= 65536) {
            ok(cube_dry_run_begin(a), "dry run");
            double d0 = now_ns();
            for (int i = 0; i < iters; i++)
                ok(cube_all_reduce(comm, src, dst, count, CUBE_DTYPE_F32,
                                   CUBE_REDUCE_SUM),
                   "all-reduce");
            double d1 = now_ns();
            ok(cube_dry_run_end(a), "dry run");
            /* NCCL's own call on cubert's stream and buffers: what NCCL
             * costs there, without cubert's layers. */
            void *cs = NULL;
            cube_native_buffer nsrc, ndst;
            ok(cube_native_stream(a, &cs), "native stream");
            ok(cube_native_buffer_get(a, src, &nsrc), "native src");
            ok(cube_native_buffer_get(a, dst, &ndst), "native dst");
            ok(cube_sync(a, NULL, 0), "sync");
            double e0 = now_ns();
            for (int i = 0; i < iters; i++)
                nccl_ok(n,
                        n->ncclAllReduce((void *)(uintptr_t)nsrc.address,
                                         (void *)(uintptr_t)ndst.address, count,
                                         ncclFloat32, ncclSum, rc,
                                         (nccl_stream)cs),
                        "ncclAllReduce");
            double e1 = now_ns();
            CK(cuStreamSynchronize((CUstream)cs));
            printf("  issue only: cubert %.2f us, NCCL %.2f us per call "
                   "(%.2f on cubert's stream and buffers); cubert's checks "
                   "alone %.2f us\n",
                   (issued_ours - t0) / iters / 1e3,
                   (issued_theirs - t1) / iters / 1e3, (e1 - e0) / iters / 1e3,
                   (d1 - d0) / iters / 1e3);
        }
        double ours = median(ours_r, ROUNDS), theirs = median(theirs_r, ROUNDS);
        /* In place (source and destination one buffer), as torch's
         * all_reduce always is: with one rank NCCL then moves nothing. */
        double p0 = now_ns();
        for (int i = 0; i < iters; i++)
            ok(cube_all_reduce(comm, dst, dst, count, CUBE_DTYPE_F32,
                               CUBE_REDUCE_SUM),
               "all-reduce");
        ok(cube_sync(a, NULL, 0), "sync");
        double p1 = now_ns();
        for (int i = 0; i < iters; i++)
            nccl_ok(n,
                    n->ncclAllReduce((void *)rd, (void *)rd, count, ncclFloat32,
                                     ncclSum, rc, (nccl_stream)raw),
                    "ncclAllReduce");
        CK(cuStreamSynchronize(raw));
        double p2 = now_ns();
        double ours_in = (p1 - p0) / iters / 1e3,
               theirs_in = (p2 - p1) / iters / 1e3;
        printf("%-10llu %12.2f %12.2f %12.1f %12.1f %8.3f   in place: "
               "%.2f / %.2f us, %.3f\n",
               (unsigned long long)bytes, ours, theirs, bytes / ours / 1e3,
               bytes / theirs / 1e3, theirs / ours, ours_in, theirs_in,
               theirs_in / ours_in);
        if (out)
            fprintf(out,
                    "%s    {\"bytes\": %llu, \"iterations\": %d, "
                    "\"cubert_us\": %.3f, \"nccl_us\": %.3f, "
                    "\"ratio\": %.4f, \"cubert_in_place_us\": %.3f, "
                    "\"nccl_in_place_us\": %.3f}",
                    first ? "" : ",\n", (unsigned long long)bytes, iters, ours,
                    theirs, theirs / ours, ours_in, theirs_in);
        first = 0;
        ok(cube_handle_release(a, src), "release");
        ok(cube_handle_release(a, dst), "release");
        CK(cuMemFree(rs));
        CK(cuMemFree(rd));
    }
    if (out)
        fprintf(out, "\n  ],\n  \"copy_peer\": [\n");

    printf("\n%-10s %12s %12s %12s %12s %8s\n", "copy", "cubert us",
           "driver us", "cubert GB/s", "driver GB/s", "ratio");
    first = 1;
    for (uint64_t bytes = 1ull << 20; bytes <= (1ull << 30); bytes *= 4) {
        cube_handle src, dst;
        ok(cube_empty(a, bytes, &src), "empty");
        ok(cube_empty(b, bytes, &dst), "empty");
        CUdeviceptr rs, rd;
        CK(cuMemAlloc(&rs, bytes));
        CK(cuMemAlloc(&rd, bytes));
        int iters = iterations(bytes);
        for (int w = 0; w < 3; w++) {
            ok(cube_copy_peer(b, dst, a, src), "copy");
            CK(cuMemcpyDtoDAsync(rd, rs, bytes, raw));
        }
        ok(cube_sync(b, NULL, 0), "sync");
        CK(cuStreamSynchronize(raw));
        double t0 = now_ns();
        for (int i = 0; i < iters; i++)
            ok(cube_copy_peer(b, dst, a, src), "copy");
        ok(cube_sync(b, NULL, 0), "sync");
        double t1 = now_ns();
        for (int i = 0; i < iters; i++)
            CK(cuMemcpyDtoDAsync(rd, rs, bytes, raw));
        CK(cuStreamSynchronize(raw));
        double t2 = now_ns();
        double ours = (t1 - t0) / iters / 1e3, theirs = (t2 - t1) / iters / 1e3;
        /* A copy reads and writes each byte. */
        printf("%-10llu %12.2f %12.2f %12.1f %12.1f %8.3f\n",
               (unsigned long long)bytes, ours, theirs, 2 * bytes / ours / 1e3,
               2 * bytes / theirs / 1e3, theirs / ours);
        if (out)
            fprintf(out,
                    "%s    {\"bytes\": %llu, \"iterations\": %d, "
                    "\"cubert_us\": %.3f, \"driver_us\": %.3f, "
                    "\"ratio\": %.4f}",
                    first ? "" : ",\n", (unsigned long long)bytes, iters, ours,
                    theirs, theirs / ours);
        first = 0;
        ok(cube_handle_release(a, src), "release");
        ok(cube_handle_release(b, dst), "release");
        CK(cuMemFree(rs));
        CK(cuMemFree(rd));
    }
    if (out) {
        fprintf(out, "\n  ]\n}\n");
        fclose(out);
    }
    n->ncclCommDestroy(rc);
    CK(cuStreamDestroy(raw));
    cube_comm_destroy(comm);
    cube_client_close(b);
    cube_client_close(a);
    CK(cuDevicePrimaryCtxRelease(dev));
    return 0;
}
