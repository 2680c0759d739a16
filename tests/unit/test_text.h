/* Whole text files for the unit tests that check pages and sources
 * (docs/ against the code): read at once, and copies with one edit to show
 * that a checker catches a mistake. Include after cmocka.h. */
#ifndef CUBE_TEST_TEXT_H
#define CUBE_TEST_TEXT_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The file at `path`, NUL-terminated (free it); fails the test when it
 * cannot be read. */
static inline char *read_text(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        fail_msg("cannot open %s", path);
    assert_int_equal(fseek(f, 0, SEEK_END), 0);
    long n = ftell(f);
    assert_true(n >= 0);
    rewind(f);
    char *text = malloc((size_t)n + 1);
    assert_non_null(text);
    assert_int_equal(fread(text, 1, (size_t)n, f), (size_t)n);
    text[n] = '\0';
    fclose(f);
    return text;
}

/* `text` with its first `from` replaced by `to` (a new string); fails the
 * test when `from` is not there. */
static inline char *edited(const char *text, const char *from, const char *to)
{
    const char *at = strstr(text, from);
    assert_non_null(at);
    size_t size = strlen(text) - strlen(from) + strlen(to) + 1;
    char *out = malloc(size);
    assert_non_null(out);
    snprintf(out, size, "%.*s%s%s", (int)(at - text), text, to,
             at + strlen(from));
    return out;
}

#endif /* CUBE_TEST_TEXT_H */
