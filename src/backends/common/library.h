/* Finding a shared library to dlopen: the path a configuration key names
 * (its CUBERT_ variable or the file's line), else the first of a list of
 * names the dynamic loader finds. For the libraries backends load at run
 * time (NCCL, MPI), and resolving their symbols. */
#ifndef CUBE_BACKENDS_COMMON_LIBRARY_H
#define CUBE_BACKENDS_COMMON_LIBRARY_H

#include <pthread.h>
#include <stddef.h>

#include "cubert/backend/config.h"

/* The configuration key that names a library to load instead of the
 * default search (library_open reads it): `what` says which library and
 * who loads it, `defaults` the names searched. */
#define LIBRARY_CONFIG_KEY(key, defaults, what)                                \
    {                                                                          \
        .name = key, .type = CUBE_CONFIG_TEXT,                                 \
        .max_len = CUBE_CONFIG_TEXT_MAX, .default_text = defaults,             \
        .doc = what ": a path or a name the dynamic loader finds"              \
    }

/* A library loaded once per process: its loader runs once and writes why
 * loading failed into `failure` (left empty: loaded). */
typedef struct library_once {
    pthread_once_t once;
    char failure[1024];
} library_once;
#define LIBRARY_ONCE_INIT                                                      \
    {                                                                          \
        PTHREAD_ONCE_INIT, ""                                                  \
    }

/* Runs `load` the first time it is called for `l` (pthread_once); returns
 * NULL when the library loaded, else why not (l->failure). */
const char *library_once_run(library_once *l, void (*load)(void));

/* Opens the library configuration key `key` names, or else the first of
 * `names` (NULL-terminated) that loads, with dlopen `flags`. On success
 * returns the handle and writes the name opened into path[0, path_cap).
 * On failure returns NULL and appends "name: why" for every library tried
 * (and where a configured one was set) to tried[0, tried_cap). */
void *library_open(const char *key, const char *const *names, int flags,
                   char *path, size_t path_cap, char *tried, size_t tried_cap);

/* One symbol to resolve: where its address goes and the name the library
 * exports. An optional one may be missing (its slot is then NULL). */
typedef struct library_symbol {
    void **slot;
    const char *name;
    int optional;
} library_symbol;

/* The entries of a table of symbols: `slot` (an lvalue: the field of the
 * table of entry points that receives the address) and the name the
 * library exports. */
#define LIBRARY_SYMBOL(slot, name)                                             \
    {                                                                          \
        (void **)&(slot), name, 0                                              \
    }
#define LIBRARY_SYMBOL_OPTIONAL(slot, name)                                    \
    {                                                                          \
        (void **)&(slot), name, 1                                              \
    }

/* Resolves syms[0, n) in `lib` with dlsym. Returns NULL when every symbol
 * that is not optional resolved, else the name of the first one missing
 * (the slots before it are filled). */
const char *library_resolve(void *lib, const library_symbol *syms, size_t n);

/* library_open, then library_resolve in what it opened. On failure returns
 * NULL with the reason in tried[0, tried_cap): the libraries tried, or
 * "<path>: has no <kind> <symbol> (<needed>)". */
void *library_load(const char *key, const char *const *names, int flags,
                   const library_symbol *syms, size_t n, const char *kind,
                   const char *needed, char *path, size_t path_cap, char *tried,
                   size_t tried_cap);

#endif /* CUBE_BACKENDS_COMMON_LIBRARY_H */
