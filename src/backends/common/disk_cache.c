/* The verified on-disk cache of compiled artifacts (see disk_cache.h).
 *
 * Record format (text, one field a line):
 *   <version tag>
 *   format 2 keyed-xxh3-128
 *   key <16 hex digits>
 *   material <32 hex digits: the XXH3-128 of the key material>
 *   size <artifact bytes, decimal>
 *   digest <32 hex digits>
 * The first four lines name the entry, the last two describe the artifact.
 * The digest is XXH3-128 keyed with the directory's secret (XXH3's
 * "withSecret" variant) over the five lines before it and then the
 * artifact's bytes, so a record cannot be made without the secret. Records
 * of the first format (no format line, an unkeyed hash) no longer match:
 * their entries are rebuilt, never trusted.
 * A lookup rebuilds the record it expects from the key and the bytes it read
 * and compares the two byte for byte, so no parser has to trust the file.
 *
 * The secret: DISK_CACHE_SECRET_SIZE random bytes in the file "secret" of
 * the cache directory, made on first use (0600, written under a temporary
 * name and linked into place, so a reader never sees half of one and two
 * processes settle on one). It is trusted only as a regular file of
 * exactly that size, owned by the user, with no permission for group or
 * others, reached without a symbolic link; any other is replaced by a new
 * one, with a warning, and the entries written with it are then rebuilt.
 * One that cannot be opened for want of memory or descriptors is left
 * alone: the cache is off for that open.
 *
 * A disk_cache holds only values fixed at open time and an fd it never
 * changes, so it needs no lock: every write goes to a fresh file created
 * with O_EXCL and reaches its final name by an atomic rename.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include "backends/common/disk_cache.h"
#include "backends/common/file_io.h"
#include "base/path.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

/* Lets the XXH3 states live on the stack: disk_cache_key_make cannot
 * report an allocation failure. The header and library come from the same
 * package. */
#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>

#include "cubert/backend/config.h"
#include "cubert/backend/errors.h"
#include "cubert/log.h"

/* Limits on the names given to disk_cache_open; they bound every name and
 * record buffer below. */
#define DISK_CACHE_MAX_EXT 32
#define DISK_CACHE_MAX_TAG 128
/* A record is ~150 bytes plus the tag; anything this large is not ours. */
#define DISK_CACHE_MAX_RECORD 4096
/* The tag and five fixed-width lines, with room to spare. */
#define DISK_CACHE_RECORD_BUF (DISK_CACHE_MAX_TAG + 256)
/* The second line of every record: the format of the lines after it. */
#define DISK_CACHE_FORMAT "format 2 keyed-xxh3-128"
/* The secret's file in the cache directory, and its size (XXH3's default
 * secret size; the least it accepts is XXH3_SECRET_SIZE_MIN). */
#define DISK_CACHE_SECRET_NAME "secret"
#define DISK_CACHE_SECRET_SIZE 192
_Static_assert(DISK_CACHE_SECRET_SIZE >= XXH3_SECRET_SIZE_MIN,
               "XXH3 needs a longer secret");
/* "<hex><ext>" or "<hex>.meta". */
#define DISK_CACHE_NAME_BUF (16 + DISK_CACHE_MAX_EXT + 8)
/* ".<name>.tmp-<hex>". */
#define DISK_CACHE_TEMP_BUF (DISK_CACHE_NAME_BUF + 32)

static const char DISK_CACHE_LOG[] = "compile";

struct disk_cache {
    char *path;        /* the directory, for messages; NULL when disabled */
    int fd;            /* that directory, opened and checked once; or -1 */
    char *ext;         /* the artifact's file extension */
    char *version_tag; /* first line of every record */
    /* The key of the records' digests, read or made at open time. */
    unsigned char secret[DISK_CACHE_SECRET_SIZE];
};

/* ---------------------------------------------------------------- helpers */

/* Reads all of `fd` (a regular file of `size` bytes per fstat) into a new
 * buffer with a NUL after the data. Returns 0 or an errno value. */
static int disk_cache_read_fd(int fd, size_t size, unsigned char **out,
                              size_t *out_len)
{
    unsigned char *data = malloc(size + 1);
    if (!data)
        return ENOMEM;
    size_t got = 0;
    while (got < size) {
        ssize_t n = read(fd, data + got, size - got);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            int e = errno;
            free(data);
            return e;
        }
        if (n == 0)
            break; /* shrank since fstat: the hash check will say so */
        got += (size_t)n;
    }
    data[got] = '\0';
    *out = data;
    *out_len = got;
    return 0;
}

