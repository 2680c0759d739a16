/* cubert — devices: what each backend can open, before opening anything.
 *
 * A device is named "backend:index" ("cuda:0", "cpu:1"); "backend" alone
 * is index 0. The CUDA backend has one device per GPU the driver sees; the
 * CPU backend has one, or $CUBERT_CPU_DEVICES virtual devices ("cpu:0" ..
 * "cpu:N-1", each with its own memory, streams and share of the cores:
 * $CUBERT_CPU_THREADS each, else the online cores divided among them),
 * for programs that want several devices, and their communication, on a
 * machine without GPUs.
 *
 * One server per device per process: the first cube_client_open of a
 * device opens its server and later opens of it (by any library in the
 * process) get clients of that same server, sharing its memory pools,
 * streams (a thread's own stream is the same stream for every client of a
 * device, so the work of two libraries on one thread stays in order),
 * compiled kernels and device fault. Each client keeps its own handles
 * (a handle is valid on the client that made it only), and so its buffers
 * and their failures, its dry-run scopes, the profiling windows and graph
 * captures it opened, its graphs and its staging buffers. The last
 * cube_client_close of a device closes its server. A device that faulted
 * (CUBE_ERR_DEVICE_FAULT) stays with the clients that saw the fault; a
 * later open gets a new server.
 *
 * Ownership: these calls fill caller-owned structs; nothing to free but a
 * returned error. Thread safety: any thread, at any time.
 */
#ifndef CUBERT_DEVICE_H
#define CUBERT_DEVICE_H

#include <stdint.h>

#include "cubert/client.h"
#include "cubert/error.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One device. */
typedef struct cube_device_info {
    char device[48]; /* "cuda:0": the name cube_client_open takes */
    uint32_t index;
    /* As cube_client_properties reports them once the device is open
     * (compute_units of a CPU device: the threads it would get). */
    cube_properties properties;
    /* Clients open on the device in this process now (0: its server is
     * not open). */
    uint32_t clients;
} cube_device_info;

/* How many devices `backend` ("cpu", "cuda", "null") has, without opening
 * any. Errors: CUBE_ERR_INVALID_ARGUMENT (backend or out NULL),
 * CUBE_ERR_NOT_FOUND (no backend of that name), CUBE_ERR_UNAVAILABLE (the
 * backend is not part of this build, or cannot run on this machine: no
 * driver, no device; the message says why). */
CUBE_API CUBE_MUST_USE cube_error *cube_device_count(const char *backend,
                                                     uint32_t *out);

/* Describes `device` ("cuda:1", "cpu") without opening it: an open device
 * is described by its server, another is asked of the backend (the CUDA
 * driver is loaded, no context is made). Errors: as cube_device_count,
 * plus CUBE_ERR_INVALID_ARGUMENT (malformed name), CUBE_ERR_NOT_FOUND
 * (index out of range). */
CUBE_API CUBE_MUST_USE cube_error *cube_device_describe(const char *device,
                                                        cube_device_info *out);

/* The device `client` was opened on, as cube_device_describe says.
 * Errors: CUBE_ERR_INVALID_ARGUMENT (client or out NULL). */
CUBE_API CUBE_MUST_USE cube_error *cube_client_device(cube_client *client,
                                                      cube_device_info *out);

#ifdef __cplusplus
}
#endif

#endif /* CUBERT_DEVICE_H */
