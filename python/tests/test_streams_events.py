"""Streams and events as objects on the CPU backend: Client.stream as a
context manager, use_stream, Stream's members, Event's record, wait,
synchronize, query and elapsed_time, and every bad argument leaving the
client usable. The CUDA side (native events, PyTorch and CuPy streams) is
in test_gpu_interop.py."""

import threading

import numpy as np
import pytest

import cubert
from conftest import assert_usable, cubes


# --- streams -------------------------------------------------------------------


def test_stream_is_the_current_one_by_default(client):
    s = client.stream()
    assert isinstance(s, cubert.Stream)
    assert s.client is client
    assert s.id >> 63 == 1  # the thread's own
    assert s == client.stream() and hash(s) == hash(client.stream())
    assert "thread's own" in repr(s) and client.device in repr(s)
    assert s.native == 0  # host backends have no native queue


def test_with_stream_works_on_it_and_restores(client, scale):
    own = client.stream()
    x = client.asarray(np.arange(64, dtype=np.float32))
    with client.stream(7) as s:
        assert s.id == 7 and client.stream() == s
        y = client.empty(64, "float32")
        client.launch(scale, cubes(64), x, y, 3.0)
        assert any(b["stream"] == 7 for b in client.memory_snapshot())
        with client.stream(8):
            assert client.stream().id == 8
        assert client.stream().id == 7
    assert client.stream() == own
    # A stream exists from its first use: 8 saw none.
    assert 7 in client.stream_ids() and 8 not in client.stream_ids()
    np.testing.assert_array_equal(y.numpy(), np.arange(64) * 3.0)
    assert repr(s) == f"<cubert.Stream 7 of {client.device}>"


def test_with_stream_restores_an_earlier_choice(client):
    client.use_stream(5)
    try:
        with client.stream(6):
            assert client.stream().id == 6
        assert client.stream().id == 5
        five = client.stream()
        with five:  # the stream already worked on: nothing to switch
            assert client.stream() == five
        assert client.stream() == five
    finally:
        client.use_stream(0)
    assert client.stream().id >> 63 == 1


def test_one_stream_object_entered_on_two_threads(client):
    shared = client.stream(11)
    barrier = threading.Barrier(2)
    seen, errors = {}, []

    def work(t):
        try:
            own = client.stream().id
            with shared:
                barrier.wait()
                seen[t] = client.stream().id
                barrier.wait()
            seen[t, "after"] = client.stream().id == own
        except Exception as e:  # reported below
            errors.append(repr(e))

    threads = [threading.Thread(target=work, args=(t,)) for t in range(2)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=60)
    assert errors == []
    assert seen[0] == seen[1] == 11
    assert seen[0, "after"] and seen[1, "after"]


def test_stream_synchronize_and_events_of_a_stream(client):
    s = client.stream(12)
    s.synchronize()
    e = s.record_event()
    assert isinstance(e, cubert.Event) and e.recorded and e.query()
    again = client.event()
    assert s.record_event(again) is again and again.recorded
    s.wait_event(e)
    assert_usable(client)


@pytest.mark.parametrize("bad, error", [
    (0, cubert.InvalidArgumentError),
    (-1, OverflowError),
    (2**64, OverflowError),
    ("x", TypeError),
    (1.5, TypeError),
])
def test_stream_refuses_bad_ids(client, bad, error):
    with pytest.raises(error):
        client.stream(bad)
    assert_usable(client)


def test_use_stream_refuses_bad_input(client, null_client):
    with pytest.raises(TypeError):
        client.use_stream("five")
    with pytest.raises(OverflowError):
        client.use_stream(-3)
    with pytest.raises(OverflowError):
        client.use_stream(2**64)
    with pytest.raises(cubert.InvalidArgumentError, match="another client"):
        client.use_stream(null_client.stream(3))
    assert client.stream().id >> 63 == 1
    assert_usable(client)


def test_stream_of_another_client_is_refused(client, null_client):
    theirs = null_client.stream(4)
    with pytest.raises(cubert.InvalidArgumentError, match="another client"):
        client.stream(theirs)
    with pytest.raises(TypeError):
        client.stream(1, 2)
    assert client.stream(client.stream(3)).id == 3
    assert_usable(client)


def test_assigning_stream_is_refused_with_what_to_do(client):
    with pytest.raises(AttributeError, match="use_stream"):
        client.stream = 12345
    assert 12345 not in client.stream_ids()
    assert callable(client.stream)
    assert_usable(client)


def test_streams_and_events_are_made_by_a_client():
    with pytest.raises(TypeError):
        cubert.Stream()
    with pytest.raises(TypeError):
        cubert.Event()


