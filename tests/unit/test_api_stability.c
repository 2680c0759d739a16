/* Keeps the promise of CHANGELOG.md: within a major version the C API and
 * ABI only grow. The public API as built now is compared with the list
 * committed in tests/api/public_api.txt:
 *  - "symbol": every symbol libcubert.so exports (its ELF dynamic symbol
 *    table, read here);
 *  - "function": the prototype of every function declared with CUBE_API
 *    under include/cubert/ (backend/ included: those symbols are
 *    exported too);
 *  - "type", "macro" and "inline": the types, constants and static
 *    inline functions of the headers in include/cubert/ itself.
 * Declarations are normalised (comments, preprocessor conditionals and
 * spacing dropped) so that only a change of the text the compiler sees
 * counts. Anything removed or changed fails, saying how to proceed; an
 * addition fails too, so that the list stays exact and every new
 * function reaches CHANGELOG.md's "Added".
 *
 * `test_api_stability --write` rewrites the list from the tree (the
 * public_api_list target of the build runs it). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <dirent.h>
#include <elf.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cubert/export.h>

#define HEADERS CUBE_SOURCE_DIR "/include/cubert"
#define LIST_PATH CUBE_SOURCE_DIR "/tests/api/public_api.txt"
/* The same command for the build this test belongs to. */
#define REGENERATE_HERE                                                        \
    "cmake --build " CUBE_BUILD_DIR " --target public_api_list"

/* fail_msg, for paths that must not go on (cmocka jumps out of the test,
 * or exits outside one, so the abort is never reached). */
#define STOP(...)                                                              \
    do {                                                                       \
        fail_msg(__VA_ARGS__);                                                 \
        abort();                                                               \
    } while (0)

static const char *const list_header[] = {
    "# The public API of cubert, as tests/unit/test_api_stability.c reads",
    "# it: every symbol libcubert.so exports (\"symbol\"), the prototype of",
    "# every function declared with CUBE_API under include/cubert/",
    "# (\"function\"), and the types, constants and inline functions of",
    "# include/cubert/*.h (\"type\", \"macro\", \"inline\"), normalised:",
    "# comments, preprocessor conditionals and spacing dropped. The test",
    "# fails on any difference: a removal or a change can break programs",
    "# built against an earlier release, and an addition belongs under",
    "# \"Added\" in CHANGELOG.md.",
    "#",
    "# Regenerate it after a deliberate change and its CHANGELOG.md line:",
    "#   cmake --build <build> --target public_api_list",
    "# (or <build>/tests/test_api_stability --write). Generated: do not",
    "# edit by hand.",
    "#",
    "# Left out: the CUBE_VERSION_* macros (they change with every release)",
    "# and the types of include/cubert/backend/ (the contract between the",
    "# core and the backends built with it, not an interface for programs).",
};

/* ------------------------------------------------------------ lines */

typedef struct lines {
    char **at;
    size_t count, cap;
} lines;

static void lines_add(lines *l, char *line)
{
    if (l->count == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 256;
        char **grown = realloc(l->at, cap * sizeof *grown);
        if (!grown)
            STOP("out of memory");
        l->at = grown;
        l->cap = cap;
    }
    l->at[l->count++] = line;
}

static char *text_printf(const char *fmt, ...) CUBE_PRINTF(1, 2);

static char *text_printf(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    char *out = malloc((size_t)n + 1);
    if (!out)
        STOP("out of memory");
    va_start(ap, fmt);
    vsnprintf(out, (size_t)n + 1, fmt, ap);
    va_end(ap);
    return out;
}

