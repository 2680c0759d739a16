/* Stress: threads sharing the client on streams of their own.
 *
 * - Eight threads each cycle over three streams and make thousands of
 *   seeded-random mixed operations (allocations, full, partial and strided
 *   writes and reads, launches, slices, references, barriers, cleanups,
 *   profile windows, graph captures and replays), while a host model of
 *   every live buffer says what each read must return. Buffers also move
 *   between threads through a shared pool: written on one thread's stream,
 *   read and rewritten on another's.
 * - A producer rewrites a buffer in place on one stream while a consumer
 *   computes from it on another: each round the consumer sees exactly the
 *   round it was told about, and the producer's next rewrite never reaches
 *   a read the consumer issued before acknowledging.
 * - A launch failure on one stream reaches a launch, a read, a check and a
 *   sync on others, and a full write on yet another clears it.
 *
 * Environment: CUBE_STRESS_OPS sets the operations per thread of the mixed
 * test (the default depends on the build, see ST_DEFAULT_OPS), and
 * CUBE_STRESS_SEED its seed; CUBE_STRESS_SECONDS is the time after which
 * its threads stop early (a safety net, 40 s by default);
 * CUBE_STRESS_VERBOSE prints what the threads did.
 */
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "conformance.h"

#define EXEC CUBE_LAUNCH_EXECUTE
#define CHECKED CUBE_LAUNCH_CHECKED

/* --- shared helpers --- */

static double st_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* A positive number from the environment, else `fallback`. */
static long long st_env(const char *name, long long fallback)
{
    const char *s = getenv(name);
    if (!s || !*s)
        return fallback;
    char *end = NULL;
    errno = 0;
    long long v = strtoll(s, &end, 0);
    if (errno || !end || *end || v <= 0)
        return fallback;
    return v;
}

