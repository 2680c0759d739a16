/* cubert's Python extension: what its files share.
 *
 * The extension is built on CPython's stable ABI (3.10): heap types made
 * with PyType_FromSpec, no struct of CPython's touched, no NumPy C API.
 *
 * Lifetimes: a Buffer holds a strong reference to its Client object, so a
 * client's C state outlives every buffer object. A Client's C client
 * (`c`) is closed once close() was asked for (or the object dies) and
 * `pins` is zero: pins count calls running with the GIL released and
 * DLPack tensors exported and not yet deleted by their consumer, both of
 * which use the C client without holding the GIL.
 *
 * Threads: every call that may block or call back drops the GIL (pin,
 * release the GIL, call, take the GIL, unpin); the GIL protects every
 * field below. */
#ifndef PYCUBERT_H
#define PYCUBERT_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

#include <cubert/cubert.h>
#include <cubert/dlpack.h>
#include <cubert/interop.h>

struct pyc_event;

typedef struct {
    PyObject_HEAD cube_client
        *c;              /* NULL once closed for Python (close asked) */
    cube_client *c_open; /* the C client until it is really closed */
    Py_ssize_t pins;
    char device[48];
    char backend[16];
    int dl_device_type; /* CUBE_DL_CPU or CUBE_DL_CUDA */
    int dl_device_id;
    PyObject *weakrefs;
    /* Live events holding a native event (CUDA), freed before the C
     * client closes: the driver's context may go with it. */
    struct pyc_event *events;
} pyc_client;

/* Element types a Buffer can carry. */
typedef struct {
    const char *name;    /* "float32" */
    const char *typestr; /* NumPy's array-interface code, "<f4" */
    cube_dl_dtype dl;
    uint32_t size;
} pyc_dtype;

typedef struct {
    PyObject_HEAD pyc_client *client; /* strong */
    cube_handle handle;               /* bits 0 once released */
    uint64_t nbytes;
    int ndim;
    int64_t shape[CUBE_MAX_RANK];
    const pyc_dtype *dtype;
    PyObject *weakrefs;
} pyc_buffer;

typedef struct {
    PyObject_HEAD cube_kernel *k;
} pyc_kernel;

/* A stream of a client (cube_stream_id), and the calling threads' earlier
 * choices while it is entered as a context manager. */
typedef struct {
    PyObject_HEAD pyc_client *client; /* strong */
    cube_stream_id id;
    PyObject *entered; /* list of (thread ident, choice to restore) */
} pyc_stream;

/* A point in a stream's work: a CUevent on CUDA; on host backends, whose
 * work is done when its call returns, the host clock's time. */
typedef struct pyc_event {
    PyObject_HEAD pyc_client *client; /* strong */
    int timing;
    int recorded;
    uint64_t host_ns;              /* host backends: when it was recorded */
    void *cu_event;                /* CUDA: CUevent, NULL once freed */
    void *cu_ctx;                  /* CUDA: its context */
    struct pyc_event *prev, *next; /* in client->events (CUDA) */
} pyc_event;

/* The extension's state: its heap types and the error maker. One
 * interpreter per process (single-phase module init). */
typedef struct {
    PyTypeObject *client_type;
    PyTypeObject *buffer_type;
    PyTypeObject *kernel_type;
    PyTypeObject *graph_type;
    PyTypeObject *profile_type;
    PyTypeObject *stream_type;
    PyTypeObject *event_type;
    PyObject *make_error; /* cubert.errors._from_c, loaded on first use */
} pyc_state;

extern pyc_state pyc_g;

/* --- errors (errors.c) --- */

/* Raises `err` as the cubert.Error subclass of its code, frees it and
 * returns NULL. */
PyObject *pyc_raise(cube_error *err);
/* Raises cubert.InvalidArgumentError (also a ValueError) with `message`;
 * returns NULL. Every wrong value given from Python raises it, as the C
 * API's CUBE_ERR_INVALID_ARGUMENT would; a wrong type is a TypeError. */
PyObject *pyc_raise_invalid(const char *message);
/* The same with a PyUnicode_FromFormat format. */
PyObject *pyc_raise_invalidf(const char *format, ...);
/* Raises the cubert.Error subclass of `code` with `message`; returns NULL
 * (errors the extension finds itself, such as a driver's refusal). */
PyObject *pyc_raise_code(cube_code code, const char *message);

/* --- integer arguments (ints.c) --- */

/* `obj` (an int, or anything with __index__) into *out when it lies in
 * [0, max]: else OverflowError naming `what` and the range (TypeError
 * when it is no int). 0, or -1 with the exception set. */
int pyc_index_u64(PyObject *obj, const char *what, uint64_t max, uint64_t *out);
/* The same for [min, max]. */
int pyc_index_i64(PyObject *obj, const char *what, int64_t min, int64_t max,
                  int64_t *out);

/* --- clients (client.c) --- */

extern PyType_Spec pyc_client_spec;
/* The C client of an open client, or NULL with InvalidArgumentError set. */
cube_client *pyc_client_get(pyc_client *self);
/* Keep the C client open across a call made without the GIL. */
void pyc_client_pin(pyc_client *self);
/* Drops a pin; the last one closes a client whose close was asked.
 * Needs the GIL. */
void pyc_client_unpin(pyc_client *self);

/* --- buffers (buffer.c) --- */

extern PyType_Spec pyc_buffer_spec;
/* A new Buffer object owning `handle`'s reference (released on failure). */
PyObject *pyc_buffer_new(pyc_client *client, cube_handle handle,
                         uint64_t nbytes, int ndim, const int64_t *shape,
                         const pyc_dtype *dtype);
