/* The memory manager: records, storage with out-of-memory retry, routing,
 * the large tail, usage, reports and installing layouts (see
 * memory_manager.h; accounting is defined in mem_internal.h).
 *
 * Locks (docs/threading.md): the manager's lock across the storage's
 * alloc; the storage's free runs after it is dropped (mem_unlock).
 */
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "base/dlist.h"
#include "base/error.h"
#include "base/grow.h"
#include "base/log.h"
#include "memory/mem_internal.h"

#define MEM_SLAB_RECORDS 64

struct mem_slab {
    mem_slab *next;
    mem_block records[MEM_SLAB_RECORDS];
};

typedef unsigned long long ull;

/* --- records --- */

/* Called with m->lock held. */
static int records_reserve(mem_manager *m) CUBE_REQUIRES(m->lock);
static void expire(mem_manager *m, uint64_t now) CUBE_REQUIRES(m->lock);
static void expire_if_due(mem_manager *m) CUBE_REQUIRES(m->lock);
static uint64_t release_unused(mem_manager *m) CUBE_REQUIRES(m->lock);
static cube_error *tail_alloc(mem_manager *m, uint64_t size, mem_block **out)
    CUBE_REQUIRES(m->lock);
static void tail_free(mem_manager *m, mem_block *b) CUBE_REQUIRES(m->lock);
static void pool_fini(mem_manager *m, mem_pool *p) CUBE_REQUIRES(m->lock);
static cube_error *route(mem_manager *m, uint64_t size, mem_block **out)
    CUBE_REQUIRES(m->lock);

static int records_reserve(mem_manager *m)
{
    if (m->spare_count >= MEM_SPARE_MIN)
        return 0;
    mem_slab *slab = malloc(sizeof *slab);
    if (!slab)
        return -1;
    slab->next = m->slabs;
    m->slabs = slab;
    for (int i = 0; i < MEM_SLAB_RECORDS; i++)
        mem_record_give(m, &slab->records[i]);
    return 0;
}

mem_block *mem_record_take(mem_manager *m)
{
    mem_block *b = m->spare;
    m->spare = b->next;
    m->spare_count--;
    memset(b, 0, sizeof *b);
    return b;
}

mem_block *mem_record_for(mem_manager *m, mem_pool *p, uint64_t address,
                          uint64_t size)
{
    mem_block *b = mem_record_take(m);
    b->address = address;
    b->size = size;
    b->pool = p;
    return b;
}

void mem_record_give(mem_manager *m, mem_block *b)
{
    b->requested = 0;
    b->pool = NULL;
    b->next = m->spare;
    m->spare = b;
    m->spare_count++;
}

/* --- time, stats, lists --- */

uint64_t mem_now_ms(void)
{
    return cube_clock_ns() / 1000000u;
}

void mem_pool_link(mem_pool *p, mem_block *b)
{
    b->prev = NULL;
    b->next = p->blocks;
    if (p->blocks)
        p->blocks->prev = b;
    p->blocks = b;
}

void mem_pool_unlink(mem_pool *p, mem_block *b)
{
    CUBE_DLIST_UNLINK(p->blocks, b, prev, next);
    b->prev = b->next = NULL;
}

mem_block *mem_pool_page_new(mem_manager *m, mem_pool *p, uint64_t address,
                             uint64_t extent)
{
    mem_block *b = mem_record_for(m, p, address, extent);
    mem_pool_link(p, b);
    mem_stats_page_add(m, &p->st, extent);
    return b;
}

void mem_pool_page_drop(mem_manager *m, mem_pool *p, mem_block *b)
{
    mem_pool_unlink(p, b);
    mem_storage_put(m, b->address, b->size);
    mem_stats_page_remove(m, &p->st, b->size);
    mem_record_give(m, b);
}

void mem_pool_drop_all(mem_manager *m, mem_pool *p)
{
    while (p->blocks) {
        mem_block *b = p->blocks;
        if (b->requested)
            mem_stats_live_remove(m, &p->st, b->requested, b->size);
        mem_pool_page_drop(m, p, b);
    }
}

/* --- releasing what is unused --- */

