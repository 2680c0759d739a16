/* Launch: validation, the compiled-kernel cache, the failure contract.
 *
 * Locks (docs/threading.md): the stream's lock across the backend's
 * launch; cache_lock alone, never held across a compile.
 */
#include <stdlib.h>
#include <string.h>

#include <stddef.h>
#include <stdio.h>

#include "core/client_internal.h"
#include "core/trace.h"

#define LAUNCH_FLAGS                                                           \
    (CUBE_LAUNCH_SKIP | CUBE_LAUNCH_CHECKED | CUBE_LAUNCH_VALIDATE)

/* Options that change the compiled code are part of the key. Raw code
 * is compiled one way only: bounds checking is cube C's. */
static uint32_t compile_mode(const cube_kernel *k, uint32_t mode)
{
    if (cube_kernel_format_of(k) != CUBE_KERNEL_CUBE_C)
        return 0;
    /* Validating overrides checked: one compiled form. */
    if (mode & CUBE_LAUNCH_VALIDATE)
        return CUBE_LAUNCH_VALIDATE;
    return mode & CUBE_LAUNCH_CHECKED;
}

static uint64_t cache_key(const cube_kernel *k, uint32_t mode)
{
    return cube_kernel_id(k) ^
           ((uint64_t)compile_mode(k, mode) * 0x9E3779B97F4A7C15ull);
}

/* The entry for (k, mode) in its bucket whose state is at least
 * `min_state` (0: compiled or compiling; -1: a failed one too), or NULL.
 * Safe without the lock: entries are only ever pushed at a bucket's head
 * (after their fields are set) and never unlinked before close; key, mode
 * and kernel never change. The same kernel object is the common case;
 * another object with the same id is compared in full, so a hash
 * collision can never run the wrong kernel. */
static core_cache_entry *find_entry(core_device *c, const cube_kernel *k,
                                    uint64_t key, uint32_t cmode, int min_state)
{
    for (core_cache_entry *e = atomic_load_explicit(
             &c->cache[key % CORE_CACHE_BUCKETS], memory_order_acquire);
         e; e = e->next) {
        if (e->key == key && e->mode == cmode &&
            atomic_load_explicit(&e->state, memory_order_acquire) >=
                min_state &&
            core_kernel_same(e->kernel, k))
            return e;
    }
    return NULL;
}

/* A new entry for (k, mode), pushed at its bucket's head in the
 * compiling state, or NULL when memory runs out. */
static core_cache_entry *push_entry(core_device *c, cube_kernel *k,
                                    uint64_t key, uint32_t cmode)
    CUBE_REQUIRES(c->cache_lock);
static core_cache_entry *push_entry(core_device *c, cube_kernel *k,
                                    uint64_t key, uint32_t cmode)
{
    core_cache_entry *fresh = calloc(1, sizeof *fresh);
    if (!fresh)
        return NULL;
    fresh->key = key;
    fresh->mode = cmode;
    cube_kernel_retain(k);
    fresh->kernel = k;
    atomic_init(&fresh->state, 0);
    size_t bucket = key % CORE_CACHE_BUCKETS;
    fresh->next = atomic_load_explicit(&c->cache[bucket], memory_order_relaxed);
    atomic_store_explicit(&c->cache[bucket], fresh, memory_order_release);
    atomic_fetch_add_explicit(&c->cache_entries, 1, memory_order_relaxed);
    return fresh;
}

/* Finds or compiles the kernel in the device's cache (shared by its
 * clients). The returned pointer lives as long as the device. A hit takes no
 * lock. The first thread to miss compiles (outside the lock) while the entry is
 * marked as compiling; threads that ask meanwhile wait for it instead of
 * compiling the same kernel again. A failed compile leaves its entry marked
 * failed, and the next launch of the kernel compiles into that same entry: a
 * kernel that keeps failing holds one entry, not one per launch. */
/* The trace's record of a compile request, on the calling thread's lane:
 * a hit in the device's cache is an instant (a span when the thread waited
 * for another thread's compile of the kernel); a compile, or a load from
 * the disk cache, a span with the backend and how it went. */
static void trace_compile(cube_client *client, const cube_kernel *k,
                          uint32_t cmode, const char *outcome, uint64_t t0,
                          const cube_compiled *cc, const cube_error *err)
{
    char args[256];
    int n = snprintf(args, sizeof args,
                     "{\"outcome\":\"%s\",\"backend\":\"%s\",\"checked\":%s",
                     outcome, client->dev->backend->name,
                     cmode & CUBE_LAUNCH_CHECKED ? "true" : "false");
    if (cc && cc->barrier_pass && n > 0 && (size_t)n < sizeof args)
        n += snprintf(args + n, sizeof args - (size_t)n,
                      ",\"barrier_pass\":\"%s\"", cc->barrier_pass);
    if (err && n > 0 && (size_t)n < sizeof args)
        n += snprintf(args + n, sizeof args - (size_t)n, ",\"error\":\"%s\"",
                      cube_code_name(cube_error_code(err)));
    if (n > 0 && (size_t)n < sizeof args - 1)
        snprintf(args + n, sizeof args - (size_t)n, "}");
    else
        snprintf(args, sizeof args, "{\"outcome\":\"%s\"}", outcome);
    cube_stream_id lane = cube_stream_current(client);
    if (t0)
        core_trace_span("compile", cube_kernel_name(k), lane, t0,
                        core_clock_ns(), args);
    else
        core_trace_instant("compile", cube_kernel_name(k), lane,
                           core_clock_ns(), args);
}

