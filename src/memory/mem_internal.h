/* Internals of the memory manager, shared by its source files.
 *
 * Records. Every piece of memory the manager tracks is a mem_block record:
 * a slice of a sliced page, an exclusive page, a persistent block or a
 * large-tail block. A live block's record is the cookie of its
 * cube_storage; it stays where it is (records are never moved, renumbered
 * or reused) until the block is freed. Records come from slabs and go back
 * to a spare list, so the hot path does no malloc.
 *
 * Accounting. For each pool, and so for the whole manager:
 *  - buffers        live blocks;
 *  - bytes_in_use   the sum of the sizes asked for by live blocks;
 *  - bytes_padding  the sum, over live blocks, of (extent - size asked
 *                   for), where the extent is what the block occupies: its
 *                   size rounded up to the alignment, or for a reused
 *                   exclusive page the whole page;
 *  - bytes_reserved every byte held from the storage (pages of sliced and
 *                   exclusive pools, persistent and large-tail blocks,
 *                   the mapped pages of an expandable pool's range),
 *                   live or cached;
 * so bytes_reserved = bytes_in_use + bytes_padding + bytes cached free,
 * and bytes_reserved always equals what the storage has handed out and not
 * had back.
 *
 * Locking: everything here runs under the manager's mutex.
 */
#ifndef CUBE_MEMORY_MEM_INTERNAL_H
#define CUBE_MEMORY_MEM_INTERNAL_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "base/mutex.h"
#include "memory/memory_manager.h"

typedef struct mem_pool mem_pool;
typedef struct mem_page mem_page;
typedef struct mem_block mem_block;

struct mem_block {
    uint64_t address;
    uint64_t size;      /* extent: a multiple of the alignment */
    uint64_t requested; /* bytes asked for; 0 while free */
    uint64_t freed_ms;  /* exclusive: when it was last freed */
    mem_pool *pool;
    mem_page *page; /* sliced: the page holding the slice */
    /* Sliced: the neighbours in address order within the page.
     * Expandable: the neighbours in address order within the range. Other
     * pools: the pool's list of all its blocks. */
    mem_block *prev, *next;
    /* Free structures: a size-class bin, or a persistent size's list. */
    mem_block *fprev, *fnext;
    /* Exclusive: free pages, least recently freed first. */
    mem_block *lprev, *lnext;
};

struct mem_page {
    uint64_t address, size;
    mem_block *first; /* the slice at the page's start */
    mem_page *prev, *next;
};

/* Segregated size-class bins of free blocks. A block of `u` alignment
 * units sits in bin u for u < 32 (one bin per size); above, each power of
 * two is split into 16 bins, so a bin spans at most 1/16 of its sizes. A
 * bitmap of nonempty bins (and a summary word over it) finds the next
 * nonempty bin with two bit scans. */
#define MEM_BIN_SUB_BITS 4u
#define MEM_BIN_SUB (1u << MEM_BIN_SUB_BITS)
#define MEM_BIN_NONE UINT32_MAX

typedef struct mem_bins {
    uint32_t count; /* bins: enough for the largest extent the pool holds */
    unsigned shift; /* log2 of the alignment */
    uint64_t summary;
    uint64_t *map;
    mem_block **heads;
} mem_bins;

cube_error *mem_bins_init(mem_bins *bins, uint64_t largest, unsigned shift);
void mem_bins_fini(mem_bins *bins);
void mem_bins_insert(mem_bins *bins, mem_block *b);
void mem_bins_remove(mem_bins *bins, mem_block *b);
/* A free block whose extent lies in [lo, hi], or NULL. Looks at a few
 * blocks of lo's bin, then takes the first block of the next nonempty bin
 * that lies wholly inside the range; `exhaustive` also scans every block
 * of the two boundary bins before giving up, so NULL then means no block
 * of the bins fits. */
mem_block *mem_bins_find(const mem_bins *bins, uint64_t lo, uint64_t hi,
                         int exhaustive);