/* The buffer's client and handle, or NULL with an exception set (released
 * buffer, closed client, not a Buffer). */
cube_client *pyc_buffer_get(PyObject *obj, cube_handle *out);
int pyc_is_buffer(PyObject *obj);
PyObject *pyc_client_empty(pyc_client *self, PyObject *args, PyObject *kw);
PyObject *pyc_client_asarray(pyc_client *self, PyObject *args, PyObject *kw);

/* --- element types (dtype.c) --- */

/* By name ("float32"), NumPy typestr ("<f4"), or an object with a `str`
 * attribute (a NumPy dtype) or a `dtype` attribute. NULL with TypeError
 * set when unknown. */
const pyc_dtype *pyc_dtype_from(PyObject *obj);
const pyc_dtype *pyc_dtype_from_dl(cube_dl_dtype dl);
const pyc_dtype *pyc_dtype_bytes(void); /* uint8 */
/* Shape from an int or a sequence of ints into shape[0..*ndim). */
int pyc_shape_from(PyObject *obj, int64_t *shape, int *ndim);
/* Product of the extents times the element size; -1 with OverflowError. */
int64_t pyc_shape_bytes(const int64_t *shape, int ndim, uint32_t size);
PyObject *pyc_shape_tuple(const int64_t *shape, int ndim);

/* --- host memory of Python objects (hostmem.c) --- */

/* A contiguous byte range of a Python object: bytes, bytearray, or an
 * object with __array_interface__ (C-contiguous, no offset data). `owner`
 * keeps it alive (a new reference the caller drops). */
typedef struct {
    void *data;
    uint64_t nbytes;
    int readonly;
    int ndim;
    int64_t shape[CUBE_MAX_RANK];
    const pyc_dtype *dtype; /* NULL when the object has none (bytes) */
    PyObject *owner;
} pyc_host_view;
int pyc_host_view_get(PyObject *obj, int want_writable, pyc_host_view *out);
/* A device range of an object with __cuda_array_interface__ (v2+,
 * C-contiguous). Same ownership as pyc_host_view_get. */
int pyc_cuda_view_get(PyObject *obj, pyc_host_view *out);

/* --- kernels and launches (kernel.c) --- */

extern PyType_Spec pyc_kernel_spec;
PyObject *pyc_client_launch(pyc_client *self, PyObject *const *args,
                            Py_ssize_t nargs, PyObject *kwnames);
/* cubert.RawKernel(code, name, params, *, format, cube_dim, options). */
PyObject *pyc_raw_kernel(PyObject *module, PyObject *args, PyObject *kw);

/* --- DLPack and foreign memory (dlpack.c) --- */

PyObject *pyc_buffer_dlpack(pyc_buffer *self, PyObject *args, PyObject *kw);
PyObject *pyc_buffer_dlpack_device(pyc_buffer *self, PyObject *unused);
PyObject *pyc_client_from_dlpack(pyc_client *self, PyObject *obj);
PyObject *pyc_client_wrap(pyc_client *self, PyObject *obj);

/* --- graphs, profiles (graph.c) --- */

extern PyType_Spec pyc_graph_spec;
extern PyType_Spec pyc_profile_spec;
PyObject *pyc_client_capture(pyc_client *self, PyObject *unused);
PyObject *pyc_client_profile(pyc_client *self, PyObject *unused);

/* --- streams and events (stream.c, event.c) --- */

extern PyType_Spec pyc_stream_spec;
extern PyType_Spec pyc_event_spec;
PyObject *pyc_client_stream(pyc_client *self, PyObject *args);
PyObject *pyc_client_use_stream(pyc_client *self, PyObject *arg);
PyObject *pyc_client_event(pyc_client *self, PyObject *args, PyObject *kw);
/* Makes the calling thread work on stream `id` of `c` for a while;
 * *saved is what pyc_stream_restore gives back (the thread's earlier
 * choice, 0 for its own stream). Needs the GIL; never blocks. */
cube_error *pyc_stream_switch(cube_client *c, cube_stream_id id,
                              cube_stream_id *saved);
void pyc_stream_restore(cube_client *c, cube_stream_id saved);
/* A native stream argument as cube_native_wait takes it: an int numbered
 * as the array API numbers CUDA streams (0 and 1: the legacy default
 * stream, 2: the per-thread one, else a CUstream), or an object holding
 * one (PyTorch's `cuda_stream`, CuPy's `ptr`). On host backends the int
 * is passed as it is (only 0, NULL, is valid there). `accepted` says
 * what the caller takes, for the TypeError of anything else. */
int pyc_native_stream_from(pyc_client *client, PyObject *obj,
                           const char *accepted, void **out);
/* The stream `obj` names for `client`: 1 with *id set for None (the
 * calling thread's current stream) or a Stream of that client; 0 for
 * anything else (a native stream); -1 with InvalidArgumentError for a
 * Stream of another client. */
int pyc_stream_arg(pyc_client *client, PyObject *obj, cube_stream_id *id);
/* Frees the native events of `client`'s live Event objects (before its C
 * client closes). */
void pyc_events_close(pyc_client *client);

/* Runs `stmt` (a cubert call) with the GIL released and the client
 * pinned, so a close() from another thread cannot free it meanwhile. */
#define PYC_NOGIL(client, stmt)                                                \
    do {                                                                       \
        pyc_client_pin(client);                                                \
        PyThreadState *pyc_ts_ = PyEval_SaveThread();                          \
        stmt;                                                                  \
        PyEval_RestoreThread(pyc_ts_);                                         \
        pyc_client_unpin(client);                                              \
    } while (0)

#endif /* PYCUBERT_H */