static int compare_text(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static void lines_sort(lines *l)
{
    if (l->count)
        qsort(l->at, l->count, sizeof *l->at, compare_text);
}

static void lines_free(lines *l)
{
    for (size_t i = 0; i < l->count; i++)
        free(l->at[i]);
    free(l->at);
    memset(l, 0, sizeof *l);
}

/* The entries of one kind ("symbol ", "function ", ...) of `all`. */
static lines lines_of_kind(const lines *all, const char *kind)
{
    lines out = {0};
    size_t n = strlen(kind);
    for (size_t i = 0; i < all->count; i++)
        if (strncmp(all->at[i], kind, n) == 0)
            lines_add(&out, text_printf("%s", all->at[i]));
    return out;
}

/* An entry's key: its kind and name, the first two words. */
static size_t key_length(const char *entry)
{
    const char *space = strchr(entry, ' ');
    if (!space)
        return strlen(entry);
    const char *end = space + 1 + strcspn(space + 1, " ");
    return (size_t)(end - entry);
}

static int same_key(const char *a, const char *b)
{
    size_t n = key_length(a);
    return n == key_length(b) && strncmp(a, b, n) == 0;
}

/* The whole of `path` with a NUL after it (malloc'd; its length in
 * *size when size is not NULL), or NULL when it cannot be opened. */
static char *read_file(const char *path, size_t *size)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    long len = fseek(f, 0, SEEK_END) == 0 ? ftell(f) : -1;
    char *data = len >= 0 ? malloc((size_t)len + 1) : NULL;
    int whole = data && fseek(f, 0, SEEK_SET) == 0 &&
                fread(data, 1, (size_t)len, f) == (size_t)len;
    fclose(f);
    if (!whole) {
        free(data);
        STOP("cannot read '%s'", path);
    }
    data[len] = '\0';
    if (size)
        *size = (size_t)len;
    return data;
}

/* ------------------------------------------------ the exported symbols */

/* The symbols `path` (an ELF shared object of this machine's class)
 * defines in its dynamic symbol table with global or weak binding and
 * default or protected visibility: what a program can link against. */
static void exported_symbols(const char *path, lines *out)
{
    size_t size = 0;
    unsigned char *elf = (unsigned char *)read_file(path, &size);
    if (!elf)
        STOP("cannot read the shared library '%s'", path);
    const Elf64_Ehdr *eh = (const Elf64_Ehdr *)elf;
    if (size < sizeof *eh || memcmp(eh->e_ident, ELFMAG, SELFMAG) != 0 ||
        eh->e_ident[EI_CLASS] != ELFCLASS64)
        STOP("'%s' is not a 64-bit ELF file", path);
    if (eh->e_shentsize != sizeof(Elf64_Shdr) || eh->e_shoff > size ||
        (size - eh->e_shoff) / sizeof(Elf64_Shdr) < eh->e_shnum)
        STOP("'%s': section headers out of the file", path);
    const Elf64_Shdr *sh = (const Elf64_Shdr *)(elf + eh->e_shoff);
    int found = 0;
    for (unsigned i = 0; i < eh->e_shnum; i++) {
        if (sh[i].sh_type != SHT_DYNSYM)
            continue;
        found = 1;
        const Elf64_Shdr *sym = &sh[i];
        if (sym->sh_link >= eh->e_shnum)
            STOP("'%s': the dynamic symbols name no string table", path);
        const Elf64_Shdr *str = &sh[sym->sh_link];
        if (sym->sh_offset > size || sym->sh_size > size - sym->sh_offset ||
            str->sh_offset > size || str->sh_size > size - str->sh_offset ||
            sym->sh_entsize != sizeof(Elf64_Sym))
            STOP("'%s': the dynamic symbols are out of the file", path);
        const Elf64_Sym *s = (const Elf64_Sym *)(elf + sym->sh_offset);
        const char *names = (const char *)(elf + str->sh_offset);
        size_t n = sym->sh_size / sizeof(Elf64_Sym);
        for (size_t k = 1; k < n; k++) {
            unsigned bind = ELF64_ST_BIND(s[k].st_info);
            unsigned vis = ELF64_ST_VISIBILITY(s[k].st_other);
            if (s[k].st_shndx == SHN_UNDEF ||
                (bind != STB_GLOBAL && bind != STB_WEAK &&
                 bind != STB_GNU_UNIQUE) ||
                (vis != STV_DEFAULT && vis != STV_PROTECTED))
                continue;
            if (s[k].st_name >= str->sh_size ||
                !memchr(names + s[k].st_name, '\0',
                        str->sh_size - s[k].st_name))
                STOP("'%s': a symbol name out of its table", path);
            lines_add(out, text_printf("symbol %s", names + s[k].st_name));
        }
    }
    free(elf);
    if (!found)
        STOP("'%s' has no dynamic symbol table", path);
}