/* Persistent pool: free blocks by exact extent (open addressing). */
typedef struct mem_size_slot {
    uint64_t size;   /* 0: empty slot */
    uint64_t blocks; /* blocks of this size, live or free */
    mem_block *free; /* free blocks, linked by fnext */
} mem_size_slot;

typedef struct mem_size_table {
    mem_size_slot *slots;
    uint64_t capacity; /* a power of two, or 0 */
    uint64_t used;
} mem_size_table;

typedef struct mem_stats {
    uint64_t pages, pages_peak;
    uint64_t buffers, buffers_peak;
    uint64_t in_use, in_use_peak;
    uint64_t reserved, reserved_peak;
    uint64_t padding;
    uint64_t largest;
} mem_stats;

/* The manager's own accounting (cube_memory_stats): the pools' live and
 * reserved bytes summed as they change, so that its high-water marks are
 * the manager's (the sum of the pools' peaks is not), and event counters.
 * Under the manager's lock, like everything it counts. Only what the
 * report needs is kept, and the live bytes as one sum of extents (free =
 * reserved - extents), so that a pool hit adds a few increments and two
 * maxima, no more: the fields a hit touches come first and sit on the
 * lock's cache line (see mem_manager). */
typedef struct mem_totals {
    /* Each count beside its mark, not beside another count: neighbours
     * changed alike would be vectorized into one 16-byte load of two
     * fields stored apart, which the store buffer cannot forward. */
    uint64_t buffers, buffers_peak; /* live */
    uint64_t in_use, in_use_peak;   /* requested bytes of live buffers */
    uint64_t extent;                /* their extents (requested + padding) */
    uint64_t allocs;                /* mem_alloc successes */
    uint64_t reserved, reserved_peak;
    uint64_t cached_peak; /* of reserved - extent */
    uint64_t frees;       /* mem_free calls */
    uint64_t misses;      /* allocs served with new storage (hits: the rest) */
    /* Successful storage allocations and maps; storage given back (frees
     * and unmaps). */
    uint64_t storage_allocs, storage_frees;
    uint64_t ooms;    /* mem_alloc calls that ended out of memory */
    uint64_t retries; /* storage refusals answered by release + retry */
} mem_totals;

struct mem_pool {
    cube_pool_config config;
    uint32_t index;  /* position in the report */
    mem_bins bins;   /* sliced and exclusive: free blocks */
    mem_page *pages; /* sliced: all pages */
    /* Sliced: the slice freed last, kept as it was (not merged, not in
     * the bins) so that a request of its extent takes it back without a
     * search, a split and a merge; any other request, a release or a
     * second free puts it back in the bins first. */
    mem_block *hot;
    mem_block *blocks; /* exclusive, tail, persistent: all blocks */
    /* Expandable (pool_expandable.c): the reserved range (vm_size 0 until
     * the first request), its page (the storage's granularity, at least
     * the alignment), the most pages its live blocks have touched at a
     * map since the last release (vm_mark), the block at its start (never
     * merged away), a bitmap of its mapped pages and one of the first
     * pages of its chunks (one storage map each; vm_heads shares
     * vm_mapped's allocation). */
    uint64_t vm_base, vm_size, vm_page, vm_mark;
    mem_block *vm_first;
    uint64_t *vm_mapped, *vm_heads;
    mem_block *lru_first, *lru_last; /* exclusive: free pages */
    mem_size_table sizes;            /* persistent */
    /* Sliced: the smallest new page and the granule new pages are rounded
     * to (see pool_sliced.c); page_least == page_size: every page is
     * page_size bytes. */
    uint64_t page_least, granule;
    mem_stats st;
    int cap_warned;
};

/* Expandable pools map a block's run of unmapped pages in chunks, one
 * storage map each, cut at multiples of MEM_VM_CHUNK_PAGES pages of the
 * range (and around the pages the block covers only in part): on a GPU one
 * physical allocation backs a chunk (a map of 32 MiB costs about what one of 2
 * MiB does, while pages mapped one by one cost per page), and a chunk is
 * unmapped whole, so larger chunks would pin more free memory behind one live
 * byte (see pool_expandable.c). */
