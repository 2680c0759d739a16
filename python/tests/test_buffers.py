"""Buffers: making them, copying in and out, views, slices, and what a
released buffer or a closed client answers."""

import gc

import numpy as np
import pytest

import cubert

# Every dtype of the spec that NumPy has, with values that exercise the
# whole range of the type (extremes, signs, special floats).
NUMPY_DTYPES = {
    "bool": np.array([True, False, True, True, False, False, True], np.bool_),
    "int8": np.array([-128, -1, 0, 1, 127, 42, -77], np.int8),
    "int16": np.array([-32768, -1, 0, 1, 32767, 1234, -4321], np.int16),
    "int32": np.array([-2**31, -1, 0, 1, 2**31 - 1, 123456, -654321],
                      np.int32),
    "int64": np.array([-2**63, -1, 0, 1, 2**63 - 1, 2**40 + 3, -2**50],
                      np.int64),
    "uint8": np.array([0, 1, 127, 128, 255, 42, 200], np.uint8),
    "uint16": np.array([0, 1, 32767, 32768, 65535, 4242, 60000], np.uint16),
    "uint32": np.array([0, 1, 2**31 - 1, 2**31, 2**32 - 1, 7, 3000000000],
                       np.uint32),
    "uint64": np.array([0, 1, 2**63 - 1, 2**63, 2**64 - 1, 7, 2**40 + 1],
                       np.uint64),
    "float16": np.array([0.0, -0.0, 1.5, -2.25, 65504.0, np.inf, np.nan],
                        np.float16),
    "float32": np.array([0.0, -0.0, 1.5, -2.25, 3.4e38, -np.inf, np.nan],
                        np.float32),
    "float64": np.array([0.0, -0.0, 1.5, -2.25, 1.7e308, np.inf, np.nan],
                        np.float64),
}

# Unsigned views of the same width, to compare floats bit for bit (NaN,
# -0.0).
_BITS = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def same_bits(a, b):
    a = np.ascontiguousarray(a)
    b = np.ascontiguousarray(b)
    assert a.dtype.itemsize == b.dtype.itemsize
    assert a.shape == b.shape
    bits = _BITS[a.dtype.itemsize]
    np.testing.assert_array_equal(a.view(bits), b.view(bits))


@pytest.mark.parametrize("name", sorted(NUMPY_DTYPES))
def test_asarray_numpy_round_trip_every_dtype(client, name):
    arr = NUMPY_DTYPES[name]
    buf = client.asarray(arr)
    assert isinstance(buf, cubert.Buffer)
    assert buf.client is client
    assert buf.dtype == name
    assert buf.shape == arr.shape
    assert buf.nbytes == arr.nbytes
    out = buf.numpy()
    assert isinstance(out, np.ndarray)
    assert out.dtype == arr.dtype
    assert out.shape == arr.shape
    same_bits(out, arr)
    # a copy: changing the source afterwards changes nothing in the buffer
    arr2 = arr.copy()
    buf2 = client.asarray(arr2)
    arr2[...] = arr2[::-1]
    same_bits(buf2.numpy(), arr)


@pytest.mark.parametrize("name", sorted(NUMPY_DTYPES))
def test_empty_write_read_every_dtype(client, name):
    arr = np.ascontiguousarray(np.resize(NUMPY_DTYPES[name], (3, 5)))
    buf = client.empty((3, 5), name)
    assert buf.dtype == name
    assert buf.shape == (3, 5)
    assert buf.nbytes == arr.nbytes
    buf.write(arr)
    out = np.empty_like(arr)
    out.view(_BITS[arr.dtype.itemsize])[...] = 0x5A
    assert buf.read(out) is None
    same_bits(out, arr)
    same_bits(buf.numpy(), arr)


def test_bfloat16_carries_its_words(client):
    # bfloat16 bits of 1.0, -2.0, 0.5, +inf, a NaN, 3.140625
    words = np.array([0x3F80, 0xC000, 0x3F00, 0x7F80, 0x7FC1, 0x4049],
                     np.uint16)
    buf = client.empty(words.size, "bfloat16")
    assert buf.dtype == "bfloat16"
    assert buf.shape == (words.size,)
    assert buf.nbytes == 2 * words.size
    buf.write(words.tobytes())
    out = np.zeros_like(words)
    buf.read(out)
    np.testing.assert_array_equal(out, words)
    got = buf.numpy()
    assert got.dtype.itemsize == 2
    np.testing.assert_array_equal(got.view(np.uint16), words)


