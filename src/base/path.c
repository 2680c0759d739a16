/* File paths. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/path.h"

char *cube_path_join(const char *dir, const char *name)
{
    size_t n = strlen(dir) + strlen(name) + 2;
    char *s = malloc(n);
    if (s)
        snprintf(s, n, "%s/%s", dir, name);
    return s;
}
