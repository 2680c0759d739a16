/* What the examples share: stop with the error's full text on a failure.
 * (A program of your own would handle errors where they happen; the
 * examples keep to the point.) */
#ifndef CUBERT_EXAMPLE_UTIL_H
#define CUBERT_EXAMPLE_UTIL_H

#include <stdio.h>
#include <stdlib.h>

#include <cubert/cubert.h>

/* Prints `err` (code, message, compiler log, causes) and exits 1. */
static inline void check(cube_error *err, const char *what)
{
    if (!err)
        return;
    char *text = cube_error_format(err);
    fprintf(stderr, "%s: %s", what, text ? text : "out of memory\n");
    free(text);
    cube_error_free(err);
    exit(1);
}

#endif