def test_asarray_as_bfloat16(client):
    words = np.array([0x3F80, 0xC000, 0x3F00, 0x7F80], np.uint16)
    buf = client.asarray(words.tobytes(), dtype="bfloat16")
    assert buf.dtype == "bfloat16"
    assert buf.shape == (4,)
    np.testing.assert_array_equal(buf.numpy().view(np.uint16), words)
    # the 16-bit words of an array, carried as bfloat16
    buf2 = client.asarray(words, dtype="bfloat16")
    assert buf2.dtype == "bfloat16"
    np.testing.assert_array_equal(buf2.numpy().view(np.uint16), words)


def test_empty_shapes_and_default_dtype(client):
    b = client.empty(10)
    assert b.dtype == "uint8"
    assert b.shape == (10,)
    assert b.nbytes == 10
    b = client.empty((2, 3, 4), "float64")
    assert b.shape == (2, 3, 4)
    assert b.nbytes == 2 * 3 * 4 * 8
    assert b.dtype == "float64"
    # a NumPy dtype is accepted for the dtype
    b = client.empty([4], np.dtype(np.int16))
    assert b.dtype == "int16" and b.nbytes == 8 and b.shape == (4,)


def test_empty_zero_bytes_is_refused(client):
    with pytest.raises(cubert.InvalidArgumentError):
        client.empty(0, "float32")


def test_unknown_dtype_is_a_type_error(client):
    with pytest.raises(TypeError):
        client.empty(4, "complex64")


def test_asarray_multidimensional(client):
    arr = np.arange(24, dtype=np.int32).reshape(2, 3, 4)
    buf = client.asarray(arr)
    assert buf.shape == (2, 3, 4)
    np.testing.assert_array_equal(buf.numpy(), arr)


def test_asarray_bytes_and_bytearray(client):
    data = bytes(range(256)) * 3
    buf = client.asarray(data)
    assert buf.dtype == "uint8"
    assert buf.shape == (len(data),)
    assert buf.nbytes == len(data)
    assert buf.numpy().tobytes() == data
    ba = bytearray(b"cubert\x00\xff" * 5)
    buf2 = client.asarray(ba)
    assert buf2.nbytes == len(ba)
    assert buf2.numpy().tobytes() == bytes(ba)
    ba[0] = 0  # a copy: the buffer keeps the old byte
    assert buf2.numpy().tobytes()[0] == ord("c")


def test_asarray_bytes_with_dtype(client):
    arr = np.array([1.5, -2.0, 3.25, 1e9], np.float32)
    buf = client.asarray(arr.tobytes(), dtype="float32")
    assert buf.dtype == "float32"
    assert buf.shape == (4,)
    np.testing.assert_array_equal(buf.numpy(), arr)


def test_asarray_non_contiguous(client):
    # refused, or copied element by element: never the raw strided bytes
    arr = np.arange(20, dtype=np.float32)[::2]
    assert not arr.flags.c_contiguous
    try:
        buf = client.asarray(arr)
    except (cubert.InvalidArgumentError, TypeError):
        return
    assert buf.shape == (10,)
    np.testing.assert_array_equal(buf.numpy(), arr)


def test_write_bytes_bytearray_and_array(client):
    buf = client.empty(8, "uint8")
    buf.write(b"abcdefgh")
    assert buf.numpy().tobytes() == b"abcdefgh"
    buf.write(bytearray(b"ABCDEFGH"))
    assert buf.numpy().tobytes() == b"ABCDEFGH"
    buf.write(np.arange(2, dtype=np.uint32))
    assert buf.numpy().tobytes() == np.arange(2, dtype=np.uint32).tobytes()


def test_read_into_bytearray(client):
    data = np.arange(16, dtype=np.uint16)
    buf = client.asarray(data)
    out = bytearray(32)
    buf.read(out)
    assert bytes(out) == data.tobytes()


def test_write_wrong_size_is_refused(client):
    buf = client.asarray(np.arange(8, dtype=np.float32))
    with pytest.raises(cubert.InvalidArgumentError):
        buf.write(np.zeros(7, np.float32))
    with pytest.raises(cubert.InvalidArgumentError):
        buf.write(b"\x00" * 33)
    with pytest.raises(cubert.InvalidArgumentError):
        buf.write(bytearray(31))
    # nothing was written
    np.testing.assert_array_equal(buf.numpy(), np.arange(8, dtype=np.float32))


def test_read_wrong_size_is_refused(client):
    buf = client.asarray(np.arange(8, dtype=np.float32))
    small = np.full(7, -1, np.float32)
    with pytest.raises(cubert.InvalidArgumentError):
        buf.read(small)
    np.testing.assert_array_equal(small, np.full(7, -1, np.float32))
    with pytest.raises(cubert.InvalidArgumentError):
        buf.read(np.zeros(9, np.float32))
    with pytest.raises(cubert.InvalidArgumentError):
        buf.read(bytearray(33))


