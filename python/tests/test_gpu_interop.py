"""CUDA interop with PyTorch and CuPy: tensors shared both ways with no
copy (addresses compared), __cuda_array_interface__ wrapping, and stream
ordering between cubert's work and work on a foreign stream.

Skipped without a CUDA device (conftest's `cuda` marker) and, test by test,
without torch or cupy."""

import numpy as np
import pytest

import cubert
from conftest import SCALE_SRC, cubes

pytestmark = pytest.mark.cuda

DL_CUDA = 2


@pytest.fixture
def torch():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA device")
    return torch


@pytest.fixture
def cupy():
    cupy = pytest.importorskip("cupy")
    try:
        if cupy.cuda.runtime.getDeviceCount() < 1:
            pytest.skip("cupy sees no CUDA device")
    except cupy.cuda.runtime.CUDARuntimeError:
        pytest.skip("cupy sees no CUDA device")
    return cupy


@pytest.fixture(scope="module")
def kscale():
    return cubert.Kernel(SCALE_SRC, "scale", cube_dim=(256,))


# y = a * x, after each unit spins `n` steps (kept alive through `junk`): a
# launch that is still running when the host issues the consumer's work, so
# a missing stream wait reads stale bytes.
SLOW_SCALE_SRC = """
CUBE_KERNEL(slow_scale, CUBE_IN(float, x), CUBE_OUT(float, y),
            CUBE_OUT(uint32_t, junk), CUBE_SCALAR(float, a),
            CUBE_SCALAR(uint32_t, n))
{
    uint32_t i = ABSOLUTE_POS_X;
    uint32_t v = i + 1u;
    for (uint32_t k = 0; k < n; k++)
        v = v * 1664525u + 1013904223u;
    if (i < CUBE_LEN(junk))
        CUBE_AT(junk, i) = v;
    if (i < CUBE_LEN(y))
        CUBE_AT(y, i) = a * CUBE_AT(x, i);
}
"""
SPIN = 20000


@pytest.fixture(scope="module")
def kslow():
    return cubert.Kernel(SLOW_SCALE_SRC, "slow_scale", cube_dim=(256,))


def expect_scaled(n, a):
    return np.arange(n, dtype=np.float32) * np.float32(a)


def test_cuda_client_basics(cuda_client):
    assert cuda_client.backend == "cuda"
    assert cuda_client.device.startswith("cuda:")
    assert cuda_client.native_stream() != 0
    buf = cuda_client.empty(16, "float32")
    addr, size, host = buf.native
    assert addr != 0 and size == 64
    assert buf.__dlpack_device__() == (DL_CUDA, int(cuda_client.device[5:]))
    with pytest.raises(BufferError):
        buf.__dlpack__(dl_device=(1, 0))


def test_torch_tensor_into_a_cubert_kernel(cuda_client, torch, kslow,
                                           kscale):
    n = 1 << 20
    x = torch.arange(n, dtype=torch.float32, device="cuda")
    y = torch.full((n,), -1.0, dtype=torch.float32, device="cuda")
    bx = cuda_client.from_dlpack(x)
    by = cuda_client.from_dlpack(y)
    assert bx.native[0] == x.data_ptr()
    assert by.native[0] == y.data_ptr()
    assert by.shape == (n,) and by.dtype == "float32"
    junk = cuda_client.empty(n, "uint32")
    cuda_client.launch(kslow, cubes(n), bx, by, junk, 2.0, np.uint32(SPIN))
    # torch reads on a stream of its own, ordered after cubert's stream by
    # an event (no host wait)
    cubert_stream = torch.cuda.ExternalStream(cuda_client.native_stream())
    done = torch.cuda.Event()
    done.record(cubert_stream)
    s = torch.cuda.Stream()
    s.wait_event(done)
    with torch.cuda.stream(s):
        z = y * 1.0
    s.synchronize()
    np.testing.assert_array_equal(z.cpu().numpy(), expect_scaled(n, 2))
    # cubert reads what torch wrote on its stream: from_dlpack asks for
    # the legacy stream and cubert's stream waits for that one
    torch.cuda._sleep(50_000_000)
    x2 = torch.arange(n, dtype=torch.float32, device="cuda") * 3.0
    bx2 = cuda_client.from_dlpack(x2)
    cuda_client.launch(kscale, cubes(n), bx2, by, 1.0)
    np.testing.assert_array_equal(by.numpy(), expect_scaled(n, 3))


