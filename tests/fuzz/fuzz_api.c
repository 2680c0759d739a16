/* A fuzz target for the public API: each input is a sequence of operations
 * on one client over a few handle slots, checked against a host model of
 * every buffer's bytes and failure. Every returned code is compared with
 * the code the model expects and every byte read with the model's bytes;
 * a difference aborts with a description of the operation.
 *
 * Built two ways: with libFuzzer (clang -fsanitize=fuzzer, CUBE_FUZZ_LIBFUZZER
 * undefined), and as a replay program (CUBE_FUZZ_REPLAY) whose main() runs
 * every file of the directories or files it is given, and which writes the
 * seed corpus with --generate DIR.
 *
 * The backend comes from $CUBERT_FUZZ_BACKEND ("cpu" when unset). On a
 * backend without kernels every launch is expected to fail with
 * CUBE_ERR_UNSUPPORTED, recorded on the launch's buffers.
 *
 * Besides buffers, the model keeps what the calling thread's streams hold:
 * per stream whether it is prepared for or capturing a graph, the launches
 * a capture recorded, the open profiling windows and the counts a window
 * reports; and the graphs that were ended and not destroyed, with the
 * launches a replay re-applies. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cubert/cubert.h"

#define SLOTS 8
#define GRAPHS 4  /* graphs alive at once, captures included */
#define MAX_REC 6 /* launches a capture records */
#define STREAMS 4 /* the thread's own stream (0) and streams 1..3 */
#define MAX_WIN 4 /* open profiling windows per stream */
/* Each slot names one allocation; graphs pin up to two per launch. */
#define ALLOCS (SLOTS * 2 + GRAPHS * MAX_REC * 2)
#define MAX_SIZE 256u
#define MAX_OPS 256
#define HOST_MAX 4096u /* host bytes of a strided copy */
#define WORKER_STREAM 100u

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* --- the model ------------------------------------------------------------ */

typedef struct model_alloc {
    int live; /* handles still name it */
    uint32_t size;
    uint32_t handles; /* slots naming it */
    int failed;       /* the failure store holds an error for it */
    uint32_t pins;    /* recorded launches (graphs, captures) naming it */
    uint8_t bytes[MAX_SIZE];
    uint8_t known[MAX_SIZE]; /* 1 where the bytes are defined */
} model_alloc;

typedef struct model_slot {
    cube_handle h; /* bits 0: never filled */
    uint32_t refs; /* 0: released (h is then stale) */
    int alloc;     /* index into allocs */
    uint32_t offset, size;
} model_slot;

static cube_client *g_client;
static int g_kernels; /* the backend runs kernels */
static const char *g_backend;
static cube_kernel *g_axpy, *g_fill;
/* A communicator of one rank over the client. */
static cube_comm *g_comm;

/* A launch (or, on software graphs, an all-reduce: REC_COPY) a capture
 * recorded: a replay applies it again. */
enum { REC_FILL, REC_AXPY, REC_COPY };
typedef struct model_rec {
    int kind;
    int ya, xa; /* allocs: y always, x for axpy */
    uint32_t yoff, ysize, xoff, xsize;
    uint32_t scalar;
} model_rec;

typedef struct model_window {
    cube_profile_token token;
    uint64_t failures, launches, work; /* the stream's counts at start */
} model_window;

typedef struct model_stream {
    int prepared, capturing;
    int allocated; /* cube_empty ran inside the open capture */
    int nrec;
    model_rec rec[MAX_REC]; /* the open capture's launches */
    /* Launch, write and replay failures, launches run (replays count
     * theirs), and calls that ran work (launches, reads, writes). */
    uint64_t failures, launches, work;
    int nwin;
    model_window win[MAX_WIN];
} model_stream;

typedef struct model_graph {
    int live;
    cube_graph_id id;
    int nrec;
    model_rec rec[MAX_REC];
} model_graph;

static model_alloc allocs[ALLOCS];
static model_slot slots[SLOTS];
static int dry_depth;
static model_stream streams[STREAMS];
static int cur; /* the stream the thread works on: 0 its own, else 1..3 */
static model_graph graphs[GRAPHS];
static cube_graph_id last_destroyed;
static cube_profile_token last_closed;
static cube_timing_method g_timing;
/* The backend records hardware graphs (cube_utilities.software_graphs 0),
 * which refuse a capture that had to take new device memory. */
static int g_hw_graphs;
static size_t op_index;
static const char *op_name;
/* $CUBERT_FUZZ_TRACE set: each operation is named on stderr as it ends,
 * to read a failing input's story. */
static int g_trace;

typedef struct reader {
    const uint8_t *p;
    size_t n, at;
} reader;

static uint8_t rd8(reader *r)
{
    return r->at < r->n ? r->p[r->at++] : 0;
}

static uint32_t rd16(reader *r)
{
    uint32_t lo = rd8(r);
    return lo | (uint32_t)rd8(r) << 8;
}

static uint64_t rd64(reader *r)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v |= (uint64_t)rd8(r) << (8 * i);
    return v;
}

static void fail_model(const char *what, const cube_error *err)
{
    char *text = err ? cube_error_format(err) : NULL;
    fprintf(stderr,
            "fuzz_api: model mismatch (backend %s) at op %zu (%s): %s\n%s",
            g_backend, op_index, op_name, what, text ? text : "");
    free(text);
    abort();
}

/* Checks `err` against the expected code (CUBE_OK: success), then frees it. */
static void expect(cube_error *err, cube_code want)
{
    cube_code got = cube_error_code(err);
    if (got != want) {
        char msg[160];
        snprintf(msg, sizeof msg, "expected [%s], got [%s]",
                 cube_code_name(want), cube_code_name(got));
        fail_model(msg, err);
    }
    if (err && cube_error_message(err)[0] == '\0')
        fail_model("an error with an empty message", err);
    cube_error_free(err);
}

/* Either of two codes. */
static void expect2(cube_error *err, cube_code a, cube_code b)
{
    cube_code got = cube_error_code(err);
    if (got != a && got != b) {
        char msg[200];
        snprintf(msg, sizeof msg, "expected [%s] or [%s], got [%s]",
                 cube_code_name(a), cube_code_name(b), cube_code_name(got));
        fail_model(msg, err);
    }
    cube_error_free(err);
}

static int slot_live(int s)
{
    return slots[s].refs > 0;
}

static model_alloc *slot_alloc(int s)
{
    return &allocs[slots[s].alloc];
}

static model_stream *cs(void)
{
    return &streams[cur];
}

/* The calling stream is capturing: reads, writes, syncs, profiles and
 * replays are refused there with CUBE_ERR_GRAPH_STATE. */
static int capturing(void)
{
    return streams[cur].capturing;
}

/* Forgets slot s's handle once its last reference is gone. */
static void slot_dead(int s)
{
    model_alloc *a = slot_alloc(s);
    if (--a->handles == 0)
        a->live = 0;
}

/* Releases every reference slot s holds, so it can take a new handle. */
static void slot_clear(int s)
{
    while (slot_live(s)) {
        expect(cube_handle_release(g_client, slots[s].h), CUBE_OK);
        if (--slots[s].refs == 0)
            slot_dead(s);
    }
}

static int new_alloc(uint32_t size)
{
    for (int i = 0; i < ALLOCS; i++) {
        if (!allocs[i].live && allocs[i].pins == 0) {
            memset(&allocs[i], 0, sizeof allocs[i]);
            allocs[i].live = 1;
            allocs[i].size = size;
            return i;
        }
    }
    return -1; /* cannot happen: each slot names at most one alloc */
}

static void slot_take(int s, cube_handle h, int alloc, uint32_t offset,
                      uint32_t size)
{
    slots[s].h = h;
    slots[s].refs = 1;
    slots[s].alloc = alloc;
    slots[s].offset = offset;
    slots[s].size = size;
    allocs[alloc].handles++;
}

static uint32_t pick_size(reader *r)
{
    uint32_t b = rd8(r);
    return b ? b : MAX_SIZE;
}

/* --- operations ------------------------------------------------------------
 */

static void op_empty(reader *r)
{
    int s = rd8(r) % SLOTS;
    uint32_t size = pick_size(r);
    slot_clear(s);
    cube_handle h = {0};
    expect(cube_empty(g_client, size, &h), CUBE_OK);
    if (capturing())
        cs()->allocated = 1;
    int a = new_alloc(size);
    slot_take(s, h, a, 0, size);
}

static void op_create(reader *r)
{
    int s = rd8(r) % SLOTS;
    uint32_t size = pick_size(r);
    uint8_t seed = rd8(r);
    uint8_t bytes[MAX_SIZE];
    for (uint32_t i = 0; i < size; i++)
        bytes[i] = (uint8_t)(seed + i * 7u);
    slot_clear(s);
    cube_handle h = {0};
    cube_error *err = cube_create(g_client, bytes, size, &h);
    if (capturing()) {
        /* cube_create writes, which a capture cannot record. */
        expect(err, CUBE_ERR_GRAPH_STATE);
        if (h.bits != 0)
            fail_model("a refused cube_create handed out a handle", NULL);
        return;
    }
    expect(err, CUBE_OK);
    cs()->work++;
    int a = new_alloc(size);
    memcpy(allocs[a].bytes, bytes, size);
    memset(allocs[a].known, 1, size);
    slot_take(s, h, a, 0, size);
}

/* Writes the first `len` bytes of slot s's range (elements of 1 or 4
 * bytes). */
/* Writes the first `len` bytes of slot s's range; `whole`: through
 * cube_write_all, which takes exactly the range's size (`len` is then the
 * range's size when `exact`, else what the input says). */
static void op_write(reader *r, int whole)
{
    int s = rd8(r) % SLOTS;
    uint32_t len = rd16(r) % (MAX_SIZE + 8);
    uint8_t mode = rd8(r);
    uint32_t elem = (mode & 1) ? 4 : 1;
    uint8_t seed = rd8(r);
    if (slots[s].h.bits == 0)
        return;
    if (whole && (mode & 2))
        len = (uint32_t)slots[s].size;
    if (elem == 4 && !whole)
        len &= ~3u;
    uint8_t src[MAX_SIZE + 8];
    for (uint32_t i = 0; i < len; i++)
        src[i] = (uint8_t)(seed ^ (i * 13u));
    cube_error *err;
    if (whole) {
        err = cube_write_all(g_client, slots[s].h, src, len);
    } else {
        cube_copy_desc d = cube_copy_desc_contiguous(slots[s].h, len, elem);
        const void *srcs[1] = {src};
        uint64_t sizes[1] = {len};
        err = cube_write(g_client, &d, srcs, sizes, 1);
    }
    if (!slot_live(s))
        return expect(err, CUBE_ERR_NOT_FOUND);
    if (len == 0 || len > slots[s].size || (whole && len != slots[s].size))
        return expect(err, CUBE_ERR_INVALID_ARGUMENT);
    if (capturing())
        return expect(err, CUBE_ERR_GRAPH_STATE);
    expect(err, CUBE_OK);
    cs()->work++;
    model_alloc *a = slot_alloc(s);
    memcpy(a->bytes + slots[s].offset, src, len);
    memset(a->known + slots[s].offset, 1, len);
    if (slots[s].offset == 0 && len == a->size)
        a->failed = 0;
}

/* Reads the first `len` bytes of slot s's range, blocking or through a
 * future; `whole` (async 2): through cube_read_all, with the range's size
 * or the input's. */
