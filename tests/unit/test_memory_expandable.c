/* Expandable pools (src/memory/pool_expandable.c) over the host storage's
 * virtual memory (backends/common/host_memory.c), watched by a model of
 * the storage: it keeps every reservation, the set of mapped pages and
 * the chunks (what each map call mapped), and flags a map of a page
 * already mapped or across a multiple of MEM_VM_CHUNK_PAGES pages, an
 * unmap that is not exactly one map call's range (a GPU unmaps whole
 * mappings only), of a page not mapped or of one a live block touches,
 * and a release of a range with pages mapped.
 * After every step of seeded random sequences:
 *  - live blocks never overlap and are aligned; their first and last bytes
 *    (real memory: an unmapped page would fault) keep their stamps;
 *  - every page a live block touches is mapped;
 *  - usage counts the live blocks exactly; bytes_reserved is what the
 *    storage holds (allocated plus mapped), at least in use plus padding;
 *    an expandable pool's pages times the page size are its reserved
 *    bytes; the report's totals agree with usage;
 * and at the end everything is unmapped and every reservation given back.
 * Then: a refused map (with pages of the block already mapped and some
 * not; of the second chunk of a block), chunks (a run cut at multiples of
 * MEM_VM_CHUNK_PAGES and at a block's edge pages, a chunk a live block
 * touches never unmapped, whole chunks shed, the mark over touched
 * pages), a step that repeats making no storage call, the retry
 * after releasing, unmap before map (the mapped bytes
 * held at their high-water mark, the choice of a block whose pages are
 * mapped, a map refused after pages were unmapped), cleanup unmapping
 * free pages, the hot
 * pair making no storage call, spill-over from a capped pool, a storage
 * without virtual memory (CUBE_ERR_UNSUPPORTED), the preset, and the host
 * storage's own functions. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/common/host_memory.h"
#include "cubert/backend/errors.h"
#include "cubert/log.h"
#include "memory/mem_internal.h"
#include "memory/memory_manager.h"

#define KIB (1ull << 10)
#define MIB (1ull << 20)
#define ALIGN 64u
#define MEMORY (64 * MIB)
#define PAGE HOST_VM_GRANULARITY
#define MAX_LIVE 160
#define MAX_RANGES 8
#define MAX_REGIONS 1024

typedef struct range {
    uint64_t base, size;
    uint8_t *mapped; /* per page: 0 no, 1 yes, 2 the first of a map call's */
} range;

typedef struct region {
    uint64_t address, size;
} region;

typedef struct live_block {
    cube_storage st;
    unsigned char stamp;
} live_block;

typedef struct model {
    range ranges[MAX_RANGES];
    region regions[MAX_REGIONS];
    size_t nregions;
    uint64_t allocated, mapped; /* bytes */
    uint64_t maps, unmaps;      /* calls */
    uint64_t chunks;            /* map calls' ranges mapped now */
    uint64_t rng;
    unsigned map_fail_percent;
    long map_fail_at; /* fail the map call with this number (1, 2, ...) */
    int map_fail_always;
    int bad; /* a misuse of the storage, described in why */
    char why[160];
    live_block live[MAX_LIVE];
    size_t nlive;
    uint64_t in_use;
} model;

static uint64_t next_random(model *md)
{
    md->rng ^= md->rng >> 12;
    md->rng ^= md->rng << 25;
    md->rng ^= md->rng >> 27;
    return md->rng * 2685821657736338717ull;
}

static void misuse(model *md, const char *what, uint64_t address)
{
    if (!md->bad)
        snprintf(md->why, sizeof md->why, "%s at 0x%llx", what,
                 (unsigned long long)address);
    md->bad = 1;
}

/* --- the storage --- */

static cube_error *m_alloc(void *self, uint64_t size, uint64_t align,
                           uint64_t *address)
{
    model *md = self;
    if (md->nregions == MAX_REGIONS)
        return cube_error_new(CUBE_ERR_OUT_OF_MEMORY, "too many regions");
    void *p = aligned_alloc(align, (size + align - 1) & ~(align - 1));
    if (!p)
        return cube_error_new(CUBE_ERR_OUT_OF_MEMORY, "host");
    *address = (uint64_t)(uintptr_t)p;
    md->regions[md->nregions].address = *address;
    md->regions[md->nregions++].size = size;
    md->allocated += size;
    return NULL;
}

static void m_free(void *self, uint64_t address, uint64_t size)
{
    model *md = self;
    size_t i = 0;
    while (i < md->nregions && md->regions[i].address != address)
        i++;
    if (i == md->nregions || md->regions[i].size != size) {
        misuse(md, "free of a region never handed out", address);
        return;
    }
    md->regions[i] = md->regions[--md->nregions];
    md->allocated -= size;
    free((void *)(uintptr_t)address);
}

static cube_error *m_reserve(void *self, uint64_t size, uint64_t align,
                             uint64_t *base)
{
    model *md = self;
    if (align < PAGE || size % PAGE)
        misuse(md, "reserve of a range not in whole pages", size);
    int slot = -1;
    for (int i = 0; i < MAX_RANGES; i++)
        if (!md->ranges[i].size) {
            slot = i;
            break;
        }
    if (slot < 0)
        return cube_error_new(CUBE_ERR_OUT_OF_MEMORY, "too many ranges");
    uint8_t *mapped = calloc(size / PAGE, 1);
    if (!mapped)
        return cube_error_new(CUBE_ERR_OUT_OF_MEMORY, "host");
    cube_error *err = host_storage_reserve(NULL, size, align, base);
    if (err) {
        free(mapped);
        return err;
    }
    if (*base % align)
        misuse(md, "reservation not aligned", *base);
    md->ranges[slot] = (range){*base, size, mapped};
    return NULL;
}

/* The range holding [address, address + size), or NULL. */
static range *range_of(model *md, uint64_t address, uint64_t size)
{
    for (int i = 0; i < MAX_RANGES; i++) {
        range *r = &md->ranges[i];
        if (r->size && address >= r->base &&
            address + size <= r->base + r->size)
            return r;
    }
    return NULL;
}

static cube_error *m_map(void *self, uint64_t address, uint64_t size)
{
    model *md = self;
    md->maps++;
    range *r = range_of(md, address, size);
    if (!r || address % PAGE || size % PAGE || size == 0) {
        misuse(md, "map outside a reservation or not in pages", address);
        return cube_error_new(CUBE_ERR_INTERNAL, "bad map");
    }
    if (md->map_fail_always || (long)md->maps == md->map_fail_at ||
        (md->map_fail_percent && next_random(md) % 100 < md->map_fail_percent))
        return cube_error_new(CUBE_ERR_OUT_OF_MEMORY, "map refused");
    uint64_t first = (address - r->base) / PAGE, n = size / PAGE;
    if (first / MEM_VM_CHUNK_PAGES != (first + n - 1) / MEM_VM_CHUNK_PAGES)
        misuse(md, "a map (chunk) across a multiple of MEM_VM_CHUNK_PAGES",
               address);
    for (uint64_t a = address; a < address + size; a += PAGE) {
        if (r->mapped[(a - r->base) / PAGE])
            misuse(md, "map of a page already mapped", a);
        r->mapped[(a - r->base) / PAGE] = a == address ? 2 : 1;
    }
    md->mapped += size;
    md->chunks++;
    return host_storage_map(NULL, address, size);
}

