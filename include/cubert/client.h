/* cubert — clients, properties, streams, barriers and memory statistics.
 *
 * A client is one user's reference to a device (cubert/device.h): the
 * device's server is opened once per process and shared by every client of
 * it, while handles, failures, dry runs, profiling windows, captures and
 * graphs are the client's own. It is thread-safe: any number of threads may
 * share one and call anything on it at once. Each thread works on its own
 * stream by default (an in-order queue); cube_stream_use() lets a thread
 * name another stream of the same client.
 *
 * Ownership: cube_client_open() hands the caller a client that it closes
 * with cube_client_close() once, after every other call on it has returned.
 */
#ifndef CUBERT_CLIENT_H
#define CUBERT_CLIENT_H

#include <stddef.h>
#include <stdint.h>

#include "cubert/error.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct cube_client cube_client;

/* A buffer handle: a small value naming a reference to device memory (an
 * allocation, or a byte range of one). Handles are checked on every use: a
 * released handle or one from another client (open or closed) is refused
 * with CUBE_ERR_NOT_FOUND, never dereferenced. A value is handed out at
 * most once in a process, however many clients open and close, so a stale
 * or foreign handle never names some other buffer. The zero value is
 * never valid. */
typedef struct cube_handle {
    uint64_t bits;
} cube_handle;

typedef uint64_t cube_stream_id;

/* The most threads cube_client_options.cpu_threads may ask for. */
#define CUBE_MAX_CPU_THREADS 4096u

/* The most clients open at once in a process. */
#define CUBE_MAX_CLIENTS 4095u

typedef struct cube_client_options {
    /* sizeof(cube_client_options): lets the struct grow compatibly. */
    uint32_t struct_size;
    /* Threads of the CPU backend, 1..CUBE_MAX_CPU_THREADS (the range of
     * $CUBERT_CPU_THREADS); 0: $CUBERT_CPU_THREADS, else one per online
     * core. A value above the range is refused by cube_client_open with
     * CUBE_ERR_INVALID_ARGUMENT on every backend; backends without CPU
     * threads ignore a value in it. */
    uint32_t cpu_threads;
    /* Kernel cache directory; NULL: $CUBERT_CACHE_DIR, else
     * $XDG_CACHE_HOME/cubert; "" disables the disk cache. Borrowed for the
     * duration of the open call. */
    const char *cache_dir;
} cube_client_options;

/* Default options (every field zero except struct_size). */
CUBE_API cube_client_options cube_client_options_default(void);

/* Opens a client of `device`: "cpu", "cpu:N" (with $CUBERT_CPU_DEVICES),
 * "cuda", "cuda:N" (N in decimal digits, 0..1024), "null" (host memory,
 * no kernels), or NULL for $CUBERT_DEVICE, else "cpu". `options` may be
 * NULL. The first open of a device opens its server with these options;
 * an open of a device that is open already shares its server, and the
 * options it sets itself (cpu_threads nonzero on the CPU backend,
 * cache_dir non-NULL) must match the first open's. At most
 * CUBE_MAX_CLIENTS clients are open at once in a process (a closed one
 * makes room).
 * Errors: CUBE_ERR_INVALID_ARGUMENT (out NULL, malformed device string or
 * options: struct_size, cpu_threads above CUBE_MAX_CPU_THREADS; options
 * that differ from those the open device was opened with: the message
 * names the option and both values),
 * CUBE_ERR_NOT_FOUND (unknown backend, device index out of range),
 * CUBE_ERR_UNAVAILABLE (the backend cannot run here; the message says why),
 * CUBE_ERR_RESOURCE_LIMIT (CUBE_MAX_CLIENTS clients are open),
 * CUBE_ERR_IO (a thread the backend needs could not be started),
 * CUBE_ERR_OUT_OF_MEMORY (after either, nothing is left open). */
CUBE_API CUBE_MUST_USE cube_error *
cube_client_open(const char *device, const cube_client_options *options,
                 cube_client **out);

