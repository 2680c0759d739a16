/* The failure store: each allocation carries the error of the work that
 * should have written it, until a later successful full write clears it.
 * The device fault is the terminal state of every client of the device. */
#include <stdlib.h>

#include "core/client_internal.h"

void core_failure_record(cube_client *c, core_alloc *a, const cube_error *err)
{
    cube_error *copy = cube_error_clone(err);
    cube_mutex_lock(&c->failure_lock);
    cube_error *old = atomic_load_explicit(&a->failure, memory_order_relaxed);
    atomic_store_explicit(&a->failure, copy, memory_order_release);
    cube_mutex_unlock(&c->failure_lock);
    cube_error_free(old);
}

void core_failure_clear(cube_client *c, core_alloc *a)
{
    if (!atomic_load_explicit(&a->failure, memory_order_acquire))
        return; /* already trusted: no lock */
    cube_mutex_lock(&c->failure_lock);
    cube_error *old = atomic_load_explicit(&a->failure, memory_order_relaxed);
    atomic_store_explicit(&a->failure, NULL, memory_order_release);
    cube_mutex_unlock(&c->failure_lock);
    cube_error_free(old);
}

cube_error *core_failure_get(cube_client *c, core_alloc *a)
{
    if (!atomic_load_explicit(&a->failure, memory_order_acquire))
        return NULL; /* trusted: no lock */
    /* The copy is made under the lock: a concurrent record or clear frees
     * the old error only after leaving it. */
    cube_mutex_lock(&c->failure_lock);
    cube_error *copy = cube_error_clone(
        atomic_load_explicit(&a->failure, memory_order_relaxed));
    cube_mutex_unlock(&c->failure_lock);
    return copy;
}

cube_error *core_failure_claim_check(cube_client *c, const core_resolved *r,
                                     size_t n, const char *operation)
{
    cube_error *several = NULL;
    size_t failed = 0;
    for (size_t i = 0; i < n; i++) {
        /* A buffer named twice is reported once. */
        int seen = 0;
        for (size_t j = 0; j < i; j++)
            seen |= r[j].alloc == r[i].alloc;
        if (seen)
            continue;
        cube_error *f = core_failure_get(c, r[i].alloc);
        if (!f)
            continue;
        if (!several)
            several = cube_error_new(CUBE_ERR_SEVERAL, "placeholder");
        char name[CORE_BUFFER_NAME_MAX];
        core_buffer_name(r[i].alloc, r[i].handle.bits, name);
        cube_error_add_cause(several, cube_error_prefix(f, "buffer %s", name));
        failed++;
    }
    if (!several)
        return NULL;
    cube_error *out = cube_error_new(
        CUBE_ERR_SEVERAL,
        "%s: %zu of %zu buffers cannot be trusted: the work that should "
        "have written them failed",
        operation, failed, n);
    for (size_t i = 0; i < cube_error_cause_count(several); i++)
        cube_error_add_cause(out,
                             cube_error_clone(cube_error_cause(several, i)));
    cube_error_free(several);
    return out;
}

cube_error *core_fault_get(cube_client *c)
{
    core_device *d = c->dev;
    cube_mutex_lock(&d->fault_lock);
    cube_error *copy = cube_error_clone(d->fault);
    cube_mutex_unlock(&d->fault_lock);
    return copy;
}

void core_fault_note(cube_client *c, const cube_error *err)
{
    if (cube_error_code(err) != CUBE_ERR_DEVICE_FAULT)
        return;
    /* The device's: every client of it is in the terminal state. */
    core_device *d = c->dev;
    cube_mutex_lock(&d->fault_lock);
    if (!d->fault)
        d->fault = cube_error_clone(err);
    cube_mutex_unlock(&d->fault_lock);
    atomic_store_explicit(&d->faulted, 1, memory_order_release);
}
