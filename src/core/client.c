/* Clients: opening a device, properties, barriers and checks. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "core/client_internal.h"
#include "core/config.h"
#include "core/memory_trace.h"
#include "core/trace.h"

static atomic_uint_fast64_t next_client_serial = 1;
cube_client_options cube_client_options_default(void)
{
    cube_client_options o;
    memset(&o, 0, sizeof o);
    o.struct_size = sizeof o;
    return o;
}

cube_error *cube_client_open(const char *device,
                             const cube_client_options *options,
                             cube_client **out)
{
    if (!out)
        return cube_error_null_argument("cube_client_open", "out");
    *out = NULL;
    const core_config *cfg = core_config_get();
    cube_client_options opts = cube_client_options_default();
    /* What the caller set itself, to tell a second open of a device that
     * asks for other options from one that takes the device's. */
    cube_client_options asked = cube_client_options_default();
    if (options) {
        if (options->struct_size < sizeof(uint32_t) ||
            options->struct_size > sizeof opts)
            return cube_error_new(CUBE_ERR_INVALID_ARGUMENT,
                                  "cube_client_open: options->struct_size %u "
                                  "is not sizeof(cube_client_options)",
                                  options->struct_size);
        memcpy(&opts, options, options->struct_size);
        opts.struct_size = sizeof opts;
        asked = opts;
        /* Checked here, so every backend refuses it alike. */
        if (opts.cpu_threads > CUBE_MAX_CPU_THREADS)
            return cube_error_new(CUBE_ERR_INVALID_ARGUMENT,
                                  "cube_client_open: options->cpu_threads %u "
                                  "is not in 1..%u (0: the default)",
                                  opts.cpu_threads, CUBE_MAX_CPU_THREADS);
    }
    if (!opts.cpu_threads)
        opts.cpu_threads = cfg->cpu_threads;
    if (!opts.cache_dir && cfg->cache_dir_set)
        opts.cache_dir = cfg->cache_dir;
    if (!device)
        device = cfg->device[0] ? cfg->device : "cpu";

    const cube_backend *backend = NULL;
    uint32_t index = 0;
    cube_error *err =
        core_device_parse(device, "cube_client_open", &backend, &index);
    if (err)
        return err;

    cube_client *c = calloc(1, sizeof *c);
    if (!c)
        return cube_error_new(CUBE_ERR_OUT_OF_MEMORY, "cube_client_open");
    c->serial = atomic_fetch_add(&next_client_serial, 1);
    /* The handle table first: a client without one could hold no buffer,
     * and nothing of the device is opened yet to be undone. */
    err = core_handles_init(c);
    if (err) {
        free(c);
        return cube_error_prefix(err, "cube_client_open(%s)", device);
    }
    err = core_device_acquire(backend, index, &opts, &asked, &c->dev);
    if (err) {
        core_handles_destroy(c);
        free(c);
        return cube_error_code(err) == CUBE_ERR_INVALID_ARGUMENT
                   ? err
                   : cube_error_prefix(err, "cube_client_open(%s)", device);
    }
    c->server = c->dev->server;
    c->vt = c->dev->vt;
    c->comm = c->dev->backend->comm;
    c->props = c->dev->props;
    snprintf(c->device, sizeof c->device, "%s", c->dev->name);
    cube_mutex_init(&c->failure_lock);
    cube_mutex_init(&c->staging_lock);
    cube_mutex_init(&c->graphs_lock);
    cube_mutex_init(&c->futures_lock);
    cube_mutex_init(&c->ranges_lock);
    core_trace_from_env();
    core_memory_trace_from_env();
    /* Launch timing for the per-kernel summary costs two clock reads per
     * launch: only when someone will read it. */
    c->stats = c->dev->stats;
    c->bounds_always = core_config_bounds_always();
    cube_log_write(CUBE_LOG_INFO, "client", "opened %s (%s)", c->device,
                   c->props.name);
    *out = c;
    return NULL;
}

/* Ends the captures `c` left open on the device's streams (a device cannot
 * drain a stream that is still recording), drops its profiling windows,
 * then drains every stream: the client's buffers go back after the work
 * queued on them. Other clients of the device may be issuing work
 * meanwhile: each stream is entered. */
