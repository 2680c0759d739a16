/* Temporary directories for the unit tests that write files (the disk
 * cache, the CPU JIT): made fresh under /tmp, counted, removed whole.
 * Include after cmocka.h. */
#ifndef CUBE_TEST_FILES_H
#define CUBE_TEST_FILES_H

#include <dirent.h>
#include <ftw.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* A new private directory whose name starts with `prefix` (a path ending
 * in XXXXXX); free it with rm_tree. */
static inline char *make_tmpdir_named(const char *prefix)
{
    char *path = strdup(prefix);
    assert_non_null(path);
    assert_non_null(mkdtemp(path));
    return path;
}

static inline int rm_entry(const char *path, const struct stat *st, int flag,
                           struct FTW *ftw)
{
    (void)st;
    (void)ftw;
    return flag == FTW_DP ? rmdir(path) : unlink(path);
}

/* Removes `path` and everything below it (made writable first), then frees
 * the string. */
static inline void rm_tree(char *path)
{
    chmod(path, 0700);
    nftw(path, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    free(path);
}

/* Entries of `dir`, "." and ".." left out. */
static inline int count_entries(const char *dir)
{
    DIR *d = opendir(dir);
    assert_non_null(d);
    int n = 0;
    struct dirent *ent;
    while ((ent = readdir(d)) != NULL)
        if (strcmp(ent->d_name, ".") && strcmp(ent->d_name, ".."))
            n++;
    closedir(d);
    return n;
}

#endif /* CUBE_TEST_FILES_H */
