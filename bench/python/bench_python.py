"""cubert from Python, beside its peers in the same run.

Launch overhead: a one-cube kernel launched from Python N times and
waited for once, per call, beside CuPy's RawKernel and a one-element
PyTorch in-place add (CUDA), or beside a one-element NumPy in-place add and
PyTorch on the CPU (the CPU has no peer that launches kernels from
Python). DLPack: a cubert buffer handed to PyTorch and a PyTorch tensor
taken in by cubert, beside torch.from_dlpack(cupy array) and
cupy.from_dlpack(torch tensor), then each direction alone. Wrapping: Client.wrap plus release of an
existing array. Rounds alternate between the contenders; each figure is
the median of the rounds, and every kernel's result is checked.

Usage: python3 bench/python/bench_python.py [--device cpu|cuda] [--json F]
(PYTHONPATH must reach the cubert package: build/python, or pip install .)
"""

import argparse
import json
import statistics
import sys
import time

import numpy as np

import cubert

ROUNDS = 15
CALLS = 2000

KERNEL = """
CUBE_KERNEL(bump, CUBE_INOUT(float, x))
{
    if (ABSOLUTE_POS_X == 0)
        CUBE_AT(x, 0) = CUBE_AT(x, 0) + 1.0f;
}
"""


def per_call_us(fn, done, calls=CALLS):
    """Microseconds per call of `fn`, `calls` calls then one `done()`."""
    done()
    t0 = time.perf_counter_ns()
    for _ in range(calls):
        fn()
    done()
    return (time.perf_counter_ns() - t0) / calls / 1000.0


def race(contenders, rounds=ROUNDS):
    """Median per-call microseconds of each (name, fn, done), alternating
    rounds so drifts hit every contender alike."""
    samples = {name: [] for name, _, _ in contenders}
    for name, fn, done in contenders:  # warm up (compiles, caches)
        per_call_us(fn, done, calls=50)
    for _ in range(rounds):
        for name, fn, done in contenders:
            samples[name].append(per_call_us(fn, done))
    return {name: statistics.median(v) for name, v in samples.items()}


def launch_contenders(device):
    client = cubert.Client(device)
    kernel = cubert.Kernel(KERNEL, "bump", cube_dim=(1,))
    buf = client.asarray(np.zeros(1, np.float32))
    count = [0]

    def cubert_launch():
        client.launch(kernel, 1, buf)
        count[0] += 1

    contenders = [("cubert", cubert_launch, client.sync)]
    checks = [("cubert", lambda: float(buf.numpy()[0]), count)]

    if device == "cuda":
        try:
            import cupy
            raw = cupy.RawKernel(
                r'extern "C" __global__ void bump(float *x)'
                r'{ if (threadIdx.x == 0 && blockIdx.x == 0) x[0] += 1.0f; }',
                "bump")
            cx = cupy.zeros(1, cupy.float32)
            ccount = [0]

            def cupy_launch():
                raw((1,), (1,), (cx,))
                ccount[0] += 1

            contenders.append(("cupy RawKernel", cupy_launch,
                               cupy.cuda.Device().synchronize))
            checks.append(("cupy RawKernel", lambda: float(cx[0]), ccount))
        except ImportError:
            pass
    try:
        import torch
        dev = "cuda" if device == "cuda" else "cpu"
        tx = torch.zeros(1, dtype=torch.float32, device=dev)
        tcount = [0]

        def torch_add():
            tx.add_(1.0)
            tcount[0] += 1

        sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
        contenders.append(("torch add_", torch_add, sync))
        checks.append(("torch add_", lambda: float(tx[0]), tcount))
    except ImportError:
        pass
    if device != "cuda":
        nx = np.zeros(1, np.float32)
        ncount = [0]

        def numpy_add():
            np.add(nx, 1.0, out=nx)
            ncount[0] += 1

        contenders.append(("numpy add", numpy_add, lambda: None))
        checks.append(("numpy add", lambda: float(nx[0]), ncount))
    return client, contenders, checks


