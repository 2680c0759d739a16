/* Collectives between devices whose buffers are host memory (the CPU
 * backend's virtual devices, the null backend): the ranks are threads of
 * one process, so every rank's buffers are plain addresses here and a
 * collective is loops over them.
 *
 * The work of one collective is cut into chunks of at most CHUNK_BYTES of
 * one destination range; each rank's call claims chunks from a counter in
 * the set's shared bytes until none is left, then waits until every chunk
 * is done, so the ranks that call at once share the work and a thread
 * that drives every rank (a group) does it all. Reductions combine the
 * ranks in rank order, element by element, so every rank gets the same
 * bytes; halves are combined in float and rounded once per step as a
 * device would.
 */
#include <math.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "backends/common/host_memory.h"
#include "cubert/comm.h"

#define CHUNK_BYTES (16u * 1024u)

typedef struct chunk_counter {
    atomic_uint_fast64_t next; /* the next chunk to claim */
    atomic_uint_fast64_t done; /* chunks finished */
} chunk_counter;

_Static_assert(sizeof(chunk_counter) <= CUBE_COLLECTIVE_SHARED,
               "the shared bytes hold the counters");

static unsigned char *at(const cube_binding *b)
{
    return (unsigned char *)(uintptr_t)b->storage->address + b->offset;
}

/* --- halves --- */

/* A float's bits, and the float of some bits. */
static uint32_t f32_bits(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    return x;
}

static float f32_of_bits(uint32_t bits)
{
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static float f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 31u,
             man = h & 1023u, bits;
    if (exp == 0) {
        if (man == 0) {
            bits = sign;
        } else { /* subnormal: normalize */
            int e = -1;
            do {
                e++;
                man <<= 1;
            } while (!(man & 1024u));
            bits =
                sign | ((uint32_t)(127 - 15 - e) << 23) | ((man & 1023u) << 13);
        }
    } else if (exp == 31) {
        bits = sign | 0x7f800000u | (man << 13);
    } else {
        bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    return f32_of_bits(bits);
}

static uint16_t f32_to_f16(float f)
{
    uint32_t x = f32_bits(f);
    uint32_t sign = (x >> 16) & 0x8000u;
    uint32_t exp = (x >> 23) & 255u, man = x & 0x7fffffu;
    if (exp == 255) /* inf, nan (kept quiet) */
        return (uint16_t)(sign | 0x7c00u | (man ? 0x200u : 0));
    int e = (int)exp - 127 + 15;
    if (e >= 31)
        return (uint16_t)(sign | 0x7c00u);
    if (e <= 0) {
        if (e < -10)
            return (uint16_t)sign;
        man |= 0x800000u;
        uint32_t shift = (uint32_t)(14 - e);
        uint32_t half = man >> shift, rest = man & ((1u << shift) - 1u),
                 mid = 1u << (shift - 1);
        if (rest > mid || (rest == mid && (half & 1u)))
            half++;
        return (uint16_t)(sign | half);
    }
    uint32_t half = sign | ((uint32_t)e << 10) | (man >> 13),
             rest = man & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (half & 1u)))
        half++; /* may carry into the exponent, which rounds right */
    return (uint16_t)half;
}

static float bf16_to_f32(uint16_t h)
{
    return f32_of_bits((uint32_t)h << 16);
}

static uint16_t f32_to_bf16(float f)
{
    uint32_t x = f32_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) /* nan: keep it one */
        return (uint16_t)((x >> 16) | 0x40u);
    x += 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}

/* --- reductions --- */

