/* The persistent pool: blocks of exactly the rounded request size. A freed
 * block serves only a later request of the same rounded size; free blocks
 * are found by that size in a hash table (open addressing, linear
 * probing), each size keeping a list of its free blocks. Only a cleanup
 * (or an out-of-memory retry, or installing a layout) gives free blocks
 * back. */
#include <stdlib.h>

#include "base/error.h"
#include "memory/mem_internal.h"

#define MEM_SIZES_MIN 16u

static uint64_t slot_of(const mem_size_table *t, uint64_t size)
{
    uint64_t h = size * 0x9E3779B97F4A7C15ull;
    h ^= h >> 32;
    return h & (t->capacity - 1u);
}

/* The slot of `size`, or the empty slot where it would go (NULL only for
 * a table without slots). */
static mem_size_slot *slot_find(const mem_size_table *t, uint64_t size)
{
    if (!t->capacity)
        return NULL;
    uint64_t i = slot_of(t, size);
    while (t->slots[i].size != 0 && t->slots[i].size != size)
        i = (i + 1u) & (t->capacity - 1u);
    return &t->slots[i];
}

/* Rebuilds the table with `capacity` slots, keeping the sizes that still
 * have blocks. Returns -1 (the table unchanged) when memory runs out. */
static int table_rebuild(mem_size_table *t, uint64_t capacity)
{
    mem_size_table fresh = {NULL, capacity, 0};
    if (capacity) {
        fresh.slots = calloc(capacity, sizeof *fresh.slots);
        if (!fresh.slots)
            return -1;
    }
    for (uint64_t i = 0; i < t->capacity; i++) {
        const mem_size_slot *s = &t->slots[i];
        if (s->size == 0 || s->blocks == 0)
            continue;
        *slot_find(&fresh, s->size) = *s;
        fresh.used++;
    }
    free(t->slots);
    *t = fresh;
    return 0;
}

/* Makes room for one more size. */
static int table_reserve(mem_size_table *t)
{
    if (t->capacity && (t->used + 1u) * 2u <= t->capacity)
        return 0;
    uint64_t capacity = t->capacity ? t->capacity * 2u : MEM_SIZES_MIN;
    return table_rebuild(t, capacity);
}

cube_error *mem_persistent_alloc(mem_manager *m, mem_pool *p, uint64_t size,
                                 mem_block **out)
{
    uint64_t extent = mem_round(m, size);
    mem_size_slot *slot = slot_find(&p->sizes, extent);
    mem_block *b = NULL;
    if (slot && slot->size == extent && slot->free) {
        b = slot->free;
        slot->free = b->fnext;
        b->fnext = NULL;
    } else {
        uint64_t address = 0;
        cube_error *err = mem_storage_get(m, extent, &address);
        if (err)
            return cube_error_prefix(err, "a persistent buffer");
        if (table_reserve(&p->sizes) != 0) {
            mem_storage_put(m, address, extent);
            return cube_error_new(CUBE_ERR_OUT_OF_MEMORY,
                                  "no host memory for the persistent pool's "
                                  "size table");
        }
        slot = slot_find(&p->sizes, extent);
        if (slot->size == 0) {
            slot->size = extent;
            p->sizes.used++;
        }
        slot->blocks++;
        b = mem_pool_page_new(m, p, address, extent);
    }
    return mem_hand_out(m, p, b, size, extent, out);
}

void mem_persistent_free(mem_manager *m, mem_block *b)
{
    (void)m;
    mem_pool *p = b->pool;
    mem_stats_live_remove(m, &p->st, b->requested, b->size);
    b->requested = 0;
    mem_size_slot *slot = slot_find(&p->sizes, b->size);
    b->fnext = slot->free;
    slot->free = b;
}

uint64_t mem_persistent_release(mem_manager *m, mem_pool *p)
{
    uint64_t released = 0;
    for (uint64_t i = 0; i < p->sizes.capacity; i++) {
        mem_size_slot *slot = &p->sizes.slots[i];
        while (slot->free) {
            mem_block *b = slot->free;
            slot->free = b->fnext;
            slot->blocks--;
            released += b->size;
            mem_pool_page_drop(m, p, b);
        }
    }
    return released;
}

void mem_persistent_prune(mem_pool *p)
{
    mem_size_table *t = &p->sizes;
    uint64_t keep = 0;
    for (uint64_t i = 0; i < t->capacity; i++)
        keep += t->slots[i].blocks != 0;
    if (keep == t->used)
        return;
    uint64_t capacity = 0;
    if (keep) {
        capacity = MEM_SIZES_MIN;
        while (capacity < keep * 2u)
            capacity *= 2u;
    }
    /* Out of memory: the table stays as it is, still correct. */
    (void)table_rebuild(t, capacity);
}

void mem_persistent_fini(mem_manager *m, mem_pool *p)
{
    mem_pool_drop_all(m, p);
    free(p->sizes.slots);
    p->sizes.slots = NULL;
    p->sizes.capacity = p->sizes.used = 0;
}
