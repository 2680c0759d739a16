/* Unit tests for the backends' verified on-disk cache. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <dirent.h>
#include <fcntl.h>
#include <ftw.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <xxhash.h>

#include "backends/common/disk_cache.h"
#include "cubert/log.h"
#include "test_files.h"

#define TAG "cubert-test-cache-1"

/* Besides its entries, a cache directory in use holds its secret (the key
 * of the records' digests). */
#define SECRET_FILES 1
#define SECRET_NAME "secret"
/* ------------------------------------------------------------- log capture */

static pthread_mutex_t capture_lock = PTHREAD_MUTEX_INITIALIZER;
static int capture_warns;
static char capture_last_warn[1024];

static void capture_sink(void *user, cube_log_level level, const char *category,
                         const char *message)
{
    (void)user;
    pthread_mutex_lock(&capture_lock);
    if (level == CUBE_LOG_WARN) {
        capture_warns++;
        snprintf(capture_last_warn, sizeof capture_last_warn, "[%s] %s",
                 category, message);
    }
    pthread_mutex_unlock(&capture_lock);
}

static int capture_warn_count(void)
{
    pthread_mutex_lock(&capture_lock);
    int n = capture_warns;
    pthread_mutex_unlock(&capture_lock);
    return n;
}

/* Asserts exactly one warning came since the last reset and that it says
 * `text`, then resets. */
static void expect_one_warning(const char *text)
{
    pthread_mutex_lock(&capture_lock);
    int n = capture_warns;
    char last[sizeof capture_last_warn];
    memcpy(last, capture_last_warn, sizeof last);
    capture_warns = 0;
    capture_last_warn[0] = '\0';
    pthread_mutex_unlock(&capture_lock);
    assert_int_equal(n, 1);
    if (!strstr(last, text))
        fail_msg("warning '%s' does not say '%s'", last, text);
}

static int setup(void **state)
{
    (void)state;
    pthread_mutex_lock(&capture_lock);
    capture_warns = 0;
    capture_last_warn[0] = '\0';
    pthread_mutex_unlock(&capture_lock);
    return 0;
}

/* ------------------------------------------------------------------ helpers */

static char *make_tmpdir(void)
{
    return make_tmpdir_named("/tmp/cubert-test-cache-XXXXXX");
}

static void entry_path(char *buf, size_t size, const char *dir,
                       const disk_cache_key *key, const char *ext)
{
    snprintf(buf, size, "%s/%016" PRIx64 "%s", dir, key->key, ext);
}

static int file_exists(const char *path)
{
    struct stat st;
    return lstat(path, &st) == 0;
}

static char *read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    char *buf = malloc(1 << 16);
    assert_non_null(buf);
    *len = fread(buf, 1, 1 << 16, f);
    fclose(f);
    return buf;
}

static void write_file(const char *path, const void *data, size_t len)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(data, 1, len, f), len);
    assert_int_equal(fclose(f), 0);
}

static disk_cache *open_cache(const char *dir, const char *tag)
{
    disk_cache *cache = NULL;
    assert_null(disk_cache_open(dir, "test", ".bin", tag, &cache));
    assert_non_null(cache);
    return cache;
}

static void key_of(const char *text, disk_cache_key *key)
{
    const void *parts[] = {TAG, text};
    size_t lens[] = {strlen(TAG), strlen(text)};
    disk_cache_key_make(parts, lens, 2, key);
}

/* Deterministic contents for (key id, writer id, length), self-describing
 * so a reader can tell exactly which bytes it should have seen. */
static unsigned char *make_bytes(unsigned key_id, unsigned writer, size_t len)
{
    unsigned char *b = malloc(len);
    assert_non_null(b);
    uint32_t x = 2166136261u ^ (key_id * 16777619u) ^ (writer * 2654435761u);
    for (size_t i = 0; i < len; i++) {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        b[i] = (unsigned char)x;
    }
    if (len >= 12) {
        memcpy(b, &key_id, 4);
        memcpy(b + 4, &writer, 4);
        uint32_t l = (uint32_t)len;
        memcpy(b + 8, &l, 4);
    }
    return b;
}

static void expect_hit(const disk_cache *cache, const disk_cache_key *key,
                       const void *want, size_t want_len)
{
    unsigned char *bytes = NULL;
    size_t len = 0;
    assert_int_equal(disk_cache_get(cache, key, 1 << 20, &bytes, &len),
                     DISK_CACHE_HIT);
    assert_non_null(bytes);
    assert_int_equal(len, want_len);
    assert_memory_equal(bytes, want, want_len);
    assert_int_equal(bytes[len], 0); /* the promised NUL after the data */
    free(bytes);
}

static disk_cache_result get_result(const disk_cache *cache,
                                    const disk_cache_key *key, size_t max)
{
    unsigned char *bytes = (unsigned char *)1;
    size_t len = 1;
    disk_cache_result r = disk_cache_get(cache, key, max, &bytes, &len);
    if (r != DISK_CACHE_HIT) {
        assert_null(bytes);
        assert_int_equal(len, 0);
    }
    free(r == DISK_CACHE_HIT ? bytes : NULL);
    return r;
}

/* -------------------------------------------------------------------- keys */

