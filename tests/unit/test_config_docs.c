/* docs/configuration.md against the table of configuration keys (the
 * core's and each backend's): every key has a row in the summary, with its
 * file key and owner, and a section of its own; every CUBERT_ variable
 * that docs/ or the README names is one of the keys, or belongs to a
 * backend this build left out. The checker runs on the real pages, and on
 * doctored copies to show that it catches each kind of mistake. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <ctype.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/client_internal.h"
#include "core/config.h"
#include "test_text.h"

#define CONFIG_DOC CUBE_SOURCE_DIR "/docs/configuration.md"

/* "CUBERT_" and the name in upper case. */
static void variable_of(const char *name, char *buf, size_t size)
{
    int n = snprintf(buf, size, "CUBERT_%s", name);
    for (int i = 0; i < n && buf[i]; i++)
        buf[i] = (char)toupper((unsigned char)buf[i]);
}

/* --- the summary table ---------------------------------------------------- */

/* One row: | `CUBERT_X` | `x` or — | owner | meaning | default | */
typedef struct doc_row {
    char variable[64];
    char file_key[64];
    char owner[32];
} doc_row;

#define MAX_ROWS 64

/* Copies cell [s, s + n) into dst without blanks and backquotes around it. */
static void cell_copy(char *dst, size_t size, const char *s, size_t n)
{
    while (n && (*s == ' ' || *s == '`')) {
        s++;
        n--;
    }
    while (n && (s[n - 1] == ' ' || s[n - 1] == '`'))
        n--;
    if (n >= size)
        n = size - 1;
    memcpy(dst, s, n);
    dst[n] = '\0';
}

/* The rows of the table under "## Summary". Returns how many. */
static size_t summary_rows(const char *doc, doc_row *rows)
{
    const char *p = strstr(doc, "\n## Summary\n");
    if (!p)
        return 0;
    const char *end = strstr(p + 1, "\n## ");
    size_t n = 0;
    for (p = strstr(p, "\n| `CUBERT_"); p && (!end || p < end) && n < MAX_ROWS;
         p = strstr(p, "\n| `CUBERT_")) {
        p += 2; /* past "\n|" */
        const char *eol = strchr(p, '\n');
        if (!eol)
            eol = p + strlen(p);
        char *cells[3] = {rows[n].variable, rows[n].file_key, rows[n].owner};
        size_t sizes[3] = {sizeof rows[n].variable, sizeof rows[n].file_key,
                           sizeof rows[n].owner};
        for (int c = 0; c < 3; c++) {
            const char *bar = memchr(p, '|', (size_t)(eol - p));
            if (!bar)
                bar = eol;
            cell_copy(cells[c], sizes[c], p, (size_t)(bar - p));
            p = bar < eol ? bar + 1 : eol;
        }
        n++;
        p = eol;
    }
    return n;
}

static const doc_row *row_for(const doc_row *rows, size_t n,
                              const char *variable)
{
    for (size_t i = 0; i < n; i++)
        if (strcmp(rows[i].variable, variable) == 0)
            return &rows[i];
    return NULL;
}

/* --- the checks ----------------------------------------------------------- */

/* Every key of the table in the configuration page `doc`. Returns the
 * number of problems, each printed. */
static int check_keys_documented(const char *doc)
{
    doc_row rows[MAX_ROWS];
    size_t n = summary_rows(doc, rows);
    int problems = 0;
    const char *owner;
    const cube_config_key *key;
    for (size_t i = 0; (key = core_config_key_at(i, &owner)) != NULL; i++) {
        char variable[64], heading[96];
        variable_of(key->name, variable, sizeof variable);
        const doc_row *row = row_for(rows, n, variable);
        if (!row) {
            print_message("configuration.md: no summary row for %s\n",
                          variable);
            problems++;
            continue;
        }
        const char *file_key =
            key->flags & CUBE_CONFIG_ENV_ONLY ? "\u2014" : key->name;
        if (strcmp(row->file_key, file_key) != 0) {
            print_message("configuration.md: %s has file key '%s', the "
                          "table says '%s'\n",
                          variable, row->file_key, file_key);
            problems++;
        }
        if (strcmp(row->owner, owner) != 0) {
            print_message("configuration.md: %s is read by '%s', the table "
                          "says '%s'\n",
                          variable, row->owner, owner);
            problems++;
        }
        snprintf(heading, sizeof heading, "\n### %s\n", variable);
        if (!strstr(doc, heading)) {
            print_message("configuration.md: no section '### %s'\n", variable);
            problems++;
        }
    }
    return problems;
}

/* Nonzero when `variable` is a key of the table. */
static int is_key(const char *variable)
{
    const cube_config_key *key;
    for (size_t i = 0; (key = core_config_key_at(i, NULL)) != NULL; i++) {
        char v[64];
        variable_of(key->name, v, sizeof v);
        if (strcmp(v, variable) == 0)
            return 1;
    }
    return 0;
}

/* Every CUBERT_ variable in `text` (the page `file`) is a key, or a
 * summary row's of a backend left out of this build. Returns the number
 * of problems, each printed. */
