"""A picture of a program's memory from a cubert trace.

    python -m cubert.memviz TRACE.json -o memory.png [--report REPORT.json]

reads the Chrome trace-event JSON that cubert writes (CUBERT_TRACE=path,
or cube_trace_start) and draws, one panel under the other:

  - reserved and live bytes over time, one pair of step lines per stream
    (the trace's "memory 0x<stream>" counter tracks);
  - every buffer as a bar from its "alloc" to its "release" event, its
    height its size, placed by a first-fit packing of the buffers live at
    the time (so the stack's top follows the live bytes); the largest
    buffers carry their label (or their size);
  - given a memory report (`cubert memory --json`, or
    Client.memory_report("json") saved), each pool's bytes in use against
    its bytes reserved.

Reading the trace (load_trace, parse, load_report) needs only the
standard library; drawing (render) needs matplotlib, imported when first
drawn.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

__all__ = ["MemvizError", "CounterSeries", "BufferSpan", "MemoryTimeline",
           "load_trace", "parse", "load_report", "pool_occupancy", "pack",
           "render", "main"]


class MemvizError(ValueError):
    """A trace or a report that cannot be drawn: not JSON, not a trace,
    no memory events, or a memory event with missing or wrong fields."""


@dataclass
class CounterSeries:
    """One stream's counter track: at times[i] (microseconds from the
    trace's start), reserved[i] bytes reserved and live[i] bytes live."""
    name: str
    times: list[float] = field(default_factory=list)
    reserved: list[int] = field(default_factory=list)
    live: list[int] = field(default_factory=list)


@dataclass
class BufferSpan:
    """One buffer's life. `start` is None when its alloc event is not in
    the trace (it came before the trace started), `end` None when it was
    still live when the trace ended."""
    buffer: str
    bytes: int
    start: float | None
    end: float | None
    label: str | None = None
    stream: str | None = None


@dataclass
class MemoryTimeline:
    """What parse() finds in a trace: the counter tracks by name, the
    buffers in order of their first event, and the span of the trace's
    timestamps (microseconds)."""
    counters: dict[str, CounterSeries]
    buffers: list[BufferSpan]
    t_first: float
    t_last: float


# --- reading ----------------------------------------------------------------

def _repair(text: str) -> str | None:
    """The text of a trace cut short (a process killed while tracing
    leaves the file without its closing brackets), closed after its last
    complete event; None when it does not look like one."""
    head = text.lstrip()
    if head.startswith("{"):
        if '"traceEvents"' not in head[:64]:
            return None
        closing = "\n]}"
    elif head.startswith("["):
        closing = "\n]"
    else:
        return None
    # cubert writes one event a line: keep the lines up to the last that
    # ends an event.
    lines = head.rstrip().split("\n")
    while lines:
        last = lines[-1].rstrip().rstrip(",")
        if last.endswith("}"):
            lines[-1] = last
            return "\n".join(lines) + closing
        lines.pop()
    return None


def _events_of(doc: Any, where: str) -> list:
    if isinstance(doc, list):
        return doc
    if isinstance(doc, dict) and isinstance(doc.get("traceEvents"), list):
        return doc["traceEvents"]
    raise MemvizError(f"{where}: not a trace: expected a JSON array of "
                      "events or an object with a \"traceEvents\" array")


def load_trace(source: Any) -> list:
    """The events of a trace: `source` is a path (str or os.PathLike), a
    list of event objects, or an object with "traceEvents". A file cut
    short (its process killed while tracing) is read up to its last
    complete event. Raises MemvizError when it is not a trace, OSError
    when the file cannot be read."""
    if isinstance(source, (list, dict)):
        return _events_of(source, "trace")
    if not isinstance(source, (str, os.PathLike)):
        raise TypeError("cubert.memviz: a trace is a path, a list of events "
                        f"or a dict with traceEvents, not {type(source).__name__}")
    path = os.fspath(source)
    with open(path, "rb") as f:
        raw = f.read()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise MemvizError(f"{path}: not a trace: not UTF-8 text "
                          f"(byte {e.start})") from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        fixed = _repair(text)
        doc = None
        if fixed is not None:
            try:
                doc = json.loads(fixed)
            except json.JSONDecodeError:
                doc = None
        if doc is None:
            raise MemvizError(f"{path}: not a trace: not JSON ({e.msg} at "
                              f"line {e.lineno}, column {e.colno})") from None
    return _events_of(doc, path)


