/* cubert.Kernel and Client.launch: arguments converted from Python values
 * to cube_arg without a detour through Python calls where avoidable. */
#include <string.h>

#include "pycubert.h"

/* cube_dim: an int or 1 to 3 ints, into dim[3] (left at 1 past them). */
static int cube_dim_from(PyObject *obj, uint32_t dim[3])
{
    int64_t v[CUBE_MAX_RANK];
    int n;
    if (pyc_shape_from(obj, v, &n) < 0)
        return -1;
    if (n < 1 || n > 3) {
        pyc_raise_invalid("cube_dim is an int or 1 to 3 ints");
        return -1;
    }
    for (int i = 0; i < n; i++) {
        if (v[i] > UINT32_MAX) {
            PyErr_SetString(PyExc_OverflowError,
                            "cubert: cube_dim above 2**32 - 1");
            return -1;
        }
        dim[i] = (uint32_t)v[i];
    }
    return 0;
}

static int kernel_init(pyc_kernel *self, PyObject *args, PyObject *kw)
{
    static char *names[] = {"source", "name", "cube_dim", NULL};
    const char *source, *name;
    PyObject *dim_obj = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "ss|O", names, &source, &name,
                                     &dim_obj))
        return -1;
    cube_kernel_desc d = {name, source, {1, 1, 1}};
    if (dim_obj && cube_dim_from(dim_obj, d.cube_dim) < 0)
        return -1;
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
    {Py_tp_doc, (void *)"Kernel(source, name, cube_dim=(1, 1, 1))\n--\n\n"
                        "A kernel in cube C, usable on any client."},
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

/* --- raw kernels --- */

/* A declared parameter from (kind, dtype or size). */
static int raw_param_from(PyObject *item, cube_raw_param *out)
{
    PyObject *kind_obj, *type_obj;
    if (!PyTuple_Check(item) || PyTuple_Size(item) != 2) {
        PyErr_SetString(PyExc_TypeError,
                        "cubert: a parameter is a (kind, dtype) pair: kind "
                        "'in', 'out', 'inout' or 'scalar'");
        return -1;
    }
    kind_obj = PyTuple_GetItem(item, 0);
    type_obj = PyTuple_GetItem(item, 1);
    const char *kind = PyUnicode_Check(kind_obj)
                           ? PyUnicode_AsUTF8AndSize(kind_obj, NULL)
                           : NULL;
    if (!kind) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError,
                            "cubert: a parameter's kind is a str");
        return -1;
    }
    static const struct {
        const char *name;
        cube_raw_param_kind kind;
    } kinds[] = {{"in", CUBE_RAW_BUFFER_IN},
                 {"out", CUBE_RAW_BUFFER_OUT},
                 {"inout", CUBE_RAW_BUFFER_INOUT},
                 {"scalar", CUBE_RAW_SCALAR}};
    size_t i = 0;
    while (i < 4 && strcmp(kind, kinds[i].name) != 0)
        i++;
    if (i == 4) {
        pyc_raise_invalidf("parameter kind '%s' is not 'in', 'out', "
                           "'inout' or 'scalar'",
                           kind);
        return -1;
    }
    out->kind = kinds[i].kind;
    if (PyLong_Check(type_obj)) {
        long size = PyLong_AsLong(type_obj);
        if (size == -1 && PyErr_Occurred())
            return -1;
        if (size < 0 || size > UINT32_MAX) {
            pyc_raise_invalid("a parameter's size is out of range");
            return -1;
        }
        out->size = (uint32_t)size;
        return 0;
    }
    const pyc_dtype *d = pyc_dtype_from(type_obj);
    if (!d)
        return -1;
    out->size = d->size;
    return 0;
}

static const struct {
    const char *name;
    cube_kernel_format format;
} raw_formats[] = {
    {"cuda", CUBE_KERNEL_CUDA_SOURCE},
    {"cubin", CUBE_KERNEL_CUDA_BINARY},
    {"ptx", CUBE_KERNEL_CUDA_BINARY},
    {"c", CUBE_KERNEL_C_SOURCE},
    {"shared_object", CUBE_KERNEL_SHARED_OBJECT},
};

/* RawKernel(code, name, params, *, format, cube_dim=(1, 1, 1),
 * options=None): a Kernel over backend source or a binary. */