/* acc[i] = acc[i] op in[i] for n elements of one type. */
#define COMBINE(T, acc, in, n, op)                                             \
    do {                                                                       \
        T *a_ = (T *)(acc);                                                    \
        const T *b_ = (const T *)(in);                                         \
        switch (op) {                                                          \
        case CUBE_REDUCE_SUM:                                                  \
        case CUBE_REDUCE_AVG:                                                  \
            for (size_t i_ = 0; i_ < (n); i_++)                                \
                a_[i_] = (T)(a_[i_] + b_[i_]);                                 \
            break;                                                             \
        case CUBE_REDUCE_PROD:                                                 \
            for (size_t i_ = 0; i_ < (n); i_++)                                \
                a_[i_] = (T)(a_[i_] * b_[i_]);                                 \
            break;                                                             \
        case CUBE_REDUCE_MIN:                                                  \
            for (size_t i_ = 0; i_ < (n); i_++)                                \
                a_[i_] = b_[i_] < a_[i_] ? b_[i_] : a_[i_];                    \
            break;                                                             \
        case CUBE_REDUCE_MAX:                                                  \
            for (size_t i_ = 0; i_ < (n); i_++)                                \
                a_[i_] = b_[i_] > a_[i_] ? b_[i_] : a_[i_];                    \
            break;                                                             \
        }                                                                      \
    } while (0)

/* acc[i] /= ranks, for the average. */
#define DIVIDE(T, acc, n, ranks)                                               \
    do {                                                                       \
        T *a_ = (T *)(acc);                                                    \
        for (size_t i_ = 0; i_ < (n); i_++)                                    \
            a_[i_] = (T)(a_[i_] / (T)(ranks));                                 \
    } while (0)

/* Halves: each step in float, rounded back, as a device reducing in the
 * element type would. */
static void combine_half(uint16_t *acc, const uint16_t *in, size_t n,
                         uint32_t op, int bf)
{
    for (size_t i = 0; i < n; i++) {
        float a = bf ? bf16_to_f32(acc[i]) : f16_to_f32(acc[i]);
        float b = bf ? bf16_to_f32(in[i]) : f16_to_f32(in[i]);
        float r = a;
        switch (op) {
        case CUBE_REDUCE_SUM:
        case CUBE_REDUCE_AVG: r = a + b; break;
        case CUBE_REDUCE_PROD: r = a * b; break;
        case CUBE_REDUCE_MIN: r = b < a ? b : a; break;
        case CUBE_REDUCE_MAX: r = b > a ? b : a; break;
        }
        acc[i] = bf ? f32_to_bf16(r) : f32_to_f16(r);
    }
}

static void divide_half(uint16_t *acc, size_t n, uint32_t ranks, int bf)
{
    for (size_t i = 0; i < n; i++) {
        float a = bf ? bf16_to_f32(acc[i]) : f16_to_f32(acc[i]);
        a /= (float)ranks;
        acc[i] = bf ? f32_to_bf16(a) : f32_to_f16(a);
    }
}

void host_reduce_combine(void *acc, const void *in, size_t n, uint32_t dtype,
                         uint32_t op)
{
    switch (dtype) {
    case CUBE_DTYPE_I8: COMBINE(int8_t, acc, in, n, op); break;
    case CUBE_DTYPE_U8: COMBINE(uint8_t, acc, in, n, op); break;
    case CUBE_DTYPE_I32: COMBINE(int32_t, acc, in, n, op); break;
    case CUBE_DTYPE_U32: COMBINE(uint32_t, acc, in, n, op); break;
    case CUBE_DTYPE_I64: COMBINE(int64_t, acc, in, n, op); break;
    case CUBE_DTYPE_U64: COMBINE(uint64_t, acc, in, n, op); break;
    case CUBE_DTYPE_F32: COMBINE(float, acc, in, n, op); break;
    case CUBE_DTYPE_F64: COMBINE(double, acc, in, n, op); break;
    case CUBE_DTYPE_F16: combine_half(acc, in, n, op, 0); break;
    case CUBE_DTYPE_BF16: combine_half(acc, in, n, op, 1); break;
    }
}

