/* The memory calls of the public API: layouts, installation, usage and
 * reports, cleanup, allocation modes and data layouts. Pools live in
 * src/memory; the client owns one manager per stream (stream.c), so these
 * calls go to the calling stream's manager without the backend, except
 * cleanup, which first lets the backend give back what it holds aside.
 *
 * Locks (docs/threading.md): the stream's lock, then its memory manager's
 * (install, cleanup) or the backend's (memory_reclaim); streams_lock alone.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "core/client_internal.h"
#include "memory/memory_manager.h"

static mem_device device_of(const cube_client *c)
{
    mem_device d = {c->props.memory_alignment, c->props.memory_total};
    return d;
}

static cube_error *memory_layout_preset_call(cube_client *c,
                                             cube_layout_preset preset,
                                             cube_memory_layout *out)
{
    if (!c || !out)
        return cube_error_null_argument("cube_memory_layout_preset",
                                        c ? "out" : "client");
    if (preset != CUBE_PRESET_SUBSLICES && preset != CUBE_PRESET_EXCLUSIVE &&
        preset != CUBE_PRESET_EXPANDABLE)
        return cube_error_new(CUBE_ERR_INVALID_ARGUMENT,
                              "cube_memory_layout_preset: preset %d is not "
                              "a cube_layout_preset",
                              (int)preset);
    mem_device d = device_of(c);
    return mem_layout_preset(preset, &d, out);
}

cube_error *cube_memory_layout_preset(cube_client *c, cube_layout_preset preset,
                                      cube_memory_layout *out)
{
    CORE_CALL(c, "cube_memory_layout_preset",
              memory_layout_preset_call(c, preset, out));
}

static cube_error *memory_layout_validate_call(cube_client *c,
                                               const cube_memory_layout *layout)
{
    if (!c || !layout)
        return cube_error_null_argument("cube_memory_layout_validate",
                                        c ? "layout" : "client");
    mem_device d = device_of(c);
    return mem_layout_validate(layout, &d);
}

cube_error *cube_memory_layout_validate(cube_client *c,
                                        const cube_memory_layout *layout)
{
    CORE_CALL(c, "cube_memory_layout_validate",
              memory_layout_validate_call(c, layout));
}

static cube_error *install_memory_pools_call(cube_client *c,
                                             const cube_memory_layout *layout)
{
    CORE_CHECK_CLIENT(c, "cube_install_memory_pools");
    cube_error *err = cube_memory_layout_validate(c, layout);
    if (err)
        return cube_error_prefix(err, "cube_install_memory_pools");
    core_stream *s = NULL;
    err = core_stream_get(c, &s);
    if (err)
        return err;
    /* A layout the device's storage cannot hold (an expandable pool without
     * virtual memory) changes nothing. Every stream of a device has the
     * same kind of storage, so the calling stream's answers for all. */
    err = mem_layout_supported(mem_storage_of(s->base.memory), layout);
    if (err)
        return cube_error_prefix(err, "cube_install_memory_pools");
    /* Streams created from now on get the layout, whatever happens to the
     * calling stream's pools. */
    cube_mutex_lock(&c->dev->streams_lock);
    c->dev->layout = *layout;
    c->dev->has_layout = 1;
    cube_mutex_unlock(&c->dev->streams_lock);
    core_stream_lock(s);
    err = mem_install(s->base.memory, layout);
    core_stream_unlock(s);
    return err;
}

cube_error *cube_install_memory_pools(cube_client *c,
                                      const cube_memory_layout *layout)
{
    CORE_CALL(c, "cube_install_memory_pools",
              install_memory_pools_call(c, layout));
}

static cube_error *memory_usage_get_call(cube_client *c, cube_memory_usage *out)
{
    CORE_CHECK_CLIENT_OUT(c, out, "cube_memory_usage_get");
    memset(out, 0, sizeof *out);
    /* A stream that never existed holds nothing: not worth creating. */
    core_stream *s = core_stream_find(c->dev, cube_stream_current(c));
    if (s)
        mem_usage(s->base.memory, out);
    out->foreign_buffers = atomic_load(&c->foreign_buffers);
    out->foreign_bytes = atomic_load(&c->foreign_bytes);
    return NULL;
}