static void test_keys(void **state)
{
    (void)state;
    disk_cache_key a, b, c;
    const void *split1[] = {"ab", "c"};
    size_t lens1[] = {2, 1};
    const void *split2[] = {"a", "bc"};
    size_t lens2[] = {1, 2};
    const void *joined[] = {"abc"};
    size_t lens3[] = {3};
    disk_cache_key_make(split1, lens1, 2, &a);
    disk_cache_key_make(split2, lens2, 2, &b);
    disk_cache_key_make(joined, lens3, 1, &c);
    assert_true(a.key != b.key && a.key != c.key && b.key != c.key);
    assert_true(a.material_high != b.material_high ||
                a.material_low != b.material_low);

    /* The same parts always give the same key, and the hex names it. */
    disk_cache_key again;
    disk_cache_key_make(split1, lens1, 2, &again);
    assert_true(again.key == a.key && again.material_high == a.material_high &&
                again.material_low == a.material_low);
    char hex[17];
    snprintf(hex, sizeof hex, "%016" PRIx64, a.key);
    assert_string_equal(a.hex, hex);

    /* An empty part still counts (its length is hashed), and a NULL part
     * of length 0 is an empty part. */
    const void *with_empty[] = {"ab", "", "c"};
    size_t lens4[] = {2, 0, 1};
    const void *with_null[] = {"ab", NULL, "c"};
    disk_cache_key d, e;
    disk_cache_key_make(with_empty, lens4, 3, &d);
    disk_cache_key_make(with_null, lens4, 3, &e);
    assert_true(d.key != a.key);
    assert_true(d.key == e.key && d.material_high == e.material_high &&
                d.material_low == e.material_low);

    disk_cache_key_make(NULL, NULL, 0, NULL); /* a no-op, no crash */
}

/* ------------------------------------------------------------ basic usage */

static void test_miss_put_hit(void **state)
{
    (void)state;
    char *dir = make_tmpdir();
    disk_cache *cache = open_cache(dir, TAG);
    assert_string_equal(disk_cache_path(cache), dir);

    disk_cache_key key;
    key_of("miss-put-hit", &key);
    assert_int_equal(get_result(cache, &key, 1 << 20), DISK_CACHE_MISS);

    unsigned char *bytes = make_bytes(1, 0, 5000);
    disk_cache_put(cache, &key, bytes, 5000);
    expect_hit(cache, &key, bytes, 5000);
    /* Exactly the two files of the entry: no temporary file is left. */
    assert_int_equal(count_entries(dir), 2 + SECRET_FILES);
    char path[512];
    entry_path(path, sizeof path, dir, &key, ".bin");
    assert_true(file_exists(path));
    entry_path(path, sizeof path, dir, &key, ".meta");
    assert_true(file_exists(path));

    /* Another cache on the same directory (another process) sees it. */
    disk_cache *other = open_cache(dir, TAG);
    expect_hit(other, &key, bytes, 5000);
    disk_cache_close(other);

    /* A put of new bytes replaces the entry. */
    unsigned char *newer = make_bytes(1, 1, 300);
    disk_cache_put(cache, &key, newer, 300);
    expect_hit(cache, &key, newer, 300);
    assert_int_equal(count_entries(dir), 2 + SECRET_FILES);

    /* An empty artifact is an artifact. */
    disk_cache_key empty_key;
    key_of("empty", &empty_key);
    disk_cache_put(cache, &empty_key, NULL, 0);
    expect_hit(cache, &empty_key, "", 0);

    /* Remove drops the entry; a get then misses without a warning. */
    disk_cache_remove(cache, &key);
    assert_int_equal(get_result(cache, &key, 1 << 20), DISK_CACHE_MISS);
    assert_int_equal(count_entries(dir), 2 + SECRET_FILES);
    disk_cache_remove(cache, &key); /* already gone: a no-op */
    assert_int_equal(capture_warn_count(), 0);

    /* NULL arguments are misses and no-ops, not crashes. */
    assert_int_equal(get_result(NULL, &key, 100), DISK_CACHE_MISS);
    assert_int_equal(get_result(cache, NULL, 100), DISK_CACHE_MISS);
    assert_int_equal(disk_cache_get(cache, &empty_key, 100, NULL, NULL),
                     DISK_CACHE_MISS);
    disk_cache_put(NULL, &key, bytes, 10);
    disk_cache_put(cache, NULL, bytes, 10);
    disk_cache_put(cache, &key, NULL, 10);
    assert_int_equal(get_result(cache, &key, 1 << 20), DISK_CACHE_MISS);
    disk_cache_remove(NULL, &key);
    disk_cache_remove(cache, NULL);
    assert_null(disk_cache_path(NULL));
    disk_cache_close(NULL);

    free(bytes);
    free(newer);
    disk_cache_close(cache);
    rm_tree(dir);
}

/* -------------------------------------------------------- bad entries */

/* Puts `bytes` under `key`, lets `damage` run on the entry's files, then
 * expects one BAD with a warning saying `says`, both files gone, and a
 * working put+get afterwards. */
typedef void (*damage_fn)(const char *dir, const disk_cache_key *key);

static void bad_entry_case(damage_fn damage, const char *says)
{
    char *dir = make_tmpdir();
    disk_cache *cache = open_cache(dir, TAG);
    disk_cache_key key;
    key_of(says, &key);
    unsigned char *bytes = make_bytes(7, 0, 4096);
    disk_cache_put(cache, &key, bytes, 4096);
    expect_hit(cache, &key, bytes, 4096);

    damage(dir, &key);
    assert_int_equal(get_result(cache, &key, 1 << 20), DISK_CACHE_BAD);
    expect_one_warning(says);
    char path[512];
    entry_path(path, sizeof path, dir, &key, ".bin");
    assert_false(file_exists(path));
    entry_path(path, sizeof path, dir, &key, ".meta");
    assert_false(file_exists(path));
    assert_int_equal(get_result(cache, &key, 1 << 20), DISK_CACHE_MISS);

    disk_cache_put(cache, &key, bytes, 4096);
    expect_hit(cache, &key, bytes, 4096);
    assert_int_equal(capture_warn_count(), 0);
    free(bytes);
    disk_cache_close(cache);
    rm_tree(dir);
}