/* Gives back exclusive pages whose time has come and sets the next time
 * to look. */
static void expire(mem_manager *m, uint64_t now)
{
    uint64_t next = UINT64_MAX;
    for (uint32_t i = 0; i < m->count; i++) {
        mem_pool *p = &m->pools[i];
        uint64_t after = p->config.release_after_ms;
        if (p->config.kind != CUBE_POOL_EXCLUSIVE || after == 0)
            continue;
        mem_exclusive_release(m, p, now);
        if (p->lru_first && p->lru_first->freed_ms + after < next)
            next = p->lru_first->freed_ms + after;
    }
    m->next_expiry_ms = next;
}

static void expire_if_due(mem_manager *m)
{
    if (m->next_expiry_ms == UINT64_MAX)
        return;
    uint64_t now = mem_now_ms();
    if (now >= m->next_expiry_ms)
        expire(m, now);
}

/* Everything held but unused: empty sliced pages, free exclusive pages,
 * free persistent blocks. Returns the bytes given back. */
static uint64_t release_unused(mem_manager *m)
{
    uint64_t released = 0;
    for (uint32_t i = 0; i < m->count; i++) {
        mem_pool *p = &m->pools[i];
        if (p->config.kind == CUBE_POOL_SLICED)
            released += mem_sliced_release(m, p);
        else if (p->config.kind == CUBE_POOL_EXPANDABLE)
            released += mem_expandable_release(m, p);
        else
            released += mem_exclusive_release(m, p, UINT64_MAX);
    }
    released += mem_persistent_release(m, &m->pools[MEM_PERSISTENT]);
    m->next_expiry_ms = UINT64_MAX;
    return released;
}

/* Gives the queued storage back now, under the lock: for the
 * out-of-memory retry, which needs it gone before asking again. */
static void puts_flush_locked(mem_manager *m)
{
    for (size_t i = 0; i < m->put_count; i++)
        m->ops.free(m->ops.self, m->puts[i].address, m->puts[i].size);
    m->put_count = 0;
}

/* One storage call: an alloc of `size` bytes into *address, or (map) a
 * map of [address, address + size). */
static cube_error *storage_call(mem_manager *m, int map, uint64_t size,
                                uint64_t *address) CUBE_REQUIRES(m->lock);

static cube_error *storage_call(mem_manager *m, int map, uint64_t size,
                                uint64_t *address)
{
    cube_error *err =
        map ? m->ops.map(m->ops.self, *address, size)
            : m->ops.alloc(m->ops.self, size, m->dev.alignment, address);
    m->tot.storage_allocs += err == NULL;
    return err;
}

/* A storage call with the out-of-memory handling of mem_storage_get. */
static cube_error *storage_call_retry(mem_manager *m, int map, uint64_t size,
                                      uint64_t *address) CUBE_REQUIRES(m->lock);

static cube_error *storage_call_retry(mem_manager *m, int map, uint64_t size,
                                      uint64_t *address)
{
    const char *what = map ? "mapping" : "reserving";
    cube_error *err = storage_call(m, map, size, address);
    if (!err)
        return NULL;
    /* A broken device: nothing released could help, and the caller must
     * see the fault, not a shortage. */
    if (cube_error_code(err) == CUBE_ERR_DEVICE_FAULT)
        return cube_error_prefix(err, "%s %llu bytes of storage", what,
                                 (ull)size);
    uint64_t released = release_unused(m);
    puts_flush_locked(m);
    if (released > 0) {
        cube_log_write(CUBE_LOG_INFO, "memory",
                       "the storage refused %s %llu bytes (%s); released "
                       "%llu unused bytes and retrying once",
                       map ? "to map" : "to reserve", (ull)size,
                       cube_error_message(err), (ull)released);
        cube_error_free(err);
        m->tot.retries++;
        err = storage_call(m, map, size, address);
        if (!err)
            return NULL;
    }
    if (cube_error_code(err) == CUBE_ERR_DEVICE_FAULT)
        return cube_error_prefix(err, "%s %llu bytes of storage", what,
                                 (ull)size);
    if (cube_error_code(err) != CUBE_ERR_OUT_OF_MEMORY)
        return cube_error_wrap(err, CUBE_ERR_OUT_OF_MEMORY,
                               "%s %llu bytes of storage", what, (ull)size);
    return cube_error_prefix(err, "%s %llu bytes of storage%s", what, (ull)size,
                             released ? " (after releasing unused memory)"
                                      : "");
}

