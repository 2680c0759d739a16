/* cubert.Event: a point in a stream's work that the host can wait for or
 * ask about, that other streams (cubert's, PyTorch's, CuPy's) can wait
 * for on the device, and that times the work between two of them, as
 * torch.cuda.Event and cupy.cuda.Event do.
 *
 * The C API has no event object, so the extension builds one over what it
 * has: on CUDA a CUevent of the client's context, recorded on and waited
 * for by the native stream cube_native_stream hands out (the C API's rule
 * for foreign work on that stream applies: it runs in order with the
 * thread's cubert work there); the driver is the one cubert's CUDA backend
 * loaded, opened again here (the extension links no GPU library). On host
 * backends work is done when its call returns, so an event is done as
 * soon as it is recorded and carries the host clock's time. */
#include <dlfcn.h>
#include <string.h>
#include <time.h>

#include "pycubert.h"

/* --- the driver's entry points an event needs --- */

typedef int curesult;
enum {
    CU_SUCCESS = 0,
    CU_ERROR_INVALID_VALUE = 1,
    CU_ERROR_OUT_OF_MEMORY = 2,
    CU_ERROR_INVALID_CONTEXT = 201,
    CU_ERROR_INVALID_HANDLE = 400,
    CU_ERROR_NOT_READY = 600,
    CU_ERROR_STREAM_CAPTURE_FIRST = 900, /* ..._UNSUPPORTED */
    CU_ERROR_STREAM_CAPTURE_LAST = 908,  /* ..._WRONG_THREAD */
    CU_EVENT_DISABLE_TIMING = 2,
};

typedef struct {
    curesult (*event_create)(void **event, unsigned flags);
    curesult (*event_destroy)(void *event);
    curesult (*event_record)(void *event, void *stream);
    curesult (*event_query)(void *event);
    curesult (*event_synchronize)(void *event);
    curesult (*event_elapsed)(float *ms, void *start, void *end);
    curesult (*stream_wait_event)(void *stream, void *event, unsigned flags);
    curesult (*stream_get_ctx)(void *stream, void **ctx);
    curesult (*stream_is_capturing)(void *stream, int *status);
    curesult (*ctx_push)(void *ctx);
    curesult (*ctx_pop)(void **ctx);
    curesult (*error_name)(curesult r, const char **name);
} cu_api;

static cu_api cu;
static int cu_loaded; /* 1 loaded, -1 failed, 0 not tried */

/* Fills `cu` from the driver; 0 when an entry point is missing. */
static int cu_resolve(void)
{
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib)
        lib = dlopen("libcuda.so", RTLD_NOW | RTLD_LOCAL);
    if (!lib)
        return 0;
    static const struct {
        const char *name;
        size_t offset;
    } syms[] = {
#define SYM(field, name) {name, offsetof(cu_api, field)}
        SYM(event_create, "cuEventCreate"),
        SYM(event_destroy, "cuEventDestroy_v2"),
        SYM(event_record, "cuEventRecord"),
        SYM(event_query, "cuEventQuery"),
        SYM(event_synchronize, "cuEventSynchronize"),
        SYM(event_elapsed, "cuEventElapsedTime"),
        SYM(stream_wait_event, "cuStreamWaitEvent"),
        SYM(stream_get_ctx, "cuStreamGetCtx"),
        SYM(stream_is_capturing, "cuStreamIsCapturing"),
        SYM(ctx_push, "cuCtxPushCurrent_v2"),
        SYM(ctx_pop, "cuCtxPopCurrent_v2"),
        SYM(error_name, "cuGetErrorName"),
#undef SYM
    };
    for (size_t i = 0; i < sizeof syms / sizeof syms[0]; i++) {
        void *f = dlsym(lib, syms[i].name);
        if (!f)
            return 0;
        memcpy((char *)&cu + syms[i].offset, &f, sizeof f);
    }
    return 1;
}

/* Loads the entry points once (under the GIL); -1 with UnavailableError. */
static int cu_load(void)
{
    if (!cu_loaded)
        cu_loaded = cu_resolve() ? 1 : -1;
    if (cu_loaded > 0)
        return 0;
    pyc_raise_code(CUBE_ERR_UNAVAILABLE,
                   "events: the CUDA driver (libcuda.so.1) or its event "
                   "calls cannot be loaded");
    return -1;
}

