/* The OpenCL backend: finding devices, a device's properties, opening and
 * destroying the server, the vtable and the backend's entry for the
 * registry. opencl_internal.h describes the design. */
#include <ctype.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/common/library.h"
#include "backends/common/properties.h"
#include "backends/opencl/opencl_internal.h"
#include "cubert/backend/config.h"
#include "cubert/log.h"

const cube_config_key opencl_config_keys[] = {
    LIBRARY_CONFIG_KEY("opencl_library", "libOpenCL.so.1, else libOpenCL.so",
                       "the OpenCL ICD loader to load"),
    {.name = "opencl_platform",
     .type = CUBE_CONFIG_TEXT,
     .max_len = 128,
     .default_text = "every platform",
     .doc = "only the OpenCL platforms whose name or vendor contains this "
            "text, case ignored (pocl, nvidia, intel, ...)"},
    {.name = NULL}};

/* --- errors and faults --- */

static cube_error *fail_v(cl_int r, cube_code code, const char *fmt, va_list ap)
    CUBE_PRINTF(3, 0);
static cube_error *fail_v(cl_int r, cube_code code, const char *fmt, va_list ap)
{
    char what[512];
    vsnprintf(what, sizeof what, fmt, ap);
    if (r == CL_OUT_OF_HOST_MEMORY || r == CL_MEM_OBJECT_ALLOCATION_FAILURE ||
        r == CL_OUT_OF_RESOURCES)
        code = CUBE_ERR_OUT_OF_MEMORY;
    return cube_error_new(code, "%s: %s (%d)", what, opencl_error_name(r),
                          (int)r);
}

cube_error *opencl_fail(cl_int r, cube_code code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    cube_error *err = fail_v(r, code, fmt, ap);
    va_end(ap);
    return err;
}

cube_error *opencl_fault_check(opencl_server *s)
{
    if (!atomic_load_explicit(&s->faulted, memory_order_acquire))
        return NULL;
    return cube_error_new(CUBE_ERR_DEVICE_FAULT, "opencl device %u: %s",
                          s->index, s->fault);
}

void opencl_fault_set(opencl_server *s, const char *why)
{
    /* The first reason stays: later ones follow from it. */
    int expected = 0;
    if (!atomic_compare_exchange_strong(&s->fault_claimed, &expected, 1))
        return;
    snprintf(s->fault, sizeof s->fault, "%s", why);
    atomic_store_explicit(&s->faulted, 1, memory_order_release);
    cube_log_write(CUBE_LOG_ERROR, "opencl", "device %u broke: %s", s->index,
                   why);
}

/* --- finding devices --- */

/* Every device of every platform the loader lists (those the
 * opencl_platform key names), in the loader's order of platforms and
 * each platform's order of devices: opencl:0, opencl:1, ... Found once
 * per process, as the CUDA driver counts its devices once. */
#define OPENCL_MAX_DEVICES 64
typedef struct opencl_found {
    cl_platform_id platform;
    cl_device_id device;
} opencl_found;

static struct {
    opencl_found at[OPENCL_MAX_DEVICES];
    uint32_t count;
    char why[512]; /* set when there are none */
} found;
static pthread_once_t found_once = PTHREAD_ONCE_INIT;

static int contains_folded(const char *text, const char *needle)
{
    size_t n = strlen(needle);
    for (const char *t = text; *t; t++) {
        size_t i = 0;
        while (i < n && t[i] &&
               tolower((unsigned char)t[i]) ==
                   tolower((unsigned char)needle[i]))
            i++;
        if (i == n)
            return 1;
    }
    return n == 0;
}

/* A text query of a platform or a device (an empty string when it
 * fails), NUL-terminated within `cap`. */
static void info_text(const opencl_api *a, cl_platform_id p, cl_device_id d,
                      cl_uint what, char *out, size_t cap)
{
    cl_int r = p ? a->clGetPlatformInfo(p, what, cap, out, NULL)
                 : a->clGetDeviceInfo(d, what, cap, out, NULL);
    if (r != CL_SUCCESS)
        out[0] = 0;
    out[cap - 1] = 0;
}

static void platform_text(const opencl_api *a, cl_platform_id p,
                          cl_platform_info what, char *out, size_t cap)
{
    info_text(a, p, NULL, what, out, cap);
}