static float st_f(uint32_t bits)
{
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

static uint32_t st_bits(float f)
{
    uint32_t b;
    memcpy(&b, &f, sizeof b);
    return b;
}

static uint64_t st_next(uint64_t *s)
{
    uint64_t x = *s;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *s = x;
    return x * 2685821657736338717ull;
}

/* Uniform enough in [0, n); n > 0. */
static uint32_t st_below(uint64_t *s, uint32_t n)
{
    return (uint32_t)((st_next(s) >> 32) % n);
}

/* Compiles the kernels the threads launch, plain and bounds-checked,
 * before they start: the threads measure sharing, not the compiler. */
static void st_warm_kernels(void)
{
    cube_handle h = conf_empty(256);
    cube_arg f[2] = {cube_arg_buffer(h), cube_arg_u32(0)};
    cube_arg s[3] = {cube_arg_buffer(h), cube_arg_buffer(h), cube_arg_f32(1)};
    cube_count one = cube_count_static(1, 1, 1);
    for (uint32_t checked = 0; checked <= CHECKED; checked += CHECKED) {
        uint32_t mode = CUBE_LAUNCH_SKIP | checked;
        CONF_OK(conf_launch(conf.k.fill, one, f, 2, mode));
        CONF_OK(conf_launch(conf.k.oob_write, one, f, 2, mode));
        CONF_OK(conf_launch(conf.k.scale, one, s, 3, mode));
        CONF_OK(conf_launch(conf.k.scale_add, one, s, 3, mode));
    }
    conf_release(h);
}

/* ========================================================================
 * Mixed operations from eight threads
 * ======================================================================== */

/* Operations per thread by default: a few seconds of work in a plain build,
 * a few more under a sanitizer (ThreadSanitizer is the slowest by far). */
#if defined(__SANITIZE_THREAD__)
#define ST_DEFAULT_OPS 10000
#elif defined(__SANITIZE_ADDRESS__)
#define ST_DEFAULT_OPS 40000
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define ST_DEFAULT_OPS 10000
#elif __has_feature(address_sanitizer)
#define ST_DEFAULT_OPS 40000
#endif
#endif
#ifndef ST_DEFAULT_OPS
#define ST_DEFAULT_OPS 150000
#endif

enum {
    ST_THREADS = 8,
    ST_STREAMS = 3,
    ST_MAX_REFS = 40,
    ST_POOL_CAP = 16,
    ST_DEFAULT_SECONDS = 40
};

/* Float values stay integers no larger than this, so that every kernel
 * result is exact (fused or not) and the model can predict it bit for bit;
 * a result past it becomes unknown to the model. */
#define ST_LIMIT 4194304.0

/* Ids below 2^63 never alias a thread's own stream. */
#define ST_STREAM_BASE 0x5715E55000000000ull

typedef enum st_kind { ST_F32 = 0, ST_U32 = 1 } st_kind;

/* What one allocation holds, as far as the thread that owns it knows. */
typedef struct st_buf {
    st_kind kind;
    uint32_t n;         /* 4-byte elements */
    uint32_t *w;        /* the elements' bits */
    unsigned char *def; /* 1: the element's value is known */
    int refs;           /* st_ref entries (or pool items) naming it */
} st_buf;

/* A handle the thread holds: `holds` references on it, naming elements
 * [off, off + len) of `b`. */
typedef struct st_ref {
    cube_handle h;
    st_buf *b;
    uint32_t off, len;
    int holds;
} st_ref;

/* A buffer handed from one thread to another: one reference to a handle
 * over the whole allocation, and its model. */
typedef struct st_item {
    cube_handle h;
    st_buf *b;
    int from;
} st_item;

typedef struct st_pool {
    pthread_mutex_t mu;
    st_item items[ST_POOL_CAP];
    int n;
} st_pool;

typedef enum st_op {
    OP_CREATE,
    OP_EMPTY,
    OP_WRITE_FULL,
    OP_WRITE_PREFIX,
    OP_WRITE_BYTES,
    OP_WRITE_STRIDED,
    OP_READ_FULL,
    OP_READ_STRIDED,
    OP_READ_ASYNC,
    OP_READ_BATCH,
    OP_LAUNCH,
    OP_SLICE,
    OP_RETAIN,
    OP_RELEASE,
    OP_CHECK,
    OP_FLUSH,
    OP_STREAM,
    OP_MEMORY,
    OP_PROFILE,
    OP_GRAPH,
    OP_GIVE,
    OP_TAKE,
    OP_COUNT
} st_op;

static const char *const st_op_names[OP_COUNT] = {
    "create",  "empty",   "write", "prefix", "bytes",  "strided-w",
    "read",    "read2d",  "async", "batch",  "launch", "slice",
    "retain",  "release", "check", "flush",  "stream", "memory",
    "profile", "graph",   "give",  "take"};

/* Relative frequencies of the operations. */
static const uint32_t st_weights[OP_COUNT] = {8, 3, 7, 4, 3, 4, 9, 4, 3, 2, 16,
                                              5, 3, 9, 4, 2, 6, 1, 1, 1, 3, 3};

typedef struct st_worker {
    int id;
    uint64_t rng;
    long long ops, done;
    double deadline;
    cube_stream_id streams[ST_STREAMS];
    int cur;
    st_ref refs[ST_MAX_REFS];
    int nrefs;
    st_pool *pool;
    long long count[OP_COUNT];
    long long launches, verified, handed, taken, replays;
    int failures;
    char first[1024];
} st_worker;

/* cmocka's asserts stay on the main thread: workers record. */
static void st_fail(st_worker *w, int line, const char *what, cube_error *err)
{
    if (w->failures++ == 0) {
        char *text = err ? cube_error_format(err) : NULL;
        snprintf(w->first, sizeof w->first,
                 "thread %d, operation %lld, stream %d (%s:%d): %s%s%s", w->id,
                 w->done, w->cur, __FILE__, line, what, text ? ": " : "",
                 text ? text : "");
        free(text);
    }
    cube_error_free(err);
}

static int st_ok_at(st_worker *w, cube_error *err, const char *expr, int line)
{
    if (!err)
        return 1;
    st_fail(w, line, expr, err);
    return 0;
}
#define ST_OK(w, expr) st_ok_at((w), (expr), #expr, __LINE__)

static void st_failf(st_worker *w, int line, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    st_fail(w, line, msg, NULL);
}

/* --- the model --- */

static st_buf *st_buf_new(st_kind kind, uint32_t n)
{
    st_buf *b = calloc(1, sizeof *b);
    if (!b)
        return NULL;
    b->w = calloc(n, sizeof *b->w);
    b->def = calloc(n, 1);
    if (!b->w || !b->def) {
        free(b->w);
        free(b->def);
        free(b);
        return NULL;
    }
    b->kind = kind;
    b->n = n;
    return b;
}

static void st_buf_free(st_buf *b)
{
    if (!b)
        return;
    free(b->w);
    free(b->def);
    free(b);
}

/* A random element of `kind`: any bits, or a small integer float. */
static uint32_t st_value(st_worker *w, st_kind kind)
{
    if (kind == ST_U32)
        return (uint32_t)st_next(&w->rng);
    return st_bits((float)((int)st_below(&w->rng, 129) - 64));
}

/* Mostly small and medium buffers, a few tiny, a rare large one. */
static uint32_t st_size(st_worker *w)
{
    uint32_t r = st_below(&w->rng, 200);
    if (r < 2)
        return 65536 + st_below(&w->rng, 196608);
    if (r < 40)
        return 1 + st_below(&w->rng, 16);
    return 1 + st_below(&w->rng, 2048);
}

static st_ref *st_add(st_worker *w, cube_handle h, st_buf *b, uint32_t off,
                      uint32_t len)
{
    st_ref *r = &w->refs[w->nrefs++];
    r->h = h;
    r->b = b;
    r->off = off;
    r->len = len;
    r->holds = 1;
    b->refs++;
    return r;
}

/* Forgets refs[i] (its references are already released). */
static void st_drop(st_worker *w, int i)
{
    st_buf *b = w->refs[i].b;
    w->refs[i] = w->refs[--w->nrefs];
    if (--b->refs == 0)
        st_buf_free(b);
}

/* A random ref of `kind` (-1: any), or -1. */
static int st_pick(st_worker *w, int kind)
{
    if (w->nrefs == 0)
        return -1;
    uint32_t start = st_below(&w->rng, (uint32_t)w->nrefs);
    for (int k = 0; k < w->nrefs; k++) {
        int i = (int)((start + (uint32_t)k) % (uint32_t)w->nrefs);
        if (kind < 0 || (int)w->refs[i].b->kind == kind)
            return i;
    }
    return -1;
}

/* Compares got[k] with the model element at pos[k] (k when pos is NULL) of
 * r's range; unknown elements are skipped. */
static int st_compare(st_worker *w, const st_ref *r, const uint32_t *got,
                      uint32_t count, const uint32_t *pos, const char *what,
                      int line)
{
    const st_buf *b = r->b;
    for (uint32_t k = 0; k < count; k++) {
        uint32_t p = r->off + (pos ? pos[k] : k);
        if (!b->def[p])
            continue;
        int same = b->kind == ST_U32 ? got[k] == b->w[p]
                                     : st_f(got[k]) == st_f(b->w[p]);
        w->verified++;
        if (!same) {
            st_failf(w, line,
                     "%s: element %u of a %s range [%u, +%u) of a %u-element "
                     "buffer is 0x%08x, the model says 0x%08x",
                     what, pos ? pos[k] : k, b->kind == ST_U32 ? "u32" : "f32",
                     r->off, r->len, b->n, got[k], b->w[p]);
            return 0;
        }
    }
    return 1;
}

/* --- copy descriptors over a ref --- */

typedef enum st_shape {
    SH_FULL,    /* every element, contiguous, elem_size 4 */
    SH_PREFIX,  /* the first elements, contiguous */
    SH_STRIDED, /* a 2-D block with row and column strides */
    SH_WIDE     /* every element, as 1-, 2-, 4- or 8-byte elements */
} st_shape;

typedef struct st_view {
    cube_copy_desc d;
    uint32_t count; /* model elements the view covers */
    uint32_t *pos;  /* their positions in the range; NULL: 0..count-1 */
    uint64_t bytes;
} st_view;

static int st_view_make(st_worker *w, const st_ref *r, st_shape shape,
                        st_view *v)
{
    memset(v, 0, sizeof *v);
    uint32_t len = r->len;
    v->d.handle = r->h;
    v->d.rank = 1;
    v->d.elem_size = 4;
    if (shape == SH_FULL || shape == SH_WIDE) {
        uint32_t es = 4;
        if (shape == SH_WIDE) {
            static const uint32_t sizes[4] = {1, 2, 4, 8};
            es = sizes[st_below(&w->rng, (len % 2) ? 3 : 4)];
        }
        v->d = cube_copy_desc_contiguous(r->h, len * 4ull, es);
        v->count = len;
    } else if (shape == SH_PREFIX) {
        v->count = 1 + st_below(&w->rng, len);
        v->d.shape[0] = v->count;
    } else {
        /* rows x cols, element (i, j) at i * s0 + j * s1. */
        uint32_t s1 = (len > 1 && st_below(&w->rng, 3) == 0) ? 2 : 1;
        uint32_t maxc = (len - 1) / s1 + 1;
        uint32_t cols = 1 + st_below(&w->rng, maxc < 48 ? maxc : 48);
        uint32_t span = (cols - 1) * s1 + 1;
        uint32_t s0 = span + st_below(&w->rng, 9);
        uint32_t maxr = (len - span) / s0 + 1;
        uint32_t rows = 1 + st_below(&w->rng, maxr < 48 ? maxr : 48);
        v->d.rank = 2;
        v->d.shape[0] = rows;
        v->d.shape[1] = cols;
        v->d.strides[0] = s0;
        v->d.strides[1] = s1;
        v->count = rows * cols;
        v->pos = malloc(v->count * sizeof *v->pos);
        if (!v->pos) {
            st_failf(w, __LINE__, "out of host memory");
            return 0;
        }
        for (uint32_t i = 0; i < rows; i++)
            for (uint32_t j = 0; j < cols; j++)
                v->pos[i * cols + j] = i * s0 + j * s1;
    }
    v->bytes = v->count * 4ull;
    return 1;
}

/* --- reads --- */

/* Reads the view of r and compares it with the model. */
static void st_read_view(st_worker *w, const st_ref *r, st_shape shape,
                         int async)
{
    st_view v;
    if (!st_view_make(w, r, shape, &v))
        return;
    uint32_t *got = malloc(v.bytes);
    if (!got) {
        free(v.pos);
        st_failf(w, __LINE__, "out of host memory");
        return;
    }
    memset(got, 0xEE, v.bytes);
    void *dst[1] = {got};
    uint64_t sz[1] = {v.bytes};
    int ok;
    if (async) {
        cube_future *f = NULL;
        ok = ST_OK(w, cube_read_async(conf.client, &v.d, dst, sz, 1, &f));
        if (ok) {
            ok = ST_OK(w, cube_future_wait(f));
            if (ok && !cube_future_ready(f))
                ok = 0, st_failf(w, __LINE__, "a waited future is not ready");
            if (ok && cube_future_wait(f) != NULL)
                ok = 0, st_failf(w, __LINE__, "a second wait returned a value");
            cube_future_free(f);
        }
    } else {
        ok = ST_OK(w, cube_read(conf.client, &v.d, dst, sz, 1));
    }
    if (ok)
        st_compare(w, r, got, v.count, v.pos, async ? "async read" : "read",
                   __LINE__);
    free(got);
    free(v.pos);
}

static void op_read(st_worker *w, st_op op)
{
    int i = st_pick(w, -1);
    if (i < 0)
        return;
    if (op == OP_READ_STRIDED)
        st_read_view(w, &w->refs[i], SH_STRIDED, 0);
    else if (op == OP_READ_ASYNC)
        st_read_view(w, &w->refs[i],
                     st_below(&w->rng, 2) ? SH_FULL : SH_STRIDED, 1);
    else
        st_read_view(w, &w->refs[i], SH_WIDE, 0);
}

/* Two whole ranges in one call. */
static void op_read_batch(st_worker *w)
{
    int a = st_pick(w, -1), b = st_pick(w, -1);
    if (a < 0)
        return;
    const st_ref *r[2] = {&w->refs[a], &w->refs[b]};
    cube_copy_desc d[2];
    uint32_t *got[2];
    void *dst[2];
    uint64_t sz[2];
    for (int k = 0; k < 2; k++) {
        d[k] = cube_copy_desc_contiguous(r[k]->h, r[k]->len * 4ull, 4);
        sz[k] = r[k]->len * 4ull;
        got[k] = malloc(sz[k]);
        dst[k] = got[k];
    }
    if (!got[0] || !got[1])
        st_failf(w, __LINE__, "out of host memory");
    else if (ST_OK(w, cube_read(conf.client, d, dst, sz, 2)))
        for (int k = 0; k < 2; k++)
            if (!st_compare(w, r[k], got[k], r[k]->len, NULL, "batch read",
                            __LINE__))
                break;
    free(got[0]);
    free(got[1]);
}

/* --- allocations and writes --- */

/* A new buffer (created from random contents, or empty), or -1. */
static int st_new_buffer(st_worker *w, st_kind kind, uint32_t n, int empty)
{
    if (w->nrefs >= ST_MAX_REFS)
        return -1;
    st_buf *b = st_buf_new(kind, n);
    if (!b) {
        st_failf(w, __LINE__, "out of host memory");
        return -1;
    }
    cube_handle h = {0};
    cube_error *err;
    if (empty) {
        err = cube_empty(conf.client, n * 4ull, &h);
    } else {
        for (uint32_t i = 0; i < n; i++) {
            b->w[i] = st_value(w, kind);
            b->def[i] = 1;
        }
        err = cube_create(conf.client, b->w, n * 4ull, &h);
    }
    if (!ST_OK(w, err)) {
        st_buf_free(b);
        return -1;
    }
    if (h.bits == 0) {
        st_buf_free(b);
        st_failf(w, __LINE__, "a new buffer has the zero handle");
        return -1;
    }
    st_add(w, h, b, 0, n);
    return w->nrefs - 1;
}

static void op_create(st_worker *w, int empty)
{
    st_new_buffer(w, st_below(&w->rng, 2) ? ST_U32 : ST_F32, st_size(w), empty);
}

/* Writes random values of r's kind through a view of `shape`. */
static void st_write_view(st_worker *w, st_ref *r, st_shape shape)
{
    st_view v;
    if (!st_view_make(w, r, shape, &v))
        return;
    uint32_t *src = malloc(v.bytes);
    if (!src) {
        free(v.pos);
        st_failf(w, __LINE__, "out of host memory");
        return;
    }
    for (uint32_t k = 0; k < v.count; k++)
        src[k] = st_value(w, r->b->kind);
    const void *srcs[1] = {src};
    uint64_t sz[1] = {v.bytes};
    if (ST_OK(w, cube_write(conf.client, &v.d, srcs, sz, 1)))
        for (uint32_t k = 0; k < v.count; k++) {
            uint32_t p = r->off + (v.pos ? v.pos[k] : k);
            r->b->w[p] = src[k];
            r->b->def[p] = 1;
        }
    free(src);
    free(v.pos);
}

/* Writes the first bytes of a u32 range, 1- or 2-byte elements: the last
 * element may be only partly written. */
static void st_write_bytes(st_worker *w, st_ref *r)
{
    uint32_t es = st_below(&w->rng, 2) ? 1 : 2;
    uint64_t nbytes = 1 + st_below(&w->rng, r->len * 4);
    nbytes = (nbytes + es - 1) / es * es;
    unsigned char *src = malloc(nbytes);
    if (!src) {
        st_failf(w, __LINE__, "out of host memory");
        return;
    }
    for (uint64_t k = 0; k < nbytes; k++)
        src[k] = (unsigned char)st_next(&w->rng);
    cube_copy_desc d = cube_copy_desc_contiguous(r->h, nbytes, es);
    const void *srcs[1] = {src};
    uint64_t sz[1] = {nbytes};
    if (ST_OK(w, cube_write(conf.client, &d, srcs, sz, 1))) {
        memcpy((unsigned char *)(r->b->w + r->off), src, nbytes);
        /* A partly written element is known only if it was before. */
        for (uint64_t k = 0; k < nbytes / 4; k++)
            r->b->def[r->off + k] = 1;
    }
    free(src);
}

static void op_write(st_worker *w, st_op op)
{
    int i = st_pick(w, op == OP_WRITE_BYTES ? ST_U32 : -1);
    if (i < 0)
        return;
    st_ref *r = &w->refs[i];
    if (op == OP_WRITE_BYTES)
        st_write_bytes(w, r);
    else
        st_write_view(w, r,
                      op == OP_WRITE_FULL     ? SH_FULL
                      : op == OP_WRITE_PREFIX ? SH_PREFIX
                                              : SH_STRIDED);
}

/* --- launches --- */

typedef enum st_kernel { K_FILL, K_OOB, K_SCALE, K_AXPY } st_kernel;

typedef struct st_launch {
    st_kernel kernel;
    int x, y; /* ref indices */
    uint32_t v;
    float a;
    uint32_t cubes;
    uint32_t mode;
} st_launch;

/* Whether scale(x -> y) reads only what it may: x is long enough, and x's
 * elements read are y's own or disjoint from them. */
static int st_compatible(const st_ref *x, const st_ref *y)
{
    if (x->len < y->len)
        return 0;
    if (x->b != y->b || x->off == y->off)
        return 1;
    return x->off + y->len <= y->off || y->off + y->len <= x->off;
}

/* A valid random launch of `kernel` over the thread's refs, or 0. */
static int st_pick_launch(st_worker *w, st_kernel kernel, st_launch *l)
{
    memset(l, 0, sizeof *l);
    l->kernel = kernel;
    if (kernel == K_FILL || kernel == K_OOB) {
        l->y = st_pick(w, ST_U32);
        if (l->y < 0)
            return 0;
        uint32_t len = w->refs[l->y].len;
        l->v = (uint32_t)st_next(&w->rng);
        if (kernel == K_OOB) {
            /* More units than elements: the checked launch drops the
             * writes past the range. */
            l->cubes = conf_div_up(len, 32) + 1 + st_below(&w->rng, 3);
            l->mode = CHECKED;
        } else {
            l->cubes = conf_div_up(len, 32) + st_below(&w->rng, 2);
            l->mode = st_below(&w->rng, 4) ? EXEC : CHECKED;
        }
        return 1;
    }
    l->y = st_pick(w, ST_F32);
    if (l->y < 0)
        return 0;
    l->x = l->y;
    for (int t = 0; t < 6; t++) {
        int c = st_pick(w, ST_F32);
        if (st_compatible(&w->refs[c], &w->refs[l->y])) {
            l->x = c;
            break;
        }
    }
    static const float as[5] = {-2, -1, 1, 2, 3};
    l->a = as[st_below(&w->rng, 5)];
    l->cubes = conf_div_up(w->refs[l->y].len, 64) + st_below(&w->rng, 2);
    l->mode = st_below(&w->rng, 4) ? EXEC : CHECKED;
    return 1;
}

static int st_pick_any_launch(st_worker *w, st_launch *l)
{
    st_kernel k = (st_kernel)st_below(&w->rng, 4);
    for (int t = 0; t < 4; t++)
        if (st_pick_launch(w, (st_kernel)(((int)k + t) % 4), l))
            return 1;
    return 0;
}

static cube_error *st_issue(st_worker *w, const st_launch *l)
{
    cube_arg args[3];
    size_t n;
    cube_kernel *k;
    const st_ref *y = &w->refs[l->y];
    if (l->kernel == K_FILL || l->kernel == K_OOB) {
        k = l->kernel == K_FILL ? conf.k.fill : conf.k.oob_write;
        args[0] = cube_arg_buffer(y->h);
        args[1] = cube_arg_u32(l->v);
        n = 2;
    } else {
        k = l->kernel == K_SCALE ? conf.k.scale : conf.k.scale_add;
        args[0] = cube_arg_buffer(w->refs[l->x].h);
        args[1] = cube_arg_buffer(y->h);
        args[2] = cube_arg_f32(l->a);
        n = 3;
    }
    return cube_launch(conf.client, k, cube_count_static(l->cubes, 1, 1), args,
                       n, l->mode);
}

/* What the launch does, applied to the model. */
static void st_apply(st_worker *w, const st_launch *l)
{
    const st_ref *y = &w->refs[l->y];
    st_buf *yb = y->b;
    w->launches++;
    if (l->kernel == K_FILL || l->kernel == K_OOB) {
        for (uint32_t i = 0; i < y->len; i++) {
            yb->w[y->off + i] = l->kernel == K_FILL ? l->v + i : l->v;
            yb->def[y->off + i] = 1;
        }
        return;
    }
    const st_ref *x = &w->refs[l->x];
    const st_buf *xb = x->b;
    for (uint32_t i = 0; i < y->len; i++) {
        uint32_t px = x->off + i, py = y->off + i;
        if (!xb->def[px] || (l->kernel == K_AXPY && !yb->def[py])) {
            yb->def[py] = 0;
            continue;
        }
        double r = (double)l->a * (double)st_f(xb->w[px]);
        if (l->kernel == K_AXPY)
            r += (double)st_f(yb->w[py]);
        yb->def[py] = r <= ST_LIMIT && r >= -ST_LIMIT;
        yb->w[py] = st_bits((float)r);
    }
}

static int st_launch_now(st_worker *w, const st_launch *l)
{
    if (!st_ok_at(w, st_issue(w, l), "cube_launch", __LINE__))
        return 0;
    st_apply(w, l);
    return 1;
}

static void op_launch(st_worker *w)
{
    st_launch l;
    if (!st_pick_any_launch(w, &l)) {
        op_create(w, 0);
        return;
    }
    if (st_launch_now(w, &l) && st_below(&w->rng, 2))
        st_read_view(w, &w->refs[l.y], SH_FULL, 0);
}

/* --- handles --- */

static void op_slice(st_worker *w)
{
    int i = st_pick(w, -1);
    if (i < 0 || w->nrefs >= ST_MAX_REFS)
        return;
    st_ref *r = &w->refs[i];
    uint32_t off = st_below(&w->rng, r->len);
    uint32_t len = 1 + st_below(&w->rng, r->len - off);
    cube_handle s = {0};
    if (!ST_OK(w, cube_handle_slice(conf.client, r->h, off * 4ull, len * 4ull,
                                    &s)))
        return;
    uint64_t size = 0;
    if (ST_OK(w, cube_handle_size(conf.client, s, &size)) && size != len * 4ull)
        st_failf(w, __LINE__, "a %u-byte slice has size %llu", len * 4,
                 (unsigned long long)size);
    st_add(w, s, r->b, r->off + off, len);
}

static void op_retain(st_worker *w)
{
    int i = st_pick(w, -1);
    if (i < 0 || w->refs[i].holds >= 4)
        return;
    if (ST_OK(w, cube_handle_retain(conf.client, w->refs[i].h)))
        w->refs[i].holds++;
}

static void op_release(st_worker *w)
{
    int i = st_pick(w, -1);
    if (i < 0)
        return;
    if (!ST_OK(w, cube_handle_release(conf.client, w->refs[i].h)))
        return;
    if (--w->refs[i].holds == 0)
        st_drop(w, i);
}

/* Checks and syncs of a few handles (nothing may have failed), or the plain
 * barrier. */
static void op_check(st_worker *w)
{
    cube_handle hs[3];
    size_t n = 0;
    uint32_t want = 1 + st_below(&w->rng, 3);
    for (uint32_t k = 0; k < want && w->nrefs; k++)
        hs[n++] = w->refs[st_pick(w, -1)].h;
    switch (st_below(&w->rng, 3)) {
    case 0: ST_OK(w, cube_check(conf.client, hs, n)); break;
    case 1: ST_OK(w, cube_sync(conf.client, hs, n)); break;
    default: ST_OK(w, cube_sync(conf.client, NULL, 0)); break;
    }
}

static void st_use(st_worker *w, int s)
{
    if (!ST_OK(w, cube_stream_use(conf.client, w->streams[s])))
        return;
    w->cur = s;
    if (cube_stream_current(conf.client) != w->streams[s])
        st_failf(w, __LINE__, "cube_stream_current is not the stream named");
}

static void op_memory(st_worker *w)
{
    cube_memory_usage u;
    if (!ST_OK(w, cube_memory_cleanup(conf.client)))
        return;
    if (ST_OK(w, cube_memory_usage_get(conf.client, &u)) &&
        u.bytes_reserved < u.bytes_in_use)
        st_failf(w, __LINE__, "%llu bytes reserved, %llu in use",
                 (unsigned long long)u.bytes_reserved,
                 (unsigned long long)u.bytes_in_use);
}

/* --- profile windows and graphs --- */

static void op_profile(st_worker *w)
{
    st_launch l[3];
    uint32_t want = 1 + st_below(&w->rng, 3), n = 0;
    for (uint32_t k = 0; k < want; k++)
        if (st_pick_any_launch(w, &l[n]))
            n++;
    cube_profile_token t = 0;
    if (!ST_OK(w, cube_profile_start(conf.client, &t)))
        return;
    for (uint32_t k = 0; k < n; k++)
        if (!st_launch_now(w, &l[k]))
            return;
    int i = st_pick(w, -1);
    if (i >= 0 && st_below(&w->rng, 2))
        st_write_view(w, &w->refs[i], SH_FULL);
    if (st_below(&w->rng, 4) == 0) {
        cube_profile_abandon(conf.client, t);
        return;
    }
    cube_profile_result res;
    memset(&res, 0, sizeof res);
    if (!ST_OK(w, cube_profile_end(conf.client, t, &res)))
        return;
    if (res.launches != n || !(res.seconds >= 0.0))
        st_failf(w, __LINE__,
                 "a window of %u launches reports %llu launches in %g s", n,
                 (unsigned long long)res.launches, res.seconds);
}

/* Captures one to three launches (and sometimes an allocation and a fill
 * of it inside the window), replays them one to three times on one of the
 * thread's streams, destroys the graph and reads a result. */
/* Whether graphs are recorded by the client (a capture may then allocate
 * freely) rather than by the device. */
static int st_software_graphs(void)
{
    cube_utilities u;
    cube_error *err = cube_client_utilities(conf.client, &u);
    int soft = err ? 1 : u.software_graphs;
    cube_error_free(err);
    return soft;
}

static void op_graph(st_worker *w)
{
    st_launch seq[4];
    int n = 0;
    uint32_t want = 1 + st_below(&w->rng, 3);
    for (uint32_t k = 0; k < want; k++)
        if (st_pick_any_launch(w, &seq[n]))
            n++;
    int alloc = w->nrefs < ST_MAX_REFS && (n == 0 || !st_below(&w->rng, 3));
    if (n == 0 && !alloc)
        return;
    if (!ST_OK(w, cube_graph_prepare(conf.client)))
        return;
    if (st_below(&w->rng, 2)) /* warm up: the sequence once, for real */
        for (int k = 0; k < n; k++)
            if (!st_launch_now(w, &seq[k]))
                return;
    if (!ST_OK(w, cube_graph_begin(conf.client)))
        return;
    int ok = 1;
    if (alloc) {
        uint32_t m = 1 + st_below(&w->rng, 1500);
        cube_handle h = {0};
        st_buf *b = st_buf_new(ST_U32, m);
        if (!b) {
            st_failf(w, __LINE__, "out of host memory");
            ok = 0;
        } else if (!ST_OK(w, cube_empty(conf.client, m * 4ull, &h))) {
            st_buf_free(b);
            ok = 0;
        } else {
            st_add(w, h, b, 0, m);
            st_launch *l = &seq[n++];
            memset(l, 0, sizeof *l);
            l->kernel = K_FILL;
            l->y = w->nrefs - 1;
            l->v = (uint32_t)st_next(&w->rng);
            l->cubes = conf_div_up(m, 32);
            l->mode = EXEC;
        }
    }
    for (int k = 0; k < n && ok; k++)
        ok = st_ok_at(w, st_issue(w, &seq[k]), "cube_launch in a capture",
                      __LINE__);
    if (ok && st_below(&w->rng, 4) == 0)
        ok = ST_OK(w, cube_check(conf.client, &w->refs[seq[0].y].h, 1));
    cube_graph_id id = 0;
    cube_error *end = cube_graph_end(conf.client, &id);
    if (end && alloc && cube_error_code(end) == CUBE_ERR_GRAPH_STATE &&
        !st_software_graphs()) {
        /* A device graph refuses a capture whose allocation needed new
         * device memory; the capture is over and ran nothing. */
        cube_error_free(end);
        return;
    }
    if (!ST_OK(w, end))
        return;
    if (id == 0) {
        st_failf(w, __LINE__, "cube_graph_end gave graph id 0");
        return;
    }
    if (!ok) {
        ST_OK(w, cube_graph_destroy(conf.client, id));
        return;
    }
    st_use(w, (int)st_below(&w->rng, ST_STREAMS));
    uint32_t reps = 1 + st_below(&w->rng, 3);
    for (uint32_t r = 0; r < reps && ok; r++) {
        ok = ST_OK(w, cube_graph_replay(conf.client, id));
        if (ok) {
            w->replays++;
            for (int k = 0; k < n; k++)
                st_apply(w, &seq[k]);
        }
    }
    if (!ST_OK(w, cube_graph_destroy(conf.client, id)) || !ok)
        return;
    st_read_view(w, &w->refs[seq[n - 1].y], SH_FULL, 0);
}

/* --- handing buffers between threads --- */

/* Puts a buffer this thread alone holds (one reference to a handle over
 * the whole allocation), often just rewritten on this thread's current
 * stream, into the shared pool. */
static void op_give(st_worker *w)
{
    int i = -1;
    if (w->nrefs) {
        uint32_t start = st_below(&w->rng, (uint32_t)w->nrefs);
        for (int k = 0; k < w->nrefs && i < 0; k++) {
            int j = (int)((start + (uint32_t)k) % (uint32_t)w->nrefs);
            const st_ref *r = &w->refs[j];
            if (r->holds == 1 && r->b->refs == 1 && r->off == 0 &&
                r->len == r->b->n)
                i = j;
        }
    }
    if (i < 0)
        i = st_new_buffer(w, st_below(&w->rng, 2) ? ST_U32 : ST_F32,
                          1 + st_below(&w->rng, 4096), 0);
    if (i < 0)
        return;
    st_ref *r = &w->refs[i];
    if (st_below(&w->rng, 2)) {
        st_launch l;
        memset(&l, 0, sizeof l);
        l.x = l.y = i;
        l.kernel = r->b->kind == ST_U32 ? K_FILL : K_SCALE;
        l.v = (uint32_t)st_next(&w->rng);
        l.a = -1;
        l.cubes = conf_div_up(r->len, 32);
        l.mode = EXEC;
        if (!st_launch_now(w, &l))
            return;
    } else if (st_below(&w->rng, 2)) {
        st_write_view(w, r, SH_FULL);
    }
    pthread_mutex_lock(&w->pool->mu);
    int pushed = w->pool->n < ST_POOL_CAP;
    if (pushed) {
        /* The pool item owns the reference and the model from here on:
         * another thread may take them as soon as the lock is released. */
        r->b->refs--;
        st_item *it = &w->pool->items[w->pool->n++];
        it->h = r->h;
        it->b = r->b;
        it->from = w->id;
    }
    pthread_mutex_unlock(&w->pool->mu);
    if (pushed) {
        w->refs[i] = w->refs[--w->nrefs];
        w->handed++;
    }
}

/* Takes a buffer another thread put into the pool, reads it on this
 * thread's stream, often computes on it in place, and keeps it. */
static void op_take(st_worker *w)
{
    if (w->nrefs >= ST_MAX_REFS)
        return;
    st_item it;
    int got = 0;
    pthread_mutex_lock(&w->pool->mu);
    int n = w->pool->n;
    uint32_t start = n ? st_below(&w->rng, (uint32_t)n) : 0;
    for (int k = 0; k < n && !got; k++) {
        int j = (int)((start + (uint32_t)k) % (uint32_t)n);
        if (w->pool->items[j].from != w->id) {
            it = w->pool->items[j];
            w->pool->items[j] = w->pool->items[--w->pool->n];
            got = 1;
        }
    }
    pthread_mutex_unlock(&w->pool->mu);
    if (!got)
        return;
    w->taken++;
    st_add(w, it.h, it.b, 0, it.b->n);
    int i = w->nrefs - 1;
    st_read_view(w, &w->refs[i], st_below(&w->rng, 2) ? SH_FULL : SH_STRIDED,
                 0);
    if (st_below(&w->rng, 2)) {
        st_launch l;
        memset(&l, 0, sizeof l);
        l.x = l.y = i;
        l.kernel = it.b->kind == ST_U32 ? K_FILL : K_SCALE;
        l.v = (uint32_t)st_next(&w->rng);
        l.a = st_below(&w->rng, 2) ? -1.0f : 2.0f;
        l.cubes = conf_div_up(it.b->n, 32);
        l.mode = st_below(&w->rng, 2) ? EXEC : CHECKED;
        if (st_launch_now(w, &l))
            st_read_view(w, &w->refs[i], SH_FULL, 0);
    }
}

/* --- the thread --- */

static st_op st_choose(st_worker *w)
{
    if (w->nrefs == 0)
        return OP_CREATE;
    if (w->nrefs >= ST_MAX_REFS - 2 && st_below(&w->rng, 2))
        return OP_RELEASE;
    uint32_t total = 0;
    for (int k = 0; k < OP_COUNT; k++)
        total += st_weights[k];
    uint32_t r = st_below(&w->rng, total);
    for (int k = 0; k < OP_COUNT; k++) {
        if (r < st_weights[k])
            return (st_op)k;
        r -= st_weights[k];
    }
    return OP_CHECK;
}

static void st_step(st_worker *w)
{
    st_op op = st_choose(w);
    w->count[op]++;
    switch (op) {
    case OP_CREATE: op_create(w, 0); break;
    case OP_EMPTY: op_create(w, 1); break;
    case OP_WRITE_FULL:
    case OP_WRITE_PREFIX:
    case OP_WRITE_BYTES:
    case OP_WRITE_STRIDED: op_write(w, op); break;
    case OP_READ_FULL:
    case OP_READ_STRIDED:
    case OP_READ_ASYNC: op_read(w, op); break;
    case OP_READ_BATCH: op_read_batch(w); break;
    case OP_LAUNCH: op_launch(w); break;
    case OP_SLICE: op_slice(w); break;
    case OP_RETAIN: op_retain(w); break;
    case OP_RELEASE: op_release(w); break;
    case OP_CHECK: op_check(w); break;
    case OP_FLUSH: ST_OK(w, cube_flush(conf.client)); break;
    case OP_STREAM: st_use(w, (int)st_below(&w->rng, ST_STREAMS)); break;
    case OP_MEMORY: op_memory(w); break;
    case OP_PROFILE: op_profile(w); break;
    case OP_GRAPH: op_graph(w); break;
    case OP_GIVE: op_give(w); break;
    case OP_TAKE: op_take(w); break;
    case OP_COUNT: break;
    }
}

static void *st_main(void *arg)
{
    st_worker *w = arg;
    st_use(w, 0);
    for (w->done = 0; w->done < w->ops && !w->failures; w->done++) {
        if ((w->done & 31) == 0 && st_now() > w->deadline)
            break;
        st_step(w);
    }
    /* Everything the thread still holds, whatever happened. */
    while (w->nrefs) {
        st_ref *r = &w->refs[w->nrefs - 1];
        while (r->holds > 0) {
            if (!ST_OK(w, cube_handle_release(conf.client, r->h)))
                break;
            r->holds--;
        }
        st_drop(w, w->nrefs - 1);
    }
    ST_OK(w, cube_stream_use(conf.client, 0));
    return NULL;
}

/* The live buffers of stream s (then back to the main thread's own). */
static uint64_t st_stream_buffers(cube_stream_id s, int cleanup)
{
    cube_memory_usage u;
    CONF_OK(cube_stream_use(conf.client, s));
    CONF_OK(cube_sync(conf.client, NULL, 0));
    if (cleanup)
        CONF_OK(cube_memory_cleanup(conf.client));
    CONF_OK(cube_memory_usage_get(conf.client, &u));
    CONF_OK(cube_stream_use(conf.client, 0));
    return u.buffers;
}

CONF_TEST_NEEDS(stress_mixed_operations_from_eight_threads_on_several_streams,
                CUBE_FEATURE_KERNELS)
{
    st_warm_kernels();
    long long ops = st_env("CUBE_STRESS_OPS", ST_DEFAULT_OPS);
    uint64_t seed = (uint64_t)st_env("CUBE_STRESS_SEED", 0x5EED);
    double seconds = (double)st_env("CUBE_STRESS_SECONDS", ST_DEFAULT_SECONDS);
    int verbose = getenv("CUBE_STRESS_VERBOSE") != NULL;
    double t0 = st_now();

    st_pool pool;
    memset(&pool, 0, sizeof pool);
    assert_int_equal(pthread_mutex_init(&pool.mu, NULL), 0);
    st_worker *w = calloc(ST_THREADS, sizeof *w);
    assert_non_null(w);
    uint64_t before[ST_THREADS][ST_STREAMS];
    for (int t = 0; t < ST_THREADS; t++) {
        w[t].id = t;
        w[t].rng = (seed + 1) * 0x9E3779B97F4A7C15ull ^ (uint64_t)(t + 1);
        w[t].ops = ops;
        w[t].deadline = t0 + seconds;
        w[t].pool = &pool;
        for (int s = 0; s < ST_STREAMS; s++) {
            w[t].streams[s] = ST_STREAM_BASE + (uint64_t)t * 16 + (uint64_t)s;
            before[t][s] = st_stream_buffers(w[t].streams[s], 0);
        }
        for (int k = 0; k < 4; k++)
            st_next(&w[t].rng);
    }

    pthread_t th[ST_THREADS];
    for (int t = 0; t < ST_THREADS; t++)
        assert_int_equal(pthread_create(&th[t], NULL, st_main, &w[t]), 0);
    for (int t = 0; t < ST_THREADS; t++)
        assert_int_equal(pthread_join(th[t], NULL), 0);

    int failures = 0;
    long long done = 0;
    for (int t = 0; t < ST_THREADS; t++) {
        if (w[t].failures)
            print_error("seed %llu: %s (%d failures)\n",
                        (unsigned long long)seed, w[t].first, w[t].failures);
        failures += w[t].failures;
        done += w[t].done;
    }

    /* What is left in the pool is read here, on the main thread's stream,
     * and released. */
    for (int k = 0; k < pool.n; k++) {
        st_item *it = &pool.items[k];
        uint32_t *got = malloc(it->b->n * 4ull);
        assert_non_null(got);
        CONF_READ_OK(it->h, got, it->b->n * 4ull);
        for (uint32_t i = 0; i < it->b->n && !failures; i++) {
            if (!it->b->def[i])
                continue;
            int same = it->b->kind == ST_U32
                           ? got[i] == it->b->w[i]
                           : st_f(got[i]) == st_f(it->b->w[i]);
            if (!same)
                fail_msg("a pooled buffer from thread %d: element %u is "
                         "0x%08x, the model says 0x%08x",
                         it->from, i, got[i], it->b->w[i]);
        }
        free(got);
        conf_release(it->h);
        st_buf_free(it->b);
    }
    pthread_mutex_destroy(&pool.mu);
    assert_int_equal(failures, 0);

    /* Every stream the threads used is back to the buffers it had. */
    for (int t = 0; t < ST_THREADS; t++)
        for (int s = 0; s < ST_STREAMS; s++) {
            uint64_t after = st_stream_buffers(w[t].streams[s], 1);
            if (after != before[t][s])
                fail_msg("stream %d of thread %d: %llu live buffers before, "
                         "%llu after",
                         s, t, (unsigned long long)before[t][s],
                         (unsigned long long)after);
        }

    if (verbose) {
        long long sum[OP_COUNT] = {0}, launches = 0, verified = 0;
        long long handed = 0, taken = 0, replays = 0;
        for (int t = 0; t < ST_THREADS; t++) {
            for (int k = 0; k < OP_COUNT; k++)
                sum[k] += w[t].count[k];
            launches += w[t].launches;
            verified += w[t].verified;
            handed += w[t].handed;
            taken += w[t].taken;
            replays += w[t].replays;
        }
        print_message("stress: %lld operations in %.2f s (seed %llu): %lld "
                      "launches, %lld replays, %lld elements verified, %lld "
                      "handed over, %lld taken\n",
                      done, st_now() - t0, (unsigned long long)seed, launches,
                      replays, verified, handed, taken);
        for (int k = 0; k < OP_COUNT; k++)
            print_message("  %-8s %lld\n", st_op_names[k], sum[k]);
    }
    /* The time limit is a safety net: most operations must have run. */
    if (done < (long long)ST_THREADS * ops / 4)
        print_message("stress: only %lld of %lld operations ran within %g s\n",
                      done, (long long)ST_THREADS * ops, seconds);
    free(w);
}

/* ========================================================================
 * A producer and a consumer on two streams
 * ======================================================================== */

enum { PC_N = 4000, PC_ROUNDS = 300 };

/* Round r fills element i with the bits of a float in [1, 2): PC_ONE +
 * r * 4096 + i. Scaling by 2 adds one to the exponent, exactly. */
#define PC_ONE 0x3F800000u
#define PC_TWICE 0x00800000u

static uint32_t pc_value(int round)
{
    return PC_ONE + (uint32_t)round * 4096u;
}

typedef struct pc_side {
    int failures;
    int rounds; /* rounds completed */
    char first[768];
} pc_side;

typedef struct pc_state {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    cube_handle src[2]; /* round r rewrites src[r % 2] */
    cube_stream_id sa, sb;
    int war;       /* 1: the consumer acknowledges before it reads */
    int published; /* the last round the producer wrote */
    int acked;     /* the last round the consumer acknowledged */
    int stop;      /* a side failed: the other stops waiting */
    pc_side prod, cons;
} pc_state;

static void pc_fail(pc_state *s, pc_side *side, int round, const char *what,
                    cube_error *err)
{
    if (side->failures++ == 0) {
        char *text = err ? cube_error_format(err) : NULL;
        snprintf(side->first, sizeof side->first, "%s, round %d: %s%s%s",
                 side == &s->prod ? "producer" : "consumer", round, what,
                 text ? ": " : "", text ? text : "");
        free(text);
    }
    cube_error_free(err);
    pthread_mutex_lock(&s->mu);
    s->stop = 1;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

static int pc_ok(pc_state *s, pc_side *side, int round, const char *what,
                 cube_error *err)
{
    if (!err)
        return 1;
    pc_fail(s, side, round, what, err);
    return 0;
}

/* Fails unless got[i] == base + i + add for every i. */
static int pc_expect(pc_state *s, int round, const uint32_t *got, uint32_t base,
                     uint32_t add, const char *what)
{
    for (uint32_t i = 0; i < PC_N; i++)
        if (got[i] != base + i + add) {
            char msg[256];
            int seen = (int)((got[i] - add - i - PC_ONE) / 4096u);
            snprintf(msg, sizeof msg,
                     "%s: element %u is 0x%08x, expected 0x%08x (looks like "
                     "round %d)",
                     what, i, got[i], base + i + add, seen);
            pc_fail(s, &s->cons, round, msg, NULL);
            return 0;
        }
    return 1;
}

static void *pc_producer(void *arg)
{
    pc_state *s = arg;
    cube_client *c = conf.client;
    if (!pc_ok(s, &s->prod, 0, "cube_stream_use", cube_stream_use(c, s->sa)))
        return NULL;
    for (int r = 1; r <= PC_ROUNDS; r++) {
        cube_arg args[2] = {cube_arg_buffer(s->src[r % 2]),
                            cube_arg_u32(pc_value(r))};
        if (!pc_ok(s, &s->prod, r, "fill",
                   cube_launch(c, conf.k.fill,
                               cube_count_static(conf_div_up(PC_N, 32), 1, 1),
                               args, 2, EXEC)))
            break;
        pthread_mutex_lock(&s->mu);
        s->published = r;
        pthread_cond_broadcast(&s->cv);
        while (s->acked < r && !s->stop)
            pthread_cond_wait(&s->cv, &s->mu);
        int stop = s->stop;
        pthread_mutex_unlock(&s->mu);
        if (stop)
            break;
        s->prod.rounds = r;
    }
    pc_ok(s, &s->prod, 0, "cube_stream_use", cube_stream_use(c, 0));
    return NULL;
}

static void pc_ack(pc_state *s, int r)
{
    pthread_mutex_lock(&s->mu);
    s->acked = r;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

static void *pc_consumer(void *arg)
{
    pc_state *s = arg;
    cube_client *c = conf.client;
    uint32_t *got = malloc(PC_N * 4u), *out_host = malloc(PC_N * 4u);
    cube_handle out = {0};
    if (!got || !out_host) {
        pc_fail(s, &s->cons, 0, "out of host memory", NULL);
        goto done;
    }
    if (!pc_ok(s, &s->cons, 0, "cube_stream_use", cube_stream_use(c, s->sb)))
        goto done;
    if (!pc_ok(s, &s->cons, 0, "cube_empty", cube_empty(c, PC_N * 4ull, &out)))
        goto back;
    for (int r = 1; r <= PC_ROUNDS; r++) {
        pthread_mutex_lock(&s->mu);
        while (s->published < r && !s->stop)
            pthread_cond_wait(&s->cv, &s->mu);
        int stop = s->stop;
        pthread_mutex_unlock(&s->mu);
        if (stop)
            break;
        cube_handle src = s->src[r % 2];
        cube_copy_desc ds = cube_copy_desc_contiguous(src, PC_N * 4ull, 4);
        cube_copy_desc dout = cube_copy_desc_contiguous(out, PC_N * 4ull, 4);
        void *dst_src[1] = {got}, *dst_out[1] = {out_host};
        uint64_t sz[1] = {PC_N * 4ull};
        cube_arg args[3] = {cube_arg_buffer(src), cube_arg_buffer(out),
                            cube_arg_f32(2.0f)};
        cube_count n = cube_count_static(conf_div_up(PC_N, 64), 1, 1);
        memset(got, 0, PC_N * 4u);
        memset(out_host, 0, PC_N * 4u);
        if (!s->war) {
            /* Read after write: the rewrite on the producer's stream is
             * what this stream sees, first by a read or by a launch. */
            if (r % 2 && !(pc_ok(s, &s->cons, r, "read of the source",
                                 cube_read(c, &ds, dst_src, sz, 1)) &&
                           pc_expect(s, r, got, pc_value(r), 0, "source")))
                break;
            if (!pc_ok(s, &s->cons, r, "scale",
                       cube_launch(c, conf.k.scale, n, args, 3, EXEC)))
                break;
            if (!pc_ok(s, &s->cons, r, "read of the output",
                       cube_read(c, &dout, dst_out, sz, 1)) ||
                !pc_expect(s, r, out_host, pc_value(r), PC_TWICE, "output"))
                break;
            if (r % 2 == 0 && !(pc_ok(s, &s->cons, r, "read of the source",
                                      cube_read(c, &ds, dst_src, sz, 1)) &&
                                pc_expect(s, r, got, pc_value(r), 0, "source")))
                break;
            pc_ack(s, r);
        } else {
            /* Write after read: the reads and the launch are issued, then
             * acknowledged; the producer's next rewrite must not reach
             * them. */
            cube_future *f = NULL;
            if (!pc_ok(s, &s->cons, r, "read_async of the source",
                       cube_read_async(c, &ds, dst_src, sz, 1, &f)))
                break;
            cube_error *launched =
                cube_launch(c, conf.k.scale, n, args, 3, EXEC);
            pc_ack(s, r);
            cube_error *waited = cube_future_wait(f);
            cube_future_free(f);
            if (!pc_ok(s, &s->cons, r, "scale", launched)) {
                cube_error_free(waited);
                break;
            }
            if (!pc_ok(s, &s->cons, r, "future of the source", waited) ||
                !pc_expect(s, r, got, pc_value(r), 0, "source (async)"))
                break;
            if (!pc_ok(s, &s->cons, r, "read of the output",
                       cube_read(c, &dout, dst_out, sz, 1)) ||
                !pc_expect(s, r, out_host, pc_value(r), PC_TWICE, "output"))
                break;
        }
        s->cons.rounds = r;
    }
    pc_ok(s, &s->cons, 0, "release", cube_handle_release(c, out));
back:
    pc_ok(s, &s->cons, 0, "cube_stream_use", cube_stream_use(c, 0));
done:
    free(got);
    free(out_host);
    return NULL;
}

CONF_TEST_NEEDS(stress_producer_consumer_across_streams_with_in_place_rewrites,
                CUBE_FEATURE_KERNELS)
{
    st_warm_kernels();
    const cube_stream_id sa = 0x5715E55100000001ull;
    const cube_stream_id sb = 0x5715E55100000002ull;
    /* The sources are allocated elsewhere than where they are rewritten:
     * one on this thread's stream, one on the consumer's. */
    uint32_t *zero = calloc(PC_N, 4);
    assert_non_null(zero);
    cube_handle src[2];
    src[0] = conf_create(zero, PC_N * 4ull);
    CONF_OK(cube_stream_use(conf.client, sb));
    src[1] = conf_create(zero, PC_N * 4ull);
    CONF_OK(cube_stream_use(conf.client, 0));
    free(zero);
    for (int war = 0; war < 2; war++) {
        pc_state s;
        memset(&s, 0, sizeof s);
        assert_int_equal(pthread_mutex_init(&s.mu, NULL), 0);
        assert_int_equal(pthread_cond_init(&s.cv, NULL), 0);
        s.src[0] = src[0];
        s.src[1] = src[1];
        s.sa = sa;
        s.sb = sb;
        s.war = war;
        pthread_t tp, tc;
        assert_int_equal(pthread_create(&tc, NULL, pc_consumer, &s), 0);
        assert_int_equal(pthread_create(&tp, NULL, pc_producer, &s), 0);
        assert_int_equal(pthread_join(tp, NULL), 0);
        assert_int_equal(pthread_join(tc, NULL), 0);
        pthread_cond_destroy(&s.cv);
        pthread_mutex_destroy(&s.mu);
        if (s.prod.failures)
            print_error("%s\n", s.prod.first);
        if (s.cons.failures)
            print_error("%s\n", s.cons.first);
        if (s.prod.failures || s.cons.failures)
            fail_msg("%s: the producer or the consumer failed",
                     war ? "write after read" : "read after write");
        assert_int_equal(s.prod.rounds, PC_ROUNDS);
        assert_int_equal(s.cons.rounds, PC_ROUNDS);
    }
    /* After both runs the last round is what every stream reads. */
    uint32_t *got = malloc(PC_N * 4u);
    assert_non_null(got);
    for (int k = 0; k < 2; k++) {
        int last = PC_ROUNDS - ((PC_ROUNDS % 2) != k);
        CONF_READ_OK(src[k], got, PC_N * 4ull);
        for (uint32_t i = 0; i < PC_N; i++)
            assert_int_equal(got[i], pc_value(last) + i);
    }
    free(got);
    conf_release(src[0]);
    conf_release(src[1]);
}

/* ========================================================================
 * Failures crossing streams
 * ======================================================================== */

enum { FX_N = 100 };

typedef struct fx_ctx {
    cube_handle x, y, z, out;
    uint32_t got[FX_N];
    uint32_t sink[4][FX_N];
    float yv[FX_N];
} fx_ctx;

typedef cube_error *(*fx_op)(fx_ctx *);

static cube_error *fx_broken(fx_ctx *c)
{
    cube_arg args[3] = {cube_arg_buffer(c->x), cube_arg_buffer(c->y),
                        cube_arg_buffer(c->z)};
    return conf_launch(conf.k.broken, cube_count_static(1, 1, 1), args, 3,
                       EXEC);
}

static cube_error *fx_scale(fx_ctx *c)
{
    cube_arg args[3] = {cube_arg_buffer(c->y), cube_arg_buffer(c->out),
                        cube_arg_f32(2.0f)};
    return conf_launch(conf.k.scale,
                       cube_count_static(conf_div_up(FX_N, 64), 1, 1), args, 3,
                       EXEC);
}

/* Reads out into got, which holds 0xCD bytes before. */
static cube_error *fx_read_out(fx_ctx *c)
{
    memset(c->got, 0xCD, sizeof c->got);
    return conf_read(c->out, c->got, sizeof c->got);
}

static cube_error *fx_read_all(fx_ctx *c)
{
    const uint64_t b = sizeof c->sink[0];
    cube_copy_desc d[4] = {cube_copy_desc_contiguous(c->x, b, 4),
                           cube_copy_desc_contiguous(c->y, b, 4),
                           cube_copy_desc_contiguous(c->z, b, 4),
                           cube_copy_desc_contiguous(c->out, b, 4)};
    void *dst[4] = {c->sink[0], c->sink[1], c->sink[2], c->sink[3]};
    uint64_t sz[4] = {b, b, b, b};
    return cube_read(conf.client, d, dst, sz, 4);
}

static cube_error *fx_check_out(fx_ctx *c)
{
    return cube_check(conf.client, &c->out, 1);
}

static cube_error *fx_check_y(fx_ctx *c)
{
    return cube_check(conf.client, &c->y, 1);
}

static cube_error *fx_check_xz(fx_ctx *c)
{
    cube_handle hs[2] = {c->x, c->z};
    return cube_check(conf.client, hs, 2);
}

static cube_error *fx_sync_out(fx_ctx *c)
{
    return cube_sync(conf.client, &c->out, 1);
}

static cube_error *fx_sync_plain(fx_ctx *c)
{
    (void)c;
    return cube_sync(conf.client, NULL, 0);
}

static cube_error *fx_flush(fx_ctx *c)
{
    (void)c;
    return cube_flush(conf.client);
}

static cube_error *fx_write_y_prefix(fx_ctx *c)
{
    cube_copy_desc d = cube_copy_desc_contiguous(c->y, FX_N * 2ull, 4);
    const void *src[1] = {c->yv};
    uint64_t sz[1] = {FX_N * 2ull};
    return cube_write(conf.client, &d, src, sz, 1);
}

static cube_error *fx_write_y(fx_ctx *c)
{
    return conf_write(c->y, c->yv, sizeof c->yv);
}

static cube_error *fx_write_xz(fx_ctx *c)
{
    cube_copy_desc d[2] = {cube_copy_desc_contiguous(c->x, sizeof c->yv, 4),
                           cube_copy_desc_contiguous(c->z, sizeof c->yv, 4)};
    const void *src[2] = {c->yv, c->yv};
    uint64_t sz[2] = {sizeof c->yv, sizeof c->yv};
    return cube_write(conf.client, d, src, sz, 2);
}

typedef struct fx_call {
    cube_stream_id stream;
    fx_op op;
    fx_ctx *ctx;
    cube_error *use_err, *back_err, *err;
} fx_call;

static void *fx_thread(void *arg)
{
    fx_call *call = arg;
    call->use_err = cube_stream_use(conf.client, call->stream);
    if (!call->use_err)
        call->err = call->op(call->ctx);
    call->back_err = cube_stream_use(conf.client, 0);
    return NULL;
}

/* Runs op on `stream`: on this thread, or on a new one (errors are values
 * any thread may read; the asserts stay here). */
static cube_error *fx_on(cube_stream_id stream, fx_op op, fx_ctx *ctx,
                         int threaded)
{
    fx_call call = {stream, op, ctx, NULL, NULL, NULL};
    if (threaded) {
        pthread_t t;
        assert_int_equal(pthread_create(&t, NULL, fx_thread, &call), 0);
        assert_int_equal(pthread_join(t, NULL), 0);
    } else {
        fx_thread(&call);
    }
    CONF_OK(call.use_err);
    CONF_OK(call.back_err);
    return call.err;
}

/* Fails unless err is SEVERAL with `causes` causes (0: any) and a COMPILE
 * failure somewhere beneath; frees it. */
static void fx_expect_several_at(cube_error *err, size_t causes,
                                 const char *what, int line)
{
    conf_code_at(err, CUBE_ERR_SEVERAL, what, __FILE__, line);
    int ok = conf_error_has_code(err, CUBE_ERR_COMPILE) &&
             (causes == 0 || cube_error_cause_count(err) == causes);
    if (!ok) {
        char *text = cube_error_format(err);
        print_error("%s:%d: %s: expected [%s] with %zu causes tracing back "
                    "to [%s], got:\n%s",
                    __FILE__, line, what, cube_code_name(CUBE_ERR_SEVERAL),
                    causes, cube_code_name(CUBE_ERR_COMPILE),
                    text ? text : "?\n");
        free(text);
    }
    cube_error_free(err);
    if (!ok)
        _fail(__FILE__, line);
}
#define FX_SEVERAL(err, causes)                                                \
    fx_expect_several_at((err), (causes), #err, __LINE__)

static void fx_scenario(cube_stream_id base, int threaded)
{
    const cube_stream_id sa = base + 1, sb = base + 2, sc = base + 3;
    const cube_stream_id sd = base + 4;
    fx_ctx *c = calloc(1, sizeof *c);
    assert_non_null(c);
    float v[FX_N];
    for (uint32_t i = 0; i < FX_N; i++) {
        v[i] = (float)i;
        c->yv[i] = (float)(3 * i + 1);
    }
    c->x = conf_create(v, sizeof v);
    c->y = conf_create(v, sizeof v);
    c->z = conf_create(v, sizeof v);
    c->out = conf_create(v, sizeof v);

    /* Stream A: the launch does not compile; every bound buffer is
     * suspect. A flush there does not report it. */
    CONF_EXPECT(fx_on(sa, fx_broken, c, threaded), CUBE_ERR_COMPILE);
    CONF_OK(fx_on(sa, fx_flush, c, threaded));
    /* Stream B: a launch that reads y fails and marks its output. */
    FX_SEVERAL(fx_on(sb, fx_scale, c, threaded), 0);
    /* Stream D: read, check and sync of the output all report it; the read
     * leaves its destination alone. */
    FX_SEVERAL(fx_on(sd, fx_read_out, c, threaded), 0);
    for (uint32_t i = 0; i < FX_N; i++)
        assert_int_equal(c->got[i], 0xCDCDCDCDu);
    FX_SEVERAL(fx_on(sd, fx_check_out, c, threaded), 0);
    FX_SEVERAL(fx_on(sd, fx_sync_out, c, threaded), 0);
    FX_SEVERAL(fx_on(sd, fx_read_all, c, threaded), 4);
    CONF_OK(fx_on(sd, fx_sync_plain, c, threaded));
    /* Stream C: half of y written leaves it failed, all of it clears it;
     * the output stays failed until a launch writes it. */
    CONF_OK(fx_on(sc, fx_write_y_prefix, c, threaded));
    FX_SEVERAL(fx_on(sd, fx_check_y, c, threaded), 0);
    CONF_OK(fx_on(sc, fx_write_y, c, threaded));
    CONF_OK(fx_on(sd, fx_check_y, c, threaded));
    FX_SEVERAL(fx_on(sd, fx_check_out, c, threaded), 0);
    /* Stream B again: now the launch runs and the output is trusted. */
    CONF_OK(fx_on(sb, fx_scale, c, threaded));
    CONF_OK(fx_on(sd, fx_check_out, c, threaded));
    CONF_OK(fx_on(sd, fx_sync_out, c, threaded));
    CONF_OK(fx_on(sd, fx_read_out, c, threaded));
    for (uint32_t i = 0; i < FX_N; i++)
        assert_true(st_f(c->got[i]) == 2.0f * c->yv[i]);
    /* x and z are still failed until written too. */
    FX_SEVERAL(fx_on(sd, fx_check_xz, c, threaded), 2);
    CONF_OK(fx_on(sc, fx_write_xz, c, threaded));
    CONF_OK(fx_on(sd, fx_check_xz, c, threaded));
    CONF_OK(fx_on(sa, fx_read_all, c, threaded));

    conf_release(c->x);
    conf_release(c->y);
    conf_release(c->z);
    conf_release(c->out);
    free(c);
}

CONF_TEST_NEEDS(stress_failures_cross_streams, CUBE_FEATURE_KERNELS)
{
    /* Once with this thread switching streams, once with every step on a
     * thread of its own. */
    fx_scenario(0x5715E55200000000ull, 0);
    fx_scenario(0x5715E55300000000ull, 1);
}
