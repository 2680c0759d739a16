/* Segregated size-class bins of free blocks (see mem_internal.h). */
#include <stdlib.h>

#include "base/error.h"
#include "memory/mem_internal.h"

/* Blocks of the request's own bin looked at before the larger bins. */
#define MEM_BIN_PROBE 8u

static uint32_t bin_of(uint64_t units)
{
    if (units < 2ull * MEM_BIN_SUB)
        return (uint32_t)units;
    unsigned fl = 63u - (unsigned)__builtin_clzll(units);
    uint64_t sub = (units >> (fl - MEM_BIN_SUB_BITS)) - MEM_BIN_SUB;
    return MEM_BIN_SUB * (fl - MEM_BIN_SUB_BITS + 1u) + (uint32_t)sub;
}

cube_error *mem_bins_init(mem_bins *bins, uint64_t largest, unsigned shift)
{
    uint32_t count = bin_of(largest >> shift) + 1u;
    uint32_t words = (count + 63u) / 64u;
    bins->count = count;
    bins->shift = shift;
    bins->summary = 0;
    bins->map = calloc(words, sizeof *bins->map);
    bins->heads = calloc(count, sizeof(mem_block *));
    if (!bins->map || !bins->heads) {
        mem_bins_fini(bins);
        return cube_error_new(CUBE_ERR_OUT_OF_MEMORY,
                              "no host memory for %u size-class bins",
                              (unsigned)count);
    }
    return NULL;
}

void mem_bins_fini(mem_bins *bins)
{
    free(bins->map);
    free(bins->heads);
    bins->map = NULL;
    bins->heads = NULL;
    bins->count = 0;
    bins->summary = 0;
}

void mem_bins_insert(mem_bins *bins, mem_block *b)
{
    uint32_t i = bin_of(b->size >> bins->shift);
    mem_block *head = bins->heads[i];
    b->fprev = NULL;
    b->fnext = head;
    if (head)
        head->fprev = b;
    bins->heads[i] = b;
    bins->map[i / 64u] |= 1ull << (i % 64u);
    bins->summary |= 1ull << (i / 64u);
}

void mem_bins_remove(mem_bins *bins, mem_block *b)
{
    uint32_t i = bin_of(b->size >> bins->shift);
    if (b->fprev)
        b->fprev->fnext = b->fnext;
    else
        bins->heads[i] = b->fnext;
    if (b->fnext)
        b->fnext->fprev = b->fprev;
    b->fprev = b->fnext = NULL;
    if (!bins->heads[i]) {
        bins->map[i / 64u] &= ~(1ull << (i % 64u));
        if (!bins->map[i / 64u])
            bins->summary &= ~(1ull << (i / 64u));
    }
}

/* The first nonempty bin at or after `from`, or MEM_BIN_NONE. */
static uint32_t next_nonempty(const mem_bins *bins, uint32_t from)
{
    if (from >= bins->count)
        return MEM_BIN_NONE;
    uint32_t w = from / 64u;
    uint64_t bits = bins->map[w] & (~0ull << (from % 64u));
    if (bits)
        return w * 64u + (uint32_t)__builtin_ctzll(bits);
    uint64_t higher = w + 1u < 64u ? bins->summary & (~0ull << (w + 1u)) : 0;
    if (!higher)
        return MEM_BIN_NONE;
    w = (uint32_t)__builtin_ctzll(higher);
    return w * 64u + (uint32_t)__builtin_ctzll(bins->map[w]);
}

/* The first block of `x`'s list (at most `limit` of them) with an extent
 * in [lo, hi]; *stop receives where the look ended. */
static mem_block *first_fit(mem_block *x, uint64_t lo, uint64_t hi,
                            unsigned limit, mem_block **stop)
{
    unsigned n = 0;
    for (; x && n < limit; x = x->fnext, n++) {
        if (x->size >= lo && x->size <= hi)
            return x;
    }
    if (stop)
        *stop = x;
    return NULL;
}

mem_block *mem_bins_find(const mem_bins *bins, uint64_t lo, uint64_t hi,
                         int exhaustive)
{
    uint32_t b = bin_of(lo >> bins->shift);
    if (b >= bins->count || hi < lo)
        return NULL;
    uint32_t top = bin_of(hi >> bins->shift);
    if (top >= bins->count)
        top = bins->count - 1u;
    unsigned limit = exhaustive ? UINT32_MAX : MEM_BIN_PROBE;

    mem_block *rest = NULL;
    mem_block *found = first_fit(bins->heads[b], lo, hi, MEM_BIN_PROBE, &rest);
    if (found)
        return found;
    if (top > b) {
        /* Every block of a bin strictly between b and top fits. */
        uint32_t c = next_nonempty(bins, b + 1u);
        if (c != MEM_BIN_NONE && c < top)
            return bins->heads[c];
        if (c == top) {
            found = first_fit(bins->heads[c], lo, hi, limit, NULL);
            if (found)
                return found;
        }
    }
    if (exhaustive)
        return first_fit(rest, lo, hi, limit, NULL);
    return NULL;
}