static cube_error *get_compiled(cube_client *client, cube_kernel *k,
                                uint32_t mode, const cube_compiled **out)
{
    core_device *c = client->dev;
    uint64_t key = cache_key(k, mode);
    uint32_t cmode = compile_mode(k, mode);
    core_cache_entry *hit = find_entry(c, k, key, cmode, 0);
    if (hit && atomic_load_explicit(&hit->state, memory_order_acquire) == 1) {
        *out = &hit->compiled;
        if (core_trace_on())
            trace_compile(client, k, cmode, "memory hit", 0, *out, NULL);
        return NULL;
    }
    uint64_t t0 = core_trace_on() ? core_clock_ns() : 0;
    int waited = 0;
    cube_mutex_lock(&c->cache_lock);
    for (;;) {
        core_cache_entry *e = find_entry(c, k, key, cmode, 0);
        if (!e)
            break;
        if (atomic_load_explicit(&e->state, memory_order_acquire) == 1) {
            *out = &e->compiled;
            cube_mutex_unlock(&c->cache_lock);
            if (core_trace_on())
                trace_compile(client, k, cmode, "memory hit", waited ? t0 : 0,
                              *out, NULL);
            return NULL;
        }
        /* Another thread compiles it; if that fails, the entry is marked
         * failed and this thread tries itself. */
        cube_cond_wait(&c->cache_cv, &c->cache_lock);
        waited = 1;
    }
    /* Only a failed entry, or none. A failed one goes back to compiling
     * (readers without the lock skip it either way, and its key, mode
     * and kernel stay as they are); what its compile left is released
     * below, outside the lock, before this thread compiles into it. */
    core_cache_entry *entry = find_entry(c, k, key, cmode, -1);
    int reused = entry != NULL;
    if (reused)
        atomic_store_explicit(&entry->state, 0, memory_order_release);
    else
        entry = push_entry(c, k, key, cmode);
    cube_mutex_unlock(&c->cache_lock);
    if (!entry)
        return cube_error_new(CUBE_ERR_OUT_OF_MEMORY, "kernel cache");
    if (reused) {
        client->vt->compiled_release(client->server, &entry->compiled);
        memset(&entry->compiled, 0, sizeof entry->compiled);
    }

    if (core_trace_on() && !t0)
        t0 = core_clock_ns();
    cube_error *err =
        client->vt->compile(client->server, k, cmode, &entry->compiled);
    /* Read before the entry is published: from then on another thread may
     * compile into it again (after a failure). */
    if (t0 && core_trace_on())
        trace_compile(client, k, cmode,
                      err                               ? "failed"
                      : entry->compiled.from_disk_cache ? "disk hit"
                                                        : "compiled",
                      t0, err ? NULL : &entry->compiled, err);

    cube_mutex_lock(&c->cache_lock);
    atomic_store_explicit(&entry->state, err ? -1 : 1, memory_order_release);
    pthread_cond_broadcast(&c->cache_cv);
    cube_mutex_unlock(&c->cache_lock);
    if (err)
        return err;
    *out = &entry->compiled;
    cube_log_write(
        CUBE_LOG_DEBUG, "compile", "%s: %s in %.1f ms", cube_kernel_name(k),
        entry->compiled.from_disk_cache ? "loaded from disk cache" : "compiled",
        entry->compiled.compile_ms);
    return NULL;
}

size_t core_cache_entry_count(const cube_client *c)
{
    return atomic_load_explicit(&c->dev->cache_entries, memory_order_relaxed);
}

void core_cache_log_summary(core_device *c)
{
    if (!c->stats || !cube_log_enabled(CUBE_LOG_INFO))
        return;
    int any = 0;
    for (size_t b = 0; b < CORE_CACHE_BUCKETS; b++)
        for (core_cache_entry *e = c->cache[b]; e; e = e->next)
            any |= atomic_load(&e->launches) != 0;
    if (!any)
        return;
    cube_log_write(
        CUBE_LOG_INFO, "profile",
        "kernel summary for %s (host clock, launch to return):", c->name);
    cube_log_write(CUBE_LOG_INFO, "profile", "%-32s %10s %12s %12s", "kernel",
                   "launches", "total ms", "mean us");
    for (size_t b = 0; b < CORE_CACHE_BUCKETS; b++) {
        for (core_cache_entry *e = c->cache[b]; e; e = e->next) {
            uint64_t n = atomic_load(&e->launches);
            if (!n)
                continue;
            double total = (double)atomic_load(&e->total_ns);
            cube_log_write(CUBE_LOG_INFO, "profile",
                           "%-32s %10llu %12.3f %12.3f%s",
                           cube_kernel_name(e->kernel), (unsigned long long)n,
                           total / 1e6, total / 1e3 / (double)n,
                           e->mode & CUBE_LAUNCH_VALIDATE  ? " (validate)"
                           : e->mode & CUBE_LAUNCH_CHECKED ? " (checked)"
                                                           : "");
        }
    }
}

