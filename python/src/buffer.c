/* cubert.Buffer: one handle reference with a shape and an element type,
 * and the copies between it and host objects. */
#include <string.h>

#include "pycubert.h"

int pyc_is_buffer(PyObject *obj)
{
    return PyObject_TypeCheck(obj, pyc_g.buffer_type);
}

PyObject *pyc_buffer_new(pyc_client *client, cube_handle handle,
                         uint64_t nbytes, int ndim, const int64_t *shape,
                         const pyc_dtype *dtype)
{
    pyc_buffer *b = PyObject_New(pyc_buffer, pyc_g.buffer_type);
    if (!b) {
        cube_error_free(cube_handle_release(client->c_open, handle));
        return NULL;
    }
    Py_INCREF(client);
    b->client = client;
    b->handle = handle;
    b->nbytes = nbytes;
    b->ndim = ndim;
    memset(b->shape, 0, sizeof b->shape);
    if (ndim > 0)
        memcpy(b->shape, shape, (size_t)ndim * sizeof *shape);
    b->dtype = dtype;
    b->weakrefs = NULL;
    return (PyObject *)b;
}

cube_client *pyc_buffer_get(PyObject *obj, cube_handle *out)
{
    if (!pyc_is_buffer(obj)) {
        PyErr_Format(PyExc_TypeError, "cubert: expected a Buffer, got %R",
                     (PyObject *)Py_TYPE(obj));
        return NULL;
    }
    pyc_buffer *b = (pyc_buffer *)obj;
    if (!b->handle.bits) {
        pyc_raise_invalid("the buffer was released");
        return NULL;
    }
    *out = b->handle;
    return pyc_client_get(b->client);
}

/* Drops the handle's reference while its C client is still open (a
 * client whose close was asked but is deferred still is). */
static void drop_handle(pyc_buffer *b)
{
    cube_handle h = b->handle;
    b->handle.bits = 0;
    if (!h.bits || !b->client->c_open)
        return;
    cube_error *err;
    /* A release may call a wrapped object's release callback, which
     * takes the GIL: hand it over. */
    PYC_NOGIL(b->client, err = cube_handle_release(b->client->c_open, h));
    cube_error_free(err);
}

static void buffer_dealloc(pyc_buffer *self)
{
    PyTypeObject *tp = Py_TYPE(self);
    if (self->weakrefs)
        PyObject_ClearWeakRefs((PyObject *)self);
    drop_handle(self);
    Py_CLEAR(self->client);
    freefunc f = (freefunc)PyType_GetSlot(tp, Py_tp_free);
    f(self);
    Py_DECREF(tp);
}

static PyObject *buffer_release(pyc_buffer *self, PyObject *unused)
{
    (void)unused;
    drop_handle(self);
    Py_RETURN_NONE;
}

/* The element size a copy descriptor of the whole buffer uses. */
static uint32_t copy_elem_size(const pyc_buffer *b)
{
    uint32_t s = b->dtype->size;
    return b->nbytes % s == 0 ? s : 1;
}

/* Copies the buffer into `dst` (`size` bytes) with the GIL released. */
static int read_into(pyc_buffer *self, void *dst, uint64_t size)
{
    cube_handle h;
    cube_client *c = pyc_buffer_get((PyObject *)self, &h);
    if (!c)
        return -1;
    uint32_t es = copy_elem_size(self);
    cube_copy_desc d = cube_copy_desc_contiguous(h, self->nbytes, es);
    void *dsts[1] = {dst};
    uint64_t sizes[1] = {size};
    cube_error *err;
    PYC_NOGIL(self->client, err = cube_read(c, &d, dsts, sizes, 1));
    if (err) {
        pyc_raise(err);
        return -1;
    }
    return 0;
}

static PyObject *buffer_numpy(pyc_buffer *self, PyObject *unused)
{
    (void)unused;
    cube_handle h;
    if (!pyc_buffer_get((PyObject *)self, &h))
        return NULL;
    PyObject *np = PyImport_ImportModule("numpy");
    if (!np)
        return NULL;
    PyObject *shape = pyc_shape_tuple(self->shape, self->ndim);
    PyObject *arr = shape ? PyObject_CallMethod(np, "empty", "Os", shape,
                                                self->dtype->typestr)
                          : NULL;
    Py_DECREF(np);
    Py_XDECREF(shape);
    if (!arr)
        return NULL;
    pyc_host_view v;
    if (pyc_host_view_get(arr, 1, &v) < 0) {
        Py_DECREF(arr);
        return NULL;
    }
    Py_DECREF(v.owner);
    if (read_into(self, v.data, v.nbytes) < 0) {
        Py_DECREF(arr);
        return NULL;
    }
    return arr;
}