#define MEM_VM_CHUNK_PAGES 16u

/* Pools live in a fixed array: the layout's pools from index 0, the large
 * tail and the persistent pool at fixed places after the largest layout. */
#define MEM_TAIL CUBE_MAX_POOLS
#define MEM_PERSISTENT (CUBE_MAX_POOLS + 1)
#define MEM_POOL_SLOTS (CUBE_MAX_POOLS + 2)

typedef struct mem_slab mem_slab;

/* Everything but ops, dev and shift (set at creation) is under `lock`. */
struct mem_manager {
    /* The lock and the totals a pool hit updates share cache lines: the
     * manager is allocated on a cache-line boundary. */
    cube_mutex lock;
    mem_totals tot CUBE_GUARDED_FIELD(lock);
    mem_storage_ops ops;
    mem_device dev;
    unsigned shift;                          /* log2 of the alignment */
    uint32_t count CUBE_GUARDED_FIELD(lock); /* pools of the layout */
    int persistent CUBE_GUARDED_FIELD(lock);
    /* earliest exclusive release; UINT64_MAX */
    uint64_t next_expiry_ms CUBE_GUARDED_FIELD(lock);
    mem_pool pools[MEM_POOL_SLOTS] CUBE_GUARDED_FIELD(lock);
    /* records to reuse, linked by next */
    mem_block *spare CUBE_GUARDED_FIELD(lock);
    uint64_t spare_count CUBE_GUARDED_FIELD(lock);
    mem_slab *slabs CUBE_GUARDED_FIELD(lock);
    /* Storage given back under the lock, handed to ops.free only once the
     * lock is dropped (mem_unlock): a storage free may block (a device
     * free waits for its stream), and other threads' pool hits must not
     * wait behind it. */
    struct mem_put {
        uint64_t address, size;
    } * puts;
    size_t put_count, put_cap;
};

/* layout.c: a power-of-two alignment and a memory size >= it.
 * Errors: CUBE_ERR_INVALID_ARGUMENT. */
cube_error *mem_device_check(const mem_device *dev);

/* layout.c: the page limit of a (checked) device: min(256 MiB, the largest
 * power of two <= memory / 8), rounded up to the alignment, at least one
 * alignment unit and at most the memory rounded down to it. The subslices
 * preset's pages of fixed size never exceed it; a sliced pool whose
 * page_size exceeds it sizes its pages to the request (see
 * pool_sliced.c). */
uint64_t mem_page_limit(const mem_device *dev);

/* A sliced pool's request-sized pages are rounded up to a granule of
 * 2 MiB (or the page limit when that is smaller, rounded up to the
 * alignment), and are at least the page limit / MEM_PAGE_LEAST_SHARE. */
#define MEM_PAGE_GRANULE (2ull << 20)
#define MEM_PAGE_LEAST_SHARE 4u

/* --- memory_manager.c: shared helpers --- */

static inline uint64_t mem_round(const mem_manager *m, uint64_t size)
{
    uint64_t a = m->dev.alignment;
    return (size + a - 1) & ~(a - 1);
}

/* A spare record (the caller made sure one is there: mem_alloc keeps at
 * least MEM_SPARE_MIN before it routes). */
#define MEM_SPARE_MIN 2
mem_block *mem_record_take(mem_manager *m) CUBE_REQUIRES(m->lock);
/* A spare record for the free block [address, address + size) of `p`. */
mem_block *mem_record_for(mem_manager *m, mem_pool *p, uint64_t address,
                          uint64_t size) CUBE_REQUIRES(m->lock);
void mem_record_give(mem_manager *m, mem_block *b) CUBE_REQUIRES(m->lock);

/* Maps [address, address + size) of an expandable pool's range, with the
 * out-of-memory handling of mem_storage_get (which may unmap free pages
 * of any expandable pool, never one a live block touches). Errors: as
 * mem_storage_get. */