/* ------------------------------------------------ the public headers */

/* `text` without its comments (each replaced by a space), string and
 * character literals kept as they are. */
static void strip_comments(char *text)
{
    char *w = text;
    for (const char *r = text; *r;) {
        if (r[0] == '/' && r[1] == '*') {
            const char *end = strstr(r + 2, "*/");
            r = end ? end + 2 : r + strlen(r);
            *w++ = ' ';
        } else if (r[0] == '/' && r[1] == '/') {
            r += strcspn(r, "\n");
            *w++ = ' ';
        } else if (*r == '"' || *r == '\'') {
            char quote = *r;
            *w++ = *r++;
            while (*r && *r != quote) {
                if (*r == '\\' && r[1])
                    *w++ = *r++;
                *w++ = *r++;
            }
            if (*r)
                *w++ = *r++;
        } else {
            *w++ = *r++;
        }
    }
    *w = '\0';
}

static int is_word_char(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
           (c >= '0' && c <= '9') || c == '_';
}

static int is_blank(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' ||
           c == '\v';
}

/* The tokens of `text` joined by single spaces, none inside parentheses
 * and brackets, before ",;)]", after "*" before a name or another "*",
 * or between a name or ")" and a "(" or "[": one spelling for one
 * declaration, however it was laid out. */
static char *normalise(const char *text)
{
    size_t cap = 2 * strlen(text) + 1, len = 0;
    char *out = malloc(cap);
    if (!out)
        STOP("out of memory");
    char prev[64] = "";
    const char *p = text;
    for (;;) {
        while (is_blank(*p))
            p++;
        if (!*p)
            break;
        const char *start = p;
        if (is_word_char(*p)) {
            while (is_word_char(*p) || *p == '.')
                p++;
        } else if (*p == '"' || *p == '\'') {
            char quote = *p++;
            while (*p && *p != quote)
                p += (*p == '\\' && p[1]) ? 2 : 1;
            if (*p)
                p++;
        } else if (strncmp(p, "...", 3) == 0) {
            p += 3;
        } else if (strncmp(p, "<<", 2) == 0 || strncmp(p, ">>", 2) == 0 ||
                   strncmp(p, "->", 2) == 0) {
            p += 2;
        } else {
            p++;
        }
        size_t n = (size_t)(p - start);
        char first = *start;
        int word = is_word_char(first);
        int prev_word = is_word_char(prev[0]);
        int space = len > 0;
        if (strchr(",;)]", first) && n == 1)
            space = 0;
        if ((strcmp(prev, "(") == 0 || strcmp(prev, "[") == 0))
            space = 0;
        if (strcmp(prev, "*") == 0 && (word || first == '*'))
            space = 0;
        if ((prev_word || strcmp(prev, ")") == 0) && n == 1 &&
            (first == '(' || first == '['))
            space = 0;
        if (space)
            out[len++] = ' ';
        memcpy(out + len, start, n);
        len += n;
        snprintf(prev, sizeof prev, "%.*s", (int)(n < 63 ? n : 63), start);
    }
    out[len] = '\0';
    return out;
}

/* The length of the name at `p` (0 when no name starts there). */
static size_t name_length(const char *p)
{
    size_t n = 0;
    while (is_word_char(p[n]))
        n++;
    return n;
}

/* The name a normalised declaration declares, written into `name`
 * (empty when it cannot tell): a function's, before its parameters; a
 * typedef's, its last name outside braces and brackets, or the (*name)
 * of a function pointer; a struct's, union's or enum's tag, and an
 * anonymous enum's first enumerator ("enum:FIRST"). */
