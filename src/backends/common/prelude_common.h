/* cube C — the part of the prelude shared by every backend.
 *
 * A backend prelude defines, before including this text:
 *   CUBE__RESTRICT, CUBE__TYPEOF(x), CUBE__INLINE
 *   CUBE__ENTRY(name, nparams, plist)   the backend's entry points
 *   CUBE__UNUSED (marks a parameter that may go unused)
 * and may define CUBE__U64, CUBE__GLOBAL, CUBE__LOCAL, CUBE__SINK_AS and
 * CUBE__CONST_AS (below)
 * and the unit context `cube__unit` with fields ux, uy, uz, cx, cy, cz,
 * dx, dy, dz, nx, ny, nz, ax, ay, az (unit position, cube position, cube
 * dimension, cube count, absolute position).
 *
 * Parameters are tuples (kind, type, name, extent); each "view" below turns
 * the parameter list into one piece of code: the body's parameter list, the
 * arguments an entry passes, the signature table, the shared-memory struct.
 */

/* Address spaces and the 64-bit type, for a backend whose pointers carry
 * them (OpenCL C 1.2 has no generic address space, and its `long long` is
 * 128 bits): buffers, shared arrays, the per-unit sink and string
 * literals. Empty, and unsigned long long, elsewhere. */
#ifndef CUBE__U64
#define CUBE__U64 unsigned long long
#endif
#ifndef CUBE__GLOBAL
#define CUBE__GLOBAL
#endif
#ifndef CUBE__LOCAL
#define CUBE__LOCAL
#endif
#ifndef CUBE__SINK_AS
#define CUBE__SINK_AS
#endif
#ifndef CUBE__CONST_AS
#define CUBE__CONST_AS
#endif
/* What kernels write before a pointer's type in a helper's parameters:
 * `CUBE_GLOBAL float *` for a buffer, `CUBE_LOCAL float *` for a shared
 * array. __global and __local on OpenCL, nothing elsewhere. */
#ifndef CUBE_GLOBAL
#define CUBE_GLOBAL
#endif
#ifndef CUBE_LOCAL
#define CUBE_LOCAL
#endif

/* --- parameter kinds --- */
#define CUBE_IN(T, name) (cube__in, T, name, 1)
#define CUBE_OUT(T, name) (cube__out, T, name, 1)
#define CUBE_INOUT(T, name) (cube__inout, T, name, 1)
#define CUBE_SCALAR(T, name) (cube__scalar, T, name, 1)
#define CUBE_SHARED(T, name, count) (cube__shared, T, name, count)

/* Signature table entries (read by the runtime to validate arguments). */
#define CUBE__SIG_BUFFER_IN 1
#define CUBE__SIG_BUFFER_OUT 2
#define CUBE__SIG_BUFFER_INOUT 3
#define CUBE__SIG_SCALAR 4
#define CUBE__SIG_SHARED 5

typedef struct cube__param_sig {
    unsigned int kind;
    unsigned int elem_size;
    CUBE__U64 extent;
} cube__param_sig;

/* --- preprocessor machinery
 * --------------------------------------------------- */
#define CUBE__CAT(a, b) CUBE__CAT_(a, b)
#define CUBE__CAT_(a, b) a##b
#define CUBE__UNPAREN(...) __VA_ARGS__
#define CUBE__NARGS(...)                                                       \
    CUBE__NARGS_(__VA_ARGS__, 24, 23, 22, 21, 20, 19, 18, 17, 16, 15, 14, 13,  \
                 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0)
#define CUBE__NARGS_(_1, _2, _3, _4, _5, _6, _7, _8, _9, _10, _11, _12, _13,   \
                     _14, _15, _16, _17, _18, _19, _20, _21, _22, _23, _24, N, \
                     ...)                                                      \
    N

#define CUBE__APPLY(v, i, p) CUBE__APPLY_(v, i, CUBE__UNPAREN p)
#define CUBE__APPLY_(v, i, ...) CUBE__APPLY__(v, i, __VA_ARGS__)
#define CUBE__APPLY__(v, i, kind, T, name, extent)                             \
    CUBE__CAT(CUBE__CAT(v, _), kind)(i, T, name, extent)