/* Raises the cubert error a driver result stands for; returns NULL. */
static PyObject *cu_raise(const char *call, curesult r)
{
    const char *name = NULL;
    if (cu.error_name(r, &name) != CU_SUCCESS || !name)
        name = "an unknown CUDA error";
    cube_code code = CUBE_ERR_DEVICE_FAULT;
    const char *hint = "";
    if (r == CU_ERROR_INVALID_VALUE || r == CU_ERROR_INVALID_HANDLE ||
        r == CU_ERROR_INVALID_CONTEXT) {
        code = CUBE_ERR_INVALID_ARGUMENT;
        hint = " (a stream of another device or context?)";
    } else if (r == CU_ERROR_OUT_OF_MEMORY) {
        code = CUBE_ERR_OUT_OF_MEMORY;
    } else if (r >= CU_ERROR_STREAM_CAPTURE_FIRST &&
               r <= CU_ERROR_STREAM_CAPTURE_LAST) {
        code = CUBE_ERR_GRAPH_STATE;
    }
    char text[256];
    PyOS_snprintf(text, sizeof text, "%s: the driver answered %s%s", call, name,
                  hint);
    return pyc_raise_code(code, text);
}

/* A driver call made in the event's context (the calling thread's
 * current context is left as it was). */
#define IN_CTX(ctx, r, call)                                                   \
    do {                                                                       \
        void *pyc_popped_;                                                     \
        (r) = cu.ctx_push(ctx);                                                \
        if ((r) == CU_SUCCESS) {                                               \
            (r) = (call);                                                      \
            cu.ctx_pop(&pyc_popped_);                                          \
        }                                                                      \
    } while (0)

static int is_cuda(const pyc_event *e)
{
    return e->client->dl_device_type == CUBE_DL_CUDA;
}

static uint64_t host_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* --- the client's list of native events --- */

static void cu_event_free(pyc_event *e)
{
    if (!e->cu_event)
        return;
    curesult r;
    IN_CTX(e->cu_ctx, r, cu.event_destroy(e->cu_event));
    (void)r; /* a context already gone took the event with it */
    e->cu_event = NULL;
    if (e->prev)
        e->prev->next = e->next;
    else
        e->client->events = e->next;
    if (e->next)
        e->next->prev = e->prev;
    e->prev = e->next = NULL;
}

void pyc_events_close(pyc_client *client)
{
    while (client->events)
        cu_event_free(client->events);
}

/* --- making one --- */

PyObject *pyc_client_event(pyc_client *self, PyObject *args, PyObject *kw)
{
    static char *names[] = {"timing", NULL};
    int timing = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|$p", names, &timing))
        return NULL;
    cube_client *c = pyc_client_get(self);
    if (!c)
        return NULL;
    void *ctx = NULL, *ev = NULL;
    if (self->dl_device_type == CUBE_DL_CUDA) {
        if (cu_load() < 0)
            return NULL;
        void *native = NULL;
        cube_error *err;
        PYC_NOGIL(self, err = cube_native_stream(c, &native));
        if (err)
            return pyc_raise(err);
        curesult r = cu.stream_get_ctx(native, &ctx);
        if (r != CU_SUCCESS)
            return cu_raise("cuStreamGetCtx", r);
        IN_CTX(ctx, r,
               cu.event_create(&ev, timing ? 0 : CU_EVENT_DISABLE_TIMING));
        if (r != CU_SUCCESS)
            return cu_raise("cuEventCreate", r);
    }
    pyc_event *e = (pyc_event *)PyType_GenericAlloc(pyc_g.event_type, 0);
    if (!e) {
        if (ev) {
            curesult r;
            IN_CTX(ctx, r, cu.event_destroy(ev));
            (void)r;
        }
        return NULL;
    }
    Py_INCREF(self);
    e->client = self;
    e->timing = timing;
    e->cu_event = ev;
    e->cu_ctx = ctx;
    if (ev) {
        e->next = self->events;
        if (self->events)
            self->events->prev = e;
        self->events = e;
    }
    return (PyObject *)e;
}

static void event_dealloc(pyc_event *self)
{
    PyTypeObject *tp = Py_TYPE(self);
    cu_event_free(self);
    Py_CLEAR(self->client);
    freefunc f = (freefunc)PyType_GetSlot(tp, Py_tp_free);
    f(self);
    Py_DECREF(tp);
}

/* --- where it is recorded or waited for --- */

