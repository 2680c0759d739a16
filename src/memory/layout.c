/* Preset layouts and layout validation (see memory.h).
 *
 * CUBE_PRESET_SUBSLICES, for a device of M bytes and alignment A (every
 * size below rounded up to A, and at least A), with L the device's page
 * limit (mem_page_limit: min(256 MiB, the largest power of two <= M / 8))
 * and X = min(8 L, M / 8) (2 GiB on devices of 16 GiB and more):
 *  - sliced pools of fixed pages whose pages hold at least 16 of their
 *    largest buffers: pages of 2 MiB for buffers up to 128 KiB, then
 *    pages 8 times larger each step, each pool taking the sizes above the
 *    previous one's; the page size stops growing at L. A page never takes
 *    more than an eighth of the device. When X is above L, the step of
 *    16 MiB pages (buffers up to 1 MiB) is the last, or the step that
 *    reaches L if that comes first; otherwise the step that reaches L is
 *    the last (so on a 64 MiB device: 2 MiB pages up to 128 KiB, then
 *    8 MiB pages up to 512 KiB);
 *  - when X is above L, one sliced pool of request-sized pages for the
 *    sizes above, up to X: its page_size is X, and as that is above L each
 *    new page is the request rounded up to 2 MiB, at least L / 4 (64 MiB
 *    on large devices; pool_sliced.c). A page that a large buffer asked
 *    for is split by smaller requests later and merges back when they are
 *    freed, so large buffers whose sizes change between iterations
 *    (sequence lengths, batch shapes) reuse the memory already held
 *    instead of each size getting pages of its own. Its pages stay cached
 *    until a cleanup or an out-of-memory retry;
 *  - then one exclusive pool for the sizes above, up to M / 4 (rounded
 *    down to A), whose pages are released after 5 s unused;
 *  - anything larger goes to the large tail, an exact-size block.
 * CUBE_PRESET_EXCLUSIVE: one exclusive pool for sizes up to M / 4, the
 * rest in the large tail.
 * CUBE_PRESET_EXPANDABLE: the subslices preset's first sliced pool (2 MiB
 * pages, or L where that is smaller: buffers up to 128 KiB on large
 * devices), then one expandable pool for every larger size up to M
 * (rounded down to A), with no cap: its range is the device's memory,
 * mapped page by page as buffers need it (pool_expandable.c). Small
 * buffers stay out of it: a long-lived small buffer in the range would
 * keep a whole mapped page apart from the large runs around it. Buffers of
 * 128 KiB to 1 MiB go to the range: in a sliced pool of 16 MiB pages they
 * held a page mostly free (up to 16 MiB beside 1.4-3 GiB live on the
 * recorded traces), and in the range they fill the holes large buffers
 * leave between pages (benchmarks: 1.039 to 1.014 on GPT-2 inference).
 */
#include <stdarg.h>
#include <string.h>

#include "base/error.h"
#include "memory/mem_internal.h"

#define MIB (1ull << 20)
#define PRESET_FIRST_PAGE (2 * MIB)
#define PRESET_LAST_PAGE (16 * MIB) /* before request-sized pages */
#define PRESET_PAGE_LIMIT (256 * MIB)
#define PRESET_PAGE_GROWTH 8u
#define PRESET_SLICES_PER_PAGE 16u
#define PRESET_LARGE_PAGES 8u /* X = 8 L */
#define PRESET_RELEASE_MS 5000u

typedef unsigned long long ull;

static uint64_t round_up(uint64_t v, uint64_t a)
{
    return (v + a - 1) & ~(a - 1);
}

static uint64_t round_down(uint64_t v, uint64_t a)
{
    return v & ~(a - 1);
}

static uint64_t pow2_floor(uint64_t v)
{
    return v ? 1ull << (63 - __builtin_clzll(v)) : 0;
}

static uint64_t at_least(uint64_t v, uint64_t floor)
{
    return v > floor ? v : floor;
}

