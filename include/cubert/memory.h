/* cubert — memory pools, layouts, reports and allocation modes.
 *
 * Each stream has its own memory manager: a list of pools in routing order
 * plus a persistent pool. A request goes to the first pool whose slice
 * range holds its size; a pool at its cap spills the request over to the
 * next pool that can hold it; a request no pool holds gets a buffer of its
 * own size (the large tail). Pools:
 *  - sliced: pages carved into aligned slices; neighbouring free slices
 *    merge; free slices are found by size class, at a cost that does not
 *    grow with the number of live buffers. Pages are `page_size` bytes,
 *    except in a pool whose page_size is above the device's page limit
 *    (min(256 MiB, the largest power of two <= memory / 8)): there each
 *    new page is sized to the request that needs it (rounded to 2 MiB, at
 *    least a quarter of the limit, at most page_size), and later requests
 *    split it;
 *  - exclusive: one buffer per page; pages unused for `release_after_ms`
 *    are given back;
 *  - expandable: one range of address space, reserved at the pool's first
 *    buffer (its cap, or the device's memory when it has none), carved
 *    into aligned blocks like one sliced page that grows in place: free
 *    blocks are found by size class and merge with free neighbours, and
 *    the range's pages (2 MiB on the host) are mapped when a block first
 *    covers them. A release never unmaps: pages stay mapped, counted as
 *    reserved, until cube_memory_cleanup or an out-of-memory retry unmaps
 *    every page no live buffer touches; so a request served from pages
 *    already mapped makes no call to the device, and what the pool
 *    reserves is what its buffers cover, rounded out to whole pages, plus
 *    the free pages it keeps mapped. It needs a device whose storage has
 *    virtual memory (the CPU and null backends' host memory; CUDA devices
 *    whose driver has virtual memory management, CUDA 10.2+);
 *    cube_install_memory_pools refuses it elsewhere. A capped expandable
 *    pool whose range has no free run for a request spills it over like a
 *    sliced pool at its cap; an uncapped one answers
 *    CUBE_ERR_OUT_OF_MEMORY. Its memory is the calling stream's, like
 *    every pool's: the range goes back when the stream's pools are
 *    rebuilt or the device closes, and the same thread-safety rules apply;
 *  - persistent: exact-size reuse for long-lived buffers and graphs, used
 *    while the stream's allocation mode is persistent.
 *
 * Out of memory: a request the device refuses first releases what the
 * stream holds but does not use, then retries once
 * (CUBE_ERR_OUT_OF_MEMORY if that fails too). CUBE_ERR_BUFFER_TOO_BIG is
 * for a request that can never fit; CUBE_ERR_POOL_CAPACITY_EXCEEDED for a
 * configured cap that every pool able to hold the request has reached.
 *
 * Thread safety: all calls may be made from any thread; they act on the
 * calling thread's stream.
 */
#ifndef CUBERT_MEMORY_H
#define CUBERT_MEMORY_H

#include <stdint.h>

#include "cubert/buffer.h"
#include "cubert/client.h"

