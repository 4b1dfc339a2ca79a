"""What NVML would report about the simulated devices (the ``sample`` and ``status`` ops).

NVML's rules, followed here (docs/interfaces.md section 1):
- Utilization is the share of the last sample period in which any kernel ran.
- Per-process samples are taken by the driver at its own instants, one sample period
  apart (``k x sample_period_s`` on the daemon's clock), not when asked: at each instant,
  one sample for every process that ran a kernel in the period it closes, with that
  instant's timestamp and the process's share of SM time over the period. A query returns
  the samples of the instants after ``since_us`` (NVML's ``lastSeenTimeStamp``), so a poll
  between two instants gets none, whether or not the kernels still run.
- A GPU in MIG mode is listed, then each of its MIG devices. Utilization is not available
  on MIG-enabled GPUs, neither for the GPU nor for its MIG devices (``null``), and neither
  are per-process samples (none). Each MIG device has its own memory and compute-process
  list; the GPU's own entry lists no processes (NVML's aggregate needs privileges and
  would count them twice) and its used memory is the sum of its MIG devices'.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from gpuguard.gpusim.config import DaemonConfig
from gpuguard.gpusim.engine import Context, Engine, OpKind


def report(
    config: DaemonConfig,
    engines: list[Engine],
    wall_offset: float,
    now: float,
    since_us: int,
    detailed: bool,
) -> dict[str, Any]:
    """The ``sample`` reply (``detailed``: the ``status`` reply's devices), without ``ok``."""
    devices: list[dict[str, Any]] = []
    for spec in config.devices:
        own = [e for e in engines if e.index == spec.index]
        if spec.mig:
            parent: dict[str, Any] = {
                "index": spec.index,
                "mig_index": None,
                "uuid": spec.uuid,
                "name": spec.name,
                "memory_total_bytes": spec.memory_bytes,
                "memory_used_bytes": sum(e.used_bytes for e in own),
                "utilization_ratio": None,
                "processes": [],
                "process_samples": [],
            }
            devices.append(parent | ({"address": str(spec.index)} if detailed else {}))
        for engine in own:
            devices.append(_engine(config, engine, wall_offset, now, since_us, detailed))
    return {"timestamp_us": int((now + wall_offset) * 1e6), "devices": devices}


def _engine(
    config: DaemonConfig,
    engine: Engine,
    wall_offset: float,
    now: float,
    since_us: int,
    detailed: bool,
) -> dict[str, Any]:
    period = config.sample_period_s
    usage = engine.usage
    busy = usage.utilization(now - period, now)
    mig = engine.mig_index is not None
    samples: list[dict[str, Any]] = []
    if not mig:
        since = since_us / 1e6 - wall_offset
        for instant in sample_instants(period, since, now, usage.horizon):
            start = instant - period
            for pid in usage.kernel_pids_since(start):
                share = usage.sm_ratio(pid, start, instant)
                if share > 0:
                    samples.append(
                        {
                            "pid": pid,
                            "timestamp_us": int((instant + wall_offset) * 1e6),
                            "sm_ratio": share,
                            "mem_ratio": usage.copy_ratio(pid, start, instant),
                        }
                    )
    device: dict[str, Any] = {
        "index": engine.index,
        "mig_index": engine.mig_index,
        "uuid": engine.uuid,
        "name": engine.name,
        "memory_total_bytes": engine.memory_bytes,
        "memory_used_bytes": engine.used_bytes,
        "utilization_ratio": None if mig else busy,
        "processes": _processes(engine.contexts.values(), detailed),
        "process_samples": samples,
    }
    if detailed:
        # gpusim's own view, which NVML does not give on MIG: is this engine busy?
        device.update(address=engine.address, engine_utilization_ratio=busy)
    return device


def _processes(contexts: Iterable[Context], detailed: bool) -> list[dict[str, Any]]:
    """Compute processes of an engine, one entry per host PID (NVML lists a PID once)."""
    by_pid: dict[int, dict[str, Any]] = {}
    for ctx in contexts:
        entry = by_pid.setdefault(ctx.pid, {"pid": ctx.pid, "used_memory_bytes": 0})
        entry["used_memory_bytes"] += ctx.used_bytes
        if detailed:
            running = ctx.running
            phase = "idle" if running is None else running.kind.value
            entry.setdefault("phase", "idle")
            entry.setdefault("kernels_running", 0)
            entry.setdefault("kernels_queued", 0)
            if phase != "idle":
                entry["phase"] = phase
            entry["kernels_running"] += int(running is not None and running.kind is OpKind.KERNEL)
            entry["kernels_queued"] += ctx.kernels_queued
    return list(by_pid.values())


#: At most this many sample instants per query (NVML's buffer is bounded too).
MAX_INSTANTS = 16


def sample_instants(period: float, since: float, now: float, horizon: float) -> list[float]:
    """The driver's sample instants after ``since`` and up to ``now`` (oldest first)."""
    newest = math.floor(now / period)
    oldest = max(math.floor(since / period) + 1, math.ceil((now - horizon) / period))
    oldest = max(oldest, newest - MAX_INSTANTS + 1)
    return [k * period for k in range(oldest, newest + 1)]
