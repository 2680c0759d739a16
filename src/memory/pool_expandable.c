/* Expandable pools: one reserved range of address space per pool, whose
 * pages are mapped when a block first covers them.
 *
 * The range. At the pool's first request the storage reserves its range
 * (mem_expandable_range: the cap, or the device's memory when there is
 * none, rounded up to the storage's granularity); nothing is mapped then.
 * The range is given back when the pool is rebuilt or destroyed.
 *
 * Blocks tile the range in address order (prev/next), each a multiple of
 * the alignment long, as the slices of one sliced page do: a request takes
 * the front of a fitting free block found in the size-class bins (the rest
 * stays free), and a freed block merges at once with free neighbours.
 * Blocks never move, so the range grows in place: a request larger than
 * every free block takes the free run at the end of what was used, and a
 * run freed by large buffers serves any mix of smaller ones later. The
 * block freed last waits unmerged (the hot block), as in a sliced pool.
 *
 * Pages and chunks. A page is the storage's granularity (2 MiB on the
 * host and on GPUs), or the alignment when that is larger. A request maps
 * the pages of its block that are not mapped yet, each run of them cut at
 * multiples of MEM_VM_CHUNK_PAGES pages, and around the block's first and
 * last pages where it covers them only in part, into chunks: one storage
 * map per chunk (on a GPU one physical allocation, cuda_vmm.c), and a
 * chunk is unmapped whole, with one storage call. Two bitmaps say which pages
 * are mapped and which start a chunk (a chunk runs to the next start or the
 * next page not mapped). The chunks of a freed block stay mapped (cached:
 * counted in bytes_reserved) until a cleanup or an out-of-memory retry
 * unmaps every chunk that lies wholly inside a free block. So:
 *  - a request served from pages already mapped (a pool hit, including
 *    every request a training loop repeats once its first step has run)
 *    makes no call to the storage: a bin lookup, a split and a scan of
 *    the block's bits in the bitmap, or for the hot block none of these;
 *  - a free never calls the storage: unmapping at each free would make
 *    the next request of that memory map it again (a system call and
 *    page faults on the host; driver calls on a GPU);
 *  - bytes_reserved is the mapped pages: the live blocks, the rest of the
 *    chunks they touch, and the cached chunks of free blocks.
 *
 * Unmap before map. Cached chunks left in holes between live blocks would
 * otherwise add up (1.145x the peak live on a PyTorch GPT-2 training
 * trace). So the pool keeps a mark, the most pages its live blocks have
 * touched at a map since its free chunks were last released (cleanup and
 * the out-of-memory retry restart it), and a request that would take the
 * mapped pages past the mark plus 1/MEM_VM_SLACK first unmaps as many
 * pages of free chunks elsewhere, the range's highest first. A request
 * whose bins' choice needs new pages takes the free block that needs the
 * fewest (refit). The slack is what lets a step that repeats with its
 * blocks placed a little differently find its pages mapped: a mark at the
 * most pages ever mapped (with no slack) made GPT-2 training shed and map
 * again 28.7 GiB per pass of four steps. The slack is over the pages
 * live blocks touch, not over the pages mapped (cached chunks included),
 * so it does not ratchet up. An unmap
 * costs a storage call on a path that maps anyway (on a GPU the unmap
 * records an event and the memory goes once the queued work has passed
 * it: no wait); a pool hit never unmaps.
 *
 * Out of memory: a map the storage refuses releases what every pool holds
 * unused and retries once (mem_storage_map); if that fails too the block
 * goes back, the pages this request mapped are unmapped and the request is
 * CUBE_ERR_OUT_OF_MEMORY, the pool as it was before it. A range that cannot
 * be reserved is CUBE_ERR_OUT_OF_MEMORY too, and the next request tries
 * again. An uncapped pool whose range has no free run for a request (live
 * blocks and the gaps between them fill the device) answers
 * CUBE_ERR_OUT_OF_MEMORY; a capped one spills the request over to the
 * next pool, as a sliced pool at its cap does. release_after_ms does not
 * apply to expandable pools.
 */
#include <stdlib.h>