cube_error *mem_storage_get(mem_manager *m, uint64_t size, uint64_t *address)
{
    return storage_call_retry(m, 0, size, address);
}

cube_error *mem_storage_map(mem_manager *m, uint64_t address, uint64_t size)
{
    return storage_call_retry(m, 1, size, &address);
}

void mem_storage_put(mem_manager *m, uint64_t address, uint64_t size)
{
    m->tot.storage_frees++;
    struct mem_put *grown =
        cube_grow(m->puts, m->put_count, &m->put_cap, sizeof *grown, 8);
    if (!grown) {
        /* No room to queue it: give it back now, lock held. */
        m->ops.free(m->ops.self, address, size);
        return;
    }
    m->puts = grown;
    m->puts[m->put_count].address = address;
    m->puts[m->put_count].size = size;
    m->put_count++;
}

void mem_unlock(mem_manager *m)
{
    size_t n = m->put_count;
    if (n == 0) {
        cube_mutex_unlock(&m->lock);
        return;
    }
    struct mem_put *puts = m->puts;
    m->puts = NULL;
    m->put_count = m->put_cap = 0;
    cube_mutex_unlock(&m->lock);
    for (size_t i = 0; i < n; i++)
        m->ops.free(m->ops.self, puts[i].address, puts[i].size);
    free(puts);
}

/* --- the large tail: one block of the rounded size per request --- */

static cube_error *tail_alloc(mem_manager *m, uint64_t size, mem_block **out)
{
    mem_pool *p = &m->pools[MEM_TAIL];
    uint64_t extent = mem_round(m, size);
    uint64_t address = 0;
    cube_error *err = mem_storage_get(m, extent, &address);
    if (err)
        return err;
    mem_block *b = mem_pool_page_new(m, p, address, extent);
    return mem_hand_out(m, p, b, size, extent, out);
}

static void tail_free(mem_manager *m, mem_block *b)
{
    mem_pool *p = b->pool;
    mem_stats_live_remove(m, &p->st, b->requested, b->size);
    mem_stats_page_remove(m, &p->st, b->size);
    mem_pool_unlink(p, b);
    mem_storage_put(m, b->address, b->size);
    mem_record_give(m, b);
}

/* --- building pools --- */

/* The smallest request size no pool of the layout holds (above every
 * pool's range when they hold every size). */
static uint64_t smallest_unpooled(const cube_memory_layout *layout)
{
    uint64_t x = 1;
    for (;;) {
        int moved = 0;
        for (uint32_t i = 0; i < layout->count; i++) {
            const cube_pool_config *c = &layout->pools[i];
            if (c->min_size <= x && x <= c->max_size) {
                if (c->max_size == UINT64_MAX)
                    return UINT64_MAX;
                x = c->max_size + 1;
                moved = 1;
            }
        }
        if (!moved)
            return x;
    }
}

static void pool_fini(mem_manager *m, mem_pool *p)
{
    if (p->config.kind == CUBE_POOL_SLICED)
        mem_sliced_fini(m, p);
    else if (p->config.kind == CUBE_POOL_EXPANDABLE)
        mem_expandable_fini(m, p);
    else
        mem_exclusive_fini(m, p);
}

cube_error *mem_layout_supported(const mem_storage_ops *ops,
                                 const cube_memory_layout *layout)
{
    if (!ops || !layout)
        return NULL;
    int vm = ops->granularity != 0 &&
             (ops->granularity & (ops->granularity - 1)) == 0 && ops->reserve &&
             ops->map && ops->unmap && ops->release;
    for (uint32_t i = 0; i < layout->count && i < CUBE_MAX_POOLS; i++)
        if (layout->pools[i].kind == CUBE_POOL_EXPANDABLE && !vm)
            return cube_error_new(CUBE_ERR_UNSUPPORTED,
                                  "memory layout: pool %u is "
                                  "CUBE_POOL_EXPANDABLE, but this device's "
                                  "storage has no virtual memory (reserve, "
                                  "map, unmap, release)",
                                  (unsigned)i);
    return NULL;
}

