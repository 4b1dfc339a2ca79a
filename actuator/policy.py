"""Admission control for shared GPUs: paper B's Algorithm 2, extended. Pure.

``decide(state, trigger, config, ledger)`` turns one fresh exporter snapshot into the
pause/unpause actions (and the skips, with reasons) that admit GPU tasks:

* Queues: one per device, a whole GPU or one MIG instance (hardware-isolated: its own
  queue). Real-time and normal containers' tasks are queued; best-effort ones are not.
* Queue order: FIFO by the task's own start (process start breaks ties) or EDF by absolute
  deadline; tasks without a deadline come after those with one, FIFO among them.
* A device is *occupied* while a task that is allowed to run is in ``starting``, ``input`` or
  ``computing``. A task in ``draining`` (kernel done, copying results out) no longer occupies:
  the exporter calls a task draining as soon as no SM sample stands for it any more (the
  driver's next sample is overdue, or came without it), and says so in an event, so the
  next task's memory input overlaps the previous task's output, which is how a managed run
  finishes earlier than running the tasks strictly one after another. A task stuck in
  ``starting``/``input`` for longer than ``input_timeout_s`` (from its start or its
  admission) stops counting, so an idle context cannot block the queue. A kernel that runs
  in a paused container still occupies (a frozen process's launched kernel keeps running,
  paper B). A saturated device with an active, non-draining task is occupied too.
* Headroom (beyond paper B, which admits while cores are under 100% and memory under 95%):
  tasks are admitted in queue order while each fits: the device is not saturated, memory is
  under ``memory_threshold``, and the candidate's expected SM share (its container's learnt
  demand; unknown = 1.0, the whole device) fits beside the shares of what runs. So light
  tasks run together (paper C's Fig. 4), and a task of unknown or full demand runs alone,
  one at a time as in paper B (``one_at_a_time``: always, as paper B). The first task that
  does not fit stops admission (no overtaking: a big task at the head is not starved by
  small ones behind it).
* While occupied, every managed newcomer that is not admitted and not yet computing is
  paused. A task whose kernel already runs is left alone (pausing gains nothing) and
  recorded as a skip.
* Memory rule: never admit while GPU memory used > ``memory_threshold`` of total; then pause
  again the container admitted last if its task is not yet computing (cudaMalloc cannot
  over-commit).
* Gang admission: a container with tasks on several devices is admitted on all or none. A
  container not admitted on one of its devices is paused (reason ``gang``), and the devices
  are decided again without it; when several such containers block each other, the one
  latest in queue order yields, so the earliest always progresses.
* Priority classes: a best-effort container (``gpuguard.class=best-effort``) is frozen while a
  real-time task (a container with a deadline, or labelled ``real-time``) runs or waits on any
  of its devices, whatever its phase (freezing a many-kernel job stops new launches; the
  device frees once its queued kernels drain), and thawed when none does. Starvation guard:
  one frozen for ``(1 - best_effort_min_share) * best_effort_window_s`` is thawed for
  ``best_effort_min_share * best_effort_window_s``, so it keeps its share of every window.
  Containers of the ``normal`` class keep paper B's admission and never freeze anyone.
* SLO pressure (``slo_pressure``: devices where a real-time container's latency SLO alert
  fires, ``actuator/slo.py``): a best-effort container on such a device is frozen even while
  no real-time task runs or waits there (between the server's requests, which NVML's samples
  see too late to freeze for), and its starvation share is ``slo_best_effort_min_share``
  instead, so it is frozen sooner and longer (reason ``slo_pressure``).
* Only ``gpuguard.managed=true`` containers that are not gpuguard's own (role exporter or
  actuator) are ever paused; unmanaged tasks, including processes in no container, count for
  occupancy but are never touched. At most ``max_actions`` containers per decision.

Containers this actuator paused whose tasks are all gone are unpaused (``task_gone``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from gpuguard.actuator.state import Container, DeviceKey, ExporterState, Gpu, Task
from gpuguard.contract import (
    COMPONENT_ROLES,
    PRE_KERNEL,
    ActionKind,
    ActionReason,
    Phase,
    PriorityClass,
    SkipReason,
    TriggerSource,
)

PAUSE = ActionKind.PAUSE
UNPAUSE = ActionKind.UNPAUSE
ORDERS = ("fifo", "edf")
ADMIT_GRACE_S = 1.0
#: SM shares add up to at most the whole device (with rounding slack).
_FULL = 1.0 + 1e-6
#: A learnt demand below this still takes some of the device.
_MIN_SHARE = 0.01


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
    #: share of each window a frozen best-effort container runs anyway (0: never).
    best_effort_min_share: float = 0.1
    best_effort_window_s: float = 10.0
    #: that share on a device under SLO pressure (a real-time SLO alert fires there)
    slo_best_effort_min_share: float = 0.02
    #: paper B's one task per device at a time, whatever the demands (headroom off)
    one_at_a_time: bool = False


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
    ``admitted``: container id -> wall time this actuator last unpaused it to run (an
    admission, or a best-effort container's share); the container admitted last on a device
    is the one with the newest time there.
    ``exempt_tasks``: tasks released after ``--max-pause``; never paused again.
    """

    paused: Mapping[str, float] = field(default_factory=dict)
    admitted: Mapping[str, float] = field(default_factory=dict)
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
    share: float  # expected SM share while computing (1.0: unknown, the whole device)
    klass: PriorityClass

    @property
    def cid(self) -> str | None:
        return self.task.container_id


