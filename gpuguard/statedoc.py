"""The exporter's ``/api/v1/state`` and ``/api/v1/events`` (docs/interfaces.md section 3).

The field names are defined here once: the exporter writes them (``gpuguard/exporter/state.py``) and
one typed reader parses them, for the actuator and for ``gpuguard ps``. Parsing is pure and
strict on the fields its readers rely on; extra fields are ignored so the exporter may grow.
The actuator fetches the documents with its ``ExporterClient``, ``gpuguard ps`` with a GET.

The names are plain ``str`` class attributes, not ``StrEnum`` members: the exporter builds
the document on every poll, and ``json`` writes exact ``str`` keys twice as fast.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final, TypeVar

from gpuguard.contract import RUNNING_PHASES, ActivitySource, Phase, PriorityClass, TaskMode

PHASES = RUNNING_PHASES
_E = TypeVar("_E", Phase, TaskMode, PriorityClass)

#: the longest per-process sample period a state may give (the exporter learns at most 2 s)
MAX_SAMPLE_PERIOD_S = 10.0

#: One admission queue: a whole GPU ``(index, None)`` or one MIG instance ``(index, mig)``.
DeviceKey = tuple[int, int | None]


class StateError(Exception):
    """The exporter's document does not follow docs/interfaces.md section 3."""


class _Fields:
    """The field names of one object of the document, as class attributes."""

    @classmethod
    def names(cls) -> tuple[str, ...]:
        """Every field name, in the order the exporter writes them."""
        return tuple(v for k, v in vars(cls).items() if k.isupper() and isinstance(v, str))


class StateField(_Fields):
    """The state document itself."""

    NODE: Final = "node"
    SEQ: Final = "seq"  # sequence number of the newest event
    TIMESTAMP: Final = "timestamp"
    POLL_INTERVAL_S: Final = "poll_interval_s"
    SOURCES: Final = "sources"
    GPUS: Final = "gpus"
    CONTAINERS: Final = "containers"
    TASKS: Final = "tasks"  # running tasks, in queue order
    RECENT: Final = "recent"  # the last finished tasks
    NODE_RECORD: Final = "node_record"  # gpuguard/noderecord.py's own fields


class GpuField(_Fields):
    """One device of ``gpus``."""

    INDEX: Final = "index"
    MIG_INDEX: Final = "mig_index"
    UUID: Final = "uuid"
    NAME: Final = "name"
    MEMORY_TOTAL_BYTES: Final = "memory_total_bytes"
    MEMORY_USED_BYTES: Final = "memory_used_bytes"
    UTILIZATION_RATIO: Final = "utilization_ratio"
    SM_RATIO: Final = "sm_ratio"
    SAMPLE_PERIOD_S: Final = "sample_period_s"  # its per-process samples' period, learnt


class ContainerField(_Fields):
    """One container of ``containers``."""

    ID: Final = "id"
    NAME: Final = "name"
    IMAGE: Final = "image"
    COMMAND: Final = "command"  # the program alone, never its arguments
    STATE: Final = "state"
    PAUSED: Final = "paused"
    MANAGED: Final = "managed"
    DEADLINE_S: Final = "deadline_s"
    DEADLINE_ERROR: Final = "deadline_error"
    GPUS: Final = "gpus"
    ROLE: Final = "role"
    TASK_MODE: Final = "task_mode"
    TASK_MODE_ERROR: Final = "task_mode_error"
    CLASS: Final = "class"
    CLASS_ERROR: Final = "class_error"
    DEMAND_SM_RATIO: Final = "demand_sm_ratio"
    TYPICAL_RUN_S: Final = "typical_run_s"
    LONGEST_RUN_S: Final = "longest_run_s"
    SLO: Final = "slo"
    NAMESPACE: Final = "namespace"
    POD: Final = "pod"
    POD_UID: Final = "pod_uid"
    CLAIMS_REJECTED: Final = "claims_rejected"
    DEADLINE_VOUCHED: Final = "deadline_vouched"
    ACTIVITY: Final = "activity"  # how its GPU work is seen (the launch probe's view)
    DEVICES: Final = "devices"  # where its processes are on the GPU now (optional)


