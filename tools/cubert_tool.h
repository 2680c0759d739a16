/* The commands of the `cubert` program that live in files of their own,
 * and the argument parser every command uses. */
#ifndef CUBE_TOOLS_CUBERT_TOOL_H
#define CUBE_TOOLS_CUBERT_TOOL_H

#include <getopt.h>
#include <stdio.h>

/* The exit status of a usage error (unknown command, option or argument,
 * a missing or bad option value). */
#define EXIT_USAGE 2

/* The program's whole help text (cubert.c). */
void cubert_usage(FILE *f);

/* One command's arguments, read with getopt_long (cubert_args.c). argv[0]
 * is the command's name; `options` ends with a zeroed entry, and its `val`
 * fields must be positive and differ from 'h' (taken by -h/--help, which
 * every command accepts). Both `--opt value` and `--opt=value` work, and
 * so does a unique prefix of a long option's name. An operand (a word that
 * is no option) is a usage error, as no command takes one, unless
 * `operands` is set: then reading stops there (the program's own options
 * stop at the command's name). */
typedef struct cubert_args {
    const char *command; /* "demo": messages say "cubert demo: ..." */
    int argc;
    char **argv;
    const struct option *options;
    int operands;      /* nonzero: stop at the first operand, no error */
    const char *value; /* the current option's value, or NULL */
    int rest;          /* at CUBERT_ARGS_END: the first operand's index */
    int started;       /* zero before the first call */
} cubert_args;

enum {
    CUBERT_ARGS_END = -1,  /* every argument read */
    CUBERT_ARGS_HELP = -2, /* -h or --help: print the help, exit 0 */
    CUBERT_ARGS_USAGE = -3 /* a usage error, already reported on stderr
                              with the help text: exit EXIT_USAGE */
};

/* The next option's `val` (its value, if any, in a->value), or one of
 * CUBERT_ARGS_*. Not thread-safe (getopt's state is global): the program
 * parses on its main thread before starting any other. */
int cubert_args_next(cubert_args *a);

/* `cubert allreduce [--backend B] [--ranks N] [--max BYTES]`
 * (cubert_allreduce.c): 0 when every result checked out, 1 on a failure,
 * 2 for a usage error. argv[0] is "allreduce". */
int cubert_cmd_allreduce(int argc, char **argv);

/* `cubert info --json` (cubert_info_json.c): the version, the backends,
 * every device and the configuration as one JSON object on stdout; 0, or
 * 1 when stdout failed. */
int cubert_info_json(void);

#endif /* CUBE_TOOLS_CUBERT_TOOL_H */
