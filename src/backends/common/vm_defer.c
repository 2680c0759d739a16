/* Deferred unmaps (vm_defer.h): a bitmap of the deferred pages and the
 * batches that deferred them, oldest first. */
#include "backends/common/vm_defer.h"

#include <stdlib.h>
#include <string.h>

#include "base/grow.h"
#include "cubert/backend/errors.h"

char vm_defer_done[1];

static int bit_get(const uint64_t *bits, uint64_t i)
{
    return (int)((bits[i / 64u] >> (i % 64u)) & 1u);
}

static void bit_set(uint64_t *bits, uint64_t i, int on)
{
    if (on)
        bits[i / 64u] |= 1ull << (i % 64u);
    else
        bits[i / 64u] &= ~(1ull << (i % 64u));
}

cube_error *vm_defer_init(vm_defer *d, uint64_t pages)
{
    memset(d, 0, sizeof *d);
    d->bits = calloc((size_t)((pages + 63u) / 64u) + 1u, sizeof *d->bits);
    if (!d->bits)
        return cube_error_new(CUBE_ERR_OUT_OF_MEMORY,
                              "no host memory for the deferred-unmap map of "
                              "%llu pages",
                              (unsigned long long)pages);
    d->pages = pages;
    return NULL;
}

void vm_defer_fini(vm_defer *d)
{
    free(d->bits);
    free(d->batches);
    memset(d, 0, sizeof *d);
}

int vm_defer_is(const vm_defer *d, uint64_t page)
{
    return page < d->pages && bit_get(d->bits, page);
}

cube_error *vm_defer_add(vm_defer *d, uint64_t first, uint64_t count,
                         void *marker)
{
    if (first > d->pages || count > d->pages - first)
        return cube_error_new(
            CUBE_ERR_INTERNAL, "deferring pages %llu..%llu of %llu",
            (unsigned long long)first, (unsigned long long)(first + count),
            (unsigned long long)d->pages);
    vm_defer_batch *room =
        cube_grow(d->batches, d->batch_count, &d->batch_cap, sizeof *room, 8);
    if (!room)
        return cube_error_new(CUBE_ERR_OUT_OF_MEMORY,
                              "no host memory to defer an unmap");
    d->batches = room;
    vm_defer_batch *b = &d->batches[d->batch_count++];
    b->first = first;
    b->count = count;
    b->marker = marker;
    for (uint64_t i = first; i < first + count; i++)
        if (!bit_get(d->bits, i)) {
            bit_set(d->bits, i, 1);
            d->count++;
        }
    return NULL;
}

void vm_defer_mark(vm_defer *d, void *(*record)(void *self), void *self)
{
    for (size_t k = 0; k < d->batch_count; k++)
        if (!d->batches[k].marker)
            d->batches[k].marker = record(self);
}

uint64_t vm_defer_take(vm_defer *d, uint64_t first, uint64_t count)
{
    uint64_t n = 0;
    for (uint64_t i = first; i < first + count && i < d->pages && d->count; i++)
        if (bit_get(d->bits, i)) {
            bit_set(d->bits, i, 0);
            d->count--;
            n++;
        }
    return n;
}

/* Whether a batch after the k-th covers page i (the page was taken back
 * and deferred again: its last use is the newer batch's). */
static int newer_covers(const vm_defer *d, size_t k, uint64_t i)
{
    for (size_t j = k + 1; j < d->batch_count; j++)
        if (i >= d->batches[j].first &&
            i - d->batches[j].first < d->batches[j].count)
            return 1;
    return 0;
}

uint64_t vm_defer_reap(vm_defer *d, const vm_defer_ops *o, int wait,
                       uint64_t keep, uint64_t kept)
{
    uint64_t unmapped = 0;
    size_t k = 0, left = 0;
    for (; k < d->batch_count; k++) {
        vm_defer_batch b = d->batches[k];
        if (b.marker != vm_defer_done) {
            /* Markers complete in order: none after this one is done. */
            if (!o->done(o->self, b.marker, wait))
                break;
            if (b.marker)
                o->put(o->self, b.marker);
            b.marker = vm_defer_done;
        }
        int stays = 0;
        uint64_t run = 0, run_len = 0;
        for (uint64_t i = b.first; i < b.first + b.count; i++) {
            int go = bit_get(d->bits, i) && !newer_covers(d, k, i);
            if (go && i >= keep && i - keep < kept) {
                stays = 1;
                go = 0;
            }
            if (go) {
                bit_set(d->bits, i, 0);
                d->count--;
                if (!run_len)
                    run = i;
                run_len++;
                continue;
            }
            if (run_len)
                o->unmap(o->self, run, run_len);
            unmapped += run_len;
            run_len = 0;
        }
        if (run_len)
            o->unmap(o->self, run, run_len);
        unmapped += run_len;
        if (stays)
            d->batches[left++] = b;
    }
    /* The batches not reached stay, in order, after those kept. */
    if (k > left) {
        memmove(&d->batches[left], &d->batches[k],
                (d->batch_count - k) * sizeof *d->batches);
        d->batch_count -= k - left;
    }
    return unmapped;
}
