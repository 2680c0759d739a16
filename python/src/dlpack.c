/* DLPack capsules both ways and wrapped foreign memory, following the
 * array API standard's __dlpack__ protocol: capsules named
 * "dltensor_versioned" (DLPack 1.x) or "dltensor" (legacy), renamed
 * "used_..." by the consumer that takes ownership. */
#include <stdlib.h>
#include <string.h>

#include "pycubert.h"

/* CUDA's predefined stream handles, numbered as the array API numbers
 * them. */
#define PYC_CU_STREAM_LEGACY CUBE_NATIVE_STREAM_LEGACY
#define PYC_CU_STREAM_PER_THREAD CUBE_NATIVE_STREAM_PER_THREAD

/* An exported tensor as the consumer sees it: cubert's tensor wrapped so
 * that its deletion also lets go of the Python client (kept alive and
 * pinned, so the C client cannot close under the consumer). */
typedef struct {
    cube_dl_managed_versioned versioned;
    cube_dl_managed legacy;
    cube_dl_managed_versioned *inner;
    pyc_client *client;
} pyc_export;

static void export_free(pyc_export *e)
{
    e->inner->deleter(e->inner);
    /* The consumer may delete from any thread, with or without the GIL. */
    PyGILState_STATE g = PyGILState_Ensure();
    pyc_client *client = e->client;
    free(e);
    pyc_client_unpin(client);
    Py_DECREF(client);
    PyGILState_Release(g);
}

static void export_delete_versioned(cube_dl_managed_versioned *t)
{
    export_free((pyc_export *)t->manager_ctx);
}

static void export_delete_legacy(cube_dl_managed *t)
{
    export_free((pyc_export *)t->manager_ctx);
}

/* A capsule nobody consumed deletes its tensor. */
static void capsule_destructor(PyObject *cap)
{
    if (PyCapsule_IsValid(cap, "dltensor_versioned")) {
        cube_dl_managed_versioned *t =
            PyCapsule_GetPointer(cap, "dltensor_versioned");
        if (t && t->deleter)
            t->deleter(t);
    } else if (PyCapsule_IsValid(cap, "dltensor")) {
        cube_dl_managed *t = PyCapsule_GetPointer(cap, "dltensor");
        if (t && t->deleter)
            t->deleter(t);
    }
}

static PyObject *buffer_error(const char *message)
{
    PyErr_Format(PyExc_BufferError, "cubert: %s", message);
    return NULL;
}

/* The consumer stream argument turned into cube_dlpack_export's. */
static int consumer_stream(pyc_client *client, PyObject *stream, void **out)
{
    if (client->dl_device_type != CUBE_DL_CUDA) {
        if (stream != Py_None) {
            buffer_error("a host buffer takes no stream (stream=None)");
            return -1;
        }
        *out = NULL;
        return 0;
    }
    if (stream == Py_None) {
        *out = PYC_CU_STREAM_LEGACY;
        return 0;
    }
    int64_t s;
    if (pyc_index_i64(stream, "stream", -1, INTPTR_MAX, &s) < 0)
        return -1;
    if (s == 0) {
        buffer_error("stream 0 is ambiguous: 1 is the legacy default "
                     "stream, 2 the per-thread default stream");
        return -1;
    }
    if (s == -1)
        *out = CUBE_DLPACK_NO_SYNC;
    else if (s == 1)
        *out = PYC_CU_STREAM_LEGACY;
    else if (s == 2)
        *out = PYC_CU_STREAM_PER_THREAD;
    else
        *out = (void *)(uintptr_t)s;
    return 0;
}

