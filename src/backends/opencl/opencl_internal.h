/* The OpenCL backend's internals, shared by its files:
 *   opencl_api.c      the ICD loader, loaded at run time
 *   opencl_server.c   devices, properties, the server's lifetime, the vtable
 *   opencl_memory.c   device memory (pages), streams as queues, ordering
 *                     across streams, copies, sync and flush
 *   opencl_kernels.c  compiling cube C (disk cache, signature) and launches
 *   opencl_profile.c  profiling windows from queue timestamps
 *
 * Memory. A pool page is one cl_mem. The stream's memory manager deals in
 * 64-bit addresses, so every page gets one made up: its slot in the
 * server's page table shifted left by OPENCL_PAGE_SHIFT. A binding's
 * address then names its page (the high bits) and its byte offset in it
 * (the low bits); a kernel receives the page's cl_mem and the offset, and
 * the prelude adds them. No address is ever dereferenced on the host
 * (CUBE_FEATURE_HOST_MEMORY is not set).
 *
 * Streams. Each stream is an in-order command queue. Work on one stream
 * that follows work on another must wait for it (a read of what another
 * stream wrote, a write over what it read): before each command a stream
 * waits for a marker on every other stream that has enqueued something
 * since it last waited for that stream. That orders all earlier work of
 * the device before the command, more than the last writer alone (CUDA's
 * backend follows each buffer), and costs nothing while one stream works
 * alone.
 *
 * Lock order (docs/threading.md): `opencl_kernel.lock` (5) is taken under
 * the stream's lock (3) and held across setting a kernel's arguments and
 * enqueueing it, and across a validating launch's wait;
 * `opencl_server.pages_lock` (11) guards the page table's free slots.
 */
#ifndef CUBE_OPENCL_INTERNAL_H
#define CUBE_OPENCL_INTERNAL_H

#include <stdatomic.h>
#include <stdint.h>

#include "backends/common/disk_cache.h"
#include "backends/opencl/opencl_api.h"
#include "base/mutex.h"
#include "cubert/backend/errors.h"
#include "cubert/backend/server.h"

/* A page's made-up address: slot << 40, so a page may hold up to 1 TiB
 * and the table up to OPENCL_PAGE_CHUNKS * OPENCL_CHUNK_PAGES pages. Slot
 * 0 is never used (address 0 stays invalid). */
#define OPENCL_PAGE_SHIFT 40
#define OPENCL_OFFSET_MASK ((1ull << OPENCL_PAGE_SHIFT) - 1)
#define OPENCL_CHUNK_PAGES 256u
#define OPENCL_PAGE_CHUNKS 4096u

/* The size of an OpenCL object handle (cl_mem, cl_event: pointers to
 * opaque structs), as a kernel argument or an array element. */
#define OPENCL_HANDLE_SIZE sizeof(void *)

/* Every buffer's address (its offset in its page) is a multiple of this:
 * at least the device's CL_DEVICE_MEM_BASE_ADDR_ALIGN and a cache line. */
#define OPENCL_MIN_ALIGNMENT 128u

/* A page: its memory object and size (for wrapping part of it). */
typedef struct opencl_page {
    cl_mem mem;
    uint64_t size;
} opencl_page;

typedef struct opencl_server {
    cube_server base; /* first: the client reaches the vtable through it */
    const opencl_api *api;
    uint32_t index;
    cl_platform_id platform;
    cl_device_id device;
    cl_context context;
    cube_properties props;
    char platform_name[128];
    char driver_version[128];
    char c_version[64];
    int fp64;          /* cl_khr_fp64 */
    int int64_atomics; /* cl_khr_int64_base_atomics and _extended_ */
    disk_cache *cache;
    /* A word kernels set through cube_trap(); read at each sync once a
     * kernel that calls it was compiled (trap_kernels). */
    cl_mem trap;
    atomic_uint trap_kernels;
    atomic_int fault_claimed; /* the first breakage writes `fault` */
    atomic_int faulted;
    char fault[256]; /* why, written once before `faulted` is set */

    /* The page table: chunks are made on demand and kept to the end, so a
     * lookup needs no lock. */
    opencl_page *_Atomic chunks[OPENCL_PAGE_CHUNKS];
    cube_mutex pages_lock;
    uint32_t page_next CUBE_GUARDED_FIELD(pages_lock);  /* slots used so far */
    uint32_t *page_free CUBE_GUARDED_FIELD(pages_lock); /* freed slots */
    uint32_t page_free_count CUBE_GUARDED_FIELD(pages_lock);
    uint32_t page_free_cap CUBE_GUARDED_FIELD(pages_lock);
} opencl_server;