/* CUBE__EACH(view, total, params...) applies view to each parameter in
 * order with its position (total - remaining). */
#define CUBE__EACH(v, t, ...)                                                  \
    CUBE__CAT(CUBE__EACH_, CUBE__NARGS(__VA_ARGS__))(v, t, __VA_ARGS__)
#define CUBE__EACH_1(v, t, p) CUBE__APPLY(v, (t - 1), p)
#define CUBE__EACH_2(v, t, p, ...)                                             \
    CUBE__APPLY(v, (t - 2), p) CUBE__EACH_1(v, t, __VA_ARGS__)
#define CUBE__EACH_3(v, t, p, ...)                                             \
    CUBE__APPLY(v, (t - 3), p) CUBE__EACH_2(v, t, __VA_ARGS__)
#define CUBE__EACH_4(v, t, p, ...)                                             \
    CUBE__APPLY(v, (t - 4), p) CUBE__EACH_3(v, t, __VA_ARGS__)
#define CUBE__EACH_5(v, t, p, ...)                                             \
    CUBE__APPLY(v, (t - 5), p) CUBE__EACH_4(v, t, __VA_ARGS__)
#define CUBE__EACH_6(v, t, p, ...)                                             \
    CUBE__APPLY(v, (t - 6), p) CUBE__EACH_5(v, t, __VA_ARGS__)
#define CUBE__EACH_7(v, t, p, ...)                                             \
    CUBE__APPLY(v, (t - 7), p) CUBE__EACH_6(v, t, __VA_ARGS__)
#define CUBE__EACH_8(v, t, p, ...)                                             \
    CUBE__APPLY(v, (t - 8), p) CUBE__EACH_7(v, t, __VA_ARGS__)
#define CUBE__EACH_9(v, t, p, ...)                                             \
    CUBE__APPLY(v, (t - 9), p) CUBE__EACH_8(v, t, __VA_ARGS__)
#define CUBE__EACH_10(v, t, p, ...)                                            \
    CUBE__APPLY(v, (t - 10), p) CUBE__EACH_9(v, t, __VA_ARGS__)
#define CUBE__EACH_11(v, t, p, ...)                                            \
    CUBE__APPLY(v, (t - 11), p) CUBE__EACH_10(v, t, __VA_ARGS__)
#define CUBE__EACH_12(v, t, p, ...)                                            \
    CUBE__APPLY(v, (t - 12), p) CUBE__EACH_11(v, t, __VA_ARGS__)
#define CUBE__EACH_13(v, t, p, ...)                                            \
    CUBE__APPLY(v, (t - 13), p) CUBE__EACH_12(v, t, __VA_ARGS__)
#define CUBE__EACH_14(v, t, p, ...)                                            \
    CUBE__APPLY(v, (t - 14), p) CUBE__EACH_13(v, t, __VA_ARGS__)
#define CUBE__EACH_15(v, t, p, ...)                                            \
    CUBE__APPLY(v, (t - 15), p) CUBE__EACH_14(v, t, __VA_ARGS__)
#define CUBE__EACH_16(v, t, p, ...)                                            \
    CUBE__APPLY(v, (t - 16), p) CUBE__EACH_15(v, t, __VA_ARGS__)
#define CUBE__EACH_17(v, t, p, ...)                                            \
    CUBE__APPLY(v, (t - 17), p) CUBE__EACH_16(v, t, __VA_ARGS__)
#define CUBE__EACH_18(v, t, p, ...)                                            \
    CUBE__APPLY(v, (t - 18), p) CUBE__EACH_17(v, t, __VA_ARGS__)
#define CUBE__EACH_19(v, t, p, ...)                                            \
    CUBE__APPLY(v, (t - 19), p) CUBE__EACH_18(v, t, __VA_ARGS__)
#define CUBE__EACH_20(v, t, p, ...)                                            \
    CUBE__APPLY(v, (t - 20), p) CUBE__EACH_19(v, t, __VA_ARGS__)
#define CUBE__EACH_21(v, t, p, ...)                                            \
    CUBE__APPLY(v, (t - 21), p) CUBE__EACH_20(v, t, __VA_ARGS__)
