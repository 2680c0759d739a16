/* What a backend does that no feature bit says, in one table.
 *
 * A test asks cube_properties.features what the device can do (conf_require,
 * CONF_TEST_NEEDS) and never its backend's name. What remains is behaviour
 * a program cannot ask about and the suite still has to know: which raw
 * kernel formats a backend runs (cubert/kernel.h ties each format to a
 * backend), problem sizes that only cost time on a slow device, the
 * CUDA driver's sticky fault. Each such behaviour has a name, and the
 * backends that have it are listed here with the reason, which the suite
 * prints where it skips or changes something. A backend with no entries
 * (a new one, or a copy of one under another name) gets the suite's
 * plain expectations and its feature bits' tests, nothing else. Something
 * a program could rely on belongs in a CUBE_FEATURE_* bit instead
 * (cubert/client.h). */
#include <stdio.h>
#include <string.h>

#include "conformance.h"

typedef struct conf_backend_entry {
    const char *backend; /* cube_properties.backend */
    const char *what;    /* the behaviour, as tests ask for it */
    const char *reason;  /* printed where the suite acts on it */
} conf_backend_entry;

static const conf_backend_entry entries[] = {
    {"cpu", "raw_c_kernels",
     "it runs CUBE_KERNEL_C_SOURCE and CUBE_KERNEL_SHARED_OBJECT kernels "
     "(cubert/kernel.h)"},
    {"cuda", "raw_cuda_kernels",
     "it runs CUBE_KERNEL_CUDA_SOURCE and CUBE_KERNEL_CUDA_BINARY kernels "
     "(cubert/kernel.h)"},
    {"cpu", "small_problems",
     "kernels run on the host's cores and a launch's work is done before "
     "the call returns: big buffers and long loops prove nothing more "
     "there and only cost time"},
    {"opencl", "small_problems",
     "the suite runs it on PoCL, whose kernels run on the host's cores: "
     "big buffers and long loops there only cost time (on a GPU through "
     "OpenCL the CUDA backend's run covers them)"},
    {"cpu", "cpu_threads_shape_the_device",
     "cube_client_options.cpu_threads sizes the device's workers, fixed by "
     "its first open: another number is refused while the suite's client "
     "holds the device"},
    {"cpu", "lone_rank_between_processes_is_an_mpi_job",
     "a communicator between processes starts MPI in the process, which "
     "the suite keeps out of: tests/mpi/comm_mpi_ranks.c runs one rank "
     "and more under mpirun"},
    {"cuda", "default_layout_may_be_expandable",
     "with the driver's virtual memory management the streams' first "
     "layout is the expandable preset (cuda_memory_preset)"},
    {"cuda", "cuda_default_streams",
     "its native streams are CUstreams, and CUBE_NATIVE_STREAM_LEGACY and "
     "_PER_THREAD name the driver's default streams (cubert/interop.h)"},
    {"cuda", "device_fault_lasts_the_process",
     "the CUDA driver keeps a sticky fault until the process exits: a "
     "reopen says so, and a new process shows the recovery"},
};

#define ENTRIES (sizeof entries / sizeof entries[0])

const char *conf_backend_note(const char *what)
{
    int known = 0;
    for (size_t i = 0; i < ENTRIES; i++) {
        if (strcmp(entries[i].what, what) != 0)
            continue;
        known = 1;
        if (strcmp(entries[i].backend, conf.props.backend) == 0)
            return entries[i].reason;
    }
    if (!known) {
        /* A misspelt name would quietly mean "no backend does this". */
        print_error("backends.c has no behaviour '%s'\n", what);
        fail();
    }
    return NULL;
}

int conf_backend_skips_rest(const char *what)
{
    const char *reason = conf_backend_note(what);
    if (reason)
        print_message("the rest of this test is not run on the %s backend: "
                      "%s\n",
                      conf.props.backend, reason);
    return reason != NULL;
}

void conf_require_backend(const char *what, const char *needs)
{
    if (conf_backend_note(what))
        return;
    char who[128] = "";
    size_t used = 0;
    for (size_t i = 0; i < ENTRIES && used < sizeof who; i++)
        if (strcmp(entries[i].what, what) == 0)
            used += (size_t)snprintf(who + used, sizeof who - used, "%s%s",
                                     used ? ", " : "", entries[i].backend);
    print_message("skipped: the test needs %s, which backends.c lists for "
                  "%s, not for %s\n",
                  needs, who, conf.props.backend);
    skip();
}