/* Builds the layout's pools into `pools` (nothing else changes). */
static cube_error *pools_build(mem_manager *m, const cube_memory_layout *layout,
                               mem_pool *pools)
{
    for (uint32_t i = 0; i < layout->count; i++) {
        mem_pool *p = &pools[i];
        memset(p, 0, sizeof *p);
        p->config = layout->pools[i];
        p->index = i;
        cube_error *err;
        if (p->config.kind == CUBE_POOL_SLICED)
            err = mem_sliced_init(m, p);
        else if (p->config.kind == CUBE_POOL_EXPANDABLE)
            err = mem_expandable_init(m, p);
        else
            err = mem_exclusive_init(m, p);
        if (err) {
            for (uint32_t j = 0; j < i; j++)
                mem_bins_fini(&pools[j].bins);
            return err;
        }
    }
    return NULL;
}

/* Takes `layout`'s pools (built by pools_build) as the current ones. */
static void pools_adopt(mem_manager *m, const cube_memory_layout *layout,
                        const mem_pool *pools)
{
    memcpy(m->pools, pools, layout->count * sizeof *pools);
    m->count = layout->count;
    mem_pool *tail = &m->pools[MEM_TAIL];
    memset(&tail->config, 0, sizeof tail->config);
    tail->config.kind = CUBE_POOL_EXCLUSIVE;
    tail->config.min_size = smallest_unpooled(layout);
    tail->config.max_size = m->dev.memory_size;
    tail->index = layout->count;
    mem_pool *per = &m->pools[MEM_PERSISTENT];
    memset(&per->config, 0, sizeof per->config);
    per->config.kind = CUBE_POOL_PERSISTENT;
    per->config.min_size = 1;
    per->config.max_size = m->dev.memory_size;
    per->index = layout->count + 1;
    m->next_expiry_ms = UINT64_MAX;
}

/* --- the interface --- */

cube_error *mem_manager_create(const mem_storage_ops *ops,
                               const mem_device *dev,
                               const cube_memory_layout *layout,
                               mem_manager **out)
{
    if (!out)
        return cube_error_null_argument("mem_manager_create", "out");
    *out = NULL;
    if (!ops || !ops->alloc || !ops->free)
        return cube_error_new(CUBE_ERR_INVALID_ARGUMENT,
                              "mem_manager_create: the storage operations "
                              "are missing");
    cube_error *err = mem_device_check(dev);
    if (err)
        return err;
    cube_memory_layout preset;
    if (!layout) {
        err = mem_layout_preset(CUBE_PRESET_SUBSLICES, dev, &preset);
        if (err)
            return err;
        layout = &preset;
    }
    err = mem_layout_validate(layout, dev);
    if (!err)
        err = mem_layout_supported(ops, layout);
    if (err)
        return err;

    /* On a cache-line boundary: its lock shares a line with the totals a
     * pool hit updates (sizeof is a multiple of the alignment). */
    mem_manager *m = aligned_alloc(_Alignof(mem_manager), sizeof *m);
    if (!m)
        return cube_error_new(CUBE_ERR_OUT_OF_MEMORY,
                              "no host memory for a memory manager");
    memset(m, 0, sizeof *m);
    m->ops = *ops;
    m->dev = *dev;
    m->shift = (unsigned)__builtin_ctzll(dev->alignment);
    mem_pool built[CUBE_MAX_POOLS];
    err = pools_build(m, layout, built);
    if (err) {
        free(m);
        return err;
    }
    if (cube_mutex_init(&m->lock) != 0) {
        for (uint32_t i = 0; i < layout->count; i++)
            mem_bins_fini(&built[i].bins);
        free(m);
        return cube_error_new(CUBE_ERR_OUT_OF_MEMORY,
                              "memory manager: cannot create its mutex");
    }
    pools_adopt(m, layout, built);
    *out = m;
    return NULL;
}