def _number(obj: Mapping, key: str, where: str) -> Any:
    v = obj.get(key)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v != v:
        raise MemvizError(f"{where}: \"{key}\" is missing or not a number")
    return v


def parse(events: Iterable) -> MemoryTimeline:
    """The memory series of a trace's events (as load_trace returns
    them): the "C" events of category "memory" (args reserved and live)
    and the "alloc", "release" and "label" instants of category "memory"
    (args bytes, buffer, label). Other events, phases and categories are
    skipped. Raises MemvizError when an event is not an object, when a
    memory event lacks a field or has one of the wrong type, or when
    there are no memory events at all."""
    counters: dict[str, CounterSeries] = {}
    spans: list[BufferSpan] = []
    live: dict[tuple, BufferSpan] = {}
    pids: set = set()
    t_first = t_last = None
    found = 0
    rows = []
    for i, ev in enumerate(events):
        where = f"event {i}"
        if not isinstance(ev, dict):
            raise MemvizError(f"{where}: not a JSON object")
        if ev.get("cat") != "memory" or ev.get("ph") not in ("C", "i", "I"):
            continue
        ts = float(_number(ev, "ts", where))
        args = ev.get("args")
        if not isinstance(args, dict):
            raise MemvizError(f"{where}: a memory event without \"args\"")
        rows.append((ts, i, ev, args))
        pids.add(ev.get("pid"))
    # Several processes' traces merged into one: the pid tells them apart.
    many = len(pids) > 1
    # Events are written in order, but a merged file need not be.
    rows.sort(key=lambda r: (r[0], r[1]))
    for ts, i, ev, args in rows:
        where = f"event {i}"
        pid = ev.get("pid")
        name = str(ev.get("name", ""))
        if ev["ph"] == "C":
            series_name = f"pid {pid} {name}" if many else name
            s = counters.get(series_name)
            if s is None:
                s = counters[series_name] = CounterSeries(series_name)
            s.times.append(ts)
            s.reserved.append(int(_number(args, "reserved", where)))
            s.live.append(int(_number(args, "live", where)))
        elif name in ("alloc", "release", "label"):
            buf = args.get("buffer")
            if not isinstance(buf, str) or not buf:
                raise MemvizError(f'{where}: "buffer" is missing or not a '
                                  "string")
            label = args.get("label")
            if label is not None and not isinstance(label, str):
                raise MemvizError(f'{where}: "label" is not a string')
            key = (pid, buf)
            stream = f"tid {ev.get('tid')}"
            if name == "alloc":
                size = int(_number(args, "bytes", where))
                if size < 0:
                    raise MemvizError(f'{where}: "bytes" is negative')
                old = live.pop(key, None)
                if old is not None:
                    old.end = ts  # its release is missing: ends here
                span = BufferSpan(buf, size, ts, None, label or None, stream)
                live[key] = span
                spans.append(span)
            elif name == "release":
                size = int(_number(args, "bytes", where))
                if size < 0:
                    raise MemvizError(f'{where}: "bytes" is negative')
                span = live.pop(key, None)
                if span is None:
                    # Allocated before the trace started.
                    span = BufferSpan(buf, size, None, ts, label or None,
                                      stream)
                    spans.append(span)
                else:
                    span.end = ts
                    if label:
                        span.label = label
            else:
                span = live.get(key)
                if span is not None:
                    span.label = label or None
        else:
            continue
        found += 1
        t_first = ts if t_first is None else min(t_first, ts)
        t_last = ts if t_last is None else max(t_last, ts)
    if not found:
        raise MemvizError("no memory events in the trace (no \"memory\" "
                          "counters or alloc/release instants): was it "
                          "written by cubert, with buffers allocated while "
                          "it ran?")
    return MemoryTimeline(counters, spans, t_first, t_last)


