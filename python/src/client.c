/* cubert.Client: one cube_client, its barriers, memory statistics and
 * streams. Buffers, launches, graphs and DLPack live in their own files. */
#include <stdlib.h>
#include <string.h>

#include "pycubert.h"

cube_client *pyc_client_get(pyc_client *self)
{
    if (!self->c) {
        pyc_raise_invalid("the client is closed");
        return NULL;
    }
    return self->c;
}

void pyc_client_pin(pyc_client *self)
{
    self->pins++;
}

/* Closes the C client for real: no pin is left. */
static void really_close(pyc_client *self)
{
    cube_client *c = self->c_open;
    self->c = NULL;
    if (!c)
        return;
    pyc_events_close(self);
    self->c_open = NULL;
    /* Close waits for the device and may call release callbacks, which
     * take the GIL: let them. */
    PyThreadState *ts = PyEval_SaveThread();
    cube_client_close(c);
    PyEval_RestoreThread(ts);
}

void pyc_client_unpin(pyc_client *self)
{
    if (--self->pins == 0 && !self->c && self->c_open)
        really_close(self);
}

static int client_init(pyc_client *self, PyObject *args, PyObject *kw)
{
    static char *names[] = {"device", "cpu_threads", "cache_dir", NULL};
    const char *device = NULL, *cache_dir = NULL;
    PyObject *threads_obj = NULL;
    uint64_t cpu_threads = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|z$Oz", names, &device,
                                     &threads_obj, &cache_dir))
        return -1;
    if (threads_obj &&
        pyc_index_u64(threads_obj, "cpu_threads", UINT32_MAX, &cpu_threads) < 0)
        return -1;
    if (self->c_open) {
        pyc_raise_invalid("the client is open already");
        return -1;
    }
    cube_client_options o = cube_client_options_default();
    o.cpu_threads = (uint32_t)cpu_threads;
    o.cache_dir = cache_dir;
    cube_client *c = NULL;
    cube_error *err;
    PyThreadState *ts = PyEval_SaveThread();
    err = cube_client_open(device, &o, &c);
    PyEval_RestoreThread(ts);
    if (err) {
        pyc_raise(err);
        return -1;
    }
    cube_device_info info;
    if ((err = cube_client_device(c, &info))) {
        cube_client_close(c);
        pyc_raise(err);
        return -1;
    }
    self->c = self->c_open = c;
    memcpy(self->device, info.device, sizeof self->device);
    memcpy(self->backend, info.properties.backend, sizeof self->backend);
    self->device[sizeof self->device - 1] = 0;
    self->backend[sizeof self->backend - 1] = 0;
    self->dl_device_type =
        strcmp(self->backend, "cuda") == 0 ? CUBE_DL_CUDA : CUBE_DL_CPU;
    self->dl_device_id = (int)info.index;
    return 0;
}

static void client_dealloc(pyc_client *self)
{
    PyTypeObject *tp = Py_TYPE(self);
    if (self->weakrefs)
        PyObject_ClearWeakRefs((PyObject *)self);
    /* No pin can be left: pins hold references. */
    self->c = NULL;
    really_close(self);
    freefunc f = (freefunc)PyType_GetSlot(tp, Py_tp_free);
    f(self);
    Py_DECREF(tp);
}

static PyObject *client_close(pyc_client *self, PyObject *unused)
{
    (void)unused;
    self->c = NULL;
    if (self->pins == 0)
        really_close(self);
    Py_RETURN_NONE;
}

static PyObject *client_enter(pyc_client *self, PyObject *unused)
{
    (void)unused;
    if (!pyc_client_get(self))
        return NULL;
    Py_INCREF(self);
    return (PyObject *)self;
}

static PyObject *client_exit(pyc_client *self, PyObject *args)
{
    (void)args;
    return client_close(self, NULL);
}

/* Handles of the Buffer objects in `args` (a tuple), into a new array. */
static cube_handle *handles_of(PyObject *args, Py_ssize_t *n)
{
    *n = PyTuple_Size(args);
    cube_handle *h = PyMem_Calloc((size_t)(*n ? *n : 1), sizeof *h);
    if (!h) {
        PyErr_NoMemory();
        return NULL;
    }
    for (Py_ssize_t i = 0; i < *n; i++)
        if (!pyc_buffer_get(PyTuple_GetItem(args, i), &h[i])) {
            PyMem_Free(h);
            return NULL;
        }
    return h;
}

