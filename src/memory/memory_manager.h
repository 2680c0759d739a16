/* The memory manager of one stream: routes each request to a pool of the
 * installed layout (include/cubert/memory.h describes the pools, routing,
 * spill-over, the large tail and the persistent pool), keeps usage, a
 * per-pool report with high-water marks, and answers out-of-memory by
 * releasing what it holds unused and retrying once.
 *
 * Costs: a request that a pool can serve from memory it already holds
 * ("a pool hit") takes a lock, a lookup by size class and an unlock — no
 * scan over pages or live buffers. Indices are 64-bit; a live buffer's
 * storage never moves or gets renumbered.
 *
 * Thread safety: all functions may be called from any thread (one mutex
 * per manager).
 */
#ifndef CUBE_MEMORY_MANAGER_H
#define CUBE_MEMORY_MANAGER_H

#include <stdint.h>

#include "cubert/backend/server.h"
#include "cubert/memory.h"

/* What a backend's storage provides (server.h describes it). */
typedef cube_storage_ops mem_storage_ops;

/* The device the pools are built for. */
typedef struct mem_device {
    uint64_t alignment;   /* a power of two; every address is a multiple */
    uint64_t memory_size; /* requests above it can never fit */
} mem_device;

typedef struct mem_manager mem_manager;

/* The preset layouts, derived from the device (see memory.h).
 * Errors: CUBE_ERR_INVALID_ARGUMENT. */
cube_error *mem_layout_preset(cube_layout_preset preset, const mem_device *dev,
                              cube_memory_layout *out);

/* The checks cube_memory_layout_validate documents, one message per
 * mistake naming the pool index and field. */
cube_error *mem_layout_validate(const cube_memory_layout *layout,
                                const mem_device *dev);

/* Whether a storage can hold a (validated) layout's pools: an expandable
 * pool needs its virtual memory (server.h). Errors: CUBE_ERR_UNSUPPORTED,
 * naming the pool. */
cube_error *mem_layout_supported(const mem_storage_ops *ops,
                                 const cube_memory_layout *layout);

/* A manager over `ops` with `layout` (NULL: the subslices preset; the
 * layout is validated and copied). Errors: CUBE_ERR_INVALID_ARGUMENT,
 * CUBE_ERR_UNSUPPORTED (mem_layout_supported), CUBE_ERR_OUT_OF_MEMORY. */
cube_error *mem_manager_create(const mem_storage_ops *ops,
                               const mem_device *dev,
                               const cube_memory_layout *layout,
                               mem_manager **out);
/* Returns every block to the storage, live or not. */
void mem_manager_destroy(mem_manager *m);
/* The storage the manager was built over (set at creation: no lock). */
const mem_storage_ops *mem_storage_of(const mem_manager *m);

/* A block of at least `size` bytes, aligned. storage->size is `size`;
 * storage->cookie is the manager's record, needed by mem_free;
 * storage->pool is the serving pool's position in mem_report.
 * Errors: CUBE_ERR_INVALID_ARGUMENT (size 0), CUBE_ERR_BUFFER_TOO_BIG,
 * CUBE_ERR_POOL_CAPACITY_EXCEEDED, CUBE_ERR_OUT_OF_MEMORY,
 * CUBE_ERR_DEVICE_FAULT (the storage's, as it said it). */
cube_error *mem_alloc(mem_manager *m, uint64_t size, cube_storage *out);
/* Gives a block back to its pool. */
void mem_free(mem_manager *m, cube_storage *storage);

/* The kind of the pool at report position `pool` (the large tail:
 * CUBE_POOL_EXCLUSIVE, as mem_report shows it); 0 when there is no such
 * position. */
int mem_pool_kind(mem_manager *m, uint32_t pool, cube_pool_kind *kind);

void mem_usage(mem_manager *m, cube_memory_usage *out);
void mem_report(mem_manager *m, cube_memory_report *out);
void mem_reset_peaks(mem_manager *m);
/* Fills the counter and byte fields of `out` (not struct_size, streams)
 * with the manager's; the counters only grow, the peaks follow
 * mem_reset_peaks. */
void mem_stats_get(mem_manager *m, cube_memory_stats *out);

/* Releases what can be released: empty pages of sliced pools, unused
 * exclusive pages, mapped pages of expandable pools that no live block
 * touches, unused persistent buffers. Never a live block. */
void mem_cleanup(mem_manager *m);

/* Rebuilds the pools with `layout` (validated first) when no block is
 * live. Errors: CUBE_ERR_INVALID_ARGUMENT, CUBE_ERR_UNSUPPORTED
 * (mem_layout_supported; checked before the live blocks),
 * CUBE_ERR_POOLS_IN_USE (the old layout stays), CUBE_ERR_OUT_OF_MEMORY. */
cube_error *mem_install(mem_manager *m, const cube_memory_layout *layout);

/* Routes requests to the persistent pool while `persistent` is nonzero. */
void mem_set_persistent(mem_manager *m, int persistent);

#endif /* CUBE_MEMORY_MANAGER_H */
