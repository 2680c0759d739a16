"""Kernels launched from Python: counts, scalar arguments, failures and
the launch modes."""

import numpy as np
import pytest

import cubert
from conftest import SCALE_SRC, cubes

# Writes each unit's 2-D absolute position into out[y * width + x].
POS2D_SRC = """
CUBE_KERNEL(pos2d, CUBE_OUT(uint32_t, out), CUBE_SCALAR(uint32_t, width))
{
    uint32_t x = ABSOLUTE_POS_X, y = ABSOLUTE_POS_Y;
    uint32_t i = y * width + x;
    if (x < width && i < CUBE_LEN(out))
        CUBE_AT(out, i) = (y << 16) | x;
}
"""

# Stores one scalar of each width, as raw bits, so the test can see the
# exact bytes the launch passed.
SCALARS_SRC = """
CUBE_KERNEL(scalars, CUBE_OUT(uint64_t, out),
            CUBE_SCALAR(uint8_t, a), CUBE_SCALAR(uint16_t, b),
            CUBE_SCALAR(uint32_t, c), CUBE_SCALAR(uint64_t, d))
{
    if (ABSOLUTE_POS_X == 0) {
        CUBE_AT(out, 0) = a;
        CUBE_AT(out, 1) = b;
        CUBE_AT(out, 2) = c;
        CUBE_AT(out, 3) = d;
    }
}
"""

# y = x * a + b with a double and a signed 32-bit integer.
AXPB_SRC = """
CUBE_KERNEL(axpb, CUBE_IN(double, x), CUBE_OUT(double, y),
            CUBE_SCALAR(double, a), CUBE_SCALAR(int32_t, b))
{
    uint32_t i = ABSOLUTE_POS_X;
    if (i < CUBE_LEN(y))
        CUBE_AT(y, i) = CUBE_AT(x, i) * a + (double)b;
}
"""

# Writes 1 to out[i] for every unit, ignoring out's length: in bounds
# checked mode the writes past the end are dropped.
FILL_ALL_SRC = """
CUBE_KERNEL(fill_all, CUBE_OUT(float, out))
{
    uint32_t i = ABSOLUTE_POS_X;
    CUBE_AT(out, i) = 1.0f;
}
"""

GATHER_SRC = """
CUBE_KERNEL(gather, CUBE_IN(float, x), CUBE_IN(int32_t, index),
            CUBE_OUT(float, y))
{
    uint32_t i = ABSOLUTE_POS_X;
    if (i < CUBE_LEN(y))
        CUBE_AT(y, i) = CUBE_AT(x, CUBE_AT(index, i));
}
"""

BROKEN_SRC = """
CUBE_KERNEL(broken, CUBE_OUT(float, y))
{
    CUBE_AT(y, 0) = this_is_not_declared + ;
}
"""


def test_kernel_attributes():
    k = cubert.Kernel(SCALE_SRC, "scale", cube_dim=(256,))
    assert k.name == "scale"
    assert isinstance(k.id, int) and k.id != 0
    same = cubert.Kernel(SCALE_SRC, "scale", cube_dim=(256, 1, 1))
    assert same.id == k.id
    other_dim = cubert.Kernel(SCALE_SRC, "scale", cube_dim=(128,))
    assert other_dim.id != k.id
    with pytest.raises(AttributeError):
        k.name = "other"
    with pytest.raises(AttributeError):
        k.id = 1
    default = cubert.Kernel(SCALE_SRC, "scale")
    assert default.name == "scale"


def test_kernel_bad_name_is_refused():
    with pytest.raises(cubert.InvalidArgumentError):
        cubert.Kernel(SCALE_SRC, "not an identifier")


def test_scale_several_cubes(client, scale):
    n = 1000  # not a multiple of the cube dimension
    x = np.arange(n, dtype=np.float32)
    bx = client.asarray(x)
    by = client.empty(n, "float32")
    assert client.launch(scale, cubes(n), bx, by, np.float32(2.5)) is None
    np.testing.assert_array_equal(by.numpy(), x * np.float32(2.5))
    # x is untouched
    np.testing.assert_array_equal(bx.numpy(), x)


