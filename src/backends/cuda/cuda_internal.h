/* The CUDA backend's internals, shared by the files of src/backends/cuda.
 *
 * One server per device and process (every client of the device shares
 * it), on the device's primary context (shared with the CUDA runtime and the
 * libraries built on it, so device pointers pass between them). The client
 * creates the streams and owns them, each with its memory manager; the backend
 * gives each stream a non-blocking CUDA stream (a cuda_stream, the
 * cube_server_stream's impl) and the device memory its manager allocates
 * from. Pinned host memory goes through a pooled manager of the server's
 * own.
 *
 * Ordering across streams (docs/architecture.md): every operation a stream
 * submits gets the next value of the stream's sequence counter. A buffer
 * (cuda_block) remembers its last writer as (stream, sequence) and the
 * other streams that used it. A stream about to use a buffer last written
 * elsewhere makes its CUDA stream wait on the writer's event, recorded at
 * or after that write; a buffer touched by several streams has its
 * writer's event recorded right after each write, so the wait is for that
 * write and what came before it on that stream, not for later work. A
 * buffer released while other streams used it is given back only after
 * its owner stream was made to wait for those uses, and a block handed out
 * again starts with its owner's current position as its "writer", so a
 * first use elsewhere also waits for the memory's previous life.
 *
 * One file per concept, in layers: a file calls only functions of the
 * files listed before it here (tools/check-layers.sh checks it). From the
 * bottom up:
 *
 *   cuda_api.c       the driver and NVRTC, loaded with dlopen (cuda_api.h)
 *   cuda_context.c   the primary context, entering it, failed calls, faults
 *   cuda_events.c    the pool of CUDA events
 *   cuda_vmm.c       device virtual memory for expandable pools, the
 *                    gate that keeps frees and captures apart
 *   cuda_memory.c    device storage, frees deferred past captures, block
 *                    records, the memory slots, released blocks set aside
 *   cuda_copier.c    the threads that pack and unpack pageable memory
 *   cuda_pinned.c    the pinned pool, staging buffers, pinned blocks in
 *                    flight
 *   cuda_stream.c    stream open and close, the cross-stream event and
 *                    waits, sync and flush
 *   cuda_ordering.c  a buffer's last writer and users, the waits before a
 *                    use
 *   cuda_transfer.c  reads and writes, the open read, cuda_stream_begin
 *   cuda_kernels.c   compiling: NVRTC, module loading, the disk cache
 *   cuda_launch.c    launches: arguments, dynamic cube counts
 *   cuda_watchdog.c  the thread that aborts a stalled NCCL communicator
 *                    between processes, and how its calls ended
 *   cuda_peer.c      copies between devices (copy_to_peer)
 *   cuda_collective.c  NCCL communicators and collectives, the
 *                    backend's comm table (NCCL through nccl_api.h)
 *   cuda_graph.c     capture, replay, destroy
 *   cuda_profile.c   profiling windows
 *   cuda_server.c    properties, open and destroy, the vtable, the backend
 *
 * The structures come first (every layer sees them); then one section per
 * file, in the same order.
 */
#ifndef CUBE_CUDA_INTERNAL_H
#define CUBE_CUDA_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "base/mutex.h"
#include "backends/common/disk_cache.h"
#include "backends/common/vm_defer.h"
#include "backends/cuda/cuda_api.h"
#include "backends/cuda/nccl_api.h"
#include "cubert/backend/comm.h"
#include "cubert/backend/errors.h"
#include "cubert/backend/server.h"
#include "memory/memory_manager.h"

#define CUDA_ALIGNMENT 256
#define CUDA_USE_SLOTS 4  /* foreign streams a block tracks exactly */
#define CUDA_MAX_PEERS 64 /* devices peer access is tracked for */

/* (stream index + 1) << 48 | sequence; 0 for "none". */
#define CUDA_TAG(index, seq) ((((uint64_t)(index) + 1) << 48) | (seq))
#define CUDA_TAG_INDEX(tag) ((uint32_t)((tag) >> 48) - 1)
#define CUDA_TAG_SEQ(tag) ((tag) & (((uint64_t)1 << 48) - 1))

