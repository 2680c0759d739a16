#!/usr/bin/env python3
"""PyTorch's CUDA caching allocator on the workloads of bench_memory, for
comparison with cubert's memory manager.

Usage: torch_trace_replay.py [TRACE]
       (default: bench/traces/training_step.trace of this repository)

Prints markdown table rows in bench_memory's format:
  (a) allocation hot path: torch.empty(n, dtype=torch.uint8, device='cuda')
      followed by `del`, for 256 B, 64 KiB and 1 MiB, served from the
      allocator's cache; ns per pair, the median over rounds of BATCH pairs,
      beside the same loop on device='cpu' (the loop and the dispatcher cost
      the same on both sides; Python's own cost per iteration is printed
      too). The two sides take turns round by round.
  (c) fragmentation: the trace replayed with torch.empty / del; the figure
      is peak torch.cuda.memory_reserved() ÷ peak
      torch.cuda.memory_allocated() (max_memory_reserved and
      max_memory_allocated after reset_peak_memory_stats). memory_allocated
      counts blocks as the allocator rounds them (multiples of 512 bytes),
      so the row also gives peak reserved ÷ peak live of the trace (the sum
      of requested sizes, which is what bench_memory divides by).
Nothing runs kernels on the buffers: only allocation is measured.
PYTORCH_CUDA_ALLOC_CONF (expandable_segments and the like) changes the
figures and is printed.

Without PyTorch or without a CUDA device it says so and exits with 0.
"""

import gc
import os
import statistics
import sys
import time

BATCH = 1000
ROUNDS = 201
WARMUP = 20
SIZES = (256, 64 << 10, 1 << 20)


def default_trace():
    here = os.path.dirname(os.path.abspath(__file__))
    return os.path.join(here, os.pardir, "traces", "training_step.trace")


def size_name(n):
    if n >= 1 << 20 and n % (1 << 20) == 0:
        return "%d MiB" % (n >> 20)
    if n >= 1024 and n % 1024 == 0:
        return "%d KiB" % (n >> 10)
    return "%d B" % n


def gib(n):
    return n / float(1 << 30)


def row(what, ours, peer, theirs, ratio, note=""):
    print("| %s | %s | %s | %s | %.3g%s |" % (what, ours, peer, theirs,
                                              ratio, note))


def table_header(ratio_label):
    print("| Benchmark | PyTorch | Peer | Peer value | %s |" % ratio_label)
    print("|---|---:|---|---:|---:|")


def load_trace(path):
    """[(is_free, id, bytes)] and the header comment."""
    ops = []
    header = ""
    with open(path) as f:
        for lineno, line in enumerate(f, 1):
            if line.startswith("#"):
                if not header:
                    header = line[1:].strip()
                continue
            parts = line.split()
            if not parts:
                continue
            if parts[0] == "a" and len(parts) == 3:
                ops.append((False, int(parts[1]), int(parts[2])))
            elif parts[0] == "f" and len(parts) == 2:
                ops.append((True, int(parts[1]), 0))
            else:
                raise ValueError("%s:%d: not 'a <id> <bytes>' or 'f <id>'"
                                 % (path, lineno))
    return ops, header


def pairs_ns(torch, device, size, n):
    empty, u8 = torch.empty, torch.uint8
    t0 = time.perf_counter_ns()
    for _ in range(n):
        x = empty(size, dtype=u8, device=device)
        del x
    return (time.perf_counter_ns() - t0) / n


def loop_ns(n):
    t0 = time.perf_counter_ns()
    for _ in range(n):
        x = None
        del x
    return (time.perf_counter_ns() - t0) / n