cube_error *mem_device_check(const mem_device *dev)
{
    if (!dev)
        return cube_error_new(CUBE_ERR_INVALID_ARGUMENT,
                              "memory: the device is NULL");
    if (dev->alignment == 0 || (dev->alignment & (dev->alignment - 1)) != 0)
        return cube_error_new(CUBE_ERR_INVALID_ARGUMENT,
                              "memory: the device alignment %llu is not a "
                              "power of two",
                              (ull)dev->alignment);
    if (dev->memory_size < dev->alignment)
        return cube_error_new(CUBE_ERR_INVALID_ARGUMENT,
                              "memory: the device memory size %llu is below "
                              "its alignment %llu",
                              (ull)dev->memory_size, (ull)dev->alignment);
    return NULL;
}

uint64_t mem_page_limit(const mem_device *dev)
{
    uint64_t a = dev->alignment;
    uint64_t limit = pow2_floor(dev->memory_size / 8u);
    if (limit > PRESET_PAGE_LIMIT)
        limit = PRESET_PAGE_LIMIT;
    limit = at_least(round_up(limit, a), a);
    if (limit > round_down(dev->memory_size, a))
        limit = round_down(dev->memory_size, a);
    return limit;
}

static void add_pool(cube_memory_layout *out, cube_pool_kind kind,
                     uint64_t page, uint64_t min, uint64_t max,
                     uint32_t release_ms)
{
    cube_pool_config *c = &out->pools[out->count++];
    c->kind = kind;
    c->page_size = page;
    c->min_size = min;
    c->max_size = max;
    c->cap = 0;
    c->release_after_ms = release_ms;
}

cube_error *mem_layout_preset(cube_layout_preset preset, const mem_device *dev,
                              cube_memory_layout *out)
{
    if (!out)
        return cube_error_null_argument("memory layout preset", "out");
    cube_error *err = mem_device_check(dev);
    if (err)
        return err;
    if (preset != CUBE_PRESET_SUBSLICES && preset != CUBE_PRESET_EXCLUSIVE &&
        preset != CUBE_PRESET_EXPANDABLE)
        return cube_error_new(CUBE_ERR_INVALID_ARGUMENT,
                              "memory layout preset %d is unknown",
                              (int)preset);
    uint64_t a = dev->alignment;
    uint64_t mem = dev->memory_size;
    memset(out, 0, sizeof *out);

    uint64_t covered = 0; /* the largest size the pools so far take */
    if (preset == CUBE_PRESET_EXPANDABLE) {
        uint64_t limit = mem_page_limit(dev);
        uint64_t want = PRESET_FIRST_PAGE;
        uint64_t page = round_up(want < limit ? want : limit, a);
        covered = round_up(page / PRESET_SLICES_PER_PAGE, a);
        add_pool(out, CUBE_POOL_SLICED, page, 1, covered, 0);
        uint64_t top = round_down(mem, a);
        if (top > covered)
            add_pool(out, CUBE_POOL_EXPANDABLE, top, covered + 1, top, 0);
        return NULL;
    }
    if (preset == CUBE_PRESET_SUBSLICES) {
        uint64_t limit = mem_page_limit(dev);
        uint64_t large = round_down(mem / 8u, a); /* X */
        if (limit <= UINT64_MAX / PRESET_LARGE_PAGES &&
            limit * PRESET_LARGE_PAGES < large)
            large = limit * PRESET_LARGE_PAGES;
        int varied = large > limit;
        for (uint64_t want = PRESET_FIRST_PAGE;; want *= PRESET_PAGE_GROWTH) {
            uint64_t page = round_up(want < limit ? want : limit, a);
            uint64_t max = round_up(page / PRESET_SLICES_PER_PAGE, a);
            if (max > covered) {
                add_pool(out, CUBE_POOL_SLICED, page, covered + 1, max, 0);
                covered = max;
            }
            if (page >= limit || (varied && want >= PRESET_LAST_PAGE))
                break;
        }
        /* Request-sized pages up to X. */
        if (varied && large > covered) {
            add_pool(out, CUBE_POOL_SLICED, large, covered + 1, large, 0);
            covered = large;
        }
    }
    uint64_t bound = at_least(round_down(mem / 4u, a), a);
    if (bound > covered)
        add_pool(out, CUBE_POOL_EXCLUSIVE, bound, covered + 1, bound,
                 PRESET_RELEASE_MS);
    return NULL;
}

