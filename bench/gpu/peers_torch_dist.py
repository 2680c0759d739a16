#!/usr/bin/env python3
"""torch.distributed's all_reduce beside cubert's, on the GPUs of one machine.

Starts one process per GPU (torch.multiprocessing), makes the NCCL process
group over them (init_method tcp://127.0.0.1, as a launcher would), and
times dist.all_reduce of float32 tensors from 1 KiB to 1 GiB: a warm-up
call, then calls issued back to back and one torch.cuda.synchronize(), per
call. Prints the time, the algorithm bandwidth (bytes / time) and the bus
bandwidth (2 (n - 1) / n of it, as NCCL's tests print).

  NCCL_NVLS_ENABLE=0 python3 bench/gpu/peers_torch_dist.py [--gpus N]
      [--json FILE] [--cubert-json BENCH_COMM_CUDA_JSON]

--cubert-json reads the JSON `bench_comm_cuda --json` wrote (cubert and raw
NCCL in one process, one rank) and adds cubert's time per call in place
(torch's all_reduce is in place) and the ratio torch / cubert at each
size. Exits 77 when torch or a GPU is missing.
"""

import argparse
import json
import os
import sys
import time

from torch_ranks import run_ranks

SIZES = [1024 * 4**k for k in range(11)]  # 1 KiB .. 1 GiB


def iterations(size):
    n = 200_000_000_000 // (size + 20_000_000)
    return max(20, min(2000, n))


def worker(rank, world, port, queue):
    import torch
    import torch.distributed as dist

    torch.cuda.set_device(rank)
    dist.init_process_group(
        "nccl",
        init_method=f"tcp://127.0.0.1:{port}",
        world_size=world,
        rank=rank,
        device_id=torch.device("cuda", rank),
    )
    results = []
    for size in SIZES:
        x = torch.ones(size // 4, dtype=torch.float32, device="cuda")
        iters = iterations(size)
        dist.all_reduce(x)
        torch.cuda.synchronize()
        dist.barrier()
        t0 = time.perf_counter_ns()
        for _ in range(iters):
            dist.all_reduce(x)
        torch.cuda.synchronize()
        t1 = time.perf_counter_ns()
        results.append({"bytes": size, "iterations": iters,
                        "torch_us": (t1 - t0) / iters / 1e3})
        del x
    if rank == 0:
        queue.put(results)
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpus", type=int, default=0)
    ap.add_argument("--json")
    ap.add_argument("--cubert-json")
    args = ap.parse_args()
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    try:
        import torch
    except ImportError as e:
        print(f"peers_torch_dist: no torch: {e}")
        return 77
    if not torch.cuda.is_available():
        print("peers_torch_dist: no GPU")
        return 77
    world = args.gpus or torch.cuda.device_count()
    results, codes = run_ranks(worker, world)
    if any(codes) or results is None:
        print(f"peers_torch_dist: a rank exited with {codes}")
        return 1
    ours = {}
    if args.cubert_json:
        with open(args.cubert_json) as f:
            for row in json.load(f)["all_reduce"]:
                # torch reduces in place: the matching figure of cubert's
                ours[row["bytes"]] = row.get("cubert_in_place_us",
                                             row["cubert_us"])
    print(f"torch {torch.__version__}, dist.all_reduce over {world} GPU(s)")
    print(f"{'bytes':>12} {'torch us':>10} {'busbw GB/s':>11} "
          f"{'cubert us':>10} {'torch/cubert':>13}")
    for row in results:
        size, t = row["bytes"], row["torch_us"]
        bus = size / t / 1e3 * 2 * (world - 1) / world
        c = ours.get(size)
        row["cubert_us"] = c
        print(f"{size:>12} {t:>10.2f} {bus:>11.1f} "
              f"{c if c is not None else float('nan'):>10.2f} "
              f"{(t / c) if c else float('nan'):>13.3f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"gpus": world, "all_reduce": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