cube_error *cube_memory_usage_get(cube_client *c, cube_memory_usage *out)
{
    CORE_CALL(c, "cube_memory_usage_get", memory_usage_get_call(c, out));
}

static cube_error *memory_usage_device_call(cube_client *c,
                                            cube_memory_usage *out)
{
    CORE_CHECK_CLIENT_OUT(c, out, "cube_memory_usage_device");
    memset(out, 0, sizeof *out);
    /* Streams are only ever added while the device is open, and each
     * manager takes its own lock: the sum is of consistent parts, each
     * as it was when it was read. */
    uint32_t n =
        atomic_load_explicit(&c->dev->stream_count, memory_order_acquire);
    for (uint32_t i = 0; i < n; i++) {
        core_stream *s = core_stream_at(c->dev, i);
        cube_memory_usage one;
        memset(&one, 0, sizeof one);
        if (s)
            mem_usage(s->base.memory, &one);
        out->buffers += one.buffers;
        out->bytes_in_use += one.bytes_in_use;
        out->bytes_padding += one.bytes_padding;
        out->bytes_reserved += one.bytes_reserved;
    }
    out->foreign_buffers = atomic_load(&c->foreign_buffers);
    out->foreign_bytes = atomic_load(&c->foreign_bytes);
    return NULL;
}

cube_error *cube_memory_usage_device(cube_client *c, cube_memory_usage *out)
{
    CORE_CALL(c, "cube_memory_usage_device", memory_usage_device_call(c, out));
}

_Static_assert(sizeof(cube_memory_stats) >= CUBE_MEMORY_STATS_V1_SIZE,
               "cube_memory_stats only grows");

static void stats_add(cube_memory_stats *sum, const cube_memory_stats *one)
{
    /* Every field after the header is a uint64_t count. */
    uint64_t *to = &sum->allocations;
    const uint64_t *from = &one->allocations;
    size_t n = (sizeof *sum - offsetof(cube_memory_stats, allocations)) /
               sizeof(uint64_t);
    for (size_t i = 0; i < n; i++)
        to[i] += from[i];
    sum->streams++;
}

cube_error *core_memory_query_check(const char *fn, cube_memory_scope scope,
                                    const char *field, uint32_t struct_size,
                                    uint32_t min_size, const char *type)
{
    if (field && struct_size < min_size)
        return cube_error_new(CUBE_ERR_INVALID_ARGUMENT,
                              "%s: %s is %u, below %u (set it to sizeof(%s))",
                              fn, field, (unsigned)struct_size,
                              (unsigned)min_size, type);
    if (scope != CUBE_MEMORY_STREAM && scope != CUBE_MEMORY_DEVICE)
        return cube_error_new(CUBE_ERR_INVALID_ARGUMENT, "%s: unknown scope %d",
                              fn, (int)scope);
    return NULL;
}

static cube_error *memory_stats_get_call(cube_client *c,
                                         cube_memory_scope scope,
                                         cube_memory_stats *out)
{
    CORE_CHECK_CLIENT_OUT(c, out, "cube_memory_stats_get");
    cube_error *err = core_memory_query_check(
        "cube_memory_stats_get", scope, "out->struct_size", out->struct_size,
        CUBE_MEMORY_STATS_V1_SIZE, "cube_memory_stats");
    if (err)
        return err;
    cube_memory_stats sum;
    memset(&sum, 0, sizeof sum);
    if (scope == CUBE_MEMORY_STREAM) {
        /* A stream that never existed counts nothing: not worth making. */
        core_stream *s = core_stream_find(c->dev, cube_stream_current(c));
        if (s) {
            cube_memory_stats one;
            memset(&one, 0, sizeof one);
            mem_stats_get(s->base.memory, &one);
            stats_add(&sum, &one);
        }
    } else {
        /* As cube_memory_usage_device: each stream under its own lock. */
        uint32_t n =
            atomic_load_explicit(&c->dev->stream_count, memory_order_acquire);
        for (uint32_t i = 0; i < n; i++) {
            core_stream *s = core_stream_at(c->dev, i);
            if (!s)
                continue;
            cube_memory_stats one;
            memset(&one, 0, sizeof one);
            mem_stats_get(s->base.memory, &one);
            stats_add(&sum, &one);
        }
    }
    uint32_t size =
        out->struct_size < sizeof sum ? out->struct_size : (uint32_t)sizeof sum;
    sum.struct_size = size;
    memcpy(out, &sum, size);
    return NULL;
}