/* Whether the errno value `e` says that the system ran short of memory or
 * descriptors for a moment, not that a file is missing or bad: what could
 * not be read is then left as it is (a good entry or secret is not thrown
 * away for it). */
static bool disk_cache_transient(int e)
{
    return e == ENOMEM || e == EMFILE || e == ENFILE || e == EAGAIN ||
           e == EINTR;
}

/* Opens `name` under `dirfd` for reading: no symbolic link, and without
 * blocking (a FIFO put in the cache would otherwise wait for a writer, in
 * every process that looks the entry up). Checks that it is a regular file,
 * then makes the descriptor blocking again. Returns the descriptor, or -1
 * with errno set: EINVAL for something that is not a regular file. */
static int disk_cache_open_regular_at(int dirfd, const char *name,
                                      struct stat *st)
{
    int fd =
        openat(dirfd, name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (fd < 0)
        return -1;
    int e = 0;
    int fl;
    if (fstat(fd, st) != 0)
        e = errno;
    else if (!S_ISREG(st->st_mode) || st->st_size < 0)
        e = EINVAL;
    else if ((fl = fcntl(fd, F_GETFL)) < 0 ||
             fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) != 0)
        e = errno;
    if (e != 0) {
        close(fd);
        errno = e;
        return -1;
    }
    return fd;
}

/* Opens `name` under `dirfd` (see disk_cache_open_regular_at), checks it
 * holds at most `max` bytes and reads it. Returns 0 or an errno value:
 * EINVAL for something that is not a regular file, EFBIG for a file larger
 * than `max`. */
static int disk_cache_read_at(int dirfd, const char *name, size_t max,
                              unsigned char **out, size_t *out_len)
{
    struct stat st;
    int fd = disk_cache_open_regular_at(dirfd, name, &st);
    if (fd < 0)
        return errno;
    int e = 0;
    if ((uint64_t)st.st_size > (uint64_t)max ||
        (uint64_t)st.st_size >= (uint64_t)SIZE_MAX)
        e = EFBIG; /* the second test keeps size + 1 from wrapping */
    else
        e = disk_cache_read_fd(fd, (size_t)st.st_size, out, out_len);
    close(fd);
    return e;
}

/* Why a file of an entry could not be read, for the warning. */
static const char *disk_cache_read_failure(int e, bool record, char *buf,
                                           size_t size)
{
    const char *what = record ? "record" : "artifact";
    if (e == EINVAL)
        snprintf(buf, size, "its %s is not a regular file", what);
    else if (e == ELOOP)
        snprintf(buf, size, "its %s is a symbolic link", what);
    else if (e == EFBIG)
        snprintf(buf, size, "its %s is larger than allowed", what);
    else {
        char eb[128];
        snprintf(buf, size, "cannot read its %s: %s", what,
                 file_strerror(e, eb, sizeof eb));
    }
    return buf;
}

/* --------------------------------------------------------------- the key */

void disk_cache_key_make(const void *const *parts, const size_t *lens, size_t n,
                         disk_cache_key *out)
{
    if (!out)
        return;
    XXH3_state_t narrow, wide;
    XXH3_INITSTATE(&narrow);
    XXH3_INITSTATE(&wide);
    XXH3_64bits_reset(&narrow);
    XXH3_128bits_reset(&wide);
    for (size_t i = 0; parts && lens && i < n; i++) {
        /* An 8-byte little-endian length before each part keeps
         * ("ab", "c") and ("a", "bc") apart, on any host. */
        unsigned char prefix[8];
        for (int b = 0; b < 8; b++)
            prefix[b] = (unsigned char)((uint64_t)lens[i] >> (8 * b));
        XXH3_64bits_update(&narrow, prefix, sizeof prefix);
        XXH3_128bits_update(&wide, prefix, sizeof prefix);
        if (lens[i] > 0 && parts[i]) {
            XXH3_64bits_update(&narrow, parts[i], lens[i]);
            XXH3_128bits_update(&wide, parts[i], lens[i]);
        }
    }
    XXH128_hash_t material = XXH3_128bits_digest(&wide);
    out->key = XXH3_64bits_digest(&narrow);
    out->material_high = material.high64;
    out->material_low = material.low64;
    snprintf(out->hex, sizeof out->hex, "%016" PRIx64, out->key);
}

/* ---------------------------------------------------------------- entries */

