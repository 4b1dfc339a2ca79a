"""Task start/end as the exporter's tracker sees them, against the workload's own clocks.

Paper A's experiment on the real device: the exporter's poll loop (backend -> /proc owner
lookup -> join -> tracker) runs in this process at a given poll interval while a workload
runs as a host process and logs its own timestamps. Without Docker every process is "in no
container", which is what a bare GPU host looks like; the tracker's task mode is its
``--task.default-mode``. Each logged task is matched to the detected task that overlaps it
most (one to one), so a child process per task (CUDA one-shot runs) needs no PID bookkeeping.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuguard.contract import TaskMode
from gpuguard.exporter.cgroup import ProcReader
from gpuguard.exporter.events import EventLog
from gpuguard.exporter.model import ContainerInfo
from gpuguard.exporter.poller import Poller
from gpuguard.exporter.tracker import TaskRules, TaskView, Tracker
from gputruth.rig import Rig, mean, pair_by_overlap, read_log


class NoContainers:
    """The container source of a host without Docker: every process is a host process."""

    ENGINE = "docker"
    connected = True
    errors = 0
    resync_duration_s = 0.0

    def snapshot(self) -> Mapping[str, ContainerInfo]:
        return {}


@dataclass(frozen=True)
class Interval:
    start: float
    end: float
    context: float | None = None  # when the run's CUDA context existed (a fresh process's)


def truth_intervals(events: list[dict[str, Any]], kind: str) -> list[Interval]:
    """The tasks a workload log says it ran: one-shot runs, or server requests on the GPU."""
    if kind == "server":
        return [Interval(e["gpu_start"], e["gpu_end"]) for e in events if e["event"] == "request"]
    starts = {e["run"]: e["t"] for e in events if e["event"] == "task_start"}
    ends = {e["run"]: e["t"] for e in events if e["event"] == "task_end"}
    contexts = {e["run"]: e["t"] for e in events if e["event"] == "context_created"}
    return [Interval(starts[r], ends[r], contexts.get(r)) for r in sorted(starts) if r in ends]


def match(truth: list[Interval], seen: list[TaskView]) -> list[tuple[Interval, TaskView]]:
    """Each true interval with the detected task overlapping it most, one to one."""
    ended = [t for t in seen if t.ended_at is not None]
    spans = [(t.started_at, t.ended_at or 0.0) for t in ended]
    paired = pair_by_overlap([(i.start, i.end) for i in truth], spans)
    return [(truth[t], ended[i]) for t, i in paired.items()]


def measure(
    rig: Rig, workdir: Path, kind: str, args: list[str], mode: TaskMode, poll_s: float
) -> dict[str, Any]:
    """Run one workload under a poll loop; errors of detected start/end (seconds)."""
    events = EventLog(4096)
    tracker = Tracker(events, history_size=4096, rules=TaskRules(default_mode=mode))
    poller = Poller(
        rig.backend, NoContainers(), ProcReader(Path("/proc")), tracker, events, "truth", poll_s
    )
    log = workdir / f"{kind}-{mode.value}-{int(poll_s * 1000)}ms.jsonl"
    stop = threading.Event()
    thread = threading.Thread(target=poller.run, args=(stop,), daemon=True)
    thread.start()
    try:
        child = rig.start(rig.workload(kind, *args, "--log", str(log)), log)
        child.wait(timeout=600)
        time.sleep(max(1.0, 4 * poll_s) + tracker.rules.idle_gap_s)  # the last end is seen
    finally:
        stop.set()
        thread.join()
    truth = truth_intervals(read_log(log), kind)
    pairs = match(truth, list(tracker.recent))
    start_err = [task.started_at - t.start for t, task in pairs]
    end_err = [(task.ended_at or 0.0) - t.end for t, task in pairs]
    # a GPU program's host-side prologue (on a GPU: importing torch) comes before anything
    # on the device: no GPU-side monitor sees it, so the start is also measured from there
    from_context = [task.started_at - t.context for t, task in pairs if t.context is not None]
    return {
        "tasks": len(truth),
        "matched": len(pairs),
        "detected": len(tracker.recent),
        "start_err_mean_s": _round(mean(start_err)),
        "end_err_mean_s": _round(mean(end_err)),
        "start_err_abs_mean_s": _round(mean([abs(e) for e in start_err])),
        "start_err_from_context_mean_s": _round(mean(from_context)),
        "end_err_abs_mean_s": _round(mean([abs(e) for e in end_err])),
        "exit_code": child.returncode,
    }


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 4)
