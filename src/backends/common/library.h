/* Finding a shared library to dlopen: the path a configuration key names
 * (its CUBERT_ variable or the file's line), else the first of a list of
 * names the dynamic loader finds. For the libraries backends load at run
 * time (NCCL, MPI). */
#ifndef CUBE_BACKENDS_COMMON_LIBRARY_H
#define CUBE_BACKENDS_COMMON_LIBRARY_H

#include <stddef.h>

/* Opens the library configuration key `key` names, or else the first of
 * `names` (NULL-terminated) that loads, with dlopen `flags`. On success
 * returns the handle and writes the name opened into path[0, path_cap).
 * On failure returns NULL and appends "name: why" for every library tried
 * (and where a configured one was set) to tried[0, tried_cap). */
void *library_open(const char *key, const char *const *names, int flags,
                   char *path, size_t path_cap, char *tried, size_t tried_cap);

#endif /* CUBE_BACKENDS_COMMON_LIBRARY_H */