class ActivityField(_Fields):
    """A container's ``activity``."""

    SOURCE: Final = "source"  # ActivitySource
    REASON: Final = "reason"  # ProbeReason when not ``launch``, else null
    BUSY: Final = "busy"
    BUSY_SINCE: Final = "busy_since"
    LAUNCHES: Final = "launches"
    TASKS: Final = "tasks"
    LAST_TASK: Final = "last_task"  # [first launch, last wait's return] or null
    INFLIGHT: Final = "inflight"  # the server's own in-flight gauge, last read, or null
    INFLIGHT_ERROR: Final = "inflight_error"  # why its last read failed, or null
    IN_FLIGHT: Final = "in_flight"  # a kernel launched and not yet waited for, or null
    LAST_STEP: Final = "last_step"  # [a burst's first launch, its wait's return] or null


class DeviceField(_Fields):
    """One device of a container's ``devices``: a whole GPU, or a MIG device of it."""

    GPU: Final = "gpu"
    MIG_INDEX: Final = "mig_index"


class SloField(_Fields):
    """A container's ``slo``."""

    METRIC: Final = "metric"
    TARGET_S: Final = "target_s"
    OBJECTIVE: Final = "objective"
    PORT: Final = "port"


class ClaimField(_Fields):
    """One entry of a container's ``claims_rejected``."""

    LABEL: Final = "label"
    WHY: Final = "why"


class TaskField(_Fields):
    """One task of ``tasks`` or ``recent``."""

    TASK_ID: Final = "task_id"
    CONTAINER_ID: Final = "container_id"
    CONTAINER: Final = "container"
    PID: Final = "pid"
    GPU: Final = "gpu"
    MIG_INDEX: Final = "mig_index"
    MODE: Final = "mode"
    PHASE: Final = "phase"
    STARTED_AT: Final = "started_at"
    PROC_START_TICKS: Final = "proc_start_ticks"
    ELAPSED_S: Final = "elapsed_s"
    MEMORY_BYTES: Final = "memory_bytes"
    SM_RATIO: Final = "sm_ratio"
    DEADLINE_S: Final = "deadline_s"
    ABSOLUTE_DEADLINE: Final = "absolute_deadline"
    SLACK_S: Final = "slack_s"
    OVERRUN: Final = "overrun"
    BOUNDARY: Final = "boundary"
    PAUSED: Final = "paused"
    TIMED_BY: Final = "timed_by"
    # finished tasks (``recent``) only
    ENDED_AT: Final = "ended_at"
    RUN_S: Final = "run_s"
    MET_DEADLINE: Final = "met_deadline"


@dataclass(frozen=True)
class Gpu:
    index: int
    uuid: str
    memory_total_bytes: int
    memory_used_bytes: int
    utilization_ratio: float | None
    mig_index: int | None = None
    #: how often NVML samples its processes, as the exporter learnt it; None: not learnt
    #: (no samples yet, a MIG device, or an exporter that does not say)
    sample_period_s: float | None = None

    @property
    def key(self) -> DeviceKey:
        return (self.index, self.mig_index)


@dataclass(frozen=True)
class Activity:
    """How a container's GPU work is seen (its ``activity``), as the policy needs it."""

    #: ``ActivitySource``'s value: ``launch``, ``gauge`` or ``nvml``
    source: str
    #: work launched and not yet waited for (``launch``), requests in flight (``gauge``)
    busy: bool = False
    #: the running task's first launch (``launch`` only); None: idle or not known
    busy_since: float | None = None
    #: the last finished task's (first launch, last wait's return); None: none seen
    last_task: tuple[float, float] | None = None
    #: a kernel launched and not yet waited for (``launch``; ``gauge``: as ``busy``)
    in_flight: bool = False
    #: its newest step seen whole (first launch of a burst, the wait's return that ended
    #: it), frozen time included if it was frozen inside; None: none seen
    last_step: tuple[float, float] | None = None

    @property
    def exact(self) -> bool:
        """Whether its tasks' starts and ends are seen as they happen (not NVML samples)."""
        return self.source != ActivitySource.NVML


