/* The one argument parser of the `cubert` program: getopt_long over a
 * command's options, with the program's own messages and exit codes. */
#include <getopt.h>
#include <stdio.h>
#include <string.h>

#include "cubert_tool.h"

int cubert_args_next(cubert_args *a)
{
    if (!a->started) {
        /* 0 makes glibc start over: each command parses its own argv. */
        optind = 0;
        opterr = 0;
        a->started = 1;
    }
    a->value = NULL;
    /* "cubert demo: ..." for a command, "cubert: ..." for the program. */
    const char *sep = *a->command ? " " : "";
    /* '+': stop at the first operand (no command takes one, so it is an
     * error below); ':': tell a missing value from an unknown option. */
    int c = getopt_long(a->argc, a->argv, "+:h", a->options, NULL);
    if (c == -1) {
        a->rest = optind;
        if (optind < a->argc && !a->operands) {
            fprintf(stderr, "cubert%s%s: unexpected argument '%s'\n", sep,
                    a->command, a->argv[optind]);
            cubert_usage(stderr);
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
        fprintf(stderr, "cubert%s%s: %s needs a value\n", sep, a->command,
                word);
        cubert_usage(stderr);
        return CUBERT_ARGS_USAGE;
    }
    if (c == '?') {
        /* A short option's letter is in optopt; the word holds more (an
         * unknown long option, or `-x` bundled with others). */
        const char *eq = strchr(word, '=');
        if (optopt && word[0] == '-' && word[1] != '-')
            fprintf(stderr, "cubert%s%s: unknown option '-%c'\n", sep,
                    a->command, optopt);
        else if (optopt && eq && word[1] == '-')
            fprintf(stderr, "cubert%s%s: %.*s takes no value\n", sep,
                    a->command, (int)(eq - word), word);
        else
            fprintf(stderr, "cubert%s%s: unknown option '%s'\n", sep,
                    a->command, word);
        cubert_usage(stderr);
        return CUBERT_ARGS_USAGE;
    }
    a->value = optarg;
    return c;
}