static void close_streams(cube_client *c)
{
    core_device *d = c->dev;
    uint32_t streams = atomic_load(&d->stream_count);
    for (uint32_t i = 0; i < streams; i++) {
        core_stream *s = core_stream_at(d, i);
        core_stream_lock(s);
        if (s->capture && s->capture_client == c) {
            if (c->vt->end_capture) {
                uint64_t hw = 0;
                cube_error_ignore(
                    c->vt->end_capture(c->server, &s->base, &hw),
                    "the closing client ends its capture: nothing is left "
                    "to report to");
                if (hw)
                    c->vt->graph_destroy(c->server, &s->base, hw);
            }
            core_graph_abort(c, s->capture);
            s->capture = NULL;
            s->capture_client = NULL;
            s->prepared = 0;
        }
        /* Windows never ended hold backend resources (CUDA events). */
        for (size_t w = 0; w < s->window_count;) {
            if (s->windows[w].client_serial != c->serial) {
                w++;
                continue;
            }
            if (c->vt->abandon_profile)
                c->vt->abandon_profile(c->server, &s->base,
                                       s->windows[w].backend_token);
            core_stream_window_remove(s, w);
        }
        core_stream_unlock(s);
    }
    for (uint32_t i = 0; i < streams; i++) {
        core_stream *s = core_stream_at(d, i);
        core_stream_lock(s);
        cube_error_ignore(c->vt->sync(c->server, &s->base, NULL, 0),
                          "the closing client drains the stream: nothing is "
                          "left to report to");
        core_stream_unlock(s);
    }
}

void cube_client_close(cube_client *c)
{
    if (!c)
        return;
    /* Calls that start from here on are refused; the ones in flight
     * finish before anything is torn down. */
    core_calls_close(c);
    core_ranges_close(c);
    /* Reads still outstanding complete now; their futures outlive the
     * client. */
    core_futures_detach(c);
    close_streams(c);
    core_graphs_destroy(c);
    core_staging_destroy(c);
    core_handles_destroy(c);
    core_memory_trace_flush();
    core_device_release(c->dev);
    cube_mutex_destroy(&c->failure_lock);
    cube_mutex_destroy(&c->staging_lock);
    cube_mutex_destroy(&c->graphs_lock);
    cube_mutex_destroy(&c->futures_lock);
    cube_mutex_destroy(&c->ranges_lock);
    free(c);
}

cube_error *cube_client_properties(cube_client *c, cube_properties *out)
{
    if (!c || !out)
        return cube_error_null_argument("cube_client_properties",
                                        c ? "out" : "client");
    *out = c->props;
    return NULL;
}

cube_error *cube_client_utilities(cube_client *c, cube_utilities *out)
{
    if (!c || !out)
        return cube_error_null_argument("cube_client_utilities",
                                        c ? "out" : "client");
    memset(out, 0, sizeof *out);
    out->properties = c->props;
    out->bounds =
        c->bounds_always ? CUBE_BOUNDS_ALWAYS : CUBE_BOUNDS_PER_LAUNCH;
    out->layout = CUBE_LAYOUT_CONTIGUOUS;
    out->software_graphs = c->vt->begin_capture == NULL;
    return NULL;
}

/* Resolves `n` handles for a check or sync; on error nothing stays
 * pinned. */
static cube_error *resolve_all(cube_client *c, const cube_handle *handles,
                               size_t n, const char *what, core_resolved **out)
{
    *out = NULL;
    if (n == 0)
        return NULL;
    if (!handles)
        return cube_error_new(CUBE_ERR_INVALID_ARGUMENT,
                              "%s: handles is NULL with n = %zu", what, n);
    core_resolved *r = calloc(n, sizeof *r);
    if (!r)
        return cube_error_new(CUBE_ERR_OUT_OF_MEMORY, "%s", what);
    for (size_t i = 0; i < n; i++) {
        cube_error *err = core_resolve(c, handles[i], what, &r[i]);
        if (err) {
            for (size_t j = 0; j < i; j++)
                core_resolved_drop(c, &r[j]);
            free(r);
            return cube_error_prefix(err, "handles[%zu]", i);
        }
    }
    *out = r;
    return NULL;
}

static void drop_all(cube_client *c, core_resolved *r, size_t n)
{
    for (size_t i = 0; r && i < n; i++)
        core_resolved_drop(c, &r[i]);
    free(r);
}

/* The bindings a backend may see for a sync or a check: a buffer made in
 * a dry run and not backed yet has no storage, and nothing to wait for or
 * check (it was never written), so it is left out. Fills b with the
 * others and returns how many. */
static size_t bind_backed(const core_resolved *r, size_t n, cube_binding *b)
{
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (!atomic_load_explicit(&r[i].alloc->deferred, memory_order_acquire))
            b[k++] = core_binding(&r[i]);
    return k;
}

