/* Integer arguments taken from Python with their range checked, so that a
 * value the C type cannot hold is refused rather than cut to its low bits
 * (PyArg's "I" and "K" formats do not check). */
#include "pycubert.h"

/* obj as a Python int (its __index__): a new reference, or NULL with
 * TypeError naming `what`. */
static PyObject *as_index(PyObject *obj, const char *what)
{
    PyObject *n = PyNumber_Index(obj);
    if (!n && PyErr_ExceptionMatches(PyExc_TypeError)) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "cubert: %s is an int, not %R", what,
                     (PyObject *)Py_TYPE(obj));
    }
    return n;
}

int pyc_index_u64(PyObject *obj, const char *what, uint64_t max, uint64_t *out)
{
    PyObject *n = as_index(obj, what);
    if (!n)
        return -1;
    unsigned long long v = PyLong_AsUnsignedLongLong(n);
    int bad = v == (unsigned long long)-1 && PyErr_Occurred();
    if (bad && !PyErr_ExceptionMatches(PyExc_OverflowError)) {
        Py_DECREF(n);
        return -1;
    }
    if (bad || v > max) {
        PyErr_Clear();
        PyErr_Format(PyExc_OverflowError,
                     "cubert: %s is an int from 0 to %llu, not %R", what,
                     (unsigned long long)max, n);
        Py_DECREF(n);
        return -1;
    }
    Py_DECREF(n);
    *out = v;
    return 0;
}

int pyc_index_i64(PyObject *obj, const char *what, int64_t min, int64_t max,
                  int64_t *out)
{
    PyObject *n = as_index(obj, what);
    if (!n)
        return -1;
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(n, &overflow);
    if (v == -1 && !overflow && PyErr_Occurred()) {
        Py_DECREF(n);
        return -1;
    }
    if (overflow || v < min || v > max) {
        PyErr_Format(PyExc_OverflowError,
                     "cubert: %s is an int from %lld to %lld, not %R", what,
                     (long long)min, (long long)max, n);
        Py_DECREF(n);
        return -1;
    }
    Py_DECREF(n);
    *out = v;
    return 0;
}