typedef cube_error *(*barrier_fn)(cube_client *, const cube_handle *, size_t);

static PyObject *barrier(pyc_client *self, PyObject *args, barrier_fn fn)
{
    cube_client *c = pyc_client_get(self);
    if (!c)
        return NULL;
    Py_ssize_t n;
    cube_handle *h = handles_of(args, &n);
    if (!h)
        return NULL;
    cube_error *err;
    PYC_NOGIL(self, err = fn(c, n ? h : NULL, (size_t)n));
    PyMem_Free(h);
    if (err)
        return pyc_raise(err);
    Py_RETURN_NONE;
}

static PyObject *client_sync(pyc_client *self, PyObject *args)
{
    return barrier(self, args, cube_sync);
}

static PyObject *client_check(pyc_client *self, PyObject *args)
{
    return barrier(self, args, cube_check);
}

static PyObject *client_flush(pyc_client *self, PyObject *unused)
{
    (void)unused;
    cube_client *c = pyc_client_get(self);
    if (!c)
        return NULL;
    cube_error *err;
    PYC_NOGIL(self, err = cube_flush(c));
    if (err)
        return pyc_raise(err);
    Py_RETURN_NONE;
}

/* Sets d[key] = value (stolen); -1 on failure. */
static int put(PyObject *d, const char *key, PyObject *value)
{
    if (!value)
        return -1;
    int rc = PyDict_SetItemString(d, key, value);
    Py_DECREF(value);
    return rc;
}

static PyObject *triple(const uint32_t v[3])
{
    return Py_BuildValue("(III)", v[0], v[1], v[2]);
}

static PyObject *feature_set(uint32_t features)
{
    PyObject *s = PySet_New(NULL);
    for (uint32_t bit = 1; s && bit; bit <<= 1) {
        const char *name = (features & bit) ? cube_feature_name(bit) : NULL;
        if (!name)
            continue;
        PyObject *v = PyUnicode_FromString(name);
        if (!v || PySet_Add(s, v) < 0) {
            Py_XDECREF(v);
            Py_CLEAR(s);
            break;
        }
        Py_DECREF(v);
    }
    return s;
}

static PyObject *client_properties(pyc_client *self, void *closure)
{
    (void)closure;
    cube_client *c = pyc_client_get(self);
    if (!c)
        return NULL;
    cube_utilities u;
    cube_error *err = cube_client_utilities(c, &u);
    if (err)
        return pyc_raise(err);
    const cube_properties *p = &u.properties;
    PyObject *d = PyDict_New();
    if (!d)
        return NULL;
    if (put(d, "backend", PyUnicode_FromString(p->backend)) < 0 ||
        put(d, "name", PyUnicode_FromString(p->name)) < 0 ||
        put(d, "architecture", PyUnicode_FromString(p->architecture)) < 0 ||
        put(d, "max_cube_dim", triple(p->max_cube_dim)) < 0 ||
        put(d, "max_units_per_cube",
            PyLong_FromUnsignedLong(p->max_units_per_cube)) < 0 ||
        put(d, "max_cube_count", triple(p->max_cube_count)) < 0 ||
        put(d, "max_shared_memory",
            PyLong_FromUnsignedLongLong(p->max_shared_memory)) < 0 ||
        put(d, "memory_total", PyLong_FromUnsignedLongLong(p->memory_total)) <
            0 ||
        put(d, "memory_alignment",
            PyLong_FromUnsignedLongLong(p->memory_alignment)) < 0 ||
        put(d, "max_buffer_size",
            PyLong_FromUnsignedLongLong(p->max_buffer_size)) < 0 ||
        put(d, "compute_units", PyLong_FromUnsignedLong(p->compute_units)) <
            0 ||
        put(d, "features", feature_set(p->features)) < 0 ||
        put(d, "timing",
            PyUnicode_FromString(
                p->timing == CUBE_TIMING_DEVICE ? "device" : "host_clock")) <
            0 ||
        put(d, "software_graphs", PyBool_FromLong(u.software_graphs)) < 0) {
        Py_DECREF(d);
        return NULL;
    }
    return d;
}

