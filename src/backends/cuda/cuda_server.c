/* The CUDA backend: a device's properties, opening and destroying the
 * server, the vtable and the backend's entry for the registry.
 * cuda_internal.h describes the design and the order of the files. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/common/properties.h"
#include "backends/cuda/cuda_internal.h"
#include "base/error.h"
#include "cubert/log.h"

/* --- properties --- */

static int attr(cuda_server *s, int which)
{
    int v = 0;
    s->api->cuDeviceGetAttribute(&v, which, s->device);
    return v;
}

static cube_error *fill_properties(cuda_server *s)
{
    const cuda_api *a = s->api;
    cube_properties *p = &s->props;
    size_t total = 0;
    CUresult r = a->cuDeviceTotalMem(&total, s->device);
    if (r != CUDA_SUCCESS)
        return cuda_fail(s, r, CUBE_ERR_UNAVAILABLE,
                         "cannot read the device's memory size");
    properties_defaults(p, "cuda", total, CUDA_ALIGNMENT);
    char name[128] = "";
    a->cuDeviceGetName(name, (int)sizeof name, s->device);
    snprintf(p->name, sizeof p->name, "%s", name);
    s->arch_major = attr(s, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR);
    s->arch_minor = attr(s, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR);
    snprintf(p->architecture, sizeof p->architecture, "sm_%d%d", s->arch_major,
             s->arch_minor);
    p->max_cube_dim[0] = (uint32_t)attr(s, CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X);
    p->max_cube_dim[1] = (uint32_t)attr(s, CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y);
    p->max_cube_dim[2] = (uint32_t)attr(s, CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z);
    p->max_units_per_cube =
        (uint32_t)attr(s, CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK);
    p->max_cube_count[0] =
        (uint32_t)attr(s, CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X);
    p->max_cube_count[1] =
        (uint32_t)attr(s, CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y);
    p->max_cube_count[2] =
        (uint32_t)attr(s, CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z);
    s->optin_shared =
        attr(s, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN);
    int plain = attr(s, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK);
    if (s->optin_shared < plain)
        s->optin_shared = plain;
    p->max_shared_memory = (uint64_t)s->optin_shared;
    p->compute_units =
        (uint32_t)attr(s, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT);
    p->features = PROPERTIES_CUBE_C_FEATURES | CUBE_FEATURE_PINNED_STAGING;
    p->timing = CUBE_TIMING_DEVICE;
    return NULL;
}

static cube_error *cuda_properties(cube_server *server, cube_properties *out)
{
    *out = ((cuda_server *)server)->props;
    return NULL;
}

/* --- lifetime --- */

static void cuda_destroy(cube_server *server)
{
    cuda_server *s = (cuda_server *)server;
    if (s->ctx) {
        cube_error_ignore(cuda_enter(s), "destroying the server goes on "
                                         "without its context");
        /* The client drained and closed every stream before this; what
         * is left deferred is pinned memory. */
        atomic_store(&s->captures, 0);
        cuda_free_deferred(s, 1);
        cuda_pinned_destroy(s);
        cuda_events_destroy(s);
        s->api->cuDevicePrimaryCtxRelease(s->device);
    }
    for (size_t i = 0; i < s->slab_count; i++)
        free(s->slabs[i]);
    free(s->slabs);
    disk_cache_close(s->cache);
    cube_mutex_destroy(&s->blocks_lock);
    cube_mutex_destroy(&s->staging_lock);
    cube_mutex_destroy(&s->events_lock);
    cube_mutex_destroy(&s->deferred_lock);
    pthread_cond_destroy(&s->frees_idle);
    free(s->deferred);
    free(s);
}

static const cube_server_vtable cuda_vtable = {
    .name = "cuda",
    .destroy = cuda_destroy,
    .properties = cuda_properties,
    .stream_open = cuda_stream_open,
    .stream_close = cuda_stream_close,
    .initialize_memory = cuda_initialize_memory,
    .release_memory = cuda_release_memory,
    .memory_reclaim = cuda_memory_reclaim,
    .read = cuda_read,
    .read_wait = cuda_read_wait,
    .read_poll = cuda_read_poll,
    .write = cuda_write,
    .sync = cuda_sync,
    .compile = cuda_compile,
    .compiled_release = cuda_compiled_release,
    .launch = cuda_launch,
    .flush = cuda_flush,
    .staging = cuda_staging,
    .staging_free = cuda_staging_free,
    .begin_capture = cuda_begin_capture,
    .end_capture = cuda_end_capture,
    .replay = cuda_replay,
    .graph_destroy = cuda_graph_destroy,
    .start_profile = cuda_start_profile,
    .end_profile = cuda_end_profile,
    .abandon_profile = cuda_abandon_profile,
    .copy_to_peer = cuda_copy_to_peer,
    .native_stream = cuda_native_stream,
    .wrap_memory = cuda_wrap_memory,
    .unwrap_memory = cuda_unwrap_memory,
    .native_written = cuda_native_written,
    .native_ready = cuda_native_ready,
    .native_wait = cuda_native_wait,
};