#define CUBE__EACH_22(v, t, p, ...)                                            \
    CUBE__APPLY(v, (t - 22), p) CUBE__EACH_21(v, t, __VA_ARGS__)
#define CUBE__EACH_23(v, t, p, ...)                                            \
    CUBE__APPLY(v, (t - 23), p) CUBE__EACH_22(v, t, __VA_ARGS__)
#define CUBE__EACH_24(v, t, p, ...)                                            \
    CUBE__APPLY(v, (t - 24), p) CUBE__EACH_23(v, t, __VA_ARGS__)

/* A validating launch (CUBE_VALIDATE) gives every buffer parameter a third
 * hidden companion, its position, so an out-of-range CUBE_AT can say which
 * parameter it indexed. */
#if CUBE_VALIDATE
#define CUBE__PI_PARAM(n) , CUBE__UNUSED unsigned int n##__pi
#define CUBE__PI_ARG(i) , (unsigned int)(i)
#define CUBE__PI_NAME(n) , n##__pi
#else
#define CUBE__PI_PARAM(n)
#define CUBE__PI_ARG(i)
#define CUBE__PI_NAME(n)
#endif

/* --- view: the body's parameter list (each item starts with a comma) --- */
#define CUBE__PARAM_cube__in(i, T, n, e)                                       \
    , CUBE__GLOBAL const T *CUBE__RESTRICT n,                                  \
        CUBE__UNUSED CUBE__U64 n##__len CUBE__PI_PARAM(n)
#define CUBE__PARAM_cube__out(i, T, n, e)                                      \
    , CUBE__GLOBAL T *CUBE__RESTRICT n,                                        \
        CUBE__UNUSED CUBE__U64 n##__len CUBE__PI_PARAM(n)
#define CUBE__PARAM_cube__inout(i, T, n, e)                                    \
    , CUBE__GLOBAL T *CUBE__RESTRICT n,                                        \
        CUBE__UNUSED CUBE__U64 n##__len CUBE__PI_PARAM(n)
#define CUBE__PARAM_cube__scalar(i, T, n, e) , const T n
#define CUBE__PARAM_cube__shared(i, T, n, e) , CUBE__LOCAL T *CUBE__RESTRICT n

/* --- view: the arguments an entry passes (from ptr[], len[], shared) --- */
#define CUBE__ARG_BUF(i, T, n)                                                 \
    , (T *)cube__ptr[i], (CUBE__U64)(cube__len[i] / sizeof(T)) CUBE__PI_ARG(i)
#define CUBE__ARG_cube__in(i, T, n, e) CUBE__ARG_BUF(i, T, n)
#define CUBE__ARG_cube__out(i, T, n, e) CUBE__ARG_BUF(i, T, n)
#define CUBE__ARG_cube__inout(i, T, n, e) CUBE__ARG_BUF(i, T, n)
#define CUBE__ARG_cube__scalar(i, T, n, e) , *(const T *)cube__ptr[i]
#define CUBE__ARG_cube__shared(i, T, n, e) , cube__shared->n

/* --- view: the parameter names, as the body's arguments
 * ----------------------- */
#define CUBE__NAME_cube__in(i, T, n, e) , n, n##__len CUBE__PI_NAME(n)
#define CUBE__NAME_cube__out(i, T, n, e) , n, n##__len CUBE__PI_NAME(n)
#define CUBE__NAME_cube__inout(i, T, n, e) , n, n##__len CUBE__PI_NAME(n)
#define CUBE__NAME_cube__scalar(i, T, n, e) , n
#define CUBE__NAME_cube__shared(i, T, n, e) , n

/* --- view: the signature table
 * ------------------------------------------------ */
#define CUBE__SIG_cube__in(i, T, n, e) {CUBE__SIG_BUFFER_IN, sizeof(T), 0},
#define CUBE__SIG_cube__out(i, T, n, e) {CUBE__SIG_BUFFER_OUT, sizeof(T), 0},
#define CUBE__SIG_cube__inout(i, T, n, e)                                      \
    {CUBE__SIG_BUFFER_INOUT, sizeof(T), 0},
