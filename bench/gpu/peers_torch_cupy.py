#!/usr/bin/env python3
"""PyTorch and CuPy on one GPU: the figures that bench_cuda measures for
cubert and the raw driver, taken here for the two Python frameworks.

  (a) launch host cost of a tiny kernel: host time of the launch calls only
      (the sync between batches is not timed), median over batches, per
      launch. PyTorch: an in-place add on a 1-element tensor; CuPy: a
      RawKernel that does nothing with one int argument.
  (d) allocate + release on a pool hit: torch.empty(1 MiB of uint8) + del
      (the caching allocator); cupy.empty(1 MiB of uint8) + del (the default
      memory pool). Median over rounds, per pair.
  (c) graph replay per node: 100 tiny kernels captured into a graph
      (torch.cuda.CUDAGraph; CuPy's stream capture, where the installed
      version has it), replays closed by a sync, time / (replays * 100).

The ids match bench_cuda's (a1, d, c). Times are time.perf_counter_ns()
(a monotonic clock), from Python, so each figure includes the interpreter's
share of the call; the garbage collector is off while a loop is timed.

  python3 bench/gpu/peers_torch_cupy.py [--device N] [--json FILE]
                                        [--cubert-json BENCH_CUDA_JSON]

--cubert-json reads the JSON written by `bench_cuda --json` and adds
cubert's figure and the ratios cubert / PyTorch and cubert / CuPy.

Each framework is optional; the program exits 77 (skipped) when neither
can run on a GPU here.
"""

import argparse
import gc
import json
import math
import os
import platform
import statistics
import sys
import time

LAUNCH_BATCHES = 20
LAUNCH_BATCH = 2000
ALLOC_BYTES = 1 << 20
ALLOC_PAIRS = 1000
ALLOC_ROUNDS = 51
GRAPH_NODES = 100
GRAPH_REPLAYS = 20
GRAPH_ROUNDS = 30
WARM = 2

NAMES = {
    "a1": "launch host cost of a tiny kernel, median of %d batches of %d"
    % (LAUNCH_BATCHES, LAUNCH_BATCH),
    "d": "allocate + release 1 MiB on a pool hit, median of %d rounds of %d"
    % (ALLOC_ROUNDS, ALLOC_PAIRS),
    "c": "graph replay per node, %d tiny kernels per graph, %d replays + "
    "sync per round, median of %d"
    % (GRAPH_NODES, GRAPH_REPLAYS, GRAPH_ROUNDS),
}
UNITS = {"a1": ("µs/launch", "us/launch"), "d": ("ns/pair", "ns/pair"),
         "c": ("µs/node", "us/node")}
ORDER = ["a1", "d", "c"]


def timed_rounds(one_round, rounds, warm=WARM):
    """Runs one_round() warm + rounds times; returns the median of the
    nanoseconds it returned in the last `rounds` calls."""
    times = []
    enabled = gc.isenabled()
    gc.disable()
    try:
        for r in range(warm + rounds):
            t = one_round()
            if r >= warm:
                times.append(t)
    finally:
        if enabled:
            gc.enable()
    return statistics.median(times)


# --- PyTorch ---------------------------------------------------------------