cube_error *cube_memory_stats_get(cube_client *c, cube_memory_scope scope,
                                  cube_memory_stats *out)
{
    CORE_CALL(c, "cube_memory_stats_get", memory_stats_get_call(c, scope, out));
}

static cube_error *memory_cleanup_call(cube_client *c)
{
    CORE_CHECK_CLIENT(c, "cube_memory_cleanup");
    core_stream *s = NULL;
    cube_error *err = core_stream_enter(c, &s);
    if (err)
        return err;
    if (c->vt->memory_reclaim)
        c->vt->memory_reclaim(c->server, &s->base);
    mem_cleanup(s->base.memory);
    core_stream_unlock(s);
    return NULL;
}

cube_error *cube_memory_cleanup(cube_client *c)
{
    CORE_CALL(c, "cube_memory_cleanup", memory_cleanup_call(c));
}

static cube_error *memory_report_get_call(cube_client *c,
                                          cube_memory_report *out)
{
    CORE_CHECK_CLIENT_OUT(c, out, "cube_memory_report_get");
    memset(out, 0, sizeof *out);
    /* A stream that never allocated reports the pools it would get. */
    core_stream *s = NULL;
    cube_error *err = core_stream_get(c, &s);
    if (err)
        return err;
    mem_report(s->base.memory, out);
    return NULL;
}

cube_error *cube_memory_report_get(cube_client *c, cube_memory_report *out)
{
    CORE_CALL(c, "cube_memory_report_get", memory_report_get_call(c, out));
}

static cube_error *memory_reset_peaks_call(cube_client *c)
{
    CORE_CHECK_CLIENT(c, "cube_memory_reset_peaks");
    core_stream *s = core_stream_find(c->dev, cube_stream_current(c));
    if (s)
        mem_reset_peaks(s->base.memory);
    return NULL;
}

cube_error *cube_memory_reset_peaks(cube_client *c)
{
    CORE_CALL(c, "cube_memory_reset_peaks", memory_reset_peaks_call(c));
}

cube_error *core_stream_sync_persistent(cube_client *c, core_stream *s)
{
    (void)c;
    int want = s->alloc_mode == CUBE_ALLOC_PERSISTENT ||
               s->persistent_depth > 0 || s->prepared || s->capture;
    if (want != s->persistent_sent) {
        mem_set_persistent(s->base.memory, want);
        s->persistent_sent = want;
    }
    return NULL;
}

static cube_error *allocation_mode_set_call(cube_client *c,
                                            cube_allocation_mode mode)
{
    CORE_CHECK_CLIENT(c, "cube_allocation_mode_set");
    if (mode != CUBE_ALLOC_AUTO && mode != CUBE_ALLOC_PERSISTENT)
        return cube_error_new(CUBE_ERR_INVALID_ARGUMENT,
                              "cube_allocation_mode_set: mode %d is not a "
                              "cube_allocation_mode",
                              (int)mode);
    core_stream *s = NULL;
    cube_error *err = core_stream_enter(c, &s);
    if (err)
        return err;
    cube_allocation_mode old = s->alloc_mode;
    s->alloc_mode = mode;
    err = core_stream_sync_persistent(c, s);
    if (err)
        s->alloc_mode = old;
    core_stream_unlock(s);
    return err;
}

cube_error *cube_allocation_mode_set(cube_client *c, cube_allocation_mode mode)
{
    CORE_CALL(c, "cube_allocation_mode_set", allocation_mode_set_call(c, mode));
}

