/* docs/threading.md's lock table against the mutexes the library declares:
 * every cube_mutex (and any plain pthread_mutex_t) in src/ has exactly one
 * row, and every row names a mutex that exists, so a lock added or renamed
 * without its place in the order fails here.
 *
 * A row names its lock by where it lives, not by file: a struct's field
 * as `struct.field` (the struct's tag, or its typedef name when it has no
 * tag; a field of a nested struct as `struct.member.field`), anything
 * else (a global, a static) by its variable's name, which must then be
 * unique in src/. Moving code between files renames nothing. The checker
 * runs on the real tree and page, and on doctored text to show that it
 * catches each kind of mistake. */
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
#include <sys/stat.h>

#include "test_text.h"

#define THREADING_DOC CUBE_SOURCE_DIR "/docs/threading.md"
#define LOCK_SECTION "\n## Locks and the order they nest in\n"
/* The wrapper itself: its pthread_mutex_t is every cube_mutex's. */
#define MUTEX_HEADER "base/mutex.h"

#define NAME_MAX_LEN 96
#define MAX_LOCKS 160

/* --- the mutexes of the source ------------------------------------------- */

typedef struct lock_decl {
    char name[NAME_MAX_LEN];
    char file[128];
    int global; /* named by its variable, not by a struct */
} lock_decl;

typedef struct lock_set {
    lock_decl items[MAX_LOCKS];
    size_t count;
} lock_set;

/* Code only: comments, string and character literals and preprocessor
 * lines blanked (newlines kept). A new string. */
static char *code_of(const char *text)
{
    size_t n = strlen(text);
    char *out = malloc(n + 1);
    assert_non_null(out);
    int line_start = 1;
    for (size_t i = 0; i < n;) {
        char ch = text[i];
        if (line_start && (ch == ' ' || ch == '\t')) {
            out[i] = ch;
            i++;
            continue;
        }
        if (line_start && ch == '#') {
            /* The directive and its continuation lines. */
            while (i < n && text[i] != '\n') {
                if (text[i] == '\\' && i + 1 < n && text[i + 1] == '\n') {
                    out[i++] = ' ';
                    out[i++] = '\n';
                    continue;
                }
                out[i++] = ' ';
            }
            continue;
        }
        line_start = 0;
        if (ch == '/' && i + 1 < n && text[i + 1] == '*') {
            size_t end = i + 2;
            while (end + 1 < n && !(text[end] == '*' && text[end + 1] == '/'))
                end++;
            end = end + 2 <= n ? end + 2 : n;
            for (; i < end; i++)
                out[i] = text[i] == '\n' ? '\n' : ' ';
            continue;
        }
        if (ch == '/' && i + 1 < n && text[i + 1] == '/') {
            while (i < n && text[i] != '\n')
                out[i++] = ' ';
            continue;
        }
        if (ch == '"' || ch == '\'') {
            out[i++] = ' ';
            while (i < n && text[i] != ch && text[i] != '\n') {
                if (text[i] == '\\' && i + 1 < n)
                    out[i++] = ' ';
                out[i++] = ' ';
            }
            if (i < n && text[i] == ch)
                out[i++] = ' ';
            continue;
        }
        if (ch == '\n')
            line_start = 1;
        out[i++] = ch;
    }
    out[n] = '\0';
    return out;
}

/* One token of code: an identifier or number, or one punctuation mark. */
typedef struct token {
    const char *at;
    size_t len;
} token;

static int is_word(const token *t)
{
    return t->len && (isalnum((unsigned char)t->at[0]) || t->at[0] == '_');
}

static int token_is(const token *t, const char *s)
{
    return t->len == strlen(s) && memcmp(t->at, s, t->len) == 0;
}

/* The tokens of `code`; *count set. A new array. */
static token *tokens_of(const char *code, size_t *count)
{
    size_t cap = 1024, n = 0;
    token *t = malloc(cap * sizeof *t);
    assert_non_null(t);
    for (const char *p = code; *p;) {
        if (isspace((unsigned char)*p)) {
            p++;
            continue;
        }
        const char *start = p;
        if (isalnum((unsigned char)*p) || *p == '_')
            while (isalnum((unsigned char)*p) || *p == '_')
                p++;
        else
            p++;
        if (n == cap) {
            cap *= 2;
            token *grown = realloc(t, cap * sizeof *t);
            assert_non_null(grown);
            t = grown;
        }
        t[n].at = start;
        t[n].len = (size_t)(p - start);
        n++;
    }
    *count = n;
    return t;
}