def test_add_kernel(client, add):
    n = 3000
    a = np.random.default_rng(1).standard_normal(n).astype(np.float32)
    b = np.random.default_rng(2).standard_normal(n).astype(np.float32)
    ba, bb = client.asarray(a), client.asarray(b)
    bc = client.empty(n, "float32")
    client.launch(add, cubes(n), ba, bb, bc)
    np.testing.assert_array_equal(bc.numpy(), a + b)


def test_count_as_tuple(client):
    k = cubert.Kernel(POS2D_SRC, "pos2d", cube_dim=(4, 2))
    width, height = 8, 6  # 2 x 3 cubes of 4 x 2 units
    out = client.asarray(np.full(width * height, 0xFFFFFFFF, np.uint32))
    client.launch(k, (2, 3), out, np.uint32(width))
    ys, xs = np.mgrid[0:height, 0:width]
    expect = ((ys << 16) | xs).astype(np.uint32).ravel()
    np.testing.assert_array_equal(out.numpy(), expect)
    # (2, 3, 1) is the same count
    out.write(np.zeros(width * height, np.uint32))
    client.launch(k, (2, 3, 1), out, np.uint32(width))
    np.testing.assert_array_equal(out.numpy(), expect)
    # a 1-tuple runs only the first row of cubes
    out.write(np.full(width * height, 0xFFFFFFFF, np.uint32))
    client.launch(k, (1,), out, np.uint32(width))
    got = out.numpy().reshape(height, width)
    np.testing.assert_array_equal(got[:2, :4], expect.reshape(height,
                                                              width)[:2, :4])
    assert (got[2:, :] == 0xFFFFFFFF).all() and (got[:, 4:] == 0xFFFFFFFF).all()


def test_scalar_kinds(client, scale):
    n = 300
    x = np.linspace(-3, 3, n).astype(np.float32)
    bx = client.asarray(x)
    by = client.empty(n, "float32")
    # a Python float is a 32-bit float
    client.launch(scale, cubes(n), bx, by, 0.1)
    np.testing.assert_array_equal(by.numpy(), x * np.float32(0.1))
    # a NumPy float32 scalar, its exact bytes
    client.launch(scale, cubes(n), bx, by, np.float32(-1.75))
    np.testing.assert_array_equal(by.numpy(), x * np.float32(-1.75))
    # a Python int is a 32-bit signed integer: its bits reach the float
    # parameter unchanged (the signature only checks the size)
    client.launch(scale, cubes(n), bx, by, 0x3F800000)  # bits of 1.0f
    np.testing.assert_array_equal(by.numpy(), x)


def test_scalar_widths_pass_exact_bytes(client):
    k = cubert.Kernel(SCALARS_SRC, "scalars", cube_dim=(1,))
    out = client.asarray(np.zeros(4, np.uint64))
    client.launch(k, 1, out, np.uint8(0xAB), np.float16(1.5),
                  np.float32(-2.0), np.uint64(2**64 - 3))
    got = out.numpy()
    assert got[0] == 0xAB
    assert got[1] == int(np.float16(1.5).view(np.uint16))
    assert got[2] == int(np.float32(-2.0).view(np.uint32))
    assert got[3] == 2**64 - 3
    # Python int: 32-bit signed (-1 is 0xFFFFFFFF); an int8 for the byte
    client.launch(k, 1, out, np.int8(-1), np.int16(-2), -1,
                  np.int64(-5))
    got = out.numpy()
    assert got[0] == 0xFF
    assert got[1] == 0xFFFE
    assert got[2] == 0xFFFFFFFF
    assert got[3] == 2**64 - 5


class FourBytes:
    """Anything with tobytes() giving 1, 2, 4 or 8 bytes is a scalar."""

    def __init__(self, value):
        self.value = value

    def tobytes(self):
        return np.float32(self.value).tobytes()


def test_scalar_from_tobytes(client, scale):
    bx = client.asarray(np.arange(4, dtype=np.float32))
    by = client.empty(4, "float32")
    client.launch(scale, 1, bx, by, FourBytes(3.0))
    np.testing.assert_array_equal(by.numpy(), [0.0, 3.0, 6.0, 9.0])


