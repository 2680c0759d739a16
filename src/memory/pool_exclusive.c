/* Exclusive pools: one buffer per page.
 *
 * A new page is exactly the request rounded up to the alignment (the
 * pool's page_size only bounds the pages: max_size <= page_size). A freed
 * page waits in the size-class bins and in a list ordered by when it was
 * freed. A request reuses a free page at most 1/8 larger than its rounded
 * size, so reuse wastes little; a pool at its cap first reuses any free
 * page that fits, then gives back its free pages, oldest first, to make
 * room. Free pages go back to the storage once unused for
 * release_after_ms (looked at on alloc and free, with a monotonic clock),
 * and at cleanup.
 */
#include "base/dlist.h"
#include "base/error.h"
#include "base/log.h"
#include "memory/mem_internal.h"

cube_error *mem_exclusive_init(mem_manager *m, mem_pool *p)
{
    return mem_bins_init(&p->bins, p->config.page_size, m->shift);
}

static void lru_unlink(mem_pool *p, mem_block *b)
{
    CUBE_DLIST_UNLINK(p->lru_first, b, lprev, lnext);
    if (!b->lnext)
        p->lru_last = b->lprev;
    b->lprev = b->lnext = NULL;
}

static void lru_append(mem_pool *p, mem_block *b)
{
    b->lnext = NULL;
    b->lprev = p->lru_last;
    if (p->lru_last)
        p->lru_last->lnext = b;
    else
        p->lru_first = b;
    p->lru_last = b;
}

/* Gives a free page back to the storage. */
static void page_drop(mem_manager *m, mem_pool *p, mem_block *b)
    CUBE_REQUIRES(m->lock);

static void page_drop(mem_manager *m, mem_pool *p, mem_block *b)
{
    mem_bins_remove(&p->bins, b);
    lru_unlink(p, b);
    mem_pool_page_drop(m, p, b);
}

cube_error *mem_exclusive_alloc(mem_manager *m, mem_pool *p, uint64_t size,
                                mem_block **out)
{
    uint64_t extent = mem_round(m, size);
    uint64_t slack = (extent / 8u) & ~(m->dev.alignment - 1u);
    uint64_t most = extent > UINT64_MAX - slack ? UINT64_MAX : extent + slack;
    mem_block *b = mem_bins_find(&p->bins, extent, most, 1);
    if (!b && !mem_pool_room(p, extent)) {
        b = mem_bins_find(&p->bins, extent, UINT64_MAX, 1);
        while (!b && p->lru_first && !mem_pool_room(p, extent))
            page_drop(m, p, p->lru_first);
        if (!b && !mem_pool_room(p, extent)) {
            *out = NULL;
            return NULL;
        }
    }
    if (b) {
        mem_bins_remove(&p->bins, b);
        lru_unlink(p, b);
    } else {
        uint64_t address = 0;
        cube_error *err = mem_storage_get(m, extent, &address);
        if (err)
            return cube_error_prefix(err, "a new page of pool %u",
                                     (unsigned)p->index);
        b = mem_pool_page_new(m, p, address, extent);
    }
    return mem_hand_out(m, p, b, size, b->size, out);
}

void mem_exclusive_free(mem_manager *m, mem_block *b)
{
    mem_pool *p = b->pool;
    mem_stats_live_remove(m, &p->st, b->requested, b->size);
    b->requested = 0;
    mem_bins_insert(&p->bins, b);
    lru_append(p, b);
    uint64_t after = p->config.release_after_ms;
    if (after) {
        b->freed_ms = mem_now_ms();
        if (b->freed_ms + after < m->next_expiry_ms)
            m->next_expiry_ms = b->freed_ms + after;
    }
}

uint64_t mem_exclusive_release(mem_manager *m, mem_pool *p, uint64_t now_ms)
{
    uint64_t released = 0;
    uint64_t after = p->config.release_after_ms;
    if (now_ms != UINT64_MAX && after == 0)
        return 0;
    while (p->lru_first) {
        mem_block *b = p->lru_first;
        if (now_ms != UINT64_MAX && b->freed_ms + after > now_ms)
            break;
        released += b->size;
        page_drop(m, p, b);
    }
    if (released && now_ms != UINT64_MAX)
        cube_log_write(CUBE_LOG_DEBUG, "memory",
                       "pool %u: gave back %llu bytes of pages unused for "
                       "%u ms",
                       (unsigned)p->index, (unsigned long long)released,
                       (unsigned)after);
    return released;
}

void mem_exclusive_fini(mem_manager *m, mem_pool *p)
{
    mem_pool_drop_all(m, p);
    p->lru_first = p->lru_last = NULL;
    mem_bins_fini(&p->bins);
}
