/* cube C — the OpenCL prelude, compiled by the device's OpenCL C compiler
 * (OpenCL C 1.2, no generic address space needed) together with the
 * common prelude and the kernel's source.
 *
 * Entries per kernel `name`:
 *   cube__kernel_name([sinks, record,] trap, per buffer: page, byte
 *       offset, length in elements; per scalar: its value)
 *     the kernel (sinks and record only when checked or validating).
 *     `sinks` holds a 64-byte slot per unit of a checked
 *     launch (72 for a validating one), where out-of-range accesses land;
 *     `record` is a validating launch's cube__oob_rec; `trap` the word
 *     cube_trap() sets. Shared arrays live in one __local block.
 *   cube__sig_name(out)
 *     writes the signature: the parameter count, the shared bytes per
 *     cube, then per parameter its kind, element size and extent (two
 *     words), each a 32-bit word; the runtime runs it once after loading.
 * The runtime (opencl_kernels.c) sets the arguments in this order.
 */
#ifdef cl_khr_fp64
#pragma OPENCL EXTENSION cl_khr_fp64 : enable
#endif
#ifdef cl_khr_int64_base_atomics
#pragma OPENCL EXTENSION cl_khr_int64_base_atomics : enable
#endif
#ifdef cl_khr_int64_extended_atomics
#pragma OPENCL EXTENSION cl_khr_int64_extended_atomics : enable
#endif

typedef char int8_t;
typedef uchar uint8_t;
typedef short int16_t;
typedef ushort uint16_t;
typedef int int32_t;
typedef uint uint32_t;
typedef long int64_t;
typedef ulong uint64_t;

#define CUBE__U64 ulong
#define CUBE__GLOBAL __global
#define CUBE__LOCAL __local
#define CUBE__SINK_AS __global
#define CUBE__CONST_AS __constant
/* Helpers taking buffers write this before the pointer's type (it is
 * empty on the other backends): `CUBE_DEVICE float sum(CUBE_GLOBAL const
 * float *x, uint32_t n)`. */
#define CUBE_GLOBAL __global
#define CUBE_LOCAL __local

#define CUBE__RESTRICT restrict
#define CUBE__TYPEOF(x) __typeof__(x)
#define CUBE__UNUSED __attribute__((unused))
#define CUBE__INLINE inline __attribute__((always_inline))
#define CUBE_DEVICE static inline
#define CUBE__COLD static __attribute__((noinline))
#define CUBE__OOB_INC(p) atom_inc((volatile __global ulong *)(p))

typedef struct cube__unit {
    unsigned int ux, uy, uz, cx, cy, cz, dx, dy, dz, nx, ny, nz, ax, ay, az;
    __global volatile uint *trap;
} cube__unit;

#define cube_sync() barrier(CLK_LOCAL_MEM_FENCE | CLK_GLOBAL_MEM_FENCE)
/* Sets the device's trap word: the next sync reports a device fault, and
 * so does every later call. The unit runs on (write `cube_trap();
 * return;`), as on the CPU backend. Only in a kernel's body, where the
 * unit's context is. */
#define cube_trap() (*cube__u.trap = 1u)

/* --- entry parameters (each item starts with a comma) --- */
#define CUBE__KP_BUF(T, n)                                                     \
    , __global T *n##__page, ulong n##__off, ulong n##__len