def pack(buffers: Sequence[BufferSpan], t_first: float = 0.0,
         t_last: float | None = None) -> list[int]:
    """A byte offset for each buffer: at its start, the lowest offset
    where it fits between the buffers live then (first fit), so that no
    two buffers live at once overlap. Buffers without a start begin at
    t_first, without an end last past t_last."""
    end_inf = float("inf")
    order = sorted(range(len(buffers)),
                   key=lambda j: (buffers[j].start if buffers[j].start
                                  is not None else t_first, j))
    offsets = [0] * len(buffers)
    placed: list[tuple[int, int, float]] = []  # (offset, size, end), by offset
    for j in order:
        b = buffers[j]
        start = b.start if b.start is not None else t_first
        placed = [p for p in placed if p[2] > start]
        at = 0
        for off, size, _ in placed:
            if off - at >= b.bytes:
                break
            at = max(at, off + size)
        offsets[j] = at
        end = b.end if b.end is not None else end_inf
        placed.append((at, b.bytes, end))
        placed.sort()
    return offsets


def load_report(source: Any) -> dict:
    """A memory report: a dict (as json.loads gives it), JSON text (a str
    starting with "{" or "["), or a path to a file. `cubert memory --json` prints several JSON
    documents one after another (the report, its statistics; with --demo
    two of each): the first with "pools" is the one taken. Raises
    MemvizError when there is none."""
    if isinstance(source, dict):
        docs = [source]
        where = "report"
    else:
        if isinstance(source, os.PathLike) or (
                isinstance(source, str) and source.lstrip()[:1] not in ("{", "[")):
            where = os.fspath(source)
            with open(where, encoding="utf-8", errors="replace") as f:
                text = f.read()
        elif isinstance(source, str):
            where, text = "report", source
        else:
            raise TypeError("cubert.memviz: a report is a dict, a JSON "
                            f"string or a path, not {type(source).__name__}")
        docs = []
        dec = json.JSONDecoder()
        at = 0
        while True:
            while at < len(text) and text[at].isspace():
                at += 1
            if at >= len(text):
                break
            try:
                doc, at = dec.raw_decode(text, at)
            except json.JSONDecodeError as e:
                raise MemvizError(f"{where}: not a memory report: not JSON "
                                  f"({e.msg} at line {e.lineno}, column "
                                  f"{e.colno})") from None
            docs.append(doc)
    for doc in docs:
        if isinstance(doc, dict) and isinstance(doc.get("pools"), list):
            return doc
    raise MemvizError(f"{where}: not a memory report: no \"pools\" array "
                      "(expected `cubert memory --json` output or "
                      "Client.memory_report(\"json\"))")


def pool_occupancy(report: Mapping) -> list[tuple[str, int, int]]:
    """(name, bytes in use, bytes reserved) for each pool of a report, the
    name from its kind and size range."""
    out = []
    for i, p in enumerate(report.get("pools", [])):
        if not isinstance(p, dict):
            raise MemvizError(f"report: pool {i} is not an object")
        where = f"report: pool {i}"
        used = int(_number(p, "bytes_in_use", where))
        reserved = int(_number(p, "bytes_reserved", where))
        lo, hi = p.get("min_size"), p.get("max_size")
        size = ""
        if isinstance(lo, int) and isinstance(hi, int):
            size = f" {format_bytes(lo)}–{format_bytes(hi)}"
        out.append((f"{i}: {p.get('kind', '?')}{size}", used, reserved))
    return out


# --- drawing ----------------------------------------------------------------

_UNITS = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"]


def format_bytes(n: float) -> str:
    """`n` bytes in binary units: 512 B, 1.5 KiB, 2 GiB."""
    n = float(n)
    k = 0
    while abs(n) >= 1024 and k < len(_UNITS) - 1:
        n /= 1024
        k += 1
    return f"{n:.3g} {_UNITS[k]}" if k else f"{int(n)} B"


def _byte_scale(peak: float) -> tuple[float, str]:
    k = 0
    while peak >= 1024 * 2 and k < len(_UNITS) - 1:
        peak /= 1024
        k += 1
    return float(1024 ** k), _UNITS[k]