def test_stream_of_a_closed_client(client):
    s = client.stream(9)
    client.close()
    with pytest.raises(cubert.InvalidArgumentError, match="closed"):
        client.stream()
    with pytest.raises(cubert.InvalidArgumentError, match="closed"):
        s.synchronize()
    with pytest.raises(cubert.InvalidArgumentError, match="closed"):
        s.native
    with pytest.raises(cubert.InvalidArgumentError, match="closed"):
        with s:
            pass
    with pytest.raises(cubert.InvalidArgumentError, match="closed"):
        client.use_stream(0)


def test_closing_the_client_inside_a_stream_block():
    c = cubert.Client("cpu")
    with c.stream(13):
        c.close()
    assert c.closed


# --- events --------------------------------------------------------------------


def test_event_before_record(client):
    e = client.event()
    assert e.client is client and e.timing and not e.recorded
    assert e.query()  # nothing to wait for, as in CUDA
    e.synchronize()
    e.wait()
    with pytest.raises(cubert.InvalidArgumentError, match="not recorded"):
        e.elapsed_time(client.event())
    assert "recorded" not in repr(e)


def test_event_times_the_work_between_two(client, scale):
    n = 1 << 16
    x = client.asarray(np.arange(n, dtype=np.float32))
    y = client.empty(n, "float32")
    start, end = client.event(), client.event()
    start.record()
    for _ in range(3):
        client.launch(scale, cubes(n), x, y, 2.0)
    end.record(client.stream())
    end.synchronize()
    assert start.query() and end.query()
    ms = start.elapsed_time(end)
    assert isinstance(ms, float) and ms >= 0.0
    assert "recorded" in repr(end)
    np.testing.assert_array_equal(y.numpy(), np.arange(n) * 2.0)


def test_event_on_a_named_stream_and_waited_for_on_another(client):
    e = client.event(timing=False)
    e.record(client.stream(21))
    e.wait(client.stream(22))
    client.stream(22).wait_event(e)
    e.record(0)  # 0: no native stream, as native_wait takes it
    e.wait(0)
    assert not e.timing and "no timing" in repr(e)
    assert_usable(client)


def test_event_refuses_bad_streams(client, null_client):
    e = client.event()
    for bad, error in [("x", TypeError), (1.5, TypeError),
                       (-1, OverflowError), (2**64, OverflowError),
                       (5, cubert.InvalidArgumentError),
                       (null_client.stream(2), cubert.InvalidArgumentError)]:
        with pytest.raises(error):
            e.record(bad)
        with pytest.raises(error):
            e.wait(bad)
    with pytest.raises(TypeError):
        e.record(None, None)
    with pytest.raises(TypeError):
        client.stream().wait_event("not an event")
    with pytest.raises(TypeError):
        client.stream().record_event(42)
    assert not e.recorded
    assert_usable(client)


def test_elapsed_time_refuses_bad_ends(client, null_client):
    start = client.event()
    start.record()
    untimed = client.event(timing=False)
    untimed.record()
    theirs = null_client.event()
    theirs.record()
    with pytest.raises(TypeError):
        start.elapsed_time(1.0)
    with pytest.raises(cubert.InvalidArgumentError, match="another client"):
        start.elapsed_time(theirs)
    with pytest.raises(cubert.InvalidArgumentError, match="timing=False"):
        start.elapsed_time(untimed)
    with pytest.raises(cubert.InvalidArgumentError, match="timing=False"):
        untimed.elapsed_time(start)
    with pytest.raises(TypeError):
        client.event(True)  # timing is a keyword
    end = client.event()
    end.record()
    assert start.elapsed_time(end) >= 0.0
    assert_usable(client)


def test_event_record_inside_a_capture_is_refused(client, scale):
    x = client.asarray(np.arange(32, dtype=np.float32))
    y = client.empty(32, "float32")
    client.graph_prepare()
    client.launch(scale, 1, x, y, 2.0)
    e = client.event()
    with client.capture() as g:
        client.launch(scale, 1, x, y, 2.0)
        with pytest.raises(cubert.GraphStateError):
            e.record()
    assert not e.recorded
    g.replay()
    np.testing.assert_array_equal(y.numpy(), np.arange(32) * 2.0)
    e.record()
    assert e.query()


def test_event_of_a_closed_client(client):
    e = client.event()
    e.record()
    client.close()
    for call in (e.record, e.wait, e.synchronize, e.query):
        with pytest.raises(cubert.InvalidArgumentError, match="closed"):
            call()
    with pytest.raises(cubert.InvalidArgumentError, match="closed"):
        e.elapsed_time(e)
    with pytest.raises(cubert.InvalidArgumentError, match="closed"):
        client.event()