def test_double_and_int_scalars(client):
    k = cubert.Kernel(AXPB_SRC, "axpb", cube_dim=(64,))
    n = 100
    x = np.arange(n, dtype=np.float64) / 3
    bx, by = client.asarray(x), client.empty(n, "float64")
    # x * a + b may be one fused multiply-add (-ffp-contract=fast): the
    # last bit may differ from NumPy's two roundings
    client.launch(k, cubes(n, 64), bx, by, np.float64(0.1), -7)
    np.testing.assert_allclose(by.numpy(), x * 0.1 + -7.0, rtol=1e-15,
                               atol=0)
    client.launch(k, cubes(n, 64), bx, by, np.float64(2.0), np.int32(2**31 - 1))
    np.testing.assert_allclose(by.numpy(), x * 2.0 + (2**31 - 1), rtol=1e-15,
                               atol=0)
    # a Python float is 4 bytes: it does not fit a double parameter
    with pytest.raises(cubert.InvalidArgumentError):
        client.launch(k, cubes(n, 64), bx, by, 0.1, 1)


def test_python_int_out_of_range(client):
    k = cubert.Kernel(AXPB_SRC, "axpb", cube_dim=(64,))
    bx = client.asarray(np.zeros(4, np.float64))
    by = client.asarray(np.full(4, 5.0, np.float64))
    with pytest.raises(OverflowError):
        client.launch(k, 1, bx, by, np.float64(1), 2**31)
    with pytest.raises(OverflowError):
        client.launch(k, 1, bx, by, np.float64(1), -2**31 - 1)
    # nothing was launched
    np.testing.assert_array_equal(by.numpy(), np.full(4, 5.0))
    client.launch(k, 1, bx, by, np.float64(1), -2**31)
    np.testing.assert_array_equal(by.numpy(), np.full(4, -2.0**31))


def test_dynamic_count(client, scale):
    n = 1024
    x = np.arange(n, dtype=np.float32)
    bx = client.asarray(x)
    by = client.asarray(np.full(n, -1.0, np.float32))
    count = client.asarray(np.array([4, 1, 1], np.uint32))
    client.launch(scale, count, bx, by, np.float32(3.0))
    np.testing.assert_array_equal(by.numpy(), x * 3)
    # two cubes: only the first 512 elements are written
    by.write(np.full(n, -1.0, np.float32))
    count.write(np.array([2, 1, 1], np.uint32))
    client.launch(scale, count, bx, by, np.float32(3.0))
    got = by.numpy()
    np.testing.assert_array_equal(got[:512], x[:512] * 3)
    np.testing.assert_array_equal(got[512:], np.full(512, -1.0, np.float32))


def test_zero_static_count_is_refused(client, scale):
    bx = client.asarray(np.ones(4, np.float32))
    by = client.asarray(np.zeros(4, np.float32))
    with pytest.raises(cubert.InvalidArgumentError):
        client.launch(scale, 0, bx, by, 1.0)
    with pytest.raises(cubert.InvalidArgumentError):
        client.launch(scale, (1, 0, 1), bx, by, 1.0)
    # nothing recorded: y is still readable
    np.testing.assert_array_equal(by.numpy(), np.zeros(4, np.float32))


def test_compile_error(client):
    k = cubert.Kernel(BROKEN_SRC, "broken", cube_dim=(1,))
    by = client.asarray(np.zeros(4, np.float32))
    with pytest.raises(cubert.CompileError) as info:
        client.launch(k, 1, by)
    e = info.value
    assert type(e) is cubert.CompileError
    assert isinstance(e, cubert.Error)
    assert e.code == 6
    assert isinstance(e.log, str) and e.log.strip()
    assert "this_is_not_declared" in e.log
    assert isinstance(e.message, str) and e.message
    # The compiler's own error line is in the message itself, not only in
    # the log: "f.cube.c:3:40: error: 'this_is_not_declared' undeclared".
    error_lines = [line for line in e.log.splitlines() if "error" in line]
    assert error_lines and error_lines[0].strip() in str(e)
    assert "this_is_not_declared" in str(e)
    # recorded on every bound buffer
    with pytest.raises(cubert.SeveralError) as info:
        by.numpy()
    assert any(isinstance(c, cubert.CompileError) for c in info.value.causes)