static void usage_locked(const mem_manager *m, cube_memory_usage *out)
{
    memset(out, 0, sizeof *out);
    for (uint32_t i = 0; i < MEM_POOL_SLOTS; i++) {
        if (i >= m->count && i < MEM_TAIL)
            continue;
        const mem_stats *st = &m->pools[i].st;
        out->buffers += st->buffers;
        out->bytes_in_use += st->in_use;
        out->bytes_padding += st->padding;
        out->bytes_reserved += st->reserved;
    }
}

void mem_manager_destroy(mem_manager *m)
{
    if (!m)
        return;
    cube_mutex_lock(&m->lock);
    cube_memory_usage u;
    usage_locked(m, &u);
    if (u.buffers)
        cube_log_write(CUBE_LOG_DEBUG, "memory",
                       "%llu buffers (%llu bytes) still live when their "
                       "memory manager closes; their storage is given back",
                       (ull)u.buffers, (ull)u.bytes_in_use);
    for (uint32_t i = 0; i < m->count; i++)
        pool_fini(m, &m->pools[i]);
    mem_pool_drop_all(m, &m->pools[MEM_TAIL]);
    mem_persistent_fini(m, &m->pools[MEM_PERSISTENT]);
    mem_unlock(m);
    while (m->slabs) {
        mem_slab *slab = m->slabs;
        m->slabs = slab->next;
        free(slab);
    }
    free(m->puts);
    cube_mutex_destroy(&m->lock);
    free(m);
}

/* Routes a request (see memory.h): the persistent pool while the mode is
 * persistent; else the first pool holding the size, spilling over to the
 * next ones while pools are at their cap; else the large tail. */
static cube_error *route(mem_manager *m, uint64_t size, mem_block **out)
{
    *out = NULL;
    if (m->persistent)
        return mem_persistent_alloc(m, &m->pools[MEM_PERSISTENT], size, out);
    mem_pool *capped = NULL;
    uint32_t capped_count = 0;
    for (uint32_t i = 0; i < m->count; i++) {
        mem_pool *p = &m->pools[i];
        if (size < p->config.min_size || size > p->config.max_size)
            continue;
        cube_error *err;
        if (p->config.kind == CUBE_POOL_SLICED)
            err = mem_sliced_alloc(m, p, size, out);
        else if (p->config.kind == CUBE_POOL_EXPANDABLE)
            err = mem_expandable_alloc(m, p, size, out);
        else
            err = mem_exclusive_alloc(m, p, size, out);
        if (err || *out)
            return err;
        if (!p->cap_warned) {
            p->cap_warned = 1;
            cube_log_write(CUBE_LOG_WARN, "memory",
                           "pool %u reached its cap of %llu bytes; requests "
                           "it holds go to the next pool that holds them",
                           (unsigned)i, (ull)p->config.cap);
        }
        if (!capped)
            capped = p;
        capped_count++;
    }
    if (capped)
        return cube_error_new(
            CUBE_ERR_POOL_CAPACITY_EXCEEDED,
            "a buffer of %llu bytes does not fit: pool %u is at its cap of "
            "%llu bytes (%llu bytes in use, %llu reserved)%s",
            (ull)size, (unsigned)capped->index, (ull)capped->config.cap,
            (ull)capped->st.in_use, (ull)capped->st.reserved,
            capped_count > 1 ? ", and so is every later pool holding that size"
                             : "");
    return tail_alloc(m, size, out);
}

