#!/usr/bin/env python3
"""Replays allocation traces through PyTorch's CUDA caching allocator, the
peer of bench_memory's replay through cubert's presets on the same traces.

Usage: bench/gpu/torch_replay_trace.py [--json FILE] TRACE...
TRACE: a trace in bench_memory's format ('a <id> <bytes>' / 'f <id>'),
plain or .gz. For each trace, two processes of their own replay it: one
with PyTorch's default allocator settings and one with
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True. A replay makes
torch.empty(bytes, dtype=torch.uint8) on the GPU at each 'a' and drops
the tensor at each 'f', in order, on one stream; nothing is written. It
prints PyTorch's peak reserved and peak allocated bytes and the trace's
peak live bytes (the sum of requested sizes, bench_memory's
denominator), with peak reserved / peak live as the figure to set beside
bench_memory's rows. Exits 77 without a CUDA device.
"""

import argparse
import gzip
import json
import os
import subprocess
import sys

SETTINGS = (("default", None), ("expandable_segments",
                                "expandable_segments:True"))


def read_ops(path):
    opener = gzip.open if path.endswith(".gz") else open
    ops = []
    with opener(path, "rt") as f:
        for line in f:
            if not line.strip() or line.startswith("#"):
                continue
            parts = line.split()
            if parts[0] == "a":
                ops.append((int(parts[1]), int(parts[2])))
            else:
                ops.append((int(parts[1]), 0))
    return ops


def replay(path):
    import torch

    if not torch.cuda.is_available():
        return 77
    ops = read_ops(path)
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_reserved()
    live = {}
    live_bytes = peak_live = 0
    for i, size in ops:
        if size:
            live[i] = torch.empty(size, dtype=torch.uint8, device="cuda")
            live_bytes += size
            peak_live = max(peak_live, live_bytes)
        else:
            t = live.pop(i, None)
            if t is not None:
                live_bytes -= t.numel()
                del t
    torch.cuda.synchronize()
    out = {
        "peak_reserved": torch.cuda.max_memory_reserved() - base,
        "peak_allocated": torch.cuda.max_memory_allocated(),
        "peak_live": peak_live,
        "ops": len(ops),
    }
    print(json.dumps(out))
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("traces", nargs="*")
    a = ap.parse_args()
    if a.child:
        return replay(a.child)
    if not a.traces:
        ap.error("name at least one trace")
    rows = []
    print("| Trace | PyTorch allocator | Peak live (GiB) | Peak reserved "
          "(GiB) | Peak allocated (GiB) | Reserved / live | Reserved / "
          "allocated |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for path in a.traces:
        for name, conf in SETTINGS:
            env = dict(os.environ)
            env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
            if conf:
                env["PYTORCH_CUDA_ALLOC_CONF"] = conf
            p = subprocess.run([sys.executable, os.path.abspath(__file__),
                                "--child", path], env=env,
                               stdout=subprocess.PIPE, text=True)
            if p.returncode == 77:
                print("torch_replay_trace: no CUDA device", file=sys.stderr)
                return 77
            if p.returncode != 0:
                print("torch_replay_trace: the replay of %s (%s) failed"
                      % (path, name), file=sys.stderr)
                return 1
            r = json.loads(p.stdout.strip().splitlines()[-1])
            r.update(trace=os.path.basename(path), allocator=name)
            rows.append(r)
            g = 2.0 ** 30
            print("| %s | %s | %.3f | %.3f | %.3f | %.4f | %.4f |"
                  % (r["trace"], name, r["peak_live"] / g,
                     r["peak_reserved"] / g, r["peak_allocated"] / g,
                     r["peak_reserved"] / max(r["peak_live"], 1),
                     r["peak_reserved"] / max(r["peak_allocated"], 1)))
            sys.stdout.flush()
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
