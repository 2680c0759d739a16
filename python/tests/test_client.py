"""Clients: opening, properties, memory statistics, profiling, graphs, dry
runs, streams, barriers, errors and threads."""

import builtins
import json
import os
import subprocess
import sys
import threading

import numpy as np
import pytest

import cubert
from conftest import SCALE_SRC, cubes

ERROR_CLASSES = [
    ("InvalidArgumentError", 1), ("NotFoundError", 2),
    ("OutOfMemoryError", 3), ("BufferTooBigError", 4),
    ("PoolCapacityExceededError", 5), ("CompileError", 6),
    ("ResourceLimitError", 7), ("UnsupportedError", 8),
    ("GraphStateError", 9), ("DeviceFaultError", 10), ("SeveralError", 11),
    ("IoError", 12), ("UnavailableError", 13), ("InternalError", 14),
    ("StorageMappingFailedError", 15), ("ProfileError", 16),
    ("PoolsInUseError", 17), ("StreamUnavailableError", 18),
    ("TimeoutError", 19), ("AbortedError", 20),
]

CODE_NAMES = {
    1: "CUBE_ERR_INVALID_ARGUMENT", 2: "CUBE_ERR_NOT_FOUND",
    6: "CUBE_ERR_COMPILE", 11: "CUBE_ERR_SEVERAL",
}

FEATURES = {"atomic_f32_add", "f64", "shared_memory", "cube_sync",
            "bounds_check", "dynamic_count", "graphs", "pinned_staging",
            "kernels", "host_memory", "collectives"}


# --- opening -----------------------------------------------------------------


def test_device_and_backend(client):
    assert client.device == "cpu:0"
    assert client.backend == "cpu"


def test_open_variants(monkeypatch):
    with cubert.Client("cpu:0") as c:
        assert c.device == "cpu:0" and c.backend == "cpu"
    monkeypatch.delenv("CUBERT_DEVICE", raising=False)
    with cubert.Client() as c:
        assert c.backend == "cpu"
    with cubert.Client(None) as c:
        assert c.backend == "cpu"
    with cubert.Client("null") as c:
        assert c.backend == "null"
        assert c.device == "null:0"


