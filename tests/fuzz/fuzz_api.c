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
 * CUBE_ERR_UNSUPPORTED, recorded on the launch's buffers. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cubert/cubert.h"

#define SLOTS 8
#define ALLOCS (SLOTS * 2)
#define MAX_SIZE 256u
#define MAX_OPS 256

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* --- the model ------------------------------------------------------------ */

typedef struct model_alloc {
    int live; /* handles still name it */
    uint32_t size;
    uint32_t handles; /* slots naming it */
    int failed;       /* the failure store holds an error for it */
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

static model_alloc allocs[ALLOCS];
static model_slot slots[SLOTS];
static int dry_depth;
static size_t op_index;
static const char *op_name;

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
        if (!allocs[i].live) {
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
    expect(cube_create(g_client, bytes, size, &h), CUBE_OK);
    int a = new_alloc(size);
    memcpy(allocs[a].bytes, bytes, size);
    memset(allocs[a].known, 1, size);
    slot_take(s, h, a, 0, size);
}

/* Writes the first `len` bytes of slot s's range (elements of 1 or 4
 * bytes). */
static void op_write(reader *r)
{
    int s = rd8(r) % SLOTS;
    uint32_t len = rd16(r) % (MAX_SIZE + 8);
    uint32_t elem = (rd8(r) & 1) ? 4 : 1;
    uint8_t seed = rd8(r);
    if (slots[s].h.bits == 0)
        return;
    if (elem == 4)
        len &= ~3u;
    uint8_t src[MAX_SIZE + 8];
    for (uint32_t i = 0; i < len; i++)
        src[i] = (uint8_t)(seed ^ (i * 13u));
    cube_copy_desc d = cube_copy_desc_contiguous(slots[s].h, len, elem);
    const void *srcs[1] = {src};
    uint64_t sizes[1] = {len};
    cube_error *err = cube_write(g_client, &d, srcs, sizes, 1);
    if (!slot_live(s))
        return expect(err, CUBE_ERR_NOT_FOUND);
    if (len == 0 || len > slots[s].size)
        return expect(err, CUBE_ERR_INVALID_ARGUMENT);
    expect(err, CUBE_OK);
    model_alloc *a = slot_alloc(s);
    memcpy(a->bytes + slots[s].offset, src, len);
    memset(a->known + slots[s].offset, 1, len);
    if (slots[s].offset == 0 && len == a->size)
        a->failed = 0;
}

/* Reads the first `len` bytes of slot s's range, blocking or through a
 * future. */
static void op_read(reader *r, int async)
{
    int s = rd8(r) % SLOTS;
    uint32_t len = rd16(r) % (MAX_SIZE + 8);
    if (slots[s].h.bits == 0)
        return;
    uint8_t dst[MAX_SIZE + 8];
    memset(dst, 0xA5, sizeof dst);
    cube_copy_desc d = cube_copy_desc_contiguous(slots[s].h, len, 1);
    void *dsts[1] = {dst};
    uint64_t sizes[1] = {len};
    cube_error *err;
    if (async) {
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
    if (len == 0 || len > slots[s].size)
        return expect(err, CUBE_ERR_INVALID_ARGUMENT);
    model_alloc *a = slot_alloc(s);
    if (a->failed) {
        expect(err, CUBE_ERR_SEVERAL);
        for (size_t i = 0; i < sizeof dst; i++)
            if (dst[i] != 0xA5)
                fail_model("a refused read wrote its destination", NULL);
        return;
    }
    expect(err, CUBE_OK);
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

/* y = a * x + y over uint32_t (wrapping), x read-only, y read and written;
 * with `bad`, a buffer stands where the scalar belongs, so the launch fails
 * its signature check and the failure lands on y only. */
static void op_axpy(reader *r, int bad)
{
    int x = rd8(r) % SLOTS, y = rd8(r) % SLOTS, z = rd8(r) % SLOTS;
    uint32_t av = (uint32_t)rd16(r);
    if (!slot_words(x) || !slot_words(y) || ranges_race(x, y))
        return;
    if (bad && !slot_live(z))
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
        }
        return;
    }
    if (bad) {
        if (ax->failed || ay->failed)
            expect2(err, CUBE_ERR_INVALID_ARGUMENT, CUBE_ERR_SEVERAL);
        else
            expect(err, CUBE_ERR_INVALID_ARGUMENT);
        if (!dry_depth)
            ay->failed = 1;
        return;
    }
    if (dry_depth)
        return expect(err, CUBE_OK);
    if (ax->failed || ay->failed) {
        expect(err, CUBE_ERR_SEVERAL);
        ay->failed = 1;
        return;
    }
    expect(err, CUBE_OK);
    uint32_t n = slots[y].size < slots[x].size ? slots[y].size : slots[x].size;
    for (uint32_t i = 0; i < n; i += 4) {
        uint8_t *py = ay->bytes + slots[y].offset + i;
        uint8_t *ky = ay->known + slots[y].offset + i;
        const uint8_t *px = ax->bytes + slots[x].offset + i;
        const uint8_t *kx = ax->known + slots[x].offset + i;
        int known =
            ky[0] & ky[1] & ky[2] & ky[3] & kx[0] & kx[1] & kx[2] & kx[3];
        put32(py, av * get32(px) + get32(py));
        memset(ky, known, 4);
    }
}

/* y = v everywhere: y is CUBE_OUT, so success makes its buffer trusted. */
static void op_fill(reader *r)
{
    int y = rd8(r) % SLOTS;
    uint32_t v = (uint32_t)rd16(r) * 2654435761u;
    if (!slot_words(y))
        return;
    cube_arg args[2] = {cube_arg_buffer(slots[y].h), cube_arg_u32(v)};
    cube_error *err =
        cube_launch(g_client, g_fill, words_count(slots[y].size), args, 2, 0);
    model_alloc *a = slot_alloc(y);
    if (!g_kernels) {
        expect(err, CUBE_ERR_UNSUPPORTED);
        if (!dry_depth)
            a->failed = 1;
        return;
    }
    expect(err, CUBE_OK);
    if (dry_depth)
        return;
    for (uint32_t i = 0; i < slots[y].size; i += 4)
        put32(a->bytes + slots[y].offset + i, v);
    memset(a->known + slots[y].offset, 1, slots[y].size);
    a->failed = 0;
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
    }
    if (!sync && n == 0)
        return; /* check of nothing: not specified beyond success */
    cube_error *err =
        sync ? cube_sync(g_client, hs, n) : cube_check(g_client, hs, n);
    if (stale)
        return expect(err, CUBE_ERR_NOT_FOUND);
    expect(err, failed ? CUBE_ERR_SEVERAL : CUBE_OK);
}

static void op_stream(reader *r)
{
    cube_stream_id id = rd8(r) % 4;
    expect(cube_stream_use(g_client, id), CUBE_OK);
    if (id != 0 && cube_stream_current(g_client) != id)
        fail_model("cube_stream_current does not name the stream used", NULL);
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
    cube_client_close(g_client);
    g_client = NULL;
}

/* Opens the client; 1 when the backend is unavailable here. */
static int open_client(void)
{
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
    dry_depth = 0;
    for (op_index = 0; op_index < MAX_OPS && r.at < r.n; op_index++) {
        uint8_t op = rd8(&r);
        switch (op % 19) {
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
            op_write(&r);
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
        default:
            op_name = "create";
            op_create(&r);
            break;
        }
    }
    /* Leave nothing behind for the next input. */
    op_name = "teardown";
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
    static const uint8_t hand[][24] = {
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