void core_cache_destroy(core_device *c)
{
    for (size_t b = 0; b < CORE_CACHE_BUCKETS; b++) {
        core_cache_entry *e = c->cache[b];
        while (e) {
            core_cache_entry *next = e->next;
            c->vt->compiled_release(c->server, &e->compiled);
            cube_kernel_release((cube_kernel *)e->kernel);
            free(e);
            e = next;
        }
        c->cache[b] = NULL;
    }
    atomic_store_explicit(&c->cache_entries, 0, memory_order_relaxed);
}

static int param_is_written(cube_param_kind kind)
{
    return kind == CUBE_PARAM_BUFFER_OUT || kind == CUBE_PARAM_BUFFER_INOUT;
}

static int param_is_read(cube_param_kind kind)
{
    return kind == CUBE_PARAM_BUFFER_IN || kind == CUBE_PARAM_BUFFER_INOUT;
}

static const char *kind_name(cube_param_kind kind)
{
    switch (kind) {
    case CUBE_PARAM_BUFFER_IN: return "an input buffer";
    case CUBE_PARAM_BUFFER_OUT: return "an output buffer";
    case CUBE_PARAM_BUFFER_INOUT: return "an in/out buffer";
    case CUBE_PARAM_SCALAR: return "a scalar";
    case CUBE_PARAM_SHARED: return "shared memory";
    }
    return "?";
}

/* Matches the arguments against the signature; fills positions. */
static cube_error *bind_args(const cube_kernel *k, const cube_compiled *cc,
                             const cube_arg *args, size_t nargs,
                             uint32_t *arg_of_param)
{
    size_t expected = 0;
    for (uint32_t p = 0; p < cc->param_count; p++)
        expected += cc->params[p].kind != CUBE_PARAM_SHARED;
    if (expected != nargs)
        return cube_error_new(CUBE_ERR_INVALID_ARGUMENT,
                              "cube_launch(%s): the kernel takes %zu "
                              "arguments, %zu were given",
                              cube_kernel_name(k), expected, nargs);
    size_t a = 0;
    for (uint32_t p = 0; p < cc->param_count; p++) {
        const cube_param *pp = &cc->params[p];
        if (pp->kind == CUBE_PARAM_SHARED)
            continue;
        const cube_arg *arg = &args[a];
        int want_scalar = pp->kind == CUBE_PARAM_SCALAR;
        if (want_scalar != (arg->kind == CUBE_ARG_SCALAR))
            return cube_error_new(CUBE_ERR_INVALID_ARGUMENT,
                                  "cube_launch(%s): args[%zu] must be %s",
                                  cube_kernel_name(k), a, kind_name(pp->kind));
        if (want_scalar && arg->size != pp->elem_size)
            return cube_error_new(CUBE_ERR_INVALID_ARGUMENT,
                                  "cube_launch(%s): args[%zu] is a %u-byte "
                                  "scalar but the kernel's parameter has %u "
                                  "bytes",
                                  cube_kernel_name(k), a, arg->size,
                                  pp->elem_size);
        arg_of_param[p] = (uint32_t)a++;
    }
    return NULL;
}

/* The device's limits on one cube, against the kernel's dimension `dim`
 * and its shared memory. */
static cube_error *check_limits(const cube_client *c, const cube_kernel *k,
                                const uint32_t dim[3], const cube_compiled *cc)
{
    const cube_properties *pr = &c->props;
    for (int i = 0; i < 3; i++)
        if (dim[i] > pr->max_cube_dim[i])
            return cube_error_new(
                CUBE_ERR_RESOURCE_LIMIT,
                "cube_launch(%s): cube dimension (%u, %u, %u) is over the "
                "device's maximum (%u, %u, %u)",
                cube_kernel_name(k), dim[0], dim[1], dim[2],
                pr->max_cube_dim[0], pr->max_cube_dim[1], pr->max_cube_dim[2]);
    uint64_t units = (uint64_t)dim[0] * dim[1] * dim[2];
    if (units > pr->max_units_per_cube)
        return cube_error_new(CUBE_ERR_RESOURCE_LIMIT,
                              "cube_launch(%s): %llu units per cube is over "
                              "the device's maximum of %u",
                              cube_kernel_name(k), (unsigned long long)units,
                              pr->max_units_per_cube);
    if (cc->shared_bytes > pr->max_shared_memory)
        return cube_error_new(CUBE_ERR_RESOURCE_LIMIT,
                              "cube_launch(%s): %llu bytes of shared memory "
                              "per cube is over the device's maximum of %llu",
                              cube_kernel_name(k),
                              (unsigned long long)cc->shared_bytes,
                              (unsigned long long)pr->max_shared_memory);
    return NULL;
}

/* One launch on its way through: the request, the buffers it pinned and
 * what the cache and the kernel's signature said about it. */
