/* cube C — the CPU prelude. Put in front of the common prelude and the
 * kernel's source, then compiled by the system C compiler as C11.
 *
 * Entry points per kernel `name` (all with default visibility):
 *   cube__sig_name[], cube__nparams_name   the parameter signature
 *   cube__shared_name                      shared bytes per cube
 *   cube__run_name(launch, begin, end, shared)
 *       runs cubes [begin, end) with their units as a plain loop the
 *       compiler can vectorize (kernels that never call cube_sync());
 *   cube__unit_name(launch, cube, unit, shared)
 *       runs one unit of one cube (a fiber, for kernels that call
 *       cube_sync());
 *   cube__cubes_name(launch, begin, end, shared), cube__cubes_dim_name[3]
 *       only where the barrier pass (cpu_unitloop.c) rewrote the body of
 *       a kernel that calls cube_sync(): runs cubes [begin, end) with the
 *       units as loops between the barriers, for that cube dimension.
 * cube__abi_version, cube__sync_fn and cube__trap_fn are set/checked by
 * the runtime.
 */
#include <math.h>
#include <stddef.h>
#include <stdint.h>

#define CUBE__RESTRICT restrict
#define CUBE__TYPEOF(x) __typeof__(x)
#define CUBE__UNUSED __attribute__((unused))
#define CUBE__INLINE inline __attribute__((always_inline))
#define CUBE__EXPORT __attribute__((visibility("default")))
#define CUBE_DEVICE static inline
#define CUBE__COLD static __attribute__((noinline, cold))
#define CUBE__OOB_INC(p) __atomic_fetch_add((p), 1ull, __ATOMIC_RELAXED)

/* The ABI the runtime calls with; it must match cpu_launch_abi in
 * src/backends/cpu/cpu_server.c. */
#define CUBE__CPU_ABI 2
typedef struct cube_cpu_launch {
    unsigned int dim[3];
    unsigned int count[3];
    void *const *ptr;              /* per parameter position */
    const unsigned long long *len; /* bytes, per parameter position */
    void *oob; /* a validating launch's cube__oob_rec, else NULL */
} cube_cpu_launch;

/* ax, ay, az: absolute positions, kept as fields so the unit loop's
 * induction variable is the absolute index itself — gcc then sees affine,
 * non-wrapping accesses and vectorizes the loop. */
typedef struct cube__unit {
    unsigned int ux, uy, uz, cx, cy, cz, dx, dy, dz, nx, ny, nz, ax, ay, az;
} cube__unit;

CUBE__EXPORT const unsigned int cube__abi_version = CUBE__CPU_ABI;
/* Set by the runtime after loading: switches to the next unit's fiber. */
CUBE__EXPORT void (*cube__sync_fn)(void);

/* Barrier across the units of a cube. */
#define cube_sync() cube__sync_fn()

/* Set by the runtime after loading: marks the device broken. The unit
 * itself runs on to the end of its body (a host thread cannot be stopped
 * in the middle), so write `cube_trap(); return;` where that matters. */
CUBE__EXPORT void (*cube__trap_fn)(void);
#define cube_trap() cube__trap_fn()

/* The locals every entry reads its arguments from (see CUBE__ARG). */
#define CUBE__UNPACK(name)                                                     \
    void *const *cube__ptr = cube__l->ptr;                                     \
    const unsigned long long *cube__len = cube__l->len;                        \
    name##__shared_t *cube__shared = (name##__shared_t *)cube__shmem;          \
    (void)cube__shared;                                                        \
    (void)cube__len;                                                           \
    CUBE__SINK_DECL

/* Each entry's per-unit slot; a validating one also says where to report. */
#if CUBE_VALIDATE
#define CUBE__SINK_DECL                                                        \
    cube__vsink_t cube__sink;                                                  \
    cube__sink.rec = (cube__oob_rec *)cube__l->oob;
#else
#define CUBE__SINK_DECL cube__sink_t cube__sink;
#endif

/* The launch's shape, into a cube__unit v (the cube and unit positions are
 * the caller's). */
#define CUBE__SHAPE(v)                                                         \
    v.dx = cube__l->dim[0];                                                    \
    v.dy = cube__l->dim[1];                                                    \
    v.dz = cube__l->dim[2];                                                    \
    v.nx = cube__l->count[0];                                                  \
    v.ny = cube__l->count[1];                                                  \
    v.nz = cube__l->count[2];