static void m_unmap(void *self, uint64_t address, uint64_t size)
{
    model *md = self;
    md->unmaps++;
    range *r = range_of(md, address, size);
    if (!r || address % PAGE || size % PAGE || size == 0) {
        misuse(md, "unmap outside a reservation or not in pages", address);
        return;
    }
    /* Exactly what one map call mapped: a GPU unmaps whole mappings. */
    uint64_t first = (address - r->base) / PAGE, end = first + size / PAGE;
    if (r->mapped[first] != 2 || (end < r->size / PAGE && r->mapped[end] == 1))
        misuse(md, "unmap of a range that is not one map call's", address);
    for (uint64_t a = address; a < address + size; a += PAGE) {
        uint8_t was = r->mapped[(a - r->base) / PAGE];
        if (!was)
            misuse(md, "unmap of a page not mapped", a);
        else if (was == 2 && a != address)
            misuse(md, "unmap of two map calls' ranges at once", a);
        r->mapped[(a - r->base) / PAGE] = 0;
    }
    md->chunks--;
    for (size_t i = 0; i < md->nlive; i++) {
        const cube_storage *s = &md->live[i].st;
        if (s->address < address + size && address < s->address + s->size)
            misuse(md, "unmap of a page a live block touches", address);
    }
    md->mapped -= size;
    host_storage_unmap(NULL, address, size);
}

static void m_release(void *self, uint64_t base, uint64_t size)
{
    model *md = self;
    for (int i = 0; i < MAX_RANGES; i++) {
        range *r = &md->ranges[i];
        if (r->size && r->base == base) {
            if (r->size != size)
                misuse(md, "release of another size", base);
            for (uint64_t p = 0; p < size / PAGE; p++)
                if (r->mapped[p])
                    misuse(md, "release with pages mapped", base);
            free(r->mapped);
            memset(r, 0, sizeof *r);
            host_storage_release(NULL, base, size);
            return;
        }
    }
    misuse(md, "release of an unknown range", base);
}

static mem_storage_ops model_ops(model *md)
{
    mem_storage_ops ops = {md,        m_alloc, m_free,  PAGE,
                           m_reserve, m_map,   m_unmap, m_release};
    return ops;
}

static int ranges_left(const model *md)
{
    int n = 0;
    for (int i = 0; i < MAX_RANGES; i++)
        n += md->ranges[i].size != 0;
    return n;
}

/* --- layouts --- */

static cube_pool_config pool(cube_pool_kind kind, uint64_t page, uint64_t min,
                             uint64_t max, uint64_t cap)
{
    cube_pool_config c;
    memset(&c, 0, sizeof c);
    c.kind = kind;
    c.page_size = page;
    c.min_size = min;
    c.max_size = max;
    c.cap = cap;
    return c;
}

enum { LAYOUTS = 4 };

static void make_layouts(cube_memory_layout *l)
{
    mem_device dev = {ALIGN, MEMORY};
    memset(l, 0, LAYOUTS * sizeof *l);
    /* One expandable pool for every size. */
    l[0].count = 1;
    l[0].pools[0] = pool(CUBE_POOL_EXPANDABLE, MEMORY, 1, MEMORY, 0);
    /* A capped one spilling over to an uncapped one. */
    l[1].count = 2;
    l[1].pools[0] = pool(CUBE_POOL_EXPANDABLE, 4 * MIB, 1, 4 * MIB, 12 * MIB);
    l[1].pools[1] = pool(CUBE_POOL_EXPANDABLE, MEMORY, 1, MEMORY, 0);
    /* Small sizes sliced, then expandable up to 8 MiB, the tail above. */
    l[2].count = 2;
    l[2].pools[0] = pool(CUBE_POOL_SLICED, 256 * KIB, 1, 16 * KIB, 0);
    l[2].pools[1] =
        pool(CUBE_POOL_EXPANDABLE, 8 * MIB, 16 * KIB + 1, 8 * MIB, 0);
    assert_null(mem_layout_preset(CUBE_PRESET_EXPANDABLE, &dev, &l[3]));
    for (int i = 0; i < LAYOUTS; i++)
        assert_null(mem_layout_validate(&l[i], &dev));
}

/* --- checks --- */

static void check_invariants(mem_manager *m, model *md)
{
    if (md->bad)
        fail_msg("storage misuse: %s", md->why);
    cube_memory_usage u;
    mem_usage(m, &u);
    assert_int_equal(u.buffers, md->nlive);
    assert_int_equal(u.bytes_in_use, md->in_use);
    assert_int_equal(u.bytes_reserved, md->allocated + md->mapped);
    assert_true(u.bytes_reserved >= u.bytes_in_use + u.bytes_padding);
    cube_memory_report r;
    mem_report(m, &r);
    assert_memory_equal(&u, &r.usage, sizeof u);
    uint64_t reserved = 0, buffers = 0, vm = 0;
    for (uint32_t i = 0; i < r.count; i++) {
        const cube_pool_report *p = &r.pools[i];
        reserved += p->bytes_reserved;
        buffers += p->buffers;
        assert_true(p->bytes_reserved_peak >= p->bytes_reserved);
        assert_true(p->pages_peak >= p->pages);
        if (p->config.kind == CUBE_POOL_EXPANDABLE) {
            assert_int_equal(p->bytes_reserved, p->pages * PAGE);
            assert_true(p->bytes_reserved >= p->bytes_in_use);
            vm += p->bytes_reserved;
        }
    }
    assert_int_equal(reserved, u.bytes_reserved);
    assert_int_equal(buffers, u.buffers);
    assert_int_equal(vm, md->mapped);
    /* Every page a live block of a range touches is mapped, and the
     * stamps are intact. */
    for (size_t i = 0; i < md->nlive; i++) {
        const live_block *b = &md->live[i];
        const unsigned char *p =
            (const unsigned char *)(uintptr_t)b->st.address;
        assert_int_equal(p[0], b->stamp);
        if (b->st.size > 1)
            assert_int_equal(p[b->st.size - 1], (unsigned char)~b->stamp);
        range *rg = range_of(md, b->st.address, b->st.size);
        if (!rg)
            continue;
        uint64_t first = (b->st.address - rg->base) / PAGE;
        uint64_t last = (b->st.address + b->st.size - 1 - rg->base) / PAGE;
        for (uint64_t k = first; k <= last; k++)
            if (!rg->mapped[k])
                fail_msg("page %llu of a live block is not mapped",
                         (unsigned long long)k);
    }
}

static uint64_t random_size(model *md)
{
    uint64_t r = next_random(md);
    unsigned kind = (unsigned)(r % 100);
    r >>= 8;
    if (kind < 40)
        return 1 + r % (16 * KIB);
    if (kind < 75)
        return 1 + r % (512 * KIB);
    if (kind < 97)
        return 1 + r % (4 * MIB);
    return 1 + r % (12 * MIB);
}

