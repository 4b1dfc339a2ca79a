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


class _Activity:
    """What a poll's fresh samples say of one process's kernels (times in microseconds)."""

    __slots__ = ("edge", "newest_us", "since_us", "stopped", "until_us")

    def __init__(self) -> None:
        self.since_us: int | None = None  # a run of activity began here (first such sample)
        self.until_us = 0  # last active here (where its newest sample says)
        self.newest_us = -1  # its newest sample's instant
        self.stopped = False  # and stopped there
        self.edge = True  # every fresh sample began or ended a run (none a whole period)

    def add(self, s: ProcessUtilization) -> None:
        if s.began_us is not None and (self.since_us is None or s.began_us < self.since_us):
            self.since_us = s.began_us
        self.edge = self.edge and (s.began_us is not None or s.ended_us is not None)
        if s.timestamp_us > self.newest_us:
            self.newest_us = s.timestamp_us
            self.stopped = s.ended_us is not None
            self.until_us = s.ended_us if s.ended_us is not None else s.timestamp_us


def _sm_by_pid(
    samples: tuple[ProcessUtilization, ...],
) -> tuple[dict[int, float], dict[int, _Activity], set[int]]:
    """Mean SM share per pid over this poll's samples; its activity, from the fresh ones (a
    held one says the process still counts as computing, not that it did anything new);
    the pids only held."""
    total: dict[int, float] = {}
    count: dict[int, int] = {}
    active: dict[int, _Activity] = {}
    held = set()
    for s in samples:
        total[s.pid] = total.get(s.pid, 0.0) + s.sm_ratio
        count[s.pid] = count.get(s.pid, 0) + 1
        if s.held:
            held.add(s.pid)
        elif s.sm_ratio > 0:
            activity = active.get(s.pid)
            if activity is None:
                activity = active[s.pid] = _Activity()
            activity.add(s)
    means = {pid: total[pid] / count[pid] for pid in total}
    return means, active, held


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
        sm_by_pid, active, held = _sm_by_pid(device.process_samples)
        unattributed[gpu] = 0
        device_sm[gpu] = min(1.0, sum(sm_by_pid.values()))
        for proc in device.processes:
            owner = owners.get(proc.pid)
            container_id = owner.container_id if owner is not None else None
            sm = sm_by_pid.get(proc.pid)
            activity = active.get(proc.pid)
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
                    active_at=activity.until_us / 1e6 if activity else None,
                    held=proc.pid in held,
                    active_since=(
                        activity.since_us / 1e6
                        if activity and activity.since_us is not None
                        else None
                    ),
                    stopped=activity.stopped if activity else False,
                    edge=activity.edge if activity else False,
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