/* The record for the artifact `data` of `len` bytes (see the format at the
 * top); *header_len is the length of the four lines that name the entry. */
static void disk_cache_record(const disk_cache *cache,
                              const disk_cache_key *key, const void *data,
                              size_t len, char *buf, size_t size,
                              size_t *header_len)
{
    int h = snprintf(buf, size,
                     "%s\n" DISK_CACHE_FORMAT "\nkey %016" PRIx64
                     "\nmaterial %016" PRIx64 "%016" PRIx64 "\n",
                     cache->version_tag, key->key, key->material_high,
                     key->material_low);
    int b = snprintf(buf + h, size - (size_t)h, "size %zu\n", len);
    XXH3_state_t state;
    XXH3_INITSTATE(&state);
    XXH3_128bits_reset_withSecret(&state, cache->secret, sizeof cache->secret);
    XXH3_128bits_update(&state, buf, (size_t)h + (size_t)b);
    XXH3_128bits_update(&state, data, len);
    XXH128_hash_t digest = XXH3_128bits_digest(&state);
    snprintf(buf + h + b, size - (size_t)h - (size_t)b,
             "digest %016" PRIx64 "%016" PRIx64 "\n", digest.high64,
             digest.low64);
    *header_len = (size_t)h;
}

/* The two file names of an entry. The hex is rebuilt from key->key rather
 * than taken from key->hex, so a caller's stray bytes there cannot name a
 * file outside the entry. */
static void disk_cache_names(const disk_cache *cache, const disk_cache_key *key,
                             char *artifact, char *record, size_t size)
{
    snprintf(artifact, size, "%016" PRIx64 "%s", key->key, cache->ext);
    snprintf(record, size, "%016" PRIx64 ".meta", key->key);
}

static bool disk_cache_enabled(const disk_cache *cache)
{
    return cache && cache->fd >= 0;
}

void disk_cache_remove(const disk_cache *cache, const disk_cache_key *key)
{
    if (!disk_cache_enabled(cache) || !key)
        return;
    char artifact[DISK_CACHE_NAME_BUF], record[DISK_CACHE_NAME_BUF];
    disk_cache_names(cache, key, artifact, record, sizeof artifact);
    /* The record first: without it the artifact is ignored. An empty
     * directory in either place would block every later rename, so it goes
     * too; a full one is left alone, as removing it could lose data. */
    if (unlinkat(cache->fd, record, 0) != 0 && errno == EISDIR)
        unlinkat(cache->fd, record, AT_REMOVEDIR);
    if (unlinkat(cache->fd, artifact, 0) != 0 && errno == EISDIR)
        unlinkat(cache->fd, artifact, AT_REMOVEDIR);
}

disk_cache_result disk_cache_get(const disk_cache *cache,
                                 const disk_cache_key *key, size_t max_len,
                                 unsigned char **bytes, size_t *len)
{
    if (bytes)
        *bytes = NULL;
    if (len)
        *len = 0;
    if (!disk_cache_enabled(cache) || !key || !bytes || !len)
        return DISK_CACHE_MISS;

    char artifact[DISK_CACHE_NAME_BUF], record[DISK_CACHE_NAME_BUF];
    char why_buf[192];
    disk_cache_names(cache, key, artifact, record, sizeof artifact);

    unsigned char *meta = NULL;
    size_t meta_len = 0;
    int e = disk_cache_read_at(cache->fd, record, DISK_CACHE_MAX_RECORD, &meta,
                               &meta_len);
    if (e == ENOENT || disk_cache_transient(e)) {
        /* No record: never written, or a writer is between its two
         * renames. A rebuild rewrites both. (Or it cannot be read now:
         * it stays.) */
        return DISK_CACHE_MISS;
    }
    const char *why = NULL;
    unsigned char *data = NULL;
    size_t data_len = 0;
    if (e != 0) {
        why = disk_cache_read_failure(e, true, why_buf, sizeof why_buf);
    } else {
        e = disk_cache_read_at(cache->fd, artifact, max_len, &data, &data_len);
        if (e == ENOENT || disk_cache_transient(e)) {
            free(meta);
            return DISK_CACHE_MISS;
        }
        if (e != 0)
            why = disk_cache_read_failure(e, false, why_buf, sizeof why_buf);
    }
    if (!why) {
        char expect[DISK_CACHE_RECORD_BUF];
        size_t header_len;
        disk_cache_record(cache, key, data, data_len, expect, sizeof expect,
                          &header_len);
        size_t expect_len = strlen(expect);
        if (meta_len < header_len || memcmp(meta, expect, header_len) != 0) {
            why = "its record was written for another key or version";
        } else if (meta_len != expect_len ||
                   memcmp(meta, expect, expect_len) != 0) {
            /* The header matched: the artifact is not what was stored, or
             * the record was not made with this directory's secret. */
            char size_line[48];
            snprintf(size_line, sizeof size_line, "size %zu\n", data_len);
            why = strstr((const char *)meta + header_len, size_line)
                      ? "its artifact is corrupt, or its record was written "
                        "with another secret (digest mismatch)"
                      : "its artifact is truncated or resized";
        }
    }
    free(meta);
    if (why) {
        free(data);
        cube_log_write(CUBE_LOG_WARN, DISK_CACHE_LOG,
                       "disk cache entry %016" PRIx64
                       " in '%s' is bad (%s); removing it and rebuilding",
                       key->key, cache->path, why);
        disk_cache_remove(cache, key);
        return DISK_CACHE_BAD;
    }
    *bytes = data;
    *len = data_len;
    return DISK_CACHE_HIT;
}

