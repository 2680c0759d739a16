/* File paths.
 *
 * Thread safety: any thread. Errors: NULL for want of memory.
 */
#ifndef CUBE_BASE_PATH_H
#define CUBE_BASE_PATH_H

/* "a/b": `dir`, one slash, `name` (neither is checked or normalized). A new
 * string the caller frees; NULL for want of memory. */
char *cube_path_join(const char *dir, const char *name);

#endif /* CUBE_BASE_PATH_H */