/* Whether earlier pools without a cap take every size of [lo, hi] (a
 * capped pool spills over, so it never hides a later one). */
static int hidden(const cube_memory_layout *layout, uint32_t before,
                  uint64_t lo, uint64_t hi)
{
    uint64_t x = lo ? lo : 1;
    for (;;) {
        int moved = 0;
        for (uint32_t j = 0; j < before; j++) {
            const cube_pool_config *c = &layout->pools[j];
            if (c->cap != 0 || c->min_size > x || x > c->max_size)
                continue;
            if (c->max_size >= hi)
                return 1;
            x = c->max_size + 1;
            moved = 1;
        }
        if (!moved)
            return 0;
    }
}

static cube_error *bad(uint32_t i, const char *fmt, ...) CUBE_PRINTF(2, 3);

static cube_error *bad(uint32_t i, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    cube_error *err = cube_error_newv(CUBE_ERR_INVALID_ARGUMENT, fmt, ap);
    va_end(ap);
    return cube_error_prefix(err, "memory layout: pool %u", (unsigned)i);
}

static cube_error *pool_check(const cube_memory_layout *layout, uint32_t i,
                              const mem_device *dev)
{
    const cube_pool_config *c = &layout->pools[i];
    if (c->kind == CUBE_POOL_PERSISTENT)
        return bad(i, "kind is CUBE_POOL_PERSISTENT, but the persistent "
                      "pool is not part of a layout");
    if (c->kind != CUBE_POOL_SLICED && c->kind != CUBE_POOL_EXCLUSIVE &&
        c->kind != CUBE_POOL_EXPANDABLE)
        return bad(i,
                   "kind %d is not CUBE_POOL_SLICED, CUBE_POOL_EXCLUSIVE or "
                   "CUBE_POOL_EXPANDABLE",
                   (int)c->kind);
    if (c->page_size == 0)
        return bad(i, "page_size is 0");
    if (c->page_size % dev->alignment != 0)
        return bad(i, "page_size %llu is not a multiple of the alignment %llu",
                   (ull)c->page_size, (ull)dev->alignment);
    if (c->min_size > c->max_size)
        return bad(i, "min_size %llu is above max_size %llu", (ull)c->min_size,
                   (ull)c->max_size);
    if (c->max_size > c->page_size)
        return bad(i, "max_size %llu is above page_size %llu", (ull)c->max_size,
                   (ull)c->page_size);
    if (c->cap != 0 && c->cap < c->page_size)
        return bad(i, "cap %llu is below one page (page_size %llu)",
                   (ull)c->cap, (ull)c->page_size);
    if (c->max_size == 0)
        return bad(i, "max_size is 0, so no request ever reaches it");
    if (hidden(layout, i, c->min_size, c->max_size))
        return bad(i,
                   "min_size..max_size (%llu..%llu) is wholly taken by "
                   "earlier pools without a cap, so no request ever reaches "
                   "it",
                   (ull)c->min_size, (ull)c->max_size);
    if (c->page_size > dev->memory_size)
        return bad(i, "page_size %llu is larger than the device (%llu bytes)",
                   (ull)c->page_size, (ull)dev->memory_size);
    return NULL;
}

cube_error *mem_layout_validate(const cube_memory_layout *layout,
                                const mem_device *dev)
{
    if (!layout)
        return cube_error_new(CUBE_ERR_INVALID_ARGUMENT,
                              "memory layout: the layout is NULL");
    cube_error *err = mem_device_check(dev);
    if (err)
        return err;
    if (layout->count == 0)
        return cube_error_new(CUBE_ERR_INVALID_ARGUMENT,
                              "memory layout: no pools (count is 0)");
    if (layout->count > CUBE_MAX_POOLS)
        return cube_error_new(CUBE_ERR_INVALID_ARGUMENT,
                              "memory layout: count %u is above the %u pools "
                              "a layout may have",
                              (unsigned)layout->count,
                              (unsigned)CUBE_MAX_POOLS);
    for (uint32_t i = 0; i < layout->count; i++) {
        err = pool_check(layout, i, dev);
        if (err)
            return err;
    }
    return NULL;
}