def torch_figures(device):
    """Returns ({id: value or None}, {id: note}, info) or raises ImportError /
    RuntimeError when PyTorch cannot run on a GPU here."""
    import torch

    if not torch.cuda.is_available():
        raise RuntimeError("torch.cuda.is_available() is False")
    torch.cuda.set_device(device)
    dev = torch.device("cuda", device)
    sync = torch.cuda.synchronize
    out, notes = {}, {}

    # (a) x.add_(1) on a 1-element tensor.
    x = torch.zeros(1, device=dev)

    def launches():
        t0 = time.perf_counter_ns()
        for _ in range(LAUNCH_BATCH):
            x.add_(1)
        t = time.perf_counter_ns() - t0
        sync()
        return t

    out["a1"] = timed_rounds(launches, LAUNCH_BATCHES) / LAUNCH_BATCH / 1e3
    expected = float((WARM + LAUNCH_BATCHES) * LAUNCH_BATCH)
    if x.item() != expected:
        raise RuntimeError("torch: x = %r after the launches, expected %r"
                           % (x.item(), expected))
    notes["a1"] = "x.add_(1), x = torch.zeros(1) on the GPU"

    # (d) torch.empty + del through the caching allocator.
    def allocs():
        t0 = time.perf_counter_ns()
        for _ in range(ALLOC_PAIRS):
            t = torch.empty(ALLOC_BYTES, dtype=torch.uint8, device=dev)
            del t
        return time.perf_counter_ns() - t0

    out["d"] = timed_rounds(allocs, ALLOC_ROUNDS) / ALLOC_PAIRS
    notes["d"] = "torch.empty(1 MiB, uint8) + del (caching allocator)"

    # (c) CUDAGraph of 100 in-place adds.
    y = torch.zeros(1, device=dev)
    side = torch.cuda.Stream(device=dev)
    side.wait_stream(torch.cuda.current_stream(dev))
    with torch.cuda.stream(side):  # warm-up on a side stream before capture
        for _ in range(3):
            y.add_(1)
    torch.cuda.current_stream(dev).wait_stream(side)
    sync()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(GRAPH_NODES):
            y.add_(1)
    sync()
    base = y.item()

    def replays():
        t0 = time.perf_counter_ns()
        for _ in range(GRAPH_REPLAYS):
            graph.replay()
        sync()
        return time.perf_counter_ns() - t0

    out["c"] = timed_rounds(replays, GRAPH_ROUNDS) / (
        GRAPH_REPLAYS * GRAPH_NODES * 1e3)
    expected = base + float((WARM + GRAPH_ROUNDS) * GRAPH_REPLAYS *
                            GRAPH_NODES)
    if y.item() != expected:
        raise RuntimeError("torch: graph result %r, expected %r"
                           % (y.item(), expected))
    notes["c"] = "torch.cuda.CUDAGraph of 100 y.add_(1)"
    del graph
    info = {"version": torch.__version__,
            "gpu": torch.cuda.get_device_name(dev)}
    return out, notes, info


# --- CuPy ------------------------------------------------------------------

NOOP_SRC = r'''
extern "C" __global__ void noop(int n)
{
    (void)n;
}
'''


def cupy_figures(device):
    import cupy
    import numpy

    if cupy.cuda.runtime.getDeviceCount() < 1:
        raise RuntimeError("no CUDA device")
    cupy.cuda.Device(device).use()
    out, notes = {}, {}
    kernel = cupy.RawKernel(NOOP_SRC, "noop")
    arg = (numpy.int32(0),)
    grid, block = (1,), (1,)
    sync = cupy.cuda.Device(device).synchronize

    # (a) launch host cost.
    def launches():
        t0 = time.perf_counter_ns()
        for _ in range(LAUNCH_BATCH):
            kernel(grid, block, arg)
        t = time.perf_counter_ns() - t0
        sync()
        return t

    out["a1"] = timed_rounds(launches, LAUNCH_BATCHES) / LAUNCH_BATCH / 1e3
    notes["a1"] = "RawKernel noop(int), 1 block x 1 thread"

    # (d) cupy.empty + del through the default memory pool.
    def allocs():
        t0 = time.perf_counter_ns()
        for _ in range(ALLOC_PAIRS):
            t = cupy.empty(ALLOC_BYTES, dtype=cupy.uint8)
            del t
        return time.perf_counter_ns() - t0

    out["d"] = timed_rounds(allocs, ALLOC_ROUNDS) / ALLOC_PAIRS
    notes["d"] = "cupy.empty(1 MiB, uint8) + del (default memory pool)"

    # (c) stream capture, where this CuPy has it.
    stream = cupy.cuda.Stream(non_blocking=True)
    if not hasattr(stream, "begin_capture"):
        out["c"] = None
        notes["c"] = "n/a: CuPy %s has no stream capture" % cupy.__version__
    else:
        with stream:
            kernel(grid, block, arg)  # warm-up outside the capture
            stream.synchronize()
            stream.begin_capture()
            for _ in range(GRAPH_NODES):
                kernel(grid, block, arg)
            graph = stream.end_capture()

        def replays():
            t0 = time.perf_counter_ns()
            for _ in range(GRAPH_REPLAYS):
                graph.launch(stream)
            stream.synchronize()
            return time.perf_counter_ns() - t0

        out["c"] = timed_rounds(replays, GRAPH_ROUNDS) / (
            GRAPH_REPLAYS * GRAPH_NODES * 1e3)
        notes["c"] = "Stream.begin_capture / end_capture, Graph.launch"
    props = cupy.cuda.runtime.getDeviceProperties(device)
    name = props.get("name", b"")
    if isinstance(name, bytes):
        name = name.decode(errors="replace")
    info = {"version": cupy.__version__, "gpu": name}
    return out, notes, info


# --- output ----------------------------------------------------------------

def fmt(v):
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "n/a"
    if abs(v) >= 1000:
        return "%.0f" % v
    return "%.4g" % v


def ratio(a, b):
    if a is None or b is None or b == 0:
        return None
    return a / b