cube_error *mem_storage_map(mem_manager *m, uint64_t address, uint64_t size)
    CUBE_REQUIRES(m->lock);

/* Storage with out-of-memory handling: on a refusal, releases everything
 * unused and retries once. Errors: CUBE_ERR_OUT_OF_MEMORY,
 * CUBE_ERR_DEVICE_FAULT (the storage's own, passed on without a retry: a
 * broken device is not short of memory). */
cube_error *mem_storage_get(mem_manager *m, uint64_t size, uint64_t *address)
    CUBE_REQUIRES(m->lock);
void mem_storage_put(mem_manager *m, uint64_t address, uint64_t size)
    CUBE_REQUIRES(m->lock);
/* Drops the manager's lock, then gives the storage what mem_storage_put
 * queued meanwhile. Every path that takes m->lock leaves through it. */
void mem_unlock(mem_manager *m) CUBE_RELEASE(m->lock);

/* Monotonic milliseconds. */
uint64_t mem_now_ms(void);

/* A pool's stats changes, each applied to the pool's `st` and to the
 * manager's totals (inline: live_add and live_remove are on the path of
 * every pool hit). pages: `n` pages of `bytes` in all (expandable pools
 * map and unmap runs of pages). */
static inline void mem_pages_add_one(mem_stats *st, uint64_t n, uint64_t bytes)
{
    st->pages += n;
    st->reserved += bytes;
    if (st->pages > st->pages_peak)
        st->pages_peak = st->pages;
    if (st->reserved > st->reserved_peak)
        st->reserved_peak = st->reserved;
}

static inline void mem_live_add_one(mem_stats *st, uint64_t requested,
                                    uint64_t extent)
{
    st->buffers++;
    st->in_use += requested;
    st->padding += extent - requested;
    if (st->buffers > st->buffers_peak)
        st->buffers_peak = st->buffers;
    if (st->in_use > st->in_use_peak)
        st->in_use_peak = st->in_use;
    if (requested > st->largest)
        st->largest = requested;
}

static inline void mem_live_remove_one(mem_stats *st, uint64_t requested,
                                       uint64_t extent)
{
    st->buffers--;
    st->in_use -= requested;
    st->padding -= extent - requested;
}

static inline void mem_stats_pages_add(mem_manager *m, mem_stats *st,
                                       uint64_t n, uint64_t bytes)
    CUBE_REQUIRES(m->lock);
static inline void mem_stats_pages_remove(mem_manager *m, mem_stats *st,
                                          uint64_t n, uint64_t bytes)
    CUBE_REQUIRES(m->lock);
static inline void mem_stats_live_add(mem_manager *m, mem_stats *st,
                                      uint64_t requested, uint64_t extent)
    CUBE_REQUIRES(m->lock);
static inline void mem_stats_live_remove(mem_manager *m, mem_stats *st,
                                         uint64_t requested, uint64_t extent)
    CUBE_REQUIRES(m->lock);

/* Raises a high-water mark. A branch, not a maximum: in a steady state
 * the mark stays, and the branch, always predicted, saves the store. */
static inline void mem_peak(uint64_t *peak, uint64_t value)
{
    if (value > *peak)
        *peak = value;
}

static inline void mem_stats_pages_add(mem_manager *m, mem_stats *st,
                                       uint64_t n, uint64_t bytes)
{
    mem_pages_add_one(st, n, bytes);
    mem_totals *t = &m->tot;
    t->reserved += bytes;
    mem_peak(&t->reserved_peak, t->reserved);
    mem_peak(&t->cached_peak, t->reserved - t->extent);
}

static inline void mem_stats_pages_remove(mem_manager *m, mem_stats *st,
                                          uint64_t n, uint64_t bytes)
{
    st->pages -= n;
    st->reserved -= bytes;
    m->tot.reserved -= bytes;
}