/* Allocates `size`; returns the error's code (the block is recorded). */
static cube_code step_alloc(mem_manager *m, model *md, uint64_t size)
{
    cube_memory_usage before;
    mem_usage(m, &before);
    cube_storage st;
    cube_error *err = mem_alloc(m, size, &st);
    if (err) {
        cube_code code = cube_error_code(err);
        if (code != CUBE_ERR_OUT_OF_MEMORY &&
            code != CUBE_ERR_POOL_CAPACITY_EXCEEDED)
            fail_msg("alloc %llu: %s", (unsigned long long)size,
                     cube_error_message(err));
        cube_error_free(err);
        cube_memory_usage after;
        mem_usage(m, &after);
        assert_int_equal(after.buffers, before.buffers);
        assert_int_equal(after.bytes_in_use, before.bytes_in_use);
        return code;
    }
    assert_int_equal(st.size, size);
    assert_int_equal(st.address % ALIGN, 0);
    for (size_t i = 0; i < md->nlive; i++) {
        const cube_storage *o = &md->live[i].st;
        if (st.address < o->address + o->size && o->address < st.address + size)
            fail_msg("[%llx, +%llu) overlaps [%llx, +%llu)",
                     (unsigned long long)st.address, (unsigned long long)size,
                     (unsigned long long)o->address,
                     (unsigned long long)o->size);
    }
    assert_true(md->nlive < MAX_LIVE);
    live_block *b = &md->live[md->nlive++];
    b->st = st;
    b->stamp = (unsigned char)(next_random(md) | 1u);
    unsigned char *p = (unsigned char *)(uintptr_t)st.address;
    p[size - 1] = (unsigned char)~b->stamp;
    p[0] = b->stamp;
    md->in_use += size;
    return CUBE_OK;
}

static void step_free(mem_manager *m, model *md, size_t i)
{
    cube_storage st = md->live[i].st;
    md->in_use -= st.size;
    md->live[i] = md->live[--md->nlive];
    mem_free(m, &st);
    assert_null(st.cookie);
}

static void free_all(mem_manager *m, model *md)
{
    while (md->nlive)
        step_free(m, md, md->nlive - 1);
}

static model *model_new(uint64_t seed)
{
    model *md = calloc(1, sizeof *md);
    assert_non_null(md);
    md->rng = seed * 0x9E3779B97F4A7C15ull + 1;
    md->map_fail_at = -1;
    return md;
}

static void model_end(mem_manager *m, model *md)
{
    free_all(m, md);
    mem_cleanup(m);
    check_invariants(m, md);
    assert_int_equal(md->mapped, 0);
    mem_manager_destroy(m);
    if (md->bad)
        fail_msg("storage misuse: %s", md->why);
    assert_int_equal(md->allocated, 0);
    assert_int_equal(ranges_left(md), 0);
    free(md);
}

static mem_manager *make(model *md, const cube_memory_layout *l)
{
    mem_storage_ops ops = model_ops(md);
    mem_device dev = {ALIGN, MEMORY};
    mem_manager *m = NULL;
    assert_null(mem_manager_create(&ops, &dev, l, &m));
    return m;
}

/* --- randomized sequences --- */

static void run_seed(uint64_t seed, int steps)
{
    static cube_memory_layout layouts[LAYOUTS];
    make_layouts(layouts);
    model *md = model_new(seed);
    md->map_fail_percent = 2;
    const cube_memory_layout *layout = &layouts[seed % LAYOUTS];
    mem_manager *m = make(md, layout);
    for (int s = 0; s < steps; s++) {
        unsigned op = (unsigned)(next_random(md) % 1000);
        if (op < 500) {
            if (md->nlive < MAX_LIVE)
                step_alloc(m, md, random_size(md));
        } else if (op < 930) {
            if (md->nlive)
                step_free(m, md, (size_t)(next_random(md) % md->nlive));
        } else if (op < 960) {
            mem_cleanup(m);
        } else if (op < 975) {
            const cube_memory_layout *next =
                &layouts[next_random(md) % LAYOUTS];
            cube_error *err = mem_install(m, next);
            if (md->nlive == 0) {
                assert_null(err);
                layout = next;
                assert_int_equal(md->mapped, 0);
                assert_int_equal(ranges_left(md), 0);
            } else {
                assert_int_equal(cube_error_code(err), CUBE_ERR_POOLS_IN_USE);
                cube_error_free(err);
            }
        } else if (op < 985) {
            /* The same size freed and asked for again: the hot block. */
            if (md->nlive) {
                uint64_t size = md->live[md->nlive - 1].st.size;
                step_free(m, md, md->nlive - 1);
                step_alloc(m, md, size);
            }
        } else {
            free_all(m, md);
        }
        check_invariants(m, md);
    }
    (void)layout;
    model_end(m, md);
}

static void test_random_seeds(void **state)
{
    (void)state;
    for (uint64_t seed = 1; seed <= 8; seed++)
        run_seed(seed, 4000);
}

static void test_many_short_seeds(void **state)
{
    (void)state;
    for (uint64_t seed = 100; seed < 164; seed++)
        run_seed(seed, 400);
}

/* --- a refused map --- */

static cube_memory_layout one_pool(uint64_t cap)
{
    cube_memory_layout l;
    memset(&l, 0, sizeof l);
    l.count = 1;
    l.pools[0] = pool(CUBE_POOL_EXPANDABLE, cap ? cap : MEMORY, 1,
                      cap ? cap : MEMORY, cap);
    return l;
}

/* A block whose pages are partly mapped (the page it shares with a live
 * neighbour) and partly not, refused: nothing live changes, the pages the
 * live blocks touch stay mapped, nothing else does. */
static void test_refused_map_leaves_the_pool_as_it_was(void **state)
{
    (void)state;
    model *md = model_new(7);
    cube_memory_layout l = one_pool(0);
    mem_manager *m = make(md, &l);
    assert_int_equal(step_alloc(m, md, PAGE + 100), CUBE_OK); /* 2 pages */
    check_invariants(m, md);
    assert_int_equal(md->mapped, 2 * PAGE);
    /* The page it shares only in part is a chunk of its own. */
    assert_int_equal(md->chunks, 2);
    cube_memory_usage before;
    mem_usage(m, &before);
    md->map_fail_always = 1;
    /* Starts in the second page (mapped), needs three more. */
    assert_int_equal(step_alloc(m, md, 3 * PAGE), CUBE_ERR_OUT_OF_MEMORY);
    check_invariants(m, md);
    cube_memory_usage after;
    mem_usage(m, &after);
    assert_memory_equal(&before, &after, sizeof before);
    assert_int_equal(md->mapped, 2 * PAGE);
    assert_int_equal(md->chunks, 2);
    md->map_fail_always = 0;
    assert_int_equal(step_alloc(m, md, 3 * PAGE), CUBE_OK);
    check_invariants(m, md);
    assert_int_equal(md->mapped, 5 * PAGE);
    model_end(m, md);
}

/* A block over pages of which the middle one is mapped and the two around
 * it are not: two runs to map; the first succeeds, the second is refused.
 * The page the first run mapped goes again, with the cached one. */