static cube_error *check_call(cube_client *c, const cube_handle *handles,
                              size_t n)
{
    if (!c)
        return cube_error_null_argument("cube_check", "client");
    core_resolved *r;
    cube_error *err = resolve_all(c, handles, n, "cube_check", &r);
    if (err)
        return err;
    /* Instant: only what is known at enqueue time, no barrier (and what
     * the backend learned since of collectives between processes). */
    core_comm_reap(c);
    err = core_failure_claim_check(c, r, n, "cube_check");
    if (!err && c->vt->check && n) {
        cube_binding *b = calloc(n, sizeof *b);
        if (!b)
            err = cube_error_new(CUBE_ERR_OUT_OF_MEMORY, "cube_check");
        size_t nb = b ? bind_backed(r, n, b) : 0;
        if (nb) {
            core_stream *st = NULL;
            err = core_stream_get(c, &st);
            if (!err)
                err = c->vt->check(c->server, &st->base, b, nb);
        }
        free(b);
    }
    drop_all(c, r, n);
    return err;
}

cube_error *cube_check(cube_client *c, const cube_handle *handles, size_t n)
{
    CORE_CALL(c, "cube_check", check_call(c, handles, n));
}

static cube_error *sync_call(cube_client *c, const cube_handle *handles,
                             size_t n)
{
    if (!c)
        return cube_error_null_argument("cube_sync", "client");
    if (atomic_load_explicit(&c->dev->faulted, memory_order_acquire))
        return core_fault_get(c);
    core_resolved *r;
    cube_error *err = resolve_all(c, handles, n, "cube_sync", &r);
    if (err)
        return err;
    cube_binding *b = n ? calloc(n, sizeof *b) : NULL;
    if (n && !b) {
        drop_all(c, r, n);
        return cube_error_new(CUBE_ERR_OUT_OF_MEMORY, "cube_sync");
    }
    size_t nb = n ? bind_backed(r, n, b) : 0;
    core_stream *st = NULL;
    err = core_stream_get(c, &st);
    if (!err) {
        core_stream_lock(st);
        err = core_stream_refuse_in_capture(st, "cube_sync");
        uint64_t t0 = core_trace_on() ? core_clock_ns() : 0;
        /* The barrier first, so a device fault counts... */
        if (!err)
            err = c->vt->sync(c->server, &st->base, b, nb);
        if (t0)
            core_trace_span("sync", "sync", st->base.id, t0, core_clock_ns(),
                            NULL);
        core_stream_unlock(st);
        core_fault_note(c, err);
    }
    /* ...then the claim check a read would make, after what the backend
     * learned of collectives between processes the barrier waited for. */
    if (!err) {
        core_comm_reap(c);
        err = core_failure_claim_check(c, r, n, "cube_sync");
    }
    free(b);
    drop_all(c, r, n);
    return err;
}

cube_error *cube_sync(cube_client *c, const cube_handle *handles, size_t n)
{
    CORE_CALL(c, "cube_sync", sync_call(c, handles, n));
}

static cube_error *flush_call(cube_client *c)
{
    CORE_CHECK_CLIENT(c, "cube_flush");
    core_stream *st = NULL;
    cube_error *err = core_stream_enter(c, &st);
    if (err)
        return err;
    err = c->vt->flush(c->server, &st->base);
    core_stream_unlock(st);
    /* Only a broken context is the flush's to report. */
    if (err && cube_error_code(err) != CUBE_ERR_DEVICE_FAULT) {
        cube_log_write(CUBE_LOG_WARN, "client",
                       "flush: backend reported a non-fault error, which "
                       "belongs to buffers: %s",
                       cube_error_message(err));
        cube_error_free(err);
        err = NULL;
    }
    core_fault_note(c, err);
    return err;
}

cube_error *cube_flush(cube_client *c)
{
    CORE_CALL(c, "cube_flush", flush_call(c));
}

const char *cube_feature_name(uint32_t feature)
{
    switch (feature) {
    case CUBE_FEATURE_ATOMIC_F32_ADD: return "atomic_f32_add";
    case CUBE_FEATURE_F64: return "f64";
    case CUBE_FEATURE_SHARED_MEMORY: return "shared_memory";
    case CUBE_FEATURE_CUBE_SYNC: return "cube_sync";
    case CUBE_FEATURE_BOUNDS_CHECK: return "bounds_check";
    case CUBE_FEATURE_DYNAMIC_COUNT: return "dynamic_count";
    case CUBE_FEATURE_GRAPHS: return "graphs";
    case CUBE_FEATURE_PINNED_STAGING: return "pinned_staging";
    case CUBE_FEATURE_KERNELS: return "kernels";
    case CUBE_FEATURE_HOST_MEMORY: return "host_memory";
    case CUBE_FEATURE_COLLECTIVES: return "collectives";
    default: return NULL;
    }
}