@dataclass(frozen=True)
class Container:
    id: str
    name: str
    paused: bool
    managed: bool
    role: str | None
    deadline_s: float | None
    task_mode: TaskMode = TaskMode.BURST
    priority_class: PriorityClass = PriorityClass.NORMAL
    gpus: tuple[str, ...] = ()
    #: expected SM share of its tasks while computing; None: not learnt yet
    demand_sm_ratio: float | None = None
    #: a task's typical run time (exact task boundaries only); None: not learnt yet
    typical_run_s: float | None = None
    #: the longest run of its last tasks (as ``typical_run_s``); None: none learnt yet
    longest_run_s: float | None = None
    image: str = ""
    state: str = "running"
    #: its program, never its arguments ("" when unknown)
    command: str = ""
    #: why its ``gpuguard.deadline`` label was ignored; None: no label, or a valid one
    deadline_error: str | None = None
    #: Kubernetes identity (containerd source); None on a Docker host
    namespace: str | None = None
    pod: str | None = None
    #: the latency target of the SLO its ``gpuguard.slo.*`` labels declare; None: none
    slo_target_s: float | None = None
    #: the objective of the latency SLO it declares (``slo.objective``); None: no SLO
    slo_objective: float | None = None
    #: how its GPU work is seen; None: an exporter that does not say
    activity: Activity | None = None
    #: the devices its processes are on now, with or without a task (NVML's compute
    #: processes); empty where it has none or the exporter does not say
    devices: tuple[DeviceKey, ...] = ()


@dataclass(frozen=True)
class Task:
    """A running GPU task; ``container_id`` is None for a process in no container."""

    task_id: str
    container_id: str | None
    container: str | None
    pid: int
    gpu: int
    phase: Phase
    started_at: float
    elapsed_s: float
    memory_bytes: int | None
    sm_ratio: float | None
    deadline_s: float | None
    absolute_deadline: float | None
    paused: bool
    mig_index: int | None = None
    mode: TaskMode = TaskMode.BURST
    proc_start_ticks: int = 0
    #: ``TaskBoundary``'s value (``merged``: a busy period holding several requests)
    boundary: str = "exact"
    #: seconds left before its deadline; None: no deadline
    slack_s: float | None = None
    #: a running task with exact boundaries past its deadline
    overrun: bool = False
    #: ``ActivitySource``'s value its boundaries and phases come from: ``launch`` (the
    #: launch probe) or ``nvml`` (the samples; also an exporter that does not say)
    timed_by: str = "nvml"

    @property
    def device(self) -> DeviceKey:
        return (self.gpu, self.mig_index)


@dataclass(frozen=True)
class EndedTask:
    """A finished task from the state's ``recent`` history (what the policy needs of it)."""

    container_id: str | None
    started_at: float
    ended_at: float
    gpu: int | None = None
    mig_index: int | None = None
    #: ``TaskBoundary``'s value: ``merged`` when the task may have held several requests
    boundary: str = "exact"
    #: whether it met its deadline; None: not judged (no deadline, or not ``exact``)
    met_deadline: bool | None = None
    #: its run time as the exporter timed it; None: not given
    run_s: float | None = None

    @property
    def device(self) -> DeviceKey | None:
        return None if self.gpu is None else (self.gpu, self.mig_index)


@dataclass(frozen=True)
class ExporterState:
    node: str
    seq: int
    timestamp: float
    sources: dict[str, bool]
    gpus: tuple[Gpu, ...]
    containers: tuple[Container, ...]
    tasks: tuple[Task, ...]
    recent: tuple[EndedTask, ...] = ()

    def container(self, container_id: str | None) -> Container | None:
        if container_id is None:
            return None
        for container in self.containers:
            if container.id == container_id:
                return container
        return None