#include "base/error.h"
#include "base/log.h"
#include "memory/mem_internal.h"

typedef unsigned long long ull;

static uint64_t vm_page_of(const mem_manager *m)
{
    uint64_t g = m->ops.granularity;
    return g > m->dev.alignment ? g : m->dev.alignment;
}

uint64_t mem_expandable_range(const mem_manager *m, const mem_pool *p)
{
    uint64_t g = vm_page_of(m);
    uint64_t want = p->config.cap ? p->config.cap : m->dev.memory_size;
    if (want > UINT64_MAX - (g - 1))
        return want & ~(g - 1);
    return (want + g - 1) & ~(g - 1);
}

cube_error *mem_expandable_init(mem_manager *m, mem_pool *p)
{
    const mem_storage_ops *o = &m->ops;
    if (!o->granularity || (o->granularity & (o->granularity - 1)) != 0 ||
        !o->reserve || !o->map || !o->unmap || !o->release)
        return cube_error_new(CUBE_ERR_UNSUPPORTED,
                              "pool %u is expandable, but this device's "
                              "storage has no virtual memory",
                              (unsigned)p->index);
    p->vm_page = vm_page_of(m);
    p->vm_base = p->vm_size = p->vm_mark = 0;
    p->vm_first = NULL;
    p->vm_mapped = p->vm_heads = NULL;
    p->hot = NULL;
    return mem_bins_init(&p->bins, mem_expandable_range(m, p), m->shift);
}

/* --- the bitmap of mapped pages --- */

/* The first page in [i, end) whose bit is `want`, or end. */
static uint64_t find_page(const uint64_t *bits, uint64_t i, uint64_t end,
                          int want)
{
    while (i < end) {
        uint64_t w = want ? bits[i / 64u] : ~bits[i / 64u];
        w &= ~0ull << (i % 64u);
        uint64_t word = i & ~63ull;
        if (w) {
            uint64_t k = word + (uint64_t)__builtin_ctzll(w);
            return k < end ? k : end;
        }
        i = word + 64u;
    }
    return end;
}

static void pages_mark(uint64_t *bits, uint64_t i, uint64_t end, int on)
{
    for (; i < end; i++) {
        if (on)
            bits[i / 64u] |= 1ull << (i % 64u);
        else
            bits[i / 64u] &= ~(1ull << (i % 64u));
    }
}

/* Pages among [lo, hi) that are not mapped. */
static uint64_t count_unmapped(const uint64_t *bits, uint64_t lo, uint64_t hi)
{
    uint64_t n = 0;
    uint64_t i = find_page(bits, lo, hi, 0);
    while (i < hi) {
        uint64_t j = find_page(bits, i, hi, 1);
        n += j - i;
        i = find_page(bits, j, hi, 0);
    }
    return n;
}

/* One past the last page in [lo, hi) whose bit is `want`, or lo: a word
 * at a time, as the free block at the range's top spans most of it. */
static uint64_t find_page_back(const uint64_t *bits, uint64_t lo, uint64_t hi,
                               int want)
{
    while (hi > lo) {
        uint64_t k = hi - 1;
        uint64_t w = want ? bits[k / 64u] : ~bits[k / 64u];
        w &= ~0ull >> (63u - k % 64u); /* bits 0..k%64 */
        uint64_t word = k & ~63ull;
        if (w) {
            uint64_t at = word + 64u - (uint64_t)__builtin_clzll(w);
            return at > lo ? at : lo;
        }
        hi = word;
    }
    return lo;
}

/* --- chunks: one storage map each --- */

/* One past the last page of the chunk whose head is page `h`: the next
 * head or the next page not mapped. */
static uint64_t chunk_end(const mem_pool *p, uint64_t h)
{
    uint64_t pages = p->vm_size / p->vm_page;
    uint64_t e = find_page(p->vm_heads, h + 1, pages, 1);
    uint64_t u = find_page(p->vm_mapped, h + 1, e, 0);
    return u < e ? u : e;
}

/* Unmaps the chunk [h, e): one storage call; returns its pages. */
static uint64_t chunk_unmap(mem_manager *m, mem_pool *p, uint64_t h, uint64_t e)
    CUBE_REQUIRES(m->lock);

