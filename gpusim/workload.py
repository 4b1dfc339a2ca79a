"""The matmul workload: the GPU task of paper B, with its own ground-truth timestamps.

``python -m gpuguard.gpusim.workload --size 13312 --repeat 3 --sleep-between 0.5 --backend sim``

Each run is one GPU task: context, alloc A, B, C, copy A and B in, kernel, copy C out, free,
context gone. Every phase boundary is logged as one JSON line with ``time.time()``, flushed
at once: these are what the exporter's start/end detection is measured against (paper A).
Copies go in 64 MiB chunks so that a frozen process (``docker pause``) really stops its
input: it cannot issue its next chunk. Exit status: 0 done, 1 daemon or GPU failure,
2 bad arguments, 3 out of memory.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, Any, NoReturn

from gpuguard.gpusim.client import GpusimClient
from gpuguard.gpusim.config import parse_size, positive_float
from gpuguard.gpusim.errors import GpusimError, OutOfMemory
from gpuguard.gpusim.model import matmul_bytes, matmul_work_s

EXIT_FAILED = 1
EXIT_OUT_OF_MEMORY = 3
DEFAULT_CHUNK = 64 * 2**20


class EventLog:
    """JSON lines with wall-clock timestamps, flushed line by line."""

    def __init__(self, stream: IO[str], size: int) -> None:
        self.stream = stream
        self.size = size

    def event(self, name: str, run: int, pid: int | None = None, **extra: Any) -> None:
        """Log one event now (``t`` is ``time.time()`` taken here)."""
        record = {"event": name, "t": time.time(), "run": run, "pid": pid or os.getpid()}
        record.update(size=self.size, **extra)
        self.stream.write(json.dumps(record) + "\n")
        self.stream.flush()


def _chunks(total: int, chunk: int) -> list[int]:
    return [min(chunk, total - offset) for offset in range(0, total, chunk)]


def run_sim_task(args: argparse.Namespace, log: EventLog, run: int) -> None:
    """One GPU task on gpusim; raises GpusimError (OutOfMemory when alloc fails)."""
    matrix = args.memory_bytes // 3 if args.memory_bytes else matmul_bytes(args.size) // 3
    work = args.work_seconds if args.work_seconds else matmul_work_s(args.size)
    with GpusimClient(args.socket) as gpu:
        log.event("task_start", run)
        gpu.context_create(args.device)
        log.event("context_created", run, device=args.device)
        handles = [gpu.alloc(matrix) for _ in range(3)]
        log.event("input_start", run, bytes=2 * matrix)
        for size in _chunks(2 * matrix, args.chunk_bytes):
            gpu.copy_in(size)
        log.event("input_end", run)
        log.event("kernel_start", run, work=work)
        started, ended = gpu.kernel(work)
        log.event("kernel_end", run, device_started=started, device_ended=ended)
        log.event("output_start", run, bytes=matrix)
        for size in _chunks(matrix, args.chunk_bytes):
            gpu.copy_out(size)
        log.event("output_end", run)
        for handle in handles:
            gpu.free(handle)
        gpu.context_destroy()
        log.event("task_end", run)


def run_cuda_task(args: argparse.Namespace, log: EventLog, run: int) -> None:
    """One GPU task on a real GPU, in a fresh child process so that the task really ends.

    torch and cupy keep their CUDA context until the process exits, so the child logs every
    phase and this parent logs ``task_end`` once the child (the GPU process) has gone.
    """
    argv = [sys.executable, "-m", "gpuguard.gpusim.cuda_task", "--size", str(args.size)]
    argv += ["--device", str(args.device), "--run", str(run)]
    child = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None
    started = False
    for line in child.stdout:
        started = started or '"event": "task_start"' in line
        log.stream.write(line)
        log.stream.flush()
    status = child.wait()
    if started:
        log.event("task_end", run, pid=child.pid)
    if status == EXIT_OUT_OF_MEMORY:
        raise OutOfMemory("out_of_memory", "CUDA out of memory")
    if status != 0:
        raise GpusimError("cuda_failed", f"CUDA task exited with status {status}")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(2, f"gpusim.workload: error: {message}\n")


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = _Parser(prog="python -m gpuguard.gpusim.workload", description=__doc__.split("\n")[0])

    def positive_int(text: str) -> int:
        if not text.isdigit() or int(text) <= 0:
            raise argparse.ArgumentTypeError(f"must be an integer > 0, got {text!r}")
        return int(text)

    def non_negative(text: str) -> float:
        return 0.0 if text.strip() in ("0", "0.0") else positive_float(text, "value")

    def size(text: str) -> int:
        try:
            return parse_size(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    def seconds(text: str) -> float:
        try:
            return positive_float(text, "value")
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    parser.add_argument("--size", type=positive_int, default=13312, help="matrix side N")
    parser.add_argument("--repeat", type=positive_int, default=1, help="number of tasks")
    parser.add_argument("--sleep-between", type=non_negative, default=0.0, help="seconds")
    parser.add_argument("--backend", choices=["sim", "cuda"], default="sim")
    parser.add_argument("--device", type=int, default=0, help="GPU index")
    parser.add_argument("--log", default="-", help="JSON-lines log file, or - for stdout")
    parser.add_argument("--socket", type=Path, default=None, help="gpusim socket (sim)")
    parser.add_argument("--work-seconds", type=seconds, default=None, help="kernel work")
    parser.add_argument("--memory-bytes", type=size, default=None, help="A+B+C bytes")
    parser.add_argument("--chunk-bytes", type=size, default=DEFAULT_CHUNK, help="per copy")
    parser.add_argument("--start-at", type=float, default=None, help="wall time to begin")
    args = parser.parse_args(argv)
    if args.memory_bytes is not None and args.memory_bytes < 3:
        parser.error("--memory-bytes must be at least 3")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """Run the tasks; see the module docstring for exit statuses."""
    args = _parse(argv)
    stream = sys.stdout if args.log == "-" else open(args.log, "a", buffering=1)  # noqa: SIM115
    log = EventLog(stream, args.size)
    task: Callable[[argparse.Namespace, EventLog, int], None]
    task = run_sim_task if args.backend == "sim" else run_cuda_task
    if args.start_at is not None:
        # Lets several workloads start together, as in paper B's experiments.
        time.sleep(max(0.0, args.start_at - time.time()))
    try:
        for run in range(args.repeat):
            if run and args.sleep_between:
                time.sleep(args.sleep_between)
            task(args, log, run)
    except OutOfMemory as exc:
        log.event("error", run, error="out_of_memory", message=exc.message)
        return EXIT_OUT_OF_MEMORY
    except GpusimError as exc:
        log.event("error", run, error=exc.code, message=exc.message)
        return EXIT_FAILED
    finally:
        if stream is not sys.stdout:
            stream.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
