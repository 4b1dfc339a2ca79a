"""Admission control for shared GPUs: paper B's Algorithm 2, improved. Pure.

``decide(state, trigger, config, ledger)`` turns one fresh exporter snapshot into the
pause/unpause actions (and the skips, with reasons) that admit GPU tasks one at a time:

* Queue order: FIFO by task start (the exporter lists tasks in start order) or EDF by
  absolute deadline; tasks without a deadline come after those with one, FIFO among them.
* A GPU is *occupied* while a task that is allowed to run is in ``starting``, ``input`` or
  ``computing``. A task in ``draining`` (kernel done, copying results out) no longer occupies,
  nor does a ``computing`` task whose SM share fell to 0 while the device was not busy all of
  the last sample period (its kernel ended; the exporter says ``draining`` a little later):
  the next task's memory input then overlaps the previous task's output, which is how a
  managed run finishes earlier than running the tasks strictly one after another.
  A task stuck in ``starting``/``input`` for longer than ``input_timeout_s`` (measured from its
  start or from its admission) stops counting, so an idle context cannot block the queue.
  A kernel that runs in a paused container still occupies (a frozen process's launched kernel
  keeps running, paper B). A saturated GPU with an active, non-draining task is occupied too.
* While occupied, every managed newcomer that is not yet computing is paused. A task whose
  kernel already runs is left alone (pausing gains nothing) and recorded as a skip.
* When free, the first waiting task (a container *this actuator* paused) in queue order is
  admitted, one per GPU per decision.
* Memory rule: never admit while GPU memory used > ``memory_threshold`` of total; then pause
  again the container admitted last if its task is not yet computing (cudaMalloc cannot
  over-commit).
* Only ``gpuguard.managed=true`` containers that are not gpuguard's own (role exporter or
  actuator) are ever paused; unmanaged tasks, including processes in no container, count for
  occupancy but are never touched. At most ``max_actions`` containers per decision.

Containers this actuator paused whose tasks are all gone are unpaused (``task_gone``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from gpuguard.actuator.state import Container, ExporterState, Gpu, Task
from gpuguard.contract import (
    COMPONENT_ROLES,
    PRE_KERNEL,
    ActionKind,
    ActionReason,
    Phase,
    SkipReason,
    TriggerSource,
)

PAUSE = ActionKind.PAUSE
UNPAUSE = ActionKind.UNPAUSE
ORDERS = ("fifo", "edf")
ADMIT_GRACE_S = 1.0


@dataclass(frozen=True)
class PolicyConfig:
    """The policy's knobs (``--policy.*``)."""

    order: str = "fifo"
    max_actions: int = 10
    input_timeout_s: float = 5.0
    memory_threshold: float = 0.95
    #: utilization_ratio at or above which the GPU counts as saturated.
    saturation_ratio: float = 0.99
    #: a snapshot older than this (or with a failed source) is not acted on.
    stale_after_s: float = 5.0


@dataclass(frozen=True)
class Trigger:
    """Why a decision runs; ``gpu``/``node`` narrow it (an alert's labels)."""

    source: TriggerSource
    now: float
    node: str | None = None
    gpu: int | None = None
    alert: str | None = None


@dataclass(frozen=True)
class Ledger:
    """What this actuator itself did, from its journal: the only containers it may unpause.

    ``paused``: container id -> wall time this actuator paused it.
    ``admitted``: container id -> wall time this actuator last unpaused it.
    ``last_admitted``: GPU index -> the container admitted last (for the memory rule).
    ``exempt_tasks``: tasks released after ``--max-pause``; never paused again.
    """

    paused: Mapping[str, float] = field(default_factory=dict)
    admitted: Mapping[str, float] = field(default_factory=dict)
    last_admitted: Mapping[int, str] = field(default_factory=dict)
    exempt_tasks: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Action:
    kind: ActionKind  # PAUSE or UNPAUSE
    container_id: str
    container: str
    reason: ActionReason
    gpu: int | None = None
    task_id: str | None = None


@dataclass(frozen=True)
class Skip:
    reason: SkipReason
    detail: str
    container_id: str | None = None
    task_id: str | None = None
    gpu: int | None = None


@dataclass(frozen=True)
class Decision:
    actions: tuple[Action, ...] = ()
    skips: tuple[Skip, ...] = ()


@dataclass(frozen=True)
class _View:
    """A task with what the policy needs to know about its container."""

    task: Task
    container: Container | None
    paused: bool
    ours: bool  # paused by this actuator
    blocker: SkipReason | None  # why it may never be paused, or None
    since: float  # start of its current chance to run (start or admission)

    @property
    def cid(self) -> str | None:
        return self.task.container_id