static PyObject *buffer_read(pyc_buffer *self, PyObject *out)
{
    pyc_host_view v;
    if (pyc_host_view_get(out, 1, &v) < 0)
        return NULL;
    int rc = read_into(self, v.data, v.nbytes);
    Py_DECREF(v.owner);
    if (rc < 0)
        return NULL;
    Py_RETURN_NONE;
}

/* A host view of `obj`; objects that are not C-contiguous arrays (a
 * list, a strided NumPy view) go through numpy.ascontiguousarray. */
static int host_view_any(PyObject *obj, PyObject *dtype, pyc_host_view *v)
{
    if ((!dtype || dtype == Py_None) && pyc_host_view_get(obj, 0, v) == 0)
        return 0;
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyObject *np = PyImport_ImportModule("numpy");
    if (!np) {
        /* Without NumPy, the first error says what went wrong. */
        Py_XDECREF(np);
        PyErr_Clear();
        if (type) {
            PyErr_Restore(type, value, tb);
        } else {
            PyErr_SetString(PyExc_TypeError,
                            "cubert: a dtype conversion needs NumPy");
        }
        return -1;
    }
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(tb);
    PyObject *dt = Py_None;
    if (dtype && dtype != Py_None) {
        const pyc_dtype *d = pyc_dtype_from(dtype);
        if (!d) {
            Py_DECREF(np);
            return -1;
        }
        dt = PyUnicode_FromString(d->typestr);
    } else {
        Py_INCREF(dt);
    }
    PyObject *arr =
        dt ? PyObject_CallMethod(np, "ascontiguousarray", "OO", obj, dt) : NULL;
    Py_DECREF(np);
    Py_XDECREF(dt);
    if (!arr)
        return -1;
    int rc = pyc_host_view_get(arr, 0, v);
    Py_DECREF(arr);
    return rc;
}

/* Nonzero, with TypeError set, for what a copy does not take: text
 * (NumPy would parse it as numbers, or refuse it with a ValueError that
 * hides the mistake) and, with `numbers`, a bare number (a write of one
 * would fill one element at most). */
static int refuse_text(PyObject *obj, const char *call, int numbers)
{
    const char *what = NULL;
    if (numbers && (obj == Py_None || PyLong_Check(obj) || PyFloat_Check(obj) ||
                    PyComplex_Check(obj)))
        what = "a number";
    else if (PyUnicode_Check(obj))
        what = "a str (encode it to bytes)";
    if (what)
        PyErr_Format(PyExc_TypeError,
                     "cubert: %s takes an array, bytes or a sequence of "
                     "numbers, not %s",
                     call, what);
    return what != NULL;
}

static PyObject *buffer_write(pyc_buffer *self, PyObject *obj)
{
    cube_handle h;
    cube_client *c = pyc_buffer_get((PyObject *)self, &h);
    if (!c)
        return NULL;
    /* Arrays and bytes are copied as they are (their bytes must fill the
     * buffer); other sequences are converted to the buffer's dtype. A
     * bare number is refused: it would fill one element at most. */
    if (refuse_text(obj, "write", 1))
        return NULL;
    PyObject *convert = NULL;
    if (!PyBytes_Check(obj) && !PyByteArray_Check(obj) &&
        !PyObject_HasAttrString(obj, "__array_interface__") &&
        !(convert = PyUnicode_FromString(self->dtype->name)))
        return NULL;
    pyc_host_view v;
    int rc = host_view_any(obj, convert, &v);
    Py_XDECREF(convert);
    if (rc < 0)
        return NULL;
    uint32_t es = copy_elem_size(self);
    cube_copy_desc d = cube_copy_desc_contiguous(h, self->nbytes, es);
    const void *srcs[1] = {v.data};
    uint64_t sizes[1] = {v.nbytes};
    cube_error *err;
    PYC_NOGIL(self->client, err = cube_write(c, &d, srcs, sizes, 1));
    Py_DECREF(v.owner);
    if (err)
        return pyc_raise(err);
    Py_RETURN_NONE;
}