def test_cubert_device_variable():
    # cubert reads its environment once per process: ask a fresh one
    code = ("import cubert; c = cubert.Client(); "
            "print(c.backend, c.device); c.close()")
    env = dict(os.environ, CUBERT_DEVICE="null")
    out = subprocess.run([sys.executable, "-c", code], env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["null", "null:0"]


def test_bad_device_strings():
    with pytest.raises(cubert.NotFoundError) as info:
        cubert.Client("nosuchbackend")
    assert type(info.value) is cubert.NotFoundError
    with pytest.raises(cubert.NotFoundError):
        cubert.Client("cpu:7")  # one CPU device without $CUBERT_CPU_DEVICES
    for bad in ("cpu:x", "cpu:", "cpu:-1", "cpu:0:0", ""):
        with pytest.raises(cubert.InvalidArgumentError):
            cubert.Client(bad)


def test_bad_open_arguments():
    with pytest.raises(TypeError):
        cubert.Client(5)
    with pytest.raises(cubert.InvalidArgumentError):
        cubert.Client("cpu", cpu_threads=5000)
    with pytest.raises(TypeError):
        cubert.Client("cpu", 4)  # cpu_threads is keyword-only


def test_close_twice_and_repr():
    c = cubert.Client("cpu")
    assert "cpu" in repr(c)
    c.close()
    c.close()
    with pytest.raises(cubert.InvalidArgumentError):
        c.properties
    with pytest.raises(cubert.InvalidArgumentError):
        c.launch(cubert.Kernel(SCALE_SRC, "scale"), 1)


# --- properties and memory ---------------------------------------------------


def test_properties(client):
    p = client.properties
    assert isinstance(p, dict)
    assert p["backend"] == "cpu"
    assert isinstance(p["name"], str) and p["name"]
    assert isinstance(p["architecture"], str) and p["architecture"]
    assert tuple(p["max_cube_dim"]) == (1024, 1024, 64)
    assert p["max_units_per_cube"] == 1024
    assert len(tuple(p["max_cube_count"])) == 3
    assert p["max_shared_memory"] == 64 * 1024
    assert p["memory_total"] > 0
    align = p["memory_alignment"]
    assert align >= 16 and align & (align - 1) == 0
    assert p["max_buffer_size"] > 0
    assert p["compute_units"] >= 1
    assert isinstance(p["features"], (set, frozenset))
    assert p["features"] <= FEATURES
    assert {"kernels", "graphs", "bounds_check", "dynamic_count",
            "shared_memory", "cube_sync", "f64"} <= p["features"]
    # a fresh dict each time: changing it changes nothing
    p["backend"] = "changed"
    assert client.properties["backend"] == "cpu"


def test_null_properties():
    with cubert.Client("null") as c:
        assert "kernels" not in c.properties["features"]


def test_memory_usage(client):
    u = client.memory_usage()
    assert isinstance(u, dict)
    for key in ("buffers", "bytes_in_use", "bytes_padding", "bytes_reserved",
                "foreign_buffers", "foreign_bytes"):
        assert isinstance(u[key], int) and u[key] >= 0, key
    size = 3 << 20
    buf = client.empty(size)
    v = client.memory_usage()
    assert v["buffers"] == u["buffers"] + 1
    assert v["bytes_in_use"] >= u["bytes_in_use"] + size
    assert v["bytes_reserved"] >= v["bytes_in_use"]
    buf.release()
    w = client.memory_usage()
    assert w["buffers"] == u["buffers"]
    assert w["bytes_in_use"] == u["bytes_in_use"]


def test_memory_stats(client):
    before = client.memory_stats()
    assert set(before) >= {"allocations", "releases", "pool_hits",
                           "pool_misses", "oom_events", "oom_retries",
                           "reserved_bytes_peak", "free_bytes"}
    buf = client.empty(1 << 16)
    live = client.memory_stats()
    buf.release()
    client.sync()
    after = client.memory_stats()
    assert live["allocations"] == before["allocations"] + 1
    assert live["allocated_bytes"] == before["allocated_bytes"] + (1 << 16)
    assert after["releases"] == before["releases"] + 1
    assert after["pool_hits"] + after["pool_misses"] == after["allocations"]
    everything = client.memory_stats(device=True)
    assert everything["streams"] >= 1
    assert everything["allocations"] >= after["allocations"]


def test_memory_snapshot(client):
    before = client.memory_snapshot()
    buf = client.empty(3000)
    buf.label = "activations"
    part = buf.slice(0, 100)
    listed = [b for b in client.memory_snapshot() if b["label"] == "activations"]
    assert len(listed) == 1  # a slice is not listed again
    info = listed[0]
    assert info["size"] == 3000
    assert info["stream"] == client.stream().id
    assert info["kind"] in ("sliced", "exclusive", "persistent", "expandable")
    assert isinstance(info["pool"], int)
    assert info["foreign"] is False and info["deferred"] is False
    assert len(client.memory_snapshot(device=True)) >= len(before) + 1
    buf.release()
    part.release()
    assert not [b for b in client.memory_snapshot()
                if b["label"] == "activations"]


def test_memory_report(client):
    buf = client.empty(1 << 20)
    table = client.memory_report()
    assert isinstance(table, str) and "pool" in table
    assert client.memory_report("table") == table
    report = json.loads(client.memory_report("json"))
    assert set(report) >= {"usage", "pools"}
    assert report["usage"]["buffers"] == client.memory_usage()["buffers"]
    assert report["usage"]["bytes_in_use"] >= 1 << 20
    assert isinstance(report["pools"], list) and report["pools"]
    json.loads(client.memory_report(format="json"))
    with pytest.raises(ValueError):
        client.memory_report("xml")
    buf.release()


def test_memory_cleanup(client):
    bufs = [client.empty(1 << 20) for _ in range(4)]
    for b in bufs:
        b.release()
    before = client.memory_usage()
    assert client.memory_cleanup() is None
    after = client.memory_usage()
    assert after["bytes_reserved"] <= before["bytes_reserved"]
    assert after["buffers"] == before["buffers"]


def test_reset_peaks(client):
    def peaks():
        pools = json.loads(client.memory_report("json"))["pools"]
        return max(p["bytes_in_use_peak"] for p in pools)

    big = client.empty(6 << 20)
    big.release()
    assert peaks() >= 6 << 20
    assert client.reset_peaks() is None
    pools = json.loads(client.memory_report("json"))["pools"]
    for p in pools:
        assert p["bytes_in_use_peak"] == p["bytes_in_use"]
        assert p["buffers_peak"] == p["buffers"]


# --- profiling, graphs, dry runs ---------------------------------------------


def test_profile(client, scale):
    n = 4096
    x = client.asarray(np.ones(n, np.float32))
    y = client.empty(n, "float32")
    with client.profile() as prof:
        client.launch(scale, cubes(n), x, y, 2.0)
        client.launch(scale, cubes(n), y, x, 3.0)
        client.launch(scale, cubes(n), x, y, 0.5, skip=True)
    assert isinstance(prof.seconds, float)
    assert prof.seconds >= 0
    assert prof.method == "host_clock"
    assert prof.launches in (2, 3)  # the skipped launch may count or not
    np.testing.assert_array_equal(x.numpy(), np.full(n, 6.0, np.float32))
    with client.profile() as empty:
        pass
    assert empty.launches == 0
    assert empty.seconds == 0.0  # no work issued: the host clock says 0


def test_profile_exception_abandons_the_window(client, scale):
    x = client.asarray(np.ones(8, np.float32))
    y = client.empty(8, "float32")

    class Boom(Exception):
        pass

    with pytest.raises(Boom):
        with client.profile():
            client.launch(scale, 1, x, y, 2.0)
            raise Boom()
    # the client works on, and a new window measures
    with client.profile() as p:
        client.launch(scale, 1, x, y, 2.0)
    assert p.launches == 1


def test_capture_and_replay(client, scale):
    n = 600
    x = client.asarray(np.arange(n, dtype=np.float32))
    y = client.asarray(np.zeros(n, np.float32))
    z = client.empty(n, "float32")
    # arm the stream, warm up (compile, make the buffers), then record
    client.graph_prepare()
    client.launch(scale, cubes(n), x, y, 3.0)
    y.write(np.zeros(n, np.float32))
    with client.capture() as graph:
        client.launch(scale, cubes(n), x, y, 3.0)
        client.launch(scale, cubes(n), y, z, -1.0)
    assert isinstance(graph, cubert.Graph)
    # recorded, not run
    np.testing.assert_array_equal(y.numpy(), np.zeros(n, np.float32))
    assert graph.replay() is None
    np.testing.assert_array_equal(y.numpy(), np.arange(n) * 3.0)
    np.testing.assert_array_equal(z.numpy(), np.arange(n) * -3.0)
    # rewrite the input and replay: the same launches on the new data
    x.write(np.full(n, 2.0, np.float32))
    graph.replay()
    np.testing.assert_array_equal(y.numpy(), np.full(n, 6.0, np.float32))
    np.testing.assert_array_equal(z.numpy(), np.full(n, -6.0, np.float32))
    assert graph.destroy() is None
    with pytest.raises((cubert.NotFoundError, cubert.InvalidArgumentError)):
        graph.replay()


def test_capture_records_one_graph_per_prepare(client, scale):
    x = client.asarray(np.ones(16, np.float32))
    y = client.asarray(np.zeros(16, np.float32))
    client.graph_prepare()
    with client.capture() as g1:
        client.launch(scale, 1, x, y, 5.0)
    client.graph_prepare()
    with client.capture() as g2:
        client.launch(scale, 1, x, y, 7.0)
    g2.replay()
    np.testing.assert_array_equal(y.numpy(), np.full(16, 7.0, np.float32))
    g1.replay()
    np.testing.assert_array_equal(y.numpy(), np.full(16, 5.0, np.float32))
    g1.destroy()
    g2.destroy()


def test_capture_refuses_reads(client, scale):
    x = client.asarray(np.ones(16, np.float32))
    y = client.asarray(np.zeros(16, np.float32))
    client.graph_prepare()
    with pytest.raises(cubert.GraphStateError):
        with client.capture():
            client.launch(scale, 1, x, y, 2.0)
            y.numpy()  # a read cannot be recorded
    # the capture ended with the block: reads work again
    np.testing.assert_array_equal(x.numpy(), np.ones(16, np.float32))
    client.graph_prepare()
    with pytest.raises(cubert.GraphStateError):
        with client.capture():
            x.write(np.ones(16, np.float32))


def test_dry_run(client, scale):
    n = 256
    x = client.asarray(np.ones(n, np.float32))
    y = client.asarray(np.full(n, 9.0, np.float32))
    with client.dry_run():
        client.launch(scale, 1, x, y, 2.0)
        # arguments are still validated
        with pytest.raises(cubert.InvalidArgumentError):
            client.launch(scale, 1, x, y)
    np.testing.assert_array_equal(y.numpy(), np.full(n, 9.0, np.float32))
    client.launch(scale, 1, x, y, 2.0)
    np.testing.assert_array_equal(y.numpy(), np.full(n, 2.0, np.float32))


def test_dry_run_buffers_get_memory_at_first_use(client):
    with client.dry_run():
        b = client.empty(1024, "float32")
    b.write(np.arange(1024, dtype=np.float32))
    np.testing.assert_array_equal(b.numpy(), np.arange(1024))


def test_range_without_trace(client):
    # no trace runs: the ranges do nothing, and nest
    with client.range("outer") as c:
        assert c is client
        with client.range("inner \u00e9"):
            pass
    with pytest.raises(TypeError):
        with client.range(None):
            pass


def test_range_in_trace(tmp_path):
    # the trace starts with the process's first client: a fresh process
    path = tmp_path / "trace.json"
    code = ("import cubert, threading\n"
            "c = cubert.Client('cpu')\n"
            "def work(t):\n"
            "    with c.range(f'thread {t}'):\n"
            "        with c.range('step \"quoted\"'):\n"
            "            c.empty(64).release()\n"
            "ts = [threading.Thread(target=work, args=(t,)) for t in (0, 1)]\n"
            "[t.start() for t in ts]\n"
            "[t.join() for t in ts]\n"
            "c.close()\n")
    env = dict(os.environ, CUBERT_TRACE=str(path))
    out = subprocess.run([sys.executable, "-c", code], env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    events = json.loads(path.read_text())["traceEvents"]
    begins = [e for e in events if e["ph"] == "B"]
    ends = [e for e in events if e["ph"] == "E"]
    assert len(begins) == 4 and len(ends) == 4
    names = sorted(e["name"] for e in begins)
    assert names == ['step "quoted"', 'step "quoted"', "thread 0", "thread 1"]
    assert len({e["tid"] for e in begins}) == 2


# --- streams and barriers ----------------------------------------------------


def test_stream_switching(client, scale):
    own = client.stream()
    assert isinstance(own, cubert.Stream) and own.client is client
    assert own.id >> 63 == 1  # threads' own streams have the top bit set
    x = client.asarray(np.arange(32, dtype=np.float32))
    try:
        client.use_stream(5)
        assert client.stream().id == 5
        assert client.stream() == client.stream(5) != own
        y = client.empty(32, "float32")
        client.launch(scale, 1, x, y, 2.0)
        client.sync(y)
        np.testing.assert_array_equal(y.numpy(), np.arange(32) * 2.0)
    finally:
        client.use_stream(0)
    assert client.stream() == own
    np.testing.assert_array_equal(y.numpy(), np.arange(32) * 2.0)
    with pytest.raises(TypeError):
        client.use_stream("five")


def test_native_stream_on_cpu(client):
    assert client.native_stream() == 0


def test_flush_sync_check(client, scale):
    x = client.asarray(np.ones(64, np.float32))
    y = client.empty(64, "float32")
    client.launch(scale, 1, x, y, 7.0)
    assert client.flush() is None
    assert client.sync() is None
    assert client.sync(x, y) is None
    assert client.check() is None
    assert client.check(x, y) is None
    np.testing.assert_array_equal(y.numpy(), np.full(64, 7.0, np.float32))
    with pytest.raises(TypeError):
        client.sync("not a buffer")


def test_check_and_sync_answer_for_the_buffers_named(client, scale):
    x = client.asarray(np.ones(8, np.float32))
    y = client.asarray(np.zeros(8, np.float32))
    with pytest.raises(cubert.InvalidArgumentError):
        client.launch(scale, 1, x, y, np.float64(1))
    # y failed: naming it raises, with one cause per failed buffer
    with pytest.raises(cubert.SeveralError) as info:
        client.check(y)
    assert len(info.value.causes) == 1
    with pytest.raises(cubert.SeveralError) as info:
        client.sync(x, y)
    assert len(info.value.causes) == 1
    with pytest.raises(cubert.SeveralError) as info:
        client.check(y, x, y)  # a buffer named twice is reported once
    assert len(info.value.causes) == 1
    # naming none, or only good ones, raises nothing
    assert client.check() is None
    assert client.sync() is None
    assert client.check(x) is None
    assert client.sync(x) is None
    # a full write clears it
    y.write(np.zeros(8, np.float32))
    client.check(y)
    client.sync(y)


# --- errors ------------------------------------------------------------------


@pytest.mark.parametrize("name,code", ERROR_CLASSES)
def test_error_classes(name, code):
    cls = getattr(cubert, name)
    assert isinstance(cls, type)
    assert issubclass(cls, cubert.Error)
    assert cls.code == code
    assert cls is not cubert.Error


def test_error_base_relations():
    assert issubclass(cubert.Error, Exception)
    assert issubclass(cubert.InvalidArgumentError, ValueError)
    assert issubclass(cubert.OutOfMemoryError, MemoryError)
    assert issubclass(cubert.NotFoundError, LookupError)
    assert issubclass(cubert.TimeoutError, builtins.TimeoutError)
    assert cubert.TimeoutError is not builtins.TimeoutError
    assert not issubclass(cubert.CompileError, ValueError)
    assert not issubclass(cubert.SeveralError, ValueError)
    assert len({getattr(cubert, n) for n, _ in ERROR_CLASSES}) == 20


def test_invalid_argument_attributes():
    with pytest.raises(cubert.InvalidArgumentError) as info:
        cubert.Client("cpu:x")
    e = info.value
    assert isinstance(e, ValueError)
    assert e.code == 1
    assert isinstance(e.code_name, str) and e.code_name
    assert isinstance(e.message, str) and e.message
    assert e.log is None
    assert e.causes == []


def test_compile_error_attributes(client):
    k = cubert.Kernel("CUBE_KERNEL(bad, CUBE_OUT(float, y)) { y[0] = ; }",
                      "bad")
    y = client.empty(4, "float32")
    with pytest.raises(cubert.CompileError) as info:
        client.launch(k, 1, y)
    e = info.value
    assert e.code == 6
    assert isinstance(e.message, str) and e.message
    assert isinstance(e.log, str) and e.log.strip()
    assert e.causes == []


def test_several_error_attributes(client, scale):
    x = client.asarray(np.ones(8, np.float32))
    y1 = client.asarray(np.zeros(8, np.float32))
    y2 = client.asarray(np.zeros(8, np.float32))
    for y in (y1, y2):
        with pytest.raises(cubert.InvalidArgumentError):
            client.launch(scale, 1, x, y, np.float64(1))
    with pytest.raises(cubert.SeveralError) as info:
        client.check(y1, y2)
    e = info.value
    assert e.code == 11
    assert isinstance(e.causes, list) and len(e.causes) == 2
    for cause in e.causes:
        assert isinstance(cause, cubert.InvalidArgumentError)
        assert cause.code == 1
        assert isinstance(cause.message, str) and cause.message
    assert e.log is None


def test_not_found_error_attributes():
    with pytest.raises(cubert.NotFoundError) as info:
        cubert.Client("nosuchbackend")
    e = info.value
    assert isinstance(e, LookupError)
    assert e.code == 2
    assert e.log is None and e.causes == []


def test_code_name_is_the_c_name(client, scale):
    """code_name is the cube_code enumerator's name ("CUBE_ERR_COMPILE")."""
    got = {}
    with pytest.raises(cubert.InvalidArgumentError) as info:
        cubert.Client("cpu:x")
    got[1] = info.value.code_name
    with pytest.raises(cubert.NotFoundError) as info:
        cubert.Client("nosuchbackend")
    got[2] = info.value.code_name
    k = cubert.Kernel("CUBE_KERNEL(bad2, CUBE_OUT(float, y)) { y[0] = ; }",
                      "bad2")
    y = client.empty(4, "float32")
    with pytest.raises(cubert.CompileError) as info:
        client.launch(k, 1, y)
    got[6] = info.value.code_name
    with pytest.raises(cubert.SeveralError) as info:
        y.numpy()
    got[11] = info.value.code_name
    got["cause"] = info.value.causes[0].code_name
    assert got == {**CODE_NAMES, "cause": CODE_NAMES[6]}


# --- threads -----------------------------------------------------------------


def test_threads_launch_concurrently(client):
    kernel = cubert.Kernel(SCALE_SRC, "scale", cube_dim=(256,))
    n = 20000
    x = client.asarray(np.arange(n, dtype=np.float32))
    barrier = threading.Barrier(4)
    results = {}
    errors = []
    streams = {}

    def work(t):
        try:
            y = client.empty(n, "float32")
            barrier.wait()
            streams[t] = client.stream().id
            for rep in range(10):
                a = float(t * 10 + rep)
                client.launch(kernel, cubes(n), x, y, a)
                got = y.numpy()
                expect = np.arange(n, dtype=np.float32) * np.float32(a)
                if not np.array_equal(got, expect):
                    errors.append((t, rep))
            results[t] = y.numpy()
        except Exception as e:  # reported below
            errors.append((t, repr(e)))

    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=60)
    assert not any(th.is_alive() for th in threads)
    assert errors == []
    assert len(set(streams.values())) == 4  # one stream per thread
    for t in range(4):
        np.testing.assert_array_equal(
            results[t], np.arange(n, dtype=np.float32) * np.float32(t * 10 + 9))


# --- module functions --------------------------------------------------------


def test_module_level_names():
    for name in ("Client", "Buffer", "Kernel", "Graph", "Profile", "Error",
                 "from_dlpack"):
        assert hasattr(cubert, name), name


def test_backends():
    names = cubert.backends()
    assert isinstance(names, list)
    assert "cpu" in names and "null" in names
    assert all(isinstance(n, str) for n in names)


def test_devices():
    devices = cubert.devices()
    assert isinstance(devices, list)
    by_name = {d["device"]: d for d in devices}
    assert "cpu:0" in by_name
    cpu = by_name["cpu:0"]
    assert cpu["backend"] == "cpu" and cpu["index"] == 0
    assert cpu["compute_units"] >= 1 and cpu["memory_total"] > 0
    only = cubert.devices("cpu")
    assert only and all(d["backend"] == "cpu" for d in only)
    # an open client shows in the count
    before = cpu["clients"]
    with cubert.Client("cpu"):
        now = {d["device"]: d for d in cubert.devices("cpu")}["cpu:0"]
        assert now["clients"] == before + 1


def test_module_dry_run(client, scale):
    x = client.asarray(np.ones(8, np.float32))
    y = client.asarray(np.zeros(8, np.float32))
    with cubert.dry_run(client):
        client.launch(scale, 1, x, y, 2.0)
    np.testing.assert_array_equal(y.numpy(), np.zeros(8, np.float32))


SPIN_SRC = """
CUBE_KERNEL(spin, CUBE_OUT(uint32_t, out), CUBE_SCALAR(uint32_t, n))
{
    uint32_t v = ABSOLUTE_POS_X + 1u;
    for (uint32_t k = 0; k < n; k++)
        v = v * 1664525u + 1013904223u;
    if (ABSOLUTE_POS_X < CUBE_LEN(out))
        CUBE_AT(out, ABSOLUTE_POS_X) = v;
}
"""


def test_launch_releases_the_gil(client):
    import time
    k = cubert.Kernel(SPIN_SRC, "spin", cube_dim=(1,))
    out = client.empty(1, "uint32")
    client.launch(k, 1, out, np.uint32(3))  # compile outside the timing
    v = 1
    for _ in range(3):
        v = (v * 1664525 + 1013904223) % 2**32
    assert out.numpy()[0] == v
    ticks = [0]
    stop = threading.Event()

    def count():
        while not stop.is_set():
            ticks[0] += 1

    t = threading.Thread(target=count)
    t.start()
    try:
        time.sleep(0.01)
        n = 40_000_000
        before = ticks[0]
        t0 = time.perf_counter()
        client.launch(k, 1, out, np.uint32(n))
        elapsed = time.perf_counter() - t0
        during = ticks[0] - before
    finally:
        stop.set()
        t.join()
    if elapsed < 0.02:
        pytest.skip(f"the spin took only {elapsed:.3f} s here")
    assert during > 1000, (during, elapsed)


def test_memory_usage_of_the_device_counts_other_threads(client):
    import threading
    made = threading.Event()
    done = threading.Event()
    held = []

    def worker():
        held.append(client.empty(1 << 16, "uint8"))
        made.set()
        done.wait(30)
        held.clear()   # released on the worker's own stream

    t = threading.Thread(target=worker)
    t.start()
    assert made.wait(30)
    mine = client.memory_usage()
    everything = client.memory_usage(device=True)
    assert everything["bytes_in_use"] >= mine["bytes_in_use"] + (1 << 16)
    done.set()
    t.join()
    with pytest.raises(TypeError):
        client.memory_usage(True)   # keyword only