/* Waits for all work on the device's streams (other clients' work queued
 * there too), then frees the client and everything it owns: buffers the
 * caller did not release are freed too, captures it left open end, its
 * profiling windows are dropped. The last client of a device closes the
 * device's server. NULL is a no-op. Blocks.
 * Call it once, after every other call on the client has returned. When
 * that rule is broken, close does not tear the client down under other
 * threads: calls already running when it begins finish first (close waits
 * for them), and a call that starts while close runs touches nothing and
 * returns CUBE_ERR_INVALID_ARGUMENT, "the client is closing" (every call
 * that takes the client, except cube_client_properties,
 * cube_client_utilities, cube_stream_use and cube_stream_current, which
 * read only what the client holds until it is freed;
 * cube_profile_abandon returns nothing and does nothing). Wait for every
 * cube_read_async future before closing. A call made after close returned
 * uses freed memory, which nothing can detect. */
CUBE_API void cube_client_close(cube_client *client);

/* Names of the backends compiled in, NULL-terminated, static. */
CUBE_API const char *const *cube_backend_names(void);

/* Names of the backends cubert has but this build left out (opening one
 * answers CUBE_ERR_UNAVAILABLE, "not part of this build"), NULL-terminated,
 * static (the caller frees nothing); empty when every backend is built.
 * Any thread; never fails. */
CUBE_API const char *const *cube_backend_names_left_out(void);

/* How a profile duration was measured. */
typedef enum cube_timing_method {
    CUBE_TIMING_HOST_CLOCK = 0,
    CUBE_TIMING_DEVICE = 1
} cube_timing_method;

/* Feature bits of cube_properties.features: what the device can do beyond
 * holding and copying memory. A program (and the conformance suite) tests
 * a bit before it relies on the feature.
 * - CUBE_FEATURE_KERNELS: the backend compiles and runs cube C kernels.
 *   Without it (the null backend) every launch fails at compile with
 *   CUBE_ERR_UNSUPPORTED, recorded on the launch's buffers like any launch
 *   failure; memory, copies, barriers, the failure store, streams and
 *   profiling windows work as usual. The other bits describe kernel
 *   features and mean nothing without this one.
 * - CUBE_FEATURE_GRAPHS: cube_graph_* record and replay launches. Every
 *   backend with CUBE_FEATURE_KERNELS reports it: where the device records
 *   no graphs the client records software graphs
 *   (cube_utilities.software_graphs). Without the bit (the null backend)
 *   the graph calls still keep their lifecycle and their refusals, but a
 *   launch in a capture fails as every launch there does, so graphs hold
 *   nothing and a replay changes nothing.
 * - CUBE_FEATURE_HOST_MEMORY: buffers live in host memory the program
 *   could address (the cpu and null backends): cube_native_buffer_get
 *   gives a host pointer with host_accessible set, cube_wrap_memory takes
 *   host memory, and the pools are built over the host's virtual memory,
 *   so every pool kind installs (CUBE_POOL_EXPANDABLE included). Without
 *   it (CUDA) buffers are device memory the host cannot dereference.
 * - CUBE_FEATURE_COLLECTIVES: the backend has communicators
 *   (cubert/comm.h): cube_comm_init_all, cube_comm_init_rank and
 *   cube_comm_id_new work. Without it (OpenCL, for now) they answer
 *   CUBE_ERR_UNSUPPORTED; cube_copy_peer works either way. */
enum {
    CUBE_FEATURE_ATOMIC_F32_ADD = 1u << 0,
    CUBE_FEATURE_F64 = 1u << 1,
    CUBE_FEATURE_SHARED_MEMORY = 1u << 2,
    CUBE_FEATURE_CUBE_SYNC = 1u << 3,
    CUBE_FEATURE_BOUNDS_CHECK = 1u << 4,
    CUBE_FEATURE_DYNAMIC_COUNT = 1u << 5,
    CUBE_FEATURE_GRAPHS = 1u << 6,
    CUBE_FEATURE_PINNED_STAGING = 1u << 7,
    CUBE_FEATURE_KERNELS = 1u << 8,
    CUBE_FEATURE_HOST_MEMORY = 1u << 9,
    CUBE_FEATURE_COLLECTIVES = 1u << 10
};

