/* cubert — the server vtable: what a backend implements.
 *
 * The client (src/core) owns handles, reference counts, the failure store,
 * streams and the compiled-kernel cache; a backend owns device memory and
 * execution. The client is the only caller of these slots. It serializes
 * the calls for one stream (two calls naming the same stream never overlap);
 * calls for different streams, and the calls that name no stream, may come
 * from several threads at once, so a backend protects what its streams
 * share.
 *
 * There is one slot per method of the server contract (docs/
 * server-contract.md maps each to its public function). Slots marked
 * (optional) may be NULL; the client then applies the contract's default.
 * Every slot that can fail returns `cube_error *` (NULL on success) which
 * the client owns.
 */
#ifndef CUBERT_BACKEND_SERVER_H
#define CUBERT_BACKEND_SERVER_H

#include <stddef.h>
#include <stdint.h>

#include "cubert/buffer.h"
#include "cubert/client.h"
#include "cubert/kernel.h"
#include "cubert/memory.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct cube_server_vtable cube_server_vtable;
/* A backend's communicators (cubert/backend/comm.h). */
typedef struct cube_comm_vtable cube_comm_vtable;

/* The core's record of an open device (opaque to backends). */
struct core_device;

/* The base of every backend's server object: a backend struct starts with
 * this member so the client can reach the vtable. `device` is set by the
 * core right after the backend's open returns; backends use it only
 * through the cube_server_stream_* helpers below. A server serves every
 * client of its device in the process (cubert/device.h). */
typedef struct cube_server {
    const cube_server_vtable *vt;
    struct core_device *device;
} cube_server;

/* A stream's memory manager (src/memory/memory_manager.h). */
struct mem_manager;

/* A stream as the core hands it to every stream slot. The core creates
 * it the first time a stream id is used on the device (the stream_open
 * slot fills `impl`), builds its memory manager over the storage
 * stream_open describes, and keeps both until the device closes (its last
 * client closes): a backend keeps no stream table of its own and never
 * looks a stream up by id. Every client of the device uses the same
 * stream objects.
 *
 * `index` is dense per device (0, 1, 2, ... in order of creation, below
 * CUBE_MAX_STREAMS), so a backend can name a stream in a few bits and find
 * it again with cube_server_stream_at. The first four fields do not change
 * after stream_open returns.
 *
 * Host-clock profiling: a backend without start_profile/end_profile runs
 * work at issue time, and a profiling window measures the time spent
 * running the work issued in it. While `profiling` is nonzero (the client
 * sets it when a window is open on the stream) such a backend adds to
 * `busy_ns` the nanoseconds (CLOCK_MONOTONIC) each launch, read and write
 * it runs on the stream took, from the slot's entry to its return; the
 * client reports the growth of `busy_ns` over a window. Both fields change
 * only within calls for this stream, which the client serializes. */
typedef struct cube_server_stream {
    cube_stream_id id;
    uint32_t index;
    struct mem_manager *memory; /* owned by the core */
    void *impl;                 /* owned by the backend */
    uint32_t profiling;         /* set by the client */
    uint64_t busy_ns;           /* added to by the backend */
} cube_server_stream;

#define CUBE_MAX_STREAMS 65535u

/* What a stream's memory manager allocates from: `alloc` reserves `size`
 * bytes aligned to `align` (CUBE_ERR_OUT_OF_MEMORY when it cannot), `free`
 * gives them back. Both may be called from any thread.
 *
 * Virtual memory (optional; what expandable pools, CUBE_POOL_EXPANDABLE,
 * are built on). A storage that has it sets `granularity` and all four
 * functions; one that leaves `granularity` 0 or any of them NULL has none,
 * and cube_install_memory_pools refuses a layout with an expandable pool
 * (CUBE_ERR_UNSUPPORTED). A storage that does not know these fields
 * leaves them zero (designated or positional initializers of the first
 * three fields do).
 *  - granularity: the page size of mappings, a power of two (2 MiB on the
 *    host storage and on GPUs with virtual memory management). Every
 *    range below starts and ends on a multiple of it.
 *  - reserve: `size` bytes of address space aligned to `align` (a power
 *    of two, at least the granularity), backed by nothing: touching it
 *    faults. CUBE_ERR_OUT_OF_MEMORY when no address space is left.
 *  - map: backs [address, address + size), inside a reservation and not
 *    mapped now, with memory readable and writable by the device (and by
 *    the host for host memory). What one call maps is a chunk: the
 *    storage may back it with one physical allocation (CUDA does), and
 *    the manager unmaps it whole, never part of it (expandable pools cut
 *    their runs of pages into chunks, see memory/pool_expandable.c).
 *    CUBE_ERR_OUT_OF_MEMORY when the memory cannot be had (the range is
 *    then left unmapped, whole); CUBE_ERR_DEVICE_FAULT for a broken
 *    device.
 *  - unmap: gives the memory behind [address, address + size) back,
 *    exactly the range one earlier map call mapped (one chunk); the range
 *    is address space only again. Never fails (memory that cannot be
 *    given back is the storage's to log). The storage may give the memory
 *    back later, once work queued before the unmap has run (CUDA does),
 *    provided a map right after is served: a later chunk lying over such
 *    a chunk whole may take it back as it is; one that overlaps it only
 *    in part waits for it to go.
 *  - release: gives a reservation back, whole (the base and size reserve
 *    returned), once nothing in it is mapped.
 * The manager calls map and unmap under its lock, never on the path of a
 * request its pools serve from memory already mapped; release when a pool
 * is rebuilt or destroyed. */