static void test_refused_second_run(void **state)
{
    (void)state;
    model *md = model_new(8);
    cube_memory_layout l = one_pool(0);
    mem_manager *m = make(md, &l);
    for (int i = 0; i < 4; i++) /* pages 0, 1, 2, 3 */
        assert_int_equal(step_alloc(m, md, PAGE), CUBE_OK);
    uint64_t base = md->live[0].st.address;
    assert_int_equal(md->live[3].st.address, base + 3 * PAGE);
    step_free(m, md, 0); /* page 0; page 3's block moves to slot 0 */
    step_free(m, md, 2); /* page 2 */
    mem_cleanup(m);
    check_invariants(m, md);
    assert_int_equal(md->mapped, 2 * PAGE); /* pages 1 and 3 */
    /* Page 1 freed: one free run of pages 0-2, page 1 cached. */
    assert_int_equal(md->live[1].st.address, base + PAGE);
    step_free(m, md, 1);
    check_invariants(m, md);
    cube_memory_usage before, after;
    mem_usage(m, &before);
    md->map_fail_at = (long)md->maps + 2;
    assert_int_equal(step_alloc(m, md, 3 * PAGE), CUBE_ERR_OUT_OF_MEMORY);
    check_invariants(m, md);
    mem_usage(m, &after);
    assert_int_equal(after.buffers, before.buffers);
    assert_int_equal(after.bytes_in_use, before.bytes_in_use);
    assert_int_equal(md->mapped, PAGE); /* page 3, the live block's */
    /* Asked again, it takes the same run. */
    assert_int_equal(step_alloc(m, md, 3 * PAGE), CUBE_OK);
    assert_int_equal(md->live[md->nlive - 1].st.address, base);
    check_invariants(m, md);
    assert_int_equal(md->mapped, 4 * PAGE);
    model_end(m, md);
}

/* A refused map with cached pages elsewhere: they are unmapped, the map
 * is retried once and succeeds. Unmap before map sheds only as many
 * pages as would take the pool past its mark, so one cached page is left
 * for the refusal to release. */
static void test_refused_map_retries_after_releasing(void **state)
{
    (void)state;
    model *md = model_new(9);
    cube_memory_layout l = one_pool(0);
    mem_manager *m = make(md, &l);
    /* 0-1 2 3-4 5 6: the live bytes' mark is 7 pages. */
    uint64_t sizes[5] = {2 * PAGE, PAGE, 2 * PAGE, PAGE, PAGE};
    for (int i = 0; i < 5; i++)
        assert_int_equal(step_alloc(m, md, sizes[i]), CUBE_OK);
    step_free(m, md, 4); /* page 6, at the front of the free tail */
    step_free(m, md, 2);
    step_free(m, md, 0); /* holes of 2 cached pages: 0-1 and 3-4 */
    check_invariants(m, md);
    assert_int_equal(md->mapped, 7 * PAGE); /* the mark */
    uint64_t unmaps = md->unmaps;
    md->map_fail_at = (long)md->maps + 1;
    /* 3 pages fit in no hole: pages 6-8, of which 7-8 are new. Unmap
     * before map sheds the highest cached chunk (pages 3-4); the map is
     * refused once, the other cached chunk (pages 0-1) is released, and
     * the retry succeeds. */
    assert_int_equal(step_alloc(m, md, 3 * PAGE), CUBE_OK);
    check_invariants(m, md);
    assert_int_equal(md->unmaps, unmaps + 2);
    assert_int_equal(md->mapped, 5 * PAGE);
    model_end(m, md);
}

/* Unmap before map: a request that would map past the most pages the
 * pool has had mapped first unmaps free pages elsewhere, never one a live
 * block touches (the model flags that), so the mapped bytes stay at the
 * pages live blocks touch. */
static void test_unmap_before_map_holds_the_high_mark(void **state)
{
    (void)state;
    model *md = model_new(12);
    cube_memory_layout l = one_pool(0);
    mem_manager *m = make(md, &l);
    assert_int_equal(step_alloc(m, md, 4 * PAGE), CUBE_OK); /* pages 0-3 */
    assert_int_equal(step_alloc(m, md, PAGE / 2), CUBE_OK); /* page 4 */
    step_free(m, md, 0); /* 4 pages cached at the start; 5 mapped */
    check_invariants(m, md);
    assert_int_equal(md->mapped, 5 * PAGE);
    /* 6 pages fit only after the live block: the 4 cached pages go
     * first, so 7 pages are mapped (not 11). */
    assert_int_equal(step_alloc(m, md, 6 * PAGE), CUBE_OK);
    check_invariants(m, md);
    assert_int_equal(md->mapped, 7 * PAGE);
    /* It shares page 4 with the live block: pages 4-10. */
    assert_int_equal(md->live[md->nlive - 1].st.address,
                     md->live[0].st.address + PAGE / 2);
    /* Under the mark nothing is unmapped: free the big block (6 pages
     * cached), and 3 pages at the start map without an unmap. */
    step_free(m, md, md->nlive - 1);
    uint64_t unmaps = md->unmaps;
    assert_int_equal(step_alloc(m, md, 3 * PAGE), CUBE_OK);
    check_invariants(m, md);
    assert_int_equal(md->unmaps, unmaps);
    cube_memory_report r;
    mem_report(m, &r);
    assert_int_equal(r.pools[0].bytes_reserved_peak, 7 * PAGE);
    model_end(m, md);
}

/* At the mark, a request takes a free block whose pages are mapped over
 * the bins' better fit whose pages are not: no map, no unmap. */
static void test_request_at_the_mark_prefers_mapped_pages(void **state)
{
    (void)state;
    model *md = model_new(13);
    cube_memory_layout l = one_pool(0);
    mem_manager *m = make(md, &l);
    uint64_t sizes[4] = {3 * PAGE, PAGE, 2 * PAGE, PAGE}; /* 0-2 3 4-5 6 */
    for (int i = 0; i < 4; i++)
        assert_int_equal(step_alloc(m, md, sizes[i]), CUBE_OK);
    uint64_t base = md->live[0].st.address;
    step_free(m, md, 2);
    mem_cleanup(m); /* pages 4-5 free and unmapped; 5 of 7 mapped */
    assert_int_equal(step_alloc(m, md, 3 * PAGE), CUBE_OK); /* 7-9 */
    check_invariants(m, md);
    assert_int_equal(md->mapped, 8 * PAGE); /* the mark */
    step_free(m, md, 0);                    /* pages 0-2 free, still mapped */
    uint64_t maps = md->maps, unmaps = md->unmaps;
    /* The bins' fit is pages 4-5 (exactly 2 pages, unmapped); pages 0-2
     * are mapped. */
    assert_int_equal(step_alloc(m, md, 2 * PAGE), CUBE_OK);
    check_invariants(m, md);
    assert_int_equal(md->live[md->nlive - 1].st.address, base);
    assert_int_equal(md->maps, maps);
    assert_int_equal(md->unmaps, unmaps);
    assert_int_equal(md->mapped, 8 * PAGE);
    model_end(m, md);
}

/* A map refused after unmap before map gave pages back: the request is
 * out of memory, the live blocks keep their pages, the pages given back
 * stay unmapped, and the next request that fits succeeds. */
static void test_refused_map_after_unmapping(void **state)
{
    (void)state;
    model *md = model_new(14);
    cube_memory_layout l = one_pool(0);
    mem_manager *m = make(md, &l);
    assert_int_equal(step_alloc(m, md, 4 * PAGE), CUBE_OK);
    assert_int_equal(step_alloc(m, md, PAGE), CUBE_OK);
    step_free(m, md, 0);
    cube_memory_usage before, after;
    mem_usage(m, &before);
    md->map_fail_always = 1;
    assert_int_equal(step_alloc(m, md, 6 * PAGE), CUBE_ERR_OUT_OF_MEMORY);
    md->map_fail_always = 0;
    check_invariants(m, md);
    mem_usage(m, &after);
    assert_int_equal(after.buffers, before.buffers);
    assert_int_equal(after.bytes_in_use, before.bytes_in_use);
    assert_int_equal(md->mapped, PAGE); /* the live block's page only */
    assert_int_equal(step_alloc(m, md, 6 * PAGE), CUBE_OK);
    check_invariants(m, md);
    assert_int_equal(md->mapped, 7 * PAGE);
    model_end(m, md);
}