def _time_scale(span_us: float) -> tuple[float, str]:
    if span_us >= 2e6:
        return 1e6, "s"
    if span_us >= 2e3:
        return 1e3, "ms"
    return 1.0, "µs"


def _matplotlib():
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.collections import PolyCollection
        from matplotlib.figure import Figure
    except ImportError as e:
        raise ModuleNotFoundError(
            "cubert.memviz needs matplotlib to draw (reading a trace does "
            "not): install it, e.g. `apt-get install python3-matplotlib` "
            f"or `pip install matplotlib` ({e})", name="matplotlib") from None
    return Figure, FigureCanvasAgg, PolyCollection


def render(trace: Any, out_path: str | os.PathLike, report: Any = None, *,
           top: int = 10, title: str | None = None) -> MemoryTimeline:
    """Draws the memory of `trace` (a path, a list of events, an object
    with traceEvents, or a MemoryTimeline from parse) to `out_path` (PNG,
    or any format matplotlib writes, by the name's extension), with the
    pools of `report` (see load_report) when given. The `top` largest
    buffers are labelled. Returns the parsed timeline. Raises MemvizError
    for input that cannot be drawn, ModuleNotFoundError without
    matplotlib."""
    if top < 0:
        raise ValueError("cubert.memviz: top must be 0 or more")
    # Read everything first: bad input fails before anything is drawn.
    tl = trace if isinstance(trace, MemoryTimeline) else parse(
        load_trace(trace))
    pools = pool_occupancy(load_report(report)) if report is not None else None
    Figure, FigureCanvasAgg, PolyCollection = _matplotlib()

    span = max(tl.t_last - tl.t_first, 1e-3)
    tdiv, tunit = _time_scale(span)
    n = 2 + (pools is not None)
    fig = Figure(figsize=(11, 3.6 * n), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(n, 1, squeeze=False)[:, 0]
    fig.suptitle(title or "cubert memory")

    def t(x: float) -> float:
        return (x - tl.t_first) / tdiv

    # (a) reserved and live bytes per stream.
    ax = axes[0]
    peak = max([max(s.reserved + s.live, default=0)
                for s in tl.counters.values()], default=0)
    bdiv, bunit = _byte_scale(peak)
    colors = [f"C{k % 10}" for k in range(len(tl.counters))]
    for color, (name, s) in zip(colors, sorted(tl.counters.items())):
        xs = [t(x) for x in s.times] + [t(tl.t_last)]
        for ys, style, what in ((s.reserved, "-", "reserved"),
                                (s.live, "--", "live")):
            ax.step(xs, [y / bdiv for y in ys] + [ys[-1] / bdiv],
                    where="post", linestyle=style, color=color,
                    label=f"{name}: {what}")
    if tl.counters:
        ax.legend(loc="upper left", fontsize="small")
    else:
        ax.text(0.5, 0.5, "no memory counters in the trace",
                ha="center", va="center", transform=ax.transAxes)
    ax.set_title("reserved and live bytes per stream")
    ax.set_ylabel(bunit)
    ax.set_xlabel(f"time ({tunit})")
    ax.set_xlim(0, t(tl.t_last) or 1)
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)

    # (b) live buffers, packed.
    ax = axes[1]
    bufs = tl.buffers
    offsets = pack(bufs, tl.t_first, tl.t_last)
    top_peak = max((o + b.bytes for o, b in zip(offsets, bufs)), default=0)
    bdiv, bunit = _byte_scale(top_peak)
    verts, faces = [], []
    for k, (o, b) in enumerate(zip(offsets, bufs)):
        x0 = t(b.start if b.start is not None else tl.t_first)
        x1 = t(b.end if b.end is not None else tl.t_last)
        x1 = max(x1, x0 + span / tdiv * 1e-3)  # a visible sliver
        y0, y1 = o / bdiv, (o + b.bytes) / bdiv
        verts.append([(x0, y0), (x1, y0), (x1, y1), (x0, y1)])
        faces.append(f"C{k % 10}")
    if verts:
        # Outlines only while few: thousands of them would paint it black.
        ax.add_collection(PolyCollection(
            verts, facecolors=faces, edgecolors="black",
            linewidths=0.2 if len(verts) <= 500 else 0.0, alpha=0.8))
    def life(b: BufferSpan) -> float:
        return ((b.end if b.end is not None else tl.t_last) -
                (b.start if b.start is not None else tl.t_first))

    # Among equal sizes, labelled and longer-lived buffers first.
    largest = sorted(range(len(bufs)), key=lambda k: (
        -bufs[k].bytes, not bufs[k].label, -life(bufs[k]), k))[:top]
    for k in largest:
        b = bufs[k]
        if not b.bytes:
            continue
        x0 = t(b.start if b.start is not None else tl.t_first)
        x1 = t(b.end if b.end is not None else tl.t_last)
        text = b.label or b.buffer
        ax.text((x0 + x1) / 2, (offsets[k] + b.bytes / 2) / bdiv,
                f"{text} ({format_bytes(b.bytes)})", ha="center",
                va="center", fontsize="x-small", clip_on=True)
    ax.set_title(f"live buffers ({len(bufs)}, placed first-fit; the "
                 f"{min(top, len(bufs))} largest labelled)")
    ax.set_ylabel(bunit)
    ax.set_xlabel(f"time ({tunit})")
    ax.set_xlim(0, t(tl.t_last) or 1)
    ax.set_ylim(0, (top_peak / bdiv) * 1.05 or 1)
    ax.grid(True, alpha=0.3)

    # (c) the pools' occupancy.
    if pools is not None:
        ax = axes[2]
        peak = max([r for _, _, r in pools] + [u for _, u, _ in pools],
                   default=0)
        bdiv, bunit = _byte_scale(peak)
        ys = list(range(len(pools)))
        ax.barh(ys, [r / bdiv for _, _, r in pools], color="0.8",
                edgecolor="0.4", label="reserved")
        ax.barh(ys, [u / bdiv for _, u, _ in pools], height=0.5,
                color="C0", label="in use")
        ax.set_yticks(ys, [name for name, _, _ in pools], fontsize="small")
        ax.invert_yaxis()
        for y, (_, used, reserved) in zip(ys, pools):
            if reserved:
                ax.text(reserved / bdiv, y,
                        f" {format_bytes(used)} / {format_bytes(reserved)}",
                        va="center", fontsize="x-small")
        ax.set_title("pools: bytes in use and reserved")
        ax.set_xlabel(bunit)
        ax.set_xlim(0, (peak / bdiv) * 1.25 or 1)
        ax.legend(loc="lower right", fontsize="small")
        ax.grid(True, axis="x", alpha=0.3)

    fig.savefig(os.fspath(out_path), dpi=100)
    return tl


