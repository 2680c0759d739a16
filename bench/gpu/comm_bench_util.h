/* Checks shared by the communication benchmarks (bench_comm_cuda,
 * bench_comm_multi): a cubert call or an NCCL call that fails ends the
 * program with its message. Header-only; define BENCH_PROGRAM and include
 * cuda_bench_util.h first. */
#ifndef CUBE_COMM_BENCH_UTIL_H
#define CUBE_COMM_BENCH_UTIL_H

#include <stdio.h>
#include <stdlib.h>

#include "backends/cuda/nccl_api.h"
#include "cubert/cubert.h"

static void ok(cube_error *err, const char *what)
{
    if (!err)
        return;
    fprintf(stderr, BENCH_PROGRAM ": %s: %s\n", what, cube_error_message(err));
    exit(1);
}

static void nccl_ok(const nccl_api *n, ncclResult_t r, const char *what)
{
    if (r == ncclSuccess)
        return;
    fprintf(stderr, BENCH_PROGRAM ": %s: %s\n", what, n->ncclGetErrorString(r));
    exit(1);
}

#endif /* CUBE_COMM_BENCH_UTIL_H */