static PyObject *client_device(pyc_client *self, void *closure)
{
    (void)closure;
    return PyUnicode_FromString(self->device);
}

static PyObject *client_backend(pyc_client *self, void *closure)
{
    (void)closure;
    return PyUnicode_FromString(self->backend);
}

static PyObject *client_closed(pyc_client *self, void *closure)
{
    (void)closure;
    return PyBool_FromLong(self->c == NULL);
}

static PyObject *client_memory_usage(pyc_client *self, PyObject *args,
                                     PyObject *kw)
{
    static char *names[] = {"device", NULL};
    int device = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|$p", names, &device))
        return NULL;
    cube_client *c = pyc_client_get(self);
    if (!c)
        return NULL;
    cube_memory_usage u;
    cube_error *err =
        device ? cube_memory_usage_device(c, &u) : cube_memory_usage_get(c, &u);
    if (err)
        return pyc_raise(err);
    return Py_BuildValue(
        "{sKsKsKsKsKsK}", "buffers", (unsigned long long)u.buffers,
        "bytes_in_use", (unsigned long long)u.bytes_in_use, "bytes_padding",
        (unsigned long long)u.bytes_padding, "bytes_reserved",
        (unsigned long long)u.bytes_reserved, "foreign_buffers",
        (unsigned long long)u.foreign_buffers, "foreign_bytes",
        (unsigned long long)u.foreign_bytes);
}

static PyObject *client_memory_stats(pyc_client *self, PyObject *args,
                                     PyObject *kw)
{
    static char *names[] = {"device", NULL};
    int device = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|$p", names, &device))
        return NULL;
    cube_client *c = pyc_client_get(self);
    if (!c)
        return NULL;
    cube_memory_stats st;
    memset(&st, 0, sizeof st);
    st.struct_size = sizeof st;
    cube_error *err = cube_memory_stats_get(
        c, device ? CUBE_MEMORY_DEVICE : CUBE_MEMORY_STREAM, &st);
    if (err)
        return pyc_raise(err);
    PyObject *d = PyDict_New();
    if (!d)
        return NULL;
    /* One entry per field of cube_memory_stats, under the field's name. */
    struct {
        const char *name;
        unsigned long long value;
    } f[] = {{"streams", st.streams},
             {"allocations", st.allocations},
             {"releases", st.releases},
             {"pool_hits", st.pool_hits},
             {"pool_misses", st.pool_misses},
             {"device_allocations", st.device_allocations},
             {"device_frees", st.device_frees},
             {"oom_events", st.oom_events},
             {"oom_retries", st.oom_retries},
             {"buffers", st.buffers},
             {"buffers_peak", st.buffers_peak},
             {"allocated_bytes", st.allocated_bytes},
             {"allocated_bytes_peak", st.allocated_bytes_peak},
             {"reserved_bytes", st.reserved_bytes},
             {"reserved_bytes_peak", st.reserved_bytes_peak},
             {"free_bytes", st.free_bytes},
             {"free_bytes_peak", st.free_bytes_peak}};
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) {
        PyObject *v = PyLong_FromUnsignedLongLong(f[i].value);
        if (!v || PyDict_SetItemString(d, f[i].name, v) < 0) {
            Py_XDECREF(v);
            Py_DECREF(d);
            return NULL;
        }
        Py_DECREF(v);
    }
    return d;
}

static const char *const pool_kinds[] = {"sliced", "exclusive", "persistent",
                                         "expandable"};