/* The name of one CUBE_FEATURE_* bit, as its enumerator spells it in
 * lower case ("atomic_f32_add", "kernels"); NULL for 0, for several bits
 * and for a bit cubert does not define. Static; any thread; never fails. */
CUBE_API const char *cube_feature_name(uint32_t feature);

typedef struct cube_properties {
    char backend[16];      /* "cpu", "cuda" */
    char name[128];        /* device name */
    char architecture[64]; /* "x86_64", "aarch64", "sm_90" */
    uint32_t max_cube_dim[3];
    uint32_t max_units_per_cube;
    uint32_t max_cube_count[3];
    uint64_t max_shared_memory; /* bytes per cube */
    /* Bytes of device memory. A CPU device: the host's physical memory
     * divided evenly among the $CUBERT_CPU_DEVICES virtual devices (whole
     * pages), so the devices' figures add up to the machine. The preset
     * pools and max_buffer_size are sized by it; the bytes themselves are
     * the host's, shared: nothing stops one device from holding more than
     * its share while the others hold less. */
    uint64_t memory_total;
    uint64_t memory_alignment; /* every buffer's address is a multiple */
    uint64_t max_buffer_size;  /* the largest single buffer */
    uint32_t compute_units;    /* cores or multiprocessors */
    uint32_t features;         /* CUBE_FEATURE_* */
    cube_timing_method timing;
} cube_properties;

/* Fills *out. Never blocks. Errors: CUBE_ERR_INVALID_ARGUMENT. */
CUBE_API CUBE_MUST_USE cube_error *cube_client_properties(cube_client *client,
                                                          cube_properties *out);

/* How launches are bounds-checked: as each launch asks
 * (CUBE_LAUNCH_CHECKED), or always (CUBERT_BOUNDS_CHECK=always). */
typedef enum cube_bounds_policy {
    CUBE_BOUNDS_PER_LAUNCH = 0,
    CUBE_BOUNDS_ALWAYS = 1
} cube_bounds_policy;

/* How the device lays out 2-D data: densely, or with padded (pitched)
 * rows where that makes copies and accesses faster. */
typedef enum cube_layout_policy {
    CUBE_LAYOUT_CONTIGUOUS = 0,
    CUBE_LAYOUT_PITCHED = 1
} cube_layout_policy;

/* What the server shares with its users, immutable for the client's life:
 * the contract's `utilities`. */
typedef struct cube_utilities {
    cube_properties properties;
    cube_bounds_policy bounds;
    cube_layout_policy layout;
    /* Nonzero when graphs are recorded by the client (software graphs,
     * replay linear in launches) rather than by the device. */
    int software_graphs;
} cube_utilities;

/* Fills *out. Never blocks. Errors: CUBE_ERR_INVALID_ARGUMENT. */
CUBE_API CUBE_MUST_USE cube_error *cube_client_utilities(cube_client *client,
                                                         cube_utilities *out);

/* --- streams --- */

/* The stream the calling thread works on for `client`: its own by default.
 * Returns 0 when client is NULL. */
CUBE_API cube_stream_id cube_stream_current(cube_client *client);

/* Makes the calling thread work on `stream` (any id; a new id creates the
 * stream on first use). 0 restores the thread's own stream. Threads' own
 * streams have ids with the top bit set, so an id below 2^63 chosen by the
 * application never aliases one by accident. A thread names streams on at
 * most 8 open clients at once: a choice ends when its client closes (or
 * with 0).
 * Errors: CUBE_ERR_INVALID_ARGUMENT (client NULL), CUBE_ERR_RESOURCE_LIMIT
 * (the thread already names streams on 8 other open clients). */