/* A cleanup restarts the mark from what is still mapped: after a large
 * phase is given back, a smaller one is held to its own high-water mark
 * (unmap before map runs again) instead of the large phase's. */
static void test_cleanup_restarts_the_mark(void **state)
{
    (void)state;
    model *md = model_new(15);
    cube_memory_layout l = one_pool(0);
    mem_manager *m = make(md, &l);
    assert_int_equal(step_alloc(m, md, 8 * PAGE), CUBE_OK);
    step_free(m, md, 0);
    mem_cleanup(m);
    check_invariants(m, md);
    assert_int_equal(md->mapped, 0);
    assert_int_equal(step_alloc(m, md, PAGE), CUBE_OK); /* page 0 */
    assert_int_equal(step_alloc(m, md, PAGE), CUBE_OK); /* page 1 */
    step_free(m, md, 0); /* page 0 cached; 2 mapped, the mark */
    uint64_t unmaps = md->unmaps;
    /* 2 pages more would take the pool to 4: page 0 goes first. */
    assert_int_equal(step_alloc(m, md, 2 * PAGE), CUBE_OK);
    check_invariants(m, md);
    assert_true(md->unmaps > unmaps);
    assert_int_equal(md->mapped, 3 * PAGE);
    model_end(m, md);
}

/* --- chunks --- */

/* A run of pages maps as one chunk per multiple of MEM_VM_CHUNK_PAGES it
 * spans (one storage call each), and each chunk is unmapped whole, with
 * one call (the model flags an unmap that is not exactly one map's). */
static void test_a_run_maps_in_chunks(void **state)
{
    (void)state;
    model *md = model_new(21);
    cube_memory_layout l = one_pool(0);
    mem_manager *m = make(md, &l);
    uint64_t pages = MEM_VM_CHUNK_PAGES + 4;
    assert_int_equal(step_alloc(m, md, pages * PAGE), CUBE_OK);
    check_invariants(m, md);
    assert_int_equal(md->maps, 2);
    assert_int_equal(md->chunks, 2);
    assert_int_equal(md->mapped, pages * PAGE);
    free_all(m, md);
    mem_cleanup(m);
    check_invariants(m, md);
    assert_int_equal(md->unmaps, 2);
    assert_int_equal(md->chunks, 0);
    model_end(m, md);
}

/* A chunk part of which a live block touches is never unmapped, neither
 * by a cleanup nor by unmap before map (which then maps past the limit
 * rather than cut a mapping); once the block goes, one call unmaps it. */
static void test_a_chunk_a_live_block_touches_stays(void **state)
{
    (void)state;
    model *md = model_new(22);
    cube_memory_layout l = one_pool(0);
    mem_manager *m = make(md, &l);
    assert_int_equal(step_alloc(m, md, 4 * PAGE), CUBE_OK); /* 0-3 */
    assert_int_equal(step_alloc(m, md, PAGE), CUBE_OK);     /* 4 */
    step_free(m, md, 0); /* pages 0-3 free, one chunk, cached */
    uint64_t maps = md->maps, unmaps = md->unmaps;
    /* Half a page at the front of the free run: no map, and the chunk of
     * pages 0-3 is now touched by a live block. */
    assert_int_equal(step_alloc(m, md, PAGE / 2), CUBE_OK);
    assert_int_equal(md->maps, maps);
    mem_cleanup(m);
    check_invariants(m, md);
    assert_int_equal(md->unmaps, unmaps);
    assert_int_equal(md->mapped, 5 * PAGE);
    /* 6 pages fit only past page 4: over the limit, with nothing to
     * shed: mapped, and the pinned chunk stays. */
    assert_int_equal(step_alloc(m, md, 6 * PAGE), CUBE_OK);
    check_invariants(m, md);
    assert_int_equal(md->unmaps, unmaps);
    assert_int_equal(md->mapped, 11 * PAGE);
    /* The half page goes (slot 1 holds it: step_free moved the page-4
     * block to slot 0): the chunk of pages 0-3 lies wholly in a free block
     * and a cleanup unmaps it with one call, the others stay. */
    assert_int_equal(md->live[1].st.size, PAGE / 2);
    step_free(m, md, 1);
    mem_cleanup(m);
    check_invariants(m, md);
    assert_int_equal(md->unmaps, unmaps + 1);
    assert_int_equal(md->mapped, 7 * PAGE);
    model_end(m, md);
}

/* Unmap before map sheds whole chunks that lie inside free blocks, one
 * call each. */
static void test_unmap_before_map_sheds_whole_chunks(void **state)
{
    (void)state;
    model *md = model_new(23);
    cube_memory_layout l = one_pool(0);
    mem_manager *m = make(md, &l);
    assert_int_equal(step_alloc(m, md, 2 * PAGE), CUBE_OK); /* 0-1 */
    assert_int_equal(step_alloc(m, md, PAGE), CUBE_OK);     /* 2 */
    step_free(m, md, 0); /* pages 0-1 cached, one chunk; the mark 3 pages */
    uint64_t unmaps = md->unmaps;
    /* 3 pages fit only past page 2 (pages 3-5): the mark becomes 4 pages
     * and so does the limit, so 2 pages must go first: the chunk of pages
     * 0-1, whole, in one call. */
    assert_int_equal(step_alloc(m, md, 3 * PAGE), CUBE_OK);
    check_invariants(m, md);
    assert_int_equal(md->unmaps, unmaps + 1);
    assert_int_equal(md->mapped, 4 * PAGE);
    assert_int_equal(md->chunks, 2);
    model_end(m, md);
}

/* The mark counts the pages live blocks touch, not their bytes: half
 * pages scattered over many pages (each page half live) hold twice their
 * bytes in pages, and a map beside them must not shed a cached chunk the
 * slack has room for (a mark of live bytes would put the limit at half
 * the pages those blocks pin, and every map would shed). A cleanup
 * restarts the mark at those pages too. */
