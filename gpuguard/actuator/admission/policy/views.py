"""A task as the policy sees it (``TaskView``), and the steps and skips made from one.

The view joins a task to its container and to what this actuator did (the ledger): whether
it is paused (our journal before Docker's events), since when it may run, the SM share it
is expected to take, its class, and why it may never be paused (``blocker``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from gpuguard.actuator.admission.policy.edges import edge_phase
from gpuguard.actuator.decision import Ledger, Skip, Step
from gpuguard.actuator.state import Container, ExporterState, Task
from gpuguard.contract import (
    COMPONENT_ROLES,
    Phase,
    PriorityClass,
    SkipReason,
    StepReason,
    TaskMode,
    Verb,
)

ADMIT_GRACE_S = 1.0
#: SM shares add up to at most the whole device (with rounding slack).
FULL = 1.0 + 1e-6
#: A learnt demand below this still takes some of the device.
_MIN_SHARE = 0.01


@dataclass(frozen=True)
class TaskView:
    """A task with what the policy needs to know about its container."""

    task: Task
    container: Container | None
    paused: bool
    order_task: Task  # what its place in the queue is taken from (see ``view_of``)
    ours: bool  # paused by this actuator
    blocker: SkipReason | None  # why it may never be paused, or None
    since: float  # start of its current chance to run (start or admission)
    admitted_at: float | None  # when this actuator last let it run, if it did
    share: float  # expected SM share while computing (1.0: unknown, the whole device)
    klass: PriorityClass
    #: a task precedence may act for and against: its boundaries are exact (``precedence``)
    ranked: bool = True
    #: when this actuator paused it, if it did
    paused_at: float | None = None

    @property
    def cid(self) -> str | None:
        return self.task.container_id


def view_of(
    task: Task,
    state: ExporterState,
    ledger: Ledger,
    now: float,
    servers: frozenset[str] = frozenset(),
) -> TaskView:
    """``servers``: containers whose busy periods are never ranked (``precedence.servers``)."""
    container = state.container(task.container_id)
    task = edge_phase(task, container)
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
    share = share_of(container)
    klass = container.priority_class if container is not None else PriorityClass.NORMAL
    blocker = _blocker(task, container, ledger)
    order_task = task
    if cid is not None and cid in ledger.yielded and task.phase == Phase.DRAINING:
        # It yielded as it drained: what it waits for is its next task, which starts no
        # earlier than the yield (and whose deadline counts from then).
        at = ledger.paused[cid]
        deadline = None if task.deadline_s is None else at + task.deadline_s
        order_task = replace(task, started_at=at, absolute_deadline=deadline)
    return TaskView(
        task, container, paused, order_task, ours, blocker, since, admitted_at, share, klass,
        ranked=is_ranked(task, servers),
        paused_at=ledger.paused.get(cid) if cid is not None else None,
    )  # fmt: skip


def is_ranked(task: Task, servers: frozenset[str]) -> bool:
    """Whether precedence may act for and against this task: it is no server's busy period
    (``precedence.servers``: ``process`` and ``memory`` tasks always rank)."""
    return task.mode != TaskMode.BURST or task.container_id not in servers


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


def own_deadline(klass: PriorityClass, container: Container | None) -> float | None:
    """A real-time container's deadline: ``gpuguard.deadline``, else its SLO's target; None
    for other classes (they have no slack to keep)."""
    if klass != PriorityClass.REAL_TIME or container is None:
        return None
    return container.deadline_s if container.deadline_s is not None else container.slo_target_s


def share_of(container: Container | None) -> float:
    """The SM share a container's task is expected to take (unknown: the whole device)."""
    demand = container.demand_sm_ratio if container is not None else None
    return 1.0 if demand is None else min(1.0, max(_MIN_SHARE, demand))


def step_for(verb: Verb, view: TaskView, reason: StepReason) -> Step:
    assert view.cid is not None  # only views without a blocker are acted on
    name = view.task.container or (view.container.name if view.container else view.cid[:12])
    return Step(verb, view.cid, name, reason, view.task.gpu, view.task.task_id)


def skip_for(view: TaskView, reason: SkipReason, detail: str) -> Skip:
    return Skip(reason, detail, view.cid, view.task.task_id, view.task.gpu)