def test_cubert_buffer_to_torch(cuda_client, torch):
    n = 4096
    buf = cuda_client.asarray(np.arange(n, dtype=np.float32))
    t = torch.from_dlpack(buf)
    assert t.device.type == "cuda"
    assert t.data_ptr() == buf.native[0]
    assert t.dtype == torch.float32 and tuple(t.shape) == (n,)
    np.testing.assert_array_equal(t.cpu().numpy(), np.arange(n))
    # the same memory: a torch write shows in cubert after mark_written
    t.fill_(5.0)
    torch.cuda.synchronize()
    buf.mark_written()
    np.testing.assert_array_equal(buf.numpy(), np.full(n, 5.0, np.float32))


def test_cubert_buffer_to_cupy(cuda_client, cupy):
    n = 4096
    buf = cuda_client.asarray(np.arange(n, dtype=np.float32).reshape(64, 64))
    a = cupy.from_dlpack(buf)
    assert a.data.ptr == buf.native[0]
    assert a.shape == (64, 64) and a.dtype == np.float32
    np.testing.assert_array_equal(cupy.asnumpy(a),
                                  np.arange(n).reshape(64, 64))


def test_wrap_torch_tensor(cuda_client, torch, kscale):
    n = 10000
    t = torch.zeros(n, dtype=torch.float32, device="cuda")
    torch.cuda.synchronize()
    assert hasattr(t, "__cuda_array_interface__")
    y = cuda_client.wrap(t)
    assert y.native[0] == t.data_ptr()
    assert y.shape == (n,) and y.dtype == "float32"
    x = cuda_client.asarray(np.arange(n, dtype=np.float32))
    cuda_client.launch(kscale, cubes(n), x, y, 4.0)
    cuda_client.sync(y)
    np.testing.assert_array_equal(t.cpu().numpy(), expect_scaled(n, 4))


def test_wrap_cupy_array(cuda_client, cupy, kscale):
    n = 5000
    a = cupy.zeros(n, dtype=cupy.float32)
    cupy.cuda.runtime.deviceSynchronize()
    y = cuda_client.wrap(a)
    assert y.native[0] == a.data.ptr
    x = cuda_client.asarray(np.arange(n, dtype=np.float32))
    cuda_client.launch(kscale, cubes(n), x, y, -1.5)
    cuda_client.sync(y)
    np.testing.assert_array_equal(cupy.asnumpy(a), expect_scaled(n, -1.5))


def test_wrap_host_array_on_cuda_is_refused(cuda_client):
    arr = np.zeros(64, np.float32)
    with pytest.raises((cubert.InvalidArgumentError, TypeError)):
        cuda_client.wrap(arr)


def test_cubert_writes_while_torch_reads_on_another_stream(
        cuda_client, torch, kslow):
    n = 1 << 22
    x = cuda_client.asarray(np.arange(n, dtype=np.float32))
    junk = cuda_client.empty(n, "uint32")
    for rep in range(3):
        y = cuda_client.asarray(np.zeros(n, np.float32))
        a = float(rep + 2)
        # still running when torch's work is issued
        cuda_client.launch(kslow, cubes(n), x, y, junk, a, np.uint32(SPIN))
        s = torch.cuda.Stream()
        with torch.cuda.stream(s):
            # torch passes s as the consumer stream: s waits for the launch
            t = torch.from_dlpack(y)
            assert t.data_ptr() == y.native[0]
            r = t * 2.0
        s.synchronize()
        np.testing.assert_array_equal(r.cpu().numpy(),
                                      expect_scaled(n, a) * 2)