static void test_the_mark_counts_pages_live_blocks_touch(void **state)
{
    (void)state;
    model *md = model_new(25);
    const uint64_t memory = 256 * MIB;
    cube_memory_layout l;
    memset(&l, 0, sizeof l);
    l.count = 1;
    l.pools[0] = pool(CUBE_POOL_EXPANDABLE, memory, 1, memory, 0);
    mem_storage_ops ops = model_ops(md);
    mem_device dev = {ALIGN, memory};
    mem_manager *m = NULL;
    assert_null(mem_manager_create(&ops, &dev, &l, &m));
    for (int i = 0; i < 64; i++) /* pages 0-31, two halves each */
        assert_int_equal(step_alloc(m, md, PAGE / 2), CUBE_OK);
    /* Free every second half but on the last page (slots from the top:
     * step_free moves the last into the freed slot, which is then passed);
     * each page keeps a live half. */
    for (size_t i = 62; i-- > 0;)
        if (i % 2)
            step_free(m, md, i);
    assert_int_equal(md->nlive, 33);
    assert_int_equal(step_alloc(m, md, PAGE), CUBE_OK); /* P: page 32 */
    mem_cleanup(m); /* nothing to unmap: the mark restarts at 33 pages */
    check_invariants(m, md);
    assert_int_equal(md->mapped, 33 * PAGE);
    assert_int_equal(step_alloc(m, md, PAGE), CUBE_OK); /* Q: page 33 */
    assert_int_equal(step_alloc(m, md, PAGE), CUBE_OK); /* S: page 34 */
    step_free(m, md, md->nlive - 2);                    /* Q, cached */
    uint64_t unmaps = md->unmaps;
    /* R: 3 pages at 35-37; live blocks then touch 37 pages, the limit is
     * 38 and 38 are mapped with Q's: nothing is shed. */
    assert_int_equal(step_alloc(m, md, 3 * PAGE), CUBE_OK);
    check_invariants(m, md);
    assert_int_equal(md->unmaps, unmaps);
    assert_int_equal(md->mapped, 38 * PAGE);
    model_end(m, md);
}

/* The pages a block shares only in part (its first and last) are chunks
 * of their own, so that once the block goes its inside can be unmapped
 * even while neighbours on those pages live. */
static void test_a_block_edge_pages_are_chunks_of_their_own(void **state)
{
    (void)state;
    model *md = model_new(26);
    cube_memory_layout l = one_pool(0);
    mem_manager *m = make(md, &l);
    assert_int_equal(step_alloc(m, md, PAGE / 2), CUBE_OK); /* A: page 0 */
    /* B: [0.5, 3.5) pages: its new pages 1-3 map as 1-2 and 3. */
    assert_int_equal(step_alloc(m, md, 3 * PAGE), CUBE_OK);
    assert_int_equal(md->chunks, 3);
    /* C: [3.5, 4.5): page 4 is new. */
    assert_int_equal(step_alloc(m, md, PAGE), CUBE_OK);
    assert_int_equal(md->mapped, 5 * PAGE);
    step_free(m, md, 1); /* B */
    uint64_t unmaps = md->unmaps;
    mem_cleanup(m);
    check_invariants(m, md);
    /* Pages 1-2 go in one call; 0 and 3 stay (A and C touch them). */
    assert_int_equal(md->unmaps, unmaps + 1);
    assert_int_equal(md->mapped, 3 * PAGE);
    model_end(m, md);
}

/* A block of two chunks whose second map is refused: the first chunk is
 * unmapped again, the pool is as it was, and the same request succeeds
 * next time. */
static void test_refused_second_chunk(void **state)
{
    (void)state;
    model *md = model_new(24);
    cube_memory_layout l = one_pool(0);
    mem_manager *m = make(md, &l);
    assert_int_equal(step_alloc(m, md, PAGE), CUBE_OK); /* page 0 */
    cube_memory_usage before, after;
    mem_usage(m, &before);
    md->map_fail_at = (long)md->maps + 2;
    /* Pages 1-20: chunks 1-15 and 16-20; the second is refused. */
    uint64_t size = (MEM_VM_CHUNK_PAGES + 4) * PAGE;
    assert_int_equal(step_alloc(m, md, size), CUBE_ERR_OUT_OF_MEMORY);
    check_invariants(m, md);
    mem_usage(m, &after);
    assert_memory_equal(&before, &after, sizeof before);
    assert_int_equal(md->mapped, PAGE);
    assert_int_equal(md->chunks, 1);
    assert_int_equal(step_alloc(m, md, size), CUBE_OK);
    check_invariants(m, md);
    assert_int_equal(md->chunks, 3);
    model_end(m, md);
}

/* A step that repeats (the same requests and frees in the same order,
 * everything freed at its end): when its first run unmapped nothing (the
 * pages it touched fit under the limit), every later run finds its pages
 * mapped and makes no storage call; otherwise the runs settle, from the
 * third on, into the same calls each (a steady state, nothing growing). */
static void test_a_repeated_step_makes_no_storage_call(void **state)
{
    (void)state;
    int silent = 0;
    for (uint64_t seed = 1; seed <= 24; seed++) {
        model *md = model_new(seed + 100);
        cube_memory_layout l = one_pool(0);
        mem_manager *m = make(md, &l);
        /* The step: 60 operations over up to about 22 MiB live. */
        enum { OPS = 60, RUNS = 6 };
        uint64_t sizes[OPS];
        int frees[OPS]; /* -1: an allocation; else which live slot */
        uint64_t live = 0, held[OPS];
        size_t nheld = 0;
        for (int i = 0; i < OPS; i++) {
            uint64_t r = next_random(md);
            if (nheld && (r % 100 < 45 || live > 16 * MIB)) {
                frees[i] = (int)((r >> 8) % nheld);
                live -= held[frees[i]];
                held[frees[i]] = held[--nheld];
                sizes[i] = 0;
            } else {
                frees[i] = -1;
                sizes[i] = 1 + (r >> 8) % (6 * MIB);
                held[nheld++] = sizes[i];
                live += sizes[i];
            }
        }
        uint64_t maps[RUNS], unmaps[RUNS];
        for (int run = 0; run < RUNS; run++) {
            uint64_t m0 = md->maps, u0 = md->unmaps;
            for (int i = 0; i < OPS; i++) {
                if (frees[i] < 0)
                    assert_int_equal(step_alloc(m, md, sizes[i]), CUBE_OK);
                else
                    step_free(m, md, (size_t)frees[i]);
            }
            free_all(m, md);
            check_invariants(m, md);
            maps[run] = md->maps - m0;
            unmaps[run] = md->unmaps - u0;
        }
        for (int run = 3; run < RUNS; run++)
            if (maps[run] != maps[2] || unmaps[run] != unmaps[2])
                fail_msg("seed %llu: run %d made %llu maps and %llu unmaps, "
                         "run 2 %llu and %llu",
                         (unsigned long long)seed, run,
                         (unsigned long long)maps[run],
                         (unsigned long long)unmaps[run],
                         (unsigned long long)maps[2],
                         (unsigned long long)unmaps[2]);
        if (unmaps[0] == 0 && (maps[1] || unmaps[1]))
            fail_msg("seed %llu: the first run unmapped nothing, the second "
                     "made %llu maps and %llu unmaps",
                     (unsigned long long)seed, (unsigned long long)maps[1],
                     (unsigned long long)unmaps[1]);
        silent += maps[RUNS - 1] == 0 && unmaps[RUNS - 1] == 0;
        model_end(m, md);
    }
    /* Most steps fit (15 of these 24: at this pool's scale, 32 pages,
     * the slack of 1/28 is under a page). */
    assert_true(silent >= 12);
}

/* --- cleanup, the hot pair, caps --- */

