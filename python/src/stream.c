/* cubert.Stream: one stream of a client as an object (Client.stream), a
 * context manager that makes the calling thread work on it within a
 * block, as `with torch.cuda.stream(s):` does. Streams are cubert's
 * (cube_stream_use); their native queues (cube_native_stream) are what
 * PyTorch and CuPy see. */
#include "pycubert.h"

/* The calling thread's own stream id (the same on every client):
 * learnt once, since a choice must be given back as 0, not as that id,
 * to end it. */
static _Thread_local cube_stream_id own_stream_id;

cube_error *pyc_stream_switch(cube_client *c, cube_stream_id id,
                              cube_stream_id *saved)
{
    cube_stream_id current = cube_stream_current(c);
    if (!own_stream_id) {
        /* Dropping the choice and putting it back leaves no trace: the
         * slot just freed takes it again. */
        cube_error_free(cube_stream_use(c, 0));
        own_stream_id = cube_stream_current(c);
        if (current != own_stream_id)
            cube_error_free(cube_stream_use(c, current));
    }
    *saved = current == own_stream_id ? 0 : current;
    return current == id ? NULL : cube_stream_use(c, id);
}

void pyc_stream_restore(cube_client *c, cube_stream_id saved)
{
    /* Never fails: the thread holds the slot its switch took. */
    cube_error_free(cube_stream_use(c, saved));
}

static int is_stream(PyObject *obj)
{
    return PyObject_TypeCheck(obj, pyc_g.stream_type);
}

int pyc_stream_arg(pyc_client *client, PyObject *obj, cube_stream_id *id)
{
    if (obj == Py_None) {
        *id = cube_stream_current(client->c);
        return 1;
    }
    if (!is_stream(obj))
        return 0;
    pyc_stream *s = (pyc_stream *)obj;
    if (s->client != client) {
        pyc_raise_invalid("a stream of another client");
        return -1;
    }
    *id = s->id;
    return 1;
}

int pyc_native_stream_from(pyc_client *client, PyObject *obj,
                           const char *accepted, void **out)
{
    /* PyTorch's and CuPy's stream objects carry their CUstream. */
    static const char *const attrs[] = {"cuda_stream", "ptr"};
    PyObject *value = NULL;
    for (size_t i = 0; !value && i < 2 && !PyLong_Check(obj); i++) {
        if (PyObject_HasAttrString(obj, attrs[i]))
            value = PyObject_GetAttrString(obj, attrs[i]);
        if (!value && PyErr_Occurred())
            return -1;
    }
    uint64_t v;
    int rc =
        pyc_index_u64(value ? value : obj, "a native stream", UINTPTR_MAX, &v);
    Py_XDECREF(value);
    if (rc < 0) {
        if (PyErr_ExceptionMatches(PyExc_TypeError)) {
            PyErr_Clear();
            PyErr_Format(PyExc_TypeError, "cubert: a stream here is %s, not %R",
                         accepted, (PyObject *)Py_TYPE(obj));
        }
        return -1;
    }
    *out = (void *)(uintptr_t)v;
    if (client->dl_device_type == CUBE_DL_CUDA && v == 0)
        *out = CUBE_NATIVE_STREAM_LEGACY;
    return 0;
}

/* --- the type --- */

static PyObject *stream_new(pyc_client *client, cube_stream_id id)
{
    pyc_stream *s = (pyc_stream *)PyType_GenericAlloc(pyc_g.stream_type, 0);
    if (!s)
        return NULL;
    s->entered = PyList_New(0);
    if (!s->entered) {
        Py_DECREF(s);
        return NULL;
    }
    Py_INCREF(client);
    s->client = client;
    s->id = id;
    return (PyObject *)s;
}

PyObject *pyc_client_stream(pyc_client *self, PyObject *args)
{
    PyObject *arg = Py_None;
    if (!PyArg_UnpackTuple(args, "stream", 0, 1, &arg) || !pyc_client_get(self))
        return NULL;
    cube_stream_id id;
    int rc = pyc_stream_arg(self, arg, &id);
    if (rc < 0)
        return NULL;
    if (rc && arg != Py_None)
        return Py_NewRef(arg);
    if (!rc) {
        uint64_t v;
        if (pyc_index_u64(arg, "a stream id", UINT64_MAX, &v) < 0)
            return NULL;
        if (v == 0)
            return pyc_raise_invalid("stream id 0 names no stream (stream() "
                                     "is the calling thread's current one; "
                                     "use_stream(0) goes back to the "
                                     "thread's own)");
        id = v;
    }
    return stream_new(self, id);
}

