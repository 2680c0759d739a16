/* cube C — the CUDA prelude, compiled by NVRTC as CUDA C++ together with
 * the common prelude and the kernel's source.
 *
 * Entry per kernel `name`: extern "C" __global__ cube__kernel_name taking
 * its arguments by value, as a hand-written CUDA kernel would: a leading
 * int (the ABI tag, so every parameter view can start with a comma), then
 * per buffer its device pointer and its length in elements, per scalar its
 * value; shared arrays are not parameters. Shared memory is dynamic (the
 * runtime passes cube__shared_name bytes), so a kernel may use all of the
 * shared memory a block can opt in to, not only the 48 KiB static limit.
 * cube__sig_name, cube__nparams_name and cube__shared_name are device
 * globals the runtime reads back once after loading.
 */
#if defined(__CUDACC_RTC__)
typedef signed char int8_t;
typedef unsigned char uint8_t;
typedef short int16_t;
typedef unsigned short uint16_t;
typedef int int32_t;
typedef unsigned int uint32_t;
typedef long long int64_t;
typedef unsigned long long uint64_t;
#else
#include <stdint.h>
#endif

#define CUBE__RESTRICT __restrict__
#define CUBE__TYPEOF(x) decltype(x)
#define CUBE__UNUSED __attribute__((unused))
#define CUBE__INLINE __device__ __forceinline__
#define CUBE_DEVICE __device__ static inline
#define CUBE__COLD __device__ static __noinline__
#define CUBE__OOB_INC(p) atomicAdd((unsigned long long *)(p), 1ull)
/* A validating module's record: one per module, zeroed and read back by
 * the runtime around each launch (cuda_launch.c), which serializes the
 * validating launches of a module for it. */
#define CUBE__OOB_GLOBAL                                                       \
    extern "C" {                                                               \
    __device__ cube__oob_rec cube__oob_record;                                 \
    }

struct cube__unit {
    unsigned int ux, uy, uz, cx, cy, cz, dx, dy, dz, nx, ny, nz, ax, ay, az;
};

#define cube_sync() __syncthreads()
/* Stops the kernel and breaks the device context: the launch (or the next
 * sync) reports a device fault, and so does every later call until the
 * client is reopened. */
#define cube_trap() __trap()

/* --- entry parameters (each item starts with a comma) --- */
#define CUBE__KP_cube__in(i, T, n, e)                                          \
    , const T *CUBE__RESTRICT n, unsigned long long n##__len
#define CUBE__KP_cube__out(i, T, n, e)                                         \
    , T *CUBE__RESTRICT n, unsigned long long n##__len
#define CUBE__KP_cube__inout(i, T, n, e)                                       \
    , T *CUBE__RESTRICT n, unsigned long long n##__len
#define CUBE__KP_cube__scalar(i, T, n, e) , const T n
#define CUBE__KP_cube__shared(i, T, n, e)
/* --- the body's arguments, from the entry's parameters --- */
#define CUBE__KA_cube__in(i, T, n, e) , n, n##__len CUBE__PI_ARG(i)
#define CUBE__KA_cube__out(i, T, n, e) , n, n##__len CUBE__PI_ARG(i)
#define CUBE__KA_cube__inout(i, T, n, e) , n, n##__len CUBE__PI_ARG(i)
#define CUBE__KA_cube__scalar(i, T, n, e) , n
#define CUBE__KA_cube__shared(i, T, n, e) , cube__shared->n

/* The entry's per-unit slot; a validating one also says where to report. */
#if CUBE_VALIDATE
#define CUBE__SINK_DECL                                                        \
    cube__vsink_t cube__sink;                                                  \
    cube__sink.rec = &cube__oob_record;
#else
#define CUBE__SINK_DECL cube__sink_t cube__sink;
#endif

/* The unit's fields <f>x, <f>y, <f>z from a CUDA dim3 or uint3. */
#define CUBE__UNIT_XYZ(f, v)                                                   \
    cube__w.f##x = v.x;                                                        \
    cube__w.f##y = v.y;                                                        \
    cube__w.f##z = v.z;