/* A brace being scanned: a struct or union body gathers its mutex
 * fields until its name is known at its end. */
typedef struct frame {
    int is_struct;
    char tag[NAME_MAX_LEN];
    char fields[32][NAME_MAX_LEN];
    size_t nfields;
} frame;

#define MAX_DEPTH 32

/* Copies a name that must fit (the test fails on a longer one). */
static void copy_name(char *dst, const char *src)
{
    size_t n = strlen(src);
    assert_true(n < NAME_MAX_LEN);
    memcpy(dst, src, n + 1);
}

static void add_lock(lock_set *set, const char *name, const char *file,
                     int global)
{
    assert_true(set->count < MAX_LOCKS);
    lock_decl *d = &set->items[set->count++];
    copy_name(d->name, name);
    snprintf(d->file, sizeof d->file, "%s", file);
    d->global = global;
}

static void frame_add(frame *f, const char *name)
{
    assert_true(f->nfields < sizeof f->fields / sizeof f->fields[0]);
    copy_name(f->fields[f->nfields++], name);
}

/* Whether token i starts a declaration: it follows the end of one, a
 * brace, or only storage and qualifier words that do. */
static int starts_declaration(const token *t, size_t i)
{
    while (i > 0) {
        const token *prev = &t[i - 1];
        if (token_is(prev, ";") || token_is(prev, "{") || token_is(prev, "}"))
            return 1;
        if (!(token_is(prev, "static") || token_is(prev, "extern") ||
              token_is(prev, "volatile") || token_is(prev, "_Thread_local") ||
              token_is(prev, "__thread")))
            return 0;
        i--;
    }
    return 1;
}

/* The names a declaration at token i (the type) declares, pointers left
 * out; each passed to `out` with the frame it is in. Returns the token
 * after the declaration. */
static size_t declared_names(const token *t, size_t n, size_t i, frame *in,
                             lock_set *set, const char *file)
{
    i++; /* past the type */
    while (i < n) {
        int pointer = 0;
        while (i < n && token_is(&t[i], "*")) {
            pointer = 1;
            i++;
        }
        if (i >= n || !is_word(&t[i]))
            return i;
        char name[NAME_MAX_LEN];
        snprintf(name, sizeof name, "%.*s", (int)t[i].len, t[i].at);
        if (!pointer) {
            if (in)
                frame_add(in, name);
            else
                add_lock(set, name, file, 1);
        }
        /* To the next declarator or the end: over an array's size, an
         * initializer, attribute macros' arguments. */
        int depth = 0;
        for (i++; i < n; i++) {
            if (token_is(&t[i], "(") || token_is(&t[i], "[") ||
                token_is(&t[i], "{"))
                depth++;
            else if (token_is(&t[i], ")") || token_is(&t[i], "]") ||
                     token_is(&t[i], "}"))
                depth--;
            else if (depth == 0 &&
                     (token_is(&t[i], ",") || token_is(&t[i], ";")))
                break;
        }
        if (i >= n || token_is(&t[i], ";"))
            return i;
        i++; /* past the comma */
    }
    return i;
}

