"""cubert.memviz: a trace's memory events read into series (no matplotlib
needed), a picture drawn from a real trace of a CPU client, and input
that cannot be drawn refused with a clear error."""

import json
import os
import struct
import subprocess
import sys
import textwrap

import pytest

from cubert import memviz
from cubert.memviz import BufferSpan, MemvizError

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

# A program that allocates, labels and releases buffers while traced, and
# saves its memory report next to the trace.
PROGRAM = textwrap.dedent("""
    import sys
    import cubert
    with cubert.Client("cpu") as c:
        weights = c.empty((1 << 18,), "float32")
        weights.label = "weights"
        keep = []
        for i in range(12):
            b = c.empty((4096 * (i + 1),), "uint8")
            if i % 3 == 0:
                b.label = f"act{i}"
            keep.append(b)
        for b in keep[::2]:
            b.release()
        big = c.empty((3 << 20,), "uint8")
        big.label = "big"
        with open(sys.argv[1], "w") as f:
            f.write(c.memory_report("json"))
        big.release()
        weights.release()
""")


@pytest.fixture(scope="module")
def traced(tmp_path_factory):
    """(trace path, report path) of PROGRAM run under CUBERT_TRACE."""
    d = tmp_path_factory.mktemp("memviz")
    trace, report = d / "trace.json", d / "report.json"
    env = dict(os.environ, CUBERT_TRACE=str(trace))
    out = subprocess.run([sys.executable, "-c", PROGRAM, str(report)],
                         env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    return trace, report


def png_size(path):
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE
    assert data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


# --- reading a real trace -----------------------------------------------------

def test_real_trace_parses_into_counters_and_buffers(traced):
    trace, _ = traced
    tl = memviz.parse(memviz.load_trace(trace))
    assert len(tl.counters) == 1
    (name, series), = tl.counters.items()
    assert name.startswith("memory 0x")
    assert len(series.times) == len(series.reserved) == len(series.live)
    assert series.times == sorted(series.times)
    assert max(series.live) >= (1 << 20) + (3 << 20)
    assert all(r >= lv for r, lv in zip(series.reserved, series.live))
    assert series.live[-1] == 0  # everything released by the end
    assert len(tl.buffers) == 14
    labels = {b.label: b for b in tl.buffers if b.label}
    assert set(labels) == {"weights", "act0", "act3", "act6", "act9",
                           "big"}
    assert labels["weights"].bytes == 1 << 20
    assert labels["big"].bytes == 3 << 20
    # Released by the end of the program: the evens explicitly, the rest
    # when the client closed.
    assert all(b.start is not None and b.end is not None and
               b.end >= b.start for b in tl.buffers)
    assert tl.t_first <= min(b.start for b in tl.buffers)
    assert tl.t_last >= max(b.end for b in tl.buffers)


def test_real_report_loads_with_its_pools(traced):
    _, report = traced
    r = memviz.load_report(report)
    pools = memviz.pool_occupancy(r)
    assert len(pools) == len(r["pools"]) >= 2
    assert sum(u for _, u, _ in pools) == r["usage"]["bytes_in_use"] > 0
    assert all(u <= res for _, u, res in pools)


# --- drawing ------------------------------------------------------------------

def test_render_writes_a_png(traced, tmp_path):
    pytest.importorskip("matplotlib")
    trace, report = traced
    out = tmp_path / "memory.png"
    tl = memviz.render(trace, out, report=report, top=5)
    assert len(tl.buffers) == 14
    w, h = png_size(out)
    assert 800 <= w <= 2000 and 800 <= h <= 2000
    assert out.stat().st_size > 20_000
    # Without a report: two panels, so a shorter picture.
    out2 = tmp_path / "memory2.png"
    memviz.render(memviz.load_trace(trace), out2)
    w2, h2 = png_size(out2)
    assert w2 == w and h2 < h


def test_command_line_draws_and_reports(traced, tmp_path):
    pytest.importorskip("matplotlib")
    trace, report = traced
    out = tmp_path / "cli.png"
    run = subprocess.run([sys.executable, "-m", "cubert.memviz", str(trace),
                          "-o", str(out), "--report", str(report), "-n",
                          "3", "--title", "test"],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert "14 buffer(s)" in run.stdout
    png_size(out)


def test_command_line_refuses_bad_input(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("this is not json")
    out = tmp_path / "never.png"
    run = subprocess.run([sys.executable, "-m", "cubert.memviz", str(bad),
                          "-o", str(out)],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 1
    assert "not JSON" in run.stderr
    assert not out.exists()
    run = subprocess.run([sys.executable, "-m", "cubert.memviz", str(bad),
                          "--top", "-1"],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 2


def test_without_matplotlib_a_clear_error(monkeypatch, tmp_path):
    for name in [m for m in sys.modules if m.startswith("matplotlib")]:
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    events = [alloc(1.0, "0x1", 64)]
    with pytest.raises(ModuleNotFoundError, match="matplotlib") as e:
        memviz.render(events, tmp_path / "x.png")
    assert e.value.name == "matplotlib"
    # Bad input is reported as such first, matplotlib or not.
    with pytest.raises(MemvizError):
        memviz.render([], tmp_path / "x.png")
    assert not (tmp_path / "x.png").exists()


# --- parsing, on events made here ---------------------------------------------

def alloc(ts, buf, size, pid=7, label=None):
    args = {"bytes": size, "buffer": buf}
    if label:
        args["label"] = label
    return {"ph": "i", "cat": "memory", "name": "alloc", "s": "t",
            "pid": pid, "tid": 1, "ts": ts, "args": args}


def release(ts, buf, size, pid=7, label=None):
    ev = alloc(ts, buf, size, pid, label)
    ev["name"] = "release"
    return ev


def label(ts, buf, text, pid=7):
    return {"ph": "i", "cat": "memory", "name": "label", "s": "t",
            "pid": pid, "tid": 1, "ts": ts,
            "args": {"buffer": buf, "label": text}}


def counter(ts, reserved, live, stream="0x1", pid=7):
    return {"ph": "C", "cat": "memory", "name": f"memory {stream}",
            "pid": pid, "tid": 1, "ts": ts,
            "args": {"reserved": reserved, "live": live}}


def test_parse_pairs_allocs_with_releases_and_labels():
    events = [
        {"ph": "M", "name": "process_name", "pid": 7, "tid": 0,
         "args": {"name": "cubert"}},
        release(5.0, "0xold", 10),            # allocated before the trace
        alloc(10.0, "0xa", 100),
        counter(11.0, 1024, 100),
        label(12.0, "0xa", "w"),
        alloc(20.0, "0xb", 200),
        counter(21.0, 1024, 300),
        {"ph": "X", "cat": "launch", "name": "k", "pid": 7, "tid": 1,
         "ts": 22.0, "dur": 3.0},
        release(30.0, "0xa", 100, label="w"),
        counter(31.0, 1024, 200, stream="0x2"),
        alloc(40.0, "0xa", 50),               # the handle used again
        {"ph": "zz", "cat": "memory", "name": "alloc", "ts": 41.0},
    ]
    tl = memviz.parse(events)
    assert (tl.t_first, tl.t_last) == (5.0, 40.0)
    assert sorted(tl.counters) == ["memory 0x1", "memory 0x2"]
    s = tl.counters["memory 0x1"]
    assert (s.times, s.reserved, s.live) == ([11.0, 21.0], [1024, 1024],
                                             [100, 300])
    old, a, b, a2 = tl.buffers
    assert (old.buffer, old.start, old.end, old.bytes) == ("0xold", None,
                                                          5.0, 10)
    assert (a.start, a.end, a.label, a.bytes) == (10.0, 30.0, "w", 100)
    assert (b.start, b.end, b.label) == (20.0, None, None)
    assert (a2.start, a2.end, a2.bytes) == (40.0, None, 50)


def test_parse_sorts_by_time_and_tells_processes_apart():
    events = [counter(20.0, 2, 1, pid=2), alloc(10.0, "0xa", 4, pid=1),
              alloc(15.0, "0xa", 8, pid=2), counter(5.0, 1, 1, pid=1),
              release(30.0, "0xa", 4, pid=1)]
    tl = memviz.parse(events)
    assert sorted(tl.counters) == ["pid 1 memory 0x1", "pid 2 memory 0x1"]
    a1, a2 = tl.buffers
    assert (a1.bytes, a1.end) == (4, 30.0)   # pid 1's release, not pid 2's
    assert (a2.bytes, a2.end) == (8, None)


def test_an_alloc_of_a_live_handle_ends_the_previous_one():
    tl = memviz.parse([alloc(1.0, "0xa", 4), alloc(2.0, "0xa", 8)])
    first, second = tl.buffers
    assert first.end == 2.0 and second.end is None


def test_pack_never_overlaps_buffers_live_together():
    bufs = [BufferSpan("a", 100, 0.0, 10.0), BufferSpan("b", 50, 1.0, 5.0),
            BufferSpan("c", 30, 2.0, 20.0), BufferSpan("d", 40, 6.0, 8.0),
            BufferSpan("e", 500, None, 3.0), BufferSpan("f", 20, 9.0, None)]
    offsets = memviz.pack(bufs, t_first=0.0)
    inf = float("inf")
    for i, p in enumerate(bufs):
        for j, q in enumerate(bufs[:i]):
            ps, pe = p.start or 0.0, p.end or inf
            qs, qe = q.start or 0.0, q.end or inf
            if ps < qe and qs < pe:
                assert (offsets[i] + p.bytes <= offsets[j] or
                        offsets[j] + q.bytes <= offsets[i]), (p, q)
    # First fit: "d" and later "f" take the lowest room freed, the one
    # "e" left (it came before the trace, so it starts with "a").
    assert offsets == [0, 600, 650, 100, 100, 100]


def test_load_trace_takes_arrays_objects_and_truncated_files(tmp_path):
    events = [alloc(1.0, "0xa", 4), counter(2.0, 8, 4)]
    as_array = tmp_path / "a.json"
    as_array.write_text(json.dumps(events))
    assert memviz.load_trace(as_array) == events
    assert memviz.load_trace(str(as_array)) == events
    assert memviz.load_trace({"traceEvents": events}) == events
    assert memviz.load_trace(events) == events
    # As a killed process leaves it: no closing brackets, a cut line.
    cut = tmp_path / "cut.json"
    cut.write_text('{"traceEvents":[\n' + json.dumps(events[0]) + ",\n" +
                   json.dumps(events[1]) + ',\n{"ph":"i","cat":"mem')
    assert memviz.load_trace(cut) == events


def test_load_report_takes_the_first_of_several_documents(client):
    buf = client.empty((1 << 20,), "uint8")
    report = client.memory_report("json")
    stats = json.dumps({"stats": client.memory_stats()})
    buf.release()
    # `cubert memory --json` prints the report, then its statistics.
    r = memviz.load_report(report + "\n" + stats + "\n")
    assert r == json.loads(report)
    assert memviz.load_report(json.loads(report)) == r
    assert sum(u for _, u, _ in memviz.pool_occupancy(r)) >= 1 << 20


def test_format_bytes_uses_binary_units():
    assert memviz.format_bytes(512) == "512 B"
    assert memviz.format_bytes(1536) == "1.5 KiB"
    assert memviz.format_bytes(3 << 30) == "3 GiB"


# --- input that cannot be drawn -----------------------------------------------

@pytest.mark.parametrize("text, message", [
    ("this is not json", "not JSON"),
    ("", "not JSON"),
    ('{"traceEvents": 3}', "not a trace"),
    ('{"something": []}', "not a trace"),
    ("42", "not a trace"),
    ("[]", "no memory events"),
    ('{"traceEvents": [{"ph": "M", "name": "process_name"}]}',
     "no memory events"),
    # Phases this reader does not know are skipped; nothing else left.
    ('[{"ph": "?", "cat": "memory", "name": "alloc", "ts": 1},'
     ' {"ph": "b", "cat": "memory", "name": "x", "ts": 2}]',
     "no memory events"),
    ('[1, 2]', "event 0: not a JSON object"),
    ('[{"ph": "i", "cat": "memory", "name": "alloc", "ts": 1,'
     ' "args": {"bytes": "many", "buffer": "0x1"}}]', '"bytes"'),
    ('[{"ph": "i", "cat": "memory", "name": "alloc", "ts": 1,'
     ' "args": {"bytes": -4, "buffer": "0x1"}}]', "negative"),
    ('[{"ph": "i", "cat": "memory", "name": "alloc", "ts": 1,'
     ' "args": {"bytes": 4}}]', '"buffer"'),
    ('[{"ph": "i", "cat": "memory", "name": "alloc", "ts": "soon",'
     ' "args": {"bytes": 4, "buffer": "0x1"}}]', '"ts"'),
    ('[{"ph": "C", "cat": "memory", "name": "memory 0x1", "ts": 1}]',
     'without "args"'),
    ('[{"ph": "C", "cat": "memory", "name": "memory 0x1", "ts": 1,'
     ' "args": {"reserved": 1}}]', '"live"'),
])
def test_hostile_traces_are_refused_clearly(tmp_path, text, message):
    path = tmp_path / "t.json"
    path.write_text(text)
    with pytest.raises(MemvizError, match=message):
        memviz.parse(memviz.load_trace(path))


def test_binary_and_missing_files_are_refused(tmp_path):
    path = tmp_path / "t.json"
    path.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(MemvizError, match="not UTF-8"):
        memviz.load_trace(path)
    with pytest.raises(OSError):
        memviz.load_trace(tmp_path / "absent.json")
    with pytest.raises(TypeError):
        memviz.load_trace(42)


@pytest.mark.parametrize("text", ["not json", "[1, 2]", '{"usage": {}}',
                                  '{"pools": [3]}',
                                  '{"pools": [{"kind": "sliced"}]}'])
def test_hostile_reports_are_refused_clearly(tmp_path, text):
    path = tmp_path / "r.json"
    path.write_text(text)
    for source in (path, str(path)):
        with pytest.raises(MemvizError, match="report"):
            memviz.pool_occupancy(memviz.load_report(source))