# --- the command ------------------------------------------------------------

def main(argv: Sequence[str] | None = None) -> int:
    """`python -m cubert.memviz`: 0 when drawn, 1 when the input cannot be
    drawn or matplotlib is missing, 2 for wrong arguments."""
    ap = argparse.ArgumentParser(
        prog="python -m cubert.memviz",
        description="Draws reserved and live memory over time, the live "
                    "buffers, and the pools' occupancy from a cubert trace "
                    "(CUBERT_TRACE=path).")
    ap.add_argument("trace", help="a trace written by cubert (JSON)")
    ap.add_argument("-o", "--output", default="memory.png",
                    help="the picture to write (default memory.png; the "
                         "extension picks the format)")
    ap.add_argument("-r", "--report",
                    help="a memory report: `cubert memory --json` output "
                         "or Client.memory_report(\"json\") saved")
    ap.add_argument("-n", "--top", type=int, default=10,
                    help="label the N largest buffers (default 10)")
    ap.add_argument("-t", "--title", help="the picture's title")
    args = ap.parse_args(argv)
    if args.top < 0:
        ap.error("--top must be 0 or more")
    try:
        tl = render(args.trace, args.output, args.report, top=args.top,
                    title=args.title)
    except (MemvizError, OSError, ModuleNotFoundError) as e:
        print(f"cubert.memviz: {e}", file=sys.stderr)
        return 1
    print(f"cubert.memviz: wrote {args.output} ({len(tl.counters)} "
          f"stream(s), {len(tl.buffers)} buffer(s))")
    return 0


if __name__ == "__main__":
    sys.exit(main())