static inline void mem_stats_live_add(mem_manager *m, mem_stats *st,
                                      uint64_t requested, uint64_t extent)
{
    mem_live_add_one(st, requested, extent);
    mem_totals *t = &m->tot;
    t->buffers++;
    t->in_use += requested;
    t->extent += extent;
    mem_peak(&t->buffers_peak, t->buffers);
    mem_peak(&t->in_use_peak, t->in_use);
}

static inline void mem_stats_live_remove(mem_manager *m, mem_stats *st,
                                         uint64_t requested, uint64_t extent)
{
    mem_live_remove_one(st, requested, extent);
    mem_totals *t = &m->tot;
    t->buffers--;
    t->in_use -= requested;
    t->extent -= extent;
    /* The free bytes grow when buffers go (and when pages come in). */
    mem_peak(&t->cached_peak, t->reserved - t->extent);
}

#define mem_stats_page_add(m, st, size) mem_stats_pages_add(m, st, 1, size)
#define mem_stats_page_remove(m, st, size)                                     \
    mem_stats_pages_remove(m, st, 1, size)

/* Hands block `b` of `extent` bytes out for a request of `size`: live,
 * counted, in *out. Returns NULL (no error), for the pools' alloc. */
static inline cube_error *mem_hand_out(mem_manager *m, mem_pool *p,
                                       mem_block *b, uint64_t size,
                                       uint64_t extent, mem_block **out)
    CUBE_REQUIRES(m->lock);
static inline cube_error *mem_hand_out(mem_manager *m, mem_pool *p,
                                       mem_block *b, uint64_t size,
                                       uint64_t extent, mem_block **out)
{
    b->requested = size;
    mem_stats_live_add(m, &p->st, size, extent);
    *out = b;
    return NULL;
}

/* Whether the pool's cap leaves room for `bytes` more. */
static inline int mem_pool_room(const mem_pool *p, uint64_t bytes)
{
    uint64_t cap = p->config.cap;
    return cap == 0 || (p->st.reserved <= cap && bytes <= cap - p->st.reserved);
}

/* Links `b` at the head of the pool's block list (not for sliced pools). */
void mem_pool_link(mem_pool *p, mem_block *b);
void mem_pool_unlink(mem_pool *p, mem_block *b);
/* A block for a page of `extent` bytes the storage gave at `address`,
 * linked into the pool's block list and counted as a page of it (not for
 * sliced pools). Never fails: records are taken from the spares. */
mem_block *mem_pool_page_new(mem_manager *m, mem_pool *p, uint64_t address,
                             uint64_t extent) CUBE_REQUIRES(m->lock);
/* Unlinks a free block from the pool's block list and gives its page back
 * to the storage, and its record to the spares (not for sliced pools). */
void mem_pool_page_drop(mem_manager *m, mem_pool *p, mem_block *b)
    CUBE_REQUIRES(m->lock);
/* Gives every block of the pool's block list back to the storage, live or
 * not (not for sliced pools). */
void mem_pool_drop_all(mem_manager *m, mem_pool *p) CUBE_REQUIRES(m->lock);

/* Pool operations. alloc: *out is the live block, or NULL with no error
 * when the pool's cap leaves no room (the caller spills over). release:
 * gives back to the storage what the pool holds unused, returning the
 * bytes given back; an exclusive pool, given a time `now_ms` other than
 * UINT64_MAX, gives back only pages unused for its release_after_ms (none
 * when that is 0). fini: gives back every page, live or not. */
cube_error *mem_sliced_init(mem_manager *m, mem_pool *p);
/* Sliced and expandable pools, whose blocks tile a range in address order
 * (prev/next): merges a free block with its free neighbours and files the
 * result in the bins (the hot block, not in the bins, is left alone);
 * puts the hot block, if any, where a free would have. */
void mem_merge_and_file(mem_manager *m, mem_pool *p, mem_block *b)
    CUBE_REQUIRES(m->lock);