static cube_error *persistent_begin_call(cube_client *c)
{
    CORE_CHECK_CLIENT(c, "cube_persistent_begin");
    core_stream *s = NULL;
    cube_error *err = core_stream_enter(c, &s);
    if (err)
        return err;
    s->persistent_depth++;
    err = core_stream_sync_persistent(c, s);
    if (err)
        s->persistent_depth--;
    core_stream_unlock(s);
    return err;
}

cube_error *cube_persistent_begin(cube_client *c)
{
    CORE_CALL(c, "cube_persistent_begin", persistent_begin_call(c));
}

static cube_error *persistent_end_call(cube_client *c)
{
    CORE_CHECK_CLIENT(c, "cube_persistent_end");
    core_stream *s = NULL;
    cube_error *err = core_stream_enter(c, &s);
    if (err)
        return err;
    if (s->persistent_depth == 0) {
        core_stream_unlock(s);
        return cube_error_new(CUBE_ERR_INVALID_ARGUMENT,
                              "cube_persistent_end: no persistent window is "
                              "open on the calling stream");
    }
    s->persistent_depth--;
    err = core_stream_sync_persistent(c, s);
    if (err)
        s->persistent_depth++;
    core_stream_unlock(s);
    return err;
}

cube_error *cube_persistent_end(cube_client *c)
{
    CORE_CALL(c, "cube_persistent_end", persistent_end_call(c));
}

/* --- report formatting --- */

static const char *kind_name(const cube_pool_report *p, int large)
{
    if (large)
        return "large";
    switch (p->config.kind) {
    case CUBE_POOL_SLICED: return "sliced";
    case CUBE_POOL_EXCLUSIVE: return "exclusive";
    case CUBE_POOL_PERSISTENT: return "persistent";
    case CUBE_POOL_EXPANDABLE: return "expandable";
    }
    return "?";
}

/* Appends printf output to a growing buffer; returns -1 when memory runs
 * out. */
static int append(char **buf, size_t *len, size_t *cap, const char *fmt, ...)
    CUBE_PRINTF(4, 5);

static int append(char **buf, size_t *len, size_t *cap, const char *fmt, ...)
{
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(*buf ? *buf + *len : NULL, *buf ? *cap - *len : 0,
                          fmt, ap);
        va_end(ap);
        if (n < 0)
            return -1;
        if (*buf && *len + (size_t)n < *cap) {
            *len += (size_t)n;
            return 0;
        }
        size_t want = (*cap ? *cap : 256);
        while (want <= *len + (size_t)n)
            want *= 2;
        char *grown = realloc(*buf, want);
        if (!grown)
            return -1;
        *buf = grown;
        *cap = want;
    }
}

/* `bytes` for people: the largest binary unit it reaches, exact where it
 * is a whole number of that unit ("2 MiB"), a whole number plus a few
 * bytes (64 at most) as such ("128 KiB+1B", a pool's first size), else with two
 * decimals ("112.46 KiB"); below 1 KiB in bytes ("0 B"). The JSON form
 * keeps exact integers. */
static const char *human_bytes(uint64_t bytes, char out[24])
{
    static const char *const units[] = {"B",   "KiB", "MiB", "GiB",
                                        "TiB", "PiB", "EiB"};
    int u = 0;
    while (u < 6 && bytes >> (10 * (u + 1)))
        u++;
    uint64_t whole = bytes >> (10 * u), rest = bytes & ((1ull << (10 * u)) - 1);
    if (u == 0 || rest == 0)
        snprintf(out, 24, "%llu %s", (unsigned long long)whole, units[u]);
    else if (rest <= 64) /* a range's first byte: 128 KiB + 1 B */
        snprintf(out, 24, "%llu %s+%lluB", (unsigned long long)whole, units[u],
                 (unsigned long long)rest);
    else
        snprintf(out, 24, "%.2f %s", (double)bytes / (double)(1ull << (10 * u)),
                 units[u]);
    return out;
}