static void op_read(reader *r, int async)
{
    int s = rd8(r) % SLOTS;
    uint32_t len = rd16(r) % (MAX_SIZE + 8);
    int whole = async == 2;
    if (slots[s].h.bits == 0)
        return;
    if (whole && (len & 1))
        len = (uint32_t)slots[s].size;
    uint8_t dst[MAX_SIZE + 8];
    memset(dst, 0xA5, sizeof dst);
    cube_copy_desc d = cube_copy_desc_contiguous(slots[s].h, len, 1);
    void *dsts[1] = {dst};
    uint64_t sizes[1] = {len};
    cube_error *err;
    if (whole) {
        err = cube_read_all(g_client, slots[s].h, dst, len);
    } else if (async) {
        cube_future *f = NULL;
        err = cube_read_async(g_client, &d, dsts, sizes, 1, &f);
        if (!err) {
            err = cube_future_wait(f);
            cube_future_free(f);
        }
    } else {
        err = cube_read(g_client, &d, dsts, sizes, 1);
    }
    if (!slot_live(s))
        return expect(err, CUBE_ERR_NOT_FOUND);
    if (len == 0 || len > slots[s].size || (whole && len != slots[s].size))
        return expect(err, CUBE_ERR_INVALID_ARGUMENT);
    model_alloc *a = slot_alloc(s);
    if (capturing() || a->failed) {
        /* A capture refuses first, whatever the buffer holds. */
        expect(err, capturing() ? CUBE_ERR_GRAPH_STATE : CUBE_ERR_SEVERAL);
        for (size_t i = 0; i < sizeof dst; i++)
            if (dst[i] != 0xA5)
                fail_model("a refused read wrote its destination", NULL);
        return;
    }
    expect(err, CUBE_OK);
    cs()->work++;
    for (uint32_t i = 0; i < len; i++) {
        uint32_t at = slots[s].offset + i;
        if (a->known[at] && dst[i] != a->bytes[at]) {
            char msg[128];
            snprintf(msg, sizeof msg,
                     "byte %u of the range (alloc byte %u): read 0x%02x, "
                     "model 0x%02x",
                     i, at, dst[i], a->bytes[at]);
            fail_model(msg, NULL);
        }
    }
    for (size_t i = len; i < sizeof dst; i++)
        if (dst[i] != 0xA5)
            fail_model("a read wrote past its destination size", NULL);
}

static void op_slice(reader *r)
{
    int src = rd8(r) % SLOTS;
    int dst = rd8(r) % SLOTS;
    uint32_t off = rd16(r) % (MAX_SIZE + 4);
    uint32_t size = rd16(r) % (MAX_SIZE + 4);
    if (slots[src].h.bits == 0)
        return;
    cube_handle h = {0};
    cube_error *err = cube_handle_slice(g_client, slots[src].h, off, size, &h);
    if (!slot_live(src))
        return expect(err, CUBE_ERR_NOT_FOUND);
    if (size == 0 || (uint64_t)off + size > slots[src].size)
        return expect(err, CUBE_ERR_INVALID_ARGUMENT);
    expect(err, CUBE_OK);
    int a = slots[src].alloc;
    uint32_t base = slots[src].offset;
    /* Hold the alloc while the destination slot lets go of its handles
     * (which may be the last ones naming it). */
    allocs[a].handles++;
    slot_clear(dst);
    slot_take(dst, h, a, base + off, size);
    allocs[a].handles--;
}

static void op_retain(reader *r)
{
    int s = rd8(r) % SLOTS;
    if (slots[s].h.bits == 0)
        return;
    cube_error *err = cube_handle_retain(g_client, slots[s].h);
    if (!slot_live(s))
        return expect(err, CUBE_ERR_NOT_FOUND);
    expect(err, CUBE_OK);
    slots[s].refs++;
}

static void op_release(reader *r)
{
    int s = rd8(r) % SLOTS;
    if (slots[s].h.bits == 0)
        return;
    cube_error *err = cube_handle_release(g_client, slots[s].h);
    if (!slot_live(s))
        return expect(err, CUBE_ERR_NOT_FOUND);
    expect(err, CUBE_OK);
    if (--slots[s].refs == 0)
        slot_dead(s);
}

static void op_size(reader *r)
{
    int s = rd8(r) % SLOTS;
    if (slots[s].h.bits == 0)
        return;
    uint64_t size = 0;
    cube_error *err = cube_handle_size(g_client, slots[s].h, &size);
    if (!slot_live(s))
        return expect(err, CUBE_ERR_NOT_FOUND);
    expect(err, CUBE_OK);
    if (size != slots[s].size)
        fail_model("cube_handle_size differs from the model", NULL);
}

/* A slot a uint32_t kernel may bind: live, 4-byte aligned and sized. */
static int slot_words(int s)
{
    return slot_live(s) && slots[s].offset % 4 == 0 && slots[s].size % 4 == 0;
}

static int ranges_race(int x, int y)
{
    if (slots[x].alloc != slots[y].alloc)
        return 0;
    if (slots[x].offset == slots[y].offset && slots[x].size == slots[y].size)
        return 0; /* the same elements: each unit reads and writes its own */
    return slots[x].offset < slots[y].offset + slots[y].size &&
           slots[y].offset < slots[x].offset + slots[x].size;
}

static uint32_t get32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
           (uint32_t)p[3] << 24;
}

static void put32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
    p[2] = (uint8_t)(v >> 16);
    p[3] = (uint8_t)(v >> 24);
}

static cube_count words_count(uint32_t bytes)
{
    uint32_t n = bytes / 4;
    return cube_count_static(n ? (n + 63) / 64 : 1, 1, 1);
}

/* y = a * x + y over the words both ranges hold. */
static void apply_axpy(const model_rec *rc)
{
    model_alloc *ax = &allocs[rc->xa], *ay = &allocs[rc->ya];
    uint32_t n = rc->ysize < rc->xsize ? rc->ysize : rc->xsize;
    for (uint32_t i = 0; i < n; i += 4) {
        uint8_t *py = ay->bytes + rc->yoff + i;
        uint8_t *ky = ay->known + rc->yoff + i;
        const uint8_t *px = ax->bytes + rc->xoff + i;
        const uint8_t *kx = ax->known + rc->xoff + i;
        int known =
            ky[0] & ky[1] & ky[2] & ky[3] & kx[0] & kx[1] & kx[2] & kx[3];
        put32(py, rc->scalar * get32(px) + get32(py));
        memset(ky, known, 4);
    }
}

static void apply_fill(const model_rec *rc)
{
    model_alloc *a = &allocs[rc->ya];
    for (uint32_t i = 0; i < rc->ysize; i += 4)
        put32(a->bytes + rc->yoff + i, rc->scalar);
    memset(a->known + rc->yoff, 1, rc->ysize);
}

/* A recorded all-reduce: the source's bytes copied to the destination
 * (one rank's sum). */
static void apply_copy(const model_rec *rc)
{
    model_alloc *ax = &allocs[rc->xa], *ay = &allocs[rc->ya];
    memmove(ay->bytes + rc->yoff, ax->bytes + rc->xoff, rc->ysize);
    memmove(ay->known + rc->yoff, ax->known + rc->xoff, rc->ysize);
}

/* A recorded all-reduce that covers its destination's whole buffer. */
static int rec_whole_copy(const model_rec *rc)
{
    return rc->kind == REC_COPY && rc->yoff == 0 &&
           rc->ysize == allocs[rc->ya].size;
}

static model_rec make_rec(int kind, int y, int x, uint32_t scalar)
{
    model_rec rc;
    memset(&rc, 0, sizeof rc);
    rc.kind = kind;
    rc.ya = slots[y].alloc;
    rc.yoff = slots[y].offset;
    rc.ysize = slots[y].size;
    if (kind == REC_AXPY) {
        rc.xa = slots[x].alloc;
        rc.xoff = slots[x].offset;
        rc.xsize = slots[x].size;
    }
    rc.scalar = scalar;
    return rc;
}

/* A launch the capture keeps: its buffers stay pinned until the graph is
 * destroyed. */
static void record_launch(const model_rec *rc)
{
    model_stream *st = cs();
    st->rec[st->nrec++] = *rc;
    allocs[rc->ya].pins++;
    if (rc->kind != REC_FILL)
        allocs[rc->xa].pins++;
}

static void unpin_recs(const model_rec *rec, int n)
{
    for (int i = 0; i < n; i++) {
        allocs[rec[i].ya].pins--;
        if (rec[i].kind != REC_FILL)
            allocs[rec[i].xa].pins--;
    }
}

/* A launch would be recorded but the model's capture is full: skip it. */
static int capture_full(void)
{
    return capturing() && !dry_depth && cs()->nrec >= MAX_REC;
}

/* y = a * x + y over uint32_t (wrapping), x read-only, y read and written;
 * with `bad`, a buffer stands where the scalar belongs, so the launch fails
 * its signature check and the failure lands on y only. On a capturing
 * stream a launch that passes its checks is recorded, not run. */
static void op_axpy(reader *r, int bad)
{
    int x = rd8(r) % SLOTS, y = rd8(r) % SLOTS, z = rd8(r) % SLOTS;
    uint32_t av = (uint32_t)rd16(r);
    if (!slot_words(x) || !slot_words(y) || ranges_race(x, y))
        return;
    if (bad && !slot_live(z))
        return;
    if (!bad && capture_full())
        return;
    cube_arg args[3] = {cube_arg_buffer(slots[x].h),
                        cube_arg_buffer(slots[y].h),
                        bad ? cube_arg_buffer(slots[z].h) : cube_arg_u32(av)};
    cube_error *err =
        cube_launch(g_client, g_axpy, words_count(slots[y].size), args, 3, 0);
    model_alloc *ax = slot_alloc(x), *ay = slot_alloc(y);
    if (!g_kernels) {
        expect(err, CUBE_ERR_UNSUPPORTED);
        if (!dry_depth) {
            ax->failed = ay->failed = 1;
            if (bad)
                slot_alloc(z)->failed = 1;
            cs()->failures++;
        }
        return;
    }
    if (bad) {
        if (ax->failed || ay->failed)
            expect2(err, CUBE_ERR_INVALID_ARGUMENT, CUBE_ERR_SEVERAL);
        else
            expect(err, CUBE_ERR_INVALID_ARGUMENT);
        if (!dry_depth) {
            ay->failed = 1;
            cs()->failures++;
        }
        return;
    }
    if (dry_depth)
        return expect(err, CUBE_OK);
    if (ax->failed || ay->failed) {
        expect(err, CUBE_ERR_SEVERAL);
        ay->failed = 1;
        cs()->failures++;
        return;
    }
    expect(err, CUBE_OK);
    model_rec rc = make_rec(REC_AXPY, y, x, av);
    if (capturing())
        return record_launch(&rc);
    apply_axpy(&rc);
    cs()->launches++;
    cs()->work++;
}

/* y = v everywhere: y is CUBE_OUT, so success makes its buffer trusted. */
static void op_fill(reader *r)
{
    int y = rd8(r) % SLOTS;
    uint32_t v = (uint32_t)rd16(r) * 2654435761u;
    if (!slot_words(y) || capture_full())
        return;
    cube_arg args[2] = {cube_arg_buffer(slots[y].h), cube_arg_u32(v)};
    cube_error *err =
        cube_launch(g_client, g_fill, words_count(slots[y].size), args, 2, 0);
    model_alloc *a = slot_alloc(y);
    if (!g_kernels) {
        expect(err, CUBE_ERR_UNSUPPORTED);
        if (!dry_depth) {
            a->failed = 1;
            cs()->failures++;
        }
        return;
    }
    expect(err, CUBE_OK);
    if (dry_depth)
        return;
    model_rec rc = make_rec(REC_FILL, y, 0, v);
    if (capturing())
        return record_launch(&rc);
    apply_fill(&rc);
    a->failed = 0;
    cs()->launches++;
    cs()->work++;
}