@dataclass(frozen=True)
class Event:
    seq: int
    ts: float
    type: str
    task_id: str | None = None
    container_id: str | None = None
    gpu: int | None = None
    phase: str | None = None
    #: ``gpu_busy``/``gpu_idle``: ``ActivitySource``'s value (``launch``, ``gauge``)
    source: str | None = None
    #: ``gpu_idle``: the ended busy period's first launch
    busy_since: float | None = None


@dataclass(frozen=True)
class EventBatch:
    events: tuple[Event, ...]
    next: int
    truncated: bool


def parse_state(doc: Any) -> ExporterState:
    """Validate a decoded ``/api/v1/state`` document; ``StateError`` (one line) if bad."""
    k = StateField
    obj = _obj(doc, "state")
    return ExporterState(
        node=_get(obj, k.NODE, str, "state"),
        seq=_get(obj, k.SEQ, int, "state"),
        timestamp=float(_get(obj, k.TIMESTAMP, (int, float), "state")),
        sources={str(k): bool(v) for k, v in _get(obj, k.SOURCES, dict, "state").items()},
        gpus=tuple(_gpu(g, f"gpus[{i}]") for i, g in enumerate(_list(obj, k.GPUS))),
        containers=tuple(
            _container(c, f"containers[{i}]") for i, c in enumerate(_list(obj, k.CONTAINERS))
        ),
        tasks=tuple(_task(t, f"tasks[{i}]") for i, t in enumerate(_list(obj, k.TASKS))),
        recent=tuple(_ended(t, f"recent[{i}]") for i, t in enumerate(obj.get(k.RECENT) or [])),
    )


def parse_events(doc: Any) -> EventBatch:
    """Validate a decoded ``/api/v1/events`` reply."""
    obj = _obj(doc, "events reply")
    events = []
    for i, item in enumerate(_list(obj, "events")):
        ev = _obj(item, f"events[{i}]")
        events.append(
            Event(
                seq=_get(ev, "seq", int, f"events[{i}]"),
                ts=float(_get(ev, "ts", (int, float), f"events[{i}]")),
                type=_get(ev, "type", str, f"events[{i}]"),
                task_id=_opt(ev, "task_id", str, f"events[{i}]"),
                container_id=_opt(ev, "container_id", str, f"events[{i}]"),
                gpu=_opt(ev, "gpu", int, f"events[{i}]"),
                phase=_opt(ev, "phase", str, f"events[{i}]"),
                source=_opt(ev, "source", str, f"events[{i}]"),
                busy_since=_opt_float(ev, "busy_since", f"events[{i}]"),
            )
        )
    return EventBatch(
        events=tuple(events),
        next=_get(obj, "next", int, "events reply"),
        truncated=_get(obj, "truncated", bool, "events reply"),
    )


def _gpu(doc: Any, where: str) -> Gpu:
    k = GpuField
    obj = _obj(doc, where)
    return Gpu(
        index=_get(obj, k.INDEX, int, where),
        uuid=_get(obj, k.UUID, str, where),
        memory_total_bytes=_get(obj, k.MEMORY_TOTAL_BYTES, int, where),
        memory_used_bytes=_get(obj, k.MEMORY_USED_BYTES, int, where),
        utilization_ratio=_opt_float(obj, k.UTILIZATION_RATIO, where),
        mig_index=_opt(obj, k.MIG_INDEX, int, where),
        sample_period_s=_opt_period(obj, k.SAMPLE_PERIOD_S, where),
    )


def _opt_period(obj: dict[str, Any], key: str, where: str) -> float | None:
    value = _opt_float(obj, key, where)
    if value is not None and not 0.0 < value <= MAX_SAMPLE_PERIOD_S:
        raise StateError(f"{where}.{key} {value!r} is not a period in (0, {MAX_SAMPLE_PERIOD_S}] s")
    return value