static void find_devices(void)
{
    const opencl_api *a = NULL;
    cube_error *err = opencl_api_load(&a);
    if (err) {
        snprintf(found.why, sizeof found.why, "%s", cube_error_message(err));
        cube_error_free(err);
        return;
    }
    cl_platform_id platforms[16];
    cl_uint np = 0;
    cl_int r = a->clGetPlatformIDs(16, platforms, &np);
    if (r != CL_SUCCESS || np == 0) {
        snprintf(found.why, sizeof found.why,
                 "the OpenCL loader %s lists no platform (%s): is a driver "
                 "installed (pocl-opencl-icd, an /etc/OpenCL/vendors "
                 "entry)?",
                 a->loader_path, opencl_error_name(r));
        return;
    }
    if (np > 16)
        np = 16;
    cube_config_value want;
    cube_config_lookup("opencl_platform", &want);
    const char *only = want.text ? want.text : "";
    for (cl_uint i = 0; i < np; i++) {
        char name[256], vendor[256];
        platform_text(a, platforms[i], CL_PLATFORM_NAME, name, sizeof name);
        platform_text(a, platforms[i], CL_PLATFORM_VENDOR, vendor,
                      sizeof vendor);
        if (!contains_folded(name, only) && !contains_folded(vendor, only))
            continue;
        cl_device_id devices[OPENCL_MAX_DEVICES];
        cl_uint nd = 0;
        if (a->clGetDeviceIDs(platforms[i], CL_DEVICE_TYPE_ALL,
                              OPENCL_MAX_DEVICES, devices, &nd) != CL_SUCCESS)
            continue;
        for (cl_uint d = 0; d < nd && d < OPENCL_MAX_DEVICES &&
                            found.count < OPENCL_MAX_DEVICES;
             d++) {
            found.at[found.count].platform = platforms[i];
            found.at[found.count].device = devices[d];
            found.count++;
        }
    }
    if (!found.count)
        snprintf(found.why, sizeof found.why,
                 "no OpenCL device%s%s%s among %u platform%s",
                 *only ? " on a platform named '" : "", only,
                 *only ? "' (opencl_platform)" : "", (unsigned)np,
                 np == 1 ? "" : "s");
}

static cube_error *opencl_device_count(uint32_t *out)
{
    pthread_once(&found_once, find_devices);
    *out = found.count;
    if (!found.count)
        return cube_error_new(CUBE_ERR_UNAVAILABLE, "%s", found.why);
    return NULL;
}

/* --- properties --- */

static void device_text(const opencl_api *a, cl_device_id d,
                        cl_device_info what, char *out, size_t cap)
{
    info_text(a, NULL, d, what, out, cap);
}

static uint64_t device_number(const opencl_api *a, cl_device_id d,
                              cl_device_info what, size_t size)
{
    uint64_t v = 0;
    if (size == 4) {
        cl_uint u = 0;
        a->clGetDeviceInfo(d, what, 4, &u, NULL);
        v = u;
    } else {
        a->clGetDeviceInfo(d, what, size, &v, NULL);
    }
    return v;
}

/* Whether the device's extension list names `ext` as a whole word. */
static int has_extension(const char *list, const char *ext)
{
    size_t n = strlen(ext);
    for (const char *p = strstr(list, ext); p; p = strstr(p + 1, ext))
        if ((p == list || p[-1] == ' ') && (p[n] == ' ' || p[n] == 0))
            return 1;
    return 0;
}

/* Fills the server's description of its device (needs only s->api,
 * s->platform, s->device). */
