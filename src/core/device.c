/* Devices: the list each backend can open, and one server per device per
 * process (the contract's DeviceService: `init` runs once per device).
 *
 * The first cube_client_open of a device opens its server; later opens of
 * the same device get a new client on that server, so every library in the
 * process shares its pools, streams and compiled kernels; the last close
 * destroys it. Options that shape the server (the CPU threads, the cache
 * directory) are settled by the first open: a later open that asks for
 * others is refused rather than silently given the first one's.
 *
 * Locks: registry_lock (the list of open devices, the client counts) comes
 * before every other lock of cubert: a backend's open and destroy run
 * under it, so that a device is never opened twice at once.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "core/client_internal.h"
#include "core/config.h"
#include "cubert/device.h"

static cube_mutex registry_lock = CUBE_MUTEX_INIT;
static core_device *open_devices CUBE_GUARDED_BY(registry_lock);

cube_error *core_device_parse(const char *device, const char *fn,
                              const cube_backend **backend, uint32_t *index)
{
    const char *colon = strchr(device, ':');
    size_t n = colon ? (size_t)(colon - device) : strlen(device);
    char name[32];
    if (n == 0 || n >= sizeof name)
        return cube_error_new(CUBE_ERR_INVALID_ARGUMENT,
                              "%s: device '%s' is malformed (expected a "
                              "backend name, or name:index as in 'cpu:0')",
                              fn, device);
    memcpy(name, device, n);
    name[n] = '\0';
    *index = 0;
    if (colon) {
        char *end;
        errno = 0;
        unsigned long v = strtoul(colon + 1, &end, 10);
        /* Digits only: strtoul would also take " 1", "+1" and "-1". */
        if (errno || *end || end == colon + 1 || v > 1024 || colon[1] < '0' ||
            colon[1] > '9')
            return cube_error_new(CUBE_ERR_INVALID_ARGUMENT,
                                  "%s: device index in '%s' is not a number "
                                  "in 0..1024",
                                  fn, device);
        *index = (uint32_t)v;
    }
    *backend = core_backend_find(name);
    if (!*backend) {
        if (core_backend_left_out(name))
            return cube_error_new(CUBE_ERR_UNAVAILABLE,
                                  "%s: the %s backend is not part of this "
                                  "build of cubert",
                                  fn, name);
        return cube_error_new(CUBE_ERR_NOT_FOUND, "%s: no backend named '%s'",
                              fn, name);
    }
    uint32_t devices = 0;
    cube_error *err = (*backend)->device_count(&devices);
    if (err)
        return cube_error_prefix(err, "%s(%s)", fn, device);
    if (*index >= devices)
        return cube_error_new(CUBE_ERR_NOT_FOUND,
                              "%s: %s has %u device(s); index %u does not "
                              "exist",
                              fn, name, devices, *index);
    return NULL;
}

static core_device *find_open(const cube_backend *backend, uint32_t index)
    CUBE_REQUIRES(registry_lock)
{
    for (core_device *d = open_devices; d; d = d->next)
        if (d->backend == backend && d->index == index)
            return d;
    return NULL;
}

/* Takes `d` out of the list (no later open finds it); its clients keep
 * it until the last one closes. */
static void unlink_device(core_device *d) CUBE_REQUIRES(registry_lock)
{
    for (core_device **p = &open_devices; *p; p = &(*p)->next)
        if (*p == d) {
            *p = d->next;
            break;
        }
    d->next = NULL;
}

/* CUBE_ERR_INVALID_ARGUMENT when `asked` sets an option that the open
 * device `d` was opened without. */
static cube_error *check_options(const core_device *d,
                                 const cube_client_options *asked)
{
    if (d->backend->uses_cpu_threads && asked->cpu_threads &&
        asked->cpu_threads != d->cpu_threads)
        return cube_error_new(
            CUBE_ERR_INVALID_ARGUMENT,
            "cube_client_open(%s): the device is already open in this "
            "process with cpu_threads %u%s and a device has one server per "
            "process; this open asks for %u (leave cpu_threads 0 to share "
            "the open device's, or close its clients first)",
            d->name, d->cpu_threads, d->cpu_threads ? "" : " (the default)",
            asked->cpu_threads);
    if (asked->cache_dir &&
        (!d->cache_dir || strcmp(asked->cache_dir, d->cache_dir) != 0))
        return cube_error_new(
            CUBE_ERR_INVALID_ARGUMENT,
            "cube_client_open(%s): the device is already open in this "
            "process with cache_dir '%s' and a device has one server per "
            "process; this open asks for '%s' (leave cache_dir NULL to "
            "share the open device's, or close its clients first)",
            d->name, d->cache_dir ? d->cache_dir : "(the default)",
            asked->cache_dir);
    return NULL;
}

static void device_free(core_device *d)
{
    cube_error_free(d->fault);
    cube_mutex_destroy(&d->fault_lock);
    cube_mutex_destroy(&d->streams_lock);
    cube_mutex_destroy(&d->cache_lock);
    pthread_cond_destroy(&d->cache_cv);
    free(d->cache_dir);
    free(d);
}

