/* Finding a shared library to dlopen (library.h). */
#include "backends/common/library.h"

#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

#include "cubert/backend/config.h"

/* Appends "name: why" to `tried`. */
static void note_try(char *tried, size_t cap, const char *name, const char *why)
{
    size_t at = strlen(tried);
    if (at + 1 >= cap)
        return;
    snprintf(tried + at, cap - at, "%s%s: %s", at ? "; " : "", name,
             why ? why : "not found");
}

const char *library_once_run(library_once *l, void (*load)(void))
{
    pthread_once(&l->once, load);
    return l->failure[0] ? l->failure : NULL;
}

void *library_open(const char *key, const char *const *names, int flags,
                   char *path, size_t path_cap, char *tried, size_t tried_cap)
{
    cube_config_value forced;
    cube_config_lookup(key, &forced);
    if (forced.text && *forced.text) {
        void *h = dlopen(forced.text, flags);
        if (h) {
            snprintf(path, path_cap, "%s", forced.text);
            return h;
        }
        char where[256], why[512];
        snprintf(why, sizeof why, "%s (set by %s)", dlerror(),
                 cube_config_where(&forced, where, sizeof where));
        note_try(tried, tried_cap, forced.text, why);
        return NULL;
    }
    for (size_t i = 0; names[i]; i++) {
        void *h = dlopen(names[i], flags);
        if (h) {
            snprintf(path, path_cap, "%s", names[i]);
            return h;
        }
        note_try(tried, tried_cap, names[i], dlerror());
    }
    return NULL;
}

const char *library_resolve(void *lib, const library_symbol *syms, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        *syms[i].slot = dlsym(lib, syms[i].name);
        if (!*syms[i].slot && !syms[i].optional)
            return syms[i].name;
    }
    return NULL;
}

void *library_load(const char *key, const char *const *names, int flags,
                   const library_symbol *syms, size_t n, const char *kind,
                   const char *needed, char *path, size_t path_cap, char *tried,
                   size_t tried_cap)
{
    void *lib =
        library_open(key, names, flags, path, path_cap, tried, tried_cap);
    if (!lib)
        return NULL;
    const char *lacking = library_resolve(lib, syms, n);
    if (!lacking)
        return lib;
    snprintf(tried, tried_cap, "%s: has no %s %s (%s)", path, kind, lacking,
             needed);
    return NULL;
}
