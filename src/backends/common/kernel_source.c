/* The text a backend compiles for a kernel (kernel_source.h). */
#include <stdlib.h>
#include <string.h>

#include "backends/common/kernel_source.h"

/* The `n` parts, a newline after each, then `#line 1 "<name><ext>"`, the
 * user's source and a newline. */
static char *kernel_source_join(const char *const *parts, size_t n,
                                const char *name, const char *ext,
                                const char *user)
{
    static const char line[] = "#line 1 \"";
    size_t cap = sizeof line + strlen(name) + strlen(ext) + strlen(user) + 4;
    for (size_t i = 0; i < n; i++)
        cap += strlen(parts[i]) + 1;
    char *text = malloc(cap);
    if (!text)
        return NULL;
    char *at = text;
    for (size_t i = 0; i < n; i++) {
        size_t len = strlen(parts[i]);
        memcpy(at, parts[i], len);
        at += len;
        *at++ = '\n';
    }
    const char *tail[] = {line, name, ext, "\"\n", user, "\n"};
    for (size_t i = 0; i < sizeof tail / sizeof tail[0]; i++) {
        size_t len = strlen(tail[i]);
        memcpy(at, tail[i], len);
        at += len;
    }
    *at = '\0';
    return text;
}

char *kernel_source_cube_c(const char *const *preludes, size_t n,
                           const char *name, const char *user)
{
    const char *parts[4];
    if (n + 1 > sizeof parts / sizeof parts[0])
        return NULL;
    for (size_t i = 0; i < n; i++)
        parts[i] = preludes[i];
    parts[n] = cube_prelude_common;
    return kernel_source_join(parts, n + 1, name, ".cube.c", user);
}

char *kernel_source_raw_c(const char *prelude, const char *name,
                          const char *user)
{
    return kernel_source_join(&prelude, 1, name, ".c", user);
}