/* cube_sync or cube_check over the slots named by a bit mask. */
static void op_barrier(reader *r, int sync)
{
    uint8_t mask = rd8(r);
    cube_handle hs[SLOTS];
    size_t n = 0;
    int stale = 0, failed = 0;
    for (int s = 0; s < SLOTS; s++) {
        if (!(mask >> s & 1) || slots[s].h.bits == 0)
            continue;
        hs[n++] = slots[s].h;
        if (!slot_live(s))
            stale = 1;
        else if (slot_alloc(s)->failed)
            failed = 1;
        if (g_trace)
            fprintf(stderr,
                    "  barrier slot %d (alloc %d, live %d, failed %d)\n", s,
                    slots[s].alloc, slot_live(s),
                    slot_live(s) ? slot_alloc(s)->failed : -1);
    }
    if (!sync && n == 0)
        return; /* check of nothing: not specified beyond success */
    cube_error *err =
        sync ? cube_sync(g_client, hs, n) : cube_check(g_client, hs, n);
    if (stale)
        return expect(err, CUBE_ERR_NOT_FOUND);
    if (sync && capturing())
        return expect(err, CUBE_ERR_GRAPH_STATE); /* a check is allowed */
    expect(err, failed ? CUBE_ERR_SEVERAL : CUBE_OK);
}

static void op_stream(reader *r)
{
    cube_stream_id id = rd8(r) % 4;
    expect(cube_stream_use(g_client, id), CUBE_OK);
    if (id != 0 && cube_stream_current(g_client) != id)
        fail_model("cube_stream_current does not name the stream used", NULL);
    cur = (int)id;
}

static void op_dry(reader *r)
{
    if (rd8(r) & 1) {
        if (dry_depth < 4) {
            expect(cube_dry_run_begin(g_client), CUBE_OK);
            dry_depth++;
        }
    } else if (dry_depth > 0) {
        expect(cube_dry_run_end(g_client), CUBE_OK);
        dry_depth--;
    } else {
        /* No scope open: an end is refused and changes nothing. */
        expect(cube_dry_run_end(g_client), CUBE_ERR_INVALID_ARGUMENT);
    }
    if (!!cube_dry_run_active(g_client) != !!dry_depth)
        fail_model("cube_dry_run_active differs from the model", NULL);
}

/* A handle value this client never handed out for a live slot. */
static cube_handle foreign_handle(uint64_t bits)
{
    cube_handle h = {bits};
    for (int s = 0; s < SLOTS; s++)
        if (slot_live(s) && slots[s].h.bits == bits)
            h.bits = 0;
    return h;
}

static void op_hostile(reader *r)
{
    uint8_t which = rd8(r);
    cube_handle h = {0};
    int s = rd8(r) % SLOTS;
    cube_handle any = slot_live(s) ? slots[s].h : (cube_handle){0};
    uint8_t byte = 1;
    cube_copy_desc d = cube_copy_desc_contiguous(any, 1, 1);
    void *dst[1] = {&byte};
    const void *src[1] = {&byte};
    uint64_t one[1] = {1};
    cube_arg args[2] = {cube_arg_buffer(any), cube_arg_u32(1)};
    switch (which % 20) {
    case 0: expect(cube_empty(NULL, 16, &h), CUBE_ERR_INVALID_ARGUMENT); break;
    case 1:
        expect(cube_empty(g_client, 0, &h), CUBE_ERR_INVALID_ARGUMENT);
        break;
    case 2:
        expect(cube_empty(g_client, 16, NULL), CUBE_ERR_INVALID_ARGUMENT);
        break;
    case 3:
        expect(cube_empty(g_client, (uint64_t)1 << 62, &h),
               CUBE_ERR_BUFFER_TOO_BIG);
        break;
    case 4:
        expect(cube_create(g_client, NULL, 16, &h), CUBE_ERR_INVALID_ARGUMENT);
        break;
    case 5: {
        cube_handle f = foreign_handle(rd64(r));
        if (f.bits == 0)
            break;
        expect(cube_handle_retain(g_client, f), CUBE_ERR_NOT_FOUND);
        expect(cube_handle_release(g_client, f), CUBE_ERR_NOT_FOUND);
        expect(cube_check(g_client, &f, 1), CUBE_ERR_NOT_FOUND);
        uint64_t size;
        expect(cube_handle_size(g_client, f, &size), CUBE_ERR_NOT_FOUND);
        expect(cube_handle_slice(g_client, f, 0, 1, &h), CUBE_ERR_NOT_FOUND);
        break;
    }
    case 6:
        expect(cube_handle_retain(NULL, any), CUBE_ERR_INVALID_ARGUMENT);
        expect(cube_handle_release(NULL, any), CUBE_ERR_INVALID_ARGUMENT);
        break;
    case 7:
        expect(cube_write(g_client, &d, src, one, 0),
               CUBE_ERR_INVALID_ARGUMENT);
        expect(cube_write(g_client, NULL, src, one, 1),
               CUBE_ERR_INVALID_ARGUMENT);
        expect(cube_write(NULL, &d, src, one, 1), CUBE_ERR_INVALID_ARGUMENT);
        break;
    case 8:
        if (!any.bits)
            break;
        expect(cube_read(g_client, &d, NULL, one, 1),
               CUBE_ERR_INVALID_ARGUMENT);
        expect(cube_read(g_client, &d, dst, NULL, 1),
               CUBE_ERR_INVALID_ARGUMENT);
        break;
    case 9:
        if (!any.bits)
            break;
        /* A source size that differs from the descriptor's bytes. */
        one[0] = 2;
        expect(cube_write(g_client, &d, src, one, 1),
               CUBE_ERR_INVALID_ARGUMENT);
        break;
    case 10:
        if (!any.bits)
            break;
        d.rank = 0;
        expect(cube_write(g_client, &d, src, one, 1),
               CUBE_ERR_INVALID_ARGUMENT);
        d.rank = CUBE_MAX_RANK + 1;
        expect(cube_read(g_client, &d, dst, one, 1), CUBE_ERR_INVALID_ARGUMENT);
        break;
    case 11:
        if (!any.bits)
            break;
        d.elem_size = 0;
        expect(cube_write(g_client, &d, src, one, 1),
               CUBE_ERR_INVALID_ARGUMENT);
        d.elem_size = 65;
        expect(cube_write(g_client, &d, src, one, 1),
               CUBE_ERR_INVALID_ARGUMENT);
        break;
    case 12:
        if (!any.bits)
            break;
        expect(cube_handle_slice(g_client, any, UINT64_MAX, 2, &h),
               CUBE_ERR_INVALID_ARGUMENT);
        expect(cube_handle_slice(g_client, any, 0, UINT64_MAX, &h),
               CUBE_ERR_INVALID_ARGUMENT);
        expect(cube_handle_slice(g_client, any, 0, 1, NULL),
               CUBE_ERR_INVALID_ARGUMENT);
        break;
    case 13:
        if (!any.bits)
            break;
        expect(cube_launch(g_client, g_fill, cube_count_static(0, 1, 1), args,
                           2, 0),
               CUBE_ERR_INVALID_ARGUMENT);
        break;
    case 14:
        if (!any.bits)
            break;
        expect(cube_launch(g_client, g_fill, cube_count_static(1, 1, 1), args,
                           2, 1u << 7),
               CUBE_ERR_INVALID_ARGUMENT);
        break;
    case 15:
        expect(cube_launch(g_client, g_fill, cube_count_static(1, 1, 1), NULL,
                           2, 0),
               CUBE_ERR_INVALID_ARGUMENT);
        expect(
            cube_launch(NULL, g_fill, cube_count_static(1, 1, 1), args, 2, 0),
            CUBE_ERR_INVALID_ARGUMENT);
        expect(
            cube_launch(g_client, NULL, cube_count_static(1, 1, 1), args, 2, 0),
            CUBE_ERR_INVALID_ARGUMENT);
        break;
    case 16:
        expect(cube_sync(g_client, NULL, 1), CUBE_ERR_INVALID_ARGUMENT);
        expect(cube_check(g_client, NULL, 1), CUBE_ERR_INVALID_ARGUMENT);
        expect(cube_sync(NULL, NULL, 0), CUBE_ERR_INVALID_ARGUMENT);
        break;
    case 17: {
        cube_handle f = foreign_handle(rd64(r));
        if (f.bits == 0)
            break;
        cube_arg fa[2] = {cube_arg_buffer(f), cube_arg_u32(1)};
        expect(
            cube_launch(g_client, g_fill, cube_count_static(1, 1, 1), fa, 2, 0),
            CUBE_ERR_NOT_FOUND);
        cube_copy_desc fd = cube_copy_desc_contiguous(f, 1, 1);
        expect(cube_write(g_client, &fd, src, one, 1), CUBE_ERR_NOT_FOUND);
        expect(cube_read(g_client, &fd, dst, one, 1), CUBE_ERR_NOT_FOUND);
        break;
    }
    case 18:
        expect(cube_stream_use(NULL, 1), CUBE_ERR_INVALID_ARGUMENT);
        expect(cube_memory_cleanup(NULL), CUBE_ERR_INVALID_ARGUMENT);
        expect(cube_flush(NULL), CUBE_ERR_INVALID_ARGUMENT);
        break;
    default: expect(cube_flush(g_client), CUBE_OK); break;
    }
}

/* --- strided copies -------------------------------------------------------
 */

static uint64_t sat_add(uint64_t a, uint64_t b)
{
    return a > UINT64_MAX - b ? UINT64_MAX : a + b;
}

static uint64_t sat_mul(uint64_t a, uint64_t b)
{
    return a && b > UINT64_MAX / a ? UINT64_MAX : a * b;
}

/* Expected answer for descriptor d over a range of `range` bytes, from
 * buffer.h: rank 1..CUBE_MAX_RANK, element size 1..64, no zero extent, a
 * zero stride only where its extent is 1 (unless every stride is zero:
 * contiguous), the last element inside the range. *bytes is the packed
 * size, *contiguous whether the elements lie row-major without gaps. */
static cube_code desc_check(const cube_copy_desc *d, uint64_t range,
                            uint64_t *bytes, int *contiguous)
{
    *bytes = 0;
    *contiguous = 0;
    if (d->rank == 0 || d->rank > CUBE_MAX_RANK)
        return CUBE_ERR_INVALID_ARGUMENT;
    if (d->elem_size == 0 || d->elem_size > 64)
        return CUBE_ERR_INVALID_ARGUMENT;
    int strided = 0;
    for (uint32_t k = 0; k < d->rank; k++)
        strided |= d->strides[k] != 0;
    uint64_t elems = 1, last = 0, row = 1;
    int contig = 1;
    for (int k = (int)d->rank - 1; k >= 0; k--) {
        uint64_t extent = d->shape[k];
        if (extent == 0)
            return CUBE_ERR_INVALID_ARGUMENT;
        uint64_t stride = strided ? d->strides[k] : row;
        if (stride == 0 && extent > 1)
            return CUBE_ERR_INVALID_ARGUMENT;
        if (extent > 1 && stride != row)
            contig = 0;
        last = sat_add(last, sat_mul(extent - 1, stride));
        elems = sat_mul(elems, extent);
        row = sat_mul(row, extent);
    }
    /* Saturated values are far past any range this model makes. */
    uint64_t end = sat_mul(sat_add(last, 1), d->elem_size);
    if (end > range)
        return CUBE_ERR_INVALID_ARGUMENT;
    *bytes = elems * d->elem_size;
    *contiguous = contig;
    return CUBE_OK;
}

/* The byte offset in the range of each element, in shape order (the
 * order of the packed host data); d passed desc_check. */
static size_t desc_offsets(const cube_copy_desc *d, uint32_t *out)
{
    uint64_t stride[CUBE_MAX_RANK], idx[CUBE_MAX_RANK];
    int strided = 0;
    for (uint32_t k = 0; k < d->rank; k++)
        strided |= d->strides[k] != 0;
    uint64_t row = 1;
    for (int k = (int)d->rank - 1; k >= 0; k--) {
        stride[k] = strided ? d->strides[k] : row;
        row *= d->shape[k];
        idx[k] = 0;
    }
    size_t n = 0;
    for (;;) {
        uint64_t off = 0;
        for (uint32_t k = 0; k < d->rank; k++)
            off += idx[k] * stride[k];
        out[n++] = (uint32_t)(off * d->elem_size);
        int k = (int)d->rank - 1;
        while (k >= 0 && ++idx[k] == d->shape[k])
            idx[k--] = 0;
        if (k < 0)
            return n;
    }
}