#define CUBE__ENTRY(name, N, ...)                                              \
    extern "C" __device__ const cube__param_sig cube__sig_##name[] = {         \
        CUBE__EACH(CUBE__SIG, N, __VA_ARGS__)};                                \
    extern "C" __device__ const unsigned int cube__nparams_##name = N;         \
    extern "C" __device__ const unsigned long long cube__shared_##name =       \
        (0 CUBE__EACH(CUBE__SHN, N, __VA_ARGS__)) ? sizeof(name##__shared_t)   \
                                                  : 0;                         \
    extern "C" __global__ void cube__kernel_##name(                            \
        int cube__abi CUBE__EACH(CUBE__KP, N, __VA_ARGS__))                    \
    {                                                                          \
        extern __shared__ __align__(16) unsigned char cube__dynamic_shared[];  \
        name##__shared_t *cube__shared =                                       \
            (name##__shared_t *)cube__dynamic_shared;                          \
        CUBE__SINK_DECL                                                        \
        cube__unit cube__w;                                                    \
        CUBE__UNIT_XYZ(u, threadIdx)                                           \
        CUBE__UNIT_XYZ(c, blockIdx)                                            \
        CUBE__UNIT_XYZ(d, blockDim)                                            \
        CUBE__UNIT_XYZ(n, gridDim)                                             \
        cube__w.ax = blockIdx.x * blockDim.x + threadIdx.x;                    \
        cube__w.ay = blockIdx.y * blockDim.y + threadIdx.y;                    \
        cube__w.az = blockIdx.z * blockDim.z + threadIdx.z;                    \
        (void)cube__shared;                                                    \
        (void)cube__abi;                                                       \
        name##__body(cube__w,                                                  \
                     &cube__sink CUBE__EACH(CUBE__KA, N, __VA_ARGS__));        \
    }

/* `name`: `fn` on T through the CUDA type CT it takes. */
#define CUBE__ATOMIC_CUDA_RMW(name, T, CT, fn)                                 \
    __device__ static inline T name(T *p, T v)                                 \
    {                                                                          \
        return (T)fn((CT *)p, (CT)v);                                          \
    }
#define CUBE__ATOMIC_CUDA(suffix, T, CT)                                       \
    CUBE__ATOMIC_CUDA_RMW(cube_atomic_add_##suffix, T, CT, atomicAdd)          \
    CUBE__ATOMIC_CUDA_RMW(cube_atomic_exchange_##suffix, T, CT, atomicExch)    \
    __device__ static inline T cube_atomic_cas_##suffix(T *p, T e, T d)        \
    {                                                                          \
        return (T)atomicCAS((CT *)p, (CT)e, (CT)d);                            \
    }                                                                          \
    CUBE__ATOMIC_CUDA_RMW(cube_atomic_max_##suffix, T, CT, atomicMax)          \
    CUBE__ATOMIC_CUDA_RMW(cube_atomic_min_##suffix, T, CT, atomicMin)          \
    __device__ static inline T cube_atomic_sub_##suffix(T *p, T v)             \
    {                                                                          \
        return (T)atomicAdd((CT *)p, (CT)(0 - v));                             \
    }
CUBE__ATOMIC_CUDA(i32, int32_t, int)
CUBE__ATOMIC_CUDA(u32, uint32_t, unsigned int)
CUBE__ATOMIC_CUDA(u64, uint64_t, unsigned long long)
__device__ static inline int64_t cube_atomic_add_i64(int64_t *p, int64_t v)
{
    return (int64_t)atomicAdd((unsigned long long *)p, (unsigned long long)v);
}
__device__ static inline float cube_atomic_add_f32(float *p, float v)
{
    return atomicAdd(p, v);
}
__device__ static inline double cube_atomic_add_f64(double *p, double v)
{
    return atomicAdd(p, v);
}