typedef struct cuda_server cuda_server;
typedef struct cuda_stream cuda_stream;

/* A buffer's device memory and its cross-stream state; the storage's
 * cookie. */
typedef struct cuda_block {
    cube_storage inner; /* what the stream's manager handed out */
    cuda_stream *owner;
    _Atomic uint64_t writer;               /* last writer's tag */
    _Atomic uint64_t uses[CUDA_USE_SLOTS]; /* other streams' last uses */
    atomic_int shared;                     /* used on two streams or more */
    atomic_int many;                       /* more users than slots */
    struct cuda_block *next_free;          /* in the server's free list */
} cuda_block;

/* A released block that other streams used: it goes back to its pool
 * once each of their events, recorded after their uses, has completed. */
typedef struct cuda_pending_free {
    cuda_block *blk;
    uint32_t count;
    struct {
        uint32_t index; /* the stream */
        uint64_t seq;   /* its operation to wait for */
    } waits[CUDA_USE_SLOTS + 1];
} cuda_pending_free;

/* A block of pinned host memory in flight: given back once `event` (on
 * the stream that used it) has completed. */
typedef struct cuda_inflight {
    cube_storage pinned;
    CUevent event;
} cuda_inflight;

/* A reservation of device address space: an expandable pool's range
 * (cuda_vmm.c). `defer` holds the pages the manager unmapped that are
 * still mapped (whole chunks): behind an event on the owner stream, or (no
 * event) while a capture ran. */
typedef struct cuda_vm_range {
    uint64_t base, size;
    /* One bit per page: mapped by the driver (deferred pages included),
     * and first page of a chunk (one cuMemCreate + cuMemMap, unmapped
     * whole); `heads` shares `mapped`'s allocation. */
    uint64_t *mapped, *heads;
    vm_defer defer;      /* markers are CUevents of the server's pool */
    cuda_stream *stream; /* the owner */
    struct cuda_vm_range *next;
} cuda_vm_range;

/* The backend's side of a stream (its cube_server_stream's impl). */
struct cuda_stream {
    cuda_server *server;
    cube_server_stream *base; /* id, index, the stream's memory manager */
    uint32_t index;           /* base->index */
    CUstream cu;
    /* Operations submitted; bumped by the stream's own calls and by
     * releases from other threads that make it wait. */
    _Atomic uint64_t seq;
    /* The cross-stream event and the sequence its last record covers;
     * under `lock` (other streams record and wait on it). */
    cube_mutex lock;
    CUevent event;
    uint64_t event_seq CUBE_GUARDED_FIELD(lock);
    /* The highest sequence of each other stream this one already waits
     * for; touched only by calls on this stream (the client serializes
     * them). Indexed by stream index. */
    uint64_t *waited;
    uint32_t waited_cap;
    /* Pinned blocks of finished-or-not transfers, oldest first; touched
     * only by calls on this stream. */
    cuda_inflight *inflight;
    size_t inflight_head, inflight_count, inflight_cap;
    uint64_t inflight_bytes;
    CUevent done; /* recorded to wait for this stream's own transfers */
    /* Capture state (calls on this stream only). */
    int capturing;
    uint64_t reserved_at_begin;
    cuda_block **captured;
    size_t captured_count, captured_cap;
    int capture_failed; /* a launch was refused inside the capture */
    /* Released blocks waiting for other streams' uses (under
     * pending_lock: releases come from any thread). */
    cube_mutex pending_lock;
    cuda_pending_free *pending CUBE_GUARDED_FIELD(pending_lock);
    size_t pending_count CUBE_GUARDED_FIELD(pending_lock);
    size_t pending_cap CUBE_GUARDED_FIELD(pending_lock);
    atomic_int has_pending;
    /* 16 bytes of pinned memory a dynamic cube count is read into. */
    cube_storage count_host;
    /* The reservations of the stream's expandable pools; under the
     * stream's memory manager's lock (the manager calls the storage's
     * virtual-memory functions under it). */
    cuda_vm_range *vm_ranges;
    /* The latest read whose completion has no event yet (under `lock`):
     * its wait synchronizes the stream, unless more work is submitted
     * first, which records the read's event before it (cuda_stream_seal).
     * A blocking read thus costs one driver call less. */
    _Atomic(cube_pending *) open_read;
};

