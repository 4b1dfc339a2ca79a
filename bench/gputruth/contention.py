"""Contention: n concurrent matmul tasks on one device, against paper B and gpusim's model.

Paper B measured the kernel time of n = 1..10 concurrent 13,312² matmuls on an RTX 3090
(its Table 1); gpusim's default profile is that table. Here n ``oneshot`` workloads start
together, each keeping its context and running several tasks in a row; the kernel times are
the device's
own (CUDA events, or gpusim's clock), scaled to 13,312² when a smaller size ran; a kernel
counts for n when it overlapped a kernel of each of the n - 1 other processes. The ratio
kernel(n) / kernel(1) is compared with the paper's and with gpusim's (the profile it ran),
and a profile is fitted to this device so gpusim can simulate it (``gpusim serve --profile``).
"""

from __future__ import annotations

import math
import statistics
import time
from pathlib import Path
from typing import Any

from gpuguard.gpusim.profile import DeviceProfile, default_profile, parse_profile
from gpuguard.slowdown import PAPER_B_KERNEL_S, PAPER_B_SIZE
from gputruth.rig import Rig, read_log

RUNS = 5
#: Small buffers: the copies a one-shot task makes would otherwise keep the processes out of
#: step; the kernel's size (its flops) still comes from ``--size``.
MEMORY = "96MiB"
OVERLAP = 0.8  # a kernel ran "with" another when they overlapped this much of its time


def runs_for(n: int, alone_s: float | None, span_s: float) -> int:
    """Runs per process at concurrency ``n``: enough that the n processes overlap for about
    ``span_s`` (alone_s: one kernel's time alone), so a few seconds' skew in their start
    (each imports its CUDA library after ``--start-at``) still leaves kernels run beside all
    the others; at least ``RUNS``, at most 200."""
    if not alone_s or span_s <= 0:
        return RUNS
    return max(RUNS, min(200, math.ceil(span_s / (n * alone_s))))


def measure(
    rig: Rig, workdir: Path, counts: list[int], size: int, lead_s: float, span_s: float = 0.0
) -> dict[str, Any]:
    kernel_s: dict[int, float] = {}
    alone: dict[int, float] = {}  # n -> median kernel time as measured (unscaled)
    used: dict[int, int] = {}
    copies: list[tuple[int, float, float]] = []
    for n in counts:
        runs = runs_for(n, alone.get(1), span_s)
        start_at = time.time() + lead_s
        logs = [workdir / f"contention-{n}-{i}.jsonl" for i in range(n)]
        children = [
            rig.start(
                rig.workload(
                    "oneshot",
                    "--size",
                    str(size),
                    "--repeat",
                    str(runs),
                    "--keep-context",
                    "--memory-bytes",
                    MEMORY,
                    "--start-at",
                    f"{start_at:.3f}",
                    "--log",
                    str(log),
                ),
                log,
            )
            for log in logs
        ]
        for child in children:
            child.wait(timeout=1800)
        kernels: list[tuple[int, float, float]] = []
        for i, log in enumerate(logs):
            events = read_log(log)
            kernels += [
                (i, e["device_started"], e["device_ended"])
                for e in events
                if e["event"] == "kernel_end" and e.get("device_started") is not None
            ]
            if n == 1:
                copies += _copy_rates(events)
        times = [end - start for _, start, end in at_concurrency(kernels, n)]
        used[n] = len(times)
        if times:
            alone[n] = statistics.median(times)
            # back to paper B's size and to the device's real time (gpusim's time scale)
            kernel_s[n] = statistics.median(times) * (PAPER_B_SIZE / size) ** 3 / rig.time_scale
    result = compare(kernel_s, copies)
    result["kernels_used"] = used
    return result


def at_concurrency(
    kernels: list[tuple[int, float, float]], n: int
) -> list[tuple[int, float, float]]:
    """The kernels (process, start, end) that ran alongside a kernel of every other process."""
    chosen = []
    for proc, start, end in kernels:
        length = end - start
        others = {
            other
            for other, s, e in kernels
            if other != proc and length > 0 and min(end, e) - max(start, s) >= OVERLAP * length
        }
        if len(others) == n - 1:
            chosen.append((proc, start, end))
    return chosen