static void test_cleanup_unmaps_free_pages_only(void **state)
{
    (void)state;
    model *md = model_new(10);
    cube_memory_layout l = one_pool(0);
    mem_manager *m = make(md, &l);
    for (int i = 0; i < 8; i++)
        assert_int_equal(step_alloc(m, md, PAGE / 2 + 64 * (uint64_t)i),
                         CUBE_OK);
    check_invariants(m, md);
    uint64_t mapped = md->mapped;
    /* Free every other block: pages stay mapped (cached) until cleanup. */
    for (size_t i = md->nlive; i-- > 0;)
        if (i % 2)
            step_free(m, md, i);
    check_invariants(m, md);
    assert_int_equal(md->mapped, mapped);
    mem_cleanup(m);
    check_invariants(m, md); /* no live block's page went */
    assert_true(md->mapped <= mapped);
    uint64_t unmaps = md->unmaps;
    free_all(m, md);
    assert_int_equal(md->unmaps, unmaps); /* a free unmaps nothing */
    check_invariants(m, md);
    assert_true(md->mapped > 0); /* cached until cleanup */
    mem_cleanup(m);
    check_invariants(m, md);
    assert_int_equal(md->mapped, 0);
    cube_memory_report r;
    mem_report(m, &r);
    assert_int_equal(r.pools[0].pages, 0);
    assert_true(r.pools[0].pages_peak > 0);
    model_end(m, md);
}

static void test_hot_pair_makes_no_storage_call(void **state)
{
    (void)state;
    model *md = model_new(11);
    cube_memory_layout l = one_pool(0);
    mem_manager *m = make(md, &l);
    assert_int_equal(step_alloc(m, md, 3 * MIB), CUBE_OK);
    uint64_t maps = md->maps, unmaps = md->unmaps;
    for (int i = 0; i < 1000; i++) {
        cube_storage st;
        assert_null(mem_alloc(m, 5 * MIB + (uint64_t)(i % 3) * 64, &st));
        mem_free(m, &st);
    }
    /* The first request mapped its pages, the first of the largest extent
     * one page more; the rest reused them. */
    assert_true(md->maps <= maps + 2);
    assert_int_equal(md->unmaps, unmaps);
    check_invariants(m, md);
    model_end(m, md);
}

static void test_capped_pool_spills_over_and_caps_mapping(void **state)
{
    (void)state;
    model *md = model_new(12);
    cube_memory_layout l;
    memset(&l, 0, sizeof l);
    l.count = 2;
    l.pools[0] = pool(CUBE_POOL_EXPANDABLE, 4 * MIB, 1, 4 * MIB, 8 * MIB);
    l.pools[1] = pool(CUBE_POOL_EXPANDABLE, MEMORY, 1, MEMORY, 0);
    mem_manager *m = make(md, &l);
    for (int i = 0; i < 6; i++)
        assert_int_equal(step_alloc(m, md, 3 * MIB), CUBE_OK);
    check_invariants(m, md);
    cube_memory_report r;
    mem_report(m, &r);
    assert_true(r.pools[0].bytes_reserved <= 8 * MIB);
    assert_true(r.pools[0].buffers >= 2);
    assert_true(r.pools[1].buffers >= 1);
    assert_int_equal(r.pools[0].buffers + r.pools[1].buffers, 6);
    model_end(m, md);

    /* Alone, the capped pool's full range is POOL_CAPACITY_EXCEEDED. */
    md = model_new(13);
    l.count = 1;
    m = make(md, &l);
    assert_int_equal(step_alloc(m, md, 4 * MIB), CUBE_OK);
    assert_int_equal(step_alloc(m, md, 4 * MIB), CUBE_OK);
    assert_int_equal(step_alloc(m, md, 64), CUBE_ERR_POOL_CAPACITY_EXCEEDED);
    check_invariants(m, md);
    model_end(m, md);

    /* Uncapped, a range with no free run left is OUT_OF_MEMORY. */
    md = model_new(14);
    l = one_pool(0);
    m = make(md, &l);
    assert_int_equal(step_alloc(m, md, MEMORY - PAGE), CUBE_OK);
    assert_int_equal(step_alloc(m, md, 2 * PAGE), CUBE_ERR_OUT_OF_MEMORY);
    assert_int_equal(step_alloc(m, md, PAGE), CUBE_OK);
    check_invariants(m, md);
    model_end(m, md);
}

/* --- storage without virtual memory, the preset, validation --- */

static void test_storage_without_vm_is_unsupported(void **state)
{
    (void)state;
    model *md = model_new(15);
    mem_storage_ops plain = {md, m_alloc, m_free};
    mem_device dev = {ALIGN, MEMORY};
    cube_memory_layout l = one_pool(0);
    mem_manager *m = NULL;
    cube_error *err = mem_manager_create(&plain, &dev, &l, &m);
    assert_int_equal(cube_error_code(err), CUBE_ERR_UNSUPPORTED);
    assert_non_null(strstr(cube_error_message(err), "pool 0"));
    cube_error_free(err);
    assert_null(m);
    /* Installed over a manager that has none: refused, the old layout
     * stays, even with buffers live. */
    assert_null(mem_manager_create(&plain, &dev, NULL, &m));
    cube_storage st;
    assert_null(mem_alloc(m, 100, &st));
    err = mem_install(m, &l);
    assert_int_equal(cube_error_code(err), CUBE_ERR_UNSUPPORTED);
    cube_error_free(err);
    mem_free(m, &st);
    err = mem_install(m, &l);
    assert_int_equal(cube_error_code(err), CUBE_ERR_UNSUPPORTED);
    cube_error_free(err);
    cube_memory_report r;
    mem_report(m, &r);
    assert_int_equal(r.pools[0].config.kind, CUBE_POOL_SLICED);
    /* A granularity that is not a power of two counts as none. */
    mem_storage_ops odd = model_ops(md);
    odd.granularity = 3 * MIB;
    err = mem_layout_supported(&odd, &l);
    assert_int_equal(cube_error_code(err), CUBE_ERR_UNSUPPORTED);
    cube_error_free(err);
    odd = model_ops(md);
    odd.unmap = NULL;
    err = mem_layout_supported(&odd, &l);
    assert_int_equal(cube_error_code(err), CUBE_ERR_UNSUPPORTED);
    cube_error_free(err);
    mem_manager_destroy(m);
    free(md);
}

static void test_preset_and_validation(void **state)
{
    (void)state;
    const uint64_t memories[] = {MIB, 64 * MIB, 16ull << 30, 141ull << 30};
    const uint64_t aligns[] = {1, 64, 512, 4096};
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 4; j++) {
            mem_device dev = {aligns[j], memories[i]};
            cube_memory_layout l;
            assert_null(mem_layout_preset(CUBE_PRESET_EXPANDABLE, &dev, &l));
            assert_null(mem_layout_validate(&l, &dev));
            /* The last pool is expandable and takes every size up to the
             * device's memory; the one before is sliced. */
            const cube_pool_config *last = &l.pools[l.count - 1];
            assert_int_equal(last->kind, CUBE_POOL_EXPANDABLE);
            assert_int_equal(last->max_size, memories[i] & ~(aligns[j] - 1));
            assert_int_equal(last->cap, 0);
            for (uint32_t k = 0; k + 1 < l.count; k++) {
                assert_int_equal(l.pools[k].kind, CUBE_POOL_SLICED);
                assert_true(l.pools[k].max_size <= MIB);
                assert_int_equal(l.pools[k + 1].min_size,
                                 l.pools[k].max_size + 1);
            }
        }
    /* 80 GiB, 512-byte alignment (the bench's device): 2 MiB pages up to
     * 128 KiB, then expandable (buffers of 128 KiB to 1 MiB fill the holes
     * between large ones there instead of holding 16 MiB sliced pages). */
    mem_device h = {512, 80ull << 30};
    cube_memory_layout l;
    assert_null(mem_layout_preset(CUBE_PRESET_EXPANDABLE, &h, &l));
    assert_int_equal(l.count, 2);
    assert_int_equal(l.pools[0].page_size, 2 * MIB);
    assert_int_equal(l.pools[0].max_size, 128 * KIB);
    assert_int_equal(l.pools[1].min_size, 128 * KIB + 1);
    /* Validation: a cap below the largest request is refused as for the
     * other kinds; an unknown kind names the three. */
    mem_device dev = {ALIGN, MEMORY};
    cube_memory_layout bad = one_pool(0);
    bad.pools[0].cap = MIB;
    cube_error *err = mem_layout_validate(&bad, &dev);
    assert_int_equal(cube_error_code(err), CUBE_ERR_INVALID_ARGUMENT);
    cube_error_free(err);
    bad = one_pool(0);
    bad.pools[0].kind = (cube_pool_kind)9;
    err = mem_layout_validate(&bad, &dev);
    assert_non_null(strstr(cube_error_message(err), "CUBE_POOL_EXPANDABLE"));
    cube_error_free(err);
}