/* The stream an argument names, resolved to what the driver takes: a
 * cubert stream of the event's client (None: the calling thread's) or a
 * native one. On CUDA *native is the CUstream. On host backends a cubert stream
 * is probed for a capture (cube_native_wait of nothing, which also orders the
 * probe after work another thread is running there); a native one must be 0. */
static int resolve_stream(pyc_event *e, PyObject *arg, const char *call,
                          void **native)
{
    cube_client *c = pyc_client_get(e->client);
    if (!c)
        return -1;
    cube_stream_id id;
    int rc = pyc_stream_arg(e->client, arg, &id);
    if (rc < 0)
        return -1;
    *native = NULL;
    if (!rc) {
        if (pyc_native_stream_from(e->client, arg,
                                   "None, a cubert.Stream, an int (a native "
                                   "stream) or a PyTorch or CuPy stream",
                                   native) < 0)
            return -1;
        if (!is_cuda(e) && *native) {
            pyc_raise_invalidf("%s: the %s backend has no native streams "
                               "(0 only)",
                               call, e->client->backend);
            return -1;
        }
        return 0;
    }
    cube_stream_id saved;
    cube_error *err = pyc_stream_switch(c, id, &saved);
    if (!err) {
        PYC_NOGIL(e->client, err = is_cuda(e) ? cube_native_stream(c, native)
                                              : cube_native_wait(c, NULL));
        pyc_stream_restore(c, saved);
    }
    if (err) {
        pyc_raise(err);
        return -1;
    }
    if (is_cuda(e)) {
        /* cubert's capture of this stream is not to be joined by a
         * foreign event. */
        int status = 0;
        curesult r = cu.stream_is_capturing(*native, &status);
        if (r != CU_SUCCESS) {
            cu_raise(call, r);
            return -1;
        }
        if (status != 0) {
            pyc_raise_code(CUBE_ERR_GRAPH_STATE,
                           "the stream is capturing a graph");
            return -1;
        }
    }
    return 0;
}

/* 0 while the event's client is open, else -1 with the error set. */
static int event_ready(pyc_event *e)
{
    return pyc_client_get(e->client) ? 0 : -1;
}

static PyObject *event_record(pyc_event *self, PyObject *args)
{
    PyObject *stream = Py_None;
    if (!PyArg_UnpackTuple(args, "record", 0, 1, &stream))
        return NULL;
    void *native;
    if (resolve_stream(self, stream, "Event.record", &native) < 0)
        return NULL;
    if (is_cuda(self)) {
        curesult r;
        IN_CTX(self->cu_ctx, r, cu.event_record(self->cu_event, native));
        if (r != CU_SUCCESS)
            return cu_raise("cuEventRecord", r);
    } else {
        self->host_ns = host_now_ns();
    }
    self->recorded = 1;
    Py_RETURN_NONE;
}

static PyObject *event_wait(pyc_event *self, PyObject *args)
{
    PyObject *stream = Py_None;
    if (!PyArg_UnpackTuple(args, "wait", 0, 1, &stream))
        return NULL;
    void *native;
    if (resolve_stream(self, stream, "Event.wait", &native) < 0)
        return NULL;
    /* An event never recorded has nothing to wait for (as in CUDA). */
    if (is_cuda(self) && self->recorded) {
        curesult r;
        IN_CTX(self->cu_ctx, r,
               cu.stream_wait_event(native, self->cu_event, 0));
        if (r != CU_SUCCESS)
            return cu_raise("cuStreamWaitEvent", r);
    }
    Py_RETURN_NONE;
}

static PyObject *event_synchronize(pyc_event *self, PyObject *unused)
{
    (void)unused;
    if (event_ready(self) < 0)
        return NULL;
    if (!is_cuda(self) || !self->recorded)
        Py_RETURN_NONE;
    curesult r;
    PYC_NOGIL(self->client,
              IN_CTX(self->cu_ctx, r, cu.event_synchronize(self->cu_event)));
    if (r != CU_SUCCESS)
        return cu_raise("cuEventSynchronize", r);
    Py_RETURN_NONE;
}

static PyObject *event_query(pyc_event *self, PyObject *unused)
{
    (void)unused;
    if (event_ready(self) < 0)
        return NULL;
    if (!is_cuda(self) || !self->recorded)
        Py_RETURN_TRUE;
    curesult r;
    IN_CTX(self->cu_ctx, r, cu.event_query(self->cu_event));
    if (r == CU_SUCCESS)
        Py_RETURN_TRUE;
    if (r == CU_ERROR_NOT_READY)
        Py_RETURN_FALSE;
    return cu_raise("cuEventQuery", r);
}