typedef struct launch_job {
    cube_kernel *k;
    cube_count count;
    const cube_arg *args;
    size_t nargs;
    uint32_t mode; /* the caller's, with what the client adds */
    int dynamic;   /* the cube count is read from a buffer */
    /* Set by the backend: the dynamic count had a zero component, so the
     * launch ran no cube and wrote nothing. */
    int ran_nothing;
    int deferred;  /* a buffer made in a dry run has no memory yet */
    size_t filled; /* entries of r set: pinned, or empty for a scalar */
    core_resolved r[CUBE_MAX_PARAMS];
    core_resolved count_res; /* the dynamic count's buffer, pinned */
    /* The compiled kernel's signature once it compiled (NULL before, or
     * when it did not), whether or not the arguments fit it. */
    const cube_compiled *sig;
    /* NULL while the parameters are unknown: no compiled kernel, or
     * arguments that do not fit it. */
    const cube_compiled *cc;
    /* The failure is the machine's (memory, a file, a process), met
     * before anything ran: returned, recorded on no buffer. */
    int transient;
    /* A mistake in the request that only the signature shows (a
     * misaligned binding): returned and recorded nowhere, like
     * check_request's. */
    int refused;
    uint32_t arg_of_param[CUBE_MAX_PARAMS];
    /* What the backend is handed; its cube dimension is set by prepare,
     * which checks it against the device's limits. */
    cube_dispatch d;
    cube_binding count_binding;
} launch_job;

/* A static count must name at least one cube per axis, within the
 * device's grid; a dynamic one is read at execution. */
static cube_error *check_count(const cube_client *c, const cube_kernel *k,
                               cube_count count)
{
    if (count.dynamic.bits)
        return NULL;
    if (!count.x || !count.y || !count.z)
        return cube_error_new(CUBE_ERR_INVALID_ARGUMENT,
                              "cube_launch(%s): cube count (%u, %u, %u) "
                              "has a zero component",
                              cube_kernel_name(k), count.x, count.y, count.z);
    const uint32_t v[3] = {count.x, count.y, count.z};
    for (int i = 0; i < 3; i++)
        if (v[i] > c->props.max_cube_count[i])
            return cube_error_new(
                CUBE_ERR_RESOURCE_LIMIT,
                "cube_launch(%s): cube count %u along axis %d is over "
                "the device's maximum of %u",
                cube_kernel_name(k), v[i], i, c->props.max_cube_count[i]);
    return NULL;
}

/* A malformed request is the caller's mistake: it is returned before
 * anything is pinned, and nothing is recorded. */
static cube_error *check_request(const cube_client *c, const cube_kernel *k,
                                 cube_count count, const cube_arg *args,
                                 size_t nargs, uint32_t mode)
{
    if (!k)
        return cube_error_new(CUBE_ERR_INVALID_ARGUMENT,
                              "cube_launch: kernel is NULL");
    if (nargs && !args)
        return cube_error_new(CUBE_ERR_INVALID_ARGUMENT,
                              "cube_launch(%s): args is NULL with nargs = %zu",
                              cube_kernel_name(k), nargs);
    if (nargs > CUBE_MAX_PARAMS)
        return cube_error_new(CUBE_ERR_INVALID_ARGUMENT,
                              "cube_launch(%s): %zu arguments; at most %d",
                              cube_kernel_name(k), nargs, CUBE_MAX_PARAMS);
    if (mode & ~(uint32_t)LAUNCH_FLAGS)
        return cube_error_new(CUBE_ERR_INVALID_ARGUMENT,
                              "cube_launch(%s): unknown mode bits 0x%x",
                              cube_kernel_name(k),
                              mode & ~(uint32_t)LAUNCH_FLAGS);
    cube_error *err = check_count(c, k, count);
    for (size_t a = 0; a < nargs && !err; a++)
        if (args[a].kind != CUBE_ARG_BUFFER && args[a].kind != CUBE_ARG_SCALAR)
            err = cube_error_new(CUBE_ERR_INVALID_ARGUMENT,
                                 "cube_launch(%s): args[%zu].kind %d is "
                                 "neither buffer nor scalar",
                                 cube_kernel_name(k), a, (int)args[a].kind);
    return err;
}

/* Starts the job with the request as this launch runs it. Only the
 * bookkeeping is set: the arrays are filled as the launch goes (clearing
 * them would be a good part of a small launch's cost). */
static void job_begin(launch_job *job, const cube_client *c, cube_kernel *k,
                      cube_count count, const cube_arg *args, size_t nargs,
                      uint32_t mode)
{
    if (c->bounds_always)
        mode |= CUBE_LAUNCH_CHECKED;
    /* Inside a dry-run scope every launch is a Skip. */
    if (core_dry_run_active(c))
        mode |= CUBE_LAUNCH_SKIP;
    job->k = k;
    job->count = count;
    job->args = args;
    job->nargs = nargs;
    job->mode = mode;
    job->dynamic = count.dynamic.bits != 0;
    job->ran_nothing = 0;
    job->deferred = 0;
    job->filled = 0;
    job->count_res.alloc = NULL;
    job->sig = NULL;
    job->cc = NULL;
    job->transient = 0;
    job->refused = 0;
}