static void flip_a_byte(const char *dir, const disk_cache_key *key)
{
    char path[512];
    entry_path(path, sizeof path, dir, key, ".bin");
    size_t len;
    char *data = read_file(path, &len);
    data[len / 2] ^= 0x40;
    write_file(path, data, len);
    free(data);
}

static void cut_short(const char *dir, const disk_cache_key *key)
{
    char path[512];
    entry_path(path, sizeof path, dir, key, ".bin");
    assert_int_equal(truncate(path, 1000), 0);
}

/* The record of another entry, with its own matching artifact: both are
 * intact, but they name another key. */
static void swap_in_other_entry(const char *dir, const disk_cache_key *key)
{
    disk_cache *cache = open_cache(dir, TAG);
    disk_cache_key other;
    key_of("some other entry", &other);
    unsigned char *bytes = make_bytes(8, 0, 4096);
    disk_cache_put(cache, &other, bytes, 4096);
    free(bytes);
    disk_cache_close(cache);
    char from[512], to[512];
    entry_path(from, sizeof from, dir, &other, ".meta");
    entry_path(to, sizeof to, dir, key, ".meta");
    assert_int_equal(rename(from, to), 0);
    entry_path(from, sizeof from, dir, &other, ".bin");
    entry_path(to, sizeof to, dir, key, ".bin");
    assert_int_equal(rename(from, to), 0);
}

/* The same entry, written by a cache of another version. */
static void rewrite_as_other_version(const char *dir, const disk_cache_key *key)
{
    disk_cache *cache = open_cache(dir, "cubert-test-cache-2");
    unsigned char *bytes = make_bytes(7, 0, 4096);
    disk_cache_put(cache, key, bytes, 4096);
    free(bytes);
    disk_cache_close(cache);
}

static void write_foreign_record(const char *dir, const disk_cache_key *key)
{
    char path[512];
    entry_path(path, sizeof path, dir, key, ".meta");
    write_file(path, "hello\n", 6);
}

static void make_record_huge(const char *dir, const disk_cache_key *key)
{
    char path[512];
    entry_path(path, sizeof path, dir, key, ".meta");
    char *junk = calloc(1, 8192);
    assert_non_null(junk);
    write_file(path, junk, 8192);
    free(junk);
}

static void artifact_to_directory(const char *dir, const disk_cache_key *key)
{
    char path[512];
    entry_path(path, sizeof path, dir, key, ".bin");
    assert_int_equal(unlink(path), 0);
    assert_int_equal(mkdir(path, 0700), 0);
}

static void test_corrupt_artifact(void **state)
{
    (void)state;
    bad_entry_case(flip_a_byte, "corrupt");
}

static void test_truncated_artifact(void **state)
{
    (void)state;
    bad_entry_case(cut_short, "truncated");
}

static void test_record_for_other_key(void **state)
{
    (void)state;
    bad_entry_case(swap_in_other_entry, "another key or version");
}

static void test_record_for_other_version(void **state)
{
    (void)state;
    bad_entry_case(rewrite_as_other_version, "another key or version");
}

static void test_foreign_record(void **state)
{
    (void)state;
    bad_entry_case(write_foreign_record, "another key or version");
    bad_entry_case(make_record_huge, "record is larger");
    bad_entry_case(artifact_to_directory, "not a regular file");
}

/* A FIFO in place of either file of an entry (or of the directory) is
 * refused without waiting for a writer: the entry is bad, removed and
 * rebuilt. SIGALRM ends a regression that blocks. */
static void fifo_record(const char *dir, const disk_cache_key *key)
{
    char path[512];
    entry_path(path, sizeof path, dir, key, ".meta");
    assert_int_equal(unlink(path), 0);
    assert_int_equal(mkfifo(path, 0600), 0);
}

static void fifo_artifact(const char *dir, const disk_cache_key *key)
{
    char path[512];
    entry_path(path, sizeof path, dir, key, ".bin");
    assert_int_equal(unlink(path), 0);
    assert_int_equal(mkfifo(path, 0600), 0);
}

/* Two materials whose 64-bit keys collide never share an entry: the wide
 * hash in the record tells them apart. */
static void test_material_checked(void **state)
{
    (void)state;
    char *dir = make_tmpdir();
    disk_cache *cache = open_cache(dir, TAG);
    disk_cache_key key;
    key_of("material", &key);
    unsigned char *bytes = make_bytes(9, 0, 100);
    disk_cache_put(cache, &key, bytes, 100);
    disk_cache_key twin = key;
    twin.material_high ^= 1;
    assert_int_equal(get_result(cache, &twin, 1 << 20), DISK_CACHE_BAD);
    expect_one_warning("another key or version");
    free(bytes);
    disk_cache_close(cache);
    rm_tree(dir);
}

/* A record without its artifact (a writer between its renames, or a crash
 * there) is a miss, not a bad entry. */