def bench_hot_path(torch):
    results = []
    for size in SIZES:
        gpu, cpu = [], []
        for r in range(-WARMUP, ROUNDS):
            d = {}
            for turn in range(2):
                who = (turn + r) % 2
                dev = "cuda" if who == 0 else "cpu"
                d[dev] = pairs_ns(torch, dev, size, BATCH)
            if r >= 0:
                gpu.append(d["cuda"])
                cpu.append(d["cpu"])
        results.append((size, statistics.median(gpu), statistics.median(cpu)))
    python = statistics.median(loop_ns(BATCH) for _ in range(ROUNDS))

    print("## (a) Allocation hot path: torch.empty + del on a cache hit, ns "
          "per pair, median of %d rounds of %d pairs (after %d warm-up "
          "rounds)\n" % (ROUNDS, BATCH, WARMUP))
    table_header("PyTorch ÷ peer")
    for size, g, c in results:
        sz = size_name(size)
        row("torch.empty + del, %s, device='cuda' (caching allocator)" % sz,
            "%.1f ns" % g, "torch.empty + del, %s, device='cpu'" % sz,
            "%.1f ns" % c, g / c)
    print("\nPython's own loop costs %.1f ns per iteration (included in "
          "both sides).\n" % python)


def bench_fragmentation(torch, path):
    ops, header = load_trace(path)
    torch.cuda.synchronize()
    gc.collect()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    base_reserved = torch.cuda.memory_reserved()
    base_allocated = torch.cuda.memory_allocated()

    # The peak of requested bytes, counted before the timed replay.
    sizes = {}
    live_bytes = peak_live = 0
    for is_free, bid, size in ops:
        if is_free:
            live_bytes -= sizes.pop(bid)
        else:
            sizes[bid] = size
            live_bytes += size
            peak_live = max(peak_live, live_bytes)

    live = {}
    empty, u8 = torch.empty, torch.uint8
    t0 = time.perf_counter_ns()
    for is_free, bid, size in ops:
        if is_free:
            del live[bid]
        else:
            live[bid] = empty(size, dtype=u8, device="cuda")
    elapsed = time.perf_counter_ns() - t0
    torch.cuda.synchronize()
    peak_reserved = torch.cuda.max_memory_reserved() - base_reserved
    peak_allocated = torch.cuda.max_memory_allocated() - base_allocated
    stats = torch.cuda.memory_stats()
    live.clear()
    gc.collect()
    torch.cuda.empty_cache()

    allocs = sum(1 for op in ops if not op[0])
    print("## (c) Fragmentation: %s replayed (%d ops, %d allocations, peak "
          "live %.3f GiB), peak reserved ÷ peak allocated\n"
          % (path, len(ops), allocs, gib(peak_live)))
    if header:
        print("Trace: `%s`\n" % header)
    table_header("PyTorch ÷ peer")
    ratio = peak_reserved / peak_allocated
    ratio_live = peak_reserved / peak_live
    row("PyTorch caching allocator",
        "%.3f (%.3f GiB reserved ÷ %.3f GiB allocated)"
        % (ratio, gib(peak_reserved), gib(peak_allocated)),
        "same replay: peak reserved ÷ peak live of the trace "
        "(requested bytes)",
        "%.3f (÷ %.3f GiB)" % (ratio_live, gib(peak_live)),
        ratio / ratio_live)
    print("\nReplay: %.0f ns per op (Python loop included); %d segments "
          "created (segment.all.allocated), %d allocation retries, %d "
          "OOMs.\n"
          % (elapsed / max(len(ops), 1),
             stats.get("segment.all.allocated", 0),
             stats.get("num_alloc_retries", 0), stats.get("num_ooms", 0)))


def main(argv):
    path = argv[1] if len(argv) > 1 else default_trace()
    try:
        import torch
    except ImportError:
        print("torch_trace_replay: PyTorch is not installed; nothing to "
              "measure.")
        return 0
    if not torch.cuda.is_available():
        print("torch_trace_replay: no CUDA device is present; nothing to "
              "measure.")
        return 0
    props = torch.cuda.get_device_properties(0)
    print("# PyTorch CUDA caching allocator, on bench_memory's workloads\n")
    print("- machine: %d online CPUs, GPU %s (%.1f GiB)"
          % (os.cpu_count() or 0, props.name, gib(props.total_memory)))
    print("- torch %s, CUDA %s, Python %s"
          % (torch.__version__, torch.version.cuda, sys.version.split()[0]))
    print("- PYTORCH_CUDA_ALLOC_CONF=%s\n"
          % os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "(unset)"))
    start = time.perf_counter()
    torch.empty(1, device="cuda")  # creates the context
    bench_fragmentation(torch, path)
    bench_hot_path(torch)
    print("torch_trace_replay: done in %.1f s" % (time.perf_counter() - start))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