static uint64_t chunk_unmap(mem_manager *m, mem_pool *p, uint64_t h, uint64_t e)
{
    uint64_t g = p->vm_page;
    m->ops.unmap(m->ops.self, p->vm_base + h * g, (e - h) * g);
    m->tot.storage_frees++;
    pages_mark(p->vm_mapped, h, e, 0);
    pages_mark(p->vm_heads, h, h + 1, 0);
    mem_stats_pages_remove(m, &p->st, e - h, (e - h) * g);
    return e - h;
}

/* Unmaps the chunks lying wholly inside pages [lo, hi), from the highest
 * down, until `want` pages went; returns the pages unmapped. */
static uint64_t unmap_inside(mem_manager *m, mem_pool *p, uint64_t lo,
                             uint64_t hi, uint64_t want) CUBE_REQUIRES(m->lock);

static uint64_t unmap_inside(mem_manager *m, mem_pool *p, uint64_t lo,
                             uint64_t hi, uint64_t want)
{
    uint64_t done = 0;
    while (lo < hi && done < want) {
        /* The last head below hi, then the chunk it starts. */
        uint64_t at = find_page_back(p->vm_heads, lo, hi, 1);
        if (at == lo)
            break;
        uint64_t h = at - 1, e = chunk_end(p, h);
        if (e <= hi)
            done += chunk_unmap(m, p, h, e);
        hi = h;
    }
    return done;
}

/* The mapped pages the pool may hold when it maps: its mark (the most
 * pages its live blocks have touched at a map since its free chunks were
 * last released) and a slack of 1/MEM_VM_SLACK of it, so that a step
 * that repeats with its blocks placed a little differently finds its
 * pages still mapped instead of shedding and mapping again. */
#define MEM_VM_SLACK 28u

static uint64_t vm_limit(const mem_pool *p)
{
    return p->vm_mark + p->vm_mark / MEM_VM_SLACK;
}

/* Mapped pages lying wholly inside free blocks: the rest are touched by
 * live blocks (or by one being mapped, already marked live). */
static uint64_t free_mapped(const mem_pool *p)
{
    uint64_t g = p->vm_page, n = 0;
    for (const mem_block *b = p->vm_first; b; b = b->next) {
        if (b->requested)
            continue;
        uint64_t lo = (b->address - p->vm_base + g - 1) / g;
        uint64_t hi = (b->address + b->size - p->vm_base) / g;
        if (lo < hi)
            n += (hi - lo) - count_unmapped(p->vm_mapped, lo, hi);
    }
    return n;
}

/* Unmaps whole chunks lying inside free blocks until `want` pages went
 * (or none is left), the highest first; returns the pages unmapped. The
 * top of the range is what address-ordered growth reaches last, so its
 * free pages are the ones least likely to be asked for again soon. A
 * slow path: the caller is about to map pages anyway. */
static uint64_t shed(mem_manager *m, mem_pool *p, uint64_t want)
    CUBE_REQUIRES(m->lock);

static uint64_t shed(mem_manager *m, mem_pool *p, uint64_t want)
{
    uint64_t g = p->vm_page, done = 0;
    mem_block *b = p->vm_first;
    while (b->next)
        b = b->next;
    for (; b && done < want; b = b->prev) {
        if (b->requested)
            continue;
        uint64_t lo = (b->address - p->vm_base + g - 1) / g;
        uint64_t hi = (b->address + b->size - p->vm_base) / g;
        done += unmap_inside(m, p, lo, hi, want - done);
    }
    return done;
}

/* Maps the pages `b` covers that are not mapped yet, one chunk (one
 * storage call) per run of them, first shedding as many free pages
 * elsewhere as would take the pool past its limit (unmap before map). On
 * an error, what this call mapped stays mapped (the caller frees the
 * block and releases the pool). */
static cube_error *map_block(mem_manager *m, mem_pool *p, const mem_block *b)
    CUBE_REQUIRES(m->lock);

