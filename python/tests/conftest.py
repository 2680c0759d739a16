"""Shared fixtures of cubert's Python tests.

The suite runs on the CPU backend (CI has no GPU). Tests marked `cuda`
run only where `cubert.Client("cuda")` opens; elsewhere they are skipped.
Kernels compile with the system C compiler on first use and are cached, so
the sources used by several tests live here, once.
"""

import gc

import numpy as np
import pytest

import cubert

# y = a * x (CUBE_OUT y), the spec's example kernel.
SCALE_SRC = """
CUBE_KERNEL(scale, CUBE_IN(float, x), CUBE_OUT(float, y), CUBE_SCALAR(float, a))
{
    uint32_t i = ABSOLUTE_POS_X;
    if (i < CUBE_LEN(y))
        CUBE_AT(y, i) = a * CUBE_AT(x, i);
}
"""

# c = a + b
ADD_SRC = """
CUBE_KERNEL(add, CUBE_IN(float, a), CUBE_IN(float, b), CUBE_OUT(float, c))
{
    uint32_t i = ABSOLUTE_POS_X;
    if (i < CUBE_LEN(c) && i < CUBE_LEN(a) && i < CUBE_LEN(b))
        CUBE_AT(c, i) = CUBE_AT(a, i) + CUBE_AT(b, i);
}
"""


def scale_kernel():
    return cubert.Kernel(SCALE_SRC, "scale", cube_dim=(256,))


def add_kernel():
    return cubert.Kernel(ADD_SRC, "add", cube_dim=(256,))


def cubes(n, dim=256):
    return (n + dim - 1) // dim


def aligned_empty(n, dtype, align=64):
    """A NumPy array of `n` elements whose data starts at a multiple of
    `align` bytes (cubert refuses foreign memory that is not 16-aligned)."""
    dtype = np.dtype(dtype)
    raw = np.zeros(n * dtype.itemsize + align, dtype=np.uint8)
    off = (-raw.__array_interface__["data"][0]) % align
    arr = raw[off:off + n * dtype.itemsize].view(dtype)
    assert arr.__array_interface__["data"][0] % align == 0
    assert arr.size == n
    return arr


_cuda_state = {}


def cuda_available():
    """True when a CUDA client opens here (checked once per process)."""
    if "ok" not in _cuda_state:
        try:
            c = cubert.Client("cuda")
        except (cubert.UnavailableError, cubert.NotFoundError):
            _cuda_state["ok"] = False
        else:
            c.close()
            _cuda_state["ok"] = True
    return _cuda_state["ok"]


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "cuda: needs a CUDA device (skipped without one)")


def pytest_collection_modifyitems(config, items):
    marked = [item for item in items if "cuda" in item.keywords]
    if not marked or cuda_available():
        return
    skip = pytest.mark.skip(reason="no CUDA device: cubert.Client('cuda') "
                                   "is unavailable")
    for item in marked:
        item.add_marker(skip)


def _opened(device):
    c = cubert.Client(device)
    try:
        yield c
    finally:
        c.close()
        gc.collect()


@pytest.fixture
def client():
    yield from _opened("cpu")


@pytest.fixture
def null_client():
    """A second client, of another device, for "of another client"."""
    yield from _opened("null")


def assert_usable(client):
    """After a refused call the client still copies both ways."""
    data = np.arange(16, dtype=np.float32)
    np.testing.assert_array_equal(client.asarray(data).numpy(), data)


@pytest.fixture
def cuda_client():
    if not cuda_available():
        pytest.skip("no CUDA device")
    c = cubert.Client("cuda")
    try:
        yield c
    finally:
        c.close()
        gc.collect()


@pytest.fixture(scope="session")
def scale():
    return scale_kernel()


@pytest.fixture(scope="session")
def add():
    return add_kernel()