/* A descriptor from the input: contiguous, pitched (a block of a larger
 * row-major array), any small strides (overlapping, zero), or hostile.
 * Returns 1 when the host size given with it must be wrong. */
static int gen_desc(reader *r, cube_copy_desc *d, int *slot)
{
    static const uint32_t elem_sizes[4] = {1, 2, 4, 8};
    uint8_t mode = rd8(r);
    *slot = rd8(r) % SLOTS;
    memset(d, 0, sizeof *d);
    d->rank = 1 + rd8(r) % 3u;
    d->elem_size = elem_sizes[rd8(r) & 3];
    for (uint32_t k = 0; k < d->rank; k++)
        d->shape[k] = 1 + rd8(r) % 8u;
    uint32_t last = d->rank - 1;
    switch (mode % 4) {
    case 0: break; /* strides all zero: contiguous */
    case 1:
        d->strides[last] = 1 + (rd8(r) & 1);
        for (int k = (int)last - 1; k >= 0; k--)
            d->strides[k] = d->shape[k + 1] * d->strides[k + 1] + rd8(r) % 4u;
        break;
    case 2:
        for (uint32_t k = 0; k < d->rank; k++)
            d->strides[k] = rd8(r) % 12u;
        break;
    default:
        switch (rd8(r) % 10) {
        case 0: d->rank = 0; break;
        case 1: d->rank = CUBE_MAX_RANK + 1 + rd8(r) % 4u; break;
        case 2: d->elem_size = 0; break;
        case 3: d->elem_size = 65 + rd8(r); break;
        case 4: d->shape[rd8(r) % d->rank] = 0; break;
        case 5:
            for (uint32_t k = 0; k < d->rank; k++)
                d->strides[k] = 1 + rd8(r) % 4u;
            d->shape[0] = 2;
            d->strides[0] = (uint64_t)1 << (40 + rd8(r) % 24u);
            break;
        case 6: d->shape[0] = (uint64_t)1 << (32 + rd8(r) % 32u); break;
        case 7: return 1;
        case 8:
            for (uint32_t k = 0; k < d->rank; k++)
                d->shape[k] = 200;
            break;
        default:
            /* The highest rank, every extent 1 but one. */
            d->rank = CUBE_MAX_RANK;
            for (uint32_t k = 0; k < CUBE_MAX_RANK; k++)
                d->shape[k] = 1;
            d->shape[rd8(r) % CUBE_MAX_RANK] = 1 + rd8(r) % 16u;
            break;
        }
    }
    return 0;
}

/* cube_write or cube_read (blocking or through a future) of one or two
 * descriptors over slots' ranges. Overlapping elements of a write leave
 * their bytes undefined in the model: the order of the stores is not
 * specified. */
static void op_strided(reader *r, int write)
{
    static uint8_t host[2][HOST_MAX + 16];
    static uint32_t offs[2][HOST_MAX];
    uint8_t flags = rd8(r);
    size_t n = 1 + (flags & 1);
    int async = (flags >> 1) & 1;
    cube_copy_desc d[2];
    int sl[2], contig[2];
    cube_code code[2];
    uint64_t bytes[2], sizes[2];
    for (size_t i = 0; i < n; i++) {
        int wrong = gen_desc(r, &d[i], &sl[i]);
        if (slots[sl[i]].h.bits == 0)
            return;
        d[i].handle = slots[sl[i]].h;
        if (!slot_live(sl[i])) {
            code[i] = CUBE_ERR_NOT_FOUND;
            bytes[i] = 0;
        } else {
            code[i] =
                desc_check(&d[i], slots[sl[i]].size, &bytes[i], &contig[i]);
        }
        if (code[i] == CUBE_OK && bytes[i] > HOST_MAX)
            return; /* more host bytes than the model keeps */
        sizes[i] = bytes[i] <= HOST_MAX ? bytes[i] : HOST_MAX;
        if (wrong) {
            sizes[i]++;
            if (code[i] == CUBE_OK)
                code[i] = CUBE_ERR_INVALID_ARGUMENT;
        }
    }
    uint8_t seed = rd8(r);
    for (size_t i = 0; i < n; i++)
        for (size_t k = 0; k < sizeof host[i]; k++)
            host[i][k] = write ? (uint8_t)(seed + k * 29u + i) : 0xA5;
    cube_error *err;
    if (write) {
        const void *srcs[2] = {host[0], host[1]};
        err = cube_write(g_client, d, srcs, sizes, n);
    } else {
        void *dsts[2] = {host[0], host[1]};
        if (async) {
            cube_future *f = NULL;
            err = cube_read_async(g_client, d, dsts, sizes, n, &f);
            if (!err) {
                err = cube_future_wait(f);
                cube_future_free(f);
            }
        } else {
            err = cube_read(g_client, d, dsts, sizes, n);
        }
    }
    /* The descriptors' own mistakes first (the first one's code; with two
     * different ones either), then a capture's refusal, then a read's
     * failure check. */
    cube_code want = CUBE_OK, other = CUBE_OK;
    for (size_t i = 0; i < n; i++) {
        if (code[i] == CUBE_OK)
            continue;
        if (want == CUBE_OK)
            want = code[i];
        else if (code[i] != want)
            other = code[i];
    }
    int failed = 0;
    for (size_t i = 0; i < n && want == CUBE_OK; i++)
        failed |= slot_alloc(sl[i])->failed;
    if (want == CUBE_OK && capturing())
        want = CUBE_ERR_GRAPH_STATE;
    else if (want == CUBE_OK && !write && failed)
        want = CUBE_ERR_SEVERAL;
    if (other != CUBE_OK)
        expect2(err, want, other);
    else
        expect(err, want);
    if (want != CUBE_OK) {
        if (!write)
            for (size_t i = 0; i < n; i++)
                for (size_t k = 0; k < sizeof host[i]; k++)
                    if (host[i][k] != 0xA5)
                        fail_model("a refused read wrote its destination",
                                   NULL);
        return;
    }
    cs()->work++;
    size_t count[2];
    for (size_t i = 0; i < n; i++)
        count[i] = desc_offsets(&d[i], offs[i]);
    if (!write) {
        for (size_t i = 0; i < n; i++) {
            model_alloc *a = slot_alloc(sl[i]);
            uint32_t base = slots[sl[i]].offset, es = d[i].elem_size;
            for (size_t e = 0; e < count[i]; e++) {
                for (uint32_t b = 0; b < es; b++) {
                    uint32_t at = base + offs[i][e] + b;
                    uint8_t got = host[i][e * es + b];
                    if (a->known[at] && got != a->bytes[at]) {
                        char msg[160];
                        snprintf(msg, sizeof msg,
                                 "descriptor %zu element %zu byte %u (alloc "
                                 "byte %u): read 0x%02x, model 0x%02x",
                                 i, e, b, at, got, a->bytes[at]);
                        fail_model(msg, NULL);
                    }
                }
            }
            for (size_t k = sizes[i]; k < sizeof host[i]; k++)
                if (host[i][k] != 0xA5)
                    fail_model("a read wrote past its destination size", NULL);
        }
        return;
    }
    /* Bytes stored by more than one element of the batch are undefined. */
    static uint8_t cover[ALLOCS][MAX_SIZE];
    memset(cover, 0, sizeof cover);
    for (int pass = 0; pass < 2; pass++) {
        for (size_t i = 0; i < n; i++) {
            int ai = slots[sl[i]].alloc;
            model_alloc *a = &allocs[ai];
            uint32_t base = slots[sl[i]].offset, es = d[i].elem_size;
            for (size_t e = 0; e < count[i]; e++) {
                for (uint32_t b = 0; b < es; b++) {
                    uint32_t at = base + offs[i][e] + b;
                    if (pass == 0) {
                        cover[ai][at] = cover[ai][at] ? 2 : 1;
                        continue;
                    }
                    a->bytes[at] = host[i][e * es + b];
                    a->known[at] = cover[ai][at] == 1;
                }
            }
        }
    }
    for (size_t i = 0; i < n; i++) {
        model_alloc *a = slot_alloc(sl[i]);
        if (contig[i] && slots[sl[i]].offset == 0 && bytes[i] == a->size)
            a->failed = 0;
    }
}

/* --- graphs -------------------------------------------------------------- */

static int graphs_in_use(void)
{
    int n = 0;
    for (int g = 0; g < GRAPHS; g++)
        n += graphs[g].live;
    for (int s = 0; s < STREAMS; s++)
        n += streams[s].capturing;
    return n;
}

/* An id that names no live graph: the last destroyed one, or any other. */
static cube_graph_id unknown_graph(reader *r)
{
    cube_graph_id id = (rd8(r) & 1) ? last_destroyed : rd64(r);
    for (int g = 0; g < GRAPHS; g++)
        if (graphs[g].live && graphs[g].id == id)
            return 0;
    return id;
}

/* Replay of a live graph: its inputs (what it reads before a launch of its
 * own rewrote it whole) are checked first; one that carries a failure
 * fails the replay, and every buffer the graph writes, with
 * CUBE_ERR_SEVERAL. Otherwise every recorded launch is applied in order
 * and the buffers written through CUBE_OUT are trusted again. */
static void replay_live(model_graph *g)
{
    cube_error *err = cube_graph_replay(g_client, g->id);
    if (capturing())
        return expect(err, CUBE_ERR_GRAPH_STATE);
    if (dry_depth)
        return expect(err, CUBE_OK);
    int cleared[MAX_REC], ncleared = 0, failed = 0;
    for (int i = 0; i < g->nrec; i++) {
        const model_rec *rc = &g->rec[i];
        if (rc->kind == REC_FILL) {
            cleared[ncleared++] = rc->ya;
            continue;
        }
        /* An all-reduce reads its source only; axpy reads x and y. */
        int reads[2] = {rc->xa, rc->ya};
        for (int k = 0; k < (rc->kind == REC_COPY ? 1 : 2); k++) {
            int own = 0;
            for (int c = 0; c < ncleared; c++)
                own |= cleared[c] == reads[k];
            if (!own && allocs[reads[k]].failed)
                failed = 1;
        }
        if (rec_whole_copy(rc))
            cleared[ncleared++] = rc->ya;
    }
    if (failed) {
        expect(err, CUBE_ERR_SEVERAL);
        for (int i = 0; i < g->nrec; i++)
            allocs[g->rec[i].ya].failed = 1;
        cs()->failures++;
        return;
    }
    expect(err, CUBE_OK);
    for (int i = 0; i < g->nrec; i++) {
        if (g->rec[i].kind == REC_FILL)
            apply_fill(&g->rec[i]);
        else if (g->rec[i].kind == REC_COPY)
            apply_copy(&g->rec[i]);
        else
            apply_axpy(&g->rec[i]);
    }
    for (int i = 0; i < g->nrec; i++)
        if (g->rec[i].kind == REC_FILL || rec_whole_copy(&g->rec[i]))
            allocs[g->rec[i].ya].failed = 0;
    cs()->launches += (uint64_t)g->nrec;
    if (g->nrec)
        cs()->work++;
}

/* Ends the calling stream's capture. A backend that records hardware
 * graphs refuses a capture that had to take new device memory
 * (cubert/graph.h); whether pooled memory served what the window
 * allocated (a cube_empty, a dry run's buffer backed at its first launch)
 * is the pools' business, which the model does not follow, so both
 * answers are accepted there, and a refusal ends the capture without a
 * graph. Returns 1, with *id set, when a graph was made. */
