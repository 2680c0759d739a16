/* Ordering across streams, per buffer: a block's last writer and the
 * other streams that used it, and the waits a stream makes before it
 * touches the block (cuda_internal.h describes the scheme). Inside a
 * capture the block is noted for the graph instead. */
#include <stdlib.h>

#include "backends/cuda/cuda_internal.h"
#include "base/grow.h"

/* Notes `blk` as used by the capture in progress on `st`. */
static cube_error *capture_note(cuda_stream *st, cuda_block *blk)
{
    for (size_t i = 0; i < st->captured_count; i++)
        if (st->captured[i] == blk)
            return NULL;
    cuda_block **room = cube_grow(st->captured, st->captured_count,
                                  &st->captured_cap, sizeof *room, 32);
    if (!room)
        return cube_error_new(CUBE_ERR_OUT_OF_MEMORY, "graph capture");
    st->captured = room;
    st->captured[st->captured_count++] = blk;
    return NULL;
}

static void note_use(cuda_stream *st, cuda_block *blk, uint64_t seq)
{
    uint64_t tag = CUDA_TAG(st->index, seq);
    for (int i = 0; i < CUDA_USE_SLOTS; i++) {
        uint64_t cur = atomic_load(&blk->uses[i]);
        while (cur == 0 || CUDA_TAG_INDEX(cur) == st->index) {
            if (atomic_compare_exchange_weak(&blk->uses[i], &cur, tag))
                return;
        }
    }
    atomic_store(&blk->many, 1);
}

/* Before a write on `st`: every other stream's use of the block, issued
 * earlier, must be done first (a write after a read elsewhere). */
static cube_error *wait_for_uses(cuda_server *s, cuda_stream *st,
                                 cuda_block *blk)
{
    cube_error *err = NULL;
    if (atomic_load(&blk->many)) {
        /* More streams than the slots remember: wait for all of them. */
        uint32_t n = cuda_stream_count(s);
        for (uint32_t i = 0; i < n && !err; i++)
            err = cuda_stream_wait_for(s, st, i,
                                       atomic_load(&cuda_stream_at(s, i)->seq));
        return err;
    }
    for (int i = 0; i < CUDA_USE_SLOTS && !err; i++) {
        uint64_t u = atomic_load(&blk->uses[i]);
        if (u && CUDA_TAG_INDEX(u) != st->index)
            err =
                cuda_stream_wait_for(s, st, CUDA_TAG_INDEX(u), CUDA_TAG_SEQ(u));
    }
    return err;
}

cube_error *cuda_block_before_use(cuda_server *s, cuda_stream *st,
                                  cuda_block *blk, int write)
{
    if (st->capturing)
        return capture_note(st, blk);
    uint64_t w = atomic_load_explicit(&blk->writer, memory_order_acquire);
    cube_error *err = NULL;
    if (w && CUDA_TAG_INDEX(w) != st->index)
        err = cuda_stream_wait_for(s, st, CUDA_TAG_INDEX(w), CUDA_TAG_SEQ(w));
    if (!err && write &&
        atomic_load_explicit(&blk->shared, memory_order_relaxed))
        err = wait_for_uses(s, st, blk);
    return err;
}

int cuda_block_used(cuda_stream *st, cuda_block *blk, uint64_t seq, int written)
{
    if (blk->owner != st &&
        !atomic_load_explicit(&blk->shared, memory_order_relaxed))
        atomic_store(&blk->shared, 1);
    /* Only blocks two streams touch need their uses remembered. */
    if (atomic_load_explicit(&blk->shared, memory_order_relaxed))
        note_use(st, blk, seq);
    if (!written)
        return 0; /* a read's event is recorded when someone waits for it */
    atomic_store_explicit(&blk->writer, CUDA_TAG(st->index, seq),
                          memory_order_release);
    return atomic_load_explicit(&blk->shared, memory_order_relaxed);
}
