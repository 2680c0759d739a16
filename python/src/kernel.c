/* cubert.Kernel and Client.launch: arguments converted from Python values
 * to cube_arg without a detour through Python calls where avoidable. */
#include <string.h>

#include "pycubert.h"

static int kernel_init(pyc_kernel *self, PyObject *args, PyObject *kw)
{
    static char *names[] = {"source", "name", "cube_dim", NULL};
    const char *source, *name;
    PyObject *dim_obj = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "ss|O", names, &source, &name,
                                     &dim_obj))
        return -1;
    cube_kernel_desc d = {name, source, {1, 1, 1}};
    if (dim_obj) {
        int64_t dim[CUBE_MAX_RANK];
        int n;
        if (pyc_shape_from(dim_obj, dim, &n) < 0)
            return -1;
        if (n < 1 || n > 3) {
            pyc_raise_invalid("cube_dim is an int or 1 to 3 ints");
            return -1;
        }
        for (int i = 0; i < n; i++) {
            if (dim[i] > UINT32_MAX) {
                PyErr_SetString(PyExc_OverflowError,
                                "cubert: cube_dim above 2**32 - 1");
                return -1;
            }
            d.cube_dim[i] = (uint32_t)dim[i];
        }
    }
    cube_kernel *k;
    cube_error *err = cube_kernel_create(&d, &k);
    if (err) {
        pyc_raise(err);
        return -1;
    }
    cube_kernel_release(self->k);
    self->k = k;
    return 0;
}

static void kernel_dealloc(pyc_kernel *self)
{
    PyTypeObject *tp = Py_TYPE(self);
    cube_kernel_release(self->k);
    freefunc f = (freefunc)PyType_GetSlot(tp, Py_tp_free);
    f(self);
    Py_DECREF(tp);
}

static cube_kernel *kernel_get(PyObject *obj)
{
    if (!PyObject_TypeCheck(obj, pyc_g.kernel_type)) {
        PyErr_Format(PyExc_TypeError, "cubert: expected a Kernel, got %R",
                     (PyObject *)Py_TYPE(obj));
        return NULL;
    }
    cube_kernel *k = ((pyc_kernel *)obj)->k;
    if (!k)
        PyErr_SetString(PyExc_TypeError, "cubert: the Kernel was not made");
    return k;
}

static PyObject *kernel_name(pyc_kernel *self, void *closure)
{
    (void)closure;
    return PyUnicode_FromString(cube_kernel_name(self->k));
}

static PyObject *kernel_id(pyc_kernel *self, void *closure)
{
    (void)closure;
    return PyLong_FromUnsignedLongLong(cube_kernel_id(self->k));
}

static PyObject *kernel_repr(pyc_kernel *self)
{
    return PyUnicode_FromFormat("<cubert.Kernel %s>",
                                cube_kernel_name(self->k));
}

