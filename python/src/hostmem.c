/* The memory of Python objects: bytes, bytearray, and the array
 * interfaces (__array_interface__ for host memory, __cuda_array_interface__
 * for CUDA memory), read without the buffer protocol (not in the 3.10
 * stable ABI) and without NumPy's C API. */
#include "pycubert.h"

/* Parses one array-interface dict into `out` (data, shape, dtype, bytes). */
static int parse_interface(PyObject *iface, const char *what,
                           pyc_host_view *out)
{
    if (!PyDict_Check(iface)) {
        PyErr_Format(PyExc_TypeError, "cubert: %s is not a dict", what);
        return -1;
    }
    PyObject *typestr = PyDict_GetItemString(iface, "typestr");
    PyObject *shape = PyDict_GetItemString(iface, "shape");
    PyObject *data = PyDict_GetItemString(iface, "data");
    PyObject *strides = PyDict_GetItemString(iface, "strides");
    if (!typestr || !shape || !data) {
        PyErr_Format(PyExc_TypeError, "cubert: %s lacks typestr, shape or data",
                     what);
        return -1;
    }
    out->dtype = pyc_dtype_from(typestr);
    if (!out->dtype)
        return -1;
    if (pyc_shape_from(shape, out->shape, &out->ndim) < 0)
        return -1;
    int64_t bytes = pyc_shape_bytes(out->shape, out->ndim, out->dtype->size);
    if (bytes < 0)
        return -1;
    out->nbytes = (uint64_t)bytes;
    if (!PyTuple_Check(data) || PyTuple_Size(data) != 2) {
        PyErr_Format(PyExc_TypeError,
                     "cubert: %s's data is not an (address, read-only) "
                     "pair (objects exposing a buffer are not supported)",
                     what);
        return -1;
    }
    unsigned long long addr =
        PyLong_AsUnsignedLongLong(PyTuple_GetItem(data, 0));
    if (addr == (unsigned long long)-1 && PyErr_Occurred())
        return -1;
    int ro = PyObject_IsTrue(PyTuple_GetItem(data, 1));
    if (ro < 0)
        return -1;
    out->data = (void *)(uintptr_t)addr;
    out->readonly = ro;
    /* Strides in bytes; None (or absent) is C-contiguous. Anything else
     * must be the C-contiguous strides spelled out. */
    if (strides && strides != Py_None) {
        int64_t st[CUBE_MAX_RANK];
        int n;
        if (pyc_shape_from(strides, st, &n) < 0)
            return -1;
        int64_t expect = out->dtype->size;
        for (int i = out->ndim - 1; i >= 0; i--) {
            if (i >= n || (out->shape[i] > 1 && st[i] != expect)) {
                pyc_raise_invalidf(
                    "the %s describes memory that is not "
                    "C-contiguous (numpy.ascontiguousarray makes "
                    "such a copy)",
                    what);
                return -1;
            }
            expect *= out->shape[i];
        }
    }
    return 0;
}

int pyc_host_view_get(PyObject *obj, int want_writable, pyc_host_view *out)
{
    memset(out, 0, sizeof *out);
    if (PyBytes_Check(obj) || PyByteArray_Check(obj)) {
        if (PyBytes_Check(obj)) {
            if (want_writable) {
                PyErr_SetString(PyExc_TypeError, "cubert: bytes are read-only");
                return -1;
            }
            char *p;
            Py_ssize_t n;
            if (PyBytes_AsStringAndSize(obj, &p, &n) < 0)
                return -1;
            out->data = p;
            out->nbytes = (uint64_t)n;
            out->readonly = 1;
        } else {
            out->data = PyByteArray_AsString(obj);
            out->nbytes = (uint64_t)PyByteArray_Size(obj);
        }
        out->ndim = 1;
        out->shape[0] = (int64_t)out->nbytes;
        out->dtype = NULL;
        Py_INCREF(obj);
        out->owner = obj;
        return 0;
    }
    PyObject *iface = PyObject_GetAttrString(obj, "__array_interface__");
    if (!iface) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError,
                     "cubert: expected bytes, bytearray or an object with "
                     "__array_interface__, got %R",
                     (PyObject *)Py_TYPE(obj));
        return -1;
    }
    int rc = parse_interface(iface, "__array_interface__", out);
    Py_DECREF(iface);
    if (rc < 0)
        return -1;
    if (want_writable && out->readonly) {
        pyc_raise_invalid("the array is read-only");
        return -1;
    }
    Py_INCREF(obj);
    out->owner = obj;
    return 0;
}

int pyc_cuda_view_get(PyObject *obj, pyc_host_view *out)
{
    memset(out, 0, sizeof *out);
    PyObject *iface = PyObject_GetAttrString(obj, "__cuda_array_interface__");
    if (!iface) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError,
                     "cubert: a CUDA client wraps objects with "
                     "__cuda_array_interface__, got %R",
                     (PyObject *)Py_TYPE(obj));
        return -1;
    }
    int rc = parse_interface(iface, "__cuda_array_interface__", out);
    Py_DECREF(iface);
    if (rc < 0)
        return -1;
    Py_INCREF(obj);
    out->owner = obj;
    return 0;
}