def _container(doc: Any, where: str) -> Container:
    k = ContainerField
    obj = _obj(doc, where)
    return Container(
        id=_get(obj, k.ID, str, where),
        name=_get(obj, k.NAME, str, where),
        paused=_get(obj, k.PAUSED, bool, where),
        managed=_get(obj, k.MANAGED, bool, where),
        role=_opt(obj, k.ROLE, str, where),
        deadline_s=_opt_float(obj, k.DEADLINE_S, where),
        task_mode=_enum(obj, k.TASK_MODE, TaskMode, where),
        priority_class=_enum(obj, k.CLASS, PriorityClass, where),
        gpus=tuple(_check(g, str, f"gpus[{i}]", where) for i, g in enumerate(_list(obj, k.GPUS))),
        demand_sm_ratio=_opt_float(obj, k.DEMAND_SM_RATIO, where),
        typical_run_s=_opt_float(obj, k.TYPICAL_RUN_S, where),
        longest_run_s=_opt_float(obj, k.LONGEST_RUN_S, where),
        image=_opt(obj, k.IMAGE, str, where) or "",
        state=_opt(obj, k.STATE, str, where) or "running",
        command=_opt(obj, k.COMMAND, str, where) or "",
        deadline_error=_opt(obj, k.DEADLINE_ERROR, str, where),
        namespace=_opt(obj, k.NAMESPACE, str, where),
        pod=_opt(obj, k.POD, str, where),
        slo_target_s=_slo_target(obj, where),
        slo_objective=_slo_objective(obj, where),
        activity=_activity(obj, where),
        devices=_devices(obj, where),
    )


def _devices(container: dict[str, Any], where: str) -> tuple[DeviceKey, ...]:
    found = _opt(container, ContainerField.DEVICES, list, where)
    keys = []
    for i, item in enumerate(found or ()):
        at = f"{where}.{ContainerField.DEVICES}[{i}]"
        device = _obj(item, at)
        keys.append(
            (_get(device, DeviceField.GPU, int, at), _opt(device, DeviceField.MIG_INDEX, int, at))
        )
    return tuple(keys)


def _activity(container: dict[str, Any], where: str) -> Activity | None:
    obj = _opt(container, ContainerField.ACTIVITY, dict, where)
    if obj is None:
        return None
    k, at = ActivityField, f"{where}.activity"
    source = _get(obj, k.SOURCE, str, at)
    inflight = _opt_float(obj, k.INFLIGHT, at)
    busy = _opt(obj, k.BUSY, bool, at)
    in_flight = _opt(obj, k.IN_FLIGHT, bool, at)
    if source == ActivitySource.GAUGE:
        busy = inflight is not None and inflight > 0
    if in_flight is None or source == ActivitySource.GAUGE:
        in_flight = busy  # an exporter that does not say, or a gauge: busy is all it knows
    return Activity(
        source=source,
        busy=bool(busy),
        busy_since=_opt_float(obj, k.BUSY_SINCE, at),
        last_task=_interval(obj, k.LAST_TASK, at),
        in_flight=bool(in_flight),
        last_step=_interval(obj, k.LAST_STEP, at),
    )


def _interval(obj: dict[str, Any], key: str, at: str) -> tuple[float, float] | None:
    found = _opt(obj, key, list, at)
    if found is None:
        return None
    if len(found) != 2 or not all(_is_number(t) for t in found):
        raise StateError(f"{at}.{key} must be [start, end]")
    return (float(found[0]), float(found[1]))


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _slo_target(obj: dict[str, Any], where: str) -> float | None:
    slo = _opt(obj, ContainerField.SLO, dict, where)
    if slo is None:
        return None
    return float(_get(slo, SloField.TARGET_S, (int, float), f"{where}.slo"))


def _slo_objective(container: dict[str, Any], where: str) -> float | None:
    slo = _opt(container, ContainerField.SLO, dict, where)
    if slo is None:
        return None
    objective = _get(slo, SloField.OBJECTIVE, (int, float), f"{where}.{ContainerField.SLO}")
    if not 0 < objective < 1:
        raise StateError(f"{where}.{ContainerField.SLO}.{SloField.OBJECTIVE} must be in (0, 1)")
    return float(objective)


