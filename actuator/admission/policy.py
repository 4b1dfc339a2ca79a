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
* While occupied, every managed newcomer that is not admitted is paused.
* Preemption (``--policy.preempt``, on by default). Freezing a process stops its next
  kernel launches; only what it already queued drains. Real programs keep their memory and
  launch back to back, so their tasks are first seen already computing: an admission that
  left computing tasks alone did nothing between two servers. So a computing task is a
  candidate like any other: when a task with precedence (queue order: real-time before
  normal, then FIFO or EDF) waits on a device that a later or looser task holds, the holder
  is frozen (``preempt``) and the waiter runs; frozen holders are thawed in queue order.
  Against thrash: a task admitted less than ``preempt_quantum_s`` ago is not preempted
  (``run_quantum``), and no holder is preempted when every waiter it would make way for
  misses its deadline anyway while the holder, left alone, would meet its own and, preempted,
  would not (``preempt_futile``; run times from the container's learnt ``typical_run_s``,
  else only deadlines already past count). With preemption off, a task whose kernel already
  runs is left alone and recorded as a skip (``kernel_running``), as paper B does.
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
  device frees once its queued kernels drain). No flapping: it stays frozen for a hold after
  the last real-time activity on its devices (``Recent.realtime_seen``; the hold doubles
  while freezes follow thaws closely, up to ``best_effort_hold_max_s``, and halves back when
  they stop), so a ``draining`` report that a next request already contradicts thaws
  nothing. Starvation guard over every sliding window: a frozen one is thawed once its
  frozen time within the last ``best_effort_window_s`` reaches ``1 - best_effort_min_share``
  of it, and frozen again only when a freeze of at least the hold fits in the window.
  ``Decision.next_due`` says when a hold, a share or a quantum falls due, and the
  controller decides again then (``timer``), not only on the next event. A light server
  whose requests NVML cannot separate (``_light_servers``) freezes no one: it is
  scheduled as a whole, beside its best-effort neighbour, unless its SLO alert fires.
  Containers of the ``normal`` class keep paper B's admission and never freeze anyone.
* SLO pressure (``slo_pressure``: devices where a real-time container's latency SLO alert
  fires, ``actuator/admission/slo.py``): a best-effort container on such a device is frozen
  even while
  no real-time task runs or waits there (between the server's requests, which NVML's samples
  see too late to freeze for), and its starvation share is ``slo_best_effort_min_share``
  instead, so it is frozen sooner and longer (reason ``slo_pressure``).
* Only ``gpuguard.managed=true`` containers that are not gpuguard's own (role exporter or
  actuator) are ever paused; unmanaged tasks, including processes in no container, count for
  occupancy but are never touched. At most ``max_actions`` containers per decision.

