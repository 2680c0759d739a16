"""Arguments from Python checked before they reach C: an int the C type
cannot hold is refused (OverflowError), not cut to its low bits; a wrong
type is a TypeError; the client stays usable after each."""

import numpy as np
import pytest

import cubert
from conftest import assert_usable


@pytest.mark.parametrize("threads", [2**32 + 3, -1, 2**64 + 1])
def test_cpu_threads_out_of_range(threads):
    with pytest.raises(OverflowError, match="cpu_threads"):
        cubert.Client("cpu", cpu_threads=threads)


def test_cpu_threads_of_another_type():
    with pytest.raises(TypeError, match="cpu_threads"):
        cubert.Client("cpu", cpu_threads="2")
    with pytest.raises(TypeError, match="cpu_threads"):
        cubert.Client("cpu", cpu_threads=2.0)


def test_cpu_threads_above_the_c_limit_is_the_c_apis_refusal():
    # Within uint32 but above CUBE_MAX_CPU_THREADS: the C API says no.
    with pytest.raises(cubert.InvalidArgumentError):
        cubert.Client("null", cpu_threads=5000)


@pytest.mark.parametrize("offset, nbytes", [
    (2**64 + 8, 4), (-1, 4), (0, -4), (0, 2**63), (8, 2**64 + 4)])
def test_slice_out_of_range(client, offset, nbytes):
    buf = client.asarray(np.arange(16, dtype=np.float32))
    with pytest.raises(OverflowError):
        buf.slice(offset, nbytes)
    np.testing.assert_array_equal(buf.numpy(), np.arange(16))
    assert_usable(client)


def test_slice_takes_index_ints(client):
    buf = client.asarray(np.arange(16, dtype=np.uint8))
    part = buf.slice(np.int64(8), np.uint8(4))
    np.testing.assert_array_equal(part.numpy(), [8, 9, 10, 11])
    with pytest.raises(TypeError):
        buf.slice(8.0, 4)


def test_shape_takes_index_ints(client):
    assert client.empty(np.int64(5), "float32").shape == (5,)
    assert client.empty((np.int32(2), 3)).shape == (2, 3)


def test_write_of_text_is_a_type_error(client):
    buf = client.empty(256)
    with pytest.raises(TypeError, match="str"):
        buf.write("x" * 256)
    with pytest.raises(TypeError, match="str"):
        client.asarray("abc")
    buf.write(b"x" * 256)
    assert bytes(buf.numpy()) == b"x" * 256
    assert_usable(client)


@pytest.mark.parametrize("device, error", [
    ("x", TypeError), ((1,), TypeError), ([1, 0], TypeError),
    ((1, "0"), TypeError), ((2**40, 0), OverflowError),
    ((-1, 0), OverflowError)])
def test_dlpack_device_refusals(client, device, error):
    buf = client.asarray(np.arange(4, dtype=np.float32))
    with pytest.raises(error):
        buf.__dlpack__(dl_device=device)
    buf.__dlpack__(dl_device=buf.__dlpack_device__())
    assert_usable(client)


@pytest.mark.parametrize("version, error", [
    ("1.0", TypeError), ((1,), TypeError), ((1, "0"), TypeError),
    ((-1, 0), OverflowError), ((2**70, 0), OverflowError)])
def test_dlpack_max_version_refusals(client, version, error):
    buf = client.asarray(np.arange(4, dtype=np.float32))
    with pytest.raises(error):
        buf.__dlpack__(max_version=version)
    assert_usable(client)


@pytest.mark.parametrize("stream, error", [
    (-1, OverflowError), (2**64, OverflowError), ("x", TypeError),
    (7, cubert.InvalidArgumentError)])
def test_native_wait_refusals(client, stream, error):
    with pytest.raises(error):
        client.native_wait(stream)
    client.native_wait(0)
    assert_usable(client)