PyObject *pyc_client_use_stream(pyc_client *self, PyObject *arg)
{
    cube_client *c = pyc_client_get(self);
    if (!c)
        return NULL;
    cube_stream_id id;
    int rc = arg == Py_None ? 0 : pyc_stream_arg(self, arg, &id);
    if (rc < 0)
        return NULL;
    if (!rc && pyc_index_u64(arg, "a stream id", UINT64_MAX, &id) < 0)
        return NULL;
    cube_error *err = cube_stream_use(c, id);
    if (err)
        return pyc_raise(err);
    Py_RETURN_NONE;
}

static void stream_dealloc(pyc_stream *self)
{
    PyTypeObject *tp = Py_TYPE(self);
    Py_CLEAR(self->entered);
    Py_CLEAR(self->client);
    freefunc f = (freefunc)PyType_GetSlot(tp, Py_tp_free);
    f(self);
    Py_DECREF(tp);
}

static PyObject *stream_enter(pyc_stream *self, PyObject *unused)
{
    (void)unused;
    cube_client *c = pyc_client_get(self->client);
    if (!c)
        return NULL;
    cube_stream_id saved;
    cube_error *err = pyc_stream_switch(c, self->id, &saved);
    if (err)
        return pyc_raise(err);
    PyObject *entry = Py_BuildValue("(kK)", PyThread_get_thread_ident(),
                                    (unsigned long long)saved);
    if (!entry || PyList_Append(self->entered, entry) < 0) {
        Py_XDECREF(entry);
        pyc_stream_restore(c, saved);
        return NULL;
    }
    Py_DECREF(entry);
    return Py_NewRef(self);
}

static PyObject *stream_exit(pyc_stream *self, PyObject *args)
{
    (void)args;
    /* This thread's innermost entry: the object may be entered on
     * several threads at once. */
    unsigned long me = PyThread_get_thread_ident();
    Py_ssize_t n = PyList_Size(self->entered);
    for (Py_ssize_t i = n - 1; i >= 0; i--) {
        PyObject *entry = PyList_GetItem(self->entered, i);
        unsigned long thread = PyLong_AsUnsignedLong(PyTuple_GetItem(entry, 0));
        if (thread != me)
            continue;
        cube_stream_id saved =
            PyLong_AsUnsignedLongLong(PyTuple_GetItem(entry, 1));
        if (PySequence_DelItem(self->entered, i) < 0)
            return NULL;
        /* A client closed in the block ended the choice with it. */
        if (self->client->c)
            pyc_stream_restore(self->client->c, saved);
        break;
    }
    Py_RETURN_NONE;
}

/* Runs `fn` on this stream: the calling thread switches to it for the
 * call, without the GIL, and back. */
typedef cube_error *(*on_stream_fn)(cube_client *c, void *ctx);

static int run_on_stream(pyc_stream *self, on_stream_fn fn, void *ctx)
{
    cube_client *c = pyc_client_get(self->client);
    if (!c)
        return -1;
    cube_stream_id saved;
    cube_error *err = pyc_stream_switch(c, self->id, &saved);
    if (err) {
        pyc_raise(err);
        return -1;
    }
    PYC_NOGIL(self->client, err = fn(c, ctx));
    pyc_stream_restore(c, saved);
    if (err) {
        pyc_raise(err);
        return -1;
    }
    return 0;
}

static cube_error *sync_all(cube_client *c, void *ctx)
{
    (void)ctx;
    return cube_sync(c, NULL, 0);
}

static cube_error *native_of(cube_client *c, void *ctx)
{
    return cube_native_stream(c, (void **)ctx);
}