static PyGetSetDef kernel_getset[] = {
    {"name", (getter)kernel_name, NULL, NULL, NULL},
    {"id", (getter)kernel_id, NULL, NULL, NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot kernel_slots[] = {
    {Py_tp_doc, (void *)"Kernel(source, name, cube_dim=(1, 1, 1)): a kernel "
                        "in cube C, usable on any client."},
    {Py_tp_new, (void *)PyType_GenericNew},
    {Py_tp_init, (void *)kernel_init},
    {Py_tp_dealloc, (void *)kernel_dealloc},
    {Py_tp_repr, (void *)kernel_repr},
    {Py_tp_getset, kernel_getset},
    {0, NULL},
};

PyType_Spec pyc_kernel_spec = {
    "cubert._cubert.Kernel", sizeof(pyc_kernel), 0,
    Py_TPFLAGS_DEFAULT,      kernel_slots,
};

/* --- launch --- */

/* One argument: a Buffer of `c`, a float (f32), an int (i32) or an object
 * whose tobytes() gives 1, 2, 4 or 8 bytes (a NumPy scalar). */
static int arg_from(PyObject *obj, cube_client *c, cube_arg *out)
{
    if (pyc_is_buffer(obj)) {
        cube_handle h;
        cube_client *bc = pyc_buffer_get(obj, &h);
        if (!bc)
            return -1;
        if (bc != c) {
            pyc_raise_invalid("a buffer of another client");
            return -1;
        }
        *out = cube_arg_buffer(h);
        return 0;
    }
    if (PyFloat_CheckExact(obj)) {
        *out = cube_arg_f32((float)PyFloat_AsDouble(obj));
        return 0;
    }
    if (PyLong_CheckExact(obj)) {
        long long v = PyLong_AsLongLong(obj);
        if (v == -1 && PyErr_Occurred())
            return -1;
        if (v < INT32_MIN || v > INT32_MAX) {
            PyErr_SetString(PyExc_OverflowError,
                            "cubert: a Python int is passed as a 32-bit "
                            "integer; use a NumPy scalar (np.int64) for "
                            "other widths");
            return -1;
        }
        *out = cube_arg_i32((int32_t)v);
        return 0;
    }
    PyObject *b = PyObject_HasAttrString(obj, "tobytes")
                      ? PyObject_CallMethod(obj, "tobytes", NULL)
                      : NULL;
    if (!b || !PyBytes_Check(b)) {
        Py_XDECREF(b);
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError,
                     "cubert: a launch argument is a Buffer, a float, an int "
                     "or a NumPy scalar, not %R",
                     (PyObject *)Py_TYPE(obj));
        return -1;
    }
    char *p;
    Py_ssize_t n;
    if (PyBytes_AsStringAndSize(b, &p, &n) < 0) {
        Py_DECREF(b);
        return -1;
    }
    if (n != 1 && n != 2 && n != 4 && n != 8) {
        Py_DECREF(b);
        PyErr_Format(PyExc_TypeError,
                     "cubert: a scalar argument has 1, 2, 4 or 8 bytes, not "
                     "%zd",
                     n);
        return -1;
    }
    *out = cube_arg_scalar(p, (uint32_t)n);
    Py_DECREF(b);
    return 0;
}

static int count_from(PyObject *obj, cube_client *c, cube_count *out)
{
    if (pyc_is_buffer(obj)) {
        cube_handle h;
        cube_client *bc = pyc_buffer_get(obj, &h);
        if (!bc)
            return -1;
        if (bc != c) {
            pyc_raise_invalid("a count buffer of another client");
            return -1;
        }
        *out = cube_count_dynamic(h);
        return 0;
    }
    int64_t v[CUBE_MAX_RANK] = {0};
    int n;
    if (pyc_shape_from(obj, v, &n) < 0)
        return -1;
    if (n < 1 || n > 3) {
        pyc_raise_invalid("a count is an int, 1 to 3 ints or a Buffer");
        return -1;
    }
    for (int i = 0; i < 3; i++) {
        if (i >= n)
            v[i] = 1;
        if (v[i] > UINT32_MAX) {
            PyErr_SetString(PyExc_OverflowError,
                            "cubert: a count above 2**32 - 1");
            return -1;
        }
    }
    *out = cube_count_static((uint32_t)v[0], (uint32_t)v[1], (uint32_t)v[2]);
    return 0;
}

PyObject *pyc_client_launch(pyc_client *self, PyObject *const *args,
                            Py_ssize_t nargs, PyObject *kwnames)
{
    if (nargs < 2) {
        PyErr_SetString(PyExc_TypeError,
                        "cubert: launch(kernel, count, *args)");
        return NULL;
    }
    uint32_t mode = CUBE_LAUNCH_EXECUTE;
    Py_ssize_t nkw = kwnames ? PyTuple_Size(kwnames) : 0;
    for (Py_ssize_t i = 0; i < nkw; i++) {
        const char *k =
            PyUnicode_AsUTF8AndSize(PyTuple_GetItem(kwnames, i), NULL);
        if (!k)
            return NULL;
        int on = PyObject_IsTrue(args[nargs + i]);
        if (on < 0)
            return NULL;
        uint32_t bit;
        if (strcmp(k, "checked") == 0)
            bit = CUBE_LAUNCH_CHECKED;
        else if (strcmp(k, "skip") == 0)
            bit = CUBE_LAUNCH_SKIP;
        else
            return PyErr_Format(PyExc_TypeError,
                                "cubert: launch() got an unexpected keyword "
                                "'%s'",
                                k);
        if (on)
            mode |= bit;
    }
    cube_client *c = pyc_client_get(self);
    if (!c)
        return NULL;
    cube_kernel *k = kernel_get(args[0]);
    if (!k)
        return NULL;
    cube_count count;
    if (count_from(args[1], c, &count) < 0)
        return NULL;
    size_t n = (size_t)(nargs - 2);
    cube_arg local[16];
    cube_arg *a = local;
    if (n > 16 && !(a = PyMem_Calloc(n, sizeof *a)))
        return PyErr_NoMemory();
    for (size_t i = 0; i < n; i++)
        if (arg_from(args[2 + i], c, &a[i]) < 0) {
            if (a != local)
                PyMem_Free(a);
            return NULL;
        }
    cube_error *err;
    PYC_NOGIL(self, err = cube_launch(c, k, count, a, n, mode));
    if (a != local)
        PyMem_Free(a);
    if (err)
        return pyc_raise(err);
    Py_RETURN_NONE;
}
