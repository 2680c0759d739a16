/* The null backend: the smallest server that keeps the contract, and the
 * template a new backend starts from (README.md in this folder walks
 * through it).
 *
 * Its "device" is host memory and it runs no kernels: buffers, copies,
 * barriers, the failure store, streams, memory reports and profiling
 * windows all work, while every launch fails at compile with
 * CUBE_ERR_UNSUPPORTED. Each operation is done when its call returns, so
 * there is never anything to wait for.
 *
 * Every slot the client requires is filled; every optional slot is left
 * NULL so the client applies the contract's default (server.h says which,
 * and what the default is). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cubert/backend/errors.h"
#include "cubert/backend/server.h"

/* Every buffer's address is a multiple of this: a cache line, enough for
 * any element type a copy descriptor allows (at most 64 bytes). */
#define NULL_ALIGNMENT 64

/* The server object. A real backend keeps its device handle, its compiler
 * and its queues' shared state here; the null backend only needs the
 * answer to `properties`, computed once when it opens. */
typedef struct null_server {
    cube_server base; /* first: the client reaches the vtable through it */
    cube_properties props;
} null_server;

/* --- properties --- */

/* The host's memory, so that buffer limits mean the same as on the CPU
 * backend; a fixed 4 GiB where the system does not say. */
static uint64_t host_memory(void)
{
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    if (pages > 0 && page > 0)
        return (uint64_t)pages * (uint64_t)page;
    return (uint64_t)1 << 32;
}

/* Filled once at open: the client asks once and keeps the answer, so
 * properties never needs to reach a device. The kernel limits are the
 * smallest the client accepts (one unit, no shared memory) and no feature
 * bit is set: without CUBE_FEATURE_KERNELS callers know not to launch. The
 * cube count limits are wide so that a launch is not refused before it
 * reaches compile, which says why no kernel runs here. */
static void fill_properties(null_server *s)
{
    cube_properties *p = &s->props;
    memset(p, 0, sizeof *p);
    snprintf(p->backend, sizeof p->backend, "null");
    snprintf(p->name, sizeof p->name, "null device (host memory, no kernels)");
    snprintf(p->architecture, sizeof p->architecture, "host");
    for (int i = 0; i < 3; i++)
        p->max_cube_dim[i] = 1;
    p->max_units_per_cube = 1;
    p->max_cube_count[0] = UINT32_MAX;
    p->max_cube_count[1] = 65535;
    p->max_cube_count[2] = 65535;
    p->max_shared_memory = 0;
    p->memory_total = host_memory();
    p->memory_alignment = NULL_ALIGNMENT;
    p->max_buffer_size = p->memory_total;
    p->compute_units = 1;
    p->features = 0;
    p->timing = CUBE_TIMING_HOST_CLOCK;
}

/* DeviceService's facts: a copy of what open computed. */
static cube_error *null_properties(cube_server *server, cube_properties *out)
{
    *out = ((null_server *)server)->props;
    return NULL;
}

/* --- streams and their storage ---
 *
 * The client owns each stream's memory manager; a backend only says where
 * the manager's pages come from. Here that is the C heap. */

/* The storage's alloc: one aligned block of host memory. aligned_alloc
 * wants a size that is a multiple of the alignment, so round up, and
 * refuse a size that cannot be rounded or addressed rather than wrap. */
static cube_error *host_alloc(void *self, uint64_t size, uint64_t align,
                              uint64_t *address)
{
    (void)self;
    uint64_t rounded = (size + align - 1) & ~(align - 1);
    if (rounded < size || rounded > SIZE_MAX)
        return cube_error_new(CUBE_ERR_OUT_OF_MEMORY,
                              "null backend: %llu bytes do not fit the "
                              "address space",
                              (unsigned long long)size);
    void *p = aligned_alloc((size_t)align, (size_t)rounded);
    if (!p)
        return cube_error_new(CUBE_ERR_OUT_OF_MEMORY,
                              "null backend: the host refused %llu bytes",
                              (unsigned long long)size);
    *address = (uint64_t)(uintptr_t)p;
    return NULL;
}