@dataclass(frozen=True)
class _Gangs:
    """Containers on several devices held back from all of them, and the global order.

    A held-back gang keeps its place: on its other devices nothing later in the global
    order is admitted past it, or it would starve behind tasks that came after it.
    """

    held_back: set[str]
    rank: Mapping[str, int]  # container -> position of its first task in queue order

    def not_behind(self, reserving: Sequence[_View], views: Sequence[_View]) -> list[_View]:
        """``views`` that may be admitted past the held-back gangs ``reserving`` a place."""
        if not reserving:
            return list(views)
        barrier = min(self.rank.get(v.cid or "", 0) for v in reserving)
        return [v for v in views if v.blocker or self.rank.get(v.cid or "", 0) < barrier]


@dataclass
class _Plan:
    """One device's decision."""

    actions: list[Action]
    skips: list[Skip]
    kept: set[str]  # containers that run on this device
    wanted: set[str]  # containers whose task here runs or waits (needs admission)
    realtime_busy: bool  # a real-time task runs or waits here


def decide(
    state: ExporterState,
    trigger: Trigger,
    config: PolicyConfig,
    ledger: Ledger | None = None,
    slo_pressure: frozenset[DeviceKey] = frozenset(),
) -> Decision:
    """The actions for one fresh snapshot; never raises on well-formed input.

    ``slo_pressure``: devices where a real-time container's SLO alert fires (best-effort
    containers there are frozen sooner and longer).
    """
    ledger = ledger or Ledger()
    if trigger.node is not None and trigger.node != state.node:
        return Decision(
            skips=(Skip(SkipReason.IRRELEVANT_ALERT, f"node {trigger.node} is not ours"),)
        )
    stale = _stale_reason(state, trigger, config)
    if stale:
        return Decision(skips=(Skip(SkipReason.STALE_STATE, stale),))
    skips: list[Skip] = []
    if trigger.gpu is not None and not any(g.index == trigger.gpu for g in state.gpus):
        skips.append(Skip(SkipReason.IRRELEVANT_ALERT, f"gpu {trigger.gpu} not in state"))
    views = [_view(task, state, ledger, trigger.now) for task in state.tasks]
    queued = [v for v in views if v.klass != PriorityClass.BEST_EFFORT]
    best_effort = [v for v in views if v.klass == PriorityClass.BEST_EFFORT]
    plans = _plan_devices(state.gpus, queued, best_effort, trigger.now, config, ledger)
    actions = [a for plan in plans.values() for a in plan.actions]
    skips += [s for plan in plans.values() for s in plan.skips]
    realtime = {key for key, plan in plans.items() if plan.realtime_busy}
    be_actions, be_skips = _best_effort(
        best_effort, realtime, trigger.now, config, ledger, slo_pressure
    )
    actions += be_actions
    skips += be_skips
    if trigger.gpu is not None:
        on_gpu = {t.container_id for t in state.tasks if t.gpu == trigger.gpu}
        actions = [a for a in actions if a.container_id in on_gpu]
        skips = [s for s in skips if s.gpu in (None, trigger.gpu)]
    actions += _release_gone(state, ledger)
    protected = {cid for plan in plans.values() for cid in plan.kept}
    return _finish(actions, skips, protected, config.max_actions)


