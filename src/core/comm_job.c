/* A process's place in a job of several processes, read from its
 * launcher's environment variables (cube_comm_job_from_env, cubert/comm.h).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "cubert/backend/errors.h"
#include "cubert/comm.h"
#include "cubert/log.h"

/* One launcher's variables. */
typedef struct launcher_vars {
    const char *name;
    const char *rank, *size, *local_rank;
} launcher_vars;

/* In the order they are read: an inner launcher before an outer one. */
static const launcher_vars launchers[] = {
    {"Open MPI", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
     "OMPI_COMM_WORLD_LOCAL_RANK"},
    {"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK"},
    {"Slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"},
};

/* `variable`'s value as a number below `limit`: decimal digits only, so
 * that "-1", " 2" or "3x" are refused rather than read as something. */
static cube_error *read_number(const launcher_vars *l, const char *variable,
                               uint64_t limit, const char *limit_what,
                               uint32_t *out)
{
    const char *text = getenv(variable);
    if (!text)
        return cube_error_new(CUBE_ERR_INVALID_ARGUMENT,
                              "cube_comm_job_from_env: %s is not set beside "
                              "%s's other variables",
                              variable, l->name);
    uint64_t v = 0;
    size_t len = strlen(text);
    int digits = len > 0 && len <= 10;
    for (size_t i = 0; digits && i < len; i++) {
        if (text[i] < '0' || text[i] > '9')
            digits = 0;
        else
            v = v * 10 + (uint64_t)(text[i] - '0');
    }
    if (!digits)
        return cube_error_new(CUBE_ERR_INVALID_ARGUMENT,
                              "cube_comm_job_from_env: %s=\"%.40s\" (%s) is "
                              "not a decimal number",
                              variable, text, l->name);
    if (v >= limit)
        return cube_error_new(CUBE_ERR_INVALID_ARGUMENT,
                              "cube_comm_job_from_env: %s=%s (%s) is not "
                              "below %s (%llu)",
                              variable, text, l->name, limit_what,
                              (unsigned long long)limit);
    *out = (uint32_t)v;
    return NULL;
}

static cube_error *read_job(const launcher_vars *l, cube_comm_job *job)
{
    uint32_t size = 0;
    cube_error *err = read_number(l, l->size, (uint64_t)CUBE_MAX_RANKS + 1,
                                  "CUBE_MAX_RANKS + 1", &size);
    if (!err && size == 0)
        err = cube_error_new(CUBE_ERR_INVALID_ARGUMENT,
                             "cube_comm_job_from_env: %s=0 (%s): a job has "
                             "at least one process",
                             l->size, l->name);
    if (!err)
        err = read_number(l, l->rank, size, l->size, &job->rank);
    job->local_rank = job->rank;
    if (!err && getenv(l->local_rank))
        err = read_number(l, l->local_rank, size, l->size, &job->local_rank);
    job->size = size;
    job->launcher = l->name;
    return err;
}

cube_error *cube_comm_job_from_env(cube_comm_job *out)
{
    if (!out)
        return cube_error_null_argument("cube_comm_job_from_env", "out");
    memset(out, 0, sizeof *out);
    for (size_t i = 0; i < sizeof launchers / sizeof launchers[0]; i++) {
        const launcher_vars *l = &launchers[i];
        if (!getenv(l->rank) && !getenv(l->size))
            continue;
        cube_comm_job job;
        memset(&job, 0, sizeof job);
        cube_error *err = read_job(l, &job);
        if (err)
            return err;
        *out = job;
        cube_log_write(CUBE_LOG_INFO, "comm",
                       "rank %u of %u (local rank %u), from %s's environment",
                       job.rank, job.size, job.local_rank, job.launcher);
        return NULL;
    }
    return cube_error_new(CUBE_ERR_NOT_FOUND,
                          "cube_comm_job_from_env: no launcher's variables "
                          "are set (OMPI_COMM_WORLD_RANK/_SIZE of mpirun, "
                          "RANK/WORLD_SIZE of torchrun, SLURM_PROCID/"
                          "SLURM_NTASKS of srun): a process started alone");
}
