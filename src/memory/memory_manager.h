/* The memory manager: hands out aligned blocks of a backend's storage and
 * keeps released blocks for reuse, by size class.
 *
 * Sizes are rounded up to a class: four classes per power of two (so at
 * most 25% padding), up to the large threshold; larger requests get their
 * exact (aligned) size. A released block goes to its class's free list and
 * serves the next request of that class without touching the storage: the
 * hot path is a lock, a pop and an unlock, independent of how many buffers
 * are live. mem_cleanup() returns cached blocks to the storage.
 *
 * Out of memory: when the storage refuses, the manager releases its cached
 * blocks and tries once more before it reports CUBE_ERR_OUT_OF_MEMORY.
 *
 * Thread safety: all functions may be called from any thread.
 */
#ifndef CUBE_MEMORY_MANAGER_H
#define CUBE_MEMORY_MANAGER_H

#include <stdint.h>

#include "cubert/backend/server.h"

/* What a backend's storage provides. */
typedef struct mem_storage_ops {
    void *self;
    /* Reserves `size` bytes aligned to `align`. Errors:
     * CUBE_ERR_OUT_OF_MEMORY. */
    cube_error *(*alloc)(void *self, uint64_t size, uint64_t align,
                         uint64_t *address);
    void (*free)(void *self, uint64_t address, uint64_t size);
} mem_storage_ops;

typedef struct mem_manager mem_manager;

/* `alignment`: a power of two every address is a multiple of.
 * `max_buffer`: requests above it can never fit (CUBE_ERR_BUFFER_TOO_BIG).
 * Errors: CUBE_ERR_INVALID_ARGUMENT, CUBE_ERR_OUT_OF_MEMORY. */
cube_error *mem_manager_create(const mem_storage_ops *ops, uint64_t alignment,
                               uint64_t max_buffer, mem_manager **out);
/* Returns every block to the storage, live or cached. */
void mem_manager_destroy(mem_manager *manager);

/* A block of at least `size` bytes. Errors: CUBE_ERR_INVALID_ARGUMENT (size
 * 0), CUBE_ERR_BUFFER_TOO_BIG, CUBE_ERR_OUT_OF_MEMORY. */
cube_error *mem_alloc(mem_manager *manager, uint64_t size, cube_storage *out);
/* Gives a block back (to its class's cache). */
void mem_free(mem_manager *manager, cube_storage *storage);

void mem_usage(mem_manager *manager, cube_memory_usage *out);
/* Returns cached blocks to the storage; live blocks are never touched. */
void mem_cleanup(mem_manager *manager);

/* The class size a request of `size` is rounded to (exposed for tests). */
uint64_t mem_class_size(uint64_t size, uint64_t alignment);

#endif /* CUBE_MEMORY_MANAGER_H */