static cube_error *cuda_device_count(uint32_t *out)
{
    *out = 0;
    const cuda_api *a = NULL;
    cube_error *err = cuda_api_load(&a);
    if (err)
        return err;
    int n = 0;
    CUresult r = a->cuDeviceGetCount(&n);
    if (r != CUDA_SUCCESS)
        return cuda_error(a, r, CUBE_ERR_UNAVAILABLE,
                          "cannot count CUDA devices");
    *out = (uint32_t)n;
    return NULL;
}

/* The device `index` as s->device, and its properties in s->props (needs
 * only s->api). Errors: CUBE_ERR_UNAVAILABLE, a driver error. */
static cube_error *describe_device(cuda_server *s, uint32_t index)
{
    CUresult r = s->api->cuDeviceGet(&s->device, (int)index);
    if (r != CUDA_SUCCESS)
        return cuda_error(s->api, r, CUBE_ERR_UNAVAILABLE,
                          "cannot open CUDA device %u", index);
    return fill_properties(s);
}

static cube_error *cuda_open(uint32_t index, const cube_client_options *options,
                             cube_server **out)
{
    *out = NULL;
    const cuda_api *a = NULL;
    cube_error *err = cuda_api_load(&a);
    if (err)
        return err;
    int count = 0;
    a->cuDeviceGetCount(&count);
    if (index >= (uint32_t)count)
        return cube_error_new(CUBE_ERR_NOT_FOUND,
                              "there is no CUDA device %u (this machine has "
                              "%d)",
                              index, count);
    cuda_server *s = calloc(1, sizeof *s);
    if (!s)
        return cube_error_new(CUBE_ERR_OUT_OF_MEMORY, "cuda server");
    s->base.vt = &cuda_vtable;
    s->api = a;
    s->ordinal = (int)index;
    static atomic_uint_fast64_t next_serial = 1;
    s->serial = atomic_fetch_add(&next_serial, 1);
    cube_mutex_init(&s->blocks_lock);
    cube_mutex_init(&s->staging_lock);
    cube_mutex_init(&s->events_lock);
    cube_mutex_init(&s->deferred_lock);
    pthread_cond_init(&s->frees_idle, NULL);
    err = describe_device(s, index);
    if (!err)
        err = cuda_context_create(s);
    if (!err)
        err = cuda_pinned_create(s);
    if (!err)
        cuda_vm_setup(s);
    if (!err) {
        const char *dir = options->cache_dir;
        char path[1100];
        if (dir && *dir) {
            snprintf(path, sizeof path, "%s/cuda", dir);
            dir = path;
        }
        err =
            disk_cache_open(dir, "cuda", ".cubin", "cubert-cuda-2", &s->cache);
    }
    if (err) {
        cuda_destroy(&s->base);
        return err;
    }
    cube_log_write(CUBE_LOG_INFO, "cuda",
                   "opened %s (%s, %u multiprocessors, %llu MiB), driver %d, "
                   "NVRTC %d.%d",
                   s->props.name, s->props.architecture, s->props.compute_units,
                   (unsigned long long)(s->props.memory_total >> 20),
                   a->driver_version, a->nvrtc_major, a->nvrtc_minor);
    *out = &s->base;
    return NULL;
}

/* device_properties: the driver's attributes of device `index`, read
 * without a context (cube_device_describe). */
static cube_error *cuda_device_properties(uint32_t index,
                                          const cube_client_options *options,
                                          cube_properties *out)
{
    (void)options;
    const cuda_api *a = NULL;
    cube_error *err = cuda_api_load(&a);
    if (err)
        return err;
    /* fill_properties reads through a server; this one opens nothing. */
    cuda_server *s = calloc(1, sizeof *s);
    if (!s)
        return cube_error_new(CUBE_ERR_OUT_OF_MEMORY, "cuda device");
    s->api = a;
    err = describe_device(s, index);
    if (!err)
        *out = s->props;
    free(s);
    return err;
}

const cube_backend cube_backend_cuda = {"cuda",
                                        cuda_device_count,
                                        cuda_open,
                                        .device_properties =
                                            cuda_device_properties,
                                        .comm = &cuda_comm_vtable,
                                        .config_keys = cuda_config_keys};