/* Parses (shape, dtype=None) into shape/ndim, the dtype (`fallback` when
 * None) and the byte count; -1 with an exception set. */
static int shape_and_dtype(PyObject *args, PyObject *kw,
                           const pyc_dtype *fallback, int64_t *shape, int *ndim,
                           const pyc_dtype **dt, int64_t *bytes)
{
    static char *names[] = {"shape", "dtype", NULL};
    PyObject *shape_obj, *dtype_obj = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|O", names, &shape_obj,
                                     &dtype_obj))
        return -1;
    *dt = dtype_obj && dtype_obj != Py_None ? pyc_dtype_from(dtype_obj)
                                            : fallback;
    if (!*dt || pyc_shape_from(shape_obj, shape, ndim) < 0)
        return -1;
    *bytes = pyc_shape_bytes(shape, *ndim, (*dt)->size);
    return *bytes < 0 ? -1 : 0;
}

PyObject *pyc_client_empty(pyc_client *self, PyObject *args, PyObject *kw)
{
    const pyc_dtype *dt;
    int64_t shape[CUBE_MAX_RANK], bytes;
    int ndim;
    if (shape_and_dtype(args, kw, pyc_dtype_bytes(), shape, &ndim, &dt,
                        &bytes) < 0)
        return NULL;
    cube_client *c = pyc_client_get(self);
    if (!c)
        return NULL;
    cube_handle h;
    cube_error *err;
    PYC_NOGIL(self, err = cube_empty(c, (uint64_t)bytes, &h));
    if (err)
        return pyc_raise(err);
    return pyc_buffer_new(self, h, (uint64_t)bytes, ndim, shape, dt);
}

PyObject *pyc_client_asarray(pyc_client *self, PyObject *args, PyObject *kw)
{
    static char *names[] = {"obj", "dtype", NULL};
    PyObject *obj, *dtype_obj = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|O", names, &obj,
                                     &dtype_obj) ||
        refuse_text(obj, "asarray", 0))
        return NULL;
    cube_client *c = pyc_client_get(self);
    if (!c)
        return NULL;
    const pyc_dtype *want = NULL;
    if (dtype_obj && dtype_obj != Py_None &&
        !(want = pyc_dtype_from(dtype_obj)))
        return NULL;
    /* bytes with a dtype are reinterpreted; other objects are converted
     * by NumPy to the dtype's element type, whose bytes the buffer then
     * carries (bfloat16: the 16-bit words). */
    int raw = (PyBytes_Check(obj) || PyByteArray_Check(obj));
    pyc_host_view v;
    if (host_view_any(obj, raw ? NULL : dtype_obj, &v) < 0)
        return NULL;
    const pyc_dtype *dt = v.dtype ? v.dtype : pyc_dtype_bytes();
    int64_t shape[CUBE_MAX_RANK];
    int ndim = v.ndim;
    memcpy(shape, v.shape, sizeof shape);
    if (want && raw) {
        if (v.nbytes % want->size != 0) {
            Py_DECREF(v.owner);
            pyc_raise_invalid("the bytes are not a whole number of "
                              "elements");
            return NULL;
        }
        shape[0] = (int64_t)(v.nbytes / want->size);
    }
    if (want)
        dt = want;
    cube_handle h;
    cube_error *err;
    PYC_NOGIL(self, err = cube_create(c, v.data, v.nbytes, &h));
    Py_DECREF(v.owner);
    if (err)
        return pyc_raise(err);
    return pyc_buffer_new(self, h, v.nbytes, ndim, shape, dt);
}

static PyObject *buffer_view(pyc_buffer *self, PyObject *args, PyObject *kw)
{
    const pyc_dtype *dt;
    int64_t shape[CUBE_MAX_RANK], bytes;
    int ndim;
    if (shape_and_dtype(args, kw, self->dtype, shape, &ndim, &dt, &bytes) < 0)
        return NULL;
    if ((uint64_t)bytes != self->nbytes)
        return pyc_raise_invalidf("a view of %lld bytes over a buffer of "
                                  "%llu",
                                  (long long)bytes,
                                  (unsigned long long)self->nbytes);
    cube_handle h;
    cube_client *c = pyc_buffer_get((PyObject *)self, &h);
    if (!c)
        return NULL;
    cube_error *err = cube_handle_retain(c, h);
    if (err)
        return pyc_raise(err);
    return pyc_buffer_new(self->client, h, self->nbytes, ndim, shape, dt);
}

