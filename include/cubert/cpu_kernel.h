/* cubert — the CPU backend's ABI for raw kernels (cubert/kernel.h,
 * cube_kernel_create_raw with CUBE_KERNEL_C_SOURCE or
 * CUBE_KERNEL_SHARED_OBJECT).
 *
 * A raw CPU kernel is an exported C function
 *
 *     void NAME(const cube_cpu_cube *cube);
 *
 * called once per cube of a launch, on the backend's worker threads:
 * cubes run in parallel and in no particular order, each call on one
 * thread. The kernel loops over the cube's units itself (cube->dim says
 * how many); there is no cube_sync(), no shared memory and no cube_trap()
 * in raw code, and no bounds checking (CUBE_LAUNCH_CHECKED changes
 * nothing). The struct and what it points to live for the call only.
 *
 * C source (CUBE_KERNEL_C_SOURCE) is compiled after this header's
 * contents, so it uses cube_cpu_cube without including anything; it is
 * compiled like cube C (the same compiler, its flags and cpu_cflags, then
 * the kernel's options) into a shared object with -Wl,--no-undefined and
 * kept in the disk cache. A shared object (CUBE_KERNEL_SHARED_OBJECT) is
 * built by the caller, for instance with `cc -shared -fPIC`, including
 * this header; it must export NAME and link everything else it needs.
 *
 * Thread safety: a kernel may run on several threads at once (one cube
 * each) and must not keep state between calls that another cube could
 * see, except through its buffers.
 */
#ifndef CUBERT_CPU_KERNEL_H
#define CUBERT_CPU_KERNEL_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* cube_cpu_cube.abi: bumped if the layout below ever changes. */
#define CUBE_CPU_KERNEL_ABI 1

/* One declared parameter, by position. */
typedef struct cube_cpu_param {
    /* A buffer: its first byte (a slice's, for a slice), aligned for its
     * declared element size. A scalar: its bytes (read them as the
     * declared type, e.g. *(const float *)p.data). */
    void *data;
    /* A buffer: its length in bytes. A scalar: its size (1, 2, 4 or 8). */
    uint64_t bytes;
} cube_cpu_param;

typedef struct cube_cpu_cube {
    uint32_t abi;      /* CUBE_CPU_KERNEL_ABI */
    uint32_t id[3];    /* this cube's position along x, y, z */
    uint32_t count[3]; /* the launch's cube count */
    uint32_t dim[3];   /* units per cube: the kernel's cube_dim */
    uint32_t index;    /* id[0] + count[0] * (id[1] + count[1] * id[2]) */
    uint32_t nparams;  /* as declared */
    const cube_cpu_param *params;
} cube_cpu_cube;

typedef void (*cube_cpu_kernel_fn)(const cube_cpu_cube *cube);

#ifdef __cplusplus
}
#endif

#endif /* CUBERT_CPU_KERNEL_H */