def queue_order(tasks: Iterable[Task], order: str) -> list[Task]:
    """Tasks in admission order: FIFO by task start (process start breaks ties), or EDF
    (earliest absolute deadline first, no deadline last, FIFO among ties)."""
    fifo = sorted(
        enumerate(tasks), key=lambda it: (it[1].started_at, it[1].proc_start_ticks, it[0])
    )
    if order == "edf":
        fifo.sort(key=lambda it: (it[1].absolute_deadline is None, it[1].absolute_deadline or 0.0))
    return [task for _, task in fifo]


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
    demand = container.demand_sm_ratio if container is not None else None
    share = 1.0 if demand is None else min(1.0, max(_MIN_SHARE, demand))
    klass = container.priority_class if container is not None else PriorityClass.NORMAL
    blocker = _blocker(task, container, ledger)
    return _View(task, container, paused, ours, blocker, since, share, klass)


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


# --- devices and gangs -------------------------------------------------------------------


def _plan_devices(
    gpus: Sequence[Gpu],
    queued: Sequence[_View],
    best_effort: Sequence[_View],
    now: float,
    config: PolicyConfig,
    ledger: Ledger,
) -> dict[DeviceKey, _Plan]:
    """Decide every device; then hold back, one at a time, gangs not admitted everywhere."""
    queues = {
        g.key: _queue([v for v in queued if v.task.device == g.key], config.order) for g in gpus
    }
    be_busy = {v.task.device for v in best_effort if not v.paused and (v.task.sm_ratio or 0) > 0}
    rank: dict[str, int] = {}
    for position, task in enumerate(queue_order([v.task for v in queued], config.order)):
        if task.container_id is not None:
            rank.setdefault(task.container_id, position)
    held_back: set[str] = set()
    while True:
        plans = {
            g.key: _plan_device(
                g, queues[g.key], now, config, ledger, _Gangs(held_back, rank), g.key in be_busy
            )
            for g in gpus
        }
        split = _split_gangs(plans) - held_back
        if not split:
            return plans
        held_back.add(max(split, key=lambda cid: rank.get(cid, 0)))


def _split_gangs(plans: Mapping[DeviceKey, _Plan]) -> set[str]:
    """Containers that need several devices and are kept on some of them only."""
    devices: dict[str, set[DeviceKey]] = {}
    for key, plan in plans.items():
        for cid in plan.wanted:
            devices.setdefault(cid, set()).add(key)
    split = set()
    for cid, keys in devices.items():
        kept = {key for key in keys if cid in plans[key].kept}
        if len(keys) > 1 and kept and kept != keys:
            split.add(cid)
    return split


