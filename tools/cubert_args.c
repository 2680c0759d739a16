/* The one argument parser of the `cubert` program: getopt_long over a
 * command's options, with the program's own messages and exit codes. */
#include <getopt.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "cubert_tool.h"

int cubert_usage_error(const char *command, const char *fmt, ...)
{
    /* "cubert demo: ..." for a command, "cubert: ..." for the program. */
    const char *sep = *command ? " " : "";
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "cubert%s%s: ", sep, command);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    /* One line: the help is one command away, not repeated here. */
    fprintf(stderr, "; see 'cubert%s%s --help'\n", sep, command);
    return EXIT_USAGE;
}

int cubert_args_stop(const cubert_args *a, int c)
{
    if (c != CUBERT_ARGS_HELP)
        return EXIT_USAGE;
    cubert_help(a->command, stdout);
    return 0;
}

/* Reports `word` (--name or --name=value) as a prefix of several long
 * options, naming them; returns 0 when it is not one. */
static int report_ambiguous(const cubert_args *a, const char *word)
{
    const char *name = word + 2;
    size_t len = strcspn(name, "=");
    char list[256] = "";
    size_t used = 0;
    int matches = 0;
    for (const struct option *o = a->options; o->name; o++) {
        if (strncmp(o->name, name, len) != 0)
            continue;
        int n = snprintf(list + used, sizeof list - used, "%s--%s",
                         matches ? ", " : "", o->name);
        if (n > 0 && (size_t)n < sizeof list - used)
            used += (size_t)n;
        matches++;
    }
    if (matches < 2)
        return 0;
    cubert_usage_error(a->command, "option '--%.*s' is ambiguous (%s)",
                       (int)len, name, list);
    return 1;
}

int cubert_args_next(cubert_args *a)
{
    if (!a->started) {
        /* 0 makes glibc start over: each command parses its own argv. */
        optind = 0;
        opterr = 0;
        a->started = 1;
    }
    a->value = NULL;
    /* '+': stop at the first operand (no command takes one, so it is an
     * error below); ':': tell a missing value from an unknown option. */
    int c = getopt_long(a->argc, a->argv, "+:h", a->options, NULL);
    if (c == -1) {
        a->rest = optind;
        if (optind < a->argc && !a->operands) {
            cubert_usage_error(a->command, "unexpected argument '%s'",
                               a->argv[optind]);
            return CUBERT_ARGS_USAGE;
        }
        return CUBERT_ARGS_END;
    }
    if (c == 'h')
        return CUBERT_ARGS_HELP;
    /* getopt_long has already stepped past the offending word. */
    const char *word =
        optind > 0 && optind <= a->argc ? a->argv[optind - 1] : "?";
    if (c == ':') {
        cubert_usage_error(a->command, "%s needs a value", word);
        return CUBERT_ARGS_USAGE;
    }
    if (c == '?') {
        /* A short option's letter is in optopt; the word holds more (an
         * unknown long option, or `-x` bundled with others). */
        const char *eq = strchr(word, '=');
        if (optopt && word[0] == '-' && word[1] != '-')
            cubert_usage_error(a->command, "unknown option '-%c'", optopt);
        else if (optopt && eq && word[1] == '-')
            cubert_usage_error(a->command, "%.*s takes no value",
                               (int)(eq - word), word);
        else if (word[0] != '-' || word[1] != '-' || !report_ambiguous(a, word))
            cubert_usage_error(a->command, "unknown option '%s'", word);
        return CUBERT_ARGS_USAGE;
    }
    a->value = optarg;
    return c;
}
