/* One program, started N times by a launcher, each process a rank of one
 * communicator: it learns its rank, the job's size and its local rank from
 * the launcher's environment (cube_comm_job_from_env: mpirun's, torchrun's
 * or srun's variables), opens the device of its local rank, gets the
 * communicator's id from rank 0 through a file in a folder every process
 * sees, joins, and checks an all-reduce. Started alone, it is a job of one.
 *
 *   mpirun -n 2 ./multi_process cpu /tmp/job1      (as root: mpirun
 *                                                   --allow-run-as-root)
 *   torchrun --nproc-per-node 2 --no-python ./multi_process cuda /tmp/job2
 *   RANK=1 WORLD_SIZE=2 LOCAL_RANK=1 ./multi_process cuda /tmp/job3 &
 *   RANK=0 WORLD_SIZE=2 LOCAL_RANK=0 ./multi_process cuda /tmp/job3
 *
 * The folder is a fresh one per job (an id an earlier job left would be
 * read as this one's). On the CPU the processes are joined by MPI, so
 * they must come from mpirun; started otherwise, the program says so and
 * exits 77. It also exits 77 with fewer devices than processes (it
 * assumes one host), as a test that cannot run here.
 * Build: cc multi_process.c $(pkg-config --cflags --libs cubert) */
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "example_util.h"

enum { N = 1000, TIMEOUT_MS = 60000 };

/* Rank 0 writes the id's text under a temporary name and renames it into
 * place, so that the others never read half of it; they wait for it. */
static void share_id(const char *backend, const char *dir, uint32_t rank,
                     cube_comm_id *id)
{
    char path[1024], text[CUBE_COMM_ID_TEXT];
    snprintf(path, sizeof path, "%s/comm-id", dir);
    if (rank == 0) {
        char tmp[1100];
        check(cube_comm_id_new(backend, id), "cube_comm_id_new");
        check(cube_comm_id_format(id, text, sizeof text), "format");
        snprintf(tmp, sizeof tmp, "%s.tmp", path);
        FILE *f = fopen(tmp, "w");
        if (!f || fprintf(f, "%s\n", text) < 0 || fclose(f) != 0 ||
            rename(tmp, path) != 0) {
            fprintf(stderr, "cannot write %s\n", path);
            exit(1);
        }
        return;
    }
    /* The file appears whole (renamed into place), or not at all. */
    const struct timespec pause = {0, 10L * 1000 * 1000};
    FILE *f = NULL;
    for (int waited = 0; !f && waited < TIMEOUT_MS; waited += 10)
        if (!(f = fopen(path, "r")))
            nanosleep(&pause, NULL);
    if (f && fgets(text, sizeof text, f)) {
        fclose(f);
        check(cube_comm_id_parse(text, id), "cube_comm_id_parse");
        return;
    }
    if (f)
        fclose(f);
    fprintf(stderr, "rank %u: no id in %s after %d ms\n", rank, path,
            TIMEOUT_MS);
    exit(1);
}

int main(int argc, char **argv)
{
    const char *backend = argc > 1 ? argv[1] : "cpu";
    cube_comm_job job;
    cube_error *err = cube_comm_job_from_env(&job);
    int alone = cube_error_code(err) == CUBE_ERR_NOT_FOUND;
    if (alone) {
        cube_error_free(err);
        job = (cube_comm_job){0, 1, 0, "none"};
    } else {
        check(err, "cube_comm_job_from_env"); /* a hostile environment */
    }
    if (!alone && argc < 3) {
        fprintf(stderr,
                "usage: %s BACKEND FOLDER (a fresh folder every "
                "process of the job sees)\n",
                argv[0]);
        return 2;
    }
    char who[128];
    snprintf(who, sizeof who, "rank %u of %u (local rank %u, from %s)",
             job.rank, job.size, job.local_rank, job.launcher);
    uint32_t devices = 0;
    int cpu = strcmp(backend, "cpu") == 0;
    err = cube_device_count(backend, &devices);
    if (!cpu && cube_error_code(err) == CUBE_ERR_UNAVAILABLE) {
        cube_error_free(err); /* no driver: no device */
        err = NULL;
    }
    check(err, "cube_device_count");
    if (!cpu && devices < job.size) {
        printf("%s: %u %s device(s) for %u processes: skipped\n", who, devices,
               backend, job.size);
        return 77;
    }
    char name[64];
    snprintf(name, sizeof name, "%s:%u", backend,
             devices ? job.local_rank % devices : 0);
    cube_client *c = NULL;
    check(cube_client_open(name, NULL, &c), "cube_client_open");

    cube_comm *comm = NULL;
    cube_comm_options o = cube_comm_options_default();
    o.timeout_ms = TIMEOUT_MS;
    if (alone) {
        /* A process started alone: a communicator of its one client. */
        check(cube_comm_init_all(&c, 1, &o, &comm), "cube_comm_init_all");
    } else {
        cube_comm_id id;
        share_id(backend, argv[2], job.rank, &id);
        err = cube_comm_init_rank(c, &id, job.size, job.rank, &o, &comm);
        if (cube_error_code(err) == CUBE_ERR_UNAVAILABLE) {
            /* e.g. CPU processes that mpirun did not start */
            printf("%s: %s: skipped\n", who, cube_error_message(err));
            cube_error_free(err);
            cube_client_close(c);
            return 77;
        }
        check(err, "cube_comm_init_rank");
    }

    /* Each rank contributes rank + 1: the sum is size (size + 1) / 2. */
    float v[N];
    for (int i = 0; i < N; i++)
        v[i] = (float)(job.rank + 1);
    cube_handle h;
    check(cube_create(c, v, sizeof v, &h), "cube_create");
    check(cube_all_reduce(comm, h, h, N, CUBE_DTYPE_F32, CUBE_REDUCE_SUM),
          "cube_all_reduce");
    check(cube_read_all(c, h, v, sizeof v), "cube_read_all");
    float want = (float)job.size * (float)(job.size + 1) / 2.0f;
    for (int i = 0; i < N; i++)
        if (v[i] != want) {
            fprintf(stderr, "rank %u: element %d is %g, not %g\n", job.rank, i,
                    v[i], want);
            return 1;
        }
    printf("%s: all-reduce checked\n", who);
    check(cube_handle_release(c, h), "cube_handle_release");
    cube_comm_destroy(comm);
    cube_client_close(c);
    return 0;
}