static int check_variables_known(const char *text, const char *file,
                                 const char *doc)
{
    doc_row rows[MAX_ROWS];
    size_t n = summary_rows(doc, rows);
    int problems = 0;
    for (const char *p = strstr(text, "CUBERT_"); p; p = strstr(p, "CUBERT_")) {
        size_t len = strlen("CUBERT_");
        while (isupper((unsigned char)p[len]) ||
               isdigit((unsigned char)p[len]) || p[len] == '_')
            len++;
        /* "CUBERT_*" and "CUBERT_" alone name the prefix, not a variable. */
        if (len > strlen("CUBERT_") &&
            (p == text || !isalnum((unsigned char)p[-1]))) {
            char variable[64];
            snprintf(variable, sizeof variable, "%.*s", (int)len, p);
            const doc_row *row = row_for(rows, n, variable);
            if (!is_key(variable) &&
                !(row && core_backend_left_out(row->owner))) {
                print_message("%s: %s is not a configuration key\n", file,
                              variable);
                problems++;
            }
        }
        p += len;
    }
    return problems;
}

/* --- tests ---------------------------------------------------------------- */

static void test_configuration_page(void **state)
{
    (void)state;
    char *doc = read_text(CONFIG_DOC);
    doc_row rows[MAX_ROWS];
    assert_true(summary_rows(doc, rows) > 0);
    assert_int_equal(check_keys_documented(doc), 0);
    assert_int_equal(check_variables_known(doc, "configuration.md", doc), 0);
    free(doc);
}

/* Every page of docs/ and the README names only keys. */
static void test_other_pages(void **state)
{
    (void)state;
    char *doc = read_text(CONFIG_DOC);
    char *readme = read_text(CUBE_SOURCE_DIR "/README.md");
    int problems = check_variables_known(readme, "README.md", doc);
    free(readme);
    DIR *dir = opendir(CUBE_SOURCE_DIR "/docs");
    assert_non_null(dir);
    struct dirent *e;
    int pages = 0;
    while ((e = readdir(dir)) != NULL) {
        size_t len = strlen(e->d_name);
        if (len < 4 || strcmp(e->d_name + len - 3, ".md") != 0)
            continue;
        char path[1024];
        snprintf(path, sizeof path, "%s/docs/%s", CUBE_SOURCE_DIR, e->d_name);
        char *text = read_text(path);
        problems += check_variables_known(text, e->d_name, doc);
        free(text);
        pages++;
    }
    closedir(dir);
    assert_true(pages > 1);
    assert_int_equal(problems, 0);
    free(doc);
}

/* The checker catches each kind of mistake in a doctored page. */
static void test_checker_catches_mistakes(void **state)
{
    (void)state;
    char *doc = read_text(CONFIG_DOC);

    /* A key without its row. */
    char *bad = edited(doc, "| `CUBERT_CPU_CC` |", "| `CUBERT_CPU_CX` |");
    assert_true(check_keys_documented(bad) >= 1);
    assert_int_equal(check_variables_known(bad, "bad.md", bad), 1);
    free(bad);

    /* A key without its section. */
    bad = edited(doc, "\n### CUBERT_TRACE\n", "\n### Tracing\n");
    assert_int_equal(check_keys_documented(bad), 1);
    free(bad);

    /* A wrong file key, and a wrong owner. */
    bad = edited(doc, "| `CUBERT_CPU_CFLAGS` | `cpu_cflags` | cpu |",
                 "| `CUBERT_CPU_CFLAGS` | \u2014 | core |");
    assert_int_equal(check_keys_documented(bad), 2);
    free(bad);

    /* A variable that is not a key, in prose. */
    assert_int_equal(check_variables_known("set `CUBERT_COLOUR=red`, or "
                                           "CUBERT_* or `CUBERT_`",
                                           "prose.md", doc),
                     1);
    free(doc);
}

/* The table itself: names the file and the environment can carry, unique,
 * each key complete. */
static void test_table_is_sound(void **state)
{
    (void)state;
    const char *owner;
    const cube_config_key *key;
    size_t count = 0, backend_keys = 0;
    for (; (key = core_config_key_at(count, &owner)) != NULL; count++) {
        const char *name = key->name;
        assert_non_null(name);
        assert_true(strlen(name) > 0 && strlen(name) <= 40);
        for (const char *c = name; *c; c++)
            if (!islower((unsigned char)*c) && !isdigit((unsigned char)*c) &&
                *c != '_')
                fail_msg("key '%s': '%c' in its name", name, *c);
        for (size_t j = 0; j < count; j++)
            if (strcmp(core_config_key_at(j, NULL)->name, name) == 0)
                fail_msg("key '%s' is listed twice", name);
        assert_non_null(key->doc);
        assert_true(*key->doc && !strchr(key->doc, '\n'));
        assert_non_null(key->default_text);
        switch (key->type) {
        case CUBE_CONFIG_UINT: assert_true(key->min <= key->max); break;
        case CUBE_CONFIG_WORD: {
            int shown = 0;
            assert_non_null(key->words);
            for (const cube_config_word *w = key->words; w->word; w++)
                shown += !w->alias;
            assert_true(shown > 0);
            break;
        }
        case CUBE_CONFIG_TEXT:
        case CUBE_CONFIG_PATH:
            assert_true(key->max_len > 0 &&
                        key->max_len <= CUBE_CONFIG_TEXT_MAX);
            break;
        default: fail_msg("key '%s': unknown type", name);
        }
        if (strcmp(owner, "core") != 0)
            backend_keys++;
        else
            assert_int_equal(backend_keys, 0); /* the core's come first */
    }
    assert_true(count >= 8);
    assert_true(backend_keys <= CORE_CONFIG_BACKEND_KEYS);
    assert_null(core_config_key_at(count + 1, NULL));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_table_is_sound),
        cmocka_unit_test(test_configuration_page),
        cmocka_unit_test(test_other_pages),
        cmocka_unit_test(test_checker_catches_mistakes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