typedef struct cube_storage_ops {
    void *self;
    cube_error *(*alloc)(void *self, uint64_t size, uint64_t align,
                         uint64_t *address);
    void (*free)(void *self, uint64_t address, uint64_t size);
    /* virtual memory (optional, see above) */
    uint64_t granularity;
    cube_error *(*reserve)(void *self, uint64_t size, uint64_t align,
                           uint64_t *base);
    cube_error *(*map)(void *self, uint64_t address, uint64_t size);
    void (*unmap)(void *self, uint64_t address, uint64_t size);
    void (*release)(void *self, uint64_t base, uint64_t size);
    /* The layout preset (a cube_layout_preset, cubert/memory.h) the
     * stream's pools start with while the client installed no layout;
     * 0, the subslices preset, when left alone. CUBE_PRESET_EXPANDABLE
     * needs the virtual-memory functions above. */
    uint32_t preset;
} cube_storage_ops;

/* Memory handed out by a backend: `address` is what kernels and copies use
 * (a host pointer on the CPU, a device address on GPUs); `cookie` is the
 * backend's own bookkeeping (its pool slot), returned to it on release.
 * `pool` is the position, in the stream's memory report, of the pool that
 * served it: the memory manager's allocation sets it, and a backend whose
 * initialize_memory wraps that allocation copies it, so the buffer list
 * (cube_memory_snapshot) names the pool without a lookup. */
typedef struct cube_storage {
    uint64_t address;
    uint64_t size;
    void *cookie;
    uint32_t pool;
} cube_storage;

/* A byte range of an allocation, resolved by the client from a handle.
 * Its storage is always backed: a buffer made in a dry run gets memory
 * before the first read, write or launch that names it, and until then
 * the client leaves it out of the bindings of a sync or a check (never
 * written, it has nothing to wait for). */
typedef struct cube_binding {
    const cube_storage *storage;
    uint64_t offset;
    uint64_t size;
} cube_binding;

/* One strided transfer between packed host memory and a binding. Strides
 * are in bytes; `bytes` is the packed size (product of shape * elem). */
typedef struct cube_copy_op {
    cube_binding binding;
    uint32_t rank;
    uint32_t elem_size;
    uint64_t shape[CUBE_MAX_RANK];
    uint64_t byte_strides[CUBE_MAX_RANK];
    uint64_t bytes;
    int contiguous; /* the elements form one dense byte range */
} cube_copy_op;

/* Parameter kinds of a compiled kernel's signature. */
typedef enum cube_param_kind {
    CUBE_PARAM_BUFFER_IN = 1,
    CUBE_PARAM_BUFFER_OUT = 2,
    CUBE_PARAM_BUFFER_INOUT = 3,
    CUBE_PARAM_SCALAR = 4,
    CUBE_PARAM_SHARED = 5
} cube_param_kind;

typedef struct cube_param {
    cube_param_kind kind;
    uint32_t elem_size; /* element size, or the scalar's size */
    uint64_t extent;    /* elements, for shared arrays */
} cube_param;

/* CUBE_MAX_PARAMS (cubert/kernel.h) bounds every signature. */

/* What a backend's compile produces. The client reads the public fields to
 * validate launches; `impl` belongs to the backend. */