def compare(kernel_s: dict[int, float], copies: list[tuple[int, float, float]]) -> dict[str, Any]:
    """Ratios kernel(n)/kernel(1) here, in paper B and in gpusim's default profile (pure)."""
    sim = default_profile().concurrent_kernel_s
    rows = []
    errors = []
    base = kernel_s.get(1)
    for n, seconds in sorted(kernel_s.items()):
        here = seconds / base if base else None
        paper = (
            PAPER_B_KERNEL_S[n - 1] / PAPER_B_KERNEL_S[0] if n <= len(PAPER_B_KERNEL_S) else None
        )
        model = sim[n - 1] / sim[0] if n <= len(sim) else None
        if here and model:
            errors.append(abs(model - here) / here)
        rows.append(
            {"n": n, "kernel_s": round(seconds, 4), "ratio": _r(here), "paper_b": _r(paper),
             "gpusim": _r(model)}
        )  # fmt: skip
    return {
        "rows": rows,
        "max_rel_error_vs_gpusim": _r(max(errors)) if errors else None,
        "copy_in_bytes_per_s": _rate(copies, 1),
        "copy_out_bytes_per_s": _rate(copies, 2),
        "kernel_s": kernel_s,
    }


def fit_profile(
    name: str, gpu_name: str, result: dict[str, Any], sample_period_s: float | None,
    memory_bytes: int, context_memory_bytes: int | None,
) -> DeviceProfile:  # fmt: skip
    """A gpusim profile for this device; what was not measured keeps paper B's value, and
    a concurrency level between two measured ones is interpolated (the description says
    which)."""
    base = default_profile()
    measured = result["kernel_s"]
    if 1 not in measured:
        raise ValueError("a profile needs the kernel time alone (n = 1)")
    curve, filled = interpolated(measured)
    doc = base.to_json()
    described = f"fitted by bench/gpu_truth.py on {gpu_name}"
    if filled:
        described += f"; n = {', '.join(map(str, filled))} interpolated"
    doc.update(
        name=name,
        description=described,
        reference_matmul_size=PAPER_B_SIZE,
        concurrent_kernel_s=curve,
        copy_in_bytes_per_s=result["copy_in_bytes_per_s"] or base.copy_in_bytes_per_s,
        copy_out_bytes_per_s=result["copy_out_bytes_per_s"] or base.copy_out_bytes_per_s,
        sample_period_s=sample_period_s or base.sample_period_s,
        memory=memory_bytes,
        context_memory=context_memory_bytes or base.context_memory_bytes,
    )
    return parse_profile(doc)


def interpolated(measured: dict[int, float]) -> tuple[list[float], list[int]]:
    """Kernel times for n = 1 .. the largest measured, straight lines across the levels
    not measured; and those levels."""
    known = sorted(measured)
    curve, filled = [], []
    for n in range(1, known[-1] + 1):
        if n in measured:
            curve.append(measured[n])
            continue
        lo = max(k for k in known if k < n)
        hi = min(k for k in known if k > n)
        curve.append(measured[lo] + (measured[hi] - measured[lo]) * (n - lo) / (hi - lo))
        filled.append(n)
    return curve, filled


def _copy_rates(events: list[dict[str, Any]]) -> list[tuple[int, float, float]]:
    """(bytes, input rate, output rate) of each measured run of one process."""
    out = []
    by_run: dict[int, dict[str, dict[str, Any]]] = {}
    for e in events:
        if "run" in e:
            by_run.setdefault(e["run"], {})[e["event"]] = e
    for _run, ev in by_run.items():
        if not {"input_start", "input_end", "output_start", "output_end"} <= set(ev):
            continue
        t_in = ev["input_end"]["t"] - ev["input_start"]["t"]
        t_out = ev["output_end"]["t"] - ev["output_start"]["t"]
        if t_in > 0 and t_out > 0:
            out.append((ev["input_start"]["bytes"], ev["input_start"]["bytes"] / t_in,
                        ev["output_start"]["bytes"] / t_out))  # fmt: skip
    return out


def _rate(copies: list[tuple[int, float, float]], index: int) -> float | None:
    return statistics.median(c[index] for c in copies) if copies else None


def _r(value: float | None) -> float | None:
    return None if value is None else round(value, 4)
