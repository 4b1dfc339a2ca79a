"""Task tracker: the life cycle of each GPU task, its deadline, and finished-task history.

A *task* is one stretch of GPU use by one process on one device::

    starting -> input -> computing -> draining -> ended
    (seen)     (memory  (SM samples  (no SM activity
                grew)    > 0)         for DRAIN_AFTER_S after computing)

End of a task, two signals (DESIGN.md "Decisions"; both are kept):
- the process is gone from the device's compute-process list (a CUDA program exits or
  destroys its context; what NVML and gpusim show for almost every real program), and
- its used memory is back to 0 while it is still listed (paper B's signal). The process
  then stays "idle" on the device; if it allocates again, that is a *new* task. This is
  paper B's named limitation: a task that frees and re-allocates counts as two tasks.
A process first seen with 0 bytes is idle (no task yet); ``None`` (NVML cannot tell)
counts as in use.

Keys: a task is keyed by (container, pid, process start ticks, n-th appearance) so PID
reuse (other start ticks) and repeated runs in one process (n) are separate tasks. Order
is process start time, then first-seen order.

Timing: a task that appears between two polls started, on average, half-way between them,
so ``started_at`` (and ``ended_at``) are the midpoint of the previous poll and the poll
that saw the change; this halves the worst-case bias of "time of the poll that saw it"
(paper A measured +0.22 s for the latter). A task already running when the exporter
starts gets the first poll's time.

Deadlines are checked on every poll: a running task past its deadline is an overrun at
that poll (counter + ``deadline_overrun`` event), once per task.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpuguard.contract import RUNNING_PHASES, EventType, Phase
from gpuguard.exporter.events import EventLog
from gpuguard.exporter.model import AttributedProcess, ContainerInfo, Joined

PHASES = RUNNING_PHASES

# NVML updates per-process samples about every 1/6 s, so a poll (100 ms) without a sample
# does not mean the kernels stopped; only this long without one does.
DRAIN_AFTER_S = 0.25

RUN_SECONDS_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0)

DeviceKey = tuple[str, int, int]  # (gpu, pid, start ticks)


@dataclass(frozen=True, slots=True)
class TaskView:
    """A task as reported (running or finished); times are wall clock seconds."""

    task_id: str
    container_id: str | None
    pid: int
    gpu: str
    gpu_index: int
    mig_index: int | None
    proc_start_ticks: int
    order: tuple[int, int]
    phase: Phase
    started_at: float
    memory_bytes: int | None
    sm_ratio: float
    deadline_s: float | None
    overrun: bool
    ended_at: float | None = None

    @property
    def absolute_deadline(self) -> float | None:
        return None if self.deadline_s is None else self.started_at + self.deadline_s

    @property
    def run_s(self) -> float | None:
        return None if self.ended_at is None else self.ended_at - self.started_at

    @property
    def met_deadline(self) -> bool | None:
        if self.deadline_s is None or self.run_s is None:
            return None
        return not self.overrun and self.run_s <= self.deadline_s

    def elapsed_s(self, now: float) -> float:
        end = self.ended_at if self.ended_at is not None else now
        return max(0.0, end - self.started_at)

    def slack_s(self, now: float) -> float | None:
        if self.deadline_s is None:
            return None
        return self.deadline_s - self.elapsed_s(now)


@dataclass(frozen=True, slots=True)
class ContainerStats:
    """Per-container counters (monotonic while the container exists)."""

    finished: int = 0
    hits: int = 0
    misses: int = 0


@dataclass(frozen=True, slots=True)
class RunHistogram:
    """Cumulative histogram of task run times on one GPU."""

    buckets: tuple[int, ...]  # cumulative counts per RUN_SECONDS_BUCKETS bound, then +Inf
    total: float
    count: int


class _Task:
    """Mutable state of one running task (internal to the tracker)."""

    __slots__ = (
        "base_memory",
        "container_id",
        "deadline_s",
        "gpu",
        "gpu_index",
        "last_active",
        "memory",
        "mig_index",
        "order",
        "overrun",
        "phase",
        "pid",
        "sm",
        "start_ticks",
        "started_at",
        "task_id",
    )

    def __init__(self, proc: AttributedProcess, task_id: str, order: tuple[int, int]) -> None:
        self.task_id = task_id
        self.container_id = proc.container_id
        self.pid = proc.pid
        self.gpu = proc.gpu
        self.gpu_index = proc.gpu_index
        self.mig_index = proc.mig_index
        self.start_ticks = proc.start_ticks
        self.order = order
        self.phase = Phase.STARTING
        self.base_memory = proc.used_memory_bytes
        self.memory = proc.used_memory_bytes
        self.sm = 0.0
        self.last_active = 0.0
        self.started_at = 0.0
        self.deadline_s: float | None = None
        self.overrun = False

    def view(self, ended_at: float | None = None) -> TaskView:
        return TaskView(
            task_id=self.task_id,
            container_id=self.container_id,
            pid=self.pid,
            gpu=self.gpu,
            gpu_index=self.gpu_index,
            mig_index=self.mig_index,
            proc_start_ticks=self.start_ticks,
            order=self.order,
            phase=Phase.ENDED if ended_at is not None else self.phase,
            started_at=self.started_at,
            memory_bytes=self.memory,
            sm_ratio=self.sm,
            deadline_s=self.deadline_s,
            overrun=self.overrun,
            ended_at=ended_at,
        )


class Tracker:
    """Turns successive joins into task life cycles, deadline counters and events."""

    def __init__(self, events: EventLog, history_size: int = 256) -> None:
        self._events = events
        self._running: dict[DeviceKey, _Task] = {}
        self._idle: set[DeviceKey] = set()  # listed with 0 bytes after a task ended
        self._appearances: dict[tuple[str | None, int, int], int] = {}
        self._first_seen = itertools.count()
        self._last_poll: float | None = None
        self._containers: Mapping[str, ContainerInfo] = {}
        self.recent: deque[TaskView] = deque(maxlen=history_size)
        self.stats: dict[str, ContainerStats] = {}
        self._hist: dict[str, list[float]] = {}  # gpu -> per-bucket counts + [sum, count]

    # -- per poll ---------------------------------------------------------------------

    def update(self, joined: Joined, now: float, containers: Mapping[str, ContainerInfo]) -> None:
        """Apply one successful GPU sample taken at wall time ``now``."""
        self._containers = containers
        prev = self._last_poll
        change_at = now if prev is None else (prev + now) / 2
        seen: set[DeviceKey] = set()
        for proc in joined.processes:
            key = (proc.gpu, proc.pid, proc.start_ticks)
            seen.add(key)
            task = self._running.get(key)
            if task is None:
                if proc.used_memory_bytes == 0:
                    self._idle.add(key)  # a context with nothing allocated: no task yet
                    continue
                self._idle.discard(key)
                task = self._start(proc, change_at, containers)
            elif task.deadline_s is None and proc.container_id is not None:
                # the container index may sync after the task was first seen
                info = containers.get(proc.container_id)
                task.deadline_s = info.deadline_s if info is not None else None
            self._observe(task, key, proc, now, change_at)
        for key in [k for k in self._running if k not in seen]:
            self._end(key, change_at)
        self._idle &= seen
        self.check_deadlines(now)
        self._last_poll = now

    def check_deadlines(self, now: float) -> None:
        """Count an overrun the moment a running task passes its deadline (once per task).

        Also called when the GPU sample failed: deadlines keep running without a sample.
        """
        for task in self._running.values():
            if task.overrun or task.deadline_s is None:
                continue
            if now - task.started_at > task.deadline_s:
                task.overrun = True
                self._count(task.container_id, misses=1)
                self._emit(EventType.DEADLINE_OVERRUN, task, now, deadline_s=task.deadline_s)

    def forget_containers(self, alive: Mapping[str, ContainerInfo]) -> None:
        """Drop counters of removed containers: a removed container leaves no series."""
        for cid in [c for c in self.stats if c not in alive]:
            del self.stats[cid]

    # -- snapshots --------------------------------------------------------------------

    def running(self) -> tuple[TaskView, ...]:
        """Running tasks in start order (process start ticks, then first seen)."""
        return tuple(t.view() for t in sorted(self._running.values(), key=lambda t: t.order))

    def histograms(self) -> dict[str, RunHistogram]:
        out = {}
        for gpu, acc in self._hist.items():
            n = len(RUN_SECONDS_BUCKETS) + 1
            cumulative = tuple(int(x) for x in itertools.accumulate(acc[:n]))
            out[gpu] = RunHistogram(cumulative, acc[n], int(acc[n + 1]))
        return out

    # -- internals --------------------------------------------------------------------

    def _start(
        self, proc: AttributedProcess, started_at: float, containers: Mapping[str, ContainerInfo]
    ) -> _Task:
        ident = (proc.container_id, proc.pid, proc.start_ticks)
        n = self._appearances.get(ident, 0) + 1
        self._appearances[ident] = n
        cid12 = proc.container_id[:12] if proc.container_id else "-"
        task_id = f"{cid12}:{proc.pid}:{proc.start_ticks}:{n}"
        task = _Task(proc, task_id, (proc.start_ticks, next(self._first_seen)))
        task.started_at = started_at
        info = containers.get(proc.container_id) if proc.container_id else None
        task.deadline_s = info.deadline_s if info is not None else None
        self._running[(proc.gpu, proc.pid, proc.start_ticks)] = task
        self._emit(
            EventType.TASK_STARTED, task, started_at, phase=task.phase, deadline_s=task.deadline_s
        )
        return task

    def _observe(
        self, task: _Task, key: DeviceKey, proc: AttributedProcess, now: float, change_at: float
    ) -> None:
        memory = proc.used_memory_bytes
        task.memory = memory
        task.sm = proc.sm_ratio or 0.0
        if memory == 0:  # paper B: memory back to 0 ends the task; the process stays idle
            self._end(key, change_at)
            self._idle.add(key)
            return
        phase = task.phase
        if task.sm > 0:
            task.last_active = now
            phase = Phase.COMPUTING
        elif phase == Phase.STARTING and _grew(task.base_memory, memory):
            phase = Phase.INPUT
        elif phase == Phase.COMPUTING and now - task.last_active >= DRAIN_AFTER_S:
            phase = Phase.DRAINING
        if phase != task.phase:
            task.phase = phase
            self._emit(EventType.TASK_PHASE, task, now, phase=phase)

    def _end(self, key: DeviceKey, ended_at: float) -> None:
        task = self._running.pop(key)
        ended_at = max(ended_at, task.started_at)
        view = task.view(ended_at)
        if view.deadline_s is not None and not view.overrun:
            # an overrun was already counted as a miss while the task ran
            met = bool(view.met_deadline)
            self._count(task.container_id, hits=int(met), misses=int(not met))
        self._count(task.container_id, finished=1)
        self._observe_run(task.gpu, view.run_s or 0.0)
        self.recent.append(view)
        self._emit(
            EventType.TASK_ENDED, task, ended_at, run_s=view.run_s, deadline_s=view.deadline_s
        )

    def _count(
        self, container_id: str | None, finished: int = 0, hits: int = 0, misses: int = 0
    ) -> None:
        if container_id is None:
            return
        old = self.stats.get(container_id, ContainerStats())
        self.stats[container_id] = ContainerStats(
            old.finished + finished, old.hits + hits, old.misses + misses
        )

    def _observe_run(self, gpu: str, run_s: float) -> None:
        n = len(RUN_SECONDS_BUCKETS) + 1
        acc = self._hist.setdefault(gpu, [0.0] * (n + 2))
        index = next((i for i, bound in enumerate(RUN_SECONDS_BUCKETS) if run_s <= bound), n - 1)
        acc[index] += 1
        acc[n] += run_s
        acc[n + 1] += 1

    def _emit(self, type_: EventType, task: _Task, ts: float, **fields: Any) -> None:
        info = self._containers.get(task.container_id) if task.container_id else None
        self._events.append(
            type_,
            ts=ts,
            task_id=task.task_id,
            container_id=task.container_id,
            container=info.name if info is not None else None,
            gpu=task.gpu_index,
            phase=fields.pop("phase", None),
            **fields,
        )


def _grew(base: int | None, memory: int | None) -> bool:
    return base is not None and memory is not None and memory > base