static int end_capture(model_stream *st, cube_graph_id *id)
{
    cube_error *err = cube_graph_end(g_client, id);
    int allocated = st->allocated;
    st->allocated = 0;
    (void)allocated; /* also a dry run's buffer backed in the window */
    if (g_hw_graphs && cube_error_code(err) == CUBE_ERR_GRAPH_STATE &&
        strstr(cube_error_message(err), "new device memory")) {
        cube_error_free(err);
        if (*id != 0)
            fail_model("a refused cube_graph_end set an id", NULL);
        unpin_recs(st->rec, st->nrec);
        st->capturing = st->prepared = 0;
        st->nrec = 0;
        return 0;
    }
    expect(err, CUBE_OK);
    return 1;
}

static void op_graph(reader *r)
{
    uint8_t which = rd8(r);
    uint8_t arg = rd8(r);
    model_stream *st = cs();
    model_graph *g = &graphs[arg % GRAPHS];
    cube_graph_id id = 0;
    cube_error *err;
    if (g_trace)
        fprintf(stderr, "  graph step %u, graph %u, capturing %d\n", which % 10,
                arg % GRAPHS, st->capturing);
    switch (which % 10) {
    case 0:
    case 1:
        err = cube_graph_prepare(g_client);
        if (st->capturing)
            return expect(err, CUBE_ERR_GRAPH_STATE);
        expect(err, CUBE_OK);
        st->prepared = 1;
        break;
    case 2:
        if (!st->capturing && st->prepared && graphs_in_use() >= GRAPHS)
            return;
        err = cube_graph_begin(g_client);
        if (st->capturing || !st->prepared)
            return expect(err, CUBE_ERR_GRAPH_STATE);
        expect(err, CUBE_OK);
        st->capturing = 1;
        st->nrec = 0;
        break;
    case 3:
        if (!st->capturing) {
            err = cube_graph_end(g_client, &id);
            expect(err, CUBE_ERR_GRAPH_STATE);
            if (id != 0)
                fail_model("a refused cube_graph_end set an id", NULL);
            return;
        }
        if (!end_capture(st, &id))
            return;
        if (id == 0)
            fail_model("cube_graph_end handed out id 0", NULL);
        for (g = graphs; g->live; g++)
            ; /* begin left room for it */
        g->live = 1;
        g->id = id;
        g->nrec = st->nrec;
        memcpy(g->rec, st->rec, sizeof g->rec);
        st->capturing = st->prepared = 0;
        st->nrec = 0;
        break;
    case 4:
    case 5:
        if (g->live)
            replay_live(g);
        break;
    case 6:
        id = unknown_graph(r);
        err = cube_graph_replay(g_client, id);
        /* A capture refuses first, whatever the id. */
        expect(err, capturing() ? CUBE_ERR_GRAPH_STATE : CUBE_ERR_NOT_FOUND);
        break;
    case 7:
        if (!g->live)
            break;
        /* Allowed on a capturing stream: nothing is issued. */
        expect(cube_graph_destroy(g_client, g->id), CUBE_OK);
        unpin_recs(g->rec, g->nrec);
        g->live = 0;
        last_destroyed = g->id;
        break;
    case 8:
        id = unknown_graph(r);
        expect(cube_graph_destroy(g_client, id), CUBE_ERR_NOT_FOUND);
        break;
    default:
        expect(cube_graph_prepare(NULL), CUBE_ERR_INVALID_ARGUMENT);
        expect(cube_graph_begin(NULL), CUBE_ERR_INVALID_ARGUMENT);
        expect(cube_graph_end(NULL, &id), CUBE_ERR_INVALID_ARGUMENT);
        expect(cube_graph_end(g_client, NULL), CUBE_ERR_INVALID_ARGUMENT);
        expect(cube_graph_replay(NULL, g->id), CUBE_ERR_INVALID_ARGUMENT);
        expect(cube_graph_destroy(NULL, g->id), CUBE_ERR_INVALID_ARGUMENT);
        break;
    }
}

/* --- profiling windows --------------------------------------------------- */

static void window_drop(model_stream *st, int i)
{
    last_closed = st->win[i].token;
    st->win[i] = st->win[--st->nwin];
}

/* Another stream's open window, or -1. */
static int foreign_window(uint8_t pick, int *stream)
{
    for (int k = 0; k < STREAMS; k++) {
        int s = (pick + k) % STREAMS;
        if (s != cur && streams[s].nwin > 0) {
            *stream = s;
            return pick % streams[s].nwin;
        }
    }
    return -1;
}

/* A token open on no stream. */
static cube_profile_token unknown_token(reader *r)
{
    cube_profile_token t = (rd8(r) & 1) ? last_closed : rd64(r);
    for (int s = 0; s < STREAMS; s++)
        for (int i = 0; i < streams[s].nwin; i++)
            if (streams[s].win[i].token == t)
                return 0;
    return t;
}

static void op_profile(reader *r)
{
    uint8_t which = rd8(r);
    uint8_t pick = rd8(r);
    model_stream *st = cs();
    cube_profile_token t = 0;
    cube_profile_result res;
    cube_error *err;
    int fs = 0, fi;
    switch (which % 8) {
    case 0:
    case 1:
        if (st->nwin >= MAX_WIN)
            return;
        err = cube_profile_start(g_client, &t);
        if (capturing())
            return expect(err, CUBE_ERR_GRAPH_STATE);
        expect(err, CUBE_OK);
        if (t == 0)
            fail_model("cube_profile_start handed out token 0", NULL);
        for (int s = 0; s < STREAMS; s++)
            for (int i = 0; i < streams[s].nwin; i++)
                if (streams[s].win[i].token == t)
                    fail_model("a token handed out twice", NULL);
        st->win[st->nwin].token = t;
        st->win[st->nwin].failures = st->failures;
        st->win[st->nwin].launches = st->launches;
        st->win[st->nwin].work = st->work;
        st->nwin++;
        break;
    case 2:
    case 3: {
        if (st->nwin == 0)
            return;
        int i = pick % st->nwin;
        model_window w = st->win[i];
        memset(&res, 0xFF, sizeof res);
        err = cube_profile_end(g_client, w.token, &res);
        if (capturing())
            return expect(err, CUBE_ERR_GRAPH_STATE); /* stays open */
        window_drop(st, i);
        if (st->failures != w.failures)
            return expect(err, CUBE_ERR_PROFILE);
        expect(err, CUBE_OK);
        if (res.launches != st->launches - w.launches) {
            char msg[128];
            snprintf(msg, sizeof msg,
                     "window counted %llu launches, model %llu",
                     (unsigned long long)res.launches,
                     (unsigned long long)(st->launches - w.launches));
            fail_model(msg, NULL);
        }
        if (res.method != g_timing)
            fail_model("the window's timing method is not the device's", NULL);
        if (!(res.seconds >= 0.0) || res.seconds > 3600.0)
            fail_model("the window's duration is out of range", NULL);
        if (g_timing == CUBE_TIMING_HOST_CLOCK && st->work == w.work &&
            res.seconds != 0.0)
            fail_model("a window without work reported a duration", NULL);
        break;
    }
    case 4:
        fi = foreign_window(pick, &fs);
        if (fi < 0)
            return;
        err = cube_profile_end(g_client, streams[fs].win[fi].token, &res);
        expect(err, capturing() ? CUBE_ERR_GRAPH_STATE : CUBE_ERR_PROFILE);
        break;
    case 5:
        t = unknown_token(r);
        if (t == 0)
            return;
        err = cube_profile_end(g_client, t, &res);
        expect(err, capturing() ? CUBE_ERR_GRAPH_STATE : CUBE_ERR_PROFILE);
        break;
    case 6:
        /* Abandon: the calling stream's window goes; another stream's
         * token, or an unknown one, is ignored. */
        if (pick & 1) {
            if (st->nwin == 0)
                return;
            int i = (pick >> 1) % st->nwin;
            cube_profile_abandon(g_client, st->win[i].token);
            window_drop(st, i);
        } else if ((fi = foreign_window(pick, &fs)) >= 0) {
            cube_profile_abandon(g_client, streams[fs].win[fi].token);
        } else {
            cube_profile_abandon(g_client, unknown_token(r));
        }
        break;
    default:
        expect(cube_profile_start(NULL, &t), CUBE_ERR_INVALID_ARGUMENT);
        expect(cube_profile_start(g_client, NULL), CUBE_ERR_INVALID_ARGUMENT);
        expect(cube_profile_end(NULL, 1, &res), CUBE_ERR_INVALID_ARGUMENT);
        if (st->nwin > 0)
            t = st->win[pick % st->nwin].token;
        expect(cube_profile_end(g_client, t, NULL), CUBE_ERR_INVALID_ARGUMENT);
        cube_profile_abandon(NULL, t);
        break;
    }
}

/* --- misaligned slices ----------------------------------------------------
 */

/* A slice whose offset is not a multiple of 4 bound to a uint32_t
 * parameter: refused with CUBE_ERR_INVALID_ARGUMENT once the kernel
 * compiled, recorded nowhere, in Skip mode too. Without kernels the
 * compile fails first (CUBE_ERR_UNSUPPORTED, on every bound buffer). */
static void op_misaligned(reader *r)
{
    int s = rd8(r) % SLOTS, t = rd8(r) % SLOTS;
    uint8_t how = rd8(r);
    if (!slot_live(s) || slots[s].offset % 4 == 0)
        return;
    uint32_t mode = (how & 4) ? CUBE_LAUNCH_SKIP : 0;
    cube_error *err;
    int bound[2] = {s, s};
    if (how % 3 == 0) {
        cube_arg args[2] = {cube_arg_buffer(slots[s].h), cube_arg_u32(7)};
        err = cube_launch(g_client, g_fill, words_count(slots[s].size), args, 2,
                          mode);
    } else {
        if (!slot_live(t))
            return;
        int x = how % 3 == 1 ? s : t, y = how % 3 == 1 ? t : s;
        bound[0] = x;
        bound[1] = y;
        cube_arg args[3] = {cube_arg_buffer(slots[x].h),
                            cube_arg_buffer(slots[y].h), cube_arg_u32(3)};
        err = cube_launch(g_client, g_axpy, words_count(slots[y].size), args, 3,
                          mode);
    }
    if (g_kernels)
        return expect(err, CUBE_ERR_INVALID_ARGUMENT);
    expect(err, CUBE_ERR_UNSUPPORTED);
    if (!dry_depth && !mode) {
        slot_alloc(bound[0])->failed = slot_alloc(bound[1])->failed = 1;
        cs()->failures++;
    }
}

/* --- a second thread ------------------------------------------------------
 */

/* What a spawned thread does, on a stream of its own naming (100 or 101:
 * a thread's own stream would outlive it in the client): makes, fills,
 * reads back and releases a buffer of its own, then fills or writes a
 * buffer of the main thread through its handle. The main thread checks
 * every answer after the join. */
typedef struct worker {
    cube_stream_id stream;
    uint32_t own_size, v, len;
    uint8_t seed;
    int slot_op; /* 0 none, 1 fill the slot's handle, 2 write it */
    cube_handle slot_h;
    cube_count slot_count;
    cube_stream_id current;
    int dry_active;
    cube_error *use, *create, *fill, *read, *release, *slot, *back;
    uint8_t got[MAX_SIZE];
} worker;

static void *worker_main(void *p)
{
    worker *w = p;
    w->use = cube_stream_use(g_client, w->stream);
    w->current = cube_stream_current(g_client);
    w->dry_active = cube_dry_run_active(g_client);
    uint8_t bytes[MAX_SIZE];
    for (uint32_t i = 0; i < MAX_SIZE; i++)
        bytes[i] = (uint8_t)(w->seed ^ (i * 31u));
    cube_handle h = {0};
    w->create = cube_create(g_client, bytes, w->own_size, &h);
    if (!w->create) {
        cube_arg args[2] = {cube_arg_buffer(h), cube_arg_u32(w->v)};
        w->fill =
            cube_launch(g_client, g_fill, words_count(w->own_size), args, 2, 0);
        cube_copy_desc d = cube_copy_desc_contiguous(h, w->own_size, 4);
        void *dst[1] = {w->got};
        uint64_t size[1] = {w->own_size};
        w->read = cube_read(g_client, &d, dst, size, 1);
        w->release = cube_handle_release(g_client, h);
    }
    if (w->slot_op == 1) {
        cube_arg args[2] = {cube_arg_buffer(w->slot_h), cube_arg_u32(w->v)};
        w->slot = cube_launch(g_client, g_fill, w->slot_count, args, 2, 0);
    } else if (w->slot_op == 2) {
        cube_copy_desc d = cube_copy_desc_contiguous(w->slot_h, w->len, 1);
        const void *src[1] = {bytes};
        uint64_t size[1] = {w->len};
        w->slot = cube_write(g_client, &d, src, size, 1);
    }
    w->back = cube_stream_use(g_client, 0);
    return NULL;
}

