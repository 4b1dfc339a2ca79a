"""``oneshot``: paper B's GPU task, a matmul with its input and output, once per run.

Each run: context (unless kept), allocate A, B and C, copy A and B in, one kernel, copy C
out, free, context gone. With ``--kernels K --host-gap S`` the kernel work is K kernels
with S seconds of host work after each but the last (a light inference task: its share of
the GPU while it computes is the kernels' part of that time). Every phase boundary is
logged. Copies go in chunks (64 MiB) so that a frozen process (``docker pause``) really
stops its input: it cannot issue its next chunk. With ``--keep-context`` the process keeps
its context and cached memory between runs, as PyTorch programs do. On a real GPU
(``--backend cuda``) a run without ``--keep-context`` is a child process, since a CUDA
context lives until its process exits.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from collections.abc import Callable

from gpuguard.contract import WorkloadEvent as Ev
from gpuguard.gpusim.contention import matmul_bytes, matmul_flops
from gpuguard.gpusim.errors import GpusimError, OutOfMemory
from gpuguard.gpusim.workload.devices import Devices
from gpuguard.gpusim.workload.events import EXIT_OUT_OF_MEMORY, EventLog


def _chunks(total: int, chunk: int) -> list[int]:
    return [min(chunk, total - offset) for offset in range(0, total, chunk)]


def run_task(args: argparse.Namespace, devices: Devices, log: EventLog, run: int) -> None:
    """One task on open devices: allocate, input, kernel, output, free (to the cache)."""
    matrix = args.memory_bytes // 3 if args.memory_bytes else matmul_bytes(args.size) // 3
    buffers = [devices.alloc(matrix) for _ in range(3)]
    log.event(Ev.INPUT_START, run=run, bytes=2 * matrix)
    for size in _chunks(2 * matrix, args.chunk_bytes):
        devices.copy_in(size)
    log.event(Ev.INPUT_END, run=run)
    if args.work_seconds:
        size_of = {"work_s": args.work_seconds}
        log.event(Ev.KERNEL_START, run=run, work=args.work_seconds)
    else:
        size_of = {"flops": matmul_flops(args.size)}
        log.event(Ev.KERNEL_START, run=run, flops=size_of["flops"])
    first, last = _kernels(devices, args, size_of)
    log.event(Ev.KERNEL_END, run=run, device_started=first, device_ended=last)
    log.event(Ev.OUTPUT_START, run=run, bytes=matrix)
    for size in _chunks(matrix, args.chunk_bytes):
        devices.copy_out(size)
    log.event(Ev.OUTPUT_END, run=run)
    for buffer in buffers:
        devices.free(buffer)


def _kernels(
    devices: Devices, args: argparse.Namespace, size_of: dict[str, float]
) -> tuple[float | None, float | None]:
    """The task's kernels; when the device started the first and ended the last."""
    each = {name: amount / args.kernels for name, amount in size_of.items()}
    first: float | None = None
    last: float | None = None
    for k in range(args.kernels):
        if k and args.host_gap:
            time.sleep(args.host_gap)  # host work between two kernels
        before = devices.mark()
        devices.launch(**each)
        after = devices.mark()
        reached = devices.synchronize()
        first = reached.get(before) if first is None else first
        last = reached.get(after)
    return first, last


def run_oneshot(
    args: argparse.Namespace, make_devices: Callable[[], Devices], log: EventLog
) -> None:
    """Every run of the task; raises GpusimError (OutOfMemory when memory runs out)."""
    if args.backend == "cuda" and not args.keep_context:
        for run in range(args.run_index, args.run_index + args.repeat):
            if run > args.run_index and args.sleep_between:
                time.sleep(args.sleep_between)
            _run_child(args, log, run)
        return
    devices: Devices | None = None
    try:
        for run in range(args.run_index, args.run_index + args.repeat):
            if run > args.run_index and args.sleep_between:
                time.sleep(args.sleep_between)
            log.event(Ev.TASK_START, run=run)
            if devices is None:
                devices = make_devices()
                devices.open()
                log.event(Ev.CONTEXT_CREATED, run=run, device=",".join(devices.addresses))
            run_task(args, devices, log, run)
            if not args.keep_context:
                devices.close()
                devices = None
            if not args.no_task_end:
                log.event(Ev.TASK_END, run=run)
    finally:
        if devices is not None:
            devices.close()


def _run_child(args: argparse.Namespace, log: EventLog, run: int) -> None:
    """One CUDA task in a child process; its end is when the process (the context) is gone."""
    argv = [sys.executable, "-m", "gpuguard.gpusim.workload", "oneshot", *args.argv]
    argv += ["--keep-context", "--repeat", "1", "--run-index", str(run), "--no-task-end"]
    argv += ["--log", "-", "--start-at", "0"]
    child = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None
    started = False
    for line in child.stdout:
        started = started or f'"event": "{Ev.TASK_START.value}"' in line
        log.write(line)
    status = child.wait()
    if started:
        log.event(Ev.TASK_END, run=run, pid=child.pid)
    if status == EXIT_OUT_OF_MEMORY:
        raise OutOfMemory("out_of_memory", "CUDA out of memory")
    if status != 0:
        raise GpusimError("cuda_failed", f"CUDA task exited with status {status}")