#define CUBE__KP_cube__in(i, T, n, e) CUBE__KP_BUF(const T, n)
#define CUBE__KP_cube__out(i, T, n, e) CUBE__KP_BUF(T, n)
#define CUBE__KP_cube__inout(i, T, n, e) CUBE__KP_BUF(T, n)
#define CUBE__KP_cube__scalar(i, T, n, e) , const T n
#define CUBE__KP_cube__shared(i, T, n, e)
/* --- the body's arguments: a buffer is its page plus its offset --- */
#define CUBE__KA_BUF(i, T, n)                                                  \
    , (__global T *)((__global uchar *)n##__page + n##__off),                  \
        n##__len CUBE__PI_ARG(i)
#define CUBE__KA_cube__in(i, T, n, e) CUBE__KA_BUF(i, const T, n)
#define CUBE__KA_cube__out(i, T, n, e) CUBE__KA_BUF(i, T, n)
#define CUBE__KA_cube__inout(i, T, n, e) CUBE__KA_BUF(i, T, n)
#define CUBE__KA_cube__scalar(i, T, n, e) , n
#define CUBE__KA_cube__shared(i, T, n, e) , cube__shared.n
/* --- the signature, as words --- */
#define CUBE__SW_ANY(kind, T, e)                                               \
    cube__out[cube__w++] = (kind);                                             \
    cube__out[cube__w++] = (uint)sizeof(T);                                    \
    cube__out[cube__w++] = (uint)((ulong)(e)&0xFFFFFFFFu);                     \
    cube__out[cube__w++] = (uint)((ulong)(e) >> 32);
#define CUBE__SW_cube__in(i, T, n, e) CUBE__SW_ANY(CUBE__SIG_BUFFER_IN, T, 0)
#define CUBE__SW_cube__out(i, T, n, e) CUBE__SW_ANY(CUBE__SIG_BUFFER_OUT, T, 0)
#define CUBE__SW_cube__inout(i, T, n, e)                                       \
    CUBE__SW_ANY(CUBE__SIG_BUFFER_INOUT, T, 0)
#define CUBE__SW_cube__scalar(i, T, n, e) CUBE__SW_ANY(CUBE__SIG_SCALAR, T, 0)
#define CUBE__SW_cube__shared(i, T, n, e) CUBE__SW_ANY(CUBE__SIG_SHARED, T, e)

/* The unit's sink slot: bytes per unit, as the runtime sizes `sinks`. */
#if CUBE_VALIDATE
#define CUBE__SINK_BYTES 72
#define CUBE__SINK_SET(p) (((__global cube__vsink_t *)(p))->rec = cube__rec)
#else
#define CUBE__SINK_BYTES 64
#define CUBE__SINK_SET(p) ((void)0)
#endif

/* The entry's leading parameters: a plain launch has only the trap word
 * (fewer arguments to set per launch); a checked or validating one has
 * the sinks and the record before it. */
#if CUBE_VALIDATE || CUBE_CHECKED
#define CUBE__FIXED_PARAMS                                                     \
    __global uchar *cube__sinks, __global cube__oob_rec *cube__rec,            \
        __global volatile uint *cube__trap
#define CUBE__SINKS cube__sinks
#else
#define CUBE__FIXED_PARAMS __global volatile uint *cube__trap
#define CUBE__SINKS ((__global uchar *)0)
#endif

/* The shared arrays' block: __local where the source declares any (the
 * runtime says so with CUBE__SHARED_LOCAL), else an unused private one,
 * so that a kernel without shared memory asks the device for none. */
#if CUBE__SHARED_LOCAL
#define CUBE__SHARED_DECL(T) __local T cube__shared;
#else
#define CUBE__SHARED_DECL(T) T cube__shared;
#endif

#define CUBE__ENTRY(name, N, ...)                                              \
    __kernel void cube__sig_##name(__global uint *cube__out)                   \
    {                                                                          \
        uint cube__w = 0;                                                      \
        cube__out[cube__w++] = N;                                              \
        cube__out[cube__w++] = (0 CUBE__EACH(CUBE__SHN, N, __VA_ARGS__))       \
                                   ? (uint)sizeof(name##__shared_t)            \
                                   : 0u;                                       \
        CUBE__EACH(CUBE__SW, N, __VA_ARGS__)                                   \
    }                                                                          \
    __kernel void cube__kernel_##name(                                         \
        CUBE__FIXED_PARAMS CUBE__EACH(CUBE__KP, N, __VA_ARGS__))               \
    {                                                                          \
        __global uchar *cube__sinkbase = CUBE__SINKS;                          \
        CUBE__SHARED_DECL(name##__shared_t)                                    \
        cube__unit cube__w;                                                    \
        cube__w.ux = (uint)get_local_id(0);                                    \
        cube__w.uy = (uint)get_local_id(1);                                    \
        cube__w.uz = (uint)get_local_id(2);                                    \
        cube__w.cx = (uint)get_group_id(0);                                    \
        cube__w.cy = (uint)get_group_id(1);                                    \
        cube__w.cz = (uint)get_group_id(2);                                    \
        cube__w.dx = (uint)get_local_size(0);                                  \
        cube__w.dy = (uint)get_local_size(1);                                  \
        cube__w.dz = (uint)get_local_size(2);                                  \
        cube__w.nx = (uint)get_num_groups(0);                                  \
        cube__w.ny = (uint)get_num_groups(1);                                  \
        cube__w.nz = (uint)get_num_groups(2);                                  \
        cube__w.ax = (uint)get_global_id(0);                                   \
        cube__w.ay = (uint)get_global_id(1);                                   \
        cube__w.az = (uint)get_global_id(2);                                   \
        cube__w.trap = cube__trap;                                             \
        __global uchar *cube__sinkp = cube__sinkbase;                          \
        if (cube__sinkbase) {                                                  \
            ulong cube__lin =                                                  \
                get_global_id(0) +                                             \
                get_global_size(0) * (get_global_id(1) +                       \
                                      get_global_size(1) * get_global_id(2));  \
            cube__sinkp = cube__sinkbase + cube__lin * CUBE__SINK_BYTES;       \
            CUBE__SINK_SET(cube__sinkp);                                       \
        }                                                                      \
        name##__body(cube__w,                                                  \
                     cube__sinkp CUBE__EACH(CUBE__KA, N, __VA_ARGS__));        \
    }

/* --- atomics (relaxed; they return the old value) ---
 * OpenCL's built-ins take __global and __local pointers alike. 64-bit ones
 * need cl_khr_int64_base_atomics and _extended_atomics. */
#define cube_atomic_add_i32(p, v) atomic_add((p), (v))
#define cube_atomic_add_u32(p, v) atomic_add((p), (v))
#define cube_atomic_sub_i32(p, v) atomic_sub((p), (v))
#define cube_atomic_sub_u32(p, v) atomic_sub((p), (v))
#define cube_atomic_exchange_i32(p, v) atomic_xchg((p), (v))
#define cube_atomic_exchange_u32(p, v) atomic_xchg((p), (v))
#define cube_atomic_cas_i32(p, e, d) atomic_cmpxchg((p), (e), (d))
#define cube_atomic_cas_u32(p, e, d) atomic_cmpxchg((p), (e), (d))
#define cube_atomic_max_i32(p, v) atomic_max((p), (v))
#define cube_atomic_max_u32(p, v) atomic_max((p), (v))
#define cube_atomic_min_i32(p, v) atomic_min((p), (v))
#define cube_atomic_min_u32(p, v) atomic_min((p), (v))
#define cube_atomic_add_i64(p, v) atom_add((p), (long)(v))
#define cube_atomic_add_u64(p, v) atom_add((p), (ulong)(v))
#define cube_atomic_sub_u64(p, v) atom_sub((p), (ulong)(v))
#define cube_atomic_exchange_u64(p, v) atom_xchg((p), (ulong)(v))
#define cube_atomic_cas_u64(p, e, d) atom_cmpxchg((p), (ulong)(e), (ulong)(d))
#define cube_atomic_max_u64(p, v) atom_max((p), (ulong)(v))
#define cube_atomic_min_u64(p, v) atom_min((p), (ulong)(v))

/* Float additions by compare-and-swap on the bits (T's unsigned twin U,
 * AS_U and AS_T its bit casts, CAS the compare-and-swap), for both
 * address spaces. */
#define CUBE__ATOMIC_ADD_FLOAT(name, AS, T, U, AS_U, AS_T, CAS)                \
    static inline T __attribute__((overloadable)) name(AS T *p, T v)           \
    {                                                                          \
        U old = *(volatile AS U *)p, seen;                                     \
        do {                                                                   \
            seen = old;                                                        \
            old = CAS((volatile AS U *)p, seen, AS_U(AS_T(seen) + v));         \
        } while (old != seen);                                                 \
        return AS_T(old);                                                      \
    }
CUBE__ATOMIC_ADD_FLOAT(cube_atomic_add_f32, __global, float, uint, as_uint,
                       as_float, atomic_cmpxchg)
CUBE__ATOMIC_ADD_FLOAT(cube_atomic_add_f32, __local, float, uint, as_uint,
                       as_float, atomic_cmpxchg)
#if defined(cl_khr_fp64) && defined(cl_khr_int64_base_atomics)
CUBE__ATOMIC_ADD_FLOAT(cube_atomic_add_f64, __global, double, ulong, as_ulong,
                       as_double, atom_cmpxchg)
CUBE__ATOMIC_ADD_FLOAT(cube_atomic_add_f64, __local, double, ulong, as_ulong,
                       as_double, atom_cmpxchg)
#endif

/* --- math: C's float names over OpenCL's overloaded built-ins --- */
#define sqrtf sqrt
#define cbrtf cbrt
#define expf exp
#define exp2f exp2
#define expm1f expm1
#define logf log
#define log2f log2
#define log10f log10
#define log1pf log1p
#define powf pow
#define sinf sin
#define cosf cos
#define tanf tan
#define asinf asin
#define acosf acos
#define atanf atan
#define atan2f atan2
#define sinhf sinh
#define coshf cosh
#define tanhf tanh
#define erff erf
#define hypotf hypot
#define fabsf fabs
#define fmaxf fmax
#define fminf fmin
#define fmodf fmod
#define floorf floor
#define ceilf ceil
#define roundf round
#define truncf trunc
#define copysignf copysign
#define fmaf fma