/* The copy helpers (cuda_copier.c). */
typedef struct cuda_copier cuda_copier;

struct cuda_server {
    cube_server base;
    const cuda_api *api;
    CUdevice device;
    CUcontext ctx;
    int ordinal;
    cube_properties props;
    uint64_t serial; /* process-unique; keys per-thread caches */
    int arch_major, arch_minor;
    int optin_shared; /* bytes a block may opt in to */
    atomic_int faulted;

    disk_cache *cache;

    /* Block records: slabs, and the free list behind the per-thread
     * caches (cuda_memory.c). */
    cube_mutex blocks_lock;
    cuda_block *free_blocks CUBE_GUARDED_FIELD(blocks_lock);
    void **slabs CUBE_GUARDED_FIELD(blocks_lock);
    size_t slab_count CUBE_GUARDED_FIELD(blocks_lock);

    /* Pinned host memory: the staging manager and the buffers handed out
     * through cube_staging (to tell pinned sources from pageable ones). */
    mem_manager *pinned;
    cube_mutex staging_lock;
    cube_storage *staging CUBE_GUARDED_FIELD(staging_lock);
    size_t staging_count CUBE_GUARDED_FIELD(staging_lock);
    size_t staging_cap CUBE_GUARDED_FIELD(staging_lock);
    cuda_copier *copier;

    /* Streams capturing now, and the memory whose release waits for them
     * to end: freeing device or pinned memory may synchronize, which
     * would break a capture on another thread. */
    atomic_int captures;
    cube_mutex deferred_lock;
    struct cuda_deferred *deferred CUBE_GUARDED_FIELD(deferred_lock);
    size_t deferred_count CUBE_GUARDED_FIELD(deferred_lock);
    size_t deferred_cap CUBE_GUARDED_FIELD(deferred_lock);
    /* Frees running now, each with no lock held (a free may wait for a
     * stream): a capture starts only when there are none, and a free
     * starts only when no capture runs. */
    int frees_running CUBE_GUARDED_FIELD(deferred_lock);
    pthread_cond_t frees_idle; /* frees_running reached 0 */
    /* Reservations released while a capture ran (cuda_vmm.c). */
    cuda_vm_range *vm_later CUBE_GUARDED_FIELD(deferred_lock);

    /* Virtual memory (cuda_vmm.c, set at open): the page size, 0 when the
     * driver or device has none; the allocation each page gets; the
     * devices that may read and write it. */
    size_t vm_granularity;
    cuda_mem_allocation_prop vm_prop;
    cuda_mem_access_desc vm_access[CUDA_MAX_PEERS];
    size_t vm_access_count;
    atomic_int vm_unmap_warned;

    /* Devices whose memory this context was asked to reach (peer access
     * tried once each, by ordinal). */
    atomic_int peer_tried[CUDA_MAX_PEERS];

    /* Events for profiling windows, transfers and reads, recycled
     * (cuda_events.c). */
    cube_mutex events_lock;
    CUevent *free_events CUBE_GUARDED_FIELD(events_lock);
    size_t free_event_count CUBE_GUARDED_FIELD(events_lock);
    size_t free_event_cap CUBE_GUARDED_FIELD(events_lock);
};

/* The stream at `index` of the client (which created it), and how many
 * the client has; lock-free, any thread. */
static inline cuda_stream *cuda_stream_at(cuda_server *s, uint32_t index)
{
    return cube_server_stream_at(&s->base, index)->impl;
}
static inline uint32_t cuda_stream_count(cuda_server *s)
{
    return cube_server_stream_count(&s->base);
}