def decide(
    state: ExporterState,
    trigger: Trigger,
    config: PolicyConfig,
    ledger: Ledger | None = None,
) -> Decision:
    """The actions for one fresh snapshot; never raises on well-formed input."""
    ledger = ledger or Ledger()
    if trigger.node is not None and trigger.node != state.node:
        return Decision(
            skips=(Skip(SkipReason.IRRELEVANT_ALERT, f"node {trigger.node} is not ours"),)
        )
    stale = _stale_reason(state, trigger, config)
    if stale:
        return Decision(skips=(Skip(SkipReason.STALE_STATE, stale),))
    views = [_view(task, state, ledger, trigger.now) for task in state.tasks]
    actions: list[Action] = []
    skips: list[Skip] = []
    protected: set[str] = set()
    gpus = [g for g in state.gpus if trigger.gpu is None or g.index == trigger.gpu]
    if trigger.gpu is not None and not gpus:
        skips.append(Skip(SkipReason.IRRELEVANT_ALERT, f"gpu {trigger.gpu} not in state"))
    for gpu in gpus:
        on_gpu = _queue([v for v in views if v.task.gpu == gpu.index], config.order)
        acts, kept, gpu_skips = _decide_gpu(gpu, on_gpu, trigger.now, config, ledger)
        actions += acts
        protected |= kept
        skips += gpu_skips
    actions += _release_gone(state, ledger)
    return _finish(actions, skips, protected, config.max_actions)


def queue_order(tasks: Iterable[Task], order: str) -> list[Task]:
    """Tasks in admission order: FIFO by start, or EDF (no deadline last, FIFO among ties)."""
    indexed = list(enumerate(tasks))
    if order == "edf":
        indexed.sort(
            key=lambda it: (
                it[1].absolute_deadline is None,
                it[1].absolute_deadline or 0.0,
                it[0],
            )
        )
    return [task for _, task in indexed]


def _queue(views: Sequence[_View], order: str) -> list[_View]:
    by_id = {v.task.task_id: v for v in views}
    return [by_id[t.task_id] for t in queue_order([v.task for v in views], order)]


def _stale_reason(state: ExporterState, trigger: Trigger, config: PolicyConfig) -> str:
    failed = sorted(name for name, ok in state.sources.items() if not ok)
    if failed:
        return f"exporter source(s) failing: {', '.join(failed)}"
    age = trigger.now - state.timestamp
    if age > config.stale_after_s:
        return f"snapshot is {age:.1f}s old"
    return ""


def _view(task: Task, state: ExporterState, ledger: Ledger, now: float) -> _View:
    container = state.container(task.container_id)
    cid = task.container_id
    ours = cid is not None and cid in ledger.paused
    admitted_at = ledger.admitted.get(cid) if cid is not None else None
    if ours:
        paused = True  # our journal is the truth about what we did, before Docker events land
    elif admitted_at is not None and state.timestamp < admitted_at + ADMIT_GRACE_S:
        # The exporter learns of our unpause from Docker's events a little later; until
        # then trust our own record, or the GPU would look free and admit a second task.
        paused = False
    else:
        paused = container.paused if container is not None else task.paused
    since = max(task.started_at, admitted_at or 0.0)
    return _View(task, container, paused, ours, _blocker(task, container, ledger), since)


def _blocker(task: Task, container: Container | None, ledger: Ledger) -> SkipReason | None:
    if container is None:
        return SkipReason.UNMANAGED  # a process in no container, or one the exporter cannot name
    if container.role in COMPONENT_ROLES:
        return SkipReason.GPUGUARD_COMPONENT
    if not container.managed:
        return SkipReason.UNMANAGED
    if task.task_id in ledger.exempt_tasks:
        return SkipReason.MAX_PAUSE_EXEMPT
    return None


def _saturated(gpu: Gpu, config: PolicyConfig) -> bool:
    ratio = gpu.utilization_ratio
    return ratio is not None and ratio >= config.saturation_ratio


def _memory_high(gpu: Gpu, config: PolicyConfig) -> bool:
    total = gpu.memory_total_bytes
    return total > 0 and gpu.memory_used_bytes > config.memory_threshold * total