/* The storage's free: the manager hands back exactly what alloc gave. */
static void host_free(void *self, uint64_t address, uint64_t size)
{
    (void)self;
    (void)size;
    free((void *)(uintptr_t)address);
}

/* A stream needs no state of its own here (work is done at call time, so
 * there is no queue), hence stream->impl stays NULL and stream_close is
 * left out. A backend with queues creates one here and frees it in
 * stream_close. */
static cube_error *null_stream_open(cube_server *server,
                                    cube_server_stream *stream,
                                    cube_storage_ops *storage)
{
    (void)stream;
    storage->self = server;
    storage->alloc = host_alloc;
    storage->free = host_free;
    return NULL;
}

/* --- copies --- */

/* Profiling windows are timed on the host clock by the client, from what
 * the backend counts (server.h, cube_server_stream): while a window is
 * open on the stream, the time each read and write takes is added to its
 * busy_ns. */
static uint64_t busy_begin(const cube_server_stream *stream)
{
    if (!stream->profiling)
        return 0;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void busy_end(cube_server_stream *stream, uint64_t t0)
{
    if (t0)
        stream->busy_ns += busy_begin(stream) - t0;
}

/* The host address of a binding's first byte: a buffer's address is a
 * host pointer on this backend. */
static unsigned char *binding_address(const cube_binding *b)
{
    return (unsigned char *)(uintptr_t)b->storage->address + b->offset;
}

/* Moves one op's elements between the binding and packed host memory
 * (`to_host` picks the direction). The client validated the op: rank 1..8,
 * no zero extent, every byte inside the binding, `host` holding op->bytes.
 * A dense op is one memcpy; otherwise an odometer walks the outer indices
 * and each innermost row is copied element by element. */
static void copy_op(const cube_copy_op *op, unsigned char *host, int to_host)
{
    unsigned char *dev = binding_address(&op->binding);
    if (op->contiguous) {
        if (to_host)
            memcpy(host, dev, op->bytes);
        else
            memcpy(dev, host, op->bytes);
        return;
    }
    uint32_t last = op->rank - 1;
    uint64_t es = op->elem_size;
    uint64_t index[CUBE_MAX_RANK] = {0};
    for (;;) {
        uint64_t row = 0;
        for (uint32_t k = 0; k < last; k++)
            row += index[k] * op->byte_strides[k];
        for (uint64_t e = 0; e < op->shape[last]; e++) {
            unsigned char *el = dev + row + e * op->byte_strides[last];
            if (to_host)
                memcpy(host, el, es);
            else
                memcpy(el, host, es);
            host += es;
        }
        int k = (int)last - 1;
        while (k >= 0 && ++index[k] == op->shape[k])
            index[k--] = 0;
        if (k < 0)
            return;
    }
}

/* read: done before returning, so there is never a pending read and the
 * read_wait slot stays NULL. The client has already refused a read of a
 * failed buffer; the backend only copies. */
static cube_error *null_read(cube_server *server, cube_server_stream *stream,
                             const cube_copy_op *ops, size_t n,
                             void *const *dst, cube_pending **pending)
{
    (void)server;
    uint64_t t0 = busy_begin(stream);
    *pending = NULL;
    for (size_t i = 0; i < n; i++)
        copy_op(&ops[i], dst[i], 1);
    busy_end(stream, t0);
    return NULL;
}

/* write: done before returning, so the caller may reuse its host memory
 * at once, as the contract requires. */
static cube_error *null_write(cube_server *server, cube_server_stream *stream,
                              const cube_copy_op *ops, size_t n,
                              const void *const *src)
{
    (void)server;
    uint64_t t0 = busy_begin(stream);
    for (size_t i = 0; i < n; i++)
        copy_op(&ops[i], (unsigned char *)(uintptr_t)src[i], 0);
    busy_end(stream, t0);
    return NULL;
}

/* --- barriers --- */

/* sync: every operation finished in the call that issued it, on whichever
 * stream, and host memory cannot fault; the client adds the failure
 * store's answer. */
static cube_error *null_sync(cube_server *server, cube_server_stream *stream,
                             const cube_binding *bindings, size_t n)
{
    (void)server;
    (void)stream;
    (void)bindings;
    (void)n;
    return NULL;
}

/* flush: nothing is ever queued, and there is no context to break. */
static cube_error *null_flush(cube_server *server, cube_server_stream *stream)
{
    (void)server;
    (void)stream;
    return NULL;
}

/* --- kernels --- */

/* compile: the null backend runs no kernels, and says so. The client
 * records this error on every buffer the launch binds, as for any compile
 * error, so the failure store behaves as on a backend with kernels. */
static cube_error *null_compile(cube_server *server, const cube_kernel *kernel,
                                uint32_t mode, cube_compiled *out)
{
    (void)server;
    (void)mode;
    (void)out;
    return cube_error_new(CUBE_ERR_UNSUPPORTED,
                          "kernel '%s': the null backend runs no kernels "
                          "(open \"cpu\" or \"cuda\" to run it)",
                          cube_kernel_name(kernel));
}

/* compiled_release: the client calls it for every entry of its kernel
 * cache at close, a failed compile's included; there is never anything to
 * free. */
static void null_compiled_release(cube_server *server, cube_compiled *compiled)
{
    (void)server;
    (void)compiled;
}

/* launch: unreachable, since no compile succeeds, but the slot is
 * required; answering UNSUPPORTED keeps it honest should that change. */
static cube_error *null_launch(cube_server *server, cube_server_stream *stream,
                               const cube_dispatch *dispatch)
{
    (void)server;
    (void)stream;
    (void)dispatch;
    return cube_error_new(CUBE_ERR_UNSUPPORTED,
                          "the null backend runs no kernels");
}

/* --- lifetime --- */

/* destroy: the client calls it last, after every stream was drained and
 * closed and all memory went back through host_free. */
static void null_destroy(cube_server *server)
{
    free(server);
}

/* The slots, by name: those not named here are NULL, and the client then
 * applies the contract's default (server.h). */
static const cube_server_vtable null_vtable = {
    .name = "null",
    .destroy = null_destroy,
    .properties = null_properties,
    .stream_open = null_stream_open,
    .read = null_read,
    .write = null_write,
    .sync = null_sync,
    .compile = null_compile,
    .compiled_release = null_compiled_release,
    .launch = null_launch,
    .flush = null_flush,
};

/* One device, always there: the client refuses "null:1" and above with
 * CUBE_ERR_NOT_FOUND before open is called. A backend that cannot run
 * here (no driver, no device) answers CUBE_ERR_UNAVAILABLE with the
 * reason instead. */
static cube_error *null_device_count(uint32_t *out)
{
    *out = 1;
    return NULL;
}

/* open: makes the server for device `index` (always 0 here). The options
 * carry nothing the null backend uses. */
static cube_error *null_open(uint32_t index, const cube_client_options *options,
                             cube_server **out)
{
    (void)index;
    (void)options;
    *out = NULL;
    null_server *s = calloc(1, sizeof *s);
    if (!s)
        return cube_error_new(CUBE_ERR_OUT_OF_MEMORY, "null server");
    s->base.vt = &null_vtable;
    fill_properties(s);
    *out = &s->base;
    return NULL;
}

/* What the registry knows: cmake/backends.cmake's registration promises
 * that this folder defines cube_backend_null, named "null". No
 * configuration keys. */
const cube_backend cube_backend_null = {"null", null_device_count, null_open,
                                        .config_keys = NULL};