/* Creates a new file with a unique name starting with `prefix` in the cache
 * directory. mkstemp has no *at form; O_CREAT|O_EXCL on a fresh name gives
 * the same guarantee and keeps every access relative to the directory
 * checked at open time (a later swap of the path for a symbolic link cannot
 * redirect us). Returns the fd, or -1 with errno set. */
static int disk_cache_create_temp_at(int dirfd, const char *prefix, char *name,
                                     size_t size)
{
    static atomic_uint_fast64_t counter;
    for (int attempt = 0; attempt < 100; attempt++) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        uint64_t seed[4] = {(uint64_t)ts.tv_sec, (uint64_t)ts.tv_nsec,
                            (uint64_t)getpid(),
                            (uint64_t)atomic_fetch_add(&counter, 1)};
        snprintf(name, size, "%s%016" PRIx64, prefix,
                 XXH3_64bits(seed, sizeof seed));
        int fd =
            openat(dirfd, name,
                   O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
        if (fd >= 0 || errno != EEXIST)
            return fd;
    }
    errno = EEXIST;
    return -1;
}

/* Writes `len` bytes to a new temporary file in the cache and fsyncs it.
 * Returns 0, or -1 with errno set (and nothing left behind). */
static int disk_cache_write_temp(const disk_cache *cache, const char *prefix,
                                 const void *data, size_t len, char *name,
                                 size_t size)
{
    int fd = disk_cache_create_temp_at(cache->fd, prefix, name, size);
    if (fd < 0)
        return -1;
    int rc = file_write_all(fd, data, len);
    if (rc == 0)
        rc = fsync(fd);
    int e = errno;
    if (close(fd) != 0 && rc == 0) {
        rc = -1;
        e = errno;
    }
    if (rc != 0) {
        unlinkat(cache->fd, name, 0);
        errno = e;
    }
    return rc;
}

/* Removes the temporary files `a` and `b` (NULL: none) from the cache,
 * keeping errno: what failed before is what gets reported. */
static void disk_cache_drop_temps(const disk_cache *cache, const char *a,
                                  const char *b)
{
    int e = errno;
    if (a)
        unlinkat(cache->fd, a, 0);
    if (b)
        unlinkat(cache->fd, b, 0);
    errno = e;
}

/* Order: both files are written and synced under temporary names; then the
 * artifact is renamed into place, then the record. A reader that finds a
 * record therefore finds a complete artifact (a new one, or an older one
 * that the hash check rejects); concurrent writers of one key each rename
 * complete files, so the last writer wins. */
