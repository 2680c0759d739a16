/* What the files of the `cubert` program share: the table of commands with
 * their help, the argument parser every command uses with its one-line
 * usage errors, and the commands that live in files of their own. */
#ifndef CUBE_TOOLS_CUBERT_TOOL_H
#define CUBE_TOOLS_CUBERT_TOOL_H

#include <getopt.h>
#include <stdio.h>

#include "cubert/error.h"
#include "cubert/export.h"

/* The exit status of a usage error (unknown command, option or argument,
 * a missing or bad option value). */
#define EXIT_USAGE 2

/* One command of the program. The program's help lists each command's
 * name and summary; `cubert NAME --help` prints "usage: cubert NAME
 * SYNOPSIS", a blank line, then `help`. */
typedef struct cubert_command {
    const char *name;     /* "demo" */
    const char *synopsis; /* "[--device D] [--size N]" */
    const char *summary;  /* one line, for the program's help */
    const char *help;     /* what it does, its options, its exit status */
    int (*run)(int argc, char **argv); /* argv[0] is the name */
} cubert_command;

/* The program's commands, in the order its help lists them; the last
 * entry is zeroed (cubert.c). */
extern const cubert_command cubert_commands[];

/* The command named `name`, or NULL. */
const cubert_command *cubert_command_find(const char *name);

/* Prints the help of `command` ("cubert demo --help") on `f`; "" prints
 * the program's help, which lists the commands. */
void cubert_help(const char *command, FILE *f);

/* Reports a usage error on stderr as one line that says where the help
 * is: "cubert demo: MESSAGE; see 'cubert demo --help'" ("" for the
 * program: "cubert: MESSAGE; see 'cubert --help'"). Returns EXIT_USAGE. */
int cubert_usage_error(const char *command, const char *fmt, ...)
    CUBE_PRINTF(2, 3);

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
                              (cubert_usage_error): exit EXIT_USAGE */
};

/* The next option's `val` (its value, if any, in a->value), or one of
 * CUBERT_ARGS_*. Not thread-safe (getopt's state is global): the program
 * parses on its main thread before starting any other. */
int cubert_args_next(cubert_args *a);

/* What a command does once cubert_args_next stopped at `c` before the end:
 * for CUBERT_ARGS_HELP prints the command's help on stdout and returns 0;
 * otherwise (a usage error, already reported) returns EXIT_USAGE. */
int cubert_args_stop(const cubert_args *a, int c);

/* `cubert allreduce [--backend B] [--ranks N] [--max BYTES]`
 * (cubert_allreduce.c): 0 when every result checked out, 1 on a failure,
 * 2 for a usage error. argv[0] is "allreduce". */
int cubert_cmd_allreduce(int argc, char **argv);

/* `cubert info --json` (cubert_info_json.c): the version, the backends,
 * every device and the configuration as one JSON object on stdout; 0, or
 * 1 when stdout failed. */
int cubert_info_json(void);

/* Why a backend or device is unavailable, from the error `call` returned
 * (cubert_info_json.c): its message without the call's own name in front
 * ("cube_device_count(cuda): "), which the listing already shows. Borrowed
 * from `err`. */
const char *cubert_unavailable_reason(const cube_error *err, const char *call);

#endif /* CUBE_TOOLS_CUBERT_TOOL_H */