static cube_error *map_block(mem_manager *m, mem_pool *p, const mem_block *b)
{
    uint64_t g = p->vm_page;
    uint64_t end = (b->address + b->size - p->vm_base + g - 1) / g;
    uint64_t first = (b->address - p->vm_base) / g;
    uint64_t i = find_page(p->vm_mapped, first, end, 0);
    if (i >= end)
        return NULL;
    uint64_t need = count_unmapped(p->vm_mapped, i, end);
    uint64_t touched = p->st.pages - free_mapped(p) + need;
    if (touched > p->vm_mark)
        p->vm_mark = touched;
    uint64_t limit = vm_limit(p);
    if (p->st.pages + need > limit)
        shed(m, p, p->st.pages + need - limit);
    /* A page the block shares only in part (its first or last) is a
     * chunk of its own: a neighbour placed there later would otherwise
     * pin the block's whole chunk once the block is freed. */
    uint64_t head_cut = (b->address - p->vm_base) % g ? first + 1 : first;
    uint64_t tail_cut = (b->address + b->size - p->vm_base) % g ? end - 1 : end;
    while (i < end) {
        uint64_t j = find_page(p->vm_mapped, i, end, 1);
        uint64_t cell = (i / MEM_VM_CHUNK_PAGES + 1) * MEM_VM_CHUNK_PAGES;
        if (j > cell)
            j = cell;
        if (i < head_cut && j > head_cut)
            j = head_cut;
        if (i < tail_cut && j > tail_cut)
            j = tail_cut;
        cube_error *err = mem_storage_map(m, p->vm_base + i * g, (j - i) * g);
        if (err)
            return err;
        pages_mark(p->vm_mapped, i, j, 1);
        pages_mark(p->vm_heads, i, i + 1, 1);
        mem_stats_pages_add(m, &p->st, j - i, (j - i) * g);
        i = find_page(p->vm_mapped, j, end, 0);
    }
    return NULL;
}

/* --- requests --- */

/* Reserves the pool's range: one free block covering it. */
static cube_error *range_reserve(mem_manager *m, mem_pool *p)
    CUBE_REQUIRES(m->lock);

static cube_error *range_reserve(mem_manager *m, mem_pool *p)
{
    uint64_t size = mem_expandable_range(m, p);
    uint64_t pages = size / p->vm_page;
    /* The mapped pages, then the chunks' first pages, in one block. */
    size_t words = (size_t)((pages + 63u) / 64u);
    uint64_t *bits = calloc(2 * words, sizeof *bits);
    if (!bits)
        return cube_error_new(CUBE_ERR_OUT_OF_MEMORY,
                              "pool %u: no host memory for the map of "
                              "%llu pages",
                              (unsigned)p->index, (ull)pages);
    uint64_t base = 0;
    cube_error *err = m->ops.reserve(m->ops.self, size, p->vm_page, &base);
    if (err) {
        free(bits);
        if (cube_error_code(err) != CUBE_ERR_OUT_OF_MEMORY &&
            cube_error_code(err) != CUBE_ERR_DEVICE_FAULT)
            return cube_error_wrap(err, CUBE_ERR_OUT_OF_MEMORY,
                                   "pool %u: reserving %llu bytes of address "
                                   "space",
                                   (unsigned)p->index, (ull)size);
        return cube_error_prefix(err,
                                 "pool %u: reserving %llu bytes of address "
                                 "space",
                                 (unsigned)p->index, (ull)size);
    }
    mem_block *b = mem_record_for(m, p, base, size);
    p->vm_base = base;
    p->vm_size = size;
    p->vm_first = b;
    p->vm_mapped = bits;
    p->vm_heads = bits + words;
    mem_bins_insert(&p->bins, b);
    cube_log_write(CUBE_LOG_DEBUG, "memory",
                   "pool %u: reserved %llu bytes of address space at 0x%llx "
                   "(pages of %llu bytes)",
                   (unsigned)p->index, (ull)size, (ull)base, (ull)p->vm_page);
    return NULL;
}

/* Pages [address, address + extent) would map. */
static uint64_t need_of(const mem_pool *p, uint64_t address, uint64_t extent)
{
    uint64_t g = p->vm_page;
    uint64_t lo = (address - p->vm_base) / g;
    uint64_t hi = (address + extent - p->vm_base + g - 1) / g;
    return count_unmapped(p->vm_mapped, lo, hi);
}