CUBE_API CUBE_MUST_USE cube_error *cube_stream_use(cube_client *client,
                                                   cube_stream_id stream);

/* Copies up to `capacity` ids of the initialized streams into `ids` (may be
 * NULL when capacity is 0) and sets *count to how many exist.
 * Errors: CUBE_ERR_INVALID_ARGUMENT. */
CUBE_API CUBE_MUST_USE cube_error *cube_stream_ids(cube_client *client,
                                                   cube_stream_id *ids,
                                                   size_t capacity,
                                                   size_t *count);

/* --- barriers and checks
 * ------------------------------------------------------
 *
 * These follow the server contract word for word:
 * - cube_check: can the bytes of these handles be trusted right now? No
 *   barrier, answers at once from the failure store: CUBE_ERR_SEVERAL with
 *   one cause per failed buffer, or NULL. A device fault needs cube_sync.
 * - cube_sync: waits for all work on the calling stream (and, for each
 *   handle, the work that last wrote it on any stream), then reports the
 *   device fault (CUBE_ERR_DEVICE_FAULT) if the context is broken, and then
 *   the same answer as cube_check. With n == 0 it is the plain barrier plus
 *   the device fault. Blocks.
 * - cube_flush: submits all queued work and reports only a device fault,
 *   never a launch failure (that lives on the buffers). Does not wait for
 *   completion.
 * Other errors: CUBE_ERR_INVALID_ARGUMENT (client NULL, handles NULL with
 * n > 0), CUBE_ERR_NOT_FOUND (a released or foreign handle). */
CUBE_API CUBE_MUST_USE cube_error *
cube_check(cube_client *client, const cube_handle *handles, size_t n);
CUBE_API CUBE_MUST_USE cube_error *
cube_sync(cube_client *client, const cube_handle *handles, size_t n);
CUBE_API CUBE_MUST_USE cube_error *cube_flush(cube_client *client);

/* --- memory statistics --- */

typedef struct cube_memory_usage {
    uint64_t buffers;        /* live allocations */
    uint64_t bytes_in_use;   /* bytes asked for by live allocations */
    uint64_t bytes_padding;  /* bytes lost to alignment and size classes */
    uint64_t bytes_reserved; /* bytes held from the device */
    /* Memory other libraries own, wrapped as buffers (cube_wrap_memory),
     * of the whole client: counted apart, never in the pools above. */
    uint64_t foreign_buffers;
    uint64_t foreign_bytes;
} cube_memory_usage;

/* The calling stream's usage (the foreign fields: the client's). Errors:
 * CUBE_ERR_INVALID_ARGUMENT. */
CUBE_API CUBE_MUST_USE cube_error *
cube_memory_usage_get(cube_client *client, cube_memory_usage *out);

/* The totals of every stream of the client's device: the memory of all
 * the threads (and of every client of the device, which share its
 * streams), where cube_memory_usage_get counts the calling thread's stream
 * only. Each stream's part is read under that stream's lock, so the sum is
 * exact when nothing allocates meanwhile. The foreign fields: the
 * client's, as cube_memory_usage_get. Errors: CUBE_ERR_INVALID_ARGUMENT
 * (client or out NULL, the client is closing). */
CUBE_API CUBE_MUST_USE cube_error *
cube_memory_usage_device(cube_client *client, cube_memory_usage *out);

/* Releases memory the calling stream holds but no buffer uses (an
 * expandable pool's mapped pages that no live buffer touches among it).
 * Never frees a live buffer. Errors: CUBE_ERR_INVALID_ARGUMENT. */
CUBE_API CUBE_MUST_USE cube_error *cube_memory_cleanup(cube_client *client);

#ifdef __cplusplus
}
#endif

#endif /* CUBERT_CLIENT_H */