/* Adds the mutexes that the C text `text` (of `file`) declares. */
static void scan_text(const char *text, const char *file, lock_set *set)
{
    char *code = code_of(text);
    size_t n = 0;
    token *t = tokens_of(code, &n);
    static frame frames[MAX_DEPTH];
    size_t depth = 0;
    for (size_t i = 0; i < n; i++) {
        if (token_is(&t[i], "{")) {
            assert_true(depth < MAX_DEPTH);
            frame *f = &frames[depth++];
            memset(f, 0, sizeof *f);
            /* "struct tag {" or "struct {" (also with attributes between,
             * as "struct CUBE_CAPABILITY(...) name {"). */
            size_t k = i;
            if (k > 0 && token_is(&t[k - 1], ")"))
                k = 0; /* a function's body or a compound literal */
            while (k > 0 && (is_word(&t[k - 1]) || token_is(&t[k - 1], ")"))) {
                if (token_is(&t[k - 1], ")")) {
                    int d = 0;
                    do {
                        k--;
                        if (token_is(&t[k], ")"))
                            d++;
                        else if (token_is(&t[k], "("))
                            d--;
                    } while (k > 0 && d > 0);
                    continue;
                }
                k--;
                if (token_is(&t[k], "struct") || token_is(&t[k], "union")) {
                    f->is_struct = 1;
                    if (k + 1 < i && is_word(&t[k + 1]))
                        snprintf(f->tag, sizeof f->tag, "%.*s",
                                 (int)t[k + 1].len, t[k + 1].at);
                    break;
                }
            }
            continue;
        }
        if (token_is(&t[i], "}")) {
            if (!depth)
                continue;
            frame *f = &frames[--depth];
            if (!f->is_struct || !f->nfields)
                continue;
            frame *parent = depth && frames[depth - 1].is_struct
                                ? &frames[depth - 1]
                                : NULL;
            /* Nested: the member's name; else the tag, or the typedef's
             * name for a struct without one. */
            char name[NAME_MAX_LEN] = "";
            if ((parent || !f->tag[0]) && i + 1 < n && is_word(&t[i + 1]))
                snprintf(name, sizeof name, "%.*s", (int)t[i + 1].len,
                         t[i + 1].at);
            else
                snprintf(name, sizeof name, "%s", f->tag);
            if (!name[0])
                snprintf(name, sizeof name, "(unnamed struct)");
            for (size_t j = 0; j < f->nfields; j++) {
                char full[NAME_MAX_LEN * 2 + 2];
                snprintf(full, sizeof full, "%s.%s", name, f->fields[j]);
                if (parent)
                    frame_add(parent, full);
                else
                    add_lock(set, full, file, 0);
            }
            continue;
        }
        if ((token_is(&t[i], "cube_mutex") ||
             token_is(&t[i], "pthread_mutex_t")) &&
            starts_declaration(t, i)) {
            frame *in = depth && frames[depth - 1].is_struct
                            ? &frames[depth - 1]
                            : NULL;
            i = declared_names(t, n, i, in, set, file);
        }
    }
    free(t);
    free(code);
}

static int has_suffix(const char *s, const char *suffix)
{
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && strcmp(s + a - b, suffix) == 0;
}

/* Adds the mutexes of every .c and .h file under `dir` (`rel` its path
 * below src/, "" at the top). */
static void scan_tree(const char *dir, const char *rel, lock_set *set)
{
    DIR *d = opendir(dir);
    assert_non_null(d);
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.')
            continue;
        char path[1024], sub[512];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        snprintf(sub, sizeof sub, "%s%s%s", rel, *rel ? "/" : "", e->d_name);
        struct stat st;
        assert_int_equal(stat(path, &st), 0);
        if (S_ISDIR(st.st_mode)) {
            scan_tree(path, sub, set);
        } else if ((has_suffix(sub, ".c") || has_suffix(sub, ".h")) &&
                   strcmp(sub, MUTEX_HEADER) != 0) {
            char *text = read_text(path);
            scan_text(text, sub, set);
            free(text);
        }
    }
    closedir(d);
}

/* --- the table ------------------------------------------------------------ */

typedef struct lock_row {
    char name[NAME_MAX_LEN];
    long level;
} lock_row;

typedef struct row_set {
    lock_row items[MAX_LOCKS];
    size_t count;
    int problems; /* rows that could not be read */
} row_set;

/* A lock's name: a C identifier, or identifiers joined by dots. */
static int is_lock_name(const char *s, size_t n)
{
    int want_start = 1;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (c == '.') {
            if (want_start)
                return 0;
            want_start = 1;
        } else if (isalpha((unsigned char)c) || c == '_' ||
                   (!want_start && isdigit((unsigned char)c))) {
            want_start = 0;
        } else {
            return 0;
        }
    }
    return n > 0 && !want_start;
}