static PyObject *buffer_slice(pyc_buffer *self, PyObject *args)
{
    PyObject *offset_obj, *size_obj;
    uint64_t offset, size;
    if (!PyArg_ParseTuple(args, "OO", &offset_obj, &size_obj) ||
        pyc_index_u64(offset_obj, "offset", UINT64_MAX, &offset) < 0 ||
        pyc_index_u64(size_obj, "nbytes", INT64_MAX, &size) < 0)
        return NULL;
    cube_handle h;
    cube_client *c = pyc_buffer_get((PyObject *)self, &h);
    if (!c)
        return NULL;
    cube_handle s;
    cube_error *err = cube_handle_slice(c, h, offset, size, &s);
    if (err)
        return pyc_raise(err);
    int64_t shape[1] = {(int64_t)size};
    return pyc_buffer_new(self->client, s, size, 1, shape, pyc_dtype_bytes());
}

static PyObject *buffer_native(pyc_buffer *self, void *closure)
{
    (void)closure;
    cube_handle h;
    cube_client *c = pyc_buffer_get((PyObject *)self, &h);
    if (!c)
        return NULL;
    cube_native_buffer nb;
    cube_error *err;
    PYC_NOGIL(self->client, err = cube_native_buffer_get(c, h, &nb));
    if (err)
        return pyc_raise(err);
    return Py_BuildValue("(KKO)", (unsigned long long)nb.address,
                         (unsigned long long)nb.size,
                         nb.host_accessible ? Py_True : Py_False);
}

static PyObject *buffer_mark_written(pyc_buffer *self, PyObject *unused)
{
    (void)unused;
    cube_handle h;
    cube_client *c = pyc_buffer_get((PyObject *)self, &h);
    if (!c)
        return NULL;
    cube_error *err;
    PYC_NOGIL(self->client, err = cube_native_written(c, h));
    if (err)
        return pyc_raise(err);
    Py_RETURN_NONE;
}

static PyObject *buffer_nbytes(pyc_buffer *self, void *closure)
{
    (void)closure;
    return PyLong_FromUnsignedLongLong(self->nbytes);
}

static PyObject *buffer_shape(pyc_buffer *self, void *closure)
{
    (void)closure;
    return pyc_shape_tuple(self->shape, self->ndim);
}

static PyObject *buffer_dtype(pyc_buffer *self, void *closure)
{
    (void)closure;
    return PyUnicode_FromString(self->dtype->name);
}

static PyObject *buffer_client(pyc_buffer *self, void *closure)
{
    (void)closure;
    Py_INCREF(self->client);
    return (PyObject *)self->client;
}

static PyObject *buffer_released(pyc_buffer *self, void *closure)
{
    (void)closure;
    return PyBool_FromLong(self->handle.bits == 0);
}

/* The buffer's label (cube_handle_label); "" when it has none. */
static PyObject *buffer_label(pyc_buffer *self, void *closure)
{
    (void)closure;
    cube_handle h;
    cube_client *c = pyc_buffer_get((PyObject *)self, &h);
    if (!c)
        return NULL;
    char label[CUBE_LABEL_MAX + 1];
    cube_error *err = cube_handle_label(c, h, label, sizeof label);
    if (err)
        return pyc_raise(err);
    return PyUnicode_FromString(label);
}

/* Sets it (cube_handle_set_label); None or "" clears it. */
static int buffer_set_label(pyc_buffer *self, PyObject *value, void *closure)
{
    (void)closure;
    const char *label = NULL;
    if (value && value != Py_None) {
        label = PyUnicode_AsUTF8AndSize(value, NULL);
        if (!label)
            return -1;
    }
    cube_handle h;
    cube_client *c = pyc_buffer_get((PyObject *)self, &h);
    if (!c)
        return -1;
    cube_error *err = cube_handle_set_label(c, h, label);
    if (err) {
        pyc_raise(err);
        return -1;
    }
    return 0;
}

