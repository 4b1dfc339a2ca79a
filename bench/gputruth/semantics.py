"""NVML semantics on this device, seen through the exporter's backend.

What the tracker relies on and the papers assumed: when a process appears in the compute
process list (at context creation, or at its first allocation), what ``usedGpuMemory``
shows under a caching allocator (freed memory stays), whether per-process utilization
samples exist and how often they update, what one sample costs, and MIG.
"""

from __future__ import annotations

import itertools
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from gputruth.rig import Rig, Sampler, percentile

STEPS = ("context", "alloc", "free", "release", "compute")
SETTLE_S = 0.6  # NVML's process list and memory settle within a sample period or two


def run(rig: Rig, compute_s: float) -> dict[str, Any]:
    argv = [sys.executable, str(Path(__file__).with_name("probe.py")), *rig.workload_flags]
    argv += ["--compute-s", str(compute_s)]
    child = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert child.stdin is not None and child.stdout is not None
    marks: dict[str, float] = {}
    sent: dict[str, float] = {}
    with Sampler(rig.backend, 0.02) as sampler:
        marks["start"] = float(child.stdout.readline().split()[1])
        time.sleep(SETTLE_S)
        for step in STEPS:
            sent[step] = time.time()
            child.stdin.write(step + "\n")
            child.stdin.flush()
            name, when = child.stdout.readline().split()
            marks[name] = float(when)
            time.sleep(SETTLE_S)
        sent["exit"] = time.time()
        child.stdin.write("exit\n")
        child.stdin.flush()
        child.wait(timeout=30)
        marks["exit"] = time.time()
        time.sleep(SETTLE_S)
    return analyse(sampler, child.pid, marks, sent)


def analyse(
    sampler: Sampler, pid: int, marks: dict[str, float], sent: dict[str, float] | None = None
) -> dict[str, Any]:
    """What the samples showed of ``pid`` after each step (pure, given the samples).

    ``marks``: when each step was done (the program's own clock); ``sent``: when it was
    asked for (default: ``marks``). A step's window runs from half a settle after it was done
    to when the next was asked for, so a sample taken while a step ran (its effect already
    visible, its answer not yet written) counts for neither."""
    asked = {**marks, **(sent or {})}
    order = ["start", *STEPS, "exit"]
    after: dict[str, dict[str, Any]] = {}
    for i, step in enumerate(order):
        until = asked[order[i + 1]] if i + 1 < len(order) else float("inf")
        window = [s for s in sampler.samples if marks[step] + SETTLE_S / 2 < s.timestamp < until]
        listed = [p for s in window for d in s.devices for p in d.processes if p.pid == pid]
        memory = [p.used_memory_bytes for p in listed]
        after[step] = {
            "listed": bool(listed),
            "used_memory_bytes": memory[-1] if memory else None,
        }
    appears = next((s for s in order if after[s]["listed"]), None)
    during = [s for s in sampler.samples if marks["release"] < s.timestamp < marks["compute"]]
    stamps = sorted(
        {
            u.timestamp_us
            for s in during
            for d in s.devices
            for u in d.process_samples
            if u.pid == pid and u.sm_ratio > 0
        }
    )
    gaps = [(b - a) / 1e6 for a, b in itertools.pairwise(stamps)]
    kept = after["free"]["used_memory_bytes"]
    allocated = after["alloc"]["used_memory_bytes"]
    return {
        "process_listed_from": appears,  # "context": at context creation; "alloc": later
        "memory_after": {s: after[s]["used_memory_bytes"] for s in order},
        "freed_memory_stays_listed": kept is not None
        and allocated is not None
        and kept >= allocated,
        "process_samples_seen": len(stamps),
        "process_sample_interval_s": statistics.median(gaps) if gaps else None,
        "sample_call_ms_p50": _ms(percentile(sampler.costs_s, 0.5)),
        "sample_call_ms_p95": _ms(percentile(sampler.costs_s, 0.95)),
        "mig_devices": sorted(
            {d.key for s in sampler.samples for d in s.devices if d.mig_index is not None}
        ),
    }


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(1000 * seconds, 3)
