"""A GPU program driven one step at a time, to see what NVML shows after each step.

Run as a child of the kit: it reads a step name per line on stdin, does it, and answers
``<step> <wall time when done>`` on stdout. Steps: ``context`` (create the CUDA context and
nothing else), ``alloc`` (1 GiB through the caching allocator), ``free`` (give it back to
the allocator's cache: the device keeps it), ``release`` (empty the cache), ``compute``
(kernels for ``--compute-s`` seconds), ``exit``. On gpusim the same steps go through
gpusim's client and its PyTorch-like caching allocator.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

ALLOC_BYTES = 2**30


class CudaProgram:
    def __init__(self) -> None:
        from gpuguard.gpusim.workload.cuda import load_ops

        self.ops = load_ops()
        self.buffer: Any = None
        self.operands: list[Any] = []

    def context(self) -> None:
        self.ops.create_context(0)

    def alloc(self) -> None:
        self.buffer = self.ops.empty(0, ALLOC_BYTES)
        self.ops.synchronize(0)

    def free(self) -> None:
        self.buffer = None  # the caching allocator keeps the block

    def release(self) -> None:
        self.ops.empty_cache(0)

    def compute(self, seconds: float) -> None:
        side = 4096
        if not self.operands:
            self.operands = [self.ops.matrix(self.ops.empty(0, side * side * 4), side)]
            self.operands *= 3
        until = time.monotonic() + seconds
        while time.monotonic() < until:
            for _ in range(8):
                self.ops.matmul(0, *self.operands)
            self.ops.synchronize(0)
        self.operands = []
        self.ops.empty_cache(0)


class SimProgram:
    def __init__(self, socket: Path) -> None:
        from gpuguard.gpusim.workload.devices import SimDevices

        self.devices = SimDevices(socket, ["0"])
        self.buffer: Any = None

    def context(self) -> None:
        self.devices.open()

    def alloc(self) -> None:
        self.buffer = self.devices.alloc(ALLOC_BYTES)

    def free(self) -> None:
        self.devices.free(self.buffer)
        self.buffer = None

    def release(self) -> None:
        self.devices.empty_cache()

    def compute(self, seconds: float) -> None:
        until = time.monotonic() + seconds
        while time.monotonic() < until:
            for _ in range(4):
                self.devices.launch(work_s=0.01)
            self.devices.synchronize()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", choices=["sim", "cuda"], required=True)
    parser.add_argument("--socket", type=Path)
    parser.add_argument("--compute-s", type=float, default=2.0)
    args, _ = parser.parse_known_args()
    program: Any = CudaProgram() if args.backend == "cuda" else SimProgram(args.socket)
    print("ready", time.time(), flush=True)
    for line in sys.stdin:
        step = line.strip()
        if step == "exit":
            break
        if step == "compute":
            program.compute(args.compute_s)
        else:
            getattr(program, step)()
        print(step, time.time(), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