static PyObject *buffer_repr(pyc_buffer *self)
{
    PyObject *shape = pyc_shape_tuple(self->shape, self->ndim);
    if (!shape)
        return NULL;
    PyObject *r = PyUnicode_FromFormat(
        "<cubert.Buffer %s %R on %s%s>", self->dtype->name, shape,
        self->client->device, self->handle.bits ? "" : " (released)");
    Py_DECREF(shape);
    return r;
}

static PyMethodDef buffer_methods[] = {
    {"numpy", (PyCFunction)buffer_numpy, METH_NOARGS,
     "numpy($self, /)\n--\n\n"
     "A new NumPy array holding a copy of the buffer."},
    {"read", (PyCFunction)buffer_read, METH_O,
     "read($self, out, /)\n--\n\n"
     "Copies the buffer into a writable C-contiguous array."},
    {"write", (PyCFunction)buffer_write, METH_O,
     "write($self, obj, /)\n--\n\n"
     "Copies obj (the buffer's size in bytes) in."},
    {"view", (PyCFunction)(void (*)(void))buffer_view,
     METH_VARARGS | METH_KEYWORDS,
     "view($self, /, shape, dtype=None)\n--\n\n"
     "A Buffer on the same memory with another shape or dtype."},
    {"slice", (PyCFunction)buffer_slice, METH_VARARGS,
     "slice($self, offset, nbytes, /)\n--\n\n"
     "A uint8 Buffer over a byte range."},
    {"mark_written", (PyCFunction)buffer_mark_written, METH_NOARGS,
     "mark_written($self, /)\n--\n\n"
     "Tells cubert foreign work wrote the buffer (cube_native_written)."},
    {"release", (PyCFunction)buffer_release, METH_NOARGS,
     "release($self, /)\n--\n\nDrops the handle now."},
    {"__dlpack__", (PyCFunction)(void (*)(void))pyc_buffer_dlpack,
     METH_VARARGS | METH_KEYWORDS,
     "__dlpack__($self, /, *, stream=None, max_version=None, dl_device=None, "
     "copy=None)\n--\n\n"
     "A DLPack capsule over the buffer (the array API's protocol)."},
    {"__dlpack_device__", (PyCFunction)pyc_buffer_dlpack_device, METH_NOARGS,
     "__dlpack_device__($self, /)\n--\n\n"
     "(device type, device id) as DLPack numbers them."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef buffer_getset[] = {
    {"nbytes", (getter)buffer_nbytes, NULL, NULL, NULL},
    {"shape", (getter)buffer_shape, NULL, NULL, NULL},
    {"dtype", (getter)buffer_dtype, NULL, NULL, NULL},
    {"client", (getter)buffer_client, NULL, NULL, NULL},
    {"native", (getter)buffer_native, NULL, NULL, NULL},
    {"released", (getter)buffer_released, NULL, NULL, NULL},
    {"label", (getter)buffer_label, (setter)buffer_set_label, NULL, NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMemberDef buffer_members[] = {
    {"__weaklistoffset__", T_PYSSIZET, offsetof(pyc_buffer, weakrefs), READONLY,
     NULL},
    {NULL, 0, 0, 0, NULL},
};

static PyObject *buffer_new_refused(PyTypeObject *t, PyObject *a, PyObject *k)
{
    (void)t;
    (void)a;
    (void)k;
    PyErr_SetString(PyExc_TypeError,
                    "cubert: buffers come from a Client (empty, asarray, "
                    "wrap, from_dlpack)");
    return NULL;
}

static PyType_Slot buffer_slots[] = {
    {Py_tp_doc, (void *)"A buffer of a client's device memory."},
    {Py_tp_new, (void *)buffer_new_refused},
    {Py_tp_dealloc, (void *)buffer_dealloc},
    {Py_tp_repr, (void *)buffer_repr},
    {Py_tp_methods, buffer_methods},
    {Py_tp_getset, buffer_getset},
    {Py_tp_members, buffer_members},
    {0, NULL},
};

PyType_Spec pyc_buffer_spec = {
    "cubert._cubert.Buffer", sizeof(pyc_buffer), 0,
    Py_TPFLAGS_DEFAULT,      buffer_slots,
};
