"""Repeaters yield: a program that goes straight on after a task is frozen as it drains, or
between two tasks, for the waiter admitted in its place.

Its memory stays cached, so its next task is first seen with its kernel already launched
beside the waiter's; frozen as it drains, it waits as that next task would
(``Recent.straight_on`` says who goes straight on). A server (``precedence``: one whose busy
periods also merge its requests) is never ranked, and never yields.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from gpuguard.actuator.admission.policy.order import next_waits
from gpuguard.actuator.admission.policy.views import TaskView, share_of, step_for
from gpuguard.actuator.decision import PAUSE, REPEAT_GAP_S, Ledger, Step
from gpuguard.actuator.state import Container, DeviceKey, ExporterState
from gpuguard.contract import COMPONENT_ROLES, Phase, PriorityClass, StepReason


def yields(
    queue: list[TaskView],
    keep: list[TaskView],
    waiter: TaskView,
    straight_on: frozenset[str],
    room: float,
    now: float,
    quantum_start: float,
    order: str,
) -> list[Step]:
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
    steps = []
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
            or not next_waits(waiter, v.klass, v.task.deadline_s, now, order)
        ):
            continue
        steps.append(step_for(PAUSE, v, StepReason.YIELD))
    return steps


def yields_between(
    between: Sequence[Container], first: TaskView, gpu: int, room: float, now: float, order: str
) -> list[Step]:
    """Containers whose last task here just ended and whose next is not yet seen: frozen
    for the waiter admitted now, like a draining one (``yields``)."""
    return [
        Step(PAUSE, c.id, c.name, StepReason.YIELD, gpu)
        for c in between
        if share_of(c) > room and next_waits(first, c.priority_class, c.deadline_s, now, order)
    ]


def between_tasks(
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