static void declared_name(const char *decl, char *name, size_t cap)
{
    name[0] = '\0';
    int is_function =
        strncmp(decl, "CUBE_API ", 9) == 0 || strncmp(decl, "static ", 7) == 0;
    if (!is_function && strncmp(decl, "typedef ", 8) != 0) {
        const char *tag = decl + strcspn(decl, " ") + 1;
        if (strncmp(decl, "struct ", 7) != 0 &&
            strncmp(decl, "union ", 6) != 0 && strncmp(decl, "enum ", 5) != 0)
            return;
        if (*tag == '{' && strncmp(decl, "enum ", 5) == 0) {
            const char *first = tag + 1 + strspn(tag + 1, " ");
            snprintf(name, cap, "enum:%.*s", (int)name_length(first), first);
        } else {
            snprintf(name, cap, "%.*s", (int)name_length(tag), tag);
        }
        return;
    }
    int depth = 0;
    const char *last = NULL;
    for (const char *p = decl; *p;) {
        if (*p == '{' || *p == '[') {
            depth++;
        } else if (*p == '}' || *p == ']') {
            depth--;
        } else if (depth == 0 && *p == '(') {
            if (is_function)
                break;
            if (p[1] == '*') { /* typedef R (*name)(...) */
                last = p + 2;
                break;
            }
        } else if (is_word_char(*p)) {
            if (depth == 0)
                last = p;
            p += name_length(p);
            continue;
        }
        p++;
    }
    if (last)
        snprintf(name, cap, "%.*s", (int)name_length(last), last);
}

/* The entry of "#define" `rest` (what follows the word define), if it is
 * a constant of the API: not an include guard (no value), not
 * CUBE_VERSION_* (they change with every release). */
static void macro_entry(const char *rest, const char *file, lines *out)
{
    const char *name = rest + strspn(rest, " \t");
    size_t n = name_length(name);
    const char *value = name + n;
    if (*value == '(') /* a function-like macro: its parameters count */
        value += strcspn(value, ")") + (value[strcspn(value, ")")] ? 1 : 0);
    char *norm = normalise(value);
    if (*norm && strncmp(name, "CUBE_VERSION_", 13) != 0)
        lines_add(out, text_printf("macro %.*s %s: %.*s%s%s", (int)n, name,
                                   file, (int)(value - name - (long)n),
                                   name + n, name[n] == '(' ? " " : "", norm));
    free(norm);
}

/* Adds the declarations of one header: `file` ("client.h",
 * "backend/server.h"); `functions_only` for the backend headers. */
static void header_entries(const char *file, int functions_only, lines *out)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", HEADERS, file);
    char *text = read_file(path, NULL);
    if (!text)
        STOP("cannot read '%s'", path);
    strip_comments(text);

    /* Logical lines: directives apart, the rest gathered as declarations
     * of the header's top level (inside its include guard only). */
    size_t cap = strlen(text) + 1, len = 0;
    char *decls = calloc(cap, 1);
    if (!decls)
        STOP("out of memory");
    int depth = 0;
    for (char *line = text; *line;) {
        char *end = line + strcspn(line, "\n");
        /* Join continued lines. */
        while (end > line && *end == '\n' && end[-1] == '\\') {
            end[-1] = ' ';
            *end = ' ';
            end += strcspn(end, "\n");
        }
        char *next = *end ? end + 1 : end;
        *end = '\0';
        char *s = line;
        while (is_blank(*s))
            s++;
        if (*s == '#') {
            s++;
            while (is_blank(*s))
                s++;
            if (strncmp(s, "if", 2) == 0) {
                depth++;
            } else if (strncmp(s, "endif", 5) == 0) {
                depth--;
            } else if (strncmp(s, "define", 6) == 0 && depth <= 1 &&
                       !functions_only) {
                macro_entry(s + 6, file, out);
            }
        } else if (depth <= 1) {
            size_t n = strlen(line);
            memcpy(decls + len, line, n);
            len += n;
            decls[len++] = '\n';
        }
        line = next;
    }
    decls[len] = '\0';

    /* Declarations end at a ';' outside braces and parentheses; a static
     * inline function's definition at its closing brace. */
    int nest = 0;
    char *start = decls;
    for (char *p = decls; *p; p++) {
        int end = 0;
        if (*p == '{' || *p == '(') {
            nest++;
        } else if (*p == '}' || *p == ')') {
            nest--;
            end = *p == '}' && nest == 0 &&
                  strncmp(start + strspn(start, " \n"), "static ", 7) == 0;
        } else {
            end = *p == ';' && nest == 0;
        }
        if (end) {
            /* The declaration: [start, p), and a definition's brace. */
            char *stop = *p == '}' ? p + 1 : p;
            char keep = *stop;
            *stop = '\0';
            char *norm = normalise(start);
            *stop = keep;
            start = p + 1;
            if (!*norm) {
                free(norm);
                continue;
            }
            int function = strncmp(norm, "CUBE_API ", 9) == 0;
            int inline_function = strncmp(norm, "static ", 7) == 0;
            if (functions_only && !function) {
                free(norm);
                continue;
            }
            char name[128];
            declared_name(norm, name, sizeof name);
            if (!name[0])
                STOP("%s: a declaration this test cannot name: '%s' "
                     "(teach declared_name its form)",
                     file, norm);
            lines_add(out, text_printf("%s %s %s: %s",
                                       function          ? "function"
                                       : inline_function ? "inline"
                                                         : "type",
                                       name, file, norm));
            free(norm);
        }
    }
    char *rest = normalise(start);
    if (*rest)
        STOP("%s: text after the last declaration: '%s'", file, rest);
    free(rest);
    free(decls);
    free(text);
}

