"""One matmul task on a real GPU (torch, else cupy); run by ``gpusim.workload`` per task.

Logs the same events as the simulated task on stdout, except ``task_end``: a CUDA context
lives until its process exits, so the parent logs the end when this process has gone.
Host matrices are made before ``task_start``: that is host work, not GPU work.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import Any

from gpuguard.gpusim.workload import EXIT_FAILED, EXIT_OUT_OF_MEMORY, EventLog


def _torch_task(torch: Any, size: int, device: int, log: EventLog, run: int) -> None:
    host = [torch.rand(size, size, dtype=torch.float32).pin_memory() for _ in range(2)]
    log.event("task_start", run)
    dev = torch.device("cuda", device)
    torch.cuda.set_device(dev)
    torch.zeros(1, device=dev)  # the first CUDA op creates the context
    torch.cuda.synchronize(dev)
    log.event("context_created", run, device=device)
    a, b, c = (torch.empty(size, size, dtype=torch.float32, device=dev) for _ in range(3))
    torch.cuda.synchronize(dev)
    log.event("input_start", run, bytes=2 * size * size * 4)
    a.copy_(host[0])
    b.copy_(host[1])
    torch.cuda.synchronize(dev)
    log.event("input_end", run)
    log.event("kernel_start", run)
    torch.mm(a, b, out=c)
    torch.cuda.synchronize(dev)
    log.event("kernel_end", run)
    log.event("output_start", run, bytes=size * size * 4)
    c.cpu()
    torch.cuda.synchronize(dev)
    log.event("output_end", run)
    del a, b, c
    torch.cuda.empty_cache()
    log.event("freed", run)


def _cupy_task(cp: Any, size: int, device: int, log: EventLog, run: int) -> None:
    import numpy as np

    host = [np.random.rand(size, size).astype(np.float32) for _ in range(2)]
    log.event("task_start", run)
    with cp.cuda.Device(device) as dev:
        cp.zeros(1)  # the first CUDA op creates the context
        dev.synchronize()
        log.event("context_created", run, device=device)
        a, b, c = (cp.empty((size, size), dtype=cp.float32) for _ in range(3))
        dev.synchronize()
        log.event("input_start", run, bytes=2 * size * size * 4)
        a.set(host[0])
        b.set(host[1])
        dev.synchronize()
        log.event("input_end", run)
        log.event("kernel_start", run)
        cp.matmul(a, b, out=c)
        dev.synchronize()
        log.event("kernel_end", run)
        log.event("output_start", run, bytes=size * size * 4)
        c.get()
        dev.synchronize()
        log.event("output_end", run)
        del a, b, c
        cp.get_default_memory_pool().free_all_blocks()
        log.event("freed", run)


def main(argv: Sequence[str] | None = None) -> int:
    """Run one task; exit 3 on CUDA out-of-memory, 1 when no CUDA library is usable."""
    parser = argparse.ArgumentParser(prog="python -m gpuguard.gpusim.cuda_task")
    parser.add_argument("--size", type=int, required=True)
    parser.add_argument("--device", type=int, default=0)
    parser.add_argument("--run", type=int, default=0)
    args = parser.parse_args(argv)
    log = EventLog(sys.stdout, args.size)
    task: Callable[[Any, int, int, EventLog, int], None]
    try:
        import torch

        task, lib = _torch_task, torch
        oom: type[BaseException] = torch.cuda.OutOfMemoryError
    except ImportError:
        try:
            import cupy

            task, lib = _cupy_task, cupy
            oom = cupy.cuda.memory.OutOfMemoryError
        except ImportError:
            log.event("error", args.run, error="no_cuda", message="neither torch nor cupy")
            return EXIT_FAILED
    try:
        task(lib, args.size, args.device, log, args.run)
    except oom as exc:
        log.event("error", args.run, error="out_of_memory", message=str(exc))
        return EXIT_OUT_OF_MEMORY
    return 0


if __name__ == "__main__":
    sys.exit(main())
