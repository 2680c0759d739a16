/* Doubly linked lists threaded through their elements, for any element
 * type: each element names its neighbours in two pointer fields (any
 * names, so that one element can be on several lists), and the list is an
 * lvalue pointing at its first element (NULL when empty). A macro because
 * the element types differ and the fields are named by the caller.
 *
 * Thread safety: none of its own; the caller holds whatever guards the
 * list.
 */
#ifndef CUBE_BASE_DLIST_H
#define CUBE_BASE_DLIST_H

/* Takes `node` out of the list starting at `head`, whose elements link
 * through the fields `prev` and `next`. node's own links are left as they
 * were, for the caller to clear or to free with the node. */
#define CUBE_DLIST_UNLINK(head, node, prev, next)                              \
    do {                                                                       \
        if ((node)->prev)                                                      \
            (node)->prev->next = (node)->next;                                 \
        else                                                                   \
            (head) = (node)->next;                                             \
        if ((node)->next)                                                      \
            (node)->next->prev = (node)->prev;                                 \
    } while (0)

#endif /* CUBE_BASE_DLIST_H */