cube_error *mem_alloc(mem_manager *m, uint64_t size, cube_storage *out)
{
    if (!m || !out)
        return cube_error_new(CUBE_ERR_INVALID_ARGUMENT,
                              "mem_alloc: the manager or out is NULL");
    if (size == 0)
        return cube_error_new(CUBE_ERR_INVALID_ARGUMENT,
                              "mem_alloc: a buffer of 0 bytes");
    if (size > m->dev.memory_size || size > UINT64_MAX - (m->dev.alignment - 1))
        return cube_error_new(CUBE_ERR_BUFFER_TOO_BIG,
                              "a buffer of %llu bytes can never fit: the "
                              "device holds %llu bytes",
                              (ull)size, (ull)m->dev.memory_size);
    cube_mutex_lock(&m->lock);
    expire_if_due(m);
    if (records_reserve(m) != 0) {
        mem_unlock(m);
        return cube_error_new(CUBE_ERR_OUT_OF_MEMORY,
                              "no host memory for block records");
    }
    mem_block *b = NULL;
    uint64_t storage_before = m->tot.storage_allocs;
    cube_error *err = route(m, size, &b);
    if (!err) {
        m->tot.allocs++;
        m->tot.misses += m->tot.storage_allocs != storage_before;
    } else if (cube_error_code(err) == CUBE_ERR_OUT_OF_MEMORY) {
        m->tot.ooms++;
    }
    mem_unlock(m);
    if (err)
        return err;
    out->address = b->address;
    out->size = size;
    out->cookie = b;
    out->pool = b->pool->index;
    return NULL;
}

void mem_free(mem_manager *m, cube_storage *storage)
{
    if (!m || !storage || !storage->cookie)
        return;
    mem_block *b = storage->cookie;
    uintptr_t pool = (uintptr_t)b->pool;
    uintptr_t first = (uintptr_t)&m->pools[0];
    uintptr_t end = (uintptr_t)&m->pools[MEM_POOL_SLOTS];
    cube_mutex_lock(&m->lock);
    if (pool < first || pool >= end || !b->requested ||
        b->address != storage->address) {
        mem_unlock(m);
        cube_log_write(CUBE_LOG_ERROR, "memory",
                       "mem_free: the storage at 0x%llx is not a live block "
                       "of this manager; ignored",
                       (ull)storage->address);
        return;
    }
    expire_if_due(m);
    mem_pool *p = b->pool;
    if (p == &m->pools[MEM_TAIL])
        tail_free(m, b);
    else if (p == &m->pools[MEM_PERSISTENT])
        mem_persistent_free(m, b);
    else if (p->config.kind == CUBE_POOL_SLICED ||
             p->config.kind == CUBE_POOL_EXPANDABLE)
        mem_hot_free(m, b);
    else
        mem_exclusive_free(m, b);
    m->tot.frees++;
    mem_unlock(m);
    storage->cookie = NULL;
}

int mem_pool_kind(mem_manager *m, uint32_t pool, cube_pool_kind *kind)
{
    if (!m || !kind)
        return 0;
    int found = 1;
    cube_mutex_lock(&m->lock);
    if (pool < m->count)
        *kind = m->pools[pool].config.kind;
    else if (pool == m->count)
        *kind = m->pools[MEM_TAIL].config.kind;
    else if (pool == m->count + 1)
        *kind = m->pools[MEM_PERSISTENT].config.kind;
    else
        found = 0;
    mem_unlock(m);
    return found;
}

void mem_usage(mem_manager *m, cube_memory_usage *out)
{
    if (!m || !out)
        return;
    cube_mutex_lock(&m->lock);
    usage_locked(m, out);
    mem_unlock(m);
}

static void pool_report(const mem_pool *p, cube_pool_report *r)
{
    r->config = p->config;
    r->pages = p->st.pages;
    r->pages_peak = p->st.pages_peak;
    r->buffers = p->st.buffers;
    r->buffers_peak = p->st.buffers_peak;
    r->bytes_in_use = p->st.in_use;
    r->bytes_in_use_peak = p->st.in_use_peak;
    r->bytes_reserved = p->st.reserved;
    r->bytes_reserved_peak = p->st.reserved_peak;
    r->largest_buffer = p->st.largest;
}

void mem_report(mem_manager *m, cube_memory_report *out)
{
    if (!m || !out)
        return;
    memset(out, 0, sizeof *out);
    cube_mutex_lock(&m->lock);
    uint32_t n = 0;
    for (uint32_t i = 0; i < m->count; i++)
        pool_report(&m->pools[i], &out->pools[n++]);
    pool_report(&m->pools[MEM_TAIL], &out->pools[n++]);
    pool_report(&m->pools[MEM_PERSISTENT], &out->pools[n++]);
    out->count = n;
    usage_locked(m, &out->usage);
    mem_unlock(m);
}

