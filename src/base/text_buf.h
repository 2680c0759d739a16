/* A growing text buffer: an error's formatted tree (error.c), and the
 * text backends build (compiler output and command lines, the barrier
 * pass's rewritten kernel).
 *
 * Thread safety: the caller's, as for the buffer itself. Errors: a failed
 * allocation sets `failed`; nothing is appended after it.
 */
#ifndef CUBE_BASE_TEXT_BUF_H
#define CUBE_BASE_TEXT_BUF_H

#include <stdbool.h>
#include <stddef.h>

/* Zeroed is empty. The owner frees data. */
typedef struct text_buf {
    char *data;
    size_t len;
    size_t cap;
    bool failed; /* an allocation failed */
} text_buf;

/* Appends `len` bytes of `data` (and keeps a NUL after them); on a failed
 * allocation sets b->failed and appends nothing more. */
void text_buf_append(text_buf *b, const void *data, size_t len);

#endif /* CUBE_BASE_TEXT_BUF_H */
