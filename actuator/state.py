"""The exporter's ``/api/v1/state`` and ``/api/v1/events`` (docs/interfaces.md section 3).

The parsed model of the exporter's documents, as the policy reads them. Parsing is pure and
strict on the fields the policy relies on; extra fields are ignored so the exporter may
grow. ``ExporterClient`` (``exporter_client.py``) fetches them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypeVar

from gpuguard.actuator.errors import StateError
from gpuguard.contract import RUNNING_PHASES, Phase, PriorityClass, TaskMode

PHASES = RUNNING_PHASES
_E = TypeVar("_E", Phase, TaskMode, PriorityClass)

#: One admission queue: a whole GPU ``(index, None)`` or one MIG instance ``(index, mig)``.
DeviceKey = tuple[int, int | None]


@dataclass(frozen=True)
class Gpu:
    index: int
    uuid: str
    memory_total_bytes: int
    memory_used_bytes: int
    utilization_ratio: float | None
    mig_index: int | None = None

    @property
    def key(self) -> DeviceKey:
        return (self.index, self.mig_index)


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
    image: str = ""
    state: str = "running"


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


@dataclass(frozen=True)
class EventBatch:
    events: tuple[Event, ...]
    next: int
    truncated: bool


def parse_state(doc: Any) -> ExporterState:
    """Validate a decoded ``/api/v1/state`` document."""
    obj = _obj(doc, "state")
    return ExporterState(
        node=_get(obj, "node", str, "state"),
        seq=_get(obj, "seq", int, "state"),
        timestamp=float(_get(obj, "timestamp", (int, float), "state")),
        sources={str(k): bool(v) for k, v in _get(obj, "sources", dict, "state").items()},
        gpus=tuple(_gpu(g, f"gpus[{i}]") for i, g in enumerate(_list(obj, "gpus"))),
        containers=tuple(
            _container(c, f"containers[{i}]") for i, c in enumerate(_list(obj, "containers"))
        ),
        tasks=tuple(_task(t, f"tasks[{i}]") for i, t in enumerate(_list(obj, "tasks"))),
        recent=tuple(_ended(t, f"recent[{i}]") for i, t in enumerate(obj.get("recent") or [])),
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
            )
        )
    return EventBatch(
        events=tuple(events),
        next=_get(obj, "next", int, "events reply"),
        truncated=_get(obj, "truncated", bool, "events reply"),
    )


def _gpu(doc: Any, where: str) -> Gpu:
    obj = _obj(doc, where)
    return Gpu(
        index=_get(obj, "index", int, where),
        uuid=_get(obj, "uuid", str, where),
        memory_total_bytes=_get(obj, "memory_total_bytes", int, where),
        memory_used_bytes=_get(obj, "memory_used_bytes", int, where),
        utilization_ratio=_opt_float(obj, "utilization_ratio", where),
        mig_index=_opt(obj, "mig_index", int, where),
    )


def _container(doc: Any, where: str) -> Container:
    obj = _obj(doc, where)
    return Container(
        id=_get(obj, "id", str, where),
        name=_get(obj, "name", str, where),
        paused=_get(obj, "paused", bool, where),
        managed=_get(obj, "managed", bool, where),
        role=_opt(obj, "role", str, where),
        deadline_s=_opt_float(obj, "deadline_s", where),
        task_mode=_enum(obj, "task_mode", TaskMode, where),
        priority_class=_enum(obj, "class", PriorityClass, where),
        gpus=tuple(_check(g, str, f"gpus[{i}]", where) for i, g in enumerate(_list(obj, "gpus"))),
        demand_sm_ratio=_opt_float(obj, "demand_sm_ratio", where),
        typical_run_s=_opt_float(obj, "typical_run_s", where),
        image=_opt(obj, "image", str, where) or "",
        state=_opt(obj, "state", str, where) or "running",
    )


def _task(doc: Any, where: str) -> Task:
    obj = _obj(doc, where)
    phase = _enum(obj, "phase", Phase, where)
    if phase not in PHASES:
        raise StateError(f"{where}.phase {phase.value!r} is not one of {', '.join(PHASES)}")
    return Task(
        task_id=_get(obj, "task_id", str, where),
        container_id=_opt(obj, "container_id", str, where),
        container=_opt(obj, "container", str, where),
        pid=_get(obj, "pid", int, where),
        gpu=_get(obj, "gpu", int, where),
        phase=phase,
        started_at=float(_get(obj, "started_at", (int, float), where)),
        elapsed_s=float(_get(obj, "elapsed_s", (int, float), where)),
        memory_bytes=_opt(obj, "memory_bytes", int, where),
        sm_ratio=_opt_float(obj, "sm_ratio", where),
        deadline_s=_opt_float(obj, "deadline_s", where),
        absolute_deadline=_opt_float(obj, "absolute_deadline", where),
        paused=bool(obj.get("paused", False)),
        mig_index=_opt(obj, "mig_index", int, where),
        mode=_enum(obj, "mode", TaskMode, where),
        proc_start_ticks=_get(obj, "proc_start_ticks", int, where),
        boundary=_opt(obj, "boundary", str, where) or "exact",
    )


def _ended(doc: Any, where: str) -> EndedTask:
    obj = _obj(doc, where)
    return EndedTask(
        container_id=_opt(obj, "container_id", str, where),
        started_at=float(_get(obj, "started_at", (int, float), where)),
        ended_at=float(_get(obj, "ended_at", (int, float), where)),
        gpu=_opt(obj, "gpu", int, where),
        mig_index=_opt(obj, "mig_index", int, where),
        boundary=_opt(obj, "boundary", str, where) or "exact",
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