/* The large tail is the entry after the layout's pools, before the
 * persistent pool. */
static int is_large(const cube_memory_report *r, uint32_t i)
{
    return r->count >= 2 && i == r->count - 2 &&
           r->pools[i].config.kind == CUBE_POOL_EXCLUSIVE &&
           r->pools[i].config.page_size == 0;
}

char *cube_memory_report_format(const cube_memory_report *r,
                                cube_report_format format)
{
    /* A count past the array is not a report cube_memory_report_get
     * filled: formatting it would read past the caller's struct. */
    if (!r || r->count > sizeof r->pools / sizeof r->pools[0])
        return NULL;
    char *buf = NULL;
    size_t len = 0, cap = 0;
    int bad = 0;
    const cube_memory_usage *u = &r->usage;
    if (format == CUBE_REPORT_JSON) {
        bad |= append(&buf, &len, &cap,
                      "{\"usage\":{\"buffers\":%llu,\"bytes_in_use\":%llu,"
                      "\"bytes_padding\":%llu,\"bytes_reserved\":%llu},"
                      "\"pools\":[",
                      (unsigned long long)u->buffers,
                      (unsigned long long)u->bytes_in_use,
                      (unsigned long long)u->bytes_padding,
                      (unsigned long long)u->bytes_reserved);
        for (uint32_t i = 0; i < r->count && !bad; i++) {
            const cube_pool_report *p = &r->pools[i];
            bad |= append(
                &buf, &len, &cap,
                "%s{\"kind\":\"%s\",\"page_size\":%llu,\"min_size\":%llu,"
                "\"max_size\":%llu,\"cap\":%llu,\"pages\":%llu,"
                "\"pages_peak\":%llu,\"buffers\":%llu,\"buffers_peak\":%llu,"
                "\"bytes_in_use\":%llu,\"bytes_in_use_peak\":%llu,"
                "\"bytes_reserved\":%llu,\"bytes_reserved_peak\":%llu,"
                "\"largest_buffer\":%llu}",
                i ? "," : "", kind_name(p, is_large(r, i)),
                (unsigned long long)p->config.page_size,
                (unsigned long long)p->config.min_size,
                (unsigned long long)p->config.max_size,
                (unsigned long long)p->config.cap, (unsigned long long)p->pages,
                (unsigned long long)p->pages_peak,
                (unsigned long long)p->buffers,
                (unsigned long long)p->buffers_peak,
                (unsigned long long)p->bytes_in_use,
                (unsigned long long)p->bytes_in_use_peak,
                (unsigned long long)p->bytes_reserved,
                (unsigned long long)p->bytes_reserved_peak,
                (unsigned long long)p->largest_buffer);
        }
        bad |= append(&buf, &len, &cap, "]}\n");
    } else {
        bad |= append(&buf, &len, &cap,
                      "%-10s %11s %11s %11s %8s %8s %9s %11s %11s %11s "
                      "%11s\n",
                      "pool", "page", "min", "max", "pages", "peak", "buffers",
                      "in use", "in use peak", "reserved", "reserv. peak");
        for (uint32_t i = 0; i < r->count && !bad; i++) {
            const cube_pool_report *p = &r->pools[i];
            char b[7][24];
            bad |= append(&buf, &len, &cap,
                          "%-10s %11s %11s %11s %8llu %8llu %9llu %11s %11s "
                          "%11s %11s\n",
                          kind_name(p, is_large(r, i)),
                          human_bytes(p->config.page_size, b[0]),
                          human_bytes(p->config.min_size, b[1]),
                          human_bytes(p->config.max_size, b[2]),
                          (unsigned long long)p->pages,
                          (unsigned long long)p->pages_peak,
                          (unsigned long long)p->buffers,
                          human_bytes(p->bytes_in_use, b[3]),
                          human_bytes(p->bytes_in_use_peak, b[4]),
                          human_bytes(p->bytes_reserved, b[5]),
                          human_bytes(p->bytes_reserved_peak, b[6]));
        }
        char t[3][24];
        bad |= append(&buf, &len, &cap,
                      "total: %llu buffers, %s in use, %s padding, %s "
                      "reserved\n",
                      (unsigned long long)u->buffers,
                      human_bytes(u->bytes_in_use, t[0]),
                      human_bytes(u->bytes_padding, t[1]),
                      human_bytes(u->bytes_reserved, t[2]));
    }
    if (bad) {
        free(buf);
        return NULL;
    }
    return buf;
}