def load_cubert(path):
    with open(path) as f:
        data = json.load(f)
    return {m["id"]: m.get("cubert") for m in data.get("measurements", [])}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", type=int, default=0, help="GPU index")
    ap.add_argument("--json", metavar="FILE", help="also write JSON here")
    ap.add_argument("--cubert-json", metavar="FILE",
                    help="bench_cuda's JSON: add cubert's figures and ratios")
    args = ap.parse_args()

    frameworks = {}
    for key, fn in (("torch", torch_figures), ("cupy", cupy_figures)):
        try:
            figs, notes, info = fn(args.device)
            frameworks[key] = {"figures": figs, "notes": notes, "info": info,
                               "skipped": None}
        except ImportError as e:
            frameworks[key] = {"skipped": "not installed (%s)" % e}
        except Exception as e:  # a framework without a usable GPU
            frameworks[key] = {"skipped": "%s: %s" % (type(e).__name__, e)}

    if all(fw["skipped"] for fw in frameworks.values()):
        for key, fw in frameworks.items():
            print("peers_torch_cupy: %s: %s" % (key, fw["skipped"]))
        print("peers_torch_cupy: skipped (neither PyTorch nor CuPy can use "
              "a GPU here)")
        return 77

    cubert = load_cubert(args.cubert_json) if args.cubert_json else {}
    labels = {"torch": "PyTorch", "cupy": "CuPy"}
    gpu = next(fw["info"]["gpu"] for fw in frameworks.values()
               if not fw["skipped"])

    print("# PyTorch and CuPy beside bench_cuda\n")
    print("- GPU %d: %s" % (args.device, gpu))
    print("- host: %d online CPUs, %s; Python %s"
          % (os.cpu_count() or 0, platform.processor() or platform.machine(),
             platform.python_version()))
    for key, fw in frameworks.items():
        if fw["skipped"]:
            print("- %s: not measured: %s" % (labels[key], fw["skipped"]))
        else:
            print("- %s %s" % (labels[key], fw["info"]["version"]))
    if args.cubert_json:
        print("- cubert: figures read from %s" % args.cubert_json)
    print()

    rows = []
    for mid in ORDER:
        unit, unit_json = UNITS[mid]
        row = {"id": mid, "name": NAMES[mid], "unit": unit_json}
        print("[%s] %s" % (mid, NAMES[mid]))
        for key in ("torch", "cupy"):
            fw = frameworks[key]
            v = None if fw["skipped"] else fw["figures"].get(mid)
            note = fw["skipped"] if fw["skipped"] else fw["notes"].get(mid)
            row[key] = v
            row[key + "_note"] = note
            print("    %-10s %s %s  (%s)"
                  % (labels[key], fmt(v), unit if v is not None else "", note))
        if args.cubert_json:
            c = cubert.get(mid)
            row["cubert"] = c
            row["cubert_over_torch"] = ratio(c, row["torch"])
            row["cubert_over_cupy"] = ratio(c, row["cupy"])
            print("    %-10s %s %s" % ("cubert", fmt(c), unit))
            print("    ratio      %s (cubert / PyTorch), %s (cubert / CuPy)"
                  % (fmt(row["cubert_over_torch"]),
                     fmt(row["cubert_over_cupy"])))
        rows.append(row)
        sys.stdout.flush()

    print()
    if args.cubert_json:
        print("| | Measurement | PyTorch | CuPy | cubert | cubert ÷ PyTorch "
              "| cubert ÷ CuPy |")
        print("|---|---|---:|---:|---:|---:|---:|")
    else:
        print("| | Measurement | PyTorch | CuPy |")
        print("|---|---|---:|---:|")
    for row in rows:
        unit = UNITS[row["id"]][0]
        cells = ["%s %s" % (fmt(row[k]), unit) if row[k] is not None
                 else "n/a" for k in ("torch", "cupy")]
        line = "| %s | %s | %s | %s |" % (row["id"], row["name"], cells[0],
                                          cells[1])
        if args.cubert_json:
            c = row["cubert"]
            line += " %s | %s | %s |" % (
                "%s %s" % (fmt(c), unit) if c is not None else "n/a",
                fmt(row["cubert_over_torch"]), fmt(row["cubert_over_cupy"]))
        print(line)

    if args.json:
        doc = {
            "benchmark": "peers_torch_cupy",
            "gpu": gpu,
            "device_index": args.device,
            "python": platform.python_version(),
            "frameworks": {
                key: ({"skipped": fw["skipped"]} if fw["skipped"] else
                      {"version": fw["info"]["version"]})
                for key, fw in frameworks.items()
            },
            "measurements": rows,
        }
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=2, ensure_ascii=False)
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