#ifdef __cplusplus
extern "C" {
#endif

#define CUBE_MAX_POOLS 16

typedef enum cube_pool_kind {
    CUBE_POOL_SLICED = 0,
    CUBE_POOL_EXCLUSIVE = 1,
    CUBE_POOL_PERSISTENT = 2, /* reports only: not part of a layout */
    CUBE_POOL_EXPANDABLE = 3  /* needs a storage with virtual memory */
} cube_pool_kind;

typedef struct cube_pool_config {
    cube_pool_kind kind;
    /* Sliced: bytes per page, or the largest page when above the device's
     * page limit (see above). Exclusive: the largest page (each page is its
     * request rounded to the alignment). Expandable: the largest block
     * (the range is the cap, or the device's memory). A multiple of the
     * alignment. */
    uint64_t page_size;
    uint64_t min_size;         /* smallest request routed here (inclusive) */
    uint64_t max_size;         /* largest request routed here (inclusive);
                                  <= page_size */
    uint64_t cap;              /* most bytes the pool may reserve; 0: no cap.
                                  Expandable: the size of its range */
    uint32_t release_after_ms; /* exclusive pages unused this long go
                                  back; 0: only at cleanup (sliced and
                                  expandable pools: ignored) */
} cube_pool_config;

typedef struct cube_memory_layout {
    uint32_t count; /* pools in routing order, 1..CUBE_MAX_POOLS */
    cube_pool_config pools[CUBE_MAX_POOLS];
} cube_memory_layout;

typedef enum cube_layout_preset {
    /* Sliced pools of growing page sizes for small and medium buffers,
     * exclusive pages above: the default, except on CUDA devices with
     * virtual memory management, whose streams start with the expandable
     * preset (configuration key cuda_memory_preset). */
    CUBE_PRESET_SUBSLICES = 0,
    /* Exclusive pages only: one buffer per page. */
    CUBE_PRESET_EXCLUSIVE = 1,
    /* The subslices preset's first sliced pool (buffers up to 128 KiB on
     * large devices), then one expandable pool for every larger size (a
     * device whose storage has no virtual memory refuses it at install:
     * CUBE_ERR_UNSUPPORTED). */
    CUBE_PRESET_EXPANDABLE = 2
} cube_layout_preset;

/* The preset layout for this client's device (derived from its memory
 * size and alignment). Errors: CUBE_ERR_INVALID_ARGUMENT. */
CUBE_API CUBE_MUST_USE cube_error *
cube_memory_layout_preset(cube_client *client, cube_layout_preset preset,
                          cube_memory_layout *out);

/* Checks a layout against this client's device, with one specific
 * CUBE_ERR_INVALID_ARGUMENT message per mistake (naming the pool and
 * field): no pools or too many; a persistent pool in a layout; a page size
 * of zero or not a multiple of the alignment; min_size > max_size; a
 * max_size above the page size; a cap below one page; a pool that can
 * never be reached because earlier pools hold its whole range; a page
 * larger than the device. */
CUBE_API CUBE_MUST_USE cube_error *
cube_memory_layout_validate(cube_client *client,
                            const cube_memory_layout *layout);

/* Installs `layout` (validated first): streams created from now on build
 * their pools with it, and the calling stream's pools are rebuilt in place
 * when nothing is live in them.
 * Errors: CUBE_ERR_INVALID_ARGUMENT (a bad layout; nothing changes),
 * CUBE_ERR_POOLS_IN_USE (the calling stream kept its old layout because
 * buffers are live in it; the layout still applies to streams created
 * later — retry after releasing them), CUBE_ERR_UNSUPPORTED (the layout
 * has an expandable pool and the device's storage has no virtual memory;
 * nothing changes, for the calling stream or later ones),
 * CUBE_ERR_OUT_OF_MEMORY (the calling stream could not be created).
 * Every backend has configurable pools: the client owns each stream's
 * memory manager. */
CUBE_API CUBE_MUST_USE cube_error *
cube_install_memory_pools(cube_client *client,
                          const cube_memory_layout *layout);

/* --- reports --- */

typedef struct cube_pool_report {
    cube_pool_config config; /* kind PERSISTENT, or the large tail as an
                                EXCLUSIVE pool with page_size 0 */
    uint64_t pages, pages_peak;
    uint64_t buffers, buffers_peak;
    uint64_t bytes_in_use, bytes_in_use_peak;
    uint64_t bytes_reserved, bytes_reserved_peak;
    uint64_t largest_buffer; /* the largest request served, ever */
} cube_pool_report;

typedef struct cube_memory_report {
    /* The layout's pools in routing order, then the large tail, then the
     * persistent pool. */
    uint32_t count;
    cube_pool_report pools[CUBE_MAX_POOLS + 2];
    cube_memory_usage usage; /* the stream's totals */
} cube_memory_report;

/* The calling stream's report. Errors: CUBE_ERR_INVALID_ARGUMENT. */
CUBE_API CUBE_MUST_USE cube_error *
cube_memory_report_get(cube_client *client, cube_memory_report *out);

/* Sets every high-water mark of the calling stream to its current value
 * (the report's and cube_memory_stats'). Errors: CUBE_ERR_INVALID_ARGUMENT. */
CUBE_API CUBE_MUST_USE cube_error *cube_memory_reset_peaks(cube_client *client);

/* --- counters --- */

/* What the counters cover: the calling thread's stream, or every stream
 * of the client's device (all threads, every client of the device). */
typedef enum cube_memory_scope {
    CUBE_MEMORY_STREAM = 0,
    CUBE_MEMORY_DEVICE = 1
} cube_memory_scope;

/* Allocation counters, the figures torch.cuda.memory_stats() gives, kept
 * by each stream's memory manager under the lock its allocations already
 * take. "Device" means the backend's storage: device memory on CUDA,
 * host memory on the CPU and null backends.
 *
 * Counters only grow. Byte figures: allocated = asked for by live
 * buffers; reserved = held from the device; free = reserved, less
 * allocated, less the padding of live buffers (alignment and size
 * classes): what the pools hold ready for reuse. Each *_peak is the
 * highest value since the stream began or since cube_memory_reset_peaks.
 * With CUBE_MEMORY_DEVICE every field is the sum over the streams, the
 * peaks too: their sum bounds the device's peak from above, as streams
 * peak at different moments. */
typedef struct cube_memory_stats {
    /* The caller sets sizeof(cube_memory_stats) before the call; the
     * library fills that many bytes at most and sets it to the bytes it
     * filled, so the struct can grow: a caller built against a later
     * version gets the fields this library has, the rest left as they
     * were. */
    uint32_t struct_size;
    uint32_t streams;               /* the streams summed */
    uint64_t allocations;           /* buffers allocated */
    uint64_t releases;              /* buffers given back to their pool */
    uint64_t pool_hits;             /* allocations served from memory the
                                       pools held */
    uint64_t pool_misses;           /* allocations that took memory from the
                                       device (allocations = hits + misses) */
    uint64_t device_allocations;    /* successful requests to the device
                                       (allocations, and page maps of
                                       expandable pools) */
    uint64_t device_frees;          /* memory given back to the device */
    uint64_t oom_events;            /* allocations that failed with
                                       CUBE_ERR_OUT_OF_MEMORY */
    uint64_t oom_retries;           /* device refusals answered by
                                       releasing unused memory and retrying */
    uint64_t buffers, buffers_peak; /* live buffers */
    uint64_t allocated_bytes, allocated_bytes_peak;
    uint64_t reserved_bytes, reserved_bytes_peak;
    uint64_t free_bytes, free_bytes_peak;
} cube_memory_stats;

/* The size of the first version of cube_memory_stats: the least
 * struct_size accepted. */
#define CUBE_MEMORY_STATS_V1_SIZE 136u

/* The counters of `scope`. A stream that never allocated counts zero.
 * Thread safety: any thread; each stream is read under its own lock, so a
 * device-wide sum is exact when nothing allocates meanwhile.
 * Errors: CUBE_ERR_INVALID_ARGUMENT (client or out NULL, the client is
 * closing, out->struct_size below CUBE_MEMORY_STATS_V1_SIZE, an unknown
 * scope). */
CUBE_API CUBE_MUST_USE cube_error *
cube_memory_stats_get(cube_client *client, cube_memory_scope scope,
                      cube_memory_stats *out);

/* --- live buffers --- */

/* cube_buffer_info.pool of a buffer no pool holds: wrapped memory, or a
 * buffer made in a dry run that has no memory yet. */
#define CUBE_BUFFER_NO_POOL UINT32_MAX

/* cube_buffer_info.flags */
#define CUBE_BUFFER_FOREIGN 1u  /* wrapped memory (cube_wrap_memory) */
#define CUBE_BUFFER_DEFERRED 2u /* made in a dry run, not backed yet */

/* One live buffer. A buffer and its slices are one entry: the buffer's
 * whole range, named by the first handle made for it. */
typedef struct cube_buffer_info {
    /* As cube_memory_stats.struct_size, for every element of the array:
     * the caller sets out[0].struct_size to sizeof(cube_buffer_info), which
     * is also the array's stride; the library fills that many bytes of
     * each element at most and sets each element's struct_size to the
     * bytes it filled. */
    uint32_t struct_size;
    uint32_t flags;        /* CUBE_BUFFER_FOREIGN, CUBE_BUFFER_DEFERRED */
    cube_handle handle;    /* the first handle (cube_empty's or
                              cube_wrap_memory's), even once released while
                              slices keep the buffer alive */
    uint64_t size;         /* bytes asked for */
    cube_stream_id stream; /* the stream whose memory manager holds it */
    /* The pool's position in that stream's cube_memory_report.pools
     * (the layout's pools, then the large tail, then the persistent pool),
     * or CUBE_BUFFER_NO_POOL. */
    uint32_t pool;
    cube_pool_kind pool_kind;       /* that pool's kind (the large tail:
                                       EXCLUSIVE); unset with CUBE_BUFFER_NO_POOL */
    char label[CUBE_LABEL_MAX + 1]; /* cube_handle_set_label's, or "" */
} cube_buffer_info;

/* The size of the first version of cube_buffer_info: the least
 * struct_size accepted. */
#define CUBE_BUFFER_INFO_V1_SIZE 104u

/* Lists the client's live buffers: with CUBE_MEMORY_STREAM those whose
 * memory the calling thread's stream holds; with CUBE_MEMORY_DEVICE every
 * buffer of this client, on any stream. Buffers belong to the client that
 * made them, so other clients' buffers on the same device are not listed
 * (each client lists its own).
 *
 * *count receives how many buffers there are; the first min(cap, *count)
 * of them are written to out, in no particular order. A caller sizes the
 * array with cap 0 and out NULL, then asks again: a count above cap means
 * the list did not fit (not an error). Buffers made or released by other
 * threads meanwhile may or may not be listed; a buffer is never listed
 * twice, and one listed was live during the call.
 *
 * Cost: a walk of the client's handle table, without the locks the
 * allocation path takes, so allocations on other threads go on meanwhile;
 * two snapshots of one client take turns. Thread safety: any thread.
 * Errors: CUBE_ERR_INVALID_ARGUMENT (client or count NULL, out NULL with
 * cap above 0, out[0].struct_size below CUBE_BUFFER_INFO_V1_SIZE when cap
 * is above 0, an unknown scope, the client is closing). */
CUBE_API CUBE_MUST_USE cube_error *
cube_memory_snapshot(cube_client *client, cube_memory_scope scope,
                     cube_buffer_info *out, size_t cap, size_t *count);

typedef enum cube_report_format {
    CUBE_REPORT_TABLE = 0, /* aligned text, one line per pool */
    CUBE_REPORT_JSON = 1
} cube_report_format;

/* The report as text; the caller frees it with free(). NULL when memory
 * runs out, `report` is NULL, or report->count is above CUBE_MAX_POOLS + 2
 * (the length of report->pools): such a count is refused, never clamped,
 * since it does not come from cube_memory_report_get. */
CUBE_API char *cube_memory_report_format(const cube_memory_report *report,
                                         cube_report_format format);

/* --- allocation modes --- */

typedef enum cube_allocation_mode {
    CUBE_ALLOC_AUTO = 0,      /* route by size */
    CUBE_ALLOC_PERSISTENT = 1 /* exact-size reuse, for long-lived buffers */
} cube_allocation_mode;

/* Sets the calling stream's mode. Errors: CUBE_ERR_INVALID_ARGUMENT. */
CUBE_API CUBE_MUST_USE cube_error *
cube_allocation_mode_set(cube_client *client, cube_allocation_mode mode);

/* A persistent window: allocations between begin and the matching end are
 * persistent, whatever the mode. Windows nest. Ending more often than
 * beginning is CUBE_ERR_INVALID_ARGUMENT. */
CUBE_API CUBE_MUST_USE cube_error *cube_persistent_begin(cube_client *client);
CUBE_API CUBE_MUST_USE cube_error *cube_persistent_end(cube_client *client);

/* --- layouts of data --- */

/* Element strides for a `rank`-dimensional `shape` of `elem_size`-byte
 * elements: CUBE_LAYOUT_CONTIGUOUS gives dense row-major strides;
 * CUBE_LAYOUT_PITCHED pads each row (the last dimension) to a multiple of
 * `pitch_align` bytes so 2-D copies can use pitched transfers. *bytes
 * receives the buffer size the layout needs.
 * Errors: CUBE_ERR_INVALID_ARGUMENT (rank 0 or over CUBE_MAX_RANK, a zero
 * extent or element size, pitch_align not a power of two, overflow). */
CUBE_API CUBE_MUST_USE cube_error *
cube_layout_strides(cube_layout_policy policy, uint32_t rank,
                    const uint64_t *shape, uint32_t elem_size,
                    uint64_t pitch_align, uint64_t *strides, uint64_t *bytes);

#ifdef __cplusplus
}
#endif

#endif /* CUBERT_MEMORY_H */
