/* The backends compiled into this library. Adding a backend is one line
 * here and one folder under src/backends. */
#include <string.h>

#include "core/client_internal.h"

extern const cube_backend cube_backend_cpu;
extern const cube_backend cube_backend_cuda;

static const cube_backend *const backends[] = {&cube_backend_cpu,
                                               &cube_backend_cuda, NULL};
static const char *const backend_names[] = {"cpu", "cuda", NULL};

const cube_backend *const *core_backends(void)
{
    return backends;
}

const cube_backend *core_backend_find(const char *name)
{
    for (size_t i = 0; backends[i]; i++)
        if (strcmp(backends[i]->name, name) == 0)
            return backends[i];
    return NULL;
}

const char *const *cube_backend_names(void)
{
    return backend_names;
}
