"""Freeze semantics: a training loop frozen the way ``docker pause`` freezes a container.

A frozen process launches nothing, but the kernels it queued still run: the GPU frees once
its queue drains. The ``train`` workload records when the device finished each step (CUDA
events, read at its next sync), so the drain is measured on the device's own clock: the
last step that ended after the freeze, minus the freeze. Resume is the first step that ended
after the thaw, minus the thaw (it includes one step's time, reported beside it). The
exporter's view is measured too: the newest per-process SM sample of the frozen process.
Freezing uses the cgroup freezer (v2, else v1); where none can be used (a sandbox without
cgroup access), SIGSTOP/SIGCONT, which stop the host side the same way.
"""

from __future__ import annotations

import itertools
import os
import signal
import time
from pathlib import Path
from typing import Any

from gputruth.freezer import CgroupFreezer, FreezerError
from gputruth.rig import Rig, Sampler, mean, percentile, read_log


class SignalFreezer:
    """SIGSTOP/SIGCONT: the fallback where no cgroup freezer can be made."""

    version = 0

    def __init__(self) -> None:
        self.pids: list[int] = []

    def add(self, pid: int) -> None:
        self.pids.append(pid)

    def freeze(self) -> float:
        for pid in self.pids:
            os.kill(pid, signal.SIGSTOP)
        return 0.0

    def thaw(self) -> None:
        for pid in self.pids:
            os.kill(pid, signal.SIGCONT)

    def close(self) -> None:
        self.thaw()


def measure(
    rig: Rig, workdir: Path, rounds: int, hold_s: float, step_work_s: float
) -> dict[str, Any]:
    log = workdir / "train-freeze.jsonl"
    duration = 2.0 + rounds * (hold_s + 1.5) + 1.0
    argv = rig.workload(
        "train", "--log", str(log), "--duration", f"{duration:g}", "--kernels", "4",
        "--sync-every", "8", "--step-work", f"{step_work_s:g}", "--memory-bytes", "1GiB",
    )  # fmt: skip
    child = rig.start(argv, log)
    freezer: Any
    try:
        freezer = CgroupFreezer(f"gpuguard-truth-{os.getpid()}")
        method = f"cgroup v{freezer.version}"
    except (FreezerError, OSError) as exc:
        freezer, method = SignalFreezer(), f"SIGSTOP ({exc})"
    windows: list[tuple[float, float]] = []
    try:
        _wait_ready(log, child.pid, timeout=120)
        freezer.add(child.pid)
        time.sleep(1.5)
        with Sampler(rig.backend, 0.01) as sampler:
            for _ in range(rounds):
                frozen_at = time.time()
                freezer.freeze()
                time.sleep(hold_s)
                thawed_at = time.time()
                freezer.thaw()
                windows.append((frozen_at, thawed_at))
                time.sleep(1.5)
        child.wait(timeout=duration + 120)
    finally:
        freezer.close()
        if child.poll() is None:
            child.kill()
            child.wait()
    return analyse(read_log(log), windows, sampler, child.pid, method)


def analyse(
    events: list[dict[str, Any]],
    windows: list[tuple[float, float]],
    sampler: Sampler,
    pid: int,
    method: str,
) -> dict[str, Any]:
    ends = sorted(e["t"] for e in events if e["event"] == "step")
    step_s = [b - a for a, b in itertools.pairwise(ends)]
    drain_ms, resume_ms, seen_idle_ms = [], [], []
    for frozen_at, thawed_at in windows:
        during = [t for t in ends if frozen_at <= t < thawed_at]
        drain_ms.append(1000 * (max(during) - frozen_at) if during else 0.0)
        after = [t for t in ends if t >= thawed_at]
        if after:
            resume_ms.append(1000 * (min(after) - thawed_at))
        last = _last_active_sample(sampler, pid, frozen_at, thawed_at)
        seen_idle_ms.append(0.0 if last is None else 1000 * (last - frozen_at))
    return {
        "method": method,
        "rounds": len(windows),
        "step_ms_median": _r(1000 * percentile(step_s, 0.5)) if step_s else None,
        "freeze_drain_ms_p50": _r(percentile(drain_ms, 0.5)),
        "freeze_drain_ms_p95": _r(percentile(drain_ms, 0.95)),
        "thaw_first_step_ms_p50": _r(percentile(resume_ms, 0.5)),
        "thaw_first_step_ms_p95": _r(percentile(resume_ms, 0.95)),
        "exporter_last_active_ms_mean": _r(mean(seen_idle_ms)),
        "exporter_last_active_ms_p95": _r(percentile(seen_idle_ms, 0.95)),
    }


def _last_active_sample(sampler: Sampler, pid: int, frozen_at: float, until: float) -> float | None:
    """The newest per-process sample showing ``pid`` computing inside the freeze window.

    NVML's per-process samples carry their own timestamps; the last one with SM activity
    is when the exporter last saw the frozen process's kernels run.
    """
    stamps = [
        u.timestamp_us / 1e6
        for sample in sampler.samples
        for device in sample.devices
        for u in device.process_samples
        if u.pid == pid and u.sm_ratio > 0 and frozen_at <= u.timestamp_us / 1e6 < until
    ]
    return max(stamps) if stamps else None


def _wait_ready(log: Path, pid: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(e["event"] == "ready" for e in read_log(log)):
            return
        if not Path(f"/proc/{pid}").exists():
            raise RuntimeError(f"train workload exited early: see {log.with_suffix('.err')}")
        time.sleep(0.05)
    raise TimeoutError("train workload never became ready")


def _r(value: float | None) -> float | None:
    return None if value is None else round(value, 2)