#define CUBE__SIG_cube__scalar(i, T, n, e) {CUBE__SIG_SCALAR, sizeof(T), 0},
#define CUBE__SIG_cube__shared(i, T, n, e) {CUBE__SIG_SHARED, sizeof(T), (e)},

/* --- view: the shared-memory struct fields
 * ------------------------------------ */
#define CUBE__SHF_cube__in(i, T, n, e)
#define CUBE__SHF_cube__out(i, T, n, e)
#define CUBE__SHF_cube__inout(i, T, n, e)
#define CUBE__SHF_cube__scalar(i, T, n, e)
#define CUBE__SHF_cube__shared(i, T, n, e) T n[e];
#define CUBE__SHN_cube__in(i, T, n, e)
#define CUBE__SHN_cube__out(i, T, n, e)
#define CUBE__SHN_cube__inout(i, T, n, e)
#define CUBE__SHN_cube__scalar(i, T, n, e)
#define CUBE__SHN_cube__shared(i, T, n, e) +1

/* --- the kernel header
 * ---------------------------------------------------------- CUBE_KERNEL(name,
 * params...) { body } Declares the body, lets the backend emit its entries,
 * then opens the body.
 */
#define CUBE_KERNEL(name, ...)                                                 \
    typedef struct name##__shared_t {                                          \
        char cube__unused;                                                     \
        CUBE__EACH(CUBE__SHF, CUBE__NARGS(__VA_ARGS__), __VA_ARGS__)           \
    } name##__shared_t;                                                        \
    static CUBE__INLINE void name##__body(                                     \
        const cube__unit cube__u,                                              \
        CUBE__UNUSED CUBE__SINK_AS void *cube__sinkp CUBE__EACH(               \
            CUBE__PARAM, CUBE__NARGS(__VA_ARGS__), __VA_ARGS__));              \
    CUBE__ENTRY(name, CUBE__NARGS(__VA_ARGS__), __VA_ARGS__)                   \
    static CUBE__INLINE void name##__body(                                     \
        const cube__unit cube__u,                                              \
        CUBE__UNUSED CUBE__SINK_AS void *cube__sinkp CUBE__EACH(               \
            CUBE__PARAM, CUBE__NARGS(__VA_ARGS__), __VA_ARGS__))

/* --- positions
 * ---------------------------------------------------------------- */
#define UNIT_POS_X (cube__u.ux)
#define UNIT_POS_Y (cube__u.uy)
#define UNIT_POS_Z (cube__u.uz)
#define CUBE_POS_X (cube__u.cx)
#define CUBE_POS_Y (cube__u.cy)
#define CUBE_POS_Z (cube__u.cz)
#define CUBE_DIM_X (cube__u.dx)
#define CUBE_DIM_Y (cube__u.dy)
#define CUBE_DIM_Z (cube__u.dz)
#define CUBE_COUNT_X (cube__u.nx)
#define CUBE_COUNT_Y (cube__u.ny)
#define CUBE_COUNT_Z (cube__u.nz)
#define ABSOLUTE_POS_X (cube__u.ax)
#define ABSOLUTE_POS_Y (cube__u.ay)
#define ABSOLUTE_POS_Z (cube__u.az)
/* Linear positions, x fastest. */
#define UNIT_POS                                                               \
    (UNIT_POS_X + CUBE_DIM_X * (UNIT_POS_Y + CUBE_DIM_Y * UNIT_POS_Z))
#define CUBE_DIM (CUBE_DIM_X * CUBE_DIM_Y * CUBE_DIM_Z)
#define CUBE_POS                                                               \
    (CUBE_POS_X + CUBE_COUNT_X * (CUBE_POS_Y + CUBE_COUNT_Y * CUBE_POS_Z))
#define CUBE_COUNT (CUBE_COUNT_X * CUBE_COUNT_Y * CUBE_COUNT_Z)
#define ABSOLUTE_POS                                                           \
    (ABSOLUTE_POS_X +                                                          \
     CUBE_COUNT_X * CUBE_DIM_X *                                               \
         (ABSOLUTE_POS_Y + CUBE_COUNT_Y * CUBE_DIM_Y * ABSOLUTE_POS_Z))

/* --- buffer access
 * -------------------------------------------------------------- */