void disk_cache_put(const disk_cache *cache, const disk_cache_key *key,
                    const void *bytes, size_t len)
{
    if (!disk_cache_enabled(cache) || !key || (!bytes && len > 0))
        return;
    char artifact[DISK_CACHE_NAME_BUF], record[DISK_CACHE_NAME_BUF];
    char artifact_tmp[DISK_CACHE_TEMP_BUF], record_tmp[DISK_CACHE_TEMP_BUF];
    char prefix[DISK_CACHE_TEMP_BUF], meta[DISK_CACHE_RECORD_BUF], eb[128];
    size_t header_len;
    disk_cache_names(cache, key, artifact, record, sizeof artifact);
    disk_cache_record(cache, key, bytes, len, meta, sizeof meta, &header_len);

    const char *step = "write the artifact";
    snprintf(prefix, sizeof prefix, ".%s.tmp-", artifact);
    if (disk_cache_write_temp(cache, prefix, bytes, len, artifact_tmp,
                              sizeof artifact_tmp) != 0)
        goto fail;
    step = "write the record";
    snprintf(prefix, sizeof prefix, ".%s.tmp-", record);
    if (disk_cache_write_temp(cache, prefix, meta, strlen(meta), record_tmp,
                              sizeof record_tmp) != 0) {
        disk_cache_drop_temps(cache, artifact_tmp, NULL);
        goto fail;
    }
    step = "rename the artifact";
    if (renameat(cache->fd, artifact_tmp, cache->fd, artifact) != 0) {
        disk_cache_drop_temps(cache, artifact_tmp, record_tmp);
        goto fail;
    }
    step = "rename the record";
    if (renameat(cache->fd, record_tmp, cache->fd, record) != 0) {
        disk_cache_drop_temps(cache, record_tmp, NULL);
        goto fail;
    }
    /* Make the renames durable; a crash before this only loses the entry
     * (a record without its artifact, or neither), never pairs wrong ones. */
    fsync(cache->fd);
    return;
fail:
    cube_log_write(CUBE_LOG_WARN, DISK_CACHE_LOG,
                   "cannot %s of disk cache entry %016" PRIx64 " in '%s': %s",
                   step, key->key, cache->path,
                   file_strerror(errno, eb, sizeof eb));
}

/* ------------------------------------------------------------ the secret */

/* Fills `buf` from the system's random source. Returns 0 or an errno
 * value. */
static int disk_cache_random(unsigned char *buf, size_t len)
{
    size_t got = 0;
    while (got < len) {
        ssize_t n = getrandom(buf + got, len - got, 0);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return n < 0 ? errno : EIO;
        got += (size_t)n;
    }
    return 0;
}

/* Reads the secret of the directory `dirfd` into `secret`, if it can be
 * trusted (see the top of this file). Returns 0; ENOENT when there is none;
 * or another errno value with *why saying why it is not trusted. */
