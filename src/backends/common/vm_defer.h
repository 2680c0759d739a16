/* Deferred unmaps of a reservation's pages: the bookkeeping a storage
 * needs to unmap pages only once the work queued before their unmap has
 * run, with no wait on the path of the unmap itself.
 *
 * An unmap adds a batch: its pages are marked deferred (still mapped, out
 * of the manager's accounting) and the batch holds one completion marker
 * (on CUDA an event recorded on the owner stream after the pages' last
 * use; NULL when none could be recorded yet, e.g. while a capture runs).
 * A later map of a deferred page takes it back as it is (vm_defer_take).
 * vm_defer_reap unmaps the deferred pages of the batches whose marker has
 * completed, oldest first; markers complete in the order they were added
 * (one stream), so the reap stops at the first one not done. A page taken
 * back and deferred again belongs to its newest batch only: an older
 * batch completing never unmaps it.
 *
 * Not thread-safe: the storage calls these under the memory manager's
 * lock. */
#ifndef CUBE_VM_DEFER_H
#define CUBE_VM_DEFER_H

#include <stddef.h>
#include <stdint.h>

#include "cubert/error.h"

typedef struct vm_defer_batch {
    uint64_t first, count; /* pages [first, first + count) */
    void *marker;          /* NULL: none yet; vm_defer_done: completed */
} vm_defer_batch;

typedef struct vm_defer {
    uint64_t pages;          /* in the reservation */
    uint64_t *bits;          /* one bit per page: deferred */
    uint64_t count;          /* pages deferred now */
    vm_defer_batch *batches; /* oldest first */
    size_t batch_count, batch_cap;
} vm_defer;

/* What a reap asks of the storage. `done` says whether the work before
 * `marker` has run: with `wait`, waits for it first and returns 1 (a NULL
 * marker: the storage waits for all queued work, or returns 0 without
 * `wait`). `put` gives a marker back once done with. `unmap` unmaps pages
 * [first, first + count) of the reservation. */
typedef struct vm_defer_ops {
    void *self;
    int (*done)(void *self, void *marker, int wait);
    void (*put)(void *self, void *marker);
    void (*unmap)(void *self, uint64_t first, uint64_t count);
} vm_defer_ops;

/* A reservation of `pages` pages, none deferred. CUBE_ERR_OUT_OF_MEMORY
 * when the host has no memory for its bitmap. */
cube_error *vm_defer_init(vm_defer *d, uint64_t pages);
/* Frees the bookkeeping; markers still held are the caller's (reap with
 * `wait` first). */
void vm_defer_fini(vm_defer *d);

int vm_defer_is(const vm_defer *d, uint64_t page);

/* The marker of a batch already completed (whose kept pages a reap left
 * deferred): never passed to the ops. */
extern char vm_defer_done[1];

/* Defers pages [first, first + count), none of them deferred now, behind
 * `marker` (ownership passes to `d`; NULL: none yet, see vm_defer_mark).
 * CUBE_ERR_OUT_OF_MEMORY when no room for the batch: nothing is deferred
 * then and the caller unmaps the pages itself. */
cube_error *vm_defer_add(vm_defer *d, uint64_t first, uint64_t count,
                         void *marker);

/* Gives each batch without a marker one from `record` (returns NULL when
 * it cannot, the batch then stays without), oldest first. */
void vm_defer_mark(vm_defer *d, void *(*record)(void *self), void *self);

/* Takes pages [first, first + count) back from the deferred ones (they
 * are mapped already); returns how many were deferred. */
uint64_t vm_defer_take(vm_defer *d, uint64_t first, uint64_t count);

/* Unmaps the deferred pages of every batch whose marker is done (with
 * `wait`, of every batch), but pages [keep, keep + kept); returns the
 * pages unmapped. A batch whose kept pages stay deferred stays too. */
uint64_t vm_defer_reap(vm_defer *d, const vm_defer_ops *o, int wait,
                       uint64_t keep, uint64_t kept);

#endif