/* --- the host storage itself --- */

static void test_host_storage_virtual_memory(void **state)
{
    (void)state;
    uint64_t base = 0;
    assert_null(host_storage_reserve(NULL, 16 * PAGE, PAGE, &base));
    assert_int_equal(base % PAGE, 0);
    unsigned char *p = (unsigned char *)(uintptr_t)base;
    assert_null(host_storage_map(NULL, base + PAGE, 2 * PAGE));
    memset(p + PAGE, 0x5A, 2 * PAGE);
    assert_int_equal(p[PAGE + 2 * PAGE - 1], 0x5A);
    /* Unmapped and mapped again: the pages come back zeroed. */
    host_storage_unmap(NULL, base + PAGE, 2 * PAGE);
    assert_null(host_storage_map(NULL, base + PAGE, PAGE));
    assert_int_equal(p[PAGE], 0);
    assert_int_equal(p[2 * PAGE - 1], 0);
    host_storage_unmap(NULL, base + PAGE, PAGE);
    host_storage_release(NULL, base, 16 * PAGE);
    /* A larger alignment. */
    assert_null(host_storage_reserve(NULL, 4 * PAGE, 16 * PAGE, &base));
    assert_int_equal(base % (16 * PAGE), 0);
    host_storage_release(NULL, base, 4 * PAGE);
    /* Sizes that are not whole pages, or do not fit, are refused. */
    cube_error *err = host_storage_reserve(NULL, PAGE + 1, PAGE, &base);
    assert_int_equal(cube_error_code(err), CUBE_ERR_OUT_OF_MEMORY);
    cube_error_free(err);
    err = host_storage_reserve(NULL, UINT64_MAX & ~(PAGE - 1), PAGE, &base);
    assert_int_equal(cube_error_code(err), CUBE_ERR_OUT_OF_MEMORY);
    cube_error_free(err);
    cube_storage_ops ops;
    memset(&ops, 0, sizeof ops);
    host_storage_ops(NULL, &ops);
    assert_int_equal(ops.granularity, PAGE);
    assert_non_null(ops.reserve);
    assert_non_null(ops.map);
    assert_non_null(ops.unmap);
    assert_non_null(ops.release);
}

/* Whether the mapping holding `addr` asks for transparent huge pages
 * (VmFlags "hg" in /proc/self/smaps); -1 when that cannot be read. */
static int maps_huge(uint64_t addr)
{
    FILE *f = fopen("/proc/self/smaps", "r");
    if (!f)
        return -1;
    char line[512];
    int inside = 0, found = -1;
    while (fgets(line, sizeof line, f)) {
        unsigned long long lo, hi;
        char dash;
        if (sscanf(line, "%llx%c%llx ", &lo, &dash, &hi) == 3 && dash == '-') {
            inside = lo <= addr && addr < hi;
            continue;
        }
        if (inside && strncmp(line, "VmFlags:", 8) == 0) {
            found = strstr(line, " hg") != NULL;
            break;
        }
    }
    fclose(f);
    return found;
}

/* Whether this system gives huge pages to ranges that ask (THP in
 * "always" or "madvise" mode). */
static int thp_on_request(void)
{
    FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
    if (!f)
        return 0;
    char mode[128] = "";
    int ok = fgets(mode, sizeof mode, f) != NULL &&
             (strstr(mode, "[always]") || strstr(mode, "[madvise]"));
    fclose(f);
    return ok;
}

/* Large host buffers start on a 2 MiB page and ask for transparent huge
 * pages, as do reserved ranges; small ones are left alone. */
static void test_host_storage_huge_pages(void **state)
{
    (void)state;
    uint64_t a = 0, small = 0, base = 0;
    assert_null(host_storage_alloc(NULL, 2 * PAGE + 100, 256, &a));
    assert_int_equal(a % PAGE, 0);
    memset((void *)(uintptr_t)a, 1, 2 * PAGE + 100);
    assert_null(host_storage_alloc(NULL, 4096, 256, &small));
    assert_int_equal(small % 256, 0);
    assert_null(host_storage_reserve(NULL, 4 * PAGE, PAGE, &base));
    if (thp_on_request() && maps_huge(a) >= 0) {
        assert_int_equal(maps_huge(a), 1);
        assert_int_equal(maps_huge(base), 1);
    }
    host_storage_release(NULL, base, 4 * PAGE);
    host_storage_free(NULL, small, 4096);
    host_storage_free(NULL, a, 2 * PAGE + 100);
}

int main(void)
{
    cube_log_set_level(CUBE_LOG_OFF);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_random_seeds),
        cmocka_unit_test(test_many_short_seeds),
        cmocka_unit_test(test_refused_map_leaves_the_pool_as_it_was),
        cmocka_unit_test(test_refused_second_run),
        cmocka_unit_test(test_refused_map_retries_after_releasing),
        cmocka_unit_test(test_unmap_before_map_holds_the_high_mark),
        cmocka_unit_test(test_request_at_the_mark_prefers_mapped_pages),
        cmocka_unit_test(test_refused_map_after_unmapping),
        cmocka_unit_test(test_cleanup_restarts_the_mark),
        cmocka_unit_test(test_a_run_maps_in_chunks),
        cmocka_unit_test(test_a_chunk_a_live_block_touches_stays),
        cmocka_unit_test(test_unmap_before_map_sheds_whole_chunks),
        cmocka_unit_test(test_the_mark_counts_pages_live_blocks_touch),
        cmocka_unit_test(test_a_block_edge_pages_are_chunks_of_their_own),
        cmocka_unit_test(test_refused_second_chunk),
        cmocka_unit_test(test_a_repeated_step_makes_no_storage_call),
        cmocka_unit_test(test_cleanup_unmaps_free_pages_only),
        cmocka_unit_test(test_hot_pair_makes_no_storage_call),
        cmocka_unit_test(test_capped_pool_spills_over_and_caps_mapping),
        cmocka_unit_test(test_storage_without_vm_is_unsupported),
        cmocka_unit_test(test_preset_and_validation),
        cmocka_unit_test(test_host_storage_virtual_memory),
        cmocka_unit_test(test_host_storage_huge_pages),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
