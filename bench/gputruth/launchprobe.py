"""The launch probe on the rig's driver library: kernel counts and busy spans against the
workload's own log and CUDA events.

On a GPU the probe attaches to the driver's ``libcuda.so.1`` (the file the toolkit mounts
into containers) while a torch one-shot runs with its context kept (one process); on gpusim
to the daemon's stand-in. Needs root (CAP_BPF + CAP_PERFMON) and the probe's program
(``gpuguard-launchprobe`` on PATH, else built with clang, bpftool and libbpf); without them
the section says why and measures nothing. What the probe costs a call is measured on the
same file: ``cuStreamQuery`` in a loop, unprobed then probed (two traps a call, the entry's
and the return's; a launch takes one).
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from gpuguard.contract import EventType
from gpuguard.exporter.activity import ActivityTracker
from gpuguard.exporter.events import EventLog
from gpuguard.exporter.launchprobe import (
    LaunchProbe,
    LaunchSample,
    ProbeConfig,
    ProcLaunches,
    find_library,
    installed_binary,
)
from gpuguard.exporter.probe.build import probe_binary
from gputruth.rig import Rig, mean, pair_by_overlap, read_log


class PidTracker:
    """The exporter's activity tracker with each process as its own container."""

    def __init__(self, task_gap_s: float = ProbeConfig().task_gap_s) -> None:
        self.events = EventLog(100_000)
        self.tracker = ActivityTracker(self.events, task_gap_s, idle_timeout_s=0.5)
        self.last: dict[int, ProcLaunches] = {}
        self.exited: dict[int, ProcLaunches] = {}

    def on_tick(self, sample: LaunchSample) -> None:
        exited = [self.last[p] for p in sample.gone if p in self.last]
        self.exited.update((p.pid, p) for p in exited)
        self.last = dict(sample.procs)
        grouped = {str(pid): [p] for pid, p in sample.procs.items()}
        self.tracker.update(sample.timestamp, grouped, exited)

    def record(self, pid: int) -> ProcLaunches | None:
        return self.last.get(pid) or self.exited.get(pid)

    def tasks(self, pid: int) -> list[tuple[float, float]]:
        """(first launch, last wait's return) of each finished task of ``pid``."""
        return [
            (e["busy_since"], e["ts"])
            for e in self.events.since(0).events
            if e["type"] == EventType.GPU_IDLE and e["container_id"] == str(pid)
        ]


#: a child that calls ``cuStreamQuery(NULL)`` in a loop and prints its fastest round, in ns
#: of the thread's CPU time a call (user + kernel: a probe's traps included). Without
#: ``cuInit`` a real driver answers at once (not initialized), gpusim's stand-in too: the
#: call is the cheapest the probe watches, so the difference is the probe's own cost.
_QUERY_LOOP = """
import ctypes, sys, time
query = ctypes.CDLL(sys.argv[1]).cuStreamQuery
query.argtypes, query.restype = [ctypes.c_void_p], ctypes.c_int
n, best = int(sys.argv[2]), float("inf")
for _ in range(5):
    began = time.thread_time_ns()
    for _ in range(n):
        query(None)
    best = min(best, (time.thread_time_ns() - began) / n)
print(best)
"""
QUERY_CALLS = 20_000


def query_ns(library: Path, calls: int = QUERY_CALLS) -> float | None:
    """ns a ``cuStreamQuery`` call of ``library`` takes in a child (None if it failed)."""
    done = subprocess.run(
        [sys.executable, "-c", _QUERY_LOOP, str(library), str(calls)],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    try:
        return float(done.stdout.strip())
    except ValueError:
        return None


def measure(rig: Rig, workdir: Path, args: list[str]) -> dict[str, Any]:
    """One-shot runs (``args``) under the probe; counts and span errors (ms); and what a
    probed ``cuStreamQuery`` (an entry and a return probe) costs over an unprobed one."""
    socket = rig.service.socket if rig.service is not None else None
    library = find_library(None, socket)
    tracker = PidTracker()
    found = installed_binary()
    probe = LaunchProbe(lambda: found or probe_binary(), library, 0.01, tracker.on_tick)
    unprobed = query_ns(library) if library is not None else None
    status = probe.start()
    result: dict[str, Any] = {"attached": status.attached, "library": str(library),
                              "detail": status.detail}  # fmt: skip
    if not status.attached:
        result["reason"] = status.reason.value if status.reason else None
        return result
    probed = query_ns(library) if library is not None else None
    result["query_ns_unprobed"] = _round(unprobed)
    result["query_ns_probed"] = _round(probed)
    cost = probed - unprobed if probed is not None and unprobed is not None else None
    result["probe_ns_per_query"] = _round(cost)
    log = workdir / "launchprobe-oneshot.jsonl"
    try:
        child = rig.start(rig.workload("oneshot", *args, "--keep-context", "--log", str(log)), log)
        child.wait(timeout=600)
        time.sleep(1.5)  # the last idle edge, and the exit seen
    finally:
        probe.stop()
    events = read_log(log)
    pid = events[0]["pid"] if events else -1
    seen = tracker.record(pid)
    kernels = sum(int(e.get("kernels", 1)) for e in events if e["event"] == "kernel_start")
    starts = [e for e in events if e["event"] == "kernel_start"]
    ends = [e for e in events if e["event"] == "kernel_end"]
    outs = [e["t"] for e in events if e["event"] == "output_end"]
    spans = tracker.tasks(pid)
    runs = [(k["t"], o) for k, o in zip(starts, outs, strict=False)]
    paired = pair_runs(runs, spans)
    start_err = [(spans[i][0] - runs[r][0]) * 1000 for r, i in paired.items()]
    end_err = [(spans[i][1] - runs[r][1]) * 1000 for r, i in paired.items()]
    device = [(spans[i][0] - ends[r]["device_started"]) * 1000 for r, i in paired.items()
              if r < len(ends) and ends[r].get("device_started") is not None]  # fmt: skip
    result.update({
        "runs": len(starts), "tasks_seen": len(spans), "runs_matched": len(paired),
        "launches_seen": seen.launches if seen else 0, "kernels_logged": kernels,
        "copies_seen": seen.copies if seen else 0, "waits_seen": seen.waits if seen else 0,
        # runs - 1 where the copies go through the directional entry points (the next
        # input of each run after the first); 0 where they go through cuMemcpyAsync
        "next_inputs_seen": seen.inputs if seen else 0,
        "start_err_ms_mean": _round(mean(start_err)), "end_err_ms_mean": _round(mean(end_err)),
        "first_launch_before_device_start_ms_mean": _round(mean(device)),
    })  # fmt: skip
    return result


def pair_runs(runs: list[tuple[float, float]], spans: list[tuple[float, float]]) -> dict[int, int]:
    """Each run (its first kernel's launch to its output's end) with the busy span that
    overlaps it most, one to one. Spans that match no run are the program's own set-up (on
    a GPU: the context's first kernel and the workload's calibration matmuls)."""
    return pair_by_overlap(runs, spans)


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)
