/* Sliced pools: pages carved into slices.
 *
 * A page's slices tile it exactly, in address order (prev/next), each a
 * multiple of the alignment long, so every slice address is aligned when
 * the page is. Free slices of all the pool's pages sit in the pool's
 * size-class bins. A request takes the front of a fitting free slice (the
 * rest stays free); a freed slice merges at once with free neighbours, so
 * a page is empty exactly when one free slice covers it. Free slices keep
 * their whole extent, so a freed slot always fits a request of its own
 * size again. Empty pages stay until a cleanup (or an out-of-memory
 * retry) gives them back; a page never moves while it holds a live slice.
 * release_after_ms does not apply to sliced pools.
 *
 * The slice freed last waits unmerged (the pool's hot slice): the common
 * loop that frees a buffer and asks for one of the same size again takes
 * it straight back. Any other request, the next free, a release or the
 * end of the pool merges it as a free would have, so at most one slice
 * per pool is ever left unmerged.
 *
 * Page sizes. With L the device's page limit (mem_page_limit: 256 MiB, or
 * an eighth of a smaller device), a pool whose page_size is at most L has
 * pages of exactly page_size bytes. A pool whose page_size is above L
 * treats page_size as its largest page, as an exclusive pool does: a new
 * page is the request rounded up to the granule (2 MiB), but at least
 * L / 4 (64 MiB on large devices; so small requests share a page) and at
 * most page_size. Such pages are segments sized to what asked for
 * them that later requests of any size in the pool's range split, and
 * their free slices merge back as in any page, so memory a large buffer
 * held serves smaller ones afterwards and sizes that vary between
 * iterations (sequence lengths, batch shapes) reuse the same pages instead
 * of reserving pages per size. When the pool's cap has no room for such a
 * page, or the storage refuses it even after the out-of-memory release,
 * the pool asks for a page of just the request rounded to the granule.
 */
#include <stdlib.h>

#include "base/dlist.h"
#include "base/error.h"
#include "base/log.h"
#include "memory/mem_internal.h"

cube_error *mem_sliced_init(mem_manager *m, mem_pool *p)
{
    uint64_t page = p->config.page_size;
    uint64_t limit = mem_page_limit(&m->dev);
    uint64_t granule = limit < MEM_PAGE_GRANULE ? limit : MEM_PAGE_GRANULE;
    p->granule = mem_round(m, granule);
    p->hot = NULL;
    p->page_least = page;
    if (page > limit) {
        uint64_t least = mem_round(m, limit / MEM_PAGE_LEAST_SHARE);
        p->page_least = least > p->granule ? least : p->granule;
    }
    return mem_bins_init(&p->bins, page, m->shift);
}

/* `extent` rounded up to the pool's granule, at most page_size. */
static uint64_t granule_round(const mem_pool *p, uint64_t extent)
{
    uint64_t most = p->config.page_size;
    uint64_t g = p->granule;
    if (extent >= most || most - extent < g)
        return most;
    return (extent + g - 1) / g * g;
}

/* The size of a new page for a slice of `extent` bytes (at most
 * page_size): page_size, or for a pool of request-sized pages the extent
 * rounded to the granule, at least page_least; 0 when the pool's cap has
 * no room for a page that holds it. */
static uint64_t page_size_for(const mem_pool *p, uint64_t extent)
{
    uint64_t size = p->config.page_size;
    if (p->page_least >= size)
        return mem_pool_room(p, size) ? size : 0;
    uint64_t fit = granule_round(p, extent);
    size = fit > p->page_least ? fit : p->page_least;
    if (mem_pool_room(p, size))
        return size;
    return mem_pool_room(p, fit) ? fit : 0;
}

/* A new page of `size` bytes, as one free slice (not in the bins); NULL
 * and *err when the page cannot be had. */
/* Called with m->lock held. */
static mem_block *page_new(mem_manager *m, mem_pool *p, uint64_t size,
                           cube_error **err) CUBE_REQUIRES(m->lock);
static void page_drop(mem_manager *m, mem_pool *p, mem_page *page)
    CUBE_REQUIRES(m->lock);

static mem_block *page_new(mem_manager *m, mem_pool *p, uint64_t size,
                           cube_error **err)
{
    mem_page *page = malloc(sizeof *page);
    if (!page) {
        *err = cube_error_new(CUBE_ERR_OUT_OF_MEMORY,
                              "no host memory for a page record");
        return NULL;
    }
    uint64_t address = 0;
    *err = mem_storage_get(m, size, &address);
    if (*err) {
        free(page);
        *err = cube_error_prefix(*err, "a new page of pool %u",
                                 (unsigned)p->index);
        return NULL;
    }
    mem_block *b = mem_record_for(m, p, address, size);
    b->page = page;
    page->address = address;
    page->size = size;
    page->first = b;
    page->prev = NULL;
    page->next = p->pages;
    if (p->pages)
        p->pages->prev = page;
    p->pages = page;
    mem_stats_page_add(m, &p->st, size);
    cube_log_write(CUBE_LOG_DEBUG, "memory",
                   "pool %u: new page of %llu bytes (%llu pages)",
                   (unsigned)p->index, (unsigned long long)size,
                   (unsigned long long)p->st.pages);
    return b;
}