typedef struct cube_compiled {
    uint32_t param_count;
    cube_param params[CUBE_MAX_PARAMS];
    uint64_t shared_bytes; /* per cube */
    int uses_cube_sync;
    double compile_ms; /* time spent compiling (0 for a cache hit) */
    int from_disk_cache;
    /* CPU cube C kernels that call cube_sync(): what the barrier pass did,
     * a static string the trace shows ("ran", "disk": its output came from
     * the disk cache, "refused": the units run as fibers, "off": switched
     * off by cpu_barriers). NULL where no such pass applies. */
    const char *barrier_pass;
    void *impl;
} cube_compiled;

/* A launch as the client hands it over: validated, handles resolved.
 * `bindings` and `scalars` are indexed by parameter position (entries for
 * other kinds are unused). */
typedef struct cube_dispatch {
    const cube_compiled *compiled;
    uint32_t cube_dim[3];
    uint32_t cube_count[3];           /* static count */
    const cube_binding *count_buffer; /* non-NULL: dynamic count */
    cube_binding bindings[CUBE_MAX_PARAMS];
    unsigned char scalars[CUBE_MAX_PARAMS][8];
    uint32_t mode; /* CUBE_LAUNCH_* */
    /* With a dynamic count, where the launch slot answers whether it ran:
     * the backend sets *ran_nothing to 1 when the count it read has a
     * zero component (no cube ran, no buffer was written) and leaves it
     * alone otherwise; the client then keeps the outputs' failures. NULL
     * with a static count. */
    int *ran_nothing;
} cube_dispatch;

/* A backend's read in flight; the client waits on it with read_wait. */
typedef struct cube_pending cube_pending;

struct cube_server_vtable {
    const char *name;

    /* Frees the server. The client calls it last, after every stream was
     * drained and closed. Never fails. */
    void (*destroy)(cube_server *server);

    /* DeviceService: limits, features, memory. */
    cube_error *(*properties)(cube_server *server, cube_properties *out);

    /* stream_open: sets up the backend's side of a new stream (its
     * stream->impl) and says in *storage where the stream's memory comes
     * from. Called once per stream, with the device's stream table locked
     * (keep it short). Errors: CUBE_ERR_OUT_OF_MEMORY, a driver error.
     * stream_close (optional): frees stream->impl. Called at close, after
     * every stream was drained and every stream's memory manager was
     * destroyed (so the storage's free ran for all of its memory), in
     * order of creation, before destroy. */
    cube_error *(*stream_open)(cube_server *server, cube_server_stream *stream,
                               cube_storage_ops *storage);
    void (*stream_close)(cube_server *server, cube_server_stream *stream);

    /* (optional) initialize_memory and release_memory, for a backend that
     * keeps state per buffer around the manager's blocks. Default:
     * mem_alloc and mem_free on the stream's manager. They are not
     * serialized by stream: a buffer is released from whichever thread
     * drops its last reference, and allocations skip the stream's lock to
     * stay cheap. A backend's memory must be thread-safe.
     *
     * initialize_memory: backs a new buffer of `size` bytes for `stream`.
     * Errors: CUBE_ERR_OUT_OF_MEMORY, CUBE_ERR_BUFFER_TOO_BIG,
     * CUBE_ERR_POOL_CAPACITY_EXCEEDED. release_memory: returns memory of a
     * buffer no handle names any more to `stream`, the stream it came
     * from. The client calls it only once no queued work of the client
     * uses it. */
    cube_error *(*initialize_memory)(cube_server *server,
                                     cube_server_stream *stream, uint64_t size,
                                     cube_storage *out);
    void (*release_memory)(cube_server *server, cube_server_stream *stream,
                           cube_storage *storage);
    /* (optional) memory_reclaim: gives back to the stream's manager what
     * the backend holds aside (memory waiting for other streams' uses),
     * before the client's memory_cleanup releases unused pages. */
    void (*memory_reclaim)(cube_server *server, cube_server_stream *stream);

    /* read: copies each op's elements packed into dst[i]. May finish at
     * once (*pending = NULL) or leave a pending read for read_wait. */
    cube_error *(*read)(cube_server *server, cube_server_stream *stream,
                        const cube_copy_op *ops, size_t n, void *const *dst,
                        cube_pending **pending);
    /* (optional) Waits for a pending read and frees it. */
    cube_error *(*read_wait)(cube_server *server, cube_pending *pending);
    /* (optional) 1 when read_wait would not wait for the device (the
     * read's copies have finished, or failed); never blocks. Without it a
     * pending read counts as not ready until it is waited on. */
    int (*read_poll)(cube_server *server, cube_pending *pending);

