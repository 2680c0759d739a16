/* Element types and shapes: names, NumPy's array-interface codes and
 * DLPack codes of the types cubert buffers carry. */
#include <string.h>

#include "pycubert.h"

static const pyc_dtype dtypes[] = {
    {"uint8", "|u1", {CUBE_DL_UINT, 8, 1}, 1},
    {"int8", "|i1", {CUBE_DL_INT, 8, 1}, 1},
    {"bool", "|b1", {CUBE_DL_BOOL, 8, 1}, 1},
    {"int16", "<i2", {CUBE_DL_INT, 16, 1}, 2},
    {"uint16", "<u2", {CUBE_DL_UINT, 16, 1}, 2},
    {"float16", "<f2", {CUBE_DL_FLOAT, 16, 1}, 2},
    /* NumPy has no bfloat16: its arrays carry the raw 16-bit words. */
    {"bfloat16", "<u2", {CUBE_DL_BFLOAT, 16, 1}, 2},
    {"int32", "<i4", {CUBE_DL_INT, 32, 1}, 4},
    {"uint32", "<u4", {CUBE_DL_UINT, 32, 1}, 4},
    {"float32", "<f4", {CUBE_DL_FLOAT, 32, 1}, 4},
    {"int64", "<i8", {CUBE_DL_INT, 64, 1}, 8},
    {"uint64", "<u8", {CUBE_DL_UINT, 64, 1}, 8},
    {"float64", "<f8", {CUBE_DL_FLOAT, 64, 1}, 8},
};
enum { NDTYPES = sizeof dtypes / sizeof dtypes[0] };

const pyc_dtype *pyc_dtype_bytes(void)
{
    return &dtypes[0];
}

/* Short aliases NumPy and the array API use. */
static const struct {
    const char *alias, *name;
} aliases[] = {
    {"u1", "uint8"},       {"i1", "int8"},       {"b1", "bool"},
    {"?", "bool"},         {"i2", "int16"},      {"u2", "uint16"},
    {"f2", "float16"},     {"half", "float16"},  {"i4", "int32"},
    {"u4", "uint32"},      {"f4", "float32"},    {"float", "float32"},
    {"i8", "int64"},       {"u8", "uint64"},     {"f8", "float64"},
    {"double", "float64"}, {"bf16", "bfloat16"}, {"bool_", "bool"},
};

static const pyc_dtype *by_name(const char *s)
{
    /* NumPy codes carry a byte order: '<' and '|' are this machine's
     * (cubert runs on little-endian hosts), '=' is native. */
    if (s[0] == '<' || s[0] == '|' || s[0] == '=')
        s++;
    for (size_t i = 0; i < NDTYPES; i++)
        if (strcmp(s, dtypes[i].name) == 0)
            return &dtypes[i];
    for (size_t i = 0; i < sizeof aliases / sizeof aliases[0]; i++)
        if (strcmp(s, aliases[i].alias) == 0)
            return by_name(aliases[i].name);
    return NULL;
}

const pyc_dtype *pyc_dtype_from(PyObject *obj)
{
    if (PyUnicode_Check(obj)) {
        const char *s = PyUnicode_AsUTF8AndSize(obj, NULL);
        if (!s)
            return NULL;
        const pyc_dtype *d = by_name(s);
        if (!d)
            PyErr_Format(PyExc_TypeError, "cubert: unknown dtype '%s'", s);
        return d;
    }
    /* A NumPy scalar type (np.float32: its __name__), a NumPy dtype (its
     * `str`, "<f4") or an array (its `dtype`). */
    const char *attrs[] = {"str", "dtype"};
    size_t count = 2;
    if (PyType_Check(obj)) {
        attrs[0] = "__name__";
        count = 1;
    }
    for (size_t i = 0; i < count; i++) {
        if (!PyObject_HasAttrString(obj, attrs[i]))
            continue;
        PyObject *v = PyObject_GetAttrString(obj, attrs[i]);
        if (!v)
            return NULL;
        const pyc_dtype *d = NULL;
        if (v != obj && !PyType_Check(v))
            d = pyc_dtype_from(v);
        else
            PyErr_SetString(PyExc_TypeError, "cubert: unknown dtype");
        Py_DECREF(v);
        return d;
    }
    PyErr_SetString(PyExc_TypeError,
                    "cubert: a dtype is a name ('float32'), a NumPy dtype or "
                    "an object with a dtype");
    return NULL;
}

const pyc_dtype *pyc_dtype_from_dl(cube_dl_dtype dl)
{
    for (size_t i = 0; i < NDTYPES; i++)
        if (dtypes[i].dl.code == dl.code && dtypes[i].dl.bits == dl.bits &&
            dl.lanes == 1)
            return &dtypes[i];
    return NULL;
}

int pyc_shape_from(PyObject *obj, int64_t *shape, int *ndim)
{
    /* An int, or one by __index__ (np.int64): not a sequence, which a
     * NumPy array with __index__ is. */
    if (PyLong_Check(obj) || (PyIndex_Check(obj) && !PySequence_Check(obj))) {
        long long v = PyLong_AsLongLong(obj);
        if (v == -1 && PyErr_Occurred())
            return -1;
        if (v < 0) {
            pyc_raise_invalid("negative extent");
            return -1;
        }
        shape[0] = v;
        *ndim = 1;
        return 0;
    }
    Py_ssize_t n = PySequence_Check(obj) ? PySequence_Size(obj) : -1;
    if (n < 0) {
        PyErr_Clear();
        PyErr_SetString(PyExc_TypeError,
                        "cubert: a shape is an int or a sequence of ints");
        return -1;
    }
    if (n > CUBE_MAX_RANK) {
        pyc_raise_invalidf("at most %d dimensions", CUBE_MAX_RANK);
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PySequence_GetItem(obj, i);
        if (!item)
            return -1;
        long long v = PyLong_AsLongLong(item);
        Py_DECREF(item);
        if (v == -1 && PyErr_Occurred())
            return -1;
        if (v < 0) {
            pyc_raise_invalid("negative extent");
            return -1;
        }
        shape[i] = v;
    }
    *ndim = (int)n;
    return 0;
}

int64_t pyc_shape_bytes(const int64_t *shape, int ndim, uint32_t size)
{
    uint64_t total = size;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] != 0 && total > (uint64_t)INT64_MAX / (uint64_t)shape[i]) {
            PyErr_SetString(PyExc_OverflowError, "cubert: shape too large");
            return -1;
        }
        total *= (uint64_t)shape[i];
    }
    return (int64_t)total;
}

PyObject *pyc_shape_tuple(const int64_t *shape, int ndim)
{
    PyObject *t = PyTuple_New(ndim);
    if (!t)
        return NULL;
    for (int i = 0; i < ndim; i++) {
        PyObject *v = PyLong_FromLongLong(shape[i]);
        if (!v) {
            Py_DECREF(t);
            return NULL;
        }
        PyTuple_SetItem(t, i, v);
    }
    return t;
}
