/* Growing an array by doubling, for the many lists that add one element
 * at a time and keep their capacity beside them.
 *
 * Thread safety: none of its own; the caller holds whatever guards the
 * array.
 */
#ifndef CUBE_BASE_GROW_H
#define CUBE_BASE_GROW_H

#include <stdlib.h>

/* Room for one more element (of `size` bytes) in `items`, of which
 * `count` of *cap are taken: when full, the array doubled (`first`
 * elements to begin with) and *cap raised. Returns the array, moved or
 * not, or NULL when memory ran out, `items` and *cap left as they were. */
static inline void *cube_grow(void *items, size_t count, size_t *cap,
                              size_t size, size_t first)
{
    if (count < *cap)
        return items;
    size_t n = *cap ? *cap * 2 : first;
    void *grown = realloc(items, n * size);
    if (grown)
        *cap = n;
    return grown;
}

#endif /* CUBE_BASE_GROW_H */