static void describe(opencl_server *s)
{
    const opencl_api *a = s->api;
    cube_properties *p = &s->props;
    uint64_t total = device_number(a, s->device, CL_DEVICE_GLOBAL_MEM_SIZE, 8);
    uint64_t align_bits =
        device_number(a, s->device, CL_DEVICE_MEM_BASE_ADDR_ALIGN, 4);
    uint64_t align = OPENCL_MIN_ALIGNMENT;
    while (align * 8 < align_bits)
        align *= 2;
    properties_defaults(p, "opencl", total, align);
    char name[256], vendor[128];
    device_text(a, s->device, CL_DEVICE_NAME, name, sizeof name);
    platform_text(a, s->platform, CL_PLATFORM_NAME, s->platform_name,
                  sizeof s->platform_name);
    platform_text(a, s->platform, CL_PLATFORM_VENDOR, vendor, sizeof vendor);
    snprintf(p->name, sizeof p->name, "%.80s (%.40s)", name, s->platform_name);
    device_text(a, s->device, CL_DRIVER_VERSION, s->driver_version,
                sizeof s->driver_version);
    device_text(a, s->device, CL_DEVICE_OPENCL_C_VERSION, s->c_version,
                sizeof s->c_version);
    snprintf(p->architecture, sizeof p->architecture, "%s", s->c_version);
    size_t sizes[3] = {1, 1, 1};
    a->clGetDeviceInfo(s->device, CL_DEVICE_MAX_WORK_ITEM_SIZES, sizeof sizes,
                       sizes, NULL);
    for (int i = 0; i < 3; i++)
        p->max_cube_dim[i] =
            sizes[i] > UINT32_MAX ? UINT32_MAX : (uint32_t)sizes[i];
    size_t group = 1;
    a->clGetDeviceInfo(s->device, CL_DEVICE_MAX_WORK_GROUP_SIZE, sizeof group,
                       &group, NULL);
    p->max_units_per_cube = group > UINT32_MAX ? UINT32_MAX : (uint32_t)group;
    /* Global sizes are size_t: count * dim must fit, which 65535 along
     * each axis keeps far from. */
    p->max_cube_count[0] = UINT32_MAX;
    p->max_shared_memory =
        device_number(a, s->device, CL_DEVICE_LOCAL_MEM_SIZE, 8);
    /* A buffer lives in one page, one cl_mem. */
    uint64_t max_alloc =
        device_number(a, s->device, CL_DEVICE_MAX_MEM_ALLOC_SIZE, 8);
    if (max_alloc && max_alloc < total)
        p->max_buffer_size = max_alloc;
    p->compute_units =
        (uint32_t)device_number(a, s->device, CL_DEVICE_MAX_COMPUTE_UNITS, 4);
    char *ext = malloc(16384);
    if (ext) {
        device_text(a, s->device, CL_DEVICE_EXTENSIONS, ext, 16384);
        s->fp64 = has_extension(ext, "cl_khr_fp64");
        s->int64_atomics = has_extension(ext, "cl_khr_int64_base_atomics") &&
                           has_extension(ext, "cl_khr_int64_extended_atomics");
        free(ext);
    }
    p->features = PROPERTIES_CUBE_C_FEATURES;
    if (!s->fp64)
        p->features &= ~(uint32_t)CUBE_FEATURE_F64;
    p->timing = CUBE_TIMING_DEVICE;
}

static cube_error *opencl_properties(cube_server *server, cube_properties *out)
{
    *out = ((opencl_server *)server)->props;
    return NULL;
}

/* --- lifetime --- */

static void opencl_destroy(cube_server *server)
{
    opencl_server *s = (opencl_server *)server;
    const opencl_api *a = s->api;
    for (uint32_t c = 0; c < OPENCL_PAGE_CHUNKS; c++) {
        opencl_page *chunk = atomic_load(&s->chunks[c]);
        if (!chunk)
            continue;
        /* Every page went back through the storage's free before this;
         * what is left is a leak of the manager's, released anyway. */
        for (uint32_t i = 0; i < OPENCL_CHUNK_PAGES; i++)
            if (chunk[i].mem)
                a->clReleaseMemObject(chunk[i].mem);
        free(chunk);
    }
    if (s->trap)
        a->clReleaseMemObject(s->trap);
    if (s->context)
        a->clReleaseContext(s->context);
    disk_cache_close(s->cache);
    free(s->page_free);
    cube_mutex_destroy(&s->pages_lock);
    free(s);
}

static const cube_server_vtable opencl_vtable = {
    .name = "opencl",
    .destroy = opencl_destroy,
    .properties = opencl_properties,
    .stream_open = opencl_stream_open,
    .stream_close = opencl_stream_close,
    .read = opencl_read,
    .write = opencl_write,
    .sync = opencl_sync,
    .compile = opencl_compile,
    .compiled_release = opencl_compiled_release,
    .launch = opencl_launch,
    .flush = opencl_flush,
    .start_profile = opencl_start_profile,
    .end_profile = opencl_end_profile,
    .abandon_profile = opencl_abandon_profile,
    .native_stream = opencl_native_stream,
    .wrap_memory = opencl_wrap_memory,
    .native_wait = opencl_native_wait,
};