/* Whether the resolved buffer was made in a dry run and still waits for
 * its memory. The flag only ever goes from 1 to 0, so a 0 is final and
 * the common launch skips materialize. */
static int is_deferred(const core_resolved *r)
{
    return atomic_load_explicit(&r->alloc->deferred, memory_order_relaxed);
}

/* The dynamic count's buffer is pinned like the arguments; it must hold
 * the three uint32_t read at execution. */
static cube_error *resolve_count(cube_client *c, launch_job *job)
{
    cube_error *err = core_resolve(
        c, job->count.dynamic, "cube_launch: dynamic count", &job->count_res);
    if (err)
        return err;
    job->deferred |= is_deferred(&job->count_res);
    if (job->count_res.size < 12)
        return cube_error_new(CUBE_ERR_INVALID_ARGUMENT,
                              "cube_launch(%s): the dynamic count buffer "
                              "holds %llu bytes; it needs 12 (three "
                              "uint32_t)",
                              cube_kernel_name(job->k),
                              (unsigned long long)job->count_res.size);
    return NULL;
}

/* Resolves and pins every buffer before anything else, so that none can
 * be released under the launch. */
static cube_error *resolve_args(cube_client *c, launch_job *job)
{
    for (; job->filled < job->nargs; job->filled++) {
        size_t a = job->filled;
        core_resolved *r = &job->r[a];
        r->alloc = NULL; /* a scalar's entry stays empty */
        if (job->args[a].kind != CUBE_ARG_BUFFER)
            continue;
        cube_error *err =
            core_resolve(c, job->args[a].value.buffer, "cube_launch", r);
        if (err)
            return cube_error_prefix(err, "args[%zu]", a);
        job->deferred |= is_deferred(r);
    }
    return job->dynamic ? resolve_count(c, job) : NULL;
}

/* A buffer made in a dry run gets its memory at its first real use. */
static cube_error *materialize(cube_client *c, const launch_job *job)
{
    if (!job->deferred || (job->mode & CUBE_LAUNCH_SKIP))
        return NULL;
    cube_error *err = core_materialize(c, job->r, job->nargs);
    if (!err && job->dynamic)
        err = core_materialize(c, &job->count_res, 1);
    return err;
}

/* Whether a compile's failure belongs to the machine rather than to the
 * kernel: memory, or a file, directory, process or library the compiler
 * needed (cubert/kernel.h lists the codes). Another attempt may succeed,
 * and nothing was written, so no buffer carries it. */
static int compile_failure_is_transient(const cube_error *err)
{
    cube_code code = cube_error_code(err);
    return code == CUBE_ERR_OUT_OF_MEMORY || code == CUBE_ERR_IO;
}

/* The alignment a device access to an element of `elem_size` bytes
 * needs: the largest power of two that divides the size, at most 16 (a
 * 4-byte uint32_t needs 4, a 12-byte struct of floats 4, a double 8). */
static uint64_t elem_alignment(uint32_t elem_size)
{
    uint32_t a = elem_size & (~elem_size + 1u);
    return a == 0 ? 1 : a > 16 ? 16 : a;
}

/* Every buffer bound to a parameter must start at a device address that
 * is a multiple of its element's alignment: on CUDA a misaligned access
 * is a device fault that breaks the context, so the request is refused
 * before anything runs, on every backend alike. Buffers are allocated
 * aligned, so what can break the rule is a slice's offset. */
static cube_error *check_alignment(const launch_job *job)
{
    const cube_compiled *cc = job->cc;
    for (uint32_t p = 0; p < cc->param_count; p++) {
        cube_param_kind kind = cc->params[p].kind;
        if (kind == CUBE_PARAM_SCALAR || kind == CUBE_PARAM_SHARED)
            continue;
        uint64_t align = elem_alignment(cc->params[p].elem_size);
        uint32_t a = job->arg_of_param[p];
        const core_resolved *r = &job->r[a];
        /* A buffer made in a dry run has no address yet (a Skip launch
         * meets it so): its offset is what will count. */
        uint64_t base =
            atomic_load_explicit(&r->alloc->deferred, memory_order_acquire)
                ? 0
                : r->alloc->storage.address;
        uint64_t address = base + r->offset;
        if (address & (align - 1)) {
            char name[CORE_BUFFER_NAME_MAX];
            core_buffer_name(r->alloc, r->handle.bits, name);
            return cube_error_new(
                CUBE_ERR_INVALID_ARGUMENT,
                "cube_launch(%s): args[%u] (buffer %s) starts at "
                "byte offset %llu of its allocation (device address "
                "0x%llx); the parameter's %u-byte elements need an address "
                "aligned to %llu bytes",
                cube_kernel_name(job->k), a, name,
                (unsigned long long)r->offset, (unsigned long long)address,
                cc->params[p].elem_size, (unsigned long long)align);
        }
    }
    return NULL;
}

/* What a dry run does too: the compiled kernel (cached, or compiled now),
 * the arguments bound to its parameters and aligned for them, the
 * device's limits. */