static void headers_in(const char *folder, int functions_only, lines *out)
{
    char path[1024];
    snprintf(path, sizeof path, "%s%s%s", HEADERS, *folder ? "/" : "", folder);
    DIR *d = opendir(path);
    if (!d)
        STOP("cannot list '%s'", path);
    lines names = {0};
    for (struct dirent *e; (e = readdir(d));) {
        size_t n = strlen(e->d_name);
        if (n > 2 && strcmp(e->d_name + n - 2, ".h") == 0)
            lines_add(&names, text_printf("%s%s%s", folder, *folder ? "/" : "",
                                          e->d_name));
    }
    closedir(d);
    lines_sort(&names);
    for (size_t i = 0; i < names.count; i++)
        header_entries(names.at[i], functions_only, out);
    lines_free(&names);
}

/* Everything the tree offers now, sorted. */
static lines current_api(void)
{
    lines all = {0};
    exported_symbols(CUBE_SHARED_LIBRARY, &all);
    headers_in("", 0, &all);
    headers_in("backend", 1, &all);
    lines_sort(&all);
    return all;
}

static lines read_list(void)
{
    char *text = read_file(LIST_PATH, NULL);
    if (!text)
        STOP("cannot read '%s': make it with " REGENERATE_HERE, LIST_PATH);
    lines out = {0};
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n"))
        if (line[0] != '#' && line[0] != '\0')
            lines_add(&out, text_printf("%s", line));
    free(text);
    lines_sort(&out);
    return out;
}

/* ------------------------------------------------------------- tests */

/* Compares the entries of `kind` and fails naming each difference and
 * what to do about it. */
static void expect_as_listed(const char *kind)
{
    lines all = current_api(), listed_all = read_list();
    lines now = lines_of_kind(&all, kind),
          listed = lines_of_kind(&listed_all, kind);
    int broken = 0, added = 0;
    size_t i = 0, j = 0;
    while (i < listed.count || j < now.count) {
        int order = i == listed.count ? 1
                    : j == now.count  ? -1
                                      : strcmp(listed.at[i], now.at[j]);
        if (order == 0) {
            i++, j++;
        } else if (i < listed.count && j < now.count &&
                   same_key(listed.at[i], now.at[j])) {
            print_error("changed:\n    listed: %s\n    now:    %s\n",
                        listed.at[i], now.at[j]);
            broken++;
            i++, j++;
        } else if (order < 0) {
            print_error("removed: %s\n", listed.at[i++]);
            broken++;
        } else {
            print_error("added: %s\n", now.at[j++]);
            added++;
        }
    }
    if (broken)
        print_error(
            "A public %s was removed or changed: programs built against an "
            "earlier release may no longer build or run, and CHANGELOG.md "
            "promises that within a major version the C API and ABI only "
            "grow. Put it back if that was not meant. If it was, record it "
            "in CHANGELOG.md, under \"Changed\" with what callers must do "
            "(or under \"Added\" for a compatible change: a field appended "
            "to a struct that carries its own size, a new last enumerator, "
            "a renamed parameter), then regenerate the list: " REGENERATE_HERE
            "\n",
            kind);
    if (added)
        print_error("New public API (%s): add it to CHANGELOG.md under "
                    "\"Added\", then regenerate the list: " REGENERATE_HERE
                    "\n",
                    kind);
    size_t differences = (size_t)broken + (size_t)added;
    lines_free(&now);
    lines_free(&listed);
    lines_free(&all);
    lines_free(&listed_all);
    if (differences)
        STOP("%zu difference(s) from %s", differences, LIST_PATH);
}