def test_compile_error_in_skip_mode_records_nothing(client):
    k = cubert.Kernel(BROKEN_SRC, "broken", cube_dim=(1,))
    by = client.asarray(np.full(4, 2.0, np.float32))
    with pytest.raises(cubert.CompileError) as info:
        client.launch(k, 1, by, skip=True)
    assert info.value.log
    np.testing.assert_array_equal(by.numpy(), np.full(4, 2.0, np.float32))


def test_argument_mismatch(client, scale):
    bx = client.asarray(np.ones(4, np.float32))
    by = client.asarray(np.zeros(4, np.float32))
    # too few
    with pytest.raises(cubert.InvalidArgumentError) as info:
        client.launch(scale, 1, bx, by)
    assert type(info.value) is cubert.InvalidArgumentError
    assert info.value.code == 1
    # too many
    with pytest.raises(cubert.InvalidArgumentError):
        client.launch(scale, 1, bx, by, 1.0, 1.0)
    # a scalar where a buffer goes
    with pytest.raises(cubert.InvalidArgumentError):
        client.launch(scale, 1, 1.0, by, 1.0)
    # a buffer where a scalar goes
    with pytest.raises(cubert.InvalidArgumentError):
        client.launch(scale, 1, bx, by, bx)
    # a scalar of the wrong size
    with pytest.raises(cubert.InvalidArgumentError):
        client.launch(scale, 1, bx, by, np.float64(1.0))
    # the input never carries the failure
    np.testing.assert_array_equal(bx.numpy(), np.ones(4, np.float32))


def test_wrong_python_types_are_type_errors(client, scale):
    bx = client.asarray(np.ones(4, np.float32))
    by = client.empty(4, "float32")
    with pytest.raises(TypeError):
        client.launch("not a kernel", 1, bx, by, 1.0)
    with pytest.raises(TypeError):
        client.launch(scale, "four", bx, by, 1.0)
    with pytest.raises(TypeError):
        client.launch(scale, 1, bx, by, "two")
    with pytest.raises(TypeError):
        client.launch(scale, 1, bx, by, None)


def test_failed_launch_is_recorded_on_outputs(client, scale):
    n = 16
    bx = client.asarray(np.arange(n, dtype=np.float32))
    by = client.asarray(np.zeros(n, np.float32))
    with pytest.raises(cubert.InvalidArgumentError):
        client.launch(scale, 1, bx, by, np.float64(2.0))
    with pytest.raises(cubert.SeveralError) as info:
        by.numpy()
    e = info.value
    assert type(e) is cubert.SeveralError
    assert e.code == 11
    assert isinstance(e.causes, list) and len(e.causes) >= 1
    assert all(isinstance(c, cubert.Error) for c in e.causes)
    assert isinstance(e.causes[0], cubert.InvalidArgumentError)
    # read(out) refuses too, leaving out untouched
    out = np.full(n, 9.0, np.float32)
    with pytest.raises(cubert.SeveralError):
        by.read(out)
    np.testing.assert_array_equal(out, np.full(n, 9.0, np.float32))
    with pytest.raises(cubert.SeveralError):
        client.check(by)
    with pytest.raises(cubert.SeveralError):
        client.sync(by)
    # the input is fine
    client.check(bx)
    np.testing.assert_array_equal(bx.numpy(), np.arange(n, dtype=np.float32))
    # a launch using the failed buffer as input fails too
    bz = client.empty(n, "float32")
    with pytest.raises(cubert.SeveralError):
        client.launch(scale, 1, by, bz, 1.0)
    with pytest.raises(cubert.SeveralError):
        bz.numpy()
    # a full write clears the failure
    by.write(np.ones(n, np.float32))
    np.testing.assert_array_equal(by.numpy(), np.ones(n, np.float32))
    # and a successful launch that writes bz clears it
    client.launch(scale, 1, by, bz, 4.0)
    np.testing.assert_array_equal(bz.numpy(), np.full(n, 4.0, np.float32))