static PyObject *event_elapsed_time(pyc_event *self, PyObject *end_obj)
{
    if (!PyObject_TypeCheck(end_obj, pyc_g.event_type))
        return PyErr_Format(PyExc_TypeError,
                            "cubert: elapsed_time takes an Event, not %R",
                            (PyObject *)Py_TYPE(end_obj));
    pyc_event *end = (pyc_event *)end_obj;
    if (event_ready(self) < 0)
        return NULL;
    if (end->client != self->client)
        return pyc_raise_invalid("elapsed_time: an event of another client");
    if (!self->timing || !end->timing)
        return pyc_raise_invalid("elapsed_time: an event made with "
                                 "timing=False");
    if (!self->recorded || !end->recorded)
        return pyc_raise_invalid("elapsed_time: an event not recorded yet");
    if (!is_cuda(self))
        return PyFloat_FromDouble(
            ((double)end->host_ns - (double)self->host_ns) / 1e6);
    /* The end must be reached before the driver can tell. */
    PyObject *done = event_synchronize(end, NULL);
    if (!done)
        return NULL;
    Py_DECREF(done);
    float ms = 0;
    curesult r;
    IN_CTX(self->cu_ctx, r,
           cu.event_elapsed(&ms, self->cu_event, end->cu_event));
    if (r != CU_SUCCESS)
        return cu_raise("cuEventElapsedTime", r);
    return PyFloat_FromDouble(ms);
}

static PyObject *event_client(pyc_event *self, void *closure)
{
    (void)closure;
    return Py_NewRef((PyObject *)self->client);
}

static PyObject *event_timing(pyc_event *self, void *closure)
{
    (void)closure;
    return PyBool_FromLong(self->timing);
}

static PyObject *event_recorded(pyc_event *self, void *closure)
{
    (void)closure;
    return PyBool_FromLong(self->recorded);
}

static PyObject *event_repr(pyc_event *self)
{
    return PyUnicode_FromFormat(
        "<cubert.Event of %s%s%s>", self->client->device,
        self->recorded ? ", recorded" : "", self->timing ? "" : ", no timing");
}

static PyMethodDef event_methods[] = {
    {"record", (PyCFunction)event_record, METH_VARARGS,
     "record($self, stream=None, /)\n--\n\n"
     "Marks the work issued so far on `stream`: None (the calling thread's "
     "stream), a Stream of this client, or a native stream (an int, a "
     "PyTorch or CuPy stream)."},
    {"wait", (PyCFunction)event_wait, METH_VARARGS,
     "wait($self, stream=None, /)\n--\n\n"
     "Work issued later on `stream` (as in record) waits, on the device, "
     "for the work the event marks; the host does not wait."},
    {"synchronize", (PyCFunction)event_synchronize, METH_NOARGS,
     "synchronize($self, /)\n--\n\n"
     "Waits on the host for the work the event marks."},
    {"query", (PyCFunction)event_query, METH_NOARGS,
     "query($self, /)\n--\n\n"
     "True when the work the event marks is done (or it was never "
     "recorded); never waits."},
    {"elapsed_time", (PyCFunction)event_elapsed_time, METH_O,
     "elapsed_time($self, end, /)\n--\n\n"
     "Milliseconds from this event to `end`, another event of the client; "
     "waits for `end` first."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef event_getset[] = {
    {"client", (getter)event_client, NULL, NULL, NULL},
    {"timing", (getter)event_timing, NULL, NULL, NULL},
    {"recorded", (getter)event_recorded, NULL, NULL, NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot event_slots[] = {
    {Py_tp_doc, (void *)"A point in a stream's work (Client.event)."},
    {Py_tp_dealloc, (void *)event_dealloc},
    {Py_tp_repr, (void *)event_repr},
    {Py_tp_methods, event_methods},
    {Py_tp_getset, event_getset},
    {0, NULL},
};

PyType_Spec pyc_event_spec = {
    "cubert._cubert.Event",
    sizeof(pyc_event),
    0,
    Py_TPFLAGS_DEFAULT | Py_TPFLAGS_DISALLOW_INSTANTIATION,
    event_slots,
};