/* The rows of the lock table in `doc`: | level | `name` ... | ... |. */
static void table_rows(const char *doc, row_set *rows)
{
    memset(rows, 0, sizeof *rows);
    const char *p = strstr(doc, LOCK_SECTION);
    if (!p) {
        print_message("threading.md: no section '%.*s'\n",
                      (int)strlen(LOCK_SECTION) - 5, LOCK_SECTION + 4);
        rows->problems++;
        return;
    }
    const char *end = strstr(p + 1, "\n## ");
    if (!end)
        end = p + strlen(p);
    for (p = strstr(p, "\n| "); p && p < end; p = strstr(p, "\n| ")) {
        p += 3;
        const char *eol = strchr(p, '\n');
        if (!eol)
            eol = p + strlen(p);
        char *after = NULL;
        long level = strtol(p, &after, 10);
        if (after == p || *after != ' ')
            continue; /* the header or its rule */
        /* The second cell is the name alone, in backquotes. */
        const char *cell = memchr(p, '|', (size_t)(eol - p));
        const char *cell_end =
            cell ? memchr(cell + 1, '|', (size_t)(eol - cell - 1)) : NULL;
        const char *q1 = cell ? cell + 1 : NULL;
        const char *q2 = cell_end ? cell_end : NULL;
        while (q1 && q1 < q2 && *q1 == ' ')
            q1++;
        while (q2 && q2 > q1 && q2[-1] == ' ')
            q2--;
        if (!cell_end || q2 - q1 < 3 || *q1 != '`' || q2[-1] != '`' ||
            !is_lock_name(q1 + 1, (size_t)(q2 - q1 - 2)) ||
            rows->count == MAX_LOCKS) {
            print_message("threading.md: a lock row whose second cell is not "
                          "one lock's name in backquotes: %.*s\n",
                          (int)(eol - p), p);
            rows->problems++;
            p = eol;
            continue;
        }
        lock_row *r = &rows->items[rows->count++];
        snprintf(r->name, sizeof r->name, "%.*s", (int)(q2 - q1 - 2), q1 + 1);
        r->level = level;
        p = eol;
    }
}

/* --- the checks ----------------------------------------------------------- */

/* `set` against the table of `doc`. Returns the number of problems, each
 * printed. */
static int check_locks(const lock_set *set, const char *doc)
{
    row_set *rows = malloc(sizeof *rows);
    assert_non_null(rows);
    table_rows(doc, rows);
    int problems = rows->problems;
    if (!rows->count) {
        print_message("threading.md: the lock table has no rows\n");
        problems++;
    }
    for (size_t i = 0; i < rows->count; i++) {
        const lock_row *r = &rows->items[i];
        if (i && r->level < rows->items[i - 1].level) {
            print_message("threading.md: `%s` (%ld) comes after a lock of "
                          "level %ld: the table lists the order top down\n",
                          r->name, r->level, rows->items[i - 1].level);
            problems++;
        }
        for (size_t j = 0; j < i; j++)
            if (strcmp(rows->items[j].name, r->name) == 0) {
                print_message("threading.md: `%s` has two rows\n", r->name);
                problems++;
            }
        size_t found = 0;
        for (size_t k = 0; k < set->count; k++)
            found += strcmp(set->items[k].name, r->name) == 0;
        if (!found) {
            print_message("threading.md: `%s` names no mutex in src/ (renamed "
                          "or removed?)\n",
                          r->name);
            problems++;
        }
    }
    for (size_t k = 0; k < set->count; k++) {
        const lock_decl *d = &set->items[k];
        int first = 1;
        for (size_t j = 0; j < k && first; j++)
            if (strcmp(set->items[j].name, d->name) == 0)
                first = 0;
        if (!first) {
            print_message("src/%s: a second mutex named `%s`: name it apart "
                          "(the lock table could not tell them apart)\n",
                          d->file, d->name);
            problems++;
            continue;
        }
        int row = 0;
        for (size_t i = 0; i < rows->count && !row; i++)
            row = strcmp(rows->items[i].name, d->name) == 0;
        if (!row) {
            print_message("src/%s: mutex `%s` has no row in the lock table of "
                          "docs/threading.md\n",
                          d->file, d->name);
            problems++;
        }
    }
    free(rows);
    return problems;
}

static int has_lock(const lock_set *set, const char *name)
{
    for (size_t k = 0; k < set->count; k++)
        if (strcmp(set->items[k].name, name) == 0)
            return 1;
    return 0;
}

/* --- tests ---------------------------------------------------------------- */

static void test_every_lock_has_its_row(void **state)
{
    (void)state;
    lock_set *set = calloc(1, sizeof *set);
    assert_non_null(set);
    scan_tree(CUBE_SOURCE_DIR "/src", "", set);
    /* The scan sees the locks it must: one of each kind of declaration. */
    assert_true(has_lock(set, "cube_client.handles_lock")); /* struct field */
    assert_true(has_lock(set, "core_stream.lock")); /* typedef'd struct */
    assert_true(has_lock(set, "registry_lock"));    /* a static global */
    assert_true(set->count >= 36);
    char *doc = read_text(THREADING_DOC);
    assert_int_equal(check_locks(set, doc), 0);
    free(doc);
    free(set);
}