void host_reduce_divide(void *acc, size_t n, uint32_t dtype, uint32_t ranks)
{
    switch (dtype) {
    case CUBE_DTYPE_I8: DIVIDE(int8_t, acc, n, ranks); break;
    case CUBE_DTYPE_U8: DIVIDE(uint8_t, acc, n, ranks); break;
    case CUBE_DTYPE_I32: DIVIDE(int32_t, acc, n, ranks); break;
    case CUBE_DTYPE_U32: DIVIDE(uint32_t, acc, n, ranks); break;
    case CUBE_DTYPE_I64: DIVIDE(int64_t, acc, n, ranks); break;
    case CUBE_DTYPE_U64: DIVIDE(uint64_t, acc, n, ranks); break;
    case CUBE_DTYPE_F32: DIVIDE(float, acc, n, ranks); break;
    case CUBE_DTYPE_F64: DIVIDE(double, acc, n, ranks); break;
    case CUBE_DTYPE_F16: divide_half(acc, n, ranks, 0); break;
    case CUBE_DTYPE_BF16: divide_half(acc, n, ranks, 1); break;
    }
}

/* Writes at or above which a collective's destinations are written with
 * streaming stores: what no cache holds anyway, as memcpy does at such
 * sizes. Below it, normal stores leave the result in the cache. */
#define STREAM_BYTES ((uint64_t)96 << 20)

/* Copies a chunk of a destination. With `stream`, streaming stores skip
 * reading each destination line into the cache first, a third of the
 * memory traffic of a large collective. */
static void store_chunk(unsigned char *dst, const unsigned char *src,
                        size_t bytes, int stream)
{
#if defined(__SSE2__)
    if (stream && ((uintptr_t)dst | (uintptr_t)src | bytes) % 16 == 0) {
        for (size_t i = 0; i < bytes; i += 16)
            _mm_stream_si128(
                (__m128i *)(void *)(dst + i),
                _mm_load_si128((const __m128i *)(const void *)(src + i)));
        return;
    }
#else
    (void)stream;
#endif
    memcpy(dst, src, bytes);
}

/* acc = op over the `ranks` sources at byte offset src_off, `n` elements
 * (at most a chunk): a buffer of its own, so a destination written from
 * it may be one of the sources. */
static void reduce_chunk(unsigned char *acc, const cube_collective *calls,
                         uint32_t ranks, uint64_t src_off, size_t n,
                         uint32_t es, uint32_t dtype, uint32_t op)
{
    memcpy(acc, at(&calls[0].src) + src_off, n * es);
    for (uint32_t r = 1; r < ranks; r++)
        host_reduce_combine(acc, at(&calls[r].src) + src_off, n, dtype, op);
    if (op == CUBE_REDUCE_AVG)
        host_reduce_divide(acc, n, dtype, ranks);
}

/* Copies `bytes` from `s` to every rank's destination at `off`, but for a
 * destination that is `s` itself (in place). */
static void copy_to_every_rank(const cube_collective_set *set, uint32_t ranks,
                               const unsigned char *s, uint64_t off,
                               size_t bytes)
{
    for (uint32_t r = 0; r < ranks; r++) {
        unsigned char *d = at(&set->calls[r].dst) + off;
        if (d != s)
            memmove(d, s, bytes);
    }
}

/* Runs chunk `c` of the set's collective. `per` is the chunks of one
 * destination range of `count` elements. */