static void test_record_without_artifact(void **state)
{
    (void)state;
    char *dir = make_tmpdir();
    disk_cache *cache = open_cache(dir, TAG);
    disk_cache_key key;
    key_of("half", &key);
    unsigned char *bytes = make_bytes(10, 0, 100);
    disk_cache_put(cache, &key, bytes, 100);
    char path[512];
    entry_path(path, sizeof path, dir, &key, ".bin");
    assert_int_equal(unlink(path), 0);
    assert_int_equal(get_result(cache, &key, 1 << 20), DISK_CACHE_MISS);
    assert_int_equal(capture_warn_count(), 0);
    disk_cache_put(cache, &key, bytes, 100);
    expect_hit(cache, &key, bytes, 100);
    free(bytes);
    disk_cache_close(cache);
    rm_tree(dir);
}

static void test_max_len(void **state)
{
    (void)state;
    char *dir = make_tmpdir();
    disk_cache *cache = open_cache(dir, TAG);
    disk_cache_key key;
    key_of("max_len", &key);
    unsigned char *bytes = make_bytes(11, 0, 1000);
    disk_cache_put(cache, &key, bytes, 1000);

    unsigned char *got = NULL;
    size_t len = 0;
    assert_int_equal(disk_cache_get(cache, &key, 1000, &got, &len),
                     DISK_CACHE_HIT);
    assert_int_equal(len, 1000);
    assert_memory_equal(got, bytes, 1000);
    free(got);
    assert_int_equal(capture_warn_count(), 0);

    assert_int_equal(get_result(cache, &key, 999), DISK_CACHE_BAD);
    expect_one_warning("artifact is larger");
    assert_int_equal(count_entries(dir), SECRET_FILES);

    disk_cache_put(cache, &key, bytes, 1000);
    expect_hit(cache, &key, bytes, 1000);
    free(bytes);
    disk_cache_close(cache);
    rm_tree(dir);
}

/* ------------------------------------------------------------- the secret */

static void secret_path(char *buf, size_t size, const char *dir)
{
    snprintf(buf, size, "%s/" SECRET_NAME, dir);
}

/* The secret's bytes (at most 1024), in a buffer the caller frees. */
static unsigned char *read_secret(const char *dir, size_t *len)
{
    char path[512];
    secret_path(path, sizeof path, dir);
    return (unsigned char *)read_file(path, len);
}

static void expect_private_secret(const char *dir)
{
    char path[512];
    secret_path(path, sizeof path, dir);
    struct stat st;
    assert_int_equal(lstat(path, &st), 0);
    assert_true(S_ISREG(st.st_mode));
    assert_int_equal(st.st_mode & 0777, 0600);
    assert_int_equal(st.st_uid, geteuid());
    assert_true(st.st_size >= XXH3_SECRET_SIZE_MIN);
}

/* The first cache on a directory makes its secret, private; later ones
 * (other processes) use the same one. */
static void test_secret_created(void **state)
{
    (void)state;
    char *dir = make_tmpdir();
    disk_cache *cache = open_cache(dir, TAG);
    expect_private_secret(dir);
    size_t len1, len2;
    unsigned char *first = read_secret(dir, &len1);
    disk_cache_key key;
    key_of("secret-created", &key);
    disk_cache_put(cache, &key, "abc", 3);
    disk_cache *other = open_cache(dir, TAG);
    expect_hit(other, &key, "abc", 3);
    unsigned char *second = read_secret(dir, &len2);
    assert_int_equal(len1, len2);
    assert_memory_equal(first, second, len1);
    /* Two directories never share one. */
    char *dir2 = make_tmpdir();
    disk_cache *third = open_cache(dir2, TAG);
    free(second);
    second = read_secret(dir2, &len2);
    assert_true(len1 != len2 || memcmp(first, second, len1) != 0);
    assert_int_equal(capture_warn_count(), 0);
    free(first);
    free(second);
    disk_cache_close(cache);
    disk_cache_close(other);
    disk_cache_close(third);
    rm_tree(dir);
    rm_tree(dir2);
}

/* Opens a cache on `dir`, expects `warnings` warnings saying `says` at
 * open, a private secret different from `old`, and the entry `key` bad
 * (written with the old secret), then rebuilt. */
static void reopen_expect_rebuilt(const char *dir, int warnings,
                                  const char *says, const unsigned char *old,
                                  size_t old_len, const disk_cache_key *key)
{
    disk_cache *cache = open_cache(dir, TAG);
    assert_non_null(disk_cache_path(cache));
    if (warnings)
        expect_one_warning(says);
    assert_int_equal(capture_warn_count(), 0);
    expect_private_secret(dir);
    size_t len;
    unsigned char *now = read_secret(dir, &len);
    assert_true(len != old_len || memcmp(now, old, len) != 0);
    free(now);
    assert_int_equal(get_result(cache, key, 1 << 20), DISK_CACHE_BAD);
    expect_one_warning("another secret");
    disk_cache_put(cache, key, "rebuilt", 7);
    expect_hit(cache, key, "rebuilt", 7);
    disk_cache_close(cache);
}

