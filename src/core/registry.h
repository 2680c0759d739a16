/* The registry table, generated at configure time from the list of backends
 * in CMakeLists.txt (see cmake/backends.cmake), and read by registry.c. */
#ifndef CUBE_CORE_REGISTRY_H
#define CUBE_CORE_REGISTRY_H

#include "cubert/backend/server.h"

/* The backends compiled in, in the order of CUBE_BACKENDS; NULL-terminated. */
extern const cube_backend *const core_registry_backends[];
/* Their names, in the same order; NULL-terminated. */
extern const char *const core_registry_names[];
/* The backends the project has that this build left out; NULL-terminated. */
extern const char *const core_registry_left_out[];

#endif /* CUBE_CORE_REGISTRY_H */