def test_read_into_read_only_is_refused(client):
    buf = client.asarray(b"12345678")
    out = np.zeros(8, np.uint8)
    out.flags.writeable = False
    with pytest.raises((cubert.InvalidArgumentError, TypeError)):
        buf.read(out)
    with pytest.raises((cubert.InvalidArgumentError, TypeError)):
        buf.read(b"\x00" * 8)
    assert not out.any()


def test_view_shares_the_handle(client):
    arr = np.arange(12, dtype=np.float32)
    buf = client.asarray(arr)
    v = buf.view((3, 4), "float32")
    assert isinstance(v, cubert.Buffer)
    assert v is not buf
    assert v.shape == (3, 4)
    assert v.dtype == "float32"
    assert v.nbytes == buf.nbytes
    np.testing.assert_array_equal(v.numpy(), arr.reshape(3, 4))
    assert v.native[0] == buf.native[0]
    raw = buf.view(48, "uint8")
    assert raw.shape == (48,) and raw.dtype == "uint8"
    assert raw.numpy().tobytes() == arr.tobytes()
    words = buf.view((6,), "int64")
    np.testing.assert_array_equal(words.numpy(), arr.view(np.int64))
    # a write through the view shows in the original
    v.write(np.full((3, 4), 7.0, np.float32))
    np.testing.assert_array_equal(buf.numpy(), np.full(12, 7.0, np.float32))


def test_view_must_cover_the_same_bytes(client):
    buf = client.empty(12, "float32")
    with pytest.raises(cubert.InvalidArgumentError):
        buf.view((5,), "float32")
    with pytest.raises(cubert.InvalidArgumentError):
        buf.view((13,), "float32")
    with pytest.raises(cubert.InvalidArgumentError):
        buf.view(47, "uint8")


def test_view_is_its_own_reference(client):
    arr = np.arange(6, dtype=np.int32)
    buf = client.asarray(arr)
    v = buf.view((2, 3), "int32")
    v.release()
    with pytest.raises(cubert.InvalidArgumentError):
        v.numpy()
    # the original keeps its reference
    np.testing.assert_array_equal(buf.numpy(), arr)
    v2 = buf.view((3, 2), "int32")
    buf.release()
    np.testing.assert_array_equal(v2.numpy(), arr.reshape(3, 2))


def test_slice(client):
    arr = np.arange(16, dtype=np.uint32)
    data = arr.tobytes()
    buf = client.asarray(arr)
    s = buf.slice(8, 16)
    assert isinstance(s, cubert.Buffer)
    assert s.dtype == "uint8"
    assert s.shape == (16,)
    assert s.nbytes == 16
    assert s.numpy().tobytes() == data[8:24]
    addr, size, host = s.native
    assert addr == buf.native[0] + 8
    assert size == 16
    assert host
    # writes through the slice land in the parent, and only there
    s.write(b"\xff" * 16)
    expect = bytearray(data)
    expect[8:24] = b"\xff" * 16
    assert buf.numpy().tobytes() == bytes(expect)
    # a slice keeps the buffer alive
    buf.release()
    assert s.numpy().tobytes() == b"\xff" * 16
    # a slice of a slice: offsets add up
    s2 = s.slice(4, 4)
    assert s2.native[0] == addr + 4


def test_slice_out_of_range_is_refused(client):
    buf = client.empty(32)
    with pytest.raises(cubert.InvalidArgumentError):
        buf.slice(30, 4)
    with pytest.raises(cubert.InvalidArgumentError):
        buf.slice(0, 0)
    with pytest.raises(cubert.InvalidArgumentError):
        buf.slice(33, 1)


def test_native_on_cpu(client):
    buf = client.asarray(np.arange(100, dtype=np.uint8))
    addr, size, host = buf.native
    assert isinstance(addr, int) and addr != 0
    assert size == 100
    assert host
    align = client.properties["memory_alignment"]
    assert addr % align == 0


def test_mark_written(client):
    buf = client.asarray(np.zeros(4, np.float32))
    assert buf.mark_written() is None
    np.testing.assert_array_equal(buf.numpy(), np.zeros(4, np.float32))