static cube_error *prepare(cube_client *c, launch_job *job)
{
    const cube_compiled *cc = NULL;
    cube_error *err = get_compiled(c, job->k, job->mode, &cc);
    if (err) {
        job->transient = compile_failure_is_transient(err);
        /* A raw kernel's parameters are declared: its failure goes to the
         * buffers given for its outputs, as when arguments do not fit
         * (record_failure). */
        job->sig = cube_kernel_declared(job->k);
        return err;
    }
    if (!cc)
        return cube_error_new(CUBE_ERR_INTERNAL, "compiled kernel missing");
    job->sig = cc;
    /* Arguments that do not fit the signature leave job->cc NULL: the
     * failure goes to the buffers given where the kernel writes
     * (record_failure). */
    err = bind_args(job->k, cc, job->args, job->nargs, job->arg_of_param);
    if (err)
        return err;
    job->cc = cc;
    err = check_alignment(job);
    if (err) {
        job->refused = 1;
        return err;
    }
    cube_kernel_cube_dim(job->k, job->d.cube_dim);
    return check_limits(c, job->k, job->d.cube_dim, cc);
}

/* The allocation's failure, or NULL. A trusted buffer (the common case)
 * costs one atomic load here, without a call. */
static cube_error *failure_of(cube_client *c, core_alloc *a)
{
    if (!atomic_load_explicit(&a->failure, memory_order_acquire))
        return NULL;
    return core_failure_get(c, a);
}

/* An input that cannot be trusted makes the outputs untrustworthy: its
 * failure is carried forward instead of computing from stale bytes. */
static cube_error *refuse_untrusted_inputs(cube_client *c,
                                           const launch_job *job)
{
    const cube_compiled *cc = job->cc;
    for (uint32_t p = 0; p < cc->param_count; p++) {
        if (!param_is_read(cc->params[p].kind))
            continue;
        uint32_t a = job->arg_of_param[p];
        cube_error *f = failure_of(c, job->r[a].alloc);
        if (f)
            return cube_error_wrap(f, CUBE_ERR_SEVERAL,
                                   "cube_launch(%s): input args[%u] (buffer "
                                   "0x%016llx) cannot be trusted",
                                   cube_kernel_name(job->k), a,
                                   (unsigned long long)job->r[a].handle.bits);
    }
    cube_error *f = job->dynamic ? failure_of(c, job->count_res.alloc) : NULL;
    if (f)
        return cube_error_wrap(f, CUBE_ERR_SEVERAL,
                               "cube_launch(%s): the dynamic count buffer "
                               "cannot be trusted",
                               cube_kernel_name(job->k));
    return NULL;
}

/* Arguments that do not fit the signature: the buffers given in the
 * positions of the kernel's OUT and INOUT parameters (arguments are given
 * in parameter order) take the failure. One given where the kernel reads,
 * takes a scalar, or past its last parameter is not written by it. */
static void record_on_written_positions(cube_client *c, const launch_job *job,
                                        const cube_error *err)
{
    const cube_compiled *sig = job->sig;
    size_t a = 0;
    for (uint32_t p = 0; p < sig->param_count && a < job->nargs; p++) {
        cube_param_kind kind = sig->params[p].kind;
        if (kind == CUBE_PARAM_SHARED)
            continue;
        core_alloc *alloc = job->r[a++].alloc;
        if (alloc && param_is_written(kind))
            core_failure_record(c, alloc, err);
    }
}

/* The launch's failure becomes the buffers' it would have written (the
 * signature's outputs when the kernel compiled, every bound buffer when it
 * did not), so reading them fails; a failure of the machine at compile
 * (job->transient) is no buffer's. The stream's profiling windows count
 * it either way. */
static void record_failure(cube_client *c, const launch_job *job,
                           const cube_error *err)
{
    const cube_compiled *cc = job->cc;
    if (job->transient) {
        /* nothing was written: every buffer holds what it held */
    } else if (!cc && job->sig) {
        record_on_written_positions(c, job, err);
    } else if (!cc) {
        for (size_t a = 0; a < job->nargs; a++)
            if (job->r[a].alloc)
                core_failure_record(c, job->r[a].alloc, err);
    } else {
        for (uint32_t p = 0; p < cc->param_count; p++) {
            if (!param_is_written(cc->params[p].kind))
                continue;
            core_alloc *a = job->r[job->arg_of_param[p]].alloc;
            if (a)
                core_failure_record(c, a, err);
        }
    }
    core_stream_note_failure_now(c, err);
    cube_log_write(CUBE_LOG_DEBUG, "launch", "%s failed: %s",
                   cube_kernel_name(job->k), cube_error_message(err));
}