static void test_secret_tampered(void **state)
{
    (void)state;
    char *dir = make_tmpdir();
    char *elsewhere = make_tmpdir();
    char path[512];
    secret_path(path, sizeof path, dir);
    disk_cache_key key;
    key_of("secret-tampered", &key);
    disk_cache *cache = open_cache(dir, TAG);
    disk_cache_put(cache, &key, "original", 8);
    expect_hit(cache, &key, "original", 8);
    disk_cache_close(cache);
    size_t len;
    unsigned char *old = read_secret(dir, &len);

    /* Changed in place, still private: it is used, and no record written
     * with the old one verifies. */
    unsigned char *changed = malloc(len);
    assert_non_null(changed);
    memcpy(changed, old, len);
    changed[len / 2] ^= 0x01;
    write_file(path, changed, len);
    free(changed);
    reopen_expect_rebuilt(dir, 0, "", old, len, &key);

    /* Readable by others: never trusted; a new one replaces it. */
    free(old);
    old = read_secret(dir, &len);
    assert_int_equal(chmod(path, 0644), 0);
    reopen_expect_rebuilt(dir, 1, "group or others", old, len, &key);

    /* A symbolic link to a file holding the very same bytes. */
    free(old);
    old = read_secret(dir, &len);
    char target[512];
    snprintf(target, sizeof target, "%s/copy", elsewhere);
    write_file(target, old, len);
    assert_int_equal(chmod(target, 0600), 0);
    assert_int_equal(unlink(path), 0);
    assert_int_equal(symlink(target, path), 0);
    reopen_expect_rebuilt(dir, 1, "symbolic link", old, len, &key);

    /* A FIFO: replaced, never waited on. */
    free(old);
    old = read_secret(dir, &len);
    assert_int_equal(unlink(path), 0);
    assert_int_equal(mkfifo(path, 0600), 0);
    alarm(20);
    reopen_expect_rebuilt(dir, 1, "not a regular file", old, len, &key);
    alarm(0);

    /* Cut short. */
    free(old);
    old = read_secret(dir, &len);
    assert_int_equal(truncate(path, 16), 0);
    reopen_expect_rebuilt(dir, 1, "size", old, len, &key);

    /* An empty directory in its place. */
    free(old);
    old = read_secret(dir, &len);
    assert_int_equal(unlink(path), 0);
    assert_int_equal(mkdir(path, 0700), 0);
    reopen_expect_rebuilt(dir, 1, "not a regular file", old, len, &key);

    /* Owned by another user (root can set that up). */
    if (geteuid() == 0) {
        free(old);
        old = read_secret(dir, &len);
        assert_int_equal(chown(path, 65534, 65534), 0);
        reopen_expect_rebuilt(dir, 1, "owned by another user", old, len, &key);
    }
    free(old);
    rm_tree(elsewhere);
    rm_tree(dir);
}

/* A record verifies only with the directory's secret. Whoever can write an
 * entry but not read the secret cannot forge one: a record from another
 * cache directory (another secret), or in the old format (a plain XXH3 of
 * the artifact, which anyone can compute), is bad, removed and rebuilt. */
static void test_record_needs_secret(void **state)
{
    (void)state;
    char *dir = make_tmpdir();
    char *other_dir = make_tmpdir();
    disk_cache *cache = open_cache(dir, TAG);
    disk_cache *other = open_cache(other_dir, TAG);
    disk_cache_key key;
    key_of("needs-secret", &key);
    unsigned char *good = make_bytes(20, 0, 2000);
    unsigned char *forged = make_bytes(21, 0, 2000);
    disk_cache_put(cache, &key, good, 2000);

    /* A complete entry for this key from another directory. */
    disk_cache_put(other, &key, forged, 2000);
    char from[512], to[512];
    for (int i = 0; i < 2; i++) {
        const char *ext = i ? ".meta" : ".bin";
        entry_path(from, sizeof from, other_dir, &key, ext);
        entry_path(to, sizeof to, dir, &key, ext);
        assert_int_equal(rename(from, to), 0);
    }
    assert_int_equal(get_result(cache, &key, 1 << 20), DISK_CACHE_BAD);
    expect_one_warning("another secret");
    disk_cache_put(cache, &key, good, 2000);
    expect_hit(cache, &key, good, 2000);

    /* The format written before records were keyed. */
    entry_path(to, sizeof to, dir, &key, ".bin");
    write_file(to, forged, 2000);
    XXH128_hash_t h = XXH3_128bits(forged, 2000);
    char record[512];
    int n = snprintf(
        record, sizeof record,
        "%s\nkey %016" PRIx64 "\nmaterial %016" PRIx64 "%016" PRIx64
        "\nsize 2000\nxxh3-128 %016" PRIx64 "%016" PRIx64 "\n",
        TAG, key.key, key.material_high, key.material_low, h.high64, h.low64);
    entry_path(to, sizeof to, dir, &key, ".meta");
    write_file(to, record, (size_t)n);
    assert_int_equal(get_result(cache, &key, 1 << 20), DISK_CACHE_BAD);
    expect_one_warning("another key or version");
    disk_cache_put(cache, &key, good, 2000);
    expect_hit(cache, &key, good, 2000);

    free(good);
    free(forged);
    disk_cache_close(cache);
    disk_cache_close(other);
    rm_tree(dir);
    rm_tree(other_dir);
}

/* ------------------------------------------------------ unusable caches */

static void test_disabled(void **state)
{
    (void)state;
    disk_cache *cache = open_cache("", TAG);
    assert_null(disk_cache_path(cache));
    disk_cache_key key;
    key_of("disabled", &key);
    assert_int_equal(get_result(cache, &key, 1 << 20), DISK_CACHE_MISS);
    disk_cache_put(cache, &key, "abc", 3);
    assert_int_equal(get_result(cache, &key, 1 << 20), DISK_CACHE_MISS);
    disk_cache_remove(cache, &key);
    assert_int_equal(capture_warn_count(), 0);
    disk_cache_close(cache);
}

/* A cache refused at open behaves exactly like a disabled one. */
static void expect_refused(const char *dir, const char *says)
{
    disk_cache *cache = open_cache(dir, TAG);
    expect_one_warning("disk cache disabled");
    assert_null(disk_cache_path(cache));
    disk_cache_key key;
    key_of(says, &key);
    disk_cache_put(cache, &key, "abc", 3);
    assert_int_equal(get_result(cache, &key, 1 << 20), DISK_CACHE_MISS);
    assert_int_equal(capture_warn_count(), 0);
    disk_cache_close(cache);
}

