"""Paper C's node record of this node: state 0/1, float time and free GPU memory, per GPU
and per node (the types, and the compact encoding: ``gpuguard/noderecord.py``).

``NodeRecorder`` builds the record after each poll from what the poll already has
(devices, running tasks, recent finished tasks); the only state kept across polls is each
GPU's utilization over the busy window. ``gpu_record`` is pure. Only ``exact`` tasks of
containers whose deadline the trust policy vouches for are judged; a GPU with no task
with a deadline has unbounded (``inf``) float time; a node is in state 1 while one of its
GPUs is. Definitions and thresholds: docs/interfaces.md §3 and §5; why they are what they
are: docs/design-notes.md, "Node record (paper C)".
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from gpuguard.contract import PriorityClass, StateReason, TaskBoundary
from gpuguard.exporter.model import ContainerInfo, DeviceSample, GpuSample, Joined
from gpuguard.exporter.tracker import TaskView
from gpuguard.noderecord import GpuRecord, NodeRecord


@dataclass(frozen=True, slots=True)
class RecordConfig:
    window_s: float = 30.0
    miss_ratio: float = 0.1  # state 0 above this share of judged tasks missed (0: any miss)
    busy_window_s: float = 5.0
    busy_threshold: float = 0.99
    memory_threshold: float = 0.95


def gpu_record(
    device: DeviceSample,
    running: Iterable[TaskView],
    finished: Iterable[TaskView],
    now: float,
    busy_ratio: float,
    config: RecordConfig,
    unvouched: frozenset[str] = frozenset(),
) -> GpuRecord:
    """One GPU's record from its tasks (pure). ``finished`` may hold older tasks: skipped.
    Tasks of the ``unvouched`` containers count as running, their deadlines not at all."""
    floats: list[float] = []
    slacks: list[float] = []
    misses = judged = 0
    tasks = 0
    for task in running:
        tasks += 1
        if task.container_id in unvouched:
            continue
        slack = task.slack_s(now)  # counts what the tracker saw (a burst's last activity)
        if slack is None or task.boundary is TaskBoundary.MERGED:
            continue  # busy time, no task's deadline
        if task.boundary is TaskBoundary.OPEN:
            slack = max(0.0, slack)  # judged when it ends: no miss, no negative float yet
        floats.append(slack)
        slacks.append(slack)
        misses += task.overrun
        judged += task.overrun
    since = now - config.window_s
    for task in finished:
        if task.absolute_deadline is None or task.ended_at is None or task.ended_at < since:
            continue
        if task.container_id in unvouched:
            continue
        if not task.judged:
            continue  # busy time, or no kernel: neither met nor missed
        floats.append(task.absolute_deadline - task.ended_at)
        misses += task.met_deadline is False
        judged += 1
    total = device.memory_total_bytes
    reasons = []
    if misses and misses > config.miss_ratio * judged:
        reasons.append(StateReason.MISSED_DEADLINE)
    if busy_ratio >= config.busy_threshold:
        reasons.append(StateReason.SATURATED)
    if total > 0 and device.memory_used_bytes >= config.memory_threshold * total:
        reasons.append(StateReason.MEMORY_FULL)
    return GpuRecord(
        gpu=device.key,
        model=device.name,
        state=0 if reasons else 1,
        reasons=tuple(reasons),
        float_time_s=math.fsum(floats) if floats else math.inf,
        deadline_tasks=len(floats),
        recent_misses=misses,
        running_tasks=tasks,
        min_slack_s=min(slacks) if slacks else None,
        busy_ratio=busy_ratio,
        memory_free_bytes=max(0, total - device.memory_used_bytes),
        memory_total_bytes=total,
    )


class NodeRecorder:
    """Builds the record after each poll; keeps each GPU's utilization over the busy window."""

    def __init__(self, node: str, config: RecordConfig | None = None) -> None:
        self.node = node
        self.config = config or RecordConfig()
        self._busy: dict[str, deque[tuple[float, float]]] = {}

    def update(
        self,
        now: float,
        sample: GpuSample | None,
        joined: Joined | None,
        running: tuple[TaskView, ...],
        finished: tuple[TaskView, ...],
        containers: Mapping[str, ContainerInfo] | None = None,
    ) -> NodeRecord:
        """The record for one poll (``sample`` None: the GPU source failed, no GPU)."""
        if sample is None:
            return NodeRecord(self.node, now, ())
        by_gpu_running = _by_gpu(running)
        by_gpu_finished = _by_gpu(finished)
        sm = joined.device_sm_ratio if joined is not None else {}
        yielding = _only_yielding_work(joined, containers or {})
        unvouched = frozenset(
            cid for cid, info in (containers or {}).items() if not info.deadline_vouched
        )
        gpus = []
        for device in sample.devices:
            # A GPU busy only with managed best-effort work is free for real-time work: the
            # actuator freezes that work the moment a real-time task needs the GPU.
            busy = self._busy_ratio(device, {} if device.key in yielding else sm, now,
                                    idle=device.key in yielding)  # fmt: skip
            gpus.append(
                gpu_record(
                    device,
                    by_gpu_running.get(device.key, ()),
                    by_gpu_finished.get(device.key, ()),
                    now,
                    busy,
                    self.config,
                    unvouched,
                )
            )
        for gone in set(self._busy) - {d.key for d in sample.devices}:
            del self._busy[gone]
        return NodeRecord(self.node, now, tuple(gpus))

    def _busy_ratio(
        self, device: DeviceSample, sm: Mapping[str, float], now: float, idle: bool = False
    ) -> float:
        # MIG devices have no utilization: the summed per-process SM share stands in.
        ratio = 0.0 if idle else device.utilization_ratio
        if ratio is None:
            ratio = min(1.0, sm.get(device.key, 0.0))
        window = self._busy.setdefault(device.key, deque())
        window.append((now, ratio))
        while window and window[0][0] < now - self.config.busy_window_s:
            window.popleft()
        return math.fsum(r for _, r in window) / len(window)


def _only_yielding_work(joined: Joined | None, containers: Mapping[str, ContainerInfo]) -> set[str]:
    """GPUs whose every computing process belongs to a managed best-effort container."""
    yielding: dict[str, bool] = {}
    for proc in joined.processes if joined is not None else ():
        if not proc.sm_ratio:
            continue
        info = containers.get(proc.container_id) if proc.container_id else None
        gives_way = (
            info is not None and info.managed and info.priority_class == PriorityClass.BEST_EFFORT
        )
        yielding[proc.gpu] = yielding.get(proc.gpu, True) and gives_way
    return {gpu for gpu, only in yielding.items() if only}


def _by_gpu(tasks: Iterable[TaskView]) -> dict[str, list[TaskView]]:
    out: dict[str, list[TaskView]] = {}
    for task in tasks:
        out.setdefault(task.gpu, []).append(task)
    return out