/* --- cuda_context.c --- */
/* Makes the server's context current on the calling thread. */
cube_error *cuda_enter(cuda_server *s);
/* A cube_error for a failed driver call; notes a device fault. */
cube_error *cuda_fail(cuda_server *s, CUresult r, cube_code code,
                      const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* A cube_error for a failed allocation (cuda_alloc_code): a sticky error
 * is noted as cuda_fail notes it; any other error once the context is
 * broken is CUBE_ERR_DEVICE_FAULT too, never CUBE_ERR_OUT_OF_MEMORY. */
cube_error *cuda_fail_alloc(cuda_server *s, CUresult r, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Retains the device's primary context into s->ctx and makes it current
 * (cuda_destroy releases it). Errors: CUBE_ERR_DEVICE_FAULT when an
 * earlier fault broke it for the rest of the process, CUBE_ERR_UNAVAILABLE
 * otherwise. */
cube_error *cuda_context_create(cuda_server *s);

/* --- cuda_events.c --- */
/* Events from the server's pool (timing enabled). */
cube_error *cuda_event_get(cuda_server *s, CUevent *out);
void cuda_event_put(cuda_server *s, CUevent ev);
/* Destroys the pooled events (at destroy). */
void cuda_events_destroy(cuda_server *s);

/* --- cuda_vmm.c --- */
/* The gate between frees and captures: cuda_free_begin counts a free as
 * running and returns 1 when no capture runs (no capture starts until
 * cuda_free_end), else returns 0 and the caller must not synchronize or
 * free now. */
int cuda_free_begin(cuda_server *s);
void cuda_free_end(cuda_server *s);
/* Finds whether the driver and device have virtual memory management
 * (at open): sets vm_granularity (0: none, logged at info), vm_prop and
 * vm_access. */
void cuda_vm_setup(cuda_server *s);
/* The storage's virtual-memory functions (`self` is the cuda_stream; see
 * cube_storage_ops): address space, pages mapped one allocation each,
 * unmapped after the stream's queued work, deferred past captures. */
cube_error *cuda_vm_reserve(void *self, uint64_t size, uint64_t align,
                            uint64_t *base);
cube_error *cuda_vm_map(void *self, uint64_t address, uint64_t size);
void cuda_vm_unmap(void *self, uint64_t address, uint64_t size);
void cuda_vm_release(void *self, uint64_t base, uint64_t size);
/* Frees reservations released while captures ran (a list linked by
 * next), as a running free. */
void cuda_vm_free_ranges(cuda_server *s, cuda_vm_range *list);

/* --- cuda_memory.c --- */
/* The storage of a stream's memory manager (`self` is its cuda_stream):
 * cuMemAlloc, and cuMemFree through cuda_free_later. */
cube_error *cuda_device_alloc(void *self, uint64_t size, uint64_t align,
                              uint64_t *address);
void cuda_device_free(void *self, uint64_t address, uint64_t size);
/* Memory given back while a capture was running: freed when none is. */
typedef struct cuda_deferred {
    cuda_stream *stream; /* device memory: the stream whose pool it was */
    uint64_t address;    /* NULL stream: pinned host memory */
} cuda_deferred;
/* Frees device or pinned memory now, or after the running captures end.
 * `stream` is the owner of device memory, NULL for pinned memory. */
void cuda_free_later(cuda_server *s, cuda_stream *stream, uint64_t address);
/* Frees what was deferred, when no capture runs (or all of it, when
 * `force`, at destroy). */
void cuda_free_deferred(cuda_server *s, int force);
/* Gives back the stream's released blocks whose other-stream uses have
 * completed; with `wait`, waits for all of them first. */
void cuda_pending_reap(cuda_server *s, cuda_stream *st, int wait);
/* The memory slots of the vtable. */
cube_error *cuda_initialize_memory(cube_server *server,
                                   cube_server_stream *stream, uint64_t size,
                                   cube_storage *out);
void cuda_release_memory(cube_server *server, cube_server_stream *stream,
                         cube_storage *storage);
void cuda_memory_reclaim(cube_server *server, cube_server_stream *stream);
/* Foreign device memory (cube_wrap_memory): checked to be this device's,
 * given a block record; given back once no queued work can touch it. */
cube_error *cuda_wrap_memory(cube_server *server, cube_server_stream *stream,
                             uint64_t address, uint64_t size,
                             cube_storage *out);
void cuda_unwrap_memory(cube_server *server, cube_server_stream *stream,
                        cube_storage *storage);

/* --- cuda_copier.c --- */
/* Starts the helper threads (fewer when threads cannot be created); NULL
 * when out of memory. */
cuda_copier *cuda_copier_create(void);
/* Stops the helpers and frees them (NULL: nothing). */
void cuda_copier_destroy(cuda_copier *c);
/* memcpy, spread over the helpers when large and when they are free. */
void cuda_copy_bytes(cuda_copier *c, void *dst, const void *src,
                     uint64_t bytes);

/* --- cuda_pinned.c --- */
/* The pinned pool and the copy helpers, at open; destroy frees both and
 * the staging list. */
cube_error *cuda_pinned_create(cuda_server *s);
void cuda_pinned_destroy(cuda_server *s);
/* The staging slots of the vtable: pinned buffers for the client. */
cube_error *cuda_staging(cube_server *server, const uint64_t *sizes, size_t n,
                         void **out);
void cuda_staging_free(cube_server *server, void *buffer);
/* Whether [p, p + bytes) lies inside a buffer handed out by cube_staging. */
int cuda_is_pinned(cuda_server *s, const void *p, uint64_t bytes);
/* Gives back the stream's finished pinned blocks; with `all`, waits for
 * the rest first. */
cube_error *cuda_inflight_reap(cuda_server *s, cuda_stream *st, int all);
/* Hands `pinned` to the stream until the work enqueued so far is done. */
cube_error *cuda_inflight_push(cuda_server *s, cuda_stream *st,
                               cube_storage *pinned);
/* A pinned block of `bytes` for a write on `st`, after giving back what
 * finished and, past the limit, waiting for the oldest. */
cube_error *cuda_stage(cuda_server *s, cuda_stream *st, uint64_t bytes,
                       cube_storage *out);

/* --- cuda_stream.c --- */
/* The stream slots of the vtable. */
/* The preset a new stream's pools start with (cuda_memory_preset:
 * expandable unless set otherwise, subslices without virtual memory). */
uint32_t cuda_memory_preset(const cuda_server *s);
cube_error *cuda_stream_open(cube_server *server, cube_server_stream *stream,
                             cube_storage_ops *storage);
void cuda_stream_close(cube_server *server, cube_server_stream *stream);
/* Counts an operation submitted on `st`; returns its sequence. */
static inline uint64_t cuda_stream_next(cuda_stream *st)
{
    return atomic_fetch_add(&st->seq, 1) + 1;
}
/* Records `st`'s cross-stream event to cover everything submitted (the
 * _locked form: with st->lock held). */
cube_error *cuda_stream_record(cuda_server *s, cuda_stream *st);
CUresult cuda_stream_record_locked(cuda_server *s, cuda_stream *st)
    CUBE_REQUIRES(st->lock);
/* Makes `st` wait for stream `index` up to `seq`. */
cube_error *cuda_stream_wait_for(cuda_server *s, cuda_stream *st,
                                 uint32_t index, uint64_t seq);
/* The barrier slots of the vtable. */
cube_error *cuda_sync(cube_server *server, cube_server_stream *stream,
                      const cube_binding *bindings, size_t n);
cube_error *cuda_flush(cube_server *server, cube_server_stream *stream);

/* --- cuda_ordering.c --- */
/* Orders `st` after the last write of `blk` on another stream and, when
 * `write`, after other streams' earlier uses of it. Call before submitting
 * work on `st` that touches `blk` (inside a capture it notes the block for
 * the graph instead). */
cube_error *cuda_block_before_use(cuda_server *s, cuda_stream *st,
                                  cuda_block *blk, int write);
/* Notes that the operation `seq` just submitted on `st` used `blk` (wrote
 * it, when `written`). Returns whether the operation wrote a block other
 * streams share: the caller then records its event once for all its
 * outputs, so later waits are for this write. A read is not recorded
 * (an event record per launch or copy costs the device a step): a writer
 * elsewhere, or the block's release, records the reading stream's event
 * when it needs it (cuda_stream_wait_for, use_done), covering the read
 * and maybe later work. Sequences come from cuda_stream_next. */
int cuda_block_used(cuda_stream *st, cuda_block *blk, uint64_t seq,
                    int written);

/* --- cuda_transfer.c --- */
/* The backend's side of `stream`, with the server's context current and
 * its open read sealed: the preamble of every call that enqueues work. */
cube_error *cuda_stream_begin(cuda_server *s, cube_server_stream *stream,
                              cuda_stream **out);
cube_error *cuda_read(cube_server *server, cube_server_stream *stream,
                      const cube_copy_op *ops, size_t n, void *const *dst,
                      cube_pending **pending);
cube_error *cuda_read_wait(cube_server *server, cube_pending *pending);
int cuda_read_poll(cube_server *server, cube_pending *pending);
cube_error *cuda_write(cube_server *server, cube_server_stream *stream,
                       const cube_copy_op *ops, size_t n,
                       const void *const *src);
/* The interop slots: the stream's CUstream, and foreign work on it that
 * wrote a buffer. */
cube_error *cuda_native_stream(cube_server *server, cube_server_stream *stream,
                               void **out);
cube_error *cuda_native_written(cube_server *server, cube_server_stream *stream,
                                const cube_binding *binding);
cube_error *cuda_native_ready(cube_server *server, cube_server_stream *stream,
                              const cube_binding *binding, void *foreign);
cube_error *cuda_native_wait(cube_server *server, cube_server_stream *stream,
                             void *foreign);

/* --- cuda_kernels.c --- */
#define CUDA_ENTRY_PARAMS (1 + 2 * CUBE_MAX_PARAMS)
#define CUDA_PARAM_BUFFER 4096 /* the driver's limit on parameter bytes */

/* A compiled kernel: cube_compiled's impl. */
typedef struct cuda_kernel {
    CUmodule module;
    CUfunction function;
    uint32_t shared_bytes;
    /* The entry's parameters packed as the driver lays them out (offsets
     * from cuFuncGetParamInfo): a launch hands over one buffer instead of
     * a pointer per parameter. packed_bytes 0: not available. */
    uint32_t packed_bytes;
    uint16_t offset[CUDA_ENTRY_PARAMS];
    /* A raw kernel (cube_kernel_create_raw): its entry takes the declared
     * parameters as they are, a device pointer per buffer and a scalar by
     * value, with no ABI tag and no lengths. */
    int raw;
    /* A validating module (CUBE_LAUNCH_VALIDATE): its cube__oob_record
     * global, which each launch zeroes before and reads back after the
     * kernel, under oob_lock (validating launches of one module take
     * turns). oob_addr 0: not validating. */
    CUdeviceptr oob_addr;
    size_t oob_bytes;
    cube_mutex oob_lock;
} cuda_kernel;

/* The stamp: a device global every module carries, naming the disk cache
 * entry (key and key material) it was built for, added to the source
 * after the key is made (the CPU backend's cube__jit_stamp, on CUDA). */
#define CUDA_STAMP_SYMBOL "cube__cuda_stamp"
#define CUDA_STAMP_PREFIX "cubert-cuda-stamp "
#define CUDA_STAMP_BUF 96
/* The stamp text of entry `key`. */
void cuda_stamp_text(const disk_cache_key *key, char *buf, size_t size);
/* `source` with the stamp's definition after it; NULL for want of memory. */
char *cuda_stamped_source(const char *source, const disk_cache_key *key);
/* Why the artifact `bytes` cannot be entry `key`'s, or NULL when it may
 * be: a CUBIN holds its stamp's text verbatim (its initialized globals'
 * bytes); PTX spells it as numbers, so only the loaded module tells. */
const char *cuda_artifact_wrong(const unsigned char *bytes, size_t len,
                                int cubin, const disk_cache_key *key);
/* Why a loaded module's stamp (`found`: the global's bytes, `n` of them)
 * is not entry `key`'s, or NULL when it is. */
const char *cuda_module_stamp_wrong(const char *found, size_t n,
                                    const disk_cache_key *key);

cube_error *cuda_compile(cube_server *server, const cube_kernel *kernel,
                         uint32_t mode, cube_compiled *out);
void cuda_compiled_release(cube_server *server, cube_compiled *compiled);

/* --- cuda_launch.c --- */
cube_error *cuda_launch(cube_server *server, cube_server_stream *stream,
                        const cube_dispatch *dispatch);

/* --- cuda_watchdog.c --- */
/* Watches the NCCL communicator `comm` of a rank between processes: a
 * call that runs on the device past `timeout_ns` without finishing, or an
 * asynchronous NCCL error, aborts it (one thread per process looks).
 * Errors: CUBE_ERR_OUT_OF_MEMORY, CUBE_ERR_RESOURCE_LIMIT (the thread
 * could not start). close forgets it (the communicator is the caller's)
 * and answers whether the communicator was aborted (then it is freed). */
typedef struct cuda_watch cuda_watch;
cube_error *cuda_watch_open(cuda_server *s, const nccl_api *nccl,
                            ncclComm_t comm, uint64_t timeout_ns,
                            cuda_watch **out);
int cuda_watch_close(cuda_watch *w);
/* The rank's NCCL calls go between acquire (1: the communicator was
 * aborted; nothing is held) and release; abort_locked aborts it once,
 * between them. */
int cuda_watch_acquire(cuda_watch *w);
void cuda_watch_release(cuda_watch *w);
void cuda_watch_abort_locked(cuda_watch *w);
/* Aborts it from any thread without waiting for the rank's thread (the
 * watchdog finishes the abort when that thread is inside NCCL). */
void cuda_watch_abort(cuda_watch *w);
/* A call: begin records its start on `cu` before NCCL enqueues it and
 * names it (*ticket); end records its end after; cancel forgets one NCCL
 * refused. Errors: CUBE_ERR_OUT_OF_MEMORY, a driver error. */
cube_error *cuda_watch_begin(cuda_watch *w, CUstream cu, uint64_t *ticket);
cube_error *cuda_watch_end(cuda_watch *w, CUstream cu, uint64_t ticket);
void cuda_watch_cancel(cuda_watch *w, uint64_t ticket);
/* How call `ticket` ended (the comm table's poll slot's contract). */
cube_error *cuda_watch_poll(cuda_watch *w, uint64_t ticket, int *done);

/* --- cuda_peer.c --- */
/* The copy_to_peer slot of the vtable. */
cube_error *cuda_copy_to_peer(cube_server *server, cube_server_stream *stream,
                              const cube_binding *src, cube_server *peer,
                              cube_server_stream *peer_stream,
                              const cube_binding *dst);

/* --- cuda_collective.c --- */
/* cube_backend.comm: NCCL communicators in one process (one group,
 * blocking) and between processes (NCCL's unique id as the id's payload,
 * non-blocking, watched by cuda_watchdog.c). */
extern const cube_comm_vtable cuda_comm_vtable;

/* --- cuda_graph.c --- */
cube_error *cuda_begin_capture(cube_server *server, cube_server_stream *stream);
cube_error *cuda_end_capture(cube_server *server, cube_server_stream *stream,
                             uint64_t *graph);
cube_error *cuda_replay(cube_server *server, cube_server_stream *stream,
                        uint64_t graph);
void cuda_graph_destroy(cube_server *server, cube_server_stream *stream,
                        uint64_t graph);

/* --- cuda_profile.c --- */
cube_error *cuda_start_profile(cube_server *server, cube_server_stream *stream,
                               uint64_t *token);
cube_error *cuda_end_profile(cube_server *server, cube_server_stream *stream,
                             uint64_t token, double *seconds,
                             cube_timing_method *method);
void cuda_abandon_profile(cube_server *server, cube_server_stream *stream,
                          uint64_t token);

/* cuda_server.c shares nothing: it defines cube_backend_cuda. */

#endif /* CUBE_CUDA_INTERNAL_H */