/* Whether slots x and y name overlapping, different ranges of one
 * allocation. */
static int slots_overlap(int x, int y)
{
    const model_slot *a = &slots[x], *b = &slots[y];
    return a->alloc == b->alloc && a->offset != b->offset &&
           a->offset < b->offset + b->size && b->offset < a->offset + a->size;
}

/* Copies `len` bytes of slot s's range onto slot d's in the model, and
 * clears d's failure when the copy covers its whole allocation. */
static void model_copy(int d, int s, uint32_t len)
{
    model_alloc *da = slot_alloc(d), *sa = slot_alloc(s);
    memmove(da->bytes + slots[d].offset, sa->bytes + slots[s].offset, len);
    memmove(da->known + slots[d].offset, sa->known + slots[s].offset, len);
    if (slots[d].offset == 0 && len == da->size)
        da->failed = 0;
}

/* What an all-reduce of `count` bytes from slot s to slot d answers on
 * its own rank before anything runs: its refusal, or CUBE_OK. */
static cube_code comm_refusal(int s, int d, uint32_t count)
{
    if (count == 0)
        return CUBE_ERR_INVALID_ARGUMENT;
    if (!slot_live(s))
        return CUBE_ERR_NOT_FOUND;
    if (count > slots[s].size)
        return CUBE_ERR_INVALID_ARGUMENT;
    if (!slot_live(d))
        return CUBE_ERR_NOT_FOUND;
    if (count > slots[d].size)
        return CUBE_ERR_INVALID_ARGUMENT;
    if (slots[s].alloc == slots[d].alloc &&
        slots[s].offset != slots[d].offset &&
        slots[s].offset < slots[d].offset + count &&
        slots[d].offset < slots[s].offset + count)
        return CUBE_ERR_INVALID_ARGUMENT;
    return CUBE_OK;
}

/* The effect of an all-reduce that passed its own rank's checks, its
 * source's failure as it was when the call was made; the code. */
static cube_code comm_effect(int s, int d, uint32_t count, int src_failed)
{
    /* A capture records it once the (one) rank agrees (a hardware graph
     * holds NCCL's kernels, a software one the call), a failed source
     * refusing it before anything is recorded, and the destination's
     * failure store left to the replays. */
    if (capturing()) {
        if (src_failed)
            return CUBE_ERR_SEVERAL;
        model_rec rc;
        memset(&rc, 0, sizeof rc);
        rc.kind = REC_COPY;
        rc.ya = slots[d].alloc;
        rc.yoff = slots[d].offset;
        rc.ysize = count;
        rc.xa = slots[s].alloc;
        rc.xoff = slots[s].offset;
        rc.xsize = count;
        record_launch(&rc);
        return CUBE_OK;
    }
    if (src_failed) {
        slot_alloc(d)->failed = 1;
        cs()->failures++;
        return CUBE_ERR_SEVERAL;
    }
    cs()->work++;
    cs()->launches++;
    /* The destination's failure goes when the write covers its buffer. */
    model_copy(d, s, count);
    return CUBE_OK;
}

/* Two all-reduces in one group on the one-rank communicator: each call
 * answers its own refusal at once (in a dry run a call that passes is
 * checked and dropped, not queued), and cube_group_end runs the queued
 * ones in order and answers the first failure; a source's failure is the
 * one it carried when its call was made. */
static void op_comm_group(reader *r)
{
    int s[2], d[2];
    uint32_t count[2];
    if (!g_comm)
        return; /* a backend without collectives */
    for (int i = 0; i < 2; i++) {
        s[i] = rd8(r) % SLOTS;
        d[i] = rd8(r) % SLOTS;
        count[i] = rd16(r) % (MAX_SIZE + 8);
        if (slots[s[i]].h.bits == 0 || slots[d[i]].h.bits == 0)
            return;
    }
    if (!g_hw_graphs && capturing() && !dry_depth && cs()->nrec + 2 > MAX_REC)
        return;
    expect(cube_group_begin(), CUBE_OK);
    cube_code own[2];
    int queued[2], src_failed[2];
    for (int i = 0; i < 2; i++) {
        own[i] = comm_refusal(s[i], d[i], count[i]);
        src_failed[i] = own[i] == CUBE_OK && slot_alloc(s[i])->failed;
        queued[i] = !dry_depth || own[i] != CUBE_OK;
        cube_error *err =
            cube_all_reduce(g_comm, slots[s[i]].h, slots[d[i]].h, count[i],
                            CUBE_DTYPE_U8, CUBE_REDUCE_SUM);
        if (g_trace)
            fprintf(stderr,
                    "  group all_reduce slot %d -> slot %d, %u bytes: %s\n",
                    s[i], d[i], count[i], cube_code_name(cube_error_code(err)));
        expect(err, own[i]);
    }
    cube_error *err = cube_group_end();
    cube_code first = CUBE_OK;
    for (int i = 0; i < 2; i++) {
        if (!queued[i])
            continue;
        cube_code code = own[i] != CUBE_OK
                             ? own[i]
                             : comm_effect(s[i], d[i], count[i], src_failed[i]);
        if (first == CUBE_OK)
            first = code;
    }
    if (g_trace)
        fprintf(stderr, "  group end: %s\n",
                cube_code_name(cube_error_code(err)));
    expect(err, first);
}

/* An all-reduce (u8 sum) on the one-rank communicator: the identity, with
 * every check a collective makes. */
static void op_comm(reader *r)
{
    int s = rd8(r) % SLOTS, d = rd8(r) % SLOTS;
    uint32_t count = rd16(r) % (MAX_SIZE + 8);
    if (!g_comm)
        return; /* a backend without collectives */
    if (slots[s].h.bits == 0 || slots[d].h.bits == 0)
        return;
    /* Software graphs record it: the model's capture must have room. */
    if (!g_hw_graphs && capture_full())
        return;
    cube_error *err = cube_all_reduce(g_comm, slots[s].h, slots[d].h, count,
                                      CUBE_DTYPE_U8, CUBE_REDUCE_SUM);
    if (g_trace)
        fprintf(stderr,
                "  all_reduce slot %d (alloc %d, failed %d) -> slot %d "
                "(alloc %d), %u bytes: %s\n",
                s, slots[s].alloc, allocs[slots[s].alloc].failed, d,
                slots[d].alloc, count, cube_code_name(cube_error_code(err)));
    cube_code own = comm_refusal(s, d, count);
    if (own != CUBE_OK)
        return expect(err, own);
    if (dry_depth)
        return expect(err, CUBE_OK);
    expect(err, comm_effect(s, d, count, slot_alloc(s)->failed));
}

/* Observation calls that must agree with themselves and the model:
 * memory counters, buffer labels, waits for a foreign stream. */
static void op_observe(reader *r)
{
    uint8_t which = rd8(r);
    int s = rd8(r) % SLOTS;
    switch (which % 3) {
    case 0: {
        cube_memory_stats st;
        memset(&st, 0, sizeof st);
        st.struct_size = sizeof st;
        cube_memory_scope scope =
            (which & 8) ? CUBE_MEMORY_DEVICE : CUBE_MEMORY_STREAM;
        expect(cube_memory_stats_get(g_client, scope, &st), CUBE_OK);
        if (st.allocations != st.pool_hits + st.pool_misses)
            fail_model("memory stats: allocations != hits + misses", NULL);
        if (st.buffers > st.buffers_peak ||
            st.allocated_bytes > st.allocated_bytes_peak ||
            st.reserved_bytes > st.reserved_bytes_peak ||
            st.free_bytes > st.free_bytes_peak)
            fail_model("memory stats: a figure above its peak", NULL);
        st.struct_size = 8;
        expect(cube_memory_stats_get(g_client, scope, &st),
               CUBE_ERR_INVALID_ARGUMENT);
        /* The live buffers: a cap from the input, each listed once, every
         * label one this program sets. */
        cube_buffer_info list[4];
        size_t cap = (size_t)(which >> 4) % 5, count = 0;
        list[0].struct_size = sizeof list[0];
        expect(cube_memory_snapshot(g_client, scope, list, cap, &count),
               CUBE_OK);
        size_t n = count < cap ? count : cap;
        for (size_t i = 0; i < n; i++) {
            if (list[i].label[0] && strncmp(list[i].label, "fz ", 3) != 0)
                fail_model("memory snapshot: a label never set", NULL);
            for (size_t j = 0; j < i; j++)
                if (list[j].handle.bits == list[i].handle.bits)
                    fail_model("memory snapshot: a buffer listed twice", NULL);
        }
        expect(cube_memory_snapshot(g_client, scope, NULL, 1, &count),
               CUBE_ERR_INVALID_ARGUMENT);
        break;
    }
    case 1: {
        if (slots[s].h.bits == 0)
            return;
        char want[16], got[CUBE_LABEL_MAX + 1];
        snprintf(want, sizeof want, "fz %u", (unsigned)(which >> 2));
        cube_error *err = cube_handle_set_label(g_client, slots[s].h, want);
        if (!slot_live(s))
            return expect(err, CUBE_ERR_NOT_FOUND);
        expect(err, CUBE_OK);
        expect(cube_handle_label(g_client, slots[s].h, got, sizeof got),
               CUBE_OK);
        if (strcmp(got, want) != 0)
            fail_model("cube_handle_label differs from the label set", NULL);
        /* A refused label leaves the old one. */
        expect(cube_handle_set_label(g_client, slots[s].h, "bad\"quote"),
               CUBE_ERR_INVALID_ARGUMENT);
        expect(cube_handle_label(g_client, slots[s].h, got, sizeof got),
               CUBE_OK);
        if (strcmp(got, want) != 0)
            fail_model("a refused label changed the label", NULL);
        break;
    }
    default:
        expect(cube_native_wait(g_client, NULL),
               capturing() ? CUBE_ERR_GRAPH_STATE : CUBE_OK);
        break;
    }
}

/* cube_copy_peer between two slots of the client. */
static void op_copy_peer(reader *r)
{
    int s = rd8(r) % SLOTS, d = rd8(r) % SLOTS;
    if (slots[s].h.bits == 0 || slots[d].h.bits == 0)
        return;
    cube_error *err =
        cube_copy_peer(g_client, slots[d].h, g_client, slots[s].h);
    if (!slot_live(s) || !slot_live(d))
        return expect(err, CUBE_ERR_NOT_FOUND);
    if (slots[s].size != slots[d].size || slots_overlap(s, d))
        return expect(err, CUBE_ERR_INVALID_ARGUMENT);
    if (capturing())
        return expect(err, CUBE_ERR_GRAPH_STATE);
    if (dry_depth)
        return expect(err, CUBE_OK);
    model_alloc *sa = slot_alloc(s), *da = slot_alloc(d);
    if (sa->failed) {
        expect(err, CUBE_ERR_SEVERAL);
        da->failed = 1;
        cs()->failures++;
        return;
    }
    expect(err, CUBE_OK);
    cs()->work++;
    model_copy(d, s, slots[s].size);
}