/* Times a launch for the per-kernel summary and the trace. */
static void account(const cube_kernel *k, const cube_compiled *cc,
                    const cube_dispatch *d, cube_stream_id stream, uint64_t t0)
{
    uint64_t t1 = core_clock_ns();
    core_cache_entry *e =
        (core_cache_entry *)((char *)(uintptr_t)cc -
                             offsetof(core_cache_entry, compiled));
    atomic_fetch_add_explicit(&e->launches, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&e->total_ns, t1 - t0, memory_order_relaxed);
    if (core_trace_on()) {
        char args[160];
        if (d->count_buffer)
            snprintf(args, sizeof args,
                     "{\"cube_count\":\"dynamic\",\"cube_dim\":[%u,%u,%u]}",
                     d->cube_dim[0], d->cube_dim[1], d->cube_dim[2]);
        else
            snprintf(args, sizeof args,
                     "{\"cube_count\":[%u,%u,%u],\"cube_dim\":[%u,%u,%u]}",
                     d->cube_count[0], d->cube_count[1], d->cube_count[2],
                     d->cube_dim[0], d->cube_dim[1], d->cube_dim[2]);
        core_trace_span("launch", cube_kernel_name(k), stream, t0, t1, args);
    }
}

/* A buffer argument as the backend sees it: core_binding, written in
 * place, since every buffer of every launch goes through it. */
static void bind_buffer(cube_binding *b, const core_resolved *r)
{
    b->storage = &r->alloc->storage;
    b->offset = r->offset;
    b->size = r->size;
}

/* The rest of the backend's view of the launch. Backends read the entries
 * of the kernel's own parameters: the rest of the arrays is left alone
 * (clearing it is most of a small launch's cost). */
static void build_dispatch(launch_job *job)
{
    const cube_compiled *cc = job->cc;
    cube_dispatch *d = &job->d;
    d->compiled = cc;
    d->cube_count[0] = job->count.x;
    d->cube_count[1] = job->count.y;
    d->cube_count[2] = job->count.z;
    d->count_buffer = NULL;
    d->ran_nothing = NULL;
    if (job->dynamic) {
        bind_buffer(&job->count_binding, &job->count_res);
        d->count_buffer = &job->count_binding;
        d->ran_nothing = &job->ran_nothing;
    }
    d->mode = job->mode;
    for (uint32_t p = 0; p < cc->param_count; p++) {
        cube_param_kind kind = cc->params[p].kind;
        if (kind == CUBE_PARAM_SHARED)
            continue;
        uint32_t a = job->arg_of_param[p];
        if (kind == CUBE_PARAM_SCALAR)
            memcpy(d->scalars[p], job->args[a].value.bytes,
                   sizeof d->scalars[p]);
        else
            bind_buffer(&d->bindings[p], &job->r[a]);
    }
}

/* Called with the stream's lock held. */
static cube_error *record(cube_client *c, core_stream *st,
                          const launch_job *job) CUBE_REQUIRES(st->lock);
static cube_error *capture_dispatch(cube_client *c, core_stream *st,
                                    const launch_job *job)
    CUBE_REQUIRES(st->lock);
static cube_error *run_now(cube_client *c, core_stream *st,
                           const launch_job *job) CUBE_REQUIRES(st->lock);

/* Records a dispatch into the stream's capture, with the allocations it
 * reads and writes. */
static cube_error *record(cube_client *c, core_stream *st,
                          const launch_job *job)
{
    const cube_compiled *cc = job->cc;
    core_alloc *read[CUBE_MAX_PARAMS + 1], *written[CUBE_MAX_PARAMS],
        *cleared[CUBE_MAX_PARAMS];
    size_t nr = 0, nw = 0, nc = 0;
    for (uint32_t p = 0; p < cc->param_count; p++) {
        cube_param_kind kind = cc->params[p].kind;
        if (kind == CUBE_PARAM_SCALAR || kind == CUBE_PARAM_SHARED)
            continue;
        core_alloc *a = job->r[job->arg_of_param[p]].alloc;
        if (param_is_read(kind))
            read[nr++] = a;
        if (param_is_written(kind))
            written[nw++] = a;
        if (kind == CUBE_PARAM_BUFFER_OUT)
            cleared[nc++] = a;
    }
    if (job->dynamic)
        read[nr++] = job->count_res.alloc;
    return core_graph_record(c, st, &job->d, read, nr, written, nw, cleared,
                             nc);
}

/* A capturing stream keeps the launch for its graph instead of running
 * it. A hardware graph records on the device's own queue (nothing runs); a
 * software graph keeps the dispatch. Either way no buffer changes state
 * until a replay. */
static cube_error *capture_dispatch(cube_client *c, core_stream *st,
                                    const launch_job *job)
{
    cube_error *err = NULL;
    if (c->vt->begin_capture)
        err = c->vt->launch(c->server, &st->base, &job->d);
    if (!err)
        err = record(c, st, job);
    return err;
}

/* Hands the dispatch to the backend, timed when the per-kernel summary or
 * a trace wants it. */
static cube_error *run_now(cube_client *c, core_stream *st,
                           const launch_job *job)
{
    int timed = c->stats || core_trace_on();
    uint64_t t0 = timed ? core_clock_ns() : 0;
    cube_error *err = c->vt->launch(c->server, &st->base, &job->d);
    if (timed)
        account(job->k, job->cc, &job->d, st->base.id, t0);
    if (!err)
        st->launches++;
    return err;
}