/* Opens the server of a device no client has open. */
static cube_error *device_open(const cube_backend *backend, uint32_t index,
                               const cube_client_options *opts,
                               core_device **out)
{
    core_device *d = calloc(1, sizeof *d);
    if (!d)
        return cube_error_new(CUBE_ERR_OUT_OF_MEMORY, "cube_client_open");
    d->backend = backend;
    d->index = index;
    snprintf(d->name, sizeof d->name, "%s:%u", backend->name, index);
    d->cpu_threads = opts->cpu_threads;
    cube_mutex_init(&d->fault_lock);
    cube_mutex_init(&d->streams_lock);
    cube_mutex_init(&d->cache_lock);
    pthread_cond_init(&d->cache_cv, NULL);
    atomic_init(&d->faulted, 0);
    d->stats = cube_log_enabled(CUBE_LOG_INFO);
    if (opts->cache_dir && !(d->cache_dir = strdup(opts->cache_dir))) {
        device_free(d);
        return cube_error_new(CUBE_ERR_OUT_OF_MEMORY, "cube_client_open");
    }
    cube_error *err = backend->open(index, opts, &d->server);
    if (err) {
        device_free(d);
        return err;
    }
    d->vt = d->server->vt;
    d->server->device = d;
    err = d->vt->properties(d->server, &d->props);
    if (!err && backend->comm)
        d->props.features |= CUBE_FEATURE_COLLECTIVES; /* the core's to say */
    if (err) {
        d->vt->destroy(d->server);
        device_free(d);
        return err;
    }
    *out = d;
    return NULL;
}

cube_error *core_device_acquire(const cube_backend *backend, uint32_t index,
                                const cube_client_options *opts,
                                const cube_client_options *asked,
                                core_device **out)
{
    cube_error *err = NULL;
    cube_mutex_lock(&registry_lock);
    core_device *d = find_open(backend, index);
    if (d && atomic_load_explicit(&d->faulted, memory_order_acquire)) {
        /* A device fault is terminal for the clients that saw it, not for
         * the process: a new open gets a new server while they close. */
        unlink_device(d);
        d = NULL;
    }
    if (d) {
        err = check_options(d, asked);
    } else {
        d = NULL;
        err = device_open(backend, index, opts, &d);
        if (!err) {
            d->next = open_devices;
            open_devices = d;
        }
    }
    if (!err && d) {
        d->clients++;
        *out = d;
    }
    cube_mutex_unlock(&registry_lock);
    return err;
}

void core_device_release(core_device *d)
{
    cube_mutex_lock(&registry_lock);
    if (--d->clients > 0) {
        cube_mutex_unlock(&registry_lock);
        return;
    }
    unlink_device(d);
    /* Torn down under the lock: an open of the same device waits for the
     * old server to be gone (a driver may allow one context per device
     * and process). Every client of it has closed, so nothing else
     * reaches its streams. */
    core_cache_log_summary(d);
    core_cache_destroy(d);
    core_streams_destroy(d);
    d->vt->destroy(d->server);
    cube_mutex_unlock(&registry_lock);
    device_free(d);
}

/* --- the public device list --- */

cube_error *cube_device_count(const char *backend, uint32_t *out)
{
    if (!backend || !out)
        return cube_error_null_argument("cube_device_count",
                                        backend ? "out" : "backend");
    *out = 0;
    const cube_backend *b = core_backend_find(backend);
    if (!b) {
        if (core_backend_left_out(backend))
            return cube_error_new(CUBE_ERR_UNAVAILABLE,
                                  "cube_device_count: the %s backend is not "
                                  "part of this build of cubert",
                                  backend);
        return cube_error_new(CUBE_ERR_NOT_FOUND,
                              "cube_device_count: no backend named '%s'",
                              backend);
    }
    cube_error *err = b->device_count(out);
    return err ? cube_error_prefix(err, "cube_device_count(%s)", backend)
               : NULL;
}

cube_error *cube_device_describe(const char *device, cube_device_info *out)
{
    if (!device || !out)
        return cube_error_null_argument("cube_device_describe",
                                        device ? "out" : "device");
    memset(out, 0, sizeof *out);
    const cube_backend *b = NULL;
    uint32_t index = 0;
    cube_error *err =
        core_device_parse(device, "cube_device_describe", &b, &index);
    if (err || !b)
        return err;
    snprintf(out->device, sizeof out->device, "%s:%u", b->name, index);
    out->index = index;
    cube_mutex_lock(&registry_lock);
    core_device *d = find_open(b, index);
    if (d) {
        /* An open device is described by its server. */
        out->properties = d->props;
        out->clients = d->clients;
    }
    cube_mutex_unlock(&registry_lock);
    if (d)
        return NULL;
    const core_config *cfg = core_config_get();
    cube_client_options opts = cube_client_options_default();
    opts.cpu_threads = cfg->cpu_threads;
    err = b->device_properties(index, &opts, &out->properties);
    if (!err && b->comm)
        out->properties.features |= CUBE_FEATURE_COLLECTIVES;
    return err ? cube_error_prefix(err, "cube_device_describe(%s)", device)
               : NULL;
}

cube_error *cube_client_device(cube_client *c, cube_device_info *out)
{
    if (!c || !out)
        return cube_error_null_argument("cube_client_device",
                                        c ? "out" : "client");
    memset(out, 0, sizeof *out);
    core_device *d = c->dev;
    snprintf(out->device, sizeof out->device, "%s", d->name);
    out->index = d->index;
    out->properties = d->props;
    cube_mutex_lock(&registry_lock);
    out->clients = d->clients;
    cube_mutex_unlock(&registry_lock);
    return NULL;
}
