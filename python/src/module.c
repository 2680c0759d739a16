/* The cubert._cubert module: its types and the calls that need no client
 * (devices, backends). */
#include <string.h>

#include "pycubert.h"

pyc_state pyc_g;

static PyObject *info_dict(const cube_device_info *info)
{
    const cube_properties *p = &info->properties;
    return Py_BuildValue("{sssIsssssssKsIsI}", "device", info->device, "index",
                         info->index, "backend", p->backend, "name", p->name,
                         "architecture", p->architecture, "memory_total",
                         (unsigned long long)p->memory_total, "compute_units",
                         p->compute_units, "clients", info->clients);
}

/* devices(backend=None) -> list of dicts, one per device cubert can open
 * (backends that cannot run here are left out). */
static PyObject *mod_devices(PyObject *mod, PyObject *args, PyObject *kw)
{
    (void)mod;
    static char *names[] = {"backend", NULL};
    const char *only = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|z", names, &only))
        return NULL;
    PyObject *list = PyList_New(0);
    if (!list)
        return NULL;
    for (const char *const *b = cube_backend_names(); *b; b++) {
        if (only && strcmp(only, *b) != 0)
            continue;
        /* A backend that cannot run here (no driver) has no devices. */
        uint32_t n = 0;
        PyThreadState *ts = PyEval_SaveThread();
        cube_error *err = cube_device_count(*b, &n);
        PyEval_RestoreThread(ts);
        if (err) {
            cube_error_free(err);
            n = 0;
        }
        for (uint32_t i = 0; i < n; i++) {
            char name[48];
            PyOS_snprintf(name, sizeof name, "%s:%u", *b, i);
            cube_device_info info;
            if ((err = cube_device_describe(name, &info))) {
                Py_DECREF(list);
                return pyc_raise(err);
            }
            PyObject *d = info_dict(&info);
            if (!d || PyList_Append(list, d) < 0) {
                Py_XDECREF(d);
                Py_DECREF(list);
                return NULL;
            }
            Py_DECREF(d);
        }
    }
    return list;
}

static PyObject *mod_backends(PyObject *mod, PyObject *unused)
{
    (void)mod;
    (void)unused;
    PyObject *list = PyList_New(0);
    for (const char *const *b = cube_backend_names(); list && *b; b++) {
        PyObject *s = PyUnicode_FromString(*b);
        if (!s || PyList_Append(list, s) < 0) {
            Py_XDECREF(s);
            Py_CLEAR(list);
        }
        Py_XDECREF(s);
    }
    return list;
}

static PyMethodDef module_methods[] = {
    {"devices", (PyCFunction)(void (*)(void))mod_devices,
     METH_VARARGS | METH_KEYWORDS,
     "devices($module, /, backend=None)\n--\n\n"
     "A list of dicts describing each device cubert can open."},
    {"backends", mod_backends, METH_NOARGS,
     "backends($module, /)\n--\n\nNames of the backends in this build."},
    {"RawKernel", (PyCFunction)(void (*)(void))pyc_raw_kernel,
     METH_VARARGS | METH_KEYWORDS,
     "RawKernel($module, /, code, name, params, *, format, cube_dim=(1, 1, 1), "
     "options=None)\n--\n\nA Kernel over backend source or a binary."},
    {NULL, NULL, 0, NULL},
};

static PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    "cubert._cubert",
    "cubert's C extension (use the cubert package).",
    -1,
    module_methods,
    NULL,
    NULL,
    NULL,
    NULL,
};

static int add_type(PyObject *m, PyType_Spec *spec, PyTypeObject **slot,
                    const char *name)
{
    PyObject *t = PyType_FromSpec(spec);
    if (!t)
        return -1;
    *slot = (PyTypeObject *)t;
    Py_INCREF(t); /* one for the module state, one for the attribute */
    if (PyModule_AddObject(m, name, t) < 0) {
        Py_DECREF(t);
        return -1;
    }
    return 0;
}

PyMODINIT_FUNC PyInit__cubert(void);
PyMODINIT_FUNC PyInit__cubert(void)
{
    PyObject *m = PyModule_Create(&module_def);
    if (!m)
        return NULL;
    if (add_type(m, &pyc_client_spec, &pyc_g.client_type, "Client") < 0 ||
        add_type(m, &pyc_buffer_spec, &pyc_g.buffer_type, "Buffer") < 0 ||
        add_type(m, &pyc_kernel_spec, &pyc_g.kernel_type, "Kernel") < 0 ||
        add_type(m, &pyc_graph_spec, &pyc_g.graph_type, "Graph") < 0 ||
        add_type(m, &pyc_profile_spec, &pyc_g.profile_type, "Profile") < 0 ||
        add_type(m, &pyc_stream_spec, &pyc_g.stream_type, "Stream") < 0 ||
        add_type(m, &pyc_event_spec, &pyc_g.event_type, "Event") < 0 ||
        PyModule_AddIntConstant(m, "DLPACK_CPU", CUBE_DL_CPU) < 0 ||
        PyModule_AddIntConstant(m, "DLPACK_CUDA", CUBE_DL_CUDA) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