/* Number of elements a buffer parameter holds. */
#define CUBE_LEN(buf) (buf##__len)

/* Element i of a buffer, as an lvalue. With bounds checking (the launch's
 * CUBE_LAUNCH_CHECKED), an index past the end reads 0 and a write to it is
 * dropped: it lands in a zeroed per-unit scratch slot, never in memory out of
 * range. Without, it is plain indexing. */
#if CUBE_VALIDATE
/* Validating (CUBE_LAUNCH_VALIDATE): as checked, and the access is counted
 * and the launch's first one recorded (cube__oob, below). */
#define CUBE_AT(buf, i)                                                        \
    (*(((CUBE__U64)(i) < buf##__len)                                           \
           ? &(buf)[i]                                                         \
           : (CUBE__TYPEOF(&(buf)[0]))cube__oob(cube__sinkp, buf##__pi, #buf,  \
                                                (CUBE__U64)(i), buf##__len)))
#elif CUBE_CHECKED
#define CUBE_AT(buf, i)                                                        \
    (*(((CUBE__U64)(i) < buf##__len)                                           \
           ? &(buf)[i]                                                         \
           : (CUBE__TYPEOF(&(buf)[0]))cube__zero_sink(cube__sinkp)))
#else
#define CUBE_AT(buf, i) ((buf)[i])
#endif

/* A per-unit slot big enough for any element type. */
typedef union cube__sink_t {
    CUBE__U64 u[8];
    double d[8];
    unsigned char bytes[64];
} cube__sink_t;

/* Zeroed byte by byte: character stores may alias the element type the
 * slot is then read as, so the compiler cannot drop them. */
static CUBE__INLINE CUBE__SINK_AS void *cube__zero_sink(CUBE__SINK_AS void *p)
{
    CUBE__SINK_AS unsigned char *b = (CUBE__SINK_AS unsigned char *)p;
    for (int k = 0; k < 64; k++)
        b[k] = 0;
    return p;
}

/* What a validating launch learns of its out-of-range accesses; the
 * runtime zeroes it before the launch and reads it after. Its layout
 * must match validate_record in src/backends/common/validate.h, which
 * the backends read it as. */
#define CUBE__OOB_NAME 32
typedef struct cube__oob_rec {
    CUBE__U64 count; /* accesses out of range (atomic) */
    CUBE__U64 index; /* the first one's index and buffer length */
    CUBE__U64 len;
    unsigned int param;        /* its parameter position */
    char name[CUBE__OOB_NAME]; /* its parameter name, NUL-terminated */
} cube__oob_rec;

/* A validating launch's per-unit slot: the sink first (cube__zero_sink
 * clears it), then where to report. */
typedef struct cube__vsink_t {
    cube__sink_t sink;
    CUBE__SINK_AS cube__oob_rec *rec;
} cube__vsink_t;

#if CUBE_VALIDATE
#ifdef CUBE__OOB_GLOBAL
CUBE__OOB_GLOBAL /* the backend's record, where it keeps one per module */
#endif
    /* Out of the hot path: counts the access, records it when it is the
     * launch's first (the unit whose increment saw 0 writes the fields; the
     * runtime reads them once every unit is done), and hands out the zeroed
     * slot as checked mode does. */
    CUBE__COLD CUBE__SINK_AS void *
    cube__oob(CUBE__SINK_AS void *sinkp, unsigned int param,
              CUBE__CONST_AS const char *name, CUBE__U64 index, CUBE__U64 len)
{
    CUBE__SINK_AS cube__vsink_t *v = (CUBE__SINK_AS cube__vsink_t *)sinkp;
    CUBE__SINK_AS cube__oob_rec *r = v->rec;
    if (CUBE__OOB_INC(&r->count) == 0) {
        r->index = index;
        r->len = len;
        r->param = param;
        int k = 0;
        for (; k < CUBE__OOB_NAME - 1 && name[k]; k++)
            r->name[k] = name[k];
        r->name[k] = 0;
    }
    return cube__zero_sink(sinkp);
}
#endif

#define CUBE_MIN(a, b) ((a) < (b) ? (a) : (b))
#define CUBE_MAX(a, b) ((a) > (b) ? (a) : (b))