static void test_insecure_dir_refused(void **state)
{
    (void)state;
    char *dir = make_tmpdir();
    assert_int_equal(chmod(dir, 0777), 0);
    disk_cache *cache = open_cache(dir, TAG);
    assert_null(disk_cache_path(cache));
    expect_one_warning("writable by group or others");
    disk_cache_close(cache);
    expect_refused(dir, "insecure");
    assert_int_equal(count_entries(dir), 0);

    /* Group-writable only is refused too. */
    assert_int_equal(chmod(dir, 0770), 0);
    expect_refused(dir, "group");
    assert_int_equal(count_entries(dir), 0);

    /* One owned by another user is refused (root can set that up). */
    assert_int_equal(chmod(dir, 0700), 0);
    if (geteuid() == 0) {
        assert_int_equal(chown(dir, 65534, 65534), 0);
        cache = open_cache(dir, TAG);
        assert_null(disk_cache_path(cache));
        expect_one_warning("owned by another user");
        disk_cache_close(cache);
        assert_int_equal(chown(dir, 0, 0), 0);
    }

    /* A symbolic link to a good directory is refused as well. */
    char good[512], link_path[512];
    snprintf(good, sizeof good, "%s/good", dir);
    snprintf(link_path, sizeof link_path, "%s/link", dir);
    assert_int_equal(mkdir(good, 0700), 0);
    assert_int_equal(symlink(good, link_path), 0);
    cache = open_cache(link_path, TAG);
    assert_null(disk_cache_path(cache));
    expect_one_warning("symbolic link");
    disk_cache_close(cache);
    /* With a trailing slash too (which would make open follow it). */
    char slashed[520];
    snprintf(slashed, sizeof slashed, "%s//", link_path);
    cache = open_cache(slashed, TAG);
    assert_null(disk_cache_path(cache));
    expect_one_warning("symbolic link");
    disk_cache_close(cache);
    assert_int_equal(count_entries(good), 0);

    /* A path through a regular file cannot be created. */
    char file_path[512], below[600];
    snprintf(file_path, sizeof file_path, "%s/file", dir);
    write_file(file_path, "x", 1);
    snprintf(below, sizeof below, "%s/cache", file_path);
    expect_refused(below, "not a directory");
    rm_tree(dir);
}

static void test_fifo_entry(void **state)
{
    (void)state;
    alarm(20);
    bad_entry_case(fifo_record, "not a regular file");
    bad_entry_case(fifo_artifact, "not a regular file");

    /* A FIFO where the directory should be: the cache is off. */
    char *base = make_tmpdir();
    char fifo[512];
    snprintf(fifo, sizeof fifo, "%s/cache", base);
    assert_int_equal(mkfifo(fifo, 0600), 0);
    expect_refused(fifo, "fifo directory");
    alarm(0);
    rm_tree(base);
}

/* The directory the configuration names (CUBERT_CACHE_DIR, the file's
 * cache_dir, the default root) is checked as the backend's folder in it
 * is: a root that others can write to, or a symbolic link, could have the
 * folder swapped under the cache. */
static void expect_root_refused(const char *root, const char *dir,
                                const char *says)
{
    disk_cache *cache = open_cache(dir, TAG);
    assert_null(disk_cache_path(cache));
    pthread_mutex_lock(&capture_lock);
    int named = strstr(capture_last_warn, root) != NULL;
    pthread_mutex_unlock(&capture_lock);
    assert_true(named);
    expect_one_warning(says);
    disk_cache_close(cache);
    assert_false(file_exists(dir)); /* nothing made inside */
}

static void test_insecure_root_refused(void **state)
{
    (void)state;
    char *root = make_tmpdir();
    char dir[512];
    snprintf(dir, sizeof dir, "%s/test", root);

    assert_int_equal(chmod(root, 0770), 0);
    expect_root_refused(root, dir, "writable by group or others");
    assert_int_equal(chmod(root, 0777 | S_ISVTX), 0);
    expect_root_refused(root, dir, "writable by group or others");
    /* A trailing slash names the same folder. */
    char slashed[520];
    snprintf(slashed, sizeof slashed, "%s/", dir);
    expect_root_refused(root, slashed, "writable by group or others");

    if (geteuid() == 0) {
        assert_int_equal(chmod(root, 0700), 0);
        assert_int_equal(chown(root, 65534, 65534), 0);
        expect_root_refused(root, dir, "owned by another user");
        assert_int_equal(chown(root, 0, 0), 0);
    }

    /* The same root through CUBERT_CACHE_DIR, for the default folder. */
    assert_int_equal(chmod(root, 0750 | S_IWGRP), 0);
    const char *old = getenv("CUBERT_CACHE_DIR");
    char *saved = old ? strdup(old) : NULL;
    setenv("CUBERT_CACHE_DIR", root, 1);
    disk_cache *cache = NULL;
    assert_null(disk_cache_open(NULL, "cuda", ".cubin", TAG, &cache));
    assert_null(disk_cache_path(cache));
    expect_one_warning("writable by group or others");
    disk_cache_close(cache);

    /* A root that is a symbolic link to a good directory. */
    assert_int_equal(chmod(root, 0700), 0);
    char *holder = make_tmpdir();
    char link_path[512], link_dir[600];
    snprintf(link_path, sizeof link_path, "%s/link", holder);
    assert_int_equal(symlink(root, link_path), 0);
    snprintf(link_dir, sizeof link_dir, "%s/test", link_path);
    expect_root_refused(link_path, link_dir, "symbolic link");
    setenv("CUBERT_CACHE_DIR", link_path, 1);
    assert_null(disk_cache_open(NULL, "cuda", ".cubin", TAG, &cache));
    assert_null(disk_cache_path(cache));
    expect_one_warning("symbolic link");
    disk_cache_close(cache);
    assert_int_equal(count_entries(root), 0);

    /* The good root itself is used, and its folder made inside. */
    setenv("CUBERT_CACHE_DIR", root, 1);
    assert_null(disk_cache_open(NULL, "cuda", ".cubin", TAG, &cache));
    char want[600];
    snprintf(want, sizeof want, "%s/cuda", root);
    assert_non_null(disk_cache_path(cache));
    assert_string_equal(disk_cache_path(cache), want);
    disk_cache_close(cache);
    assert_int_equal(capture_warn_count(), 0);

    if (saved)
        setenv("CUBERT_CACHE_DIR", saved, 1);
    else
        unsetenv("CUBERT_CACHE_DIR");
    free(saved);
    rm_tree(holder);
    rm_tree(root);
}