    /* write: copies packed host data into each op's binding, in stream
     * order. The host memory may be reused when this returns. */
    cube_error *(*write)(cube_server *server, cube_server_stream *stream,
                         const cube_copy_op *ops, size_t n,
                         const void *const *src);

    /* sync: waits for every task of `stream` (and for the last writers of
     * `bindings` on other streams), then reports a device fault if the
     * context is broken. The client adds the failure-store answer. */
    cube_error *(*sync)(cube_server *server, cube_server_stream *stream,
                        const cube_binding *bindings, size_t n);

    /* (optional) check: backend-specific enqueue-time state of bindings;
     * the client answers from its failure store first. */
    cube_error *(*check)(cube_server *server, cube_server_stream *stream,
                         const cube_binding *bindings, size_t n);

    /* Compiles a kernel (the expand + compile half of launch) into
     * *out, whose fields the backend fills. `mode` carries
     * CUBE_LAUNCH_CHECKED. Errors: CUBE_ERR_COMPILE (with the log). */
    cube_error *(*compile)(cube_server *server, const cube_kernel *kernel,
                           uint32_t mode, cube_compiled *out);
    /* Frees what compile made. */
    void (*compiled_release)(cube_server *server, cube_compiled *compiled);

    /* launch: runs (or enqueues) a validated dispatch on `stream`. An error
     * means it did not run; the client records it on the written buffers. */
    cube_error *(*launch)(cube_server *server, cube_server_stream *stream,
                          const cube_dispatch *dispatch);

    /* flush: submits queued work; reports only a device fault. */
    cube_error *(*flush)(cube_server *server, cube_server_stream *stream);

    /* (optional) staging: host buffers for uploads. Default: aligned host
     * memory from the client. */
    cube_error *(*staging)(cube_server *server, const uint64_t *sizes, size_t n,
                           void **out);
    void (*staging_free)(cube_server *server, void *buffer);

    /* (optional) The following follow the contract's defaults when NULL:
     * graph_prepare is a no-op. Without begin_capture the client records
     * software graphs itself (and end_capture, replay, graph_destroy are
     * unused); without start_profile/end_profile the client times
     * profiling windows on the host clock from the stream's `busy_ns`
     * (see cube_server_stream). Memory usage, reports, layouts
     * and the persistent routing of allocations are the client's: it
     * owns each stream's memory manager. */
    cube_error *(*graph_prepare)(cube_server *server,
                                 cube_server_stream *stream);
    cube_error *(*begin_capture)(cube_server *server,
                                 cube_server_stream *stream);
    cube_error *(*end_capture)(cube_server *server, cube_server_stream *stream,
                               uint64_t *graph);
    cube_error *(*replay)(cube_server *server, cube_server_stream *stream,
                          uint64_t graph);
    void (*graph_destroy)(cube_server *server, cube_server_stream *stream,
                          uint64_t graph);
    cube_error *(*start_profile)(cube_server *server,
                                 cube_server_stream *stream, uint64_t *token);
    cube_error *(*end_profile)(cube_server *server, cube_server_stream *stream,
                               uint64_t token, double *seconds,
                               cube_timing_method *method);
    void (*abandon_profile)(cube_server *server, cube_server_stream *stream,
                            uint64_t token);

    /* (optional) ServerCommunication between servers. Default:
     * cube_copy_peer goes through host memory. Communicators and
     * collectives are not server slots: a backend has them through
     * cube_backend.comm (cubert/backend/comm.h).
     *
     * copy_to_peer: copies `src` (this server's) into `dst` (of `peer`, a
     * server of the same backend, maybe this one) on `peer_stream`:
     * after the work that last wrote src on any of this server's streams,
     * before the work later issued on peer_stream, and as a write of dst
     * for readers on peer's other streams. `stream` is the calling
     * thread's stream of this server. The core holds both streams (one
     * lock when they are the same object). */
    cube_error *(*copy_to_peer)(cube_server *server, cube_server_stream *stream,
                                const cube_binding *src, cube_server *peer,
                                cube_server_stream *peer_stream,
                                const cube_binding *dst);

