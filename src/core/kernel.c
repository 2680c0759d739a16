/* Kernel objects: name, code, cube dimension and a stable id; for a raw
 * kernel also its format, declared parameters and compiler options. */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "base/error.h"
#include "core/client_internal.h"
#include "cubert/backend/errors.h"
#include "cubert/backend/server.h"
#include "cubert/kernel.h"

struct cube_kernel {
    _Atomic uint32_t refs;
    cube_kernel_format format;
    char *name;
    /* cube C or raw source (NUL-terminated), or a raw binary's bytes
     * followed by a NUL that code_size does not count. */
    char *source;
    size_t code_size;
    char *options; /* raw only; "" for none, NULL for cube C */
    uint32_t cube_dim[3];
    uint64_t id;
    /* A raw kernel's declared parameters. */
    cube_compiled declared;
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

/* The cube dimension with 0 read as 1, or an error when its product
 * overflows 32 bits. */
static cube_error *check_dim(const char *fn, const uint32_t in[3],
                             uint32_t dim[3])
{
    uint64_t units = 1;
    for (int i = 0; i < 3; i++) {
        dim[i] = in[i] ? in[i] : 1;
        units *= dim[i];
    }
    if (units > UINT32_MAX)
        return cube_error_new(CUBE_ERR_INVALID_ARGUMENT,
                              "%s: desc->cube_dim (%u, %u, %u) has more than "
                              "2^32-1 units",
                              fn, dim[0], dim[1], dim[2]);
    return NULL;
}

static void kernel_free(cube_kernel *k)
{
    free(k->name);
    free(k->source);
    free(k->options);
    free(k);
}

cube_error *cube_kernel_create(const cube_kernel_desc *desc, cube_kernel **out)
{
    if (!out)
        return cube_error_null_argument("cube_kernel_create", "out");
    *out = NULL;
    if (!desc)
        return cube_error_null_argument("cube_kernel_create", "desc");
    if (!desc->name || !is_identifier(desc->name) || strlen(desc->name) > 200)
        return cube_error_new(CUBE_ERR_INVALID_ARGUMENT,
                              "cube_kernel_create: desc->name must be a C "
                              "identifier of at most 200 characters");
    if (!desc->source || !*desc->source)
        return cube_error_new(CUBE_ERR_INVALID_ARGUMENT,
                              "cube_kernel_create: desc->source is NULL or "
                              "empty");
    uint32_t dim[3];
    cube_error *err = check_dim("cube_kernel_create", desc->cube_dim, dim);
    if (err)
        return err;
    cube_kernel *k = calloc(1, sizeof *k);
    if (!k)
        return cube_error_new(CUBE_ERR_OUT_OF_MEMORY, "cube_kernel_create");
    k->format = CUBE_KERNEL_CUBE_C;
    k->name = strdup(desc->name);
    k->source = strdup(desc->source);
    if (!k->name || !k->source) {
        kernel_free(k);
        return cube_error_new(CUBE_ERR_OUT_OF_MEMORY, "cube_kernel_create");
    }
    k->code_size = strlen(k->source);
    memcpy(k->cube_dim, dim, sizeof dim);
    XXH3_state_t *st = XXH3_createState();
    if (!st) {
        /* Not cube_kernel_release: no reference is counted yet. */
        kernel_free(k);
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

#define RAW_FN "cube_kernel_create_raw"

static int is_source_format(cube_kernel_format f)
{
    return f == CUBE_KERNEL_CUDA_SOURCE || f == CUBE_KERNEL_C_SOURCE;
}

/* A raw desc's code: a source, or a binary with no compiler options. */
static cube_error *check_raw_code(const cube_raw_kernel_desc *d)
{
    if (is_source_format(d->format)) {
        if (!d->source || !*d->source)
            return cube_error_new(CUBE_ERR_INVALID_ARGUMENT,
                                  RAW_FN ": desc->source is NULL or empty");
        if (d->binary || d->binary_size)
            return cube_error_new(CUBE_ERR_INVALID_ARGUMENT,
                                  RAW_FN ": desc->binary and "
                                         "desc->binary_size must be NULL and "
                                         "0 with a source format");
    } else {
        if (!d->binary || !d->binary_size)
            return cube_error_new(CUBE_ERR_INVALID_ARGUMENT,
                                  RAW_FN ": desc->binary is NULL or "
                                         "desc->binary_size is 0");
        if (d->source)
            return cube_error_new(CUBE_ERR_INVALID_ARGUMENT,
                                  RAW_FN ": desc->source must be NULL with a "
                                         "binary format");
        if (d->options && *d->options)
            return cube_error_new(CUBE_ERR_INVALID_ARGUMENT,
                                  RAW_FN ": desc->options are compiler "
                                         "options: a binary takes none");
        if (d->binary_size > SIZE_MAX - 1)
            return cube_error_new(CUBE_ERR_INVALID_ARGUMENT,
                                  RAW_FN ": desc->binary_size is too large");
    }
    return NULL;
}

/* Raw parameter `i`'s kind and size. */
static cube_error *check_raw_param(const cube_raw_param *p, uint32_t i)
{
    switch (p->kind) {
    case CUBE_RAW_BUFFER_IN:
    case CUBE_RAW_BUFFER_OUT:
    case CUBE_RAW_BUFFER_INOUT:
        if (p->size == 0)
            return cube_error_new(CUBE_ERR_INVALID_ARGUMENT,
                                  RAW_FN ": desc->params[%u] is a buffer "
                                         "with an element size of 0",
                                  i);
        break;
    case CUBE_RAW_SCALAR:
        if (p->size != 1 && p->size != 2 && p->size != 4 && p->size != 8)
            return cube_error_new(CUBE_ERR_INVALID_ARGUMENT,
                                  RAW_FN ": desc->params[%u] is a scalar "
                                         "of %u bytes; a scalar has 1, 2, "
                                         "4 or 8",
                                  i, p->size);
        break;
    default:
        return cube_error_new(CUBE_ERR_INVALID_ARGUMENT,
                              RAW_FN ": desc->params[%u].kind %d is not a "
                                     "cube_raw_param_kind",
                              i, (int)p->kind);
    }
    return NULL;
}

/* Everything of a raw desc that can be wrong, before anything is
 * allocated. */
static cube_error *check_raw(const cube_raw_kernel_desc *d, uint32_t dim[3])
{
    if (!d->name || !is_identifier(d->name) || strlen(d->name) > 200)
        return cube_error_new(CUBE_ERR_INVALID_ARGUMENT,
                              RAW_FN ": desc->name must be a C identifier of "
                                     "at most 200 characters");
    switch (d->format) {
    case CUBE_KERNEL_CUDA_SOURCE:
    case CUBE_KERNEL_CUDA_BINARY:
    case CUBE_KERNEL_C_SOURCE:
    case CUBE_KERNEL_SHARED_OBJECT: break;
    default:
        return cube_error_new(CUBE_ERR_INVALID_ARGUMENT,
                              RAW_FN ": desc->format %d is not a raw kernel "
                                     "format (CUBE_KERNEL_CUDA_SOURCE, "
                                     "CUBE_KERNEL_CUDA_BINARY, "
                                     "CUBE_KERNEL_C_SOURCE, "
                                     "CUBE_KERNEL_SHARED_OBJECT)",
                              (int)d->format);
    }
    cube_error *err = check_raw_code(d);
    if (err)
        return err;
    if (d->nparams > CUBE_MAX_PARAMS)
        return cube_error_new(CUBE_ERR_INVALID_ARGUMENT,
                              RAW_FN ": desc->nparams is %u; at most %d",
                              d->nparams, CUBE_MAX_PARAMS);
    if (d->nparams && !d->params)
        return cube_error_new(CUBE_ERR_INVALID_ARGUMENT,
                              RAW_FN ": desc->params is NULL with nparams = %u",
                              d->nparams);
    for (uint32_t i = 0; i < d->nparams && !err; i++)
        err = check_raw_param(&d->params[i], i);
    if (err)
        return err;
    return check_dim(RAW_FN, d->cube_dim, dim);
}

cube_error *cube_kernel_create_raw(const cube_raw_kernel_desc *desc,
                                   cube_kernel **out)
{
    if (!out)
        return cube_error_null_argument(RAW_FN, "out");
    *out = NULL;
    if (!desc)
        return cube_error_null_argument(RAW_FN, "desc");
    uint32_t dim[3];
    cube_error *err = check_raw(desc, dim);
    if (err)
        return err;
    cube_kernel *k = calloc(1, sizeof *k);
    if (!k)
        return cube_error_new(CUBE_ERR_OUT_OF_MEMORY, RAW_FN);
    k->format = desc->format;
    k->name = strdup(desc->name);
    k->options = strdup(desc->options ? desc->options : "");
    k->code_size = is_source_format(desc->format) ? strlen(desc->source)
                                                  : desc->binary_size;
    k->source = malloc(k->code_size + 1);
    if (!k->name || !k->options || !k->source) {
        kernel_free(k);
        return cube_error_new(CUBE_ERR_OUT_OF_MEMORY, RAW_FN);
    }
    memcpy(k->source,
           is_source_format(desc->format) ? (const void *)desc->source
                                          : desc->binary,
           k->code_size);
    k->source[k->code_size] = '\0';
    memcpy(k->cube_dim, dim, sizeof dim);
    k->declared.param_count = desc->nparams;
    for (uint32_t i = 0; i < desc->nparams; i++) {
        /* The raw kinds have the values of the signature's kinds. */
        k->declared.params[i].kind = (cube_param_kind)desc->params[i].kind;
        k->declared.params[i].elem_size = desc->params[i].size;
    }
    XXH3_state_t *st = XXH3_createState();
    if (!st) {
        kernel_free(k);
        return cube_error_new(CUBE_ERR_OUT_OF_MEMORY, RAW_FN);
    }
    XXH3_64bits_reset(st);
    /* A tag and the lengths first: no raw kernel hashes like a cube C
     * one, and no bytes can shift between fields. */
    uint64_t head[5] = {0x726177u /* "raw" */, (uint64_t)k->format,
                        strlen(k->name), k->code_size, strlen(k->options)};
    XXH3_64bits_update(st, head, sizeof head);
    XXH3_64bits_update(st, k->name, head[2]);
    XXH3_64bits_update(st, k->source, head[3]);
    XXH3_64bits_update(st, k->options, head[4]);
    uint32_t sig[1 + 2 * CUBE_MAX_PARAMS];
    sig[0] = desc->nparams;
    for (uint32_t i = 0; i < desc->nparams; i++) {
        sig[1 + 2 * i] = (uint32_t)desc->params[i].kind;
        sig[2 + 2 * i] = desc->params[i].size;
    }
    XXH3_64bits_update(st, sig, (1 + 2 * (size_t)desc->nparams) * sizeof *sig);
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
    kernel_free(kernel);
}

uint64_t cube_kernel_id(const cube_kernel *kernel)
{
    return kernel ? kernel->id : 0;
}

const char *cube_kernel_name(const cube_kernel *kernel)
{
    return kernel ? kernel->name : "";
}

cube_kernel_format cube_kernel_format_of(const cube_kernel *kernel)
{
    return kernel ? kernel->format : CUBE_KERNEL_CUBE_C;
}

const char *cube_kernel_source(const cube_kernel *kernel)
{
    if (!kernel || !(kernel->format == CUBE_KERNEL_CUBE_C ||
                     is_source_format(kernel->format)))
        return "";
    return kernel->source;
}

void cube_kernel_cube_dim(const cube_kernel *kernel, uint32_t out[3])
{
    for (int i = 0; i < 3; i++)
        out[i] = kernel ? kernel->cube_dim[i] : 1;
}

const void *cube_kernel_code(const cube_kernel *kernel, size_t *size)
{
    int raw = kernel && kernel->format != CUBE_KERNEL_CUBE_C;
    if (size)
        *size = raw ? kernel->code_size : 0;
    return raw ? kernel->source : NULL;
}

const char *cube_kernel_options(const cube_kernel *kernel)
{
    return kernel && kernel->options ? kernel->options : "";
}

const cube_compiled *cube_kernel_declared(const cube_kernel *kernel)
{
    return kernel && kernel->format != CUBE_KERNEL_CUBE_C ? &kernel->declared
                                                          : NULL;
}

int core_kernel_same(const cube_kernel *a, const cube_kernel *b)
{
    if (a == b)
        return 1;
    if (a->id != b->id || a->format != b->format ||
        a->code_size != b->code_size || strcmp(a->name, b->name) != 0 ||
        memcmp(a->source, b->source, a->code_size) != 0 ||
        memcmp(a->cube_dim, b->cube_dim, sizeof a->cube_dim) != 0)
        return 0;
    if (a->format == CUBE_KERNEL_CUBE_C)
        return 1;
    if (strcmp(a->options, b->options) != 0 ||
        a->declared.param_count != b->declared.param_count)
        return 0;
    for (uint32_t i = 0; i < a->declared.param_count; i++)
        if (a->declared.params[i].kind != b->declared.params[i].kind ||
            a->declared.params[i].elem_size != b->declared.params[i].elem_size)
            return 0;
    return 1;
}
