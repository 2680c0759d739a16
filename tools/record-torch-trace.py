#!/usr/bin/env python3
"""Records the GPU allocation traces of three PyTorch workloads and writes
them, gzip-compressed, in the format bench_memory replays
(bench/traces/gen_training_trace.py describes it: 'a <id> <bytes>' /
'f <id>').

Usage: tools/record-torch-trace.py [--out-dir DIR] [--steps N] [WORKLOAD...]
WORKLOAD: resnet50 (torchvision ResNet-50, batch 64, SGD, bf16 autocast),
gpt2 (transformers GPT2LMHeadModel of GPT-2 small's shape, batch 8 x 1024,
AdamW, bf16 autocast), gpt2_infer (the same model, inference at growing
sequence lengths 128..1024 and batch sizes 1, 4, 8); default: all three.
Needs a CUDA GPU, PyTorch, torchvision and transformers; nothing is
downloaded (random weights, synthetic data).

Each workload runs in a process of its own (a clean caching allocator)
with torch.cuda.memory._record_memory_history(); its snapshot's
device_traces give the trace: 'alloc' events become 'a', 'free_completed'
events 'f' (segment events are left out: they are the allocator's, not the
program's). Frees of memory allocated before the recording began are
dropped. Each run also prints PyTorch's own peak reserved and peak
allocated bytes, written into the trace's header line too, so the trace's
replay through cubert (bench_memory) and through PyTorch
(bench/gpu/torch_replay_trace.py) can be set beside the run itself.
Output: DIR/torch_<workload>.trace.gz (default DIR: bench/traces).
"""

import argparse
import gzip
import os
import subprocess
import sys
import time

WORKLOADS = ("resnet50", "gpt2", "gpt2_infer")


def run_resnet50(torch, steps):
    import torchvision

    model = torchvision.models.resnet50(weights=None).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()
    for _ in range(steps):
        x = torch.randn(64, 3, 224, 224, device="cuda")
        y = torch.randint(0, 1000, (64,), device="cuda")
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    return "torchvision ResNet-50, batch 64, SGD (momentum), bf16 autocast"


def gpt2_model(torch):
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(n_positions=1024, n_embd=768, n_layer=12, n_head=12,
                     vocab_size=50257)
    return GPT2LMHeadModel(cfg).cuda(), cfg


def run_gpt2(torch, steps):
    model, cfg = gpt2_model(torch)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for _ in range(steps):
        ids = torch.randint(0, cfg.vocab_size, (8, 1024), device="cuda")
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = model(input_ids=ids, labels=ids)
        out.loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    return ("transformers GPT2LMHeadModel (GPT-2 small: 12 layers, 768 "
            "wide, 12 heads), batch 8 x 1024, AdamW, bf16 autocast")


def run_gpt2_infer(torch, steps):
    model, cfg = gpt2_model(torch)
    model.eval()
    lengths = (128, 256, 384, 512, 640, 768, 896, 1024)
    with torch.inference_mode(), torch.autocast("cuda", dtype=torch.bfloat16):
        for _ in range(max(1, steps // 2)):
            for batch in (1, 4, 8):
                for n in lengths:
                    ids = torch.randint(0, cfg.vocab_size, (batch, n),
                                        device="cuda")
                    model(input_ids=ids, use_cache=False)
    torch.cuda.synchronize()
    return ("GPT-2 small inference, bf16 autocast, sequence lengths "
            "128..1024 by 128 at batch 1, 4 and 8")


def convert(snapshot, device):
    """'a'/'f' lines from the snapshot's trace of `device`."""
    traces = snapshot.get("device_traces", [])
    events = traces[device] if device < len(traces) else []
    ids = {}
    next_id = 1
    lines = []
    live = peak = 0
    sizes = {}
    for e in events:
        action = e.get("action")
        addr = e.get("addr")
        if action == "alloc":
            if addr in ids:
                # An alloc at a live address: the free was not seen.
                lines.append("f %d" % ids[addr])
                live -= sizes.pop(ids[addr])
            ids[addr] = next_id
            sizes[next_id] = e["size"]
            lines.append("a %d %d" % (next_id, e["size"]))
            live += e["size"]
            peak = max(peak, live)
            next_id += 1
        elif action == "free_completed":
            i = ids.pop(addr, None)
            if i is not None:
                lines.append("f %d" % i)
                live -= sizes.pop(i)
    return lines, next_id - 1, peak


def one(name, steps, out_dir):
    import torch

    if not torch.cuda.is_available():
        print("record-torch-trace: no CUDA device", file=sys.stderr)
        return 77
    device = torch.cuda.current_device()
    torch.manual_seed(0)
    torch.cuda.reset_peak_memory_stats()
    torch.cuda.memory._record_memory_history(max_entries=10_000_000)
    start = time.time()
    what = globals()["run_" + name](torch, steps)
    seconds = time.time() - start
    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    reserved = torch.cuda.max_memory_reserved()
    allocated = torch.cuda.max_memory_allocated()
    lines, allocs, peak_live = convert(snap, device)
    gpu = torch.cuda.get_device_name(device)
    header = ("# %s, %d steps, recorded with PyTorch %s on %s by "
              "tools/record-torch-trace.py: %d allocations; PyTorch peak "
              "reserved %d bytes, peak allocated %d bytes (%.4f); trace peak "
              "live %d bytes; format: 'a <id> <bytes>' / 'f <id>'"
              % (what, steps, torch.__version__, gpu, allocs, reserved,
                 allocated, reserved / max(allocated, 1), peak_live))
    path = os.path.join(out_dir, "torch_%s.trace.gz" % name)
    with gzip.open(path, "wt", compresslevel=9) as f:
        f.write(header + "\n")
        f.write("\n".join(lines))
        f.write("\n")
    print("%-11s %6d allocations in %5.1f s; PyTorch peak reserved %.3f GiB, "
          "peak allocated %.3f GiB, reserved / allocated %.4f -> %s"
          % (name, allocs, seconds, reserved / 2**30, allocated / 2**30,
             reserved / max(allocated, 1), path))
    sys.stdout.flush()
    return 0


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out-dir",
                    default=os.path.join(here, "..", "bench", "traces"))
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--one", help=argparse.SUPPRESS)
    ap.add_argument("workloads", nargs="*", default=list(WORKLOADS))
    a = ap.parse_args()
    os.makedirs(a.out_dir, exist_ok=True)
    if a.one:
        return one(a.one, a.steps, a.out_dir)
    rc = 0
    for w in a.workloads:
        if w not in WORKLOADS:
            print("record-torch-trace: unknown workload %s (one of %s)"
                  % (w, ", ".join(WORKLOADS)), file=sys.stderr)
            return 2
        r = subprocess.call([sys.executable, os.path.abspath(__file__),
                             "--one", w, "--steps", str(a.steps),
                             "--out-dir", a.out_dir])
        if r == 77:
            return 77
        rc = rc or r
    return rc


if __name__ == "__main__":
    sys.exit(main())