/* Cube c's position in the grid, into v (after CUBE__SHAPE(v)). */
#define CUBE__CUBE_POS(v, c)                                                   \
    v.cx = c % v.nx;                                                           \
    v.cy = (c / v.nx) % v.ny;                                                  \
    v.cz = c / (v.nx * v.ny);

/* An exported entry the runtime calls for cubes [begin, end) of a launch:
 * its declaration (for the visibility) and the head of its definition. */
#define CUBE__RANGE_FN(fn)                                                     \
    CUBE__EXPORT void fn(const cube_cpu_launch *cube__l,                       \
                         unsigned int cube__begin, unsigned int cube__end,     \
                         void *cube__shmem);                                   \
    void fn(const cube_cpu_launch *cube__l, unsigned int cube__begin,          \
            unsigned int cube__end, void *cube__shmem)

#define CUBE__ENTRY(name, N, ...)                                              \
    CUBE__EXPORT const cube__param_sig cube__sig_##name[] = {                  \
        CUBE__EACH(CUBE__SIG, N, __VA_ARGS__)};                                \
    CUBE__EXPORT const unsigned int cube__nparams_##name = N;                  \
    CUBE__EXPORT const unsigned long long cube__shared_##name =                \
        (0 CUBE__EACH(CUBE__SHN, N, __VA_ARGS__)) ? sizeof(name##__shared_t)   \
                                                  : 0;                         \
    /* A 1-D launch as one flat loop over the absolute position, in a          \
     * function of its own so the loop is analyzed alone. The index is         \
     * signed: it cannot wrap, so gcc may split the loop at a kernel's         \
     * `if (i < n)` guard instead of masking every vector. Unit and cube       \
     * positions are derived per element and vanish when unused. */            \
    static __attribute__((noinline)) void name##__flat(                        \
        unsigned int cube__dx, unsigned int cube__nx, int cube__lo,            \
        int cube__hi,                                                          \
        void *cube__sinkp CUBE__EACH(CUBE__PARAM, N, __VA_ARGS__))             \
    {                                                                          \
        cube__unit cube__w;                                                    \
        cube__w.dx = cube__dx;                                                 \
        cube__w.dy = cube__w.dz = cube__w.ny = cube__w.nz = 1;                 \
        cube__w.nx = cube__nx;                                                 \
        cube__w.uy = cube__w.uz = cube__w.cy = cube__w.cz = 0;                 \
        cube__w.ay = cube__w.az = 0;                                           \
        if (cube__lo < 0)                                                      \
            __builtin_unreachable(); /* the caller checked the range */        \
        for (int cube__a = cube__lo; cube__a < cube__hi; cube__a++) {          \
            cube__w.ax = (unsigned int)cube__a;                                \
            cube__w.ux = (unsigned int)cube__a % cube__dx;                     \
            cube__w.cx = (unsigned int)cube__a / cube__dx;                     \
            name##__body(cube__w,                                              \
                         cube__sinkp CUBE__EACH(CUBE__NAME, N, __VA_ARGS__));  \
        }                                                                      \
    }                                                                          \
    /* The unit loop takes the unpacked arguments as parameters, so they are   \
     * loop invariants the compiler can see (and vectorize around). */         \
    static void name##__loop(                                                  \
        const cube_cpu_launch *cube__l, unsigned int cube__begin,              \
        unsigned int cube__end,                                                \
        void *cube__sinkp CUBE__EACH(CUBE__PARAM, N, __VA_ARGS__))             \
    {                                                                          \
        cube__unit cube__v;                                                    \
        CUBE__SHAPE(cube__v)                                                   \
        if (cube__v.dy == 1 && cube__v.dz == 1 && cube__v.ny == 1 &&           \
            cube__v.nz == 1 &&                                                 \
            (unsigned long long)cube__end * cube__v.dx <= 0x7FFFFFFFull) {     \
            /* A 1-D launch: one flat loop over the absolute position. The     \
             * unit and cube positions are derived per element, and vanish     \
             * when the body does not use them. */                             \
            name##__flat(cube__v.dx, cube__v.nx,                               \
                         (int)(cube__begin * cube__v.dx),                      \
                         (int)(cube__end * cube__v.dx),                        \
                         cube__sinkp CUBE__EACH(CUBE__NAME, N, __VA_ARGS__));  \
            return;                                                            \
        }                                                                      \
        for (unsigned int cube__c = cube__begin; cube__c < cube__end;          \
             cube__c++) {                                                      \
            CUBE__CUBE_POS(cube__v, cube__c)                                   \
            const unsigned int cube__bx = cube__v.cx * cube__v.dx;             \
            const unsigned int cube__ex = cube__bx + cube__v.dx;               \
            for (unsigned int cube__z = 0; cube__z < cube__v.dz; cube__z++)    \
                for (unsigned int cube__y = 0; cube__y < cube__v.dy;           \
                     cube__y++) {                                              \
                    cube__unit cube__w = cube__v;                              \
                    cube__w.uy = cube__y;                                      \
                    cube__w.uz = cube__z;                                      \
                    cube__w.ay = cube__v.cy * cube__v.dy + cube__y;            \
                    cube__w.az = cube__v.cz * cube__v.dz + cube__z;            \
                    for (unsigned int cube__a = cube__bx; cube__a < cube__ex;  \
                         cube__a++) {                                          \
                        cube__w.ax = cube__a;                                  \
                        cube__w.ux = cube__a - cube__bx;                       \
                        name##__body(cube__w,                                  \
                                     cube__sinkp CUBE__EACH(CUBE__NAME, N,     \
                                                            __VA_ARGS__));     \
                    }                                                          \
                }                                                              \
        }                                                                      \
    }                                                                          \
    CUBE__RANGE_FN(cube__run_##name)                                           \
    {                                                                          \
        CUBE__UNPACK(name)                                                     \
        name##__loop(cube__l, cube__begin, cube__end,                          \
                     &cube__sink CUBE__EACH(CUBE__ARG, N, __VA_ARGS__));       \
    }                                                                          \
    CUBE__EXPORT void cube__unit_##name(                                       \
        const cube_cpu_launch *cube__l, unsigned int cube__c,                  \
        unsigned int cube__unitpos, void *cube__shmem);                        \
    void cube__unit_##name(const cube_cpu_launch *cube__l,                     \
                           unsigned int cube__c, unsigned int cube__unitpos,   \
                           void *cube__shmem)                                  \
    {                                                                          \
        CUBE__UNPACK(name)                                                     \
        cube__unit cube__w;                                                    \
        CUBE__SHAPE(cube__w)                                                   \
        CUBE__CUBE_POS(cube__w, cube__c)                                       \
        cube__w.ux = cube__unitpos % cube__w.dx;                               \
        cube__w.uy = (cube__unitpos / cube__w.dx) % cube__w.dy;                \
        cube__w.uz = cube__unitpos / (cube__w.dx * cube__w.dy);                \
        cube__w.ax = cube__w.cx * cube__w.dx + cube__w.ux;                     \
        cube__w.ay = cube__w.cy * cube__w.dy + cube__w.uy;                     \
        cube__w.az = cube__w.cz * cube__w.dz + cube__w.uz;                     \
        name##__body(cube__w,                                                  \
                     &cube__sink CUBE__EACH(CUBE__ARG, N, __VA_ARGS__));       \
    }

