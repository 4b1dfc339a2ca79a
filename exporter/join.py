"""The join (pure): GPU processes x process owners x container index, in O(GPU processes).

No Docker call and no file read happens here; the poller resolves owners from procfs
first (``cgroup.ProcReader``) and hands them in.
"""

from __future__ import annotations

from collections.abc import Mapping

from gpuguard.exporter.model import (
    AttributedProcess,
    ContainerGpuUsage,
    ContainerInfo,
    GpuSample,
    Joined,
    ProcessOwner,
    ProcessUtilization,
)


def _sm_by_pid(
    samples: tuple[ProcessUtilization, ...],
) -> tuple[dict[int, float], dict[int, float]]:
    """Mean SM share per pid over this poll's samples, and when each pid was last active."""
    total: dict[int, float] = {}
    count: dict[int, int] = {}
    active_us: dict[int, int] = {}
    for s in samples:
        total[s.pid] = total.get(s.pid, 0.0) + s.sm_ratio
        count[s.pid] = count.get(s.pid, 0) + 1
        if s.sm_ratio > 0 and s.timestamp_us > active_us.get(s.pid, 0):
            active_us[s.pid] = s.timestamp_us
    means = {pid: total[pid] / count[pid] for pid in total}
    return means, {pid: us / 1e6 for pid, us in active_us.items()}


def join(
    sample: GpuSample,
    owners: Mapping[int, ProcessOwner | None],
    containers: Mapping[str, ContainerInfo],
) -> Joined:
    """Attribute every GPU process to its container and sum usage per (container, gpu).

    A process whose container is unknown to the index (not Docker's, or not synced yet)
    keeps its container id on the task but counts as unattributed in the metrics.
    """
    processes: list[AttributedProcess] = []
    usage: dict[tuple[str, str], list[float]] = {}  # (cid, gpu) -> [memory, sm, count]
    unattributed: dict[str, int] = {}
    device_sm: dict[str, float] = {}
    for device in sample.devices:
        gpu = device.key
        sm_by_pid, active_at = _sm_by_pid(device.process_samples)
        unattributed[gpu] = 0
        device_sm[gpu] = min(1.0, sum(sm_by_pid.values()))
        for proc in device.processes:
            owner = owners.get(proc.pid)
            container_id = owner.container_id if owner is not None else None
            sm = sm_by_pid.get(proc.pid)
            processes.append(
                AttributedProcess(
                    gpu=gpu,
                    gpu_index=device.index,
                    mig_index=device.mig_index,
                    pid=proc.pid,
                    start_ticks=owner.start_ticks if owner is not None else 0,
                    container_id=container_id,
                    used_memory_bytes=proc.used_memory_bytes,
                    sm_ratio=sm,
                    active_at=active_at.get(proc.pid),
                )
            )
            if container_id is None or container_id not in containers:
                unattributed[gpu] += 1
                continue
            acc = usage.setdefault((container_id, gpu), [0.0, 0.0, 0.0])
            acc[0] += proc.used_memory_bytes or 0
            acc[1] += sm or 0.0
            acc[2] += 1
    return Joined(
        processes=tuple(processes),
        usage=tuple(
            ContainerGpuUsage(cid, gpu, int(acc[0]), min(1.0, acc[1]), int(acc[2]))
            for (cid, gpu), acc in usage.items()
        ),
        unattributed=unattributed,
        device_sm_ratio=device_sm,
        unsampled=frozenset(d.key for d in sample.devices if d.utilization_ratio is None),
    )