static int disk_cache_read_secret(int dirfd, unsigned char *secret,
                                  const char **why)
{
    int fd = openat(dirfd, DISK_CACHE_SECRET_NAME,
                    O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (fd < 0) {
        int e = errno;
        *why = e == ELOOP ? "it is a symbolic link" : "it cannot be opened";
        return e;
    }
    struct stat st;
    *why = NULL;
    if (fstat(fd, &st) != 0)
        *why = "it cannot be examined";
    else if (!S_ISREG(st.st_mode))
        *why = "it is not a regular file";
    else if (st.st_uid != geteuid())
        *why = "it is owned by another user";
    else if (st.st_mode & (S_IRWXG | S_IRWXO))
        *why = "its permissions let group or others at it";
    else if (st.st_size != DISK_CACHE_SECRET_SIZE)
        *why = "it has the wrong size";
    size_t got = 0;
    while (!*why && got < DISK_CACHE_SECRET_SIZE) {
        ssize_t n =
            pread(fd, secret + got, DISK_CACHE_SECRET_SIZE - got, (off_t)got);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            *why = n < 0 ? "it cannot be read" : "it has the wrong size";
        else
            got += (size_t)n;
    }
    close(fd);
    return *why ? EINVAL : 0;
}

/* Makes a new secret in `secret` and links it into place as the directory's
 * secret. Returns 0; EEXIST when another process put one there first (read
 * that one instead); or another errno value. */
static int disk_cache_make_secret(int dirfd, unsigned char *secret)
{
    int e = disk_cache_random(secret, DISK_CACHE_SECRET_SIZE);
    if (e != 0)
        return e;
    char tmp[64];
    int fd = disk_cache_create_temp_at(
        dirfd, "." DISK_CACHE_SECRET_NAME ".tmp-", tmp, sizeof tmp);
    if (fd < 0)
        return errno;
    /* Exactly 0600 whatever the umask: the reader insists on it. */
    int rc = fchmod(fd, 0600);
    if (rc == 0)
        rc = file_write_all(fd, secret, DISK_CACHE_SECRET_SIZE);
    if (rc == 0)
        rc = fsync(fd);
    e = rc != 0 ? errno : 0;
    if (close(fd) != 0 && e == 0)
        e = errno;
    if (e == 0) {
        /* A link, unlike a rename, never replaces a secret another process
         * made meanwhile: both then use the first one. Where the file
         * system has no hard links, a rename will do (the last one wins;
         * entries made with the other are rebuilt). */
        if (linkat(dirfd, tmp, dirfd, DISK_CACHE_SECRET_NAME, 0) != 0) {
            e = errno;
            if (e != EEXIST &&
                renameat(dirfd, tmp, dirfd, DISK_CACHE_SECRET_NAME) == 0)
                e = 0;
        }
    }
    unlinkat(dirfd, tmp, 0);
    if (e == 0)
        fsync(dirfd);
    return e;
}

/* Reads the cache directory's secret, or replaces one that cannot be
 * trusted, or makes the first. Returns 0, or -1 after a warning (the cache
 * is then disabled: without the secret no record can be checked). */
static int disk_cache_load_secret(disk_cache *cache)
{
    char eb[128];
    for (int attempt = 0; attempt < 3; attempt++) {
        const char *why = NULL;
        int e = disk_cache_read_secret(cache->fd, cache->secret, &why);
        if (e == 0)
            return 0;
        if (disk_cache_transient(e)) {
            /* The secret may be fine: replacing it would cost every entry
             * made with it, in every process. */
            cube_log_write(CUBE_LOG_WARN, DISK_CACHE_LOG,
                           "disk cache disabled: cannot open the secret of "
                           "'%s': %s",
                           cache->path, file_strerror(e, eb, sizeof eb));
            return -1;
        }
        if (e != ENOENT) {
            cube_log_write(CUBE_LOG_WARN, DISK_CACHE_LOG,
                           "disk cache '%s': its secret is not trusted (%s); "
                           "making a new one (entries written with the old "
                           "one will be rebuilt)",
                           cache->path, why);
            if (unlinkat(cache->fd, DISK_CACHE_SECRET_NAME, 0) != 0 &&
                errno == EISDIR)
                unlinkat(cache->fd, DISK_CACHE_SECRET_NAME, AT_REMOVEDIR);
        }
        e = disk_cache_make_secret(cache->fd, cache->secret);
        if (e == 0) {
            cube_log_write(CUBE_LOG_DEBUG, DISK_CACHE_LOG,
                           "disk cache '%s': made a new secret", cache->path);
            return 0;
        }
        if (e != EEXIST) {
            cube_log_write(CUBE_LOG_WARN, DISK_CACHE_LOG,
                           "disk cache disabled: cannot make a secret in "
                           "'%s': %s",
                           cache->path, file_strerror(e, eb, sizeof eb));
            return -1;
        }
        /* Another process made one just now: read it. */
    }
    cube_log_write(CUBE_LOG_WARN, DISK_CACHE_LOG,
                   "disk cache disabled: cannot settle on a secret in '%s'",
                   cache->path);
    return -1;
}

/* -------------------------------------------------------------- opening */

/* XDG_CACHE_HOME and HOME are the system's, not cubert keys. */
static const char *disk_cache_env(const char *name)
{
    const char *v = getenv(name);
    return v && *v ? v : NULL;
}

/* The default directory for `backend`, or NULL with *oom false when there
 * is none (no usable environment variable). */
static char *disk_cache_default_dir(const char *backend, bool *oom)
{
    const char *base;
    const char *middle;
    *oom = false;
    /* An empty cache_dir (the cache off) reaches disk_cache_open as dir ""
     * from the client; here it counts as unset. */
    if ((base = cube_config_text("cache_dir")) != NULL && *base) {
        middle = "";
    } else if ((base = disk_cache_env("XDG_CACHE_HOME")) != NULL &&
               base[0] == '/') {
        middle = "cubert/"; /* XDG says relative values are ignored */
    } else if ((base = disk_cache_env("HOME")) != NULL) {
        middle = ".cache/cubert/";
    } else {
        return NULL;
    }
    size_t n = strlen(middle) + strlen(backend) + 1;
    char *tail = malloc(n);
    if (!tail) {
        *oom = true;
        return NULL;
    }
    snprintf(tail, n, "%s%s", middle, backend);
    char *path = cube_path_join(base, tail);
    free(tail);
    if (!path)
        *oom = true;
    return path;
}

/* mkdir -p with 0700 for every directory it creates. Returns 0 or errno. */
static int disk_cache_mkdirs(char *path)
{
    for (char *p = path + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = '\0';
        int rc = mkdir(path, 0700);
        int e = errno;
        *p = '/';
        if (rc != 0 && e != EEXIST)
            return e;
    }
    if (mkdir(path, 0700) != 0 && errno != EEXIST)
        return errno;
    return 0;
}

/* Why the opened directory `fd` is not private to the user, or NULL: it
 * must belong to the user and be writable by nobody else. */
static const char *disk_cache_dir_problem(int fd)
{
    struct stat st;
    if (fstat(fd, &st) != 0)
        return "cannot stat it";
    if (!S_ISDIR(st.st_mode))
        return "it is not a directory";
    if (st.st_uid != geteuid())
        return "it is owned by another user";
    if (st.st_mode & (S_IWGRP | S_IWOTH))
        return "it is writable by group or others (chmod 700 fixes that)";
    return NULL;
}

/* Opens the directory `path` (created, with its missing parents, 0700),
 * refusing one that another user could tamper with. `what` names it in the
 * warnings ("" or " (the cache root)"). Returns the directory fd, or -1
 * after a warning. */
static int disk_cache_open_checked(char *path, const char *what)
{
    char eb[128];
    int e = disk_cache_mkdirs(path);
    if (e != 0) {
        cube_log_write(CUBE_LOG_WARN, DISK_CACHE_LOG,
                       "disk cache disabled: cannot create '%s'%s: %s", path,
                       what, file_strerror(e, eb, sizeof eb));
        return -1;
    }
    struct stat st;
    if (lstat(path, &st) == 0 && S_ISLNK(st.st_mode)) {
        cube_log_write(CUBE_LOG_WARN, DISK_CACHE_LOG,
                       "disk cache disabled: '%s'%s is a symbolic link", path,
                       what);
        return -1;
    }
    /* O_NOFOLLOW also closes the window between lstat and open. */
    int fd = open(path,
                  O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) {
        e = errno;
        if (e == ELOOP)
            cube_log_write(CUBE_LOG_WARN, DISK_CACHE_LOG,
                           "disk cache disabled: '%s'%s is a symbolic link",
                           path, what);
        else
            cube_log_write(CUBE_LOG_WARN, DISK_CACHE_LOG,
                           "disk cache disabled: cannot open '%s'%s: %s", path,
                           what, file_strerror(e, eb, sizeof eb));
        return -1;
    }
    const char *why = disk_cache_dir_problem(fd);
    if (why) {
        cube_log_write(CUBE_LOG_WARN, DISK_CACHE_LOG,
                       "disk cache disabled: refusing '%s'%s: %s", path, what,
                       why);
        close(fd);
        return -1;
    }
    return fd;
}

/* Opens the folder `name` in the checked directory `root_fd` (created 0700
 * when missing), never following a symbolic link, with the same checks.
 * `path` is the folder's whole path, for the warnings. Returns the fd, or
 * -1 after a warning. */
static int disk_cache_open_child(int root_fd, const char *name,
                                 const char *path)
{
    char eb[128];
    if (mkdirat(root_fd, name, 0700) != 0 && errno != EEXIST) {
        int e = errno;
        cube_log_write(CUBE_LOG_WARN, DISK_CACHE_LOG,
                       "disk cache disabled: cannot create '%s': %s", path,
                       file_strerror(e, eb, sizeof eb));
        return -1;
    }
    int fd =
        openat(root_fd, name,
               O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) {
        int e = errno;
        if (e == ELOOP)
            cube_log_write(CUBE_LOG_WARN, DISK_CACHE_LOG,
                           "disk cache disabled: '%s' is a symbolic link",
                           path);
        else
            cube_log_write(CUBE_LOG_WARN, DISK_CACHE_LOG,
                           "disk cache disabled: cannot open '%s': %s", path,
                           file_strerror(e, eb, sizeof eb));
        return -1;
    }
    const char *why = disk_cache_dir_problem(fd);
    if (why) {
        cube_log_write(CUBE_LOG_WARN, DISK_CACHE_LOG,
                       "disk cache disabled: refusing '%s': %s", path, why);
        close(fd);
        return -1;
    }
    return fd;
}

static void disk_cache_strip_slashes(char *path)
{
    /* A trailing slash would make O_NOFOLLOW follow a final symlink. */
    size_t n = strlen(path);
    while (n > 1 && path[n - 1] == '/')
        path[--n] = '\0';
}

/* Opens the cache directory `path` for `backend`. The backends name it
 * <root>/<backend>, where <root> is the directory the configuration names
 * (cache_dir) or the default root: when `path` ends in /<backend>, the
 * root is checked too, and the folder is then opened relative to it, so
 * neither can be swapped for a link to elsewhere once checked. Any other
 * path is checked by itself. Returns the directory fd, or -1 after a
 * warning. */
static int disk_cache_open_dir(char *path, const char *backend)
{
    disk_cache_strip_slashes(path);
    char *slash = strrchr(path, '/');
    if (!slash || slash == path || strcmp(slash + 1, backend) != 0)
        return disk_cache_open_checked(path, "");
    *slash = '\0';
    char *root = strdup(path);
    *slash = '/';
    if (!root) {
        cube_log_write(CUBE_LOG_WARN, DISK_CACHE_LOG,
                       "disk cache disabled: out of memory");
        return -1;
    }
    disk_cache_strip_slashes(root);
    int fd = -1;
    int root_fd = disk_cache_open_checked(root, " (the cache root)");
    if (root_fd >= 0) {
        fd = disk_cache_open_child(root_fd, backend, path);
        close(root_fd);
    }
    free(root);
    return fd;
}

/* Why the names given to disk_cache_open are unusable, or NULL. They become
 * parts of file names and records, so they are checked, not trusted. */
static const char *disk_cache_check_names(const char *backend, const char *ext,
                                          const char *version_tag)
{
    if (!backend)
        return "backend is NULL";
    if (!ext)
        return "ext is NULL";
    if (!version_tag)
        return "version_tag is NULL";
    if (!*backend || strchr(backend, '/') || strcmp(backend, ".") == 0 ||
        strcmp(backend, "..") == 0)
        return "backend must be a single, plain directory name";
    if (strlen(ext) > DISK_CACHE_MAX_EXT || strchr(ext, '/') ||
        strcmp(ext, ".meta") == 0)
        return "ext must be at most 32 bytes, without '/', and not \".meta\"";
    if (!*version_tag || strlen(version_tag) > DISK_CACHE_MAX_TAG ||
        strchr(version_tag, '\n'))
        return "version_tag must be 1 to 128 bytes without a newline";
    return NULL;
}

cube_error *disk_cache_open(const char *dir, const char *backend,
                            const char *ext, const char *version_tag,
                            disk_cache **out)
{
    if (!out)
        return cube_error_new(CUBE_ERR_INVALID_ARGUMENT,
                              "disk_cache_open: out is NULL");
    *out = NULL;
    const char *bad = disk_cache_check_names(backend, ext, version_tag);
    if (bad)
        return cube_error_new(CUBE_ERR_INVALID_ARGUMENT, "disk_cache_open: %s",
                              bad);
    disk_cache *cache = calloc(1, sizeof *cache);
    if (!cache)
        goto oom;
    cache->fd = -1;
    cache->ext = strdup(ext);
    cache->version_tag = strdup(version_tag);
    if (!cache->ext || !cache->version_tag)
        goto oom;

    if (dir) {
        if (*dir && !(cache->path = strdup(dir)))
            goto oom;
    } else {
        bool oom = false;
        cache->path = disk_cache_default_dir(backend, &oom);
        if (oom)
            goto oom;
        if (!cache->path)
            cube_log_write(CUBE_LOG_INFO, DISK_CACHE_LOG,
                           "disk cache disabled: no CUBERT_CACHE_DIR, "
                           "XDG_CACHE_HOME or HOME");
    }
    if (cache->path) {
        cache->fd = disk_cache_open_dir(cache->path, backend);
        if (cache->fd >= 0 && disk_cache_load_secret(cache) != 0) {
            close(cache->fd);
            cache->fd = -1;
        }
        if (cache->fd < 0) {
            free(cache->path);
            cache->path = NULL;
        }
    }
    cube_log_write(CUBE_LOG_DEBUG, DISK_CACHE_LOG, "disk cache for %s: %s",
                   backend, cache->path ? cache->path : "off");
    *out = cache;
    return NULL;
oom:
    disk_cache_close(cache);
    return cube_error_new(CUBE_ERR_OUT_OF_MEMORY,
                          "disk_cache_open: out of memory");
}

void disk_cache_close(disk_cache *cache)
{
    if (!cache)
        return;
    if (cache->fd >= 0)
        close(cache->fd);
    free(cache->path);
    free(cache->ext);
    free(cache->version_tag);
    free(cache);
}

const char *disk_cache_path(const disk_cache *cache)
{
    return cache ? cache->path : NULL;
}