/* One test per kind of entry; the state names the kind. */
static void test_entries_are_as_listed(void **state)
{
    expect_as_listed((const char *)*state);
}

/* Whether `entries` (sorted) has one of `kind` named `name`. */
static int has_entry(const lines *entries, const char *kind, const char *name)
{
    char *key = text_printf("%s %s", kind, name);
    int found = 0;
    for (size_t i = 0; i < entries->count && !found; i++)
        found = same_key(entries->at[i], key);
    free(key);
    return found;
}

/* Independent of the list: what the library exports and what the
 * headers declare with CUBE_API are the same set of names. */
static void
test_every_exported_symbol_is_declared_and_every_function_exported(void **state)
{
    (void)state;
    lines all = current_api();
    int missing = 0;
    for (size_t i = 0; i < all.count; i++) {
        char name[256];
        snprintf(name, sizeof name, "%.*s",
                 (int)(key_length(all.at[i]) - strcspn(all.at[i], " ") - 1),
                 all.at[i] + strcspn(all.at[i], " ") + 1);
        if (strncmp(all.at[i], "symbol ", 7) == 0 &&
            !has_entry(&all, "function", name)) {
            print_error("exported but declared with CUBE_API in no header "
                        "under include/cubert/: %s (declare it, or make it "
                        "static or hidden)\n",
                        name);
            missing++;
        } else if (strncmp(all.at[i], "function ", 9) == 0 &&
                   !has_entry(&all, "symbol", name)) {
            print_error("declared with CUBE_API but not exported by "
                        "libcubert.so: %s (define it, or check the version "
                        "script cmake/cubert.map)\n",
                        name);
            missing++;
        }
    }
    lines_free(&all);
    assert_int_equal(missing, 0);
}

/* --write: the list from the tree as it is. */
static int write_list(void)
{
    lines all = current_api();
    FILE *f = fopen(LIST_PATH, "w");
    if (!f) {
        fprintf(stderr, "cannot write '%s'\n", LIST_PATH);
        return 1;
    }
    for (size_t i = 0; i < sizeof list_header / sizeof list_header[0]; i++)
        fprintf(f, "%s\n", list_header[i]);
    for (size_t i = 0; i < all.count; i++)
        fprintf(f, "%s\n", all.at[i]);
    int failed = ferror(f) | fclose(f);
    printf("%s: %zu entries\n", LIST_PATH, all.count);
    lines_free(&all);
    return failed ? 1 : 0;
}

int main(int argc, char **argv)
{
    if (argc == 2 && strcmp(argv[1], "--write") == 0)
        return write_list();
    if (argc != 1) {
        fprintf(stderr, "usage: %s [--write]\n", argv[0]);
        return 2;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_prestate(test_entries_are_as_listed, "symbol"),
        cmocka_unit_test_prestate(test_entries_are_as_listed, "function"),
        cmocka_unit_test_prestate(test_entries_are_as_listed, "type"),
        cmocka_unit_test_prestate(test_entries_are_as_listed, "macro"),
        cmocka_unit_test_prestate(test_entries_are_as_listed, "inline"),
        cmocka_unit_test(
            test_every_exported_symbol_is_declared_and_every_function_exported),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