/* max_version: None (legacy capsule) or a (major, minor) tuple. */
static int wants_versioned(PyObject *max_version, int *out)
{
    *out = 0;
    if (max_version == Py_None)
        return 0;
    if (!PyTuple_Check(max_version) || PyTuple_Size(max_version) != 2) {
        PyErr_SetString(PyExc_TypeError,
                        "cubert: max_version is a (major, minor) tuple");
        return -1;
    }
    int64_t major, minor;
    if (pyc_index_i64(PyTuple_GetItem(max_version, 0), "max_version's major", 0,
                      INT32_MAX, &major) < 0 ||
        pyc_index_i64(PyTuple_GetItem(max_version, 1), "max_version's minor", 0,
                      INT32_MAX, &minor) < 0)
        return -1;
    *out = major >= 1;
    return 0;
}

static int check_device(pyc_buffer *self, PyObject *dl_device)
{
    if (dl_device == Py_None)
        return 0;
    /* A tuple checked here: PyArg_ParseTuple on anything else is a
     * SystemError, not the caller's TypeError. */
    if (!PyTuple_Check(dl_device) || PyTuple_Size(dl_device) != 2) {
        PyErr_SetString(PyExc_TypeError, "cubert: dl_device is a "
                                         "(device_type, device_id) tuple");
        return -1;
    }
    int64_t type, id;
    if (pyc_index_i64(PyTuple_GetItem(dl_device, 0), "dl_device's type", 0,
                      INT32_MAX, &type) < 0 ||
        pyc_index_i64(PyTuple_GetItem(dl_device, 1), "dl_device's id", 0,
                      INT32_MAX, &id) < 0)
        return -1;
    if (type != self->client->dl_device_type ||
        id != self->client->dl_device_id) {
        buffer_error("the buffer cannot be exported to another device "
                     "(cubert does not copy on export)");
        return -1;
    }
    return 0;
}

PyObject *pyc_buffer_dlpack(pyc_buffer *self, PyObject *args, PyObject *kw)
{
    static char *names[] = {"stream", "max_version", "dl_device", "copy", NULL};
    PyObject *stream = Py_None, *max_version = Py_None, *dl_device = Py_None,
             *copy = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|$OOOO", names, &stream,
                                     &max_version, &dl_device, &copy))
        return NULL;
    int versioned;
    if (wants_versioned(max_version, &versioned) < 0 ||
        check_device(self, dl_device) < 0)
        return NULL;
    if (copy != Py_None && PyObject_IsTrue(copy) == 1)
        return buffer_error("cubert exports without a copy (copy=True)");
    cube_handle h;
    cube_client *c = pyc_buffer_get((PyObject *)self, &h);
    if (!c)
        return NULL;
    void *cs;
    if (consumer_stream(self->client, stream, &cs) < 0)
        return NULL;
    pyc_export *e = calloc(1, sizeof *e);
    if (!e)
        return PyErr_NoMemory();
    cube_error *err;
    PYC_NOGIL(self->client,
              err = cube_dlpack_export(c, h, self->dtype->dl, self->ndim,
                                       self->shape, NULL, cs, &e->inner));
    if (err) {
        free(e);
        return pyc_raise(err);
    }
    e->versioned = *e->inner;
    e->versioned.manager_ctx = e;
    e->versioned.deleter = export_delete_versioned;
    e->legacy.dl_tensor = e->inner->dl_tensor;
    e->legacy.manager_ctx = e;
    e->legacy.deleter = export_delete_legacy;
    Py_INCREF(self->client);
    pyc_client_pin(self->client);
    e->client = self->client;
    PyObject *cap =
        versioned ? PyCapsule_New(&e->versioned, "dltensor_versioned",
                                  capsule_destructor)
                  : PyCapsule_New(&e->legacy, "dltensor", capsule_destructor);
    if (!cap)
        export_free(e);
    return cap;
}

PyObject *pyc_buffer_dlpack_device(pyc_buffer *self, PyObject *unused)
{
    (void)unused;
    return Py_BuildValue("(ii)", self->client->dl_device_type,
                         self->client->dl_device_id);
}

/* --- import --- */

/* The capsule of `obj`: obj itself, or obj.__dlpack__(...) asked for a
 * versioned one first, with `stream` on CUDA. */