/* The scanner names each kind of declaration as a row would, and counts
 * no pointer, parameter, comment or string. */
static void test_scanner_names(void **state)
{
    (void)state;
    static const char text[] =
        "#define M(x) cube_mutex x;\n"
        "/* cube_mutex in_comment; */\n"
        "static const char *s = \"cube_mutex in_string;\";\n"
        "struct outer {\n"
        "    int n;\n"
        "    cube_mutex lock, other_lock;\n"
        "    cube_mutex *borrowed;\n"
        "    struct { cube_mutex lock; int x; } part;\n"
        "    pthread_mutex_t raw CUBE_GUARDED_FIELD(x);\n"
        "};\n"
        "typedef struct { cube_mutex m; } no_tag;\n"
        "typedef struct tagged { cube_mutex m; } tagged_t;\n"
        "static cube_mutex global_lock = CUBE_MUTEX_INIT;\n"
        "static pthread_mutex_t raw_global = PTHREAD_MUTEX_INITIALIZER;\n"
        "void f(cube_mutex *mu) { cube_mutex_lock(mu); }\n"
        "static inline void g(void) CUBE_REQUIRES(m) { int cube_mutex_x; }\n";
    static const char *const expected[] = {
        "outer.lock", "outer.other_lock", "outer.part.lock", "outer.raw",
        "no_tag.m",   "tagged.m",         "global_lock",     "raw_global",
    };
    lock_set *set = calloc(1, sizeof *set);
    assert_non_null(set);
    scan_text(text, "sample.c", set);
    for (size_t i = 0; i < set->count; i++)
        print_message("scanned: %s\n", set->items[i].name);
    assert_int_equal(set->count, sizeof expected / sizeof expected[0]);
    for (size_t i = 0; i < sizeof expected / sizeof expected[0]; i++)
        if (!has_lock(set, expected[i]))
            fail_msg("the scanner missed %s", expected[i]);
    free(set);
}

/* The checker catches each kind of mistake on doctored text. */
static void test_checker_catches_mistakes(void **state)
{
    (void)state;
    lock_set *set = calloc(1, sizeof *set);
    assert_non_null(set);
    scan_tree(CUBE_SOURCE_DIR "/src", "", set);
    char *doc = read_text(THREADING_DOC);

    /* A new mutex without its row. */
    lock_set *more = malloc(sizeof *more);
    assert_non_null(more);
    *more = *set;
    scan_text("struct cube_client { cube_mutex new_lock; };", "new.c", more);
    assert_int_equal(check_locks(more, doc), 1);

    /* A mutex renamed in the code: its row names nothing, and the new
     * name has no row. */
    *more = *set;
    for (size_t k = 0; k < more->count; k++)
        if (strcmp(more->items[k].name, "cube_client.graphs_lock") == 0)
            snprintf(more->items[k].name, NAME_MAX_LEN,
                     "cube_client.graph_lock");
    assert_int_equal(check_locks(more, doc), 2);

    /* Two globals of one name. */
    *more = *set;
    scan_text("static cube_mutex registry_lock;", "again.c", more);
    assert_int_equal(check_locks(more, doc), 1);
    free(more);

    /* A row twice; a row out of order; a row without a name. */
    char *bad = edited(doc, "| `cube_client.graphs_lock` |",
                       "| `cube_client.futures_lock` |");
    assert_true(check_locks(set, bad) >= 2); /* twice, and graphs_lock's */
    free(bad);
    bad = edited(doc, "\n| 0 | `registry_lock`", "\n| 9 | `registry_lock`");
    assert_int_equal(check_locks(set, bad), 1);
    free(bad);
    bad = edited(doc, "| `cube_client.snapshot_lock` |", "| the snapshot's |");
    assert_int_equal(check_locks(set, bad), 2); /* unreadable, and no row */
    free(bad);
    assert_true(check_locks(set, "# no table\n") >= 1);

    free(doc);
    free(set);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_scanner_names),
        cmocka_unit_test(test_every_lock_has_its_row),
        cmocka_unit_test(test_checker_catches_mistakes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
