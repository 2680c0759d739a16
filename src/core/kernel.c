/* Kernel objects: name, source, cube dimension and a stable id. */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "cubert/backend/errors.h"
#include "cubert/backend/server.h"
#include "cubert/kernel.h"

struct cube_kernel {
    _Atomic uint32_t refs;
    char *name;
    char *source;
    uint32_t cube_dim[3];
    uint64_t id;
};

static int is_identifier(const char *s)
{
    if (!*s || (*s >= '0' && *s <= '9'))
        return 0;
    for (; *s; s++) {
        char c = *s;
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
              (c >= '0' && c <= '9') || c == '_'))
            return 0;
    }
    return 1;
}

cube_error *cube_kernel_create(const cube_kernel_desc *desc, cube_kernel **out)
{
    if (!out)
        return cube_error_new(CUBE_ERR_INVALID_ARGUMENT,
                              "cube_kernel_create: out is NULL");
    *out = NULL;
    if (!desc)
        return cube_error_new(CUBE_ERR_INVALID_ARGUMENT,
                              "cube_kernel_create: desc is NULL");
    if (!desc->name || !is_identifier(desc->name) || strlen(desc->name) > 200)
        return cube_error_new(CUBE_ERR_INVALID_ARGUMENT,
                              "cube_kernel_create: desc->name must be a C "
                              "identifier of at most 200 characters");
    if (!desc->source || !*desc->source)
        return cube_error_new(CUBE_ERR_INVALID_ARGUMENT,
                              "cube_kernel_create: desc->source is NULL or "
                              "empty");
    uint64_t units = 1;
    uint32_t dim[3];
    for (int i = 0; i < 3; i++) {
        dim[i] = desc->cube_dim[i] ? desc->cube_dim[i] : 1;
        units *= dim[i];
    }
    if (units > UINT32_MAX)
        return cube_error_new(CUBE_ERR_INVALID_ARGUMENT,
                              "cube_kernel_create: desc->cube_dim (%u, %u, %u) "
                              "has more than 2^32-1 units",
                              dim[0], dim[1], dim[2]);
    cube_kernel *k = calloc(1, sizeof *k);
    if (!k)
        return cube_error_new(CUBE_ERR_OUT_OF_MEMORY, "cube_kernel_create");
    k->name = strdup(desc->name);
    k->source = strdup(desc->source);
    if (!k->name || !k->source) {
        free(k->name);
        free(k->source);
        free(k);
        return cube_error_new(CUBE_ERR_OUT_OF_MEMORY, "cube_kernel_create");
    }
    memcpy(k->cube_dim, dim, sizeof dim);
    XXH3_state_t *st = XXH3_createState();
    if (!st) {
        /* Not cube_kernel_release: no reference is counted yet. */
        free(k->name);
        free(k->source);
        free(k);
        return cube_error_new(CUBE_ERR_OUT_OF_MEMORY, "cube_kernel_create");
    }
    XXH3_64bits_reset(st);
    /* Lengths go first so (name, source) pairs cannot collide by
     * shifting bytes between fields. */
    uint64_t lens[2] = {strlen(k->name), strlen(k->source)};
    XXH3_64bits_update(st, lens, sizeof lens);
    XXH3_64bits_update(st, k->name, lens[0]);
    XXH3_64bits_update(st, k->source, lens[1]);
    XXH3_64bits_update(st, k->cube_dim, sizeof k->cube_dim);
    k->id = XXH3_64bits_digest(st);
    XXH3_freeState(st);
    atomic_init(&k->refs, 1);
    *out = k;
    return NULL;
}

void cube_kernel_retain(cube_kernel *kernel)
{
    if (kernel)
        atomic_fetch_add_explicit(&kernel->refs, 1, memory_order_relaxed);
}

void cube_kernel_release(cube_kernel *kernel)
{
    if (!kernel)
        return;
    if (atomic_fetch_sub_explicit(&kernel->refs, 1, memory_order_acq_rel) != 1)
        return;
    free(kernel->name);
    free(kernel->source);
    free(kernel);
}

uint64_t cube_kernel_id(const cube_kernel *kernel)
{
    return kernel ? kernel->id : 0;
}

const char *cube_kernel_name(const cube_kernel *kernel)
{
    return kernel ? kernel->name : "";
}

const char *cube_kernel_source(const cube_kernel *kernel)
{
    return kernel ? kernel->source : "";
}

void cube_kernel_cube_dim(const cube_kernel *kernel, uint32_t out[3])
{
    for (int i = 0; i < 3; i++)
        out[i] = kernel ? kernel->cube_dim[i] : 1;
}
