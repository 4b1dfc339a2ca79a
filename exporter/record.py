"""Paper C's node record: state 0/1, float time and free GPU memory, per GPU and per node.

Computed from what one poll already has (devices, running tasks, recent finished tasks); the
only state kept across polls is each GPU's utilization over a short window.

Definitions (paper C's Algorithm 2, made precise; docs/interfaces.md §3 and §5):

- **Float time** of a task = absolute deadline - end. A finished task counts while it ended
  within the record window (``--record.window``, 30 s); a running task counts with its
  current slack (absolute deadline - now), the most float it can still end with. A GPU's
  float time is the sum over its tasks with a deadline; with none it is unbounded (``inf``):
  an idle GPU has nothing to protect. (Paper C's sum over zero tasks would be 0 and keep
  every idle node out of its list.)
- Only tasks whose boundaries are real count (``TaskView.boundary``, issue 15): ``exact``
  ones are judged and summed as above; a running burst that is still ``open`` (judged when
  it ends) adds its slack while that is positive and is never a miss while it runs; a
  ``merged`` burst (busy time that may hold several requests) and a task without a kernel
  add nothing: a busy server never takes its own node out. Its work still shows in the
  busy window and in memory.
- **State 0** when, on that GPU: more than ``--record.miss-ratio`` (10%) of the tasks
  judged in the record window missed their deadline (a running ``exact`` task already past
  it counts as a miss now), or a kernel ran at least ``busy_threshold`` (0.99) of the busy window
  (``--record.busy-window``, 5 s), or used memory is at least ``memory_threshold`` (0.95)
  of the total.
  NVML's utilization is the share of time *any* kernel ran, so one tiny kernel already reads
  100%; a single sample says little, the share over a few seconds says the GPU is never free.
  95% memory is where admission control stops admitting (cudaMalloc cannot over-commit).
  Misses: paper C says any miss, for ever. A miss holds the GPU out for the window, so a
  lasting overload stays out and a burst does not; 30 s is two scrapes of Prometheus'
  default profile (the placer and the alert see every state 0). More than 10% missed is a
  guarantee ratio below 0.9, the line NodeCannotGuaranteeDeadlines draws; a light service
  running 13 tasks a second is not taken out by one late task among hundreds. Measured on
  the simulated cluster of bench/placement.py: "any miss, for a minute" took GPUs out faster
  than load left them, the remaining ones overloaded and missed in turn, and gpuguard's
  policy met fewer deadlines than random placement. Misses older than the exporter's
  ``--history.size`` finished tasks are not seen either.
- A **node** is in state 1 while at least one of its GPUs is (one GPU per node, as in paper
  C, makes the two the same); its float time and free memory are the sums over its GPUs.

Table 3's report is 1 + 5 + 10 bytes: ``NodeRecord.compact()`` encodes state, float time
(ms) and free memory (bytes) in exactly that layout; Prometheus metrics are the transport.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gpuguard.contract import PriorityClass, StateReason, TaskBoundary
from gpuguard.exporter.model import ContainerInfo, DeviceSample, GpuSample, Joined
from gpuguard.exporter.tracker import TaskView

COMPACT_SIZE = 16
_FLOAT_MS_MAX = 2**39 - 1  # signed 40 bits: also what "unbounded" encodes to
_MEMORY_MAX = 2**80 - 1


@dataclass(frozen=True, slots=True)
class RecordConfig:
    window_s: float = 30.0
    miss_ratio: float = 0.1  # state 0 above this share of judged tasks missed (0: any miss)
    busy_window_s: float = 5.0
    busy_threshold: float = 0.99
    memory_threshold: float = 0.95


@dataclass(frozen=True, slots=True)
class GpuRecord:
    """One GPU's part of the record."""

    gpu: str
    model: str
    state: int
    reasons: tuple[StateReason, ...]
    float_time_s: float  # inf: no task with a deadline in the window
    deadline_tasks: int  # tasks whose float time is summed
    recent_misses: int
    running_tasks: int
    min_slack_s: float | None  # least slack of a running task with a deadline
    busy_ratio: float
    memory_free_bytes: int
    memory_total_bytes: int

    def to_json(self) -> dict[str, Any]:
        return {
            "gpu": self.gpu,
            "model": self.model,
            "state": self.state,
            "reasons": [str(r) for r in self.reasons],
            "float_time_s": _finite_or_none(self.float_time_s),
            "deadline_tasks": self.deadline_tasks,
            "recent_misses": self.recent_misses,
            "running_tasks": self.running_tasks,
            "min_slack_s": self.min_slack_s,
            "busy_ratio": self.busy_ratio,
            "memory_free_bytes": self.memory_free_bytes,
            "memory_total_bytes": self.memory_total_bytes,
        }