static PyObject *stream_synchronize(pyc_stream *self, PyObject *unused)
{
    (void)unused;
    if (run_on_stream(self, sync_all, NULL) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *stream_native(pyc_stream *self, void *closure)
{
    (void)closure;
    void *native = NULL;
    if (run_on_stream(self, native_of, &native) < 0)
        return NULL;
    return PyLong_FromUnsignedLongLong((unsigned long long)(uintptr_t)native);
}

static PyObject *stream_wait_event(pyc_stream *self, PyObject *event)
{
    if (!PyObject_TypeCheck(event, pyc_g.event_type))
        return PyErr_Format(PyExc_TypeError,
                            "cubert: wait_event takes an Event, not %R",
                            (PyObject *)Py_TYPE(event));
    return PyObject_CallMethod(event, "wait", "O", (PyObject *)self);
}

static PyObject *stream_record_event(pyc_stream *self, PyObject *args)
{
    PyObject *given = Py_None;
    if (!PyArg_UnpackTuple(args, "record_event", 0, 1, &given))
        return NULL;
    if (given != Py_None && !PyObject_TypeCheck(given, pyc_g.event_type))
        return PyErr_Format(PyExc_TypeError,
                            "cubert: record_event takes an Event or None, "
                            "not %R",
                            (PyObject *)Py_TYPE(given));
    PyObject *event = given != Py_None ? Py_NewRef(given) : NULL;
    if (!event) {
        PyObject *none = PyTuple_New(0);
        event = none ? pyc_client_event(self->client, none, NULL) : NULL;
        Py_XDECREF(none);
        if (!event)
            return NULL;
    }
    PyObject *r = PyObject_CallMethod(event, "record", "O", (PyObject *)self);
    if (!r) {
        Py_DECREF(event);
        return NULL;
    }
    Py_DECREF(r);
    return event;
}

static PyObject *stream_id(pyc_stream *self, void *closure)
{
    (void)closure;
    return PyLong_FromUnsignedLongLong(self->id);
}

static PyObject *stream_client(pyc_stream *self, void *closure)
{
    (void)closure;
    return Py_NewRef((PyObject *)self->client);
}

static PyObject *stream_repr(pyc_stream *self)
{
    /* A thread's own stream has the top bit set (cube_stream_use): its
     * id reads better in hex; an application's own in decimal. */
    char id[32];
    PyOS_snprintf(id, sizeof id, self->id >> 63 ? "%#llx" : "%llu",
                  (unsigned long long)self->id);
    return PyUnicode_FromFormat("<cubert.Stream %s of %s%s>", id,
                                self->client->device,
                                self->id >> 63 ? " (a thread's own)" : "");
}

static PyObject *stream_richcompare(PyObject *a, PyObject *b, int op)
{
    if ((op != Py_EQ && op != Py_NE) || !is_stream(a) || !is_stream(b))
        Py_RETURN_NOTIMPLEMENTED;
    const pyc_stream *x = (const pyc_stream *)a, *y = (const pyc_stream *)b;
    int same = x->client == y->client && x->id == y->id;
    return PyBool_FromLong(op == Py_EQ ? same : !same);
}

static Py_hash_t stream_hash(pyc_stream *self)
{
    Py_hash_t h = (Py_hash_t)(self->id ^ ((uintptr_t)self->client >> 4));
    return h == -1 ? -2 : h;
}

static PyMethodDef stream_methods[] = {
    {"__enter__", (PyCFunction)stream_enter, METH_NOARGS,
     "__enter__($self, /)\n--\n\n"
     "Makes the calling thread work on this stream until __exit__."},
    {"__exit__", (PyCFunction)stream_exit, METH_VARARGS,
     "__exit__($self, exc_type, exc, tb, /)\n--\n\n"
     "Gives the calling thread back the stream it worked on before."},
    {"synchronize", (PyCFunction)stream_synchronize, METH_NOARGS,
     "synchronize($self, /)\n--\n\n"
     "Waits for all the work issued on this stream (cube_sync of no "
     "buffers), then raises a device fault if there is one."},
    {"wait_event", (PyCFunction)stream_wait_event, METH_O,
     "wait_event($self, event, /)\n--\n\n"
     "This stream's later work waits for `event` (event.wait(self))."},
    {"record_event", (PyCFunction)stream_record_event, METH_VARARGS,
     "record_event($self, event=None, /)\n--\n\n"
     "Records `event` (a new Event when None) on this stream; returns it."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef stream_getset[] = {
    {"id", (getter)stream_id, NULL, "The stream's id (cube_stream_id).", NULL},
    {"client", (getter)stream_client, NULL, NULL, NULL},
    {"native", (getter)stream_native, NULL,
     "The stream's native queue as an int: a CUstream on CUDA, 0 on host "
     "backends.",
     NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot stream_slots[] = {
    {Py_tp_doc, (void *)"A stream of a client (Client.stream)."},
    {Py_tp_dealloc, (void *)stream_dealloc},
    {Py_tp_repr, (void *)stream_repr},
    {Py_tp_richcompare, (void *)stream_richcompare},
    {Py_tp_hash, (void *)stream_hash},
    {Py_tp_methods, stream_methods},
    {Py_tp_getset, stream_getset},
    {0, NULL},
};

PyType_Spec pyc_stream_spec = {
    "cubert._cubert.Stream",
    sizeof(pyc_stream),
    0,
    Py_TPFLAGS_DEFAULT | Py_TPFLAGS_DISALLOW_INSTANTIATION,
    stream_slots,
};
