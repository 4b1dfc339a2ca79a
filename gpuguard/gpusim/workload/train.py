"""``train``: a training loop with cached memory for its whole life.

Each step launches a few kernels without waiting; every ``--sync-every`` steps the loop
waits for the device (like ``loss.item()``), so up to that many steps of kernels are queued
ahead of the GPU; ``--input-wait`` then keeps the device idle while the host prepares the
next batch (a data-loader-bound loop, which uses a part of the device). Each step ends with
a mark (a CUDA event): at each sync the loop logs when the device finished every step since
the last sync, and its steps per second. A frozen loop launches nothing more; the device is
busy until its queued steps drain.
"""

from __future__ import annotations

import argparse
import time

from gpuguard.contract import WorkloadEvent as Ev
from gpuguard.gpusim.workload.devices import Devices
from gpuguard.gpusim.workload.events import EventLog
from gpuguard.gpusim.workload.timing import Stopped, wait_until


class _Steps:
    """Steps launched and not yet reported, and the rates the log carries."""

    def __init__(self, start: float) -> None:
        self.start = start
        self.pending: list[tuple[int, int, float]] = []  # step, mark, launched
        self.done = 0
        self.last_end: float | None = None

    def report(self, reached: dict[int, float], log: EventLog) -> None:
        window_start = self.last_end if self.last_end is not None else self.start
        ends = []
        for step, mark, launched in self.pending:
            end = reached[mark]
            ends.append(end)
            log.event(Ev.STEP, t=end, step=step, launched=launched)
        if ends:
            self.done += len(ends)
            self.last_end = max(ends)
            rate = len(ends) / max(self.last_end - window_start, 1e-9)
            log.event(Ev.SYNC, steps=self.done, steps_per_s=rate)
        self.pending.clear()

    def summary(self, log: EventLog) -> None:
        elapsed = (self.last_end or self.start) - self.start
        rate = self.done / elapsed if elapsed > 0 else None
        log.event(Ev.SUMMARY, steps=self.done, steps_per_s=rate)


def run_train(args: argparse.Namespace, devices: Devices, log: EventLog) -> None:
    """Run steps until ``--steps`` or ``--duration``; log each step as the device ended it."""
    devices.open()
    devices.alloc(args.memory_bytes)  # weights, gradients, optimizer state: kept
    log.event(Ev.READY, memory_bytes=args.memory_bytes)
    steps = _Steps(wait_until(args.start_at))
    step = 0
    try:
        while (args.steps is None or step < args.steps) and (
            args.duration is None or time.time() - steps.start < args.duration
        ):
            for _ in range(args.kernels):
                devices.launch(work_s=args.step_work / args.kernels)
            steps.pending.append((step, devices.mark(), time.time()))
            step += 1
            if step % args.sync_every == 0:
                steps.report(devices.synchronize(), log)
                if args.input_wait:
                    time.sleep(args.input_wait)  # the next batch: the device waits for it
        steps.report(devices.synchronize(), log)
    except Stopped:
        pass  # SIGTERM: the queue's replies may be half read; report what was synced
    steps.summary(log)