/* One cube_buffer_info as a dict; pool and kind None outside the pools. */
static PyObject *buffer_info_dict(const cube_buffer_info *b)
{
    int pooled = b->pool != CUBE_BUFFER_NO_POOL;
    const char *kind =
        pooled && (unsigned)b->pool_kind < 4 ? pool_kinds[b->pool_kind] : NULL;
    return Py_BuildValue(
        "{s:K,s:K,s:K,s:N,s:N,s:O,s:O,s:s}", "handle",
        (unsigned long long)b->handle.bits, "size", (unsigned long long)b->size,
        "stream", (unsigned long long)b->stream, "pool",
        pooled ? PyLong_FromUnsignedLong(b->pool) : Py_NewRef(Py_None), "kind",
        kind ? PyUnicode_FromString(kind) : Py_NewRef(Py_None), "foreign",
        (b->flags & CUBE_BUFFER_FOREIGN) ? Py_True : Py_False, "deferred",
        (b->flags & CUBE_BUFFER_DEFERRED) ? Py_True : Py_False, "label",
        b->label);
}

static PyObject *client_memory_snapshot(pyc_client *self, PyObject *args,
                                        PyObject *kw)
{
    static char *names[] = {"device", NULL};
    int device = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|$p", names, &device))
        return NULL;
    cube_client *c = pyc_client_get(self);
    if (!c)
        return NULL;
    cube_memory_scope scope = device ? CUBE_MEMORY_DEVICE : CUBE_MEMORY_STREAM;
    cube_buffer_info *list = NULL;
    size_t count = 0, cap = 0;
    /* Other threads may allocate meanwhile: ask until the list fits. */
    for (;;) {
        if (count > 0) {
            cap = count + 16;
            PyMem_Free(list);
            list = PyMem_Malloc(cap * sizeof *list);
            if (!list)
                return PyErr_NoMemory();
            list[0].struct_size = sizeof *list;
        }
        cube_error *err = cube_memory_snapshot(c, scope, list, cap, &count);
        if (err) {
            PyMem_Free(list);
            return pyc_raise(err);
        }
        if (count <= cap)
            break;
    }
    PyObject *out = PyList_New((Py_ssize_t)count);
    for (size_t i = 0; out && i < count; i++) {
        PyObject *d = buffer_info_dict(&list[i]);
        if (!d)
            Py_CLEAR(out);
        else
            PyList_SetItem(out, (Py_ssize_t)i, d);
    }
    PyMem_Free(list);
    return out;
}

static PyObject *client_memory_report(pyc_client *self, PyObject *args,
                                      PyObject *kw)
{
    static char *names[] = {"format", NULL};
    const char *format = "table";
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|s", names, &format))
        return NULL;
    cube_report_format f;
    if (strcmp(format, "table") == 0)
        f = CUBE_REPORT_TABLE;
    else if (strcmp(format, "json") == 0)
        f = CUBE_REPORT_JSON;
    else
        return pyc_raise_invalidf("report format is 'table' or 'json', "
                                  "not '%s'",
                                  format);
    cube_client *c = pyc_client_get(self);
    if (!c)
        return NULL;
    cube_memory_report *r = PyMem_Malloc(sizeof *r);
    if (!r)
        return PyErr_NoMemory();
    cube_error *err = cube_memory_report_get(c, r);
    if (err) {
        PyMem_Free(r);
        return pyc_raise(err);
    }
    char *text = cube_memory_report_format(r, f);
    PyMem_Free(r);
    if (!text)
        return PyErr_NoMemory();
    PyObject *s = PyUnicode_FromString(text);
    free(text);
    return s;
}

typedef cube_error *(*client_fn)(cube_client *);

static PyObject *call_client(pyc_client *self, client_fn fn)
{
    cube_client *c = pyc_client_get(self);
    if (!c)
        return NULL;
    cube_error *err;
    PYC_NOGIL(self, err = fn(c));
    if (err)
        return pyc_raise(err);
    Py_RETURN_NONE;
}

static PyObject *client_memory_cleanup(pyc_client *self, PyObject *unused)
{
    (void)unused;
    return call_client(self, cube_memory_cleanup);
}

static PyObject *client_reset_peaks(pyc_client *self, PyObject *unused)
{
    (void)unused;
    return call_client(self, cube_memory_reset_peaks);
}

static PyObject *client_graph_prepare(pyc_client *self, PyObject *unused)
{
    (void)unused;
    return call_client(self, cube_graph_prepare);
}

