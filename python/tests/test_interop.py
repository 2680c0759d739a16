"""NumPy and DLPack interop on the CPU backend: nothing copied (addresses
compared), deleters and release callbacks called exactly once, capsule
protocols, and exported tensors outliving their client's close()."""

import ctypes
import gc
import weakref

import numpy as np
import pytest

import cubert
from conftest import aligned_empty, cubes

# --- DLPack structs and capsule helpers, through ctypes ----------------------

_capsule_name = ctypes.pythonapi.PyCapsule_GetName
_capsule_name.restype = ctypes.c_char_p
_capsule_name.argtypes = [ctypes.py_object]

_capsule_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_pointer.restype = ctypes.c_void_p
_capsule_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]

_capsule_new = ctypes.pythonapi.PyCapsule_New
_capsule_new.restype = ctypes.py_object
_capsule_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8),
                ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", DLDevice),
                ("ndim", ctypes.c_int32), ("dtype", DLDataType),
                ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)),
                ("byte_offset", ctypes.c_uint64)]


DELETER = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


class DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p),
                ("deleter", DELETER)]


class DLPackVersion(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class DLManagedTensorVersioned(ctypes.Structure):
    _fields_ = [("version", DLPackVersion), ("manager_ctx", ctypes.c_void_p),
                ("deleter", DELETER), ("flags", ctypes.c_uint64),
                ("dl_tensor", DLTensor)]


DL_CPU = 1
DL_INT, DL_UINT, DL_FLOAT, DL_BFLOAT, DL_BOOL = 0, 1, 2, 4, 6

DL_CODES = {
    "bool": (DL_BOOL, 8), "int8": (DL_INT, 8), "int16": (DL_INT, 16),
    "int32": (DL_INT, 32), "int64": (DL_INT, 64), "uint8": (DL_UINT, 8),
    "uint16": (DL_UINT, 16), "uint32": (DL_UINT, 32),
    "uint64": (DL_UINT, 64), "float16": (DL_FLOAT, 16),
    "bfloat16": (DL_BFLOAT, 16), "float32": (DL_FLOAT, 32),
    "float64": (DL_FLOAT, 64),
}


def capsule_name(cap):
    return _capsule_name(cap)


def address(arr):
    return arr.__array_interface__["data"][0]


class Producer:
    """A DLPack producer handing out a capsule made beforehand; it records
    how __dlpack__ was called."""

    def __init__(self, capsule, device=(DL_CPU, 0), versioned_ok=True):
        self.capsule = capsule
        self.device = device
        self.versioned_ok = versioned_ok
        self.calls = []

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None,
                   copy=None):
        self.calls.append({"stream": stream, "max_version": max_version,
                           "dl_device": dl_device, "copy": copy})
        if max_version is not None and not self.versioned_ok:
            raise TypeError("no max_version here")
        return self.capsule

    def __dlpack_device__(self):
        return self.device


class HandMade:
    """A DLPack tensor built with ctypes over a NumPy array, whose deleter
    counts its calls: the capsule has no destructor, so every call of the
    deleter is the consumer's."""

    def __init__(self, arr, versioned, flags=0, major=1):
        self.arr = arr
        self.calls = []  # the pointers the deleter was called with
        self.shape = (ctypes.c_int64 * arr.ndim)(*arr.shape)
        self.deleter = DELETER(self._delete)
        name, bits = DL_CODES[arr.dtype.name]
        tensor = DLTensor(ctypes.c_void_p(address(arr)), DLDevice(DL_CPU, 0),
                          arr.ndim, DLDataType(name, bits, 1), self.shape,
                          None, 0)
        if versioned:
            self.managed = DLManagedTensorVersioned(
                DLPackVersion(major, 0), None, self.deleter, flags, tensor)
            self.name = b"dltensor_versioned"
        else:
            self.managed = DLManagedTensor(tensor, None, self.deleter)
            self.name = b"dltensor"
        self.capsule = _capsule_new(ctypes.addressof(self.managed), self.name,
                                    None)

    def _delete(self, ptr):
        # runs inside a ctypes callback: record, never raise
        self.calls.append(ptr)

    @property
    def deleted(self):
        assert all(p == ctypes.addressof(self.managed) for p in self.calls), \
            "the deleter got another pointer than its tensor's"
        return len(self.calls)