PyObject *pyc_raw_kernel(PyObject *module, PyObject *args, PyObject *kw)
{
    (void)module;
    static char *names[] = {"code",     "name",    "params", "format",
                            "cube_dim", "options", NULL};
    PyObject *code, *params, *dim_obj = NULL;
    const char *name, *format = NULL, *options = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OsO|$sOz", names, &code, &name,
                                     &params, &format, &dim_obj, &options))
        return NULL;
    if (!format) {
        PyErr_SetString(PyExc_TypeError,
                        "cubert: RawKernel needs format= ('cuda', 'cubin', "
                        "'ptx', 'c' or 'shared_object')");
        return NULL;
    }
    cube_raw_kernel_desc d;
    memset(&d, 0, sizeof d);
    d.name = name;
    d.options = options;
    size_t f = 0, nf = sizeof raw_formats / sizeof raw_formats[0];
    while (f < nf && strcmp(format, raw_formats[f].name) != 0)
        f++;
    if (f == nf)
        return pyc_raise_invalidf("format '%s' is not 'cuda', 'cubin', "
                                  "'ptx', 'c' or 'shared_object'",
                                  format);
    d.format = raw_formats[f].format;
    int binary = d.format == CUBE_KERNEL_CUDA_BINARY ||
                 d.format == CUBE_KERNEL_SHARED_OBJECT;
    if (PyUnicode_Check(code) && !binary) {
        d.source = PyUnicode_AsUTF8AndSize(code, NULL);
        if (!d.source)
            return NULL;
    } else if (PyBytes_Check(code) && binary) {
        char *p;
        Py_ssize_t n;
        if (PyBytes_AsStringAndSize(code, &p, &n) < 0)
            return NULL;
        d.binary = p;
        d.binary_size = (size_t)n;
    } else if (PyUnicode_Check(code) && binary) {
        /* PTX is text: take it as such. */
        Py_ssize_t n;
        const char *p = PyUnicode_AsUTF8AndSize(code, &n);
        if (!p)
            return NULL;
        d.binary = p;
        d.binary_size = (size_t)n;
    } else {
        PyErr_SetString(PyExc_TypeError,
                        "cubert: source is a str, a binary is bytes");
        return NULL;
    }
    Py_ssize_t np = PySequence_Check(params) ? PySequence_Size(params) : -1;
    if (np < 0) {
        PyErr_Clear();
        PyErr_SetString(PyExc_TypeError,
                        "cubert: params is a sequence of (kind, dtype)");
        return NULL;
    }
    if (np > CUBE_MAX_PARAMS)
        return pyc_raise_invalidf("at most %d parameters", CUBE_MAX_PARAMS);
    cube_raw_param p[CUBE_MAX_PARAMS];
    for (Py_ssize_t i = 0; i < np; i++) {
        PyObject *item = PySequence_GetItem(params, i);
        if (!item)
            return NULL;
        int rc = raw_param_from(item, &p[i]);
        Py_DECREF(item);
        if (rc < 0)
            return NULL;
    }
    d.params = np ? p : NULL;
    d.nparams = (uint32_t)np;
    d.cube_dim[0] = d.cube_dim[1] = d.cube_dim[2] = 1;
    if (dim_obj && cube_dim_from(dim_obj, d.cube_dim) < 0)
        return NULL;
    cube_kernel *k;
    cube_error *err = cube_kernel_create_raw(&d, &k);
    if (err)
        return pyc_raise(err);
    pyc_kernel *obj = PyObject_New(pyc_kernel, pyc_g.kernel_type);
    if (!obj) {
        cube_kernel_release(k);
        return NULL;
    }
    obj->k = k;
    return (PyObject *)obj;
}

/* --- launch --- */

/* One argument: a Buffer of `c`, a float (f32), an int (i32) or an object
 * whose tobytes() gives 1, 2, 4 or 8 bytes (a NumPy scalar). */
/* The handle of Buffer `obj`, which must be of client `c`. */
static int own_buffer(PyObject *obj, cube_client *c, const char *what,
                      cube_handle *h)
{
    cube_client *bc = pyc_buffer_get(obj, h);
    if (!bc)
        return -1;
    if (bc != c) {
        pyc_raise_invalidf("a %s of another client", what);
        return -1;
    }
    return 0;
}

static int arg_from(PyObject *obj, cube_client *c, cube_arg *out)
{
    if (pyc_is_buffer(obj)) {
        cube_handle h;
        if (own_buffer(obj, c, "buffer", &h) < 0)
            return -1;
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
        if (own_buffer(obj, c, "count buffer", &h) < 0)
            return -1;
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
        else if (strcmp(k, "validate") == 0)
            bit = CUBE_LAUNCH_VALIDATE;
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