@dataclass(frozen=True, slots=True)
class NodeRecord:
    """A node's record: the per-GPU records and paper C's node-level summary."""

    node: str
    timestamp: float
    gpus: tuple[GpuRecord, ...]

    @property
    def state(self) -> int:
        return int(any(g.state for g in self.gpus))

    @property
    def reasons(self) -> tuple[StateReason, ...]:
        """Why the node is in state 0 (empty in state 1)."""
        if not self.gpus:
            return (StateReason.NO_GPU,)
        if self.state:
            return ()
        return tuple(r for r in StateReason if any(r in g.reasons for g in self.gpus))

    @property
    def float_time_s(self) -> float:
        return math.fsum(g.float_time_s for g in self.gpus) if self.gpus else 0.0

    @property
    def memory_free_bytes(self) -> int:
        return sum(g.memory_free_bytes for g in self.gpus)

    def compact(self) -> bytes:
        """Table 3's 16-byte report: state (1 byte), float time in ms (5), free memory (10)."""
        float_ms = self.float_time_s * 1000
        ms = _FLOAT_MS_MAX if float_ms >= _FLOAT_MS_MAX else max(-_FLOAT_MS_MAX, int(float_ms))
        return (
            self.state.to_bytes(1, "big")
            + ms.to_bytes(5, "big", signed=True)
            + min(self.memory_free_bytes, _MEMORY_MAX).to_bytes(10, "big")
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "timestamp": self.timestamp,
            "state": self.state,
            "reasons": [str(r) for r in self.reasons],
            "float_time_s": _finite_or_none(self.float_time_s),
            "memory_free_bytes": self.memory_free_bytes,
            "compact": self.compact().hex(),
            "gpus": [g.to_json() for g in self.gpus],
        }


@dataclass(frozen=True, slots=True)
class CompactRecord:
    """What a 16-byte report carries."""

    state: int
    float_time_s: float
    memory_free_bytes: int


def decode_compact(data: bytes) -> CompactRecord:
    """Read ``NodeRecord.compact()`` back; ValueError when it is not 16 bytes."""
    if len(data) != COMPACT_SIZE:
        raise ValueError(f"a compact record has {COMPACT_SIZE} bytes, got {len(data)}")
    ms = int.from_bytes(data[1:6], "big", signed=True)
    return CompactRecord(
        state=data[0],
        float_time_s=math.inf if ms == _FLOAT_MS_MAX else ms / 1000,
        memory_free_bytes=int.from_bytes(data[6:], "big"),
    )


def gpu_record(
    device: DeviceSample,
    running: Iterable[TaskView],
    finished: Iterable[TaskView],
    now: float,
    busy_ratio: float,
    config: RecordConfig,
) -> GpuRecord:
    """One GPU's record from its tasks (pure). ``finished`` may hold older tasks: skipped."""
    floats: list[float] = []
    slacks: list[float] = []
    misses = judged = 0
    tasks = 0
    for task in running:
        tasks += 1
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


def _finite_or_none(value: float) -> float | None:
    return value if math.isfinite(value) else None