/* The free block a request of `extent` takes: `b` (the bins' choice)
 * unless it needs pages not mapped, else the free block whose front maps
 * the fewest (the first of them in address order). Without this, a step
 * that repeats lands partly on pages not mapped while free mapped pages
 * sit elsewhere, and unmap before map sheds and maps again, every step.
 * A slow path: it runs only when a map would be due. */
static mem_block *refit(const mem_pool *p, mem_block *b, uint64_t extent)
{
    uint64_t need = need_of(p, b->address, extent);
    if (!need)
        return b;
    for (mem_block *x = p->vm_first; x; x = x->next) {
        if (x->requested || x == p->hot || x->size < extent)
            continue;
        uint64_t n = need_of(p, x->address, extent);
        if (n < need) {
            need = n;
            b = x;
            if (!n)
                break;
        }
    }
    return b;
}

cube_error *mem_expandable_alloc(mem_manager *m, mem_pool *p, uint64_t size,
                                 mem_block **out)
{
    uint64_t extent = mem_round(m, size);
    /* The block freed last, of this very extent, pages still mapped. */
    mem_block *b = mem_hot_take(m, p, size, extent);
    *out = b;
    if (b)
        return NULL;
    mem_hot_file(m, p);
    cube_error *err = NULL;
    if (!p->vm_size && (err = range_reserve(m, p)) != NULL)
        return err;
    b = mem_bins_find(&p->bins, extent, UINT64_MAX, 1);
    if (!b) {
        if (p->config.cap)
            return NULL; /* spills over */
        return cube_error_new(CUBE_ERR_OUT_OF_MEMORY,
                              "pool %u: no free run of %llu bytes in its "
                              "range of %llu bytes (%llu bytes in use, %llu "
                              "mapped)",
                              (unsigned)p->index, (ull)extent, (ull)p->vm_size,
                              (ull)p->st.in_use, (ull)p->st.reserved);
    }
    b = refit(p, b, extent);
    mem_bins_remove(&p->bins, b);
    mem_split(m, p, b, extent);
    /* Live while its pages are mapped: an out-of-memory release in
     * between must leave them alone. */
    b->requested = size;
    err = map_block(m, p, b);
    if (err) {
        b->requested = 0;
        mem_merge_and_file(m, p, b);
        mem_expandable_release(m, p);
        return cube_error_prefix(err, "pool %u: a block of %llu bytes",
                                 (unsigned)p->index, (ull)extent);
    }
    return mem_hand_out(m, p, b, size, extent, out);
}

uint64_t mem_expandable_release(mem_manager *m, mem_pool *p)
{
    if (!p->vm_size)
        return 0;
    mem_hot_file(m, p);
    uint64_t g = p->vm_page, released = 0;
    for (mem_block *b = p->vm_first; b && p->st.pages; b = b->next) {
        if (b->requested)
            continue;
        uint64_t lo = (b->address - p->vm_base + g - 1) / g;
        uint64_t hi = (b->address + b->size - p->vm_base) / g;
        released += unmap_inside(m, p, lo, hi, UINT64_MAX) * g;
    }
    /* The mark restarts from what live blocks touch: a caller who gave
     * memory back wants the next phase held to its own high-water mark,
     * not to that of a larger phase before it. */
    p->vm_mark = p->st.pages - free_mapped(p);
    return released;
}

void mem_expandable_fini(mem_manager *m, mem_pool *p)
{
    p->hot = NULL; /* every block goes, filed or not */
    if (p->vm_size) {
        mem_chain_give(m, p, p->vm_first);
        unmap_inside(m, p, 0, p->vm_size / p->vm_page, UINT64_MAX);
        m->ops.release(m->ops.self, p->vm_base, p->vm_size);
        free(p->vm_mapped);
        p->vm_mapped = p->vm_heads = NULL;
        p->vm_first = NULL;
        p->vm_base = p->vm_size = p->vm_mark = 0;
    }
    mem_bins_fini(&p->bins);
}