def _plan_device(
    gpu: Gpu,
    queue: list[_View],
    now: float,
    config: PolicyConfig,
    ledger: Ledger,
    gangs: _Gangs,
    be_busy: bool,
) -> _Plan:
    """One device: what runs (in queue order, while it fits), what waits, and why."""
    actions: list[Action] = []
    skips: list[Skip] = []
    counting = [v for v in queue if not v.paused and _counts(v, now, config)]
    for v in queue:
        if not v.paused and v.task.phase in PRE_KERNEL and v not in counting:
            skips.append(
                _skip(v, SkipReason.INPUT_TIMEOUT, "no SM activity past --policy.input-timeout")
            )
    gang = [v for v in counting if v.cid in gangs.held_back and v.blocker is None]
    actions += [_action(PAUSE, v, ActionReason.GANG) for v in gang]
    live = [v for v in counting if v not in gang]
    # Tasks that run whatever we do: launched kernels, and tasks we may not pause.
    must = [v for v in live if v.task.phase == Phase.COMPUTING or v.blocker]
    frozen_kernels = [
        v for v in queue if (v.paused or v in gang) and v.task.phase == Phase.COMPUTING
    ]
    memory_high = _memory_high(gpu, config)
    last = _last_admitted(live, ledger)
    if memory_high and last is not None and last.task.phase in PRE_KERNEL and not last.blocker:
        actions.append(_action(PAUSE, last, ActionReason.MEMORY_PRESSURE))
        live.remove(last)
        last = None
    busy = _saturated(gpu, queue, be_busy, config) and any(
        not v.paused and v.task.phase != Phase.DRAINING for v in queue
    )
    waiting = [v for v in queue if v.ours and v.blocker is None and v.cid not in gangs.held_back]
    reserving = [v for v in queue if v.cid in gangs.held_back and (v in gang or v.ours)]
    admissible = gangs.not_behind(reserving, [*live, *waiting])
    keep = _admit(
        queue, admissible, must, frozen_kernels, last, memory_high or busy, config.one_at_a_time
    )
    actions += [_action(UNPAUSE, v, ActionReason.ADMIT) for v in keep if v.paused]
    if waiting and memory_high and not any(a.kind == UNPAUSE for a in actions):
        skips.append(Skip(SkipReason.MEMORY_PRESSURE, "GPU memory above threshold", gpu=gpu.index))
    occupied = bool(keep or frozen_kernels or reserving) or busy
    skips += _newcomers(live, keep, frozen_kernels, occupied, actions)
    needing = [*counting, *waiting, *frozen_kernels, *reserving]
    return _Plan(
        actions,
        skips,
        kept={v.cid for v in keep if v.cid is not None},
        wanted={v.cid for v in [*counting, *waiting] if v.cid is not None and v.blocker is None},
        realtime_busy=any(v.klass == PriorityClass.REAL_TIME for v in needing),
    )


def _admit(
    queue: list[_View],
    admissible: list[_View],
    must: list[_View],
    frozen_kernels: list[_View],
    last: _View | None,
    pressure: bool,
    one_at_a_time: bool = False,
) -> list[_View]:
    """What runs on the device: what must, then candidates in order while they fit."""
    keep = list(must)
    used = sum(v.share for v in [*must, *frozen_kernels])
    # The task admitted last goes first if it is still before its kernel: it was the head.
    candidates = [last] if last is not None and last in admissible and last not in keep else []
    candidates += [v for v in queue if v in admissible and v not in keep and v is not last]
    for v in candidates:
        if v.paused and pressure:
            continue  # never admit a waiting task while memory is high or the GPU saturated
        held = bool(keep or frozen_kernels)  # the first task in order always runs
        if held and (pressure or one_at_a_time or used + v.share > _FULL):
            break  # FIFO: nothing behind the first task that does not fit overtakes it
        keep.append(v)
        used += v.share
    return keep