static PyObject *capsule_of(pyc_client *self, PyObject *obj)
{
    if (PyCapsule_CheckExact(obj)) {
        Py_INCREF(obj);
        return obj;
    }
    PyObject *method = PyObject_GetAttrString(obj, "__dlpack__");
    if (!method) {
        PyErr_Clear();
        return PyErr_Format(PyExc_TypeError, "cubert: %R has no __dlpack__",
                            (PyObject *)Py_TYPE(obj));
    }
    PyObject *kw = PyDict_New();
    PyObject *ver = Py_BuildValue("(ii)", 1, 0);
    if (!kw || !ver || PyDict_SetItemString(kw, "max_version", ver) < 0) {
        Py_XDECREF(kw);
        Py_XDECREF(ver);
        Py_DECREF(method);
        return NULL;
    }
    Py_DECREF(ver);
    if (self->dl_device_type == CUBE_DL_CUDA) {
        /* The producer is told the legacy default stream: producers whose
         * work is there already (PyTorch's and CuPy's defaults) then skip
         * their own event handshake, which costs them microseconds of
         * Python; pyc_client_from_dlpack bridges from that stream to
         * cubert's with one event, nothing waiting on the host. */
        PyObject *sv = PyLong_FromLong(1);
        if (!sv || PyDict_SetItemString(kw, "stream", sv) < 0) {
            Py_XDECREF(sv);
            Py_DECREF(kw);
            Py_DECREF(method);
            return NULL;
        }
        Py_DECREF(sv);
    }
    PyObject *empty = PyTuple_New(0);
    PyObject *cap = empty ? PyObject_Call(method, empty, kw) : NULL;
    if (!cap && PyErr_ExceptionMatches(PyExc_TypeError)) {
        /* A producer from before DLPack 1.0 knows no max_version. */
        PyErr_Clear();
        PyDict_DelItemString(kw, "max_version");
        cap = PyObject_Call(method, empty, kw);
    }
    Py_XDECREF(empty);
    Py_DECREF(kw);
    Py_DECREF(method);
    return cap;
}

/* Why a tensor cannot be a Buffer, or NULL when it can: an element type
 * cubert has no name for, more dimensions than a buffer has, or strides
 * that are not the dense row-major ones. */
static const char *tensor_refusal(const cube_dl_tensor *t)
{
    if (!pyc_dtype_from_dl(t->dtype))
        return "the tensor's element type has no cubert dtype";
    if (t->ndim < 0 || t->ndim > CUBE_MAX_RANK)
        return "the tensor has more dimensions than a buffer";
    if (t->ndim > 0 && !t->shape)
        return "the tensor has no shape";
    if (!t->strides)
        return NULL;
    int64_t expect = 1;
    for (int i = t->ndim - 1; i >= 0; i--) {
        if (t->shape[i] > 1 && t->strides[i] != expect)
            return "the tensor is not dense and row-major (pass a contiguous "
                   "copy: .contiguous(), numpy.ascontiguousarray)";
        expect *= t->shape[i];
    }
    return NULL;
}

/* The C calls of an import, in one stretch without the GIL. *taken: the
 * tensor is cubert's now (even if a later call failed: the caller
 * releases *h then). On CUDA the producer's work is ordered before the
 * legacy default stream (capsule_of): cubert's stream waits for that
 * stream first, and the buffer counts as written on cubert's stream, so
 * work on other cubert streams waits too, as after any foreign write. */
static cube_error *import_calls(cube_client *c, int cuda,
                                cube_dl_managed_versioned *mv,
                                cube_dl_managed *ml, cube_handle *h, int *taken,
                                uint64_t *nbytes)
{
    *taken = 0;
    cube_error *err =
        cuda ? cube_native_wait(c, CUBE_NATIVE_STREAM_LEGACY) : NULL;
    if (!err)
        err = mv ? cube_dlpack_import(c, mv, h)
                 : cube_dlpack_import_legacy(c, ml, h);
    if (err)
        return err;
    *taken = 1;
    if (cuda)
        err = cube_native_written(c, *h);
    return err ? err : cube_handle_size(c, *h, nbytes);
}