void mem_hot_file(mem_manager *m, mem_pool *p) CUBE_REQUIRES(m->lock);
/* Sliced and expandable pools: cuts block `b` (in no bin) to `extent`
 * bytes; the rest, if any, becomes a free block right after it, filed. */
void mem_split(mem_manager *m, mem_pool *p, mem_block *b, uint64_t extent)
    CUBE_REQUIRES(m->lock);
/* Sliced and expandable pools: the hot block (the one freed last), when
 * it is of `extent` bytes, handed out for a request of `size` (see
 * mem_hand_out); else NULL, the hot block left as it is. */
mem_block *mem_hot_take(mem_manager *m, mem_pool *p, uint64_t size,
                        uint64_t extent) CUBE_REQUIRES(m->lock);
/* Sliced and expandable pools' free: `b` becomes the hot block, not yet
 * merged nor filed, and the previous hot block is filed first. */
void mem_hot_free(mem_manager *m, mem_block *b) CUBE_REQUIRES(m->lock);
/* Sliced and expandable pools' fini: gives the records of the chain of
 * blocks from `b` on (next) back to the spares, live or not. */
void mem_chain_give(mem_manager *m, mem_pool *p, mem_block *b)
    CUBE_REQUIRES(m->lock);
cube_error *mem_sliced_alloc(mem_manager *m, mem_pool *p, uint64_t size,
                             mem_block **out) CUBE_REQUIRES(m->lock);
uint64_t mem_sliced_release(mem_manager *m, mem_pool *p) CUBE_REQUIRES(m->lock);
void mem_sliced_fini(mem_manager *m, mem_pool *p) CUBE_REQUIRES(m->lock);

cube_error *mem_exclusive_init(mem_manager *m, mem_pool *p);
cube_error *mem_exclusive_alloc(mem_manager *m, mem_pool *p, uint64_t size,
                                mem_block **out) CUBE_REQUIRES(m->lock);
void mem_exclusive_free(mem_manager *m, mem_block *b) CUBE_REQUIRES(m->lock);
uint64_t mem_exclusive_release(mem_manager *m, mem_pool *p, uint64_t now_ms)
    CUBE_REQUIRES(m->lock);
void mem_exclusive_fini(mem_manager *m, mem_pool *p) CUBE_REQUIRES(m->lock);

cube_error *mem_persistent_alloc(mem_manager *m, mem_pool *p, uint64_t size,
                                 mem_block **out) CUBE_REQUIRES(m->lock);
void mem_persistent_free(mem_manager *m, mem_block *b) CUBE_REQUIRES(m->lock);
uint64_t mem_persistent_release(mem_manager *m, mem_pool *p)
    CUBE_REQUIRES(m->lock);
/* Expandable pools (pool_expandable.c). init: the bins, for a range of
 * the pool's reservation size (nothing is reserved yet). alloc: as the
 * others; *out NULL when a capped pool's range has no free run that fits.
 * release: unmaps every mapped page no live block touches. fini: unmaps
 * what is mapped and gives the range back. */
cube_error *mem_expandable_init(mem_manager *m, mem_pool *p);
cube_error *mem_expandable_alloc(mem_manager *m, mem_pool *p, uint64_t size,
                                 mem_block **out) CUBE_REQUIRES(m->lock);
uint64_t mem_expandable_release(mem_manager *m, mem_pool *p)
    CUBE_REQUIRES(m->lock);
void mem_expandable_fini(mem_manager *m, mem_pool *p) CUBE_REQUIRES(m->lock);
/* The size of an expandable pool's range: its cap, or the device's memory
 * when it has none, rounded up to the storage's granularity. */
uint64_t mem_expandable_range(const mem_manager *m, const mem_pool *p);

/* Forgets sizes no block has any more (after a release). */
void mem_persistent_prune(mem_pool *p);
void mem_persistent_fini(mem_manager *m, mem_pool *p) CUBE_REQUIRES(m->lock);

#endif /* CUBE_MEMORY_MEM_INTERNAL_H */
