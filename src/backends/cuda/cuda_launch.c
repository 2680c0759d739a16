/* Launches on CUDA: the entry's arguments passed by value (in one packed
 * buffer when the driver gives their offsets), after ordering the stream
 * behind the buffers' writers; dynamic cube counts read back in stream
 * order. */
#include <string.h>

#include "backends/common/properties.h"
#include "backends/common/validate.h"
#include "backends/cuda/cuda_internal.h"

#define CUDA_ABI_TAG 2

static int param_written(cube_param_kind kind)
{
    return kind == CUBE_PARAM_BUFFER_OUT || kind == CUBE_PARAM_BUFFER_INOUT;
}

/* Reads a dynamic cube count, in stream order, after its writer. */
static cube_error *read_count(cuda_server *s, cuda_stream *st,
                              const cube_binding *b, uint32_t count[3])
{
    if (st->capturing)
        return cube_error_new(CUBE_ERR_UNSUPPORTED,
                              "a dynamic cube count cannot be captured into "
                              "a CUDA graph (it is read on the host at "
                              "launch); launch it outside the capture");
    cuda_block *blk = b->storage->cookie;
    cube_error *err = cuda_block_before_use(s, st, blk, 0);
    if (err)
        return err;
    if (!st->count_host.address) {
        err = mem_alloc(s->pinned, 16, &st->count_host);
        if (err)
            return err;
    }
    void *host = (void *)(uintptr_t)st->count_host.address;
    const cuda_api *a = s->api;
    CUresult r = a->cuMemcpyDtoHAsync(host, b->storage->address + b->offset,
                                      3 * sizeof(uint32_t), st->cu);
    if (r == CUDA_SUCCESS)
        r = a->cuEventRecord(st->done, st->cu);
    if (r == CUDA_SUCCESS)
        r = a->cuEventSynchronize(st->done);
    if (r != CUDA_SUCCESS)
        return cuda_fail(s, r, CUBE_ERR_INTERNAL,
                         "reading a dynamic cube count");
    if (cuda_block_used(st, blk, cuda_stream_next(st), 0)) {
        err = cuda_stream_record(s, st);
        if (err)
            return err;
    }
    memcpy(count, host, 3 * sizeof(uint32_t));
    return properties_check_count(&s->props, count, "the device's maximum");
}

static cube_error *launch_one(cuda_server *s, cube_server_stream *stream,
                              const cube_dispatch *d);

/* A validating launch (CUBE_LAUNCH_VALIDATE): the module's record zeroed,
 * the kernel run, the stream waited for and the record read back, with
 * the module's other validating launches kept out meanwhile. The client
 * refuses such a launch on a capturing stream, so it always runs. */
static cube_error *launch_validating(cuda_server *s, cube_server_stream *stream,
                                     const cube_dispatch *d)
{
    cuda_kernel *k = d->compiled->impl;
    validate_record rec;
    memset(&rec, 0, sizeof rec);
    cuda_stream *st = NULL;
    cube_error *err = cuda_stream_begin(s, stream, &st);
    if (err)
        return err;
    cube_mutex_lock(&k->oob_lock);
    /* In stream order before the kernel; a pageable source is staged
     * before the call returns. No validating launch of this module is in
     * flight (each waits for its kernel below). */
    CUresult r =
        s->api->cuMemcpyHtoDAsync(k->oob_addr, &rec, sizeof rec, st->cu);
    if (r != CUDA_SUCCESS)
        err = cuda_fail(s, r, CUBE_ERR_INTERNAL,
                        "clearing a validating launch's record");
    if (!err)
        err = launch_one(s, stream, d);
    if (!err) {
        r = s->api->cuStreamSynchronize(st->cu);
        if (r == CUDA_SUCCESS)
            r = s->api->cuMemcpyDtoH(&rec, k->oob_addr, sizeof rec);
        if (r != CUDA_SUCCESS)
            err = cuda_fail(s, r, CUBE_ERR_DEVICE_FAULT,
                            "waiting for a validating launch");
    }
    cube_mutex_unlock(&k->oob_lock);
    /* The verdict, read once the kernel has finished. */
    return err ? err : validate_report(d->compiled, &rec);
}

cube_error *cuda_launch(cube_server *server, cube_server_stream *stream,
                        const cube_dispatch *d)
{
    cuda_server *s = (cuda_server *)server;
    const cuda_kernel *k = d->compiled->impl;
    if (k->oob_addr)
        return launch_validating(s, stream, d);
    return launch_one(s, stream, d);
}