/* A stream's side: its queue, how far it has waited for each other
 * stream, and scratch for bounds-checked launches. Touched only by calls
 * for this stream (the client serializes them), except `queue` and `seq`,
 * which other streams read to wait for it. */
typedef struct opencl_stream {
    cl_command_queue queue;
    _Atomic uint64_t seq; /* commands enqueued so far */
    uint64_t *seen;       /* per stream index: its seq this one waited for */
    uint32_t seen_cap;
    cl_mem sinks; /* per-unit slots of checked and validating launches */
    uint64_t sink_bytes;
} opencl_stream;

/* --- opencl_server.c --- */
/* An OpenCL error as a cubert error: CUBE_ERR_OUT_OF_MEMORY for the codes
 * that mean it, else `code`, the message formatted and followed by the
 * OpenCL code's name. */
cube_error *opencl_fail(cl_int r, cube_code code, const char *fmt, ...)
    CUBE_PRINTF(3, 4);
/* NULL, or CUBE_ERR_DEVICE_FAULT with the reason once the device broke. */
cube_error *opencl_fault_check(opencl_server *s);
/* Breaks the device (sticky): every later call reports `why`. */
void opencl_fault_set(opencl_server *s, const char *why);

/* --- opencl_memory.c --- */
cube_error *opencl_stream_open(cube_server *server, cube_server_stream *stream,
                               cube_storage_ops *storage);
void opencl_stream_close(cube_server *server, cube_server_stream *stream);
/* The cl_mem and byte offset behind a made-up address. */
cl_mem opencl_page_of(opencl_server *s, uint64_t address, uint64_t *offset);
/* The events a command waits for: markers on the other streams. */
typedef struct opencl_wait_list {
    cl_event small[8];
    cl_event *events; /* small, or a bigger array of its own */
    cl_uint n;
} opencl_wait_list;
/* Before a command on `stream`: a marker on every other stream that has
 * enqueued work since this one last waited for it, in *w (release with
 * opencl_waits_release once the command is enqueued, whatever happened).
 * Errors: CUBE_ERR_OUT_OF_MEMORY, a driver error. */
cube_error *opencl_waits(opencl_server *s, cube_server_stream *stream,
                         opencl_wait_list *w);
void opencl_waits_release(opencl_server *s, opencl_wait_list *w);
/* After a command was enqueued on the stream. */
static inline void opencl_enqueued(opencl_stream *st)
{
    atomic_fetch_add_explicit(&st->seq, 1, memory_order_release);
}
/* The stream's scratch of at least `bytes`, grown (never shrunk) as
 * launches need. Errors: CUBE_ERR_OUT_OF_MEMORY. */
cube_error *opencl_sinks(opencl_server *s, opencl_stream *st, uint64_t bytes,
                         cl_mem *out);
cube_error *opencl_read(cube_server *server, cube_server_stream *stream,
                        const cube_copy_op *ops, size_t n, void *const *dst,
                        cube_pending **pending);
cube_error *opencl_write(cube_server *server, cube_server_stream *stream,
                         const cube_copy_op *ops, size_t n,
                         const void *const *src);
cube_error *opencl_sync(cube_server *server, cube_server_stream *stream,
                        const cube_binding *bindings, size_t n);
cube_error *opencl_flush(cube_server *server, cube_server_stream *stream);
cube_error *opencl_native_stream(cube_server *server,
                                 cube_server_stream *stream, void **out);
/* wrap_memory: [address, address + size) must lie in one of this
 * device's pages (an address cube_native_buffer_get gave); the storage
 * names it as it is. native_wait: the stream waits for the work issued
 * so far on `foreign`, a command queue of this device's context (NULL:
 * nothing to wait for; CUDA's stream names are refused). */
cube_error *opencl_wrap_memory(cube_server *server, cube_server_stream *stream,
                               uint64_t address, uint64_t size,
                               cube_storage *out);
cube_error *opencl_native_wait(cube_server *server, cube_server_stream *stream,
                               void *foreign);

/* --- opencl_kernels.c --- */
cube_error *opencl_compile(cube_server *server, const cube_kernel *kernel,
                           uint32_t mode, cube_compiled *out);
void opencl_compiled_release(cube_server *server, cube_compiled *compiled);
cube_error *opencl_launch(cube_server *server, cube_server_stream *stream,
                          const cube_dispatch *dispatch);

/* --- opencl_profile.c --- */
cube_error *opencl_start_profile(cube_server *server,
                                 cube_server_stream *stream, uint64_t *token);
cube_error *opencl_end_profile(cube_server *server, cube_server_stream *stream,
                               uint64_t token, double *seconds,
                               cube_timing_method *method);
void opencl_abandon_profile(cube_server *server, cube_server_stream *stream,
                            uint64_t token);

#endif /* CUBE_OPENCL_INTERNAL_H */