def test_explicit_dlpack_stream_orders_the_consumer(cuda_client, torch,
                                                    kslow):
    n = 1 << 22
    x = cuda_client.asarray(np.arange(n, dtype=np.float32))
    y = cuda_client.asarray(np.zeros(n, np.float32))
    junk = cuda_client.empty(n, "uint32")
    cuda_client.launch(kslow, cubes(n), x, y, junk, 0.5, np.uint32(SPIN))
    s = torch.cuda.Stream()
    # a legacy capsule, which every torch takes; s waits for the launch
    cap = y.__dlpack__(stream=s.cuda_stream)
    with torch.cuda.stream(s):
        t = torch.utils.dlpack.from_dlpack(cap)
        r = t + 1.0
    s.synchronize()
    np.testing.assert_array_equal(r.cpu().numpy(), expect_scaled(n, 0.5) + 1)
    # the legacy default stream (1), the per-thread one (2) and no
    # synchronisation (-1)
    y.__dlpack__(stream=1)
    y.__dlpack__(stream=2)
    cuda_client.sync(y)
    y.__dlpack__(stream=-1)


def test_from_dlpack_orders_after_a_producer_on_a_side_stream(
        cuda_client, torch, cupy, kscale):
    """Producers working on a stream of their own (not the legacy one):
    the handshake goes through the legacy stream and still orders the
    slow write before cubert's kernel, for torch and for CuPy."""
    n = 1 << 20
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        torch.cuda._sleep(50_000_000)
        x = torch.arange(n, dtype=torch.float32, device="cuda") * 5.0
        bx = cuda_client.from_dlpack(x)
    by = cuda_client.empty(n, "float32")
    cuda_client.launch(kscale, cubes(n), bx, by, 1.0)
    np.testing.assert_array_equal(by.numpy(), expect_scaled(n, 5))
    s.synchronize()

    cs = cupy.cuda.Stream(non_blocking=True)
    with cs:
        c = cupy.arange(n, dtype=cupy.float32)
        for _ in range(200):
            c = c * 1.0
        c = c * 7.0
        bc = cuda_client.from_dlpack(c)
    cuda_client.launch(kscale, cubes(n), bc, by, 1.0)
    np.testing.assert_array_equal(by.numpy(), expect_scaled(n, 7))
    cs.synchronize()


def test_native_wait_orders_after_a_torch_stream(cuda_client, torch,
                                                 kscale):
    """Foreign work written to memory cubert wrapped, made known with
    native_wait (device-side) and native_written."""
    n = 1 << 20
    t = torch.zeros(n, dtype=torch.float32, device="cuda")
    bt = cuda_client.wrap(t)
    by = cuda_client.empty(n, "float32")
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        torch.cuda._sleep(50_000_000)
        t.copy_(torch.arange(n, dtype=torch.float32, device="cuda") * 9.0)
    cuda_client.native_wait(s.cuda_stream)
    bt.mark_written()
    cuda_client.launch(kscale, cubes(n), bt, by, 1.0)
    np.testing.assert_array_equal(by.numpy(), expect_scaled(n, 9))
    with pytest.raises(OverflowError):
        cuda_client.native_wait(-1)
    bt.release()


def test_unordered_read_would_see_stale_bytes(cuda_client, torch, kslow):
    """The control for the tests above: with stream=-1 (no wait) and no
    other ordering, torch's read races the slow launch and sees zeros."""
    n = 1 << 22
    x = cuda_client.asarray(np.ones(n, np.float32))
    y = cuda_client.asarray(np.zeros(n, np.float32))
    junk = cuda_client.empty(n, "uint32")
    cuda_client.launch(kslow, cubes(n), x, y, junk, 1.0, np.uint32(SPIN * 10))
    s = torch.cuda.Stream()
    cap = y.__dlpack__(stream=-1)
    with torch.cuda.stream(s):
        r = torch.utils.dlpack.from_dlpack(cap).clone()
    s.synchronize()
    cuda_client.sync(y)
    if r.sum().item() == n:
        pytest.skip("the slow launch finished before torch read: the "
                    "ordering tests above could not have caught a race")
    assert r.sum().item() < n


