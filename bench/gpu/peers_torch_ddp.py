#!/usr/bin/env python3
"""PyTorch DistributedDataParallel beside bench_ddp_mlp: the same
data-parallel training step of a small MLP on the GPUs of one machine.

The model is bench_ddp_mlp's: Linear(D, H), ReLU, Linear(H, O), mean
squared error against a synthetic target, SGD; every rank holds a batch of
B rows of its own (the per-rank batch, as in the C program; the data and
the initial weights are drawn differently, the shapes are the same). One
process per GPU (torch.multiprocessing), the NCCL process group made over
tcp://127.0.0.1 as a launcher would, the model wrapped in
torch.nn.parallel.DistributedDataParallel with its defaults (its gradient
buckets of 25 MiB hold every gradient of the default sizes in one). A step
is zero_grad, forward, loss, backward (DDP all-reduces the gradients, as
they are ready, averaged over the ranks) and the optimizer's step. W
warm-up steps, a barrier, then S steps and torch.cuda.synchronize();
steps per second from the slowest rank's time.

  NCCL_NVLS_ENABLE=0 python3 bench/gpu/peers_torch_ddp.py [--gpus N]
      [--steps S] [--warmup W] [--batch B] [--in D] [--hidden H]
      [--out O] [--lr LR] [--json FILE] [--cubert-json BENCH_DDP_MLP_JSON]

--cubert-json reads the JSON `bench_ddp_mlp --json` wrote: the sizes, the
rank count and the step counts default to its own, and the ratio cubert /
torch is printed for each of its modes (eager launches, replayed graphs);
above 1 cubert takes more steps per second. Without it the defaults are
bench_ddp_mlp's on CUDA: every GPU, S 1000, W 20, B 64, D 256, H 1024,
O 256, LR 0.05. Exits 77 when torch or enough GPUs are missing; one GPU
(a world of one) works too.
"""

import argparse
import json
import os
import sys
import time

from torch_ranks import run_ranks

DEFAULTS = {"steps": 1000, "warmup": 20, "batch": 64, "in": 256,
            "hidden": 1024, "out": 256, "lr": 0.05}


def worker(rank, world, port, cfg, queue):
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    torch.cuda.set_device(rank)
    dev = torch.device("cuda", rank)
    dist.init_process_group(
        "nccl",
        init_method=f"tcp://127.0.0.1:{port}",
        world_size=world,
        rank=rank,
        device_id=dev,
    )
    b, d, h, o = cfg["batch"], cfg["in"], cfg["hidden"], cfg["out"]
    # The same initial weights on every rank (DDP also broadcasts rank
    # 0's when it wraps the model).
    torch.manual_seed(12345)
    model = torch.nn.Sequential(
        torch.nn.Linear(d, h), torch.nn.ReLU(), torch.nn.Linear(h, o)
    ).to(dev)
    ddp = DistributedDataParallel(model, device_ids=[rank])
    opt = torch.optim.SGD(ddp.parameters(), lr=cfg["lr"])
    loss_fn = torch.nn.MSELoss()
    # This rank's shard, in [-1, 1) as the C program's.
    gen = torch.Generator(device=dev)
    gen.manual_seed(1000 + rank)
    x = torch.rand(b, d, device=dev, generator=gen) * 2 - 1
    t = torch.rand(b, o, device=dev, generator=gen) * 2 - 1

    def step():
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(ddp(x), t)
        loss.backward()
        opt.step()
        return loss

    loss = None
    for _ in range(cfg["warmup"]):
        loss = step()
    torch.cuda.synchronize()
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(cfg["steps"]):
        loss = step()
    torch.cuda.synchronize()
    seconds = torch.tensor([time.perf_counter() - t0], device=dev)
    # The slowest rank's time, as the C program's barrier after the last
    # step measures it.
    dist.all_reduce(seconds, op=dist.ReduceOp.MAX)
    if rank == 0:
        queue.put({"seconds": seconds.item(), "loss": loss.item()})
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpus", type=int, default=0)
    for key in DEFAULTS:
        ap.add_argument("--" + key, type=type(DEFAULTS[key]), default=None)
    ap.add_argument("--json")
    ap.add_argument("--cubert-json")
    args = ap.parse_args()
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    ours = None
    if args.cubert_json:
        with open(args.cubert_json) as f:
            ours = json.load(f)
        if ours.get("backend") != "cuda":
            print(f"peers_torch_ddp: {args.cubert_json} was measured on "
                  f"{ours.get('backend')}, not cuda")
    cfg = {}
    for key, value in DEFAULTS.items():
        given = getattr(args, key)
        if given is not None:
            cfg[key] = given
        elif ours is not None and key in ours:
            cfg[key] = type(value)(ours[key])
        else:
            cfg[key] = value
    try:
        import torch
    except ImportError as e:
        print(f"peers_torch_ddp: no torch: {e}")
        return 77
    if not torch.cuda.is_available():
        print("peers_torch_ddp: no GPU")
        return 77
    world = args.gpus or (ours["ranks"] if ours else 0) or \
        torch.cuda.device_count()
    if world > torch.cuda.device_count():
        print(f"peers_torch_ddp: {world} ranks, "
              f"{torch.cuda.device_count()} GPU(s)")
        return 77
    res, codes = run_ranks(worker, world, cfg)
    if any(codes) or res is None:
        print(f"peers_torch_ddp: a rank exited with {codes}")
        return 1
    sps = cfg["steps"] / res["seconds"]
    params = cfg["in"] * cfg["hidden"] + cfg["hidden"] + \
        cfg["hidden"] * cfg["out"] + cfg["out"]
    print(f"torch {torch.__version__}, DDP over {world} GPU(s): MLP "
          f"{cfg['in']}-{cfg['hidden']}-{cfg['out']}, batch {cfg['batch']} "
          f"per rank, {params} parameters")
    print(f"{'torch DDP':<14} {sps:10.1f} steps/s {1e3 / sps:9.3f} ms/step "
          f"({cfg['steps']} steps after {cfg['warmup']} warm-up, "
          f"loss {res['loss']:.4g})")
    out = {"gpus": world, "torch": torch.__version__, **cfg,
           "params": params, "ddp_steps_per_s": sps, "loss": res["loss"]}
    if ours:
        same = all(ours.get(k) == cfg[k]
                   for k in ("batch", "in", "hidden", "out")) and \
            ours.get("ranks") == world
        if not same:
            print("peers_torch_ddp: the cubert run had other sizes or ranks")
        for mode in ("eager", "graph"):
            theirs = ours.get(f"{mode}_steps_per_s")
            if not theirs:
                continue
            ratio = theirs / sps
            print(f"{'cubert ' + mode:<14} {theirs:10.1f} steps/s "
                  f"{1e3 / theirs:9.3f} ms/step  cubert/torch {ratio:.3f}")
            out[f"cubert_{mode}_steps_per_s"] = theirs
            out[f"{mode}_ratio"] = ratio
        out["same_shapes"] = same
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