static void op_thread(reader *r)
{
    worker w;
    memset(&w, 0, sizeof w);
    w.stream = WORKER_STREAM + (rd8(r) & 1);
    w.own_size = 4 * (1 + rd8(r) % (MAX_SIZE / 4));
    w.v = (uint32_t)rd16(r) * 2246822519u;
    w.seed = rd8(r);
    int s = rd8(r) % SLOTS;
    uint8_t how = rd8(r);
    w.len = 1 + rd8(r);
    if (slots[s].h.bits != 0 && how % 3 != 0) {
        w.slot_h = slots[s].h;
        w.slot_op = (how % 3 == 1 && slot_words(s)) ? 1 : 2;
        w.slot_count = words_count(slots[s].size);
    }
    pthread_t th;
    if (pthread_create(&th, NULL, worker_main, &w) != 0)
        return; /* no thread to be had: nothing ran */
    pthread_join(th, NULL);
    /* The thread's stream and dry-run state are its own: whatever the main
     * thread's stream captures or its scopes skip, the thread's work runs. */
    expect(w.use, CUBE_OK);
    if (w.current != w.stream)
        fail_model("the thread does not work on the stream it named", NULL);
    if (w.dry_active)
        fail_model("the main thread's dry run covers another thread", NULL);
    expect(w.create, CUBE_OK);
    expect(w.fill, g_kernels ? CUBE_OK : CUBE_ERR_UNSUPPORTED);
    if (g_kernels) {
        expect(w.read, CUBE_OK);
        for (uint32_t i = 0; i < w.own_size; i += 4)
            if (get32(w.got + i) != w.v)
                fail_model("the thread read back other words than it filled",
                           NULL);
    } else {
        expect(w.read, CUBE_ERR_SEVERAL);
    }
    expect(w.release, CUBE_OK);
    expect(w.back, CUBE_OK);
    if (w.slot_op == 0)
        return;
    if (!slot_live(s))
        return expect(w.slot, CUBE_ERR_NOT_FOUND);
    model_alloc *a = slot_alloc(s);
    if (w.slot_op == 1) {
        if (!g_kernels) {
            expect(w.slot, CUBE_ERR_UNSUPPORTED);
            a->failed = 1;
            return;
        }
        expect(w.slot, CUBE_OK);
        model_rec rc = make_rec(REC_FILL, s, 0, w.v);
        apply_fill(&rc);
        a->failed = 0;
        return;
    }
    if (w.len > slots[s].size)
        return expect(w.slot, CUBE_ERR_INVALID_ARGUMENT);
    expect(w.slot, CUBE_OK);
    for (uint32_t i = 0; i < w.len; i++)
        a->bytes[slots[s].offset + i] = (uint8_t)(w.seed ^ (i * 31u));
    memset(a->known + slots[s].offset, 1, w.len);
    if (slots[s].offset == 0 && w.len == a->size)
        a->failed = 0;
}

/* --- driver -----------------------------------------------------------------
 */

static const char axpy_src[] =
    "CUBE_KERNEL(fz_axpy, CUBE_IN(uint32_t, x), CUBE_INOUT(uint32_t, y),\n"
    "            CUBE_SCALAR(uint32_t, a))\n"
    "{\n"
    "    uint32_t i = ABSOLUTE_POS_X;\n"
    "    if (i < CUBE_LEN(y) && i < CUBE_LEN(x))\n"
    "        CUBE_AT(y, i) = a * CUBE_AT(x, i) + CUBE_AT(y, i);\n"
    "}\n";

static const char fill_src[] =
    "CUBE_KERNEL(fz_fill, CUBE_OUT(uint32_t, y), CUBE_SCALAR(uint32_t, v))\n"
    "{\n"
    "    uint32_t i = ABSOLUTE_POS_X;\n"
    "    if (i < CUBE_LEN(y))\n"
    "        CUBE_AT(y, i) = v;\n"
    "}\n";

static void close_client(void)
{
    cube_kernel_release(g_axpy);
    cube_kernel_release(g_fill);
    cube_comm_destroy(g_comm);
    g_comm = NULL;
    cube_client_close(g_client);
    g_client = NULL;
}

/* Opens the client; 1 when the backend is unavailable here. */
static int open_client(void)
{
    g_trace = getenv("CUBERT_FUZZ_TRACE") != NULL;
    g_backend = getenv("CUBERT_FUZZ_BACKEND");
    if (!g_backend || !*g_backend)
        g_backend = "cpu";
    cube_client_options opts = cube_client_options_default();
    opts.cpu_threads = 2;
    cube_error *err = cube_client_open(g_backend, &opts, &g_client);
    if (err) {
        cube_code code = cube_error_code(err);
        fprintf(stderr, "fuzz_api: %s: %s\n", g_backend,
                cube_error_message(err));
        cube_error_free(err);
        if (code == CUBE_ERR_UNAVAILABLE || code == CUBE_ERR_NOT_FOUND)
            return 1;
        abort();
    }
    cube_properties props;
    expect(cube_client_properties(g_client, &props), CUBE_OK);
    g_kernels = (props.features & CUBE_FEATURE_KERNELS) != 0;
    cube_utilities util;
    expect(cube_client_utilities(g_client, &util), CUBE_OK);
    g_hw_graphs = !util.software_graphs;
    /* A backend without collectives says so, and the comm ops are off. */
    expect(cube_comm_init_all(&g_client, 1, NULL, &g_comm),
           (props.features & CUBE_FEATURE_COLLECTIVES) ? CUBE_OK
                                                       : CUBE_ERR_UNSUPPORTED);
    g_timing = props.timing;
    cube_kernel_desc ad = {"fz_axpy", axpy_src, {64, 1, 1}};
    cube_kernel_desc fd = {"fz_fill", fill_src, {64, 1, 1}};
    expect(cube_kernel_create(&ad, &g_axpy), CUBE_OK);
    expect(cube_kernel_create(&fd, &g_fill), CUBE_OK);
    atexit(close_client);
    return 0;
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    if (open_client())
        exit(0);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    reader r = {data, size, 0};
    memset(slots, 0, sizeof slots);
    memset(allocs, 0, sizeof allocs);
    memset(streams, 0, sizeof streams);
    memset(graphs, 0, sizeof graphs);
    dry_depth = 0;
    cur = 0;
    last_destroyed = 0;
    last_closed = 0;
    for (op_index = 0; op_index < MAX_OPS && r.at < r.n; op_index++) {
        if (g_trace && op_index)
            fprintf(stderr, "op %zu: %s (stream %d, dry %d)\n", op_index - 1,
                    op_name, cur, dry_depth);
        uint8_t op = rd8(&r);
        switch (op % 29) {
        case 0:
            op_name = "empty";
            op_empty(&r);
            break;
        case 1:
            op_name = "create";
            op_create(&r);
            break;
        case 2:
            op_name = "write";
            op_write(&r, 0);
            break;
        case 3:
            op_name = "read";
            op_read(&r, 0);
            break;
        case 4:
            op_name = "read_async";
            op_read(&r, 1);
            break;
        case 5:
            op_name = "slice";
            op_slice(&r);
            break;
        case 6:
            op_name = "retain";
            op_retain(&r);
            break;
        case 7:
            op_name = "release";
            op_release(&r);
            break;
        case 8:
            op_name = "size";
            op_size(&r);
            break;
        case 9:
            op_name = "axpy";
            op_axpy(&r, 0);
            break;
        case 10:
            op_name = "axpy_bad_args";
            op_axpy(&r, 1);
            break;
        case 11:
            op_name = "fill";
            op_fill(&r);
            break;
        case 12:
            op_name = "sync";
            op_barrier(&r, 1);
            break;
        case 13:
            op_name = "check";
            op_barrier(&r, 0);
            break;
        case 14:
            op_name = "cleanup";
            expect(cube_memory_cleanup(g_client), CUBE_OK);
            break;
        case 15:
            op_name = "dry_run";
            op_dry(&r);
            break;
        case 16:
            op_name = "stream_use";
            op_stream(&r);
            break;
        case 17:
            op_name = "hostile";
            op_hostile(&r);
            break;
        case 18:
            op_name = "strided_write";
            op_strided(&r, 1);
            break;
        case 19:
            op_name = "strided_read";
            op_strided(&r, 0);
            break;
        case 20:
            op_name = "graph";
            op_graph(&r);
            break;
        case 21:
            op_name = "profile";
            op_profile(&r);
            break;
        case 22:
            op_name = "misaligned";
            op_misaligned(&r);
            break;
        case 23:
            op_name = "thread";
            op_thread(&r);
            break;
        case 24:
            op_name = "all_reduce";
            op_comm(&r);
            break;
        case 25:
            op_name = "copy_peer";
            op_copy_peer(&r);
            break;
        case 27:
            op_name = "observe";
            op_observe(&r);
            break;
        case 28:
            op_name = "comm_group";
            op_comm_group(&r);
            break;
        default: /* 26: the whole-buffer forms, by the next byte */
            if (rd8(&r) & 1) {
                op_name = "write_all";
                op_write(&r, 1);
            } else {
                op_name = "read_all";
                op_read(&r, 2);
            }
            break;
        }
    }
    /* Leave nothing behind for the next input: no open window, capture or
     * armed stream, no graph, no handle. */
    op_name = "teardown";
    for (int s = 0; s < STREAMS; s++) {
        model_stream *st = &streams[s];
        expect(cube_stream_use(g_client, (cube_stream_id)s), CUBE_OK);
        cur = s;
        for (int i = 0; i < st->nwin; i++)
            cube_profile_abandon(g_client, st->win[i].token);
        st->nwin = 0;
        if (st->prepared && !st->capturing) {
            expect(cube_graph_begin(g_client), CUBE_OK);
            st->capturing = 1;
            st->nrec = 0;
        }
        if (st->capturing) {
            cube_graph_id id = 0;
            if (end_capture(st, &id)) {
                expect(cube_graph_destroy(g_client, id), CUBE_OK);
                unpin_recs(st->rec, st->nrec);
            }
            st->capturing = st->prepared = 0;
        }
    }
    for (int g = 0; g < GRAPHS; g++) {
        if (graphs[g].live)
            expect(cube_graph_destroy(g_client, graphs[g].id), CUBE_OK);
        graphs[g].live = 0;
    }
    for (int s = 0; s < SLOTS; s++)
        slot_clear(s);
    while (dry_depth > 0) {
        expect(cube_dry_run_end(g_client), CUBE_OK);
        dry_depth--;
    }
    expect(cube_stream_use(g_client, 0), CUBE_OK);
    expect(cube_sync(g_client, NULL, 0), CUBE_OK);
    return 0;
}

#ifdef CUBE_FUZZ_REPLAY
#include <dirent.h>

static int replay_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "fuzz_api: cannot open %s\n", path);
        return 1;
    }
    static uint8_t buf[1 << 16];
    size_t n = fread(buf, 1, sizeof buf, f);
    fclose(f);
    LLVMFuzzerTestOneInput(buf, n);
    return 0;
}

/* Writes the seed corpus: a few hand-made sequences, then sequences from a
 * fixed generator, each op byte followed by its arguments. */
