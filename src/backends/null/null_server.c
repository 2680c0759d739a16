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
 * and what the default is).
 *
 * A backend copied from this file replaces what the TODO(name): comments
 * mark (grep for them): the device's handle and figures, its memory,
 * copies in stream order, compile and launch, and finding devices. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "backends/common/host_memory.h"
#include "backends/common/properties.h"
#include "cubert/backend/errors.h"
#include "cubert/backend/server.h"

/* Every buffer's address is a multiple of this: a cache line, enough for
 * any element type a copy descriptor allows (at most 64 bytes). */
#define NULL_ALIGNMENT 64

/* The server object. A real backend keeps its device handle, its compiler
 * and its queues' shared state here; the null backend only needs the
 * answer to `properties`, computed once when it opens. */
/* TODO(name): the device handle, the compiler and the queues' shared
 * state. */
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
 * smallest the client accepts (one unit, no shared memory) and no kernel
 * feature bit is set (only CUBE_FEATURE_HOST_MEMORY): without
 * CUBE_FEATURE_KERNELS callers know not to launch. The
 * cube count limits are properties_defaults' wide ones, so that a launch
 * is not refused before it reaches compile, which says why no kernel runs
 * here. */
static void fill_properties(cube_properties *p)
{
    /* TODO(name): the device's figures (name, architecture, limits, memory
     * and its alignment, compute units, feature bits once kernels run,
     * CUBE_TIMING_DEVICE with device timestamps), read from the device
     * over properties_defaults' common ones. */
    properties_defaults(p, "null", host_memory(), NULL_ALIGNMENT);
    snprintf(p->name, sizeof p->name, "null device (host memory, no kernels)");
    snprintf(p->architecture, sizeof p->architecture, "host");
    for (int i = 0; i < 3; i++)
        p->max_cube_dim[i] = 1;
    p->max_units_per_cube = 1;
    p->max_shared_memory = 0;
    p->compute_units = 1;
    p->features = CUBE_FEATURE_HOST_MEMORY; /* and no kernel bit */
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

/* A stream needs no state of its own here (work is done at call time, so
 * there is no queue), hence stream->impl stays NULL and stream_close is
 * left out. A backend with queues creates one here and frees it in
 * stream_close. */
static cube_error *null_stream_open(cube_server *server,
                                    cube_server_stream *stream,
                                    cube_storage_ops *storage)
{
    (void)stream;
    /* Host memory (backends/common/host_memory.c), as the CPU backend
     * uses; a device backend hands its own allocator here. */
    /* TODO(name): device memory: the backend's own alloc/free in
     * *storage, and a queue in stream->impl (see stream_close). */
    host_storage_ops(server, storage);
    return NULL;
}

/* --- copies --- */

/* Copies and busy time come from backends/common/host_memory.c: while a
 * profiling window is open on the stream, the time each read and write
 * takes is added to its busy_ns (server.h, cube_server_stream), which the
 * client's host-clock window reports. */

/* read, write, sync and flush: host_read, host_write, host_sync and
 * host_flush (backends/common/host_memory.c) do the work at call time, as
 * the contract allows: a read is never pending, the caller may reuse its
 * memory when a write returns, and nothing is ever left to wait for. A
 * device backend writes its own, in stream order.
 *
 * copy_to_peer and the communicators (ServerCommunication):
 * host_copy_to_peer and host_comm_vtable (backends/common/
 * host_collective.c) work on any backend whose buffers are host memory.
 * With one device the null backend's communicators have one rank. */

/* TODO(name): read, write, sync and flush of the backend's own, in stream
 * order on the device's queue, in place of host_read, host_write,
 * host_sync and host_flush in the vtable below. */
/* --- kernels --- */

/* compile: the null backend runs no kernels, and says so. The client
 * records this error on every buffer the launch binds (a raw kernel's:
 * on the buffers of its declared outputs), as for any compile error, so
 * the failure store behaves as on a backend with kernels. */
static cube_error *null_compile(cube_server *server, const cube_kernel *kernel,
                                uint32_t mode, cube_compiled *out)
{
    /* TODO(name): build the kernel (the backend's prelude, then
     * kernel_source_cube_c from backends/common/kernel_source.h), fill
     * *out with its signature and impl, and answer CUBE_ERR_COMPILE with
     * the compiler's log on failure. */
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
    /* TODO(name): free what compile put in compiled->impl. */
    (void)server;
    (void)compiled;
}

/* launch: unreachable, since no compile succeeds, but the slot is
 * required; answering UNSUPPORTED keeps it honest should that change. */
static cube_error *null_launch(cube_server *server, cube_server_stream *stream,
                               const cube_dispatch *dispatch)
{
    /* TODO(name): run or enqueue the dispatch on the stream's queue; a
     * validating launch reports through validate_report
     * (backends/common/validate.h). */
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
    /* TODO(name): release the device handle and what the server holds. */
    free(server);
}

/* The slots, by name: those not named here are NULL, and the client then
 * applies the contract's default (server.h). */
static const cube_server_vtable null_vtable = {
    .name = "null",
    .destroy = null_destroy,
    .properties = null_properties,
    .stream_open = null_stream_open,
    .read = host_read,
    .write = host_write,
    .sync = host_sync,
    .compile = null_compile,
    .compiled_release = null_compiled_release,
    .launch = null_launch,
    .flush = host_flush,
    .copy_to_peer = host_copy_to_peer,
    .wrap_memory = host_wrap_memory,
};

/* One device, always there: the client refuses "null:1" and above with
 * CUBE_ERR_NOT_FOUND before open is called. A backend that cannot run
 * here (no driver, no device) answers CUBE_ERR_UNAVAILABLE with the
 * reason instead. */
static cube_error *null_device_count(uint32_t *out)
{
    /* TODO(name): count the devices the driver sees, or answer
     * CUBE_ERR_UNAVAILABLE with the reason. */
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
    /* TODO(name): open device `index` and keep its handle in the server. */
    s->base.vt = &null_vtable;
    fill_properties(&s->props);
    *out = &s->base;
    return NULL;
}

/* device_properties: what properties would say once open, without
 * opening (cube_device_describe). */
static cube_error *null_device_properties(uint32_t index,
                                          const cube_client_options *options,
                                          cube_properties *out)
{
    (void)index;
    (void)options;
    fill_properties(out);
    return NULL;
}

/* What the registry knows: cmake/backends.cmake's registration promises
 * that this folder defines cube_backend_null, named "null". No
 * configuration keys; the communicators of host memory, ranks that are
 * threads of this process (host_comm_vtable); the CPU threads option
 * means nothing here. */
const cube_backend cube_backend_null = {"null",
                                        null_device_count,
                                        null_open,
                                        .device_properties =
                                            null_device_properties,
                                        .comm = &host_comm_vtable,
                                        .config_keys = NULL};