/* The barrier pass's entry: CUBE__CUBES(name, params...) followed by the
 * rewritten body, which sets the cube dimension, loops over the units
 * between barriers and keeps what lives across them. The body runs once
 * per cube, with cube__p the cube's positions and the kernel's
 * parameters. */
#define CUBE__CUBES(name, ...)                                                 \
    CUBE__CUBES_(name, CUBE__NARGS(__VA_ARGS__), __VA_ARGS__)
/* gcc sinks what a unit computes for a store under a condition (`v` of
 * `if (x < w) out[i] = v;`) into that condition; its vectorizer then gives
 * up on the masked loads of shared memory that result. The loops over the
 * units are compiled without that sinking. */
#if defined(__GNUC__) && !defined(__clang__)
#define CUBE__CUBES_ATTR __attribute__((noinline, optimize("no-tree-sink")))
#else
#define CUBE__CUBES_ATTR __attribute__((noinline))
#endif
#define CUBE__CUBES_(name, N, ...)                                             \
    static CUBE__CUBES_ATTR void name##__cubes(                                \
        const cube__unit cube__p, CUBE__UNUSED void *cube__sinkp CUBE__EACH(   \
                                      CUBE__PARAM, N, __VA_ARGS__));           \
    CUBE__RANGE_FN(cube__cubes_##name)                                         \
    {                                                                          \
        CUBE__UNPACK(name)                                                     \
        cube__unit cube__v;                                                    \
        CUBE__SHAPE(cube__v)                                                   \
        cube__v.ux = cube__v.uy = cube__v.uz = 0;                              \
        cube__v.ax = cube__v.ay = cube__v.az = 0;                              \
        for (unsigned int cube__c = cube__begin; cube__c < cube__end;          \
             cube__c++) {                                                      \
            CUBE__CUBE_POS(cube__v, cube__c)                                   \
            name##__cubes(cube__v,                                             \
                          &cube__sink CUBE__EACH(CUBE__ARG, N, __VA_ARGS__));  \
        }                                                                      \
    }                                                                          \
    static void name##__cubes(const cube__unit cube__p,                        \
                              CUBE__UNUSED void *cube__sinkp CUBE__EACH(       \
                                  CUBE__PARAM, N, __VA_ARGS__))