static int generate(const char *dir)
{
    static const uint8_t hand[][64] = {
        {1, 0, 64, 7, 3, 0, 64, 0},                 /* create, read */
        {0, 1, 32, 2, 1, 32, 0, 1, 9, 3, 1, 32, 0}, /* empty, write, read */
        {1, 0, 64, 1, 5, 0, 2, 8, 0, 16, 0, 3, 2, 16, 0}, /* slice, read */
        {1, 0, 64, 6, 0, 7, 0, 7, 0, 7, 0, 3, 0, 8, 0}, /* retain, release x3 */
        {1, 0, 64, 1, 1, 1, 64, 2, 9, 0, 1, 3, 0, 3, 1, 64, 0},     /* axpy */
        {1, 0, 64, 1, 1, 1, 64, 2, 10, 0, 1, 0, 0, 0, 3, 1, 64, 0}, /* bad */
        {1, 0, 64, 1, 10, 0, 0, 0, 0, 0, 11, 0, 5, 0, 3, 0, 64, 0}, /* fill */
        {1, 0, 64, 1, 10, 0, 0, 0, 0, 0, 2, 0, 64, 0, 0, 9, 12, 1}, /* clear */
        {15, 1, 0, 0, 32, 15, 0, 3, 0, 32, 0, 12, 255},          /* dry run */
        {15, 1, 1, 0, 64, 1, 9, 0, 0, 1, 0, 15, 0, 3, 0, 64, 0}, /* dry axpy */
        {16, 1, 1, 0, 64, 3, 16, 2, 3, 0, 64, 0, 16, 0, 14},     /* streams */
        {17, 3, 0, 17, 5, 0, 1, 2, 3, 4, 5, 6, 7, 8, 17, 16, 0}, /* hostile */
        {1, 0, 8, 0, 17, 8, 0, 17, 12, 0, 17, 13, 0, 17, 14, 0},
        {1, 0, 8, 0, 17, 9, 0, 17, 10, 0, 17, 11, 0, 17, 15, 0},
        {1, 0, 8, 0, 13, 1, 12, 1, 4, 0, 8, 0, 7, 0, 13, 1, 12, 1},
        /* a pitched 4x4 block written and read back, then read whole */
        {1,  0, 64, 7, 18, 0, 1, 0, 1, 0, 3, 3, 1, 1,  5,
         19, 0, 1,  0, 1,  0, 3, 3, 1, 1, 0, 3, 0, 64, 0},
        /* two descriptors: contiguous words, overlapping halves */
        {1, 0, 64, 7, 1, 1, 64, 2, 18, 1, 0, 0, 0, 2, 7, 2, 1, 0, 1,  5,
         3, 9, 19, 3, 0, 0, 0,  2, 7,  2, 1, 0, 1, 5, 3, 0, 3, 1, 64, 0},
        /* hostile descriptors: rank 0, rank 9, element size 0, wrong size */
        {1, 0, 64, 7, 18, 0, 3, 0, 0, 0, 3,  0, 19, 0, 3, 0, 0, 0, 3,
         1, 0, 18, 0, 3,  0, 0, 0, 3, 2, 19, 2, 3,  0, 0, 0, 3, 7, 0},
        {1, 0, 64, 7, 18, 0, 3, 0, 2,  1, 3, 3, 3, 5, 1, 1, 1, 2, 19, 0, 3,
         0, 2, 1,  3, 3,  3, 6, 3, 18, 0, 3, 0, 2, 1, 3, 3, 3, 9, 4,  7, 0},
        /* capture: warm up, record axpy and fill, refused read, sync and
         * profile, end, replay, read, replay and destroy unknown ids */
        {1,  0, 64, 7,   1,  1,  64, 3,  20, 0,  0,  11, 0, 5, 0,
         20, 2, 0,  9,   0,  1,  0,  3,  0,  11, 0,  9,  0, 3, 1,
         64, 0, 12, 255, 21, 0,  0,  20, 3,  0,  20, 4,  0, 3, 1,
         64, 0, 20, 7,   0,  20, 6,  0,  1,  20, 8,  0,  1},
        /* lifecycle mistakes; create refused and empty allowed in a
         * capture */
        {20, 2, 0, 20, 3, 0, 20, 9,  0, 20, 0,  0, 20, 2, 0,  20, 2, 0,  20, 0,
         0,  1, 0, 64, 1, 0, 1,  64, 2, 1,  64, 0, 1,  1, 20, 3,  0, 20, 5,  0},
        /* a graph whose input fails, then is rewritten whole */
        {1, 0, 64, 7, 1,  1, 64, 3,  20, 0, 0, 20, 2, 0,  9, 0,
         1, 0, 3,  0, 20, 3, 0,  10, 0,  1, 0, 0,  0, 20, 4, 0,
         3, 1, 64, 0, 11, 1, 4,  0,  20, 4, 0, 3,  1, 64, 0},
        /* profiling: nested windows, streams, foreign, unknown, abandon */
        {1, 0, 64, 7, 21, 0,  0, 11, 0,  1, 0,  21, 0, 0,  21,
         2, 1, 21, 2, 0,  16, 1, 21, 0,  0, 21, 4,  0, 21, 5,
         0, 1, 21, 6, 1,  21, 7, 0,  16, 0, 21, 2,  0},
        /* a failure inside a window fails its result */
        {1, 0,  64, 7, 1, 1, 64, 3,  21, 0, 0,  21, 0,
         0, 10, 0,  1, 0, 0, 0,  21, 2,  0, 21, 3,  0},
        /* misaligned slices: fill, axpy both ways, Skip mode, dry run */
        {1, 0, 64, 7,  5, 0, 1, 1,  0, 16, 0, 22, 1, 0,  0, 22, 1, 0,  1, 22,
         1, 0, 2,  22, 1, 0, 4, 15, 1, 22, 1, 0,  0, 15, 0, 3,  1, 16, 0},
        /* a second thread: fill and write a main-thread buffer */
        {1, 0, 64, 7, 23, 0,  16, 1, 2, 9,  0, 1, 64, 23, 1, 8, 3, 4, 5,
         0, 2, 32, 3, 0,  64, 0,  7, 0, 23, 0, 4, 0,  0,  0, 0, 2, 1},
        /* a second thread while the main one captures and dry-runs */
        {1, 0, 64, 7, 20, 0, 0, 20, 2, 0,  15, 1,  23, 0, 4, 1, 1,  1, 0,
         1, 0, 15, 0, 20, 3, 0, 3,  0, 64, 0,  20, 4,  0, 3, 0, 64, 0},
        /* all-reduce on the one-rank communicator: across buffers, in
         * place, count 0, too long, then a failed source */
        {1,   0, 64, 7,  1, 1, 64, 3,  24, 0,  1, 64, 0, 3, 1,  64, 0,
         24,  0, 0,  32, 0, 3, 0,  64, 0,  24, 0, 1,  0, 0, 24, 0,  1,
         200, 0, 10, 0,  1, 0, 0,  0,  24, 0,  1, 64, 0, 3, 1,  64, 0},
        /* copy_peer: whole buffers, a slice onto a slice, sizes that
         * differ, a failed source, a dry run and a capture */
        {1,  0, 64, 7, 1,  1,  64, 3, 25, 0, 1,  3,  1,  64, 0, 5,
         0,  2, 8,  0, 16, 0,  5,  1, 3,  0, 16, 0,  25, 2,  3, 25,
         2,  1, 10, 0, 1,  0,  0,  0, 25, 0, 1,  15, 1,  25, 1, 0,
         15, 0, 20, 0, 0,  20, 2,  0, 25, 1, 0,  20, 3,  0},
        /* all-reduces in groups: in order (the second reads what the
         * first wrote), a refused call first, in a dry run (the refusal
         * queued), in a capture (one of them in place) */
        {1, 0, 64, 7, 1,  1,  64, 3, 28, 0, 1, 64, 0,  1, 0,  64,  0, 28, 0, 1,
         0, 0, 0,  1, 64, 0,  15, 1, 28, 0, 1, 64, 0,  1, 0,  200, 0, 15, 0, 20,
         0, 0, 20, 2, 0,  28, 0,  1, 64, 0, 1, 1,  32, 0, 20, 3,   0},
        /* overlapping slices of one buffer, refused */
        {1, 0,  64, 7,  5, 0, 1,  0, 0, 32, 0, 5, 0, 2,  16,
         0, 32, 0,  25, 1, 2, 24, 1, 2, 16, 0, 3, 0, 64, 0},
        /* whole-buffer writes and reads: the range's size, a size that
         * differs, a slice, after a failure */
        {1,  0, 64, 7, 26, 1,  0,  0, 0, 2, 9, 26, 0, 0, 1, 0,  26,
         1,  0, 5,  0, 0,  9,  26, 0, 0, 6, 0, 5,  0, 1, 0, 16, 0,
         26, 0, 1,  1, 0,  10, 0,  1, 0, 0, 0, 26, 0, 0, 1, 0},
    };
    char path[4096];
    int count = 0;
    for (size_t i = 0; i < sizeof hand / sizeof hand[0]; i++) {
        size_t len = sizeof hand[i];
        while (len > 0 && hand[i][len - 1] == 0)
            len--;
        snprintf(path, sizeof path, "%s/seed-hand-%02zu", dir, i);
        FILE *f = fopen(path, "wb");
        if (!f || fwrite(hand[i], 1, len, f) != len || fclose(f) != 0) {
            fprintf(stderr, "fuzz_api: cannot write %s\n", path);
            return 1;
        }
        count++;
    }
    uint64_t state = 0x9E3779B97F4A7C15u;
    for (int i = 0; i < 30; i++) {
        uint8_t buf[128];
        size_t len = 24 + (size_t)(i * 3);
        for (size_t k = 0; k < len; k++) {
            state = state * 6364136223846793005u + 1442695040888963407u;
            buf[k] = (uint8_t)(state >> 56);
        }
        /* Start with two buffers so that later ops find something. */
        buf[0] = 1, buf[1] = (uint8_t)i, buf[2] = 64, buf[3] = 7;
        buf[4] = 0, buf[5] = (uint8_t)(i + 1), buf[6] = 32;
        snprintf(path, sizeof path, "%s/seed-gen-%02d", dir, i);
        FILE *f = fopen(path, "wb");
        if (!f || fwrite(buf, 1, len, f) != len || fclose(f) != 0) {
            fprintf(stderr, "fuzz_api: cannot write %s\n", path);
            return 1;
        }
        count++;
    }
    /* Sequences of the operations on streams, graphs, windows, strides and
     * threads, each with random arguments. */
    static const uint8_t ops[] = {1,  3,  5,  9,  11, 16, 18, 19, 20,
                                  20, 20, 21, 21, 22, 23, 12, 15};
    for (int i = 0; i < 30; i++) {
        uint8_t buf[256];
        size_t len = 0;
        buf[len++] = 1, buf[len++] = 0, buf[len++] = 64, buf[len++] = 7;
        buf[len++] = 1, buf[len++] = 1, buf[len++] = 64, buf[len++] = 9;
        while (len + 8 <= 64 + (size_t)i * 6) {
            state = state * 6364136223846793005u + 1442695040888963407u;
            buf[len++] = ops[(state >> 40) % sizeof ops];
            for (int k = 0; k < 7; k++) {
                state = state * 6364136223846793005u + 1442695040888963407u;
                buf[len++] = (uint8_t)(state >> 56);
            }
        }
        snprintf(path, sizeof path, "%s/seed-ops-%02d", dir, i);
        FILE *f = fopen(path, "wb");
        if (!f || fwrite(buf, 1, len, f) != len || fclose(f) != 0) {
            fprintf(stderr, "fuzz_api: cannot write %s\n", path);
            return 1;
        }
        count++;
    }
    printf("fuzz_api: wrote %d seeds to %s\n", count, dir);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc == 3 && strcmp(argv[1], "--generate") == 0)
        return generate(argv[2]);
    if (argc < 2) {
        fprintf(stderr, "usage: %s CORPUS-DIR-OR-FILE... | --generate DIR\n",
                argv[0]);
        return 2;
    }
    if (open_client())
        return 77; /* the backend cannot run here: skipped */
    int files = 0, bad = 0;
    for (int i = 1; i < argc; i++) {
        DIR *d = opendir(argv[i]);
        if (!d) {
            bad |= replay_file(argv[i]);
            files++;
            continue;
        }
        struct dirent *e;
        while ((e = readdir(d)) != NULL) {
            if (e->d_name[0] == '.')
                continue;
            char path[4096];
            snprintf(path, sizeof path, "%s/%s", argv[i], e->d_name);
            bad |= replay_file(path);
            files++;
        }
        closedir(d);
    }
    printf("fuzz_api: replayed %d inputs on %s\n", files, g_backend);
    return bad;
}
#endif
