"""Clean-up and limits: release what this actuator paused whose tasks are gone; one step
per container, never a pause of a container that runs a kept task, at most ``max_actions``.
"""

from __future__ import annotations

import math

from gpuguard.actuator.admission.policy.precedence import spare_s
from gpuguard.actuator.admission.policy.views import own_deadline
from gpuguard.actuator.decision import (
    PAUSE,
    UNPAUSE,
    Decision,
    Ledger,
    PolicyConfig,
    Skip,
    Step,
)
from gpuguard.actuator.state import ExporterState
from gpuguard.contract import PRE_KERNEL, Phase, PriorityClass, SkipReason, StepReason


def release_gone(
    state: ExporterState, ledger: Ledger, config: PolicyConfig, now: float
) -> tuple[list[Step], list[float]]:
    """Unpause containers we paused that have no running task any more; one that yielded
    between tasks waits until no other task computes or loads on its GPU (its turn), for no
    longer than its slack if it is real-time (``precedence``). Also: when such a wait's
    slack ends."""
    with_tasks = {t.container_id for t in state.tasks}
    names = {c.id: c.name for c in state.containers}
    busy_gpus = {
        t.gpu
        for t in state.tasks
        if not t.paused
        and t.container_id not in ledger.paused
        and (t.phase == Phase.COMPUTING or t.phase in PRE_KERNEL)
    }
    steps = []
    due = []
    for cid in sorted(ledger.paused):
        if cid in with_tasks:
            continue
        reason = StepReason.TASK_GONE
        if cid in ledger.yielded:
            reason = StepReason.ADMIT
            container = state.container(cid)
            klass = container.priority_class if container is not None else PriorityClass.NORMAL
            deadline = own_deadline(klass, container)
            slack_ends = (
                math.inf
                if deadline is None
                else ledger.paused[cid] + spare_s(container, deadline, config)
            )
            if now >= slack_ends:
                reason = StepReason.SLACK
            elif ledger.yielded[cid] in busy_gpus and now - ledger.paused[cid] < config.max_yield_s:
                if slack_ends < math.inf:
                    due.append(slack_ends)
                continue
        steps.append(Step(UNPAUSE, cid, names.get(cid, cid[:12]), reason))
    return steps, due


def finish(steps: list[Step], skips: list[Skip], protected: set[str], cap: int) -> Decision:
    """One step per container, never pause a protected one, pauses first, then the cap."""
    chosen: list[Step] = []
    seen: set[str] = set()
    ordered = [s for s in steps if s.verb == PAUSE] + [s for s in steps if s.verb == UNPAUSE]
    for step in ordered:
        if step.container_id in seen:
            continue
        if step.verb == PAUSE and step.container_id in protected:
            skips.append(
                Skip(SkipReason.RUNS_ELSEWHERE, "container runs a kept task", step.container_id)
            )
            continue
        seen.add(step.container_id)
        if len(chosen) >= cap:
            skips.append(
                Skip(SkipReason.CAP, f"more than {cap} actions", step.container_id, step.task_id)
            )
            continue
        chosen.append(step)
    return Decision(tuple(chosen), tuple(skips))