def _decide_gpu(
    gpu: Gpu, queue: list[_View], now: float, config: PolicyConfig, ledger: Ledger
) -> tuple[list[Action], set[str], list[Skip]]:
    """One GPU: returns actions, the containers that must keep running, and skips."""
    actions: list[Action] = []
    skips: list[Skip] = []
    live = [v for v in queue if not v.paused and _counts(v, gpu, now, config)]
    for v in queue:
        if not v.paused and v.task.phase in PRE_KERNEL and v not in live:
            skips.append(
                _skip(v, SkipReason.INPUT_TIMEOUT, "no SM activity past --policy.input-timeout")
            )
    # Tasks that run whatever we do: launched kernels, and tasks we may not pause.
    must = [v for v in live if v.task.phase == Phase.COMPUTING or v.blocker]
    frozen_kernels = [v for v in queue if v.paused and v.task.phase == Phase.COMPUTING]
    memory_high = _memory_high(gpu, config)
    last = _last_admitted_view(live, ledger, gpu.index)
    if memory_high and last is not None and last.task.phase in PRE_KERNEL and not last.blocker:
        actions.append(_action(PAUSE, last, ActionReason.MEMORY_PRESSURE))
        live.remove(last)
        last = None
    busy = _saturated(gpu, config) and any(
        not v.paused and v.task.phase != Phase.DRAINING for v in queue
    )
    waiting = [v for v in queue if v.ours and v.blocker is None]
    keep = list(must)
    if not must and not frozen_kernels:
        # The head of the queue runs next: the task admitted last if it is still before its
        # kernel, else the first task in queue order, waiting (paused by us) or not.
        eligible = (
            live if (memory_high or busy) else [v for v in queue if v in live or v in waiting]
        )
        head = last or next(iter(eligible), None)
        if head is not None:
            keep = [head]
            if head.paused:
                actions.append(_action(UNPAUSE, head, ActionReason.ADMIT))
    if waiting and memory_high and not any(a.kind == UNPAUSE for a in actions):
        skips.append(Skip(SkipReason.MEMORY_PRESSURE, "GPU memory above threshold", gpu=gpu.index))
    occupied = bool(keep or frozen_kernels) or busy
    kept_ids = {v.task.task_id for v in keep}
    running = len(frozen_kernels)
    for v in live:
        if v.task.task_id not in kept_ids:
            if occupied and not any(a.container_id == v.cid for a in actions):
                actions.append(_action(PAUSE, v, ActionReason.NEWCOMER))
        elif v.task.phase == Phase.COMPUTING:
            running += 1
            if running > 1:
                skips.append(_skip(v, SkipReason.KERNEL_RUNNING, "kernel already launched"))
        elif v.blocker and len(keep) > 1:
            skips.append(_skip(v, v.blocker, "cannot be paused; counts for occupancy"))
    protected = {v.cid for v in keep if v.cid is not None}
    return actions, protected, skips


def _counts(view: _View, gpu: Gpu, now: float, config: PolicyConfig) -> bool:
    """Does this unpaused task hold the GPU (computing, or before its kernel, not idle)?"""
    if view.task.phase == Phase.COMPUTING:
        return not _kernel_done(view.task, gpu, config)
    return view.task.phase in PRE_KERNEL and now - view.since <= config.input_timeout_s


def _kernel_done(task: Task, gpu: Gpu, config: PolicyConfig) -> bool:
    """A ``computing`` task whose kernel has ended, before the exporter says ``draining``.

    The exporter waits a while without SM samples before it calls a task draining (NVML's
    samples are sparse). Paper B admits the next task as soon as GPU core use drops below
    100%: a task with no SM share in the latest sample while the device was not busy all
    of the last sample period has finished its kernel, so the next task's input may start
    while this one copies its results out.
    """
    ratio = gpu.utilization_ratio
    return task.sm_ratio == 0.0 and ratio is not None and ratio < config.saturation_ratio


def _last_admitted_view(live: Sequence[_View], ledger: Ledger, gpu: int) -> _View | None:
    cid = ledger.last_admitted.get(gpu)
    return next((v for v in live if cid is not None and v.cid == cid), None)


def _release_gone(state: ExporterState, ledger: Ledger) -> list[Action]:
    """Unpause containers we paused that have no running task any more."""
    with_tasks = {t.container_id for t in state.tasks}
    names = {c.id: c.name for c in state.containers}
    return [
        Action(UNPAUSE, cid, names.get(cid, cid[:12]), ActionReason.TASK_GONE)
        for cid in sorted(ledger.paused)
        if cid not in with_tasks
    ]


def _finish(actions: list[Action], skips: list[Skip], protected: set[str], cap: int) -> Decision:
    """One action per container, never pause a protected one, pauses first, then the cap."""
    chosen: list[Action] = []
    seen: set[str] = set()
    ordered = [a for a in actions if a.kind == PAUSE] + [a for a in actions if a.kind == UNPAUSE]
    for action in ordered:
        if action.container_id in seen:
            continue
        if action.kind == PAUSE and action.container_id in protected:
            skips.append(
                Skip(SkipReason.RUNS_ELSEWHERE, "container runs a kept task", action.container_id)
            )
            continue
        seen.add(action.container_id)
        if len(chosen) >= cap:
            skips.append(
                Skip(
                    SkipReason.CAP, f"more than {cap} actions", action.container_id, action.task_id
                )
            )
            continue
        chosen.append(action)
    return Decision(tuple(chosen), tuple(skips))


def _action(kind: ActionKind, view: _View, reason: ActionReason) -> Action:
    assert view.cid is not None  # only views without a blocker are acted on
    name = view.task.container or (view.container.name if view.container else view.cid[:12])
    return Action(kind, view.cid, name, reason, view.task.gpu, view.task.task_id)


def _skip(view: _View, reason: SkipReason, detail: str) -> Skip:
    return Skip(reason, detail, view.cid, view.task.task_id, view.task.gpu)