static cube_error *launch_one(cuda_server *s, cube_server_stream *stream,
                              const cube_dispatch *d)
{
    const cube_compiled *cc = d->compiled;
    const cuda_kernel *k = cc->impl;
    cuda_stream *st = NULL;
    cube_error *err = cuda_stream_begin(s, stream, &st);
    if (err)
        return err;
    uint32_t count[3] = {d->cube_count[0], d->cube_count[1], d->cube_count[2]};
    if (d->count_buffer) {
        err = read_count(s, st, d->count_buffer, count);
        if (err)
            return err;
        if (!count[0] || !count[1] || !count[2]) {
            /* a dynamic count of zero cubes: nothing to run */
            if (d->ran_nothing)
                *d->ran_nothing = 1;
            return NULL;
        }
    }
    /* The entry's arguments, each a pointer to its value and its size. */
    int abi = CUDA_ABI_TAG;
    void *args[CUDA_ENTRY_PARAMS];
    uint32_t sizes[CUDA_ENTRY_PARAMS];
    uint64_t addrs[CUBE_MAX_PARAMS], lens[CUBE_MAX_PARAMS];
    size_t nargs = 0;
    /* A raw kernel's entry takes the declared parameters alone. */
    if (!k->raw) {
        args[nargs] = &abi;
        sizes[nargs++] = sizeof abi;
    }
    for (uint32_t p = 0; p < cc->param_count; p++) {
        const cube_param *pp = &cc->params[p];
        if (pp->kind == CUBE_PARAM_SHARED)
            continue;
        if (pp->kind == CUBE_PARAM_SCALAR) {
            args[nargs] = (void *)d->scalars[p];
            sizes[nargs++] = pp->elem_size;
            continue;
        }
        const cube_binding *b = &d->bindings[p];
        err = cuda_block_before_use(s, st, b->storage->cookie,
                                    param_written(pp->kind));
        if (err)
            return err;
        addrs[p] = b->storage->address + b->offset;
        lens[p] = b->size / pp->elem_size;
        args[nargs] = &addrs[p];
        sizes[nargs++] = sizeof addrs[p];
        if (k->raw)
            continue;
        args[nargs] = &lens[p];
        sizes[nargs++] = sizeof lens[p];
    }
    CUresult r;
    if (k->packed_bytes) {
        /* One buffer laid out as the entry expects: the driver copies it
         * whole instead of parameter by parameter. */
        _Alignas(16) unsigned char buf[CUDA_PARAM_BUFFER];
        for (size_t i = 0; i < nargs; i++)
            memcpy(buf + k->offset[i], args[i], sizes[i]);
        size_t size = k->packed_bytes;
        void *extra[] = {(void *)(uintptr_t)1, buf, (void *)(uintptr_t)2, &size,
                         (void *)(uintptr_t)0};
        r = s->api->cuLaunchKernel(k->function, count[0], count[1], count[2],
                                   d->cube_dim[0], d->cube_dim[1],
                                   d->cube_dim[2], k->shared_bytes, st->cu,
                                   NULL, extra);
    } else {
        r = s->api->cuLaunchKernel(k->function, count[0], count[1], count[2],
                                   d->cube_dim[0], d->cube_dim[1],
                                   d->cube_dim[2], k->shared_bytes, st->cu,
                                   args, NULL);
    }
    if (r != CUDA_SUCCESS)
        return cuda_fail(s, r,
                         r == CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES
                             ? CUBE_ERR_RESOURCE_LIMIT
                             : CUBE_ERR_INTERNAL,
                         "cuLaunchKernel");
    if (st->capturing)
        return NULL; /* recorded, not run: no buffer changes */
    uint64_t seq = cuda_stream_next(st);
    int shared = 0;
    for (uint32_t p = 0; p < cc->param_count; p++) {
        cube_param_kind kind = cc->params[p].kind;
        if (kind == CUBE_PARAM_SHARED || kind == CUBE_PARAM_SCALAR)
            continue;
        shared |= cuda_block_used(st, d->bindings[p].storage->cookie, seq,
                                  param_written(kind));
    }
    /* Buffers other streams also use: mark this launch exactly. */
    return shared ? cuda_stream_record(s, st) : NULL;
}