def test_failed_buffer_export_to_torch_is_refused(cuda_client, torch,
                                                  kscale):
    x = cuda_client.asarray(np.ones(16, np.float32))
    y = cuda_client.asarray(np.zeros(16, np.float32))
    with pytest.raises(cubert.InvalidArgumentError):
        cuda_client.launch(kscale, 1, x, y, np.float64(1))
    with pytest.raises(cubert.SeveralError):
        torch.from_dlpack(y)


def test_torch_tensor_via_module_from_dlpack(cuda_client, torch):
    t = torch.arange(256, dtype=torch.int32, device="cuda")
    b = cubert.from_dlpack(t)
    assert b.client.backend == "cuda"
    assert b.native[0] == t.data_ptr()
    np.testing.assert_array_equal(b.numpy(), np.arange(256, dtype=np.int32))
    b.release()


# --- streams and events on CUDA ------------------------------------------------


def test_cuda_streams_have_native_queues(cuda_client):
    own = cuda_client.stream()
    assert own.native == cuda_client.native_stream() != 0
    named = cuda_client.stream(3)
    assert named.native not in (0, own.native)
    with named:
        assert cuda_client.native_stream() == named.native
    assert cuda_client.native_stream() == own.native
    named.synchronize()


def test_cuda_event_waits_and_times_a_slow_launch(cuda_client, kslow):
    n = 1 << 22
    x = cuda_client.asarray(np.arange(n, dtype=np.float32))
    y = cuda_client.empty(n, "float32")
    junk = cuda_client.empty(n, "uint32")
    start, end = cuda_client.event(), cuda_client.event()
    start.record()
    cuda_client.launch(kslow, cubes(n), x, y, junk, 2.0, np.uint32(SPIN))
    end.record()
    end.synchronize()
    assert end.query() and start.query()
    assert start.elapsed_time(end) > 0.0
    np.testing.assert_array_equal(y.numpy(), expect_scaled(n, 2))
    untimed = cuda_client.event(timing=False)
    untimed.record()
    untimed.synchronize()
    with pytest.raises(cubert.InvalidArgumentError, match="timing=False"):
        start.elapsed_time(untimed)


def test_cuda_event_orders_another_cubert_stream(cuda_client, kslow, kscale):
    n = 1 << 22
    x = cuda_client.asarray(np.arange(n, dtype=np.float32))
    y = cuda_client.asarray(np.zeros(n, np.float32))
    z = cuda_client.empty(n, "float32")
    junk = cuda_client.empty(n, "uint32")
    cuda_client.launch(kslow, cubes(n), x, y, junk, 3.0, np.uint32(SPIN))
    done = cuda_client.stream().record_event()
    with cuda_client.stream(4) as side:
        side.wait_event(done)
        cuda_client.launch(kscale, cubes(n), y, z, 1.0)
    side.synchronize()
    np.testing.assert_array_equal(z.numpy(), expect_scaled(n, 3))


def test_cuda_event_orders_torch_after_cubert(cuda_client, torch, kslow):
    n = 1 << 22
    t = torch.zeros(n, dtype=torch.float32, device="cuda")
    torch.cuda.synchronize()
    y = cuda_client.wrap(t)
    x = cuda_client.asarray(np.arange(n, dtype=np.float32))
    junk = cuda_client.empty(n, "uint32")
    cuda_client.launch(kslow, cubes(n), x, y, junk, 5.0, np.uint32(SPIN))
    done = cuda_client.event()
    done.record()
    s = torch.cuda.Stream()
    done.wait(s)  # a torch stream object: its cuda_stream
    with torch.cuda.stream(s):
        r = t * 1.0
    s.synchronize()
    np.testing.assert_array_equal(r.cpu().numpy(), expect_scaled(n, 5))
    y.release()