def dlpack_contenders(client, device):
    """Export + import through DLPack, with nothing copied."""
    out = []
    try:
        import torch
    except ImportError:
        torch = None
    dev = "cuda" if device == "cuda" else "cpu"
    buf = client.asarray(np.arange(256, dtype=np.float32))
    if torch is not None:
        t = torch.arange(256, dtype=torch.float32, device=dev)

        def cubert_round_trip():
            a = torch.from_dlpack(buf)     # cubert -> torch
            b = client.from_dlpack(t)      # torch -> cubert
            del a
            b.release()

        out.append(("cubert<->torch", cubert_round_trip))
        if device == "cuda":
            try:
                import cupy
                c = cupy.arange(256, dtype=cupy.float32)

                def cupy_round_trip():
                    a = torch.from_dlpack(c)   # cupy -> torch
                    b = cupy.from_dlpack(t)    # torch -> cupy
                    del a, b

                out.append(("cupy<->torch", cupy_round_trip))
            except ImportError:
                pass
    if device != "cuda":
        arr = np.arange(256, dtype=np.float32)

        def cubert_numpy():
            a = np.from_dlpack(buf)
            b = client.from_dlpack(arr)
            del a
            b.release()

        def numpy_numpy():
            a = np.from_dlpack(arr)
            b = np.from_dlpack(arr)
            del a, b

        out.append(("cubert<->numpy", cubert_numpy))
        out.append(("numpy<->numpy", numpy_numpy))
    return [(name, fn, lambda: None) for name, fn in out]


def dlpack_halves(client, device):
    """The round trip's two directions apart (CUDA, with torch and CuPy):
    a buffer to torch beside a CuPy array to torch, and a torch tensor
    into cubert (then released) beside the same into CuPy."""
    if device != "cuda":
        return []
    try:
        import cupy
        import torch
    except ImportError:
        return []
    buf = client.asarray(np.arange(256, dtype=np.float32))
    c = cupy.arange(256, dtype=cupy.float32)
    t = torch.arange(256, dtype=torch.float32, device="cuda")

    def to_torch():
        torch.from_dlpack(buf)

    def cupy_to_torch():
        torch.from_dlpack(c)

    def from_torch():
        client.from_dlpack(t).release()

    def torch_to_cupy():
        cupy.from_dlpack(t)

    out = [("cubert->torch", to_torch), ("cupy->torch", cupy_to_torch),
           ("torch->cubert", from_torch), ("torch->cupy", torch_to_cupy)]
    return [(name, fn, lambda: None) for name, fn in out]


def wrap_contenders(client, device):
    if device == "cuda":
        try:
            import torch
        except ImportError:
            return []
        obj = torch.zeros(1024, dtype=torch.float32, device="cuda")
    else:
        obj = np.zeros(1024, np.float32)

    def wrap_release():
        client.wrap(obj).release()

    return [("cubert wrap+release", wrap_release, lambda: None)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--json")
    args = ap.parse_args()
    results = {"device": args.device, "calls": CALLS, "rounds": ROUNDS}

    client, contenders, checks = launch_contenders(args.device)
    launch = race(contenders)
    for name, value, count in checks:
        got, want = value(), float(count[0])
        if got != want:
            print(f"FAIL {name}: {got} after {want:.0f} increments")
            return 1
    results["launch_us"] = launch
    print(f"launch of a one-cube kernel from Python, {args.device} "
          f"(us per call, median of {ROUNDS} rounds of {CALLS}):")
    for name, us in launch.items():
        ratio = launch["cubert"] / us
        print(f"  {name:16s} {us:8.3f}  cubert/this {ratio:5.2f}")

    dl = race(dlpack_contenders(client, args.device))
    results["dlpack_round_trip_us"] = dl
    if dl:
        print(f"DLPack export + import round trip (us, median of {ROUNDS} "
              f"rounds of {CALLS}):")
        ours = [v for k, v in dl.items() if k.startswith("cubert")][0]
        for name, us in dl.items():
            print(f"  {name:16s} {us:8.3f}  cubert/this {ours / us:5.2f}")
    halves = race(dlpack_halves(client, args.device))
    results["dlpack_halves_us"] = halves
    if halves:
        print("DLPack, each direction alone (us):")
        for ours, peer in (("cubert->torch", "cupy->torch"),
                           ("torch->cubert", "torch->cupy")):
            for name in (ours, peer):
                print(f"  {name:16s} {halves[name]:8.3f}  cubert/this "
                      f"{halves[ours] / halves[name]:5.2f}")
    wr = race(wrap_contenders(client, args.device), rounds=7)
    results["wrap_us"] = wr
    for name, us in wr.items():
        print(f"  {name:16s} {us:8.3f} us")
    client.close()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