static void page_drop(mem_manager *m, mem_pool *p, mem_page *page)
{
    CUBE_DLIST_UNLINK(p->pages, page, prev, next);
    mem_storage_put(m, page->address, page->size);
    mem_stats_page_remove(m, &p->st, page->size);
    free(page);
}

cube_error *mem_sliced_alloc(mem_manager *m, mem_pool *p, uint64_t size,
                             mem_block **out)
{
    uint64_t extent = mem_round(m, size);
    /* The slice freed last, of this very extent: no search, no split. */
    mem_block *b = mem_hot_take(m, p, size, extent);
    if (b) {
        *out = b;
        return NULL;
    }
    mem_hot_file(m, p);
    b = mem_bins_find(&p->bins, extent, UINT64_MAX, 1);
    if (b) {
        mem_bins_remove(&p->bins, b);
    } else {
        uint64_t page = page_size_for(p, extent);
        if (!page) {
            *out = NULL;
            return NULL;
        }
        cube_error *err = NULL;
        b = page_new(m, p, page, &err);
        uint64_t fit = granule_round(p, extent);
        if (!b && p->page_least < p->config.page_size && fit < page &&
            cube_error_code(err) == CUBE_ERR_OUT_OF_MEMORY) {
            /* The storage refused a page larger than the request (after
             * releasing what was unused): one of just the request. */
            cube_error_ignore(err, "a page of just the request is tried");
            err = NULL;
            b = page_new(m, p, fit, &err);
        }
        if (!b)
            return err;
    }
    /* The rest of the slice stays free, right after the new one. */
    mem_split(m, p, b, extent);
    return mem_hand_out(m, p, b, size, extent, out);
}

void mem_split(mem_manager *m, mem_pool *p, mem_block *b, uint64_t extent)
{
    if (b->size <= extent)
        return;
    mem_block *rest =
        mem_record_for(m, p, b->address + extent, b->size - extent);
    rest->page = b->page;
    rest->prev = b;
    rest->next = b->next;
    if (b->next)
        b->next->prev = rest;
    b->next = rest;
    b->size = extent;
    mem_bins_insert(&p->bins, rest);
}

void mem_merge_and_file(mem_manager *m, mem_pool *p, mem_block *b)
{
    mem_block *prev = b->prev;
    mem_block *next = b->next;
    if (prev && !prev->requested && prev != p->hot) {
        mem_bins_remove(&p->bins, prev);
        prev->size += b->size;
        prev->next = next;
        if (next)
            next->prev = prev;
        mem_record_give(m, b);
        b = prev;
    }
    if (next && !next->requested && next != p->hot) {
        mem_bins_remove(&p->bins, next);
        b->size += next->size;
        b->next = next->next;
        if (b->next)
            b->next->prev = b;
        mem_record_give(m, next);
    }
    mem_bins_insert(&p->bins, b);
}

void mem_hot_file(mem_manager *m, mem_pool *p)
{
    mem_block *b = p->hot;
    if (!b)
        return;
    p->hot = NULL;
    mem_merge_and_file(m, p, b);
}

mem_block *mem_hot_take(mem_manager *m, mem_pool *p, uint64_t size,
                        uint64_t extent)
{
    mem_block *b = p->hot;
    if (!b || b->size != extent)
        return NULL;
    p->hot = NULL;
    b->requested = size;
    mem_stats_live_add(m, &p->st, size, extent);
    return b;
}

void mem_hot_free(mem_manager *m, mem_block *b)
{
    mem_pool *p = b->pool;
    /* The previous hot block first, while `b` still counts as live: it
     * must not merge with a block that is in no bin. */
    mem_hot_file(m, p);
    mem_stats_live_remove(m, &p->st, b->requested, b->size);
    b->requested = 0;
    p->hot = b;
}

void mem_chain_give(mem_manager *m, mem_pool *p, mem_block *b)
{
    while (b) {
        mem_block *next = b->next;
        if (b->requested)
            mem_stats_live_remove(m, &p->st, b->requested, b->size);
        mem_record_give(m, b);
        b = next;
    }
}

uint64_t mem_sliced_release(mem_manager *m, mem_pool *p)
{
    mem_hot_file(m, p);
    uint64_t released = 0;
    mem_page *page = p->pages;
    while (page) {
        mem_page *next = page->next;
        mem_block *b = page->first;
        if (!b->requested && !b->next) {
            mem_bins_remove(&p->bins, b);
            mem_record_give(m, b);
            released += page->size;
            page_drop(m, p, page);
        }
        page = next;
    }
    return released;
}

void mem_sliced_fini(mem_manager *m, mem_pool *p)
{
    p->hot = NULL; /* every page goes, filed or not */
    while (p->pages) {
        mem_page *page = p->pages;
        mem_chain_give(m, p, page->first);
        page_drop(m, p, page);
    }
    mem_bins_fini(&p->bins);
}