def read_versioned(cap):
    ptr = _capsule_pointer(cap, b"dltensor_versioned")
    return DLManagedTensorVersioned.from_address(ptr)


def read_legacy(cap):
    ptr = _capsule_pointer(cap, b"dltensor")
    return DLManagedTensor.from_address(ptr)


def fail_buffer(client, scale, buf_y):
    """Records a launch failure on buf_y (a float32 buffer)."""
    bx = client.asarray(np.zeros(buf_y.nbytes // 4, np.float32))
    with pytest.raises(cubert.InvalidArgumentError):
        client.launch(scale, 1, bx, buf_y, np.float64(1.0))


# --- export to NumPy ---------------------------------------------------------


def test_np_from_dlpack_shares_the_address(client):
    data = np.arange(12, dtype=np.float32).reshape(3, 4)
    buf = client.asarray(data)
    arr = np.from_dlpack(buf)
    assert address(arr) == buf.native[0]
    assert arr.shape == (3, 4)
    assert arr.dtype == np.float32
    np.testing.assert_array_equal(arr, data)
    # the same memory: a cubert write shows in the array
    buf.write(np.full((3, 4), 6.5, np.float32))
    np.testing.assert_array_equal(arr, np.full((3, 4), 6.5, np.float32))
    # and a foreign write (NumPy's import may be read-only: write the bytes
    # at the address) shows in cubert once marked
    value = np.array(-3.0, np.float32)
    ctypes.memmove(address(arr) + 6 * 4, value.ctypes.data, 4)
    assert arr[1, 2] == -3.0
    buf.mark_written()
    assert buf.numpy()[1, 2] == -3.0


@pytest.mark.parametrize("name", ["int8", "int16", "int32", "int64", "uint8",
                                  "uint16", "uint32", "uint64", "float16",
                                  "float32", "float64"])
def test_np_from_dlpack_every_dtype(client, name):
    data = (np.arange(10) * 3 - 7).astype(name)
    buf = client.asarray(data)
    arr = np.from_dlpack(buf)
    assert arr.dtype == data.dtype
    assert address(arr) == buf.native[0]
    np.testing.assert_array_equal(arr, data)


def test_np_from_dlpack_of_a_view_and_a_slice(client):
    data = np.arange(16, dtype=np.int32)
    buf = client.asarray(data)
    v = buf.view((4, 4), "int32")
    arr = np.from_dlpack(v)
    assert arr.shape == (4, 4)
    assert address(arr) == buf.native[0]
    np.testing.assert_array_equal(arr, data.reshape(4, 4))
    s = buf.slice(16, 8)
    arr = np.from_dlpack(s)
    assert arr.dtype == np.uint8
    assert address(arr) == buf.native[0] + 16
    assert arr.tobytes() == data.tobytes()[16:24]


def test_np_from_dlpack_keeps_the_buffer(client):
    data = np.arange(100, dtype=np.float64)
    buf = client.asarray(data)
    arr = np.from_dlpack(buf)
    addr = buf.native[0]
    buf.release()
    del buf
    gc.collect()
    # the tensor holds its own reference: the memory is still the buffer's
    other = client.asarray(np.zeros(100, np.float64))
    assert other.native[0] != addr
    assert address(arr) == addr
    np.testing.assert_array_equal(arr, data)


def test_legacy_capsule(client):
    data = np.arange(6, dtype=np.float32).reshape(2, 3)
    buf = client.asarray(data)
    cap = buf.__dlpack__()
    assert capsule_name(cap) == b"dltensor"
    m = read_legacy(cap)
    t = m.dl_tensor
    assert t.data + t.byte_offset == buf.native[0]
    assert (t.device.device_type, t.device.device_id) == (DL_CPU, 0)
    assert t.ndim == 2
    assert [t.shape[i] for i in range(2)] == [2, 3]
    if t.strides:
        assert [t.strides[i] for i in range(2)] == [3, 1]
    assert (t.dtype.code, t.dtype.bits, t.dtype.lanes) == (DL_FLOAT, 32, 1)
    # consumed by NumPy through a producer handing out that capsule
    arr = np.from_dlpack(Producer(cap))
    assert capsule_name(cap) == b"used_dltensor"
    assert address(arr) == buf.native[0]
    np.testing.assert_array_equal(arr, data)
    # max_version below 1.0 still gives the legacy capsule
    cap = buf.__dlpack__(max_version=(0, 8))
    assert capsule_name(cap) == b"dltensor"


def test_versioned_capsule(client):
    data = np.arange(24, dtype=np.int16).reshape(2, 3, 4)
    buf = client.asarray(data)
    for max_version in ((1, 0), (1, 3), (2, 0)):
        cap = buf.__dlpack__(max_version=max_version)
        assert capsule_name(cap) == b"dltensor_versioned"
        m = read_versioned(cap)
        assert m.version.major == 1
        assert not m.flags & 1  # not read-only
        t = m.dl_tensor
        assert t.data + t.byte_offset == buf.native[0]
        assert (t.device.device_type, t.device.device_id) == (DL_CPU, 0)
        assert t.ndim == 3
        assert [t.shape[i] for i in range(3)] == [2, 3, 4]
        assert (t.dtype.code, t.dtype.bits, t.dtype.lanes) == (DL_INT, 16, 1)
    # a consumer of versioned capsules: NumPy 2.1 and later
    major, minor = (int(v) for v in np.__version__.split(".")[:2])
    if (major, minor) >= (2, 1):
        arr = np.from_dlpack(buf)
        assert address(arr) == buf.native[0]
        np.testing.assert_array_equal(arr, data)


@pytest.mark.parametrize("name", sorted(DL_CODES))
def test_capsule_dtypes(client, name):
    buf = client.empty(4, name)
    for versioned in (False, True):
        if versioned:
            t = read_versioned(buf.__dlpack__(max_version=(1, 0))).dl_tensor
        else:
            t = read_legacy(buf.__dlpack__()).dl_tensor
        assert (t.dtype.code, t.dtype.bits, t.dtype.lanes) == \
            (*DL_CODES[name], 1)
        assert t.ndim == 1 and t.shape[0] == 4


def test_unconsumed_capsules_release_their_reference(client):
    gc.collect()
    before = client.memory_usage()["buffers"]
    buf = client.empty(1 << 16, "uint8")
    assert client.memory_usage()["buffers"] == before + 1
    caps = [buf.__dlpack__(), buf.__dlpack__(max_version=(1, 0))]
    buf.release()
    # the capsules hold the buffer
    assert client.memory_usage()["buffers"] == before + 1
    del caps
    gc.collect()
    assert client.memory_usage()["buffers"] == before


def test_dlpack_device(client):
    buf = client.empty(8, "float32")
    assert buf.__dlpack_device__() == (1, 0)
    assert tuple(buf.__dlpack_device__()) == (DL_CPU, 0)
    assert buf.slice(0, 4).__dlpack_device__() == (1, 0)


def test_dlpack_stream_on_cpu_is_refused(client):
    buf = client.empty(8, "float32")
    with pytest.raises(BufferError):
        buf.__dlpack__(stream=5)
    with pytest.raises(BufferError):
        buf.__dlpack__(stream=1, max_version=(1, 0))
    with pytest.raises(BufferError):
        buf.__dlpack__(stream=-1)
    assert capsule_name(buf.__dlpack__(stream=None)) == b"dltensor"


def test_dlpack_copy_and_device_requests(client):
    buf = client.empty(8, "float32")
    with pytest.raises(BufferError):
        buf.__dlpack__(copy=True)
    with pytest.raises(BufferError):
        buf.__dlpack__(max_version=(1, 0), copy=True)
    with pytest.raises(BufferError):
        buf.__dlpack__(dl_device=(2, 0))
    with pytest.raises(BufferError):
        buf.__dlpack__(max_version=(1, 0), dl_device=(1, 3))
    assert capsule_name(buf.__dlpack__(copy=False)) == b"dltensor"
    cap = buf.__dlpack__(max_version=(1, 0), dl_device=(1, 0), copy=False)
    assert capsule_name(cap) == b"dltensor_versioned"
    assert not read_versioned(cap).flags & 2  # not a copy


def test_export_of_a_failed_buffer_is_refused(client, scale):
    y = client.asarray(np.zeros(16, np.float32))
    fail_buffer(client, scale, y)
    with pytest.raises(cubert.SeveralError) as info:
        y.__dlpack__()
    assert all(isinstance(c, cubert.Error) for c in info.value.causes)
    assert info.value.causes
    with pytest.raises(cubert.SeveralError):
        y.__dlpack__(max_version=(1, 0))
    with pytest.raises(cubert.SeveralError):
        np.from_dlpack(y)
    # a full write clears it, and the export works again
    y.write(np.ones(16, np.float32))
    np.testing.assert_array_equal(np.from_dlpack(y), np.ones(16, np.float32))


def test_exported_tensor_outlives_close():
    c = cubert.Client("cpu")
    data = np.arange(1000, dtype=np.float32) * 0.5
    buf = c.asarray(data)
    addr = buf.native[0]
    arr = np.from_dlpack(buf)
    cap = buf.__dlpack__(max_version=(1, 0))
    del buf
    c.close()
    gc.collect()
    # the client is closed for Python...
    with pytest.raises(cubert.InvalidArgumentError):
        c.empty(4)
    # ...but the memory lives on while the tensors are held
    assert address(arr) == addr
    np.testing.assert_array_equal(arr, data)
    assert read_versioned(cap).dl_tensor.data == addr
    del arr
    gc.collect()
    got = np.frombuffer(ctypes.string_at(addr, data.nbytes), np.float32)
    np.testing.assert_array_equal(got, data)
    del cap
    gc.collect()


# --- import from NumPy -------------------------------------------------------


def test_client_from_dlpack_shares_the_address(client):
    arr = aligned_empty(48, np.float32).reshape(6, 8)
    arr[...] = np.arange(48, dtype=np.float32).reshape(6, 8)
    buf = client.from_dlpack(arr)
    assert isinstance(buf, cubert.Buffer)
    assert buf.client is client
    assert buf.native[0] == address(arr)
    assert buf.shape == (6, 8)
    assert buf.dtype == "float32"
    assert buf.nbytes == arr.nbytes
    np.testing.assert_array_equal(buf.numpy(), arr)
    # the same memory both ways
    buf.write(np.full((6, 8), 2.0, np.float32))
    np.testing.assert_array_equal(arr, np.full((6, 8), 2.0, np.float32))
    arr[0, 0] = 11.0
    buf.mark_written()
    assert buf.numpy()[0, 0] == 11.0


def test_client_from_dlpack_misaligned_is_refused(client):
    arr = aligned_empty(65, np.float32)[1:]  # 4 bytes past a 64-byte line
    assert address(arr) % 16 == 4
    with pytest.raises(cubert.InvalidArgumentError):
        client.from_dlpack(arr)


def test_from_dlpack_of_a_strided_tensor(client):
    """A Buffer is C-contiguous with a shape and a dtype: a strided tensor
    cannot be one. It is refused, or (were it taken) its elements must read
    back as the tensor's, never as the bytes its elements span."""
    base = aligned_empty(16, np.float64)
    base[:] = np.arange(16)
    strided = base[::2]
    assert not strided.flags.c_contiguous
    try:
        buf = client.from_dlpack(strided)
    except (cubert.InvalidArgumentError, BufferError):
        return
    assert buf.dtype == "float64" and buf.shape == (8,)
    np.testing.assert_array_equal(buf.numpy(), strided)


def test_module_from_dlpack(client):
    arr = aligned_empty(10, np.int64)
    arr[:] = np.arange(10) * 100
    b1 = cubert.from_dlpack(arr)
    assert b1.native[0] == address(arr)
    assert b1.client.backend == "cpu"
    np.testing.assert_array_equal(b1.numpy(), arr)
    # one client per producer device and process
    arr2 = aligned_empty(4, np.int64)
    b2 = cubert.from_dlpack(arr2)
    assert b2.client is b1.client
    # with a client given, that one
    b3 = cubert.from_dlpack(arr, client=client)
    assert b3.client is client
    assert b3.native[0] == address(arr)
    b1.release()
    b2.release()


def test_from_dlpack_asks_for_a_versioned_capsule(client):
    data = aligned_empty(8, np.uint32)
    data[:] = np.arange(8)
    made = HandMade(data, versioned=True)
    producer = Producer(made.capsule)
    buf = client.from_dlpack(producer)
    assert producer.calls, "__dlpack__ was not called"
    mv = producer.calls[0]["max_version"]
    assert mv is not None and tuple(mv) >= (1, 0)
    assert producer.calls[0]["stream"] is None  # no stream on the CPU
    assert capsule_name(made.capsule) == b"used_dltensor_versioned"
    assert buf.native[0] == address(data)
    assert buf.dtype == "uint32" and buf.shape == (8,)
    np.testing.assert_array_equal(buf.numpy(), np.arange(8, dtype=np.uint32))
    assert made.deleted == 0
    buf.release()
    gc.collect()
    assert made.deleted == 1
    gc.collect()
    assert made.deleted == 1


def test_from_dlpack_falls_back_to_legacy(client):
    data = aligned_empty(5, np.float64)
    data[:] = [1, 2, 3, 4, 5]
    made = HandMade(data, versioned=False)
    producer = Producer(made.capsule, versioned_ok=False)
    buf = client.from_dlpack(producer)
    assert capsule_name(made.capsule) == b"used_dltensor"
    assert buf.native[0] == address(data)
    np.testing.assert_array_equal(buf.numpy(), [1.0, 2, 3, 4, 5])
    v = buf.view((5,), "float64")
    del buf
    gc.collect()
    assert made.deleted == 0  # the view still holds the handle
    np.testing.assert_array_equal(v.numpy(), [1.0, 2, 3, 4, 5])
    del v
    gc.collect()
    assert made.deleted == 1


def test_refused_import_leaves_the_tensor_to_its_owner(client):
    data = aligned_empty(4, np.float32)
    read_only = HandMade(data, versioned=True, flags=1)
    with pytest.raises(cubert.UnsupportedError):
        client.from_dlpack(Producer(read_only.capsule))
    assert capsule_name(read_only.capsule) == b"dltensor_versioned"
    future = HandMade(data, versioned=True, major=2)
    with pytest.raises(cubert.InvalidArgumentError):
        client.from_dlpack(Producer(future.capsule))
    assert capsule_name(future.capsule) == b"dltensor_versioned"
    gc.collect()
    assert read_only.deleted == 0 and future.deleted == 0


def test_from_dlpack_deleter_runs_once_when_the_client_closes():
    c = cubert.Client("cpu")
    data = aligned_empty(16, np.float32)
    made = HandMade(data, versioned=True)
    buf = c.from_dlpack(Producer(made.capsule))
    np.testing.assert_array_equal(buf.numpy(), data)
    c.close()
    gc.collect()
    assert made.deleted == 1
    del buf
    gc.collect()
    assert made.deleted == 1


class Tracked(np.ndarray):
    """An array subclass: its instances take weak references."""


def test_from_dlpack_numpy_deleter_called_once(client):
    base = aligned_empty(32, np.float32)
    base[:] = np.arange(32)
    t = base.view(Tracked)
    freed = []
    weakref.finalize(t, freed.append, "freed")
    buf = client.from_dlpack(t)
    assert buf.native[0] == address(base)
    del t
    gc.collect()
    assert freed == []  # the imported tensor holds the array
    np.testing.assert_array_equal(buf.numpy(), np.arange(32))
    v = buf.view((4, 8), "float32")
    buf.release()
    gc.collect()
    assert freed == []
    np.testing.assert_array_equal(v.numpy(), np.arange(32).reshape(4, 8))
    v.release()
    gc.collect()
    assert freed == ["freed"]


def test_cubert_to_cubert_round_trip(client):
    data = np.arange(64, dtype=np.float32)
    buf = client.asarray(data)
    with cubert.Client("cpu") as other:
        imported = other.from_dlpack(buf)
        assert imported.client is other
        assert imported.native[0] == buf.native[0]
        assert imported.shape == (64,) and imported.dtype == "float32"
        np.testing.assert_array_equal(imported.numpy(), data)
        imported.write(np.zeros(64, np.float32))
        np.testing.assert_array_equal(buf.numpy(), np.zeros(64, np.float32))
        imported.release()


# --- wrap --------------------------------------------------------------------


def test_native_wait_on_a_host_backend(client):
    client.native_wait(0)
    with pytest.raises(cubert.InvalidArgumentError):
        client.native_wait(5)
    with pytest.raises(TypeError):
        client.native_wait("legacy")
    with pytest.raises(OverflowError):
        client.native_wait(-1)
    assert client.asarray(np.ones(4, np.float32)).numpy().sum() == 4


def test_wrap_shares_memory_and_sees_kernel_writes(client, scale):
    n = 1000
    arr = aligned_empty(n, np.float32)
    arr[:] = -1.0
    x = client.asarray(np.arange(n, dtype=np.float32))
    y = client.wrap(arr)
    assert isinstance(y, cubert.Buffer)
    assert y.native[0] == address(arr)
    assert y.shape == (n,)
    assert y.dtype == "float32"
    assert y.nbytes == arr.nbytes
    client.launch(scale, cubes(n), x, y, 2.0)
    client.sync()
    np.testing.assert_array_equal(arr, np.arange(n, dtype=np.float32) * 2)
    # and host writes are seen by cubert
    arr[:] = 4.0
    y.mark_written()
    np.testing.assert_array_equal(y.numpy(), np.full(n, 4.0, np.float32))


def test_wrap_multidimensional(client):
    arr = aligned_empty(12, np.int32).reshape(3, 4)
    arr[...] = np.arange(12).reshape(3, 4)
    buf = client.wrap(arr)
    assert buf.shape == (3, 4)
    assert buf.dtype == "int32"
    np.testing.assert_array_equal(buf.numpy(), arr)


def test_wrap_misaligned_is_refused(client):
    arr = aligned_empty(17, np.float32)[1:]
    with pytest.raises(cubert.InvalidArgumentError):
        client.wrap(arr)


def test_wrap_counts_as_foreign_memory(client):
    gc.collect()
    before = client.memory_usage()
    arr = aligned_empty(256, np.float64)
    buf = client.wrap(arr)
    after = client.memory_usage()
    assert after["foreign_buffers"] == before["foreign_buffers"] + 1
    assert after["foreign_bytes"] == before["foreign_bytes"] + arr.nbytes
    assert after["bytes_in_use"] == before["bytes_in_use"]
    buf.release()
    gc.collect()
    again = client.memory_usage()
    assert again["foreign_buffers"] == before["foreign_buffers"]
    assert again["foreign_bytes"] == before["foreign_bytes"]


def test_wrap_keeps_the_object_and_releases_it_once(client):
    obj = aligned_empty(64, np.uint8).view(Tracked)
    obj[:] = np.arange(64)
    freed = []
    weakref.finalize(obj, freed.append, 1)
    buf = client.wrap(obj)
    ref = weakref.ref(obj)
    del obj
    gc.collect()
    assert freed == [] and ref() is not None
    np.testing.assert_array_equal(buf.numpy(), np.arange(64, dtype=np.uint8))
    s = buf.slice(8, 8)  # keeps the buffer, so the object
    buf.release()
    gc.collect()
    assert freed == []
    assert s.numpy().tobytes() == bytes(range(8, 16))
    del s
    gc.collect()
    assert freed == [1] and ref() is None


def test_wrap_released_once_when_dropped(client):
    obj = aligned_empty(32, np.float32).view(Tracked)
    freed = []
    weakref.finalize(obj, freed.append, 1)
    buf = client.wrap(obj)
    del obj
    gc.collect()
    assert freed == []
    del buf
    gc.collect()
    assert freed == [1]


def test_wrap_released_once_when_the_client_closes():
    c = cubert.Client("cpu")
    obj = aligned_empty(32, np.float32).view(Tracked)
    freed = []
    weakref.finalize(obj, freed.append, 1)
    buf = c.wrap(obj)
    del obj
    gc.collect()
    assert freed == []
    c.close()
    gc.collect()
    assert freed == [1]
    del buf
    gc.collect()
    assert freed == [1]


def test_wrap_bytes_like_needs_an_array_interface(client):
    with pytest.raises((TypeError, cubert.InvalidArgumentError)):
        client.wrap(12)


def test_wrap_released_on_another_thread(client):
    import threading
    obj = aligned_empty(64, np.float32).view(Tracked)
    obj[:] = 3.0
    freed = []
    weakref.finalize(obj, lambda: freed.append(threading.get_ident()))
    buf = client.wrap(obj)
    del obj
    box = [buf]
    del buf

    def drop():
        np.testing.assert_array_equal(box[0].numpy(), np.full(64, 3.0))
        box.pop().release()
        gc.collect()

    t = threading.Thread(target=drop)
    t.start()
    t.join(timeout=30)
    assert not t.is_alive()
    gc.collect()
    assert len(freed) == 1
    assert freed[0] == t.ident  # released on the thread that dropped it


def test_exported_tensor_keeps_an_unreferenced_client():
    data = np.arange(50, dtype=np.int32)
    arr = np.from_dlpack(cubert.Client("cpu").asarray(data))
    gc.collect()
    np.testing.assert_array_equal(arr, data)
    del arr
    gc.collect()