static PyObject *client_dry_run_begin(pyc_client *self, PyObject *unused)
{
    (void)unused;
    return call_client(self, cube_dry_run_begin);
}

static PyObject *client_dry_run_end(pyc_client *self, PyObject *unused)
{
    (void)unused;
    return call_client(self, cube_dry_run_end);
}

static PyObject *client_range_push(pyc_client *self, PyObject *args)
{
    const char *name;
    if (!PyArg_ParseTuple(args, "s", &name))
        return NULL;
    cube_client *c = pyc_client_get(self);
    if (!c)
        return NULL;
    cube_error *err;
    PYC_NOGIL(self, err = cube_range_push(c, name));
    if (err)
        return pyc_raise(err);
    Py_RETURN_NONE;
}

static PyObject *client_range_pop(pyc_client *self, PyObject *unused)
{
    (void)unused;
    return call_client(self, cube_range_pop);
}

static PyObject *client_stream_ids(pyc_client *self, PyObject *unused)
{
    (void)unused;
    cube_client *c = pyc_client_get(self);
    if (!c)
        return NULL;
    size_t count = 0;
    cube_error *err = cube_stream_ids(c, NULL, 0, &count);
    if (err)
        return pyc_raise(err);
    /* Streams may appear between the two calls: ask for room to spare. */
    size_t cap = count + 16;
    cube_stream_id *ids = PyMem_Calloc(cap, sizeof *ids);
    if (!ids)
        return PyErr_NoMemory();
    if ((err = cube_stream_ids(c, ids, cap, &count))) {
        PyMem_Free(ids);
        return pyc_raise(err);
    }
    if (count > cap)
        count = cap;
    PyObject *list = PyList_New((Py_ssize_t)count);
    for (size_t i = 0; list && i < count; i++) {
        PyObject *v = PyLong_FromUnsignedLongLong(ids[i]);
        if (!v) {
            Py_CLEAR(list);
            break;
        }
        PyList_SetItem(list, (Py_ssize_t)i, v);
    }
    PyMem_Free(ids);
    return list;
}

static PyObject *client_native_stream(pyc_client *self, PyObject *unused)
{
    (void)unused;
    cube_client *c = pyc_client_get(self);
    if (!c)
        return NULL;
    void *s = NULL;
    cube_error *err;
    PYC_NOGIL(self, err = cube_native_stream(c, &s));
    if (err)
        return pyc_raise(err);
    return PyLong_FromUnsignedLongLong((unsigned long long)(uintptr_t)s);
}

/* stream: a native stream (pyc_native_stream_from). */
static PyObject *client_native_wait(pyc_client *self, PyObject *stream)
{
    cube_client *c = pyc_client_get(self);
    if (!c)
        return NULL;
    void *foreign;
    if (pyc_native_stream_from(self, stream,
                               "an int (a native stream) or a PyTorch or "
                               "CuPy stream",
                               &foreign) < 0)
        return NULL;
    cube_error *err;
    PYC_NOGIL(self, err = cube_native_wait(c, foreign));
    if (err)
        return pyc_raise(err);
    Py_RETURN_NONE;
}

static PyObject *client_repr(pyc_client *self)
{
    return PyUnicode_FromFormat("<cubert.Client %s%s>", self->device,
                                self->c ? "" : " (closed)");
}

/* Docstrings open with a text signature ("name($self, ...)\n--\n\n"),
 * which inspect.signature reads. */