static void test_nested_dir_created(void **state)
{
    (void)state;
    char *base = make_tmpdir();
    char nested[512];
    snprintf(nested, sizeof nested, "%s/a/b/c/", base);
    disk_cache *cache = open_cache(nested, TAG);
    char want[512];
    snprintf(want, sizeof want, "%s/a/b/c", base);
    assert_string_equal(disk_cache_path(cache), want);
    struct stat st;
    assert_int_equal(stat(want, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0700);
    disk_cache_key key;
    key_of("nested", &key);
    disk_cache_put(cache, &key, "xyz", 3);
    expect_hit(cache, &key, "xyz", 3);
    assert_int_equal(count_entries(want), 2 + SECRET_FILES);
    assert_int_equal(capture_warn_count(), 0);
    disk_cache_close(cache);
    rm_tree(base);
}

/* --------------------------------------------------- the default directory */

typedef struct saved_env {
    const char *name;
    char *value; /* NULL: was unset */
} saved_env;

static saved_env env_set(const char *name, const char *value)
{
    const char *old = getenv(name);
    saved_env s = {name, old ? strdup(old) : NULL};
    if (value)
        setenv(name, value, 1);
    else
        unsetenv(name);
    return s;
}

static void env_restore(saved_env s)
{
    if (s.value)
        setenv(s.name, s.value, 1);
    else
        unsetenv(s.name);
    free(s.value);
}

static void expect_default(const char *want)
{
    disk_cache *cache = NULL;
    assert_null(disk_cache_open(NULL, "cuda", ".cubin", TAG, &cache));
    if (want)
        assert_string_equal(disk_cache_path(cache), want);
    else
        assert_null(disk_cache_path(cache));
    disk_cache_close(cache);
}

static void test_default_dir(void **state)
{
    (void)state;
    char *base = make_tmpdir();
    char want[512], xdg[512], home[512];
    snprintf(xdg, sizeof xdg, "%s/xdg", base);
    snprintf(home, sizeof home, "%s/home", base);
    saved_env c = env_set("CUBERT_CACHE_DIR", base);
    saved_env x = env_set("XDG_CACHE_HOME", xdg);
    saved_env h = env_set("HOME", home);

    snprintf(want, sizeof want, "%s/cuda", base);
    expect_default(want);
    unsetenv("CUBERT_CACHE_DIR");
    snprintf(want, sizeof want, "%s/xdg/cubert/cuda", base);
    expect_default(want);
    setenv("XDG_CACHE_HOME", "relative/dir", 1); /* ignored, per XDG */
    snprintf(want, sizeof want, "%s/home/.cache/cubert/cuda", base);
    expect_default(want);
    unsetenv("XDG_CACHE_HOME");
    expect_default(want);
    unsetenv("HOME");
    expect_default(NULL);
    assert_int_equal(capture_warn_count(), 0);

    env_restore(h);
    env_restore(x);
    env_restore(c);
    rm_tree(base);
}

static void test_open_arguments(void **state)
{
    (void)state;
    static const struct {
        const char *backend, *ext, *tag;
    } bad[] = {
        {NULL, ".so", TAG},
        {"cpu", NULL, TAG},
        {"cpu", ".so", NULL},
        {"", ".so", TAG},
        {"a/b", ".so", TAG},
        {"..", ".so", TAG},
        {"cpu", "/x", TAG},
        {"cpu", ".meta", TAG},
        {"cpu", ".so", ""},
        {"cpu", ".so", "two\nlines"},
        {"cpu", ".an-extension-longer-than-32-bytes", TAG},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        disk_cache *cache = (disk_cache *)(void *)&bad; /* must be reset */
        cube_error *err =
            disk_cache_open("", bad[i].backend, bad[i].ext, bad[i].tag, &cache);
        assert_int_equal(cube_error_code(err), CUBE_ERR_INVALID_ARGUMENT);
        assert_null(cache);
        cube_error_free(err);
    }
    cube_error *err = disk_cache_open("", "cpu", ".so", TAG, NULL);
    assert_int_equal(cube_error_code(err), CUBE_ERR_INVALID_ARGUMENT);
    cube_error_free(err);
}

/* ----------------------------------------------------------------- threads */

enum {
    THREADS = 8,
    ROUNDS = 300,
    SHARED_KEYS = 4, /* every thread uses these */
    OWN_KEYS = 2     /* and two of its own */
};

typedef struct thread_arg {
    const disk_cache *cache;
    unsigned id;
    /* Phase 2: writers of one key put different bytes, so a reader may
     * pair one writer's record with another's artifact: that must be BAD,
     * never wrong bytes. */
    int rival_writers;
    int hits, bads;
    int wrong; /* a hit whose bytes are not exactly some writer's */
} thread_arg;

static size_t bytes_len(unsigned key_id, unsigned writer)
{
    return 64 + (size_t)((key_id * 7919u + writer * 104729u) % 20000u);
}

static void *thread_main(void *p)
{
    thread_arg *a = p;
    unsigned seed = a->id * 977u + 1u;
    for (int round = 0; round < ROUNDS; round++) {
        seed = seed * 1103515245u + 12345u;
        unsigned pick = (seed >> 8) % (SHARED_KEYS + OWN_KEYS);
        unsigned key_id = pick < SHARED_KEYS
                              ? pick
                              : 100 + a->id * OWN_KEYS + (pick - SHARED_KEYS);
        char text[32];
        snprintf(text, sizeof text, "key-%u", key_id);
        disk_cache_key key;
        key_of(text, &key);
        unsigned writer = a->rival_writers ? a->id : 0;

        unsigned char *got = NULL;
        size_t len = 0;
        disk_cache_result r =
            disk_cache_get(a->cache, &key, 1 << 20, &got, &len);
        if (r == DISK_CACHE_HIT) {
            a->hits++;
            /* The bytes say which writer made them; they must be exactly
             * that writer's bytes for this key. */
            unsigned k = 0, w = 0;
            if (len >= 12) {
                memcpy(&k, got, 4);
                memcpy(&w, got + 4, 4);
            }
            unsigned char *want = len >= 12 && k == key_id && w < THREADS
                                      ? make_bytes(k, w, len)
                                      : NULL;
            if (!want || len != bytes_len(k, w) || memcmp(want, got, len))
                a->wrong++;
            free(want);
            free(got);
        } else {
            if (r == DISK_CACHE_BAD)
                a->bads++;
            size_t n = bytes_len(key_id, writer);
            unsigned char *bytes = make_bytes(key_id, writer, n);
            disk_cache_put(a->cache, &key, bytes, n);
            free(bytes);
        }
    }
    return NULL;
}

static void run_threads(const char *dir, int rival_writers)
{
    disk_cache *caches[2] = {open_cache(dir, TAG), open_cache(dir, TAG)};
    pthread_t threads[THREADS];
    thread_arg args[THREADS];
    for (unsigned i = 0; i < THREADS; i++) {
        /* Half share one cache, half another (as two processes would). */
        args[i] = (thread_arg){caches[i % 2], i, rival_writers, 0, 0, 0};
        assert_int_equal(
            pthread_create(&threads[i], NULL, thread_main, &args[i]), 0);
    }
    int hits = 0, bads = 0;
    for (unsigned i = 0; i < THREADS; i++) {
        assert_int_equal(pthread_join(threads[i], NULL), 0);
        assert_int_equal(args[i].wrong, 0);
        hits += args[i].hits;
        bads += args[i].bads;
    }
    assert_true(hits > 0);
    if (!rival_writers) {
        /* Writers of one key agree on its bytes, and a record is renamed
         * into place only after its artifact: nothing can fail to verify. */
        assert_int_equal(bads, 0);
        assert_int_equal(capture_warn_count(), 0);
    }
    disk_cache_close(caches[0]);
    disk_cache_close(caches[1]);
}

static void test_threads(void **state)
{
    (void)state;
    char *dir = make_tmpdir();
    run_threads(dir, 0);
    /* Only whole entries remain: no temporary file is left behind. */
    assert_int_equal(count_entries(dir),
                     2 * (SHARED_KEYS + THREADS * OWN_KEYS) + SECRET_FILES);
    rm_tree(dir);

    dir = make_tmpdir();
    run_threads(dir, 1);
    rm_tree(dir);
}

int main(void)
{
    cube_log_set_sink(capture_sink, NULL);
    cube_log_set_level(CUBE_LOG_WARN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_keys, setup),
        cmocka_unit_test_setup(test_miss_put_hit, setup),
        cmocka_unit_test_setup(test_corrupt_artifact, setup),
        cmocka_unit_test_setup(test_truncated_artifact, setup),
        cmocka_unit_test_setup(test_record_for_other_key, setup),
        cmocka_unit_test_setup(test_record_for_other_version, setup),
        cmocka_unit_test_setup(test_foreign_record, setup),
        cmocka_unit_test_setup(test_fifo_entry, setup),
        cmocka_unit_test_setup(test_material_checked, setup),
        cmocka_unit_test_setup(test_record_without_artifact, setup),
        cmocka_unit_test_setup(test_max_len, setup),
        cmocka_unit_test_setup(test_secret_created, setup),
        cmocka_unit_test_setup(test_secret_tampered, setup),
        cmocka_unit_test_setup(test_record_needs_secret, setup),
        cmocka_unit_test_setup(test_disabled, setup),
        cmocka_unit_test_setup(test_insecure_dir_refused, setup),
        cmocka_unit_test_setup(test_insecure_root_refused, setup),
        cmocka_unit_test_setup(test_nested_dir_created, setup),
        cmocka_unit_test_setup(test_default_dir, setup),
        cmocka_unit_test_setup(test_open_arguments, setup),
        cmocka_unit_test_setup(test_threads, setup),
    };
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    cube_log_set_sink(NULL, NULL);
    return failed;
}