def test_checked_launch_drops_writes_past_the_end(client):
    k = cubert.Kernel(FILL_ALL_SRC, "fill_all", cube_dim=(64,))
    parent = client.asarray(np.full(128, -1.0, np.float32))
    first_half = parent.slice(0, 64 * 4)
    # 128 units write out[0..127]; checked, only out[0..63] exist
    client.launch(k, 2, first_half, checked=True)
    got = parent.numpy()
    np.testing.assert_array_equal(got[:64], np.ones(64, np.float32))
    np.testing.assert_array_equal(got[64:], np.full(64, -1.0, np.float32))


def test_checked_launch_reads_zero_past_the_end(client):
    k = cubert.Kernel(GATHER_SRC, "gather", cube_dim=(8,))
    x = client.asarray(np.array([10, 20, 30, 40], np.float32))
    index = client.asarray(np.array([0, 3, 4, -1, 1000000, 2, 1, 0],
                                    np.int32))
    y = client.asarray(np.full(8, 7.0, np.float32))
    client.launch(k, 1, x, index, y, checked=True)
    np.testing.assert_array_equal(y.numpy(),
                                  [10, 40, 0, 0, 0, 30, 20, 10])


def test_validate_launch_reports_the_first_read_past_the_end(client):
    k = cubert.Kernel(GATHER_SRC, "gather", cube_dim=(8,))
    x = client.asarray(np.array([10, 20, 30, 40], np.float32))
    index = client.asarray(np.array([0, 3, 2, 1, 0, 9, 1, 0], np.int32))
    y = client.asarray(np.full(8, 7.0, np.float32))
    with pytest.raises(cubert.InvalidArgumentError,
                       match=r"gather.*'x' indexed at 9, its length is 4"):
        client.launch(k, 1, x, index, y, validate=True)
    # y is the kernel's output: it carries the failure
    with pytest.raises(cubert.Error):
        y.numpy()
    index.write(np.arange(8, dtype=np.int32) % 4)
    client.launch(k, 1, x, index, y, validate=True)
    np.testing.assert_array_equal(y.numpy(), [10, 20, 30, 40] * 2)


def test_skip_leaves_buffers_untouched(client, scale):
    n = 512
    bx = client.asarray(np.arange(n, dtype=np.float32))
    start = np.full(n, 5.0, np.float32)
    by = client.asarray(start)
    client.launch(scale, cubes(n), bx, by, 2.0, skip=True)
    np.testing.assert_array_equal(by.numpy(), start)
    client.launch(scale, cubes(n), bx, by, 2.0, skip=True, checked=True)
    np.testing.assert_array_equal(by.numpy(), start)
    # a skipped launch that fails records nothing either
    with pytest.raises(cubert.InvalidArgumentError):
        client.launch(scale, cubes(n), bx, by, skip=True)
    np.testing.assert_array_equal(by.numpy(), start)
    # then a real launch runs
    client.launch(scale, cubes(n), bx, by, 2.0)
    np.testing.assert_array_equal(by.numpy(),
                                  np.arange(n, dtype=np.float32) * 2)


def test_misaligned_slice_is_refused(client, scale):
    bx = client.asarray(np.ones(17, np.float32))
    by = client.asarray(np.zeros(17, np.float32))
    with pytest.raises(cubert.InvalidArgumentError):
        client.launch(scale, 1, bx.slice(4, 64), by.slice(1, 64), 1.0)


def test_kernel_on_two_clients(scale):
    with cubert.Client("cpu") as c1, cubert.Client("cpu") as c2:
        for i, c in enumerate((c1, c2)):
            bx = c.asarray(np.arange(8, dtype=np.float32))
            by = c.empty(8, "float32")
            c.launch(scale, 1, bx, by, float(i + 2))
            np.testing.assert_array_equal(by.numpy(),
                                          np.arange(8) * (i + 2.0))


def test_null_backend_launch_is_unsupported(scale):
    with cubert.Client("null") as c:
        assert c.backend == "null"
        bx = c.asarray(np.ones(4, np.float32))
        by = c.empty(4, "float32")
        with pytest.raises(cubert.UnsupportedError):
            c.launch(scale, 1, bx, by, 1.0)
        # memory and copies work as usual
        other = c.asarray(np.arange(4, dtype=np.float32))
        np.testing.assert_array_equal(other.numpy(), np.arange(4))