static PyMethodDef client_methods[] = {
    {"close", (PyCFunction)client_close, METH_NOARGS,
     "close($self, /)\n--\n\n"
     "Closes the client (a second close does nothing)."},
    {"__enter__", (PyCFunction)client_enter, METH_NOARGS,
     "__enter__($self, /)\n--\n\n"},
    {"__exit__", (PyCFunction)client_exit, METH_VARARGS,
     "__exit__($self, exc_type, exc, tb, /)\n--\n\nCloses the client."},
    {"empty", (PyCFunction)(void (*)(void))pyc_client_empty,
     METH_VARARGS | METH_KEYWORDS,
     "empty($self, /, shape, dtype='uint8')\n--\n\n"
     "A new Buffer, contents undefined."},
    {"asarray", (PyCFunction)(void (*)(void))pyc_client_asarray,
     METH_VARARGS | METH_KEYWORDS,
     "asarray($self, /, obj, dtype=None)\n--\n\n"
     "A new Buffer holding a copy of obj."},
    {"wrap", (PyCFunction)pyc_client_wrap, METH_O,
     "wrap($self, obj, /)\n--\n\n"
     "A Buffer over obj's memory, nothing copied."},
    {"from_dlpack", (PyCFunction)pyc_client_from_dlpack, METH_O,
     "from_dlpack($self, obj, /)\n--\n\n"
     "A Buffer over a DLPack producer's tensor."},
    {"launch", (PyCFunction)(void (*)(void))pyc_client_launch,
     METH_FASTCALL | METH_KEYWORDS,
     "launch($self, kernel, count, /, *args, checked=False, skip=False, "
     "validate=False)\n--\n\n"
     "Launches kernel over count cubes (cube_launch)."},
    {"sync", (PyCFunction)client_sync, METH_VARARGS,
     "sync($self, /, *buffers)\n--\n\n"
     "Waits for their work (all of the stream's: none)."},
    {"check", (PyCFunction)client_check, METH_VARARGS,
     "check($self, /, *buffers)\n--\n\n"
     "Raises what their work failed with."},
    {"flush", (PyCFunction)client_flush, METH_NOARGS,
     "flush($self, /)\n--\n\nSubmits queued work without waiting."},
    {"capture", (PyCFunction)pyc_client_capture, METH_NOARGS,
     "capture($self, /)\n--\n\n"
     "A Graph, a context manager recording launches."},
    {"graph_prepare", (PyCFunction)client_graph_prepare, METH_NOARGS,
     "graph_prepare($self, /)\n--\n\ncube_graph_prepare."},
    {"profile", (PyCFunction)pyc_client_profile, METH_NOARGS,
     "profile($self, /)\n--\n\n"
     "A Profile, a context manager timing its block's work."},
    {"_dry_run_begin", (PyCFunction)client_dry_run_begin, METH_NOARGS,
     "_dry_run_begin($self, /)\n--\n\n"},
    {"_dry_run_end", (PyCFunction)client_dry_run_end, METH_NOARGS,
     "_dry_run_end($self, /)\n--\n\n"},
    {"_range_push", (PyCFunction)client_range_push, METH_VARARGS,
     "_range_push($self, name, /)\n--\n\n"},
    {"_range_pop", (PyCFunction)client_range_pop, METH_NOARGS,
     "_range_pop($self, /)\n--\n\n"},
    {"memory_usage", (PyCFunction)(void (*)(void))client_memory_usage,
     METH_VARARGS | METH_KEYWORDS,
     "memory_usage($self, /, *, device=False)\n--\n\n"
     "A dict: the calling thread's stream, or with device=True every "
     "stream of the device."},
    {"memory_stats", (PyCFunction)(void (*)(void))client_memory_stats,
     METH_VARARGS | METH_KEYWORDS,
     "memory_stats($self, /, *, device=False)\n--\n\n"
     "A dict of the allocation counters of cube_memory_stats_get "
     "(allocations, releases, pool hits and misses, device allocations and "
     "frees, out-of-memory events and retries, bytes allocated, reserved "
     "and free with their peaks) for the calling thread's stream, or with "
     "device=True summed over every stream."},
    {"memory_snapshot", (PyCFunction)(void (*)(void))client_memory_snapshot,
     METH_VARARGS | METH_KEYWORDS,
     "memory_snapshot($self, /, *, device=False)\n--\n\n"
     "A list of dicts: the live buffers (cube_memory_snapshot) whose memory "
     "the calling thread's stream holds, or with device=True every buffer "
     "of this client; each a dict of handle, size, stream, pool, kind, "
     "foreign, deferred, label."},
    {"memory_report", (PyCFunction)(void (*)(void))client_memory_report,
     METH_VARARGS | METH_KEYWORDS,
     "memory_report($self, /, format='table')\n--\n\n"
     "The calling stream's memory report as text ('table' or 'json')."},
    {"memory_cleanup", (PyCFunction)client_memory_cleanup, METH_NOARGS,
     "memory_cleanup($self, /)\n--\n\ncube_memory_cleanup."},
    {"reset_peaks", (PyCFunction)client_reset_peaks, METH_NOARGS,
     "reset_peaks($self, /)\n--\n\ncube_memory_reset_peaks."},
    {"stream_ids", (PyCFunction)client_stream_ids, METH_NOARGS,
     "stream_ids($self, /)\n--\n\n"
     "The ids of the client's initialized streams (cube_stream_ids)."},
    {"stream", (PyCFunction)pyc_client_stream, METH_VARARGS,
     "stream($self, stream=None, /)\n--\n\n"
     "A Stream: the calling thread's current one (None), or the stream of "
     "that id (an int from 1; an id no stream has yet names a new stream, "
     "made at its first use). `with client.stream(s):` works on it within "
     "the block."},
    {"use_stream", (PyCFunction)pyc_client_use_stream, METH_O,
     "use_stream($self, stream, /)\n--\n\n"
     "Makes the calling thread work on `stream` (a Stream or an id) from "
     "now on (cube_stream_use); 0 goes back to the thread's own stream. An "
     "id no stream has yet makes a new stream at its first use."},
    {"event", (PyCFunction)(void (*)(void))pyc_client_event,
     METH_VARARGS | METH_KEYWORDS,
     "event($self, /, *, timing=True)\n--\n\n"
     "A new Event of this client (timing=False: one that cannot time, "
     "lighter on CUDA)."},
    {"native_stream", (PyCFunction)client_native_stream, METH_NOARGS,
     "native_stream($self, /)\n--\n\n"
     "The calling thread's native stream (a CUstream on CUDA, else 0)."},
    {"native_wait", (PyCFunction)client_native_wait, METH_O,
     "native_wait($self, stream, /)\n--\n\n"
     "The calling thread's cubert stream waits on the device for the work "
     "issued so far on a foreign stream (an int: 0 or 1 the legacy default "
     "stream, 2 the per-thread one, else a CUstream; a PyTorch or CuPy "
     "stream; 0 on host backends)."},
    {NULL, NULL, 0, NULL},
};