    /* (optional) Interop (cubert/interop.h). native_stream: the stream's
     * native queue (a CUstream); NULL slot: none (work done at call time).
     * wrap_memory: checks that [address, address + size) is memory of this
     * device the backend can use and fills *out (its cookie the backend's;
     * CUBE_ERR_INVALID_ARGUMENT saying why not); NULL slot: cube_wrap_memory
     * is CUBE_ERR_UNSUPPORTED. unwrap_memory: waits until no work queued on
     * wrapped storage can still touch it and forgets it (the core then
     * calls the owner's release); NULL: nothing to wait for. native_written:
     * foreign work on the stream's native queue wrote `binding`; later
     * users on other streams must wait for it; NULL: nothing to order. */
    cube_error *(*native_stream)(cube_server *server,
                                 cube_server_stream *stream, void **out);
    cube_error *(*wrap_memory)(cube_server *server, cube_server_stream *stream,
                               uint64_t address, uint64_t size,
                               cube_storage *out);
    void (*unwrap_memory)(cube_server *server, cube_server_stream *stream,
                          cube_storage *storage);
    cube_error *(*native_written)(cube_server *server,
                                  cube_server_stream *stream,
                                  const cube_binding *binding);
    /* native_ready: makes `foreign` (a native stream not the backend's)
     * wait for the work that last wrote `binding`, on any stream; NULL:
     * work is done at call time, nothing to wait for. */
    cube_error *(*native_ready)(cube_server *server, cube_server_stream *stream,
                                const cube_binding *binding, void *foreign);
    /* native_wait: the stream's queue waits for the work issued so far on
     * `foreign` (a native stream not the backend's; NULL: the legacy
     * default stream); NULL slot: work is done at call time. */
    cube_error *(*native_wait)(cube_server *server, cube_server_stream *stream,
                               void *foreign);
};

/* A backend as the registry knows it. */
typedef struct cube_backend {
    const char *name;
    /* How many devices there are. CUBE_ERR_UNAVAILABLE, with the reason,
     * when the backend cannot run on this machine. */
    cube_error *(*device_count)(uint32_t *out);
    /* Opens device `index`: once per device and process, however many
     * clients use it. */
    cube_error *(*open)(uint32_t index, const cube_client_options *options,
                        cube_server **out);
    /* Fills *out with what `properties` would report once device `index`
     * is opened with `options`, without opening it (no context, no
     * threads). */
    cube_error *(*device_properties)(uint32_t index,
                                     const cube_client_options *options,
                                     cube_properties *out);
    /* Nonzero when cube_client_options.cpu_threads shapes its servers (a
     * second open asking for other threads is then refused). */
    int uses_cpu_threads;
    /* (optional) Communicators and collectives (cubert/backend/comm.h);
     * NULL: the backend has none, and cube_comm_init_all,
     * cube_comm_init_rank and cube_comm_id_new answer
     * CUBE_ERR_UNSUPPORTED. */
    const cube_comm_vtable *comm;
    /* The backend's configuration keys (cubert/backend/config.h), ended by
     * an entry whose name is NULL; NULL when it has none. */
    const struct cube_config_key *config_keys;
} cube_backend;

/* The stream of `server`'s device at `index` (see cube_server_stream), or
 * NULL when there is none yet. Lock-free; any thread. */
CUBE_API cube_server_stream *cube_server_stream_at(const cube_server *server,
                                                   uint32_t index);
/* How many streams `server`'s device has created so far: indices below it
 * are valid. Lock-free; any thread. */
CUBE_API uint32_t cube_server_stream_count(const cube_server *server);

/* Accessors of a kernel object for backends (borrowed strings).
 * cube_kernel_source: a cube C kernel's source, a raw kernel's source
 * (its format is CUBE_KERNEL_CUDA_SOURCE or CUBE_KERNEL_C_SOURCE), else
 * "". */
CUBE_API const char *cube_kernel_source(const cube_kernel *kernel);
CUBE_API void cube_kernel_cube_dim(const cube_kernel *kernel, uint32_t out[3]);
/* A raw kernel's code as given: its source, or its binary's bytes (a NUL
 * follows them, not counted in *size). NULL with *size 0 for a cube C
 * kernel. `size` may be NULL. */
CUBE_API const void *cube_kernel_code(const cube_kernel *kernel, size_t *size);
/* A raw kernel's extra compiler options ("" for none, and for cube C). */
CUBE_API const char *cube_kernel_options(const cube_kernel *kernel);
/* A raw kernel's declared parameters, as a signature (param_count and
 * params set, the rest zero; a backend copies them into its compiled
 * kernel). NULL for a cube C kernel, whose signature only its compile
 * knows. */
CUBE_API const cube_compiled *cube_kernel_declared(const cube_kernel *kernel);

#ifdef __cplusplus
}
#endif

#endif /* CUBERT_BACKEND_SERVER_H */
