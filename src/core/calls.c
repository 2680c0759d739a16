/* Public calls in flight, and refusing them once a client closes.
 *
 * Closing a client while another thread still calls it is the caller's
 * mistake (docs/threading.md), but it must not unload a kernel under a
 * running launch or free memory under a copy. Every public call that
 * reaches the client's state counts itself in flight on one of the
 * client's shards (core_call_enter / core_call_leave: one atomic
 * increment and one decrement, on a cache line the calling thread
 * usually has to itself). cube_client_close first sets the closing bit in
 * every shard, after which a call that starts is refused with
 * CUBE_ERR_INVALID_ARGUMENT, and then waits until every shard's count is
 * zero before it tears anything down. A call that starts after close has
 * freed the client cannot be told apart from any use after free: the
 * window this covers is the one while close runs.
 *
 * Correctness rests on each shard being one atomic variable: a call's
 * increment either comes before close's fetch_or in that variable's
 * order (close then sees the call until its decrement) or after it (the
 * call sees the closing bit and backs out without touching anything
 * else). The decrement releases what the call did to the client; close's
 * load acquires it before the teardown. */

#include "base/backoff.h"
#include "core/client_internal.h"

_Thread_local uint32_t core_thread_call_shard;

static atomic_uint next_shard;

uint32_t core_call_shard_choose(void)
{
    uint32_t s =
        atomic_fetch_add_explicit(&next_shard, 1, memory_order_relaxed) %
            CORE_CALL_SHARDS +
        1;
    core_thread_call_shard = s;
    return s;
}

cube_error *core_call_refused(const char *fn)
{
    return cube_error_new(CUBE_ERR_INVALID_ARGUMENT,
                          "%s: the client is closing (cube_client_close was "
                          "called while other calls on it were still being "
                          "made; close a client after every other call on "
                          "it has returned)",
                          fn);
}

/* Waits for one shard's calls in flight: a launch or a copy takes
 * microseconds to milliseconds, so yield first, then sleep. */
static void drain(core_call_shard *sh)
{
    for (unsigned spins = 0;
         atomic_load_explicit(&sh->n, memory_order_acquire) !=
         CORE_CALLS_CLOSING;
         spins++)
        cube_backoff(spins);
}

void core_calls_close(cube_client *c)
{
    for (uint32_t i = 0; i < CORE_CALL_SHARDS; i++)
        atomic_fetch_or_explicit(&c->calls[i].n, CORE_CALLS_CLOSING,
                                 memory_order_acq_rel);
    if (c->closing_hook)
        c->closing_hook(c->closing_hook_arg);
    for (uint32_t i = 0; i < CORE_CALL_SHARDS; i++)
        drain(&c->calls[i]);
}
