"""Work seen as it happens (a container's ``activity`` source ``launch`` or ``gauge``): its
tasks' phases, and the devices where such real-time work is busy or idle. Pure.

Why: docs/design-notes.md, "Best-effort on busy/idle edges".
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from gpuguard.actuator.state import Activity, Container, DeviceKey, ExporterState, Gpu, Task
from gpuguard.contract import PRE_KERNEL, ActivitySource, Phase, PriorityClass

#: NVML's per-process samples come about this often where the exporter has not learnt a
#: device's period: what is not seen exactly may have run unseen for one period (and a
#: best-effort kernel not seen exactly may last as long)
NVML_SAMPLE_S = 1 / 6


def sample_period(periods: Mapping[DeviceKey, float], devices: Iterable[DeviceKey]) -> float:
    """The longest learnt sample period of ``devices`` (``NVML_SAMPLE_S`` where not learnt):
    an H200 samples every 0.2 s, not 1/6."""
    return max((periods.get(d, NVML_SAMPLE_S) for d in devices), default=NVML_SAMPLE_S)


def sample_periods(state: ExporterState) -> dict[DeviceKey, float]:
    """Each device's learnt sample period, where the exporter says one."""
    return {g.key: g.sample_period_s for g in state.gpus if g.sample_period_s is not None}


def exact_activity(container: Container | None) -> Activity | None:
    """The container's activity where its tasks' starts and ends are exact, else None."""
    activity = container.activity if container is not None else None
    return activity if activity is not None and activity.exact else None


def idle_exactly(container: Container | None) -> bool:
    """Seen exactly with no kernel in flight: pausing it stops no kernel."""
    activity = exact_activity(container)
    return activity is not None and not activity.in_flight


def idle_exact(state: ExporterState) -> frozenset[str]:
    """Containers other than best-effort ones that the probe (or a gauge) sees idle."""
    return frozenset(
        c.id
        for c in state.containers
        if c.priority_class != PriorityClass.BEST_EFFORT and idle_exactly(c)
    )


def edge_phase(task: Task, container: Container | None) -> Task:
    """The task as its exact activity shows it: a kernel in flight is computing (whatever
    NVML's last sample said); unchanged where not seen exactly. A task the samples time
    with no kernel in flight is draining (its copies are not kernels); one the probe times
    keeps the exporter's phase then, which knows whether the task goes on: host work
    between two of its kernels holds the device as its kernels do, its output drains."""
    activity = exact_activity(container)
    if activity is None:
        return task
    if task.paused:
        return task
    if activity.in_flight and task.phase in PRE_KERNEL:
        return replace(task, phase=Phase.COMPUTING)  # launched since NVML's last sample
    timed = task.timed_by == ActivitySource.LAUNCH
    if not activity.in_flight and task.phase == Phase.COMPUTING and not timed:
        return replace(task, phase=Phase.DRAINING)
    return task


@dataclass(frozen=True)
class Edges:
    """Real-time work seen exactly, by device."""

    #: real-time containers seen exactly (the NVML law leaves them out)
    containers: frozenset[str] = frozenset()
    #: devices where one of them is busy now
    busy: frozenset[DeviceKey] = frozenset()
    #: devices where all of them are idle -> the end of their last task (-inf: none ran)
    idle_since: Mapping[DeviceKey, float] = field(default_factory=dict)
    #: devices -> the least slack of their real-time containers seen exactly: deadline
    #: less longest run; absent where one has no deadline or no run learnt yet
    slack_s: Mapping[DeviceKey, float] = field(default_factory=dict)


def declared_devices(gpus: Sequence[str], devices: Sequence[Gpu]) -> set[DeviceKey]:
    """The state's devices a container's declared GPUs name (``--gpus``,
    NVIDIA_VISIBLE_DEVICES): ``all``, an index (a whole GPU, or every MIG device of it),
    ``<gpu>:<mig>``, or a device's UUID."""
    found: set[DeviceKey] = set()
    for name in gpus:
        index, _, mig = name.partition(":")
        for gpu in devices:
            named = name in ("all", gpu.uuid) or (index.isdigit() and int(index) == gpu.index)
            if named and (not mig or (mig.isdigit() and int(mig) == gpu.mig_index)):
                found.add(gpu.key)
    return found


def devices_of(state: ExporterState) -> dict[str, set[DeviceKey]]:
    """Container id -> the devices where its next work may start: those of its running and
    recent tasks and those its processes are on; for a container with none of these, the
    devices it was given (its first work, before its process shows on the GPU)."""
    devices: dict[str, set[DeviceKey]] = {}
    for task in state.tasks:
        if task.container_id is not None:
            devices.setdefault(task.container_id, set()).add(task.device)
    for ended in state.recent:
        if ended.container_id is not None and ended.device is not None:
            devices.setdefault(ended.container_id, set()).add(ended.device)
    for c in state.containers:
        mine = devices.setdefault(c.id, set())
        mine.update(c.devices)
        if not mine:
            mine.update(declared_devices(c.gpus, state.gpus))
    return devices


def edges_of(state: ExporterState, devices: Mapping[str, Collection[DeviceKey]]) -> Edges:
    """Which devices exact real-time work holds now, and since when the idle ones are idle.
    ``devices``: ``devices_of(state)``."""
    exact: set[str] = set()
    busy: set[DeviceKey] = set()
    idle: dict[DeviceKey, float] = {}
    slack: dict[DeviceKey, float] = {}
    unknown: set[DeviceKey] = set()
    for c in state.containers:
        activity = exact_activity(c)
        if activity is None or c.priority_class != PriorityClass.REAL_TIME:
            continue
        exact.add(c.id)
        known = c.deadline_s is not None and c.longest_run_s is not None
        for device in devices.get(c.id, ()):
            if activity.busy:
                busy.add(device)
            else:
                end = activity.last_task[1] if activity.last_task else -math.inf
                idle[device] = max(idle.get(device, -math.inf), end)
            if known:
                own = c.deadline_s - c.longest_run_s  # type: ignore[operator]
                slack[device] = min(slack.get(device, math.inf), own)
            else:
                unknown.add(device)
    idle = {d: t for d, t in idle.items() if d not in busy}
    slack = {d: s for d, s in slack.items() if d not in unknown}
    return Edges(frozenset(exact), frozenset(busy), idle, slack)


def thaw_after_s(
    container: Container | None,
    freeze_s: float,
    slack_s: float | None = None,
    step_s: float | None = None,
    sample_s: float = NVML_SAMPLE_S,
) -> float:
    """How long exact real-time work must have been idle before a best-effort container is
    thawed into the gap. A thaw risks the measured freeze and thaw (``freeze_s`` each) and
    the best-effort work in flight when it is frozen again, which the next real-time task
    waits out: its steps' length where learnt unfrozen (``step_s``, ``Recent.steps``), else
    its last task's where seen exactly, else one NVML sample (``sample_s``, the device's
    period; the most, in every case).
    Where the real-time side's least slack (``slack_s``: deadline less its longest run)
    covers twice that work, the gap is thawed at once (the freeze and thaw only); otherwise
    a gap shorter than the work in flight is left to the real-time side."""
    activity = exact_activity(container)
    last = activity.last_task if activity is not None else None
    if step_s is not None and activity is not None:
        in_flight = min(sample_s, step_s)
    elif last is not None:
        in_flight = min(sample_s, last[1] - last[0])
    else:
        in_flight = sample_s
    in_flight = max(0.0, in_flight)
    if slack_s is not None and slack_s >= 2 * in_flight:
        return 2 * freeze_s
    return 2 * freeze_s + in_flight