static void run_chunk(const cube_collective_set *set, uint64_t c, uint64_t per,
                      uint64_t elems_per_chunk, int stream)
{
    const cube_collective *first = &set->calls[0];
    uint32_t es = cube_dtype_size((cube_dtype)first->dtype);
    uint32_t ranks = first->nranks;
    uint64_t part = c / per, within = c % per;
    uint64_t e0 = within * elems_per_chunk;
    size_t n = (size_t)(first->count - e0 < elems_per_chunk ? first->count - e0
                                                            : elems_per_chunk);
    uint64_t off = e0 * es;
    size_t bytes = n * es;
    _Alignas(64) unsigned char acc[CHUNK_BYTES];
    switch (first->kind) {
    case CUBE_COLLECTIVE_ALL_REDUCE:
        /* Reduced once, written to every rank's destination. */
        reduce_chunk(acc, set->calls, ranks, off, n, es, first->dtype,
                     first->op);
        for (uint32_t r = 0; r < ranks; r++)
            store_chunk(at(&set->calls[r].dst) + off, acc, bytes, stream);
        break;
    case CUBE_COLLECTIVE_REDUCE:
        reduce_chunk(acc, set->calls, ranks, off, n, es, first->dtype,
                     first->op);
        store_chunk(at(&set->calls[first->root].dst) + off, acc, bytes, stream);
        break;
    case CUBE_COLLECTIVE_BROADCAST:
        copy_to_every_rank(set, ranks, at(&set->calls[first->root].src) + off,
                           off, bytes);
        break;
    case CUBE_COLLECTIVE_ALL_GATHER:
        /* Part `part` is rank part's contribution, at part * count. */
        copy_to_every_rank(set, ranks, at(&set->calls[part].src) + off,
                           part * first->count * es + off, bytes);
        break;
    case CUBE_COLLECTIVE_REDUCE_SCATTER: {
        /* Part `part` is rank part's result, from part * count of every
         * source. */
        uint64_t soff = part * first->count * es + off;
        reduce_chunk(acc, set->calls, ranks, soff, n, es, first->dtype,
                     first->op);
        store_chunk(at(&set->calls[part].dst) + off, acc, bytes, stream);
        break;
    }
    case CUBE_COLLECTIVE_SEND:
    case CUBE_COLLECTIVE_RECV:
        memmove(at(&set->calls[1].dst) + off, at(&set->calls[0].src) + off,
                bytes);
        break;
    }
}

/* Where the work of the set's collective splits: parts of `per` chunks. */
static uint64_t chunk_plan(const cube_collective_set *set, uint64_t *per,
                           uint64_t *elems)
{
    const cube_collective *first = &set->calls[0];
    uint32_t es = cube_dtype_size((cube_dtype)first->dtype);
    *elems = CHUNK_BYTES / es;
    *per = (first->count + *elems - 1) / *elems;
    uint64_t parts = first->kind == CUBE_COLLECTIVE_ALL_GATHER ||
                             first->kind == CUBE_COLLECTIVE_REDUCE_SCATTER
                         ? first->nranks
                         : 1;
    return parts * *per;
}

cube_error *host_collective(cube_server *server, cube_server_stream *stream,
                            cube_backend_comm *comm,
                            const cube_collective_set *set)
{
    (void)server;
    (void)comm;
    uint64_t t0 = host_busy_begin(stream);
    chunk_counter *cc = set->shared;
    uint64_t per, elems, total = chunk_plan(set, &per, &elems);
    const cube_collective *first = &set->calls[0];
    uint64_t written =
        first->count * cube_dtype_size((cube_dtype)first->dtype) *
        first->nranks *
        (first->kind == CUBE_COLLECTIVE_ALL_GATHER ? first->nranks : 1);
    int streaming = written >= STREAM_BYTES;
    uint64_t c;
    while ((c = atomic_fetch_add_explicit(&cc->next, 1, memory_order_relaxed)) <
           total) {
        run_chunk(set, c, per, elems, streaming);
#if defined(__SSE2__)
        /* Streaming stores are not ordered by the release below. */
        _mm_sfence();
#endif
        atomic_fetch_add_explicit(&cc->done, 1, memory_order_release);
    }
    /* The last chunks may be another rank's, still running: this rank's
     * destination is written when every chunk is. */
    for (unsigned spins = 0;
         atomic_load_explicit(&cc->done, memory_order_acquire) < total; spins++)
        sched_yield();
    host_busy_end(stream, t0);
    return NULL;
}

cube_error *host_copy_to_peer(cube_server *server, cube_server_stream *stream,
                              const cube_binding *src, cube_server *peer,
                              cube_server_stream *peer_stream,
                              const cube_binding *dst)
{
    (void)server;
    (void)stream;
    (void)peer;
    uint64_t t0 = host_busy_begin(peer_stream);
    memmove(at(dst), at(src), (size_t)dst->size);
    host_busy_end(peer_stream, t0);
    return NULL;
}

/* The ranks need no state of their own (init is left out, so every
 * rank's is NULL) and nothing is grouped: a thread that drives several
 * ranks does each one's share as it issues it. */
const cube_comm_vtable host_comm_vtable = {
    .collective = host_collective,
};
