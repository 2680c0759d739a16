/* cubert.Graph and cubert.Profile: context managers over a capture
 * (cube_graph_begin/end) and a profiling window (cube_profile_start/end). */
#include "pycubert.h"

enum { GRAPH_NEW, GRAPH_CAPTURING, GRAPH_READY, GRAPH_DESTROYED };

typedef struct {
    PyObject_HEAD pyc_client *client;
    cube_graph_id id;
    int state;
} pyc_graph;

typedef struct {
    PyObject_HEAD pyc_client *client;
    cube_profile_token token;
    int state; /* 0 new, 1 open, 2 ended, 3 abandoned */
    cube_profile_result result;
} pyc_profile;

PyObject *pyc_client_capture(pyc_client *self, PyObject *unused)
{
    (void)unused;
    if (!pyc_client_get(self))
        return NULL;
    pyc_graph *g = (pyc_graph *)PyType_GenericAlloc(pyc_g.graph_type, 0);
    if (!g)
        return NULL;
    Py_INCREF(self);
    g->client = self;
    return (PyObject *)g;
}

PyObject *pyc_client_profile(pyc_client *self, PyObject *unused)
{
    (void)unused;
    if (!pyc_client_get(self))
        return NULL;
    pyc_profile *p = (pyc_profile *)PyType_GenericAlloc(pyc_g.profile_type, 0);
    if (!p)
        return NULL;
    Py_INCREF(self);
    p->client = self;
    return (PyObject *)p;
}

static void graph_destroy_now(pyc_graph *g)
{
    if (g->state != GRAPH_READY || !g->client->c_open)
        return;
    g->state = GRAPH_DESTROYED;
    cube_error *err;
    PYC_NOGIL(g->client, err = cube_graph_destroy(g->client->c_open, g->id));
    cube_error_free(err);
}

static void graph_dealloc(pyc_graph *self)
{
    PyTypeObject *tp = Py_TYPE(self);
    graph_destroy_now(self);
    Py_CLEAR(self->client);
    freefunc f = (freefunc)PyType_GetSlot(tp, Py_tp_free);
    f(self);
    Py_DECREF(tp);
}

static PyObject *graph_enter(pyc_graph *self, PyObject *unused)
{
    (void)unused;
    if (self->state != GRAPH_NEW)
        return pyc_raise_invalid("a Graph records once");
    cube_client *c = pyc_client_get(self->client);
    if (!c)
        return NULL;
    cube_error *err;
    PYC_NOGIL(self->client, err = cube_graph_begin(c));
    if (err)
        return pyc_raise(err);
    self->state = GRAPH_CAPTURING;
    Py_INCREF(self);
    return (PyObject *)self;
}

static PyObject *graph_exit(pyc_graph *self, PyObject *args)
{
    PyObject *exc_type = PyTuple_GetItem(args, 0);
    if (self->state != GRAPH_CAPTURING)
        Py_RETURN_NONE;
    cube_client *c = pyc_client_get(self->client);
    if (!c)
        return NULL;
    cube_error *err;
    PYC_NOGIL(self->client, err = cube_graph_end(c, &self->id));
    if (err) {
        self->state = GRAPH_DESTROYED;
        /* The block's own exception says more than the end's. */
        if (exc_type && exc_type != Py_None) {
            cube_error_free(err);
            Py_RETURN_NONE;
        }
        return pyc_raise(err);
    }
    self->state = GRAPH_READY;
    if (exc_type && exc_type != Py_None)
        graph_destroy_now(self);
    Py_RETURN_NONE;
}

static PyObject *graph_replay(pyc_graph *self, PyObject *unused)
{
    (void)unused;
    if (self->state != GRAPH_READY)
        return pyc_raise_invalid(self->state == GRAPH_DESTROYED
                                     ? "the graph was destroyed"
                                     : "the graph was not recorded yet");
    cube_client *c = pyc_client_get(self->client);
    if (!c)
        return NULL;
    cube_error *err;
    PYC_NOGIL(self->client, err = cube_graph_replay(c, self->id));
    if (err)
        return pyc_raise(err);
    Py_RETURN_NONE;
}

static PyObject *graph_destroy(pyc_graph *self, PyObject *unused)
{
    (void)unused;
    graph_destroy_now(self);
    Py_RETURN_NONE;
}

static PyObject *graph_id(pyc_graph *self, void *closure)
{
    (void)closure;
    if (self->state != GRAPH_READY)
        Py_RETURN_NONE;
    return PyLong_FromUnsignedLongLong(self->id);
}

static PyObject *graph_repr(pyc_graph *self)
{
    const char *device = self->client->device;
    switch (self->state) {
    case GRAPH_NEW:
        return PyUnicode_FromFormat("<cubert.Graph of %s, not recorded>",
                                    device);
    case GRAPH_CAPTURING:
        return PyUnicode_FromFormat("<cubert.Graph of %s, recording>", device);
    case GRAPH_READY:
        return PyUnicode_FromFormat("<cubert.Graph %llu of %s>",
                                    (unsigned long long)self->id, device);
    default:
        return PyUnicode_FromFormat("<cubert.Graph of %s, destroyed>", device);
    }
}