/* The server of device `index`, described but not opened (no context).
 * Errors: CUBE_ERR_UNAVAILABLE, CUBE_ERR_NOT_FOUND, CUBE_ERR_OUT_OF_MEMORY. */
static cube_error *server_new(uint32_t index, opencl_server **out)
{
    *out = NULL;
    uint32_t count = 0;
    cube_error *err = opencl_device_count(&count);
    if (err)
        return err;
    if (index >= count)
        return cube_error_new(CUBE_ERR_NOT_FOUND,
                              "there is no OpenCL device %u (this machine "
                              "has %u)",
                              index, count);
    opencl_server *s = calloc(1, sizeof *s);
    if (!s)
        return cube_error_new(CUBE_ERR_OUT_OF_MEMORY, "opencl server");
    err = opencl_api_load(&s->api);
    if (err) {
        free(s);
        return err;
    }
    s->base.vt = &opencl_vtable;
    s->index = index;
    s->platform = found.at[index].platform;
    s->device = found.at[index].device;
    cube_mutex_init(&s->pages_lock);
    describe(s);
    *out = s;
    return NULL;
}

static cube_error *opencl_open(uint32_t index,
                               const cube_client_options *options,
                               cube_server **out)
{
    *out = NULL;
    opencl_server *s = NULL;
    cube_error *err = server_new(index, &s);
    if (err)
        return err;
    if (!s)
        return cube_error_new(CUBE_ERR_INTERNAL, "opencl server");
    const opencl_api *a = s->api;
    cl_context_properties cprops[] = {CL_CONTEXT_PLATFORM,
                                      (cl_context_properties)s->platform, 0};
    cl_int r = CL_SUCCESS;
    s->context = a->clCreateContext(cprops, 1, &s->device, NULL, NULL, &r);
    if (!s->context)
        err = opencl_fail(r, CUBE_ERR_UNAVAILABLE,
                          "cannot create a context on OpenCL device %u (%s)",
                          index, s->props.name);
    if (!err) {
        cl_uint zero = 0;
        s->trap = a->clCreateBuffer(s->context,
                                    CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR,
                                    sizeof zero, &zero, &r);
        if (!s->trap)
            err = opencl_fail(r, CUBE_ERR_UNAVAILABLE,
                              "OpenCL device %u: the trap word", index);
    }
    if (!err) {
        const char *dir = options->cache_dir;
        char path[1100];
        if (dir && *dir) {
            snprintf(path, sizeof path, "%s/opencl", dir);
            dir = path;
        }
        err = disk_cache_open(dir, "opencl", ".clbin", "cubert-opencl-1",
                              &s->cache);
    }
    if (err) {
        opencl_destroy(&s->base);
        return err;
    }
    cube_log_write(CUBE_LOG_INFO, "opencl",
                   "opened %s: %s, driver %s, %u compute units, %llu MiB",
                   s->props.name, s->c_version, s->driver_version,
                   s->props.compute_units,
                   (unsigned long long)(s->props.memory_total >> 20));
    *out = &s->base;
    return NULL;
}

static cube_error *opencl_device_properties(uint32_t index,
                                            const cube_client_options *options,
                                            cube_properties *out)
{
    (void)options;
    opencl_server *s = NULL;
    cube_error *err = server_new(index, &s);
    if (err)
        return err;
    if (!s)
        return cube_error_new(CUBE_ERR_INTERNAL, "opencl server");
    *out = s->props;
    cube_mutex_destroy(&s->pages_lock);
    free(s);
    return NULL;
}

/* No communicators yet: collectives answer CUBE_ERR_UNSUPPORTED, and
 * cube_copy_peer goes through the host. */
const cube_backend cube_backend_opencl = {
    "opencl",     opencl_device_count,
    opencl_open,  .device_properties = opencl_device_properties,
    .comm = NULL, .config_keys = opencl_config_keys};