/* Client.stream is a method; an assignment to it, which once switched to
 * (and quietly made) a stream, is refused with what to write instead. */
static int client_setattro(PyObject *self, PyObject *name, PyObject *value)
{
    if (PyUnicode_Check(name) &&
        PyUnicode_CompareWithASCIIString(name, "stream") == 0) {
        PyErr_SetString(PyExc_AttributeError,
                        "cubert: Client.stream is a method: `with "
                        "client.stream(id):` works on a stream within a "
                        "block, client.use_stream(id) from now on");
        return -1;
    }
    return PyObject_GenericSetAttr(self, name, value);
}

static PyGetSetDef client_getset[] = {
    {"properties", (getter)client_properties, NULL, NULL, NULL},
    {"device", (getter)client_device, NULL, NULL, NULL},
    {"backend", (getter)client_backend, NULL, NULL, NULL},
    {"closed", (getter)client_closed, NULL, NULL, NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMemberDef client_members[] = {
    {"__weaklistoffset__", T_PYSSIZET, offsetof(pyc_client, weakrefs), READONLY,
     NULL},
    {NULL, 0, 0, 0, NULL},
};

static PyType_Slot client_slots[] = {
    {Py_tp_doc, (void *)"Client(device=None, *, cpu_threads=0, "
                        "cache_dir=None)\n--\n\nA client of one device."},
    {Py_tp_setattro, (void *)client_setattro},
    {Py_tp_new, (void *)PyType_GenericNew},
    {Py_tp_init, (void *)client_init},
    {Py_tp_dealloc, (void *)client_dealloc},
    {Py_tp_repr, (void *)client_repr},
    {Py_tp_methods, client_methods},
    {Py_tp_getset, client_getset},
    {Py_tp_members, client_members},
    {0, NULL},
};

PyType_Spec pyc_client_spec = {
    "cubert._cubert.Client",
    sizeof(pyc_client),
    0,
    Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    client_slots,
};