def _newcomers(
    live: list[_View],
    keep: list[_View],
    frozen_kernels: list[_View],
    occupied: bool,
    actions: list[Action],
) -> list[Skip]:
    """Pause live tasks that were not admitted; skips for those that cannot be."""
    skips: list[Skip] = []
    kept_ids = {v.task.task_id for v in keep}
    used = sum(v.share for v in frozen_kernels)
    for v in live:
        if v.task.task_id not in kept_ids:
            if occupied and not any(a.container_id == v.cid for a in actions):
                actions.append(_action(PAUSE, v, ActionReason.NEWCOMER))
        elif v.task.phase == Phase.COMPUTING:
            used += v.share
            if used > _FULL:
                skips.append(_skip(v, SkipReason.KERNEL_RUNNING, "kernel already launched"))
        elif v.blocker and len(keep) > 1:
            skips.append(_skip(v, v.blocker, "cannot be paused; counts for occupancy"))
    return skips


def _counts(view: _View, now: float, config: PolicyConfig) -> bool:
    """Does this unpaused task hold the GPU (computing, or before its kernel, not idle)?"""
    if view.task.phase == Phase.COMPUTING:
        return True
    return view.task.phase in PRE_KERNEL and now - view.since <= config.input_timeout_s


def _saturated(gpu: Gpu, queue: Sequence[_View], be_busy: bool, config: PolicyConfig) -> bool:
    """At or above the saturation ratio, counting queued work only when best-effort runs."""
    if be_busy:  # its kernels fill the device, but it yields to queued tasks
        ratio: float | None = sum(v.task.sm_ratio or 0.0 for v in queue if not v.paused)
    else:
        ratio = gpu.utilization_ratio
    return ratio is not None and ratio >= config.saturation_ratio


def _memory_high(gpu: Gpu, config: PolicyConfig) -> bool:
    total = gpu.memory_total_bytes
    return total > 0 and gpu.memory_used_bytes > config.memory_threshold * total


def _last_admitted(live: Sequence[_View], ledger: Ledger) -> _View | None:
    """The live task on this device whose container this actuator admitted most recently."""
    admitted = [v for v in live if v.cid is not None and v.cid in ledger.admitted]
    return max(admitted, key=lambda v: ledger.admitted[v.cid or ""], default=None)


# --- best-effort containers --------------------------------------------------------------


def _best_effort(
    views: Sequence[_View],
    realtime: set[DeviceKey],
    now: float,
    config: PolicyConfig,
    ledger: Ledger,
    slo_pressure: frozenset[DeviceKey] = frozenset(),
) -> tuple[list[Action], list[Skip]]:
    """Freeze best-effort containers while real-time work needs one of their devices, or a
    real-time SLO fails on one of them."""
    actions: list[Action] = []
    skips: list[Skip] = []
    by_container: dict[str, list[_View]] = {}
    for v in views:
        if v.cid is not None:
            by_container.setdefault(v.cid, []).append(v)
    for cid, mine in by_container.items():
        v = mine[0]
        needed = any(m.task.device in realtime for m in mine)
        protecting = any(m.task.device in slo_pressure for m in mine)
        if not (needed or protecting):
            if v.ours:
                actions.append(_action(UNPAUSE, v, ActionReason.REALTIME_IDLE))
            continue
        share = config.slo_best_effort_min_share if protecting else config.best_effort_min_share
        share_s = share * config.best_effort_window_s
        frozen_s = config.best_effort_window_s - share_s
        if v.blocker:
            if not v.paused:
                skips.append(_skip(v, v.blocker, "best-effort, but cannot be paused"))
        elif v.ours:
            if share_s > 0 and now - ledger.paused[cid] >= frozen_s:
                actions.append(_action(UNPAUSE, v, ActionReason.BEST_EFFORT_SHARE))
        elif not v.paused:
            admitted = ledger.admitted.get(cid)
            if admitted is None or now - admitted >= share_s:
                why = ActionReason.SLO_PRESSURE if protecting else ActionReason.BEST_EFFORT
                actions.append(_action(PAUSE, v, why))
    return actions, skips


# --- clean-up and limits -----------------------------------------------------------------


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
