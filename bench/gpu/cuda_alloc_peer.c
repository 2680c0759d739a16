/* cubert's memory manager over CUDA device memory, beside the CUDA driver's
 * own allocators, in one run on one GPU.
 *
 * Measures the host cost of an allocate + release pair:
 *   - cubert: mem_alloc + mem_free on a pool hit, the manager's storage
 *     being cuMemAlloc/cuMemFree (the default preset for the device);
 *   - cuMemAllocAsync + cuMemFreeAsync on a stream (the driver's stream-
 *     ordered pool);
 *   - cuMemAlloc + cuMemFree.
 * for 256 B, 64 KiB and 1 MiB; ns per pair, median over rounds of BATCH
 * pairs. The driver is loaded with dlopen; nothing links against CUDA.
 *
 * Build and run on a machine with an NVIDIA GPU, from the repository root:
 *   cc -O2 -std=c11 -D_GNU_SOURCE -Iinclude -Isrc bench/gpu/cuda_alloc_peer.c \
 *      src/memory/\*.c src/core/error.c src/core/log.c -ldl -lpthread \
 *      -o cuda_alloc_peer && ./cuda_alloc_peer
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cubert/backend/errors.h"
#include "cubert/log.h"
#include "memory/memory_manager.h"

typedef int cu_result;
typedef unsigned long long cu_ptr;
typedef void *cu_ctx;
typedef void *cu_stream;

static struct {
    cu_result (*init)(unsigned);
    cu_result (*device_get)(int *, int);
    cu_result (*total_mem)(size_t *, int);
    cu_result (*ctx_retain)(cu_ctx *, int);
    cu_result (*ctx_set)(cu_ctx);
    cu_result (*stream_create)(cu_stream *, unsigned);
    cu_result (*stream_sync)(cu_stream);
    cu_result (*alloc)(cu_ptr *, size_t);
    cu_result (*free)(cu_ptr);
    cu_result (*alloc_async)(cu_ptr *, size_t, cu_stream);
    cu_result (*free_async)(cu_ptr, cu_stream);
} cu;

#define BATCH 1000
#define ROUNDS 101

static double now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e9 + (double)t.tv_nsec;
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp);
    return v[n / 2];
}

static int load(void)
{
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        printf("no CUDA driver (libcuda.so.1): %s; nothing to measure.\n",
               dlerror());
        return -1;
    }
#define SYM(field, name)                                                       \
    do {                                                                       \
        *(void **)&cu.field = dlsym(lib, name);                                \
        if (!cu.field) {                                                       \
            printf("the CUDA driver lacks %s\n", name);                        \
            return -1;                                                         \
        }                                                                      \
    } while (0)
    SYM(init, "cuInit");
    SYM(device_get, "cuDeviceGet");
    SYM(total_mem, "cuDeviceTotalMem_v2");
    SYM(ctx_retain, "cuDevicePrimaryCtxRetain");
    SYM(ctx_set, "cuCtxSetCurrent");
    SYM(stream_create, "cuStreamCreate");
    SYM(stream_sync, "cuStreamSynchronize");
    SYM(alloc, "cuMemAlloc_v2");
    SYM(free, "cuMemFree_v2");
    SYM(alloc_async, "cuMemAllocAsync");
    SYM(free_async, "cuMemFreeAsync");
#undef SYM
    return 0;
}

static cube_error *dev_alloc(void *self, uint64_t size, uint64_t align,
                             uint64_t *address)
{
    (void)self;
    (void)align; /* cuMemAlloc aligns to at least 256 bytes */
    cu_ptr p = 0;
    cu_result r = cu.alloc(&p, (size_t)size);
    if (r != 0)
        return cube_error_new(CUBE_ERR_OUT_OF_MEMORY,
                              "cuMemAlloc(%llu) failed: %d",
                              (unsigned long long)size, r);
    *address = p;
    return NULL;
}

static void dev_free(void *self, uint64_t address, uint64_t size)
{
    (void)self;
    (void)size;
    cu.free(address);
}

int main(void)
{
    if (load() != 0)
        return 0;
    int dev = 0;
    cu_ctx ctx = NULL;
    cu_stream stream = NULL;
    size_t total = 0;
    if (cu.init(0) || cu.device_get(&dev, 0) || cu.total_mem(&total, dev) ||
        cu.ctx_retain(&ctx, dev) || cu.ctx_set(ctx) ||
        cu.stream_create(&stream, 1 /* non-blocking */)) {
        printf("no usable CUDA device; nothing to measure.\n");
        return 0;
    }
    cube_log_set_level(CUBE_LOG_ERROR);
    mem_device md = {256, total};
    mem_storage_ops ops = {NULL, dev_alloc, dev_free};
    mem_manager *m = NULL;
    cube_error *err = mem_manager_create(&ops, &md, NULL, &m);
    if (err) {
        printf("mem_manager_create: %s\n", cube_error_message(err));
        return 1;
    }
    const uint64_t sizes[3] = {256, 64 << 10, 1 << 20};
    printf("## Allocation hot path on the GPU: allocate + release, host ns "
           "per pair, median of %d rounds of %d pairs\n\n",
           ROUNDS, BATCH);
    printf("| Size | cubert (pool hit) | cuMemAllocAsync + cuMemFreeAsync | "
           "cuMemAlloc + cuMemFree | cubert ÷ async | cubert ÷ sync |\n");
    printf("|---|---:|---:|---:|---:|---:|\n");
    for (int s = 0; s < 3; s++) {
        double t_ours[ROUNDS], t_async[ROUNDS], t_sync[ROUNDS];
        cube_storage st;
        /* Warm every allocator once: the first pair fills the pools. */
        if ((err = mem_alloc(m, sizes[s], &st))) {
            printf("mem_alloc: %s\n", cube_error_message(err));
            return 1;
        }
        mem_free(m, &st);
        cu_ptr p;
        cu.alloc_async(&p, sizes[s], stream);
        cu.free_async(p, stream);
        cu.stream_sync(stream);
        for (int r = 0; r < ROUNDS; r++) {
            double t0 = now_ns();
            for (int i = 0; i < BATCH; i++) {
                cube_error_free(mem_alloc(m, sizes[s], &st));
                mem_free(m, &st);
            }
            t_ours[r] = (now_ns() - t0) / BATCH;
            t0 = now_ns();
            for (int i = 0; i < BATCH; i++) {
                cu.alloc_async(&p, sizes[s], stream);
                cu.free_async(p, stream);
            }
            t_async[r] = (now_ns() - t0) / BATCH;
            cu.stream_sync(stream);
            t0 = now_ns();
            for (int i = 0; i < BATCH / 10; i++) {
                cu.alloc(&p, sizes[s]);
                cu.free(p);
            }
            t_sync[r] = (now_ns() - t0) / (BATCH / 10);
        }
        double o = median(t_ours, ROUNDS), a = median(t_async, ROUNDS),
               y = median(t_sync, ROUNDS);
        printf("| %llu B | %.1f ns | %.1f ns | %.1f ns | %.3f | %.4f |\n",
               (unsigned long long)sizes[s], o, a, y, o / a, o / y);
    }
    printf("\nAim: cubert's pair at most 0.15x of cuMemAllocAsync's.\n");
    mem_manager_destroy(m);
    return 0;
}
