"""One process per GPU for the PyTorch peers (peers_torch_dist.py,
peers_torch_ddp.py): a free TCP port for the process group's
init_method, and the ranks spawned, joined and heard from."""

import socket


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(worker, world, *args):
    """Runs worker(rank, world, port, *args, queue) in `world` spawned
    processes. Returns (what the first rank put on the queue, or None;
    every process's exit code)."""
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    port = free_port()
    procs = [ctx.Process(target=worker, args=(r, world, port, *args, queue))
             for r in range(world)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    result = None if queue.empty() else queue.get()
    return result, [p.exitcode for p in procs]