PyObject *pyc_client_from_dlpack(pyc_client *self, PyObject *obj)
{
    cube_client *c = pyc_client_get(self);
    if (!c)
        return NULL;
    PyObject *cap = capsule_of(self, obj);
    if (!cap)
        return NULL;
    int versioned = PyCapsule_IsValid(cap, "dltensor_versioned");
    if (!versioned && !PyCapsule_IsValid(cap, "dltensor")) {
        Py_DECREF(cap);
        return buffer_error("not an unconsumed DLPack capsule");
    }
    cube_dl_managed_versioned *mv = NULL;
    cube_dl_managed *ml = NULL;
    if (versioned)
        mv = PyCapsule_GetPointer(cap, "dltensor_versioned");
    else
        ml = PyCapsule_GetPointer(cap, "dltensor");
    if (!mv && !ml) {
        Py_DECREF(cap);
        return NULL;
    }
    const cube_dl_tensor *t = mv ? &mv->dl_tensor : &ml->dl_tensor;
    /* A Buffer is dense, with one element type: a tensor that is not is
     * refused here rather than taken as the bytes it spans (the C API
     * takes those; from C, the caller knows the layout). */
    const char *why = tensor_refusal(t);
    if (why) {
        Py_DECREF(cap);
        return buffer_error(why);
    }
    cube_handle h = {0};
    uint64_t nbytes = 0;
    int taken = 0;
    cube_error *err;
    PYC_NOGIL(self, err = import_calls(c, self->dl_device_type == CUBE_DL_CUDA,
                                       mv, ml, &h, &taken, &nbytes));
    if (!taken) {
        /* Refused: the tensor is still the capsule's to delete. */
        Py_DECREF(cap);
        return pyc_raise(err);
    }
    /* cubert owns the tensor now and deletes it only when the handle's
     * last reference goes: its fields stay readable here. */
    const pyc_dtype *dt = pyc_dtype_from_dl(t->dtype);
    int64_t shape[CUBE_MAX_RANK];
    int ndim = t->ndim;
    for (int i = 0; i < ndim; i++)
        shape[i] = t->shape[i];
    PyCapsule_SetName(cap,
                      versioned ? "used_dltensor_versioned" : "used_dltensor");
    Py_DECREF(cap);
    if (err) {
        cube_error_free(cube_handle_release(c, h));
        return pyc_raise(err);
    }
    return pyc_buffer_new(self, h, nbytes, ndim, shape, dt);
}

/* --- wrapped memory --- */

static void wrap_release(void *user)
{
    PyGILState_STATE g = PyGILState_Ensure();
    Py_DECREF((PyObject *)user);
    PyGILState_Release(g);
}

PyObject *pyc_client_wrap(pyc_client *self, PyObject *obj)
{
    cube_client *c = pyc_client_get(self);
    if (!c)
        return NULL;
    pyc_host_view v;
    int rc = self->dl_device_type == CUBE_DL_CUDA
                 ? pyc_cuda_view_get(obj, &v)
                 : pyc_host_view_get(obj, 1, &v);
    if (rc < 0)
        return NULL;
    cube_handle h;
    cube_error *err;
    PYC_NOGIL(self,
              err = cube_wrap_memory(c, (uint64_t)(uintptr_t)v.data, v.nbytes,
                                     wrap_release, v.owner, &h));
    if (err) {
        Py_DECREF(v.owner);
        return pyc_raise(err);
    }
    const pyc_dtype *dt = v.dtype ? v.dtype : pyc_dtype_bytes();
    return pyc_buffer_new(self, h, v.nbytes, v.ndim, v.shape, dt);
}