/* --- atomics (relaxed; they return the old value) --- */
#define CUBE__ATOMIC_INT(suffix, T)                                            \
    static inline T cube_atomic_add_##suffix(T *p, T v)                        \
    {                                                                          \
        return __atomic_fetch_add(p, v, __ATOMIC_RELAXED);                     \
    }                                                                          \
    static inline T cube_atomic_sub_##suffix(T *p, T v)                        \
    {                                                                          \
        return __atomic_fetch_sub(p, v, __ATOMIC_RELAXED);                     \
    }                                                                          \
    static inline T cube_atomic_exchange_##suffix(T *p, T v)                   \
    {                                                                          \
        return __atomic_exchange_n(p, v, __ATOMIC_RELAXED);                    \
    }                                                                          \
    static inline T cube_atomic_cas_##suffix(T *p, T expected, T desired)      \
    {                                                                          \
        __atomic_compare_exchange_n(p, &expected, desired, 0,                  \
                                    __ATOMIC_RELAXED, __ATOMIC_RELAXED);       \
        return expected;                                                       \
    }                                                                          \
    static inline T cube_atomic_max_##suffix(T *p, T v)                        \
    {                                                                          \
        T old = __atomic_load_n(p, __ATOMIC_RELAXED);                          \
        while (old < v &&                                                      \
               !__atomic_compare_exchange_n(p, &old, v, 1, __ATOMIC_RELAXED,   \
                                            __ATOMIC_RELAXED)) {               \
        }                                                                      \
        return old;                                                            \
    }                                                                          \
    static inline T cube_atomic_min_##suffix(T *p, T v)                        \
    {                                                                          \
        T old = __atomic_load_n(p, __ATOMIC_RELAXED);                          \
        while (old > v &&                                                      \
               !__atomic_compare_exchange_n(p, &old, v, 1, __ATOMIC_RELAXED,   \
                                            __ATOMIC_RELAXED)) {               \
        }                                                                      \
        return old;                                                            \
    }
CUBE__ATOMIC_INT(i32, int32_t)
CUBE__ATOMIC_INT(u32, uint32_t)
CUBE__ATOMIC_INT(i64, int64_t)
CUBE__ATOMIC_INT(u64, uint64_t)

#define CUBE__ATOMIC_FLOAT(suffix, T, U)                                       \
    static inline T cube_atomic_add_##suffix(T *p, T v)                        \
    {                                                                          \
        union {                                                                \
            T f;                                                               \
            U u;                                                               \
        } old, next;                                                           \
        old.u = __atomic_load_n((U *)p, __ATOMIC_RELAXED);                     \
        do {                                                                   \
            next.f = old.f + v;                                                \
        } while (!__atomic_compare_exchange_n(                                 \
            (U *)p, &old.u, next.u, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED));   \
        return old.f;                                                          \
    }
CUBE__ATOMIC_FLOAT(f32, float, uint32_t)
CUBE__ATOMIC_FLOAT(f64, double, uint64_t)