static PyMethodDef graph_methods[] = {
    {"__enter__", (PyCFunction)graph_enter, METH_NOARGS,
     "__enter__($self, /)\n--\n\nStarts recording (cube_graph_begin)."},
    {"__exit__", (PyCFunction)graph_exit, METH_VARARGS,
     "__exit__($self, exc_type, exc, tb, /)\n--\n\n"
     "Ends the recording (cube_graph_end)."},
    {"replay", (PyCFunction)graph_replay, METH_NOARGS,
     "replay($self, /)\n--\n\nRuns the recorded launches again."},
    {"destroy", (PyCFunction)graph_destroy, METH_NOARGS,
     "destroy($self, /)\n--\n\n"
     "Frees the graph now (a second destroy does nothing)."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef graph_getset[] = {
    {"id", (getter)graph_id, NULL, NULL, NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot graph_slots[] = {
    {Py_tp_doc, (void *)"A recorded sequence of launches (Client.capture)."},
    {Py_tp_dealloc, (void *)graph_dealloc},
    {Py_tp_repr, (void *)graph_repr},
    {Py_tp_methods, graph_methods},
    {Py_tp_getset, graph_getset},
    {0, NULL},
};

PyType_Spec pyc_graph_spec = {
    "cubert._cubert.Graph",
    sizeof(pyc_graph),
    0,
    Py_TPFLAGS_DEFAULT | Py_TPFLAGS_DISALLOW_INSTANTIATION,
    graph_slots,
};

/* --- profiles --- */

static void profile_dealloc(pyc_profile *self)
{
    PyTypeObject *tp = Py_TYPE(self);
    if (self->state == 1 && self->client->c_open)
        cube_profile_abandon(self->client->c_open, self->token);
    Py_CLEAR(self->client);
    freefunc f = (freefunc)PyType_GetSlot(tp, Py_tp_free);
    f(self);
    Py_DECREF(tp);
}

static PyObject *profile_enter(pyc_profile *self, PyObject *unused)
{
    (void)unused;
    if (self->state != 0)
        return pyc_raise_invalid("a Profile measures once");
    cube_client *c = pyc_client_get(self->client);
    if (!c)
        return NULL;
    cube_error *err;
    PYC_NOGIL(self->client, err = cube_profile_start(c, &self->token));
    if (err)
        return pyc_raise(err);
    self->state = 1;
    Py_INCREF(self);
    return (PyObject *)self;
}

static PyObject *profile_exit(pyc_profile *self, PyObject *args)
{
    PyObject *exc_type = PyTuple_GetItem(args, 0);
    if (self->state != 1)
        Py_RETURN_NONE;
    cube_client *c = pyc_client_get(self->client);
    if (!c)
        return NULL;
    if (exc_type && exc_type != Py_None) {
        self->state = 3;
        cube_profile_abandon(c, self->token);
        Py_RETURN_NONE;
    }
    cube_error *err;
    PYC_NOGIL(self->client,
              err = cube_profile_end(c, self->token, &self->result));
    self->state = err ? 3 : 2;
    if (err)
        return pyc_raise(err);
    Py_RETURN_NONE;
}

static PyObject *profile_seconds(pyc_profile *self, void *closure)
{
    (void)closure;
    if (self->state != 2)
        Py_RETURN_NONE;
    return PyFloat_FromDouble(self->result.seconds);
}

static PyObject *profile_method(pyc_profile *self, void *closure)
{
    (void)closure;
    if (self->state != 2)
        Py_RETURN_NONE;
    return PyUnicode_FromString(
        self->result.method == CUBE_TIMING_DEVICE ? "device" : "host_clock");
}

static PyObject *profile_launches(pyc_profile *self, void *closure)
{
    (void)closure;
    if (self->state != 2)
        Py_RETURN_NONE;
    return PyLong_FromUnsignedLongLong(self->result.launches);
}

static PyObject *profile_repr(pyc_profile *self)
{
    const char *device = self->client->device;
    static const char *const states[] = {"not started", "open", NULL,
                                         "abandoned"};
    if (self->state != 2)
        return PyUnicode_FromFormat("<cubert.Profile of %s, %s>", device,
                                    states[self->state]);
    char seconds[32];
    PyOS_snprintf(seconds, sizeof seconds, "%.6g", self->result.seconds);
    return PyUnicode_FromFormat(
        "<cubert.Profile of %s: %s s (%s), %llu launches>", device, seconds,
        self->result.method == CUBE_TIMING_DEVICE ? "device" : "host_clock",
        (unsigned long long)self->result.launches);
}

static PyMethodDef profile_methods[] = {
    {"__enter__", (PyCFunction)profile_enter, METH_NOARGS,
     "__enter__($self, /)\n--\n\nOpens the window (cube_profile_start)."},
    {"__exit__", (PyCFunction)profile_exit, METH_VARARGS,
     "__exit__($self, exc_type, exc, tb, /)\n--\n\n"
     "Closes the window (cube_profile_end); an exception abandons it."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef profile_getset[] = {
    {"seconds", (getter)profile_seconds, NULL, NULL, NULL},
    {"method", (getter)profile_method, NULL, NULL, NULL},
    {"launches", (getter)profile_launches, NULL, NULL, NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot profile_slots[] = {
    {Py_tp_doc, (void *)"A profiling window (Client.profile)."},
    {Py_tp_dealloc, (void *)profile_dealloc},
    {Py_tp_repr, (void *)profile_repr},
    {Py_tp_methods, profile_methods},
    {Py_tp_getset, profile_getset},
    {0, NULL},
};

PyType_Spec pyc_profile_spec = {
    "cubert._cubert.Profile",
    sizeof(pyc_profile),
    0,
    Py_TPFLAGS_DEFAULT | Py_TPFLAGS_DISALLOW_INSTANTIATION,
    profile_slots,
};