/* --- layouts of data --- */

cube_error *cube_layout_strides(cube_layout_policy policy, uint32_t rank,
                                const uint64_t *shape, uint32_t elem_size,
                                uint64_t pitch_align, uint64_t *strides,
                                uint64_t *bytes)
{
    if (!shape || !strides || !bytes)
        return cube_error_null_argument("cube_layout_strides", !shape ? "shape"
                                                               : !strides
                                                                   ? "strides"
                                                                   : "bytes");
    if (rank == 0 || rank > CUBE_MAX_RANK)
        return cube_error_new(CUBE_ERR_INVALID_ARGUMENT,
                              "cube_layout_strides: rank %u is not in 1..%d",
                              rank, CUBE_MAX_RANK);
    if (elem_size == 0)
        return cube_error_new(CUBE_ERR_INVALID_ARGUMENT,
                              "cube_layout_strides: elem_size is 0");
    if (policy != CUBE_LAYOUT_CONTIGUOUS && policy != CUBE_LAYOUT_PITCHED)
        return cube_error_new(CUBE_ERR_INVALID_ARGUMENT,
                              "cube_layout_strides: policy %d is not a "
                              "cube_layout_policy",
                              (int)policy);
    if (policy == CUBE_LAYOUT_PITCHED &&
        (pitch_align == 0 || (pitch_align & (pitch_align - 1)) != 0))
        return cube_error_new(CUBE_ERR_INVALID_ARGUMENT,
                              "cube_layout_strides: pitch_align %llu is not "
                              "a power of two",
                              (unsigned long long)pitch_align);
    for (uint32_t k = 0; k < rank; k++)
        if (shape[k] == 0)
            return cube_error_new(CUBE_ERR_INVALID_ARGUMENT,
                                  "cube_layout_strides: shape[%u] is 0", k);
    /* The last dimension is a row; pitched rows are padded to a multiple
     * of pitch_align bytes (only for rank >= 2: a single row has no
     * pitch). */
    uint64_t row = shape[rank - 1];
    if (policy == CUBE_LAYOUT_PITCHED && rank >= 2) {
        uint64_t row_bytes;
        if (__builtin_mul_overflow(row, elem_size, &row_bytes) ||
            __builtin_add_overflow(row_bytes, pitch_align - 1, &row_bytes))
            goto overflow;
        row_bytes &= ~(pitch_align - 1);
        if (row_bytes % elem_size != 0) {
            /* The pitch must hold whole elements: round up to the next
             * multiple of both. */
            while (row_bytes % elem_size != 0)
                if (__builtin_add_overflow(row_bytes, pitch_align, &row_bytes))
                    goto overflow;
        }
        row = row_bytes / elem_size;
    }
    strides[rank - 1] = 1;
    uint64_t span = row;
    for (int k = (int)rank - 2; k >= 0; k--) {
        strides[k] = span;
        if (__builtin_mul_overflow(span, shape[k], &span))
            goto overflow;
    }
    /* Bytes: the last row needs only its real elements. */
    uint64_t last = 0, elems;
    for (uint32_t k = 0; k < rank; k++) {
        uint64_t reach;
        if (__builtin_mul_overflow(shape[k] - 1, strides[k], &reach) ||
            __builtin_add_overflow(last, reach, &last))
            goto overflow;
    }
    if (__builtin_add_overflow(last, 1, &elems) ||
        __builtin_mul_overflow(elems, elem_size, bytes))
        goto overflow;
    return NULL;
overflow:
    return cube_error_new(CUBE_ERR_INVALID_ARGUMENT,
                          "cube_layout_strides: the layout overflows 64 bits");
}
