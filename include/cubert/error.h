/* cubert — error values.
 *
 * Every fallible call returns `cube_error *`: NULL on success, otherwise an
 * error the caller owns and must free with cube_error_free(). An error has a
 * code, a message naming what went wrong and where, optionally a log (the
 * compiler's output for CUBE_ERR_COMPILE) and causes: a CUBE_ERR_SEVERAL
 * error lists one cause per buffer that failed.
 *
 * Thread safety: an error is an immutable value once returned; it may be read
 * from any thread and freed from any thread, once.
 */
#ifndef CUBERT_ERROR_H
#define CUBERT_ERROR_H

#include <stddef.h>

#include "cubert/export.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum cube_code {
    CUBE_OK = 0,
    /* An argument is NULL, zero, out of range or inconsistent; the message
     * names it. Nothing was done. */
    CUBE_ERR_INVALID_ARGUMENT = 1,
    /* A handle, device, graph or entry does not exist (released, foreign,
     * destroyed, or never handed out). */
    CUBE_ERR_NOT_FOUND = 2,
    /* Memory could not be had right now; retrying later may succeed. */
    CUBE_ERR_OUT_OF_MEMORY = 3,
    /* The request can never fit on this device. */
    CUBE_ERR_BUFFER_TOO_BIG = 4,
    /* A configured memory budget would be exceeded. */
    CUBE_ERR_POOL_CAPACITY_EXCEEDED = 5,
    /* A kernel did not compile; cube_error_log() holds the compiler output. */
    CUBE_ERR_COMPILE = 6,
    /* A launch asks for more than the device allows (cube dimension, units
     * per cube, shared memory). */
    CUBE_ERR_RESOURCE_LIMIT = 7,
    /* The backend does not implement this operation. */
    CUBE_ERR_UNSUPPORTED = 8,
    /* A graph or capture call came out of lifecycle order, or a call a
     * capture window cannot record (a read, a write, a sync, a profile, a
     * replay) was made on a capturing stream. */
    CUBE_ERR_GRAPH_STATE = 9,
    /* The device context is broken; the client must be reopened. */
    CUBE_ERR_DEVICE_FAULT = 10,
    /* Several failures, one cause each (for example one per failed buffer). */
    CUBE_ERR_SEVERAL = 11,
    /* A file or system call failed (disk cache, compiler process). */
    CUBE_ERR_IO = 12,
    /* A backend or device is not available on this machine. */
    CUBE_ERR_UNAVAILABLE = 13,
    /* An invariant of cubert itself broke; please report it. */
    CUBE_ERR_INTERNAL = 14,
    /* Deferred memory could not be backed at first use (dry run). */
    CUBE_ERR_STORAGE_MAPPING_FAILED = 15,
    /* A profiling token is unknown or was already closed. */
    CUBE_ERR_PROFILE = 16,
    /* A memory layout could not replace the calling stream's pools because
     * buffers are still live in them (streams created later use it). */
    CUBE_ERR_POOLS_IN_USE = 17,
    /* The stream named cannot take the request (not initialized). */
    CUBE_ERR_STREAM_UNAVAILABLE = 18,
    /* A peer did not take part in time: a rank that never joined a
     * collective, a send without its receive (cubert/comm.h). Nothing
     * moved; the communicator still works. */
    CUBE_ERR_TIMEOUT = 19,
    /* The communicator was aborted (cube_comm_abort, or a peer that
     * could not recover); every later call on it answers this. */
    CUBE_ERR_ABORTED = 20
} cube_code;

/* The largest cube_code. */
#define CUBE_CODE_LAST CUBE_ERR_ABORTED

typedef struct cube_error cube_error;

/* The code of `err`; CUBE_OK for NULL. */
CUBE_API cube_code cube_error_code(const cube_error *err);

/* The message of `err`, borrowed: valid until the error is freed. "" for
 * NULL. */
CUBE_API const char *cube_error_message(const cube_error *err);

/* An attached log (the compiler's output for CUBE_ERR_COMPILE), borrowed;
 * NULL when there is none. */
CUBE_API const char *cube_error_log(const cube_error *err);

/* Number of causes, and the i-th cause (borrowed; NULL when out of range). */
CUBE_API size_t cube_error_cause_count(const cube_error *err);
CUBE_API const cube_error *cube_error_cause(const cube_error *err, size_t i);

/* A stable name for a code, such as "invalid argument". Never NULL. */
CUBE_API const char *cube_code_name(cube_code code);

/* The whole error as text: code, message, log and causes, indented.
 * Returns a string the caller frees with free(); NULL only when memory
 * runs out. */
CUBE_API char *cube_error_format(const cube_error *err);

/* Frees `err` and its causes. NULL is a no-op. */
CUBE_API void cube_error_free(cube_error *err);

#ifdef __cplusplus
}
#endif

#endif /* CUBERT_ERROR_H */
