/* cube_error values raised as Python exceptions: one class per code
 * (cubert/errors.py), carrying the code, message, compiler log and causes. */
#include <stdarg.h>

#include "pycubert.h"

/* cubert.errors._from_c, imported on the first error: the package imports
 * this extension, so the errors module cannot be imported at init. */
static PyObject *error_maker(void)
{
    if (pyc_g.make_error)
        return pyc_g.make_error;
    PyObject *mod = PyImport_ImportModule("cubert.errors");
    if (!mod)
        return NULL;
    pyc_g.make_error = PyObject_GetAttrString(mod, "_from_c");
    Py_DECREF(mod);
    return pyc_g.make_error;
}

/* The exception object for `err` (not raised), causes included. */
static PyObject *error_object(const cube_error *err, int depth)
{
    PyObject *maker = error_maker();
    if (!maker)
        return NULL;
    size_t n = cube_error_cause_count(err);
    PyObject *causes = PyList_New(0);
    if (!causes)
        return NULL;
    /* Causes nest (a SEVERAL of SEVERALs); the depth bound only guards
     * the C stack against a hostile chain. */
    for (size_t i = 0; i < n && depth < 32; i++) {
        PyObject *c = error_object(cube_error_cause(err, i), depth + 1);
        if (!c || PyList_Append(causes, c) < 0) {
            Py_XDECREF(c);
            Py_DECREF(causes);
            return NULL;
        }
        Py_DECREF(c);
    }
    cube_code code = cube_error_code(err);
    const char *log = cube_error_log(err);
    PyObject *obj =
        PyObject_CallFunction(maker, "isszO", (int)code, cube_code_name(code),
                              cube_error_message(err), log, causes);
    Py_DECREF(causes);
    return obj;
}

PyObject *pyc_raise(cube_error *err)
{
    PyObject *obj = error_object(err, 0);
    cube_error_free(err);
    if (obj) {
        PyErr_SetObject((PyObject *)Py_TYPE(obj), obj);
        Py_DECREF(obj);
    }
    return NULL;
}

PyObject *pyc_raise_code(cube_code code, const char *message)
{
    PyObject *maker = error_maker();
    if (!maker)
        return NULL;
    PyObject *causes = PyList_New(0);
    if (!causes)
        return NULL;
    PyObject *obj = PyObject_CallFunction(
        maker, "isszO", (int)code, cube_code_name(code), message, NULL, causes);
    Py_DECREF(causes);
    if (obj) {
        PyErr_SetObject((PyObject *)Py_TYPE(obj), obj);
        Py_DECREF(obj);
    }
    return NULL;
}

PyObject *pyc_raise_invalid(const char *message)
{
    return pyc_raise_code(CUBE_ERR_INVALID_ARGUMENT, message);
}

PyObject *pyc_raise_invalidf(const char *format, ...)
{
    va_list ap;
    va_start(ap, format);
    PyObject *text = PyUnicode_FromFormatV(format, ap);
    va_end(ap);
    if (!text)
        return NULL;
    const char *s = PyUnicode_AsUTF8AndSize(text, NULL);
    if (s)
        pyc_raise_invalid(s);
    Py_DECREF(text);
    return NULL;
}