/* The debug log's line for a launch that was run. */
static void log_dispatch(const launch_job *job, const cube_error *err)
{
    if (!cube_log_enabled(CUBE_LOG_DEBUG))
        return;
    const cube_dispatch *d = &job->d;
    cube_log_write(
        CUBE_LOG_DEBUG, "launch", "%s: (%u, %u, %u) cubes of (%u, %u, %u)%s%s",
        cube_kernel_name(job->k), d->cube_count[0], d->cube_count[1],
        d->cube_count[2], d->cube_dim[0], d->cube_dim[1], d->cube_dim[2],
        d->count_buffer ? ", dynamic count" : "", err ? ", failed" : "");
}

/* The outputs now hold what this launch computed: a failure they carried
 * is gone. Trusted outputs (the common case) cost a load each. A dynamic
 * count of zero ran nothing and rewrote nothing: the outputs keep their
 * failures. */
static void trust_outputs(cube_client *c, const launch_job *job)
{
    const cube_compiled *cc = job->cc;
    if (job->ran_nothing)
        return;
    for (uint32_t p = 0; p < cc->param_count; p++) {
        if (cc->params[p].kind != CUBE_PARAM_BUFFER_OUT)
            continue;
        core_alloc *a = job->r[job->arg_of_param[p]].alloc;
        if (atomic_load_explicit(&a->failure, memory_order_acquire))
            core_failure_clear(c, a);
    }
}

/* Runs the launch on the calling thread's stream, or records it there
 * when the stream is capturing. */
static cube_error *run_dispatch(cube_client *c, launch_job *job)
{
    build_dispatch(job);
    core_stream *st = NULL;
    cube_error *err = core_stream_get(c, &st);
    if (err)
        return err;
    core_stream_lock(st);
    if (st->capture) {
        /* Another client's capture on a shared stream cannot hold this
         * client's buffers: refused (recorded nowhere), like work a
         * capture cannot record. */
        if (job->mode & CUBE_LAUNCH_VALIDATE) {
            /* Its verdict is read when it has run; a replay has no caller
             * to hand it to. */
            job->refused = 1;
            err = cube_error_new(CUBE_ERR_GRAPH_STATE,
                                 "cube_launch(%s): a validating launch "
                                 "(CUBE_LAUNCH_VALIDATE) cannot be captured "
                                 "into a graph; launch it outside the "
                                 "capture",
                                 cube_kernel_name(job->k));
        } else if (st->capture_client == c) {
            err = capture_dispatch(c, st, job);
        } else {
            job->refused = 1;
            err = cube_error_new(CUBE_ERR_GRAPH_STATE,
                                 "cube_launch: stream 0x%016llx is capturing "
                                 "a graph for another client of %s; launch "
                                 "after its cube_graph_end",
                                 (unsigned long long)st->base.id, c->device);
        }
        core_stream_unlock(st);
        return err;
    }
    err = run_now(c, st, job);
    core_stream_unlock(st);
    /* A validating launch's verdict names its kernel; the backend knows
     * only the compiled code. */
    if (err && (job->mode & CUBE_LAUNCH_VALIDATE) &&
        cube_error_code(err) == CUBE_ERR_INVALID_ARGUMENT)
        err =
            cube_error_prefix(err, "cube_launch(%s)", cube_kernel_name(job->k));
    if (err)
        core_fault_note(c, err);
    log_dispatch(job, err);
    if (!err)
        trust_outputs(c, job);
    return err;
}

/* Gives back the pins resolve_args took (a scalar's entry holds none). */
static void unpin(cube_client *c, launch_job *job)
{
    for (size_t a = 0; a < job->filled; a++)
        if (job->r[a].alloc)
            core_resolved_drop(c, &job->r[a]);
    if (job->count_res.alloc)
        core_resolved_drop(c, &job->count_res);
}

/* The launch, step by step (cubert/kernel.h states the contract). */
static inline __attribute__((always_inline)) cube_error *
launch(cube_client *c, cube_kernel *k, cube_count count, const cube_arg *args,
       size_t nargs, uint32_t mode)
{
    CORE_CHECK_CLIENT(c, "cube_launch");
    cube_error *err = check_request(c, k, count, args, nargs, mode);
    if (err)
        return err;
    launch_job job;
    job_begin(&job, c, k, count, args, nargs, mode);
    err = resolve_args(c, &job);
    if (!err)
        err = materialize(c, &job);
    if (err) {
        unpin(c, &job);
        return err;
    }

    /* From here on a failure is the launch's: it lands on the buffers,
     * except a misaligned binding, which prepare finds once the
     * signature is known and which is the request's (job.refused). */
    err = prepare(c, &job);
    /* A dry run ends here (compiled, validated, cached, dropped) and
     * changes no buffer's state, failed or not. */
    if (!(job.mode & CUBE_LAUNCH_SKIP)) {
        if (!err)
            err = refuse_untrusted_inputs(c, &job);
        if (!err)
            err = run_dispatch(c, &job);
        if (err && !job.refused)
            record_failure(c, &job, err);
    }
    unpin(c, &job);
    return err;
}

cube_error *cube_launch(cube_client *c, cube_kernel *k, cube_count count,
                        const cube_arg *args, size_t nargs, uint32_t mode)
{
    CORE_CALL(c, "cube_launch", launch(c, k, count, args, nargs, mode));
}