def test_cuda_event_orders_cubert_after_torch(cuda_client, torch, kscale):
    n = 1 << 20
    t = torch.zeros(n, dtype=torch.float32, device="cuda")
    bt = cuda_client.wrap(t)
    by = cuda_client.empty(n, "float32")
    s = torch.cuda.Stream()
    written = cuda_client.event()
    with torch.cuda.stream(s):
        torch.cuda._sleep(50_000_000)
        t.copy_(torch.arange(n, dtype=torch.float32, device="cuda") * 6.0)
    written.record(s)
    written.wait()
    bt.mark_written()
    cuda_client.launch(kscale, cubes(n), bt, by, 1.0)
    np.testing.assert_array_equal(by.numpy(), expect_scaled(n, 6))
    # torch's own event across: recorded on cubert's stream by its int
    ev = torch.cuda.Event()
    ev.record(torch.cuda.ExternalStream(cuda_client.stream().native))
    ev.synchronize()
    bt.release()


def test_cuda_event_with_cupy_streams(cuda_client, cupy, kscale):
    n = 1 << 20
    a = cupy.zeros(n, dtype=cupy.float32)
    cupy.cuda.runtime.deviceSynchronize()
    ba = cuda_client.wrap(a)
    by = cuda_client.empty(n, "float32")
    cs = cupy.cuda.Stream(non_blocking=True)
    with cs:
        c = cupy.arange(n, dtype=cupy.float32)
        for _ in range(200):
            c = c * 1.0
        a[...] = c * 8.0
    ev = cuda_client.event()
    ev.record(cs)  # a CuPy stream: its ptr
    ev.wait()
    ba.mark_written()
    cuda_client.launch(kscale, cubes(n), ba, by, 1.0)
    np.testing.assert_array_equal(by.numpy(), expect_scaled(n, 8))
    back = cuda_client.event()
    back.record()
    back.wait(cs.ptr)
    cs.synchronize()
    ba.release()


def test_cuda_event_bad_input_leaves_the_client_usable(cuda_client, kscale):
    cpu = cubert.Client("cpu")
    try:
        e = cuda_client.event()
        with pytest.raises(cubert.InvalidArgumentError, match="another"):
            e.record(cpu.stream())
        with pytest.raises(cubert.InvalidArgumentError, match="another"):
            e.elapsed_time(cpu.event())
        with pytest.raises(OverflowError):
            e.wait(-2)
        with pytest.raises(TypeError):
            e.record("stream")
    finally:
        cpu.close()
    buf = cuda_client.asarray(np.arange(16, dtype=np.float32))
    with pytest.raises(OverflowError):
        buf.__dlpack__(stream=-5)
    with pytest.raises(OverflowError):
        buf.__dlpack__(stream=2**64)
    with pytest.raises(TypeError):
        buf.__dlpack__(stream="1")
    # refused inside a capture, as a profile is
    x = cuda_client.asarray(np.arange(64, dtype=np.float32))
    y = cuda_client.empty(64, "float32")
    cuda_client.graph_prepare()
    cuda_client.launch(kscale, 1, x, y, 2.0)
    cuda_client.sync(y)
    with cuda_client.capture() as g:
        cuda_client.launch(kscale, 1, x, y, 2.0)
        with pytest.raises(cubert.GraphStateError):
            e.record()
        with pytest.raises(cubert.GraphStateError):
            e.wait()
    g.replay()
    e.record()
    e.synchronize()
    np.testing.assert_array_equal(y.numpy(), np.arange(64) * 2.0)
    np.testing.assert_array_equal(buf.numpy(), np.arange(16))


def test_cuda_events_outlive_their_client_safely():
    if not cubert.devices("cuda"):
        pytest.skip("no CUDA device")
    c = cubert.Client("cuda")
    e = c.event()
    e.record()
    c.close()  # frees the native event first
    with pytest.raises(cubert.InvalidArgumentError, match="closed"):
        e.synchronize()
    del e