Containers this actuator paused whose tasks are all gone are unpaused (``task_gone``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from gpuguard.actuator.state import Container, DeviceKey, ExporterState, Gpu, Task
from gpuguard.contract import (
    COMPONENT_ROLES,
    PRE_KERNEL,
    ActionKind,
    ActionReason,
    Phase,
    PriorityClass,
    SkipReason,
    TaskBoundary,
    TaskMode,
    TriggerSource,
)

PAUSE = ActionKind.PAUSE
UNPAUSE = ActionKind.UNPAUSE
ORDERS = ("fifo", "edf")
ADMIT_GRACE_S = 1.0
#: a container whose task ended this recently, with no next one seen yet, is between two
#: tasks (and one seen computing this soon after a drain went straight on: a repeater)
REPEAT_GAP_S = 2.0
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
    #: freeze a computing task that holds a device a task with precedence waits for
    preempt: bool = True
    #: a task admitted this recently is not preempted
    preempt_quantum_s: float = 0.5
    #: a best-effort freeze outlasts the last real-time activity on its devices by this much
    #: (two NVML sample periods: a draining report the next sample contradicts thaws nothing)
    best_effort_hold_s: float = 0.3
    #: the hold doubles while freezes follow thaws closely, up to this
    best_effort_hold_max_s: float = 4.0
    #: a container that yielded between tasks waits at most this long for its turn
    max_yield_s: float = 30.0
    #: best-effort work is not frozen for a real-time container whose requests NVML cannot
    #: separate (its busy periods merge them) and whose demand is at most this share
    best_effort_coexist_demand: float = 0.5


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
    #: containers paused as they drained or between tasks (``yield``) -> the GPU: queued
    #: as their next task would be
    yielded: Mapping[str, int | None] = field(default_factory=dict)


@dataclass(frozen=True)
class Recent:
    """What the actuator saw lately (memory only; the controller keeps it, see
    ``actuator/admission/history.py``). Empty after a restart, which only makes holds start afresh.

    ``realtime_seen``: device -> last time a real-time task ran or waited on it.
    ``frozen_spans``: best-effort container -> its finished freezes (start, end) that reach
    into the last window; the current freeze is ``Ledger.paused``.
    ``hold_s``: best-effort container -> its current (adaptive) hold.
    ``straight_on``: containers seen (or whose image was last seen) computing again within
    ``REPEAT_GAP_S`` of a drain with no input phase between: they yield as they drain.
    """

    realtime_seen: Mapping[DeviceKey, float] = field(default_factory=dict)
    frozen_spans: Mapping[str, tuple[tuple[float, float], ...]] = field(default_factory=dict)
    hold_s: Mapping[str, float] = field(default_factory=dict)
    #: containers seen (or whose image was last seen) going straight on after a drain
    straight_on: frozenset[str] = frozenset()


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
    #: devices where a real-time task runs or waits now (``Recent.realtime_seen``)
    realtime_devices: frozenset[DeviceKey] = frozenset()
    #: wall time at which a hold, share or quantum falls due: decide again then
    next_due: float | None = None


@dataclass(frozen=True)
class _View:
    """A task with what the policy needs to know about its container."""

    task: Task
    container: Container | None
    paused: bool
    order_task: Task  # what its place in the queue is taken from (see ``_view``)
    ours: bool  # paused by this actuator
    blocker: SkipReason | None  # why it may never be paused, or None
    since: float  # start of its current chance to run (start or admission)
    admitted_at: float | None  # when this actuator last let it run, if it did
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
    realtime_busy: set[str]  # real-time containers whose tasks run or wait here
    due: list[float] = field(default_factory=list)  # when a quantum here falls due


def decide(
    state: ExporterState,
    trigger: Trigger,
    config: PolicyConfig,
    ledger: Ledger | None = None,
    recent: Recent | None = None,
    slo_pressure: frozenset[DeviceKey] = frozenset(),
) -> Decision:
    """The actions for one fresh snapshot; never raises on well-formed input.

    ``slo_pressure``: devices where a real-time container's SLO alert fires (best-effort
    containers there are frozen sooner and longer).
    """
    ledger = ledger or Ledger()
    recent = recent or Recent()
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
    between = _between_tasks(state, recent.straight_on, ledger, trigger.now)
    plans = _plan_devices(
        state.gpus, queued, best_effort, trigger.now, config, ledger, recent.straight_on, between
    )
    light = _light_servers(state, config.best_effort_coexist_demand)
    actions = [a for plan in plans.values() for a in plan.actions]
    skips += [s for plan in plans.values() for s in plan.skips]
    due = [t for plan in plans.values() for t in plan.due]
    realtime = frozenset(key for key, plan in plans.items() if plan.realtime_busy - light)
    be = _best_effort(best_effort, realtime, trigger.now, config, ledger, recent, slo_pressure)
    actions += be.actions
    skips += be.skips
    due += be.due
    if trigger.gpu is not None:
        on_gpu = {t.container_id for t in state.tasks if t.gpu == trigger.gpu}
        actions = [a for a in actions if a.container_id in on_gpu]
        skips = [s for s in skips if s.gpu in (None, trigger.gpu)]
    actions += _release_gone(state, ledger, config, trigger.now)
    protected = {cid for plan in plans.values() for cid in plan.kept}
    decision = _finish(actions, skips, protected, config.max_actions)
    return replace(decision, realtime_devices=realtime, next_due=min(due, default=None))


_CLASS_RANK = {PriorityClass.REAL_TIME: 0, PriorityClass.NORMAL: 1, PriorityClass.BEST_EFFORT: 2}


def queue_order(
    tasks: Iterable[Task],
    order: str,
    classes: Mapping[str, PriorityClass] | None = None,
    now: float | None = None,
) -> list[Task]:
    """Tasks in admission order: real-time before normal (``classes``: container id ->
    class; a task not named there is normal), then FIFO by task start (process start breaks
    ties), or EDF (earliest absolute deadline first, no deadline last, FIFO among ties).

    Under EDF a burst past its deadline, or one known to merge several requests (``now``
    given), counts by the deadline of a request arriving now: a server's busy period may
    hold many requests, and the one that began it says nothing of those still waiting
    (deadline-monotonic for busy servers)."""
    fifo = sorted(
        enumerate(tasks), key=lambda it: (it[1].started_at, it[1].proc_start_ticks, it[0])
    )
    if order == "edf":
        fifo.sort(key=lambda it: _edf_key(it[1], now))
    if classes:
        normal = PriorityClass.NORMAL
        fifo.sort(key=lambda it: _CLASS_RANK[classes.get(it[1].container_id or "", normal)])
    return [task for _, task in fifo]


def _edf_key(task: Task, now: float | None) -> tuple[bool, float]:
    deadline = task.absolute_deadline
    if deadline is None:
        return (True, 0.0)
    late = now is not None and (deadline < now or task.boundary == TaskBoundary.MERGED)
    if late and task.mode == TaskMode.BURST and task.deadline_s:
        deadline = (now or 0.0) + task.deadline_s
    return (False, deadline)


def _queue(views: Sequence[_View], order: str, now: float | None = None) -> list[_View]:
    by_id = {v.task.task_id: v for v in views}
    classes = {v.cid: v.klass for v in views if v.cid is not None}
    tasks = [v.order_task for v in views]
    return [by_id[t.task_id] for t in queue_order(tasks, order, classes, now)]


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
    share = _share(container)
    klass = container.priority_class if container is not None else PriorityClass.NORMAL
    blocker = _blocker(task, container, ledger)
    order_task = task
    if cid is not None and cid in ledger.yielded and task.phase == Phase.DRAINING:
        # It yielded as it drained: what it waits for is its next task, which starts no
        # earlier than the yield (and whose deadline counts from then).
        at = ledger.paused[cid]
        deadline = None if task.deadline_s is None else at + task.deadline_s
        order_task = replace(task, started_at=at, absolute_deadline=deadline)
    return _View(
        task, container, paused, order_task, ours, blocker, since, admitted_at, share, klass
    )


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
    straight_on: frozenset[str] = frozenset(),
    between: Mapping[DeviceKey, Sequence[Container]] | None = None,
) -> dict[DeviceKey, _Plan]:
    """Decide every device; then hold back, one at a time, gangs not admitted everywhere."""
    queues = {
        g.key: _queue([v for v in queued if v.task.device == g.key], config.order, now)
        for g in gpus
    }
    be_busy = {v.task.device for v in best_effort if not v.paused and (v.task.sm_ratio or 0) > 0}
    rank: dict[str, int] = {}
    for position, view in enumerate(_queue(queued, config.order, now)):
        if view.cid is not None:
            rank.setdefault(view.cid, position)
    held_back: set[str] = set()
    while True:
        plans = {
            g.key: _plan_device(
                g,
                queues[g.key],
                now,
                config,
                ledger,
                _Gangs(held_back, rank),
                g.key in be_busy,
                straight_on,
                (between or {}).get(g.key, ()),
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
    straight_on: frozenset[str] = frozenset(),
    between: Sequence[Container] = (),
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
    frozen_kernels = [
        v for v in queue if (v.paused or v in gang) and v.task.phase == Phase.COMPUTING
    ]
    memory_high = _memory_high(gpu, config)
    last = _last_admitted(live, ledger)
    if memory_high and last is not None and last.task.phase in PRE_KERNEL and not last.blocker:
        actions.append(_action(PAUSE, last, ActionReason.MEMORY_PRESSURE))
        live.remove(last)
        last = None
    waiting = [v for v in queue if v.ours and v.blocker is None and v.cid not in gangs.held_back]
    # Tasks that run whatever we do: those we may not pause, and (unless preempting)
    # launched kernels; with preemption, the first in the queue, those admitted within
    # their quantum and those whose preemption would be futile.
    must, due = _must_run(queue, live, waiting, now, config, skips)
    # Saturation keeps waiters out only while what fills the device stays: with
    # preemption, a holder that yields to a waiter does not.
    staying = (
        [*must, *(v for v in queue if not v.paused and v not in live)]
        if config.preempt
        else [v for v in queue if not v.paused]
    )
    busy = _saturated(gpu, queue, be_busy, config) and any(
        v.task.phase != Phase.DRAINING for v in staying
    )
    if last is not None and last.task.phase not in PRE_KERNEL:
        last = None  # computing: its run quantum, not its admission, protects it
    reserving = [v for v in queue if v.cid in gangs.held_back and (v in gang or v.ours)]
    admissible = gangs.not_behind(reserving, [*live, *waiting])
    pressure = memory_high or busy
    keep = _admit(queue, admissible, must, frozen_kernels, last, pressure, config.one_at_a_time)
    preempted = [v for v in live if v not in keep and v.task.phase == Phase.COMPUTING]
    if preempted:
        # What a preempted holder already launched drains frozen: it occupies like any
        # frozen kernel, so the waiters queue behind it instead of time-slicing beside it
        # (one after another finishes both sooner, paper B).
        frozen_kernels += preempted
        admissible = [v for v in admissible if v not in preempted]
        keep = _admit(queue, admissible, must, frozen_kernels, last, pressure, config.one_at_a_time)
    admitted = [v for v in keep if v.paused]
    actions += [_action(UNPAUSE, v, ActionReason.ADMIT) for v in admitted]
    # The first task admitted now, or still waiting (behind a frozen kernel, say): the one a
    # holder that goes straight on makes way for as it drains.
    waiter = next((v for v in queue if v in admitted or (v in waiting and v not in keep)), None)
    if config.preempt and waiter is not None:
        used = sum(v.share for v in [*keep, *frozen_kernels])
        used += 0.0 if waiter in keep else waiter.share
        room = 0.0 if config.one_at_a_time else _FULL - used
        fresh = now - config.preempt_quantum_s
        actions += _yields(queue, keep, waiter, straight_on, room, now, fresh, config.order)
        actions += _yields_between(between, waiter, gpu.index, room, now, config.order)
    if waiting and memory_high and not any(a.kind == UNPAUSE for a in actions):
        skips.append(Skip(SkipReason.MEMORY_PRESSURE, "GPU memory above threshold", gpu=gpu.index))
    occupied = bool(keep or frozen_kernels or reserving) or busy
    skips += _newcomers(live, keep, [v for v in frozen_kernels if v not in preempted],
                        occupied, actions)  # fmt: skip
    needing = [*counting, *waiting, *frozen_kernels, *reserving]
    return _Plan(
        actions,
        skips,
        kept={v.cid for v in keep if v.cid is not None},
        wanted={v.cid for v in [*counting, *waiting] if v.cid is not None and v.blocker is None},
        realtime_busy={v.cid or "" for v in needing if v.klass == PriorityClass.REAL_TIME},
        due=due,
    )


def _must_run(
    queue: list[_View],
    live: list[_View],
    waiting: list[_View],
    now: float,
    config: PolicyConfig,
    skips: list[Skip],
) -> tuple[list[_View], list[float]]:
    """The live tasks admission may not take the device from, and when a quantum ends."""
    if not config.preempt:
        return [v for v in live if v.task.phase == Phase.COMPUTING or v.blocker], []
    must: list[_View] = []
    due: list[float] = []
    position = {v.task.task_id: i for i, v in enumerate(queue)}
    contenders = {v.task.task_id for v in [*live, *waiting] if v.blocker is None}
    for v in live:
        if v.blocker:
            must.append(v)
            continue
        ahead = [w for w in queue[: position[v.task.task_id]] if w.task.task_id in contenders]
        if not ahead:
            if v.task.phase == Phase.COMPUTING:
                must.append(v)  # nobody with precedence waits: a launched task runs on
            continue
        if v.admitted_at is not None and now - v.admitted_at < config.preempt_quantum_s:
            must.append(v)
            due.append(v.admitted_at + config.preempt_quantum_s)
            skips.append(_skip(v, SkipReason.RUN_QUANTUM, "admitted within its run quantum"))
        elif v.task.phase == Phase.COMPUTING and all(_futile(w, v, now) for w in ahead):
            must.append(v)
            skips.append(
                _skip(v, SkipReason.PREEMPT_FUTILE, "the waiters miss anyway; it would not")
            )
    return must, due


def _yields(
    queue: list[_View],
    keep: list[_View],
    waiter: _View,
    straight_on: frozenset[str],
    room: float,
    now: float,
    quantum_start: float,
    order: str,
) -> list[Action]:
    """Draining holders frozen for the first waiter, admitted now or next (``yield``).

    A program that goes straight on after a task (a loop, a server under load: learnt,
    ``Recent.straight_on``) keeps its memory, so its next task is first seen with its kernel
    already launched, beside the waiter's: preempting it then still costs a kernel of
    overlap. Frozen as it drains instead, it yields before it can launch, and waits as its
    next task would: from now, after the waiters admitted (FIFO), or by ``now + its
    deadline`` (EDF), never before a waiter it would precede (a real-time holder does not
    yield to a normal waiter). Others drain in peace: a one-shot's results, or a program
    whose next input shows (a newcomer pause catches it), are not held back; nor is one
    whose next task fits beside what runs (``room``: headroom left on the device), or one
    given its turn within its quantum (since ``quantum_start``): it finishes its output.
    """
    kept = {v.cid for v in keep}
    actions = []
    for v in queue:
        if (
            v.paused
            or v.blocker
            or v.cid not in straight_on
            or v.cid in kept
            or v.task.phase != Phase.DRAINING
            or v.share <= room
            or v is waiter
            or (v.admitted_at is not None and v.admitted_at > quantum_start)
            or not _next_waits(waiter, v.klass, v.task.deadline_s, now, order)
        ):
            continue
        actions.append(_action(PAUSE, v, ActionReason.YIELD))
    return actions


def _yields_between(
    between: Sequence[Container], first: _View, gpu: int, room: float, now: float, order: str
) -> list[Action]:
    """Containers whose last task here just ended and whose next is not yet seen: frozen
    for the waiter admitted now, like a draining one (``_yields``)."""
    return [
        Action(PAUSE, c.id, c.name, ActionReason.YIELD, gpu)
        for c in between
        if _share(c) > room and _next_waits(first, c.priority_class, c.deadline_s, now, order)
    ]


def _share(container: Container | None) -> float:
    """The SM share a container's task is expected to take (unknown: the whole device)."""
    demand = container.demand_sm_ratio if container is not None else None
    return 1.0 if demand is None else min(1.0, max(_MIN_SHARE, demand))


def _next_waits(
    waiter: _View, klass: PriorityClass, deadline_s: float | None, now: float, order: str
) -> bool:
    """Whether a task that a container of ``klass`` and ``deadline_s`` starts now would
    come after ``waiter`` in the queue."""
    if _CLASS_RANK[klass] < _CLASS_RANK[waiter.klass]:
        return False
    if order == "edf" and deadline_s is not None:
        no_deadline, waiter_deadline = _edf_key(waiter.order_task, now)
        return not no_deadline and waiter_deadline <= now + deadline_s
    return True


def _light_servers(state: ExporterState, coexist_demand: float) -> set[str]:
    """Real-time containers a best-effort neighbour is not frozen for: their busy periods
    merge requests NVML's samples cannot separate (a ``merged`` task, running or in the
    recent history), and they need at most ``coexist_demand`` of the device. gpuguard can only
    schedule such a server as a whole, and freezing the neighbour for all its busy time
    would cost the neighbour far more than time-slicing costs the server (measured:
    ``bench/realtime.py`` scenario (c)); its own latency SLO (``protect_slo``) says when
    the server needs the device to itself after all."""
    merged = {t.container_id for t in state.recent if t.boundary == TaskBoundary.MERGED}
    merged |= {t.container_id for t in state.tasks if t.boundary == TaskBoundary.MERGED}
    return {
        c.id
        for c in state.containers
        if c.id in merged and c.demand_sm_ratio is not None and c.demand_sm_ratio <= coexist_demand
    }


def _between_tasks(
    state: ExporterState, straight_on: frozenset[str], ledger: Ledger, now: float
) -> dict[DeviceKey, list[Container]]:
    """Running managed containers that go straight on, with no task, whose last task, on
    that device, ended within ``REPEAT_GAP_S``: their next one is about to start there (its
    input is invisible: the memory stays cached)."""
    running = {t.container_id for t in state.tasks}
    last: dict[str, tuple[float, DeviceKey]] = {}
    for done in state.recent:
        cid, device = done.container_id, done.device
        if (
            cid is not None
            and cid not in running
            and device is not None
            and done.ended_at > last.get(cid, (-math.inf, device))[0]
        ):
            last[cid] = (done.ended_at, device)
    out: dict[DeviceKey, list[Container]] = {}
    for cid, (ended_at, device) in last.items():
        container = state.container(cid)
        if (
            container is None
            or now - ended_at > REPEAT_GAP_S
            or cid not in straight_on
            or cid in ledger.paused
            or container.paused
            or container.state != "running"
            or not container.managed
            or container.role in COMPONENT_ROLES
            or container.priority_class == PriorityClass.BEST_EFFORT
        ):
            continue
        out.setdefault(device, []).append(container)
    return out


def _futile(waiter: _View, holder: _View, now: float) -> bool:
    """Preempting ``holder`` for ``waiter`` makes the holder miss a deadline it would meet
    left alone, while the waiter misses its own anyway (EDF feasibility)."""
    w_deadline = waiter.task.absolute_deadline
    h_deadline = holder.task.absolute_deadline
    if w_deadline is None or h_deadline is None:
        return False  # no deadline to miss on one side: precedence decides
    if TaskMode.BURST in (waiter.task.mode, holder.task.mode):
        return False  # a busy period's first deadline is not that of the requests it holds
    w_run = _typical(waiter)
    h_run = _typical(holder)
    h_left = None if h_run is None else max(0.0, h_run - holder.task.elapsed_s)
    waiter_misses = now + (w_run or 0.0) > w_deadline
    holder_meets = now + (h_left or 0.0) <= h_deadline
    # Unknown run times: preempting may well make the holder miss (the cautious reading).
    holder_would_miss = w_run is None or h_left is None or now + w_run + h_left > h_deadline
    return waiter_misses and holder_meets and holder_would_miss


def _typical(view: _View) -> float | None:
    return view.container.typical_run_s if view.container is not None else None


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
                computing = v.task.phase == Phase.COMPUTING
                reason = ActionReason.PREEMPT if computing else ActionReason.NEWCOMER
                actions.append(_action(PAUSE, v, reason))
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


@dataclass
class _BestEffortPlan:
    actions: list[Action] = field(default_factory=list)
    skips: list[Skip] = field(default_factory=list)
    due: list[float] = field(default_factory=list)


def _best_effort(
    views: Sequence[_View],
    realtime: frozenset[DeviceKey],
    now: float,
    config: PolicyConfig,
    ledger: Ledger,
    recent: Recent,
    slo_pressure: frozenset[DeviceKey] = frozenset(),
) -> _BestEffortPlan:
    """Freeze best-effort containers while real-time work needs one of their devices (or a
    real-time SLO fails on one of them), hold the freeze past its last activity, and keep
    the minimum share of every window."""
    plan = _BestEffortPlan()
    by_container: dict[str, list[_View]] = {}
    for v in views:
        if v.cid is not None:
            by_container.setdefault(v.cid, []).append(v)
    window = config.best_effort_window_s
    for cid, mine in by_container.items():
        v = mine[0]
        devices = {m.task.device for m in mine}
        hold = recent.hold_s.get(cid, config.best_effort_hold_s)
        protecting = bool(devices & slo_pressure)
        share = config.slo_best_effort_min_share if protecting else config.best_effort_min_share
        limit = (1 - share) * window  # most frozen time in any window
        if not devices & realtime and not protecting:
            last_seen = max(recent.realtime_seen.get(d, -math.inf) for d in devices)
            if v.ours and now - last_seen < hold:
                plan.due.append(last_seen + hold)  # real-time work paused for a moment
            elif v.ours:
                plan.actions.append(_action(UNPAUSE, v, ActionReason.REALTIME_IDLE))
            continue
        why = ActionReason.SLO_PRESSURE if protecting else ActionReason.BEST_EFFORT
        if v.blocker:
            if not v.paused:
                plan.skips.append(_skip(v, v.blocker, "best-effort, but cannot be paused"))
            continue
        if share <= 0:
            if not v.paused:
                plan.actions.append(_action(PAUSE, v, why))
            continue
        frozen = frozen_in_window(
            recent.frozen_spans.get(cid, ()), ledger.paused.get(cid), now, window
        )
        if v.ours:
            if frozen >= limit:
                plan.actions.append(_action(UNPAUSE, v, ActionReason.BEST_EFFORT_SHARE))
            else:
                plan.due.append(now + (limit - frozen))
        elif not v.paused:
            room = limit - frozen
            if room >= hold:
                plan.actions.append(_action(PAUSE, v, why))
            else:
                plan.due.append(now + (hold - room))  # the window slides at most 1 s/s
    return plan


def frozen_in_window(
    spans: Iterable[tuple[float, float]], current: float | None, now: float, window: float
) -> float:
    """Seconds frozen within ``[now - window, now]``: finished spans and the current one."""
    start = now - window
    frozen = sum(max(0.0, min(end, now) - max(begin, start)) for begin, end in spans)
    if current is not None:
        frozen += max(0.0, now - max(current, start))
    return frozen


# --- clean-up and limits -----------------------------------------------------------------


def _release_gone(
    state: ExporterState, ledger: Ledger, config: PolicyConfig, now: float
) -> list[Action]:
    """Unpause containers we paused that have no running task any more; one that yielded
    between tasks waits until no other task computes or loads on its GPU (its turn)."""
    with_tasks = {t.container_id for t in state.tasks}
    names = {c.id: c.name for c in state.containers}
    busy_gpus = {
        t.gpu
        for t in state.tasks
        if not t.paused
        and t.container_id not in ledger.paused
        and (t.phase == Phase.COMPUTING or t.phase in PRE_KERNEL)
    }
    actions = []
    for cid in sorted(ledger.paused):
        if cid in with_tasks:
            continue
        if cid in ledger.yielded:
            if ledger.yielded[cid] in busy_gpus and now - ledger.paused[cid] < config.max_yield_s:
                continue
            reason = ActionReason.ADMIT
        else:
            reason = ActionReason.TASK_GONE
        actions.append(Action(UNPAUSE, cid, names.get(cid, cid[:12]), reason))
    return actions


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
