/* The commands of the `cubert` program that live in files of their own. */
#ifndef CUBE_TOOLS_CUBERT_TOOL_H
#define CUBE_TOOLS_CUBERT_TOOL_H

/* `cubert allreduce [--backend B] [--ranks N] [--max BYTES]`
 * (cubert_allreduce.c): 0 when every result checked out, 1 on a failure,
 * 2 for a usage error. */
int cubert_cmd_allreduce(int argc, char **argv);

/* `cubert info --json` (cubert_info_json.c): the version, the backends,
 * every device and the configuration as one JSON object on stdout; 0, or
 * 1 when stdout failed. */
int cubert_info_json(void);

#endif /* CUBE_TOOLS_CUBERT_TOOL_H */