def test_release_then_use(client):
    other = client.asarray(np.zeros(4, np.float32))
    buf = client.asarray(np.arange(4, dtype=np.float32))
    assert buf.release() is None
    out = np.zeros(4, np.float32)
    with pytest.raises(cubert.InvalidArgumentError):
        buf.numpy()
    with pytest.raises(cubert.InvalidArgumentError):
        buf.read(out)
    with pytest.raises(cubert.InvalidArgumentError):
        buf.write(out)
    with pytest.raises(cubert.InvalidArgumentError):
        buf.view((2, 2), "float32")
    with pytest.raises(cubert.InvalidArgumentError):
        buf.slice(0, 4)
    with pytest.raises(cubert.InvalidArgumentError):
        buf.native
    with pytest.raises(cubert.InvalidArgumentError):
        buf.mark_written()
    with pytest.raises(cubert.InvalidArgumentError):
        buf.__dlpack__()
    with pytest.raises(cubert.InvalidArgumentError):
        client.sync(buf)
    with pytest.raises(cubert.InvalidArgumentError):
        client.check(buf)
    # other buffers are unaffected
    np.testing.assert_array_equal(other.numpy(), np.zeros(4, np.float32))


def test_release_then_launch(client, scale):
    x = client.asarray(np.ones(8, np.float32))
    y = client.empty(8, "float32")
    x.release()
    with pytest.raises(cubert.InvalidArgumentError):
        client.launch(scale, 1, x, y, 2.0)


def test_close_then_use():
    c = cubert.Client("cpu")
    buf = c.asarray(np.arange(4, dtype=np.int32))
    c.close()
    with pytest.raises(cubert.InvalidArgumentError):
        buf.numpy()
    with pytest.raises(cubert.InvalidArgumentError):
        buf.read(np.zeros(4, np.int32))
    with pytest.raises(cubert.InvalidArgumentError):
        buf.write(np.zeros(4, np.int32))
    with pytest.raises(cubert.InvalidArgumentError):
        buf.native
    with pytest.raises(cubert.InvalidArgumentError):
        buf.slice(0, 4)
    with pytest.raises(cubert.InvalidArgumentError):
        c.empty(4)
    with pytest.raises(cubert.InvalidArgumentError):
        c.asarray(b"1234")
    with pytest.raises(cubert.InvalidArgumentError):
        c.memory_usage()
    with pytest.raises(cubert.InvalidArgumentError):
        c.sync()
    c.close()  # a second close does nothing
    assert buf.client is c


def test_context_manager_closes():
    with cubert.Client("cpu") as c:
        buf = c.asarray(np.arange(3, dtype=np.float64))
        np.testing.assert_array_equal(buf.numpy(), [0.0, 1.0, 2.0])
    with pytest.raises(cubert.InvalidArgumentError):
        buf.numpy()
    with pytest.raises(cubert.InvalidArgumentError):
        c.empty(1)


def test_buffer_keeps_its_client_alive():
    buf = cubert.Client("cpu").asarray(np.arange(5, dtype=np.int16))
    gc.collect()
    assert buf.client.backend == "cpu"
    np.testing.assert_array_equal(buf.numpy(), np.arange(5, dtype=np.int16))
    buf.client.close()


def test_buffer_type_errors(client):
    buf = client.empty(4, "float32")
    with pytest.raises(TypeError):
        buf.read(None)
    with pytest.raises(TypeError):
        buf.read(12345)
    with pytest.raises(TypeError):
        buf.write(None)
    with pytest.raises(TypeError):
        client.asarray(object())


def test_write_of_a_python_int_is_a_type_error(client):
    # an int has no __array_interface__ and is not bytes-like; it must not
    # be written as some integer type's bytes
    buf = client.asarray(np.zeros(8, np.uint8))
    with pytest.raises(TypeError):
        buf.write(12345)
    assert buf.numpy().tobytes() == bytes(8)


def test_write_sequence_converts_to_the_buffer_dtype(client):
    buf = client.empty(4, "float32")
    buf.write([1, 2, 3.5, -4])
    np.testing.assert_array_equal(buf.numpy(),
                                  np.array([1, 2, 3.5, -4], np.float32))
    with pytest.raises(cubert.InvalidArgumentError):
        buf.write([1, 2, 3])  # 3 elements do not cover 16 bytes


def test_label_read_set_clear_and_refuse(client):
    buf = client.empty(64)
    assert buf.label == ""
    buf.label = "weights"
    assert buf.label == "weights"
    # slices share their buffer's label
    assert buf.slice(8, 8).label == "weights"
    with pytest.raises(cubert.InvalidArgumentError):
        buf.label = "x" * 64
    with pytest.raises(cubert.InvalidArgumentError):
        buf.label = 'a"b'
    assert buf.label == "weights"
    buf.label = None
    assert buf.label == ""
    buf.label = "again"
    buf.label = ""
    assert buf.label == ""
    buf.release()
    with pytest.raises(cubert.InvalidArgumentError):
        buf.label = "late"
