/* Growing the arrays backends keep (spare events, pending and deferred
 * frees, staging buffers, captured blocks): by doubling, one element of
 * room at a time.
 *
 * Thread safety: the caller's, as for the array itself. Errors: NULL for
 * want of memory, as grow_for_one says.
 */
#ifndef CUBE_BACKENDS_COMMON_GROW_H
#define CUBE_BACKENDS_COMMON_GROW_H

#include <stddef.h>
#include <stdlib.h>

/* Room for one more element after the `count` used of `items` (room for
 * *cap elements of `elem` bytes): `items` while it has room, else `items`
 * reallocated to twice its capacity (`first` elements when it had none),
 * with *cap updated. NULL for want of memory: `items` is then unchanged
 * and still the caller's. */
static inline void *grow_for_one(void *items, size_t count, size_t *cap,
                                 size_t elem, size_t first)
{
    if (count < *cap)
        return items;
    size_t c = *cap ? *cap * 2 : first;
    void *grown = realloc(items, c * elem);
    if (grown)
        *cap = c;
    return grown;
}

#endif /* CUBE_BACKENDS_COMMON_GROW_H */