def _task(doc: Any, where: str) -> Task:
    k = TaskField
    obj = _obj(doc, where)
    phase = _enum(obj, k.PHASE, Phase, where)
    if phase not in PHASES:
        raise StateError(f"{where}.phase {phase.value!r} is not one of {', '.join(PHASES)}")
    return Task(
        task_id=_get(obj, k.TASK_ID, str, where),
        container_id=_opt(obj, k.CONTAINER_ID, str, where),
        container=_opt(obj, k.CONTAINER, str, where),
        pid=_get(obj, k.PID, int, where),
        gpu=_get(obj, k.GPU, int, where),
        phase=phase,
        started_at=float(_get(obj, k.STARTED_AT, (int, float), where)),
        elapsed_s=float(_get(obj, k.ELAPSED_S, (int, float), where)),
        memory_bytes=_opt(obj, k.MEMORY_BYTES, int, where),
        sm_ratio=_opt_float(obj, k.SM_RATIO, where),
        deadline_s=_opt_float(obj, k.DEADLINE_S, where),
        absolute_deadline=_opt_float(obj, k.ABSOLUTE_DEADLINE, where),
        paused=bool(obj.get(k.PAUSED, False)),
        mig_index=_opt(obj, k.MIG_INDEX, int, where),
        mode=_enum(obj, k.MODE, TaskMode, where),
        proc_start_ticks=_get(obj, k.PROC_START_TICKS, int, where),
        boundary=_opt(obj, k.BOUNDARY, str, where) or "exact",
        slack_s=_opt_float(obj, k.SLACK_S, where),
        overrun=bool(obj.get(k.OVERRUN, False)),
        timed_by=_opt(obj, k.TIMED_BY, str, where) or ActivitySource.NVML.value,
    )


def _ended(doc: Any, where: str) -> EndedTask:
    k = TaskField
    obj = _obj(doc, where)
    return EndedTask(
        container_id=_opt(obj, k.CONTAINER_ID, str, where),
        started_at=float(_get(obj, k.STARTED_AT, (int, float), where)),
        ended_at=float(_get(obj, k.ENDED_AT, (int, float), where)),
        gpu=_opt(obj, k.GPU, int, where),
        mig_index=_opt(obj, k.MIG_INDEX, int, where),
        boundary=_opt(obj, k.BOUNDARY, str, where) or "exact",
        met_deadline=_opt(obj, k.MET_DEADLINE, bool, where),
        run_s=_opt_float(obj, k.RUN_S, where),
    )


def _obj(doc: Any, where: str) -> dict[str, Any]:
    if not isinstance(doc, dict):
        raise StateError(f"{where} must be a JSON object")
    return doc


def _list(obj: dict[str, Any], key: str) -> list[Any]:
    value = obj.get(key)
    if not isinstance(value, list):
        raise StateError(f"{key} must be a list")
    return value


def _check(value: Any, kind: type | tuple[type, ...], key: str, where: str) -> Any:
    # bool is an int in Python; a JSON true is never a count or a size.
    if isinstance(value, bool) and kind is not bool:
        raise StateError(f"{where}.{key} has the wrong type (bool)")
    if not isinstance(value, kind):
        raise StateError(f"{where}.{key} has the wrong type ({type(value).__name__})")
    return value


def _get(obj: dict[str, Any], key: str, kind: Any, where: str) -> Any:
    if key not in obj:
        raise StateError(f"{where}.{key} is missing")
    return _check(obj[key], kind, key, where)


def _opt(obj: dict[str, Any], key: str, kind: Any, where: str) -> Any:
    value = obj.get(key)
    return None if value is None else _check(value, kind, key, where)


def _enum(obj: dict[str, Any], key: str, enum: type[_E], where: str) -> _E:
    value = _get(obj, key, str, where)
    if value not in set(enum):
        raise StateError(f"{where}.{key} {value!r} is not one of {', '.join(enum)}")
    return enum(value)


def _opt_float(obj: dict[str, Any], key: str, where: str) -> float | None:
    value = _opt(obj, key, (int, float), where)
    return None if value is None else float(value)