static void stats_reset_peaks(mem_stats *st)
{
    st->pages_peak = st->pages;
    st->buffers_peak = st->buffers;
    st->in_use_peak = st->in_use;
    st->reserved_peak = st->reserved;
}

void mem_reset_peaks(mem_manager *m)
{
    if (!m)
        return;
    cube_mutex_lock(&m->lock);
    for (uint32_t i = 0; i < m->count; i++)
        stats_reset_peaks(&m->pools[i].st);
    stats_reset_peaks(&m->pools[MEM_TAIL].st);
    stats_reset_peaks(&m->pools[MEM_PERSISTENT].st);
    mem_totals *t = &m->tot;
    t->buffers_peak = t->buffers;
    t->in_use_peak = t->in_use;
    t->reserved_peak = t->reserved;
    t->cached_peak = t->reserved - t->extent;
    mem_unlock(m);
}

void mem_stats_get(mem_manager *m, cube_memory_stats *out)
{
    if (!m || !out)
        return;
    cube_mutex_lock(&m->lock);
    const mem_totals *t = &m->tot;
    out->allocations = t->allocs;
    out->releases = t->frees;
    out->pool_hits = t->allocs - t->misses;
    out->pool_misses = t->misses;
    out->device_allocations = t->storage_allocs;
    out->device_frees = t->storage_frees;
    out->oom_events = t->ooms;
    out->oom_retries = t->retries;
    out->allocated_bytes = t->in_use;
    out->allocated_bytes_peak = t->in_use_peak;
    out->reserved_bytes = t->reserved;
    out->reserved_bytes_peak = t->reserved_peak;
    out->free_bytes = t->reserved - t->extent;
    out->free_bytes_peak = t->cached_peak;
    out->buffers = t->buffers;
    out->buffers_peak = t->buffers_peak;
    mem_unlock(m);
}

void mem_cleanup(mem_manager *m)
{
    if (!m)
        return;
    cube_mutex_lock(&m->lock);
    uint64_t released = release_unused(m);
    mem_persistent_prune(&m->pools[MEM_PERSISTENT]);
    mem_unlock(m);
    if (released)
        cube_log_write(CUBE_LOG_DEBUG, "memory",
                       "cleanup gave back %llu unused bytes", (ull)released);
}

cube_error *mem_install(mem_manager *m, const cube_memory_layout *layout)
{
    if (!m)
        return cube_error_new(CUBE_ERR_INVALID_ARGUMENT,
                              "mem_install: the manager is NULL");
    cube_error *err = mem_layout_validate(layout, &m->dev);
    if (!err)
        err = mem_layout_supported(&m->ops, layout);
    if (err)
        return err;
    cube_mutex_lock(&m->lock);
    cube_memory_usage u;
    usage_locked(m, &u);
    if (u.buffers) {
        mem_unlock(m);
        return cube_error_new(CUBE_ERR_POOLS_IN_USE,
                              "the pools cannot be rebuilt while %llu "
                              "buffers (%llu bytes) are live in them; the "
                              "old layout stays",
                              (ull)u.buffers, (ull)u.bytes_in_use);
    }
    mem_pool built[CUBE_MAX_POOLS];
    err = pools_build(m, layout, built);
    if (err) {
        mem_unlock(m);
        return err;
    }
    /* Nothing is live: finishing the old pools releases all they hold. */
    for (uint32_t i = 0; i < m->count; i++)
        pool_fini(m, &m->pools[i]);
    mem_persistent_release(m, &m->pools[MEM_PERSISTENT]);
    mem_persistent_prune(&m->pools[MEM_PERSISTENT]);
    pools_adopt(m, layout, built);
    mem_unlock(m);
    return NULL;
}

void mem_set_persistent(mem_manager *m, int persistent)
{
    if (!m)
        return;
    cube_mutex_lock(&m->lock);
    m->persistent = persistent != 0;
    mem_unlock(m);
}

const mem_storage_ops *mem_storage_of(const mem_manager *m)
{
    return &m->ops;
}
