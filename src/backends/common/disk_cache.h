/* A verified on-disk cache of compiled artifacts, shared by the backends
 * (the CPU backend stores shared objects, the CUDA backend CUBIN or PTX).
 *
 * One directory per backend, private to the user (0700, owned by them;
 * default <cache_dir>/<backend> (the configuration key: $CUBERT_CACHE_DIR,
 * else the file's), else $XDG_CACHE_HOME/cubert/<backend> when that is
 * absolute, else $HOME/.cache/cubert/<backend>; with none of them the cache
 * is off). The directory is checked once, when the cache is opened: it must
 * not be a symbolic link, must be owned by the user (the effective uid) and
 * must not be writable by group or others. When its path ends in
 * /<backend> (how the backends and the default name it), its parent is the
 * cache root the configuration named and gets the same checks, and the
 * folder is opened relative to the checked root. Every later access is
 * relative to the folder and follows no symbolic link, so swapping a path
 * afterwards cannot redirect the cache. An entry is
 * two files: <key><ext> holds the artifact's bytes exactly, <key>.meta a text
 * record of a version tag, the 64-bit key, a 128-bit hash of the whole key
 * material, the artifact's size and a digest of the record and the artifact
 * keyed with the directory's secret (the file "secret": random bytes made
 * 0600 on first use; one that is not a private regular file of the user is
 * replaced, with a warning, and the entries made with it are rebuilt). A
 * record therefore cannot be made by whoever can write the entry but not
 * read the secret; it does not say the artifact is what the caller means by
 * the key (a backend that can check that, checks it). Entries are written under
 * temporary names, synced and renamed into place (the artifact before its
 * record), so a reader never sees a half-written entry; a lookup checks the
 * record against the key material and the bytes against the record, and removes
 * an entry that fails (it is rebuilt, never trusted). An entry's files are
 * opened with O_NONBLOCK and must be regular files: a FIFO (or a device, a
 * socket) in their place is a bad entry, never waited on. Messages go to the
 * logger under the "compile" category.
 *
 * Ownership: disk_cache_open returns a cache the caller frees with
 * disk_cache_close. Bytes returned by disk_cache_get belong to the caller
 * (free()). Keys are plain values; nothing keeps a pointer to an argument
 * after a call returns.
 *
 * A directory whose secret can be neither read nor made is not used (the
 * cache is opened disabled, with a warning).
 *
 * Thread safety: a disk_cache never changes after it is opened; any number
 * of threads (and processes) may get and put at once. Concurrent writers of
 * one key each rename complete files: the last one wins.
 */
#ifndef CUBE_DISK_CACHE_H
#define CUBE_DISK_CACHE_H

#include <stddef.h>
#include <stdint.h>

#include "cubert/error.h"

typedef struct disk_cache disk_cache;

/* The name of an entry: a 64-bit key (its file name, in hex) and a 128-bit
 * hash of the same material (checked against the record, so two materials
 * that collide on 64 bits never share an entry). */
typedef struct disk_cache_key {
    uint64_t key;
    uint64_t material_high, material_low;
    char hex[17];
} disk_cache_key;

/* Hashes `n` parts (each its bytes and length; a part's length is hashed
 * too, so ("ab", "c") and ("a", "bc") differ) into a key. parts[i] may be
 * NULL only when lens[i] is 0. The result depends on the parts alone, so it
 * is stable across processes and runs. Cannot fail (no allocation); a NULL
 * `out` is a no-op. */
void disk_cache_key_make(const void *const *parts, const size_t *lens, size_t n,
                         disk_cache_key *out);

/* Opens the cache for `backend` ("cpu", "cuda"). `dir`: NULL for the
 * default above, "" to disable the cache (every get misses, puts are
 * dropped), else the directory to use as is (when it ends in /<backend>,
 * its parent is checked as the cache root). `ext` is the artifact's file
 * extension (".so", ".cubin"); `version_tag` goes into every record (bump
 * it when the material or the artifact's format changes).
 * An unusable directory or root (cannot be created, a symbolic link, not
 * owned by the user, writable by others) is not an error: the cache is
 * opened disabled, with a warning
 * through the logger. Errors: CUBE_ERR_INVALID_ARGUMENT (backend, ext or
 * version_tag NULL, out NULL; backend empty, ".", ".." or containing '/';
 * ext longer than 32 bytes, containing '/' or equal to ".meta"; version_tag
 * empty, longer than 128 bytes or containing a newline),
 * CUBE_ERR_OUT_OF_MEMORY. On error *out is NULL. */
cube_error *disk_cache_open(const char *dir, const char *backend,
                            const char *ext, const char *version_tag,
                            disk_cache **out);
/* NULL is a no-op. */
void disk_cache_close(disk_cache *cache);

/* The directory in use, or NULL when the cache is disabled. */
const char *disk_cache_path(const disk_cache *cache);

typedef enum disk_cache_result {
    DISK_CACHE_MISS = 0, /* no usable entry; nothing was removed */
    DISK_CACHE_HIT = 1,  /* *bytes, *len hold the verified artifact */
    DISK_CACHE_BAD = 2   /* an entry failed verification and was removed
                            (logged as a warning) */
} disk_cache_result;

/* Looks up and verifies the entry for `key`. Artifacts larger than
 * `max_len` are treated as bad. On a hit *bytes (followed by a NUL byte not
 * counted in *len, so text such as PTX can be used as a string) is the
 * caller's; otherwise *bytes is NULL and *len 0. A disabled cache, a NULL
 * argument or running out of memory reading the entry is a miss. */
disk_cache_result disk_cache_get(const disk_cache *cache,
                                 const disk_cache_key *key, size_t max_len,
                                 unsigned char **bytes, size_t *len);

/* Stores an artifact. Failures only cost a rebuild later: they are logged
 * as warnings, never returned. A disabled cache, a NULL cache or key, or
 * NULL bytes with a non-zero len make it a no-op. */
void disk_cache_put(const disk_cache *cache, const disk_cache_key *key,
                    const void *bytes, size_t len);

/* Removes the entry for `key` (the record first, so a reader never trusts
 * what is left), for an artifact that verified but proved unusable (for
 * example a shared object that no longer loads). A missing entry, a
 * disabled cache or a NULL argument make it a no-op. */
void disk_cache_remove(const disk_cache *cache, const disk_cache_key *key);

#endif /* CUBE_DISK_CACHE_H */
